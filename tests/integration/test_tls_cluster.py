"""tls-cluster yes on real node processes: bus links over mutual TLS (port + 10000), peers
verified against the CA. A 3-node cluster joins, replicates, moves jobs by federation and
propagates acks; a node whose certificate another CA signed cannot join; a plain connection
to a TLS bus port (garbage, or a valid plain bus handshake) is closed and the node serves on;
with cluster-secret as well, both apply; a TLS-only trio (port 0) joins on tls-port + 10000."""

from __future__ import annotations

import socket
import sys
import time
from pathlib import Path

import pytest
import redis

from cluster_bus.codec import InitiatorHandshake, encode_message, frame
from cluster_bus.messages import BUS_PORT_OFFSET, Meet

from disque_py.cli import launcher

from .conftest import ROOT, NodeProcess, free_port, wait_for

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from tls_certs import Certs, _write_cert, _write_key, issue, make_ca, make_certs  # noqa: E402

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def certs(tmp_path_factory) -> Certs:
    return make_certs(tmp_path_factory.mktemp("certs"))


@pytest.fixture(scope="module")
def stranger(tmp_path_factory) -> tuple[Path, Path]:
    """A node certificate (both uses, 127.0.0.1) signed by a CA the cluster does not trust."""
    d = tmp_path_factory.mktemp("stranger")
    key, cert = issue(make_ca("stranger CA"), "stranger node", server=True)
    return _write_cert(cert, d / "node.crt"), _write_key(key, d / "node.key")


def bus_tls(certs: Certs, **extra) -> dict:
    return {
        "tls_cluster": "yes",
        "tls_cert_file": str(certs.server_cert),
        "tls_key_file": str(certs.server_key),
        "tls_ca_cert_file": str(certs.ca),
        **extra,
    }


def info(node: NodeProcess) -> dict[str, str]:
    text = node.client().execute_command("CLUSTER", "INFO").decode()
    return dict(line.split(":", 1) for line in text.split("\r\n") if ":" in line)


def joined(nodes: list[NodeProcess], size: int) -> bool:
    for n in nodes:
        fields = info(n)
        if int(fields["cluster_size"]) != size or int(fields["cluster_reachable_nodes"]) != size - 1:
            return False
    return True


def meet(nodes: list[NodeProcess]) -> None:
    first = nodes[0]
    for n in nodes[1:]:
        assert n.client().execute_command("CLUSTER", "MEET", "127.0.0.1", first.port) == b"OK"
    wait_for(lambda: joined(nodes, len(nodes)), timeout=30, what="the cluster to form over TLS")


def show(node: NodeProcess, job_id: bytes) -> dict | None:
    reply = node.client().execute_command("SHOW", job_id)
    if reply is None:
        return None
    return {reply[i].decode(): reply[i + 1] for i in range(0, len(reply), 2)}


def tls_failures(node: NodeProcess) -> int:
    return int(info(node)["cluster_stats_bus_tls_failures"])


@pytest.fixture
def trio_cluster(start_node, certs):
    def make(**extra) -> list[NodeProcess]:
        nodes = start_node.many(3, **bus_tls(certs, **extra))
        meet(nodes)
        return nodes

    return make


def replicate_move_ack(nodes: list[NodeProcess]) -> None:
    a, b, c = nodes
    job_id = a.client().execute_command("ADDJOB", "q", "over tls", 5000, "REPLICATE", 3)
    for n in nodes:  # every node has its copy, with the same holders
        copy = show(n, job_id)
        assert copy is not None and len(copy["nodes-delivered"]) == 3, n.port
    # federation: a job queued on one node only moves to the node a consumer waits on
    solo = a.client().execute_command("ADDJOB", "moving", "body", 5000, "REPLICATE", 1)
    assert show(b, solo) is None
    got = b.client().execute_command("GETJOB", "TIMEOUT", 10000, "FROM", "moving")
    assert got and got[0][1] == solo and got[0][2] == b"body"
    # an ack given on one node reaches every copy (and then the job is collected)
    assert c.client().execute_command("ACKJOB", job_id) == 1
    wait_for(lambda: all((show(n, job_id) or {"state": b"acked"})["state"] == b"acked" for n in nodes),
             timeout=20, what="the ack on every node")  # fmt: skip


def test_three_nodes_over_tls_replicate_move_and_ack(trio_cluster):
    nodes = trio_cluster()
    assert all("(mutual TLS)" in n.log() for n in nodes)
    assert all("no cluster-secret set" not in n.log() for n in nodes)
    replicate_move_ack(nodes)
    # big jobs, several at once: TLS records across partial writes and reads on the links
    pipe = nodes[0].client().pipeline(transaction=False)
    bodies = [bytes([65 + i]) * (1 << 20) + b"%d" % i for i in range(6)]
    for body in bodies:
        pipe.execute_command("ADDJOB", "big", body, 20000, "REPLICATE", 3)
    ids = pipe.execute()
    for n in nodes[1:]:
        for job_id, body in zip(ids, bodies):
            assert show(n, job_id)["body"] == body
    assert all(tls_failures(n) == 0 for n in nodes)


def test_node_of_another_ca_cannot_join(trio_cluster, start_node, certs, stranger):
    nodes = trio_cluster()
    cert, key = stranger
    # it trusts our CA (it could verify us): only its own certificate is wrong
    outsider = start_node(**bus_tls(certs, tls_cert_file=str(cert), tls_key_file=str(key)))
    outsider.client().execute_command("CLUSTER", "MEET", "127.0.0.1", nodes[0].port)  # it reaches out
    nodes[1].client().execute_command("CLUSTER", "MEET", "127.0.0.1", outsider.port)  # we reach out
    wait_for(lambda: tls_failures(nodes[0]) > 0 and tls_failures(nodes[1]) > 0, timeout=20,
             what="the handshakes to fail")  # fmt: skip
    assert "TLS handshake with 127.0.0.1 failed" in nodes[0].log()
    deadline = time.monotonic() + 3
    while time.monotonic() < deadline:  # the cluster stays 3, the outsider alone
        assert joined(nodes, 3)
        assert int(info(outsider)["cluster_size"]) == 1
        time.sleep(0.2)
    for n in nodes:
        assert outsider.client().execute_command("CLUSTER", "MYID") not in n.client().execute_command(
            "CLUSTER", "NODES")
    replicate_move_ack(nodes)


def plain_bus_attempts(port: int, secret: bytes | None) -> None:
    """Garbage, then a valid plain bus opening (a MEET, or the secret's first handshake frame),
    each on its own plain TCP connection to a TLS bus port: each must be closed by the node."""
    if secret is None:
        opening = frame(encode_message(Meet("f" * 40, 7711, 0, ())))
    else:
        opening = InitiatorHandshake(secret, b"\0" * 16).start()
    for payload in (b"\x16\x03\x01garbage garbage garbage\r\n" * 4, b"GET / HTTP/1.0\r\n\r\n", opening):
        with socket.create_connection(("127.0.0.1", port), timeout=10) as s:
            s.sendall(payload)
            s.settimeout(10)
            try:
                while s.recv(4096):  # a TLS alert perhaps, then the close
                    pass
            except ConnectionResetError:
                pass


def test_plain_connections_to_a_tls_bus_are_closed(trio_cluster):
    nodes = trio_cluster()
    before = tls_failures(nodes[0])
    plain_bus_attempts(nodes[0].port + BUS_PORT_OFFSET, None)
    wait_for(lambda: tls_failures(nodes[0]) >= before + 3, timeout=10, what="the failures counted")
    # the plain MEET was never read: no handshake with its sender was started
    assert int(info(nodes[0])["cluster_known_nodes"]) == 3 and int(info(nodes[0])["cluster_size"]) == 3
    assert int(info(nodes[0])["cluster_stats_bad_frames"]) == 0
    replicate_move_ack(nodes)


def test_tls_and_secret_both_apply(trio_cluster, start_node, certs):
    nodes = trio_cluster(cluster_secret="shared secret")
    assert all("no cluster-secret set" not in n.log() for n in nodes)
    # the right certificate without the secret: TLS passes, authentication does not
    no_secret = start_node(**bus_tls(certs))
    no_secret.client().execute_command("CLUSTER", "MEET", "127.0.0.1", nodes[0].port)
    wait_for(lambda: int(info(nodes[0])["cluster_stats_auth_failures"]) > 0, timeout=20,
             what="an authentication failure inside TLS")  # fmt: skip
    # the right secret over plain TCP: refused by TLS before the secret is looked at
    before = tls_failures(nodes[1])
    plain_bus_attempts(nodes[1].port + BUS_PORT_OFFSET, b"shared secret")
    wait_for(lambda: tls_failures(nodes[1]) >= before + 3, timeout=10, what="the failures counted")
    assert joined(nodes, 3) and int(info(no_secret)["cluster_size"]) == 1
    replicate_move_ack(nodes)


def test_tls_only_trio_announces_tls_port(tmp_path, certs):
    """port 0, tls-port P: the bus on P + 10000, P announced (HELLO, CLUSTER NODES, nodes.conf)."""
    procs, ports, logs = [], [], []
    try:
        for i in range(3):
            tls_port = free_port()
            node = NodeProcess(tmp_path / ("n%d" % i), **bus_tls(certs, tls_port=tls_port, tls_auth_clients="no"))
            argv = node.args()
            argv[argv.index("--port") + 1] = "0"
            procs.append(launcher.spawn(argv, output=node.log_path, cwd=ROOT))
            ports.append(tls_port)
            logs.append(node)
        clients = [redis.Redis(host="127.0.0.1", port=p, ssl=True, ssl_ca_certs=str(certs.ca), socket_timeout=10)
                   for p in ports]  # fmt: skip
        for r in clients:
            wait_for(r.ping, timeout=20, what="a TLS-only node to answer")
        for r in clients[1:]:
            assert r.execute_command("CLUSTER", "MEET", "127.0.0.1", ports[0]) == b"OK"

        def formed() -> bool:
            for r in clients:
                text = r.execute_command("CLUSTER", "INFO").decode()
                if "cluster_size:3\r\n" not in text or "cluster_reachable_nodes:2\r\n" not in text:
                    return False
            return True

        wait_for(formed, timeout=30, what="a TLS-only cluster to form")
        for i, r in enumerate(clients):
            hello = r.execute_command("HELLO")
            assert sorted(int(entry[2]) for entry in hello[2:]) == sorted(ports)
            assert ("127.0.0.1:%d" % ports[i]) in r.execute_command("CLUSTER", "NODES").decode()
            assert ("port %d" % (ports[i] + BUS_PORT_OFFSET)) in logs[i].log()
        job_id = clients[0].execute_command("ADDJOB", "q", "tls only", 5000, "REPLICATE", 3)
        for r in clients[1:]:
            assert r.execute_command("SHOW", job_id) is not None
        assert clients[2].execute_command("ACKJOB", job_id) == 1
    finally:
        codes = [launcher.stop(p, timeout=10).returncode for p in procs]
    assert codes == [0, 0, 0], [n.log() for n in logs]


def test_tls_cluster_is_read_at_start_only(start_node, certs):
    node = start_node(**bus_tls(certs))
    with pytest.raises(redis.ResponseError, match="Unsupported CONFIG parameter: tls-cluster"):
        node.client().execute_command("CONFIG", "SET", "tls-cluster", "no")
    assert node.client().execute_command("CONFIG", "GET", "tls-cluster") == {b"tls-cluster": b"yes"}
    assert "does not act on it yet" not in node.log()


def test_tls_cluster_without_a_ca_stops_the_start(tmp_path, certs):
    node = NodeProcess(tmp_path, **bus_tls(certs, tls_ca_cert_file=""))
    assert node.exit_code_at_start() == 1
    assert "Can't start TLS on the cluster bus" in node.log() and "tls-ca-cert-file" in node.log()
