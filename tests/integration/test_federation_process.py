"""Federation across real node processes, driven by redis-py."""

from __future__ import annotations

import threading
import time

import pytest
import redis

from disque_py.cli import launcher

from .conftest import wait_for
from .test_cluster_process import cluster_info, created  # noqa: F401  (fixture)

pytestmark = pytest.mark.integration


def test_consumers_on_a_get_jobs_produced_on_b_exactly_once(created):  # noqa: F811
    a, b, c = created(3)
    received: list[bytes] = []
    lock = threading.Lock()
    stop = threading.Event()

    def consume() -> None:
        r = redis.Redis(port=a, socket_timeout=10)
        while not stop.is_set():
            reply = r.execute_command("GETJOB", "TIMEOUT", 200, "FROM", "fed")
            if reply:
                ids = [item[1] for item in reply]
                r.execute_command("ACKJOB", *ids)
                with lock:
                    received.extend(ids)

    threads = [threading.Thread(target=consume, daemon=True) for _ in range(3)]
    for t in threads:
        t.start()
    producer = redis.Redis(port=b, socket_timeout=10)
    produced = []
    for k in range(200):
        produced.append(producer.execute_command("ADDJOB", "fed", "job-%d" % k, 5000, "REPLICATE", 2 if k % 2 else 1))
    for k in range(20):  # at-most-once jobs move too, and still once
        produced.append(producer.execute_command("ADDJOB", "fed", "amo-%d" % k, 5000, "REPLICATE", 1, "RETRY", 0))
    try:
        wait_for(lambda: len(received) >= len(produced), timeout=30, what="every job consumed on node A")
    finally:
        stop.set()
        for t in threads:
            t.join(15)
    assert sorted(received) == sorted(produced)  # each exactly once
    stats_a = redis.Redis(port=a).info("stats")
    stats_b = redis.Redis(port=b).info("stats")
    assert stats_a["jobs_imported"] >= 200
    assert stats_b["jobs_exported"] >= 200
    assert stats_a["needjobs_sent"] >= 1
    qstat = redis.Redis(port=a).execute_command("QSTAT", "fed")
    fields = {qstat[i]: qstat[i + 1] for i in range(0, len(qstat), 2)}
    assert fields[b"jobs-in"] >= 220
    b_id = redis.Redis(port=b).execute_command("CLUSTER", "MYID")
    assert b_id in fields[b"import-from"]
    # acks are collected everywhere
    wait_for(
        lambda: all(redis.Redis(port=p).info("jobs")["registered_jobs"] == 0 for p in (a, b, c)),
        timeout=20,
        what="acks collected on every node",
    )


@pytest.mark.parametrize("ack_on", ["consumer node", "producer node"])
def test_a_pushed_job_acked_on_either_node_is_collected_on_every_holder(created, ack_on):  # noqa: F811
    """ASYNC REPLICATE 2 jobs added on A while a consumer waits on B: each is pushed to B at once.
    Acknowledged on B, or on A, every copy is collected (before, the copy on the replica the ack
    never reached stayed and was queued again after RETRY)."""
    a, b, c = created(3)
    ra, rb = redis.Redis(port=a, socket_timeout=10), redis.Redis(port=b, socket_timeout=10)
    ids = []
    for k in range(12):  # the replica is B or C at random: both cases come up
        got: dict[str, object] = {}
        asked = ra.info("stats")["needjobs_received"]
        consumer = threading.Thread(
            target=lambda: got.update(reply=rb.execute_command("GETJOB", "TIMEOUT", 5000, "FROM", "push%d" % k))
        )
        consumer.start()
        # B asks everyone for jobs of the queue it waits on: from then on A pushes them at once
        wait_for(lambda: ra.info("stats")["needjobs_received"] > asked, what="B's NEEDJOBS on A")
        job = ra.execute_command("ADDJOB", "push%d" % k, "body", 0, "REPLICATE", 2, "RETRY", 1, "ASYNC")
        consumer.join(10)
        assert got["reply"] == [[b"push%d" % k, job, b"body"]]
        assert (rb if ack_on == "consumer node" else ra).execute_command("ACKJOB", job) == 1
        ids.append(job)
    shows = lambda: [redis.Redis(port=p).execute_command("SHOW", j) for p in (a, b, c) for j in ids]  # noqa: E731
    wait_for(lambda: not any(shows()), timeout=15, what="every acknowledged job collected on every node")


def test_an_at_most_once_job_is_not_pushed_to_a_node_whose_link_is_down(created, tmp_path):  # noqa: F811
    """A consumer waits on A, so B holds a push lease for A. A is killed with -9: B's link to it
    closes at once, while the failure detector needs the node timeout (30 s here) to flag it.
    A RETRY 0 job added on B in between stays queued on B. Pushed, it was lost: its only copy
    left with a message that had no link to go out on."""
    import os
    import signal

    a, b, c = created(3, "--node-timeout", "30000")
    rb = redis.Redis(port=b, socket_timeout=10)
    a_id = redis.Redis(port=a).execute_command("CLUSTER", "MYID").decode()
    asked = rb.info("stats")["needjobs_received"]

    def consume() -> None:
        try:
            redis.Redis(port=a, socket_timeout=30).execute_command("GETJOB", "TIMEOUT", 20000, "FROM", "amo")
        except redis.RedisError:
            pass  # A is killed under it

    consumer = threading.Thread(target=consume, daemon=True)
    consumer.start()
    wait_for(lambda: rb.info("stats")["needjobs_received"] > asked, timeout=10, what="A's NEEDJOBS on B")
    os.kill(int((tmp_path / "run" / ("node-%d" % a) / "disque.pid").read_text()), signal.SIGKILL)

    def a_line() -> list[str]:
        lines = rb.execute_command("CLUSTER", "NODES").decode().splitlines()
        return next(line.split() for line in lines if line.startswith(a_id))

    wait_for(lambda: a_line()[5] == "disconnected", timeout=10, what="B's link to A down")
    assert "fail" not in a_line()[2]  # not flagged yet: only the link says A is gone
    pushed = rb.info("stats")["jobs_pushed"]
    job_id = rb.execute_command("ADDJOB", "amo", "only-copy", 5000, "REPLICATE", 1, "RETRY", 0)
    assert rb.execute_command("QLEN", "amo") == 1
    assert rb.info("stats")["jobs_pushed"] == pushed
    assert rb.execute_command("GETJOB", "NOHANG", "FROM", "amo")[0][1] == job_id
    consumer.join(30)


def _blocked_getjob(node, queue: str) -> tuple[threading.Thread, list]:
    """A consumer blocked on ``node`` (GETJOB TIMEOUT 10 s), and ``node`` has asked the others
    for jobs of ``queue`` since (NEEDJOBS); the list gets (arrival time, reply)."""
    got: list = []
    r = node.client()
    asked = node.client().info("stats")["needjobs_sent"]

    def run() -> None:
        reply = r.execute_command("GETJOB", "TIMEOUT", 10_000, "FROM", queue)
        got.append((time.monotonic(), reply))

    t = threading.Thread(target=run, daemon=True)
    t.start()
    wait_for(lambda: node.client().info("clients")["blocked_clients"] >= 1, timeout=5, what="the consumer blocked")
    wait_for(lambda: node.client().info("stats")["needjobs_sent"] > asked, timeout=5, what="a NEEDJOBS sent")
    return t, got


def _arrival(t: threading.Thread, got: list, job: bytes, since: float) -> float:
    t.join(10)
    assert got and got[0][1] and got[0][1][0][1] == job, got
    return got[0][0] - since


def test_a_job_queued_again_anywhere_reaches_a_consumer_waiting_elsewhere_at_once(start_node):
    """A consumer waits on node A while a job is queued again on node B, which has no consumer:
    NACKed there (node A holding a copy or not), its RETRY run out there, or B restarted with
    it queued (its AOF, aof-enqueue-jobs-once). Each reaches A's consumer in milliseconds: it
    took up to the next discovery NEEDJOBS before (seconds; Disque's pull the same). Asserted
    within a second here (a loaded machine); BENCHMARKS.md has the measured figures."""
    a, b, c = nodes = [start_node(), start_node(appendonly="yes", aof_enqueue_jobs_once="yes"), start_node()]
    launcher.join([(n.host, n.port) for n in nodes], timeout=30)
    rb = b.client()
    took = {}
    for case, repl in (("nack-copy", 3), ("nack-nocopy", 1)):
        queue = "fed-" + case
        t, got = _blocked_getjob(a, queue)  # A waits: it has asked B and C, which have nothing
        tb, gotb = _blocked_getjob(b, queue)  # B's own consumer takes it (local ones first)
        job = rb.execute_command("ADDJOB", queue, "body", 5000, "REPLICATE", repl, "RETRY", 60)
        _arrival(tb, gotb, job, 0)
        t0 = time.monotonic()
        assert rb.execute_command("NACK", job) == 1
        took[case] = _arrival(t, got, job, t0)
    # RETRY: taken on B, never acked; its RETRY ends on B
    queue = "fed-retry"
    job = rb.execute_command("ADDJOB", queue, "body", 5000, "REPLICATE", 1, "RETRY", 1)
    assert rb.execute_command("GETJOB", "NOHANG", "FROM", queue)[0][1] == job
    t, got = _blocked_getjob(a, queue)
    show = rb.execute_command("SHOW", job)
    fields = dict(zip(show[::2], show[1::2]))
    due = time.monotonic() + int(fields[b"next-requeue-within"]) / 1000
    took["retry"] = _arrival(t, got, job, due)
    # restart: B goes down with a job queued; A's consumer waits; B comes back from its AOF
    queue = "fed-restart"
    job = rb.execute_command("ADDJOB", queue, "body", 5000, "REPLICATE", 1, "RETRY", 60)
    assert b.stop() == 0
    t, got = _blocked_getjob(a, queue)  # A waits: it has asked C (B is down)
    b.start()  # returns once B answers PING
    took["restart"] = _arrival(t, got, job, time.monotonic())
    print("\nqueued again -> delivered elsewhere (s):", {k: round(v, 4) for k, v in took.items()})
    assert all(v < 1.0 for v in took.values()), took
