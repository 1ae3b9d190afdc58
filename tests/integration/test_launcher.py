"""disque_py.cli.launcher: the one way node processes are started, awaited, joined and stopped."""

from __future__ import annotations

import signal
import socket
import sys
import time

import pytest

from disque_py.cli import launcher

from .conftest import NodeProcess, free_port, stop_all, wait_for


def _gone(port: int) -> bool:
    return not launcher.port_in_use(port)


def test_a_node_starts_answers_and_stops(tmp_path):
    port = free_port()
    log = tmp_path / "node.log"
    argv = launcher.node_argv(port, tmp_path, "--bind", "127.0.0.1")
    assert argv[-4:] == ["--dir", str(tmp_path), "--bind", "127.0.0.1"] and "--port" in argv
    proc = launcher.spawn(argv, output=log)
    try:
        launcher.wait_ready(proc, port, timeout=20, logs=[log])
        assert launcher.ping(port)
        assert launcher.call(port, "PING") == b"PONG"
        with pytest.raises(launcher.ReplyError, match="^ERR unknown command 'NOSUCHCOMMAND'"):
            launcher.call(port, "NOSUCHCOMMAND")
    finally:
        stopped = launcher.stop(proc, port=port, timeout=10)
    assert (stopped.how, stopped.returncode) == ("shutdown", 0)
    assert proc.poll() == 0 and _gone(port)
    assert launcher.stop(proc).how == "exited"  # stopping it again is harmless


def test_detached_nodes_join_and_stop_by_pid(tmp_path):
    ports = [free_port(), free_port()]
    procs = []
    try:
        for port in ports:
            log = tmp_path / ("node-%d.log" % port)
            argv = launcher.node_argv(port, tmp_path / str(port), "--bind", "127.0.0.1")
            (tmp_path / str(port)).mkdir()
            procs.append(launcher.spawn(argv, output=log, detach=True))
            launcher.wait_ready(procs[-1], port, timeout=20, logs=[log])
        seen = []
        seconds = launcher.join([("127.0.0.1", p) for p in ports], timeout=30, interval=0.05, progress=seen.append)
        assert seconds > 0 and seen[-1] == 2
        info = launcher.call(ports[1], "CLUSTER", "INFO").decode()
        assert "cluster_reachable_nodes:1" in info
    finally:
        results = [launcher.stop(p.pid, port=port, timeout=10) for p, port in zip(procs, ports)]
    assert [r.how for r in results] == ["shutdown", "shutdown"]
    for p, port in zip(procs, ports):
        assert p.wait(5) == 0 and _gone(port)


def test_a_start_on_a_taken_port_fails_clearly_within_the_deadline(tmp_path):
    port = free_port()
    log = tmp_path / "node.log"
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", port))
        proc = launcher.spawn(launcher.node_argv(port, tmp_path, "--bind", "127.0.0.1"), output=log)
        t0 = time.monotonic()
        try:
            with pytest.raises(launcher.LaunchError, match=r"^node on port \d+ exited with 1:") as exc:
                launcher.wait_ready(proc, port, timeout=20, logs=[log])
        finally:
            launcher.stop(proc, timeout=5)
        elapsed = time.monotonic() - t0
    text = str(exc.value)
    assert elapsed < 20
    assert ("node on port %d exited with" % port) in text
    assert str(port) in text.split("\n", 1)[1]  # the log's tail says which address could not be bound
    assert text.split("\n", 1)[1].strip()


def test_a_process_that_never_answers_times_out_and_one_that_ignores_sigterm_is_killed(tmp_path):
    log = tmp_path / "out.log"
    script = ("import signal, sys, time\n"
              "signal.signal(signal.SIGTERM, signal.SIG_IGN)\n"
              "print('ignoring SIGTERM', flush=True)\n"
              "time.sleep(60)\n")  # fmt: skip
    proc = launcher.spawn([sys.executable, "-c", script], output=log, detach=True)
    try:
        wait_for(lambda: "ignoring SIGTERM" in log.read_text(), timeout=20, what="the handler installed")
        port = free_port()  # nothing listens there
        t0 = time.monotonic()
        with pytest.raises(launcher.LaunchError, match=r"^sleeper on port \d+ did not answer PING within 1 s") as exc:
            launcher.wait_ready(proc, port, timeout=1, logs=[log], what="sleeper")
        assert time.monotonic() - t0 < 10  # its 1 s, not the 60 s the process lives (10x: a loaded machine)
        assert "sleeper on port %d did not answer PING within 1 s" % port in str(exc.value)
        assert "ignoring SIGTERM" in str(exc.value)
    finally:
        stopped = launcher.stop(proc, timeout=0.5, group=True)
    assert stopped.forced and stopped.returncode == -signal.SIGKILL


def test_a_test_fails_when_its_node_would_not_stop_and_nothing_outlives_it(tmp_path):
    """tests/integration/conftest.py's stop_all, which every fixture's teardown uses: a node that
    ignores SIGTERM past the bound is killed, then fails the test; so does one that exits with an
    error; one the test killed itself, or one that exits 0, is clean."""
    script = ("import signal, sys, time\n"
              "mode = sys.argv[1]\n"
              "if mode == 'ignore': signal.signal(signal.SIGTERM, signal.SIG_IGN)\n"
              "if mode == 'error': signal.signal(signal.SIGTERM, lambda *a: sys.exit(3))\n"
              "if mode == 'clean': signal.signal(signal.SIGTERM, lambda *a: sys.exit(0))\n"
              "print('ready', flush=True)\n"
              "time.sleep(60)\n")  # fmt: skip

    def fake_node(mode: str) -> NodeProcess:
        node = NodeProcess(tmp_path / mode)
        node.proc = launcher.spawn([sys.executable, "-c", script, mode], output=node.log_path)
        wait_for(lambda: "ready" in node.log(), timeout=20, what="the %s process" % mode)
        return node

    stubborn, failing, clean, killed = (fake_node(m) for m in ("ignore", "error", "clean", "killed"))
    killed.proc.kill()
    killed.proc.wait(10)
    with pytest.raises(pytest.fail.Exception) as exc:
        stop_all([stubborn, failing, clean, killed], timeout=1)
    text = str(exc.value)
    assert "node on port %d did not exit on SHUTDOWN or SIGTERM within the bound: killed" % stubborn.port in text
    assert "node on port %d exited with 3" % failing.port in text
    assert "port %d" % clean.port not in text and "port %d" % killed.port not in text
    assert all(n.proc.poll() is not None for n in (stubborn, failing, clean, killed))  # none outlives the test
    assert stubborn.proc.returncode == -signal.SIGKILL
