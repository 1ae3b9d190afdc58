"""Node: one Disque node's job and queue state, as a synchronous state machine.

Theory of operation
-------------------
The shell feeds three kinds of input, each stamped with the current time
(monotonic milliseconds):

* ``execute(client, argv, now)``: a client command. Returns the reply value
  for that client, or ``BLOCKED`` when the client must wait (GETJOB with no
  job). Replies for other clients produced meanwhile (a blocked GETJOB served
  by this ADDJOB) are queued as effects.
* ``tick(now)``: time passed. Runs every job timer that is due (requeue after
  RETRY, queueing after DELAY, expiry after TTL, ack GC retries), times out
  blocked clients, and evicts idle empty queues.
* ``client_closed(client)``: a connection went away; any GETJOB it was
  blocked in disappears without a trace.

After any input the shell calls ``take_effects()`` and carries them out, then
sleeps until ``next_wakeup()`` or the next input. The node owns no socket,
task or clock; wall-clock time is ``now + wall_offset`` (the shell measures
the offset once), used only for job ``ctime``.

Invariants (checked by tests, named here so code can refer to them):

* AT_MOST_ONCE: a job with RETRY 0 is queued at most once, ever, on a node
  (``qtime`` becomes 0 the first time it is queued; a delivered RETRY 0 job
  refuses ENQUEUE/NACK).
* ACK_ONCE: a job goes to ``acked`` at most once and never leaves it.
* ONE_TIMER: each registered job has exactly one pending wake-up
  (``Job.awake``) in the store's schedule.

Cluster behaviour (replication, federation, acks GC across nodes) plugs in
through ``cluster_size`` / ``reachable`` and the ``_send`` method, which
turns cluster messages into ``Send`` effects for the bus layer. On a single
node both are empty and every ack is collected at once.
"""

from __future__ import annotations

import heapq
import random
from collections import deque
from bisect import bisect_left
from collections.abc import Callable, Iterable
from itertools import islice
from typing import Any

from . import ids as ids_mod
from .commands import (
    NOT_AN_INTEGER,
    RETRY0_NEEDS_REPLICATE1,
    SYNTAX_ERROR,
    check_job_ids,
    parse_addjob,
    parse_getjob,
    parse_int,
    parse_jscan,
    parse_qscan,
)
from .effects import BLOCKED, Reply, Send
from .job import (
    ACKED,
    ACTIVE,
    F_BCAST_QUEUED,
    F_BCAST_WILLQUEUE,
    F_DELIVERED,
    QUEUED,
    STATE_NAMES,
    WAIT_REPL,
    Job,
)
from .queues import PAUSED_ALL, PAUSED_IN, PAUSED_OUT, Queue, Waiter, pause_name
from .federation import CLIENTS_WAITING, REACHED_ZERO, FederationMixin
from .replication import QUEUED_INCR_DELIV, QUEUED_INCR_NACKS, REPL_ADD_NODE_MS, ReplicationMixin
from .replies import NULL_ARRAY, Error, Status, err
from .store import JobStore, seq_of

__all__ = ["Node", "BLOCKED"]

WILLQUEUE_ADVANCE_MS = 500
TIME_ERROR_MS = 500  # requeue times are desynchronised by +-250 ms
GC_RETRY_MIN_MS = 1000
GC_RETRY_MAX_MS = 180_000
GC_RETRY_COUNT_MAX = 10
# From this GC attempt of an ack on (about 6 s after it), a holder that is not in this node's
# table at all (forgotten with CLUSTER FORGET) counts as confirmed; see try_gc.
GC_UNKNOWN_HOLDER_ATTEMPT = 3
# Ack garbage-collection messages (SETACK, GOTACK, DELJOB) wait up to this
# long so that those of many jobs share one bus frame and one wake-up of the
# peer; nothing waits on them but memory (see docs/ARCHITECTURE.md).
GC_MESSAGE_DELAY_MS = 5
GC_MESSAGE_BATCH_MAX = 1024
QUEUE_MAX_IDLE_MS = 300_000
QUEUE_GC_PERIOD_MS = 1000
QUEUE_GC_BATCH = 1000  # queues checked per pass at least; more when there are many (QUEUE_GC_ROUND_S)
QUEUE_GC_ROUND_S = 60  # every queue is checked at least this often
QUEUE_SHRINK_IDLE_MS = 10_000  # an empty queue idle this long gives back its sorted list
DEFAULT_REPLICATE_MAX = 3
SCHEDULE_BATCH = 10_000
# The ID of a job deleted here (or FASTACKed, or named by a DELJOB, while not held here) is
# remembered this long, at most TOMBSTONES_MAX of them, so that a copy still on its way here in a
# YOURJOBS is dropped instead of being queued as new (see Node._bury).
TOMBSTONE_MS = 2000
TOMBSTONES_MAX = 100_000

Handler = Callable[[int, list], Any]


class Node(ReplicationMixin, FederationMixin):
    def __init__(
        self,
        node_id: str,
        *,
        seed: bytes,
        now: int,
        wall_offset: int = 0,
        address: tuple[str, int] = ("127.0.0.1", 7711),
    ) -> None:
        self.id = node_id
        self.now = now
        self.wall_offset = wall_offset
        self.address = address
        self.rng = random.Random(seed)
        self._random = self.rng.random
        self.ids = ids_mod.JobIdGenerator(node_id, seed)
        self.store = JobStore()
        self.queues: dict[bytes, Queue] = {}
        self.leaving = False
        # Cluster view; the membership layer keeps these current.
        self.cluster_size = 1
        self.reachable: list[str] = []  # other nodes we can talk to now
        # Nodes whose link holds output its socket has not taken yet, as of the last tick (the
        # shell sets it before each): REPLJOB resends skip them, new copies go elsewhere first.
        self.backlogged: frozenset[str] | set[str] = frozenset()
        self.known_nodes: list[str] = [node_id]
        # (id, ip, port, priority) for HELLO; None = just myself.
        self.hello_nodes: list[tuple[str, str, int, int]] | None = None
        self._myself_only = (node_id,)
        self._seed = seed
        self._queue_seq = 0
        self._prev_ctime = 0
        self._effects: list[Any] = []
        self._lazy: list[Any] = []  # Sends held back until _lazy_at (GC_MESSAGE_DELAY_MS)
        self._lazy_at = 0
        self._ready: dict[bytes, Queue] = {}
        self._blocked: dict[int, Waiter] = {}
        self._waited: dict[bytes, Queue] = {}  # queues with blocked clients (q.blocked > 0)
        self._tombstones: dict[bytes, int] = {}  # recently dead job id -> forget at (ms)
        # (forget at, id) oldest first: a dict emptied from the front makes each next(iter()) walk
        # the holes left there (it showed up at 3 % of a node's time)
        self._tomb_order: deque[tuple[int, bytes]] = deque()
        self._deadlines: list[tuple[int, int, Waiter]] = []
        self._deadline_seq = 0
        self._next_queue_gc = now + QUEUE_GC_PERIOD_MS
        self._queue_gc_pos = 0
        self.stats = {
            "jobs_added": 0,
            "jobs_delivered": 0,
            "jobs_acked": 0,
            "jobs_expired": 0,
            "jobs_requeued": 0,
        }
        self._replication_init()
        self._federation_init()
        self._handlers: dict[str, Callable[[str, list], None]] = {
            "REPLJOB": self.on_repljob,
            "GOTJOB": self.on_gotjob,
            "ENQUEUE": self.on_enqueue,
            "QUEUED": self.on_queued,
            "WORKING": self.on_working,
            "WILLQUEUE": self.on_willqueue,
            "SETACK": self.on_setack,
            "GOTACK": self.on_gotack,
            "DELJOB": self.on_deljob,
            "PAUSE": self.on_pause,
            "NEEDJOBS": self.on_needjobs,
            "YOURJOBS": self.on_yourjobs,
        }
        self.commands: dict[bytes, tuple[Handler, int]] = {
            b"addjob": (self.cmd_addjob, -4),
            b"getjob": (self.cmd_getjob, -2),
            b"ackjob": (self.cmd_ackjob, -1),
            b"fastack": (self.cmd_fastack, -1),
            b"deljob": (self.cmd_deljob, -1),
            b"show": (self.cmd_show, 2),
            b"qlen": (self.cmd_qlen, 2),
            b"qpeek": (self.cmd_qpeek, 3),
            b"qstat": (self.cmd_qstat, 2),
            b"qscan": (self.cmd_qscan, -1),
            b"jscan": (self.cmd_jscan, -1),
            b"enqueue": (self.cmd_enqueue, -1),
            b"nack": (self.cmd_nack, -1),
            b"dequeue": (self.cmd_dequeue, -1),
            b"working": (self.cmd_working, 2),
            b"pause": (self.cmd_pause, -3),
            b"hello": (self.cmd_hello, 1),
        }

    # =====================================================================
    # Inputs
    # =====================================================================
    def execute(self, client: int, argv: list[bytes], now: int) -> Any:
        """Run one client command; returns its reply or ``BLOCKED``."""
        self.now = now
        name = argv[0].lower()
        entry = self.commands.get(name)
        if entry is None:
            return err("unknown command '%s'" % argv[0].decode("utf-8", "replace")[:128])
        handler, arity = entry
        n = len(argv)
        if (arity > 0 and n != arity) or n < -arity:
            return err("wrong number of arguments for '%s' command" % name.decode())
        reply = handler(client, argv)
        if self._ready:
            self._serve_ready()
        if self._outgoing:
            self._flush_outgoing()
        return reply

    def tick(self, now: int) -> None:
        """Run everything that is due at ``now``."""
        self.now = now
        if self._repl_timers:
            self._repl_tick()
        due = self.store.pop_due(now, SCHEDULE_BATCH)
        for job in due:
            self._process_job(job)
        deadlines = self._deadlines
        while deadlines and deadlines[0][0] <= now:
            _, _, waiter = heapq.heappop(deadlines)
            if waiter.active:
                self._unblock(waiter)
                self._effects.append(Reply(waiter.client, NULL_ARRAY))
        order = self._tomb_order
        while order and order[0][0] <= now:
            self._unbury_oldest()
        if now >= self._next_queue_gc:
            self._gc_queues()
            if self._leases:
                self._gc_leases()
            self._next_queue_gc = now + QUEUE_GC_PERIOD_MS
        if self._blocked and self.cluster_size > 1:
            self._federation_tick()
        if self._ready:
            self._serve_ready()
        if self._outgoing:
            self._flush_outgoing()
        if self._lazy_at and now >= self._lazy_at:
            self._flush_lazy()

    def client_closed(self, client: int) -> None:
        waiter = self._blocked.get(client)
        if waiter is not None:
            self._unblock(waiter)
        if client in self._repl_client_jobs:
            self.repl_client_closed(client)

    def take_effects(self) -> list[Any]:
        effects = self._effects
        if effects:
            self._effects = []
        return effects

    def next_wakeup(self) -> int | None:
        """Monotonic ms of the next due timer, or None if nothing is pending."""
        best = self.store.next_awake()
        deadlines = self._deadlines
        while deadlines and not deadlines[0][2].active:
            heapq.heappop(deadlines)
        if deadlines and (best is None or deadlines[0][0] < best):
            best = deadlines[0][0]
        if (self.queues or self._leases) and (best is None or self._next_queue_gc < best):
            best = self._next_queue_gc
        if self._lazy_at and (best is None or self._lazy_at < best):
            best = self._lazy_at
        repl = self._repl_next() if self._repl_timers else None
        if repl is not None and (best is None or repl < best):
            best = repl
        if self._blocked and self.cluster_size > 1:
            need = max(self._next_need, self.now + 1)
            if best is None or need < best:
                best = need
        return best

    # =====================================================================
    # Introspection used by the shell (INFO, CLIENT LIST ...)
    # =====================================================================
    @property
    def blocked_clients(self) -> int:
        return len(self._blocked) + len(self._repl_client_jobs)

    def is_blocked(self, client: int) -> bool:
        return client in self._blocked or client in self._repl_client_jobs

    def flushall(self) -> None:
        """DEBUG FLUSHALL: forget every job and queue; waiters get a timeout reply."""
        for waiter in list(self._blocked.values()):
            self._unblock(waiter)
            self._effects.append(Reply(waiter.client, NULL_ARRAY))
        for client, job_id in list(self._repl_client_jobs.items()):
            self._effects.append(Reply(client, Error("NOREPL job removed by DEBUG FLUSHALL")))
        self._repl_client_jobs.clear()
        self._repl_clients.clear()
        self._repl_timers.clear()
        self.store.clear()
        self.queues.clear()
        self._waited.clear()
        self._tombstones.clear()
        self._tomb_order.clear()
        self._ready.clear()
        self._deadlines.clear()

    # =====================================================================
    # Helpers: time, queues, scheduling
    # =====================================================================
    def _time_error(self) -> int:
        # random() is C; randrange() is pure Python and showed up at 10 %
        # of ADDJOB time in profiles.
        return int(self._random() * TIME_ERROR_MS) - TIME_ERROR_MS // 2

    def wall_ms(self) -> int:
        return self.now + self.wall_offset

    def _get_queue(self, name: bytes) -> Queue:
        q = self.queues.get(name)
        if q is None:
            self._queue_seq += 1
            q = Queue(name, self.now, self._queue_seq)
            self.queues[name] = q
        return q

    def _reschedule(self, job: Job) -> None:
        """Recompute the job's single wake-up time from its state (ONE_TIMER)."""
        at = job.etime
        state = job.state
        if state == ACKED:
            if job.qtime and job.qtime < at:  # qtime = next GC attempt for acked jobs
                at = job.qtime
        elif (state == ACTIVE or state == QUEUED) and job.qtime:
            qtime = job.qtime
            if job.flags & F_BCAST_WILLQUEUE:
                qtime -= WILLQUEUE_ADVANCE_MS
            if qtime < at:
                at = qtime
        self.store.schedule(job, at if at > 0 else 1)

    def _send(self, nodes, message: tuple) -> None:
        me = self.id
        for node in nodes:
            if node != me:
                self._effects.append(Send(node, message))

    def _send_lazy(self, nodes, message: tuple) -> None:
        """Like ``_send``, for ack GC messages: they leave within GC_MESSAGE_DELAY_MS."""
        me = self.id
        lazy = self._lazy
        for node in nodes:
            if node != me:
                lazy.append(Send(node, message))
        if lazy:
            if len(lazy) >= GC_MESSAGE_BATCH_MAX:
                self._flush_lazy()
            elif not self._lazy_at:
                self._lazy_at = self.now + GC_MESSAGE_DELAY_MS

    def _flush_lazy(self) -> None:
        self._effects.extend(self._lazy)
        self._lazy = []
        self._lazy_at = 0

    # =====================================================================
    # Job lifecycle (queue.c / job.c / ack.c of Disque, as state transitions)
    # =====================================================================
    def enqueue_job(self, job: Job, nack: bool = False) -> bool:
        """Put a job in its queue. False if already queued or never again (AT_MOST_ONCE)."""
        if job.state == QUEUED or job.qtime == 0:
            return False
        if job.retry == 0 and job.flags & F_DELIVERED:
            return False
        job.state = QUEUED
        now = self.now
        if job.retry:
            if len(job.delivered) > 1:
                job.flags |= F_BCAST_WILLQUEUE
            job.qtime = now + job.retry * 1000 + self._time_error()
        else:
            job.qtime = 0  # AT_MOST_ONCE: never again
        if job.flags & F_BCAST_QUEUED or nack:
            self._send(job.delivered, ("QUEUED", bytes(job.id), QUEUED_INCR_NACKS if nack else QUEUED_INCR_DELIV))
            if nack:
                job.nacks += 1
            else:
                job.deliveries += 1
                self.stats["jobs_requeued"] += 1
        else:
            job.flags |= F_BCAST_QUEUED
        self._reschedule(job)
        q = self.queues.get(job.queue) or self._get_queue(job.queue)
        q.atime = now
        if not q.blocked and self._leases and q.name in self._leases and self._push_if_wanted(q, job):
            return True  # a consumer waits on another node: sent there, never in the queue here
        q.add(job)
        if q.blocked and not q.flags & PAUSED_OUT:
            self._ready[q.name] = q
        return True

    def dequeue_job(self, job: Job) -> bool:
        if job.state != QUEUED:
            return False
        q = self.queues.get(job.queue)
        if q is not None:
            q.remove(job)
        job.state = ACTIVE
        return True

    def _fetch(self, q: Queue) -> Job | None:
        job = q.pop()
        if job is not None:
            job.state = ACTIVE
            job.flags |= F_DELIVERED
            q.atime = self.now
            self.stats["jobs_delivered"] += 1
        return job

    def delete_job(self, job: Job) -> None:
        """Forget a job entirely on this node (expiry, DELJOB, FASTACK, GC)."""
        if not self.store.unregister(job):
            return
        self._bury(job.id)
        if job.state == QUEUED:
            q = self.queues.get(job.queue)
            if q is not None:
                q.remove(job)
        elif job.state == WAIT_REPL:  # e.g. its TTL ended while replicating
            client = self._repl_clients.pop(job.id, None)
            if client is not None:
                self._repl_client_jobs.pop(client, None)
                self._effects.append(Reply(client, Error(
                    "NOREPL job removed (expired?) before the requested replication level was achieved")))
                self._send(job.delivered, ("DELJOB", bytes(job.id)))

    def _dummy_unknown_everywhere(self, job: Job) -> bool:
        """A dummy ack's end: every node still known said it does not know the ID (one forgotten
        meanwhile, CLUSTER FORGET, is no longer asked and will not answer), or we are alone."""
        confirmed = job.confirmed
        return self.cluster_size == 1 or all(n in confirmed for n in self.known_nodes)

    def _bury(self, job_id: bytes) -> None:
        """Remember a dead job's ID for TOMBSTONE_MS: a copy of it moving in meanwhile is dropped."""
        at = self.now + TOMBSTONE_MS
        self._tombstones[job_id] = at
        order = self._tomb_order
        order.append((at, job_id))
        if len(order) > TOMBSTONES_MAX:
            self._unbury_oldest()

    def _unbury_oldest(self) -> None:
        at, job_id = self._tomb_order.popleft()
        if self._tombstones.get(job_id) == at:  # not buried again since
            del self._tombstones[job_id]

    def acknowledge(self, job: Job, schedule_gc: bool = True) -> None:
        """ACK_ONCE: move a job to acked (dequeuing it) and schedule its GC.

        ``schedule_gc=False`` is for a caller that runs ``try_gc`` at once,
        which schedules the next attempt itself (or deletes the job).
        """
        if job.state == ACKED:
            return
        if job.state == QUEUED:
            self.dequeue_job(job)
        job.state = ACKED
        job.confirmed = None
        self.stats["jobs_acked"] += 1
        if schedule_gc:
            # qtime is the next GC attempt for an acked job. Always schedule one:
            # a node acked through SETACK may never hear the final DELJOB (lost
            # message), and only its own GC attempts will collect the ack.
            job.qtime = self.now + min(GC_RETRY_MIN_MS << job.gc_retry, GC_RETRY_MAX_MS) + self._time_error()
            self._reschedule(job)

    def try_gc(self, job: Job) -> None:
        """One garbage-collection attempt for an acked job."""
        if job.state != ACKED:
            return
        dummy = not job.delivered
        if job.gc_retry < GC_RETRY_COUNT_MAX:
            job.gc_retry += 1
        if job.confirmed is None:
            job.confirmed = {self.id}
        if job.gc_retry >= GC_UNKNOWN_HOLDER_ATTEMPT and not dummy:
            # A holder that lost its memory comes back under a new ID, so its old ID never
            # confirms: once the operator forgets it (CLUSTER FORGET, on every node as in
            # Disque), it is in no node table, and waiting for it would keep the ack until its
            # TTL. Not at the first attempts: a node that joined a moment ago may be unknown here
            # for the time gossip takes. A node known again (forgotten by mistake) counts again.
            known = self.known_nodes
            for n in job.delivered:
                if n not in known:
                    job.confirmed.add(n)
        done = self._dummy_unknown_everywhere(job) if dummy else len(job.confirmed) >= len(job.delivered)
        if done:
            self.delete_job(job)
            return
        delivered = job.delivered
        targets = delivered or self.known_nodes
        confirmed = job.confirmed
        if len(delivered) == 2 and self.id in delivered:
            # one other holder: it may delete its copy at once (ReplicationMixin.on_setack)
            message: tuple = ("SETACK", bytes(job.id), 2, True)
        else:
            message = ("SETACK", bytes(job.id), len(delivered))
        self._send_lazy([n for n in targets if n not in confirmed], message)
        period = min(GC_RETRY_MIN_MS << job.gc_retry, GC_RETRY_MAX_MS)
        job.qtime = self.now + period + self._time_error()
        self._reschedule(job)

    def _process_job(self, job: Job) -> None:
        """A job's wake-up time came (its heap entry was consumed)."""
        now = self.now
        if job.etime <= now:
            self.stats["jobs_expired"] += 1
            self.delete_job(job)
            return
        state = job.state
        if (state == ACTIVE or state == QUEUED) and job.flags & F_BCAST_WILLQUEUE and job.qtime - WILLQUEUE_ADVANCE_MS <= now:
            if state != QUEUED:
                self._send(job.delivered, ("WILLQUEUE", bytes(job.id)))
            job.flags &= ~F_BCAST_WILLQUEUE
        if state == ACTIVE and job.qtime and job.qtime <= now:
            q = self.queues.get(job.queue)
            if job.retry and q is not None and q.flags & PAUSED_IN:
                job.qtime = now + job.retry * 1000 + self._time_error()
            else:
                self.enqueue_job(job)
        if job.state == QUEUED and job.qtime and job.qtime <= now and job.retry:
            # Still queued at requeue time: nobody fetched it; just move on.
            if len(job.delivered) > 1:
                job.flags |= F_BCAST_WILLQUEUE
            job.qtime = now + job.retry * 1000 + self._time_error()
        if job.state == ACKED:
            self.try_gc(job)
            if self.store.get(job.id) is not job:
                return
        self._reschedule(job)

    # =====================================================================
    # Blocking
    # =====================================================================
    def _block(self, client: int, queues: list[bytes], timeout: int, count: int, withcounters: bool) -> Any:
        names = list(dict.fromkeys(queues))
        deadline = self.now + timeout if timeout else 0
        waiter = Waiter(client, names, deadline, count, withcounters)
        waited = self._waited
        for name in names:
            q = self._get_queue(name)
            q.add_waiter(waiter)
            q.atime = self.now
            waited[name] = q
        previous = self._blocked.get(client)
        if previous is not None:  # cannot happen through the shell; be safe
            self._unblock(previous)
        self._blocked[client] = waiter
        if deadline:
            self._deadline_seq += 1
            heapq.heappush(self._deadlines, (deadline, self._deadline_seq, waiter))
        return BLOCKED

    def _unblock(self, waiter: Waiter) -> None:
        if not waiter.active:
            return
        waiter.active = False
        if self._blocked.get(waiter.client) is waiter:
            del self._blocked[waiter.client]
        for name in waiter.queues:
            q = self.queues.get(name)
            if q is not None:
                q.blocked -= 1
                if q.blocked == 0:
                    q.clear_waiters()
                    self._waited.pop(name, None)

    def _serve_ready(self) -> None:
        """Hand queued jobs to blocked clients, first come first served."""
        ready = self._ready
        while ready:
            _, q = ready.popitem()
            if q.flags & PAUSED_OUT:
                continue
            while q.blocked and q.jobs:
                waiter = q.first_waiter()
                if waiter is None:
                    break
                items = []
                while len(items) < waiter.count:
                    job = self._fetch(q)
                    if job is None:
                        break
                    items.append(self._job_item(job, waiter.withcounters))
                self._unblock(waiter)
                self._effects.append(Reply(waiter.client, items))
            if not q.jobs and self.cluster_size > 1:
                self.need_jobs(q, REACHED_ZERO)

    # =====================================================================
    # Replies
    # =====================================================================
    @staticmethod
    def _job_item(job: Job, withcounters: bool) -> list:
        if withcounters:
            return [job.queue, job.id, job.body, b"nacks", job.nacks, b"additional-deliveries", job.deliveries]
        return [job.queue, job.id, job.body]

    def _job_info(self, job: Job) -> list:
        now = self.now
        ttl = max(0, (job.etime - now) // 1000)
        if job.state == ACKED or not job.qtime:
            next_requeue = None
        else:
            next_requeue = max(0, job.qtime - now)
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
        ]  # fmt: skip

    # =====================================================================
    # Commands
    # =====================================================================
    def cmd_addjob(self, client: int, argv: list[bytes]) -> Any:
        req = parse_addjob(argv)
        if type(req) is Error:
            return req
        replicate = req.replicate or min(DEFAULT_REPLICATE_MAX, self.cluster_size)
        if req.retry == 0 and replicate > 1:  # the default factor counts too, as in Disque
            return RETRY0_NEEDS_REPLICATE1
        extrepl = self.leaving
        additional = replicate if extrepl else replicate - 1
        if additional > len(self.reachable):
            if extrepl and additional - 1 == len(self.reachable):
                return Error(
                    "NOREPL Not enough reachable nodes for the requested replication level, "
                    "since I'm unable to hold a copy of the message for the following reason: "
                    "I'm leaving the cluster"
                )
            return Error("NOREPL Not enough reachable nodes for the requested replication level")
        q = self.queues.get(req.queue)
        if q is not None:
            if req.maxlen and len(q.jobs) >= req.maxlen:
                return Error("MAXLEN Queue is already longer than the specified MAXLEN count")
            if q.flags & PAUSED_IN:
                return Error("PAUSED Queue paused in input, try later")
        now = self.now
        ctime = (now + self.wall_offset) * 1_000_000
        if ctime <= self._prev_ctime:
            ctime = self._prev_ctime + 1
        self._prev_ctime = ctime
        job = Job(
            self.ids.new_id(req.ttl, req.retry),
            WAIT_REPL,
            req.queue,
            req.body,
            replicate,
            ctime,
            now + req.ttl * 1000,
            req.delay,
            req.retry,
            now + (req.delay or req.retry) * 1000,
            self._myself_only,
        )
        if extrepl:
            job.delivered = ()
        elif replicate > 1:
            job.delivered = (self.id,)  # its own tuple: holders get added to it
        discard_local = req.async_ and extrepl
        if not discard_local and not self.store.register(job):  # 144 random bits colliding: a bug
            return err("Internal error creating the job, check server logs")
        self.stats["jobs_added"] += 1
        reply: Any
        if (replicate > 1 or extrepl) and not req.async_:
            # Synchronous replication: the client waits for GOTJOB confirmations.
            job.confirmed = set() if extrepl else {self.id}
            self._repl_clients[job.id] = client
            self._repl_client_jobs[client] = job.id
            self._repl_timer(now + REPL_ADD_NODE_MS, 0, job.id)
            if req.timeout:
                self._repl_timer(now + req.timeout, 1, job.id)
            self._reschedule(job)
            reply = BLOCKED
        else:
            if additional > 0:
                # ASYNC: pick the other holders before queueing, as a job queued here may be
                # pushed at once to a waiting consumer node, which must learn all of them.
                self.replicate_job(job, additional, True)
                additional = 0
            if req.delay == 0:
                if not extrepl:
                    self.enqueue_job(job)
            else:
                job.state = ACTIVE
                if not discard_local:
                    self._reschedule(job)
            reply = Status(job.id)
        if additional > 0:
            self.replicate_job(job, additional, False)
        if discard_local:
            holders = list(job.delivered)
            if holders:
                target = holders[self.rng.randrange(len(holders))]
                self._send((target,), ("ENQUEUE", bytes(job.id), job.delay))
        return reply

    def cmd_getjob(self, client: int, argv: list[bytes]) -> Any:
        req = parse_getjob(argv)
        if type(req) is Error:
            return req
        items: list = []
        count = req.count
        withcounters = req.withcounters
        queues = self.queues
        federated = self.cluster_size > 1
        while True:
            before = len(items)
            for name in req.queues:
                q = queues.get(name)
                if q is None or q.flags & PAUSED_OUT or not q.jobs:
                    continue
                job = self._fetch(q)
                items.append(self._job_item(job, withcounters))
                if federated:
                    if not q.jobs:
                        self.need_jobs(q, REACHED_ZERO)
                    elif q.asked:
                        self._renew_on_take(q)
                count -= 1
                if count == 0:
                    break
            if count == 0 or len(items) == before:
                break
        if items:
            if self._outgoing:
                self._flush_outgoing()
            return items
        if federated and not self.leaving:
            for name in req.queues:
                self.need_jobs(self._get_queue(name), CLIENTS_WAITING)
        if req.nohang:
            return NULL_ARRAY
        if self.leaving:
            return Error("LEAVING This node is leaving the cluster, try another one")
        return self._block(client, req.queues, req.timeout, req.count, withcounters)

    def cmd_ackjob(self, client: int, argv: list[bytes]) -> Any:
        ids = argv[1:]
        bad = check_job_ids(ids, self.store)
        if bad:
            return bad
        known = 0
        for job_id in ids:
            job = self.store.get(job_id)
            if job is None:
                # A "dummy ack" keeps an ACK for a job we never saw, so that
                # it reaches the owners after a partition heals. Only useful
                # with other nodes, never for at-most-once IDs, never while
                # leaving.
                if self.cluster_size > 1 and not self.leaving and not ids_mod.is_at_most_once_id(job_id):
                    job = Job(job_id, ACKED)
                    job.etime = self.now + ids_mod.ttl_minutes_from_id(job_id) * 60_000
                    self.store.register(job)
            elif job.state != ACKED:
                self.acknowledge(job, schedule_gc=False)
                known += 1
            if job is not None:
                self.try_gc(job)  # schedules the next attempt, or deletes the job
        return known

    def cmd_fastack(self, client: int, argv: list[bytes]) -> Any:
        ids = argv[1:]
        bad = check_job_ids(ids, self.store)
        if bad:
            return bad
        known = 0
        for job_id in ids:
            job = self.store.get(job_id)
            if job is None:
                self._send_lazy(self.known_nodes, ("DELJOB", bytes(job_id)))
                self._bury(bytes(job_id))  # a copy on its way here is dropped too
            else:
                self._send_lazy(job.delivered, ("DELJOB", bytes(job_id), list(job.delivered)))
                if job.state != ACKED:
                    self.stats["jobs_acked"] += 1
                self.delete_job(job)
                known += 1
        return known

    def cmd_deljob(self, client: int, argv: list[bytes]) -> Any:
        ids = argv[1:]
        bad = check_job_ids(ids)
        if bad:
            return bad
        evicted = 0
        for job_id in ids:
            job = self.store.get(job_id)
            if job is not None:
                self.delete_job(job)
                evicted += 1
        return evicted

    def cmd_show(self, client: int, argv: list[bytes]) -> Any:
        bad = check_job_ids(argv[1:2])
        if bad:
            return bad
        job = self.store.get(argv[1])
        return None if job is None else self._job_info(job)

    def _enqueue_many(self, argv: list[bytes], nack: bool) -> Any:
        ids = argv[1:]
        bad = check_job_ids(ids)
        if bad:
            return bad
        count = 0
        for job_id in ids:
            job = self.store.get(job_id)
            if job is not None and job.state == ACTIVE and self.enqueue_job(job, nack):
                count += 1
        return count

    def cmd_enqueue(self, client: int, argv: list[bytes]) -> Any:
        return self._enqueue_many(argv, False)

    def cmd_nack(self, client: int, argv: list[bytes]) -> Any:
        return self._enqueue_many(argv, True)

    def cmd_dequeue(self, client: int, argv: list[bytes]) -> Any:
        ids = argv[1:]
        bad = check_job_ids(ids)
        if bad:
            return bad
        count = 0
        for job_id in ids:
            job = self.store.get(job_id)
            if job is not None and self.dequeue_job(job):
                count += 1
        return count

    def cmd_working(self, client: int, argv: list[bytes]) -> Any:
        bad = check_job_ids(argv[1:2])
        if bad:
            return bad
        job = self.store.get(argv[1])
        if job is None:
            return Error("NOJOB Job not known in the context of this node.")
        if job.state == ACKED:
            return Error("ACKED Job already acknowledged.")
        now = self.now
        created = job.ctime // 1_000_000 - self.wall_offset
        lifetime = job.etime - created
        if lifetime > 0 and now - created > lifetime // 2:
            return Error(
                "TOOLATE Half of job TTL already elapsed, you are no longer allowed to postpone the next delivery."
            )
        if job.state == QUEUED:
            self.dequeue_job(job)
        if job.retry and job.qtime:
            if len(job.delivered) > 1:
                job.flags |= F_BCAST_WILLQUEUE
            job.qtime = now + job.retry * 1000 + self._time_error()
            self._reschedule(job)
        self._send(job.delivered, ("WORKING", bytes(job.id)))
        return job.retry

    def cmd_qlen(self, client: int, argv: list[bytes]) -> Any:
        q = self.queues.get(argv[1])
        return len(q.jobs) if q is not None else 0

    def cmd_qpeek(self, client: int, argv: list[bytes]) -> Any:
        count = parse_int(argv[2])
        if count is None:
            return NOT_AN_INTEGER
        q = self.queues.get(argv[1])
        if q is None or count == 0 or not q.jobs:
            return []
        jobs = q.jobs
        if count > 0:
            picked = jobs.islice(0, count)
        else:
            picked = jobs.islice(max(0, len(jobs) + count), len(jobs), reverse=True)
        return [[j.queue, j.id, j.body] for j in picked]

    def cmd_qstat(self, client: int, argv: list[bytes]) -> Any:
        q = self.queues.get(argv[1])
        if q is None:
            return NULL_ARRAY
        now = self.now
        return [
            b"name", q.name,
            b"len", len(q.jobs),
            b"age", max(0, (now - q.ctime) // 1000),
            b"idle", max(0, (now - q.atime) // 1000),
            b"blocked", q.blocked,
            b"import-from", [n.encode() for n in q.sources],
            b"import-rate", q.import_rate(now),
            b"jobs-in", q.jobs_in,
            b"jobs-out", q.jobs_out,
            b"pause", pause_name(q.flags),
        ]  # fmt: skip

    @staticmethod
    def _scan(
        items: Iterable[Any], cursor_of: Callable[[Any], int], count: int, busyloop: bool, match: Callable[[Any], bool]
    ) -> tuple[int, list]:
        """Generic cursor scan: ``items`` in scan order from the cursor on (JobStore.scan_from
        for jobs). Returns the next cursor (``cursor_of`` the first item not looked at; 0:
        done) and the matches; it looks at no more than ten times ``count`` items, unless
        BUSYLOOP."""
        found: list = []
        budget = count * 10
        for item in items:
            if not busyloop and (len(found) >= count or budget <= 0):
                return cursor_of(item), found
            budget -= 1
            if match(item):
                found.append(item)
        return 0, found

    def cmd_qscan(self, client: int, argv: list[bytes]) -> Any:
        args = parse_qscan(argv)
        if type(args) is Error:
            return args
        now = self.now

        def match(q: Queue) -> bool:
            qlen = len(q.jobs)
            if args.minlen != -1 and qlen < args.minlen:
                return False
            if args.maxlen != -1 and qlen > args.maxlen:
                return False
            if args.importrate != -1 and q.import_rate(now) < args.importrate:
                return False
            return True

        queues = list(self.queues.values())  # in seq order (dict order)
        start = bisect_left(queues, args.cursor, key=seq_of)
        cursor, found = self._scan(islice(queues, start, None), seq_of, args.count, args.busyloop, match)
        return [str(cursor).encode(), [q.name for q in found]]

    def cmd_jscan(self, client: int, argv: list[bytes]) -> Any:
        args = parse_jscan(argv)
        if type(args) is Error:
            return args
        queue, states = args.queue, args.states

        def match(job: Job) -> bool:
            if not job.delivered:  # dummy acks are not shown
                return False
            if queue is not None and job.queue != queue:
                return False
            return not states or job.state in states

        store = self.store
        cursor, found = self._scan(store.scan_from(args.cursor), store.cursor_of, args.count, args.busyloop, match)
        if args.reply_all:
            items = [self._job_info(j) for j in found]
        else:
            items = [Status(j.id) for j in found]
        return [str(cursor).encode(), items]

    def cmd_pause(self, client: int, argv: list[bytes]) -> Any:
        bcast = False
        update = False
        new_flags = 0
        for opt in argv[2:]:
            opt = opt.lower()
            if opt == b"none":
                new_flags = 0
                update = True
            elif opt == b"in":
                new_flags |= PAUSED_IN
                update = True
            elif opt == b"out":
                new_flags |= PAUSED_OUT
                update = True
            elif opt == b"all":
                new_flags |= PAUSED_ALL
                update = True
            elif opt == b"state":
                pass
            elif opt == b"bcast":
                bcast = True
            else:
                return SYNTAX_ERROR
        q = self.queues.get(argv[1])
        if update:
            if q is None and new_flags:
                q = self._get_queue(argv[1])
            if q is not None:
                self.set_pause(q, new_flags)
        flags = q.flags & PAUSED_ALL if q is not None else 0
        if bcast:
            self._send(self.known_nodes, ("PAUSE", bytes(argv[1]), flags))
        return Status(pause_name(flags).encode())

    def set_pause(self, q: Queue, flags: int) -> None:
        was_out = q.flags & PAUSED_OUT
        q.flags = (q.flags & ~PAUSED_ALL) | flags
        if was_out and not flags & PAUSED_OUT and q.blocked and q.jobs:
            self._ready[q.name] = q

    def cmd_hello(self, client: int, argv: list[bytes]) -> Any:
        entries = self.hello_nodes
        if entries is None:
            ip, port = self.address
            entries = [(self.id, ip, port, 100 if self.leaving else 1)]
        return [1, self.id.encode()] + [
            [node_id.encode(), ip.encode(), str(port).encode(), str(priority).encode()]
            for node_id, ip, port, priority in entries
        ]

    # =====================================================================
    # Cluster inputs
    # =====================================================================
    def set_id(self, node_id: str) -> None:
        """A new identity (CLUSTER RESET HARD): new job ID prefix from now on."""
        self.id = node_id
        self._myself_only = (node_id,)
        self.ids = ids_mod.JobIdGenerator(node_id, self._seed)

    # =====================================================================
    # Queue eviction
    # =====================================================================
    def _gc_queues(self) -> None:
        """Evict queues that are empty, unwatched, unpaused and idle for long.

        An empty queue kept for now gives back its sorted job list once idle
        for ``QUEUE_SHRINK_IDLE_MS`` (:meth:`Queue.release`): 45 % of an idle
        queue's memory.
        """
        queues = self.queues
        if not queues:
            return
        start = self._queue_gc_pos
        if start >= len(queues):
            start = 0
        size = max(QUEUE_GC_BATCH, len(queues) // QUEUE_GC_ROUND_S)
        batch = list(islice(queues, start, start + size))  # not a copy of every name
        self._queue_gc_pos = start + len(batch)
        now = self.now
        for name in batch:
            q = queues[name]
            if q.jobs:
                continue
            if not q.blocked and not q.flags & PAUSED_ALL and now - q.atime >= QUEUE_MAX_IDLE_MS:
                del queues[name]
                self._ready.pop(name, None)
            elif now - q.atime >= QUEUE_SHRINK_IDLE_MS:
                q.release()

    # =====================================================================
    # Stats for INFO
    # =====================================================================
    def info_fields(self) -> dict[str, dict[str, Any]]:
        return {
            "jobs": {"registered_jobs": len(self.store)},
            "queues": {
                "registered_queues": len(self.queues),
                # (queue, peer) pairs this node may push jobs to (federation leases)
                "push_leases": sum(map(len, self._leases.values())),
            },
        }
