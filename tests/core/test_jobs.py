"""ADDJOB / GETJOB / ACKJOB and the job timers, on one core with a manual clock."""

from __future__ import annotations

import re

import pytest

from disque_py.core import invariants
from disque_py.core.effects import BLOCKED
from disque_py.core.ids import ID_BATCH, JobIdGenerator, is_at_most_once_id, ttl_minutes_from_id, valid_job_id
from disque_py.core.replies import NULL_ARRAY, Error, Status

from .conftest import NODE_ID

ID_RE = re.compile(rb"^D-[0-9a-f]{8}-[A-Za-z0-9+/]{24}-[0-9a-f]{4}$")


def show(h, job_id) -> dict:
    reply = h.cmd("SHOW", job_id)
    return {reply[i].decode(): reply[i + 1] for i in range(0, len(reply), 2)}


# ---------------------------------------------------------------- ADDJOB
def test_addjob_returns_status_id_with_node_prefix_and_ttl_parity(h):
    reply = h.cmd("ADDJOB", "q", "hello", 0)
    assert type(reply) is Status
    assert ID_RE.match(reply)
    assert reply[2:10] == NODE_ID[:8].encode()
    # default TTL one day = 1440 minutes, RETRY > 0 -> odd
    assert ttl_minutes_from_id(reply) == 1441
    assert not is_at_most_once_id(reply)
    at_most_once = h.add("q", "x", "RETRY", 0)
    assert is_at_most_once_id(at_most_once)
    assert ttl_minutes_from_id(at_most_once) == 1440
    assert h.add("q", "x", "TTL", 600) != h.add("q", "x", "TTL", 600)


def test_addjob_defaults_as_disque(h):
    jid = h.add("q", "b")
    info = show(h, jid)
    assert info["state"] == "queued"
    assert info["repl"] == 1
    assert info["retry"] == 300
    assert info["delay"] == 0
    assert info["ttl"] == 86400 - 1 or info["ttl"] == 86400
    assert info["nodes-delivered"] == [NODE_ID]
    # small TTL: retry defaults to TTL/10, at least 1
    assert show(h, h.add("q", "b", "TTL", 50))["retry"] == 5
    assert show(h, h.add("q", "b", "TTL", 5))["retry"] == 1


@pytest.mark.parametrize(
    "opts, message",
    [
        (["REPLICATE", 0], "ERR REPLICATE must be between 1 and 65535"),
        (["REPLICATE", 65536], "ERR REPLICATE must be between 1 and 65535"),
        (["REPLICATE", "x"], "ERR REPLICATE must be between 1 and 65535"),
        (["TTL", 0], "ERR TTL must be a number > 0"),
        (["TTL", "1.5"], "ERR TTL must be a number > 0"),
        (["RETRY", -1], "ERR RETRY time must be a non negative number"),
        (["DELAY", -1], "ERR DELAY time must be a non negative number"),
        (["MAXLEN", 0], "ERR MAXLEN must be a positive number"),
        (["BOGUS"], "ERR syntax error near 'BOGUS'"),
        (["RETY", 10], "ERR syntax error near 'RETY'"),
        (["TTL"], "ERR syntax error near 'TTL': a value must follow it"),
        (["ASYNC", "retry"], "ERR syntax error near 'retry': a value must follow it"),
        (["RETRY", 0, "REPLICATE", 2], "ERR With RETRY set to 0 please explicitly set REPLICATE to 1"),
        (["DELAY", 10, "TTL", 10], "ERR The specified DELAY is greater than TTL"),
    ],
)
def test_addjob_validation_errors(h, opts, message):
    reply = h.cmd("ADDJOB", "q", "b", 0, *opts)
    assert isinstance(reply, Error)
    assert reply.startswith(message)
    assert h.cmd("QLEN", "q") == 0


def test_addjob_syntax_error_quotes_the_word_safely(h):
    # The word is a client's bytes: no CR/LF may reach the error line, and a long one is cut.
    reply = h.cmd("ADDJOB", "q", "b", 0, b"RE\r\nTRY")
    assert reply == "ERR syntax error near 'RE\\x0d\\x0aTRY'"
    reply = h.cmd("ADDJOB", "q", "b", 0, "x" * 1000)
    assert reply == "ERR syntax error near '%s...'" % ("x" * 40)


def test_addjob_bad_timeout(h):
    assert h.cmd("ADDJOB", "q", "b", "abc") == "ERR timeout is not an integer or out of range"
    assert h.cmd("ADDJOB", "q", "b", -1) == "ERR timeout is negative"


def test_addjob_replicate_more_than_cluster_is_norepl(h):
    reply = h.cmd("ADDJOB", "q", "b", 0, "REPLICATE", 2)
    assert reply.prefix == "NOREPL"


def test_addjob_maxlen_and_paused_in(h):
    h.add("q")
    h.add("q")
    assert h.cmd("ADDJOB", "q", "b", 0, "MAXLEN", 2).prefix == "MAXLEN"
    assert isinstance(h.cmd("ADDJOB", "q", "b", 0, "MAXLEN", 3), Status)
    assert h.cmd("PAUSE", "q", "in") == b"in"
    assert h.cmd("ADDJOB", "q", "b", 0).prefix == "PAUSED"
    assert h.cmd("PAUSE", "q", "none") == b"none"
    assert isinstance(h.cmd("ADDJOB", "q", "b", 0), Status)


def test_binary_body_round_trip(h):
    body = bytes(range(256)) * 4
    jid = h.add("q", body)
    assert h.cmd("GETJOB", "FROM", "q") == [[b"q", jid, body]]


# ---------------------------------------------------------------- GETJOB
def test_getjob_order_by_creation_and_queues_left_to_right(h):
    a1 = h.add("a", "1")
    b1 = h.add("b", "1")
    a2 = h.add("a", "2")
    got = h.cmd("GETJOB", "COUNT", 10, "FROM", "b", "a")
    # round robin over the queues, in the order given, oldest first
    assert [j[1] for j in got] == [b1, a1, a2]
    assert h.cmd("GETJOB", "NOHANG", "FROM", "a", "b") is NULL_ARRAY


def test_getjob_count_and_withcounters(h):
    ids = [h.add("q", str(i)) for i in range(5)]
    got = h.cmd("GETJOB", "COUNT", 3, "WITHCOUNTERS", "FROM", "q")
    assert [j[1] for j in got] == ids[:3]
    assert got[0][3:] == [b"nacks", 0, b"additional-deliveries", 0]
    assert h.cmd("QLEN", "q") == 2


@pytest.mark.parametrize(
    "argv, message",
    [
        (["GETJOB", "q"], "ERR syntax error near 'q': the queues must follow FROM"),
        (["GETJOB", "NOHANG"], "ERR syntax error near 'NOHANG': FROM and at least one queue must follow"),
        (["GETJOB", "FROM"], "ERR syntax error near 'FROM': at least one queue must follow it"),
        (["GETJOB", "NOHANG", "TIMEOUT"], "ERR syntax error near 'TIMEOUT': a value must follow it"),
        (["GETJOB", "COUNTS", 2, "FROM", "q"], "ERR syntax error near 'COUNTS': the queues must follow FROM"),
        (["GETJOB", "COUNT", 0, "FROM", "q"], "ERR COUNT must be a number greater than zero"),
        (["GETJOB", "TIMEOUT", "x", "FROM", "q"], "ERR timeout is not an integer or out of range"),
        (["GETJOB", "TIMEOUT", -5, "FROM", "q"], "ERR timeout is negative"),
    ],
)
def test_getjob_errors(h, argv, message):
    assert h.cmd(*argv) == message


def test_getjob_blocks_then_served_by_addjob_fifo(h):
    assert h.cmd("GETJOB", "FROM", "q", client=10) is BLOCKED
    assert h.cmd("GETJOB", "FROM", "q", client=11) is BLOCKED
    assert h.node.blocked_clients == 2
    assert dict(zip(h.cmd("QSTAT", "q")[::2], h.cmd("QSTAT", "q")[1::2]))[b"blocked"] == 2
    j1 = h.add("q", "one")
    assert h.replies() == {10: [[b"q", j1, b"one"]]}
    j2 = h.add("q", "two")
    assert h.replies() == {11: [[b"q", j2, b"two"]]}
    assert h.node.blocked_clients == 0


def test_getjob_timeout_returns_null_array(h):
    assert h.cmd("GETJOB", "TIMEOUT", 100, "FROM", "q", client=5) is BLOCKED
    assert h.advance(99) == []
    effects = h.advance(1)
    assert [(e.client, e.value) for e in effects] == [(5, NULL_ARRAY)]
    # nothing left behind: a later job stays queued
    h.add("q")
    assert h.replies() == {}
    assert h.cmd("QLEN", "q") == 1


def test_disconnected_waiter_leaves_no_trace(h):
    assert h.cmd("GETJOB", "FROM", "q", client=5) is BLOCKED
    assert h.cmd("GETJOB", "FROM", "q", client=6) is BLOCKED
    h.node.client_closed(5)
    jid = h.add("q")
    assert h.replies() == {6: [[b"q", jid, b"body"]]}
    assert h.node.blocked_clients == 0
    stat = h.cmd("QSTAT", "q")
    assert stat[stat.index(b"blocked") + 1] == 0


def test_blocked_on_several_queues_served_once(h):
    assert h.cmd("GETJOB", "FROM", "a", "b", "a", client=5) is BLOCKED
    jb = h.add("b")
    assert h.replies() == {5: [[b"b", jb, b"body"]]}
    h.add("a")
    assert h.replies() == {}
    assert h.cmd("QLEN", "a") == 1


def test_pause_out_keeps_waiters_blocked_until_cleared(h):
    assert h.cmd("PAUSE", "q", "out") == b"out"
    assert h.cmd("GETJOB", "FROM", "q", client=5) is BLOCKED
    jid = h.add("q")
    assert h.replies() == {}
    assert h.cmd("GETJOB", "NOHANG", "FROM", "q", client=6) is NULL_ARRAY
    assert h.cmd("PAUSE", "q", "none") == b"none"
    assert h.replies() == {5: [[b"q", jid, b"body"]]}


# ---------------------------------------------------------------- timers
def test_unacked_job_requeued_after_retry_exactly_once(h):
    jid = h.add("q", "b", "RETRY", 10)
    assert h.cmd("GETJOB", "FROM", "q")[0][1] == jid
    h.advance(9_700)  # retry minus the max desync (250 ms)
    assert h.cmd("QLEN", "q") == 0
    h.advance(600)
    assert h.cmd("QLEN", "q") == 1
    info = show(h, jid)
    assert info["state"] == "queued"
    assert info["additional-deliveries"] == 1
    # still queued at the next retry: no duplicate in the queue
    h.advance(20_000)
    assert h.cmd("QLEN", "q") == 1
    got = h.cmd("GETJOB", "WITHCOUNTERS", "FROM", "q")
    assert got[0][1] == jid and got[0][6] == 1


def test_at_most_once_never_requeued(h):
    jid = h.add("q", "b", "RETRY", 0)
    assert h.cmd("GETJOB", "FROM", "q")[0][1] == jid
    h.advance(3_600_000)
    assert h.cmd("QLEN", "q") == 0
    assert show(h, jid)["state"] == "active"
    assert show(h, jid)["next-requeue-within"] is None
    # ENQUEUE/NACK refuse a delivered at-most-once job
    assert h.cmd("ENQUEUE", jid) == 0
    assert h.cmd("NACK", jid) == 0
    assert h.cmd("QLEN", "q") == 0


def test_ttl_expires_job_in_any_state(h):
    queued = h.add("q", "b", "TTL", 60)
    active = h.add("q", "b", "TTL", 60)
    h.cmd("DEQUEUE", active)
    h.advance(59_000)
    assert h.cmd("SHOW", queued) is not None
    h.advance(1_001)
    assert h.cmd("SHOW", queued) is None
    assert h.cmd("SHOW", active) is None
    assert h.cmd("QLEN", "q") == 0
    assert h.node.stats["jobs_expired"] == 2


def test_delay_defers_first_queueing(h):
    jid = h.add("q", "b", "DELAY", 5)
    assert show(h, jid)["state"] == "active"
    assert h.cmd("GETJOB", "TIMEOUT", 10_000, "FROM", "q", client=7) is BLOCKED
    assert h.advance(4_999) == []
    assert h.replies() == {}
    effects = h.advance(1)
    assert [e.value for e in effects] == [[[b"q", jid, b"b"]]]


def test_delay_with_retry_zero_is_still_queued_once(h):
    jid = h.add("q", "b", "DELAY", 2, "RETRY", 0)
    h.advance(2_000)
    assert h.cmd("GETJOB", "NOHANG", "FROM", "q")[0][1] == jid
    h.advance(600_000)
    assert h.cmd("QLEN", "q") == 0


def test_paused_in_postpones_requeue(h):
    jid = h.add("q", "b", "RETRY", 2)
    h.cmd("GETJOB", "FROM", "q")
    h.cmd("PAUSE", "q", "in")
    h.advance(2_300)
    assert show(h, jid)["state"] == "active"
    h.cmd("PAUSE", "q", "none")
    h.advance(2_300)
    assert show(h, jid)["state"] == "queued"


# ---------------------------------------------------------------- acks
def test_ackjob_deletes_on_single_node_and_counts_known(h):
    jid = h.add("q")
    h.cmd("GETJOB", "FROM", "q")
    assert h.cmd("ACKJOB", jid) == 1
    assert h.cmd("SHOW", jid) is None
    assert h.cmd("ACKJOB", jid) == 0
    unknown = b"D-00000000-AAAAAAAAAAAAAAAAAAAAAAAA-05a1"
    assert h.cmd("ACKJOB", unknown) == 0
    assert len(h.node.store) == 0  # no dummy ack on a one-node cluster


def test_ackjob_queued_job_is_dequeued(h):
    jid = h.add("q")
    assert h.cmd("ACKJOB", jid) == 1
    assert h.cmd("QLEN", "q") == 0


def test_ack_never_requeues(h):
    jid = h.add("q", "b", "RETRY", 1)
    h.cmd("GETJOB", "FROM", "q")
    h.cmd("ACKJOB", jid)
    h.advance(10_000)
    assert h.cmd("QLEN", "q") == 0


def test_fastack_and_deljob(h):
    a, b, c = h.add(), h.add(), h.add()
    assert h.cmd("FASTACK", a, b"D-00000000-AAAAAAAAAAAAAAAAAAAAAAAA-05a1") == 1
    assert h.cmd("DELJOB", b, c, b) == 2
    assert h.cmd("QLEN", "q") == 0
    assert len(h.node.store) == 0


@pytest.mark.parametrize("cmd", ["ACKJOB", "FASTACK", "DELJOB", "ENQUEUE", "DEQUEUE", "NACK", "SHOW", "WORKING"])
@pytest.mark.parametrize(
    "bad",
    [
        b"nope",
        b"D-00000000-AAAAAAAAAAAAAAAAAAAAAAAA-05a",
        b"X-00000000-AAAAAAAAAAAAAAAAAAAAAAAA-05a1",
        b"D-00000000-AAAAAAAAAAAAAAAAAAAAAAAA-zzzz",
    ],
)
def test_bad_ids_are_badid(h, cmd, bad):
    jid = h.add()
    reply = h.cmd(cmd, bad)
    assert reply == "BADID Invalid Job ID format."
    assert h.cmd("QLEN", "q") == 1 and h.cmd("SHOW", jid) is not None


def test_valid_job_id_shape():
    assert valid_job_id(b"D-dcb833cf-8YL1NT17e9+wsA/09NqxscQI-05a1")
    assert not valid_job_id(b"D-dcb833cf-8YL1NT17e9+wsA/09NqxscQI-05a1x")


def test_ids_made_in_batches_stay_unique_and_well_formed_across_batches():
    # The random parts are made ID_BATCH at a time: the IDs on either side of a batch's end
    # are as distinct and as well formed as any others.
    count = 3 * ID_BATCH + 5
    gen = JobIdGenerator(NODE_ID, b"seed")
    made = [gen.new_id(3600 + 60 * (i % 3), i % 2) for i in range(count)]
    assert len(set(made)) == count
    assert len({m[11:35] for m in made}) == count  # the random parts themselves never repeat
    for i, job_id in enumerate(made):
        assert valid_job_id(job_id) and job_id.startswith(b"D-" + NODE_ID[:8].encode() + b"-")
        assert is_at_most_once_id(job_id) == (i % 2 == 0)
        assert ttl_minutes_from_id(job_id) >> 1 == (60 + i % 3) >> 1
    # one seed, one sequence (simulations replay from their seed); another seed shares none
    again = JobIdGenerator(NODE_ID, b"seed")
    assert [again.new_id(3600 + 60 * (i % 3), i % 2) for i in range(count)] == made
    other = JobIdGenerator(NODE_ID, b"other seed")
    assert not {m[11:35] for m in made} & {other.new_id(3600, 1)[11:35] for _ in range(count)}


# ---------------------------------------------------------------- NACK / ENQUEUE / DEQUEUE / WORKING
def test_nack_and_enqueue_counters(h):
    jid = h.add()
    h.cmd("GETJOB", "FROM", "q")
    assert h.cmd("NACK", jid) == 1
    assert h.cmd("NACK", jid) == 0  # already queued
    got = h.cmd("GETJOB", "WITHCOUNTERS", "FROM", "q")
    assert got[0][4] == 1 and got[0][6] == 0
    assert h.cmd("ENQUEUE", jid) == 1
    got = h.cmd("GETJOB", "WITHCOUNTERS", "FROM", "q")
    assert got[0][4] == 1 and got[0][6] == 1
    assert h.cmd("DEQUEUE", jid) == 0
    h.cmd("ENQUEUE", jid)
    assert h.cmd("DEQUEUE", jid) == 1
    assert h.cmd("QLEN", "q") == 0


def test_working_postpones_requeue(h):
    jid = h.add("q", "b", "RETRY", 10)
    h.cmd("GETJOB", "FROM", "q")
    h.advance(8_000)
    assert h.cmd("WORKING", jid) == 10
    h.advance(9_000)  # 17 s after fetch, 9 s after WORKING
    assert h.cmd("QLEN", "q") == 0
    h.advance(1_300)
    assert h.cmd("QLEN", "q") == 1


def test_working_errors(h):
    assert h.cmd("WORKING", b"D-00000000-AAAAAAAAAAAAAAAAAAAAAAAA-05a1").prefix == "NOJOB"
    jid = h.add("q", "b", "TTL", 100, "RETRY", 10)
    h.advance(49_000)
    assert h.cmd("WORKING", jid) == 10
    h.advance(2_000)
    assert h.cmd("WORKING", jid).prefix == "TOOLATE"


# ---------------------------------------------------------------- SHOW
def test_show_fields_as_disque(h):
    jid = h.add("q", "payload", "RETRY", 30, "TTL", 600)
    info = show(h, jid)
    assert list(info) == [
        "id", "queue", "state", "repl", "ttl", "ctime", "delay", "retry", "nacks",
        "additional-deliveries", "nodes-delivered", "nodes-confirmed",
        "next-requeue-within", "next-awake-within", "body",
    ]  # fmt: skip
    assert info["id"] == jid and info["queue"] == b"q" and info["body"] == b"payload"
    assert 29_700 <= info["next-requeue-within"] <= 30_300
    assert info["ctime"] == 1_700_000_000_000 * 1_000_000
    assert h.cmd("SHOW", b"D-00000000-AAAAAAAAAAAAAAAAAAAAAAAA-05a1") is None


def test_ctime_strictly_increasing_within_a_millisecond(h):
    ids = [h.add() for _ in range(3)]
    ctimes = [show(h, j)["ctime"] for j in ids]
    assert ctimes == sorted(set(ctimes))


# ---------------------------------------------------------------- arity / unknown
def test_unknown_command_and_arity(h):
    assert h.cmd("NOPE") == "ERR unknown command 'NOPE'"
    assert h.cmd("ADDJOB", "q", "b") == "ERR wrong number of arguments for 'addjob' command"
    assert h.cmd("SHOW") == "ERR wrong number of arguments for 'show' command"
    assert h.cmd("QPEEK", "q") == "ERR wrong number of arguments for 'qpeek' command"
    assert h.cmd("ACKJOB") == 0


@pytest.mark.parametrize(
    "bad",
    [
        b"D-0000\r\n00-AAAAAAAAAAAAAAAAAAAAAAAA-05a1",
        b"D-00000000-AAAAAAAAAAAA\r\nAAAAAAAAAA-05a1",
        b"D-00000000-AAAAAAAAAAAA AAAAAAAAAAA-05a1",
        b"D-0000000g-AAAAAAAAAAAAAAAAAAAAAAAA-05a1",
    ],
)
def test_ids_with_foreign_characters_are_badid(h, bad):
    assert len(bad) == 40
    assert h.cmd("ACKJOB", bad) == "BADID Invalid Job ID format."


# ---------------------------------------------------------------- jobs too big for the bus
def test_a_job_too_big_for_one_bus_message_is_refused_at_addjob(h):
    from disque_py.core.commands import MAX_JOB_BYTES

    reply = h.cmd("ADDJOB", "q", b"x" * (MAX_JOB_BYTES - 1), 0)  # with the queue name: MAX_JOB_BYTES
    assert isinstance(reply, bytes) and len(reply) == 40
    reply = h.cmd("ADDJOB", "q", b"x" * MAX_JOB_BYTES, 0)
    assert reply == (
        "ERR Job too big: %d bytes of body and queue name, at most %d can be replicated or moved "
        "(a fixed limit: one cluster bus message carries a job)" % (MAX_JOB_BYTES + 1, MAX_JOB_BYTES)
    )
    assert h.cmd("QLEN", "q") == 1


def test_moved_jobs_too_big_together_travel_in_several_yourjobs(h):
    """A peer asks for 3 jobs of 25 MB: one YOURJOBS would not fit a bus frame, so 2 + 1."""
    from disque_py.core.commands import MAX_JOB_BYTES
    from disque_py.core.effects import Send

    peer = "f" * 40
    h.node.ctx.reachable = [peer]
    h.node.ctx.cluster_size = 2
    body = b"x" * (25 * 1024 * 1024)
    ids = [h.add("q", body, "REPLICATE", 1) for _ in range(6)]  # NEEDJOBS takes half the queue at most
    h.effects()
    h.node.receive_data(peer, "NEEDJOBS", [b"q", 3], h.now)
    sent = [e.message for e in h.effects() if isinstance(e, Send) and e.message[0] == "YOURJOBS"]
    assert [len(m[1]) for m in sent] == [2, 1]
    assert all(sum(len(w[1]) + len(w[2]) for w in m[1]) <= MAX_JOB_BYTES for m in sent)
    assert [w[0] for m in sent for w in m[1]] == ids[:3]
    assert h.cmd("QLEN", "q") == 3


def test_replication_resends_back_off_when_no_node_is_left_to_add(h):
    """REPLJOB goes again to a holder that has not confirmed: every 50 ms while nodes are added
    (Disque), then, with none left to add, at 100, 200, 400, 800 and 1000 ms intervals, so that
    copies of a big job do not pile up on a link faster than the peer can read them."""
    from disque_py.core.effects import Send

    peer = "f" * 40
    h.node.ctx.reachable = [peer]
    h.node.ctx.cluster_size = 2
    t0 = h.now
    assert h.cmd("ADDJOB", "q", "body", 5000, "REPLICATE", 2) is BLOCKED
    assert [e.to for e in h.effects() if isinstance(e, Send)] == [peer]  # the first copy
    sends = []
    for _ in range(4000):
        for e in h.advance(1):
            if isinstance(e, Send) and e.message[0] == "REPLJOB":
                sends.append(h.now - t0)
    assert sends == [50, 150, 350, 750, 1550, 2550, 3550]


def test_replication_resends_skip_a_backlogged_link_but_new_holders_get_their_copy(h):
    """A holder whose link still holds unsent output (``ctx.backlogged``, kept by the shell) gets
    no resend: the copy before has not left yet. A node added meanwhile still gets its first copy,
    and the resends to the first holder resume once its link has drained."""
    from disque_py.core.effects import Send

    slow, late = "e" * 40, "f" * 40
    h.node.ctx.reachable = [slow]
    h.node.ctx.cluster_size = 3
    t0 = h.now
    assert h.cmd("ADDJOB", "q", "body", 5000, "REPLICATE", 2) is BLOCKED
    assert [e.to for e in h.effects() if isinstance(e, Send)] == [slow]
    h.node.ctx.backlogged = frozenset([slow])
    sends = []

    def run(ms):
        for _ in range(ms):
            for e in h.advance(1):
                if isinstance(e, Send) and e.message[0] == "REPLJOB":
                    sends.append((h.now - t0, e.to))

    run(400)
    assert sends == []  # 50, 150 and 350 ms: no resend while the first copy waits on the link
    h.node.ctx.reachable = [slow, late]
    run(360)
    assert sends == [(750, late)]  # the node added gets its copy; the backlogged one does not
    h.node.ctx.backlogged = frozenset()
    run(50)
    assert sorted(sends[1:]) == [(800, slow), (800, late)]  # the link drained: both resent


def test_new_copies_go_to_nodes_without_a_backlog_first(h):
    """Among reachable nodes, those whose link still holds unsent output are picked last for a new
    job's copies (still picked when there are not enough others), and the pick stays random."""
    from disque_py.core.effects import Send

    peers = [c * 40 for c in "bcdef"]
    h.node.ctx.reachable = list(peers)
    h.node.ctx.cluster_size = 6
    h.node.ctx.backlogged = frozenset(peers[:3])
    chosen = set()
    for i in range(40):
        assert h.cmd("ADDJOB", "q%d" % i, "body", 0, "REPLICATE", 2, "ASYNC") is not BLOCKED
        sent = {e.to for e in h.effects() if isinstance(e, Send) and e.message[0] == "REPLJOB"}
        assert len(sent) == 1 and sent <= set(peers[3:])
        chosen |= sent
    assert chosen == set(peers[3:])  # both free nodes get picked: still a random choice
    assert h.cmd("ADDJOB", "big", "body", 0, "REPLICATE", 4, "ASYNC") is not BLOCKED
    sent = {e.to for e in h.effects() if isinstance(e, Send) and e.message[0] == "REPLJOB"}
    assert len(sent) == 3 and set(peers[3:]) <= sent  # the two free ones, then a backlogged one


def test_moves_that_never_left_bring_their_at_most_once_jobs_back(h):
    """The shell hands back a YOURJOBS whose link closed before the socket took it
    (``on_moves_unsent``, after the peer stopped being reachable): its RETRY 0 jobs, whose only
    copy it carried, are queued here again and delivered once; its at-least-once jobs are not
    duplicated (their copy here stayed), nor is a RETRY 0 job deleted here meanwhile."""
    from disque_py.core.effects import Send
    from disque_py.core.messages import moves_to_watch

    peer = "f" * 40
    h.node.ctx.reachable = [peer]
    h.node.ctx.cluster_size = 2
    h.node.receive_data(peer, "NEEDJOBS", [b"q", 10], h.now)  # a lease: new jobs are pushed
    h.effects()
    amo = [h.add("q", "body%d" % i, "REPLICATE", 1, "RETRY", 0) for i in range(2)]
    alo = h.add("q", "kept", "REPLICATE", 1, "RETRY", 30)
    messages = [e.message for e in h.effects() if isinstance(e, Send) and e.message[0] == "YOURJOBS"]
    assert [w[0] for m in messages for w in m[1]] == amo + [alo] and h.cmd("QLEN", "q") == 0
    assert [moves_to_watch(m) for m in messages] == [True, True, False]
    assert moves_to_watch(("YOURJOBS", messages[2][1] + messages[0][1]))
    assert h.node.store.get(amo[0]) is None  # its only copy left with the message

    def hand_back() -> None:
        for m in messages:
            h.node.on_moves_unsent(peer, m, h.now)

    h.node.ctx.reachable = []  # the link went down first
    hand_back()
    assert h.cmd("QLEN", "q") == 2 and h.node.stats["jobs_returned"] == 2
    assert not [e for e in h.effects() if isinstance(e, Send)]  # nowhere to go now: stays here
    got = [h.cmd("GETJOB", "NOHANG", "FROM", "q")[0] for _ in range(2)]
    assert [(g[1], g[2]) for g in got] == [(amo[0], b"body0"), (amo[1], b"body1")]
    assert h.cmd("GETJOB", "NOHANG", "FROM", "q") is NULL_ARRAY
    assert show(h, alo)["state"] == "active"  # still here, requeued after RETRY
    hand_back()  # again (a copy already here): nothing twice
    assert h.cmd("QLEN", "q") == 0 and h.node.stats["jobs_returned"] == 2
    assert h.cmd("ACKJOB", amo[0]) == 1 and h.cmd("FASTACK", amo[1]) == 1
    hand_back()  # deleted here: stays deleted
    assert h.cmd("QLEN", "q") == 0 and h.node.stats["jobs_returned"] == 2


def test_a_move_handed_back_goes_on_at_once_to_another_node_that_waits(h):
    """A RETRY 0 job handed back (``on_moves_unsent``) while another peer holds a lease is pushed
    to that peer in the same call, not left for the next input."""
    from disque_py.core.effects import Send

    gone, other = "e" * 40, "f" * 40
    h.node.ctx.reachable = [gone]
    h.node.ctx.cluster_size = 3
    h.node.receive_data(gone, "NEEDJOBS", [b"q", 10], h.now)
    jid = h.add("q", "body", "REPLICATE", 1, "RETRY", 0)
    (message,) = [e.message for e in h.effects() if isinstance(e, Send) and e.message[0] == "YOURJOBS"]
    h.node.ctx.reachable = [other]
    h.node.receive_data(other, "NEEDJOBS", [b"q", 10], h.now)
    h.effects()
    h.node.on_moves_unsent(gone, message, h.now)
    sent = [(e.to, e.message) for e in h.node.take_effects() if isinstance(e, Send)]
    assert [(to, [w[0] for w in m[1]]) for to, m in sent] == [(other, [jid])]
    assert h.cmd("QLEN", "q") == 0 and h.node.stats["jobs_returned"] == 1


def _yourjobs(effects) -> list[tuple[str, list[bytes]]]:
    from disque_py.core.effects import Send

    return [(e.to, [w[0] for w in e.message[1]]) for e in effects if isinstance(e, Send) and e.message[0] == "YOURJOBS"]


def test_a_move_handed_back_goes_to_its_peer_as_soon_as_its_link_is_up_again(h):
    """A RETRY 0 job pushed under a lease whose link closed before the socket took it comes back
    (``on_moves_unsent``) and is queued here. The lease it used is given back, owed: when the
    view shows the peer's link up again, the next tick sends the job there (at once: the view's
    change makes ``next_wakeup`` now), not at the peer's next NEEDJOBS (up to 30 s later: its
    view of us never changed). A link that still holds output delays it, backing off from 5 ms;
    the job goes once, and nothing is owed after."""
    from disque_py.core.messages import moves_to_watch

    peer = "f" * 40
    h.node.ctx.reachable = [peer]
    h.node.ctx.cluster_size = 2
    h.node.receive_data(peer, "NEEDJOBS", [b"q", 1], h.now)  # one consumer: one credit
    jid = h.add("q", "body", "REPLICATE", 1, "RETRY", 0)
    effects = h.effects()
    assert _yourjobs(effects) == [(peer, [jid])]
    (message,) = [e.message for e in effects if getattr(e, "message", ("",))[0] == "YOURJOBS"]
    assert moves_to_watch(message) and not any(h.node.leases.by_queue.values())  # its one credit used
    h.node.ctx.reachable = []  # the link closed with it unsent
    h.node.on_moves_unsent(peer, message, h.now)
    assert h.cmd("QLEN", "q") == 1 and _yourjobs(h.effects()) == []
    assert h.node.leases.owed == {peer: {b"q"}}
    assert _yourjobs(h.advance(5000)) == []  # no link: it stays here, owed
    assert h.cmd("QLEN", "q") == 1
    h.node.ctx.reachable = [peer]  # the link is up again (a new view), its socket busy
    h.node.ctx.backlogged = frozenset([peer])
    assert h.node.next_wakeup() == h.now  # looked at on the next pass
    h.node.tick(h.now)
    assert _yourjobs(h.effects()) == [] and h.cmd("QLEN", "q") == 1  # RETRY 0 waits for a drained link
    assert h.node.next_wakeup() == h.now + 5
    assert _yourjobs(h.advance(5)) == []
    assert h.node.next_wakeup() == h.now + 10  # backing off
    h.node.ctx.backlogged = frozenset()
    t0 = h.now
    sent = []
    while not sent:
        sent = _yourjobs(h.advance(1))
    assert sent == [(peer, [jid])] and h.now - t0 <= 10
    assert h.cmd("QLEN", "q") == 0 and h.node.store.get(jid) is None  # its only copy left, once
    assert not h.node.leases.owed and not any(h.node.leases.by_queue.values())  # the credit given back, used
    assert _yourjobs(h.advance(60_000)) == []


def test_a_needjobs_from_a_peer_we_have_no_link_to_is_answered_when_the_link_is_up(h):
    """A NEEDJOBS from a peer whose link from us is down grants its lease, but there is nothing
    to send the jobs on: they go when the view shows that link up, and only then; a lease that
    ends meanwhile is forgotten with its debt (at most ``OWED_IDLE_MS`` later)."""
    from disque_py.core.federation import LEASE_MS, OWED_IDLE_MS

    peer, late = "e" * 40, "f" * 40
    h.node.ctx.cluster_size = 3
    h.node.ctx.reachable = []
    jobs = [h.add("q", "body%d" % i, "REPLICATE", 1, "RETRY", 0) for i in range(4)]
    h.node.receive_data(peer, "NEEDJOBS", [b"q", 10], h.now)
    assert _yourjobs(h.effects()) == [] and h.node.leases.owed == {peer: {b"q"}}
    h.advance(100)
    h.node.ctx.reachable = [peer]
    assert _yourjobs(h.advance(0)) == [(peer, jobs[:2])]  # as its NEEDJOBS: half of a short queue
    assert not h.node.leases.owed
    h.node.receive_data(late, "NEEDJOBS", [b"q", 10], h.now)  # no link to it either: owed
    assert h.node.leases.owed == {late: {b"q"}}
    h.advance(LEASE_MS + OWED_IDLE_MS)
    assert not h.node.leases.owed  # its lease ended: nothing owed
    h.node.ctx.reachable = [peer, late]
    assert _yourjobs(h.advance(10)) == [] and h.cmd("QLEN", "q") == 2


def test_owed_leases_are_served_only_to_nobody_waiting_here_and_bad_hand_backs_are_ignored(h):
    """A job owed to a peer but taken here meanwhile is owed no more, and nothing leaves a queue
    a client waits on here when the peer's link comes back. Hand-backs that are not a YOURJOBS
    change nothing."""
    peer = "f" * 40
    h.node.ctx.cluster_size = 2
    h.node.ctx.reachable = []
    jid = h.add("q", "body", "REPLICATE", 1, "RETRY", 0)
    h.node.receive_data(peer, "NEEDJOBS", [b"q", 10], h.now)
    assert h.node.leases.owed == {peer: {b"q"}}
    got = h.cmd("GETJOB", "NOHANG", "FROM", "q")
    assert got[0][1] == jid
    assert h.cmd("GETJOB", "TIMEOUT", 0, "FROM", "q", client=2) is BLOCKED
    h.node.ctx.reachable = [peer]
    assert _yourjobs(h.advance(10)) == [] and not h.node.leases.owed
    for bad in [(), ("NEEDJOBS", [b"q", 1]), ["YOURJOBS", []], "YOURJOBS"]:
        h.node.on_moves_unsent(peer, bad, h.now)  # type: ignore[arg-type]
    assert not h.node.leases.owed and h.node.stats["jobs_returned"] == 0


@pytest.mark.invariants_by_hand  # 25,000 NEEDJOBS, each checked against every lease: quadratic
def test_push_leases_on_queues_that_get_no_job_are_forgotten(h):
    """NEEDJOBS for queues that never get a job here (consumers on short-lived names) leave no
    lease behind once it expires (10,000 names checked per second), while a lease that is
    renewed stays and keeps pushing."""
    from disque_py.core.effects import Send
    from disque_py.core.federation import LEASE_MS
    from disque_py.core.leases import LEASE_GC_BATCH

    peer = "f" * 40
    h.node.ctx.reachable = [peer]
    h.node.ctx.cluster_size = 2
    names = int(2.5 * LEASE_GC_BATCH)
    for i in range(names):
        h.node.receive_data(peer, "NEEDJOBS", [b"reply-%d" % i, 10], h.now)
    assert h.node.info_fields()["queues"]["push_leases"] == names
    invariants.check(h.node)
    for _ in range(LEASE_MS // 1000 + 3):  # the leases expire, then three passes of the sweep
        h.advance(1000)
        h.node.receive_data(peer, "NEEDJOBS", [b"live", 10], h.now)
    assert h.node.info_fields()["queues"]["push_leases"] == 1
    jid = h.add("live", "body", "REPLICATE", 1)
    sent = [e.message for e in h.effects() if isinstance(e, Send) and e.message[0] == "YOURJOBS"]
    assert [w[0] for m in sent for w in m[1]] == [jid]
    invariants.check(h.node)
    h.advance(LEASE_MS + 1000)
    assert h.node.info_fields()["queues"]["push_leases"] == 0
    invariants.check(h.node)


def test_queues_are_asked_for_only_while_clients_wait_on_them(h):
    """NEEDJOBS goes out for a queue while a client is blocked on it (again and again, with
    backoff), and stops once the client timed out or went away."""
    from disque_py.core.effects import Send

    peer = "f" * 40
    h.node.ctx.reachable = [peer]
    h.node.ctx.known_nodes = [h.node.id, peer]
    h.node.ctx.cluster_size = 2
    t0 = h.now
    assert h.cmd("GETJOB", "TIMEOUT", 5000, "FROM", "w", client=7) is BLOCKED
    assert h.cmd("GETJOB", "FROM", "v", client=8) is BLOCKED
    assert h.cmd("GETJOB", "FROM", "u", client=9) is BLOCKED  # blocked throughout
    h.cmd("QSTAT", "idle")
    asked: dict[bytes, list[int]] = {}
    for step in range(200):
        if step == 50:
            h.node.client_closed(8)
        for e in h.advance(100):
            if isinstance(e, Send) and e.message[0] == "NEEDJOBS":
                asked.setdefault(e.message[1], []).append(h.now - t0)
    # asked at once, then after the broadcast backoff (more than 4 s, then 8 s): w and v no longer
    assert asked[b"u"] == [100, 4100, 12200]
    assert asked[b"w"] == asked[b"v"] == [100, 4100]
    assert set(asked) == {b"u", b"w", b"v"}


def test_a_copy_arriving_just_after_its_deljob_is_not_queued_again(h):
    """A holder moved its copy here in YOURJOBS while the DELJOB of the collected ack was on its
    way: the copy arrives after the job was deleted here. It is dropped (and its sender told to
    delete it), not queued as a new job; once TOMBSTONE_MS has passed the ID is forgotten."""
    from disque_py.core.effects import Send
    from disque_py.core.lifecycle import TOMBSTONE_MS
    from disque_py.core.wire import job_to_wire

    peer, other = "f" * 40, "e" * 40
    h.node.ctx.reachable = [peer, other]
    h.node.ctx.known_nodes = [h.node.id, peer, other]
    h.node.ctx.cluster_size = 3
    jid = h.add("q", "body", "REPLICATE", 1)
    job = h.node.store.get(jid)
    wire = job_to_wire(job, h.now)
    h.node.receive_data(other, "DELJOB", [jid, [other, h.node.id]], h.now)
    assert h.cmd("SHOW", jid) is None
    h.advance(10)
    h.effects()
    h.node.receive_data(peer, "YOURJOBS", [[wire]], h.now)
    assert h.cmd("SHOW", jid) is None and h.cmd("QLEN", "q") == 0
    told = [e.message for e in h.advance(10) if isinstance(e, Send) and e.to == peer]
    assert told == [("DELJOB", jid, [h.node.id])]
    h.advance(TOMBSTONE_MS)
    h.node.receive_data(peer, "YOURJOBS", [[job_to_wire(job, h.now)]], h.now)
    assert h.cmd("QLEN", "q") == 1  # a move of that ID is a move again


def test_deleted_ids_remembered_are_bounded(h, monkeypatch):
    import disque_py.core.lifecycle as lifecycle_mod

    monkeypatch.setattr(lifecycle_mod, "TOMBSTONES_MAX", 5)
    ids = [h.add("q", "b%d" % i) for i in range(8)]
    assert h.cmd("FASTACK", *ids) == 8
    assert list(h.node.lifecycle.tombstones) == ids[3:]  # the newest five, oldest first
    h.advance(lifecycle_mod.TOMBSTONE_MS)
    assert not h.node.lifecycle.tombstones


def test_tombstones_are_forgotten_as_jobs_are_buried_and_a_tick_forgets_a_bounded_batch(h):
    """Each burial forgets up to two tombstones whose time is up, so they keep pace with a steady
    stream of deletions; a tick forgets at most ``TOMB_GC_BATCH`` (one slice of the shell's loop),
    and the ticks after it the rest."""
    from disque_py.core.lifecycle import TOMB_GC_BATCH, TOMBSTONE_MS

    life = h.node.lifecycle
    first = [h.add("q", "a%d" % i) for i in range(TOMB_GC_BATCH * 3)]
    assert h.cmd("FASTACK", *first) == len(first)
    h.now += TOMBSTONE_MS  # all of them past their time, no tick yet
    second = [h.add("q", "b%d" % i) for i in range(10)]
    assert h.cmd("FASTACK", *second) == 10
    assert len(life.tombstones) == len(first) - 20 + 10  # each burial forgot two of the old
    h.node.tick(h.now)
    assert len(life.tombstones) == len(first) - 20 - TOMB_GC_BATCH + 10
    h.node.tick(h.now)
    h.node.tick(h.now)
    assert set(life.tombstones) == set(second) and all(life.is_buried(i) for i in second)


@pytest.mark.parametrize("how", ["FASTACK here", "DELJOB from a peer"])
def test_a_job_deleted_before_it_got_here_is_not_taken_when_it_arrives(h, how):
    """FASTACK of an ID this node never saw (it broadcasts DELJOB), or a DELJOB for one, while a
    copy is moving here: the copy arrives after, and is dropped, not queued as a new job."""
    from disque_py.core.wire import job_to_wire

    peer = "f" * 40
    h.node.ctx.reachable = [peer]
    h.node.ctx.known_nodes = [h.node.id, peer]
    h.node.ctx.cluster_size = 2
    jid = h.add("q", "body", "REPLICATE", 1)
    wire = job_to_wire(h.node.store.get(jid), h.now)
    assert h.cmd("FASTACK", jid) == 1  # gone from here; the wire stands for a copy on the peer
    h.node.lifecycle.tombstones.clear()
    if how == "FASTACK here":
        assert h.cmd("FASTACK", jid) == 0
    else:
        h.node.receive_data(peer, "DELJOB", [jid, [peer]], h.now)
    h.node.receive_data(peer, "DELJOB", [b"D-not-a-job-id", [peer]], h.now)
    assert list(h.node.lifecycle.tombstones) == [jid]  # a malformed ID is not remembered
    h.node.receive_data(peer, "YOURJOBS", [[wire]], h.now)
    assert h.cmd("SHOW", jid) is None and h.cmd("QLEN", "q") == 0


def test_a_moved_job_held_here_already_is_queued_from_the_held_copy(h):
    """REPLICATE 3 with the consumers on a replica: the copy this node holds is the one queued
    when its holder moves the job here. A wire naming it under another queue is dropped, and
    malformed entries around it do not keep the rest of the message from being taken."""
    from disque_py.core.wire import job_to_wire

    peer = "f" * 40
    h.node.ctx.reachable = [peer]
    h.node.ctx.known_nodes = [h.node.id, peer]
    h.node.ctx.cluster_size = 2
    jid = h.add("q", "body", "REPLICATE", 1)
    held = h.node.store.get(jid)
    wire = job_to_wire(held, h.now)
    assert h.cmd("GETJOB", "NOHANG", "FROM", "q")[0][1] == jid  # now active here, not queued
    other_queue = list(wire)
    other_queue[1] = b"elsewhere"
    garbage = [[jid], [[jid]] + wire[1:], "junk", 7, None]
    h.node.receive_data(peer, "YOURJOBS", [garbage + [other_queue, wire, list(wire)]], h.now)
    assert h.cmd("QLEN", "elsewhere") == 0
    assert h.cmd("QLEN", "q") == 1  # once, though named twice
    assert h.node.store.get(jid) is held and held.body == b"body"
    assert h.cmd("GETJOB", "NOHANG", "FROM", "q")[0][1] == jid


def test_no_jobs_move_to_a_peer_without_a_link_or_with_a_link_that_does_not_drain(h):
    """A link torn down drops what it had not sent: a RETRY 0 job's only copy with it (seen with
    real nodes: a partitioned peer's link filled up, was closed after the PING timeout, and took
    two pushed jobs with it). So a peer whose link holds unsent output (``backlogged``) gets no
    RETRY 0 job, pushed or asked for, and one without a link (not ``reachable``) no job at all;
    the jobs stay queued here, and move once its link drains. At-least-once jobs still move
    into a backlog: their copy here is requeued if the one sent is lost."""
    from disque_py.core.effects import Send

    peer = "f" * 40

    def yourjobs() -> list:
        return [w[0] for e in h.effects() if isinstance(e, Send) and e.message[0] == "YOURJOBS" for w in e.message[1]]

    h.node.ctx.reachable = [peer]
    h.node.ctx.cluster_size = 2
    h.node.receive_data(peer, "NEEDJOBS", [b"q", 10], h.now)  # a lease: new jobs are pushed
    h.effects()
    pushed = h.add("q", "body", "REPLICATE", 1, "RETRY", 0)
    assert yourjobs() == [pushed] and h.cmd("QLEN", "q") == 0
    h.node.ctx.backlogged = frozenset([peer])
    kept = [h.add("q", "body", "REPLICATE", 1, "RETRY", 0) for _ in range(4)]
    assert yourjobs() == [] and h.cmd("QLEN", "q") == 4
    h.node.receive_data(peer, "NEEDJOBS", [b"q", 10], h.now)  # asked again while backlogged
    assert yourjobs() == [] and h.cmd("QLEN", "q") == 4
    h.node.ctx.backlogged = frozenset()
    h.node.ctx.reachable = []  # its link went down (a kill -9, before the failure detector sees it)
    h.node.receive_data(peer, "NEEDJOBS", [b"q", 10], h.now)
    assert yourjobs() == [] and h.cmd("QLEN", "q") == 4
    h.node.ctx.reachable = [peer]  # linked and draining again: it asks, and gets half the queue
    h.node.receive_data(peer, "NEEDJOBS", [b"q", 10], h.now)
    assert yourjobs() == kept[:2] and h.cmd("QLEN", "q") == 2
    h.node.ctx.backlogged = frozenset([peer])  # an at-least-once job still moves into a backlog
    alo = h.add("q", "body", "REPLICATE", 1, "RETRY", 30)
    assert yourjobs() == [alo] and h.cmd("QLEN", "q") == 2
    h.node.receive_data(peer, "NEEDJOBS", [b"q", 10], h.now)  # the queue's head is RETRY 0: held
    assert yourjobs() == [] and h.cmd("QLEN", "q") == 2


def test_an_ack_while_the_job_waits_for_its_copies_answers_its_addjob_with_the_id():
    """ACKJOB of a job whose ADDJOB still waits for its copies (a consumer got a copy elsewhere
    and acked it on the node that added it): the ADDJOB is answered with the job's ID at once, the
    job is acked, and the replication's timers later find nothing to do (no NOREPL)."""
    from disque_py.core.job import ACKED, watch_transitions

    from .wired import Wired

    watch_transitions()
    net = Wired(3)
    net.muted = {1, 2}  # reachable, but they never answer: the copies are never confirmed
    assert net.submit(0, "ADDJOB", "q", "b", 5000, "REPLICATE", 3, client=1) is BLOCKED
    [job_id] = [jid for jid, _ in net.nodes[0].store.items()]
    assert net.cmd(0, "ACKJOB", job_id, client=2) == 1
    assert net.reply(0, client=1) == job_id
    assert net.nodes[0].store.get(job_id).state == ACKED
    net.advance(6000)  # past the ADDJOB's TIMEOUT: nothing more for client 1
    assert net.reply(0, client=1) is None
    invariants.check(net.nodes[0])


def test_an_ack_of_a_job_no_other_node_held_leaves_no_tombstone(h):
    """ACKJOB of a job only this node ever held deletes it at once without remembering its ID (no
    copy can move in: a peer that takes one is named in the job's holders first); a job another
    node holds a copy of keeps the GC's rounds, and its deletion the tombstone."""
    from disque_py.core.effects import Send
    from disque_py.core.wire import job_to_wire

    peer = "f" * 40
    life = h.node.lifecycle
    alone = h.add("q", "alone")
    assert h.cmd("ACKJOB", alone) == 1
    assert h.cmd("SHOW", alone) is None and not life.tombstones
    h.node.ctx.reachable = [peer]
    h.node.ctx.known_nodes = [h.node.id, peer]
    h.node.ctx.cluster_size = 2
    solo = h.add("q", "solo", "REPLICATE", 1)
    assert h.cmd("ACKJOB", solo) == 1
    assert h.cmd("SHOW", solo) is None and not life.tombstones
    once = h.add("q", "once", "REPLICATE", 1, "RETRY", 0)  # its only copy may move without a trace
    assert h.cmd("ACKJOB", once) == 1
    assert h.cmd("SHOW", once) is None and list(life.tombstones) == [once]
    life.tombstones.clear()
    shared = h.add("q", "shared", "REPLICATE", 1)
    job = h.node.store.get(shared)
    job.delivered = (h.node.id, peer)  # as after a push to the peer (Leases.export)
    assert h.cmd("ACKJOB", shared) == 1
    assert show(h, shared)["state"] == "acked"  # waits for the peer's GOTACK
    sent = [e.message for e in h.advance(10) if isinstance(e, Send) and e.to == peer]
    assert sent and sent[0][0] == "SETACK"
    h.node.receive_data(peer, "GOTACK", [shared, True], h.now)
    assert h.cmd("SHOW", shared) is None and life.is_buried(shared)
    h.node.receive_data(peer, "YOURJOBS", [[job_to_wire(job, h.now)]], h.now)
    assert h.cmd("QLEN", "q") == 0  # a copy still on its way is dropped
