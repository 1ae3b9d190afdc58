"""What a worker runs for each task job: the handler given to :class:`~disque_py.client.worker.Worker`.

:class:`Runner` is one ``async def`` handler, so the Worker's trio runners (as
many as ``concurrency``) take the jobs and its flow control, retries, dead
letters and graceful shutdown apply as they are. For each job:

1. decode the body (:mod:`.message`), find the task by name, check the
   arguments against its signature. Any of these failing can never succeed:
   the worker raises :class:`~disque_py.client.worker.Reject` and the job is
   dead-lettered at once (``NACK <id> DEAD REASON <what is wrong>``), with an
   error result for a waiter, if the message asked for one;
2. run the task with its hooks (:mod:`.hooks`): ``async def`` tasks in the trio
   thread, plain functions in a thread (``trio.to_thread``, at most
   ``concurrency`` at once), under the task's time limit (:mod:`.timelimit`);
3. success: the result job is written (:mod:`.writes`), then the Worker ACKs;
4. failure: a retry when the job has deliveries left (the worker NACKs it with
   the error as REASON; the node's BACKOFF, or the worker's retry delay, decides
   when it comes back), else an error result is written and the job is
   dead-lettered with the error (its MAXDELIVER does it on the NACK; a job sent
   without MAXDELIVER, e.g. from redis-cli, is rejected once ``retries`` are
   spent).
5. a chord's member (:mod:`.chords`): its result is followed by its chord's check,
   a delivery after its first reads its result before it runs (:func:`.writes.settle_member`),
   and its last run comes one delivery before its MAXDELIVER (the spare, for a worker lost).

The counters (:class:`~.metrics.TaskMetrics`) are served on ``/metrics`` when the worker
is asked to (``metrics_port``, :mod:`.metrics`). The runner reaches the cluster only through
the worker's client, with its public calls.
"""

from __future__ import annotations

import functools
import importlib
import inspect
import logging
import threading
import time
from typing import TYPE_CHECKING, Any

import trio

from ..client.worker import Reject, Worker, describe_error
from . import hooks
from .chords import last_run, with_errors
from .hooks import TaskContext, current_task
from .message import MessageError, Outcome, decode
from .metrics import TaskMetrics, serve_metrics
from .timelimit import TIME_LIMIT_GRACE, TimeLimitExceeded, exceeded, run_in_thread
from .writes import add_next_in_chain, settle_member, write_chain_failure, write_result

if TYPE_CHECKING:
    from .app import App, Task

__all__ = ["current_task", "Runner", "TaskContext", "TaskMetrics", "TimeLimitExceeded", "TIME_LIMIT_GRACE",
           "make_worker", "run_worker", "serve_metrics"]  # fmt: skip

log = logging.getLogger("disque_py.tasks")


class Runner:
    """The Worker's handler for an app's task jobs (see the module docstring)."""

    def __init__(self, app: "App", *, concurrency: int = 8, metrics: TaskMetrics | None = None) -> None:
        self.app = app
        self.concurrency = concurrency
        self.metrics = metrics or TaskMetrics()
        self.limiter = trio.CapacityLimiter(concurrency)
        self.worker: Worker | None = None  # set by make_worker; its trio client writes the results

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

    # ------------------------------------------------------------ the handler
    async def __call__(self, job: Any) -> None:
        try:
            message, serializer = decode(job.body)
        except MessageError as exc:
            self.metrics.count("rejected", "?")
            raise Reject("bad task message: %s" % exc) from None
        message = with_errors(message)  # a chord's callback given its members' errors: TaskErrors in place
        task = self.app.tasks.get(message.task)
        if task is None:
            self.metrics.count("rejected", message.task)
            text = "no task named %r in this worker's app" % message.task
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
        ctx = TaskContext(task, job.id, job.queue, message.args, message.kwargs, message.meta, job.attempt, final)
        ctx.started = time.monotonic()
        try:
            if task.is_async:
                value = await hooks.run_async(self.app, task, ctx)
            else:
                value = await self._run_thread(task, ctx)
        except Exception as exc:
            ctx.duration = time.monotonic() - ctx.started
            text = describe_error(exc)
            if not final:
                self.metrics.count("retried", task.name, ctx.duration)
                log.info("task %s (%s) failed, attempt %d, retried: %s", task.name, job.id, job.attempt, text)
                raise
            self.metrics.count("failed", task.name, ctx.duration)
            log.warning("task %s (%s) failed for good, attempt %d: %s", task.name, job.id, job.attempt, text)
            failed = Outcome(False, None, type(exc).__name__, _message_of(exc))
            await write_result(self.client, job, message, serializer, failed)
            if message.chain is not None:  # the chain ends here: its waiter reads the error
                await write_chain_failure(self.client, job, message.chain, serializer, failed)
            if job.maxdeliver is None or message.chord is not None:
                raise Reject(text) from exc
            raise  # a NACK on the last delivery: the node dead-letters it with this error
        ctx.duration = time.monotonic() - ctx.started
        await write_result(self.client, job, message, serializer, Outcome(True, value), reject_unserializable=True)
        if message.chain is not None:
            await add_next_in_chain(self.client, job, message, serializer, value)
        self.metrics.count("done", task.name, ctx.duration)

    async def _run_thread(self, task: "Task", ctx: TaskContext) -> Any:
        """A plain-function task in a thread, under its time limit."""
        finished, value = await run_in_thread(functools.partial(hooks.run_sync, self.app, task, ctx), task.timeout,
                                              self.limiter)  # fmt: skip
        if finished:
            return value
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
    **worker_options: Any,
) -> tuple[Worker, Runner]:
    """A :class:`Worker` running ``app``'s tasks from ``queues`` (default: every task's queue).

    ``worker_options`` go to the Worker (``max_in_flight``, ``grace_period``,
    ``retry_backoff``, ``fetch_timeout_ms``...). Its ``max_attempts`` is None: the
    jobs' MAXDELIVER (a task's ``retries``) decides when a failure dead-letters.
    """
    queues = list(queues or app.queues())
    if not queues:
        raise ValueError("the app has no task (and no queue was given)")
    runner = Runner(app, concurrency=concurrency, metrics=metrics)
    worker_options.setdefault("max_attempts", None)
    worker_options.setdefault("describe", runner.describe)  # running jobs listed by their task's name
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
