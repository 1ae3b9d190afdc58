"""The garbage collector policy on a real node: stored jobs are frozen, and the
client paths leave no reference cycles behind (which freezing would keep until
the next full collection)."""

from __future__ import annotations

import socket

import pytest
import redis

from disque_py.server.gcpolicy import YOUNG_THRESHOLD

from .conftest import wait_for
from .test_node_process import raw

pytestmark = pytest.mark.integration


def test_stored_jobs_are_frozen_and_debug_gc_reports_what_it_freed(node):
    r = node.client()
    info = r.info("memory")
    assert info["gc_policy"] == "freeze-survivors"
    frozen_before = info["gc_frozen_objects"]
    pipe = r.pipeline(transaction=False)
    for i in range(30_000):
        pipe.execute_command("ADDJOB", "q", "body %d" % i, 0)
    pipe.execute()
    info = r.info("memory")
    assert info["gc_young_collections"] >= 1
    # each job is examined once, young, then frozen: all but those allocated since the last young
    # collection (fewer than YOUNG_THRESHOLD; a job is one tracked object, the timer heap holds the
    # jobs themselves); INFO counts the frozen objects at most every 10 s (counting walks them
    # all), so the count may take that long to show them
    least = 30_000 - YOUNG_THRESHOLD
    assert wait_for(lambda: r.info("memory")["gc_frozen_objects"] - frozen_before >= least, timeout=20, interval=0.2)
    assert isinstance(r.execute_command("DEBUG", "GC"), int)  # the number of objects it freed
    info = r.info("memory")
    assert info["gc_full_collections"] == 1
    assert info["gc_frozen_objects"] >= 30_000
    assert "GC: full collection (DEBUG GC by client" in node.log()
    for bad in (("DEBUG", "NOPE"), ("DEBUG", "GC", "now")):
        with pytest.raises(redis.ResponseError, match="GC"):
            r.execute_command(*bad)


def test_client_paths_leave_no_reference_cycles(node):
    """Bad input, errors, blocked clients that leave, timeouts: everything is freed by
    reference counting. A cycle here would be frozen with the rest and stay until the
    hourly full collection; the parser's stored protocol error once made one per
    connection (its traceback held the connection)."""
    r = node.client()
    r.execute_command("DEBUG", "GC")  # start from a clean heap
    for i in range(40):
        c = node.client()
        jid = c.execute_command("ADDJOB", "q%d" % (i % 3), "body", 0, "RETRY", 1)
        assert c.execute_command("GETJOB", "TIMEOUT", 5, "FROM", "empty%d" % i) is None
        job = c.execute_command("GETJOB", "NOHANG", "FROM", "q%d" % (i % 3))
        c.execute_command("ACKJOB", job[0][1])
        c.execute_command("FASTACK", jid)
        for bad, why in ((("NOSUCHCMD", "x"), "^unknown command 'NOSUCHCMD'"),
                         (("ACKJOB", "bad-id"), "^BADID "),
                         (("ADDJOB", "q"), "^wrong number of arguments for 'addjob' command"),
                         (("GETJOB", "TIMEOUT", "x", "FROM", "q"), "^timeout is not an integer or out of range")):
            with pytest.raises(redis.ResponseError, match=why):
                c.execute_command(*bad)
        c.close()
        with socket.create_connection(("127.0.0.1", node.port)) as s:  # leaves while blocked
            s.sendall(b"*3\r\n$6\r\nGETJOB\r\n$4\r\nFROM\r\n$1\r\nz\r\n")
        assert raw(node.port, b"*x\r\n\xff garbage\r\n").startswith(b"-ERR Protocol error")
        assert raw(node.port, b'PING "unbalanced\r\n').startswith(b"-ERR Protocol error")
        with socket.create_connection(("127.0.0.1", node.port)) as s:  # half a command, then gone
            s.sendall(b"*3\r\n$6\r\nADDJOB\r\n$1\r")
        with socket.create_connection(("127.0.0.1", node.port + 10000)) as s:  # garbage on the cluster bus
            s.sendall(b"GET / HTTP/1.0\r\n\r\n" * 4)
    assert r.execute_command("PING") is True
    assert r.execute_command("DEBUG", "GC") == 0


def test_refused_bus_connects_leave_no_reference_cycles(node):
    """A peer that is gone is retried for ever: each refused connect once left ~28 objects in
    a cycle (trio keeps the error in a closure, and its traceback holds that closure's frame)."""
    r = node.client()
    with socket.socket() as s:  # a port nothing listens on once this closes
        s.bind(("127.0.0.1", 0))
        dead_bus_port = s.getsockname()[1]
    assert dead_bus_port > 10000
    r.execute_command("DEBUG", "GC")

    def failures() -> int:
        info = r.execute_command("CLUSTER", "INFO").decode()
        return int(info.split("cluster_stats_bus_connect_failures:")[1].split()[0])

    assert failures() == 0
    r.execute_command("CLUSTER", "MEET", "127.0.0.1", dead_bus_port - 10000)
    wait_for(lambda: failures() >= 5, timeout=30, what="five refused connects")
    assert r.execute_command("DEBUG", "GC") == 0
