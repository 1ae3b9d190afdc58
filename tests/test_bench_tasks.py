"""scripts/bench tasks: the disque-py side runs end to end (tasks sent, results checked) with a
few tasks. Speed is not asserted; dramatiq's side needs PyPI and is not run here."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def bench_tasks(tmp_path: Path, *options: str, timeout: float) -> tuple[dict, str]:
    """``scripts/bench tasks`` with a few tasks, unpinned: its results and its output."""
    out = tmp_path / "tasks.json"
    run = subprocess.run(
        [sys.executable, "-m", "benchmarks.bench", "tasks", *options, "--concurrency", "2", "--no-pin",
         "--write", str(out)],
        cwd=ROOT, env={"PYTHONPATH": "%s/scripts:%s" % (ROOT, ROOT), "PATH": "/usr/bin:/bin"},
        capture_output=True, text=True, timeout=timeout,
    )  # fmt: skip
    assert run.returncode == 0, run.stdout + run.stderr
    return json.loads(out.read_text())["results"], run.stdout


@pytest.mark.integration
@pytest.mark.timeout(180)
def test_the_disque_side_runs_three_ways_each_checked_on_or_off(tmp_path):
    # each side's producer fails the run if a result or its traces were not as the row says
    results, text = bench_tasks(tmp_path, "--otel", "--only", "disque", "--tasks", "50", "--latency", "2", timeout=170)
    assert sorted(results) == ["disque", "disque-no-otel", "disque-traced"]
    assert all(isinstance(r, dict) and r["tasks"] == 50 for r in results.values()), results
    assert all(r["tasks_per_s"] > 0 and r["rtt_median_ms"] > 0 for r in results.values()), results
    assert "traced / no opentelemetry: tasks/s" in text


def test_the_report_puts_both_sides_and_their_ratio():
    sys.path.insert(0, str(ROOT / "scripts"))
    from benchmarks.bench_tasks import report

    row = {"tasks_per_s": 2000.0, "send_per_s": 5000.0, "rtt_median_ms": 1.0, "rtt_p99_ms": 2.0,
           "producer_cpu_us": 100.0, "worker_cpu_us": 200.0, "broker_cpu_us": 50.0, "total_cpu_us": 350.0}  # fmt: skip
    text = report({"disque": row, "dramatiq": dict(row, tasks_per_s=1000.0, total_cpu_us=500.0)})
    assert "| disque | 2,000 |" in text and "| dramatiq | 1,000 |" in text
    assert "2.00x (target >= 1.0: met); CPU per task -150 us" in text
    assert "skipped: why" in report({"disque": "skipped: why"})
    beats = report({"disque": row, "disque-no-beats": dict(row, tasks_per_s=2500.0, worker_cpu_us=190.0)})
    assert "beats every 5 s / no beats: tasks/s 0.80x; CPU per task: producer +0 us, worker +10 us, broker +0 us" in beats
