"""Groups and limits: what fair turns cost a cycle, how close a limited group runs to its limit, and
what plain jobs do beside a limited group's backlog (issue 57).

    scripts/bench groups                      everything, full size (about 5 minutes)
    scripts/bench groups --only cycles        a subset of: cycles, concurrency, rate
    scripts/bench groups --quick              smoke run (about a minute)

Method
------
Real node processes pinned to CPU 0 (three nodes of a cluster all on CPU 0, as the replication
suite), the load in processes of its own pinned to CPU 1: the cycle client of ``scripts/bench``
(scripts/benchmarks/cycle_client.py), which also consumes a queue filled beforehand (``--consume``).

* ``cycles``: add -> get -> ack cycles/s of ``--conns`` connections, three ways, alternated
  ``--rounds`` times: ``plain`` (no GROUP: today's cycle) and ``groups`` (connection i adds with
  ``GROUP g<i % 10>``: ten groups without limits take turns) on one node, ``beside`` (plain jobs
  again) on a second node where ``--backlog`` jobs of a group with ``GROUP LIMIT held CONCURRENCY
  1`` were queued in the same queue(s) and one of them taken and held: the group stays at its
  limit, its jobs wait in the queue(s) the plain jobs go through. Both nodes on CPU 0, started
  together, each warmed up by a short run. Both queue layouts: ``shared`` (one queue for all the
  connections: the groups' jobs meet in it) and ``per-connection`` (a queue each; the backlog spread
  over them). The ratios are each round's own, their median reported, beside the node's CPU per
  cycle (utime + stime over cycles), which a machine shared with other work disturbs less.
* ``concurrency`` (1 node, 3 nodes): ``GROUP LIMIT lim CONCURRENCY n``, the group's jobs queued
  beforehand on every node (REPLICATE 1), ``2n`` consumers on every node each holding a job
  ``--hold-ms`` before its ACKJOB, for ``--limit-duration`` seconds: deliveries/s against the
  ideal ``n / hold``.
* ``rate`` (1 node, 3 nodes): ``GROUP LIMIT rl RATE r``, the jobs queued beforehand on every node,
  consumers that acknowledge at once: deliveries/s over ``--rate-duration`` seconds against ``r``,
  in all (the burst of one second's worth at the start included) and without the first two seconds.

Prints a Markdown table and saves the raw JSON (every figure's command with it) in bench-results/
(or ``--write FILE``).
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from .common import (
    CLIENT_CPU, HOST, MODULE, ROOT, BenchBase, BenchError, Server, Sizes, SyncClient, _on_sigterm, helper_env, log,
    machine_info, save_raw,
)  # fmt: skip

SUITES = ("cycles", "concurrency", "rate")
HELD = "held"  # the group at its limit in ``beside``


def _fill(node: Server, queue: str, group: str, count: int, replicate: bool, batch: int = 1000) -> None:
    """``count`` jobs of ``group`` queued in ``queue`` on ``node`` (RETRY 3600: never queued again here)."""
    extra = ("REPLICATE", "1") if replicate else ()
    with SyncClient(node.port) as c:
        left = count
        while left:
            n = min(batch, left)
            for reply in c.pipeline([("ADDJOB", queue, "x" * 100, "0", "GROUP", group, "RETRY", "3600", *extra)] * n):
                if isinstance(reply, Exception):
                    raise BenchError("ADDJOB: %s" % reply)
            left -= n


def _group_info(node: Server, group: str) -> dict[str, Any]:
    with SyncClient(node.port) as c:
        reply = c.call("GROUP", "INFO", group)
    if isinstance(reply, dict):
        return {k.decode() if isinstance(k, bytes) else k: v for k, v in reply.items()}
    it = iter(reply)
    return {k.decode(): v for k, v in zip(it, it)}


def _limit_everywhere(nodes: list[Server], group: str, kind: str, value: str, timeout: float = 20.0) -> None:
    """GROUP LIMIT on the first node, then wait until every node knows it (and may deliver)."""
    with SyncClient(nodes[0].port) as c:
        c.call("GROUP", "LIMIT", group, kind, value)
    key = "concurrency" if kind == "CONCURRENCY" else "rate"
    deadline = time.monotonic() + timeout
    while True:
        if all(_group_info(n, group).get(key) is not None for n in nodes):
            return
        if time.monotonic() > deadline:
            raise BenchError("GROUP LIMIT %s %s %s did not reach every node in %.0f s" % (group, kind, value, timeout))
        time.sleep(0.1)


class GroupsBench(BenchBase):
    def consumers(self, nodes: list[Server], queue: str, conns: int, hold_ms: float, duration: float) -> dict[str, Any]:
        """One consumer process per node (``--consume``), all at once; their deliveries summed."""
        procs = []
        for node in nodes:
            argv = ["taskset", "-c", CLIENT_CPU, self.python, "-m", MODULE, "client", "--port", str(node.port),
                    "--consume", queue, "--conns", str(conns), "--hold-ms", str(hold_ms), "--duration", str(duration)]  # fmt: skip
            self.record(argv)
            procs.append(subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                          cwd=str(ROOT), env=helper_env()))  # fmt: skip
        outs = []
        for proc in procs:
            out, err = proc.communicate(timeout=duration + 60)
            if proc.returncode != 0:
                raise BenchError("consumer failed (%d): %s" % (proc.returncode, err.strip()[-2000:]))
            outs.append(json.loads(out.strip().splitlines()[-1]))
        per_second = [sum(col) for col in zip(*(o["per_second"] for o in outs))]
        total = sum(o["deliveries"] for o in outs)
        steady = per_second[2:] or per_second
        return {"deliveries": total, "deliveries_per_s": round(total / duration, 1), "per_second": per_second,
                "steady_per_s": round(sum(steady) / len(steady), 1), "by_node": [o["deliveries"] for o in outs],
                "client_cpu_pct": [o["client_cpu_pct"] for o in outs]}  # fmt: skip

    def nodes(self, count: int, label: str) -> list[Server]:
        return [self.start("disque-py")] if count == 1 else self.start_fed_cluster(label)

    def drop(self, nodes: list[Server]) -> None:
        for node in nodes:
            self.stop(node)

    def start_at(self, port: int, label: str) -> Server:
        """A fresh disque-py node on ``port`` (as ``start``, which takes the base port)."""
        workdir = Path(tempfile.mkdtemp(prefix="%s-" % label, dir=self.tmp))
        argv = self.disque_argv(port, workdir)
        self.record(argv)
        server = Server("disque-py", argv, port, workdir)
        self.servers.append(server)
        return server.start()

    def hold_backlog(self, node: Server, queues: list[str], backlog: int) -> tuple[SyncClient, dict[str, Any]]:
        """``backlog`` jobs of the group ``HELD`` (CONCURRENCY 1) spread over ``queues``, and a client that took
        one of them and keeps it: the group stays at its limit, the rest waits in the queues."""
        with SyncClient(node.port) as c:
            c.call("GROUP", "LIMIT", HELD, "CONCURRENCY", "1")
        for i, queue in enumerate(queues):
            _fill(node, queue, HELD, backlog // len(queues) + (i < backlog % len(queues)), replicate=False)
        holder = SyncClient(node.port)
        taken = holder.call("GETJOB", "NOHANG", "FROM", queues[0])
        info = _group_info(node, HELD)
        if not taken or info.get("held") != 1:
            raise BenchError("the group %r is not at its limit: %r" % (HELD, info))
        return holder, info

    def bench_cycles(self, args: argparse.Namespace) -> None:
        """Two nodes side by side on the server CPU: ``today`` (plain and grouped cycles) and ``beside`` (the
        held group's backlog in the queues the cycles use); the three runs alternate, ``--rounds`` times."""
        rows = self.results.setdefault("cycles", {})
        for layout in args.layouts:
            self.shared_queue = layout == "shared"
            queues = ["bench-q"] if self.shared_queue else ["bench-%d" % i for i in range(self.conns)]
            today = self.start_at(self.base_port, "today")
            beside_node = self.start_at(self.base_port + 1, "beside")
            try:
                with SyncClient(today.port) as c:
                    self.results["build"] = c.info("server").get("build", "?")
                for node in (today, beside_node):
                    self.run_client(node, "disque", duration=args.warmup)  # a node's first runs are slower
                holder, info = self.hold_backlog(beside_node, queues, args.backlog)
                rounds = rows.setdefault(layout, [])
                for r in range(args.rounds):
                    log("cycles, %s queue(s), round %d/%d" % (layout, r + 1, args.rounds))
                    first = len(self.commands)
                    plain = self.run_client(today, "disque")
                    grouped = self.run_client(today, "disque", "--groups", "10")
                    beside = self.run_client(beside_node, "disque")
                    rounds.append({
                        "plain": plain, "groups": grouped, "beside": beside, "commands": self.commands[first:],
                        "groups_ratio": round(grouped["cycles_per_s"] / plain["cycles_per_s"], 3),
                        "beside_ratio": round(beside["cycles_per_s"] / plain["cycles_per_s"], 3),
                        "cpu_us": {k: _cpu_us(v) for k, v in (("plain", plain), ("groups", grouped), ("beside", beside))},
                    })  # fmt: skip
                rounds[-1]["backlog"] = info.get("waiting")
                rounds[-1]["backlog_after"] = _group_info(beside_node, HELD).get("waiting")
                holder.close()
            finally:
                self.drop([today, beside_node])

    def bench_concurrency(self, args: argparse.Namespace) -> None:
        rows = self.results.setdefault("concurrency", [])
        ideal = args.concurrency * 1000.0 / args.hold_ms
        for count in args.node_counts:
            log("concurrency %d, hold %g ms, %d node(s)" % (args.concurrency, args.hold_ms, count))
            nodes = self.nodes(count, "conc")
            try:
                first = len(self.commands)
                _limit_everywhere(nodes, "lim", "CONCURRENCY", str(args.concurrency))
                per_node = int(ideal * args.limit_duration * 1.3 / count) + 2 * args.concurrency
                for node in nodes:
                    _fill(node, "limited", "lim", per_node, replicate=count > 1)
                got = self.consumers(nodes, "limited", 2 * args.concurrency, args.hold_ms, args.limit_duration)
            finally:
                self.drop(nodes)
            rows.append(dict(got, nodes=count, concurrency=args.concurrency, hold_ms=args.hold_ms, ideal_per_s=ideal,
                             queued_per_node=per_node, commands=self.commands[first:],
                             of_ideal=round(got["deliveries_per_s"] / ideal, 3),
                             steady_of_ideal=round(got["steady_per_s"] / ideal, 3)))  # fmt: skip

    def bench_rate(self, args: argparse.Namespace) -> None:
        rows = self.results.setdefault("rate", [])
        for count in args.node_counts:
            log("rate %g/s, %d node(s), %g s" % (args.rate, count, args.rate_duration))
            nodes = self.nodes(count, "rate")
            try:
                first = len(self.commands)
                _limit_everywhere(nodes, "rl", "RATE", "%g" % args.rate)
                per_node = int(args.rate * (args.rate_duration * 1.3 + 2) / count)
                for node in nodes:
                    _fill(node, "rated", "rl", per_node, replicate=count > 1)
                got = self.consumers(nodes, "rated", 10, 0, args.rate_duration)
            finally:
                self.drop(nodes)
            rows.append(dict(got, nodes=count, rate=args.rate, duration_s=args.rate_duration, queued_per_node=per_node,
                             commands=self.commands[first:], of_rate=round(got["deliveries_per_s"] / args.rate, 3),
                             steady_of_rate=round(got["steady_per_s"] / args.rate, 3)))  # fmt: skip


def _cpu_us(run: dict[str, Any]) -> float | None:
    """The node's CPU per cycle (us): steadier than cycles/s on a machine shared with other work."""
    pct = run.get("server_cpu_pct")
    return round(pct * 1e4 / run["cycles_per_s"], 1) if pct and run["cycles_per_s"] else None


def _median(values: list[float]) -> float:
    return statistics.median(values) if values else float("nan")


def report(args: argparse.Namespace, results: dict[str, Any]) -> str:
    lines: list[str] = []
    cycles = results.get("cycles", {})
    if cycles:
        lines += ["Cycles (add -> get -> ack), %d connections, %g s per run, the three runs alternated %d time(s); "
                  "`beside`: another node, %d jobs of a group held at its limit waiting in the queue(s) the cycles "
                  "use; in brackets the node's CPU per cycle" % (args.conns, args.duration, args.rounds, args.backlog),
                  "", "| queues | round | plain (today) | 10 groups, no limit | groups / plain | plain beside the backlog "
                  "| beside / plain |", "|---|---:|---:|---:|---:|---:|---:|"]  # fmt: skip
        for layout, rounds in cycles.items():
            for i, r in enumerate(rounds, 1):
                cell = lambda k: "{:,.0f} ({} us)".format(r[k]["cycles_per_s"], r["cpu_us"][k])  # noqa: E731
                lines.append("| %s | %d | %s | %s | %.1f %% | %s | %.1f %% |" % (
                    layout, i, cell("plain"), cell("groups"), 100 * r["groups_ratio"], cell("beside"),
                    100 * r["beside_ratio"]))  # fmt: skip
            cpu = {k: _median([r["cpu_us"][k] for r in rounds if r["cpu_us"][k]]) for k in ("plain", "groups", "beside")}
            lines.append("| %s | **median** | (%.1f us) | (%.1f us) | **%.1f %%** (CPU %+.1f %%) | (%.1f us) "
                         "| **%.1f %%** (CPU %+.1f %%) |" % (
                             layout, cpu["plain"], cpu["groups"], 100 * _median([r["groups_ratio"] for r in rounds]),
                             100 * (cpu["groups"] / cpu["plain"] - 1), cpu["beside"],
                             100 * _median([r["beside_ratio"] for r in rounds]), 100 * (cpu["beside"] / cpu["plain"] - 1)))  # fmt: skip
        lines.append("")
    if results.get("concurrency"):
        lines += ["A group with `CONCURRENCY n`, each job held %g ms by its consumer, %g s" % (args.hold_ms, args.limit_duration),
                  "", "| nodes | n | consumers | ideal n / hold | deliveries/s | of the ideal | without the first 2 s |",
                  "|---:|---:|---:|---:|---:|---:|---:|"]  # fmt: skip
        for r in results["concurrency"]:
            lines.append("| %d | %d | %d per node | %s | %s | **%.1f %%** | %.1f %% |" % (
                r["nodes"], r["concurrency"], 2 * r["concurrency"], "{:,.0f}".format(r["ideal_per_s"]),
                "{:,.0f}".format(r["deliveries_per_s"]), 100 * r["of_ideal"], 100 * r["steady_of_ideal"]))  # fmt: skip
        lines.append("")
    if results.get("rate"):
        lines += ["A group with `RATE r`, consumers acknowledging at once, %g s" % args.rate_duration, "",
                  "| nodes | r | deliveries/s | of r | without the first 2 s | of r |", "|---:|---:|---:|---:|---:|---:|"]
        for r in results["rate"]:
            lines.append("| %d | %g | %s | **%.1f %%** | %s | %.1f %% |" % (
                r["nodes"], r["rate"], "{:,.1f}".format(r["deliveries_per_s"]), 100 * r["of_rate"],
                "{:,.1f}".format(r["steady_per_s"]), 100 * r["steady_of_rate"]))  # fmt: skip
    return "\n".join(lines).rstrip()


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="scripts/bench groups", description=__doc__.split("\n\n")[0])
    parser.add_argument("--only", default=",".join(SUITES), help="a subset of: %s" % ", ".join(SUITES))
    parser.add_argument("--conns", type=int, default=50, help="cycles: connections (default 50)")
    parser.add_argument("--duration", type=float, default=5.0, help="seconds per cycles and concurrency run (default 5)")
    parser.add_argument("--rounds", type=int, default=4, help="cycles: rounds of plain, groups, beside, alternated (default 4)")
    parser.add_argument("--layouts", default="shared,per-connection", help="cycles: queue layouts (default both)")
    parser.add_argument("--backlog", type=int, default=50_000, help="cycles: the held group's jobs queued (default 50000)")
    parser.add_argument("--concurrency", type=int, default=20, help="CONCURRENCY n (default 20)")
    parser.add_argument("--hold-ms", type=float, default=10.0, help="how long a consumer holds a job (default 10)")
    parser.add_argument("--limit-duration", type=float, default=10.0, help="seconds of the concurrency run (default 10)")
    parser.add_argument("--rate", type=float, default=500.0, help="RATE r (default 500)")
    parser.add_argument("--rate-duration", type=float, default=20.0, help="seconds of the rate run (default 20)")
    parser.add_argument("--nodes", default="1,3", help="node counts of the concurrency and rate runs (default 1,3)")
    parser.add_argument("--base-port", type=int, default=19600, help="the nodes' ports: this and +1 (cycles), +200, +201, +202 (a cluster)")
    parser.add_argument("--quick", action="store_true", help="smoke run: 2 s runs, one round, small backlogs")
    parser.add_argument("--write", type=Path, default=None, help="raw results here (default bench-results/...)")
    args = parser.parse_args(argv)
    if args.quick:
        args.duration, args.rounds, args.backlog, args.limit_duration, args.rate_duration = 2.0, 2, 2000, 3.0, 4.0
    args.warmup = min(2.0, args.duration)
    args.layouts = [x for x in args.layouts.split(",") if x]
    args.node_counts = [int(x) for x in args.nodes.split(",") if x]
    only = [x for x in args.only.split(",") if x]
    bad = [x for x in only + args.layouts if x not in SUITES + ("shared", "per-connection")]
    if bad:
        parser.error("unknown: %s" % ", ".join(bad))
    if hasattr(os, "sched_setaffinity"):
        os.sched_setaffinity(0, {int(CLIENT_CPU)})
    signal.signal(signal.SIGTERM, _on_sigterm)
    bench = GroupsBench(Sizes(duration=args.duration), base_port=args.base_port, conns=args.conns)
    load0 = os.getloadavg()
    try:
        for suite in SUITES:
            if suite in only:
                getattr(bench, "bench_" + suite)(args)
    finally:
        bench.stop_all()
    bench.results["loadavg"] = {"before": load0, "after": os.getloadavg()}
    bench.results["command"] = shlex.join(["scripts/bench", "groups", *(sys.argv[1:] if argv is None else argv)])
    text = report(args, bench.results)
    print(text)
    save_raw("groups", args, bench.results | {"commands": bench.commands}, text, machine_info(sys.executable))


if __name__ == "__main__":
    main()
