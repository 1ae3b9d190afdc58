"""Jobs that fail well (``core/delivery.py``): NACK DELAY/REASON/DEAD, BACKOFF, MAXDELIVER and
dead letters, on one core and on a few cores wired together with a manual clock.

``Cluster`` below drives three nodes in one thread (``wired.Wired``: one clock, every ``Send``
through the real bus codec, crashes).
"""

from __future__ import annotations

from collections import deque

import msgpack
import pytest

from cluster_bus.codec import decode_message, encode_message
from cluster_bus.messages import Data
from disque_py.core import ids as ids_mod
from disque_py.core.delivery import backoff_ms
from disque_py.core.effects import BLOCKED, Reply, Send
from disque_py.core.job import ACKED, ACTIVE, QUEUED, Extra, Job
from disque_py.core.node import Node
from disque_py.core.replies import Error
from disque_py.core.store import J_LOAD
from disque_py.core.wire import JOB_WIRE_FIELDS, extra_to_wire, job_from_wire, job_to_wire

from .conftest import T0, Harness
from .wired import Wired

PEER = "f" * 40


def show(h, job_id) -> dict:
    reply = h.cmd("SHOW", job_id)
    assert isinstance(reply, list), reply
    return {reply[i].decode(): reply[i + 1] for i in range(0, len(reply), 2)}


def delivered_one(h, queue="q") -> bytes:
    reply = h.cmd("GETJOB", "NOHANG", "FROM", queue)
    assert isinstance(reply, list) and len(reply) == 1, reply
    return bytes(reply[0][1])


# =============================================================== a few nodes, wired
class Cluster(Wired):
    """Three nodes (``wired.Wired``) and what these tests ask of them."""

    def add(self, i: int, *opts, queue="q", body="body") -> bytes:
        reply = self.cmd(i, "ADDJOB", queue, body, 0, "REPLICATE", len(self.ids), *opts)
        assert isinstance(reply, bytes) and len(reply) == 40, reply
        return bytes(reply)

    def getjob(self, i: int, queue="q") -> bytes:
        reply = self.cmd(i, "GETJOB", "NOHANG", "FROM", queue)
        assert isinstance(reply, list) and len(reply) == 1, (i, reply)
        return bytes(reply[0][1])

    def dead_letters(self) -> dict[bytes, list[int]]:
        """Every dead-letter job anywhere: ID -> nodes holding it."""
        out: dict[bytes, list[int]] = {}
        for i in self.live():
            for job_id, job in self.node(i).store.items():
                if job.extra is not None and job.extra.origin is not None:
                    out.setdefault(bytes(job_id), []).append(i)
        return out


# =============================================================== bad input changes nothing
@pytest.mark.parametrize(
    "opts, message",
    [
        (["BACKOFF", "x", 1], "ERR BACKOFF min and max must be non negative numbers"),
        (["BACKOFF", 1, "x"], "ERR BACKOFF min and max must be non negative numbers"),
        (["BACKOFF", -1, 1], "ERR BACKOFF min and max must be non negative numbers"),
        (["BACKOFF", 1, -2], "ERR BACKOFF min and max must be non negative numbers"),
        (["BACKOFF", "1e3", 5000], "ERR BACKOFF min and max must be non negative numbers"),
        (["BACKOFF", "0.0001", 1], "ERR BACKOFF min and max must be non negative numbers"),
        (["BACKOFF", "nan", 1], "ERR BACKOFF min and max must be non negative numbers"),
        (["BACKOFF", "", 1], "ERR BACKOFF min and max must be non negative numbers"),
        (["BACKOFF", 2, 1], "ERR BACKOFF min is above max"),
        (["BACKOFF", 0, 0], "ERR BACKOFF max must be above 0"),
        (["BACKOFF", 1], "ERR syntax error near 'BACKOFF'"),
        (["BACKOFF"], "ERR syntax error near 'BACKOFF'"),
        (["BACKOFF", 1, 100, "TTL", 60], "ERR BACKOFF max is beyond the job's TTL"),
        (["BACKOFF", 1, 2, "BACKOFF", 1, 2], "ERR BACKOFF given twice"),
        (["BACKOFF", 1, 2, "RETRY", 0, "REPLICATE", 1], "ERR BACKOFF and MAXDELIVER need a RETRY above 0"),
        (["MAXDELIVER", 0], "ERR MAXDELIVER must be a number of deliveries >= 1"),
        (["MAXDELIVER", -1], "ERR MAXDELIVER must be a number of deliveries >= 1"),
        (["MAXDELIVER", "x"], "ERR MAXDELIVER must be a number of deliveries >= 1"),
        (["MAXDELIVER", "1.5"], "ERR MAXDELIVER must be a number of deliveries >= 1"),
        (["MAXDELIVER"], "ERR syntax error near 'MAXDELIVER'"),
        (["MAXDELIVER", 3, "MAXDELIVER", 3], "ERR MAXDELIVER given twice"),
        (["MAXDELIVER", 3, "RETRY", 0, "REPLICATE", 1], "ERR BACKOFF and MAXDELIVER need a RETRY above 0"),
        (["DEADLETTER", "q"], "ERR DEADLETTER must name another queue"),
        (["DEADLETTER", ""], "ERR DEADLETTER needs a queue name"),
        (["DEADLETTER"], "ERR syntax error near 'DEADLETTER'"),
        (["DEADLETTER", "a", "DEADLETTER", "b"], "ERR DEADLETTER given twice"),
        (["MAXDELIVER", 3, "DEADLETTER", "q"], "ERR DEADLETTER must name another queue"),
    ],
)
def test_addjob_delivery_option_errors_change_nothing(h, opts, message):
    before = dict(h.node.ctx.stats)
    reply = h.cmd("ADDJOB", "q", "b", 0, *opts)
    assert isinstance(reply, Error) and reply.prefix == "ERR", reply
    assert reply.startswith(message), reply
    assert h.cmd("QLEN", "q") == 0 and len(h.node.store) == 0
    assert h.effects() == [] and dict(h.node.ctx.stats) == before


def test_addjob_delivery_options_accepted_and_shown(h):
    job_id = h.add("q", "b", "BACKOFF", "0.5", 30, "MAXDELIVER", 3, "DEADLETTER", "poison", "retry", 10)
    info = show(h, job_id)
    assert info["backoff-min-ms"] == 500 and info["backoff-max-ms"] == 30000
    assert info["maxdeliver"] == 3 and info["deadletter"] == b"poison" and info["deliveries"] == 0
    plain = show(h, h.add("q", "b"))
    assert "deliveries" not in plain and list(plain)[-1] == "body"  # Disque's job: nothing new
    assert show(h, h.add("q", "b", "MAXDELIVER", 2))["deadletter"] == b"q.dead"


@pytest.mark.parametrize(
    "opts, message",
    [
        (["DELAY", -1], "ERR DELAY must be a non negative number"),
        (["DELAY", "x"], "ERR DELAY must be a non negative number"),
        (["DELAY", "1e2"], "ERR DELAY must be a non negative number"),
        (["DELAY", "1.2345"], "ERR DELAY must be a non negative number"),
        (["DELAY", "inf"], "ERR DELAY must be a non negative number"),
        (["DELAY", 4000], "ERR DELAY 4000 s is beyond the TTL left"),
        (["DELAY"], "ERR syntax error near 'DELAY'"),
        (["DELAY", 1, "DELAY", 1], "ERR DELAY given twice"),
        (["REASON"], "ERR syntax error near 'REASON'"),
        (["REASON", "a", "REASON", "b"], "ERR REASON given twice"),
        (["REASON", "x" * 1025], "ERR REASON is 1025 bytes, at most 1024"),
        (["DEAD", "DEAD"], "ERR DEAD given twice"),
        (["DEAD", "DELAY", 1], "ERR DEAD and DELAY together"),
        (["DELAY", 1, "BOGUS"], "ERR syntax error near 'BOGUS'"),
        (["REASON", "why", "later"], "ERR syntax error near 'later'"),
    ],
)
def test_nack_option_errors_change_nothing(h, opts, message):
    job_id = h.add("q", "b", "TTL", 3600, "MAXDELIVER", 1, "BACKOFF", 1, 2)
    assert delivered_one(h) == job_id
    h.effects()
    job = h.node.store.get(job_id)
    before, stats = show(h, job_id), dict(h.node.ctx.stats)
    reply = h.cmd("NACK", job_id, *opts)
    assert isinstance(reply, Error) and reply.prefix == "ERR", reply
    assert reply.startswith(message), reply
    assert show(h, job_id) == before and job.state == ACTIVE and job.nacks == 0 and job.extra.reason is None
    assert h.effects() == [] and dict(h.node.ctx.stats) == stats
    assert h.node.store.get(ids_mod.dead_letter_id(job_id)) is None and h.cmd("QLEN", "q.dead") == 0


def test_nack_delay_beyond_the_ttl_refuses_every_id(h):
    short = h.add("q", "a", "TTL", 10)
    long = h.add("q", "b", "TTL", 3600)
    assert h.cmd("GETJOB", "NOHANG", "COUNT", 2, "FROM", "q") != []
    reply = h.cmd("NACK", long, short, "DELAY", 20)
    assert isinstance(reply, Error) and short.decode() in reply
    assert h.node.store.get(long).nacks == 0 and h.node.store.get(long).state == ACTIVE
    assert h.cmd("NACK", long, short, "DELAY", 5) == 2


# =============================================================== BACKOFF
def _no_jitter(spread_of):
    """randbits whose draw lands on the middle of the jitter range: no jitter."""
    return lambda bits: spread_of[0]


@pytest.mark.parametrize("lo, hi", [(1000, 30000), (500, 500), (300, 10_000), (1, 7)])
def test_backoff_doubles_from_min_up_to_max_without_jitter(lo, hi):
    e = Extra()
    e.backoff_min, e.backoff_max = lo, hi
    for n in range(1, 50):
        base = min(lo * 2 ** (n - 1), hi)
        spread = [base // 10]
        assert backoff_ms(e, n, _no_jitter(spread)) == base, n


def test_backoff_jitter_is_within_ten_percent_and_within_min_max():
    import random

    rng = random.Random(46)
    e = Extra()
    for lo, hi in [(1000, 30000), (100, 100), (250, 4000), (9, 1_000_000)]:
        e.backoff_min, e.backoff_max = lo, hi
        seen = set()
        for n in range(1, 25):
            base = min(lo * 2 ** (n - 1), hi)
            for _ in range(40):
                d = backoff_ms(e, n, rng.getrandbits)
                assert lo <= d <= hi and abs(d - base) <= base // 10, (lo, hi, n, d)
                seen.add(d - base)
        if hi >= 1000:
            assert len(seen) > 3  # the jitter is there
    # the extremes of the draw
    e.backoff_min, e.backoff_max = 1000, 30000
    assert backoff_ms(e, 3, lambda bits: 0) == 4000 - 400
    assert backoff_ms(e, 3, lambda bits: 800) == 4000 + 400
    assert backoff_ms(e, 1, lambda bits: 0) == 1000  # min - 10 % kept at min
    assert backoff_ms(e, 10, lambda bits: 6000) == 30000  # max + 10 % kept at max


def test_backoff_delays_successive_nacks_on_a_node(h):
    job_id = h.add("q", "b", "BACKOFF", 1, 8, "RETRY", 60)
    job = h.node.store.get(job_id)
    for n, base in enumerate([1000, 2000, 4000, 8000, 8000], 1):
        assert delivered_one(h) == job_id
        assert h.cmd("NACK", job_id) == 1
        delay = job.next_at - h.now
        assert job.state == ACTIVE and job.nacks == n
        assert max(1000, base - base // 10) <= delay <= min(8000, base + base // 10), (n, delay)
        assert show(h, job_id)["next-requeue-within"] == delay
        h.advance(delay - 1)
        assert h.cmd("QLEN", "q") == 0 and job.state == ACTIVE
        h.advance(1)
        assert h.cmd("QLEN", "q") == 1 and job.nacks == n  # the end of the delay counts nothing
    assert h.node.ctx.stats["jobs_nack_delayed"] == 5


def test_nack_delay_overrides_backoff_and_plain_nack_is_disques(h):
    job_id = h.add("q", "b", "BACKOFF", 5, 10, "RETRY", 60)
    job = h.node.store.get(job_id)
    delivered_one(h)
    assert h.cmd("NACK", job_id, "DELAY", "0.25") == 1
    assert job.next_at - h.now == 250
    plain = h.add("q", "p")
    h.advance(250)
    assert h.cmd("QLEN", "q") == 2
    assert h.cmd("GETJOB", "NOHANG", "COUNT", 2, "FROM", "q") is not None
    assert h.cmd("NACK", plain) == 1  # no BACKOFF, no DELAY: queued again now, first in line
    assert h.cmd("QLEN", "q") == 1 and h.node.store.get(plain).state == QUEUED
    assert h.cmd("NACK", job_id, "DELAY", 0) == 1  # DELAY 0: now, as Disque's
    assert job.state == QUEUED and job.nacks == 2


# =============================================================== NACK DELAY cluster-wide
def test_nack_delay_is_agreed_by_every_holder_and_the_nacker_queues_it():
    c = Cluster()
    job_id = c.add(0, "RETRY", 5, body="delayed")
    assert sorted(c.holders(job_id)) == [0, 1, 2]
    assert c.getjob(0) == job_id
    assert c.cmd(0, "NACK", job_id, "DELAY", 20, "REASON", "downstream 503") == 1
    for i in range(3):
        job = c.job(i, job_id)
        assert job.state == ACTIVE and job.nacks == 1 and job.extra.reason == b"downstream 503"
        assert job.next_at >= c.now + 20_000, i  # nobody before the delay
    for _ in range(19):
        c.advance(1000)
        assert c.queued_on(job_id) == [], c.now - T0
    c.advance(999)
    assert c.queued_on(job_id) == []
    c.advance(1)
    assert c.queued_on(job_id) == [0]
    c.advance(10_000)  # the other holders' requeue was postponed by the QUEUED
    assert c.queued_on(job_id) == [0]
    for i in range(3):
        job = c.job(i, job_id)
        assert job.nacks == 1 and job.deliveries == 0, (i, job.nacks, job.deliveries)  # counted once
    assert c.node(0).ctx.stats["jobs_nack_delayed"] == 1
    assert c.getjob(0) == job_id and c.cmd(0, "ACKJOB", job_id) == 1


def test_nack_delay_on_a_queued_copy_takes_it_out_everywhere():
    c = Cluster()
    job_id = c.add(0, "RETRY", 3)
    assert c.getjob(0) == job_id
    assert c.cmd(1, "ENQUEUE", job_id) == 1  # queued on node 1 meanwhile
    assert 1 in c.queued_on(job_id)
    assert c.cmd(0, "NACK", job_id, "DELAY", 5) == 1
    assert c.queued_on(job_id) == []
    c.advance(4999)
    assert c.queued_on(job_id) == []
    c.advance(1)
    assert c.queued_on(job_id) == [0]


def test_nack_delay_when_the_nacker_is_gone_another_holder_queues_it_a_retry_later():
    c = Cluster()
    job_id = c.add(0, "RETRY", 5, "MAXDELIVER", 10)
    assert c.getjob(0) == job_id
    assert c.cmd(0, "NACK", job_id, "DELAY", 10) == 1
    start = c.now
    c.crash(0)
    deadline = start + 10_000 + 5_000 - 250  # the delay, a RETRY, less the timer's error
    c.advance(deadline - 1 - c.now)
    assert c.queued_on(job_id) == []
    c.advance(500)
    queued = c.queued_on(job_id)
    assert len(queued) == 1 and queued[0] in (1, 2)
    for i in (1, 2):
        job = c.job(i, job_id)
        assert job.nacks == 1 and job.deliveries == 0 and job.extra.count == 1  # the requeue counted nothing
    # and it is handed out again from there, the count going on
    assert c.getjob(queued[0]) == job_id
    assert all(c.job(i, job_id).extra.count == 2 for i in (1, 2))


# =============================================================== counting, dead letters
def test_deliveries_are_counted_on_every_holder():
    c = Cluster()
    job_id = c.add(0, "RETRY", 30, "MAXDELIVER", 10)
    for n, (where, nacker) in enumerate([(0, 1), (1, 2), (2, 0), (0, 0)], 1):
        assert c.getjob(where) == job_id
        for i in range(3):
            assert c.job(i, job_id).extra.count == n, (n, i)
        assert c.cmd(nacker, "NACK", job_id) == 1  # queued again on the nacker
        assert c.queued_on(job_id) == [nacker]
    reply = c.cmd(0, "GETJOB", "NOHANG", "WITHCOUNTERS", "FROM", "q")
    item = dict(zip(reply[0][3::2], reply[0][4::2]))
    assert item[b"deliveries"] == 5 and item[b"maxdeliver"] == 10 and item[b"nacks"] == 4
    # A job moved to a node whose consumer waits (YOURJOBS) is delivered there once: the
    # move itself is not a delivery.
    assert c.cmd(0, "NACK", job_id) == 1
    assert c.node(1).execute(7, [b"GETJOB", b"TIMEOUT", b"10000", b"FROM", b"q"], c.now) is BLOCKED
    c._collect(1)
    c.settle()
    c.advance(1000)
    got = c.replies.get((1, 7))
    assert got and bytes(got[0][0][1]) == job_id, got
    assert [c.job(i, job_id).extra.count for i in range(3)] == [6, 6, 6]


def _no_dead_letter_yet(c: Cluster, job_id: bytes) -> None:
    assert c.dead_letters() == {}
    assert all(c.job(i, job_id) is not None and c.job(i, job_id).state != ACKED for i in c.live())


def _one_dead_letter(c: Cluster, job_id: bytes, gone: bool = True) -> bytes:
    """One dead letter of ``job_id`` in the cluster, queued once; the original acked
    everywhere (and gone, once its acks are collected, unless a holder is down)."""
    dl = c.dead_letters()
    assert list(dl) == [ids_mod.dead_letter_id(job_id)], dl
    dl_id = next(iter(dl))
    assert len(c.queued_on(dl_id)) == 1, c.queued_on(dl_id)
    c.advance(10)  # the SETACKs leave (batched for GC_MESSAGE_DELAY_MS)
    assert all(c.job(i, job_id) is None or c.job(i, job_id).state == ACKED for i in c.live())
    c.advance(5000)  # the original's acks collected
    if gone:
        assert c.holders(job_id) == []
    assert all(c.job(i, job_id) is None or c.job(i, job_id).state == ACKED for i in c.live())
    assert sum(c.cmd(i, "QLEN", "q.dead") for i in c.live()) == 1
    assert sum(c.cmd(i, "QLEN", "q") for i in c.live()) == 0
    return dl_id


def test_nacks_on_different_nodes_dead_letter_once_after_the_nth_delivery():
    c = Cluster()
    job_id = c.add(0, "RETRY", 30, "MAXDELIVER", 3, "BACKOFF", "0.1", "0.1", body="poison")
    # delivered on 0, NACKed on 1 (queued there after the backoff), delivered on 1, ...
    for where, nacker in [(0, 1), (1, 2)]:
        assert c.getjob(where) == job_id
        assert c.cmd(nacker, "NACK", job_id, "REASON", "boom on %d" % nacker) == 1
        _no_dead_letter_yet(c, job_id)
        c.advance(100)
        assert c.queued_on(job_id) == [nacker]
    assert c.getjob(2) == job_id  # the third delivery
    _no_dead_letter_yet(c, job_id)
    assert c.cmd(0, "NACK", job_id, "REASON", "boom on 0") == 1  # the third failure, elsewhere
    dl_id = _one_dead_letter(c, job_id)
    assert c.queued_on(dl_id) == [0]
    assert c.node(0).ctx.stats["jobs_dead_lettered"] == 1
    assert c.node(0).delivery.dead_by_queue == {b"q": 1}
    assert sum(c.node(i).ctx.stats["jobs_dead_lettered"] for i in range(3)) == 1
    info = show(_On(c, 1), dl_id)  # a copy's fields are the dead letter's own
    assert info["dead-letter-of"] == job_id and info["original-queue"] == b"q"
    assert info["original-deliveries"] == 3 and info["dead-letter-reason"] == b"boom on 0"
    assert info["original-options"] == [b"BACKOFF", b"0.1", b"0.1", b"MAXDELIVER", b"3"]
    assert info["body"] == b"poison" and info["retry"] == 30 and info["queue"] == b"q.dead"


class _On:
    """One node of a Cluster as a Harness-like ``cmd`` for ``show``."""

    def __init__(self, c: Cluster, i: int) -> None:
        self.c, self.i = c, i

    def cmd(self, *args):
        return self.c.cmd(self.i, *args, client=99)


def test_the_final_failure_a_retry_timeout_on_a_holder_that_did_not_deliver_it():
    c = Cluster()
    job_id = c.add(0, "RETRY", 5, "MAXDELIVER", 2)
    assert c.getjob(0) == job_id
    assert c.cmd(0, "NACK", job_id) == 1
    assert c.getjob(0) == job_id  # the second delivery, from node 0 only
    assert [c.job(i, job_id).extra.count for i in range(3)] == [2, 2, 2]
    c.crash(0)  # the node that delivered it is gone: nobody acks, nobody NACKs
    _no_dead_letter_yet(c, job_id)
    c.advance(4000)
    _no_dead_letter_yet(c, job_id)
    c.advance(2000)  # a RETRY: holder 1 or 2 times out, sees 2 deliveries of 2
    dl_id = _one_dead_letter(c, job_id, gone=False)  # acked, kept until node 0 confirms
    assert sorted(c.holders(dl_id)) == [1, 2]
    info = show(_On(c, c.queued_on(dl_id)[0]), dl_id)
    assert info["original-deliveries"] == 2 and info["dead-letter-reason"] == b"not acknowledged within its RETRY (5 s)"


@pytest.mark.parametrize("seed", range(6))
def test_a_retry_timeout_with_every_holder_up_dead_letters_once(seed):
    c = Cluster()
    for i in range(3):
        c.node(i).ctx.randbits = __import__("random").Random(seed * 10 + i).getrandbits
    job_id = c.add(seed % 3, "RETRY", 2, "MAXDELIVER", 1)
    assert c.getjob(seed % 3) == job_id
    c.advance(1700)
    _no_dead_letter_yet(c, job_id)
    c.advance(1000)
    _one_dead_letter(c, job_id)


def test_under_maxdeliver_failures_queue_it_again():
    c = Cluster()
    job_id = c.add(0, "RETRY", 2, "MAXDELIVER", 3)
    assert c.getjob(0) == job_id
    c.advance(2300)  # first RETRY timeout: 1 delivery of 3, queued again somewhere
    assert len(c.queued_on(job_id)) == 1 and c.dead_letters() == {}
    where = c.queued_on(job_id)[0]
    assert c.getjob(where) == job_id
    c.advance(2300)
    assert len(c.queued_on(job_id)) == 1 and c.dead_letters() == {}
    where = c.queued_on(job_id)[0]
    assert c.getjob(where) == job_id
    c.advance(2300)  # the third delivery failed: dead-lettered
    _one_dead_letter(c, job_id)


def test_nack_dead_dead_letters_now_with_its_reason_and_a_custom_queue():
    c = Cluster()
    job_id = c.add(1, "RETRY", 30, "DEADLETTER", "poison", body="x" * 100, queue="jobs")
    assert c.getjob(1, "jobs") == job_id
    assert c.cmd(2, "NACK", job_id, "DEAD", "REASON", "bad input") == 1
    dl_id = ids_mod.dead_letter_id(job_id)
    assert list(c.dead_letters()) == [dl_id] and c.queued_on(dl_id) == [2]
    c.advance(5000)
    assert c.holders(job_id) == []
    info = show(_On(c, 0), dl_id)
    assert info["queue"] == b"poison" and info["dead-letter-of"] == job_id and info["original-queue"] == b"jobs"
    assert info["original-deliveries"] == 1 and info["dead-letter-reason"] == b"bad input"
    assert info["original-options"] == [b"DEADLETTER", b"poison"] and info["body"] == b"x" * 100
    assert c.cmd(2, "NACK", job_id, "DEAD") == 0  # gone: nothing nacked


def test_nack_dead_of_a_job_without_options(h):
    job_id = h.add("q", "plain", "retry", 10)
    assert h.cmd("NACK", job_id, "DEAD") == 0  # queued, not active: not nacked
    assert delivered_one(h) == job_id
    assert h.cmd("NACK", job_id, "DEAD") == 1
    dl_id = ids_mod.dead_letter_id(job_id)
    info = show(h, dl_id)
    assert info["dead-letter-of"] == job_id and info["original-options"] == [] and info["dead-letter-reason"] is None
    assert info["original-deliveries"] == 1 and h.cmd("QLEN", "q.dead") == 1 and h.node.store.get(job_id) is None


def test_the_dead_letter_id_is_the_same_everywhere_and_a_valid_id(h):
    job_id = h.add("q", "b", "TTL", 7200)
    dl_id = ids_mod.dead_letter_id(job_id)
    assert ids_mod.valid_job_id(dl_id) and dl_id != job_id and len(dl_id) == 40
    assert dl_id[:11] == job_id[:11] and dl_id[-5:] == job_id[-5:]  # node prefix, TTL field, RETRY parity
    assert ids_mod.dead_letter_id(bytearray(job_id)) == dl_id
    assert ids_mod.dead_letter_id(dl_id) != dl_id  # a dead letter's own dead letter is another job
    assert len({ids_mod.dead_letter_id(h.add("q", "b")) for _ in range(50)}) == 50


def test_two_holders_dead_lettering_one_job_make_copies_of_one_job():
    """A partition: each side NACKs DEAD its copy; when it heals, one dead-letter ID."""
    c = Cluster(2)
    job_id = c.add(0, "RETRY", 30, "MAXDELIVER", 1)
    assert c.getjob(0) == job_id
    # cut the link: each side sees the other unreachable, messages between them dropped
    for i in range(2):
        c.node(i).ctx.reachable = []
    sent = []
    c.settle = lambda: sent.extend(c.inbox) or c.inbox.clear()  # type: ignore[method-assign]
    assert c.cmd(0, "NACK", job_id) == 1
    assert c.cmd(1, "NACK", job_id, "DEAD") == 1
    dl_id = ids_mod.dead_letter_id(job_id)
    assert c.job(0, dl_id) is not None and c.job(1, dl_id) is not None
    assert c.dead_letters() == {dl_id: [0, 1]}


# =============================================================== the wire and the AOF
def _job_with_extra(h) -> Job:
    job_id = h.add("q", "b", "BACKOFF", "0.5", 30, "MAXDELIVER", 3, "DEADLETTER", "dlq", "REPLICATE", 1)
    job = h.node.store.get(job_id)
    job.extra.count = 2
    job.extra.reason = b"why"
    return job


def test_extra_round_trips_on_the_wire(h):
    job = _job_with_extra(h)
    wire = job_to_wire(job, h.now)
    assert len(wire) == JOB_WIRE_FIELDS + 1
    back = job_from_wire(msgpack.unpackb(msgpack.packb(wire, use_bin_type=True), raw=False), h.now)
    assert back is not None and back.extra == job.extra and back.extra is not job.extra
    assert back.id == job.id and back.body == job.body
    # a dead letter's origin too
    delivered_one(h)
    assert h.cmd("NACK", job.id, "DEAD", "REASON", "r") == 1
    dl = h.node.store.get(ids_mod.dead_letter_id(job.id))
    wire = job_to_wire(dl, h.now)
    back = job_from_wire(msgpack.unpackb(msgpack.packb(wire, use_bin_type=True), raw=False), h.now)
    assert back.extra == dl.extra
    assert back.extra.origin == (bytes(job.id), b"q", 3, b"r", [b"BACKOFF", b"0.5", b"30", b"MAXDELIVER", b"3", b"DEADLETTER", b"dlq"])


GOOD_ID = b"D-01234567-AAAAAAAAAAAAAAAAAAAAAAAA-05a1"
BAD_EXTRAS = [
    {"bm": -1, "bx": 5}, {"bm": 6, "bx": 5}, {"bx": "5"}, {"bx": 1.5}, {"md": -1}, {"md": True}, {"c": -3},
    {"c": 1 << 63}, {"dl": "text"}, {"dl": 5}, {"r": 7}, {"r": b"x" * ((1 << 20) + 1)}, {"o": []},
    {"o": [GOOD_ID, b"q", 1, None]}, {"o": [b"bad", b"q", 1, None, []]}, {"o": [GOOD_ID, "q", 1, None, []]},
    {"o": [GOOD_ID, b"q", -1, None, []]}, {"o": [GOOD_ID, b"q", 1, 5, []]}, {"o": [GOOD_ID, b"q", 1, None, [5]]},
    {"o": [GOOD_ID, b"q", 1, None, [b"x"] * 17]}, {"o": "x"}, {"o": (GOOD_ID, b"q", 1, None, None)},
]  # fmt: skip


def _plain_wire(now: int) -> list:
    job = Job(GOOD_ID, ACTIVE, b"q", b"body", 2, 1_700_000_000_000_000_000, now + 60_000, 0, 10, 0, (PEER,))
    return job_to_wire(job, now)


@pytest.mark.parametrize("extra", BAD_EXTRAS, ids=range(len(BAD_EXTRAS)))
def test_a_malformed_extra_is_refused_and_counted_as_a_malformed_repljob(extra):
    wire = _plain_wire(T0) + [extra]
    assert job_from_wire(wire, T0) is None
    h = Harness()
    node = h.node
    node.ctx.cluster_size = 2
    node.ctx.known_nodes = [node.id, PEER]
    node.ctx.reachable = [PEER]
    packed = msgpack.unpackb(msgpack.packb([wire, False], use_bin_type=True), raw=False)
    node.receive_data(PEER, "REPLJOB", packed, h.now)
    assert node.bus_stats["messages_malformed"] == 1
    assert node.store.get(GOOD_ID) is None and node.take_effects() == []


def test_a_later_versions_twelfth_field_that_is_not_a_map_is_ignored():
    for later in (None, 5, b"x", [1, 2]):
        job = job_from_wire(_plain_wire(T0) + [later], T0)
        assert job is not None and job.extra is None
    # the 13th is the priority (test_priority.py); a 14th, a later version's, is ignored
    job = job_from_wire(_plain_wire(T0) + [{"md": 2, "zz": "unknown key"}, 5, "14th"], T0)
    assert job.extra.maxdeliver == 2


def test_a_job_without_options_is_what_it_was_on_the_wire_and_in_the_aof(h):
    """The bytes of a job without BACKOFF/MAXDELIVER/DEADLETTER, as written before they
    existed (taken from the tree of the commit before them, for this fixed job)."""
    from disque_py.persistence.journal import encode_entries, snapshot

    job = Job(GOOD_ID, QUEUED, b"q", b"body", 2, 1_700_000_000_123_456_789, T0 + 60_000, 0, 10, 0, (PEER, "e" * 40))
    job.nacks, job.deliveries = 3, 4
    wire = job_to_wire(job, T0)
    assert len(wire) == JOB_WIRE_FIELDS
    assert msgpack.packb(wire, use_bin_type=True) == BEFORE_WIRE
    assert encode_entries([(J_LOAD, job)], 0) == BEFORE_AOF
    assert b"".join(snapshot([job], 0)) == BEFORE_AOF
    assert b"JOBEXTRA" not in BEFORE_AOF
    job.extra = Extra()
    assert encode_entries([(J_LOAD, job)], 0).startswith(BEFORE_AOF + b"*4\r\n$8\r\nJOBEXTRA\r\n")
    assert extra_to_wire(job.extra) == {}


BEFORE_WIRE = (
    b"\x9b\xc4(D-01234567-AAAAAAAAAAAAAAAAAAAAAAAA-05a1\xc4\x01q\xc4\x04body\x02\xcd\xea`\xcf\x17\x97\x9c\xfe=\x85"
    b"\xcd\x15\x00\n\x03\x04\x92\xd9(" + b"f" * 40 + b"\xd9(" + b"e" * 40
)
BEFORE_AOF = (
    b"*8\r\n$7\r\nLOADJOB\r\n$40\r\nD-01234567-AAAAAAAAAAAAAAAAAAAAAAAA-05a1\r\n$6\r\nqueued\r\n"
    b"$45\r\n2 0 1700000000123456789 1000060000 0 10 3 4 0\r\n$81\r\n" + b"f" * 40 + b" " + b"e" * 40 + b"\r\n"
    b"$1\r\nq\r\n$4\r\nbody\r\n$8\r\n6eedc12e\r\n"
)


def test_a_node_cut_off_alone_keeps_the_original_until_its_dead_letter_has_a_second_copy():
    # the node that dead-letters a job cannot reach its other holders: a dead letter held by it
    # alone would be lost with it, so the original stays until a second copy is confirmed
    c = Cluster()
    job_id = c.add(0, "RETRY", 2)
    assert c.getjob(0) == job_id
    c.partition({0}, {1, 2})
    assert c.cmd(0, "NACK", job_id, "DEAD", "REASON", "poison") == 1
    dl_id = ids_mod.dead_letter_id(job_id)
    assert c.dead_letters() == {dl_id: [0]}
    assert c.job(0, job_id).state != ACKED  # kept: the dead letter has one copy
    c.advance(5000)  # RETRYs go by, still cut off: the original stays, nothing acked
    assert c.job(0, job_id) is not None and c.job(0, job_id).state != ACKED
    c.heal()
    c.advance(5000)  # the next RETRY asks for the copies again: made, then the original goes
    assert sorted(c.dead_letters()[dl_id]) == [0, 1, 2]
    c.advance(60_000)
    assert all(c.job(i, job_id) is None or c.job(i, job_id).state == ACKED for i in range(3))
    assert len(c.queued_on(dl_id)) == 1
    # and the node that made it may die now: the dead letter lives on
    c.crash(0)
    assert sorted(c.dead_letters()[dl_id]) == [1, 2]
