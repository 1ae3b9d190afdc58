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
queue can be evicted. ``waiters`` is a plain list read from ``whead`` on
(compacted once half of it is behind the head), not a deque: a deque
costs 760 bytes even with one entry, and one GETJOB may block on many
queues.

An empty queue costs little: its sorted list is made with its first job
and ``waiters`` is an empty tuple while nobody waits (a queue with neither
took 1.5 KB; a GETJOB naming 300,000 queues made that many).

A queue is created on demand and evicted when it has been empty, without
waiters, unpaused and idle for a while (``Blocking.gc_queues``), exactly
because its only durable state besides jobs is the pause flag.

The federation fields (import rate, known sources) are kept here too so
that NEEDJOBS/YOURJOBS can be added without changing the layout.
"""

from __future__ import annotations

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
        "ltime",
        "flags",
        "waiters",
        "whead",
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
        self.jobs: SortedKeyList | tuple = ()  # the sorted list once a job was added
        self.ctime = now
        self.atime = now
        self.ltime = 0  # when a local client last took a job from it or waited on it (0: never)
        self.flags = 0
        self.waiters: list[Waiter] | tuple = ()  # FIFO from index whead on
        self.whead = 0
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
        jobs = self.jobs
        if type(jobs) is tuple:
            jobs = self.jobs = SortedKeyList(key=_ctime_key)
        jobs.add(job)
        self.jobs_in += 1

    def release(self) -> None:
        """An empty queue gives back its sorted list (an empty one still takes about 370 bytes);
        :meth:`add` makes a new one."""
        if not self.jobs:
            self.jobs = ()

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
        waiters = self.waiters
        if waiters:
            waiters.append(waiter)  # type: ignore[union-attr]
        else:
            self.waiters = [waiter]
            self.whead = 0
        self.blocked += 1
        # Drop stale records now and then so the list stays proportional
        # to the number of clients really blocked here.
        if len(self.waiters) - self.whead > 2 * self.blocked + 32:
            self.waiters = [w for w in self.waiters[self.whead :] if w.active]
            self.whead = 0

    def first_waiter(self) -> Waiter | None:
        """The longest-waiting active waiter (it stays in the list until it is inactive)."""
        waiters = self.waiters
        head = i = self.whead
        n = len(waiters)
        found = None
        while i < n:
            w = waiters[i]
            if w.active:
                found = w
                break
            i += 1
        if i != head:
            if i >= 32 and 2 * i >= n:
                del waiters[:i]  # type: ignore[union-attr]
                i = 0
            self.whead = i
        return found

    def clear_waiters(self) -> None:
        """Nobody waits here any more (``blocked`` is 0): forget the stale records."""
        self.waiters = ()
        self.whead = 0

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
