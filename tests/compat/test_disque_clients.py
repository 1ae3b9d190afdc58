"""An existing Disque client library against a real two-node cluster.

pydisque (0.1.5, the last release, written for Disque 1.0) is installed into
a temporary directory and run in a subprocess with the suite's redis-py
under it, so nothing of it leaks into the test process. Its whole API is
used as its README shows: jobs added on one node and fetched on the other,
NACK and WORKING, acks collected on both nodes, queue and scan commands,
and the errors it leaves to the caller (MAXLEN, PAUSED). Skipped, with the
reason, when the package registry cannot be reached.
"""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest

from tests.integration.test_cluster_process import created  # noqa: F401  (fixture)

SCRIPT = textwrap.dedent(
    """
    import sys, time, redis
    from pydisque.client import Client

    def wait_for(predicate, what, timeout=15.0):
        deadline = time.monotonic() + timeout
        while not predicate():
            assert time.monotonic() < deadline, "timed out waiting for " + what
            time.sleep(0.02)

    a, b = ("127.0.0.1:%s" % p for p in sys.argv[1:3])
    ca = Client([a]); ca.connect()
    cb = Client([b]); cb.connect()
    hello = ca.hello()
    assert hello[0] == 1 and len(hello) == 4, hello
    assert ca.connected_node.node_id == hello[1]

    # Added on A with a copy on B, fetched on B: it comes over as soon as B asks.
    jid = ca.add_job("compat", "body-1", timeout=2000, replicate=2, retry=5)
    assert len(jid) == 40 and jid.startswith(b"D-"), jid
    show = ca.show(jid, return_dict=True)
    assert show[b"state"] == b"queued" and show[b"repl"] == 2 and len(show[b"nodes-delivered"]) == 2, show
    assert ca.qlen("compat") == 1
    assert ca.qpeek("compat", 1) == [[b"compat", jid, b"body-1"]]
    stat = ca.qstat("compat", return_dict=True)
    assert stat[b"len"] == 1 and stat[b"jobs-in"] == 1, stat
    assert cb.get_job(["compat"], timeout=5000, withcounters=True) == [(b"compat", jid, b"body-1", 0, 0)]
    assert cb.working(jid) > 0
    cb.nack_job(jid)
    assert cb.get_job(["compat"], timeout=5000, withcounters=True) == [(b"compat", jid, b"body-1", 1, 0)]
    cb.ack_job(jid)
    wait_for(lambda: ca.show(jid) is None and cb.show(jid) is None, "the ack to be collected on both nodes")

    # Every ADDJOB option it has.
    later = ca.add_job("later", "x", delay=30, ttl=60, maxlen=10, asynchronous=True, replicate=1, retry=0)
    assert ca.show(later, return_dict=True)[b"state"] == b"active"
    assert ca.enqueue(later) == 1 and ca.qlen("later") == 1
    assert ca.dequeue(later) == 1 and ca.qlen("later") == 0
    assert ca.del_job(later) == 1 and ca.show(later) is None
    fast = ca.add_job("fast", "y", replicate=2)
    ca.fast_ack(fast)
    wait_for(lambda: ca.show(fast) is None and cb.show(fast) is None, "FASTACK to reach both nodes")
    assert ca.get_job(["fast"], nohang=True) == []

    # The errors it leaves to the caller.
    ca.add_job("full", "1", maxlen=1)
    try:
        ca.add_job("full", "2", maxlen=1)
    except redis.ResponseError as exc:
        assert str(exc).startswith("MAXLEN"), exc
    else:
        raise AssertionError("MAXLEN not refused")
    assert ca.pause("full", kw_in=True, kw_bcast=True) == b"in"
    wait_for(lambda: cb.pause("full", kw_state=True) == b"in", "PAUSE bcast to reach B")
    try:
        ca.add_job("full", "3")
    except redis.ResponseError as exc:
        assert str(exc).startswith("PAUSED"), exc
    else:
        raise AssertionError("PAUSED not refused")
    assert ca.pause("full", kw_none=True) == b"none"

    cursor, queues = ca.qscan(count=100)
    assert cursor == b"0" and b"full" in queues, queues
    cursor, jobs = ca.jscan(count=100, queue="full")
    assert cursor == b"0" and len(jobs) == 1, jobs
    assert ca.info()["disque_version"] == "1.0-rc1"
    print("ok")
    """
)


def test_pydisque(created, tmp_path):  # noqa: F811
    target = tmp_path / "pydisque"
    install = subprocess.run(
        [sys.executable, "-m", "pip", "install", "--quiet", "--disable-pip-version-check", "--no-deps",
         "--target", str(target), "pydisque==0.1.5"],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    if install.returncode != 0:
        pytest.skip("could not install pydisque: %s" % install.stderr.strip()[-200:])
    a, b = created(2)
    run = subprocess.run(
        [sys.executable, "-c", SCRIPT, str(a), str(b)],
        env={"PYTHONPATH": str(target), "PATH": "/usr/bin:/bin"},
        capture_output=True,
        text=True,
        timeout=90,
    )
    assert run.returncode == 0, run.stdout + run.stderr
    assert run.stdout.split() == ["ok"]
