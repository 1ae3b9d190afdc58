"""Real node processes on free ports, for integration tests.

``node`` starts ``disque-py server`` in a subprocess with its own ``dir``,
waits (with a deadline) until it answers PING, and stops it with SIGTERM at
the end, failing the test if it did not exit cleanly (:func:`stop_all`: a node
that ignores SIGTERM for 10 s is killed, then fails the test). Extra directives can
be passed through ``start_node(**directives)``. The processes are started,
awaited and stopped by :mod:`disque_py.cli.launcher`.
"""

from __future__ import annotations

import os
import random
import resource
import shutil
import signal
import socket
import subprocess
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Iterable

import pytest
import redis
from redis.backoff import NoBackoff
from redis.retry import Retry

from disque_py.cli import launcher

ROOT = Path(__file__).resolve().parents[2]

#: ``retry=NO_RETRY`` for a redis-py client whose command is expected to fail on its connection
#: (a refused AUTH, a node going down): redis-py retries a ConnectionError (AuthenticationError
#: is one) 3 times with a backoff by default, 3 to 4 s before the expected error is raised.
NO_RETRY = Retry(NoBackoff(), 0)


def _ephemeral_low() -> int:
    try:
        with open("/proc/sys/net/ipv4/ip_local_port_range") as f:
            return int(f.read().split()[0])
    except (OSError, ValueError, IndexError):
        return 32768


def _bindable(port: int) -> bool:
    with socket.socket() as s:
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def free_port() -> int:
    """A port whose port+10000 (the cluster bus) is free as well.

    Both are taken below the kernel's ephemeral range when it leaves room: a node restarted on
    its port must not find it taken by some outgoing connection's local port (a test that
    kill -9s a node and starts it again on the same port once failed with EADDRINUSE so).
    """
    top = _ephemeral_low() - 10000
    rng = random.Random()
    for _ in range(200):
        if top > 12000:
            port = rng.randrange(10000, top)
            if port % _WORKERS != _WORKER:
                continue  # another xdist worker's share: two workers never draw the same port
        else:  # no room below the ephemeral range: let the kernel pick
            with socket.socket() as s:
                s.bind(("127.0.0.1", 0))
                port = s.getsockname()[1]
        if port in _GIVEN:
            continue  # handed out already: its node may not be listening yet (start_all)
        if port + 10000 <= 65535 and _bindable(port) and _bindable(port + 10000):
            if len(_GIVEN) >= 1000:
                _GIVEN.clear()  # those given long ago are bound by now, or done with
            _GIVEN.add(port)
            return port
    raise RuntimeError("no free port pair")


# Ports free_port handed out in this process: nodes spawned side by side (start_all) are given
# their ports before any of them binds, and a port drawn twice made two nodes of one directory.
_GIVEN: set[int] = set()
_WORKER = int(os.environ.get("PYTEST_XDIST_WORKER", "gw0")[2:] or 0)
_WORKERS = max(int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1") or 1), _WORKER + 1)


def consecutive_free_ports(n: int) -> int:
    """A base port such that base .. base+n-1 and their bus ports (+10000) are all free."""
    for _ in range(50):
        base = free_port()
        if base + n - 1 + 10000 > 65535:
            continue
        if all(_bindable(p) and _bindable(p + 10000) for p in range(base, base + n)):
            return base
    raise RuntimeError("no free port range")


def read_reply(sock: socket.socket) -> bytes:
    """Read one whole RESP reply from ``sock``, byte for byte as the node wrote it."""
    import hiredis

    reader, data = hiredis.Reader(), b""
    while True:
        chunk = sock.recv(65536)
        assert chunk, "connection closed before the reply ended"
        data += chunk
        reader.feed(chunk)
        if reader.gets() is not False:
            return data


def wait_for(predicate, timeout: float = 10.0, interval: float = 0.02, what: str = "condition"):
    deadline = time.monotonic() + timeout
    last_exc = None
    while time.monotonic() < deadline:
        try:
            value = predicate()
            if value:
                return value
        except Exception as exc:  # noqa: BLE001 - keep polling until the deadline
            last_exc = exc
        time.sleep(interval)
    raise AssertionError("timed out waiting for %s (last error: %r)" % (what, last_exc))


class NodeProcess:
    def __init__(self, tmp: Path, *, nofile: int | None = None, **directives) -> None:
        self.nofile = nofile  # the process's open files limit (soft and hard), None: inherited
        self.port = directives.pop("port", None) or free_port()
        self.dir = tmp / ("node-%d" % self.port)
        self.dir.mkdir(parents=True, exist_ok=True)
        self.directives = {"bind": "127.0.0.1", "dir": str(self.dir), "loglevel": "verbose", **directives}
        bind = self.directives["bind"]
        if bind is None:  # bind=None: no bind directive at all, the node listens on every interface
            del self.directives["bind"]
            bind = "127.0.0.1"
        self.host = str(bind[0] if isinstance(bind, (list, tuple)) else bind).split()[0]  # where it answers
        self.log_path = self.dir / "node.log"
        self.proc: subprocess.Popen | None = None
        self.password = directives.get("requirepass")

    def args(self) -> list[str]:
        extra = []
        for key, value in self.directives.items():
            if key == "config_file":
                continue
            values = value if isinstance(value, (list, tuple)) else (value,)  # a tuple: several arguments
            extra += ["--" + key.replace("_", "-"), *map(str, values)]
        return launcher.node_argv(self.port, None, *extra, config_file=self.directives.get("config_file") or None)

    def spawn(self) -> subprocess.Popen:
        """This node's process, started and not awaited (a subclass may run another tree's)."""
        env = dict(os.environ, PYTHONUNBUFFERED="1")
        limit = None
        if self.nofile is not None:
            n = self.nofile

            def limit() -> None:
                resource.setrlimit(resource.RLIMIT_NOFILE, (n, n))

        return launcher.spawn(self.args(), output=self.log_path, cwd=ROOT, env=env, preexec_fn=limit)

    def start(self) -> "NodeProcess":
        self.proc = self.spawn()
        return self.wait_ready()

    def wait_ready(self) -> "NodeProcess":
        """Wait (20 s at most) until the spawned process answers PING."""
        try:
            launcher.wait_ready(self.proc, self.port, host=self.host, timeout=20, logs=[self.log_path])
        except launcher.LaunchError as exc:
            raise AssertionError(str(exc)) from None
        return self

    def exit_code_at_start(self, timeout: float = 20) -> int:
        """Start a node expected to refuse its settings: its exit code (killed after ``timeout`` s)."""
        proc = self.spawn()
        try:
            return proc.wait(timeout=timeout)
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait()

    def client(self, **kw) -> redis.Redis:
        kw.setdefault("password", self.password)
        kw.setdefault("socket_timeout", 10)
        return redis.Redis(host=self.host, port=self.port, **kw)

    def log(self) -> str:
        try:
            return self.log_path.read_text(errors="replace")
        except OSError:
            return ""

    def halt(self, sig: int = signal.SIGTERM, timeout: float = 10) -> launcher.Stopped | None:
        """Stop the process: ``sig``, then SIGKILL after ``timeout`` s (launcher.stop); how it ended
        (None: never started)."""
        return None if self.proc is None else launcher.stop(self.proc, sig=sig, timeout=timeout)

    def stop(self, sig: int = signal.SIGTERM, timeout: float = 10) -> int | None:
        """:meth:`halt`; its exit code, AssertionError (once killed) if it had to be killed."""
        stopped = self.halt(sig, timeout)
        if stopped is not None and stopped.forced:
            raise AssertionError("node on port %d did not stop within %ss after %s: killed" % (self.port, timeout, sig))
        return None if stopped is None else stopped.returncode


#: How a stopped node may have ended: 0 (it exited on SHUTDOWN or SIGTERM), None (not our child: its
#: code is not ours to read), -SIGKILL (the test killed it itself before the stop; a node the stop
#: itself had to kill is never clean: ``Stopped.forced``).
CLEAN_EXITS = (0, None, -signal.SIGKILL)


def unclean(what: str, stopped: launcher.Stopped, log: str = "") -> str | None:
    """Why a stop was not clean (the node had to be killed, or it exited with an error), or None."""
    if stopped.forced:
        why = "did not exit on SHUTDOWN or SIGTERM within the bound: killed"
    elif stopped.returncode not in CLEAN_EXITS:
        why = "exited with %s" % stopped.returncode
    else:
        return None
    return "%s %s%s" % (what, why, ":\n" + log[-4000:] if log else "")


def fail_unclean(problems: Iterable[str | None]) -> None:
    """Fail the test with every unclean stop of ``problems`` (see :func:`unclean`)."""
    found = [p for p in problems if p]
    if found:
        pytest.fail("unclean node shutdown:\n" + "\n\n".join(found), pytrace=False)


def start_all(nodes: list[NodeProcess]) -> list[NodeProcess]:
    """Start the nodes side by side: every process spawned, then each awaited, so that a
    cluster starts in the time of its slowest node rather than the sum of them all. If one
    does not come up, all are killed and the test fails with its log."""
    try:
        for node in nodes:
            node.proc = node.spawn()
        for node in nodes:
            node.wait_ready()
    except BaseException:
        for node in nodes:
            node.halt(signal.SIGKILL, timeout=5)
        raise
    return nodes


def stop_all(nodes: Iterable[NodeProcess], timeout: float = 10) -> None:
    """Stop every node (SIGTERM, SIGKILL after ``timeout`` s), side by side, then fail if one did
    not stop cleanly (:func:`unclean`): all of them are stopped (killed at worst) before the test
    fails, so none outlives it."""
    nodes = list(nodes)
    with ThreadPoolExecutor(max(1, len(nodes))) as pool:
        stops = list(pool.map(lambda node: node.halt(timeout=timeout), nodes))
    fail_unclean(unclean("node on port %d" % node.port, stopped, node.log())
                 for node, stopped in zip(nodes, stops) if stopped is not None)  # fmt: skip


@pytest.fixture
def start_node(tmp_path):
    """``start_node(**directives)``: a node; ``start_node.many(n, **directives)``: n nodes started
    side by side (:func:`start_all`), ``each`` a function of no argument giving each node's own
    directives beside them (``each=lambda: {"admin_port": free_port()}``). All stopped at the end
    of the test."""
    started: list[NodeProcess] = []

    def start(**directives) -> NodeProcess:
        node = NodeProcess(tmp_path, **directives).start()
        started.append(node)
        return node

    def many(n: int, each=dict, **directives) -> list[NodeProcess]:
        nodes = start_all([NodeProcess(tmp_path, **directives, **each()) for _ in range(n)])
        started.extend(nodes)
        return nodes

    start.many = many
    yield start
    stop_all(started)


@pytest.fixture
def node(start_node) -> NodeProcess:
    return start_node()


@pytest.fixture
def redis_cli() -> str:
    path = shutil.which("redis-cli")
    if not path:
        pytest.skip("redis-cli not installed (scripts/test installs it with apt-get when run as root)")
    return path


@pytest.fixture
def cluster3(start_node):
    """Three nodes joined into one cluster (no admin ports: tests/web has its own with them)."""
    nodes = start_node.many(3)
    launcher.join([(n.host, n.port) for n in nodes], timeout=30)
    return nodes
