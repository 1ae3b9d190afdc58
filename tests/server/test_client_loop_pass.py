"""The client loop's pass on its own: replies leave at its end, the commit stage decides what
waits, held commands run again once, in order.

Real ``ClientLoop``, real sockets (socket pairs), no ``Server`` and no core: a small runner
(the ``CommandRunner`` contract) and a commit stage of the test's (the ``Commit`` contract)
that counts records and hands out tickets the test releases. Every wait is for a condition,
bounded by ``fail_after``.
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


class Commit:
    """Records journaled by ``JOURNAL``; ``commit`` hands the pass's records a ticket and
    keeps them until the test calls ``done(ticket)`` (as ``appendfsync always`` does)."""

    def __init__(self) -> None:
        self.records = 0  # journaled, not committed
        self.seq = 0
        self.tickets: list[int] = []
        self.loop: ClientLoop | None = None

    def pending(self) -> bool:
        return self.records > 0 or bool(self.tickets)

    def commit(self) -> int:
        if not self.records:
            return 0
        self.records = 0
        self.seq += 1
        self.tickets.append(self.seq)
        return self.seq

    def done(self, ticket: int) -> None:
        self.tickets.remove(ticket)
        self.loop.release(ticket)


class Runner:
    """``ECHO x`` answers ``+x``; ``JOURNAL x`` journals a record and answers ``+x``; ``SEND n``
    queues a bus message to node ``n``; ``BLOCK`` blocks; ``WAKE id x`` serves blocked client
    ``id`` with ``+x``; ``PEEK id`` answers whether client ``id``'s peer already has bytes to read."""

    def __init__(self, commit: Commit) -> None:
        self.commit = commit
        self.loop: ClientLoop | None = None
        self.peers: dict[int, socket.socket] = {}
        self.ran: list[tuple[int, list[bytes]]] = []
        self.effects: list[tuple] = []

    def run_commands(self, conn: Connection, commands) -> bool:
        out = conn.out
        journaled = False
        for i, argv in enumerate(commands):
            if conn.blocked or conn.closing or len(out) >= OUT_HOLD:
                if not conn.closing or conn.blocked:
                    conn.pending.extend(commands[i:])
                break
            self.ran.append((conn.id, argv))
            name = argv[0]
            if name == b"BLOCK":
                conn.blocked = True
                continue
            if name == b"JOURNAL":
                self.commit.records += 1
                journaled = True
            elif name == b"SEND":
                self.effects.append(("send", argv[1].decode()))
            elif name == b"WAKE":
                self.effects.append(("reply", int(argv[1]), argv[2]))
            elif name == b"PEEK":
                peer = self.peers[int(argv[1])]
                ready = bool(select.select([peer], [], [], 0)[0])
                encode_reply(Status(b"ready" if ready else b"empty"), out)
                continue
            encode_reply(Status(b" ".join(argv[1:])), out)
        return journaled

    def apply_effects(self) -> None:
        effects, self.effects = self.effects, []
        loop = self.loop
        for effect in effects:
            if effect[0] == "send":
                loop.send_item(effect[1], b"item", None)
            else:
                conn = loop.clients.get(effect[1])
                if conn is not None:
                    conn.blocked = False
                    encode_reply(Status(effect[2]), conn.out)
                    loop.woken(conn, self.commit.pending())

    def client_closed(self, client_id: int) -> None:
        pass

    def commands_of(self, cid: int) -> list[list[bytes]]:
        return [argv for c, argv in self.ran if c == cid]


class Links:
    """The bus owner: records what reaches the links (no bus running)."""

    bus = None

    def __init__(self) -> None:
        self.sent: list[str] = []

    def send_item(self, node_id: str, item: bytes, watch=None) -> bool:
        self.sent.append(node_id)
        return True


class Harness:
    def __init__(self) -> None:
        self.commit = Commit()
        self.runner = Runner(self.commit)
        self.links = Links()
        self.loop = ClientLoop(self.runner, {}, links=self.links)
        self.loop.commit = self.commit
        self.commit.loop = self.runner.loop = self.loop
        self.socks: list[socket.socket] = []

    def connect(self) -> tuple[Connection, "Peer"]:
        ours, theirs = socket.socketpair()
        ours.setblocking(False)
        self.socks += [ours, theirs]
        cid = len(self.socks) // 2
        conn = Connection(cid, ours, "pair:%d" % cid, "pair:0", trio.current_time(), RequestParser())
        self.loop.add(conn)
        self.runner.peers[cid] = theirs
        return conn, Peer(theirs)


class Peer:
    def __init__(self, sock: socket.socket) -> None:
        self.raw = sock
        self.sock = trio.socket.from_stdlib_socket(sock)
        self.buf = bytearray()

    async def send(self, data: bytes) -> None:
        while data:
            data = data[await self.sock.send(data) :]

    async def expect(self, data: bytes) -> None:
        while len(self.buf) < len(data):
            chunk = await self.sock.recv(1 << 16)
            assert chunk, "closed after %r" % bytes(self.buf)
            self.buf += chunk
        got = bytes(self.buf[: len(data)])
        del self.buf[: len(data)]
        assert got == data

    def nothing_to_read(self) -> bool:
        return not self.buf and not select.select([self.raw], [], [], 0)[0]


async def until(cond) -> None:
    while not cond():
        await trio.sleep(0.001)


@pytest.fixture
async def harness():
    h = Harness()
    yield h
    h.loop.close_all()
    for s in h.socks:
        s.close()


async def run_loop(h: Harness, nursery) -> None:
    nursery.start_soon(h.loop.run)


async def test_replies_leave_at_the_end_of_the_pass(harness):
    """Two clients served in one pass: when the second one's command runs, the first one's
    reply has not left yet; both arrive once the pass is over."""
    a_conn, a = harness.connect()
    b_conn, b = harness.connect()
    # both requests wait in their sockets before the loop's first pass
    await a.send(b"ECHO first\r\n")
    await b.send(b"PEEK %d\r\n" % a_conn.id)
    with trio.fail_after(DEADLINE):
        async with trio.open_nursery() as nursery:
            await run_loop(harness, nursery)
            await a.expect(b"+first\r\n")
            await b.expect(b"+empty\r\n")
            nursery.cancel_scope.cancel()
    # (epoll may report either socket first; whichever ran second saw nothing sent yet)
    assert [cid for cid, _ in harness.runner.ran] in ([a_conn.id, b_conn.id], [b_conn.id, a_conn.id])


async def test_only_the_replies_of_commands_that_journaled_wait_for_the_commit(harness):
    j_conn, journaling = harness.connect()
    _, other = harness.connect()
    with trio.fail_after(DEADLINE):
        async with trio.open_nursery() as nursery:
            await run_loop(harness, nursery)
            await journaling.send(b"ECHO before\r\nJOURNAL added\r\n")
            await until(lambda: harness.commit.tickets)
            ticket = harness.commit.tickets[0]
            assert j_conn.id in harness.loop.held
            # a client whose commands journaled nothing is answered while the ticket is not done
            await other.send(b"ECHO ping\r\n")
            await other.expect(b"+ping\r\n")
            # and so is a later command of the held client: its reply waits behind (order)
            await journaling.send(b"ECHO after\r\n")
            await until(lambda: len(harness.runner.commands_of(j_conn.id)) == 3)
            await other.send(b"ECHO pong\r\n")
            await other.expect(b"+pong\r\n")  # a pass after the held client's has ended
            assert journaling.nothing_to_read()
            harness.commit.done(ticket)
            await journaling.expect(b"+before\r\n+added\r\n+after\r\n")
            nursery.cancel_scope.cancel()
    assert not harness.loop.held


async def test_bus_messages_made_while_records_are_pending_wait_and_keep_their_order(harness):
    conn, client = harness.connect()
    with trio.fail_after(DEADLINE):
        async with trio.open_nursery() as nursery:
            await run_loop(harness, nursery)
            await client.send(b"SEND early\r\n")
            await client.expect(b"+early\r\n")
            assert harness.links.sent == ["early"]  # nothing pending: queued on its link at once
            # the effects of a read are carried out after its commands: this message is made
            # once the record is journaled, and waits for it
            await client.send(b"JOURNAL x\r\nSEND late\r\n")
            await until(lambda: harness.commit.tickets)
            await client.send(b"SEND after\r\n")  # nothing journaled, but behind a held message
            await until(lambda: len(harness.runner.commands_of(conn.id)) == 4)
            assert harness.links.sent == ["early"] and client.nothing_to_read()
            harness.commit.done(harness.commit.tickets[0])
            await until(lambda: harness.links.sent == ["early", "late", "after"])
            await client.expect(b"+x\r\n+late\r\n+after\r\n")
            nursery.cancel_scope.cancel()


async def test_commands_pipelined_behind_a_blocking_one_run_once_when_it_is_served(harness):
    blocked_conn, blocked = harness.connect()
    _, waker = harness.connect()
    with trio.fail_after(DEADLINE):
        async with trio.open_nursery() as nursery:
            await run_loop(harness, nursery)
            await blocked.send(b"BLOCK\r\nECHO one\r\nECHO two\r\n")
            await until(lambda: blocked_conn.blocked and blocked_conn.read_paused)
            assert blocked.nothing_to_read()
            await waker.send(b"WAKE %d served\r\nECHO done\r\n" % blocked_conn.id)
            await waker.expect(b"+%d served\r\n+done\r\n" % blocked_conn.id)
            await blocked.expect(b"+served\r\n+one\r\n+two\r\n")
            await blocked.send(b"ECHO again\r\n")  # read again once nothing is pending
            await blocked.expect(b"+again\r\n")
            nursery.cancel_scope.cancel()
    ran = harness.runner.commands_of(blocked_conn.id)
    assert ran == [[b"BLOCK"], [b"ECHO", b"one"], [b"ECHO", b"two"], [b"ECHO", b"again"]]


async def test_a_client_served_by_a_journaling_command_waits_for_its_commit(harness):
    blocked_conn, blocked = harness.connect()
    _, waker = harness.connect()
    with trio.fail_after(DEADLINE):
        async with trio.open_nursery() as nursery:
            await run_loop(harness, nursery)
            await blocked.send(b"BLOCK\r\n")
            await until(lambda: blocked_conn.blocked)
            await waker.send(b"JOURNAL x\r\nWAKE %d served\r\n" % blocked_conn.id)
            await until(lambda: harness.commit.tickets and blocked_conn.id in harness.loop.held)
            assert blocked.nothing_to_read() and waker.nothing_to_read()
            harness.commit.done(harness.commit.tickets[0])
            await waker.expect(b"+x\r\n+" + str(blocked_conn.id).encode() + b" served\r\n")
            await blocked.expect(b"+served\r\n")
            nursery.cancel_scope.cancel()


async def test_effects_applied_outside_a_pass_run_the_pass_tail(harness):
    """An input the loop did not run (the timer task, the cron, the admin port) serves a
    blocked client: ``apply_effects`` outside a pass sends its reply and commits."""
    blocked_conn, blocked = harness.connect()
    with trio.fail_after(DEADLINE):
        async with trio.open_nursery() as nursery:
            await run_loop(harness, nursery)
            await blocked.send(b"BLOCK\r\nECHO next\r\n")
            await until(lambda: blocked_conn.blocked and blocked_conn.pending)
            harness.runner.effects.append(("reply", blocked_conn.id, b"later"))
            assert not harness.loop.in_pass
            harness.loop.apply_effects()
            await blocked.expect(b"+later\r\n+next\r\n")
            nursery.cancel_scope.cancel()
