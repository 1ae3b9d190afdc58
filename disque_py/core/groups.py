"""Groups: fair turns between the groups of a queue (ADDJOB's GROUP, ours).

Theory of operation
-------------------
A job may name a group (ADDJOB ... GROUP name: a tenant, a customer, a batch); a job
without one is in the default group, b"". Within one queue the groups take turns: GETJOB
(and a peer's NEEDJOBS, which takes jobs the same way: ``Requeue.fetch``) delivers from the
group whose turn it is, FIFO by ctime within it, then passes the turn on. A group's turn
lasts ``weight`` deliveries (GROUP WEIGHT, 1 by default), so a group of weight 3 gets three
jobs for every one of a group of weight 1 while both have jobs waiting. A group that gets
a job while it had none joins the turn at its end: whatever the backlog of the others, its
first job waits at most one turn of each other group (the sum of their weights in
deliveries), never behind a whole backlog.

Priorities come first: a job of a higher priority (ADDJOB's PRIORITY) is delivered before
any job of a lower one, whatever its group. Among the jobs of the highest priority present
the groups take turns as above; each priority keeps its own turn. So PRIORITY says what is
urgent, GROUP who shares what is equally urgent.

The container: a queue whose jobs have neither a priority nor a group is a deque, FIFO
(queues.py), and never meets this module; a queue gets a :class:`GroupedJobs` with its first
job that has a group (``job.F_GROUP``), taking in the jobs it had in their order, and goes
back to a plain queue when it is empty. Inside, one :class:`Level` per priority present
(the highest first: ``order``), each a dict of :class:`Lane` (one group's jobs, FIFO by
ctime) and ``turn``, the lanes with jobs in the order of their turns (the head's turn now).
A delivery is a ``popleft`` from the head lane and, when its turn is over, one rotation of
``turn``: O(1) whatever the number of groups. A job taken from the middle (acked, dequeued
while queued) is found through its group's lane.

``GroupTable`` holds what the node knows of each group's settings (GROUP WEIGHT): the
weights are read by the containers at each turn, so a change applies from the next turn.
It also holds the groups at their limit now (``held``, kept by limits.py): their turn is
skipped (they keep their jobs, and their lane goes to the end of the turn), and a queue
whose every job is in such a group is false (nothing to deliver) though its length is not
0; and the grouped containers of the node (``containers``), so that limits.py counts each
group's waiting jobs without walking every queue.
"""

from __future__ import annotations

from bisect import bisect_right
from collections import deque
from operator import attrgetter
from typing import Any, Final, Iterator, final

from .job import Job, job_group, job_priority

__all__ = ["GroupedJobs", "GroupTable", "Lane", "Level", "WEIGHT_DEFAULT", "WEIGHT_MAX"]

#: A group's weight without GROUP WEIGHT: one delivery per turn.
WEIGHT_DEFAULT: Final = 1
#: The largest weight (deliveries in one turn).
WEIGHT_MAX: Final = 1000

_ctime_key = attrgetter("ctime")


@final
class GroupTable:
    """The groups' settings this node knows (GROUP WEIGHT): read by every grouped queue."""

    __slots__ = ("weights", "held", "unsynced", "view", "containers")

    def __init__(self) -> None:
        self.weights: dict[bytes, int] = {}  # only groups with a weight other than the default
        self.held: set[bytes] = set()  # the groups at their limit now (limits.py)
        # while a node of a cluster (``view.cluster_size`` > 1: the node's context) has not compared
        # its settings with a peer's, every group is held (limits.py: it may not know a limit yet)
        self.unsynced = False
        self.view: Any = None
        self.containers: set[GroupedJobs] = set()  # the grouped queues' containers with jobs

    def weight(self, group: bytes) -> int:
        return self.weights.get(group, WEIGHT_DEFAULT)

    def hold_all(self) -> bool:
        """Whether no group may deliver now: the node is in a cluster and has not synced yet."""
        return self.unsynced and self.view is not None and self.view.cluster_size > 1


@final
class Lane:
    """One group's jobs at one priority, FIFO by ctime."""

    __slots__ = ("group", "jobs", "used")

    def __init__(self, group: bytes) -> None:
        self.group = group
        self.jobs: deque[Job] = deque()
        self.used = 0  # deliveries in its current turn

    def add(self, job: Job) -> None:
        jobs = self.jobs
        if not jobs or job.ctime >= jobs[-1].ctime:
            jobs.append(job)  # the common case: the newest at the tail
        else:  # put back after a RETRY, or imported: in its place
            jobs.insert(bisect_right(jobs, job.ctime, key=_ctime_key), job)


@final
class Level:
    """The lanes of one priority and their turns."""

    __slots__ = ("lanes", "turn")

    def __init__(self) -> None:
        self.lanes: dict[bytes, Lane] = {}
        self.turn: deque[Lane] = deque()  # the lanes with jobs; the head's turn now


@final
class GroupedJobs:
    """A queue's jobs when some have a group: the levels, highest priority first."""

    __slots__ = ("levels", "order", "size", "table", "queue")

    def __init__(self, table: GroupTable, queue: bytes) -> None:
        self.levels: dict[int, Level] = {}
        self.order: list[int] = []  # the priorities present, highest first
        self.size = 0
        self.table = table
        self.queue = queue  # its queue's name
        table.containers.add(self)

    def __len__(self) -> int:
        return self.size

    def __bool__(self) -> bool:
        """Whether a job can be delivered now (not only whether there are jobs: ``len``)."""
        if not self.size or self.table.hold_all():
            return False
        held = self.table.held
        if not held:
            return True
        for level in self.levels.values():
            for lane in level.turn:
                if lane.group not in held:
                    return True
        return False

    def _emptied(self) -> None:
        self.table.containers.discard(self)

    def add(self, job: Job) -> None:
        prio = job_priority(job)
        level = self.levels.get(prio)
        if level is None:
            level = self.levels[prio] = Level()
            order = self.order
            i = 0
            while i < len(order) and order[i] > prio:
                i += 1
            order.insert(i, prio)
        group = job_group(job)
        lane = level.lanes.get(group)
        if lane is None:
            lane = level.lanes[group] = Lane(group)
            level.turn.append(lane)  # a group with jobs again waits for its turn at the end
        lane.add(job)
        self.size += 1

    def pop(self, index: int = 0) -> Job | None:
        """The next job to deliver (``index`` must be 0: as SortedKeyList's ``pop(0)``); None if
        every group with jobs is at its limit (``GroupTable.held``)."""
        if index != 0 or not self.size:
            raise IndexError("GroupedJobs.pop takes the head only")
        if self.table.hold_all():
            return None
        held = self.table.held
        prio = self.order[0]
        level = self.levels[prio]
        turn = level.turn
        lane = turn[0]
        if held and lane.group in held:  # skip the groups at their limit: each to the end
            found: Lane | None = None
            for prio in self.order:
                level = self.levels[prio]
                turn = level.turn
                for _ in range(len(turn)):
                    if turn[0].group not in held:
                        found = turn[0]
                        break
                    turn[0].used = 0
                    turn.rotate(-1)
                if found is not None:
                    break
            if found is None:
                return None
            lane = found
        job = lane.jobs.popleft()
        self.size -= 1
        if not lane.jobs:
            turn.popleft()
            del level.lanes[lane.group]
            if not turn:
                del self.levels[prio]
                self.order.remove(prio)
            if not self.size:
                self._emptied()
        else:
            lane.used += 1
            if lane.used >= self.table.weight(lane.group):
                lane.used = 0
                turn.rotate(-1)  # its turn is over: the next group's
        return job

    def remove(self, job: Job) -> None:
        """Take ``job`` out (ValueError if it is not here)."""
        prio = job_priority(job)
        level = self.levels.get(prio)
        lane = level.lanes.get(job_group(job)) if level is not None else None
        if lane is None or level is None:
            raise ValueError("job not in this queue")
        lane.jobs.remove(job)
        self.size -= 1
        if not lane.jobs:
            level.turn.remove(lane)
            del level.lanes[lane.group]
            if not level.turn:
                del self.levels[prio]
                self.order.remove(prio)
        if not self.size:
            self._emptied()

    def __contains__(self, job: object) -> bool:
        if type(job) is not Job:
            return False
        level = self.levels.get(job_priority(job))  # type: ignore[arg-type]
        lane = level.lanes.get(job_group(job)) if level is not None else None  # type: ignore[arg-type]
        return lane is not None and job in lane.jobs

    def __iter__(self) -> Iterator[Job]:
        """The jobs in the order they would be delivered now (QPEEK; nothing changes)."""
        weight = self.table.weight
        for prio in self.order:
            # each lane: [its jobs' iterator, jobs left, deliveries in its turn, its weight]
            ring: deque[list[Any]] = deque(
                [iter(lane.jobs), len(lane.jobs), lane.used, weight(lane.group)] for lane in self.levels[prio].turn
            )
            while ring:
                e = ring[0]
                yield next(e[0])
                e[1] -= 1
                e[2] += 1
                if e[1] == 0:
                    ring.popleft()
                elif e[2] >= e[3]:
                    e[2] = 0
                    ring.rotate(-1)

    def __reversed__(self) -> Iterator[Job]:
        return reversed(list(self))

    def __getitem__(self, index: int) -> Job:
        """The job at ``index`` in delivery order (the head: O(1) in practice)."""
        if index == 0 and self.size:
            return self.levels[self.order[0]].turn[0].jobs[0]
        return list(self)[index]

    def groups(self) -> dict[bytes, int]:
        """Each group's jobs here (GROUP INFO's waiting)."""
        out: dict[bytes, int] = {}
        for level in self.levels.values():
            for group, lane in level.lanes.items():
                out[group] = out.get(group, 0) + len(lane.jobs)
        return out
