"""scripts/bench workers: simulated workers beat to a real node, every one of them is listed at the
end, and the report says what the beats cost. Speed is not asserted."""

from __future__ import annotations

import json
import sys

import pytest

from tests.benchrun import ROOT, run_bench


@pytest.mark.integration
@pytest.mark.timeout(120)
def test_simulated_workers_beat_and_are_all_listed(tmp_path):
    results, stdout = run_bench(tmp_path, "bench_workers", "--workers", "5", "--interval", "0.5", "--duration", "1",
                                "--rounds", "1", timeout=110)  # fmt: skip
    [row] = results["rounds"]
    assert row["listed"] == 5 and row["beats"] >= 5 and row["pings"] >= 5
    assert "the beats' cost" in stdout and "5 simulated workers beating every 0.5 s" in stdout


def test_a_beat_is_what_a_worker_sends_and_fits_the_node():
    sys.path.insert(0, str(ROOT / "scripts"))
    from benchmarks.bench_workers import beat_bodies

    from disque_py.server.workers import MAX_INFO

    bodies = beat_bodies(3, 5.0)
    assert len({worker_id for worker_id, _ in bodies}) == 3
    for _, info in bodies:
        obj = json.loads(info)
        assert len(info) < MAX_INFO and len(obj["running"]) == 4 and obj["concurrency"] == 8
