"""What TLS costs a client connection, beside what it costs redis-server in the same run.

    scripts/bench tls                  ADDJOB and GETJOB, -P 1 and -P 32, plain and TLS, ours and redis-server
    scripts/bench tls --quick          small n
    scripts/bench tls --rounds 3       more alternations
    scripts/bench tls --only replication   ADDJOB REPLICATE 3 on 3 nodes, tls-cluster no against yes

Method
------
One disque-py node (``--port P --tls-port P+1``) and one redis-server 7
(``--port P+2 --tls-port P+3``), both pinned to CPU 0, with certificates made
by ``disque_py.cli.certs`` (EC P-256, TLS 1.3, client certificates required on
both). ``redis-benchmark`` runs on CPU 1 with 50 clients, unpipelined and with
-P 32, with and without ``--tls --cacert --cert --key``:

* ours: ``ADDJOB q <100-byte body> 0``, then ``GETJOB NOHANG FROM q`` on the
  jobs just added (the queue is filled first so that every GETJOB gets one);
* redis-server: ``LPUSH q <100-byte body>``, then ``RPOP q``.

Every cell is run ``--rounds`` times (default 2) with plain and TLS in
alternating order (ABBA), and the median is shown; the figure that matters
is TLS/plain of ours beside TLS/plain of redis-server, from the same run.

**Replication** (``replication``): three nodes on CPU 0 joined into a
cluster, with ``cluster-secret`` set, once with ``tls-cluster no`` and once
with ``tls-cluster yes`` (the same certificates), alternating by round;
``redis-benchmark`` with 50 clients sends ``ADDJOB q <100-byte body> 0
REPLICATE 3`` (each reply waits for both copies) to the first node's plain
client port, unpipelined and with -P 32.
Prints a Markdown table and saves the raw JSON in bench-results/.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Any

from disque_py.cli import launcher
from disque_py.cli.certs import make_bundle, write_bundle

from . import progress
from .common import CLIENT_CPU, HOST, SERVER_CPU, machine_info, parse_redis_benchmark

BODY = "x" * 100


def _start(argv: list[str], log: Path, port: int) -> subprocess.Popen:
    proc = launcher.spawn(launcher.pinned(argv, SERVER_CPU), output=log)
    launcher.wait_ready(proc, port, timeout=30, logs=[log])
    return proc


def _bench(port: int, n: int, pipeline: int, tls: dict[str, str] | None, *command: str) -> float:
    argv = ["taskset", "-c", CLIENT_CPU, "redis-benchmark", "-h", HOST, "-p", str(port), "-c", "50",
            "-n", str(n), "-P", str(pipeline), "-q"]  # fmt: skip
    if tls:
        argv += ["--tls", "--cacert", tls["ca"], "--cert", tls["cert"], "--key", tls["key"]]
    argv += list(command)
    out = subprocess.run(argv, capture_output=True, text=True, errors="replace")
    if out.returncode != 0:
        raise SystemExit("redis-benchmark failed: %s\n%s" % (" ".join(argv), out.stderr[-2000:]))
    return parse_redis_benchmark(out.stdout)[0]


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="scripts/bench tls", description=__doc__.split("Method")[0].strip(),
                                formatter_class=argparse.RawDescriptionHelpFormatter)  # fmt: skip
    p.add_argument("--quick", action="store_true", help="n = 20,000 (default 200,000 for -P 32, 50,000 for -P 1)")
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--base-port", type=int, default=17811)
    p.add_argument("--write", metavar="FILE", default=None)
    p.add_argument("--only", default="clients,replication", help="a subset of: clients, replication")
    args = p.parse_args(argv)
    work = Path(tempfile.mkdtemp(prefix="disque-bench-tls-"))
    certs = work / "tls"
    write_bundle(certs, make_bundle(dns=["localhost"], ips=["127.0.0.1"]))
    tls = {"ca": str(certs / "ca.crt"), "cert": str(certs / "client.crt"), "key": str(certs / "client.key")}
    base = args.base_port
    ours = (base, base + 1)
    redis = (base + 2, base + 3)
    files = ["--tls-cert-file", str(certs / "node.crt"), "--tls-key-file", str(certs / "node.key"),
             "--tls-ca-cert-file", str(certs / "ca.crt")]  # fmt: skip
    (work / "ours").mkdir()
    results: list[dict[str, Any]] = []
    only = set(args.only.split(","))
    # one step per timed run: clients 2 pipelines x 2 servers x 2 commands, replication 2 pipelines; x rounds x 2 modes
    steps = 2 * args.rounds * ((8 if "clients" in only else 0) + (2 if "replication" in only else 0))
    with progress.bar(steps, "scripts/bench tls") as bar:
        if "replication" in only:
            results += replication(work, files, base, args, bar)
        if "clients" in only:
            clients(work, files, ours, redis, tls, args, results, bar)
    if "clients" not in only:
        _report_replication(results)
        _save(results, args)
        return 0
    print()
    print("| command | -P | disque-py plain | disque-py TLS | TLS/plain | redis-server plain | redis-server TLS | TLS/plain |")
    print("|---|---|---|---|---|---|---|---|")
    for pipeline in (1, 32):
        for what in ("add", "get"):
            o = next(r for r in results if r["server"] == "disque-py" and r["op"] == what and r["pipeline"] == pipeline)
            rd = next(r for r in results if r["server"] == "redis-server" and r["op"] == what and r["pipeline"] == pipeline)
            print("| %s / %s | %d | %.0f | %.0f | %.2f | %.0f | %.0f | %.2f |"
                  % (o["command"], rd["command"], pipeline, o["plain"], o["tls"], o["ratio"], rd["plain"], rd["tls"],
                     rd["ratio"]))  # fmt: skip
    _report_replication(results)
    _save(results, args)
    return 0


def clients(work: Path, files: list[str], ours: tuple[int, int], redis: tuple[int, int], tls: dict[str, str],
            args: argparse.Namespace, results: list[dict[str, Any]], bar: progress.Bar) -> None:
    """ADDJOB/GETJOB against LPUSH/RPOP, plain against TLS (module docstring); rows appended to ``results``."""
    procs = [
        _start(launcher.node_argv(ours[0], work / "ours", "--tls-port", str(ours[1]), "--bind", HOST, *files),
               work / "ours.log", ours[0]),
        _start(["redis-server", "--port", str(redis[0]), "--tls-port", str(redis[1]), "--bind", HOST, "--save", "",
                "--appendonly", "no", "--dir", str(work), *files], work / "redis.log", redis[0]),
    ]  # fmt: skip
    try:
        for pipeline in (1, 32):
            n = 20000 if args.quick else (50000 if pipeline == 1 else 200000)
            for server, (plain_port, tls_port), add, get in (
                ("disque-py", ours, ("ADDJOB", "q", BODY, "0"), ("GETJOB", "NOHANG", "FROM", "q")),
                ("redis-server", redis, ("LPUSH", "q", BODY), ("RPOP", "q")),
            ):
                for what, command in (("add", add), ("get", get)):
                    runs: dict[str, list[float]] = {"plain": [], "tls": []}
                    for r in range(args.rounds):
                        order = ("plain", "tls") if r % 2 == 0 else ("tls", "plain")
                        for mode in order:
                            # every run starts empty (jobs left by the ADDJOB runs would reach maxmemory)
                            launcher.call(plain_port, *(("DEBUG", "FLUSHALL") if server == "disque-py" else ("FLUSHALL",)))
                            if what == "get":  # something to take: fill first (not timed)
                                _bench(plain_port, n + 50 * pipeline, 32, None, *add)
                            port = plain_port if mode == "plain" else tls_port
                            bar.doing("%s %s -P %d %s" % (server, what, pipeline, mode))
                            runs[mode].append(_bench(port, n, pipeline, tls if mode == "tls" else None, *command))
                            bar.done()
                    row = {"server": server, "op": what, "command": command[0], "pipeline": pipeline, "n": n,
                           "plain": statistics.median(runs["plain"]), "tls": statistics.median(runs["tls"]),
                           "runs": runs}  # fmt: skip
                    row["ratio"] = row["tls"] / row["plain"]
                    results.append(row)
                    progress.echo("%-12s %-6s -P %-2d plain %9.0f/s  TLS %9.0f/s  TLS/plain %.2f"
                                  % (server, command[0], pipeline, row["plain"], row["tls"], row["ratio"]),
                                  err=False)  # fmt: skip
    finally:
        for proc in procs:
            launcher.stop(proc, timeout=10)


def _save(results: list[dict[str, Any]], args: argparse.Namespace) -> None:
    out = Path(args.write) if args.write else Path("bench-results") / ("tls-%s.json" % time.strftime("%Y%m%d-%H%M%S"))
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({"machine": machine_info(launcher.server_command()[0]), "results": results}, indent=2))
    print("\nraw results: %s" % out)


def replication(work: Path, files: list[str], base: int, args: argparse.Namespace,
                bar: progress.Bar | None = None) -> list[dict[str, Any]]:
    """ADDJOB REPLICATE 3 on a 3-node cluster, tls-cluster no against yes (module docstring)."""
    rows = []
    for pipeline in (1, 32):
        n = 10000 if args.quick else (30000 if pipeline == 1 else 100000)
        runs: dict[str, list[float]] = {"plain": [], "tls": []}
        for r in range(args.rounds):
            for mode in (("plain", "tls") if r % 2 == 0 else ("tls", "plain")):
                ports = [base + 10 + i for i in range(3)]
                procs = []
                try:
                    for i, port in enumerate(ports):
                        d = work / ("repl-%s-%d-%d-%d" % (mode, pipeline, r, i))
                        d.mkdir()
                        extra = ["--bind", HOST, "--cluster-secret", "bench-secret", *files,
                                 "--tls-cluster", "yes" if mode == "tls" else "no"]  # fmt: skip
                        procs.append(_start(launcher.node_argv(port, d, *extra), d / "node.log", port))
                    launcher.join([(HOST, p) for p in ports], timeout=60)
                    if bar is not None:
                        bar.doing("replication -P %d %s" % (pipeline, mode))
                    runs[mode].append(_bench(ports[0], n, pipeline, None, "ADDJOB", "q", BODY, "0", "REPLICATE", "3"))
                finally:
                    for proc in procs:
                        launcher.stop(proc, timeout=10)
                if bar is not None:
                    bar.done()
        row = {"server": "disque-py", "op": "replication", "command": "ADDJOB REPLICATE 3", "pipeline": pipeline,
               "n": n, "plain": statistics.median(runs["plain"]), "tls": statistics.median(runs["tls"]), "runs": runs}
        row["ratio"] = row["tls"] / row["plain"]
        rows.append(row)
        progress.echo("replication  -P %-2d tls-cluster no %8.0f/s  yes %8.0f/s  yes/no %.2f"
                      % (pipeline, row["plain"], row["tls"], row["ratio"]), err=False)  # fmt: skip
    return rows


def _report_replication(results: list[dict[str, Any]]) -> None:
    rows = [r for r in results if r["op"] == "replication"]
    if not rows:
        return
    print()
    print("| ADDJOB REPLICATE 3, 3 nodes | -P | tls-cluster no | tls-cluster yes | yes/no |")
    print("|---|---|---|---|---|")
    for r in rows:
        print("| jobs/s | %d | %.0f | %.0f | %.2f |" % (r["pipeline"], r["plain"], r["tls"], r["ratio"]))


if __name__ == "__main__":
    raise SystemExit(main())
