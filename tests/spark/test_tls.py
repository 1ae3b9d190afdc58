"""The ``disque`` data source over TLS, as a named user, against a real TLS-only node (port 0):
one write and one read, with the client certificate the node requires."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from disque_py.cli import launcher
from tests.integration.conftest import ROOT, NodeProcess, fail_unclean, free_port, unclean

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from tls_certs import make_certs  # noqa: E402


@pytest.fixture
def tls_node(tmp_path):
    certs = make_certs(tmp_path / "certs")
    tls_port = free_port()
    node = NodeProcess(
        tmp_path, tls_port=tls_port, tls_cert_file=str(certs.server_cert), tls_key_file=str(certs.server_key),
        tls_ca_cert_file=str(certs.ca), user=("etl", "on", ">etlpw", "allkeys", "+@all"), requirepass="defaultpw",
    )  # fmt: skip
    argv = node.args()
    argv[argv.index("--port") + 1] = "0"  # TLS only
    proc = launcher.spawn(argv, output=node.log_path, cwd=ROOT)
    ctx = launcher.tls_context(certs.ca, certs.client_cert, certs.client_key)
    try:
        launcher.wait_ready(proc, tls_port, ssl_context=ctx, timeout=20, logs=[node.log_path])
        yield tls_port, certs, ctx
    finally:
        fail_unclean([unclean("node on TLS port %d" % tls_port, launcher.stop(proc, timeout=10), node.log())])


def test_write_then_read_over_tls_as_a_user(spark, tls_node, queue):
    tls_port, certs, ctx = tls_node
    options = {
        "nodes": "rediss://127.0.0.1:%d" % tls_port, "tls.caCert": str(certs.ca),
        "tls.cert": str(certs.client_cert), "tls.key": str(certs.client_key), "username": "etl", "password": "etlpw",
    }  # fmt: skip
    df = spark.range(200).selectExpr("concat('tls-', id) AS body")
    df.write.format("disque").options(**options).option("queue", queue).mode("append").save()
    assert launcher.call(tls_port, "QLEN", queue, username="etl", password="etlpw", ssl_context=ctx) == 200

    rows = spark.read.format("disque").options(**options).option("queue", queue).load().collect()
    assert sorted(bytes(r.body) for r in rows) == sorted(b"tls-%d" % i for i in range(200))
    assert {r.state for r in rows} == {"queued"}

    # the same options without the client certificate: the node refuses, the error says so
    del options["tls.cert"], options["tls.key"]
    with pytest.raises(Exception, match="no node of the cluster answered"):
        spark.read.format("disque").options(**options).option("queue", queue).load().collect()
