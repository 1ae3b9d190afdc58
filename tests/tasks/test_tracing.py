"""Traces (tasks/tracing.py) on a real node and a real worker (in a thread of the test process, so
that both sides export to the SDK's in-memory exporter here): a send, its runs and a chain's next
steps as spans of one trace; failures and retries; bodies from elsewhere continued, hostile ones
ignored; and, without a provider or without opentelemetry, bodies with no trace field (those in
fresh interpreters: the global provider is set once per process)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import uuid
from pathlib import Path

import pytest
from opentelemetry import trace
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind, StatusCode

from disque_py.tasks import App, TaskError, TaskRef
from disque_py.tasks import tracing
from tests.client.conftest import ROOT

from .conftest import addr, raw, wait_for

TRACE_ID = "4bf92f3577b34da6a3ce929d0e0e4736"
PARENT_ID = "00f067aa0ba902b7"


@pytest.fixture
def exporter():
    return InMemorySpanExporter()


@pytest.fixture
def app(node, exporter):
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    a = App(addr(node), result_ttl=60, tracer_provider=provider)
    yield a
    a.close()
    provider.shutdown()


def spans_named(exporter, count: int, *names: str) -> dict[str, list]:
    """Wait for ``count`` finished spans of these names (a run's ends after its result is written);
    {name: [span, ...]} in the order they ended."""

    def ready():
        got = [s for s in exporter.get_finished_spans() if s.name in names]
        return got if len(got) >= count else None

    got = wait_for(ready, what="%d spans named %s" % (count, ", ".join(names)))
    out: dict[str, list] = {name: [] for name in names}
    for s in got:
        out[s.name].append(s)
    return out


def body_of(node, job_id: str) -> dict:
    fields = raw(node).execute_command("SHOW", job_id)
    show = {fields[i].decode(): fields[i + 1] for i in range(0, len(fields), 2)}
    return json.loads(show["body"])


def test_a_chain_is_one_trace_of_sends_and_runs(app, exporter, run_worker):
    q = "tr-" + uuid.uuid4().hex[:8]
    inner = app.tracer_provider.get_tracer("test")

    @app.task(queue=q, name="add")
    def add(a, b):
        with inner.start_as_current_span("inside add"):  # the task's own span, under its run's
            return a + b

    @app.task(queue=q, name="mul")
    async def mul(a, b):
        return a * b

    running = run_worker(app, concurrency=2)
    with inner.start_as_current_span("request") as request:  # the producer's own work
        ref = (add.s(1, 2) | mul.s(10)).send()
    assert ref.result(timeout=10) == 30
    got = spans_named(exporter, 5, "send add", "run add", "inside add", "send mul", "run mul")
    (send_add,), (run_add,), (inside,), (send_mul,), (run_mul,) = got.values()
    # one trace, each span the child of the one before it
    chain = [request, send_add, run_add, send_mul, run_mul]
    assert {s.context.trace_id for s in chain + [inside]} == {request.context.trace_id}
    for parent, child in zip(chain, chain[1:]):
        assert child.parent.span_id == parent.context.span_id, child.name
    assert inside.parent.span_id == run_add.context.span_id
    assert run_add.parent.is_remote and run_mul.parent.is_remote  # continued from the bodies
    assert [s.kind for s in chain[1:]] == [SpanKind.PRODUCER, SpanKind.CONSUMER] * 2
    # the messaging attributes, the job IDs the producer knows beforehand among them
    assert dict(send_add.attributes) == {
        "messaging.system": "disque", "messaging.operation.type": "send", "messaging.operation.name": "send",
        "messaging.destination.name": q, "messaging.disque.task.name": "add", "messaging.message.id": ref.ids[0],
    }  # fmt: skip
    assert dict(run_add.attributes) == {
        "messaging.system": "disque", "messaging.operation.type": "process", "messaging.operation.name": "run",
        "messaging.destination.name": q, "messaging.disque.task.name": "add", "messaging.message.id": ref.ids[0],
        "messaging.disque.message.delivery_attempt": 1, "messaging.client.id": running.worker.id,
    }  # fmt: skip
    assert send_mul.attributes["messaging.message.id"] == run_mul.attributes["messaging.message.id"] == ref.ids[1]
    assert all(s.status.status_code is StatusCode.UNSET for s in chain[1:])


def test_each_member_of_a_group_is_a_send_of_the_trace(app, exporter, run_worker):
    q = "tr-" + uuid.uuid4().hex[:8]
    inner = app.tracer_provider.get_tracer("test")

    @app.task(queue=q, name="inc")
    def inc(a, b=0):
        return a + b

    @app.task(queue=q, name="total")
    def total(values):
        return sum(values)

    run_worker(app, concurrency=4)
    # the producer's: a chord's members, each a send span under the producer's own
    with inner.start_as_current_span("request") as request:
        ref = (app.group(inc.s(1, 1), inc.s(2, 2)) | total.s()).send()
    assert ref.result(timeout=10) == 6
    spans_named(exporter, 3, "run inc", "run total")  # the runs end last (one or two "send total" before)
    got = spans_named(exporter, 6, "send inc", "run inc", "send total", "run total")
    sends, runs = got["send inc"], got["run inc"]
    assert len(sends) == 2 and {s.parent.span_id for s in sends} == {request.context.span_id}
    assert sorted(s.attributes["messaging.message.id"] for s in sends) == sorted(ref.ids[0])
    by_id = {s.attributes["messaging.message.id"]: s for s in sends}
    for run in runs:  # each run under its own member's send
        assert run.parent.span_id == by_id[run.attributes["messaging.message.id"]].context.span_id
    # from the member that ended last (or both, ending at once: the callback's key adds it once)
    sends_total, (run_total,) = got["send total"], got["run total"]
    assert {s.parent.span_id for s in sends_total} <= {r.context.span_id for r in runs}
    assert run_total.parent.span_id in {s.context.span_id for s in sends_total}
    assert {s.context.trace_id for s in sends + runs + sends_total + [run_total]} == {request.context.trace_id}
    exporter.clear()
    # a worker's: a group after a task, each member a send span under that task's run
    ref = (inc.s(1, 2) | app.group(inc.s(10), inc.s(20)) | total.s()).send()
    assert ref.result(timeout=10) == 36
    got = spans_named(exporter, 6, "send inc", "run inc")
    (first,) = [s for s in got["send inc"] if s.attributes["messaging.message.id"] == ref.ids[0]]
    (run_first,) = [r for r in got["run inc"] if r.parent.span_id == first.context.span_id]
    members = [s for s in got["send inc"] if s is not first]
    assert len(members) == 2 and {s.parent.span_id for s in members} == {run_first.context.span_id}
    assert sorted(s.attributes["messaging.message.id"] for s in members) == sorted(ref.ids[1])
    assert members[0].context.span_id != members[1].context.span_id
    assert [s.kind for s in members] == [SpanKind.PRODUCER] * 2


def test_a_failure_is_an_error_span_and_a_retry_a_second_run_of_the_same_send(app, exporter, run_worker):
    q = "tr-" + uuid.uuid4().hex[:8]

    @app.task(queue=q, name="flaky", retries=1, backoff=(0.05, 0.1), bind=True)
    def flaky(ctx, x):
        if ctx.attempt == 1:
            raise ValueError("not yet")
        return x

    @app.task(queue=q, name="hopeless", retries=0)
    def hopeless():
        raise KeyError("never")

    run_worker(app)
    ref = flaky.send(7)
    assert ref.result(timeout=10) == 7
    got = spans_named(exporter, 3, "send flaky", "run flaky")
    (send,), runs = got["send flaky"], got["run flaky"]
    assert [r.attributes["messaging.disque.message.delivery_attempt"] for r in runs] == [1, 2]
    assert {r.parent.span_id for r in runs} == {send.context.span_id}  # both under the one send
    assert {r.context.trace_id for r in runs} == {send.context.trace_id}
    first, second = runs
    assert first.status.status_code is StatusCode.ERROR and first.status.description == "ValueError: not yet"
    assert first.attributes["error.type"] == "ValueError"
    (event,) = first.events
    assert event.name == "exception"
    assert (event.attributes["exception.type"], event.attributes["exception.message"]) == ("ValueError", "not yet")
    assert "raise ValueError" in event.attributes["exception.stacktrace"]
    assert second.status.status_code is StatusCode.UNSET and not second.events

    with pytest.raises(TaskError, match="KeyError"):
        hopeless.send().result(timeout=10)
    (run,) = spans_named(exporter, 1, "run hopeless")["run hopeless"]
    assert run.status.status_code is StatusCode.ERROR and run.events[0].attributes["exception.type"] == "KeyError"


def test_a_body_from_another_language_is_continued_and_a_hostile_one_starts_a_trace(app, node, exporter, run_worker):
    q = "tr-" + uuid.uuid4().hex[:8]

    @app.task(queue=q, name="echo")
    def echo(x):
        return x

    run_worker(app)
    r = raw(node)
    traceparent = "00-%s-%s-01" % (TRACE_ID, PARENT_ID)
    body = {"task": "echo", "args": ["hi"], "result": {"ttl": 60},
            "meta": {"traceparent": traceparent, "tracestate": "vendor=opaque", "k": 1}}  # fmt: skip
    job_id = r.execute_command("ADDJOB", q, json.dumps(body), 0).decode()
    assert TaskRef.for_job(app, job_id).result(timeout=10) == "hi"
    (run,) = spans_named(exporter, 1, "run echo")["run echo"]
    assert format(run.context.trace_id, "032x") == TRACE_ID
    assert format(run.parent.span_id, "016x") == PARENT_ID and run.parent.is_remote
    assert run.context.trace_state.get("vendor") == "opaque"

    hostile = [123, "garbage", "00-%s-%s-01" % ("0" * 32, PARENT_ID), "00-" + "a" * 100000, ["x"], {"a": 1}, None]
    ids = []
    for value in hostile:
        meta = {"traceparent": value, "tracestate": value}
        ids.append(r.execute_command("ADDJOB", q, json.dumps({"task": "echo", "args": [1], "result": {"ttl": 60},
                                                              "meta": meta}), 0).decode())  # fmt: skip
    for job_id in ids:
        assert TaskRef.for_job(app, job_id).result(timeout=10) == 1  # the run is not failed by it
    runs = spans_named(exporter, 1 + len(hostile), "run echo")["run echo"][1:]
    assert all(s.parent is None for s in runs), [s.parent for s in runs]  # each one a trace of its own
    assert len({s.context.trace_id for s in runs}) == len(hostile)
    # a body that is no task message: dead-lettered as without traces, no span to name after it
    spans_before = len(exporter.get_finished_spans())
    r.execute_command("ADDJOB", q, b"\x00 not a task", 0)
    wait_for(lambda: r.execute_command("QLEN", q + ".dead") == 1, what="the bad body dead-lettered")
    assert TaskRef.for_job(app, r.execute_command("ADDJOB", q, json.dumps({"task": "echo", "args": [2], "result": {
        "ttl": 60}}), 0).decode()).result(timeout=10) == 2  # the worker goes on
    spans_named(exporter, 1 + len(hostile) + 1, "run echo")  # its run's span ends after its result is written
    assert len(exporter.get_finished_spans()) == spans_before + 1  # that one alone


def test_without_a_provider_a_body_has_no_trace_field(node, exporter):
    assert trace.get_tracer_provider().__class__ is trace.ProxyTracerProvider  # none set in this process
    q = "tr-" + uuid.uuid4().hex[:8]
    for app in (App(addr(node)), App(addr(node), tracer_provider=trace.NoOpTracerProvider())):
        task = app.task(name="t", queue=q)(lambda: None)
        plain = task.send()
        with_meta = task.send_with(meta={"k": 1})
        assert "meta" not in body_of(node, plain.id)
        assert body_of(node, with_meta.id)["meta"] == {"k": 1}
        chain = (task.s() | task.si()).send()
        assert "meta" not in body_of(node, chain.ids[0])
        app.close()
        # waiting for a global provider (one attribute read a send), or off for good with a no-op one
        assert app._tracing is (tracing.WAITING if app.tracer_provider is None else None)


SCRIPT = """
import json, sys
from disque_py.tasks import App

refused = getattr(sys.modules.get("sitecustomize"), "REFUSED", [])
app = App(sys.argv[1], result_ttl=0)
task = app.task(name="t", queue=sys.argv[2])(lambda: None)
attempts = len(refused)  # redis-py tries too, when it is imported
out = {"before": [task.send().id, task.send().id, task.send().id]}
out["import_attempts"] = len(refused) - attempts
try:
    from opentelemetry import trace
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
except ImportError:
    pass
else:  # a provider set after the app's first sends: taken from the next one on
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    trace.set_tracer_provider(provider)
    out["after"] = task.send().id
    out["spans"] = [[s.name, format(s.context.span_id, "016x")] for s in exporter.get_finished_spans()]
print(json.dumps(out))
"""

BLOCKER = """
import sys

REFUSED = []


class _NotInstalled:
    def find_spec(self, name, path=None, target=None):
        if name.partition(".")[0] == "opentelemetry":
            REFUSED.append(name)
            raise ModuleNotFoundError("No module named %r (refused by the test)" % name, name=name)
        return None


sys.meta_path.insert(0, _NotInstalled())
"""


def run_script(node, q: str, tmp_path: Path, blocked: bool) -> dict:
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    env.pop("OTEL_PYTHON_TRACER_PROVIDER", None)
    if blocked:
        (tmp_path / "sitecustomize.py").write_text(BLOCKER)
        env["PYTHONPATH"] = os.pathsep.join([str(tmp_path), str(ROOT)])
    out = subprocess.run([sys.executable, "-c", SCRIPT, addr(node), q], env=env, capture_output=True, text=True,
                         timeout=60, cwd=str(ROOT))  # fmt: skip
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout.strip().splitlines()[-1])


def test_a_global_provider_set_after_the_first_sends_is_taken_from_the_next(node, tmp_path):
    q = "tr-" + uuid.uuid4().hex[:8]
    got = run_script(node, q, tmp_path, blocked=False)
    assert all("meta" not in body_of(node, job_id) for job_id in got["before"])
    (name, span_id), = got["spans"]
    assert name == "send t"
    assert body_of(node, got["after"])["meta"]["traceparent"].split("-")[2] == span_id


def test_without_opentelemetry_the_import_is_tried_once_and_bodies_have_no_trace_field(node, tmp_path):
    q = "tr-" + uuid.uuid4().hex[:8]
    got = run_script(node, q, tmp_path, blocked=True)
    assert got["import_attempts"] == 1  # by the app's first send, never again
    assert all("meta" not in body_of(node, job_id) for job_id in got["before"])


def test_the_sending_helper_outside_a_traced_run_hands_the_meta_back():
    meta = {"traceparent": "x"}
    with tracing.sending("t", "q") as send:
        assert send.meta(meta) is meta
        send.sent("D-1")
    assert send is tracing.UNTRACED
