"""Jobs across nodes: replication, requeue de-duplication and acks GC messages.

Theory of operation (Disque's three state machines, as message handlers)
-----------------------------------------------------------------------
Replication (ADDJOB with REPLICATE > 1, or any ADDJOB on a leaving node):

* The job is created in ``wait-repl`` (synchronous) and REPLJOB goes to
  REPLICATE-1 reachable nodes picked at random (REPLICATE of them, none
  local, when replicating *externally* because this node is leaving). Every
  REPLJOB carries the list of nodes that may hold a copy.
* Each receiver registers the job ``active`` (or merges the holder list if it
  has it already) and answers GOTJOB. When GOTJOBs (plus our own copy) reach
  REPLICATE, the client gets the ID and the job is queued here; an external
  job is instead handed to one confirmed holder with ENQUEUE and forgotten.
* While confirmations are missing, one more node is added every 50 ms and
  REPLJOB is re-sent to all holders so each learns the full list. With no
  node left to add, the resends back off (100 ms doubling to 1 s), and none
  goes to a node whose link still holds output the socket has not taken
  (``Node.backlogged``, kept by the shell): the copy sent before has not
  even left, so another would only pile up behind it (a 59 MB job was once
  sent 36 times over before its two GOTJOBs came back). For the same reason
  the nodes picked for a new job are taken among the others first. If the
  ADDJOB timeout expires (or the client goes away) the job is deleted here
  and DELJOB goes, best effort, to every node that may have a copy.
* ASYNC: the client gets the ID at once, REPLJOB asks for no GOTJOB.

Requeue (every holder runs the same timers, see ``Node._process_job``):

* 500 ms before requeueing, a holder sends WILLQUEUE to the others; a node
  that has the job queued answers with QUEUED, one that has it acked
  answers SETACK.
* On requeue a holder broadcasts QUEUED (carrying "count a nack" / "count a
  delivery"); receivers push their own requeue time one RETRY further, and a
  receiver that also has it queued drops it from its queue if the sender
  wins the per-job node-ID comparison, so two holders rarely queue the same
  job. WORKING does the same without the comparison (always dequeue).

Acks (ACKJOB anywhere):

* The job turns ``acked`` (a "dummy ack" is created for an unknown
  at-least-once ID when other nodes exist) and SETACK(may_have) goes to the
  holders not yet confirmed (to every node for a dummy ack).
* A SETACK receiver acks its copy and answers GOTACK(known) when it knows no
  more holders than the sender; otherwise it runs the GC itself.
* When every holder confirmed, DELJOB(holders) goes to all of them and the
  job is deleted. Two copies (REPLICATE 2, or a moved REPLICATE 1 job): a
  SETACK to the only other holder says so, and that holder, if it knows no
  third one, deletes its copy at once and answers GOTACK(known, deleted),
  so no DELJOB follows (one message less per job; keeping the acked state
  there would protect no third copy). A holder that knows a third runs the
  GC itself, as above. A DELJOB receiver that knows holders missing from the
  list passes it on to them (FASTACK's DELJOB alike). Attempts repeat
  with exponential backoff (1 s .. 3 min) while some holder is unreachable.
* Why DELJOB lists the holders (Disque's carries only the ID): holders
  learn of each other unevenly once jobs move between nodes (a YOURJOBS
  sender records the receiver, the receiver learns the sender's list), so
  the collector may not know every copy, and the count in SETACK cannot
  tell "as many" from "the same". The copy only another holder knew was
  never deleted, and was queued and delivered again after RETRY: in a
  healthy cluster, on every random-traffic run before
  (``tests/sim/test_random_faults.py::test_random_traffic_healthy``).

Wire format: every message is ``(kind, *args)`` with msgpack-able args; a job
travels as a fixed array (``job_to_wire``: id, queue, body, repl, ttl,
ctime, delay, retry, nacks, deliveries, nodes), which packs, unpacks and
checks in half the time of a map with named fields (the receiver of a
REPLJOB spent a quarter of its time there). Anything malformed from a peer
is ignored (a peer cannot crash the node).
"""

from __future__ import annotations

import heapq
from typing import TYPE_CHECKING, Any

from .ids import valid_job_id
from .job import ACKED, ACTIVE, F_BCAST_QUEUED, F_BCAST_WILLQUEUE, QUEUED, WAIT_REPL, Job
from .queues import PAUSED_ALL, PAUSED_IN
from .effects import Reply, Send
from .replies import Error, Status

if TYPE_CHECKING:
    from .node import Node

__all__ = ["ReplicationMixin", "job_to_wire", "job_from_wire", "JOB_WIRE_FIELDS", "REPL_ADD_NODE_MS"]

REPL_ADD_NODE_MS = 50
REPL_RESEND_MAX_MS = 1000
QUEUED_INCR_NACKS = 1
QUEUED_INCR_DELIV = 2

_INT = int


def job_to_wire(job: Job, now: int) -> list:
    """The job as sent to peers: see the module docstring for the field order."""
    return [
        bytes(job.id), job.queue, job.body, job.repl, max(0, job.etime - now), job.ctime,
        job.delay, job.retry, job.nacks, job.deliveries, list(job.delivered),
    ]  # fmt: skip


JOB_WIRE_FIELDS = 11
_MAX_I64 = (1 << 63) - 1
_MAX_DELAY = 1 << 31


def job_from_wire(d: Any, now: int) -> Job | None:
    """A Job from a peer's array, or None when anything is off (extra trailing fields are ignored)."""
    if type(d) is not list or len(d) < JOB_WIRE_FIELDS:
        return None
    if len(d) > JOB_WIRE_FIELDS:
        d = d[:JOB_WIRE_FIELDS]
    job_id, queue, body, repl, ttl, ctime, delay, retry, nacks, deliv, nodes = d
    # Plain inline checks (no helper calls): this runs for every replicated or moved job.
    if not (type(job_id) is bytes and valid_job_id(job_id) and type(queue) is bytes and type(body) is bytes):
        return None
    if not (type(repl) is _INT and type(ttl) is _INT and type(ctime) is _INT and type(delay) is _INT):
        return None
    if not (type(retry) is _INT and type(nacks) is _INT and type(deliv) is _INT):
        return None
    if not (1 <= repl <= 65535 and 0 <= delay <= _MAX_DELAY and 0 <= retry <= _MAX_DELAY):
        return None
    if not (0 <= ttl <= _MAX_I64 and 0 <= ctime <= _MAX_I64 and 0 <= nacks <= _MAX_I64 and 0 <= deliv <= _MAX_I64):
        return None
    if type(nodes) is not list or len(nodes) > 65535:
        return None
    for n in nodes:
        if type(n) is not str or len(n) != 40:
            return None
    job = Job(job_id, ACTIVE, queue, body, repl, ctime, now + ttl, delay, retry, 0, tuple(dict.fromkeys(nodes)))
    job.nacks = nacks
    job.deliveries = deliv
    return job


def _compare_ids_by_job(a: str, b: str, job_id: bytes) -> int:
    """Disque's tie-break between two nodes for one job: IDs mixed with the job's random part."""
    mix = job_id[11:35]
    xa = bytes(ord(c) ^ mix[i % 24] for i, c in enumerate(a))
    xb = bytes(ord(c) ^ mix[i % 24] for i, c in enumerate(b))
    return (xa > xb) - (xa < xb)


class ReplicationMixin:
    """Cross-node job handling for ``Node`` (see the module docstring)."""

    # -- replication -----------------------------------------------------------
    def _replication_init(self: "Node") -> None:
        # job id -> client waiting for synchronous replication
        self._repl_clients: dict[bytes, int] = {}
        self._repl_client_jobs: dict[int, bytes] = {}
        # (time, seq, kind, job id): kind 1 = ADDJOB timeout, otherwise add a node (kind = the
        # period waited for this timer: 0 the first time)
        self._repl_timers: list[tuple[int, int, int, bytes]] = []
        self._repl_seq = 0

    def _repl_timer(self: "Node", at: int, kind: int, job_id: bytes) -> None:
        self._repl_seq += 1
        heapq.heappush(self._repl_timers, (at, self._repl_seq, kind, job_id))

    def replicate_job(self: "Node", job: Job, count: int, noreply: bool) -> int:
        """Add up to ``count`` new holders, then (re)send REPLJOB to every holder."""
        added = 0
        new: list[str] = []
        if count > 0:
            candidates = [n for n in self.reachable if n not in job.delivered]
            if count < len(candidates):  # a random choice; taking them all needs no shuffle
                self.rng.shuffle(candidates)
                if self.backlogged:  # nodes whose link has output waiting last (a stable sort)
                    candidates.sort(key=self.backlogged.__contains__)
            new = candidates[:count]
            if new:
                job.delivered = tuple(job.delivered) + tuple(new)
                added = len(new)
        wire = job_to_wire(job, self.now)
        confirmed = job.confirmed or ()
        me = self.id
        # One message object per variant: the shell encodes a message sent to several nodes once.
        ask = ("REPLJOB", wire, bool(noreply))
        tell = ("REPLJOB", wire, True)
        backlogged = self.backlogged
        for node in job.delivered:
            if node == me:
                continue
            acked = node in confirmed
            if acked and added == 0:
                continue
            if backlogged and node in backlogged and node not in new:
                continue  # what we sent it before has not left yet: another copy only piles up
            self._effects.append(Send(node, tell if acked else ask))
        return added

    def _repl_tick(self: "Node") -> None:
        timers = self._repl_timers
        now = self.now
        while timers and timers[0][0] <= now:
            _, _, kind, job_id = heapq.heappop(timers)
            job = self.store.get(job_id)
            client = self._repl_clients.get(job_id)
            if job is None or job.state != WAIT_REPL or client is None:
                continue
            if kind != 1:  # add a node (kind: the period just waited, 0 at first)
                added = self.replicate_job(job, 1, False)
                # Each call also re-sends REPLJOB to the holders that have not confirmed. With
                # a node added that tells them of it; with none left to add it is only a resend,
                # which backs off (doubling, up to REPL_RESEND_MAX_MS) so that copies of a big
                # job do not pile up on a link faster than the peer can take them.
                period = REPL_ADD_NODE_MS
                if not added:
                    period = min(2 * max(kind, REPL_ADD_NODE_MS), REPL_RESEND_MAX_MS)
                self._repl_timer(now + period, period, job_id)
            else:
                self._repl_failed(job, Error("NOREPL Timeout reached before replicating to the requested number of nodes"))

    def _repl_next(self: "Node") -> int | None:
        timers = self._repl_timers
        while timers:
            _, _, _, job_id = timers[0]
            job = self.store.get(job_id)
            if job is not None and job.state == WAIT_REPL and job_id in self._repl_clients:
                return timers[0][0]
            heapq.heappop(timers)
        return None

    def _repl_failed(self: "Node", job: Job, reply: Any) -> None:
        """Replication did not complete: tell the client, delete every copy."""
        client = self._repl_clients.pop(job.id, None)
        if client is not None:
            self._repl_client_jobs.pop(client, None)
            self._effects.append(Reply(client, reply))
        job.state = ACTIVE
        self._send(job.delivered, ("DELJOB", bytes(job.id)))
        self.delete_job(job)

    def repl_client_closed(self: "Node", client: int) -> None:
        job_id = self._repl_client_jobs.pop(client, None)
        if job_id is None:
            return
        self._repl_clients.pop(job_id, None)
        job = self.store.get(job_id)
        if job is not None and job.state == WAIT_REPL:
            job.state = ACTIVE
            self._send(job.delivered, ("DELJOB", bytes(job.id)))
            self.delete_job(job)

    def _replication_achieved(self: "Node", job: Job) -> bool:
        """Enough copies: answer the client, queue here (or hand over). False if forgotten here."""
        job.state = ACTIVE
        client = self._repl_clients.pop(job.id, None)
        if client is not None:
            self._repl_client_jobs.pop(client, None)
            self._effects.append(Reply(client, Status(job.id)))
        if self.id not in job.delivered:  # external replication: hand over and forget
            confirmed = sorted(job.confirmed or ())
            if confirmed:
                target = confirmed[self.rng.randrange(len(confirmed))]
                self._send((target,), ("ENQUEUE", bytes(job.id), job.delay))
            self.store.unregister(job)
            return False
        job.confirmed = None
        if job.delay == 0:
            self.enqueue_job(job)
        else:
            self._reschedule(job)
        return True

    # -- message handlers -----------------------------------------------------
    def receive_data(self: "Node", sender: str, kind: str, body: Any, now: int) -> None:
        """A job-layer message from another node; malformed ones are dropped."""
        self.now = now
        handler = self._handlers.get(kind)
        if handler is not None and type(body) is list and type(sender) is str:
            try:
                handler(sender, body)
            except (TypeError, ValueError, IndexError, KeyError):
                pass  # a peer's malformed message: ignore it, keep serving
        if self._ready:
            self._serve_ready()
        if self._outgoing:
            self._flush_outgoing()

    def _job_arg(self: "Node", body: list) -> Job | None:
        """The stored job a peer's message names, or None. No shape check beyond the type:
        only valid IDs are ever stored, so a malformed one is simply not found."""
        job_id = body[0]
        if type(job_id) is not bytes:
            return None
        return self.store.get(job_id)

    def on_repljob(self: "Node", sender: str, body: list) -> None:
        wire, noreply = body[0], body[1]
        if self.leaving:
            return
        job = job_from_wire(wire, self.now)
        if job is None:
            return
        q = self.queues.get(job.queue)
        if q is not None and q.flags & PAUSED_IN:
            return
        existing = self.store.get(job.id)
        if existing is not None:
            merged = tuple(dict.fromkeys(tuple(existing.delivered) + job.delivered))
            if existing.delivered or existing.state != ACKED:
                existing.delivered = merged
        else:
            if self.id not in job.delivered:
                job.delivered = job.delivered + (self.id,)
            job.flags |= F_BCAST_QUEUED
            if job.retry:
                job.flags |= F_BCAST_WILLQUEUE
                job.qtime = self.now + (job.delay + job.retry) * 1000 + self._time_error()
            else:
                job.qtime = 0
            self.store.register(job)
            self._reschedule(job)
        if not noreply:
            self._send((sender,), ("GOTJOB", bytes(job.id)))

    def on_gotjob(self: "Node", sender: str, body: list) -> None:
        job = self._job_arg(body)
        if job is None or job.state != WAIT_REPL or job.confirmed is None:
            return
        job.confirmed.add(sender)
        if len(job.confirmed) >= job.repl:
            self._replication_achieved(job)

    def on_enqueue(self: "Node", sender: str, body: list) -> None:
        job = self._job_arg(body)
        delay = body[1]
        if job is None or job.state >= QUEUED or type(delay) is not int:
            return
        q = self.queues.get(job.queue)
        if q is not None and q.flags & PAUSED_IN:
            return
        job.flags &= ~F_BCAST_QUEUED
        if delay <= 0:
            if job.qtime == 0 and job.retry == 0:
                job.qtime = self.now  # an at-most-once job handed over: queue it once
            self.enqueue_job(job)
        elif job.retry and job.qtime:
            job.qtime = self.now + delay * 1000
            self._reschedule(job)

    def _postpone(self: "Node", job: Job) -> None:
        if job.retry and job.qtime:
            job.flags |= F_BCAST_WILLQUEUE
            job.qtime = self.now + job.retry * 1000 + self._time_error()
            self._reschedule(job)

    def on_queued(self: "Node", sender: str, body: list) -> None:
        job = self._job_arg(body)
        flags = body[1]
        if job is None or type(flags) is not int:
            return
        if job.state == ACKED:
            self._send_lazy((sender,), ("SETACK", bytes(job.id), len(job.delivered)))
            return
        if job.state == QUEUED and _compare_ids_by_job(sender, self.id, job.id) > 0:
            self.dequeue_job(job)
        self._postpone(job)
        if flags & QUEUED_INCR_NACKS:
            job.nacks += 1
        if flags & QUEUED_INCR_DELIV:
            job.deliveries += 1

    def on_working(self: "Node", sender: str, body: list) -> None:
        job = self._job_arg(body)
        if job is None:
            return
        if job.state == ACKED:
            self._send_lazy((sender,), ("SETACK", bytes(job.id), len(job.delivered)))
            return
        if job.state == QUEUED:
            self.dequeue_job(job)
        self._postpone(job)

    def on_willqueue(self: "Node", sender: str, body: list) -> None:
        job = self._job_arg(body)
        if job is None:
            return
        if job.state in (ACTIVE, QUEUED) and sender not in job.delivered:
            job.delivered = tuple(job.delivered) + (sender,)
        if job.state == QUEUED:
            self._send(job.delivered, ("QUEUED", bytes(job.id), 0))
        elif job.state == ACKED:
            self._send_lazy((sender,), ("SETACK", bytes(job.id), len(job.delivered)))

    def on_setack(self: "Node", sender: str, body: list) -> None:
        job_id, may_have = body[0], body[1]
        if type(job_id) is not bytes or type(may_have) is not int:
            return
        job = self.store.get(job_id)
        if job is None and not valid_job_id(job_id):
            return  # never echo a malformed ID back (stored IDs are well formed)
        if job is not None:
            if job.state == WAIT_REPL:
                if not self._replication_achieved(job):
                    return
            if len(body) > 2 and body[2] is True and all(n == sender or n == self.id for n in job.delivered):
                # The sender's only other holder is this node, and this node knows no other
                # holder either: once acked here nobody needs this copy, so it goes now, and
                # the GOTACK says so; the sender then sends no DELJOB (one message less for
                # every job with two copies: REPLICATE 2, or a moved REPLICATE 1 job).
                self.acknowledge(job, schedule_gc=False)
                self.delete_job(job)
                self._send_lazy((sender,), ("GOTACK", job_id, True, True))
                return
            self.acknowledge(job)
        if job is None or len(job.delivered) <= may_have:
            self._send_lazy((sender,), ("GOTACK", job_id, job is not None))
        else:
            if may_have == 0:
                self._send_lazy((sender,), ("GOTACK", job_id, True))
            self.try_gc(job)

    def on_gotack(self: "Node", sender: str, body: list) -> None:
        job = self._job_arg(body)
        known = body[1]
        if job is None or type(known) is not bool or job.state != ACKED:
            return
        dummy = not job.delivered
        if dummy and known:
            self.delete_job(job)  # a node that knows the job will collect it
            return
        if known or sender in job.delivered:
            if sender not in job.delivered:
                job.delivered = tuple(job.delivered) + (sender,)
            if job.confirmed is not None:
                job.confirmed.add(sender)
        if not known and dummy:
            if job.confirmed is None:
                job.confirmed = {self.id}
            job.confirmed.add(sender)
            if self._dummy_unknown_everywhere(job):
                self.delete_job(job)  # nobody knows this ID: drop the dummy ack
            return
        if not dummy and job.confirmed is not None and len(job.confirmed) >= len(job.delivered):
            if len(body) > 2 and body[2] is True:
                # the sender deleted its copy already (it was our only other holder, on_setack)
                others = [n for n in job.delivered if n != sender and n != self.id]
            else:
                others = job.delivered
            if others:
                self._send_lazy(others, ("DELJOB", bytes(job.id), list(job.delivered)))
            self.delete_job(job)

    def on_pause(self: "Node", sender: str, body: list) -> None:
        name, flags = body[0], body[1]
        if type(name) is not bytes or type(flags) is not int:
            return
        q = self.queues.get(name)
        if q is None:
            if not flags & PAUSED_ALL:
                return
            q = self._get_queue(name)
        self.set_pause(q, flags & PAUSED_ALL)

    def on_deljob(self: "Node", sender: str, body: list) -> None:
        job = self._job_arg(body)
        if job is not None:
            if job.state == WAIT_REPL:  # deleted elsewhere (FASTACK) while replicating
                self._repl_failed(
                    job, Error("NOREPL job removed (expired?) before the requested replication level was achieved")
                )
                return
            # The sender lists the holders it told: pass the DELJOB on to those we know and it did
            # not (a copy moved on from here, say), or that copy would come back after RETRY.
            told = body[1] if len(body) > 1 else None
            if type(told) is list:
                me = self.id
                others = [n for n in job.delivered if n not in told and n != sender and n != me]
                if others:
                    self._send_lazy(others, ("DELJOB", bytes(job.id), told + others))
            self.delete_job(job)
        elif type(body[0]) is bytes and valid_job_id(body[0]):
            self._bury(body[0])  # not here (yet): a copy moving in right after is dead already
