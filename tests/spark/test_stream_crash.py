"""A streaming query killed with kill -9 in the middle of a batch, restarted from its checkpoint."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from disque_py.client import Client
from tests.integration.conftest import wait_for
from tests.spark.stream_app import queue_to_queue, to_files
from tests.spark.test_source import jobs_left, queued

APP = Path(__file__).with_name("stream_app.py")


def run_app(nodes: str, queue: str, tmp: Path, run: str, *extra: str) -> subprocess.Popen:
    env = dict(os.environ, PYSPARK_PYTHON=sys.executable, PYTHONUNBUFFERED="1")
    log = open(tmp / ("%s.log" % run), "wb")
    return subprocess.Popen(
        [sys.executable, str(APP), nodes, queue, str(tmp / "ck"), str(tmp / "out"), run, *extra],
        stdout=log, stderr=subprocess.STDOUT, env=env, start_new_session=True,
    )


def queue_report(cluster, queue: str) -> str:
    """Why ``every_job_queued`` is false: each node's QLEN and the states of its copies, and a few
    jobs queued nowhere as each node sees them."""
    lines, where = [], {}
    for n in cluster:
        with Client("127.0.0.1:%d" % n.port, refresh_interval=None) as c:
            states: dict[str, int] = {}
            for j in c.jscan(queue=queue, reply="all"):
                states[j["state"]] = states.get(j["state"], 0) + 1
                where.setdefault(j["id"], []).append((n.port, j["state"]))
            lines.append("node %d: qlen %d, copies %s" % (n.port, c.qlen(queue), states))
    odd = [(i, w) for i, w in where.items() if all(s not in ("queued", "acked") for _, s in w)]
    lines.append("%d jobs queued nowhere, e.g. %s" % (len(odd), odd[:5]))
    for job_id, _ in odd[:3]:
        for n in cluster:
            with Client("127.0.0.1:%d" % n.port, refresh_interval=None) as c:
                lines.append("  %s on %d: %s" % (job_id, n.port, {k: v for k, v in (c.show(job_id) or {}).items()
                                                                  if k != "body"}))  # fmt: skip
    return "\n".join(lines)


def every_job_queued(cluster, queue: str) -> bool:
    """Every job of ``queue`` not acknowledged is queued on some node: those a killed driver had
    taken are back after their RETRY (a Trigger.AvailableNow query counts the queued jobs when it
    starts). On one node or more: two holders whose RETRY ended together both queue a job until
    the QUEUED of one reaches the other, so the sum of QLEN may count a job twice."""
    states: dict[str, bool] = {}
    for n in cluster:
        with Client("127.0.0.1:%d" % n.port, refresh_interval=None) as c:
            for j in c.jscan(queue=queue, reply="all"):
                if j["state"] == "acked":
                    states[j["id"]] = True  # acknowledged somewhere: not waiting to be queued
                else:
                    states[j["id"]] = states.get(j["id"], False) or j["state"] == "queued"
    return all(states.values())


@pytest.mark.timeout(300)
def test_killed_query_restarts_from_its_checkpoint_and_loses_nothing(spark, nodes_option, queue, cluster, tmp_path):
    # The first driver runs in a process of its own, to be killed.
    (tmp_path / "out").mkdir()
    with Client(nodes_option) as c:
        # 2,000 jobs, 500 a batch: the driver killed in batch 2 (1,500 taken), the restart replays
        # it and goes on with one more
        ids = c.add_jobs(queue, [b"c%d" % i for i in range(2000)], retry=3)

    first = run_app(nodes_option, queue, tmp_path, "run1", "--hang-at", "2")
    try:
        wait_for(lambda: (tmp_path / "out" / "hanging").exists() or first.poll() is not None, 120,
                 what="the query to reach batch 2")  # fmt: skip
        assert first.poll() is None, (tmp_path / "run1.log").read_text(errors="replace")[-3000:]
    finally:
        os.killpg(first.pid, signal.SIGKILL)  # the driver, its JVM and its Python workers at once
        first.wait(30)

    # Restarted in the test session's own SparkSession (another driver; no second JVM to start),
    # once the jobs the killed driver held are queued again: availableNow counts queued jobs.
    wait_for(lambda: every_job_queued(cluster, queue), 60, what="the killed driver's jobs queued again")
    second = (to_files(spark, nodes_option, queue, 500, tmp_path / "out", "run2")
              .option("checkpointLocation", str(tmp_path / "ck")).trigger(availableNow=True).start())  # fmt: skip
    assert second.awaitTermination(180)
    assert second.exception() is None

    deliveries = [i for f in sorted((tmp_path / "out").glob("run*.json")) for i in json.loads(f.read_text())]
    assert set(deliveries) == set(ids), "lost: %d" % len(set(ids) - set(deliveries))
    duplicates = len(deliveries) - len(set(deliveries))
    print("deliveries %d, duplicates %d" % (len(deliveries), duplicates))
    assert duplicates <= 500  # at most the batch that was running when the query died
    wait_for(lambda: jobs_left(cluster, queue) == 0, 30, what="every job acknowledged")


# Queue to queue through writeStream.format("disque"), the driver killed at random points. CI runs
# it small (1,000 jobs, one kill, local[2]); the full proof, run alone on the standalone cluster:
#   DISQUE_SPARK_CRASH_JOBS=50000 DISQUE_SPARK_CRASH_KILLS=2 \
#     .venv/bin/python -m pytest -p no:cacheprovider tests/spark/test_stream_crash.py -k queue_to_queue
CRASH_JOBS = int(os.environ.get("DISQUE_SPARK_CRASH_JOBS", "1000"))
CRASH_KILLS = int(os.environ.get("DISQUE_SPARK_CRASH_KILLS", "1"))
# The source jobs' RETRY: short, so that the jobs a killed driver held come back soon, but not
# shorter than the nodes' bus can keep up with. Each holder of a copy a job is not queued on
# announces WILLQUEUE to the others once per RETRY and the node that has it queued answers
# QUEUED: for 50,000 jobs of 3 copies and RETRY 5, tens of thousands of bus messages a second,
# more than three pure-Python nodes sharing two cores keep up with; once the answers come later
# than RETRY the copies queue the job before hearing that it is queued elsewhere, and the cluster
# churns (every job queued on every node, again and again) instead of settling.
CRASH_RETRY = max(5, CRASH_JOBS // 1000)


def jobs_by_id(cluster, queue: str) -> dict[str, bytes]:
    """Every job of ``queue`` known to any node, not acknowledged: ID -> body."""
    out: dict[str, bytes] = {}
    for n in cluster:
        with Client("127.0.0.1:%d" % n.port, refresh_interval=None) as c:
            out.update((j["id"], j["body"]) for j in c.jscan(queue=queue, reply="all") if j["state"] != "acked")
    return out


@pytest.mark.timeout(300 + CRASH_JOBS // 50 + 240 * CRASH_KILLS + 3 * CRASH_RETRY)
def test_queue_to_queue_killed_at_random_points_writes_each_output_once(request, spark_master, nodes_option, queue,
                                                                        cluster, tmp_path):  # fmt: skip
    """A query reading QUEUE and writing each job's body to TARGET (the stream sink, its DEDUP keys
    made of the query id, the batch id and the row's place), kill -9'd at a random point while it
    writes, then run to the end from its checkpoint: TARGET holds each output once, QUEUE is empty.

    In CI the last run is the test session's own SparkSession (no second JVM to start); the full
    proof runs every driver in a process of its own on the standalone cluster."""
    import random

    target = queue + "-out"
    (tmp_path / "out").mkdir()
    full = CRASH_JOBS > 2000 and spark_master.startswith("spark://")
    master = spark_master if full else "local[2]"
    with Client(nodes_option) as c:
        for k in range(0, CRASH_JOBS, 5000):
            bodies = [b"j%d" % i for i in range(k, min(CRASH_JOBS, k + 5000))]
            # ASYNC (the copies made in the background) and each body its own DEDUP key: a chunk
            # refused in part (-NOREPL on a machine so busy that a node looks down for a moment) is
            # sent again without adding a job twice.
            wait_for(lambda: c.add_jobs(queue, bodies, retry=CRASH_RETRY, async_=True, dedup=lambda b: b), 300,
                     interval=1, what="the source jobs added")  # fmt: skip
    rng = random.Random()
    for kill in range(CRASH_KILLS):
        run = "kill%d" % kill
        done = queued(cluster, target)
        at = done + rng.randint(1, max(2, (CRASH_JOBS - done) // (CRASH_KILLS - kill + 1)))
        app = run_app(nodes_option, queue, tmp_path, run, "--to-queue", target, "--master", master)
        try:
            wait_for(lambda: queued(cluster, target) >= at or app.poll() is not None, 240, interval=0.1,
                     what="the query to write %d jobs" % at)  # fmt: skip
            assert app.poll() is None, (tmp_path / ("%s.log" % run)).read_text(errors="replace")[-3000:]
        finally:
            os.killpg(app.pid, signal.SIGKILL)  # the driver, its JVM and its Python workers at once
            app.wait(30)
        print("kill %d: after %d outputs (aimed at %d)" % (kill + 1, queued(cluster, target), at))

    try:
        wait_for(lambda: every_job_queued(cluster, queue), 120 + 3 * CRASH_RETRY, interval=1,
                 what="the killed driver's jobs queued again")  # fmt: skip
    except AssertionError as exc:
        raise AssertionError("%s\n%s" % (exc, queue_report(cluster, queue))) from None
    if full:
        last = run_app(nodes_option, queue, tmp_path, "last", "--to-queue", target, "--master", master,
                       "--available-now")  # fmt: skip
        try:
            assert last.wait(120 + CRASH_JOBS // 100) == 0, (tmp_path / "last.log").read_text(errors="replace")[-3000:]
        finally:
            if last.poll() is None:
                os.killpg(last.pid, signal.SIGKILL)
    else:
        spark = request.getfixturevalue("spark")
        query = (queue_to_queue(spark, nodes_option, queue, target, 500)
                 .option("checkpointLocation", str(tmp_path / "ck")).trigger(availableNow=True).start())  # fmt: skip
        assert query.awaitTermination(180)
        assert query.exception() is None

    out = jobs_by_id(cluster, target)
    bodies = sorted(out.values())
    assert len(bodies) == len(set(bodies)), "duplicates: %d" % (len(bodies) - len(set(bodies)))
    assert set(bodies) == {b"done j%d" % i for i in range(CRASH_JOBS)}, "lost: %d" % (CRASH_JOBS - len(set(bodies)))
    wait_for(lambda: jobs_left(cluster, queue) == 0, 60, what="every source job acknowledged")
    print("%d jobs, %d kills: %d outputs, each once; source empty" % (CRASH_JOBS, CRASH_KILLS, len(out)))
