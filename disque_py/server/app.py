"""A node: the shell's parts composed, and ``run_node``, the process's trio program.

Nothing in the shell imports this module; it imports the parts and wires
them (:class:`Server`):

* the core, ``Node`` (every decision about jobs);
* the dispatcher (:mod:`.dispatch`): runs commands, turns the core's
  effects into replies and bus messages for the client loop;
* the client loop and its acceptor (:mod:`.clients`): every client
  connection (and, once through their handshake, the bus links' sockets)
  in one trio task and one epoll; its pass reads, runs, commits to the AOF,
  sends the replies and flushes the bus;
* the core's timers and the cron (:mod:`.timers`);
* the cluster service (:mod:`.cluster`): membership, the bus, nodes.conf;
* the shell's own commands (:mod:`.admin`), bound to what they need;
* the workers the node hears from (:mod:`.workers`: WORKER BEAT, LIST, FORGET).

``run_node(config, task_status=...)`` (called by the CLI) runs one nursery
holding the client loop, the timer task, the cron, a signal watcher
(SIGTERM/SIGINT stop the node cleanly), the cluster service and one accept
task per listener, until SHUTDOWN or a signal.
"""

from __future__ import annotations

import os
import signal
import time
from functools import partial
from typing import Any

import trio

from .. import __version__
from ..config import DIRECTIVES, Config, ConfigError, inactive_settings, rewrite_config
from ..core.commandspec import CommandSpec, bind, check_unique
from ..core.node import CORE_COMMANDS, Node
from . import admin, gcpolicy, protection
from .acl import Acl, AclError
from .aof import Aof, AofLoadError
from .clients import Acceptor, ClientLoop
from .cluster import COMMANDS as CLUSTER_COMMANDS
from .cluster import ClusterService, CoreFeed
from .contracts import bind_clock, now_ms
from .dispatch import SENT_BY_KIND, Dispatcher
from .fdlimit import fit_maxclients
from .logs import log, set_format, set_level, set_node_id
from .timers import CoreTimers, Cron
from .workers import COMMANDS as WORKER_COMMANDS
from .workers import WorkerTable
from .tls import TLS_DIRECTIVES, TlsService
from .tls import describe as describe_tls

__all__ = ["Server", "run_node", "now_ms", "NODE_COMMANDS"]

#: Every command a node answers, each declared once beside the code that answers it
#: (core/commandspec.py), in the order COMMAND lists them. The dispatch tables, COMMAND's
#: reply, the -OOM refusals and the ACL rights are all made from these.
NODE_COMMANDS: tuple[CommandSpec, ...] = check_unique(
    CLUSTER_COMMANDS + admin.COMMANDS + WORKER_COMMANDS + CORE_COMMANDS)


class Server:
    """One node's parts, wired. The attributes are the parts (tests reach in through them)."""

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
        self.node = node = Node(
            "0" * 40,  # replaced by the cluster identity just below
            seed=os.urandom(20),
            now=mono,
            wall_offset=wall_offset,
            address=(bind_ip, config.port),
        )
        node.lifecycle.dedup_window_ms = config.dedup_window * 1000
        self.stats: dict[str, int] = {}  # INFO stats: each part adds and counts its own
        try:
            self.acl = acl = Acl.from_config(config, NODE_COMMANDS)  # the users: requirepass and the 'user' lines
        except AclError as exc:
            log.warning("*** FATAL CONFIG FILE ERROR *** in a 'user' directive: %s", exc)
            raise SystemExit(1) from None
        self.dispatcher = dispatcher = Dispatcher(node, config, self.stats, acl=acl)
        # The client loop's pass drives everything that runs in the core: its effects are
        # applied through the loop (loop.apply_effects), whoever gave the input.
        self.loop = loop = ClientLoop(dispatcher, self.stats)
        self.timers = timers = CoreTimers(node, loop.apply_effects)
        loop.timers = timers
        self.clients = loop.clients
        self.feed = CoreFeed(node, loop.apply_effects, timers.poke)
        self.cluster = cluster = ClusterService(self.feed, config, bind_ip, mono, wall_offset, reactor=loop)
        node.set_id(cluster.my_id)
        set_node_id(cluster.my_id)
        cluster.sync()
        timers.glue = cluster
        loop.links = cluster
        dispatcher.wire(loop)
        self.aof = aof = Aof(config, node)
        loop.commit = aof  # the pass's commit stage (nothing to do while it journals nothing)
        aof.wire(loop.release)
        self.acceptor = Acceptor(loop, config, self.stats)
        self.acceptor.acl = acl
        # TLS clients (tls-port): their own listener and handshake task, then served by the same
        # client loop as plain ones (server/tls.py); nothing of it is on the plain path.
        self.tls = TlsService(config, self.stats, self.acceptor.adopt)
        self.cron = Cron(config, self.stats, loop.check_clients)
        def measure_memory() -> None:
            dispatcher.measure_memory()
            loop.apply_effects()  # what freeing produced

        self.cron.every_step.append(measure_memory)
        # peers' job messages keep the cron at 10 Hz, as commands do (the memory level follows them)
        self.cron.activity = lambda: cluster.bus.stats["data_received"] if cluster.bus is not None else 0
        self.workers = workers = WorkerTable()  # WORKER BEAT/LIST/FORGET; past entries dropped each second
        self.cron.every_second.append(workers.expire)
        timers.latency = self.cron.latency = aof.latency = dispatcher.latency  # slow events (latency.py)
        context = admin.AdminContext(
            config=config,
            node=node,
            stats=self.stats,
            clients=loop.clients,
            start_time=self.start_time,
            request_shutdown=self.request_shutdown,
            close_client=loop.close_when_sent,
            ops_per_sec=self.cron.instantaneous_ops,
            commands=NODE_COMMANDS,
            aof=aof,
            acl=acl,
            cmdstats=dispatcher.cmdstats,
            slowlog=dispatcher.slowlog,
            latency=dispatcher.latency,
            connected_workers=workers.count,
        )
        dispatcher.admin = (admin.build_table(context) | bind(CLUSTER_COMMANDS, partial(getattr, cluster))
                            | bind(WORKER_COMMANDS, partial(getattr, workers)))
        dispatcher.hello = partial(admin.hello_handshake, context)
        # The admin HTTP port (admin-port; off by default): server/web.py, the app in disque_py/web.
        # Imported only when it is on: a node without it does not carry the HTTP stack.
        self.web: Any = None
        if config.admin_port:
            from .web import AdminWeb, make_handle

            self.web = AdminWeb(config, acl, lambda: make_handle(
                config=config, acl=acl, node=node, stats=self.stats, clients=loop.clients,
                start_time=self.start_time, dispatch=dispatcher.dispatch, apply_effects=loop.apply_effects,
                poke_timers=timers.poke, cluster=cluster,
                sent_by_kind=SENT_BY_KIND, aof_info=aof.info, loading=lambda: bool(aof.loading),
                cmdstats=lambda: dispatcher.cmdstats,
                workers=lambda: (workers.count(), workers.running())))  # fmt: skip
        self.shutdown_event = trio.Event()
        self.listeners: list[trio.SocketListener] = []
        self.tls_listeners: list[trio.SocketListener] = []
        config.on_change.append(self._config_changed)
        loop.set_output_limit(*config.client_output_buffer_limit["normal"])

    def _config_changed(self, name: str, old: Any, new: Any) -> None:
        if name in TLS_DIRECTIVES:
            self.tls.config_changed(name)  # first: a ConfigError vetoes the change, the old context stays
        if name == "maxclients" and new > old:
            fit, notes = fit_maxclients(new)
            if fit < new:  # vetoed: config_set restores the old value, the client reads why
                raise ConfigError(
                    "The operating system is not able to handle the specified number of clients, try with %d" % fit
                )
            for level, text in notes:
                log.log(level, "%s", text)
        hidden = name in ("requirepass", "tls-key-file-pass")
        log.info("CONFIG SET %s: %s -> %s", name, "(hidden)" if hidden else old, "(hidden)" if hidden else new)
        if not DIRECTIVES[name].implemented:
            log.warning("%s is set, but disque-py does not act on it yet (see disque.conf.example)", name)
        if name == "loglevel":
            set_level(new)
        elif name == "log-format":
            set_format(new)
        elif name == "client-output-buffer-limit":
            self.loop.set_output_limit(*new["normal"])
        elif name == "appendonly" and new != old:
            if new:
                self.aof.turn_on()
            else:
                self.aof.turn_off()
        elif name == "appendfsync":
            self.aof.settings_changed()
        elif name == "dedup-window":
            self.node.lifecycle.dedup_window_ms = new * 1000  # IDs already remembered keep their end

    def _load_aof(self) -> None:
        """At start, before anyone is served: the jobs of the AOF, then append to it."""
        cfg = self.config
        if not (cfg.appendonly or cfg.aof_enqueue_jobs_once):
            return
        self.node.ctx.now = now_ms()
        try:
            self.aof.load()
        except AofLoadError as exc:
            log.warning("%s", exc)
            raise SystemExit(1) from None
        except OSError as exc:
            log.warning("Can't read the append only file %s: %s", self.aof.path, exc.strerror or exc)
            raise SystemExit(1) from None
        if cfg.aof_enqueue_jobs_once:
            # This setting turns itself off once used (a controlled restart happens once).
            cfg.aof_enqueue_jobs_once = False
            if cfg.config_file:
                try:
                    rewrite_config(cfg)
                except OSError as exc:
                    log.warning("CONFIG REWRITE failed (executed to turn off aof-enqueue-jobs-once): %s", exc)
        if cfg.appendonly:
            try:
                self.aof.open_for_append()
            except OSError as exc:
                log.warning("Can't open the append only file %s: %s", self.aof.path, exc.strerror or exc)
                raise SystemExit(1) from None

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
        if cfg.tls_port:
            try:
                self.tls.load()
            except ConfigError as exc:
                log.warning("Can't start TLS on port %d: %s", cfg.tls_port, exc)
                raise SystemExit(1) from None
        wanted = []
        if cfg.port or not cfg.tls_port:  # port 0 with a tls-port: TLS clients only
            wanted.append((cfg.port, self.listeners))
        if cfg.tls_port:
            wanted.append((cfg.tls_port, self.tls_listeners))
        for port, into in wanted:
            for host in addrs:
                try:
                    into.extend(await trio.open_tcp_listeners(port, host=host, backlog=cfg.tcp_backlog))
                except OSError as exc:
                    log.warning("Creating server TCP listening socket %s:%d: %s", host, port, exc.strerror or exc)
                    raise SystemExit(1) from exc
        if self.web is not None and self.web.enabled:
            try:
                web_addrs = await self.web.open_listeners()
            except (OSError, ValueError) as exc:
                log.warning("Creating the admin HTTP port %d: %s", cfg.admin_port, getattr(exc, "strerror", None) or exc)
                raise SystemExit(1) from exc
        self.cluster.warn_ephemeral_bus_port()
        try:  # every port is taken before anything is written (pidfile, AOF, nodes.conf)
            self.cluster.check_bus_port()
        except OSError as exc:
            log.warning("%s", exc.strerror or exc)
            raise SystemExit(1) from exc
        pidfile = cfg.pidfile_path
        if pidfile:
            try:
                with open(pidfile, "w") as f:
                    f.write("%d\n" % os.getpid())
            except OSError as exc:
                log.warning("Can't write pidfile %s: %s", pidfile, exc)
        log.info("Node ID %s", self.cluster.my_id)
        self._load_aof()
        log.info("disque-py %s, Disque 1.0-rc1 compatible, pid %d", __version__, os.getpid())
        if cfg.config_file:
            log.info("Configuration loaded from %s", cfg.config_file)
        else:
            log.warning("No config file specified, using the default config. Pass a disque.conf path to use one.")
        for name in inactive_settings(cfg):
            log.warning("%s is set, but disque-py does not act on it yet (see disque.conf.example)", name)
        note = protection.startup_note(cfg, self.acl)
        if note:
            log.warning("%s", note)
        try:
            async with trio.open_nursery() as nursery:
                self.timers.every_period(self.cron.step)
                self.timers.every_period(self.cron.check_step)  # a pass of the loop after the step
                nursery.start_soon(self.loop.run)
                nursery.start_soon(self.timers.run)
                nursery.start_soon(self._signal_loop)
                await nursery.start(self.aof.run)
                await nursery.start(self.cluster.run, self.timers.every_period)
                for listener in self.listeners:
                    nursery.start_soon(self.acceptor.serve, listener)
                for listener in self.tls_listeners:
                    nursery.start_soon(self.tls.serve, listener)
                if self.web is not None and self.web.enabled:
                    await nursery.start(self.web.run)
                    log.info("Admin HTTP%s port %d on %s: /metrics /healthz /readyz /api",
                             "S" if cfg.admin_tls else "", cfg.admin_port, ", ".join(web_addrs))  # fmt: skip
                if self.listeners:
                    log.info("Ready to accept connections on %s port %d", ", ".join(addrs), cfg.port)
                if self.tls_listeners:
                    log.info("Ready to accept TLS connections on %s port %d (%s)", ", ".join(addrs), cfg.tls_port,
                             describe_tls(cfg))  # fmt: skip
                task_status.started(self)
                await self.shutdown_event.wait()
                log.warning("User requested shutdown...")
                nursery.cancel_scope.cancel()
        finally:
            # Only now: bus link tasks end after the client loop's task and use its epoll until then.
            self.loop.close_all()
            self.aof.close()
            for listener in self.listeners + self.tls_listeners:
                with trio.CancelScope(shield=True):
                    await listener.aclose()
            if self.web is not None:
                await self.web.aclose()
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


async def run_node(config: Config, *, task_status=trio.TASK_STATUS_IGNORED) -> None:
    """Run one node until SHUTDOWN or SIGTERM."""
    gcpolicy.install_from_env()
    server = Server(config)
    unbind = bind_clock()  # now_ms reads this run's clock directly
    try:
        await server.run(task_status=task_status)
    finally:
        unbind()
