"""Deduplication keys (``core/dedup.py``): ADDJOB ... DEDUP on one core and on a few cores
wired together with a manual clock.

``Net`` below drives ``n`` nodes in one thread (``wired.Wired``: one clock, the real bus codec,
messages held back with ``submit``, cuts between groups, muted nodes).
"""

from __future__ import annotations

from collections import deque

import pytest

from cluster_bus.codec import decode_message, encode_message
from cluster_bus.messages import Data
from disque_py.core.dedup import QUERY_TIMEOUT_MS
from disque_py.core.lifecycle import DEFAULT_WINDOW_MS
from disque_py.core.effects import BLOCKED, Reply, Send
from disque_py.core.ids import dedup_job_id
from disque_py.core.job import QUEUED, WAIT_REPL, Job
from disque_py.core.node import Node
from disque_py.core.replies import NULL_ARRAY, Error
from disque_py.core.store import J_GONE, J_LOAD

from .conftest import T0, Harness
from .wired import WALL, Wired


def show(h, job_id) -> dict:
    reply = h.cmd("SHOW", job_id)
    assert isinstance(reply, list), reply
    return {reply[i].decode(): reply[i + 1] for i in range(0, len(reply), 2)}


class Net(Wired):
    """``n`` nodes (``wired.Wired``) and what these tests ask of them."""

    def __init__(self, n: int = 3) -> None:
        super().__init__(n, id_digit="%x", seed=b"dedup-%d")

    def getjob_everywhere(self, queue="q") -> list[tuple[int, bytes]]:
        """GETJOB NOHANG on every node, round after round (a GETJOB on a node without jobs
        may bring some from others: federation), until a round gets nothing and nothing is
        queued anywhere: every (node, job ID) delivered."""
        got = []
        for _ in range(10):
            before = len(got)
            for i in range(len(self.nodes)):
                reply = self.cmd(i, "GETJOB", "NOHANG", "COUNT", 10, "FROM", queue, client=77)
                if isinstance(reply, list):
                    got += [(i, bytes(j[1])) for j in reply]
                else:
                    assert reply is NULL_ARRAY, reply
            queued = any(j.state == QUEUED for n in self.nodes for j in n.store.values())
            if len(got) == before and not queued:
                return got
        raise AssertionError("jobs still queued after 10 rounds of GETJOB")

    def jobs_total(self) -> int:
        return sum(len(n.store) for n in self.nodes)

    def hits(self) -> int:
        return sum(n.ctx.stats["dedup_hits"] for n in self.nodes)


def _id(reply) -> bytes:
    assert isinstance(reply, bytes) and len(reply) == 40, reply
    return bytes(reply)


# =============================================================== bad input changes nothing
@pytest.mark.parametrize(
    "opts, message",
    [
        (["DEDUP", ""], "ERR DEDUP key must not be empty"),
        (["DEDUP", "k" * 513], "ERR DEDUP key is 513 bytes, at most 512"),
        (["DEDUP", "a", "DEDUP", "a"], "ERR DEDUP given twice"),
        (["DEDUP", "a", "DEDUP", "b"], "ERR DEDUP given twice"),
        (["DEDUP"], "ERR syntax error near 'DEDUP'"),
    ],
)
def test_dedup_option_errors_change_nothing(h, opts, message):
    before = dict(h.node.ctx.stats)
    reply = h.cmd("ADDJOB", "q", "b", 0, *opts)
    assert isinstance(reply, Error) and reply.prefix == "ERR", reply
    assert reply.startswith(message), reply
    assert h.cmd("QLEN", "q") == 0 and len(h.node.store) == 0
    assert h.node.ctx.stats == before and h.effects() == []
    assert h.node.lifecycle.gone == {} and h.node.dedup.queries == {}


def test_a_key_of_512_bytes_is_accepted(h):
    assert _id(h.cmd("ADDJOB", "q", "b", 0, "DEDUP", "k" * 512)) == dedup_job_id(b"q", b"k" * 512, 300)


# =============================================================== one node
def test_the_same_key_answers_the_same_id_and_adds_nothing(h):
    first = _id(h.cmd("ADDJOB", "q", "first", 0, "DEDUP", "k"))
    assert first == dedup_job_id(b"q", b"k", 300)
    for body, opts in (("second", []), ("third", ["TTL", 60, "RETRY", 5, "DELAY", 3])):
        assert _id(h.cmd("ADDJOB", "q", body, 0, "DEDUP", "k", *opts)) == first
    assert h.cmd("QLEN", "q") == 1 and len(h.node.store) == 1
    s = show(h, first)
    assert s["body"] == b"first" and s["retry"] == 300 and s["dedup"] == b"k"
    assert h.node.ctx.stats["dedup_hits"] == 2 and h.node.ctx.stats["jobs_added"] == 1
    # another key, another queue: other jobs
    assert _id(h.cmd("ADDJOB", "q", "b", 0, "DEDUP", "k2")) not in (first,)
    assert _id(h.cmd("ADDJOB", "q2", "b", 0, "DEDUP", "k")) != first
    assert h.node.ctx.stats["dedup_hits"] == 2 and len(h.node.store) == 3


def test_a_delivered_job_is_a_hit_in_every_state(h):
    job_id = _id(h.cmd("ADDJOB", "q", "b", 0, "DEDUP", "k"))
    got = h.cmd("GETJOB", "NOHANG", "FROM", "q")
    assert bytes(got[0][1]) == job_id
    assert _id(h.cmd("ADDJOB", "q", "b", 0, "DEDUP", "k")) == job_id
    assert h.cmd("QLEN", "q") == 0  # active: not queued again


def test_acked_and_collected_then_readded_within_the_window_adds_nothing(h):
    job_id = _id(h.cmd("ADDJOB", "q", "b", 0, "DEDUP", "k"))
    h.cmd("GETJOB", "NOHANG", "FROM", "q")
    assert h.cmd("ACKJOB", job_id) == 1
    h.advance(1000)
    assert h.node.store.get(job_id) is None  # collected
    assert job_id in h.node.lifecycle.gone
    h.advance(DEFAULT_WINDOW_MS - 2000)
    assert _id(h.cmd("ADDJOB", "q", "again", 0, "DEDUP", "k")) == job_id
    assert len(h.node.store) == 0 and h.cmd("QLEN", "q") == 0
    assert h.node.ctx.stats["dedup_hits"] == 1
    # after the window: a new job with that ID
    h.advance(2000)
    assert job_id not in h.node.lifecycle.gone
    assert _id(h.cmd("ADDJOB", "q", "again", 0, "DEDUP", "k")) == job_id
    assert h.cmd("QLEN", "q") == 1 and show(h, job_id)["body"] == b"again"
    assert h.node.ctx.stats["dedup_hits"] == 1


@pytest.mark.parametrize("how", ["DELJOB", "FASTACK", "expired"])
def test_every_way_a_job_ends_remembers_its_key(h, how):
    job_id = _id(h.cmd("ADDJOB", "q", "b", 0, "DEDUP", "k", "TTL", 10, "RETRY", 5))
    if how == "expired":
        h.advance(10_001)
    else:
        assert h.cmd(how, job_id) == 1
    assert h.node.store.get(job_id) is None and job_id in h.node.lifecycle.gone
    assert _id(h.cmd("ADDJOB", "q", "b", 0, "DEDUP", "k", "TTL", 10, "RETRY", 5)) == job_id
    assert len(h.node.store) == 0


def test_changing_the_window(h):
    lifecycle = h.node.lifecycle
    lifecycle.dedup_window_ms = 1000  # CONFIG SET dedup-window 1 (server/app.py)
    job_id = _id(h.cmd("ADDJOB", "q", "b", 0, "DEDUP", "k"))
    assert h.cmd("DELJOB", job_id) == 1
    assert lifecycle.gone[job_id] == h.now + 1000
    h.advance(999)
    assert _id(h.cmd("ADDJOB", "q", "b", 0, "DEDUP", "k")) == job_id and len(h.node.store) == 0
    lifecycle.dedup_window_ms = 60_000  # an ID remembered keeps its end
    h.advance(1)
    assert job_id not in lifecycle.gone
    assert _id(h.cmd("ADDJOB", "q", "b", 0, "DEDUP", "k")) == job_id and h.cmd("QLEN", "q") == 1
    # 0: forgotten with the job
    lifecycle.dedup_window_ms = 0
    assert h.cmd("DELJOB", job_id) == 1
    assert job_id not in lifecycle.gone
    assert _id(h.cmd("ADDJOB", "q", "b", 0, "DEDUP", "k")) == job_id and h.cmd("QLEN", "q") == 1


# =============================================================== several nodes
def _at_once(net: Net, nodes, *opts, key="k"):
    """ADDJOB with the same key on ``nodes`` before any of them hears of another; then the
    network delivers. Returns the replies."""
    blocked = []
    replies = {}
    for i in nodes:
        r = net.submit(i, "ADDJOB", "q", "from-%d" % i, 0, *opts, "DEDUP", key)
        if r is BLOCKED:
            blocked.append(i)
        else:
            replies[i] = r
    net.settle()
    net.advance(QUERY_TIMEOUT_MS + 10)
    for i in blocked:
        replies[i] = net.reply(i)
    return replies


@pytest.mark.parametrize("n, repl, pair", [(3, 3, (0, 1)), (3, 3, (2, 0)), (5, 2, (0, 1)), (5, 2, (3, 1)), (5, 3, (4, 2))])
@pytest.mark.parametrize("seed", range(8))
def test_the_same_key_on_two_nodes_at_once_is_one_job_queued_once(n, repl, pair, seed):
    net = Net(n)
    for i, node in enumerate(net.nodes):
        node.ctx.rng.seed(seed * 100 + i)
    replies = _at_once(net, pair, "REPLICATE", repl)
    ids = {_id(r) for r in replies.values()}
    assert len(ids) == 1, replies
    job_id = ids.pop()
    assert len(net.queued_on(job_id)) == 1, (net.holders(job_id), net.queued_on(job_id))
    for i in net.holders(job_id):
        assert net.job(i, job_id).state != WAIT_REPL
    assert len(net.holders(job_id)) >= repl
    got = net.getjob_everywhere()
    assert [j for _, j in got] == [job_id]
    i = got[0][0]
    assert net.cmd(i, "ACKJOB", job_id) == 1
    net.advance(60_000)
    assert net.getjob_everywhere() == []
    assert net.holders(job_id) == []
    # the key is remembered where it was held: a retry anywhere adds nothing
    for k in range(n):
        assert _id(net.cmd(k, "ADDJOB", "q", "b", 0, "REPLICATE", repl, "DEDUP", "k")) == job_id
    assert net.jobs_total() == 0


def test_a_node_not_holding_it_asks_and_answers_the_id():
    net = Net(5)
    job_id = _id(net.cmd(0, "ADDJOB", "q", "b", 0, "REPLICATE", 2, "DEDUP", "k"))
    holders = net.holders(job_id)
    assert len(holders) == 2
    other = next(i for i in range(5) if i not in holders)
    net.sent.clear()
    assert _id(net.cmd(other, "ADDJOB", "q", "b2", 0, "REPLICATE", 2, "DEDUP", "k", client=5)) == job_id
    assert {k for _, _, k in net.sent} == {"HASJOB", "HAVEJOB"}
    assert net.holders(job_id) == holders and net.nodes[other].ctx.stats["dedup_hits"] == 1
    # acknowledged and collected: the holders remember it, and say so
    net.cmd(net.queued_on(job_id)[0], "GETJOB", "NOHANG", "FROM", "q")
    assert net.cmd(holders[0], "ACKJOB", job_id) == 1
    net.advance(10_000)
    assert net.holders(job_id) == []
    assert all(job_id in net.nodes[i].lifecycle.gone for i in holders)
    assert _id(net.cmd(other, "ADDJOB", "q", "b3", 0, "REPLICATE", 2, "DEDUP", "k", client=5)) == job_id
    assert net.jobs_total() == 0 and net.nodes[other].ctx.stats["dedup_hits"] == 2


def test_a_query_without_an_answer_in_time_creates_the_job():
    net = Net(5)
    net.muted = {4}  # reachable, but hears nothing and says nothing
    assert net.submit(0, "ADDJOB", "q", "b", 0, "REPLICATE", 2, "DEDUP", "k") is BLOCKED
    net.settle()
    net.advance(QUERY_TIMEOUT_MS - 1)
    assert net.reply(0) is None and net.holders(dedup_job_id(b"q", b"k", 300)) == []
    net.advance(1)
    job_id = _id(net.reply(0))
    assert job_id == dedup_job_id(b"q", b"k", 300)
    assert len(net.queued_on(job_id)) == 1 and 4 not in net.holders(job_id)


def test_later_adds_wait_with_the_query_and_hit():
    net = Net(5)
    net.muted = {4}
    assert net.submit(0, "ADDJOB", "q", "b", 0, "REPLICATE", 2, "DEDUP", "k", client=1) is BLOCKED
    assert net.submit(0, "ADDJOB", "q", "b", 0, "REPLICATE", 2, "DEDUP", "k", client=2) is BLOCKED
    net.settle()
    net.advance(QUERY_TIMEOUT_MS)
    a, b = _id(net.reply(0, 1)), _id(net.reply(0, 2))
    assert a == b and net.nodes[0].ctx.stats["dedup_hits"] == 1
    assert len(net.holders(a)) == 2 and len(net.queued_on(a)) == 1


def test_a_client_that_leaves_mid_query():
    net = Net(5)
    net.muted = {4}
    job_id = dedup_job_id(b"q", b"k", 300)
    assert net.submit(0, "ADDJOB", "q", "b", 0, "REPLICATE", 2, "DEDUP", "k", client=1) is BLOCKED
    assert net.submit(0, "ADDJOB", "q", "b", 0, "REPLICATE", 2, "DEDUP", "k", client=2) is BLOCKED
    net.nodes[0].client_closed(1)
    net.settle()
    net.advance(QUERY_TIMEOUT_MS)
    assert net.reply(0, 1) is None and _id(net.reply(0, 2)) == job_id
    # alone: nothing is made, nothing is left waiting
    net2 = Net(5)
    net2.muted = {4}
    assert net2.submit(0, "ADDJOB", "q", "b", 0, "REPLICATE", 2, "DEDUP", "k", client=1) is BLOCKED
    net2.nodes[0].client_closed(1)
    net2.settle()
    net2.advance(QUERY_TIMEOUT_MS * 2)
    assert net2.reply(0, 1) is None and net2.jobs_total() == 0
    assert net2.nodes[0].dedup.queries == {} and net2.nodes[0].dedup.client_queries == {}


def test_norepl_of_a_dedup_job_keeps_it_and_a_retry_returns_its_id():
    net = Net(3)
    net.muted = {2}  # reachable, never confirms its copy
    r = net.submit(0, "ADDJOB", "q", "b", 100, "REPLICATE", 3, "DEDUP", "k")
    assert r is BLOCKED
    net.settle()
    net.advance(150)
    err_reply = net.reply(0)
    assert isinstance(err_reply, Error) and err_reply.prefix == "NOREPL", err_reply
    assert "the DEDUP job is kept with the copies made" in err_reply
    job_id = dedup_job_id(b"q", b"k", 300)
    assert net.holders(job_id) == [0, 1]
    assert net.queued_on(job_id) == [0]
    assert _id(net.cmd(0, "ADDJOB", "q", "b", 0, "REPLICATE", 3, "DEDUP", "k")) == job_id
    assert _id(net.cmd(1, "ADDJOB", "q", "b", 0, "REPLICATE", 3, "DEDUP", "k")) == job_id
    assert net.holders(job_id) == [0, 1] and net.hits() == 2
    assert [j for _, j in net.getjob_everywhere()] == [job_id]


def test_a_client_leaving_while_copies_are_made_keeps_the_job():
    net = Net(3)
    net.muted = {2}
    assert net.submit(0, "ADDJOB", "q", "b", 0, "REPLICATE", 3, "DEDUP", "k") is BLOCKED
    net.settle()
    net.nodes[0].client_closed(1)
    job_id = dedup_job_id(b"q", b"k", 300)
    assert net.queued_on(job_id) == [0] and net.holders(job_id) == [0, 1]


@pytest.mark.parametrize("seed", range(6))
def test_both_sides_of_a_partition_then_healed(seed):
    net = Net(5)
    for i, node in enumerate(net.nodes):
        node.ctx.rng.seed(seed * 10 + i)
    a, b = {0, 1, 2}, {3, 4}
    net.partition(a, b)
    ra = _id(net.cmd(0, "ADDJOB", "q", "a", 0, "REPLICATE", 2, "DEDUP", "k"))
    rb = _id(net.cmd(3, "ADDJOB", "q", "b", 0, "REPLICATE", 2, "DEDUP", "k"))
    assert ra == rb
    job_id = ra
    # a retry on each side adds nothing there
    assert _id(net.cmd(2, "ADDJOB", "q", "a", 0, "REPLICATE", 2, "DEDUP", "k")) == job_id
    assert _id(net.cmd(4, "ADDJOB", "q", "b", 0, "REPLICATE", 2, "DEDUP", "k")) == job_id
    assert len(net.queued_on(job_id, a)) == 1 and len(net.queued_on(job_id, b)) == 1
    assert len(net.holders(job_id, a)) == 2 and len(net.holders(job_id, b)) == 2
    net.heal()
    # healed: a retry anywhere answers the ID and adds nothing
    for k in range(5):
        assert _id(net.cmd(k, "ADDJOB", "q", "c", 0, "REPLICATE", 2, "DEDUP", "k")) == job_id
    assert len(net.holders(job_id)) == 4
    # consumers until nothing is left: delivered at least once (none lost). Two copies whose
    # holders never met are two jobs, each delivered until acknowledged on its side (a
    # redelivery after a cut is allowed: only one per side is promised)
    deliveries = 0
    for _ in range(6):
        got = net.getjob_everywhere()
        assert {j for _, j in got} <= {job_id}
        deliveries += len(got)
        for i, _ in got:
            assert net.cmd(i, "ACKJOB", job_id) == 1
        net.advance(301_000)
        if net.jobs_total() == 0:
            break
    assert net.jobs_total() == 0
    assert deliveries >= 1


def test_a_copy_for_a_remembered_id_is_answered_setack_and_not_kept():
    from disque_py.core.wire import job_to_wire

    import msgpack

    h = Harness()
    node = h.node
    peer = "f" * 40
    job_id = _id(h.cmd("ADDJOB", "q", "b", 0, "REPLICATE", 1, "DEDUP", "k"))  # alone: made at once
    node.ctx.cluster_size = 2
    node.ctx.known_nodes = [node.id, peer]
    node.ctx.reachable = [peer]
    assert h.cmd("DELJOB", job_id) == 1
    h.effects()
    copy = Job(job_id, QUEUED, b"q", b"b", 2, 1_700_000_000_000_000_000, h.now + 60_000, 0, 300, 0, (peer,))
    from disque_py.core.job import Extra

    copy.extra = Extra()
    copy.extra.dedup = b"k"
    body = msgpack.unpackb(msgpack.packb([job_to_wire(copy, h.now), False], use_bin_type=True), raw=False)
    node.receive_data(peer, "REPLJOB", body, h.now)
    sends = [e for e in h.effects() if type(e) is Send]
    assert [s.message[0] for s in sends] == ["SETACK"] and sends[0].to == peer
    assert node.store.get(job_id) is None and len(node.store) == 0


def test_hasjob_answers():
    h = Harness()
    node = h.node
    peer = "f" * 40
    job_id = _id(h.cmd("ADDJOB", "q", "b", 0, "REPLICATE", 1, "DEDUP", "k"))  # alone: made at once
    node.ctx.cluster_size = 2
    node.ctx.known_nodes = [node.id, peer]
    node.ctx.reachable = [peer]
    for jid, have in ((job_id, True), (dedup_job_id(b"q", b"other", 300), False)):
        node.receive_data(peer, "HASJOB", [jid], h.now)
        assert [e.message for e in h.effects()] == [("HAVEJOB", jid, have)]
    h.cmd("DELJOB", job_id)
    node.receive_data(peer, "HASJOB", [job_id], h.now)
    assert [e.message for e in h.effects() if type(e) is Send] == [("HAVEJOB", job_id, True)]
    # an answer nobody asked for changes nothing
    node.receive_data(peer, "HAVEJOB", [job_id, True], h.now)
    node.receive_data(peer, "HAVEJOB", [job_id, False], h.now)
    assert h.effects() == [] and node.bus_stats["messages_malformed"] == 0


# =============================================================== wire and AOF
def test_a_job_without_dedup_is_byte_for_byte_what_it_was():
    """The golden bytes of test_delivery's fixed job (taken before BACKOFF & co existed):
    the DEDUP field adds nothing to a job without it."""
    import msgpack

    from disque_py.core.wire import JOB_WIRE_FIELDS, job_to_wire
    from disque_py.persistence.journal import encode_entries, snapshot

    from .test_delivery import BEFORE_AOF, BEFORE_WIRE, GOOD_ID, PEER

    job = Job(GOOD_ID, QUEUED, b"q", b"body", 2, 1_700_000_000_123_456_789, T0 + 60_000, 0, 10, 0, (PEER, "e" * 40))
    job.nacks, job.deliveries = 3, 4
    wire = job_to_wire(job, T0)
    assert len(wire) == JOB_WIRE_FIELDS
    assert msgpack.packb(wire, use_bin_type=True) == BEFORE_WIRE
    assert encode_entries([(J_LOAD, job)], 0) == BEFORE_AOF
    assert b"".join(snapshot([job], 0, gone=[])) == BEFORE_AOF


def test_a_plain_addjob_writes_no_dedup_record_and_sends_no_query(h):
    from disque_py.persistence.journal import encode_entries

    journal = _journaled(h)
    job_id = h.add()
    h.cmd("DELJOB", job_id)
    data = encode_entries(journal, WALL)
    assert b"JOBEXTRA" not in data and b"DEDUPGONE" not in data
    assert h.node.lifecycle.gone == {}


def _journaled(h) -> list:
    journal: list = []
    h.node.ctx.journal = journal
    h.node.ctx.store.journal = journal
    return journal


def _fresh_loaded(data: bytes, now: int) -> Harness:
    from disque_py.persistence.loader import Loader

    h2 = Harness()
    h2.now = now
    h2.node.ctx.now = now
    loader = Loader(h2.node)
    loader.feed(data)
    truncated, _ = loader.finish(False)
    assert truncated is None
    return h2


def test_aof_key_and_gone_round_trip_through_a_restart(h):
    from disque_py.persistence.journal import encode_entries, snapshot

    journal = _journaled(h)
    kept = _id(h.cmd("ADDJOB", "q", "kept", 0, "DEDUP", "key-1", "MAXDELIVER", 3))
    done = _id(h.cmd("ADDJOB", "q", "done", 0, "DEDUP", "key-2"))
    assert h.cmd("DELJOB", done) == 1
    until = h.node.lifecycle.gone[done]
    assert [job.id for k, job in journal if k == J_GONE] == [done]
    data = encode_entries(journal, WALL)
    assert b"JOBEXTRA" in data and b"DEDUPGONE" in data
    rewrite = b"".join(snapshot(h.node.store.values(), WALL, gone=list(h.node.lifecycle.gone.items())))
    for name, blob in (("journal", data), ("rewrite", rewrite)):
        h2 = _fresh_loaded(blob, h.now + 5000)
        node = h2.node
        assert node.lifecycle.gone == {done: until}, name
        job = node.store.get(kept)
        assert job is not None and job.extra.dedup == b"key-1" and job.extra.maxdeliver == 3, name
        assert _id(h2.cmd("ADDJOB", "q", "x", 0, "DEDUP", "key-1", "MAXDELIVER", 3)) == kept
        assert _id(h2.cmd("ADDJOB", "q", "x", 0, "DEDUP", "key-2")) == done
        assert len(node.store) == 1 and node.ctx.stats["dedup_hits"] == 2, name
        # the window still ends where it did
        h2.advance(until - h2.now)
        assert done not in node.lifecycle.gone


def test_a_gone_record_past_its_window_is_not_restored(h):
    from disque_py.persistence.journal import encode_entries

    journal = _journaled(h)
    h.node.lifecycle.dedup_window_ms = 1000
    done = _id(h.cmd("ADDJOB", "q", "done", 0, "DEDUP", "k"))
    h.cmd("DELJOB", done)
    h2 = _fresh_loaded(encode_entries(journal, WALL), h.now + 1000)
    assert h2.node.lifecycle.gone == {}
    assert _id(h2.cmd("ADDJOB", "q", "x", 0, "DEDUP", "k")) == done and len(h2.node.store) == 1


def test_the_key_travels_with_the_copies():
    net = Net(3)
    job_id = _id(net.cmd(0, "ADDJOB", "q", "b", 0, "REPLICATE", 3, "DEDUP", "kk"))
    for i in range(3):
        assert net.job(i, job_id).extra.dedup == b"kk"


@pytest.mark.parametrize("seed", range(6))
def test_two_makers_whose_copies_time_out_queue_it_once(seed):
    # a node killed and not flagged yet: two producers add the same key on two nodes at once,
    # neither gets the dead node's copy, both are answered NOREPL and keep the job: one of
    # the two queues it, and it is delivered once
    net = Net(3)
    for i, node in enumerate(net.nodes):
        node.ctx.rng.seed(seed * 100 + i)
    net.muted = {2}
    job_id = dedup_job_id(b"q", b"k", 300)
    for i in (0, 1):
        assert net.submit(i, "ADDJOB", "q", "b", 100, "REPLICATE", 3, "DEDUP", "k") is BLOCKED
    net.settle()
    net.advance(150)
    for i in (0, 1):
        reply = net.reply(i)
        assert isinstance(reply, Error) and reply.prefix == "NOREPL", reply
        assert "the DEDUP job is kept" in reply
    net.settle()
    assert net.holders(job_id) == [0, 1]
    assert len(net.queued_on(job_id)) == 1, net.queued_on(job_id)
    got = net.getjob_everywhere()
    assert [j for _, j in got] == [job_id]
    assert net.cmd(got[0][0], "ACKJOB", job_id) == 1
    net.advance(60_000)  # past the RETRY of the copy held by the other maker
    assert net.getjob_everywhere() == []


def test_slots_made_while_a_killed_node_is_not_flagged_reach_the_makers_consumers_in_time():
    # The periodic proof's lost slot (tests/tasks/test_periodic_process.py): node 1 killed, its
    # link down but not flagged yet, so an ADDJOB of three copies waits for it until its
    # timeout (5 s), while the other holder's copy comes to its RETRY (4 s) first and is
    # queued there, on a node without consumers. The maker yielded to it (QUEUED, dedup.py),
    # and a move of it to the maker's waiting consumers was dropped (the maker still waited
    # for its copies): nobody queued it where a consumer waited, until the consumers' node
    # asked again, with the discovery's backoff (up to 30 s). Each slot reaches the consumer
    # waiting on its maker's node once the ADDJOB's wait ends.
    net = Net(3)
    net.muted = {1}
    for i, other in ((0, 2), (2, 0)):
        net.node(i).ctx.reachable = [net.ids[other]]
        net.node(i).ctx.live_nodes = 2  # Disque's count: node 1 not PFAIL yet
    assert net.submit(2, "GETJOB", "TIMEOUT", 0, "FROM", "q", client=50) is BLOCKED
    net.advance(40_000)  # the consumer waited a while: discovery has backed off
    late = []
    for slot in range(8):
        key = "periodic:tick:%d" % slot
        assert net.submit(2, "ADDJOB", "q", "b", 5000, "RETRY", 4, "DEDUP", key) is BLOCKED
        net.settle()
        made = net.now
        got = None
        while got is None and net.now - made < 30_000:
            net.advance(100)
            got = net.reply(2, 50)
        assert got is not None, "slot %d never delivered" % slot
        job_id = bytes(got[0][1])
        assert job_id == dedup_job_id(b"q", key.encode(), 4)
        late.append(net.now - made)
        reply = net.reply(2)
        assert isinstance(reply, Error) and "the DEDUP job is kept" in reply, reply
        assert net.cmd(2, "ACKJOB", job_id) == 1
        assert net.submit(2, "GETJOB", "TIMEOUT", 0, "FROM", "q", client=50) is BLOCKED
    assert max(late) <= 5100, late  # at the end of the ADDJOB's wait at the latest
