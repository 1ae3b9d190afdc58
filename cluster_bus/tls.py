"""Bus links over mutual TLS (``tls-cluster yes``): :class:`TlsTransport` and its stream.

The contexts come ready-made (the node builds them from its configuration): ``server`` for
accepted links, which must ask for and verify the peer's certificate, ``client`` for the
links a node opens, presenting its certificate and verifying the peer's. Host names are not
checked by the bus; that is the client context's business.

Each link is a :class:`TlsStream`: a non-blocking ``ssl.SSLSocket`` on the TCP socket,
with the ``trio.abc.Stream`` methods the bus needs before the link reaches the reactor (the
TLS handshake, which :meth:`.links.Bus._run_link` runs within ``HANDSHAKE_TIMEOUT`` and
reports when it fails, and the cluster secret's handshake, which still runs inside TLS).
Then the bus hands the socket to the reactor as it does a plain one, and reads and writes
plaintext through the ``tls`` attribute (OpenSSL's "want read/write" taken as a socket's
``EAGAIN``): no task switch and no pure-Python TLS layer per message. Without a reactor,
the link's reader and writer tasks use the stream methods.

Why not ``trio.SSLStream``: it works (it was built first), but it keeps every link on two
tasks and runs TLS records through Python. ADDJOB REPLICATE 3 on three local nodes
(redis-benchmark, 10 clients) did 55-65% of the plain links' rate with it, 85% with this.
"""

from __future__ import annotations

import socket
import ssl
from typing import Any

import trio

from .links import TcpTransport

__all__ = ["TlsStream", "TlsTransport"]

_WANT = (ssl.SSLWantReadError, ssl.SSLWantWriteError)


class TlsStream(trio.abc.Stream):
    """A TLS connection over a non-blocking socket, as a trio stream (see the module docstring).

    ``tls``: the ``ssl.SSLSocket``; ``socket``: the same (``fileno()``, ``getpeername()``)."""

    def __init__(self, tls: ssl.SSLSocket) -> None:
        self.tls = self.socket = tls

    @classmethod
    def wrap(cls, stream: trio.SocketStream, ctx: ssl.SSLContext, *, server_side: bool) -> "TlsStream":
        try:
            stream.setsockopt(trio.socket.IPPROTO_TCP, trio.socket.TCP_NODELAY, True)
        except OSError:
            pass
        raw = socket.socket(fileno=stream.socket.detach())  # trio's wrapper gives the descriptor up
        raw.setblocking(False)
        try:
            tls = ctx.wrap_socket(raw, server_side=server_side, do_handshake_on_connect=False)
        except BaseException:
            raw.close()
            raise
        return cls(tls)

    async def _wait(self, want: BaseException) -> None:
        if isinstance(want, ssl.SSLWantWriteError):
            await trio.lowlevel.wait_writable(self.tls)
        else:
            await trio.lowlevel.wait_readable(self.tls)

    async def do_handshake(self) -> None:
        while True:
            try:
                self.tls.do_handshake()
                return
            except _WANT as want:
                await self._wait(want)
            except OSError as exc:  # ssl.SSLError included: the reason is kept as the cause
                raise trio.BrokenResourceError("TLS handshake failed") from exc

    async def send_all(self, data: bytes | bytearray | memoryview) -> None:
        view = memoryview(data)
        sent = 0
        while sent < len(view):
            try:
                sent += self.tls.send(view[sent:])
            except _WANT as want:
                await self._wait(want)
            except OSError as exc:
                raise trio.BrokenResourceError(str(exc)) from exc
        await trio.lowlevel.checkpoint()

    async def wait_send_all_might_not_block(self) -> None:
        await trio.lowlevel.wait_writable(self.tls)

    async def receive_some(self, max_bytes: int | None = None) -> bytes:
        size = max_bytes or 65536
        while True:
            try:
                data = self.tls.recv(size)
                await trio.lowlevel.checkpoint()
                return data
            except ssl.SSLZeroReturnError:
                return b""
            except _WANT as want:
                await self._wait(want)
            except OSError as exc:
                raise trio.BrokenResourceError(str(exc)) from exc

    async def aclose(self) -> None:
        trio.lowlevel.notify_closing(self.tls)
        self.tls.close()
        await trio.lowlevel.checkpoint()

    def setsockopt(self, *args: Any) -> None:
        self.tls.setsockopt(*args)


class TlsTransport(TcpTransport):
    """Bus links over mutual TLS: TCP as :class:`.links.TcpTransport`, each link a :class:`TlsStream`
    whose handshake the bus runs."""

    def __init__(self, server: ssl.SSLContext, client: ssl.SSLContext, local_address: str | None = None) -> None:
        super().__init__(local_address)
        self.server_context = server
        self.client_context = client

    async def open_connection(self, ip: str, port: int) -> trio.abc.Stream:
        stream = await super().open_connection(ip, port)
        return TlsStream.wrap(stream, self.client_context, server_side=False)

    async def serve(
        self, host: str, port: int, handler, *, on_accept_error=None, task_status=trio.TASK_STATUS_IGNORED
    ) -> None:
        ctx = self.server_context

        async def wrapped(stream: trio.SocketStream) -> None:
            try:
                tls = TlsStream.wrap(stream, ctx, server_side=True)
            except (OSError, ValueError):
                await trio.aclose_forcefully(stream)
                return
            await handler(tls)

        await super().serve(host, port, wrapped, on_accept_error=on_accept_error, task_status=task_status)

    @staticmethod
    def peer_ip(stream: Any) -> str:
        try:
            return stream.tls.getpeername()[0]
        except (AttributeError, OSError):
            return "?"
