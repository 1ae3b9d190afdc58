"""The ``bus`` suite: idle cluster-bus traffic of 3, 10, 30 unpinned nodes and the chain join
time of 10 (see the Method notes of :mod:`benchmarks.bench`, "Cluster bus").
"""

from __future__ import annotations

import tempfile
import time
from pathlib import Path
from typing import Any

from disque_py.cli import launcher

from .common import BenchBase, BenchError, CHAIN_POLL, HOST, Server, SyncClient, _spread, log


#: The bus suite's node i listens on --base-port + BUS_PORT_SHIFT + i (cluster bus: that + 10000).
BUS_PORT_SHIFT = 100


#: Disque's cluster-node-timeout default (ms), used when --cluster-node-timeout is not given.
DEFAULT_NODE_TIMEOUT = 15000


STAR_POLL = 0.1


class BusSuite(BenchBase):
    """The cluster bus suite: local clusters of real, unpinned node processes."""

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


def bus_report(bench: BenchBase) -> list[str]:
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
