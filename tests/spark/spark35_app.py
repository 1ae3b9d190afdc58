"""``foreach_batch`` on another pyspark than the installed one (Spark 3.5: no Python data sources),
for test_sink.py's ``test_foreach_batch_on_spark_35``.

    PYTHONPATH=<pyspark 3.5's dir>:<repo> python spark35_app.py NODES QUEUE DIR [--sink-id ID]

Writes ROWS rows (JSON files in DIR/in) through a file stream (``trigger(availableNow=True)``,
ROWS_PER_FILE rows per micro-batch) into QUEUE with ``foreach_batch``, then runs the same
query again from a new checkpoint: its batches (ids from 0 again, the same rows in each) make
the same DEDUP keys, so the second run adds nothing. Prints one JSON line: pyspark's version and
the jobs each run added.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

ROWS = 300
ROWS_PER_FILE = 100


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("nodes")
    p.add_argument("queue")
    p.add_argument("dir")
    p.add_argument("--sink-id")
    args = p.parse_args()
    os.environ["PYSPARK_PYTHON"] = sys.executable
    import pyspark
    from pyspark.sql import SparkSession

    from disque_py.spark.sink import foreach_batch

    base = Path(args.dir)
    (base / "in").mkdir(parents=True, exist_ok=True)
    for f in range(ROWS // ROWS_PER_FILE):
        lines = (json.dumps({"body": "r%d" % (f * ROWS_PER_FILE + i)}) for i in range(ROWS_PER_FILE))
        (base / "in" / ("part-%d.json" % f)).write_text("\n".join(lines) + "\n")
    spark = (SparkSession.builder.master("local[2]").config("spark.ui.enabled", "false")
             .config("spark.sql.shuffle.partitions", "2").getOrCreate())  # fmt: skip
    spark.sparkContext.setLogLevel("ERROR")
    added: list[int] = []

    def run(checkpoint: str) -> None:
        write = foreach_batch(sink_id=args.sink_id, nodes=args.nodes, queue=args.queue, retry=60)
        counts: list[int] = []

        def sink(df, batch_id):
            counts.append(write(df, batch_id))

        query = (spark.readStream.schema("body STRING").option("maxFilesPerTrigger", 1).json(str(base / "in"))
                 .writeStream.foreachBatch(sink).option("checkpointLocation", str(base / checkpoint))
                 .trigger(availableNow=True).start())  # fmt: skip
        query.awaitTermination(300)
        if query.exception() is not None:
            raise SystemExit("the query failed: %s" % query.exception())
        added.append(sum(counts))

    run("ck1")
    run("ck2")
    print(json.dumps({"pyspark": pyspark.__version__, "added": added}))
    spark.stop()


if __name__ == "__main__":
    main()
