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
* **runners** - ``concurrency`` tasks taking jobs from the local buffer
  and calling the handler: ``async def`` handlers are awaited in the
  task; plain functions run in worker threads (``trio.to_thread``, at
  most ``concurrency`` at once), each trip to a thread taking a fair share
  of the buffer (``ceil(buffered / concurrency)`` jobs, run one after the
  other) because a thread hop costs far more than a short handler; with
  heartbeats on, one job per trip. A handler succeeds by returning (the
  value is ignored) and fails by raising anything.
* **acker** - sends the outcomes the fetcher cannot carry (while its
  GETJOB blocks, during a backoff, after a stop) on another connection,
  one ``ACKJOB id id ...`` (or FASTACK / NACK) per batch.

Outcomes:

* success: ACKJOB (``fast_ack=True``: FASTACK);
* failure: NACK, so the job comes back at once with ``nacks`` + 1; the
  error text is logged;
* a failure on attempt ``max_attempts`` (``attempt = nacks +
  additional_deliveries + 1``), or a job *fetched* with an attempt above
  it (it failed elsewhere, or timed out): the dead-letter handler gets it,
  then it is acknowledged. The default handler ADDs a JSON
  :class:`~.model.DeadLetter` (original body, error text, counters) to
  ``<queue>.dead``. If dead-lettering fails the job is NACKed instead.

Failure backoff (:class:`FailureGate`): after ``backoff_after`` consecutive
failures the fetcher stops for ``backoff.delay(n)`` seconds (exponential,
jittered), then fetches a single *probe* job and waits for its outcome:
success goes back to full speed, failure backs off longer. Jobs already in
hand keep running meanwhile.

Heartbeats (off by default): ``heartbeat=<seconds>`` sends WORKING for a
job every that many seconds while its handler runs; ``heartbeat=True``
starts after one second and then uses half of the RETRY that WORKING
returns. They stop on -NOJOB/-TOOLATE/-ACKED or for RETRY 0 jobs.

Shutdown (:meth:`Worker.stop`, or SIGTERM/SIGINT with
``handle_signals=True``): the fetcher stops after its current GETJOB
(which waits at most ``fetch_timeout_ms``), jobs that arrive after the
stop and jobs not started yet are NACKed at once, running handlers get
``grace_period`` seconds to finish; then they are cancelled (a thread
cannot be killed: it is abandoned) and their jobs NACKed. A second signal
ends the grace period at once.

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
from collections import OrderedDict, deque
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import Any

import trio

from . import commands as cmd
from .aio import Client as AioClient
from .cluster import Backoff
from .errors import AckedError, AuthError, DisqueError, NoJobError, TooLateError
from .model import DeadLetter, Job
from .sync import Client as SyncClient

__all__ = ["Worker", "WorkerStats", "FailureGate", "current_worker", "describe_error", "DEFAULT_DEAD_LETTER"]

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
    DEAD_LETTER = "ADDJOB to <queue>.dead"


#: ``dead_letter=`` default: ADDJOB a :class:`DeadLetter` JSON body to ``<queue>.dead``.
DEFAULT_DEAD_LETTER = _Default.DEAD_LETTER


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
    jobs dead-lettered; ``in_flight``: fetched and not yet ACKed/NACKed
    (the node's answer counts); ``running``: jobs taken by runners (running,
    or next in a handler thread's share); ``backoffs``: failure backoffs
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

    States: ``open`` (fetch freely), ``backing-off`` (fetch nothing until
    ``until``), ``probing`` (fetch one job and wait for its outcome).
    """

    OPEN = "open"
    BACKING_OFF = "backing-off"
    PROBING = "probing"

    def __init__(self, backoff: Backoff, threshold: int, rng: random.Random) -> None:
        if threshold < 1:
            raise ValueError("backoff_after must be >= 1")
        self.backoff = backoff
        self.threshold = threshold
        self.rng = rng
        self.state = self.OPEN
        self.consecutive = 0
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

    def success(self, job_id: str) -> None:
        if self.state is self.OPEN and not self.consecutive:
            return  # the common case, kept cheap
        self.state = self.OPEN
        self.consecutive = 0
        self.level = 0
        self.probe = None

    def failure(self, job_id: str, now: float) -> float | None:
        """Record a failure; returns the backoff delay if one starts now."""
        self.consecutive += 1
        if self.state == self.BACKING_OFF:
            return None
        if self.state == self.PROBING and job_id != self.probe:
            return None  # an older job: the probe decides
        if self.state == self.PROBING or self.consecutive >= self.threshold:
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

#: Seconds an outcome (ACK/NACK) may wait to travel with a bigger batch.
OUTCOME_LINGER = 0.005


class _Signal:
    """A reusable wake-up: ``wait()`` blocks until the next ``fire()``.

    Waiters check their condition and call ``wait()`` with no checkpoint in
    between, so a ``fire()`` with nobody waiting can be dropped (it is, to
    keep the per-job cost low).
    """

    __slots__ = ("_event", "_waiters")

    def __init__(self) -> None:
        self._event = trio.Event()
        self._waiters = 0

    def fire(self) -> None:
        if self._waiters:
            self._event.set()
            self._event = trio.Event()

    async def wait(self) -> None:
        self._waiters += 1
        try:
            await self._event.wait()
        finally:
            self._waiters -= 1


def _is_async_callable(fn: Any) -> bool:
    call = getattr(type(fn), "__call__", None)  # noqa: B004 - an object with an async __call__
    return inspect.iscoroutinefunction(fn) or inspect.iscoroutinefunction(call)


class Worker:
    """Runs ``handler(job)`` for jobs from ``queues``; see the module docstring.

    ``client_or_seeds``: a :class:`disque_py.aio.Client` (used as is, not
    closed), a :class:`disque_py.Client` (its settings are copied into a
    trio client), or seeds (``"host:port"``, a list of them; ``password``
    applies) for a new trio client.

    ``concurrency``: handlers at once. ``max_in_flight``: jobs fetched and
    not yet acknowledged, at most (default ``2 * concurrency``).
    ``max_attempts``: dead-letter on a failure of this attempt (None:
    never). ``dead_letter``: :data:`DEFAULT_DEAD_LETTER`, a callable
    ``(job, error_text)`` (sync or async), or None to drop such jobs (ACK
    and log). ``heartbeat``: False, True (auto) or seconds between WORKING
    commands. ``fast_ack``: FASTACK instead of ACKJOB. ``backoff`` and
    ``backoff_after``: the failure backoff (default 1 s doubling up to 60 s,
    after 3 consecutive failures). ``grace_period``: seconds running
    handlers get after a stop. ``fetch_timeout_ms``: how long one GETJOB
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
        backoff_after: int = 3,
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
        self._gate = FailureGate(backoff or Backoff(initial=1.0, maximum=60.0), backoff_after, self._rng)
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
        self._batch_sync = not self._is_async and not heartbeat  # heartbeats are per job: one job per trip
        self._fast_async = self._is_async and not heartbeat
        self._thread_stop = threading.Event()  # tells handler threads not to start more jobs
        self._batches: list[list[int]] = []  # per batch in a thread: how many jobs wait there
        self._dead_is_async = callable(dead_letter) and _is_async_callable(dead_letter)
        self._limiter = trio.CapacityLimiter(concurrency)
        self._last_errors: OrderedDict[str, str] = OrderedDict()

        self._fetched = self._processed = self._failed = self._retried = self._dead = 0
        self._in_flight = self._running = self._backoffs = self._ack_errors = 0
        self._starved = False
        self._stopping = False
        self._stop_event = trio.Event()
        self._changed = _Signal()  # outcomes, free slots, gate or stop: for the fetcher and the acker
        self._jobs_ready = _Signal()  # jobs in the buffer, or no more coming: for the runners
        self._buffer: deque[Job] = deque()  # fetched, not started
        self._fetch_done = False
        self._work_scope: trio.CancelScope | None = None
        self._grace_deadline = math.inf
        self._grace_changed = trio.Event()
        self._signal_scope = trio.CancelScope()
        self._nursery: trio.Nursery | None = None
        self._token: trio.lowlevel.TrioToken | None = None
        self._outcomes: list[tuple[str, Job]] = []  # ACK/NACK to send
        self._carrying = False  # the fetcher will send outcomes with its next GETJOB
        self._work_done = False
        self._batch_min = max(1, (max_in_flight + 1) // 2)
        self._ack_op = "fast_ack" if fast_ack else "ack"
        self._fatal: BaseException | None = None

    # ------------------------------------------------------------ public
    def stats(self) -> WorkerStats:
        return WorkerStats(
            self._fetched, self._processed, self._failed, self._retried, self._dead,
            self._in_flight, self._running, self._backoffs, self._ack_errors, self.starved(),
        )  # fmt: skip

    def starved(self) -> bool:
        """True when the worker has no more jobs available right now (see the module docstring)."""
        return self._starved and not self._buffer and not any(w[0] for w in self._batches)

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
        self._thread_stop.set()
        self._drain_buffer()
        self._notify()

    def _drain_buffer(self) -> None:
        """Hand back (NACK) the fetched jobs no runner has started."""
        while self._buffer:
            self._hand_back(self._buffer.popleft())

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
                    work.start_soon(self._fetch_loop)
                    for _ in range(self.concurrency):
                        work.start_soon(self._runner)
                    task_status.started()
                self._drain_buffer()  # anything left (runners cancelled) goes back
                self._work_done = True
                self._changed.fire()  # the acker sends what is left, then returns
                timer_scope.cancel()
                self._signal_scope.cancel()
                outer.cancel_scope.deadline = trio.current_time() + 10.0  # bounds the acker's last flush
        finally:
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
    def _notify(self) -> None:
        self._changed.fire()

    def _outcome(self, op: str, job: Job) -> None:
        """Queue ACKJOB/FASTACK/NACK for a job; the fetcher or the acker sends it.

        Wakes the fetcher only when it can act on it (see its batching rule),
        when the first outcome starts its linger time, or when the acker has
        to send it.
        """
        outcomes = self._outcomes
        outcomes.append((op, job))
        if (
            not self._carrying
            or len(outcomes) == 1
            or not self._buffer
            or self.max_in_flight - self._in_flight + len(outcomes) >= self._batch_min
        ):
            self._changed.fire()

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
            log.warning("grace period over: cancelling %d running handler(s)", self._running)
            self._work_scope.cancel()

    def _carry(self, carrying: bool) -> None:
        """Whether the fetcher will send pending outcomes itself (else the acker does)."""
        if self._carrying != carrying:
            self._carrying = carrying
            if not carrying:
                self._changed.fire()

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
        try:
            while not self._stopping:
                limit, wait_until = self._gate.allowance(trio.current_time())
                if wait_until is not None:
                    self._carry(False)
                    with trio.move_on_at(wait_until):
                        await self._stop_event.wait()
                    continue
                free = self.max_in_flight - self._in_flight + len(self._outcomes)
                if limit is not None:
                    free = min(free, limit)
                elif self._buffer and free < self._batch_min and not flush:
                    free = 0  # runners still have work: wait until half the slots are free
                if free <= 0:
                    # Full: the next outcome frees a slot and we carry it. Held back
                    # by the gate (probing): the acker sends outcomes meanwhile.
                    self._carry(limit is None)
                    if self._outcomes and limit is None:
                        # ...but outcomes never wait long for a batch: a late ACK
                        # could let the node requeue a job that is done
                        with trio.move_on_after(OUTCOME_LINGER) as linger:
                            await self._changed.wait()
                        flush = linger.cancelled_caught
                    else:
                        await self._changed.wait()
                    continue
                flush = False
                outcomes, self._outcomes = self._outcomes, []
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
                    self._jobs_ready.fire()
        finally:
            self._carry(False)
            self._fetch_done = True
            self._jobs_ready.fire()

    async def _exchange(self, outcomes: list[tuple[str, Job]], count: int) -> list[Job]:
        """Send ``outcomes`` and fetch up to ``count`` jobs (blocking only when there is nothing to send)."""
        if not outcomes:
            self._carry(False)  # the acker takes over while we block
            return await self.client.get_jobs(
                *self.queues, count=count, timeout_ms=self.fetch_timeout_ms, with_counters=True
            )
        groups = self._group(outcomes)
        calls = [cmd.ids_command(_OPS[op], [j.id for j in group]) for op, group in groups.items()]
        calls.append(cmd.getjob(self.queues, count=count, nohang=True, with_counters=True))
        try:
            results = await self.client.pipeline(calls)
        except DisqueError as exc:
            self._settled(groups, exc)
            raise
        except BaseException:  # cancelled: the acker sends them (again: ACK twice is harmless)
            self._outcomes[:0] = outcomes
            raise
        for (op, group), result in zip(groups.items(), results):
            self._settled({op: group}, result if isinstance(result, DisqueError) else None)
        got = results[-1]
        if isinstance(got, DisqueError):
            raise got
        return got

    @staticmethod
    def _group(outcomes: list[tuple[str, Job]]) -> dict[str, list[Job]]:
        groups: dict[str, list[Job]] = {}
        for op, job in outcomes:
            groups.setdefault(op, []).append(job)
        return groups

    def _settled(self, groups: dict[str, list[Job]], error: BaseException | None) -> None:
        """Outcomes answered (or failed for good): their slots are free."""
        for op, group in groups.items():
            if error is not None:
                self._ack_errors += 1
                log.error("%s of %d job(s) failed: %s", _OPS[op].decode(), len(group), error)
            self._in_flight -= len(group)
        self._notify()

    def _hand_back(self, job: Job) -> None:
        """NACK a job we will not run (shutdown)."""
        self._retried += 1
        self._gate.neutral(job.id)
        self._outcome("nack", job)

    async def _runner(self) -> None:
        buffer = self._buffer
        while True:
            if not buffer:
                if self._fetch_done:
                    return
                self._changed.fire()  # an idle runner: the fetcher should not wait for a bigger batch
                await self._jobs_ready.wait()
                continue
            if self._batch_sync:
                # Sync handlers: a fair share of the buffer per trip to a thread
                # (a thread hop costs far more than a no-op handler).
                share = -(-len(buffer) // self.concurrency)
                batch = []
                while buffer and len(batch) < share:
                    job = buffer.popleft()
                    if not await self._screen(job):
                        batch.append(job)
                if batch:
                    await self._process_batch(batch)
                continue
            job = buffer.popleft()
            if self._stopping or (self.max_attempts is not None and job.attempt > self.max_attempts):
                await self._screen(job)
            elif self._fast_async:  # the common case, inlined: an async handler, no heartbeat
                self._running += 1
                try:
                    await self.handler(job)
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
                await self._process(job)

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

    async def _call_handler(self, job: Job) -> BaseException | None:
        """Run the handler; returns what it raised (None on success). Cancellation propagates."""
        try:
            if self._is_async:
                await self.handler(job)
            else:
                await trio.to_thread.run_sync(self._call_sync, job, limiter=self._limiter, abandon_on_cancel=True)
        except trio.Cancelled:
            raise
        except BaseException as exc:  # noqa: BLE001 - any handler error is a job failure
            return exc
        return None

    def _call_sync(self, job: Job) -> None:
        result = self.handler(job)
        if inspect.isawaitable(result):
            close = getattr(result, "close", None)
            if close is not None:
                close()
            raise TypeError("the handler returned an awaitable: declare it with async def")

    def _run_batch(self, jobs: list[Job], results: list[BaseException | None], waiting: list[int]) -> None:
        """In a worker thread: the handler on each job in turn, until a stop or a fatal error.

        ``waiting[0]`` counts the jobs of the batch not started yet (for :meth:`starved`).
        """
        for i, job in enumerate(jobs):
            if self._thread_stop.is_set():
                return
            waiting[0] = len(jobs) - i - 1
            try:
                self._call_sync(job)
            except BaseException as exc:  # noqa: BLE001 - any handler error is a job failure
                results.append(exc)
                if not isinstance(exc, Exception):
                    return
            else:
                results.append(None)

    async def _process_batch(self, jobs: list[Job]) -> None:
        results: list[BaseException | None] = []
        waiting = [len(jobs)]
        self._batches.append(waiting)
        self._running += len(jobs)
        try:
            await trio.to_thread.run_sync(
                self._run_batch, jobs, results, waiting, limiter=self._limiter, abandon_on_cancel=True
            )
        except trio.Cancelled:
            # Abandoned at the end of the grace period: settle what finished
            # (no awaiting now: failures are NACKed), hand back the rest.
            done = list(results)
            for job, error in zip(jobs, done):
                if error is None:
                    self._succeeded(job)
                else:
                    self._failed += 1
                    self._retried += 1
                    self._outcome("nack", job)
            for job in jobs[len(done) :]:
                self._hand_back(job)
            raise
        finally:
            self._running -= len(jobs)
            self._batches.remove(waiting)
        for job, error in zip(jobs, results):
            await self._finish(job, error)
        for job in jobs[len(results) :]:  # not started: stopping, or after a fatal error
            self._hand_back(job)

    async def _process(self, job: Job) -> None:
        self._running += 1
        beat: trio.CancelScope | None = None
        if self.heartbeat and self._nursery is not None:
            beat = trio.CancelScope()
            self._nursery.start_soon(self._heartbeat, job, beat)
        try:
            error = await self._call_handler(job)
        except trio.Cancelled:
            self._hand_back(job)
            raise
        finally:
            self._running -= 1
            if beat is not None:
                beat.cancel()
        await self._finish(job, error)

    def _succeeded(self, job: Job) -> None:
        self._processed += 1
        self._gate.success(job.id)
        self._outcome(self._ack_op, job)

    async def _finish(self, job: Job, error: BaseException | None) -> None:
        """After the handler: ACK, or NACK / dead-letter with the error."""
        if error is None:
            self._succeeded(job)
            return
        self._failed += 1
        text = describe_error(error)
        fatal = not isinstance(error, Exception)
        self._record_failure(job)
        if self.max_attempts is not None and job.attempt >= self.max_attempts and not fatal:
            log.warning("job %s failed on its last attempt (%d): %s", job.id, job.attempt, text)
            await self._dead_letter(job, text, failure_counted=True)
        else:
            log.warning("job %s failed (attempt %d): %s", job.id, job.attempt, text)
            self._remember_error(job.id, text)
            self._retried += 1
            self._outcome("nack", job)
        if fatal:  # KeyboardInterrupt, SystemExit...: stop gracefully, re-raise from run()
            if self._fatal is None:
                self._fatal = error
            self._stop_now(None)

    def _record_failure(self, job: Job) -> None:
        delay = self._gate.failure(job.id, trio.current_time())
        if delay is not None:
            self._backoffs += 1
            log.warning("%d consecutive failures: fetching paused for %.2f s", self._gate.consecutive, delay)
        self._notify()

    def _remember_error(self, job_id: str, text: str) -> None:
        self._last_errors[job_id] = text
        self._last_errors.move_to_end(job_id)
        while len(self._last_errors) > 1000:
            self._last_errors.popitem(last=False)

    async def _dead_letter(self, job: Job, error: str, *, failure_counted: bool) -> None:
        handler = self.dead_letter
        try:
            if handler is DEFAULT_DEAD_LETTER:
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
            if self._outcomes and not self._carrying:
                batch, self._outcomes = self._outcomes, []
                groups = self._group(batch)
                for op, group in groups.items():
                    try:
                        await getattr(self.client, op)(*[j.id for j in group])
                    except DisqueError as exc:
                        self._settled({op: group}, exc)
                    else:
                        self._settled({op: group}, None)
                continue
            if self._work_done and not self._outcomes:
                return
            await self._changed.wait()
