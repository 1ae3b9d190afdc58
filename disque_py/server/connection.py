"""One client connection's state: plain data shared by the shell's parts.

:class:`Connection` is made by the acceptor (:mod:`.clients`), read and
written by the client loop (socket, buffers, flags), the dispatcher
(:mod:`.dispatch`: replies, blocking, pending commands) and the
connection commands (:mod:`.admin`: AUTH, CLIENT, HELLO, ACL). It has no
behaviour of its own, so it sits at the bottom of the import graph.
"""

from __future__ import annotations

import socket
from collections import deque

from ..protocol.resp import encode_reply

__all__ = ["Connection", "OUT_HOLD", "PERMS_UNSET"]

#: A client's commands wait, and it is not read, while this much of its output is unsent. Below
#: it the node goes on reading and running a client's commands while the client does not read
#: its replies, as Redis and Disque do: a client library writes a whole pipeline before it
#: reads a reply (redis-py's pipeline of 200,000 ADDJOBs answers 10 MB). Past it the node waits
#: for the client to read, so a client that never reads costs at most this much.
OUT_HOLD = 64 << 20

#: ``Connection.perms`` until the dispatcher (or AUTH, HELLO) has decided it: the acceptor lets
#: a connection in without AUTH when there is no requirepass, and the default user's own rules
#: (server/acl.py) are applied at its first command.
PERMS_UNSET = object()


class Connection:
    __slots__ = (
        "id",
        "sock",
        "fd",
        "addr",
        "laddr",
        "name",
        "lib_name",
        "lib_ver",
        "created",
        "last_active",
        "authenticated",
        "user",
        "perms",
        "auth_failures",
        "out",
        "blocked",
        "pending",
        "closing",
        "closed",
        "waiting_write",
        "read_paused",
        "armed",
        "last_cmd",
        "parser",
        "encode",
        "soft_since",
    )

    def __init__(self, cid: int, sock: socket.socket, addr: str, laddr: str, now: float, parser) -> None:
        self.id = cid
        self.sock = sock
        self.fd = sock.fileno()
        self.addr = addr
        self.laddr = laddr
        self.name = b""
        self.lib_name = b""
        self.lib_ver = b""
        self.created = now
        self.last_active = now
        self.authenticated = False
        self.user = b"default"  # the user it is authenticated as (server/acl.py)
        self.perms = PERMS_UNSET  # None: may run everything; else the acl.User its commands are checked against
        self.auth_failures = 0  # failed AUTHs in a row (closed at acl.AUTH_FAILURE_LIMIT)
        self.out = bytearray()
        self.blocked = False
        self.pending: deque[list[bytes]] = deque()
        self.closing = False  # close once ``out`` is sent
        self.closed = False
        self.waiting_write = False  # registered for EPOLLOUT (and still read while under OUT_HOLD)
        self.armed = 0  # the epoll events it is registered for (clients.py: _arm)
        self.read_paused = False  # commands pending (blocked, or held back by output): not read until they run
        self.last_cmd = b"NULL"
        self.parser = parser
        self.encode = encode_reply  # encode_reply3 after HELLO 3
        self.soft_since = 0.0  # when its unsent output first reached the soft limit (0: below it)
