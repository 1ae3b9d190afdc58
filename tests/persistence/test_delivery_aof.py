"""Jobs that fail well across restarts of a real node with an AOF: BACKOFF, MAXDELIVER,
DEADLETTER, counted deliveries, the last NACK reason and a dead letter's origin come back
(kill -9, a rewrite then kill -9, a controlled restart with aof-enqueue-jobs-once); a
NACK-delayed job stays out of its queue until its delay ends; ``disque-py check-aof`` reads
JOBEXTRA records and reports a damaged one.
"""

from __future__ import annotations

import re
import subprocess
import sys
import time
import zlib
from pathlib import Path

import msgpack
import pytest

from disque_py.cli import launcher
from disque_py.core.ids import dead_letter_id
from disque_py.persistence.records import JobExtra, RecordReader

from ..integration.conftest import ROOT, start_node, wait_for  # noqa: F401  (fixture)
from .test_aof_process import AOF, aof_path, info, kill9, restart, show

pytestmark = pytest.mark.integration

#: what a restart must keep of a job (SHOW's fields; times and holders aside)
KEPT = ("queue", "body", "retry", "nacks", "deliveries", "backoff-min-ms", "backoff-max-ms", "maxdeliver",
        "deadletter", "last-nack-reason", "dead-letter-of", "original-queue", "original-deliveries",
        "dead-letter-reason", "original-options")  # fmt: skip


def kept(fields: dict | None) -> dict:
    assert fields is not None
    return {k: fields.get(k) for k in KEPT}


def getjob(r, queue: str, timeout_ms: int = 0) -> list:
    if timeout_ms:
        return r.execute_command("GETJOB", "TIMEOUT", timeout_ms, "WITHCOUNTERS", "FROM", queue) or []
    return r.execute_command("GETJOB", "NOHANG", "WITHCOUNTERS", "FROM", queue) or []


def rewrite_done(r) -> bool:
    p = info(r)
    return p["aof_rewrite_in_progress"] == 0 and p["aof_rewrite_scheduled"] == 0


def check_aof(path: Path) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "disque_py.cli", "check-aof", str(path)], capture_output=True,
                          text=True, timeout=60, cwd=ROOT)  # fmt: skip


def counts(output: str) -> dict[str, int]:
    m = re.search(r"(\d[\d,]*) records? \(([^)]*)\)", output)
    assert m, output
    return {k: int(v.replace(",", "")) for k, v in (part.split() for part in m[2].split(", "))}


@pytest.mark.parametrize("how", ["kill9", "rewrite-then-kill9", "shutdown-enqueue-once"])
def test_delivery_policy_counts_and_dead_letters_survive_a_restart(start_node, tmp_path, how):  # noqa: F811
    node = start_node(auto_aof_rewrite_percentage=0, **AOF)
    r = node.client()
    # a job with a policy, delivered twice, NACKed once with a reason, now active
    flaky = r.execute_command("ADDJOB", "q", "flaky", 5000, "RETRY", 60, "BACKOFF", 0.5, 5, "MAXDELIVER", 3,
                              "DEADLETTER", "graveyard")  # fmt: skip
    assert getjob(r, "q")[0][1] == flaky
    assert r.execute_command("NACK", flaky, "REASON", "boom") == 1
    got = getjob(r, "q", 5000)
    assert got[0][1] == flaky
    # a job dead-lettered at its first failure: its dead letter is queued
    poison = r.execute_command("ADDJOB", "p", "poison", 5000, "RETRY", 1, "MAXDELIVER", 1)
    assert getjob(r, "p")[0][1] == poison
    assert r.execute_command("NACK", poison, "REASON", "bad input") == 1
    dl = dead_letter_id(poison)
    # a job with a policy, never delivered, queued
    waiting = r.execute_command("ADDJOB", "w", "waiting", 5000, "RETRY", 1, "MAXDELIVER", 2)
    before = {job_id: kept(show(r, job_id)) for job_id in (flaky, dl, waiting)}
    assert before[flaky]["deliveries"] == 2 and before[flaky]["nacks"] == 1
    assert before[flaky]["last-nack-reason"] == b"boom" and before[flaky]["deadletter"] == b"graveyard"
    assert before[dl]["dead-letter-of"] == poison and before[dl]["original-queue"] == b"p"
    assert before[dl]["original-deliveries"] == 1 and before[dl]["dead-letter-reason"] == b"bad input"
    assert before[dl]["original-options"] == [b"MAXDELIVER", b"1"] and before[dl]["queue"] == b"p.dead"
    assert r.execute_command("QLEN", "p.dead") == 1 and r.execute_command("QLEN", "w") == 1

    if how == "shutdown-enqueue-once":
        assert r.execute_command("CONFIG", "SET", "aof-enqueue-jobs-once", "yes") == b"OK"
        try:  # the node closes the connection without a reply
            launcher.call(node.port, "SHUTDOWN", "REWRITE-AOF")
        except OSError:
            pass
        assert node.proc.wait(20) == 0
    else:
        if how == "rewrite-then-kill9":
            r.execute_command("BGREWRITEAOF")
            wait_for(lambda: rewrite_done(r), timeout=20, what="the rewrite done")
            assert info(r)["aof_last_bgrewrite_status"] == "ok"
        kill9(node)
    data = aof_path(node).read_bytes()
    extras = {rec.id: rec.extra for _, rec in RecordReader().feed(data) if type(rec) is JobExtra}
    assert {flaky, dl, waiting} <= set(extras)
    assert poison not in extras or how == "kill9"  # a rewrite drops the acknowledged original
    # the file as written is valid, JOBEXTRA records counted
    checked = check_aof(aof_path(node))
    assert checked.returncode == 0, checked.stdout + checked.stderr
    assert counts(checked.stdout)["JOBEXTRA"] == sum(1 for _, rec in RecordReader().feed(data) if type(rec) is JobExtra)

    node = restart(start_node, node)
    r = node.client()
    after = {job_id: kept(show(r, job_id)) for job_id in (flaky, dl, waiting)}
    assert after == before
    assert show(r, poison) is None or show(r, poison)["state"] == b"acked"
    # the queued ones come back to their queues (at once after a controlled restart, after
    # their RETRY otherwise), the dead letter still a dead letter
    got = getjob(r, "p.dead", 10000)
    assert got and got[0][1] == dl and got[0][2] == b"poison"
    fields = dict(zip(got[0][3::2], got[0][4::2]))
    assert fields[b"dead-letter-of"] == poison and fields[b"original-deliveries"] == 1
    got = getjob(r, "w", 10000)
    assert got and got[0][1] == waiting and dict(zip(got[0][3::2], got[0][4::2]))[b"deliveries"] == 1
    # the counts go on from where they were: the 3rd delivery of flaky, then its failure,
    # dead-letters it into its DEADLETTER queue
    assert r.execute_command("NACK", flaky) == 1  # 2nd nack: BACKOFF 1 s (0.5 x 2)
    within = show(r, flaky)["next-requeue-within"]
    assert 800 <= within <= 1100, within
    got = getjob(r, "q", 5000)
    assert got and got[0][1] == flaky and dict(zip(got[0][3::2], got[0][4::2]))[b"deliveries"] == 3
    assert show(r, dead_letter_id(flaky)) is None
    assert r.execute_command("NACK", flaky, "REASON", "third strike") == 1
    grave = show(r, dead_letter_id(flaky))
    assert grave["queue"] == b"graveyard" and grave["dead-letter-of"] == flaky
    assert grave["original-deliveries"] == 3 and grave["dead-letter-reason"] == b"third strike"
    assert grave["original-options"] == [b"BACKOFF", b"0.5", b"5", b"MAXDELIVER", b"3", b"DEADLETTER", b"graveyard"]


@pytest.mark.parametrize("policy,how", [("plain", "kill9"), ("with-policy", "kill9"),
                                        ("plain", "shutdown-enqueue-once")])  # fmt: skip
def test_a_nack_delayed_job_waits_out_its_delay_across_a_restart(start_node, policy, how):  # noqa: F811
    """NACK DELAY 6 on a RETRY 1 job, then a restart: a restored active job comes back a RETRY
    after the restart, so it must know it was NACKed with a delay to wait for it (and a
    controlled restart that queues the queued jobs at once must not take it for one)."""
    node = start_node(**AOF)
    r = node.client()
    opts = ["MAXDELIVER", 5] if policy == "with-policy" else []
    job_id = r.execute_command("ADDJOB", "q", "later", 5000, "RETRY", 1, "TTL", 120, *opts)
    assert getjob(r, "q")[0][1] == job_id
    t0 = time.monotonic()
    assert r.execute_command("NACK", job_id, "DELAY", 6) == 1
    if how == "kill9":
        kill9(node)
    else:
        assert r.execute_command("CONFIG", "SET", "aof-enqueue-jobs-once", "yes") == b"OK"
        try:  # the node closes the connection without a reply
            launcher.call(node.port, "SHUTDOWN", "REWRITE-AOF")
        except OSError:
            pass
        assert node.proc.wait(20) == 0
    node = restart(start_node, node)
    r = node.client()
    assert show(r, job_id)["nacks"] == 1
    got = None
    while time.monotonic() - t0 < 15 and not got:
        got = r.execute_command("GETJOB", "TIMEOUT", 100, "FROM", "q")
        received = time.monotonic() - t0
        # the AOF keeps the end of the delay as wall-clock milliseconds, read back against a
        # new process's clocks: a few ms either way, never a RETRY (1 s) early
        assert not got or received >= 5.95, "delivered %.3f s after NACK DELAY 6" % received
    assert got and got[0][1] == job_id and got[0][2] == b"later"


def _jobextra_at(data: bytes) -> tuple[int, int]:
    """The offset and length of the first JOBEXTRA record of an AOF."""
    recs = RecordReader().feed(data)
    for i, (offset, rec) in enumerate(recs):
        if type(rec) is JobExtra:
            end = recs[i + 1][0] if i + 1 < len(recs) else len(data)
            return offset, end - offset
    raise AssertionError("no JOBEXTRA record")


def test_check_aof_reports_a_damaged_jobextra_record(start_node, tmp_path):  # noqa: F811
    node = start_node(**AOF)
    r = node.client()
    for i in range(5):
        r.execute_command("ADDJOB", "q", "job-%d" % i, 5000, "RETRY", 30, "BACKOFF", 1, 10, "MAXDELIVER", 4)
    node.stop()
    data = aof_path(node).read_bytes()
    checked = check_aof(aof_path(node))
    assert checked.returncode == 0 and counts(checked.stdout)["JOBEXTRA"] == 5, checked.stdout
    start, length = _jobextra_at(data)
    record = data[start : start + length]
    # a byte flipped in the packed map: the checksum catches it
    flipped = bytearray(data)
    flipped[start + record.rindex(b"\r\n$8\r\n") - 2] ^= 0x01
    # a map that is well framed and summed, but not a policy (min above max)
    bad_map = msgpack.packb({"bm": 9000, "bx": 1000, "md": 4}, use_bin_type=True)
    job_id = bytes(RecordReader().feed(record)[0][1].id)
    head = b"*4\r\n$8\r\nJOBEXTRA\r\n$%d\r\n%s\r\n" % (len(job_id), job_id)
    assert record.startswith(head)
    framed = head + b"$%d\r\n" % len(bad_map) + bad_map + b"\r\n"
    framed += b"$8\r\n%08x\r\n" % zlib.crc32(framed)
    for name, damaged in (("flipped", bytes(flipped)), ("bad-map", data[:start] + framed + data[start + length :])):
        aof = tmp_path / ("%s.aof" % name)
        aof.write_bytes(damaged)
        out = check_aof(aof)
        assert out.returncode == 1, (name, out.stdout + out.stderr)
        m = re.search(r"Corrupt record at byte offset (\d+)", out.stdout)
        assert m and int(m[1]) == start, (name, out.stdout)
        if name == "bad-map":
            assert "JOBEXTRA" in out.stdout, out.stdout
        assert "AOF is not valid" in out.stdout


@pytest.mark.parametrize("how", ["kill9", "rewrite-then-kill9"])
def test_returns_and_the_last_traceback_survive_a_restart(start_node, how):  # noqa: F811
    """RELEASE's returns and NACK's TRACE are in the JOBEXTRA map (keys ``rt`` and ``t``): a
    job given back once and failed once comes back with both, and its one real delivery left
    before MAXDELIVER 2 dead-letters it (an AOF written before them has neither key: returns
    0, no trace, as every other JOBEXTRA of these tests)."""
    node = start_node(auto_aof_rewrite_percentage=0, **AOF)
    r = node.client()
    job = r.execute_command("ADDJOB", "q", "flaky", 5000, "RETRY", 5, "MAXDELIVER", 2)
    assert getjob(r, "q")[0][1] == job
    assert r.execute_command("RELEASE", job) == 1  # given back: no delivery counted
    assert getjob(r, "q")[0][1] == job
    trace = b"Traceback (most recent call last):\n  File \"t.py\", line 3\nKeyError: 'missing'\n"
    assert r.execute_command("NACK", job, "REASON", "KeyError: 'missing'", "TRACE", trace) == 1
    before = show(r, job)
    assert before["deliveries"] == 1 and before["returns"] == 1 and before["last-failure-trace"] == trace
    if how == "rewrite-then-kill9":
        r.execute_command("BGREWRITEAOF")
        wait_for(lambda: rewrite_done(r), timeout=20, what="the rewrite done")
    kill9(node)
    extras = {rec.id: rec.extra for _, rec in RecordReader().feed(aof_path(node).read_bytes()) if type(rec) is JobExtra}
    assert extras[job].returns == 1 and extras[job].trace == trace
    node = restart(start_node, node)
    r = node.client()
    after = show(r, job)
    assert (after["deliveries"], after["returns"], after["last-failure-trace"]) == (1, 1, trace)
    got = getjob(r, "q", 10000)  # back after its RETRY at the latest
    assert got and got[0][1] == job
    assert r.execute_command("NACK", job, "TRACE", b"second\nValueError") == 1  # its 2nd delivery failed
    dead = show(r, dead_letter_id(job))
    assert dead["original-deliveries"] == 2 and dead["last-failure-trace"] == b"second\nValueError"
