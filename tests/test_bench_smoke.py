"""scripts/bench smoke: 30 real node processes join, every node adds a job replicated 3 times, every
other node gets (and acks) a job added on another node, and a killed node is flagged failed by all
the others. About 20 s on the 2-core machine: the many-node run CI can afford."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.integration
@pytest.mark.timeout(180)
def test_thirty_nodes_replicate_serve_across_and_flag_a_killed_node(tmp_path):
    out = tmp_path / "smoke.json"
    run = subprocess.run(
        [sys.executable, "-m", "benchmarks.bench_smoke", "--nodes", "30", "--node-timeout", "2000",
         "--write", str(out)],
        cwd=ROOT, env=dict(os.environ, PYTHONPATH="%s/scripts:%s" % (ROOT, ROOT)), capture_output=True, text=True,
        timeout=170,
    )  # fmt: skip
    assert run.returncode == 0, run.stdout + run.stderr
    result = json.loads(out.read_text())["results"]
    assert result["nodes"] == 30 and result["getjob_other_nodes"] == 15
    assert result["all_flag_fail_x_timeout"] >= 1.0  # never before the node timeout
