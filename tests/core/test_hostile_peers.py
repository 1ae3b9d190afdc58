"""Malformed job-layer messages from peers never raise and never corrupt a node."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from disque_py.core.wire import job_from_wire, job_to_wire

from .conftest import Harness

PEER = "f" * 40
KINDS = ["REPLJOB", "GOTJOB", "ENQUEUE", "QUEUED", "WILLQUEUE", "SETACK", "GOTACK", "DELJOB", "WORKING",
         "PAUSE", "NEEDJOBS", "YOURJOBS", "NACKED", "DELIVERED", "RETURNED", "NOSUCHKIND"]  # fmt: skip

leaf = st.one_of(
    st.none(), st.booleans(), st.integers(-(2**63), 2**63 - 1), st.binary(max_size=50), st.text(max_size=50),
    st.just(b"D-01234567-AAAAAAAAAAAAAAAAAAAAAAAA-05a1"),
)  # fmt: skip
values = st.recursive(
    leaf,
    lambda children: st.one_of(
        st.lists(children, max_size=6),
        st.dictionaries(st.sampled_from(["id", "queue", "body", "repl", "ttl", "ctime", "delay", "retry",
                                         "nacks", "deliv", "nodes", "x"]), children, max_size=12),
    ),  # fmt: skip
    max_leaves=30,
)


@settings(max_examples=400, deadline=None)
@given(st.sampled_from(KINDS), st.lists(values, max_size=4))
def test_any_body_for_any_kind_is_survived(kind, body):
    h = Harness()
    node = h.node
    node.ctx.cluster_size = 2
    node.ctx.known_nodes = [node.id, PEER]
    node.ctx.reachable = [PEER]
    job = h.add("q", "keep", "REPLICATE", 1)
    node.receive_data(PEER, kind, body, h.now)
    node.take_effects()
    h.advance(1000)
    # the node still works and its own job is intact (or legitimately moved/acked by the message)
    assert isinstance(h.cmd("QLEN", "q"), int)
    assert isinstance(h.add("q", "more", "REPLICATE", 1), bytes)
    info = h.cmd("SHOW", job)
    assert info is None or info[info.index(b"body") + 1] == b"keep"


def test_wrong_sender_and_body_types_are_ignored():
    h = Harness()
    for sender in (None, 5, b"x" * 40):
        h.node.receive_data(sender, "DELJOB", [b"D-01234567-AAAAAAAAAAAAAAAAAAAAAAAA-05a1"], h.now)
    h.node.receive_data(PEER, "DELJOB", "not a list", h.now)
    h.node.receive_data(PEER, "YOURJOBS", [[{"id": 5}] * 3], h.now)
    assert h.effects() == []


VALID_JOB = [
    b"D-01234567-AAAAAAAAAAAAAAAAAAAAAAAA-05a1", b"q", b"body", 1, 60000, 1_700_000_000_000_000_000,
    0, 300, 0, 0, [PEER],
]  # fmt: skip


def test_a_valid_job_array_is_accepted():
    job = job_from_wire(list(VALID_JOB), 1000)
    assert job is not None and job.id == VALID_JOB[0] and job.retry == 300 and job.delivered == (PEER,)
    assert job_to_wire(job, 1000) == VALID_JOB
    assert job_from_wire(VALID_JOB + ["a later field"], 1000) is not None  # extra trailing fields ignored
    assert job_from_wire(VALID_JOB[:-1], 1000) is None
    assert job_from_wire(dict(enumerate(VALID_JOB)), 1000) is None


@settings(max_examples=300, deadline=None)
@given(st.integers(0, len(VALID_JOB) - 1), values, st.sampled_from(["REPLJOB", "YOURJOBS"]))
def test_a_job_array_with_one_bad_field_is_refused_or_sane(index, value, kind):
    wire = list(VALID_JOB)
    wire[index] = value
    job = job_from_wire(wire, 1000)
    if job is not None:  # the random value happened to be valid there
        assert type(job.id) is bytes and type(job.body) is bytes and 1 <= job.repl <= 65535
        assert all(type(n) is str and len(n) == 40 for n in job.delivered)
    h = Harness()
    node = h.node
    node.ctx.cluster_size = 2
    node.ctx.known_nodes = [node.id, PEER]
    node.ctx.reachable = [PEER]
    node.receive_data(PEER, kind, [wire, False] if kind == "REPLJOB" else [[wire]], h.now)
    node.take_effects()
    h.advance(1000)
    assert isinstance(h.add("q", "more", "REPLICATE", 1), bytes)


def test_setack_for_an_unknown_id_is_answered_only_when_the_id_is_well_formed():
    from disque_py.core.effects import Send

    h = Harness()
    node = h.node
    node.ctx.cluster_size = 2
    node.ctx.known_nodes = [node.id, PEER]
    node.ctx.reachable = [PEER]
    good = b"D-01234567-AAAAAAAAAAAAAAAAAAAAAAAA-05a1"
    for bad in (b"D-0123\r\n67-AAAAAAAAAAAAAAAAAAAAAAAA-05a1", b"+OK", b""):
        node.receive_data(PEER, "SETACK", [bad, 1], h.now)
    node.receive_data(PEER, "SETACK", [good, 1], h.now)
    sent = [e.message for e in h.advance(1000) if type(e) is Send]  # ack GC messages leave within ms
    assert sent == [("GOTACK", good, False)]  # a malformed ID is never echoed to the peer


def test_the_two_copy_flags_count_only_when_they_are_true():
    # SETACK(id, 2, True) lets the only other holder delete its copy at once, and
    # GOTACK(id, True, True) spares the DELJOB; any other value there is the plain message.
    from disque_py.core.effects import Send
    from disque_py.core.job import ACKED

    def holder_of_a_two_copy_job() -> tuple[Harness, bytes]:
        h = Harness()
        node = h.node
        node.ctx.cluster_size = 2
        node.ctx.known_nodes = [node.id, PEER]
        node.ctx.reachable = [PEER]
        wire = list(VALID_JOB)
        wire[10] = [PEER, node.id]
        node.receive_data(PEER, "REPLJOB", [wire, True], h.now)
        h.advance(1000)
        assert node.store.get(wire[0]) is not None
        return h, wire[0]

    for flag in (1, b"yes", "True", None, [True]):
        h, job_id = holder_of_a_two_copy_job()
        h.node.receive_data(PEER, "SETACK", [job_id, 2, flag], h.now)
        assert h.node.store.get(job_id).state == ACKED  # acked, kept until the DELJOB
    h, job_id = holder_of_a_two_copy_job()
    h.node.receive_data(PEER, "SETACK", [job_id, 2, True], h.now)
    assert h.node.store.get(job_id) is None
    sent = [e.message for e in h.advance(1000) if type(e) is Send]
    assert sent == [("GOTACK", job_id, True, True)]

    for flag, deljob in ((True, False), (1, True), (b"yes", True)):
        h, job_id = holder_of_a_two_copy_job()
        assert h.cmd("ACKJOB", job_id) == 1
        sent = [e.message for e in h.advance(1000) if type(e) is Send]
        assert sent == [("SETACK", job_id, 2, True)]
        h.node.receive_data(PEER, "GOTACK", [job_id, True, flag], h.now)
        assert h.node.store.get(job_id) is None
        sent = [e.message for e in h.advance(1000) if type(e) is Send]
        assert [m[0] for m in sent] == (["DELJOB"] if deljob else []), (flag, sent)


# -- malformed messages are dropped and counted (Node.bus_stats) ---------------------------
GOOD_ID = b"D-01234567-AAAAAAAAAAAAAAAAAAAAAAAA-05a1"
BAD_ID = b"X" * 40  # the length of an ID, not its format
MALFORMED = {
    "REPLJOB": [[], [VALID_JOB], [VALID_JOB, 1], [VALID_JOB[:5], True], [dict(enumerate(VALID_JOB)), False],
                [[BAD_ID] + VALID_JOB[1:], False]],
    "GOTJOB": [[], [5], [b"short"], [GOOD_ID.decode()]],
    "ENQUEUE": [[GOOD_ID], [GOOD_ID, "1"], [GOOD_ID, 1.5], [GOOD_ID, True], [b"x", 0]],
    "QUEUED": [[GOOD_ID], [GOOD_ID, None], [b"bad", 1]],
    "WORKING": [[], [None], [b"bad"]],
    "WILLQUEUE": [[], [7], [b"bad"]],
    "SETACK": [[GOOD_ID], [GOOD_ID, "2"], [BAD_ID, 1], [b"x", 1], [GOOD_ID, True]],
    "GOTACK": [[GOOD_ID], [GOOD_ID, 1], [b"x", True], [BAD_ID[:39], False]],
    "DELJOB": [[], [BAD_ID], [b"D-not-a-job-id"], [GOOD_ID, [5]], [GOOD_ID, ["short"]]],
    "PAUSE": [[b"q"], [b"q", "x"], ["q", 1]],
    "NEEDJOBS": [[b"q"], [b"q", -1], [b"q", "5"], ["q", 5]],
    "YOURJOBS": [[], ["x"], [5], [{"jobs": []}]],
    "NACKED": [[GOOD_ID], [GOOD_ID, 100], [GOOD_ID, -1, b""], [GOOD_ID, 100, "why"], [b"x", 100, b""],
               [GOOD_ID, 1.5, b""], [GOOD_ID, 100, b"x" * 70000],
               [GOOD_ID, 100, b"why", b"t" * 16385]],  # a TRACE over job.TRACE_MAX
    "DELIVERED": [[], [None], [b"bad", 1], [GOOD_ID], [GOOD_ID, "1"],
                  # the returns (a trailing list): node, count, node, count ...
                  [GOOD_ID, 2, [PEER]], [GOOD_ID, 2, [PEER, -1]], [GOOD_ID, 2, [PEER, "1"]], [GOOD_ID, 2, ["short", 1]],
                  [GOOD_ID, 2, [PEER.encode(), 1]], [GOOD_ID, 2, [PEER, 1] * 65]],
    "RETURNED": [[], [GOOD_ID], [b"bad", [PEER, 1]], [GOOD_ID, []], [GOOD_ID, {PEER: 1}], [GOOD_ID, [PEER]],
                 [GOOD_ID, [PEER, 1, "x" * 40]], [GOOD_ID, [PEER, 2**64]], [GOOD_ID, [PEER, True]],
                 [GOOD_ID, [None, 1]], [GOOD_ID, ["e" * 40, 1] * 65], [GOOD_ID[:39], [PEER, 1]],
                 # RELEASE's DELAY (a trailing int, ms)
                 [GOOD_ID, [PEER, 1], -1], [GOOD_ID, [PEER, 1], 1 << 40]],
    "HASJOB": [[], [None], [b"bad"]],
    "HAVEJOB": [[GOOD_ID], [GOOD_ID, 1], [b"x", True], [GOOD_ID, None]],
    "GROUPS": [[], [1], ["SET"], ["SET", "x"], ["SET", [[b"", 1, 0, "", 0, 0, 0, ""]]],
               ["SET", [[b"g", 0, 0, "", 0, 0, 0, ""]]], ["SET", [[b"g", 1, 0, "", -1, 0, 0, ""]]],
               ["SET", [[b"g" * 129, 1, 0, "", 0, 0, 0, ""]]], ["DIGEST"], ["DIGEST", "x"],
               ["SHARES", "x"], ["SHARES", PEER + "/1", [[b"g"]], []], ["SHARES", "other/1", [], []],
               ["SHARES", PEER + "/1", [[b"g", 0, 1, "o", 2, {"m": "x"}, {}, 0, 0, 0]], []],
               ["ASK", "m"], ["GRANT", PEER + "/1", b"g", 0, 0, "", 1, -5], ["GRANTED", b"g"]],
}  # fmt: skip


def clustered() -> Harness:
    h = Harness()
    node = h.node
    node.ctx.cluster_size = 2
    node.ctx.known_nodes = [node.id, PEER]
    node.ctx.reachable = [PEER]
    return h


def test_every_kind_has_malformed_cases():
    from disque_py.core.messages import KINDS

    assert set(MALFORMED) == set(KINDS)


@pytest.mark.parametrize("kind,body", [(k, b) for k, bodies in MALFORMED.items() for b in bodies])
def test_a_malformed_message_is_dropped_and_counted(kind, body):
    """Wrong arity, wrong types, bad job IDs: nothing happens but the count (the node's own job
    untouched, no answer to the peer)."""
    h = clustered()
    node = h.node
    job_id = h.add("q", "keep", "REPLICATE", 1)
    node.take_effects()
    before = node.store.get(job_id)
    node.receive_data(PEER, kind, body, h.now)
    assert node.bus_stats["messages_malformed"] == 1
    assert node.take_effects() == []
    assert node.store.get(job_id) is before and before.state == 2 and h.cmd("QLEN", "q") == 1
    assert node.queues.keys() == {b"q"}  # no queue made (PAUSE, NEEDJOBS) for a malformed message


def test_wrong_kinds_senders_and_bodies_are_counted():
    h = clustered()
    node = h.node
    cases = [(PEER, b"DELJOB", [GOOD_ID]), (PEER, ["DELJOB"], [GOOD_ID]),
             (None, "DELJOB", [GOOD_ID]), (b"x" * 40, "DELJOB", [GOOD_ID]), (PEER, "DELJOB", (GOOD_ID,)),
             (PEER, "DELJOB", "not a list")]  # fmt: skip
    for n, (sender, kind, body) in enumerate(cases, 1):
        node.receive_data(sender, kind, body, h.now)
        assert node.bus_stats["messages_malformed"] == n, (sender, kind, body)
    assert node.take_effects() == [] and not node.lifecycle.tombstones
    assert node.bus_stats["messages_unknown"] == 0 and node.unknown_kinds == {}


def test_unknown_kinds_are_counted_by_name_and_dropped():
    """A newer peer's kind of message: dropped, counted apart from the malformed ones, named (at
    most UNKNOWN_KINDS_MAX names: a peer sending endless new names costs no memory)."""
    from disque_py.core.node import UNKNOWN_KINDS_MAX

    h = clustered()
    node = h.node
    for _ in range(3):
        node.receive_data(PEER, "NOSUCHKIND", [GOOD_ID, 1, {"x": 2}], h.now)
    assert node.unknown_kinds == {"NOSUCHKIND": 3}
    for i in range(UNKNOWN_KINDS_MAX * 2):
        node.receive_data(PEER, "K%d" % i, [], h.now)
    node.receive_data(PEER, "NOSUCHKIND", "not even a list", h.now)
    assert len(node.unknown_kinds) == UNKNOWN_KINDS_MAX and node.unknown_kinds["NOSUCHKIND"] == 4
    assert node.bus_stats["messages_unknown"] == 4 + UNKNOWN_KINDS_MAX * 2
    assert node.bus_stats["messages_malformed"] == 0
    assert node.take_effects() == [] and not node.lifecycle.tombstones


def test_well_formed_messages_are_not_counted():
    h = clustered()
    node = h.node
    node.receive_data(PEER, "DELJOB", [GOOD_ID], h.now)  # unknown here: a tombstone, no answer
    node.receive_data(PEER, "DELJOB", [GOOD_ID, [PEER]], h.now)
    node.receive_data(PEER, "SETACK", [GOOD_ID, 1, "ignored"], h.now)  # a trailing field ignored
    node.receive_data(PEER, "NEEDJOBS", [b"q", 0], h.now)
    node.receive_data(PEER, "REPLJOB", [list(VALID_JOB), True, "later field"], h.now)
    node.receive_data(PEER, "YOURJOBS", [[]], h.now)
    # later fields of another type than ours are ignored (NACKED's TRACE is bytes, DELIVERED's
    # returns a list): a later version's message reads as the shape known here
    node.receive_data(PEER, "NACKED", [GOOD_ID, 100, b"why", 5], h.now)
    node.receive_data(PEER, "DELIVERED", [GOOD_ID, 1, "later"], h.now)
    node.receive_data(PEER, "RETURNED", [GOOD_ID, [PEER, 1], "later"], h.now)
    node.receive_data(PEER, "RETURNED", [GOOD_ID, [PEER, 1], 5000, "later"], h.now)
    node.receive_data(PEER, "NACKED", [GOOD_ID, 100, b"why", b"Traceback ...", "later"], h.now)
    assert node.bus_stats["messages_malformed"] == 0
    assert node.store.get(GOOD_ID) is not None  # the REPLJOB copy


def test_a_yourjobs_with_some_malformed_jobs_takes_the_others_and_counts_once():
    h = clustered()
    node = h.node
    good = list(VALID_JOB)
    node.receive_data(PEER, "YOURJOBS", [[[BAD_ID] + VALID_JOB[1:], good, "junk", VALID_JOB[:3]]], h.now)
    assert node.bus_stats["messages_malformed"] == 1
    assert h.cmd("QLEN", "q") == 1 and node.store.get(GOOD_ID) is not None and node.store.get(BAD_ID) is None


def test_a_handler_bug_is_not_swallowed(monkeypatch):
    """An exception inside a handler is this node's bug, not the peer's: it propagates (the shell
    logs it and serves on) and is not counted as a malformed message."""
    from disque_py.core.requeue import Requeue

    def broken(self, sender, message):
        raise KeyError("bug")

    monkeypatch.setattr(Requeue, "on_working", broken)
    h = clustered()
    with pytest.raises(KeyError, match="^'bug'$"):
        h.node.receive_data(PEER, "WORKING", [GOOD_ID], h.now)
    assert h.node.bus_stats["messages_malformed"] == 0
