"""Start, watch and stop node processes: the one launcher of the local-cluster
command (``scripts/cluster``, ``disque-py cluster create|meet``), the
integration tests and the benchmarks.

It only runs processes and speaks a few RESP commands to them (PING,
SHUTDOWN, CLUSTER MEET, CLUSTER INFO); it never imports the node's own code,
so what it starts is whatever ``disque-py server`` (or any other server
command line, such as the benchmarks' redis-server) is on disk.

* :func:`node_argv` builds a node's command line (optionally pinned to CPUs
  with ``taskset -c``); :func:`spawn` starts it with its output appended to a
  log file, optionally detached in its own session;
* :func:`wait_ready` polls PING until the node answers, its process exits or
  a deadline passes; both failures raise :class:`LaunchError` with the tail of
  the node's logs;
* :func:`stop` asks a node to stop (SHUTDOWN), then signals it (SIGTERM), then
  kills it (SIGKILL), waiting for the process to exit after each step;
* :func:`join` sends CLUSTER MEET from the first node to the others and waits
  until every node reaches every other one.

Every wait polls a condition against a deadline.

TLS: every function that speaks to a node takes ``ssl_context`` (None, the default: plain TCP);
:func:`tls_context` builds one from a CA, a certificate and a key, as ``disque-py cli --tls``
does. Those that authenticate take ``username`` beside ``password`` (``AUTH user pass``).
"""

from __future__ import annotations

import os
import signal
import socket
import ssl
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Iterable, Sequence

import hiredis

__all__ = [
    "HOST", "LaunchError", "ReplyError", "Stopped", "announced_port", "call", "join", "meet", "node_argv", "pinned", "ping",
    "port_in_use", "shutdown", "spawn", "stop", "tail", "tls_context", "wait_converged", "wait_exit", "wait_ready",
]  # fmt: skip

HOST = "127.0.0.1"
#: How often the waits poll.
POLL = 0.02


class LaunchError(RuntimeError):
    """A node did not start, answer or join in time; the message carries what its logs said last."""


class ReplyError(LaunchError):
    """A node answered a command with an error reply."""


# --------------------------------------------------------------------------- command lines


def server_command(python: str | None = None, *, script: bool = False) -> list[str]:
    """``python -m disque_py.cli server``; with ``script``, the ``disque-py`` console script installed
    beside ``python`` when there is one."""
    python = python or sys.executable
    if script:
        exe = Path(python).with_name("disque-py")
        if exe.exists():
            return [str(exe), "server"]
    return [python, "-m", "disque_py.cli", "server"]


def pinned(argv: Sequence[str], cpu: str | None) -> list[str]:
    """``argv`` run on the CPU list ``cpu`` (``taskset -c``), or as is when ``cpu`` is None."""
    return ["taskset", "-c", cpu, *argv] if cpu is not None else list(argv)


def node_argv(
    port: int,
    directory: str | Path | None = None,
    *extra: str,
    config_file: str | Path | None = None,
    python: str | None = None,
    script: bool = False,
    cpu: str | None = None,
) -> list[str]:
    """A node's command line: ``[taskset -c CPU] disque-py server [CONFIG] --port P [--dir D] EXTRA...``."""
    argv = server_command(python, script=script)
    if config_file is not None:
        argv.append(str(config_file))
    argv += ["--port", str(port)]
    if directory is not None:
        argv += ["--dir", str(directory)]
    argv += [str(x) for x in extra]
    return pinned(argv, cpu)


# --------------------------------------------------------------------------- processes


def spawn(
    argv: Sequence[str],
    *,
    output: str | Path | None = None,
    cwd: str | Path | None = None,
    env: dict[str, str] | None = None,
    detach: bool = False,
    preexec_fn: Callable[[], None] | None = None,
) -> subprocess.Popen:
    """Start ``argv`` without waiting for it to answer. Its stdout and stderr are appended to ``output``
    (None: discarded); ``detach``: in a session of its own, so it outlives the terminal and
    :func:`stop` can kill its whole process group."""
    out = open(output, "ab") if output is not None else subprocess.DEVNULL
    try:
        return subprocess.Popen(
            list(argv), stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT,
            cwd=None if cwd is None else str(cwd), env=env, start_new_session=detach, preexec_fn=preexec_fn,
        )  # fmt: skip
    finally:
        if output is not None:
            out.close()


def tail(paths: Iterable[str | Path], lines: int = 20) -> str:
    """The last ``lines`` lines of the files, read one after the other (missing ones are skipped)."""
    text = ""
    for path in paths:
        try:
            text += Path(path).read_text(errors="replace")
        except OSError:
            pass
    return "\n".join(text.splitlines()[-lines:])


def _alive(target: subprocess.Popen | int) -> bool:
    if isinstance(target, subprocess.Popen):
        return target.poll() is None
    try:
        os.kill(target, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    try:  # a zombie is gone for our purpose
        with open("/proc/%d/stat" % target) as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except (OSError, IndexError):
        return True


def wait_exit(target: subprocess.Popen | int, timeout: float) -> bool:
    """Wait up to ``timeout`` s for a process (ours, or any pid) to exit; True if it did."""
    if isinstance(target, subprocess.Popen):
        try:
            target.wait(max(0.0, timeout))
            return True
        except subprocess.TimeoutExpired:
            return False
    deadline = time.monotonic() + timeout
    while _alive(target):
        if time.monotonic() >= deadline:
            return False
        time.sleep(POLL)
    return True


@dataclass(frozen=True)
class Stopped:
    """How :func:`stop` ended: the exit code (None for a process that is not our child) and the step that
    ended it: "exited" (before we asked), "shutdown", "signal" or "kill"."""

    returncode: int | None
    how: str

    @property
    def forced(self) -> bool:
        return self.how == "kill"


def stop(
    target: subprocess.Popen | int,
    *,
    port: int | None = None,
    host: str = HOST,
    password: str | None = None,
    sig: int = signal.SIGTERM,
    timeout: float = 10.0,
    group: bool = False,
    username: str | None = None,
    ssl_context: ssl.SSLContext | None = None,
) -> Stopped:
    """Stop a node: SHUTDOWN to ``host:port`` (when ``port`` is given), then ``sig``, then SIGKILL (to its
    process group with ``group``), each after waiting up to ``timeout`` s for the process to exit."""

    def code() -> int | None:
        return target.returncode if isinstance(target, subprocess.Popen) else None

    if not _alive(target):
        return Stopped(code(), "exited")
    pid = target.pid if isinstance(target, subprocess.Popen) else target
    if port is not None and shutdown(port, host=host, password=password, username=username,
                                     ssl_context=ssl_context) and wait_exit(target, timeout):  # fmt: skip
        return Stopped(code(), "shutdown")
    try:
        os.kill(pid, sig)
    except ProcessLookupError:
        pass
    if wait_exit(target, timeout):
        return Stopped(code(), "signal")
    try:
        if group:
            os.killpg(pid, signal.SIGKILL)
        else:
            os.kill(pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    wait_exit(target, 5.0)
    return Stopped(code(), "kill")


# --------------------------------------------------------------------------- RESP


def _encode(args: Sequence[str | bytes | int]) -> bytes:
    out = [b"*%d\r\n" % len(args)]
    for a in args:
        b = a if isinstance(a, bytes) else str(a).encode()
        out.append(b"$%d\r\n%s\r\n" % (len(b), b))
    return b"".join(out)


def _roundtrip(sock: socket.socket, reader: hiredis.Reader, args: Sequence[str | bytes | int]) -> object:
    sock.sendall(_encode(args))
    while True:
        reply = reader.gets()
        if reply is not False:
            if isinstance(reply, hiredis.ReplyError):
                raise ReplyError(str(reply))
            return reply
        data = sock.recv(65536)
        if not data:
            raise ConnectionError("connection closed by %s:%d" % sock.getpeername()[:2])
        reader.feed(data)


def tls_context(cacert: str | Path | None = None, cert: str | Path | None = None, key: str | Path | None = None,
                *, check_hostname: bool = True) -> ssl.SSLContext:  # fmt: skip
    """A client-side context: the node's certificate checked against ``cacert`` (None: the system's
    CAs), ``cert``/``key`` sent when the node asks for a client certificate (tls-auth-clients)."""
    ctx = ssl.create_default_context(cafile=None if cacert is None else str(cacert))
    ctx.check_hostname = check_hostname
    if cert is not None:
        ctx.load_cert_chain(str(cert), None if key is None else str(key))
    return ctx


def _connect(host: str, port: int, timeout: float, ssl_context: ssl.SSLContext | None) -> socket.socket:
    """A connected socket, wrapped (handshake done) with ``ssl_context``; OSError (ssl.SSLError too)."""
    sock = socket.create_connection((host, port), timeout=timeout)
    if ssl_context is None:
        return sock
    try:
        return ssl_context.wrap_socket(sock, server_hostname=host)
    except BaseException:
        sock.close()
        raise


def _auth(sock: socket.socket, reader: hiredis.Reader, password: str | None, username: str | None) -> None:
    if password is not None:
        _roundtrip(sock, reader, ("AUTH", username, password) if username else ("AUTH", password))


def call(port: int, *args: str | bytes | int, host: str = HOST, password: str | None = None,
         timeout: float = 5.0, username: str | None = None,
         ssl_context: ssl.SSLContext | None = None) -> object:  # fmt: skip
    """One command on a fresh connection (TLS with ``ssl_context``; AUTH first with ``password``,
    as ``username`` when given); an error reply raises :class:`ReplyError`, a connection or TLS
    failure :class:`OSError`."""
    with _connect(host, port, timeout, ssl_context) as sock:
        reader = hiredis.Reader()
        _auth(sock, reader, password, username)
        return _roundtrip(sock, reader, args)


def _answers_ping(host: str, port: int, timeout: float, ssl_context: ssl.SSLContext | None) -> bool:
    with _connect(host, port, timeout, ssl_context) as s:
        s.sendall(b"PING\r\n")
        return s.recv(64).startswith((b"+PONG", b"-NOAUTH"))


def ping(port: int, host: str = HOST, timeout: float = 0.5, *, ssl_context: ssl.SSLContext | None = None) -> bool:
    """Whether something on ``host:port`` answers PING like a node (``+PONG``, or ``-NOAUTH`` when it
    wants a password); over TLS with ``ssl_context``."""
    try:
        return _answers_ping(host, port, timeout, ssl_context)
    except OSError:
        return False


def port_in_use(port: int, host: str = HOST) -> bool:
    """Whether something accepts connections on ``host:port``."""
    with socket.socket() as s:
        s.settimeout(0.5)
        return s.connect_ex((host, port)) == 0


def shutdown(port: int, host: str = HOST, password: str | None = None, timeout: float = 2.0, *,
             username: str | None = None, ssl_context: ssl.SSLContext | None = None) -> bool:  # fmt: skip
    """Send SHUTDOWN; True if the node took it (it closes the connection without a reply), False if it
    refused (an error reply) or could not be reached."""
    try:
        sock = _connect(host, port, timeout, ssl_context)
    except OSError:
        return False
    with sock:
        reader = hiredis.Reader()
        try:
            _auth(sock, reader, password, username)
            _roundtrip(sock, reader, ("SHUTDOWN",))
        except ReplyError:
            return False
        except OSError:  # closed (or about to be): the node is on its way out
            return True
    return True


# --------------------------------------------------------------------------- waits


def wait_ready(
    proc: subprocess.Popen | None,
    port: int,
    *,
    host: str = HOST,
    timeout: float = 20.0,
    logs: Iterable[str | Path] = (),
    what: str = "node",
    ssl_context: ssl.SSLContext | None = None,
) -> None:
    """Poll PING (over TLS with ``ssl_context``) until the node answers; :class:`LaunchError` with the
    tail of ``logs`` if its process exits first or ``timeout`` s pass."""
    logs = list(logs)
    deadline = time.monotonic() + timeout
    last: Exception | None = None
    while True:
        if proc is not None and proc.poll() is not None:
            raise LaunchError("%s on port %d exited with %s:\n%s" % (what, port, proc.returncode, tail(logs)))
        try:
            if _answers_ping(host, port, 1.0, ssl_context):
                return
        except OSError as exc:
            last = exc
        if time.monotonic() >= deadline:
            raise LaunchError(
                "%s on port %d did not answer PING within %.0f s (%r)\n%s" % (what, port, timeout, last, tail(logs))
            )
        time.sleep(POLL)


def _reachable(host: str, port: int, password: str | None, **conn) -> int:
    info = call(port, "CLUSTER", "INFO", host=host, password=password, **conn)
    text = info.decode() if isinstance(info, bytes) else str(info)
    fields = dict(line.split(":", 1) for line in text.splitlines() if ":" in line)
    return int(fields.get("cluster_reachable_nodes", 0))


def announced_port(host: str, port: int, *, password: str | None = None, **conn) -> int:
    """The client port the node reached at ``host:port`` gives in CLUSTER NODES (its ``myself``
    line): the port CLUSTER MEET takes, from which its bus port follows. It differs from ``port``
    when that is the node's tls-port; 0 for a node without a plain port."""
    table = call(port, "CLUSTER", "NODES", host=host, password=password, **conn)
    text = table.decode() if isinstance(table, bytes) else str(table)
    for line in text.splitlines():
        fields = line.split()
        if len(fields) >= 3 and "myself" in fields[2].split(","):
            return int(fields[1].split("@", 1)[0].rpartition(":")[2])
    raise LaunchError("%s:%d lists no 'myself' node in CLUSTER NODES" % (host, port))


def meet(addresses: Sequence[tuple[str, int]], *, password: str | None = None, username: str | None = None,
         ssl_context: ssl.SSLContext | None = None) -> None:  # fmt: skip
    """CLUSTER MEET every other node, sent to the first one (gossip does the rest).

    Over TLS (``ssl_context``) the addresses are tls-ports, which are not the port CLUSTER MEET
    takes: each node is asked for its own (:func:`announced_port`), and its address is used as
    given only when it has none."""
    conn = {"username": username, "ssl_context": ssl_context}
    first_host, first_port = addresses[0]
    for host, port in addresses[1:]:
        if ssl_context is not None:
            port = announced_port(host, port, password=password, **conn) or port
        call(first_port, "CLUSTER", "MEET", host, str(port), host=first_host, password=password, **conn)


def wait_converged(
    addresses: Sequence[tuple[str, int]],
    *,
    password: str | None = None,
    timeout: float = 30.0,
    interval: float = 0.1,
    progress: Callable[[int], None] | None = None,
    username: str | None = None,
    ssl_context: ssl.SSLContext | None = None,
) -> None:
    """Poll CLUSTER INFO on every node every ``interval`` s until each reaches all the others
    (``cluster_reachable_nodes``: nodes still in handshake do not count); :class:`LaunchError` after
    ``timeout`` s. ``progress(n)`` is told after each round how many nodes are there."""
    want = len(addresses)
    deadline = time.monotonic() + timeout
    while True:
        counts = [_reachable(host, port, password, username=username, ssl_context=ssl_context) + 1
                  for host, port in addresses]  # fmt: skip
        complete = sum(1 for c in counts if c >= want)
        if progress is not None:
            progress(complete)
        if complete == want:
            return
        if time.monotonic() > deadline:
            raise LaunchError("nodes did not all meet within %.0f s (known: %s)" % (timeout, counts))
        time.sleep(interval)


def join(
    addresses: Sequence[tuple[str, int]],
    *,
    password: str | None = None,
    timeout: float = 30.0,
    interval: float = 0.1,
    progress: Callable[[int], None] | None = None,
    username: str | None = None,
    ssl_context: ssl.SSLContext | None = None,
) -> float:
    """:func:`meet`, then :func:`wait_converged`; returns the seconds it took to become a full mesh."""
    started = time.monotonic()
    if len(addresses) < 2:
        return 0.0
    conn = {"username": username, "ssl_context": ssl_context}
    meet(addresses, password=password, **conn)
    wait_converged(addresses, password=password, timeout=timeout, interval=interval, progress=progress, **conn)
    return time.monotonic() - started
