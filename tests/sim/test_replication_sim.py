"""Job replication across nodes, as Disque specifies it, on the deterministic cluster model.

The first part (``test_harness_*``) checks the model itself with traffic the
core handled before replication existed (REPLICATE 1 jobs, PAUSE BCAST): the
network, the clocks, crashes, replies. The scenarios after it follow Disque's
README ("Job replication strategy", "Job re-queueing state machine",
"Acknowledged jobs garbage collection state machine") and job.c/ack.c;
those that need replication in the core are marked ``replication``.

Every run is deterministic; a failure prints its seed and how to replay it.
"""

from __future__ import annotations

import random
import re

import pytest

from disque_py.core.node import Node
from disque_py.core.replies import Error, Status

from .cluster_model import (
    ACKED,
    ACTIVE,
    BLOCKED,
    NULL_ARRAY,
    QUEUED,
    T0,
    WAIT_REPL,
    ClientGone,
    SimCluster,
    SimFailure,
)

replication = pytest.mark.replication


# ---------------------------------------------------------------------------
# helpers
# ---------------------------------------------------------------------------
def addjob(c: SimCluster, i: int, *opts, queue: str = "q", body: str = "body", timeout: int = 5000) -> bytes:
    """ADDJOB on node i; waits for a synchronous reply; the job ID."""
    cl = c.client(i)
    reply = cl.cmd("ADDJOB", queue, body, timeout, *opts)
    if reply is BLOCKED:
        reply = cl.wait_reply(timeout + 1000)
    c.check(isinstance(reply, Status) and len(reply) == 40, "ADDJOB on node %d answered %r" % (i, reply))
    return bytes(reply)


def getjob(c: SimCluster, i: int, queue: str = "q") -> list[bytes]:
    reply = c.client(i).cmd("GETJOB", "NOHANG", "COUNT", 100, "FROM", queue)
    if reply is NULL_ARRAY:
        return []
    c.check(isinstance(reply, list), "GETJOB on node %d answered %r" % (i, reply))
    return [bytes(item[1]) for item in reply]


def gone_everywhere(c: SimCluster, job_id: bytes):
    """Predicate: no live node knows the job (dummy acks included)."""
    return lambda: not c.holders(job_id, include_dummy=True)


def no_acked_anywhere(c: SimCluster) -> bool:
    return all(state != ACKED for jobs in c.jobs_everywhere().values() for state in jobs.values())


# ---------------------------------------------------------------------------
# The model itself (passes without replication)
# ---------------------------------------------------------------------------
def test_harness_node_ids_and_clocks_derive_from_the_seed():
    a, b, other = SimCluster(5, 7), SimCluster(5, 7), SimCluster(5, 8)
    assert a.ids == b.ids and a.mono_offset == b.mono_offset and a.wall_offset == b.wall_offset
    assert a.ids != other.ids
    assert len({i[:8] for i in a.ids}) == 5
    assert all(re.fullmatch("[0-9a-f]{40}", i) for i in a.ids)  # node IDs as the bus wants them
    for i, node in enumerate(a.nodes):
        assert node.id == a.ids[i]
        assert node.ctx.cluster_size == 5 and node.ctx.known_nodes == a.ids
        assert sorted(node.ctx.reachable) == sorted(x for x in a.ids if x != node.id)
    # different monotonic origins, wall clocks within +-50 ms of each other
    assert len(set(a.mono_offset)) == 5
    walls = [a.node_now(i) + a.wall_offset[i] for i in range(5)]
    assert max(walls) - min(walls) <= 100


def test_harness_replies_are_collected_per_client():
    c = SimCluster(3, 11)
    waiter = c.client(2)
    assert waiter.cmd("GETJOB", "TIMEOUT", 0, "FROM", "q") is BLOCKED
    assert c.replies[(2, waiter.id)] == []
    c.run_for(1000)
    assert waiter.pending is not None
    job = addjob(c, 2, "REPLICATE", 1)
    got = waiter.wait_reply(100)
    assert [bytes(x[1]) for x in got] == [job]
    assert c.replies[(2, waiter.id)] == [got]
    assert [(n, j) for _, n, j in c.ledger.deliveries] == [(2, job)]
    # a blocked GETJOB with a timeout gets the null array exactly when it expires
    start = c.now
    assert waiter.cmd("GETJOB", "TIMEOUT", 300, "FROM", "empty") is BLOCKED
    assert waiter.wait_reply(1000) is NULL_ARRAY
    assert c.now - start == 300


def test_harness_timers_fire_at_next_wakeup_not_on_the_tick_grid():
    c = SimCluster(3, 12)
    job = addjob(c, 0, "REPLICATE", 1, "RETRY", 1)
    c.run_for(37)
    assert getjob(c, 0) == [job]
    node = c.nodes[0]
    due = node.store.get(job).requeue_at - c.mono_offset[0]  # in harness time
    c.run_until(lambda: c.queued_on(job) == [0], 2000, "requeue after RETRY 1")
    assert c.now == due
    assert 750 <= c.now - T0 - 37 <= 1250


def _pause_traffic(c: SimCluster, count: int, src: int = 0) -> None:
    """PAUSE <name> in BCAST: one message per other node, each creating a queue there."""
    for k in range(count):
        assert c.client(src).cmd("PAUSE", "p%04d" % k, "in", "bcast") == b"in"
        c.run_for(1)


def test_harness_network_loses_duplicates_and_delays():
    c = SimCluster(3, 13, loss=0.2, dup=0.2, delay=(10, 30))
    _pause_traffic(c, 300)
    c.run_for(100)
    sent = c.stats["sent"]
    assert sent == 600
    assert 0.12 < c.stats["lost"] / sent < 0.28
    assert 0.12 < c.stats["duplicated"] / (sent - c.stats["lost"]) < 0.28
    assert c.stats["delivered"] == sent - c.stats["lost"] + c.stats["duplicated"]
    assert min(c.latencies) >= 10 and max(c.latencies) <= 30 and len(set(c.latencies)) > 10
    # what arrived took effect on the receivers, through receive_data
    for i in (1, 2):
        paused = [name for name, q in c.nodes[i].queues.items() if q.flags]
        assert 0.6 * 300 < len(paused) < 300


def test_harness_reorders_unless_links_are_fifo():
    def arrival_order(reorder: bool) -> list[bytes]:
        c = SimCluster(2, 14, delay=(1, 40), reorder=reorder)
        _pause_traffic(c, 100)
        c.run_for(100)
        return list(c.nodes[1].queues)

    in_order = sorted(arrival_order(False))
    assert arrival_order(False) == in_order
    shuffled = arrival_order(True)
    assert sorted(shuffled) == in_order and shuffled != in_order


def test_harness_messages_go_through_the_bus_codec(monkeypatch):
    c = SimCluster(2, 15)
    seen = []
    node = c.nodes[1]
    original = Node.receive_data

    def spy(self, sender, kind, body, now):
        if self is node:
            seen.append((sender, kind, body))
        return original(self, sender, kind, body, now)

    # on the class: a compiled Node's instances take no attribute of their own
    monkeypatch.setattr(Node, "receive_data", spy)
    c.client(0).cmd("PAUSE", "q", "out", "bcast")
    c.run_for(50)
    assert seen == [(c.ids[0], "PAUSE", [b"q", 2])]  # the Send carried a tuple; msgpack gives a list
    assert type(seen[0][2]) is list and type(seen[0][0]) is str


def test_harness_partition_cuts_links_and_views():
    c = SimCluster(3, 16, delay=(50, 50))
    c.partition([0], [1, 2])
    assert c.nodes[0].ctx.reachable == []
    assert c.nodes[1].ctx.reachable == [c.ids[2]]
    _pause_traffic(c, 1)
    c.run_for(100)
    assert c.stats["dropped_cut"] == 2 and c.stats["delivered"] == 0
    c.heal()
    assert sorted(c.nodes[0].ctx.reachable) == sorted(c.ids[1:])
    # a message in flight when the link is cut is lost, even if it heals before arrival
    c.client(0).cmd("PAUSE", "late", "in", "bcast")
    c.run_for(10)
    c.partition([0], [1, 2])
    c.run_for(10)
    c.heal()
    c.run_for(100)
    assert c.stats["dropped_in_flight"] == 2
    assert b"late" not in c.nodes[1].queues


def test_harness_detection_delay():
    c = SimCluster(3, 17, detect_delay_ms=500)
    c.crash(2)
    c.run_for(499)
    assert c.ids[2] in c.nodes[0].ctx.reachable  # not noticed yet
    c.run_for(1)
    assert c.ids[2] not in c.nodes[0].ctx.reachable
    c.set_leaving(1, True)
    assert c.nodes[1].ctx.leaving  # its own flag at once
    c.run_for(500)
    assert c.nodes[0].ctx.reachable == []  # node 1 leaving, node 2 down


def test_harness_crash_loses_memory_and_clients():
    c = SimCluster(3, 18)
    job = addjob(c, 1, "REPLICATE", 1)
    blocked = c.client(1)
    assert blocked.cmd("GETJOB", "FROM", "other") is BLOCKED
    old = c.nodes[1]
    c.crash(1)
    assert c.nodes[1] is None and not c.alive[1]
    assert blocked.gone
    with pytest.raises(ClientGone, match="^<SimClient 2 on node 1 gone>: its node crashed or it was closed$"):
        blocked.cmd("QLEN", "q")
    with pytest.raises(ClientGone, match="^node 1 is down$"):
        c.client(1)
    assert c.ids[1] not in c.nodes[0].ctx.reachable
    assert c.ledger.lost[job] == {1}
    assert c.ledger.crashes[0][1] == 1 and job in c.ledger.crashes[0][2]
    c.run_for(1000)
    c.restart(1)
    assert c.nodes[1] is not old and c.nodes[1].id == c.ids[1]
    assert c.nodes[1].store.get(job) is None and c.holders(job) == []
    assert c.client(1).cmd("QLEN", "q") == 0
    assert c.ids[1] in c.nodes[0].ctx.reachable
    assert c.ledger.restarts == [(c.now, 1)]


def test_harness_failures_name_the_seed_and_the_replay_command():
    c = SimCluster(2, 4242)
    with pytest.raises(SimFailure, match=r"^boom\n  \[sim seed=4242 ") as info:
        c.check(False, "boom")
    text = str(info.value)
    assert "boom" in text and "seed=4242" in text and "replay:" in text
    assert "test_harness_failures_name_the_seed_and_the_replay_command" in text


def test_harness_an_exception_in_a_node_fails_the_run(monkeypatch):
    c = SimCluster(2, 19)
    node = c.nodes[1]
    original = Node.receive_data

    def broken(self, sender, kind, body, now):
        if self is node:
            raise RuntimeError("kaboom")
        return original(self, sender, kind, body, now)

    monkeypatch.setattr(Node, "receive_data", broken)  # on the class: see above
    c.client(0).cmd("PAUSE", "q", "in", "bcast")
    with pytest.raises(SimFailure, match=r"^node 1 raised in receive_data.*RuntimeError\('kaboom'\)") as info:
        c.run_for(50)
    assert "kaboom" in str(info.value) and "node 1" in str(info.value) and "seed=19" in str(info.value)


def test_harness_a_message_handler_exception_fails_the_run(monkeypatch):
    """A handler's exception is this node's bug: receive_data lets it through, and the run fails
    naming it (it used to be swallowed as if the peer had sent garbage)."""
    from disque_py.core.blocking import Blocking

    def broken(self, sender, message):
        raise KeyError("bug in on_pause")

    monkeypatch.setattr(Blocking, "on_pause", broken)
    c = SimCluster(2, 20)
    c.client(0).cmd("PAUSE", "q", "in", "bcast")
    with pytest.raises(SimFailure, match=r"^node 1 raised in receive_data.*KeyError\('bug in on_pause'\)") as info:
        c.run_for(50)
    assert "bug in on_pause" in str(info.value) and "node 1" in str(info.value)


# ---------------------------------------------------------------------------
# 1. Synchronous replication
# ---------------------------------------------------------------------------
@replication
def test_addjob_replicate_3_on_5_nodes():
    c = SimCluster(5, 101)
    cl = c.client(0)
    assert cl.cmd("ADDJOB", "q", "body", 5000, "REPLICATE", 3) is BLOCKED  # waits for GOTJOBs
    reply = cl.wait_reply(5000)
    assert isinstance(reply, Status), reply
    job = bytes(reply)
    c.run_for(500)  # no extra copies show up later
    holders = c.holders(job)
    assert len(holders) == 3 and 0 in holders, c.states(job)
    ids = {c.ids[i] for i in holders}
    for i in holders:
        info = c.show(i, job)
        assert set(info["nodes-delivered"]) == ids, (i, info["nodes-delivered"])
        assert info["repl"] == 3 and info["body"] == b"body"
    assert c.queued_on(job) == [0]
    for i in holders:
        if i != 0:
            assert c.state_of(i, job) == ACTIVE
            assert c.client(i).cmd("QLEN", "q") == 0
    for i in set(range(5)) - set(holders):
        assert c.show(i, job) is None
    assert getjob(c, 0) == [job]


@replication
def test_default_replication_is_3_on_a_5_node_cluster():
    c = SimCluster(5, 102)
    job = addjob(c, 3)
    c.run_for(200)
    assert len(c.holders(job)) == 3 and c.queued_on(job) == [3]


# ---------------------------------------------------------------------------
# 2. Not enough nodes: -NOREPL
# ---------------------------------------------------------------------------
def test_replicate_more_than_the_cluster_is_noreply_at_once():
    c = SimCluster(5, 201)
    reply = c.client(0).cmd("ADDJOB", "q", "body", 5000, "REPLICATE", 6)
    assert isinstance(reply, Error) and reply.prefix == "NOREPL", reply
    assert reply == "NOREPL Not enough reachable nodes for the requested replication level (5 reachable, 6 asked)"
    assert c.jobs_everywhere() == {i: {} for i in range(5)}
    assert c.stats["sent"] == 0


@replication
def test_minority_partition_knows_it_cannot_replicate():
    c = SimCluster(5, 202)
    c.partition([0, 1, 2], [3, 4])
    reply = c.client(0).cmd("ADDJOB", "q", "body", 5000, "REPLICATE", 4)
    assert isinstance(reply, Error) and reply.prefix == "NOREPL", reply
    assert reply == "NOREPL Not enough reachable nodes for the requested replication level (3 reachable, 4 asked)"
    assert c.jobs_everywhere()[0] == {}
    job = addjob(c, 0, "REPLICATE", 3)
    assert sorted(c.holders(job)) == [0, 1, 2]


@replication
def test_norepl_with_one_node_of_three_cut_says_2_reachable_3_asked():
    c = SimCluster(3, 205)
    c.partition([0, 1], [2])  # node 2 is lost; it stays a member: the default REPLICATE is 3
    for i in (0, 1):
        reply = c.client(i).cmd("ADDJOB", "q", "body", 0)
        assert reply == "NOREPL Not enough reachable nodes for the requested replication level (2 reachable, 3 asked)", reply
    assert c.jobs_everywhere() == {i: {} for i in range(3)}
    job = addjob(c, 0, "REPLICATE", 2)  # what the two nodes left can honour
    assert sorted(c.holders(job)) == [0, 1]


@replication
def test_replication_routes_around_a_partitioned_node_not_yet_detected():
    # node 0 still believes every node is reachable (detection takes a minute)
    c = SimCluster(5, 203, detect_delay_ms=60_000)
    c.partition([0, 1, 2, 3], [4])
    for k in range(6):  # node 4 is among the first 3 picks most of the time
        job = addjob(c, 0, "REPLICATE", 4, body="b%d" % k, timeout=2000)
        c.run_for(200)
        assert sorted(c.holders(job)) == [0, 1, 2, 3], c.states(job)
        assert c.queued_on(job) == [0]
    assert c.stats["dropped_cut"] > 0  # node 4 was tried


@replication
def test_replication_timeout_is_noreply_and_copies_are_deleted():
    c = SimCluster(5, 204, detect_delay_ms=60_000)
    c.partition([0, 1, 2], [3, 4])
    cl = c.client(0)
    start = c.now
    assert cl.cmd("ADDJOB", "q", "body", 1000, "REPLICATE", 4) is BLOCKED
    c.run_for(500)
    waiting = [jid for jid, j in c.nodes[0].store.items() if j.state == WAIT_REPL]
    assert len(waiting) == 1
    job = waiting[0]
    assert sorted(c.holders(job)) == [0, 1, 2]  # 3 copies, one short
    reply = cl.wait_reply(2000)
    assert isinstance(reply, Error) and reply.prefix == "NOREPL", reply
    assert reply == (
        "NOREPL Timeout reached before replicating to the requested number of nodes (3 of 4 copies confirmed)")
    assert 1000 <= c.now - start <= 1010
    c.run_until(gone_everywhere(c, job), 1000, "DELJOB of the copies after the NOREPL timeout")
    c.heal()
    c.run_for(5000)
    assert c.holders(job, include_dummy=True) == []
    assert getjob(c, 1) == [] and getjob(c, 3) == []


# ---------------------------------------------------------------------------
# 3. ASYNC
# ---------------------------------------------------------------------------
@replication
def test_async_replies_at_once_and_replicates_shortly_after():
    c = SimCluster(5, 301)
    reply = c.client(0).cmd("ADDJOB", "q", "body", 0, "REPLICATE", 3, "ASYNC")
    assert isinstance(reply, Status), reply
    job = bytes(reply)
    assert c.holders(job) == [0] and c.queued_on(job) == [0]
    c.run_until(lambda: len(c.holders(job)) == 3, 1000, "2 more copies")
    c.run_for(500)
    assert len(c.holders(job)) == 3
    assert c.queued_on(job) == [0]
    assert c.stats["sent:GOTJOB"] == 0  # ASYNC asks for no confirmation


# ---------------------------------------------------------------------------
# 4. Surviving holder failures
# ---------------------------------------------------------------------------
@replication
def test_job_survives_two_of_three_holders_crashing():
    c = SimCluster(5, 401)
    job = addjob(c, 0, "REPLICATE", 3, "RETRY", 2)
    others = [i for i in c.holders(job) if i != 0]
    assert len(others) == 2
    survivor = others[1]
    c.crash(0)
    c.crash(others[0])
    c.run_until(lambda: c.queued_on(job) == [survivor], 3000, "the survivor requeues after RETRY")
    assert getjob(c, survivor) == [job]
    assert c.ledger.delivered[job] == 1
    # the crashed holders come back empty; an ack on the survivor is still collected
    c.restart(0)
    c.restart(others[0])
    assert c.client(survivor).cmd("ACKJOB", job) == 1
    c.run_until(gone_everywhere(c, job), 10_000, "GC with two holders that forgot the job")
    assert no_acked_anywhere(c)


# ---------------------------------------------------------------------------
# 5. Requeue de-duplication
# ---------------------------------------------------------------------------
@replication
@pytest.mark.parametrize("seed", [501, 502, 503])
def test_unacked_job_is_requeued_on_one_node_only(seed):
    c = SimCluster(5, seed)
    job = addjob(c, 0, "REPLICATE", 3, "RETRY", 2)
    assert getjob(c, 0) == [job]  # consumed, never acked
    assert c.queued_on(job) == []
    overlap_since = None
    longest_overlap = 0
    ever_queued: set[int] = set()
    end = c.now + 4 * 2000 + 500
    while c.now < end:
        c.run_for(5)
        queued = c.queued_on(job)
        ever_queued.update(queued)
        if len(queued) > 1:
            overlap_since = overlap_since or c.now
            longest_overlap = max(longest_overlap, c.now - overlap_since)
        else:
            overlap_since = None
    assert ever_queued, "never requeued in 4 RETRY periods"
    assert longest_overlap <= 50, "queued on several nodes for %d ms" % longest_overlap
    assert len(c.queued_on(job)) == 1, c.states(job)
    assert sum(1 for i in c.holders(job) if c.state_of(i, job) == QUEUED) == 1


# ---------------------------------------------------------------------------
# 6. Acks garbage collection
# ---------------------------------------------------------------------------
@replication
@pytest.mark.parametrize("ack_on", ["creator", "other_holder", "non_holder"])
def test_ackjob_anywhere_removes_the_job_everywhere(ack_on):
    c = SimCluster(5, 601)
    job = addjob(c, 0, "REPLICATE", 3, "RETRY", 60)
    assert getjob(c, 0) == [job]
    holders = c.holders(job)
    where = {
        "creator": 0,
        "other_holder": next(i for i in holders if i != 0),
        "non_holder": next(i for i in range(5) if i not in holders),
    }[ack_on]
    assert c.client(where).cmd("ACKJOB", job) == (0 if ack_on == "non_holder" else 1)
    took = c.run_until(gone_everywhere(c, job), 5000, "ack GC everywhere")
    assert took < 1000  # healthy cluster: a few round trips
    assert no_acked_anywhere(c)
    c.run_for(70_000)  # and it never comes back
    assert c.holders(job, include_dummy=True) == [] and c.ledger.delivered[job] == 1


@replication
@pytest.mark.parametrize("ack_on", ["creator", "other_holder"])
def test_a_job_with_two_copies_is_collected_without_deljob(ack_on):
    # The acking node's only other holder deletes its copy on SETACK and says so in its
    # GOTACK, so no DELJOB follows: SETACK + GOTACK, two messages instead of three.
    c = SimCluster(3, 611)
    job = addjob(c, 0, "REPLICATE", 2, "RETRY", 60)
    assert getjob(c, 0) == [job]
    holders = c.holders(job)
    where = 0 if ack_on == "creator" else next(i for i in holders if i != 0)
    before = {k: c.stats["sent:" + k] for k in ("SETACK", "GOTACK", "DELJOB")}
    assert c.client(where).cmd("ACKJOB", job) == 1
    c.run_until(gone_everywhere(c, job), 5000, "ack GC of a two-copy job")
    sent = {k: c.stats["sent:" + k] - v for k, v in before.items()}
    assert sent == {"SETACK": 1, "GOTACK": 1, "DELJOB": 0}
    c.run_for(70_000)  # RETRY 60: a copy left anywhere would be queued and delivered again
    assert c.holders(job, include_dummy=True) == [] and c.ledger.delivered[job] == 1


@replication
def test_a_two_copy_ack_whose_gotack_is_lost_is_still_collected(monkeypatch):
    c = SimCluster(3, 612)
    job = addjob(c, 0, "REPLICATE", 2, "RETRY", 60)
    assert getjob(c, 0) == [job]
    other = next(i for i in c.holders(job) if i != 0)
    node = c.node(0)
    real = Node.receive_data
    lost = []

    def lose_the_first_gotack(self, sender, kind, body, now):
        if self is node and kind == "GOTACK" and not lost:
            lost.append(body)  # the other holder deleted its copy, and this never arrives
            return None
        return real(self, sender, kind, body, now)

    monkeypatch.setattr(Node, "receive_data", lose_the_first_gotack)  # on the class: see above
    assert c.client(0).cmd("ACKJOB", job) == 1
    c.run_until(lambda: bool(lost), 5000, "the GOTACK")
    assert c.state_of(other, job) is None  # deleted on SETACK
    assert lost[0][1:] == [True, True]  # GOTACK(id, known, deleted)
    assert c.state_of(0, job) == ACKED
    # the next GC attempt asks again; the answer "unknown" from a holder confirms it
    c.run_until(gone_everywhere(c, job), 30_000, "the ack collected after the GOTACK was lost")
    c.run_for(70_000)
    assert c.holders(job, include_dummy=True) == [] and c.ledger.delivered[job] == 1


@replication
def test_a_holder_that_knows_a_third_copy_does_not_take_the_two_copy_shortcut():
    # REPLICATE 2 on nodes 0 and x; the job then moves from 0 to a consumer on node y, so 0
    # and y know three holders and x still knows two. An ACKJOB on x offers 0 the shortcut;
    # 0 must not delete its copy at once but collect y's copy too.
    c = SimCluster(3, 613)
    job = addjob(c, 0, "REPLICATE", 2, "RETRY", 60)
    x = next(i for i in c.holders(job) if i != 0)
    y = next(i for i in range(3) if i not in (0, x))
    consumer = c.client(y)
    assert consumer.cmd("GETJOB", "TIMEOUT", 10_000, "FROM", "q") is BLOCKED
    reply = consumer.wait_reply(10_000)
    assert isinstance(reply, list) and bytes(reply[0][1]) == job, reply
    assert sorted(c.holders(job)) == sorted([0, x, y])
    assert len(c.node(x).store.get(job).delivered) == 2
    before = c.stats["sent:DELJOB"]
    assert c.client(x).cmd("ACKJOB", job) == 1
    c.run_until(gone_everywhere(c, job), 10_000, "every copy collected, the moved one included")
    assert c.stats["sent:DELJOB"] > before  # the long way, through node 0's own GC
    c.run_for(70_000)  # y's copy would come back after RETRY had it been left behind
    assert c.holders(job, include_dummy=True) == [] and c.ledger.delivered[job] == 1


# ---------------------------------------------------------------------------
# 7. Dummy ack while every holder is away
# ---------------------------------------------------------------------------
@replication
def test_dummy_ack_is_collected_after_the_holders_come_back():
    c = SimCluster(5, 701)
    job = addjob(c, 0, "REPLICATE", 2, "RETRY", 60)
    holders = sorted(c.holders(job))
    others = [i for i in range(5) if i not in holders]
    assert getjob(c, 0) == [job]
    c.partition(holders, others)
    x = others[0]
    assert c.client(x).cmd("ACKJOB", job) == 0
    c.run_for(3000)
    dummy = c.nodes[x].store.get(job)
    assert dummy is not None and dummy.state == ACKED, "no dummy ack kept on node %d" % x
    for i in holders:
        assert c.state_of(i, job) == ACTIVE  # the holders do not know yet
    c.heal()
    c.run_until(gone_everywhere(c, job), 60_000, "dummy ack + job collected after heal")
    assert no_acked_anywhere(c)
    c.run_for(65_000)
    assert c.ledger.delivered[job] == 1  # never requeued: the ack arrived in time


# ---------------------------------------------------------------------------
# 7b. Holders given up with CLUSTER FORGET
# ---------------------------------------------------------------------------
@replication
def test_an_ack_stops_waiting_for_a_holder_the_operator_forgot():
    """A holder that died for good (a restarted node comes back under a new ID) never confirms
    an ack: the job would stay acked until its TTL. CLUSTER FORGET of that node lets the GC
    count it as confirmed."""
    c = SimCluster(5, 711)
    job = addjob(c, 0, "REPLICATE", 3, "RETRY", 60)
    assert getjob(c, 0) == [job]
    lost = next(i for i in c.holders(job) if i != 0)
    c.crash(lost)  # never comes back
    assert c.client(0).cmd("ACKJOB", job) == 1
    c.run_for(30_000)
    assert c.holders(job) and all(c.state_of(i, job) == ACKED for i in c.holders(job)), c.states(job)
    c.forget(lost)
    c.run_until(gone_everywhere(c, job), 200_000, "ack GC once the dead holder is forgotten")
    assert no_acked_anywhere(c)


@replication
def test_a_forgotten_holder_known_again_must_confirm_the_ack_itself():
    """Forgotten by mistake while only partitioned away, the holder joins again with its copy:
    the ack waits for it, so that its copy is deleted and not requeued after RETRY."""
    c = SimCluster(5, 712)
    job = addjob(c, 0, "REPLICATE", 3, "RETRY", 20)
    assert getjob(c, 0) == [job]
    away = next(i for i in c.holders(job) if i != 0)
    c.partition([i for i in range(5) if i != away], [away])
    assert c.client(0).cmd("ACKJOB", job) == 1
    c.forget(away)
    c.meet(away)  # known again, still unreachable
    c.run_for(15_000)  # several GC attempts meanwhile
    assert c.state_of(0, job) == ACKED, "the ack was collected without the holder's confirmation"
    c.heal()
    c.run_until(gone_everywhere(c, job), 200_000, "ack GC after the holder is back")
    c.run_for(60_000)
    assert c.ledger.delivered[job] == 1  # the holder's copy never came back


@replication
def test_a_holder_unknown_for_a_moment_is_still_waited_for():
    """A node this one does not know yet (joined a moment ago, gossip still on its way) is not
    taken for a forgotten one: the first GC attempts wait for it."""
    c = SimCluster(5, 713)
    job = addjob(c, 0, "REPLICATE", 3, "RETRY", 20)
    assert getjob(c, 0) == [job]
    newcomer = next(i for i in c.holders(job) if i != 0)
    c.partition([i for i in range(5) if i != newcomer], [newcomer])
    c.forget(newcomer)  # unknown everywhere for now...
    assert c.client(0).cmd("ACKJOB", job) == 1
    c.run_for(1500)
    c.meet(newcomer)  # ...and known again a moment later, still unreachable
    c.run_for(15_000)
    assert c.state_of(0, job) == ACKED, "the ack was collected while a holder was unknown for 1.5 s"
    c.heal()
    c.run_until(gone_everywhere(c, job), 200_000, "ack GC after the holder is back")
    c.run_for(60_000)
    assert c.ledger.delivered[job] == 1


@replication
def test_a_dummy_ack_for_a_job_whose_holder_was_forgotten_is_dropped():
    """Every node but the dead holder answered that it does not know the job; once the holder is
    forgotten nobody is left to answer, and the dummy ack goes at its next GC attempt."""
    c = SimCluster(5, 714)
    job = addjob(c, 0, "REPLICATE", 1, "RETRY", 60)
    assert getjob(c, 0) == [job]
    c.crash(0)  # the only holder, gone for good
    x = 3
    assert c.client(x).cmd("ACKJOB", job) == 0  # a dummy ack
    c.run_for(3000)
    dummy = c.nodes[x].store.get(job)
    assert dummy is not None and dummy.state == ACKED, "no dummy ack kept on node %d" % x
    c.forget(0)
    c.run_until(gone_everywhere(c, job), 200_000, "the dummy ack dropped")


# ---------------------------------------------------------------------------
# 8. At-most-once
# ---------------------------------------------------------------------------
@replication
def test_retry_0_needs_explicit_replicate_1_in_a_cluster():
    c = SimCluster(5, 801)
    reply = c.client(0).cmd("ADDJOB", "q", "body", 0, "RETRY", 0)
    assert isinstance(reply, Error) and "REPLICATE to 1" in reply, reply
    assert isinstance(c.client(0).cmd("ADDJOB", "q", "body", 0, "RETRY", 0, "REPLICATE", 1), Status)


@pytest.mark.parametrize("seed", [811, 812, 813, 814])
def test_retry_0_jobs_are_never_delivered_twice(seed):
    c = SimCluster(5, seed, loss=0.05, dup=0.05, delay=(0, 20))
    rng = random.Random(seed)
    jobs = []
    for k in range(30):
        jobs.append(addjob(c, k % 5, "REPLICATE", 1, "RETRY", 0, body="once-%d" % k, queue="amo"))
    for step in range(300):  # 30 s of consumers, NACKs, WORKING, partitions, crashes
        c.run_for(100)
        live = [i for i in range(5) if c.alive[i]]
        if step % 50 == 10:
            c.partition(live[:2], live[2:])
        elif step % 50 == 30:
            c.heal()
        if step % 70 == 20:
            c.crash(rng.choice(live))
        elif step % 70 == 45:
            for i in range(5):
                if not c.alive[i]:
                    c.restart(i)
        live = [i for i in range(5) if c.alive[i]]
        i = rng.choice(live)
        for job_id in getjob(c, i, "amo"):
            target = rng.choice(live)
            assert c.client(target).cmd("NACK", job_id) == 0  # a delivered RETRY 0 job never goes back
            c.client(rng.choice(live)).cmd("WORKING", job_id)
    for i in range(5):
        if not c.alive[i]:
            c.restart(i)
    c.heal()
    for _ in range(50):
        for i in range(5):
            getjob(c, i, "amo")
        c.run_for(200)
    twice = {j: n for j, n in c.ledger.delivered.items() if n > 1}
    assert not twice, "RETRY 0 jobs delivered more than once: %s" % twice
    for job_id in jobs:  # and the ones that kept their only copy were delivered
        if not c.ledger.lost.get(job_id):
            assert c.ledger.delivered[job_id] == 1, (job_id, c.states(job_id))


# ---------------------------------------------------------------------------
# 9. FASTACK, NACK, WORKING
# ---------------------------------------------------------------------------
@replication
def test_ack_gc_messages_wait_a_moment_and_leave_together():
    from disque_py.core.context import GC_MESSAGE_DELAY_MS

    c = SimCluster(3, 907)
    jobs = [addjob(c, 0, "REPLICATE", 3) for _ in range(20)]
    sent_before = c.stats["sent:SETACK"]
    t0 = c.now
    client = c.client(0)
    for job in jobs:
        assert client.cmd("ACKJOB", job) == 1
        assert c.state_of(0, job) == ACKED
    assert c.stats["sent:SETACK"] == sent_before  # acked at once, SETACK not sent yet
    c.run_until(lambda: c.stats["sent:SETACK"] > sent_before, 1000, "the SETACKs")
    assert c.now - t0 <= GC_MESSAGE_DELAY_MS
    assert c.stats["sent:SETACK"] == sent_before + 2 * len(jobs)  # all of them, in one go
    for job in jobs:
        c.run_until(gone_everywhere(c, job), 1000, "the GC of every acked job")
    assert no_acked_anywhere(c)


@replication
@pytest.mark.parametrize("where", ["holder", "non_holder"])
def test_fastack_deletes_everywhere(where):
    c = SimCluster(5, 901)
    job = addjob(c, 0, "REPLICATE", 3)
    holders = c.holders(job)
    i = 0 if where == "holder" else next(n for n in range(5) if n not in holders)
    assert c.client(i).cmd("FASTACK", job) == (1 if where == "holder" else 0)
    c.run_until(gone_everywhere(c, job), 1000, "FASTACK's DELJOB everywhere")
    assert no_acked_anywhere(c)


@replication
def test_nack_counter_reaches_the_other_holders():
    c = SimCluster(5, 902)
    job = addjob(c, 0, "REPLICATE", 3, "RETRY", 30)
    assert getjob(c, 0) == [job]
    assert c.client(0).cmd("NACK", job) == 1
    c.run_for(200)
    for i in c.holders(job):
        info = c.show(i, job)
        assert info["nacks"] == 1, (i, info["nacks"])
        assert info["additional-deliveries"] == 0, (i, info["additional-deliveries"])
    assert c.queued_on(job) == [0]
    assert getjob(c, 0) == [job]


@replication
def test_working_on_one_holder_postpones_requeue_on_the_others():
    c = SimCluster(5, 903)
    job = addjob(c, 0, "REPLICATE", 3, "RETRY", 3)
    assert getjob(c, 0) == [job]
    c.run_for(2000)
    other = next(i for i in c.holders(job) if i != 0)
    worked_at = c.now
    assert c.client(other).cmd("WORKING", job) == 3
    c.run_for(100)
    for i in c.holders(job):
        left = c.show(i, job)["next-requeue-within"]
        assert left is not None and left >= 3000 - 250 - 100, (i, left)
    c.run_until(lambda: c.now >= worked_at + 3000 - 600, 5000)
    assert c.queued_on(job) == [], "requeued despite WORKING: %s" % c.states(job)
    c.run_until(lambda: len(c.queued_on(job)) == 1, 1500, "requeue one RETRY after WORKING")


# ---------------------------------------------------------------------------
# 10. Leaving nodes
# ---------------------------------------------------------------------------
@replication
def test_leaving_node_replicates_externally():
    c = SimCluster(5, 1001)
    c.set_leaving(0, True)
    cl = c.client(0)
    assert cl.cmd("ADDJOB", "q", "body", 2000, "REPLICATE", 2) is BLOCKED
    reply = cl.wait_reply(3000)
    assert isinstance(reply, Status), reply
    job = bytes(reply)
    assert c.nodes[0].store.get(job) is None  # no local copy
    c.run_until(lambda: len(c.queued_on(job)) == 1, 1000, "ENQUEUE on one holder")
    holders = c.holders(job)
    assert len(holders) == 2 and 0 not in holders
    assert getjob(c, c.queued_on(job)[0]) == [job]


@replication
def test_other_nodes_do_not_replicate_to_a_leaving_node():
    c = SimCluster(5, 1002)
    c.set_leaving(0, True)
    job = addjob(c, 1, "REPLICATE", 4)
    assert sorted(c.holders(job)) == [1, 2, 3, 4]
    reply = c.client(1).cmd("ADDJOB", "q", "body", 1000, "REPLICATE", 5)
    assert isinstance(reply, Error) and reply.prefix == "NOREPL", reply


def test_leaving_node_noreply_counts_itself_out():
    c = SimCluster(5, 1003)
    c.set_leaving(0, True)
    reply = c.client(0).cmd("ADDJOB", "q", "body", 1000, "REPLICATE", 5)
    assert isinstance(reply, Error) and reply.prefix == "NOREPL" and "leaving" in reply, reply


def test_leaving_node_refuses_to_block_in_getjob():
    c = SimCluster(5, 1004)
    c.set_leaving(0, True)
    reply = c.client(0).cmd("GETJOB", "TIMEOUT", 100, "FROM", "q")
    assert isinstance(reply, Error) and reply.prefix == "LEAVING", reply
    assert c.client(0).cmd("GETJOB", "NOHANG", "FROM", "q") is NULL_ARRAY


def test_leaving_node_makes_no_dummy_ack():
    c = SimCluster(5, 1005)
    job = addjob(c, 1, "REPLICATE", 1, "RETRY", 60)
    c.set_leaving(0, True)
    sent = c.stats["sent"]
    assert c.client(0).cmd("ACKJOB", job) == 0
    assert c.nodes[0].store.get(job) is None
    c.run_for(2000)
    assert c.stats["sent"] == sent  # nothing told to anyone: the ack is lost, as in Disque
    assert c.state_of(1, job) == QUEUED
