"""One client connection's state: plain data shared by the shell's parts.

:class:`Connection` is made by the acceptor (:mod:`.clients`), read and
written by the client loop (socket, buffers, flags), the dispatcher
(:mod:`.dispatch`: replies, blocking, pending commands) and the
connection commands (:mod:`.admin`: AUTH, CLIENT, HELLO, ACL). It has no
behaviour of its own, so it sits at the bottom of the import graph.

It is compiled in the compiled build (``_build.COMPILED_MODULES``): a final
native class with typed fields, which the compiled pass (:mod:`.stage`) reads
and writes directly. Like every native class it refuses attributes it does not
declare (``__slots__`` says the same in pure Python).
"""

from __future__ import annotations

from collections import deque
from typing import Callable, Final, Protocol, final

from ..protocol.resp import RequestParser, encode_reply

__all__ = ["ClientSocket", "Connection", "OUT_HOLD", "PERMS_UNSET"]

#: A client's commands wait, and it is not read, while this much of its output is unsent. Below
#: it the node goes on reading and running a client's commands while the client does not read
#: its replies, as Redis and Disque do: a client library writes a whole pipeline before it
#: reads a reply (redis-py's pipeline of 200,000 ADDJOBs answers 10 MB). Past it the node waits
#: for the client to read, so a client that never reads costs at most this much.
OUT_HOLD: Final = 64 << 20

#: ``Connection.perms`` until the dispatcher (or AUTH, HELLO) has decided it: the acceptor lets
#: a connection in without AUTH when there is no requirepass, and the default user's own rules
#: (server/acl.py) are applied at its first command.
PERMS_UNSET: Final = object()


class ClientSocket(Protocol):
    """What a connection reads and writes through: a non-blocking socket, or a TLS link that
    behaves as one (``tls.TlsSocket``)."""

    def fileno(self) -> int: ...

    def recv(self, size: int) -> bytes: ...

    def send(self, data: bytes | bytearray | memoryview) -> int: ...

    def close(self) -> None: ...


@final
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

    # ``sock``: a non-blocking socket, or a TLS link that behaves as one (tls.py); ``parser``:
    # its request parser (None in tests that run no input).
    def __init__(self, cid: int, sock: ClientSocket, addr: str, laddr: str, now: float,
                 parser: RequestParser | None) -> None:  # fmt: skip
        self.id: int = cid
        self.sock = sock
        self.fd: int = sock.fileno()
        self.addr: str = addr
        self.laddr: str = laddr
        self.name: bytes = b""
        self.lib_name: bytes = b""
        self.lib_ver: bytes = b""
        self.created: float = now
        self.last_active: float = now
        self.authenticated: bool = False
        self.user: bytes = b"default"  # the user it is authenticated as (server/acl.py)
        # None: may run everything; PERMS_UNSET; else the acl.User its commands are checked against
        self.perms: object = PERMS_UNSET
        self.auth_failures: int = 0  # failed AUTHs in a row (closed at acl.AUTH_FAILURE_LIMIT)
        self.out: bytearray = bytearray()
        self.blocked: bool = False
        self.pending: deque[list[bytes]] = deque()
        self.closing: bool = False  # close once ``out`` is sent
        self.closed: bool = False
        self.waiting_write: bool = False  # registered for EPOLLOUT (and still read while under OUT_HOLD)
        self.armed: int = 0  # the epoll events it is registered for (clients.py: _arm)
        self.read_paused: bool = False  # commands pending (blocked, or held back by output): not read until they run
        self.last_cmd: bytes = b"NULL"
        self.parser = parser
        self.encode: Callable[[object, bytearray], None] = encode_reply  # encode_reply3 after HELLO 3
        self.soft_since: float = 0.0  # when its unsent output first reached the soft limit (0: below it)
