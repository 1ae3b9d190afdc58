"""Bad and greedy HTTP clients: each is answered or closed, and the client port answers PING
all along (within a deadline: correctness, not speed)."""

from __future__ import annotations

import socket
import threading
import time

import pytest
import redis

from disque_py.server.web import MAX_CONNECTIONS, READ_TIMEOUT
from tests.integration.conftest import wait_for

from .conftest import admin_port, http, ping_within

pytestmark = pytest.mark.integration


def exchange(port: int, data: bytes, timeout: float = 15, *, host: str = "127.0.0.1",
             until=None) -> tuple[bytes, bool]:
    """Send ``data``, read until the node closes, or until ``until(got)`` is true: (what came
    back, whether the node closed the link)."""
    with socket.create_connection((host, port), timeout=timeout) as s:
        s.sendall(data)
        got = b""
        while True:
            try:
                chunk = s.recv(65536)
            except ConnectionResetError:
                return got, True
            except socket.timeout:
                return got, False
            if not chunk:
                return got, True
            got += chunk
            if until is not None and until(got):
                return got, False


@pytest.mark.parametrize("request_bytes", [
    b"this is not http\r\n\r\n",
    b"GET / HTTP/1.1\r\nHost: x\r\nBad Header Without Colon\r\n\r\n",
    b"POST /api/queues/q/pause HTTP/1.1\r\nHost: x\r\nContent-Length: abc\r\n\r\n",
    b"\x16\x03\x01\x02\x00\x01\x00\x01\xfc\x03\x03" + b"\x00" * 64,  # a TLS hello on the plain port
])  # fmt: skip
def test_malformed_http_gets_400_and_a_close(admin_node, request_bytes):
    got, closed = exchange(admin_port(admin_node), request_bytes)
    assert closed, got
    assert got == b"" or got.startswith(b"HTTP/1.1 400"), got
    if request_bytes.startswith(b"this"):
        assert got.startswith(b"HTTP/1.1 400"), got
    ping_within(admin_node)
    assert http(admin_port(admin_node), "GET", "/healthz").status == 200


def test_oversized_headers_are_refused_and_closed(admin_node):
    big = b"GET /healthz HTTP/1.1\r\nHost: x\r\nX-Big: " + b"a" * 100_000 + b"\r\n\r\n"
    got, closed = exchange(admin_port(admin_node), big)
    assert closed
    assert got.startswith((b"HTTP/1.1 431", b"HTTP/1.1 400")), got[:100]
    ping_within(admin_node)
    assert http(admin_port(admin_node), "GET", "/healthz").status == 200


def test_a_slow_client_is_closed_after_the_read_timeout(admin_node):
    port = admin_port(admin_node)
    with socket.create_connection(("127.0.0.1", port), timeout=READ_TIMEOUT * 4) as s:
        s.sendall(b"GET /healthz HTTP/1.1\r\nHo")  # and nothing more
        t0 = time.monotonic()
        ping_within(admin_node)  # the client port is not held up meanwhile
        assert http(port, "GET", "/healthz").status == 200  # nor are other HTTP clients
        try:
            data = s.recv(65536)
        except ConnectionResetError:
            data = b""
        waited = time.monotonic() - t0
    assert not data.startswith(b"HTTP/1.1 200"), data
    assert waited < READ_TIMEOUT * 3, "a stalled request kept its connection %.1f s" % waited


def test_a_connection_flood_is_capped_and_the_client_port_still_answers(admin_node):
    port = admin_port(admin_node)
    extra = 40
    socks = []
    try:
        for _ in range(MAX_CONNECTIONS + extra):
            s = socket.create_connection(("127.0.0.1", port), timeout=10)
            socks.append(s)
        ping_within(admin_node)

        def closed_by_node(s: socket.socket) -> bool:
            s.settimeout(0.01)
            try:
                return s.recv(1) == b""
            except socket.timeout:
                return False
            except ConnectionResetError:
                return True

        closed = set()

        def enough_closed():
            for i, s in enumerate(socks):
                if i not in closed and closed_by_node(s):
                    closed.add(i)
            return len(closed) >= extra

        wait_for(enough_closed, timeout=READ_TIMEOUT, what="the connections over the cap closed")
        ping_within(admin_node)
    finally:
        for s in socks:
            s.close()
    wait_for(lambda: http(admin_port(admin_node), "GET", "/healthz").status == 200, what="served again")


def test_http_is_served_while_the_client_port_is_busy(admin_node):
    port = admin_port(admin_node)
    stop = threading.Event()
    errors = []

    def hammer():
        try:
            c = redis.Redis(host=admin_node.host, port=admin_node.port, socket_timeout=10)
            while not stop.is_set():
                p = c.pipeline(transaction=False)
                for _ in range(200):
                    p.execute_command("ADDJOB", "busy", "x", 0)
                p.execute()
                c.execute_command("GETJOB", "NOHANG", "COUNT", 200, "FROM", "busy")
        except Exception as exc:  # noqa: BLE001
            errors.append(exc)

    threads = [threading.Thread(target=hammer) for _ in range(2)]
    for t in threads:
        t.start()
    try:
        wait_for(lambda: isinstance(admin_node.client().execute_command("QLEN", "busy"), int) and
                 http(port, "GET", "/metrics").status == 200, what="metrics while busy")  # fmt: skip
        for _ in range(5):
            assert http(port, "GET", "/api/queues", timeout=5).status == 200
            assert http(port, "GET", "/healthz", timeout=5).status == 200
    finally:
        stop.set()
        for t in threads:
            t.join(10)
    assert not errors, errors
    # and idle: the client loop waits in its own epoll; an HTTP request still wakes the node
    assert http(port, "GET", "/healthz", timeout=5).status == 200
