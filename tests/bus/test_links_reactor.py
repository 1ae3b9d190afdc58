"""Bus links driven by a reactor (one epoll for every socket, as the node's client loop does).

Two real ``Bus`` instances over loopback TCP, each with a small epoll
reactor that follows the ``cluster_bus.links.Reactor`` contract (hold the
bus for a pass, release it at the end). The node's own reactor is the
client loop; these tests pin down the bus side: order and completeness
under back-pressure, garbage, and links closed from either side.
"""

from __future__ import annotations

import select
import socket
import struct

import pytest
import trio

from cluster_bus.links import Bus

A_ID = "a" * 40
B_ID = "b" * 40


class Reactor:
    def __init__(self) -> None:
        self.ep = select.epoll()
        self.handlers: dict[int, tuple] = {}
        self.bus: Bus | None = None
        self.running = trio.Event()
        self.running.set()
        self.writable_requests: list[bool] = []

    def add_fd(self, fd, on_readable, on_writable) -> None:
        self.handlers[fd] = (on_readable, on_writable)
        self.ep.register(fd, select.EPOLLIN)

    def want_writable(self, fd, on) -> None:
        self.writable_requests.append(on)
        self.ep.modify(fd, select.EPOLLIN | select.EPOLLOUT if on else select.EPOLLIN)

    def remove_fd(self, fd) -> None:
        if self.handlers.pop(fd, None) is not None:
            self.ep.unregister(fd)

    async def run(self) -> None:
        while True:
            await self.running.wait()
            await trio.lowlevel.wait_readable(self.ep.fileno())
            if not self.running.is_set():
                continue
            self.bus.hold()
            try:
                for fd, events in self.ep.poll(0):
                    handlers = self.handlers.get(fd)
                    if handlers is None:
                        continue
                    if events & select.EPOLLOUT:
                        handlers[1]()
                    if events & (select.EPOLLIN | select.EPOLLERR | select.EPOLLHUP) and fd in self.handlers:
                        handlers[0]()
            finally:
                self.bus.release()


class Handler:
    def __init__(self) -> None:
        self.up: list[tuple[str, int]] = []
        self.down: list[int] = []
        self.failed: list[str] = []
        self.errors: list[tuple[str, str]] = []
        self.items: list[tuple[str, object]] = []
        self.links: set[int] = set()
        self.unsent_tokens: list[tuple[str, object]] = []
        self.changed = trio.Event()

    def _poke(self) -> None:
        self.changed.set()
        self.changed = trio.Event()

    def link_up(self, node_id, link) -> None:
        self.up.append((node_id, link))
        self._poke()

    def link_failed(self, node_id) -> None:
        self.failed.append(node_id)
        self._poke()

    def link_down(self, link) -> None:
        self.down.append(link)
        self._poke()

    def message(self, link, msg) -> None:
        self.links.add(link)
        for kind, body in getattr(msg, "items", ()):
            self.items.append((kind, body))
        self._poke()

    def link_error(self, kind, peer, reason) -> None:
        self.errors.append((kind, reason))
        self._poke()

    def unsent(self, node_id, tokens) -> None:
        self.unsent_tokens.extend((node_id, t) for t in tokens)
        self._poke()


async def until(handler: Handler, cond, timeout: float = 10.0) -> None:
    with trio.fail_after(timeout):
        while not cond():
            await handler.changed.wait()


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


async def start_bus(nursery, secret: bytes | None = None) -> tuple[Bus, Handler, Reactor]:
    handler, reactor = Handler(), Reactor()
    bus = Bus(handler, host="127.0.0.1", port=free_port(), secret=secret, reactor=reactor)
    reactor.bus = bus
    nursery.start_soon(reactor.run)
    await nursery.start(bus.run)
    return bus, handler, reactor


async def connected_pair(nursery, secret: bytes | None = None):
    """Buses A and B, A's outbound link to B up: (a, ha, ra, b, hb, rb, link)."""
    a, ha, ra = await start_bus(nursery, secret)
    b, hb, rb = await start_bus(nursery, secret)
    a.connect(B_ID, "127.0.0.1", b.port)
    await until(ha, lambda: ha.up)
    return a, ha, ra, b, hb, rb, ha.up[0][1]


@pytest.mark.parametrize("secret", [None, b"s3cret"])
async def test_a_reader_that_stops_gets_everything_in_order_later(secret):
    async with trio.open_nursery() as nursery:
        a, ha, ra, b, hb, rb, link = await connected_pair(nursery, secret)
        rb.running = trio.Event()  # B stops reading: A's socket fills up
        chunk = b"x" * 60000
        a.hold()
        for i in range(400):  # ~24 MB, far more than loopback buffers hold
            assert a.send_data(link, A_ID, "TEST", [i, chunk])
        a.release()
        with trio.fail_after(10):
            while True not in ra.writable_requests:
                await trio.sleep(0.01)
        assert a.links[link].out  # the rest waits in the link, not lost
        rb.running.set()
        await until(hb, lambda: len(hb.items) == 400, timeout=30)
        assert [body[0] for _, body in hb.items] == list(range(400))
        assert all(body[1] == chunk for _, body in hb.items)
        with trio.fail_after(10):
            while ra.writable_requests[-1] is not False:
                await trio.sleep(0.01)
        assert not a.links[link].out
        nursery.cancel_scope.cancel()


async def test_garbage_drops_only_that_link():
    async with trio.open_nursery() as nursery:
        b, hb, rb = await start_bus(nursery)
        for payload in (struct.pack(">I", 3) + b"\x93\x09\x09", struct.pack(">I", 2**31) + b"x"):
            s = trio.socket.socket()
            await s.connect(("127.0.0.1", b.port))
            await s.send(payload)
            with trio.fail_after(10):
                assert await s.recv(10) == b""  # closed by B
            s.close()
        assert len([e for e in hb.errors if e[0] == "frame"]) >= 1
        assert not rb.handlers  # nothing left registered
        a, ha, ra = await start_bus(nursery)
        a.connect(B_ID, "127.0.0.1", b.port)
        await until(ha, lambda: ha.up)
        assert a.send_data(ha.up[0][1], A_ID, "TEST", ["still fine"])
        a.flush()
        await until(hb, lambda: hb.items)
        assert hb.items == [("TEST", ["still fine"])]
        nursery.cancel_scope.cancel()


async def test_close_from_either_side_unregisters_and_reports():
    async with trio.open_nursery() as nursery:
        a, ha, ra, b, hb, rb, link = await connected_pair(nursery)
        a.send_data(link, A_ID, "TEST", [1])
        a.flush()
        await until(hb, lambda: hb.items)
        (b_link,) = hb.links
        assert len(ra.handlers) == 1 and len(rb.handlers) == 1
        a.close(link)  # A closes: B sees EOF
        await until(ha, lambda: ha.down == [link])
        await until(hb, lambda: hb.down == [b_link])
        assert not ra.handlers and not rb.handlers
        assert a.send_data(link, A_ID, "TEST", [2]) is False
        nursery.cancel_scope.cancel()


@pytest.mark.parametrize("secret", [None, b"s3cret"])
async def test_watched_messages_that_never_reached_the_socket_come_back_when_the_link_ends(secret):
    """A link closed with output still queued hands back the tokens of the watched messages whose
    frame the socket had not wholly taken, and only those: none of them reaches the peer, and
    the messages it did get are the ones before them. Watched messages written out are forgotten."""
    from cluster_bus.codec import encode_data_item

    async with trio.open_nursery() as nursery:
        a, ha, ra, b, hb, rb, link = await connected_pair(nursery, secret)
        assert a.send_item(link, A_ID, encode_data_item("TEST", [-1]), watch="early")
        a.flush()
        await until(hb, lambda: hb.items)  # written and received: forgotten
        rb.running = trio.Event()  # B stops reading: A's socket fills up
        chunk = b"x" * 60000
        a.hold()
        for i in range(400):  # ~24 MB; every 8th message unwatched
            item = encode_data_item("TEST", [i, chunk])
            assert a.send_item(link, A_ID, item, watch=None if i % 8 == 7 else i)
        a.release()
        with trio.fail_after(10):
            while True not in ra.writable_requests:
                await trio.sleep(0.01)
        a.close(link)
        await until(ha, lambda: ha.down == [link] and ha.unsent_tokens)
        rb.running.set()  # B reads what reached it, then sees the link end
        await until(hb, lambda: hb.down)
        unsent = [t for n, t in ha.unsent_tokens]
        assert {n for n, t in ha.unsent_tokens} == {B_ID}
        received = [body[0] for _, body in hb.items[1:]]
        assert received == list(range(len(received)))  # in order, nothing skipped
        assert unsent and "early" not in unsent and not set(unsent) & set(received)
        first = unsent[0]
        assert unsent == [i for i in range(first, 400) if i % 8 != 7]  # everything from there on
        assert first >= len(received)  # taken by the socket and lost in the close: not handed back
        assert not a.send_item(link, A_ID, encode_data_item("TEST", [0]), watch="late")
        nursery.cancel_scope.cancel()


async def test_a_message_too_big_for_any_frame_is_refused_and_the_link_carries_on():
    from cluster_bus.codec import MAX_BODY

    async with trio.open_nursery() as nursery:
        a, ha, ra, b, hb, rb, link = await connected_pair(nursery)
        assert a.send_data(link, A_ID, "TEST", ["before"])
        assert not a.send_data(link, A_ID, "TEST", [b"x" * MAX_BODY])  # would not frame: refused
        assert a.stats["oversized"] == 1
        assert a.send_data(link, A_ID, "TEST", ["after"])
        a.flush()
        await until(hb, lambda: len(hb.items) == 2)
        assert hb.items == [("TEST", ["before"]), ("TEST", ["after"])]
        nursery.cancel_scope.cancel()


def test_link_errors_are_reported_in_full_once_a_minute_per_peer_and_the_memory_of_it_stays_bounded():
    """An error's reason reaches the handler (which logs it) at most once per REPORT_EVERY per
    address and kind, the next one saying how many came between; the others come without a
    reason (counted only). Links from more addresses than MAX_REPORTED make the bus forget them."""
    from types import SimpleNamespace

    from cluster_bus.links import MAX_REPORTED, REPORT_EVERY

    handler = Handler()
    bus = Bus(handler, host="127.0.0.1", port=0)
    clock = [1000.0]
    bus._now = lambda: clock[0]

    def report(peer: str, kind: str = "frame") -> str:
        bus._report(kind, SimpleNamespace(peer=peer), "bad frame")
        return handler.errors[-1][1]

    assert report("10.0.0.1") == "bad frame"
    assert report("10.0.0.1") == ""
    assert report("10.0.0.1", "auth") == "bad frame"  # another kind: its own report
    assert report("10.0.0.2") == "bad frame"  # another address on the same host's link: its own
    clock[0] += REPORT_EVERY - 1
    assert report("10.0.0.1") == ""
    clock[0] += 1
    assert report("10.0.0.1") == "bad frame; 2 more from this address in the 60 s after the last report"
    assert report("10.0.0.1") == ""
    clock[0] += REPORT_EVERY
    assert report("10.0.0.1") == "bad frame; 1 more from this address in the 60 s after the last report"
    clock[0] += REPORT_EVERY
    assert report("10.0.0.1") == "bad frame"  # none held back since
    assert len(handler.errors) == 9  # every error reaches the handler, to be counted

    for i in range(MAX_REPORTED - len(bus._reported)):
        report("10.1.%d.%d" % divmod(i, 256))
    assert report("10.0.0.1") == ""  # MAX_REPORTED pairs remembered: still known
    assert report("10.9.9.9") == "bad frame"  # one more: everything forgotten, this one remembered
    assert report("10.0.0.1") == "bad frame"
    assert report("10.9.9.9") == ""
    for i in range(5 * MAX_REPORTED):
        report("10.2.%d.%d" % divmod(i, 256))
    assert len(bus._reported) <= MAX_REPORTED


@pytest.mark.parametrize(
    "bind, source",
    [
        ("127.0.0.2", "127.0.0.2"),  # a node bound to one address connects from it
        ("0.0.0.0", "127.0.0.1"),  # bound to every address: the kernel picks
        ("::1", "127.0.0.1"),  # an IPv6 bind address cannot reach an IPv4 peer: not used for it
    ],
)
async def test_outbound_links_connect_from_the_bind_address(bind, source):
    from cluster_bus.links import TcpTransport

    listener = trio.socket.socket()
    await listener.bind(("127.0.0.1", 0))
    listener.listen(1)
    port = listener.getsockname()[1]
    stream = await TcpTransport(local_address=bind).open_connection("127.0.0.1", port)
    try:
        conn, peer = await listener.accept()
        conn.close()
        assert peer[0] == source
    finally:
        await stream.aclose()
        listener.close()
