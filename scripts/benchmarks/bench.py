"""Benchmarks for one disque-py node, with redis-server as a yardstick, and for the cluster bus.

    scripts/bench                         everything (about three minutes, two of them the bus)
    scripts/bench --quick                 smoke run with small n (< 1 minute)
    scripts/bench --only addjob,memory    a subset: addjob, getjob, cycles, memory, redis, bus, replication,
                                          federation, queues
    scripts/bench --only bus              only the cluster bus tests (about two minutes)
    scripts/bench --only federation       consumer on node A, producer on node B (about 18 minutes)
    scripts/bench --only replication      ADDJOB REPLICATE 3 and add->get->ack on three nodes (about a minute)
    scripts/bench --only queues           what 200,000 idle queues cost a node (under a minute)
    scripts/bench client --port 7711 --duration 5
                                          only the add->get->ack client, against any node
    scripts/bench dashboard RESULTS.json [AOF.json]
                                          the dashboard table of BENCHMARKS.md from results files

Method
------
The machine is split in two: the server under test runs pinned to CPU 0
(``taskset -c 0``) and the load generator pinned to CPU 1 (``taskset -c 1``),
so the two never compete for a core and the numbers say what *one core* of
server can do. Every test gets a freshly started node, so no test inherits the
heap (Python never returns freed memory to the OS), the queues or the
connections of the one before.

* **Throughput** (``addjob``, ``getjob``): ``redis-benchmark -q`` with 50
  clients and a 100-byte body. ADDJOB is measured unpipelined (-P 1,
  n=100000) and with -P 32 (n=500000). GETJOB NOHANG is measured with -P 32
  on a queue first filled by redis-benchmark with n + clients*pipeline jobs,
  so every GETJOB returns a job: the jobs left over afterwards prove it.
  redis-benchmark shows progress lines separated by ``\\r``; the result is
  the last line containing "requests per second" (requests/s and p50).
* **Yardstick** (``redis``): a ``redis-server --save "" --appendonly no``
  under exactly the same load: LPUSH -P 1, LPUSH -P 32 and RPOP -P 32 on a
  list first filled with LPUSH, same n and body.
* **Cycles** (``cycles``): our own client (:func:`run_cycles`), one Python
  process pinned to CPU 1, drives N connections (default 50) with raw
  non-blocking sockets, an epoll loop and one ``hiredis.Reader`` per
  connection. Each connection loops ``ADDJOB q body 0`` -> ``GETJOB NOHANG
  FROM q`` -> ``ACKJOB id`` with one request in flight, for a fixed duration
  (or count), and records the latency of every whole cycle. Each connection
  has its own queue (``bench-0`` ... ``bench-49``): every GETJOB then returns
  the job that connection just added, so a cycle is always exactly three
  round trips and no connection steals work from another (``--shared-queue``
  uses one queue for all instead). The client reports its own CPU use and the
  orchestrator the server's (from /proc): a server near 100% and a client
  well below it means the client is not the bottleneck. With ``redis`` the
  same client also runs LPUSH -> RPOP -> DEL cycles against redis-server,
  which shows the ceiling of the client itself. Then the same connections
  in batches of 100 jobs (``cycles_batch``, the client's ``--batch 100``):
  100 ADDJOBs as one pipeline, ``GETJOB NOHANG COUNT 100``, one ACKJOB of the
  100 IDs, counted in jobs a second: what a job's whole trip costs when the
  round trips are shared.
* **Reference** (``--disque-server PATH``): the addjob, getjob, cycles and
  replication suites also start Disque 1.0-rc1 itself (a ``disque-server``
  built from its source, in memory: ``--appendonly no``), pinned and loaded
  exactly like our nodes, right after each disque-py run. The report shows
  what it did here beside the figure the issue gives for it.
* **Memory** (``memory``): on a fresh node, ``used_memory`` from INFO memory
  (the process RSS in disque-py), then 200,000 (and 1,000,000) jobs with a
  100-byte body added by ``redis-benchmark -P 32``, then ``used_memory``
  again; bytes/job = difference / registered_jobs.
* **Cluster bus** (``bus``): local clusters of real node processes on ports
  ``--base-port + 100`` and up (cluster bus +10000), **not** pinned (the
  kernel spreads them over both CPUs; an idle node needs well under 1% of a
  core). *Idle traffic*: N fresh nodes (3, 10, 30), ``CLUSTER MEET`` of
  every other node sent to node 0, CLUSTER INFO polled on every node every
  100 ms until every node has ``cluster_reachable_nodes`` = N-1 (the star
  join time is reported on the side), 5 s of settling, then the counters
  ``cluster_stats_messages_{sent,received}`` and
  ``cluster_stats_bus_{bytes,frames}_{sent,received}`` (the bus's own byte
  and frame counters) and the CPU time from /proc are sampled on every node,
  again 20 s later, and each node's rates are computed over its own interval;
  the table shows mean, min and max across nodes. *Chain join*: 10 fresh
  nodes, ``CLUSTER MEET`` i -> i+1 sent to node i (0-1, 1-2, ..., 8-9), the
  clock started just before the first MEET; CLUSTER INFO is polled on every
  node every 50 ms (one connection per node) and the time is taken at the end
  of the first polling round in which every node reports N-1 (so it is up to
  ~50 ms late); three runs with fresh nodes, and their median. Nodes are
  stopped with ``SHUTDOWN`` after each test, and killed if they linger 10 s.
  Every wait has a deadline; a node that exits fails the run with its log.
* **Replication** (``replication``): the federation suite's three nodes
  (below), all on CPU 0, joined; ``redis-benchmark`` (summary output, for
  p99) with 50 clients sends ``ADDJOB q <body> 0 REPLICATE 3`` to the first
  node, so every reply waits for two GOTJOBs; then, on fresh nodes, the
  add->get->ack cycle client against the first node (REPLICATE defaults to
  3 there). Reported with the CPU of each node; the Disque reference is
  ~52k ADDJOB/s and ~24k cycles/s with three nodes on one core.
* **Federation** (``federation``): three fresh nodes A, B, C on ports
  ``--base-port + 200`` ... ``+ 202`` (bus +10000), A pinned to CPU 0, B
  to CPU 1 and C free to run on either (``--fed-layout pair-per-core``, the
  default: the pair a core each, as deployed, so the pair's rate is what is
  measured; B shares its core with the load generator, and the kernel puts
  C where there is room, in the cross-node and same-node runs alike), or
  with C pinned to CPU 1 too (``--fed-layout node-per-core``: with
  REPLICATE 3 the producer's node B then shares its core with a replica and
  the clients in the cross-node runs), or all three on CPU 0
  (``--fed-layout one-core``: what a move costs in total CPU), joined with
  ``CLUSTER MEET`` of B and C sent to A; the load generator
  (:func:`run_federation`, one process, epoll + ``hiredis.Reader``, like the
  cycle client) pinned to CPU 1 and run as ``SCHED_BATCH``
  (``--fed-client-sched batch``, the default). The load generator stands for
  clients on other machines; at the normal policy every reply that wakes it
  takes CPU 1 from B at once (the kernel preempts on wakeup), so B answered
  about one job per wakeup and the two spent the shared core switching
  (measured: p99 20-26 ms at 12,000-15,000 jobs/s where SCHED_BATCH gives
  1.8-9 ms, same CPU use). With SCHED_BATCH it waits for B's pass to end.
  This can only make the load generator's timestamps later, never earlier;
  its lag behind the send schedule is reported. ``--fed-client-sched
  normal`` gives the earlier figures. 10 consumer connections on A each keep one
  ``GETJOB TIMEOUT 1000 FROM q`` pending; every job received is acknowledged with ``ACKJOB id`` and
  the connection blocks again in the same write. The producer sends ``ADDJOB
  q <body> 0 REPLICATE r`` to B on an open-loop schedule (job k due at t0 +
  k/R, written as soon as it is due, pipelined round-robin over 4
  connections for REPLICATE 1 and 32 for REPLICATE 3, never waiting for
  replies; epoll's 1 ms timer resolution sends jobs in groups of up to a
  millisecond's worth). The body is ``time.monotonic_ns()`` at the write; the
  latency of a job is its receive time minus that (same process, same
  clock). Latency figures cover the jobs *sent* in the measured window
  (after a 1 s warm-up); "achieved" is the jobs *received* in it per second.
  After the last job the client waits for every produced ID (ADDJOB replies)
  to arrive, then 0.3 s more, and counts unique, duplicate and missing IDs;
  a missing or duplicated ID is looked up with ``SHOW`` on every node. INFO
  stats of the three nodes are read before and after each run
  (``jobs_pushed`` on the producing node = pushed under a lease; its
  ``jobs_exported`` minus that = pulled by NEEDJOBS). Node CPU is sampled from
  /proc by the client at the start and end of the measured window. Fixed
  runs: R = 50, 500, 5000 jobs/s for REPLICATE 1 and 3, 10 s each; with
  ``--fed-same-node`` each again with the producer on A (same-node delivery),
  and with ``--disque-server`` that run on Disque 1.0-rc1 too, its p99 the
  same-node figure's yardstick. Maximum
  rate, for REPLICATE 1 and 3 (``--fed-ramp-replicates``): R from 1000
  jobs/s ×1.5 per 5 s step until a step fails (achieved < 95 % of R, p99 >=
  10 ms, or a job missing), then two bisections; once with the producer on B
  and once on A (same node, the baseline), the two searches' steps
  alternating (B, A, B, A, ...) so both see the same machine conditions.
  Then both searches again where only p99 > 1 s fails a sustained step: the
  throughput ceiling, where latency is let go. The maximum the federation
  target speaks of is, for each placement alike, the highest rate at which
  every run of it (both searches' steps, and the fixed runs) kept the
  latency target, at that rate and every lower one (``fed_kept_max``): near
  the edge two 5 s runs at one rate can give 6 and 16 ms. Every run starts
  a fresh cluster.
* **Idle queues** (``queues``): the federation suite's three nodes; node A
  gets 200,000 queues (one job each, added with ``REPLICATE 1`` and
  deleted with ``FASTACK``, so the queues stay, empty, until the queue GC
  evicts them after 5 minutes). ``used_memory`` before and after gives the
  bytes per idle queue; A's CPU from /proc over 10 s with no client, then
  over 10 s with one client blocked in ``GETJOB`` on another queue (which
  runs the federation tick every 100 ms), shows what idle queues cost.
The Markdown table goes to stdout; the raw results, the machine (nproc, CPU
model, Python, redis-benchmark version, git commit) and the exact commands go
to a JSON file (``bench-results/`` of the checkout this file is in by default,
or ``--write FILE``). Every process started is stopped on exit, even on Ctrl-C
or SIGTERM. Node processes are started, awaited and stopped by
:mod:`disque_py.cli.launcher`, like the test suite's and ``scripts/cluster``'s.

The harness lives in ``scripts/benchmarks/``, outside the installed package:
``scripts/bench`` runs it as the ``benchmarks`` package with ``scripts/`` on
``PYTHONPATH``, and so do the helper processes it starts (``python -m
benchmarks.bench client`` and ``fedclient``; see ``common.helper_env``). This
module is the command line and the report; the parts are one module each:
``common`` (pinning, sizes, RESP client, server processes, the redis-benchmark
runner, the three-node cluster, machine info, the results file), the suites
``single_node`` (addjob, getjob, cycles, memory, redis), ``bus``,
``replication``, ``federation`` (with its load generator) and ``queues``, the
cycle client ``cycle_client``, and ``dashboard`` (the table at the top of
BENCHMARKS.md, from results files: ``scripts/bench dashboard FILE...``). Every module builds on ``common`` and none
imports ``bench``, which imports the others; the other harnesses
(``bench_aof``, ``bench_tls``, ``bench_admin``, ``bench_spark``,
``bench_core``, ``bench_client``) likewise.
"""

from __future__ import annotations

import argparse
import os
import shutil
import signal
import sys
import time
from pathlib import Path
from typing import Any, Callable

from . import progress
from .bus import BUS_PORT_SHIFT, DEFAULT_NODE_TIMEOUT, BusSuite, bus_report
from .common import (
    CLIENT_BOUND_PCT,
    CLIENT_CPU,
    FED_PORT_SHIFT,
    REFERENCE,
    SERVER_CPU,
    BenchBase,
    BenchError,
    Sizes,
    _meets,
    _ms,
    _on_sigterm,
    _pct,
    _rate,
    _reference_cell,
    _run,
    default_results_path,
    log,
    machine_info,
    port_in_use,
    write_results,
)
from .cycle_client import client_main
from .federation import FederationSuite, _replicates, fedclient_main, federation_report
from .queues import QueuesSuite
from .replication import ReplicationSuite, replication_report
from .single_node import SingleNodeSuites


SUITES = ("addjob", "getjob", "cycles", "memory", "redis", "bus", "replication", "federation", "queues")


class Bench(SingleNodeSuites, BusSuite, ReplicationSuite, FederationSuite, QueuesSuite, BenchBase):
    """One run of ``scripts/bench``: the shared runner (``common.BenchBase``: options, servers, loads,
    results) with every suite's ``bench_<suite>`` method."""


def markdown_report(bench: Bench, machine: dict[str, Any]) -> str:
    """The results table, then a diagnostics table (CPU use of both sides, sanity checks)."""
    res, sizes = bench.results, bench.sizes
    rows = ["| Test | disque-py | p50 (p99) | redis-server, same load | Disque 1.0-rc1 | Target | Met |",
            "|---|---|---|---|---|---|---|"]  # fmt: skip

    def redis_cell(key: str, label: str) -> str:
        r = res.get(key)
        if not r:
            return "—"
        return "%s %s, p50 %s" % (label, _rate(r["requests_per_s"]), _ms(r.get("p50_ms")))

    for key, label, rkey, rlabel in (
        ("addjob_p1", "ADDJOB, -P 1, n=%d" % sizes.n_p1, "redis_lpush_p1", "LPUSH"),
        ("addjob_p32", "ADDJOB, -P 32, n=%d" % sizes.n_p32, "redis_lpush_p32", "LPUSH"),
        ("getjob_p32", "GETJOB NOHANG, -P 32, n=%d" % sizes.n_p32, "redis_rpop_p32", "RPOP"),
    ):
        r = res.get(key)
        if not r and not res.get(rkey):
            continue
        ref, target, target_text = REFERENCE[key]
        value = r["requests_per_s"] if r else None
        rows.append("| %s | %s | %s | %s | %s | %s | %s |" % (
            label, _rate(value), _ms(r.get("p50_ms")) if r else "—", redis_cell(rkey, rlabel),
            _reference_cell(res.get("ref_" + key), ref), target_text, _meets(value, target)))  # fmt: skip
    c, rc, dc = res.get("cycles"), res.get("redis_cycles"), res.get("ref_cycles")
    if c or rc or dc:
        rows.append("| ADDJOB→GETJOB→ACKJOB cycles, %d conns | %s | %s | %s | %s | — | — |" % (
            (c or rc or dc)["conns"],
            "%s cycles/s (%s req/s)" % (_rate(c["cycles_per_s"], ""), _rate(c["requests_per_s"], "")) if c else "—",
            "%s (%s)" % (_ms(c["p50_ms"]), _ms(c["p99_ms"])) if c else "—",
            ("LPUSH→RPOP→DEL %s cycles/s, p50 %s" % (_rate(rc["cycles_per_s"], ""), _ms(rc["p50_ms"]))
             if rc else "—"),
            ("here: %s cycles/s, p50 %s (p99 %s)" % (_rate(dc["cycles_per_s"], ""), _ms(dc["p50_ms"]),
                                                     _ms(dc["p99_ms"])) if dc else "—"),
        ))  # fmt: skip
    c, dc = res.get("cycles_batch"), res.get("ref_cycles_batch")
    if c or dc:
        rows.append("| the same in batches of %d jobs, %d conns | %s | %s | — | %s | — | — |" % (
            (c or dc)["batch"], (c or dc)["conns"],
            "%s jobs/s" % _rate(c["cycles_per_s"], "") if c else "—",
            "%s (%s) a batch" % (_ms(c["p50_ms"]), _ms(c["p99_ms"])) if c else "—",
            ("here: %s jobs/s, p50 %s a batch" % (_rate(dc["cycles_per_s"], ""), _ms(dc["p50_ms"])) if dc else "—"),
        ))  # fmt: skip
    ref, target, target_text = REFERENCE["memory"]
    for key in sorted((k for k in res if k.startswith("memory_")), key=lambda k: int(k.split("_")[1])):
        m = res[key]
        dm = res.get("ref_" + key)
        rss = " (RSS %s)" % _rate(m["rss_bytes_per_job"], "") if m.get("rss_bytes_per_job") is not None else ""
        here = ("here: %s bytes/job (RSS %s)" % (_rate(dm["bytes_per_job"], ""), _rate(dm["rss_bytes_per_job"], ""))
                if dm else ref)
        rows.append("| Memory, %s jobs, %d-byte body | %s bytes/job%s | — | — | %s | %s | %s |" % (
            "{:,}".format(m["jobs"]), m["body_size"], _rate(m["bytes_per_job"], ""), rss, here, target_text,
            _meets(m["bytes_per_job"], target, higher_is_better=False)))  # fmt: skip

    q = res.get("queues_idle")
    if q:
        rows.append("| %s idle queues on one node of 3 | %s bytes/queue; node CPU %s idle, %s with a client "
                    "blocked elsewhere | — | — | — | — | — |" % (
                        "{:,}".format(q["queues"]), _rate(q["bytes_per_queue"], ""),
                        _pct(q["node_cpu_idle_pct"]), _pct(q["node_cpu_blocked_pct"])))  # fmt: skip

    diag = ["| Run | server CPU | client CPU | check |", "|---|---|---|---|"]
    for key, r in res.items():
        if key.startswith(("bus_", "fed_", "repl_", "queues_", "ref_repl_")):
            continue
        if key.startswith(("memory_", "ref_memory_")):
            diag.append("| %s | — | — | used_memory %s → %s bytes, %s jobs |" % (
                key, "{:,}".format(r["used_memory_before"]), "{:,}".format(r["used_memory_after"]),
                "{:,}".format(r["jobs"])))  # fmt: skip
            continue
        check = ""
        if "registered_jobs" in r:
            check = "registered_jobs=%d" % r["registered_jobs"]
        elif "left" in r:
            check = "served %d, %d left in the queue (never empty)" % (r["served"], r["left"])
        elif "cycles" in r:
            check = "%d cycles in %.1f s, %d empty GETs, p99.9 %s" % (
                r["cycles"],
                r["elapsed_s"],
                r["empty_gets"],
                _ms(r["p999_ms"]),
            )
        if r["client_cpu_pct"] >= CLIENT_BOUND_PCT:
            check = (check + "; " if check else "") + "**client-bound**"
        srv = r.get("server_cpu_pct")
        srv_text = "—" if srv is None else "%.0f%%" % srv
        diag.append("| %s | %s | %.0f%% | %s |" % (key, srv_text, r["client_cpu_pct"], check))

    if len(diag) == 2:
        diag = []
    out = [
        "Machine: %s cores, %s; Python %s (%s); %s; commit %s" % (
            machine["nproc"], machine["cpu_model"], machine["python"], machine.get("interpreter", "?"),
            machine["redis_benchmark"], machine["git_commit"]),
    ]  # fmt: skip
    if machine.get("disque_server"):
        out.append("Reference measured here: %s." % machine["disque_server"])
    if len(rows) > 2 or diag:
        out += [
            "Server pinned to CPU %s, load to CPU %s; redis-benchmark with %d clients, %d-byte body." % (
                SERVER_CPU, CLIENT_CPU, bench.clients, bench.body_size),
            "",
            *rows,
            "",
            *diag,
        ]  # fmt: skip
    bus = bus_report(bench)
    if bus:
        out += ["", *bus]
    repl = replication_report(bench)
    if repl:
        out += ["", *repl]
    fed = federation_report(bench)
    if fed:
        out += ["", *fed]
    if not bus and not repl and not fed and len(rows) == 2:
        out += ["", "(no results)"]
    bound = [k for k, r in res.items() if r.get("client_cpu_pct", 0) >= CLIENT_BOUND_PCT]
    if bound:
        out += [
            "",
            "Client-bound (the load generator used >= %d%% of its core, so these numbers are a floor "
            "for the server): %s." % (CLIENT_BOUND_PCT, ", ".join(bound)),
        ]
    if bench.notes:
        out += ["", *("Note: " + n for n in bench.notes)]
    return "\n".join(out) + "\n"


def check_tools(suites: list[str]) -> None:
    """Fail early and clearly on a missing tool; redis-server only skips the yardstick."""
    missing = []
    if any(s != "bus" for s in suites) and not shutil.which("taskset"):
        missing.append("taskset (util-linux) to pin the server and the load to separate CPUs")
    needs = ("addjob", "getjob", "memory", "redis", "replication")
    if any(s in suites for s in needs) and not shutil.which("redis-benchmark"):
        missing.append("redis-benchmark (apt-get install redis-tools), needed by: %s" % ", ".join(needs))
    if missing:
        raise BenchError("missing:\n  " + "\n  ".join(missing))
    if any(s != "bus" for s in suites) and (os.cpu_count() or 1) < 2:
        raise BenchError("needs at least 2 CPUs (server on CPU %s, load on CPU %s)" % (SERVER_CPU, CLIENT_CPU))


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["client"]:
        return client_main(argv[1:])
    if argv[:1] == ["fedclient"]:
        return fedclient_main(argv[1:])
    if argv[:1] == ["core"]:
        from .bench_core import core_main

        return core_main(argv[1:])
    if argv[:1] == ["spark"]:
        from .bench_spark import main as spark_main

        return spark_main(argv[1:])
    if argv[:1] == ["dashboard"]:
        from .dashboard import main as dashboard_main

        return dashboard_main(argv[1:])
    if argv[:1] == ["tasks"]:
        from .bench_tasks import main as tasks_main

        return tasks_main(argv[1:])
    if argv[:1] == ["client-lib"]:
        from .bench_client import main as client_lib_main

        client_lib_main(argv[1:])
        return 0
    p = argparse.ArgumentParser(
        prog="scripts/bench",
        description="Benchmark one disque-py node (CPU %s) with redis-benchmark and our own client (CPU %s); "
        "redis-server under the same load as a yardstick. `scripts/bench client --help` for the client alone, "
        "`scripts/bench core --help` for the core's CPU per job without I/O."
        % (SERVER_CPU, CLIENT_CPU),
    )  # fmt: skip
    p.add_argument("--quick", action="store_true", help="small n, 2 s of cycles, 50k-job memory: a smoke run")
    p.add_argument("--only", default=",".join(SUITES), help="comma-separated subset of: %s" % ",".join(SUITES))
    p.add_argument(
        "--base-port", type=int, default=17711, help="disque-py on this port, redis-server on the next (default 17711)"
    )
    p.add_argument("--write", metavar="FILE", help="JSON results file (default bench-results/<date>-<commit>.json)")
    p.add_argument("--duration", type=float, default=None, help="seconds of add->get->ack cycles (default 10, quick 2)")
    p.add_argument("--cycles-count", type=int, default=None, help="run a fixed number of cycles instead of a duration")
    p.add_argument("--conns", type=int, default=50, help="connections of the cycle client (default 50)")
    p.add_argument("--shared-queue", action="store_true", help="cycle client: one queue for all connections")
    p.add_argument("--bus-nodes", default=None, help="bus: node counts of the idle test (default 3,10,30; quick 3,10)")
    p.add_argument("--bus-window", type=float, default=None, help="bus: measurement window in s (default 20, quick 5)")
    p.add_argument("--bus-settle", type=float, default=None, help="bus: wait after the join, s (default 5, quick 2)")
    p.add_argument("--chain-runs", type=int, default=None, help="bus: chain-join repetitions (default 3, quick 1)")
    p.add_argument("--chain-nodes", type=int, default=None, help="bus: nodes in the chain join (default 10)")
    p.add_argument("--cluster-node-timeout", type=int, default=None, metavar="MS",
                   help="bus: cluster-node-timeout of every node (default: the server's, %d)" % DEFAULT_NODE_TIMEOUT)
    p.add_argument("--fed-rates", default=None,
                   help="federation: offered jobs/s of the fixed runs (default 50,500,5000; quick 50,500)")
    p.add_argument("--fed-replicates", type=_replicates, default=None,
                   help="federation: REPLICATE factors of the fixed runs (default 1,3)")
    p.add_argument("--fed-duration", type=float, default=None, help="federation: s per fixed run (default 10, quick 2)")
    p.add_argument("--fed-ramp-duration", type=float, default=None, help="federation: s per ramp step (default 5)")
    p.add_argument("--fed-ramp-start", type=float, default=None,
                   help="federation: first rate of the ramp (default 1000)")
    p.add_argument("--fed-no-ramp", action="store_true", help="federation: skip the max-rate ramps")
    p.add_argument("--fed-same-node", action="store_true",
                   help="federation: each fixed-rate run again with the producer on A, beside the consumers "
                        "(same-node delivery latency)")
    p.add_argument("--fed-consumers", type=int, default=10, help="federation: consumer connections on A (default 10)")
    p.add_argument("--disque-server", metavar="PATH", default=None,
                   help="a disque-server binary (Disque 1.0-rc1, built from github.com/antirez/disque at tag "
                        "1.0-rc1): the addjob, getjob, cycles and replication suites also run on it, under the "
                        "same load and pinning, and the report shows both")
    p.add_argument("--fed-layout", choices=("pair-per-core", "node-per-core", "one-core"), default="pair-per-core",
                   help="federation: pair-per-core (default) pins A to CPU %s and B to CPU %s with the load "
                        "generator, and lets the kernel run C on either CPU (the pair A, B a core each, as "
                        "deployed: the pair's own rate); node-per-core pins C to CPU %s beside B and the load "
                        "generator (with REPLICATE 3 the producer's node then shares its core with a replica "
                        "and the clients, the consumer's node with nothing); one-core pins A, B and C to CPU "
                        "%s, as the replication reference (what moving a job costs in total)"
                        % (SERVER_CPU, CLIENT_CPU, CLIENT_CPU, SERVER_CPU))
    p.add_argument("--fed-client-sched", choices=("batch", "normal"), default="batch",
                   help="federation: the load generator's scheduling policy. batch (default, SCHED_BATCH): a "
                        "reply that wakes it does not take the core from the node it shares it with, as a "
                        "client on another machine would not; normal: it does, at once (the figures before "
                        "this option)")
    p.add_argument("--fed-ramp-replicates", "--fed-ramp-replicate", type=_replicates, default=(1, 3),
                   help="federation: REPLICATE factors of the max-rate searches, comma-separated (default 1,3; "
                        "each adds a latency-bounded and a ceiling search, ~8 minutes)")
    p.add_argument("--fed-producers", type=int, default=None,
                   help="federation: producer connections (default 4 for REPLICATE 1, 32 for REPLICATE 2-3)")
    a = p.parse_args(argv)

    suites = [s.strip() for s in a.only.split(",") if s.strip()]
    unknown = sorted(set(suites) - set(SUITES))
    if unknown:
        p.error("unknown suite(s) %s; choose from %s" % (", ".join(unknown), ", ".join(SUITES)))
    sizes = Sizes.quick() if a.quick else Sizes()
    if a.duration is not None:
        sizes.duration = a.duration
    if a.bus_nodes:
        try:
            sizes.bus_nodes = tuple(int(x) for x in a.bus_nodes.split(",") if x.strip())
        except ValueError:
            p.error("--bus-nodes: comma-separated node counts, e.g. 3,10,30")
    for name in ("bus_window", "bus_settle", "chain_runs", "chain_nodes"):
        if getattr(a, name) is not None:
            setattr(sizes, name, getattr(a, name))
    if any(n < 2 for n in sizes.bus_nodes) or sizes.chain_nodes < 2 or sizes.chain_runs < 1:
        p.error("bus tests need at least 2 nodes and 1 chain run")
    try:
        if a.fed_rates:
            sizes.fed_rates = tuple(float(x) for x in a.fed_rates.split(",") if x.strip())
    except ValueError:
        p.error("--fed-rates: comma-separated numbers, e.g. 50,500,5000")
    if a.fed_replicates:
        sizes.fed_replicates = a.fed_replicates
    if any(r <= 0 for r in sizes.fed_rates):
        p.error("federation: rates must be > 0")
    for name in ("fed_duration", "fed_ramp_duration", "fed_ramp_start"):
        if getattr(a, name) is not None:
            if getattr(a, name) <= 0:
                p.error("--%s must be > 0" % name.replace("_", "-"))
            setattr(sizes, name, getattr(a, name))
    if a.fed_no_ramp:
        sizes.fed_ramp = False
    sizes.fed_same_node = a.fed_same_node
    if a.fed_consumers < 1 or (a.fed_producers is not None and a.fed_producers < 1):
        p.error("--fed-consumers and --fed-producers must be >= 1")
    if a.disque_server:
        found = shutil.which(a.disque_server)
        if not found:
            p.error("--disque-server %s: no such executable" % a.disque_server)
        a.disque_server = os.path.abspath(found)
    bus_max = max((*sizes.bus_nodes, sizes.chain_nodes)) if "bus" in suites else 0
    top = a.base_port + (BUS_PORT_SHIFT + bus_max - 1 if bus_max else 1)
    if "federation" in suites:
        top = max(top, a.base_port + FED_PORT_SHIFT + 2)
    if top + 10000 > 65535 or a.base_port < 1:
        p.error("--base-port %d leaves no room for the ports used (up to %d, cluster bus +10000)" % (a.base_port, top))

    signal.signal(signal.SIGTERM, _on_sigterm)
    try:
        check_tools(suites)
        ports = [a.base_port, a.base_port + 10000] + ([a.base_port + 1] if "redis" in suites else [])
        for i in range(bus_max):
            ports += [a.base_port + BUS_PORT_SHIFT + i, a.base_port + BUS_PORT_SHIFT + i + 10000]
        if "federation" in suites:
            for i in range(3):
                ports += [a.base_port + FED_PORT_SHIFT + i, a.base_port + FED_PORT_SHIFT + i + 10000]
        busy = [port for port in ports if port_in_use(port)]
        if busy:
            raise BenchError(
                "port(s) %s already in use (disque-py uses --base-port and +10000 for its "
                "cluster bus, redis-server --base-port + 1, the bus suite --base-port + %d ... + %d, the "
                "federation suite --base-port + %d ... + %d, each with +10000): pick another --base-port"
                % (", ".join(map(str, busy)), BUS_PORT_SHIFT, BUS_PORT_SHIFT + max(bus_max, 1) - 1,
                   FED_PORT_SHIFT, FED_PORT_SHIFT + 2)
            )  # fmt: skip
        machine = machine_info(sys.executable)
        if a.disque_server:
            machine["disque_server"] = "%s (%s)" % (a.disque_server, _run([a.disque_server, "--version"]))
        bench = Bench(sizes, a.base_port, conns=a.conns, cycles_count=a.cycles_count, shared_queue=a.shared_queue,
                      node_timeout=a.cluster_node_timeout, fed_consumers=a.fed_consumers,
                      fed_producers=a.fed_producers, disque_server=a.disque_server, fed_layout=a.fed_layout,
                      fed_client_sched=a.fed_client_sched, fed_ramp_replicates=a.fed_ramp_replicates)  # fmt: skip
        t0 = time.monotonic()
        try:
            steps: dict[str, Callable[[], None]] = {
                "addjob": bench.bench_addjob, "getjob": bench.bench_getjob, "cycles": bench.bench_cycles,
                "memory": bench.bench_memory, "redis": bench.bench_redis, "bus": bench.bench_bus,
                "replication": bench.bench_replication, "federation": bench.bench_federation,
                "queues": bench.bench_queues,
            }  # fmt: skip
            chosen = [name for name in SUITES if name in suites]
            with progress.bar(len(chosen), "scripts/bench") as bar:
                for name in chosen:
                    bar.doing(name)
                    steps[name]()
                    bar.done()
        finally:
            bench.stop_all()
    except BenchError as exc:
        print("scripts/bench: error: %s" % exc, file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print("scripts/bench: interrupted; every process started was stopped", file=sys.stderr)
        return 130

    report = markdown_report(bench, machine)
    sys.stdout.write(report)
    out = Path(a.write) if a.write else default_results_path(machine["git_commit"])
    write_results(out, machine, {"quick": a.quick, "suites": suites, "clients": bench.clients, "body_size": bench.body_size,
                  "conns": bench.conns, "shared_queue": bench.shared_queue, "sizes": sizes.__dict__,
                  "cluster_node_timeout": bench.node_timeout, "bus_port_shift": BUS_PORT_SHIFT,
                  "fed_port_shift": FED_PORT_SHIFT, "fed_consumers": bench.fed_consumers,
                  "fed_producers": bench.fed_producers, "fed_drain": bench.fed_drain,
                  "server_cpu": SERVER_CPU, "client_cpu": CLIENT_CPU}, bench, report, t0)
    log("raw results: %s (%.0f s)" % (out, time.monotonic() - t0))
    return 0


if __name__ == "__main__":
    sys.exit(main())
