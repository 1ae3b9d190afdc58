"""The job registry and the one schedule that drives every job timer.

Theory of operation
-------------------
Every job a node knows is in ``jobs`` (ID -> Job), whatever its state.

Each job has at most one pending wake-up, ``Job.awake``: the earliest of its
requeue time (minus the WILLQUEUE advance when one must be announced), its
expiry, and for acked jobs its next GC attempt. All wake-ups live in one
binary heap of ``(awake, seq, job)`` entries. Changing a job's wake-up pushes
a new entry and leaves the old one behind; an entry is live only while its
time still equals ``job.awake`` and the job is still registered, so stale
entries are skipped when they surface. The heap is rebuilt when stale
entries outnumber live ones, which keeps memory proportional to jobs.

No trio task, no timer object per job: the shell asks ``next_awake()`` and
sleeps until then (or until input arrives), then calls the node's ``tick``.
"""

from __future__ import annotations

import heapq
from bisect import bisect_left
from typing import Callable, Iterator

from .job import Job

__all__ = ["JobStore"]

_seq_key: Callable[[Job], int] = lambda j: j.seq  # noqa: E731


class JobStore:
    __slots__ = ("jobs", "_heap", "_seq")

    def __init__(self) -> None:
        self.jobs: dict[bytes, Job] = {}
        self._heap: list[tuple[int, int, Job]] = []
        self._seq = 0

    def __len__(self) -> int:
        return len(self.jobs)

    def __contains__(self, job_id: bytes) -> bool:
        return job_id in self.jobs

    def get(self, job_id: bytes) -> Job | None:
        return self.jobs.get(job_id)

    def register(self, job: Job) -> bool:
        if job.id in self.jobs:
            return False
        self._seq += 1
        job.seq = self._seq
        self.jobs[job.id] = job
        return True

    def unregister(self, job: Job) -> bool:
        if self.jobs.get(job.id) is not job:
            return False
        del self.jobs[job.id]
        job.awake = 0  # invalidates its heap entries
        return True

    def clear(self) -> None:
        for job in self.jobs.values():
            job.awake = 0
        self.jobs.clear()
        self._heap.clear()

    # -- schedule -------------------------------------------------------------
    def schedule(self, job: Job, at: int) -> None:
        """Set the job's single wake-up time (monotonic ms)."""
        if at == job.awake:
            return
        job.awake = at
        heapq.heappush(self._heap, (at, job.seq, job))
        if len(self._heap) > 2 * len(self.jobs) + 1024:
            self._compact()

    def _compact(self) -> None:
        self._heap = [(j.awake, j.seq, j) for j in self.jobs.values() if j.awake]
        heapq.heapify(self._heap)

    def _live_top(self) -> tuple[int, int, Job] | None:
        heap = self._heap
        jobs = self.jobs
        while heap:
            entry = heap[0]
            job = entry[2]
            if entry[0] == job.awake and jobs.get(job.id) is job:
                return entry
            heapq.heappop(heap)
        return None

    def next_awake(self) -> int | None:
        top = self._live_top()
        return top[0] if top else None

    def pop_due(self, now: int, limit: int = 10000) -> list[Job]:
        """Jobs whose wake-up time has come, earliest first (at most ``limit``).

        Their heap entries are consumed; the caller must reschedule each job
        (or unregister it) after processing.
        """
        due: list[Job] = []
        heap = self._heap
        while len(due) < limit:
            top = self._live_top()
            if top is None or top[0] > now:
                break
            heapq.heappop(heap)
            job = top[2]
            job.awake = 0
            due.append(job)
        return due

    # -- scanning (JSCAN) ------------------------------------------------------
    def scan_from(self, cursor: int) -> Iterator[Job]:
        """Jobs registered with ``seq >= cursor``, in registration order.

        Dict order is registration order and ``seq`` only grows, so a cursor
        survives any number of insertions and deletions between calls: every
        job present for the whole scan is returned exactly once.
        """
        values = list(self.jobs.values())
        start = bisect_left(values, cursor, key=_seq_key)
        return iter(values[start:])
