"""Running plain-function handlers: ``concurrency`` long-lived handler threads.

The threads, started by :meth:`Worker.run` and ended when it returns, take jobs from the
worker's buffer and run the handler. New jobs wake one idle thread (a condition variable); more
are woken at once if the last handler ran longer than ``SLOW_HANDLER`` (0.1 ms), else only for
jobs still waiting ``HELPER_DELAY`` (1 ms) later behind a busy thread (the *watch*). So a batch
of quick handlers runs in one thread, without a thread wake-up per job, and a slow handler holds
up the jobs behind it for 1 ms at most. What the threads report (job done or failed, job started
when heartbeats are on, job skipped) goes back to the trio thread in batches: one
``run_sync_soon`` wake-up per batch, not one per job. A trio task, the *collector*, turns the
reports into outcomes (:mod:`.outcome`), as a runner does.

With quick handlers the fetcher *lends* its role to the threads (:meth:`HandlerThreads.lend`,
direct mode, :mod:`.direct`): a thread that runs dry sends the ACKs and the next round itself.

Shared with the trio thread, under ``cond``: the job each thread runs (``current``), the reports
not collected yet (``events``), the idle and waking thread counts, the flags, and direct mode. A
fetched job is in exactly one place: the worker's buffer, ``current``, ``events``, direct mode's
``late``, or back in trio's hands. Threads take jobs from the buffer with ``popleft`` under the
lock; the trio thread appends to it, and empties it at a stop after :meth:`HandlerThreads.halt`.
"""

from __future__ import annotations

import contextvars
import functools
import math
import threading
import time
from collections import deque
from typing import Any

import trio

from ..model import Job
from .acks import Acks
from .direct import DirectFetch
from .fetch import OUTCOME_LINGER, Fetcher
from .handlers import Handler, call_sync
from .keepalive import Keepalive
from .outcome import Outcomes
from .pause import FailureGate
from .stats import Counters
from .stop import Stop
from .wakeup import Wakeup

__all__ = ["HandlerThreads", "HELPER_DELAY", "SLOW_HANDLER"]

#: Seconds a job may wait in the buffer, behind a handler thread busy with
#: other jobs, before idle handler threads are woken to take it.
HELPER_DELAY = 0.001

#: A handler that ran longer than this (seconds) makes new jobs wake as
#: many handler threads as they need at once.
SLOW_HANDLER = 0.0001

# What a handler thread reports about a job.
_DONE = 0  # the handler returned (error None) or raised (error set)
_STARTED = 1  # the handler is starting (only with heartbeats)
_SKIPPED = 2  # not run: attempt above max_attempts, for the collector to dead-letter

Report = tuple[int, Job, BaseException | None]


class HandlerThreads:
    """The threads running a plain-function handler, and their trio side (see the module docstring)."""

    def __init__(self, handler: Handler, concurrency: int, max_attempts: int | None, *, client: Any,
                 buffer: deque[Job], counters: Counters, fetcher: Fetcher, acks: Acks, gate: FailureGate,
                 outcomes: Outcomes, stop: Stop, keepalive: Keepalive) -> None:  # fmt: skip
        self.handler = handler
        self.concurrency = concurrency
        self.limit = max_attempts if max_attempts is not None else math.inf
        self.client = client
        self.buffer = buffer
        self.counters = counters
        self.fetcher = fetcher
        self.acks = acks
        self.gate = gate
        self.outcomes = outcomes
        self.stop = stop
        self.keepalive = keepalive
        self.cond = threading.Condition(threading.Lock())
        self.current: list[Job | None] = [None] * concurrency
        self.threads: list[threading.Thread] = []
        self.idle = 0  # threads waiting for a job
        self.waking = 0  # of which notified, not running yet
        self.halted = False  # start no more jobs (stopping, or a handler raised KeyboardInterrupt...)
        self.closed = False  # exit: report nothing more
        self.events: list[Report] = []
        self.posted = False  # a wake-up for the collector is on its way
        self.abandoned: set[int] = set()  # threads left in a handler by close()
        self.slow = False  # the last handler to finish took more than SLOW_HANDLER
        self.pushed = 0  # jobs put in the buffer for the threads, so far
        self.popped = 0  # jobs taken from it by the threads, so far
        self.started = [0.0] * concurrency  # perf_counter() when the running handler started
        self.direct = DirectFetch(self.cond, self._post, client, fetcher.path, acks.op, counters)
        self.collect_wake = Wakeup()  # reports from the threads, or no more jobs: for the collector
        self._token: trio.lowlevel.TrioToken | None = None
        self._nursery: trio.Nursery | None = None
        self._beats: dict[str, trio.CancelScope] = {}  # heartbeats of jobs in handler threads
        self._watch_scope = trio.CancelScope()  # the watch's sleep: its deadline when armed
        self._watch_armed = False
        self._watch_mark = 0

    # ---------------------------------------------------------- trio side
    def start(self, nursery: trio.Nursery) -> None:
        """Start the threads, and the collector in ``nursery`` (the handlers')."""
        self._token = trio.lowlevel.current_trio_token()
        self._nursery = nursery
        for slot in range(self.concurrency):
            context = contextvars.copy_context()  # current_worker() works in handlers
            thread = threading.Thread(
                target=context.run, args=(self._main, slot), name="disque-py-handler-%d" % slot, daemon=True
            )
            thread.start()
            self.threads.append(thread)
        nursery.start_soon(self._collector)

    def arrived(self, count: int) -> None:
        """``count`` new jobs in the buffer (the fetcher's): wake an idle thread, or as many as
        the jobs need if handlers are slow; the watch looks again later if more could help."""
        with self.cond:
            self.pushed += count
            waiting = len(self.buffer)
            if self.slow:
                wake = min(waiting, self.idle) - self.waking
                if wake > 0:
                    self.waking += wake
                    self.cond.notify(wake)
            elif self.idle > self.waking == 0:
                self.waking = 1
                self.cond.notify()
            more = self.idle > self.waking and waiting > self.waking
        if more and not self._watch_armed:
            self._arm_watch()

    def help(self, mark: int) -> bool:
        """If a job put in the buffer before ``pushed`` was ``mark`` is still there, wake idle
        threads for the buffered jobs. True if jobs still wait and more threads could help."""
        with self.cond:
            waiting = len(self.buffer)
            if waiting and self.popped < mark and not self.halted:
                wake = min(waiting, self.idle - self.waking)
                if wake > 0:
                    self.waking += wake
                    self.cond.notify(wake)
            return self.idle > self.waking and waiting > self.waking

    def halt(self) -> None:
        """Start no more jobs (a stop, before the buffer is emptied)."""
        with self.cond:
            self.halted = True
            self.direct.close()

    def running(self) -> int:
        return sum(job is not None for job in self.current)

    def _busy(self) -> bool:
        """Reports waiting, a handler or a direct round trip running, or direct mode's results
        not taken."""
        with self.cond:
            return bool(self.events) or self.direct.leading or self.direct.dirty or any(
                job is not None for job in self.current
            )

    def _close(self) -> tuple[list[Job], list[Report]]:
        """Make every thread exit (a running handler first returns); returns the jobs whose
        handler is still running (abandoned: their threads report nothing more) and the
        reports not collected yet."""
        with self.cond:
            if self.closed:
                return [], []
            self.direct.close()  # ACKs not sent yet go to the trio side
            self.closed = True
            running = []
            for slot, job in enumerate(self.current):
                if job is not None:
                    running.append(job)
                    self.abandoned.add(slot)
                    self.current[slot] = None
            events, self.events = self.events, []
            self.waking = self.idle
            self.cond.notify_all()
        return running, events

    def finish(self) -> None:
        """The handlers' nursery is done: the threads exit, what direct mode left is taken over."""
        self._close()
        self.absorb()

    def join(self, timeout: float) -> None:
        """Close, and wait for the threads that are not running a handler."""
        self._close()
        for slot, thread in enumerate(self.threads):
            if slot not in self.abandoned:
                thread.join(timeout)
        if not self.direct.leading:
            self.direct.drop_connection()

    def direct_counts(self) -> tuple[int, int, int]:
        """Jobs fetched, processed, and in flight (a change) in direct mode that the trio side
        did not take yet (for the stats)."""
        with self.cond:
            delta = self.direct.delta
            return delta.fetched, delta.processed, delta.in_flight

    # ---------------------------------------------------------- thread side
    def _post(self) -> None:
        """Under the lock, after adding a report: wake the collector unless a wake-up is on its way."""
        if not self.posted:
            self.posted = True
            try:
                self._token.run_sync_soon(self.collect_wake.fire)  # type: ignore[union-attr]
            except trio.RunFinishedError:  # pragma: no cover - trio.run is over
                pass

    def _main(self, slot: int) -> None:
        buffer = self.buffer
        cond = self.cond
        current = self.current
        started = self.started
        direct = self.direct
        handler = self.handler
        limit = self.limit
        beats = bool(self.keepalive.heartbeat)
        clock = time.perf_counter
        report: Report | None = None
        while True:
            with cond:
                if report is not None:
                    if self.closed:
                        return  # abandoned: the job was handed back
                    current[slot] = None
                    if direct.open and report[0] == _DONE and report[2] is None:
                        direct.done(report[1])
                    else:
                        direct.close()  # a failure, a job to dead-letter: the trio side takes over
                        self.events.append(report)
                        self._post()
                    report = None
                while self.closed or self.halted or not buffer:
                    if self.closed:
                        return
                    if direct.open and not direct.leading and not self.halted:
                        jobs = direct.round()
                        if jobs:
                            buffer.extend(jobs)
                            self.pushed += len(jobs)
                        continue
                    self.idle += 1
                    cond.wait()
                    self.idle -= 1
                    self.waking -= 1
                job = buffer.popleft()
                current[slot] = job
                self.popped += 1
                if job.attempt > limit:
                    report = (_SKIPPED, job, None)
                    continue
                if beats:
                    self.events.append((_STARTED, job, None))
                    self._post()
            started[slot] = start = clock()
            try:
                call_sync(handler, job)
            except BaseException as exc:  # noqa: BLE001 - any handler error is a job failure
                report = (_DONE, job, exc)
                if not isinstance(exc, Exception):
                    self.halted = True  # KeyboardInterrupt, SystemExit...: the worker stops
            else:
                report = (_DONE, job, None)
            started[slot] = 0.0
            self.slow = clock() - start > SLOW_HANDLER

    # ---------------------------------------------------------- the collector and the watch
    async def _collector(self) -> None:
        """Turn what the handler threads report into outcomes; returns when the work is over."""
        watch = trio.CancelScope()
        assert self._nursery is not None
        self._nursery.start_soon(self._watch, watch)
        try:
            while True:
                if self.direct.dirty:
                    self.absorb()
                with self.cond:
                    events, self.events = self.events, []
                    self.posted = False
                if events:
                    self._collect(events)
                    continue
                if self.fetcher.done and not self.buffer and not self._busy():
                    watch.cancel()
                    return
                await self.collect_wake.wait()
        except trio.Cancelled:
            # The grace period is over (or run() was cancelled): settle what
            # finished, hand back what runs (its thread is abandoned).
            running, events = self._close()
            self._collect(events, abandoning=True)
            for job in running:
                self.stop.hand_back(job)
            raise

    def _collect(self, events: list[Report], abandoning: bool = False) -> None:
        outcomes = self.outcomes
        beats = self._beats
        for kind, job, error in events:
            if kind == _DONE:
                if beats:
                    beat = beats.pop(job.id, None)
                    if beat is not None:
                        beat.cancel()
                if error is None:
                    outcomes.succeeded(job)
                elif abandoning:  # no awaiting now
                    outcomes.failed_at_cancel(job)
                else:
                    outcomes.failed_later(job, error)
            elif kind == _STARTED:
                if not abandoning:
                    beats[job.id] = self.keepalive.start(job)
            elif abandoning:  # _SKIPPED: never ran
                self.stop.give_back(job)
            else:
                outcomes.spawn(functools.partial(outcomes.screen, job))  # _SKIPPED: attempt above the limit

    def _arm_watch(self) -> None:
        """In HELPER_DELAY, check that no job has waited in the buffer all that time."""
        self._watch_armed = True
        self._watch_mark = self.pushed
        self._watch_scope.deadline = trio.current_time() + HELPER_DELAY

    async def _watch(self, scope: trio.CancelScope) -> None:
        """Wakes idle handler threads for jobs the busy ones leave waiting (see HELPER_DELAY).

        A thread does not wake another before each job (with quick handlers
        one thread runs a whole batch in less time than a wake-up takes).
        """
        with scope:
            while True:
                with trio.CancelScope(deadline=self._watch_scope.deadline) as self._watch_scope:
                    await trio.sleep_forever()
                self._watch_armed = False
                self._watch_scope = trio.CancelScope()
                if self.help(self._watch_mark):
                    self._arm_watch()

    # ---------------------------------------------------------- direct mode, trio side
    async def lend(self) -> bool:
        """Let the handler threads fetch for themselves until direct mode closes (the fetcher's
        ``lend``); False if it could not open."""
        gate = self.gate
        if gate.failing or gate.state is not FailureGate.OPEN:
            return False
        address = self.client.current_address
        longest = OUTCOME_LINGER if self.concurrency == 1 else HELPER_DELAY
        self.absorb()
        if address is None:
            return False
        self.stop.fetched(address)  # what the threads fetch comes from there
        if not self._open_direct(address, longest):
            return False
        self.acks.carry(False)
        wake = self.fetcher.wake
        try:
            await trio.lowlevel.checkpoint()
            while self._check_direct(longest):
                with trio.move_on_after(longest):
                    await wake.wait()
        finally:
            with self.cond:
                self.direct.close()
            self.absorb()
        if self.buffer and self.help(self.pushed) and not self._watch_armed:
            self._arm_watch()  # closed behind a slow handler: idle threads take the jobs left
        return True

    def _slow_since(self, longest: float) -> bool:
        """Under the lock: a handler has been running for more than ``longest`` seconds."""
        since = time.perf_counter() - longest
        return any(0.0 < start < since for start in self.started)

    def _open_direct(self, address: Any, longest: float) -> bool:
        """Open direct mode if one of the threads has a job to finish (else every outcome is on
        its way to the trio side already), handlers are quick (the last one, and none running
        for more than ``longest`` seconds) and the direct connection did not fail in the last
        ``DIRECT_RETRY`` seconds."""
        direct = self.direct
        with self.cond:
            if self.halted or self.closed or self.slow or direct.leading:
                return False
            if not (self.buffer or any(self.current)) or time.monotonic() < direct.retry_at:
                return False
            if self._slow_since(longest):
                return False
            direct.start(self.counters.in_flight, address)
            return True

    def _check_direct(self, longest: float) -> bool:
        """True while direct mode is open or its last round trip is on; closes it when a
        handler has run for more than ``longest`` seconds."""
        direct = self.direct
        with self.cond:
            if direct.open and self._slow_since(longest):
                direct.close()
            return direct.open or direct.leading

    def absorb(self) -> None:
        """Add what direct mode did to the worker's counts; take over what it left."""
        with self.cond:
            delta, handed, late = self.direct.take()
        counters = self.counters
        counters.fetched += delta.fetched
        counters.in_flight += delta.in_flight
        counters.processed += delta.processed
        counters.ack_errors += delta.ack_errors
        if handed:
            self.acks.acks += handed
            self.acks.queued()
        if late:
            if self.stop.stopping:
                for job in late:
                    self.stop.give_back(job)
            else:
                self.buffer.extend(late)
                self.arrived(len(late))
        self.fetcher.wake.fire()  # slots freed, or direct mode over: the fetcher looks again

