"""The worker runtime: fetch jobs, run a handler on each, acknowledge, retry, dead-letter.

Design
------
A :class:`Worker` is a trio program built on the trio client
(:class:`disque_py.aio.Client`), made of a few tasks sharing plain state
(trio tasks switch only at ``await``, so no locks):

* **fetcher** - one ``GETJOB ... COUNT n WITHCOUNTERS`` at a time, where
  ``n`` is the number of free slots. A job is *in flight* from the moment
  GETJOB returns it until its ACKJOB/FASTACK/NACK got a reply, and there
  are never more than ``max_in_flight`` of them (so the node never shows
  more than that many of our jobs ``active``). Pending outcomes ride in
  the same pipeline, in front of the GETJOB (then ``NOHANG``): the node
  runs them first, so the slots they free are refilled in one round trip.
  With nothing to send the GETJOB blocks up to ``fetch_timeout_ms``. The
  fetcher batches: while runners still have buffered jobs it waits for
  half of the slots to be free.
* **runners** (``async def`` handlers) - ``concurrency`` tasks taking jobs
  from the local buffer and running the handler. Idle runners sleep; new
  jobs wake one, and a runner whose handler pauses (its first step did
  not finish it) wakes another for the next buffered job, unless one is
  on its way already. So a handler that blocks lets the next job start at
  once, while a batch of handlers that never pause runs in one task
  without a task switch per job.
* **handler threads** (plain functions) - ``concurrency`` long-lived
  threads, started by :meth:`Worker.run` and ended when it returns, take
  jobs from the same buffer and run the handler. New jobs wake one idle
  thread (a condition variable); more are woken at once if the last
  handler ran longer than ``SLOW_HANDLER`` (0.1 ms), else only for jobs
  still waiting ``HELPER_DELAY`` (1 ms) later behind a busy thread. So a
  batch of quick handlers runs in one thread, without a thread wake-up
  per job, and a slow handler holds up the jobs behind it for 1 ms at
  most. What the threads report (job done or failed, job started when
  heartbeats are on) goes back to the trio thread in batches: one
  ``run_sync_soon`` wake-up per batch, not one per job. A trio task, the
  *collector*, turns the reports into outcomes, as a runner does.

  With quick handlers the fetcher then *lends* its role to the threads
  (direct mode, see :class:`_HandlerThreads`): a thread that runs dry
  sends the ACKs and the next ``GETJOB NOHANG`` itself, on a blocking
  connection of its own, so a round costs no thread hand-over at all.

  Either kind of handler succeeds by returning (the value is ignored) and
  fails by raising anything; raising :class:`Reject` dead-letters the job
  at once (a job that can never succeed), with its message as the reason.
* **acker** - sends the outcomes the fetcher cannot carry (while its
  GETJOB blocks, during a backoff, after a stop) on another connection,
  one ``ACKJOB id id ...`` (or FASTACK / NACK) per batch, and the NACKs
  with options (one command per job) in one pipeline.

Outcomes:

* success: ACKJOB (``fast_ack=True``: FASTACK);
* failure: ``NACK <id> DELAY <s> REASON <error>``: the job is retried by
  the cluster after ``retry_backoff.delay(attempt - 1)`` seconds
  (exponential, jittered; the node holds it meanwhile, so the other jobs
  go on), and its next delivery carries the error as
  ``last_nack_reason``. No DELAY when ``retry_backoff`` is None or the
  job has a BACKOFF of its own (the node's backoff decides). A NACK the
  node refuses (a DELAY beyond the job's TTL) is sent again plain;
* a failure on attempt ``max_attempts`` (:attr:`~.model.Job.attempt`), or
  a job *fetched* with an attempt above it (it failed elsewhere, or timed
  out): the dead-letter handler gets it. The default,
  :data:`DEFAULT_DEAD_LETTER`, is ``NACK <id> DEAD REASON <error>``: the
  node dead-letters it (a new job in ``<queue>.dead`` or the job's
  DEADLETTER queue, whose SHOW names the original). A custom handler runs,
  then the job is acknowledged; if it fails the job is NACKed instead;
* a failure on the delivery the job's own MAXDELIVER makes its last:
  ``NACK <id> REASON <error>``, and the node dead-letters it.

On a node that refuses NACK's options (Disque's own), the first refusal
switches the worker back to plain NACKs and to dead letters it ADDs itself:
a JSON :class:`~.model.DeadLetter` in ``<queue>.dead``.

Consumer-wide pause (:class:`FailureGate`), for an outage: when at least
``backoff_ratio`` of the last ``backoff_after`` distinct jobs failed (a
job failing again counts once, so a few poison jobs never trip it), the
fetcher stops for ``backoff.delay(n)`` seconds (exponential, jittered,
bounded by ``backoff.maximum``), then fetches a single *probe* job and
waits for its outcome: success goes back to full speed, failure pauses
longer. Jobs already in hand keep running meanwhile.

Heartbeats (off by default): ``heartbeat=<seconds>`` sends WORKING for a
job every that many seconds while its handler runs; ``heartbeat=True``
starts after one second and then uses half of the RETRY that WORKING
returns. They stop on -NOJOB/-TOOLATE/-ACKED or for RETRY 0 jobs.

Shutdown (:meth:`Worker.stop`, or SIGTERM/SIGINT with
``handle_signals=True``): the fetcher stops after its current GETJOB
(which waits at most ``fetch_timeout_ms``), jobs that arrive after the
stop and jobs not started yet are NACKed at once, running handlers get
``grace_period`` seconds to finish; then they are cancelled (a thread
cannot be killed: it is abandoned, and exits when its handler returns)
and their jobs NACKed. A second signal ends the grace period at once.
When :meth:`Worker.run` returns, the handler threads not abandoned have
exited.

:meth:`Worker.starved` is the signal for batch handlers: it is True when
the worker has no more jobs available right now: nothing is waiting in the
local buffer and the last GETJOB returned fewer jobs than it asked for. A
handler that accumulates work (e.g. rows for one bulk insert) flushes when
it sees it; :func:`current_worker` finds the worker from inside a handler.

:meth:`Worker.stats` returns a frozen :class:`WorkerStats` snapshot of the
counters.
"""

from __future__ import annotations

import contextvars
import enum
import functools
import inspect
import logging
import math
import random
import signal
import threading
import time
import types
from collections import OrderedDict, deque
from collections.abc import Awaitable, Callable, Coroutine, Generator, Sequence
from dataclasses import dataclass
from typing import Any

import trio

from . import commands as cmd
from .aio import Client as AioClient
from .cluster import Backoff
from .connection import NodeConnection as _Connection
from .errors import AckedError, AuthError, BadIdError, DisqueError, NoJobError, TooLateError
from .model import DeadLetter, Job
from .sync import Client as SyncClient

__all__ = [
    "Worker",
    "WorkerStats",
    "FailureGate",
    "current_worker",
    "describe_error",
    "Reject",
    "DEFAULT_DEAD_LETTER",
    "DEFAULT_RETRY_BACKOFF",
    "DEFAULT_PAUSE_BACKOFF",
]

log = logging.getLogger("disque_py.worker")

Handler = Callable[[Job], Any]
DeadLetterHandler = Callable[[Job, str], Any]

_current_worker: contextvars.ContextVar["Worker"] = contextvars.ContextVar("disque_py_worker")


def current_worker() -> "Worker":
    """The worker running the current handler (threads included)."""
    try:
        return _current_worker.get()
    except LookupError:
        raise RuntimeError("current_worker() called outside a worker handler") from None


class _Default(enum.Enum):
    DEAD_LETTER = "NACK ... DEAD: the cluster's dead letter"


#: ``dead_letter=`` default: ``NACK <id> DEAD REASON <error>``: the cluster dead-letters the job
#: (into its DEADLETTER queue, ``<queue>.dead`` by default). On a node that does not know NACK's
#: options (Disque's), the worker ADDs a JSON :class:`DeadLetter` to ``<queue>.dead`` instead.
DEFAULT_DEAD_LETTER = _Default.DEAD_LETTER


class Reject(Exception):
    """Raised by a handler for a job that can never succeed (a body it cannot read, a task
    it does not know): the job is dead-lettered at once, whatever attempts it has left,
    with the exception's message as the reason (``NACK <id> DEAD REASON <message>`` with
    the default ``dead_letter``)."""


def describe_error(exc: BaseException) -> str:
    """``"Type: message"`` for any exception, even one whose ``str()`` or ``repr()`` raises."""
    name = type(exc).__qualname__
    try:
        text = str(exc)
    except Exception:  # noqa: BLE001 - a broken __str__ must not break the worker
        try:
            text = repr(exc)
        except Exception:  # noqa: BLE001
            text = "<unprintable %s>" % name
    return "%s: %s" % (name, text) if text else name


@dataclass(frozen=True, slots=True)
class WorkerStats:
    """Counters since the worker started.

    ``processed``: handler succeeded (the job is acknowledged, or about
    to be); ``failed``: handler raised; ``retried``: jobs NACKed (failures
    below ``max_attempts``, and jobs handed back at shutdown); ``dead``:
    jobs dead-lettered (NACK DEAD sent, or the custom handler done); ``in_flight``: fetched and not yet ACKed/NACKed
    (the node's answer counts); ``running``: handlers running (a handler
    thread counts from taking its job); ``backoffs``: failure backoffs
    started; ``ack_errors``: ACK/NACK commands that failed;
    ``starved``: see :meth:`Worker.starved`.
    """

    fetched: int
    processed: int
    failed: int
    retried: int
    dead: int
    in_flight: int
    running: int
    backoffs: int
    ack_errors: int
    starved: bool


class FailureGate:
    """When the fetcher may fetch, after failures (no I/O: the caller passes ``now``).

    It looks at the last ``window`` distinct jobs that ended (a job failing
    again counts once, with its latest outcome) and trips when at least
    ``ratio`` of them failed, i.e. when most jobs fail, whatever they are: a
    downstream outage, not a few poison jobs (those are retried one by one
    with NACK delays). States: ``open`` (fetch freely), ``backing-off``
    (fetch nothing until ``until``), ``probing`` (fetch one job and wait for
    its outcome: a success opens the gate and forgets the window, a failure
    backs off longer, up to ``backoff.maximum``).
    """

    OPEN = "open"
    BACKING_OFF = "backing-off"
    PROBING = "probing"

    def __init__(self, backoff: Backoff, window: int, rng: random.Random, ratio: float = 0.9) -> None:
        if window < 1:
            raise ValueError("backoff_after must be >= 1")
        if not 0.0 < ratio <= 1.0:
            raise ValueError("backoff_ratio must be in (0, 1]")
        self.backoff = backoff
        self.window = window
        self.ratio = ratio
        self.rng = rng
        self.state = self.OPEN
        self.recent: OrderedDict[str, bool] = OrderedDict()  # job ID -> failed, oldest first
        self.failing = 0  # failed jobs in ``recent``
        self.level = 0
        self.until = 0.0
        self.probe: str | None = None

    def allowance(self, now: float) -> tuple[int | None, float | None]:
        """``(max jobs to fetch or None for no limit, time to wait until or None)``."""
        if self.state == self.BACKING_OFF:
            if now < self.until:
                return 0, self.until
            self.state = self.PROBING
            self.probe = None
        if self.state == self.PROBING:
            return (0 if self.probe else 1), None
        return None, None

    def took_probe(self, job_id: str) -> None:
        self.probe = job_id

    def _record(self, job_id: str, failed: bool) -> None:
        recent = self.recent
        before = recent.pop(job_id, None)
        if before:
            self.failing -= 1
        recent[job_id] = failed
        if failed:
            self.failing += 1
        if len(recent) > self.window and recent.popitem(last=False)[1]:
            self.failing -= 1
        if not self.failing:
            recent.clear()  # only successes: nothing to remember (keeps success() cheap)

    def success(self, job_id: str) -> None:
        if self.state is self.OPEN and not self.failing:
            return  # the common case, kept cheap
        if self.state != self.OPEN and (self.state == self.BACKING_OFF or job_id != self.probe):
            self._record(job_id, False)  # an older job: the probe decides
            return
        if self.state == self.PROBING:  # the probe worked: full speed, window forgotten
            self.recent.clear()
            self.failing = 0
        else:
            self._record(job_id, False)
        self.state = self.OPEN
        self.level = 0
        self.probe = None

    def failure(self, job_id: str, now: float) -> float | None:
        """Record a failure; returns the backoff delay if one starts now."""
        self._record(job_id, True)
        if self.state == self.BACKING_OFF:
            return None
        if self.state == self.PROBING and job_id != self.probe:
            return None  # an older job: the probe decides
        if self.state == self.PROBING or (
            len(self.recent) >= self.window and self.failing >= self.ratio * len(self.recent)
        ):
            delay = self.backoff.delay(self.level, self.rng)
            self.level += 1
            self.state = self.BACKING_OFF
            self.until = now + delay
            self.probe = None
            return delay
        return None

    def neutral(self, job_id: str) -> None:
        """The job ended without running the handler (dead-lettered, handed back)."""
        if self.state == self.PROBING and job_id == self.probe:
            self.probe = None


_OPS = {"ack": b"ACKJOB", "fast_ack": b"FASTACK", "nack": b"NACK"}

#: A NACK with options waiting to be sent: ("retry" or "dead", the job, the command).
_Retry = tuple[str, Job, tuple[Any, ...]]

#: ``retry_backoff=`` default: a failed job comes back after 1 s, 2 s, 4 s... (at most 5
#: minutes), jittered by up to 25 % (NACK's DELAY).
DEFAULT_RETRY_BACKOFF = Backoff(initial=1.0, maximum=300.0, factor=2.0, jitter=0.25)

#: ``backoff=`` default: the consumer-wide pause when most recent jobs fail (an outage):
#: 0.5 s doubling up to 5 s between probes.
DEFAULT_PAUSE_BACKOFF = Backoff(initial=0.5, maximum=5.0, factor=2.0, jitter=0.5)

#: Seconds an outcome (ACK/NACK) may wait to travel with a bigger batch.
OUTCOME_LINGER = 0.005

#: Seconds a job may wait in the buffer, behind a handler thread busy with
#: other jobs, before idle handler threads are woken to take it.
HELPER_DELAY = 0.001

#: A handler that ran longer than this (seconds) makes new jobs wake as
#: many handler threads as they need at once.
SLOW_HANDLER = 0.0001

#: Seconds the handler threads stop fetching for themselves after their
#: connection failed (the trio fetcher, which fails over, goes on).
DIRECT_RETRY = 1.0

#: Whether handler threads may fetch for themselves (see ``_HandlerThreads``);
#: off, every round goes through the trio fetcher.
DIRECT_FETCH = True

# What a handler thread reports about a job.
_DONE = 0  # the handler returned (error None) or raised (error set)
_STARTED = 1  # the handler is starting (only with heartbeats)
_SKIPPED = 2  # not run: attempt above max_attempts, for the collector to dead-letter


class _Wakeup:
    """Wakes one waiting task: ``wait()`` blocks until the next ``fire()``.

    The waiter checks its condition and calls ``wait()`` with no checkpoint
    in between, so a ``fire()`` with nobody waiting is dropped (cheaply: it
    is called for every job).
    """

    __slots__ = ("task",)

    def __init__(self) -> None:
        self.task: trio.lowlevel.Task | None = None

    def fire(self) -> None:
        task = self.task
        if task is not None:
            self.task = None
            trio.lowlevel.reschedule(task)

    async def wait(self) -> None:
        assert self.task is None, "one waiter at a time"
        self.task = trio.lowlevel.current_task()
        await trio.lowlevel.wait_task_rescheduled(self._abort)

    def _abort(self, _: Any) -> trio.lowlevel.Abort:
        self.task = None
        return trio.lowlevel.Abort.SUCCEEDED


@types.coroutine
def _resume(coro: Coroutine[Any, Any, Any], message: Any) -> Generator[Any, Any, Any]:
    """Go on with ``coro``, whose first step yielded ``message`` to trio, as ``await coro`` would."""
    while True:
        try:
            sent = yield message
        except BaseException as exc:  # thrown in (trio does it only for foreign yields), or closed
            try:
                message = coro.throw(exc)
            except StopIteration as stop:
                return stop.value
        else:
            try:
                message = coro.send(sent)
            except StopIteration as stop:
                return stop.value


def _is_async_callable(fn: Any) -> bool:
    call = getattr(type(fn), "__call__", None)  # noqa: B004 - an object with an async __call__
    return inspect.iscoroutinefunction(fn) or inspect.iscoroutinefunction(call)


def _call_sync(handler: Callable[[Job], Any], job: Job) -> None:
    result = handler(job)
    if inspect.isawaitable(result):
        close = getattr(result, "close", None)
        if close is not None:
            close()
        raise TypeError("the handler returned an awaitable: declare it with async def")


class _HandlerThreads:
    """The threads running a plain-function handler (see the module docstring).

    Shared with the trio thread, under ``cond``: the job each thread runs
    (``current``), the reports not collected yet (``events``), the idle and
    waking thread counts and the flags. A fetched job is in exactly one
    place: the worker's buffer, ``current``, ``events``, or back in trio's
    hands. Threads take jobs from the buffer with ``popleft`` under the
    lock; the trio thread appends to it, and empties it at a stop after
    :meth:`halt`.

    **Direct fetching.** Each job otherwise crosses threads twice per
    round: the trio fetcher wakes a thread, the thread wakes the trio
    collector (~100 µs together on a small VM, more than a whole round trip
    to the node). So when the fetcher has nothing to do but wait for
    outcomes (every slot in flight, none pending, no backoff, handlers
    quick, no heartbeats), it *lends* its role to the threads: a thread
    that runs dry sends the ACKs of the jobs done in direct mode and
    ``GETJOB NOHANG COUNT <free slots>`` on a blocking connection of its
    own to the same node, and runs what comes back, with no thread
    hand-over at all. One thread at a time does such a round trip
    (``leading``); it counts in-flight jobs exactly as the fetcher does, so
    ``max_in_flight`` holds. Direct mode closes, and the trio side takes
    over as before, when a round trip brings no job or fails (the trio
    client then fails over; direct mode stays off for ``DIRECT_RETRY``
    seconds), on a handler failure or a job to dead-letter, on stop, or
    when the trio fetcher, checking every ``HELPER_DELAY`` (every
    ``OUTCOME_LINGER`` with one thread), sees a handler running longer than
    that: ACKs must not wait behind a slow handler and buffered jobs then
    need the other threads. ACKs not sent yet are handed to the trio side
    (``handed``), jobs a round trip brought after the close go to it too
    (``late``), and the counters travel as deltas that
    :meth:`Worker._absorb` adds to the worker's.
    """

    def __init__(self, worker: "Worker") -> None:
        self.worker = worker
        self.cond = threading.Condition(threading.Lock())
        self.current: list[Job | None] = [None] * worker.concurrency
        self.threads: list[threading.Thread] = []
        self.idle = 0  # threads waiting for a job
        self.waking = 0  # of which notified, not running yet
        self.halted = False  # start no more jobs (stopping, or a handler raised KeyboardInterrupt...)
        self.closed = False  # exit: report nothing more
        self.events: list[tuple[int, Job, BaseException | None]] = []
        self.posted = False  # a wake-up for the collector is on its way
        self.abandoned: set[int] = set()  # threads left in a handler by close()
        self.slow = False  # the last handler to finish took more than SLOW_HANDLER
        self.pushed = 0  # jobs put in the buffer for the threads, so far
        self.popped = 0  # jobs taken from it by the threads, so far
        self.started = [0.0] * worker.concurrency  # perf_counter() when the running handler started
        # Direct fetching (see the class docstring): open while the trio fetcher lends its role.
        self.direct = False
        self.leading = False  # a thread is in a direct round trip
        self.direct_in_flight = 0  # jobs in flight, as the direct round trips count them
        self.direct_acks: list[str] = []  # done in direct mode, ACK not sent yet
        self.direct_address: Any = None
        self.direct_retry_at = 0.0  # time.monotonic() before which no direct mode opens (failed)
        self.rounds = 0  # direct round trips, so far
        self._conn: _Connection | None = None
        # For the trio thread to take (Worker._absorb): what direct mode did since the last take.
        self.dirty = False
        self.d_fetched = self.d_settled = self.d_processed = self.d_ack_errors = 0
        self.handed: list[str] = []  # ACKs direct mode left to the trio side (it closed)
        self.late: list[Job] = []  # jobs a round trip brought after direct mode closed
        self._token: trio.lowlevel.TrioToken | None = None
        self._wakeup: Callable[[], None] = lambda: None

    # ---------------------------------------------------------- trio side
    def start(self, token: trio.lowlevel.TrioToken, wakeup: Callable[[], None]) -> None:
        """Start the threads; ``wakeup`` runs in the trio thread when reports wait."""
        self._token, self._wakeup = token, wakeup
        for slot in range(len(self.current)):
            context = contextvars.copy_context()  # current_worker() works in handlers
            thread = threading.Thread(
                target=context.run, args=(self._main, slot), name="disque-py-handler-%d" % slot, daemon=True
            )
            thread.start()
            self.threads.append(thread)

    def jobs_ready(self, count: int) -> bool:
        """``count`` new jobs in the buffer: wake an idle thread, or as many as the jobs need if
        handlers are slow. True if more threads could help."""
        with self.cond:
            self.pushed += count
            waiting = len(self.worker._buffer)
            if self.slow:
                wake = min(waiting, self.idle) - self.waking
                if wake > 0:
                    self.waking += wake
                    self.cond.notify(wake)
            elif self.idle > self.waking == 0:
                self.waking = 1
                self.cond.notify()
            return self.idle > self.waking and waiting > self.waking

    def help(self, mark: int) -> bool:
        """If a job put in the buffer before ``pushed`` was ``mark`` is still there, wake idle
        threads for the buffered jobs. True if jobs still wait and more threads could help."""
        with self.cond:
            waiting = len(self.worker._buffer)
            if waiting and self.popped < mark and not self.halted:
                wake = min(waiting, self.idle - self.waking)
                if wake > 0:
                    self.waking += wake
                    self.cond.notify(wake)
            return self.idle > self.waking and waiting > self.waking

    def halt(self) -> None:
        with self.cond:
            self.halted = True
            self._close_direct()

    def take(self) -> list[tuple[int, Job, BaseException | None]]:
        with self.cond:
            events, self.events = self.events, []
            self.posted = False
        return events

    def busy(self) -> bool:
        """Reports waiting, a handler or a direct round trip running, or direct mode's results
        not taken."""
        with self.cond:
            return bool(self.events) or self.leading or self.dirty or any(job is not None for job in self.current)

    def running(self) -> int:
        return sum(job is not None for job in self.current)

    def close(self) -> tuple[list[Job], list[tuple[int, Job, BaseException | None]]]:
        """Make every thread exit (a running handler first returns); returns the jobs whose
        handler is still running (abandoned: their threads report nothing more) and the
        reports not collected yet."""
        with self.cond:
            if self.closed:
                return [], []
            self._close_direct()  # ACKs not sent yet go to the trio side
            self.closed = True
            running = []
            for slot, job in enumerate(self.current):
                if job is not None:
                    running.append(job)
                    self.abandoned.add(slot)
                    self.current[slot] = None
            events, self.events = self.events, []
            self.waking = self.idle
            self.cond.notify_all()
        return running, events

    def join(self, timeout: float) -> None:
        """Wait for the threads that are not running a handler (after :meth:`close`)."""
        for slot, thread in enumerate(self.threads):
            if slot not in self.abandoned:
                thread.join(timeout)
        if not self.leading:
            self._drop_connection()

    # ---------------------------------------------------------- thread side
    def _post(self) -> None:
        """Under the lock, after adding a report: wake the collector unless a wake-up is on its way."""
        if not self.posted:
            self.posted = True
            try:
                self._token.run_sync_soon(self._wakeup)  # type: ignore[union-attr]
            except trio.RunFinishedError:  # pragma: no cover - trio.run is over
                pass

    def _main(self, slot: int) -> None:
        worker = self.worker
        buffer = worker._buffer
        cond = self.cond
        current = self.current
        started = self.started
        handler = worker.handler
        limit = worker.max_attempts if worker.max_attempts is not None else math.inf
        beats = bool(worker.heartbeat)
        clock = time.perf_counter
        report: tuple[int, Job, BaseException | None] | None = None
        while True:
            with cond:
                if report is not None:
                    if self.closed:
                        return  # abandoned: the job was handed back
                    current[slot] = None
                    if self.direct and report[0] == _DONE and report[2] is None:
                        self.direct_acks.append(report[1].id)
                        self.d_processed += 1
                        self.dirty = True
                    else:
                        self._close_direct()  # a failure, a job to dead-letter: the trio side takes over
                        self.events.append(report)
                        self._post()
                    report = None
                while self.closed or self.halted or not buffer:
                    if self.closed:
                        return
                    if self.direct and not self.leading and not self.halted:
                        self._lead()
                        continue
                    self.idle += 1
                    cond.wait()
                    self.idle -= 1
                    self.waking -= 1
                job = buffer.popleft()
                current[slot] = job
                self.popped += 1
                if job.attempt > limit:
                    report = (_SKIPPED, job, None)
                    continue
                if beats:
                    self.events.append((_STARTED, job, None))
                    self._post()
            started[slot] = start = clock()
            try:
                _call_sync(handler, job)
            except BaseException as exc:  # noqa: BLE001 - any handler error is a job failure
                report = (_DONE, job, exc)
                if not isinstance(exc, Exception):
                    self.halted = True  # KeyboardInterrupt, SystemExit...: the worker stops
            else:
                report = (_DONE, job, None)
            started[slot] = 0.0
            self.slow = clock() - start > SLOW_HANDLER

    def _lead(self) -> None:
        """Under the lock, in direct mode with nothing buffered: one round trip (the lock is
        released meanwhile), its jobs into the buffer. Closes direct mode when the round trip
        brings nothing or fails."""
        worker = self.worker
        acks, self.direct_acks = self.direct_acks, []
        free = worker.max_in_flight - self.direct_in_flight + len(acks)
        if free <= 0:  # slots held by outcomes the trio side sends
            self.direct_acks = acks
            self._close_direct()
            return
        self.leading = True
        self.rounds += 1
        address = self.direct_address
        call = worker._getjob_call(free)
        argvs: list[tuple[Any, ...]] = [call.argv]
        if acks:
            argvs.insert(0, (_OPS[worker._ack_op], *acks))
        self.cond.release()
        replies: list[Any] | BaseException
        try:
            replies = self._round_trip(address, argvs, call)
        except BaseException as exc:  # noqa: BLE001 - reported below, under the lock
            replies = exc
        finally:
            self.cond.acquire()
            self.leading = False
        self.dirty = True
        if not self.direct:
            self._post()  # closed meanwhile: the trio side waits for this round trip to end
        got: Any = replies if isinstance(replies, BaseException) else replies[-1]
        if acks:
            if isinstance(replies, BaseException):
                self.handed += acks  # maybe not sent: sent again (a second ACK is harmless)
            else:
                if isinstance(replies[0], BaseException):
                    self.d_ack_errors += 1
                    log.error("%s of %d job(s) failed: %s", _OPS[worker._ack_op].decode(), len(acks), replies[0])
                self.d_settled += len(acks)
                self.direct_in_flight -= len(acks)
        if isinstance(got, BaseException):  # lost, refused or unreadable: the trio side goes on
            self._close_direct()
            self.direct_retry_at = time.monotonic() + DIRECT_RETRY
            self._drop_connection()
            log.info("direct fetching off for %.1f s: %s", DIRECT_RETRY, describe_error(got))
            if not isinstance(got, Exception):
                raise got
            return
        jobs: list[Job] = got
        n = len(jobs)
        self.d_fetched += n
        self.direct_in_flight += n
        worker._starved = n < free
        if not n:
            self._close_direct()
        elif self.direct:
            self.worker._buffer.extend(jobs)
            self.pushed += n
        else:
            self.late += jobs

    def _round_trip(self, address: Any, argvs: list[tuple[Any, ...]], call: cmd.Call[list[Job]]) -> list[Any]:
        """The direct connection's pipelined request (connecting first if needed), without the
        lock; the last reply (GETJOB's) parsed into jobs, or the error it raised."""
        conn = self._conn
        if conn is None or conn.address != address:
            self._drop_connection()
            conn = self._conn = _Connection(address, self.worker.client.config)
        replies = conn.request_many(argvs, self.worker.client.config.read_timeout(call))
        if not isinstance(replies[-1], BaseException):
            try:
                replies[-1] = call.parse(replies[-1])
            except Exception as exc:  # noqa: BLE001 - a reply that is not GETJOB's shape
                replies[-1] = DisqueError("unreadable GETJOB reply on the direct connection: %s" % describe_error(exc))
        return replies

    def _drop_connection(self) -> None:
        conn, self._conn = self._conn, None
        if conn is not None:
            conn.close()

    def _close_direct(self) -> None:
        """Under the lock: end direct mode; ACKs not sent go to the trio side."""
        if self.direct:
            self.direct = False
            if self.direct_acks:
                self.handed += self.direct_acks
                self.direct_acks = []
            self.dirty = True
            self._post()

    # ---------------------------------------------------------- direct mode, trio side
    def open_direct(self, in_flight: int, address: Any, longest: float) -> bool:
        """Lend the fetcher's role to the threads, if one of them has a job to finish (else
        every outcome is on its way to the trio side already), handlers are quick (the last
        one, and none running for more than ``longest`` seconds) and the direct connection
        did not fail in the last ``DIRECT_RETRY`` seconds."""
        with self.cond:
            if self.halted or self.closed or self.slow or self.leading:
                return False
            if not (self.worker._buffer or any(self.current)) or time.monotonic() < self.direct_retry_at:
                return False
            since = time.perf_counter() - longest
            if any(0.0 < start < since for start in self.started):
                return False
            self.direct = True
            self.direct_in_flight = in_flight
            self.direct_address = address
            return True

    def check_direct(self, longest: float) -> bool:
        """True while direct mode is open or its last round trip is on; closes it when a
        handler has run for more than ``longest`` seconds."""
        with self.cond:
            if self.direct:
                since = time.perf_counter() - longest
                if any(0.0 < start < since for start in self.started):
                    self._close_direct()
            return self.direct or self.leading

    def close_direct(self) -> None:
        with self.cond:
            self._close_direct()

    def take_direct(self) -> tuple[int, int, int, int, list[str], list[Job]]:
        """What direct mode did since the last take: jobs fetched, outcomes settled, jobs
        processed, ACK errors, ACKs and jobs left to the trio side."""
        with self.cond:
            taken = (self.d_fetched, self.d_settled, self.d_processed, self.d_ack_errors, self.handed, self.late)
            self.d_fetched = self.d_settled = self.d_processed = self.d_ack_errors = 0
            self.handed, self.late = [], []
            self.dirty = False
        return taken

    def direct_counts(self) -> tuple[int, int, int]:
        """Fetched, settled and processed in direct mode, not taken yet (for stats)."""
        with self.cond:
            return self.d_fetched, self.d_settled, self.d_processed


class Worker:
    """Runs ``handler(job)`` for jobs from ``queues``; see the module docstring.

    ``client_or_seeds``: a :class:`disque_py.aio.Client` (used as is, not
    closed), a :class:`disque_py.Client` (its settings are copied into a
    trio client), or seeds (``"host:port"``, a list of them; ``password``
    applies) for a new trio client.

    ``concurrency``: handlers at once. ``max_in_flight``: jobs fetched and
    not yet acknowledged, at most (default ``2 * concurrency``).
    ``max_attempts``: dead-letter on a failure of this attempt (None:
    never; the job's own MAXDELIVER still applies). ``dead_letter``:
    :data:`DEFAULT_DEAD_LETTER` (the cluster's dead letter, ``NACK ...
    DEAD``), a callable ``(job, error_text)`` (sync or async; the job is
    then acknowledged), or None to drop such jobs (ACK and log).
    ``retry_backoff``: the delay before a failed job comes back (NACK
    DELAY; default :data:`DEFAULT_RETRY_BACKOFF`, 1 s doubling up to 5
    min; None: at once). ``heartbeat``: False, True (auto) or seconds
    between WORKING commands. ``fast_ack``: FASTACK instead of ACKJOB.
    ``backoff``, ``backoff_after`` and ``backoff_ratio``: the consumer-wide
    pause, when ``backoff_ratio`` (0.9) of the last ``backoff_after`` (20)
    jobs failed (default :data:`DEFAULT_PAUSE_BACKOFF`, 0.5 s doubling up
    to 5 s). ``grace_period``: seconds running handlers get after a stop. ``fetch_timeout_ms``: how long one GETJOB
    blocks (it also bounds how long a stop waits for the fetcher).
    ``rng``: the random generator for the backoff jitter.
    """

    def __init__(
        self,
        client_or_seeds: Any,
        queues: str | Sequence[str],
        handler: Handler,
        *,
        concurrency: int = 1,
        max_in_flight: int | None = None,
        max_attempts: int | None = 5,
        dead_letter: DeadLetterHandler | None | _Default = DEFAULT_DEAD_LETTER,
        heartbeat: bool | float = False,
        fast_ack: bool = False,
        backoff: Backoff | None = None,
        backoff_after: int = 20,
        backoff_ratio: float = 0.9,
        retry_backoff: Backoff | None = DEFAULT_RETRY_BACKOFF,
        grace_period: float = 30.0,
        fetch_timeout_ms: int = 1000,
        password: str | None = None,
        rng: random.Random | None = None,
    ) -> None:
        if concurrency < 1:
            raise ValueError("concurrency must be >= 1")
        if max_in_flight is None:
            max_in_flight = 2 * concurrency
        if max_in_flight < concurrency:
            raise ValueError("max_in_flight (%d) must be >= concurrency (%d)" % (max_in_flight, concurrency))
        if max_attempts is not None and max_attempts < 1:
            raise ValueError("max_attempts must be >= 1 (or None)")
        if fetch_timeout_ms < 1:
            raise ValueError("fetch_timeout_ms must be >= 1")
        self.queues = [queues] if isinstance(queues, (str, bytes)) else list(queues)
        if not self.queues:
            raise ValueError("at least one queue is needed")
        self.handler = handler
        self.concurrency = concurrency
        self.max_in_flight = max_in_flight
        self.max_attempts = max_attempts
        self.dead_letter = dead_letter
        self.heartbeat = heartbeat
        self.fast_ack = fast_ack
        self.grace_period = grace_period
        self.fetch_timeout_ms = fetch_timeout_ms
        self._rng = rng or random.Random()
        self._gate = FailureGate(backoff or DEFAULT_PAUSE_BACKOFF, backoff_after, self._rng, backoff_ratio)
        self.retry_backoff = retry_backoff
        self._legacy = False  # the node refused NACK's options (a Disque node): plain NACKs, ADDJOB dead letters
        self._fetch_backoff = Backoff(initial=0.1, maximum=5.0)

        self._owns_client = False
        if isinstance(client_or_seeds, AioClient) or (
            not isinstance(client_or_seeds, SyncClient) and hasattr(client_or_seeds, "get_jobs")
        ):
            self.client = client_or_seeds
        elif isinstance(client_or_seeds, SyncClient):
            self.client = AioClient.from_config(client_or_seeds.config)
            self._owns_client = True
        else:
            self.client = AioClient(client_or_seeds, password=password)
            self._owns_client = True

        self._is_async = _is_async_callable(handler)
        self._fast_async = self._is_async and not heartbeat
        # plain functions: handler threads (see _HandlerThreads), started by run()
        self._threads: _HandlerThreads | None = None if self._is_async else _HandlerThreads(self)
        self._dead_is_async = callable(dead_letter) and _is_async_callable(dead_letter)
        # handler threads may fetch for themselves (see _HandlerThreads) on their own connection
        # to the trio client's node: not with heartbeats (the trio side starts them) or affinity
        # (the trio client follows the jobs' origin)
        self._direct_ok = (
            DIRECT_FETCH
            and self._threads is not None
            and not heartbeat
            and isinstance(self.client, AioClient)
            and not self.client.config.affinity
        )
        self._last_errors: OrderedDict[str, str] = OrderedDict()

        self._fetched = self._processed = self._failed = self._retried = self._dead = 0
        self._in_flight = self._running = self._backoffs = self._ack_errors = 0
        self._starved = False
        self._stopping = False
        self._stop_event = trio.Event()
        self._fetch_wake = _Wakeup()  # outcomes, free slots, gate or stop: for the fetcher
        self._ack_wake = _Wakeup()  # outcomes the fetcher will not carry, or the end: for the acker
        self._collect_wake = _Wakeup()  # reports from handler threads, or no more jobs: for the collector
        self._idle_runners: list[trio.lowlevel.Task] = []  # runners waiting for jobs
        self._runners_waking = 0  # runners woken, not running yet
        self._beats: dict[str, trio.CancelScope] = {}  # heartbeats of jobs in handler threads
        self._watch_scope = trio.CancelScope()  # the helper watch's sleep: its deadline when armed
        self._watch_armed = False
        self._watch_mark = 0
        self._buffer: deque[Job] = deque()  # fetched, not started
        self._fetch_done = False
        self._work_scope: trio.CancelScope | None = None
        self._grace_deadline = math.inf
        self._grace_changed = trio.Event()
        self._signal_scope = trio.CancelScope()
        self._nursery: trio.Nursery | None = None
        self._token: trio.lowlevel.TrioToken | None = None
        self._acks: list[str] = []  # IDs to ACKJOB (or FASTACK)
        self._nacks: list[str] = []  # IDs to NACK (plain: handed back)
        self._retries: list[_Retry] = []  # NACKs with options (DELAY, REASON, DEAD), one command each
        self._carrying = False  # the fetcher will send outcomes with its next GETJOB
        self._work_done = False
        self._batch_min = max(1, (max_in_flight + 1) // 2)
        self._ack_op = "fast_ack" if fast_ack else "ack"
        self._getjob_calls: dict[int, cmd.Call[list[Job]]] = {}
        self._fatal: BaseException | None = None

    # ------------------------------------------------------------ public
    def stats(self) -> WorkerStats:
        fetched, processed, in_flight = self._fetched, self._processed, self._in_flight
        if self._threads is not None:  # direct mode's counts not taken yet
            d_fetched, d_settled, d_processed = self._threads.direct_counts()
            fetched, processed = fetched + d_fetched, processed + d_processed
            in_flight += d_fetched - d_settled
        return WorkerStats(
            fetched, processed, self._failed, self._retried, self._dead,
            in_flight, self._running_count(), self._backoffs, self._ack_errors, self.starved(),
        )  # fmt: skip

    def starved(self) -> bool:
        """True when the worker has no more jobs available right now (see the module docstring)."""
        return self._starved and not self._buffer

    @property
    def stopping(self) -> bool:
        return self._stopping

    def stop(self, grace_period: float | None = None) -> None:
        """Stop fetching; finish or hand back jobs in hand within the grace period.

        Safe from the trio thread, from handler threads and from other threads.
        """
        try:
            trio.lowlevel.current_task()
        except RuntimeError:  # not in the trio thread
            if self._token is None:
                self._stopping = True  # not started yet: run() returns at once
                return
            self._token.run_sync_soon(self._stop_now, grace_period)
            return
        self._stop_now(grace_period)

    def _stop_now(self, grace_period: float | None) -> None:
        if grace_period is not None:
            self.grace_period = grace_period
        if grace_period is not None or not self._stop_event.is_set():
            self._grace_deadline = trio.current_time() + self.grace_period
            self._grace_changed.set()
            self._grace_changed = trio.Event()
        if not self._stopping:
            log.info("worker stopping: grace period %.1f s", self.grace_period)
        self._stopping = True
        self._stop_event.set()
        if self._threads is not None:
            self._threads.halt()  # before emptying the buffer: no thread takes a job after this
        self._drain_buffer()
        self._fetch_wake.fire()

    def _drain_buffer(self) -> None:
        """Hand back (NACK) the fetched jobs no runner has started."""
        buffer = self._buffer
        while buffer:
            try:
                job = buffer.popleft()
            except IndexError:  # pragma: no cover - a handler thread took it
                break
            self._hand_back(job)

    def _running_count(self) -> int:
        return self._running if self._threads is None else self._threads.running()

    def run_sync(self, *, handle_signals: bool = True) -> WorkerStats:
        """``trio.run`` the worker until stopped (SIGTERM/SIGINT by default)."""
        return trio.run(functools.partial(self.run, handle_signals=handle_signals))

    async def run(self, *, handle_signals: bool = False, task_status: Any = trio.TASK_STATUS_IGNORED) -> WorkerStats:
        """Run until :meth:`stop` (or a signal); returns the final stats. A worker runs once.

        A ``KeyboardInterrupt``/``SystemExit`` raised by a handler, or an
        :class:`~.errors.AuthError` from the node, stops the worker
        gracefully and is raised again here at the end.
        """
        self._token = trio.lowlevel.current_trio_token()
        token = _current_worker.set(self)
        threads = self._threads
        try:
            async with trio.open_nursery() as outer:
                outer.start_soon(self._ack_loop)
                timer_scope = trio.CancelScope()
                outer.start_soon(self._in_scope, timer_scope, self._grace_timer)
                if handle_signals:
                    await outer.start(self._signal_loop)
                async with trio.open_nursery() as work:
                    self._nursery = work
                    self._work_scope = work.cancel_scope
                    if threads is not None:
                        threads.start(self._token, self._collect_wake.fire)
                        work.start_soon(self._collector)
                    else:
                        for _ in range(self.concurrency):
                            work.start_soon(self._runner)
                    work.start_soon(self._fetch_loop)
                    task_status.started()
                if threads is not None:
                    threads.close()
                    self._absorb()
                self._drain_buffer()  # anything left (runners cancelled) goes back
                self._work_done = True
                self._ack_wake.fire()  # the acker sends what is left, then returns
                timer_scope.cancel()
                self._signal_scope.cancel()
                outer.cancel_scope.deadline = trio.current_time() + 10.0  # bounds the acker's last flush
        finally:
            if threads is not None:
                threads.close()
                threads.join(5.0)  # idle threads exit at once; abandoned ones when their handler returns
            _current_worker.reset(token)
            if self._owns_client:
                with trio.CancelScope(shield=True):
                    await self.client.aclose()
        stats = self.stats()
        log.info("worker stopped: %s", stats)
        if self._fatal is not None:
            raise self._fatal
        return stats

    # ------------------------------------------------------------ tasks
    def _queued(self) -> None:
        """An outcome was queued: wake the acker if it must send it; wake the fetcher only
        when it can act on it (see its batching rule) or when the first outcome starts its
        linger time."""
        if not self._carrying:
            self._ack_wake.fire()
            self._fetch_wake.fire()
        elif self._fetch_wake.task is not None:
            pending = len(self._acks) + len(self._nacks) + len(self._retries)
            if (
                pending == 1
                or not self._buffer
                or self.max_in_flight - self._in_flight + pending >= self._batch_min
            ):
                self._fetch_wake.fire()

    def _outcome(self, op: str, job: Job) -> None:
        """Queue ACKJOB/FASTACK/NACK for a job; the fetcher or the acker sends it."""
        (self._nacks if op == "nack" else self._acks).append(job.id)
        self._queued()

    def _send_retry(self, kind: str, job: Job, argv: tuple[Any, ...]) -> None:
        """Queue one NACK with options for a job (``kind``: "retry" or "dead")."""
        self._retries.append((kind, job, argv))
        self._queued()

    def _take_outcomes(self) -> list[tuple[str, list[Any]]]:
        """Pending outcomes as ``(op, ids)`` groups (one command each) and ``("retry",
        [(kind, job, argv)...])`` (one command per job)."""
        groups: list[tuple[str, list[Any]]] = []
        if self._acks:
            groups.append((self._ack_op, self._acks))
            self._acks = []
        if self._nacks:
            groups.append(("nack", self._nacks))
            self._nacks = []
        if self._retries:
            groups.append(("retry", self._retries))
            self._retries = []
        return groups

    @staticmethod
    def _outcome_calls(outcomes: list[tuple[str, list[Any]]]) -> list[cmd.Call[Any]]:
        calls: list[cmd.Call[Any]] = []
        for op, items in outcomes:
            if op == "retry":
                calls += [cmd.Call(argv, int) for _, _, argv in items]
            else:
                calls.append(cmd.Call((_OPS[op], *[i.encode() for i in items]), int))
        return calls

    def _outcomes_settled(self, outcomes: list[tuple[str, list[Any]]], results: list[Any]) -> None:
        """Replies to :meth:`_outcome_calls`' commands, in order (a DisqueError for a failed one)."""
        it = iter(results)
        for op, items in outcomes:
            if op == "retry":
                for entry in items:
                    result = next(it)
                    self._retry_settled(entry, result if isinstance(result, BaseException) else None)
            else:
                result = next(it)
                self._settled(op, len(items), result if isinstance(result, BaseException) else None)

    def _put_back(self, outcomes: list[tuple[str, list[Any]]]) -> None:
        """Outcomes maybe not sent (cancelled): the acker sends them (again: twice is harmless)."""
        for op, items in outcomes:
            if op == "retry":
                self._retries.extend(items)
            else:
                (self._nacks if op == "nack" else self._acks).extend(items)

    def _retry_settled(self, entry: _Retry, error: BaseException | None) -> None:
        """A NACK with options answered. Refused (a DELAY beyond the job's TTL, a node without
        these options): the job is NACKed plainly instead, so it is never lost."""
        if error is None:
            self._settled("nack", 1, None)
            return
        kind, job, argv = entry
        self._ack_errors += 1
        # Disque's NACK takes every argument for a job ID (-BADID); ours refuses unknown words
        if (isinstance(error, BadIdError) or "syntax error" in str(error)) and not self._legacy:
            self._legacy = True
            log.warning("the node does not know NACK's DELAY/REASON/DEAD (a Disque node?): failed jobs are "
                        "NACKed at once and dead letters written by the worker from now on")  # fmt: skip
        log.error("%s for job %s failed (%s): plain NACK instead", argv[0].decode(), job.id, error)
        if kind == "dead":
            self._dead -= 1
            self._retried += 1
        self._nacks.append(job.id)  # its slot stays taken until this NACK is answered
        self._queued()

    @staticmethod
    async def _in_scope(scope: trio.CancelScope, fn: Callable[[], Awaitable[Any]]) -> None:
        with scope:
            await fn()

    async def _signal_loop(self, task_status: Any = trio.TASK_STATUS_IGNORED) -> None:
        with self._signal_scope:
            with trio.open_signal_receiver(signal.SIGTERM, signal.SIGINT) as signals:
                task_status.started()
                async for signum in signals:
                    if not self._stopping:
                        log.info("got %s: stopping", signal.Signals(signum).name)
                        self._stop_now(None)
                    else:
                        log.info("got %s again: ending the grace period now", signal.Signals(signum).name)
                        self._stop_now(0.0)

    async def _grace_timer(self) -> None:
        """Once stopping, cancel the remaining work when the grace period is over."""
        await self._stop_event.wait()
        while trio.current_time() < self._grace_deadline:
            changed = self._grace_changed
            with trio.move_on_at(self._grace_deadline):
                await changed.wait()
        if self._work_scope is not None:
            log.warning("grace period over: cancelling %d running handler(s)", self._running_count())
            self._work_scope.cancel()

    def _carry(self, carrying: bool) -> None:
        """Whether the fetcher will send pending outcomes itself (else the acker does)."""
        if self._carrying != carrying:
            self._carrying = carrying
            if not carrying and (self._acks or self._nacks or self._retries):
                self._ack_wake.fire()

    async def _fetch_loop(self) -> None:
        """Fetch while there are free slots; carry pending outcomes in front of the GETJOB.

        Outcomes ride in the same pipeline as the next ``GETJOB NOHANG``: the
        node runs the ACKs first, so the slots they free can be filled in the
        same round trip without ever exceeding ``max_in_flight``. While the
        fetcher cannot carry them (a blocking GETJOB on the wire, a backoff
        pause, stopped) the acker sends them on another connection.

        Batching: while runners still have buffered jobs the fetcher waits
        until half the slots are free (it is woken only then, or when a
        runner runs dry), so outcomes and jobs move in batches, as in a
        hand-written pipelined loop, while the runners keep working. Pending
        outcomes wait at most ``OUTCOME_LINGER`` seconds for that.
        """
        errors = 0
        flush = False
        on_jobs = self._wake_runner if self._threads is None else self._jobs_for_threads
        try:
            while not self._stopping:
                limit, wait_until = self._gate.allowance(trio.current_time())
                if wait_until is not None:
                    self._carry(False)
                    with trio.move_on_at(wait_until):
                        await self._stop_event.wait()
                    continue
                pending = len(self._acks) + len(self._nacks) + len(self._retries)
                free = self.max_in_flight - self._in_flight + pending
                if limit is not None:
                    free = min(free, limit)
                elif self._buffer and free < self._batch_min and not flush:
                    free = 0  # runners still have work: wait until half the slots are free
                if free <= 0:
                    if limit is None and not pending and self._direct_ok and await self._lend():
                        continue
                    # Full: the next outcome frees a slot and we carry it. Held back
                    # by the gate (probing): the acker sends outcomes meanwhile.
                    self._carry(limit is None)
                    if pending and limit is None:
                        # ...but outcomes never wait long for a batch: a late ACK
                        # could let the node requeue a job that is done
                        with trio.move_on_after(OUTCOME_LINGER) as linger:
                            await self._fetch_wake.wait()
                        flush = linger.cancelled_caught
                    else:
                        await self._fetch_wake.wait()
                    continue
                flush = False
                outcomes = self._take_outcomes()
                self._carry(bool(outcomes))  # a NOHANG exchange is quick: new outcomes can wait for it
                try:
                    got = await self._exchange(outcomes, free)
                except AuthError as exc:  # no retry can fix a password: stop, raise it from run()
                    log.error("GETJOB failed: %s", exc)
                    self._fatal = self._fatal or exc
                    self._stop_now(None)
                    return
                except DisqueError as exc:
                    delay = self._fetch_backoff.delay(errors, self._rng)
                    errors += 1
                    log.warning("GETJOB failed (%s); again in %.2f s", exc, delay)
                    self._carry(False)
                    with trio.move_on_after(delay):
                        await self._stop_event.wait()
                    continue
                errors = 0
                self._fetched += len(got)
                self._in_flight += len(got)
                self._starved = len(got) < free
                if limit == 1 and got:
                    self._gate.took_probe(got[0].id)
                if self._stopping:
                    for job in got:
                        self._hand_back(job)
                elif got:
                    self._buffer.extend(got)
                    on_jobs(len(got))
        finally:
            self._carry(False)
            self._fetch_done = True
            if self._threads is None:
                self._wake_all_runners()
            else:
                self._collect_wake.fire()

    async def _lend(self) -> bool:
        """Let the handler threads fetch for themselves until they stop (direct mode, see
        :class:`_HandlerThreads`); False if it could not start."""
        threads = self._threads
        assert threads is not None
        gate = self._gate
        if gate.failing or gate.state is not FailureGate.OPEN:
            return False
        address = self.client.current_address
        longest = OUTCOME_LINGER if self.concurrency == 1 else HELPER_DELAY
        self._absorb()
        if address is None or not threads.open_direct(self._in_flight, address, longest):
            return False
        self._carry(False)
        try:
            await trio.lowlevel.checkpoint()
            while threads.check_direct(longest):
                with trio.move_on_after(longest):
                    await self._fetch_wake.wait()
        finally:
            threads.close_direct()
            self._absorb()
        if self._buffer and threads.help(threads.pushed) and not self._watch_armed:
            self._arm_watch()  # closed behind a slow handler: idle threads take the jobs left
        return True

    def _absorb(self) -> None:
        """Add what direct mode did to the worker's counts; take over what it left."""
        threads = self._threads
        assert threads is not None
        fetched, settled, processed, ack_errors, handed, late = threads.take_direct()
        self._fetched += fetched
        self._in_flight += fetched - settled
        self._processed += processed
        self._ack_errors += ack_errors
        if handed:
            self._acks += handed
            self._queued()
        if late:
            if self._stopping:
                for job in late:
                    self._hand_back(job)
            else:
                self._buffer.extend(late)
                self._jobs_for_threads(len(late))
        self._fetch_wake.fire()  # slots freed, or direct mode over: the fetcher looks again

    def _getjob_call(self, count: int) -> cmd.Call[list[Job]]:
        call = self._getjob_calls.get(count)
        if call is None:
            call = self._getjob_calls[count] = cmd.getjob(self.queues, count=count, nohang=True, with_counters=True)
        return call

    async def _exchange(self, outcomes: list[tuple[str, list[str]]], count: int) -> list[Job]:
        """Send ``outcomes`` and fetch up to ``count`` jobs (blocking only when there is nothing to send)."""
        if not outcomes:
            self._carry(False)  # the acker takes over while we block
            return await self.client.get_jobs(
                *self.queues, count=count, timeout_ms=self.fetch_timeout_ms, with_counters=True
            )
        calls = self._outcome_calls(outcomes)
        calls.append(self._getjob_call(count))
        try:
            results = await self.client.pipeline(calls)
        except DisqueError as exc:
            self._outcomes_settled(outcomes, [exc] * (len(calls) - 1))
            raise
        except BaseException:  # cancelled: the acker sends them (again: ACK twice is harmless)
            self._put_back(outcomes)
            raise
        self._outcomes_settled(outcomes, results[:-1])
        got = results[-1]
        if isinstance(got, DisqueError):
            raise got
        return got

    def _settled(self, op: str, count: int, error: BaseException | None) -> None:
        """Outcomes answered (or failed for good): their slots are free."""
        if error is not None:
            self._ack_errors += 1
            log.error("%s of %d job(s) failed: %s", _OPS[op].decode(), count, error)
        self._in_flight -= count
        self._fetch_wake.fire()

    def _hand_back(self, job: Job) -> None:
        """NACK a job we will not run (shutdown)."""
        self._retried += 1
        self._gate.neutral(job.id)
        self._outcome("nack", job)

    # ------------------------------------------------------------ async handlers
    def _wake_runner(self, _: int = 0) -> None:
        """Wake an idle runner, unless one is on its way already."""
        if self._idle_runners and not self._runners_waking:
            self._runners_waking = 1
            trio.lowlevel.reschedule(self._idle_runners.pop())

    def _wake_all_runners(self) -> None:
        idle = self._idle_runners
        while idle:
            self._runners_waking += 1
            trio.lowlevel.reschedule(idle.pop())

    async def _park_runner(self) -> None:
        """Wait until :meth:`_wake_runner` (or :meth:`_wake_all_runners`) picks this runner."""
        task = trio.lowlevel.current_task()
        idle = self._idle_runners
        idle.append(task)

        def abort(_: Any) -> trio.lowlevel.Abort:
            idle.remove(task)
            return trio.lowlevel.Abort.SUCCEEDED

        await trio.lowlevel.wait_task_rescheduled(abort)
        self._runners_waking -= 1

    async def _runner(self) -> None:
        buffer = self._buffer
        handler = self.handler
        fast = self._fast_async
        limit = self.max_attempts if self.max_attempts is not None else math.inf
        while True:
            if not buffer:
                if self._fetch_done:
                    return
                self._fetch_wake.fire()  # an idle runner: the fetcher should not wait for a bigger batch
                await self._park_runner()
                continue
            job = buffer.popleft()
            if self._stopping or job.attempt > limit:
                if buffer:
                    self._wake_runner()  # for the next job, should this one block
                await self._screen(job)
            elif fast:  # the common case, inlined: no heartbeat
                self._running += 1
                try:
                    coro = handler(job)
                    try:
                        message = coro.send(None)  # up to the handler's first pause, if any
                    except StopIteration:
                        pass  # done without pausing: the next job runs in this task too
                    else:
                        if buffer:
                            self._wake_runner()  # it waits: another runner takes the next job
                        await _resume(coro, message)
                except trio.Cancelled:
                    self._running -= 1
                    self._hand_back(job)
                    raise
                except BaseException as exc:  # noqa: BLE001 - any handler error is a job failure
                    self._running -= 1
                    await self._finish(job, exc)
                else:
                    self._running -= 1
                    self._succeeded(job)
            else:
                if buffer:
                    self._wake_runner()
                await self._process(job)

    async def _process(self, job: Job) -> None:
        """An async handler with heartbeats."""
        self._running += 1
        beat = self._start_heartbeat(job)
        try:
            await self.handler(job)
        except trio.Cancelled:
            self._hand_back(job)
            raise
        except BaseException as exc:  # noqa: BLE001 - any handler error is a job failure
            error: BaseException | None = exc
        else:
            error = None
        finally:
            self._running -= 1
            beat.cancel()
        await self._finish(job, error)

    # ------------------------------------------------------------ sync handlers
    def _jobs_for_threads(self, count: int) -> None:
        threads = self._threads
        assert threads is not None
        if threads.jobs_ready(count) and not self._watch_armed:
            self._arm_watch()

    def _arm_watch(self) -> None:
        """In HELPER_DELAY, check that no job has waited in the buffer all that time."""
        assert self._threads is not None
        self._watch_armed = True
        self._watch_mark = self._threads.pushed
        self._watch_scope.deadline = trio.current_time() + HELPER_DELAY

    async def _watch(self) -> None:
        """Wakes idle handler threads for jobs the busy ones leave waiting (see HELPER_DELAY).

        A thread does not wake another before each job (with quick handlers
        one thread runs a whole batch in less time than a wake-up takes).
        """
        threads = self._threads
        assert threads is not None
        while True:
            with trio.CancelScope(deadline=self._watch_scope.deadline) as self._watch_scope:
                await trio.sleep_forever()
            self._watch_armed = False
            self._watch_scope = trio.CancelScope()
            if threads.help(self._watch_mark):
                self._arm_watch()

    async def _collector(self) -> None:
        """Turn what the handler threads report into outcomes; returns when the work is over."""
        threads = self._threads
        assert threads is not None
        watch = trio.CancelScope()
        assert self._nursery is not None
        self._nursery.start_soon(self._in_scope, watch, self._watch)
        try:
            while True:
                if threads.dirty:
                    self._absorb()
                events = threads.take()
                if events:
                    self._collect(events)
                    continue
                if self._fetch_done and not self._buffer and not threads.busy():
                    watch.cancel()
                    return
                await self._collect_wake.wait()
        except trio.Cancelled:
            # The grace period is over (or run() was cancelled): settle what
            # finished, hand back what runs (its thread is abandoned).
            running, events = threads.close()
            self._collect(events, abandoning=True)
            for job in running:
                self._hand_back(job)
            raise

    def _collect(self, events: list[tuple[int, Job, BaseException | None]], abandoning: bool = False) -> None:
        beats = self._beats
        for kind, job, error in events:
            if kind == _DONE:
                if beats:
                    beat = beats.pop(job.id, None)
                    if beat is not None:
                        beat.cancel()
                if error is None:
                    self._succeeded(job)
                elif abandoning:  # no awaiting now: NACKed
                    self._failed += 1
                    self._retried += 1
                    self._outcome("nack", job)
                else:
                    text = self._fail(job, error)
                    if text is not None:
                        self._spawn(functools.partial(self._dead_letter, job, text, failure_counted=True))
            elif kind == _STARTED:
                if not abandoning:
                    beats[job.id] = self._start_heartbeat(job)
            elif abandoning:  # _SKIPPED
                self._hand_back(job)
            else:
                self._spawn(functools.partial(self._screen, job))

    def _spawn(self, fn: Callable[[], Awaitable[Any]]) -> None:
        assert self._nursery is not None
        self._nursery.start_soon(fn)

    # ------------------------------------------------------------ outcomes
    async def _screen(self, job: Job) -> bool:
        """Deal with a job that must not run (stopping, too many attempts); True if it was."""
        if self._stopping:
            self._hand_back(job)
            return True
        if self.max_attempts is not None and job.attempt > self.max_attempts:
            previous = self._last_errors.pop(job.id, None)
            reason = "attempt %d > max_attempts %d" % (job.attempt, self.max_attempts)
            self._gate.neutral(job.id)
            text = "%s; last error: %s" % (reason, previous) if previous else reason
            await self._dead_letter(job, text, failure_counted=False)
            return True
        return False

    def _succeeded(self, job: Job) -> None:
        self._processed += 1
        gate = self._gate
        if gate.failing or gate.state is not FailureGate.OPEN:
            gate.success(job.id)
        self._acks.append(job.id)
        self._queued()

    async def _finish(self, job: Job, error: BaseException | None) -> None:
        """After the handler: ACK, or NACK / dead-letter with the error."""
        if error is None:
            self._succeeded(job)
            return
        text = self._fail(job, error)
        if text is not None:
            await self._dead_letter(job, text, failure_counted=True)

    def _fail(self, job: Job, error: BaseException) -> str | None:
        """Count a handler failure and NACK the job, or return the error text if it must be dead-lettered."""
        self._failed += 1
        rejected = isinstance(error, Reject)
        text = (str(error) or describe_error(error)) if rejected else describe_error(error)
        fatal = not isinstance(error, Exception)
        self._record_failure(job)
        dead = rejected or (self.max_attempts is not None and job.attempt >= self.max_attempts and not fatal)
        if rejected:
            log.warning("job %s rejected (attempt %d): %s", job.id, job.attempt, text)
        elif dead:
            log.warning("job %s failed on its last attempt (%d): %s", job.id, job.attempt, text)
        elif fatal or self._legacy:
            log.warning("job %s failed (attempt %d): %s", job.id, job.attempt, text)
            self._remember_error(job.id, text)
            self._retried += 1
            self._outcome("nack", job)  # back at once
        elif job.last_delivery:  # its own MAXDELIVER: the node dead-letters it on this NACK
            log.warning("job %s failed on its last delivery (%d, MAXDELIVER): %s", job.id, job.attempt, text)
            self._dead += 1
            self._send_retry("dead", job, cmd.nack_argv([job.id], reason=text))
        else:
            delay = self._retry_delay(job)
            log.warning("job %s failed (attempt %d)%s: %s", job.id, job.attempt,
                        "" if delay is None else ", again in %.3f s" % delay, text)  # fmt: skip
            self._retried += 1
            self._send_retry("retry", job, cmd.nack_argv([job.id], delay=delay, reason=text))
        if fatal:  # KeyboardInterrupt, SystemExit...: stop gracefully, re-raise from run()
            if self._fatal is None:
                self._fatal = error
            self._stop_now(None)
        return text if dead else None

    def _retry_delay(self, job: Job) -> float | None:
        """Seconds before a failed job comes back (NACK's DELAY): exponential in its attempt,
        from ``retry_backoff``; None (the node decides) without it, or when the job has a
        BACKOFF of its own."""
        if self.retry_backoff is None or job.backoff is not None:
            return None
        return round(self.retry_backoff.delay(job.attempt - 1, self._rng), 3)

    def _record_failure(self, job: Job) -> None:
        delay = self._gate.failure(job.id, trio.current_time())
        if delay is not None:
            self._backoffs += 1
            gate = self._gate
            log.warning("%d of the last %d jobs failed: fetching paused for %.2f s",
                        gate.failing, len(gate.recent), delay)  # fmt: skip
        self._fetch_wake.fire()

    def _remember_error(self, job_id: str, text: str) -> None:
        self._last_errors[job_id] = text
        self._last_errors.move_to_end(job_id)
        while len(self._last_errors) > 1000:
            self._last_errors.popitem(last=False)

    async def _dead_letter(self, job: Job, error: str, *, failure_counted: bool) -> None:
        handler = self.dead_letter
        if handler is DEFAULT_DEAD_LETTER and not self._legacy:  # the cluster's dead letter
            self._dead += 1
            self._last_errors.pop(job.id, None)
            self._send_retry("dead", job, cmd.nack_argv([job.id], reason=error, dead=True))
            return
        try:
            if handler is DEFAULT_DEAD_LETTER:  # a node without NACK DEAD: a JSON DeadLetter
                await self.client.add_job(job.queue + ".dead", DeadLetter.from_job(job, error).encode())
            elif handler is None:
                log.error("job %s discarded after %d attempts: %s", job.id, job.attempt, error)
            elif self._dead_is_async:
                await handler(job, error)
            else:
                await trio.to_thread.run_sync(handler, job, error, abandon_on_cancel=True)
        except trio.Cancelled:
            self._hand_back(job)
            raise
        except Exception as exc:  # noqa: BLE001 - keep the job: NACK it, it comes back later
            log.error("dead-lettering job %s failed (%s): NACKed instead", job.id, describe_error(exc))
            if not failure_counted:  # a failure to process it all the same: it counts for the backoff
                self._record_failure(job)
            self._retried += 1
            self._outcome("nack", job)
            return
        self._dead += 1
        self._last_errors.pop(job.id, None)
        self._outcome(self._ack_op, job)

    # ------------------------------------------------------------ heartbeats, acker
    def _start_heartbeat(self, job: Job) -> trio.CancelScope:
        scope = trio.CancelScope()
        if self.heartbeat and self._nursery is not None:
            self._nursery.start_soon(self._heartbeat, job, scope)
        return scope

    async def _heartbeat(self, job: Job, scope: trio.CancelScope) -> None:
        fixed = None if self.heartbeat is True else float(self.heartbeat)
        with scope:
            await trio.sleep(fixed or 1.0)
            while True:
                try:
                    retry = await self.client.working(job.id)
                except (NoJobError, TooLateError, AckedError) as exc:
                    log.info("heartbeat for %s stopped: %s", job.id, exc)
                    return
                except DisqueError as exc:
                    log.warning("WORKING %s failed: %s", job.id, exc)
                    retry = None
                if retry == 0:
                    return
                await trio.sleep(fixed or max((retry or 1) / 2.0, 0.5))

    async def _ack_loop(self) -> None:
        """Send the outcomes the fetcher cannot carry; returns once the work is over and all are sent."""
        while True:
            if (self._acks or self._nacks or self._retries) and not self._carrying:
                for op, items in self._take_outcomes():
                    if op == "retry":  # one command per job, in one round trip
                        group = [(op, items)]
                        try:
                            results = await self.client.pipeline(self._outcome_calls(group))
                        except DisqueError as exc:
                            results = [exc] * len(items)
                        self._outcomes_settled(group, results)
                        continue
                    try:
                        await getattr(self.client, op)(*items)
                    except DisqueError as exc:
                        self._settled(op, len(items), exc)
                    else:
                        self._settled(op, len(items), None)
                continue
            if self._work_done and not (self._acks or self._nacks or self._retries):
                return
            await self._ack_wake.wait()
