"""A few nodes wired together in one thread, for the core tests of what several nodes do
(``test_delivery.py``, ``test_dedup.py``).

One manual clock; every ``Send`` is encoded and decoded by the real bus codec and handed to
its destination in order, at once (``settle``) or later (``submit`` leaves it in the inbox:
two commands taken "at once", before either node hears of the other). A node can crash (its
memory and links gone), the network can be cut between groups (the nodes' views follow), and a
node can be muted (still reachable in the others' view, but it never hears or says anything:
a node that does not answer). Every node is checked (``core/invariants.py``) after each input,
as in every core test.
"""

from __future__ import annotations

from collections import deque

from cluster_bus.codec import decode_message, encode_message
from cluster_bus.messages import Data
from disque_py.core.effects import BLOCKED, Reply, Send
from disque_py.core.job import QUEUED, Job
from disque_py.core.node import Node

from .conftest import T0

WALL = 1_700_000_000_000 - T0


class Wired:
    def __init__(self, n: int = 3, *, id_digit: str = "%d", seed: bytes = b"seed-%d") -> None:
        self.now = T0
        self.ids = [(id_digit % (i + 1)) * 40 for i in range(n)]
        self.nodes: list[Node | None] = [
            Node(nid, seed=seed % i, now=self.now, wall_offset=WALL) for i, nid in enumerate(self.ids)
        ]
        self.index = {nid: i for i, nid in enumerate(self.ids)}
        self.inbox: deque = deque()
        self.replies: dict[tuple[int, int], list] = {}
        self.groups: list[set[int]] | None = None
        self.muted: set[int] = set()
        self.sent: list[tuple[int, int, str]] = []  # (src, dst, kind) of every message
        self._views()

    # -- the network ----------------------------------------------------------------------
    def linked(self, a: int, b: int) -> bool:
        return self.groups is None or any(a in g and b in g for g in self.groups)

    def _views(self) -> None:
        for i, node in enumerate(self.nodes):
            if node is not None:
                node.ctx.cluster_size = len(self.ids)
                node.ctx.known_nodes = list(self.ids)
                node.ctx.reachable = [self.ids[j] for j in self.live() if j != i and self.linked(i, j)]

    def partition(self, *groups) -> None:
        self.groups = [set(g) for g in groups]
        self._views()

    def heal(self) -> None:
        self.groups = None
        self._views()

    def crash(self, i: int) -> None:
        self.nodes[i] = None
        self.inbox = deque(m for m in self.inbox if m[0] != i and m[1] != i)
        self._views()

    def _collect(self, i: int) -> None:
        for e in self.node(i).take_effects():
            if type(e) is Reply:
                self.replies.setdefault((i, e.client), []).append(e.value)
            else:
                assert type(e) is Send, e
                frame = encode_message(Data(self.ids[i], e.message[0], list(e.message[1:])))
                self.inbox.append((i, self.index[e.to], frame))
                self.sent.append((i, self.index[e.to], e.message[0]))

    def settle(self) -> None:
        while self.inbox:
            src, dst, frame = self.inbox.popleft()
            if self.nodes[src] is None or self.nodes[dst] is None:
                continue  # gone with a crashed node
            if not self.linked(src, dst) or dst in self.muted or src in self.muted:
                continue  # lost on the cut
            m = decode_message(frame)
            self.node(dst).receive_data(m.sender, m.kind, m.body, self.now)
            assert self.node(dst).bus_stats["messages_malformed"] == 0
            self._collect(dst)

    # -- inputs ---------------------------------------------------------------------------
    def submit(self, i: int, *args, client: int = 1):
        """Run a command without delivering what it sends: its reply, or BLOCKED."""
        argv = [a if isinstance(a, bytes) else str(a).encode() for a in args]
        reply = self.node(i).execute(client, argv, self.now)
        self._collect(i)
        return reply

    def reply(self, i: int, client: int = 1):
        got = self.replies.get((i, client))
        return got.pop(0) if got else None

    def cmd(self, i: int, *args, client: int = 1):
        reply = self.submit(i, *args, client=client)
        self.settle()
        if reply is BLOCKED:
            reply = self.reply(i, client)
            assert reply is not None, "no reply to %r" % (args,)
        return reply

    def advance(self, ms: int) -> None:
        target = self.now + ms
        while True:
            due = [(w, i) for i in self.live() if (w := self.node(i).next_wakeup()) is not None and w <= target]
            if not due:
                break
            at, i = min(due)
            self.now = max(self.now, at)
            self.node(i).tick(self.now)
            self._collect(i)
            self.settle()
        self.now = target
        for i in self.live():
            self.node(i).tick(self.now)
            self._collect(i)
        self.settle()

    # -- what the nodes hold ----------------------------------------------------------------
    def node(self, i: int) -> Node:
        node = self.nodes[i]
        assert node is not None
        return node

    def live(self) -> list[int]:
        return [i for i, n in enumerate(self.nodes) if n is not None]

    def job(self, i: int, job_id: bytes) -> Job | None:
        node = self.nodes[i]
        return None if node is None else node.store.get(bytes(job_id))

    def holders(self, job_id: bytes, among=None) -> list[int]:
        return [i for i in (among if among is not None else self.live()) if self.job(i, job_id) is not None]

    def queued_on(self, job_id: bytes, among=None) -> list[int]:
        return [i for i in self.holders(job_id, among) if self.job(i, job_id).state == QUEUED]  # type: ignore[union-attr]
