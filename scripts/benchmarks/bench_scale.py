"""What grows with the number of nodes: the deterministic simulation at 10, 50, 100 and 200 nodes.

    scripts/bench scale                         10, 50, 100, 200 nodes, cluster-node-timeout 15000
    scripts/bench scale --sizes 10,50 --node-timeout 3000
    scripts/bench scale --quick                 5 and 10 nodes

Method
------
Each size runs whole in one process, in virtual time: the simulation of ``tests/sim/netsim.py``, a
real ``ClusterService`` (membership, bus, nodes.conf) and a real job core per node, the bus's links
memory streams between them, trio's ``MockClock`` jumping over idle time, so the figures are the
protocol's, not this machine's (the real CPU it took is printed beside them). For N nodes:

* *join*: every other node is sent ``CLUSTER MEET`` by node 0; the virtual time until every node
  knows all N;
* *gossip*: after 5 s of quiet, each node's PING/PONG/MEET/FAIL messages sent (the membership's
  count), bus frames and bytes sent, over ``--window`` virtual seconds (default: the node timeout,
  so that every scheduled PING is in it), per node per second, mean over the nodes;
* *ADDJOB REPLICATE 3*: one synchronous ADDJOB on node 0, then 1 s: the job-layer messages every
  node received, by kind (REPLJOB, GOTJOB ...), and with them the gossip of that second left out;
* *NEEDJOBS*: a GETJOB blocking on the last node for the queue node 0 holds the job in: the
  job-layer messages of the next second, by kind (the NEEDJOBS broadcast, YOURJOBS ...);
* *failure detection*: node N-1 is killed (every task of it cancelled, connections refused); the
  virtual time until one node flags it PFAIL, and until every other node flags it FAIL, as multiples
  of the node timeout.

Prints a Markdown table and saves the raw JSON in bench-results/ (or ``--write FILE``).
"""

from __future__ import annotations

import argparse
import collections
import json
import logging
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import trio
import trio.testing

from .common import ROOT, save_raw

sys.path.insert(0, str(ROOT))
from tests.sim.netsim import MemoryNetwork, SimServer, wait_until  # noqa: E402  (the simulation the tests run)

class ScaleServer(SimServer):
    """A simulated node whose core answers what it receives (the test harness's node only records it):
    what a message makes the core send (a GOTJOB for a REPLJOB, a YOURJOBS for a NEEDJOBS) leaves."""

    def cluster_data(self, sender: str, items: Any) -> None:
        now = int(trio.current_time() * 1000)
        for kind, body in items:
            self.node.receive_data(sender, kind, body, now)
        self.apply_effects()

    def run_command(self, *argv: Any) -> Any:
        """A client command to the job core, its messages sent."""
        args = [a if isinstance(a, bytes) else str(a).encode() for a in argv]
        reply = self.node.execute(1, args, int(trio.current_time() * 1000))
        self.apply_effects()
        return reply


BASE_PORT = 7000
SETTLE_S = 5.0


def _gossip_counts(nodes: list[SimServer]) -> list[tuple[int, int, int]]:
    """(membership messages sent, bus frames sent, bus bytes sent) of each node."""
    out = []
    for s in nodes:
        bus = s.cluster.bus.stats if s.cluster.bus is not None else {}
        out.append((s.cluster.membership.stats["messages_sent"], bus.get("frames_sent", 0), bus.get("bytes_sent", 0)))
    return out


def _job_messages(nodes: list[SimServer]) -> collections.Counter:
    """Job-layer messages received so far by every node, by kind."""
    total: collections.Counter = collections.Counter()
    for s in nodes:
        total.update(s.cluster.received_by_kind)
    return total


def _flagged(nodes: list[SimServer], victim: SimServer, flag: str) -> int:
    return sum(1 for s in nodes if flag in s.flags(victim).split(","))


async def measure(size: int, args: argparse.Namespace, work: Path) -> dict[str, Any]:
    timeout_ms = args.node_timeout
    row: dict[str, Any] = {"nodes": size, "node_timeout_ms": timeout_ms}
    cpu0 = time.process_time()
    async with trio.open_nursery() as nursery:
        net = MemoryNetwork(nursery)
        nodes: list[ScaleServer] = []
        for i in range(size):
            directory = work / ("n%d-%d" % (size, i))
            directory.mkdir()
            s = ScaleServer(net, BASE_PORT + i, directory, cluster_node_timeout=timeout_ms)
            await nursery.start(s.run)
            nodes.append(s)
        for other in nodes[1:]:
            nodes[0].cmd("CLUSTER", "MEET", "127.0.0.1", other.port)
        row["join_s"] = round(await wait_until(lambda: all(s.known() == size for s in nodes), timeout=600.0,
                                               what="%d nodes knowing each other" % size), 2)  # fmt: skip
        await trio.sleep(SETTLE_S)

        before = _gossip_counts(nodes)
        t0 = trio.current_time()
        await trio.sleep(args.window or timeout_ms / 1000.0)
        elapsed = trio.current_time() - t0
        after = _gossip_counts(nodes)
        per = [[(a - b) / elapsed for a, b in zip(x, y)] for x, y in zip(after, before)]
        row["gossip_messages_per_node_s"] = round(sum(p[0] for p in per) / size, 2)
        row["frames_per_node_s"] = round(sum(p[1] for p in per) / size, 2)
        row["bytes_per_node_s"] = round(sum(p[2] for p in per) / size, 1)

        seen = _job_messages(nodes)
        reply = nodes[0].run_command("ADDJOB", "scale-q", "body", 0, "REPLICATE", 3)
        await trio.sleep(1.0)
        row["addjob_replicate_3"] = dict(_job_messages(nodes) - seen)
        row["addjob_reply"] = repr(reply)[:60]

        seen = _job_messages(nodes)
        nodes[-1].run_command("GETJOB", "TIMEOUT", 0, "FROM", "scale-q")
        await trio.sleep(1.0)
        row["needjobs"] = dict(_job_messages(nodes) - seen)

        victim, others = nodes[-1], nodes[:-1]
        victim.kill()
        killed = trio.current_time()
        await wait_until(lambda: _flagged(others, victim, "fail?") + _flagged(others, victim, "fail") > 0,
                         timeout=20 * timeout_ms / 1000.0, what="a PFAIL")  # fmt: skip
        row["first_pfail_x_timeout"] = round((trio.current_time() - killed) * 1000.0 / timeout_ms, 2)
        await wait_until(lambda: _flagged(others, victim, "fail") == len(others),
                         timeout=20 * timeout_ms / 1000.0, what="FAIL on every node")  # fmt: skip
        row["all_fail_x_timeout"] = round((trio.current_time() - killed) * 1000.0 / timeout_ms, 2)
        row["virtual_s"] = round(trio.current_time(), 1)
        nursery.cancel_scope.cancel()
    row["real_cpu_s"] = round(time.process_time() - cpu0, 1)
    return row


def _kinds(counts: dict[str, int]) -> str:
    total = sum(counts.values())
    return "%d (%s)" % (total, ", ".join("%s %d" % kv for kv in sorted(counts.items()))) if counts else "0"


def report(args: argparse.Namespace, rows: list[dict[str, Any]]) -> str:
    lines = [
        "The simulation (tests/sim/netsim.py: real membership, bus and job core per node, memory links, "
        "virtual time), cluster-node-timeout %d ms" % args.node_timeout,
        "",
        "| nodes | join | gossip msgs / node / s | frames / node / s | bytes / node / s | ADDJOB REPLICATE 3 "
        "| a GETJOB's NEEDJOBS | first PFAIL | FAIL everywhere | real CPU |",
        "|---:|---:|---:|---:|---:|---|---|---:|---:|---:|",
    ]
    for r in rows:
        lines.append("| %d | %.1f s | %.2f | %.2f | %.0f | %s | %s | %.2f x timeout | %.2f x timeout | %.0f s |" % (
            r["nodes"], r["join_s"], r["gossip_messages_per_node_s"], r["frames_per_node_s"], r["bytes_per_node_s"],
            _kinds(r["addjob_replicate_3"]), _kinds(r["needjobs"]), r["first_pfail_x_timeout"],
            r["all_fail_x_timeout"], r["real_cpu_s"]))  # fmt: skip
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="scripts/bench scale", description=__doc__.split("\n\n")[0])
    parser.add_argument("--sizes", default="10,50,100,200", help="cluster sizes, comma-separated (10,50,100,200)")
    parser.add_argument("--node-timeout", type=int, default=15000, help="cluster-node-timeout, ms (15000)")
    parser.add_argument("--window", type=float, default=0.0, help="virtual seconds of gossip measured (the timeout)")
    parser.add_argument("--quick", action="store_true", help="5 and 10 nodes")
    parser.add_argument("--write", type=Path, default=None, help="raw results here (default bench-results/...)")
    args = parser.parse_args(argv)
    logging.getLogger("disque").setLevel(logging.ERROR)  # each simulated node's start-up warnings, times N
    sizes = [5, 10] if args.quick else [int(x) for x in str(args.sizes).split(",") if x]
    rows = []
    with tempfile.TemporaryDirectory(prefix="bench-scale-") as tmp:
        for size in sizes:
            row = trio.run(measure, size, args, Path(tmp), clock=trio.testing.MockClock(autojump_threshold=0))
            rows.append(row)
            print(json.dumps(row), flush=True)
    text = report(args, rows)
    print(text)
    save_raw("scale", args, rows, text)

if __name__ == "__main__":
    main()
