"""The ``disque`` data source in a real local SparkSession against real node processes.

Nothing registers the source: ``format("disque")`` is found through the
top-level module ``pyspark_disque``, as a user's would be.
"""

from __future__ import annotations

import json
import threading
import time

import pytest

from disque_py.client import Client
from tests.integration.conftest import wait_for


def client(nodes_option: str) -> Client:
    return Client(nodes_option)


def node_clients(cluster) -> list[Client]:
    return [Client("127.0.0.1:%d" % n.port, refresh_interval=None) for n in cluster]


def jobs_left(cluster, queue: str) -> int:
    """Jobs of ``queue`` still known to any node (acknowledged ones are gone once collected)."""
    total = 0
    for c in node_clients(cluster):
        with c:
            total += sum(1 for j in c.jscan(queue=queue, reply="all") if j["state"] != "acked")
    return total


def queued(cluster, queue: str) -> int:
    return sum(c.qlen(queue) for c in node_clients(cluster))


def read(spark, nodes_option: str, **options):
    reader = spark.read.format("disque").option("nodes", nodes_option)
    for key, value in options.items():
        reader = reader.option(key, value)
    return reader.load()


# ------------------------------------------------------------------------------------ write + read
def test_write_10k_rows_then_read_them_all_back(spark, nodes_option, queue, cluster):
    df = spark.range(10_000).selectExpr("concat('work-', id) AS body")
    df.write.format("disque").option("nodes", nodes_option).option("queue", queue).mode("append").save()
    assert queued(cluster, queue) == 10_000

    rows = read(spark, nodes_option, queue=queue).collect()
    assert len(rows) == 10_000
    assert len({r.id for r in rows}) == 10_000  # each job once, though each has copies on several nodes
    assert sorted(bytes(r.body) for r in rows) == sorted(b"work-%d" % i for i in range(10_000))
    assert {r.queue for r in rows} == {queue}
    assert {r.state for r in rows} == {"queued"}
    assert len({r.node for r in rows}) == 3  # the read was spread over the cluster's nodes
    # A snapshot takes nothing.
    assert queued(cluster, queue) == 10_000


def test_write_options_and_columns_reach_every_job(spark, nodes_option, queue, cluster):
    other = queue + "-b"
    df = spark.createDataFrame(
        [(queue, bytearray(b"\x00\x01bin")), (other, bytearray(b"two"))], "queue string, body binary"
    )
    (df.write.format("disque").option("nodes", nodes_option).option("replicate", 2).option("retry", 7)
     .option("ttl", 3600).mode("append").save())  # fmt: skip
    rows = {r.queue: r for r in read(spark, nodes_option, queues="%s,%s" % (queue, other)).collect()}
    assert bytes(rows[queue].body) == b"\x00\x01bin" and bytes(rows[other].body) == b"two"
    assert rows[queue].retry == 7 and 3500 < rows[queue].ttl <= 3600
    with Client(rows[queue].node, refresh_interval=None) as c:  # the node the row was read from
        shown = c.show(rows[queue].id)
    assert shown["repl"] == 2 and len(shown["nodes-delivered"]) == 2


def test_write_json_rows(spark, nodes_option, queue):
    df = spark.createDataFrame([(1, "ada", 2.5), (2, "bob", None)], "n long, name string, score double")
    df.write.format("disque").option("nodes", nodes_option).option("queue", queue).option(
        "bodyFormat", "json").mode("append").save()  # fmt: skip
    bodies = sorted((json.loads(bytes(r.body)) for r in read(spark, nodes_option, queue=queue).collect()), key=lambda b: b["n"])
    assert bodies == [{"n": 1, "name": "ada", "score": 2.5}, {"n": 2, "name": "bob", "score": None}]


def test_failed_job_fails_the_write_with_its_error(spark, nodes_option, queue, cluster):
    df = spark.range(50).selectExpr("cast(id AS string) AS body").coalesce(1)
    with pytest.raises(Exception) as failure:
        (df.write.format("disque").option("nodes", nodes_option).option("queue", queue)
         .option("maxlen", 10).option("replicate", 1).option("connections", 1).option("batchSize", 5)
         .mode("append").save())  # fmt: skip
    text = str(failure.value)
    assert "ADDJOB failed for row" in text and "MAXLEN" in text
    assert 10 <= queued(cluster, queue) < 50


def test_read_every_queue_and_consume_mode(spark, nodes_option, queue, cluster):
    with client(nodes_option) as c:
        c.add_jobs(queue, [b"a%d" % i for i in range(300)])
        c.add_jobs(queue + "-x", [b"x%d" % i for i in range(5)])
    everything = read(spark, nodes_option).collect()
    assert {queue, queue + "-x"} <= {r.queue for r in everything}

    taken = read(spark, nodes_option, queue=queue, mode="consume").collect()
    assert sorted(bytes(r.body) for r in taken) == sorted(b"a%d" % i for i in range(300))
    wait_for(lambda: jobs_left(cluster, queue) == 0, 20, what="consumed jobs acknowledged everywhere")
    assert queued(cluster, queue + "-x") == 5  # another queue is untouched


# ------------------------------------------------------------------------------------ bad input
@pytest.mark.parametrize(
    "options, message",
    [
        ({}, "option 'nodes' is required"),
        ({"nodes": "127.0.0.1:notaport"}, "option 'nodes' must be host:port"),
        ({"nodes": "NODES", "queue": "q", "replicat": "2"}, "unknown option 'replicat'"),
        ({"nodes": "NODES", "queue": "q", "mode": "consume"}, "option 'mode' does not apply to a write"),
        ({"nodes": "NODES", "queue": "q", "replicate": "zero"}, "option 'replicate' must be an integer"),
        ({"nodes": "NODES"}, "option 'queue' is required"),
        ({"nodes": "127.0.0.1:1,127.0.0.1:2", "queue": "q", "connectTimeout": "0.2"},
         "no node of the cluster answered (tried 127.0.0.1:1"),
    ],
)  # fmt: skip
def test_bad_write_options_fail_fast_naming_the_option(spark, nodes_option, options, message):
    df = spark.range(3).selectExpr("cast(id AS string) AS body")
    writer = df.write.format("disque").mode("append")
    for key, value in options.items():
        writer = writer.option(key, value.replace("NODES", nodes_option))
    with pytest.raises(Exception) as failure:
        writer.save()
    assert message in str(failure.value)


def test_wrong_column_types_and_save_mode_fail(spark, nodes_option, queue):
    def save(df, mode="append", **options):
        writer = df.write.format("disque").option("nodes", nodes_option).option("queue", queue).mode(mode)
        for key, value in options.items():
            writer = writer.option(key, value)
        with pytest.raises(Exception) as failure:
            writer.save()
        return str(failure.value)

    assert "column 'body' must be a string or binary, got bigint" in save(spark.range(2).selectExpr("id AS body"))
    assert "no column 'body'" in save(spark.range(2))
    assert "column 'queue' must be a string" in save(spark.range(2).selectExpr("id AS queue", "'x' AS body"))
    assert "use .mode(\"append\")" in save(spark.range(2).selectExpr("'x' AS body"), mode="overwrite")


def test_bad_read_options_fail_fast(spark, nodes_option):
    with pytest.raises(Exception, match="option 'mode' must be one of snapshot, consume"):
        read(spark, nodes_option, mode="destroy").collect()
    with pytest.raises(Exception, match="option 'retry' does not apply to a read"):
        read(spark, nodes_option, retry=3).collect()
    with pytest.raises(Exception, match=r"no node of the cluster answered \(tried 127.0.0.1:1"):
        read(spark, "127.0.0.1:1", connectTimeout=0.2).collect()
    with pytest.raises(Exception, match="option 'queue' \\(or 'queues'\\) is required for a stream"):
        spark.readStream.format("disque").option("nodes", nodes_option).load().writeStream.format(
            "console").start().awaitTermination(30)


# ------------------------------------------------------------------------------------ streaming
def stream(spark, nodes_option: str, queue: str, checkpoint, sink, trigger: dict, **options):
    reader = spark.readStream.format("disque").option("nodes", nodes_option).option("queue", queue)
    for key, value in options.items():
        reader = reader.option(key, value)
    return (reader.load().writeStream.foreachBatch(sink).option("checkpointLocation", str(checkpoint))
            .trigger(**trigger).start())  # fmt: skip


def collecting_sink():
    seen: list = []
    lock = threading.Lock()

    def sink(df, batch_id):
        rows = df.select("id", "body", "state").collect()
        with lock:
            seen.extend(rows)

    return seen, sink


def test_stream_consumes_a_queue_fed_concurrently_and_acks_everything(spark, nodes_option, queue, cluster, tmp_path):
    seen, sink = collecting_sink()
    expected: list[str] = []
    query = stream(spark, nodes_option, queue, tmp_path / "ck", sink, {"processingTime": "1 second"},
                   maxJobsPerTrigger=700)  # fmt: skip
    try:
        with client(nodes_option) as c:
            for k in range(8):
                expected += c.add_jobs(queue, [b"s%d-%d" % (k, i) for i in range(250)], retry=30)
                time.sleep(0.2)  # a producer that keeps coming while the query runs
        wait_for(lambda: len({r.id for r in seen}) >= len(expected), 90, what="every job delivered")
        # The last batch is committed (acknowledged) without new jobs arriving: the source ends an
        # empty batch for it.
        wait_for(lambda: jobs_left(cluster, queue) == 0, 60, what="every delivered job acknowledged")
    finally:
        query.stop()
    assert {r.id for r in seen} == set(expected)
    assert len(seen) == len(expected)  # no job delivered twice in a healthy run
    assert {r.state for r in seen} == {"active"}


@pytest.mark.parametrize("working_on_take", ["true", "false"])
def test_available_now_drains_and_acks_every_job(spark, nodes_option, queue, cluster, tmp_path, working_on_take):
    with client(nodes_option) as c:
        # copies made within 60 s: a machine busy with Spark may take more than the default 5 s
        ids = c.add_jobs(queue, [b"n%d" % i for i in range(2500)], timeout_ms=60_000)
    seen, sink = collecting_sink()
    query = stream(spark, nodes_option, queue, tmp_path / "ck", sink, {"availableNow": True}, maxJobsPerTrigger=1000,
                   workingOnTake=working_on_take)  # fmt: skip
    assert query.awaitTermination(120)
    assert sorted(r.id for r in seen) == sorted(ids)
    # reportLatestOffset: the query's progress shows how many jobs were queued.
    latest = [p["sources"][0].get("latestOffset") for p in query.recentProgress]
    assert any(isinstance(x, str) and '"queued"' in x for x in latest), latest
    # The final batch is acknowledged in this run too (the source ends one empty batch after it).
    wait_for(lambda: jobs_left(cluster, queue) == 0, 30, what="every job acknowledged")


def test_slow_batch_is_not_delivered_twice(spark, nodes_option, queue, cluster, tmp_path):
    """RETRY 1 and batches that take 3 s: WORKING keeps the jobs from being queued again."""
    with client(nodes_option) as c:
        ids = c.add_jobs(queue, [b"w%d" % i for i in range(200)], retry=1)
    seen, collect = collecting_sink()

    def slow(df, batch_id):
        collect(df, batch_id)
        if df.count():
            time.sleep(3)

    query = stream(spark, nodes_option, queue, tmp_path / "ck", slow, {"availableNow": True}, maxJobsPerTrigger=100)
    assert query.awaitTermination(120)
    assert sorted(r.id for r in seen) == sorted(ids)  # each once, although 3 s > RETRY 1 s
    wait_for(lambda: jobs_left(cluster, queue) == 0, 30, what="every job acknowledged")


def test_stream_over_retry_0_jobs_is_refused(spark, nodes_option, queue, cluster, tmp_path):
    with client(nodes_option) as c:
        c.add_job(queue, b"once", retry=0, replicate=1)
    query = stream(spark, nodes_option, queue, tmp_path / "ck", lambda df, i: None, {"availableNow": True})
    with pytest.raises(Exception, match="holds RETRY 0 jobs"):
        query.awaitTermination(60)
    assert queued(cluster, queue) == 1  # and the job is still there for its own consumer
