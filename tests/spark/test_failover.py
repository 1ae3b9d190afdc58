"""The source with a node that is down: writes fail over, streams go on with the nodes left."""

from __future__ import annotations

import signal
import pytest

from disque_py.client import Client
from tests.client.conftest import make_cluster  # noqa: F401 - the fixture
from tests.integration.conftest import wait_for
from tests.integration.test_spark_spread import closing_listener
from tests.spark.test_source import collecting_sink, stream


def test_write_fails_over_from_a_dead_node_in_the_list(spark, nodes_option, queue, cluster):
    with closing_listener() as (dead, accepted):  # a node that drops every connection
        live = nodes_option.split(",")
        nodes = ",".join([live[0], "%s:%d" % dead, *live[1:]])
        # One connection per task: task p writes on node p mod 4 of the list, so task 1 is given
        # the dead node on purpose, tries it first and fails over; the others never try it (nor
        # does the driver's check, which asks the first node of the list).
        df = spark.range(0, 2000, 1, 4).selectExpr("cast(id AS string) AS body")
        df.write.format("disque").option("nodes", nodes).option("queue", queue).option("connections", 1).option(
            "batchSize", 50).option("connectTimeout", 0.5).mode("append").save()  # fmt: skip
        assert len(accepted) == 1
    lens = [Client("127.0.0.1:%d" % n.port, refresh_interval=None).qlen(queue) for n in cluster]
    assert sum(lens) == 2000
    assert all(n >= 500 for n in lens)  # tasks 0, 2 and 3 wrote on their live nodes


@pytest.mark.timeout(240)
def test_stream_goes_on_when_a_node_dies(spark, make_cluster, tmp_path):  # noqa: F811
    nodes = make_cluster(3)
    option = ",".join("127.0.0.1:%d" % n.port for n in nodes)
    with Client(option) as c:
        ids = set(c.add_jobs("failover", [b"f%d" % i for i in range(600)], retry=2, replicate=3))
    seen, sink = collecting_sink()
    query = stream(spark, option, "failover", tmp_path / "ck", sink, {"processingTime": "500 milliseconds"},
                   maxJobsPerTrigger=100, connectTimeout=0.5)  # fmt: skip
    try:
        wait_for(lambda: len(seen) >= 100, 60, what="a first batch")
        nodes[2].stop(signal.SIGKILL)  # its queued jobs come back through the copies' RETRY timers
        wait_for(lambda: {r.id for r in seen} >= ids, 120, what="every job delivered by the nodes left")
        survivors = [Client("127.0.0.1:%d" % n.port, refresh_interval=None) for n in nodes[:2]]
        wait_for(lambda: sum(s.qlen("failover") for s in survivors) == 0
                 and not any(j["state"] != "acked" for s in survivors for j in s.jscan(queue="failover", reply="all")),
                 60, what="every job acknowledged on the nodes left")  # fmt: skip
    finally:
        query.stop()
    assert query.exception() is None
