"""Stopping: :meth:`Worker.stop`, SIGTERM/SIGINT, the grace period, and the jobs given back.

A stop (:meth:`Stop.request` from any thread, a signal with ``handle_signals=True``, a fatal
error): the fetcher stops after its current GETJOB (which waits at most ``fetch_timeout_ms``),
jobs that arrive after the stop and jobs not started yet are given back at once
(:meth:`Stop.give_back`: RELEASE, so they count as never delivered: no attempt used, no nack, no
dead letter, queued again at once for another worker; :mod:`.acks`), running handlers get
``grace_period`` seconds to finish; then they are cancelled (a thread cannot be killed: it is
abandoned, and exits when its handler returns) and their jobs handed back
(:meth:`Stop.hand_back`: a NACK, as for a failure: they ran, and may run too long each time).
A second signal ends the grace period at once. A ``KeyboardInterrupt``/``SystemExit`` raised by
a handler, or an :class:`~disque_py.client.errors.AuthError` from the node, stops the worker the
same way and is raised again from :meth:`Worker.run` at the end (:meth:`Stop.fatal`).

A job goes back to the node it came from: the fetcher tells :meth:`Stop.fetched` where each
round's jobs came from, and when that changes (the client failed over, or followed its jobs)
the jobs still buffered keep their node in ``earlier`` (nothing is kept while the client stays
on one node).
"""

from __future__ import annotations

import logging
import math
import signal
from collections import deque
from collections.abc import Callable
from typing import Any

import trio

from .. import commands as cmd
from ..model import Job
from .acks import Acks
from .pause import FailureGate
from .stats import Counters
from .wakeup import Wakeup

__all__ = ["Stop"]

log = logging.getLogger("disque_py.worker")

#: NACK's REASON for a job handed back (:meth:`Stop.hand_back`)
HANDED_BACK = "WorkerStopped: the worker stopped while the job ran (the grace period ended)"


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
        self.origin: Any = None  # the node the last round's jobs came from (None: not known)
        self.earlier: dict[str, Any] = {}  # buffered jobs from another node than ``origin``: theirs

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

    def fetched(self, origin: Any) -> None:
        """The jobs of a round, not buffered yet, came from the node at ``origin`` (None: not
        known, they go back through the client's node). In the trio thread."""
        if origin != self.origin:  # the client moved: the buffered jobs keep where they came from
            earlier, before = self.earlier, self.origin
            self.earlier = {job.id: earlier.get(job.id, before) for job in tuple(self.buffer)}
            self.origin = origin

    def give_back(self, job: Job) -> None:
        """A fetched job no handler started (stopping, or arrived after the stop): RELEASE on the
        node it came from, queued again at once with its delivery not counted (:mod:`.acks`)."""
        self.counters.released += 1
        self.gate.neutral(job.id)
        earlier = self.earlier
        self.acks.release(job, earlier.pop(job.id, self.origin) if earlier else self.origin)

    def hand_back(self, job: Job) -> None:
        """A job whose handler was cut short (the grace period is over) or whose dead-lettering
        was: a plain NACK, the job goes back to its queue now. Its delivery counts (it ran, maybe
        in part: a job that always outlasts the grace period ends as a dead letter)."""
        self.counters.retried += 1
        self.gate.neutral(job.id)
        acks = self.acks
        if acks.legacy:  # a node without NACK's REASON
            acks.nack(job)
        else:  # the reason a dead letter shows, should this have been its last delivery
            acks.nack_with("retry", job, cmd.nack_argv([job.id], reason=HANDED_BACK))

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
