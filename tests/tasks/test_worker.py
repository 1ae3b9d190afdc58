"""Tasks end to end on one real node, with the worker in a thread of the test process:
results, errors, retries through MAXDELIVER/BACKOFF, dead letters with their reason,
rejects (bad bodies, unknown tasks, wrong arguments), time limits, hooks, groups,
msgpack, a producer that speaks only RESP, metrics."""

from __future__ import annotations

import json
import logging
import re
import subprocess
import threading
import time
import urllib.request
import uuid

import msgpack
import pytest
import trio

from disque_py.tasks import App, NoResult, ResultTimeout, TaskError, TaskRef, current_task
from disque_py.tasks.runner import serve_metrics
from tests.integration.conftest import free_port

from . import tracing
from .conftest import addr, raw, wait_for
from .tracing import ERROR_LINE, FAILING_LINE, fail_for_good, failing_app, running_worker


def dead_letters(node, queue: str, count: int, timeout: float = 10.0) -> list[dict]:
    """Wait for ``count`` dead letters in ``queue``.dead; their SHOW maps."""
    r = raw(node)

    def ready():
        return r.execute_command("QLEN", queue + ".dead") >= count

    wait_for(ready, timeout=timeout, what="%d dead letter(s) in %s.dead" % (count, queue))
    out = []
    for job in r.execute_command("QPEEK", queue + ".dead", count):
        fields = r.execute_command("SHOW", job[1])
        out.append({fields[i].decode(): fields[i + 1] for i in range(0, len(fields), 2)})
    return out


@pytest.fixture
def app(node):
    a = App(addr(node), result_ttl=60)
    yield a
    a.close()


def test_send_result_error_and_group(app, run_worker):
    q = "t-" + uuid.uuid4().hex[:8]

    @app.task(queue=q, retries=0)
    def add(a, b):
        return a + b

    @app.task(queue=q, retries=0, name="boom")
    def boom(text):
        raise ValueError(text)

    @app.task(queue=q, serializer="msgpack")
    async def double(x):
        await trio.sleep(0)
        return {"x": x * 2, "raw": b"\x00\x01"}

    run_worker(app, concurrency=4)
    ref = add.send(1, 2)
    assert ref.result(timeout=10) == 3
    assert ref.result(timeout=0) == 3  # kept by the ref
    assert TaskRef.for_job(app, ref.id, "add").result(timeout=5) == 3  # any other waiter reads it too
    with pytest.raises(TaskError) as err:
        boom.send("no luck").result(timeout=10)
    assert (err.value.type, err.value.message, str(err.value)) == ("ValueError", "no luck", "ValueError: no luck")
    assert double.send(21).result(timeout=10) == {"x": 42, "raw": b"\x00\x01"}
    g = app.group(add.s(1, 2), add.s(3, 4), boom.s("bad"), add.s(5, 6)).send()
    assert len(g) == 4
    with pytest.raises(TaskError, match="ValueError: bad"):
        g.results(timeout=10)
    values = g.results(timeout=0, return_exceptions=True)
    assert values[:2] == [3, 7] and values[3] == 11 and isinstance(values[2], TaskError)
    with pytest.raises(NoResult, match=r"was sent without a result \(result_ttl=0\)"):
        add.send_with(args=(1, 1), result_ttl=0).result(timeout=1)


def test_a_result_read_is_left_for_every_other_waiter_on_any_node(cluster3, run_worker):
    q = "t-" + uuid.uuid4().hex[:8]
    here, there = App(addr(cluster3[0]), result_ttl=60), App(addr(cluster3[1]), result_ttl=60)
    try:

        @here.task(queue=q, retries=0, name="inc")
        def inc(x):
            return x + 1

        run_worker(here, concurrency=2)
        ref = inc.send(1)
        assert ref.result(timeout=10) == 2
        results = raw(cluster3[0])
        queue = ref.result_queue
        assert queue == "@result:" + ref.id  # the cluster's own queue (left out of QSCAN unless ALL)
        assert results.execute_command("QLEN", queue) == 1  # read where it is (QPEEK): not taken
        # another node holds no queued copy: its waiter's GETJOB fetches it (and puts it back there)
        assert raw(cluster3[1]).execute_command("QLEN", queue) == 0
        assert TaskRef.for_job(there, ref.id).result(timeout=10) == 2
        # a result held by a waiter (taken, not yet put back) is waited for, not missed. The waiter
        # put it back where it read it, and federation may since have moved it to a node where a
        # client waits: taken from wherever it is queued now
        holder = wait_for(lambda: next((k + 1 for k, n in enumerate(cluster3)
                                        if raw(n).execute_command("QLEN", queue) == 1), None),
                          timeout=10, what="the result queued on one node") - 1  # fmt: skip
        other = raw(cluster3[holder])
        held = other.execute_command("GETJOB", "NOHANG", "FROM", queue)
        assert held, "the result is queued where QLEN said"
        threading.Timer(0.3, other.execute_command, ("ENQUEUE", held[0][1])).start()
        assert TaskRef.for_job(there, ref.id).result(timeout=10) == 2
        holder = wait_for(lambda: next((k + 1 for k, n in enumerate(cluster3)
                                        if raw(n).execute_command("QLEN", queue) == 1), None),
                          timeout=10, what="the result queued again on one node") - 1  # fmt: skip
        # a waiter on every other node reads it where it is held (QPEEK there), not moved by federation
        apps = []
        try:
            for k in range(3):
                if k != holder:
                    apps.append(App(addr(cluster3[k]), result_ttl=60))
                    assert TaskRef.for_job(apps[-1], ref.id).result(timeout=10) == 2
                    assert raw(cluster3[holder]).execute_command("QLEN", queue) == 1
        finally:
            for app in apps:
                app.close()
    finally:
        here.close()
        there.close()


def test_chains_pass_each_value_on_and_stop_at_the_first_failure(app, node, run_worker):
    q = "t-" + uuid.uuid4().hex[:8]
    seen = []

    @app.task(queue=q)
    def add(a, b):
        seen.append(("add", current_task().job_id))
        return a + b

    @app.task(queue=q + "-other", retry=60)
    def mul(a, b):
        seen.append(("mul", current_task().job_id))
        return a * b

    @app.task(queue=q, retries=0)
    def boom(x):
        raise ValueError("no %s" % x)

    run_worker(app, concurrency=2, queues=[q, q + "-other"])
    ref = (add.s(1, 2) | mul.s(10) | add.s(5)).send()
    assert ref.result(timeout=10) == 35
    assert len(ref.ids) == 3 and ref.id == ref.ids[0]
    # each task ran once, as the job the chain's ref named beforehand
    assert seen == [("add", ref.ids[0]), ("mul", ref.ids[1]), ("add", ref.ids[2])]
    assert app.chain(mul.s(2, 3), add.s(1)).send().result(timeout=10) == 7
    with pytest.raises(TaskError) as err:
        (add.s(1, 2) | boom.s() | mul.s(2)).send().result(timeout=10)
    assert (err.value.type, err.value.message) == ("ValueError", "no 3")
    assert [name for name, _ in seen[5:]] == ["add"]  # the chain stopped at boom: mul never ran
    with pytest.raises(ValueError, match="needs a result"):
        (add.s(1, 2) | mul.s(2).with_options(result_ttl=0)).send()


def test_result_timeout_and_dedup_send(app, node):
    q = "t-" + uuid.uuid4().hex[:8]

    @app.task(queue=q)
    def add(a, b):
        return a + b

    ref = add.send(1, 2)  # no worker: no result
    with pytest.raises(ResultTimeout, match="no result for task .* within 0.2 s"):
        ref.result(timeout=0.2)
    assert not ref.done()
    first = add.send_with(args=(1, 2), dedup="add-1-2", delay=60)
    again = add.send_with(args=(1, 2), dedup="add-1-2", delay=60)
    assert first.id == again.id
    assert raw(node).execute_command("QLEN", q) == 1  # the first one only; the delayed ones are not queued yet


def test_retries_then_success_and_then_dead_letter_with_reason(app, node, run_worker):
    q = "t-" + uuid.uuid4().hex[:8]

    @app.task(queue=q, retries=3, backoff=(0.05, 0.2))
    def flaky(n):
        if current_task().attempt <= 2:
            raise RuntimeError("attempt %d" % current_task().attempt)
        return n

    @app.task(queue=q, retries=1, backoff=(0.05, 0.2))
    def hopeless(n):
        raise KeyError("never %d" % n)

    w = run_worker(app, concurrency=2)
    assert flaky.send(7).result(timeout=10) == 7
    ref = hopeless.send(3)
    with pytest.raises(TaskError) as err:
        ref.result(timeout=10)
    assert err.value.type == "KeyError"
    (dead,) = dead_letters(node, q, 1)
    assert dead["dead-letter-of"].decode() == ref.id
    assert dead["dead-letter-reason"].decode() == "KeyError: 'never 3'"
    assert dead["original-deliveries"] == 2  # retries=1: two tries
    snap = w.runner.metrics.snapshot()
    assert snap["done"] == {flaky.name: 1}
    assert snap["retried"] == {flaky.name: 2, hopeless.name: 1}
    assert snap["failed"] == {hopeless.name: 1}


def test_a_worker_lost_on_the_last_delivery_gives_its_waiters_the_dead_letter_reason(app, node):
    q = "t-" + uuid.uuid4().hex[:8]

    @app.task(queue=q, retries=0)
    def once():
        return "never run here"

    ref = once.send_with(retry=1)
    # a worker that takes the job and dies before it acknowledges or writes anything
    lost = raw(node)
    assert lost.execute_command("GETJOB", "TIMEOUT", 5000, "FROM", q)[0][1].decode() == ref.id
    lost.close()
    # its RETRY (1 s) ends on its only delivery (retries=0): the node dead-letters it, and the
    # waiter learns it from the dead letter instead of waiting for a result that cannot come
    with pytest.raises(TaskError) as err:
        ref.result(timeout=20)
    assert err.value.type == "WorkerLost"
    assert "after 1 deliveries" in err.value.message and "not acknowledged within its RETRY (1 s)" in err.value.message
    (dead,) = dead_letters(node, q, 1)
    assert dead["dead-letter-of"].decode() == ref.id


def test_a_failed_tasks_traceback_reaches_its_waiter_and_dead_letter_and_is_logged_once(node, caplog):
    f = failing_app(addr(node))
    try:
        with caplog.at_level(logging.INFO, "disque_py"):
            ref, err = fail_for_good(f)
    finally:
        f.app.close()
    tb = err.traceback
    assert str(err) == ERROR_LINE and (err.type, err.job_id) == ("KeyError", ref.id)
    # the task's own frames, from its function down: none of the runner's plumbing
    assert tb.startswith("Traceback (most recent call last):\n  File ") and ", in fails\n" in tb
    assert FAILING_LINE in tb and tb.endswith("\n" + ERROR_LINE + "\n") and "runner.py" not in tb
    (dead,) = dead_letters(node, f.queue, 1)
    assert dead["dead-letter-of"].decode() == ref.id and dead["last-failure-trace"].decode() == tb  # formatted once
    # each failure logged once, by the worker, with its traceback; never by the task runner too
    records = [r for r in caplog.records if ref.id in r.getMessage()]
    assert [(r.name, r.levelno) for r in records] == [("disque_py.worker", logging.WARNING),
                                                      ("disque_py.worker", logging.ERROR)]  # fmt: skip
    for r, attempt in zip(records, (1, 2)):
        line, _, trace = r.getMessage().partition("\n")
        assert line.startswith("job %s (tracing.fails) failed " % ref.id) and line.endswith(ERROR_LINE)
        assert "(attempt %d" % attempt in line and trace + "\n" == tb


def test_a_huge_traceback_is_kept_by_its_tail_end_to_end(node, caplog):
    f = failing_app(addr(node))
    try:
        with caplog.at_level(logging.INFO, "disque_py"):
            ref, err = fail_for_good(f, f.huge)
    finally:
        f.app.close()
    tb = err.traceback
    assert 16000 < len(tb.encode()) <= 16384  # of more than 100 KiB
    first, rest = tb.split("\n", 1)
    assert re.fullmatch(r"\[traceback cut: its first (\d+) bytes left out\]", first)
    assert int(first.split()[4]) > 100_000 - 16384 and rest.startswith("a line of the context\n")
    # the end: the task's failure, with where it failed (the tail of what it was handling before it)
    end = rest[rest.index("During handling of the above exception, another exception occurred:"):]
    assert ", in huge\n    return lookup({})\n" in end and end.endswith("\n" + ERROR_LINE + "\n")
    where = (tracing.__file__, tracing.FAILING_LINE_NO, FAILING_LINE)
    assert '  File "%s", line %d, in lookup\n    %s\n' % where in end
    (dead,) = dead_letters(node, f.queue, 1)
    assert dead["last-failure-trace"].decode() == tb
    [record] = [r for r in caplog.records if ref.id in r.getMessage()]
    assert record.getMessage().endswith("\n" + tb.rstrip("\n")) and len(record.getMessage()) < 17000


def test_a_worker_lost_after_a_failure_gives_its_waiter_that_failures_traceback(node):
    app = App(addr(node), result_ttl=60)
    q = "t-" + uuid.uuid4().hex[:8]

    @app.task(queue=q, retries=1, backoff=(3, 3), retry=1)
    def fails_then_lost():
        return tracing.lookup({})

    try:
        with running_worker(app) as worker:
            ref = fails_then_lost.send()
            wait_for(lambda: worker.stats().failed == 1, what="the first failure")
        # back in 3 s (BACKOFF), to a worker that takes it and dies before it acknowledges
        lost = raw(node)
        assert lost.execute_command("GETJOB", "TIMEOUT", 10000, "FROM", q)[0][1].decode() == ref.id
        lost.close()
        with pytest.raises(TaskError) as err:
            ref.result(timeout=20)
    finally:
        app.close()
    assert err.value.type == "WorkerLost" and "after 2 deliveries" in err.value.message
    assert FAILING_LINE in err.value.traceback and err.value.traceback.endswith(ERROR_LINE + "\n")


def test_time_limits_for_threads_and_trio(app, node, run_worker):
    q = "t-" + uuid.uuid4().hex[:8]

    @app.task(queue=q, retries=0, timeout=0.3)
    def busy():
        end = time.monotonic() + 30
        while time.monotonic() < end:
            time.sleep(0.01)
        return "finished"

    @app.task(queue=q, retries=0, timeout=0.3)
    def stuck():
        time.sleep(30)  # one C call: interrupted only when it returns; left behind after the grace
        return "finished"

    @app.task(queue=q, retries=0, timeout=0.3)
    async def sleepy():
        await trio.sleep(30)

    run_worker(app, concurrency=4)
    started = time.monotonic()
    refs = [busy.send(), stuck.send(), sleepy.send()]
    traces = []
    for ref in refs:
        with pytest.raises(TaskError) as err:
            ref.result(timeout=10)
        assert err.value.type == "TimeLimitExceeded"
        traces.append(err.value.traceback)
    # a thread interrupted by its limit: its traceback says where the task was
    assert ", in busy\n" in traces[0] and traces[0].endswith("0.3 s time limit\n") and "runner.py" not in traces[0]
    assert time.monotonic() - started < 15  # nobody waited for the 30 s tasks (10x the 1.3 s expected)
    reasons = sorted(d["dead-letter-reason"].decode() for d in dead_letters(node, q, 3))
    assert all(r.startswith("TimeLimitExceeded: task ") and "0.3 s time limit" in r for r in reasons), reasons


def test_bad_bodies_unknown_tasks_and_wrong_arguments_are_dead_lettered(app, node, run_worker):
    q = "t-" + uuid.uuid4().hex[:8]

    @app.task(queue=q)
    def add(a, b):
        return a + b

    r = raw(node)
    w = run_worker(app, concurrency=2, unknown_task_returns=2, unknown_task_delay=0.1)
    bodies = [
        b"not json",
        b'{"v":1,"task":',
        b'{"v":2,"task":"x"}',
        b'{"v":1,"args":[1]}',
        b'{"v":1,"task":"nobody.here","args":[],"result":{"ttl":30}}',
        json.dumps({"v": 1, "task": add.name, "args": [1, 2, 3], "result": {"ttl": 30}}).encode(),
        json.dumps({"v": 1, "task": add.name, "args": [1], "kwargs": {"c": 1}}).encode(),
    ]
    ids = [r.execute_command("ADDJOB", q, body, 0).decode() for body in bodies]
    dead = {d["dead-letter-of"].decode(): d["dead-letter-reason"].decode() for d in dead_letters(node, q, len(ids))}
    reasons = [dead[i] for i in ids]
    assert reasons[0].startswith("bad task message: body is neither a JSON object nor a msgpack map")
    assert reasons[1].startswith("bad task message: unreadable json body")
    assert reasons[2] == "bad task message: unsupported format version 2 (this worker reads 1)"
    assert reasons[3] == "bad task message: 'task' must be a non-empty string"
    # an unknown task is given back (twice here, 0.1 then 0.2 s later) before it is rejected
    assert reasons[4] == "UnknownTask: no task named 'nobody.here' in this worker's app (given back 2 times: no worker knew it)"
    assert reasons[5].startswith("TypeError: wrong arguments for task %s: too many positional" % add.name)
    assert reasons[6].startswith("TypeError: wrong arguments for task %s:" % add.name)
    with pytest.raises(TaskError, match="UnknownTask: no task named"):
        TaskRef.for_job(app, ids[4]).result(timeout=5)
    assert add.send(2, 2).result(timeout=10) == 4  # the worker is alive and well
    assert w.runner.metrics.total("rejected") == 7
    assert w.runner.metrics.total("given_back") == 2


def test_an_unknown_task_is_given_back_until_a_worker_that_knows_it_runs_it(app, node, run_worker):
    """A deploy of new task code: the task is sent (with retries=0: one delivery) while the only
    worker runs the old code. It gives the job back, no attempt used, until a worker with the new
    code comes (and the old one stops); that one runs it. No dead letter, the waiter gets the value."""
    q = "t-" + uuid.uuid4().hex[:8]
    old = App(nodes=app.nodes)

    @old.task(queue=q)
    def existing():
        return "old"

    new = App(nodes=app.nodes)

    @new.task(queue=q, name="deploy.new_task", retries=0)
    def new_task(x):
        return x * 2

    old_worker = run_worker(old, concurrency=1, unknown_task_delay=0.2)
    ref = new_task.send(21)
    r = raw(node)
    def shown():
        reply = r.execute_command("SHOW", ref.id)
        return dict(zip(reply[::2], reply[1::2]))

    # given back at 0.2 s, then 0.4 s later: the node counts the returns
    wait_for(lambda: shown().get(b"returns", 0) >= 2, timeout=10)
    fields = shown()
    assert fields[b"nacks"] == 0 and fields[b"deliveries"] == 0 and fields[b"additional-deliveries"] == 0
    assert old_worker.runner.metrics.total("given_back") >= 2 and old_worker.worker.stats().released >= 2
    assert old_worker.worker.stats().failed == 0
    # the deploy goes on: a worker with the new code starts, the old one stops
    run_worker(new, concurrency=1)
    old_worker.stop()
    assert ref.result(timeout=15) == 42
    assert r.execute_command("QLEN", q + ".dead") == 0


def test_a_task_from_redis_cli_in_the_documented_format_runs(app, node, run_worker, redis_cli):
    q = "t-" + uuid.uuid4().hex[:8]

    @app.task(queue=q, name="myapp.tasks.add")
    def add(a, b):
        return a + b

    run_worker(app)
    body = '{"v":1,"task":"myapp.tasks.add","args":[1,2],"result":{"ttl":60}}'
    out = subprocess.run([redis_cli, "-p", str(node.port), "ADDJOB", q, body, "0"],
                         capture_output=True, text=True, check=True, timeout=10)  # fmt: skip
    job_id = out.stdout.strip()
    got = subprocess.run([redis_cli, "-p", str(node.port), "GETJOB", "TIMEOUT", "10000", "FROM", "@result:" + job_id],
                         capture_output=True, text=True, check=True, timeout=20)  # fmt: skip
    assert '{"v":1,"ok":true,"value":3}' in got.stdout
    packed = msgpack.packb({"v": 1, "task": "myapp.tasks.add", "kwargs": {"a": 2, "b": 5}, "result": {"ttl": 60}})
    msg_id = raw(node).execute_command("ADDJOB", q, packed, 0).decode()
    assert TaskRef.for_job(app, msg_id).result(timeout=10) == 7


def test_hooks_and_metrics_endpoint(app, run_worker):
    q = "t-" + uuid.uuid4().hex[:8]
    seen: list[tuple] = []

    @app.before_task
    def before(ctx):
        if ctx.kwargs.get("refuse"):
            raise PermissionError("refused by a hook")
        seen.append(("before", ctx.task.name, ctx.args))

    @app.after_task
    def after(ctx):
        seen.append(("after", ctx.result, ctx.duration is None))

    @app.on_failure
    def failed(ctx):
        seen.append(("failure", type(ctx.error).__name__, ctx.final))

    @app.task(queue=q, retries=0)
    def echo(x, refuse=False):
        return x

    w = run_worker(app)
    port = free_port()
    server = serve_metrics(w.runner.metrics, port, worker=w.worker)
    try:
        assert echo.send(5).result(timeout=10) == 5
        with pytest.raises(TaskError, match="PermissionError: refused by a hook"):
            echo.send(6, refuse=True).result(timeout=10)
        assert ("before", echo.name, (5,)) in seen and ("after", 5, True) in seen
        assert ("failure", "PermissionError", True) in seen
        text = urllib.request.urlopen("http://127.0.0.1:%d/metrics" % port, timeout=5).read().decode()
    finally:
        server.shutdown()
    assert 'disque_py_tasks_done_total{task="%s"} 1.0' % echo.name in text
    assert 'disque_py_tasks_failed_total{task="%s"} 1.0' % echo.name in text
    assert 'disque_py_task_duration_seconds_count{task="%s"} 2.0' % echo.name in text
    assert "disque_py_worker_jobs_processed_total" in text
