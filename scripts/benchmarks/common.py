"""What every benchmark of ``scripts/bench`` shares: the pinning (server on CPU 0, load on CPU 1), the
sizes, a small RESP client, the server processes (disque-py, Disque 1.0-rc1, redis-server) and their CPU
from /proc, the ``redis-benchmark`` runner, the cycle client's process, the three-node cluster of the
replication, federation and queues suites, the machine's description and the raw results file.

:class:`BenchBase` is one run (options, started processes, results, commands); each suite module adds its
``bench_<suite>`` method as a mixin (``single_node``, ``bus``, ``replication``, ``federation``,
``queues``) and :class:`benchmarks.bench.Bench` puts them together. The other harnesses (``bench_aof``,
``bench_tls``, ``bench_admin``, ``bench_spark``) build on this module too, never on ``bench``, so no
module of the package imports one that imports it back.
"""

from __future__ import annotations

import datetime as _dt
import json
import os
import platform
import re
import resource
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
from typing import Any

from disque_py.cli import launcher

from . import progress


#: The checkout this file is in (scripts/benchmarks/common.py): results go to ROOT/bench-results.
ROOT = Path(__file__).resolve().parents[2]


#: The directory holding the ``benchmarks`` package: on PYTHONPATH for the helper processes.
SCRIPTS = Path(__file__).resolve().parents[1]


#: How the bench runs its own helpers (``client``, ``fedclient``) in a process of their own.
MODULE = "benchmarks.bench"


HOST = "127.0.0.1"


SERVER_CPU = "0"


CLIENT_CPU = "1"


#: Load generator CPU use (% of its one core) from which a result is flagged as client-bound.
CLIENT_BOUND_PCT = 90


#: How often the join tests poll CLUSTER INFO on every node: the chain join (the measured
#: figure) and the star join before the idle measurement (only reported on the side).
CHAIN_POLL = 0.05


#: The federation suite's nodes A, B, C listen on --base-port + FED_PORT_SHIFT + 0, 1, 2.
FED_PORT_SHIFT = 200


#: Disque 1.0-rc1 (C) on this machine class with 50 clients, and our targets (from the issue).
REFERENCE = {
    "addjob_p1": ("125-149k/s", 40_000, ">= 40k/s"),
    "addjob_p32": ("297-334k/s", 150_000, ">= 150k/s"),
    "getjob_p32": ("~293k/s", 150_000, ">= 150k/s"),
    "memory": ("~580 bytes/job", 800, "<= 800 bytes/job"),
    "repl_addjob": ("~52k/s, p50 0.86 ms", 52_000, ">= 52k/s, p99 < 5 ms"),
    "repl_cycles": ("~24k cycles/s", 24_000, ">= 24k cycles/s"),
}


class BenchError(Exception):
    """A clear, user-facing failure (missing tool, busy port, node died)."""


def helper_env() -> dict[str, str]:
    """The environment of a helper process (``python -m benchmarks.bench ...``): ours, with the directory of
    the ``benchmarks`` package first on PYTHONPATH."""
    path = os.environ.get("PYTHONPATH")
    return dict(os.environ, PYTHONPATH=str(SCRIPTS) + (os.pathsep + path if path else ""))


def log(msg: str) -> None:
    progress.echo(">> " + msg)  # stderr, around the progress bar when one is drawn


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
    #: federation: offered rates (jobs/s) and REPLICATE factors of the fixed-rate runs, seconds each
    #: after the warm-up; the max-rate ramps (REPLICATE ``Bench.fed_ramp_replicates``): first rate, seconds per
    #: step, bisections.
    fed_rates: tuple[float, ...] = (50, 500, 5000)
    fed_replicates: tuple[int, ...] = (1, 3)
    fed_duration: float = 10.0
    fed_warmup: float = 1.0
    fed_ramp: bool = True
    #: federation: the fixed-rate runs once more with the producer on A beside the consumers (the
    #: same-node delivery latency, issue 49's "same-node delivery p99 at 500 jobs/s")
    fed_same_node: bool = False
    fed_ramp_start: float = 1000
    fed_ramp_duration: float = 5.0
    fed_bisect: int = 2
    #: queues: idle queues left on one node of a 3-node cluster, and the CPU measurement window (s).
    idle_queues: int = 200_000
    idle_window: float = 10.0

    @classmethod
    def quick(cls) -> "Sizes":
        return cls(n_p1=20_000, n_p32=100_000, memory_jobs=(50_000,), duration=2.0,
                   bus_nodes=(3, 10), bus_settle=2.0, bus_window=5.0, chain_runs=1,
                   fed_rates=(50, 500), fed_duration=2.0, fed_ramp_duration=2.0, fed_bisect=0,
                   idle_queues=20_000, idle_window=3.0)  # fmt: skip


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

    def pipeline(self, commands: list[tuple[str | bytes | int, ...]]) -> list[Any]:
        """Send every command, then read one reply each (an error reply is returned, not raised)."""
        self.sock.sendall(b"".join(encode(*args) for args in commands))
        replies: list[Any] = []
        while len(replies) < len(commands):
            reply = self.reader.gets()
            if reply is not False:
                replies.append(reply)
                continue
            data = self.sock.recv(1 << 20)
            if not data:
                raise ConnectionError("connection closed by the server")
            self.reader.feed(data)
        return replies

    def info(self, section: str) -> dict[str, str]:
        text = self.call("INFO", section).decode()
        return dict(line.split(":", 1) for line in text.splitlines() if ":" in line and not line.startswith("#"))

    def close(self) -> None:
        self.sock.close()

    def __enter__(self) -> "SyncClient":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _pct_ms(sorted_ns: list[int], p: float) -> float | None:
    """The p-th percentile (nearest rank, as run_cycles) of sorted nanoseconds, in ms."""
    n = len(sorted_ns)
    if not n:
        return None
    return round(sorted_ns[min(n - 1, int(p / 100.0 * n))] / 1e6, 3)


def port_in_use(port: int) -> bool:
    return launcher.port_in_use(port, HOST)


def proc_cpu_seconds(pid: int) -> float | None:
    """utime + stime of a running process, from /proc/PID/stat."""
    try:
        with open("/proc/%d/stat" % pid) as f:
            fields = f.read().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    except (OSError, IndexError, ValueError):
        return None


def all_process_cpu() -> dict[int, tuple[str, float]]:
    """pid -> (name, utime + stime seconds) of every process now running, from /proc."""
    out: dict[int, tuple[str, float]] = {}
    tck = os.sysconf("SC_CLK_TCK")
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open("/proc/%s/stat" % entry) as f:
                text = f.read()
            name = text[text.index("(") + 1 : text.rindex(")")]
            fields = text.rsplit(")", 1)[1].split()
            out[int(entry)] = (name, (int(fields[11]) + int(fields[12])) / tck)
        except (OSError, ValueError, IndexError):
            continue
    return out


def foreign_cpu(before: dict[int, tuple[str, float]], after: dict[int, tuple[str, float]],
                ours: set[int]) -> tuple[float, list[tuple[str, float]]]:
    """CPU seconds used between two snapshots by processes not in ``ours`` that are alive at the end
    (a process that started and exited in between is not seen), and the top three of them."""
    used = []
    for pid, (name, cpu) in after.items():
        if pid in ours:
            continue
        delta = cpu - before.get(pid, (name, 0.0))[1]
        if delta > 0:
            used.append((name, delta))
    used.sort(key=lambda x: -x[1])
    return sum(d for _, d in used), [(n, round(d, 2)) for n, d in used[:3]]


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
        deadline = time.monotonic() + 5.0
        while port_in_use(self.port):  # a node of the previous run may still be on its way out
            if time.monotonic() > deadline:
                raise BenchError("port %d is already in use: pick another with --base-port" % self.port)
            time.sleep(0.1)
        self.proc = launcher.spawn(self.argv, output=self.workdir / "stderr", cwd=self.workdir, detach=True)
        return self

    def wait_ready(self, timeout: float) -> None:
        """Poll PING until it answers, the process dies, or the deadline passes."""
        try:
            launcher.wait_ready(self.proc, self.port, host=HOST, timeout=timeout, what=self.kind,
                                logs=[self.workdir / "stderr", self.workdir / "log"])  # fmt: skip
        except launcher.LaunchError as exc:
            raise BenchError(str(exc)) from None

    def tail(self, lines: int = 20) -> str:
        return launcher.tail([self.workdir / "stderr", self.workdir / "log"], lines)

    def cpu_seconds(self) -> float | None:
        return proc_cpu_seconds(self.proc.pid) if self.proc else None

    def stop(self, timeout: float = 10.0) -> None:
        """SIGTERM, then SIGKILL to the whole process group if it lingers."""
        if self.proc is None or self.proc.poll() is not None:
            return
        if launcher.stop(self.proc, sig=signal.SIGTERM, timeout=timeout, group=True).forced:
            log("%s on port %d ignored SIGTERM for %.0f s: killing it" % (self.kind, self.port, timeout))


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
class BenchBase:
    """One benchmark run: options, started processes, results and commands. Each suite module adds its
    ``bench_<suite>`` method as a mixin (``single_node``, ``bus``, ``replication``, ``federation``,
    ``queues``) and ``bench.Bench`` puts them together."""

    sizes: Sizes
    base_port: int
    clients: int = 50
    body_size: int = 100
    conns: int = 50
    cycles_count: int | None = None
    shared_queue: bool = False
    node_timeout: int | None = None  # bus suite: --cluster-node-timeout for every node, None = default
    fed_consumers: int = 10  # federation: consumer connections on node A
    #: federation: producer connections (on B, or on A for the same-node baseline); None = 4 for REPLICATE 1 and
    #: 32 above (a replicated ADDJOB holds its connection until the replicas confirm, so pipelining alone stalls)
    fed_producers: int | None = None
    fed_drain: float = 60.0  # federation: max seconds to wait for the last jobs after the producer stops
    #: federation: where the nodes run (``fed_node_cpu``). "pair-per-core": A on the server CPU, B on the
    #: client CPU with the load generator, C on either (the kernel's choice): the pair a core each, as
    #: deployed, which is what the federation target is about, the pair's own rate; the third node goes
    #: where there is room, in the cross-node and the same-node runs alike. "node-per-core": C pinned to
    #: the client CPU too (with REPLICATE 3 that puts a replica beside the coordinating node B in the
    #: cross-node runs, beside the other replica in the same-node runs). "one-core": A, B and C on the
    #: server CPU (the replication reference's setup): what a move costs in total CPU.
    fed_layout: str = "pair-per-core"
    #: federation: the load generator's scheduling policy. "batch" (SCHED_BATCH): its wakeups do not preempt
    #: the node it shares a core with (B, except in "one-core"), which then finishes its pass; "normal":
    #: every reply that wakes the load generator takes the core from B at once (see the Method notes)
    fed_client_sched: str = "batch"
    fed_ramp_replicates: tuple[int, ...] = (1, 3)  # federation: REPLICATE of the max-rate searches, one pair each
    python: str = sys.executable
    #: a disque-server binary (Disque 1.0-rc1 built from its source): when set, the addjob, getjob, cycles and
    #: replication suites run on it too, under the same load, and the report puts both side by side
    disque_server: str | None = None
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

    def disque_argv(self, port: int, workdir: Path, cpu: str = SERVER_CPU) -> list[str]:
        return launcher.node_argv(port, workdir, "--bind", HOST, "--logfile", str(workdir / "log"),
                                  python=self.python, script=True, cpu=cpu)  # fmt: skip

    def reference_argv(self, port: int, workdir: Path, cpu: str = SERVER_CPU) -> list[str]:
        """Disque 1.0-rc1 itself, pinned like our node; in memory, in the foreground."""
        assert self.disque_server
        return launcher.pinned([self.disque_server, "--port", str(port), "--bind", HOST, "--dir", str(workdir),
                                "--logfile", str(workdir / "log"), "--daemonize", "no", "--appendonly", "no"], cpu)  # fmt: skip

    def kinds(self) -> list[str]:
        """The job servers to measure: ours, then the reference when ``--disque-server`` is given."""
        return ["disque-py", "disque"] if self.disque_server else ["disque-py"]

    @staticmethod
    def key(kind: str, name: str) -> str:
        """Results key: ``name`` for disque-py, ``ref_<name>`` for Disque 1.0-rc1."""
        return name if kind == "disque-py" else "ref_" + name

    def server_argv(self, kind: str, port: int, workdir: Path, cpu: str = SERVER_CPU) -> list[str]:
        """The command line of a ``kind`` server pinned to ``cpu``: disque-py, disque (the reference) or
        redis-server."""
        if kind == "disque-py":
            return self.disque_argv(port, workdir, cpu)
        if kind == "disque":
            return self.reference_argv(port, workdir, cpu)
        return self.redis_argv(port, workdir, cpu)

    def redis_argv(self, port: int, workdir: Path, cpu: str = SERVER_CPU) -> list[str]:
        return launcher.pinned(["redis-server", "--port", str(port), "--save", "", "--appendonly", "no",
                                "--bind", HOST, "--dir", str(workdir), "--logfile", str(workdir / "log")], cpu)  # fmt: skip

    def start(self, kind: str) -> Server:
        """A fresh server (disque-py, disque or redis-server): new process, new empty directory."""
        port = self.base_port + 1 if kind == "redis-server" else self.base_port
        workdir = Path(tempfile.mkdtemp(prefix="%s-" % kind, dir=self.tmp))
        argv = self.server_argv(kind, port, workdir)
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

    def run_client(self, server: Server, kind: str, *extra: str, duration: float | None = None) -> dict[str, Any]:
        """The cycle client in its own process pinned to the client CPU (``extra``: more of its options, as
        ``--groups 10``; ``duration``: seconds instead of the sizes')."""
        argv = ["taskset", "-c", CLIENT_CPU, self.python, "-m", MODULE, "client", "--port", str(server.port),
                "--conns", str(self.conns), "--body-size", str(self.body_size), "--kind", kind, *extra]  # fmt: skip
        if self.cycles_count:
            argv += ["--count", str(self.cycles_count)]
        else:
            argv += ["--duration", str(duration or self.sizes.duration)]
        if self.shared_queue:
            argv.append("--shared-queue")
        self.record(argv)
        cpu0 = server.cpu_seconds()
        proc = subprocess.run(argv, capture_output=True, text=True, cwd=str(ROOT), env=helper_env())
        cpu1 = server.cpu_seconds()
        if proc.returncode != 0:
            raise BenchError("cycle client failed (%d): %s" % (proc.returncode, proc.stderr.strip()[-2000:]))
        result = json.loads(proc.stdout.strip().splitlines()[-1])
        if cpu0 is not None and cpu1 is not None and result["elapsed_s"] > 0:
            result["server_cpu_pct"] = round(100.0 * (cpu1 - cpu0) / result["elapsed_s"], 1)
        return result

    def shutdown_nodes(self, nodes: list[Server], timeout: float = 10.0, label: str = "bus") -> int:
        """SHUTDOWN to every node, wait for them to exit, SIGTERM/SIGKILL leftovers; returns the leftovers."""
        for node in nodes:
            if node.proc is not None and node.proc.poll() is None:
                launcher.shutdown(node.port, HOST)  # no reply: the node closes the connection
        deadline = time.monotonic() + timeout
        leftovers = 0
        for node in nodes:
            if node.proc is None:
                continue
            if not launcher.wait_exit(node.proc, max(0.1, deadline - time.monotonic())):
                leftovers += 1
                log("node on port %d still running %.0f s after SHUTDOWN: stopping it" % (node.port, timeout))
            self.stop(node)  # SIGTERM, then SIGKILL to the group; no-op if it already exited
        if leftovers:
            self.notes.append("%s: %d node(s) did not exit within %.0f s of SHUTDOWN and were killed"
                              % (label, leftovers, timeout))  # fmt: skip
        return leftovers

    @staticmethod
    def cluster_info(client: SyncClient) -> dict[str, str]:
        text = client.call("CLUSTER", "INFO")
        text = text.decode() if isinstance(text, bytes) else str(text)
        return dict(line.split(":", 1) for line in text.splitlines() if ":" in line)

    def fed_port(self, i: int) -> int:
        return self.base_port + FED_PORT_SHIFT + i

    def start_fed_cluster(self, label: str, kind: str = "disque-py", layout: str = "one-core") -> list[Server]:
        """Three fresh nodes A, B, C, pinned as ``layout`` says (see ``fed_layout``; the replication and
        queues suites keep all three on the server CPU), joined (MEET B and C sent to A);
        ``kind="disque"``: Disque 1.0-rc1 nodes (``--disque-server``)."""
        nodes: list[Server] = []
        for i in range(3):
            port = self.fed_port(i)
            workdir = Path(tempfile.mkdtemp(prefix="%s-%s-" % (label, "ABC"[i]), dir=self.tmp))
            cpu = fed_node_cpu(layout, i)
            argv = self.server_argv(kind, port, workdir, cpu)
            self.record(argv)
            node = Server(kind, argv, port, workdir)
            self.servers.append(node)
            node.spawn()
            nodes.append(node)
        deadline = time.monotonic() + 30.0
        for node in nodes:
            node.wait_ready(max(1.0, deadline - time.monotonic()))
        try:
            launcher.join([(HOST, node.port) for node in nodes], timeout=30.0, interval=CHAIN_POLL)
        except (launcher.LaunchError, OSError) as exc:
            for node in nodes:
                if node.proc is not None and node.proc.poll() is not None:
                    raise BenchError("node on port %d exited during the join:\n%s" % (node.port, node.tail())) from None
            raise BenchError("%s: %s" % (label, exc)) from None
        return nodes


def fed_node_cpu(layout: str, i: int) -> str:
    """The ``taskset -c`` CPU list of federation node ``i`` (0 = A, 1 = B, 2 = C) in ``layout``."""
    if layout == "pair-per-core":
        return (SERVER_CPU, CLIENT_CPU, "%s,%s" % (SERVER_CPU, CLIENT_CPU))[i]
    if layout == "node-per-core" and i:
        return CLIENT_CPU
    return SERVER_CPU


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
        # which build: the same version runs 20-30 % apart between builds (docs/benchmarks-history.md, "Interpreter build")
        "interpreter": os.path.realpath(shutil.which(python) or python),
        "redis_benchmark": _run(["redis-benchmark", "--version"]),
        "redis_server": _run(["redis-server", "--version"]),
        "git_commit": commit + ("-dirty" if dirty else ""),
        "date": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
    }


def _rate(v: float | None, unit: str = "/s") -> str:
    return "—" if v is None else "{:,.0f}{}".format(v, unit)


def _pct(v: float | None) -> str:
    return "—" if v is None else "%.1f %%" % v


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


def _reference_cell(measured: dict[str, Any] | None, issue_figure: str) -> str:
    """The Disque 1.0-rc1 column: what it did here under the same load (``--disque-server``), and the
    figure the issue gives for it."""
    if not measured:
        return issue_figure
    if "cycles_per_s" in measured:
        value = "%s cycles/s" % _rate(measured["cycles_per_s"], "")
    else:
        value = _rate(measured["requests_per_s"])
    lat = _ms(measured.get("p50_ms"))
    if measured.get("p99_ms") is not None:
        lat += " / " + _ms(measured["p99_ms"])
    return "here: %s, p50%s %s (issue: %s)" % (
        value, " / p99" if measured.get("p99_ms") is not None else "", lat, issue_figure)


def default_results_path(commit: str) -> Path:
    """Where a run's raw results go without ``--write``: ``bench-results/`` of this checkout."""
    return ROOT / "bench-results" / ("%s-%s.json" % (time.strftime("%Y%m%d-%H%M%S"), commit[:12] or "nogit"))


def _on_sigterm(signum: int, frame: object) -> None:
    raise KeyboardInterrupt  # unwinds through the finally that stops every server


def write_results(out: Path, machine: dict, options: dict, bench: Any, report: str, t0: float) -> None:
    """The raw results file of a run (every benchmark command writes this one shape)."""
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({
        "machine": machine,
        "options": options,
        "results": bench.results,
        "notes": bench.notes,
        "commands": bench.commands,
        "duration_s": round(time.monotonic() - t0, 1),
        "report_markdown": report,
    }, indent=2) + "\n")  # fmt: skip


def save_raw(name: str, args: Any, results: Any, report: str, machine: dict | None = None) -> Path:
    """The raw results of a benchmark with a report of its own (nodes, scale, smoke): JSON at ``args.write``,
    else ``bench-results/<name>-<date>.json``, with the machine, the options and the report; says where."""
    out = args.write or ROOT / "bench-results" / ("%s-%s.json" % (name, time.strftime("%Y%m%d-%H%M%S")))
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({"machine": machine or machine_info(sys.executable), "options": vars(args) | {"write": str(out)},
                               "results": results, "report": report}, indent=2, default=str))  # fmt: skip
    print("raw results: %s" % out)
    return out
