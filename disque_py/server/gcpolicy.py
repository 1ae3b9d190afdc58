"""How a node process uses CPython's cyclic garbage collector.

Why a policy at all
-------------------
Every stored job is a container the collector tracks (the ``Job``; once, its
timer heap entries too). CPython's generational collector examines what survives
again and again: a young collection looks at the objects allocated since the
last one; their survivors move to generation 1, which is examined whole every
20 young collections (with our old thresholds, up to a million objects in one
pause); from there to generation 2, examined whole each time it has grown by
a quarter. A node that holds a million jobs stopped for about 200 ms at each
generation-1 collection and for about a second at each full one, and spent
5-6 % of its CPU examining jobs that could never be garbage.

The node's own objects form no reference cycles: jobs, queues, waiters and
connections are freed by their reference counts. The collector is needed only
for the short-lived cycles of trio's machinery and of exceptions.

The policy
----------
* At start the CLI keeps the collector off through the imports (they make next
  to no garbage; 70-odd collections cost 10-20 ms of the start), and the
  policy freezes what exists without examining it first: the first client is
  served sooner, and the imports' few leftover cycles wait for the first full
  collection.
* Young collections run every ``YOUNG_THRESHOLD`` allocations, as usual, so a
  short-lived cycle is freed within moments.
* A bulk build of long-lived objects (the AOF load at start) runs with the
  collector off (``paused``) and freezes what it built, unexamined.
* After every collection, whatever survived is frozen (``gc.freeze``): moved
  to the permanent generation, which no automatic collection examines. Each
  long-lived object is examined once, young. A frozen object is still freed
  the moment its reference count drops to zero, so deleted jobs give their
  memory back exactly as before.
* What freezing cannot free is a cycle whose objects were alive at a young
  collection and became garbage later. A full collection (thaw, collect all,
  freeze again) frees them; it runs on ``DEBUG GC`` and periodically, and it
  logs how many objects it freed and how long it took. INFO's Memory section
  shows the counters (``gc_*``), so a leak of that kind would show.
* A full collection examines every object: about a second for a node with a
  million jobs. The period adapts to what the collections find: it starts at
  ``FULL_PERIOD_MIN_S`` (an hour), doubles after a periodic collection that
  freed fewer than ``FULL_FREED_LOW`` objects (nothing worth a stop: well
  under a megabyte), up to ``FULL_PERIOD_MAX_S`` (a day), and goes back to
  an hour as soon as one frees more. A node whose code makes no such cycles
  stops once a day; one that leaks is swept hourly, as before.

The longest pause is now a young collection, however many jobs the node holds
(docs/benchmarks-history.md, "Garbage collector"). Its threshold is CPython's own, 700
allocations: a young collection then examines about 700 objects, 70 µs or so, one slice of
the loop no longer than the node's other periodic work (BENCHMARKS.md, "The tail"); at
10,000 it stopped for 1.5-2 ms, and examined no fewer objects in total (the same objects,
fewer at a time, still in the CPU's cache: 18 ms against 55 ms over 100,000 ADDJOBs).
``DISQUE_PY_GC_THRESHOLDS=a,b,c`` restores CPython's plain generational
collector with those thresholds and no freezing (to compare).

Who calls it: ``run_node`` installs the policy (:mod:`.app`), the cron runs
the periodic full collection (:mod:`.timers`), INFO shows its counters and
DEBUG GC runs one (:mod:`.admin`). It depends on nothing of the shell but
the log.
"""

from __future__ import annotations

import gc
import os
import time
from contextlib import contextmanager
from typing import Any, Iterator

from .logs import log

__all__ = ["GcPolicy", "policy"]

YOUNG_THRESHOLD = 700
FULL_PERIOD_MIN_S = 3600.0
FULL_PERIOD_MAX_S = 86400.0
FULL_FREED_LOW = 10_000
FROZEN_COUNT_TTL = 10.0  # seconds INFO's gc_frozen_objects may be old (counting them walks them all)


class GcPolicy:
    """The process's collector policy and its counters (one per process: ``policy``)."""

    def __init__(self) -> None:
        self.installed = False
        self.freezing = False
        self.young_collections = 0
        self.pause_total = 0.0
        self.pause_longest = 0.0
        self.full_collections = 0
        self.last_full_freed = 0
        self.last_full_seconds = 0.0
        self.last_full_at = 0.0
        self.full_period = FULL_PERIOD_MIN_S
        self._started = 0.0
        self._frozen = 0
        self._frozen_at: float | None = None

    def install(self, thresholds: str | None = None) -> None:
        """Start the policy: freeze what exists at start, then the survivors of every
        collection, with the collector on (the CLI turns it off through the start's imports).
        ``thresholds`` ("a,b,c"): plain CPython instead.

        No collection first: examining the start's objects (the modules, 50k objects) took
        12-40 ms before the first client was served, to free a few thousand objects of the
        imports' own cycles; they wait for the first full collection instead. Nor are they
        counted here: ``gc.get_freeze_count()`` walks them all (3-7 ms of a start); the first
        INFO memory counts them."""
        gc.freeze()
        self.last_full_at = time.monotonic()
        self._frozen_at = None  # counted when first asked (frozen_objects)
        if not self.installed:
            gc.callbacks.append(self._callback)
            self.installed = True
        if thresholds:
            self.freezing = False
            gc.set_threshold(*(int(x) for x in thresholds.split(",")))
        else:
            self.freezing = True
            gc.set_threshold(YOUNG_THRESHOLD, 10, 10)
        gc.enable()

    def _callback(self, phase: str, info: dict[str, Any]) -> None:
        if phase == "start":
            self._started = time.perf_counter()
            return
        pause = time.perf_counter() - self._started
        self.pause_total += pause
        if pause > self.pause_longest:
            self.pause_longest = pause
        if info["generation"] == 0:
            self.young_collections += 1
        if self.freezing:
            gc.freeze()

    @contextmanager
    def paused(self) -> Iterator[None]:
        """The collector off through a bulk build of long-lived objects (the AOF load: a
        million jobs would cost a young collection every YOUNG_THRESHOLD allocations, each
        examining objects that are never garbage), then, with the freezing policy, what
        was built frozen without being examined, as the survivors of those collections
        would have been. Restores the collector as it was, whatever happens inside."""
        was = gc.isenabled()
        gc.disable()
        try:
            yield
        finally:
            if was:
                if self.freezing:
                    gc.freeze()
                    self._frozen_at = None  # counted again when next asked
                gc.enable()

    def full_collect(self, why: str) -> int:
        """Examine every object once (frozen ones too) and freeze the survivors again.
        Returns how many objects were freed; logs it."""
        started = time.perf_counter()
        gc.unfreeze()
        freed = gc.collect()
        gc.freeze()
        self._frozen_at = None  # the log line below counts them again
        seconds = time.perf_counter() - started
        self.full_collections += 1
        self.last_full_freed = freed
        self.last_full_seconds = seconds
        self.last_full_at = time.monotonic()
        log.log(
            20 if freed or seconds >= 0.1 else 15,
            "GC: full collection (%s) freed %d objects in %.1f ms; %d objects frozen",
            why, freed, seconds * 1000, self.frozen_objects(),
        )  # fmt: skip
        return freed

    def maybe_full(self, now: float | None = None) -> None:
        """From the node's cron: the periodic full collection, when it is due (``now``: a
        ``time.monotonic()`` reading). Its result sets the next period (module docstring)."""
        if not self.freezing:
            return
        if now is None:
            now = time.monotonic()
        if now - self.last_full_at < self.full_period:
            return
        freed = self.full_collect("periodic, every %d s" % self.full_period)
        if freed < FULL_FREED_LOW:
            self.full_period = min(self.full_period * 2, FULL_PERIOD_MAX_S)
        else:
            self.full_period = FULL_PERIOD_MIN_S

    def frozen_objects(self, now: float | None = None) -> int:
        """``gc.get_freeze_count()``, read at most every FROZEN_COUNT_TTL seconds: it walks the
        whole frozen generation (70 ms with a million jobs held), and INFO memory, which the
        admin page asks for every second, must stay cheap."""
        if now is None:
            now = time.monotonic()
        if self._frozen_at is None or now - self._frozen_at >= FROZEN_COUNT_TTL:
            self._frozen = gc.get_freeze_count()
            self._frozen_at = now
        return self._frozen

    def info(self) -> dict[str, Any]:
        return {
            "gc_policy": "freeze-survivors" if self.freezing else "generational",
            "gc_frozen_objects": self.frozen_objects(),
            "gc_young_collections": self.young_collections,
            "gc_pause_total_ms": round(self.pause_total * 1000),
            "gc_pause_longest_ms": "%.2f" % (self.pause_longest * 1000),
            "gc_full_collections": self.full_collections,
            "gc_last_full_freed": self.last_full_freed,
            "gc_last_full_ms": "%.2f" % (self.last_full_seconds * 1000),
            "gc_full_period_s": int(self.full_period),
        }


policy = GcPolicy()


def install_from_env() -> None:
    policy.install(os.environ.get("DISQUE_PY_GC_THRESHOLDS") or None)
