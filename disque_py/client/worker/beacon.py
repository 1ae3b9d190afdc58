"""The worker in plain sight: its beats to the cluster (``WORKER BEAT``), and the jobs it runs.

Every ``beacon_interval`` seconds (:class:`~.settings.WorkerSettings`; 5 by default, None:
off) the beacon tells the node its client uses who the worker is and what it does now: its
ID (``host:pid:random``, one per run), host, pid, start time, queues, concurrency, handler,
the jobs its handlers run (each with its queue, since when, and a label: ``describe(job)``,
which the task runner sets to the task's name) and its counters. The node keeps it for 3
intervals (``server/workers.py``), so a worker killed with -9 drops off by itself; a stop
says ``WORKER FORGET`` and the worker drops off at once. ``disque-py workers``, ``top`` and
the admin page ask every node (``client/workers.py`` merges their answers).

A node that does not know WORKER (Disque's own, or one before it) and a user without the
right to it (``@consume``): one log line and the beacon stops; the worker runs on. A refused
beat is logged once until a beat goes through again; no node reachable is the fetcher's to say.

Which jobs run: the handler threads keep theirs (``HandlerThreads.current`` and
``.started``), read at each beat and nothing per job; an ``async def`` handler's jobs are noted
as each starts (:meth:`Beacon.track`: the job, the time and its coroutine into a dict, a job
whose coroutine is done left out; about 0.15 us per job), and only when the beacon is on.

Progress: a handler (a task's ``progress(done, total, note)``) reports through
:meth:`Beacon.report`, from any thread; the running job's entry in the beat then carries
``"progress": {"done", "total", "note"}``, and the change brings the next beat forward, at
most one early beat a second (:data:`PROGRESS_GAP`). A worker whose jobs report no progress
beats as before: nothing is added to its beat, and no early beat is sent.
"""

from __future__ import annotations

import json
import logging
import os
import re
import secrets
import socket
import sys
import time
from collections.abc import Callable
from typing import Any

import trio

from ..errors import ConnectionLost, DisqueError, ServerError
from ..model import Job
from .handlers import Handler

__all__ = ["Beacon", "make_worker_id", "worker_client_name", "MAX_INFO", "MAX_RUNNING", "PROGRESS_GAP"]

log = logging.getLogger("disque_py.worker")

#: The node refuses an info over 16 KiB (server/workers.py); the beacon stays under this.
MAX_INFO = 15_000
#: Running jobs listed at most in one beat (the others are counted, ``running_total``).
MAX_RUNNING = 100
#: Labels and queue names are cut to this many characters in a beat.
MAX_TEXT = 200
#: Queues named at most in a beat.
MAX_QUEUES = 100

#: Seconds at least between two beats, when a progress report brings one forward.
PROGRESS_GAP = 1.0

_UNSAFE = re.compile(r"[^!-~]")  # anything but printable ASCII without the space


def _host() -> str:
    return _UNSAFE.sub("_", socket.gethostname() or "localhost")[:64] or "localhost"


def make_worker_id() -> str:
    """``host:pid:random``: one per worker run (two workers of one process differ)."""
    return "%s:%d:%s" % (_host(), os.getpid(), secrets.token_hex(3))


def worker_client_name() -> str:
    """What a worker's connections are named (``CLIENT LIST``'s ``name=``)."""
    return "disque-py-worker:%s:%d" % (_host(), os.getpid())


def _cut(text: str) -> str:
    return text if len(text) <= MAX_TEXT else text[: MAX_TEXT - 3] + "..."


def handler_name(handler: Any) -> str:
    """``module:qualname`` of a handler (a function, or an object: its class)."""
    target = handler if hasattr(handler, "__qualname__") else type(handler)
    module = getattr(target, "__module__", None) or "?"
    return _cut("%s:%s" % (module, getattr(target, "__qualname__", "?")))


class Beacon:
    """Beats for one worker (see the module docstring).

    ``stats()``: the worker's :class:`~.stats.WorkerStats`; ``threads``: the handler threads
    (None: an ``async def`` handler, whose jobs :meth:`track` records); ``stopping()``: whether
    the worker stops; ``clock``: wall seconds."""

    def __init__(self, client: Any, worker_id: str, interval: float, *, queues: list[str], concurrency: int,
                 max_in_flight: int, handler: str, stats: Callable[[], Any], stopping: Callable[[], bool],
                 describe: Callable[[Job], str] | None = None, threads: Any = None,
                 clock: Callable[[], float] = time.time) -> None:  # fmt: skip
        self.client = client
        self.id = worker_id
        self.interval = interval
        self.queues = queues
        self.concurrency = concurrency
        self.max_in_flight = max_in_flight
        self.handler = handler
        self.stats = stats
        self.stopping = stopping
        self.describe = describe
        self.threads = threads
        self.clock = clock
        self.started = clock()
        self.jobs: dict[int, tuple[Job, float, Any]] = {}  # async handlers' jobs, time, coroutine (track)
        self.beats = 0  # beats the node took
        self.off = False  # the node cannot take beats: stopped for good
        self._failing = False  # a failure was logged; the next success says so
        self._label_failed = False
        self.progress: dict[str, dict[str, Any]] = {}  # job ID -> its last progress report (report)
        self._token: trio.lowlevel.TrioToken | None = None
        self._early: trio.Event | None = None  # set: a progress report wants a beat soon

    # ------------------------------------------------------------ what runs
    def track(self, handler: Handler) -> Handler:
        """``handler`` (``async def``) with the jobs it runs recorded for the beats.

        A plain function that notes the job, the time and the handler's coroutine, and returns
        that coroutine: no frame is added to the run (an ``async def`` wrapper cost twice as
        much per job). An entry whose coroutine is done (its frame gone) is left out at a beat,
        and swept once the table holds more than twice the concurrency."""
        jobs = self.jobs
        now = self.clock
        sweep_over = 2 * self.concurrency + 16
        sweep = self._sweep

        def tracked(job: Job) -> Any:
            coro = handler(job)
            jobs[id(coro)] = (job, now(), coro)
            if len(jobs) > sweep_over:
                sweep()
            return coro

        return tracked

    def _sweep(self) -> None:
        jobs = self.jobs
        for key in [key for key, (_, _, coro) in jobs.items() if getattr(coro, "cr_frame", None) is None]:
            del jobs[key]

    def running(self) -> list[tuple[Job, float]]:
        """The jobs the handlers run now, with when each started (wall seconds), oldest first."""
        threads = self.threads
        if threads is None:
            out = [(job, since) for job, since, coro in list(self.jobs.values())
                   if getattr(coro, "cr_frame", None) is not None]  # fmt: skip
        else:
            out = []
            shift = self.clock() - time.perf_counter()  # perf_counter() -> wall seconds
            for job, started in zip(list(threads.current), list(threads.started)):
                if job is not None and started:  # between two jobs, or a job not run (over its attempts)
                    out.append((job, started + shift))
        out.sort(key=lambda item: item[1])
        return out

    def report(self, job_id: str, done: float, total: float | None = None, note: str | None = None) -> None:
        """A running job's progress (from any thread): kept for the beats, and the next beat
        brought forward (at most one early beat every :data:`PROGRESS_GAP` seconds)."""
        entry: dict[str, Any] = {"done": done, "total": total, "note": None if note is None else _cut(str(note))}
        self.progress[job_id] = entry
        self.soon()

    def soon(self) -> None:
        """Beat soon (what runs changed: a job cancelled), within PROGRESS_GAP seconds; from any thread."""
        token = self._token
        if token is not None:
            try:
                token.run_sync_soon(self._wake)
            except trio.RunFinishedError:  # pragma: no cover - the worker's run is over
                pass

    def _wake(self) -> None:
        early = self._early
        if early is not None:
            early.set()

    def _label(self, job: Job) -> str:
        describe = self.describe
        if describe is None:
            return ""
        try:
            return _cut(str(describe(job)))
        except Exception as exc:  # noqa: BLE001 - a broken hook must not stop the beats
            if not self._label_failed:
                self._label_failed = True
                log.warning("worker describe(job) failed (labels left empty): %s", exc)
            return ""

    # ------------------------------------------------------------ a beat
    def info(self) -> dict[str, Any]:
        """What a beat says (docs/CLIENT.md, "Workers in plain sight")."""
        s = self.stats()
        running = self.running()
        info: dict[str, Any] = {
            "id": self.id, "host": _host(), "pid": os.getpid(), "started": round(self.started, 3),
            "version": getattr(sys.modules.get("disque_py"), "__version__", ""), "handler": self.handler,
            "queues": [_cut(q) for q in self.queues[:MAX_QUEUES]], "concurrency": self.concurrency,
            "max_in_flight": self.max_in_flight, "interval": self.interval,
            "processed": s.processed, "failed": s.failed, "retried": s.retried, "dead": s.dead,
            "fetched": s.fetched, "in_flight": s.in_flight, "stopping": bool(self.stopping()),
            "running": [{"id": job.id, "queue": _cut(job.queue), "since": round(since, 3), "label": self._label(job)}
                        for job, since in running[:MAX_RUNNING]],
            "running_total": len(running),
        }  # fmt: skip
        progress = self.progress
        if progress:  # only a worker whose jobs report progress pays for it
            listed = info["running"]
            for entry in listed:
                got = progress.get(entry["id"])
                if got is not None:
                    entry["progress"] = got
            ids = {job.id for job, _ in running}
            for job_id in [k for k in progress if k not in ids]:  # their jobs ended
                progress.pop(job_id, None)
        return info

    def encoded(self) -> bytes:
        """:meth:`info` as JSON, cut to fit a beat: the longer of the running list and the queues
        is halved until it fits (``running_total`` still counts every running job)."""
        info = self.info()
        while True:
            body = json.dumps(info, separators=(",", ":"), allow_nan=False).encode()
            if len(body) <= MAX_INFO:
                return body
            key = max(("running", "queues"), key=lambda k: len(json.dumps(info[k])))
            if not info[key]:  # pragma: no cover - the other fields are bounded well below the limit
                return body
            info[key] = info[key][: len(info[key]) // 2]

    async def beat(self) -> bool:
        """One beat; False when the node cannot take beats (the beacon is then off)."""
        if self.off:
            return False
        try:
            await self.client.worker_beat(self.id, self.interval, self.encoded())
        except ServerError as exc:
            text = str(exc)
            if exc.code == "NOPERM" or (exc.code == "ERR" and "unknown command" in text.lower()):
                self.off = True
                log.info("worker %s: the node does not take WORKER BEAT (%s); it is not listed by "
                         "`disque-py workers`, and runs on", self.id, text)  # fmt: skip
                return False
            self._failed(exc)
        except ConnectionLost as exc:  # the fetcher says so already (GETJOB failed ...): not twice
            log.debug("worker %s: a beat failed: %s", self.id, exc)
        except DisqueError as exc:
            self._failed(exc)
        else:
            self.beats += 1
            if self._failing:
                self._failing = False
                log.info("worker %s: beats reach the cluster again", self.id)
        return True

    def _failed(self, exc: BaseException) -> None:
        if not self._failing:
            self._failing = True
            log.warning("worker %s: a beat failed (%s); trying again every %gs", self.id, exc, self.interval)

    async def run(self) -> None:
        """Beat now, then every interval (or sooner after a progress report, at most one early
        beat every PROGRESS_GAP seconds), until cancelled (or the node cannot take beats)."""
        self._token = trio.lowlevel.current_trio_token()
        while True:
            self._early = early = trio.Event()
            last = trio.current_time()
            if not await self.beat():
                return
            with trio.move_on_at(last + self.interval):
                await early.wait()
                await trio.sleep_until(last + PROGRESS_GAP)

    async def forget(self) -> None:
        """The worker stopped cleanly: WORKER FORGET (within a second, or never)."""
        if self.off or not self.beats:
            return
        with trio.move_on_after(1.0):
            try:
                await self.client.worker_forget(self.id)
            except DisqueError as exc:
                log.info("worker %s: WORKER FORGET failed (%s); the node drops it after 3 beats", self.id, exc)
