"""examples/spark_pipeline.py, in-process: enqueue, consume (availableNow) and summary.

The example is documentation; this keeps it working. Its functions run with
the shared ``spark`` session against the 3-node ``cluster`` fixture.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

from tests.integration.conftest import wait_for
from tests.spark.test_source import jobs_left

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "spark_pipeline.py"


def load_example():
    spec = importlib.util.spec_from_file_location("spark_pipeline_example", EXAMPLE)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.timeout(180)
def test_pipeline_gives_every_item_a_result_and_acks_every_job(spark, cluster, nodes_option, queue, tmp_path):
    example = load_example()
    count = 200  # two micro-batches of 100
    assert example.enqueue(spark, nodes_option, queue, count) == count

    out, checkpoint = str(tmp_path / "results"), str(tmp_path / "checkpoint")
    query = example.consume(spark, nodes_option, queue, out, checkpoint, available_now=True,
                            max_jobs_per_trigger=100, timeout=120)  # fmt: skip
    assert not query.isActive and query.exception() is None

    counts = example.summary(spark, out, expected=count, show=0)
    assert counts["missing"] == 0
    assert counts["distinct_items"] == count
    # A healthy run delivers each job once (the write may add a job twice only if a task is retried).
    assert counts["distinct_ids"] >= count
    assert counts["rows"] == counts["distinct_ids"]

    results = spark.read.parquet(out).dropDuplicates(["id"]).collect()
    assert sorted(r.item for r in results) == list(range(count))
    for r in results:  # the work was done
        assert r.words == len(r.text.split(" ")) and 2 <= r.words <= 6
        assert r.letters == len(r.text.replace(" ", "")) and r.shout == r.text.upper()

    # Every job was acknowledged: none is left on any node, queued or active.
    wait_for(lambda: jobs_left(cluster, queue) == 0, 30, what="every job acknowledged")
