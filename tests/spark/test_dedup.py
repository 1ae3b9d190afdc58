"""``dedupColumn``: exactly once into the queue, on the standalone cluster (conftest).

A task that fails after its first attempt added jobs is retried by Spark; the
same write is then run again: the queue holds each row once. Counted on every
node (QLEN: a job queued twice would be counted twice) and by ID (JSCAN).
"""

from __future__ import annotations

import pytest

from disque_py.client import Client
from disque_py.core.ids import dedup_job_id
from tests.integration.conftest import wait_for
from tests.spark.test_source import node_clients, queued, read, stream

ROWS = 64_000
PARTS = 4
FAILING_PART = 1
# The failing attempt waits for its row CHECK_ROW to be a job, and fails at its row FAIL_ROW (of
# the partition's 16,000). The rows reach the sink's Python worker in batches of 10,000 (Spark's
# Arrow batches): FAIL_ROW must be past the first batch, which holds CHECK_ROW, or the attempt
# waits for a row the sink cannot have yet.
CHECK_ROW = 5_000
FAIL_ROW = 15_000


def ids_everywhere(cluster, queue: str) -> set[str]:
    ids: set[str] = set()
    for c in node_clients(cluster):
        with c:
            ids.update(j["id"] for j in c.jscan(queue=queue, reply="all") if j["state"] != "acked")
    return ids


def rows_failing_first_attempt(nodes_option: str, queue: str, marker: str):
    """A mapPartitions function making (key, body) rows: the first attempt of partition
    FAILING_PART yields FAIL_ROW rows, waits until its row CHECK_ROW is a job in the queue (so the
    attempt has added jobs), then raises. Every other attempt yields its rows."""

    def run(numbers):
        from pyspark import TaskContext

        ctx = TaskContext.get()
        failing = ctx.partitionId() == FAILING_PART and ctx.attemptNumber() == 0
        for n, i in enumerate(numbers):
            yield ("order-%d" % i, "work-%d" % i)
            if failing and n == CHECK_ROW:
                check = "order-%d" % i
            if failing and n == FAIL_ROW:
                job_id = dedup_job_id(queue.encode(), check.encode(), 1).decode()
                with Client(nodes_option, refresh_interval=None) as c:
                    wait_for(lambda: c.show(job_id) is not None, 60, interval=0.05,
                             what="the failing attempt's rows to be added")  # fmt: skip
                with open(marker, "w") as f:
                    f.write("attempt 0 of partition %d failed after %d rows" % (ctx.partitionId(), n + 1))
                raise RuntimeError("planned failure of the first attempt (the test's)")

    return run


@pytest.mark.timeout(400)
def test_write_with_a_retried_task_then_run_again_leaves_each_row_once(
    spark, spark_master, nodes_option, queue, cluster, tmp_path
):
    if not spark_master.startswith("spark://"):
        pytest.skip("needs the standalone cluster: a local master does not retry a failed task")
    marker = tmp_path / "failed-once"
    rows = spark.sparkContext.parallelize(range(ROWS), PARTS).mapPartitions(
        rows_failing_first_attempt(nodes_option, queue, str(marker)))  # fmt: skip
    df = spark.createDataFrame(rows, "key string, body string")

    def write() -> None:
        (df.write.format("disque").option("nodes", nodes_option).option("queue", queue).option("retry", 60)
         .option("dedupColumn", "key").mode("append").save())  # fmt: skip

    write()
    # The marker is written once the failing attempt's row CHECK_ROW was a job: the retry sent it again.
    assert marker.exists()
    assert queued(cluster, queue) == ROWS

    marker.unlink()
    write()  # the same write again (its failing task fails and is retried again)
    assert marker.exists()
    assert queued(cluster, queue) == ROWS
    ids = ids_everywhere(cluster, queue)
    assert len(ids) == ROWS
    assert ids == {dedup_job_id(queue.encode(), b"order-%d" % i, 60).decode() for i in range(ROWS)}


def test_stream_to_another_queue_with_the_source_id_as_key_is_exactly_once(
    spark, nodes_option, queue, cluster, tmp_path
):
    """The documented pipeline: a stream (at-least-once) whose sink writes to another queue with the
    source job's ID as key. Each batch is written twice, as a replay after a crash would."""
    target = queue + "-out"
    with Client(nodes_option) as c:
        ids = c.add_jobs(queue, [b"p%d" % i for i in range(2000)], retry=30)

    def forward(batch, batch_id):
        out = batch.selectExpr("id AS source_id", "concat('done ', cast(body AS string)) AS body")
        for _ in range(2):
            (out.write.format("disque").option("nodes", nodes_option).option("queue", target)
             .option("dedupColumn", "source_id").mode("append").save())  # fmt: skip

    query = stream(spark, nodes_option, queue, tmp_path / "ck", forward, {"availableNow": True}, maxJobsPerTrigger=800)
    assert query.awaitTermination(120)
    assert queued(cluster, target) == len(ids)
    rows = read(spark, nodes_option, queue=target).collect()
    assert sorted(bytes(r.body) for r in rows) == sorted(b"done p%d" % i for i in range(2000))
    assert {r.id for r in rows} == {dedup_job_id(target.encode(), i.encode(), 1).decode() for i in ids}
    wait_for(lambda: queued(cluster, queue) == 0, 30, what="the source queue drained")


def test_bad_dedup_column_fails_with_a_clear_error(spark, nodes_option, queue, cluster):
    def save(df, column):
        with pytest.raises(Exception) as failure:
            (df.write.format("disque").option("nodes", nodes_option).option("queue", queue)
             .option("dedupColumn", column).mode("append").save())  # fmt: skip
        return str(failure.value)

    rows = spark.range(3).selectExpr("cast(id AS string) AS body", "id AS n", "cast(id AS double) AS x")
    assert "names column 'nope', which the DataFrame does not have" in save(rows, "nope")
    assert "must be a string, binary or integer column" in save(rows, "x")
    nulls = spark.createDataFrame([("a", "k1"), ("b", None)], "body string, key string").coalesce(1)
    assert "row 1's DEDUP key (dedupColumn 'key') is null" in save(nulls, "key")
    empty = spark.createDataFrame([("a", "")], "body string, key string")
    assert "row 0's DEDUP key (dedupColumn 'key') is empty" in save(empty, "key")
    long = spark.createDataFrame([("a", "k" * 513)], "body string, key string")
    assert "is 513 bytes, at most 512" in save(long, "key")
    # An integer column and its decimal text are the same key; the first write made the job.
    ints = spark.range(5).selectExpr("concat('v', id) AS body", "id AS N")
    ints.write.format("disque").option("nodes", nodes_option).option("queue", queue).option(
        "dedupColumn", "n").mode("append").save()  # fmt: skip
    again = spark.range(5).selectExpr("'ignored' AS body", "cast(id AS string) AS n")
    again.write.format("disque").option("nodes", nodes_option).option("queue", queue).option(
        "dedupColumn", "n").mode("append").save()  # fmt: skip
    assert queued(cluster, queue) == 5  # a batch with a bad key sends nothing; then each id once
    bodies = sorted(bytes(r.body) for r in read(spark, nodes_option, queue=queue).collect())
    assert bodies == [b"v%d" % i for i in range(5)]  # the later write's bodies were ignored
