"""A small RESP2 connection on trio streams, parsed with ``hiredis.Reader``.

Commands are packed with ``hiredis.pack_command`` and sent whole; replies
are read until the reader yields one. A connection serves one request (or
one pipelined batch) at a time; the trio client keeps a small pool.

A connection whose request did not complete normally (cancelled, timed
out, I/O error) is *broken*: the byte stream is out of step with the
requests, so it is closed and never reused. An error reply is a normal
completion: it becomes a typed :class:`~.errors.ServerError` and the
connection stays usable.
"""

from __future__ import annotations

import ssl
from collections.abc import Sequence
from typing import Any

import hiredis
import trio

from .errors import ConnectionLost, ReplyTimeout, error_from_reply

__all__ = ["RespConnection"]

_READ_SIZE = 65536


def _pack(argv: Sequence[Any]) -> bytes:
    return hiredis.pack_command(tuple(argv))


class RespConnection:
    """One TCP connection to one node."""

    def __init__(self, stream: "trio.SocketStream | trio.SSLStream", address: tuple[str, int]) -> None:
        self.address = address
        self._stream = stream
        self._reader = hiredis.Reader()
        self.broken = False
        self.generation = 0  # set by the client: which node choice it belongs to

    @classmethod
    async def open(
        cls, address: tuple[str, int], *, connect_timeout: float, password: str | None = None,
        timeout: float | None = None, ssl_context: "ssl.SSLContext | None" = None,
    ) -> "RespConnection":  # fmt: skip
        """Connect (with ``ssl_context``: and the TLS handshake, within ``connect_timeout`` too;
        and AUTH). Raises ConnectionLost, or AuthError for a bad password."""
        try:
            with trio.fail_after(connect_timeout):
                tcp = await trio.open_tcp_stream(*address)
        except (OSError, trio.TooSlowError) as exc:
            raise ConnectionLost("cannot connect to %s:%d: %s" % (address + (exc or "timeout",)), address) from None
        try:
            tcp.setsockopt(trio.socket.IPPROTO_TCP, trio.socket.TCP_NODELAY, 1)
        except OSError:  # pragma: no cover - not every platform
            pass
        stream: "trio.SocketStream | trio.SSLStream" = tcp
        if ssl_context is not None:
            stream = trio.SSLStream(tcp, ssl_context, server_hostname=address[0], https_compatible=True)
            try:
                with trio.fail_after(connect_timeout):
                    await stream.do_handshake()
            except (OSError, trio.TooSlowError, trio.BrokenResourceError) as exc:
                tcp.socket.close()
                reason = exc.__cause__ if isinstance(exc, trio.BrokenResourceError) and exc.__cause__ else exc
                raise ConnectionLost("TLS handshake with %s:%d failed: %s" % (address + (reason or "timeout",)),
                                     address) from None  # fmt: skip
        conn = cls(stream, address)
        if password is not None:
            try:
                await conn.request((b"AUTH", password), timeout)
            except BaseException:
                conn.close()
                raise
        return conn

    def close(self) -> None:
        """Close now (synchronously: usable from ``finally`` blocks and cancelled code)."""
        self.broken = True
        try:
            stream = self._stream
            (stream.transport_stream if isinstance(stream, trio.SSLStream) else stream).socket.close()
        except OSError:  # pragma: no cover
            pass

    async def _read_reply(self, timeout: float | None) -> Any:
        """The next reply; ``timeout`` bounds each wait for data (not the parsing)."""
        reader = self._reader
        reply = reader.gets()
        while reply is False:
            try:
                if timeout is None:
                    data = await self._stream.receive_some(_READ_SIZE)
                else:
                    with trio.fail_after(timeout):
                        data = await self._stream.receive_some(_READ_SIZE)
            except (OSError, trio.BrokenResourceError, trio.ClosedResourceError) as exc:
                raise ConnectionLost("connection to %s:%d lost: %s" % (self.address + (exc,)), self.address) from None
            if not data:
                raise ConnectionLost("connection to %s:%d closed by the node" % self.address, self.address)
            try:
                reader.feed(data)
                reply = reader.gets()
            except hiredis.ProtocolError as exc:
                raise ConnectionLost("protocol error from %s:%d: %s" % (self.address + (exc,)), self.address) from None
        return reply

    async def _send(self, data: bytes, timeout: float | None) -> None:
        try:
            if timeout is None:
                await self._stream.send_all(data)
            else:
                with trio.fail_after(timeout):
                    await self._stream.send_all(data)
        except (OSError, trio.BrokenResourceError, trio.ClosedResourceError) as exc:
            raise ConnectionLost("connection to %s:%d lost: %s" % (self.address + (exc,)), self.address) from None

    async def request(self, argv: Sequence[Any], timeout: float | None) -> Any:
        """Send one command, return its reply; error replies raise typed errors."""
        if self.broken:
            raise ConnectionLost("connection to %s:%d is closed" % self.address, self.address)
        done = False
        try:
            await self._send(_pack(argv), timeout)
            reply = await self._read_reply(timeout)
            done = True
        except trio.TooSlowError:
            raise ReplyTimeout("no reply from %s:%d in %.1f s" % (self.address + (timeout,)), self.address) from None
        finally:
            if not done:
                self.close()
        if isinstance(reply, hiredis.ReplyError):
            raise error_from_reply(str(reply))
        return reply

    async def request_many(self, argvs: Sequence[Sequence[Any]], timeout: float | None) -> list[Any]:
        """Pipelined: replies in order, error replies as exception values.

        A lost connection raises :class:`ConnectionLost` with ``partial``,
        the replies received before it broke.
        """
        if self.broken:
            raise ConnectionLost("connection to %s:%d is closed" % self.address, self.address)
        out: list[Any] = []
        done = False
        try:
            try:
                await self._send(b"".join([_pack(a) for a in argvs]), timeout)
                for _ in argvs:
                    reply = await self._read_reply(timeout)
                    out.append(error_from_reply(str(reply)) if isinstance(reply, hiredis.ReplyError) else reply)
                done = True
            except trio.TooSlowError:
                message = "no reply from %s:%d in %.1f s" % (self.address + (timeout,))
                raise ReplyTimeout(message, self.address) from None
        except ConnectionLost as exc:
            exc.partial = out  # type: ignore[attr-defined]
            raise
        finally:
            if not done:
                self.close()
        return out
