"""ADDJOB's PRIORITY on two real node processes: 1,000 jobs at PRIORITY 1, then 10 at PRIORITY 9;
the 10 come out first on the node that has them, and through federation on the other."""

from __future__ import annotations

import pytest

from .conftest import wait_for

pytestmark = pytest.mark.integration


def reachable(r) -> int:
    text = r.execute_command("CLUSTER", "INFO").decode()
    return int(dict(line.split(":", 1) for line in text.split("\r\n") if ":" in line)["cluster_reachable_nodes"])  # others


def fill(r, queue: str) -> list[bytes]:
    pipe = r.pipeline(transaction=False)
    for i in range(1000):
        pipe.execute_command("ADDJOB", queue, "low%d" % i, 0, "REPLICATE", 1, "PRIORITY", 1)
    for i in range(10):
        pipe.execute_command("ADDJOB", queue, "high%d" % i, 0, "REPLICATE", 1, "PRIORITY", 9)
    ids = pipe.execute()
    assert all(isinstance(i, bytes) and len(i) == 40 for i in ids)
    return ids


def test_ten_high_jobs_come_out_first_here_and_through_federation(start_node):
    a, b = start_node(), start_node()
    ra, rb = a.client(), b.client()
    assert ra.execute_command("CLUSTER", "MEET", "127.0.0.1", b.port) in (b"OK", True)
    wait_for(lambda: reachable(ra) == 1 and reachable(rb) == 1, timeout=20, what="the two nodes joined")
    high = [b"high%d" % i for i in range(10)]

    # on the node that has them
    ids = fill(ra, "local")
    got = ra.execute_command("GETJOB", "NOHANG", "COUNT", 10, "FROM", "local")
    assert [item[2] for item in got] == high
    assert ra.execute_command("SHOW", ids[-1])[-2:] == [b"priority", 9]
    assert ra.execute_command("QPEEK", "local", 2) == [[b"local", ids[0], b"low0"], [b"local", ids[1], b"low1"]]
    assert ra.execute_command("ACKJOB", *[item[1] for item in got]) == 10

    # through federation: a consumer waits on the other node, which asks this one (NEEDJOBS)
    fill(ra, "far")
    taken: list[bytes] = []
    while len(taken) < 10:
        got = rb.execute_command("GETJOB", "TIMEOUT", 10_000, "COUNT", 10 - len(taken), "FROM", "far")
        assert got, "no job moved within 10 s (taken so far: %r)" % taken
        taken += [item[2] for item in got]
    assert taken == high

    def both() -> int:  # a YOURJOBS on its way is in neither queue for a moment
        return ra.execute_command("QLEN", "far") + rb.execute_command("QLEN", "far")

    wait_for(lambda: both() == 1000, timeout=10, what="the other 1,000 queued on one node or the other")
    # bad input on a real node: refused, nothing added
    with pytest.raises(Exception, match="PRIORITY must be a number from 0 to 9"):
        ra.execute_command("ADDJOB", "far", "x", 0, "PRIORITY", 10)
    assert both() == 1000
