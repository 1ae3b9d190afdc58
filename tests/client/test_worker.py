"""The worker runtime against a real node (and, for backoff timing, a fake client on trio's MockClock)."""

from __future__ import annotations

import logging
import os
import random
import signal
import subprocess
import sys
import textwrap
import threading
import time

import pytest
import trio

from disque_py import Backoff, Client, DeadLetter, Job, Worker, WorkerStats, current_worker
from disque_py.aio import Client as AioClient
from disque_py.client.errors import BadIdError, CommandError, error_from_reply
from disque_py.client.worker import Reject, describe_error
from disque_py.client.worker.acks import unknown_command

from .conftest import ROOT, addr, raw, run_until, sample_in_flight, wait_for

pytestmark = pytest.mark.integration


def show(node, job_id: str) -> dict | None:
    return Client(addr(node)).show(job_id)


def handler_threads() -> list[threading.Thread]:
    """The live handler threads of every worker (each test leaves none behind)."""
    return [t for t in threading.enumerate() if t.name.startswith("disque-py-handler-")]


@pytest.mark.parametrize("kind", ["async", "sync"])
async def test_processes_and_acks(node, queue, kind):
    ids = Client(addr(node)).add_jobs(queue, [b"%d" % i for i in range(50)])
    seen: list[Job] = []

    if kind == "async":

        async def handler(job):
            seen.append(job)
    else:

        def handler(job):
            seen.append(job)

    w = Worker(addr(node), queue, handler, concurrency=4, fetch_timeout_ms=100)
    stats = await run_until(w, lambda: w.stats().processed == 50)
    assert sorted(j.id for j in seen) == sorted(ids)
    assert stats.processed == 50 and stats.failed == stats.retried == stats.dead == 0
    assert stats.in_flight == 0 and stats.running == 0 and stats.fetched == 50
    assert all(show(node, i) is None for i in ids)  # acknowledged (and gone on one node)


@pytest.mark.parametrize("kind", ["async", "sync"])
async def test_handlers_see_the_dedup_key(node, queue, kind):
    client = Client(addr(node))
    keyed = client.add_jobs(queue, [b"a", b"b"], dedup=lambda body: "key-" + body.decode())
    plain = client.add_job(queue, b"c")
    assert client.add_job(queue, b"a again", dedup="key-a") == keyed[0]  # nothing added
    seen: dict[str, str | None] = {}

    if kind == "async":

        async def handler(job):
            seen[job.text()] = job.dedup
    else:

        def handler(job):
            seen[job.text()] = job.dedup

    w = Worker(addr(node), queue, handler, concurrency=2, fetch_timeout_ms=100)
    stats = await run_until(w, lambda: w.stats().processed == 3)
    assert seen == {"a": "key-a", "b": "key-b", "c": None}
    assert stats.processed == 3 and all(show(node, i) is None for i in keyed + [plain])


async def test_flow_control_never_exceeds_max_in_flight(node, queue):
    max_in_flight, concurrency = 5, 3
    ids = Client(addr(node)).add_jobs(queue, [b"%d" % i for i in range(60)])
    running = peak_running = 0
    monitor = AioClient(addr(node))
    states: list[str] = []

    server_active: list[int] = []
    local: list[int] = []

    async def handler(job):
        nonlocal running, peak_running
        running += 1
        peak_running = max(peak_running, running)
        states.append((await monitor.show(job.id))["state"])  # the server agrees it is ours
        seen = len(server_active)
        await trio.sleep(0.01)  # some work
        while len(server_active) == seen:  # the sampler looks at least once while this one runs
            await trio.sleep(0.001)
        running -= 1

    w = Worker(addr(node), queue, handler, concurrency=concurrency, max_in_flight=max_in_flight,
               fetch_timeout_ms=100)  # fmt: skip
    with trio.fail_after(15):
        async with trio.open_nursery() as nursery:
            nursery.start_soon(sample_in_flight, monitor, queue, w, server_active, local, 0.002)
            await run_until(w, lambda: w.stats().processed == 60)
            nursery.cancel_scope.cancel()
    assert len(server_active) >= 60 // concurrency  # each sample ends at most `concurrency` handlers
    assert max(server_active) <= max_in_flight and max(local) <= max_in_flight
    assert max(server_active) >= concurrency  # it did run jobs in parallel
    assert peak_running == concurrency
    assert set(states) == {"active"}
    assert await monitor.qlen(queue) == 0 and all(show(node, i) is None for i in ids)


async def test_dead_letter_after_max_attempts(node, queue):
    """Retries are NACKs with a growing DELAY and the error as REASON; the last attempt's
    failure is a NACK DEAD: the node dead-letters the job into <queue>.dead."""
    c = Client(addr(node))
    [jid] = c.add_jobs(queue, [b"\xff payload"])
    calls = []
    reasons = []

    def handler(job):
        calls.append((job.attempt, time.monotonic()))
        reasons.append(job.last_nack_reason)
        raise ValueError("boom %d" % job.attempt)

    retry = Backoff(initial=0.3, maximum=0.6, jitter=0.0)
    w = Worker(addr(node), queue, handler, max_attempts=3, retry_backoff=retry, fetch_timeout_ms=100)
    stats = await run_until(w, lambda: w.stats().dead == 1 and w.stats().in_flight == 0)
    assert [a for a, _ in calls] == [1, 2, 3]
    gaps = [b - a for (_, a), (_, b) in zip(calls, calls[1:])]
    assert gaps[0] >= 0.3 and gaps[1] >= 0.6  # NACK DELAY: not back before its delay
    assert reasons == [None, "ValueError: boom 1", "ValueError: boom 2"]  # NACK REASON, kept by the node
    assert (stats.failed, stats.retried, stats.dead, stats.processed) == (3, 2, 1, 0)
    [dead] = c.get_jobs(queue + ".dead", nohang=True)
    assert dead.body == b"\xff payload" and dead.is_dead_letter
    assert (dead.dead_letter_of, dead.original_queue) == (jid, queue)
    assert dead.dead_letter_reason == "ValueError: boom 3"
    shown = c.show(dead.id)
    assert shown["dead-letter-of"] == jid and shown["original-queue"] == queue
    assert shown["dead-letter-reason"] == "ValueError: boom 3"
    c.ack(dead.id)
    wait_for(lambda: c.show(jid) is None, what="original acknowledged")


def check_out(order):
    return order["missing"]  # the handler's failing line


async def test_a_failure_goes_to_the_node_with_its_traceback_and_is_logged_once(node, queue, caplog):
    """Each failure: one record of disque_py.worker (WARNING, then ERROR for the one that ends
    the job) with the traceback under its line; the NACK's TRACE, shown by SHOW at the next
    delivery and kept in the dead letter."""
    c = Client(addr(node))
    jid = c.add_job(queue, b"order 1")
    kept: list[str | None] = []

    def handler(job):
        kept.append(c.show(job.id).get("last-failure-trace"))  # what the node has of the last failure
        check_out({})

    retry = Backoff(initial=0.05, maximum=0.1, jitter=0.0)
    w = Worker(addr(node), queue, handler, max_attempts=2, retry_backoff=retry, fetch_timeout_ms=100)
    with caplog.at_level(logging.INFO, "disque_py"):
        await run_until(w, lambda: w.stats().dead == 1 and w.stats().in_flight == 0)
    failing = 'return order["missing"]  # the handler\'s failing line'
    assert kept[0] is None and failing in kept[1] and kept[1].endswith("KeyError: 'missing'\n")
    [dead] = c.get_jobs(queue + ".dead", nohang=True)
    trace = c.show(dead.id)["last-failure-trace"]
    assert trace.startswith("Traceback (most recent call last):\n") and failing in trace
    records = [r for r in caplog.records if jid in r.getMessage()]
    assert [(r.name, r.levelno) for r in records] == [("disque_py.worker", logging.WARNING),
                                                      ("disque_py.worker", logging.ERROR)]  # fmt: skip
    first, last = (r.getMessage() for r in records)
    assert first.startswith("job %s failed (attempt 1), again in 0.050 s: KeyError: 'missing'\nTraceback" % jid)
    assert last.startswith("job %s failed on its last attempt (attempt 2): KeyError: 'missing'\nTraceback" % jid)
    assert all(m.count(failing) == 1 and m.endswith("\nKeyError: 'missing'") for m in (first, last))
    c.ack(dead.id)


async def test_failures_that_are_hard_to_print_or_rejected(node, queue, caplog):
    """A message with a lone surrogate, an exception whose str() raises: sent and kept all the
    same; a Reject is a decision: no traceback, unless it was raised from an error."""
    c = Client(addr(node))
    bodies = [b"surrogate", b"unprintable", b"reject", b"reject-from"]
    c.add_jobs(queue, bodies)

    class Unprintable(Exception):
        def __str__(self):
            raise RuntimeError("no text")

    async def handler(job):
        if job.body == b"surrogate":
            raise ValueError("lone \ud800 <b>surrogate</b>")
        if job.body == b"unprintable":
            raise Unprintable()
        if job.body == b"reject":
            raise Reject("not for us")
        try:
            check_out({})
        except KeyError as exc:
            raise Reject("no such order") from exc

    w = Worker(addr(node), queue, handler, max_attempts=1, fetch_timeout_ms=100, backoff_after=1000)
    with caplog.at_level(logging.INFO, "disque_py"):
        stats = await run_until(w, lambda: w.stats().dead == 4 and w.stats().in_flight == 0)
    assert (stats.failed, stats.dead) == (4, 4)
    logged = [r.getMessage() for r in caplog.records if "surrogate" in r.getMessage()]
    assert len(logged) == 1 and "): ValueError: lone \\ud800 <b>surrogate</b>\nTraceback" in logged[0]
    logged[0].encode("utf-8")  # a log file that takes UTF-8 strictly keeps it
    letters = {d.body: c.show(d.id) for d in c.get_jobs(queue + ".dead", count=10, nohang=True)}
    assert sorted(letters) == sorted(bodies)
    surrogate = letters[b"surrogate"]
    assert surrogate["dead-letter-reason"] == "ValueError: lone \\ud800 <b>surrogate</b>"
    assert surrogate["last-failure-trace"].endswith("ValueError: lone \\ud800 <b>surrogate</b>\n")
    assert letters[b"unprintable"]["last-failure-trace"].endswith("Unprintable: <exception str() failed>\n")
    assert letters[b"reject"]["dead-letter-reason"] == "not for us" and "last-failure-trace" not in letters[b"reject"]
    assert letters[b"reject-from"]["last-failure-trace"].endswith("KeyError: 'missing'\n")  # its cause's
    c.ack(*[d["id"] for d in letters.values()])


async def test_a_jobs_own_maxdeliver_and_backoff_decide(node, queue):
    """A job with MAXDELIVER 2 and a BACKOFF of its own, under a worker that never gives up
    (max_attempts=None): retried (the worker sends no DELAY: its BACKOFF decides), and the failure of its
    2nd delivery makes the node dead-letter it into its DEADLETTER queue."""
    c = Client(addr(node))
    jid = c.add_job(queue, b"doomed", retry=5, backoff=(0.1, 0.2), maxdeliver=2, deadletter=queue + ".bad")
    seen = []

    async def handler(job):
        seen.append((job.attempt, job.last_delivery, job.last_nack_reason))
        raise KeyError(job.attempt)

    w = Worker(addr(node), queue, handler, max_attempts=None, fetch_timeout_ms=100)
    stats = await run_until(w, lambda: w.stats().dead == 1 and w.stats().in_flight == 0)
    assert seen == [(1, False, None), (2, True, "KeyError: 1")]
    assert (stats.failed, stats.retried, stats.dead) == (2, 1, 1)
    [dead] = c.get_jobs(queue + ".bad", timeout_ms=5000)
    assert (dead.dead_letter_of, dead.original_deliveries, dead.dead_letter_reason) == (jid, 2, "KeyError: 2")
    c.ack(dead.id)
    assert c.show(jid) is None


async def test_dead_letter_at_fetch_and_custom_handlers(node, queue):
    c = Client(addr(node))
    jid = c.add_job(queue, b"tired")
    for _ in range(3):  # failed three times somewhere else
        [job] = c.get_jobs(queue)
        c.nack(job.id)
    ran = []
    letters = []

    async def dead_letter(job, error):
        letters.append((job.id, job.attempt, error))

    w = Worker(addr(node), queue, ran.append, max_attempts=2, dead_letter=dead_letter, fetch_timeout_ms=100)
    await run_until(w, lambda: w.stats().dead == 1)
    assert ran == [] and letters == [(jid, 4, "attempt 4 > max_attempts 2")]
    wait_for(lambda: c.show(jid) is None, what="acknowledged")

    # a sync dead-letter handler that fails: the job is NACKed, not lost
    jid = c.add_job(queue, b"again")

    def broken(job, error):
        raise RuntimeError("dead letter store is down")

    # (backoff_after=1: the one job failing is "most recent jobs": the worker pauses for 60 s)
    w = Worker(addr(node), queue, lambda job: 1 / 0, max_attempts=1, dead_letter=broken, fetch_timeout_ms=100,
               backoff=Backoff(initial=60.0, maximum=60.0), backoff_after=1)  # fmt: skip
    # handler failed (pause), then the dead letter failed: NACKed
    await run_until(w, lambda: w.stats().backoffs == 1 and w.stats().retried >= 1 and w.stats().in_flight == 0)
    stats = w.stats()
    assert stats.dead == 0 and stats.retried >= 1 and stats.failed == 1 and stats.in_flight == 0
    # (a GETJOB already waiting when the backoff starts may still get the job once more)
    assert c.show(jid)["nacks"] == stats.retried and c.show(jid)["state"] == "queued"  # kept, not lost

    # dead_letter=None: dropped (acknowledged), nothing in <queue>.dead
    w = Worker(addr(node), queue, lambda job: 1 / 0, max_attempts=1, dead_letter=None, fetch_timeout_ms=100)
    await run_until(w, lambda: w.stats().dead == 1)
    wait_for(lambda: c.show(jid) is None, what="dropped")
    assert c.qlen(queue + ".dead") == 0


class Unprintable(Exception):
    def __str__(self):
        raise RuntimeError("str() fails")


class Hopeless(Exception):
    def __str__(self):
        raise RuntimeError("str() fails")

    def __repr__(self):
        raise RuntimeError("repr() fails")


class Custom(LookupError):
    pass


def misbehave(body: bytes):
    if body == b"value":
        raise ValueError("bad value")
    if body == b"custom":
        raise Custom("custom")
    if body == b"unprintable":
        raise Unprintable()
    if body == b"hopeless":
        raise Hopeless()
    if body == b"group":
        raise ExceptionGroup("several", [ValueError("a"), TypeError("b")])
    if body == b"\xff\xfe":
        return body.decode()  # UnicodeDecodeError
    return "a return value is ignored"


FAILING = [b"value", b"custom", b"unprintable", b"hopeless", b"group", b"\xff\xfe"]


@pytest.mark.parametrize("kind", ["async", "sync", "sync-returning-coroutine"])
async def test_handler_exceptions_of_every_kind(node, queue, kind):
    c = Client(addr(node))
    bodies = FAILING + [b"ok", b"ok too"]
    ids = dict(zip(c.add_jobs(queue, bodies), bodies))

    if kind == "async":

        async def handler(job):
            return misbehave(job.body)
    elif kind == "sync":

        def handler(job):
            return misbehave(job.body)
    else:

        async def later():
            pass

        def handler(job):  # a sync function returning an awaitable: a mistake, reported as a failure
            misbehave(job.body)
            return later()

    w = Worker(addr(node), queue, handler, concurrency=3, max_attempts=1, backoff_after=100, fetch_timeout_ms=100)
    stats = await run_until(w, lambda: w.stats().processed + w.stats().dead == 8)
    letters = {}
    wait_for(lambda: c.qlen(queue + ".dead") == stats.dead, what="dead letters queued")
    for job in c.get_jobs(queue + ".dead", count=20, nohang=True):
        assert job.dead_letter_of in ids and job.body == ids[job.dead_letter_of]
        letters[job.body] = job.dead_letter_reason
        c.ack(job.id)
    if kind == "sync-returning-coroutine":
        assert stats.processed == 0 and stats.dead == 8
        assert letters[b"ok"].startswith("TypeError: the handler returned an awaitable")
        return
    assert stats.processed == 2 and stats.dead == 6 and stats.failed == 6
    assert letters[b"value"] == "ValueError: bad value"
    assert letters[b"custom"] == "Custom: custom"
    assert letters[b"unprintable"].startswith("Unprintable: Unprintable(")
    assert letters[b"hopeless"] == "Hopeless: <unprintable Hopeless>"
    assert letters[b"group"].startswith("ExceptionGroup: several")
    assert letters[b"\xff\xfe"].startswith("UnicodeDecodeError:")
    assert all(c.show(i) is None for i in ids)


@pytest.mark.parametrize("kind", ["async", "sync"])
@pytest.mark.parametrize("fatal", [KeyboardInterrupt, SystemExit])
async def test_keyboard_interrupt_in_handler_stops_gracefully(node, queue, kind, fatal):
    c = Client(addr(node))
    [jid] = c.add_jobs(queue, [b"x"])

    if kind == "async":

        async def handler(job):
            raise fatal("from the handler")
    else:

        def handler(job):
            raise fatal("from the handler")

    w = Worker(addr(node), queue, handler, fetch_timeout_ms=100)
    with trio.fail_after(10):
        with pytest.raises(fatal, match="^from the handler$"):  # the handler's own exception
            await w.run()
    assert w.stats().failed == 1 and w.stats().in_flight == 0
    info = c.show(jid)
    # handed back, not lost (a GETJOB already waiting may have fetched it once more: NACKed again)
    assert info["state"] == "queued" and info["nacks"] >= 1


async def test_graceful_shutdown_with_jobs_in_hand(node, queue):
    c = Client(addr(node))
    ids = c.add_jobs(queue, [b"finishes", b"hangs", b"buffered-1", b"buffered-2", b"never-fetched-1",
                             b"never-fetched-2"])  # fmt: skip
    started: list[bytes] = []
    release = trio.Event()

    async def handler(job):
        started.append(job.body)
        if job.body == b"finishes":
            await release.wait()
        else:
            await trio.sleep_forever()

    w = Worker(addr(node), queue, handler, concurrency=2, max_in_flight=4, grace_period=0.5, fetch_timeout_ms=100)
    with trio.fail_after(10):
        async with trio.open_nursery() as nursery:
            nursery.start_soon(w.run)
            while not (len(started) == 2 and w.stats().in_flight == 4):
                await trio.sleep(0.005)
            w.stop()
            await trio.sleep(0)
            release.set()  # finishes inside the grace period
    stats = w.stats()
    assert (stats.processed, stats.retried, stats.released, stats.failed, stats.in_flight) == (1, 1, 2, 0, 0)
    assert "retried=1 dead=0 released=2 fetched=4" in str(stats)
    states = {body: c.show(i) for i, body in zip(ids, [b"finishes", b"hangs", b"buffered-1", b"buffered-2",
                                                       b"never-fetched-1", b"never-fetched-2"])}  # fmt: skip
    assert states[b"finishes"] is None  # acknowledged
    # cut short by the end of the grace period: NACKed, its delivery counts, the reason says why
    assert states[b"hangs"]["state"] == "queued" and states[b"hangs"]["nacks"] == 1
    assert states[b"hangs"]["last-nack-reason"].startswith("WorkerStopped: ")
    for body in (b"buffered-1", b"buffered-2"):  # never started: given back, nothing counted
        info = states[body]
        assert info["state"] == "queued" and info["nacks"] == 0 and info["returns"] == 1, body
        assert info["additional-deliveries"] == 0 and info["deliveries"] == 0, body
    for body in (b"never-fetched-1", b"never-fetched-2"):
        assert states[body]["state"] == "queued" and states[body]["nacks"] == 0
    assert sorted(started) == [b"finishes", b"hangs"]


@pytest.mark.parametrize("kind", ["async", "sync"])
async def test_a_stop_gives_back_the_jobs_not_started_without_using_an_attempt(node, queue, kind):
    """Worker.stop() with one job running and three buffered, every job with MAXDELIVER 1 (a task
    with retries=0): the three go back with RELEASE, queued again at once with no nack and their
    delivery not counted, so none is dead-lettered; the next worker gets each on its first
    counted delivery. Async handlers (the trio runners) and plain functions (the handler threads)."""
    c = Client(addr(node))
    ids = c.add_jobs(queue, [b"%d" % i for i in range(6)], retry=60, maxdeliver=1)
    entered, go = threading.Event(), threading.Event()
    handled: list[str] = []

    if kind == "async":

        async def handler(job):
            handled.append(job.id)
            entered.set()
            await trio.to_thread.run_sync(go.wait, 10)
    else:

        def handler(job):
            handled.append(job.id)
            entered.set()
            go.wait(10)

    w = Worker(addr(node), queue, handler, concurrency=1, max_in_flight=4, grace_period=10, fetch_timeout_ms=100)
    with trio.fail_after(20):
        async with trio.open_nursery() as nursery:
            nursery.start_soon(w.run)
            await trio.to_thread.run_sync(entered.wait, 10)
            while w.stats().in_flight < 4:
                await trio.sleep(0.005)
            w.stop()
            go.set()  # the running handler finishes within the grace period
    stats = w.stats()
    assert (stats.processed, stats.released, stats.retried, stats.failed, stats.dead) == (1, 3, 0, 0, 0)
    assert stats.in_flight == 0 and "dead=0 released=3 fetched=4" in str(stats)
    [done] = handled
    states = {job_id: c.show(job_id) for job_id in ids if job_id != done}
    given_back = [job_id for job_id, info in states.items() if info.get("returns")]
    assert len(given_back) == 3, states
    for job_id, info in states.items():
        assert info["state"] == "queued" and info["nacks"] == 0 and info["additional-deliveries"] == 0, info
        assert info["deliveries"] == 0 and info.get("returns", 0) == (1 if job_id in given_back else 0), info
    assert c.qlen(queue + ".dead") == 0

    # the next worker: each job on its first counted delivery, done once, and no dead letter
    seen: list[Job] = []

    if kind == "async":

        async def record(job):
            seen.append(job)
    else:

        def record(job):
            seen.append(job)

    w2 = Worker(addr(node), queue, record, fetch_timeout_ms=100)
    stats = await run_until(w2, lambda: w2.stats().processed == 5)
    assert sorted(j.id for j in seen) == sorted(states) and all(j.deliveries == 1 and j.attempt == 1 for j in seen)
    assert stats.released == 0 and c.qlen(queue + ".dead") == 0 and all(c.show(i) is None for i in states)


async def test_a_job_given_back_goes_to_the_node_that_delivered_it(make_cluster, queue):
    """Jobs fetched from node A (held there only: REPLICATE 1), then the worker's client moves to B
    (A leaves the cluster): at the stop, the RELEASE goes to A, where the jobs are."""
    a, b = make_cluster(2)
    c = Client(addr(a))
    ids = c.add_jobs(queue, [b"%d" % i for i in range(4)], replicate=1, retry=60, maxdeliver=1)
    go = trio.Event()
    handled: list[str] = []

    async def handler(job):
        handled.append(job.id)
        await go.wait()

    client = AioClient(addr(a), refresh_interval=0.1)
    w = Worker(client, queue, handler, concurrency=1, max_in_flight=4, beacon_interval=0.1, fetch_timeout_ms=100)
    try:
        with trio.fail_after(20):
            async with trio.open_nursery() as nursery:
                nursery.start_soon(w.run)
                while not (handled and w.stats().in_flight == 4):
                    await trio.sleep(0.005)
                raw(a).execute_command("CLUSTER", "LEAVING", "yes")
                while client.current_address is None or client.current_address[1] != b.port:
                    await trio.sleep(0.02)  # the beats' next HELLO moves it away from the leaving node
                w.stop()
                go.set()
    finally:
        await client.aclose()
    assert w.stats().released == 3 and w.stats().ack_errors == 0
    for job_id in ids[1:]:
        info = c.show(job_id)  # on A, the only holder
        assert (info["state"], info["nacks"], info.get("returns"), info["deliveries"]) == ("queued", 0, 1, 0), info
    assert "cmdstat_release" in raw(a).info("commandstats") and "cmdstat_release" not in raw(b).info("commandstats")


def test_the_worker_tells_an_unknown_command_from_other_refusals(node):
    """What a node without RELEASE answers (a real node, asked a command it lacks) is what makes the
    worker fall back to ENQUEUE; a RELEASE refused for its input is not that."""
    c = Client(addr(node))
    with pytest.raises(CommandError) as unknown:
        c.execute("RELEASEX", "D-01234567-AAAAAAAAAAAAAAAAAAAAAAAA-05a1")
    assert unknown_command(unknown.value)
    with pytest.raises(BadIdError) as refused:
        c.release("not-an-id")
    assert not unknown_command(refused.value)


async def test_graceful_shutdown_abandons_a_stuck_thread(node, queue):
    c = Client(addr(node))
    [jid] = c.add_jobs(queue, [b"stuck"])
    entered = threading.Event()
    unblock = threading.Event()

    def handler(job):
        entered.set()
        unblock.wait(10)

    w = Worker(addr(node), queue, handler, grace_period=0.2, fetch_timeout_ms=100)
    try:
        with trio.fail_after(10):
            async with trio.open_nursery() as nursery:
                nursery.start_soon(w.run)
                await trio.to_thread.run_sync(entered.wait, 5)
                w.stop()
        assert c.show(jid)["nacks"] == 1 and w.stats().retried == 1 and w.stats().running == 0
        assert len(handler_threads()) == 1  # the abandoned one, still in the handler
    finally:
        unblock.set()
    wait_for(lambda: handler_threads() == [], what="the abandoned thread to exit once its handler returned")
    assert w.stats().processed == 0  # its late success is not reported: the job was handed back


async def test_stop_from_a_handler_thread_and_starved(node, queue):
    Client(addr(node)).add_jobs(queue, [b"1", b"2", b"3"])
    seen = []

    def handler(job):
        worker = current_worker()
        seen.append(worker.starved())
        if len(seen) == 3:
            worker.stop()  # from a worker thread

    w = Worker(addr(node), queue, handler, max_in_flight=10, fetch_timeout_ms=100)
    with trio.fail_after(10):
        await w.run()
    # one GETJOB COUNT 10 got all three: not starved until the local buffer is empty
    assert seen == [False, False, True]
    assert w.stats().starved and w.stats().processed == 3


async def test_heartbeat_and_fast_ack(node, queue):
    c = Client(addr(node))
    [jid] = c.add_jobs(queue, [b"long"], retry=1)
    client = AioClient(addr(node))
    calls = {"working": 0, "fast_ack": 0}
    original_working, original_fast_ack = client.working, client.fast_ack

    async def working(job_id):
        calls["working"] += 1
        return await original_working(job_id)

    async def fast_ack(*ids):
        calls["fast_ack"] += 1
        return await original_fast_ack(*ids)

    original_pipeline = client.pipeline

    async def pipeline(batch):  # outcomes usually travel with the next GETJOB
        for call in batch:
            if call.argv[0] in (b"FASTACK", b"ACKJOB"):
                key = "fast_ack" if call.argv[0] == b"FASTACK" else "ackjob"
                calls[key] = calls.get(key, 0) + 1
        return await original_pipeline(batch)

    client.working, client.fast_ack, client.pipeline = working, fast_ack, pipeline
    seen = []

    async def handler(job):
        # Busy for twice the job's RETRY (1 s), looking at the job on the node all along:
        # without the heartbeats the node requeues it at about 1 s, well before the end.
        end = trio.current_time() + 2.0
        while trio.current_time() < end:
            seen.append(await client.show(job.id))
            await trio.sleep(0.05)

    w = Worker(client, queue, handler, heartbeat=0.2, fast_ack=True, fetch_timeout_ms=100)
    await run_until(w, lambda: w.stats().processed == 1, timeout=15)
    assert len(seen) > 1
    assert all(s["state"] == "active" and s["additional-deliveries"] == 0 for s in seen), seen
    assert calls["working"] >= 3 and calls["fast_ack"] == 1 and "ackjob" not in calls
    assert c.show(jid) is None and w.stats().fetched == 1


async def test_sync_handlers_run_in_threads_that_exit_on_stop(node, queue):
    ids = Client(addr(node)).add_jobs(queue, [b"%d" % i for i in range(40)])
    names = set()

    def handler(job):
        names.add(threading.current_thread().name)

    w = Worker(addr(node), queue, handler, concurrency=3, fetch_timeout_ms=100)
    stats = await run_until(w, lambda: w.stats().processed == 40)
    assert stats.processed == 40 and stats.running == 0 and stats.in_flight == 0
    assert names and names <= {"disque-py-handler-%d" % i for i in range(3)}  # never the trio thread
    assert handler_threads() == []  # run() returned: its threads are gone
    assert all(show(node, i) is None for i in ids)


async def test_a_slow_sync_handler_blocks_neither_other_jobs_nor_heartbeats(node, queue):
    c = Client(addr(node))
    [slow_id] = c.add_jobs(queue, [b"slow"], retry=1)
    fast_ids = c.add_jobs(queue, [b"fast-%d" % i for i in range(6)])
    client = AioClient(addr(node))
    beats: list[str] = []
    original_working = client.working

    async def working(job_id):
        beats.append(job_id)
        return await original_working(job_id)

    client.working = working
    release = threading.Event()
    during_slow: list[WorkerStats] = []

    def handler(job):
        if job.body == b"slow":
            assert release.wait(10), "never released"
            return
        time.sleep(0.001)

    w = Worker(client, queue, handler, concurrency=2, heartbeat=0.1, fetch_timeout_ms=100)
    with trio.fail_after(15):
        async with trio.open_nursery() as nursery:
            nursery.start_soon(w.run)
            # the fast jobs finish on the other thread, and the trio thread keeps
            # sending WORKING for the slow one, while its handler blocks
            while not (w.stats().processed == 6 and w.stats().in_flight == 1 and beats.count(slow_id) >= 3):
                await trio.sleep(0.005)
            during_slow.append(w.stats())
            release.set()
            while w.stats().processed < 7:
                await trio.sleep(0.005)
            w.stop()
    assert during_slow[0].running == 1  # the slow one, still in its thread
    stats = w.stats()
    assert stats.processed == 7 and stats.failed == 0 and stats.in_flight == 0
    assert c.show(slow_id) is None and all(c.show(i) is None for i in fast_ids)
    assert handler_threads() == []


async def test_worker_from_sync_client_and_validation(node, queue):
    Client(addr(node)).add_jobs(queue, [b"x"])
    got = []
    w = Worker(Client(addr(node)), [queue], got.append, fetch_timeout_ms=100)
    assert isinstance(w.client, AioClient)
    await run_until(w, lambda: len(got) == 1)
    for bad, reason in ((dict(concurrency=0), r"concurrency must be >= 1"),
                        (dict(concurrency=4, max_in_flight=2), r"max_in_flight \(2\) must be >= concurrency \(4\)"),
                        (dict(max_attempts=0), r"max_attempts must be >= 1"),
                        (dict(fetch_timeout_ms=0), r"fetch_timeout_ms must be >= 1")):  # fmt: skip
        with pytest.raises(ValueError, match=reason):
            Worker(addr(node), queue, got.append, **bad)
    with pytest.raises(ValueError, match="at least one queue is needed"):
        Worker(addr(node), [], got.append)
    with pytest.raises(RuntimeError, match="outside a worker handler"):
        current_worker()
    assert describe_error(KeyboardInterrupt()) == "KeyboardInterrupt"


# ---------------------------------------------------------------- virtual time


class FakeClient:
    """Serves an endless queue of fresh jobs; records when GETJOB was called (trio time)."""

    def __init__(self) -> None:
        self.fetches: list[tuple[float, int]] = []
        self.acked: list[str] = []
        self.nacked: list[str] = []
        self.released: list[str] = []  # given back (RELEASE): fetched, never started
        self.ack_times: list[float] = []
        self.n = 0

    async def get_jobs(self, *queues, count, timeout_ms, with_counters):
        await trio.sleep(0)
        self.fetches.append((trio.current_time(), count))
        jobs = []
        for _ in range(count):
            self.n += 1
            jobs.append(Job(queues[0], "D-00000000-%024d-05a1" % self.n, b"%d" % self.n))
        return jobs

    async def ack(self, *ids):
        await trio.sleep(0)
        self.acked += ids
        self.ack_times += [trio.current_time()] * len(ids)
        return len(ids)

    fast_ack = ack

    async def nack(self, *ids):
        await trio.sleep(0)
        self.nacked += ids
        return len(ids)

    async def release(self, *ids):
        await trio.sleep(0)
        self.released += ids
        return len(ids)

    async def pipeline(self, calls):
        """ACKJOB/FASTACK/NACK ... then GETJOB NOHANG, as the worker sends them."""
        results = []
        for call in calls:
            name = call.argv[0]
            if name == b"GETJOB":
                count = call.argv[call.argv.index(b"COUNT") + 1] if b"COUNT" in call.argv else 1
                results.append(await self.get_jobs("q", count=count, timeout_ms=None, with_counters=True))
            elif name == b"NACK":  # NACK id... [DELAY s] [REASON text] [DEAD]: the IDs
                ids = [a.decode() for a in call.argv[1:] if isinstance(a, bytes) and a.startswith(b"D-")]
                results.append(await self.nack(*ids))
            else:
                results.append(await self.ack(*[a.decode() for a in call.argv[1:]]))
        return results


@pytest.mark.parametrize("jitter", [0.0, 0.5])
async def test_failure_backoff_on_mock_clock(autojump_clock, jitter):
    fake = FakeClient()
    outcomes = iter([False] * 6 + [True] * 5)  # six failures, then it works

    async def handler(job):
        if not next(outcomes):
            raise RuntimeError("downstream is down")
        if w.stats().processed == 4:
            w.stop()

    backoff = Backoff(initial=1.0, maximum=3.0, factor=2.0, jitter=jitter)
    w = Worker(fake, "q", handler, max_in_flight=1, max_attempts=None, backoff=backoff, backoff_after=3,
               rng=random.Random(42))  # fmt: skip
    await w.run()
    times = [t for t, _ in fake.fetches]
    counts = [n for _, n in fake.fetches]
    # three failures at once, then a pause, a probe (failing: longer pause), ...
    times = [t - times[0] for t in times]
    assert times[:3] == [0, 0, 0]
    gaps = [b - a for a, b in zip(times[2:6], times[3:7])]
    expected = [backoff.base(k) for k in range(4)]  # 1, 2, 3 (capped), then full speed again
    for gap, base in zip(gaps, expected):
        assert base * (1 - jitter) - 1e-9 <= gap <= base + 1e-9
    if jitter == 0:
        assert gaps[:3] == pytest.approx([1.0, 2.0, 3.0])
    assert counts[3:7] == [1, 1, 1, 1]  # probes fetch one job
    assert times[7:] == [times[6]] * len(times[7:])  # back to full speed after a success
    assert w.stats().backoffs == 4 and w.stats().failed == 6 and len(fake.nacked) == 6


async def test_fetch_count_is_bounded_by_free_slots(autojump_clock):
    fake = FakeClient()
    done = 0

    async def handler(job):
        nonlocal done
        await trio.sleep(1)
        done += 1
        if done == 20:
            finished.append(trio.current_time())
            w.stop()

    finished = []
    w = Worker(fake, "q", handler, concurrency=2, max_in_flight=5)
    start = trio.current_time()
    await w.run()
    assert fake.fetches[0][1] == 5 and all(1 <= n <= 5 for _, n in fake.fetches)
    assert len(fake.acked) + len(fake.nacked) + len(fake.released) == fake.n  # every fetched job answered
    # 20 jobs of 1 s on 2 runners: 10 s, no runner ever idle waiting for a fetch
    assert finished[0] - start == pytest.approx(10.0)


async def test_an_ack_does_not_wait_for_a_batch_behind_long_jobs(autojump_clock):
    """Outcomes travel in batches, but a lone ACK behind long handlers goes out within OUTCOME_LINGER."""
    fake = FakeClient()
    start = trio.current_time()

    async def handler(job):
        await trio.sleep(0.1 if job.body == b"1" else 100)

    w = Worker(fake, "q", handler, concurrency=2, max_in_flight=4)
    async with trio.open_nursery() as nursery:
        nursery.start_soon(w.run)
        while not fake.acked:
            await trio.sleep(0.001)
        w.stop(grace_period=0)
    assert fake.acked[0].endswith("%024d-05a1" % 1)
    assert fake.ack_times[0] - start == pytest.approx(0.1, abs=0.01)


async def test_a_paused_async_handler_lets_other_runners_take_the_next_jobs():
    """With quick handlers one runner works through a batch; when a handler pauses, another runner goes on."""
    fake = FakeClient()
    release = trio.Event()
    done: list[bytes] = []
    quick_tasks, tasks = set(), set()

    async def handler(job):
        tasks.add(trio.lowlevel.current_task())
        if int(job.body) < 30:
            quick_tasks.add(trio.lowlevel.current_task())
        elif job.body == b"30":
            await release.wait()  # until eight later jobs are done by another runner
        done.append(job.body)
        if len(done) == 37:
            release.set()
        if len(done) == 50:
            w.stop()

    w = Worker(fake, "q", handler, concurrency=3, max_in_flight=10)
    with trio.fail_after(10):
        await w.run()
    assert len(quick_tasks) == 1  # handlers that never pause: all in one runner
    assert done.index(b"30") >= 37 and len(done) >= 50 and len(tasks) >= 2
    assert len(fake.acked) + len(fake.nacked) + len(fake.released) == fake.n


async def test_idle_handler_threads_take_jobs_left_behind_a_busy_one():
    """A thread stuck in a handler: the jobs buffered behind it go to the idle threads (HELPER_DELAY)."""
    fake = FakeClient()
    release = threading.Event()
    done: list[bytes] = []
    lock = threading.Lock()
    names = set()

    def handler(job):
        names.add(threading.current_thread().name)
        if job.body == b"1":
            assert release.wait(10), "never released"
        with lock:
            done.append(job.body)
            if len(done) == 8:
                release.set()
            if len(done) == 30:
                current_worker().stop()

    w = Worker(fake, "q", handler, concurrency=3, max_in_flight=10)
    with trio.fail_after(10):
        stats = await w.run()
    assert done.index(b"1") >= 8 and len(done) >= 30 and len(names) >= 2
    assert stats.processed == len(done) and stats.running == 0 and stats.in_flight == 0
    assert len(fake.acked) + len(fake.nacked) + len(fake.released) == fake.n
    assert handler_threads() == []


async def test_sync_handler_outcomes_travel_in_batches():
    """Many quick sync handlers: outcomes reach the node in batches, not one by one."""
    fake = FakeClient()
    calls: list[int] = []
    original = fake.pipeline

    async def pipeline(batch):
        calls.append(sum(len(c.argv) - 1 for c in batch[:-1]))
        return await original(batch)

    fake.pipeline = pipeline

    def handler(job):
        if int(job.body) == 2000:
            current_worker().stop()

    w = Worker(fake, "q", handler, concurrency=4)
    with trio.fail_after(20):
        stats = await w.run()
    assert stats.processed >= 2000 and len(fake.acked) + len(fake.nacked) + len(fake.released) == fake.n
    assert sum(calls) / len(calls) > 2  # the average exchange carries several outcomes


# ---------------------------------------------------------------- CLI


def test_cli_worker_sigterm_finishes_the_job_in_hand(node, queue, tmp_path):
    (tmp_path / "handlers.py").write_text(
        textwrap.dedent("""
        import os, time
        def slow(job):
            with open(os.environ["MARKS"], "a") as f:
                f.write(job.body.decode() + "\\n")
            time.sleep(0.3)
    """)
    )
    marks = tmp_path / "marks.txt"
    c = Client(addr(node))
    ids = c.add_jobs(queue, [b"j%d" % i for i in range(5)])
    env = dict(os.environ, MARKS=str(marks), PYTHONPATH=str(ROOT))
    proc = subprocess.Popen(
        [sys.executable, "-m", "disque_py.cli", "worker", "handlers:slow", "--queue", queue,
         "--nodes", addr(node), "--max-in-flight", "2", "--fetch-timeout", "100", "--grace-period", "5"],
        cwd=str(tmp_path), env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
    )  # fmt: skip
    try:
        wait_for(lambda: marks.exists() and marks.read_text().count("\n") >= 1, timeout=15, what="first job started")
        proc.send_signal(signal.SIGTERM)
        out, _ = proc.communicate(timeout=15)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 0, out.decode()
    text = out.decode()
    assert "worker stopped" in text and "stopping" in text
    done = marks.read_text().split()
    states = [c.show(i) for i in ids]
    finished = [s for s in states if s is None]
    assert len(finished) == len(done)  # the job in hand finished (and was ACKed)
    nacked = [s for s in states if s is not None and s["nacks"] == 1]
    assert len(nacked) <= 1 and all(s["state"] == "queued" for s in states if s is not None)


def test_cli_worker_bad_handler(tmp_path):
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    for spec, message in (("nomodule_xyz:f", "cannot import"), ("os:nope", "has no attribute"),
                          ("os", "MODULE:FUNCTION"), ("os:sep", "not callable")):  # fmt: skip
        proc = subprocess.run([sys.executable, "-m", "disque_py.cli", "worker", spec, "-q", "q"], cwd=str(tmp_path),
                              env=env, capture_output=True, timeout=30)  # fmt: skip
        assert proc.returncode == 2 and message in proc.stderr.decode(), proc.stderr


def test_cli_worker_poison_jobs_are_retried_apart_and_dead_lettered_by_the_node(node, queue, tmp_path):
    """Issue 46's scenario: 190 good jobs and 10 that always fail, RETRY 2, `disque-py worker
    --max-attempts 3`. The good ones are all done while the poison ones are still being retried
    (each with its own NACK DELAY, nobody waits for them: no consumer-wide pause), and every
    poison job ends in <queue>.dead, kept by the node, with its SHOW naming the original."""
    (tmp_path / "handlers.py").write_text(
        textwrap.dedent("""
        import os, time
        def work(job):
            body = job.body.decode()
            with open(os.environ["MARKS"], "a") as f:
                f.write("%s %s %d %.6f\\n" % ("fail" if body.startswith("poison") else "done",
                                              body, job.attempt, time.time()))
            if body.startswith("poison"):
                raise RuntimeError("cannot handle " + body)
    """)
    )
    marks = tmp_path / "marks.txt"
    c = Client(addr(node))
    bodies = ["poison-%d" % i if i % 20 == 7 else "good-%d" % i for i in range(200)]
    ids = dict(zip(c.add_jobs(queue, bodies, retry=2), bodies))
    poison = {i: b for i, b in ids.items() if b.startswith("poison")}
    assert len(poison) == 10
    env = dict(os.environ, MARKS=str(marks), PYTHONPATH=str(ROOT))
    proc = subprocess.Popen(
        [sys.executable, "-m", "disque_py.cli", "worker", "handlers:work", "--queue", queue,
         "--nodes", addr(node), "--max-attempts", "3", "--fetch-timeout", "100"],
        cwd=str(tmp_path), env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
    )  # fmt: skip

    def lines() -> list[list[str]]:
        return [line.split() for line in marks.read_text().splitlines()] if marks.exists() else []

    try:
        wait_for(lambda: sum(m[0] == "done" for m in lines()) >= 190 and c.qlen(queue + ".dead") >= 10,
                 timeout=60, interval=0.1, what="190 good jobs done and 10 poison jobs dead-lettered")  # fmt: skip
        proc.send_signal(signal.SIGTERM)
        out, _ = proc.communicate(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
    text = out.decode()
    assert proc.returncode == 0, text
    marked = lines()
    done = [m for m in marked if m[0] == "done"]
    failed = [m for m in marked if m[0] == "fail"]
    assert sorted(m[1] for m in done) == sorted(b for b in bodies if b.startswith("good"))  # each once
    # each poison job ran exactly 3 times (attempts 1, 2, 3), then never again
    assert sorted((m[1], int(m[2])) for m in failed) == sorted((b, a) for b in poison.values() for a in (1, 2, 3))
    # retried apart: each poison job waited for its NACK DELAY (1 s, then 2 s, jittered by <= 25 %)
    for body in poison.values():
        times = sorted(float(m[3]) for m in failed if m[1] == body)
        assert times[1] - times[0] >= 0.75 - 0.05 and times[2] - times[1] >= 1.5 - 0.05, (body, times)
    # the good jobs did not wait for them: all done before the poison jobs' last attempts
    last_good = max(float(m[3]) for m in done)
    last_poison = max(float(m[3]) for m in failed)
    assert last_good < last_poison
    assert "fetching paused" not in text, text  # a few poison jobs never pause the consumer
    assert "processed=190" in text and "dead=10" in text, text
    # dead letters kept by the node: in <queue>.dead, naming their original; originals gone
    letters = c.get_jobs(queue + ".dead", count=20, nohang=True)
    assert sorted(j.dead_letter_of for j in letters) == sorted(poison)
    for job in letters:
        shown = c.show(job.id)
        assert shown["dead-letter-of"] == job.dead_letter_of and shown["original-queue"] == queue
        assert shown["body"] == poison[job.dead_letter_of].encode()
        assert shown["dead-letter-reason"] == "RuntimeError: cannot handle " + poison[job.dead_letter_of]
        assert c.show(job.dead_letter_of) is None
        c.ack(job.id)
    assert all(c.show(i) is None for i in ids)


class DisqueLikeClient(FakeClient):
    """A node that knows only Disque's NACK: it takes DELAY/REASON/DEAD for job IDs (-BADID)."""

    def __init__(self) -> None:
        super().__init__()
        self.refused: list[tuple] = []
        self.added: list[tuple[str, bytes]] = []

    async def add_job(self, queue, body, **opts):
        await trio.sleep(0)
        self.added.append((queue, body))
        return "D-00000000-%024d-05a1" % (10**6 + len(self.added))

    async def pipeline(self, calls):
        results = []
        for call in calls:
            if call.argv[0] == b"NACK" and any(not a.startswith(b"D-") for a in call.argv[1:]):
                self.refused.append(call.argv)
                results.append(BadIdError("Invalid Job ID format."))
            else:
                results += await super().pipeline([call])
        return results


class OlderNodeClient(FakeClient):
    """A disque-py node from before NACK's TRACE: its other options taken, TRACE refused."""

    def __init__(self) -> None:
        super().__init__()
        self.nacks: list[tuple] = []

    async def pipeline(self, calls):
        results = []
        for call in calls:
            if call.argv[0] == b"NACK":
                self.nacks.append(call.argv)
                if b"TRACE" in call.argv:
                    results.append(error_from_reply("ERR syntax error near 'TRACE'"))
                    continue
            results += await super().pipeline([call])
        return results


async def test_a_node_without_nacks_trace_gets_the_nacks_without_it(autojump_clock):
    fake = OlderNodeClient()

    async def handler(job):
        if len(fake.nacks) >= 4:
            w.stop()
        raise ValueError("bad %s" % job.body.decode())

    w = Worker(fake, "q", handler, max_in_flight=1, max_attempts=None, backoff_after=1000)
    with trio.fail_after(60):
        stats = await w.run()
    first, again, *rest = fake.nacks
    at = first.index(b"TRACE")
    assert first[at + 1].endswith(b"ValueError: bad 1\n") and again == first[:at] + first[at + 2:]
    assert rest and all(b"TRACE" not in argv and b"DELAY" in argv and b"REASON" in argv for argv in rest)
    assert stats.ack_errors == 0 and stats.retried == stats.failed and "D-00000000-%024d-05a1" % 1 in fake.nacked


async def test_a_node_without_nack_options_gets_plain_nacks_and_worker_dead_letters(autojump_clock):
    fake = DisqueLikeClient()

    async def handler(job):
        if len(fake.added) >= 3:
            w.stop()
        raise ValueError("bad %s" % job.body.decode())

    w = Worker(fake, "q", handler, max_in_flight=1, max_attempts=1, backoff_after=1000)
    with trio.fail_after(60):
        stats = await w.run()
    # the first dead letter (NACK DEAD) was refused: NACKed plainly, nothing lost
    first = "D-00000000-%024d-05a1" % 1
    assert fake.refused[0][:2] == (b"NACK", first.encode()) and b"DEAD" in fake.refused[0]
    assert len(fake.refused) == 1 and first in fake.nacked
    # from then on the worker writes the dead letters itself, as before NACK DEAD existed
    letters = [DeadLetter.parse(body) for queue, body in fake.added]
    assert all(queue == "q.dead" for queue, _ in fake.added) and len(letters) >= 3
    assert [letter.id for letter in letters] == ["D-00000000-%024d-05a1" % n for n in range(2, 2 + len(letters))]
    assert letters[0].error == "ValueError: bad 2" and letters[0].body == b"2"
    assert letters[0].traceback.startswith("Traceback (most recent call last):\n")
    assert letters[0].traceback.endswith('raise ValueError("bad %s" % job.body.decode())\nValueError: bad 2\n')
    assert stats.dead == len(letters) and stats.ack_errors == 1
