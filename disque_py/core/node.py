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
the machine that owns it, lets them share one ``Context`` (``context.py``)
and runs each one's timers. Each machine declares the commands it answers in
its module's ``COMMANDS`` (``commandspec.py``); ``Node`` binds them into its
table once, at construction. Which file decides what:

=================  ============================================================
``lifecycle.py``   the job table's schedule (ONE_TIMER), expiry, deletion;
                   DELJOB, SHOW, JSCAN
``requeue.py``     queueing, RETRY requeues, WILLQUEUE/QUEUED/WORKING/ENQUEUE;
                   ENQUEUE, DEQUEUE, WORKING
``delivery.py``    NACK (DELAY, REASON, DEAD), BACKOFF, MAXDELIVER, dead letters;
                   NACKED/DELIVERED
``dedup.py``       ADDJOB's DEDUP keys, their window; HASJOB/HAVEJOB
``acks.py``        ACK_ONCE, ack GC (SETACK/GOTACK/DELJOB), dummy acks,
                   tombstones; ACKJOB, FASTACK
``replication.py`` ADDJOB and its copies (REPLJOB/GOTJOB, NOREPL)
``federation.py``  NEEDJOBS/YOURJOBS, push leases, imports
``blocking.py``    GETJOB, blocked clients and their timeouts, delivery,
                   queue eviction; QLEN, QPEEK, QSTAT, QSCAN, PAUSE
``messages.py``    the bus messages' types and their checks
``memory.py``      the maxmemory level: external replication, what is let
                   go, the commands refused at 100 %
``invariants.py``  the named invariants, as one check (tests, simulations)
=================  ============================================================

On a single node the cluster view is empty (``cluster_size`` 1) and every
ack is collected at once.
"""

from __future__ import annotations

from typing import Any, Callable, Final, final

from . import acks as acks_mod
from . import blocking as blocking_mod
from . import delivery as delivery_mod
from . import lifecycle as lifecycle_mod
from . import replication as replication_mod
from . import requeue as requeue_mod
from .acks import Acks
from .blocking import Blocking
from .commandspec import ALWAYS, CommandSpec, bind, check_unique
from .context import Context
from .dedup import Dedup
from .delivery import Delivery
from .effects import BLOCKED
from .federation import Federation
from .lifecycle import Lifecycle
from .memory import Memory
from .messages import receivers
from .replication import Replication
from .replies import Error, err
from .store import J_DEL
from .requeue import Requeue

__all__ = ["Node", "BLOCKED", "CORE_COMMANDS", "OOM_COMMANDS"]

QUEUE_GC_PERIOD_MS: Final = 1000  # queue eviction and lease expiry run this often

Handler = Callable[[int, list], Any]

#: The Node attribute holding the machine that answers each module's ``COMMANDS``; the
#: node itself answers its own (HELLO). One declaration per command (commandspec.py):
#: the dispatch table, the -OOM refusals, COMMAND's reply and the ACL rights derive from it.
_OWNERS: Final[tuple[tuple[str | None, tuple[CommandSpec, ...]], ...]] = (
    ("replication", replication_mod.COMMANDS),
    ("blocking", blocking_mod.COMMANDS),
    ("acks", acks_mod.COMMANDS),
    ("lifecycle", lifecycle_mod.COMMANDS),
    ("requeue", requeue_mod.COMMANDS),
    ("delivery", delivery_mod.COMMANDS),
    (None, (CommandSpec(b"hello", "cmd_hello", 1, ("readonly", "fast"), ALWAYS),)),
)
#: Every command of the core, each declared once.
CORE_COMMANDS: Final[tuple[CommandSpec, ...]] = check_unique(spec for _, specs in _OWNERS for spec in specs)
#: What memory level 3 refuses with -OOM (memory.py): Disque's "m" commands, the ``denyoom`` ones.
OOM_COMMANDS: Final[frozenset[bytes]] = frozenset(spec.name for spec in CORE_COMMANDS if "denyoom" in spec.flags)


def _method_of(owner: Any) -> Callable[[str], Any]:
    """``bind``'s lookup for one machine: its method by name."""

    def lookup(name: str) -> Any:
        return getattr(owner, name)

    return lookup


@final
class Node:
    # The context's fields the shell reads and sets, as properties written out one by one (a
    # compiled class takes no property made by a helper at class level).
    @property
    def now(self) -> Any:
        """Monotonic ms of the current input."""
        return self.ctx.now

    @now.setter
    def now(self, value: Any) -> None:
        self.ctx.now = value

    @property
    def wall_offset(self) -> Any:
        """Wall-clock ms minus monotonic ms."""
        return self.ctx.wall_offset

    @wall_offset.setter
    def wall_offset(self, value: Any) -> None:
        self.ctx.wall_offset = value

    @property
    def address(self) -> Any:
        """(ip, port) for HELLO."""
        return self.ctx.address

    @address.setter
    def address(self, value: Any) -> None:
        self.ctx.address = value

    @property
    def store(self) -> Any:
        """The job table and its schedule (``store.JobStore``)."""
        return self.ctx.store

    @store.setter
    def store(self, value: Any) -> None:
        self.ctx.store = value

    @property
    def queues(self) -> Any:
        """Queues by name."""
        return self.ctx.queues

    @queues.setter
    def queues(self, value: Any) -> None:
        self.ctx.queues = value

    @property
    def stats(self) -> Any:
        """Counters for INFO."""
        return self.ctx.stats

    @stats.setter
    def stats(self, value: Any) -> None:
        self.ctx.stats = value

    @property
    def cluster_size(self) -> Any:
        """Nodes in the cluster (membership layer)."""
        return self.ctx.cluster_size

    @cluster_size.setter
    def cluster_size(self, value: Any) -> None:
        self.ctx.cluster_size = value

    @property
    def reachable(self) -> Any:
        """Other nodes we can talk to now (membership layer)."""
        return self.ctx.reachable

    @reachable.setter
    def reachable(self, value: Any) -> None:
        self.ctx.reachable = value

    @property
    def backlogged(self) -> Any:
        """Nodes whose link holds unsent output (shell, before each tick)."""
        return self.ctx.backlogged

    @backlogged.setter
    def backlogged(self, value: Any) -> None:
        self.ctx.backlogged = value

    @property
    def known_nodes(self) -> Any:
        """Every node in the table, this one included (membership layer)."""
        return self.ctx.known_nodes

    @known_nodes.setter
    def known_nodes(self, value: Any) -> None:
        self.ctx.known_nodes = value

    @property
    def live_nodes(self) -> Any:
        """Other nodes not failing, linked or not (membership layer)."""
        return self.ctx.live_nodes

    @live_nodes.setter
    def live_nodes(self, value: Any) -> None:
        self.ctx.live_nodes = value

    @property
    def leaving(self) -> Any:
        """This node is leaving the cluster (membership layer)."""
        return self.ctx.leaving

    @leaving.setter
    def leaving(self, value: Any) -> None:
        self.ctx.leaving = value

    def __init__(
        self,
        node_id: str,
        *,
        seed: bytes,
        now: int,
        wall_offset: int = 0,
        address: tuple[str, int] = ("127.0.0.1", 7711),
    ) -> None:
        ctx = self.ctx = Context(node_id, seed, now, wall_offset, address)
        self.id = node_id  # read-only outside: set_id changes it (here and in the context)
        # (id, ip, port, priority) for HELLO; None = just myself.
        self.hello_nodes: list[tuple[str, str, int, int]] | None = None
        self.bus_stats = ctx.bus_stats  # {"messages_malformed": n}
        self.lifecycle = lifecycle = Lifecycle(ctx)
        self.requeue = requeue = Requeue(ctx)
        self.acks = acks = Acks(ctx)
        self.blocking = blocking = Blocking(ctx)
        self.federation = federation = Federation(ctx)
        self.replication = replication = Replication(ctx)
        self.delivery = delivery = Delivery(ctx)
        self.dedup = dedup = Dedup(ctx)
        self._dedup_queries = dedup.queries  # never rebound: tested on every pass (tick, next_wakeup)
        # What the machines lend each other (see context.py).
        ctx.reschedule = lifecycle.reschedule
        ctx.delete_job = lifecycle.delete_job
        ctx.enqueue_job = requeue.enqueue_job
        ctx.dequeue_job = requeue.dequeue_job
        ctx.requeue_due = requeue.requeue_due
        ctx.acknowledge = acks.acknowledge
        ctx.gc_due = acks.try_gc
        ctx.bury = acks.bury
        ctx.is_buried = acks.is_buried
        ctx.replication_achieved = replication.achieved
        ctx.replication_failed = replication.failed
        ctx.replication_dropped = replication.dropped
        ctx.replicate_job = replication.replicate_job
        ctx.delivered = delivery.delivered
        ctx.timed_out = delivery.timed_out
        ctx.dead_letter_copied = delivery.copied
        ctx.replication_add = lambda client, req, job_id: replication.cmd_addjob(client, None, req, job_id)
        ctx.dedup_addjob = dedup.addjob
        ctx.dedup_merge = dedup.merge
        ctx.dedup_gone = dedup.is_gone
        ctx.dedup_deleted = dedup.deleted
        ctx.dedup_remember = dedup.remember
        ctx.fetch = blocking.fetch
        ctx.need_jobs = federation.need_jobs
        ctx.renew_on_take = federation.renew_on_take
        ctx.push_if_wanted = federation.push_if_wanted
        # Bound once: the end of every input checks these.
        self._ready = ctx.ready
        self._serve_ready = blocking.serve_ready
        self._outgoing = federation.outgoing
        self._flush_outgoing = federation.flush
        self._next_gc = now + QUEUE_GC_PERIOD_MS
        # kind -> receiver (messages.receivers): checks a peer's message, builds it and calls the
        # handler of the machine that owns the kind, in one call.
        self._receivers = receivers({
            "REPLJOB": replication.on_repljob,
            "GOTJOB": replication.on_gotjob,
            "ENQUEUE": requeue.on_enqueue,
            "QUEUED": requeue.on_queued,
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
            "HASJOB": dedup.on_hasjob,
            "HAVEJOB": dedup.on_havejob,
        })  # fmt: skip
        # The memory level (memory.py); while it is 3 ``commands`` is a copy that refuses
        # OOM_COMMANDS, so no command pays for the check.
        self.memory = memory = Memory(ctx, lambda: len(acks.tombstones))
        memory.on_level = self._memory_level_changed
        self.commands: dict[bytes, tuple[Handler, int]] = {}
        for attr, specs in _OWNERS:
            owner: Any = self if attr is None else getattr(self, attr)
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

            def refuse(client: int, argv: list[bytes]) -> Any:
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

    # =====================================================================
    # Inputs
    # =====================================================================
    def execute(self, client: int, argv: list[bytes], now: int) -> Any:
        """Run one client command; returns its reply or ``BLOCKED``."""
        return self.execute_named(client, argv[0].lower(), argv, now)

    def execute_named(self, client: int, name: bytes, argv: list[bytes], now: int) -> Any:
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
            self._serve_ready()
        if self._outgoing:
            self._flush_outgoing()
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
            self.bus_stats["messages_malformed"] += 1
            return
        # The receiver returns False for a malformed body (its handler not called).
        if type(body) is not list or type(sender) is not str or receive(sender, body) is False:
            self.bus_stats["messages_malformed"] += 1
            return
        if self._ready:
            self._serve_ready()
        if self._outgoing:
            self._flush_outgoing()

    def on_moves_unsent(self, peer: str, message: tuple, now: int) -> None:
        """A YOURJOBS to ``peer`` never reached the socket (see ``Federation.on_moves_unsent``)."""
        self.ctx.now = now
        self.federation.on_moves_unsent(peer, message, now)
        if self._outgoing:
            self._flush_outgoing()  # pushed on to another node at once, as after any input

    def tick(self, now: int) -> None:
        """Run everything that is due at ``now``."""
        ctx = self.ctx
        ctx.now = now
        replication = self.replication
        if replication.timers:
            replication.tick(now)
        self.lifecycle.run_due(now)
        if self._dedup_queries:  # ADDJOB DEDUPs waiting for the other nodes (dedup.py)
            self.dedup.tick(now)
        blocking = self.blocking
        blocking.tick(now)
        self.acks.tick(now)
        if now >= self._next_gc:
            blocking.gc_queues()
            if self.dedup.gone:
                self.dedup.forget(now)  # DEDUP IDs whose window ended (looked up with their end)
            if self.federation.leases:
                self.federation.gc_leases()
            if self.delivery.pending:  # dead letters made here still short of their copies
                self.delivery.retry_copies(now)
            self._next_gc = now + QUEUE_GC_PERIOD_MS
        if blocking.blocked and ctx.cluster_size > 1:
            self.federation.tick(blocking.waited)
        if self._ready:
            self._serve_ready()
        if self._outgoing:
            self._flush_outgoing()
        if ctx.lazy_at and now >= ctx.lazy_at:
            ctx.flush_lazy()

    def client_closed(self, client: int) -> None:
        self.blocking.client_closed(client)
        self.replication.client_closed(client)
        if self.dedup.queries:
            self.dedup.client_closed(client)

    def take_effects(self) -> list[Any]:
        effects = self.ctx.effects
        if effects:
            self.ctx.effects = []
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
        if ctx.queues or self.federation.leases or self.dedup.gone:
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
        return best

    # =====================================================================
    # Introspection used by the shell (INFO, CLIENT LIST ...)
    # =====================================================================
    @property
    def blocked_clients(self) -> int:
        return len(self.blocking.blocked) + len(self.replication.client_jobs) + len(self.dedup._client_queries)

    def is_blocked(self, client: int) -> bool:
        return (client in self.blocking.blocked or client in self.replication.client_jobs
                or client in self.dedup._client_queries)  # fmt: skip

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
        self.acks.clear()

    def info_fields(self) -> dict[str, dict[str, Any]]:
        return {
            "jobs": {"registered_jobs": len(self.ctx.store)},
            "queues": {
                "registered_queues": len(self.ctx.queues),
                # (queue, peer) pairs this node may push jobs to (federation leases)
                "push_leases": sum(map(len, self.federation.leases.values())),
            },
        }

    # =====================================================================
    # Cluster
    # =====================================================================
    def set_id(self, node_id: str) -> None:
        """A new identity (CLUSTER RESET HARD): new job ID prefix from now on."""
        self.id = node_id
        self.ctx.set_id(node_id)

    def cmd_hello(self, client: int, argv: list[bytes]) -> Any:
        ctx = self.ctx
        entries = self.hello_nodes
        if entries is None:
            ip, port = ctx.address
            entries = [(ctx.id, ip, port, 100 if ctx.leaving else 1)]
        return [1, ctx.id.encode()] + [
            [node_id.encode(), ip.encode(), str(port).encode(), str(priority).encode()]
            for node_id, ip, port, priority in entries
        ]
