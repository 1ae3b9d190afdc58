"""A task that fails at a known line, run by a real worker until its retries are spent: what the
tests of failures' tracebacks share (TaskError.traceback, `disque-py dead show`, the admin API
and the admin page each find the same lines)."""

from __future__ import annotations

import threading
import uuid
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, Iterator

import pytest

from disque_py.tasks import App, TaskError, TaskRef, make_worker

#: the source line that fails, as a traceback quotes it
FAILING_LINE = 'return table["missing"]  # the failing line'
#: the last line of its traceback
ERROR_LINE = "KeyError: 'missing'"


def lookup(table: dict) -> Any:
    return table["missing"]  # the failing line


#: the failing line's number in this file
FAILING_LINE_NO = lookup.__code__.co_firstlineno + 1


@dataclass
class Failing:
    app: App
    queue: str
    fails: Any  # the task: lookup({}) on every attempt, two attempts (retries=1)
    huge: Any  # the task: the same failure, handling another one whose traceback is 100 KiB


def failing_app(nodes: str, queue: str | None = None) -> Failing:
    """An app of the two failing tasks, in a queue of their own."""
    app = App(nodes, result_ttl=120)
    queue = queue or "trace-" + uuid.uuid4().hex[:8]

    @app.task(queue=queue, retries=1, backoff=(0.05, 0.1), name="tracing.fails")
    def fails(n):
        return lookup({})

    @app.task(queue=queue, retries=0, name="tracing.huge")
    def huge():
        try:
            raise ValueError("a line of the context\n" * 4800)  # 100 KiB of traceback before the failure
        except ValueError:
            return lookup({})

    return Failing(app, queue, fails, huge)


@contextmanager
def running_worker(app: App, **options: Any) -> Iterator[Any]:
    """A worker of ``app`` in a thread of this process, stopped (and checked) on the way out."""
    options.setdefault("fetch_timeout_ms", 200)
    worker, _ = make_worker(app, **options)
    failed: list[BaseException] = []

    def run() -> None:
        try:
            worker.run_sync(handle_signals=False)
        except BaseException as exc:  # noqa: BLE001 - raised below
            failed.append(exc)

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    try:
        yield worker
    finally:
        worker.stop(grace_period=5.0)
        thread.join(15)
        assert not thread.is_alive(), "the worker did not stop"
    if failed:
        raise failed[0]


def fail_for_good(f: Failing, task: Any = None, *args: Any) -> tuple[TaskRef, TaskError]:
    """Send ``task`` (default: ``fails``) and run a worker until it failed for good: its ref and
    the TaskError its waiter got (the job is a dead letter by then)."""
    task = task or f.fails
    if task is f.fails and not args:
        args = (1,)
    with running_worker(f.app, concurrency=2):
        ref = task.send(*args)
        with pytest.raises(TaskError) as err:
            ref.result(timeout=30)
    # stopped: the worker sent its outcomes first, the last NACK (which makes the dead letter) too
    return ref, err.value
