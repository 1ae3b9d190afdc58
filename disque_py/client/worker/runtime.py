"""The Worker: the stages wired together, their tasks in one trio run, and what a user calls.

``Worker(...)`` builds one of each stage from its :class:`~.settings.WorkerSettings` and hands
each the others it calls; :meth:`Worker.run` starts their tasks: the acker, the beacon (the
worker's beats to the cluster) and the stop's grace timer (and signal receiver) around the
work, and in the handlers' nursery the fetcher with the runners (``async def`` handlers) or the
handler threads and their collector (plain functions). When the fetcher is done and the
handlers have finished (or were cancelled at the end of the grace period), the jobs left are
given back, the acker sends the last outcomes and returns, and the beacon says WORKER FORGET.
"""

from __future__ import annotations

import contextvars
import functools
import logging
import random
from collections import deque
from collections.abc import Sequence
from typing import Any

import trio

from ..aio import Client as AioClient
from ..model import Job
from ..sync import Client as SyncClient
from .acks import Acks
from .beacon import Beacon, handler_name, make_worker_id, worker_client_name
from .control import Control
from .direct import DIRECT_FETCH
from .fetch import Fetcher
from .handlers import Handler, is_async_callable
from .keepalive import Keepalive
from .outcome import Outcomes
from .pause import FailureGate
from .runners import Runners
from .settings import WorkerSettings
from .stats import Counters, WorkerStats
from .stop import Stop
from .threads import HandlerThreads
from .wakeup import Wakeup

__all__ = ["Worker", "current_worker"]

log = logging.getLogger("disque_py.worker")

_current_worker: contextvars.ContextVar["Worker"] = contextvars.ContextVar("disque_py_worker")


def current_worker() -> "Worker":
    """The worker running the current handler (threads included)."""
    try:
        return _current_worker.get()
    except LookupError:
        raise RuntimeError("current_worker() called outside a worker handler") from None


class Worker:
    """Runs ``handler(job)`` for jobs from ``queues``; see :mod:`disque_py.client.worker`.

    ``client_or_seeds``: a :class:`disque_py.aio.Client` (used as is, not
    closed), a :class:`disque_py.Client` (its settings are copied into a
    trio client), or seeds (``"host:port"``, a list of them; ``password``
    applies) for a new trio client.

    ``settings``: a :class:`~.settings.WorkerSettings`; ``options``: any of its fields as
    keywords (``concurrency=4, max_attempts=3, ...``), which replace the settings' own.

    ``id``: the worker's ID in the cluster's list (``host:pid:random``, one per worker). A client
    the worker makes names its connections ``disque-py-worker:<host>:<pid>`` (``CLIENT LIST``),
    unless the blocking client it copies has a ``client_name``; a trio client handed over keeps
    its own.
    """

    def __init__(self, client_or_seeds: Any, queues: str | Sequence[str], handler: Handler,
                 settings: WorkerSettings | None = None, *, password: str | None = None,
                 **options: Any) -> None:  # fmt: skip
        settings = self.settings = WorkerSettings.of(settings, options)
        self.queues = [queues] if isinstance(queues, (str, bytes)) else list(queues)
        if not self.queues:
            raise ValueError("at least one queue is needed")
        self.handler = handler
        self.id = make_worker_id()
        self._owns_client = False
        if isinstance(client_or_seeds, AioClient) or (
            not isinstance(client_or_seeds, SyncClient) and hasattr(client_or_seeds, "get_jobs")
        ):
            self.client = client_or_seeds
        elif isinstance(client_or_seeds, SyncClient):
            config = client_or_seeds.config
            self.client = AioClient.from_config(config, client_name=config.client_name or worker_client_name())
            self._owns_client = True
        else:
            self.client = AioClient(client_or_seeds, password=password, client_name=worker_client_name())
            self._owns_client = True
        client = self.client

        rng = settings.rng or random.Random()
        max_in_flight = settings.in_flight_limit
        buffer: deque[Job] = deque()  # fetched, not started
        counters = self._counters = Counters()
        fetch_wake = Wakeup()  # outcomes, free slots, gate or stop: for the fetcher
        gate = self._gate = FailureGate(settings.pause_backoff, settings.backoff_after, rng, settings.backoff_ratio)
        acks = self._acks = Acks(client, counters, buffer, max_in_flight=max_in_flight, fast_ack=settings.fast_ack,
                                 fetch_wake=fetch_wake)  # fmt: skip
        stop = self._stop = Stop(settings.grace_period, counters, acks, gate, buffer, fetch_wake)
        fetcher = self._fetcher = Fetcher(
            client, self.queues, max_in_flight=max_in_flight, fetch_timeout_ms=settings.fetch_timeout_ms,
            counters=counters, acks=acks, gate=gate, stop=stop, buffer=buffer, wake=fetch_wake, rng=rng,
        )  # fmt: skip
        outcomes = Outcomes(settings, client, counters, acks, gate, stop, fetch_wake, self._spawn, rng)
        keepalive = Keepalive(client, settings.heartbeat, self._spawn)
        self._buffer = buffer
        self._nursery: trio.Nursery | None = None
        self._runners: Runners | None = None
        self._threads: HandlerThreads | None = None
        # the beats to the cluster (beacon.py): on unless turned off, or the client cannot send them
        # (a test's stand-in)
        beacon = self._beacon = None
        if settings.beacon_interval and hasattr(client, "worker_beat"):
            beacon = self._beacon = Beacon(
                client, self.id, settings.beacon_interval, queues=self.queues, concurrency=settings.concurrency,
                max_in_flight=max_in_flight, handler=handler_name(handler), stats=self.stats,
                stopping=lambda: stop.stopping, describe=settings.describe,
            )  # fmt: skip
        # the control queue (control.py): read only for a handler that can stop a job
        self._control = None
        if settings.on_cancel is not None and hasattr(client, "get_jobs") and hasattr(client, "fast_ack"):
            self._control = Control(client, self.id, settings.on_cancel)
        if is_async_callable(handler):
            if beacon is not None:
                handler = beacon.track(handler)  # its running jobs, for the beats
            runners = self._runners = Runners(handler, settings.concurrency, settings.max_attempts, buffer=buffer,
                                              counters=counters, fetcher=fetcher, outcomes=outcomes, stop=stop,
                                              keepalive=keepalive)  # fmt: skip
            fetcher.arrived, fetcher.on_done = runners.wake_one, runners.wake_all
        else:  # plain functions: handler threads, started by run()
            threads = self._threads = HandlerThreads(
                handler, settings.concurrency, settings.max_attempts, client=client, buffer=buffer,
                counters=counters, fetcher=fetcher, acks=acks, gate=gate, outcomes=outcomes, stop=stop,
                keepalive=keepalive,
            )  # fmt: skip
            fetcher.arrived, fetcher.on_done = threads.arrived, threads.collect_wake.fire
            stop.halts.append(threads.halt)
            if beacon is not None:
                beacon.threads = threads  # the jobs they run, read at each beat
            # the threads may fetch for themselves on their own connection to the trio client's
            # node: not with heartbeats (the trio side starts them) or affinity (the trio client
            # follows the jobs' origin)
            if DIRECT_FETCH and not settings.heartbeat and isinstance(client, AioClient) and not client.config.affinity:
                fetcher.lend = threads.lend
        stop.running = self._running_count

    # ------------------------------------------------------------ the settings most read
    @property
    def concurrency(self) -> int:
        return self.settings.concurrency

    @property
    def max_in_flight(self) -> int:
        return self.settings.in_flight_limit

    # ------------------------------------------------------------ public
    def stats(self) -> WorkerStats:
        c = self._counters
        fetched, processed, in_flight = c.fetched, c.processed, c.in_flight
        if self._threads is not None:  # direct mode's counts not taken yet
            d_fetched, d_processed, d_in_flight = self._threads.direct_counts()
            fetched, processed, in_flight = fetched + d_fetched, processed + d_processed, in_flight + d_in_flight
        return WorkerStats(
            fetched, processed, c.failed, c.retried, c.dead,
            in_flight, self._running_count(), c.backoffs, c.ack_errors, self.starved(), c.released,
        )  # fmt: skip

    def starved(self) -> bool:
        """True when the worker has no more jobs available right now: nothing is waiting in the
        local buffer and the last GETJOB returned fewer jobs than it asked for. A handler that
        accumulates work (rows for one bulk insert) flushes when it sees it."""
        return self._counters.starved and not self._buffer

    @property
    def stopping(self) -> bool:
        return self._stop.stopping

    def stop(self, grace_period: float | None = None) -> None:
        """Stop fetching; finish or give back jobs in hand within the grace period.

        Safe from the trio thread, from handler threads and from other threads.
        """
        self._stop.request(grace_period)

    def report_progress(self, job_id: str, done: float, total: float | None = None, note: str | None = None) -> None:
        """A running job's progress, shown in the worker's beats (``disque-py workers``) within
        a second; from any thread. Nothing without beats."""
        if self._beacon is not None:
            self._beacon.report(job_id, done, total, note)

    def beat_soon(self) -> None:
        """Tell the cluster what runs within a second (a job cancelled); from any thread."""
        if self._beacon is not None:
            self._beacon.soon()

    def _running_count(self) -> int:
        if self._threads is not None:
            return self._threads.running()
        return self._counters.running

    def _spawn(self, fn: Any, *args: Any) -> None:
        """Start a task in the handlers' nursery (a heartbeat, a dead letter)."""
        assert self._nursery is not None
        self._nursery.start_soon(fn, *args)

    def run_sync(self, *, handle_signals: bool = True) -> WorkerStats:
        """``trio.run`` the worker until stopped (SIGTERM/SIGINT by default)."""
        return trio.run(functools.partial(self.run, handle_signals=handle_signals))

    async def run(self, *, handle_signals: bool = False, task_status: Any = trio.TASK_STATUS_IGNORED) -> WorkerStats:
        """Run until :meth:`stop` (or a signal); returns the final stats. A worker runs once.

        A ``KeyboardInterrupt``/``SystemExit`` raised by a handler, or an
        :class:`~disque_py.client.errors.AuthError` from the node, stops the worker
        gracefully and is raised again here at the end.
        """
        stop, acks, threads = self._stop, self._acks, self._threads
        stop.token = trio.lowlevel.current_trio_token()
        token = _current_worker.set(self)
        try:
            async with trio.open_nursery() as outer:
                outer.start_soon(acks.run)
                beacon_scope = trio.CancelScope()
                if self._beacon is not None:
                    outer.start_soon(_in_scope, beacon_scope, self._beacon.run)
                control_scope = trio.CancelScope()
                if self._control is not None:
                    outer.start_soon(_in_scope, control_scope, self._control.run)
                timer_scope = trio.CancelScope()
                outer.start_soon(_in_scope, timer_scope, stop.grace_timer)
                if handle_signals:
                    await outer.start(stop.signals)
                async with trio.open_nursery() as work:
                    self._nursery = work
                    stop.work_scope = work.cancel_scope
                    if threads is not None:
                        threads.start(work)
                    else:
                        assert self._runners is not None
                        self._runners.start(work)
                    work.start_soon(self._fetcher.run)
                    task_status.started()
                if threads is not None:
                    threads.finish()
                stop.drain()  # anything left (runners cancelled) goes back
                acks.done = True
                acks.wake.fire()  # the acker sends what is left, then returns
                timer_scope.cancel()
                beacon_scope.cancel()
                control_scope.cancel()
                stop.signal_scope.cancel()
                outer.cancel_scope.deadline = trio.current_time() + 10.0  # bounds the acker's last flush
            if self._beacon is not None:
                await self._beacon.forget()  # a clean stop: off the cluster's list at once
        finally:
            if threads is not None:
                threads.join(5.0)  # idle threads exit at once; abandoned ones when their handler returns
            _current_worker.reset(token)
            if self._owns_client:
                with trio.CancelScope(shield=True):
                    await self.client.aclose()
        stats = self.stats()
        log.info("worker %s stopped: %s", self.id, stats)  # WorkerStats.__str__: the counters as one line
        if stop.fatal_error is not None:
            raise stop.fatal_error
        return stats


async def _in_scope(scope: trio.CancelScope, fn: Any) -> None:
    with scope:
        await fn()
