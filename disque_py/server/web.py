"""The admin HTTP port of a node: hypercorn serving the web app (disque_py/web) in the node's trio run.

Off unless ``admin-port`` is set. Then :meth:`AdminWeb.run` (a task of the node's
nursery, started by ``server/app.py``) listens on ``admin-bind`` (or the client port's
addresses) and serves each accepted connection with hypercorn's HTTP/1.1 protocol
(``hypercorn.trio.tcp_server.TCPServer``) and the starlette app of
:func:`disque_py.web.app.make_app`. Idle, that is one accept task per listener: the
client loop's path is untouched, and because trio's own epoll is watched by the client
loop's direct wait (:mod:`.waiting`), an HTTP connection wakes trio as any other
descriptor does, whether the loop is busy or idle.

Our accept loop rather than ``hypercorn.trio.serve``'s, so that a connection can be
judged before hypercorn sees it:

* protected mode, as the client port (:mod:`.protection`): with no ``admin-bind``, no
  ``bind``, no password and ``protected-mode yes``, a non-loopback client gets a 403 and
  a close;
* at most :data:`MAX_CONNECTIONS` connections at once: the others are closed at once
  (a flood costs an accept and a close each, nothing more);
* every connection lives at most :data:`CONNECTION_LIFETIME` seconds, and a request must
  arrive within ``read_timeout`` (hypercorn): a client trickling bytes cannot hold a slot
  for long. Hypercorn itself answers malformed HTTP with 400 and headers over
  ``h11_max_incomplete_size`` with 431/400, then closes.

The node is handed to the app as a :class:`disque_py.web.handle.NodeHandle` of callables
made here (:func:`make_handle`): commands run in process through the dispatcher, with an
internal connection authenticated as the HTTP caller, so an action is exactly a client's
command (ACL check, effects, AOF journal); peers are asked over their client ports
(:func:`ask_peer`, RESP with hiredis, a timeout on everything).

The HTTP stack (hypercorn, starlette, prometheus_client: some 10 MB and a good part of a start's
CPU) is imported when the first connection is accepted, in a worker thread while the node goes on
serving (:meth:`AdminWeb.http`): a node binds its admin port at start, as before, but carries the
stack only once someone uses it.

Called by ``server/app.py`` only. Imports no other part of the shell but the leaves
(protection, logs, contracts, connection constants).
"""

from __future__ import annotations

import ssl
from typing import TYPE_CHECKING, Any, Callable, Protocol

import trio

from .contracts import now_ms
from .logs import log
from .protection import is_loopback, protected

if TYPE_CHECKING:
    from ..web.handle import NodeHandle

__all__ = ["AdminWeb", "ClusterReads", "make_handle", "ask_peer", "MAX_CONNECTIONS", "CONNECTION_LIFETIME", "READ_TIMEOUT"]

MAX_CONNECTIONS = 64  # HTTP connections served at once; more are closed at accept
CONNECTION_LIFETIME = 120.0  # seconds one HTTP connection may live (keep-alive included)
READ_TIMEOUT = 5  # seconds hypercorn waits for the next bytes of a request (or of the next one)
KEEP_ALIVE = 5  # seconds an idle keep-alive connection stays open
MAX_HEADER_BYTES = 16 * 1024  # h11_max_incomplete_size: request line + headers
HANDSHAKE_TIMEOUT = 5.0  # TLS
INTERNAL_CLIENT_ID = -1  # the core's client id of commands run for the admin port

_FORBIDDEN = (
    b"HTTP/1.1 403 Forbidden\r\nContent-Type: application/json\r\nConnection: close\r\nContent-Length: %d\r\n\r\n%s"
)
_FORBIDDEN_BODY = (
    b'{"error":"protected mode: no admin-bind, bind or password is configured, so the admin port only '
    b'serves this machine (loopback); set admin-bind, requirepass, or protected-mode no"}'
)


class _Internal:
    """What the dispatcher reads and writes of a connection, for a command run for HTTP."""

    __slots__ = ("id", "authenticated", "user", "perms", "last_cmd", "closing", "blocked", "addr", "laddr", "name")

    def __init__(self, user: Any, acl: Any) -> None:
        self.id = INTERNAL_CLIENT_ID
        self.authenticated = True
        self.user = user.name
        self.perms = acl.perms_of(user)
        self.last_cmd = b""
        self.closing = False
        self.blocked = False
        self.addr = "admin-http"  # for anything that names the client (the slow log ...)
        self.laddr = ""
        self.name = b""


def _flag_names(text: str) -> tuple[str, ...]:
    names = []
    for f in text.split(","):
        if f == "fail?":
            names.append("pfail")
        elif f and f != "noflags":
            names.append(f)
    return tuple(names)


async def ask_peer(ip: str, port: int, argvs: list[list[bytes]], auth: Any, *, timeout: float = 1.5) -> list[Any]:
    """Commands pipelined to a node's client port; replies (error replies as exception values).
    ``auth``: (user, password) sent first with AUTH, or None. Raises on connect/IO errors and
    trio.TooSlowError after ``timeout`` seconds in all."""
    import hiredis

    with trio.fail_after(timeout):
        stream = await trio.open_tcp_stream(ip, port)
        try:
            reader = hiredis.Reader()
            cmds = list(argvs)
            if auth is not None:
                cmds.insert(0, [b"AUTH", auth[0], auth[1]])
            await stream.send_all(b"".join(hiredis.pack_command(tuple(a)) for a in cmds))
            replies: list[Any] = []
            while len(replies) < len(cmds):
                reply = reader.gets()
                if reply is False:
                    data = await stream.receive_some(65536)
                    if not data:
                        raise ConnectionError("connection closed by %s:%d" % (ip, port))
                    reader.feed(data)
                    continue
                replies.append(reply)
        finally:
            with trio.CancelScope(shield=True):
                await stream.aclose()
    if auth is not None:
        first = replies.pop(0)
        if isinstance(first, hiredis.ReplyError):
            raise PermissionError(str(first))
    return [Exception(str(r)) if isinstance(r, hiredis.ReplyError) else r for r in replies]


class ClusterReads(Protocol):
    """What the app reads of the cluster service (``server/cluster.py:ClusterService``)."""

    membership: Any  # cluster_bus.membership.Membership: the node table
    stats: dict[str, int]  # membership counters (CLUSTER INFO)
    bus: Any  # cluster_bus.links.Bus once the bus runs, else None
    received_by_kind: dict[str, int]  # job-layer messages received, by kind


def make_handle(
    *,
    config: Any,
    acl: Any,
    node: Any,
    stats: dict[str, int],
    clients: dict[int, Any],
    start_time: float,
    dispatch: Callable[[Any, list[bytes], int], Any],
    apply_effects: Callable[[], None],
    poke_timers: Callable[[], None],
    cluster: ClusterReads,
    sent_by_kind: dict[str, int],
    aof_info: Callable[[], dict[str, Any]],
    loading: Callable[[], bool],
    cmdstats: Callable[[], Any],
    workers: Callable[[], tuple[int, int]] = lambda: (0, 0),
) -> NodeHandle:
    """The app's view of a node, from the few things it reads and calls.

    ``dispatch(conn, argv, now_ms)``: the dispatcher's; ``apply_effects()``: the client loop's
    (outside a pass it also runs the pass's tail: held commands, the AOF commit, the release
    of replies, the bus); ``poke_timers()``: wakes the core's timers; ``sent_by_kind``: the dispatcher's count of bus messages sent by kind. The config,
    users, core node, INFO stats and client table are read, never written; ``workers()``: the live
    workers heard from and the jobs they run (server/workers.py)."""
    from cluster_bus.membership import flags_text

    from .. import __version__
    from ..web.handle import NodeHandle, Peer

    def run_command(argv: list[bytes], user: Any) -> Any:
        conn = _Internal(user, acl)
        reply = dispatch(conn, argv, now_ms())
        apply_effects()  # and, between two passes, the pass's tail: what it journaled is committed
        poke_timers()
        return reply

    def peers() -> list[Peer]:
        m = cluster.membership
        out = []
        for n in list(m._nodes.values()):
            mine = n.id == m.my_id
            out.append(Peer(n.id, n.ip, n.port, _flag_names(flags_text(n.flags)), mine or m.link_of(n.id) is not None))
        return out

    def cluster_stats() -> dict[str, int]:
        out = dict(cluster.stats)
        bus = cluster.bus
        if bus is not None:
            out["bytes_sent"] = bus.stats.get("bytes_sent", 0)
            out["bytes_received"] = bus.stats.get("bytes_received", 0)
        return out

    def bus_links() -> int:
        bus = cluster.bus
        return len(bus.links) if bus is not None else 0

    def messages_by_kind() -> tuple[dict[str, int], dict[str, int]]:
        return dict(sent_by_kind), dict(cluster.received_by_kind)

    return NodeHandle(
        config=config,
        acl=acl,
        node=node,
        stats=stats,
        clients=clients,
        start_time=start_time,
        run_command=run_command,
        peers=peers,
        ask_peer=ask_peer,
        cluster_stats=cluster_stats,
        bus_links=bus_links,
        messages_by_kind=messages_by_kind,
        aof_info=aof_info,
        cmdstats=cmdstats,
        loading=loading,
        workers=workers,
        version=__version__,
    )


class AdminWeb:
    """The admin port's listeners and connections (see the module docstring)."""

    def __init__(self, config: Any, acl: Any, handle_factory: Callable[[], NodeHandle]) -> None:
        self.config = config
        self.acl = acl
        self._handle_factory = handle_factory
        self.open = 0  # connections being served
        self.refused = 0  # closed at accept: over the cap, or protected mode
        self.listeners: list[trio.SocketListener] = []
        self.ssl_context: ssl.SSLContext | None = None
        self._http: Callable[[Any], Any] | None = None  # stream -> hypercorn's connection, once loaded
        self._loading = trio.Lock()
        self._load_failed = False

    @property
    def enabled(self) -> bool:
        return bool(self.config.admin_port)

    def _hyper_config(self, config_class: Any) -> Any:
        hc = config_class()
        hc.h11_max_incomplete_size = MAX_HEADER_BYTES
        hc.read_timeout = READ_TIMEOUT
        hc.keep_alive_timeout = KEEP_ALIVE
        hc.ssl_handshake_timeout = HANDSHAKE_TIMEOUT
        hc.include_server_header = False
        hc.accesslog = None
        hc.errorlog = None
        hc.h2_max_concurrent_streams = 10
        return hc

    def _tls_context(self) -> ssl.SSLContext:
        cfg = self.config
        cert = cfg.resolve_path(cfg.tls_cert_file) if cfg.tls_cert_file else ""
        key = cfg.resolve_path(cfg.tls_key_file) if cfg.tls_key_file else ""
        if not cert or not key:
            raise ValueError("admin-tls needs tls-cert-file and tls-key-file")
        ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        ctx.minimum_version = ssl.TLSVersion.TLSv1_2
        ctx.load_cert_chain(cert, key, password=cfg.tls_key_file_pass or None)
        ctx.set_alpn_protocols(["http/1.1"])
        return ctx

    async def open_listeners(self) -> list[str]:
        """Bind the admin port (before the node says it is ready); the addresses bound."""
        cfg = self.config
        if cfg.admin_tls:
            self.ssl_context = self._tls_context()
        addrs = cfg.admin_bind or cfg.bind or ["0.0.0.0"]
        for host in addrs:
            self.listeners.extend(await trio.open_tcp_listeners(cfg.admin_port, host=host, backlog=cfg.tcp_backlog))
        return addrs

    def _refuse_peer(self, stream: trio.SocketStream) -> bool:
        cfg = self.config
        if cfg.admin_bind or not protected(cfg, self.acl):
            return False
        try:
            return not is_loopback(stream.socket.getpeername())
        except OSError:
            return True

    async def http(self) -> Callable[[Any], Any]:
        """``serve(stream)``: a hypercorn connection serving the web app on ``stream``. Made at the
        first connection: the HTTP stack is imported in a worker thread (the node serves its clients
        meanwhile), the app is made here, in the node's thread."""
        if self._http is None:
            async with self._loading:
                if self._http is None:
                    try:
                        await trio.to_thread.run_sync(_import_http_stack)
                        self._http = self._make_http()
                    except Exception as exc:  # installed at start (the CLI checked), broken since
                        if not self._load_failed:  # said once; each connection is closed
                            log.warning("admin port: cannot load the HTTP stack: %s", exc)
                            self._load_failed = True
                        raise
        return self._http

    def _make_http(self) -> Callable[[Any], Any]:
        from hypercorn.config import Config as HyperConfig
        from hypercorn.trio.tcp_server import TCPServer
        from hypercorn.trio.worker_context import WorkerContext
        from hypercorn.typing import ConnectionState
        from hypercorn.utils import wrap_app

        from ..web.app import make_app

        app = wrap_app(make_app(self._handle_factory()), 0, "asgi")
        hc = self._hyper_config(HyperConfig)
        context = WorkerContext(None)

        def serve(conn: Any) -> Any:
            return TCPServer(app, hc, context, ConnectionState({}), conn).run()

        return serve

    async def run(self, *, task_status=trio.TASK_STATUS_IGNORED) -> None:
        async def serve_one(stream: trio.SocketStream) -> None:
            if self.open >= MAX_CONNECTIONS:
                self.refused += 1
                await _abort(stream)
                return
            self.open += 1
            try:
                if self._refuse_peer(stream):
                    self.refused += 1
                    with trio.move_on_after(1):
                        await stream.receive_some(MAX_HEADER_BYTES)  # read first: a close with unread input resets
                        await stream.send_all(_FORBIDDEN % (len(_FORBIDDEN_BODY), _FORBIDDEN_BODY))
                    await _abort(stream)
                    return
                with trio.move_on_after(CONNECTION_LIFETIME):
                    serve = await self.http()
                    conn: Any = stream
                    if self.ssl_context is not None:
                        conn = trio.SSLStream(stream, self.ssl_context, server_side=True, https_compatible=True)
                    await serve(conn)
                await _abort(stream)
            except Exception:  # noqa: BLE001 - one connection's failure never reaches the node
                log.debug("admin port: connection failed", exc_info=True)
                await _abort(stream)
            finally:
                self.open -= 1

        async with trio.open_nursery() as nursery:
            for listener in self.listeners:
                nursery.start_soon(self._accept, listener, serve_one, nursery)
            task_status.started()

    async def _accept(self, listener: trio.SocketListener, serve_one: Any, nursery: trio.Nursery) -> None:
        while True:
            try:
                stream = await listener.accept()
            except OSError as exc:  # EMFILE and friends: wait a little, as the client port does
                log.warning("admin port: accept failed: %s", exc)
                await trio.sleep(0.1)
                continue
            nursery.start_soon(serve_one, stream)

    async def aclose(self) -> None:
        for listener in self.listeners:
            with trio.CancelScope(shield=True):
                await listener.aclose()


def _import_http_stack() -> None:
    """What serving HTTP imports (run in a worker thread, see :meth:`AdminWeb.http`)."""
    import hypercorn.trio.tcp_server  # noqa: F401
    import hypercorn.utils  # noqa: F401

    from ..web import app  # noqa: F401


async def _abort(stream: trio.SocketStream) -> None:
    try:
        with trio.CancelScope(shield=True):
            await trio.aclose_forcefully(stream)
    except Exception:  # noqa: BLE001
        pass

