"""ADDJOB's GROUP (ours): the groups of a queue take turns, by weight, FIFO within a group,
priorities first; the group travels, persists and shows (core/groups.py, core/queues.py)."""

from __future__ import annotations

from collections import deque

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from disque_py.core.effects import BLOCKED
from disque_py.core.groups import GroupedJobs
from disque_py.core.job import F_GROUP, GROUP_NAME_MAX, job_group
from disque_py.core.wire import JOB_WIRE_FIELDS, job_from_wire, job_to_wire

from .conftest import Harness
from .test_delivery import show
from .test_hostile_peers import PEER, VALID_JOB
from .test_priority import bodies, getjobs
from .wired import Wired


# =============================================================== one node
def test_a_groups_backlog_delays_another_groups_job_by_one_turn_at_most(h):
    for i in range(300):
        h.add("q", "a%d" % i, "GROUP", "A")
    assert getjobs(h, 2) == [b"a0", b"a1"]
    h.add("q", "b0", "GROUP", "B")
    h.add("q", "c0", "GROUP", "C")
    h.add("q", "plain")  # the default group takes its turn like any other
    assert getjobs(h, 8) == [b"a2", b"b0", b"c0", b"plain", b"a3", b"a4", b"a5", b"a6"]


def test_weights_give_a_group_that_many_deliveries_per_turn(h):
    h.node.ctx.groups.weights[b"big"] = 3
    for i in range(9):
        h.add("q", "big%d" % i, "GROUP", "big")
        h.add("q", "small%d" % i, "GROUP", "small")
    got = [b.decode() for b in getjobs(h, 12)]
    assert got == ["big0", "big1", "big2", "small0", "big3", "big4", "big5", "small1",
                   "big6", "big7", "big8", "small2"]  # fmt: skip
    assert [bytes(j[2]) for j in h.cmd("QPEEK", "q", 100)] == [b"small%d" % i for i in range(3, 9)]


def test_priorities_first_then_the_groups_in_turn_at_each_priority(h):
    for i in range(3):
        h.add("q", "a-low%d" % i, "GROUP", "A", "PRIORITY", 1)
        h.add("q", "b-low%d" % i, "GROUP", "B", "PRIORITY", 1)
    for i in range(4):
        h.add("q", "a-high%d" % i, "GROUP", "A", "PRIORITY", 9)
    h.add("q", "b-high0", "GROUP", "B", "PRIORITY", 9)
    h.add("q", "plain")
    expected = [b"a-high0", b"b-high0", b"a-high1", b"a-high2", b"a-high3", b"plain",
                b"a-low0", b"b-low0", b"a-low1", b"b-low1", b"a-low2", b"b-low2"]  # fmt: skip
    assert [bytes(j[2]) for j in h.cmd("QPEEK", "q", 100)] == expected  # QPEEK says what GETJOB does
    assert [bytes(j[2]) for j in h.cmd("QPEEK", "q", -2)] == expected[:-3:-1]
    assert getjobs(h, 100) == expected


def test_requeued_and_dequeued_jobs_keep_their_place_in_their_group(h):
    a0 = h.add("q", "a0", "GROUP", "A", "RETRY", 10)
    a1 = h.add("q", "a1", "GROUP", "A", "RETRY", 10)
    b0 = h.add("q", "b0", "GROUP", "B", "RETRY", 10)
    assert getjobs(h, 1) == [b"a0"]
    assert h.cmd("NACK", a0) == 1  # back at the head of A: older than a1
    assert [bytes(j[1]) for j in h.cmd("QPEEK", "q", 10)] == [b0, a0, a1]  # B's turn now
    assert h.cmd("DEQUEUE", b0) == 1
    assert [bytes(j[1]) for j in h.cmd("QPEEK", "q", 10)] == [a0, a1]
    assert h.cmd("ACKJOB", a0) == 1
    assert h.cmd("ENQUEUE", b0) == 1
    assert getjobs(h, 5) == [b"a1", b"b0"]
    assert h.cmd("QLEN", "q") == 0


def test_a_queue_turns_grouped_with_its_old_jobs_in_order_and_plain_again_once_empty(h):
    for i in range(3):
        h.add("q", "old%d" % i)
    h.add("q", "p", "PRIORITY", 7)  # sorted by priority first
    q = h.node.queues[b"q"]
    h.add("q", "g", "GROUP", "G")
    assert type(q.jobs) is GroupedJobs and len(q.jobs) == 5
    assert getjobs(h, 5) == [b"p", b"old0", b"g", b"old1", b"old2"]
    h.add("q", "again")
    assert type(q.jobs) is deque  # a plain queue again: no job of it pays for groups


def test_jobs_without_group_keep_todays_queue_and_job(h):
    job_id = h.add("q", "plain")
    job = h.node.store.get(job_id)
    assert type(h.node.queues[b"q"].jobs) is deque and job.extra is None and not job.flags & F_GROUP
    assert "group" not in show(h, job_id) and job_group(job) == b""


def test_show_and_jscan_say_the_group(h):
    grouped = h.add("q", "x", "GROUP", "tenant-7", "PRIORITY", 2)
    plain = h.add("q", "y")
    assert show(h, grouped)["group"] == b"tenant-7" and show(h, grouped)["priority"] == 2
    cursor, items = h.cmd("JSCAN", "REPLY", "ALL")
    by_id = {bytes(i[1]): dict(zip(i[0::2], i[1::2])) for i in items}
    assert by_id[grouped][b"group"] == b"tenant-7" and b"group" not in by_id[plain]


def test_the_same_options_parsed_once_give_each_job_its_group(h):
    for i in range(2):
        h.add("q", "a", "GROUP", "A", "RETRY", 30)
        h.add("q", "a", "GROUP", "A", "RETRY", 30, "DEDUP", "k%d" % i)
        h.add("q", "b", "GROUP", "B", "RETRY", 30)
    assert getjobs(h, 6) == [b"a", b"b", b"a", b"b", b"a", b"a"]


@pytest.mark.parametrize(
    "args, error",
    [
        (["GROUP", ""], "ERR GROUP name must not be empty"),
        (["GROUP", "x" * (GROUP_NAME_MAX + 1)], "ERR GROUP name is 129 bytes, at most 128"),
        (["GROUP"], "ERR syntax error near 'GROUP': a value must follow it"),
        (["PRIORITY", 10, "GROUP", "g"], "ERR PRIORITY must be a number from 0 to 9 (higher first)"),
    ],
)
def test_a_bad_group_is_refused_and_changes_nothing(h, args, error):
    h.add("q", "there")
    assert h.cmd("ADDJOB", "q", "body", 0, *args) == error
    assert h.cmd("QLEN", "q") == 1 and len(h.node.store) == 1
    assert h.cmd("ADDJOB", "q", "body", 0, *args) == error  # not remembered as parsed
    h.add("q", "x" * GROUP_NAME_MAX, "GROUP", "x" * GROUP_NAME_MAX)  # the longest is fine


@settings(max_examples=120, deadline=None)
@given(
    weights=st.lists(st.integers(1, 4), min_size=1, max_size=5),
    ops=st.lists(st.one_of(st.integers(0, 5), st.just(-1)), max_size=150),
)
def test_fair_turns_any_mix_of_groups_weights_and_arrivals(weights, ops):
    """Whatever the groups, their weights and the order jobs arrive in between deliveries (``ops``:
    a group's index adds one of its jobs, the last index a job without a group; -1 delivers one):
    each group's jobs come out in their order, none is lost, and a group with jobs waits for at
    most one turn of every other group (the sum of their weights in deliveries) between two of
    its deliveries, or from its first job to its first delivery."""
    h = Harness()
    groups = [b"g%d" % i for i in range(len(weights))] + [b""]  # b"": jobs without a group
    weight = dict(zip(groups, weights + [1]))
    for g, w in weight.items():
        if w != 1:
            h.node.ctx.groups.weights[g] = w
    queued: dict[bytes, deque[bytes]] = {g: deque() for g in groups}
    waited = dict.fromkeys(groups, 0)  # deliveries to others since its last one, or its first job
    n = 0
    for op in ops + [-1] * len(ops):  # then every job out
        if op >= 0:
            g = groups[op % len(groups)]
            body = b"%d-%d" % (groups.index(g), n)
            n += 1
            if not queued[g]:
                waited[g] = 0
            h.add("q", body, *(("GROUP", g) if g else ()))
            queued[g].append(body)
            continue
        reply = h.cmd("GETJOB", "NOHANG", "COUNT", 1, "FROM", "q")
        got = bodies(reply) if isinstance(reply, list) else []
        if not any(queued.values()):
            assert got == []
            continue
        assert len(got) == 1
        g = groups[int(got[0].split(b"-")[0])]
        assert queued[g] and got[0] == queued[g].popleft(), (got, g)  # FIFO within its group
        waited[g] = 0
        for other in groups:
            if other != g and queued[other]:
                waited[other] += 1
                bound = sum(weight.values()) - weight[other]
                assert waited[other] <= bound, (other, waited[other], bound)
    assert not any(queued.values()) and h.cmd("QLEN", "q") == 0


# =============================================================== the wire
def test_the_wire_carries_the_group_and_a_bad_one_from_a_peer_is_refused():
    h = Harness()
    job = h.node.store.get(h.add("q", "b", "GROUP", "G", "PRIORITY", 8))
    wire = job_to_wire(job, h.now)
    assert wire[JOB_WIRE_FIELDS]["g"] == b"G"
    back = job_from_wire(wire, h.now)
    assert back is not None and job_group(back) == b"G" and back.flags & F_GROUP and back.extra == job.extra
    node = h.node
    node.ctx.cluster_size = 2
    node.ctx.known_nodes = [node.id, PEER]
    node.ctx.reachable = [PEER]
    for bad in (b"", b"x" * (GROUP_NAME_MAX + 1), "G", 7, [b"G"]):
        assert job_from_wire(VALID_JOB + [{"g": bad}], h.now) is None
        node.receive_data(PEER, "REPLJOB", [VALID_JOB + [{"g": bad}], True], h.now)
    assert node.bus_stats["messages_malformed"] == 5 and node.store.get(VALID_JOB[0]) is None
    node.receive_data(PEER, "REPLJOB", [VALID_JOB + [{"g": b"G"}], True], h.now)
    assert job_group(node.store.get(VALID_JOB[0])) == b"G"


# =============================================================== federation
def test_copies_keep_the_group_and_a_consumer_elsewhere_gets_the_groups_in_turn():
    c = Wired(2)
    job_id = c.cmd(0, "ADDJOB", "r", "x", 0, "REPLICATE", 2, "GROUP", "G")
    assert job_group(c.job(1, job_id)) == b"G"
    for i in range(200):
        assert len(c.cmd(0, "ADDJOB", "q", "a%d" % i, 0, "REPLICATE", 1, "GROUP", "A")) == 40
    for i in range(3):
        assert len(c.cmd(0, "ADDJOB", "q", "b%d" % i, 0, "REPLICATE", 1, "GROUP", "B")) == 40
    c.advance(600)  # the two nodes compare their groups' settings first (limits.py: a start)
    got: list[bytes] = []
    rounds = 0
    while len(got) < 6:  # a consumer on node 1; node 1 asks node 0 (NEEDJOBS), which moves jobs in turn
        rounds += 1
        assert rounds <= 20, got
        reply = c.submit(1, "GETJOB", "TIMEOUT", 10_000, "COUNT", 6 - len(got), "FROM", "q", client=7)
        c.settle()
        if reply is BLOCKED:
            c.advance(500)
            reply = c.reply(1, 7)
            assert reply is not None, got
        got += bodies(reply)
    assert sorted(got) == [b"a0", b"a1", b"a2", b"b0", b"b1", b"b2"]  # B's jobs not behind A's backlog
    moved = [j for j in c.node(1).store.values() if j.queue == b"q"]
    assert moved and all(job_group(j) == bytes(j.body[:1]).upper() for j in moved)
