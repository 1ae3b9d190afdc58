"""A Spark pipeline on disque-py: a batch job enqueues work, a stream does it.

    python examples/spark_pipeline.py enqueue --nodes 127.0.0.1:7711 --queue words --count 1000
    python examples/spark_pipeline.py consume --nodes 127.0.0.1:7711 --queue words \\
        --out /tmp/words-out --checkpoint /tmp/words-ck [--available-now]
    python examples/spark_pipeline.py all --nodes 127.0.0.1:7711 --queue words --count 1000 \\
        --out /tmp/words-out --checkpoint /tmp/words-ck

``examples/run-spark-pipeline`` runs ``all`` from a fresh clone (venv, Java
check, a private local cluster). docs/SPARK.md describes the data source.

1. **enqueue** (a batch job): a DataFrame of work items becomes one job per
   row; ``bodyFormat json`` sends the whole row as the job body, e.g.
   ``{"item":7,"text":"seven quick brown foxes"}``. At-least-once: a task
   Spark runs again may add some jobs twice.
2. **consume** (a streaming query): takes the jobs, does the work in Spark
   SQL (parse the JSON body, count words and letters, shout the text) and
   appends the results to Parquet. A job is acknowledged only once the
   Parquet sink has committed the micro-batch holding it: at-least-once.
   After a crash the batch in flight is delivered again, so the job ``id``
   is kept in every result row, and readers drop duplicates on it.
3. **summary**: reads the results back, deduplicated on ``id``.

The functions take a SparkSession and plain options, so they can be called
from other code (tests/spark/test_example.py does); ``main()`` builds the
session.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from typing import Any

# A few words to build the work items' texts from.
WORDS = ("zero one two three four five six seven eight nine "
         "quick brown fox jumps over the lazy dog").split()  # fmt: skip


def log(message: str) -> None:
    print(">> " + message, flush=True)


# ---------------------------------------------------------------------------------- 1. enqueue
def enqueue(spark, nodes: str, queue: str, count: int, *, replicate: int | None = None, retry: int = 30) -> int:
    """Enqueue ``count`` work items into ``queue`` as JSON jobs; returns ``count``."""
    from pyspark.sql import functions as F

    # The work items: an item number and a text of 2 to 6 words made from it.
    words = F.array(*[F.lit(w) for w in WORDS])
    items = spark.range(count).select(
        F.col("id").alias("item"),
        F.concat_ws(
            " ",
            F.transform(
                F.sequence(F.lit(0), F.col("id") % 5 + 1),
                lambda i: F.element_at(words, ((F.col("id") + i * 7) % len(WORDS) + 1).cast("int")),
            ),
        ).alias("text"),
    )

    writer = (
        items.write.format("disque")
        .option("nodes", nodes)         # one node is enough: the others are found with HELLO
        .option("queue", queue)
        .option("bodyFormat", "json")   # the whole row is the body: {"item":..,"text":..}
        .option("retry", retry)         # seconds before a job taken and not acknowledged comes back
    )
    if replicate is not None:
        writer = writer.option("replicate", replicate)  # copies per job (default: the node's, 3)
    started = time.monotonic()
    writer.mode("append").save()        # append is the only mode Python data sources accept
    log("enqueued %d work items into queue %r in %.1f s" % (count, queue, time.monotonic() - started))
    return count


# ---------------------------------------------------------------------------------- 2. consume
def results(jobs):
    """The work: turn a DataFrame of jobs (the source's schema) into result rows.

    Pure Spark SQL, so it runs the same in a batch or a stream. The job ``id``
    is kept: it is what makes a duplicate recognisable.
    """
    from pyspark.sql import functions as F

    work_item = "item LONG, text STRING"
    parsed = jobs.select(
        "id",
        F.from_json(F.col("body").cast("string"), work_item).alias("w"),
    )
    return parsed.select(
        "id",
        F.col("w.item").alias("item"),
        F.col("w.text").alias("text"),
        F.size(F.split(F.col("w.text"), " ")).alias("words"),
        F.length(F.regexp_replace(F.col("w.text"), " ", "")).alias("letters"),
        F.upper(F.col("w.text")).alias("shout"),
        F.current_timestamp().alias("done_at"),
    )


def consume(spark, nodes: str, queue: str, out: str, checkpoint: str, *, available_now: bool = False,
            max_jobs_per_trigger: int = 5000, timeout: float | None = None):
    """Run the streaming query: jobs of ``queue`` -> results -> Parquet files under ``out``.

    With ``available_now`` the query takes the jobs queued when it starts,
    acknowledges them all and stops (a catch-up run, e.g. from cron);
    otherwise it runs until stopped (Ctrl-C), a micro-batch a second.
    Returns the stopped query.
    """
    jobs = (
        spark.readStream.format("disque")
        .option("nodes", nodes)
        .option("queue", queue)
        .option("maxJobsPerTrigger", max_jobs_per_trigger)  # jobs per micro-batch
        .load()
    )
    trigger: dict[str, Any] = {"availableNow": True} if available_now else {"processingTime": "1 second"}
    query = (
        results(jobs).writeStream.format("parquet")
        .option("path", out)
        # The checkpoint holds the offsets (which jobs each batch took): keep it
        # with the output, and restart with the same one after a crash.
        .option("checkpointLocation", checkpoint)
        .trigger(**trigger)
        .queryName("disque-" + queue)
        .start()
    )
    started = time.monotonic()
    log("streaming from queue %r into %s (%s)" % (queue, out, "available now" if available_now else "Ctrl-C to stop"))
    try:
        query.awaitTermination(timeout)
    except KeyboardInterrupt:
        log("stopping (jobs taken and not yet committed come back after their RETRY)")
    finally:
        query.stop()
    progress = [p for p in query.recentProgress if p.get("numInputRows")]
    taken = sum(p["numInputRows"] for p in progress)
    log("stream stopped: %d jobs in %d micro-batches, %.1f s" % (taken, len(progress), time.monotonic() - started))
    if query.exception() is not None:
        raise RuntimeError("the streaming query failed: %s" % query.exception())
    return query


# ---------------------------------------------------------------------------------- 3. summary
def summary(spark, out: str, *, expected: int | None = None, show: int = 5) -> dict[str, Any]:
    """Read the results back, duplicates dropped on the job id; print and return the counts.

    With ``expected``, also counts the items 0..expected-1 that have no result.
    """
    # Reading the directory the file sink wrote goes through its _spark_metadata
    # log: only files of committed batches are seen.
    raw = spark.read.parquet(out)
    unique = raw.dropDuplicates(["id"])  # at-least-once: a job may have been delivered twice
    counts = {
        "rows": raw.count(),
        "distinct_ids": unique.count(),
        "distinct_items": unique.select("item").distinct().count(),
    }
    log("results in %s: %d rows, %d distinct job ids (%d duplicates dropped), %d distinct items"
        % (out, counts["rows"], counts["distinct_ids"], counts["rows"] - counts["distinct_ids"],
           counts["distinct_items"]))  # fmt: skip
    if expected is not None:
        # Work items without a result: none, once every job was consumed.
        items = spark.range(expected).withColumnRenamed("id", "item")
        counts["missing"] = items.join(unique, "item", "left_anti").count()
    if show:
        unique.orderBy("item").select("item", "text", "words", "letters", "shout", "id").show(show, truncate=40)
    return counts


# ---------------------------------------------------------------------------------- the command
def build_session(app_name: str = "disque-spark-pipeline"):
    # Spark's Python workers must run this interpreter: it has disque-py (and
    # so the data source) installed. Set before the session starts.
    os.environ["PYSPARK_PYTHON"] = sys.executable
    os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
    master = os.environ.get("SPARK_MASTER", "local[2]")
    if master.startswith("local"):
        os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")  # no warning about the host's address
    from pyspark.sql import SparkSession

    spark = (
        SparkSession.builder.master(master)
        .appName(app_name)
        .config("spark.ui.enabled", "false")
        .config("spark.ui.showConsoleProgress", "false")
        .config("spark.log.level", "ERROR")  # Spark's INFO/WARN lines would drown ours
        .config("spark.sql.shuffle.partitions", "2")
        .getOrCreate()
    )
    spark.sparkContext.setLogLevel("ERROR")
    return spark


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("command", choices=("enqueue", "consume", "all"))
    parser.add_argument("--nodes", default="127.0.0.1:7711", help="host:port[,host:port...] (default %(default)s)")
    parser.add_argument("--queue", default="spark-example", help="queue name (default %(default)s)")
    parser.add_argument("--count", type=int, default=1000, help="work items to enqueue (default %(default)s)")
    parser.add_argument("--replicate", type=int, help="copies per job (default: the node's)")
    parser.add_argument("--out", help="directory of the Parquet results")
    parser.add_argument("--checkpoint", help="directory of the streaming query's checkpoint")
    parser.add_argument("--available-now", action="store_true", help="consume what is queued, then stop")
    args = parser.parse_args(argv)
    if args.command in ("consume", "all") and not (args.out and args.checkpoint):
        parser.error("%s needs --out and --checkpoint" % args.command)

    log("starting Spark (local, a few seconds)")
    spark = build_session()
    try:
        if args.command in ("enqueue", "all"):
            enqueue(spark, args.nodes, args.queue, args.count, replicate=args.replicate)
        if args.command in ("consume", "all"):
            consume(spark, args.nodes, args.queue, args.out, args.checkpoint,
                    available_now=args.available_now or args.command == "all")  # fmt: skip
        if args.command == "all":
            counts = summary(spark, args.out, expected=args.count)
            if counts["missing"]:
                sys.exit("error: %d of the %d work items have no result" % (counts["missing"], args.count))
            log("every work item has a result")
    finally:
        spark.stop()


if __name__ == "__main__":
    main()
