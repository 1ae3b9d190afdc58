"""What a task sees of its own run: :class:`TaskContext` and :func:`current_task`.

The worker makes one context per run (:mod:`.runner`) and sets it current in the thread, or
the trio task, that runs the task (:mod:`.hooks`); the hooks are called with it, and a task
declared with ``bind=True`` is passed it first, as Celery passes ``self``. For Celery's code
it also answers Celery's names: ``request`` (itself), ``id``, ``retries``, ``name``,
``max_retries``, ``called_directly`` (docs/TASKS.md, "From Celery and dramatiq").

A leaf: it imports nothing of the task layer, so that the app (:mod:`.app`, which makes the
context of a bound task called here and now) and the hooks both build on it.
"""

from __future__ import annotations

import contextvars
import math
from dataclasses import dataclass, field
from types import TracebackType
from typing import Any

__all__ = ["TaskContext", "current_task"]


@dataclass
class TaskContext:
    """What the hooks see of one run of a task."""

    task: Any  # the Task (app.Task)
    job_id: str
    queue: str
    args: tuple[Any, ...]
    kwargs: dict[str, Any]
    meta: dict[str, Any]
    attempt: int
    final: bool  # a failure of this run is not retried
    result: Any = None
    error: BaseException | None = None
    #: the task's own part of ``error``'s traceback (from its function, or the hook that raised, down)
    error_tb: TracebackType | None = None
    started: float = 0.0  # time.monotonic()
    duration: float | None = None
    extra: dict[str, Any] = field(default_factory=dict)  # for the hooks' own use
    #: ``(job_id, done, total, note) -> None``: where :meth:`progress` goes (the worker's beats)
    reporter: Any = None

    def progress(self, done: float, total: float | None = None, note: str | None = None) -> None:
        """Report how far the task is (``done`` of ``total``, a short ``note``): shown by
        ``ref.progress()``, ``ref.status()``, ``disque-py workers`` and the admin page within a
        second (it rides in the worker's beats; docs/TASKS.md, "Revoke, cancel, status, progress"). Nothing for a task
        called here and now."""
        for name, value in (("done", done), ("total", total)):
            if value is not None and (isinstance(value, bool) or not isinstance(value, (int, float))):
                raise TypeError("progress %s must be a number, not %s" % (name, type(value).__name__))
            if value is not None and not math.isfinite(value):
                raise ValueError("progress %s must be finite, not %r" % (name, value))
        if note is not None and not isinstance(note, str):
            raise TypeError("progress note must be a str, not %s" % type(note).__name__)
        if self.reporter is not None and self.job_id:
            self.reporter(self.job_id, done, total, note)

    # Celery's names for the same things: a bound task's ``self.request.id`` reads as in Celery
    @property
    def request(self) -> "TaskContext":
        """This context itself (Celery's ``self.request``)."""
        return self

    @property
    def id(self) -> str:
        """The job's ID (Celery's ``request.id``); empty for a task called here and now."""
        return self.job_id

    @property
    def retries(self) -> int:
        """Deliveries before this one (Celery's ``request.retries``): 0 on the first run. A
        delivery whose worker died counts too (Celery counts only the retries it asked for)."""
        return self.attempt - 1

    @property
    def name(self) -> str:
        """The task's name."""
        return self.task.name

    @property
    def max_retries(self) -> int:
        """The task's ``retries``: failures retried before its job is a dead letter."""
        return self.task.retries

    @property
    def called_directly(self) -> bool:
        """True when the task was called here and now (``add(1, 2)``), not run by a worker."""
        return not self.job_id


_current: contextvars.ContextVar[TaskContext] = contextvars.ContextVar("disque_py_task")


def current_task() -> TaskContext:
    """The :class:`TaskContext` of the task running in this thread (or trio task)."""
    try:
        return _current.get()
    except LookupError:
        raise RuntimeError("current_task() called outside a task") from None
