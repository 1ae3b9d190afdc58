"""The dashboard at the top of BENCHMARKS.md, printed from the raw results of one or more runs.

    scripts/bench dashboard RESULTS.json [AOF.json] [START.json] [NODES.json]
    PYTHONPATH=scripts python -m benchmarks.dashboard RESULTS.json [AOF.json] [START.json] [NODES.json]

RESULTS.json is what ``scripts/bench --only addjob,getjob,cycles,redis,replication --disque-server PATH``
wrote (into ``bench-results/``, or ``--write FILE``), AOF.json what ``scripts/bench aof --disque-server PATH``
wrote, START.json what ``scripts/bench start --disque-server PATH --write FILE`` wrote, NODES.json what
``scripts/bench nodes --disque-server PATH`` wrote (the per-node cost rows). Each headline load gets
one row: disque-py, Disque 1.0-rc1 and redis-server as they were measured in that same run, the ratios, and the ``scripts/bench`` command that gives the row. A figure a run did not
measure shows as "—". Prints Markdown to stdout, ready to paste; the exact load commands (redis-benchmark and
cycle-client lines) follow the table, from the results' ``commands``.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from pathlib import Path
from typing import Any

#: The placeholder row of the instructions-per-job figure (``scripts/bench instructions``), filled in by hand.
INSTRUCTIONS_ROW = ("| **Instructions per job** (`scripts/bench instructions`) | **see section Instructions per job** "
                    "| — | — | — | — | `scripts/bench instructions` |")  # fmt: skip

#: (label, our results key, Disque's key, redis-server's key and what it ran, unit, which suite command)
SINGLE = (
    ("ADDJOB unpipelined, 50 clients, one node", "addjob_p1", "redis_lpush_p1", "LPUSH", "/s", "addjob,redis"),
    ("ADDJOB -P 32, 50 clients, one node", "addjob_p32", "redis_lpush_p32", "LPUSH", "/s", "addjob,redis"),
    ("GETJOB NOHANG -P 32, 50 clients, one node", "getjob_p32", "redis_rpop_p32", "RPOP", "/s", "getjob,redis"),
    ("add→get→ack cycle, 50 connections (one cycle in flight each), one node", "cycles", "redis_cycles",
     "LPUSH→RPOP→DEL", " cycles/s", "cycles,redis"),
    ("add→get→ack cycle in batches of 100 (ADDJOB pipelined, GETJOB COUNT 100, one ACKJOB), 50 connections, one "
     "node", "cycles_batch", None, None, " jobs/s", "cycles"),
    ("ADDJOB REPLICATE 3, 50 clients, three nodes on one core", "repl_addjob", None, None, "/s", "replication"),
    ("add→get→ack cycle, REPLICATE 3, 50 connections, three nodes on one core", "repl_cycles", None, None,
     " cycles/s", "replication"),
)  # fmt: skip
#: AOF rows: (label, results key without the ``ref_`` prefix, the ``scripts/bench aof --only`` suite)
AOF = (
    ("ADDJOB, AOF `appendfsync everysec`, -P 1", "aof_everysec_p1", "throughput"),
    ("ADDJOB, AOF `appendfsync everysec`, -P 32", "aof_everysec_p32", "throughput"),
    ("ADDJOB, AOF `appendfsync always`, -P 1", "aof_always_p1", "throughput"),
    ("ADDJOB, AOF `appendfsync always`, -P 32", "aof_always_p32", "throughput"),
)


def _rate(r: dict[str, Any] | None) -> float | None:
    if not r:
        return None
    for k in ("cycles_per_s", "jobs_per_s", "requests_per_s"):
        if r.get(k) is not None:
            return float(r[k])
    return None


def _num(v: float | None, unit: str = "/s") -> str:
    return "—" if v is None else "{:,.0f}{}".format(v, unit)


def _ratio(a: float | None, b: float | None) -> str:
    return "—" if a is None or not b else "%.2f" % (a / b)


def load(paths: list[str]) -> list[dict[str, Any]]:
    runs = []
    for p in paths:
        try:
            runs.append(json.loads(Path(p).read_text()))
        except (OSError, ValueError) as exc:
            raise SystemExit("scripts/bench dashboard: cannot read %s: %s" % (p, exc)) from None
    return runs


def _is_aof(run: dict[str, Any]) -> bool:
    return any(k.startswith(("aof_", "ref_aof_")) for k in run.get("results", {}))


#: The ways of ``scripts/bench start`` the start row reads, first found first: the start a user sees
#: (``scripts/cluster``'s command line), then the plain console script (results written before it).
START_WAYS = ("cluster", "script")


def _start_way(run: dict[str, Any] | None) -> dict[str, Any]:
    res = (run or {}).get("results", {})
    return next((res[w] for w in START_WAYS if "median_ms" in res.get(w, {})), {})


def _is_start(run: dict[str, Any]) -> bool:
    """What ``scripts/bench start --write FILE`` wrote (exec to first PONG)."""
    return bool(_start_way(run))


def start_row(run: dict[str, Any] | None) -> str:
    """The start row: ``disque-py server`` (the console script, as ``scripts/cluster`` starts it) from exec to
    its first PONG, and its RSS once idle, beside Disque's. Its ratio is Disque's time over ours, so that above
    1 still reads "disque-py did better"."""
    ours, ref = _start_way(run), (run or {}).get("results", {}).get("disque", {})
    o, d = ours.get("median_ms"), ref.get("median_ms")
    runs = len(ours.get("ms", []))
    command = "`scripts/bench start%s`" % (" --disque-server $DISQUE" if d is not None else "") if run else "—"
    figure = "—"
    if o is not None:
        figure = "%.0f ms (CPU %.0f ms)" % (o, ours.get("median_cpu_ms", 0))
        if "rss_idle_kb" in ours:
            figure += ", idle RSS %.1f MB" % (ours["rss_idle_kb"] / 1024)
    return "| Start: exec to first PONG, fresh node, median of %s starts (ratio: Disque's time / ours) | %s | %s | " \
           "%s | not run | — | %s |" % (
               runs or "—", figure, "%.1f ms" % d if d is not None else "—", _ratio(d, o), command)  # fmt: skip


def _is_nodes(run: dict[str, Any]) -> bool:
    """What ``scripts/bench nodes --write FILE`` wrote (an idle cluster's cost per node, blocked clients)."""
    return "idle" in run.get("results", {}) and "clients" in run.get("results", {})


def nodes_rows(run: dict[str, Any] | None) -> list[str]:
    """The per-node cost rows of ``scripts/bench nodes``: idle CPU and RSS per node at each size, and the time
    blocked clients took to connect, beside Disque's in the same window (lower is better in every row)."""
    if run is None:
        return []
    res = run["results"]
    d = " --disque-server $DISQUE" if run.get("machine", {}).get("disque_server") else ""
    o = run.get("options", {})
    window = "%g s after %g s" % (o.get("window", 20), o.get("settle", 15))
    rows = []
    for row in res["idle"]:
        ours, ref = row.get("disque-py", {}), row.get("disque", {})
        n = row["nodes"]
        cmd = "`scripts/bench nodes --sizes %d --clients 0%s`" % (n, d)
        rows.append("| Idle CPU per node, %d nodes joined, %s (ms/s: lower is better) | %s | %s | %s | — | — | %s |" % (
            n, window, "%.2f ms/s" % ours["mean_cpu_ms_per_s"] if ours else "—",
            "%.2f ms/s" % ref["mean_cpu_ms_per_s"] if ref else "—",
            _ratio(ours.get("mean_cpu_ms_per_s"), ref.get("mean_cpu_ms_per_s")), cmd))  # fmt: skip
    for row in res["idle"][-1:]:
        ours, ref = row.get("disque-py", {}), row.get("disque", {})
        rows.append("| Idle RSS per node, %d nodes joined (lower is better) | %s | %s | %s | — | — | %s |" % (
            row["nodes"], "%.1f MB" % ours["mean_rss_mb"] if ours else "—",
            "%.1f MB" % ref["mean_rss_mb"] if ref else "—", _ratio(ours.get("mean_rss_mb"), ref.get("mean_rss_mb")),
            "`scripts/bench nodes --sizes %d --clients 0%s`" % (row["nodes"], d)))  # fmt: skip
    clients = res["clients"]
    if clients:
        ours, ref = clients.get("disque-py", {}), clients.get("disque", {})
        count = (ours or ref)["clients"]
        rows.append("| %s clients connecting, each blocked in GETJOB on its own queue (s: lower is better) | %s | %s "
                    "| %s | — | — | `scripts/bench nodes --sizes '' --clients %d%s` |" % (
                        "{:,}".format(count), "%.2f s" % ours["all_blocked_s"] if ours else "—",
                        "%.2f s" % ref["all_blocked_s"] if ref else "—",
                        _ratio(ours.get("all_blocked_s"), ref.get("all_blocked_s")), count, d))  # fmt: skip
    return rows


def _bench_command(run: dict[str, Any], only: str) -> str:
    o = run.get("options", {})
    argv = ["scripts/bench"] + (["--quick"] if o.get("quick") else []) + ["--only", only]
    sizes = o.get("sizes", {})
    if only.startswith("cycles") or only == "replication":
        if not o.get("quick") and sizes.get("duration") not in (None, 10.0):
            argv += ["--duration", "%g" % sizes["duration"]]
        if o.get("conns", 50) != 50:
            argv += ["--conns", str(o["conns"])]
    if run.get("machine", {}).get("disque_server"):
        argv += ["--disque-server", "$DISQUE"]
    return "`%s`" % " ".join(argv)


def _aof_command(run: dict[str, Any], only: str) -> str:
    o = run.get("options", {})
    argv = ["scripts/bench", "aof"] + (["--quick"] if o.get("quick") else []) + ["--only", only]
    if run.get("machine", {}).get("disque_server"):
        argv += ["--disque-server", "$DISQUE"]
    if only == "throughput" and "redis-server" in o.get("servers", ()):
        argv += ["--servers", ",".join(o["servers"])]
    if not o.get("quick"):
        defaults = {"n_p1": 100_000, "n_p32": 500_000, "rounds": 2} if only == "throughput" else {
            "load_jobs": 1_000_000}
        for k, d in defaults.items():
            if o.get(k) not in (None, d):
                argv += ["--" + {"load_jobs": "jobs"}.get(k, k.replace("_", "-")), str(o[k])]
    return "`%s`" % " ".join(argv)


def _when(run: dict[str, Any]) -> str:
    m = run.get("machine", {})
    date = str(m.get("date", "?")).replace("T", " ").replace("+00:00", " UTC")
    date = re.sub(r"(\d\d:\d\d):\d\d", r"\1", date)
    commit = str(m.get("git_commit") or "?")
    return "%s, commit `%s`" % (date, commit[:7] + ("-dirty" if commit.endswith("-dirty") else ""))


def dashboard(runs: list[dict[str, Any]]) -> str:
    """The dashboard table and its header lines, in Markdown."""
    start = next((r for r in reversed(runs) if _is_start(r)), None)
    nodes = next((r for r in reversed(runs) if _is_nodes(r)), None)
    runs = [r for r in runs if not _is_start(r) and not _is_nodes(r)]
    main = next((r for r in reversed(runs) if not _is_aof(r)), None)
    aofs = [r for r in runs if _is_aof(r)]
    # the throughput rows and the load row each from the last AOF run that has them (a run may be one suite)
    thr = next((r for r in reversed(aofs) if any(k in r["results"] for _, k, _ in AOF)), None)
    lrun = next((r for r in reversed(aofs) if "aof_load" in r["results"]), None)
    aof = thr or lrun
    first = main or aof or nodes
    if first is None:
        return "(no results)\n"
    m = first["machine"]
    o = first.get("options", {})
    out = ["Measured %s on %s cores, `%s` (model name from /proc/cpuinfo), Python %s (%s), %s; the node pinned to "
           "CPU %s (`taskset -c %s`), the load to CPU %s." % (
               _when(first), m.get("nproc"), m.get("cpu_model"), m.get("python"), m.get("interpreter", "?"),
               m.get("redis_benchmark"), o.get("server_cpu", "0"), o.get("server_cpu", "0"),
               o.get("client_cpu", "1"))]  # fmt: skip
    if thr is lrun:
        if main and aof and _when(aof) != _when(main):
            out.append("AOF rows: %s." % _when(aof))
    else:
        for run, what in ((thr, "AOF ADDJOB rows"), (lrun, "AOF load row")):
            if run and (main is None or _when(run) != _when(main)):
                out.append("%s: %s." % (what, _when(run)))
    if m.get("disque_server"):
        version = re.search(r"v=\S+ sha=[0-9a-f]+", m["disque_server"])
        out.append("Disque 1.0-rc1 (`disque-server` %s, `$DISQUE` below) measured in the same runs, each test "
                   "right after ours." % (version.group(0) if version else m["disque_server"]))
    if m.get("redis_server"):
        out.append("redis-server: %s, same runs, same load (LPUSH for ADDJOB, RPOP for GETJOB)."
                   % m["redis_server"].split(" sha=")[0])
    if any(r.get("options", {}).get("quick") for r in (main, thr, lrun) if r):
        out.append("**Smoke run (`--quick`): small n, not a measurement.**")
    out += ["", "| Load | disque-py | Disque 1.0-rc1 | ours / Disque | redis-server, same run | ours / redis | Command |",
            "|---|---|---|---|---|---|---|"]  # fmt: skip
    res = (main or {}).get("results", {})
    for label, key, rkey, rname, unit, only in SINGLE:
        ours, ref = _rate(res.get(key)), _rate(res.get("ref_" + key))
        red = _rate(res.get(rkey)) if rkey else None
        out.append("| %s | %s | %s | %s | %s | %s | %s |" % (
            label, _num(ours, unit), _num(ref, unit), _ratio(ours, ref),
            ("%s %s" % (rname, _num(red, unit)) if red is not None else "—") if rkey else "no such load",
            _ratio(ours, red), _bench_command(main, only) if main else "—"))  # fmt: skip
    for key in sorted((k for k in res if k.startswith("memory_")), key=lambda k: int(k.split("_")[1])):
        mem, dmem = res[key], res.get("ref_" + key)

        def _bytes(r: dict[str, Any] | None) -> str:
            if not r or r.get("rss_bytes_per_job") is None:
                return "—"
            return "%.0f B RSS (used_memory %.0f B)" % (r["rss_bytes_per_job"], r["bytes_per_job"])

        ratio = ("%.2f (bytes: lower is better)" % (mem["rss_bytes_per_job"] / dmem["rss_bytes_per_job"])
                 if dmem and mem.get("rss_bytes_per_job") and dmem.get("rss_bytes_per_job") else "—")
        out.append("| Memory per job, %s jobs of %d bytes, one node | %s | %s | %s | — | — | %s |" % (
            "{:,}".format(mem["jobs"]), mem["body_size"], _bytes(mem), _bytes(dmem), ratio,
            _bench_command(main, "memory") if main else "—"))  # fmt: skip
    ares = (thr or {}).get("results", {})
    for label, key, only in AOF:
        ours, ref, red = _rate(ares.get(key)), _rate(ares.get("ref_" + key)), _rate(ares.get("redis_" + key))
        out.append("| %s | %s | %s | %s | %s | %s | %s |" % (
            label, _num(ours), _num(ref), _ratio(ours, ref), "LPUSH " + _num(red) if red is not None else "not run",
            _ratio(ours, red), _aof_command(thr, only) if thr else "—"))  # fmt: skip
    lres = (lrun or {}).get("results", {})
    ld, rld = lres.get("aof_load"), lres.get("ref_aof_load")
    jobs = (ld or rld or {}).get("jobs")
    out.append("| AOF load%s, to the last job registered | %s | %s | %s | not run | — | %s |" % (
        " of {:,} jobs".format(jobs) if jobs else "", _num(_rate(ld), " jobs/s"), _num(_rate(rld), " jobs/s"),
        _ratio(_rate(ld), _rate(rld)), _aof_command(lrun, "load") if lrun else "—"))  # fmt: skip
    out.append(start_row(start))
    out += nodes_rows(nodes)
    if nodes is not None and (main is None or _when(nodes) != _when(main)):
        out.insert(1, "Per-node cost rows: %s (`scripts/bench nodes`, nodes not pinned, both clusters in the same "
                      "window)." % _when(nodes))  # fmt: skip
    out.append(INSTRUCTIONS_ROW)
    used = [r for r in (main, thr, lrun) if r is not None]
    cmds = [c for run in used for c in run.get("commands", [])
            if "redis-benchmark" in c or " client " in c]  # fmt: skip
    cmds = list(dict.fromkeys(cmds))
    if cmds:
        size = int(o.get("body_size", 100))
        others: set[int] = set()

        def body(m: re.Match[str]) -> str:
            n = len(m.group(0))
            if n == size:
                return "$BODY"
            others.add(n)
            return "$BODY_%d" % n

        lines: list[str] = []
        for c in cmds:
            c = re.sub(r"\S*/(\.venv/bin/)", r"\1", re.sub(r"(?<=\s)x{16,}(?=\s|$)", body, c))
            if c not in lines:
                lines.append(c)
        bodies = "; ".join(["$BODY is %d × x" % size] + ["$BODY_%d %d × x" % (n, n) for n in sorted(others)])
        out += ["", "<details><summary>The exact loads of these runs (from the results' <code>commands</code>; "
                "%s)</summary>" % bodies, "", "```sh", *lines, "```", "", "</details>"]  # fmt: skip
    return "\n".join(out) + "\n"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="scripts/bench dashboard",
                                description="Print the BENCHMARKS.md dashboard table (Markdown) from the raw results "
                                "of scripts/bench (the addjob, getjob, cycles, redis and replication suites, with "
                                "--disque-server) and of scripts/bench aof (with --disque-server).")  # fmt: skip
    p.add_argument("results", nargs="+", metavar="RESULTS.json", help="raw results files (bench-results/*.json)")
    a = p.parse_args(sys.argv[1:] if argv is None else argv)
    sys.stdout.write(dashboard(load(a.results)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
