"""The consumer-wide pause, for an outage: :class:`FailureGate` (no I/O: the caller passes ``now``).

When at least ``backoff_ratio`` of the last ``backoff_after`` distinct jobs failed (a job
failing again counts once, so a few poison jobs never trip it), the fetcher stops for
``backoff.delay(n)`` seconds (exponential, jittered, bounded by ``backoff.maximum``), then
fetches a single *probe* job and waits for its outcome: success goes back to full speed,
failure pauses longer. Jobs already in hand keep running meanwhile. The fetcher asks the gate
(:meth:`FailureGate.allowance`); the outcomes tell it (:meth:`~FailureGate.success`,
:meth:`~FailureGate.failure`, :meth:`~FailureGate.neutral`).
"""

from __future__ import annotations

import random
from collections import OrderedDict

from ..cluster import Backoff

__all__ = ["FailureGate", "DEFAULT_PAUSE_BACKOFF"]

#: ``backoff=`` default: the consumer-wide pause when most recent jobs fail (an outage):
#: 0.5 s doubling up to 5 s between probes.
DEFAULT_PAUSE_BACKOFF = Backoff(initial=0.5, maximum=5.0, factor=2.0, jitter=0.5)


class FailureGate:
    """When the fetcher may fetch, after failures (no I/O: the caller passes ``now``).

    It looks at the last ``window`` distinct jobs that ended (a job failing
    again counts once, with its latest outcome) and trips when at least
    ``ratio`` of them failed, i.e. when most jobs fail, whatever they are: a
    downstream outage, not a few poison jobs (those are retried one by one
    with NACK delays). States: ``open`` (fetch freely), ``backing-off``
    (fetch nothing until ``until``), ``probing`` (fetch one job and wait for
    its outcome: a success opens the gate and forgets the window, a failure
    backs off longer, up to ``backoff.maximum``).
    """

    OPEN = "open"
    BACKING_OFF = "backing-off"
    PROBING = "probing"

    def __init__(self, backoff: Backoff, window: int, rng: random.Random, ratio: float = 0.9) -> None:
        self.check(window, ratio)
        self.backoff = backoff
        self.window = window
        self.ratio = ratio
        self.rng = rng
        self.state = self.OPEN
        self.recent: OrderedDict[str, bool] = OrderedDict()  # job ID -> failed, oldest first
        self.failing = 0  # failed jobs in ``recent``
        self.level = 0
        self.until = 0.0
        self.probe: str | None = None

    @staticmethod
    def check(window: int, ratio: float) -> None:
        """Refuse a window or a ratio the gate cannot work with (the worker's ``backoff_after``
        and ``backoff_ratio``)."""
        if window < 1:
            raise ValueError("backoff_after must be >= 1")
        if not 0.0 < ratio <= 1.0:
            raise ValueError("backoff_ratio must be in (0, 1]")

    @property
    def quiet(self) -> bool:
        """Open with no failure remembered: a success changes nothing (the common case)."""
        return self.state is self.OPEN and not self.failing

    def allowance(self, now: float) -> tuple[int | None, float | None]:
        """``(max jobs to fetch or None for no limit, time to wait until or None)``."""
        if self.state == self.BACKING_OFF:
            if now < self.until:
                return 0, self.until
            self.state = self.PROBING
            self.probe = None
        if self.state == self.PROBING:
            return (0 if self.probe else 1), None
        return None, None

    def took_probe(self, job_id: str) -> None:
        self.probe = job_id

    def _record(self, job_id: str, failed: bool) -> None:
        recent = self.recent
        before = recent.pop(job_id, None)
        if before:
            self.failing -= 1
        recent[job_id] = failed
        if failed:
            self.failing += 1
        if len(recent) > self.window and recent.popitem(last=False)[1]:
            self.failing -= 1
        if not self.failing:
            recent.clear()  # only successes: nothing to remember (keeps success() cheap)

    def success(self, job_id: str) -> None:
        if self.state is self.OPEN and not self.failing:
            return  # the common case, kept cheap
        if self.state != self.OPEN and (self.state == self.BACKING_OFF or job_id != self.probe):
            self._record(job_id, False)  # an older job: the probe decides
            return
        if self.state == self.PROBING:  # the probe worked: full speed, window forgotten
            self.recent.clear()
            self.failing = 0
        else:
            self._record(job_id, False)
        self.state = self.OPEN
        self.level = 0
        self.probe = None

    def failure(self, job_id: str, now: float) -> float | None:
        """Record a failure; returns the backoff delay if one starts now."""
        self._record(job_id, True)
        if self.state == self.BACKING_OFF:
            return None
        if self.state == self.PROBING and job_id != self.probe:
            return None  # an older job: the probe decides
        if self.state == self.PROBING or (
            len(self.recent) >= self.window and self.failing >= self.ratio * len(self.recent)
        ):
            delay = self.backoff.delay(self.level, self.rng)
            self.level += 1
            self.state = self.BACKING_OFF
            self.until = now + delay
            self.probe = None
            return delay
        return None

    def neutral(self, job_id: str) -> None:
        """The job ended without running the handler (dead-lettered, handed back)."""
        if self.state == self.PROBING and job_id == self.probe:
            self.probe = None
