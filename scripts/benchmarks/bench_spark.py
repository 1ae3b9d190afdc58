"""The Spark data source against our plain client, same jobs, same cluster, same run.

    scripts/bench spark                      # 3 fresh nodes, local[2], 100,000 jobs of 100 bytes
    scripts/bench spark --jobs 20000 --repeat 1
    scripts/bench spark --only stream --max-per-trigger 20000

Rows (jobs) per second, best of ``--repeat``; each row starts from an empty
queue on a fresh 3-node cluster (REPLICATE 3, the default for three nodes):

* ``write``: ``df.write.format("disque")`` of a DataFrame of ``--jobs``
  100-byte bodies (``--partitions`` tasks x ``--connections`` connections),
  against our plain client adding the same bodies: ``Client.add_jobs``
  pipelined on one connection, and on ``--partitions x --connections``
  connections (threads), which is what the Spark tasks use in all.
* ``read``: a snapshot read that touches every body
  (``sum(length(body))``), against the plain client doing the same work
  alone (JSCAN on every node, then pipelined SHOW of each job once).
* ``stream``: a ``trigger(availableNow=True)`` query with the ``noop`` sink
  over a full queue, ``maxJobsPerTrigger`` ``--max-per-trigger``, from
  ``start()`` until it stops with every job acknowledged, against the plain
  client draining the same queue (pipelined ``ACKJOB`` of the previous batch
  + ``GETJOB NOHANG COUNT``, with ``WORKING`` for each job as the source
  sends it). ``spark_stream_working_on_take_false``: the same with
  ``workingOnTake`` false. Also Spark's fixed cost per micro-batch: the median
  ``triggerExecution`` of 100-job batches from the query's progress
  reports. ``spark_stream_event_time_false``: the same as ``spark_stream``
  with ``eventTime`` false (no SHOW per job for ``ctime``).
* ``eventtime``: only that pair, ``spark_stream`` and
  ``spark_stream_event_time_false``, in turns (each round starts with the
  other one), for what ``ctime`` costs a stream.
* ``sink``: the stream sink, ``writeStream.format("disque")`` (each row with
  its DEDUP key ``query/batch/partition/row``), of the same ``--jobs``
  100-byte bodies read by a ``trigger(availableNow=True)`` file stream from
  ``--partitions`` Parquet files (one micro-batch), from ``start()`` until it
  stops, beside the batch writer with a ``dedupColumn`` (the same bodies,
  each row's number as its key: the same cost per job) and without.

The machine's two cores run the nodes, the JVM and the Python workers
together (no pinning), as a user's laptop would. Raw results are saved as
JSON into ``bench-results/`` (or ``--write``).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import statistics
import sys
import tempfile
import threading
import time
import uuid
from pathlib import Path
from typing import Any

from disque_py.cli import launcher
from disque_py.client.sync import Client

ROOT = Path(__file__).resolve().parents[2]
BODY_SIZE = 100


class Cluster:
    def __init__(self, n: int, base: Path) -> None:
        self.ports = [_free_port() for _ in range(n)]
        self.procs = []
        for port in self.ports:
            d = base / str(port)
            d.mkdir(parents=True)
            argv = launcher.node_argv(port, d, "--bind", "127.0.0.1", "--loglevel", "warning")
            self.procs.append(launcher.spawn(argv, output=d / "log", cwd=ROOT))
        for proc, port in zip(self.procs, self.ports):
            launcher.wait_ready(proc, port)
        launcher.join([("127.0.0.1", p) for p in self.ports])

    @property
    def nodes(self) -> str:
        return ",".join("127.0.0.1:%d" % p for p in self.ports)

    def stop(self) -> None:
        for proc, port in zip(self.procs, self.ports):
            launcher.stop(proc, port=port)

    def left(self, queue: str) -> int:
        total = 0
        for port in self.ports:
            with Client("127.0.0.1:%d" % port, refresh_interval=None) as c:
                total += sum(1 for j in c.jscan(queue=queue, reply="all") if j["state"] != "acked")
        return total


def _free_port() -> int:
    """A port whose bus port (+10000) is free and valid too."""
    import random
    import socket

    while True:
        port = random.randrange(20000, 45000)
        try:
            for p in (port, port + 10000):
                with socket.socket() as s:
                    s.bind(("127.0.0.1", p))
        except OSError:
            continue
        return port


def bodies(n: int) -> list[bytes]:
    return [(b"%010d" % i).ljust(BODY_SIZE, b"x") for i in range(n)]


def wait_gone(cluster: Cluster, queue: str, timeout: float = 60) -> float:
    start = time.perf_counter()
    while cluster.left(queue):
        if time.perf_counter() - start > timeout:
            raise RuntimeError("jobs of %s not acknowledged after %ss" % (queue, timeout))
        time.sleep(0.05)
    return time.perf_counter() - start


# ------------------------------------------------------------------------ plain client
def client_write(cluster: Cluster, n: int, conns: int, queue: str | None = None) -> float:
    """``n`` jobs added by our plain client over ``conns`` connections (threads); jobs/s."""
    queue = queue or "w-" + uuid.uuid4().hex[:8]
    data = bodies(n)
    seeds = cluster.nodes.split(",")
    share = [data[k::conns] for k in range(conns)]

    def run(k: int) -> None:
        with Client(seeds[k % len(seeds) :] + seeds[: k % len(seeds)], refresh_interval=None) as c:
            c.add_jobs(queue, share[k], batch=500)

    t = time.perf_counter()
    threads = [threading.Thread(target=run, args=(k,)) for k in range(conns)]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    return n / (time.perf_counter() - t)


def client_read(cluster: Cluster, queue: str, n: int) -> float:
    t = time.perf_counter()
    seen: set[str] = set()
    total = 0
    for port in cluster.ports:
        with Client("127.0.0.1:%d" % port, refresh_interval=None) as c:
            ids = [i for i in c.jscan(queue=queue) if i not in seen]
            seen.update(ids)
            for k in range(0, len(ids), 500):
                for reply in c._pipeline([(b"SHOW", i.encode()) for i in ids[k : k + 500]], None, True):
                    total += len(reply[reply.index(b"body") + 1])
    elapsed = time.perf_counter() - t
    assert len(seen) == n, (len(seen), n)
    return n / elapsed


def client_consume(cluster: Cluster, queue: str, n: int, count: int) -> float:
    done = 0
    t = time.perf_counter()
    clients = [Client("127.0.0.1:%d" % p, refresh_interval=None) for p in cluster.ports]
    previous: dict[int, list[bytes]] = {}
    idle = 0
    k = 0
    while done < n and idle < 200:
        i = k % len(clients)
        k += 1
        argvs: list[tuple] = []
        if previous.get(i):
            argvs.append((b"ACKJOB", *previous[i]))
        argvs.append((b"GETJOB", b"NOHANG", b"COUNT", count, b"WITHCOUNTERS", b"FROM", queue.encode()))
        got = clients[i]._pipeline(argvs, None, True)[-1]
        if not got:
            previous[i] = []
            idle += 1
            continue
        idle = 0
        ids = [item[1] for item in got]
        clients[i]._pipeline([(b"WORKING", j) for j in ids], None, True)
        previous[i] = ids
        done += len(ids)
    for i, ids in previous.items():
        if ids:
            clients[i]._pipeline([(b"ACKJOB", *ids)], None, True)
    elapsed = time.perf_counter() - t
    for c in clients:
        c.close()
    assert done == n, (done, n)
    return n / elapsed


def client_consume_collected(cluster: Cluster, queue: str, n: int, count: int) -> dict:
    """client_consume, and the time until every node has dropped the jobs (acks collected)."""
    t = time.perf_counter()
    rate = client_consume(cluster, queue, n, count)
    wait = wait_gone(cluster, queue)
    return {"rate": rate, "rate_collected": n / (time.perf_counter() - t), "ack_wait_s": wait}


# ------------------------------------------------------------------------ spark
def session(partitions: int) -> Any:
    os.environ["PYSPARK_PYTHON"] = sys.executable
    from pyspark.sql import SparkSession

    spark = (SparkSession.builder.master("local[2]").appName("disque-bench")
             .config("spark.ui.enabled", "false").config("spark.sql.shuffle.partitions", str(partitions))
             .getOrCreate())  # fmt: skip
    spark.sparkContext.setLogLevel("ERROR")
    return spark


def spark_write(spark: Any, cluster: Cluster, queue: str, n: int, partitions: int, conns: int) -> float:
    # The same 100-byte bodies as bodies(n), made by Spark itself (a Python list would travel first).
    df = spark.range(n, numPartitions=partitions).selectExpr(
        "cast(rpad(lpad(cast(id AS string), 10, '0'), %d, 'x') AS binary) AS body" % BODY_SIZE
    )
    t = time.perf_counter()
    (df.write.format("disque").option("nodes", cluster.nodes).option("queue", queue)
     .option("connections", conns).mode("append").save())  # fmt: skip
    return n / (time.perf_counter() - t)


def spark_write_dedup(spark: Any, cluster: Cluster, queue: str, n: int, partitions: int, conns: int) -> float:
    df = spark.range(n, numPartitions=partitions).selectExpr(
        "cast(rpad(lpad(cast(id AS string), 10, '0'), %d, 'x') AS binary) AS body" % BODY_SIZE, "id AS key"
    )
    t = time.perf_counter()
    (df.write.format("disque").option("nodes", cluster.nodes).option("queue", queue).option("connections", conns)
     .option("dedupColumn", "key").mode("append").save())  # fmt: skip
    return n / (time.perf_counter() - t)


def spark_sink(spark: Any, cluster: Cluster, queue: str, n: int, partitions: int, conns: int, tmp: Path) -> dict:
    source = tmp / ("sink-in-" + uuid.uuid4().hex[:8])
    df = spark.range(n, numPartitions=partitions).selectExpr(
        "cast(rpad(lpad(cast(id AS string), 10, '0'), %d, 'x') AS binary) AS body" % BODY_SIZE
    )
    df.write.parquet(str(source))
    t = time.perf_counter()
    query = (spark.readStream.schema(df.schema).parquet(str(source)).writeStream.format("disque")
             .option("nodes", cluster.nodes).option("queue", queue).option("connections", conns)
             .option("checkpointLocation", str(tmp / uuid.uuid4().hex)).trigger(availableNow=True).start())  # fmt: skip
    query.awaitTermination()
    elapsed = time.perf_counter() - t
    added = 0
    for port in cluster.ports:
        with Client("127.0.0.1:%d" % port, refresh_interval=None) as c:
            added += c.qlen(queue)
    assert added == n, (added, n)
    progress = [p for p in query.recentProgress if p["numInputRows"]]
    batch_ms = sum(p["durationMs"].get("triggerExecution", 0) for p in progress)
    return {"rate": n / elapsed, "rate_sustained": n / (batch_ms / 1000) if batch_ms else None,
            "seconds": elapsed, "batches": len(progress)}  # fmt: skip


def spark_read(spark: Any, cluster: Cluster, queue: str, n: int) -> float:
    from pyspark.sql import functions as F

    t = time.perf_counter()
    row = (spark.read.format("disque").option("nodes", cluster.nodes).option("queue", queue).load()
           .agg(F.count("*").alias("n"), F.sum(F.length("body")).alias("bytes")).collect()[0])  # fmt: skip
    elapsed = time.perf_counter() - t
    assert row["n"] == n and row["bytes"] == n * BODY_SIZE, row
    return n / elapsed


def spark_stream(spark: Any, cluster: Cluster, queue: str, n: int, per_trigger: int, tmp: Path, **options: Any) -> dict:
    t = time.perf_counter()
    reader = spark.readStream.format("disque").option("nodes", cluster.nodes).option("queue", queue)
    for key, value in options.items():
        reader = reader.option(key, value)
    query = (reader.option("maxJobsPerTrigger", per_trigger).load()
             .writeStream.format("noop").option("checkpointLocation", str(tmp / uuid.uuid4().hex))
             .trigger(availableNow=True).start())  # fmt: skip
    query.awaitTermination()
    elapsed = time.perf_counter() - t
    progress = query.recentProgress
    rows = sum(p["numInputRows"] for p in progress)
    batch_ms = [p["durationMs"].get("triggerExecution", 0) for p in progress if p["numInputRows"]]
    wait = wait_gone(cluster, queue)
    # sustained: rows over the wall time of the batches that carried rows (query start-up excluded)
    sustained = rows / (sum(batch_ms) / 1000) if batch_ms and sum(batch_ms) else None
    return {"rate": n / elapsed, "rate_sustained": sustained, "rate_collected": n / (elapsed + wait),
            "rows": rows, "seconds": elapsed, "batches": len(batch_ms),
            "batch_ms_median": statistics.median(batch_ms) if batch_ms else None, "ack_wait_s": wait}  # fmt: skip


def fill(cluster: Cluster, queue: str, n: int) -> None:
    client_write(cluster, n, 8, queue)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="scripts/bench spark", description=__doc__.split("\n\n")[0])
    p.add_argument("--jobs", type=int, default=100_000)
    p.add_argument("--repeat", type=int, default=2)
    p.add_argument("--only", default="write,read,stream,sink",
                   help="comma-separated subset of write, read, stream, sink, eventtime")  # fmt: skip
    p.add_argument("--partitions", type=int, default=2, help="write tasks (default 2)")
    p.add_argument("--connections", type=int, default=4, help="connections per write task (default 4)")
    p.add_argument("--max-per-trigger", type=int, default=20_000)
    p.add_argument("--write", metavar="FILE", help="JSON results (default bench-results/<date>-spark.json)")
    args = p.parse_args(argv)
    only = set(args.only.split(","))
    from . import progress
    from .common import machine_info

    results: dict[str, Any] = {"machine": machine_info(sys.executable), "args": vars(args), "runs": []}
    tmp = Path(tempfile.mkdtemp(prefix="bench-spark-"))
    cluster = Cluster(3, tmp / "nodes")
    spark = session(args.partitions)
    n = args.jobs
    conns = args.partitions * args.connections
    stack = contextlib.ExitStack()
    try:
        # Warm up: the first use of the source in a session starts Python workers and looks the
        # source up (several seconds); that is a session's fixed cost, not a rate.
        bar = stack.enter_context(progress.bar(1 + args.repeat, "scripts/bench spark"))  # warm-up, each round
        bar.doing("warm-up")
        t = time.perf_counter()
        spark_write(spark, cluster, "warm", 1000, args.partitions, args.connections)
        spark_read(spark, cluster, "warm", 1000)
        spark_stream(spark, cluster, "warm", 1000, 1000, tmp)
        if "sink" in only:
            spark_sink(spark, cluster, "warm-sink", 1000, args.partitions, args.connections, tmp)
        results["warmup_seconds"] = time.perf_counter() - t
        bar.done()
        for r in range(args.repeat):
            bar.doing("round %d of %d" % (r + 1, args.repeat))
            run: dict[str, Any] = {}
            if "write" in only:
                run["client_write_1conn"] = client_write(cluster, n, 1)
                run["client_write_%dconn" % conns] = client_write(cluster, n, conns)
                q = "sw-" + uuid.uuid4().hex[:8]
                run["spark_write"] = spark_write(spark, cluster, q, n, args.partitions, args.connections)
            if "read" in only:
                q = "r-" + uuid.uuid4().hex[:8]
                fill(cluster, q, n)
                run["client_read"] = client_read(cluster, q, n)
                run["spark_read"] = spark_read(spark, cluster, q, n)
            if "stream" in only:
                q = "c-" + uuid.uuid4().hex[:8]
                fill(cluster, q, n)
                run["client_consume"] = client_consume_collected(cluster, q, n, 1000)
                q = "s-" + uuid.uuid4().hex[:8]
                fill(cluster, q, n)
                run["spark_stream"] = spark_stream(spark, cluster, q, n, args.max_per_trigger, tmp)
                q = "l-" + uuid.uuid4().hex[:8]
                fill(cluster, q, n)
                run["spark_stream_working_on_take_false"] = spark_stream(
                    spark, cluster, q, n, args.max_per_trigger, tmp, workingOnTake="false"
                )
                q = "f-" + uuid.uuid4().hex[:8]
                fill(cluster, q, 2000)
                run["spark_stream_100_per_batch"] = spark_stream(spark, cluster, q, 2000, 100, tmp)
                q = "e-" + uuid.uuid4().hex[:8]
                fill(cluster, q, n)
                run["spark_stream_event_time_false"] = spark_stream(
                    spark, cluster, q, n, args.max_per_trigger, tmp, eventTime="false"
                )
            if "eventtime" in only and "stream" not in only:
                pair = [("spark_stream", {}), ("spark_stream_event_time_false", {"eventTime": "false"})]
                for key, options in pair if r % 2 == 0 else pair[::-1]:
                    q = "et-" + uuid.uuid4().hex[:8]
                    fill(cluster, q, n)
                    run[key] = spark_stream(spark, cluster, q, n, args.max_per_trigger, tmp, **options)
            if "sink" in only:
                for name, write in (("spark_write", spark_write), ("spark_write_dedup", spark_write_dedup)):
                    if name not in run:
                        run[name] = write(spark, cluster, "k-" + uuid.uuid4().hex[:8], n, args.partitions,
                                          args.connections)  # fmt: skip
                q = "sk-" + uuid.uuid4().hex[:8]
                run["spark_stream_sink"] = spark_sink(spark, cluster, q, n, args.partitions, args.connections, tmp)
            results["runs"].append(run)
            bar.done()
            progress.echo("run %d: %s" % (r + 1, json.dumps(run, default=str)), err=False)
    finally:
        stack.close()
        spark.stop()
        cluster.stop()

    def best(key: str, field: str = "rate") -> float | None:
        vals = [run[key].get(field) if isinstance(run.get(key), dict) else run.get(key) for run in results["runs"]]
        vals = [v for v in vals if v]
        return max(vals) if vals else None

    print("\n| %d jobs of %d bytes, 3 nodes, local[2] (best of %d) | rows/s |" % (n, BODY_SIZE, args.repeat))
    print("|---|---|")
    keys = sorted({k for run in results["runs"] for k in run})
    for key in keys:
        fields = ["rate"]
        if any(isinstance(run.get(key), dict) for run in results["runs"]):
            fields += [f for f in ("rate_sustained", "rate_collected") if best(key, f)]
        for field in fields:
            v = best(key, field)
            label = key if field == "rate" else "%s (%s)" % (key, field[5:])
            print("| %s | %s |" % (label, "{:,.0f}".format(v) if v else "—"))
    fixed = [run["spark_stream_100_per_batch"]["batch_ms_median"] for run in results["runs"]
             if "spark_stream_100_per_batch" in run]  # fmt: skip
    if fixed:
        print("| Spark fixed cost per micro-batch (median triggerExecution, 100-job batches) | %.0f ms |" % min(fixed))
    out = Path(args.write) if args.write else ROOT / "bench-results" / ("%s-spark.json" % time.strftime("%Y%m%d-%H%M%S"))
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(results, indent=2, default=str))
    print("raw results: %s" % out)
    return 0
