"""The stream source's admission knobs, event time and lag.

The admission tests call the stream reader's methods as Spark's driver-side
process does (``latestOffset``, ``commit``), against the real nodes, without
a Spark session: what a trigger takes is then exact, not a matter of timing.
"""

from __future__ import annotations

import collections
import json
import threading
import time

from pyspark.sql import functions as F
from pyspark.sql.streaming.datasource import ReadAllAvailable, ReadMaxRows

from disque_py.client import Client
from disque_py.client import consumers
from disque_py.spark import options as opts
from disque_py.spark.source import DisqueStreamReader
from tests.integration.conftest import wait_for
from tests.spark.test_source import collecting_sink, jobs_left, stream


def reader(nodes_option: str, queue: str, **options) -> DisqueStreamReader:
    raw = {"nodes": nodes_option, "queue": queue, "drainWait": "0", **{k: str(v) for k, v in options.items()}}
    return DisqueStreamReader(opts.parse(raw, "stream"))


def size(offset: dict) -> int:
    return sum(len(ids) for ids in offset.get("jobs", {}).values())


def test_min_jobs_per_trigger_waits_for_them_or_max_trigger_delay(nodes_option, queue, cluster):
    r = reader(nodes_option, queue, minJobsPerTrigger=50, maxTriggerDelay="10s")
    start = r.initialOffset()
    try:
        with Client(nodes_option) as c:
            c.add_jobs(queue, [b"a%d" % i for i in range(20)], retry=30)
            assert r.latestOffset(start, ReadAllAvailable()) == start  # 20 < 50: no batch
            wait_for(lambda: r.prefetch.count == 20, 30, what="the 20 jobs taken ahead")
            assert r.latestOffset(start, ReadAllAvailable()) == start  # still 20 ready: still none
            c.add_jobs(queue, [b"b%d" % i for i in range(40)], retry=30)
            wait_for(lambda: r.prefetch.count >= 50, 30, what="50 jobs taken ahead")
            first = r.latestOffset(start, ReadAllAvailable())
            assert first["seq"] == 1 and size(first) == 60
            r.commit(first)
            c.add_jobs(queue, [b"c%d" % i for i in range(5)], retry=30)
            wait_for(lambda: r.prefetch.count == 5, 30, what="5 more taken ahead")
            assert r.latestOffset(first, ReadAllAvailable()) == first  # 5 < 50, 10 s not passed
            r.last_batch_at -= 10  # the last batch was maxTriggerDelay ago: what is ready goes
            second = r.latestOffset(first, ReadMaxRows(1000))
            assert second["seq"] == 2 and size(second) == 5
            r.commit(second)
    finally:
        r.stop()
    wait_for(lambda: jobs_left(cluster, queue) == 0, 30, what="every job acknowledged")


def test_max_bytes_per_trigger_caps_a_batch_with_at_least_one_job(nodes_option, queue, cluster):
    r = reader(nodes_option, queue, maxBytesPerTrigger=2500)
    offset = r.initialOffset()
    sizes = []
    try:
        with Client(nodes_option) as c:
            c.add_jobs(queue, [b"%099d" % i for i in range(60)] + [b"x" * 6000], retry=30)
        deadline = time.monotonic() + 60
        while sum(n for n, _ in sizes) < 61 and time.monotonic() < deadline:
            end = r.latestOffset(offset, ReadMaxRows(1000))
            if not size(end):
                continue
            rows = [row for rows in r.batches[end["seq"]].values() for row in rows]
            sizes.append((len(rows), sum(len(row[2]) for row in rows)))
            r.commit(end)
            offset = end
    finally:
        r.stop()
    assert sum(n for n, _ in sizes) == 61
    assert all(total <= 2500 or n == 1 for n, total in sizes), sizes  # the 6,000-byte job alone
    assert max(n for n, _ in sizes) == 25 and (1, 6000) in sizes


def test_event_time_windowed_count_matches_the_jobs_creation_times(spark, nodes_option, queue, cluster, tmp_path):
    ids = []
    with Client(nodes_option) as c:
        for group in range(3):  # three bursts, a second apart: at least two 1-second windows
            ids += c.add_jobs(queue, [b"e%d-%d" % (group, i) for i in range(20 + 10 * group)], retry=30)
            if group < 2:
                time.sleep(1.0)
        created = {i: c.show(i)["ctime"] // 1_000_000 for i in ids}  # ms since the epoch
    expected = collections.Counter(ms // 1000 for ms in created.values())
    assert len(expected) >= 2
    counts: dict[int, int] = {}

    def sink(df, batch_id):
        counts.update((row.start, row["count"]) for row in df.collect())

    jobs = (spark.readStream.format("disque").option("nodes", nodes_option).option("queue", queue)
            .option("maxJobsPerTrigger", 40).load())  # fmt: skip
    windows = (jobs.withWatermark("ctime", "1 minute").groupBy(F.window("ctime", "1 second")).count()
               .selectExpr("cast(window.start AS long) AS start", "count"))  # fmt: skip
    q1 = (windows.writeStream.outputMode("update").foreachBatch(sink)
          .option("checkpointLocation", str(tmp_path / "ck")).trigger(availableNow=True).start())  # fmt: skip
    assert q1.awaitTermination(120) and q1.exception() is None
    assert counts == dict(expected)


def test_lag_grows_in_the_progress_while_a_producer_outpaces_the_query(spark, nodes_option, queue, cluster, tmp_path):
    seen, collect = collecting_sink()
    stop = threading.Event()

    def produce():
        with Client(nodes_option) as c:
            while not stop.is_set():
                c.add_jobs(queue, [b"p"] * 100, retry=60)
                stop.wait(0.1)

    producer = threading.Thread(target=produce, daemon=True)
    query = stream(spark, nodes_option, queue, tmp_path / "ck", collect, {"processingTime": "100 milliseconds"},
                   maxJobsPerTrigger=10, eventTime="false", consumerName="lag-test")  # fmt: skip
    producer.start()
    try:

        def lags():
            return [json.loads(p["sources"][0]["latestOffset"]) for p in query.recentProgress
                    if p["sources"] and p["sources"][0].get("latestOffset")]  # fmt: skip

        wait_for(lambda: len(lags()) >= 2 and lags()[-1]["queued"] > lags()[0]["queued"] + 300, 90,
                 what="the backlog in the progress to grow")  # fmt: skip
        wait_for(lambda: (lags()[-1]["oldestAgeMs"] or 0) >= 1500, 90, what="the oldest job's age to grow")
        report = lags()[-1]
        assert report["held"] >= 0 and report["seq"] >= 1

        # The nodes know the query by its connections' name: the admin page's consumers (web/api.py)
        def named():
            lists = [(n.port, n.client().execute_command("CLIENT", "LIST")) for n in cluster]
            return [c for c in consumers.merge(lists) if c.name == "lag-test"]

        found = wait_for(named, 30, what="the query's connections named")
        assert found[0].kind == "spark" and found[0].queues == [queue]
    finally:
        stop.set()
        producer.join()
        query.stop()
    assert len(seen) > 0
