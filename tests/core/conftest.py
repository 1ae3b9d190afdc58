from __future__ import annotations

import pytest

from disque_py.core.effects import Reply
from disque_py.core.node import Node

NODE_ID = "0123456789abcdef0123456789abcdef01234567"
T0 = 1_000_000_000  # monotonic ms at start of every test


class Harness:
    """A node driven by a manual clock; commands take str/bytes/int args."""

    def __init__(self) -> None:
        self.now = T0
        self.node = Node(NODE_ID, seed=b"test-seed", now=self.now, wall_offset=1_700_000_000_000 - T0)

    def cmd(self, *args, client: int = 1):
        argv = [a if isinstance(a, bytes) else str(a).encode() for a in args]
        return self.node.execute(client, argv, self.now)

    def advance(self, ms: int) -> list:
        """Move the clock, running every timer due on the way, in order."""
        target = self.now + ms
        while True:
            nxt = self.node.next_wakeup()
            if nxt is None or nxt > target:
                break
            self.now = max(self.now, nxt)
            self.node.tick(self.now)
        self.now = target
        self.node.tick(self.now)
        return self.effects()

    def effects(self) -> list:
        return self.node.take_effects()

    def replies(self) -> dict[int, object]:
        return {e.client: e.value for e in self.effects() if isinstance(e, Reply)}

    def add(self, queue="q", body="body", *opts) -> bytes:
        reply = self.cmd("ADDJOB", queue, body, 0, *opts)
        assert isinstance(reply, bytes) and len(reply) == 40, reply
        return bytes(reply)


@pytest.fixture
def h() -> Harness:
    return Harness()
