"""Clusters of real node processes, created and joined with the CLI."""

from __future__ import annotations

import os
import signal
import socket
import struct
import subprocess
import sys

import pytest
import redis

from disque_py.cli import launcher

from .conftest import NodeProcess, consecutive_free_ports, fail_unclean, unclean, wait_for

pytestmark = pytest.mark.integration


def cluster_info(r: redis.Redis) -> dict[str, str]:
    text = r.execute_command("CLUSTER", "INFO").decode()
    return dict(line.split(":", 1) for line in text.split("\r\n") if ":" in line)


def flags_of(r: redis.Redis, node_id: str) -> str:
    for line in r.execute_command("CLUSTER", "NODES").decode().splitlines():
        if line.startswith(node_id):
            return line.split()[2]
    return "unknown"


@pytest.fixture
def created(tmp_path):
    """`disque-py cluster create` in a temp dir; everything stopped afterwards."""
    procs_dirs: list[tuple[int, str]] = []

    def create(n: int, *extra: str) -> list[int]:
        base = consecutive_free_ports(n)
        out = subprocess.run(
            [sys.executable, "-m", "disque_py.cli", "cluster", "create", "--nodes", str(n), "--base-port", str(base),
             "--dir", str(tmp_path / "run"), *extra],
            capture_output=True, text=True, timeout=120,
        )  # fmt: skip
        assert out.returncode == 0, out.stdout + out.stderr
        assert "full mesh" in out.stdout
        ports = [base + i for i in range(n)]
        procs_dirs.extend((p, str(tmp_path / "run" / ("node-%d" % p))) for p in ports)
        return ports

    yield create
    problems = []
    for port, d in procs_dirs:
        try:
            pid = int(open(os.path.join(d, "disque.pid")).read())
        except (OSError, ValueError):
            continue  # never started, or gone and its pid file with it
        stopped = launcher.stop(pid, port=port)
        problems.append(unclean("node on port %d" % port, stopped, launcher.tail([os.path.join(d, "node.log")], 40)))
    fail_unclean(problems)


def test_create_three_and_hello(created):
    ports = created(3)
    for p in ports:
        r = redis.Redis(port=p)
        info = cluster_info(r)
        assert info["cluster_known_nodes"] == "3" and info["cluster_reachable_nodes"] == "2"
        assert info["cluster_size"] == "3" and info["cluster_state"] == "ok"
        hello = r.execute_command("HELLO")
        assert hello[0] == 1 and len(hello) == 5
        assert sorted(int(e[2]) for e in hello[2:]) == ports
        lines = r.execute_command("CLUSTER", "NODES").decode().splitlines()
        assert len(lines) == 3
        me = [line for line in lines if "myself" in line.split()[2]]
        assert len(me) == 1 and me[0].split()[0] == r.execute_command("CLUSTER", "MYID").decode()
        # job commands still work with other nodes around
        assert r.execute_command("ADDJOB", "q", "x", 0, "REPLICATE", 1)


def _forget(node_id, address: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "disque_py.cli", "cluster", "forget", node_id, address],
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip


def test_cluster_forget_command_removes_a_dead_node_from_every_table(created, tmp_path):
    ports = created(4)

    def kill(port: int) -> None:
        os.kill(int((tmp_path / "run" / ("node-%d" % port) / "disque.pid").read_text()), signal.SIGKILL)

    dead = ports[2]
    dead_id = redis.Redis(port=dead).execute_command("CLUSTER", "MYID").decode()
    kill(dead)
    kill(ports[3])  # down too: it cannot be asked
    out = _forget(dead_id, "127.0.0.1:%d" % ports[0])
    assert out.returncode == 1, out.stdout + out.stderr
    lines = out.stdout.splitlines()
    assert lines[0].endswith("127.0.0.1:%d: forgot it" % ports[0])  # the node asked goes first
    assert any(line.endswith("127.0.0.1:%d: forgot it" % ports[1]) for line in lines)
    assert any("127.0.0.1:%d: FAILED" % ports[3] in line for line in lines)
    assert "1 node(s) could not forget" in out.stderr
    for p in ports[:2]:
        assert dead_id.encode() not in redis.Redis(port=p).execute_command("CLUSTER", "NODES")
    # forgetting the other dead node too; then the first one again: nothing left to do
    other_id = [line.split()[0] for line in out.stdout.splitlines() if "FAILED" in line][0]
    done = _forget(other_id, "127.0.0.1:%d" % ports[1])
    assert done.returncode == 0 and done.stdout.splitlines()[-1] == "2 of 2 node(s) forgot %s" % other_id, done.stdout
    again = _forget(dead_id, "127.0.0.1:%d" % ports[1])  # forgotten everywhere already (or a typo)
    assert again.returncode == 1 and again.stdout.count("did not know it") == 2, again.stdout
    assert "no node knew %s" % dead_id in again.stderr
    me = redis.Redis(port=ports[0]).execute_command("CLUSTER", "MYID").decode()
    itself = _forget(me, "127.0.0.1:%d" % ports[0])
    assert itself.returncode == 1 and "ask another node" in itself.stderr
    bad = _forget("abc", "127.0.0.1:%d" % ports[0])
    assert bad.returncode == 2 and "40 characters" in bad.stderr


def test_kill9_fail_then_restart_with_same_identity(created, tmp_path):
    ports = created(3, "--node-timeout", "1500")
    victim_port = ports[2]
    victim_dir = tmp_path / "run" / ("node-%d" % victim_port)
    r0 = redis.Redis(port=ports[0])
    victim_id = redis.Redis(port=victim_port).execute_command("CLUSTER", "MYID").decode()
    pid = int((victim_dir / "disque.pid").read_text())
    os.kill(pid, signal.SIGKILL)
    wait_for(lambda: flags_of(r0, victim_id) == "fail", timeout=20, what="victim FAIL")
    assert flags_of(redis.Redis(port=ports[1]), victim_id) in ("fail", "fail?")
    hello = r0.execute_command("HELLO")
    assert {e[0].decode(): e[3] for e in hello[2:]}[victim_id] == b"100"
    # restart with the same dir: same ID, same peers, flags clear everywhere
    node = NodeProcess(tmp_path / "again", port=victim_port, dir=str(victim_dir), cluster_node_timeout=1500)
    node.start()
    try:
        assert node.client().execute_command("CLUSTER", "MYID").decode() == victim_id
        wait_for(lambda: flags_of(r0, victim_id) == "noflags", timeout=20, what="FAIL cleared")
        wait_for(lambda: cluster_info(node.client())["cluster_reachable_nodes"] == "2", timeout=20, what="rejoined")
    finally:
        node.stop()


def test_bus_garbage_is_counted_and_harmless(created):
    ports = created(2)
    r = redis.Redis(port=ports[0])
    bus = ports[0] + 10000
    for payload in (
        os.urandom(512),
        struct.pack(">I", 2**31) + b"x" * 10,  # frame over the limit
        struct.pack(">I", 100) + b"\x93\x01\x00",  # truncated, then closed
        struct.pack(">I", 3) + b"\x93\x09\x09",  # well framed, wrong version
        b"\x00\x00\x00\x00",  # zero-length frame
    ):
        with socket.create_connection(("127.0.0.1", bus), timeout=5) as s:
            s.sendall(payload)
            s.settimeout(5)
            try:
                s.recv(10)
            except OSError:
                pass
    wait_for(lambda: int(cluster_info(r)["cluster_stats_bad_frames"]) >= 3, timeout=10, what="bad frames counted")
    assert r.execute_command("QLEN", "q") == 0
    assert cluster_info(r)["cluster_reachable_nodes"] == "1"


def test_wrong_secret_cannot_join(created, tmp_path):
    ports = created(2, "--secret", "right")
    outsider = NodeProcess(tmp_path / "out", cluster_secret="wrong").start()
    try:
        r = redis.Redis(port=ports[0])
        r.execute_command("CLUSTER", "MEET", "127.0.0.1", outsider.port)
        wait_for(lambda: int(cluster_info(r)["cluster_stats_auth_failures"]) >= 1, timeout=15, what="auth failure")
        # the outsider stays a handshake entry at most (until the handshake times out)
        assert cluster_info(r)["cluster_reachable_nodes"] == "1"
        assert all(
            "handshake" in line.split()[2] or line.split()[0] in {r.execute_command("CLUSTER", "MYID").decode()}
            or "127.0.0.1:%d" % outsider.port not in line
            for line in r.execute_command("CLUSTER", "NODES").decode().splitlines()
        )
        assert cluster_info(outsider.client())["cluster_reachable_nodes"] == "0"
        assert "failed authentication" in open(tmp_path / "run" / ("node-%d" % ports[0]) / "node.log").read()
    finally:
        outsider.stop()


def test_cli_meet_and_forget(start_node):
    a, b, c = start_node(), start_node(), start_node()
    out = subprocess.run(
        [sys.executable, "-m", "disque_py.cli", "cluster", "meet"]
        + ["127.0.0.1:%d" % n.port for n in (a, b, c)],
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert out.returncode == 0, out.stderr
    c_id = c.client().execute_command("CLUSTER", "MYID")
    for n in (a, b):
        assert n.client().execute_command("CLUSTER", "FORGET", c_id) in (b"OK", True)
    assert cluster_info(a.client())["cluster_known_nodes"] == "2"
    assert redis.Redis(port=a.port).execute_command("CLUSTER", "LEAVING") == b"no"


def test_nodes_bound_to_other_loopback_addresses_connect_from_them(start_node):
    """Each node listens on its own address (``bind``) and connects to its peers from it, as
    Disque does: a peer learns where to reach a node from where its MEET and PINGs come from.
    Before, the kernel picked 127.0.0.1 as the source, where nothing listens, and B's handshake
    back to A never completed."""
    a = start_node(bind="127.0.0.2")
    b = start_node(bind="127.0.0.3")
    ra, rb = a.client(), b.client()
    ids = {ra.execute_command("CLUSTER", "MYID").decode(): "127.0.0.2:%d" % a.port,
           rb.execute_command("CLUSTER", "MYID").decode(): "127.0.0.3:%d" % b.port}  # fmt: skip
    assert ra.execute_command("CLUSTER", "MEET", "127.0.0.3", b.port) == b"OK"

    def views_agree() -> bool:
        for r in (ra, rb):
            rows = [line.split() for line in r.execute_command("CLUSTER", "NODES").decode().splitlines()]
            if {row[0]: row[1] for row in rows} != ids or any(row[5] != "connected" for row in rows):
                return False
        return True

    wait_for(views_agree, timeout=15, what="both nodes knowing each other at their bind addresses")
    job_id = rb.execute_command("ADDJOB", "q", "body", 5000, "REPLICATE", 2)
    assert ra.execute_command("SHOW", job_id) is not None


def test_the_bus_listens_on_every_bind_address(start_node):
    """A node bound to two addresses accepts bus links on both, as its client port does (and as
    Disque does): a peer that can only reach the second one still meets it. Its own links leave
    from the first address, which is where the peer then reaches it."""
    a = start_node(bind=("127.0.0.2", "127.0.0.4"))
    b = start_node(bind="127.0.0.3")
    ra, rb = a.client(), b.client()
    assert redis.Redis(host="127.0.0.4", port=a.port).ping()  # the client port answers on both
    assert rb.execute_command("CLUSTER", "MEET", "127.0.0.4", a.port) == b"OK"

    def connected() -> bool:
        for r in (ra, rb):
            rows = [line.split() for line in r.execute_command("CLUSTER", "NODES").decode().splitlines()]
            if len(rows) != 2 or any(row[5] != "connected" for row in rows):
                return False
        return True

    wait_for(connected, timeout=15, what="A and B linked, B having met A at A's second bind address")

    def replicated() -> bytes | None:  # the core may learn of the link a moment after CLUSTER NODES shows it
        try:
            return ra.execute_command("ADDJOB", "q", "body", 5000, "REPLICATE", 2)
        except redis.ResponseError as exc:
            if str(exc).startswith("NOREPL"):
                return None
            raise

    job_id = wait_for(replicated, timeout=15, what="a job replicated to B")
    assert rb.execute_command("SHOW", job_id) is not None
    assert "Cluster bus listening on 127.0.0.2, 127.0.0.4 port %d" % (a.port + 10000) in a.log()

