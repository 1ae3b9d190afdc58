"""Celery's words for sending and declaring tasks, as this layer's own (docs/TASKS.md, "From Celery").

* **When a job runs and when it is dropped.** ``delay=``/``eta=``/``countdown=`` (seconds, or an
  aware :class:`~datetime.datetime`) become ADDJOB's ``DELAY``, ``expires=`` its ``TTL``
  (:func:`job_times`). The cluster counts both in whole seconds from the moment the node takes
  the job: a delay is rounded up (a task never runs before its ETA) and an expiry down (a job is
  never handed out after it). A naive datetime is refused: its moment is ambiguous (Celery reads
  one as UTC, Python's ``timestamp()`` as local time, and the two differ by the UTC offset).
* **apply_async's options** as ``send_with``'s (:func:`send_options`): ``countdown``/``eta`` are
  ``delay``, ``expires`` stays, ``ignore_result=True`` is ``result_ttl=0``, ``priority=`` (0 to 9,
  the higher first: Celery's meaning on RabbitMQ, not its Redis transport's reversed one) is
  ADDJOB's ``PRIORITY``.
* **Celery's other words**, on ``@app.task`` (:func:`refuse_task_options`) or when sending
  (:func:`unknown_options`), are refused with the word to use here, or why there is none yet.

Pure: no I/O; the clock is passed in.
"""

from __future__ import annotations

import math
import numbers
from datetime import datetime
from typing import Any

__all__ = ["seconds_from", "job_times", "send_options", "refuse_task_options", "unknown_options", "check_priority",
           "check_group",
           "RATE_LIMIT_REFUSED"]  # fmt: skip

RATE_LIMIT_REFUSED = ("rate_limit= is not supported: give the task a group= and limit the group across the "
                      "cluster (GROUP LIMIT group RATE per-second, or client.group_limit(group, rate=...))")  # fmt: skip

#: Celery's words on a send that have another name here, or none yet: the word -> what to do
SEND_WORDS: dict[str, str] = {
    "countdown": "delay= (seconds), or apply_async(countdown=)",
    "eta": "delay= (seconds or an aware datetime), or apply_async(eta=)",
    "ignore_result": "result_ttl=0",
    "max_retries": "retries=",
    "link": "chain the tasks: (a.s(...) | b.s()).send()",
    "link_error": "not yet: an @app.on_failure hook sees every failure (ctx.final: for good)",
    "serializer": "a task's serializer is declared with it: @app.task(serializer=)",
    "routing_key": "queue=",
    "exchange": "queue=",
    "headers": "meta= (a map the task and the hooks see as ctx.meta)",
    "task_id": "the cluster names each job (ref.id); dedup= makes sending twice add one job",
    "time_limit": "declared with the task: @app.task(timeout=)",
    "soft_time_limit": "declared with the task: @app.task(timeout=)",
    "retry_policy": "the client's own settings, given to App(...)",
    "shadow": "not supported: a job carries its task's own name",
}

#: Celery's words on @app.task that have another name here, or none yet
TASK_WORDS: dict[str, str] = {
    "max_retries": "retries= (failures retried; the job's MAXDELIVER is retries + 1)",
    "autoretry_for": "every exception is retried here (raise disque_py.client.worker.Reject for one that "
                     "must not be)",
    "retry_backoff": "backoff=(min, max) seconds (min, 2 x min, 4 x min ... at most max)",
    "retry_backoff_max": "backoff=(min, max) seconds",
    "default_retry_delay": "backoff=(min, max) seconds",
    "retry_jitter": "not supported: the node's backoff doubles without jitter",
    "acks_late": "every task is acknowledged after it ran (Celery's acks_late=True), none before",
    "time_limit": "timeout= (seconds)",
    "soft_time_limit": "timeout= (seconds; TimeLimitExceeded is raised inside the task)",
    "ignore_result": "result_ttl=0",
    "expires": "give expires= when sending (apply_async)",
    "base": "there are no task classes: hooks (@app.before_task, @app.after_task, @app.on_failure)",
    "typing": "arguments are always checked against the function when sent",
}


def seconds_from(value: Any, what: str, now: float) -> float:
    """``value``, seconds or an aware datetime, as seconds after ``now`` (Unix time): a datetime
    in the past is negative; a negative, infinite or NaN number of seconds is refused."""
    if isinstance(value, datetime):
        if value.tzinfo is None or value.utcoffset() is None:
            raise TypeError("%s=%r is a naive datetime: its moment is ambiguous (Celery reads it as UTC, Python's "
                            "timestamp() as local time); give an aware one, e.g. datetime.now(timezone.utc) + "
                            "timedelta(seconds=30)" % (what, value))  # fmt: skip
        return value.timestamp() - now
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise TypeError("%s= takes seconds or an aware datetime, not %s" % (what, type(value).__name__))
    seconds = float(value)
    if not math.isfinite(seconds) or seconds < 0:
        raise ValueError("%s= must be a finite number of seconds >= 0, got %r" % (what, value))
    return seconds


def job_times(delay: Any, expires: Any, ttl: int | None, default_ttl: int, now: float) -> tuple[int | None, int]:
    """ADDJOB's ``DELAY`` (None: none) and ``TTL`` for a job sent at ``now`` (Unix time): ``delay``
    (seconds or an aware datetime) rounded up, ``expires`` (the same) rounded down, else ``ttl``,
    else ``default_ttl``. ValueError when the job would expire before it is due."""
    due = None
    if delay is not None:
        due = max(0, int(math.ceil(seconds_from(delay, "delay", now))))
    if expires is None:
        life = int(ttl or default_ttl)
        if due is not None and due >= life:
            raise ValueError("the task is to run in %d s, past its TTL (%d s): give a longer ttl= or an expires= "
                             "after that" % (due, life))  # fmt: skip
        return due, life
    if ttl is not None:
        raise TypeError("give ttl= or expires=, not both (both are the job's life)")
    left = seconds_from(expires, "expires", now)
    if left < 1:
        raise ValueError("expires=%r is %s: the cluster counts a job's life in whole seconds, at least 1"
                         % (expires, "past" if left <= 0 else "less than a second away"))  # fmt: skip
    life = int(math.floor(left))
    if due is not None and due >= life:
        raise ValueError("expires=%r comes before the task is to run (in %d s; the job would expire in %d s, "
                         "whole seconds): it would never run" % (expires, due, life))  # fmt: skip
    return due, life


def send_options(options: dict[str, Any]) -> dict[str, Any]:
    """apply_async's options (Celery's) as ``send_with``'s: ``countdown`` (seconds) or ``eta``
    (seconds or an aware datetime) is ``delay``, ``ignore_result=True`` is ``result_ttl=0``,
    ``expires`` and ``priority`` stay; the others pass as they are (``send_with``'s own, which
    refuses what it does not know). None is no option."""
    options = {name: value for name, value in options.items() if value is not None}
    given = [name + "=" for name in ("countdown", "eta", "delay") if name in options]
    if len(given) > 1:
        raise TypeError("give one of countdown=, eta= and delay=, not %s" % " and ".join(given))
    if "countdown" in options:
        countdown = options.pop("countdown")
        if isinstance(countdown, datetime):
            raise TypeError("countdown= is seconds; give a datetime as eta=")
        options["delay"] = countdown
    elif "eta" in options:
        options["delay"] = options.pop("eta")
    if options.pop("ignore_result", False):
        if options.get("result_ttl"):
            raise TypeError("give ignore_result=True or result_ttl=, not both")
        options["result_ttl"] = 0
    return options


def unknown_options(names: Any, where: str = "send") -> TypeError:
    """The error for options ``where`` does not take, with what to use for Celery's words."""
    names = sorted(names)
    hints = ["%s=: %s" % (n, SEND_WORDS[n]) for n in names if n in SEND_WORDS]
    text = "unknown %s option(s): %s" % (where, ", ".join(names))
    return TypeError(text + ("" if not hints else " (%s)" % "; ".join(hints)))


def check_priority(priority: Any) -> int | None:
    """A task's ``priority=`` (ADDJOB's PRIORITY): None, or an int from 0 to 9, the higher first
    (Celery's 0-9 with RabbitMQ's meaning); anything else is refused."""
    if priority is None:
        return None
    if isinstance(priority, bool) or not isinstance(priority, int):
        raise TypeError("priority= is an int from 0 to 9 (the higher first), not %s" % type(priority).__name__)
    if not 0 <= priority <= 9:
        raise ValueError("priority= is from 0 to 9 (the higher first; a job without one is at 5), got %d" % priority)
    return priority


def check_group(group: Any) -> str | None:
    """A task's ``group=`` (ADDJOB's GROUP): None, or a str of 1 to 128 bytes (UTF-8)."""
    if group is None:
        return None
    if not isinstance(group, str):
        raise TypeError("group= is a str (the jobs' group: ADDJOB's GROUP), not %s" % type(group).__name__)
    if not 0 < len(group.encode()) <= 128:
        raise ValueError("group= is 1 to 128 bytes, got %d" % len(group.encode()))
    return group


def refuse_task_options(rate_limit: Any, options: dict[str, Any]) -> None:
    """TypeError for ``@app.task`` options it does not take: Celery's with the word to use here."""
    if rate_limit is not None:
        raise TypeError(RATE_LIMIT_REFUSED)
    if options:
        names = sorted(options)
        hints = ["%s=: %s" % (n, TASK_WORDS[n]) for n in names if n in TASK_WORDS]
        raise TypeError("@app.task got unexpected keyword argument(s): %s%s"
                        % (", ".join(names), "" if not hints else " (%s)" % "; ".join(hints)))  # fmt: skip
