"""The stream sink (``writeStream.format("disque")``) and its twin for Spark 3.5,
``disque_py.spark.sink.foreach_batch`` (run here on the installed pyspark): a micro-batch
Spark runs again adds nothing.

The replay is Spark's own: the query runs to the end (``availableNow``), the
commit-log entry of its last batch is removed (as when the driver dies after
the sink wrote and before Spark recorded it), and the query is started again
from the checkpoint, which runs that batch again from its offsets.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from disque_py.core.ids import dedup_job_id
from disque_py.spark.sink import foreach_batch
from tests.spark.test_dedup import ids_everywhere
from tests.spark.test_source import queued

FILES, LINES = 2, 150


def _text_stream(spark, tmp_path):
    source = tmp_path / "in"
    source.mkdir()
    for f in range(FILES):
        (source / ("part-%d.txt" % f)).write_text("".join("line %d-%d\n" % (f, i) for i in range(LINES)))
    return spark.readStream.option("maxFilesPerTrigger", 1).text(str(source)).selectExpr("value AS body")


def forget_last_commit(checkpoint) -> None:
    """As if the last batch wrote its jobs and the driver died before Spark's commit-log entry (the
    file and its checksum): a restart runs that batch again."""
    commits = sorted((checkpoint / "commits").glob("[0-9]*"), key=lambda p: int(p.name))
    assert [c.name for c in commits] == [str(b) for b in range(FILES)]
    commits[-1].unlink()
    commits[-1].with_name(".%s.crc" % commits[-1].name).unlink(missing_ok=True)


def _run(rows, sink, checkpoint):
    query = sink(rows.writeStream).option("checkpointLocation", str(checkpoint)).trigger(availableNow=True).start()
    assert query.awaitTermination(120)
    assert query.exception() is None
    return query


def test_a_replayed_micro_batch_adds_nothing(spark, nodes_option, queue, cluster, tmp_path):
    def sink(writer):
        return writer.format("disque").option("nodes", nodes_option).option("queue", queue).option("retry", 60)

    rows = _text_stream(spark, tmp_path)
    checkpoint = tmp_path / "ck"
    first = _run(rows, sink, checkpoint)
    assert queued(cluster, queue) == FILES * LINES
    ids = ids_everywhere(cluster, queue)
    # Each job's ID is that of its key: query id / batch id / partition / row number.
    keys = {dedup_job_id(queue.encode(), b"%s/%d/%d/%d" % (first.id.encode(), b, p, r), 60).decode()
            for b in range(FILES) for p in range(4) for r in range(LINES)}  # fmt: skip
    assert len(ids) == FILES * LINES and ids <= keys

    forget_last_commit(checkpoint)
    again = _run(rows, sink, checkpoint)
    assert again.id == first.id
    assert sum(p["numInputRows"] for p in again.recentProgress) == LINES  # the last batch ran again
    assert queued(cluster, queue) == FILES * LINES  # and added nothing
    assert ids_everywhere(cluster, queue) == ids


def test_sink_keys_from_dedup_column_or_sink_id_and_bad_input(spark, nodes_option, queue, cluster, tmp_path):
    rows = _text_stream(spark, tmp_path).selectExpr("body", "concat('k-', body) AS key")
    _run(rows, lambda w: w.format("disque").option("nodes", nodes_option).option("queue", queue)
         .option("dedupColumn", "key"), tmp_path / "ck1")  # fmt: skip
    _run(rows, lambda w: w.foreachBatch(foreach_batch(nodes=nodes_option, queue=queue, dedupColumn="key")),
         tmp_path / "ck2")  # fmt: skip
    assert ids_everywhere(cluster, queue) == {
        dedup_job_id(queue.encode(), b"k-line %d-%d" % (f, i), 1).decode() for f in range(FILES) for i in range(LINES)
    }  # a second query with the same business keys added nothing
    # foreach_batch's keys from its position, named by sink_id; its replayed batch adds nothing either.
    other = queue + "-named"

    def named(writer):
        return writer.foreachBatch(foreach_batch(sink_id="orders", nodes=nodes_option, queue=other))

    _run(rows.select("body"), named, tmp_path / "ck3")
    made = ids_everywhere(cluster, other)
    assert len(made) == FILES * LINES and dedup_job_id(other.encode(), b"orders/0/0/0", 1).decode() in made
    forget_last_commit(tmp_path / "ck3")
    again = _run(rows.select("body"), named, tmp_path / "ck3")
    assert sum(p["numInputRows"] for p in again.recentProgress) == LINES
    assert ids_everywhere(cluster, other) == made and queued(cluster, other) == FILES * LINES

    def fails(writer_of, message):
        with pytest.raises(Exception, match=message):
            _run(rows, writer_of, tmp_path / "bad")

    fails(lambda w: w.format("disque").option("nodes", nodes_option), "option 'queue' is required")
    fails(lambda w: w.format("disque").option("nodes", nodes_option).option("queue", queue).option("mode", "x"),
          "option 'mode' does not apply to a sink")  # fmt: skip
    fails(lambda w: w.format("disque").option("nodes", nodes_option).option("queue", queue)
          .option("dedupColumn", "nope"), "names column 'nope', which the DataFrame does not have")  # fmt: skip
    with pytest.raises(ValueError, match="option 'sinkid' must be a non-empty name"):
        foreach_batch(sink_id=" ", nodes=nodes_option, queue=queue)
    with pytest.raises(ValueError, match="unknown option 'bogus'"):
        foreach_batch(nodes=nodes_option, queue=queue, bogus=1)
    nobody = rows.selectExpr("length(body) AS n")
    with pytest.raises(Exception, match="no column 'body'"):
        _run(nobody, lambda w: w.foreachBatch(foreach_batch(nodes=nodes_option, queue=queue)), tmp_path / "bad2")


# foreach_batch on Spark 3.5 (no Python data sources there), in a process of its own: pyspark
# 3.5 is not what the project installs, so this runs only where one is given (a directory it was
# installed into with `pip install --target DIR 'pyspark==3.5.*'`):
#   DISQUE_SPARK35_PATH=DIR .venv/bin/python -m pytest -p no:cacheprovider tests/spark/test_sink.py -k spark_35
SPARK35 = os.environ.get("DISQUE_SPARK35_PATH")


@pytest.mark.skipif(not SPARK35, reason="DISQUE_SPARK35_PATH is not set (a directory holding pyspark 3.5)")
@pytest.mark.timeout(600)
def test_foreach_batch_on_spark_35(nodes_option, queue, cluster, tmp_path):
    root = Path(__file__).resolve().parents[2]
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([SPARK35, str(root)]), PYSPARK_PYTHON=sys.executable)
    env.pop("SPARK_HOME", None)
    app = Path(__file__).with_name("spark35_app.py")
    done = subprocess.run([sys.executable, str(app), nodes_option, queue, str(tmp_path), "--sink-id", "s35"],
                          env=env, capture_output=True, text=True, timeout=540)  # fmt: skip
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    report = json.loads(done.stdout.strip().splitlines()[-1])
    print("pyspark %s: added %s" % (report["pyspark"], report["added"]))
    assert report["pyspark"].startswith("3.5.")
    assert report["added"] == [300, 300]  # each run wrote every row (a repeat answers the job made)
    # and the second run's batches (ids from 0 again) made the same keys: nothing added twice
    assert queued(cluster, queue) == 300
    made = ids_everywhere(cluster, queue)
    assert len(made) == 300 and dedup_job_id(queue.encode(), b"s35/2/0/99", 60).decode() in made
