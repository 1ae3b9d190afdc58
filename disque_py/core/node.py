"""Node: one Disque node's job and queue state, composed of its machines.

Theory of operation
-------------------
The shell feeds four kinds of input, each stamped with the current time
(monotonic milliseconds):

* ``execute(client, argv, now)``: a client command. Returns the reply value
  for that client, or ``BLOCKED`` when the client must wait (GETJOB with no
  job, ADDJOB waiting for its copies). Replies for other clients produced
  meanwhile (a blocked GETJOB served by this ADDJOB) are queued as effects.
* ``receive_data(sender, kind, body, now)``: a job-layer message from a peer,
  checked and built once, by its kind's receiver (``messages.receivers``),
  which calls the machine's handler; a malformed one is dropped and counted in ``bus_stats["messages_malformed"]``. An exception raised by
  a handler is this node's bug, not the peer's: it is not caught here.
* ``tick(now)``: time passed. Runs whatever is due, machine by machine.
* ``client_closed(client)``: a connection went away; what it waited for
  disappears without a trace.

After any input the shell calls ``take_effects()`` and carries them out, then
sleeps until ``next_wakeup()`` (the earliest of every machine's) or the next
input. The node owns no socket, task or clock; wall-clock time is ``now +
wall_offset`` (the shell measures the offset once), used only for job
``ctime``.

Node decides nothing about jobs itself: it routes each command and message to
the machine that owns it, and each job's wake-up to the machine its state names,
runs each machine's timers, and takes the earliest of their wake-ups. Each machine
declares the commands it answers in its module's ``COMMANDS`` (``commandspec.py``);
``Node`` binds them into its table once, at construction. Which file decides what:

=================  ============================================================
``lifecycle.py``   the job table's schedule (ONE_TIMER), deletion, tombstones
                   and the DEDUP window (what is remembered of deleted jobs);
                   DELJOB, SHOW, JSCAN
``leases.py``      push leases: where a newly queued job goes instead, and the
                   jobs leaving in this input's YOURJOBS
``requeue.py``     queueing, RETRY requeues, WILLQUEUE/QUEUED/WORKING/ENQUEUE;
                   ENQUEUE, DEQUEUE, WORKING
``replication.py`` a new job and its copies (REPLJOB/GOTJOB, NOREPL)
``acks.py``        ACK_ONCE, ack GC (SETACK/GOTACK/DELJOB), dummy acks;
                   ACKJOB, FASTACK
``delivery.py``    NACK (DELAY, REASON, TRACE, DEAD), RELEASE, BACKOFF,
                   MAXDELIVER, dead letters; NACKED/DELIVERED/RETURNED
``federation.py``  NEEDJOBS/YOURJOBS, imports
``blocking.py``    GETJOB, blocked clients and their timeouts, delivery,
                   queue eviction; QLEN, QPEEK, QSTAT, QSCAN, PAUSE
``dedup.py``       ADDJOB (parsed, its DEDUP key, then ``Replication.add``);
                   HASJOB/HAVEJOB
``limits.py``      the groups' settings kept by the cluster (GROUP WEIGHT, LIMIT),
                   the limits' shares, GROUP; GROUPS messages
``memory.py``      the maxmemory level: external replication, what is let
                   go, the commands refused at 100 %
``messages.py``    the bus messages' types and their checks
``invariants.py``  the named invariants, as one check (tests, simulations)
=================  ============================================================

Who calls whom
--------------
The machines share one ``Context`` (``context.py``: state, outbox, two shared tables),
and each receives, as typed constructor arguments, the machines it calls. ``Node`` builds
them in this order, so a machine only ever calls one built before it, and no module
imports one that imports it back (``tests/test_contracts.py``)::

    Limits(ctx)                                             calls none (groups' settings, limits)
    Lifecycle(ctx)                                          calls none
    Leases(ctx)                                             calls none
    Requeue(ctx, lifecycle, leases)
    Replication(ctx, lifecycle, requeue, limits)
    Acks(ctx, lifecycle, requeue, replication, limits)
    Delivery(ctx, lifecycle, requeue, replication, acks)
    Federation(ctx, lifecycle, leases, requeue)
    Blocking(ctx, requeue, federation, delivery, limits)
    Dedup(ctx, lifecycle, replication)                     ADDJOB comes in here
    Memory(ctx, lifecycle, acks, on_level=Node's)          the shell calls it

What would have to call upward is routed by ``Node`` instead, or told by the
lower machine's return value:

* a job's wake-up (``_run_due``): past its TTL, ``Lifecycle.expire``; acked,
  ``Acks.try_gc``; active or queued, ``Requeue.requeue_due``, and when that says
  the RETRY of a job with a delivery policy ended, ``Delivery.retry_ended``;
* a GOTJOB (``_on_gotjob``): ``Replication.on_gotjob``, which hands back a dead
  letter not waiting for its copies, for ``Delivery.copied``;
* the end of every input: ``Blocking.serve_ready`` (queues the machines below it
  marked ``ctx.ready``) and ``Leases.flush`` (the YOURJOBS of this input);
* a restart's queued jobs (``restore_finish``): ``Lifecycle.restore_finish``
  returns them, ``Requeue.enqueue_restored`` queues them;
* a job deleted while its copies are made answers its ADDJOB client from
  ``Lifecycle.delete_job``, through the table ``Replication`` keeps in the context.

ADDJOB, top to bottom: ``Dedup.cmd_addjob`` (parse; a DEDUP key looked up: a hit,
or a wait for the other nodes' answers) -> ``Replication.add`` (checks, the job,
its copies) -> ``Requeue.enqueue_job`` (queued, or pushed: ``Leases``) ->
``Lifecycle.reschedule``; its client is answered now, or when its copies are made
(``Replication.achieved``).

On a single node the cluster view is empty (``cluster_size`` 1) and every
ack is collected at once.
"""

from __future__ import annotations

from typing import Any, Callable, Final, final

from . import acks as acks_mod
from . import blocking as blocking_mod
from . import dedup as dedup_mod
from . import delivery as delivery_mod
from . import federation as federation_mod
from . import lifecycle as lifecycle_mod
from . import limits as limits_mod
from . import requeue as requeue_mod
from .acks import Acks
from .blocking import Blocking
from .commandspec import ALWAYS, CommandSpec, bind, check_unique
from .context import Context
from .dedup import Dedup
from .delivery import Delivery
from .effects import BLOCKED, Reply, Send
from .features import adapt
from .federation import Federation
from .job import ACKED, WAIT_REPL
from .leases import Leases
from .lifecycle import Lifecycle
from .limits import Limits
from .memory import Memory
from .messages import GotJob, receivers
from .replication import Replication
from .replies import Error, err
from .requeue import Requeue
from .store import J_DEL

__all__ = ["Node", "BLOCKED", "CORE_COMMANDS", "OOM_COMMANDS"]

QUEUE_GC_PERIOD_MS: Final = 1000  # queue eviction and lease expiry run this often
# Job wake-ups run per tick at most (about 3 µs each compiled): a tick is one slice of the shell's
# loop, and more due than this wait for the next (next_wakeup stays due: the shell ticks again,
# with a pass of its clients between; server/timers.py).
SCHEDULE_BATCH: Final = 8
UNKNOWN_KINDS_MAX: Final = 64  # unknown message kinds named in Node.unknown_kinds, at most

#: A command's handler: (client, argv) -> its reply (any value the shell's encoder takes) or
#: BLOCKED.
Handler = Callable[[int, list[bytes]], object]

#: The Node attribute holding the machine that answers each module's ``COMMANDS``; the
#: node itself answers its own (HELLO). One declaration per command (commandspec.py):
#: the dispatch table, the -OOM refusals, COMMAND's reply and the ACL rights derive from it.
_OWNERS: Final[tuple[tuple[str | None, tuple[CommandSpec, ...]], ...]] = (
    ("dedup", dedup_mod.COMMANDS),
    ("blocking", blocking_mod.COMMANDS),
    ("acks", acks_mod.COMMANDS),
    ("lifecycle", lifecycle_mod.COMMANDS),
    ("requeue", requeue_mod.COMMANDS),
    ("delivery", delivery_mod.COMMANDS),
    ("federation", federation_mod.COMMANDS),
    ("limits", limits_mod.COMMANDS),
    (None, (CommandSpec(b"hello", "cmd_hello", 1, ("readonly", "fast"), ALWAYS,
                        syntax="HELLO [protover [AUTH username password] [SETNAME clientname]]",
                        summary="The cluster's nodes and their priorities; HELLO 2|3: Redis's handshake",
                        group="cluster"),)),
)
#: Every command of the core, each declared once.
CORE_COMMANDS: Final[tuple[CommandSpec, ...]] = check_unique(spec for _, specs in _OWNERS for spec in specs)
#: What memory level 3 refuses with -OOM (memory.py): Disque's "m" commands, the ``denyoom`` ones.
OOM_COMMANDS: Final[frozenset[bytes]] = frozenset(spec.name for spec in CORE_COMMANDS if "denyoom" in spec.flags)


def _method_of(owner: object) -> Callable[[str], Handler]:
    """``bind``'s lookup for one machine: its method by name."""

    def lookup(name: str) -> Handler:
        handler: Handler = getattr(owner, name)
        return handler

    return lookup


@final
class Node:
    def __init__(
        self,
        node_id: str,
        *,
        seed: bytes,
        now: int,
        wall_offset: int = 0,
        address: tuple[str, int] = ("127.0.0.1", 7711),
    ) -> None:
        # What the machines share; the shell reads and sets the clock and the cluster view on it
        # (node.ctx.now, .reachable, .cluster_size ...).
        ctx = self.ctx = Context(node_id, seed, now, wall_offset, address)
        self.id = node_id  # read-only outside: set_id changes it (here and in the context)
        self.store = ctx.store  # the job table and its schedule (never rebound)
        self.queues = ctx.queues  # queues by name (never rebound)
        self.stats = ctx.stats  # counters for INFO (never rebound)
        # (id, ip, port, priority) for HELLO; None = just myself.
        self.hello_nodes: list[tuple[str, str, int, int]] | None = None
        self.bus_stats = ctx.bus_stats  # {"messages_malformed": n, "messages_unknown": n}
        # Kinds of message no machine here knows (a newer peer's), with their counts: at most
        # UNKNOWN_KINDS_MAX kinds named (the shell logs each once), the rest only counted.
        self.unknown_kinds: dict[str, int] = {}
        # The machines, lowest first: each is handed the ones it calls, all built before it (the
        # module docstring draws the order).
        self.limits = limits = Limits(ctx)
        self.lifecycle = lifecycle = Lifecycle(ctx)
        self.leases = leases = Leases(ctx)
        self.requeue = requeue = Requeue(ctx, lifecycle, leases)
        self.replication = replication = Replication(ctx, lifecycle, requeue, limits)
        self.acks = acks = Acks(ctx, lifecycle, requeue, replication, limits)
        self.delivery = delivery = Delivery(ctx, lifecycle, requeue, replication, acks)
        self.federation = federation = Federation(ctx, lifecycle, leases, requeue)
        self.blocking = blocking = Blocking(ctx, requeue, federation, delivery, limits)
        self.dedup = dedup = Dedup(ctx, lifecycle, replication)
        # The memory level (memory.py); while it is 3 ``commands`` is a copy that refuses
        # OOM_COMMANDS, so no command pays for the check.
        self.memory = Memory(ctx, lifecycle, acks, self._memory_level_changed)
        self._dedup_queries = dedup.queries  # never rebound: tested on every pass (tick, next_wakeup)
        # Never rebound: the end of every input checks these.
        self._ready = ctx.ready
        self._outgoing = leases.outgoing
        self._owed = leases.owed  # never rebound either: tested at every tick
        self._grouped = ctx.groups.containers  # queues holding jobs of a group (groups.py)
        self._next_gc = now + QUEUE_GC_PERIOD_MS
        # kind -> receiver (messages.receivers): checks a peer's message, builds it and calls the
        # handler of the machine that owns the kind, in one call.
        self._receivers = receivers({
            "REPLJOB": replication.on_repljob,
            "GOTJOB": self._on_gotjob,
            "ENQUEUE": requeue.on_enqueue,
            "QUEUED": federation.on_queued,  # Requeue.on_queued, then a pull if clients wait here
            "WORKING": requeue.on_working,
            "WILLQUEUE": requeue.on_willqueue,
            "SETACK": acks.on_setack,
            "GOTACK": acks.on_gotack,
            "DELJOB": acks.on_deljob,
            "PAUSE": blocking.on_pause,
            "NEEDJOBS": federation.on_needjobs,
            "YOURJOBS": federation.on_yourjobs,
            "NACKED": delivery.on_nacked,
            "DELIVERED": delivery.on_delivered,
            "RETURNED": delivery.on_returned,
            "HASJOB": dedup.on_hasjob,
            "HAVEJOB": dedup.on_havejob,
            "GROUPS": limits.on_groups,
        })  # fmt: skip
        self.commands: dict[bytes, tuple[Handler, int]] = {}
        for attr, specs in _OWNERS:
            owner: object = self if attr is None else getattr(self, attr)
            self.commands.update(bind(specs, _method_of(owner)))
        self._commands_ok = self.commands
        self._oom = False
        self._disk_error: Error | None = None

    def _memory_level_changed(self, level: int) -> None:
        self._oom = level >= 3
        self._choose_commands()

    def refuse_new_jobs(self, error: Error | None) -> None:
        """While the AOF cannot write (a full disk: the shell's ``Aof``), ADDJOB gets ``error``
        (Redis's -MISCONF); None: accepted again. Jobs already held still drain."""
        self._disk_error = error
        self._choose_commands()

    def _choose_commands(self) -> None:
        """``commands``: the plain table, or a copy whose growing commands refuse (no command
        pays for the check while nothing is refused)."""
        if not self._oom and self._disk_error is None:
            self.commands = self._commands_ok
            return
        table = dict(self._commands_ok)
        if self._oom:
            memory = self.memory

            def refuse(client: int, argv: list[bytes]) -> Error:
                memory.refused += 1
                return memory.oom_error()

            for name in OOM_COMMANDS:
                table[name] = (refuse, table[name][1])
        error = self._disk_error
        if error is not None:
            table[b"addjob"] = (lambda client, argv: error, table[b"addjob"][1])
        self.commands = table

    # -- the AOF -------------------------------------------------------------------
    def set_journal(self, journal: list | None) -> None:
        """Start (a list the shell drains) or stop (None) recording what the AOF must learn
        (``store.J_LOAD`` ...)."""
        self.ctx.journal = journal
        self.ctx.store.journal = journal

    def restore_finish(self, enqueue_once: bool) -> dict[str, int]:
        """The AOF loaded (``persistence/loader.py``): every job gets its wake-up
        (``Lifecycle.restore_finish``), and with ``enqueue_once`` the ones written as queued
        are queued again now, in their order (``Requeue.enqueue_restored``). Counts by outcome."""
        counts, to_queue = self.lifecycle.restore_finish(enqueue_once)
        if to_queue:
            counts["queued"] = self.requeue.enqueue_restored(to_queue)
        return counts

    # =====================================================================
    # Inputs
    # =====================================================================
    def execute(self, client: int, argv: list[bytes], now: int) -> object:
        """Run one client command; returns its reply or ``BLOCKED``."""
        return self.execute_named(client, argv[0].lower(), argv, now)

    def execute_named(self, client: int, name: bytes, argv: list[bytes], now: int) -> object:
        """:meth:`execute` for a caller that has lowered the command's name already (the shell's
        dispatcher, once per command)."""
        self.ctx.now = now
        entry = self.commands.get(name)
        if entry is None:
            return err("unknown command '%s'" % argv[0].decode("utf-8", "replace")[:128])
        handler, arity = entry
        n = len(argv)
        if (arity > 0 and n != arity) or n < -arity:
            return err("wrong number of arguments for '%s' command" % name.decode())
        reply = handler(client, argv)
        if self._ready:
            self.blocking.serve_ready()
        if self._outgoing:
            self.leases.flush()
        return reply

    def receive_data(self, sender: Any, kind: Any, body: Any, now: int) -> None:
        """A job-layer message from another node. Malformed ones are dropped and counted; a
        handler's own exception propagates (it is a bug here, not the peer's). (``sender``
        and ``kind`` are ``Any``: a peer's, checked here; compiled, an argument typed ``str``
        would be refused before the check.)"""
        self.ctx.now = now
        try:
            receive = self._receivers[kind]
        except (KeyError, TypeError):  # an unknown kind, or one that is not even hashable
            if type(kind) is str:  # a newer peer's, maybe (features.py): counted, dropped
                self.bus_stats["messages_unknown"] += 1
                unknown = self.unknown_kinds
                if kind in unknown or len(unknown) < UNKNOWN_KINDS_MAX:
                    unknown[kind] = unknown.get(kind, 0) + 1
            else:
                self.bus_stats["messages_malformed"] += 1
            return
        # The receiver returns False for a malformed body (its handler not called).
        if type(body) is not list or type(sender) is not str or receive(sender, body) is False:
            self.bus_stats["messages_malformed"] += 1
            return
        if self._ready:
            self.blocking.serve_ready()
        if self._outgoing:
            self.leases.flush()

    def _on_gotjob(self, sender: str, m: GotJob) -> None:
        """GOTJOB: a copy confirmed (``Replication.on_gotjob``); one of a dead letter made here
        (handed back) counts for ``Delivery.copied``."""
        dead_letter = self.replication.on_gotjob(sender, m)
        if dead_letter is not None:
            self.delivery.copied(dead_letter, sender)

    def on_moves_unsent(self, peer: str, message: object, now: int) -> None:
        """A YOURJOBS to ``peer`` never reached the socket (see ``Federation.on_moves_unsent``)."""
        self.ctx.now = now
        self.federation.on_moves_unsent(peer, message, now)
        if self._outgoing:
            self.leases.flush()  # pushed on to another node at once, as after any input

    def tick(self, now: int) -> None:
        """Run everything that is due at ``now``."""
        ctx = self.ctx
        ctx.now = now
        replication = self.replication
        if replication.timers:
            replication.tick(now)
        self._run_due(now)
        if self._dedup_queries:  # ADDJOB DEDUPs waiting for the other nodes (dedup.py)
            self.dedup.tick(now)
        blocking = self.blocking
        blocking.tick(now)
        lifecycle = self.lifecycle
        lifecycle.forget_buried(now)
        if now >= self._next_gc:
            blocking.gc_queues()
            if lifecycle.gone:
                lifecycle.forget_gone(now)  # DEDUP IDs whose window ended (looked up with their end)
            leases = self.leases
            if leases.by_queue:
                leases.gc_leases()
            if self.delivery.pending:  # dead letters made here still short of their copies
                self.delivery.retry_copies(now)
            self._next_gc = now + QUEUE_GC_PERIOD_MS
        if blocking.blocked and ctx.cluster_size > 1:
            self.federation.tick(blocking.waited)
        if self._owed:  # leases that jobs wait here for, until their peer's link is up
            federation = self.federation
            if now >= federation.next_owed():
                federation.serve_owed()
        limits = self.limits
        if limits.settings or limits.peers or (self._grouped and not limits.synced):  # groups (limits.py)
            limits.tick(now)
        if self._ready:
            blocking.serve_ready()
        if self._outgoing:
            self.leases.flush()
        if ctx.lazy_at and now >= ctx.lazy_at:
            ctx.flush_lazy()

    def _run_due(self, now: int) -> None:
        """The job wake-ups due at ``now`` (at most SCHEDULE_BATCH), earliest first, each to the
        machine its state names: past its TTL, ``Lifecycle.expire``; acked, a GC attempt
        (``Acks.try_gc``, which may delete it); active or queued, ``Requeue.requeue_due``
        (WILLQUEUE, requeue, or a new RETRY period), and the end of the RETRY of a job with a
        delivery policy goes on to ``Delivery.retry_ended``. Then its next wake-up."""
        store = self.store
        lifecycle = self.lifecycle
        for job in store.pop_due(now, SCHEDULE_BATCH):
            if job.etime <= now:
                lifecycle.expire(job)
                continue
            state = job.state
            if state == ACKED:
                self.acks.try_gc(job)
                if store.get(job.id) is not job:
                    continue  # collected
            elif state != WAIT_REPL:
                if self.requeue.requeue_due(job):
                    self.delivery.retry_ended(job)
            lifecycle.reschedule(job)

    def client_closed(self, client: int) -> None:
        self.blocking.client_closed(client)
        self.replication.client_closed(client)
        if self.dedup.queries:
            self.dedup.client_closed(client)

    def take_effects(self) -> list[Reply | Send]:
        ctx = self.ctx
        effects = ctx.effects
        if effects:
            ctx.effects = []
            if ctx.lacking:  # a peer of an older release: only what it understands (features.py)
                return adapt(effects, ctx.lacking)
        return effects

    def next_wakeup(self) -> int | None:
        """Monotonic ms of the next due timer (the earliest of every machine's), or None."""
        # Straight-line tests, not a loop over a tuple of candidates: the shell asks after
        # every pass, and most candidates are absent.
        ctx = self.ctx
        best = ctx.store.next_awake()
        blocking = self.blocking
        at = blocking.next_wakeup()
        if at is not None and (best is None or at < best):
            best = at
        if ctx.queues or self.leases.by_queue or self.lifecycle.gone:
            at = self._next_gc
            if best is None or at < best:
                best = at
        at = ctx.lazy_at
        if at and (best is None or at < best):
            best = at
        if self._dedup_queries:
            at = self.dedup.next_wakeup()
            if best is None or at < best:
                best = at
        replication = self.replication
        if replication.timers:
            at = replication.next_wakeup()
            if at is not None and (best is None or at < best):
                best = at
        if blocking.blocked and ctx.cluster_size > 1:
            at = self.federation.next_need()
            if best is None or at < best:
                best = at
        if self._owed:
            at = self.federation.next_owed()
            if best is None or at < best:
                best = at
        limits = self.limits
        if limits.settings or limits.peers or (self._grouped and not limits.synced):  # (no group: neither)
            at = limits.next_wakeup()
            if at is not None and (best is None or at < best):
                best = at
        return best

    # =====================================================================
    # Introspection used by the shell (INFO, CLIENT LIST ...)
    # =====================================================================
    @property
    def blocked_clients(self) -> int:
        return len(self.blocking.blocked) + len(self.ctx.repl_client_jobs) + len(self.dedup.client_queries)

    def is_blocked(self, client: int) -> bool:
        return (client in self.blocking.blocked or client in self.ctx.repl_client_jobs
                or client in self.dedup.client_queries)  # fmt: skip

    def flushall(self) -> None:
        """DEBUG FLUSHALL: forget every job and queue; waiters get a timeout reply."""
        self.blocking.flushall()
        self.replication.flushall()
        self.dedup.flushall()
        ctx = self.ctx
        journal = ctx.journal
        if journal is not None:  # the AOF forgets them too, in this pass's write
            journal.extend((J_DEL, job) for job in ctx.store.values())
        ctx.store.clear()
        ctx.queues.clear()
        self.blocking.clear()
        self.lifecycle.flushall()

    def info_fields(self) -> dict[str, dict[str, int]]:
        return {
            "jobs": {"registered_jobs": len(self.ctx.store)},
            "queues": {
                "registered_queues": len(self.ctx.queues),
                # (queue, peer) pairs this node may push jobs to (federation leases)
                "push_leases": sum(map(len, self.leases.by_queue.values())),
            },
        }

    # =====================================================================
    # Cluster
    # =====================================================================
    def set_id(self, node_id: str) -> None:
        """A new identity (CLUSTER RESET HARD): new job ID prefix from now on."""
        self.id = node_id
        self.ctx.set_id(node_id)

    def cmd_hello(self, client: int, argv: list[bytes]) -> list[object]:
        ctx = self.ctx
        entries = self.hello_nodes
        if entries is None:
            ip, port = ctx.address
            entries = [(ctx.id, ip, port, 100 if ctx.leaving else 1)]
        return [1, ctx.id.encode()] + [
            [node_id.encode(), ip.encode(), str(port).encode(), str(priority).encode()]
            for node_id, ip, port, priority in entries
        ]
