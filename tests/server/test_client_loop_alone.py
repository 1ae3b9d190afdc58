"""The client loop on its own: a real ``ClientLoop`` serving real sockets, with a small runner.

No ``Server`` and no core: the loop is given a :class:`Runner` (the
``CommandRunner`` contract) that echoes commands, blocks on request, or
raises, and the test talks to it through socket pairs. Every wait is for a
condition, bounded by ``fail_after``.
"""

from __future__ import annotations

import select
import socket

import pytest
import trio

from disque_py.core.replies import Status
from disque_py.protocol.resp import RequestParser, encode_reply
from disque_py.server.clients import ClientLoop
from disque_py.server.connection import OUT_HOLD, Connection

DEADLINE = 10  # seconds: liveness bound, far above what any step needs
BIG = 1 << 20  # the size of one reply to ``BIG``


class Runner:
    """Echoes ``ECHO x`` as ``+x``, ``BIG`` as 1 MB, blocks on ``BLOCK``, raises on ``BOOM``;
    applies the same holding rules as the node's dispatcher (blocked / ``OUT_HOLD``)."""

    def __init__(self) -> None:
        self.ran: list[tuple[int, list[bytes]]] = []
        self.closed: list[int] = []
        self.effects_applied = 0

    def run_commands(self, conn: Connection, commands) -> bool:
        """False: nothing journaled (the CommandRunner contract)."""
        out = conn.out
        for i, argv in enumerate(commands):
            if conn.blocked or conn.closing or len(out) >= OUT_HOLD:
                if not conn.closing or conn.blocked:
                    conn.pending.extend(commands[i:])
                return False
            if argv[0] == b"BOOM":
                raise RuntimeError("injected failure")
            self.ran.append((conn.id, argv))
            if argv[0] == b"BLOCK":
                conn.blocked = True
            elif argv[0] == b"BIG":
                encode_reply(b"x" * BIG, out)
            else:
                encode_reply(Status(b" ".join(argv[1:])), out)
        return False

    def apply_effects(self) -> None:
        self.effects_applied += 1

    def client_closed(self, client_id: int) -> None:
        self.closed.append(client_id)

    def commands_of(self, conn: Connection) -> list[list[bytes]]:
        return [argv for cid, argv in self.ran if cid == conn.id]


class Peer:
    """The client's end of a socket pair, driven with trio."""

    def __init__(self, sock: socket.socket) -> None:
        self.sock = trio.socket.from_stdlib_socket(sock)
        self.buf = bytearray()

    async def send(self, data: bytes) -> None:
        while data:
            sent = await self.sock.send(data)
            data = data[sent:]

    async def expect(self, data: bytes) -> None:
        assert await self.read_until(len(data)) == data

    async def read_until(self, size: int) -> bytes:
        """Read until ``size`` bytes arrived (fails if the loop closes the link first)."""
        while len(self.buf) < size:
            chunk = await self.sock.recv(1 << 20)
            assert chunk, "closed after %d of %d bytes: %r" % (len(self.buf), size, bytes(self.buf[:200]))
            self.buf += chunk
        data = bytes(self.buf[:size])
        del self.buf[:size]
        return data

    async def read_to_eof(self) -> bytes:
        while chunk := await self.sock.recv(1 << 20):
            self.buf += chunk
        data = bytes(self.buf)
        self.buf.clear()
        return data

    def nothing_to_read(self) -> bool:
        return not self.buf and not select.select([self.sock.fileno()], [], [], 0)[0]


async def until(cond) -> None:
    """Wait for ``cond()`` (the caller's ``fail_after`` bounds it)."""
    while not cond():
        await trio.sleep(0.001)


class Harness:
    def __init__(self) -> None:
        self.runner = Runner()
        self.stats: dict[str, int] = {}
        self.loop = ClientLoop(self.runner, self.stats)
        self.socks: list[socket.socket] = []
        self.next_id = 0

    def connect(self) -> tuple[Connection, Peer]:
        ours, theirs = socket.socketpair()
        ours.setblocking(False)
        self.socks += [ours, theirs]
        self.next_id += 1
        conn = Connection(self.next_id, ours, "pair:%d" % self.next_id, "pair:0", trio.current_time(), RequestParser())
        self.loop.add(conn)
        return conn, Peer(theirs)

    async def round_trip(self, peer: Peer, text: bytes) -> None:
        """One request answered: every pass before it is over."""
        await peer.send(b"ECHO " + text + b"\r\n")
        await peer.expect(b"+" + text + b"\r\n")


@pytest.fixture
async def harness():
    h = Harness()
    async with trio.open_nursery() as nursery:
        nursery.start_soon(h.loop.run)
        yield h
        nursery.cancel_scope.cancel()
    h.loop.close_all()
    for s in h.socks:
        s.close()


async def test_pipelined_commands_are_answered_in_order(harness):
    conn, peer = harness.connect()
    with trio.fail_after(DEADLINE):
        await peer.send(b"ECHO one\r\nECHO two\r\n*2\r\n$4\r\nECHO\r\n$5\r\nthree\r\n")
        await peer.expect(b"+one\r\n+two\r\n+three\r\n")
    assert harness.runner.commands_of(conn) == [[b"ECHO", b"one"], [b"ECHO", b"two"], [b"ECHO", b"three"]]
    assert harness.runner.effects_applied >= 1  # after the commands of a read: their effects


async def test_a_partial_frame_is_completed_by_a_later_read(harness):
    conn, peer = harness.connect()
    head = b"*2\r\n$4\r\nECHO\r\n$5\r\nhel"
    with trio.fail_after(DEADLINE):
        await peer.send(head)
        await until(lambda: harness.stats["total_net_input_bytes"] == len(head))  # the loop read it
        assert harness.runner.ran == [] and peer.nothing_to_read()
        await peer.send(b"lo\r\n*2\r\n$4\r\nECHO\r\n$5\r\nagain\r\n")
        await peer.expect(b"+hello\r\n+again\r\n")
    assert harness.runner.commands_of(conn) == [[b"ECHO", b"hello"], [b"ECHO", b"again"]]


async def test_malformed_input_is_answered_with_an_error_and_the_link_closed(harness):
    conn, peer = harness.connect()
    with trio.fail_after(DEADLINE):
        await peer.send(b"ECHO before\r\n*1\r\n$x\r\nECHO after\r\n")
        reply = await peer.read_to_eof()
    assert reply.startswith(b"+before\r\n-ERR Protocol error") and reply.endswith(b"\r\n"), reply
    assert reply.count(b"\r\n") == 2  # nothing after the error
    assert harness.runner.commands_of(conn) == [[b"ECHO", b"before"]]
    assert harness.stats["protocol_errors"] == 1
    assert harness.runner.closed == [conn.id] and conn.closed and not harness.loop.clients


async def test_replies_the_peer_does_not_read_hold_its_commands_back(harness):
    """A client that sends much and reads nothing: the loop stops running its commands once
    ``OUT_HOLD`` of output waits, and stops reading it; other clients are served meanwhile.
    When it reads, every reply arrives, in order."""
    conn, peer = harness.connect()
    other_conn, other = harness.connect()
    n = OUT_HOLD // BIG + 32  # 96 MB of replies: far more than the socket buffers and OUT_HOLD
    with trio.fail_after(DEADLINE):
        await peer.send(b"BIG\r\n" * n)
        await until(lambda: conn.waiting_write)
        held = len(harness.runner.commands_of(conn))
        assert 0 < held < n and conn.pending
        for i in range(3):  # the loop goes on serving (and making passes) ...
            await harness.round_trip(other, b"x%d" % i)
        assert len(harness.runner.commands_of(conn)) == held  # ... but runs nothing more of conn's
        assert len(conn.out) <= OUT_HOLD + BIG
        one = b"$%d\r\n" % BIG + b"x" * BIG + b"\r\n"
        data = await peer.read_until(n * len(one))
    assert data == one * n
    assert len(harness.runner.commands_of(conn)) == n and not conn.pending and not conn.closed
    assert harness.runner.commands_of(other_conn) == [[b"ECHO", b"x%d" % i] for i in range(3)]


async def test_a_client_closing_mid_command_is_forgotten(harness):
    conn, peer = harness.connect()
    with trio.fail_after(DEADLINE):
        await peer.send(b"ECHO done\r\n*3\r\n$4\r\nECHO\r\n$2\r\nab")
        await peer.expect(b"+done\r\n")
        peer.sock.close()
        await until(lambda: harness.runner.closed)
    assert harness.runner.closed == [conn.id] and conn.closed
    assert harness.runner.commands_of(conn) == [[b"ECHO", b"done"]]  # the half command never ran
    assert not harness.loop.clients and not harness.loop.by_fd


async def test_a_blocked_client_that_hangs_up_is_reported_closed(harness):
    """A blocked client keeps what it pipelines behind the blocking command and is not read
    meanwhile; its hang-up is still seen, so the runner can drop its blocked command."""
    conn, peer = harness.connect()
    with trio.fail_after(DEADLINE):
        await peer.send(b"BLOCK\r\nECHO later\r\n")
        await until(lambda: conn.blocked and conn.read_paused)
        assert list(conn.pending) == [[b"ECHO", b"later"]]
        peer.sock.close()
        await until(lambda: harness.runner.closed)
    assert harness.runner.closed == [conn.id] and conn.closed
    assert harness.runner.commands_of(conn) == [[b"BLOCK"]]


async def test_a_failure_serving_one_client_closes_only_that_client(harness, caplog):
    good_conn, good = harness.connect()
    bad_conn, bad = harness.connect()
    with trio.fail_after(DEADLINE):
        await harness.round_trip(good, b"first")
        await bad.send(b"ECHO fine\r\nBOOM\r\n")
        assert await bad.read_to_eof() == b""  # closed, nothing of that read answered
        await harness.round_trip(good, b"second")
    assert harness.stats["internal_errors"] == 1
    assert "Internal error serving client" in caplog.text and "injected failure" in caplog.text
    assert harness.runner.closed == [bad_conn.id] and list(harness.loop.clients) == [good_conn.id]


# --------------------------------------------------------------------------- the client checks


async def test_the_client_checks_go_round_in_slices_and_close_every_idle_client(harness, monkeypatch):
    """``check_clients`` (the cron's, at every step) looks at ``clients / hz`` clients a call (at least
    ``CHECK_MIN``), from where the previous call stopped: every idle client is closed within one
    round, a blocked one never, and a client that left mid-round is skipped."""
    from disque_py.server import clients as clients_mod

    monkeypatch.setattr(clients_mod, "CHECK_SLICE_NS", 10**10)  # no time limit: counts alone, below
    loop = harness.loop
    conns = [harness.connect()[0] for _ in range(clients_mod.CHECK_MIN * 3 + 5)]  # 197 clients
    blocked = conns[1::10]
    for conn in blocked:
        conn.blocked = True
    gone = conns[-1]
    old = trio.current_time() - 100.0
    for conn in conns:
        conn.last_active = old
    assert loop.check_clients(0, 10) and not any(c.closing for c in conns)  # no timeout: nothing to do
    assert not loop.check_clients(5, 10) and not any(c.closing for c in conns)  # a round begins: the ids
    assert not loop.check_clients(5, 10)  # 197 / 10 < CHECK_MIN: the first CHECK_MIN clients
    first = [c for c in conns if c.closing]
    assert first == [c for c in conns[: clients_mod.CHECK_MIN] if c not in blocked]
    loop.close(gone)  # leaves before the round reaches it
    assert not loop.check_clients(5, 10) and not loop.check_clients(5, 10)
    assert loop.check_clients(5, 10)  # the fourth call of clients ends the round
    idle = [c for c in conns if c not in blocked]
    assert all(c.closing or c.closed for c in idle)
    assert not any(c.closing or c.closed for c in blocked)
    assert len(loop.clients) == len(blocked)

    # A slice stops after CHECK_SLICE_NS however many clients it was to look at: here one chunk a call.
    monkeypatch.setattr(clients_mod, "CHECK_SLICE_NS", 0)
    more = [harness.connect()[0] for _ in range(clients_mod.CHECK_CHUNK * 2 + 1)]
    for conn in more:
        conn.last_active = old
    calls = 1
    while not loop.check_clients(5, 1):  # hz 1: all of them wanted, one chunk a call given
        calls += 1
        assert calls <= 10
    # the round's ids, then the 85 clients (20 blocked, 65 idle) 32 a call
    assert calls == 4 and all(c.closing or c.closed for c in more)
