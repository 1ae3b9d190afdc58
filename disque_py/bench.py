"""Benchmarks for one disque-py node, with redis-server as a yardstick, and for the cluster bus.

    scripts/bench                         everything (about three minutes, two of them the bus)
    scripts/bench --quick                 smoke run with small n (< 1 minute)
    scripts/bench --only addjob,memory    a subset: addjob, getjob, cycles, memory, redis, bus
    scripts/bench --only bus              only the cluster bus tests (about two minutes)
    python -m disque_py.bench client --port 7711 --duration 5
                                          only the add->get->ack client, against any node

Method
------
The machine is split in two: the server under test runs pinned to CPU 0
(``taskset -c 0``) and the load generator pinned to CPU 1 (``taskset -c 1``),
so the two never compete for a core and the numbers say what *one core* of
server can do. Every test gets a freshly started node, so no test inherits the
heap (Python never returns freed memory to the OS), the queues or the
connections of the one before.

* **Throughput** (``addjob``, ``getjob``): ``redis-benchmark -q`` with 50
  clients and a 100-byte body. ADDJOB is measured unpipelined (-P 1,
  n=100000) and with -P 32 (n=500000). GETJOB NOHANG is measured with -P 32
  on a queue first filled by redis-benchmark with n + clients*pipeline jobs,
  so every GETJOB returns a job: the jobs left over afterwards prove it.
  redis-benchmark shows progress lines separated by ``\\r``; the result is
  the last line containing "requests per second" (requests/s and p50).
* **Yardstick** (``redis``): a ``redis-server --save "" --appendonly no``
  under exactly the same load: LPUSH -P 1, LPUSH -P 32 and RPOP -P 32 on a
  list first filled with LPUSH, same n and body.
* **Cycles** (``cycles``): our own client (:func:`run_cycles`), one Python
  process pinned to CPU 1, drives N connections (default 50) with raw
  non-blocking sockets, an epoll loop and one ``hiredis.Reader`` per
  connection. Each connection loops ``ADDJOB q body 0`` -> ``GETJOB NOHANG
  FROM q`` -> ``ACKJOB id`` with one request in flight, for a fixed duration
  (or count), and records the latency of every whole cycle. Each connection
  has its own queue (``bench-0`` ... ``bench-49``): every GETJOB then returns
  the job that connection just added, so a cycle is always exactly three
  round trips and no connection steals work from another (``--shared-queue``
  uses one queue for all instead). The client reports its own CPU use and the
  orchestrator the server's (from /proc): a server near 100% and a client
  well below it means the client is not the bottleneck. With ``redis`` the
  same client also runs LPUSH -> RPOP -> DEL cycles against redis-server,
  which shows the ceiling of the client itself.
* **Memory** (``memory``): on a fresh node, ``used_memory`` from INFO memory
  (the process RSS in disque-py), then 200,000 (and 1,000,000) jobs with a
  100-byte body added by ``redis-benchmark -P 32``, then ``used_memory``
  again; bytes/job = difference / registered_jobs.
* **Cluster bus** (``bus``): local clusters of real node processes on ports
  ``--base-port + 100`` and up (cluster bus +10000), **not** pinned (the
  kernel spreads them over both CPUs; an idle node needs well under 1% of a
  core). *Idle traffic*: N fresh nodes (3, 10, 30), ``CLUSTER MEET`` of
  every other node sent to node 0, CLUSTER INFO polled on every node every
  100 ms until every node has ``cluster_reachable_nodes`` = N-1 (the star
  join time is reported on the side), 5 s of settling, then the counters
  ``cluster_stats_messages_{sent,received}`` and
  ``cluster_stats_bus_{bytes,frames}_{sent,received}`` (the bus's own byte
  and frame counters) and the CPU time from /proc are sampled on every node,
  again 20 s later, and each node's rates are computed over its own interval;
  the table shows mean, min and max across nodes. *Chain join*: 10 fresh
  nodes, ``CLUSTER MEET`` i -> i+1 sent to node i (0-1, 1-2, ..., 8-9), the
  clock started just before the first MEET; CLUSTER INFO is polled on every
  node every 50 ms (one connection per node) and the time is taken at the end
  of the first polling round in which every node reports N-1 (so it is up to
  ~50 ms late); three runs with fresh nodes, and their median. Nodes are
  stopped with ``SHUTDOWN`` after each test, and killed if they linger 10 s.
  Every wait has a deadline; a node that exits fails the run with its log.
The Markdown table goes to stdout; the raw results, the machine (nproc, CPU
model, Python, redis-benchmark version, git commit) and the exact commands go
to a JSON file (``bench-results/`` by default, or ``--write FILE``). Every
process started is stopped on exit, even on Ctrl-C or SIGTERM.
"""

from __future__ import annotations

import argparse
import datetime as _dt
import json
import os
import platform
import re
import resource
import select
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

ROOT = Path(__file__).resolve().parents[1]
HOST = "127.0.0.1"
SERVER_CPU = "0"
CLIENT_CPU = "1"
#: Load generator CPU use (% of its one core) from which a result is flagged as client-bound.
CLIENT_BOUND_PCT = 90
SUITES = ("addjob", "getjob", "cycles", "memory", "redis", "bus")
#: The bus suite's node i listens on --base-port + BUS_PORT_SHIFT + i (cluster bus: that + 10000).
BUS_PORT_SHIFT = 100
#: Disque's cluster-node-timeout default (ms), used when --cluster-node-timeout is not given.
DEFAULT_NODE_TIMEOUT = 15000
#: How often the join tests poll CLUSTER INFO on every node: the chain join (the measured
#: figure) and the star join before the idle measurement (only reported on the side).
CHAIN_POLL = 0.05
STAR_POLL = 0.1

#: Disque 1.0-rc1 (C) on this machine class with 50 clients, and our targets (from the issue).
REFERENCE = {
    "addjob_p1": ("125-149k/s", 40_000, ">= 40k/s"),
    "addjob_p32": ("297-334k/s", 150_000, ">= 150k/s"),
    "getjob_p32": ("~293k/s", 150_000, ">= 150k/s"),
    "memory": ("~580 bytes/job", 800, "<= 800 bytes/job"),
}


class BenchError(Exception):
    """A clear, user-facing failure (missing tool, busy port, node died)."""


def log(msg: str) -> None:
    print(">> " + msg, file=sys.stderr, flush=True)


# --------------------------------------------------------------------------- sizes


@dataclass
class Sizes:
    """How much work each test does: n for -P 1 and -P 32, jobs for memory, seconds of cycles."""

    n_p1: int = 100_000
    n_p32: int = 500_000
    memory_jobs: tuple[int, ...] = (200_000, 1_000_000)
    duration: float = 10.0
    #: bus: cluster sizes of the idle-traffic test, its settling time and measurement window.
    bus_nodes: tuple[int, ...] = (3, 10, 30)
    bus_settle: float = 5.0
    bus_window: float = 20.0
    #: bus: nodes of the chain-join test and how many times it is repeated (fresh nodes each time).
    chain_nodes: int = 10
    chain_runs: int = 3

    @classmethod
    def quick(cls) -> "Sizes":
        return cls(n_p1=20_000, n_p32=100_000, memory_jobs=(50_000,), duration=2.0,
                   bus_nodes=(3, 10), bus_settle=2.0, bus_window=5.0, chain_runs=1)  # fmt: skip


# --------------------------------------------------------------------------- RESP helpers


def encode(*args: str | bytes | int) -> bytes:
    """One command in RESP (array of bulk strings)."""
    out = [b"*%d\r\n" % len(args)]
    for a in args:
        if isinstance(a, int):
            a = str(a)
        if isinstance(a, str):
            a = a.encode()
        out.append(b"$%d\r\n%s\r\n" % (len(a), a))
    return b"".join(out)


class SyncClient:
    """A tiny blocking client (hiredis parser) for INFO, QLEN, PING and friends."""

    def __init__(self, port: int, timeout: float = 30.0) -> None:
        import hiredis

        self.sock = socket.create_connection((HOST, port), timeout=timeout)
        self.reader = hiredis.Reader()

    def call(self, *args: str | bytes | int) -> Any:
        self.sock.sendall(encode(*args))
        while True:
            reply = self.reader.gets()
            if reply is not False:
                if isinstance(reply, Exception):
                    raise BenchError("%s: %s" % (" ".join(map(str, args)), reply))
                return reply
            data = self.sock.recv(65536)
            if not data:
                raise ConnectionError("connection closed by the server")
            self.reader.feed(data)

    def info(self, section: str) -> dict[str, str]:
        text = self.call("INFO", section).decode()
        return dict(line.split(":", 1) for line in text.splitlines() if ":" in line and not line.startswith("#"))

    def close(self) -> None:
        self.sock.close()

    def __enter__(self) -> "SyncClient":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


# --------------------------------------------------------------------------- the cycle client


def run_cycles(
    port: int,
    *,
    conns: int = 50,
    duration: float | None = 10.0,
    count: int | None = None,
    body_size: int = 100,
    kind: str = "disque",
    shared_queue: bool = False,
) -> dict[str, Any]:
    """Drive ``conns`` connections through add -> get -> ack cycles; return stats.

    ``kind="disque"``: ``ADDJOB q body 0`` -> ``GETJOB NOHANG FROM q`` ->
    ``ACKJOB id``. ``kind="redis"``: ``LPUSH q body`` -> ``RPOP q`` -> ``DEL q``,
    the same shape of traffic against redis-server, to measure the client's own
    ceiling. Each connection has one request in flight; the cycle latency is
    from sending the first command to reading the third reply. Runs for
    ``duration`` seconds, or until ``count`` cycles completed when given; no
    cycle is started after the deadline and the ones in flight are finished.
    """
    import hiredis

    if kind not in ("disque", "redis"):
        raise ValueError("kind must be 'disque' or 'redis'")
    body = b"x" * body_size
    ReplyError = hiredis.ReplyError

    class Conn:
        __slots__ = ("sock", "reader", "stage", "t0", "first", "second", "third")

    by_fd: dict[int, Conn] = {}
    ep = select.epoll()
    for i in range(conns):
        queue = b"bench-q" if shared_queue else b"bench-%d" % i
        c = Conn()
        c.sock = socket.create_connection((HOST, port), timeout=10)
        c.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        # Non-blocking: no poll() inside each send/recv as with a timeout. A send of one
        # small command with nothing else in flight always fits the socket buffer.
        c.sock.setblocking(False)
        c.reader = hiredis.Reader()
        c.stage = 0
        c.t0 = 0.0
        if kind == "disque":
            c.first = encode(b"ADDJOB", queue, body, b"0")
            c.second = encode(b"GETJOB", b"NOHANG", b"FROM", queue)
            c.third = None
        else:
            c.first = encode(b"LPUSH", queue, body)
            c.second = encode(b"RPOP", queue)
            c.third = encode(b"DEL", queue)
        by_fd[c.sock.fileno()] = c
        ep.register(c.sock.fileno(), select.EPOLLIN)

    def fail(c: Conn, reply: Any) -> None:
        raise BenchError("unexpected reply at step %d of a cycle: %r" % (c.stage + 1, reply))

    latencies: list[float] = []
    record = latencies.append
    now = time.perf_counter
    empty_gets = 0
    started = 0
    limit = count if count is not None else float("inf")
    ru0 = resource.getrusage(resource.RUSAGE_SELF)
    t_start = now()
    deadline = t_start + duration if (duration is not None and count is None) else float("inf")
    active = 0
    for c in by_fd.values():
        if started >= limit:
            break
        started += 1
        active += 1
        c.t0 = now()
        c.sock.send(c.first)
    t_last = t_start
    ackjob_head = b"*2\r\n$6\r\nACKJOB\r\n$%d\r\n"

    while active:
        events = ep.poll(5.0)
        if not events:
            raise BenchError("no reply for 5 s from port %d" % port)
        for fd, _ in events:
            c = by_fd[fd]
            try:
                data = c.sock.recv(65536)
            except BlockingIOError:
                continue
            if not data:
                raise BenchError("the server closed a connection")
            c.reader.feed(data)
            reply = c.reader.gets()
            while reply is not False:
                if isinstance(reply, ReplyError):
                    fail(c, reply)
                stage = c.stage
                if stage == 0:  # ADDJOB / LPUSH replied
                    c.stage = 1
                    c.sock.send(c.second)
                elif stage == 1:  # GETJOB / RPOP replied
                    if reply is None:
                        empty_gets += 1
                        c.sock.send(c.second)
                    elif c.third is None:
                        if type(reply) is not list:
                            fail(c, reply)
                        job_id = reply[0][1]
                        c.stage = 2
                        c.sock.send(ackjob_head % len(job_id) + job_id + b"\r\n")
                    else:
                        c.stage = 2
                        c.sock.send(c.third)
                else:  # ACKJOB / DEL replied: one cycle done
                    if type(reply) is not int:
                        fail(c, reply)
                    t = now()
                    record(t - c.t0)
                    t_last = t
                    if t < deadline and started < limit:
                        started += 1
                        c.stage = 0
                        c.t0 = t
                        c.sock.send(c.first)
                    else:
                        active -= 1
                reply = c.reader.gets()

    ru1 = resource.getrusage(resource.RUSAGE_SELF)
    for c in by_fd.values():
        c.sock.close()
    ep.close()
    elapsed = t_last - t_start
    cpu = (ru1.ru_utime - ru0.ru_utime) + (ru1.ru_stime - ru0.ru_stime)
    latencies.sort()
    done = len(latencies)

    def pct(p: float) -> float:
        return round(latencies[min(done - 1, int(p / 100.0 * done))] * 1000.0, 3) if done else 0.0

    return {
        "kind": kind,
        "conns": conns,
        "queues": "shared" if shared_queue else "per-connection",
        "body_size": body_size,
        "cycles": done,
        "elapsed_s": round(elapsed, 3),
        "cycles_per_s": round(done / elapsed, 1) if elapsed > 0 else 0.0,
        "requests_per_s": round(3 * done / elapsed, 1) if elapsed > 0 else 0.0,
        "p50_ms": pct(50),
        "p99_ms": pct(99),
        "p999_ms": pct(99.9),
        "max_ms": round(latencies[-1] * 1000.0, 3) if done else 0.0,
        "empty_gets": empty_gets,
        "client_cpu_pct": round(100.0 * cpu / elapsed, 1) if elapsed > 0 else 0.0,
    }


def client_main(argv: list[str]) -> int:
    """``python -m disque_py.bench client ...``: run :func:`run_cycles`, print JSON."""
    p = argparse.ArgumentParser(prog="python -m disque_py.bench client", description=run_cycles.__doc__)
    p.add_argument("--port", type=int, default=7711)
    p.add_argument("--conns", type=int, default=50)
    p.add_argument("--duration", type=float, default=10.0, help="seconds (default 10)")
    p.add_argument("--count", type=int, default=None, help="total cycles instead of a duration")
    p.add_argument("--body-size", type=int, default=100)
    p.add_argument("--kind", choices=("disque", "redis"), default="disque")
    p.add_argument("--shared-queue", action="store_true", help="one queue for all connections")
    a = p.parse_args(argv)
    try:
        result = run_cycles(
            a.port, conns=a.conns, duration=a.duration, count=a.count,
            body_size=a.body_size, kind=a.kind, shared_queue=a.shared_queue,
        )  # fmt: skip
    except (BenchError, OSError) as exc:
        print("error: %s" % exc, file=sys.stderr)
        return 1
    print(json.dumps(result))
    return 0


# --------------------------------------------------------------------------- processes


def port_in_use(port: int) -> bool:
    with socket.socket() as s:
        s.settimeout(0.5)
        return s.connect_ex((HOST, port)) == 0


def proc_cpu_seconds(pid: int) -> float | None:
    """utime + stime of a running process, from /proc/PID/stat."""
    try:
        with open("/proc/%d/stat" % pid) as f:
            fields = f.read().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    except (OSError, IndexError, ValueError):
        return None


class Server:
    """A server process (disque-py or redis-server) pinned to the server CPU."""

    def __init__(self, kind: str, argv: list[str], port: int, workdir: Path) -> None:
        self.kind = kind
        self.argv = argv
        self.port = port
        self.workdir = workdir
        self.log_path = workdir / "log"
        self.proc: subprocess.Popen | None = None

    def start(self, timeout: float = 20.0) -> "Server":
        self.spawn()
        self.wait_ready(timeout)
        return self

    def spawn(self) -> "Server":
        """Start the process without waiting for it to answer (see :meth:`wait_ready`)."""
        if port_in_use(self.port):
            raise BenchError("port %d is already in use: pick another with --base-port" % self.port)
        stderr = open(self.workdir / "stderr", "ab")
        try:
            self.proc = subprocess.Popen(
                self.argv, cwd=str(self.workdir), stdin=subprocess.DEVNULL, stdout=stderr,
                stderr=subprocess.STDOUT, start_new_session=True,
            )  # fmt: skip
        finally:
            stderr.close()
        return self

    def wait_ready(self, timeout: float) -> None:
        """Poll PING until it answers, the process dies, or the deadline passes."""
        deadline = time.monotonic() + timeout
        last: Exception | None = None
        while time.monotonic() < deadline:
            assert self.proc is not None
            if self.proc.poll() is not None:
                raise BenchError(
                    "%s on port %d exited with %s:\n%s" % (self.kind, self.port, self.proc.returncode, self.tail())
                )
            try:
                with SyncClient(self.port, timeout=1.0) as c:
                    if c.call("PING") in (b"PONG", "PONG"):
                        return
            except (OSError, BenchError) as exc:
                last = exc
            time.sleep(0.01)
        raise BenchError(
            "%s on port %d did not answer PING within %.0f s (%r)\n%s"
            % (self.kind, self.port, timeout, last, self.tail())
        )

    def tail(self, lines: int = 20) -> str:
        text = ""
        for name in ("stderr", "log"):
            try:
                text += (self.workdir / name).read_text(errors="replace")
            except OSError:
                pass
        return "\n".join(text.splitlines()[-lines:])

    def cpu_seconds(self) -> float | None:
        return proc_cpu_seconds(self.proc.pid) if self.proc else None

    def stop(self, timeout: float = 10.0) -> None:
        """SIGTERM, then SIGKILL to the whole process group if it lingers."""
        if self.proc is None or self.proc.poll() is not None:
            return
        try:
            self.proc.terminate()
            self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            log("%s on port %d ignored SIGTERM for %.0f s: killing it" % (self.kind, self.port, timeout))
        finally:
            if self.proc.poll() is None:
                try:
                    os.killpg(self.proc.pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
                self.proc.wait(5)


# --------------------------------------------------------------------------- the runner


def parse_redis_benchmark(output: str) -> tuple[float, float | None, str]:
    """(requests/s, p50 ms or None, the result line) from ``redis-benchmark -q`` output."""
    lines = [ln.strip() for ln in re.split(r"[\r\n]+", output) if "requests per second" in ln]
    if not lines:
        raise BenchError("no 'requests per second' line in redis-benchmark output:\n%s" % output[-2000:])
    line = lines[-1]
    m = re.search(r"([\d.]+) requests per second(?:, p50=([\d.]+) msec)?", line)
    if not m:
        raise BenchError("cannot parse redis-benchmark line: %r" % line)
    return float(m.group(1)), (float(m.group(2)) if m.group(2) else None), line


@dataclass
class Bench:
    """One benchmark run: options, started processes, results and commands."""

    sizes: Sizes
    base_port: int
    clients: int = 50
    body_size: int = 100
    conns: int = 50
    cycles_count: int | None = None
    shared_queue: bool = False
    node_timeout: int | None = None  # bus suite: --cluster-node-timeout for every node, None = default
    python: str = sys.executable
    servers: list[Server] = field(default_factory=list)
    commands: list[str] = field(default_factory=list)
    results: dict[str, Any] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)
    tmp: Path = field(default_factory=lambda: Path(tempfile.mkdtemp(prefix="disque-bench-")))

    @property
    def body(self) -> str:
        return "x" * self.body_size

    def record(self, argv: list[str]) -> None:
        self.commands.append(shlex.join(argv))

    # ---- servers

    def disque_argv(self, port: int, workdir: Path) -> list[str]:
        exe = Path(self.python).with_name("disque-py")
        cmd = [str(exe)] if exe.exists() else [self.python, "-m", "disque_py.cli"]
        return ["taskset", "-c", SERVER_CPU, *cmd, "server", "--port", str(port), "--dir", str(workdir),
                "--bind", HOST, "--logfile", str(workdir / "log")]  # fmt: skip

    def redis_argv(self, port: int, workdir: Path) -> list[str]:
        return ["taskset", "-c", SERVER_CPU, "redis-server", "--port", str(port), "--save", "", "--appendonly", "no",
                "--bind", HOST, "--dir", str(workdir), "--logfile", str(workdir / "log")]  # fmt: skip

    def start(self, kind: str) -> Server:
        """A fresh server: new process, new empty directory."""
        port = self.base_port if kind == "disque-py" else self.base_port + 1
        workdir = Path(tempfile.mkdtemp(prefix="%s-" % kind, dir=self.tmp))
        argv = self.disque_argv(port, workdir) if kind == "disque-py" else self.redis_argv(port, workdir)
        self.record(argv)
        server = Server(kind, argv, port, workdir)
        self.servers.append(server)
        return server.start()

    def stop(self, server: Server) -> None:
        server.stop()
        if server in self.servers:
            self.servers.remove(server)

    def stop_all(self) -> None:
        for server in list(self.servers):  # SIGTERM to all first: many nodes then stop in parallel
            if server.proc is not None and server.proc.poll() is None:
                try:
                    server.proc.terminate()
                except OSError:
                    pass
        for server in list(self.servers):
            try:
                self.stop(server)
            except Exception as exc:  # noqa: BLE001 - keep stopping the others
                log("could not stop %s on port %d: %s" % (server.kind, server.port, exc))
        shutil.rmtree(self.tmp, ignore_errors=True)

    # ---- loads

    def redis_benchmark(self, server: Server, n: int, pipeline: int, *command: str) -> dict[str, Any]:
        """One redis-benchmark run pinned to the client CPU, with CPU use of both sides."""
        argv = ["taskset", "-c", CLIENT_CPU, "redis-benchmark", "-h", HOST, "-p", str(server.port),
                "-c", str(self.clients), "-n", str(n), "-P", str(pipeline), "-q", *command]  # fmt: skip
        self.record(argv)
        cpu0, ru0, t0 = server.cpu_seconds(), resource.getrusage(resource.RUSAGE_CHILDREN), time.monotonic()
        proc = subprocess.run(argv, capture_output=True, text=True, errors="replace")
        wall = time.monotonic() - t0
        cpu1, ru1 = server.cpu_seconds(), resource.getrusage(resource.RUSAGE_CHILDREN)
        if proc.returncode != 0:
            raise BenchError(
                "redis-benchmark failed (%d): %s\n%s" % (proc.returncode, shlex.join(argv), proc.stderr[-2000:])
            )
        rps, p50, line = parse_redis_benchmark(proc.stdout)
        client_cpu = (ru1.ru_utime - ru0.ru_utime) + (ru1.ru_stime - ru0.ru_stime)
        return {
            "command": " ".join("<%d-byte body>" % len(a) if a == self.body else a for a in command),
            "n": n,
            "pipeline": pipeline,
            "clients": self.clients,
            "requests_per_s": rps,
            "p50_ms": p50,
            "wall_s": round(wall, 2),
            "server_cpu_pct": round(100.0 * (cpu1 - cpu0) / wall, 1) if cpu0 is not None and cpu1 is not None else None,
            "client_cpu_pct": round(100.0 * client_cpu / wall, 1),
            "raw": line,
        }

    def run_client(self, server: Server, kind: str) -> dict[str, Any]:
        """The cycle client in its own process pinned to the client CPU."""
        argv = ["taskset", "-c", CLIENT_CPU, self.python, "-m", "disque_py.bench", "client", "--port", str(server.port),
                "--conns", str(self.conns), "--body-size", str(self.body_size), "--kind", kind]  # fmt: skip
        if self.cycles_count:
            argv += ["--count", str(self.cycles_count)]
        else:
            argv += ["--duration", str(self.sizes.duration)]
        if self.shared_queue:
            argv.append("--shared-queue")
        self.record(argv)
        cpu0 = server.cpu_seconds()
        proc = subprocess.run(argv, capture_output=True, text=True, cwd=str(ROOT))
        cpu1 = server.cpu_seconds()
        if proc.returncode != 0:
            raise BenchError("cycle client failed (%d): %s" % (proc.returncode, proc.stderr.strip()[-2000:]))
        result = json.loads(proc.stdout.strip().splitlines()[-1])
        if cpu0 is not None and cpu1 is not None and result["elapsed_s"] > 0:
            result["server_cpu_pct"] = round(100.0 * (cpu1 - cpu0) / result["elapsed_s"], 1)
        return result

    # ---- the suites

    def bench_addjob(self) -> None:
        for key, n, pipeline in (("addjob_p1", self.sizes.n_p1, 1), ("addjob_p32", self.sizes.n_p32, 32)):
            log("ADDJOB -P %d, n=%d" % (pipeline, n))
            node = self.start("disque-py")
            try:
                r = self.redis_benchmark(node, n, pipeline, "ADDJOB", "q", self.body, "0")
                with SyncClient(node.port) as c:
                    r["registered_jobs"] = int(c.info("jobs")["registered_jobs"])
                if r["registered_jobs"] < n:
                    self.notes.append("%s: only %d of %d jobs registered" % (key, r["registered_jobs"], n))
                self.results[key] = r
            finally:
                self.stop(node)

    def fill_then(
        self, server: Server, n: int, fill: tuple[str, ...], measure: tuple[str, ...], length: tuple[str, ...]
    ) -> dict[str, Any]:
        """Fill a queue/list with n + clients*32 items, then measure ``measure`` with -P 32."""
        fill_n = n + self.clients * 32
        filled = self.redis_benchmark(server, fill_n, 32, *fill)
        with SyncClient(server.port) as c:
            before = int(c.call(*length))
        r = self.redis_benchmark(server, n, 32, *measure)
        with SyncClient(server.port) as c:
            left = int(c.call(*length))
        r.update(filled=before, served=before - left, left=left, fill_requests_per_s=filled["requests_per_s"])
        return r

    def bench_getjob(self) -> None:
        n = self.sizes.n_p32
        log("GETJOB NOHANG -P 32, n=%d (queue filled first with ADDJOB -P 32)" % n)
        node = self.start("disque-py")
        try:
            r = self.fill_then(
                node, n, ("ADDJOB", "q", self.body, "0"), ("GETJOB", "NOHANG", "FROM", "q"), ("QLEN", "q")
            )
            if r["left"] <= 0:
                self.notes.append("getjob_p32: the queue ran dry, some GETJOBs may have returned nothing")
            self.results["getjob_p32"] = r
        finally:
            self.stop(node)

    def bench_cycles(self) -> None:
        log("ADDJOB -> GETJOB NOHANG -> ACKJOB cycles, %d connections" % self.conns)
        node = self.start("disque-py")
        try:
            r = self.run_client(node, "disque")
            with SyncClient(node.port) as c:
                r["registered_jobs_after"] = int(c.info("jobs")["registered_jobs"])
            self.results["cycles"] = r
        finally:
            self.stop(node)

    def bench_memory(self) -> None:
        for jobs in self.sizes.memory_jobs:
            log("memory per job: %d jobs with a %d-byte body" % (jobs, self.body_size))
            node = self.start("disque-py")
            try:
                with SyncClient(node.port) as c:
                    before = int(c.info("memory")["used_memory"])
                t0 = time.monotonic()
                fill = self.redis_benchmark(node, jobs, 32, "ADDJOB", "q", self.body, "0")
                with SyncClient(node.port) as c:
                    after = int(c.info("memory")["used_memory"])
                    registered = int(c.info("jobs")["registered_jobs"])
                if registered < jobs:
                    self.notes.append("memory: only %d of %d jobs registered" % (registered, jobs))
                self.results["memory_%d" % jobs] = {
                    "jobs": registered,
                    "body_size": self.body_size,
                    "used_memory_before": before,
                    "used_memory_after": after,
                    "bytes_per_job": round((after - before) / registered, 1) if registered else None,
                    "fill_requests_per_s": fill["requests_per_s"],
                    "fill_s": round(time.monotonic() - t0, 2),
                }
            finally:
                self.stop(node)

    def bench_redis(self) -> None:
        if not shutil.which("redis-server"):
            note = "redis-server not found: the redis yardstick was skipped (apt-get install redis-server)"
            log(note)
            self.notes.append(note)
            return
        for key, n, pipeline in (("redis_lpush_p1", self.sizes.n_p1, 1), ("redis_lpush_p32", self.sizes.n_p32, 32)):
            log("redis-server LPUSH -P %d, n=%d" % (pipeline, n))
            server = self.start("redis-server")
            try:
                self.results[key] = self.redis_benchmark(server, n, pipeline, "LPUSH", "q", self.body)
            finally:
                self.stop(server)
        n = self.sizes.n_p32
        log("redis-server RPOP -P 32, n=%d (list filled first with LPUSH -P 32)" % n)
        server = self.start("redis-server")
        try:
            self.results["redis_rpop_p32"] = self.fill_then(
                server, n, ("LPUSH", "q", self.body), ("RPOP", "q"), ("LLEN", "q")
            )
        finally:
            self.stop(server)
        log("redis-server LPUSH -> RPOP -> DEL cycles (the client's own ceiling)")
        server = self.start("redis-server")
        try:
            self.results["redis_cycles"] = self.run_client(server, "redis")
        finally:
            self.stop(server)

    # ---- the bus suite: local clusters of real processes

    @property
    def timeout_ms(self) -> int:
        return self.node_timeout or DEFAULT_NODE_TIMEOUT

    def bus_port(self, i: int) -> int:
        return self.base_port + BUS_PORT_SHIFT + i

    def cluster_node_argv(self, port: int, workdir: Path) -> list[str]:
        """A cluster node: not pinned, so the kernel spreads the nodes over both CPUs."""
        exe = Path(self.python).with_name("disque-py")
        cmd = [str(exe)] if exe.exists() else [self.python, "-m", "disque_py.cli"]
        argv = [*cmd, "server", "--port", str(port), "--dir", str(workdir), "--bind", HOST,
                "--logfile", str(workdir / "log")]  # fmt: skip
        if self.node_timeout:
            argv += ["--cluster-node-timeout", str(self.node_timeout)]
        return argv

    def start_cluster_nodes(self, count: int, label: str) -> list[Server]:
        """``count`` fresh nodes (new processes, new empty directories), all answering PING."""
        nodes: list[Server] = []
        for i in range(count):
            port = self.bus_port(i)
            workdir = Path(tempfile.mkdtemp(prefix="%s-node%d-" % (label, i), dir=self.tmp))
            argv = self.cluster_node_argv(port, workdir)
            self.record(argv)
            node = Server("disque-py", argv, port, workdir)
            node.spawn()
            nodes.append(node)
            self.servers.append(node)
        # 30 interpreters starting at once on 2 cores take a while: one deadline for all.
        deadline = time.monotonic() + 30.0 + 2.0 * count
        for node in nodes:
            node.wait_ready(max(1.0, deadline - time.monotonic()))
        return nodes

    def shutdown_nodes(self, nodes: list[Server], timeout: float = 10.0) -> int:
        """SHUTDOWN to every node, wait for them to exit, SIGTERM/SIGKILL leftovers; returns the leftovers."""
        for node in nodes:
            if node.proc is not None and node.proc.poll() is None:
                try:
                    with SyncClient(node.port, timeout=2.0) as c:
                        c.call("SHUTDOWN")  # no reply: the node closes the connection
                except (OSError, BenchError):
                    pass
        deadline = time.monotonic() + timeout
        leftovers = 0
        for node in nodes:
            if node.proc is None:
                continue
            try:
                node.proc.wait(max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                leftovers += 1
                log("node on port %d still running %.0f s after SHUTDOWN: stopping it" % (node.port, timeout))
            self.stop(node)  # SIGTERM, then SIGKILL to the group; no-op if it already exited
        if leftovers:
            self.notes.append("bus: %d node(s) did not exit within %.0f s of SHUTDOWN and were killed"
                              % (leftovers, timeout))  # fmt: skip
        return leftovers

    @staticmethod
    def cluster_info(client: SyncClient) -> dict[str, str]:
        text = client.call("CLUSTER", "INFO")
        text = text.decode() if isinstance(text, bytes) else str(text)
        return dict(line.split(":", 1) for line in text.splitlines() if ":" in line)

    def wait_joined(
        self, nodes: list[Server], conns: list[SyncClient], t0: float, timeout: float, interval: float
    ) -> dict[str, Any]:
        """Poll CLUSTER INFO on every node every ``interval`` s until, in one round, every node
        has cluster_reachable_nodes == N-1. Returns the seconds since ``t0`` at the end of that
        round, and when each node first reported N-1."""
        want = len(nodes) - 1
        first: list[float | None] = [None] * len(nodes)
        deadline = t0 + timeout
        rounds = 0
        next_round = time.monotonic()
        while True:
            reach = []
            for i, (node, c) in enumerate(zip(nodes, conns)):
                if node.proc is not None and node.proc.poll() is not None:
                    raise BenchError("node on port %d exited during the join:\n%s" % (node.port, node.tail()))
                r = int(self.cluster_info(c)["cluster_reachable_nodes"])
                if r == want and first[i] is None:
                    first[i] = time.monotonic() - t0
                reach.append(r)
            rounds += 1
            now = time.monotonic()
            if all(r == want for r in reach):
                return {"joined_s": round(now - t0, 3), "rounds": rounds, "poll_interval_s": interval,
                        "node_first_s": [round(f, 3) for f in first if f is not None]}  # fmt: skip
            if now > deadline:
                raise BenchError(
                    "%d nodes did not all reach cluster_reachable_nodes=%d within %.0f s; last counts: %s"
                    % (len(nodes), want, timeout, reach)
                )
            next_round += interval
            time.sleep(max(0.0, next_round - time.monotonic()))
            if next_round < time.monotonic() - interval:  # fell behind: do not burst
                next_round = time.monotonic()

    def sample_bus(self, nodes: list[Server], conns: list[SyncClient]) -> list[dict[str, Any]]:
        """CLUSTER INFO counters and CPU seconds of every node, each with its own timestamp."""
        out = []
        for node, c in zip(nodes, conns):
            ta = time.monotonic()
            info = self.cluster_info(c)
            tb = time.monotonic()
            row: dict[str, Any] = {"t": (ta + tb) / 2, "cpu_s": node.cpu_seconds()}
            for key in ("messages_sent", "messages_received", "bus_bytes_sent", "bus_bytes_received",
                        "bus_frames_sent", "bus_frames_received", "links_closed"):  # fmt: skip
                if "cluster_stats_" + key not in info:
                    raise BenchError("CLUSTER INFO on port %d has no cluster_stats_%s" % (node.port, key))
                row[key] = int(info["cluster_stats_" + key])
            row["reachable"] = int(info["cluster_reachable_nodes"])
            row["known"] = int(info["cluster_known_nodes"])
            out.append(row)
        return out

    def bus_idle(self, n: int) -> dict[str, Any]:
        """Idle bus traffic per node in a fully joined cluster of ``n`` local nodes."""
        log("bus: idle traffic, %d nodes (start, MEET all from node 0, settle %.0f s, measure %.0f s)"
            % (n, self.sizes.bus_settle, self.sizes.bus_window))  # fmt: skip
        t_start = time.monotonic()
        nodes = self.start_cluster_nodes(n, "idle%d" % n)
        conns: list[SyncClient] = []
        try:
            started_s = time.monotonic() - t_start
            conns = [SyncClient(node.port, timeout=10.0) for node in nodes]
            t0 = time.monotonic()
            for node in nodes[1:]:
                conns[0].call("CLUSTER", "MEET", HOST, str(node.port))
            joined = self.wait_joined(nodes, conns, t0, timeout=60.0 + 2.0 * n, interval=STAR_POLL)
            log("bus: %d nodes joined in %.2f s" % (n, joined["joined_s"]))
            time.sleep(self.sizes.bus_settle)
            s0 = self.sample_bus(nodes, conns)
            time.sleep(self.sizes.bus_window)
            s1 = self.sample_bus(nodes, conns)
        finally:
            for c in conns:
                c.close()
            leftovers = self.shutdown_nodes(nodes)

        per_node = []
        for a, b in zip(s0, s1):
            dt = b["t"] - a["t"]
            row = {k: round((b[k] - a[k]) / dt, 2) for k in ("messages_sent", "messages_received", "bus_bytes_sent",
                   "bus_bytes_received", "bus_frames_sent", "bus_frames_received")}  # fmt: skip
            row["window_s"] = round(dt, 3)
            row["cpu_pct"] = (round(100.0 * (b["cpu_s"] - a["cpu_s"]) / dt, 2)
                              if a["cpu_s"] is not None and b["cpu_s"] is not None else None)  # fmt: skip
            row["links_closed"] = b["links_closed"] - a["links_closed"]
            row["reachable_end"] = b["reachable"]
            row["known_end"] = b["known"]
            per_node.append(row)

        def spread(key: str) -> dict[str, float]:
            vals = [r[key] for r in per_node if r[key] is not None]
            return {"mean": round(sum(vals) / len(vals), 2), "min": min(vals), "max": max(vals)} if vals else {}

        timeout_s = self.timeout_ms / 1000.0
        pings = 1.0 + n / (timeout_s / 2.0)
        result = {
            "nodes": n,
            "node_timeout_ms": self.timeout_ms,
            "start_s": round(started_s, 2),
            "join": joined,
            "settle_s": self.sizes.bus_settle,
            "window_s": self.sizes.bus_window,
            **{key: spread(key) for key in ("messages_sent", "messages_received", "bus_bytes_sent",
                                            "bus_bytes_received", "bus_frames_sent", "bus_frames_received",
                                            "cpu_pct")},
            "bytes_per_frame_sent": round(sum(r["bus_bytes_sent"] for r in per_node)
                                          / max(1e-9, sum(r["bus_frames_sent"] for r in per_node)), 1),
            "links_closed_in_window": sum(r["links_closed"] for r in per_node),
            "reachable_end_min": min(r["reachable_end"] for r in per_node),
            "estimate_pings_per_s": round(pings, 2),
            "estimate_messages_per_s": round(2 * pings, 2),
            "leftovers_killed": leftovers,
            "per_node": per_node,
        }  # fmt: skip
        if result["reachable_end_min"] != n - 1:
            self.notes.append("bus %d nodes: a node saw only %d of %d others reachable at the end of the window"
                              % (n, result["reachable_end_min"], n - 1))  # fmt: skip
        if result["links_closed_in_window"]:
            self.notes.append("bus %d nodes: %d link(s) closed during the measurement window"
                              % (n, result["links_closed_in_window"]))  # fmt: skip
        return result

    def bus_chain(self, run: int) -> dict[str, Any]:
        """Start fresh nodes, MEET i -> i+1 (sent to node i), time until every node sees all others."""
        n = self.sizes.chain_nodes
        log("bus: chain join of %d nodes, run %d of %d" % (n, run + 1, self.sizes.chain_runs))
        nodes = self.start_cluster_nodes(n, "chain%d" % run)
        conns: list[SyncClient] = []
        try:
            conns = [SyncClient(node.port, timeout=10.0) for node in nodes]
            t0 = time.monotonic()
            for i in range(n - 1):
                conns[i].call("CLUSTER", "MEET", HOST, str(nodes[i + 1].port))
            meets_s = time.monotonic() - t0
            r = self.wait_joined(nodes, conns, t0, timeout=60.0 + 4.0 * n + 2.0 * self.timeout_ms / 1000.0,
                                 interval=CHAIN_POLL)  # fmt: skip
            r["meets_sent_s"] = round(meets_s, 4)
            log("bus: chain of %d joined in %.2f s" % (n, r["joined_s"]))
        finally:
            for c in conns:
                c.close()
            r_left = self.shutdown_nodes(nodes)
        r["leftovers_killed"] = r_left
        return r

    def bench_bus(self) -> None:
        for n in self.sizes.bus_nodes:
            self.results["bus_idle_%d" % n] = self.bus_idle(n)
        runs = [self.bus_chain(i) for i in range(self.sizes.chain_runs)]
        times = sorted(r["joined_s"] for r in runs)
        mid = len(times) // 2
        median = times[mid] if len(times) % 2 else (times[mid - 1] + times[mid]) / 2
        self.results["bus_chain_%d" % self.sizes.chain_nodes] = {
            "nodes": self.sizes.chain_nodes,
            "node_timeout_ms": self.timeout_ms,
            "poll_interval_s": CHAIN_POLL,
            "joined_s": [r["joined_s"] for r in runs],
            "median_s": round(median, 3),
            "runs": runs,
        }


# --------------------------------------------------------------------------- machine, report


def _run(argv: list[str]) -> str:
    try:
        return subprocess.run(argv, capture_output=True, text=True, cwd=str(ROOT), timeout=10).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return ""


def machine_info(python: str) -> dict[str, Any]:
    model = ""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    commit = _run(["git", "rev-parse", "HEAD"])
    dirty = bool(_run(["git", "status", "--porcelain", "--untracked-files=no"]))
    return {
        "nproc": os.cpu_count(),
        "cpu_model": model,
        "kernel": platform.release(),
        "python": _run([python, "-c", "import sys; print(sys.version.split()[0])"]) or platform.python_version(),
        "redis_benchmark": _run(["redis-benchmark", "--version"]),
        "redis_server": _run(["redis-server", "--version"]),
        "git_commit": commit + ("-dirty" if dirty else ""),
        "date": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
    }


def _rate(v: float | None, unit: str = "/s") -> str:
    return "—" if v is None else "{:,.0f}{}".format(v, unit)


def _ms(v: float | None) -> str:
    return "—" if v is None else "%.2f ms" % v


def _meets(value: float | None, target: float, higher_is_better: bool = True) -> str:
    if value is None:
        return "—"
    ok = value >= target if higher_is_better else value <= target
    return "yes" if ok else "**NO**"


def _spread(d: dict[str, float], fmt: str = "{:,.1f}") -> str:
    if not d:
        return "—"
    return "%s (%s–%s)" % (fmt.format(d["mean"]), fmt.format(d["min"]), fmt.format(d["max"]))


def bus_report(bench: Bench) -> list[str]:
    """The bus suite's two tables (idle traffic per node, chain join), or nothing."""
    res, sizes = bench.results, bench.sizes
    idle = sorted((r for k, r in res.items() if k.startswith("bus_idle_")), key=lambda r: r["nodes"])
    chain = [r for k, r in res.items() if k.startswith("bus_chain_")]
    if not idle and not chain:
        return []
    out: list[str] = []
    if idle:
        r0 = idle[0]
        out += [
            "Idle cluster bus traffic per node: local nodes, not pinned; cluster-node-timeout %d ms; "
            "counters sampled %.0f s after every node saw all others, over a %.0f s window. "
            "Mean (min–max) across nodes." % (r0["node_timeout_ms"], r0["settle_s"], r0["window_s"]),
            "",
            "| Nodes | messages/s sent | messages/s received | bus bytes/s sent | bus bytes/s received "
            "| bytes/frame | CPU per node | estimate 2×(1 + N/(T/2)) msg/s | join (MEET all from node 0) |",
            "|---|---|---|---|---|---|---|---|---|",
        ]
        for r in idle:
            out.append("| %d | %s | %s | %s | %s | %.0f | %s | %.2f | %.2f s |" % (
                r["nodes"], _spread(r["messages_sent"], "{:,.2f}"), _spread(r["messages_received"], "{:,.2f}"),
                _spread(r["bus_bytes_sent"], "{:,.0f}"), _spread(r["bus_bytes_received"], "{:,.0f}"),
                r["bytes_per_frame_sent"], _spread(r["cpu_pct"], "{:.1f}%"), r["estimate_messages_per_s"],
                r["join"]["joined_s"]))  # fmt: skip
        checks = []
        for r in idle:
            checks.append("%d nodes: %s links closed in the window, min reachable at the end %d/%d, "
                          "frames/s sent %s" % (r["nodes"], r["links_closed_in_window"], r["reachable_end_min"],
                                                r["nodes"] - 1, _spread(r["bus_frames_sent"], "{:,.2f}")))  # fmt: skip
        out += ["", "Checks: " + "; ".join(checks) + "."]
    for r in chain:
        out += [
            "",
            "Chain join: %d fresh nodes, CLUSTER MEET i → i+1 sent to node i, timed from the first MEET until "
            "every node reports cluster_reachable_nodes = %d (CLUSTER INFO polled every %.0f ms)."
            % (r["nodes"], r["nodes"] - 1, r["poll_interval_s"] * 1000),
            "",
            "| Test | %s | median |" % " | ".join("run %d" % (i + 1) for i in range(len(r["joined_s"]))),
            "|---|%s---|" % ("---|" * len(r["joined_s"])),
            "| Chain join, %d nodes | %s | %.2f s |" % (
                r["nodes"], " | ".join("%.2f s" % t for t in r["joined_s"]), r["median_s"]),
        ]  # fmt: skip
    return out


def markdown_report(bench: Bench, machine: dict[str, Any]) -> str:
    """The results table, then a diagnostics table (CPU use of both sides, sanity checks)."""
    res, sizes = bench.results, bench.sizes
    rows = ["| Test | disque-py | p50 (p99) | redis-server, same load | Disque 1.0-rc1 | Target | Met |",
            "|---|---|---|---|---|---|---|"]  # fmt: skip

    def redis_cell(key: str, label: str) -> str:
        r = res.get(key)
        if not r:
            return "—"
        return "%s %s, p50 %s" % (label, _rate(r["requests_per_s"]), _ms(r.get("p50_ms")))

    for key, label, rkey, rlabel in (
        ("addjob_p1", "ADDJOB, -P 1, n=%d" % sizes.n_p1, "redis_lpush_p1", "LPUSH"),
        ("addjob_p32", "ADDJOB, -P 32, n=%d" % sizes.n_p32, "redis_lpush_p32", "LPUSH"),
        ("getjob_p32", "GETJOB NOHANG, -P 32, n=%d" % sizes.n_p32, "redis_rpop_p32", "RPOP"),
    ):
        r = res.get(key)
        if not r and not res.get(rkey):
            continue
        ref, target, target_text = REFERENCE[key]
        value = r["requests_per_s"] if r else None
        rows.append("| %s | %s | %s | %s | %s | %s | %s |" % (
            label, _rate(value), _ms(r.get("p50_ms")) if r else "—", redis_cell(rkey, rlabel),
            ref, target_text, _meets(value, target)))  # fmt: skip
    c, rc = res.get("cycles"), res.get("redis_cycles")
    if c or rc:
        rows.append("| ADDJOB→GETJOB→ACKJOB cycles, %d conns | %s | %s | %s | — | — | — |" % (
            (c or rc)["conns"],
            "%s cycles/s (%s req/s)" % (_rate(c["cycles_per_s"], ""), _rate(c["requests_per_s"], "")) if c else "—",
            "%s (%s)" % (_ms(c["p50_ms"]), _ms(c["p99_ms"])) if c else "—",
            ("LPUSH→RPOP→DEL %s cycles/s, p50 %s" % (_rate(rc["cycles_per_s"], ""), _ms(rc["p50_ms"]))
             if rc else "—"),
        ))  # fmt: skip
    ref, target, target_text = REFERENCE["memory"]
    for key in sorted((k for k in res if k.startswith("memory_")), key=lambda k: int(k.split("_")[1])):
        m = res[key]
        rows.append("| Memory, %s jobs, %d-byte body | %s bytes/job | — | — | %s | %s | %s |" % (
            "{:,}".format(m["jobs"]), m["body_size"], _rate(m["bytes_per_job"], ""), ref, target_text,
            _meets(m["bytes_per_job"], target, higher_is_better=False)))  # fmt: skip

    diag = ["| Run | server CPU | client CPU | check |", "|---|---|---|---|"]
    for key, r in res.items():
        if key.startswith("bus_"):
            continue
        if key.startswith("memory_"):
            diag.append("| %s | — | — | used_memory %s → %s bytes, %s jobs |" % (
                key, "{:,}".format(r["used_memory_before"]), "{:,}".format(r["used_memory_after"]),
                "{:,}".format(r["jobs"])))  # fmt: skip
            continue
        check = ""
        if "registered_jobs" in r:
            check = "registered_jobs=%d" % r["registered_jobs"]
        elif "left" in r:
            check = "served %d, %d left in the queue (never empty)" % (r["served"], r["left"])
        elif "cycles" in r:
            check = "%d cycles in %.1f s, %d empty GETs, p99.9 %s" % (
                r["cycles"],
                r["elapsed_s"],
                r["empty_gets"],
                _ms(r["p999_ms"]),
            )
        if r["client_cpu_pct"] >= CLIENT_BOUND_PCT:
            check = (check + "; " if check else "") + "**client-bound**"
        srv = r.get("server_cpu_pct")
        srv_text = "—" if srv is None else "%.0f%%" % srv
        diag.append("| %s | %s | %.0f%% | %s |" % (key, srv_text, r["client_cpu_pct"], check))

    if len(diag) == 2:
        diag = []
    out = [
        "Machine: %s cores, %s; Python %s; %s; commit %s" % (
            machine["nproc"], machine["cpu_model"], machine["python"], machine["redis_benchmark"],
            machine["git_commit"]),
    ]  # fmt: skip
    if len(rows) > 2 or diag:
        out += [
            "Server pinned to CPU %s, load to CPU %s; redis-benchmark with %d clients, %d-byte body." % (
                SERVER_CPU, CLIENT_CPU, bench.clients, bench.body_size),
            "",
            *rows,
            "",
            *diag,
        ]  # fmt: skip
    bus = bus_report(bench)
    if bus:
        out += ["", *bus]
    elif len(rows) == 2:
        out += ["", "(no results)"]
    bound = [k for k, r in res.items() if r.get("client_cpu_pct", 0) >= CLIENT_BOUND_PCT]
    if bound:
        out += [
            "",
            "Client-bound (the load generator used >= %d%% of its core, so these numbers are a floor "
            "for the server): %s." % (CLIENT_BOUND_PCT, ", ".join(bound)),
        ]
    if bench.notes:
        out += ["", *("Note: " + n for n in bench.notes)]
    return "\n".join(out) + "\n"


# --------------------------------------------------------------------------- main


def check_tools(suites: list[str]) -> None:
    """Fail early and clearly on a missing tool; redis-server only skips the yardstick."""
    missing = []
    if any(s != "bus" for s in suites) and not shutil.which("taskset"):
        missing.append("taskset (util-linux) to pin the server and the load to separate CPUs")
    if any(s in suites for s in ("addjob", "getjob", "memory", "redis")) and not shutil.which("redis-benchmark"):
        missing.append("redis-benchmark (apt-get install redis-tools), needed by: addjob, getjob, memory, redis")
    if missing:
        raise BenchError("missing:\n  " + "\n  ".join(missing))
    if any(s != "bus" for s in suites) and (os.cpu_count() or 1) < 2:
        raise BenchError("needs at least 2 CPUs (server on CPU %s, load on CPU %s)" % (SERVER_CPU, CLIENT_CPU))


def _on_sigterm(signum: int, frame: object) -> None:
    raise KeyboardInterrupt  # unwinds through the finally that stops every server


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["client"]:
        return client_main(argv[1:])
    p = argparse.ArgumentParser(
        prog="scripts/bench",
        description="Benchmark one disque-py node (CPU %s) with redis-benchmark and our own client (CPU %s); "
        "redis-server under the same load as a yardstick. `scripts/bench client --help` for the client alone."
        % (SERVER_CPU, CLIENT_CPU),
    )  # fmt: skip
    p.add_argument("--quick", action="store_true", help="small n, 2 s of cycles, 50k-job memory: a smoke run")
    p.add_argument("--only", default=",".join(SUITES), help="comma-separated subset of: %s" % ",".join(SUITES))
    p.add_argument(
        "--base-port", type=int, default=17711, help="disque-py on this port, redis-server on the next (default 17711)"
    )
    p.add_argument("--write", metavar="FILE", help="JSON results file (default bench-results/<date>-<commit>.json)")
    p.add_argument("--duration", type=float, default=None, help="seconds of add->get->ack cycles (default 10, quick 2)")
    p.add_argument("--cycles-count", type=int, default=None, help="run a fixed number of cycles instead of a duration")
    p.add_argument("--conns", type=int, default=50, help="connections of the cycle client (default 50)")
    p.add_argument("--shared-queue", action="store_true", help="cycle client: one queue for all connections")
    p.add_argument("--bus-nodes", default=None, help="bus: node counts of the idle test (default 3,10,30; quick 3,10)")
    p.add_argument("--bus-window", type=float, default=None, help="bus: measurement window in s (default 20, quick 5)")
    p.add_argument("--bus-settle", type=float, default=None, help="bus: wait after the join, s (default 5, quick 2)")
    p.add_argument("--chain-runs", type=int, default=None, help="bus: chain-join repetitions (default 3, quick 1)")
    p.add_argument("--chain-nodes", type=int, default=None, help="bus: nodes in the chain join (default 10)")
    p.add_argument("--cluster-node-timeout", type=int, default=None, metavar="MS",
                   help="bus: cluster-node-timeout of every node (default: the server's, %d)" % DEFAULT_NODE_TIMEOUT)
    a = p.parse_args(argv)

    suites = [s.strip() for s in a.only.split(",") if s.strip()]
    unknown = sorted(set(suites) - set(SUITES))
    if unknown:
        p.error("unknown suite(s) %s; choose from %s" % (", ".join(unknown), ", ".join(SUITES)))
    sizes = Sizes.quick() if a.quick else Sizes()
    if a.duration is not None:
        sizes.duration = a.duration
    if a.bus_nodes:
        try:
            sizes.bus_nodes = tuple(int(x) for x in a.bus_nodes.split(",") if x.strip())
        except ValueError:
            p.error("--bus-nodes: comma-separated node counts, e.g. 3,10,30")
    for name in ("bus_window", "bus_settle", "chain_runs", "chain_nodes"):
        if getattr(a, name) is not None:
            setattr(sizes, name, getattr(a, name))
    if any(n < 2 for n in sizes.bus_nodes) or sizes.chain_nodes < 2 or sizes.chain_runs < 1:
        p.error("bus tests need at least 2 nodes and 1 chain run")
    bus_max = max((*sizes.bus_nodes, sizes.chain_nodes)) if "bus" in suites else 0
    top = a.base_port + (BUS_PORT_SHIFT + bus_max - 1 if bus_max else 1)
    if top + 10000 > 65535 or a.base_port < 1:
        p.error("--base-port %d leaves no room for the ports used (up to %d, cluster bus +10000)" % (a.base_port, top))

    signal.signal(signal.SIGTERM, _on_sigterm)
    try:
        check_tools(suites)
        ports = [a.base_port, a.base_port + 10000] + ([a.base_port + 1] if "redis" in suites else [])
        for i in range(bus_max):
            ports += [a.base_port + BUS_PORT_SHIFT + i, a.base_port + BUS_PORT_SHIFT + i + 10000]
        busy = [port for port in ports if port_in_use(port)]
        if busy:
            raise BenchError(
                "port(s) %s already in use (disque-py uses --base-port and +10000 for its "
                "cluster bus, redis-server --base-port + 1, the bus suite --base-port + %d ... + %d and "
                "+10000): pick another --base-port" % (", ".join(map(str, busy)), BUS_PORT_SHIFT,
                                                       BUS_PORT_SHIFT + bus_max - 1)
            )  # fmt: skip
        machine = machine_info(sys.executable)
        bench = Bench(sizes, a.base_port, conns=a.conns, cycles_count=a.cycles_count, shared_queue=a.shared_queue,
                      node_timeout=a.cluster_node_timeout)  # fmt: skip
        t0 = time.monotonic()
        try:
            steps: dict[str, Callable[[], None]] = {
                "addjob": bench.bench_addjob, "getjob": bench.bench_getjob, "cycles": bench.bench_cycles,
                "memory": bench.bench_memory, "redis": bench.bench_redis, "bus": bench.bench_bus,
            }  # fmt: skip
            for name in SUITES:
                if name in suites:
                    steps[name]()
        finally:
            bench.stop_all()
    except BenchError as exc:
        print("scripts/bench: error: %s" % exc, file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print("scripts/bench: interrupted; every process started was stopped", file=sys.stderr)
        return 130

    report = markdown_report(bench, machine)
    sys.stdout.write(report)
    out = Path(a.write) if a.write else ROOT / "bench-results" / (
        "%s-%s.json" % (time.strftime("%Y%m%d-%H%M%S"), machine["git_commit"][:12] or "nogit"))  # fmt: skip
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({
        "machine": machine,
        "options": {"quick": a.quick, "suites": suites, "clients": bench.clients, "body_size": bench.body_size,
                    "conns": bench.conns, "shared_queue": bench.shared_queue, "sizes": sizes.__dict__,
                    "cluster_node_timeout": bench.node_timeout, "bus_port_shift": BUS_PORT_SHIFT,
                    "server_cpu": SERVER_CPU, "client_cpu": CLIENT_CPU},
        "results": bench.results,
        "notes": bench.notes,
        "commands": bench.commands,
        "duration_s": round(time.monotonic() - t0, 1),
        "report_markdown": report,
    }, indent=2) + "\n")  # fmt: skip
    log("raw results: %s (%.0f s)" % (out, time.monotonic() - t0))
    return 0


if __name__ == "__main__":
    sys.exit(main())
