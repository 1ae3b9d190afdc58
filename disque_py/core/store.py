"""The job registry and the one schedule that drives every job timer.

Theory of operation
-------------------
Every job a node knows is in the job table (ID -> Job), whatever its state.
The table is split into ``SHARDS`` dicts by the ID's hash. A dict that runs
out of slots (by growing, or after enough deletions, since deleted slots are
only reclaimed then) is rebuilt whole in one step: one dict of 1.4M jobs
stopped the node for about 0.7 s on our benchmark machine; a shard is 1/64th
of that.

Each job has at most one pending wake-up, ``Job.awake``: the earliest of its
requeue time (minus the WILLQUEUE advance when one must be announced), its
expiry, and for acked jobs its next GC attempt (``Lifecycle.reschedule`` in
``lifecycle.py`` computes it; this module only keeps it). All wake-ups live in one
binary heap of ``(awake, job)`` entries: two jobs due in the same millisecond
come in registration order (``Job.__lt__`` compares ``seq``; a number in the entry
would be one more object: 32 bytes a job). Changing a job's wake-up pushes a new entry and leaves the old one behind; an entry is live only while its
time still equals ``job.awake`` and the job is still registered, so stale
entries are skipped when they surface (and a job found twice is returned
once: taking it sets ``awake`` to 0).

Stale entries pile up (three or so per job that is delivered and acked), so
the heap is rebuilt once they outnumber the live ones. Not in one step: that
took 0.65 s with a million jobs. A rebuild walks the table a few jobs per
``schedule`` call (``REBUILD_SLICE``) into a new heap, which also receives
every entry pushed meanwhile; when the walk is done the new heap replaces the
old one, whose entries are then let go a slice at a time as well.

No trio task, no timer object per job: the shell asks ``next_awake()`` and
sleeps until then (or until input arrives), then calls the node's ``tick``.
"""

from __future__ import annotations

import heapq
from bisect import bisect_left
from itertools import chain, islice
from typing import Any, Callable, Final, Iterable, Iterator, final

from .job import Job

__all__ = ["JobStore", "SHARDS", "REBUILD_SLICE", "seq_of", "scan", "J_LOAD", "J_ACTIVE", "J_ACKED", "J_DEL", "J_GONE"]

# The journal (``JobStore.journal``, ``Context.journal``): what the AOF must learn, as
# (kind, job) pairs appended by the machines while a node has an AOF, None otherwise. The
# shell turns them into records (persistence/records.py) at the end of each pass, so a job
# created and changed within one pass is written once, in its latest state.
J_LOAD: Final = 0  # a job's whole state: registered here, or its replication achieved
J_ACTIVE: Final = 1  # a RETRY 0 job was delivered: never to be queued again
J_ACKED: Final = 2  # acknowledged
J_DEL: Final = 3  # forgotten here
J_GONE: Final = 4  # a DEDUP job forgotten here: its ID is remembered until job.next_at (dedup.py)

SHARDS: Final = 64  # a power of two
_MASK: Final = SHARDS - 1
REBUILD_SLICE: Final = 4  # jobs carried into the new heap per schedule() while rebuilding
DROP_SLICE: Final = 256  # old heap entries let go per schedule() after a rebuild


def seq_of(item: Any) -> int:
    """Registration order of a job (or of a queue: anything with ``seq``), the scan key.
    (``Any``: compiled, an argument typed ``Job`` is checked to be one.)"""
    return item.seq


@final
class JobStore:
    __slots__ = (
        "_shards", "_count", "_heap", "_seq", "_next", "_todo", "_shard_at", "_old", "rebuilds", "journal", "item_bytes",
    )  # fmt: skip

    def __init__(self) -> None:
        self._shards: list[dict[bytes, Job]] = [{} for _ in range(SHARDS)]
        self._count = 0
        self._heap: list[tuple[int, Job]] = []
        self._seq = 0
        self._next: list[tuple[int, Job]] | None = None  # the heap being rebuilt
        self._todo: list[Job] = []  # jobs of the current shard still to carry into it
        self._shard_at = 0  # next shard to walk
        self._old: list[tuple[int, Job]] = []  # a replaced heap, let go a slice at a time
        self.rebuilds = 0  # heap rebuilds completed (INFO memory: timer_heap_rebuilds)
        self.journal: list | None = None  # see J_LOAD; set by Node.set_journal
        # Bytes of the bodies and queue names of the jobs held, kept exact at (un)registration
        # (a job's body and queue never change while it is registered): core/memory.py's estimate.
        self.item_bytes = 0

    def __len__(self) -> int:
        return self._count

    def __contains__(self, job_id: bytes) -> bool:
        return job_id in self._shards[hash(job_id) & _MASK]

    def get(self, job_id: bytes) -> Job | None:
        return self._shards[hash(job_id) & _MASK].get(job_id)

    def count_done(self, ids: Iterable[bytes], act: Callable[[Job], bool]) -> int:
        """How many of ``ids`` name a job held here for which ``act(job)`` did something: the
        reply of the commands that take IDs and count (DELJOB, ENQUEUE, NACK, DEQUEUE)."""
        done = 0
        shards = self._shards
        for job_id in ids:
            job = shards[hash(job_id) & _MASK].get(job_id)
            if job is not None and act(job):
                done += 1
        return done

    def values(self) -> list[Job]:
        """Every job (a list: the table may change while the caller walks it)."""
        return list(chain.from_iterable(shard.values() for shard in self._shards))

    def items(self) -> list[tuple[bytes, Job]]:
        return list(chain.from_iterable(shard.items() for shard in self._shards))

    def register(self, job: Job) -> bool:
        shard = self._shards[hash(job.id) & _MASK]
        if job.id in shard:
            return False
        self._seq += 1
        job.seq = self._seq
        shard[job.id] = job
        self._count += 1
        self.item_bytes += len(job.body or b"") + len(job.queue or b"")
        if self.journal is not None:
            self.journal.append((J_LOAD, job))
        return True

    def unregister(self, job: Job) -> bool:
        shard = self._shards[hash(job.id) & _MASK]
        if shard.get(job.id) is not job:
            return False
        del shard[job.id]
        self._count -= 1
        self.item_bytes -= len(job.body or b"") + len(job.queue or b"")
        job.awake = 0  # invalidates its heap entries
        if self.journal is not None:
            self.journal.append((J_DEL, job))
        return True

    def clear(self) -> None:
        for shard in self._shards:
            for job in shard.values():
                job.awake = 0
            shard.clear()
        self._count = 0
        self.item_bytes = 0
        self._heap = []
        self._next = None
        self._todo = []
        self._old = []

    # -- schedule -------------------------------------------------------------
    def schedule(self, job: Job, at: int) -> None:
        """Set the job's single wake-up time (monotonic ms)."""
        if at == job.awake:
            return
        job.awake = at
        entry = (at, job)
        heapq.heappush(self._heap, entry)
        if self._next is not None:
            heapq.heappush(self._next, entry)
            self._carry()
        elif len(self._heap) > 2 * self._count + 1024:
            self._next = []
            self._shard_at = 0
            self._carry()
        if self._old:
            del self._old[-DROP_SLICE:]

    @property
    def timer_entries(self) -> int:
        """Heap entries held, stale ones included (a rebuild's two heaps and the old one's rest)."""
        return len(self._heap) + len(self._next or ()) + len(self._old)

    @property
    def rebuilding(self) -> bool:
        return self._next is not None

    def _carry(self) -> None:
        """Move the rebuild on by REBUILD_SLICE jobs; swap the heaps when it is done."""
        new = self._next
        assert new is not None
        todo = self._todo
        for _ in range(REBUILD_SLICE):
            while not todo:
                if self._shard_at == SHARDS:
                    self._old, self._heap, self._next = self._heap, new, None
                    self.rebuilds += 1
                    return
                todo = self._todo = list(self._shards[self._shard_at].values())
                self._shard_at += 1
            job = todo.pop()
            if job.awake:
                heapq.heappush(new, (job.awake, job))

    def _live_top(self) -> tuple[int, Job] | None:
        heap = self._heap
        shards = self._shards
        while heap:
            entry = heap[0]
            job = entry[1]
            if entry[0] == job.awake and shards[hash(job.id) & _MASK].get(job.id) is job:
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
            job = top[1]
            job.awake = 0
            due.append(job)
        return due

    # -- scanning (JSCAN) ------------------------------------------------------
    # A JSCAN cursor names a shard and a registration number: ``seq * SHARDS + shard``.
    # A scan walks the shards in turn, each in registration order (dict order; ``seq``
    # only grows), so a cursor survives any number of insertions and deletions between
    # calls: every job present for the whole scan is returned exactly once. A call
    # copies only the shards it walks, not the whole table.
    @staticmethod
    def cursor_of(job: Job) -> int:
        return job.seq * SHARDS + (hash(job.id) & _MASK)

    def scan_from(self, cursor: int) -> Iterator[Job]:
        """The jobs from ``cursor`` on (0: from the start), in scan order, lazily."""
        first, seq = cursor & _MASK, cursor // SHARDS
        for i in range(first, SHARDS):
            values = list(self._shards[i].values())
            start = bisect_left(values, seq, key=seq_of) if i == first and seq else 0
            yield from islice(values, start, None)


def scan(
    items: Iterable[Any], cursor_of: Callable[[Any], int], count: int, busyloop: bool, match: Callable[[Any], bool]
) -> tuple[int, list]:
    """Generic cursor scan (JSCAN, QSCAN): ``items`` in scan order from the cursor on
    (``JobStore.scan_from`` for jobs). Returns the next cursor (``cursor_of`` the first item
    not looked at; 0: done) and the matches; it looks at no more than ten times ``count``
    items, unless BUSYLOOP."""
    found: list = []
    budget = count * 10
    for item in items:
        if not busyloop and (len(found) >= count or budget <= 0):
            return cursor_of(item), found
        budget -= 1
        if match(item):
            found.append(item)
    return 0, found
