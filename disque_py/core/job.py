"""The Job record and its states.

A job moves through four states on a node::

    wait-repl --(replicated enough / ASYNC)--> active <--(fetched)-- queued
                                                 |  --(enqueue)-->   |
                                                 +------ ACKJOB -----+--> acked

``wait-repl`` exists only on the node that created the job while its
synchronous replication is in progress. ``acked`` jobs are kept until the
acknowledgement has been garbage-collected cluster-wide.

Times inside a Job are milliseconds on the node's monotonic clock (the one
the shell feeds into the core), except ``ctime``, which is wall-clock
milliseconds * 1_000_000 plus a per-node tie breaker, as in Disque, and is
used to order queues and to report creation time.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

__all__ = [
    "Job",
    "WAIT_REPL",
    "ACTIVE",
    "QUEUED",
    "ACKED",
    "STATE_NAMES",
    "state_from_name",
    "F_BCAST_QUEUED",
    "F_BCAST_WILLQUEUE",
    "F_DELIVERED",
]

WAIT_REPL = 0
ACTIVE = 1
QUEUED = 2
ACKED = 3
STATE_NAMES = ("wait-repl", "active", "queued", "acked")
_STATE_BY_NAME = {name.encode(): i for i, name in enumerate(STATE_NAMES)}

# Flags (bit set).
F_BCAST_QUEUED = 1  # the next (re)queue is announced with QUEUED
F_BCAST_WILLQUEUE = 2  # announce WILLQUEUE shortly before requeueing
F_DELIVERED = 4  # this node handed the job to a client at least once


def state_from_name(name: bytes) -> int | None:
    return _STATE_BY_NAME.get(name.lower())


class Job:
    """One job as this node knows it. Slots keep it small (memory/job matters)."""

    __slots__ = (
        "id",  # bytes, 40 chars
        "queue",  # bytes, or None for a dummy ack
        "state",
        "flags",
        "repl",  # replication factor asked for
        "ctime",  # wall ms * 1e6 (+ tie breaker)
        "etime",  # expire time, monotonic ms
        "delay",  # seconds
        "retry",  # seconds; 0 = at most once
        "nacks",
        "deliveries",  # additional deliveries
        "body",  # bytes, or None for a dummy ack
        "delivered",  # tuple/set of node IDs that may have a copy
        "confirmed",  # set of node IDs, or None (replication / GC tracking)
        # next (re)queue time, monotonic ms, of a job not acked; 0 = never queued again
        # (AT_MOST_ONCE). Shares its slot with ``gc_at`` (see below).
        "requeue_at",
        "awake",  # when the scheduler must look at the job; 0 = not scheduled
        "gc_retry",  # GC attempts, drives exponential backoff
        "seq",  # registration order, used by JSCAN cursors
    )

    def __init__(
        self,
        job_id: bytes,
        state: int,
        queue: bytes | None = None,
        body: bytes | None = None,
        repl: int = 1,
        ctime: int = 0,
        etime: int = 0,
        delay: int = 0,
        retry: int = 0,
        requeue_at: int = 0,
        delivered: tuple = (),
    ) -> None:
        # One constructor call sets everything ADDJOB knows (hot path).
        self.id = job_id
        self.state = state
        self.queue = queue
        self.body = body
        self.repl = repl
        self.ctime = ctime
        self.etime = etime
        self.delay = delay
        self.retry = retry
        self.requeue_at = requeue_at
        self.delivered = delivered
        self.flags = 0
        self.nacks = 0
        self.deliveries = 0
        self.confirmed = None
        self.awake = 0
        self.gc_retry = 0
        self.seq = 0

    @property
    def state_name(self) -> str:
        return STATE_NAMES[self.state]

    @property
    def is_dummy_ack(self) -> bool:
        """An acked placeholder for an ID this node never had a copy of."""
        return not self.delivered

    def __repr__(self) -> str:
        return f"<Job {self.id.decode()} {self.state_name} q={self.queue!r}>"

    if TYPE_CHECKING:
        gc_at: int


# ``gc_at``: the next garbage-collection attempt (monotonic ms) of an *acked* job. An acked job
# is never requeued (ACK_ONCE: it never leaves ``acked``), so the two times never coexist and
# share one slot: ``gc_at`` is a second name for the ``requeue_at`` slot (the same descriptor,
# as fast as any slot), read and written only once the job is acked (``Acks.acknowledge`` sets
# it first). A job costs no more memory than with one attribute.
Job.gc_at = Job.__dict__["requeue_at"]  # type: ignore[misc]
