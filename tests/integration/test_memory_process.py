"""maxmemory on real node processes (core/memory.py, server/dispatch.py): a producer flood at
64 MB, -OOM with Disque's text while GETJOB and ACKJOB drain the node, maxmemory lowered at
runtime, idle queues evicted, and external replication seen through SHOW on a cluster."""

from __future__ import annotations

import re

import pytest
import redis

from disque_py.cli import launcher

from .conftest import wait_for

pytestmark = pytest.mark.integration

MB = 1024 * 1024
OOM = "OOM command not allowed when used memory > 'maxmemory'."
OUT_OF_MEMORY = "I'm out of memory"
# Disque's text, then the numbers behind it
OOM_NUMBERS = r" \(used_memory \d+, the estimate of the node's data; maxmemory \d+\)$"
OOM_REPLY = "^" + re.escape(OOM.removeprefix("OOM ")) + OOM_NUMBERS  # what redis-py's OutOfMemoryError says


def is_oom(text: str) -> bool:
    return re.match(re.escape(OOM) + OOM_NUMBERS, text) is not None


def error_text(exc: Exception) -> str:
    """The error as the node sent it (redis-py takes the OOM prefix off into the type)."""
    if isinstance(exc, redis.exceptions.OutOfMemoryError):
        return "OOM " + str(exc)
    return str(exc)


def memory(r: redis.Redis) -> dict:
    return r.execute_command("INFO", "memory")


def level(r: redis.Redis) -> int:
    return int(memory(r)["memory_level"])


def show(r: redis.Redis, job_id: bytes) -> dict | None:
    reply = r.execute_command("SHOW", job_id)
    if reply is None:
        return None
    return {reply[i].decode(): reply[i + 1] for i in range(0, len(reply), 2)}


def test_a_flooded_node_stays_under_maxmemory_refuses_with_oom_and_drains(start_node):
    node = start_node(maxmemory="64mb")
    r = node.client()
    info = memory(r)
    assert info["maxmemory"] == 64 * MB and info["maxmemory_measure"] == "estimate"
    assert info["memory_level"] == 0
    rss_at_start = int(info["used_memory_rss"])
    body = b"x" * 1000
    refused = 0
    highest = 0
    batches = 0
    # The flood: pipelines of 500 ADDJOBs until the node has refused jobs for 20 batches.
    while refused < 20 * 500:
        batches += 1
        assert batches < 400, "the node never stopped taking jobs: %s" % memory(r)
        pipe = r.pipeline(transaction=False)
        for _ in range(500):
            pipe.execute_command("ADDJOB", "flood", body, 0, "REPLICATE", 1)
        for reply in pipe.execute(raise_on_error=False):
            if isinstance(reply, redis.ResponseError):
                # Alone at 75 % it cannot replicate externally: NOREPL, saying why (Disque's).
                assert OUT_OF_MEMORY in str(reply) or is_oom(error_text(reply)), reply
                refused += 1
        highest = max(highest, int(memory(r)["used_memory"]))
    assert highest < 64 * MB
    info = memory(r)
    assert info["memory_level"] >= 1
    queued = r.execute_command("QLEN", "flood")
    assert queued * 1000 >= 0.6 * 48 * MB  # it did fill up to the first threshold
    assert "Memory level 0 -> 1" in node.log()
    # The estimate the policy reads is honest: the process grew by about as much (measured: within
    # 3 % for bodies of 10 B to 10 kB; the bounds leave room for the allocator's ways).
    grown = int(info["used_memory_rss"]) - rss_at_start
    assert 0.5 * int(info["used_memory"]) <= grown <= 2 * int(info["used_memory"]), info

    # Lowered at runtime under what it holds: level 3 at once, and -OOM for what grows memory.
    used = int(info["used_memory"])
    assert r.execute_command("CONFIG", "SET", "maxmemory", str(used * 9 // 10)) in (b"OK", True)
    assert level(r) == 3
    for argv in (("ADDJOB", "flood", "x", 0), ("ADDJOB", "other", "x", 0, "REPLICATE", 1)):
        with pytest.raises(redis.exceptions.OutOfMemoryError, match=OOM_REPLY) as exc:
            r.execute_command(*argv)
        assert is_oom(error_text(exc.value)), exc.value
    taken = r.execute_command("GETJOB", "COUNT", 10, "FROM", "flood")
    for command in ("NACK", "ENQUEUE"):
        with pytest.raises(redis.exceptions.OutOfMemoryError, match=OOM_REPLY) as exc:
            r.execute_command(command, taken[0][1])
        assert is_oom(error_text(exc.value)), exc.value
    assert r.execute_command("ACKJOB", taken[0][1]) == 1
    assert r.execute_command("FASTACK", taken[1][1]) == 1
    assert r.execute_command("DELJOB", taken[2][1]) == 1
    assert r.execute_command("WORKING", taken[3][1]) == 300  # postponed by its RETRY (the default)
    assert "-> 3: " in node.log()

    # Consumers drain it: the level comes back to 0 and jobs are taken again.
    while True:
        jobs = r.execute_command("GETJOB", "NOHANG", "COUNT", 1000, "FROM", "flood")
        if not jobs:
            break
        r.execute_command("FASTACK", *[job[1] for job in jobs])
    wait_for(lambda: level(r) == 0, timeout=10, what="the level back to 0")
    assert int(memory(r)["memory_oom_refused"]) >= 4
    assert isinstance(r.execute_command("ADDJOB", "flood", "x", 0, "REPLICATE", 1), bytes)
    assert "-> 0" in node.log()
    assert r.execute_command("PING") in (b"PONG", True)


def test_maxmemory_1_refuses_at_once_and_evicts_idle_queues(start_node):
    node = start_node()
    r = node.client()
    for i in range(50):
        r.execute_command("ADDJOB", "q%d" % i, "job", 0, "REPLICATE", 1, "RETRY", 0)
        r.execute_command("GETJOB", "FROM", "q%d" % i)
    assert int(r.execute_command("INFO", "queues")["registered_queues"]) == 50
    r.execute_command("CONFIG", "SET", "maxmemory", "1")
    with pytest.raises(redis.exceptions.OutOfMemoryError, match=OOM_REPLY) as exc:
        r.execute_command("ADDJOB", "q0", "job", 0)
    assert is_oom(error_text(exc.value)), exc.value
    info = memory(r)
    assert info["memory_level"] == 3 and info["maxmemory_oom_at"] == 1
    # Delivered RETRY 0 jobs go (level 2+), then the queues once idle for 2 s (as Disque's 04-ttl).
    wait_for(lambda: int(r.execute_command("INFO", "jobs")["registered_jobs"]) == 0, timeout=10, what="jobs freed")
    wait_for(
        lambda: int(r.execute_command("INFO", "queues")["registered_queues"]) == 0, timeout=10, what="queues evicted"
    )
    assert int(memory(r)["memory_freed_jobs"]) == 50
    r.execute_command("CONFIG", "SET", "maxmemory", str(1024**3))
    assert level(r) == 0
    assert isinstance(r.execute_command("ADDJOB", "q0", "job", 0), bytes)
    # No "does not act on it" warning: maxmemory is acted on.
    assert "does not act on it" not in node.log()


def test_a_node_at_75_percent_replicates_new_jobs_externally(start_node):
    nodes = start_node.many(3)
    launcher.join([("127.0.0.1", n.port) for n in nodes], timeout=30)
    a, b, c = (n.client() for n in nodes)
    a_id = a.execute_command("CLUSTER", "MYID").decode()
    for _ in range(200):
        a.execute_command("ADDJOB", "warm", "x" * 100, 0, "REPLICATE", 1)
    used = int(memory(a)["used_memory"])
    a.execute_command("CONFIG", "SET", "maxmemory", str(used * 100 // 85))  # 85 %: level 1
    assert level(a) == 1
    for repl in (1, 2):
        job_id = a.execute_command("ADDJOB", "ext", "body", 0, "REPLICATE", repl)
        assert show(a, job_id) is None  # no copy on the node short of memory
        holders = []

        def copies() -> bool:
            holders[:] = [s for s in (show(b, job_id), show(c, job_id)) if s is not None]
            return len(holders) >= repl

        wait_for(copies, timeout=10, what="the external copies")
        for job in holders:
            delivered = [n.decode() for n in job["nodes-delivered"]]
            assert a_id not in delivered and len(delivered) == repl
        wait_for(lambda: any((s or {}).get("state") == b"queued" for s in (show(b, job_id), show(c, job_id))),
                 timeout=10, what="the job queued on one holder")  # fmt: skip
    # A REPLJOB from a peer is not taken either: B cannot find two other nodes to hold copies.
    with pytest.raises(redis.ResponseError, match="^NOREPL"):
        b.execute_command("ADDJOB", "ext", "body", 1000, "REPLICATE", 3)
    a.execute_command("CONFIG", "SET", "maxmemory", str(1024**3))
    assert level(a) == 0
    job_id = a.execute_command("ADDJOB", "ext", "body", 0, "REPLICATE", 1)
    assert show(a, job_id) is not None
    assert "Memory level 0 -> 1" in nodes[0].log()


def test_at_95_percent_what_breaks_no_guarantee_is_let_go(start_node):
    node = start_node()
    r = node.client()
    kept = [r.execute_command("ADDJOB", "work", "x" * 200, 0, "REPLICATE", 1) for _ in range(100)]
    once = [r.execute_command("ADDJOB", "once", "x" * 200, 0, "REPLICATE", 1, "RETRY", 0) for _ in range(50)]
    assert len(r.execute_command("GETJOB", "COUNT", 50, "FROM", "once")) == 50  # delivered at most once
    used = int(memory(r)["used_memory"])
    r.execute_command("CONFIG", "SET", "maxmemory", str(used * 100 // 97))  # 97 %: level 2
    wait_for(lambda: int(memory(r)["memory_freed_jobs"]) == 50, timeout=10, what="the delivered RETRY 0 jobs freed")
    assert all(show(r, job_id) is None for job_id in once)
    assert all(show(r, job_id)["state"] == b"queued" for job_id in kept)  # queued jobs are never let go
    assert "Memory level 0 -> 2: " in node.log()
    # With a third of its jobs gone it is back under 75 %.
    wait_for(lambda: level(r) == 0, timeout=10, what="the level back to 0")
    assert "Memory level 2 -> 0: " in node.log()
