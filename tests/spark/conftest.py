"""Fixtures for the Spark data source tests: one Spark standalone cluster, one SparkSession, one
3-node disque-py cluster.

Spark runs as a real **standalone cluster**, started from pyspark's own
launcher (``pyspark/bin/spark-class``, shipped in the pip package): a master
and two workers (1 core, 512 MB each), each a process of its own, started
once per session; the session's executors run on the workers, so a task
runs in another JVM than the driver and a failed task is retried (at most
``spark.task.maxFailures`` = 2 attempts), as on a real cluster.
``DISQUE_SPARK_MASTER=local[2]`` runs the same tests in one process instead
(faster to start, no task retries). Executors and the data source's
driver-side processes run this interpreter (``PYSPARK_PYTHON``), which sees
``pyspark_disque`` as an installed top-level module: nothing registers the
source. Without Java, or without pyspark/pyarrow, every test here is skipped
with the reason in the summary.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import urllib.request
import uuid
from pathlib import Path

import pytest

from tests.client.conftest import start_cluster, stop_all
from tests.integration.conftest import free_port, wait_for
from tests.spark.stream_app import JVM_OPTIONS

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


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(items):
    # Under pytest-xdist (scripts/test), every Spark test runs in one worker: one SparkSession and
    # one standalone cluster. First among the hooks: xdist's own turns the xdist_group marks into
    # the test IDs' "@spark" that --dist loadgroup schedules by, and marks added after it are lost.
    # (pytest 9.2 ignores that ID, pyproject.toml keeps it below: every worker then started a
    # Spark cluster of its own, and the Spark tests took some 60 s each instead of 5-20.)
    # The first test to run pays the SparkSession's start (10 s, over 30 s on a busy machine) inside
    # pytest-timeout's budget: a Spark test without a timeout of its own gets a longer one.
    for item in items:
        if "tests/spark/" in str(item.fspath).replace("\\", "/"):
            item.add_marker(pytest.mark.xdist_group("spark"))
            if item.get_closest_marker("timeout") is None:
                item.add_marker(pytest.mark.timeout(180))


class StandaloneCluster:
    """A Spark standalone master and its workers, each its own process (``spark-class``)."""

    def __init__(self, base: Path, workers: int = 2, cores: int = 1, memory: str = "512m") -> None:
        import pyspark

        self.home = Path(pyspark.__file__).parent
        self.base = base
        self.workers, self.cores, self.memory = workers, cores, memory
        self.port, self.ui_port = free_port(), free_port()
        self.procs: list[subprocess.Popen] = []

    @property
    def url(self) -> str:
        return "spark://127.0.0.1:%d" % self.port

    def _spawn(self, name: str, *args: str) -> None:
        env = dict(os.environ, SPARK_HOME=str(self.home), SPARK_LOCAL_IP="127.0.0.1",
                   SPARK_DAEMON_MEMORY="256m", SPARK_DAEMON_JAVA_OPTS=JVM_OPTIONS, SPARK_NO_DAEMONIZE="1")  # fmt: skip
        log = open(self.base / ("%s.log" % name), "wb")
        self.procs.append(subprocess.Popen(
            ["bash", str(self.home / "bin" / "spark-class"), *args],
            stdout=log, stderr=subprocess.STDOUT, env=env, start_new_session=True,
        ))  # fmt: skip
        log.close()

    def state(self) -> dict:
        with urllib.request.urlopen("http://127.0.0.1:%d/json/" % self.ui_port, timeout=2) as reply:
            return json.load(reply)

    def logs(self) -> str:
        logs = sorted(self.base.glob("*.log"))
        return "\n".join("== %s\n%s" % (p.name, p.read_text(errors="replace")[-2000:]) for p in logs)

    def start(self) -> "StandaloneCluster":
        self._spawn("master", "org.apache.spark.deploy.master.Master", "--host", "127.0.0.1",
                    "--port", str(self.port), "--webui-port", str(self.ui_port))  # fmt: skip
        for k in range(self.workers):
            work = self.base / ("work-%d" % k)
            work.mkdir()
            self._spawn("worker-%d" % k, "org.apache.spark.deploy.worker.Worker", "--host", "127.0.0.1",
                        "--cores", str(self.cores), "--memory", self.memory, "--webui-port", str(free_port()),
                        "--work-dir", str(work), self.url)  # fmt: skip
        try:
            wait_for(lambda: self._alive() or self._died(), 120, interval=0.5,
                     what="a Spark master with %d workers" % self.workers)  # fmt: skip
            if self._died():
                raise AssertionError("a Spark daemon exited")
        except AssertionError as exc:
            self.stop()
            raise AssertionError("the Spark standalone cluster did not start (%s):\n%s" % (exc, self.logs())) from None
        return self

    def _alive(self) -> bool:
        return self.state().get("aliveworkers") == self.workers

    def _died(self) -> bool:
        return any(p.poll() is not None for p in self.procs)

    def stop(self) -> None:
        for p in reversed(self.procs):
            if p.poll() is None:
                p.terminate()
        for p in reversed(self.procs):
            try:
                p.wait(20)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait(10)


@pytest.fixture(scope="session")
def spark_master(tmp_path_factory):
    """The master URL of the session: a standalone cluster's (see the module docstring)."""
    problem = _java_problem()
    if problem:
        pytest.skip("Spark tests skipped: " + problem)
    if os.environ.get("DISQUE_SPARK_MASTER"):
        yield os.environ["DISQUE_SPARK_MASTER"]
        return
    standalone = StandaloneCluster(tmp_path_factory.mktemp("spark-standalone")).start()
    yield standalone.url
    standalone.stop()


@pytest.fixture(scope="session")
def spark(tmp_path_factory, spark_master):
    os.environ["PYSPARK_PYTHON"] = sys.executable
    os.environ["PYSPARK_DRIVER_PYTHON"] = sys.executable
    from pyspark.sql import SparkSession

    warehouse = tmp_path_factory.mktemp("spark")
    builder = (
        SparkSession.builder.master(spark_master)
        .appName("disque-py-tests")
        .config("spark.ui.enabled", "false")
        .config("spark.sql.shuffle.partitions", "2")
        .config("spark.sql.warehouse.dir", str(warehouse / "warehouse"))
        .config("spark.driver.extraJavaOptions", "-Dderby.system.home=%s %s" % (warehouse, JVM_OPTIONS))
        .config("spark.executor.extraJavaOptions", JVM_OPTIONS)
        .config("spark.sql.streaming.noDataMicroBatches.enabled", "true")
    )
    if spark_master.startswith("spark://"):
        builder = (
            builder.config("spark.driver.host", "127.0.0.1").config("spark.driver.bindAddress", "127.0.0.1")
            .config("spark.executor.memory", "512m").config("spark.executor.cores", "1")
            .config("spark.cores.max", "2").config("spark.task.maxFailures", "2")
            .config("spark.executorEnv.PYTHONPATH", os.environ.get("PYTHONPATH", ""))
        )  # fmt: skip
    session = builder.getOrCreate()
    session.sparkContext.setLogLevel("ERROR")
    if spark_master.startswith("spark://"):
        # Both executors registered before the first test: its tasks run on the workers.
        # (getExecutorMemoryStatus lists the driver too.)
        wait_for(lambda: session.sparkContext._jsc.sc().getExecutorMemoryStatus().size() >= 3, 120, interval=0.5,
                 what="two executors on the standalone workers")  # fmt: skip
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
