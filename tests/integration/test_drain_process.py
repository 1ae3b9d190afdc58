"""`disque-py drain HOST:PORT` against a real 3-node cluster: nothing lost, nothing delivered
twice, the drained node empty and leaving."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from .conftest import ROOT, wait_for

pytestmark = pytest.mark.integration


def drain(node, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "disque_py.cli", "drain", "127.0.0.1:%d" % node.port, *args],
                          capture_output=True, text=True, timeout=120, cwd=ROOT)  # fmt: skip


def registered(node) -> int:
    return int(node.client().info("jobs")["registered_jobs"])


def test_drain_moves_every_job_and_leaves_the_node_empty(cluster3):
    a, b, c = cluster3
    ca = a.client()
    a_id = ca.execute_command("CLUSTER", "MYID").decode()
    twice = [ca.execute_command("ADDJOB", "work", "r2-%d" % i, 0, "REPLICATE", 2, "RETRY", 60).decode()
             for i in range(40)]  # fmt: skip
    once = [ca.execute_command("ADDJOB", "work", "r1-%d" % i, 0, "REPLICATE", 1, "RETRY", 60).decode()
            for i in range(40)]  # fmt: skip
    amo = [ca.execute_command("ADDJOB", "work", "amo-%d" % i, 0, "REPLICATE", 1, "RETRY", 0).decode()
           for i in range(10)]  # fmt: skip
    # some delivered from a and not acknowledged yet: the consumer acks them while the drain waits
    taken = [j[1].decode() for j in ca.execute_command("GETJOB", "NOHANG", "COUNT", 5, "FROM", "work")]
    everything = set(twice) | set(once) | set(amo)
    assert len(everything) == 90 and registered(a) == 90

    proc = subprocess.Popen([sys.executable, "-m", "disque_py.cli", "drain", "127.0.0.1:%d" % a.port, "--json",
                             "--max-time", "60"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=ROOT)  # fmt: skip
    try:
        # leaving at once: HELLO says priority 100, CLUSTER NODES the flag, as Disque's
        wait_for(lambda: ca.execute_command("CLUSTER", "LEAVING") == b"yes", what="a leaving")
        hello = b.client().execute_command("HELLO")
        wait_for(lambda: any(e[0].decode() == a_id and int(e[3]) == 100 for e in ca.execute_command("HELLO")[2:]),
                 what="priority 100")  # fmt: skip
        assert hello is not None
        wait_for(lambda: "leaving" in [l for l in b.client().execute_command("CLUSTER", "NODES").decode().splitlines()
                                       if l.startswith(a_id)][0], what="b sees a leaving")  # fmt: skip
        # a consumer on c takes what comes, acking each; the delivered ones are acked on a
        delivered: list[str] = []
        cc = c.client()
        assert ca.execute_command("ACKJOB", *taken) == len(taken)
        delivered += taken

        def consume() -> bool:
            for node in (b, c):
                got = node.client().execute_command("GETJOB", "NOHANG", "COUNT", 100, "FROM", "work") or []
                for _, job_id, _ in got:
                    delivered.append(job_id.decode())
                    node.client().execute_command("ACKJOB", job_id)
            return proc.poll() is not None

        wait_for(consume, timeout=90, interval=0.05, what="the drain to end")
        out, err = proc.communicate(timeout=10)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 0, err
    outcome = json.loads(out)
    assert outcome["drained"] is True and outcome["left"]["total"] == 0 and outcome["node"] == a_id
    assert registered(a) == 0 and ca.execute_command("CLUSTER", "LEAVING") == b"yes"
    # what the drain moved is now taken on b and c, each job once
    wait_for(lambda: (consume(), len(set(delivered)) == 90)[1], timeout=30, what="every job delivered")
    assert len(delivered) == len(set(delivered)) == 90, "a job delivered twice"
    assert set(delivered) == everything
    assert cc is not None


def test_drain_gives_up_after_max_time_and_says_what_is_left(cluster3):
    a, b, c = cluster3
    ca = a.client()
    ca.execute_command("ADDJOB", "slow", "x", 0, "REPLICATE", 1, "RETRY", 300)
    assert ca.execute_command("GETJOB", "NOHANG", "FROM", "slow")  # delivered, never acked
    out = drain(a, "--max-time", "1", "--no-progress")
    assert out.returncode == 2, out.stderr
    assert "not drained after" in out.stderr and "active 1" in out.stderr
    out = drain(a, "--max-time", "0.5", "--json")
    assert out.returncode == 2 and json.loads(out.stdout)["left"]["active"] == 1


def test_drain_of_a_node_that_does_not_answer_fails_with_why(tmp_path):
    out = subprocess.run([sys.executable, "-m", "disque_py.cli", "drain", "127.0.0.1:1", "--max-time", "1"],
                         capture_output=True, text=True, timeout=60, cwd=ROOT)  # fmt: skip
    assert out.returncode == 1 and "drain:" in out.stderr and "Traceback" not in out.stderr
    out = subprocess.run([sys.executable, "-m", "disque_py.cli", "drain", "127.0.0.1:notaport"],
                         capture_output=True, text=True, timeout=60, cwd=ROOT)  # fmt: skip
    assert out.returncode == 2 and "HOST:PORT" in out.stderr
