"""Schedules of periodic tasks: a placeholder with ``every=`` only, until the cron parser lands.

The interface the app and the scheduler use: ``Schedule.every(seconds)``,
``Schedule.cron(expr)``, ``schedule.slot_start(t)`` (the start of the slot ``t``
falls in, unix seconds) and ``schedule.next_after(t)`` (the next slot start after ``t``).
"""

from __future__ import annotations

import math

__all__ = ["Schedule"]


class Schedule:
    def __init__(self, every: float) -> None:
        if not every > 0:
            raise ValueError("every= must be > 0 seconds")
        self.period = float(every)

    @classmethod
    def every(cls, seconds: float) -> "Schedule":
        return cls(seconds)

    @classmethod
    def cron(cls, expr: str) -> "Schedule":
        raise NotImplementedError("cron= schedules are not available yet (use every=)")

    def slot_start(self, t: float) -> float:
        return math.floor(t / self.period) * self.period

    def next_after(self, t: float) -> float:
        return self.slot_start(t) + self.period
