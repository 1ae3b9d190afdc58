"""Replication: a new job and its copies on other nodes (ADDJOB's work, REPLJOB/GOTJOB).

Theory of operation
-------------------
ADDJOB comes in through ``dedup.py`` (``Dedup.cmd_addjob``: parsed once, and its DEDUP key
looked up if it has one), which hands the parsed request here: ``add`` checks it against
the cluster (REPLICATE, MAXLEN, a paused queue), makes the job and its copies, and answers.
With REPLICATE > 1, or on a leaving node or one at memory level 1 or more
(``ctx.memory_level``, ``memory.py``), which replicate *externally* (REPLICATE copies, none
local) and ignore REPLJOB:

* The job is created in ``wait-repl`` (synchronous) and REPLJOB goes to
  REPLICATE-1 reachable nodes picked at random (REPLICATE of them, none
  local, when external). Every REPLJOB carries the list of nodes that may
  hold a copy.
* Each receiver (``on_repljob``) registers the job ``active`` (or merges the
  holder list if it has it already) and answers GOTJOB. When GOTJOBs (plus
  our own copy) reach REPLICATE, the client gets the ID and the job is queued
  here (``achieved``); an external job is instead handed to one confirmed
  holder with ENQUEUE and forgotten.
* While confirmations are missing, one more node is added every 50 ms and
  REPLJOB is re-sent to all holders so each learns the full list. With no
  node left to add, the resends back off (100 ms doubling to 1 s), and none
  goes to a node whose link still holds output the socket has not taken
  (``ctx.backlogged``, kept by the shell): the copy sent before has not even
  left, so another would only pile up behind it (a 59 MB job was once sent
  36 times over before its two GOTJOBs came back). For the same reason the
  nodes picked for a new job are taken among the others first. If the ADDJOB
  timeout expires (or the client goes away) the job is deleted here and
  DELJOB goes, best effort, to every node that may have a copy (``failed``).
  A wait-repl job deleted otherwise (its TTL, a DELJOB, a FASTACK) answers its
  client NOREPL from ``Lifecycle.delete_job``, which finds the client in the
  table this machine keeps in the context (``ctx.repl_clients``).
* ASYNC: the client gets the ID at once, REPLJOB asks for no GOTJOB.
* Copies of a DEDUP job made on two nodes at once meet here (``on_repljob``) and
  merge into one job (``_merge_dedup``, see ``dedup.py``).

The ADDJOB clients waiting for copies and the add-a-node / timeout timers
are this module's; ``Node`` asks ``next_wakeup`` and calls ``tick``. Receives
``Lifecycle`` (the schedule, deletion, the DEDUP window) and ``Requeue`` (queueing
a job whose copies are made); called by ``Node`` (REPLJOB, GOTJOB, ticks, a client
gone), ``Dedup`` (``add``), ``Acks`` (``achieved`` from a SETACK for a wait-repl
job, ``failed`` from a DELJOB) and ``Delivery`` (``replicate_job``, a dead
letter's copies). A GOTJOB for a job not waiting for its copies is handed back to
``Node`` (``on_gotjob`` returns it): a dead letter's copies are ``delivery.py``'s.
"""

from __future__ import annotations

import heapq
from typing import Final, final

from .commands import RETRY0_NEEDS_REPLICATE1, AddJob
from .context import Context
from .effects import BLOCKED, Reply, Send
from .job import ACKED, ACTIVE, F_BCAST_QUEUED, F_BCAST_WILLQUEUE, F_GROUP, F_YIELD, QUEUED, WAIT_REPL, Extra, Job, retry_deadline
from .limits import Limits
from .lifecycle import Lifecycle
from .messages import GotJob, ReplJob, del_job, enqueue, got_job, queued, repl_job, set_ack
from .queues import PAUSED_IN
from .replies import Error, err
from .requeue import Requeue, compare_ids_by_job
from .statics import STATUS
from .store import J_LOAD
from .wire import job_from_wire, job_to_wire

__all__ = ["Replication", "REPL_ADD_NODE_MS", "DEFAULT_REPLICATE_MAX"]

REPL_ADD_NODE_MS: Final = 50
REPL_RESEND_MAX_MS: Final = 1000
DEFAULT_REPLICATE_MAX: Final = 3
_TIMEOUT: Final = 1  # timer kind: the ADDJOB timeout (any other kind: add a node)


def _not_enough_nodes(replicate: int, others: int, extrepl: bool, leaving: bool) -> Error:
    """NOREPL for a REPLICATE that cannot be honoured: Disque's text, then the numbers.

    ``others``: the other nodes reachable now. This node counts as one more unless it
    keeps no copy (leaving, or at a memory level; then Disque's text says why).
    """
    text = "NOREPL Not enough reachable nodes for the requested replication level"
    if extrepl:
        if replicate - 1 == others:
            text += (", since I'm unable to hold a copy of the message for the following reason: "
                     + ("I'm leaving the cluster" if leaving else "I'm out of memory"))  # fmt: skip
        return Error("%s (%d other nodes reachable, %d asked)" % (text, others, replicate))
    return Error("%s (%d reachable, %d asked)" % (text, others + 1, replicate))


def _repl_timeout(job: Job) -> Error:
    """NOREPL for an ADDJOB whose timeout came first: Disque's text, then the copies confirmed."""
    confirmed = len(job.confirmed or ())
    return Error(
        "NOREPL Timeout reached before replicating to the requested number of nodes "
        "(%d of %d copies confirmed)" % (confirmed, job.repl)
    )


@final
class Replication:
    def __init__(self, ctx: Context, lifecycle: Lifecycle, requeue: Requeue, limits: Limits) -> None:
        self.ctx = ctx
        self._limits = limits
        self._lifecycle = lifecycle
        self._requeue = requeue
        self._store = ctx.store
        # job id -> client waiting for synchronous replication, and back (the context's: a job
        # deleted meanwhile answers its client from Lifecycle.delete_job)
        self.clients = ctx.repl_clients
        self.client_jobs = ctx.repl_client_jobs
        # (time, seq, kind, job id): kind 1 = ADDJOB timeout, otherwise add a node (kind = the
        # period waited for this timer: 0 the first time)
        self.timers: list[tuple[int, int, int, bytes]] = []
        self._seq = 0
        self._prev_ctime = 0

    def _timer(self, at: int, kind: int, job_id: bytes) -> None:
        self._seq += 1
        heapq.heappush(self.timers, (at, self._seq, kind, job_id))

    # -- ADDJOB ------------------------------------------------------------------------
    def add(self, client: int, req: AddJob, job_id: bytes | None) -> object:
        """ADDJOB's work once parsed (``Dedup.cmd_addjob``): checks, the job, its copies; the
        reply (an ID or an error), or BLOCKED while its copies are made. ``job_id``: a DEDUP
        job's (``ids.dedup_job_id``); None: a new one."""
        return self.make(client, req.queue, req.body, req.timeout, req.replicate, req.ttl, req.retry, req.delay,
                         req.maxlen, req.async_, req.extra, req.priority, req.group, job_id)  # fmt: skip

    def make(self, client: int, queue: bytes, body: bytes, timeout: int, replicate_opt: int | None, ttl: int,
             retry: int, delay: int, maxlen: int, async_: bool, extra: list | None, priority: int,
             group: bytes | None, job_id: bytes | None) -> object:  # fmt: skip
        """``add`` with ADDJOB's fields as arguments (an ADDJOB without options comes here
        straight from ``Dedup.cmd_addjob``, with no request object)."""
        ctx = self.ctx
        replicate = replicate_opt or min(DEFAULT_REPLICATE_MAX, ctx.cluster_size)
        if retry == 0 and replicate > 1:  # the default factor counts too, as in Disque
            if replicate_opt:
                return RETRY0_NEEDS_REPLICATE1
            return Error("%s (REPLICATE is %d by default here)" % (RETRY0_NEEDS_REPLICATE1, replicate))
        # A leaving node, or one at memory level 1 or more (memory.py), keeps no copy.
        extrepl = ctx.leaving or ctx.memory_level > 0
        additional = replicate if extrepl else replicate - 1
        available = max(len(ctx.reachable), ctx.live_nodes)
        if additional > available:
            return _not_enough_nodes(replicate, available, extrepl, ctx.leaving)
        if group is not None and retry == 0:
            bad = self._limits.check_add(group, retry)
            if bad is not None:
                return bad
        q = ctx.queues.get(queue)
        if q is not None:
            if maxlen and len(q.jobs) >= maxlen:
                return Error("MAXLEN Queue is already longer than the specified MAXLEN count "
                             "(%d jobs queued, MAXLEN %d)" % (len(q.jobs), maxlen))  # fmt: skip
            if q.flags & PAUSED_IN:
                return Error("PAUSED Queue paused in input, try later")
        now = ctx.now
        ctime = (now + ctx.wall_offset) * 1_000_000
        if ctime <= self._prev_ctime:
            ctime = self._prev_ctime + 1
        self._prev_ctime = ctime
        job = Job(
            job_id or ctx.ids.new_id(ttl, retry),
            WAIT_REPL,
            queue,
            body,
            replicate,
            ctime,
            now + ttl * 1000,
            delay,
            retry,
            # next_at in wait-repl: queued at the end of its DELAY; without one it is queued at
            # once (fresh) and meanwhile reads a RETRY from now, as Disque's SHOW says
            now + (delay or retry) * 1000,
            ctx.myself_only,
        )
        if priority:  # PRIORITY other than the default (job.py)
            job.flags = priority
        if extra is not None:  # BACKOFF, MAXDELIVER, DEADLETTER, DEDUP
            lo, hi, maxdeliver, deadletter, key = extra
            job.extra = Extra(lo or 0, hi or 0, maxdeliver or 0, deadletter, key)
        if group is not None:  # GROUP (groups.py): kept in the Extra, told by a flag
            if job.extra is None:
                job.extra = Extra()
            job.extra.group = group
            job.flags |= F_GROUP
        if extrepl:
            job.delivered = ()
        elif replicate > 1:
            job.delivered = (ctx.id,)  # its own tuple: holders get added to it
        discard_local = async_ and extrepl
        if not discard_local and not self._store.register(job):
            if job_id is not None:  # a DEDUP job made here meanwhile: that one
                return STATUS(job_id)
            return err("Internal error creating the job, check server logs")  # 144 random bits colliding: a bug
        ctx.stats["jobs_added"] += 1
        reply: object
        if (replicate > 1 or extrepl) and not async_:
            # Synchronous replication: the client waits for GOTJOB confirmations.
            job.confirmed = set() if extrepl else {ctx.id}
            self.clients[job.id] = client
            self.client_jobs[client] = job.id
            self._timer(now + REPL_ADD_NODE_MS, 0, job.id)
            if timeout:
                self._timer(now + timeout, _TIMEOUT, job.id)
            self._lifecycle.reschedule(job)
            reply = BLOCKED
        else:
            if additional > 0:
                # ASYNC: pick the other holders before queueing, as a job queued here may be
                # pushed at once to a waiting consumer node, which must learn all of them.
                self.replicate_job(job, additional, True)
                additional = 0
            if delay == 0:
                if not extrepl:
                    self._requeue.enqueue_job(job, False, True)  # fresh: a RETRY 0 one is queued once too
            else:
                job.set_state(ACTIVE)
                if not discard_local:
                    self._lifecycle.reschedule(job)
            reply = STATUS(job.id)
        if additional > 0:
            self.replicate_job(job, additional, False)
        if discard_local:
            holders = list(job.delivered)
            if holders:
                target = holders[ctx.rng.randrange(len(holders))]
                ctx.send((target,), enqueue(bytes(job.id), job.delay))
        return reply

    def replicate_job(self, job: Job, count: int, noreply: bool) -> int:
        """Add up to ``count`` new holders, then (re)send REPLJOB to every holder."""
        ctx = self.ctx
        added = 0
        new: list[str] = []
        if count > 0:
            candidates = [n for n in ctx.reachable if n not in job.delivered]
            if count < len(candidates):  # a random choice; taking them all needs no shuffle
                ctx.rng.shuffle(candidates)
                if ctx.backlogged:  # nodes whose link has output waiting last (a stable sort)
                    candidates.sort(key=ctx.backlogged.__contains__)
            new = candidates[:count]
            if new:
                job.delivered = tuple(job.delivered) + tuple(new)
                added = len(new)
        wire = job_to_wire(job, ctx.now)
        confirmed = job.confirmed or ()
        me = ctx.id
        # One message object per variant: the shell encodes a message sent to several nodes once.
        ask = repl_job(wire, bool(noreply))
        tell = repl_job(wire, True)
        backlogged = ctx.backlogged
        effects = ctx.effects
        for node in job.delivered:
            if node == me:
                continue
            acked = node in confirmed
            if acked and added == 0:
                continue
            if backlogged and node in backlogged and node not in new:
                continue  # what we sent it before has not left yet: another copy only piles up
            effects.append(Send(node, tell if acked else ask))
        return added

    # -- timers --------------------------------------------------------------------------
    def tick(self, now: int) -> None:
        timers = self.timers
        store = self._store
        while timers and timers[0][0] <= now:
            _, _, kind, job_id = heapq.heappop(timers)
            job = store.get(job_id)
            client = self.clients.get(job_id)
            if job is None or job.state != WAIT_REPL or client is None:
                continue
            if kind != _TIMEOUT:  # add a node (kind: the period just waited, 0 at first)
                added = self.replicate_job(job, 1, False)
                # Each call also re-sends REPLJOB to the holders that have not confirmed. With
                # a node added that tells them of it; with none left to add it is only a resend,
                # which backs off (doubling, up to REPL_RESEND_MAX_MS) so that copies of a big
                # job do not pile up on a link faster than the peer can take them.
                period = REPL_ADD_NODE_MS
                if not added:
                    period = min(2 * max(kind, REPL_ADD_NODE_MS), REPL_RESEND_MAX_MS)
                self._timer(now + period, period, job_id)
            else:
                self.failed(job, _repl_timeout(job))

    def next_wakeup(self) -> int | None:
        timers = self.timers
        store = self._store
        while timers:
            _, _, _, job_id = timers[0]
            job = store.get(job_id)
            if job is not None and job.state == WAIT_REPL and job_id in self.clients:
                return timers[0][0]
            heapq.heappop(timers)
        return None

    # -- outcomes ------------------------------------------------------------------------
    def failed(self, job: Job, reply: Error, deleted_elsewhere: bool = False) -> None:
        """Replication did not complete: tell the client, delete every copy. A DEDUP job is
        kept instead (``_keep``), unless ``deleted_elsewhere`` (a DELJOB: it was acknowledged
        with FASTACK or deleted on another node meanwhile, so it is done: deleted here too, its
        key remembered)."""
        ctx = self.ctx
        client = self.clients.pop(job.id, None)
        dedup = job.extra is not None and job.extra.dedup is not None and not deleted_elsewhere
        if client is not None:
            self.client_jobs.pop(client, None)
            if dedup:
                reply = Error("%s; the DEDUP job is kept with the copies made (ADDJOB again with the "
                              "same key answers its ID)" % reply)  # fmt: skip
            ctx.effects.append(Reply(client, reply))
        if dedup:
            self._keep(job)
            return
        job.set_state(ACTIVE)  # no longer replicating: delete_job leaves its client alone
        ctx.send(job.delivered, del_job(bytes(job.id)))
        self._lifecycle.delete_job(job)

    def _keep(self, job: Job) -> None:
        """A DEDUP job whose copies were not all made, or whose client left: kept and queued,
        never withdrawn. Another node may have answered its ID to a producer's retry already
        (it holds a copy), so deleting the copies could lose a job a producer was told
        exists (dedup.py)."""
        ctx = self.ctx
        job.set_state(ACTIVE)
        job.confirmed = None
        if ctx.id not in job.delivered:
            job.delivered = tuple(job.delivered) + (ctx.id,)
        if ctx.journal is not None:
            ctx.journal.append((J_LOAD, job))
        self._place(job)

    def _place(self, job: Job) -> None:
        """A job made here whose replication ended (its copies made, or kept without them):
        queued, or scheduled by its DELAY; a DEDUP job another node made too and queues
        (``F_YIELD``, dedup.py) is held as a copy is instead, requeued by its RETRY timer
        and announced with WILLQUEUE first (the node that has it queued answers QUEUED, and
        this one waits on). So of two makers whose copies were not all made in time (a
        node died, not flagged yet), one queues the job, as when their copies are made."""
        ctx = self.ctx
        if job.flags & F_YIELD:
            job.flags = (job.flags & ~F_YIELD) | F_BCAST_QUEUED | F_BCAST_WILLQUEUE
            job.next_at = retry_deadline(job, ctx.now, ctx.randbits) if job.retry else 0
            self._lifecycle.reschedule(job)
        elif job.delay == 0:
            self._requeue.enqueue_job(job, False, True)  # fresh: a RETRY 0 one is queued once too
        else:
            self._lifecycle.reschedule(job)

    def client_closed(self, client: int) -> None:
        job_id = self.client_jobs.pop(client, None)
        if job_id is None:
            return
        self.clients.pop(job_id, None)
        job = self._store.get(job_id)
        if job is not None and job.state == WAIT_REPL:
            if job.extra is not None and job.extra.dedup is not None:
                self._keep(job)
                return
            job.set_state(ACTIVE)  # no longer replicating: delete_job leaves its client alone
            self.ctx.send(job.delivered, del_job(bytes(job.id)))
            self._lifecycle.delete_job(job)

    def flushall(self) -> None:
        effects = self.ctx.effects
        for client in list(self.client_jobs):
            effects.append(Reply(client, Error("NOREPL job removed by DEBUG FLUSHALL")))
        self.client_jobs.clear()
        self.clients.clear()
        self.timers.clear()

    def acked_while_replicating(self, job: Job) -> None:
        """A job still waiting for its copies was acknowledged here (a consumer got a copy from a
        node that holds it queued, and acked it here): it is done, so its ADDJOB is answered with
        its ID now (its timers find it no longer waiting); it becomes active, to be acked next."""
        job.set_state(ACTIVE)
        client = self.clients.pop(job.id, None)
        if client is not None:
            self.client_jobs.pop(client, None)
            self.ctx.effects.append(Reply(client, STATUS(job.id)))

    def achieved(self, job: Job) -> bool:
        """Enough copies: answer the client, queue here (or hand over). False if forgotten here."""
        ctx = self.ctx
        job.set_state(ACTIVE)
        client = self.clients.pop(job.id, None)
        if client is not None:
            self.client_jobs.pop(client, None)
            ctx.effects.append(Reply(client, STATUS(job.id)))
        if ctx.id not in job.delivered:  # external replication: hand over and forget
            confirmed = sorted(job.confirmed or ())
            if confirmed:
                target = confirmed[ctx.rng.randrange(len(confirmed))]
                ctx.send((target,), enqueue(bytes(job.id), job.delay))
            self._store.unregister(job)
            return False
        job.confirmed = None
        if ctx.journal is not None:  # registered in wait-repl, which the AOF skips: now it counts
            ctx.journal.append((J_LOAD, job))
        self._place(job)
        return True

    # -- messages -----------------------------------------------------------------------
    def on_repljob(self, sender: str, m: ReplJob) -> None:
        ctx = self.ctx
        # The job array is checked here, as it is unpacked into the Job (once; see messages).
        job = job_from_wire(m.job, ctx.now)
        if job is None:
            ctx.bus_stats["messages_malformed"] += 1
            return
        if ctx.leaving or ctx.memory_level:  # no new copies here (memory.py), as in Disque
            return
        q = ctx.queues.get(job.queue)  # type: ignore[arg-type]  # a queued job has a queue
        if q is not None and q.flags & PAUSED_IN:
            return
        store = self._store
        existing = store.get(job.id)
        if existing is not None:
            merged = tuple(dict.fromkeys(tuple(existing.delivered) + job.delivered))
            learned = len(merged) != len(existing.delivered)
            if existing.delivered or existing.state != ACKED:
                existing.delivered = merged
            extra = existing.extra
            if extra is not None and extra.dedup is not None and existing.state != ACKED:
                # made there too (its maker lists itself first): one of the two queues it, and
                # every holder learns every other
                self._merge_dedup(existing, sender, bool(job.delivered) and job.delivered[0] == sender, learned)
        elif job.extra is not None and job.extra.dedup is not None and self._lifecycle.remembers(job.id):
            # a DEDUP job done and forgotten here within its window: the sender's is a repeat
            ctx.send((sender,), set_ack(bytes(job.id), len(job.delivered)))
            return
        else:
            if ctx.id not in job.delivered:
                job.delivered = job.delivered + (ctx.id,)
            job.flags |= F_BCAST_QUEUED
            if job.retry:
                job.flags |= F_BCAST_WILLQUEUE
                # its first RETRY period starts when its DELAY ends
                job.next_at = retry_deadline(job, ctx.now + job.delay * 1000, ctx.randbits)
            # else next_at stays 0 (job_from_wire): a RETRY 0 copy is never queued by a
            # timer; only a hand-over (ENQUEUE) or a move queues it, as a fresh one
            store.register(job)
            self._lifecycle.reschedule(job)
        if not m.noreply:
            ctx.send((sender,), got_job(bytes(job.id)))

    def on_gotjob(self, sender: str, m: GotJob) -> Job | None:
        """A copy confirmed. Returns a dead letter not waiting for its copies (one made by
        ``delivery.py``, whose copies it counts: ``Node`` hands it on), else None."""
        job = self._store.get(m.job_id)
        if job is None:
            return None
        if job.state != WAIT_REPL or job.confirmed is None:
            if job.extra is not None and job.extra.origin is not None:
                return job  # a dead letter's copy (Delivery.copied)
            return None
        job.confirmed.add(sender)
        if len(job.confirmed) >= job.repl:
            self.achieved(job)
        return None

    def _merge_dedup(self, job: Job, sender: str, made_there: bool, learned: bool) -> None:
        """A copy of DEDUP ``job``, held here, arrived from ``sender`` (``dedup.py``). ``learned``:
        its holders named some this node did not know: the union goes to every holder (REPLJOB,
        no reply), so that each knows all (WILLQUEUE, QUEUED and SETACK reach them all: two
        makers' copies become one job). ``made_there``: the sender made the job too (a maker
        lists itself first): of the two, the winner of the per-job comparison keeps it queued."""
        ctx = self.ctx
        if learned:
            me = ctx.id
            ctx.send([n for n in job.delivered if n != sender and n != me], repl_job(job_to_wire(job, ctx.now), True))
        if not made_there:
            return
        if compare_ids_by_job(sender, ctx.id, job.id) <= 0:
            if job.state == QUEUED:
                ctx.send((sender,), queued(bytes(job.id), 0))  # the sender yields (Requeue.on_queued)
            return
        if job.state == QUEUED:
            self._requeue.dequeue_job(job)
        elif job.state == WAIT_REPL:
            job.flags |= F_YIELD  # not queued here when its copies are made
