"""TLS on the client port (tls-port), on real node processes: client certificates
(tls-auth-clients yes/no/optional), bad certificates and plain clients on the TLS port
(closed, counted, the node serves on), redis-py, redis-cli and our clients over TLS, a
certificate reloaded by CONFIG SET, tls-protocols, and a TLS-only node (port 0)."""

from __future__ import annotations

import socket
import ssl
import subprocess
import sys
from pathlib import Path

import pytest
import redis
import trio
from cryptography import x509

from disque_py.cli import launcher
from disque_py.client.aio import Client as AioClient
from disque_py.client.errors import NoNodeAvailable
from disque_py.client.sync import Client

from .conftest import ROOT, NodeProcess, free_port, wait_for

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from tls_certs import Certs, make_certs  # noqa: E402


@pytest.fixture(scope="module")
def certs(tmp_path_factory) -> Certs:
    return make_certs(tmp_path_factory.mktemp("certs"))


def tls_directives(certs: Certs, **extra) -> dict:
    return {
        "tls_port": free_port(),
        "tls_cert_file": str(certs.server_cert),
        "tls_key_file": str(certs.server_key),
        "tls_ca_cert_file": str(certs.ca),
        **extra,
    }


def client_context(certs: Certs, *, cert: Path | None = None, key: Path | None = None, ca: Path | None = None,
                   maximum: ssl.TLSVersion | None = None, minimum: ssl.TLSVersion | None = None) -> ssl.SSLContext:  # fmt: skip
    ctx = ssl.create_default_context(cafile=str(ca or certs.ca))
    if cert is not None:
        ctx.load_cert_chain(str(cert), str(key))
    if maximum is not None:
        ctx.maximum_version = maximum
    if minimum is not None:
        ctx.minimum_version = minimum
    return ctx


def tls_request(port: int, ctx: ssl.SSLContext, request: bytes = b"PING\r\n") -> bytes:
    """One request over a new TLS connection; its reply, or raises (ssl.SSLError, OSError,
    ConnectionError) if the handshake or the link fails. b'' when the node closed the link."""
    with socket.create_connection(("127.0.0.1", port), timeout=10) as raw:
        with ctx.wrap_socket(raw, server_hostname="127.0.0.1") as s:
            s.sendall(request)
            return s.recv(4096)


def refused(port: int, ctx: ssl.SSLContext) -> bool:
    """True if a TLS PING on a new connection does not get its PONG."""
    try:
        return not tls_request(port, ctx).startswith(b"+PONG")
    except (ssl.SSLError, OSError):
        return True


def failures(node: NodeProcess) -> int:
    return int(node.client().info("stats")["tls_handshake_failures"])


def start_tls(start_node, certs: Certs, **extra) -> NodeProcess:
    node = start_node(**tls_directives(certs, **extra))
    node.tls_port = int(node.directives["tls_port"])
    return node


def test_client_certificate_required_by_default(start_node, certs):
    node = start_tls(start_node, certs)
    good = client_context(certs, cert=certs.client_cert, key=certs.client_key)
    assert tls_request(node.tls_port, good) == b"+PONG\r\n"
    before = failures(node)
    assert refused(node.tls_port, client_context(certs))  # no client certificate
    wait_for(lambda: failures(node) == before + 1, what="the failed handshake counted")
    info = node.client().info("server")
    assert info["tls_port"] == node.tls_port and info["tcp_port"] == node.port
    assert tls_request(node.tls_port, good) == b"+PONG\r\n"  # serves on


def test_auth_clients_no_takes_clients_without_certificate(start_node, certs):
    node = start_tls(start_node, certs, tls_auth_clients="no")
    assert tls_request(node.tls_port, client_context(certs)) == b"+PONG\r\n"
    assert failures(node) == 0


def test_auth_clients_optional_checks_a_certificate_when_sent(start_node, certs):
    node = start_tls(start_node, certs, tls_auth_clients="optional")
    assert tls_request(node.tls_port, client_context(certs)) == b"+PONG\r\n"
    assert tls_request(node.tls_port, client_context(certs, cert=certs.client_cert, key=certs.client_key)) == b"+PONG\r\n"
    stranger = client_context(certs, cert=certs.other_client_cert, key=certs.other_client_key)
    assert refused(node.tls_port, stranger)  # signed by a CA the node does not trust
    wait_for(lambda: failures(node) == 1, what="the failed handshake counted")


def test_bad_certificates_are_refused_and_counted(start_node, certs):
    node = start_tls(start_node, certs)
    # the client does not trust the node's CA: it aborts the handshake
    assert refused(node.tls_port, client_context(certs, ca=certs.other_ca, cert=certs.client_cert, key=certs.client_key))
    wait_for(lambda: failures(node) == 1, what="the aborted handshake counted")
    # an expired client certificate, then one from another CA
    assert refused(node.tls_port, client_context(certs, cert=certs.expired_cert, key=certs.expired_key))
    wait_for(lambda: failures(node) == 2, what="the expired certificate counted")
    assert refused(node.tls_port, client_context(certs, cert=certs.other_client_cert, key=certs.other_client_key))
    wait_for(lambda: failures(node) == 3, what="the unknown CA counted")
    assert "TLS handshake failed with 127.0.0.1:" in node.log()
    good = client_context(certs, cert=certs.client_cert, key=certs.client_key)
    assert tls_request(node.tls_port, good) == b"+PONG\r\n"


def test_plain_client_on_the_tls_port_is_closed_and_counted(start_node, certs):
    node = start_tls(start_node, certs)
    for _ in range(5):
        with socket.create_connection(("127.0.0.1", node.tls_port), timeout=10) as s:
            s.sendall(b"PING\r\n")
            try:
                assert s.recv(100) == b""  # closed, nothing answered in clear
            except ConnectionResetError:
                pass
    wait_for(lambda: failures(node) == 5, what="5 failed handshakes counted")
    assert node.client().ping()
    good = client_context(certs, cert=certs.client_cert, key=certs.client_key)
    assert tls_request(node.tls_port, good) == b"+PONG\r\n"
    # a client that connects and says nothing holds no one up (it is dropped after the
    # handshake timeout)
    with socket.create_connection(("127.0.0.1", node.tls_port), timeout=10):
        assert tls_request(node.tls_port, good) == b"+PONG\r\n"


def redis_py(node: NodeProcess, certs: Certs, **kw) -> redis.Redis:
    return redis.Redis(
        host="127.0.0.1", port=node.tls_port, ssl=True, ssl_ca_certs=str(certs.ca),
        ssl_certfile=str(certs.client_cert), ssl_keyfile=str(certs.client_key), socket_timeout=10, **kw,
    )  # fmt: skip


def test_redis_py_ssl_round_trip_and_client_list(start_node, certs):
    node = start_tls(start_node, certs)
    r = redis_py(node, certs)
    job_id = r.execute_command("ADDJOB", "q", "over tls", 0)
    got = r.execute_command("GETJOB", "TIMEOUT", 1000, "FROM", "q")
    assert got == [[b"q", job_id, b"over tls"]]
    assert r.execute_command("ACKJOB", job_id) == 1
    body = b"x" * 300_000  # bigger than a TLS record and a read
    job_id = r.execute_command("ADDJOB", "big", body, 0)
    assert r.execute_command("GETJOB", "FROM", "big")[0][2] == body
    # CLIENT LIST names the TLS peer, not a local stand-in
    ctx = client_context(certs, cert=certs.client_cert, key=certs.client_key)
    with socket.create_connection(("127.0.0.1", node.tls_port), timeout=10) as raw:
        with ctx.wrap_socket(raw, server_hostname="127.0.0.1") as s:
            s.sendall(b"CLIENT LIST\r\n")
            listing = s.recv(65536)
            local = s.getsockname()
    assert ("addr=127.0.0.1:%d laddr=127.0.0.1:%d" % (local[1], node.tls_port)).encode() in listing
    # pipelined commands over TLS
    pipe = r.pipeline(transaction=False)
    for i in range(500):
        pipe.execute_command("ADDJOB", "p", "job %d" % i, 0)
    assert len(set(pipe.execute())) == 500
    assert r.execute_command("QLEN", "p") == 500


def test_redis_cli_tls(start_node, certs, redis_cli):
    helped = subprocess.run([redis_cli, "--help"], capture_output=True, text=True)
    if "--tls" not in helped.stdout + helped.stderr:
        pytest.skip("this redis-cli has no --tls")
    node = start_tls(start_node, certs)
    base = [redis_cli, "-p", str(node.tls_port), "--tls", "--cacert", str(certs.ca),
            "--cert", str(certs.client_cert), "--key", str(certs.client_key)]  # fmt: skip
    out = subprocess.run(base + ["ADDJOB", "q", "from redis-cli", "0"], capture_output=True, text=True, timeout=20)
    assert out.stdout.startswith("D-"), out
    out = subprocess.run(base + ["GETJOB", "FROM", "q"], capture_output=True, text=True, timeout=20)
    assert "from redis-cli" in out.stdout, out


def test_sync_client_tls(start_node, certs):
    node = start_tls(start_node, certs)
    kw = dict(ssl_ca_certs=str(certs.ca), ssl_certfile=str(certs.client_cert), ssl_keyfile=str(certs.client_key))
    with Client("127.0.0.1:%d" % node.tls_port, tls=True, **kw) as c:
        job_id = c.add_job("q", b"sync")
        jobs = c.get_jobs("q", timeout_ms=1000)
        assert [(j.id, j.body) for j in jobs] == [(job_id, b"sync")]
        assert c.ack(job_id) == 1
    with Client("rediss://127.0.0.1:%d" % node.tls_port, **kw) as c:  # the URL alone says TLS
        assert c.config.tls
        assert c.add_job("q", b"url").startswith("D-")
    # without a certificate, a node requiring one refuses the client: its handshakes fail on the
    # node (counted there), and the client gives up once failover_timeout is over
    before = failures(node)
    with pytest.raises(NoNodeAvailable, match=r"^no node reachable after 0.5 s \(tried 127.0.0.1:%d;" % node.tls_port):
        with Client("rediss://127.0.0.1:%d" % node.tls_port, ssl_ca_certs=str(certs.ca), failover_timeout=0.5) as c:
            c.add_job("q", b"refused")
    wait_for(lambda: failures(node) > before, what="the refused handshakes counted")


def test_trio_client_tls(start_node, certs):
    node = start_tls(start_node, certs)

    async def main() -> None:
        async with AioClient(
            "127.0.0.1:%d" % node.tls_port, tls=True, ssl_ca_certs=str(certs.ca),
            ssl_certfile=str(certs.client_cert), ssl_keyfile=str(certs.client_key),
        ) as c:  # fmt: skip
            ids = [await c.add_job("q", b"trio %d" % i) for i in range(20)]
            got = []
            while len(got) < 20:
                got += await c.get_jobs("q", count=20, timeout_ms=1000)
            assert sorted(j.id for j in got) == sorted(ids)
            assert await c.ack(*ids) == 20

    trio.run(main)


def serial_of(port: int, certs: Certs) -> int:
    ctx = client_context(certs, cert=certs.client_cert, key=certs.client_key)
    with socket.create_connection(("127.0.0.1", port), timeout=10) as raw:
        with ctx.wrap_socket(raw, server_hostname="127.0.0.1") as s:
            der = s.getpeercert(binary_form=True)
    return x509.load_der_x509_certificate(der).serial_number


def test_config_set_cert_file_reloads_for_new_connections(start_node, certs, tmp_path):
    node = start_tls(start_node, certs)
    admin = node.client()
    assert serial_of(node.tls_port, certs) == certs.serial
    r = redis_py(node, certs)
    assert r.ping()  # a connection opened before the change keeps working
    assert admin.config_set("tls-cert-file", str(certs.server_cert2))
    assert serial_of(node.tls_port, certs) == certs.serial2
    assert r.ping()
    # a bad file is refused and the context stays as it was
    junk = tmp_path / "junk.crt"
    junk.write_text("not a certificate\n")
    for bad, why in ((str(junk), r"^Failed to load certificate .*junk\.crt with key .*PEM"),
                     (str(tmp_path / "missing.crt"), r"^Failed to load certificate or key: .*missing\.crt: No such file"),
                     (str(certs.client_cert), r"^Failed to load certificate .*client\.crt with key .*key values mismatch")):  # not our key's
        with pytest.raises(redis.ResponseError, match=why):
            admin.config_set("tls-cert-file", bad)
        assert admin.config_get("tls-cert-file")["tls-cert-file"] == str(certs.server_cert2)
        assert serial_of(node.tls_port, certs) == certs.serial2
    with pytest.raises(redis.ResponseError, match="Failed to load CA certificates .*missing-ca.crt"):
        admin.config_set("tls-ca-cert-file", str(tmp_path / "missing-ca.crt"))
    with pytest.raises(redis.ResponseError, match="^Invalid tls-protocols: unknown protocol 'tlsv9'"):
        admin.config_set("tls-protocols", "TLSv9")
    assert admin.config_set("tls-auth-clients", "no")
    assert tls_request(node.tls_port, client_context(certs)) == b"+PONG\r\n"


def test_tls_protocols_restrict_versions(start_node, certs):
    node = start_tls(start_node, certs, tls_protocols="TLSv1.3")
    cert = dict(cert=certs.client_cert, key=certs.client_key)
    assert tls_request(node.tls_port, client_context(certs, **cert)) == b"+PONG\r\n"
    assert refused(node.tls_port, client_context(certs, maximum=ssl.TLSVersion.TLSv1_2, **cert))
    assert node.client().config_set("tls-protocols", "TLSv1.2")
    assert refused(node.tls_port, client_context(certs, minimum=ssl.TLSVersion.TLSv1_3, **cert))
    assert tls_request(node.tls_port, client_context(certs, maximum=ssl.TLSVersion.TLSv1_2, **cert)) == b"+PONG\r\n"


def test_encrypted_key_with_passphrase(start_node, certs):
    node = start_tls(start_node, certs, tls_key_file=str(certs.server_key_encrypted),
                     tls_key_file_pass=certs.PASSWORD.decode())  # fmt: skip
    assert tls_request(node.tls_port, client_context(certs, cert=certs.client_cert, key=certs.client_key)) == b"+PONG\r\n"


def test_tls_only_node_with_port_0(tmp_path, certs):
    directives = tls_directives(certs, tls_auth_clients="no")
    tls_port = directives["tls_port"]
    node = NodeProcess(tmp_path, **directives)
    argv = node.args()
    argv[argv.index("--port") + 1] = "0"
    proc = launcher.spawn(argv, output=node.log_path, cwd=ROOT)
    try:
        ctx = client_context(certs)
        wait_for(lambda: tls_request(tls_port, ctx) == b"+PONG\r\n", timeout=20, what="the TLS port to answer")
        r = redis.Redis(host="127.0.0.1", port=tls_port, ssl=True, ssl_ca_certs=str(certs.ca), socket_timeout=10)
        assert r.info("server")["tcp_port"] == 0
        job_id = r.execute_command("ADDJOB", "q", "tls only", 0)
        assert r.execute_command("GETJOB", "FROM", "q") == [[b"q", job_id, b"tls only"]]
        assert "Ready to accept connections on" not in node.log()
        assert "Ready to accept TLS connections" in node.log()
    finally:
        stopped = launcher.stop(proc, timeout=10)
    assert stopped.returncode == 0, node.log()


def test_bad_tls_configuration_stops_the_start(tmp_path, certs):
    node = NodeProcess(tmp_path, **tls_directives(certs, tls_cert_file=str(tmp_path / "missing.crt")))
    assert node.exit_code_at_start() == 1
    assert "Can't start TLS" in node.log() and "missing.crt" in node.log()


def test_client_certificate_needs_a_ca(tmp_path, certs):
    directives = tls_directives(certs)
    directives["tls_ca_cert_file"] = ""
    node = NodeProcess(tmp_path, **directives)
    assert node.exit_code_at_start() == 1
    assert "tls-ca-cert-file or tls-ca-cert-dir" in node.log()


def test_worker_over_tls_with_plain_function_handlers(start_node, certs):
    """The worker's trio client and its handler threads' own connections (direct mode) both
    take the TLS settings of the client it is given."""
    from disque_py.client.worker import Worker

    node = start_tls(start_node, certs)
    client = Client("127.0.0.1:%d" % node.tls_port, tls=True, ssl_ca_certs=str(certs.ca),
                    ssl_certfile=str(certs.client_cert), ssl_keyfile=str(certs.client_key))  # fmt: skip
    ids = client.add_jobs("work", [b"%d" % i for i in range(100)])
    seen = []
    w = Worker(client, "work", seen.append, concurrency=2, fetch_timeout_ms=100)

    async def run() -> None:
        with trio.fail_after(30):
            async with trio.open_nursery() as nursery:
                nursery.start_soon(w.run)
                while w.stats().processed < 100:
                    await trio.sleep(0.01)
                w.stop()

    trio.run(run)
    assert sorted(j.id for j in seen) == sorted(ids)
    plain = node.client()
    wait_for(lambda: all(plain.execute_command("SHOW", i) is None for i in ids), what="every job acknowledged")
    assert int(plain.info("stats")["tls_connections_received"]) >= 3  # the client, the worker, direct mode


def test_cli_with_tls_options(start_node, certs):
    node = start_tls(start_node, certs)
    out = subprocess.run(
        [sys.executable, "-m", "disque_py.cli", "cli", "-p", str(node.tls_port), "--tls", "--cacert", str(certs.ca),
         "--cert", str(certs.client_cert), "--key", str(certs.client_key), "ADDJOB", "q", "from our cli", "0"],
        capture_output=True, text=True, timeout=30, cwd=ROOT,
    )  # fmt: skip
    assert out.returncode == 0 and out.stdout.startswith("D-"), out  # piped: raw, as redis-cli
    assert node.client().execute_command("QLEN", "q") == 1
    out = subprocess.run(
        [sys.executable, "-m", "disque_py.cli", "cli", "-p", str(node.tls_port), "--tls", "--cacert", str(certs.ca),
         "PING"], capture_output=True, text=True, timeout=30, cwd=ROOT,
    )  # fmt: skip
    assert out.returncode == 1 and "Could not connect" in out.stderr, out  # no client certificate


def test_a_silent_client_is_dropped_after_the_handshake_timeout(start_node, certs):
    from disque_py.server.tls import HANDSHAKE_TIMEOUT

    node = start_tls(start_node, certs)
    with socket.create_connection(("127.0.0.1", node.tls_port), timeout=HANDSHAKE_TIMEOUT + 10) as s:
        assert s.recv(100) == b""  # closed by the node, having said nothing
    assert failures(node) == 1
    assert "no handshake within" in node.log()
