"""A task's time limit (``@app.task(timeout=...)``).

``async def`` tasks run in the trio thread under a cancel scope (:func:`limit`). Plain
functions run in a thread (``trio.to_thread``, at most ``concurrency`` at once), which cannot
be cancelled: at the time limit the worker raises :class:`TimeLimitExceeded` *inside* the
thread (``PyThreadState_SetAsyncExc``, as dramatiq does; :class:`ThreadCall`). Python
delivers it at the thread's next bytecode, so a thread blocked in one long C call (a
``time.sleep(60)``, a socket read without timeout) sees it only when the call returns; after
``TIME_LIMIT_GRACE`` more seconds the worker stops waiting, fails the task and leaves the
thread behind (it keeps its slot until it ends): :func:`run_in_thread`.

A task cancelled while it runs (``TaskRef.cancel()``, :mod:`.control`) is stopped the same
way: :class:`TaskCancelled` raised in its cancel scope (``async def``) or in its thread
(:meth:`ThreadCall.cancel`), with the same grace before the thread is left behind.
"""

from __future__ import annotations

import contextlib
import ctypes
import math
import threading
from collections.abc import Callable
from typing import Any, ContextManager

import trio

__all__ = ["TimeLimitExceeded", "TaskCancelled", "TIME_LIMIT_GRACE", "ThreadCall", "exceeded", "limit",
           "run_in_thread"]  # fmt: skip

#: seconds a thread gets, after the time limit raised in it, before it is left behind
TIME_LIMIT_GRACE = 1.0


class TimeLimitExceeded(Exception):
    """The task ran longer than its ``timeout``."""


class TaskCancelled(Exception):
    """The task was cancelled while it ran (``TaskRef.cancel()``): raised in its thread."""


def exceeded(name: str, timeout: float | None) -> TimeLimitExceeded:
    """The error a task that ran out of time fails with."""
    return TimeLimitExceeded("task %s ran longer than its %s s time limit" % (name, timeout))


def limit(timeout: float | None) -> ContextManager[Any]:
    """The time limit of an ``async def`` task (raises trio.TooSlowError when over); none without one."""
    return trio.fail_after(timeout) if timeout else contextlib.nullcontext()


class ThreadCall:
    """A function run in a worker thread that the trio side may interrupt (see the module docstring)."""

    def __init__(self, fn: Callable[[], Any]) -> None:
        self.fn = fn
        self.lock = threading.Lock()
        self.ident: int | None = None
        self.running = False
        self.interrupted = False  # the time limit is over: raise in the thread (now, or when it starts)
        self.error: type[BaseException] = TimeLimitExceeded  # what is raised in it
        self.cancel_asked = False  # cancel() was called
        self.cancelled: trio.Event | None = None  # with a time limit: set by cancel() (run_in_thread waits on it)
        self.scope: trio.CancelScope | None = None  # without one: the wait for the thread (run_in_thread)

    def run(self) -> Any:
        with self.lock:
            if self.interrupted:
                if self.error is TaskCancelled:
                    raise TaskCancelled("cancelled before the task started")
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

    def interrupt(self, error: type[BaseException] = TimeLimitExceeded) -> None:
        with self.lock:
            if self.interrupted:
                return  # once: a cancel and the time limit do not both raise
            self.interrupted = True
            self.error = error
            if self.running and self.ident is not None:
                ctypes.pythonapi.PyThreadState_SetAsyncExc(ctypes.c_ulong(self.ident), ctypes.py_object(error))

    def cancel(self) -> None:
        """Stop the task (in the trio thread): :class:`TaskCancelled` raised in its thread, which
        is left behind if it has not stopped ``TIME_LIMIT_GRACE`` seconds later."""
        self.cancel_asked = True
        if self.cancelled is not None:  # run_in_thread waits for the time limit or this
            self.cancelled.set()
        elif self.scope is not None:  # no time limit: raised now, and the wait ends after the grace
            self.interrupt(TaskCancelled)
            self.scope.deadline = min(self.scope.deadline, trio.current_time() + TIME_LIMIT_GRACE)


async def run_in_thread(fn: Callable[[], Any], timeout: float | None, limiter: trio.CapacityLimiter,
                        call: ThreadCall | None = None) -> tuple[bool, Any]:  # fmt: skip
    """Run ``fn`` in a thread of ``limiter``'s; ``(True, its value)``, its error raised, or
    ``(False, None)`` when its thread did not stop ``TIME_LIMIT_GRACE`` seconds after the
    time limit (or a cancel: ``call.cancel()``, ``call`` made by the caller) was raised in it
    (left behind)."""
    if call is None:
        call = ThreadCall(fn)
    if timeout is None:
        # a plain hand-off to a thread (per task: no nursery, no waiter), in a scope that
        # call.cancel() ends after the grace
        with trio.CancelScope() as call.scope:
            if call.cancel_asked:
                call.interrupt(TaskCancelled)  # raised as the thread starts
            return True, await trio.to_thread.run_sync(call.run, abandon_on_cancel=True, limiter=limiter)
        return False, None  # cancelled, and stuck in a C call: left behind
    call.cancelled = trio.Event()
    if call.cancel_asked:
        call.cancelled.set()
    outcome: list[Any] = []

    async def in_thread(cancel: trio.CancelScope) -> None:
        try:
            outcome.append((True, await trio.to_thread.run_sync(call.run, abandon_on_cancel=True, limiter=limiter)))
        except Exception as exc:
            outcome.append((False, exc))
        cancel.cancel()

    async with trio.open_nursery() as nursery:
        nursery.start_soon(in_thread, nursery.cancel_scope)
        with trio.move_on_after(timeout if timeout else math.inf):
            await call.cancelled.wait()
        call.interrupt(TaskCancelled if call.cancel_asked else TimeLimitExceeded)  # at its next bytecode
        await trio.sleep(TIME_LIMIT_GRACE)
        nursery.cancel_scope.cancel()  # stuck in a C call: left behind
    if outcome:
        ok, value = outcome[0]
        if ok:
            return True, value
        raise value
    return False, None
