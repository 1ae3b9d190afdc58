"""A streaming query in a process of its own, for the crash test (test_stream_crash.py).

    python stream_app.py NODES QUEUE CHECKPOINT OUT RUN [--available-now] [--hang-at BATCH]

Each micro-batch's job IDs go to OUT/RUN-BATCH.json (a sink that keeps every
delivery, duplicates included). With ``--hang-at N`` the sink writes batch N,
creates OUT/hanging and then hangs, so the test can kill -9 the query mid-batch.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path


def main() -> None:
    parser = argparse.ArgumentParser()
    for name in ("nodes", "queue", "checkpoint", "out", "run"):
        parser.add_argument(name)
    parser.add_argument("--available-now", action="store_true")
    parser.add_argument("--hang-at", type=int, default=-1)
    parser.add_argument("--max-jobs", type=int, default=500)
    args = parser.parse_args()
    os.environ["PYSPARK_PYTHON"] = sys.executable
    from pyspark.sql import SparkSession

    spark = (SparkSession.builder.master("local[2]").config("spark.ui.enabled", "false")
             .config("spark.sql.shuffle.partitions", "2").getOrCreate())  # fmt: skip
    spark.sparkContext.setLogLevel("ERROR")
    out = Path(args.out)

    def sink(df, batch_id: int) -> None:
        ids = [r.id for r in df.select("id").collect()]
        path = out / ("%s-%d.json" % (args.run, batch_id))
        path.write_text(json.dumps(ids))
        if batch_id == args.hang_at:
            (out / "hanging").write_text(str(os.getpid()))
            time.sleep(600)

    trigger = {"availableNow": True} if args.available_now else {"processingTime": "500 milliseconds"}
    query = (
        spark.readStream.format("disque").option("nodes", args.nodes).option("queue", args.queue)
        .option("maxJobsPerTrigger", args.max_jobs).load()
        .writeStream.foreachBatch(sink).option("checkpointLocation", args.checkpoint).trigger(**trigger).start()
    )  # fmt: skip
    query.awaitTermination()


if __name__ == "__main__":
    main()
