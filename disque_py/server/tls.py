"""TLS on the client port: the context built from the ``tls-*`` directives, and the bridge.

Configured as Redis 6 does (``tls-port``, ``tls-cert-file``, ``tls-key-file``,
``tls-key-file-pass``, ``tls-ca-cert-file``, ``tls-ca-cert-dir``,
``tls-auth-clients yes|no|optional``, ``tls-protocols``, ``tls-ciphers``,
``tls-ciphersuites``, ``tls-prefer-server-ciphers``).

How a TLS client is served: :class:`TlsService` listens on ``tls-port``
beside (or, with ``port 0``, instead of) the plain listener. Each accepted
connection gets a trio task that runs the handshake (at most
``HANDSHAKE_TIMEOUT`` seconds) on a :class:`trio.SSLStream`; then a
``socket.socketpair()`` bridges it into the client loop: one end is handed
to the loop as an ordinary connection (with the TLS peer's address, for
CLIENT LIST and the logs), and the task pumps bytes both ways between the
TLS stream and the other end. So the client loop, its parser, its output
limits and its back-pressure are the same for both kinds of client, and a
plain connection does not pay one instruction for TLS: the loop's fast path
is untouched. A TLS request costs two more hops through a local socket and
the task switches of the pump (measured in the report of this change).

Why not decrypt inside the client loop (``ssl.MemoryBIO`` per connection)?
It would put a TLS branch on the loop's hot path and make its back-pressure
and output accounting deal with records and renegotiation; the bridge keeps
both paths simple and lets a socket's buffer be the back-pressure between
them.

A failed handshake (a plain client on the TLS port, an unknown CA, an expired
certificate, no certificate when one is required, a version not allowed)
closes that connection, is counted (INFO stats ``tls_handshake_failures``) and
logged at verbose level, at most one line per ``FAILURE_LOG_S`` seconds with
the count of those not logged in between; the node serves on.

CONFIG SET of any ``tls-*`` runtime directive builds a new context from the
whole configuration first; a bad file or value is an error and the old
context stays. New connections get the new one; open ones keep theirs.

The cluster bus is not covered here: ``tls-cluster`` is parsed but not acted
on; :func:`build_client_context` is what a bus link would share (the same
certificate, as Redis uses it for both sides).
"""

from __future__ import annotations

import socket
import ssl
from typing import TYPE_CHECKING, Any, Callable

import trio

from cluster_bus.links import accept_forever

from ..config import ConfigError
from .logs import log

if TYPE_CHECKING:
    from ..config import Config

__all__ = [
    "TlsService",
    "build_server_context",
    "parse_protocols",
    "TLS_DIRECTIVES",
    "TLS_STATS",
    "HANDSHAKE_TIMEOUT",
]

HANDSHAKE_TIMEOUT = 10.0  # s for a client to finish its TLS handshake
FAILURE_LOG_S = 10.0  # at most one handshake failure line per this many seconds
PUMP_SIZE = 65536
VERBOSE = 15

#: The directives a CONFIG SET of which rebuilds the context.
TLS_DIRECTIVES = frozenset({
    "tls-cert-file", "tls-key-file", "tls-key-file-pass", "tls-ca-cert-file", "tls-ca-cert-dir",
    "tls-auth-clients", "tls-protocols", "tls-ciphers", "tls-ciphersuites", "tls-prefer-server-ciphers",
})  # fmt: skip

#: INFO stats counters kept by the TLS listener.
TLS_STATS = ("tls_connections_received", "tls_handshake_failures")

_VERSIONS = {
    "tlsv1": ssl.TLSVersion.TLSv1,
    "tlsv1.1": ssl.TLSVersion.TLSv1_1,
    "tlsv1.2": ssl.TLSVersion.TLSv1_2,
    "tlsv1.3": ssl.TLSVersion.TLSv1_3,
}
_ORDER = list(_VERSIONS.values())
_VERIFY = {"yes": ssl.CERT_REQUIRED, "optional": ssl.CERT_OPTIONAL, "no": ssl.CERT_NONE}
#: The TLSv1.3 suites OpenSSL knows (what ``tls-ciphersuites`` may name).
TLS13_SUITES = frozenset({
    "TLS_AES_128_GCM_SHA256", "TLS_AES_256_GCM_SHA384", "TLS_CHACHA20_POLY1305_SHA256",
    "TLS_AES_128_CCM_SHA256", "TLS_AES_128_CCM_8_SHA256",
})  # fmt: skip


def parse_protocols(text: str) -> tuple[ssl.TLSVersion, ssl.TLSVersion]:
    """``"TLSv1.2 TLSv1.3"`` -> (minimum, maximum). Names as Redis takes them, in any case;
    empty means TLSv1.2 and TLSv1.3 (Redis's default). The versions named must be contiguous:
    an SSL context has a minimum and a maximum, not a set."""
    words = text.lower().split()
    if not words:
        return ssl.TLSVersion.TLSv1_2, ssl.TLSVersion.TLSv1_3
    picked = set()
    for w in words:
        v = _VERSIONS.get(w)
        if v is None:
            raise ConfigError("Invalid tls-protocols: unknown protocol '%s' (TLSv1, TLSv1.1, TLSv1.2, TLSv1.3)" % w)
        picked.add(_ORDER.index(v))
    lo, hi = min(picked), max(picked)
    if len(picked) != hi - lo + 1:
        raise ConfigError("Invalid tls-protocols: '%s' leaves a gap; name a contiguous range of versions" % text)
    return _ORDER[lo], _ORDER[hi]


def _check_suites(text: str) -> None:
    for name in text.split(":"):
        if name and name not in TLS13_SUITES:
            raise ConfigError("Invalid tls-ciphersuites: unknown TLSv1.3 ciphersuite '%s'" % name)


def _path(cfg: "Config", name: str) -> str:
    value = cfg.get(name)
    return cfg.resolve_path(value) if value else ""


def build_server_context(cfg: "Config") -> ssl.SSLContext:
    """A server context from the ``tls-*`` values of ``cfg``; :class:`ConfigError` saying what is
    wrong (a missing or unreadable file, a key that does not match, a bad protocol or cipher)."""
    cert = _path(cfg, "tls-cert-file")
    key = _path(cfg, "tls-key-file")
    cafile = _path(cfg, "tls-ca-cert-file")
    capath = _path(cfg, "tls-ca-cert-dir")
    auth = cfg.get("tls-auth-clients")
    if not cert or not key:
        raise ConfigError("TLS needs tls-cert-file and tls-key-file")
    if auth != "no" and not (cafile or capath):
        raise ConfigError(
            "Either tls-ca-cert-file or tls-ca-cert-dir must be specified when tls-auth-clients is enabled"
        )
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    ctx.minimum_version, ctx.maximum_version = parse_protocols(cfg.get("tls-protocols"))
    password = cfg.get("tls-key-file-pass") or None
    try:
        ctx.load_cert_chain(cert, key, password=password)
    except FileNotFoundError as exc:
        raise ConfigError("Failed to load certificate or key: %s: %s" % (exc.filename or cert, exc.strerror)) from None
    except (ssl.SSLError, OSError, ValueError) as exc:
        raise ConfigError("Failed to load certificate %s with key %s: %s" % (cert, key, exc)) from None
    if cafile or capath:
        try:
            ctx.load_verify_locations(cafile=cafile or None, capath=capath or None)
        except (ssl.SSLError, OSError, ValueError) as exc:
            raise ConfigError("Failed to load CA certificates (%s): %s" % (cafile or capath, exc)) from None
    ctx.verify_mode = _VERIFY[auth]
    ciphers = cfg.get("tls-ciphers")
    if ciphers:
        try:
            ctx.set_ciphers(ciphers)
        except ssl.SSLError:
            raise ConfigError("Invalid tls-ciphers: OpenSSL matches no cipher in '%s'" % ciphers) from None
    _check_suites(cfg.get("tls-ciphersuites"))
    if cfg.get("tls-prefer-server-ciphers"):
        ctx.options |= ssl.OP_CIPHER_SERVER_PREFERENCE
    ctx.options |= ssl.OP_NO_COMPRESSION | ssl.OP_NO_RENEGOTIATION
    return ctx


class _FailureLog:
    """Handshake failures: every one counted, one line per ``FAILURE_LOG_S`` s logged."""

    def __init__(self, stats: dict[str, int]) -> None:
        self.stats = stats
        self.logged_at = -float("inf")
        self.unlogged = 0

    def failed(self, addr: str, reason: str) -> None:
        self.stats["tls_handshake_failures"] += 1
        now = trio.current_time()
        if now - self.logged_at < FAILURE_LOG_S:
            self.unlogged += 1
            return
        more = " (%d more since the last report)" % self.unlogged if self.unlogged else ""
        log.log(VERBOSE, "TLS handshake failed with %s: %s%s", addr, reason, more)
        self.logged_at, self.unlogged = now, 0


def _reason(exc: BaseException) -> str:
    """A short reason for a failed handshake (the SSL error's own, or what broke)."""
    while exc.__cause__ is not None and not isinstance(exc, ssl.SSLError):
        exc = exc.__cause__
    if isinstance(exc, ssl.SSLError):
        return exc.reason or exc.strerror or str(exc)
    return str(exc) or type(exc).__name__


def _addr(sock: Any, peer: bool) -> str:
    try:
        a = sock.getpeername() if peer else sock.getsockname()
        return "%s:%d" % (a[0], a[1])
    except (OSError, IndexError, TypeError):
        return "?:0"


class TlsService:
    """The TLS listener(s) of a node and the current server context.

    ``adopt(sock, addr, laddr)`` hands a bridged socket to the client loop as a connection whose
    peer is ``addr`` (:meth:`.clients.Acceptor.adopt`). ``config`` is read at each change of a
    ``tls-*`` directive (``config_changed``, called by the node's CONFIG SET hook)."""

    def __init__(self, config: "Config", stats: dict[str, int], adopt: Callable[..., Any]) -> None:
        for key in TLS_STATS:
            stats.setdefault(key, 0)
        self.config = config
        self.stats = stats
        self.adopt = adopt
        self.context: ssl.SSLContext | None = None
        self.failures = _FailureLog(stats)
        self.handshaking = 0

    @property
    def enabled(self) -> bool:
        return bool(self.config.tls_port)

    def load(self) -> None:
        """At start: build the context (:class:`ConfigError` if it cannot be)."""
        self.context = build_server_context(self.config)
        self._warn_suites()

    def _warn_suites(self) -> None:
        if self.config.tls_ciphersuites:
            log.warning("tls-ciphersuites is checked but not applied: Python's ssl module offers no way to "
                        "restrict TLSv1.3 ciphersuites (use tls-protocols TLSv1.2 with tls-ciphers instead)")  # fmt: skip

    def config_changed(self, name: str) -> None:
        """CONFIG SET of a ``tls-*`` directive (the new value already in ``config``): a new
        context for new connections, or :class:`ConfigError` and the old one stays."""
        if name not in TLS_DIRECTIVES or not self.enabled:
            return
        self.context = build_server_context(self.config)
        if name == "tls-ciphersuites":
            self._warn_suites()
        log.info("TLS context rebuilt (%s changed): new connections use it", name)

    # ------------------------------------------------------------ serving
    async def serve(self, listener: trio.SocketListener) -> None:
        async with trio.open_nursery() as nursery:

            def spawn(stream: trio.SocketStream) -> None:
                nursery.start_soon(self._connection, stream)

            await accept_forever(listener, spawn, what="TLS client", log=log)

    async def _connection(self, stream: trio.SocketStream) -> None:
        self.stats["tls_connections_received"] += 1
        raw = stream.socket
        addr = _addr(raw, True)
        laddr = _addr(raw, False)
        if self.handshaking >= self.config.maxclients:  # a flood of idle handshakes: refuse the rest
            self.failures.failed(addr, "too many handshakes in progress")
            await stream.aclose()
            return
        ctx = self.context
        assert ctx is not None
        tls = trio.SSLStream(stream, ctx, server_side=True, https_compatible=True)
        self.handshaking += 1
        try:
            with trio.move_on_after(HANDSHAKE_TIMEOUT) as scope:
                await tls.do_handshake()
        except (trio.BrokenResourceError, trio.ClosedResourceError, OSError) as exc:
            self.failures.failed(addr, _reason(exc))
            await trio.aclose_forcefully(tls)
            return
        finally:
            self.handshaking -= 1
        if scope.cancelled_caught:
            self.failures.failed(addr, "no handshake within %gs" % HANDSHAKE_TIMEOUT)
            await trio.aclose_forcefully(tls)
            return
        self._keepalive(raw)
        inner, outer = socket.socketpair()
        try:
            inner.setblocking(False)
            outer.setblocking(False)
            for s in (inner, outer):  # as much in flight as a TCP socket would hold
                s.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 1 << 20)
                s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 1 << 20)
            self.adopt(inner, addr, laddr)
        except Exception:
            inner.close()
            outer.close()
            await trio.aclose_forcefully(tls)
            raise
        local = trio.SocketStream(trio.socket.from_stdlib_socket(outer))
        await self._pump(tls, local)

    def _keepalive(self, sock: Any) -> None:
        idle = self.config.tcp_keepalive
        if not idle:
            return
        try:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE, 1)
            if hasattr(socket, "TCP_KEEPIDLE"):
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_KEEPIDLE, idle)
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_KEEPINTVL, max(1, idle // 3))
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_KEEPCNT, 3)
        except OSError:
            pass

    async def _pump(self, tls: trio.SSLStream, local: trio.SocketStream) -> None:
        """Bytes both ways until the client loop closes its end (QUIT, CLIENT KILL, a protocol
        error, the client's own EOF passed on) or the TLS link breaks."""
        async with trio.open_nursery() as nursery:

            async def client_to_loop() -> None:
                try:
                    while True:
                        data = await tls.receive_some(PUMP_SIZE)
                        if not data:
                            break
                        await local.send_all(data)
                    # the client is done sending: the loop sees EOF, answers what it read, closes
                    with trio.CancelScope(shield=True):
                        try:
                            await local.send_eof()
                        except (trio.BrokenResourceError, trio.ClosedResourceError, OSError):
                            pass
                except (trio.BrokenResourceError, trio.ClosedResourceError, OSError):
                    nursery.cancel_scope.cancel()  # broken link: drop everything

            async def loop_to_client() -> None:
                try:
                    while True:
                        data = await local.receive_some(PUMP_SIZE)
                        if not data:
                            break
                        await tls.send_all(data)
                except (trio.BrokenResourceError, trio.ClosedResourceError, OSError):
                    pass
                nursery.cancel_scope.cancel()

            nursery.start_soon(client_to_loop)
            nursery.start_soon(loop_to_client)
        await trio.aclose_forcefully(local)
        with trio.move_on_after(1) as scope:
            scope.shield = True
            try:
                await tls.aclose()  # close_notify, then the socket
            except (trio.BrokenResourceError, trio.ClosedResourceError, OSError):
                pass
        await trio.aclose_forcefully(tls)


def describe(cfg: "Config") -> str:
    """One log line's worth of the TLS settings (start-up)."""
    parts = ["client certificates %s" % {"yes": "required", "no": "not asked for", "optional": "checked if sent"}[cfg.tls_auth_clients]]
    if cfg.tls_protocols:
        parts.append("protocols %s" % cfg.tls_protocols)
    return ", ".join(parts)

