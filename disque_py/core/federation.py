"""Federation: moving queued jobs to the nodes where consumers wait.

Theory of operation
-------------------
Pull (Disque's protocol, unchanged on the wire):

* A node whose queue is empty while clients are blocked on it asks for jobs
  with NEEDJOBS(queue, count): to the nodes that recently sent it jobs for
  that queue ("sources", ad hoc, every 25 ms doubling up to 2 s while nothing
  arrives) and, to discover new sources, to every reachable node (every 2 s
  doubling up to 30 s). When a consumer takes the last job of a queue that
  has a recent import rate, the sources are asked at once, except those
  whose push lease (below) is young (``RENEW_AFTER_MS``) and has used less
  than half of its credit: they push on without being asked.
* Two more moments to ask at once, so that a job queued again anywhere reaches a consumer
  waiting anywhere in a round trip, not at the next discovery broadcast (up to 30 s, as in
  Disque; measured 4-18 s for a NACKed job): a node whose clients wait on an empty queue
  asks the sender of a QUEUED for a job it holds a copy of (``on_queued``: the sender has
  just queued it again, by NACK or RETRY, and may keep it, or hold no lease of ours), unless
  that sender's push lease is young with credit left; and it asks every node that became
  reachable since its last look (``_newcomers``: restarted, or back from a cut, holding no
  lease of ours and maybe jobs it queued again as it started), and makes them sources for
  the ad hoc requests that follow. One NEEDJOBS per event and waited queue at once; a node
  that comes up then gets the ad hoc ones while nothing comes (measured in the simulation:
  9 NEEDJOBS per restart of a node while a consumer waits, 1 before).
* A job kept by its maker after its ADDJOB timed out and requeued first by another holder (a
  node killed, not flagged yet; the maker yields to it, ``dedup.py``) is queued by the maker
  when its wait ends if the holder moved it there meanwhile (``on_yourjobs``), and a QUEUED
  from that holder makes clients waiting at the maker ask it at once (``on_queued``).
* A node receiving NEEDJOBS(queue, count) with jobs queued (and not paused
  out, and not importing that queue itself) dequeues up to ``count`` of them
  (at most half its queue unless it has twice as many) and sends them in one
  YOURJOBS. The receiver queues them and remembers the sender as a source.
  No jobs go to a node we have no link to (Disque dequeued them, then found
  no link to send them on), and no RETRY 0 job to one whose link still holds
  output its socket has not taken (``ctx.backlogged``): a link torn down
  drops what it had not sent, and a RETRY 0 job's only copy with it.
  That rule reads the backlog as of the last tick; for what a link took in
  between, the shell hands back every YOURJOBS that never reached the
  socket when its link closes (``moves_to_watch``, ``on_moves_unsent``),
  and the RETRY 0 jobs in it are queued here again. A message the socket
  took, even in part, may have arrived: at most once means it is not.

Push (what makes it fast, our addition, still only NEEDJOBS/YOURJOBS):

* NEEDJOBS(queue, count) also grants the receiver a *lease*: for
  ``LEASE_MS`` after the request, the asking node is known to want up to
  ``count`` jobs of that queue (its *credit*). While the lease is valid, a
  job newly queued here is sent to it at once in YOURJOBS, provided no local
  client is waiting on that queue (local consumers always come first), the
  peer is reachable, and credit remains; each pushed job uses one credit.
  Local consumers come first between two GETJOBs as well: while a local
  client has taken from or asked of the queue in the last
  ``LOCAL_FIRST_MS`` and the queue is empty, a new job stays here for it; only
  a backlog (a job already waiting) or quiet local consumers let jobs go. A job
  given back (NACK, the end of its RETRY, ENQUEUE) is not kept so: no local consumer
  is between two GETJOBs for it, and kept, it waited for the next discovery
  NEEDJOBS of the node whose consumer waits.
  Pushing whenever no local client happened to be blocked moved half the
  jobs of a cluster with consumers on every node (Disque's pull moved 9 %);
  each move adds a holder, so more jobs had copies on both sides of a
  network cut and were delivered on both (chaos runs, RELIABILITY.md). A
  RETRY 0 job is not pushed into a link that does not drain (as above); an
  at-least-once one is, as its copy here is requeued if that one is lost.
  Every new NEEDJOBS renews the lease and resets the credit; NEEDJOBS(q, 0)
  cancels it. ``LEASE_MS`` outlasts the longest gap between two NEEDJOBS of
  a node whose consumers wait (the discovery broadcast's 30 s backoff, plus
  slack): with a shorter lease (3 s, before) a producer that started on
  another node after the consumers had waited a while saw no lease and kept
  its jobs until the next broadcast, up to 30 s later, as in Disque
  (measured: p50 18 s after ~20 s of waiting). What a lease may cost is
  bounded by its credit, not its length: the credit of a discovery request
  is one job per blocked client. A node does not cancel when its waiters
  are momentarily all served: under load that happens on every YOURJOBS,
  and cancelling then turned push back into a pull ping-pong (measured:
  20 % of the same-node rate). Leases simply expire.
* Top-up: a node importing pushed jobs asks their source again (a new
  NEEDJOBS, so a fresh lease and credit) as soon as half of the credit is
  used, provided its own queue holds less than a credit's worth of jobs,
  i.e. its consumers keep up. Under load they are busy rather than blocked
  and the queue is rarely empty, so waiting for the last job to be taken
  let the credit run dry: the source queued the jobs and the consumer node
  pulled them a batch per round trip (measured, three nodes on one core:
  6,500 jobs/s offered reached p99 340-580 ms that way, 14-39 ms with the
  top-up). The same check runs when a consumer takes a job and some are
  left: a batch pulled from a source's backlog arrives whole, so at import
  the queue holds a credit's worth and the node did not ask; its consumers
  then emptied the queue and waited a round trip for the next batch, once
  per batch, while the source still held thousands (simulated, 10 ms round
  trip, four busy consumers: 48 such waits in 1,500 jobs, none with this).
  A node whose consumers stop stops renewing, so it holds at most about
  twice its credit.
* Request size: the import rate divided among the sources (Disque's rule),
  between ``NEEDJOBS_MIN_REQUEST`` and ``NEEDJOBS_MAX_REQUEST``, and at most
  ten per blocked client or a tenth of a second of the import rate,
  whichever is more.
* Owed leases: a lease this node could not serve when jobs were there for it (``Leases.owe``:
  its peer out of reach, i.e. our link to it down; or a RETRY 0 job and a backlogged link) is
  remembered, peer and queue, and ``serve_owed`` sends the jobs queued here as that peer's
  NEEDJOBS would take them (``_send_queued``) as soon as it can: when the shell sets a view
  in which the peer is reachable (``next_owed``: at once), and for a backlogged link again
  5 ms later, doubling up to ``OWED_IDLE_MS``. Three ways to owe: a job newly queued while
  the leased peer is out of reach (``push_if_wanted``); a NEEDJOBS from a peer we have no
  link to, or whose RETRY 0 jobs wait for a backlogged link (``on_needjobs``); and a move
  handed back (``on_moves_unsent``), whose jobs give the credit they used back to the lease
  (a new lease for ``LEASE_MS`` when the last credit had ended it: they never arrived). The
  peer, meanwhile, may not ask again for 30 s: a link that closes and reconnects is our link
  to it, and its own view of us never changed, so it sees no newcomer (``_newcomers``) and
  waits for its discovery broadcast. Measured, two real processes, the link failing with a
  RETRY 0 job in it (``tests/server/test_moves.py``): the job reached the consumer 0.7-9 ms
  after the link was up again, against 4-30 s before. Local consumers still come first (no
  owed job leaves a queue clients wait on here), and an owed lease ends with the lease: the
  debts are looked at at least every ``OWED_IDLE_MS``, so none outlives its lease by more. A
  move handed back while the view still names its peer (a view that lags the link, as a
  model's may) takes the peer out of the view until the next one, or the jobs would go into
  the closed link again, and come back, for ever. At most once holds: an owed RETRY 0 job
  leaves only through ``Requeue.fetch`` and ``Leases.export``, as any move.
* Bounds: a consumer node that vanishes can receive at most its credit
  (<= ``NEEDJOBS_MAX_REQUEST``) jobs after its last request, and only while
  it still looks reachable; the lease ends after ``LEASE_MS`` anyway, and
  the queue GC forgets expired leases (``LEASE_GC_BATCH`` queue names a
  second), so NEEDJOBS for queues that never get a job here leave nothing
  behind. A pushed at-least-once job keeps its copies on the other
  holders, which requeue it after RETRY if it is never acknowledged, so
  nothing is stranded beyond RETRY.

Moves never duplicate an at-most-once (RETRY 0) job: the sender deletes its
own copy as it sends (a RETRY 0 job has a single copy by contract), and a
receiver queues a RETRY 0 job it never delivered exactly once. The sender
of an at-least-once job keeps its copy and, unlike Disque, adds the
receiver to the job's holders, so that its acks and requeue messages reach
the moved copy (see the notes in ``acks.py``). A copy that
arrives just after this node deleted the job (its ack was collected while
the copy was on its way, or it got a DELJOB or FASTACK for an ID it did
not hold yet) is dropped and its sender sent a DELJOB: the node remembers
such IDs for ``TOMBSTONE_MS`` (``Lifecycle.is_buried``). Pushed and
pulled jobs are batched: all jobs for one peer produced by one input leave
in one YOURJOBS.

The push itself, the leases and the jobs leaving in YOURJOBS are ``leases.py``'s
(``Leases``, built before this machine and handed to it): ``Requeue.enqueue_job`` asks it
whether a job goes to a leased peer, and this machine grants the leases (``on_needjobs``)
and exports the jobs a NEEDJOBS pulls through it.

Owns the NEEDJOBS timer of queues with waiters (``tick``, from ``Node.tick``) and the owed
leases' (``serve_owed``, ``next_owed``, from ``Node.tick`` while ``Leases.owed`` names any). A NEEDJOBS
reply (which jobs, how many, to whom) is decided in ``on_needjobs``; an import in
``on_yourjobs``. Receives ``Lifecycle`` (tombstones), ``Leases`` and ``Requeue`` (taking
jobs out of a queue, queueing imports); called by ``Node`` (messages, timers) and by
``Blocking`` (``need_jobs``, ``renew_on_take``).
"""

from __future__ import annotations

from typing import Final, final

from .commands import check_job_ids
from .commandspec import EVERY_QUEUE, CommandSpec
from .context import Context
from .job import ACTIVE, F_BCAST_QUEUED, F_DELIVERED, F_YIELD, QUEUED, WAIT_REPL
from .leases import OWED_SOON_MS, Leases
from .lifecycle import Lifecycle
from .messages import NeedJobs, Queued, YourJobs, del_job_holders, need_jobs
from .queues import PAUSED_OUT, Queue
from .replies import Error
from .requeue import Requeue
from .store import J_ACTIVE
from .wire import JOB_WIRE_FIELDS, job_from_wire

__all__ = ["Federation", "LEASE_MS", "CLIENTS_WAITING", "REACHED_ZERO", "COMMANDS"]

#: The commands this machine answers (commandspec.py; Node dispatches them). MOVEJOBS is ours
#: (Disque has none): a move as a NEEDJOBS from that node would make one, asked by an operator
#: (``disque-py drain`` empties a leaving node with it). It may name jobs of any queue, so it
#: needs every queue (EVERY_QUEUE), as JSCAN does.
COMMANDS: Final = (
    CommandSpec(b"movejobs", "cmd_movejobs", -3, ("write", "fast"), ("admin",), EVERY_QUEUE,
                syntax="MOVEJOBS node-id job-id [job-id ...]",
                summary="Send jobs queued here to another node (YOURJOBS, as federation does), IDs kept",
                group="cluster", since="disque-py 0.1.0"),
)

# Why a node asks for jobs (``need_jobs``): clients wait on an empty queue, or a consumer
# took the last job of a queue that imports.
CLIENTS_WAITING: Final = 0
REACHED_ZERO: Final = 1

NEEDJOBS_MIN_REQUEST: Final = 5
NEEDJOBS_MAX_REQUEST: Final = 100
BCAST_MIN_DELAY_MS: Final = 2000
BCAST_MAX_DELAY_MS: Final = 30000
ADHOC_MIN_DELAY_MS: Final = 25
ADHOC_MAX_DELAY_MS: Final = 2000
SOURCE_VALIDITY_MS: Final = 5000
LEASE_MS: Final = BCAST_MAX_DELAY_MS + 2000  # outlasts the asker's slowest re-ask (see the docstring)
RENEW_AFTER_MS: Final = 1500  # a consumer node re-asks a pushing source whose lease is older than this
NEED_PERIOD_MS: Final = 100  # how often queues with waiters are reconsidered
OWED_IDLE_MS: Final = 1000  # serve_owed looks at the owed leases at least this often


def _lease_healthy(q: Queue, peer: str, now: int) -> bool:
    view = q.asked.get(peer)
    return view is not None and now - view[0] < RENEW_AFTER_MS and view[2] < view[1] // 2


def _request_size(q: Queue, rate: int, sources: int) -> int:
    count = rate // sources if sources else NEEDJOBS_MIN_REQUEST
    cap = max(max(q.blocked, 1) * 10, rate // 10)
    return max(NEEDJOBS_MIN_REQUEST, min(NEEDJOBS_MAX_REQUEST, count, cap))


@final
class Federation:
    def __init__(self, ctx: Context, lifecycle: Lifecycle, leases: Leases, requeue: Requeue) -> None:
        self.ctx = ctx
        self._lifecycle = lifecycle
        self._leases = leases
        self._requeue = requeue
        self._store = ctx.store
        self._stats = ctx.stats
        self._next_need = 0
        # ctx.reachable as last seen by ``tick`` or a discovery broadcast (the list object, and
        # its members): a node in the list that was not in the set came up since (``_newcomers``)
        self._reach_seen: list[str] = ctx.reachable
        self._reach_set: set[str] = set(ctx.reachable)
        # ctx.reachable as last seen by ``serve_owed``: a new one may bring an owed peer's link back
        self._owed_view: list[str] = ctx.reachable
        self._owed_delay = OWED_SOON_MS  # serve_owed's next wait while a link stays backlogged
        for key in ("needjobs_sent", "needjobs_received", "yourjobs_received", "jobs_imported", "jobs_returned"):
            ctx.stats[key] = 0

    # -- asking ------------------------------------------------------------------
    def need_jobs(self, q: Queue, kind: int) -> None:
        """Ask other nodes for jobs of ``q`` (see the module docstring)."""
        ctx = self.ctx
        if ctx.leaving or not ctx.reachable:
            return
        now = ctx.now
        if kind == REACHED_ZERO and q.import_rate(now) == 0:
            return
        bcast_delay = min(BCAST_MIN_DELAY_MS << min(q.needjobs_bcast_attempt, 8), BCAST_MAX_DELAY_MS)
        bcast_due = q.needjobs_bcast_time == 0 or now - q.needjobs_bcast_time > bcast_delay
        adhoc_delay = min(ADHOC_MIN_DELAY_MS << min(q.needjobs_adhoc_attempt, 8), ADHOC_MAX_DELAY_MS)
        if not bcast_due:
            # This runs when a consumer blocks and when one takes a queue's
            # last job: usually once or twice per job. Leave at once when the
            # rest would send nothing: no source whose lease is running out
            # (REACHED_ZERO), or no ad hoc request due yet (CLIENTS_WAITING).
            if kind == REACHED_ZERO:
                asked = q.asked
                for n, t in q.sources.items():
                    if now - t > SOURCE_VALIDITY_MS:
                        continue
                    view = asked.get(n)  # _lease_healthy, inline: this loop runs for most jobs
                    if view is None or now - view[0] >= RENEW_AFTER_MS or view[2] >= view[1] // 2:
                        break
                else:
                    return
            elif now - q.needjobs_adhoc_time <= adhoc_delay:
                return
        rate = q.import_rate(now)
        sources = self._valid_sources(q)
        count = _request_size(q, rate, len(sources))
        if bcast_due:
            q.needjobs_bcast_time = now
            q.needjobs_bcast_attempt += 1
            targets = [n for n in ctx.reachable if n not in sources]
            self._reach_seen = ctx.reachable  # every one asked: none is a newcomer for tick
            self._reach_set = set(ctx.reachable)
            # Discovery asks for few jobs, but enough to open a push lease.
            self._send_needjobs(targets, q.name, max(1, min(count, q.blocked or 1)))
        if sources and kind == REACHED_ZERO:
            # Only the sources whose push lease may be running out: a lease we
            # opened recently that has used less than half its credit keeps
            # pushing without being asked again (one NEEDJOBS per job, before).
            sources = [n for n in sources if not _lease_healthy(q, n, now)]
            if sources:
                q.needjobs_adhoc_time = now
                q.needjobs_adhoc_attempt += 1
                self._send_needjobs(sources, q.name, count)
        elif sources and now - q.needjobs_adhoc_time > adhoc_delay:
            q.needjobs_adhoc_time = now
            q.needjobs_adhoc_attempt += 1
            self._send_needjobs(sources, q.name, count)

    def _send_needjobs(self, nodes: list[str], name: bytes, count: int) -> None:
        if nodes:
            ctx = self.ctx
            ctx.send(nodes, need_jobs(bytes(name), count))
            self._stats["needjobs_sent"] += len(nodes)
            q = ctx.queues.get(name)
            if q is not None:
                now = ctx.now
                for n in nodes:
                    q.asked[n] = [now, count, 0]

    def _valid_sources(self, q: Queue) -> list[str]:
        ctx = self.ctx
        now = ctx.now
        reachable = set(ctx.reachable)
        stale = [n for n, t in q.sources.items() if now - t > SOURCE_VALIDITY_MS]
        for n in stale:
            del q.sources[n]
        return [n for n in q.sources if n in reachable]

    def tick(self, waited: dict[bytes, Queue]) -> None:
        """Keep asking for the queues with blocked clients (Disque's clientsCron); ``waited``
        is ``Blocking.waited``."""
        ctx = self.ctx
        if ctx.reachable is not self._reach_seen:  # the shell set a new view: anybody new?
            self._newcomers(waited)
        if ctx.now < self._next_need:
            return
        self._next_need = ctx.now + NEED_PERIOD_MS
        if ctx.cluster_size <= 1:
            return
        for q in list(waited.values()):
            if not q.jobs:
                self.need_jobs(q, CLIENTS_WAITING)

    def _newcomers(self, waited: dict[bytes, Queue]) -> None:
        """Nodes reachable now that were not at the last look (restarted, or back from a cut)
        are asked at once for the queues whose clients wait, and made sources, so that the ad
        hoc requests (25 ms, doubling) go on asking them while nothing comes, for
        ``SOURCE_VALIDITY_MS``: a node that was down held no lease of ours, and the jobs it
        queued again as it started (its AOF) waited for our next discovery broadcast, up to
        30 s later. Asking again covers a request that came before that node's own link to us
        was up (it grants the lease, but has no link to answer on)."""
        ctx = self.ctx
        reach = self._reach_seen = ctx.reachable
        seen = self._reach_set
        new = [n for n in reach if n not in seen]
        self._reach_set = set(reach)
        if not new or ctx.leaving:
            return
        now = ctx.now
        for q in list(waited.values()):
            if q.jobs or not q.blocked:
                continue
            for n in new:
                q.sources[n] = now
            q.needjobs_adhoc_time = now
            q.needjobs_adhoc_attempt = 0
            self._send_needjobs(new, q.name, _request_size(q, q.import_rate(now), len(self._valid_sources(q))))

    def next_need(self) -> int:
        """When ``tick`` asks again for queues with waiters (only matters while some wait): now
        if the shell set a new view of the cluster since the last look (a node may have come
        up: ``_newcomers``), not at the next 100 ms period."""
        ctx = self.ctx
        if ctx.reachable is not self._reach_seen:
            return ctx.now
        return max(self._next_need, ctx.now + 1)

    def on_queued(self, sender: str, m: Queued) -> None:
        """QUEUED: ``Requeue.on_queued``; then, if clients wait here on the job's queue and it is
        empty, the sender, which has just queued a job we hold a copy of, is asked for it at
        once (NEEDJOBS), unless its push lease is young and has credit (it pushes without being
        asked). Waiting for the next discovery broadcast took up to 30 s (Disque's pull the
        same) when the sender kept the job for a local consumer or held no lease of ours. One
        NEEDJOBS at most per QUEUED received, and only while clients wait here."""
        self._requeue.on_queued(sender, m)
        job = self._store.get(m.job_id)
        if job is None or job.queue is None:
            return
        ctx = self.ctx
        q = ctx.queues.get(job.queue)
        if q is None or not q.blocked or q.jobs or ctx.leaving or sender not in ctx.reachable:
            return
        now = ctx.now
        if _lease_healthy(q, sender, now):
            return
        self._send_needjobs([sender], q.name, _request_size(q, q.import_rate(now), len(self._valid_sources(q))))

    # -- answering ---------------------------------------------------------------
    def on_needjobs(self, sender: str, m: NeedJobs) -> None:
        ctx = self.ctx
        name = m.name
        self._stats["needjobs_received"] += 1
        count = min(m.count, NEEDJOBS_MAX_REQUEST)
        by_queue = self._leases.by_queue
        leases = by_queue.get(name)
        if count == 0:
            if leases is not None:
                leases.pop(sender, None)
                if not leases:
                    del by_queue[name]
            return
        if leases is None:
            leases = by_queue[name] = {}
        leases[sender] = [ctx.now + LEASE_MS, count]
        q = ctx.queues.get(name)
        if q is None or not q.jobs or q.flags & PAUSED_OUT or q.import_rate(ctx.now) > 0:
            return
        if q.blocked:
            return  # local consumers come first
        if sender not in ctx.reachable:
            # no link to send them on (Disque dequeued them first, and lost RETRY 0 ones): they
            # go when it is up again (a link back is no newcomer for the asker: it may not ask
            # again for 30 s)
            self._leases.owe(sender, name)
            return
        if self._send_queued(sender, q, leases):
            self._leases.owe(sender, name)  # a RETRY 0 job waits for a link that drains

    def _send_queued(self, peer: str, q: Queue, leases: dict[str, list[int]]) -> bool:
        """Answer ``peer``'s lease on ``q`` (in ``leases``) as a NEEDJOBS: up to its credit of
        the jobs queued here, at most half of them unless there are twice as many, in this
        input's YOURJOBS. True when a RETRY 0 job was held back for a backlogged link."""
        lease = leases[peer]
        count = lease[1]
        qlen = len(q.jobs)
        n = count if qlen >= 2 * count else max(1, qlen // 2)
        hold_amo = peer in self.ctx.backlogged  # RETRY 0 jobs wait for a link that drains
        held = False
        jobs = q.jobs
        requeue = self._requeue
        export = self._leases.export
        for _ in range(n):
            if hold_amo and jobs and jobs[0].retry == 0:
                held = True
                break
            job = requeue.fetch(q)
            if job is None:
                break
            export(peer, job)
            lease[1] -= 1
        if lease[1] <= 0:
            del leases[peer]
        return held

    def next_owed(self) -> int:
        """When ``serve_owed`` runs next (only matters while ``Leases.owed`` names a peer): now
        if the shell set a new view of the cluster since its last run (a link may be back)."""
        ctx = self.ctx
        if ctx.reachable is not self._owed_view:
            return ctx.now
        return self._leases.owed_at

    def serve_owed(self) -> None:
        """Send the jobs owed to peers whose lease could not be served when they came (see
        "Owed leases"): for each owed (peer, queue), while the peer's lease lasts and jobs are
        queued here for nobody waiting here, the jobs go to a peer that is reachable and whose
        link drains, as its NEEDJOBS would take them (``_send_queued``). A peer out of reach
        waits for the next view (``next_owed``: at once then); one whose link is backlogged is
        looked at again soon, backing off (``OWED_SOON_MS`` doubling up to ``OWED_IDLE_MS``);
        the rest at least every ``OWED_IDLE_MS``, so a lease that ends is forgotten here too."""
        ctx = self.ctx
        now = ctx.now
        leases_ = self._leases
        owed = leases_.owed
        if ctx.reachable is not self._owed_view:
            self._owed_view = ctx.reachable
            self._owed_delay = OWED_SOON_MS  # a new view: a backlog is new too
        reachable = set(ctx.reachable)
        by_queue = leases_.by_queue
        queues = ctx.queues
        held = False
        for peer, names in list(owed.items()):
            for name in list(names):
                leases = by_queue.get(name)
                lease = leases.get(peer) if leases is not None else None
                q = queues.get(name)
                if (lease is None or lease[0] < now or q is None or not q.jobs or q.blocked
                        or q.flags & PAUSED_OUT or q.import_rate(now) > 0):  # fmt: skip
                    names.discard(name)  # nothing owed any more (or local consumers first)
                elif peer in reachable:
                    if self._send_queued(peer, q, leases):  # type: ignore[arg-type]  # has the lease
                        held = True
                    else:
                        names.discard(name)
            if not names:
                del owed[peer]
        if held:
            leases_.owed_at = now + self._owed_delay
            self._owed_delay = min(self._owed_delay * 2, OWED_IDLE_MS)
        else:
            leases_.owed_at = now + OWED_IDLE_MS

    def cmd_movejobs(self, client: int, argv: list[bytes]) -> int | Error:
        """MOVEJOBS node-id job-id...: each named job queued here leaves for that node in one
        YOURJOBS, exactly as a NEEDJOBS from it would take it (``on_needjobs``): dequeued here;
        an at-least-once job keeps its copy here (active, the receiver added to its holders, so
        acks and requeues reach it); a RETRY 0 job's only copy leaves (watched until the socket
        takes it, ``on_moves_unsent``), and none goes into a link that does not drain. The
        receiver queues its copy (an active one it holds already, or a new one: IDs kept).
        Jobs not queued here (unknown, active, acked) are skipped. Replies how many left."""
        ctx = self.ctx
        ids = argv[2:]
        bad = check_job_ids(ids)
        if bad:
            return bad
        target = argv[1].decode("utf-8", "replace")
        if target == ctx.id:
            return Error("ERR MOVEJOBS needs another node than this one")
        if target not in ctx.reachable:
            return Error("ERR no link to node '%s': not a reachable node of this cluster" % target[:64])
        hold_amo = target in ctx.backlogged
        store = self._store
        dequeue = self._requeue.dequeue_job
        export = self._leases.export
        journal = ctx.journal
        moved = 0
        for job_id in ids:
            job = store.get(job_id)
            if job is None or job.state != QUEUED or (job.retry == 0 and hold_amo):
                continue
            dequeue(job)
            if job.retry == 0:  # as fetch() marks it: never queued here again
                job.flags |= F_DELIVERED
                if journal is not None:
                    journal.append((J_ACTIVE, job))
            export(target, job)
            moved += 1
        return moved

    # -- importing ---------------------------------------------------------------
    def on_yourjobs(self, sender: str, m: YourJobs) -> None:
        self._stats["yourjobs_received"] += 1
        leases = self._leases
        leases.importing = True
        try:
            self._import_jobs(sender, m.jobs, self.ctx.now)
        finally:
            leases.importing = False

    def _import_jobs(self, sender: str, jobs: list, now: int) -> None:
        ctx = self.ctx
        touched: dict[bytes, Queue] = {}
        store = self._store
        me = ctx.id
        malformed = False
        for wire in jobs:  # checked one by one here (see messages.py)
            # A copy held here already (replicated to this node, say) is the one queued: the
            # wire form only has to name it, so it is not built into a second Job.
            job = None
            if type(wire) is list and len(wire) >= JOB_WIRE_FIELDS and type(wire[0]) is bytes:
                job = store.get(wire[0])
            if job is not None:
                if wire[1] != job.queue or job.state != ACTIVE:
                    # queued or acked here already; or still waiting for its copies here (this
                    # node created it, and another holder's RETRY ran out first): queueing it
                    # now would leave its ADDJOB client waiting for ever (REPL_CLIENTS). The
                    # sender gave its turn away, though: such a job is queued here when its
                    # wait ends, even a DEDUP one that was to yield to the sender (F_YIELD,
                    # dedup.py); else neither queued it, and it waited for the sender's next
                    # RETRY and for this node's consumers to ask the sender again
                    if job.state == WAIT_REPL and wire[1] == job.queue:
                        job.flags &= ~F_YIELD
                    continue
            else:
                job = job_from_wire(wire, now)
                if job is None:
                    malformed = True
                    continue
                if self._lifecycle.is_buried(job.id):
                    # deleted here a moment ago (acked and collected, say) while this copy was on
                    # its way: drop it, and tell the sender, which may not have heard yet
                    ctx.send_lazy((sender,), del_job_holders(bytes(job.id), [me]))
                    continue
                if me not in job.delivered:
                    job.delivered = tuple(job.delivered) + (me,)
                store.register(job)
            job.flags &= ~F_BCAST_QUEUED  # a move, not a requeue: no QUEUED broadcast
            if job.retry == 0 and job.flags & F_DELIVERED:
                continue  # delivered here once already: at most once
            q = ctx.get_queue(job.queue)  # type: ignore[arg-type]  # a queued job has a queue
            if not self._requeue.enqueue_job(job, False, True):  # fresh: moved in, queued here this one time
                continue
            self._stats["jobs_imported"] += 1
            touched[q.name] = q
            view = q.asked.get(sender)
            if view is not None:
                view[2] += 1
            if sender not in q.sources:
                q.needjobs_bcast_attempt = 0  # a new source: discovery may back off again
            q.sources[sender] = now
            q.note_import(now)
            q.needjobs_adhoc_attempt = 0
        for q in touched.values():
            self._renew_credit(q, sender, now)
        if malformed:
            ctx.bus_stats["messages_malformed"] += 1  # once per message, whatever it took

    def on_moves_unsent(self, peer: str, message: object, now: int) -> None:
        """A YOURJOBS to ``peer`` (``messages.moves_to_watch``) never reached the socket: its link closed
        first. Its RETRY 0 jobs left their only copy in it, so they are queued here again, as
        never delivered; at-least-once ones still have their copy here, which requeues. Called
        once the link is down, so they are not pushed to ``peer`` again. (``Node`` sets the
        time and flushes ``Leases.outgoing`` after.)"""
        if not isinstance(message, tuple) or len(message) < 2 or message[0] != "YOURJOBS":
            return
        ctx = self.ctx
        if peer in ctx.reachable:
            # a view from before the link ended (the shell's never is; a model's may lag): the
            # peer is out of reach until the next view, or these jobs would go into the same
            # closed link again, and come back, for ever
            ctx.reachable = [n for n in ctx.reachable if n != peer]
        store = self._store
        leases = self._leases
        by_queue = leases.by_queue
        for wire in message[1]:
            if wire[7] != 0 or store.get(wire[0]) is not None:
                continue  # at least once, or a copy of it came back meanwhile
            job = job_from_wire(wire, now)
            if job is None or self._lifecycle.is_buried(job.id):
                continue
            # The credit this job used comes back to the peer's lease (ended when the job took its
            # last credit: a new one then, for LEASE_MS, that credit only): it never arrived.
            name: bytes = job.queue  # type: ignore[assignment]  # a moved job has a queue
            peers = by_queue.get(name)
            if peers is None:
                peers = by_queue[name] = {}
            lease = peers.get(peer)
            if lease is None or lease[0] < now:
                peers[peer] = [now + LEASE_MS, 1]
            else:
                lease[1] += 1
            store.register(job)
            if self._requeue.enqueue_job(job, fresh=True):  # as never delivered: queued this one time
                self._stats["jobs_returned"] += 1
                if job.state == QUEUED:  # not pushed on to another node: owed to this one
                    leases.owe(peer, name)
            else:
                store.unregister(job)

    def renew_on_take(self, q: Queue) -> None:
        """A consumer took a job and some are left: the top-up rule of an import, checked
        again, so that a source whose last batch arrived whole is asked for the next one
        while this one is consumed, not once it is gone (see "Top-up")."""
        now = self.ctx.now
        for sender in q.asked:
            self._renew_credit(q, sender, now)  # an ask replaces this key's value only

    def _renew_credit(self, q: Queue, sender: str, now: int) -> None:
        """Jobs came from ``sender``: ask again before its credit runs out, while they are
        consumed here as fast as they come (the local queue holds less than the credit)."""
        view = q.asked.get(sender)
        if view is None or view[2] * 2 < view[1] or len(q.jobs) >= view[1] or self.ctx.leaving:
            return
        sources = len(self._valid_sources(q))
        self._send_needjobs([sender], q.name, _request_size(q, q.import_rate(now), sources))
