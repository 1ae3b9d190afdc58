"""scripts/bench groups: plain, grouped and beside-a-backlog cycles on a real node, a group at its
CONCURRENCY and RATE limits on one node and on three. Speed is not asserted; the limits are (a
run never delivers more than its limit allows), and every figure carries its command."""

from __future__ import annotations

import pytest

from tests.benchrun import run_bench

pytestmark = pytest.mark.xdist_group("bench-ports")


@pytest.mark.integration
@pytest.mark.timeout(240)
def test_groups_bench_runs_every_suite_within_the_limits(tmp_path):
    from tests.integration.conftest import consecutive_free_ports

    hold_ms, n, rate, seconds = 20, 5, 50, 1
    results, stdout = run_bench(
        tmp_path, "bench_groups", "--base-port", str(consecutive_free_ports(256)), "--conns", "5", "--duration", "1",
        "--rounds", "1", "--layouts", "shared", "--backlog", "300", "--concurrency", str(n), "--hold-ms", str(hold_ms),
        "--limit-duration", str(seconds), "--rate", str(rate), "--rate-duration", str(seconds), timeout=230,
    )  # fmt: skip
    [cycles] = results["cycles"]["shared"]
    assert all(cycles[k]["cycles_per_s"] > 0 and cycles[k]["cycles"] > 0 for k in ("plain", "groups", "beside"))
    assert cycles["groups"]["groups"] == 10 and cycles["plain"]["groups"] == 0
    # the held group's jobs waited through the whole run: one delivered to the holder, none to the cycles
    assert cycles["backlog"] == 299 and cycles["backlog_after"] == 299
    assert any("--groups 10" in c for c in cycles["commands"]) and any("--shared-queue" in c for c in cycles["commands"])
    conc = {row["nodes"]: row for row in results["concurrency"]}
    rated = {row["nodes"]: row for row in results["rate"]}
    assert set(conc) == set(rated) == {1, 3}
    for row in conc.values():
        # n slots, each job held hold_ms: no more than n per hold_ms (plus the ones in flight at the start)
        assert 0 < row["deliveries"] <= n * (1 + 1000 * seconds / hold_ms)
        assert len(row["by_node"]) == row["nodes"] and any("--consume limited" in c for c in row["commands"])
    for row in rated.values():
        # r a second plus a burst of one second's worth
        assert 0 < row["deliveries"] <= rate * (seconds + 1) + row["nodes"]
    assert "| shared | 1 |" in stdout and "CONCURRENCY n" in stdout and "RATE r" in stdout
