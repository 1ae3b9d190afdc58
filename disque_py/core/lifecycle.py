"""Job lifecycle: the job table's one schedule, expiry, deletion, and the job commands.

Theory of operation
-------------------
Every job this node knows sits in ``ctx.store`` with at most one pending
wake-up (``Job.awake``, ONE_TIMER). ``reschedule(job)`` is the only place that
wake-up is computed: the earliest of the job's expiry (``etime``) and its
``next_at`` (``job.py``), which is its next requeue for a job active or
queued (minus ``WILLQUEUE_ADVANCE_MS`` while a WILLQUEUE is to be
announced) and its next GC attempt for an acked one. Every machine that
changes one of those times calls ``ctx.reschedule``.

``run_due(now)`` (from ``Node.tick``) takes the jobs whose time came, earliest
first, and for each:

* past its TTL: counted expired and deleted (``delete_job``);
* acked: one GC attempt (``ctx.gc_due``, ``acks.py``), which may delete it;
* active or queued: the requeue machine decides (``ctx.requeue_due``,
  ``requeue.py``): WILLQUEUE, requeue, or a new RETRY period;
* then its next wake-up is computed again.

``delete_job`` is the one way a job leaves this node: it unregisters the job,
takes it out of its queue, tombstones its ID (``ctx.bury``: a copy moving in
right after is dropped), and tells the replication machine when a client
still waits for its copies (``ctx.replication_dropped``).

Commands: DELJOB, SHOW, JSCAN. Called by ``Node`` (commands, ``tick``) and,
through the context, by every other machine.
"""

from __future__ import annotations

from typing import Any, Final, final

from .commands import check_job_ids, parse_jscan
from .commandspec import EVERY_QUEUE, JOB_IDS, CommandSpec
from .context import Context
from .delivery import extra_fields
from .job import (
    ACKED, ACTIVE, F_BCAST_QUEUED, F_BCAST_WILLQUEUE, F_DELIVERED, QUEUED, STATE_NAMES, WAIT_REPL, Job, gc_deadline,
    retry_deadline,
)  # fmt: skip
from .replies import Error, Status
from .store import scan

__all__ = ["Lifecycle", "WILLQUEUE_ADVANCE_MS", "SCHEDULE_BATCH"]

WILLQUEUE_ADVANCE_MS: Final = 500
SCHEDULE_BATCH: Final = 10_000

#: The commands this machine answers (commandspec.py; Node dispatches them).
COMMANDS: Final = (
    CommandSpec(b"deljob", "cmd_deljob", -1, ("write", "fast"), ("admin",), JOB_IDS),
    CommandSpec(b"show", "cmd_show", 2, ("readonly", "fast"), ("produce", "consume", "inspect"), JOB_IDS),
    CommandSpec(b"jscan", "cmd_jscan", -1, ("readonly",), ("inspect",), EVERY_QUEUE),
)


@final
class Lifecycle:
    def __init__(self, ctx: Context) -> None:
        self.ctx = ctx
        self._store = ctx.store
        self._queues = ctx.queues
        self._stats = ctx.stats

    # -- the schedule (ONE_TIMER) ------------------------------------------------------
    def reschedule(self, job: Job) -> None:
        """Recompute the job's single wake-up time from its state (ONE_TIMER)."""
        at = job.etime
        next_at = job.next_at  # the next GC attempt if acked, else the next requeue
        if next_at:
            state = job.state
            if state != WAIT_REPL:
                if state != ACKED and job.flags & F_BCAST_WILLQUEUE:
                    next_at -= WILLQUEUE_ADVANCE_MS
                if next_at < at:
                    at = next_at
        self._store.schedule(job, at if at > 0 else 1)

    def run_due(self, now: int) -> None:
        """Run every job timer due at ``now`` (at most SCHEDULE_BATCH jobs per call)."""
        ctx = self.ctx
        store = self._store
        for job in store.pop_due(now, SCHEDULE_BATCH):
            if job.etime <= now:
                self._stats["jobs_expired"] += 1
                self.delete_job(job)
                continue
            state = job.state
            if state == ACKED:
                ctx.gc_due(job)
                if store.get(job.id) is not job:
                    continue  # collected
            elif state != WAIT_REPL:
                ctx.requeue_due(job)
            self.reschedule(job)

    # -- the end of a job ------------------------------------------------------------
    def delete_job(self, job: Job) -> None:
        """Forget a job entirely on this node (expiry, DELJOB, FASTACK, GC)."""
        if not self._store.unregister(job):
            return
        ctx = self.ctx
        ctx.bury(job.id)
        if job.extra is not None and job.extra.dedup is not None:
            ctx.dedup_deleted(job)  # its ID is remembered for the dedup window (dedup.py)
        state = job.state
        if state == QUEUED:
            q = self._queues.get(job.queue)  # type: ignore[arg-type]  # a queued job has a queue
            if q is not None:
                q.remove(job)
        elif state == WAIT_REPL:  # e.g. its TTL ended while replicating
            ctx.replication_dropped(job)

    # -- restoring from the AOF ----------------------------------------------------------
    # The shell's loader (persistence/loader.py) reads the file and calls these, one per
    # record, in file order, before the node serves anyone (the journal is off meanwhile);
    # then ``restore_finish`` once. A record comes as plain typed values (a ``records.
    # LoadJob``'s fields): the core imports nothing of persistence, and compiled, the call
    # and every field stay native. Times in records are wall-clock ms.
    def restore_job(self, job_id: bytes, state: int, repl: int, flags: int, ctime: int, expire: int, delay: int,
                    retry: int, nacks: int, deliveries: int, requeue: int, queue: bytes, nodes: tuple,
                    body: bytes) -> bool:  # fmt: skip
        """A LOADJOB: the job's whole state (replacing any earlier one). False if it expired.
        ``requeue``: the job's next_at (its next requeue, or GC attempt if acked), wall-clock."""
        ctx = self.ctx
        store = self._store
        old = store.get(job_id)
        if old is not None:
            store.unregister(old)
        offset = ctx.wall_offset
        etime = expire - offset
        if etime <= ctx.now:
            return False
        if state == WAIT_REPL:  # not written by us (the AOF skips it), but harmless as active
            state = ACTIVE
        job = Job(job_id, state, queue, body, repl, ctime, etime, delay, retry, requeue - offset if requeue else 0,
                  nodes)  # fmt: skip
        job.flags = flags
        job.nacks = nacks
        job.deliveries = deliveries
        store.register(job)
        return True

    def restore_gone(self, job_id: bytes, until: int) -> None:
        """A DEDUPGONE: a DEDUP job deleted, its ID remembered until ``until`` (wall-clock ms)."""
        self.ctx.dedup_remember(job_id, until - self.ctx.wall_offset)

    def restore_extra(self, job_id: bytes, extra: Any) -> None:
        """A JOBEXTRA: the delivery policy and dead-letter facts of the job just restored."""
        job = self._store.get(job_id)
        if job is not None:
            job.extra = extra

    def restore_active(self, job_id: bytes) -> None:
        """A RETRY 0 job was delivered (``store.J_ACTIVE``): it is never queued again."""
        job = self._store.get(job_id)
        if job is not None and job.state != ACKED:
            if job.state != ACTIVE:
                job.set_state(ACTIVE)
            if job.retry == 0:
                job.flags |= F_DELIVERED
                job.next_at = 0  # never queued again

    def restore_queued(self, job_id: bytes) -> None:
        job = self._store.get(job_id)
        if job is not None and job.state == ACTIVE:
            job.set_state(QUEUED)

    def restore_acked(self, job_id: bytes) -> None:
        job = self._store.get(job_id)
        if job is not None and job.state != ACKED:
            job.set_state(ACKED)
            job.next_at = 0  # no GC attempt yet: restore_finish schedules the first

    def restore_deleted(self, job_id: bytes) -> None:
        job = self._store.get(job_id)
        if job is not None:
            self._store.unregister(job)

    def restore_finish(self, enqueue_once: bool) -> dict[str, int]:
        """Every job restored: give each its state's wake-up. Jobs come back active and are
        requeued by their RETRY timers, a whole RETRY after the restart at the soonest and
        announced with WILLQUEUE (RETRY 0 ones never again); with ``enqueue_once``
        (aof-enqueue-jobs-once, a controlled restart) the ones written as queued are queued
        again at once, in their order, RETRY 0 ones included. Returns counts by outcome."""
        ctx = self.ctx
        now = ctx.now
        jobs = acked = expired = queued = 0  # counted in locals: a dict's item per job costs
        to_queue: list[Job] = []
        for job in self._store.values():
            if job.etime <= now:
                self.delete_job(job)
                expired += 1
                continue
            jobs += 1
            state = job.state
            if state == ACKED:
                acked += 1
                if job.next_at <= now:  # its GC attempt was due while it was down, or never set
                    job.next_at = gc_deadline(job, now, ctx.randbits)  # the first one, in about 1 s
            else:
                if state == QUEUED:
                    job.set_state(ACTIVE)  # in no queue: queued again below, or by its RETRY
                    if enqueue_once:
                        to_queue.append(job)
                if job.retry and not (enqueue_once and state == QUEUED):
                    # As a copy received from a peer: a whole RETRY from now, announced with
                    # WILLQUEUE first, so that a node that acknowledged the job while this one
                    # was down answers SETACK before it comes back as a duplicate.
                    job.next_at = max(job.next_at, retry_deadline(job, now, ctx.randbits))
                    job.flags |= F_BCAST_WILLQUEUE
            self.reschedule(job)
        to_queue.sort(key=lambda j: j.ctime)
        for job in to_queue:
            if job.retry == 0 and job.flags & F_DELIVERED:
                continue  # AT_MOST_ONCE: delivered once (a damaged or foreign file says queued)
            job.flags &= ~F_BCAST_QUEUED  # a restore, not a requeue: nobody is told, nothing counted
            if ctx.enqueue_job(job, fresh=True):  # a RETRY 0 one too, this one time
                queued += 1
        return {"jobs": jobs, "queued": queued, "acked": acked, "expired": expired}

    # -- commands ---------------------------------------------------------------------
    def cmd_deljob(self, client: int, argv: list[bytes]) -> Any:
        ids = argv[1:]
        bad = check_job_ids(ids)
        if bad:
            return bad
        delete_job = self.delete_job
        return self._store.count_done(ids, lambda job: delete_job(job) or True)

    def cmd_show(self, client: int, argv: list[bytes]) -> Any:
        bad = check_job_ids(argv[1:2])
        if bad:
            return bad
        job = self._store.get(argv[1])
        return None if job is None else self.job_info(job)

    def cmd_jscan(self, client: int, argv: list[bytes]) -> Any:
        args = parse_jscan(argv)
        if isinstance(args, Error):
            return args
        queue, states = args.queue, args.states

        def match(job: Job) -> bool:
            if not job.delivered:  # dummy acks are not shown
                return False
            if queue is not None and job.queue != queue:
                return False
            return not states or job.state in states

        store = self._store
        cursor, found = scan(store.scan_from(args.cursor), store.cursor_of, args.count, args.busyloop, match)
        items: list[Any]
        if args.reply_all:
            items = [self.job_info(j) for j in found]
        else:
            items = [Status(j.id) for j in found]
        return [str(cursor).encode(), items]

    def job_info(self, job: Job) -> list:
        now = self.ctx.now
        ttl = max(0, (job.etime - now) // 1000)
        requeue_at = job.requeue_at  # 0 for an acked job
        next_requeue = max(0, requeue_at - now) if requeue_at else None
        next_awake = max(0, job.awake - now) if job.awake else None
        return [
            b"id", job.id,
            b"queue", job.queue,
            b"state", STATE_NAMES[job.state],
            b"repl", job.repl,
            b"ttl", ttl,
            b"ctime", job.ctime,
            b"delay", job.delay,
            b"retry", job.retry,
            b"nacks", job.nacks,
            b"additional-deliveries", job.deliveries,
            b"nodes-delivered", list(job.delivered),
            b"nodes-confirmed", list(job.confirmed) if job.confirmed else [],
            b"next-requeue-within", next_requeue,
            b"next-awake-within", next_awake,
            b"body", job.body,
        ] + (extra_fields(job) if job.extra is not None else [])  # fmt: skip
