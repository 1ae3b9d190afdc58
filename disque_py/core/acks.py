"""Acknowledgement and its garbage collection: ACKJOB/FASTACK, SETACK/GOTACK/DELJOB, dummy acks.

Theory of operation
-------------------
Acks (ACKJOB anywhere):

* The job turns ``acked`` (ACK_ONCE: it never leaves that state; a "dummy
  ack" is created for an unknown at-least-once ID when other nodes exist,
  so the ack reaches the holders after a partition heals) and SETACK(may_have)
  goes to the holders not yet confirmed (to every node for a dummy ack).
* A SETACK receiver acks its copy and answers GOTACK(known) when it knows no
  more holders than the sender; otherwise it runs the GC itself.
* When every holder confirmed, DELJOB(holders) goes to all of them and the
  job is deleted. Two copies (REPLICATE 2, or a moved REPLICATE 1 job): a
  SETACK to the only other holder says so (``SetAckTwoCopies``), and that
  holder, if it knows no third one, deletes its copy at once and answers
  GOTACK(known, deleted) (``GotAckDeleted``), so no DELJOB follows (one
  message less per job). A holder that knows a third runs the GC itself, as
  above. A DELJOB receiver that knows holders missing from the list passes
  it on to them (FASTACK's DELJOB alike).
* ``try_gc`` is one attempt; the acked job's ``next_at`` (``job.py``,
  ``gc_deadline``) is the next one, with exponential backoff (1 s .. 3 min) while some
  holder is unreachable; ``Node`` routes the job's wake-up to ``try_gc`` then. A holder absent
  from the node table from the third attempt on (CLUSTER FORGET) counts as
  confirmed.
* Why DELJOB lists the holders (Disque's carries only the ID): holders learn
  of each other unevenly once jobs move between nodes (a YOURJOBS sender
  records the receiver, the receiver learns the sender's list), so the
  collector may not know every copy, and the count in SETACK cannot tell
  "as many" from "the same". The copy only another holder knew was never
  deleted, and was queued and delivered again after RETRY.

Tombstones (the IDs of jobs deleted here, remembered a while so that a copy still on its
way in a YOURJOBS is dropped) are ``Lifecycle``'s, which deletes jobs; this machine buries
the ID of a job FASTACKed or named by a DELJOB while not held here (``Lifecycle.bury``).
An acked at-least-once job that no other node ever held (its holders: this node alone; a
job of one node, or REPLICATE 1 never moved) is deleted at its first GC attempt, the ACKJOB
itself, without the confirmation set and without a tombstone: nobody is to be asked and no
copy of it exists to move in.

Commands: ACKJOB, FASTACK. Messages: SETACK, GOTACK, DELJOB. Receives ``Lifecycle``
(the schedule, deletion, tombstones), ``Requeue`` (an acked job leaves its queue) and
``Replication`` (a SETACK or DELJOB for a job still waiting for its copies); called by
``Node`` (commands, messages, an acked job's wake-up: ``try_gc``), ``Delivery``
(``acknowledge``, ``try_gc``) and ``Memory`` (``try_gc``).
"""

from __future__ import annotations

from typing import Final, final

from . import ids as ids_mod
from .ids import valid_job_id
from .commands import check_job_ids
from .commandspec import JOB_IDS, CommandSpec
from .context import Context
from .job import ACKED, QUEUED, WAIT_REPL, Job, gc_deadline
from .lifecycle import NOREPL_REMOVED, Lifecycle
from .limits import Limits
from .messages import (
    DelJob,
    DelJobHolders,
    GotAck,
    GotAckDeleted,
    SetAck,
    SetAckTwoCopies,
    del_job,
    del_job_holders,
    got_ack,
    got_ack_deleted,
    set_ack,
    set_ack_two_copies,
)
from .replication import Replication
from .replies import Error
from .requeue import Requeue
from .store import J_ACKED

__all__ = ["Acks"]

GC_RETRY_COUNT_MAX: Final = 10
# From this GC attempt of an ack on (about 6 s after it), a holder that is not in this node's
# table at all (forgotten with CLUSTER FORGET) counts as confirmed; see try_gc.
GC_UNKNOWN_HOLDER_ATTEMPT: Final = 3

#: The commands this machine answers (commandspec.py; Node dispatches them).
COMMANDS: Final = (
    CommandSpec(b"ackjob", "cmd_ackjob", -1, ("write", "fast"), ("consume",), JOB_IDS,
                syntax="ACKJOB job-id [job-id ...]",
                summary="Acknowledge jobs: done, deleted on every node that holds a copy", group="jobs"),
    CommandSpec(b"fastack", "cmd_fastack", -1, ("write", "fast"), ("consume",), JOB_IDS,
                syntax="FASTACK job-id [job-id ...]",
                summary="Acknowledge jobs with a best-effort delete: fewer messages than ACKJOB", group="jobs"),
)


@final
class Acks:
    def __init__(self, ctx: Context, lifecycle: Lifecycle, requeue: Requeue, replication: Replication,
                 limits: Limits) -> None:  # fmt: skip
        self.ctx = ctx
        self._limits = limits
        self._grouped = limits.by_id  # jobs of a group delivered here (never rebound: tested per ack)
        self._lifecycle = lifecycle
        self._requeue = requeue
        self._replication = replication
        self._store = ctx.store
        self._stats = ctx.stats

    # -- acknowledgement -------------------------------------------------------------
    def acknowledge(self, job: Job, schedule_gc: bool = True) -> None:
        """ACK_ONCE: move a job to acked (dequeuing it) and schedule its GC.

        ``schedule_gc=False`` is for a caller that runs ``try_gc`` at once,
        which schedules the next attempt itself (or deletes the job).
        """
        state = job.state
        if state == ACKED:
            return
        ctx = self.ctx
        if state == QUEUED:
            self._requeue.dequeue_job(job)
        elif state == WAIT_REPL:
            self._replication.acked_while_replicating(job)
        job.set_state(ACKED)
        job.confirmed = None
        self._stats["jobs_acked"] += 1
        if ctx.journal is not None:
            ctx.journal.append((J_ACKED, job))
        if schedule_gc:
            # Always schedule a GC attempt: a node acked through SETACK may never hear the final
            # DELJOB (lost message), and only its own GC attempts will collect the ack.
            job.next_at = gc_deadline(job, ctx.now, ctx.randbits)
            self._lifecycle.reschedule(job)

    def _dummy_unknown_everywhere(self, job: Job) -> bool:
        """A dummy ack's end: every node still known said it does not know the ID (one forgotten
        meanwhile, CLUSTER FORGET, is no longer asked and will not answer), or we are alone."""
        confirmed = job.confirmed
        ctx = self.ctx
        return ctx.cluster_size == 1 or all(n in confirmed for n in ctx.known_nodes)  # type: ignore[operator]

    def try_gc(self, job: Job) -> None:
        """One garbage-collection attempt for an acked job (also its wake-up's, ``Node._run_due``)."""
        if job.state != ACKED:
            return
        ctx = self.ctx
        delivered = job.delivered
        if len(delivered) == 1 and delivered[0] == ctx.id and job.retry and job.extra is None:
            # No other node ever held a copy of this at-least-once job (a peer that takes one is
            # added to ``delivered`` before it leaves: replication, Leases.export, on_yourjobs),
            # so nobody is asked and no copy of it can move in later: deleted at once, without a
            # tombstone. (An at-most-once job's only copy moves without naming the peer, and one
            # handed back by a move that never left, ``Federation.on_moves_unsent``, must stay
            # dead: those keep the tombstone.)
            self._lifecycle.delete_job(job, bury=False)
            return
        dummy = not delivered
        if job.gc_retry < GC_RETRY_COUNT_MAX:
            job.gc_retry += 1
        if job.confirmed is None:
            job.confirmed = {ctx.id}
        if job.gc_retry >= GC_UNKNOWN_HOLDER_ATTEMPT and not dummy:
            # A holder that lost its memory comes back under a new ID, so its old ID never
            # confirms: once the operator forgets it (CLUSTER FORGET, on every node as in
            # Disque), it is in no node table, and waiting for it would keep the ack until its
            # TTL. Not at the first attempts: a node that joined a moment ago may be unknown here
            # for the time gossip takes. A node known again (forgotten by mistake) counts again.
            known = ctx.known_nodes
            for n in job.delivered:
                if n not in known:
                    job.confirmed.add(n)
        done = self._dummy_unknown_everywhere(job) if dummy else len(job.confirmed) >= len(job.delivered)
        if done:
            self._lifecycle.delete_job(job)
            return
        targets = delivered or ctx.known_nodes
        confirmed = job.confirmed
        if len(delivered) == 2 and ctx.id in delivered:
            # one other holder: it may delete its copy at once (on_setack)
            message: tuple = set_ack_two_copies(bytes(job.id))
        else:
            message = set_ack(bytes(job.id), len(delivered))
        ctx.send_lazy([n for n in targets if n not in confirmed], message)
        job.next_at = gc_deadline(job, ctx.now, ctx.randbits)
        self._lifecycle.reschedule(job)

    # -- messages -----------------------------------------------------------------------
    def on_setack(self, sender: str, m: SetAck | SetAckTwoCopies) -> None:
        job_id = m.job_id
        may_have = m.may_have
        ctx = self.ctx
        job = self._store.get(job_id)
        if job is None and not valid_job_id(job_id):
            ctx.bus_stats["messages_malformed"] += 1  # never echo a malformed ID back (see messages)
            return
        if job is not None:
            if job.state == WAIT_REPL:
                if not self._replication.achieved(job):
                    return
            if type(m) is SetAckTwoCopies and all(n == sender or n == ctx.id for n in job.delivered):
                # The sender's only other holder is this node, and this node knows no other
                # holder either: once acked here nobody needs this copy, so it goes now, and
                # the GOTACK says so; the sender then sends no DELJOB (one message less for
                # every job with two copies: REPLICATE 2, or a moved REPLICATE 1 job).
                self.acknowledge(job, schedule_gc=False)
                self._lifecycle.delete_job(job)
                ctx.send_lazy((sender,), got_ack_deleted(job_id))
                return
            self.acknowledge(job)
        if job is None or len(job.delivered) <= may_have:
            ctx.send_lazy((sender,), got_ack(job_id, job is not None))
        else:
            if may_have == 0:
                ctx.send_lazy((sender,), got_ack(job_id, True))
            self.try_gc(job)

    def on_gotack(self, sender: str, m: GotAck | GotAckDeleted) -> None:
        job = self._store.get(m.job_id)
        known = m.known
        if job is None or job.state != ACKED:
            return
        ctx = self.ctx
        dummy = not job.delivered
        if dummy and known:
            self._lifecycle.delete_job(job)  # a node that knows the job will collect it
            return
        if known or sender in job.delivered:
            if sender not in job.delivered:
                job.delivered = tuple(job.delivered) + (sender,)
            if job.confirmed is not None:
                job.confirmed.add(sender)
        if not known and dummy:
            if job.confirmed is None:
                job.confirmed = {ctx.id}
            job.confirmed.add(sender)
            if self._dummy_unknown_everywhere(job):
                self._lifecycle.delete_job(job)  # nobody knows this ID: drop the dummy ack
            return
        if not dummy and job.confirmed is not None and len(job.confirmed) >= len(job.delivered):
            if type(m) is GotAckDeleted:
                # the sender deleted its copy already (it was our only other holder, on_setack)
                me = ctx.id
                others: tuple[str, ...] | list[str] = [n for n in job.delivered if n != sender and n != me]
            else:
                others = job.delivered
            if others:
                ctx.send_lazy(others, del_job_holders(bytes(job.id), list(job.delivered)))
            self._lifecycle.delete_job(job)

    def on_deljob(self, sender: str, m: DelJob | DelJobHolders) -> None:
        ctx = self.ctx
        job = self._store.get(m.job_id)
        if job is not None:
            if job.state == WAIT_REPL:  # deleted elsewhere (FASTACK) while replicating
                self._replication.failed(job, Error(NOREPL_REMOVED), True)
                return
            # The sender lists the holders it told: pass the DELJOB on to those we know and it did
            # not (a copy moved on from here, say), or that copy would come back after RETRY.
            if type(m) is DelJobHolders:
                told = m.holders
                me = ctx.id
                others = [n for n in job.delivered if n not in told and n != sender and n != me]
                if others:
                    ctx.send_lazy(others, del_job_holders(bytes(job.id), told + others))
            self._lifecycle.delete_job(job)
        elif valid_job_id(m.job_id):
            self._lifecycle.bury(m.job_id)  # not here (yet): a copy moving in right after is dead already
        else:
            ctx.bus_stats["messages_malformed"] += 1  # never remember a malformed ID (see messages)

    # -- commands -----------------------------------------------------------------------
    def cmd_ackjob(self, client: int, argv: list[bytes]) -> int | Error:
        ids = argv[1:]
        store = self._store
        bad = check_job_ids(ids, store)  # type: ignore[arg-type]
        if bad:
            return bad
        ctx = self.ctx
        known = 0
        if self._grouped:  # a delivery of a group's job acknowledged where it was made (limits.py)
            self._limits.acked_here(ids)
        for job_id in ids:
            job = store.get(job_id)
            if job is None:
                # A "dummy ack" keeps an ACK for a job we never saw, so that
                # it reaches the owners after a partition heals. Only useful
                # with other nodes, never for at-most-once IDs, never while
                # leaving.
                if ctx.cluster_size > 1 and not ctx.leaving and not ids_mod.is_at_most_once_id(job_id):
                    job = Job(job_id, ACKED)
                    job.etime = ctx.now + ids_mod.ttl_minutes_from_id(job_id) * 60_000
                    store.register(job)
            elif job.state != ACKED:
                self.acknowledge(job, schedule_gc=False)
                known += 1
            if job is not None:
                self.try_gc(job)  # schedules the next attempt, or deletes the job
        return known

    def cmd_fastack(self, client: int, argv: list[bytes]) -> int | Error:
        ids = argv[1:]
        store = self._store
        bad = check_job_ids(ids, store)  # type: ignore[arg-type]
        if bad:
            return bad
        ctx = self.ctx
        known = 0
        if self._grouped:  # a delivery of a group's job acknowledged where it was made (limits.py)
            self._limits.acked_here(ids)
        for job_id in ids:
            job = store.get(job_id)
            if job is None:
                ctx.send_lazy(ctx.known_nodes, del_job(bytes(job_id)))
                self._lifecycle.bury(bytes(job_id))  # a copy on its way here is dropped too
            else:
                ctx.send_lazy(job.delivered, del_job_holders(bytes(job_id), list(job.delivered)))
                if job.state != ACKED:
                    self._stats["jobs_acked"] += 1
                self._lifecycle.delete_job(job)  # one still waiting for its copies answers its client
                known += 1
        return known
