"""What a handler may raise and how its error is told, and how a handler is called.

A handler succeeds by returning (the value is ignored) and fails by raising anything;
:class:`Reject` asks for the job to be dead-lettered at once, :class:`GiveBack` for it to be given
back to another worker. :func:`describe_error` is the one place where a failure becomes the text
the node keeps (NACK's REASON, a dead letter's reason), and :func:`trace_of` where it becomes its
traceback (NACK's TRACE, a task's error result).
"""

from __future__ import annotations

import inspect
import traceback
from collections.abc import Callable
from types import TracebackType
from typing import Any

from ..commands import cut_trace
from ..model import Job

__all__ = ["Handler", "DeadLetterHandler", "Reject", "GiveBack", "describe_error", "reason_of", "trace_of",
           "is_async_callable", "call_sync"]  # fmt: skip

Handler = Callable[[Job], Any]
DeadLetterHandler = Callable[[Job, str], Any]


class Reject(Exception):
    """Raised by a handler for a job that can never succeed (a body it cannot read, a task
    it does not know): the job is dead-lettered at once, whatever attempts it has left,
    with the exception's message as the reason (``NACK <id> DEAD REASON <message>`` with
    the default ``dead_letter``)."""


class GiveBack(Exception):
    """Raised by a handler for a job another worker may run and this one cannot (a task it
    does not know yet, during a deploy of new code): the job is given back without using an
    attempt (``RELEASE <id> DELAY <delay>``: queued again when ``delay`` seconds end, so this
    worker does not take it again at once), unless it was given back ``limit`` times already
    (``Job.returns``, which counts a stop's returns too): then it is dead-lettered, with the
    exception's message as the reason. On a node without RELEASE it is NACKed plainly."""

    def __init__(self, message: str, *, delay: float = 1.0, limit: int = 10) -> None:
        super().__init__(message)
        self.delay = delay
        self.limit = limit


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


def reason_of(error: BaseException) -> str:
    """What a handler's failure is reported as: a :class:`Reject`'s own message (else its
    description), any other error's ``"Type: message"``."""
    if isinstance(error, Reject):
        return str(error) or describe_error(error)
    return describe_error(error)


#: where :func:`trace_of` keeps an exception's formatted traceback (it is formatted once)
_TRACE_ATTR = "__disque_py_trace__"


def trace_of(error: BaseException, tb: TracebackType | None = None) -> str | None:
    """A handler's failure as its formatted traceback (``traceback.format_exception``, the
    chained exceptions included): what NACK's TRACE sends and a task's error result carries.
    Its tail when it is longer than the node keeps (16 KiB, :func:`~..commands.cut_trace`).
    ``tb``: the part of the error's traceback to show (the task runner shows the task's own
    frames, not its plumbing's); default, all of it.

    Formatted once per exception: kept on it, so that whoever asks again (the task runner
    writing the result, then the worker sending the NACK) gets the same text. A
    :class:`Reject` has its cause's (``raise Reject(...) from exc``), or none: a rejection
    is a decision, not a bug. None as well when formatting fails."""
    if isinstance(error, Reject):
        cause = error.__cause__
        return None if cause is None else trace_of(cause)
    kept = error.__dict__.get(_TRACE_ATTR) if hasattr(error, "__dict__") else None
    if kept is not None:
        return kept
    try:
        lines = traceback.format_exception(type(error), error, tb if tb is not None else error.__traceback__)
        text = cut_trace("".join(lines)).decode("utf-8", "replace")
    except Exception:  # noqa: BLE001 - a failure must be reported even when its traceback cannot be
        return None
    try:
        setattr(error, _TRACE_ATTR, text)
    except (AttributeError, TypeError):  # an exception type that takes no attribute: formatted each time
        pass
    return text


def is_async_callable(fn: Any) -> bool:
    """An ``async def`` function, or an object whose ``__call__`` is one."""
    call = getattr(type(fn), "__call__", None)  # noqa: B004 - an object with an async __call__
    return inspect.iscoroutinefunction(fn) or inspect.iscoroutinefunction(call)


def call_sync(handler: Callable[[Job], Any], job: Job) -> None:
    """Run a plain-function handler; one that returns an awaitable was meant to be ``async def``."""
    result = handler(job)
    if inspect.isawaitable(result):
        close = getattr(result, "close", None)
        if close is not None:
            close()
        raise TypeError("the handler returned an awaitable: declare it with async def")
