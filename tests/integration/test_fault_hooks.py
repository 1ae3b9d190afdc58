"""The fault hooks the chaos tests use (disque_py/server/faults.py), on real node processes: off
unless the node's environment turns them on; a clock jump moves the core's timers; a failed fsync
stops a node with appendfsync always, and refuses new jobs with everysec until an fsync works."""

from __future__ import annotations

import pytest
import redis

from .conftest import NO_RETRY, wait_for


def test_the_hooks_are_off_unless_the_environment_turns_them_on(monkeypatch, start_node):
    monkeypatch.delenv("DISQUE_PY_FAULT_HOOKS", raising=False)
    r = start_node().client()
    for sub in ("JUMP-CLOCK", "FAIL-FSYNC"):
        with pytest.raises(redis.ResponseError, match="fault hooks are off.*DISQUE_PY_FAULT_HOOKS=1"):
            r.execute_command("DEBUG", sub, "1000")


def test_a_clock_jump_fires_the_timers_it_passes(monkeypatch, start_node):
    monkeypatch.setenv("DISQUE_PY_FAULT_HOOKS", "1")
    r = start_node().client()
    job = r.execute_command("ADDJOB", "q", "body", "0", "RETRY", "60")
    assert r.execute_command("GETJOB", "NOHANG", "FROM", "q")[0][1] == job
    assert r.execute_command("QLEN", "q") == 0
    assert r.execute_command("DEBUG", "JUMP-CLOCK", "61000") == 61000
    wait_for(lambda: r.execute_command("QLEN", "q") == 1, timeout=5, what="the job requeued by its RETRY timer")
    assert r.execute_command("DEBUG", "JUMP-CLOCK", "-1000") == 60000  # the total shift
    assert r.ping()
    with pytest.raises(redis.ResponseError, match="not an integer"):
        r.execute_command("DEBUG", "JUMP-CLOCK", "soon")


def test_a_failed_fsync_with_always_stops_the_node_before_it_acknowledges(monkeypatch, start_node):
    monkeypatch.setenv("DISQUE_PY_FAULT_HOOKS", "1")
    node = start_node(appendonly="yes", appendfsync="always")
    r = node.client(retry=NO_RETRY)
    r.execute_command("ADDJOB", "q", "persisted", "0", "RETRY", "1")
    assert r.execute_command("DEBUG", "FAIL-FSYNC", "1") == 1
    with pytest.raises(redis.ConnectionError, match="Connection refused|Connection closed by server"):
        r.execute_command("ADDJOB", "q", "never acknowledged", "0")
    assert node.proc.wait(10) == 1
    assert "fsync failed with appendfsync always" in node.log()
    node.start()  # what was acknowledged comes back (requeued by its RETRY timer)
    got = node.client().execute_command("GETJOB", "TIMEOUT", "10000", "COUNT", "10", "FROM", "q")
    assert b"persisted" in [j[2] for j in got]


def test_a_failed_fsync_with_everysec_refuses_new_jobs_until_one_works(monkeypatch, start_node):
    monkeypatch.setenv("DISQUE_PY_FAULT_HOOKS", "1")
    r = start_node(appendonly="yes", appendfsync="everysec").client()
    r.execute_command("DEBUG", "FAIL-FSYNC", "2")
    r.execute_command("ADDJOB", "q", "one", "0")  # written; its fsync (within a second) fails

    def refused() -> bool:
        try:
            r.execute_command("ADDJOB", "q", "probe", "0")
        except redis.ResponseError as exc:
            assert str(exc).startswith("MISCONF Errors fsyncing the AOF file")
            return True
        return False

    wait_for(refused, timeout=5, what="-MISCONF after the failed fsync")
    assert r.info("persistence")["aof_last_write_status"] == "err"
    assert r.execute_command("GETJOB", "NOHANG", "FROM", "q")  # consumers are served meanwhile
    wait_for(lambda: not refused(), timeout=10, what="new jobs accepted after a good fsync")
    assert r.info("persistence")["aof_last_write_status"] == "ok"
