"""``scripts/bench start`` (scripts/benchmarks/bench_start.py): one real start per way, its report and its raw
results (the figures themselves are measured, not tested)."""

from __future__ import annotations

import json

from benchmarks.bench_start import main

from .integration.conftest import free_port


def test_one_start_of_each_way_is_reported_with_its_wall_time_and_cpu(tmp_path, capsys):
    out = tmp_path / "start.json"
    assert main(["--runs", "1", "--only", "script,module", "--port", str(free_port()), "--write", str(out)]) == 0
    report = capsys.readouterr().out
    assert "| script | 1 |" in report and "| module | 1 |" in report
    results = json.loads(out.read_text())["results"]
    assert set(results) == {"script", "module"}
    for way in results.values():
        assert way["argv"][-2:] == ["disque_py.cli", "server"] or way["argv"][-1] == "server"
        assert len(way["ms"]) == 1 and way["ms"][0] > 0 and way["median_cpu_ms"] > 0
