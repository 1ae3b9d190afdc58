"""Direct fetching: quick plain-function handlers fetch for themselves (``client/worker/direct.py``).

Against a real node. Each test checks the worker's promises while the
handler threads do their own round trips: every job handled once and
acknowledged on the node, ``max_in_flight`` from the node's side, ACKs not
held behind a slow handler, a stop or a lost connection loses nothing.
"""

from __future__ import annotations

import threading

import pytest
import trio

from disque_py import Client, Worker
from disque_py.aio import Client as AioClient
from disque_py.client.worker import direct as direct_module

from .conftest import PASSWORD, addr, raw, run_until, sample_in_flight, wait_for

pytestmark = pytest.mark.integration


class Seen:
    """What the handler threads ran; records a job run twice at once."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.handled: list[str] = []
        self.running: set[str] = set()
        self.overlaps: list[str] = []

    def start(self, job_id: str) -> None:
        with self.lock:
            if job_id in self.running:
                self.overlaps.append(job_id)
            self.running.add(job_id)

    def done(self, job_id: str) -> None:
        with self.lock:
            self.running.discard(job_id)
            self.handled.append(job_id)

    def handler(self, job) -> None:
        self.start(job.id)
        self.done(job.id)


def jobs_on_node(node, queue: str, state: str | None = None) -> int:
    """Jobs of ``queue`` the node still holds (in ``state``), by JSCAN."""
    extra = ["STATE", state] if state else []
    total, cursor = 0, 0
    while True:
        cursor, ids = raw(node).execute_command("JSCAN", cursor, "COUNT", 10000, "QUEUE", queue, *extra)
        total += len(ids)
        if int(cursor) == 0:
            return total


def rounds(w: Worker) -> int:
    assert w._threads is not None
    return w._threads.direct.rounds


@pytest.mark.parametrize("concurrency", [1, 4])
async def test_quick_sync_handlers_fetch_for_themselves(node, queue, concurrency):
    ids = Client(addr(node)).add_jobs(queue, [b"%d" % i for i in range(2000)])
    seen = Seen()
    w = Worker(addr(node), queue, seen.handler, concurrency=concurrency, fetch_timeout_ms=100)
    await run_until(w, lambda: w.stats().processed == 2000 and not w.stats().in_flight, timeout=30)
    assert sorted(seen.handled) == sorted(ids)  # each exactly once
    assert not seen.overlaps
    stats = w.stats()
    assert stats.processed == stats.fetched == 2000 and stats.in_flight == 0 and stats.failed == 0
    assert rounds(w) > 10  # direct mode did rounds
    assert jobs_on_node(node, queue) == 0  # every one acknowledged


async def test_direct_rounds_never_exceed_max_in_flight(node, queue):
    max_in_flight, concurrency = 5, 3
    Client(addr(node)).add_jobs(queue, [b"%d" % i for i in range(3000)])
    seen = Seen()
    w = Worker(addr(node), queue, seen.handler, concurrency=concurrency, max_in_flight=max_in_flight,
               fetch_timeout_ms=100)  # fmt: skip
    monitor = AioClient(addr(node))
    server_active: list[int] = []
    local: list[int] = []
    with trio.fail_after(30):
        async with trio.open_nursery() as nursery:
            nursery.start_soon(sample_in_flight, monitor, queue, w, server_active, local, 0.001)
            nursery.start_soon(w.run)
            while w.stats().processed < 3000:
                await trio.sleep(0.005)
            w.stop()
            nursery.cancel_scope.cancel()
    assert rounds(w) > 10 and len(server_active) > 20
    assert max(server_active) <= max_in_flight and max(local) <= max_in_flight
    assert max(server_active) > 0  # the samples did see jobs in hand
    assert await monitor.qlen(queue) == 0 and jobs_on_node(node, queue) == 0


@pytest.mark.parametrize("concurrency", [1, 2])
async def test_a_slow_handler_holds_back_no_ack(node, queue, concurrency):
    """Quick jobs, then one that blocks: the jobs done before it (and, with a second thread,
    after it) are acknowledged on the node while it blocks."""
    c = Client(addr(node))
    # an odd number before it: with one thread it comes second in its batch of two, behind a done job
    first = c.add_jobs(queue, [b"a%d" % i for i in range(301)])
    [slow_id] = c.add_jobs(queue, [b"slow"])
    after = c.add_jobs(queue, [b"b%d" % i for i in range(300)])
    total = len(first) + 1 + len(after)
    entered, release = threading.Event(), threading.Event()
    seen = Seen()

    def handler(job):
        seen.start(job.id)
        if job.body == b"slow":
            entered.set()
            assert release.wait(20), "never released"
        seen.done(job.id)

    w = Worker(addr(node), queue, handler, concurrency=concurrency, fetch_timeout_ms=100)
    try:
        with trio.fail_after(30):
            async with trio.open_nursery() as nursery:
                nursery.start_soon(w.run)
                await trio.to_thread.run_sync(entered.wait, 20)
                assert rounds(w) > 10  # it got there in direct mode

                def acked_all_handled() -> bool:
                    with seen.lock:
                        handled = len(seen.handled)
                    return jobs_on_node(node, queue) == total - handled

                await trio.to_thread.run_sync(
                    lambda: wait_for(acked_all_handled, timeout=10, what="every handled job acknowledged")
                )
                if concurrency == 2:  # the other thread took everything else
                    await trio.to_thread.run_sync(
                        lambda: wait_for(lambda: len(seen.handled) == total - 1, timeout=10, what="the rest")
                    )
                    await trio.to_thread.run_sync(  # the last one's ACKJOB leaves after it is counted handled
                        lambda: wait_for(lambda: jobs_on_node(node, queue) == 1, timeout=10, what="only the slow one left")
                    )
                release.set()
                while w.stats().processed < total or w.stats().in_flight:
                    await trio.sleep(0.005)
                w.stop()
    finally:
        release.set()
    assert sorted(seen.handled) == sorted(first + [slow_id] + after) and not seen.overlaps
    assert jobs_on_node(node, queue) == 0


async def test_stop_in_direct_mode_loses_nothing(node, queue):
    ids = Client(addr(node)).add_jobs(queue, [b"%d" % i for i in range(20000)], timeout_ms=0)
    seen = Seen()
    w = Worker(addr(node), queue, seen.handler, concurrency=2, fetch_timeout_ms=100)
    with trio.fail_after(30):
        async with trio.open_nursery() as nursery:
            nursery.start_soon(w.run)
            while w.stats().processed < 1000:
                await trio.sleep(0.001)
            w.stop()
    stats = w.stats()
    assert rounds(w) > 10 and not seen.overlaps
    assert stats.in_flight == 0 and stats.processed == len(seen.handled) == len(set(seen.handled)) < len(ids)
    # what was handled is acknowledged; the rest is queued again (never fetched, or handed back)
    assert jobs_on_node(node, queue, "active") == 0
    assert raw(node).execute_command("QLEN", queue) == len(ids) - stats.processed
    assert stats.released == stats.fetched - stats.processed and stats.retried == 0  # fetched, not run: given back


async def test_direct_connection_lost_mid_stream(node, queue, monkeypatch):
    """The node drops the handler threads' connection (CLIENT KILL) three times: the trio
    fetcher carries on, direct mode comes back, every job is handled once and acknowledged."""
    monkeypatch.setattr(direct_module, "DIRECT_RETRY", 0.05)
    ids = Client(addr(node)).add_jobs(queue, [b"%d" % i for i in range(30000)], retry=2, timeout_ms=0)
    seen = Seen()
    w = Worker(addr(node), queue, seen.handler, concurrency=2, fetch_timeout_ms=100)
    threads = w._threads
    assert threads is not None
    kills: list[int] = []
    admin = raw(node)

    def kill_direct_connection() -> bool:
        conn = threads.direct.conn
        sock = conn._conn._sock if conn is not None else None
        if sock is None:
            return False
        try:
            local = "%s:%d" % sock.getsockname()[:2]
        except OSError:
            return False
        if admin.execute_command("CLIENT", "KILL", "ADDR", local) != 1:
            return False
        kills.append(rounds(w))
        return True

    with trio.fail_after(60):
        async with trio.open_nursery() as nursery:
            nursery.start_soon(w.run)
            while len(kills) < 3:
                # each kill once direct mode has come back and done some rounds since the last
                while rounds(w) < (kills[-1] if kills else 0) + 50:
                    await trio.sleep(0.001)
                if not await trio.to_thread.run_sync(kill_direct_connection):
                    await trio.sleep(0.001)
            while not set(ids) <= set(seen.handled) or w.stats().in_flight:
                await trio.sleep(0.01)
            w.stop()
    assert len(kills) == 3 and rounds(w) > kills[-1]
    # exactly once: the ACKs a broken round trip may not have delivered are sent again in
    # time (else the node would requeue those jobs after RETRY and they would run twice)
    assert sorted(seen.handled) == sorted(ids) and not seen.overlaps
    wait_for(lambda: jobs_on_node(node, queue) == 0, timeout=10, what="every job acknowledged")


async def test_direct_connection_authenticates(auth_node, queue):
    """On a node with requirepass the threads' own connection logs in with the worker's password."""
    seeds = addr(auth_node)
    ids = Client(seeds, password=PASSWORD).add_jobs(queue, [b"%d" % i for i in range(500)])
    seen = Seen()
    w = Worker(seeds, queue, seen.handler, password=PASSWORD, fetch_timeout_ms=100)
    await run_until(w, lambda: w.stats().processed == 500 and not w.stats().in_flight, timeout=30)
    assert sorted(seen.handled) == sorted(ids) and rounds(w) > 10
    assert Client(seeds, password=PASSWORD).qlen(queue) == 0


async def test_an_unreadable_reply_on_the_direct_connection_loses_nothing(node, queue, monkeypatch):
    """The threads' connection brings GETJOB replies of the wrong shape (twice): each such
    round ends direct mode, the trio fetcher goes on, and the jobs the node did hand out in
    those rounds come back after RETRY and are handled once."""
    monkeypatch.setattr(direct_module, "DIRECT_RETRY", 0.05)
    garbage = iter([b"not a job list", [[b"q", 42]]])
    mangled: list[object] = []

    class Mangling(direct_module.NodeConnection):
        def request_many(self, argvs, timeout):
            replies = super().request_many(argvs, timeout)
            if replies[-1] and not mangled[1:]:
                mangled.append(replies[-1])
                replies[-1] = next(garbage)
            return replies

    monkeypatch.setattr(direct_module, "NodeConnection", Mangling)
    client = Client(addr(node))
    ids = client.add_jobs(queue, [b"%d" % i for i in range(2000)], retry=1)
    seen = Seen()
    w = Worker(addr(node), queue, seen.handler, concurrency=2, fetch_timeout_ms=100)
    with trio.fail_after(60):
        async with trio.open_nursery() as nursery:
            nursery.start_soon(w.run)
            while len(mangled) < 2:
                await trio.sleep(0.005)
            # direct mode comes back after the second bad round: more jobs until it has done
            # a round trip of its own (on a slow machine the trio fetcher may take the rest)
            after = rounds(w)
            while rounds(w) <= after:
                ids += await trio.to_thread.run_sync(lambda: client.add_jobs(queue, [b"more"] * 50, retry=1))
                await trio.sleep(0.05)
            while len(set(seen.handled)) < len(ids) or w.stats().in_flight:
                await trio.sleep(0.005)
            w.stop()
    assert len(mangled) == 2
    assert sorted(seen.handled) == sorted(ids) and not seen.overlaps  # nothing lost, nothing twice
    wait_for(lambda: jobs_on_node(node, queue) == 0, timeout=10, what="every job acknowledged")
