"""Federation: consumers on one node get jobs produced on others (NEEDJOBS/YOURJOBS + push leases)."""

from __future__ import annotations

import random

import pytest

from disque_py.core.effects import BLOCKED
from disque_py.core.federation import LEASE_MS, NEEDJOBS_MAX_REQUEST
from disque_py.core.leases import LOCAL_FIRST_MS
from disque_py.core.replies import NULL_ARRAY

from .cluster_model import ACKED, SimCluster
from .test_replication_sim import addjob, getjob, gone_everywhere


def blocked_consumer(c: SimCluster, i: int, queue: str = "q", timeout: int = 0):
    cl = c.client(i)
    assert cl.cmd("GETJOB", "TIMEOUT", timeout, "FROM", queue) is BLOCKED
    return cl


@pytest.mark.parametrize("retry", [["RETRY", 30], ["RETRY", 0, "REPLICATE", 1]])
@pytest.mark.parametrize("seed", [1, 2, 3])
def test_producer_on_b_consumer_on_a_exactly_once(seed, retry):
    c = SimCluster(3, seed, delay=(0, 2))
    consumers = [blocked_consumer(c, 0) for _ in range(3)]
    c.run_for(50)
    produced = []
    got: list[bytes] = []
    for k in range(60):
        produced.append(addjob(c, 1, *retry, body="job-%d" % k))
        c.run_for(5)
        for cl in consumers:
            if cl.pending is None and cl.replies:
                reply = cl.replies[-1]
                got.extend(bytes(item[1]) for item in reply)
                c.client(0).cmd("ACKJOB", *[bytes(item[1]) for item in reply])
                cl.replies.clear()
                assert cl.cmd("GETJOB", "TIMEOUT", 0, "FROM", "q") is BLOCKED
    c.run_until(lambda: len(got) + sum(len(r) for cl in consumers for r in cl.replies) >= 60 or
                all(cl.pending is None for cl in consumers), 5000)  # fmt: skip
    for cl in consumers:
        for reply in cl.replies:
            got.extend(bytes(item[1]) for item in reply)
    # drain whatever is still queued anywhere through node 0
    c.run_until(lambda: sum(len(getjob(c, 0)) for _ in [0]) == 0 and not any(
        c.queued_on(j) for j in produced), 20_000, "everything reached node 0")  # fmt: skip
    for j in produced:
        assert c.ledger.delivered[j] == 1, (j, c.ledger.delivered[j], c.states(j))
    assert c.nodes[0].stats["jobs_imported"] >= 50


def test_delivery_latency_is_one_hop_with_a_waiting_consumer():
    c = SimCluster(3, 7, delay=(1, 1))  # 1 ms per message
    cl = blocked_consumer(c, 0)
    c.run_for(3000)  # the NEEDJOBS broadcast has gone out long ago; leases renewed meanwhile
    t0 = c.now
    job = addjob(c, 1, "REPLICATE", 1)
    reply = cl.wait_reply(1000)
    assert reply[0][1] == job
    assert c.now - t0 <= 5, "took %d virtual ms" % (c.now - t0)
    assert c.nodes[1].stats["jobs_pushed"] == 1


@pytest.mark.parametrize("idle_ms", [3_500, 10_000, 65_000, 300_000])
def test_a_producer_appearing_after_a_long_wait_is_one_hop_away(idle_ms):
    """The consumer node's NEEDJOBS broadcast backs off to one every 30 s while nothing comes;
    the leases it opens must last until its next one, or a producer that starts in between
    waits for that broadcast (up to 30 s, as in Disque) instead of pushing at once."""
    c = SimCluster(3, 8, delay=(1, 1))
    cl = blocked_consumer(c, 0)
    c.run_for(idle_ms)
    for k in range(3):  # each job a second after the other: every one goes out on its own
        t0 = c.now
        job = addjob(c, 1, "REPLICATE", 1, body="late-%d" % k)
        reply = cl.wait_reply(60_000)
        assert reply[0][1] == job
        assert c.now - t0 <= 5, "took %d virtual ms after %d idle ms" % (c.now - t0, idle_ms)
        c.client(0).cmd("ACKJOB", job)
        cl = blocked_consumer(c, 0)
        c.run_for(1000)


def test_a_node_whose_consumer_is_between_two_getjobs_keeps_the_next_job():
    """Local consumers first, even when none is blocked at the instant a job is queued: one that
    took a job a moment ago gets the next one here; a backlog, or local consumers gone quiet,
    lets jobs go to a node whose consumers wait (fewer copies moved, fewer holders a network
    cut can split)."""
    c = SimCluster(3, 9, delay=(1, 1))
    remote = blocked_consumer(c, 0)
    c.run_for(3000)  # node 1 holds a push lease from node 0
    local = c.client(1)
    first = addjob(c, 1, "REPLICATE", 1, body="first")
    assert remote.wait_reply(1000)[0][1] == first  # nobody local yet: pushed
    c.client(0).cmd("ACKJOB", first)
    remote = blocked_consumer(c, 0)
    c.run_for(10)
    assert local.cmd("GETJOB", "NOHANG", "FROM", "q") == NULL_ARRAY  # a local consumer shows up
    pushed = c.nodes[1].stats["jobs_pushed"]
    kept = addjob(c, 1, "REPLICATE", 1, body="kept")
    c.run_for(10)
    assert c.queued_on(kept) == [1] and c.nodes[1].stats["jobs_pushed"] == pushed
    backlog = addjob(c, 1, "REPLICATE", 1, body="backlog")  # one waits here already: this goes
    assert remote.wait_reply(1000)[0][1] == backlog
    assert local.cmd("GETJOB", "NOHANG", "FROM", "q")[0][1] == kept
    c.client(0).cmd("ACKJOB", backlog)
    c.client(1).cmd("ACKJOB", kept)
    remote = blocked_consumer(c, 0)
    c.run_for(LOCAL_FIRST_MS + 10)  # the local consumer went quiet
    late = addjob(c, 1, "REPLICATE", 1, body="late")
    assert remote.wait_reply(1000)[0][1] == late


def test_hundred_jobs_at_random_nodes_all_fetched_from_node_0():
    c = SimCluster(5, 11, delay=(0, 5))
    rng = random.Random(11)
    ids = {addjob(c, rng.randrange(5), body="j%d" % k) for k in range(100)}
    seen: set[bytes] = set()

    def drain() -> bool:
        batch = getjob(c, 0)
        if batch:
            c.client(0).cmd("ACKJOB", *batch)
        seen.update(batch)
        return seen >= ids

    took = c.run_until(drain, 60_000, "all 100 jobs fetched from node 0")
    assert seen == ids
    assert took < 30_000
    assert all(c.ledger.delivered[j] == 1 for j in ids)


def test_consumer_node_dying_with_credit_strands_nothing_beyond_retry():
    c = SimCluster(3, 21, delay=(0, 2))
    blocked_consumer(c, 0)
    blocked_consumer(c, 0)
    c.run_for(100)  # node 1 holds a lease from node 0
    c.crash(0)  # the consumer node dies with its credit open
    ids = [addjob(c, 1, "RETRY", 5, "REPLICATE", 2, body="x%d" % k) for k in range(20)]
    # pushed jobs (at most the credit) went to the dead node; their other copies requeue them
    pushed = c.nodes[1].stats["jobs_pushed"]
    assert pushed <= 10, pushed
    seen: set[bytes] = set()

    def drain() -> bool:
        for i in (1, 2):
            batch = getjob(c, i)
            if batch:
                c.client(i).cmd("ACKJOB", *batch)
            seen.update(batch)
        return seen >= set(ids)

    took = c.run_until(drain, 30_000, "every job delivered by the survivors")
    # within RETRY, plus its jitter and the time to see node 0 down (the lease itself lasts
    # LEASE_MS, far longer: what bounds the loss is the credit and reachability, not its length)
    assert took <= 5000 + 1500 + 3000, took


def test_paused_out_queue_serves_no_needjobs_and_leaving_node_asks_none():
    c = SimCluster(3, 31, delay=(0, 2))
    job = addjob(c, 1, "REPLICATE", 1)
    assert c.cmd(1, "PAUSE", "q", "out") == b"out"
    cl = blocked_consumer(c, 0, timeout=3000)
    assert cl.wait_reply(5000) is NULL_ARRAY  # nothing moved while paused out
    assert c.queued_on(job) == [1]
    assert c.cmd(1, "PAUSE", "q", "none") == b"none"
    c.set_leaving(2, True)
    c.run_for(100)
    assert c.cmd(2, "GETJOB", "TIMEOUT", 100, "FROM", "q").startswith("LEAVING")
    assert c.nodes[2].stats["needjobs_sent"] == 0
    cl = blocked_consumer(c, 0, timeout=3000)
    reply = cl.wait_reply(5000)
    assert reply[0][1] == job


def test_steady_push_does_not_ask_again_for_every_job():
    """A consumer node re-asks a pushing source only as its lease runs low, not per job."""
    c = SimCluster(3, 21, delay=(1, 1))
    consumers = [blocked_consumer(c, 0) for _ in range(4)]
    c.run_for(3000)  # discovery done: node 1 holds a lease for node 0
    needjobs_before = c.nodes[0].stats["needjobs_sent"]
    pushed_before = c.nodes[1].stats["jobs_pushed"]
    got = 0
    for k in range(200):
        addjob(c, 1, "REPLICATE", 1, body="job-%d" % k)
        c.run_for(3)
        for cl in consumers:
            if cl.pending is None and cl.replies:
                got += len(cl.replies[-1])
                c.client(0).cmd("ACKJOB", *[bytes(item[1]) for item in cl.replies[-1]])
                cl.replies.clear()
                assert cl.cmd("GETJOB", "TIMEOUT", 0, "FROM", "q") is BLOCKED
    c.run_for(50)
    got += sum(len(r) for cl in consumers for r in cl.replies)
    assert got == 200
    pushed = c.nodes[1].stats["jobs_pushed"] - pushed_before
    asked = c.nodes[0].stats["needjobs_sent"] - needjobs_before
    assert pushed >= 190  # the jobs were pushed, not pulled
    assert asked <= pushed // 4, "%d NEEDJOBS for %d pushed jobs" % (asked, pushed)  # was one per job


def run_busy_consumers(c: SimCluster, jobs: int, every_ms: int, work_ms: int, consumers: int, burst: int = 1) -> int:
    """A producer on node 1 adds ``burst`` jobs every ``every_ms``; ``consumers`` clients on node 0 each
    take a job, work ``work_ms`` on it (not blocked meanwhile), ACK it and block again. Returns
    the jobs received."""
    clients = [blocked_consumer(c, 0) for _ in range(consumers)]
    busy: dict[int, tuple[int, list[bytes]]] = {}  # client index -> (done at, ids)
    got = 0

    def step() -> None:
        nonlocal got
        now = c.now
        for k, cl in enumerate(clients):
            reply = None
            if k in busy:
                done_at, ids = busy[k]
                if now >= done_at:
                    del busy[k]
                    c.client(0).cmd("ACKJOB", *ids)
                    reply = cl.cmd("GETJOB", "TIMEOUT", 0, "FROM", "q")
                    if reply is BLOCKED:
                        reply = None
            elif cl.pending is None and cl.replies:
                reply = cl.replies.pop()
            if reply is not None:
                ids = [bytes(item[1]) for item in reply]
                got += len(ids)
                busy[k] = (now + work_ms, ids)

    for k in range(0, jobs, burst):
        for j in range(k, min(jobs, k + burst)):
            addjob(c, 1, "REPLICATE", 1, body="job-%d" % j)
        for _ in range(every_ms):
            c.run_for(1)
            step()
    for _ in range(3000):
        if got == jobs:
            break
        c.run_for(1)
        step()
    return got


def test_busy_consumers_keep_their_credit_topped_up():
    """Jobs come in bursts (as from a loaded node) to consumers that are busy when they
    arrive, so they are rarely blocked and their node's queue is rarely empty: the consumer
    node renews its lease with the source as half of the credit is used, so most jobs are
    still pushed instead of waiting for the queue to run dry and be pulled (689 of 1500
    were pushed before)."""
    c = SimCluster(3, 23, delay=(1, 1))
    warm = blocked_consumer(c, 0)
    c.run_for(3000)  # discovery done: node 1 holds a lease for node 0
    addjob(c, 1, "REPLICATE", 1, body="warm-up")
    assert warm.wait_reply(1000)[0][2] == b"warm-up"
    pushed_before = c.nodes[1].stats["jobs_pushed"]
    got = run_busy_consumers(c, 1500, every_ms=10, work_ms=2, consumers=4, burst=15)
    assert got == 1500
    pushed = c.nodes[1].stats["jobs_pushed"] - pushed_before
    assert pushed >= 1200, "%d of 1500 jobs pushed, the rest pulled" % pushed


def test_a_consumer_node_that_stops_consuming_takes_at_most_twice_its_credit():
    """Renewals stop once the consumer node's own queue holds a credit's worth of jobs: the
    rest stays at the source for consumers elsewhere."""
    c = SimCluster(3, 24, delay=(1, 1))
    clients = [blocked_consumer(c, 0) for _ in range(4)]
    c.run_for(3000)
    for k in range(1000):  # every consumer takes one job and then never comes back
        addjob(c, 1, "REPLICATE", 1, body="job-%d" % k)
        c.run_for(1)
    c.run_for(LEASE_MS)
    assert all(cl.replies for cl in clients)
    imported = c.nodes[0].stats["jobs_imported"]
    assert imported <= 2 * NEEDJOBS_MAX_REQUEST + len(clients), imported
    assert c.cmd(1, "QLEN", "q") == 1000 - imported


@pytest.mark.parametrize("ack_at", [1, 0, 2], ids=["ack-on-consumer-node", "ack-on-producer-node", "ack-on-third"])
@pytest.mark.parametrize("mode", [["ASYNC"], []], ids=["async", "sync"])
def test_a_pushed_replicated_job_acked_anywhere_never_comes_back(mode, ack_at):
    """A job with two copies (A and B, or A and C), pushed to a consumer waiting on B and
    acknowledged on B, A or C: every copy is collected and none is queued again, however many
    RETRY periods pass. Before, A did not note that B had a copy (as in Disque), so an ack on A
    or C never reached B, and with ASYNC the push left before C was picked, so an ack on B never
    reached C."""
    for seed in range(5):
        c = SimCluster(3, 100 + seed, delay=(0, 2))
        consumer = blocked_consumer(c, 1)
        c.run_for(100)  # A holds a push lease from B
        job = addjob(c, 0, "REPLICATE", 2, "RETRY", 2, *mode)
        reply = consumer.wait_reply(1000)
        assert [bytes(item[1]) for item in reply] == [job]
        assert c.nodes[0].stats["jobs_pushed"] == 1
        c.client(ack_at).cmd("ACKJOB", job)  # 0 on C when B holds the second copy (a dummy ack)
        c.run_until(gone_everywhere(c, job), 20_000, "the acknowledged job collected on every node")
        c.run_for(3 * 2000)  # three RETRY periods: nothing left to requeue it
        for i in range(3):
            assert getjob(c, i) == []
        assert c.ledger.delivered[job] == 1, c.states(job)


def test_an_async_job_pushed_at_once_tells_the_consumer_node_every_holder():
    """ADDJOB ... ASYNC may push the job in the same command that picks its other holder: the
    YOURJOBS must name that holder too (and the consumer node needs no REPLJOB on top), so that
    an ack on the consumer node reaches it at once, even while the producer node is cut off."""
    tried = 0
    for seed in range(12):
        c = SimCluster(3, 200 + seed, delay=(0, 2))
        consumer = blocked_consumer(c, 1)
        c.run_for(100)
        job = addjob(c, 0, "REPLICATE", 2, "RETRY", 5, "ASYNC")
        assert [bytes(item[1]) for item in consumer.wait_reply(1000)] == [job]
        c.run_for(20)
        if 2 not in c.holders(job):
            continue  # the second copy went to the consumer node itself
        tried += 1
        assert sorted(c.show(1, job)["nodes-delivered"]) == sorted(n.id for n in c.nodes)
        assert c.stats["sent:REPLJOB"] == 1  # to the other holder only: the consumer node got it in YOURJOBS
        c.partition([0], [1, 2])
        assert c.client(1).cmd("ACKJOB", job) == 1
        c.run_for(200)
        assert c.state_of(2, job) == ACKED
    assert tried >= 3


@pytest.mark.parametrize("seed", [31, 32, 33])
def test_a_backlog_is_pulled_in_batches_that_overlap_its_consumption(seed):
    """Node 1 holds a backlog when consumers start on node 0; they are busy most of the time,
    so node 0's queue holds the last batch while they work. Node 0 asks for the next batch as
    soon as its queue holds less than a batch, not when it is empty: the batches overlap, and
    once the import rate is known (the first 100 jobs) the consumers never wait a round trip
    for one while node 1 still has plenty (at its end, node 1 gives half of what is left per
    request, as Disque does). Asked only when node 0's queue was empty, they waited 48 times."""
    c = SimCluster(3, seed, delay=(5, 5))  # a 10 ms round trip
    for k in range(900):
        addjob(c, 1, "REPLICATE", 1, body="job-%d" % k)
    clients = [blocked_consumer(c, 0) for _ in range(4)]
    busy: dict[int, tuple[int, list[bytes]]] = {}  # client index -> (done at, ids)
    got = starved = 0
    deadline = c.now + 60_000
    while got < 900:
        assert c.now < deadline, "%d of 900 jobs received" % got
        c.run_for(1)
        for k, cl in enumerate(clients):
            reply = None
            if k in busy and c.now >= busy[k][0]:
                c.client(0).cmd("ACKJOB", *busy.pop(k)[1])
                reply = cl.cmd("GETJOB", "TIMEOUT", 0, "FROM", "q")
                if reply is BLOCKED:
                    reply = None
                    if got >= 100 and c.cmd(1, "QLEN", "q") >= 2 * NEEDJOBS_MAX_REQUEST:
                        starved += 1  # a consumer waits while the source still has jobs
            elif k not in busy and cl.pending is None and cl.replies:
                reply = cl.replies.pop()
            if reply is not None:
                got += len(reply)
                busy[k] = (c.now + 1, [bytes(item[1]) for item in reply])  # 1 ms of work per job
    assert starved == 0, "%d waits for a batch while node 1 still had jobs" % starved
    assert c.nodes[0].stats["jobs_imported"] == 900
    assert c.nodes[1].stats["jobs_pushed"] == 0  # all of it pulled


# -- a job queued again anywhere reaches a consumer waiting anywhere (issue 59) -----------
#
# Node 0's consumer has waited 40 s: its discovery NEEDJOBS goes out once every 30 s by then,
# so anything slower than one round trip below waited for that broadcast (up to 30 s, as
# Disque's pull does).

LONG_WAIT_MS = 40_000


def _taken_on_1(c: SimCluster, repl: int, retry: int = 60) -> tuple[object, bytes]:
    """Node 0's consumer has waited LONG_WAIT_MS; a job made on node 1 (REPLICATE ``repl``:
    1, node 0 holds no copy; 3, it holds one) goes to a client of node 1 waiting there."""
    remote = blocked_consumer(c, 0)
    c.run_for(LONG_WAIT_MS)
    local = blocked_consumer(c, 1)
    job = addjob(c, 1, "REPLICATE", repl, "RETRY", retry)
    assert local.wait_reply(100)[0][1] == job
    assert (0 in c.holders(job)) == (repl == 3)
    return remote, job


def _no_leases(c: SimCluster) -> None:
    """The push leases node 0 opened on the others are gone (run out, or never granted: a node
    that restarted holds none): only a pull brings the job."""
    for i in (1, 2):
        c.node(i).leases.by_queue.clear()


@pytest.mark.parametrize("repl,leased", [(1, True), (3, True), (3, False)])
def test_a_nacked_job_reaches_a_consumer_waiting_on_another_node_in_one_hop(repl, leased):
    """A job NACKed on node 1 a moment after its consumer there took it, while a consumer has
    waited on node 0 for 40 s: node 0 gets it in one hop. Pushed under node 0's lease (a job
    given back is not kept for the local consumer that gave it back); without a lease, node 0,
    which holds a copy, hears the QUEUED and asks node 1 for it. It took 4-18 s before (the
    next discovery NEEDJOBS)."""
    c = SimCluster(3, 41, delay=(1, 1))
    remote, job = _taken_on_1(c, repl)
    c.run_for(5)
    if not leased:
        _no_leases(c)
    sent = c.stats["sent:NEEDJOBS"]
    t0 = c.now
    assert c.client(1).cmd("NACK", job) == 1
    assert remote.wait_reply(60_000)[0][1] == job
    assert c.now - t0 <= 3, "took %d virtual ms" % (c.now - t0)
    # the pull (one), and node 0 renewing its lease on node 1 once the job is taken (top-up)
    assert c.stats["sent:NEEDJOBS"] - sent <= 3


@pytest.mark.parametrize("repl,leased", [(1, True), (3, True), (3, False)])
def test_a_job_queued_again_by_its_retry_reaches_a_consumer_waiting_elsewhere_in_one_hop(repl, leased):
    """The same when the job's RETRY ends on a node with no consumer (node 1, or node 2 when it
    holds a copy too): measured from the first holder's requeue time."""
    c = SimCluster(3, 42, delay=(1, 1))
    remote, job = _taken_on_1(c, repl, retry=2)
    if not leased:
        _no_leases(c)
    for i in (0, 2):
        if i in c.holders(job):
            held = c.node(i).store.get(job)
            held.next_at += 5_000  # node 1's timer comes first
            c.node(i).lifecycle.reschedule(held)
    requeue_at = c.node(1).store.get(job).next_at - c.mono_offset[1]
    sent = c.stats["sent:NEEDJOBS"]
    assert remote.wait_reply(60_000)[0][1] == job
    assert c.now - requeue_at <= 3, "took %d virtual ms after the requeue" % (c.now - requeue_at)
    assert c.stats["sent:NEEDJOBS"] - sent <= 3


def test_a_job_queued_again_as_its_node_restarts_reaches_a_consumer_waiting_elsewhere():
    """Node 1 had a job queued when it went down; it comes back from its AOF (aof-enqueue-jobs-
    once: queued again as it starts) while a consumer has waited on node 0 for 40 s. Node 0
    asks a node that comes up at once, not at its next discovery broadcast (up to 30 s)."""
    from disque_py.persistence.journal import snapshot
    from disque_py.persistence.loader import Loader

    c = SimCluster(3, 43, delay=(1, 1))
    job = addjob(c, 1, "REPLICATE", 1, "RETRY", 60)
    old = c.node(1)
    aof = b"".join(snapshot(list(old.store.values()), old.ctx.wall_offset))
    c.crash(1)
    remote = blocked_consumer(c, 0)
    c.run_for(LONG_WAIT_MS)
    sent = c.stats["sent:NEEDJOBS"]
    t0 = c.now
    c.restart(1)
    loader = Loader(c.node(1))
    loader.feed(aof)
    assert loader.finish(True)[1]["queued"] == 1
    assert c.queued_on(job) == [1]
    assert remote.wait_reply(60_000)[0][1] == job
    assert c.now - t0 <= 3, "took %d virtual ms" % (c.now - t0)
    # asked once at once, then ad hoc while nothing comes (it came: no more)
    assert c.stats["sent:NEEDJOBS"] - sent <= 2


@pytest.mark.parametrize("when", ["pushed-as-it-fails", "added-while-down"])
def test_a_job_for_a_waiting_consumer_goes_once_its_link_is_back(when):
    """A consumer has waited on node 0 for 40 s (its discovery broadcast backed off to 30 s), so
    node 1 holds its push lease. Node 1's own link to node 0 goes down (node 0's link to node 1
    stays, so node 0 sees no node come up afterwards), and a RETRY 0 job is added on node 1:
    pushed into the failing link before node 1's view shows it (the move comes back,
    ``on_moves_unsent``), or added once the view shows it. Either way the lease is owed, and
    the job leaves node 1 as soon as its view shows the link up again: one hop later, not at
    node 0's next broadcast. Delivered once."""
    c = SimCluster(2, 45, delay=(1, 1), detect_delay_ms=50)
    remote = blocked_consumer(c, 0)
    c.run_for(LONG_WAIT_MS)
    c.link_down(1, 0)
    if when == "added-while-down":
        c.run_for(100)  # node 1's view shows the link down
    job = addjob(c, 1, "REPLICATE", 1, "RETRY", 0)
    c.run_for(2000)
    assert remote.pending is not None and c.queued_on(job) == [1]
    assert c.stats["moves_returned"] == (1 if when == "pushed-as-it-fails" else 0)
    c.link_up(1, 0)
    c.run_for(50)  # the view's change reaches node 1 (detect_delay_ms)
    t0 = c.now
    assert remote.wait_reply(60_000)[0][1] == job
    assert c.now - t0 <= 2, "took %d virtual ms" % (c.now - t0)
    assert c.ledger.delivered[job] == 1 and c.queued_on(job) == []
    c.run_for(5000)
    assert c.ledger.delivered[job] == 1 and not c.node(1).leases.owed


def test_nodes_coming_and_going_cost_a_bounded_number_of_needjobs():
    """A consumer waits on node 0 for ten minutes while node 2 goes down and comes back every
    20 s and nothing is ever produced: node 0 asks a node that comes back a few times (ad hoc,
    25 ms doubling, for as long as a source is valid), never more."""
    c = SimCluster(3, 44, delay=(1, 1))
    blocked_consumer(c, 0)
    c.run_for(LONG_WAIT_MS)
    sent = c.stats["sent:NEEDJOBS"]
    for _ in range(30):
        c.crash(2)
        c.run_for(10_000)
        c.restart(2)
        c.run_for(10_000)
    per_restart = (c.stats["sent:NEEDJOBS"] - sent) / 30
    # discovery alone: one broadcast to the live nodes every 30 s (about 1 a restart)
    assert per_restart <= 12, per_restart
