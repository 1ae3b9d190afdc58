"""In-process clusters: real ClusterService + Node per node, memory streams between them.

``MemoryNetwork`` replaces TCP: each node's transport listens on a virtual
port and opens memory stream pairs to the others. The network can kill a
node (cancel its tasks, refuse connections to it), partition the nodes into
groups (sever every stream across groups and refuse new ones) and heal.
Run under trio's ``autojump_clock`` so node timeouts pass in no real time.
"""

from __future__ import annotations

from typing import Any

import trio
import trio.testing

from cluster_bus.codec import encode_data_item
from disque_py.config import load_config
from disque_py.core import invariants
from disque_py.core.node import Node
from disque_py.server.cluster import ClusterService


class MemoryNetwork:
    def __init__(self, nursery: trio.Nursery) -> None:
        self.nursery = nursery
        self.listeners: dict[int, Any] = {}
        self.groups: list[set[int]] | None = None
        self.streams: list[tuple[int, int, Any, Any]] = []
        self.replays: set[tuple[int, int]] = set()

    def reachable(self, a: int, b: int) -> bool:
        if self.groups is None:
            return True
        return any(a in g and b in g for g in self.groups)

    def partition(self, *groups: set[int]) -> None:
        self.groups = [set(g) for g in groups]
        for a, b, s1, s2 in list(self.streams):
            if not self.reachable(a, b):
                self._sever(s1, s2)

    def heal(self) -> None:
        self.groups = None

    def replay_next_write(self, from_port: int, to_port: int) -> None:
        """Make the next write on the from->to link go out twice (a replay attack)."""
        self.replays.add((from_port, to_port))

    def _sever(self, s1: Any, s2: Any) -> None:
        for s in (s1, s2):
            try:
                s.send_stream.close()
                s.receive_stream.close()
            except Exception:  # noqa: BLE001 - already closed
                pass

    def transport(self, my_bus_port: int) -> "MemoryTransport":
        return MemoryTransport(self, my_bus_port)


class _Tap(trio.abc.Stream):
    """A client stream the network can tamper with (replay a write)."""

    def __init__(self, inner: Any, net: MemoryNetwork, key: tuple[int, int]) -> None:
        self.inner = inner
        self.net = net
        self.key = key
        self.send_stream = inner.send_stream
        self.receive_stream = inner.receive_stream

    async def send_all(self, data) -> None:
        await self.inner.send_all(data)
        if self.key in self.net.replays:
            self.net.replays.discard(self.key)
            await self.inner.send_all(data)

    async def wait_send_all_might_not_block(self) -> None:
        await self.inner.wait_send_all_might_not_block()

    async def receive_some(self, max_bytes=None):
        return await self.inner.receive_some(max_bytes)

    async def aclose(self) -> None:
        await self.inner.aclose()


class MemoryTransport:
    def __init__(self, network: MemoryNetwork, my_port: int) -> None:
        self.network = network
        self.my_port = my_port

    async def open_connection(self, ip: str, port: int):
        net = self.network
        await trio.sleep(0)
        accept = net.listeners.get(port)
        if accept is None or not net.reachable(self.my_port, port):
            raise OSError("connection refused")
        client, server = trio.testing.memory_stream_pair()
        net.streams.append((self.my_port, port, client, server))
        accept.send_nowait(server)
        return _Tap(client, net, (self.my_port, port))

    async def serve(
        self, host: str, port: int, handler, *, on_accept_error=None, task_status=trio.TASK_STATUS_IGNORED
    ) -> None:
        # Connections are handled in this node's own nursery, so killing the
        # node (cancelling its tasks) also ends its inbound links.
        send, receive = trio.open_memory_channel(float("inf"))
        self.network.listeners[port] = send
        try:
            async with trio.open_nursery() as nursery:
                task_status.started()
                async for stream in receive:
                    nursery.start_soon(handler, stream)
        finally:
            if self.network.listeners.get(port) is send:
                del self.network.listeners[port]

    @staticmethod
    def peer_ip(stream: Any) -> str:
        return "127.0.0.1"


class SimServer:
    """The parts of the real Server a ClusterService talks to."""

    def __init__(self, network: MemoryNetwork, port: int, directory, **directives: Any) -> None:
        args = ["--port", str(port), "--dir", str(directory), "--bind", "127.0.0.1"]
        for key, value in directives.items():
            args += ["--" + key.replace("_", "-"), str(value)]
        self.config = load_config(None, args)
        self.port = port
        self.network = network
        now = int(trio.current_time() * 1000)
        self.node = Node("0" * 40, seed=b"sim-%d" % port, now=now, address=("127.0.0.1", port))
        self.cluster = ClusterService(
            self, self.config, "127.0.0.1", now, 0, transport=network.transport(port + 10000)
        )
        self.node.set_id(self.cluster.my_id)
        self.scope: trio.CancelScope | None = None
        self.data: list[tuple[str, str, Any]] = []

    def apply_effects(self) -> None:
        from disque_py.core.effects import Send

        last = item = None
        for effect in self.node.take_effects():
            if type(effect) is Send:
                msg = effect.message
                if msg is not last:  # one encoding per message, as the server does
                    item, last = encode_data_item(msg[0], list(msg[1:])), msg
                self.cluster.send_item(effect.to, item)

    def cluster_data(self, sender: str, items: Any) -> None:
        now = int(trio.current_time() * 1000)
        for kind, body in items:
            self.data.append((sender, kind, body))
            self.node.receive_data(sender, kind, body, now)
            invariants.check(self.node)  # after every event (core/invariants.py)

    async def run(self, *, task_status=trio.TASK_STATUS_IGNORED) -> None:
        with trio.CancelScope() as scope:
            self.scope = scope
            await self.cluster.run(task_status=task_status)

    def kill(self) -> None:
        """Stop every task of this node at once (like kill -9: no goodbye)."""
        assert self.scope is not None
        self.scope.cancel()

    def cmd(self, *args: Any) -> Any:
        argv = [a if isinstance(a, bytes) else str(a).encode() for a in args]
        try:
            return self.cluster.command(argv)
        finally:
            invariants.check(self.node)

    def known(self) -> int:
        return len(self.cluster.membership.known())

    def flags(self, other: "SimServer") -> str:
        for line in self.cluster.membership.nodes_text().splitlines():
            if line.startswith(other.cluster.my_id):
                return line.split()[2]
        return "unknown"


async def wait_until(predicate, *, timeout: float, what: str, step: float = 0.1) -> float:
    """Poll on the (virtual) clock; returns the virtual seconds it took."""
    start = trio.current_time()
    with trio.move_on_after(timeout):
        while not predicate():
            await trio.sleep(step)
        return trio.current_time() - start
    raise AssertionError("timed out after %.1f virtual s waiting for %s" % (timeout, what))
