"""Job lifecycle: the job table's one schedule, deletion, what is remembered of deleted jobs.

Theory of operation
-------------------
The lowest of the node's machines: it calls no other (``node.py`` tells the order), and
every other one that reschedules or deletes a job calls it.

Every job this node knows sits in ``ctx.store`` with at most one pending
wake-up (``Job.awake``, ONE_TIMER). ``reschedule(job)`` is the only place that
wake-up is computed: the earliest of the job's expiry (``etime``) and its
``next_at`` (``job.py``), which is its next requeue for a job active or
queued (minus ``WILLQUEUE_ADVANCE_MS`` while a WILLQUEUE is to be
announced) and its next GC attempt for an acked one. Every machine that
changes one of those times calls ``reschedule``. When a wake-up comes, ``Node``
routes the job (``Node._run_due``): past its TTL to ``expire``, acked to the ack
machine's GC attempt, active or queued to the requeue machine.

``delete_job`` is the one way a job leaves this node: it unregisters the job,
takes it out of its queue, and remembers its ID:

* a tombstone for ``TOMBSTONE_MS`` (at most ``TOMBSTONES_MAX``): a copy still on its
  way here in a YOURJOBS is dropped instead of being queued as new (``is_buried``, read by
  ``federation.py`` and ``delivery.py``; ``bury`` also takes the ID of a job FASTACKed or
  named by a DELJOB while not held here, ``acks.py``);
* for a DEDUP job, its ID for ``dedup_window_ms`` (``dedup-window``, 600 s by default; the
  AOF's DEDUPGONE): an ADDJOB with its key answers that ID and adds nothing, and a copy
  that arrives meanwhile is not kept (``remembers``; ``dedup.py``, ``replication.py``).

A job deleted while its copies are being made (wait-repl: its TTL ended, a DELJOB, a
FASTACK) answers its ADDJOB client NOREPL and tells the holders, as Disque's
``unregisterJob`` does (the client is found in ``ctx.repl_clients``, kept by
``replication.py``).

Commands: DELJOB, SHOW, JSCAN. Also the restore operations the AOF loader calls.
"""

from __future__ import annotations

from collections import deque
from typing import Final, final

from .commands import check_job_ids, parse_jscan
from .commandspec import EVERY_QUEUE, JOB_IDS, CommandSpec
from .context import Context
from .effects import Reply
from .job import (
    ACKED, ACTIVE, F_BCAST_WILLQUEUE, F_DELIVERED, F_GROUP, F_PRIORITY, QUEUED, STATE_NAMES, WAIT_REPL, Extra, Job, extra_fields,
    gc_deadline, job_priority, retry_deadline,
)  # fmt: skip
from .messages import del_job
from .replies import Error, Status
from .store import J_GONE, scan

__all__ = [
    "Lifecycle", "WILLQUEUE_ADVANCE_MS", "TOMBSTONE_MS", "TOMBSTONES_MAX", "DEFAULT_WINDOW_MS", "NOREPL_REMOVED",
]  # fmt: skip

WILLQUEUE_ADVANCE_MS: Final = 500
TOMBSTONE_MS: Final = 2000
TOMBSTONES_MAX = 100_000  # not Final: tests lower it
DEFAULT_WINDOW_MS: Final = 600_000  # dedup-window's default (600 s)
GONE_GC_BATCH: Final = 1024  # DEDUP IDs forgotten per call at most
TOMB_GC_BATCH: Final = 64  # tombstones forgotten per tick at most
#: A wait-repl job deleted here (or elsewhere: a DELJOB from a peer, acks.py): its client's answer.
NOREPL_REMOVED: Final = "NOREPL job removed (expired?) before the requested replication level was achieved"

#: The commands this machine answers (commandspec.py; Node dispatches them).
COMMANDS: Final = (
    CommandSpec(b"deljob", "cmd_deljob", -1, ("write", "fast"), ("admin",), JOB_IDS,
                syntax="DELJOB job-id [job-id ...]", summary="Delete jobs from this node only", group="jobs"),
    CommandSpec(b"show", "cmd_show", 2, ("readonly", "fast"), ("produce", "consume", "inspect"), JOB_IDS,
                syntax="SHOW job-id", summary="Describe a job: state, queue, nodes, counters, options",
                group="jobs"),
    CommandSpec(b"jscan", "cmd_jscan", -1, ("readonly",), ("inspect",), EVERY_QUEUE,
                syntax="JSCAN [cursor] [COUNT count] [BUSYLOOP] [QUEUE queue] [STATE state [STATE state ...]] "
                       "[REPLY ALL|ID]",
                summary="Iterate over this node's jobs, by queue and state", group="jobs"),
)


@final
class Lifecycle:
    def __init__(self, ctx: Context) -> None:
        self.ctx = ctx
        self._store = ctx.store
        self._queues = ctx.queues
        self._stats = ctx.stats
        self.tombstones: dict[bytes, int] = {}  # recently dead job id -> forget at (ms)
        # (forget at, id) oldest first: a dict emptied from the front makes each next(iter()) walk
        # the holes left there (it showed up at 3 % of a node's time)
        self._tomb_order: deque[tuple[int, bytes]] = deque()
        self.dedup_window_ms = DEFAULT_WINDOW_MS  # CONFIG SET dedup-window (server/app.py)
        #: DEDUP job ID -> end of its window (monotonic ms), for a DEDUP job deleted here
        self.gone: dict[bytes, int] = {}
        self._gone_order: deque[tuple[int, bytes]] = deque()

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

    # -- the end of a job ------------------------------------------------------------
    def expire(self, job: Job) -> None:
        """Its TTL ended (``Node._run_due``)."""
        self._stats["jobs_expired"] += 1
        self.delete_job(job)

    def delete_job(self, job: Job, bury: bool = True) -> None:
        """Forget a job entirely on this node (expiry, DELJOB, FASTACK, GC). ``bury=False``
        (an acked job no other node held, ``Acks.try_gc``) keeps no tombstone: no copy of it
        is anywhere to move in."""
        if not self._store.unregister(job):
            return
        if bury:
            self.bury(job.id)
        if job.extra is not None and job.extra.dedup is not None:
            self._dedup_deleted(job)
        state = job.state
        if state == QUEUED:
            q = self._queues.get(job.queue)  # type: ignore[arg-type]  # a queued job has a queue
            if q is not None:
                q.remove(job)
        elif state == WAIT_REPL:  # e.g. its TTL ended while replicating
            ctx = self.ctx
            client = ctx.repl_clients.pop(job.id, None)
            if client is not None:
                ctx.repl_client_jobs.pop(client, None)
                ctx.effects.append(Reply(client, Error(NOREPL_REMOVED)))
                ctx.send(job.delivered, del_job(bytes(job.id)))

    # -- tombstones --------------------------------------------------------------------
    def bury(self, job_id: bytes) -> None:
        """Remember a dead job's ID for TOMBSTONE_MS: a copy of it moving in meanwhile is dropped."""
        now = self.ctx.now
        at = now + TOMBSTONE_MS
        self.tombstones[job_id] = at
        order = self._tomb_order
        order.append((at, job_id))
        if len(order) > TOMBSTONES_MAX:
            self._unbury_oldest()
        # Up to two whose time is up, oldest first: the forgetting keeps pace with the burying,
        # so the tick finds few (forget_buried) however many jobs a second are deleted.
        if order[0][0] <= now:
            self._unbury_oldest()
            if order and order[0][0] <= now:
                self._unbury_oldest()

    def is_buried(self, job_id: bytes) -> bool:
        return job_id in self.tombstones

    def _unbury_oldest(self) -> None:
        at, job_id = self._tomb_order.popleft()
        if self.tombstones.get(job_id) == at:  # not buried again since
            del self.tombstones[job_id]

    def forget_buried(self, now: int) -> None:
        """Tombstones whose time is up (``Node.tick``), ``TOMB_GC_BATCH`` at most: a tick is one
        slice of the shell's loop (``bury`` forgets as it goes; what is left waits for the next
        ticks, a little past its time, which only keeps a dead job's ID a little longer)."""
        order = self._tomb_order
        n = 0
        while order and order[0][0] <= now and n < TOMB_GC_BATCH:
            self._unbury_oldest()
            n += 1

    # -- the DEDUP window ----------------------------------------------------------------
    def _dedup_deleted(self, job: Job) -> None:
        """A DEDUP job is deleted here: its ID is remembered for the window. ``job.next_at``
        carries the window's end to the AOF (the journal's J_GONE)."""
        ctx = self.ctx
        until = ctx.now + self.dedup_window_ms
        self.remember(job.id, until)
        journal = ctx.journal
        if journal is not None:
            job.next_at = until
            journal.append((J_GONE, job))

    def remember(self, job_id: bytes, until: int) -> None:
        """Remember a deleted DEDUP job's ID until ``until`` (monotonic ms)."""
        if until <= self.ctx.now:
            return
        self.gone[job_id] = until
        self._gone_order.append((until, job_id))

    def remembers(self, job_id: bytes) -> bool:
        """Whether ``job_id`` is a deleted DEDUP job's, within its window."""
        until = self.gone.get(job_id)
        return until is not None and until > self.ctx.now

    def forget_gone(self, now: int) -> None:
        """DEDUP IDs whose window ended (``Node.tick``, once a second at most). Looked up with
        their end (``remembers``), so one kept a little longer changes no answer."""
        order = self._gone_order
        gone = self.gone
        n = 0
        while order and order[0][0] <= now and n < GONE_GC_BATCH:
            until, job_id = order.popleft()
            if gone.get(job_id) == until:
                del gone[job_id]
            n += 1

    def flushall(self) -> None:
        """DEBUG FLUSHALL: nothing deleted is remembered any more."""
        self.tombstones.clear()
        self._tomb_order.clear()
        self.gone.clear()
        self._gone_order.clear()

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
        self.remember(job_id, until - self.ctx.wall_offset)

    def restore_extra(self, job_id: bytes, extra: Extra) -> None:
        """A JOBEXTRA: the delivery policy and dead-letter facts of the job just restored."""
        job = self._store.get(job_id)
        if job is not None:
            job.extra = extra
            if extra.group is not None:
                job.flags |= F_GROUP  # (LOADJOB's flags have it too; a file of ours may not)

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

    def restore_finish(self, enqueue_once: bool) -> tuple[dict[str, int], list[Job]]:
        """Every job restored: give each its state's wake-up. Jobs come back active and are
        requeued by their RETRY timers, a whole RETRY after the restart at the soonest and
        announced with WILLQUEUE (RETRY 0 ones never again); with ``enqueue_once``
        (aof-enqueue-jobs-once, a controlled restart) the ones written as queued are to be
        queued again at once, in their order, RETRY 0 ones included: returned, for
        ``Node.restore_finish`` to hand to the requeue machine. Also returns counts by outcome
        (``queued`` is Node's to fill in)."""
        ctx = self.ctx
        now = ctx.now
        jobs = acked = expired = 0  # counted in locals: a dict's item per job costs
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
        return {"jobs": jobs, "queued": 0, "acked": acked, "expired": expired}, to_queue

    # -- commands ---------------------------------------------------------------------
    def cmd_deljob(self, client: int, argv: list[bytes]) -> int | Error:
        ids = argv[1:]
        bad = check_job_ids(ids)
        if bad:
            return bad
        delete_job = self.delete_job
        return self._store.count_done(ids, lambda job: delete_job(job) or True)

    def cmd_show(self, client: int, argv: list[bytes]) -> list[object] | Error | None:
        bad = check_job_ids(argv[1:2])
        if bad:
            return bad
        job = self._store.get(argv[1])
        return None if job is None else self.job_info(job)

    def cmd_jscan(self, client: int, argv: list[bytes]) -> list[object] | Error:
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
        items: list[object]
        if args.reply_all:
            items = [self.job_info(j) for j in found]
        else:
            items = [Status(j.id) for j in found]
        return [str(cursor).encode(), items]

    def job_info(self, job: Job) -> list[object]:
        now = self.ctx.now
        ttl = max(0, (job.etime - now) // 1000)
        requeue_at = job.requeue_at  # 0 for an acked job
        next_requeue = max(0, requeue_at - now) if requeue_at else None
        next_awake = max(0, job.awake - now) if job.awake else None
        out: list[object] = [
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
        ]  # fmt: skip
        if job.flags & F_PRIORITY:  # ours, after Disque's fields: only for a job with a priority
            out += [b"priority", job_priority(job)]
        if job.extra is not None:
            out += extra_fields(job, True)
        return out
