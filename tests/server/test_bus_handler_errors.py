"""A job-layer message whose handler raises: logged with its traceback, counted, the node serves on.

``CoreFeed`` alone (a stand-in core) shows that the other messages of the
batch are still handled and every effect is carried out; two real ``Server``
s on real ports show the count in CLUSTER INFO and the node going on after
a failing message from a peer.
"""

from __future__ import annotations

import logging

import trio

from disque_py.config import load_config
from disque_py.core.node import Node
from disque_py.server.app import Server
from disque_py.server.cluster import CoreFeed

from ..integration.conftest import free_port

DEADLINE = 10  # seconds: liveness bound, far above what any step needs


class StandInCore:
    def __init__(self) -> None:
        self.handled: list[str] = []
        self.effects: list[str] = []
        self.unknown_kinds: dict[str, int] = {}  # (Node's: the kinds it does not know)

    def receive_data(self, sender: str, kind: str, body, now: int) -> None:
        self.handled.append(kind)
        self.effects.append("effect of " + kind)  # made before the handler fails
        if kind == "BOOM":
            raise RuntimeError("handler bug")


async def test_the_other_messages_are_handled_and_all_effects_applied(caplog):
    core = StandInCore()
    applied: list[list[str]] = []
    after: list[int] = []

    def apply_effects() -> None:
        applied.append(list(core.effects))
        core.effects.clear()

    feed = CoreFeed(core, apply_effects, lambda: after.append(1))  # type: ignore[arg-type]
    with caplog.at_level(logging.ERROR, logger="disque"):
        feed.cluster_data("a" * 40, [("ONE", [1]), ("BOOM", [2]), ("TWO", [3])])
    assert core.handled == ["ONE", "BOOM", "TWO"]
    assert applied == [["effect of ONE", "effect of BOOM", "effect of TWO"]] and after == [1]
    assert feed.handler_errors == 1
    (record,) = [r for r in caplog.records if "BOOM" in r.getMessage()]
    assert record.levelno == logging.ERROR and record.exc_info and "handler bug" in caplog.text
    assert "aaaaaaaa" in record.getMessage()


async def _until(cond) -> None:
    while not cond():
        await trio.sleep(0.01)


async def _command(stream: trio.SocketStream, buf: bytearray, payload: bytes) -> bytes:
    """Send one command; its reply, a line or a bulk string (enough for what is asked here)."""
    await stream.send_all(payload)
    while True:
        if buf.startswith(b"$") and b"\r\n" in buf:
            size = int(buf[1 : buf.index(b"\r\n")])
            end = buf.index(b"\r\n") + 2 + size + 2
        elif b"\r\n" in buf:
            end = buf.index(b"\r\n") + 2
        else:
            end = None
        if end is not None and len(buf) >= end:
            reply = bytes(buf[:end])
            del buf[:end]
            return reply
        chunk = await stream.receive_some(65536)
        assert chunk, "the node closed the connection"
        buf += chunk


async def test_a_failing_handler_is_counted_in_cluster_info_and_the_node_serves_on(tmp_path, caplog, monkeypatch):
    receive_data = Node.receive_data
    handled: list[str] = []

    def failing_on_boom(self, sender, kind, body, now):  # the injected bug, in every node of this process
        handled.append(kind)
        if kind == "BOOM":
            raise RuntimeError("injected handler failure")
        return receive_data(self, sender, kind, body, now)

    monkeypatch.setattr(Node, "receive_data", failing_on_boom)
    servers, ports = [], []
    for name in ("a", "b"):
        port = free_port()
        (tmp_path / name).mkdir()
        config = load_config(None, ["--port", str(port), "--dir", str(tmp_path / name), "--bind", "127.0.0.1"])
        servers.append(Server(config))
        ports.append(port)
    a, b = servers
    with trio.fail_after(DEADLINE):
        async with trio.open_nursery() as nursery:
            for server in servers:
                await nursery.start(server.run)
            to_b = await trio.open_tcp_stream("127.0.0.1", ports[1])
            buf = bytearray()
            assert await _command(to_b, buf, b"CLUSTER MEET 127.0.0.1 %d\r\n" % ports[0]) == b"+OK\r\n"
            await _until(lambda: a.node.id in b.node.ctx.reachable and b.node.id in a.node.ctx.reachable)
            info = await _command(to_b, buf, b"CLUSTER INFO\r\n")
            assert b"cluster_stats_handler_errors:0\r\n" in info
            assert b"cluster_stats_messages_malformed:0\r\n" in info

            bus = a.cluster.bus
            bus.hold()  # the three leave in one frame: one call into b's core
            for kind in ("BEFORE", "BOOM", "AFTER"):
                assert a.cluster.send_data(b.node.id, kind, [1])
            with caplog.at_level(logging.WARNING, logger="disque"):
                bus.release()
                await _until(lambda: "AFTER" in handled)
                assert handled[-3:] == ["BEFORE", "BOOM", "AFTER"]
                assert "injected handler failure" in caplog.text and "Traceback" in caplog.text
                for _ in range(2):  # a kind logged already is only counted
                    assert a.cluster.send_data(b.node.id, "BEFORE", [2, "a newer field"])
                await _until(lambda: handled.count("BEFORE") == 3)
            # BEFORE and AFTER are kinds no node knows (a newer release's?): dropped, counted, each logged once
            told = [r.getMessage() for r in caplog.records if "a kind this release" in r.getMessage()]
            assert len(told) == 2 and "'BEFORE'" in told[0] and "'AFTER'" in told[1], told
            assert a.node.id[:8] in told[0] and "cluster_stats_messages_unknown" in told[0]

            info = await _command(to_b, buf, b"CLUSTER INFO\r\n")
            assert b"cluster_stats_handler_errors:1\r\n" in info
            assert b"cluster_stats_messages_unknown:4\r\n" in info
            assert b"cluster_stats_messages_malformed:0\r\n" in info  # (the nodes' announcements: not here)
            assert b.feed.handler_errors == 1 and a.feed.handler_errors == 0
            # b serves on: clients and the bus
            assert (await _command(to_b, buf, b"ADDJOB q body 0 REPLICATE 2\r\n")).startswith(b"+D-")
            assert await _command(to_b, buf, b"QLEN q\r\n") == b":1\r\n"
            await to_b.aclose()
            for server in servers:
                server.request_shutdown()
