"""Wakeup: how one stage's task waits for another's news, at the cost of a reschedule."""

from __future__ import annotations

from typing import Any

import trio

__all__ = ["Wakeup"]


class Wakeup:
    """Wakes one waiting task: ``wait()`` blocks until the next ``fire()``.

    The waiter checks its condition and calls ``wait()`` with no checkpoint
    in between, so a ``fire()`` with nobody waiting is dropped (cheaply: it
    is called for every job).
    """

    __slots__ = ("task",)

    def __init__(self) -> None:
        self.task: trio.lowlevel.Task | None = None

    def fire(self) -> None:
        task = self.task
        if task is not None:
            self.task = None
            trio.lowlevel.reschedule(task)

    async def wait(self) -> None:
        assert self.task is None, "one waiter at a time"
        self.task = trio.lowlevel.current_task()
        await trio.lowlevel.wait_task_rescheduled(self._abort)

    def _abort(self, _: Any) -> trio.lowlevel.Abort:
        self.task = None
        return trio.lowlevel.Abort.SUCCEEDED
