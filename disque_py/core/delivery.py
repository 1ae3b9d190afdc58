"""Jobs that fail well: NACK with a delay, BACKOFF, MAXDELIVER and dead letters.

Theory of operation
-------------------
Disque carries a job's policy in the job (RETRY, TTL); so do these. ADDJOB's
``BACKOFF min max``, ``MAXDELIVER n`` and ``DEADLETTER queue`` are kept in
``job.extra`` (``job.Extra``, one optional slot: a job without them costs one
``None`` and one test where a delivery or a failure is handled) and travel with
every copy (``wire.py``) and in the AOF (a JOBEXTRA record).

A failure is a NACK or the end of a RETRY period of a job that was delivered
(``Requeue.requeue_due``). At a failure a holder decides, alone, what comes
next, from what it knows:

* dead letter: the job has a MAXDELIVER and has been delivered that many times
  (``Extra.count``), or the NACK said DEAD. ``dead_letter`` makes the dead
  letter, a new job with the same body in ``DEADLETTER`` (default
  ``<queue>.dead``) whose ``Extra.origin`` names the original ID, queue,
  deliveries, the reason and the original's options; copies go to the
  original's holders (REPLJOB, no reply awaited, as ADDJOB ASYNC) and it is
  queued here. The original is acknowledged at once (SETACK to every holder
  now, so none of them queues it meanwhile). The dead letter's ID is derived
  from the original's (``ids.dead_letter_id``): two holders that dead-letter
  one job (a race, or both sides of a partition) make copies of one job,
  merged like any copies, never two jobs.
* later: a NACK with DELAY, or without one for a job with a BACKOFF (min x
  2^(nacks-1), capped at max, +-10 % jitter within [min, max]). The job stays
  active here until the delay ends (``F_NACK_DELAYED``, ``next_at``), and the
  other holders are told with NACKED: they count the nack, take the job out
  of their queue if it was queued there, and set their own requeue a RETRY
  past the delay, so that no holder queues it earlier and the job still comes
  back if this node dies. The requeue at the end of the delay is not a
  failure: nothing is counted, nothing dead-lettered, and its QUEUED carries
  no counter.
* now: a plain NACK, Disque's (``Requeue.enqueue_job(job, nack=True)``).

Counting deliveries: the node that hands a job with a policy to a consumer
(GETJOB, ``Blocking``; a job moved to another node is not delivered) counts it and tells the other holders (DELIVERED), who
count it too. A holder's count is never above the true number (a lost
message only lowers it), so MAXDELIVER never dead-letters a job before its
n-th delivery; a holder cut from the deliverer may let it be delivered a few
more times. Disque's own counters (nacks, additional-deliveries) are left as
they are.

Deliveries given back: RELEASE (ours; a worker that stops gives back the jobs it
fetched and never started) queues a job again now, as ENQUEUE does, but the
delivery does not count: no nack, no additional delivery, and one *return* that
MAXDELIVER subtracts (``Extra.delivered``: count - returns). Returns are counted
per node, by the node that took each RELEASE (``Extra.returned``, node -> its
count), and merged by the larger count per node: each node counts only its own,
so a return told twice, or told late, or two nodes' returns at once, are counted
exactly once each (a single count lowered by RETURNED "delivery n was given back"
would be wrong after a delivery elsewhere at the same moment: the releasing node
then learns a count that included the delivery it gave back, and stays one
above). The node tells every node with RETURNED (its whole ``returned``; not only
the holders it knows of: a holder's list of the others is not always whole, and
releases are rare), before the QUEUED of the job queued again (with DELAY, the
job stays active here until the delay ends, as after a NACK's delay, and the
RETURNED carries the delay: the holders put their requeue a RETRY past it,
counting no nack); every later
DELIVERED of the job carries the returns too (a trailing field), and a holder
that gets a DELIVERED missing some of them answers with a RETURNED, so a holder
that missed one learns it at the next delivery. Until it learns it, a holder counts the given
back delivery (one above the truth: a failure judged there meanwhile may
dead-letter the job one delivery early); a lost DELIVERED still only lowers.

The last failure's traceback: NACK's TRACE (the tail, ``job.TRACE_MAX`` bytes) is
kept in ``Extra.trace``, told to the other holders with NACKED (a trailing field),
and given to the job's dead letter (its own ``Extra.trace``); SHOW shows it
(``last-failure-trace``).

Commands: NACK, RELEASE. Messages: NACKED, DELIVERED, RETURNED. Receives ``Lifecycle`` (the schedule,
tombstones), ``Requeue`` (queueing), ``Replication`` (a dead letter's copies) and ``Acks``
(the original acknowledged once its dead letter's copies are made); called by ``Node``
(NACK, the messages, the end of a RETRY on a job with a policy: ``retry_ended``, a GOTJOB
for a dead letter: ``copied``, the copies asked for again: ``retry_copies``) and by
``Blocking`` (``delivered``).
"""

from __future__ import annotations

from typing import Callable, Final, final

from .acks import Acks
from .commands import check_job_ids, parse_nack, parse_release
from .commandspec import JOB_IDS, CommandSpec
from .context import Context
from .ids import dead_letter_id
from .job import (
    ACKED, ACTIVE, DEAD_SUFFIX, F_BCAST_QUEUED, F_BCAST_WILLQUEUE, F_DELIVERED, F_NACK_DELAYED, QUEUED, Extra, Job,
    retry_deadline,
)  # fmt: skip
from .lifecycle import Lifecycle
from .messages import (
    Delivered, DeliveredReturned, Nacked, NackedTrace, Returned, ReturnedDelay, delivered, delivered_returned, nacked,
    nacked_trace, queued, repl_job, returned, returned_delay, set_ack,
)  # fmt: skip
from .replication import Replication
from .replies import Error, err
from .requeue import Requeue
from .store import J_LOAD
from .wire import job_to_wire, returned_to_wire

__all__ = ["Delivery", "COMMANDS", "backoff_ms"]

#: how often the copies of a dead letter still short of them are asked for again (ms)
COPIES_RETRY_MS: Final = 1000

#: The commands this machine answers (commandspec.py; Node dispatches them). NACK queues a
#: job again, so it is refused at memory level 3 (denyoom), as Disque's. RELEASE (ours) is not:
#: it gives back a job held already, and a worker that stops must be able to.
COMMANDS: Final = (
    CommandSpec(b"nack", "cmd_nack", -1, ("write", "denyoom", "fast"), ("consume",), JOB_IDS,
                syntax="NACK job-id [job-id ...] [DELAY sec] [REASON text] [TRACE text] [DEAD]",
                summary="Jobs failed: queued again (after DELAY or the job's BACKOFF), or dead-lettered",
                group="jobs"),
    CommandSpec(b"release", "cmd_release", -2, ("write", "fast"), ("consume",), JOB_IDS,
                syntax="RELEASE job-id [job-id ...] [DELAY sec]",
                summary="Give back jobs taken, never started: queued again (now or after DELAY), not counted",
                group="jobs", since="disque-py 0.1.0"),
)


def backoff_ms(extra: Extra, nacks: int, randbits: Callable[[int], int]) -> int:
    """The delay of a job's next NACK under its BACKOFF: min x 2^(nacks-1) for its
    ``nacks``-th nack, capped at max, then +-10 % of jitter kept within [min, max]."""
    lo, hi = extra.backoff_min, extra.backoff_max
    base = lo << min(max(nacks - 1, 0), 40)
    if base > hi:
        base = hi
    spread = base // 10
    if spread:
        base += randbits(32) % (2 * spread + 1) - spread
    return lo if base < lo else hi if base > hi else base


@final
class Delivery:
    def __init__(self, ctx: Context, lifecycle: Lifecycle, requeue: Requeue, replication: Replication,
                 acks: Acks) -> None:  # fmt: skip
        self.ctx = ctx
        self._lifecycle = lifecycle
        self._requeue = requeue
        self._replication = replication
        self._acks = acks
        self._store = ctx.store
        self._stats = ctx.stats
        ctx.stats["jobs_dead_lettered"] = 0
        ctx.stats["jobs_nack_delayed"] = 0
        ctx.stats["jobs_released"] = 0
        #: original queue -> jobs dead-lettered here from it (INFO, /metrics)
        self.dead_by_queue: dict[bytes, int] = {}
        #: dead letter ID -> [original job, nodes that confirmed its copy, copies needed]: the
        #: original is acknowledged once they are all confirmed (``dead_letter``)
        self.pending: dict[bytes, list] = {}

    def _journal(self, job: Job) -> None:
        journal = self.ctx.journal
        if journal is not None:
            journal.append((J_LOAD, job))

    # -- NACK ---------------------------------------------------------------------------
    def cmd_nack(self, client: int, argv: list[bytes]) -> int | Error:
        if len(argv) == 1:
            return 0  # Disque's: no IDs, none nacked
        req = parse_nack(argv)
        if isinstance(req, Error):
            return req
        ids = req.ids
        bad = check_job_ids(ids)
        if bad:
            return bad
        store = self._store
        delay, reason, dead, trace = req.delay, req.reason, req.dead, req.trace
        if delay is None and reason is None and not dead and trace is None:  # Disque's NACK
            nack = self.nack
            return store.count_done(ids, lambda job: job.state == ACTIVE and nack(job, None, None))
        now = self.ctx.now
        if delay:
            for job_id in ids:  # refused as a whole, before anything is done
                job = store.get(job_id)
                if job is not None and job.state == ACTIVE and now + delay >= job.etime:
                    return err("DELAY %g s is beyond the TTL left to job %s (%d s)"
                               % (delay / 1000, job_id.decode(), max(0, job.etime - now) // 1000))  # fmt: skip
        if dead:
            dead_letter = self.dead_letter

            def act(job: Job) -> bool:
                if job.state != ACTIVE:
                    return False
                if reason is not None or trace is not None:
                    _note_failure(_extra(job), reason, trace)
                dead_letter(job, reason)
                return True

            return store.count_done(ids, act)
        nack = self.nack
        return store.count_done(ids, lambda job: job.state == ACTIVE and nack(job, delay, reason, trace))

    def nack(self, job: Job, delay: int | None, reason: bytes | None, trace: bytes | None = None) -> bool:
        """One active job NACKed: dead-lettered (MAXDELIVER reached), queued again after a
        delay (DELAY, or its BACKOFF), or queued again now (Disque's). False if refused (a
        RETRY 0 job delivered here: never queued again). ``trace``: NACK's TRACE, kept as
        the job's last failure's traceback."""
        ctx = self.ctx
        extra = job.extra
        if extra is not None:
            _note_failure(extra, reason, trace)
            if extra.maxdeliver and extra.delivered() >= extra.maxdeliver:
                self.dead_letter(job, extra.reason)
                return True
            if delay is None and extra.backoff_max:
                delay = backoff_ms(extra, job.nacks + 1, ctx.randbits)
        elif reason is not None or trace is not None:
            _note_failure(_extra(job), reason, trace)
        if not delay:
            done = self._requeue.enqueue_job(job, True)
            if done and (reason is not None or trace is not None):
                self._journal(job)  # its reason and traceback: a restart keeps them
            return done
        if not job.retry and job.flags & F_DELIVERED:
            return False  # AT_MOST_ONCE, as enqueue_job refuses it
        job.nacks += 1
        job.flags |= F_NACK_DELAYED
        job.next_at = ctx.now + delay
        self._lifecycle.reschedule(job)
        if trace is None:
            ctx.send(job.delivered, nacked(bytes(job.id), delay, reason or b""))
        else:
            ctx.send(job.delivered, nacked_trace(bytes(job.id), delay, reason or b"", trace))
        self._journal(job)  # its nacks and the end of its delay: a restart must not queue it sooner
        self._stats["jobs_nack_delayed"] += 1
        return True

    # -- hooks of the other machines -------------------------------------------------------
    def delivered(self, job: Job) -> None:
        """GETJOB (``Blocking``) handed a job with an Extra to a consumer: count it, here and on
        the other holders."""
        extra = job.extra
        extra.count += 1  # type: ignore[union-attr]
        if job.flags & F_NACK_DELAYED:
            job.flags &= ~F_NACK_DELAYED
        ctx = self.ctx
        if len(job.delivered) > 1:
            given_back = extra.returned  # type: ignore[union-attr]
            if not given_back:
                ctx.send(job.delivered, delivered(bytes(job.id), extra.count))  # type: ignore[union-attr]
            else:  # the returns go with it: a holder that missed a RETURNED learns them here
                count = extra.count  # type: ignore[union-attr]
                ctx.send(job.delivered, delivered_returned(bytes(job.id), count, returned_to_wire(given_back)))
        journal = ctx.journal
        if journal is not None:
            journal.append((J_LOAD, job))

    def retry_ended(self, job: Job) -> None:
        """The RETRY period of an active job with an Extra ended (``Requeue.requeue_due`` said
        so, ``Node._run_due`` hands it here): a failed delivery. Dead-lettered, or queued again
        (a new period)."""
        if not self.timed_out(job):
            self._requeue.enqueue_job(job)

    def timed_out(self, job: Job) -> bool:
        """The RETRY period of an active job with an Extra ended: True if it was dead-lettered
        instead (or its dead letter, made here, still waits for its copies)."""
        extra = job.extra
        if self.pending and dead_letter_id(job.id) in self.pending:
            self.dead_letter(job, extra.reason if extra is not None else None)
            return True
        if extra is None or not extra.maxdeliver or extra.delivered() < extra.maxdeliver:
            return False
        reason = extra.reason
        if reason is None:
            reason = b"not acknowledged within its RETRY (%d s)" % job.retry
        self.dead_letter(job, reason)
        return True

    # -- dead letters --------------------------------------------------------------------
    def dead_letter(self, job: Job, reason: bytes | None) -> None:
        """Make ``job``'s dead letter (unless a copy of it is here already), and acknowledge
        ``job`` everywhere once the dead letter's copies are confirmed (GOTJOB): until then the
        original stays active here and on its holders, so that a crash of this node before the
        copies are made loses nothing (a holder dead-letters it again, to the same ID)."""
        ctx = self.ctx
        store = self._store
        extra = _extra(job)
        dl_id = dead_letter_id(job.id)
        dl = store.get(dl_id)
        if dl is None and dl_id in self.pending:  # made here, then acknowledged and forgotten
            del self.pending[dl_id]
        elif dl is None and not self._lifecycle.is_buried(dl_id):
            count = extra.delivered()
            queue = extra.deadletter if extra.deadletter is not None else bytes(job.queue or b"") + DEAD_SUFFIX
            now = ctx.now
            created = job.ctime // 1_000_000 - ctx.wall_offset
            ttl = max(job.etime - created, 1000)  # the original's whole TTL, from now
            reachable = ctx.reachable
            holders = (ctx.id,) + tuple(n for n in job.delivered if n != ctx.id and n in reachable)
            dl = Job(dl_id, ACTIVE, queue, job.body, job.repl, (now + ctx.wall_offset) * 1_000_000 + (job.ctime % 1_000_000),
                     now + ttl, 0, job.retry, 0, holders)  # fmt: skip
            dl.extra = e = Extra()
            e.origin = (bytes(job.id), bytes(job.queue or b""), count, reason, extra.options())
            e.trace = extra.trace  # the original's last failure, shown with the dead letter
            store.register(dl)
            if len(holders) > 1:  # every holder named gets its copy, and confirms it
                ctx.send(holders, repl_job(job_to_wire(dl, now), False))
            if dl.repl > len(holders):  # more holders, as ADDJOB would pick them
                self._replication.replicate_job(dl, dl.repl - len(holders), False)
            self._requeue.enqueue_job(dl, False, True)  # fresh: queued here once, whatever its RETRY
            self._stats["jobs_dead_lettered"] += 1
            name = bytes(job.queue or b"")
            self.dead_by_queue[name] = self.dead_by_queue.get(name, 0) + 1
            # copies to confirm before the original goes: as many as it has holders (up to its
            # REPLICATE); and never one alone when the original had more (this node cut off
            # from the others: the dead letter waits here for a second copy, asked for again at
            # each RETRY, and the original stays, or a crash of this node would lose both)
            if len(dl.delivered) > 1:
                needed = min(dl.repl, len(dl.delivered))
            else:
                needed = min(dl.repl, len(set(job.delivered) | {ctx.id}), 2)
            if needed > 1:
                self.pending[dl_id] = [job, {ctx.id}, needed, now + COPIES_RETRY_MS]
                # not queued again meanwhile: a RETRY from now, its timer dead-letters it again
                # (the copies are asked for again) if they are still not confirmed
                job.flags &= ~F_NACK_DELAYED
                if job.retry:
                    job.next_at = retry_deadline(job, now, ctx.randbits)
                    self._lifecycle.reschedule(job)
                self._journal(job)
                return
        elif dl is not None and dl_id in self.pending:
            self._ask_copies(job, dl, self.pending[dl_id])
            if job.retry:
                job.next_at = retry_deadline(job, ctx.now, ctx.randbits)
                self._lifecycle.reschedule(job)
            return
        self._ack_original(job)

    def _ack_original(self, job: Job) -> None:
        if job.state != ACKED:
            acks = self._acks
            acks.acknowledge(job, False)
            acks.try_gc(job)  # SETACK to every holder now: none queues it again meanwhile

    def _ask_copies(self, job: Job, dl: Job, entry: list) -> None:
        """Ask again for the copies of a dead letter made here that are not confirmed yet: the
        original's holders reachable again get theirs too, then other nodes up to ``needed``."""
        ctx = self.ctx
        confirmed, needed = entry[1], entry[2]
        entry[3] = ctx.now + COPIES_RETRY_MS
        reachable = ctx.reachable
        more = tuple(n for n in job.delivered if n != ctx.id and n in reachable and n not in dl.delivered)
        if more:
            dl.delivered = tuple(dl.delivered) + more
        if len(dl.delivered) < needed:  # more holders, and every holder asked again
            self._replication.replicate_job(dl, needed - len(dl.delivered), False)
        else:
            ctx.send([n for n in dl.delivered if n not in confirmed], repl_job(job_to_wire(dl, ctx.now), False))

    def retry_copies(self, now: int) -> None:
        """Every second (``Node.tick``): the dead letters made here still short of their
        copies are asked for again (a partition that healed; a RETRY timer of the original
        that another node's QUEUED keeps pushing back does not)."""
        store = self._store
        for dl_id, entry in list(self.pending.items()):
            if entry[3] > now:
                continue
            dl = store.get(dl_id)
            job: Job = entry[0]
            if dl is None or store.get(job.id) is not job:
                continue
            self._ask_copies(job, dl, entry)

    def copied(self, dl: Job, sender: str) -> None:
        """A GOTJOB for a dead letter made here (``Replication.on_gotjob`` hands it back to
        ``Node``): once its copies are confirmed, the original is acknowledged."""
        entry = self.pending.get(dl.id)
        if entry is None:
            return
        job, confirmed, needed = entry[0], entry[1], entry[2]
        confirmed.add(sender)
        if len(confirmed) >= needed:
            del self.pending[dl.id]
            if self._store.get(job.id) is job:
                self._ack_original(job)  # type: ignore[arg-type]  # the original: a Job

    # -- messages -----------------------------------------------------------------------
    def on_nacked(self, sender: str, m: Nacked) -> None:
        job = self._store.get(m.job_id)
        if job is None:
            return
        ctx = self.ctx
        if job.state == ACKED:
            ctx.send_lazy((sender,), set_ack(bytes(job.id), len(job.delivered)))
            return
        if job.state == QUEUED:
            self._requeue.dequeue_job(job)
        job.nacks += 1
        if m.reason:
            _extra(job).reason = m.reason
        if type(m) is NackedTrace:
            _extra(job).trace = m.trace
        job.flags |= F_NACK_DELAYED
        if job.retry and job.next_at:
            # A RETRY past the end of the delay: the NACK's node queues it first, and if that
            # node is gone, this one does.
            job.flags |= F_BCAST_WILLQUEUE
            job.next_at = retry_deadline(job, ctx.now + m.delay, ctx.randbits)
            self._lifecycle.reschedule(job)
        self._journal(job)

    def on_delivered(self, sender: str, m: Delivered | DeliveredReturned) -> None:
        """A holder handed the job out, and counts ``m.count`` deliveries with it: the larger
        of that and our own count. Never above the true number (a message lost or repeated
        changes nothing; two deliveries at once on two nodes count one: late, never early).
        A DeliveredReturned carries the returns the sender knows of too (merged)."""
        job = self._store.get(m.job_id)
        if job is None or job.state == ACKED:
            return
        extra = _extra(job, 0)
        changed = False
        if m.count > extra.count:
            extra.count = m.count
            changed = True
        theirs = m.returned if type(m) is DeliveredReturned else None
        if theirs is not None and extra.merge_returned(theirs):
            changed = True
        mine = extra.returned
        if mine:
            # The sender does not know of every return we know of (its holders are not ours: a
            # RELEASE there told others): tell it, so its next DELIVERED carries them.
            if theirs is None or any(theirs.get(node, 0) < n for node, n in mine.items()):
                self.ctx.send((sender,), returned(bytes(job.id), returned_to_wire(mine)))
            if sender not in job.delivered:
                job.delivered = tuple(job.delivered) + (sender,)  # a holder: told of the next return
        if changed:
            self._journal(job)

    # -- RELEASE: deliveries given back -----------------------------------------------------
    def cmd_release(self, client: int, argv: list[bytes]) -> int | Error:
        """RELEASE id ... [DELAY seconds]: each job active here is queued again (now, or when
        DELAY ends), as ENQUEUE does, and its delivery given back (see the module docstring).
        Returns how many were given back."""
        req = parse_release(argv)
        if isinstance(req, Error):
            return req
        ids, delay = req
        bad = check_job_ids(ids)
        if bad:
            return bad
        store = self._store
        if delay:
            now = self.ctx.now
            for job_id in ids:  # refused as a whole, before anything is done (NACK's rule)
                job = store.get(job_id)
                if job is not None and job.state == ACTIVE and now + delay >= job.etime:
                    return err("DELAY %g s is beyond the TTL left to job %s (%d s)"
                               % (delay / 1000, job_id.decode(), max(0, job.etime - now) // 1000))  # fmt: skip
            release = self.release
            return store.count_done(ids, lambda job: release(job, delay))
        return store.count_done(ids, self.release)

    def release(self, job: Job, delay: int = 0) -> bool:
        """Give back one delivery of ``job`` and queue it again, now or after ``delay`` ms;
        False if it is not active here, or never to be queued again (a RETRY 0 job delivered
        here: AT_MOST_ONCE; one whose dead letter, made here, waits for its copies)."""
        if job.state != ACTIVE or not job.next_at or (not job.retry and job.flags & F_DELIVERED):
            return False
        if self.pending and dead_letter_id(job.id) in self.pending:
            return False  # dead-lettered here, its copies not confirmed yet: never queued again
        ctx = self.ctx
        # One return, whichever delivery it was (a job delivered twice at once, one of them
        # NACKed with a delay meanwhile, still has the other given back), and even before this
        # node heard of the delivery (its DELIVERED still on its way: the count then catches up,
        # and count - returns is exact). The node cannot tell a RELEASE of a delivery nobody
        # held: then the count is only lower (MAXDELIVER later, never sooner).
        extra = _extra(job)
        me = ctx.id
        mine = extra.returned
        extra.merge_returned({me: (mine.get(me, 0) if mine is not None else 0) + 1})
        # To every node: a holder's list of the others is not always whole (a job moved, or
        # queued by another holder), and one that missed it would count the delivery given back.
        # Releases are rare (a worker that stops); a node without the job ignores it.
        wire = returned_to_wire(extra.returned)  # type: ignore[arg-type]
        to = ctx.known_nodes if len(ctx.known_nodes) > 1 else job.delivered
        if delay:
            # queued here when the delay ends, as at the end of a NACK's delay (Requeue: no
            # count, a QUEUED without a counter); the holders put their own requeue past it
            ctx.send(to, returned_delay(bytes(job.id), wire, delay))
            job.flags = (job.flags & ~F_BCAST_QUEUED) | F_NACK_DELAYED
            job.next_at = ctx.now + delay
            self._lifecycle.reschedule(job)
        else:
            ctx.send(to, returned(bytes(job.id), wire))
            # queued as at the end of a NACK's delay: nothing counted, a QUEUED without a counter
            job.flags &= ~(F_NACK_DELAYED | F_BCAST_QUEUED)
            self._requeue.enqueue_job(job)
            ctx.send(job.delivered, queued(bytes(job.id), 0))
        self._journal(job)
        self._stats["jobs_released"] += 1
        return True

    def on_returned(self, sender: str, m: Returned | ReturnedDelay) -> None:
        """A holder took a RELEASE of the job: its returns (``m.returned``) merged into ours;
        with a DELAY, it queues the job when the delay ends: our requeue goes a RETRY past it
        (as for a NACKED with a delay, no nack counted)."""
        job = self._store.get(m.job_id)
        if job is None or job.state == ACKED:
            return
        changed = _extra(job).merge_returned(m.returned)
        if sender not in job.delivered:
            job.delivered = tuple(job.delivered) + (sender,)
        if type(m) is ReturnedDelay:
            if job.state == QUEUED:
                self._requeue.dequeue_job(job)
            job.flags |= F_NACK_DELAYED
            if job.retry and job.next_at:
                job.flags |= F_BCAST_WILLQUEUE
                job.next_at = retry_deadline(job, self.ctx.now + m.delay, self.ctx.randbits)
                self._lifecycle.reschedule(job)
            changed = True
        if changed:
            self._journal(job)


def _note_failure(extra: Extra, reason: bytes | None, trace: bytes | None) -> None:
    """A NACK's REASON and TRACE, kept as the job's last failure (each only when given)."""
    if reason is not None:
        extra.reason = reason
    if trace is not None:
        extra.trace = trace


def _extra(job: Job, delivering: int = 1) -> Extra:
    """The job's Extra, made now if it has none (a NACK's REASON, a DELIVERED or NACKED for a
    job whose Extra is new here): its delivery count then starts from Disque's counters, each
    requeue (nack or RETRY) having followed a delivery, plus ``delivering``, the delivery the
    caller is about (1: the one being NACKed; 0: one the caller counts itself)."""
    extra = job.extra
    if extra is None:
        extra = job.extra = Extra()
        extra.count = job.nacks + job.deliveries + delivering
    return extra
