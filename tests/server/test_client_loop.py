"""The client loop, in process: a real ``Server`` on a real port, driven by trio sockets.

Only what a node process cannot show from outside is tested here: a failure
injected into one client's handling (nothing in the product raises there
today) must cost that client its connection, not the node.
"""

from __future__ import annotations

import logging
import socket

import trio

from disque_py.config import load_config
from disque_py.server.app import Server

from ..integration.conftest import free_port

DEADLINE = 10  # seconds: liveness bound, far above what any step needs


async def _request(stream: trio.SocketStream, payload: bytes) -> bytes:
    """Send ``payload`` and read until a full line arrives (or the node closes the link: b"")."""
    await stream.send_all(payload)
    data = b""
    while not data.endswith(b"\r\n"):
        chunk = await stream.receive_some(65536)
        if not chunk:
            return data
        data += chunk
    return data


async def test_an_exception_in_one_clients_handling_closes_only_that_client(tmp_path, caplog):
    port = free_port()
    config = load_config(None, ["--port", str(port), "--dir", str(tmp_path), "--bind", "127.0.0.1"])
    server = Server(config)
    run_commands = server.dispatcher.run_commands

    def failing(conn, commands):  # the injected bug: raises outside command dispatch
        if any(argv[0] == b"BOOM" for argv in commands):
            raise RuntimeError("injected failure")
        return run_commands(conn, commands)

    server.loop._run_commands = failing  # what the loop bound at construction
    with trio.fail_after(DEADLINE):
        async with trio.open_nursery() as nursery:
            await nursery.start(server.run)
            good = await trio.open_tcp_stream("127.0.0.1", port)
            bad = await trio.open_tcp_stream("127.0.0.1", port)
            assert await _request(good, b"PING\r\n") == b"+PONG\r\n"
            with caplog.at_level(logging.ERROR):
                assert await _request(bad, b"PING\r\nBOOM\r\n") == b""  # closed, nothing answered
            assert server.stats["internal_errors"] == 1
            assert "Internal error serving client" in caplog.text and "injected failure" in caplog.text
            assert (await _request(good, b"ADDJOB q body 0\r\n")).startswith(b"+D-")
            assert await _request(good, b"PING\r\n") == b"+PONG\r\n"
            assert len(server.clients) == 1 and len(server.loop.by_fd) == 1
            await good.aclose()
            await bad.aclose()
            server.request_shutdown()


async def test_a_bus_link_that_registers_after_the_client_loop_ended_does_not_fail_shutdown(tmp_path):
    """At shutdown the client loop's task may end before a bus link accepted at that moment has
    registered its socket with the loop (seen: a traceback and exit code 1). Here the cluster
    task does exactly that, after the loop's task is over; the node must still stop cleanly."""
    port = free_port()
    config = load_config(None, ["--port", str(port), "--dir", str(tmp_path), "--bind", "127.0.0.1"])
    server = Server(config)
    loop_over = trio.Event()
    loop_run, cluster_run = server.loop.run, server.cluster.run
    late = socket.socketpair()

    async def loop_then_signal():
        try:
            await loop_run()
        finally:
            loop_over.set()

    async def cluster_then_late_link(every_period=None, *, task_status=trio.TASK_STATUS_IGNORED):
        try:
            await cluster_run(every_period, task_status=task_status)
        finally:
            with trio.CancelScope(shield=True):
                await loop_over.wait()
                server.loop.add_fd(late[0].fileno(), lambda: None, lambda: None)  # as Bus._run_in_reactor
                server.loop.want_writable(late[0].fileno(), True)
                server.loop.remove_fd(late[0].fileno())

    server.loop.run = loop_then_signal
    server.cluster.run = cluster_then_late_link
    try:
        with trio.fail_after(DEADLINE):
            async with trio.open_nursery() as nursery:
                await nursery.start(server.run)
                assert await _request(await trio.open_tcp_stream("127.0.0.1", port), b"PING\r\n") == b"+PONG\r\n"
                server.request_shutdown()
        assert loop_over.is_set()
    finally:
        for s in late:
            s.close()


class _RecordingEpoll:
    """An epoll that records the timeout of every ``poll``."""

    def __init__(self, ep) -> None:
        self._ep = ep
        self.timeouts: list[float] = []

    def poll(self, timeout=-1, *args):
        self.timeouts.append(timeout)
        return self._ep.poll(timeout, *args)

    def __getattr__(self, name):
        return getattr(self._ep, name)


def _record_ticks(server: Server) -> list[str]:
    """Wrap the server's core tick to record which trio task ran each one."""
    tick = server.timers._tick
    tasks: list[str] = []

    def recording() -> None:
        tasks.append(trio.lowlevel.current_task().name)
        tick()

    server.timers._tick = recording
    return tasks


async def test_the_core_timers_run_in_the_client_loop_and_go_back_to_their_task_when_it_falls_back(tmp_path):
    """While the loop waits in its own epoll it runs the core's timers itself (no trio task
    switch per timer); once it must wait through trio (here: a second server in the same trio
    run), the timer task runs them again. Either way a GETJOB TIMEOUT ends on time."""
    servers, ticks, ports = [], [], []
    for name in ("one", "two"):
        port = free_port()
        (tmp_path / name).mkdir()
        config = load_config(None, ["--port", str(port), "--dir", str(tmp_path / name), "--bind", "127.0.0.1"])
        server = Server(config)
        servers.append(server)
        ticks.append(_record_ticks(server))
        ports.append(port)
    timeout_reply = b"*-1\r\n"
    direct = servers[0].loop.direct
    direct.ep = _RecordingEpoll(direct.ep)  # what the loop's direct waits block for
    with trio.fail_after(DEADLINE):
        async with trio.open_nursery() as nursery:
            await nursery.start(servers[0].run)
            one = await trio.open_tcp_stream("127.0.0.1", ports[0])
            assert await _request(one, b"GETJOB TIMEOUT 50 FROM q\r\n") == timeout_reply
            assert servers[0].loop.direct.active and servers[0].timers.loop_runs_timers
            assert ticks[0] and all("ClientLoop.run" in t for t in ticks[0])
            # a direct wait was bounded by the GETJOB's 50 ms, not only by trio's deadlines
            assert any(0 < timeout <= 0.05 for timeout in direct.ep.timeouts), direct.ep.timeouts

            await nursery.start(servers[1].run)  # two loops in one run: both wait through trio
            two = await trio.open_tcp_stream("127.0.0.1", ports[1])
            assert await _request(two, b"PING\r\n") == b"+PONG\r\n"
            assert not servers[0].loop.direct.active and not servers[0].timers.loop_runs_timers
            del ticks[0][:]
            for stream in (one, two):
                assert await _request(stream, b"GETJOB TIMEOUT 50 FROM q\r\n") == timeout_reply
            for recorded in ticks:
                assert recorded and all("CoreTimers.run" in t for t in recorded)
            for stream in (one, two):
                await stream.aclose()
            for server in servers:
                server.request_shutdown()
