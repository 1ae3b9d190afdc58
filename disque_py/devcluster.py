"""Local development nodes: start, status and stop N node processes.

Used by ``scripts/cluster``. Each node gets ``run/node-<port>/`` with its
log, pid file and cluster config file, and runs detached from the terminal
so the command returns once every node answers PING.

    python -m disque_py.devcluster start [N] [--base-port 7711]
    python -m disque_py.devcluster status
    python -m disque_py.devcluster stop
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import click

RUN_DIR = Path("run")


def _node_dirs() -> list[Path]:
    if not RUN_DIR.is_dir():
        return []
    return sorted(p for p in RUN_DIR.glob("node-*") if p.is_dir())


def _pid(node_dir: Path) -> int | None:
    try:
        pid = int((node_dir / "disque.pid").read_text().strip())
    except (OSError, ValueError):
        return None
    try:
        os.kill(pid, 0)
    except OSError:
        return None
    return pid


def _ping(port: int, timeout: float = 0.5) -> bool:
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=timeout) as s:
            s.sendall(b"PING\r\n")
            return s.recv(64).startswith((b"+PONG", b"-NOAUTH"))
    except OSError:
        return False


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
def main() -> None:
    """Local disque-py nodes for development (state under ./run/)."""


@main.command()
@click.argument("count", default=1, type=click.IntRange(1, 64))
@click.option("--base-port", default=7711, show_default=True, help="Port of the first node; the next ones follow.")
def start(count: int, base_port: int) -> None:
    """Start COUNT nodes on consecutive ports and wait until they answer."""
    ports = [base_port + i for i in range(count)]
    started = []
    with click.progressbar(ports, label="Starting %d node(s)" % count, file=sys.stderr) as bar:
        for port in bar:
            node_dir = (RUN_DIR / ("node-%d" % port)).resolve()
            node_dir.mkdir(parents=True, exist_ok=True)
            if _pid(node_dir):
                if _ping(port):
                    continue
            if _ping(port):
                raise click.ClickException("port %d is already in use by another process" % port)
            log = open(node_dir / "node.log", "ab")
            subprocess.Popen(
                [sys.executable, "-m", "disque_py.cli", "server",
                 "--port", str(port), "--bind", "127.0.0.1", "--dir", str(node_dir),
                 "--pidfile", str(node_dir / "disque.pid"), "--logfile", str(node_dir / "node.log")],
                stdin=subprocess.DEVNULL, stdout=log, stderr=log, start_new_session=True,
            )  # fmt: skip
            log.close()
            started.append(port)
            deadline = time.monotonic() + 20
            while not _ping(port):
                if time.monotonic() > deadline:
                    raise click.ClickException("node on port %d did not start; see %s" % (port, node_dir / "node.log"))
                time.sleep(0.05)
    for port in ports:
        click.echo("node 127.0.0.1:%d %s" % (port, "started" if port in started else "already running"))
    click.echo("Try: redis-cli -p %d ADDJOB myqueue hello 0   (or .venv/bin/disque-py cli -p %d ...)" % (base_port, base_port))


@main.command()
def status() -> None:
    """Show which local nodes are running and answering."""
    dirs = _node_dirs()
    if not dirs:
        click.echo("no local nodes (scripts/cluster start)")
        return
    for node_dir in dirs:
        port = int(node_dir.name.split("-", 1)[1])
        pid = _pid(node_dir)
        state = "up" if _ping(port) else ("starting?" if pid else "down")
        click.echo("node 127.0.0.1:%d pid=%s %s" % (port, pid or "-", state))


@main.command()
def stop() -> None:
    """Stop every local node (SIGTERM, waiting for a clean exit)."""
    stopped = 0
    for node_dir in _node_dirs():
        pid = _pid(node_dir)
        if not pid:
            continue
        os.kill(pid, signal.SIGTERM)
        deadline = time.monotonic() + 10
        while _pid(node_dir) and time.monotonic() < deadline:
            time.sleep(0.05)
        if _pid(node_dir):
            os.kill(pid, signal.SIGKILL)
        stopped += 1
        click.echo("stopped %s (pid %d)" % (node_dir.name, pid))
    if not stopped:
        click.echo("no running local nodes")


if __name__ == "__main__":  # pragma: no cover
    main()
