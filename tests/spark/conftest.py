"""Fixtures for the Spark data source tests: one local SparkSession and one 3-node cluster.

The session is ``local[2]`` with the UI off, shared by every test of this
directory (a session costs ~10 s to start). Executors and the data source's
driver-side processes run this interpreter (``PYSPARK_PYTHON``), which sees
``pyspark_disque`` as an installed top-level module: nothing registers the
source. Without Java, or without pyspark/pyarrow, every test here is skipped
with the reason in the summary.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import uuid

import pytest

from tests.client.conftest import start_cluster, stop_all

pyspark = pytest.importorskip("pyspark", reason="pyspark is not installed (pip install -e '.[spark]')")
pytest.importorskip("pyarrow", reason="pyarrow is not installed (pip install -e '.[spark]')")


def _java_problem() -> str | None:
    java = shutil.which("java") or (os.environ.get("JAVA_HOME") and os.path.join(os.environ["JAVA_HOME"], "bin", "java"))
    if not java or not os.path.exists(java):
        return "no Java found (Spark needs a JDK 17+: apt-get install openjdk-17-jre-headless)"
    try:
        out = subprocess.run([java, "-version"], capture_output=True, text=True, timeout=30).stderr
    except (OSError, subprocess.SubprocessError) as exc:
        return "java does not run: %s" % exc
    if '"1.' in out:
        return "Java is too old for Spark 4 (%s)" % out.splitlines()[0]
    return None


def pytest_collection_modifyitems(items):
    # Under pytest-xdist (scripts/test), every Spark test runs in one worker: one SparkSession.
    # The first test to run pays the SparkSession's start (10 s, over 30 s on a busy machine) inside
    # pytest-timeout's budget: a Spark test without a timeout of its own gets a longer one.
    for item in items:
        if "tests/spark/" in str(item.fspath).replace("\\", "/"):
            item.add_marker(pytest.mark.xdist_group("spark"))
            if item.get_closest_marker("timeout") is None:
                item.add_marker(pytest.mark.timeout(180))


@pytest.fixture(scope="session")
def spark(tmp_path_factory):
    problem = _java_problem()
    if problem:
        pytest.skip("Spark tests skipped: " + problem)
    os.environ["PYSPARK_PYTHON"] = sys.executable
    os.environ["PYSPARK_DRIVER_PYTHON"] = sys.executable
    from pyspark.sql import SparkSession

    warehouse = tmp_path_factory.mktemp("spark")
    session = (
        SparkSession.builder.master("local[2]")
        .appName("disque-py-tests")
        .config("spark.ui.enabled", "false")
        .config("spark.sql.shuffle.partitions", "2")
        .config("spark.sql.warehouse.dir", str(warehouse / "warehouse"))
        .config("spark.driver.extraJavaOptions", "-Dderby.system.home=%s" % warehouse)
        .config("spark.sql.streaming.noDataMicroBatches.enabled", "true")
        .getOrCreate()
    )
    session.sparkContext.setLogLevel("ERROR")
    yield session
    session.stop()


@pytest.fixture(scope="session")
def cluster(tmp_path_factory):
    nodes = start_cluster(tmp_path_factory.mktemp("spark-cluster"), 3, loglevel="notice")
    yield nodes
    stop_all(nodes)


@pytest.fixture
def nodes_option(cluster) -> str:
    return ",".join("127.0.0.1:%d" % n.port for n in cluster)


@pytest.fixture
def queue() -> str:
    return "spark-" + uuid.uuid4().hex[:10]
