"""Memory: the maxmemory policy, as a plain state machine.

Theory of operation
-------------------
The node reads one measure, ``used``: an estimate of what its data takes
(jobs, their bodies and queue names, queues, tombstones), computed here from
counts (``estimate``), plus whatever the shell adds to it. INFO memory shows
the process's RSS beside it (read when asked), but the policy does not read RSS:

* RSS includes the interpreter and its modules (tens of MB before the first
  job), so a limit such as Disque's own tests set (``maxmemory 3mb``, or 1
  byte) would be crossed at start by a node holding nothing;
* RSS hardly shrinks after the jobs are gone (pymalloc keeps partly used
  arenas, the C allocator keeps its heap), so a node read by its RSS would
  stay at its highest level after draining, refusing jobs for good;
* the estimate goes down as soon as jobs leave, like Disque's count of
  allocated bytes (``zmalloc_used_memory``) that its policy reads.

The estimate's per-item costs were measured with ``tracemalloc`` on the core
(a queued job of REPLICATE 1 with its table, timer heap and queue entries:
about 590 bytes plus its body; a queue with its sorted list: about 650
bytes, with the deque it now keeps its jobs in: 390 more). The bytes of the bodies and queue names are counted exactly by the
job table as jobs come and go (``JobStore.item_bytes``: two ``len`` per
registration), so an estimate is a few multiplications, and a measure that
finds the level unchanged costs two comparisons (``_down_at``, ``_up_at``:
the bytes at which the level would change, computed when it last did).

The level (``ctx.memory_level``) follows Disque's warning levels:

====  ========================  =============================================
0     used < 75 % of maxmemory  nothing
1     >= 75 %                   new jobs are replicated externally: REPLICATE
                                copies on other nodes, none here, then one of
                                them is told to queue it (``replication.py``);
                                REPLJOB from peers is ignored; idle empty
                                queues are evicted after 10 s, not 5 min
2     >= 95 %                   ``free`` also lets go what breaks no
                                guarantee: delivered RETRY 0 jobs (never
                                queued again) and acked jobs whose GC can end
                                (an attempt now); idle queues go after 2 s
3     >= 100 %                  the commands that grow memory (declared
                                ``denyoom``, Disque's "m" flag: ADDJOB,
                                ENQUEUE, NACK; ``node.OOM_COMMANDS``) are
                                refused with ``OOM_ERROR``; GETJOB, ACKJOB, FASTACK,
                                DELJOB, WORKING, the queue commands and the
                                bus keep working, so a full node drains
====  ========================  =============================================

A level goes down only once ``used`` is ``HYSTERESIS`` percentage points
below its threshold, so a node hovering at one does not flap (and log) at
every measure. ``set_limit`` (CONFIG SET maxmemory) re-levels at once.

Receives ``Lifecycle`` (deletion, the tombstones counted) and ``Acks`` (a GC attempt), and
from ``Node`` the one call it makes upward, ``on_level`` (a crossing of level 3: ``Node``
swaps its command table, so a command pays nothing for the check); called by the shell
(``server/dispatch.py``), which measures, logs each crossing and calls ``free`` while the
level is 2 or more.
"""

from __future__ import annotations

from typing import Callable, Final, final

from .acks import Acks
from .context import Context
from .job import ACKED, F_DELIVERED
from .lifecycle import Lifecycle
from .replies import Error

__all__ = [
    "Memory",
    "OOM_ERROR",
    "THRESHOLDS",
    "HYSTERESIS",
    "JOB_OVERHEAD",
    "QUEUE_OVERHEAD",
    "TOMBSTONE_OVERHEAD",
    "level_of",
]

#: Percent of maxmemory at which each level starts (level 1, 2, 3).
THRESHOLDS: Final = (75, 95, 100)
#: A level is left only this many percentage points below its threshold.
HYSTERESIS: Final = 2
#: Measured per-item costs in bytes (see the module docstring).
JOB_OVERHEAD: Final = 560  # plus len(body) + len(queue name)
QUEUE_OVERHEAD: Final = 1040  # plus len(name)
TOMBSTONE_OVERHEAD: Final = 120
FREE_BATCH: Final = 1000  # jobs looked at per ``free`` call
GC_SOONER_MS: Final = 1000  # an acked job whose next GC attempt is further than this gets one now

#: The reply of a command declared ``denyoom`` at level 3 (``node.OOM_COMMANDS``).
OOM_ERROR: Final = Error("OOM command not allowed when used memory > 'maxmemory'.")

LEVEL_NAMES: Final = ("ok", "replicate-externally", "free", "oom")


def level_of(used: int, limit: int, current: int = 0) -> int:
    """The level for ``used`` bytes of ``limit``, coming from ``current`` (hysteresis down)."""
    if limit <= 0:
        return 0
    pct = used * 100
    level = 0
    for i, threshold in enumerate(THRESHOLDS):
        if pct >= limit * threshold:
            level = i + 1
    # Going down, a level is kept until ``used`` is HYSTERESIS points below its threshold.
    while current > level:
        if pct >= limit * (THRESHOLDS[current - 1] - HYSTERESIS):
            return current
        current -= 1
    return level


@final
class Memory:
    """The node's memory level and what it lets go. See the module docstring."""

    def __init__(self, ctx: Context, lifecycle: Lifecycle, acks: Acks, on_level: Callable[[int], None]) -> None:
        self.ctx = ctx
        self._lifecycle = lifecycle
        self._acks = acks
        self._store = ctx.store
        self._queues = ctx.queues
        self._tombstones = lifecycle.tombstones
        self._limit = 1024**3
        self.frees = True  # maxmemory-policy acks; noeviction: nothing is let go
        self.used = 0
        self.level = 0
        self._on_level = on_level  # the level crossed 3 either way: Node swaps its commands
        self._down_at, self._up_at = self._bounds(0)  # used in [down_at, up_at): level unchanged
        self._free_cursor = 0
        self.freed_jobs = 0
        self.gc_attempts = 0
        self.refused = 0  # commands answered OOM_ERROR

    # -- the measure -------------------------------------------------------------------
    def estimate(self) -> int:
        """Bytes the node's data takes, from counts (and the exact bytes of bodies and names)."""
        store = self._store
        return (
            len(store) * JOB_OVERHEAD + store.item_bytes
            + len(self._queues) * (QUEUE_OVERHEAD + 16)
            + len(self._tombstones) * TOMBSTONE_OVERHEAD
        )  # fmt: skip

    def update(self, now: int) -> tuple[int, int] | None:
        """Measure again; returns ``(old, new)`` when the level changed, else None."""
        used = self.used = self.estimate()
        if self._down_at <= used < self._up_at:
            return None  # the level cannot have changed
        return self._relevel()

    @property
    def limit(self) -> int:
        """maxmemory in bytes (0: no limit)."""
        return self._limit

    @limit.setter
    def limit(self, limit: int) -> None:
        self._limit = limit
        self._down_at, self._up_at = 1, 0  # the next update levels again

    def set_limit(self, limit: int, now: int | None = None) -> tuple[int, int] | None:
        """maxmemory changed (at start, CONFIG SET): takes effect at once."""
        self.limit = limit
        if now is not None:
            return self.update(now)
        return self._relevel()

    def _relevel(self) -> tuple[int, int] | None:
        old = self.level
        new = level_of(self.used, self.limit, old)
        self._down_at, self._up_at = self._bounds(new)
        if new == old:
            return None
        self.level = new
        self.ctx.memory_level = new
        if (old >= 3) != (new >= 3):
            self._on_level(new)
        return old, new

    def _bounds(self, level: int) -> tuple[int, int]:
        """The range of ``used`` over which ``level`` stays as it is: from the bytes under which it
        goes down (its threshold less the hysteresis) to the next level's threshold."""
        limit = self.limit
        if limit <= 0:
            return 0, 1 << 62  # no limit: always level 0
        down = -1 if level == 0 else -(-limit * (THRESHOLDS[level - 1] - HYSTERESIS) // 100)
        up = 1 << 62 if level >= len(THRESHOLDS) else -(-limit * THRESHOLDS[level] // 100)
        return down, up

    def oom_error(self) -> Error:
        """``OOM_ERROR`` (Redis's text, which clients match) with the two numbers behind it."""
        return Error("%s (used_memory %d, the estimate of the node's data; maxmemory %d)"
                     % (OOM_ERROR, self.used, self.limit))  # fmt: skip

    def threshold_bytes(self, level: int) -> int:
        return self.limit * THRESHOLDS[level - 1] // 100

    # -- letting go --------------------------------------------------------------------
    def free(self, now: int) -> int:
        """At level 2 or more: let go of what breaks no guarantee, ``FREE_BATCH`` jobs looked
        at per call, where the last call stopped. Returns the jobs deleted here."""
        if self.level < 2 or not self.frees:
            return 0
        store = self._store
        freed = 0
        seen = 0
        cursor = 0
        for job in store.scan_from(self._free_cursor):
            if seen >= FREE_BATCH:
                cursor = store.cursor_of(job)
                break
            seen += 1
            if job.state == ACKED:
                # Its GC can end: one attempt now (it deletes the job if every holder has
                # confirmed, or asks them again) instead of waiting for its backoff.
                if job.next_at - now > GC_SOONER_MS:  # an acked job's next_at: its next GC attempt
                    self.gc_attempts += 1
                    before = len(store)
                    self._acks.try_gc(job)
                    if len(store) < before:
                        freed += 1
            elif job.retry == 0 and job.flags & F_DELIVERED and job.queue is not None:
                # Delivered at most once: it is never queued again, only waits for its ACK or
                # TTL. Disque lets it go under memory pressure too.
                self._lifecycle.delete_job(job)
                freed += 1
        self._free_cursor = cursor
        self.freed_jobs += freed
        return freed

    def info(self) -> dict[str, object]:
        return {
            "memory_level": self.level,
            "memory_level_name": LEVEL_NAMES[self.level],
            "maxmemory_replicate_externally_at": self.threshold_bytes(1),
            "maxmemory_free_at": self.threshold_bytes(2),
            "maxmemory_oom_at": self.threshold_bytes(3),
            "memory_freed_jobs": self.freed_jobs,
            "memory_gc_attempts": self.gc_attempts,
            "memory_oom_refused": self.refused,
        }
