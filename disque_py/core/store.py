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
binary heap of the jobs themselves, ordered by ``(awake, seq)`` (two jobs due in
the same millisecond come in registration order). Each job knows its place in
it (``Job.hpos``, -1 when it is in none), so a changed wake-up moves the job
up or down in place and unregistering takes it out: the heap holds exactly the
scheduled jobs, one slot each, with no entry object and no stale entries (a
tuple and a boxed time per scheduling were about 96 bytes a job, and stale
ones piled up to several per job that was delivered and acked, which needed
rebuilds of the whole heap, a slice at a time). A job scheduled while not
registered stays in the heap until it is due and is skipped then.

No trio task, no timer object per job: the shell asks ``next_awake()`` and
sleeps until then (or until input arrives), then calls the node's ``tick``.
"""

from __future__ import annotations

from bisect import bisect_left
from itertools import chain, islice
from typing import Callable, Final, Iterable, Iterator, Protocol, TypeVar, final

from .job import Job

__all__ = ["JobStore", "SHARDS", "Sequenced", "seq_of", "scan", "J_LOAD", "J_ACTIVE", "J_ACKED", "J_DEL", "J_GONE"]

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


class Sequenced(Protocol):
    """Anything registered in order: a job (``seq``, this table's) or a queue (its own)."""

    seq: int


T = TypeVar("T")


def seq_of(item: Sequenced) -> int:
    """Registration order of a job or a queue, the scan key. (A protocol, not ``Job``: compiled,
    an argument typed ``Job`` is checked to be one, and queues are scanned by it too.)"""
    return item.seq


@final
class JobStore:
    __slots__ = (
        "_shards", "_count", "_heap", "_seq", "journal", "item_bytes",
    )  # fmt: skip

    def __init__(self) -> None:
        self._shards: list[dict[bytes, Job]] = [{} for _ in range(SHARDS)]
        self._count = 0
        self._heap: list[Job] = []  # ordered by (awake, seq); job.hpos is its index
        self._seq = 0
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
        if job.hpos >= 0:  # scheduled before it was registered: its tie-break changed
            self._down(job.hpos, job)
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
        self._unschedule(job)
        if self.journal is not None:
            self.journal.append((J_DEL, job))
        return True

    def clear(self) -> None:
        for shard in self._shards:
            shard.clear()
        for job in self._heap:
            job.awake = 0
            job.hpos = -1
        self._count = 0
        self.item_bytes = 0
        self._heap = []

    # -- schedule -------------------------------------------------------------
    def schedule(self, job: Job, at: int) -> None:
        """Set the job's single wake-up time (monotonic ms, > 0)."""
        old = job.awake
        if at == old:
            return
        job.awake = at
        pos = job.hpos
        if pos < 0:
            heap = self._heap
            heap.append(job)
            self._up(len(heap) - 1, job)
        elif at < old:
            self._up(pos, job)
        else:
            self._down(pos, job)

    def _up(self, pos: int, job: Job) -> None:
        """Move ``job`` from ``pos`` towards the root until its parent comes before it."""
        heap = self._heap
        at = job.awake
        seq = job.seq
        while pos > 0:
            parent = (pos - 1) >> 1
            other = heap[parent]
            if other.awake < at or (other.awake == at and other.seq <= seq):
                break
            heap[pos] = other
            other.hpos = pos
            pos = parent
        heap[pos] = job
        job.hpos = pos

    def _down(self, pos: int, job: Job) -> None:
        """Move ``job`` from ``pos`` towards the leaves until no child comes before it."""
        heap = self._heap
        n = len(heap)
        at = job.awake
        seq = job.seq
        while True:
            child = 2 * pos + 1
            if child >= n:
                break
            other = heap[child]
            right = child + 1
            if right < n:
                sibling = heap[right]
                if sibling.awake < other.awake or (sibling.awake == other.awake and sibling.seq < other.seq):
                    child = right
                    other = sibling
            if at < other.awake or (at == other.awake and seq <= other.seq):
                break
            other.hpos = pos
            heap[pos] = other
            pos = child
        job.hpos = pos
        heap[pos] = job

    def _unschedule(self, job: Job) -> None:
        """Take ``job`` out of the heap (if it is in it); its wake-up is 0."""
        job.awake = 0
        pos = job.hpos
        if pos < 0:
            return
        job.hpos = -1
        heap = self._heap
        last = heap.pop()
        if last is job:
            return
        if pos > 0:
            parent = heap[(pos - 1) >> 1]
            if last.awake < parent.awake or (last.awake == parent.awake and last.seq < parent.seq):
                self._up(pos, last)
                return
        self._down(pos, last)

    @property
    def timer_entries(self) -> int:
        """Jobs in the heap, one slot each (INFO memory's timer_heap_entries)."""
        return len(self._heap)

    def _registered(self, job: Job) -> bool:
        return self._shards[hash(job.id) & _MASK].get(job.id) is job

    def next_awake(self) -> int | None:
        heap = self._heap
        while heap:
            job = heap[0]
            if self._registered(job):
                return job.awake
            self._unschedule(job)  # scheduled while not registered: nothing to wake
        return None

    def pop_due(self, now: int, limit: int = 10000) -> list[Job]:
        """Jobs whose wake-up time has come, earliest first (at most ``limit``).

        They leave the heap (``awake`` 0); the caller must reschedule each job
        (or unregister it) after processing.
        """
        due: list[Job] = []
        heap = self._heap
        while heap and len(due) < limit:
            job = heap[0]
            if job.awake > now:
                break
            self._unschedule(job)
            if self._registered(job):
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
    items: Iterable[T], cursor_of: Callable[[T], int], count: int, busyloop: bool, match: Callable[[T], bool]
) -> tuple[int, list[T]]:
    """Generic cursor scan (JSCAN, QSCAN): ``items`` in scan order from the cursor on
    (``JobStore.scan_from`` for jobs). Returns the next cursor (``cursor_of`` the first item
    not looked at; 0: done) and the matches; it looks at no more than ten times ``count``
    items, unless BUSYLOOP."""
    found: list[T] = []
    budget = count * 10
    for item in items:
        if not busyloop and (len(found) >= count or budget <= 0):
            return cursor_of(item), found
        budget -= 1
        if match(item):
            found.append(item)
    return 0, found
