"""Client connections: bytes in -> commands -> replies out.

One trio task reads each connection; it parses everything that arrived,
runs the commands synchronously against the core, encodes all the replies
into the connection's output buffer and sends them with one ``send_all``.
A second small task per connection (the writer) only sends replies that
other connections produced for this one (a blocked GETJOB served by an
ADDJOB elsewhere). Both go through ``flush``, which never lets two sends
overlap on a stream and coalesces whatever accumulated meanwhile.

Sockets are plain non-blocking stdlib sockets driven with trio's
``wait_readable``/``wait_writable``: a request that can be answered at once
costs one scheduler round (the wait for input) instead of the three that
trio's SocketStream checkpoints add, which profiles showed mattered for
unpipelined clients. A reader that never had to wait yields once per batch
so a pipelining client cannot starve the others.

A client blocked in GETJOB keeps reading: further pipelined commands are
queued in ``pending`` and run, in order, as soon as it is unblocked, which
is what Redis clients expect.
"""

from __future__ import annotations

import socket
from collections import deque

import trio

from ..protocol.resp import encode_reply

__all__ = ["Connection"]


class Connection:
    __slots__ = (
        "id",
        "sock",
        "addr",
        "laddr",
        "name",
        "lib_name",
        "lib_ver",
        "created",
        "last_active",
        "authenticated",
        "out",
        "sending",
        "lot",
        "blocked",
        "pending",
        "closing",
        "last_cmd",
        "parser",
        "scope",
        "encode",
        "full_read",
    )

    def __init__(self, cid: int, sock: socket.socket, addr: str, laddr: str, now: float, parser) -> None:
        self.id = cid
        self.sock = sock
        self.addr = addr
        self.laddr = laddr
        self.name = b""
        self.lib_name = b""
        self.lib_ver = b""
        self.created = now
        self.last_active = now
        self.authenticated = False
        self.out = bytearray()
        self.sending = False
        self.lot = trio.lowlevel.ParkingLot()
        self.blocked = False
        self.pending: deque[list[bytes]] = deque()
        self.closing = False
        self.last_cmd = b"NULL"
        self.parser = parser
        self.scope: trio.CancelScope | None = None
        self.encode = encode_reply  # encode_reply3 after HELLO 3
        self.full_read = False

    async def flush(self) -> None:
        """Send the output buffer; safe to call from the reader and the writer."""
        if self.sending:
            return  # the task already sending will pick up what we added
        self.sending = True
        try:
            out = self.out
            sock = self.sock
            while out:
                try:
                    sent = sock.send(out)
                except BlockingIOError:
                    await trio.lowlevel.wait_writable(sock)
                    continue
                if sent == len(out):
                    out.clear()
                else:
                    del out[:sent]
        finally:
            self.sending = False

    async def receive(self, size: int) -> bytes:
        """Next chunk from the client (b"" at EOF); waits only when needed.

        A read is tried before waiting only when the previous one filled the
        buffer (more input is likely queued): otherwise the attempt would
        mostly fail with EAGAIN, a wasted syscall per request.
        """
        sock = self.sock
        if self.full_read:
            try:
                data = sock.recv(size)
            except BlockingIOError:
                pass
            else:
                self.full_read = len(data) == size
                await trio.lowlevel.checkpoint()  # fairness: we did not wait
                return data
        while True:
            await trio.lowlevel.wait_readable(sock)
            try:
                data = sock.recv(size)
            except BlockingIOError:
                continue
            self.full_read = len(data) == size
            return data

    def close(self) -> None:
        try:
            trio.lowlevel.notify_closing(self.sock)
        except (OSError, ValueError):
            pass
        self.sock.close()

    def wake_writer(self) -> None:
        self.lot.unpark_all()

    def send_soon(self) -> None:
        """Send what is buffered now if the socket takes it all; else leave it to the writer task.

        Used for replies produced outside this client's own read loop (a
        blocked GETJOB served, a replicated ADDJOB confirmed): one send
        system call instead of waking the writer task for it.
        """
        if self.sending or not self.out:
            return
        out = self.out
        try:
            sent = self.sock.send(out)
        except BlockingIOError:
            sent = 0
        except OSError:
            self.lot.unpark_all()  # the writer meets the error and ends the connection
            return
        if sent == len(out):
            out.clear()
        else:
            del out[:sent]
            self.lot.unpark_all()

    async def writer(self) -> None:
        try:
            while True:
                await self.lot.park()
                await self.flush()
        except OSError:
            # The peer went away while we were sending: end the connection
            # (its reader is cancelled with the scope) without raising.
            self.closing = True
            if self.scope is not None:
                self.scope.cancel()
