"""Stopping: :meth:`Worker.stop`, SIGTERM/SIGINT, the grace period, and the jobs given back.

A stop (:meth:`Stop.request` from any thread, a signal with ``handle_signals=True``, a fatal
error): the fetcher stops after its current GETJOB (which waits at most ``fetch_timeout_ms``),
jobs that arrive after the stop and jobs not started yet are given back at once
(:meth:`Stop.give_back`), running handlers get ``grace_period`` seconds to finish; then they
are cancelled (a thread cannot be killed: it is abandoned, and exits when its handler returns)
and their jobs handed back (:meth:`Stop.hand_back`). A second signal ends the grace period at
once. A ``KeyboardInterrupt``/``SystemExit`` raised by a handler, or an
:class:`~disque_py.client.errors.AuthError` from the node, stops the worker the same way and
is raised again from :meth:`Worker.run` at the end (:meth:`Stop.fatal`).
"""

from __future__ import annotations

import logging
import math
import signal
from collections import deque
from collections.abc import Callable
from typing import Any

import trio

from ..model import Job
from .acks import Acks
from .pause import FailureGate
from .stats import Counters
from .wakeup import Wakeup

__all__ = ["Stop"]

log = logging.getLogger("disque_py.worker")


class Stop:
    """Whether the worker is stopping, and what a stop does (see the module docstring).

    ``halts``: what must stop taking jobs before the buffer is emptied (the handler threads),
    called in order by :meth:`now`; ``running``: how many handlers run (for the log).
    """

    def __init__(self, grace_period: float, counters: Counters, acks: Acks, gate: FailureGate,
                 buffer: deque[Job], fetch_wake: Wakeup) -> None:  # fmt: skip
        self.grace_period = grace_period
        self.counters = counters
        self.acks = acks
        self.gate = gate
        self.buffer = buffer
        self.fetch_wake = fetch_wake
        self.stopping = False
        self.event = trio.Event()
        self.halts: list[Callable[[], None]] = []
        self.running: Callable[[], int] = lambda: 0
        self.token: trio.lowlevel.TrioToken | None = None  # the worker's trio run, once started
        self.work_scope: trio.CancelScope | None = None  # the handlers' nursery: cancelled after the grace period
        self.fatal_error: BaseException | None = None
        self._grace_deadline = math.inf
        self._grace_changed = trio.Event()
        self.signal_scope = trio.CancelScope()

    # ------------------------------------------------------------ asking for a stop
    def request(self, grace_period: float | None = None) -> None:
        """Stop fetching; finish or give back the jobs in hand within the grace period.

        Safe from the trio thread, from handler threads and from other threads.
        """
        try:
            trio.lowlevel.current_task()
        except RuntimeError:  # not in the trio thread
            if self.token is None:
                self.stopping = True  # not started yet: run() returns at once
                return
            self.token.run_sync_soon(self.now, grace_period)
            return
        self.now(grace_period)

    def now(self, grace_period: float | None) -> None:
        """Stop, in the trio thread (a new ``grace_period`` counts from now)."""
        if grace_period is not None:
            self.grace_period = grace_period
        if grace_period is not None or not self.event.is_set():
            self._grace_deadline = trio.current_time() + self.grace_period
            self._grace_changed.set()
            self._grace_changed = trio.Event()
        if not self.stopping:
            log.info("worker stopping: grace period %.1f s", self.grace_period)
        self.stopping = True
        self.event.set()
        for halt in self.halts:
            halt()  # before emptying the buffer: no thread takes a job after this
        self.drain()
        self.fetch_wake.fire()

    def fatal(self, error: BaseException) -> None:
        """An error no retry can fix: stop gracefully, and raise it from run() at the end (the first one)."""
        if self.fatal_error is None:
            self.fatal_error = error
        self.now(None)

    # ------------------------------------------------------------ the jobs in hand
    def drain(self) -> None:
        """Give back the fetched jobs no handler has started."""
        buffer = self.buffer
        while buffer:
            try:
                job = buffer.popleft()
            except IndexError:  # pragma: no cover - a handler thread took it
                break
            self.give_back(job)

    def give_back(self, job: Job) -> None:
        """A fetched job no handler started (stopping, or arrived after the stop): back to its
        queue. Today this is the same plain NACK as :meth:`hand_back`, so it counts an attempt."""
        self.hand_back(job)

    def hand_back(self, job: Job) -> None:
        """A job whose handler was cut short (the grace period is over) or whose dead-lettering
        was: a plain NACK, the job goes back to its queue now."""
        self.counters.retried += 1
        self.gate.neutral(job.id)
        self.acks.nack(job)

    # ------------------------------------------------------------ tasks
    async def grace_timer(self) -> None:
        """Once stopping, cancel the remaining work when the grace period is over."""
        await self.event.wait()
        while trio.current_time() < self._grace_deadline:
            changed = self._grace_changed
            with trio.move_on_at(self._grace_deadline):
                await changed.wait()
        if self.work_scope is not None:
            log.warning("grace period over: cancelling %d running handler(s)", self.running())
            self.work_scope.cancel()

    async def signals(self, task_status: Any = trio.TASK_STATUS_IGNORED) -> None:
        """SIGTERM/SIGINT: the first stops, the next ends the grace period."""
        with self.signal_scope:
            with trio.open_signal_receiver(signal.SIGTERM, signal.SIGINT) as signals:
                task_status.started()
                async for signum in signals:
                    if not self.stopping:
                        log.info("got %s: stopping", signal.Signals(signum).name)
                        self.now(None)
                    else:
                        log.info("got %s again: ending the grace period now", signal.Signals(signum).name)
                        self.now(0.0)
