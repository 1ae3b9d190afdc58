"""The cluster service: membership (sans-I/O) + the bus (trio) + nodes.conf.

:class:`ClusterService` is the bus handler: link events and messages go
into ``Membership``, whose effects (connect, send, close, save the config,
log) are carried out here. Application messages (``Data``, ``DataBatch``)
go to the job core instead, through its host's ``cluster_data``
(:class:`.contracts.CoreHost`). After every input the job core's view of
the cluster (size, reachable nodes, HELLO entries, leaving flag) is
refreshed, so the core never asks. It also answers CLUSTER commands and
queues the core's messages on peers' links (:meth:`ClusterService.send_item`).

:class:`CoreFeed` is the host a node gives it: it feeds job-layer messages
to ``Node.receive_data`` one by one, and a message whose handler raises
(a bug of ours, or a peer's message the core did not expect) is logged with
its traceback and counted (CLUSTER INFO ``cluster_stats_handler_errors``);
the node serves on and what the messages produced, before and after the
failing one, is carried out. The bus simulation (tests/sim/netsim.py)
hosts the same service with its own host.

Created by the node (:mod:`.app`), which passes the client loop as the
bus's reactor (links' sockets are polled in the client loop's epoll); the
dispatcher queues the core's messages through ``send_item``; the core's
timers ask ``backlogged`` before each tick.

``nodes.conf`` (``cluster-config-file`` under ``dir``) is rewritten
atomically (temp file, fsync, rename) whenever membership says the table
changed; a node killed with -9 comes back with the same ID and peers.
"""

from __future__ import annotations

import errno
import os
import random
import secrets
import socket
from collections import Counter
from operator import itemgetter
from time import perf_counter_ns
from typing import TYPE_CHECKING, Any, Callable, Iterable

import trio

from cluster_bus.codec import encode_data_item
from cluster_bus.links import Bus
from cluster_bus.membership import (
    Close,
    Connect,
    Log,
    Membership,
    MembershipError,
    SaveConfig,
)
from cluster_bus.membership import Send as BusSend
from cluster_bus.messages import BUS_PORT_OFFSET, NODE_LEAVING, VERSION_KIND, Data, DataBatch
from cluster_bus.tls import TlsTransport

from .. import __version__
from ..config import ConfigError
from ..core.commandspec import CommandSpec
from ..core.features import FEATURES, UNANNOUNCED, UNANNOUNCED_RELEASE
from ..core.replies import OK, Error, Status, err, syntax_error
from .contracts import now_ms
from .logs import log
from .tls import build_bus_contexts

if TYPE_CHECKING:
    from cluster_bus.links import Reactor

    from ..config import Config
    from ..core.node import Node
    from .contracts import CoreHost

_LEVELS = {"warning": 30, "notice": 20, "verbose": 15, "debug": 10}
_NONE: frozenset[str] = frozenset()
_kind_of = itemgetter(0)

#: How long one step of the cluster's tick may go on with the PINGs due (ns): a PING built (its
#: gossip section) took 20-40 µs in a loaded node, sent (encoded, queued on its link, the core's
#: view checked) 40-60 µs, each a step of its own unless the caches were warm.
PING_SLICE_NS = 50_000


#: The command this service answers (core/commandspec.py): the node's shell table binds it to
#: the service (``server/app.py``).
COMMANDS = (
    CommandSpec(b"cluster", "cmd_cluster", -2, ("admin", "readonly"), ("admin",),
                syntax="CLUSTER MEET ip port | NODES | INFO | MYID | FORGET node-id | RESET [SOFT|HARD] | "
                       "LEAVING [YES|NO] | SAVECONFIG",
                summary="Join and list the cluster's nodes, forget one, leave (LEAVING yes), save nodes.conf",
                group="cluster"),
)


class CoreFeed:
    """A node's :class:`.contracts.CoreHost`: job-layer messages into the core, each on its own.

    ``apply_effects`` carries out what they produced; ``after_input`` is called
    next (the core's timers look again: a message may have set an earlier one).
    """

    __slots__ = ("node", "apply_effects", "after_input", "handler_errors", "unknown_told")

    def __init__(self, node: "Node", apply_effects: Callable[[], None], after_input: Callable[[], None]) -> None:
        self.node = node
        self.apply_effects = apply_effects
        self.after_input = after_input
        self.handler_errors = 0
        self.unknown_told = 0  # how many of node.unknown_kinds were logged

    def cluster_data(self, sender: str, items: Iterable[tuple[str, Any]]) -> None:
        """Messages from ``sender``, in order. One whose handler raises is logged and counted;
        the others are still handled, and every effect produced is carried out."""
        node = self.node
        now = now_ms()
        for kind, body in items:
            try:
                node.receive_data(sender, kind, body, now)
            except Exception:  # our handler failed: the node serves on
                self.handler_errors += 1
                log.error("Error handling a %s message from node %s (handler errors so far: %d)",
                          kind, sender[:8], self.handler_errors, exc_info=True)  # fmt: skip
        if len(node.unknown_kinds) != self.unknown_told:
            self.tell_unknown(sender)
        self.apply_effects()
        self.after_input()

    def tell_unknown(self, sender: str) -> None:
        """Log each kind of message this release does not know once (they are counted: CLUSTER
        INFO's cluster_stats_messages_unknown)."""
        kinds = list(self.node.unknown_kinds)
        for kind in kinds[self.unknown_told :]:
            log.warning("Cluster bus: node %s sent a %r message, a kind this release (%s) does not know: dropped "
                        "(a newer release's? each such kind is logged once, all are counted in CLUSTER INFO's "
                        "cluster_stats_messages_unknown)", sender[:8], kind, __version__)  # fmt: skip
        self.unknown_told = len(kinds)



def ephemeral_range(path: str = "/proc/sys/net/ipv4/ip_local_port_range") -> tuple[int, int] | None:
    """The kernel's ephemeral port range (Linux), or None where it cannot be read."""
    try:
        with open(path) as f:
            low, high = (int(x) for x in f.read().split()[:2])
    except (OSError, ValueError):
        return None
    return low, high


def _ephemeral_hint(port: int) -> str:
    low_high = ephemeral_range()
    if low_high is None or not low_high[0] <= port <= low_high[1]:
        return ""
    return (" below %d: port %d is in the kernel's ephemeral range %d-%d, or reserve it with "
            "net.ipv4.ip_local_reserved_ports" % (low_high[0] - BUS_PORT_OFFSET, port, *low_high))

class ClusterService:
    """The bus glue of one node. ``host``: the core it serves (:class:`.contracts.CoreHost`);
    ``reactor``: polls the links' sockets (the client loop; None: the bus's own tasks);
    ``transport``: None for TCP, the tests' memory streams otherwise."""

    def __init__(
        self,
        host: "CoreHost",
        config: "Config",
        advertised_ip: str,
        now: int,
        wall_offset: int,
        *,
        transport: Any = None,
        reactor: "Reactor | None" = None,
    ) -> None:
        self.host = host
        self.node = host.node
        self.reactor = reactor
        self.transport = transport  # None = TCP; tests wire memory streams
        self.config = config
        self.path = config.resolve_path(config.cluster_config_file)
        self.rng = random.Random(os.urandom(16))
        # The port this node is known by, its bus at that + BUS_PORT_OFFSET: the client port, or
        # with "port 0" (TLS clients only) tls-port, so a TLS-only node still has a usable address.
        self.announce_port = config.port or getattr(config, "tls_port", 0) or 0
        self._fresh = False  # no nodes.conf yet: the new identity is written in run()
        self.membership = self._load(advertised_ip, now, wall_offset)
        # our release on every link we open, and the job layer's optional parts we understand
        self.membership.announce(__version__, FEATURES, UNANNOUNCED_RELEASE)
        secret = getattr(config, "cluster_secret", "") or ""
        self.secret = secret.encode() if secret else None
        self.bus: Bus | None = None
        self._save_pending = False
        self._ping_built = False  # a step of the tick built a PING the next one sends (tick)
        self._view_key: tuple | None = None  # the node table the core's view was last made from (sync)
        self._view_of: Any = None  # and the core it was given to
        # the node whose link went down last, by its name now (link_down): ``unsent`` follows at once
        self._down_owner: str | None = None
        self.stats = self.membership.stats
        for key in ("auth_failures", "bad_frames"):
            self.stats.setdefault(key, 0)
        #: job-layer messages received, by kind (/metrics: disque_bus_messages_received_total)
        self.received_by_kind: Counter[str] = Counter()

    @property
    def my_id(self) -> str:
        return self.membership.my_id

    # --------------------------------------------------------- persistence
    def _load(self, ip: str, now: int, wall_offset: int) -> Membership:
        cfg = self.config
        try:
            with open(self.path, encoding="utf-8") as f:
                text = f.read()
        except FileNotFoundError:
            text = ""
        if text.strip():  # an empty file counts as missing, as in Disque
            try:
                m = Membership.from_text(
                    text, my_port=self.announce_port, node_timeout=cfg.cluster_node_timeout, now=now, rng=self.rng,
                    wall_offset=wall_offset,
                )  # fmt: skip
            except MembershipError as exc:
                log.warning("Unrecoverable error: %s (%s)", exc, self.path)
                raise SystemExit(1) from exc
            log.info("Node configuration loaded, I'm %s", m.my_id)
            return m
        node_id = secrets.token_hex(20)
        m = Membership(node_id, ip, self.announce_port, node_timeout=cfg.cluster_node_timeout, now=now, rng=self.rng,
                       wall_offset=wall_offset)  # fmt: skip
        # Written once the bus port is bound (run): a node that cannot start leaves no nodes.conf behind,
        # so the next start does not take a stale identity.
        self._fresh = True
        return m

    def _write(self, text: str, sync: bool = True) -> None:
        """Write nodes.conf whole (a temporary file renamed over it); ``sync``: fsync it first
        (without, a crash of the process keeps it, a crash of the machine may not)."""
        tmp = "%s.tmp-%d" % (self.path, os.getpid())
        with open(tmp, "w", encoding="utf-8") as f:
            f.write(text)
            if sync:
                f.flush()
                os.fsync(f.fileno())
        os.replace(tmp, self.path)

    def _sync_written(self) -> None:
        """fsync nodes.conf and its directory (the first one, written unsynced at start); in a
        worker thread. A failure is logged: the next save syncs again."""
        try:
            fd = os.open(self.path, os.O_RDONLY)
            try:
                os.fsync(fd)
            finally:
                os.close(fd)
            fd = os.open(os.path.dirname(os.path.abspath(self.path)), os.O_RDONLY)
            try:
                os.fsync(fd)
            finally:
                os.close(fd)
        except OSError as exc:
            log.warning("Could not sync the cluster configuration %s: %s", self.path, exc)

    def save_now(self) -> None:
        self._save_pending = False
        try:
            self._write(self.membership.save_text())
        except OSError as exc:
            log.warning("Could not save the cluster configuration to %s: %s", self.path, exc)
            raise

    def warn_ephemeral_bus_port(self) -> None:
        """A warning when the bus port (client port + 10000) lies in the kernel's ephemeral range,
        where any outgoing connection may hold it as its local port: a restart then fails with
        EADDRINUSE."""
        port = self.announce_port + BUS_PORT_OFFSET
        low_high = ephemeral_range()
        if low_high is not None and low_high[0] <= port <= low_high[1]:
            log.warning("WARNING: the cluster bus port %d (port %d + %d) is in the kernel's ephemeral port range "
                        "%d-%d (net.ipv4.ip_local_port_range): an outgoing connection may hold it and a restart "
                        "fail with 'Address already in use'. Choose a port below %d, or reserve it: "
                        "sysctl -w net.ipv4.ip_local_reserved_ports=%d", port, self.announce_port,
                        BUS_PORT_OFFSET, low_high[0], low_high[1], low_high[0] - BUS_PORT_OFFSET, port)  # fmt: skip

    def check_bus_port(self) -> None:
        """Raise OSError (naming the port) if the bus port cannot be bound now: called by the node's
        startup with the client ports, before anything is written to disk. The bus binds it for
        good in :meth:`run`; a port taken in between still fails there, with the same message."""
        if self.transport is not None:
            return
        port = self.announce_port + BUS_PORT_OFFSET
        for host in list(self.config.bind) or ["0.0.0.0"]:
            try:
                infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
            except OSError:
                continue  # the bus's own bind says what is wrong with the address
            for family, kind, proto, _, address in infos:
                with socket.socket(family, kind, proto) as sock:
                    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as trio's listeners
                    try:
                        sock.bind(address)
                    except OSError as exc:
                        hint = ""
                        if exc.errno == errno.EADDRINUSE:
                            hint = (" (the cluster bus port is the client port %d + %d; another process or an "
                                    "outgoing connection holds it: choose another port%s)"
                                    % (self.announce_port, BUS_PORT_OFFSET, _ephemeral_hint(port)))  # fmt: skip
                        raise OSError(exc.errno, "Creating cluster bus listening socket %s:%d: %s%s"
                                      % (host, port, exc.strerror or exc, hint)) from None  # fmt: skip

    # ----------------------------------------------------------------- run
    async def run(self, every_period: Callable[[Callable[[], None]], None] | None = None, *,
                  task_status=trio.TASK_STATUS_IGNORED) -> None:  # fmt: skip
        """The bus, then the tick (every 100 to 500 ms): by ``every_period`` (the node's timers:
        ``CoreTimers.every_period``) when given, else by a sleeping loop of its own (the simulation)."""
        cfg = self.config
        bus_port = self.announce_port + BUS_PORT_OFFSET
        hosts = list(cfg.bind) or ["0.0.0.0"]
        transport = self.transport
        tls = transport is None and bool(getattr(cfg, "tls_cluster", False))
        if tls:
            try:
                server_ctx, client_ctx = build_bus_contexts(cfg)
            except ConfigError as exc:
                log.warning("Can't start TLS on the cluster bus (tls-cluster yes): %s", exc)
                raise SystemExit(1) from None
            transport = TlsTransport(server_ctx, client_ctx, local_address=hosts[0])
        if self.secret is None and not tls:
            log.warning(
                "WARNING: no cluster-secret set: the cluster bus on port %d is unauthenticated and in clear "
                "text (no TLS): any host that can reach it can join this cluster and read the jobs it carries. "
                "Set the same cluster-secret on every node to authenticate the bus, and keep its port on a "
                "trusted network.",
                bus_port,
            )
        self.bus = Bus(
            self, host=hosts[0], port=bus_port, secret=self.secret, transport=transport,
            reactor=self.reactor,  # the node's client loop polls the links' sockets
            listen=hosts,  # every bind address, as the client port (and Disque)
        )  # fmt: skip
        async with trio.open_nursery() as nursery:
            try:
                await nursery.start(self.bus.run)
            except OSError as exc:
                raise OSError(
                    exc.errno,
                    "Creating cluster bus listening socket %s:%d: %s"
                    % (getattr(exc, "bus_host", hosts[0]), bus_port, exc.strerror or exc),
                ) from exc
            log.info("Cluster bus listening on %s port %d%s", ", ".join(hosts), bus_port,
                     " (mutual TLS)" if tls else "")  # fmt: skip
            synced = True
            if self._fresh:
                self._fresh = False
                log.info("No cluster configuration found, I'm %s", self.my_id)
                # Written before the first client is served; its fsync (5-50 ms on a busy
                # disk) right after, in a thread: a new node answers PING without waiting for it.
                self._write(self.membership.save_text(), sync=False)
                synced = False
            self.sync()
            task_status.started()
            if not synced:
                nursery.start_soon(trio.to_thread.run_sync, self._sync_written)
            period = self.tick()
            while not period:  # PINGs due already (none while no link is up)
                period = self.tick()
            if every_period is not None:
                every_period(self.tick)  # the node's timers run it (server/timers.py); the bus runs on
                return
            while True:
                await trio.sleep(period / 1000.0)
                period = self.tick()

    def tick(self) -> int:
        """Disque's clusterCron: reconnects, pings, failure detection (the membership's ``tick``),
        carried out; the ms until it wants to run again (100 while the cluster is in flux, up to
        500 once it is settled: ``Membership.idle_tick_ms``).

        In steps (issue 59: a job that arrives waits behind the step the loop is in): the first
        walks the node table and leaves the PINGs it finds due queued (``max_pings=0``); the
        next ones build a PING (``Membership.send_pings``) and send it (``apply``), in turns,
        for :data:`PING_SLICE_NS` at most: another turn only while one more as long as the last
        fits. While PINGs wait the step returns 0: the timers call it again after the loop's
        next pass, before anything else of theirs (``CoreTimers.every_period``), so a PING
        leaves that much later, not a tick later."""
        m = self.membership
        built = self._ping_built
        if not built and not m.pings_due():
            m.tick(now_ms(), max_pings=0)
            self.apply()
            return 0 if m.pings_due() else m.idle_tick_ms()
        began = t = perf_counter_ns()
        until = began + PING_SLICE_NS
        while True:
            if built:
                self.apply()  # (an input's apply may have sent it already: then nothing to do)
            else:
                m.send_pings(now_ms(), 1)
            built = not built
            if not built and not m.pings_due():
                self._ping_built = False
                return m.idle_tick_ms()
            last, t = t, perf_counter_ns()
            if t + (t - last) > until:
                self._ping_built = built
                return 0

    # ------------------------------------------------------- bus handler
    def link_up(self, node_id: str, link: int) -> None:
        self.membership.link_up(node_id, link, now_ms())
        self.apply()

    def link_failed(self, node_id: str) -> None:
        self.membership.link_failed(node_id, now_ms())
        self.apply()

    def link_down(self, link: int) -> None:
        m = self.membership
        # Whose link it was, by the name the node table gives it now: the bus names a link by the
        # node it was opened for, which the handshake of a CLUSTER MEET renames; ``unsent``, which
        # the bus calls right after this, hands the moves back under this name (the one the core
        # knows the peer's leases by).
        self._down_owner = next((nid for nid in m.known() if m.link_of(nid) == link), None)
        m.link_down(link, now_ms())
        self.apply()

    def message(self, link: int, msg: Any) -> None:
        kind = type(msg)
        if kind is DataBatch:
            self.stats["messages_received"] += len(msg.items)
            self.received_by_kind.update(map(_kind_of, msg.items))  # C loop (Counter), for /metrics
            self.host.cluster_data(msg.sender, msg.items)
            return
        if kind is Data and msg.kind != VERSION_KIND:  # a release's announcement: membership's
            self.stats["messages_received"] += 1
            self.received_by_kind[msg.kind] += 1
            self.host.cluster_data(msg.sender, ((msg.kind, msg.body),))
            return
        if self.bus is not None:
            self.membership.link_peer(link, self.bus.peer_ip(link) or "")
        self.membership.receive(link, msg, now_ms())
        self.apply()

    def unsent(self, node_id: str, tokens: list) -> None:
        """The link to ``node_id`` ended with these watched YOURJOBS unsent (right after its
        ``link_down``, which says the node's name now)."""
        owner, self._down_owner = self._down_owner, None
        if owner is not None:
            node_id = owner
        node = self.node
        now = now_ms()
        for message in tokens:
            node.on_moves_unsent(node_id, message, now)
        returned = node.stats["jobs_returned"]
        self.host.apply_effects()
        log.warning("Cluster bus: link to %s closed with %d job move(s) unsent; at-most-once jobs "
                    "in them queued here again (%d so far)", node_id[:8], len(tokens), returned)

    def link_error(self, kind: str, peer: str, reason: str) -> None:
        if kind == "tls":  # counted by the bus (cluster_stats_bus_tls_failures)
            if reason:
                log.warning("Cluster bus: TLS handshake with %s failed (%s); link closed", peer, reason)
            return
        self.stats["auth_failures" if kind == "auth" else "bad_frames"] += 1
        if reason:  # the bus gives a reason at most once a minute per address and kind (links.REPORT_EVERY)
            if kind == "auth":
                log.warning("Cluster bus: %s failed authentication (%s); link closed", peer, reason)
            elif kind == "foreign":  # reason: the protocol (RESP, HTTP, TLS), then maybe "; N more ..."
                protocol, _, more = reason.partition("; ")
                log.warning("Cluster bus: a client spoke %s on the cluster bus port %d (from %s): clients use "
                            "port %d; link closed%s", protocol, self.announce_port + BUS_PORT_OFFSET, peer,
                            self.config.port or self.announce_port, " (%s)" % more if more else "")  # fmt: skip
            else:
                log.warning("Cluster bus: bad frame from %s (%s); link closed", peer, reason)

    # ------------------------------------------------------------ effects
    def apply(self) -> None:
        m = self.membership
        bus = self.bus
        for effect in m.take_effects():
            kind = type(effect)
            if kind is BusSend:
                if bus is not None:
                    bus.send(effect.link, effect.msg)
            elif kind is Connect:
                if bus is not None:
                    bus.connect(effect.node_id, effect.ip, effect.bus_port)
            elif kind is Close:
                if bus is not None:
                    bus.close(effect.link)
            elif kind is SaveConfig:
                self._save_pending = True
            elif kind is Log:
                log.log(_LEVELS.get(effect.level, 20), "%s", effect.text)
        if self._save_pending:
            try:
                self.save_now()
            except OSError:
                pass
        self.sync()

    def sync(self) -> None:
        """Refresh the job core's view of the cluster, when the node table changed since the last
        time (after every input and tick: most, a PING or a PONG, change nothing it shows)."""
        m = self.membership
        key = m.view_key()
        node = self.node
        if key == self._view_key and node is self._view_of and node.id == m.my_id:
            return
        self._view_key, self._view_of = key, node
        node.ctx.cluster_size = m.size()
        # Only nodes with a connected outbound link (Disque skips link-less nodes when it picks
        # replicas): a message for a node whose link is down is dropped, and a RETRY 0 job pushed
        # or moved to it would be lost (its only copy leaves with the message). From a peer's
        # kill -9 to its PFAIL there are node-timeout ms in which only its link says it is gone.
        link_of = m.link_of
        alive = m.reachable()
        node.ctx.reachable = [nid for nid in alive if link_of(nid) is not None]
        # ADDJOB's REPLICATE counts these (Disque's reachable count): a peer whose link just
        # dropped gets its copy once the link is back, or the ADDJOB times out.
        node.ctx.live_nodes = len(alive)
        node.ctx.known_nodes = m.known()
        node.hello_nodes = m.hello()
        me = m.node(m.my_id)
        node.ctx.leaving = bool(me is not None and me.flags & NODE_LEAVING)
        # Peers that lack some of our features (core/features.py): unknown yet, or announced none,
        # is the release of before announcements.
        lacking = {}
        for nid, _, features in m.releases():
            have = UNANNOUNCED if features is None else features
            if not FEATURES <= have:
                lacking[nid] = have
        if lacking != node.ctx.lacking:
            node.ctx.lacking = lacking
        if node.id != m.my_id:
            node.set_id(m.my_id)

    def backlogged(self) -> frozenset[str]:
        """Reachable nodes whose link still holds output its socket has not taken (``ctx.backlogged``)."""
        bus = self.bus
        if bus is None:
            return _NONE
        link_of = self.membership.link_of
        busy = [nid for nid in self.node.ctx.reachable if (link := link_of(nid)) is not None and bus.pending_out(link)]
        return frozenset(busy) if busy else _NONE

    def send_data(self, node_id: str, kind: str, body: Any) -> bool:
        """Send an application message to a node over its outbound link (a bad body raises)."""
        return self.send_item(node_id, encode_data_item(kind, body))

    def send_item(self, node_id: str, item: bytes, watch: Any = None) -> bool:
        """Send an application message made by ``encode_data_item`` (see ``Bus.send_item``).

        ``watch``: a YOURJOBS message (``moves_to_watch``) handed back to the core
        (``Node.on_moves_unsent``) if it never reaches the socket."""
        m = self.membership  # once per job-layer message: no property or helper calls
        link = m.link_of(node_id)
        if link is None or self.bus is None:
            if watch is not None:
                self.node.on_moves_unsent(node_id, watch, now_ms())  # effects: the caller's loop
            return False
        self.stats["messages_sent"] += 1
        return self.bus.send_item(link, m.myself.id, item, watch)

    # ------------------------------------------------------------ CLUSTER
    def cmd_cluster(self, conn: Any, argv: list[bytes]) -> Any:
        """CLUSTER <subcommand> ... from a client (COMMANDS)."""
        return self.command(argv)

    def command(self, argv: list[bytes]) -> Any:
        sub = argv[1].lower()
        n = len(argv)
        m = self.membership
        now = now_ms()
        try:
            if sub == b"meet" and n == 4:
                try:
                    port = int(argv[3])
                except ValueError:
                    return err("Invalid TCP port specified: %s" % argv[3].decode("utf-8", "replace"))
                m.meet(argv[2].decode("utf-8", "replace"), port, now)
                self.apply()
                return OK
            if sub == b"nodes" and n == 2:
                return m.nodes_text().encode()
            if sub == b"myid" and n == 2:
                return m.my_id.encode()
            if sub == b"info" and n == 2:
                fields = dict(m.info_fields())
                fields.setdefault("cluster_stats_auth_failures", self.stats.get("auth_failures", 0))
                fields.setdefault("cluster_stats_bad_frames", self.stats.get("bad_frames", 0))
                # a host that feeds the core another way (the bus simulation's) counts none
                fields["cluster_stats_handler_errors"] = getattr(self.host, "handler_errors", 0)
                # job-layer messages a peer got wrong (unknown kind, bad shape): dropped by the core
                fields["cluster_stats_messages_malformed"] = self.node.bus_stats["messages_malformed"]
                # messages of a kind this release does not know (a newer peer's): dropped
                fields["cluster_stats_messages_unknown"] = self.node.bus_stats["messages_unknown"]
                if self.bus is not None:
                    for key, value in self.bus.stats.items():
                        fields["cluster_stats_bus_" + key] = value
                    fields["cluster_bus_pending_out_bytes"] = sum(map(self.bus.pending_out, list(self.bus.links)))
                return "".join("%s:%s\r\n" % kv for kv in fields.items()).encode()
            if sub == b"saveconfig" and n == 2:
                try:
                    self.save_now()
                except OSError as exc:
                    return err("error saving the cluster node config: %s" % exc.strerror)
                return OK
            if sub == b"forget" and n == 3:
                m.forget(argv[2].decode("utf-8", "replace"), now)
                self.apply()
                return OK
            if sub == b"reset" and n in (2, 3):
                mode = argv[2].lower() if n == 3 else b"soft"
                if mode not in (b"soft", b"hard"):
                    return syntax_error(argv[2], "RESET takes SOFT or HARD")
                hard = mode == b"hard"
                m.reset(hard, now, secrets.token_hex(20) if hard else None)
                self.node.flushall()
                self.save_now()
                self.apply()
                self.host.apply_effects()
                log.warning("CLUSTER RESET %s: I'm %s", mode.decode(), m.my_id)
                return OK
            if sub == b"leaving" and n in (2, 3):
                if n == 2:
                    return Status(b"yes" if self.node.ctx.leaving else b"no")
                value = argv[2].lower()
                if value not in (b"yes", b"no"):
                    return err("Wrong argument for CLUSTER LEAVING. Use 'yes' or 'no'")
                m.set_leaving(value == b"yes", now)
                self.apply()
                log.warning("CLUSTER LEAVING %s", value.decode())
                return OK
        except MembershipError as exc:
            return Error("ERR %s" % exc)
        return err("Unknown CLUSTER subcommand or wrong number of arguments for '%s'"
                   % argv[1].decode("utf-8", "replace"))  # fmt: skip
