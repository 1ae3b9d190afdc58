"""ADDJOB's front door, and its DEDUP keys: a job added once per queue and key, cluster-wide.

Theory of operation
-------------------
ADDJOB reads top to bottom as one pipeline: ``cmd_addjob`` here parses it once
(``commands.parse_addjob``), looks its DEDUP key up if it has one (below), and hands the
parsed request to ``Replication.add``, which checks it against the cluster, makes the job
and its copies and answers. An ADDJOB without a key (the common case) goes straight on.

A producer that times out does not know whether its ADDJOB was taken. With a
DEDUP key it asks again, on any node, and gets the same job ID, and nothing is
added twice. There is no leader to ask, so the design makes the answer the
same wherever it is computed:

* The job's ID is a function of the queue, the key and at-most-once-ness
  (``ids.dedup_job_id``), not of the node or the moment: two nodes that take
  the same ADDJOB make one job, whose copies meet and merge like any copies
  (``Replication.on_repljob``). The body and options of later ADDJOBs are
  ignored, as SQS does.
* A node answers the ID, adding nothing (a hit, ``dedup_hits`` in INFO),
  when it holds the job in any state (queued, active, acked), or remembers
  it: a DEDUP job deleted here (acknowledged and collected, expired,
  DELJOB) leaves its ID in ``Lifecycle.gone`` (the machine that deletes jobs keeps
  it) for ``dedup-window`` seconds (default 600; CONFIG SET), written to the AOF
  (DEDUPGONE) so a restart keeps it.
  The window thus covers the whole life of the job and ``dedup-window``
  after it.
* A node that holds nothing of the ID asks the others (HASJOB, answered by
  HAVEJOB) before it creates the job, unless every node of the cluster holds
  a copy of every job of that replication factor (REPLICATE >= cluster size:
  what this node lacks, nobody has). The client waits at most
  ``QUERY_TIMEOUT_MS``; a node that does not answer in time is taken for one
  that has nothing (it is cut off, or slow).
* A DEDUP job is never withdrawn once made: when its copies are not all made
  in time (NOREPL) or its client leaves, it is kept and queued with the
  copies it has (``Replication._keep``); another node holding one of those
  copies may have answered its ID to a retry already.
* Two nodes that create it at once (neither knew of the other's): the copies
  merge into one job, and of the two creators the one that wins Disque's
  per-job node comparison (``requeue.compare_ids_by_job``) keeps it queued;
  the other takes it out of its queue, or does not queue it when its copies
  are made (``F_YIELD``; ``Replication._merge_dedup``, where copies meet). A copy
  that arrives for an ID in ``gone`` is not kept: its sender is told SETACK (the
  job ran already).

Under a partition each side can make the job once (it cannot ask the other):
at most one per side, which merge when the cut heals, and none is lost.

Commands: ADDJOB. Messages: HASJOB, HAVEJOB. The top machine: receives ``Lifecycle``
(the window) and ``Replication`` (the job made); called by ``Node`` only (ADDJOB, the
messages, the queries' timeouts, a client gone).
"""

from __future__ import annotations

from typing import Final, final

from .commands import DEFAULT_RETRY, AddJob, parse_addjob, plain_addjob_timeout
from .constants import DEFAULT_TTL
from .commandspec import QUEUE, CommandSpec
from .context import Context
from .effects import BLOCKED, Reply
from .ids import dedup_job_id
from .job import WAIT_REPL
from .lifecycle import Lifecycle
from .messages import HasJob, HaveJob, has_job, have_job, repl_job
from .replication import DEFAULT_REPLICATE_MAX, Replication
from .replies import Error, Status
from .wire import job_to_wire

__all__ = ["Dedup", "QUERY_TIMEOUT_MS", "COMMANDS"]

QUERY_TIMEOUT_MS: Final = 200  # how long a node waits for the others' HAVEJOB before it creates the job

#: The commands this machine answers (commandspec.py; Node dispatches them).
COMMANDS: Final = (
    CommandSpec(b"addjob", "cmd_addjob", -4, ("write", "denyoom", "fast"), ("produce",), QUEUE,
                syntax="ADDJOB queue_name job ms-timeout [REPLICATE count] [DELAY sec] [RETRY sec] [TTL sec] "
                       "[MAXLEN count] [ASYNC] [BACKOFF min max] [MAXDELIVER count] [DEADLETTER queue] [DEDUP key] "
                       "[PRIORITY 0-9] [GROUP name]",
                summary="Add a job to a queue; its ID once REPLICATE nodes hold it (ASYNC: at once)",
                group="jobs"),
)


@final
class _Query:
    """An ADDJOB DEDUP waiting for the other nodes' HAVEJOB (one per job ID; later ADDJOBs of
    the same ID wait with it)."""

    __slots__ = ("waiters", "missing", "deadline", "rivals")

    def __init__(self, waiters: list[tuple[int, AddJob]], missing: set[str], deadline: int) -> None:
        self.waiters = waiters
        self.missing = missing  # nodes not answered yet
        self.deadline = deadline
        self.rivals: list[str] = []  # nodes that asked for this ID while we were asking too


@final
class Dedup:
    def __init__(self, ctx: Context, lifecycle: Lifecycle, replication: Replication) -> None:
        self.ctx = ctx
        self._lifecycle = lifecycle
        self._replication = replication
        self._store = ctx.store
        ctx.stats["dedup_hits"] = 0
        self.queries: dict[bytes, _Query] = {}
        self.client_queries: dict[int, bytes] = {}  # client -> the ID its ADDJOB waits on

    # -- ADDJOB ---------------------------------------------------------------------------
    def cmd_addjob(self, client: int, argv: list[bytes]) -> object:
        """ADDJOB: parsed, its DEDUP key looked up (if any), then made by ``Replication.add``;
        the reply, or BLOCKED (its copies are being made, or the other nodes asked)."""
        if len(argv) == 4:  # no options (most ADDJOBs): made at once, no request object
            timeout = plain_addjob_timeout(argv)
            if type(timeout) is not int:
                return timeout
            return self._replication.make(client, argv[1], argv[2], timeout, None, DEFAULT_TTL, DEFAULT_RETRY,
                                          0, 0, False, None, 0, None, None)  # fmt: skip
        req = parse_addjob(argv)
        if not isinstance(req, AddJob):
            return req
        extra = req.extra
        if extra is None or extra[4] is None:
            return self._replication.add(client, req, None)
        return self._addjob(client, req, extra[4])

    def _addjob(self, client: int, req: AddJob, key: bytes) -> object:
        """ADDJOB with a DEDUP key: a hit (the ID, nothing added), BLOCKED (the other nodes are
        asked first), or the job made here with its ID (``Replication.add``)."""
        ctx = self.ctx
        job_id = dedup_job_id(req.queue, key, req.retry)
        if self._store.get(job_id) is not None or self._lifecycle.remembers(job_id):
            ctx.stats["dedup_hits"] += 1
            return Status(job_id)
        query = self.queries.get(job_id)
        if query is not None:
            query.waiters.append((client, req))
            self.client_queries[client] = job_id
            return BLOCKED
        others = [n for n in ctx.reachable if n != ctx.id]
        replicate = req.replicate or min(DEFAULT_REPLICATE_MAX, ctx.cluster_size)
        if not others or replicate >= ctx.cluster_size:
            # Every node holds a copy of such a job: what this one lacks, nobody has.
            return self._replication.add(client, req, job_id)
        self.queries[job_id] = _Query([(client, req)], set(others), ctx.now + QUERY_TIMEOUT_MS)
        self.client_queries[client] = job_id
        ctx.send(others, has_job(job_id))
        return BLOCKED

    def _answer(self, job_id: bytes, found: bool) -> None:
        """The query of ``job_id`` is over: a hit for everyone waiting (``found``), or the job
        is made for the first waiter and the others find it made."""
        query = self.queries.pop(job_id, None)
        if query is None:
            return
        ctx = self.ctx
        effects = ctx.effects
        for client, req in query.waiters:
            self.client_queries.pop(client, None)
            if found or self._store.get(job_id) is not None:
                ctx.stats["dedup_hits"] += 1
                effects.append(Reply(client, Status(job_id)))
                continue
            reply = self._replication.add(client, req, job_id)
            if reply is not BLOCKED:
                effects.append(Reply(client, reply))
            if query.rivals:
                self._copy_to_rivals(job_id, query.rivals)
            found = False

    def _copy_to_rivals(self, job_id: bytes, rivals: list[str]) -> None:
        """The job was made here after a query during which ``rivals`` asked for it too: each
        of them may be making it as well, with other holders. Each gets a copy, so that the
        two jobs meet and merge (``merge``) wherever their holders were chosen."""
        job = self._store.get(job_id)
        if job is None:
            return
        missing = [n for n in rivals if n not in job.delivered]
        if missing:
            job.delivered = tuple(job.delivered) + tuple(missing)
        # to each rival, a holder already or not, and whatever its link holds (replicate_job
        # skips a backlogged link): its tie-break with this maker needs this copy
        ctx = self.ctx
        ctx.send(rivals, repl_job(job_to_wire(job, ctx.now), job.state != WAIT_REPL))

    def client_closed(self, client: int) -> None:
        job_id = self.client_queries.pop(client, None)
        if job_id is None:
            return
        query = self.queries.get(job_id)
        if query is not None:
            query.waiters = [w for w in query.waiters if w[0] != client]
            if not query.waiters:
                del self.queries[job_id]

    # -- messages -----------------------------------------------------------------------
    def on_hasjob(self, sender: str, m: HasJob) -> None:
        job_id = m.job_id
        query = self.queries.get(job_id)
        if query is not None and sender not in query.rivals:
            query.rivals.append(sender)  # asking at once: it gets a copy of what we make
        held = self._store.get(job_id) is not None or self._lifecycle.remembers(job_id)
        self.ctx.send((sender,), have_job(job_id, held))

    def on_havejob(self, sender: str, m: HaveJob) -> None:
        query = self.queries.get(m.job_id)
        if query is None:
            return
        if m.have:
            self._answer(m.job_id, True)
            return
        query.missing.discard(sender)
        if not query.missing:
            self._answer(m.job_id, False)

    # -- time ---------------------------------------------------------------------------
    def tick(self, now: int) -> None:
        """Queries whose time is up (``Node.tick``, while there are queries)."""
        for job_id in [i for i, q in self.queries.items() if q.deadline <= now]:
            self._answer(job_id, False)  # the silent ones have nothing we can wait for

    def next_wakeup(self) -> int:
        """The first query's end (``Node.next_wakeup``, while there are queries)."""
        return min(q.deadline for q in self.queries.values())

    def flushall(self) -> None:
        effects = self.ctx.effects
        for query in self.queries.values():
            for client, _ in query.waiters:
                effects.append(Reply(client, Error("NOREPL job removed by DEBUG FLUSHALL")))
        self.queries.clear()
        self.client_queries.clear()

