"""scripts/bench smoke: 30 real node processes join, every node adds a job replicated 3 times, every
other node gets (and acks) a job added on another node, and a killed node is flagged failed by all
the others. About 20 s on the 2-core machine: the many-node run CI can afford."""

from __future__ import annotations

import pytest

from tests.benchrun import run_bench


@pytest.mark.integration
@pytest.mark.timeout(180)
def test_thirty_nodes_replicate_serve_across_and_flag_a_killed_node(tmp_path):
    result, _ = run_bench(tmp_path, "bench_smoke", "--nodes", "30", "--node-timeout", "2000", timeout=170)
    assert result["nodes"] == 30 and result["getjob_other_nodes"] == 15
    assert result["all_flag_fail_x_timeout"] >= 1.0  # never before the node timeout
