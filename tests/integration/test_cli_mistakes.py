"""A newcomer's mistakes on real processes: each answered at once, in one line saying what to do."""

from __future__ import annotations

import socket
import subprocess
import sys

from disque_py.cli import launcher

from .conftest import ROOT, free_port, wait_for

TIMEOUT = 60  # a generous deadline: the assertions are on what is said, never on how fast


def server(*args: str, cwd=ROOT) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "disque_py.cli", "server", *args], capture_output=True, text=True,
                          timeout=TIMEOUT, cwd=cwd)  # fmt: skip


def test_server_refuses_a_one_letter_option_with_a_hint(tmp_path):
    out = server("-p", "7799", cwd=tmp_path)
    assert out.returncode == 1 and "Traceback" not in out.stderr, out
    assert out.stderr.strip() == ("Unknown option '-p': disque-py server takes a config file and/or directives "
                                  "as --name value; did you mean --port?")  # fmt: skip
    assert list(tmp_path.iterdir()) == []


def test_server_takes_directives_after_a_config_file(tmp_path):
    conf = tmp_path / "disque.conf"
    conf.write_text("loglevel verbose\n")
    with socket.socket() as busy:  # the port given after the file wins: proven by its being busy
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        out = server(str(conf), "--port", str(port), "--bind", "127.0.0.1", "--dir", str(tmp_path))
    assert out.returncode == 1 and ":%d: Address already in use" % port in out.stdout + out.stderr, out


def _busy_start(tmp_path, busy_port: int, port: int) -> subprocess.CompletedProcess:
    with socket.socket() as busy:
        busy.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        busy.bind(("127.0.0.1", busy_port))
        busy.listen()
        return server("--port", str(port), "--bind", "127.0.0.1", "--dir", str(tmp_path), "--appendonly", "yes",
                      "--pidfile", str(tmp_path / "node.pid"))  # fmt: skip


def test_a_busy_client_port_leaves_nothing_on_disk(tmp_path):
    port = free_port()
    out = _busy_start(tmp_path, port, port)
    assert out.returncode == 1, out
    lines = [line for line in (out.stdout + out.stderr).splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].endswith("Creating server TCP listening socket 127.0.0.1:%d: Address "
                                                 "already in use" % port), lines  # fmt: skip
    assert list(tmp_path.iterdir()) == []  # no nodes.conf (no new ID), no AOF, no pidfile


def test_a_busy_bus_port_leaves_nothing_on_disk(tmp_path):
    port = free_port()
    out = _busy_start(tmp_path, port + 10000, port)
    assert out.returncode == 1, out
    lines = [line for line in (out.stdout + out.stderr).splitlines() if line.strip()]
    # one line: what failed, then why the bus port is port + 10000 and what to do
    assert len(lines) == 1 and ("Creating cluster bus listening socket 127.0.0.1:%d: Address already in use (the "
                                "cluster bus port is the client port %d + 10000" % (port + 10000, port)) in lines[0], lines
    assert list(tmp_path.iterdir()) == []


def test_a_new_node_still_writes_its_nodes_conf(node):
    assert (node.dir / "nodes.conf").read_text().strip()
    assert "No cluster configuration found, I'm" in node.log()


def test_a_redis_client_on_the_bus_port_is_named_in_the_log(node):
    bus = node.port + 10000
    for probe in (b"*1\r\n$4\r\nPING\r\n", b"PING\r\n"):
        with socket.create_connection(("127.0.0.1", bus), timeout=10) as s:
            s.sendall(probe)
            assert s.recv(100) == b""  # closed, as any bad link
    wait_for(lambda: "a client spoke RESP on the cluster bus port %d (from 127.0.0.1): clients use port %d; link "
                     "closed" % (bus, node.port) in node.log(), what="the log line")  # fmt: skip
    assert "frame too large" not in node.log()
    info = launcher.call(node.port, "CLUSTER", "INFO").decode()
    assert "cluster_stats_bad_frames:2\r\n" in info  # counted as before


def test_worker_says_at_once_it_cannot_reach_the_node(tmp_path):
    (tmp_path / "tasks.py").write_text("def handle(job):\n    pass\n")
    port = free_port()
    proc = subprocess.Popen(
        [sys.executable, "-m", "disque_py.cli", "worker", "tasks:handle", "-q", "q", "-n", "127.0.0.1:%d" % port,
         "--timeout", "1"], cwd=tmp_path, stderr=subprocess.PIPE, text=True,
        env={"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin"},
    )  # fmt: skip
    try:
        lines = [proc.stderr.readline() for _ in range(3)]
    finally:
        proc.terminate()
        proc.communicate(timeout=TIMEOUT)
    assert lines[0].startswith("worker: tasks:handle on q"), lines
    assert lines[1] == ("worker: cannot reach any node (Could not connect to disque-py at 127.0.0.1:%d: Connection "
                        "refused); trying again until one answers (Ctrl-C to stop)\n" % port), lines
    assert "GETJOB failed (no node reachable" in lines[2], lines  # and it keeps trying, saying so
