"""Real node processes on free ports, for integration tests.

``node`` starts ``disque-py server`` in a subprocess with its own ``dir``,
waits (with a deadline) until it answers PING, and stops it with SIGTERM at
the end, failing the test if it did not exit cleanly. Extra directives can
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
from pathlib import Path

import pytest
import redis

from disque_py.cli import launcher

ROOT = Path(__file__).resolve().parents[2]


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
        else:  # no room below the ephemeral range: let the kernel pick
            with socket.socket() as s:
                s.bind(("127.0.0.1", 0))
                port = s.getsockname()[1]
        if port + 10000 <= 65535 and _bindable(port) and _bindable(port + 10000):
            return port
    raise RuntimeError("no free port pair")


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

    def start(self) -> "NodeProcess":
        env = dict(os.environ, PYTHONUNBUFFERED="1")
        limit = None
        if self.nofile is not None:
            n = self.nofile

            def limit() -> None:
                resource.setrlimit(resource.RLIMIT_NOFILE, (n, n))

        self.proc = launcher.spawn(self.args(), output=self.log_path, cwd=ROOT, env=env, preexec_fn=limit)
        try:
            launcher.wait_ready(self.proc, self.port, host=self.host, timeout=20, logs=[self.log_path])
        except launcher.LaunchError as exc:
            raise AssertionError(str(exc)) from None
        return self

    def exit_code_at_start(self, timeout: float = 20) -> int:
        """Start a node expected to refuse its settings: its exit code (killed after ``timeout`` s)."""
        proc = launcher.spawn(self.args(), output=self.log_path, cwd=ROOT)
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

    def stop(self, sig: int = signal.SIGTERM, timeout: float = 10) -> int | None:
        if self.proc is None:
            return None
        stopped = launcher.stop(self.proc, sig=sig, timeout=timeout)
        if stopped.forced:
            raise AssertionError("node did not stop within %ss after %s" % (timeout, sig))
        return stopped.returncode


@pytest.fixture
def start_node(tmp_path):
    started: list[NodeProcess] = []

    def start(**directives) -> NodeProcess:
        node = NodeProcess(tmp_path, **directives).start()
        started.append(node)
        return node

    yield start
    for node in started:
        code = node.stop()
        assert code in (0, None, -signal.SIGKILL), "node exited with %s:\n%s" % (code, node.log())


@pytest.fixture
def node(start_node) -> NodeProcess:
    return start_node()


@pytest.fixture
def redis_cli() -> str:
    path = shutil.which("redis-cli")
    if not path:
        pytest.skip("redis-cli not installed (scripts/test installs it with apt-get when run as root)")
    return path
