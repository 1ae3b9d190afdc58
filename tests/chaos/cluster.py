"""The chaos cluster: real node processes the nemeses kill, pause, starve of disk and restart.

A node is started from a command template (``--server``), so the same
harness runs disque-py and Disque 1.0-rc1. Placeholders: ``{port}``,
``{host}``, ``{dir}``, ``{timeout}`` (cluster-node-timeout, ms),
``{appendonly}`` (yes/no) and ``{appendfsync}``. A template without
placeholders is a server program: the directives are appended to it as
``--name value`` (how both servers take them).

Each node keeps its directory (``nodes.conf``, the AOF; its log is beside it) across
restarts: a node killed with ``-9`` comes back with its identity, and with its
jobs only if it had an AOF. With ``disk=True`` (root only) each node's
directory is a tmpfs of its own, so the disk nemesis can fill it.
"""

from __future__ import annotations

import os
import shlex
import signal
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Sequence

from disque_py.cli import launcher

from .net import LoopbackNetwork, NetnsNetwork

#: The directives every node gets, whatever the server.
DIRECTIVES = ("port", "bind", "dir", "cluster-node-timeout", "appendonly", "appendfsync")


def _die_with_parent() -> None:
    """In the child, before exec: SIGKILL when the harness goes (a killed harness leaves no node)."""
    try:
        import ctypes

        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        pass


def default_server() -> str:
    return "%s -m disque_py.cli server" % shlex.quote(sys.executable)


def command(template: str, values: dict[str, str]) -> list[str]:
    """The argv of one node from ``template`` and its ``values`` (module docstring)."""
    if "{" in template:
        return [part.format(**values) for part in shlex.split(template)]
    argv = shlex.split(template)
    names = {"port": "port", "bind": "host", "dir": "dir", "cluster-node-timeout": "timeout",
             "appendonly": "appendonly", "appendfsync": "appendfsync"}  # fmt: skip
    for directive in DIRECTIVES:
        argv += ["--" + directive, values[names[directive]]]
    return argv


class Node:
    def __init__(self, index: int, host: str, port: int, directory: Path, log: Path) -> None:
        self.index = index
        self.host = host
        self.port = port
        self.dir = directory
        self.log = log  # outside the directory: a full disk must not silence it, an unmount not lose it
        self.proc: subprocess.Popen | None = None
        self.paused = False
        self.mounted = False
        self.starts = 0

    @property
    def address(self) -> tuple[str, int]:
        return self.host, self.port

    def __repr__(self) -> str:
        return "n%d(%s:%d)" % (self.index, self.host, self.port)


class Cluster:
    """``size`` nodes on ``net``; :meth:`start` starts and joins them."""

    def __init__(
        self,
        net: NetnsNetwork | LoopbackNetwork,
        workdir: Path,
        *,
        server: str | None = None,
        base_port: int = 7711,
        node_timeout: int = 2000,
        appendonly: bool = False,
        appendfsync: str = "everysec",
        disk: bool = False,
        disk_size: str = "256m",
        fault_hooks: bool = True,
    ) -> None:
        self.net = net
        self.workdir = Path(workdir)
        self.server = server or default_server()
        self.node_timeout = node_timeout
        self.appendonly = appendonly
        self.appendfsync = appendfsync
        self.disk = disk
        self.disk_size = disk_size
        self.env = dict(os.environ)
        if fault_hooks:
            self.env["DISQUE_PY_FAULT_HOOKS"] = "1"
        self.nodes: list[Node] = []
        shared_host = isinstance(net, LoopbackNetwork)
        for i, host in enumerate(net.hosts):
            port = base_port + i if shared_host else base_port
            d = self.workdir / ("node%d" % i)
            d.mkdir(parents=True, exist_ok=True)
            self.nodes.append(Node(i, host, port, d, self.workdir / ("node%d.log" % i)))

    # ------------------------------------------------------------------ processes

    def argv(self, node: Node) -> list[str]:
        values = {
            "port": str(node.port), "host": node.host, "dir": str(node.dir), "timeout": str(self.node_timeout),
            "appendonly": "yes" if self.appendonly else "no", "appendfsync": self.appendfsync,
        }  # fmt: skip
        return self.net.wrap(node.index, command(self.server, values))

    def spawn(self, node: Node) -> None:
        if self.disk and not node.mounted:
            subprocess.run(["mount", "-t", "tmpfs", "-o", "size=%s" % self.disk_size, "tmpfs", str(node.dir)],
                           check=True)  # fmt: skip
            node.mounted = True
        with open(node.log, "a") as f:
            f.write("\n==== chaos: start #%d at %s\n" % (node.starts + 1, time.strftime("%H:%M:%S")))
        node.proc = launcher.spawn(self.argv(node), output=node.log, cwd=node.dir, env=self.env,
                                   preexec_fn=_die_with_parent)  # fmt: skip
        node.starts += 1
        node.paused = False

    def wait_ready(self, node: Node, timeout: float = 60.0) -> None:
        launcher.wait_ready(node.proc, node.port, host=node.host, timeout=timeout, logs=[node.log],
                            what="node %d" % node.index)  # fmt: skip

    def start(self, join_timeout: float = 60.0) -> float:
        """Start every node, wait for each to answer, join them; the seconds the join took."""
        for node in self.nodes:
            self.spawn(node)
        for node in self.nodes:
            self.wait_ready(node)
        return launcher.join([n.address for n in self.nodes], timeout=join_timeout)

    def alive(self, node: Node) -> bool:
        return node.proc is not None and node.proc.poll() is None

    def kill(self, node: Node) -> None:
        """kill -9, and wait for the process to be gone."""
        if node.proc is None:
            return
        if node.paused:
            self.resume(node)
        try:
            node.proc.send_signal(signal.SIGKILL)
        except ProcessLookupError:
            pass
        node.proc.wait(10)

    def restart(self, node: Node, wait: bool = True) -> None:
        if self.alive(node):
            self.kill(node)
        self.spawn(node)
        if wait:
            self.wait_ready(node)

    def pause(self, node: Node) -> None:
        if self.alive(node):
            node.proc.send_signal(signal.SIGSTOP)
            node.paused = True

    def resume(self, node: Node) -> None:
        if node.proc is not None and node.paused:
            try:
                node.proc.send_signal(signal.SIGCONT)
            except ProcessLookupError:
                pass
            node.paused = False

    def call(self, node: Node, *args: str | bytes | int, timeout: float = 5.0) -> object:
        return launcher.call(node.port, *args, host=node.host, timeout=timeout)

    # ------------------------------------------------------------------ disk

    def fill_disk(self, node: Node) -> Path:
        """Fill the node's tmpfs to the last byte; the filler's path (remove it to free the space)."""
        filler = node.dir / "chaos-filler"
        fd = os.open(filler, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
        try:
            for size in (1 << 20, 4096, 1):  # down to the last byte
                chunk = b"\0" * size
                try:
                    while True:
                        os.write(fd, chunk)
                except OSError:
                    pass
        finally:
            os.close(fd)
        return filler

    def free_disk(self, node: Node) -> None:
        try:
            (node.dir / "chaos-filler").unlink()
        except FileNotFoundError:
            pass

    # ------------------------------------------------------------------ the end

    def stop(self) -> list[str]:
        """Stop every node (SHUTDOWN, then SIGTERM, each given 5 s, then SIGKILL) and unmount what
        was mounted; what did not stop cleanly: a node that had to be killed, or that exited with
        an error (a run's problems)."""
        problems = []
        for node in self.nodes:
            self.resume(node)
        live = [node for node in self.nodes if self.alive(node)]
        # side by side: the nodes' exits overlap instead of adding up
        with ThreadPoolExecutor(max(1, len(live))) as pool:
            stops = list(pool.map(lambda n: launcher.stop(n.proc, port=n.port, host=n.host, timeout=5.0), live))
        for node, stopped in zip(live, stops):
            if stopped.forced or stopped.returncode != 0:
                problems.append("node n%d did not stop cleanly at the end: %s, exit code %s"
                                % (node.index, "killed" if stopped.forced else stopped.how, stopped.returncode))
        for node in self.nodes:
            if node.mounted:
                subprocess.run(["umount", "-l", str(node.dir)], check=False)
                node.mounted = False
        return problems

    def logs(self) -> list[Path]:
        return [n.log for n in self.nodes]

    def __enter__(self) -> "Cluster":
        return self

    def __exit__(self, exc_type: object, *exc: object) -> None:
        problems = self.stop()
        if problems and exc_type is None:
            raise AssertionError("; ".join(problems))


def addresses(nodes: Sequence[Node]) -> list[tuple[str, int]]:
    return [n.address for n in nodes]
