"""scripts/bench nodes: an idle cluster's CPU and RSS per node beside Disque's, and blocked clients
connecting. Speed is not asserted: the figures are real and every client got blocked."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.integration
@pytest.mark.timeout(120)
def test_two_idle_nodes_are_measured_and_blocked_clients_counted(tmp_path):
    out = tmp_path / "nodes.json"
    run = subprocess.run(
        [sys.executable, "-m", "benchmarks.bench_nodes", "--sizes", "2", "--settle", "0.5", "--window", "1",
         "--clients", "50", "--write", str(out)],
        cwd=ROOT, env=dict(os.environ, PYTHONPATH="%s/scripts:%s" % (ROOT, ROOT)), capture_output=True, text=True,
        timeout=110,
    )  # fmt: skip
    assert run.returncode == 0, run.stdout + run.stderr
    results = json.loads(out.read_text())["results"]
    [row] = results["idle"]
    ours = row["disque-py"]
    assert row["nodes"] == 2 and len(ours["cpu_ms_per_s"]) == 2
    assert all(0 < cpu < 1000 for cpu in ours["cpu_ms_per_s"]) and all(5 < rss < 500 for rss in ours["rss_mb"])
    assert results["clients"]["disque-py"]["clients"] == 50
    assert "| 2 | " in run.stdout and "50 clients, each connected and blocked" in run.stdout
