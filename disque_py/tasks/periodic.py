"""Periodic tasks with a scheduler in every worker process and no single point of failure.

Every ``disque-py worker`` process of an app with periodic tasks runs :func:`run_scheduler`
(in a thread of its own). There is no leader, no lock and no shared state: each scheduler
computes the same slots from each task's :class:`~disque_py.tasks.cron.Schedule`, and at the
start of a slot it adds the slot's job with the deduplication key::

    periodic:<task name>:<slot start, Unix seconds>

and the slot's start in the job's ``meta`` (``{"periodic_slot": <slot start>}``), which the
task reads as ``current_task().meta["periodic_slot"]``. A slot's job keeps no result (nobody
holds its ref to wait for one: a task every 5 s would keep 120 result jobs for the default
10 minutes) unless the declaration sets ``result_ttl`` (``@app.periodic(every=60,
result_ttl=300)``); the app's default ``result_ttl`` does not count here.
The cluster answers every ADDJOB of the same queue and key with the same job ID and adds
nothing more (``ADDJOB ... DEDUP``, README.md), so the slot's job is in the queue once
however many schedulers run, on whichever nodes they are connected to; and it is there as long
as one scheduler and enough nodes live.

Exactly once per slot, and for how long
---------------------------------------
A node remembers a DEDUP key for the job's whole life and ``dedup-window`` seconds (600 by
default) after the job is gone (acknowledged, expired or deleted). A scheduler adds a slot's
job only within the slot's *lateness*: from the slot's start until ``min(slot length,
lateness)`` later (``lateness`` defaults to 300 s). The first ADDJOB of a slot happens at its
start or later, so the key is remembered until ``start + dedup-window`` at least, and every
other ADDJOB of that slot comes before ``start + lateness``: as long as ``lateness`` is below
``dedup-window``, they all find the key, whatever the period. A daily task is not added again
at 00:11 because its 00:00 job was done at 00:01 and forgotten at 00:11: no scheduler adds the
00:00 slot after 00:05. The scheduler reads ``dedup-window`` from its node when it starts
(``CONFIG GET``; if that is refused it assumes 600) and keeps ``lateness`` below half of it.

What a slot does not get:

* slots whose whole lateness passed while no scheduler lived (all workers down, or all nodes
  unreachable) are not added later: no backfill, a missed slot is logged as missed;
* a worker that starts in the middle of a slot adds that slot's job if the slot's lateness has
  not passed (so a slot is not lost to a restart);
* clocks: schedulers agree on a slot by its start time, so the key is the same on every
  machine; a clock ahead or behind only moves when that machine's scheduler adds it.

Failures
--------
A failed ADDJOB (the node died, a timeout, ``-NOREPL``, a paused queue) is tried again every
``RETRY_PAUSE`` seconds until the slot's lateness ends; the client moves to another node when
its node is unreachable. ``-NOREPL Not enough reachable nodes ... (N reachable, M asked)``
(the task asks for more copies than there are nodes left) is tried again at once with
``replicate=N``: a slot runs with fewer copies rather than not at all while a node is down.
The key stays the same, so a retry never makes a second job. An ADDJOB that timed out
waiting for its copies (``-NOREPL Timeout reached ...``: a node died and the others do not
know yet) kept the job it made: it is asked again at once, and answers the job's ID.

Such an ADDJOB waits up to the job's ``timeout_ms`` (5 s by default) until the cluster flags
the dead node (``cluster-node-timeout``), longer than a short period. So the scheduler does not
add slots itself: it hands each due slot to one of ``ADDERS`` threads (each with its own
connection), which tries it until it is added or its lateness ends, and goes on to the next
slot at once; a waiting ADDJOB holds up its own slot only.

Two schedulers whose ADDJOBs reach two nodes at the same moment may both make the job: it
has the same ID on both, their copies merge into one job, and one of the two nodes keeps it
queued (README.md, "Jobs that fail well, and jobs added once"; ``disque_py/core/dedup.py``). The copies keep the body their
creator sent, which for a periodic slot is the same task with the same (no) arguments.

Threads
-------
:func:`run_scheduler` blocks until ``stop`` (a :class:`threading.Event`) is set: run it in a
thread (:func:`start_scheduler` does). It uses the app's client through ``task.send_with``.
"""

from __future__ import annotations

import logging
import math
import re
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, Callable

from .cron import Schedule

__all__ = ["Scheduler", "run_scheduler", "start_scheduler", "slot_key", "DEFAULT_LATENESS", "RETRY_PAUSE"]

log = logging.getLogger("disque_py.tasks.periodic")

#: How late a slot's job may still be added, at most (seconds; also bounded by the slot's length).
DEFAULT_LATENESS = 300.0
#: Between two attempts to add a slot's job that failed (seconds).
RETRY_PAUSE = 0.1
#: The node's dedup-window when it cannot be read (its default).
DEFAULT_DEDUP_WINDOW = 600.0
#: Threads that add slots, per scheduler (and slots of one task in flight at most): a slot whose
#: ADDJOB waits for a copy does not hold up the slots after it.
ADDERS = 4
#: The longest the scheduler sleeps at once (so that a clock jump is noticed).
MAX_SLEEP = 5.0

REACHABLE = re.compile(r"\((\d+) reachable, (\d+) asked\)")


def slot_key(task_name: str, start: float) -> str:
    """The DEDUP key of a task's slot: ``periodic:<task name>:<slot start, Unix seconds>``."""
    if start == int(start):
        return "periodic:%s:%d" % (task_name, int(start))
    return "periodic:%s:%.3f" % (task_name, start)


@dataclass
class _Slot:
    """One slot being added: its start and how its attempts went."""

    start: float
    retry_at: float = 0.0  # no attempt before this (after a failure)
    replicate: int | None = None  # fewer copies for this slot, after a NOREPL (None: the task's)
    attempts: int = 0  # failed attempts


@dataclass
class _Entry:
    task: Any
    schedule: Schedule
    next_start: float = math.inf  # the next slot to add (its start)
    slot: _Slot | None = None  # the slot being added in step() (no adder threads)
    in_flight: int = 0  # slots being added by adder threads


class Scheduler:
    """The periodic tasks of one app, as one worker process schedules them.

    ``entries``: ``(task, schedule)`` pairs (``app.periodic_tasks``). ``clock``: Unix seconds.
    Counters: ``added`` (slots whose ADDJOB succeeded, including those another scheduler had
    added already: the cluster does not tell), ``failed`` (failed attempts), ``missed`` (slots
    whose lateness passed before an ADDJOB succeeded, or while no scheduler ran).

    ``adders``: with 0, :meth:`step` adds each due slot itself, trying a failed one again on a
    later step (what the tests drive with a clock of their own). With ``adders`` > 0 (what
    :func:`run_scheduler` uses), each due slot is handed to one of that many threads, which tries
    it until it is added or its lateness ends, and the scheduler goes on to the next slot at once:
    an ADDJOB that waits for a copy (a node just killed, not flagged yet: up to the job's
    ``timeout_ms``) holds up its own slot only, not the slots that start while it waits. A
    task with more than ``adders`` slots in flight waits for one to end.
    """

    def __init__(
        self,
        entries: list[tuple[Any, Schedule]],
        *,
        lateness: float = DEFAULT_LATENESS,
        clock: Callable[[], float] = time.time,
        adders: int = 0,
    ) -> None:
        if lateness <= 0:
            raise ValueError("lateness must be positive")
        self.lateness = float(lateness)
        self.clock = clock
        self.entries = [_Entry(task, schedule) for task, schedule in entries]
        self.added = self.failed = self.missed = 0
        self._lock = threading.Lock()  # the counters and in_flight, with adder threads
        self._pool: ThreadPoolExecutor | None = None
        self._adders = adders
        self._stop = threading.Event()
        if adders > 0:
            self._pool = ThreadPoolExecutor(max_workers=adders, thread_name_prefix="disque-py-periodic-add")
        now = clock()
        for e in self.entries:
            e.next_start = self._first_slot(e, now)

    # -- slots ---------------------------------------------------------------------------
    def deadline(self, e: _Entry, start: float) -> float:
        """Until when the slot starting at ``start`` may be added."""
        return start + min(e.schedule.period_at(start), self.lateness)

    def _first_slot(self, e: _Entry, now: float) -> float:
        """The first slot to add from ``now``: the current one if not too late, else the next."""
        start = e.schedule.slot_start(now)
        return start if now < self.deadline(e, start) else e.schedule.next_after(now)

    def _count(self, name: str, n: int = 1) -> None:
        with self._lock:
            setattr(self, name, getattr(self, name) + n)

    def _missed(self, e: _Entry, start: float) -> None:
        self._count("missed")
        log.warning("periodic task %s: slot %s not added here within %.3g s of its start (missed, "
                    "unless another worker added it)",
                    e.task.name, slot_key(e.task.name, start), self.deadline(e, start) - start)  # fmt: skip

    # -- one pass ----------------------------------------------------------------------------
    def step(self) -> float:
        """Add every slot that is due (or hand it to an adder thread); return when something
        is due next (clock time)."""
        wake = math.inf
        for e in self.entries:
            while True:
                now = self.clock()
                start = e.next_start
                if now < start:
                    break
                if now >= self.deadline(e, start):
                    self._missed(e, start)
                    self._next(e, self._first_slot(e, now))
                    continue
                if self._pool is not None:
                    with self._lock:
                        full = e.in_flight >= self._adders
                        if not full:
                            e.in_flight += 1
                    if full:  # every adder is busy with this task: look again shortly
                        wake = min(wake, now + RETRY_PAUSE)
                        break
                    self._pool.submit(self._add_slot, e, _Slot(start))
                    self._next(e, e.schedule.next_after(start))
                    continue
                slot = e.slot if e.slot is not None and e.slot.start == start else _Slot(start)
                e.slot = slot
                if now < slot.retry_at:
                    wake = min(wake, slot.retry_at)
                    break
                if self._attempt(e, slot):
                    self._next(e, e.schedule.next_after(start))
                    continue
                wake = min(wake, slot.retry_at)
                break
            wake = min(wake, max(e.next_start, e.slot.retry_at if e.slot is not None else 0.0))
        return wake

    @staticmethod
    def _next(e: _Entry, start: float) -> None:
        e.next_start, e.slot = start, None

    def _attempt(self, e: _Entry, slot: _Slot) -> bool:
        """One attempt at a slot (two when the first says to ask again at once): True when
        it is added; else ``slot.retry_at`` says when to try again."""
        outcome = self._add(e, slot)
        if outcome is None:  # again at once (fewer copies, or to learn the ID of one kept)
            self._count("failed")
            outcome = self._add(e, slot)
        if outcome is True:
            self._count("added")
            return True
        self._count("failed")
        slot.retry_at = self.clock() + RETRY_PAUSE
        return False

    def _add_slot(self, e: _Entry, slot: _Slot) -> None:
        """An adder thread: try the slot until it is added, its lateness ends or the scheduler
        stops."""
        try:
            deadline = self.deadline(e, slot.start)
            while not self._attempt(e, slot):
                if slot.retry_at >= deadline:
                    self._missed(e, slot.start)
                    return
                if self._stop.wait(max(0.0, slot.retry_at - self.clock())):
                    return
        except Exception:  # noqa: BLE001 - never lose the thread's place in the pool silently
            log.exception("periodic task %s: adding %s", e.task.name, slot_key(e.task.name, slot.start))
        finally:
            with self._lock:
                e.in_flight -= 1

    def _add(self, e: _Entry, slot: _Slot) -> bool | None:
        """True: added (or found added); False: failed, try again later; None: try again now."""
        start = slot.start
        key = slot_key(e.task.name, start)
        # the slot rides in the body too, so that the task knows which run it is
        # (current_task().meta["periodic_slot"]); every scheduler sends the same body for a slot
        options: dict[str, Any] = {"dedup": key, "meta": {"periodic_slot": int(start) if start == int(start) else start}}
        if getattr(e.task, "result_ttl", None) is None:
            options["result_ttl"] = 0  # nobody waits for a slot's result: none unless the declaration asks
        if slot.replicate is not None:
            options["replicate"] = slot.replicate
        try:
            job_id = e.task.send_with(**options)
        except Exception as exc:  # noqa: BLE001 - a scheduler outlives any one failure
            slot.attempts += 1
            fewer = REACHABLE.search(str(exc)) if "NOREPL" in str(exc) else None
            if fewer is not None and 1 <= int(fewer.group(1)) < (slot.replicate or math.inf):
                slot.replicate = int(fewer.group(1))
                log.warning("periodic task %s: %s; adding %s with REPLICATE %d",
                            e.task.name, exc, key, slot.replicate)  # fmt: skip
                return None
            if fewer is None and "NOREPL" in str(exc) and slot.attempts == 1:
                # its copies were not all made in time: the job is kept with those made, and
                # the same ADDJOB answers its ID
                log.info("periodic task %s: %s; asking again for %s", e.task.name, exc, key)
                return None
            if slot.attempts == 1 or slot.attempts % 50 == 0:
                log.warning("periodic task %s: adding %s failed (attempt %d): %s", e.task.name, key, slot.attempts, exc)
            return False
        log.debug("periodic task %s: slot %s -> %s", e.task.name, key, getattr(job_id, "id", job_id))
        return True

    # -- the loop ----------------------------------------------------------------------------
    def run(self, stop: threading.Event) -> None:
        """Add slots until ``stop`` is set."""
        try:
            while not stop.is_set():
                wake = self.step()
                stop.wait(min(max(0.0, wake - self.clock()), MAX_SLEEP))
        finally:
            self.close()

    def close(self) -> None:
        """Stop the adder threads (a slot being added is given up after its current ADDJOB)."""
        self._stop.set()
        if self._pool is not None:
            self._pool.shutdown(wait=False, cancel_futures=True)


def dedup_window(client: Any) -> float | None:
    """The node's ``dedup-window`` (seconds), or None when it cannot be read."""
    try:
        reply = client.execute("CONFIG", "GET", "dedup-window")
        return float(reply[1])
    except Exception:  # noqa: BLE001 - refused by an ACL, an older node: the caller assumes the default
        return None


def run_scheduler(
    app: Any,
    stop: threading.Event,
    *,
    lateness: float = DEFAULT_LATENESS,
    clock: Callable[[], float] = time.time,
) -> None:
    """Schedule ``app.periodic_tasks`` until ``stop`` is set (blocks: run it in a thread).

    Every worker process of the app runs one; see the module docstring for what they promise
    together. ``lateness`` is kept below half the node's ``dedup-window``.
    """
    entries = list(getattr(app, "periodic_tasks", ()))
    if not entries:
        return
    window = dedup_window(app.client())
    limit = (window if window is not None else DEFAULT_DEDUP_WINDOW) / 2
    if window == 0:
        log.warning("dedup-window is 0 on this node: a periodic slot done before another scheduler adds "
                    "it may run twice; set dedup-window above twice the lateness (%g s)", lateness)  # fmt: skip
    elif lateness > limit:
        log.warning("periodic lateness %g s lowered to %g s (half of dedup-window)", lateness, limit)
        lateness = limit
    scheduler = Scheduler(entries, lateness=lateness, clock=clock, adders=ADDERS)
    log.info("periodic scheduler: %d task(s): %s", len(entries),
             ", ".join("%s %r" % (t.name, s) for t, s in entries))  # fmt: skip
    scheduler.run(stop)


def start_scheduler(app: Any, **options: Any) -> tuple[threading.Thread, threading.Event]:
    """:func:`run_scheduler` in a daemon thread; set the returned event to stop it."""
    stop = threading.Event()
    thread = threading.Thread(target=run_scheduler, args=(app, stop), kwargs=options,
                              name="disque-py-periodic", daemon=True)  # fmt: skip
    thread.start()
    return thread, stop
