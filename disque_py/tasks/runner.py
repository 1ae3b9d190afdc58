"""What a worker runs for each task job: the handler given to :class:`~disque_py.client.worker.Worker`.

:class:`Runner` is one ``async def`` handler, so the Worker's trio runners (as
many as ``concurrency``) take the jobs and its flow control, retries, dead
letters and graceful shutdown apply as they are. For each job:

1. decode the body (:mod:`.message`), find the task by name, check the
   arguments against its signature. Any of these failing can never succeed:
   the worker raises :class:`~disque_py.client.worker.Reject` and the job is
   dead-lettered at once (``NACK <id> DEAD REASON <what is wrong>``), with an
   error result for a waiter, if the message asked for one;
2. run the task: ``async def`` tasks in the trio thread (the time limit is a
   trio cancel scope), plain functions in a thread (``trio.to_thread``, at most
   ``concurrency`` at once). A thread cannot be cancelled: at the time limit the
   worker raises :class:`TimeLimitExceeded` *inside* the thread
   (``PyThreadState_SetAsyncExc``, as dramatiq does). Python delivers it at the
   thread's next bytecode, so a thread blocked in one long C call (a
   ``time.sleep(60)``, a socket read without timeout) sees it only when the
   call returns; after ``TIME_LIMIT_GRACE`` more seconds the worker stops
   waiting, fails the task and leaves the thread behind (it keeps its slot
   until it ends). Hooks run around the function, in the same thread;
3. success: the result job is written (:mod:`.results`), then the Worker ACKs;
4. failure: a retry when the job has deliveries left (the worker NACKs it with
   the error as REASON; the node's BACKOFF, or the worker's retry delay, decides
   when it comes back), else an error result is written and the job is
   dead-lettered with the error (its MAXDELIVER does it on the NACK; a job sent
   without MAXDELIVER, e.g. from redis-cli, is rejected once ``retries`` are
   spent).

The counters (:class:`TaskMetrics`) are served on ``/metrics`` when the worker
is asked to (``metrics_port``).
"""

from __future__ import annotations

import contextvars
import ctypes
import importlib
import inspect
import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import trio

from ..client import commands as cmd
from ..client.worker import Reject, Worker, describe_error
from .message import ChainSpec, Message, MessageError, Outcome, chain_key, decode, encode, result_queue
from .results import result_argv

if TYPE_CHECKING:
    from .app import App, Task

__all__ = ["current_task", "Runner", "TaskContext", "TaskMetrics", "TimeLimitExceeded", "TIME_LIMIT_GRACE", "make_worker"]

log = logging.getLogger("disque_py.tasks")

#: seconds a thread gets, after the time limit raised in it, before it is left behind
TIME_LIMIT_GRACE = 1.0
#: attempts at writing a result before the job is handed back (NACK) instead
RESULT_WRITE_ATTEMPTS = 3


class TimeLimitExceeded(Exception):
    """The task ran longer than its ``timeout``."""


@dataclass
class TaskContext:
    """What the hooks see of one run of a task."""

    task: "Task"
    job_id: str
    queue: str
    args: tuple[Any, ...]
    kwargs: dict[str, Any]
    meta: dict[str, Any]
    attempt: int
    final: bool  # a failure of this run is not retried
    result: Any = None
    error: BaseException | None = None
    started: float = 0.0  # time.monotonic()
    duration: float | None = None
    extra: dict[str, Any] = field(default_factory=dict)  # for the hooks' own use


_current: contextvars.ContextVar[TaskContext] = contextvars.ContextVar("disque_py_task")


def current_task() -> TaskContext:
    """The :class:`TaskContext` of the task running in this thread (or trio task)."""
    try:
        return _current.get()
    except LookupError:
        raise RuntimeError("current_task() called outside a task") from None


class TaskMetrics:
    """Counts per task name: done, failed (for good), retried, rejected, and the run time."""

    BUCKETS = (0.001, 0.005, 0.01, 0.05, 0.1, 0.5, 1.0, 5.0, 10.0, 60.0, float("inf"))

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.done: dict[str, int] = {}
        self.failed: dict[str, int] = {}
        self.retried: dict[str, int] = {}
        self.rejected: dict[str, int] = {}
        self.duration_sum: dict[str, float] = {}
        self.duration_buckets: dict[str, list[int]] = {}

    def count(self, kind: str, task: str, duration: float | None = None) -> None:
        with self._lock:
            table = getattr(self, kind)
            table[task] = table.get(task, 0) + 1
            if duration is not None:
                self.duration_sum[task] = self.duration_sum.get(task, 0.0) + duration
                buckets = self.duration_buckets.setdefault(task, [0] * len(self.BUCKETS))
                for i, bound in enumerate(self.BUCKETS):
                    if duration <= bound:
                        buckets[i] += 1

    def total(self, kind: str) -> int:
        with self._lock:
            return sum(getattr(self, kind).values())

    def snapshot(self) -> dict[str, Any]:
        with self._lock:
            return {
                "done": dict(self.done), "failed": dict(self.failed), "retried": dict(self.retried),
                "rejected": dict(self.rejected), "duration_sum": dict(self.duration_sum),
                "duration_buckets": {k: list(v) for k, v in self.duration_buckets.items()},
            }  # fmt: skip

    def collector(self, worker: Worker | None = None) -> Any:
        """A prometheus_client collector of these counts (and the worker's, if given)."""
        from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily

        metrics = self
        buckets = self.BUCKETS

        class _Collector:
            def collect(self) -> Any:
                snap = metrics.snapshot()
                for kind, help_text in (
                    ("done", "Tasks that succeeded"),
                    ("failed", "Tasks that failed for good (dead-lettered)"),
                    ("retried", "Task runs that failed and will be retried"),
                    ("rejected", "Task jobs that could not run (bad body, unknown task, wrong arguments)"),
                ):
                    family = CounterMetricFamily("disque_py_tasks_%s" % kind, help_text, labels=["task"])
                    for name, value in sorted(snap[kind].items()):
                        family.add_metric([name], value)
                    yield family
                hist = HistogramMetricFamily("disque_py_task_duration_seconds", "Run time of tasks", labels=["task"])
                for name, counts in sorted(snap["duration_buckets"].items()):
                    bounds = [("+Inf" if b == float("inf") else repr(b), c) for b, c in zip(buckets, counts)]
                    hist.add_metric([name], bounds, snap["duration_sum"].get(name, 0.0))
                yield hist
                if worker is not None:
                    stats = worker.stats()
                    for attr in ("fetched", "processed", "failed", "retried", "dead", "ack_errors"):
                        yield CounterMetricFamily("disque_py_worker_jobs_%s" % attr, "Worker jobs %s" % attr,
                                                  value=getattr(stats, attr))  # fmt: skip
                    for attr in ("in_flight", "running"):
                        yield GaugeMetricFamily("disque_py_worker_jobs_%s" % attr, "Worker jobs %s" % attr,
                                                value=getattr(stats, attr))  # fmt: skip

        return _Collector()


def serve_metrics(metrics: TaskMetrics, port: int, host: str = "127.0.0.1", worker: Worker | None = None) -> Any:
    """Serve ``/metrics`` on ``host:port`` (a thread of prometheus_client's); returns the server."""
    from prometheus_client import CollectorRegistry, start_http_server

    registry = CollectorRegistry(auto_describe=False)
    registry.register(metrics.collector(worker))
    server, _thread = start_http_server(port, addr=host, registry=registry)
    return server


class _ThreadCall:
    """A function run in a worker thread that the trio side may interrupt (see the module docstring)."""

    def __init__(self, fn: Callable[[], Any]) -> None:
        self.fn = fn
        self.lock = threading.Lock()
        self.ident: int | None = None
        self.running = False
        self.interrupted = False  # the time limit is over: raise in the thread (now, or when it starts)

    def run(self) -> Any:
        with self.lock:
            if self.interrupted:
                raise TimeLimitExceeded("time limit over before the task started")
            self.ident = threading.get_ident()
            self.running = True
        try:
            return self.fn()
        finally:
            with self.lock:
                self.running = False
                if self.interrupted:  # a TimeLimitExceeded not delivered yet must not escape this call
                    ctypes.pythonapi.PyThreadState_SetAsyncExc(ctypes.c_ulong(self.ident), None)

    def interrupt(self) -> None:
        with self.lock:
            self.interrupted = True
            if self.running and self.ident is not None:
                ctypes.pythonapi.PyThreadState_SetAsyncExc(
                    ctypes.c_ulong(self.ident), ctypes.py_object(TimeLimitExceeded)
                )


def _call_hooks(hooks: list[Callable[[Any], Any]], ctx: TaskContext, what: str, swallow: bool) -> None:
    for hook in hooks:
        try:
            result = hook(ctx)
            if inspect.isawaitable(result):
                close = getattr(result, "close", None)
                if close is not None:
                    close()
                raise TypeError("%s hook %r returned an awaitable: in a thread, hooks are plain functions"
                                % (what, hook))  # fmt: skip
        except Exception as exc:
            if not swallow:
                raise
            log.error("%s hook %r failed for task %s (%s): %s", what, hook, ctx.task.name, ctx.job_id,
                      describe_error(exc))  # fmt: skip


async def _acall_hooks(hooks: list[Callable[[Any], Any]], ctx: TaskContext, what: str, swallow: bool) -> None:
    for hook in hooks:
        try:
            result = hook(ctx)
            if inspect.isawaitable(result):
                await result
        except Exception as exc:
            if not swallow:
                raise
            log.error("%s hook %r failed for task %s (%s): %s", what, hook, ctx.task.name, ctx.job_id,
                      describe_error(exc))  # fmt: skip


class Runner:
    """The Worker's handler for an app's task jobs (see the module docstring)."""

    def __init__(self, app: "App", *, concurrency: int = 8, metrics: TaskMetrics | None = None) -> None:
        self.app = app
        self.concurrency = concurrency
        self.metrics = metrics or TaskMetrics()
        self.limiter = trio.CapacityLimiter(concurrency)
        self.worker: Worker | None = None  # set by make_worker; its trio client writes the results

    # ------------------------------------------------------------ the handler
    async def __call__(self, job: Any) -> None:
        try:
            message, serializer = decode(job.body)
        except MessageError as exc:
            self.metrics.count("rejected", "?")
            raise Reject("bad task message: %s" % exc) from None
        task = self.app.tasks.get(message.task)
        if task is None:
            self.metrics.count("rejected", message.task)
            text = "no task named %r in this worker's app" % message.task
            await self._write(job, message, serializer, Outcome(False, None, "UnknownTask", text))
            raise Reject("UnknownTask: " + text)
        try:
            task.check_arguments(message.args, message.kwargs)
        except TypeError as exc:
            self.metrics.count("rejected", task.name)
            text = "wrong arguments for task %s: %s" % (task.name, exc)
            await self._write(job, message, serializer, Outcome(False, None, "TypeError", text))
            raise Reject("TypeError: " + text) from None
        if job.maxdeliver is not None:
            final = job.last_delivery
        else:  # no MAXDELIVER on the job (sent from elsewhere): the task's retries decide
            final = job.attempt > task.retries
        ctx = TaskContext(task, job.id, job.queue, message.args, message.kwargs, message.meta, job.attempt, final)
        ctx.started = time.monotonic()
        try:
            if task.is_async:
                value = await self._run_async(task, ctx)
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
            type_name = type(exc).__name__
            failed = Outcome(False, None, type_name, _message_of(exc))
            await self._write(job, message, serializer, failed)
            if message.chain is not None:  # the chain ends here: its waiter reads the error
                await self._send(result_argv(message.chain.final, failed, serializer, message.chain.ttl), job)
            if job.maxdeliver is None:
                raise Reject(text) from exc
            raise  # a NACK on the last delivery: the node dead-letters it with this error
        ctx.duration = time.monotonic() - ctx.started
        await self._write(job, message, serializer, Outcome(True, value), reject_unserializable=True)
        if message.chain is not None:
            await self._next_in_chain(job, message, serializer, value)
        self.metrics.count("done", task.name, ctx.duration)

    async def _next_in_chain(self, job: Any, message: Message, serializer: str, value: Any) -> None:
        """Add the chain's next task (see :mod:`.message`), given ``value`` first, before this
        job is acknowledged; its key ``chain:<job ID>`` adds it once if this task ran twice."""
        chain = message.chain
        assert chain is not None
        step, rest = chain.then[0], chain.then[1:]
        nxt = Message(step.task, (value,) + tuple(step.args), step.kwargs, step.result, message.meta,
                      ChainSpec(rest, chain.final, chain.ttl) if rest else None)  # fmt: skip
        try:
            body = encode(nxt, serializer)
        except TypeError as exc:
            text = "the value task %s passes down its chain is %s" % (message.task, exc)
            await self._send(result_argv(chain.final, Outcome(False, None, "TypeError", text), serializer, chain.ttl), job)
            raise Reject("TypeError: " + text) from None
        await self._send((b"ADDJOB", step.queue, body, *step.addjob, b"DEDUP", chain_key(job.id)), job)

    # ------------------------------------------------------------ running a task
    async def _run_async(self, task: "Task", ctx: TaskContext) -> Any:
        app = self.app
        _current.set(ctx)  # the runner (a trio task, its own context) runs one job at a time
        try:
            with trio.fail_after(task.timeout) if task.timeout else _nullcontext():
                await _acall_hooks(app.before_hooks, ctx, "before", swallow=False)
                value = await task.fn(*ctx.args, **ctx.kwargs)
        except trio.TooSlowError:
            exc: BaseException = TimeLimitExceeded("task %s ran longer than its %s s time limit"
                                                   % (task.name, task.timeout))  # fmt: skip
            ctx.error = exc
            await _acall_hooks(app.failure_hooks, ctx, "on_failure", swallow=True)
            raise exc from None
        except Exception as exc:
            ctx.error = exc
            await _acall_hooks(app.failure_hooks, ctx, "on_failure", swallow=True)
            raise
        ctx.result = value
        await _acall_hooks(app.after_hooks, ctx, "after", swallow=True)
        return value

    async def _run_thread(self, task: "Task", ctx: TaskContext) -> Any:
        app = self.app

        def body() -> Any:
            _current.set(ctx)  # a thread runs in a copy of trio's context: this stays in it
            try:
                _call_hooks(app.before_hooks, ctx, "before", swallow=False)
                value = task.fn(*ctx.args, **ctx.kwargs)
                if inspect.isawaitable(value):
                    close = getattr(value, "close", None)
                    if close is not None:
                        close()
                    raise TypeError("task %s returned an awaitable: declare it with async def" % task.name)
            except TimeLimitExceeded:
                error = TimeLimitExceeded("task %s ran longer than its %s s time limit" % (task.name, task.timeout))
                ctx.error = error
                _call_hooks(app.failure_hooks, ctx, "on_failure", swallow=True)
                raise error from None
            except Exception as exc:
                ctx.error = exc
                _call_hooks(app.failure_hooks, ctx, "on_failure", swallow=True)
                raise
            ctx.result = value
            _call_hooks(app.after_hooks, ctx, "after", swallow=True)
            return value

        call = _ThreadCall(body)
        if task.timeout is None:
            return await trio.to_thread.run_sync(call.run, abandon_on_cancel=True, limiter=self.limiter)
        outcome: list[Any] = []

        async def in_thread(cancel: trio.CancelScope) -> None:
            try:
                outcome.append((True, await trio.to_thread.run_sync(call.run, abandon_on_cancel=True,
                                                                     limiter=self.limiter)))  # fmt: skip
            except Exception as exc:
                outcome.append((False, exc))
            cancel.cancel()

        async with trio.open_nursery() as nursery:
            nursery.start_soon(in_thread, nursery.cancel_scope)
            await trio.sleep(task.timeout)
            call.interrupt()  # raised in the thread at its next bytecode
            await trio.sleep(TIME_LIMIT_GRACE)
            nursery.cancel_scope.cancel()  # stuck in a C call: left behind
        if outcome:
            ok, value = outcome[0]
            if ok:
                return value
            raise value
        log.warning("task %s (%s): its thread did not stop %.1f s after the time limit: left behind",
                    task.name, ctx.job_id, TIME_LIMIT_GRACE)  # fmt: skip
        error = TimeLimitExceeded("task %s ran longer than its %s s time limit" % (task.name, task.timeout))
        ctx.error = error
        await _acall_hooks(app.failure_hooks, ctx, "on_failure", swallow=True)
        raise error

    # ------------------------------------------------------------ results
    async def _write(self, job: Any, message: Message, serializer: str, outcome: Outcome,
                     reject_unserializable: bool = False) -> None:  # fmt: skip
        """Write the result job, if the message asked for one (see :mod:`.results`)."""
        spec = message.result
        if spec is None:
            return
        queue = spec.queue or result_queue(job.id)
        try:
            argv = result_argv(queue, outcome, serializer, spec.ttl)
        except TypeError as exc:
            text = "the result of task %s is %s" % (message.task, exc)
            argv = result_argv(queue, Outcome(False, None, "TypeError", text), serializer, spec.ttl)
            if not reject_unserializable:
                raise
            await self._send(argv, job)
            raise Reject("TypeError: " + text) from None
        await self._send(argv, job)

    async def _send(self, argv: tuple[Any, ...], job: Any) -> None:
        assert self.worker is not None
        client = self.worker.client
        call = cmd.Call(argv, lambda r: r, blocks=cmd.DEFAULT_ADD_TIMEOUT_MS / 1000.0, retry_safe=True)
        for attempt in range(RESULT_WRITE_ATTEMPTS):
            try:
                await client._call(call)
                return
            except Exception as exc:  # noqa: BLE001 - tried again (DEDUP: written once)
                if attempt == RESULT_WRITE_ATTEMPTS - 1:
                    log.error("writing the result of %s failed: %s: handed back", job.id, describe_error(exc))
                    raise
                await trio.sleep(0.2 * (attempt + 1))


def _message_of(exc: BaseException) -> str:
    try:
        return str(exc)
    except Exception:  # noqa: BLE001
        return "<unprintable %s>" % type(exc).__name__


class _nullcontext:
    def __enter__(self) -> None:
        return None

    def __exit__(self, *exc: object) -> None:
        return None


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
