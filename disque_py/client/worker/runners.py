"""Running ``async def`` handlers: ``concurrency`` trio tasks taking jobs from the buffer.

Idle runners sleep; new jobs wake one, and a runner whose handler pauses (its first step did
not finish it) wakes another for the next buffered job, unless one is on its way already. So a
handler that blocks lets the next job start at once, while a batch of handlers that never pause
runs in one task without a task switch per job.
"""

from __future__ import annotations

import math
import types
from collections import deque
from collections.abc import Coroutine, Generator
from typing import Any

import trio

from ..model import Job
from .fetch import Fetcher
from .handlers import Handler
from .keepalive import Keepalive
from .outcome import Outcomes
from .stats import Counters
from .stop import Stop

__all__ = ["Runners"]


@types.coroutine
def _resume(coro: Coroutine[Any, Any, Any], message: Any) -> Generator[Any, Any, Any]:
    """Go on with ``coro``, whose first step yielded ``message`` to trio, as ``await coro`` would."""
    while True:
        try:
            sent = yield message
        except BaseException as exc:  # thrown in (trio does it only for foreign yields), or closed
            try:
                message = coro.throw(exc)
            except StopIteration as stop:
                return stop.value
        else:
            try:
                message = coro.send(sent)
            except StopIteration as stop:
                return stop.value


class Runners:
    """The runner tasks of an ``async def`` handler (see the module docstring)."""

    def __init__(self, handler: Handler, concurrency: int, max_attempts: int | None, *, buffer: deque[Job],
                 counters: Counters, fetcher: Fetcher, outcomes: Outcomes, stop: Stop,
                 keepalive: Keepalive) -> None:  # fmt: skip
        self.handler = handler
        self.concurrency = concurrency
        self.limit = max_attempts if max_attempts is not None else math.inf
        self.fast = not keepalive.heartbeat  # no heartbeats: the handler's call inlined
        self.buffer = buffer
        self.counters = counters
        self.fetcher = fetcher
        self.outcomes = outcomes
        self.stop = stop
        self.keepalive = keepalive
        self._idle: list[trio.lowlevel.Task] = []  # runners waiting for jobs
        self._waking = 0  # runners woken, not running yet

    def start(self, nursery: trio.Nursery) -> None:
        for _ in range(self.concurrency):
            nursery.start_soon(self._run)

    def running(self) -> int:
        return self.counters.running

    # ------------------------------------------------------------ waking
    def wake_one(self, _: int = 0) -> None:
        """Wake an idle runner, unless one is on its way already (new jobs: the fetcher's ``arrived``)."""
        if self._idle and not self._waking:
            self._waking = 1
            trio.lowlevel.reschedule(self._idle.pop())

    def wake_all(self) -> None:
        """The fetcher is done: every idle runner looks once more, then returns."""
        idle = self._idle
        while idle:
            self._waking += 1
            trio.lowlevel.reschedule(idle.pop())

    async def _park(self) -> None:
        """Wait until :meth:`wake_one` (or :meth:`wake_all`) picks this runner."""
        task = trio.lowlevel.current_task()
        idle = self._idle
        idle.append(task)

        def abort(_: Any) -> trio.lowlevel.Abort:
            idle.remove(task)
            return trio.lowlevel.Abort.SUCCEEDED

        await trio.lowlevel.wait_task_rescheduled(abort)
        self._waking -= 1

    # ------------------------------------------------------------ a runner
    async def _run(self) -> None:
        buffer = self.buffer
        handler = self.handler
        fast = self.fast
        limit = self.limit
        stop = self.stop
        fetcher = self.fetcher
        outcomes = self.outcomes
        counters = self.counters
        while True:
            if not buffer:
                if fetcher.done:
                    return
                fetcher.wake.fire()  # an idle runner: the fetcher should not wait for a bigger batch
                await self._park()
                continue
            job = buffer.popleft()
            if stop.stopping or job.attempt > limit:
                if buffer:
                    self.wake_one()  # for the next job, should this one block
                await outcomes.screen(job)
            elif fast:  # the common case, inlined: no heartbeat
                counters.running += 1
                try:
                    coro = handler(job)
                    try:
                        message = coro.send(None)  # up to the handler's first pause, if any
                    except StopIteration:
                        pass  # done without pausing: the next job runs in this task too
                    else:
                        if buffer:
                            self.wake_one()  # it waits: another runner takes the next job
                        await _resume(coro, message)
                except trio.Cancelled:
                    counters.running -= 1
                    stop.hand_back(job)
                    raise
                except BaseException as exc:  # noqa: BLE001 - any handler error is a job failure
                    counters.running -= 1
                    await outcomes.finish(job, exc)
                else:
                    counters.running -= 1
                    outcomes.succeeded(job)
            else:
                if buffer:
                    self.wake_one()
                await self._with_heartbeats(job)

    async def _with_heartbeats(self, job: Job) -> None:
        """An async handler with heartbeats."""
        counters = self.counters
        counters.running += 1
        beat = self.keepalive.start(job)
        try:
            await self.handler(job)
        except trio.Cancelled:
            self.stop.hand_back(job)
            raise
        except BaseException as exc:  # noqa: BLE001 - any handler error is a job failure
            error: BaseException | None = exc
        else:
            error = None
        finally:
            counters.running -= 1
            beat.cancel()
        await self.outcomes.finish(job, error)
