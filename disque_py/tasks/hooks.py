"""One run of a task with its hooks around it (its :class:`TaskContext` and :func:`current_task`: :mod:`.context`).

``before_task`` hooks run before the function (one that raises fails the run), ``after_task``
hooks after a success, ``on_failure`` hooks after a failure (an error in these two is logged
and ignored). For an ``async def`` task they run in the worker's trio thread (:func:`run_async`,
under the time limit) and may be ``async def`` too; for a plain function in the task's thread
(:func:`run_sync`), where they must be plain functions.
"""

from __future__ import annotations

import inspect
import logging
from collections.abc import Callable
from types import TracebackType
from typing import TYPE_CHECKING, Any

import trio

from ..client.worker import describe_error
from .context import TaskContext, _current, current_task
from .timelimit import TimeLimitExceeded, exceeded, limit

if TYPE_CHECKING:
    from .app import App, Task

__all__ = ["TaskContext", "current_task", "call_hooks", "acall_hooks", "run_sync", "run_async"]

log = logging.getLogger("disque_py.tasks")


def _hook_failed(what: str, hook: Any, ctx: TaskContext, exc: Exception) -> None:
    log.error("%s hook %r failed for task %s (%s): %s", what, hook, ctx.task.name, ctx.job_id, describe_error(exc))


def call_hooks(hooks: list[Callable[[Any], Any]], ctx: TaskContext, what: str, swallow: bool) -> None:
    """Call each hook with ``ctx``, in a thread (an ``async def`` hook is refused)."""
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
            _hook_failed(what, hook, ctx, exc)


async def acall_hooks(hooks: list[Callable[[Any], Any]], ctx: TaskContext, what: str, swallow: bool) -> None:
    """Call each hook with ``ctx``, in the trio thread (an ``async def`` hook is awaited)."""
    for hook in hooks:
        try:
            result = hook(ctx)
            if inspect.isawaitable(result):
                await result
        except Exception as exc:
            if not swallow:
                raise
            _hook_failed(what, hook, ctx, exc)


def _own(exc: BaseException) -> TracebackType | None:
    """The part of ``exc``'s traceback below the frame that caught it (run_sync, run_async): the
    task's function (or the hook) down to where it failed, without the runner's plumbing."""
    tb = exc.__traceback__
    return None if tb is None else tb.tb_next


def run_sync(app: "App", task: "Task", ctx: TaskContext) -> Any:
    """A plain-function task and its hooks, in its thread; the time limit raised in it
    (:mod:`.timelimit`) becomes the task's TimeLimitExceeded."""
    _current.set(ctx)  # a thread runs in a copy of trio's context: this stays in it
    try:
        call_hooks(app.before_hooks, ctx, "before", swallow=False)
        value = task.fn(*ctx.args, **ctx.kwargs)
        if inspect.isawaitable(value):
            close = getattr(value, "close", None)
            if close is not None:
                close()
            raise TypeError("task %s returned an awaitable: declare it with async def" % task.name)
    except TimeLimitExceeded as interrupted:
        error = exceeded(task.name, task.timeout)
        ctx.error, ctx.error_tb = error, _own(interrupted)  # where the time limit interrupted it
        call_hooks(app.failure_hooks, ctx, "on_failure", swallow=True)
        raise error from None
    except Exception as exc:
        ctx.error, ctx.error_tb = exc, _own(exc)
        call_hooks(app.failure_hooks, ctx, "on_failure", swallow=True)
        raise
    ctx.result = value
    call_hooks(app.after_hooks, ctx, "after", swallow=True)
    return value


async def run_async(app: "App", task: "Task", ctx: TaskContext) -> Any:
    """An ``async def`` task and its hooks, in the trio thread, under its time limit."""
    _current.set(ctx)  # the runner (a trio task, its own context) runs one job at a time
    try:
        with limit(task.timeout):
            await acall_hooks(app.before_hooks, ctx, "before", swallow=False)
            value = await task.fn(*ctx.args, **ctx.kwargs)
    except trio.TooSlowError:
        error: BaseException = exceeded(task.name, task.timeout)
        ctx.error = error
        await acall_hooks(app.failure_hooks, ctx, "on_failure", swallow=True)
        raise error from None
    except Exception as exc:
        ctx.error, ctx.error_tb = exc, _own(exc)
        await acall_hooks(app.failure_hooks, ctx, "on_failure", swallow=True)
        raise
    ctx.result = value
    await acall_hooks(app.after_hooks, ctx, "after", swallow=True)
    return value


async def failed_outside(app: "App", ctx: TaskContext, error: BaseException) -> None:
    """The run failed outside the task's own code (its thread was left behind): the failure hooks."""
    ctx.error = error
    await acall_hooks(app.failure_hooks, ctx, "on_failure", swallow=True)
