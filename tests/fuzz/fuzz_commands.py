"""Fuzz target: the command layer of a node (``disque_py.core.node.Node``).

The input is a client's request stream (RESP, multibulk or inline: the seeds are plain
text lines). Each request is run on a fresh node driven by a manual clock, as the core
tests drive one (``tests/core/conftest.py``). A request whose name is not a command of
the node is given one, picked by the name's checksum, so that random bytes still reach
the commands' argument parsers; its arguments stay as they are, except ``$0`` .. ``$9``,
which stand for the IDs of the jobs added so far (``$0`` the first).

Lines starting with a dot drive the node's other inputs:

``.advance MS``      time passes (every timer due on the way runs, in order)
``.client N``        the next requests come from client N (0..7)
``.close N``         client N's connection went away
``.flushall``        DEBUG FLUSHALL
``.peers N``         the cluster has N other nodes (0..3), all reachable
``.recv KIND BODY``  a job-layer bus message from the first peer; BODY is msgpack
                     (a message is dropped by the decoder's rules when it does not decode)

What must hold after every input: the node raised nothing, every reply (to the caller
or, as an effect, to another client) is encodable by ``protocol.resp.encode_reply``, and
``core.invariants.check`` passes.
"""

from __future__ import annotations

import re
import zlib

import msgpack

from disque_py.core import invariants
from disque_py.core.effects import BLOCKED, Reply
from disque_py.core.node import Node
from disque_py.protocol.resp import ProtocolError, RequestParser, encode_reply, encode_reply3

NODE_ID = "0123456789abcdef0123456789abcdef01234567"
PEERS = ["1" * 40, "2" * 40, "3" * 40]
T0 = 1_000_000_000
WALL = 1_700_000_000_000 - T0
MAX_ADVANCE = 10 * 24 * 3600 * 1000  # one step of time: at most ten days
MAX_COMMANDS = 200  # per input: keeps one input's run short
_JOB_REF = re.compile(rb"\$(\d)")
_INT = re.compile(rb"[+-]?\d{1,20}")

CONTROLS = (b".advance", b".client", b".close", b".flushall", b".peers", b".recv")


def _int(arg: bytes, default: int = 0) -> int:
    return int(arg) if _INT.fullmatch(arg) else default


def _body(raw: bytes):
    try:
        return msgpack.unpackb(raw, raw=False, strict_map_key=True, max_buffer_size=1 << 16, use_list=True)
    except Exception:  # the bus would never deliver it: see cluster_bus.codec
        return None


class Driver:
    """One node, its clock, and the checks after every input."""

    def __init__(self) -> None:
        self.now = T0
        self.node = Node(NODE_ID, seed=b"fuzz-seed", now=T0, wall_offset=WALL)
        self.client = 1
        self.jobs: list[bytes] = []
        self.pending: dict[int, list[list[bytes]]] = {}  # client -> commands held while it is blocked
        self.names = sorted(self.node.commands)

    # -- inputs ---------------------------------------------------------------------
    def run(self, argv: list[bytes]) -> None:
        name = argv[0].lower()
        if name.startswith(b"."):
            if name in CONTROLS:
                self.control(name, argv[1:])
                return
        if name not in self.node.commands:
            argv = [self.names[zlib.crc32(name) % len(self.names)], *argv[1:]]
        if self.jobs:
            argv = [argv[0], *(self._resolve(a) for a in argv[1:])]
        # As the shell does: a blocked client's next commands wait until it is served.
        self.pending.setdefault(self.client, []).append(argv)
        self.drain()

    def drain(self) -> None:
        """Run the waiting commands of every client that is not blocked."""
        node = self.node
        progress = True
        while progress:
            progress = False
            for client, queue in list(self.pending.items()):
                while queue and not node.is_blocked(client):
                    self.execute(client, queue.pop(0))
                    progress = True
                if not queue:
                    del self.pending[client]

    def execute(self, client: int, argv: list[bytes]) -> None:
        reply = self.node.execute(client, argv, self.now)
        if reply is not BLOCKED:
            self.encodable(reply)
            if argv[0].lower() == b"addjob" and isinstance(reply, bytes) and len(reply) == 40:
                self.jobs.append(bytes(reply))
        self.after()

    def _resolve(self, arg: bytes) -> bytes:
        m = _JOB_REF.fullmatch(arg)
        return self.jobs[int(m.group(1)) % len(self.jobs)] if m else arg

    def control(self, name: bytes, args: list[bytes]) -> None:
        node = self.node
        arg = args[0] if args else b""
        if name == b".advance":
            self.advance(abs(_int(arg, 1000)) % MAX_ADVANCE)
            return
        if name == b".client":
            self.client = _int(arg) % 8
            return
        if name == b".close":
            client = _int(arg) % 8
            self.pending.pop(client, None)
            node.client_closed(client)
        elif name == b".flushall":
            node.flushall()
        elif name == b".peers":
            n = _int(arg) % (len(PEERS) + 1)
            node.ctx.cluster_size = 1 + n
            node.ctx.known_nodes = [node.id, *PEERS[:n]]
            node.ctx.reachable = PEERS[:n]
            node.ctx.live_nodes = n
        elif name == b".recv":
            kind = arg.decode("utf-8", "replace")
            body = _body(args[1]) if len(args) > 1 else []
            if body is None:
                return
            node.receive_data(PEERS[0], kind, body, self.now)
        self.after()
        self.drain()

    def advance(self, ms: int) -> None:
        target = self.now + ms
        while True:
            nxt = self.node.next_wakeup()
            if nxt is None or nxt > target:
                break
            self.now = max(self.now, nxt)
            self.node.tick(self.now)
            self.after()
            self.drain()
        self.now = target
        self.node.tick(self.now)
        self.after()
        self.drain()

    # -- checks ---------------------------------------------------------------------
    @staticmethod
    def encodable(value) -> None:
        encode_reply(value, bytearray())
        encode_reply3(value, bytearray())  # a client that said HELLO 3

    def after(self) -> None:
        for effect in self.node.take_effects():
            if type(effect) is Reply:
                self.encodable(effect.value)
        invariants.check(self.node)


def commands_of(data: bytes) -> list[list[bytes]]:
    """The requests in ``data`` (those before any protocol error)."""
    parser = RequestParser(max_bulk_len=1 << 16, max_args=64, max_inline_len=1 << 12)
    parser.feed(data)
    out: list[list[bytes]] = []
    try:
        while ready := parser.commands():
            out.extend(ready)
    except ProtocolError:
        pass
    return out[:MAX_COMMANDS]


def check_commands(data: bytes) -> Driver:
    driver = Driver()
    for argv in commands_of(data):
        driver.run(argv)
    return driver


def TestOneInput(data: bytes) -> None:
    check_commands(data)
