"""Queueing and requeue: putting jobs in queues, RETRY timers, WILLQUEUE/QUEUED/WORKING.

Theory of operation
-------------------
``enqueue_job`` is the one way a job enters a queue (from ADDJOB, a requeue,
ENQUEUE/NACK, a handed-over or imported job). It refuses a job queued already
and one never to be queued again (AT_MOST_ONCE: ``next_at`` 0, or a RETRY 0
job delivered once; a copy queued here for the first time, ``fresh``, is not
refused for its ``next_at``), starts the next RETRY period (``next_at``, from
``retry_deadline`` in ``job.py``), announces
the requeue with QUEUED when it is one, and either pushes the job to a node
holding a lease on its queue (``Leases.push_if_wanted``, ``leases.py``) or adds
it to the queue and marks the queue ``ready`` for blocked consumers. ``fetch`` takes a
queue's first job for delivery (GETJOB, ``blocking.py``) or for a move (a NEEDJOBS,
``federation.py``).

Every holder of a job runs the same timers (``requeue_due``, called by the
job's wake-up, which ``Node`` routes here for an active or queued job):

* 500 ms before requeueing (``WILLQUEUE_ADVANCE_MS``), a holder with other
  holders sends WILLQUEUE; a node that has the job queued answers with
  QUEUED, one that has it acked answers SETACK.
* At ``next_at`` an active job is queued again (a RETRY later if its queue
  is paused in input); a job still queued then just starts a new period. For a job with
  a delivery policy (an Extra) the end of a RETRY is a failed delivery, which
  ``delivery.py`` judges first: ``requeue_due`` says so (True) and ``Node`` hands the job
  to ``Delivery.retry_ended`` (a dead letter, or queued again here).
* On requeue a holder broadcasts QUEUED (carrying "count a nack" / "count a
  delivery"); receivers push their own requeue time one RETRY further, and
  a receiver that also has it queued drops it from its queue if the sender
  wins the per-job node-ID comparison, so two holders rarely queue the same
  job. WORKING does the same without the comparison (always dequeue).
* ENQUEUE (from a node that replicated a job externally, or a FASTACK-less
  hand-over) queues the job here now, or after its delay.

Commands: ENQUEUE, DEQUEUE, WORKING (NACK is ``delivery.py``'s, and comes
here through ``enqueue_job(job, nack=True)``). Messages: QUEUED, WORKING,
WILLQUEUE, ENQUEUE. Receives ``Lifecycle`` (the schedule) and ``Leases`` (the push);
called by ``Node`` (commands, messages, the wake-ups) and by the machines above it
(``enqueue_job``, ``dequeue_job``, ``fetch``).
"""

from __future__ import annotations

from typing import Final, final

from .commands import check_job_ids
from .commandspec import JOB_IDS, CommandSpec
from .context import Context
from .job import ACKED, ACTIVE, F_BCAST_QUEUED, F_BCAST_WILLQUEUE, F_DELIVERED, F_NACK_DELAYED, F_YIELD, QUEUED, WAIT_REPL, Job, retry_deadline
from .leases import Leases
from .lifecycle import WILLQUEUE_ADVANCE_MS, Lifecycle
from .messages import Enqueue, Queued, WillQueue, Working, queued, set_ack, will_queue, working
from .queues import PAUSED_IN, PAUSED_OUT, Queue
from .replies import Error
from .store import J_ACTIVE

__all__ = ["Requeue", "QUEUED_INCR_NACKS", "QUEUED_INCR_DELIV", "compare_ids_by_job"]

QUEUED_INCR_NACKS: Final = 1
QUEUED_INCR_DELIV: Final = 2


def compare_ids_by_job(a: str, b: str, job_id: bytes) -> int:
    """Disque's tie-break between two nodes for one job: IDs mixed with the job's random part."""
    mix = job_id[11:35]
    xa = bytes(ord(c) ^ mix[i % 24] for i, c in enumerate(a))
    xb = bytes(ord(c) ^ mix[i % 24] for i, c in enumerate(b))
    return (xa > xb) - (xa < xb)


#: The commands this machine answers (commandspec.py; Node dispatches them). ENQUEUE
#: queues a job again, so it is refused at memory level 3 (denyoom), as Disque's. NACK, which
#: enqueue_job serves too, is delivery.py's (its DELAY, REASON and DEAD).
COMMANDS: Final = (
    CommandSpec(b"enqueue", "cmd_enqueue", -1, ("write", "denyoom", "fast"), ("admin",), JOB_IDS,
                syntax="ENQUEUE job-id [job-id ...]",
                summary="Queue jobs held here that are not queued, counting an additional delivery",
                group="jobs"),
    CommandSpec(b"dequeue", "cmd_dequeue", -1, ("write", "fast"), ("admin",), JOB_IDS,
                syntax="DEQUEUE job-id [job-id ...]", summary="Take jobs out of their queue on this node",
                group="jobs"),
    CommandSpec(b"working", "cmd_working", 2, ("write", "fast"), ("consume",), JOB_IDS,
                syntax="WORKING job-id",
                summary="Still working on a job: its next delivery is put off by its RETRY (seconds)",
                group="jobs"),
)


@final
class Requeue:
    def __init__(self, ctx: Context, lifecycle: Lifecycle, leases: Leases) -> None:
        self.ctx = ctx
        self._lifecycle = lifecycle
        self._leases = leases
        self._leased = leases.by_queue  # tested for the job's queue before the push is asked
        self._store = ctx.store
        self._queues = ctx.queues
        self._stats = ctx.stats
        self._ready = ctx.ready

    # -- into and out of queues ---------------------------------------------------------
    def enqueue_job(self, job: Job, nack: bool = False, fresh: bool = False) -> bool:
        """Put a job in its queue. False if already queued or never again (AT_MOST_ONCE).

        ``fresh``: a copy queued here for the first time (made by ADDJOB, moved in, handed
        over by ENQUEUE, restored at a restart): a ``next_at`` of 0 does not refuse it, as it
        does a RETRY 0 job queued here once already; one delivered here (F_DELIVERED) still
        is refused."""
        if job.state == QUEUED or not (job.next_at or fresh):
            return False
        retry = job.retry
        if not retry and job.flags & F_DELIVERED:
            return False
        ctx = self.ctx
        now = ctx.now
        if retry:
            if len(job.delivered) > 1:
                job.flags |= F_BCAST_WILLQUEUE
            job.next_at = retry_deadline(job, now, ctx.randbits)
        else:
            job.next_at = 0  # AT_MOST_ONCE: never again
        if job.flags & F_BCAST_QUEUED or nack:
            ctx.send(job.delivered, queued(bytes(job.id), QUEUED_INCR_NACKS if nack else QUEUED_INCR_DELIV))
            if nack:
                job.nacks += 1
            else:
                job.deliveries += 1
                self._stats["jobs_requeued"] += 1
        else:
            job.flags |= F_BCAST_QUEUED
        q = self._queues.get(job.queue) or ctx.get_queue(job.queue)  # type: ignore[arg-type]  # a queued job has a queue
        q.atime = now
        leased = self._leased
        if not q.blocked and leased and q.name in leased and self._leases.push_if_wanted(q, job, not fresh):
            # A consumer waits on another node: sent there, never queued here (active, see
            # push_if_wanted); a RETRY 0 job left this node with its only copy.
            if retry:
                self._lifecycle.reschedule(job)
            return True
        job.set_state(QUEUED)
        self._lifecycle.reschedule(job)
        q.add(job)
        if q.blocked and not q.flags & PAUSED_OUT:
            self._ready[q.name] = q
        return True

    def dequeue_job(self, job: Job) -> bool:
        if job.state != QUEUED:
            return False
        q = self._queues.get(job.queue)  # type: ignore[arg-type]  # a queued job has a queue
        if q is not None:
            q.remove(job)
        job.set_state(ACTIVE)
        return True

    def fetch(self, q: Queue) -> Job | None:
        """Take the queue's first job for delivery (GETJOB) or a move (NEEDJOBS): active, and
        marked delivered here (F_DELIVERED: a RETRY 0 job is never queued here again)."""
        job = q.pop()
        if job is not None:
            job.set_state(ACTIVE)
            job.flags |= F_DELIVERED
            ctx = self.ctx
            q.atime = ctx.now
            self._stats["jobs_delivered"] += 1
            if job.retry == 0 and ctx.journal is not None:  # the AOF must know: never again
                ctx.journal.append((J_ACTIVE, job))
        return job

    def enqueue_restored(self, jobs: list[Job]) -> int:
        """Jobs the AOF had queued, queued again at a restart in their order (aof-enqueue-jobs-
        once; ``Node.restore_finish``). Returns how many were."""
        queued = 0
        for job in jobs:
            if job.retry == 0 and job.flags & F_DELIVERED:
                continue  # AT_MOST_ONCE: delivered once (a damaged or foreign file says queued)
            job.flags &= ~F_BCAST_QUEUED  # a restore, not a requeue: nobody is told, nothing counted
            if self.enqueue_job(job, fresh=True):  # a RETRY 0 one too, this one time
                queued += 1
        return queued

    # -- timers -----------------------------------------------------------------------
    def requeue_due(self, job: Job) -> bool:
        """The wake-up of an active or queued job came (``Node._run_due``). True: the RETRY of
        an active job with a delivery policy ended, a failed delivery that
        ``Delivery.retry_ended`` decides (nothing done here yet)."""
        ctx = self.ctx
        now = ctx.now
        state = job.state
        at = job.next_at  # its next requeue (0: never again)
        if job.flags & F_BCAST_WILLQUEUE and at - WILLQUEUE_ADVANCE_MS <= now:
            if state != QUEUED:
                ctx.send(job.delivered, will_queue(bytes(job.id)))
            job.flags &= ~F_BCAST_WILLQUEUE
        if not at or at > now:
            return False
        if state == ACTIVE:
            q = self._queues.get(job.queue)  # type: ignore[arg-type]  # a queued job has a queue
            if job.retry and q is not None and q.flags & PAUSED_IN:
                job.next_at = retry_deadline(job, now, ctx.randbits)
                return False
            if job.flags & F_NACK_DELAYED:
                # The end of a NACK's delay (delivery.py): not a failure. Queued without a
                # count; the QUEUED that says so carries none either.
                job.flags &= ~(F_NACK_DELAYED | F_BCAST_QUEUED)
                if self.enqueue_job(job):
                    ctx.send(job.delivered, queued(bytes(job.id), 0))
                return False
            if job.extra is not None:
                return True  # its delivery failed: delivery.py's (a dead letter at MAXDELIVER)
            self.enqueue_job(job)  # starts a new period
        elif state == QUEUED and job.retry:
            # Still queued at requeue time: nobody fetched it; just move on.
            if len(job.delivered) > 1:
                job.flags |= F_BCAST_WILLQUEUE
            job.next_at = retry_deadline(job, now, ctx.randbits)
        return False

    def lease(self, job: Job) -> None:
        """A job of a group with a CONCURRENCY limit was just delivered (blocking.py): a whole
        RETRY from now before it is queued again, here and on its other holders (as WORKING
        does), so that the delivery counts against the limit (limits.py) for as long as its
        consumer may hold it."""
        if job.retry and job.next_at:
            self._postpone(job)
            if len(job.delivered) > 1:
                self.ctx.send(job.delivered, working(bytes(job.id)))

    def _postpone(self, job: Job) -> None:
        if job.retry and job.next_at:
            ctx = self.ctx
            job.flags |= F_BCAST_WILLQUEUE
            job.next_at = retry_deadline(job, ctx.now, ctx.randbits)
            self._lifecycle.reschedule(job)

    # -- messages -----------------------------------------------------------------------
    def on_enqueue(self, sender: str, m: Enqueue) -> None:
        job = self._store.get(m.job_id)
        if job is None or job.state >= QUEUED:
            return
        q = self._queues.get(job.queue)  # type: ignore[arg-type]  # a queued job has a queue
        if q is not None and q.flags & PAUSED_IN:
            return
        job.flags &= ~F_BCAST_QUEUED
        delay = m.delay
        if delay <= 0:
            # Handed over by the node that replicated it here (queued there never): queued here
            # for the first time, an at-most-once one too (unless delivered here already).
            self.enqueue_job(job, fresh=True)
        elif job.retry and job.next_at:
            job.next_at = self.ctx.now + delay * 1000  # queued at the end of its DELAY
            self._lifecycle.reschedule(job)

    def on_queued(self, sender: str, m: Queued) -> None:
        job = self._store.get(m.job_id)
        if job is None:
            return
        if job.state == ACKED:
            self.ctx.send_lazy((sender,), set_ack(bytes(job.id), len(job.delivered)))
            return
        if job.state == QUEUED and compare_ids_by_job(sender, self.ctx.id, job.id) > 0:
            self.dequeue_job(job)
        elif job.state == WAIT_REPL and job.extra is not None and job.extra.dedup is not None:
            if compare_ids_by_job(sender, self.ctx.id, job.id) > 0:
                job.flags |= F_YIELD  # a DEDUP job made there too and queued there (dedup.py)
        job.flags &= ~F_NACK_DELAYED  # a NACK's delay ended there: queued by the sender
        self._postpone(job)
        flags = m.flags
        if flags & QUEUED_INCR_NACKS:
            job.nacks += 1
        if flags & QUEUED_INCR_DELIV:
            job.deliveries += 1

    def on_working(self, sender: str, m: Working) -> None:
        job = self._store.get(m.job_id)
        if job is None:
            return
        if job.state == ACKED:
            self.ctx.send_lazy((sender,), set_ack(bytes(job.id), len(job.delivered)))
            return
        if job.state == QUEUED:
            self.dequeue_job(job)
        self._postpone(job)

    def on_willqueue(self, sender: str, m: WillQueue) -> None:
        job = self._store.get(m.job_id)
        if job is None:
            return
        if job.state in (ACTIVE, QUEUED) and sender not in job.delivered:
            job.delivered = tuple(job.delivered) + (sender,)
        if job.state == QUEUED:
            self.ctx.send(job.delivered, queued(bytes(job.id), 0))
        elif job.state == ACKED:
            self.ctx.send_lazy((sender,), set_ack(bytes(job.id), len(job.delivered)))

    # -- commands -----------------------------------------------------------------------
    def cmd_enqueue(self, client: int, argv: list[bytes]) -> int | Error:
        ids = argv[1:]
        bad = check_job_ids(ids)
        if bad:
            return bad
        enqueue_job = self.enqueue_job

        def act(job: Job) -> bool:
            if job.state != ACTIVE:
                return False
            job.flags &= ~F_NACK_DELAYED  # queued now: a NACK's delay is over (delivery.py)
            return enqueue_job(job)

        return self._store.count_done(ids, act)

    def cmd_dequeue(self, client: int, argv: list[bytes]) -> int | Error:
        ids = argv[1:]
        bad = check_job_ids(ids)
        if bad:
            return bad
        return self._store.count_done(ids, self.dequeue_job)

    def cmd_working(self, client: int, argv: list[bytes]) -> int | Error:
        bad = check_job_ids(argv[1:2])
        if bad:
            return bad
        job = self._store.get(argv[1])
        if job is None:
            return Error("NOJOB Job not known in the context of this node.")
        if job.state == ACKED:
            return Error("ACKED Job already acknowledged.")
        ctx = self.ctx
        now = ctx.now
        created = job.ctime // 1_000_000 - ctx.wall_offset
        lifetime = job.etime - created
        if lifetime > 0 and now - created > lifetime // 2:
            return Error(
                "TOOLATE Half of job TTL already elapsed, you are no longer allowed to postpone the next delivery."
            )
        if job.state == QUEUED:
            self.dequeue_job(job)
        if job.retry and job.next_at:
            if len(job.delivered) > 1:
                job.flags |= F_BCAST_WILLQUEUE
            job.next_at = retry_deadline(job, now, ctx.randbits)
            self._lifecycle.reschedule(job)
        ctx.send(job.delivered, working(bytes(job.id)))
        return job.retry
