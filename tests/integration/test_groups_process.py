"""ADDJOB's GROUP and GROUP LIMIT on three real node processes: consumers on every node hold
jobs for a while before acknowledging them, and their own count of jobs held never goes above
the group's CONCURRENCY limit, while the jobs of another group are not held up; with
DISQUE_PY_GROUPS_PROOF=1 a longer run kills a node (SIGKILL) halfway and the others finish
every job, still never above the limit (the CI runs the short one)."""

from __future__ import annotations

import os
import random
import threading
import time

import pytest

from .conftest import wait_for

pytestmark = pytest.mark.integration

LONG = os.environ.get("DISQUE_PY_GROUPS_PROOF") == "1"


class Held:
    """The consumers' own count of jobs of the limited group they hold, sampled at every change."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.now = 0
        self.most = 0
        self.done: set[bytes] = set()
        self.other_done: set[bytes] = set()

    def take(self, n: int) -> None:
        with self.lock:
            self.now += n
            self.most = max(self.most, self.now)

    def give(self, job_id: bytes) -> None:
        with self.lock:
            self.now -= 1
            self.done.add(job_id)


def consume(node, held: Held, stop: threading.Event, seed: int) -> None:
    rng = random.Random(seed)
    r = node.client()
    while not stop.is_set():
        try:
            got = r.execute_command("GETJOB", "TIMEOUT", 200, "COUNT", 2, "FROM", "limited", "free")
        except Exception:  # noqa: BLE001 - its node was killed: this consumer is gone
            return
        if not got:
            continue
        mine = [item for item in got if item[0] == b"limited"]
        held.take(len(mine))  # counted the moment they are in hand
        for item in got:
            if item[0] == b"free":
                r.execute_command("ACKJOB", item[1])
                with held.lock:
                    held.other_done.add(item[1])
        time.sleep(rng.uniform(0.05, 0.25))  # the work, well within the jobs' RETRY
        for item in mine:
            held.give(item[1])  # done with it: out of hand as its ACKJOB leaves
            try:
                r.execute_command("ACKJOB", item[1])  # acknowledged where it was delivered
            except Exception:  # noqa: BLE001
                return


def test_a_concurrency_limit_holds_for_consumers_on_three_real_nodes(cluster3):
    limit = 3
    jobs = 120 if LONG else 30
    clients = [n.client() for n in cluster3]
    assert clients[0].execute_command("GROUP", "LIMIT", "tenant", "CONCURRENCY", limit) in (b"OK", True)
    wait_for(lambda: all(c.execute_command("GROUP", "INFO", "tenant")[5] == limit for c in clients),
             timeout=10, what="the limit on every node")  # fmt: skip
    ids = set()
    for i in range(jobs):
        c = clients[i % 3]
        ids.add(c.execute_command("ADDJOB", "limited", "job%d" % i, 0, "GROUP", "tenant", "RETRY", 20, "REPLICATE", 2))
    others = {clients[i % 3].execute_command("ADDJOB", "free", "f%d" % i, 0, "GROUP", "other") for i in range(10)}
    held = Held()
    stop = threading.Event()
    threads = [threading.Thread(target=consume, args=(n, held, stop, i * 2 + k), daemon=True)
               for i, n in enumerate(cluster3) for k in range(2)]  # fmt: skip
    for t in threads:
        t.start()
    killed = None
    try:
        deadline = time.monotonic() + (240 if LONG else 90)
        while time.monotonic() < deadline and not (held.done >= ids and held.other_done >= others):
            if LONG and killed is None and len(held.done) >= jobs // 2:
                killed = cluster3[2]
                killed.proc.kill()  # SIGKILL: its deliveries come back after their RETRY
            time.sleep(0.05)
    finally:
        stop.set()
        for t in threads:
            t.join(timeout=10)
    assert held.most <= limit, "the consumers held %d jobs of a group limited to %d" % (held.most, limit)
    assert held.other_done >= others  # the other group was not held up
    if killed is None:
        assert held.done >= ids and held.most == limit  # all done, the limit reached, never passed
    else:  # the killed node's consumers took theirs with them: the others are done by the survivors
        survivors = [c for n, c in zip(cluster3, clients) if n is not killed]
        wait_for(lambda: sum(c.execute_command("QLEN", "limited") for c in survivors) == 0, timeout=120,
                 what="every job delivered by the survivors")  # fmt: skip
    info = dict(zip(*[iter(clients[0].execute_command("GROUP", "INFO", "tenant"))] * 2))
    assert info[b"concurrency"] == limit
    with pytest.raises(Exception, match="CONCURRENCY must be a number from 1 to 100000"):
        clients[0].execute_command("GROUP", "LIMIT", "tenant", "CONCURRENCY", 0)
    with pytest.raises(Exception, match="has a CONCURRENCY limit, which RETRY 0 cannot keep"):
        clients[0].execute_command("ADDJOB", "limited", "x", 0, "GROUP", "tenant", "RETRY", 0, "REPLICATE", 1)
