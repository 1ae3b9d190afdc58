"""Celery's words on the task layer: ``delay``, ``apply_async`` (``countdown``, ``eta``,
``expires``), ``bind=True``, ``si``/``signature``, AsyncResult's ``get``/``ready``/``state``, and
Celery's words that are refused with what to use instead. Units first (no node: every refusal
happens before anything is sent), then a real node and a worker (in a thread of this process)."""

from __future__ import annotations

import re
import time
import uuid
from datetime import datetime, timedelta, timezone

import pytest
import trio

from disque_py.tasks import App, ResultTimeout, TaskError, TaskRef, current_task
from disque_py.tasks import message as m
from disque_py.tasks.message import Outcome

from .conftest import addr, raw, wait_for


def words(argv) -> dict:
    """ADDJOB's options (after the timeout) as {name: value}; BACKOFF as its pair."""
    out, rest = {}, list(argv[4:])
    while rest:
        name = rest.pop(0).decode()
        out[name] = (rest.pop(0), rest.pop(0)) if name == "BACKOFF" else (rest.pop(0) if rest else None)
    return out


def show(node, job_id) -> dict | None:
    fields = raw(node).execute_command("SHOW", job_id)
    return None if fields is None else {fields[i].decode(): fields[i + 1] for i in range(0, len(fields), 2)}


# ------------------------------------------------------------------------------ no node
@pytest.fixture
def offline():
    """An app whose node does not exist: what is tested here must fail before any I/O."""
    a = App("127.0.0.1:1", result_ttl=60)
    yield a
    a.close()


def test_times_become_delay_and_ttl_in_whole_seconds(offline):
    @offline.task(retry=None)
    def add(a, b):
        return a + b

    soon = datetime.now(timezone.utc) + timedelta(seconds=2.5)
    opts = words(add.addjob_argv(b"{}", delay=soon)[0])
    assert opts["DELAY"] == 3 and opts["TTL"] == 86400  # rounded up: never before its moment
    in_paris = datetime.now(timezone(timedelta(hours=2))) + timedelta(seconds=10)
    assert words(add.addjob_argv(b"{}", delay=in_paris)[0])["DELAY"] == 10  # any aware datetime
    past = datetime.now(timezone.utc) - timedelta(hours=1)
    assert words(add.addjob_argv(b"{}", delay=past)[0])["DELAY"] == 0  # a moment past: at once
    opts = words(add.addjob_argv(b"{}", expires=30.9, delay=5)[0])
    assert (opts["TTL"], opts["DELAY"]) == (30, 5)  # rounded down: never handed out after it
    # a backoff longer than the job's life is cut to it (the node refuses one; the job expires first)
    assert opts["BACKOFF"] == (b"1", b"30")
    assert words(add.addjob_argv(b"{}", expires=datetime.now(timezone.utc) + timedelta(seconds=100.5))[0])["TTL"] == 100
    assert words(add.addjob_argv(b"{}", ttl=100)[0])["BACKOFF"] == (b"1", b"100")
    assert words(add.addjob_argv(b"{}")[0])["BACKOFF"] == (b"1", b"300")  # unchanged when it fits


def test_priority_is_addjobs_from_the_task_or_each_send(offline):
    @offline.task(priority=8)
    def urgent():
        return 1

    @offline.task
    def plain():
        return 1

    assert words(urgent.addjob_argv(b"{}")[0])["PRIORITY"] == 8  # the task's
    assert words(urgent.addjob_argv(b"{}", priority=0)[0])["PRIORITY"] == 0  # a send's own
    assert "PRIORITY" not in words(plain.addjob_argv(b"{}")[0])  # none: the job as before
    assert words(plain.addjob_argv(b"{}", priority=9, dedup=b"k")[0])["PRIORITY"] == 9
    assert words(plain.addjob_argv(b"{}", priority=9, dedup=b"k")[0])["DEDUP"] == b"k"  # the key last


def test_group_is_addjobs_from_the_task_or_each_send(offline):
    @offline.task(group="tenant-1")
    def grouped():
        return 1

    @offline.task
    def plain():
        return 1

    assert words(grouped.addjob_argv(b"{}")[0])["GROUP"] == b"tenant-1"  # the task's
    assert words(grouped.addjob_argv(b"{}", group="tenant-2")[0])["GROUP"] == b"tenant-2"  # a send's own
    assert "GROUP" not in words(plain.addjob_argv(b"{}")[0])  # none: the job as before
    got = words(plain.addjob_argv(b"{}", group="t", priority=3, dedup=b"k")[0])
    assert got["GROUP"] == b"t" and got["PRIORITY"] == 3 and got["DEDUP"] == b"k"
    with pytest.raises(ValueError, match=r"^group= is 1 to 128 bytes"):
        offline.task(group="")(lambda: None)
    with pytest.raises(TypeError, match=r"^group= is a str"):
        plain.send_with(group=7)
    with pytest.raises(ValueError, match=r"^group= is 1 to 128 bytes, got 129"):
        plain.apply_async(group="x" * 129)


@pytest.mark.parametrize(
    "options, error, text",
    [
        (dict(eta=datetime.now() + timedelta(seconds=5)), TypeError, r"naive datetime: its moment is ambiguous"),
        (dict(expires=datetime(2030, 1, 1)), TypeError, r"expires=.* is a naive datetime"),
        (dict(countdown=-1), ValueError, r"delay= must be a finite number of seconds >= 0"),
        (dict(countdown=float("nan")), ValueError, r"finite number"),
        (dict(countdown="5"), TypeError, r"takes seconds or an aware datetime, not str"),
        (dict(countdown=True), TypeError, r"not bool"),
        (dict(countdown=datetime.now(timezone.utc)), TypeError, r"countdown= is seconds; give a datetime as eta="),
        (dict(countdown=1, eta=datetime.now(timezone.utc)), TypeError, r"give one of countdown=, eta= and delay="),
        (dict(countdown=1, delay=2), TypeError, r"not countdown= and delay="),
        (dict(countdown=5, expires=3), ValueError, r"comes before the task is to run \(in 5 s; .* in 3 s"),
        (dict(countdown=3, expires=3.5), ValueError, r"whole seconds"),
        (dict(expires=0.5), ValueError, r"less than a second away"),
        (dict(expires=datetime.now(timezone.utc) - timedelta(seconds=1)), ValueError, r"is past"),
        (dict(expires=10, ttl=20), TypeError, r"give ttl= or expires=, not both"),
        (dict(countdown=86400 * 2), ValueError, r"to run in 172800 s, past its TTL \(86400 s\)"),
        (dict(expires=10, retry=10), ValueError, r"retry \(10 s\) is not below its life \(10 s, to expires=\)"),
        (dict(retry=False), TypeError, r"not Celery's retry=True/False"),
        (dict(priority=10), ValueError, r"^priority= is from 0 to 9 \(the higher first"),
        (dict(priority="9"), TypeError, r"^priority= is an int from 0 to 9 \(the higher first\), not str"),
        (dict(ignore_result=True, result_ttl=5), TypeError, r"ignore_result=True or result_ttl="),
        (dict(colour="red", link="x", headers={}), TypeError,
         r"^unknown send option\(s\): colour, headers, link \(headers=: meta=.*; link=: chain the tasks"),
    ],
)
def test_apply_async_refuses_what_it_cannot_honour_before_sending(offline, options, error, text):
    @offline.task
    def add(a, b):
        return a + b

    with pytest.raises(error, match=text):
        add.apply_async((1, 2), **options)


def test_send_with_names_celerys_words_it_does_not_take(offline):
    @offline.task
    def add(a, b):
        return a + b

    with pytest.raises(TypeError, match=r"^unknown send option\(s\): countdown, eta \(countdown=: delay="):
        add.send_with(args=(1, 2), countdown=5, eta=1)
    with pytest.raises(ValueError, match=r"^priority= is from 0 to 9"):
        add.send_with(args=(1, 2), priority=-1)
    with pytest.raises(TypeError, match=r"naive datetime"):
        add.send_with(args=(1, 2), delay=datetime.now())
    with pytest.raises(TypeError, match="missing a required argument: 'b'"):
        add.delay(1)  # Celery's shortcut checks the arguments as send does


def test_celerys_task_options_are_refused_with_the_word_to_use(offline):
    with pytest.raises(TypeError, match=r"^rate_limit= is not supported: give the task a group="):
        offline.task(rate_limit="10/m")(lambda: None)
    with pytest.raises(ValueError, match=r"^priority= is from 0 to 9"):
        offline.task(priority=12)(lambda: None)
    with pytest.raises(TypeError, match=r"^priority= is an int"):
        offline.task(priority=True)(lambda: None)
    with pytest.raises(TypeError, match=r"unexpected keyword argument\(s\): max_retries, time_limit "
                                        r"\(max_retries=: retries= .*; time_limit=: timeout= \(seconds\)\)"):
        offline.task(max_retries=3, time_limit=10)(lambda: None)
    with pytest.raises(TypeError, match=r"unexpected keyword argument\(s\): colour$"):
        offline.task(colour="red")(lambda: None)
    def nothing(*, k=1):
        return k

    with pytest.raises(ValueError, match=r"bind=True takes its context first: def nothing\(self, ...\)"):
        offline.task(bind=True)(nothing)
    assert offline.tasks == {}  # nothing refused was registered
    # None is no limit and no priority: accepted as Celery's defaults
    assert offline.task(name="fine", rate_limit=None, priority=None)(lambda: 1)() == 1


def test_a_bound_task_takes_its_context_first(offline):
    @offline.task(bind=True, queue="q", retries=5)
    def whoami(self, x, y=0):
        return (self.request is self, self.id, self.retries, self.name, self.max_retries, self.called_directly,
                self.queue, x + y)  # fmt: skip

    # the arguments sent are those after the context: checked without it
    with pytest.raises(TypeError, match="too many positional arguments"):
        whoami.s(1, 2, 3)
    whoami.check_arguments((1,), {"y": 2})
    # called here and now: a context of its own, with no job
    assert whoami(1, y=2) == (True, "", 0, whoami.name, 5, True, "q", 3)
    with pytest.raises(RuntimeError, match="outside a task"):
        current_task()  # the direct call set nothing current

    @offline.task(bind=True)
    async def later(self):
        return self.attempt

    assert later.is_async
    assert trio.run(later) == 1


def test_signatures_immutable_ones_and_their_chain_steps(offline):
    @offline.task
    def add(a, b):
        return a + b

    assert repr(add.si(1, 2)) == "%s.si(1, 2)" % add.name and add.si(1, 2).immutable
    with pytest.raises(TypeError, match="missing a required argument: 'b'"):
        add.si(1)  # given nothing more in a chain: checked whole at once
    add.s(1)  # a mutable one may lack what the chain passes on
    sig = add.signature((1,), countdown=3, expires=60)
    assert (sig.args, sig.options, sig.immutable) == ((1,), {"delay": 3, "expires": 60}, False)
    assert add.signature((1, 2), immutable=True).immutable and add.si(1, 2).with_options(delay=1).immutable
    assert add.signature((1,), priority=1).options == {"priority": 1}
    later = add.signature((3,), eta=datetime.now(timezone.utc) + timedelta(seconds=5))
    with pytest.raises(ValueError, match=r"a chained task is added when the one before it ends: its delay= is "
                                         r"seconds from then, not a datetime"):
        (add.s(1, 2) | later).send()
    step = m.ChainStep("app.add", "q", (1, 2), {}, (0,), None, True)
    msg = m.Message("app.first", (), {}, None, {}, m.ChainSpec((step, m.ChainStep("app.mul", "q", addjob=(0,))), "r", 60))
    for ser in ("json", "msgpack"):
        assert m.decode(m.encode(msg, ser)) == (msg, ser)
    assert b'"immutable":true' in m.encode(msg) and m.encode(msg).count(b"immutable") == 1  # only when true
    bad = b'{"task":"t","chain":{"then":[{"task":"a","queue":"q","addjob":[0],"immutable":1}],"final":"r","ttl":5}}'
    with pytest.raises(m.MessageError, match=r"'chain.then\[0\].immutable' must be true or false"):
        m.decode(bad)


def test_async_result_words_read_the_outcome(offline):
    ok, bad = TaskRef(offline, "a", "t", "result:a"), TaskRef(offline, "b", "t", "result:b")
    ok._outcome, bad._outcome = Outcome(True, 3), Outcome(False, None, "ValueError", "boom")
    assert (ok.get(), ok.ready(), ok.successful(), ok.failed(), ok.state, ok.status) == (3, True, True, False,
                                                                                          "SUCCESS", "SUCCESS")  # fmt: skip
    assert (bad.ready(), bad.successful(), bad.failed(), bad.state) == (True, False, True, "FAILURE")
    with pytest.raises(TaskError, match="ValueError: boom"):
        bad.get(timeout=0)
    err = bad.get(timeout=0, propagate=False)
    assert isinstance(err, TaskError) and err.type == "ValueError"


# ------------------------------------------------------------------------------ a real node
@pytest.fixture
def app(node):
    a = App(addr(node), result_ttl=60)
    yield a
    a.close()


def test_eta_and_countdown_hold_the_job_at_the_node_until_their_moment(app, node, run_worker):
    q = "c-" + uuid.uuid4().hex[:8]

    @app.task(queue=q, retries=0)
    def stamp(tag):
        return [tag, time.time()]

    run_worker(app)
    sent = time.time()
    eta = datetime.fromtimestamp(sent, timezone.utc) + timedelta(seconds=3)
    at = stamp.apply_async(("eta",), eta=eta)
    after = stamp.apply_async(("countdown",), countdown=2)
    assert show(node, at.id)["delay"] == 3 and show(node, after.id)["delay"] == 2
    assert raw(node).execute_command("QLEN", q) == 0  # held by the node: not queued before their moment
    assert not at.ready() and at.state == "PENDING"
    tag, ran = after.get(timeout=15)
    assert tag == "countdown" and ran - sent >= 2 - 0.01, ran - sent
    tag, ran = at.get(timeout=15)
    # not before its moment (the node counts in whole milliseconds: 10 ms of slack); the upper
    # bound is loose on purpose: two shared cores may be slow to run it, never early
    assert tag == "eta" and ran >= eta.timestamp() - 0.01, ran - eta.timestamp()
    assert ran - sent < 3 + 5, ran - sent
    assert at.ready() and at.successful() and at.state == "SUCCESS"


def test_a_job_past_its_expiry_never_runs_and_its_waiters_time_out(app, node, run_worker):
    q = "c-" + uuid.uuid4().hex[:8]
    ran = []

    @app.task(queue=q, retries=0)
    def record(tag):
        ran.append(tag)
        return tag

    gone = record.apply_async(("expired",), expires=2)  # no worker yet: nobody takes it in time
    assert 1 <= show(node, gone.id)["ttl"] <= 2
    kept = record.apply_async(("kept",), expires=datetime.now(timezone.utc) + timedelta(seconds=60))
    assert 50 <= show(node, kept.id)["ttl"] <= 60
    wait_for(lambda: show(node, gone.id) is None, timeout=10, what="the job dropped at its expiry")
    run_worker(app)
    assert kept.get(timeout=10) == "kept"
    assert record.delay("after").get(timeout=10) == "after"  # the worker has emptied the queue
    assert ran == ["kept", "after"]  # the expired one never ran
    with pytest.raises(ResultTimeout, match=r"no result for task .* \(%s\) within 1 s" % re.escape(gone.id)):
        gone.get(timeout=1)  # no result is written for it: its waiters time out
    assert gone.state == "PENDING" and not gone.ready()


def test_delay_bind_and_signatures_on_a_worker(app, run_worker):
    q = "c-" + uuid.uuid4().hex[:8]

    @app.task(queue=q, retries=2, backoff=(0.05, 0.1))
    def sub(a, b):
        return a - b

    @app.task(queue=q, retries=2, backoff=(0.05, 0.1), bind=True)
    def flaky(self, x):
        if self.request.retries == 0:
            raise RuntimeError("first run of %s" % self.request.id)
        return {"id": self.request.id, "retries": self.request.retries, "name": self.name, "x": x,
                "current": self is current_task(), "direct": self.called_directly}  # fmt: skip

    @app.task(queue=q, bind=True)
    async def where(self):
        await trio.sleep(0)
        return [self.id, self.queue]

    @app.task(queue=q, retries=0)
    def boom():
        raise ValueError("boom")

    run_worker(app, concurrency=2)
    assert sub.delay(5, 3).get(timeout=10) == 2
    assert sub.apply_async((5,), {"b": 1}, queue=q, retries=0).get(timeout=10) == 4
    ref = flaky.delay(7)
    assert ref.get(timeout=10) == {"id": ref.id, "retries": 1, "name": flaky.name, "x": 7, "current": True,
                                   "direct": False}  # fmt: skip
    ref = where.delay()
    assert ref.get(timeout=10) == [ref.id, q]
    # Celery's partial arguments go before the signature's own; an immutable one takes none
    assert sub.s(10).delay(3).get(timeout=10) == -7
    assert sub.si(10, 3).delay(100).get(timeout=10) == 7
    assert sub.signature((10,), countdown=0).apply_async((1,)).get(timeout=10) == -9
    # in a chain, an immutable step is not given the value before it
    assert (sub.s(10, 1) | sub.si(100, 50) | sub.s(8)).send().get(timeout=10) == 42
    assert app.group(sub.s(1, 1), sub.si(3, 1)).delay().get(timeout=10) == [0, 2]
    failed = boom.delay()
    assert isinstance(failed.get(timeout=10, propagate=False), TaskError)
    assert failed.failed() and not failed.successful() and failed.state == "FAILURE"
    assert sub.apply_async((1, 1), ignore_result=True).result_queue is None
