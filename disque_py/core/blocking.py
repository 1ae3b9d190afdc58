"""Consumers: GETJOB, the clients blocked in it, delivery, and the queue commands.

Theory of operation
-------------------
GETJOB takes jobs from the named queues in turn (``Requeue.fetch``: the job turns
active and is marked delivered, F_DELIVERED, which is what makes a RETRY 0
job never queued again). With nothing to take it asks other nodes for jobs
(``Federation.need_jobs``), then either answers at once (NOHANG,
or LEAVING) or blocks the client: one ``Waiter`` record, put in every named
queue's waiter list (``queues.py``), in ``blocked`` by client, in ``waited``
by queue name, and, with a TIMEOUT, in the deadline heap.

A job queued on a queue with waiters marks the queue ``ready``
(``Requeue.enqueue_job``, or PAUSE lifting an output pause); at the end of
every input ``Node`` calls ``serve_ready``, which hands the queue's jobs to its
waiters first come first served, each answered with a ``Reply`` effect and
unblocked from all its queues. ``tick`` answers the waiters whose deadline
passed with an empty reply (a blocked GETJOB timing out is decided here);
``client_closed`` forgets a waiter without answering.

Queues are created on demand (``Context.get_queue``) and evicted here
(``gc_queues``, every second from ``Node.tick``) once empty, unwatched,
unpaused and idle for ``QUEUE_MAX_IDLE_MS`` (a 30th of it at memory level 1,
``QUEUE_OOM_IDLE_MS`` from level 2, ``ctx.memory_level``); an empty queue idle for
``QUEUE_SHRINK_IDLE_MS`` gives back its job container first.

Commands: GETJOB, QLEN, QPEEK, QSTAT, QSCAN, PAUSE. Message: PAUSE. Receives
``Requeue`` (taking jobs), ``Federation`` (asking other nodes for jobs) and ``Delivery``
(a delivery counted for MAXDELIVER); called by ``Node`` only (the machines below it mark
queues ``ctx.ready``, which ``Node`` has it serve at the end of every input).
"""

from __future__ import annotations

import heapq
from bisect import bisect_left
from itertools import islice
from typing import Final, final

from .commands import NOT_AN_INTEGER, parse_getjob, parse_int, parse_qscan
from .commandspec import EVERY_QUEUE, FROM_QUEUES, QUEUE, CommandSpec
from .constants import INTERNAL_QUEUE_PREFIX
from .context import Context
from .delivery import Delivery
from .effects import BLOCKED, Reply
from .federation import CLIENTS_WAITING, REACHED_ZERO, Federation
from .job import F_GROUP, Job, extra_fields
from .limits import Limits
from .messages import Pause, pause
from .queues import PAUSED_ALL, PAUSED_IN, PAUSED_OUT, Queue, Waiter, pause_name
from .replies import NULL_ARRAY, Error, NullArray, Status, syntax_error
from .requeue import Requeue
from .store import scan, seq_of

__all__ = ["Blocking", "job_item"]

QUEUE_MAX_IDLE_MS: Final = 300_000
QUEUE_GC_BATCH: Final = 1000  # queues checked per pass at least; more when there are many (QUEUE_GC_ROUND_S)
QUEUE_GC_ROUND_S: Final = 60  # every queue is checked at least this often
QUEUE_SHRINK_IDLE_MS: Final = 10_000  # an empty queue idle this long gives back its job container
# At memory level 1 the idle time is divided by 30 (10 s); from level 2 on it is this (as Disque).
QUEUE_OOM_IDLE_MS: Final = 2000


def job_item(job: Job, withcounters: bool) -> list[object]:
    if withcounters:
        item: list[object] = [job.queue, job.id, job.body, b"nacks", job.nacks, b"additional-deliveries", job.deliveries]
        if job.extra is not None:  # its delivery policy or dead-letter facts (delivery.py)
            item += extra_fields(job)
        return item
    return [job.queue, job.id, job.body]


# Looking at a queue or a job: whoever may add, take or inspect may.
_QUEUE_READS: Final = ("produce", "consume", "inspect")
#: The commands this machine answers (commandspec.py; Node dispatches them).
COMMANDS: Final = (
    CommandSpec(b"getjob", "cmd_getjob", -2, ("write", "fast"), ("consume",), FROM_QUEUES,
                syntax="GETJOB [NOHANG] [TIMEOUT ms-timeout] [COUNT count] [WITHCOUNTERS] FROM queue [queue ...]",
                summary="Take jobs from the first queue that has some, waiting up to TIMEOUT (0: for ever)",
                group="jobs"),
    CommandSpec(b"qlen", "cmd_qlen", 2, ("readonly", "fast"), _QUEUE_READS, QUEUE,
                syntax="QLEN queue_name", summary="How many jobs a queue holds on this node", group="queues"),
    CommandSpec(b"qpeek", "cmd_qpeek", 3, ("readonly",), _QUEUE_READS, QUEUE,
                syntax="QPEEK queue_name count",
                summary="Look at the oldest count jobs of a queue (the newest if count is negative)",
                group="queues"),
    CommandSpec(b"qstat", "cmd_qstat", 2, ("readonly", "fast"), _QUEUE_READS, QUEUE,
                syntax="QSTAT queue_name",
                summary="A queue's length, age, blocked clients, imports, jobs in and out, pause state",
                group="queues"),
    CommandSpec(b"qscan", "cmd_qscan", -1, ("readonly",), ("inspect",), EVERY_QUEUE,
                syntax="QSCAN [cursor] [COUNT count] [BUSYLOOP] [MINLEN len] [MAXLEN len] [IMPORTRATE rate] [ALL]",
                summary="Iterate over this node's queues (ALL: the cluster's own @ queues too)",
                group="queues"),
    CommandSpec(b"pause", "cmd_pause", -3, ("readonly", "fast"), ("admin",), QUEUE,
                syntax="PAUSE queue_name IN|OUT|ALL|NONE|STATE|BCAST [IN|OUT|ALL|NONE|STATE|BCAST ...]",
                summary="Pause a queue's input, output or both (BCAST: on every node); its pause state",
                group="queues"),
)


@final
class Blocking:
    def __init__(self, ctx: Context, requeue: Requeue, federation: Federation, delivery: Delivery,
                 limits: Limits) -> None:  # fmt: skip
        self.ctx = ctx
        self._limits = limits
        self._requeue = requeue
        self._federation = federation
        self._delivery = delivery
        self._queues = ctx.queues
        self._stats = ctx.stats
        self.ready = ctx.ready  # queues to serve at the end of this input (shared, see context)
        self.blocked: dict[int, Waiter] = {}  # client -> its waiter
        self.waited: dict[bytes, Queue] = {}  # queues with blocked clients (q.blocked > 0)
        self._deadlines: list[tuple[int, int, Waiter]] = []
        self._deadline_seq = 0
        self._queue_gc_pos = 0

    # -- delivery ------------------------------------------------------------------------
    def cmd_getjob(self, client: int, argv: list[bytes]) -> object:
        req = parse_getjob(argv)
        if isinstance(req, Error):
            return req
        ctx = self.ctx
        items: list[list[object]] = []
        count = req.count
        withcounters = req.withcounters
        queues = self._queues
        fetch = self._requeue.fetch
        federated = ctx.cluster_size > 1
        while True:
            before = len(items)
            for name in req.queues:
                q = queues.get(name)
                if q is None or q.flags & PAUSED_OUT or not q.jobs:
                    continue
                job = fetch(q)
                if job is None:  # (a queue with jobs gives one)
                    continue
                q.ltime = ctx.now
                if job.extra is not None:  # a delivery counted for MAXDELIVER (delivery.py)
                    self._delivery.delivered(job)
                    if job.flags & F_GROUP and self._limits.delivered(job):  # its group's count (limits.py)
                        self._requeue.lease(job)
                items.append(job_item(job, withcounters))
                if federated:
                    if not q.jobs:
                        self._federation.need_jobs(q, REACHED_ZERO)
                    elif q.asked:
                        self._federation.renew_on_take(q)
                count -= 1
                if count == 0:
                    break
            if count == 0 or len(items) == before:
                break
        if items:
            return items
        if federated and not ctx.leaving:
            for name in req.queues:
                q = ctx.get_queue(name)
                q.ltime = ctx.now  # a local consumer asked (NOHANG too): the next job stays here
                self._federation.need_jobs(q, CLIENTS_WAITING)
        if req.nohang:
            return NULL_ARRAY
        if ctx.leaving:
            return Error("LEAVING This node is leaving the cluster, try another one")
        return self._block(client, req.queues, req.timeout, req.count, withcounters)

    # -- blocking ------------------------------------------------------------------------
    def _block(self, client: int, queues: list[bytes], timeout: int, count: int, withcounters: bool) -> object:
        ctx = self.ctx
        names = list(dict.fromkeys(queues))
        deadline = ctx.now + timeout if timeout else 0
        waiter = Waiter(client, names, deadline, count, withcounters)
        waited = self.waited
        for name in names:
            q = ctx.get_queue(name)
            q.add_waiter(waiter)
            q.atime = q.ltime = ctx.now
            waited[name] = q
        previous = self.blocked.get(client)
        if previous is not None:  # cannot happen through the shell; be safe
            self._unblock(previous)
        self.blocked[client] = waiter
        if deadline:
            self._deadline_seq += 1
            heapq.heappush(self._deadlines, (deadline, self._deadline_seq, waiter))
        return BLOCKED

    def _unblock(self, waiter: Waiter) -> None:
        if not waiter.active:
            return
        waiter.active = False
        if self.blocked.get(waiter.client) is waiter:
            del self.blocked[waiter.client]
        queues = self._queues
        for name in waiter.queues:
            q = queues.get(name)
            if q is not None:
                q.blocked -= 1
                if q.blocked == 0:
                    q.clear_waiters()
                    self.waited.pop(name, None)

    def serve_ready(self) -> None:
        """Hand queued jobs to blocked clients, first come first served."""
        ready = self.ready
        ctx = self.ctx
        effects = ctx.effects
        fetch = self._requeue.fetch
        while ready:
            _, q = ready.popitem()
            if q.flags & PAUSED_OUT:
                continue
            while q.blocked and q.jobs:
                waiter = q.first_waiter()
                if waiter is None:
                    break
                items: list[list[object]] = []
                while len(items) < waiter.count:
                    job = fetch(q)
                    if job is None:
                        break
                    if job.extra is not None:  # a delivery counted for MAXDELIVER (delivery.py)
                        self._delivery.delivered(job)
                        if job.flags & F_GROUP and self._limits.delivered(job):  # its group's count
                            self._requeue.lease(job)
                    items.append(job_item(job, waiter.withcounters))
                self._unblock(waiter)
                q.ltime = ctx.now
                effects.append(Reply(waiter.client, items))
            if not q.jobs and ctx.cluster_size > 1:
                self._federation.need_jobs(q, REACHED_ZERO)

    def tick(self, now: int) -> None:
        """Answer the blocked GETJOBs whose TIMEOUT passed (an empty reply)."""
        deadlines = self._deadlines
        effects = self.ctx.effects
        while deadlines and deadlines[0][0] <= now:
            _, _, waiter = heapq.heappop(deadlines)
            if waiter.active:
                self._unblock(waiter)
                effects.append(Reply(waiter.client, NULL_ARRAY))

    def next_wakeup(self) -> int | None:
        deadlines = self._deadlines
        while deadlines and not deadlines[0][2].active:
            heapq.heappop(deadlines)
        return deadlines[0][0] if deadlines else None

    def client_closed(self, client: int) -> None:
        waiter = self.blocked.get(client)
        if waiter is not None:
            self._unblock(waiter)

    def flushall(self) -> None:
        """Every waiter gets a timeout reply; nothing waits any more."""
        effects = self.ctx.effects
        for waiter in list(self.blocked.values()):
            self._unblock(waiter)
            effects.append(Reply(waiter.client, NULL_ARRAY))

    def clear(self) -> None:
        self.waited.clear()
        self.ready.clear()
        self._deadlines.clear()

    # -- queues ----------------------------------------------------------------------------
    def set_pause(self, q: Queue, flags: int) -> None:
        was_out = q.flags & PAUSED_OUT
        q.flags = (q.flags & ~PAUSED_ALL) | flags
        if was_out and not flags & PAUSED_OUT and q.blocked and q.jobs:
            self.ready[q.name] = q

    def on_pause(self, sender: str, m: Pause) -> None:
        q = self._queues.get(m.name)
        if q is None:
            if not m.flags & PAUSED_ALL:
                return
            q = self.ctx.get_queue(m.name)
        self.set_pause(q, m.flags & PAUSED_ALL)

    def gc_queues(self) -> None:
        """Evict queues that are empty, unwatched, unpaused and idle for long.

        An empty queue kept for now gives back its sorted job list once idle
        for ``QUEUE_SHRINK_IDLE_MS`` (:meth:`Queue.release`): 45 % of an idle
        queue's memory.
        """
        queues = self._queues
        if not queues:
            return
        start = self._queue_gc_pos
        if start >= len(queues):
            start = 0
        size = max(QUEUE_GC_BATCH, len(queues) // QUEUE_GC_ROUND_S)
        batch = list(islice(queues, start, start + size))  # not a copy of every name
        self._queue_gc_pos = start + len(batch)
        now = self.ctx.now
        max_idle = QUEUE_MAX_IDLE_MS
        level = self.ctx.memory_level  # memory.py: short of memory, idle queues go sooner
        if level:
            max_idle = QUEUE_MAX_IDLE_MS // 30 if level == 1 else QUEUE_OOM_IDLE_MS
        for name in batch:
            q = queues[name]
            if len(q.jobs):  # (not its truth: a queue whose groups are all at their limit has jobs)
                continue
            if not q.blocked and not q.flags & PAUSED_ALL and now - q.atime >= max_idle:
                del queues[name]
                self.ready.pop(name, None)
            elif now - q.atime >= QUEUE_SHRINK_IDLE_MS:
                q.release()

    # -- queue commands ------------------------------------------------------------------
    def cmd_qlen(self, client: int, argv: list[bytes]) -> int:
        q = self._queues.get(argv[1])
        return len(q.jobs) if q is not None else 0

    def cmd_qpeek(self, client: int, argv: list[bytes]) -> list[list[bytes | None]] | Error:
        count = parse_int(argv[2])
        if count is None:
            return NOT_AN_INTEGER
        q = self._queues.get(argv[1])
        if q is None or count == 0 or not len(q.jobs):
            return []
        return [[j.queue, j.id, j.body] for j in q.peek(count)]

    def cmd_qstat(self, client: int, argv: list[bytes]) -> list[object] | NullArray:
        q = self._queues.get(argv[1])
        if q is None:
            return NULL_ARRAY
        now = self.ctx.now
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

    def cmd_qscan(self, client: int, argv: list[bytes]) -> list[object] | Error:
        args = parse_qscan(argv)
        if isinstance(args, Error):
            return args
        now = self.ctx.now
        internal = args.internal

        def match(q: Queue) -> bool:
            if not internal and q.name.startswith(INTERNAL_QUEUE_PREFIX):
                return False  # the cluster's own (a task's result): only with ALL
            qlen = len(q.jobs)
            if args.minlen != -1 and qlen < args.minlen:
                return False
            if args.maxlen != -1 and qlen > args.maxlen:
                return False
            if args.importrate != -1 and q.import_rate(now) < args.importrate:
                return False
            return True

        queues = list(self._queues.values())  # in seq order (dict order)
        start = bisect_left(queues, args.cursor, key=seq_of)
        cursor, found = scan(islice(queues, start, None), seq_of, args.count, args.busyloop, match)
        return [str(cursor).encode(), [q.name for q in found]]

    def cmd_pause(self, client: int, argv: list[bytes]) -> Status | Error:
        bcast = False
        update = False
        new_flags = 0
        for word in argv[2:]:
            opt = word.lower()
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
                return syntax_error(word, "PAUSE takes IN, OUT, ALL, NONE, STATE, BCAST")
        ctx = self.ctx
        q = self._queues.get(argv[1])
        if update:
            if q is None and new_flags:
                q = ctx.get_queue(argv[1])
            if q is not None:
                self.set_pause(q, new_flags)
        flags = q.flags & PAUSED_ALL if q is not None else 0
        if bcast:
            ctx.send(ctx.known_nodes, pause(bytes(argv[1]), flags))
        return Status(pause_name(flags).encode())
