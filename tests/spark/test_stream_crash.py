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
from tests.spark.test_source import jobs_left

APP = Path(__file__).with_name("stream_app.py")


def run_app(nodes: str, queue: str, tmp: Path, run: str, *extra: str) -> subprocess.Popen:
    env = dict(os.environ, PYSPARK_PYTHON=sys.executable, PYTHONUNBUFFERED="1")
    log = open(tmp / ("%s.log" % run), "wb")
    return subprocess.Popen(
        [sys.executable, str(APP), nodes, queue, str(tmp / "ck"), str(tmp / "out"), run, *extra],
        stdout=log, stderr=subprocess.STDOUT, env=env, start_new_session=True,
    )


@pytest.mark.timeout(300)
def test_killed_query_restarts_from_its_checkpoint_and_loses_nothing(spark, nodes_option, queue, cluster, tmp_path):
    # ``spark``: only to skip without Java; the query runs in processes of its own.
    (tmp_path / "out").mkdir()
    with Client(nodes_option) as c:
        ids = c.add_jobs(queue, [b"c%d" % i for i in range(3000)], retry=3)

    first = run_app(nodes_option, queue, tmp_path, "run1", "--hang-at", "2")
    try:
        wait_for(lambda: (tmp_path / "out" / "hanging").exists() or first.poll() is not None, 120,
                 what="the query to reach batch 2")  # fmt: skip
        assert first.poll() is None, (tmp_path / "run1.log").read_text(errors="replace")[-3000:]
    finally:
        os.killpg(first.pid, signal.SIGKILL)  # the driver, its JVM and its Python workers at once
        first.wait(30)

    second = run_app(nodes_option, queue, tmp_path, "run2", "--available-now")
    try:
        assert second.wait(180) == 0, (tmp_path / "run2.log").read_text(errors="replace")[-3000:]
    finally:
        if second.poll() is None:
            os.killpg(second.pid, signal.SIGKILL)

    deliveries = [i for f in sorted((tmp_path / "out").glob("run*.json")) for i in json.loads(f.read_text())]
    assert set(deliveries) == set(ids), "lost: %d" % len(set(ids) - set(deliveries))
    duplicates = len(deliveries) - len(set(deliveries))
    print("deliveries %d, duplicates %d" % (len(deliveries), duplicates))
    assert duplicates <= 500  # at most the batch that was running when the query died
    wait_for(lambda: jobs_left(cluster, queue) == 0, 30, what="every job acknowledged")
