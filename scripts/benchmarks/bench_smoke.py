"""A many-node smoke run on this machine: real node processes, jobs everywhere, one node killed.

    scripts/bench smoke                       30 nodes, cluster-node-timeout 3000
    scripts/bench smoke --nodes 10 --node-timeout 2000

Method
------
``--nodes`` fresh disque-py processes (in memory, not pinned) are started and joined
(``CLUSTER MEET`` of every other node sent to node 0, then every node polled until it reaches all
the others). Then, one after the other:

* *ADDJOB*: on every node i, ``ADDJOB q<i> job-<i> 0 REPLICATE 3`` (synchronous: the reply waits
  for two other nodes' copies); every reply must be a job ID;
* *GETJOB*: on every odd node i, ``GETJOB TIMEOUT 10000 FROM q<i-1>``: the job added on the node
  before, which this node does not hold unless it got a copy (then NEEDJOBS/YOURJOBS bring it); it
  must be that job; then ``ACKJOB`` of it;
* *failure*: the last node is killed (SIGKILL); every other node must flag it ``fail`` in CLUSTER
  NODES, and the time from the kill is reported beside the node timeout.

Each phase has a deadline; a failed check exits 1 with what was wrong. Prints the timings, writes
the raw JSON in bench-results/ (or ``--write FILE``).
"""

from __future__ import annotations

import argparse
import signal
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from disque_py.cli import launcher

from .bench_nodes import free_ports, vm_rss_kb
from .common import HOST, save_raw


class SmokeError(Exception):
    pass


def _flags_of(port: int, node_id: str) -> list[str]:
    for line in launcher.call(port, "CLUSTER", "NODES", timeout=5.0).decode().splitlines():
        fields = line.split()
        if fields and fields[0] == node_id:
            return fields[2].split(",")
    return []


def run(args: argparse.Namespace, work: Path) -> dict[str, Any]:
    ports = free_ports(args.nodes, args.base_port, set())
    procs = []
    out: dict[str, Any] = {"nodes": args.nodes, "node_timeout_ms": args.node_timeout}
    try:
        t0 = time.monotonic()
        for port in ports:
            directory = work / str(port)
            directory.mkdir()
            argv = launcher.node_argv(port, directory, "--bind", HOST, "--logfile", str(directory / "log"),
                                      "--cluster-node-timeout", str(args.node_timeout), python=sys.executable,
                                      script=True)  # fmt: skip
            procs.append(launcher.spawn(argv, output=directory / "stderr", cwd=directory, detach=True))
        for proc, port in zip(procs, ports):
            launcher.wait_ready(proc, port, host=HOST, timeout=60.0 + args.nodes, what="node")
        out["start_s"] = round(time.monotonic() - t0, 2)
        out["join_s"] = round(launcher.join([(HOST, p) for p in ports], timeout=120.0), 2)

        t0 = time.monotonic()
        ids = []
        for i, port in enumerate(ports):
            reply = launcher.call(port, "ADDJOB", "q%d" % i, "job-%d" % i, "0", "REPLICATE", "3", timeout=10.0)
            if not (isinstance(reply, bytes) and reply.startswith(b"D-")):
                raise SmokeError("ADDJOB on node %d answered %r" % (i, reply))
            ids.append(reply)
        out["addjob_all_s"] = round(time.monotonic() - t0, 2)

        t0 = time.monotonic()
        served = 0
        for i in range(1, args.nodes, 2):
            reply = launcher.call(ports[i], "GETJOB", "TIMEOUT", "10000", "FROM", "q%d" % (i - 1), timeout=15.0)
            if not reply or reply[0][1] != ids[i - 1] or reply[0][2] != b"job-%d" % (i - 1):
                raise SmokeError("GETJOB on node %d from q%d answered %r, not job %r" % (i, i - 1, reply, ids[i - 1]))
            launcher.call(ports[i], "ACKJOB", ids[i - 1], timeout=5.0)
            served += 1
        out["getjob_other_nodes"] = served
        out["getjob_all_s"] = round(time.monotonic() - t0, 2)
        out["rss_mb_mean"] = round(sum(vm_rss_kb(p.pid) for p in procs) / 1024.0 / len(procs), 1)

        victim_port = ports[-1]
        victim_id = launcher.call(victim_port, "CLUSTER", "MYID", timeout=5.0).decode()
        procs[-1].send_signal(signal.SIGKILL)
        procs[-1].wait(timeout=10)
        killed = time.monotonic()
        deadline = killed + 10.0 * args.node_timeout / 1000.0 + 10.0
        pending = set(ports[:-1])
        while pending:
            if time.monotonic() > deadline:
                raise SmokeError("%d nodes never flagged the killed node failed" % len(pending))
            pending = {p for p in pending if "fail" not in _flags_of(p, victim_id)}
            time.sleep(0.05)
        out["all_flag_fail_s"] = round(time.monotonic() - killed, 2)
        out["all_flag_fail_x_timeout"] = round(out["all_flag_fail_s"] * 1000.0 / args.node_timeout, 2)
        return out
    finally:
        for proc in procs:
            launcher.stop(proc, timeout=10.0, group=True)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="scripts/bench smoke", description=__doc__.split("\n\n")[0])
    parser.add_argument("--nodes", type=int, default=30, help="node processes (default 30)")
    parser.add_argument("--node-timeout", type=int, default=3000, help="cluster-node-timeout, ms (3000)")
    parser.add_argument("--base-port", type=int, default=24000, help="first port tried (default 24000)")
    parser.add_argument("--write", type=Path, default=None, help="raw results here (default bench-results/...)")
    args = parser.parse_args(argv)
    if args.nodes < 4:
        parser.error("--nodes: at least 4 (REPLICATE 3, and one node to kill)")
    started = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="bench-smoke-") as tmp:
        try:
            result = run(args, Path(tmp))
        except (SmokeError, launcher.LaunchError) as exc:
            print("smoke run failed: %s" % exc, flush=True)
            raise SystemExit(1) from None
    result["total_s"] = round(time.monotonic() - started, 1)
    text = ("%(nodes)d nodes: started in %(start_s).1f s, joined in %(join_s).1f s; ADDJOB REPLICATE 3 on every "
            "node in %(addjob_all_s).2f s; GETJOB of another node's job on %(getjob_other_nodes)d nodes in "
            "%(getjob_all_s).2f s; a node killed, flagged failed by all the others in %(all_flag_fail_s).1f s "
            "(%(all_flag_fail_x_timeout).2f x the %(node_timeout_ms)d ms node timeout); RSS %(rss_mb_mean).1f MB "
            "per node; %(total_s).0f s in all" % result)  # fmt: skip
    print(text)
    save_raw("smoke", args, result, text)

if __name__ == "__main__":
    main()
