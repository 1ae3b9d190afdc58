"""Protected mode on real node processes: with no bind and no password, loopback only.

A node started without ``bind`` listens on every interface, so a client that
connects to this machine's own non-loopback address (eth0's, say) reaches it with
that address as its peer: the node must see a stranger and refuse it with one
``-DENIED`` line, then close the link, while loopback clients are served. Any of
``bind``, ``requirepass`` or ``protected-mode no`` (at start or with CONFIG SET)
lets the stranger in.
"""

from __future__ import annotations

import ipaddress
import re
import socket
import subprocess
import time

import pytest
import redis

from disque_py.config import config_set, load_config
from disque_py.server.protection import DENIED, is_loopback, protected, startup_note

from .conftest import wait_for


def _candidates() -> list[str]:
    found: list[str] = []
    try:
        out = subprocess.run(["ip", "-o", "-4", "addr", "show"], capture_output=True, text=True, timeout=10).stdout
        found += re.findall(r"\binet (\d+\.\d+\.\d+\.\d+)/", out)
    except (OSError, subprocess.SubprocessError):
        pass
    try:  # the address the default route would use (no packet is sent)
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
            s.connect(("192.0.2.1", 9))
            found.append(s.getsockname()[0])
    except OSError:
        pass
    return found


def _peer_seen_from(addr: str) -> str | None:
    """The peer address a listener on every interface sees for a client connecting to ``addr``."""
    with socket.socket() as server:
        server.bind(("0.0.0.0", 0))
        server.listen(1)
        port = server.getsockname()[1]
        with socket.create_connection((addr, port), timeout=5):
            conn, peer = server.accept()
            conn.close()
    return peer[0]


def non_loopback_address() -> str | None:
    """One of this machine's IPv4 addresses that is not loopback and that a local client reaches
    with a non-loopback peer address, or None."""
    for addr in _candidates():
        try:
            if ipaddress.ip_address(addr).is_loopback:
                continue
            peer = _peer_seen_from(addr)
        except (OSError, ValueError):
            continue
        if peer and not ipaddress.ip_address(peer).is_loopback:
            return addr
    return None


@pytest.fixture(scope="module")
def outside() -> str:
    addr = non_loopback_address()
    if addr is None:
        pytest.skip("this machine has no non-loopback IPv4 address to connect from")
    return addr


def exchange(host: str, port: int, send: bytes = b"", timeout: float = 10) -> tuple[bytes, bool]:
    """Connect, send ``send``, read until the node closes the link or a full line arrives after
    ``send`` was answered. Returns (what was read, whether the node closed the link)."""
    with socket.create_connection((host, port), timeout=timeout) as s:
        if send:
            s.sendall(send)
        data = b""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            try:
                chunk = s.recv(65536)
            except ConnectionResetError:
                return data, True
            except socket.timeout:
                break
            if not chunk:
                return data, True
            data += chunk
            if send and data.endswith(b"\r\n"):
                return data, False
        return data, False


def assert_denied(host: str, port: int) -> None:
    data, closed = exchange(host, port)
    assert closed, "the node kept a refused client's link open"
    assert data.startswith(b"-DENIED ") and data.endswith(b"\r\n"), data
    line = data[:-2]
    assert b"\r" not in line and b"\n" not in line, "the refusal must be one line"
    for way_out in (b"bind", b"requirepass", b"CONFIG SET protected-mode no", b"--protected-mode no"):
        assert way_out in line, way_out


def assert_served(host: str, port: int) -> None:
    data, closed = exchange(host, port, b"PING\r\n")
    assert data == b"+PONG\r\n", (data, closed)


def test_without_bind_or_password_strangers_are_denied_and_loopback_is_served(start_node, outside):
    node = start_node(bind=None)
    assert_denied(outside, node.port)
    assert_served("127.0.0.1", node.port)
    c = node.client()
    assert c.ping()
    stats = c.info("stats")
    assert stats["rejected_connections"] == 1
    # the node keeps serving the outside after a refusal: the next stranger is refused the same way
    assert_denied(outside, node.port)
    assert c.info("stats")["rejected_connections"] == 2
    assert c.config_get("protected-mode") == {"protected-mode": "yes"}
    assert "Protected mode is on" in node.log()


def test_a_redis_client_from_outside_reads_the_denial(start_node, outside):
    node = start_node(bind=None)
    for _ in range(20):  # the client writes at once: the line must still reach it, every time
        c = redis.Redis(host=outside, port=node.port, socket_timeout=10)
        with pytest.raises(redis.ResponseError, match="^DENIED .*protected mode"):
            c.ping()


def test_an_explicit_bind_lets_strangers_in(start_node, outside):
    node = start_node(bind=("127.0.0.1", outside))
    assert_served(outside, node.port)
    assert_served("127.0.0.1", node.port)
    assert "Protected mode is on" not in node.log()


def test_a_password_lets_strangers_in_to_authenticate(start_node, outside):
    node = start_node(bind=None, requirepass="s3cret")
    data, closed = exchange(outside, node.port, b"PING\r\n")
    assert data.startswith(b"-NOAUTH"), data
    data, closed = exchange(outside, node.port, b"AUTH s3cret\r\nPING\r\n")
    assert data.startswith(b"+OK\r\n"), data
    assert "Protected mode is on" not in node.log()


def test_a_default_user_with_a_password_lets_strangers_in_to_authenticate(start_node, outside):
    node = start_node(bind=None, user=("default", "on", ">s3cret", "allkeys", "+@all"))
    data, closed = exchange(outside, node.port, b"PING\r\n")
    assert data.startswith(b"-NOAUTH"), data
    data, closed = exchange(outside, node.port, b"AUTH default s3cret\r\nPING\r\n")
    assert data.startswith(b"+OK\r\n+PONG"), data
    assert "Protected mode is on" not in node.log()


def test_a_named_user_does_not_end_it_while_default_needs_no_password(start_node, outside):
    node = start_node(bind=None, user=("alice", "on", ">pw", "allkeys", "+@all"))
    assert_denied(outside, node.port)


def test_protected_mode_no_at_start_lets_strangers_in(start_node, outside):
    node = start_node(bind=None, protected_mode="no")
    assert_served(outside, node.port)
    assert "Protected mode is on" not in node.log()


def test_config_set_from_loopback_opens_and_closes_it_at_runtime(start_node, outside):
    node = start_node(bind=None)
    c = node.client()
    assert_denied(outside, node.port)
    assert c.config_set("protected-mode", "no")
    assert_served(outside, node.port)
    assert c.config_set("protected-mode", "yes")
    assert_denied(outside, node.port)
    # a password set at runtime ends it as well
    assert c.config_set("requirepass", "later")
    data, _ = exchange(outside, node.port, b"PING\r\n")
    assert data.startswith(b"-NOAUTH"), data
    with pytest.raises(redis.ResponseError, match="Invalid argument 'maybe' for CONFIG SET 'protected-mode'"):
        c.config_set("protected-mode", "maybe")


def test_a_client_already_connected_is_not_cut_off_by_turning_it_on(start_node, outside):
    # The check is made once, when a client connects: one let in stays.
    node = start_node(bind=None, protected_mode="no")
    with socket.create_connection((outside, node.port), timeout=10) as s:
        node.client().config_set("protected-mode", "yes")
        s.sendall(b"PING\r\n")
        assert wait_for(lambda: s.recv(64), timeout=10, what="PONG") == b"+PONG\r\n"
    assert_denied(outside, node.port)


def test_the_bus_without_a_secret_warns_once_at_start(start_node):
    plain = start_node()
    assert plain.log().count("unauthenticated and in clear text") == 1
    secret = start_node(cluster_secret="shared")
    assert "unauthenticated and in clear text" not in secret.log()


# --- the rule itself, without a process ---------------------------------------------------


@pytest.mark.parametrize("peer, local", [
    (("127.0.0.1", 5000), True),
    (("127.8.9.10", 5000), True),
    (("::1", 5000, 0, 0), True),
    (("::ffff:127.0.0.1", 5000, 0, 0), True),
    ("", True),  # a unix socket's peer
    ("/tmp/disque.sock", True),
    (("192.0.2.7", 5000), False),
    (("10.0.0.1", 5000), False),
    (("::ffff:10.0.0.1", 5000, 0, 0), False),
    (("fe80::1%eth0", 5000, 0, 2), False),
    (("fd00::2", 5000, 0, 0), False),
    (("not an address", 1), False),
    ((), False),
])  # fmt: skip
def test_is_loopback(peer, local):
    assert is_loopback(peer) is local


def test_protected_only_when_nobody_secured_the_node():
    assert protected(load_config(None, []))
    assert not protected(load_config(None, ["--bind", "0.0.0.0"]))  # an explicit choice, as in Redis
    assert not protected(load_config(None, ["--requirepass", "x"]))
    assert not protected(load_config(None, ["--protected-mode", "no"]))
    cfg = load_config(None, [])
    config_set(cfg, b"protected-mode", b"no")
    assert not protected(cfg)
    config_set(cfg, b"protected-mode", b"yes")
    assert protected(cfg) and startup_note(cfg)
    config_set(cfg, b"requirepass", b"x")
    assert not protected(cfg) and startup_note(cfg) is None
    assert DENIED.startswith(b"-DENIED ") and DENIED.endswith(b"\r\n") and DENIED.count(b"\n") == 1
