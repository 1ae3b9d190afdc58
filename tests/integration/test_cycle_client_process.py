"""The benchmarks' cycle client (scripts/benchmarks/cycle_client.py) against a real node: in batches
(``--batch``) each cycle adds, gets and acknowledges a whole batch, and every job it added is gone."""

from __future__ import annotations

import pytest
import redis

from benchmarks.cycle_client import run_cycles


@pytest.mark.integration
def test_batched_cycles_add_get_and_ack_every_job_of_each_batch(node):
    r = run_cycles(node.port, conns=3, count=6, batch=25, duration=None)
    assert r["batch"] == 25 and r["cycles"] == 6 * 25 and r["empty_gets"] == 0
    assert r["requests_per_s"] == pytest.approx(r["cycles_per_s"] / 25 * 27, rel=1e-3)
    c = redis.Redis(port=node.port)
    assert int(c.info("jobs")["registered_jobs"]) == 0  # each batch's ACKJOB acknowledged all it got
    one = run_cycles(node.port, conns=2, count=4, duration=None)
    assert one["batch"] == 1 and one["cycles"] == 4


def test_batches_are_disques_only():
    with pytest.raises(ValueError, match="batch must be 1, or more with kind='disque'"):
        run_cycles(1, kind="redis", batch=10)
    with pytest.raises(ValueError, match="batch must be 1"):
        run_cycles(1, batch=0)
