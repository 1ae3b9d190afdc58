"""TLS on the client port: the context built from the ``tls-*`` directives, the handshake,
and the TLS socket the client loop serves.

Configured as Redis 6 does (``tls-port``, ``tls-cert-file``, ``tls-key-file``,
``tls-key-file-pass``, ``tls-ca-cert-file``, ``tls-ca-cert-dir``,
``tls-auth-clients yes|no|optional``, ``tls-protocols``, ``tls-ciphers``,
``tls-ciphersuites``, ``tls-prefer-server-ciphers``).

How a TLS client is served: :class:`TlsService` listens on ``tls-port``
beside (or, with ``port 0``, instead of) the plain listener. Each accepted
connection gets a trio task for its handshake only (non-blocking
``ssl.SSLSocket``, at most ``HANDSHAKE_TIMEOUT`` seconds); then the socket is
handed to the client loop (:meth:`.clients.Acceptor.adopt`, with the peer's
address) inside a :class:`TlsSocket`, whose ``recv``/``send`` move plaintext
and raise ``BlockingIOError`` when OpenSSL wants the socket, as a plain
non-blocking socket does. The loop's code is the same for both kinds of
client, so a plain connection does not pay one instruction for TLS, and a
TLS request costs what OpenSSL costs in C plus two Python method calls.

Why not a ``trio.SSLStream`` bridged into the loop through a
``socketpair()`` (one pump task per connection)? It was built first and
measured: redis-benchmark ADDJOB with 10 clients did 2.5k/s over TLS
against 20k/s plain, the pump's task switches and trio's pure-Python TLS
stream dominating. In the loop, the node spends 32-48 us of CPU per
unpipelined ADDJOB over TLS against 22-27 us plain, and 12-14 against 9-12 us
pipelined 16 deep (alternating runs on a busy 2-core machine); a plain
client costs what it cost before.

A failed handshake (a plain client on the TLS port, an unknown CA, an expired
certificate, no certificate when one is required, a version not allowed)
closes that connection, is counted (INFO stats ``tls_handshake_failures``) and
logged at verbose level, at most one line per ``FAILURE_LOG_S`` seconds with
the count of those not logged in between; the node serves on.

CONFIG SET of any ``tls-*`` runtime directive builds a new context from the
whole configuration first; a bad file or value is an error and the old
context stays. New connections get the new one; open ones keep theirs.

The cluster bus (``tls-cluster yes``) takes its two contexts from
:func:`build_bus_contexts`: the server side always requires a peer certificate
signed by the CA (whatever ``tls-auth-clients`` says for clients), the client
side presents the node's certificate and checks the peer's against the same
CA, with no host name check, as Redis does. The links themselves are
``cluster_bus.tls.TlsTransport``'s; the contexts are built once, at start.
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
    "build_client_context",
    "build_bus_contexts",
    "TlsSocket",
    "parse_protocols",
    "TLS_DIRECTIVES",
    "TLS_STATS",
    "HANDSHAKE_TIMEOUT",
]

HANDSHAKE_TIMEOUT = 10.0  # s for a client to finish its TLS handshake
FAILURE_LOG_S = 10.0  # at most one handshake failure line per this many seconds
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



def _apply_ciphers(ctx: ssl.SSLContext, cfg: "Config") -> None:
    """``tls-ciphers`` (TLS 1.2 and below) on ``ctx``, when set."""
    ciphers = cfg.get("tls-ciphers")
    if ciphers:
        try:
            ctx.set_ciphers(ciphers)
        except ssl.SSLError:
            raise ConfigError("Invalid tls-ciphers: OpenSSL matches no cipher in '%s'" % ciphers) from None

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
    _apply_ciphers(ctx, cfg)
    _check_suites(cfg.get("tls-ciphersuites"))
    if cfg.get("tls-prefer-server-ciphers"):
        ctx.options |= ssl.OP_CIPHER_SERVER_PREFERENCE
    ctx.options |= ssl.OP_NO_COMPRESSION | ssl.OP_NO_RENEGOTIATION
    return ctx


def build_client_context(cfg: "Config") -> ssl.SSLContext:
    """The context of a connection a node opens to a peer (the cluster bus, once it speaks TLS):
    our certificate (a peer with ``tls-auth-clients yes`` asks for it), the peer's checked against
    our CA. Host names are not checked: peers are known by address, and every node's certificate
    is signed by the cluster's CA, as Redis does it; a certificate that names its uses must allow
    both (extendedKeyUsage serverAuth and clientAuth). :class:`ConfigError` as the server's."""
    cert = _path(cfg, "tls-cert-file")
    key = _path(cfg, "tls-key-file")
    cafile = _path(cfg, "tls-ca-cert-file")
    capath = _path(cfg, "tls-ca-cert-dir")
    if not cert or not key or not (cafile or capath):
        raise ConfigError("TLS between nodes needs tls-cert-file, tls-key-file and tls-ca-cert-file (or -dir)")
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    ctx.check_hostname = False
    ctx.minimum_version, ctx.maximum_version = parse_protocols(cfg.get("tls-protocols"))
    try:
        ctx.load_cert_chain(cert, key, password=cfg.get("tls-key-file-pass") or None)
        ctx.load_verify_locations(cafile=cafile or None, capath=capath or None)
    except (ssl.SSLError, OSError, ValueError) as exc:
        raise ConfigError("Failed to load the TLS files for peers: %s" % exc) from None
    _apply_ciphers(ctx, cfg)
    return ctx


def build_bus_contexts(cfg: "Config") -> tuple[ssl.SSLContext, ssl.SSLContext]:
    """(server, client) contexts of the cluster bus's mutual TLS: both sides present the node's
    certificate and require the peer's, signed by the CA of ``tls-ca-cert-file``/``-dir``.
    :class:`ConfigError` when a file is missing or unusable."""
    client = build_client_context(cfg)  # checks that a CA is named
    server = build_server_context(cfg)  # loads the CA whenever one is named
    server.verify_mode = ssl.CERT_REQUIRED  # tls-auth-clients is about clients, not peers
    return server, client


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
    if isinstance(exc, ssl.SSLCertVerificationError) and exc.verify_message:
        return "%s: %s" % (exc.reason, exc.verify_message)
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

    ``adopt(sock, addr, laddr)`` hands a connection through its handshake to the client loop,
    with its peer's address (:meth:`.clients.Acceptor.adopt`). ``config`` is read at each change of a
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
        # Take the OS socket out of trio's wrapper, as the plain acceptor does.
        raw = socket.socket(fileno=stream.socket.detach())
        raw.setblocking(False)
        addr = _addr(raw, True)
        laddr = _addr(raw, False)
        if self.handshaking >= self.config.maxclients:  # a flood of idle handshakes: refuse the rest
            self.failures.failed(addr, "too many handshakes in progress")
            raw.close()
            return
        ctx = self.context
        assert ctx is not None
        self.handshaking += 1
        try:
            tls = ctx.wrap_socket(raw, server_side=True, do_handshake_on_connect=False)
        except (OSError, ValueError) as exc:
            self.handshaking -= 1
            self.failures.failed(addr, _reason(exc))
            raw.close()
            return
        failure = None
        try:
            with trio.move_on_after(HANDSHAKE_TIMEOUT) as scope:  # (one task per handshake: it waits)
                while True:
                    try:
                        tls.do_handshake()
                        break
                    except ssl.SSLWantReadError:
                        await trio.lowlevel.wait_readable(tls)
                    except ssl.SSLWantWriteError:
                        await trio.lowlevel.wait_writable(tls)
            if scope.cancelled_caught:
                failure = "no handshake within %gs" % HANDSHAKE_TIMEOUT
        except OSError as exc:  # ssl.SSLError included: the reason OpenSSL gives
            failure = _reason(exc)
        except BaseException:  # cancelled (the node stops)
            trio.lowlevel.notify_closing(tls)
            tls.close()
            raise
        finally:
            self.handshaking -= 1
        trio.lowlevel.notify_closing(tls)  # trio forgets the descriptor: from now on the loop's epoll has it
        if failure is not None:
            self.failures.failed(addr, failure)
            tls.close()
            return
        self.adopt(TlsSocket(tls), addr, laddr)  # keepalive, limits, the parser: as for a plain client


_WANT = (ssl.SSLWantReadError, ssl.SSLWantWriteError)


class TlsSocket:
    """A TLS connection as the client loop sees a socket: ``recv``/``send`` of plaintext that
    raise ``BlockingIOError`` when nothing can be done now, as a non-blocking socket does.

    OpenSSL's "want read"/"want write" become that ``BlockingIOError``; the loop then waits for
    the descriptor in its epoll as for any socket. Level-triggered epoll is enough for reads:
    OpenSSL does not read ahead, so a record it has not returned yet is still in the kernel
    (what it has decrypted but not returned, ``pending()``, is taken in the same ``recv``). A
    ``send`` that could not finish is repeated by the loop with the same output (it only ever
    grows at its end), which is what OpenSSL asks of a retried write.
    """

    __slots__ = ("_tls", "family")

    def __init__(self, tls: ssl.SSLSocket) -> None:
        self._tls = tls
        self.family = tls.family

    def fileno(self) -> int:
        return self._tls.fileno()

    def recv(self, size: int) -> bytes:
        tls = self._tls
        data = b""
        try:
            data = tls.recv(size)
            while data and len(data) < size and tls.pending():
                data += tls.recv(size - len(data))
            return data
        except _WANT:
            if data:  # what came before OpenSSL wanted more
                return data
        raise BlockingIOError  # raised outside the handler: no chained exception to keep alive

    def send(self, data: Any) -> int:
        try:
            return self._tls.send(data)
        except _WANT:
            pass
        raise BlockingIOError

    def close(self) -> None:
        self._tls.close()

    def getpeername(self) -> Any:
        return self._tls.getpeername()

    def getsockname(self) -> Any:
        return self._tls.getsockname()

    def setsockopt(self, *args: Any) -> None:
        self._tls.setsockopt(*args)

    def version(self) -> str | None:
        return self._tls.version()

    def getpeercert(self) -> Any:
        return self._tls.getpeercert()


def describe(cfg: "Config") -> str:
    """One log line's worth of the TLS settings (start-up)."""
    parts = ["client certificates %s" % {"yes": "required", "no": "not asked for", "optional": "checked if sent"}[cfg.tls_auth_clients]]
    if cfg.tls_protocols:
        parts.append("protocols %s" % cfg.tls_protocols)
    return ", ".join(parts)

