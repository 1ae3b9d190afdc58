"""scripts/bench nodes: an idle cluster's CPU and RSS per node beside Disque's, and blocked clients
connecting. Speed is not asserted: the figures are real and every client got blocked."""

from __future__ import annotations

import pytest

from tests.benchrun import run_bench


@pytest.mark.integration
@pytest.mark.timeout(120)
def test_two_idle_nodes_are_measured_and_blocked_clients_counted(tmp_path):
    results, stdout = run_bench(tmp_path, "bench_nodes", "--sizes", "2", "--settle", "0.5", "--window", "1",
                                "--clients", "50", timeout=110)  # fmt: skip
    [row] = results["idle"]
    ours = row["disque-py"]
    assert row["nodes"] == 2 and len(ours["cpu_ms_per_s"]) == 2
    # /proc counts CPU in 10 ms ticks: an idle node may show none in a 1 s window
    assert all(0 <= cpu < 1000 for cpu in ours["cpu_ms_per_s"]) and all(5 < rss < 500 for rss in ours["rss_mb"])
    assert results["clients"]["disque-py"]["clients"] == 50
    assert "| 2 | " in stdout and "50 clients, each connected and blocked" in stdout
