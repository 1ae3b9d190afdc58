from __future__ import annotations

import pytest

from disque_py.core import invariants
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


def _checked(method):
    def run(self, *args, **kwargs):
        try:
            return method(self, *args, **kwargs)
        finally:
            invariants.check(self)

    run.__name__ = method.__name__
    return run


@pytest.fixture(autouse=True)
def _invariants_after_every_input(request, monkeypatch):
    """Every node a core test drives is checked (``core/invariants.py``) after each input it
    takes, however the test feeds it. A test that corrupts a node on purpose, or feeds it
    so many inputs that a check after each would be quadratic, says so with
    ``@pytest.mark.invariants_by_hand`` (and calls ``invariants.check`` itself)."""
    if request.node.get_closest_marker("invariants_by_hand"):
        return
    for name in ("execute", "receive_data", "tick", "client_closed", "on_moves_unsent", "flushall"):
        monkeypatch.setattr(Node, name, _checked(getattr(Node, name)))


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "invariants_by_hand: no check after every input; the test checks by hand")
