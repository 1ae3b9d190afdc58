"""Let the client loop wait in its own epoll when trio has nothing else to do.

The client loop (:mod:`.clients`) normally waits with ``wait_readable`` on
its epoll descriptor. Every wake-up is then a full trio scheduler round:
trio re-arms its one-shot registration of that descriptor (an
``epoll_ctl``), waits in its own epoll, processes the event, reschedules
the task and switches to it. On a node that is woken thousands of times a
second by single requests, that round is a large share of the work
(measured: 46-47 µs of node CPU per unpipelined PING with it, 36-39 µs without;
docs/benchmarks-history.md, "Direct waiting in the client loop").

:class:`DirectWait` skips the round when it cannot matter. Trio's own epoll
descriptor is added to the loop's epoll, and an instrument records which
other tasks are scheduled and have not run yet. When none is, nothing can
happen in trio until one of its descriptors becomes ready (a listener, a
bus handshake, a signal or a thread waking it: they all go through that
epoll) or its next deadline passes. So the loop blocks in ``epoll.poll``
itself, with the time left until trio's next deadline, and yields to trio
(a checkpoint) only when trio's descriptor was ready, the deadline passed
or some task was scheduled meanwhile. Trio then runs exactly as it would
have.

The loop falls back to ``wait_readable`` (and this module does nothing)
when trio's epoll cannot be reached (another I/O backend, or a trio whose
internals moved), under a virtual clock (``MockClock``: a test's autojump
must see the run idle), or when two client loops share one trio run (one
blocking directly would leave the other's clients unwatched).

Used only by the client loop (:mod:`.clients`), one :class:`DirectWait` per
loop; whether it is active decides who runs the core's timers
(:mod:`.timers`). It imports nothing of the shell.
"""

from __future__ import annotations

import math
import select
import sys
from typing import Any

import trio

__all__ = ["DirectWait", "trio_epoll_fd", "MAX_WAIT"]

#: Longest single direct wait when trio has no deadline at all (then only I/O can wake us anyway).
MAX_WAIT = 3600.0

# Client loops per trio run: direct waiting needs to be alone.
_LOOPS: trio.lowlevel.RunVar[list[Any]] = trio.lowlevel.RunVar("disque_py_client_loops")


def _runner() -> Any:
    """Trio's private run state, or None if it is not where this trio version keeps it."""
    try:
        from trio._core._run import GLOBAL_RUN_CONTEXT

        return GLOBAL_RUN_CONTEXT.runner
    except Exception:  # noqa: BLE001 - another layout: no direct waiting
        return None


def trio_epoll_fd() -> int | None:
    """The descriptor of the running trio's epoll, or None if there is none we can reach."""
    try:
        fd = _runner().io_manager._epoll.fileno()
    except Exception:  # noqa: BLE001 - another I/O backend or layout: no direct waiting
        return None
    return fd if type(fd) is int and fd >= 0 else None


def _deadline_clock() -> Any:
    """A function returning the seconds left until trio's next deadline (cheap when it can be)."""
    try:
        runner = _runner()
        next_deadline = runner.deadlines.next_deadline
        now = runner.clock.current_time
        if type(next_deadline()) is float and type(now()) is float:
            return lambda: next_deadline() - now()
    except Exception:  # noqa: BLE001 - fall back to the public (slower) way
        pass
    return lambda: trio.lowlevel.current_statistics().seconds_to_next_deadline


class _Scheduled(trio.abc.Instrument):
    """The tasks (other than ``me``) scheduled to run and not run yet."""

    def __init__(self, me: Any) -> None:
        self.me = me
        self.pending: set[Any] = set()

    def task_scheduled(self, task: Any) -> None:
        if task is not self.me:
            self.pending.add(task)

    def before_task_step(self, task: Any) -> None:
        self.pending.discard(task)

    def task_exited(self, task: Any) -> None:
        self.pending.discard(task)


class DirectWait:
    """Waits for ``ep`` (see the module docstring); one per client loop."""

    def __init__(self, ep: select.epoll) -> None:
        self.ep = ep
        self.trio_fd: int | None = None  # set while direct waiting is on
        self.trio_ready = False  # trio's epoll was ready in the last result of wait()
        self.direct_waits = 0  # waits in ep itself (observability, tests)
        self._scheduled: _Scheduled | None = None
        self._loops: list[Any] | None = None
        self._time_left: Any = None

    @property
    def active(self) -> bool:
        return self.trio_fd is not None

    async def start(self) -> bool:
        """Turn direct waiting on if it is safe here; True if it is on. Call from the loop's task."""
        try:
            loops = _LOOPS.get()
        except LookupError:
            loops = []
            _LOOPS.set(loops)
        loops.append(self)
        self._loops = loops
        if len(loops) > 1:
            for other in loops:
                other.stop()
            return False
        testing = sys.modules.get("trio.testing")  # only a test has a MockClock; importing
        # trio.testing to ask would load pytest into every node (75 ms of its start)
        if testing is not None and isinstance(trio.lowlevel.current_clock(), testing.MockClock):
            return False
        fd = trio_epoll_fd()
        if fd is None:
            return False
        try:
            self.ep.register(fd, select.EPOLLIN)
        except (OSError, ValueError):
            return False
        self._time_left = _deadline_clock()
        scheduled = _Scheduled(trio.lowlevel.current_task())
        trio.lowlevel.add_instrument(scheduled)
        self._scheduled = scheduled
        self.trio_fd = fd
        # Tasks scheduled before the instrument was added are not in ``pending``:
        # the ones in the current batch run before our first checkpoint returns,
        # the ones queued for the next batch before our second one does.
        await trio.lowlevel.checkpoint()
        await trio.lowlevel.checkpoint()
        return self.active

    def stop(self) -> None:
        """Back to ``wait_readable`` for good (idempotent)."""
        fd, self.trio_fd = self.trio_fd, None
        self.trio_ready = False
        if fd is not None:
            try:
                self.ep.unregister(fd)
            except (OSError, ValueError):
                pass
        scheduled, self._scheduled = self._scheduled, None
        if scheduled is not None:
            try:
                trio.lowlevel.remove_instrument(scheduled)
            except (KeyError, RuntimeError):
                pass

    def close(self) -> None:
        self.stop()
        if self._loops is not None and self in self._loops:
            self._loops.remove(self)

    async def wait(self, limit: float = math.inf) -> list[tuple[int, int]]:
        """The ready ``(fd, events)`` of ``ep``, after waiting as cheaply as it is safe to.

        ``limit``: seconds until the caller's own next timer, when it keeps
        its timers outside trio (only a direct wait honours it: the caller
        must not rely on it unless :attr:`active`). May return an empty list
        (a deadline or the limit passed: call again). When the list holds
        :attr:`trio_fd`, set :attr:`trio_ready` so that the next call lets
        trio handle its I/O first.
        """
        scheduled = self._scheduled
        if scheduled is None:
            await trio.lowlevel.wait_readable(self.ep.fileno())
            return self.ep.poll(0)
        if self.trio_ready or scheduled.pending:
            self.trio_ready = False
            await trio.lowlevel.checkpoint()  # trio runs its I/O and the waiting tasks first
            return self.ep.poll(0)
        await trio.lowlevel.checkpoint_if_cancelled()
        timeout = self._time_left()
        if limit < timeout:
            timeout = limit
        if timeout <= 0:
            await trio.lowlevel.checkpoint()  # trio runs what is due
            return []
        self.direct_waits += 1
        return self.ep.poll(-1 if timeout == math.inf else min(timeout, MAX_WAIT))
