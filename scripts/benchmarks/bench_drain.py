"""How long draining a node takes: ``disque-py drain`` of a node holding N queued jobs.

    scripts/bench drain                     100,000 jobs (REPLICATE 2 and 1 alternately), 3 nodes
    scripts/bench drain --jobs 10000        fewer

Method
------
Three disque-py nodes (each a process of its own, in memory), joined. N jobs are added to the
node to drain with pipelined ``ADDJOB ... REPLICATE 2`` (half) and ``REPLICATE 1`` (the other
half: their only copy is there, so the drain gives them a new holder), ``RETRY 300`` so that
none is queued again during the run. Then ``disque-py drain HOST:PORT --json`` runs as an
operator runs it (its own process), and the time from its start to its exit 0 (the node holds
no job) is the figure, with jobs moved per second. Afterwards every job must be queued on the
other two nodes: QLEN summed must be N, the drained node's ``registered_jobs`` 0.
"""

from __future__ import annotations

import argparse
import json
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import redis

from disque_py.cli import launcher

from .common import HOST, machine_info

QUEUE = "drain-bench"


def _free_port() -> int:
    for port in range(19411, 22700, 7):
        if all(_bindable(p) for p in (port, port + 10000)):
            return port
    raise RuntimeError("no free port")


def _bindable(port: int) -> bool:
    with socket.socket() as s:
        try:
            s.bind((HOST, port))
        except OSError:
            return False
    return True


def run(args: argparse.Namespace) -> dict[str, Any]:
    work = Path(tempfile.mkdtemp(prefix="bench-drain-"))
    base = args.port or _free_port()
    ports = [base, base + 1, base + 2]
    procs = []
    try:
        for port in ports:
            d = work / str(port)
            d.mkdir()
            procs.append(launcher.spawn(launcher.node_argv(port, d, "--bind", HOST), output=d / "node.log"))
        for proc, port in zip(procs, ports):
            launcher.wait_ready(proc, port, timeout=30, logs=[work / str(port) / "node.log"])
        launcher.join([(HOST, p) for p in ports], timeout=30)
        r = redis.Redis(HOST, ports[1])
        t0 = time.monotonic()
        for start in range(0, args.jobs, 1000):
            pipe = r.pipeline(transaction=False)
            for i in range(start, min(start + 1000, args.jobs)):
                pipe.execute_command("ADDJOB", QUEUE, "job-%d" % i, 0, "REPLICATE", 2 if i % 2 else 1, "RETRY", 300)
            pipe.execute()
        added = time.monotonic() - t0
        print("added %d jobs to %s:%d in %.1f s" % (args.jobs, HOST, ports[1], added), file=sys.stderr)
        started = time.monotonic()
        out = subprocess.run([sys.executable, "-m", "disque_py.cli", "drain", "%s:%d" % (HOST, ports[1]), "--json",
                              "--no-progress", "--max-time", str(args.max_time)],
                             capture_output=True, text=True, timeout=args.max_time + 60)  # fmt: skip
        seconds = time.monotonic() - started
        if out.returncode != 0:
            raise RuntimeError("drain exited %d: %s %s" % (out.returncode, out.stdout[-2000:], out.stderr[-2000:]))
        queued = sum(redis.Redis(HOST, p).execute_command("QLEN", QUEUE) for p in (ports[0], ports[2]))
        left = redis.Redis(HOST, ports[1]).info()["registered_jobs"]
        if queued != args.jobs or left != 0:
            raise RuntimeError("after the drain: %d queued elsewhere (of %d), %d left on the node" % (queued, args.jobs,
                                                                                                     left))
        return {"jobs": args.jobs, "seconds": round(seconds, 2), "jobs_per_s": round(args.jobs / seconds),
                "drain": json.loads(out.stdout), "machine": machine_info(sys.executable),
                "command": "scripts/bench drain --jobs %d" % args.jobs}  # fmt: skip
    finally:
        for proc in procs:
            launcher.stop(proc)


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(prog="scripts/bench drain", description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)  # fmt: skip
    p.add_argument("--jobs", type=int, default=100_000, help="jobs on the node drained (default 100000)")
    p.add_argument("--port", type=int, default=0, help="first node's port (default: a free one below 22700)")
    p.add_argument("--max-time", type=float, default=900.0, help="the drain's --max-time (default 900)")
    args = p.parse_args(argv)
    result = run(args)
    print("| jobs | drain (s) | jobs/s |\n|---:|---:|---:|\n| %s | %.1f | %s |"
          % (f"{result['jobs']:,}", result["seconds"], f"{result['jobs_per_s']:,}"))
    print(json.dumps(result["drain"]))


if __name__ == "__main__":
    main()
