"""The trio shell around the core: sockets, timers, signals, and nothing else.

``run_node(config, task_status=...)`` owns one nursery holding:

* the client listener(s) on ``bind``:``port`` and the client loop, one
  task for every client connection (see :mod:`.clients`),
* the timer task, which sleeps until the core's next wake-up (or until a
  command makes an earlier one) and then calls ``Node.tick``,
* the cron task (every 100 ms): ops/s sampling, idle-client timeouts, the
  periodic full garbage collection (see :mod:`.gcpolicy`),
* a signal watcher: SIGTERM/SIGINT stop the node cleanly.

Every input to the core is stamped with ``now_ms()`` (trio's clock);
effects that come back are carried out in ``apply_effects``, the only place
that routes replies to other clients.
"""

from __future__ import annotations

import math
import os
import signal
import socket
import time
from typing import Any

import trio

from cluster_bus.codec import encode_data_item
from cluster_bus.links import accept_forever

from .. import __version__
from ..config import Config, ConfigError
from ..core.effects import BLOCKED, Reply, Send
from ..core.federation import moves_to_watch
from ..core.node import Node
from ..core.replies import Error
from ..protocol.resp import ProtocolError, RequestParser, encode_reply
from . import admin, gcpolicy
from .clients import OUT_HOLD, ClientLoop, Connection
from .cluster import ClusterService
from .fdlimit import fit_maxclients
from .logs import log, set_level

__all__ = ["Server", "run_node"]

NOAUTH = Error("NOAUTH Authentication required.")


def now_ms() -> int:
    return int(trio.current_time() * 1000)


class Server:
    def __init__(self, config: Config) -> None:
        self.config = config
        self.start_time = time.time()
        # The address other nodes and HELLO advertise: the first bound one,
        # or loopback when bound to every interface.
        bind_ip = config.bind[0] if config.bind else "127.0.0.1"
        if bind_ip in ("0.0.0.0", "::", "*"):
            bind_ip = "127.0.0.1"
        mono = now_ms()
        wall_offset = int(time.time() * 1000) - mono
        self.node = Node(
            "0" * 40,  # replaced by the cluster identity just below
            seed=os.urandom(20),
            now=mono,
            wall_offset=wall_offset,
            address=(bind_ip, config.port),
        )
        self.cluster = ClusterService(self, config, bind_ip, mono, wall_offset)
        self.node.set_id(self.cluster.my_id)
        self.cluster.sync()
        self.stats: dict[str, int] = {
            "total_connections_received": 0,
            "total_commands_processed": 0,
            "total_net_input_bytes": 0,
            "total_net_output_bytes": 0,
            "rejected_connections": 0,
            "accept_errors": 0,
            "protocol_errors": 0,
            "internal_errors": 0,
            "client_output_buffer_limit_disconnections": 0,
        }
        self.clients: dict[int, Connection] = {}
        self.loop = ClientLoop(self)
        self._next_client_id = 0
        self.timer_lot = trio.lowlevel.ParkingLot()
        self.timer_deadline: int | None = None
        self.loop_runs_timers = False  # see hand_timers
        self.shutdown_event = trio.Event()
        self.listeners: list[trio.SocketListener] = []
        self._ops_samples: list[int] = [0] * 16
        self._ops_idx = 0
        self._last_ops = 0
        self.admin_commands = admin.build_table(self)
        config.on_change.append(self._config_changed)
        self.loop.set_output_limit(*config.client_output_buffer_limit["normal"])

    def _config_changed(self, name: str, old: Any, new: Any) -> None:
        if name == "maxclients" and new > old:
            fit, notes = fit_maxclients(new)
            if fit < new:  # vetoed: config_set restores the old value, the client reads why
                raise ConfigError(
                    "The operating system is not able to handle the specified number of clients, try with %d" % fit
                )
            for level, text in notes:
                log.log(level, "%s", text)
        log.info("CONFIG SET %s: %s -> %s", name, "(hidden)" if name == "requirepass" else old, "(hidden)" if name == "requirepass" else new)
        if name == "loglevel":
            set_level(new)
        elif name == "client-output-buffer-limit":
            self.loop.set_output_limit(*new["normal"])

    def _fit_maxclients(self) -> None:
        """At start: make room for maxclients clients in the open files limit, or lower maxclients."""
        try:
            fit, notes = fit_maxclients(self.config.maxclients)
        except OSError as exc:
            log.warning("Can't start: %s", exc)
            raise SystemExit(1) from exc
        for level, text in notes:
            log.log(level, "%s", text)
        self.config.maxclients = fit

    # ------------------------------------------------------------------ run
    async def run(self, *, task_status=trio.TASK_STATUS_IGNORED) -> None:
        cfg = self.config
        self._fit_maxclients()
        addrs = cfg.bind or ["0.0.0.0"]
        for host in addrs:
            try:
                self.listeners.extend(await trio.open_tcp_listeners(cfg.port, host=host, backlog=cfg.tcp_backlog))
            except OSError as exc:
                log.warning("Creating server TCP listening socket %s:%d: %s", host, cfg.port, exc.strerror or exc)
                raise SystemExit(1) from exc
        pidfile = cfg.pidfile_path
        if pidfile:
            try:
                with open(pidfile, "w") as f:
                    f.write("%d\n" % os.getpid())
            except OSError as exc:
                log.warning("Can't write pidfile %s: %s", pidfile, exc)
        log.info("Node ID %s", self.cluster.my_id)
        log.info("disque-py %s, Disque 1.0-rc1 compatible, pid %d", __version__, os.getpid())
        if cfg.config_file:
            log.info("Configuration loaded from %s", cfg.config_file)
        else:
            log.warning("No config file specified, using the default config. Pass a disque.conf path to use one.")
        try:
            async with trio.open_nursery() as nursery:
                nursery.start_soon(self.loop.run)
                nursery.start_soon(self._timer_loop)
                nursery.start_soon(self._cron_loop)
                nursery.start_soon(self._signal_loop)
                await nursery.start(self.cluster.run)
                for listener in self.listeners:
                    nursery.start_soon(self._accept_loop, listener)
                log.info(
                    "Ready to accept connections on %s port %d",
                    ", ".join(addrs),
                    cfg.port,
                )
                task_status.started(self)
                await self.shutdown_event.wait()
                log.warning("User requested shutdown...")
                nursery.cancel_scope.cancel()
        finally:
            # Only now: bus link tasks end after the client loop's task and use its epoll until then.
            self.loop.close_all()
            for listener in self.listeners:
                with trio.CancelScope(shield=True):
                    await listener.aclose()
            if pidfile:
                try:
                    os.unlink(pidfile)
                except OSError:
                    pass
            log.warning("disque-py is now ready to exit, bye bye...")

    def request_shutdown(self) -> None:
        self.shutdown_event.set()

    async def _signal_loop(self) -> None:
        with trio.open_signal_receiver(signal.SIGTERM, signal.SIGINT) as signals:
            async for signum in signals:
                log.warning("Received %s scheduling shutdown...", signal.Signals(signum).name)
                self.request_shutdown()
                return

    # -------------------------------------------------------------- clients
    async def _accept_loop(self, listener: trio.SocketListener) -> None:
        def failed() -> None:
            self.stats["accept_errors"] += 1

        await accept_forever(listener, self._serve_connection, what="client", log=log, on_error=failed)

    def _new_connection(self, sock: socket.socket) -> Connection:
        try:
            peer = sock.getpeername()
            local = sock.getsockname()
            addr = "%s:%d" % (peer[0], peer[1])
            laddr = "%s:%d" % (local[0], local[1])
        except OSError:
            addr = laddr = "?:0"
        cfg = self.config
        if cfg.tcp_keepalive:
            try:
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE, 1)
                if hasattr(socket, "TCP_KEEPIDLE"):
                    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_KEEPIDLE, cfg.tcp_keepalive)
                    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_KEEPINTVL, max(1, cfg.tcp_keepalive // 3))
                    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_KEEPCNT, 3)
            except OSError:
                pass
        parser = RequestParser(
            max_bulk_len=cfg.proto_max_bulk_len,
            max_args=cfg.proto_max_multibulk_len,
            max_query_buffer=cfg.client_query_buffer_limit,
        )
        self._next_client_id += 1
        return Connection(self._next_client_id, sock, addr, laddr, trio.current_time(), parser)

    def _serve_connection(self, stream: trio.SocketStream) -> None:
        # Take the OS socket out of trio's wrapper: the client loop drives it.
        sock = socket.socket(fileno=stream.socket.detach())
        sock.setblocking(False)
        self.stats["total_connections_received"] += 1
        cfg = self.config
        if len(self.clients) >= cfg.maxclients:
            self.stats["rejected_connections"] += 1
            try:
                sock.send(b"-ERR max number of clients reached\r\n")
            except OSError:
                pass
            sock.close()
            return
        conn = self._new_connection(sock)
        conn.authenticated = not cfg.requirepass
        self.clients[conn.id] = conn
        self.loop.add(conn)

    def protocol_error(self, conn: Connection, error: ProtocolError) -> None:
        """Commands before the bad bytes were answered; now the error, then the link is closed (as Redis does)."""
        self.stats["protocol_errors"] += 1
        log.log(15, "Protocol error from client id=%d addr=%s: %s", conn.id, conn.addr, error.reply_text)
        encode_reply(error.reply, conn.out)
        conn.closing = True

    def run_commands(self, conn: Connection, commands) -> None:
        """Run commands in order until the client blocks or its output reaches ``OUT_HOLD``;
        the rest wait in ``pending`` (see ``clients.py``)."""
        out = conn.out
        now = now_ms()
        dispatch = self.dispatch
        for i, argv in enumerate(commands):
            if conn.blocked or conn.closing or len(out) >= OUT_HOLD:
                if not conn.closing or conn.blocked:
                    conn.pending.extend(commands[i:])
                return
            reply = dispatch(conn, argv, now)
            if reply is BLOCKED:
                conn.blocked = True
            elif reply is not admin.NO_REPLY:
                conn.encode(reply, out)  # HELLO 3 may just have switched it

    def dispatch(self, conn: Connection, argv: list[bytes], now: int) -> Any:
        self.stats["total_commands_processed"] += 1
        try:
            name = argv[0].lower()
            conn.last_cmd = name
            if not conn.authenticated and name != b"auth" and name != b"hello":
                if self.config.requirepass:
                    return NOAUTH
                conn.authenticated = True
            if name == b"hello" and len(argv) > 1:
                return admin.hello_handshake(self, conn, argv)
            if not conn.authenticated and name == b"hello":
                return NOAUTH
            entry = self.admin_commands.get(name)
            if entry is not None:
                handler, arity = entry
                n = len(argv)
                if (arity > 0 and n != arity) or n < -arity:
                    return Error("ERR wrong number of arguments for '%s' command" % name.decode())
                return handler(conn, argv)
            return self.node.execute(conn.id, argv, now)
        except Exception:  # a bug must never take the node down
            self.stats["internal_errors"] += 1
            log.exception("Internal error running %r", argv[:1])
            return Error("ERR internal error, check the server logs")

    def apply_effects(self) -> None:
        """Carry out the core's effects: replies to blocked clients, bus messages."""
        node = self.node
        effects = node.take_effects()
        last_message = item = watch = None
        while effects:
            for effect in effects:
                kind = type(effect)
                if kind is Reply:
                    conn = self.clients.get(effect.client)
                    if conn is None:
                        continue
                    conn.blocked = False
                    conn.encode(effect.value, conn.out)
                    if conn.pending:
                        pending = list(conn.pending)
                        conn.pending.clear()
                        self.run_commands(conn, pending)
                    if conn.read_paused and not conn.pending:
                        self.loop.resume_reading(conn)
                    self.loop.send_soon(conn)
                elif kind is Send:
                    message = effect.message
                    if message is not last_message:  # the core fans one message out to several peers
                        # Fixed shapes, each checked by the cluster simulation (tests/sim), which encodes with checks.
                        item = encode_data_item(message[0], list(message[1:]), check_body=False)
                        last_message = message
                        # the only copy of a RETRY 0 job comes back if it never leaves
                        watch = message if message[0] == "YOURJOBS" and moves_to_watch(message) else None
                    self.cluster.send_item(effect.to, item, watch)
            effects = node.take_effects()

    def cluster_data(self, sender: str, items: Any) -> None:
        """Job-layer messages arrived on the bus: ``(kind, body)`` pairs, in order."""
        node = self.node
        now = now_ms()
        for kind, body in items:
            node.receive_data(sender, kind, body, now)
        self.apply_effects()
        self._poke_timer()  # a message may have set an earlier timer (e.g. a GC reply)

    def close_client(self, conn: Connection) -> None:
        self.loop.close_when_sent(conn)

    # --------------------------------------------------------------- timers
    # The core's timers (requeues, ack GC, replication, NEEDJOBS, held-back bus messages)
    # run from the client loop while it waits in its own epoll (``timers_due`` each pass,
    # the time left as its wait's limit): no trio task switch, cancel scope or deadline per
    # timer. When the loop waits through trio instead (another I/O backend, a virtual clock
    # in tests), ``_timer_loop`` runs them as a trio task.
    def hand_timers(self, to_loop: bool) -> None:
        """The client loop takes the core's timers over (True) or gives them back (False)."""
        self.loop_runs_timers = to_loop
        self.timer_lot.unpark_all()

    def _poke_timer(self) -> None:
        if self.loop_runs_timers:
            return  # the loop looks at the next timer after every pass
        nxt = self.node.next_wakeup()
        if nxt is not None and (self.timer_deadline is None or nxt < self.timer_deadline):
            self.timer_lot.unpark_all()

    def timers_due(self) -> float:
        """Run the core's timers if one is due; the seconds left until the next one."""
        node = self.node
        nxt = node.next_wakeup()
        if nxt is not None and nxt <= now_ms():
            self._tick()
            nxt = node.next_wakeup()
        return math.inf if nxt is None else nxt / 1000.0 - trio.current_time()

    def _tick(self) -> None:
        bus = self.cluster.bus
        if bus is not None:
            bus.hold()  # what the tick sends to peers leaves in one write per peer
        try:
            self.node.backlogged = self.cluster.backlogged()
            self.node.tick(now_ms())
            self.apply_effects()
        finally:
            if bus is not None:
                bus.release()

    async def _timer_loop(self) -> None:
        node = self.node
        while True:
            if self.loop_runs_timers:
                self.timer_deadline = None
                await self.timer_lot.park()
                continue
            nxt = node.next_wakeup()
            self.timer_deadline = nxt
            deadline = math.inf if nxt is None else nxt / 1000.0
            with trio.move_on_at(deadline):
                await self.timer_lot.park()
            if not self.loop_runs_timers:
                self._tick()

    async def _cron_loop(self) -> None:
        cfg = self.config
        while True:
            await trio.sleep(0.1)
            total = self.stats["total_commands_processed"]
            self._ops_samples[self._ops_idx % len(self._ops_samples)] = (total - self._last_ops) * 10
            self._ops_idx += 1
            self._last_ops = total
            if self.loop.limit_soft and self._ops_idx % 10 == 0:
                # a client that stopped reading altogether is not checked by the loop: check here
                for conn in [c for c in self.clients.values() if c.waiting_write]:
                    self.loop.over_output_limit(conn)
            if self._ops_idx % 10 == 0:
                gcpolicy.policy.maybe_full()
            if cfg.timeout and self._ops_idx % 10 == 0:
                limit = trio.current_time() - cfg.timeout
                for conn in list(self.clients.values()):
                    if not conn.blocked and conn.last_active < limit:
                        log.log(15, "Closing idle client id=%d addr=%s", conn.id, conn.addr)
                        self.close_client(conn)

    def instantaneous_ops(self) -> int:
        n = min(self._ops_idx, len(self._ops_samples))
        return sum(self._ops_samples[:n]) // n if n else 0


async def run_node(config: Config, *, task_status=trio.TASK_STATUS_IGNORED) -> None:
    """Run one node until SHUTDOWN or SIGTERM."""
    gcpolicy.install_from_env()
    server = Server(config)
    await server.run(task_status=task_status)
