"""Benchmarks for one disque-py node, with redis-server as a yardstick, and for the cluster bus.

    scripts/bench                         everything (about three minutes, two of them the bus)
    scripts/bench --quick                 smoke run with small n (< 1 minute)
    scripts/bench --only addjob,memory    a subset: addjob, getjob, cycles, memory, redis, bus, replication,
                                          federation, queues
    scripts/bench --only bus              only the cluster bus tests (about two minutes)
    scripts/bench --only federation       consumer on node A, producer on node B (about 18 minutes)
    scripts/bench --only replication      ADDJOB REPLICATE 3 and add->get->ack on three nodes (about a minute)
    scripts/bench --only queues           what 200,000 idle queues cost a node (under a minute)
    scripts/bench client --port 7711 --duration 5
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
* **Reference** (``--disque-server PATH``): the addjob, getjob, cycles and
  replication suites also start Disque 1.0-rc1 itself (a ``disque-server``
  built from its source, in memory: ``--appendonly no``), pinned and loaded
  exactly like our nodes, right after each disque-py run. The report shows
  what it did here beside the figure the issue gives for it.
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
* **Replication** (``replication``): the federation suite's three nodes
  (below), all on CPU 0, joined; ``redis-benchmark`` (summary output, for
  p99) with 50 clients sends ``ADDJOB q <body> 0 REPLICATE 3`` to the first
  node, so every reply waits for two GOTJOBs; then, on fresh nodes, the
  add->get->ack cycle client against the first node (REPLICATE defaults to
  3 there). Reported with the CPU of each node; the Disque reference is
  ~52k ADDJOB/s and ~24k cycles/s with three nodes on one core.
* **Federation** (``federation``): three fresh nodes A, B, C on ports
  ``--base-port + 200`` ... ``+ 202`` (bus +10000), A pinned to CPU 0, B
  to CPU 1 and C free to run on either (``--fed-layout pair-per-core``, the
  default: the pair a core each, as deployed, so the pair's rate is what is
  measured; B shares its core with the load generator, and the kernel puts
  C where there is room, in the cross-node and same-node runs alike), or
  with C pinned to CPU 1 too (``--fed-layout node-per-core``: with
  REPLICATE 3 the producer's node B then shares its core with a replica and
  the clients in the cross-node runs), or all three on CPU 0
  (``--fed-layout one-core``: what a move costs in total CPU), joined with
  ``CLUSTER MEET`` of B and C sent to A; the load generator
  (:func:`run_federation`, one process, epoll + ``hiredis.Reader``, like the
  cycle client) pinned to CPU 1 and run as ``SCHED_BATCH``
  (``--fed-client-sched batch``, the default). The load generator stands for
  clients on other machines; at the normal policy every reply that wakes it
  takes CPU 1 from B at once (the kernel preempts on wakeup), so B answered
  about one job per wakeup and the two spent the shared core switching
  (measured: p99 20-26 ms at 12,000-15,000 jobs/s where SCHED_BATCH gives
  1.8-9 ms, same CPU use). With SCHED_BATCH it waits for B's pass to end.
  This can only make the load generator's timestamps later, never earlier;
  its lag behind the send schedule is reported. ``--fed-client-sched
  normal`` gives the earlier figures. 10 consumer connections on A each keep one
  ``GETJOB TIMEOUT 1000 FROM q`` pending; every job received is acknowledged with ``ACKJOB id`` and
  the connection blocks again in the same write. The producer sends ``ADDJOB
  q <body> 0 REPLICATE r`` to B on an open-loop schedule (job k due at t0 +
  k/R, written as soon as it is due, pipelined round-robin over 4
  connections for REPLICATE 1 and 32 for REPLICATE 3, never waiting for
  replies; epoll's 1 ms timer resolution sends jobs in groups of up to a
  millisecond's worth). The body is ``time.monotonic_ns()`` at the write; the
  latency of a job is its receive time minus that (same process, same
  clock). Latency figures cover the jobs *sent* in the measured window
  (after a 1 s warm-up); "achieved" is the jobs *received* in it per second.
  After the last job the client waits for every produced ID (ADDJOB replies)
  to arrive, then 0.3 s more, and counts unique, duplicate and missing IDs;
  a missing or duplicated ID is looked up with ``SHOW`` on every node. INFO
  stats of the three nodes are read before and after each run
  (``jobs_pushed`` on the producing node = pushed under a lease; its
  ``jobs_exported`` minus that = pulled by NEEDJOBS). Node CPU is sampled from
  /proc by the client at the start and end of the measured window. Fixed
  runs: R = 50, 500, 5000 jobs/s for REPLICATE 1 and 3, 10 s each. Maximum
  rate, for REPLICATE 1 and 3 (``--fed-ramp-replicates``): R from 1000
  jobs/s ×1.5 per 5 s step until a step fails (achieved < 95 % of R, p99 >=
  10 ms, or a job missing), then two bisections; once with the producer on B
  and once on A (same node, the baseline), the two searches' steps
  alternating (B, A, B, A, ...) so both see the same machine conditions.
  Then both searches again where only p99 > 1 s fails a sustained step: the
  throughput ceiling, where latency is let go. The maximum the federation
  target speaks of is, for each placement alike, the highest rate at which
  every run of it (both searches' steps, and the fixed runs) kept the
  latency target, at that rate and every lower one (``fed_kept_max``): near
  the edge two 5 s runs at one rate can give 6 and 16 ms. Every run starts
  a fresh cluster.
* **Idle queues** (``queues``): the federation suite's three nodes; node A
  gets 200,000 queues (one job each, added with ``REPLICATE 1`` and
  deleted with ``FASTACK``, so the queues stay, empty, until the queue GC
  evicts them after 5 minutes). ``used_memory`` before and after gives the
  bytes per idle queue; A's CPU from /proc over 10 s with no client, then
  over 10 s with one client blocked in ``GETJOB`` on another queue (which
  runs the federation tick every 100 ms), shows what idle queues cost.
The Markdown table goes to stdout; the raw results, the machine (nproc, CPU
model, Python, redis-benchmark version, git commit) and the exact commands go
to a JSON file (``bench-results/`` of the checkout this file is in by default,
or ``--write FILE``). Every process started is stopped on exit, even on Ctrl-C
or SIGTERM. Node processes are started, awaited and stopped by
:mod:`disque_py.launcher`, like the test suite's and ``scripts/cluster``'s.

This module and its helpers (``bench_core``, ``bench_client``) live in
``scripts/benchmarks/``, outside the installed package: ``scripts/bench`` runs
them as the ``benchmarks`` package with ``scripts/`` on ``PYTHONPATH``, and so
do the helper processes it starts (``python -m benchmarks.bench client`` and
``fedclient``; see :func:`helper_env`).
"""

from __future__ import annotations

import argparse
import collections
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
from typing import Any, Callable, Generator

from disque_py import launcher

from . import progress

#: The checkout this file is in (scripts/benchmarks/bench.py): results go to ROOT/bench-results.
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
SUITES = ("addjob", "getjob", "cycles", "memory", "redis", "bus", "replication", "federation", "queues")
#: The bus suite's node i listens on --base-port + BUS_PORT_SHIFT + i (cluster bus: that + 10000).
BUS_PORT_SHIFT = 100
#: Disque's cluster-node-timeout default (ms), used when --cluster-node-timeout is not given.
DEFAULT_NODE_TIMEOUT = 15000
#: How often the join tests poll CLUSTER INFO on every node: the chain join (the measured
#: figure) and the star join before the idle measurement (only reported on the side).
CHAIN_POLL = 0.05
STAR_POLL = 0.1
#: The federation suite's nodes A, B, C listen on --base-port + FED_PORT_SHIFT + 0, 1, 2.
FED_PORT_SHIFT = 200
FED_QUEUE = b"q"
#: INFO stats counters of the federation layer reported per run (differences over the run).
FED_COUNTERS = ("needjobs_sent", "needjobs_received", "yourjobs_sent", "yourjobs_received", "jobs_imported",
                "jobs_exported", "jobs_pushed", "jobs_added", "jobs_delivered", "jobs_acked", "bus_messages_sent",
                "bus_messages_received")  # fmt: skip
#: A federation ramp step is sustained if achieved >= 95 % of offered and p99 <= 1 s (and nothing is lost).
FED_SUSTAINED = 0.95
FED_MAX_P99_MS = 1000.0
FED_RAMP_CAP = 200_000
#: Default producer connections: pipelining is enough for REPLICATE 1; a replicated ADDJOB blocks its connection.
FED_PRODUCERS_R1 = 4
FED_PRODUCERS_REPL = 32
#: Flag a run when other processes used this much CPU (% of one core) during its window.
FED_FOREIGN_PCT = 10

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
    #: federation: offered rates (jobs/s) and REPLICATE factors of the fixed-rate runs, seconds each
    #: after the warm-up; the max-rate ramps (REPLICATE ``Bench.fed_ramp_replicates``): first rate, seconds per
    #: step, bisections.
    fed_rates: tuple[float, ...] = (50, 500, 5000)
    fed_replicates: tuple[int, ...] = (1, 3)
    fed_duration: float = 10.0
    fed_warmup: float = 1.0
    fed_ramp: bool = True
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
    """``python -m benchmarks.bench client ...``: run :func:`run_cycles`, print JSON."""
    p = argparse.ArgumentParser(prog="scripts/bench client", description=run_cycles.__doc__)
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


# --------------------------------------------------------------------------- the federation client


def _pct_ms(sorted_ns: list[int], p: float) -> float | None:
    """The p-th percentile (nearest rank, as run_cycles) of sorted nanoseconds, in ms."""
    n = len(sorted_ns)
    if not n:
        return None
    return round(sorted_ns[min(n - 1, int(p / 100.0 * n))] / 1e6, 3)


def run_federation(
    consumer_port: int,
    producer_port: int,
    *,
    rate: float,
    replicate: int,
    duration: float = 10.0,
    warmup: float = 1.0,
    consumers: int = 10,
    producers: int = 4,
    drain: float = 60.0,
    stall: float = 10.0,
    grace: float = 0.3,
    getjob_timeout_ms: int = 1000,
    queue: bytes = FED_QUEUE,
    node_pids: dict[str, int] | None = None,
) -> dict[str, Any]:
    """Open-loop producer on one node, blocked consumers on another; delivery latency of every job.

    ``consumers`` connections to ``consumer_port`` each keep one ``GETJOB TIMEOUT
    getjob_timeout_ms FROM queue`` pending; every job received is acknowledged
    with ``ACKJOB id`` and the connection blocks again at once (both commands
    in one write; the ACKJOB reply is not waited for). ``producers``
    connections to ``producer_port`` send ``ADDJOB queue <body> 0 REPLICATE
    replicate`` on an open-loop schedule: job k is due at t0 + k/rate, for
    ``warmup + duration`` seconds, and is written (pipelined, round-robin over
    the producer connections) as soon as it is due, whatever replies are
    outstanding. The body is ``time.monotonic_ns()`` at the write, in ASCII;
    the latency of a job is its receive time minus that. Latency and rate
    figures cover the jobs sent after the warm-up. After the last job, the
    client waits until every produced job ID was received, then ``grace``
    more seconds to catch duplicates; it gives up after ``drain`` seconds, or
    earlier when no reply at all arrived for ``stall`` seconds (the jobs
    still missing then are reported). ``node_pids``
    (name -> pid): their CPU use from /proc over the measured window.
    """
    import hiredis

    if rate <= 0 or duration <= 0 or consumers < 1 or producers < 1:
        raise ValueError("rate, duration, consumers and producers must be positive")
    ReplyError = hiredis.ReplyError
    monotonic_ns = time.monotonic_ns
    EPOLLIN, EPOLLOUT = select.EPOLLIN, select.EPOLLOUT

    class Conn:
        __slots__ = ("sock", "reader", "wbuf", "want_out", "fd", "sent_ns")

    ep = select.epoll()
    by_fd: dict[int, Conn] = {}

    def connect(port: int) -> Conn:
        c = Conn()
        try:
            c.sock = socket.create_connection((HOST, port), timeout=10)
        except OSError as exc:
            raise BenchError("cannot connect to port %d: %s" % (port, exc)) from None
        c.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        c.sock.setblocking(False)
        c.reader = hiredis.Reader()
        c.wbuf = bytearray()
        c.want_out = False
        c.fd = c.sock.fileno()
        c.sent_ns = collections.deque()
        by_fd[c.fd] = c
        ep.register(c.fd, EPOLLIN)
        return c

    def flush(c: Conn) -> None:
        try:
            n = c.sock.send(c.wbuf)
        except BlockingIOError:
            n = 0
        except OSError as exc:
            raise BenchError("write to port %d failed: %s" % (c.sock.getpeername()[1], exc)) from None
        if n:
            del c.wbuf[:n]
        if c.wbuf and not c.want_out:
            ep.modify(c.fd, EPOLLIN | EPOLLOUT)
            c.want_out = True
        elif not c.wbuf and c.want_out:
            ep.modify(c.fd, EPOLLIN)
            c.want_out = False

    cons = [connect(consumer_port) for _ in range(consumers)]
    prods = [connect(producer_port) for _ in range(producers)]
    cons_fds = {c.fd for c in cons}
    getjob = encode(b"GETJOB", b"TIMEOUT", getjob_timeout_ms, b"FROM", queue)
    ackjob_head = b"*2\r\n$6\r\nACKJOB\r\n$%d\r\n"
    add_head = b"*6\r\n$6\r\nADDJOB\r\n$%d\r\n%s\r\n" % (len(queue), queue)
    add_tail = encode(b"0", b"REPLICATE", replicate)[4:]  # the last three bulk strings, no array header

    total = int(round(rate * (warmup + duration)))
    produced: set[bytes] = set()
    received: dict[bytes, int] = {}
    send_ns: list[int] = []  # per received job (each reception), when it was sent ...
    recv_ns: list[int] = []  # ... and when it arrived
    add_lat: list[int] = []  # ADDJOB reply latency, per job
    add_lat_window: list[int] = []  # the same, jobs sent in the measured window
    lags: list[int] = []  # how late each write was against the schedule (first job of the batch)
    add_errors: list[str] = []
    timeouts = 0  # GETJOB TIMEOUT replies (nothing arrived in getjob_timeout_ms)
    acks = 0
    acked_zero = 0

    for c in cons:
        c.wbuf += getjob
        flush(c)

    ru0 = resource.getrusage(resource.RUSAGE_SELF)
    t0 = monotonic_ns()
    warm_end = t0 + int(warmup * 1e9)
    end = t0 + int((warmup + duration) * 1e9)
    period = 1e9 / rate
    sent = 0
    ru_prod: Any = None
    t_prod_end = 0
    all_in_at = 0
    drain_deadline = 0
    timed_out = ""
    last_reply = monotonic_ns()
    pids = node_pids or {}
    cpu_w0: dict[str, float | None] = {}
    cpu_w1: dict[str, float | None] = {}
    tw0 = tw1 = 0

    while True:
        now = monotonic_ns()
        if not tw0 and now >= warm_end:
            cpu_w0 = {n: proc_cpu_seconds(pid) for n, pid in pids.items()}
            tw0 = monotonic_ns()
        if sent < total:
            due = min(total, int((now - t0) / period) + 1)
            if due > sent:
                lags.append(now - (t0 + int(sent * period)))
                body = b"%d" % now
                cmd = add_head + b"$%d\r\n%s\r\n" % (len(body), body) + add_tail
                dirty = set()
                for k in range(sent, due):
                    p = prods[k % producers]
                    p.wbuf += cmd
                    p.sent_ns.append(now)
                    dirty.add(p)
                for p in dirty:
                    flush(p)
                sent = due
            if sent < total:
                timeout = max(0.0, (t0 + sent * period - monotonic_ns()) / 1e9)
            else:
                timeout = 0.0
        else:
            if ru_prod is None:
                ru_prod = resource.getrusage(resource.RUSAGE_SELF)
                t_prod_end = now
                if tw0:
                    cpu_w1 = {n: proc_cpu_seconds(pid) for n, pid in pids.items()}
                    tw1 = monotonic_ns()
                drain_deadline = now + int(drain * 1e9)
            if not all_in_at and len(add_lat) + len(add_errors) == total and produced.issubset(received):
                all_in_at = now
            if all_in_at and now - all_in_at >= grace * 1e9:
                break
            if now > drain_deadline:
                timed_out = "drain limit of %g s" % drain
                break
            if now - last_reply > stall * 1e9:
                timed_out = "no reply for %g s" % stall
                break
            timeout = 0.02
        events = ep.poll(timeout)
        for fd, ev in events:
            c = by_fd[fd]
            if ev & EPOLLOUT:
                flush(c)
            if not ev & (EPOLLIN | select.EPOLLERR | select.EPOLLHUP):
                continue
            try:
                data = c.sock.recv(262144)
            except BlockingIOError:
                continue
            except OSError as exc:
                raise BenchError("read failed: %s" % exc) from None
            if not data:
                raise BenchError("port %d closed a %s connection" % (
                    consumer_port if fd in cons_fds else producer_port,
                    "consumer" if fd in cons_fds else "producer"))  # fmt: skip
            t_in = last_reply = monotonic_ns()
            c.reader.feed(data)
            reply = c.reader.gets()
            if fd in cons_fds:
                out = c.wbuf
                while reply is not False:
                    tr = type(reply)
                    if tr is list:  # GETJOB: [[queue, id, body]]
                        for item in reply:
                            jid = item[1]
                            received[jid] = received.get(jid, 0) + 1
                            send_ns.append(int(item[2]))
                            recv_ns.append(t_in)
                            out += ackjob_head % len(jid) + jid + b"\r\n"
                        out += getjob
                    elif tr is int:  # ACKJOB
                        acks += 1
                        if reply == 0:
                            acked_zero += 1
                    elif reply is None:  # GETJOB timed out: block again
                        timeouts += 1
                        out += getjob
                    else:
                        raise BenchError("consumer on port %d: unexpected reply %r" % (consumer_port, reply))
                    reply = c.reader.gets()
                if out:
                    flush(c)
            else:
                while reply is not False:
                    t_sent = c.sent_ns.popleft()
                    if isinstance(reply, ReplyError):
                        add_errors.append(str(reply))
                    else:
                        produced.add(reply if type(reply) is bytes else str(reply).encode())
                        add_lat.append(t_in - t_sent)
                        if warm_end <= t_sent < end:
                            add_lat_window.append(t_in - t_sent)
                    reply = c.reader.gets()

    ru1 = resource.getrusage(resource.RUSAGE_SELF)
    t_end = monotonic_ns()
    for c in by_fd.values():
        c.sock.close()
    ep.close()
    if ru_prod is None:
        ru_prod, t_prod_end = ru1, t_end

    def cpu(a: Any, b: Any) -> float:
        return (b.ru_utime - a.ru_utime) + (b.ru_stime - a.ru_stime)

    in_window = [r - s for s, r in zip(send_ns, recv_ns) if warm_end <= s < end]
    in_window.sort()
    all_lat = sorted(r - s for s, r in zip(send_ns, recv_ns))
    window_s = (end - warm_end) / 1e9
    recv_in_window = sum(1 for r in recv_ns if warm_end <= r < end)
    # Which jobs were due in the window: k with t0 + k*period in [warm_end, end).
    due_in_window = sum(1 for k in range(total) if warm_end <= t0 + k * period < end)
    dup_ids = [j for j, n in received.items() if n > 1]
    missing = [j for j in produced if j not in received]
    unexpected = [j for j in received if j not in produced]
    add_lat.sort()
    add_lat_window.sort()
    lags.sort()
    prod_s = (t_prod_end - t0) / 1e9
    return {
        "rate": rate,
        "replicate": replicate,
        "consumer_port": consumer_port,
        "producer_port": producer_port,
        "consumers": consumers,
        "producers": producers,
        "warmup_s": warmup,
        "duration_s": duration,
        "jobs_offered": total,
        "jobs_produced": len(produced),
        "addjob_errors": len(add_errors),
        "addjob_error_sample": add_errors[:3],
        "jobs_received": len(send_ns),
        "unique_received": len(received),
        "duplicates": sum(received[j] - 1 for j in dup_ids),
        "duplicate_ids": [j.decode() for j in dup_ids[:20]],
        "missing": len(missing),
        "missing_ids": [j.decode() for j in missing[:20]],
        "missing_all": [j.decode() for j in missing],  # looked up on the nodes, then dropped (fed_run)
        "unexpected": len(unexpected),
        "window_jobs": len(in_window),
        "window_jobs_due": due_in_window,
        "achieved_per_s": round(recv_in_window / window_s, 1),
        "p50_ms": _pct_ms(in_window, 50),
        "p90_ms": _pct_ms(in_window, 90),
        "p99_ms": _pct_ms(in_window, 99),
        "p999_ms": _pct_ms(in_window, 99.9),
        "max_ms": round(in_window[-1] / 1e6, 3) if in_window else None,
        "all_p50_ms": _pct_ms(all_lat, 50),
        "all_p99_ms": _pct_ms(all_lat, 99),
        "all_max_ms": round(all_lat[-1] / 1e6, 3) if all_lat else None,
        "addjob_p50_ms": _pct_ms(add_lat_window, 50),
        "addjob_p99_ms": _pct_ms(add_lat_window, 99),
        "addjob_all_p99_ms": _pct_ms(add_lat, 99),
        "addjob_all_max_ms": round(add_lat[-1] / 1e6, 3) if add_lat else None,
        "send_lag_p99_ms": _pct_ms(lags, 99),
        "send_lag_max_ms": round(lags[-1] / 1e6, 3) if lags else None,
        "getjob_timeouts": timeouts,
        "acks": acks,
        "acks_zero": acked_zero,
        "drain_s": round((t_end - t_prod_end) / 1e9, 3),
        "drain_timed_out": timed_out,
        "client_cpu_pct": round(100.0 * cpu(ru0, ru_prod) / prod_s, 1) if prod_s > 0 else 0.0,
        "client_cpu_pct_total": round(100.0 * cpu(ru0, ru1) / ((t_end - t0) / 1e9), 1),
        # CPU of each node over the measured window (warm-up end to the last job sent), % of one core
        "node_cpu_pct": {
            n: (round(100.0 * (cpu_w1[n] - cpu_w0[n]) / ((tw1 - tw0) / 1e9), 1)
                if tw1 > tw0 and cpu_w0.get(n) is not None and cpu_w1.get(n) is not None else None)
            for n in pids
        },
    }


def fedclient_main(argv: list[str]) -> int:
    """``python -m benchmarks.bench fedclient ...``: run :func:`run_federation`, print JSON."""
    p = argparse.ArgumentParser(prog="scripts/bench fedclient", description=run_federation.__doc__)
    p.add_argument("--consumer-port", type=int, required=True)
    p.add_argument("--producer-port", type=int, required=True)
    p.add_argument("--rate", type=float, required=True, help="jobs/s offered")
    p.add_argument("--replicate", type=int, default=1)
    p.add_argument("--duration", type=float, default=10.0, help="measured seconds after the warm-up")
    p.add_argument("--warmup", type=float, default=1.0)
    p.add_argument("--consumers", type=int, default=10)
    p.add_argument("--producers", type=int, default=4)
    p.add_argument("--drain", type=float, default=60.0, help="max seconds to wait for the last jobs")
    p.add_argument("--stall", type=float, default=10.0, help="stop waiting after this many seconds without a reply")
    p.add_argument("--queue", default=FED_QUEUE.decode())
    p.add_argument("--node-pids", default="", help="NAME:PID,... whose CPU use is sampled over the window")
    p.add_argument("--sched", choices=("normal", "batch"), default="normal",
                   help="this process's scheduling policy: batch (SCHED_BATCH) does not preempt a process "
                        "it shares its core with when a reply wakes it")  # fmt: skip
    a = p.parse_args(argv)
    try:
        pids = {k: int(v) for k, v in (x.split(":", 1) for x in a.node_pids.split(",") if x)}
    except ValueError:
        p.error("--node-pids: NAME:PID,NAME:PID")
    try:
        if a.sched == "batch":
            os.sched_setscheduler(0, os.SCHED_BATCH, os.sched_param(0))
        result = run_federation(
            a.consumer_port, a.producer_port, rate=a.rate, replicate=a.replicate, duration=a.duration,
            warmup=a.warmup, consumers=a.consumers, producers=a.producers, drain=a.drain, stall=a.stall,
            queue=a.queue.encode(),
            node_pids=pids,
        )  # fmt: skip
    except (BenchError, OSError, ValueError) as exc:
        print("error: %s" % exc, file=sys.stderr)
        return 1
    policy = os.sched_getscheduler(0)  # what the run had, read back
    result["client_sched"] = {os.SCHED_BATCH: "batch", os.SCHED_OTHER: "normal"}.get(policy, str(policy))
    print(json.dumps(result))
    return 0


# --------------------------------------------------------------------------- processes


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

    # ---- servers

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
        argv = ["taskset", "-c", CLIENT_CPU, self.python, "-m", MODULE, "client", "--port", str(server.port),
                "--conns", str(self.conns), "--body-size", str(self.body_size), "--kind", kind]  # fmt: skip
        if self.cycles_count:
            argv += ["--count", str(self.cycles_count)]
        else:
            argv += ["--duration", str(self.sizes.duration)]
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

    # ---- the suites

    def bench_addjob(self) -> None:
        for name, n, pipeline in (("addjob_p1", self.sizes.n_p1, 1), ("addjob_p32", self.sizes.n_p32, 32)):
            for kind in self.kinds():
                key = self.key(kind, name)
                log("ADDJOB -P %d, n=%d (%s)" % (pipeline, n, kind))
                node = self.start(kind)
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
        for kind in self.kinds():
            key = self.key(kind, "getjob_p32")
            log("GETJOB NOHANG -P 32, n=%d (queue filled first with ADDJOB -P 32; %s)" % (n, kind))
            node = self.start(kind)
            try:
                r = self.fill_then(
                    node, n, ("ADDJOB", "q", self.body, "0"), ("GETJOB", "NOHANG", "FROM", "q"), ("QLEN", "q")
                )
                if r["left"] <= 0:
                    self.notes.append("%s: the queue ran dry, some GETJOBs may have returned nothing" % key)
                self.results[key] = r
            finally:
                self.stop(node)

    def bench_cycles(self) -> None:
        for kind in self.kinds():
            log("ADDJOB -> GETJOB NOHANG -> ACKJOB cycles, %d connections (%s)" % (self.conns, kind))
            node = self.start(kind)
            try:
                r = self.run_client(node, "disque")
                with SyncClient(node.port) as c:
                    r["registered_jobs_after"] = int(c.info("jobs")["registered_jobs"])
                self.results[self.key(kind, "cycles")] = r
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
        argv = launcher.node_argv(port, workdir, "--bind", HOST, "--logfile", str(workdir / "log"),
                                  python=self.python, script=True)  # fmt: skip
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

    # ---- the replication suite: three nodes on one core, REPLICATE 3

    def redis_benchmark_latency(self, nodes: list[Server], n: int, *command: str) -> dict[str, Any]:
        """redis-benchmark (not -q: its summary has p99) against nodes[0], CPU of every node."""
        argv = ["taskset", "-c", CLIENT_CPU, "redis-benchmark", "-h", HOST, "-p", str(nodes[0].port),
                "-c", str(self.clients), "-n", str(n), *command]  # fmt: skip
        self.record(argv)
        cpu0, t0 = [node.cpu_seconds() for node in nodes], time.monotonic()
        proc = subprocess.run(argv, capture_output=True, text=True, errors="replace")
        wall = time.monotonic() - t0
        cpu1 = [node.cpu_seconds() for node in nodes]
        if proc.returncode != 0:
            raise BenchError(
                "redis-benchmark failed (%d): %s\n%s" % (proc.returncode, shlex.join(argv), proc.stderr[-2000:])
            )
        out = proc.stdout
        m = re.search(r"throughput summary: ([\d.]+) requests per second", out)
        lat = re.search(r"avg\s+min\s+p50\s+p95\s+p99\s+max\s*[\r\n]+\s*([\d.\s]+)", out)
        if not m or not lat:
            raise BenchError("cannot parse redis-benchmark summary:\n%s" % out[-2000:])
        avg, _min, p50, p95, p99, mx = (float(v) for v in lat.group(1).split()[:6])
        return {
            "command": " ".join("<%d-byte body>" % len(a) if a == self.body else a for a in command),
            "n": n,
            "clients": self.clients,
            "requests_per_s": float(m.group(1)),
            "p50_ms": p50,
            "p95_ms": p95,
            "p99_ms": p99,
            "max_ms": mx,
            "wall_s": round(wall, 2),
            "node_cpu_pct": [
                round(100.0 * (b - a) / wall, 1) if a is not None and b is not None else None
                for a, b in zip(cpu0, cpu1)
            ],
        }

    def bench_replication(self) -> None:
        for kind in self.kinds():
            self._replication(kind)

    def _replication(self, kind: str) -> None:
        n = self.sizes.n_p1
        log("replication: ADDJOB REPLICATE 3, %d clients, n=%d, three nodes on CPU %s (%s)"
            % (self.clients, n, SERVER_CPU, kind))  # fmt: skip
        nodes = self.start_fed_cluster("repl", kind)
        try:
            r = self.redis_benchmark_latency(nodes, n, "ADDJOB", "q", self.body, "0", "REPLICATE", "3")
            with SyncClient(nodes[0].port) as c:
                info = c.info("jobs")
                r["registered_jobs"] = int(info["registered_jobs"])
            self.results[self.key(kind, "repl_addjob")] = r
            log("replication: %s ADDJOB/s, p50 %s, p99 %s" % (
                _rate(r["requests_per_s"]), _ms(r["p50_ms"]), _ms(r["p99_ms"])))  # fmt: skip
        finally:
            self.shutdown_nodes(nodes, label="repl")
        log("replication: ADDJOB -> GETJOB -> ACKJOB cycles (REPLICATE 3, the default), %d connections (%s)"
            % (self.conns, kind))  # fmt: skip
        nodes = self.start_fed_cluster("repl", kind)
        try:
            cpu0 = [node.cpu_seconds() for node in nodes]
            r = self.run_client(nodes[0], "disque")
            cpu1 = [node.cpu_seconds() for node in nodes]
            r["node_cpu_pct"] = [
                round(100.0 * (b - a) / r["elapsed_s"], 1) if a is not None and b is not None else None
                for a, b in zip(cpu0, cpu1)
            ]
            self.results[self.key(kind, "repl_cycles")] = r
            log("replication: %s cycles/s, p50 %s, p99 %s" % (
                _rate(r["cycles_per_s"], ""), _ms(r["p50_ms"]), _ms(r["p99_ms"])))  # fmt: skip
        finally:
            self.shutdown_nodes(nodes, label="repl")

    # ---- the federation suite: consumer on node A, producer on node B (or A)

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

    @staticmethod
    def _fed_stats(node: Server) -> dict[str, int]:
        with SyncClient(node.port, timeout=10.0) as c:
            stats = c.info("stats")
            jobs = c.info("jobs")
            qlen = c.call("QLEN", FED_QUEUE)
            cinfo = Bench.cluster_info(c)
        for k in ("messages_sent", "messages_received"):
            stats["bus_" + k] = cinfo.get("cluster_stats_" + k, "0")
        out = {k: int(stats[k]) for k in FED_COUNTERS if k in stats}
        missing = [k for k in FED_COUNTERS if k not in stats]
        if missing:
            raise BenchError("INFO stats on port %d has no %s" % (node.port, ", ".join(missing)))
        out["registered_jobs"] = int(jobs.get("registered_jobs", -1))
        out["qlen"] = int(qlen)
        return out

    @staticmethod
    def _fed_states(nodes: list[Server], ids: list[str], chunk: int = 2000) -> dict[str, int]:
        """How many of ``ids`` are in each state, by the SHOW of every node ("absent": on no node at all).

        A job on several nodes counts once, in the state furthest from lost:
        queued, then active (delivered, not acknowledged), then any other.
        """
        rank = {"queued": 0, "active": 1}
        best: dict[str, str] = {}
        for node in nodes:
            try:
                with SyncClient(node.port, timeout=30.0) as c:
                    for i in range(0, len(ids), chunk):
                        part = ids[i : i + chunk]
                        for jid, info in zip(part, c.pipeline([("SHOW", jid) for jid in part])):
                            if not isinstance(info, list):
                                continue
                            fields = dict(zip(info[0::2], info[1::2]))
                            state = fields.get(b"state", b"?").decode(errors="replace")
                            if jid not in best or rank.get(state, 2) < rank.get(best[jid], 2):
                                best[jid] = state
            except (OSError, BenchError) as exc:
                log("federation: SHOW on port %d failed (%s); its jobs count as absent" % (node.port, exc))
        counts = collections.Counter(best.values())
        counts["absent"] = len(ids) - len(best)
        return dict(counts)

    @staticmethod
    def _fed_where(nodes: list[Server], ids: list[str]) -> list[dict[str, Any]]:
        """SHOW of each (missing or duplicated) job ID on every node: who holds it, in which state."""
        out = []
        for jid in ids:
            row: dict[str, Any] = {"id": jid}
            for name, node in zip("ABC", nodes):
                try:
                    with SyncClient(node.port, timeout=5.0) as c:
                        info = c.call("SHOW", jid)
                except (OSError, BenchError) as exc:
                    row[name] = "error: %s" % exc
                    continue
                if info is None:
                    row[name] = None
                    continue
                fields = dict(zip(info[0::2], info[1::2]))

                def s(v: Any) -> Any:
                    if isinstance(v, bytes):
                        return v.decode(errors="replace")
                    if isinstance(v, list):
                        return [s(x) for x in v]
                    return v

                row[name] = {s(k): s(v) for k, v in fields.items()
                             if s(k) in ("state", "queue", "nodes-delivered", "nodes-confirmed", "nacks",
                                         "additional-deliveries", "next-requeue-within")}  # fmt: skip
            out.append(row)
        return out

    def fed_run(self, rate: float, replicate: int, duration: float, *, same_node: bool = False) -> dict[str, Any]:
        """One run on a fresh 3-node cluster: consumers on A, the producer on B (or on A)."""
        where = "A->A" if same_node else "B->A"
        log("federation: %s, REPLICATE %d, %s jobs/s, %.0f s (+%.0f s warm-up)"
            % (where, replicate, "{:,.0f}".format(rate), duration, self.sizes.fed_warmup))  # fmt: skip
        nodes = self.start_fed_cluster("fed", layout=self.fed_layout)
        a, b, _c = nodes
        producer = a if same_node else b
        try:
            before = [self._fed_stats(n) for n in nodes]
            argv = ["taskset", "-c", CLIENT_CPU, self.python, "-m", MODULE, "fedclient",
                    "--sched", self.fed_client_sched, "--consumer-port", str(a.port),
                    "--producer-port", str(producer.port), "--rate", "%g" % rate,
                    "--replicate", str(replicate), "--duration", "%g" % duration,
                    "--warmup", "%g" % self.sizes.fed_warmup,
                    "--consumers", str(self.fed_consumers), "--producers", str(self.producers_for(replicate)),
                    "--drain", "%g" % self.fed_drain,
                    "--node-pids", ",".join("%s:%d" % (name, n.proc.pid) for name, n in zip("ABC", nodes)
                                            if n.proc is not None)]  # fmt: skip
            self.record(argv)
            limit = self.sizes.fed_warmup + duration + self.fed_drain + 60.0
            snap0 = all_process_cpu()
            t0 = time.monotonic()
            client = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=str(ROOT),
                                      env=helper_env())  # fmt: skip
            try:
                stdout, stderr = client.communicate(timeout=limit)
            except subprocess.TimeoutExpired:
                raise BenchError("federation client did not finish within %.0f s: %s" % (limit, shlex.join(argv)))
            finally:
                if client.poll() is None:
                    client.kill()
                    client.wait()
            wall = time.monotonic() - t0
            ours = {os.getpid(), client.pid} | {n.proc.pid for n in nodes if n.proc is not None}
            other_s, other_top = foreign_cpu(snap0, all_process_cpu(), ours)
            for name, n in zip("ABC", nodes):
                if n.proc is not None and n.proc.poll() is not None:
                    raise BenchError("node %s (port %d) exited during the run:\n%s" % (name, n.port, n.tail()))
            if client.returncode != 0:
                raise BenchError("federation client failed (%d): %s\n%s"
                                 % (client.returncode, shlex.join(argv), stderr.strip()[-2000:]))  # fmt: skip
            r = json.loads(stdout.strip().splitlines()[-1])
            r["other_cpu_pct"] = round(100.0 * other_s / wall, 1)
            r["other_cpu_top"] = other_top
            after = [self._fed_stats(n) for n in nodes]
            r["where"] = where
            r["wall_s"] = round(wall, 2)
            r["stats"] = {name: {k: aft[k] - bef[k] if k in FED_COUNTERS else aft[k] for k in aft}
                          for name, bef, aft in zip("ABC", before, after)}  # fmt: skip
            sb = r["stats"]["A" if same_node else "B"]
            r["pushed"] = sb["jobs_pushed"]
            r["pulled"] = sb["jobs_exported"] - sb["jobs_pushed"]
            r["imported_A"] = r["stats"]["A"]["jobs_imported"]
            r["bus_messages_per_job"] = round(sum(r["stats"][n]["bus_messages_sent"] for n in "ABC")
                                              / max(1, r["jobs_produced"]), 2)  # fmt: skip
            # a missing job may still be on a node: the client stops waiting (--drain) after an overload
            r["still_queued"] = sum(r["stats"][n]["qlen"] for n in "ABC")
            missing_all = r.pop("missing_all", [])
            if missing_all:
                r["missing_states"] = self._fed_states(nodes, missing_all)
            odd = r["missing_ids"][:5] + r["duplicate_ids"][:5]
            if odd:
                r["where_odd_jobs"] = self._fed_where(nodes, odd)
            r["ok"] = self.fed_ok(r)
            log("federation: %s jobs/s offered, %s/s achieved, p50 %s, p99 %s, max %s; pushed %d, pulled %d; "
                "%d missing, %d duplicates; %.1f bus msgs/job; client CPU %.0f%%, nodes %s, other %s%%"
                % ("{:,.0f}".format(rate), "{:,.0f}".format(r["achieved_per_s"]), _ms(r["p50_ms"]), _ms(r["p99_ms"]),
                   _ms(r["max_ms"]), r["pushed"], r["pulled"], r["missing"], r["duplicates"], r["bus_messages_per_job"],
                   r["client_cpu_pct"], " ".join("%s %s%%" % kv for kv in r["node_cpu_pct"].items()),
                   r.get("other_cpu_pct")))  # fmt: skip
            if r["missing"] or r["duplicates"] or r["unexpected"] or r["addjob_errors"]:
                self.notes.append("federation %s R%d %g/s: %s" % (where, replicate, rate, _fed_tally(r)))
            return r
        finally:
            self.shutdown_nodes(nodes, label="federation")

    def producers_for(self, replicate: int) -> int:
        return self.fed_producers or (FED_PRODUCERS_R1 if replicate == 1 else FED_PRODUCERS_REPL)

    def fed_ok(self, r: dict[str, Any]) -> bool:
        """Sustained: achieved >= 95 % of offered, p99 <= 1 s, nothing lost, no ADDJOB error."""
        return (
            r["achieved_per_s"] >= FED_SUSTAINED * r["rate"]
            and r["p99_ms"] is not None
            and r["p99_ms"] <= FED_MAX_P99_MS
            and r["missing"] == 0
            and r["addjob_errors"] == 0
        )

    def _ramp_plan(self) -> Generator[float, bool, tuple[float | None, float | None]]:
        """The max-rate search: yields each rate to try and is sent whether it passed.

        Raise the rate x1.5 from FED_RAMP_START until a run fails (going down
        instead if the start fails), then bisect ``fed_bisect`` times; returns
        (the last good rate, the first failed one).
        """
        good: float | None = None
        bad: float | None = None
        rate = float(self.sizes.fed_ramp_start)
        while rate <= FED_RAMP_CAP:
            if (yield rate):
                good = rate
                if bad is not None:
                    break
                rate = float(round(rate * 1.5 / 50) * 50)
            else:
                bad = rate
                if good is not None:
                    break
                rate = float(round(rate / 2 / 50) * 50)  # the start failed: go down
                if rate < 50:
                    break
        for _ in range(self.sizes.fed_bisect):
            if good is None or bad is None or bad - good <= max(50.0, 0.05 * good):
                break
            mid = float(round((good + bad) / 2 / 50) * 50)
            if mid in (good, bad):
                break
            if (yield mid):
                good = mid
            else:
                bad = mid
        return good, bad

    def fed_ramps(self, p99_limit_ms: float | None = None, replicate: int = 1) -> dict[bool, dict[str, Any]]:
        """The maximum sustained rate, cross-node (False) and same-node (True), their steps alternating.

        Each search is :meth:`_ramp_plan`; running a cross-node step, then a
        same-node step, and so on, puts both under the same machine
        conditions, which on a shared VM drift by 10-20 % within minutes: the
        ratio of the two maxima is what the federation target is about.
        With ``p99_limit_ms``, a step passes only if it is sustained *and* its
        p99 is under that limit: the highest rate that keeps the latency target.
        """
        placements = (False, True)
        plans = {same: self._ramp_plan() for same in placements}
        steps: dict[bool, list[dict[str, Any]]] = {same: [] for same in placements}
        ends: dict[bool, tuple[float | None, float | None]] = {}
        pending: dict[bool, float] = {}
        for same, plan in plans.items():
            try:
                pending[same] = next(plan)
            except StopIteration as stop:
                ends[same] = stop.value
        while pending:
            for same in placements:
                if same not in pending:
                    continue
                r = self.fed_run(pending[same], replicate, self.sizes.fed_ramp_duration, same_node=same)
                if p99_limit_ms is not None:
                    r = {**r, "ok": r["ok"] and r["p99_ms"] is not None and r["p99_ms"] < p99_limit_ms}
                steps[same].append(r)
                try:
                    pending[same] = plans[same].send(r["ok"])
                except StopIteration as stop:
                    ends[same] = stop.value
                    del pending[same]
        out = {}
        for same in placements:
            good, bad = ends[same]
            out[same] = {
                "where": "A->A" if same else "B->A",
                "replicate": replicate,
                "p99_limit_ms": p99_limit_ms,
                "max_rate": good,
                "first_failed_rate": bad,
                "best": next((st for st in steps[same] if st["rate"] == good and st["ok"]), None),
                "steps": steps[same],
            }
        return out

    def bench_federation(self) -> None:
        s = self.sizes
        for replicate in s.fed_replicates:
            for rate in s.fed_rates:
                self.results["fed_r%d_%g" % (replicate, rate)] = self.fed_run(rate, replicate, s.fed_duration)
        if s.fed_ramp:
            for replicate in self.fed_ramp_replicates:
                # The highest rate kept within the latency target (what the target's "maximum" is), then
                # the throughput ceiling: the same search where only p99 > 1 s fails a sustained step.
                fast = self.fed_ramps(FED_TARGET_P99_MS, replicate)
                self.results["fed_fast_cross_r%d" % replicate] = fast[False]
                self.results["fed_fast_same_r%d" % replicate] = fast[True]
                ramps = self.fed_ramps(replicate=replicate)
                self.results["fed_max_cross_r%d" % replicate] = ramps[False]
                self.results["fed_max_same_r%d" % replicate] = ramps[True]

    # ---- the queues suite: what many idle queues cost a node

    @staticmethod
    def _cpu_pct(node: Server, window: float) -> float | None:
        """``node``'s CPU use over the next ``window`` seconds, in % of one core."""
        c0 = node.cpu_seconds()
        t0 = time.monotonic()
        time.sleep(window)
        c1 = node.cpu_seconds()
        if c0 is None or c1 is None:
            return None
        return round(100.0 * (c1 - c0) / (time.monotonic() - t0), 1)

    def bench_queues(self) -> None:
        """Idle queues on node A of a 3-node cluster: memory per queue, and node CPU with nothing
        to do, then with one client blocked on another queue (the federation tick runs)."""
        n, window = self.sizes.idle_queues, self.sizes.idle_window
        log("queues: %s idle queues on one node of 3, CPU over %g s idle and with a blocked client"
            % ("{:,}".format(n), window))  # fmt: skip
        nodes = self.start_fed_cluster("queues")
        a = nodes[0]
        try:
            with SyncClient(a.port, timeout=60.0) as c:
                before = int(c.info("memory")["used_memory"])
                t0 = time.monotonic()
                for start in range(0, n, 10_000):  # each queue gets a job, which is then deleted
                    names = ["idle-%d" % i for i in range(start, min(n, start + 10_000))]
                    ids = c.pipeline([("ADDJOB", q, "x", 0, "REPLICATE", 1) for q in names])
                    bad = [r for r in ids if not isinstance(r, bytes)]
                    if bad:
                        raise BenchError("queues: ADDJOB failed: %s" % bad[0])
                    c.call("FASTACK", *ids)
                fill_s = time.monotonic() - t0
                registered = int(c.info("queues")["registered_queues"])
                after = int(c.info("memory")["used_memory"])
                idle_cpu = self._cpu_pct(a, window)
                with SyncClient(a.port, timeout=window + 30.0) as blocked:
                    blocked.sock.sendall(encode("GETJOB", "TIMEOUT", int((window + 5) * 1000), "FROM", "waiting"))
                    deadline = time.monotonic() + 10.0
                    while int(c.info("clients")["blocked_clients"]) < 1:
                        if time.monotonic() > deadline:
                            raise BenchError("queues: the GETJOB did not block")
                        time.sleep(0.05)
                    blocked_cpu = self._cpu_pct(a, window)
            if registered < n:
                self.notes.append("queues: only %d of %d queues registered" % (registered, n))
            self.results["queues_idle"] = {
                "queues": registered,
                "used_memory_before": before,
                "used_memory_after": after,
                "bytes_per_queue": round((after - before) / registered, 1) if registered else None,
                "fill_s": round(fill_s, 2),
                "window_s": window,
                "node_cpu_idle_pct": idle_cpu,
                "node_cpu_blocked_pct": blocked_cpu,
            }
        finally:
            self.shutdown_nodes(nodes, label="queues")


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
        # which build: the same version runs 20-30 % apart between builds (BENCHMARKS.md, "Interpreter build")
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


def bus_report(bench: Bench) -> list[str]:
    """The bus suite's two tables (idle traffic per node, chain join), or nothing."""
    res = bench.results
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


#: Disque 1.0-rc1, three nodes, consumer on A, producer on B, REPLICATE 1 (from the issue): (p50, p99).
FED_REFERENCE = {50: ("50 ms", "400 ms"), 500: ("3.5 s", "6.0 s"), 5000: ("5.1 s", "7.5 s")}
#: Our targets: p99 under this at every rate up to the maximum; cross-node max >= this share of same-node.
FED_TARGET_P99_MS = 10.0
FED_TARGET_SHARE = 0.80


def _fed_tally(r: dict[str, Any]) -> str:
    """What a federation run got wrong, in words; a missing job still held by a node is not lost."""
    held = ""
    states = r.get("missing_states")
    if r["missing"] and states:
        # looked up with SHOW on every node after the client stopped waiting
        parts = ["%d %s" % (n, {"queued": "still queued", "active": "delivered to a consumer that had stopped reading, "
                                "not acknowledged", "absent": "on no node: lost"}.get(k, k))
                 for k, n in sorted(states.items(), key=lambda kv: -kv[1]) if n]  # fmt: skip
        held = " (%s)" % "; ".join(parts)
    elif r["missing"] and r.get("still_queued"):  # results from before the lookup: queue lengths only
        held = " (%d of them still queued when the client stopped waiting)" % min(r["still_queued"], r["missing"])
    return "%d missing%s, %d duplicates, %d unexpected, %d ADDJOB errors" % (
        r["missing"], held, r["duplicates"], r["unexpected"], r["addjob_errors"])


def _fed_why(r: dict[str, Any]) -> str:
    """Why a ramp step failed the sustained test."""
    why = []
    if r["achieved_per_s"] < FED_SUSTAINED * r["rate"]:
        why.append("achieved %s/s" % "{:,.0f}".format(r["achieved_per_s"]))
    if r["p99_ms"] is None or r["p99_ms"] > FED_MAX_P99_MS:
        why.append("p99 %s" % _ms(r["p99_ms"]))
    if r["missing"]:
        why.append("%d missing" % r["missing"])
    if r["addjob_errors"]:
        why.append("%d ADDJOB errors" % r["addjob_errors"])
    return ", ".join(why) or "—"


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


def replication_report(bench: Bench) -> list[str]:
    """The replication suite's table, or nothing."""
    res = bench.results
    a, c = res.get("repl_addjob"), res.get("repl_cycles")
    if not a and not c:
        return []

    def cpus(r: dict[str, Any]) -> str:
        return " / ".join("—" if v is None else "%.0f%%" % v for v in r.get("node_cpu_pct", []))

    out = [
        "Replication: 3 nodes joined, all pinned to CPU %s (as the Disque reference: three nodes on one core), "
        "the load on CPU %s, %d-byte body; ADDJOB sent to the first node." % (SERVER_CPU, CLIENT_CPU, bench.body_size),
        "",
        "| Test | disque-py | p50 / p99 | node CPU (origin / others) | Disque 1.0-rc1 | Target | Met |",
        "|---|---|---|---|---|---|---|",
    ]  # fmt: skip
    if a:
        ref, target, text = REFERENCE["repl_addjob"]
        met = _meets(a["requests_per_s"], target)
        if met == "yes" and a["p99_ms"] >= 5:
            met = "**NO** (p99)"
        out.append("| ADDJOB REPLICATE 3, %d clients, n=%s | %s | %s / %s | %s | %s | %s | %s |" % (
            a["clients"], "{:,}".format(a["n"]), _rate(a["requests_per_s"]), _ms(a["p50_ms"]), _ms(a["p99_ms"]),
            cpus(a), _reference_cell(res.get("ref_repl_addjob"), ref), text, met))  # fmt: skip
    if c:
        ref, target, text = REFERENCE["repl_cycles"]
        out.append("| ADDJOB→GETJOB→ACKJOB cycles, %d conns | %s cycles/s | %s / %s | %s | %s | %s | %s |" % (
            c["conns"], _rate(c["cycles_per_s"], ""), _ms(c["p50_ms"]), _ms(c["p99_ms"]), cpus(c),
            _reference_cell(res.get("ref_repl_cycles"), ref), text, _meets(c["cycles_per_s"], target)))  # fmt: skip
    refs = [(name, res[key]) for name, key in (("ADDJOB REPLICATE 3", "ref_repl_addjob"),
                                                ("cycles", "ref_repl_cycles")) if key in res]  # fmt: skip
    if refs:
        out += ["", "Disque 1.0-rc1 node CPU (origin / others), same runs: " + "; ".join(
            "%s %s" % (name, cpus(r)) for name, r in refs) + "."]  # fmt: skip
    return out


def _ramp_table(ramps: list[dict[str, Any]], what: str) -> list[str]:
    """One row per placement of a max-rate search (:meth:`Bench.fed_ramps`)."""
    out = [
        "| Producer → consumer | %s | at that rate: achieved, p50, p99 | load CPU | first failed rate "
        "(why) | steps (offered: achieved, p99) |" % what,
        "|---|---|---|---|---|---|",
    ]
    for m in ramps:
        b = m["best"]
        bad = next((s for s in m["steps"] if s["rate"] == m["first_failed_rate"]), None)
        why = "—"
        if bad is not None:
            why = _fed_why(bad)
            if why == "—" and m.get("p99_limit_ms") is not None:
                why = "p99 %s >= %.0f ms" % (_ms(bad["p99_ms"]), m["p99_limit_ms"])
        out.append("| %s | %s | %s | %s | %s | %s |" % (
            "B → A (cross-node)" if m["where"] == "B->A" else "A → A (same node)",
            "—" if m["max_rate"] is None else "**%s jobs/s**" % "{:,.0f}".format(m["max_rate"]),
            "—" if b is None else "%s/s, %s, %s" % ("{:,.0f}".format(b["achieved_per_s"]), _ms(b["p50_ms"]),
                                                    _ms(b["p99_ms"])),
            "—" if b is None else "%.0f%%" % b["client_cpu_pct"],
            "—" if bad is None else "%s/s (%s)" % ("{:,.0f}".format(bad["rate"]), why),
            "; ".join("%s: %s, %s" % ("{:,.0f}".format(s["rate"]), "{:,.0f}".format(s["achieved_per_s"]),
                                      _ms(s["p99_ms"])) for s in m["steps"])))  # fmt: skip
    return out


def _replicates(text: str) -> tuple[int, ...]:
    """``--fed-replicates`` and ``--fed-ramp-replicates``: "1,3" -> (1, 3); each 1-3 (the cluster has 3
    nodes)."""
    try:
        out = tuple(int(x) for x in text.split(",") if x.strip())
    except ValueError:
        raise argparse.ArgumentTypeError("comma-separated REPLICATE factors, e.g. 1,3: %r" % text) from None
    if not out or any(r not in (1, 2, 3) for r in out):
        raise argparse.ArgumentTypeError("REPLICATE factors from 1 to 3, e.g. 1,3: %r" % text)
    return out


def fed_node_cpu(layout: str, i: int) -> str:
    """The ``taskset -c`` CPU list of federation node ``i`` (0 = A, 1 = B, 2 = C) in ``layout``."""
    if layout == "pair-per-core":
        return (SERVER_CPU, CLIENT_CPU, "%s,%s" % (SERVER_CPU, CLIENT_CPU))[i]
    if layout == "node-per-core" and i:
        return CLIENT_CPU
    return SERVER_CPU


def fed_layout_text(layout: str, sched: str) -> str:
    policy = "SCHED_BATCH" if sched == "batch" else "SCHED_OTHER"
    if layout == "pair-per-core":
        return ("node A pinned to CPU %s, node B to CPU %s together with the load generator (one process, %s), "
                "node C on either CPU (the kernel's choice)" % (SERVER_CPU, CLIENT_CPU, policy))
    if layout == "node-per-core":
        return ("node A pinned to CPU %s, nodes B and C to CPU %s together with the load generator (one process, %s)"
                % (SERVER_CPU, CLIENT_CPU, policy))
    return "3 nodes (A, B, C) all pinned to CPU %s, the load generator (one process, %s) on CPU %s" % (
        SERVER_CPU, policy, CLIENT_CPU)


def _fed_kept(r: dict[str, Any]) -> bool:
    """One federation run kept the latency target: p99 under it, the rate sustained, no job missing."""
    return (r["p99_ms"] is not None and r["p99_ms"] < FED_TARGET_P99_MS and r["missing"] == 0
            and r["achieved_per_s"] >= FED_SUSTAINED * r["rate"])  # fmt: skip


def fed_kept_max(runs: list[dict[str, Any]]) -> float:
    """The highest rate at which every one of ``runs`` (one placement's: both searches' steps and its
    fixed runs) kept the latency target, at that rate and at every lower one; 0 when none did.

    The target asks for p99 under 10 ms "at every rate up to" the maximum: near the edge two runs at the
    same rate can give 6 and 16 ms, so a rate counts only if every run at it passed. The same rule for
    the cross-node and the same-node side, so the ratio compares like with like."""
    best = 0.0
    for rate in sorted({r["rate"] for r in runs}):
        if not all(_fed_kept(r) for r in runs if r["rate"] == rate):
            break
        best = rate
    return best


def federation_report(bench: Bench) -> list[str]:
    """The federation suite's tables (fixed rates, maximum sustained rates, against the targets), or nothing."""
    res, sizes = bench.results, bench.sizes
    runs = sorted((r for k, r in res.items() if k.startswith("fed_r")), key=lambda r: (r["replicate"], r["rate"]))
    # max-rate searches by REPLICATE: {"fast" | "max": {"cross" | "same": search}}
    searches: dict[int, dict[str, dict[str, dict[str, Any]]]] = {}
    for key, m in res.items():
        parts = key.split("_")
        if len(parts) == 4 and parts[0] == "fed" and parts[1] in ("fast", "max") and parts[2] in ("cross", "same"):
            searches.setdefault(m["replicate"], {}).setdefault(parts[1], {})[parts[2]] = m
    ramps = [m for by in searches.values() for kind in by.values() for m in kind.values()]
    if not runs and not ramps:
        return []
    out = [
        "Federation (layout %s): %s; "
        "%d consumer connections on A blocked in GETJOB TIMEOUT 1000 FROM %s (ACKJOB each job, block again), "
        "open-loop producer on %s connections sending ADDJOB %s <monotonic_ns> 0 REPLICATE r (pipelined); "
        "latency = receive - send, over the jobs sent after a %.0f s warm-up; fresh cluster per run."
        % (bench.fed_layout, fed_layout_text(bench.fed_layout, bench.fed_client_sched), bench.fed_consumers,
           FED_QUEUE.decode(),
           bench.fed_producers or "%d (REPLICATE 1) or %d (REPLICATE > 1)" % (FED_PRODUCERS_R1, FED_PRODUCERS_REPL),
           FED_QUEUE.decode(), sizes.fed_warmup),
    ]  # fmt: skip
    if runs:
        out += [
            "",
            "| Producer → consumer | REPLICATE | offered | achieved | p50 | p99 | max | ADDJOB p99 | pushed / pulled "
            "| produced / received once / missing / dup | backlog drained in | bus msgs/job | load CPU "
            "| node CPU A / B / C | other CPU |",
            "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|",
        ]
        for r in runs:
            cpu = r["node_cpu_pct"]
            out.append("| %s | %d | %s/s | %s/s | %s | %s | %s | %s | %d / %d | %d / %d / %d / %d | %s | %.1f | %.0f%% "
                       "| %s | %s |" % (
                r["where"].replace("->", " → "), r["replicate"], "{:,.0f}".format(r["rate"]),
                "{:,.0f}".format(r["achieved_per_s"]), _ms(r["p50_ms"]), _ms(r["p99_ms"]), _ms(r["max_ms"]),
                _ms(r["addjob_p99_ms"]), r["pushed"], r["pulled"], r["jobs_produced"], r["unique_received"],
                r["missing"], r["duplicates"],
                "%.1f s%s" % (r["drain_s"], " (gave up: %s)" % r["drain_timed_out"] if r["drain_timed_out"] else ""),
                r["bus_messages_per_job"], r["client_cpu_pct"],
                " / ".join("—" if cpu.get(n) is None else "%.0f%%" % cpu[n] for n in "ABC"),
                "—" if r.get("other_cpu_pct") is None else "%.0f%%" % r["other_cpu_pct"]))  # fmt: skip
    for replicate, by in sorted(searches.items()):
        if "fast" in by:
            out += [
                "",
                "Highest rate that keeps the latency target (the target's maximum), REPLICATE %d: the rate is "
                "raised ×1.5 from %s jobs/s (%.0f s per step, fresh cluster each) until a step fails (achieved "
                "< %.0f%% of offered, p99 >= %.0f ms, or a job missing), then bisected %d times; the last rate "
                "that passed. The cross-node and same-node searches alternate their steps, so both see the same "
                "machine conditions."
                % (replicate, "{:,.0f}".format(sizes.fed_ramp_start), sizes.fed_ramp_duration,
                   100 * FED_SUSTAINED, FED_TARGET_P99_MS, sizes.fed_bisect),
                "",
                *_ramp_table([by["fast"][k] for k in ("cross", "same") if k in by["fast"]],
                             "max with p99 < %.0f ms" % FED_TARGET_P99_MS),
            ]  # fmt: skip
        if "max" in by:
            out += [
                "",
                "Throughput ceiling, REPLICATE %d: the same search, where a step fails only if achieved < %.0f%% "
                "of offered, p99 > %.0f ms or a job is missing: how much the pair takes with latency let go. "
                "Near it the last ~10 %% of throughput costs p99 (a stall of s at utilisation u takes "
                "s·u/(1-u) to drain), on the same node as across nodes."
                % (replicate, 100 * FED_SUSTAINED, FED_MAX_P99_MS),
                "",
                *_ramp_table([by["max"][k] for k in ("cross", "same") if k in by["max"]], "max sustained"),
            ]  # fmt: skip
    # Against the reference and the targets.
    rows = ["| Test | disque-py p50 / p99 | Disque 1.0-rc1 p50 / p99 | Target | Met |", "|---|---|---|---|---|"]

    def placement_runs(replicate: int, placement: str) -> list[dict[str, Any]]:
        """Every run of one placement at one REPLICATE: both searches' steps and the fixed runs."""
        by = searches.get(replicate, {})
        steps = [st for kind in ("fast", "max") if placement in by.get(kind, {}) for st in by[kind][placement]["steps"]]
        where = "B->A" if placement == "cross" else "A->A"
        return steps + [r for r in runs if r["where"] == where and r["replicate"] == replicate]

    kept = {r: {pl: fed_kept_max(placement_runs(r, pl)) for pl in ("cross", "same")}
            for r, by in searches.items() if "cross" in by.get("fast", {})}  # fmt: skip
    target_max = {r: k["cross"] for r, k in kept.items()}
    for r in runs:
        if r["where"] != "B->A":
            continue
        ref = FED_REFERENCE.get(int(r["rate"])) if r["replicate"] == 1 else None
        # the maximum applies to the runs of the REPLICATE it was searched with
        top = target_max.get(r["replicate"])
        within = top is None or r["rate"] <= top
        met = _fed_kept(r)
        rows.append("| B → A, REPLICATE %d, %s jobs/s | %s / %s | %s | p99 < %.0f ms%s | %s |" % (
            r["replicate"], "{:,.0f}".format(r["rate"]), _ms(r["p50_ms"]), _ms(r["p99_ms"]),
            "%s / %s" % ref if ref else "—", FED_TARGET_P99_MS,
            "" if within else " (above the max: n/a)", ("yes" if met else "**NO**") if within else "n/a"))  # fmt: skip
    for replicate, by in sorted(searches.items()):
        fast, ceiling = by.get("fast", {}), by.get("max", {})
        if "cross" in fast and "same" in fast and kept[replicate]["same"]:
            top, same_top = kept[replicate]["cross"], kept[replicate]["same"]
            share = top / same_top
            rows.append("| Max with p99 < %.0f ms in every run at it and below, B → A vs A → A, REPLICATE %d "
                        "(the latency-bounded search alone: %s vs %s) | %s vs %s jobs/s = %.0f%% | — | >= %.0f%% "
                        "| %s |" % (FED_TARGET_P99_MS, replicate, "{:,.0f}".format(fast["cross"]["max_rate"] or 0),
                                    "{:,.0f}".format(fast["same"]["max_rate"] or 0), "{:,.0f}".format(top),
                                    "{:,.0f}".format(same_top), 100 * share, 100 * FED_TARGET_SHARE,
                                    "yes" if share >= FED_TARGET_SHARE else "**NO**"))  # fmt: skip
            # Every B -> A measurement at a rate up to that maximum: the search's own steps, the fixed
            # runs and the ceiling search's steps (independent runs at the same rates).
            seen = [("", st) for st in fast["cross"]["steps"] if st["rate"] <= top]
            seen += [("fixed ", st) for st in runs
                     if st["where"] == "B->A" and st["replicate"] == replicate and st["rate"] <= top]
            if "cross" in ceiling:
                seen += [("ceiling ", st) for st in ceiling["cross"]["steps"] if st["rate"] <= top]
            over = [st for _, st in seen if st["p99_ms"] is None or st["p99_ms"] >= FED_TARGET_P99_MS]
            rows.append("| p99 < %.0f ms at every rate up to that max (B → A, REPLICATE %d; every run at such a "
                        "rate) | %s | — | every run | %s |" % (
                FED_TARGET_P99_MS, replicate,
                "; ".join("%s%s/s: %s" % (tag, "{:,.0f}".format(st["rate"]), _ms(st["p99_ms"]))
                          for tag, st in sorted(seen, key=lambda x: x[1]["rate"])) or "—",
                "yes" if seen and not over else "**NO**"))  # fmt: skip
        if "cross" in ceiling and "same" in ceiling and ceiling["same"]["max_rate"]:
            top = ceiling["cross"]["max_rate"] or 0
            rows.append("| Throughput ceiling (p99 <= %.0f ms), B → A vs A → A, REPLICATE %d (for reading the "
                        "rows above) | %s vs %s jobs/s = %.0f%% | — | — | — |" % (
                FED_MAX_P99_MS, replicate, "{:,.0f}".format(top), "{:,.0f}".format(ceiling["same"]["max_rate"]),
                100 * top / ceiling["same"]["max_rate"]))  # fmt: skip
    if len(rows) > 2:
        out += ["", *rows]
    checks = []
    for r in runs + [s for m in ramps for s in m["steps"]]:
        if r["missing"] or r["duplicates"] or r["unexpected"] or r["addjob_errors"]:
            checks.append("%s R%d %g/s: %s%s" % (
                r["where"], r["replicate"], r["rate"], _fed_tally(r),
                "; where: %s" % json.dumps(r.get("where_odd_jobs")) if r.get("where_odd_jobs") else ""))  # fmt: skip
    every = runs + [s for m in ramps for s in m["steps"]]
    busy = [r for r in every if (r.get("other_cpu_pct") or 0) >= FED_FOREIGN_PCT]
    if busy:
        out += ["", "**Other load on the machine** (CPU used by other processes alive at the end of the run, "
                ">= %d%% of a core over the run) during: %s. Those runs are disturbed; rerun on a quiet machine."
                % (FED_FOREIGN_PCT, ", ".join("%s R%d %g/s (%.0f%%: %s)" % (
                    r["where"], r["replicate"], r["rate"], r["other_cpu_pct"],
                    ", ".join(n for n, _ in r.get("other_cpu_top") or [])) for r in busy))]  # fmt: skip
    total = sum(r["jobs_produced"] for r in every)
    out += ["", "Exactly once: %s" % ("; ".join(checks) if checks else
                                     "every one of %s produced jobs was received exactly once (unique IDs)"
                                     % "{:,}".format(total))]  # fmt: skip
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
            _reference_cell(res.get("ref_" + key), ref), target_text, _meets(value, target)))  # fmt: skip
    c, rc, dc = res.get("cycles"), res.get("redis_cycles"), res.get("ref_cycles")
    if c or rc or dc:
        rows.append("| ADDJOB→GETJOB→ACKJOB cycles, %d conns | %s | %s | %s | %s | — | — |" % (
            (c or rc or dc)["conns"],
            "%s cycles/s (%s req/s)" % (_rate(c["cycles_per_s"], ""), _rate(c["requests_per_s"], "")) if c else "—",
            "%s (%s)" % (_ms(c["p50_ms"]), _ms(c["p99_ms"])) if c else "—",
            ("LPUSH→RPOP→DEL %s cycles/s, p50 %s" % (_rate(rc["cycles_per_s"], ""), _ms(rc["p50_ms"]))
             if rc else "—"),
            ("here: %s cycles/s, p50 %s (p99 %s)" % (_rate(dc["cycles_per_s"], ""), _ms(dc["p50_ms"]),
                                                     _ms(dc["p99_ms"])) if dc else "—"),
        ))  # fmt: skip
    ref, target, target_text = REFERENCE["memory"]
    for key in sorted((k for k in res if k.startswith("memory_")), key=lambda k: int(k.split("_")[1])):
        m = res[key]
        rows.append("| Memory, %s jobs, %d-byte body | %s bytes/job | — | — | %s | %s | %s |" % (
            "{:,}".format(m["jobs"]), m["body_size"], _rate(m["bytes_per_job"], ""), ref, target_text,
            _meets(m["bytes_per_job"], target, higher_is_better=False)))  # fmt: skip

    q = res.get("queues_idle")
    if q:
        rows.append("| %s idle queues on one node of 3 | %s bytes/queue; node CPU %s idle, %s with a client "
                    "blocked elsewhere | — | — | — | — | — |" % (
                        "{:,}".format(q["queues"]), _rate(q["bytes_per_queue"], ""),
                        _pct(q["node_cpu_idle_pct"]), _pct(q["node_cpu_blocked_pct"])))  # fmt: skip

    diag = ["| Run | server CPU | client CPU | check |", "|---|---|---|---|"]
    for key, r in res.items():
        if key.startswith(("bus_", "fed_", "repl_", "queues_", "ref_repl_")):
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
        "Machine: %s cores, %s; Python %s (%s); %s; commit %s" % (
            machine["nproc"], machine["cpu_model"], machine["python"], machine.get("interpreter", "?"),
            machine["redis_benchmark"], machine["git_commit"]),
    ]  # fmt: skip
    if machine.get("disque_server"):
        out.append("Reference measured here: %s." % machine["disque_server"])
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
    repl = replication_report(bench)
    if repl:
        out += ["", *repl]
    fed = federation_report(bench)
    if fed:
        out += ["", *fed]
    if not bus and not repl and not fed and len(rows) == 2:
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


def default_results_path(commit: str) -> Path:
    """Where a run's raw results go without ``--write``: ``bench-results/`` of this checkout."""
    return ROOT / "bench-results" / ("%s-%s.json" % (time.strftime("%Y%m%d-%H%M%S"), commit[:12] or "nogit"))


def check_tools(suites: list[str]) -> None:
    """Fail early and clearly on a missing tool; redis-server only skips the yardstick."""
    missing = []
    if any(s != "bus" for s in suites) and not shutil.which("taskset"):
        missing.append("taskset (util-linux) to pin the server and the load to separate CPUs")
    needs = ("addjob", "getjob", "memory", "redis", "replication")
    if any(s in suites for s in needs) and not shutil.which("redis-benchmark"):
        missing.append("redis-benchmark (apt-get install redis-tools), needed by: %s" % ", ".join(needs))
    if missing:
        raise BenchError("missing:\n  " + "\n  ".join(missing))
    if any(s != "bus" for s in suites) and (os.cpu_count() or 1) < 2:
        raise BenchError("needs at least 2 CPUs (server on CPU %s, load on CPU %s)" % (SERVER_CPU, CLIENT_CPU))


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

def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["client"]:
        return client_main(argv[1:])
    if argv[:1] == ["fedclient"]:
        return fedclient_main(argv[1:])
    if argv[:1] == ["core"]:
        from .bench_core import core_main

        return core_main(argv[1:])
    if argv[:1] == ["spark"]:
        from .bench_spark import main as spark_main

        return spark_main(argv[1:])
    if argv[:1] == ["client-lib"]:
        from .bench_client import main as client_lib_main

        client_lib_main(argv[1:])
        return 0
    p = argparse.ArgumentParser(
        prog="scripts/bench",
        description="Benchmark one disque-py node (CPU %s) with redis-benchmark and our own client (CPU %s); "
        "redis-server under the same load as a yardstick. `scripts/bench client --help` for the client alone, "
        "`scripts/bench core --help` for the core's CPU per job without I/O."
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
    p.add_argument("--fed-rates", default=None,
                   help="federation: offered jobs/s of the fixed runs (default 50,500,5000; quick 50,500)")
    p.add_argument("--fed-replicates", type=_replicates, default=None,
                   help="federation: REPLICATE factors of the fixed runs (default 1,3)")
    p.add_argument("--fed-duration", type=float, default=None, help="federation: s per fixed run (default 10, quick 2)")
    p.add_argument("--fed-ramp-duration", type=float, default=None, help="federation: s per ramp step (default 5)")
    p.add_argument("--fed-ramp-start", type=float, default=None,
                   help="federation: first rate of the ramp (default 1000)")
    p.add_argument("--fed-no-ramp", action="store_true", help="federation: skip the max-rate ramps")
    p.add_argument("--fed-consumers", type=int, default=10, help="federation: consumer connections on A (default 10)")
    p.add_argument("--disque-server", metavar="PATH", default=None,
                   help="a disque-server binary (Disque 1.0-rc1, built from github.com/antirez/disque at tag "
                        "1.0-rc1): the addjob, getjob, cycles and replication suites also run on it, under the "
                        "same load and pinning, and the report shows both")
    p.add_argument("--fed-layout", choices=("pair-per-core", "node-per-core", "one-core"), default="pair-per-core",
                   help="federation: pair-per-core (default) pins A to CPU %s and B to CPU %s with the load "
                        "generator, and lets the kernel run C on either CPU (the pair A, B a core each, as "
                        "deployed: the pair's own rate); node-per-core pins C to CPU %s beside B and the load "
                        "generator (with REPLICATE 3 the producer's node then shares its core with a replica "
                        "and the clients, the consumer's node with nothing); one-core pins A, B and C to CPU "
                        "%s, as the replication reference (what moving a job costs in total)"
                        % (SERVER_CPU, CLIENT_CPU, CLIENT_CPU, SERVER_CPU))
    p.add_argument("--fed-client-sched", choices=("batch", "normal"), default="batch",
                   help="federation: the load generator's scheduling policy. batch (default, SCHED_BATCH): a "
                        "reply that wakes it does not take the core from the node it shares it with, as a "
                        "client on another machine would not; normal: it does, at once (the figures before "
                        "this option)")
    p.add_argument("--fed-ramp-replicates", "--fed-ramp-replicate", type=_replicates, default=(1, 3),
                   help="federation: REPLICATE factors of the max-rate searches, comma-separated (default 1,3; "
                        "each adds a latency-bounded and a ceiling search, ~8 minutes)")
    p.add_argument("--fed-producers", type=int, default=None,
                   help="federation: producer connections (default 4 for REPLICATE 1, 32 for REPLICATE 2-3)")
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
    try:
        if a.fed_rates:
            sizes.fed_rates = tuple(float(x) for x in a.fed_rates.split(",") if x.strip())
    except ValueError:
        p.error("--fed-rates: comma-separated numbers, e.g. 50,500,5000")
    if a.fed_replicates:
        sizes.fed_replicates = a.fed_replicates
    if any(r <= 0 for r in sizes.fed_rates):
        p.error("federation: rates must be > 0")
    for name in ("fed_duration", "fed_ramp_duration", "fed_ramp_start"):
        if getattr(a, name) is not None:
            if getattr(a, name) <= 0:
                p.error("--%s must be > 0" % name.replace("_", "-"))
            setattr(sizes, name, getattr(a, name))
    if a.fed_no_ramp:
        sizes.fed_ramp = False
    if a.fed_consumers < 1 or (a.fed_producers is not None and a.fed_producers < 1):
        p.error("--fed-consumers and --fed-producers must be >= 1")
    if a.disque_server:
        found = shutil.which(a.disque_server)
        if not found:
            p.error("--disque-server %s: no such executable" % a.disque_server)
        a.disque_server = os.path.abspath(found)
    bus_max = max((*sizes.bus_nodes, sizes.chain_nodes)) if "bus" in suites else 0
    top = a.base_port + (BUS_PORT_SHIFT + bus_max - 1 if bus_max else 1)
    if "federation" in suites:
        top = max(top, a.base_port + FED_PORT_SHIFT + 2)
    if top + 10000 > 65535 or a.base_port < 1:
        p.error("--base-port %d leaves no room for the ports used (up to %d, cluster bus +10000)" % (a.base_port, top))

    signal.signal(signal.SIGTERM, _on_sigterm)
    try:
        check_tools(suites)
        ports = [a.base_port, a.base_port + 10000] + ([a.base_port + 1] if "redis" in suites else [])
        for i in range(bus_max):
            ports += [a.base_port + BUS_PORT_SHIFT + i, a.base_port + BUS_PORT_SHIFT + i + 10000]
        if "federation" in suites:
            for i in range(3):
                ports += [a.base_port + FED_PORT_SHIFT + i, a.base_port + FED_PORT_SHIFT + i + 10000]
        busy = [port for port in ports if port_in_use(port)]
        if busy:
            raise BenchError(
                "port(s) %s already in use (disque-py uses --base-port and +10000 for its "
                "cluster bus, redis-server --base-port + 1, the bus suite --base-port + %d ... + %d, the "
                "federation suite --base-port + %d ... + %d, each with +10000): pick another --base-port"
                % (", ".join(map(str, busy)), BUS_PORT_SHIFT, BUS_PORT_SHIFT + max(bus_max, 1) - 1,
                   FED_PORT_SHIFT, FED_PORT_SHIFT + 2)
            )  # fmt: skip
        machine = machine_info(sys.executable)
        if a.disque_server:
            machine["disque_server"] = "%s (%s)" % (a.disque_server, _run([a.disque_server, "--version"]))
        bench = Bench(sizes, a.base_port, conns=a.conns, cycles_count=a.cycles_count, shared_queue=a.shared_queue,
                      node_timeout=a.cluster_node_timeout, fed_consumers=a.fed_consumers,
                      fed_producers=a.fed_producers, disque_server=a.disque_server, fed_layout=a.fed_layout,
                      fed_client_sched=a.fed_client_sched, fed_ramp_replicates=a.fed_ramp_replicates)  # fmt: skip
        t0 = time.monotonic()
        try:
            steps: dict[str, Callable[[], None]] = {
                "addjob": bench.bench_addjob, "getjob": bench.bench_getjob, "cycles": bench.bench_cycles,
                "memory": bench.bench_memory, "redis": bench.bench_redis, "bus": bench.bench_bus,
                "replication": bench.bench_replication, "federation": bench.bench_federation,
                "queues": bench.bench_queues,
            }  # fmt: skip
            chosen = [name for name in SUITES if name in suites]
            with progress.bar(len(chosen), "scripts/bench") as bar:
                for name in chosen:
                    bar.doing(name)
                    steps[name]()
                    bar.done()
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
    out = Path(a.write) if a.write else default_results_path(machine["git_commit"])
    write_results(out, machine, {"quick": a.quick, "suites": suites, "clients": bench.clients, "body_size": bench.body_size,
                  "conns": bench.conns, "shared_queue": bench.shared_queue, "sizes": sizes.__dict__,
                  "cluster_node_timeout": bench.node_timeout, "bus_port_shift": BUS_PORT_SHIFT,
                  "fed_port_shift": FED_PORT_SHIFT, "fed_consumers": bench.fed_consumers,
                  "fed_producers": bench.fed_producers, "fed_drain": bench.fed_drain,
                  "server_cpu": SERVER_CPU, "client_cpu": CLIENT_CPU}, bench, report, t0)
    log("raw results: %s (%.0f s)" % (out, time.monotonic() - t0))
    return 0


if __name__ == "__main__":
    sys.exit(main())
