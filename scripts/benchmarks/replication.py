"""The ``replication`` suite: ADDJOB REPLICATE 3 and the add->get->ack cycle on three nodes
sharing CPU 0, on disque-py and, with ``--disque-server``, Disque 1.0-rc1 (see the Method notes of
:mod:`benchmarks.bench`, "Replication").
"""

from __future__ import annotations

import re
import shlex
import subprocess
import time
from typing import Any

from .common import (
    BenchBase,
    BenchError,
    CLIENT_CPU,
    HOST,
    REFERENCE,
    SERVER_CPU,
    Server,
    SyncClient,
    _meets,
    _ms,
    _rate,
    _reference_cell,
    log,
)


class ReplicationSuite(BenchBase):
    """The replication suite: three nodes on one core, REPLICATE 3."""

    def redis_benchmark_latency(self, nodes: list[Server], n: int, *command: str,
                                keyspace: int = 0) -> dict[str, Any]:  # fmt: skip
        """redis-benchmark (not -q: its summary has p99) against nodes[0], CPU of every node
        (``keyspace``: ``-r``, what ``__rand_int__`` in the command is drawn from)."""
        rand = ["-r", str(keyspace)] if keyspace else []
        argv = ["taskset", "-c", CLIENT_CPU, "redis-benchmark", "-h", HOST, "-p", str(nodes[0].port),
                "-c", str(self.clients), "-n", str(n), *rand, *command]  # fmt: skip
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
            if kind == "disque-py":
                # The same with a DEDUP key per job, on the same nodes right after (core/dedup.py;
                # Disque has no DEDUP): keys drawn from 10^8, so nearly each ADDJOB adds a job.
                d = self.redis_benchmark_latency(nodes, n, "ADDJOB", "dq", self.body, "0", "REPLICATE", "3",
                                                 "DEDUP", "key:__rand_int__", keyspace=10**8)  # fmt: skip
                d["ratio_to_plain"] = round(d["requests_per_s"] / r["requests_per_s"], 3)
                self.results["repl_addjob_dedup"] = d
                log("replication: DEDUP %s ADDJOB/s (%.2fx without), p50 %s, p99 %s" % (
                    _rate(d["requests_per_s"]), d["ratio_to_plain"], _ms(d["p50_ms"]), _ms(d["p99_ms"])))  # fmt: skip
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


def replication_report(bench: BenchBase) -> list[str]:
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
    dd = res.get("repl_addjob_dedup")
    if dd:
        met = "yes" if dd["ratio_to_plain"] >= 0.8 else "**NO**"
        out.append("| ADDJOB REPLICATE 3 DEDUP key, %d clients, n=%s | %s (%.2fx without) | %s / %s | %s | – | >= 0.8x without | %s |" % (
            dd["clients"], "{:,}".format(dd["n"]), _rate(dd["requests_per_s"]), dd["ratio_to_plain"],
            _ms(dd["p50_ms"]), _ms(dd["p99_ms"]), cpus(dd), met))  # fmt: skip
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
