"""Who may use the admin port: Basic auth against the node's users, protected mode, HTTPS."""

from __future__ import annotations

import socket
import ssl
import sys
from pathlib import Path

import pytest

from disque_py.cli import launcher
from tests.integration.conftest import wait_for
from tests.integration.test_protected_mode import outside as outside  # noqa: F401 - a fixture

from .conftest import admin_port, free_port, http, job_path, ping_within, validated
from .test_hardening import exchange

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from tls_certs import make_certs  # noqa: E402

pytestmark = pytest.mark.integration

USERS = """\
requirepass defpw
user viewer on >vpw allkeys +@inspect
user consumer on >cpw allkeys +@consume
user ops on >apw allkeys +@all
user off off >xpw allkeys +@all
"""


@pytest.fixture
def acl_nodes(start_node, tmp_path):
    conf = tmp_path / "acl.conf"
    conf.write_text(USERS)
    nodes = []
    for _ in range(2):
        n = start_node(config_file=str(conf), admin_port=free_port())
        n.password = "defpw"
        nodes.append(n)
    launcher.join([(n.host, n.port) for n in nodes], timeout=30, password="defpw")
    return nodes


def test_basic_auth_and_rights(acl_nodes):
    a, b = acl_nodes
    port = admin_port(a)
    job = a.client().execute_command("ADDJOB", "q", "x", 0, "REPLICATE", 1).decode()

    assert http(port, "GET", "/healthz").status == 200  # no auth for liveness
    for path in ("/api/queues", "/api/cluster", "/metrics", "/readyz", job_path(job)):
        r = http(port, "GET", path)
        assert r.status == 401, path
        assert r.headers["www-authenticate"].startswith("Basic")
        assert "error" in r.json()
    validated(http(port, "GET", "/api/queues"), "get", "/api/queues")
    assert http(port, "GET", "/api/queues", auth=("viewer", "wrong")).status == 401
    assert http(port, "GET", "/api/queues", auth=("off", "xpw")).status == 401  # a user turned off
    assert http(port, "GET", "/api/queues", auth=("anyone", "defpw")).status == 200  # requirepass: any name
    assert http(port, "GET", "/api/queues", auth=("default", "defpw")).status == 200

    r = validated(http(port, "GET", "/api/queues", auth=("viewer", "vpw")), "get", "/api/queues")
    assert r.status == 200 and r.json()["queues"][0]["name"] == "q"
    assert http(port, "GET", "/metrics", auth=("viewer", "vpw")).status == 200
    r = http(port, "POST", "/api/queues/q/pause", body={"mode": "in"}, auth=("viewer", "vpw"))
    assert r.status == 403 and "NOPERM" in r.json()["error"]

    # @consume may not read the node, but may act on a job
    r = validated(http(port, "GET", "/api/queues", auth=("consumer", "cpw")), "get", "/api/queues")
    assert r.status == 403
    r = http(port, "POST", job_path(job, "ack"), auth=("consumer", "cpw"))
    assert r.status == 200 and r.json()["result"] == 1

    r = http(port, "POST", "/api/queues/q/pause", body={"mode": "in"}, auth=("ops", "apw"))
    assert r.status == 200 and r.json()["paused"] == "in"

    # the peers are asked with the caller's credentials: b answers the viewer (INFO), but not
    # CONFIG GET (no @admin right), so its admin port is unknown
    def both_reachable():
        v = validated(http(port, "GET", "/api/cluster", auth=("viewer", "vpw")), "get", "/api/cluster").json()
        return len(v["nodes"]) == 2 and all(n["reachable"] for n in v["nodes"]) and v

    v = wait_for(both_reachable, timeout=20, what="both nodes reachable")
    b_id = b.client().execute_command("CLUSTER", "MYID").decode()
    assert {n["id"]: n for n in v["nodes"]}[b_id]["admin_port"] is None
    v = http(port, "GET", "/api/cluster", auth=("ops", "apw")).json()
    assert {n["id"]: n for n in v["nodes"]}[b_id]["admin_port"] == admin_port(b)


def _raw_get(host: str, port: int) -> tuple[bytes, bool]:
    """A GET from ``host``; (what came back, whether the node closed the link)."""
    return exchange(port, b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n", 10, host=host,
                    until=lambda data: data.endswith(b"ok") and b"200" in data.split(b"\r\n", 1)[0])


def test_a_non_loopback_client_is_refused_in_protected_mode(start_node, outside):
    node = start_node(bind=None, admin_port=free_port())
    port = admin_port(node)
    data, closed = _raw_get(outside, port)
    assert data.startswith(b"HTTP/1.1 403 "), data
    assert b"protected mode" in data and closed
    assert http(port, "GET", "/healthz").status == 200  # loopback is served
    ping_within(node)


def test_admin_bind_is_the_operators_decision(start_node, outside):
    node = start_node(bind=None, admin_port=free_port(), admin_bind="0.0.0.0")
    data, closed = _raw_get(outside, admin_port(node))
    assert data.startswith(b"HTTP/1.1 200 "), data


def test_admin_tls_serves_https_with_the_nodes_certificate(start_node, tmp_path):
    certs = make_certs(tmp_path / "certs")
    node = start_node(admin_port=free_port(), admin_tls="yes", tls_cert_file=str(certs.server_cert),
                      tls_key_file=str(certs.server_key))  # fmt: skip
    port = admin_port(node)
    ctx = ssl.create_default_context(cafile=str(certs.ca))
    ctx.check_hostname = False
    r = http(port, "GET", "/healthz", tls=ctx)
    assert (r.status, r.body) == (200, b"ok")
    r = validated(http(port, "GET", "/api/cluster", tls=ctx), "get", "/api/cluster")
    assert r.status == 200
    with pytest.raises(ssl.SSLCertVerificationError, match="certificate verify failed"):  # a client that does not trust the CA
        http(port, "GET", "/healthz", tls=ssl.create_default_context())
    # plain HTTP on the HTTPS port gets no answer in HTTP
    with socket.create_connection(("127.0.0.1", port), timeout=10) as s:
        s.sendall(b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
        try:
            data = s.recv(65536)
        except ConnectionResetError:
            data = b""
        assert not data.startswith(b"HTTP/1.1 200")
    ping_within(node)
    assert http(port, "GET", "/healthz", tls=ctx).status == 200


def test_admin_tls_without_a_certificate_refuses_to_start(tmp_path):
    from tests.integration.conftest import NodeProcess

    node = NodeProcess(tmp_path, admin_port=free_port(), admin_tls="yes")
    assert node.exit_code_at_start() == 1
    assert "admin" in node.log()
