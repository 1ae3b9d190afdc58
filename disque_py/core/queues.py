"""Queues: per-name ordered sets of queued jobs, their waiters and pause flags.

Theory of operation
-------------------
A queue holds the jobs in state ``queued`` ordered by ``ctime`` (creation
time), so delivery is best-effort FIFO: a job put back after RETRY is usually
older than the ones waiting and goes out first. The order is kept by a
``SortedKeyList`` keyed on ``Job.ctime``; new jobs almost always land at the
tail, which is the cheap case for it.

Clients blocked in GETJOB wait in ``waiters`` (first come, first served).
A waiter record may sit in several queues at once; when it is served or
times out it is marked inactive and every queue skips it lazily, so
unblocking costs O(number of its queues) and never a list scan. ``blocked``
counts the active waiters exactly, for QSTAT and for deciding whether a
queue can be evicted.

A queue is created on demand and evicted when it has been empty, without
waiters, unpaused and idle for a while (see ``Node``'s queue GC), exactly
because its only durable state besides jobs is the pause flag.

The federation fields (import rate, known sources) are kept here too so
that NEEDJOBS/YOURJOBS can be added without changing the layout.
"""

from __future__ import annotations

from collections import deque
from operator import attrgetter

from sortedcontainers import SortedKeyList

from .job import Job

__all__ = ["Queue", "Waiter", "PAUSED_IN", "PAUSED_OUT", "PAUSED_ALL", "pause_name"]

PAUSED_IN = 1
PAUSED_OUT = 2
PAUSED_ALL = 3
_PAUSE_NAMES = ("none", "in", "out", "all")

IMPORT_RATE_WINDOW_MS = 5000

_ctime_key = attrgetter("ctime")


def pause_name(flags: int) -> str:
    return _PAUSE_NAMES[flags & PAUSED_ALL]


class Waiter:
    """A client blocked in GETJOB (one record, shared by all its queues)."""

    __slots__ = ("client", "queues", "deadline", "count", "withcounters", "active")

    def __init__(self, client: int, queues: list[bytes], deadline: int, count: int, withcounters: bool):
        self.client = client
        self.queues = queues
        self.deadline = deadline  # monotonic ms, 0 = forever
        self.count = count
        self.withcounters = withcounters
        self.active = True


class Queue:
    __slots__ = (
        "name",
        "jobs",
        "ctime",
        "atime",
        "flags",
        "waiters",
        "blocked",
        "jobs_in",
        "jobs_out",
        "seq",
        # federation (NEEDJOBS / YOURJOBS)
        "sources",
        "import_cur_time",
        "import_cur_count",
        "import_prev_time",
        "import_prev_count",
        "needjobs_bcast_time",
        "needjobs_bcast_attempt",
        "needjobs_adhoc_time",
        "needjobs_adhoc_attempt",
        "asked",
    )

    def __init__(self, name: bytes, now: int, seq: int) -> None:
        self.name = name
        self.jobs: SortedKeyList = SortedKeyList(key=_ctime_key)
        self.ctime = now
        self.atime = now
        self.flags = 0
        self.waiters: deque[Waiter] = deque()
        self.blocked = 0
        self.jobs_in = 0
        self.jobs_out = 0
        self.seq = seq
        self.sources: dict[str, int] = {}
        self.import_cur_time = now
        self.import_cur_count = 0
        self.import_prev_time = now
        self.import_prev_count = 0
        self.needjobs_bcast_time = 0
        self.needjobs_bcast_attempt = 0
        self.needjobs_adhoc_time = 0
        self.needjobs_adhoc_attempt = 0
        # peer -> [time of our last NEEDJOBS to it, count asked, jobs received since]:
        # our view of the push lease that request opened there
        self.asked: dict[str, list[int]] = {}

    def __len__(self) -> int:
        return len(self.jobs)

    # -- jobs ---------------------------------------------------------------
    def add(self, job: Job) -> None:
        self.jobs.add(job)
        self.jobs_in += 1

    def remove(self, job: Job) -> None:
        self.jobs.remove(job)

    def pop(self) -> Job | None:
        """Oldest job by ctime, or None. Counts a job out."""
        if not self.jobs:
            return None
        self.jobs_out += 1
        return self.jobs.pop(0)

    # -- waiters ------------------------------------------------------------
    def add_waiter(self, waiter: Waiter) -> None:
        self.waiters.append(waiter)
        self.blocked += 1
        # Drop stale records now and then so the deque stays proportional
        # to the number of clients really blocked here.
        if len(self.waiters) > 2 * self.blocked + 32:
            self.waiters = deque(w for w in self.waiters if w.active)

    def first_waiter(self) -> Waiter | None:
        waiters = self.waiters
        while waiters:
            w = waiters[0]
            if w.active:
                return w
            waiters.popleft()
        return None

    # -- federation stats -----------------------------------------------------
    def note_import(self, now: int) -> None:
        if now - self.import_cur_time > 1000:
            self.import_prev_time = self.import_cur_time
            self.import_prev_count = self.import_cur_count
            self.import_cur_time = now
            self.import_cur_count = 0
        self.import_cur_count += 1

    def import_rate(self, now: int) -> int:
        """Rough jobs/s imported from other nodes over the last seconds."""
        if now - self.import_cur_time > IMPORT_RATE_WINDOW_MS:
            return 0
        count = self.import_prev_count + self.import_cur_count
        if not count:
            return 0
        elapsed = max(50, now - self.import_prev_time)
        return -(-count * 1000 // elapsed)  # ceil
