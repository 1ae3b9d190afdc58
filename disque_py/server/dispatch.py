"""Commands in, replies and effects out.

:class:`Dispatcher` is handed commands by the client loop
(:meth:`~Dispatcher.run_commands`, per read of a client), runs each one
(authentication, a user's rights when it has not every one (:mod:`.acl`),
the shell's own commands from the :mod:`.admin` table,
everything else with ``Node.execute``) and encodes the reply into the
client's output; it says whether they journaled (their replies then wait
for the pass's commit). :meth:`~Dispatcher.apply_effects` then carries out
what the core produced for others: a reply to another (blocked) client goes
into its output and the client to the loop (``ClientOutput.woken``: it leaves
at the end of the pass); a bus message is turned into bytes
(:func:`send_item_of`, the only place that does) and handed to the loop
(``ClientOutput.send_item``), which queues it on the peer's link or holds it
for the records made before it. Nothing here sends, runs held commands again
or knows of the AOF: that is the client loop's pass (``clients.py``).

It also keeps the core's memory level (``core/memory.py``) current:
:meth:`~Dispatcher.measure_memory` runs before a batch of commands at most
every ``MEMORY_MEASURE_MS`` (the commands are what make memory grow, so the
level an ADDJOB reads is at most that old), from the cron every 100 ms, and
at once when CONFIG SET changes ``maxmemory``. It reads no RSS (INFO reads it
when asked; the policy does not: see ``core/memory.py``), logs each level crossed, up
and down, and while the level is 2 or more lets the core free what it can.
The -OOM refusal itself is the core's (``Node`` swaps its command table at
level 3): the core knows which commands grow memory, and the in-process
simulations and core tests see the same refusal as a client.

It measures every command it runs (``run_commands``): calls, failed calls,
time and a latency histogram per command name in ``cmdstats``
(:mod:`.cmdstats`; INFO commandstats, the admin port's /metrics), with one
clock read, one dict lookup and a few adds per command; a command slower than
``slowlog-log-slower-than`` or ``latency-monitor-threshold`` also goes to
``slowlog`` (:mod:`.slowlog`) or ``latency`` (:mod:`.latency`), which the
SLOWLOG and LATENCY commands (:mod:`.admin`) read.

Called by: the client loop (``run_commands``, ``apply_effects``,
``client_closed``; the core's timers, the cluster service and the admin port
apply effects through the loop), the cron (``measure_memory``). It calls
nothing of theirs but the :class:`.contracts.ClientOutput` it is wired to
(:meth:`Dispatcher.wire`).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Callable

from cluster_bus.codec import encode_data_item

from ..core.memory import LEVEL_NAMES, THRESHOLDS
from ..core.messages import moves_to_watch
from ..core.replies import Error
from .acl import Acl
from .cmdstats import CommandStats
from .connection import PERMS_UNSET
from .contracts import now_ms
from .latency import LatencyMonitor
from .logs import log
from .slowlog import SlowLog
from .stage import CommandStage

if TYPE_CHECKING:
    from ..config import Config
    from ..core.node import Node
    from .connection import Connection
    from .contracts import ClientOutput

__all__ = ["Dispatcher", "send_item_of", "DISPATCH_STATS"]

NOAUTH = Error("NOAUTH Authentication required.")

#: The counters the dispatcher keeps in the stats dict it is given (INFO stats).
DISPATCH_STATS = ("total_commands_processed", "internal_errors", "acl_access_denied_cmd", "acl_access_denied_key")

MEMORY_MEASURE_MS = 10  # the level is measured again at most this often before commands

_LEVEL_DOING = (
    "back to normal",
    "new jobs are replicated to other nodes only",
    "freeing acked and delivered at-most-once jobs, evicting idle queues",
    "refusing commands that use more memory (-OOM)",
)


#: job-layer messages built for the bus, by kind (one message sent to several peers counts once)
SENT_BY_KIND: dict[str, int] = {}

AdminTable = dict[bytes, tuple[Callable[["Connection", list[bytes]], Any], int]]


def send_item_of(message: tuple) -> tuple[bytes, Any]:
    """A ``Send`` effect's message as the bus item to queue, and its watch token (or None).

    ``message[0]`` is the kind, ``message[1:]`` the body. The core's messages
    have fixed shapes, each checked by the cluster simulation (tests/sim), which
    encodes with checks; here the map-key walk is skipped. A YOURJOBS carrying
    the only copy of a RETRY 0 job is watched: it comes back
    (``Node.on_moves_unsent``) if it never leaves.
    """
    SENT_BY_KIND[message[0]] = SENT_BY_KIND.get(message[0], 0) + 1  # /metrics: disque_bus_messages_sent_total (a fan-out counts once)
    item = encode_data_item(message[0], list(message[1:]), check_body=False)
    watch = message if message[0] == "YOURJOBS" and moves_to_watch(message) else None
    return item, watch


class Dispatcher:
    """Runs a node's commands and carries out the core's effects.

    ``admin``: the shell's commands, name -> (handler, arity) (:func:`.admin.build_table`);
    ``hello``: the ``HELLO <protover> ...`` handshake (:func:`.admin.hello_handshake`);
    ``acl``: the node's users, whose rights were read off every command's declaration.
    Until :meth:`wire` is called, replies for other clients and bus messages go nowhere.
    """

    def __init__(
        self,
        node: "Node",
        config: "Config",
        stats: dict[str, int],
        *,
        admin: AdminTable | None = None,
        hello: Callable[["Connection", list[bytes]], Any] | None = None,
        acl: Acl,
    ) -> None:
        for key in DISPATCH_STATS:
            stats.setdefault(key, 0)
        self.node = node
        self.config = config
        self.stats = stats
        self.hello = hello
        self.acl = acl
        # What each command costs (cmdstats.py), the slow ones (slowlog.py), slow events (latency.py).
        self.cmdstats = CommandStats(lambda name: name in self.admin or name in node.commands)
        self.slowlog = SlowLog(config.slowlog_max_len)
        self.latency = LatencyMonitor(config.latency_monitor_threshold)
        self.clients: dict[int, "Connection"] = {}
        # The per-command path (run_commands, apply_effects), compiled in the compiled build
        # (stage.py); the settings it reads are kept current here (admin, _watch_settings,
        # measure_memory). Bound on the instance: the client loop calls them without a frame
        # of this class's.
        self._stage = stage = CommandStage(node, self, stats, self.cmdstats, send_item_of)
        self.run_commands = stage.run_commands  # type: ignore[method-assign]
        self.apply_effects = stage.apply_effects  # type: ignore[method-assign]
        self.admin = admin if admin is not None else {}
        self._watch_settings()
        # The memory level (see the module docstring).
        memory = node.memory
        memory.frees = config.maxmemory_policy != "noeviction"
        memory.set_limit(config.maxmemory)
        config.on_change.append(self._config_changed)

    @property
    def admin(self) -> AdminTable:
        """The shell's commands: name -> (handler, arity)."""
        return self._admin

    @admin.setter
    def admin(self, table: AdminTable) -> None:
        self._admin = table
        # What run_commands' fast path leaves to dispatch: the shell's commands, and HELLO (with
        # a protocol version the handshake is the dispatcher's; bare, the core answers it).
        self._stage.not_fast = frozenset(table) | {b"hello"}

    def wire(self, output: "ClientOutput") -> None:
        """Where effects go: the client loop (its clients, ``woken``, ``send_item``)."""
        stage = self._stage
        stage.clients = self.clients = output.clients
        stage.woken = output.woken
        stage.send_item = output.send_item

    def _watch_settings(self) -> None:
        """From the slowlog and latency settings: the duration (us) from which a command is
        looked at again after its run (one comparison on the hot path; never: a huge number)."""
        cfg = self.config
        self.slowlog.max_len = cfg.slowlog_max_len
        self.latency.threshold_us = cfg.latency_monitor_threshold * 1000
        candidates = [1 << 62]
        if cfg.slowlog_log_slower_than >= 0:
            candidates.append(cfg.slowlog_log_slower_than)
        if self.latency.threshold_us:
            candidates.append(self.latency.threshold_us)
        self._stage.watch_us = min(candidates)

    def _slow_command(self, conn: "Connection", argv: list[bytes], usec: int) -> None:
        """A command took at least ``watch_us``: the slow log and the latency monitor decide."""
        slower_than = self.config.slowlog_log_slower_than
        if 0 <= slower_than <= usec:
            self.slowlog.add(argv, usec, conn.addr, conn.name)
        threshold = self.latency.threshold_us
        if threshold and usec >= threshold:
            self.latency.add("command", usec // 1000)

    def _config_changed(self, name: str, old: Any, new: Any) -> None:
        if name in ("slowlog-log-slower-than", "slowlog-max-len", "latency-monitor-threshold"):
            self._watch_settings()
        elif name == "maxmemory":
            self.node.memory.limit = new
            self.measure_memory()  # at once: lowering it may refuse the next ADDJOB
        elif name == "maxmemory-policy":
            self.node.memory.frees = new != "noeviction"

    def measure_memory(self, now: int | None = None) -> None:
        """Measure the memory level again, log a crossing, free what may go at level >= 2."""
        if now is None:
            now = now_ms()
        self._stage.mem_next = now + MEMORY_MEASURE_MS
        try:
            self._measure_memory(now)
        except Exception:  # a bug must never take the node down
            self.stats["internal_errors"] += 1
            log.exception("Internal error measuring memory")

    def _measure_memory(self, now: int) -> None:
        node = self.node
        memory = node.memory
        node.ctx.now = now
        self._log_level(memory.update(now))
        if memory.level >= 2 and memory.frees and memory.free(now):
            self._log_level(memory.update(now))
        # what freeing produced (deletions journaled, messages) is carried out by whoever
        # measured: the client loop after the commands, the cron through the loop

    def _log_level(self, change: tuple[int, int] | None) -> None:
        if change is None:
            return
        memory = self.node.memory
        old, new = change
        crossed = new if new > old else new + 1  # the threshold reached, or gone back under
        (log.warning if new > old else log.info)(
            "Memory level %d -> %d: %d bytes used of maxmemory %d (%d%%), %s %d%% (%d bytes): %s",
            old, new, memory.used, memory.limit, 100 * memory.used // memory.limit,
            "reached" if new > old else "back under", THRESHOLDS[crossed - 1],
            memory.threshold_bytes(crossed), _LEVEL_DOING[new])  # fmt: skip

    def run_commands(self, conn: "Connection", commands: list[list[bytes]]) -> bool:
        """Run commands in order until the client blocks or its output reaches ``OUT_HOLD``;
        the rest wait in ``pending`` (see ``clients.py``). True if they journaled records
        (with an AOF): their replies wait for the pass's commit.

        The fast path, for an authenticated client with every right and a core command, does
        what :meth:`dispatch` does without the checks that cannot apply; each command is
        counted in ``cmdstats`` from its start to its reply encoded (one clock read per
        command), and one that took ``slowlog-log-slower-than`` or
        ``latency-monitor-threshold`` goes on to the slow log and the latency monitor.
        It runs in :class:`.stage.CommandStage` (bound on the instance)."""
        return self._stage.run_commands(conn, commands)

    def dispatch(self, conn: "Connection", argv: list[bytes], now: int) -> Any:
        self.stats["total_commands_processed"] += 1
        try:
            name = argv[0].lower()
            conn.last_cmd = name
            if not conn.authenticated and name != b"auth" and name != b"hello":
                acl = self.acl
                if not acl.default_open:
                    return NOAUTH
                conn.authenticated = True
                conn.user = b"default"
                conn.perms = acl.perms_of(acl.default)
            if name == b"hello" and len(argv) > 1 and self.hello is not None:
                return self.hello(conn, argv)
            if not conn.authenticated and name == b"hello":
                return NOAUTH
            perms = conn.perms
            if perms is not None:  # a user with fewer than every right (server/acl.py), or not known yet
                if perms is PERMS_UNSET:  # let in by the acceptor (no requirepass): the default user
                    acl = self.acl
                    if not acl.default_open and name != b"auth":  # its rules say otherwise
                        conn.authenticated = False
                        conn.perms = None
                        return NOAUTH
                    conn.user = b"default"
                    perms = conn.perms = acl.perms_of(acl.default)
                if perms is not None:
                    denied = self.acl.check(perms, name, argv, self._queue_of)
                    if denied is not None:
                        self.stats["acl_access_denied_" + denied[0]] += 1
                        return Error(denied[1])
            entry = self._admin.get(name)
            if entry is not None:
                handler, arity = entry
                n = len(argv)
                if (arity > 0 and n != arity) or n < -arity:
                    return Error("ERR wrong number of arguments for '%s' command" % name.decode())
                return handler(conn, argv)
            return self.node.execute_named(conn.id, name, argv, now)
        except Exception:  # a bug must never take the node down
            return self._internal_error(argv)

    def _internal_error(self, argv: list[bytes]) -> Error:
        """A command raised: a bug. Logged with its traceback and counted; the client gets an
        error and the node serves on."""
        self.stats["internal_errors"] += 1
        log.exception("Internal error running %r", argv[:1])
        return Error("ERR internal error, check the server logs")

    def _queue_of(self, job_id: bytes) -> bytes | None:
        job = self.node.store.get(job_id)
        return None if job is None else job.queue

    def client_closed(self, client_id: int) -> None:
        """A client's connection is gone: the core forgets it (a blocked command is dropped).
        The client loop applies the effects next."""
        self.node.client_closed(client_id)

    def apply_effects(self) -> None:
        """Carry out the core's effects: replies to blocked clients, bus messages. Both go to
        the client loop, which sends them at the end of its pass. It runs in
        :class:`.stage.CommandStage` (bound on the instance)."""
        self._stage.apply_effects()
