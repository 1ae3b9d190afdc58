"""``scripts/bench start`` (scripts/benchmarks/bench_start.py): one real start per way, its report and its raw
results (the figures themselves are measured, not tested)."""

from __future__ import annotations

import json

from benchmarks.bench_start import main

from .integration.conftest import free_port


def test_one_start_of_each_way_is_reported_with_its_wall_time_cpu_and_idle_rss(tmp_path, capsys):
    out = tmp_path / "start.json"
    argv = ["--runs", "1", "--only", "cluster,script,module", "--idle", "0.2", "--port", str(free_port()),
            "--write", str(out)]  # fmt: skip
    assert main(argv) == 0
    report = capsys.readouterr().out
    assert "| cluster | 1 |" in report and "| script | 1 |" in report and "| module | 1 |" in report
    results = json.loads(out.read_text())["results"]
    assert set(results) == {"cluster", "script", "module"}
    for way in results.values():
        assert "server" in way["argv"] and "--port" in way["argv"]
        assert len(way["ms"]) == 1 and way["ms"][0] > 0 and way["median_cpu_ms"] > 0
        assert way["rss_idle_kb"] > 1024  # a live Python process: megabytes
    # the cluster way is scripts/cluster's own command line: the console script, an admin page, a log file
    cluster = results["cluster"]["argv"]
    assert cluster[0].endswith("disque-py") and {"--admin-port", "--logfile", "--pidfile"} <= set(cluster)
    assert "disque_py.cli" in results["module"]["argv"]
