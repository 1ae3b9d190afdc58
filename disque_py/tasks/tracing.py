"""Traces: a task's send, each of its runs and a chain's next tasks as OpenTelemetry spans of one trace.

With the ``otel`` extra (``pip install 'disque-py[otel]'``: opentelemetry-api) and a tracer provider
(``opentelemetry.trace.set_tracer_provider(...)``, or ``App(tracer_provider=...)``):

* ``send <task>`` (PRODUCER) around each ADDJOB of a task's job: the producer's sends (``send()``,
  ``delay()``, ``apply_async()``, a group's, a chain's or a chord's first task or group; the sync
  client) and a worker's (a chain's next task, a chord's callback, on the worker's trio client),
  ``messaging.message.id`` the job's ID; a group's members each in a span of its own, siblings
  under the same parent (:func:`sendings`);
* ``run <task>`` (CONSUMER) around each run in the worker: a child of the send's span, so that a
  retry is a second ``run`` span under the same ``send``; a failed run has the status ERROR and the
  exception recorded (the ``exception`` event).

The send's context rides in the job: W3C Trace Context's ``traceparent`` (and ``tracestate``) in
the body's ``meta`` (:mod:`.message`; docs/TASKS.md, "The job body, for other languages"), so a
producer in another language that writes them there is continued too. A chain's next task (and
a chord's callback) is sent from its run, in a ``send`` span under it: :func:`sending` is the one
helper the code that builds such a body calls.

Off, it costs nothing: :func:`active` is the one check the send and run paths make, on a decision
cached in the app: off for good when opentelemetry cannot be imported (one attempt per process)
or the provider is a no-op; on for good once a provider is set; until a global provider is set,
one attribute read (a provider set after the app was made is taken from its next send or run).
Off, a body carries no trace field.

The only module of disque_py that imports opentelemetry, and only when first asked
(tests/test_contracts.py).
"""

from __future__ import annotations

import contextvars
import dataclasses
from collections.abc import Callable, Iterator
from contextlib import contextmanager, nullcontext
from typing import Any

from .. import __version__
from ..client.worker import describe_error
from .message import Message, MessageError, decode

__all__ = ["Tracing", "active", "available", "sending", "sendings", "UNSET", "TRACE_FIELDS", "SYSTEM"]

#: an app's tracing before its first check (App._tracing)
UNSET: Any = object()
#: the fields of a body's ``meta`` that carry the trace context (W3C Trace Context's names)
TRACE_FIELDS = ("traceparent", "tracestate")
#: the longest value of either read from a body: W3C's traceparent is 55 characters, a
#: tracestate at most 32 members of 256; anything longer is no context
MAX_FIELD = 8192
SYSTEM = "disque"
TRACER_NAME = "disque_py.tasks"

# OpenTelemetry's messaging attributes (semantic conventions 1.27+), and ours under messaging.disque.*
A_SYSTEM = "messaging.system"
A_OPERATION_TYPE = "messaging.operation.type"
A_OPERATION_NAME = "messaging.operation.name"
A_DESTINATION = "messaging.destination.name"
A_MESSAGE_ID = "messaging.message.id"
A_CLIENT_ID = "messaging.client.id"
A_TASK = "messaging.disque.task.name"
A_ATTEMPT = "messaging.disque.message.delivery_attempt"
A_ERROR_TYPE = "error.type"


class _Otel:
    """The parts of opentelemetry-api used here, imported once."""

    def __init__(self) -> None:
        from opentelemetry import context, trace
        from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

        self.trace = trace
        self.Context = context.Context
        self.w3c = TraceContextTextMapPropagator()  # the documented fields, whatever the global propagator
        self.PRODUCER = trace.SpanKind.PRODUCER
        self.CONSUMER = trace.SpanKind.CONSUMER
        self.ERROR = trace.StatusCode.ERROR
        self.Status = trace.Status


_otel: Any = None  # an _Otel once imported; False: opentelemetry is not importable (never tried again)
_MISSING = object()
#: an app's tracing while it waits for the global provider (the API's module holds it as
#: _TRACER_PROVIDER, None until set: read directly, its getter looks up the environment each call)
WAITING: Any = object()


def _import() -> _Otel | None:
    global _otel
    if _otel is None:
        try:
            _otel = _Otel()
        except ImportError:
            _otel = False
    return _otel or None


def available() -> bool:
    """Whether opentelemetry can be imported here (imported on the first ask, tried once)."""
    return _import() is not None


def active(app: Any) -> "Tracing | None":
    """The app's :class:`Tracing`, or None when traces are off: the one check of the send and
    run paths (see the module docstring)."""
    state = app._tracing
    if state is WAITING:
        if _otel.trace._TRACER_PROVIDER is None:
            return None
        return _settle(app)
    if state is UNSET:
        return _settle(app)
    return state


def _settle(app: Any) -> "Tracing | None":
    otel = _import()
    if otel is None:
        app._tracing = None
        return None
    provider = app.tracer_provider
    if provider is None or isinstance(provider, otel.trace.ProxyTracerProvider):
        # the global one; the getter sets one named by OTEL_PYTHON_TRACER_PROVIDER
        provider = otel.trace.get_tracer_provider()
        if isinstance(provider, otel.trace.ProxyTracerProvider):  # none set yet
            # asked again at the next send or run: by WAITING's one read, or the getter again
            # should a later API keep its global under another name
            app._tracing = WAITING if getattr(otel.trace, "_TRACER_PROVIDER", _MISSING) is None else UNSET
            return None
    tracer = provider.get_tracer(TRACER_NAME, __version__)
    if isinstance(tracer, otel.trace.NoOpTracer):  # the API's no-op provider, or a disabled SDK
        app._tracing = None
        return None
    app._tracing = Tracing(otel, tracer)
    return app._tracing


#: the Tracing of the run in progress (set by Tracing.run): what :func:`sending` continues
_run_tracing: contextvars.ContextVar["Tracing | None"] = contextvars.ContextVar("disque_py_tracing", default=None)


class _Untraced:
    """:func:`sending` outside a traced run: the body's meta as it is, nothing recorded."""

    __slots__ = ()

    def __enter__(self) -> "_Untraced":
        return self

    def __exit__(self, *exc: Any) -> None:
        return None

    def meta(self, meta: dict[str, Any]) -> dict[str, Any]:
        return meta

    def sent(self, job_id: str) -> None:
        return None


UNTRACED = _Untraced()


def sending(task_name: str, queue: str) -> Any:
    """A send from a run (a chain's next task, a chord's callback), for the code that builds its
    body::

        with tracing.sending(step.task, step.queue) as send:
            body = encode(Message(..., meta=send.meta(message.meta), ...))
            send.sent(await client.add_job(step.queue, body, ...))

    In a traced run: a ``send`` span under the run's, ``send.meta(meta)`` a copy of ``meta`` with
    its context (the previous send's replaced). Otherwise a shared no-op that hands ``meta`` back
    as it is (one context variable read)."""
    traced = _run_tracing.get()
    return UNTRACED if traced is None else traced.sending(task_name, queue)


def sendings(names: list[tuple[str, str]], traced: "Tracing | None" = None) -> Any:
    """:func:`sending` for several jobs added together (a group's members, each ``(task name,
    queue)``): a context manager giving one ``send`` per job, each traced one a span of its own
    under the current one (siblings, not one inside the other). ``traced``: the producer's app's
    (``active(app)``); by default, the run's."""
    traced = traced or _run_tracing.get()
    return nullcontext([UNTRACED] * len(names)) if traced is None else traced.sendings(names)


class _Send:
    """The body's side of a ``send`` span."""

    __slots__ = ("otel", "span")

    def __init__(self, otel: _Otel, span: Any) -> None:
        self.otel = otel
        self.span = span

    def meta(self, meta: dict[str, Any]) -> dict[str, Any]:
        """A copy of ``meta`` with this span's context (W3C traceparent, tracestate when there is one)."""
        out = {k: v for k, v in meta.items() if k not in TRACE_FIELDS}
        self.otel.w3c.inject(out, context=self.otel.trace.set_span_in_context(self.span))
        return out

    def sent(self, job_id: str) -> None:
        self.span.set_attribute(A_MESSAGE_ID, job_id)


def _send_attributes(task_name: str, queue: str) -> dict[str, Any]:
    return {A_SYSTEM: SYSTEM, A_OPERATION_TYPE: "send", A_OPERATION_NAME: "send", A_DESTINATION: queue,
            A_TASK: task_name}  # fmt: skip


def _failed(otel: _Otel, span: Any, exc: BaseException) -> None:
    span.record_exception(exc)
    span.set_attribute(A_ERROR_TYPE, type(exc).__qualname__)
    span.set_status(otel.Status(otel.ERROR, describe_error(exc)))


class Tracing:
    """An app's spans, once a provider is set (:func:`active`)."""

    __slots__ = ("otel", "tracer")

    def __init__(self, otel: _Otel, tracer: Any) -> None:
        self.otel = otel
        self.tracer = tracer

    @contextmanager
    def sending(self, task_name: str, queue: str) -> Iterator[_Send]:
        """A ``send <task>`` span, current while the body is built and added (see :func:`sending`)."""
        with self.tracer.start_as_current_span("send " + task_name, kind=self.otel.PRODUCER,
                                               attributes=_send_attributes(task_name, queue),
                                               record_exception=False, set_status_on_exception=False) as span:  # fmt: skip
            try:
                yield _Send(self.otel, span)
            except Exception as exc:
                _failed(self.otel, span, exc)
                raise

    @contextmanager
    def sendings(self, names: list[tuple[str, str]]) -> Iterator[list[_Send]]:
        """A ``send <task>`` span for each ``(task name, queue)``, all children of the current
        context (a group's members: see :func:`sendings`), ended together."""
        otel = self.otel
        spans = [self.tracer.start_span("send " + task_name, kind=otel.PRODUCER,
                                        attributes=_send_attributes(task_name, queue), record_exception=False,
                                        set_status_on_exception=False)
                 for task_name, queue in names]  # fmt: skip
        try:
            yield [_Send(otel, span) for span in spans]
        except Exception as exc:
            for span in spans:
                _failed(otel, span, exc)
            raise
        finally:
            for span in spans:
                span.end()

    def send(self, task_name: str, queue: str, message: Message, add: Callable[[Message], str]) -> str:
        """The producer's send: ``add(message)`` (the ADDJOB, its job ID) in a ``send`` span whose
        context ``message``'s meta carries."""
        with self.sending(task_name, queue) as send:
            job_id = add(dataclasses.replace(message, meta=send.meta(message.meta)))
            send.sent(job_id)
        return job_id

    def parent(self, meta: dict[str, Any]) -> Any:
        """The context a body's ``meta`` carries (W3C's fields, strings of sane length), or an empty
        one: the run starts a trace. Anything else, or a malformed value, is no context."""
        empty = self.otel.Context()
        carrier = {}
        for key in TRACE_FIELDS:
            value = meta.get(key)
            if isinstance(value, str) and len(value) <= MAX_FIELD:
                carrier[key] = value
        if "traceparent" not in carrier:
            return empty
        try:
            return self.otel.w3c.extract(carrier, context=empty)
        except Exception:  # noqa: BLE001 - a hostile value never fails the run
            return empty

    async def run(self, job: Any, handle: Callable[[Any], Any], worker: Any) -> None:
        """The worker's ``handle(job)`` in a ``run <task>`` span, a child of the context the body
        carries; the run's :func:`sending` continues it."""
        try:
            message, _ = decode(job.body)
        except MessageError:
            return await handle(job)  # no task to name a span after: the handler rejects the job
        attributes = {A_SYSTEM: SYSTEM, A_OPERATION_TYPE: "process", A_OPERATION_NAME: "run",
                      A_DESTINATION: job.queue, A_MESSAGE_ID: job.id, A_TASK: message.task, A_ATTEMPT: job.attempt}  # fmt: skip
        worker_id = getattr(worker, "id", None)
        if worker_id:
            attributes[A_CLIENT_ID] = worker_id
        with self.tracer.start_as_current_span("run " + message.task, context=self.parent(message.meta),
                                               kind=self.otel.CONSUMER, attributes=attributes,
                                               record_exception=False, set_status_on_exception=False) as span:  # fmt: skip
            token = _run_tracing.set(self)
            try:
                await handle(job)
            except Exception as exc:
                _failed(self.otel, span, exc)
                raise
            finally:
                _run_tracing.reset(token)
