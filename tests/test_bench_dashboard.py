"""``scripts/bench dashboard`` (scripts/benchmarks/dashboard.py): the BENCHMARKS.md dashboard printed from raw
results files, each row beside Disque and redis-server from the same run, with its ratios and its command."""

import json

import pytest

from benchmarks.bench import main as bench_main
from benchmarks.dashboard import INSTRUCTIONS_ROW, dashboard

MACHINE = {"nproc": 2, "cpu_model": "AMD EPYC", "python": "3.11.7", "interpreter": "/usr/bin/python3.11",
           "redis_benchmark": "redis-benchmark 7.0.15", "git_commit": "1f307475793a6036c31fc7f0cf346c4b59390882",
           "date": "2026-11-28T13:17:36+00:00", "redis_server": "Redis server v=7.0.15 sha=00000000:0",
           "disque_server": "/x/disque-server (Disque server v=1.0-rc1 sha=7dad5666:0 malloc=jemalloc-4.0.3)"}  # fmt: skip
BODY = "x" * 100


def _main_run(quick: bool = False) -> dict:
    return {
        "machine": MACHINE,
        "options": {"quick": quick, "server_cpu": "0", "client_cpu": "1", "conns": 50, "body_size": 100,
                    "sizes": {"duration": 10.0}},
        "results": {
            "addjob_p1": {"requests_per_s": 30000.0}, "ref_addjob_p1": {"requests_per_s": 60000.0},
            "redis_lpush_p1": {"requests_per_s": 40000.0},
            "cycles": {"cycles_per_s": 5000.0, "requests_per_s": 15000.0},
            "ref_cycles": {"cycles_per_s": 20000.0, "requests_per_s": 60000.0},
            "cycles_batch": {"cycles_per_s": 150000.0, "batch": 100},
            "ref_cycles_batch": {"cycles_per_s": 300000.0, "batch": 100},
            "repl_addjob": {"requests_per_s": 7000.0},
        },
        "commands": ["taskset -c 1 redis-benchmark -h 127.0.0.1 -p 17711 -c 50 -n 100000 -P 1 -q ADDJOB q %s 0" % BODY,
                     "taskset -c 1 /home/me/disque-py/.venv/bin/python -m benchmarks.bench client --port 17711",
                     "taskset -c 0 .venv/bin/disque-py server --port 17711"],
    }  # fmt: skip


def _aof_run() -> dict:
    return {
        "machine": dict(MACHINE, date="2026-11-28T13:30:00+00:00"),
        "options": {"quick": False, "n_p1": 20000, "n_p32": 100000, "rounds": 2, "load_jobs": 1000000,
                    "servers": ["disque-py", "disque", "redis-server"]},
        "results": {"aof_everysec_p1": {"runs": [], "requests_per_s": 20000.0},
                    "ref_aof_everysec_p1": {"runs": [], "requests_per_s": 40000.0},
                    "redis_aof_everysec_p1": {"runs": [], "requests_per_s": 80000.0},
                    "aof_load": {"jobs": 1000000, "jobs_per_s": 80000},
                    "ref_aof_load": {"jobs": 1000000, "jobs_per_s": 160000}},
        "commands": [],
    }  # fmt: skip


def _row(text: str, label: str) -> list[str]:
    [line] = [ln for ln in text.splitlines() if ln.startswith("| " + label)]
    return [c.strip() for c in line.strip("|").split("|")]


def test_each_row_sits_beside_disque_and_redis_of_the_same_run_with_ratios_and_its_command():
    text = dashboard([_main_run(), _aof_run()])
    assert "commit `1f30747`" in text and "2 cores, `AMD EPYC`" in text and "Python 3.11.7" in text
    assert "2026-11-28 13:17 UTC" in text and "AOF rows: 2026-11-28 13:30 UTC" in text
    assert "`taskset -c 0`" in text and "v=1.0-rc1 sha=7dad5666" in text
    assert _row(text, "ADDJOB unpipelined") == [
        "ADDJOB unpipelined, 50 clients, one node", "30,000/s", "60,000/s", "0.50", "LPUSH 40,000/s", "0.75",
        "`scripts/bench --only addjob,redis --disque-server $DISQUE`"]  # fmt: skip
    cyc = _row(text, "add→get→ack cycle, 50")
    assert cyc[1:5] == ["5,000 cycles/s", "20,000 cycles/s", "0.25", "—"]  # no redis cycles in this run
    batched = _row(text, "add→get→ack cycle in batches of 100")
    assert batched[1:5] == ["150,000 jobs/s", "300,000 jobs/s", "0.50", "no such load"]
    repl = _row(text, "ADDJOB REPLICATE 3")
    assert repl[1:6] == ["7,000/s", "—", "—", "no such load", "—"]
    aof = _row(text, "ADDJOB, AOF `appendfsync everysec`, -P 1")
    assert aof[1:6] == ["20,000/s", "40,000/s", "0.50", "LPUSH 80,000/s", "0.25"]
    assert aof[6] == ("`scripts/bench aof --only throughput --disque-server $DISQUE --servers "
                      "disque-py,disque,redis-server --n-p1 20000 --n-p32 100000`")
    assert _row(text, "ADDJOB, AOF `appendfsync always`, -P 1")[4:6] == ["not run", "—"]
    load = _row(text, "AOF load")
    assert load[1:5] == ["80,000 jobs/s", "160,000 jobs/s", "0.50", "not run"]
    assert load[6] == "`scripts/bench aof --only load --disque-server $DISQUE`"
    assert INSTRUCTIONS_ROW in text and "see section Instructions per job" in INSTRUCTIONS_ROW
    # the exact loads: the body and the checkout's path left out, the server lines too
    assert "-P 1 -q ADDJOB q $BODY 0" in text and BODY not in text
    assert "taskset -c 1 .venv/bin/python -m benchmarks.bench client --port 17711" in text
    assert "/home/me" not in text and "disque-py server" not in text


def test_a_quick_run_says_so_and_a_missing_file_fails_clearly(tmp_path, capsys):
    path = tmp_path / "r.json"
    path.write_text(json.dumps(_main_run(quick=True)))
    assert bench_main(["dashboard", str(path)]) == 0
    out = capsys.readouterr().out
    assert "Smoke run (`--quick`)" in out and "`scripts/bench --quick --only addjob,redis" in out
    assert _row(out, "ADDJOB, AOF `appendfsync always`, -P 32")[1:4] == ["—", "—", "—"]
    with pytest.raises(SystemExit, match="cannot read"):
        bench_main(["dashboard", str(tmp_path / "none.json")])


def test_the_aof_rows_come_from_the_last_run_that_has_them():
    older = _aof_run()
    newer = _aof_run()
    newer["machine"] = dict(MACHINE, date="2026-11-28T14:00:00+00:00", git_commit="abcdef0" + "0" * 33)
    del newer["results"]["aof_load"], newer["results"]["ref_aof_load"]  # a throughput-only run
    newer["results"]["aof_everysec_p1"] = {"runs": [], "requests_per_s": 30000.0}
    text = dashboard([_main_run(), older, newer])
    assert _row(text, "ADDJOB, AOF `appendfsync everysec`, -P 1")[1] == "30,000/s"
    assert _row(text, "AOF load")[1] == "80,000 jobs/s"
    assert "AOF ADDJOB rows: 2026-11-28 14:00 UTC, commit `abcdef0`." in text
    assert "AOF load row: 2026-11-28 13:30 UTC, commit `1f30747`." in text


def test_the_start_row_comes_from_a_start_run_with_disques_time_over_ours():
    start = {"machine": MACHINE, "results": {
        "script": {"argv": [], "ms": [120.0, 125.0, 130.0], "median_ms": 125.0, "cpu_ms": [1.0], "median_cpu_ms": 110.0},
        "disque": {"argv": [], "ms": [5.0, 5.0, 5.0], "median_ms": 5.0}}}  # fmt: skip
    text = dashboard([_main_run(), start])
    row = _row(text, "Start: exec to first PONG")
    assert row[1:5] == ["125 ms (CPU 110 ms)", "5.0 ms", "0.04", "not run"]
    assert row[6] == "`scripts/bench start --disque-server $DISQUE`"
    assert _row(text, "ADDJOB unpipelined")[1] == "30,000/s"  # the start run is not taken for the main one
    assert _row(dashboard([_main_run()]), "Start: exec")[1:4] == ["—", "—", "—"]


def test_the_start_row_reads_the_start_scripts_cluster_makes_with_its_idle_rss():
    start = {"machine": MACHINE, "results": {
        "cluster": {"argv": [], "ms": [90.0, 95.0, 99.0], "median_ms": 95.0, "median_cpu_ms": 80.0, "rss_idle_kb": 20480},
        "script": {"argv": [], "ms": [120.0, 125.0, 130.0], "median_ms": 125.0, "median_cpu_ms": 110.0}}}  # fmt: skip
    row = _row(dashboard([_main_run(), start]), "Start: exec to first PONG")
    assert row[1:4] == ["95 ms (CPU 80 ms), idle RSS 20.0 MB", "—", "—"]


def test_the_memory_row_sets_our_rss_per_job_against_disques_of_the_same_run():
    run = _main_run()
    run["results"]["memory_1000000"] = {"jobs": 1000000, "body_size": 100, "bytes_per_job": 661.0,
                                        "rss_bytes_per_job": 657.0}
    run["results"]["ref_memory_1000000"] = {"jobs": 1000000, "body_size": 100, "bytes_per_job": 547.0,
                                            "rss_bytes_per_job": 550.0}  # fmt: skip
    mem = _row(dashboard([run]), "Memory per job")
    assert mem[1:4] == ["657 B RSS (used_memory 661 B)", "550 B RSS (used_memory 547 B)",
                        "1.19 (bytes: lower is better)"]  # fmt: skip
    assert mem[6] == "`scripts/bench --only memory --disque-server $DISQUE`"
    del run["results"]["ref_memory_1000000"]
    assert _row(dashboard([run]), "Memory per job")[2:4] == ["—", "—"]


def _nodes_run() -> dict:
    return {
        "machine": dict(MACHINE, date="2026-12-06T07:13:49+00:00"),
        "options": {"settle": 15.0, "window": 20.0, "clients": 8000},
        "results": {
            "idle": [{"nodes": 5, "disque-py": {"mean_cpu_ms_per_s": 0.71, "mean_rss_mb": 32.5},
                      "disque": {"mean_cpu_ms_per_s": 1.10, "mean_rss_mb": 3.4}},
                     {"nodes": 20, "disque-py": {"mean_cpu_ms_per_s": 1.32, "mean_rss_mb": 32.8},
                      "disque": {"mean_cpu_ms_per_s": 1.08, "mean_rss_mb": 3.5}}],
            "clients": {"disque-py": {"clients": 8000, "all_blocked_s": 2.18},
                        "disque": {"clients": 8000, "all_blocked_s": 2.23}},
        },
    }  # fmt: skip


def test_the_per_node_cost_rows_come_from_a_nodes_run_beside_disque_in_the_same_window():
    text = dashboard([_main_run(), _nodes_run()])
    assert "Per-node cost rows: 2026-12-06 07:13 UTC" in text
    assert _row(text, "Idle CPU per node, 5 nodes") == [
        "Idle CPU per node, 5 nodes joined, 20 s after 15 s (ms/s: lower is better)", "0.71 ms/s", "1.10 ms/s",
        "0.65", "—", "—", "`scripts/bench nodes --sizes 5 --clients 0 --disque-server $DISQUE`"]  # fmt: skip
    assert _row(text, "Idle CPU per node, 20 nodes")[1:4] == ["1.32 ms/s", "1.08 ms/s", "1.22"]
    assert _row(text, "Idle RSS per node, 20 nodes")[1:4] == ["32.8 MB", "3.5 MB", "9.37"]
    assert _row(text, "8,000 clients connecting")[1:4] == ["2.18 s", "2.23 s", "0.98"]
    assert dashboard([_main_run()]).count("Idle CPU") == 0  # no nodes run: no such rows
