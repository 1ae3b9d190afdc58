"""A streaming query in a process of its own, for the crash test (test_stream_crash.py).

    python stream_app.py NODES QUEUE CHECKPOINT OUT RUN [--available-now] [--hang-at BATCH]
                         [--to-queue TARGET] [--master URL]

Each micro-batch's job IDs go to OUT/RUN-BATCH.json (a sink that keeps every
delivery, duplicates included). With ``--hang-at N`` the sink writes batch N,
creates OUT/hanging and then hangs, so the test can kill -9 the query mid-batch.
With ``--to-queue TARGET`` the query is queue to queue instead: each job's body,
prefixed with "done ", goes to TARGET through ``writeStream.format("disque")``.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

#: The Java options of every JVM the Spark tests start (the standalone daemons, the drivers, the
#: executors): the client compiler only and the serial collector. A test's JVMs live for seconds
#: to minutes on small data, and six of them start at once on a small machine, where the server
#: compiler's and G1's threads took cores from everything else. DISQUE_SPARK_JVM_OPTIONS
#: replaces them ("" for the JVM's defaults).
JVM_OPTIONS = os.environ.get("DISQUE_SPARK_JVM_OPTIONS", "-XX:TieredStopAtLevel=1 -XX:+UseSerialGC")


def queue_to_queue(spark, nodes: str, source: str, target: str, max_jobs: int):
    """The queue-to-queue query's writer (checkpoint and trigger to add): each job's body, prefixed
    with "done ", into ``target`` through the stream sink, 50 rows per pipelined round trip (so a
    kill often lands in the middle of a task's writes)."""
    jobs = (spark.readStream.format("disque").option("nodes", nodes).option("queue", source)
            .option("maxJobsPerTrigger", max_jobs).load())  # fmt: skip
    return (jobs.selectExpr("concat('done ', cast(body AS string)) AS body").writeStream.format("disque")
            .option("nodes", nodes).option("queue", target).option("retry", 60).option("batchSize", 50)
            .option("timeout", 60_000))  # fmt: skip


def to_files(spark, nodes: str, queue: str, max_jobs: int, out: Path, run: str, hang_at: int = -1):
    """The crash test's query's writer (checkpoint and trigger to add): each batch's job IDs to
    OUT/RUN-BATCH.json; batch ``hang_at`` is written, then OUT/hanging, then the sink hangs."""

    def sink(df, batch_id: int) -> None:
        ids = [r.id for r in df.select("id").collect()]
        path = out / ("%s-%d.json" % (run, batch_id))
        path.write_text(json.dumps(ids))
        if batch_id == hang_at:
            (out / "hanging").write_text(str(os.getpid()))
            time.sleep(600)

    return (spark.readStream.format("disque").option("nodes", nodes).option("queue", queue)
            .option("maxJobsPerTrigger", max_jobs).load().writeStream.foreachBatch(sink))  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser()
    for name in ("nodes", "queue", "checkpoint", "out", "run"):
        parser.add_argument(name)
    parser.add_argument("--available-now", action="store_true")
    parser.add_argument("--hang-at", type=int, default=-1)
    parser.add_argument("--max-jobs", type=int, default=500)
    parser.add_argument("--to-queue")
    parser.add_argument("--master", default="local[2]")
    args = parser.parse_args()
    os.environ["PYSPARK_PYTHON"] = sys.executable
    from pyspark.sql import SparkSession

    builder = (SparkSession.builder.master(args.master).config("spark.ui.enabled", "false")
               .config("spark.sql.shuffle.partitions", "2").config("spark.driver.extraJavaOptions", JVM_OPTIONS)
               .config("spark.executor.extraJavaOptions", JVM_OPTIONS))  # fmt: skip
    if args.master.startswith("spark://"):
        builder = (builder.config("spark.driver.host", "127.0.0.1").config("spark.driver.bindAddress", "127.0.0.1")
                   .config("spark.executor.memory", "512m").config("spark.executor.cores", "1")
                   .config("spark.executorEnv.PYTHONPATH", os.environ.get("PYTHONPATH", "")))  # fmt: skip
    spark = builder.getOrCreate()
    spark.sparkContext.setLogLevel("ERROR")
    trigger = {"availableNow": True} if args.available_now else {"processingTime": "500 milliseconds"}
    if args.to_queue:
        writer = queue_to_queue(spark, args.nodes, args.queue, args.to_queue, args.max_jobs)
    else:
        writer = to_files(spark, args.nodes, args.queue, args.max_jobs, Path(args.out), args.run, args.hang_at)
    query = writer.option("checkpointLocation", args.checkpoint).trigger(**trigger).start()
    query.awaitTermination()


if __name__ == "__main__":
    main()
