"""Unit tests with no node: the message format and its serializers, the registry and the
options a task's job gets, the group logic, the metrics and the thread interrupt of the
time limit."""

from __future__ import annotations

import json
import threading
import traceback
import time

import msgpack
import pytest
import trio

from disque_py.core.constants import INTERNAL_QUEUE_PREFIX
from disque_py.tasks import App, GroupRef, MessageError, Outcome, ResultTimeout, TaskError, TaskRef
from disque_py.tasks import message as m
from disque_py.tasks.metrics import TaskMetrics
from disque_py.tasks.results import unwrap
from disque_py.tasks.timelimit import TIME_LIMIT_GRACE, TaskCancelled, ThreadCall, TimeLimitExceeded, run_in_thread


def test_json_and_msgpack_round_trip_and_are_told_apart_by_their_first_byte():
    msg = m.Message("app.add", (1, "é", [2]), {"k": None}, m.ResultSpec(30), {"trace": "x"})
    for ser in ("json", "msgpack"):
        body = m.encode(msg, ser)
        assert m.detect(body) == ser
        assert m.decode(body) == (msg, ser)
    assert m.encode(msg) == ('{"v":1,"task":"app.add","args":[1,"é",[2]],"kwargs":{"k":null},'
                             '"result":{"ttl":30},"meta":{"trace":"x"}}').encode()  # fmt: skip
    assert m.decode(b'  {"task":"t"}') == (m.Message("t"), "json")  # v, args, kwargs optional
    assert m.decode(msgpack.packb({"task": "t", "args": None})) == (m.Message("t"), "msgpack")
    queue_spec = m.decode(b'{"task":"t","result":{"ttl":5,"queue":"mine"}}')[0].result
    assert queue_spec == m.ResultSpec(5, "mine")


def test_a_chain_round_trips_in_both_serializers():
    step = m.ChainStep("app.mul", "math", (10,), {"k": 1}, (5000, "RETRY", 300, "MAXDELIVER", 4), m.ResultSpec(60, "r"))
    msg = m.Message("app.add", (1, 2), {}, None, {},
                    m.ChainSpec((m.ChainStep("app.inc", "q", addjob=(0,)), step), "r", 60))  # fmt: skip
    for ser in ("json", "msgpack"):
        assert m.decode(m.encode(msg, ser)) == (msg, ser)
    assert m.chain_key("D-1") == "chain:D-1"


def test_results_live_in_the_clusters_own_queues_and_the_old_name_is_known_for_a_tasks_own():
    job_id = "D-dcb833cf-8YL1NT17e9+wsA/09NqxscQI-05a1"
    assert m.result_queue(job_id) == "@result:" + job_id  # QSCAN, top, the page and /metrics leave it out
    assert m.result_queue(job_id).encode().startswith(INTERNAL_QUEUE_PREFIX)
    assert m.legacy_result_queue(m.result_queue(job_id)) == "result:" + job_id  # what older workers wrote
    chain = m.chain_result_queue("f00d")
    assert chain == "@result:chain-f00d" and m.legacy_result_queue(chain) is None  # named in the body: no other
    for other in ("result:" + job_id, "mine", "@result:short", "@other:" + job_id, "@result:X" + job_id[1:]):
        assert m.legacy_result_queue(other) is None, other


@pytest.mark.parametrize(
    "body, error",
    [
        (b"", "empty body"),
        (b"[1,2]", "neither a JSON object nor a msgpack map"),
        (b"\x92\x01\x02", "neither a JSON object nor a msgpack map"),
        (b'{"task":"t"', "unreadable json body"),
        (b"\x81\xa1", "unreadable msgpack body"),
        (b'{"v":2,"task":"t"}', "unsupported format version 2"),
        (b'{"task":""}', "'task' must be a non-empty string"),
        (b'{"task":"t","args":{}}', "'args' must be an array"),
        (b'{"task":"t","kwargs":[]}', "'kwargs' must be a map"),
        (b'{"task":"t","result":{"ttl":0}}', "'result.ttl' must be an integer"),
        (b'{"task":"t","result":{"ttl":true}}', "'result.ttl' must be an integer"),
        (b'{"task":"t","result":5}', "'result' must be a map or null"),
        (b'{"task":"t","result":{"ttl":5,"queue":""}}', "'result.queue' must be a non-empty string"),
        (b'{"task":"t","meta":[]}', "'meta' must be a map"),
        (b'{"task":"t","extra":1}', "unknown field(s): extra"),
        (b'{"task":"t","chain":[]}', "'chain' must be a map or null"),
        (b'{"task":"t","chain":{"then":[],"final":"f","ttl":5}}', "'chain.then' must be a non-empty array"),
        (b'{"task":"t","chain":{"then":[{"task":"u","queue":"q","addjob":[0]}],"final":"","ttl":5}}',
         "'chain.final' must be a non-empty string"),
        (b'{"task":"t","chain":{"then":[{"task":"u","queue":"q","addjob":[0]}],"final":"f","ttl":0}}',
         "'chain.ttl' must be an integer"),
        (b'{"task":"t","chain":{"then":[{"task":"u","queue":"q","addjob":[]}],"final":"f","ttl":5}}',
         "'chain.then[0].addjob' must be an array"),
        (b'{"task":"t","chain":{"then":[{"task":"u","queue":"q","addjob":[0,[1]]}],"final":"f","ttl":5}}',
         "'chain.then[0].addjob' must be an array"),
        (b'{"task":"t","chain":{"then":[{"task":"u","addjob":[0]}],"final":"f","ttl":5}}',
         "'chain.then[0].queue' must be a non-empty string"),
        (b'{"task":"t","chain":{"then":[{"task":"u","queue":"q","addjob":[0],"args":{}}],"final":"f","ttl":5}}',
         "'chain.then[0].args' must be an array"),
        (b'{"task":"t","chain":{"then":[{"task":"u","queue":"q","addjob":[0],"x":1}],"final":"f","ttl":5}}',
         "unknown field(s) in 'chain.then[0]': x"),
    ],
)
def test_bad_bodies_say_what_is_wrong(body, error):
    with pytest.raises(MessageError) as exc:
        m.decode(body)
    assert error in str(exc.value)


def test_outcomes_and_what_cannot_be_serialized():
    for ser in ("json", "msgpack"):
        for outcome in (Outcome(True, {"a": [1]}), Outcome(False, None, "ValueError", "boom")):
            assert m.decode_outcome(m.encode_outcome(outcome, ser)) == outcome
    assert json.loads(m.encode_outcome(Outcome(True, 3))) == {"v": 1, "ok": True, "value": 3}
    with pytest.raises(TypeError, match="not JSON serializable"):
        m.encode_outcome(Outcome(True, object()))
    with pytest.raises(TypeError, match="not JSON serializable"):
        m.dumps(float("nan"), "json")
    with pytest.raises(MessageError, match="not a task result"):
        m.decode_outcome(b'{"v":1}')


def test_a_failed_outcome_carries_its_traceback_to_the_task_error():
    tb = 'Traceback (most recent call last):\n  File "t.py", line 2, in f\n    d["missing"]\nKeyError: \'missing\'\n'
    failed = Outcome(False, None, "KeyError", "'missing'", tb)
    for ser in ("json", "msgpack"):
        assert m.decode_outcome(m.encode_outcome(failed, ser)) == failed
    error = json.loads(m.encode_outcome(failed))["error"]
    assert error == {"type": "KeyError", "message": "'missing'", "traceback": tb}
    assert "traceback" not in json.loads(m.encode_outcome(Outcome(False, None, "KeyError", "'x'")))["error"]
    # what another writer may put there: anything but a string reads as none
    for odd in (None, 42, ["a"], {"x": 1}, ""):
        body = json.dumps({"v": 1, "ok": False, "error": {"type": "E", "message": "m", "traceback": odd}})
        assert m.decode_outcome(body.encode()).error_traceback is None
    with pytest.raises(TaskError) as err:
        unwrap(failed, "D-1")
    assert (str(err.value), err.value.traceback, err.value.job_id) == ("KeyError: 'missing'", tb, "D-1")
    # not caught, it prints the task's traceback above its own (str() stays one line)
    printed = "".join(traceback.format_exception(err.value))
    assert printed.index('    d["missing"]') < printed.index("TaskError: KeyError: 'missing'")
    with pytest.raises(TaskError) as err:
        unwrap(Outcome(False, None, "KeyError", "'missing'"), "D-1")
    assert err.value.traceback is None and err.value.__cause__ is None


def test_the_registry_names_checks_and_maps_options_to_the_job():
    app = App("127.0.0.1:1", result_ttl=60)

    @app.task
    def plain(a, b=2):
        return a + b

    @app.task(name="custom", queue="math", retries=2, backoff=(0.5, 30), timeout=10, result_ttl=0, retry=20,
              replicate=2, serializer="msgpack")  # fmt: skip
    async def fancy(x):
        return x

    assert plain.name == "%s.test_the_registry_names_checks_and_maps_options_to_the_job.<locals>.plain" % __name__
    assert app.tasks == {plain.name: plain, "custom": fancy}
    assert plain(1) == 3 and not plain.is_async and fancy.is_async
    assert app.queues() == ["default", "math"]
    with pytest.raises(ValueError, match="registered already"):
        app.task(name="custom")(lambda: None)
    for bad, message in ((dict(retries=-1), "retries must be an integer >= 0"), (dict(backoff=(5, 1)), "backoff must be"),
                         (dict(timeout=0), "timeout must be > 0"), (dict(serializer="pickle"), "serializer must be one of"),
                         (dict(queue=""), "a task needs a queue")):  # fmt: skip
        with pytest.raises(ValueError, match=message):
            app.task(name="x", **bad)(lambda: None)
    argv, queue = fancy.addjob_argv(b"{}")
    assert queue == "math"
    assert argv[:3] == (b"ADDJOB", b"math", b"{}")
    assert argv[argv.index(b"MAXDELIVER") + 1] == 3  # retries=2: three deliveries
    assert argv[argv.index(b"BACKOFF") + 1 : argv.index(b"BACKOFF") + 3] == (b"0.5", b"30")
    assert argv[argv.index(b"RETRY") + 1] == 20 and argv[argv.index(b"REPLICATE") + 1] == 2
    argv, queue = plain.addjob_argv(b"{}", queue="other", dedup="k1", delay=1.5, retries=0, ttl=100)
    assert queue == "other" and argv[-2:] == (b"DEDUP", "k1")
    assert argv[argv.index(b"DELAY") + 1] == 2 and argv[argv.index(b"MAXDELIVER") + 1] == 1
    assert argv[argv.index(b"TTL") + 1] == 100
    with_limit = app.task(name="limited", timeout=200)(lambda: None)
    argv, _ = with_limit.addjob_argv(b"{}")
    assert argv[argv.index(b"RETRY") + 1] == 430  # no retry given: above twice the time limit
    quick = app.task(name="quick", timeout=5)(lambda: None)
    for ttl, retry in ((None, 300), (1000, 100), (200, 40), (50, 40), (30, 29)):
        # the node's own default for the TTL at the least (a tenth of it, at most 300), twice the
        # time limit plus 30 s if that is more, below the TTL
        argv, _ = quick.addjob_argv(b"{}", **({} if ttl is None else {"ttl": ttl}))
        assert argv[argv.index(b"RETRY") + 1] == retry, ttl
    with pytest.raises(TypeError, match="unknown send option"):
        plain.addjob_argv(b"{}", colour="red")
    sig = plain.s()  # a signature may lack its first arguments (a chain passes a value on)...
    with pytest.raises(TypeError, match="missing a required argument: 'a'"):
        sig.send()  # ... but a missing argument is caught at the producer, before anything is sent
    with pytest.raises(TypeError, match="missing a required argument: 'a'"):
        app.group(sig).send()  # a group's members are checked whole when it is sent (in a chain: given a value)
    with pytest.raises(TypeError, match="too many positional arguments"):
        plain.s(1, 2, 3, 4, 5)  # too many is caught at once
    with pytest.raises(TypeError, match="not JSON serializable"):
        plain.send_with(args=(object(),))
    assert plain.message((1,)).result == m.ResultSpec(60) and fancy.message((1,)).result is None


def test_a_chain_steps_addjob_words_become_the_clients_add_job_keywords():
    """The worker adds a chain's next task with the client's own ADDJOB: the step's words (what
    the producer wrote) give back the same command, whatever task options made them."""
    from disque_py.client import commands as cmd

    app = App("127.0.0.1:1")
    tasks = [
        app.task(name="plain")(lambda: None),
        app.task(name="tuned", retries=0, backoff=(0.5, 30), retry=20, replicate=2, ttl=100)(lambda: None),
        app.task(name="limited", timeout=200, backoff=None)(lambda: None),
    ]

    def words(argv):
        return [w.decode() if isinstance(w, bytes) else w for w in argv]

    for task in tasks:
        for options in ({}, dict(delay=3, timeout_ms=0)):
            argv, queue = task.addjob_argv(b"{}", **options)
            step_words = tuple(words(argv[3:]))  # as the app writes a chain step
            again = cmd.addjob_argv(queue, b"{}", **m.addjob_options(step_words))
            assert words(again) == words(argv)
    documented = m.addjob_options([5000, "RETRY", 300, "MAXDELIVER", 4])
    assert documented == {"timeout_ms": 5000, "retry": 300, "maxdeliver": 4}
    assert m.addjob_options([0, "ttl", "60", "async", "deadletter", "q.bad", "backoff", "1", "2.5"]) == {
        "timeout_ms": 0, "ttl": 60, "async_": True, "deadletter": "q.bad", "backoff": (1, 2.5)}
    assert m.addjob_options([]) == {}
    for bad, error in (([0, "COLOUR", "red"], "'COLOUR' is not an ADDJOB option"),
                       ([0, "RETRY"], "'RETRY' is not an ADDJOB option"),
                       ([0, "BACKOFF", 1], "'BACKOFF' is not an ADDJOB option"),
                       ([0, "TTL", "soon"], "'soon' is not a number"),
                       (["5000x"], "'5000x' is not a number")):  # fmt: skip
        with pytest.raises(MessageError, match=error):
            m.addjob_options(bad)


def test_group_logic_in_order_with_errors_in_place():
    app = App("127.0.0.1:1")

    @app.task
    def add(a, b):
        return a + b

    with pytest.raises(TypeError, match="signatures"):
        app.group(add)
    assert len(app.group([add.s(1, 2), add.s(3, 4)])) == 2
    refs = [TaskRef(app, "id%d" % i, add.name, "@result:id%d" % i) for i in range(3)]
    refs[0]._outcome = Outcome(True, 3)
    refs[1]._outcome = Outcome(False, None, "KeyError", "'x'")
    refs[2]._outcome = Outcome(True, 7)
    group = GroupRef(refs)
    assert group.ids == ["id0", "id1", "id2"]
    with pytest.raises(TaskError) as err:
        group.results(timeout=0)
    assert (err.value.type, err.value.job_id, str(err.value)) == ("KeyError", "id1", "KeyError: 'x'")
    values = group.results(timeout=0, return_exceptions=True)
    assert values[0] == 3 and values[2] == 7 and isinstance(values[1], TaskError)
    assert issubclass(ResultTimeout, TimeoutError)


def test_metrics_count_per_task():
    metrics = TaskMetrics()
    metrics.count("done", "a", 0.002)
    metrics.count("done", "a", 2.0)
    metrics.count("retried", "b", 0.5)
    metrics.count("rejected", "?")
    snap = metrics.snapshot()
    assert snap["done"] == {"a": 2} and snap["retried"] == {"b": 1} and metrics.total("rejected") == 1
    assert snap["duration_sum"]["a"] == pytest.approx(2.002)
    assert snap["duration_buckets"]["a"][-1] == 2 and snap["duration_buckets"]["a"][0] == 0


def test_the_time_limit_is_raised_inside_the_thread_and_never_escapes_it():
    stop = threading.Event()
    results: list = []

    def busy():
        while not stop.is_set():
            time.sleep(0.001)
        return "done"

    call = ThreadCall(busy)
    thread = threading.Thread(target=lambda: results.append(_capture(call.run)))
    thread.start()
    deadline = time.monotonic() + 5
    while not call.running and time.monotonic() < deadline:
        time.sleep(0.001)
    call.interrupt()
    thread.join(5)
    stop.set()
    assert isinstance(results[0], TimeLimitExceeded)
    late = ThreadCall(lambda: "never")
    late.interrupt()  # the limit was over before the thread started
    assert isinstance(_capture(late.run), TimeLimitExceeded)
    quick = ThreadCall(lambda: "ok")
    assert _capture(quick.run) == "ok"
    quick.interrupt()  # after the end: nothing is raised anywhere
    assert sum(range(1000)) == 499500


def test_a_task_without_time_limit_is_cancelled_in_its_thread_or_left_behind():
    # no time limit: a plain hand-off to a thread, which cancel() still reaches
    stop = threading.Event()

    def busy():
        while not stop.is_set():
            time.sleep(0.001)
        return "done"

    async def main():
        limiter = trio.CapacityLimiter(2)
        running = ThreadCall(busy)
        stuck = ThreadCall(lambda: time.sleep(TIME_LIMIT_GRACE + 2) or "late")  # one C call
        ran = await run_in_thread(lambda: "ok", None, limiter, ThreadCall(lambda: "ok"))
        out: dict = {}

        async def one(name, call):
            t0 = trio.current_time()
            try:
                out[name] = (await run_in_thread(call.fn, None, limiter, call), trio.current_time() - t0)
            except TaskCancelled as exc:
                out[name] = (exc, trio.current_time() - t0)

        async with trio.open_nursery() as nursery:
            nursery.start_soon(one, "running", running)
            nursery.start_soon(one, "stuck", stuck)
            await trio.sleep(0.2)
            running.cancel()
            stuck.cancel()
        return ran, out

    try:
        ran, out = trio.run(main)
    finally:
        stop.set()
    assert ran == (True, "ok")
    assert isinstance(out["running"][0], TaskCancelled) and out["running"][1] < 1.0  # raised in the thread
    assert out["stuck"][0] == (False, None)  # left behind after the grace, not waited for
    assert TIME_LIMIT_GRACE <= out["stuck"][1] < TIME_LIMIT_GRACE + 1.5


def _capture(fn):
    try:
        return fn()
    except BaseException as exc:  # noqa: BLE001
        return exc
