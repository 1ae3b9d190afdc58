"""Client connections: bytes in -> commands -> replies out.

One trio task reads each connection; it parses everything that arrived,
runs the commands synchronously against the core, encodes all the replies
into the connection's output buffer and sends them with one ``send_all``.
A second small task per connection (the writer) only sends replies that
other connections produced for this one (a blocked GETJOB served by an
ADDJOB elsewhere). Both go through ``flush``, which never lets two sends
overlap on a stream and coalesces whatever accumulated meanwhile.

A client blocked in GETJOB keeps reading: further pipelined commands are
queued in ``pending`` and run, in order, as soon as it is unblocked, which
is what Redis clients expect.
"""

from __future__ import annotations

from collections import deque

import trio

from ..protocol.resp import encode_reply

__all__ = ["Connection"]


class Connection:
    __slots__ = (
        "id",
        "stream",
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
    )

    def __init__(self, cid: int, stream: trio.SocketStream, addr: str, laddr: str, now: float, parser) -> None:
        self.id = cid
        self.stream = stream
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

    async def flush(self) -> None:
        """Send the output buffer; safe to call from the reader and the writer."""
        if self.sending:
            return  # the task already sending will pick up what we added
        self.sending = True
        try:
            out = self.out
            while out:
                data = bytes(out)
                out.clear()
                await self.stream.send_all(data)
        finally:
            self.sending = False

    def wake_writer(self) -> None:
        self.lot.unpark_all()

    async def writer(self) -> None:
        while True:
            await self.lot.park()
            await self.flush()
