"""Admin and connection commands, operator logs, and scripts/cluster, on real processes."""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import sys

import pytest
import redis

from .conftest import ROOT, consecutive_free_ports, read_reply, wait_for
from .test_node_process import raw

pytestmark = pytest.mark.integration


def test_info_sections_and_fields(node):
    r = node.client()
    r.execute_command("ADDJOB", "q", "b", 0)
    for section, fields in {
        "server": ["disque_version", "process_id", "run_id", "tcp_port", "uptime_in_seconds", "config_file"],
        "clients": ["connected_clients", "blocked_clients"],
        "memory": ["used_memory", "used_memory_human", "maxmemory", "maxmemory_policy", "timer_heap_entries"],
        "jobs": ["registered_jobs"],
        "queues": ["registered_queues", "push_leases"],
        "persistence": ["aof_enabled", "aof_state", "loading"],
        "stats": ["total_connections_received", "total_commands_processed", "instantaneous_ops_per_sec",
                  "rejected_connections", "protocol_errors"],
    }.items():  # fmt: skip
        info = r.info(section)
        for field in fields:
            assert field in info, (section, field)
    assert r.info("memory")["timer_heap_entries"] >= 1  # the job's wake-up
    reply = raw(node.port, b"INFO jobs\r\n", replies=1)
    assert reply == b"$27\r\n# Jobs\r\nregistered_jobs:1\r\n\r\n"
    assert r.info("server")["run_id"] == r.execute_command("HELLO")[1].decode()
    assert r.info("server")["tcp_port"] == node.port
    with pytest.raises(redis.ResponseError, match="^syntax error near 'b': INFO takes one section$"):
        r.execute_command("INFO", "a", "b")


def test_the_shell_commands_syntax_errors_name_the_word(node):
    r = node.client()
    cases = [
        (("SHUTDOWN", "nosve"), "syntax error near 'nosve': SHUTDOWN takes SAVE, NOSAVE or REWRITE-AOF"),
        (("SHUTDOWN", "nosave", "now"), "syntax error near 'now': SHUTDOWN takes SAVE, NOSAVE or REWRITE-AOF"),
        (("CLIENT", "KILL", "ID", "7", "SKIPME"),
         "syntax error near 'SKIPME': CLIENT KILL takes ip:port, or pairs of ID, ADDR, LADDR or SKIPME and its value"),
        (("CLIENT", "KILL", "SKIPME", "maybe"), "syntax error near 'maybe': SKIPME takes YES or NO"),
        (("CLIENT", "KILL", "USER", "x"), "syntax error near 'USER'"),
        (("CLUSTER", "RESET", "medium"), "syntax error near 'medium': RESET takes SOFT or HARD"),
        (("AUTH", "user", "pass", "more"), "syntax error near 'more'"),
    ]
    for argv, text in cases:
        with pytest.raises(redis.ResponseError) as exc:
            r.execute_command(*argv)
        assert str(exc.value) == text, argv
    assert r.ping()  # none of them shut the node down or cut the connection


def test_client_kill_forms_and_setinfo(node):
    r = node.client()
    victim = socket.create_connection(("127.0.0.1", node.port))
    victim.sendall(b"CLIENT ID\r\n")
    victim_id = int(victim.recv(64)[1:].strip())
    listing = r.execute_command("CLIENT", "LIST").decode()
    line = next(entry for entry in listing.splitlines() if entry.startswith("id=%d " % victim_id))
    addr = dict(kv.split("=", 1) for kv in line.split() if "=" in kv)["addr"]
    assert r.execute_command("CLIENT", "KILL", addr) in (b"OK", True)
    victim.settimeout(5)
    assert victim.recv(10) == b""
    other = socket.create_connection(("127.0.0.1", node.port))
    other.sendall(b"CLIENT ID\r\n")
    other_id = int(other.recv(64)[1:].strip())
    assert r.execute_command("CLIENT", "KILL", "ID", other_id) == 1
    other.settimeout(5)
    assert other.recv(10) == b""
    with pytest.raises(redis.ResponseError, match="No such client"):
        r.execute_command("CLIENT", "KILL", "1.2.3.4:5")
    assert r.execute_command("CLIENT", "KILL", "ID", 999999) == 0
    assert r.execute_command("CLIENT", "SETINFO", "LIB-NAME", "mylib") in (b"OK", True)
    assert "lib-name=mylib" in r.execute_command("CLIENT", "INFO").decode()
    with pytest.raises(redis.ResponseError, match="Client names cannot contain spaces"):
        r.execute_command("CLIENT", "SETNAME", "has space")
    with pytest.raises(redis.ResponseError, match="^Syntax error, try CLIENT"):
        r.execute_command("CLIENT", "NOPE")


def test_command_quit_debug_and_resp3_hello(node):
    r = node.client()
    reply = raw(node.port, b"COMMAND INFO addjob nosuch\r\n", replies=1)
    assert reply.startswith(b"*2\r\n*6\r\n$6\r\naddjob\r\n:-4\r\n") and reply.endswith(b"$-1\r\n")
    assert raw(node.port, b"QUIT\r\n") == b"+OK\r\n"
    with pytest.raises(redis.ResponseError, match="boom"):
        r.execute_command("DEBUG", "ERROR", "boom")
    assert raw(node.port, b"HELLO 4\r\n", expect=10).startswith(b"-NOPROTO")
    reply = raw(node.port, b"HELLO 3\r\nGETJOB NOHANG FROM nothing\r\n", replies=2)
    assert reply.startswith(b"%") and reply.endswith(b"_\r\n")


def test_hello_auth_handshake(start_node):
    node = start_node(requirepass="pw")
    assert raw(node.port, b"HELLO 3\r\n", expect=10).startswith(b"-NOAUTH")
    assert raw(node.port, b"HELLO 3 AUTH default wrong\r\n", expect=10).startswith(b"-WRONGPASS")
    assert raw(node.port, b"HELLO 2 AUTH default pw\r\nQLEN q\r\n", replies=2).endswith(b":0\r\n")


def test_startup_log_lines_for_operators(node):
    log = node.log()
    assert "Ready to accept connections on 127.0.0.1 port %d" % node.port in log
    assert "Node ID " in log
    assert "No config file specified" in log


def test_config_set_loglevel_and_requirepass_at_runtime(node):
    r = node.client()
    assert r.execute_command("CONFIG", "SET", "loglevel", "warning") in (b"OK", True)
    assert r.config_get("loglevel") == {"loglevel": "warning"}
    assert r.execute_command("CONFIG", "SET", "requirepass", "later") in (b"OK", True)
    assert raw(node.port, b"QLEN q\r\n", expect=10).startswith(b"-NOAUTH")
    assert r.execute_command("QLEN", "q") == 0  # already authenticated connections stay so


def test_scripts_cluster_help_names_scripts_cluster():
    # the usage line names the command the README gives, not python -m disque_py.cli.devcluster
    out = subprocess.run([str(ROOT / "scripts" / "cluster"), "start", "--help"], cwd=ROOT, capture_output=True,
                         text=True, timeout=60)  # fmt: skip
    assert out.returncode == 0, out.stderr
    assert out.stdout.startswith("Usage: scripts/cluster start [OPTIONS] [COUNT]"), out.stdout
    assert "--base-port" in out.stdout


def test_scripts_cluster_start_status_stop(tmp_path):
    if not shutil.which("bash"):
        pytest.skip("bash not available")
    base = consecutive_free_ports(2)  # two nodes: base and base + 1
    env = dict(os.environ)
    cmd = [sys.executable, "-m", "disque_py.cli.devcluster"]
    out = subprocess.run(cmd + ["start", "2", "--base-port", str(base)], cwd=tmp_path, env=env,
                         capture_output=True, text=True, timeout=60)  # fmt: skip
    try:
        assert out.returncode == 0, out.stderr
        assert "node 127.0.0.1:%d started" % base in out.stdout
        for port in (base, base + 1):
            r = redis.Redis(port=port)
            assert r.execute_command("QLEN", "q") == 0
        status = subprocess.run(cmd + ["status"], cwd=tmp_path, capture_output=True, text=True, timeout=30)
        assert status.returncode == 0, status.stdout + status.stderr
        assert status.stdout.count(" up") == 2
        for port in (base, base + 1):  # each node's admin page and the cluster it sees (CLUSTER INFO)
            [line] = [line for line in status.stdout.splitlines() if line.startswith("node 127.0.0.1:%d " % port)]
            assert "admin http://127.0.0.1:%d/" % (port + 1000) in line, line
            assert "cluster_state:ok, 2 nodes known (itself included), 1 other(s) reachable" in line, line
        again = subprocess.run(cmd + ["start", "2", "--base-port", str(base)], cwd=tmp_path,
                               capture_output=True, text=True, timeout=60)  # fmt: skip
        assert "already running" in again.stdout
        # a node down: status says so and exits 1 (scripts can tell)
        pid = int((tmp_path / "run" / ("node-%d" % (base + 1)) / "disque.pid").read_text())
        os.kill(pid, signal.SIGKILL)
        wait_for(lambda: subprocess.run(cmd + ["status"], cwd=tmp_path, capture_output=True, text=True,
                                        timeout=30).returncode == 1, what="status exiting 1")  # fmt: skip
        status = subprocess.run(cmd + ["status"], cwd=tmp_path, capture_output=True, text=True, timeout=30)
        assert (status.returncode, status.stdout.count(" up ")) == (1, 1), status.stdout
        assert "127.0.0.1:%d pid=" % (base + 1) in status.stdout and " up " not in status.stdout.splitlines()[1]
    finally:
        stop = subprocess.run(cmd + ["stop"], cwd=tmp_path, capture_output=True, text=True, timeout=60)
    assert stop.returncode == 0 and stop.stdout.count("stopped") >= 1
    # with no local node at all, status exits 3
    empty = subprocess.run(cmd + ["status"], cwd=tmp_path / "run", capture_output=True, text=True, timeout=30)
    assert (empty.returncode, empty.stdout.strip()) == (3, "no local nodes (scripts/cluster start)")

    def down() -> bool:
        try:
            socket.create_connection(("127.0.0.1", base), timeout=0.2).close()
            return False
        except OSError:
            return True

    wait_for(down, what="nodes stopped")
    assert (tmp_path / "run" / ("node-%d" % base) / "node.log").exists()
    # one node now, in the same directory: it keeps its ID but not the last run's cluster,
    # so ADDJOB (default REPLICATE: the cluster size) answers at once
    out = subprocess.run(cmd + ["start", "1", "--base-port", str(base)], cwd=tmp_path, env=env,
                         capture_output=True, text=True, timeout=60)  # fmt: skip
    try:
        assert out.returncode == 0, out.stderr
        r = redis.Redis(port=base, socket_timeout=5)
        assert r.execute_command("CLUSTER", "INFO").decode().count("cluster_known_nodes:1") == 1
        assert r.execute_command("ADDJOB", "q", "b", 0).startswith(b"D-")
    finally:
        subprocess.run(cmd + ["stop"], cwd=tmp_path, capture_output=True, text=True, timeout=60)



def test_net_output_bytes_counts_every_reply_the_socket_took(node):
    # A blocked GETJOB is answered from the job layer's effects, not right after its own
    # command; those bytes are counted too (they were not). Exact: every byte the node sent
    # on these links between the two readings, the first reading's own reply included.
    def stat(reply: bytes) -> int:
        return int(reply.split(b"total_net_output_bytes:")[1].split(b"\r\n")[0])

    with (socket.create_connection(("127.0.0.1", node.port), timeout=5) as info,
          socket.create_connection(("127.0.0.1", node.port), timeout=5) as consumer,
          socket.create_connection(("127.0.0.1", node.port), timeout=5) as producer):  # fmt: skip
        info.sendall(b"INFO stats\r\n")
        first = read_reply(info)
        seen = len(first)
        consumer.sendall(b"GETJOB TIMEOUT 5000 FROM q\r\n")

        def blocked() -> bool:
            nonlocal seen
            info.sendall(b"INFO clients\r\n")
            reply = read_reply(info)
            seen += len(reply)
            return b"blocked_clients:1\r\n" in reply

        wait_for(blocked, what="GETJOB blocked")
        producer.sendall(b"ADDJOB q body 0\r\n")
        seen += len(read_reply(producer))
        got = read_reply(consumer)
        assert b"body" in got
        seen += len(got)
        info.sendall(b"INFO stats\r\n")
        assert stat(read_reply(info)) - stat(first) == seen


def test_a_directive_without_effect_is_named_in_the_log(start_node):
    # maxmemory-samples is accepted but not used: the operator is told so, at start and again
    # when CONFIG SET changes such a directive. maxmemory (core/memory.py) and appendonly
    # (server/aof.py) are acted on.
    node = start_node(maxmemory="100mb", maxmemory_samples=10, appendonly="yes", no_appendfsync_on_rewrite="yes")
    log_text = node.log()
    assert "maxmemory-samples is set, but disque-py does not act on it yet" in log_text
    assert "no-appendfsync-on-rewrite is set, but disque-py does not act on it yet" in log_text
    assert "appendonly is set" not in log_text
    assert "maxmemory is set" not in log_text
    assert "timeout is set" not in log_text
    c = node.client()
    assert c.config_set("maxmemory-samples", "7")
    wait_for(lambda: node.log().count("maxmemory-samples is set, but disque-py does not act on it yet") == 2,
             what="the CONFIG SET warning")
    assert c.config_set("maxmemory-policy", "noeviction")
    assert "maxmemory-policy is set" not in node.log()
    assert c.config_set("timeout", "30")
    assert "timeout is set" not in node.log()
    assert c.ping()
