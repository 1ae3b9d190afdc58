"""Push leases: which peers want jobs of a queue, and the jobs that leave this node.

Theory of operation
-------------------
A NEEDJOBS(queue, count) from a peer grants it a lease (``federation.py`` grants it, and
tells why leases exist and how long they last): for ``LEASE_MS`` the peer is known to want
up to ``count`` jobs of that queue (its credit). ``push_if_wanted`` is asked by the requeue
machine (``Requeue.enqueue_job``) whenever a job is about to enter a queue that some peer
holds a lease on: the job goes to that peer instead, if no local client waits on the queue
or took from it in the last ``LOCAL_FIRST_MS`` (local consumers come first), the peer is
reachable, and credit remains (a RETRY 0 job never goes into a link that holds unsent
output: its only copy would be lost with the link).

A lease that could not be served when a job came (the peer out of reach: its link down; or, for a
RETRY 0 job, its link backlogged) is *owed* (``owe``, ``owed``): the peer and the queue are
noted, and ``Federation.serve_owed`` sends the jobs queued here once the link is up again
(``federation.py``, "Owed leases"), not at the peer's next NEEDJOBS, which may be 30 s away.

Every job leaving this node, pushed here or pulled by a NEEDJOBS (``Federation.on_needjobs``),
goes through ``export``: it waits in ``outgoing`` until the end of the input, when ``Node``
calls ``flush``, and all the jobs for one peer leave in one YOURJOBS (split only when their
bodies would not fit one bus message together). An at-least-once job keeps its copy here
and the peer joins its holders; a RETRY 0 job's only copy leaves (it is unregistered here).

The lowest machine but ``Lifecycle``: it calls none, and is called by ``Requeue`` (the push)
and ``Federation`` (the grant, the pulled jobs); ``Node`` flushes it after every input and
forgets expired leases every second (``gc_leases``).
"""

from __future__ import annotations

from itertools import islice
from typing import Final, final

from .commands import MAX_JOB_BYTES
from .context import Context
from .job import ACTIVE, F_DELIVERED, Job
from .messages import your_jobs
from .queues import PAUSED_OUT, Queue
from .wire import WireJob, job_to_wire

__all__ = ["Leases", "LOCAL_FIRST_MS", "OWED_SOON_MS"]

LEASE_GC_BATCH: Final = 10_000  # queue names whose leases are checked per queue-GC pass (every second)
LOCAL_FIRST_MS: Final = 1000  # a queue a local client took from this recently keeps its next job here
OWED_SOON_MS: Final = 5  # a lease newly owed is looked at this soon (Federation.serve_owed)


def _by_size(jobs: list[WireJob]) -> list[list[WireJob]]:
    """Wire jobs in order, grouped so that each group's bodies and queue names fit MAX_JOB_BYTES."""
    parts: list[list[WireJob]] = [[]]
    size = 0
    for w in jobs:
        n = len(w[1]) + len(w[2])
        if parts[-1] and size + n > MAX_JOB_BYTES:
            parts.append([])
            size = 0
        parts[-1].append(w)
        size += n
    return parts


@final
class Leases:
    def __init__(self, ctx: Context) -> None:
        self.ctx = ctx
        self._store = ctx.store
        self._stats = ctx.stats
        #: queue name -> {peer id: [lease end (ms), credit]}
        self.by_queue: dict[bytes, dict[str, list[int]]] = {}
        #: peer id -> the jobs (wire form) to send in one YOURJOBS at the end of this input
        #: (never rebound: Node tests it after every input)
        self.outgoing: dict[str, list[WireJob]] = {}
        self.importing = False  # jobs being imported are never pushed on at once (Federation)
        #: peer id -> names of queues it holds a lease on whose jobs wait here for its link
        #: (``owe``; served and forgotten by ``Federation.serve_owed``)
        self.owed: dict[str, set[bytes]] = {}
        #: when ``Federation.serve_owed`` looks at ``owed`` next (ms; it also runs when the view of
        #: the cluster changes): a new debt soon, one still held back later (``federation.py``)
        self.owed_at = 0
        for key in ("yourjobs_sent", "jobs_exported", "jobs_pushed"):
            ctx.stats[key] = 0

    def push_if_wanted(self, q: Queue, job: Job, requeued: bool) -> bool:
        """A job is being queued: push it to a node with a valid lease instead. True if pushed
        (counted in and out of ``q``, which it never entered, and active here: the peer's to
        queue); False: the caller queues it. ``requeued``: given back (NACK, the end of a RETRY,
        ENQUEUE), not new: no local consumer is between two GETJOBs for it, so the
        ``LOCAL_FIRST_MS`` hold does not apply (it kept a NACKed job from a consumer waiting
        elsewhere until that node's next discovery NEEDJOBS, up to 30 s later)."""
        leases = self.by_queue.get(q.name)
        if not leases or q.blocked or q.flags & PAUSED_OUT or self.importing:
            return False
        ctx = self.ctx
        now = ctx.now
        if q.ltime and now - q.ltime < LOCAL_FIRST_MS and not q.jobs and not requeued:
            return False  # a local consumer is between two GETJOBs: it takes this one next
        reachable = ctx.reachable
        backlogged = ctx.backlogged
        for peer, lease in list(leases.items()):
            if lease[0] < now or lease[1] <= 0:
                del leases[peer]
                continue
            if peer not in reachable or (job.retry == 0 and peer in backlogged):
                # RETRY 0: its only copy must not wait in a link that may be torn down. The
                # lease is owed: the job goes once the link is up (or drained) again.
                self.owe(peer, q.name)
                continue
            q.jobs_in += 1
            q.jobs_out += 1
            if job.state != ACTIVE:  # never queued here: a new job (wait-repl), pushed at once
                job.set_state(ACTIVE)
            job.flags |= F_DELIVERED
            lease[1] -= 1
            if lease[1] <= 0:
                del leases[peer]
            self._stats["jobs_pushed"] += 1
            self.export(peer, job)
            return True
        if not leases:
            del self.by_queue[q.name]
        return False

    def owe(self, peer: str, name: bytes) -> None:
        """``peer``'s lease on queue ``name`` could not be served now (no link, or a backlogged
        one): remember it for ``Federation.serve_owed``, which looks at a new debt within
        ``OWED_SOON_MS`` (one owed already keeps its time: under load, one look per back-off,
        not one per job)."""
        names = self.owed.get(peer)
        if names is None:
            names = self.owed[peer] = set()
        elif name in names:
            return
        names.add(name)
        soon = self.ctx.now + OWED_SOON_MS
        if not self.owed_at or soon < self.owed_at:
            self.owed_at = soon

    def export(self, peer: str, job: Job) -> None:
        """``job`` leaves for ``peer`` in this input's YOURJOBS."""
        self.outgoing.setdefault(peer, []).append(job_to_wire(job, self.ctx.now))
        self._stats["jobs_exported"] += 1
        if job.retry == 0:
            self._store.unregister(job)  # the only copy moves: never two of it
        elif peer not in job.delivered:
            # The peer holds a copy now: acks and requeues here must reach it. (Disque's sender
            # does not note it: an ACKJOB on the sender, or on a holder that only the sender
            # told, never reached the peer, which queued the job again after RETRY.)
            job.delivered = tuple(job.delivered) + (peer,)

    def flush(self) -> None:
        """Send the jobs exported during this input: one YOURJOBS per peer (``Node``, after
        every input)."""
        outgoing = self.outgoing
        ctx = self.ctx
        for peer, jobs in outgoing.items():  # sending exports nothing: the dict stays as it is
            # one message for all, unless their bodies would not fit one bus message together
            # (one job always does: it came in one, or through ADDJOB's MAX_JOB_BYTES)
            parts = _by_size(jobs) if len(jobs) > 1 else [jobs]
            for part in parts:
                ctx.send((peer,), your_jobs(part))
                self._stats["yourjobs_sent"] += 1
        outgoing.clear()

    def gc_leases(self) -> None:
        """Forget expired leases: the oldest ``LEASE_GC_BATCH`` queue names per call (``Node``,
        every second).

        A lease is otherwise dropped only when a job is queued under it, so
        NEEDJOBS for queues that never get a job here (consumers waiting on a
        queue that lives elsewhere, or on many short-lived names) would pile
        up for ever. Names with a lease left move to the back, so the next
        call goes on where this one stopped.
        """
        leases = self.by_queue
        now = self.ctx.now
        for name, peers in list(islice(leases.items(), LEASE_GC_BATCH)):
            for peer in [p for p, lease in peers.items() if lease[0] < now]:
                del peers[peer]
            del leases[name]
            if peers:
                leases[name] = peers
