"""Chords: a group joined by a callback that runs once after the last member, with no one in
charge (disque_py/tasks/chords.py). The body format and the refusals offline; on real nodes
with the worker in a thread of the test process: results in order, both failure policies,
groups inside chains, progress read from the cluster, a member whose worker died on its
last delivery, and the two mechanisms that make it exactly once shown by taking each away:
the callback's key (without it, two last members add two callbacks) and the check before
the acknowledgement (a check that fails is not lost: the member comes back and checks again)."""

from __future__ import annotations

import json
import subprocess
import sys
import threading
import uuid

import pytest
import trio

from disque_py.core.ids import dedup_job_id
from disque_py.tasks import App, ChordRef, GroupRef, Progress, TaskError, chain, chord, chords, current_task, group, writes
from disque_py.tasks import message as m
from disque_py.tasks import runner
from disque_py.tasks.results import RESULT_DEDUP

from .conftest import addr, raw, wait_for


# ------------------------------------------------------------------------------ offline
@pytest.fixture
def offline():
    """An app whose node does not exist: what is tested here must fail before any I/O."""
    a = App("127.0.0.1:1", result_ttl=60)
    yield a
    a.close()


def test_a_chords_body_round_trips_and_every_id_follows_from_it():
    then = (m.ChainStep("app.total", "q", (), {}, (0, "RETRY", 5), m.ResultSpec(60, "r")),)
    spec = m.ChordSpec("g1", (("a", 2), ("b", 1)), "call", then, "r", 60)
    msg = m.Message("app.add", (1, 2), {}, m.ResultSpec(600), {"k": 1}, None, spec)
    call = m.Message("app.total", ([1, None],), {}, None, {}, None, None, (m.ErrorAt(1, "ValueError", "boom", "D-x"),))
    inner = m.GroupStep("g2", (m.ChainStep("app.add", "q", (1,), {}, (0,), m.ResultSpec(5)),), "fail")
    chained = m.Message("app.first", (), {}, None, {}, m.ChainSpec((inner, then[0]), "r", 60))
    for ser in ("json", "msgpack"):
        for one in (msg, call, chained):
            assert m.decode(m.encode(one, ser)) == (one, ser)
    assert chords.member_runs(["a", "a", "b", "a"]) == (("a", 2), ("b", 1), ("a", 1))
    ids = chords.member_ids(spec)
    assert ids == [dedup_job_id(q.encode(), b"chord:g1:%d" % i, 1).decode() for i, q in enumerate("aab")]
    assert chords.result_id(ids[0]) == dedup_job_id(m.result_queue(ids[0]).encode(), RESULT_DEDUP.encode(), 1).decode()
    # the callback is given TaskErrors in place of the members' errors
    given = chords.with_errors(m.decode(m.encode(call))[0])
    assert given.args[0][0] == 1 and isinstance(given.args[0][1], TaskError)
    assert (given.args[0][1].type, given.args[0][1].message, given.args[0][1].job_id) == ("ValueError", "boom", "D-x")
    failure = chords.chord_failure(spec, [m.Outcome(True, 1), m.Outcome(False, None, "ValueError", "boom"),
                                          m.Outcome(False, None, "WorkerLost", "gone")])  # fmt: skip
    assert failure.error_type == "ChordError"
    assert failure.error_message == "2 of 3 members failed: member 1 (%s) ValueError: boom; member 2 (%s) WorkerLost: gone" % (
        ids[1], ids[2])


GOOD_CHORD = {"id": "g", "members": [["q", 2]], "then": [], "final": "r", "ttl": 5}


@pytest.mark.parametrize("chord_obj, error", [
    ({**GOOD_CHORD, "members": []}, r"'chord.members' must be a non-empty array"),
    ({**GOOD_CHORD, "members": [["q", 0]]}, r"'chord.members\[0\]' must be \[queue, count\]"),
    ({**GOOD_CHORD, "members": [["", 1]]}, r"'chord.members\[0\]' must be \[queue, count\]"),
    ({**GOOD_CHORD, "members": [["q", 10 ** 9]]}, r"names more than 100000 members"),
    ({**GOOD_CHORD, "members": "q"}, r"'chord.members' must be a non-empty array"),
    ({**GOOD_CHORD, "id": ""}, r"'chord.id' must be a string of 1 to 128"),
    ({**GOOD_CHORD, "id": "x" * 200}, r"'chord.id' must be a string of 1 to 128"),
    ({**GOOD_CHORD, "on_error": "ignore"}, r"'chord.on_error' must be one of \"fail\", \"call\""),
    ({**GOOD_CHORD, "then": {}}, r"'chord.then' must be an array"),
    ({**GOOD_CHORD, "then": [{"group": {"id": "h", "members": [], "on_error": "fail"}}]},
     r"'chord.then\[0\].group.members' must be an array of 1 to"),
    ({**GOOD_CHORD, "then": [{"group": {"id": "h", "members": [{"task": "t", "queue": "q", "addjob": [0]}]}}]},
     r"'chord.then\[0\].group.members\[0\].result' must give the member's result"),
    ({**GOOD_CHORD, "then": [{"group": {"id": "h", "members": [{"group": {}}]}}]},
     r"unknown field\(s\) in 'chord.then\[0\].group.members\[0\]': group"),
    ({**GOOD_CHORD, "ttl": 0}, r"'chord.ttl' must be an integer"),
    ({**GOOD_CHORD, "colour": 1}, r"unknown field\(s\) in 'chord': colour"),
    ("yes", r"'chord' must be a map or null"),
])  # fmt: skip
def test_a_hostile_chord_body_is_refused_by_what_is_wrong(chord_obj, error):
    import json

    body = json.dumps({"task": "t", "result": {"ttl": 5}, "chord": chord_obj}).encode()
    with pytest.raises(m.MessageError, match=error):
        m.decode(body)


@pytest.mark.parametrize("body, error", [
    (b'{"task":"t","chord":{"id":"g","members":[["q",1]],"final":"r","ttl":5}}', "a chord's member needs its result"),
    (b'{"task":"t","result":{"ttl":5},"chord":{"id":"g","members":[["q",1]],"final":"r","ttl":5},'
     b'"chain":{"then":[{"task":"a","queue":"q","addjob":[0]}],"final":"r","ttl":5}}', "carries no 'chain'"),
    (b'{"task":"t","args":[[1]],"errors":[{"at":3,"type":"E"}]}', r"'errors\[0\].at' must be a place"),
    (b'{"task":"t","args":[1],"errors":[{"at":0,"type":"E"}]}', "'errors' must be an array, and the first"),
    (b'{"task":"t","args":[[1]],"errors":[{"at":0}]}', r"'errors\[0\]' needs a 'type'"),
    (b'{"task":"t","args":[[1]],"errors":[{"at":0,"type":"E","why":1}]}', r"unknown field\(s\) in 'errors\[0\]'"),
])  # fmt: skip
def test_bad_chord_members_and_callbacks_are_refused(body, error):
    with pytest.raises(m.MessageError, match=error):
        m.decode(body)


def test_composing_chords_and_what_is_refused_before_anything_is_sent(offline):
    @offline.task
    def add(a, b):
        return a + b

    @offline.task
    def total(values):
        return sum(values)

    g = group(add.s(1, 2), add.s(3, 4))
    assert type(g | total.s()).__name__ == "Chord" and len(g | total.s() | add.s(1)) == 3
    assert type(add.s(1, 2) | g | total.s()).__name__ == "Chain" and len(chain(add.s(1, 2), g)) == 2
    assert chord(g, total.s(), on_error="call").group.on_error == "call"
    assert offline.chord([add.s(1, 2)], total.s()).group.on_error == "fail"
    with pytest.raises(ValueError, match='on_error must be "fail" or "call", not \'skip\''):
        offline.group(add.s(1, 2), on_error="skip")
    with pytest.raises(TypeError, match="a chain takes signatures"):
        chain(add.s(1, 2), lambda: 1)
    with pytest.raises(ValueError, match="a chord's group needs at least one signature"):
        (offline.group() | total.s()).send()
    with pytest.raises(ValueError, match=r"a chord's member needs a result \(result_ttl > 0\)"):
        (group(add.s(1, 2).with_options(result_ttl=0)) | total.s()).send()
    with pytest.raises(ValueError, match=r"a chord's member must be given back when its worker dies \(retry > 0\)"):
        (group(add.s(1, 2).with_options(retry=0, replicate=1)) | total.s()).send()
    with pytest.raises(ValueError, match=r"a chord's member's deduplication key is the chord's"):
        (group(add.s(1, 2).with_options(dedup="k")) | total.s()).send()
    with pytest.raises(TypeError, match="missing a required argument: 'b'"):
        (group(add.s(1)) | total.s()).send()  # the first step's members are given nothing
    with pytest.raises(TypeError, match="too many positional arguments"):
        (add.s(1, 2) | group(add.s(1, 2)) | total.s()).send()  # ... and later ones the value first
    with pytest.raises(ValueError, match=r"the last task of a chain needs a result"):
        (g | total.s().with_options(result_ttl=0)).send()


# ------------------------------------------------------------------------------ a real node
@pytest.fixture
def app(node):
    a = App(addr(node), result_ttl=60)
    yield a
    a.close()


def declare(app, q, runs=None):
    """The tasks of these tests on queue ``q``; ``runs`` (a list) records each run."""

    @app.task(queue=q, name="add", retry=2)
    def add(a, b):
        if runs is not None:
            runs.append(("add", current_task().job_id))
        return a + b

    @app.task(queue=q, name="boom", retries=0, retry=2)
    def boom(x):
        if runs is not None:
            runs.append(("boom", current_task().job_id))
        raise ValueError("no %s" % x)

    @app.task(queue=q + "-cb", name="total", retry=2)
    def total(values, extra=0):
        if runs is not None:
            runs.append(("total", current_task().job_id))
        return sum(values) + extra

    @app.task(queue=q + "-cb", name="describe", retry=2)
    def describe(values):
        if runs is not None:
            runs.append(("describe", current_task().job_id))
        return [v if not isinstance(v, TaskError) else "%s(%s)" % (v.type, v.message) for v in values]

    return add, boom, total, describe


def test_the_callback_gets_the_values_in_order_once_and_the_ids_are_known_before(app, run_worker):
    q = "ch-" + uuid.uuid4().hex[:8]
    runs: list[tuple[str, str]] = []
    add, boom, total, describe = declare(app, q, runs)
    run_worker(app, concurrency=4, queues=[q, q + "-cb"])
    ref = (group([add.s(i, i) for i in range(10)]) | total.s(extra=1000)).send()
    assert isinstance(ref, ChordRef) and len(ref.group) == 10
    assert ref.result(timeout=20) == sum(2 * i for i in range(10)) + 1000
    assert ref.group.results(timeout=5) == [2 * i for i in range(10)]  # the members' own results, in order
    # each member ran once, as the job named beforehand; the callback once, as the job ref.id names
    assert sorted(j for name, j in runs if name == "add") == sorted(ref.ids[0]) == sorted(ref.group.ids)
    assert [j for name, j in runs if name == "total"] == [ref.id] == [ref.ids[1]]
    assert ref.progress() == Progress(10, 10, 0) and str(ref.progress()) == "10/10"
    # Celery's spellings of the same
    assert chord([add.s(1, 2), add.s(3, 4)])(total.s()).get(timeout=20) == 10
    assert app.chord(app.group(add.s(1, 1)), total.s()).delay().result(timeout=20) == 2
    assert chord(group(add.s(5, 5)), total.s())().result(timeout=20) == 10


def test_a_failed_member_fails_the_chord_or_is_given_to_the_callback(app, run_worker):
    q = "ch-" + uuid.uuid4().hex[:8]
    runs: list[tuple[str, str]] = []
    add, boom, total, describe = declare(app, q, runs)
    run_worker(app, concurrency=4, queues=[q, q + "-cb"])
    failing = (group(add.s(1, 2), boom.s("luck"), add.s(3, 4), boom.s("way")) | total.s()).send()
    with pytest.raises(TaskError) as err:
        failing.result(timeout=20)
    members = failing.group.ids
    assert err.value.type == "ChordError"
    assert err.value.message == "2 of 4 members failed: member 1 (%s) ValueError: no luck; member 3 (%s) ValueError: " \
                                "no way" % (members[1], members[3])  # fmt: skip
    assert failing.progress() == Progress(4, 4, 2)
    assert not [name for name, _ in runs if name == "total"]  # the callback never ran
    assert raw_qlen(app, q + "-cb") == 0
    called = chord(group(add.s(1, 2), boom.s("luck"), add.s(3, 4)), describe.s(), on_error="call").send()
    assert called.result(timeout=20) == [3, "ValueError(no luck)", 7]
    # the failed members sent back from the dead letters (an operator's "requeue --all"): their
    # chords used their results, maybe long ago (the callback's key forgotten): none runs again
    wait_for(lambda: app.client().qlen(q + ".dead") == 3, timeout=10, what="the three dead letters")
    booms = [j for name, j in runs if name == "boom"]
    out = subprocess.run([sys.executable, "-m", "disque_py.cli", "dead", "requeue", q + ".dead", "--all", "--json",
                          "-n", app.nodes[0]], capture_output=True, text=True, timeout=60)  # fmt: skip
    assert out.returncode == 0, out.stdout + out.stderr
    new_ids = list(json.loads(out.stdout).values())
    assert len(new_ids) == 3
    wait_for(lambda: all((app.client().show(i) or {}).get("state") in (None, "acked") for i in new_ids), timeout=20,
             what="the members sent back acknowledged")  # fmt: skip
    assert [j for name, j in runs if name == "boom"] == booms and app.client().qlen(q + ".dead") == 0
    assert [j for name, j in runs if name == "describe"] == [called.id] and raw_qlen(app, q + "-cb") == 0


def test_values_only_msgpack_carries_reach_the_callback_whichever_member_ends_last(app, run_worker):
    q = "ch-" + uuid.uuid4().hex[:8]
    add, boom, total, describe = declare(app, q)

    @app.task(queue=q, name="blob", serializer="msgpack", retry=2)
    def blob(n):
        return b"\x00" * n

    @app.task(queue=q + "-cb", name="keep", serializer="msgpack", retry=2)
    def keep(values):
        return values

    run_worker(app, concurrency=4, queues=[q, q + "-cb"])
    for _ in range(3):  # a JSON member or a msgpack one may end last: the same callback either way
        assert (group(add.s(1, 2), blob.s(2), add.s(3, 4)) | keep.s()).send().result(timeout=20) == [3, b"\x00\x00", 7]
    with pytest.raises(TaskError, match="ChordError: 1 of 2 members failed"):  # failed: whatever the forms
        (group(blob.s(1), boom.s(1)) | keep.s()).send().result(timeout=20)


def raw_qlen(app, queue):
    return app.client().qlen(queue)


def test_groups_inside_chains(app, run_worker):
    q = "ch-" + uuid.uuid4().hex[:8]
    add, boom, total, describe = declare(app, q)
    run_worker(app, concurrency=4, queues=[q, q + "-cb"])
    # a task, then a group given its value, then the callback given the group's values, then more
    ref = (add.s(1, 2) | group(add.s(10), add.s(20), add.si(100, 200)) | total.s() | add.s(1000)).send()
    assert ref.result(timeout=20) == (13 + 23 + 300) + 1000
    assert isinstance(ref.ids[0], str) and len(ref.ids[1]) == 3 and all(isinstance(i, str) for i in ref.ids[2:])
    # the ids named beforehand are the jobs that ran (their results are there)
    assert GroupRef.for_jobs(app, ref.ids[1]).results(timeout=5) == [13, 23, 300]
    # a chain that ends with a group: its result is the list of values
    assert (add.s(1, 1) | group(add.s(1), add.s(2))).send().result(timeout=20) == [3, 4]
    # a group after a group: each member of the second is given the first's values
    assert (group(add.s(1, 1), add.s(2, 2)) | group(total.s(), total.s(extra=1)) | describe.s()).send().result(
        timeout=20) == [6, 7]  # fmt: skip
    # a chain whose group fails ends there, with the chord's error
    with pytest.raises(TaskError, match="ChordError: 1 of 2 members failed"):
        (add.s(1, 1) | group(add.s(1), boom.s()) | total.s()).send().result(timeout=20)


def test_progress_is_read_from_the_cluster_from_any_process(cluster3, run_worker):
    q = "ch-" + uuid.uuid4().hex[:8]
    here, there = App(addr(cluster3[0]), result_ttl=60), App(addr(cluster3[2]), result_ttl=60)
    try:
        gate = threading.Event()

        @here.task(queue=q, name="wait", retry=30)
        def wait(n):
            if n >= 3:
                gate.wait(20)
            return n

        @here.task(queue=q + "-cb", name="total")
        def total(values):
            return sum(values)

        ref = (group([wait.s(n) for n in range(6)]) | total.s()).send()
        elsewhere = GroupRef.for_jobs(there, ref.group.ids)  # another app, on another node: the IDs are all it has
        assert elsewhere.progress() == Progress(0, 6)
        run_worker(here, concurrency=6, queues=[q, q + "-cb"])
        wait_for(lambda: elsewhere.progress().done == 3, timeout=20, what="3 of 6 done")
        assert elsewhere.progress() == Progress(3, 6, 0) and str(elsewhere.progress()) == "3/6"
        gate.set()
        assert ref.result(timeout=20) == 15
        assert elsewhere.progress() == Progress(6, 6, 0)
    finally:
        here.close()
        there.close()


def test_a_member_whose_worker_died_on_its_last_delivery_still_completes_its_chord(app, node, run_worker):
    q = "ch-" + uuid.uuid4().hex[:8]
    add, boom, total, describe = declare(app, q)

    @app.task(queue=q + "-lost", name="lost", retries=0, retry=1)
    def lost(x):
        return x

    refs = {}
    for policy in ("fail", "call"):
        ref = refs[policy] = chord(group(add.s(1, 2), lost.s(5), add.s(3, 4)), describe.s(), on_error=policy).send()
        # its only run (retries=0) is taken by a worker that dies before it writes or acknowledges anything
        dying = raw(node)
        assert dying.execute_command("GETJOB", "TIMEOUT", 5000, "FROM", q + "-lost")[0][1].decode() == ref.group.ids[1]
        dying.close()
    # a chord's member has one delivery more than its retries: after its RETRY (1 s) the node
    # queues it again, and the worker that takes it runs nothing: a WorkerLost result, the check
    run_worker(app, concurrency=4, queues=[q, q + "-cb", q + "-lost"])
    lost_text = "the worker of its last run (delivery 1) was lost before it wrote a result"
    with pytest.raises(TaskError) as err:
        refs["fail"].result(timeout=20)
    assert err.value.message == "1 of 3 members failed: member 1 (%s) WorkerLost: %s" % (refs["fail"].group.ids[1],
                                                                                        lost_text)  # fmt: skip
    assert refs["call"].result(timeout=20) == [3, "WorkerLost(%s)" % lost_text, 7]
    for ref in refs.values():
        with pytest.raises(TaskError, match="WorkerLost"):
            ref.group.refs[1].result(timeout=5)
    dead: dict[str, str] = {}

    def two_dead_letters():
        for job in app.client().get_jobs(q + "-lost.dead", count=10, timeout_ms=200):
            dead[job.dead_letter_of] = job.dead_letter_reason
            app.client().ack(job.id)
        return len(dead) == 2

    wait_for(two_dead_letters, timeout=10, what="the two members' dead letters")
    assert dead == {ref.group.ids[1]: "WorkerLost: " + lost_text for ref in refs.values()}


def test_a_member_lost_twice_in_a_row_waits_as_a_dead_letter_until_it_is_sent_back(app, node, run_worker):
    q = "ch-" + uuid.uuid4().hex[:8]
    add, boom, total, describe = declare(app, q)

    @app.task(queue=q + "-lost", name="lost", retries=0, retry=1)
    def lost(x):
        return x

    ref = chord(group(add.s(1, 2), lost.s(5), add.s(3, 4)), describe.s(), on_error="call").send()
    # its last run and the spare delivery after it, each taken by a worker that dies: the node
    # dead-letters it with no result written (the limit docs/TASKS.md names)
    for delivery in (1, 2):
        dying = raw(node)
        taken = dying.execute_command("GETJOB", "TIMEOUT", 5000, "WITHCOUNTERS", "FROM", q + "-lost")
        assert taken[0][1].decode() == ref.group.ids[1], delivery
        dying.close()
    wait_for(lambda: app.client().qlen(q + "-lost.dead") == 1, timeout=10, what="the member's dead letter")
    run_worker(app, concurrency=4, queues=[q, q + "-cb", q + "-lost"])
    wait_for(lambda: ref.progress() == Progress(3, 3, 1), timeout=20, what="the other members done")
    assert not ref.done()  # the chord waits: the member has no result
    # sent back by the operator (a new job with a new ID): its body names the result its chord reads
    out = subprocess.run([sys.executable, "-m", "disque_py.cli", "dead", "requeue", q + "-lost.dead", "--all", "-n",
                          addr(node)], capture_output=True, text=True, timeout=60)  # fmt: skip
    assert out.returncode == 0, out.stdout + out.stderr
    assert ref.result(timeout=20) == [3, 5, 7]
    assert ref.group.results(timeout=5) == [3, 5, 7]


def member_messages(app, ref):
    """The bodies of a chord's members, as their workers would decode them (SHOW where they are)."""
    out = []
    for job_id in ref.group.ids:
        show = app.client().show(job_id)
        out.append((job_id, m.decode(show["body"])[0]))
    return out


class _Job:
    def __init__(self, job_id):
        self.id = job_id


def test_two_last_members_add_one_callback_and_without_its_key_two(app):
    q = "ch-" + uuid.uuid4().hex[:8]
    add, boom, total, describe = declare(app, q)
    client = app.client()

    def finish_two_at_once(ref):
        """Both members' results are written, then both members check at the same moment (what
        two workers that finish the last two members together do): each finds every result."""
        members = member_messages(app, ref)
        for (job_id, msg), value in zip(members, (3, 7)):
            client.add_job(m.result_queue(job_id), m.encode_outcome(m.Outcome(True, value)), ttl=60, retry=5,
                           dedup=RESULT_DEDUP)  # fmt: skip

        async def main():
            from disque_py.client.aio import Client as AsyncClient

            async with AsyncClient(app.nodes) as aclient:
                async with trio.open_nursery() as nursery:
                    for job_id, msg in members:
                        nursery.start_soon(writes.complete_chord, aclient, _Job(job_id), msg, "json")

        trio.run(main)

    ref = (group(add.s(1, 2), add.s(3, 4)) | total.s()).send()
    finish_two_at_once(ref)
    assert client.qlen(q + "-cb") == 1  # two adds, one key: one callback
    [job] = client.qpeek(q + "-cb", 10)
    assert job.id == ref.id and m.decode(job.body)[0].args == ([3, 7],)
    client.del_job(job.id)
    # the same with the callback's key taken away (each add its own): the callback is doubled
    keys = iter(range(1000))
    original = writes.chord_key
    writes.chord_key = lambda group_id: "chord:%s:%d" % (group_id, next(keys))
    try:
        finish_two_at_once((group(add.s(1, 2), add.s(3, 4)) | total.s()).send())
    finally:
        writes.chord_key = original
    assert client.qlen(q + "-cb") == 2
    for job in client.qpeek(q + "-cb", 10):
        client.del_job(job.id)


def test_a_check_that_fails_before_the_ack_is_made_again_by_the_member_not_lost(app, run_worker, monkeypatch):
    q = "ch-" + uuid.uuid4().hex[:8]
    runs: list[tuple[str, str]] = []
    add, boom, total, describe = declare(app, q, runs)
    real = chords.gather
    failed: list[str] = []

    async def gather_dies_once(client, spec):
        outcomes = await real(client, spec)
        if outcomes is not None and not failed:  # the last member, between its result and its check
            failed.append(spec.id)
            raise ConnectionError("the check died here (a worker killed, a node gone)")
        return outcomes

    monkeypatch.setattr(chords, "gather", gather_dies_once)
    settled: list[tuple[str, int, bool]] = []
    real_settle = runner.settle_member

    async def settle(client, job, message, serializer, last):
        done = await real_settle(client, job, message, serializer, last)
        settled.append((job.id, job.attempt, done))
        return done

    monkeypatch.setattr(runner, "settle_member", settle)
    run_worker(app, concurrency=4, queues=[q, q + "-cb"])
    ref = (group([add.s(i, 1) for i in range(5)]) | total.s()).send()
    # the member whose check died was not acknowledged: it came back (its backoff, 1 s), did not
    # run again (its result was there), checked, and added the callback
    assert ref.result(timeout=20) == sum(i + 1 for i in range(5))
    # recorded once it returned: every first delivery runs, and one second delivery, settled
    wait_for(lambda: len(settled) == 6, timeout=5, what="the members' settling")
    assert failed and sorted((attempt, done) for _, attempt, done in settled) == [(1, False)] * 5 + [(2, True)]
    assert sorted(j for name, j in runs if name == "add") == sorted(ref.group.ids)  # each member ran once
    assert [j for name, j in runs if name == "total"] == [ref.id]
