"""Each named invariant of ``core/invariants.py`` fails when a node is corrupted to break it.

The check runs after every input of every core test (``conftest.py``) and of both
simulations; these tests show it is not vacuous: one deliberate corruption per invariant, and
the check names the invariant broken.
"""

from __future__ import annotations

import pytest

from disque_py.core import invariants
from disque_py.core.effects import BLOCKED
from disque_py.core.job import ACKED, ACTIVE, F_DELIVERED, QUEUED, IllegalTransition

from .conftest import Harness

pytestmark = pytest.mark.invariants_by_hand

PEER = "f" * 40


def broken(node) -> str:
    with pytest.raises(invariants.InvariantViolation, match="^[A-Z_]+: ") as info:
        invariants.check(node)
    return str(info.value).split(":")[0]


def clustered() -> Harness:
    h = Harness()
    node = h.node
    node.ctx.cluster_size = 2
    node.ctx.known_nodes = [node.id, PEER]
    node.ctx.reachable = [PEER]
    return h


def test_every_invariant_is_named_and_a_healthy_node_passes(h):
    assert len(set(invariants.INVARIANTS)) == len(invariants.INVARIANTS) == 12
    h.add("q", "a")
    h.add("q", "b", "RETRY", 0)
    assert h.cmd("GETJOB", "FROM", "empty", client=2) is BLOCKED
    invariants.check(h.node)


def test_at_most_once_a_delivered_retry0_job_queued_again(h):
    job = h.node.store.get(h.add("q", "once", "RETRY", 0))
    assert job.state == QUEUED and job.next_at == 0
    invariants.check(h.node)
    job.flags |= F_DELIVERED  # as if delivered once, yet in the queue
    assert broken(h.node) == "AT_MOST_ONCE"


def test_at_most_once_a_queued_retry0_job_that_could_be_queued_again(h):
    job = h.node.store.get(h.add("q", "once", "RETRY", 0))
    job.next_at = h.now + 1000
    h.node.lifecycle.reschedule(job)  # its timer agrees: only AT_MOST_ONCE is broken
    assert broken(h.node) == "AT_MOST_ONCE"


def acked_here() -> tuple[Harness, object]:
    """A job held here and on PEER, acked here: kept (acked) until PEER confirms."""
    h = clustered()
    job_id = h.add("q", "body", "REPLICATE", 1)
    job = h.node.store.get(job_id)
    job.delivered = (h.node.id, PEER)
    assert h.cmd("ACKJOB", job_id) == 1
    assert job.state == ACKED and h.node.store.get(job_id) is job
    invariants.check(h.node)
    return h, job


def test_ack_once_an_acked_job_leaving_acked():
    h, job = acked_here()
    job.state = ACTIVE  # written past Job.set_state, which would refuse it (TRANSITIONS)
    job.next_at = 0
    h.node.lifecycle.reschedule(job)
    assert broken(h.node) == "ACK_ONCE"


def test_ack_once_an_acked_job_in_a_queue():
    h, job = acked_here()
    h.node.queues[b"q"].add(job)
    assert broken(h.node) == "ACK_ONCE"


def test_ack_gc_pending_an_ack_without_a_collector():
    h, job = acked_here()
    job.next_at = 0  # an acked job's next GC attempt
    h.node.lifecycle.reschedule(job)
    assert broken(h.node) == "ACK_GC_PENDING"


def test_transitions_an_acked_job_set_queued_again():
    h, job = acked_here()
    with pytest.raises(IllegalTransition, match="acked -> queued"):
        job.set_state(QUEUED)  # refused at its site ...
    assert job.state == ACKED
    assert broken(h.node) == "TRANSITIONS"  # ... and reported after the input
    invariants.check(h.node)  # once


def test_transitions_a_queued_job_set_queued_again(h):
    job = h.node.store.get(h.add("q", "body"))
    with pytest.raises(IllegalTransition, match="queued -> queued"):
        job.set_state(QUEUED)
    assert broken(h.node) == "TRANSITIONS"


def test_one_timer_a_job_without_a_wakeup(h):
    job = h.node.store.get(h.add("q", "body"))
    job.awake = 0
    assert broken(h.node) == "ONE_TIMER"


def test_one_timer_a_requeue_time_changed_without_rescheduling(h):
    job = h.node.store.get(h.add("q", "body"))
    job.next_at -= 10_000
    assert broken(h.node) == "ONE_TIMER"


def test_queued_once_a_queued_job_missing_from_its_queue(h):
    job = h.node.store.get(h.add("q", "body"))
    h.node.queues[b"q"].remove(job)
    assert broken(h.node) == "QUEUED_ONCE"


def test_queued_once_a_job_twice_in_its_queue(h):
    job = h.node.store.get(h.add("q", "body"))
    h.node.queues[b"q"].add(job)
    assert broken(h.node) == "QUEUED_ONCE"


def test_queued_once_an_active_job_left_in_a_queue(h):
    job = h.node.store.get(h.add("q", "body"))
    job.state = ACTIVE
    assert broken(h.node) == "QUEUED_ONCE"


def test_waiters_a_blocked_client_missing_from_a_queue(h):
    assert h.cmd("GETJOB", "FROM", "a", "b", client=5) is BLOCKED
    invariants.check(h.node)
    q = h.node.queues[b"b"]
    q.waiters = []
    assert broken(h.node) == "WAITERS"


def test_waiters_a_wrong_blocked_count(h):
    assert h.cmd("GETJOB", "FROM", "a", client=5) is BLOCKED
    h.node.queues[b"a"].blocked += 1
    assert broken(h.node) == "WAITERS"


def test_served_a_job_left_beside_a_waiter(h):
    assert h.cmd("GETJOB", "FROM", "a", client=5) is BLOCKED
    other = h.node.store.get(h.add("b", "body"))
    h.node.queues[b"b"].remove(other)
    other.queue = b"a"
    h.node.queues[b"a"].add(other)  # queued, but the waiter was never served
    assert broken(h.node) == "SERVED"


def test_served_a_queue_left_ready(h):
    h.add("q", "body")
    h.node.ctx.ready[b"q"] = h.node.queues[b"q"]
    assert broken(h.node) == "SERVED"


def test_repl_clients_a_waiting_client_forgotten():
    h = clustered()
    assert h.cmd("ADDJOB", "q", "body", 0, "REPLICATE", 2, client=9) is BLOCKED
    invariants.check(h.node)
    h.node.replication.client_jobs.clear()
    assert broken(h.node) == "REPL_CLIENTS"


def test_repl_clients_a_wait_repl_job_without_its_client():
    h = clustered()
    assert h.cmd("ADDJOB", "q", "body", 0, "REPLICATE", 2, client=9) is BLOCKED
    h.node.replication.clients.clear()
    h.node.replication.client_jobs.clear()
    assert broken(h.node) == "REPL_CLIENTS"


def test_leases_a_lease_without_credit():
    h = clustered()
    h.node.receive_data(PEER, "NEEDJOBS", [b"q", 10], h.now)
    invariants.check(h.node)
    h.node.leases.by_queue[b"q"][PEER][1] = 0
    assert broken(h.node) == "LEASES"


def test_tombstones_an_id_without_its_expiry(h):
    job_id = h.add("q", "body")
    assert h.cmd("FASTACK", job_id) == 1
    invariants.check(h.node)
    h.node.lifecycle._tomb_order.clear()
    assert broken(h.node) == "TOMBSTONES"


def test_returns_a_sum_out_of_step_or_a_trace_too_long(h):
    job_id = h.add("q", "body", "RETRY", 5, "MAXDELIVER", 2)
    assert h.cmd("GETJOB", "NOHANG", "FROM", "q")
    assert h.cmd("RELEASE", job_id) == 1
    invariants.check(h.node)
    extra = h.node.store.get(job_id).extra
    extra.returns += 1
    assert broken(h.node) == "RETURNS"
    extra.returns -= 1
    extra.trace = b"x" * 16385
    assert broken(h.node) == "RETURNS"
