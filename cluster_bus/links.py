"""The trio side of the cluster bus: a listener, links, framed messages.

Theory of operation
-------------------
``Bus`` moves messages and nothing else; who to talk to and what a message
means is decided by its ``handler`` (the membership driver in the server).

* ``serve()`` listens on the bus port (client port + 10000). Every accepted
  connection becomes an *inbound* link, which must deliver its first
  message within ``HANDSHAKE_TIMEOUT`` (after the handshake, with a secret)
  or is closed and counted (``silent_links``): a silent connection would
  only hold a descriptor. At most ``MAX_UNHEARD_LINKS`` inbound links may
  be waiting for their first message: one more closes the oldest of them
  (``evicted_links``), so a flood of connections to the bus port cycles
  through that many descriptors instead of taking every descriptor the
  process has for 5 s (a real peer speaks within a millisecond or so of
  connecting). Out of descriptors, accept() is retried quietly
  (``accept_errors``, one log line per 10 s: :func:`accept_forever`).
* ``connect(node_id, ip, bus_port)`` opens an *outbound* link in the
  background and reports ``handler.link_up(node_id, link)`` or
  ``handler.link_failed(node_id)``; the handler decides when to retry, so
  reconnect backoff lives in one place (membership's cron).
* With a cluster secret, a link is usable only after the mutual
  challenge-response of :mod:`cluster_bus.codec` (initiator = connecting
  side); every later frame carries a sequence number and a MAC. A peer that
  fails is disconnected, counted, and reported to the handler
  (``link_error``) with its reason at most once per address and kind every
  ``REPORT_EVERY`` seconds; the next full report says how many came between.
* ``send(link, msg)`` encodes (and seals) at once, in call order, into the
  link's output buffer, which is written in one go later (by the reactor
  pass's end or the flusher, see below; or by the link's writer task): all
  messages queued meanwhile leave in a single write.
* ``send_data(link, sender, kind, body)`` encodes the application message at
  once too, but holds it with the other application messages queued for
  that link until the link is written, which sends them all as one
  ``DataBatch`` frame: one frame, one seal, one decode and one handler call
  on the other side for a whole turn's worth of REPLJOB or GOTJOB.
  ``send_item`` takes a message already encoded by ``encode_data_item``, so
  one message for several peers is checked and encoded once. A
  ``send`` of a membership message first closes the batch, so messages
  leave in call order.
* A message sent with a ``watch`` token comes back (``handler.unsent``,
  after ``link_down``) if its link ends before the socket took the whole
  frame it is in: such a message certainly never arrived, as a peer acts
  only on whole frames. Bytes the socket took may or may not arrive, so
  their tokens are simply forgotten. The job layer uses this to keep the
  only copy of an at-most-once job that was moving on a link torn down.
* Garbage (a frame over ``max_frame``, undecodable msgpack, a bad MAC, a
  replayed frame) closes that link and is reported; the node carries on.
* With a ``reactor`` (the node's client loop: one epoll for every socket,
  see :class:`Reactor`), a TCP link, once through the handshake, is read
  and written from that loop instead of a reader and a writer task: bytes
  that arrive are delivered in the same pass as the clients' commands, and
  what a pass queued for a peer leaves at its end in one ``write`` (between
  ``hold()`` and ``release()``), with no task switch and no trio scheduler
  round per message. Output queued outside a held pass is sent by one
  flusher task for all links. A socket that does not take everything is
  watched for writability; the link's task only waits for the link's end
  and cleans up. A TLS link (``cluster_bus.tls.TlsStream``) goes to the
  reactor the same way, read and written through its ``ssl.SSLSocket``.
  Links over other streams (the tests' memory transport) keep the two tasks.
* ``cluster_bus.tls.TlsTransport`` (``tls-cluster yes``) runs every link
  over mutual TLS: the TLS handshake comes first (within
  ``HANDSHAKE_TIMEOUT``; a failure is counted in ``stats["tls_failures"]``
  and reported as kind ``"tls"``), then the secret's handshake and MACs,
  if any, inside it.

The transport is injectable so tests can wire whole nodes in one process
with memory streams (see ``MemoryNetwork`` in the tests).
"""

from __future__ import annotations

import collections
import errno
import functools
import ipaddress
import logging
import math
import os
import socket
import ssl
import time
from collections.abc import Callable
from typing import Any, Protocol

import trio

from .codec import (
    DATA_BATCH_OVERHEAD,
    MAX_BODY,
    MAX_FRAME_DEFAULT,
    AuthError,
    BusProtocolError,
    FrameDecoder,
    InitiatorHandshake,
    LinkSession,
    ResponderHandshake,
    data_batch_body,
    decode_message,
    encode_data_item,
    encode_message,
    frame,
)

from .messages import MAX_BATCH, AuthChallenge, AuthHello, AuthProof, Data, DataBatch

__all__ = ["Bus", "BusHandler", "Reactor", "TcpTransport", "HANDSHAKE_TIMEOUT", "MAX_UNHEARD_LINKS", "accept_forever",
           "accept_batches"]

_AUTH_TYPES = (AuthHello, AuthChallenge, AuthProof)
_GONE = (trio.BrokenResourceError, trio.ClosedResourceError, OSError)

HANDSHAKE_TIMEOUT = 5.0  # also: an inbound link's first message must come within this (s)
MAX_UNHEARD_LINKS = 64  # inbound links still waiting for their first message; one more evicts the oldest
MAX_REPORTED = 1024  # (kind, peer address) pairs whose link errors were logged in full; then all forgotten
REPORT_EVERY = 60.0  # s: a link error's reason is reported at most this often per address and kind
CONNECT_TIMEOUT = 3.0
READ_SIZE = 65536
#: accept() failures meaning "no descriptor or memory left for now": wait and try again
ACCEPT_RETRY_ERRNOS = (errno.EMFILE, errno.ENFILE, errno.ENOBUFS, errno.ENOMEM)
ACCEPT_RETRY_S = 0.1
ACCEPT_ERROR_LOG_S = 10.0  # at most one log line per this many seconds while accept() keeps failing

_log = logging.getLogger("disque.bus")


class _AcceptTrouble:
    """accept() out of descriptors or memory: each failure counted (``on_error``), a log line at
    most every ``ACCEPT_ERROR_LOG_S`` with the count since the last one, then a pause of
    ``ACCEPT_RETRY_S``; any other error propagates."""

    def __init__(self, what: str, log: logging.Logger, on_error: Callable[[], None] | None) -> None:
        self.what = what
        self.log = log
        self.on_error = on_error
        self.unreported = 0
        self.reported_at = -math.inf

    async def handle(self, exc: OSError) -> None:
        if exc.errno not in ACCEPT_RETRY_ERRNOS:
            raise exc
        if self.on_error is not None:
            self.on_error()
        now = trio.current_time()
        if now - self.reported_at >= ACCEPT_ERROR_LOG_S:
            more = " (and %d more times since the last report)" % self.unreported if self.unreported else ""
            self.log.warning("Accepting %s connection: %s%s", self.what, exc, more)
            self.reported_at, self.unreported = now, 0
        else:
            self.unreported += 1
        await trio.sleep(ACCEPT_RETRY_S)


async def accept_forever(
    listener: trio.SocketListener,
    spawn: Callable[[trio.SocketStream], Any],
    *,
    what: str,
    log: logging.Logger,
    on_error: Callable[[], None] | None = None,
) -> None:
    """Accept connections for ever and hand each stream to ``spawn``.

    When the process is out of descriptors (or memory) accept() is retried
    every 0.1 s and ``on_error`` counts each failure, but the log gets one
    line per 10 s with the count since the last one, not a line (or trio's
    traceback) per retry. Other errors propagate.
    """
    trouble = _AcceptTrouble(what, log, on_error)
    while True:
        try:
            stream = await listener.accept()
        except OSError as exc:
            await trouble.handle(exc)
            continue
        spawn(stream)


#: Connections taken per wake-up of the listener by :func:`accept_batches` (Disque's MAX_ACCEPTS_PER_CALL).
ACCEPT_BATCH = 1000
#: accept() errors that concern one connection only (gone before it was taken): the next is tried (as trio does).
_ACCEPT_SKIP_ERRNOS = (errno.ECONNABORTED, errno.EPERM, errno.EPROTO)


def _stream_options(sock: socket.socket) -> None:
    """What ``trio.SocketStream`` sets on a TCP socket: TCP_NODELAY, and TCP_NOTSENT_LOWAT at 16 KiB
    (the kernel then holds little unsent output, so what a client does not read stays in the
    node's buffers, where the output limits see it)."""
    try:
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    except OSError:
        pass
    if hasattr(socket, "TCP_NOTSENT_LOWAT"):
        try:
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NOTSENT_LOWAT, 2**14)
        except OSError:
            pass


async def accept_batches(
    listener: trio.SocketListener,
    take: Callable[[socket.socket, Any], Any],
    *,
    what: str,
    log: logging.Logger,
    on_error: Callable[[], None] | None = None,
) -> None:
    """As :func:`accept_forever`, for connections that something else drives: each one is handed to
    ``take(sock, address)`` as a plain non-blocking socket (with the options of trio's streams), with
    no trio stream made, and up to ``ACCEPT_BATCH`` are taken per wake-up of the listener (a trio
    ``accept`` is one scheduler round per connection: 8,000 clients connecting at once filled the
    listen backlog, and each connect refused then waited a second for its SYN to be sent again)."""
    tsock = listener.socket
    family, kind, proto = int(tsock.family), int(tsock.type), tsock.proto
    sock = socket.socket(family, kind, proto, fileno=tsock.fileno())  # shares the descriptor
    sock.setblocking(False)
    tcp = family in (socket.AF_INET, socket.AF_INET6)
    trouble = _AcceptTrouble(what, log, on_error)
    make = socket.socket
    try:
        while True:
            await trio.lowlevel.wait_readable(tsock)
            for _ in range(ACCEPT_BATCH):
                try:
                    # _accept: the descriptor, then a socket made with the listener's numbers (accept()
                    # would read them back through enum conversions, once per connection)
                    fd, address = sock._accept()  # type: ignore[attr-defined]
                    conn = make(family, kind, proto, fileno=fd)
                except BlockingIOError:
                    break
                except OSError as exc:
                    if exc.errno in _ACCEPT_SKIP_ERRNOS:
                        continue
                    await trouble.handle(exc)
                    break
                conn.setblocking(False)
                if tcp:
                    _stream_options(conn)
                take(conn, address)
    finally:
        sock.detach()  # the descriptor is the listener's: it closes it


class BusHandler(Protocol):
    def link_up(self, node_id: str, link: int) -> None: ...
    def link_failed(self, node_id: str) -> None: ...
    def link_down(self, link: int) -> None: ...
    def message(self, link: int, msg: Any) -> None: ...
    def link_error(self, kind: str, peer: str, reason: str) -> None: ...
    def unsent(self, node_id: str, tokens: list) -> None: ...


class Reactor(Protocol):
    """An event loop that polls sockets for the bus (the node's client loop).

    It calls ``on_readable``/``on_writable`` when the descriptor is ready
    (both may come in one pass), and ``Bus.hold()`` before and
    ``Bus.release()`` after each pass, so a pass's output leaves at its end.
    """

    def add_fd(self, fd: int, on_readable: Callable[[], None], on_writable: Callable[[], None]) -> None: ...
    def want_writable(self, fd: int, on: bool) -> None: ...
    def remove_fd(self, fd: int) -> None: ...


def _drop_tracebacks(exc: BaseException) -> None:
    """Drop the traceback of ``exc`` and of every exception it chains or groups."""
    seen: set[int] = set()
    todo: list[BaseException | None] = [exc]
    while todo:
        e = todo.pop()
        if e is None or id(e) in seen:
            continue
        seen.add(id(e))
        e.__traceback__ = None
        todo.extend(getattr(e, "exceptions", ()))
        todo.append(e.__cause__)
        todo.append(e.__context__)


def _ip_version(address: str) -> int | None:
    """4 or 6 for an IP address (scope ids allowed), None for anything else (a name)."""
    try:
        return ipaddress.ip_address(address).version
    except ValueError:
        return None


class TcpTransport:
    """Bus links over TCP. ``local_address``: the address outbound links connect from.

    A node bound to one address must also connect from it, as Disque does (its first bind
    address): peers learn a node's address from where its MEET and PINGs come from, and the
    kernel would otherwise pick the source, e.g. 127.0.0.1 for a node bound to 127.0.0.2,
    or the outgoing interface's address on a host with several. Not used for a peer of the
    other IP version, which it cannot reach from there.
    """

    def __init__(self, local_address: str | None = None) -> None:
        self.local_address = self._version = None
        try:
            address = ipaddress.ip_address(local_address) if local_address else None
        except ValueError:  # a name, or "*": the kernel picks
            address = None
        if address is not None and not address.is_unspecified:  # not 0.0.0.0, ::
            self.local_address, self._version = local_address, address.version

    async def open_connection(self, ip: str, port: int) -> trio.abc.Stream:
        local = self.local_address
        if local is not None and _ip_version(ip) != self._version:
            local = None
        stream = await trio.open_tcp_stream(ip, port, local_address=local)
        try:
            stream.setsockopt(trio.socket.IPPROTO_TCP, trio.socket.TCP_NODELAY, True)
        except OSError:
            pass
        return stream

    async def serve(
        self, host: str, port: int, handler, *, on_accept_error=None, task_status=trio.TASK_STATUS_IGNORED
    ) -> None:
        listeners = await trio.open_tcp_listeners(port, host=host)
        async with trio.open_nursery() as nursery:
            for listener in listeners:
                nursery.start_soon(functools.partial(
                    accept_forever, listener, functools.partial(nursery.start_soon, handler),
                    what="cluster bus", log=_log, on_error=on_accept_error,
                ))  # fmt: skip
            task_status.started(listeners)

    @staticmethod
    def peer_ip(stream: Any) -> str:
        try:
            return stream.socket.getpeername()[0]
        except (AttributeError, OSError):
            return "?"


def _tls_read(tls: ssl.SSLSocket) -> bytes:
    """What a readable TLS socket gives now: plaintext (b"" at the end of the stream), or
    ``BlockingIOError`` when OpenSSL needs more bytes. Records OpenSSL has already decrypted
    are taken too; those still in the kernel make the descriptor readable again."""
    data = b""
    try:
        data = tls.recv(READ_SIZE)
        while data and len(data) < READ_SIZE and tls.pending():
            data += tls.recv(READ_SIZE - len(data))
        return data
    except ssl.SSLZeroReturnError:  # the peer's close_notify
        if data:
            return data
        return b""
    except (ssl.SSLWantReadError, ssl.SSLWantWriteError):
        if data:
            return data
    raise BlockingIOError


def tls_failure_reason(exc: BaseException) -> str:
    """A short reason for a failed TLS handshake (OpenSSL's, or what broke)."""
    seen = 0
    while not isinstance(exc, ssl.SSLError) and exc.__cause__ is not None and seen < 8:
        exc, seen = exc.__cause__, seen + 1
    if isinstance(exc, ssl.SSLCertVerificationError) and exc.verify_message:
        return "%s: %s" % (exc.reason, exc.verify_message)
    if isinstance(exc, ssl.SSLError):
        return exc.reason or exc.strerror or str(exc)
    return str(exc) or type(exc).__name__


class _Link:
    __slots__ = (
        "id", "stream", "peer", "out", "lot", "session", "closed", "scope", "outbound", "node_id", "early",
        "batch", "batch_sender", "batch_size", "fd", "decoder", "dirty", "want_out", "heard",
        "written", "watches", "batch_watches", "tls",
    )

    def __init__(self, link_id: int, stream: trio.abc.Stream, peer: str, outbound: bool, node_id: str | None):
        self.id = link_id
        self.stream = stream
        self.peer = peer
        self.out = bytearray()
        self.lot = trio.lowlevel.ParkingLot()
        self.session: LinkSession | None = None
        self.closed = False
        self.scope: trio.CancelScope | None = None
        self.outbound = outbound
        self.node_id = node_id
        self.early: list[bytes] = []  # frames that arrived with the handshake's last one
        self.batch: list[bytes] = []  # encoded application messages not yet framed
        self.batch_sender = ""
        self.batch_size = 0
        self.fd: int | None = None  # registered with the reactor: read and written from its loop
        self.tls: ssl.SSLSocket | None = None  # a reactor link over TLS: read and written through it
        self.decoder: FrameDecoder | None = None
        self.dirty = False  # in Bus._dirty
        self.want_out = False  # the socket was full: the reactor reports when it is writable
        self.heard = outbound  # an inbound link has delivered a message (outbound: we spoke first)
        # Watched messages (``Bus.send_item(watch=...)``): bytes ever taken out of ``out`` (so
        # ``written + len(out)`` is every byte ever queued), and (end offset of its frame, token)
        # for each watched message framed and not yet wholly taken; tokens of the open batch.
        self.written = 0
        self.watches: collections.deque[tuple[int, Any]] = collections.deque()
        self.batch_watches: list[Any] = []


class Bus:
    def __init__(
        self,
        handler: BusHandler,
        *,
        host: str,
        port: int,
        secret: bytes | None = None,
        max_frame: int = MAX_FRAME_DEFAULT,
        transport: Any = None,
        reactor: Reactor | None = None,
        listen: tuple[str, ...] | list[str] = (),
    ) -> None:
        self.handler = handler
        self.host = host  # outbound links connect from it (see TcpTransport)
        self.listen = tuple(listen) or (host,)  # every address accepted on, as Disque's bind
        self.port = port
        self.secret = secret or None
        self.max_frame = max_frame
        self.transport = transport or TcpTransport(local_address=host)
        self.reactor = reactor
        self._dirty: list[_Link] = []  # reactor links with output not written yet
        self._holds = 0  # > 0: inside a reactor pass (or a timer tick), which flushes at its end
        self._flusher_lot = trio.lowlevel.ParkingLot()
        self._flusher_woken = False
        self.links: dict[int, _Link] = {}
        self._unheard: dict[int, _Link] = {}  # inbound links without a first message yet, oldest first
        self._next_link = 0
        self._nursery: trio.Nursery | None = None
        self._reported: dict[tuple[str, str], list] = {}  # (kind, peer) -> [next full report at, held back since]
        self._now = time.monotonic  # the reports' clock (tests move it)
        self.stats = {
            "bytes_sent": 0,
            "bytes_received": 0,
            "frames_sent": 0,
            "frames_received": 0,
            "writes": 0,
            "data_sent": 0,
            "data_received": 0,
            "accept_errors": 0,  # accept() out of descriptors: retried
            "silent_links": 0,  # inbound links closed for sending nothing within HANDSHAKE_TIMEOUT
            "evicted_links": 0,  # silent inbound links closed early: MAX_UNHEARD_LINKS newer ones came
            "oversized": 0,  # application messages too big for any frame: not sent
            "connect_failures": 0,  # outbound connects refused, unreachable or timed out
            "tls_failures": 0,  # TLS handshakes failed (tls.TlsTransport): links closed
        }

    # ------------------------------------------------------------------ run
    async def run(self, *, task_status=trio.TASK_STATUS_IGNORED) -> None:
        """Listen and keep the links' tasks; cancel the scope to stop everything."""
        async with trio.open_nursery() as nursery:
            self._nursery = nursery
            if self.reactor is not None:
                nursery.start_soon(self._flusher)
            serve = functools.partial(self.transport.serve, on_accept_error=self._accept_failed)
            for host in self.listen:
                try:
                    await nursery.start(serve, host, self.port, self._accepted)
                except OSError as exc:
                    exc.bus_host = host  # type: ignore[attr-defined]  # which one, for the message
                    raise
            task_status.started()

    def _accept_failed(self) -> None:
        self.stats["accept_errors"] += 1

    # ------------------------------------------------------------ output
    def hold(self) -> None:
        """Keep reactor links' output until the matching :meth:`release` (see the module docstring)."""
        self._holds += 1

    def release(self) -> None:
        self._holds -= 1
        if not self._holds and self._dirty:
            self.flush()

    def _mark(self, link: _Link) -> None:
        """``link`` has output to send."""
        if link.fd is None:
            link.lot.unpark_all()  # its writer task sends it
        elif not link.dirty:
            link.dirty = True
            self._dirty.append(link)
            if not self._holds and not self._flusher_woken:
                self._flusher_woken = True
                self._flusher_lot.unpark_all()

    async def _flusher(self) -> None:
        while True:
            await self._flusher_lot.park()
            self._flusher_woken = False
            self.flush()

    def flush(self) -> None:
        """Write what every reactor link has queued (a link waiting for writability keeps it)."""
        dirty, self._dirty = self._dirty, []
        for link in dirty:
            link.dirty = False
            if not link.closed and not link.want_out:
                self._write(link)

    def _write(self, link: _Link) -> None:
        if link.batch:
            self._close_batch(link)
        out = link.out
        if not out:
            return
        try:
            if link.tls is None:
                sent = os.write(link.fd, out)  # type: ignore[arg-type]
            else:  # retried with the same bytes first (``out`` only grows at its end), as OpenSSL asks
                sent = link.tls.send(out)
        except (BlockingIOError, ssl.SSLWantWriteError, ssl.SSLWantReadError):
            sent = 0
        except OSError:  # ssl.SSLError included
            self._drop(link)
            return
        stats = self.stats
        stats["bytes_sent"] += sent
        stats["writes"] += 1
        link.written += sent
        if link.watches:
            self._settle(link)
        if sent == len(out):
            out.clear()
            if link.want_out:
                link.want_out = False
                self.reactor.want_writable(link.fd, False)  # type: ignore[union-attr,arg-type]
        else:
            del out[:sent]
            if not link.want_out:
                link.want_out = True
                self.reactor.want_writable(link.fd, True)  # type: ignore[union-attr,arg-type]

    # ------------------------------------------------------------- actions
    def connect(self, node_id: str, ip: str, bus_port: int) -> None:
        assert self._nursery is not None, "Bus.run() not started"
        self._nursery.start_soon(self._connect, node_id, ip, bus_port)

    def send(self, link_id: int, msg: Any) -> bool:
        link = self.links.get(link_id)
        if link is None or link.closed:
            return False
        body = encode_message(msg)
        if link.batch:
            self._close_batch(link)
        data = link.session.seal(body) if link.session is not None else frame(body)
        link.out += data
        self.stats["frames_sent"] += 1
        self._mark(link)
        return True

    def send_data(self, link_id: int, sender: str, kind: str, body: Any) -> bool:
        """Queue an application message; it leaves with the link's next batch.

        The message is checked and encoded now (a bad ``body`` raises here);
        returns False when there is no such open link.
        """
        return self.send_item(link_id, sender, encode_data_item(kind, body))

    def send_item(self, link_id: int, sender: str, item: bytes, watch: Any = None) -> bool:
        """Like :meth:`send_data` with a message already made by ``encode_data_item``:
        one message for several peers is checked and encoded once.

        ``watch``: if the link ends before the frame holding this message was wholly handed to
        the socket, ``handler.unsent(node_id, [watch, ...])`` gets it back after ``link_down``
        (the message certainly never arrived; once the socket took any of it, it may have)."""
        link = self.links.get(link_id)
        if link is None or link.closed:
            if watch is not None and link is not None:
                link.batch_watches.append(watch)  # never sent: handed back as the link ends
            return False
        if len(item) > MAX_BODY - DATA_BATCH_OVERHEAD:  # can never be framed: refuse, never raise
            self.stats["oversized"] += 1
            return False
        batch = link.batch
        if batch and (
            link.batch_sender != sender
            or len(batch) >= MAX_BATCH
            or link.batch_size + len(item) > MAX_BODY - DATA_BATCH_OVERHEAD
        ):
            self._close_batch(link)
        if not batch:
            link.batch_sender = sender
            self._mark(link)
        batch.append(item)
        link.batch_size += len(item)
        if watch is not None:
            link.batch_watches.append(watch)
        self.stats["data_sent"] += 1
        return True

    def _close_batch(self, link: _Link) -> None:
        body = data_batch_body(link.batch_sender, link.batch)
        link.batch.clear()
        link.batch_size = 0
        data = link.session.seal(body) if link.session is not None else frame(body)
        link.out += data
        if link.batch_watches:
            end = link.written + len(link.out)
            link.watches.extend((end, w) for w in link.batch_watches)
            link.batch_watches.clear()
        self.stats["frames_sent"] += 1

    @staticmethod
    def _settle(link: _Link) -> None:
        """Forget the watched messages whose frame the socket has wholly taken."""
        watches, written = link.watches, link.written
        while watches and watches[0][0] <= written:
            watches.popleft()

    def pending_out(self, link_id: int) -> int:
        """Bytes queued on an open link that its socket has not taken yet (0: none, or no such link)."""
        link = self.links.get(link_id)
        if link is None or link.closed:
            return 0
        return len(link.out) + link.batch_size

    def close(self, link_id: int) -> None:
        link = self.links.get(link_id)
        if link is not None and link.scope is not None:
            link.scope.cancel()

    def peer_ip(self, link_id: int) -> str | None:
        link = self.links.get(link_id)
        return link.peer if link else None

    # ----------------------------------------------------------- internals
    def _new_link(self, stream: trio.abc.Stream, outbound: bool, node_id: str | None) -> _Link:
        self._next_link += 1
        link = _Link(self._next_link, stream, self.transport.peer_ip(stream), outbound, node_id)
        self.links[link.id] = link
        return link

    def _report_bad(self, link: _Link, exc: BusProtocolError) -> None:
        """A malformed frame: kind "frame" with the reason, or "foreign" with the protocol when the
        link's first bytes were a client's (RESP, HTTP, TLS: someone used the bus port as a client
        port, which the handler's log can say with the port to use instead)."""
        if exc.foreign:
            self._report("foreign", link, exc.foreign)
        else:
            self._report("frame", link, str(exc))

    def _report(self, kind: str, link: _Link, reason: str) -> None:
        """Tell the handler; with the reason (to log) only if this address and kind had none
        reported for REPORT_EVERY seconds, else with an empty one (to count)."""
        key = (kind, link.peer)
        now = self._now()
        entry = self._reported.get(key)
        if entry is not None and now < entry[0]:
            entry[1] += 1
            self.handler.link_error(kind, link.peer, "")
            return
        if entry is None and len(self._reported) >= MAX_REPORTED:  # many addresses: forget, report in full again
            self._reported.clear()
        if entry is not None and entry[1]:
            reason = "%s; %d more from this address in the %.0f s after the last report" % (reason, entry[1], REPORT_EVERY)
        self._reported[key] = [now + REPORT_EVERY, 0]
        self.handler.link_error(kind, link.peer, reason)

    async def _connect(self, node_id: str, ip: str, bus_port: int) -> None:
        try:
            with trio.fail_after(CONNECT_TIMEOUT):
                stream = await self.transport.open_connection(ip, bus_port)
        except (OSError, trio.TooSlowError, trio.BrokenResourceError) as exc:
            # Nobody reads these tracebacks, and one of a refused connect is a reference cycle
            # (trio keeps the error in a closure its own frame belongs to): ~28 objects per
            # attempt that only a full collection would free, a dead peer retried for ever.
            _drop_tracebacks(exc)
            self.stats["connect_failures"] += 1
            self.handler.link_failed(node_id)
            return
        link = self._new_link(stream, True, node_id)
        await self._run_link(link)

    async def _accepted(self, stream: trio.abc.Stream) -> None:
        link = self._new_link(stream, False, None)
        unheard = self._unheard
        unheard[link.id] = link
        if len(unheard) > MAX_UNHEARD_LINKS:
            oldest = unheard.pop(next(iter(unheard)))
            self.stats["evicted_links"] += 1
            self._report("frame", oldest, "closed unheard: %d newer links had not spoken either" % MAX_UNHEARD_LINKS)
            if oldest.scope is not None:
                oldest.scope.cancel()
        await self._run_link(link)

    async def _run_link(self, link: _Link) -> None:
        decoder = link.decoder = FrameDecoder(self.max_frame)
        announced = False
        try:
            with trio.CancelScope() as scope:
                link.scope = scope
                if hasattr(link.stream, "do_handshake") and not await self._tls_handshake(link):
                    return
                if self.secret is not None:
                    ok = await self._authenticate(link, decoder)
                    if not ok:
                        return
                if not link.heard:  # a peer speaks at once; a silent connection only holds a descriptor
                    scope.deadline = trio.current_time() + HANDSHAKE_TIMEOUT
                if link.outbound:
                    announced = True
                    self.handler.link_up(link.node_id, link.id)
                if self.reactor is not None and (
                    isinstance(link.stream, trio.SocketStream) or getattr(link.stream, "tls", None) is not None
                ):
                    await self._run_in_reactor(link)
                else:
                    async with trio.open_nursery() as nursery:
                        nursery.start_soon(self._writer, link)
                        await self._reader(link)
                        nursery.cancel_scope.cancel()
        except* _GONE:
            pass  # the peer went away: link_down below says so
        finally:
            if not link.heard and not link.closed and link.scope is not None and link.scope.cancelled_caught:
                if trio.current_time() >= link.scope.deadline:  # not close(): the first-message deadline
                    self.stats["silent_links"] += 1
                    self._report("frame", link, "no message within %g s of connecting" % HANDSHAKE_TIMEOUT)
            link.closed = True
            self._unheard.pop(link.id, None)
            self._unregister(link)  # before the socket is closed
            with trio.CancelScope(shield=True):
                await trio.aclose_forcefully(link.stream)
            self.links.pop(link.id, None)  # until now, watched messages sent to it come back below
            if link.outbound and not announced:
                self.handler.link_failed(link.node_id)
            else:
                self.handler.link_down(link.id)
            unsent = [w for _, w in link.watches] + link.batch_watches
            if unsent and link.node_id is not None:
                link.watches.clear()
                link.batch_watches.clear()
                self.handler.unsent(link.node_id, unsent)

    # ------------------------------------------------------- reactor links
    async def _run_in_reactor(self, link: _Link) -> None:
        """Hand the link's socket to the reactor; wait here until the link ends."""
        link.tls = getattr(link.stream, "tls", None)  # cluster_bus.tls.TlsStream: a non-blocking ssl.SSLSocket
        link.fd = link.stream.socket.fileno()  # type: ignore[attr-defined]
        self.reactor.add_fd(link.fd, lambda: self._on_readable(link), lambda: self._on_writable(link))  # type: ignore[union-attr]
        if not self._take(link, None):
            return
        if link.out or link.batch:
            self._mark(link)  # queued before the link was registered
        await trio.sleep_forever()  # until close() or _drop() cancels the link's scope

    def _unregister(self, link: _Link) -> None:
        if link.fd is not None:
            self.reactor.remove_fd(link.fd)  # type: ignore[union-attr]
            link.fd = None

    def _drop(self, link: _Link) -> None:
        """End a reactor link now (EOF, an error, garbage): its task cleans up and reports it down."""
        link.closed = True
        self._unregister(link)
        if link.scope is not None:
            link.scope.cancel()

    def _on_readable(self, link: _Link) -> None:
        if link.closed:
            return
        try:
            if link.tls is None:
                data = os.read(link.fd, READ_SIZE)  # type: ignore[arg-type]
            else:
                data = _tls_read(link.tls)
        except BlockingIOError:
            return
        except OSError:  # ssl.SSLError included
            self._drop(link)
            return
        if not data:
            self._drop(link)
            return
        self.stats["bytes_received"] += len(data)
        if not self._take(link, data):
            self._drop(link)

    def _on_writable(self, link: _Link) -> None:
        if not link.closed:
            self._write(link)

    async def _tls_handshake(self, link: _Link) -> bool:
        """The TLS handshake of a link over ``tls.TlsTransport``; a failure (no certificate, one
        of another CA, a plain peer, garbage, silence) is counted and reported as ``"tls"``."""
        try:
            with trio.fail_after(HANDSHAKE_TIMEOUT):
                await link.stream.do_handshake()  # type: ignore[attr-defined]
        except trio.TooSlowError:
            reason = "no TLS handshake within %g s" % HANDSHAKE_TIMEOUT
        except (trio.BrokenResourceError, trio.ClosedResourceError, OSError) as exc:
            reason = tls_failure_reason(exc)
            _drop_tracebacks(exc)
        else:
            return True
        self.stats["tls_failures"] += 1
        self._report("tls", link, reason)
        return False

    async def _authenticate(self, link: _Link, decoder: FrameDecoder) -> bool:
        nonce = os.urandom(16)
        try:
            with trio.fail_after(HANDSHAKE_TIMEOUT):
                if link.outbound:
                    hs = InitiatorHandshake(self.secret, nonce)
                    await link.stream.send_all(hs.start())
                    payload = await self._next_payload(link, decoder)
                    await link.stream.send_all(hs.receive(payload))
                    link.session = hs.session
                else:
                    rs = ResponderHandshake(self.secret, nonce)
                    payload = await self._next_payload(link, decoder)
                    reply = rs.receive(payload)
                    if reply:
                        await link.stream.send_all(reply)
                    payload = await self._next_payload(link, decoder)
                    rs.receive(payload)
                    link.session = rs.session
        except AuthError as exc:
            self._report("auth", link, str(exc))
            return False
        except BusProtocolError as exc:
            self._report_bad(link, exc)
            return False
        except trio.TooSlowError:
            self._report("auth", link, "handshake timed out")
            return False
        return True

    async def _next_payload(self, link: _Link, decoder: FrameDecoder) -> bytes:
        if link.early:
            return link.early.pop(0)
        while True:
            data = await link.stream.receive_some(READ_SIZE)
            if not data:
                raise trio.BrokenResourceError("peer closed during handshake")
            payloads = decoder.feed(data)
            if payloads:
                link.early.extend(payloads[1:])
                return payloads[0]

    async def _reader(self, link: _Link) -> None:
        stats = self.stats
        try:
            if not self._take(link, None):
                return
            while True:
                data = await link.stream.receive_some(READ_SIZE)
                if not data:
                    return
                stats["bytes_received"] += len(data)
                if not self._take(link, data):
                    return
        except _GONE:
            pass

    def _take(self, link: _Link, data: bytes | None) -> bool:
        """Deliver, in order, the frames ``data`` completes (None: those that came in with the
        handshake), reactor output held until the end. False when the link must end: it was
        closed meanwhile, or sent garbage or a bad MAC (reported)."""
        self._holds += 1
        try:
            if data is None:
                payloads, link.early = link.early, []
            else:
                payloads = link.decoder.feed(data)  # type: ignore[union-attr]
            for payload in payloads:
                if link.closed:
                    return False
                self._deliver(link, payload)
            return True
        except AuthError as exc:
            self._report("auth", link, str(exc))
        except BusProtocolError as exc:
            self._report_bad(link, exc)
        finally:
            self.release()
        return False

    def _deliver(self, link: _Link, payload: bytes) -> None:
        body = link.session.open(payload) if link.session is not None else payload
        msg = decode_message(body)
        if type(msg) in _AUTH_TYPES:  # only valid inside the handshake
            raise AuthError("authentication message outside the handshake")
        if not link.heard:
            link.heard = True
            self._unheard.pop(link.id, None)
            if link.scope is not None:
                link.scope.deadline = math.inf
        self.stats["frames_received"] += 1
        if type(msg) is DataBatch:
            self.stats["data_received"] += len(msg.items)
        elif type(msg) is Data:
            self.stats["data_received"] += 1
        try:
            self.handler.message(link.id, msg)
        except Exception as exc:  # a bug must cost one link, not the node
            raise BusProtocolError("internal error handling %s: %r" % (type(msg).__name__, exc)) from exc

    async def _writer(self, link: _Link) -> None:
        out = link.out
        try:
            while True:
                while not out and not link.batch:
                    await link.lot.park()
                if link.batch:
                    self._close_batch(link)
                data = bytes(out)
                out.clear()
                self.stats["bytes_sent"] += len(data)
                self.stats["writes"] += 1
                # counted as taken before the send: cancelled midway, part of it may arrive
                link.written += len(data)
                if link.watches:
                    self._settle(link)
                await link.stream.send_all(data)
        except _GONE:
            link.closed = True
            if link.scope is not None:
                link.scope.cancel()
