"""The tail: how long each slice of a node's periodic work holds the loop, and the same-node delivery
latency it shows through (issue 59).

    scripts/bench tail                                  the four scenarios below, 10 s of load each
    scripts/bench tail --disque-server PATH             and Disque 1.0-rc1's delivery at 500 and 5,000 jobs/s
    scripts/bench tail --only 500,clients --duration 5  a subset, shorter

Method
------
Each scenario is one run of the federation suite's same-node delivery (``FederationSuite.fed_run``,
``same_node=True``, REPLICATE 1): three fresh nodes joined, node A on the server CPU, B on the client
CPU, C where there is room; 10 consumer connections blocked in ``GETJOB`` on A and an open-loop
producer on A (4 connections, pipelined ADDJOB at a fixed rate; the body is the send time); the
delivery latency of every job sent after a 1 s warm-up, p50/p99. Node A runs as
``python -m benchmarks.tail_node`` (``tail_node.py``): the node unchanged, its periodic work wrapped
in timers before it starts, so that each slice's duration is recorded (the core's tick, each
periodic step, inside the cron the client checks, the memory measure and the full GC, and every
collection of CPython's collector). The recording starts when the load client starts and stops
when it has finished (SIGUSR1 each time). The scenarios:

* ``500``: 500 jobs/s, nothing else (issue 49's "same-node delivery p99 at 500 jobs/s");
* ``5000``: 5,000 jobs/s;
* ``clients``: 500 jobs/s with 8,000 idle clients connected to A (each sent one PING) and
  ``timeout 3600`` on A, so that the client checks walk every client;
* ``timers``: 500 jobs/s while 50,000 timers come due at once: before the load, 50,000 jobs are
  added to another queue of A (``RETRY 3``, REPLICATE 1) and taken in one ``GETJOB COUNT 50000``,
  so that their requeues fall due together 3 s later, inside the measured window.

With ``--disque-server`` the ``500`` and ``5000`` runs are repeated on three Disque 1.0-rc1 nodes,
right after ours, so that both see the same machine load. The load average is read before each
run. Prints Markdown tables and saves the raw JSON in bench-results/ (or ``--write FILE``).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import resource
import signal
import socket
import sys
import time
from pathlib import Path
from typing import Any, Iterator

from disque_py.cli import launcher

from .common import HOST, SERVER_CPU, BenchBase, BenchError, Server, Sizes, SyncClient, log, machine_info, save_raw
from .federation import FederationSuite

SCENARIOS = ("500", "5000", "clients", "timers")
RATES = {"500": 500.0, "5000": 5000.0, "clients": 500.0, "timers": 500.0}
IDLE_CLIENTS = 8000
BURST_JOBS = 50_000
BURST_RETRY_S = 3


class TailBench(FederationSuite, BenchBase):
    """The federation suite with node A timed (``tail_node``) while ``timed_a`` is set."""

    timed_a = False
    slices_out: Path | None = None

    def disque_argv(self, port: int, workdir: Path, cpu: str = SERVER_CPU) -> list[str]:
        argv = super().disque_argv(port, workdir, cpu)
        if not self.timed_a or port != self.fed_port(0):
            return argv
        rest = argv[argv.index("server") + 1:]
        return launcher.pinned([self.python, "-m", "benchmarks.tail_node", *rest], cpu)

    @contextlib.contextmanager
    def recording(self, a: Server) -> Iterator[None]:
        """Node A's slices from now until the block ends, into ``self.last_slices``."""
        assert self.slices_out is not None and a.proc is not None
        self.last_slices: dict[str, Any] = {}
        a.proc.send_signal(signal.SIGUSR1)  # what the start and the setup made: dropped
        yield
        if self.slices_out.exists():
            self.slices_out.unlink()
        a.proc.send_signal(signal.SIGUSR1)
        deadline = time.monotonic() + 10.0
        while not self.slices_out.exists():
            if time.monotonic() > deadline:
                raise BenchError("node A wrote no slice times within 10 s")
            time.sleep(0.05)
        self.last_slices = json.loads(self.slices_out.read_text())


@contextlib.contextmanager
def idle_clients(a: Server, count: int) -> Iterator[None]:
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft != resource.RLIM_INFINITY and soft < count + 256:  # this process holds them all
        want = count + 256 if hard == resource.RLIM_INFINITY else min(hard, count + 256)
        resource.setrlimit(resource.RLIMIT_NOFILE, (want, hard))
        if want < count + 256:
            raise BenchError("%d idle clients need %d descriptors; the hard limit is %d" % (count, count + 256, hard))
    with SyncClient(a.port) as c:
        c.call("CONFIG", "SET", "timeout", "3600")
    socks = []
    try:
        for _ in range(count):
            s = socket.create_connection((HOST, a.port))
            s.sendall(b"*1\r\n$4\r\nPING\r\n")
            socks.append(s)
        with SyncClient(a.port) as c:
            deadline = time.monotonic() + 60.0
            while int(c.info("clients")["connected_clients"]) < count:
                if time.monotonic() > deadline:
                    raise BenchError("node A does not show %d clients after 60 s" % count)
                time.sleep(0.05)
        yield
    finally:
        for s in socks:
            s.close()


def due_together(a: Server, jobs: int, retry_s: int) -> None:
    """``jobs`` jobs on A taken in one GETJOB: their requeues are due together ``retry_s`` later."""
    with SyncClient(a.port, timeout=120.0) as c:
        for start in range(0, jobs, 5000):
            n = min(5000, jobs - start)
            replies = c.pipeline([("ADDJOB", "tail-burst", "b", 0, "REPLICATE", 1, "RETRY", retry_s)] * n)
            bad = [r for r in replies if isinstance(r, Exception)]
            if bad:
                raise BenchError("ADDJOB on A: %s" % bad[0])
        got = c.call("GETJOB", "NOHANG", "COUNT", jobs, "FROM", "tail-burst")
        if len(got or ()) != jobs:
            raise BenchError("GETJOB COUNT %d took %d jobs" % (jobs, len(got or ())))


def run_scenario(bench: TailBench, name: str, duration: float, kind: str = "disque-py") -> dict[str, Any]:
    load = os.getloadavg()
    bench.timed_a = kind == "disque-py"

    @contextlib.contextmanager
    def around(nodes: list[Server]) -> Iterator[None]:
        a = nodes[0]
        with contextlib.ExitStack() as stack:
            if kind == "disque-py" and name == "clients":
                stack.enter_context(idle_clients(a, IDLE_CLIENTS))
            if kind == "disque-py" and name == "timers":
                due_together(a, BURST_JOBS, BURST_RETRY_S)
            if bench.timed_a:
                stack.enter_context(bench.recording(a))
            yield

    r = bench.fed_run(RATES[name], 1, duration, same_node=True, kind=kind, around=around)
    out = {k: r.get(k) for k in ("rate", "achieved_per_s", "p50_ms", "p90_ms", "p99_ms", "p999_ms", "max_ms",
                                 "missing", "duplicates", "node_cpu_pct", "other_cpu_pct")}  # fmt: skip
    out["loadavg"] = [round(x, 2) for x in load]
    if bench.timed_a:
        out["slices"] = bench.last_slices
    return out


def slice_table(results: dict[str, dict[str, Any]]) -> list[str]:
    lines = ["| scenario | slice | n | p50 µs | p99 µs | max µs | over 100 µs | total ms |",
             "|---|---|---:|---:|---:|---:|---:|---:|"]  # fmt: skip
    for name, r in results.items():
        if "slices" not in r:
            continue
        for kind, s in sorted(r["slices"].items()):
            lines.append("| %s | %s | %d | %.1f | %.1f | %.1f | %d | %.1f |" % (
                name, kind, s["n"], s["p50"], s["p99"], s["max"], s["over_line"], s["total_ms"]))
    return lines


def delivery_table(results: dict[str, dict[str, Any]]) -> list[str]:
    lines = ["| scenario | server | jobs/s | p50 ms | p99 ms | p99.9 ms | max ms | node A CPU % | load avg (1 min) |",
             "|---|---|---:|---:|---:|---:|---:|---:|---:|"]  # fmt: skip
    for key, r in results.items():
        name, _, server = key.partition("/")
        lines.append("| %s | %s | %s | %s | %s | %s | %s | %s | %.2f |" % (
            name, server or "disque-py", "{:,.0f}".format(r["achieved_per_s"]), r["p50_ms"], r["p99_ms"],
            r["p999_ms"], r["max_ms"], (r.get("node_cpu_pct") or {}).get("A"), r["loadavg"][0]))
    return lines


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="scripts/bench tail", description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)  # fmt: skip
    p.add_argument("--only", default=",".join(SCENARIOS), help="scenarios, comma-separated: %s" % ",".join(SCENARIOS))
    p.add_argument("--duration", type=float, default=10.0, help="seconds of load after the 1 s warm-up (10)")
    p.add_argument("--disque-server", help="a Disque 1.0-rc1 disque-server: its delivery at 500 and 5,000 jobs/s")
    p.add_argument("--base-port", type=int, default=18300, help="the nodes listen on base + 200, 201, 202")
    p.add_argument("--write", type=Path, help="raw JSON here (default bench-results/tail-DATE.json)")
    args = p.parse_args(argv)
    names = [n for n in args.only.split(",") if n]
    bad = [n for n in names if n not in SCENARIOS]
    if bad:
        p.error("unknown scenario %s (choose from %s)" % (", ".join(bad), ", ".join(SCENARIOS)))
    bench = TailBench(sizes=Sizes(), base_port=args.base_port, disque_server=args.disque_server)
    bench.slices_out = bench.tmp / "slices.json"
    os.environ["TAIL_SLICES_OUT"] = str(bench.slices_out)
    results: dict[str, dict[str, Any]] = {}
    try:
        for name in names:
            log("tail: %s" % name)
            results[name] = run_scenario(bench, name, args.duration)
            if args.disque_server and name in ("500", "5000"):
                results[name + "/disque"] = run_scenario(bench, name, args.duration, kind="disque")
    finally:
        bench.stop_all()
    report = "\n".join(["Slices of node A's periodic work (µs):", "", *slice_table(results), "",
                        "Same-node delivery:", "", *delivery_table(results)])  # fmt: skip
    print(report)
    save_raw("tail", args, {"scenarios": results, "notes": bench.notes, "commands": bench.commands}, report,
             machine_info(sys.executable))
    return 0


if __name__ == "__main__":
    sys.exit(main())
