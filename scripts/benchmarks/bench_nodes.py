"""What one node costs when nothing happens, beside Disque 1.0-rc1 in the same run.

    scripts/bench nodes --disque-server PATH          5, 10 and 20 nodes; 8,000 blocked clients
    scripts/bench nodes --sizes 5,10 --clients 0      other sizes, no client phase
    scripts/bench nodes --quick --disque-server PATH  3 nodes, 2 s settle, 3 s window, 500 clients

Method
------
*Idle cost.* For each size N, N fresh disque-py nodes and (with ``--disque-server``) N fresh
Disque nodes are started at the same time (each a process of its own in a new empty directory,
in memory, not pinned), each set joined by ``CLUSTER MEET`` of every other node sent to its first
node, and polled until every node reaches the N-1 others (``cluster_reachable_nodes``). Both
clusters are then left alone ``--settle`` seconds (15), and the CPU time of every node
(every thread's, ``/proc/PID/task/*/schedstat``, in ns) is read, and again ``--window`` seconds (20) later: the idle
CPU per node is that difference over the window, in ms per second, mean (min-max) over the nodes.
Both clusters run in the same window, so the load others put on the machine falls on both; the
ratio (ours / Disque's) is the figure to compare. The RSS is each node's ``VmRSS``
(``/proc/PID/status``) at the end of the window, mean over the nodes.

*Connecting blocked clients.* One fresh node of each kind, one after the other: ``--clients``
connections (8,000) are opened one after the other from this process, each sending at once
``GETJOB TIMEOUT 0 FROM q<i>`` (a queue of its own); the time is from the first connect to the
moment the node's ``INFO clients`` shows all of them blocked (polled every 20 ms on a connection
of its own). A node that accepts slowly lets its listen backlog fill, and a connect then waits for
the kernel to resend its SYN (a second): the time says how fast the node takes connections in.

Prints a Markdown table and saves the raw JSON in bench-results/ (or ``--write FILE``).
"""

from __future__ import annotations

import argparse
import os
import socket
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import hiredis

from disque_py.cli import launcher

from .common import HOST, _run, machine_info, save_raw

KINDS = ("disque-py", "disque")


def vm_rss_kb(pid: int) -> int:
    """``VmRSS`` of ``pid`` in KiB (0 if gone)."""
    try:
        with open("/proc/%d/status" % pid) as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1])
    except OSError:
        pass
    return 0


def cpu_seconds(pid: int) -> float:
    """On-CPU time of every thread of ``pid`` in seconds, from ``/proc/PID/task/*/schedstat`` (ns, where
    ``/proc/PID/stat`` counts 10 ms ticks); 0 if gone."""
    total = 0
    try:
        tids = os.listdir("/proc/%d/task" % pid)
    except OSError:
        return 0.0
    for tid in tids:
        try:
            with open("/proc/%d/task/%s/schedstat" % (pid, tid)) as f:
                total += int(f.read().split()[0])
        except (OSError, ValueError, IndexError):
            continue
    return total / 1e9


def _bindable(port: int) -> bool:
    with socket.socket() as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind((HOST, port))
        except OSError:
            return False
    return True


def free_ports(count: int, start: int, taken: set[int]) -> list[int]:
    """``count`` ports from ``start`` up whose bus port (+10000) is free too."""
    out: list[int] = []
    port = start
    while len(out) < count:
        if port > 30000:
            raise RuntimeError("no %d free ports from %d" % (count, start))
        if port not in taken and _bindable(port) and _bindable(port + 10000):
            out.append(port)
            taken.add(port)
        port += 1
    return out


class Nodes:
    """One kind's node processes, started in fresh directories, stopped on exit."""

    def __init__(self, kind: str, args: argparse.Namespace, work: Path) -> None:
        self.kind = kind
        self.args = args
        self.work = work
        self.procs: list[Any] = []
        self.ports: list[int] = []

    def argv(self, port: int, directory: Path) -> list[str]:
        if self.kind == "disque":
            return [self.args.disque_server, "--port", str(port), "--bind", HOST, "--dir", str(directory),
                    "--logfile", str(directory / "log"), "--daemonize", "no", "--appendonly", "no"]  # fmt: skip
        return launcher.node_argv(port, directory, "--bind", HOST, "--logfile", str(directory / "log"),
                                  python=self.args.python, script=True)  # fmt: skip

    def start(self, ports: list[int]) -> None:
        for port in ports:
            directory = Path(tempfile.mkdtemp(prefix="%s-%d-" % (self.kind, port), dir=self.work))
            self.procs.append(launcher.spawn(self.argv(port, directory), output=directory / "stderr",
                                             cwd=directory, detach=True))  # fmt: skip
            self.ports.append(port)

    def ready(self) -> None:
        deadline = 30.0 + 2.0 * len(self.procs)
        for proc, port in zip(self.procs, self.ports):
            launcher.wait_ready(proc, port, host=HOST, timeout=deadline, what=self.kind)

    def stop(self) -> None:
        for proc in self.procs:
            launcher.stop(proc, timeout=10.0, group=True)
        self.procs, self.ports = [], []


def idle_cost(args: argparse.Namespace, size: int, work: Path) -> dict[str, Any]:
    """Both kinds' clusters of ``size`` nodes, idle over the same window."""
    taken: set[int] = set()
    clusters = [Nodes(kind, args, work) for kind in args.kinds]
    try:
        for i, nodes in enumerate(clusters):
            nodes.start(free_ports(size, args.base_port + 1000 * i, taken))
        joined = {}
        for nodes in clusters:
            nodes.ready()
            joined[nodes.kind] = launcher.join([(HOST, p) for p in nodes.ports], timeout=60.0 + size)
        time.sleep(args.settle)
        before = {n.kind: [cpu_seconds(p.pid) for p in n.procs] for n in clusters}
        t0 = time.monotonic()
        time.sleep(args.window)
        elapsed = time.monotonic() - t0
        row: dict[str, Any] = {"nodes": size, "window_s": round(elapsed, 2)}
        for nodes in clusters:
            after = [cpu_seconds(p.pid) for p in nodes.procs]
            if any(p.poll() is not None for p in nodes.procs):
                raise RuntimeError("a %s node exited during the window" % nodes.kind)
            per = [1000.0 * (a - b) / elapsed for a, b in zip(after, before[nodes.kind])]
            rss = [vm_rss_kb(p.pid) / 1024.0 for p in nodes.procs]
            row[nodes.kind] = {"cpu_ms_per_s": per, "mean_cpu_ms_per_s": statistics.mean(per),
                               "rss_mb": rss, "mean_rss_mb": statistics.mean(rss),
                               "join_s": round(joined[nodes.kind], 2)}  # fmt: skip
        return row
    finally:
        for nodes in clusters:
            nodes.stop()


def _info_field(sock: socket.socket, name: bytes) -> int:
    reader = hiredis.Reader()
    sock.sendall(b"*2\r\n$4\r\nINFO\r\n$7\r\nclients\r\n")
    reply: Any = False
    while reply is False:
        chunk = sock.recv(65536)
        if not chunk:
            raise RuntimeError("the node closed the INFO connection")
        reader.feed(chunk)
        reply = reader.gets()
    for line in reply.split(b"\r\n"):
        if line.startswith(name + b":"):
            return int(line.split(b":")[1])
    raise RuntimeError("INFO clients has no %r" % name)


def connect_clients(args: argparse.Namespace, kind: str, work: Path) -> dict[str, Any]:
    """``args.clients`` connections to one fresh node, each blocked in GETJOB on its own queue."""
    nodes = Nodes(kind, args, work)
    socks: list[socket.socket] = []
    try:
        nodes.start(free_ports(1, args.base_port + 3000, set()))
        nodes.ready()
        port = nodes.ports[0]
        probe = socket.create_connection((HOST, port))
        t0 = time.monotonic()
        for i in range(args.clients):
            s = socket.create_connection((HOST, port))
            q = b"q%d" % i
            s.sendall(b"*5\r\n$6\r\nGETJOB\r\n$7\r\nTIMEOUT\r\n$1\r\n0\r\n$4\r\nFROM\r\n$%d\r\n%s\r\n" % (len(q), q))
            socks.append(s)
        connected = time.monotonic() - t0
        deadline = t0 + 120.0
        while _info_field(probe, b"blocked_clients") < args.clients:
            if time.monotonic() > deadline:
                raise RuntimeError("%s: not all %d clients blocked within 120 s" % (kind, args.clients))
            time.sleep(0.02)
        total = time.monotonic() - t0
        probe.close()
        return {"clients": args.clients, "connect_s": round(connected, 3), "all_blocked_s": round(total, 3),
                "rss_mb": round(vm_rss_kb(nodes.procs[0].pid) / 1024.0, 1)}  # fmt: skip
    finally:
        for s in socks:
            s.close()
        nodes.stop()


def run(args: argparse.Namespace) -> dict[str, Any]:
    work = Path(tempfile.mkdtemp(prefix="bench-nodes-"))
    results: dict[str, Any] = {"idle": [], "clients": {}}
    for size in args.sizes:
        row = idle_cost(args, size, work)
        results["idle"].append(row)
        print("%d nodes: %s" % (size, ", ".join("%s %.2f ms/s %.1f MB" % (k, row[k]["mean_cpu_ms_per_s"],
                                                                           row[k]["mean_rss_mb"])
                                                 for k in args.kinds)), flush=True)  # fmt: skip
    if args.clients:
        for kind in args.kinds:
            res = connect_clients(args, kind, work)
            results["clients"][kind] = res
            print("%s: %d clients blocked in %.2f s" % (kind, res["clients"], res["all_blocked_s"]), flush=True)
    return results


def _cell(d: dict[str, Any]) -> str:
    per = d["cpu_ms_per_s"]
    return "%.2f (%.2f-%.2f)" % (d["mean_cpu_ms_per_s"], min(per), max(per))


def report(args: argparse.Namespace, results: dict[str, Any]) -> str:
    ref = "disque" in args.kinds
    lines = ["Idle cost per node: CPU over %g s after %g s of settling (ms of CPU per second, mean (min-max) "
             "over the nodes), VmRSS at the end" % (args.window, args.settle), ""]  # fmt: skip
    if ref:
        lines += ["| nodes | disque-py CPU | Disque CPU | ratio | disque-py RSS | Disque RSS |",
                  "|---:|---:|---:|---:|---:|---:|"]  # fmt: skip
    else:
        lines += ["| nodes | disque-py CPU | disque-py RSS |", "|---:|---:|---:|"]
    for row in results["idle"]:
        ours = row["disque-py"]
        if ref:
            theirs = row["disque"]
            ratio = ours["mean_cpu_ms_per_s"] / theirs["mean_cpu_ms_per_s"] if theirs["mean_cpu_ms_per_s"] else 0.0
            lines.append("| %d | %s | %s | %.2f | %.1f MB | %.1f MB |" % (
                row["nodes"], _cell(ours), _cell(theirs), ratio, ours["mean_rss_mb"], theirs["mean_rss_mb"]))
        else:
            lines.append("| %d | %s | %.1f MB |" % (row["nodes"], _cell(ours), ours["mean_rss_mb"]))
    clients = results["clients"]
    if clients:
        lines += ["", "%d clients, each connected and blocked in GETJOB on a queue of its own:" % args.clients, "",
                  "| server | connects done | all blocked | RSS then |", "|---|---:|---:|---:|"]  # fmt: skip
        for kind, res in clients.items():
            lines.append("| %s | %.2f s | %.2f s | %.1f MB |" % (kind, res["connect_s"], res["all_blocked_s"],
                                                                 res["rss_mb"]))  # fmt: skip
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="scripts/bench nodes", description=__doc__.split("\n\n")[0])
    parser.add_argument("--sizes", default="5,10,20", help="cluster sizes, comma-separated (default 5,10,20)")
    parser.add_argument("--settle", type=float, default=15.0, help="seconds left alone after the join (15)")
    parser.add_argument("--window", type=float, default=20.0, help="seconds the CPU is measured over (20)")
    parser.add_argument("--clients", type=int, default=8000, help="blocked clients to connect, 0: none (8000)")
    parser.add_argument("--disque-server", default=None, help="Disque 1.0-rc1's disque-server, run beside ours")
    parser.add_argument("--base-port", type=int, default=21000, help="first port tried (default 21000)")
    parser.add_argument("--python", default=sys.executable, help="the interpreter our nodes run on")
    parser.add_argument("--quick", action="store_true", help="3 nodes, 2 s settle, 3 s window, 500 clients")
    parser.add_argument("--write", type=Path, default=None, help="raw results here (default bench-results/...)")
    args = parser.parse_args(argv)
    args.sizes = [int(x) for x in str(args.sizes).split(",") if x]
    if args.quick:
        args.sizes, args.settle, args.window, args.clients = [3], 2.0, 3.0, min(args.clients, 500)
    args.kinds = list(KINDS) if args.disque_server else ["disque-py"]
    results = run(args)
    text = report(args, results)
    print(text)
    machine = machine_info(args.python)
    if args.disque_server:
        machine["disque_server"] = "%s (%s)" % (args.disque_server, _run([args.disque_server, "--version"]))
    save_raw("nodes", args, results, text, machine)

if __name__ == "__main__":
    main()
