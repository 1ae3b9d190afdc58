"""A task's time limit (``@app.task(timeout=...)``).

``async def`` tasks run in the trio thread under a cancel scope (:func:`limit`). Plain
functions run in a thread (``trio.to_thread``, at most ``concurrency`` at once), which cannot
be cancelled: at the time limit the worker raises :class:`TimeLimitExceeded` *inside* the
thread (``PyThreadState_SetAsyncExc``, as dramatiq does; :class:`ThreadCall`). Python
delivers it at the thread's next bytecode, so a thread blocked in one long C call (a
``time.sleep(60)``, a socket read without timeout) sees it only when the call returns; after
``TIME_LIMIT_GRACE`` more seconds the worker stops waiting, fails the task and leaves the
thread behind (it keeps its slot until it ends): :func:`run_in_thread`.
"""

from __future__ import annotations

import contextlib
import ctypes
import threading
from collections.abc import Callable
from typing import Any, ContextManager

import trio

__all__ = ["TimeLimitExceeded", "TIME_LIMIT_GRACE", "ThreadCall", "exceeded", "limit", "run_in_thread"]

#: seconds a thread gets, after the time limit raised in it, before it is left behind
TIME_LIMIT_GRACE = 1.0


class TimeLimitExceeded(Exception):
    """The task ran longer than its ``timeout``."""


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


async def run_in_thread(fn: Callable[[], Any], timeout: float | None, limiter: trio.CapacityLimiter) -> tuple[bool, Any]:
    """Run ``fn`` in a thread of ``limiter``'s; ``(True, its value)``, its error raised, or
    ``(False, None)`` when its thread did not stop ``TIME_LIMIT_GRACE`` seconds after the
    time limit was raised in it (left behind)."""
    call = ThreadCall(fn)
    if timeout is None:
        return True, await trio.to_thread.run_sync(call.run, abandon_on_cancel=True, limiter=limiter)
    outcome: list[Any] = []

    async def in_thread(cancel: trio.CancelScope) -> None:
        try:
            outcome.append((True, await trio.to_thread.run_sync(call.run, abandon_on_cancel=True, limiter=limiter)))
        except Exception as exc:
            outcome.append((False, exc))
        cancel.cancel()

    async with trio.open_nursery() as nursery:
        nursery.start_soon(in_thread, nursery.cancel_scope)
        await trio.sleep(timeout)
        call.interrupt()  # raised in the thread at its next bytecode
        await trio.sleep(TIME_LIMIT_GRACE)
        nursery.cancel_scope.cancel()  # stuck in a C call: left behind
    if outcome:
        ok, value = outcome[0]
        if ok:
            return True, value
        raise value
    return False, None
