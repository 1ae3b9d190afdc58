"""ADDJOB's PRIORITY (ours): higher delivered first, FIFO within a priority, on one node and
through federation; a job without one exactly as before (core/queues.py, core/job.py)."""

from __future__ import annotations

from collections import deque

import pytest

from disque_py.core.effects import BLOCKED
from disque_py.core.job import F_PRIORITY, PRIORITY_DEFAULT, job_priority
from disque_py.core.queues import SMALL_QUEUE
from disque_py.core.wire import JOB_WIRE_FIELDS, extra_to_wire, job_from_wire, job_to_wire

from .conftest import Harness
from .test_delivery import show
from .test_hostile_peers import PEER, VALID_JOB
from .wired import Wired


def bodies(reply) -> list[bytes]:
    return [bytes(item[2]) for item in reply]


def getjobs(h, count: int, queue="q") -> list[bytes]:
    return bodies(h.cmd("GETJOB", "NOHANG", "COUNT", count, "FROM", queue))


# =============================================================== one node
def test_ten_high_jobs_added_after_a_thousand_low_ones_come_first(h):
    for i in range(1000):
        h.add("q", "low%d" % i, "PRIORITY", 1)
    for i in range(10):
        h.add("q", "high%d" % i, "PRIORITY", 9)
    assert getjobs(h, 10) == [b"high%d" % i for i in range(10)]
    assert getjobs(h, 3) == [b"low0", b"low1", b"low2"]  # then the low ones, FIFO


def test_fifo_within_each_priority_and_default_between_4_and_6(h):
    order = [(3, "a"), (5, "b"), (7, "c"), (3, "d"), (None, "e"), (7, "f"), (0, "g"), (9, "h"), (4, "i"),
             (6, "j"), (None, "k")]  # fmt: skip
    for p, body in order:
        h.add("q", body, *(["PRIORITY", p] if p is not None else []))
    got = getjobs(h, len(order))
    # sorted by priority, highest first; ties in the order added (the default is 5)
    expected = [body for _, body in sorted(order, key=lambda pb: -(pb[0] if pb[0] is not None else 5))]
    assert got == [b.encode() for b in expected] == [b"h", b"c", b"f", b"j", b"b", b"e", b"k", b"i", b"a", b"d", b"g"]


def test_jobs_without_priority_keep_todays_queue_exactly(h):
    ids = [h.add("q", "j%d" % i) for i in range(SMALL_QUEUE + 10)]
    q = h.node.queues[b"q"]
    assert type(q.jobs) is deque  # in-order appends, as before
    assert [bytes(j.id) for j in q.jobs] == ids
    assert all(job_priority(j) == PRIORITY_DEFAULT and not j.flags & F_PRIORITY for j in q.jobs)
    h.add("q", "x", "PRIORITY", 5)  # PRIORITY 5 is the default: the same job as without it
    assert type(q.jobs) is deque and not q.jobs[-1].flags & F_PRIORITY
    assert getjobs(h, 3) == [b"j0", b"j1", b"j2"]


def test_a_queue_turned_prioritized_orders_old_jobs_and_returns_to_a_deque_once_empty(h):
    for i in range(SMALL_QUEUE + 5):
        h.add("q", "d%d" % i, "RETRY", 60)
    first = bytes(h.cmd("GETJOB", "FROM", "q")[0][1])
    assert h.cmd("NACK", first) == 1  # an old job back into a long queue: the list sorted by ctime
    q = h.node.queues[b"q"]
    assert type(q.jobs) is not deque and q.jobs.key is not None
    h.add("q", "urgent", "PRIORITY", 8)
    h.add("q", "later", "PRIORITY", 2)
    h.add("q", "d-last")
    got = getjobs(h, SMALL_QUEUE + 8)
    assert got[:2] == [b"urgent", b"d0"] and got[-2:] == [b"d-last", b"later"]
    assert h.cmd("QLEN", "q") == 0
    h.add("q", "again")
    assert type(q.jobs) is deque  # a queue emptied is an ordinary one again


def test_requeued_and_dequeued_jobs_keep_their_place_by_priority(h):
    low = h.add("q", "low", "PRIORITY", 2, "RETRY", 10)
    high = h.add("q", "high", "PRIORITY", 8, "RETRY", 10)
    mid = h.add("q", "mid", "RETRY", 10)
    assert getjobs(h, 1) == [b"high"]
    assert h.cmd("NACK", high) == 1  # back in the queue: first again
    assert [bytes(j[1]) for j in h.cmd("QPEEK", "q", 10)] == [high, mid, low]
    assert h.cmd("DEQUEUE", mid) == 1
    assert [bytes(j[1]) for j in h.cmd("QPEEK", "q", 10)] == [high, low]
    assert h.cmd("ENQUEUE", mid) == 1
    assert [bytes(j[1]) for j in h.cmd("QPEEK", "q", 10)] == [high, mid, low]
    assert [bytes(j[1]) for j in h.cmd("QPEEK", "q", -2)] == [low, mid]  # the last to go, last first
    assert h.cmd("ACKJOB", high) == 1
    assert getjobs(h, 5) == [b"mid", b"low"]


def test_show_and_jscan_have_priority_only_for_a_job_with_one(h):
    plain = h.add("q", "plain")
    five = h.add("q", "five", "PRIORITY", 5)
    high = h.add("q", "high", "PRIORITY", 9, "MAXDELIVER", 3)
    zero = h.add("q", "zero", "PRIORITY", 0)
    assert "priority" not in show(h, plain) and "priority" not in show(h, five)
    fields = list(show(h, high))
    assert fields[fields.index("body") + 1] == "priority"  # after Disque's fields, before the policy's
    assert show(h, high)["priority"] == 9 and show(h, high)["maxdeliver"] == 3
    assert show(h, zero)["priority"] == 0
    cursor, items = h.cmd("JSCAN", "REPLY", "ALL")
    by_id = {bytes(i[1]): dict(zip(i[0::2], i[1::2])) for i in items}
    assert by_id[high][b"priority"] == 9 and by_id[zero][b"priority"] == 0 and b"priority" not in by_id[plain]


@pytest.mark.parametrize("value", ["10", "-1", "x", "", "1.5", "05", "99999999999999999999999"])
def test_a_bad_priority_is_refused_and_changes_nothing(h, value):
    h.add("q", "there")
    reply = h.cmd("ADDJOB", "q", "body", 0, "PRIORITY", value)
    assert reply == "ERR PRIORITY must be a number from 0 to 9 (higher first)"
    assert h.cmd("ADDJOB", "q", "body", 0, "PRIORITY") == "ERR syntax error near 'PRIORITY': a value must follow it"
    assert h.cmd("QLEN", "q") == 1 and len(h.node.store) == 1
    assert h.cmd("ADDJOB", "q", "body", 0, "PRIORITY", value) == reply  # not remembered as parsed


def test_the_same_options_parsed_once_give_each_job_its_priority(h):
    for _ in range(3):  # the second and third ADDJOB take the parsed options (commands.py)
        h.add("q", "high", "PRIORITY", 7, "RETRY", 30)
        h.add("q", "low", "PRIORITY", 1, "RETRY", 30)
        h.add("q", "dedup", "PRIORITY", 7, "RETRY", 30, "DEDUP", "k%d" % _)
    assert getjobs(h, 9) == [b"high", b"dedup"] * 3 + [b"low"] * 3


# =============================================================== the wire
def test_the_wire_carries_a_priority_and_an_older_array_reads_as_the_default(h):
    job_id = h.add("q", "b", "PRIORITY", 9)
    job = h.node.store.get(job_id)
    wire = job_to_wire(job, h.now)
    assert len(wire) == JOB_WIRE_FIELDS + 2 and wire[JOB_WIRE_FIELDS] is None and wire[-1] == 9
    back = job_from_wire(wire, h.now)
    assert back is not None and job_priority(back) == 9 and back.extra is None
    # a node of before priorities reads only the first fields: the job at the default
    older = job_from_wire(wire[:JOB_WIRE_FIELDS], h.now)
    assert older is not None and job_priority(older) == PRIORITY_DEFAULT and older.flags == 0
    # with an Extra, the priority follows its map
    both = h.node.store.get(h.add("q", "b", "PRIORITY", 0, "MAXDELIVER", 2))
    wire = job_to_wire(both, h.now)
    assert wire[JOB_WIRE_FIELDS] == extra_to_wire(both.extra) and wire[-1] == 0
    back = job_from_wire(wire, h.now)
    assert job_priority(back) == 0 and back.extra == both.extra
    # a job without one travels exactly as before
    plain = h.node.store.get(h.add("q", "b"))
    assert len(job_to_wire(plain, h.now)) == JOB_WIRE_FIELDS


@pytest.mark.parametrize("bad", [10, -1, 2**70, "9", b"9", 9.0, True, [9], {"p": 9}])
def test_a_peers_bad_priority_is_refused_and_counted(bad):
    assert job_from_wire(VALID_JOB + [None, bad], 1000) is None
    h = Harness()
    node = h.node
    node.ctx.cluster_size = 2
    node.ctx.known_nodes = [node.id, PEER]
    node.ctx.reachable = [PEER]
    node.receive_data(PEER, "REPLJOB", [VALID_JOB + [None, bad], True], h.now)
    node.receive_data(PEER, "YOURJOBS", [[VALID_JOB + [{}, bad]]], h.now)
    assert node.bus_stats["messages_malformed"] == 2
    assert node.store.get(VALID_JOB[0]) is None
    node.receive_data(PEER, "REPLJOB", [VALID_JOB + [None, 3], True], h.now)  # a good one is taken
    assert job_priority(node.store.get(VALID_JOB[0])) == 3


# =============================================================== federation
def test_a_waiting_consumer_on_another_node_gets_the_high_jobs_first():
    c = Wired(2)
    for i in range(1000):
        assert len(c.cmd(0, "ADDJOB", "q", "low%d" % i, 0, "REPLICATE", 1, "PRIORITY", 1)) == 40
    for i in range(10):
        assert len(c.cmd(0, "ADDJOB", "q", "high%d" % i, 0, "REPLICATE", 1, "PRIORITY", 9)) == 40
    got: list[bytes] = []
    rounds = 0
    while len(got) < 10:  # a consumer on node 1 waits; node 1 asks node 0 (NEEDJOBS), which moves jobs
        rounds += 1
        assert rounds <= 20, got
        reply = c.submit(1, "GETJOB", "TIMEOUT", 10_000, "COUNT", 10 - len(got), "FROM", "q", client=7)
        c.settle()
        if reply is BLOCKED:
            c.advance(500)
            reply = c.reply(1, 7)
            assert reply is not None, got
        got += bodies(reply)  # moved and not delivered yet, they waited there by priority too
    assert rounds > 1  # the first ask moves one job; the others came with the next ones
    assert got == [b"high%d" % i for i in range(10)]
    assert c.node(1).stats["jobs_imported"] >= 10
    moved = [j for j in c.node(1).store.values() if j.queue == b"q"]
    assert moved and all(job_priority(j) == (9 if j.body.startswith(b"high") else 1) for j in moved)


def test_copies_made_on_other_nodes_keep_the_priority():
    c = Wired(3)
    job_id = c.cmd(0, "ADDJOB", "q", "b", 0, "REPLICATE", 3, "PRIORITY", 8)
    for i in range(3):
        job = c.job(i, job_id)
        assert job is not None and job_priority(job) == 8
    assert dict(zip(*[iter(c.cmd(2, "SHOW", job_id))] * 2))[b"priority"] == 8
