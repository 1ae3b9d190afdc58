"""Queues: per-name ordered sets of queued jobs, their waiters and pause flags.

Theory of operation
-------------------
A queue holds the jobs in state ``queued`` ordered by ``ctime`` (creation
time), so delivery is best-effort FIFO: a job put back after RETRY is usually
older than the ones waiting and goes out first.

New jobs almost always land at the tail and leave from the head, so a queue
keeps its jobs in a ``deque`` while that is cheap: an add at the tail is an
append, a delivery a ``popleft`` (a ``SortedKeyList`` spent about 190 Python
opcodes per job on the same two steps, 8 % of a whole add-get-ack). A job
older than the tail (put back after RETRY, imported from a peer) is inserted
in place, and one that leaves from the middle (acked or dequeued while queued)
is removed, both in C while the queue holds at most ``SMALL_QUEUE`` jobs.
Past that the queue turns into a ``SortedKeyList`` keyed on ``Job.ctime``
(O(log n) for both) until it is empty again: a long queue never pays a
linear step per job.

Clients blocked in GETJOB wait in ``waiters`` (first come, first served).
A waiter record may sit in several queues at once; when it is served or
times out it is marked inactive and every queue skips it lazily, so
unblocking costs O(number of its queues) and never a list scan. ``blocked``
counts the active waiters exactly, for QSTAT and for deciding whether a
queue can be evicted. ``waiters`` is a plain list read from ``whead`` on
(compacted once half of it is behind the head), not a deque: a deque
costs 760 bytes even with one entry, and one GETJOB may block on many
queues.

An empty queue costs little: its job container is made with its first job
and ``waiters`` is an empty tuple while nobody waits (a queue with neither
took 1.5 KB; a GETJOB naming 300,000 queues made that many).

A queue is created on demand and evicted when it has been empty, without
waiters, unpaused and idle for a while (``Blocking.gc_queues``), exactly
because its only durable state besides jobs is the pause flag.

Priorities (ADDJOB's PRIORITY, ours): a queue whose jobs are all at the default
priority (``job.PRIORITY_DEFAULT``) is the queue above, FIFO by ctime, and pays
one flag test per job added. A job with another priority turns the queue into
a ``SortedKeyList`` keyed on (priority, highest first; then ``ctime``), until
it is empty again: GETJOB, QPEEK and the jobs given to a peer that asks
(NEEDJOBS) all read the queue from its head, so they get the highest priority
first, FIFO within a priority. The deque and the list keyed on ctime hold only
jobs of the default priority.

Groups (ADDJOB's GROUP, ours): a job with a group turns the queue into a
``groups.GroupedJobs`` (priorities first, then the groups in turn, FIFO within
a group: see groups.py) until it is empty again. Both a priority and a group
are told by the job's flags (``job.F_ORDERED``), so a plain job pays the same
one flag test.

The federation fields (import rate, known sources) are kept here too so
that NEEDJOBS/YOURJOBS can be added without changing the layout.
"""

from __future__ import annotations

from bisect import bisect_right
from collections import deque
from itertools import islice
from operator import attrgetter
from typing import Any, Final, Iterable, final

from sortedcontainers import SortedKeyList

from .groups import GroupedJobs, GroupTable
from .job import F_GROUP, F_ORDERED, PRIORITY_MAX, Job, job_priority
from .statics import DEQUE


__all__ = ["Queue", "Waiter", "PAUSED_IN", "PAUSED_OUT", "PAUSED_ALL", "PAUSE_NAMES", "pause_name", "SMALL_QUEUE"]

PAUSED_IN: Final = 1
PAUSED_OUT: Final = 2
PAUSED_ALL: Final = 3
#: a queue's pause flags (``flags & PAUSED_ALL``) -> its name (PAUSE, QSTAT, the admin port)
PAUSE_NAMES: Final = ("none", "in", "out", "all")

IMPORT_RATE_WINDOW_MS: Final = 5000
#: up to this many jobs a queue inserts out of order and removes from the middle in its deque;
#: past it, it becomes a sorted list (see the module docstring)
SMALL_QUEUE = 512

_ctime_key = attrgetter("ctime")


def _priority_key(job: Job) -> int:
    """A prioritized queue's order: the highest priority first, then the oldest (ctime < 2**63)."""
    return (PRIORITY_MAX - job_priority(job)) << 64 | job.ctime


#: The group settings of a queue made outside a node (tests): every weight the default.
_NO_SETTINGS: Final = GroupTable()


def pause_name(flags: int) -> str:
    return PAUSE_NAMES[flags & PAUSED_ALL]


@final
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


@final
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
        "groups",
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

    def __init__(self, name: bytes, now: int, seq: int, groups: GroupTable | None = None) -> None:
        self.name = name
        self.jobs: deque | SortedKeyList | GroupedJobs | tuple = ()  # () while empty; see the module docstring
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
        self.groups = groups if groups is not None else _NO_SETTINGS  # the node's group settings
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
        jobs: Any = self.jobs  # one of four containers (type() decides)
        if type(jobs) is DEQUE:
            if job.flags & F_ORDERED:  # a priority or a group
                self._ordered(job).add(job)
            elif not jobs or job.ctime >= jobs[-1].ctime:
                jobs.append(job)  # the common case: newest at the tail
            elif len(jobs) < SMALL_QUEUE:
                jobs.insert(bisect_right(jobs, job.ctime, key=_ctime_key), job)
            else:
                self._sorted().add(job)
        elif type(jobs) is tuple:
            if job.flags & F_ORDERED:
                self._ordered(job).add(job)
            else:
                self.jobs = DEQUE((job,))
        elif job.flags & F_ORDERED and type(jobs) is not GroupedJobs and (
            job.flags & F_GROUP or jobs.key is not _priority_key
        ):
            self._ordered(job).add(job)
        else:
            jobs.add(job)
        self.jobs_in += 1

    def _sorted(self) -> SortedKeyList:
        """The queue's jobs as a sorted list from now on (until it is empty again: ``pop``, ``remove``)."""
        jobs = self.jobs = SortedKeyList(self.jobs, key=_ctime_key)  # in order already: one pass
        return jobs

    def _ordered(self, job: Job) -> Any:
        """The container ``job`` needs from now on (until the queue is empty): one that keeps
        groups in turn (``job`` has a group), else a list sorted by priority."""
        if job.flags & F_GROUP:
            grouped = GroupedJobs(self.groups, self.name)
            for old in self.jobs:  # in their order: each group's FIFO kept
                grouped.add(old)
            self.jobs = grouped
            return grouped
        jobs = self.jobs = SortedKeyList(self.jobs, key=_priority_key)
        return jobs

    def release(self) -> None:
        """An empty queue gives back its container (an empty deque still takes 760 bytes, an
        empty sorted list about 370); :meth:`add` makes a new one."""
        if not len(self.jobs):
            self.jobs = ()

    def remove(self, job: Job) -> None:
        jobs: Any = self.jobs  # one of four containers (type() decides)
        if type(jobs) is DEQUE:
            if jobs[0] is job:
                jobs.popleft()
            elif len(jobs) <= SMALL_QUEUE:
                jobs.remove(job)
            else:
                self._sorted().remove(job)
        else:
            jobs.remove(job)
            if not len(jobs):
                self.jobs = ()  # an ordinary queue again (a deque with its next job)

    def pop(self) -> Job | None:
        """The oldest job by ctime (of the highest priority; of the group whose turn it is), or
        None. Counts a job out."""
        jobs: Any = self.jobs  # one of four containers (type() decides)
        if not jobs:
            return None
        if type(jobs) is DEQUE:
            self.jobs_out += 1
            return jobs.popleft()
        job = jobs.pop(0)  # None: every group of a grouped queue at its limit (groups.py)
        if job is None:
            return None
        self.jobs_out += 1
        if not len(jobs):
            self.jobs = ()  # an ordinary queue again (a deque with its next job)
        return job

    def peek(self, count: int) -> Iterable[Job]:
        """The ``count`` oldest jobs, oldest first; ``count`` < 0: the ``-count`` newest, newest
        first (QPEEK). With priorities: the next ``count`` to be delivered, in that order; < 0:
        the last ``-count``, the last first."""
        jobs = self.jobs
        if count >= 0:
            return islice(jobs, count)
        return islice(reversed(jobs), -count)

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
