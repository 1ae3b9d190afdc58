"""Queue introspection, scanning, pausing and eviction on one core."""

from __future__ import annotations

import subprocess
import sys

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from disque_py.core.effects import BLOCKED, Reply
from disque_py.core.job import ACKED, QUEUED
from disque_py.core.replies import NULL_ARRAY, Status

from .conftest import NODE_ID, Harness


def qstat(h, name) -> dict:
    reply = h.cmd("QSTAT", name)
    return {reply[i].decode(): reply[i + 1] for i in range(0, len(reply), 2)}


def test_qpeek_positive_and_negative(h):
    ids = [h.add("q", str(i)) for i in range(5)]
    assert [j[1] for j in h.cmd("QPEEK", "q", 2)] == ids[:2]
    assert [j[1] for j in h.cmd("QPEEK", "q", -2)] == [ids[4], ids[3]]
    assert [j[1] for j in h.cmd("QPEEK", "q", 100)] == ids
    assert h.cmd("QPEEK", "q", 1) == [[b"q", ids[0], b"0"]]
    assert h.cmd("QPEEK", "missing", 3) == []
    assert h.cmd("QPEEK", "q", "x") == "ERR value is not an integer or out of range"
    assert h.cmd("QLEN", "q") == 5  # peeking consumes nothing


def test_qstat_fields_and_counters(h):
    assert h.cmd("QSTAT", "none") is NULL_ARRAY
    h.add("q")
    h.add("q")
    h.cmd("GETJOB", "FROM", "q")
    h.advance(3_000)
    stat = qstat(h, "q")
    assert list(stat) == [
        "name", "len", "age", "idle", "blocked", "import-from", "import-rate", "jobs-in", "jobs-out", "pause",
    ]  # fmt: skip
    assert stat["name"] == b"q"
    assert stat["len"] == 1
    assert stat["age"] == 3 and stat["idle"] == 3
    assert stat["jobs-in"] == 2 and stat["jobs-out"] == 1
    assert stat["import-from"] == [] and stat["import-rate"] == 0
    assert stat["pause"] == "none"


def test_pause_options(h):
    assert h.cmd("PAUSE", "q", "state") == b"none"
    assert h.cmd("QSTAT", "q") is NULL_ARRAY  # state does not create the queue
    assert h.cmd("PAUSE", "q", "in", "out") == b"all"
    assert h.cmd("PAUSE", "q", "state") == b"all"
    assert h.cmd("PAUSE", "q", "none") == b"none"
    assert h.cmd("PAUSE", "q", "out") == b"out"
    assert h.cmd("PAUSE", "q", "all") == b"all"
    assert h.cmd("PAUSE", "q", "none", "in") == b"in"
    assert h.cmd("PAUSE", "q", "bcast", "state") == b"in"
    assert h.cmd("PAUSE", "q", "sideways") == (
        "ERR syntax error near 'sideways': PAUSE takes IN, OUT, ALL, NONE, STATE, BCAST")
    assert h.cmd("PAUSE", "q") == "ERR wrong number of arguments for 'pause' command"
    assert isinstance(h.cmd("PAUSE", "q", "none"), Status)


def test_queue_evicted_when_empty_and_idle_unless_paused(h):
    jid = h.add("q")
    h.cmd("PAUSE", "p", "in")
    h.cmd("ACKJOB", jid)
    h.advance(200_000)
    assert h.node.info_fields()["queues"]["registered_queues"] == 2
    h.advance(101_000)
    assert h.cmd("QSTAT", "q") is NULL_ARRAY
    assert qstat(h, "p")["pause"] == "in"
    # a queue with a blocked client is never evicted
    assert h.cmd("GETJOB", "FROM", "w", client=9) is BLOCKED
    h.advance(400_000)
    assert qstat(h, "w")["blocked"] == 1


def test_qscan_iterates_everything_with_filters(h):
    for i in range(250):
        h.add("q%03d" % i, "x")
    for _ in range(3):
        h.add("q007", "x")
    seen = set()
    cursor = b"0"
    calls = 0
    while True:
        cursor, names = h.cmd("QSCAN", cursor, "COUNT", 20)
        seen.update(names)
        calls += 1
        if cursor == b"0":
            break
    assert len(seen) == 250 and calls > 5
    cursor, names = h.cmd("QSCAN", "BUSYLOOP", "MINLEN", 2)
    assert (cursor, names) == (b"0", [b"q007"])
    cursor, names = h.cmd("QSCAN", "MAXLEN", 1, "BUSYLOOP", "0")
    assert len(names) == 249
    assert h.cmd("QSCAN", "BUSYLOOP", "IMPORTRATE", 1) == [b"0", []]
    assert h.cmd("QSCAN", "abc") == "ERR invalid cursor"
    assert h.cmd("QSCAN", "0", "1") == "ERR syntax error near '1': the cursor was given already"
    assert h.cmd("QSCAN", "0", "MINLEN") == "ERR syntax error near 'MINLEN': a value must follow it"
    assert h.cmd("JSCAN", "0", "STATE") == "ERR syntax error near 'STATE': a value must follow it"
    assert h.cmd("JSCAN", "0", "7") == "ERR syntax error near '7': the cursor was given already"
    assert h.cmd("QSCAN", "COUNT", "x") == "ERR value is not an integer or out of range"


@pytest.mark.invariants_by_hand  # queues holding jobs are deleted under the node's feet
def test_qscan_cursor_survives_deletions(h):
    for i in range(100):
        h.add("q%03d" % i)
    cursor, first = h.cmd("QSCAN", "COUNT", 10)
    # delete queues already returned and some not yet returned
    for name in first[:5]:
        del h.node.queues[name]
    for name in [b"q050", b"q051"]:
        del h.node.queues[name]
    rest = set()
    while cursor != b"0":
        cursor, names = h.cmd("QSCAN", cursor, "COUNT", 10)
        rest.update(names)
    expected = {b"q%03d" % i for i in range(100)} - set(first) - {b"q050", b"q051"}
    assert rest == expected


def test_jscan_filters_and_reply_types(h):
    queued = [h.add("a") for _ in range(3)]
    active = h.add("b")
    h.cmd("GETJOB", "FROM", "b")
    cursor, ids = h.cmd("JSCAN", "BUSYLOOP")
    assert cursor == b"0" and set(ids) == set(queued + [active])
    assert all(type(i) is Status for i in ids)
    assert h.cmd("JSCAN", "BUSYLOOP", "QUEUE", "b")[1] == [active]
    assert set(h.cmd("JSCAN", "STATE", "queued", "BUSYLOOP")[1]) == set(queued)
    assert set(h.cmd("JSCAN", "STATE", "queued", "STATE", "active", "BUSYLOOP")[1]) == set(queued + [active])
    full = h.cmd("JSCAN", "0", "QUEUE", "b", "REPLY", "all")[1]
    assert full[0][:2] == [b"id", active] and full[0][-2:] == [b"body", b"body"]
    assert h.cmd("JSCAN", "STATE", "nope") == "ERR Invalid job state name"
    assert h.cmd("JSCAN", "REPLY", "some") == "ERR Invalid REPLY type, try ID or ALL"


def test_jscan_in_pieces_and_hostile_cursors(h):
    ids = {h.add("q%d" % (i % 3)) for i in range(300)}
    seen, cursor, calls = [], b"0", 0
    while True:  # COUNT 7 per call: the cursor walks shard after shard, nothing twice
        cursor, piece = h.cmd("JSCAN", cursor, "COUNT", "7")
        seen += piece
        calls += 1
        if cursor == b"0":
            break
    assert calls > 10 and len(seen) == len(set(seen)) and set(seen) == ids
    for bad in ("-1", "abc", "1.5", "99999999999999999999999999", "18446744073709551616"):
        assert h.cmd("JSCAN", bad) == "ERR invalid cursor"
    # a made-up cursor in range is the client's business: a valid, shorter scan, not an error
    cursor, piece = h.cmd("JSCAN", "63", "COUNT", "1000")
    assert cursor == b"0" and set(piece) <= ids
    assert h.cmd("JSCAN", str(2**62 + 63), "COUNT", "5") == [b"0", []]  # past the last shard's end


def test_jscan_paginates(h):
    ids = {h.add("q") for _ in range(120)}
    seen = set()
    cursor = b"0"
    while True:
        cursor, batch = h.cmd("JSCAN", cursor, "COUNT", 7)
        assert len(batch) <= 7
        seen.update(batch)
        if cursor == b"0":
            break
    assert seen == ids


def test_hello_single_node(h):
    assert h.cmd("HELLO") == [1, NODE_ID.encode(), [NODE_ID.encode(), b"127.0.0.1", b"7711", b"1"]]


def test_flushall_unblocks_and_forgets(h):
    h.add("q")
    assert h.cmd("GETJOB", "FROM", "empty", client=4) is BLOCKED
    h.node.flushall()
    assert h.replies() == {4: NULL_ARRAY}
    assert len(h.node.store) == 0 and not h.node.queues


def test_core_imports_without_trio_or_io():
    code = (
        "import sys\n"
        "class Block:\n"
        "    def find_spec(self, name, path, target=None):\n"
        "        if name.split('.')[0] in ('trio', 'socket', 'asyncio', 'selectors'):\n"
        "            raise ImportError('blocked: ' + name)\n"
        "sys.meta_path.insert(0, Block())\n"
        "import disque_py.core.node, disque_py.core.commands, disque_py.core.store\n"
        "assert 'trio' not in sys.modules\n"
        "print('ok')\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "ok"


# ---------------------------------------------------------------- invariants under random traffic
OPS = st.lists(
    st.tuples(
        st.sampled_from(["add", "add0", "get", "ack", "fastack", "nack", "enqueue", "dequeue", "working", "advance", "block", "close"]),
        st.integers(0, 50),
    ),
    max_size=120,
)


@settings(max_examples=150, deadline=None)
@given(OPS)
def test_random_traffic_keeps_invariants(ops):
    h = Harness()
    node = h.node
    known: list[bytes] = []
    delivered_at_most_once: set[bytes] = set()
    for op, arg in ops:
        if op == "add":
            known.append(h.add("q", "b", "RETRY", 1 + arg % 5, "TTL", 60))
        elif op == "add0":
            known.append(h.add("q", "b", "RETRY", 0, "TTL", 60))
        elif op == "get":
            reply = h.cmd("GETJOB", "NOHANG", "COUNT", 1 + arg % 3, "FROM", "q")
            if reply is not NULL_ARRAY:
                for _, jid, _ in reply:
                    if int(jid[-4:], 16) % 2 == 0:
                        assert jid not in delivered_at_most_once, "RETRY 0 job delivered twice"
                        delivered_at_most_once.add(jid)
        elif op == "block":
            h.cmd("GETJOB", "TIMEOUT", 1 + arg * 100, "FROM", "q", client=100 + arg % 4)
        elif op == "close":
            node.client_closed(100 + arg % 4)
        elif op == "advance":
            for effect in h.advance(arg * 400):
                if isinstance(effect, Reply) and effect.value is not NULL_ARRAY:
                    for _, jid, _ in effect.value:
                        if int(jid[-4:], 16) % 2 == 0:
                            assert jid not in delivered_at_most_once
                            delivered_at_most_once.add(jid)
        elif known:
            jid = known[arg % len(known)]
            cmd = {"ack": "ACKJOB", "fastack": "FASTACK", "nack": "NACK", "enqueue": "ENQUEUE",
                   "dequeue": "DEQUEUE", "working": "WORKING"}[op]  # fmt: skip
            h.cmd(cmd, jid)
        for effect in h.effects():
            if isinstance(effect, Reply) and effect.value is not NULL_ARRAY:
                for _, jid, _ in effect.value:
                    if int(jid[-4:], 16) % 2 == 0:
                        assert jid not in delivered_at_most_once
                        delivered_at_most_once.add(jid)
        # ONE_TIMER and queue consistency, after every step
        queued = 0
        for job in node.store.values():
            assert job.awake > 0, job
            if job.state == QUEUED:
                queued += 1
                assert job in node.queues[job.queue].jobs
            assert job.state != ACKED  # single node: acked jobs are collected at once
        assert queued == sum(len(q.jobs) for q in node.queues.values())
        assert node.blocked_clients == len(node.blocking.blocked)
        for q in node.queues.values():
            assert q.blocked == sum(1 for w in node.blocking.blocked.values() if q.name in w.queues)


@pytest.mark.parametrize("n", [1, 3])
def test_timers_fire_in_order_with_many_jobs(h, n):
    ids = [h.add("q", str(i), "RETRY", 1 + i % 7, "TTL", 3600) for i in range(200 * n)]
    for _ in ids:
        h.cmd("GETJOB", "FROM", "q")
    h.advance(8_000)
    assert h.cmd("QLEN", "q") == len(ids)


def test_blocked_clients_are_served_first_come_first_served_past_timeouts(h):
    """Waiters are served in arrival order, skipping the ones that timed out, also when the list
    is compacted and new clients block meanwhile; an empty queue keeps no job list."""
    quitters = [c for c in range(1, 101) if c % 3 == 0]  # give up after 1 s; the others wait for good
    stayers = [c for c in range(1, 101) if c % 3]
    for c in range(1, 101):
        timeout = 1000 if c in quitters else 0
        assert h.cmd("GETJOB", "TIMEOUT", timeout, "FROM", "q", "other", client=c) is BLOCKED
    q = h.node.queues[b"q"]
    assert q.jobs == () and len(q.waiters) == 100
    assert h.replies() == {}
    timed_out = {e.client: e.value for e in h.advance(1500) if isinstance(e, Reply)}
    assert sorted(timed_out) == quitters and all(v is NULL_ARRAY for v in timed_out.values())
    assert qstat(h, "q")["blocked"] == len(stayers)
    served = []
    for i in range(len(stayers) + 1):
        h.add("q", str(i))
        ((client, reply),) = h.replies().items()
        assert reply[0][2] == str(i).encode()
        served.append(client)
        if i == 10:  # a late client joins the end of the line
            assert h.cmd("GETJOB", "FROM", "q", client=500) is BLOCKED
    assert served == stayers + [500]
    assert qstat(h, "q")["blocked"] == 0 and q.waiters == () and len(q) == 0
    h.add("q", "kept")
    assert h.cmd("GETJOB", "NOHANG", "FROM", "q", client=600)[0][2] == b"kept"


def test_an_idle_empty_queue_gives_back_its_job_list_and_works_on(h):
    jid = h.add("q")
    h.cmd("ACKJOB", jid)
    h.advance(5_000)
    assert type(h.node.queues[b"q"].jobs) is not tuple  # still its deque: not idle for long yet
    h.advance(7_000)
    assert h.node.queues[b"q"].jobs == ()  # the 760 bytes of an empty deque given back
    assert h.cmd("QPEEK", "q", 1) == [] and h.cmd("QLEN", "q") == 0
    ids = [h.add("q", "b%d" % i) for i in range(3)]
    assert [row[1] for row in h.cmd("QPEEK", "q", -2)] == ids[:0:-1]
    assert h.cmd("GETJOB", "NOHANG", "FROM", "q")[0][1] == ids[0]
    assert qstat(h, "q")["len"] == 2


# -- the queue's container: a deque while cheap, a sorted list past SMALL_QUEUE -------------------


def _jobs(ctimes):
    from disque_py.core.job import Job

    return [Job(b"D-%038d" % i, QUEUED, b"q", b"x", ctime=c) for i, c in enumerate(ctimes)]


@settings(max_examples=200, deadline=None)
@given(
    ops=st.lists(st.tuples(st.sampled_from(["add", "pop", "remove"]), st.integers(0, 50)), max_size=120),
    small=st.sampled_from([2, 8, 10_000]),
)
def test_a_queue_is_always_in_ctime_order_whatever_its_container(ops, small):
    """Adds out of order, pops and removes from the middle, in a deque (small queues) and past the
    switch to a sorted list: the queue always hands out its jobs oldest first, as a sorted model."""
    from disque_py.core import queues

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(queues, "SMALL_QUEUE", small)
        _check_against_a_sorted_model(queues.Queue(b"q", 0, 1), ops)


def _check_against_a_sorted_model(q, ops) -> None:
    model: list = []
    seq = 0
    for op, n in ops:
        if op == "add":
            (job,) = _jobs([n * 10 + seq % 10])
            job.id = b"D-%038d" % seq
            seq += 1
            q.add(job)
            model.append(job)
            model.sort(key=lambda j: j.ctime)  # stable: equal ctimes keep their arrival order
        elif op == "pop":
            assert q.pop() is (model.pop(0) if model else None)
        elif model:
            victim = model.pop(n % len(model))
            q.remove(victim)
        assert list(q.jobs) == model
        assert len(q) == len(model)
        assert list(q.peek(3)) == model[:3]
        assert list(q.peek(-3)) == model[::-1][:3]
        q.release()
        assert (q.jobs == ()) == (not model)


def test_a_long_queue_turns_into_a_sorted_list_only_when_it_must(monkeypatch):
    from disque_py.core import queues

    monkeypatch.setattr(queues, "SMALL_QUEUE", 4)
    q = queues.Queue(b"q", 0, 1)
    jobs = _jobs([10, 20, 30, 40, 50, 60])
    for job in jobs:
        q.add(job)  # in order: appends, however long
    assert type(q.jobs).__name__ == "deque"
    q.remove(jobs[0])  # the head: a popleft
    assert type(q.jobs).__name__ == "deque"
    (late,) = _jobs([15])
    q.add(late)  # older than the tail of a queue past SMALL_QUEUE: a sorted list from now on
    assert type(q.jobs).__name__ == "SortedKeyList"
    assert [j.ctime for j in q.jobs] == [15, 20, 30, 40, 50, 60]
    while q.pop() is not None:
        pass
    q.release()
    q.add(late)
    assert type(q.jobs).__name__ == "deque"  # empty, released: a deque again
