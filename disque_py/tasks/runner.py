"""What a worker runs for each task job: the handler given to :class:`~disque_py.client.worker.Worker`.

:class:`Runner` is one ``async def`` handler, so the Worker's trio runners (as
many as ``concurrency``) take the jobs and its flow control, retries, dead
letters and graceful shutdown apply as they are. For each job:

1. decode the body (:mod:`.message`), find the task by name, check the
   arguments against its signature. A body that cannot be read or arguments
   that do not fit can never succeed: the worker raises
   :class:`~disque_py.client.worker.Reject` and the job is dead-lettered at once
   (``NACK <id> DEAD REASON <what is wrong>``), with an error result for a
   waiter, if the message asked for one. A task this worker does not know may be
   known to another (a deploy of new code under way): it is given back
   (:class:`~disque_py.client.worker.GiveBack`, ``RELEASE <id> DELAY <s>``: no
   attempt used; 1 s, doubled at each return, at most a minute), and rejected
   as above once given back ``unknown_task_returns`` times (10 by default:
   about five minutes);
2. run the task with its hooks (:mod:`.hooks`): ``async def`` tasks in the trio
   thread, plain functions in a thread (``trio.to_thread``, at most
   ``concurrency`` at once), under the task's time limit (:mod:`.timelimit`);
3. success: the result job is written (:mod:`.writes`), then the Worker ACKs;
4. failure: a retry when the job has deliveries left (the worker NACKs it with
   the error as REASON and its traceback as TRACE; the node's BACKOFF, or the
   worker's retry delay, decides when it comes back), else an error result is
   written (with the traceback) and the job is dead-lettered with the error (its
   MAXDELIVER does it on the NACK; a job sent without MAXDELIVER, e.g. from
   redis-cli, is rejected once ``retries`` are spent). The worker logs each failure,
   once, with its traceback (``disque_py.worker``); the traceback is formatted once
   (``trace_of``), for the result and the NACK alike;
5. a chord's member (:mod:`.chords`): its result is followed by its chord's check,
   a delivery after its first reads its result before it runs (:func:`.writes.settle_member`),
   and its last run comes one delivery before its MAXDELIVER (the spare, for a worker lost).

A task cancelled while it runs (``TaskRef.cancel()``: a notice on the worker's control queue,
``client/worker/control.py``, handed to :meth:`Runner.cancel`) is stopped: an ``async def``
task's cancel scope is cancelled, a plain function gets :class:`~.timelimit.TaskCancelled`
raised in its thread (as its time limit would). It then ends as revoked: the ``TaskRevoked``
result (the canceller wrote one first; the first written wins), no retry, no dead letter (the
worker ACKs the job). A job whose notice came before it started is not run. ``ctx.progress()``
goes to the worker's beats (:meth:`Worker.report_progress`).

The counters (:class:`~.metrics.TaskMetrics`) are served on ``/metrics`` when the worker
is asked to (``metrics_port``, :mod:`.metrics`). The runner reaches the cluster only through
the worker's client, with its public calls.
"""

from __future__ import annotations

import functools
import importlib
import inspect
import logging
import random
import threading
import time
from typing import TYPE_CHECKING, Any

import trio

from ..client.worker import GiveBack, Reject, Worker, describe_error, trace_of
from . import hooks
from .chords import last_run, with_errors
from .hooks import TaskContext, current_task
from .control import REVOKED
from .message import MessageError, Outcome, decode
from .metrics import TaskMetrics, serve_metrics
from .timelimit import TIME_LIMIT_GRACE, TaskCancelled, ThreadCall, TimeLimitExceeded, exceeded, run_in_thread
from .tracing import active
from .writes import add_next_in_chain, settle_member, write_chain_failure, write_result

if TYPE_CHECKING:
    from .app import App, Task

__all__ = ["current_task", "Runner", "TaskContext", "TaskMetrics", "TimeLimitExceeded", "TIME_LIMIT_GRACE",
           "make_worker", "run_worker", "serve_metrics"]  # fmt: skip

log = logging.getLogger("disque_py.tasks")

#: A job naming a task the worker does not know is given back this many times at most (a
#: stop's returns count too), then dead-lettered (UnknownTask).
UNKNOWN_TASK_RETURNS = 10
#: Its first return's delay (seconds), doubled at each return, at most UNKNOWN_TASK_DELAY_MAX:
#: 1 + 2 + ... + 32 + 60 x 4 s, about five minutes for a deploy to reach a worker that knows it.
UNKNOWN_TASK_DELAY = 1.0
UNKNOWN_TASK_DELAY_MAX = 60.0
#: Cancel notices remembered for jobs this worker does not run (yet): one fetched after its
#: notice came is not run.
CANCELLED_KEPT = 1024


class Runner:
    """The Worker's handler for an app's task jobs (see the module docstring)."""

    def __init__(self, app: "App", *, concurrency: int = 8, metrics: TaskMetrics | None = None,
                 unknown_task_returns: int = UNKNOWN_TASK_RETURNS, unknown_task_delay: float = UNKNOWN_TASK_DELAY) -> None:  # fmt: skip
        self.app = app
        self.unknown_task_returns = unknown_task_returns
        self.unknown_task_delay = unknown_task_delay
        self.concurrency = concurrency
        self.metrics = metrics or TaskMetrics()
        self.limiter = trio.CapacityLimiter(concurrency)
        self.worker: Worker | None = None  # set by make_worker; its trio client writes the results
        self.running: dict[str, Any] = {}  # job ID -> what stops it (a CancelScope, a ThreadCall)
        self.cancelled: dict[str, None] = {}  # job IDs of the cancel notices, oldest first (CANCELLED_KEPT)

    @property
    def client(self) -> Any:
        """The worker's trio client, which writes results and chains."""
        assert self.worker is not None
        return self.worker.client

    def describe(self, job: Any) -> str:
        """A running job's label in the worker's beats (``disque-py workers``): its task's name
        (read at each beat, not per job)."""
        try:
            return decode(job.body)[0].task
        except MessageError:
            return "?"

    # ------------------------------------------------------------ cancel and progress
    def cancel(self, job_id: str) -> bool:
        """A cancel notice (the worker's ``on_cancel``, in the trio thread): stop the job if it
        runs here; remembered, so that it does not run if it comes later. True if it ran here."""
        cancelled = self.cancelled
        cancelled[job_id] = None
        while len(cancelled) > CANCELLED_KEPT:
            del cancelled[next(iter(cancelled))]
        handle = self.running.get(job_id)
        if handle is None:
            return False
        log.info("task job %s cancelled while it runs", job_id)
        handle.cancel()
        return True

    def report_progress(self, job_id: str, done: float, total: float | None, note: str | None) -> None:
        """A task's ``ctx.progress(...)`` (any thread): into the worker's beats."""
        worker = self.worker
        if worker is not None:
            worker.report_progress(job_id, done, total, note)

    async def _revoked(self, job: Any, message: Any, serializer: str, task_name: str, ran: bool) -> None:
        """The job ends as revoked: its TaskRevoked result (the canceller's stands if it is
        written), the chain's end, and a normal return, so that the worker ACKs it."""
        self.metrics.count("revoked", task_name)
        if ran and self.worker is not None:
            self.worker.beat_soon()  # off the beats' running list within a second
        text = "task %s (%s) was cancelled %s" % (task_name, job.id, "while it ran" if ran else "before it ran")
        outcome = Outcome(False, None, REVOKED, text)
        await write_result(self.client, job, message, serializer, outcome)
        if message.chain is not None:
            await write_chain_failure(self.client, job, message.chain, serializer, outcome)

    # ------------------------------------------------------------ the handler
    async def __call__(self, job: Any) -> None:
        traced = active(self.app)
        if traced is not None:  # in a run span, continuing the body's trace (tasks/tracing.py)
            return await traced.run(job, self._handle, self.worker)
        await self._handle(job)

    async def _handle(self, job: Any) -> None:
        try:
            message, serializer = decode(job.body)
        except MessageError as exc:
            self.metrics.count("rejected", "?")
            raise Reject("bad task message: %s" % exc) from None
        message = with_errors(message)  # a chord's callback given its members' errors: TaskErrors in place
        task = self.app.tasks.get(message.task)
        if task is None:
            text = "no task named %r in this worker's app" % message.task
            returns = job.returns
            if returns < self.unknown_task_returns:
                # A deploy of new code: a worker that knows it may come; given back, no attempt used
                # +-25 %: a delay in step with the workers' fetch timeouts would hand it back to the
                # worker that gave it back, whose GETJOB then always waits the longest
                delay = min(self.unknown_task_delay * (1 << min(returns, 16)), UNKNOWN_TASK_DELAY_MAX)
                delay = round(delay * (0.75 + random.random() / 2), 3)
                self.metrics.count("given_back", message.task)
                raise GiveBack("UnknownTask: " + text, delay=delay, limit=self.unknown_task_returns)
            self.metrics.count("rejected", message.task)
            text += " (given back %d times: no worker knew it)" % returns
            await write_result(self.client, job, message, serializer, Outcome(False, None, "UnknownTask", text))
            raise Reject("UnknownTask: " + text)
        try:
            task.check_arguments(message.args, message.kwargs)
        except TypeError as exc:
            self.metrics.count("rejected", task.name)
            text = "wrong arguments for task %s: %s" % (task.name, exc)
            await write_result(self.client, job, message, serializer, Outcome(False, None, "TypeError", text))
            raise Reject("TypeError: " + text) from None
        if message.chord is not None:  # a chord's member: its last run comes before a spare delivery (chords.py)
            last = last_run(job, task)
            if await settle_member(self.client, job, message, serializer, last):
                return
            final = job.attempt >= last
        elif job.maxdeliver is not None:
            final = job.last_delivery
        else:  # no MAXDELIVER on the job (sent from elsewhere): the task's retries decide
            final = job.attempt > task.retries
        if job.id in self.cancelled:
            return await self._revoked(job, message, serializer, task.name, ran=False)
        ctx = TaskContext(task, job.id, job.queue, message.args, message.kwargs, message.meta, job.attempt, final)
        ctx.started = time.monotonic()
        ctx.reporter = self.report_progress
        try:
            if task.is_async:
                with trio.CancelScope() as scope:
                    self.running[job.id] = scope
                    value = await hooks.run_async(self.app, task, ctx)
                if scope.cancelled_caught:
                    return await self._revoked(job, message, serializer, task.name, ran=True)
            else:
                value = await self._run_thread(task, ctx)
        except Exception as exc:  # logged by the worker, once, with its traceback
            if job.id in self.cancelled:  # TaskCancelled raised in its thread (or anything after the notice)
                return await self._revoked(job, message, serializer, task.name, ran=True)
            ctx.duration = time.monotonic() - ctx.started
            # formatted here, once, from the task's own frames: the worker's NACK reuses it
            trace = trace_of(exc, ctx.error_tb if ctx.error is exc else None)
            if not final:
                self.metrics.count("retried", task.name, ctx.duration)
                raise
            self.metrics.count("failed", task.name, ctx.duration)
            failed = Outcome(False, None, type(exc).__name__, _message_of(exc), trace)
            await write_result(self.client, job, message, serializer, failed)
            if message.chain is not None:  # the chain ends here: its waiter reads the error
                await write_chain_failure(self.client, job, message.chain, serializer, failed)
            if job.maxdeliver is None or message.chord is not None:
                raise Reject(describe_error(exc)) from exc  # its traceback is its cause's
            raise  # a NACK on the last delivery: the node dead-letters it with this error
        finally:
            self.running.pop(job.id, None)
        if job.id in self.cancelled:  # it finished as the notice came: the canceller's result stands
            return await self._revoked(job, message, serializer, task.name, ran=True)
        ctx.duration = time.monotonic() - ctx.started
        await write_result(self.client, job, message, serializer, Outcome(True, value), reject_unserializable=True)
        if message.chain is not None:
            await add_next_in_chain(self.client, job, message, serializer, value)
        self.metrics.count("done", task.name, ctx.duration)

    async def _run_thread(self, task: "Task", ctx: TaskContext) -> Any:
        """A plain-function task in a thread, under its time limit."""
        call = ThreadCall(functools.partial(hooks.run_sync, self.app, task, ctx))
        self.running[ctx.job_id] = call
        finished, value = await run_in_thread(call.fn, task.timeout, self.limiter, call)
        if finished:
            return value
        if ctx.job_id in self.cancelled:
            log.warning("task %s (%s): its thread did not stop %.1f s after it was cancelled: left behind",
                        task.name, ctx.job_id, TIME_LIMIT_GRACE)  # fmt: skip
            raise TaskCancelled("cancelled")
        log.warning("task %s (%s): its thread did not stop %.1f s after the time limit: left behind",
                    task.name, ctx.job_id, TIME_LIMIT_GRACE)  # fmt: skip
        error = exceeded(task.name, task.timeout)
        await hooks.failed_outside(self.app, ctx, error)
        raise error


def _message_of(exc: BaseException) -> str:
    try:
        return str(exc)
    except Exception:  # noqa: BLE001
        return "<unprintable %s>" % type(exc).__name__


def make_worker(
    app: "App",
    queues: list[str] | None = None,
    *,
    concurrency: int = 8,
    metrics: TaskMetrics | None = None,
    client: Any = None,
    unknown_task_returns: int = UNKNOWN_TASK_RETURNS,
    unknown_task_delay: float = UNKNOWN_TASK_DELAY,
    **worker_options: Any,
) -> tuple[Worker, Runner]:
    """A :class:`Worker` running ``app``'s tasks from ``queues`` (default: every task's queue).

    ``worker_options`` go to the Worker (``max_in_flight``, ``grace_period``,
    ``retry_backoff``, ``fetch_timeout_ms``...). Its ``max_attempts`` is None: the
    jobs' MAXDELIVER (a task's ``retries``) decides when a failure dead-letters.
    A job naming a task the app does not know is given back for another worker (no attempt
    used), after ``unknown_task_delay`` seconds doubled at each return (at most a minute), and
    dead-lettered (``UnknownTask``) once given back ``unknown_task_returns`` times.
    """
    queues = list(queues or app.queues())
    if not queues:
        raise ValueError("the app has no task (and no queue was given)")
    runner = Runner(app, concurrency=concurrency, metrics=metrics, unknown_task_returns=unknown_task_returns,
                    unknown_task_delay=unknown_task_delay)  # fmt: skip
    worker_options.setdefault("max_attempts", None)
    worker_options.setdefault("describe", runner.describe)  # running jobs listed by their task's name
    worker_options.setdefault("on_cancel", runner.cancel)  # TaskRef.cancel()'s notices
    worker = Worker(client if client is not None else app.client(), queues, runner, concurrency=concurrency,
                    **worker_options)  # fmt: skip
    runner.worker = worker
    return worker, runner


def run_worker(app: "App", worker: Worker, *, handle_signals: bool = True) -> Any:
    """Run ``worker`` (from :func:`make_worker`) until stopped, and the app's periodic scheduler
    beside it when the app has periodic tasks (``tasks.periodic.run_scheduler(app, stop_event)``:
    an ``async def`` runs as a trio task with a ``trio.Event``, a plain function in a thread
    with a ``threading.Event``); returns the worker's final stats."""

    async def main() -> Any:
        scheduler = None
        if app.periodic_tasks:
            # looked up by name: the scheduler is a part of its own (tasks.periodic), which
            # builds on the app and must never need the runner
            scheduler = importlib.import_module(__package__ + ".periodic").run_scheduler
        async with trio.open_nursery() as nursery:
            thread_stop = threading.Event()
            trio_stop = trio.Event()
            if scheduler is not None:
                if inspect.iscoroutinefunction(scheduler):
                    nursery.start_soon(scheduler, app, trio_stop)
                else:
                    thread = threading.Thread(target=scheduler, args=(app, thread_stop), name="disque-py-periodic",
                                              daemon=True)  # fmt: skip
                    thread.start()
            try:
                stats = await worker.run(handle_signals=handle_signals)
            finally:
                thread_stop.set()
                trio_stop.set()
        return stats

    return trio.run(main)
