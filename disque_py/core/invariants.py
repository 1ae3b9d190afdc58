"""The invariants a node relies on, named, as one check.

``check(node)`` raises ``InvariantViolation`` (an ``AssertionError``) whose
message starts with the violated invariant's name. It holds between inputs:
the core tests run it after every command, message and tick they feed a
node (``tests/core/conftest.py``), and both simulations after every event
(``tests/sim/cluster_model.py``, ``tests/sim/netsim.py``). It reads the
machines' state and changes nothing, but costs a walk over every job, so the
shell does not run it. Importing this module turns on the check of every
state change (``job.watch_transitions``), which TRANSITIONS reports; the
shell never imports it, so a node's ``Job.set_state`` checks nothing.

TRANSITIONS
    Every change of a job's state since the last check was one that
    ``job.TRANSITIONS`` lists (``Job.set_state`` raised at the site of any
    other and recorded it; this reports it even where the error was caught,
    as the shell's bus feed catches a handler's).

AT_MOST_ONCE
    A RETRY 0 job is queued at most once, ever, on a node: one that is
    queued has ``next_at`` 0 (it can never be queued again) and was never
    delivered here (F_DELIVERED); one delivered here is never queued again.
ACK_ONCE
    A job goes to ``acked`` at most once and never leaves it: a job object
    seen acked by an earlier check and still registered is still acked (the
    check remembers them per node), and an acked job is in no queue.
ACK_GC_PENDING
    Every acked job still here has a next GC attempt (``next_at`` > 0): an
    ack is never stranded without a collector.
ONE_TIMER
    Every registered job has exactly one pending wake-up (``awake`` > 0), at
    the time its state calls for: the earliest of expiry, next requeue
    (minus the WILLQUEUE advance) or next GC attempt.
QUEUED_ONCE
    A job is in a queue iff it is in state ``queued``: it is in its own
    queue, exactly once, and queues hold nothing else.
WAITERS
    Every blocked client is in the waiter list of each of its queues (once,
    behind the head); a queue's ``blocked`` counts exactly its active
    waiters; ``waited`` names exactly the queues with waiters.
SERVED
    Between inputs nothing is left half done: no queue marked ready, no
    YOURJOBS unflushed, and no queue has both jobs and waiters unless it is
    paused in output.
REPL_CLIENTS
    The ADDJOB clients waiting for copies and their jobs map one to one,
    and are exactly the registered jobs in ``wait-repl``.
LEASES
    Every push lease has credit left and an end time.
TOMBSTONES
    At most ``TOMBSTONES_MAX`` IDs are remembered, each with its entry in
    the expiry order.
RETURNS
    A job's returns (``Extra.returns``, what MAXDELIVER subtracts) are the sum
    of its per-node counts (``Extra.returned``), of ``RETURNED_NODES_MAX``
    nodes at most, and its trace is at most ``TRACE_MAX`` bytes.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any
from weakref import WeakKeyDictionary

from . import lifecycle as lifecycle_mod
from .job import (
    ACKED, F_BCAST_WILLQUEUE, F_DELIVERED, QUEUED, RETURNED_NODES_MAX, TRACE_MAX, WAIT_REPL, Job, illegal_transitions,
    watch_transitions,
)  # fmt: skip
from .lifecycle import WILLQUEUE_ADVANCE_MS
from .queues import PAUSED_OUT

if TYPE_CHECKING:
    from .node import Node

__all__ = ["check", "InvariantViolation", "INVARIANTS"]

INVARIANTS = (
    "TRANSITIONS", "AT_MOST_ONCE", "ACK_ONCE", "ACK_GC_PENDING", "ONE_TIMER", "QUEUED_ONCE", "WAITERS", "SERVED",
    "REPL_CLIENTS", "LEASES", "TOMBSTONES", "RETURNS",
)  # fmt: skip


class InvariantViolation(AssertionError):
    pass


def _fail(name: str, detail: str) -> None:
    raise InvariantViolation("%s: %s" % (name, detail))


# job objects seen acked, per node (ACK_ONCE looks at them again), keyed by the node's own
# random.Random (``ctx.rng``, made with the node and never rebound): a compiled Node takes
# no weak reference, its Random does.
_acked_seen: "WeakKeyDictionary[Any, set[Job]]" = WeakKeyDictionary()


watch_transitions()


def _expected_awake(job: Job) -> int:
    at = job.etime
    state = job.state
    if state == ACKED:
        if job.gc_at and job.gc_at < at:
            at = job.gc_at
    elif state != WAIT_REPL and job.requeue_at:
        t = job.requeue_at - (WILLQUEUE_ADVANCE_MS if job.flags & F_BCAST_WILLQUEUE else 0)
        if t < at:
            at = t
    return at if at > 0 else 1


def check(node: "Node") -> None:
    """Raise InvariantViolation naming the first invariant ``node`` breaks."""
    if illegal_transitions:
        what = "; ".join(illegal_transitions)
        illegal_transitions.clear()  # reported once
        _fail("TRANSITIONS", what)
    store = node.store
    queues = node.queues
    jobs = store.values()
    queued = 0
    wait_repl: set[bytes] = set()
    acked_now: list[Job] = []
    for job in jobs:
        state = job.state
        if job.retry == 0 and state == QUEUED:
            if job.next_at != 0:
                _fail("AT_MOST_ONCE", "RETRY 0 job %r queued with next_at %d" % (job.id, job.next_at))
            if job.flags & F_DELIVERED:
                _fail("AT_MOST_ONCE", "RETRY 0 job %r queued again after its delivery" % job.id)
        if not job.awake:
            _fail("ONE_TIMER", "job %r (%s) has no wake-up" % (job.id, job.state_name))
        expected = _expected_awake(job)
        if job.awake != expected:
            _fail("ONE_TIMER", "job %r (%s) wakes at %d, its state calls for %d"
                  % (job.id, job.state_name, job.awake, expected))  # fmt: skip
        if state == QUEUED:
            queued += 1
            q = None if job.queue is None else queues.get(job.queue)
            if q is None or job not in q.jobs:
                _fail("QUEUED_ONCE", "queued job %r is not in its queue %r" % (job.id, job.queue))
        elif state == ACKED:
            acked_now.append(job)
            if not job.gc_at:
                _fail("ACK_GC_PENDING", "acked job %r has no GC attempt scheduled" % job.id)
        elif state == WAIT_REPL:
            wait_repl.add(job.id)
        extra = job.extra
        if extra is not None:
            returned = extra.returned
            total = sum(returned.values()) if returned else 0
            if extra.returns != total or (returned is not None and len(returned) > RETURNED_NODES_MAX):
                _fail("RETURNS", "job %r counts %d returns, of %r" % (job.id, extra.returns, returned))
            if extra.trace is not None and len(extra.trace) > TRACE_MAX:
                _fail("RETURNS", "job %r keeps a trace of %d bytes" % (job.id, len(extra.trace)))
    in_queues = 0
    for q in queues.values():
        in_queues += len(q.jobs)
        for job in q.jobs:
            if job.state != QUEUED or store.get(job.id) is not job or job.queue != q.name:
                invariant = "ACK_ONCE" if job.state == ACKED else "QUEUED_ONCE"
                _fail(invariant, "queue %r holds job %r in state %s" % (q.name, job.id, job.state_name))
    if in_queues != queued:
        _fail("QUEUED_ONCE", "%d jobs in queues, %d queued jobs" % (in_queues, queued))

    # ACK_ONCE: what was acked stays acked while it is here.
    seen = _acked_seen.setdefault(node.ctx.rng, set())
    for job in list(seen):
        if store.get(job.id) is not job:
            seen.discard(job)
        elif job.state != ACKED:
            _fail("ACK_ONCE", "job %r left acked for %s" % (job.id, job.state_name))
    seen.update(acked_now)

    _check_waiters(node)
    _check_served(node)

    repl = node.replication
    if len(repl.clients) != len(repl.client_jobs):
        _fail("REPL_CLIENTS", "%d jobs with a client, %d clients" % (len(repl.clients), len(repl.client_jobs)))
    for job_id, client in repl.clients.items():
        if repl.client_jobs.get(client) != job_id:
            _fail("REPL_CLIENTS", "client %r of job %r waits for another job" % (client, job_id))
    if set(repl.clients) != wait_repl:
        _fail("REPL_CLIENTS", "jobs with a waiting client %s, jobs in wait-repl %s"
              % (sorted(repl.clients), sorted(wait_repl)))  # fmt: skip

    for name, peers in node.leases.by_queue.items():
        for peer, lease in peers.items():
            if lease[1] <= 0 or lease[0] <= 0:
                _fail("LEASES", "lease of %r to %s is [end %d, credit %d]" % (name, peer[:8], lease[0], lease[1]))

    life = node.lifecycle
    most = lifecycle_mod.TOMBSTONES_MAX  # read now: a test may lower it
    if len(life.tombstones) > most or len(life.tombstones) > len(life._tomb_order):
        _fail("TOMBSTONES", "%d IDs remembered, %d in the expiry order (max %d)"
              % (len(life.tombstones), len(life._tomb_order), most))  # fmt: skip


def _check_waiters(node: "Node") -> None:
    blocking = node.blocking
    queues = node.queues
    counts: dict[bytes, int] = {}
    for client, waiter in blocking.blocked.items():
        if not waiter.active or waiter.client != client:
            _fail("WAITERS", "client %r is blocked on an inactive or foreign waiter" % client)
        for name in waiter.queues:
            q = queues.get(name)
            if q is None:
                _fail("WAITERS", "client %r waits on queue %r, which does not exist" % (client, name))
            live = q.waiters[q.whead :]  # type: ignore[union-attr]
            if sum(1 for w in live if w is waiter) != 1:
                _fail("WAITERS", "client %r is not in the waiters of queue %r exactly once" % (client, name))
            counts[name] = counts.get(name, 0) + 1
    for name, q in queues.items():
        if q.blocked != counts.get(name, 0):
            _fail("WAITERS", "queue %r counts %d blocked, %d wait on it" % (name, q.blocked, counts.get(name, 0)))
    if set(blocking.waited) != set(counts):
        _fail("WAITERS", "queues marked waited %s, queues waited on %s" % (sorted(blocking.waited), sorted(counts)))
    for name, q in blocking.waited.items():
        if queues.get(name) is not q:
            _fail("WAITERS", "queue %r waited on is not the registered one" % name)


def _check_served(node: "Node") -> None:
    if node.ctx.ready:
        _fail("SERVED", "queues left ready: %s" % sorted(node.ctx.ready))
    if node.leases.outgoing:
        _fail("SERVED", "YOURJOBS left unflushed to %s" % sorted(node.leases.outgoing))
    for name, q in node.blocking.waited.items():
        if q.jobs and not q.flags & PAUSED_OUT:
            _fail("SERVED", "queue %r has %d jobs and %d waiters" % (name, len(q.jobs), q.blocked))
