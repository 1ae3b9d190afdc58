"""RELEASE (deliveries given back), NACK's TRACE and QSCAN's ALL (``core/delivery.py``,
``core/blocking.py``), on one core and on three cores wired together.

A worker that stops gives back the jobs it fetched and never started: RELEASE queues them again
at once, counts no nack and no additional delivery, and its delivery no longer counts against
MAXDELIVER on any holder (``Extra.returned``, merged by the larger count per node).
"""

from __future__ import annotations

import pytest

from disque_py.core.effects import Send
from disque_py.core.ids import dead_letter_id
from disque_py.core.job import ACKED, ACTIVE, QUEUED, TRACE_MAX, Extra
from disque_py.core.wire import extra_from_wire, extra_to_wire, job_from_wire, job_to_wire

from .test_delivery import Cluster, _no_dead_letter_yet, _one_dead_letter, delivered_one, show


def counters(h, queue="q") -> dict:
    """GETJOB WITHCOUNTERS of the one job queued in ``queue``: its fields after the body."""
    reply = h.cmd("GETJOB", "NOHANG", "WITHCOUNTERS", "FROM", queue)
    assert isinstance(reply, list) and len(reply) == 1, reply
    item = reply[0]
    return {item[i].decode(): item[i + 1] for i in range(3, len(item), 2)}


# =============================================================== bad input changes nothing
def test_release_bad_input(h):
    job_id = h.add("q", "x", "RETRY", 5)
    assert str(h.cmd("RELEASE")) == "ERR wrong number of arguments for 'release' command"
    assert str(h.cmd("RELEASE", "not-an-id")).startswith("BADID")
    assert str(h.cmd("RELEASE", job_id, "D-bad")).startswith("BADID")  # refused as a whole
    assert h.cmd("RELEASE", "D-01234567-AAAAAAAAAAAAAAAAAAAAAAAA-05a1") == 0  # unknown: not counted
    assert h.cmd("RELEASE", job_id) == 0  # queued, not delivered: nothing to give back
    assert h.node.store.get(job_id).state == QUEUED and h.node.store.get(job_id).extra is None
    assert delivered_one(h) == job_id
    assert h.cmd("ACKJOB", job_id) == 1
    assert h.cmd("RELEASE", job_id) == 0  # acked: never queued again


def test_a_retry_0_job_delivered_is_never_released(h):
    job_id = h.add("q", "x", "RETRY", 0)
    assert delivered_one(h) == job_id
    assert h.cmd("RELEASE", job_id) == 0  # AT_MOST_ONCE: delivered once, never queued again
    assert h.node.store.get(job_id).state == ACTIVE and h.cmd("QLEN", "q") == 0


def test_release_is_not_refused_at_full_memory(h):
    job_id = h.add("q", "x", "RETRY", 5)
    assert delivered_one(h) == job_id
    h.node._memory_level_changed(3)
    try:
        assert str(h.cmd("ENQUEUE", job_id)).startswith("OOM")
        assert h.cmd("RELEASE", job_id) == 1  # gives back a job held already: adds nothing
    finally:
        h.node._memory_level_changed(0)


# =============================================================== one node
def test_a_released_delivery_counts_nothing(h):
    """MAXDELIVER 1 (a task with retries=0): a delivery given back is not its one delivery."""
    job_id = h.add("q", "x", "RETRY", 5, "MAXDELIVER", 1)
    for released in (1, 2, 3):
        fields = counters(h)
        assert fields["deliveries"] == 1 and fields["nacks"] == 0 and fields["additional-deliveries"] == 0
        assert fields.get("returns", 0) == released - 1
        assert h.cmd("RELEASE", job_id) == 1
        assert h.node.store.get(job_id).state == QUEUED  # queued again at once
        assert h.cmd("QLEN", "q.dead") == 0
    info = show(h, job_id)
    assert info["deliveries"] == 0 and info["returns"] == 3 and info["nacks"] == 0
    assert info["additional-deliveries"] == 0
    assert h.node.ctx.stats["jobs_released"] == 3
    # and its one true delivery still counts: a failure then dead-letters it
    assert counters(h)["deliveries"] == 1
    assert h.cmd("NACK", job_id, "REASON", "boom") == 1
    dl = show(h, dead_letter_id(job_id))
    assert dl["original-deliveries"] == 1 and dl["dead-letter-reason"] == b"boom"


def test_a_job_without_options_counts_its_returns_too(h):
    """The task runner bounds how often a job is given back (an unknown task): a job sent
    without delivery options (from redis-cli) shows its returns as well."""
    job_id = h.add("q", "x", "RETRY", 5)
    assert delivered_one(h) == job_id
    assert h.cmd("RELEASE", job_id) == 1
    fields = counters(h)
    assert fields["returns"] == 1 and fields["deliveries"] == 1 and fields["nacks"] == 0
    assert fields["additional-deliveries"] == 0


def test_a_nack_delayed_job_released_is_queued_now(h):
    """NACKed with a delay while it was delivered twice at once: the other delivery, given back,
    is one return (the node cannot tell which delivery a RELEASE gives back: at worst it counts
    one too few, never one too many)."""
    job_id = h.add("q", "x", "RETRY", 30, "MAXDELIVER", 3)
    assert delivered_one(h) == job_id
    assert h.cmd("NACK", job_id, "DELAY", 10) == 1
    assert h.cmd("RELEASE", job_id) == 1  # queued now, as ENQUEUE does
    assert h.node.store.get(job_id).state == QUEUED
    info = show(h, job_id)
    assert info["deliveries"] == 0 and info["returns"] == 1 and info["nacks"] == 1
    assert h.cmd("RELEASE", job_id) == 0  # queued: nothing to give back


def test_release_with_a_delay_queues_it_when_the_delay_ends(h):
    """RELEASE ... DELAY (the task runner's unknown task: given back, but not at once, so the
    worker that cannot run it does not take it again in a loop): one return, no nack, queued
    when the delay ends with no count."""
    job_id = h.add("q", "x", "RETRY", 60, "MAXDELIVER", 1)
    assert delivered_one(h) == job_id
    assert h.cmd("RELEASE", job_id, "DELAY", "2.5") == 1
    job = h.node.store.get(job_id)
    assert job.state == ACTIVE and h.cmd("QLEN", "q") == 0
    assert h.cmd("RELEASE", job_id, "DELAY", 1) == 1  # still active: given back again (a second return)
    h.advance(900)
    assert job.state == ACTIVE  # the second RELEASE's 1 s counts from its own time
    h.advance(200)
    assert job.state == QUEUED and h.cmd("QLEN", "q") == 1
    info = show(h, job_id)
    assert info["returns"] == 2 and info["nacks"] == 0 and info["deliveries"] == 0
    assert info["additional-deliveries"] == 0 and h.cmd("QLEN", "q.dead") == 0
    assert h.node.ctx.stats["jobs_released"] == 2


def test_release_delay_bad_input(h):
    job_id = h.add("q", "x", "RETRY", 5, "TTL", 100)
    assert delivered_one(h) == job_id
    assert str(h.cmd("RELEASE", job_id, "DELAY")) == "ERR syntax error near 'DELAY': a value must follow it"
    assert str(h.cmd("RELEASE", job_id, "DELAY", "1", "x")) == "ERR syntax error near 'x'"
    assert str(h.cmd("RELEASE", job_id, "DELAY", "-1")).startswith("ERR DELAY must be a non negative number")
    assert str(h.cmd("RELEASE", job_id, "DELAY", "soon")).startswith("ERR DELAY must be")
    assert str(h.cmd("RELEASE", "DELAY", "1")) == "ERR wrong number of arguments for 'release' command"
    assert str(h.cmd("RELEASE", job_id, "DELAY", "200")).startswith("ERR DELAY 200 s is beyond the TTL left")
    assert h.node.store.get(job_id).state == ACTIVE and h.node.store.get(job_id).extra is None  # nothing done
    assert h.cmd("RELEASE", job_id, "delay", "0") == 1  # DELAY 0: now
    assert h.node.store.get(job_id).state == QUEUED


# =============================================================== several nodes
def test_every_holder_learns_the_return_and_nothing_else_counts():
    c = Cluster()
    job_id = c.add(0, "RETRY", 30, "MAXDELIVER", 2)
    assert c.getjob(0) == job_id
    assert [c.job(i, job_id).extra.delivered() for i in range(3)] == [1, 1, 1]
    c.sent.clear()
    assert c.cmd(0, "RELEASE", job_id) == 1
    # RETURNED before QUEUED, on each link; no counter in the QUEUED
    kinds = [(dst, kind) for src, dst, kind in c.sent if src == 0]
    assert kinds == [(1, "RETURNED"), (2, "RETURNED"), (1, "QUEUED"), (2, "QUEUED")], kinds
    for i in range(3):
        job = c.job(i, job_id)
        assert job.extra.delivered() == 0 and job.extra.returns == 1 and job.extra.returned == {c.ids[0]: 1}
        assert job.nacks == 0 and job.deliveries == 0, i
    assert c.queued_on(job_id) == [0]
    # two true deliveries later, on two nodes, the second failure dead-letters it
    assert c.getjob(0) == job_id
    assert c.cmd(1, "NACK", job_id) == 1
    _no_dead_letter_yet(c, job_id)
    assert c.getjob(1) == job_id
    assert [c.job(i, job_id).extra.delivered() for i in range(3)] == [2, 2, 2]
    assert c.cmd(1, "NACK", job_id, "REASON", "boom") == 1
    dl_id = _one_dead_letter(c, job_id)
    assert c.job(c.queued_on(dl_id)[0], dl_id).extra.origin[2] == 2


def test_a_delayed_release_keeps_every_holder_from_queueing_it_sooner():
    """RETRY 1 s, RELEASE ... DELAY 5: the other holders put their requeue past the delay (no
    nack counted), so the job comes back once, from the releasing node, when the delay ends;
    if that node dies, another holder queues it a RETRY later."""
    c = Cluster()
    job_id = c.add(0, "RETRY", 1, "MAXDELIVER", 1)
    assert c.getjob(0) == job_id
    assert c.cmd(0, "RELEASE", job_id, "DELAY", 5) == 1
    for i in range(3):
        job = c.job(i, job_id)
        assert job.extra.returns == 1 and job.extra.delivered() == 0 and job.nacks == 0, i
    c.advance(4000)  # past the holders' RETRY, short of the delay
    assert c.queued_on(job_id) == []
    c.advance(1200)
    assert c.queued_on(job_id) == [0]
    assert c.getjob(0) == job_id  # its one true delivery: MAXDELIVER 1 still allows it
    assert c.cmd(0, "NACK", job_id) == 1
    _one_dead_letter(c, job_id)


def test_released_on_a_holder_that_did_not_deliver_it():
    """A worker whose client failed over gives the job back to another holder: one return all
    the same, counted under that node's name."""
    c = Cluster()
    job_id = c.add(0, "RETRY", 30, "MAXDELIVER", 1)
    assert c.getjob(0) == job_id
    assert c.cmd(2, "RELEASE", job_id) == 1
    assert c.queued_on(job_id) == [2]
    for i in range(3):
        assert c.job(i, job_id).extra.returned == {c.ids[2]: 1} and c.job(i, job_id).extra.delivered() == 0


def test_a_missed_returned_is_learnt_with_the_next_delivered():
    c = Cluster()
    job_id = c.add(0, "RETRY", 30, "MAXDELIVER", 3)
    assert c.getjob(0) == job_id
    assert c.submit(0, "RELEASE", job_id) == 1
    c.inbox.clear()  # the RETURNED and the QUEUED lost
    assert c.job(1, job_id).extra.delivered() == 1  # one above the truth, for now
    assert c.getjob(0) == job_id  # the next delivery's DELIVERED carries the returns
    for i in range(3):
        extra = c.job(i, job_id).extra
        assert extra.returned == {c.ids[0]: 1} and extra.count == 2 and extra.delivered() == 1, i


def test_a_returned_told_twice_counts_once():
    c = Cluster()
    job_id = c.add(0, "RETRY", 30, "MAXDELIVER", 3)
    assert c.getjob(0) == job_id
    assert c.submit(0, "RELEASE", job_id) == 1
    c.inbox.extend(list(c.inbox))  # every message twice
    c.settle()
    assert [c.job(i, job_id).extra.delivered() for i in range(3)] == [0, 0, 0]
    assert [c.job(i, job_id).extra.returns for i in range(3)] == [1, 1, 1]


def test_a_release_at_the_moment_of_a_delivery_elsewhere_counts_exactly():
    """Node 0 delivers it, node 1 delivers it too (its RETRY ran out), and node 0 takes a
    RELEASE before it hears of node 1's delivery: a count lowered by "delivery n was given back"
    would learn node 1's count afterwards and stay one above the truth. Per-node returns and the
    DELIVERED that carries them count one true delivery left, everywhere."""
    c = Cluster()
    job_id = c.add(0, "RETRY", 30, "MAXDELIVER", 2)
    assert c.getjob(0) == job_id  # delivery 1, known everywhere
    job1 = c.job(1, job_id)
    c.node(1).requeue.enqueue_job(job1)  # as if its RETRY ran out: queued on node 1 too
    c.inbox.clear()
    reply = c.submit(1, "GETJOB", "NOHANG", "FROM", "q")
    assert bytes(reply[0][1]) == job_id  # delivery 2, its DELIVERED(2) not delivered yet
    from_1 = list(c.inbox)
    c.inbox.clear()
    assert c.submit(0, "RELEASE", job_id) == 1  # node 0 still counts 1
    c.inbox.extend(from_1)  # node 1's DELIVERED(2) reaches node 0 after its release
    c.settle()
    assert [c.job(i, job_id).extra.delivered() for i in range(3)] == [1, 1, 1]


# =============================================================== NACK's TRACE
def test_nack_trace_is_kept_shown_and_cut_to_its_tail(h):
    job_id = h.add("q", "x", "RETRY", 30, "MAXDELIVER", 5)
    assert delivered_one(h) == job_id
    trace = b"Traceback (most recent call last):\n  File \"t.py\", line 3, in f\n    d['missing']\nKeyError: 'missing'\n"
    assert h.cmd("NACK", job_id, "REASON", "KeyError: 'missing'", "TRACE", trace) == 1
    info = show(h, job_id)
    assert info["last-failure-trace"] == trace and info["last-nack-reason"] == b"KeyError: 'missing'"
    # GETJOB's counters leave it out (it can be 16 KiB)
    h.advance(60_000)
    assert "last-failure-trace" not in counters(h)
    # JSCAN REPLY all shows it
    scan = h.cmd("JSCAN", "REPLY", "all")
    fields = scan[1][0]
    assert fields[fields.index(b"last-failure-trace") + 1] == trace
    # too long: its tail, starting on a character (é is two bytes in UTF-8)
    long = "é".encode() * TRACE_MAX + b"\nKeyError: 'last line'\n"
    assert h.cmd("NACK", job_id, "TRACE", long) == 1
    kept = h.node.store.get(job_id).extra.trace
    assert len(kept) <= TRACE_MAX and kept.endswith(b"KeyError: 'last line'\n")
    kept.decode("utf-8")  # starts on a character's first byte


def test_nack_trace_bad_input(h):
    job_id = h.add("q", "x", "RETRY", 30)
    assert delivered_one(h) == job_id
    assert str(h.cmd("NACK", job_id, "TRACE")) == "ERR syntax error near 'TRACE': a value must follow it"
    assert str(h.cmd("NACK", job_id, "TRACE", "a", "TRACE", "b")) == "ERR TRACE given twice"
    assert str(h.cmd("NACK", "TRACE", "a")).startswith("ERR wrong number of arguments")
    assert h.node.store.get(job_id).state == ACTIVE and h.node.store.get(job_id).extra is None


def test_a_plain_nack_is_still_disques(h):
    job_id = h.add("q", "x", "RETRY", 30)
    assert delivered_one(h) == job_id
    assert h.cmd("NACK", job_id) == 1
    assert h.node.store.get(job_id).extra is None and h.node.store.get(job_id).nacks == 1


def test_the_trace_goes_to_every_holder_and_into_the_dead_letter():
    c = Cluster()
    job_id = c.add(0, "RETRY", 30, "MAXDELIVER", 2, "BACKOFF", "0.1", "0.1")
    assert c.getjob(0) == job_id
    assert c.cmd(0, "NACK", job_id, "REASON", "first", "TRACE", "trace one") == 1  # NACKED carries it
    assert [c.job(i, job_id).extra.trace for i in range(3)] == [b"trace one"] * 3
    c.advance(200)
    where = c.queued_on(job_id)[0]
    assert c.getjob(where) == job_id
    assert c.cmd(where, "NACK", job_id, "REASON", "second", "TRACE", "trace two\nKeyError") == 1
    dl_id = _one_dead_letter(c, job_id)
    for i in c.holders(dl_id):
        assert c.job(i, dl_id).extra.trace == b"trace two\nKeyError"  # every copy of the dead letter


def test_nack_dead_with_a_trace(h):
    job_id = h.add("q", "x", "RETRY", 30)
    assert delivered_one(h) == job_id
    assert h.cmd("NACK", job_id, "DEAD", "REASON", "Reject: no", "TRACE", "tb") == 1
    info = show(h, dead_letter_id(job_id))
    assert info["last-failure-trace"] == b"tb" and info["dead-letter-reason"] == b"Reject: no"


# =============================================================== the wire and the AOF's map
def test_returns_and_trace_round_trip_and_an_older_map_reads_as_none(h):
    e = Extra(0, 0, 3)
    e.count = 4
    e.merge_returned({"a" * 40: 2, "b" * 40: 1})
    e.trace = b"tb"
    back = extra_from_wire(extra_to_wire(e))
    assert back == e and back.returns == 3 and back.delivered() == 1
    older = extra_to_wire(e)
    del older["rt"], older["t"]  # what a node (or an AOF) of before wrote
    back = extra_from_wire(older)
    assert back.returns == 0 and back.returned is None and back.trace is None and back.count == 4
    job_id = h.add("q", "x", "RETRY", 5, "MAXDELIVER", 3)
    assert delivered_one(h) == job_id
    assert h.cmd("RELEASE", job_id) == 1
    job = h.node.store.get(job_id)
    copy = job_from_wire(job_to_wire(job, h.now), h.now)
    assert copy.extra.returned == job.extra.returned and copy.extra.delivered() == 0


@pytest.mark.parametrize("bad", [
    {"rt": ["a" * 40]}, {"rt": ["a" * 40, -1]}, {"rt": [b"a" * 40, 1]}, {"rt": ["short", 1]}, {"rt": "x"},
    {"rt": ["a" * 40, 1] * 65}, {"t": "text"}, {"t": b"x" * (TRACE_MAX + 1)},
])  # fmt: skip
def test_a_malformed_returns_or_trace_is_refused(bad):
    assert extra_from_wire(bad) is None


def test_returns_of_more_nodes_than_remembered_are_left_out():
    e = Extra()
    e.merge_returned({("%02d" % i) * 20: 1 for i in range(70)})
    assert len(e.returned) == 64 and e.returns == 64
    assert extra_from_wire(extra_to_wire(e)) == e


# =============================================================== QSCAN ALL
def test_qscan_leaves_the_clusters_own_queues_out_unless_all(h):
    h.add("q", "x")
    h.add("@result:D-x", "r")
    h.add("other", "y")
    assert sorted(h.cmd("QSCAN", "BUSYLOOP")[1]) == [b"other", b"q"]
    assert sorted(h.cmd("QSCAN", "BUSYLOOP", "ALL")[1]) == [b"@result:D-x", b"other", b"q"]
    assert sorted(h.cmd("QSCAN", "0", "COUNT", 10, "ALL", "MINLEN", 1)[1]) == [b"@result:D-x", b"other", b"q"]
    # still a queue in every other respect
    assert h.cmd("QLEN", "@result:D-x") == 1
    got = h.cmd("GETJOB", "NOHANG", "FROM", "@result:D-x")
    assert got[0][2] == b"r"
    assert str(h.cmd("QSCAN", "ALLx")) == "ERR invalid cursor"
    assert str(h.cmd("JSCAN", "ALL")) == "ERR invalid cursor"  # a QSCAN option only


def test_release_sends_nothing_for_a_job_held_alone(h):
    job_id = h.add("q", "x", "RETRY", 5, "MAXDELIVER", 1)
    assert delivered_one(h) == job_id
    h.effects()
    assert h.cmd("RELEASE", job_id) == 1
    assert [e for e in h.effects() if type(e) is Send] == []
    assert h.node.store.get(job_id).state == QUEUED and h.node.store.get(job_id).state != ACKED
