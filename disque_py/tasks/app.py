"""The app: its tasks (a registry by name), how a task is sent, signatures and groups.

::

    app = App(nodes="127.0.0.1:7711,127.0.0.1:7712")

    @app.task(queue="math", retries=3, backoff=(0.5, 30), timeout=10, result_ttl=300)
    def add(a, b):
        return a + b

    ref = add.send(1, 2)             # ADDJOB math {"v":1,"task":"myapp.add","args":[1,2],...}
    ref.result(timeout=5)            # 3
    app.group(add.s(1, 2), add.s(3, 4)).send().results(timeout=5)   # [3, 7]
    (add.s(1, 2) | mul.s(10)).send().result(timeout=5)              # 30

A task's options become its job's options: ``retries=N`` is ``MAXDELIVER N+1``
(the N+1-th failed delivery dead-letters the job, with the error as its reason),
``backoff=(min, max)`` is ``BACKOFF min max`` (the node holds a failed job
``min * 2^(n-1)`` seconds, at most ``max``), ``ttl``, ``retry``, ``replicate`` are
ADDJOB's (``retry`` must exceed the time a job may spend in a worker: in its buffer and
then running; with ``timeout`` and no ``retry`` it is ``2 * timeout + 30``, never less than
the node's own default, ``core.constants.default_retry(ttl)``: a tenth of the TTL, at most 300).
``timeout`` is the time limit the worker enforces; ``result_ttl`` how
long the result is kept (None: the app's ``result_ttl``; 0: no result).

Celery's words are these under Celery's names: ``add.delay(...)`` sends, ``add.apply_async(...)``
takes Celery's options (:mod:`.calling` turns them into ours: ``countdown``/``eta`` into ADDJOB's
``DELAY``, ``expires`` into its ``TTL``, ``priority`` into its ``PRIORITY``), ``bind=True`` passes the run's
:class:`~.context.TaskContext` first, ``add.si(...)`` is a signature given nothing in a chain.
"""

from __future__ import annotations

import functools
import inspect
import math
import os
import threading
import time
import uuid
from collections.abc import Callable
from datetime import datetime
from typing import Any

from ..client import commands as cmd
from ..client.sync import Client
from ..core.constants import default_retry
from ..core.ids import dedup_job_id
from . import control
from .calling import check_group, check_priority, job_times, refuse_task_options, send_options, unknown_options
from .context import TaskContext, current_task
from .chords import Progress, member_ids, member_runs
from .chords import progress as chord_progress
from .message import (
    MAX_RESULT_TTL, ON_ERROR, SERIALIZERS, ChainSpec, ChainStep, ChordSpec, GroupStep, Message, ResultSpec, Step,
    chain_key, chain_result_queue, chord_key, encode, member_key, result_queue,
)  # fmt: skip
from .results import Outcome, ResultTimeout, TaskRef, unwrap, wait_outcomes
from .tracing import UNSET, active, sendings

__all__ = ["App", "Task", "Signature", "Group", "GroupRef", "Chain", "ChainRef", "Chord", "ChordRef", "Hook", "group",
           "chain", "chord"]  # fmt: skip

Hook = Callable[[Any], Any]

DEFAULT_NODES = "127.0.0.1:7711"


class Task:
    """A function registered with an app (see the module docstring). Calling the task runs
    the function here and now; :meth:`send` makes it a job."""

    def __init__(
        self,
        app: "App",
        fn: Callable[..., Any],
        *,
        name: str,
        queue: str,
        retries: int,
        backoff: tuple[float, float] | None,
        timeout: float | None,
        result_ttl: int | None,
        ttl: int,
        retry: int | None,
        replicate: int | None,
        serializer: str,
        bind: bool = False,
        priority: int | None = None,
        group: str | None = None,
    ) -> None:
        if not name:
            raise ValueError("a task needs a name")
        if not queue:
            raise ValueError("a task needs a queue")
        if not isinstance(retries, int) or isinstance(retries, bool) or retries < 0:
            raise ValueError("retries must be an integer >= 0")
        if backoff is not None:
            low, high = backoff
            if not 0 <= low <= high or high <= 0:
                raise ValueError("backoff must be (min, max) seconds with 0 <= min <= max and max > 0")
            backoff = (float(low), float(high))
        if timeout is not None and not timeout > 0:
            raise ValueError("timeout must be > 0 seconds (or None)")
        if result_ttl is not None and result_ttl < 0:
            raise ValueError("result_ttl must be >= 0 (0: no result)")
        if serializer not in SERIALIZERS:
            raise ValueError("serializer must be one of %s" % ", ".join(SERIALIZERS))
        self.app = app
        self.fn = fn
        self.name = name
        self.queue = queue
        self.retries = retries
        self.backoff = backoff
        self.timeout = timeout
        self.result_ttl = result_ttl
        self.ttl = ttl
        self.retry = retry
        self.replicate = replicate
        self.serializer = serializer
        self.priority = check_priority(priority)  # ADDJOB's PRIORITY; None: the default (5)
        self.group = check_group(group)  # ADDJOB's GROUP; None: the default group
        self.is_async = inspect.iscoroutinefunction(fn)
        try:
            self.fn_signature: inspect.Signature | None = inspect.signature(fn)
        except (TypeError, ValueError):  # a builtin without one: not checked
            self.fn_signature = None
        self.bind = bool(bind)
        if self.bind:  # given its run's context first (Celery's bind=True): the arguments sent are the rest
            params = [] if self.fn_signature is None else list(self.fn_signature.parameters.values())
            if self.fn_signature is not None and (not params or params[0].kind not in (params[0].POSITIONAL_ONLY,
                                                                                     params[0].POSITIONAL_OR_KEYWORD)):
                raise ValueError("a task declared with bind=True takes its context first: def %s(self, ...)"
                                 % getattr(fn, "__name__", name))  # fmt: skip
            if self.fn_signature is not None:
                self.fn_signature = self.fn_signature.replace(parameters=params[1:])
            self.fn = _bound(fn)
        self.__doc__ = fn.__doc__
        self.__wrapped__ = fn

    def __repr__(self) -> str:
        return "<Task %s queue=%s>" % (self.name, self.queue)

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        if self.bind:  # here and now: a context of its own, with no job (called_directly)
            return self.__wrapped__(TaskContext(self, "", self.queue, args, kwargs, {}, 1, True), *args, **kwargs)
        return self.fn(*args, **kwargs)

    @property
    def effective_result_ttl(self) -> int:
        return self.app.result_ttl if self.result_ttl is None else int(self.result_ttl)

    def check_arguments(self, args: tuple[Any, ...], kwargs: dict[str, Any], partial: bool = False) -> None:
        """TypeError when the function cannot be called with these arguments (``partial``:
        with these and more)."""
        if self.fn_signature is not None:
            if partial:
                self.fn_signature.bind_partial(*args, **kwargs)
            else:
                self.fn_signature.bind(*args, **kwargs)

    def s(self, *args: Any, **kwargs: Any) -> "Signature":
        """A signature: this task with these arguments, to send later or in a group."""
        return Signature(self, args, kwargs)

    def send(self, *args: Any, **kwargs: Any) -> TaskRef:
        """Queue the task with these arguments; returns its :class:`TaskRef`."""
        return self.send_with(args=args, kwargs=kwargs)

    # Celery's words (docs/TASKS.md, "From Celery and dramatiq"); Celery's options: .calling
    def delay(self, *args: Any, **kwargs: Any) -> TaskRef:
        """Celery's shortcut for sending: :meth:`send` (the send option ``delay=`` is something
        else: the seconds, or the moment, before the task runs)."""
        return self.send_with(args=args, kwargs=kwargs)

    def apply_async(self, args: Any = None, kwargs: dict[str, Any] | None = None, *, countdown: float | None = None,
                    eta: Any = None, expires: Any = None, priority: Any = None, queue: str | None = None,
                    retries: int | None = None, group: Any = None, **options: Any) -> TaskRef:  # fmt: skip
        """Celery's ``apply_async``: ``countdown`` (seconds) or ``eta`` (an aware datetime, or
        seconds) before it runs, ``expires`` (seconds or an aware datetime) the job's life,
        ``ignore_result=True``, ``queue``, ``retries`` and any :meth:`send_with` option; the same
        :class:`TaskRef`. ``priority``: 0 to 9, the higher first (ADDJOB's PRIORITY); ``group``: the
        job's group (ADDJOB's GROUP: fair turns and the group's limits)."""
        options.update(countdown=countdown, eta=eta, expires=expires, priority=priority, queue=queue, retries=retries,
                       group=group)  # fmt: skip
        return self.send_with(tuple(args or ()), kwargs, **send_options(options))

    def si(self, *args: Any, **kwargs: Any) -> "Signature":
        """An immutable signature: in a chain it is not given the previous task's value."""
        return Signature(self, args, kwargs, immutable=True)

    def signature(self, args: Any = None, kwargs: dict[str, Any] | None = None, *, immutable: bool = False,
                  **options: Any) -> "Signature":  # fmt: skip
        """Celery's ``task.signature(args, kwargs, **options)``, options as :meth:`apply_async`'s
        (taken when it is sent: a ``countdown`` counts from then)."""
        return Signature(self, tuple(args or ()), dict(kwargs or {}), send_options(options), immutable=immutable)

    def message(self, args: tuple[Any, ...] = (), kwargs: dict[str, Any] | None = None, *,
                result_ttl: int | None = None, meta: dict[str, Any] | None = None) -> Message:  # fmt: skip
        ttl = self.effective_result_ttl if result_ttl is None else int(result_ttl)
        return Message(self.name, tuple(args), dict(kwargs or {}), ResultSpec(ttl) if ttl > 0 else None, meta or {})

    def addjob_argv(self, body: bytes, **options: Any) -> tuple[tuple[Any, ...], str]:
        """The ADDJOB for a body of this task and the queue it goes to (see :meth:`send_with`)."""
        queue = options.pop("queue", None) or self.queue
        retries = options.pop("retries", None)
        retries = self.retries if retries is None else retries
        dedup = options.pop("dedup", None)
        delay = options.pop("delay", None)
        expires = options.pop("expires", None)
        ttl = options.pop("ttl", None) or None
        retry = options.pop("retry", None)
        if isinstance(retry, bool):
            raise TypeError("retry= is the seconds before an unacknowledged job is queued again (Disque's RETRY), "
                            "not Celery's retry=True/False (the client's own settings decide)")  # fmt: skip
        retry = self.retry if retry is None else retry
        replicate = options.pop("replicate", None) or self.replicate
        backoff = options.pop("backoff", None) or self.backoff
        timeout_ms = options.pop("timeout_ms", cmd.DEFAULT_ADD_TIMEOUT_MS)
        priority = check_priority(options.pop("priority", None))
        priority = self.priority if priority is None else priority
        group = check_group(options.pop("group", None))
        group = self.group if group is None else group
        if options:
            raise unknown_options(options)
        delay, ttl = job_times(delay, expires, ttl, self.ttl, time.time())
        if expires is not None and retry is not None and retry >= ttl:
            raise ValueError("the job's retry (%s s) is not below its life (%d s, to expires=): a job whose worker "
                             "died would not be queued again before it expires; give a shorter retry= or a later "
                             "expires=" % (retry, ttl))  # fmt: skip
        if isinstance(backoff, (tuple, list)) and len(backoff) == 2 and all(
                isinstance(b, (int, float)) for b in backoff) and backoff[1] > ttl:  # fmt: skip
            # a wait past the job's life never ends (the node refuses one): the job expires first anyway
            backoff = (min(backoff[0], ttl), ttl)
        if retry is None and self.timeout is not None:
            # the job must not come back (RETRY) while a worker may still run it: its time limit
            # twice over plus some wait in the worker's buffer, and never below the node's default
            retry = min(max(default_retry(int(ttl)), int(math.ceil(2 * self.timeout)) + 30), max(1, int(ttl) - 1))
        argv = cmd.addjob_argv(
            queue,
            body,
            timeout_ms=timeout_ms,
            replicate=replicate,
            delay=delay,
            retry=retry,
            ttl=ttl,
            backoff=None if retry == 0 else backoff,
            maxdeliver=None if retry == 0 else retries + 1,
            priority=priority,
            group=group,
        )
        if dedup is not None:
            argv = (*argv, b"DEDUP", dedup)
        return argv, queue

    def send_with(
        self,
        args: tuple[Any, ...] | list[Any] = (),
        kwargs: dict[str, Any] | None = None,
        *,
        result_ttl: int | None = None,
        meta: dict[str, Any] | None = None,
        **options: Any,
    ) -> TaskRef:
        """Queue the task with any job option: ``delay`` (seconds, or an aware datetime: when it
        runs), ``dedup`` (key: one job per key and queue, whoever sends it), ``ttl`` (s) or
        ``expires`` (seconds or an aware datetime: the job's life), ``retry``, ``replicate``,
        ``queue``, ``retries``, ``backoff``, ``priority`` (0 to 9, the higher first; default: the
        task's), ``group`` (the job's group: ADDJOB's GROUP; default: the task's), ``timeout_ms`` (ADDJOB's wait for copies), and
        ``result_ttl`` (0: no result), ``meta`` (a map the hooks see)."""
        self.check_arguments(tuple(args), dict(kwargs or {}))
        message = self.message(tuple(args), kwargs, result_ttl=result_ttl, meta=meta)
        job_id = self.add_message(message, options)
        return TaskRef(self.app, job_id, self.name, result_queue(job_id) if message.result else None)

    def add_message(self, message: Message, options: dict[str, Any]) -> str:
        """``message``'s job added with :meth:`send_with`'s job ``options``: its ID. With traces on,
        in a ``send`` span whose context the body carries (:mod:`.tracing`)."""
        traced = active(self.app)
        if traced is not None:
            return traced.send(self.name, options.get("queue") or self.queue, message, lambda m: self._add(m, options))
        return self._add(message, options)

    def _add(self, message: Message, options: dict[str, Any]) -> str:
        argv, queue = self.addjob_argv(encode(message, self.serializer), **options)
        dedup = b"DEDUP" in argv
        if dedup and "periodic_slot" not in message.meta:
            # a key whose job was revoked is free: its next generation (control.py); a periodic
            # slot's schedulers all send the same slot, so a revoked slot stays revoked
            key = cmd.dedup_key(argv[-1])
            retry = next((int(argv[i + 1]) for i in range(4, len(argv) - 1) if argv[i] == b"RETRY"), 1)
            live = control.live_key(self.app.client(), queue, key, retry)
            if live != key:
                argv = (*argv[:-1], live)
        return self.app._addjob(argv, retry_safe=dedup)


def _bound(fn: Callable[..., Any]) -> Callable[..., Any]:
    """``fn`` called with the running task's context first (``bind=True``), as a plain or an
    ``async def`` function like ``fn``."""
    if inspect.iscoroutinefunction(fn):

        @functools.wraps(fn)
        async def run_bound(*args: Any, **kwargs: Any) -> Any:
            return await fn(current_task(), *args, **kwargs)

        return run_bound

    @functools.wraps(fn)
    def call_bound(*args: Any, **kwargs: Any) -> Any:
        return fn(current_task(), *args, **kwargs)

    return call_bound


class Signature:
    """A task with its arguments (``task.s(...)``): sent later, or with a group. An immutable
    one (``task.si(...)``) is not given the previous task's value in a chain."""

    __slots__ = ("task", "args", "kwargs", "options", "immutable")

    def __init__(self, task: Task, args: tuple[Any, ...], kwargs: dict[str, Any], options: dict[str, Any] | None = None,
                 immutable: bool = False):  # fmt: skip
        # partly: in a chain the previous task's value comes first (checked whole when sent);
        # an immutable one is given nothing more
        task.check_arguments(args, kwargs, partial=not immutable)
        self.task = task
        self.args = args
        self.kwargs = kwargs
        self.options = options or {}
        self.immutable = immutable

    def __repr__(self) -> str:
        return "%s.%s(%s)" % (self.task.name, "si" if self.immutable else "s", ", ".join(
            [repr(a) for a in self.args] + ["%s=%r" % kv for kv in self.kwargs.items()]))  # fmt: skip

    def with_options(self, **options: Any) -> "Signature":
        return Signature(self.task, self.args, self.kwargs, {**self.options, **options}, self.immutable)

    def send(self) -> TaskRef:
        return self.task.send_with(self.args, self.kwargs, **self.options)

    def delay(self, *args: Any, **kwargs: Any) -> TaskRef:
        """Celery's ``sig.delay(*args, **kwargs)``: :meth:`apply_async` with these arguments."""
        return self.apply_async(args, kwargs)

    def apply_async(self, args: Any = (), kwargs: dict[str, Any] | None = None, **options: Any) -> TaskRef:
        """Celery's: sent with ``args`` before its own and ``kwargs`` over its own (an immutable
        signature takes neither, as Celery's), and apply_async's options over its own."""
        if self.immutable:
            args, kwargs = (), None
        options = {**self.options, **send_options(options)}
        return self.task.send_with(tuple(args or ()) + self.args, {**self.kwargs, **(kwargs or {})}, **options)

    def __or__(self, other: Any) -> "Chain":
        return Chain(self.task.app, [self]) | other


class ChainRef(TaskRef):
    """A sent chain: ``id`` is its first job's ID, ``ids`` every task's (those not added yet
    included: each is the deduplication ID its worker will add it with; a group's is the list
    of its members'); :meth:`result` waits for the last task's value (a group's, the list of its
    values), or raises the error of the first task that failed for good."""

    __slots__ = ("ids",)

    def __init__(self, app: Any, ids: list[Any], task_name: str, final_queue: str, job_id: str | None = None) -> None:
        super().__init__(app, job_id or ids[0], task_name, final_queue)
        self.ids = ids

    def __repr__(self) -> str:
        return "%s(%r, ids=%r)" % (type(self).__name__, self.task_name, self.ids)


class ChordRef(ChainRef):
    """A sent chord (a chain whose first step is a group): ``group`` is its members'
    :class:`GroupRef`, ``id`` its callback's job ID (known before it is added; the first member's
    when a group follows the group), :meth:`result`
    the callback's value (the last task's, when a chain follows it), or a ``ChordError``
    :class:`TaskError` naming the members that failed (``on_error="fail"``); :meth:`progress`
    how many members are done."""

    __slots__ = ("group",)

    def __init__(self, app: Any, ids: list[Any], task_name: str, final_queue: str, group: "GroupRef") -> None:
        after = ids[1] if len(ids) > 1 else None
        super().__init__(app, ids, task_name, final_queue, after if isinstance(after, str) else group.refs[0].id)
        self.group = group

    def progress(self) -> Progress:
        """The members done (read from the cluster, :meth:`GroupRef.progress`)."""
        return self.group.progress()


def _word(words: tuple[Any, ...], name: str, default: int) -> int:
    """The value of ADDJOB's option ``name`` in a step's words (timeout first), or ``default``."""
    for i, word in enumerate(words[:-1]):
        if isinstance(word, str) and word.upper() == name:
            return int(words[i + 1])
    return default


def _later_options(sig: Signature, what: str, whose: str) -> dict[str, Any]:
    """The send options of a signature added by a worker later (in a chain, or a chord's member):
    its ``delay`` and ``expires`` count from then, its key is the chain's or the chord's."""
    options = dict(sig.options)
    for word in ("delay", "expires"):
        if isinstance(options.get(word), datetime):
            raise ValueError("a chained task is added when the one before it ends: its %s= is seconds from "
                             "then, not a datetime" % word)  # fmt: skip
    options.pop("meta", None)
    if options.pop("dedup", None) is not None:
        raise ValueError("a %s's deduplication key is the %s" % (what, whose))
    return options


def _words(argv: tuple[Any, ...]) -> tuple[Any, ...]:
    return tuple(w.decode() if isinstance(w, bytes) else w for w in argv[3:])


class _Members:
    """A group's members as a chord adds them: each signature's ADDJOB (one delivery more than
    its task's retries: the spare, ``chords.last_run``), its step and the result TTL they share,
    long enough for the last member's check to find the first member's result."""

    def __init__(self, group: "Group", given: bool) -> None:
        if not group.signatures:
            raise ValueError("a chord's group needs at least one signature")
        self.group = group
        self.id = uuid.uuid4().hex
        self.argvs: list[tuple[Any, ...]] = []
        steps: list[tuple[Signature, str, tuple[Any, ...]]] = []
        result_ttl = life = 0
        for sig in group.signatures:
            sig.task.check_arguments((None,) + sig.args if given and not sig.immutable else sig.args, sig.kwargs)
            if given:  # added by a worker, when the step before it ends
                options = _later_options(sig, "chord's member", "chord's (chord:<group ID>:<i>)")
            else:
                options = dict(sig.options)
                options.pop("meta", None)
                if options.pop("dedup", None) is not None:
                    raise ValueError("a chord's member's deduplication key is the chord's (chord:<group ID>:<i>)")
            ttl = options.pop("result_ttl", None)
            ttl = sig.task.effective_result_ttl if ttl is None else int(ttl)
            if ttl <= 0:
                raise ValueError("a chord's member needs a result (result_ttl > 0): its chord reads it")
            retries = options.pop("retries", None)
            retries = sig.task.retries if retries is None else retries
            argv, queue = sig.task.addjob_argv(b"", retries=retries + 1, **options)
            words = _words(argv)
            if _word(words, "RETRY", 1) == 0:
                raise ValueError("a chord's member must be given back when its worker dies (retry > 0)")
            result_ttl = max(result_ttl, ttl)
            # a member may run until its job's TTL, and a little past it (its last RETRY)
            life = max(life, _word(words, "TTL", sig.task.ttl) + _word(words, "RETRY", 0))
            self.argvs.append(argv)
            steps.append((sig, queue, words))
        #: the results' TTL: as long as any member may still run, so the last check finds them all
        self.ttl = min(max(result_ttl, life), MAX_RESULT_TTL)
        #: the result TTL of the values, when they are a chain's last result
        self.final_ttl = result_ttl
        self.runs = member_runs([queue for _, queue, _ in steps])
        self.ids = member_ids(self.id, self.runs)
        # each member's result queue is named in its body: a dead letter sent back (a new job ID)
        # still writes the result its chord reads
        self.results = [ResultSpec(self.ttl, result_queue(job_id)) for job_id in self.ids]
        self.steps = tuple(ChainStep(sig.task.name, queue, sig.args, dict(sig.kwargs), words, result, sig.immutable)
                           for (sig, queue, words), result in zip(steps, self.results))  # fmt: skip

    def step(self) -> GroupStep:
        return GroupStep(self.id, self.steps, self.group.on_error)


def _name(item: "Signature | Group") -> str:
    if isinstance(item, Group):
        return "group(%s)" % ", ".join(sig.task.name for sig in item.signatures)
    return item.task.name


class Chain:
    """Signatures run one after another, each given the previous one's value as its first
    argument: ``(add.s(1, 2) | mul.s(10)).send().result(timeout=5)`` is 30. The worker that
    finishes a task adds the next (``message.ChainSpec``): nothing waits in between. A step may
    be a group: its members run together, each given the value, and the step after it is
    given the list of their values (a chord, :mod:`.chords`)."""

    def __init__(self, app: "App", items: list["Signature | Group"]) -> None:
        for item in items:
            if not isinstance(item, (Signature, Group)):
                raise TypeError("a chain takes signatures (task.s(...)) and groups, not %s" % type(item).__name__)
        if not items:
            raise ValueError("a chain needs at least one signature")
        self.app = app
        self.items = list(items)

    def __len__(self) -> int:
        return len(self.items)

    def __or__(self, other: Any) -> "Chain":
        if isinstance(other, Chain):
            return _chain(self.app, self.items + other.items)
        if isinstance(other, (Signature, Group)):
            return _chain(self.app, self.items + [other])
        return NotImplemented

    def send(self) -> ChainRef:
        items = self.items
        name = " | ".join(_name(item) for item in items)
        groups = {k: _Members(item, given=k > 0) for k, item in enumerate(items) if isinstance(item, Group)}
        last = items[-1]
        if isinstance(last, Group):
            ttl = groups[len(items) - 1].final_ttl
        else:
            given = last.options.get("result_ttl")
            ttl = last.task.effective_result_ttl if given is None else int(given)
            if ttl <= 0:
                raise ValueError("the last task of a chain needs a result (result_ttl > 0): its waiter reads it")
        final = chain_result_queue(uuid.uuid4().hex)
        steps: list[Step] = []
        first = items[0]
        if isinstance(first, Signature):
            first.task.check_arguments(first.args, first.kwargs)
        for k, item in enumerate(items[1:], 1):
            if isinstance(item, Group):
                steps.append(groups[k].step())
                continue
            # the value it is given comes first (an immutable one is given none)
            item.task.check_arguments(item.args if item.immutable else (None,) + item.args, item.kwargs)
            options = _later_options(item, "chained task", "chain's (chain:<previous job ID>)")
            options.pop("result_ttl", None)
            argv, queue = item.task.addjob_argv(b"", **options)
            result = ResultSpec(ttl, final) if k == len(items) - 1 else None
            steps.append(ChainStep(item.task.name, queue, item.args, dict(item.kwargs), _words(argv), result,
                                   item.immutable))  # fmt: skip
        if isinstance(first, Group):
            members = groups[0]
            meta = first.signatures[0].options.get("meta") or {}  # the chain's: its first signature's
            chord = ChordSpec(members.id, members.runs, first.on_error, tuple(steps), final, ttl)
            added = []
            names = [(step.task, step.queue) for step in members.steps]  # traced: each member's send a span
            with sendings(names, active(self.app)) as sends:
                for i, (sig, argv, send) in enumerate(zip(first.signatures, members.argvs, sends)):
                    body = encode(Message(sig.task.name, sig.args, dict(sig.kwargs), members.results[i],
                                          send.meta(meta), None, chord), sig.task.serializer)  # fmt: skip
                    added.append(self.app._addjob((*argv[:2], body, *argv[3:], b"DEDUP", member_key(members.id, i)),
                                                  retry_safe=True))  # fmt: skip
                    send.sent(added[-1])
            if added != members.ids:  # what every member's check derives: a node that makes other IDs
                raise RuntimeError("the nodes gave chord %s's members IDs other than their keys' (%s, not %s): "
                                   "its check could not find them" % (members.id, added, members.ids))  # fmt: skip
            ids: list[Any] = [added]
            key = chord_key(members.id)
        else:
            options = dict(first.options)
            options.pop("result_ttl", None)
            meta = options.pop("meta", None)
            if len(items) == 1:
                message = Message(first.task.name, first.args, dict(first.kwargs), ResultSpec(ttl, final), meta or {})
            else:
                message = Message(first.task.name, first.args, dict(first.kwargs), None, meta or {},
                                  ChainSpec(tuple(steps), final, ttl))  # fmt: skip
            ids = [first.task.add_message(message, options)]  # traced as any send (tasks/tracing.py)
            key = chain_key(ids[0])
        for k, step in enumerate(steps, 1):
            if isinstance(step, GroupStep):
                ids.append(groups[k].ids)
                key = chord_key(step.id)
            else:
                ids.append(dedup_job_id(step.queue.encode(), key.encode(), _word(step.addjob, "RETRY", 1)).decode())
                key = chain_key(ids[-1])
        if isinstance(first, Group):
            refs = [TaskRef.for_job(self.app, job_id, sig.task.name) for job_id, sig in zip(ids[0], first.signatures)]
            return ChordRef(self.app, ids, name, final, GroupRef(refs))
        return ChainRef(self.app, ids, name, final)

    def delay(self) -> ChainRef:
        """Celery's name for :meth:`send`."""
        return self.send()


class Chord(Chain):
    """A group and what runs once every member is done, given their values in order:
    ``(group(add.s(1, 2), add.s(3, 4)) | total.s()).send().result(timeout=5)`` is ``total([3, 7])``.
    The member that finishes last adds the callback, exactly once (:mod:`.chords`); the group's
    ``on_error`` says what a member that failed for good does: ``"fail"`` the chord (the callback
    does not run, the waiter gets a ``ChordError``), or ``"call"`` it with the error in place."""

    def __init__(self, app: "App", items: list["Signature | Group"]) -> None:
        super().__init__(app, items)
        if not isinstance(self.items[0], Group):
            raise TypeError("a chord starts with a group")

    @property
    def group(self) -> "Group":
        return self.items[0]  # type: ignore[return-value]

    def send(self) -> ChordRef:
        ref = super().send()
        assert isinstance(ref, ChordRef)
        return ref

    def delay(self) -> ChordRef:
        """Celery's name for :meth:`send`."""
        return self.send()

    def __call__(self, body: "Signature | Chain | None" = None) -> ChordRef:
        """Celery's ``chord(header)(callback)``: sent, with ``body`` after the group if given."""
        chord = self if body is None else Chord(self.app, [*self.items, *(body.items if isinstance(body, Chain) else [body])])
        return chord.send()


def _chain(app: "App", items: list["Signature | Group"]) -> Chain:
    return Chord(app, items) if items and isinstance(items[0], Group) else Chain(app, items)


class GroupRef:
    """The sent tasks of a group, in order."""

    def __init__(self, refs: list[TaskRef]) -> None:
        self.refs = refs

    @classmethod
    def for_jobs(cls, app: Any, ids: list[str]) -> "GroupRef":
        """The group of these job IDs (got elsewhere: another process, a chain's ``ids``)."""
        return cls([TaskRef.for_job(app, job_id) for job_id in ids])

    @property
    def ids(self) -> list[str]:
        return [r.id for r in self.refs]

    def __len__(self) -> int:
        return len(self.refs)

    def progress(self) -> Progress:
        """How many of the tasks are done (a result, or a dead letter without one), read on every
        node of the cluster: ``Progress(done, total, failed)``, ``str()`` reads ``7/10``. From any
        process (:meth:`for_jobs`); a node that does not answer may hold results not counted."""
        for ref in self.refs:
            if ref.result_queue is None:
                ref.outcome()  # raises NoResult
        if not self.refs:
            return Progress(0, 0)
        return chord_progress(self.refs[0].app.client(), self.ids, [r.result_queue for r in self.refs])  # type: ignore[misc]

    def get(self, timeout: float | None = None, propagate: bool = True) -> list[Any]:
        """Celery's ``GroupResult.get``: :meth:`results` (``propagate=False``: errors in the list)."""
        return self.results(timeout, return_exceptions=not propagate)

    def results(self, timeout: float | None = None, *, return_exceptions: bool = False) -> list[Any]:
        """Every task's value, in order, waited for together (one GETJOB over their result
        queues at a time). The first failed task's :class:`TaskError` is raised, or with
        ``return_exceptions=True`` put in the list in its place. :class:`ResultTimeout` when
        some are missing after ``timeout`` seconds."""
        refs = self.refs
        for ref in refs:
            if ref.result_queue is None:
                ref.outcome()  # raises NoResult
        missing = [r for r in refs if r._outcome is None]
        if missing:
            app = refs[0].app
            got = wait_outcomes(app.client(), [r.result_queue for r in missing], timeout)  # type: ignore[misc]
            for ref in missing:
                outcome = got.get(ref.result_queue)  # type: ignore[arg-type]
                if outcome is not None:
                    ref._outcome = outcome
            late = [r for r in refs if r._outcome is None]
            if late:
                raise ResultTimeout("%d of %d results missing after %s s (first: %s)"
                                    % (len(late), len(refs), timeout, late[0].id))  # fmt: skip
        out = []
        for ref in refs:
            outcome: Outcome = ref._outcome  # type: ignore[assignment]
            try:
                out.append(unwrap(outcome, ref.id))
            except Exception as exc:
                if not return_exceptions:
                    raise
                out.append(exc)
        return out


class Group:
    """Signatures sent together; their results are awaited together. Followed by a task
    (``group(...) | total.s()``) it is a :class:`Chord`; ``on_error`` is what a member that
    failed for good does to it: ``"fail"`` (the default) or ``"call"``."""

    def __init__(self, app: "App", signatures: list[Signature], on_error: str = "fail") -> None:
        for sig in signatures:
            if not isinstance(sig, Signature):
                raise TypeError("a group takes signatures (task.s(...)), not %s" % type(sig).__name__)
        if on_error not in ON_ERROR:
            raise ValueError("on_error must be %s, not %r" % (" or ".join('"%s"' % p for p in ON_ERROR), on_error))
        self.app = app
        self.signatures = signatures
        self.on_error = on_error

    def __len__(self) -> int:
        return len(self.signatures)

    def __or__(self, other: Any) -> "Chord":
        if isinstance(other, Chain):
            return Chord(self.app, [self, *other.items])
        if isinstance(other, (Signature, Group)):
            return Chord(self.app, [self, other])
        return NotImplemented

    def send(self) -> GroupRef:
        for sig in self.signatures:  # every argument checked before anything is sent
            sig.task.check_arguments(sig.args, sig.kwargs)
        return GroupRef([sig.send() for sig in self.signatures])

    def delay(self) -> GroupRef:
        """Celery's name for :meth:`send`."""
        return self.send()


def _app_of(items: tuple[Any, ...]) -> "App":
    for item in items:
        if isinstance(item, Signature):
            return item.task.app
        if isinstance(item, (Group, Chain)):
            return item.app
        if isinstance(item, (list, tuple)):
            return _app_of(tuple(item))
    raise ValueError("give at least one signature (task.s(...))")


def group(*signatures: Any, on_error: str = "fail") -> Group:
    """Celery's ``group(add.s(1, 2), add.s(3, 4))``: the signatures' app's :meth:`App.group`."""
    return _app_of(signatures).group(*signatures, on_error=on_error)


def chain(*items: Any) -> Chain:
    """Celery's ``chain(add.s(1, 2), mul.s(10))``: the signatures' app's :meth:`App.chain`."""
    return _app_of(items).chain(*items)


def chord(header: Any, body: Any = None, *, on_error: str | None = None) -> Chord:
    """Celery's ``chord(header, body)`` (or ``chord(header)(body)``, which sends it): the
    signatures' app's :meth:`App.chord`."""
    return _app_of((header,)).chord(header, body, on_error=on_error)


class App:
    """Tasks, the cluster they run on and what the worker needs to run them.

    ``nodes``: seeds, ``"h:p,h:p"`` or a list (default ``$DISQUE_NODES`` or
    127.0.0.1:7711); ``client_options``: any :class:`disque_py.Client` option
    (``password``, ``username``, ``tls``, ``ssl_ca_certs``...). ``result_ttl``: the
    default seconds a result is kept (0: tasks store no result unless they say so).
    ``serializer``: the default of the tasks (``"json"`` or ``"msgpack"``). ``tracer_provider``:
    the OpenTelemetry provider of the tasks' spans (default: the global one, once set; docs/TASKS.md,
    "Traces").
    """

    def __init__(self, nodes: Any = None, *, result_ttl: int = 600, serializer: str = "json",
                 tracer_provider: Any = None, **client_options: Any) -> None:  # fmt: skip
        if serializer not in SERIALIZERS:
            raise ValueError("serializer must be one of %s" % ", ".join(SERIALIZERS))
        if result_ttl < 0:
            raise ValueError("result_ttl must be >= 0")
        if nodes is None:
            nodes = os.environ.get("DISQUE_NODES") or DEFAULT_NODES
        if isinstance(nodes, str):
            nodes = [s for s in nodes.replace(",", " ").split()]
        self.nodes = list(nodes)
        self.client_options = client_options
        self.result_ttl = int(result_ttl)
        self.serializer = serializer
        self.tasks: dict[str, Task] = {}
        self.periodic_tasks: list[tuple[Task, Any]] = []
        self.before_hooks: list[Hook] = []
        self.after_hooks: list[Hook] = []
        self.failure_hooks: list[Hook] = []
        self.tracer_provider = tracer_provider
        self._tracing: Any = UNSET  # the traces' decision, made on first use (tasks/tracing.py)
        self._local = threading.local()
        self._clients: list[Client] = []
        self._clients_lock = threading.Lock()

    def __repr__(self) -> str:
        return "<App %d task(s) on %s>" % (len(self.tasks), ",".join(map(str, self.nodes)))

    # ------------------------------------------------------------ clients
    def client(self) -> Client:
        """This thread's sync client (one per thread, made on first use)."""
        client = getattr(self._local, "client", None)
        if client is None:
            client = Client(self.nodes, **self.client_options)
            self._local.client = client
            with self._clients_lock:
                self._clients.append(client)
        return client

    def close(self) -> None:
        """Close every client the app made."""
        with self._clients_lock:
            clients, self._clients = self._clients, []
        for client in clients:
            client.close()
        self._local = threading.local()

    def _addjob(self, argv: tuple[Any, ...], retry_safe: bool) -> str:
        blocks = int(argv[3]) / 1000.0
        call = cmd.Call(argv, lambda r: r.decode("ascii"), blocks=blocks, retry_safe=retry_safe)
        return self.client().run(call)

    # ------------------------------------------------------------ registry
    def task(self, fn: Callable[..., Any] | None = None, *, name: str | None = None, queue: str = "default",
             retries: int = 3, backoff: tuple[float, float] | None = (1, 300), timeout: float | None = None,
             result_ttl: int | None = None, ttl: int = 86400, retry: int | None = None,
             replicate: int | None = None, serializer: str | None = None, bind: bool = False,
             rate_limit: Any = None, priority: Any = None, group: Any = None,
             **celery_options: Any) -> Any:  # fmt: skip
        """Register ``fn`` as a task (``@app.task`` or ``@app.task(...)``); see the module docstring.
        ``bind=True``: the function takes its run's :class:`TaskContext` first (Celery's ``self``).
        ``priority=``: its jobs' ADDJOB PRIORITY (0 to 9, the higher first; None: the default, 5).
        ``group=``: its jobs' ADDJOB GROUP (the groups of a queue take turns; GROUP LIMIT bounds
        one cluster-wide). ``rate_limit=`` and Celery's other words are refused, saying what to use."""
        refuse_task_options(rate_limit, celery_options)
        check_priority(priority)  # refused here, before the function is registered
        check_group(group)

        def register(fn: Callable[..., Any]) -> Task:
            if isinstance(fn, Task):
                raise TypeError("%s is a task already" % fn.name)
            task = Task(
                self, fn, name=name or "%s.%s" % (fn.__module__, fn.__qualname__), queue=queue, retries=retries,
                backoff=backoff, timeout=timeout, result_ttl=result_ttl, ttl=ttl, retry=retry,
                replicate=replicate, serializer=serializer or self.serializer, bind=bind, priority=priority,
                group=group,
            )  # fmt: skip
            if task.name in self.tasks:
                raise ValueError("a task named %r is registered already" % task.name)
            self.tasks[task.name] = task
            return task

        return register if fn is None else register(fn)

    def periodic(self, fn: Callable[..., Any] | None = None, *, every: float | None = None, cron: str | None = None,
                 **options: Any) -> Any:  # fmt: skip
        """A task run on a schedule (``every=`` seconds or ``cron=``): registered as
        :meth:`task` (same options) and listed in ``periodic_tasks`` for the schedulers. A slot's
        job keeps no result unless ``result_ttl`` is given here (the app's default does not
        count: nobody waits for a slot's result); sent by hand, the task keeps one as any task."""
        from .cron import Schedule

        if (every is None) == (cron is None):
            raise ValueError("give exactly one of every= and cron=")
        schedule = Schedule.every(every) if every is not None else Schedule.cron(cron)  # type: ignore[arg-type]

        def register(fn: Callable[..., Any]) -> Task:
            task = self.task(**options)(fn)
            self.periodic_tasks.append((task, schedule))
            return task

        return register if fn is None else register(fn)

    def queues(self) -> list[str]:
        """The queues of the app's tasks, sorted."""
        return sorted({t.queue for t in self.tasks.values()})

    # ------------------------------------------------------------ hooks
    def before_task(self, fn: Hook) -> Hook:
        """``fn(ctx)`` before each task runs (in the task's thread, or the trio thread for
        ``async def`` tasks); raising fails the task."""
        self.before_hooks.append(fn)
        return fn

    def after_task(self, fn: Hook) -> Hook:
        """``fn(ctx)`` after each task that succeeded (``ctx.result`` is its value)."""
        self.after_hooks.append(fn)
        return fn

    def on_failure(self, fn: Hook) -> Hook:
        """``fn(ctx)`` after each failed run (``ctx.error``; ``ctx.final``: no retry follows)."""
        self.failure_hooks.append(fn)
        return fn

    # ------------------------------------------------------------ groups
    def group(self, *signatures: Signature, on_error: str = "fail") -> Group:
        """``app.group(add.s(1, 2), add.s(3, 4)).send().results(timeout=5)``; followed by a task
        it is a chord, and ``on_error`` (``"fail"`` or ``"call"``) its policy for a member that failed."""
        if len(signatures) == 1 and isinstance(signatures[0], (list, tuple)):
            signatures = tuple(signatures[0])
        return Group(self, list(signatures), on_error)

    def chain(self, *items: Any) -> Chain:
        """``app.chain(add.s(1, 2), mul.s(10))``, the same as ``add.s(1, 2) | mul.s(10)`` (groups too)."""
        if len(items) == 1 and isinstance(items[0], (list, tuple)):
            items = tuple(items[0])
        return _chain(self, list(items))

    def chord(self, header: Any, body: Any = None, *, on_error: str | None = None) -> Chord:
        """``app.chord([add.s(1, 2), add.s(3, 4)], total.s())``, the same as ``group(...) | total.s()``:
        ``header`` a :class:`Group` or signatures, ``body`` a signature or a chain (None: given
        later, ``chord(header)(body)`` as Celery's, or the values are the result), ``on_error``
        the group's policy for a member that failed for good (``"fail"`` or ``"call"``)."""
        if isinstance(header, Group):
            group = Group(self, header.signatures, on_error or header.on_error)
        else:
            group = self.group(*(header if isinstance(header, (list, tuple)) else (header,)), on_error=on_error or "fail")
        return Chord(self, [group]) if body is None else group | body
