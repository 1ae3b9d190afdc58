"""What the workers' beats cost a node: simulated workers beating at the default interval.

    scripts/bench workers                     100 workers, 5 s interval, 30 s per phase, 2 rounds
    scripts/bench workers --workers 1000      more of them
    scripts/bench workers --quick             5 s per phase, one round

Method
------
One disque-py node pinned to CPU 0 (``taskset``); the simulated workers run in this process,
pinned to CPU 1: ``--workers`` connections, each sending what a real worker's beacon sends
(``WORKER BEAT <id> <interval-ms> <info>``, the info made by ``client/worker/beacon.py`` for a
worker of concurrency 8 running 4 task jobs, about 1 KB of JSON) every ``--interval`` seconds,
their beats spread evenly over the interval. Each round measures the node's CPU (utime + stime,
``/proc/PID/stat``) over ``--duration`` seconds in three phases, in this order:

* ``idle``: the node alone, no client;
* ``connected``: the workers' connections open, silent;
* ``beating``: the same connections beating;
* ``pinging``: the same connections sending ``PING`` instead, on the same schedule: what any
  command arriving alone at that rate costs (waking the node's client loop for it), for
  comparison.

The cost of the beats is ``beating`` less ``connected`` (the connections themselves are there
with or without the beacon: a worker holds its fetch connection anyway), as a share of one
core; ``beating`` less ``pinging`` is what a beat costs beyond any command. At the end of the
beating phase the node's ``WORKER LIST`` must hold every simulated worker. Prints a
Markdown table and saves the raw JSON in bench-results/ (or ``--write FILE``).
"""

from __future__ import annotations

import argparse
import heapq
import json
import os
import random
import socket
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import hiredis

from disque_py.cli import launcher
from disque_py.client.model import Job
from disque_py.client.worker.beacon import Beacon
from disque_py.client.worker.stats import WorkerStats

from .common import CLIENT_CPU, HOST, ROOT, SERVER_CPU, machine_info, proc_cpu_seconds


def _resp(*args: bytes) -> bytes:
    return b"*%d\r\n" % len(args) + b"".join(b"$%d\r\n%s\r\n" % (len(a), a) for a in args)


def _read_line(sock: socket.socket) -> bytes:
    data = b""
    while not data.endswith(b"\r\n"):
        chunk = sock.recv(4096)
        if not chunk:
            raise ConnectionError("the node closed the connection")
        data += chunk
    return data


def _read_reply(sock: socket.socket) -> Any:
    """One whole reply, parsed."""
    reader = hiredis.Reader()
    while True:
        reply = reader.gets()
        if reply is not False:
            return reply
        chunk = sock.recv(65536)
        if not chunk:
            raise ConnectionError("the node closed the connection")
        reader.feed(chunk)


async def _handler(job: Job) -> None:
    """A running task's handler, as the beacon sees it (never run here)."""


def beat_bodies(n: int, interval: float) -> list[tuple[bytes, bytes]]:
    """(worker ID, info) for ``n`` workers, each as a real beacon would say it."""
    stats = WorkerStats(fetched=1200, processed=1180, failed=12, retried=9, dead=3, in_flight=6, running=4,
                        backoffs=0, ack_errors=0, starved=False)  # fmt: skip
    out = []
    now = time.time()
    for i in range(n):
        worker_id = "worker-host-%03d:%d:%06x" % (i % 50, 10_000 + i, i)
        b = Beacon(None, worker_id, interval, queues=["images", "thumbnails", "emails"], concurrency=8,
                   max_in_flight=16, handler="myapp.tasks:app", stats=lambda: stats, stopping=lambda: False,
                   describe=lambda job: "myapp.tasks.resize_image")  # fmt: skip
        b.clock = lambda: now
        running = [b.track(_handler)(Job("images", "D-%08x-%024x-05a1" % (i, k), b"")) for k in range(4)]
        out.append((worker_id.encode(), b.encoded()))
        for coro in running:
            coro.close()
    return out


def _free_port() -> int:
    """A port whose cluster bus port (+10000) is free too."""
    for _ in range(200):
        port = random.randrange(20000, 30000)
        try:
            for p in (port, port + 10000):
                with socket.socket() as s:
                    s.bind((HOST, p))
        except OSError:
            continue
        return port
    raise RuntimeError("no free port")


def node_cpu(pid: int, seconds: float, step=None) -> float:
    """CPU seconds the node used over ``seconds`` of wall time (``step()`` called meanwhile)."""
    start = proc_cpu_seconds(pid)
    end_at = time.monotonic() + seconds
    if step is None:
        time.sleep(seconds)
    else:
        step(end_at)
    return (proc_cpu_seconds(pid) or 0.0) - (start or 0.0)


def run(args: argparse.Namespace) -> dict[str, Any]:
    if hasattr(os, "sched_setaffinity"):
        os.sched_setaffinity(0, {int(CLIENT_CPU)})
    work = Path(tempfile.mkdtemp(prefix="bench-workers-"))
    port = args.port or _free_port()
    argv = launcher.pinned(launcher.node_argv(port, work, "--bind", HOST), SERVER_CPU)
    proc = launcher.spawn(argv, output=work / "node.log")
    results: dict[str, Any] = {"rounds": [], "build": ""}
    try:
        launcher.wait_ready(proc, port, timeout=30, logs=[work / "node.log"])
        with socket.create_connection((HOST, port)) as s:
            s.sendall(_resp(b"INFO", b"server"))
            time.sleep(0.2)
            info = s.recv(65536).decode(errors="replace")
        results["build"] = next((line.split(":", 1)[1].strip() for line in info.splitlines()
                                 if line.startswith("build:")), "?")  # fmt: skip
        bodies = beat_bodies(args.workers, args.interval)
        results["info_bytes"] = statistics.mean(len(b) for _, b in bodies)
        ms = b"%d" % round(args.interval * 1000)
        for r in range(args.rounds):
            idle = node_cpu(proc.pid, args.duration)
            socks = [socket.create_connection((HOST, port)) for _ in bodies]
            try:
                connected = node_cpu(proc.pid, args.duration)
                sent = [0]

                def send(end_at: float, command) -> None:
                    # every worker once per interval, spread over it
                    t0 = time.monotonic()
                    due = [(t0 + i * args.interval / len(bodies), i) for i in range(len(bodies))]
                    heapq.heapify(due)
                    while True:
                        at, i = due[0]
                        if at >= end_at:
                            return
                        wait = at - time.monotonic()
                        if wait > 0:
                            time.sleep(wait)
                        heapq.heapreplace(due, (at + args.interval, i))
                        request, expected = command(i)
                        socks[i].sendall(request)
                        reply = _read_line(socks[i])
                        if reply != expected:
                            raise RuntimeError("%r answered %r" % (request[:40], reply))
                        sent[0] += 1

                def beat(i: int) -> tuple[bytes, bytes]:
                    worker_id, info = bodies[i]
                    return _resp(b"WORKER", b"BEAT", worker_id, ms, info), b"+OK\r\n"

                def ping(i: int) -> tuple[bytes, bytes]:
                    return _resp(b"PING"), b"+PONG\r\n"

                # one interval of beats first, so that every worker is known before the measure
                send(time.monotonic() + args.interval, beat)
                sent[0] = 0
                busy = node_cpu(proc.pid, args.duration, lambda end_at: send(end_at, beat))
                beats = sent[0]
                socks[0].sendall(_resp(b"WORKER", b"LIST"))
                listed = len(_read_reply(socks[0]))
                sent[0] = 0
                pinging = node_cpu(proc.pid, args.duration, lambda end_at: send(end_at, ping))
                pings = sent[0]
            finally:
                for s in socks:
                    s.close()
            row = {"idle_cpu_s": idle, "connected_cpu_s": connected, "beating_cpu_s": busy, "beats": beats,
                   "pinging_cpu_s": pinging, "pings": pings, "listed": listed, "duration_s": args.duration,
                   "cost_pct_of_core": 100.0 * (busy - connected) / args.duration,
                   "cost_us_per_beat": 1e6 * (busy - connected) / beats if beats else None}  # fmt: skip
            results["rounds"].append(row)
            print("round %d: idle %.2f s, connected %.2f s, beating %.2f s, pinging %.2f s of CPU over %.0f s; "
                  "%d beats, %d listed, %d pings" % (r + 1, idle, connected, busy, pinging, args.duration, beats,
                                                     listed, pings), flush=True)  # fmt: skip
    finally:
        launcher.stop(proc)
    return results


def report(args: argparse.Namespace, results: dict[str, Any]) -> str:
    lines = [
        "%d simulated workers beating every %g s (%.0f bytes of info each), the node's CPU over %g s per phase, "
        "build: %s" % (args.workers, args.interval, results["info_bytes"], args.duration, results["build"]),
        "",
        "| round | idle node | %d connections, silent | the same, beating | beats | the beats' cost | per beat "
        "| the same, sending PING instead |" % args.workers,
        "|---|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for i, r in enumerate(results["rounds"], 1):
        pct = lambda s: "%.2f %%" % (100.0 * s / r["duration_s"])  # noqa: E731
        lines.append("| %d | %s | %s | %s | %d | **%.2f %% of a core** | %s | %s |" % (
            i, pct(r["idle_cpu_s"]), pct(r["connected_cpu_s"]), pct(r["beating_cpu_s"]), r["beats"],
            r["cost_pct_of_core"], "%.0f us" % r["cost_us_per_beat"] if r["cost_us_per_beat"] else "-",
            pct(r["pinging_cpu_s"])))  # fmt: skip
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="scripts/bench workers", description=__doc__.split("\n\n")[0])
    parser.add_argument("--workers", type=int, default=100, help="simulated workers (default 100)")
    parser.add_argument("--interval", type=float, default=5.0, help="seconds between a worker's beats (default 5)")
    parser.add_argument("--duration", type=float, default=30.0, help="seconds each phase is measured (default 30)")
    parser.add_argument("--rounds", type=int, default=2, help="rounds of the three phases (default 2)")
    parser.add_argument("--port", type=int, default=None, help="the node's port (default: a free one)")
    parser.add_argument("--quick", action="store_true", help="5 s phases, one round")
    parser.add_argument("--write", type=Path, default=None, help="raw results here (default bench-results/...)")
    args = parser.parse_args(argv)
    if args.quick:
        args.duration, args.rounds = 5.0, 1
    results = run(args)
    text = report(args, results)
    print(text)
    out = args.write or ROOT / "bench-results" / ("workers-%s.json" % time.strftime("%Y%m%d-%H%M%S"))
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({"machine": machine_info(sys.executable), "options": vars(args) | {"write": str(out)},
                               "results": results, "report": text}, indent=2, default=str))  # fmt: skip
    print("raw results: %s" % out)


if __name__ == "__main__":
    main()
