"""gen-certs: the certificates it makes work for real TLS over a real socket.

Each check runs a TLS server in a thread on a localhost TCP port, with Python's ssl
module (OpenSSL): the server presents a generated certificate and requires a client
certificate from the generated CA, as a node with client certificates and the
cluster bus's mutual TLS will; the client verifies the server against ca.crt and the
name or address it asked for. The CLI is checked with click's runner.
"""

from __future__ import annotations

import datetime as dt
import socket
import ssl
import stat
import threading
from pathlib import Path

import pytest
from click.testing import CliRunner
from cryptography import x509
from cryptography.hazmat.primitives.asymmetric import ec, rsa
from cryptography.x509.oid import ExtendedKeyUsageOID

from disque_py.cli.certs import FILES, CertError, make_bundle, write_bundle
from disque_py.cli.app import main


def generate(directory: Path, **kw) -> Path:
    write_bundle(directory, make_bundle(**kw))
    return directory


@pytest.fixture(scope="module")
def tls(tmp_path_factory) -> Path:
    return generate(tmp_path_factory.mktemp("tls"), ips=("127.0.0.1", "10.1.2.3"), dns=("localhost", "node.test"))


@pytest.fixture(scope="module")
def other(tmp_path_factory) -> Path:
    """Certificates from another, unrelated CA."""
    return generate(tmp_path_factory.mktemp("other"))


class Outcome:
    def __init__(self) -> None:
        self.error: BaseException | None = None
        self.peer_cn: str | None = None
        self.done = threading.Event()


def serve_once(cert_dir: Path, *, cert: str = "node", ca_dir: Path | None = None) -> tuple[int, Outcome]:
    """A TLS server on 127.0.0.1 for one connection: presents ``cert``, requires a client
    certificate signed by ``ca_dir``'s CA, and answers b"ok" after the handshake."""
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    ctx.load_cert_chain(cert_dir / f"{cert}.crt", cert_dir / f"{cert}.key")
    ctx.load_verify_locations(cafile=(ca_dir or cert_dir) / "ca.crt")
    ctx.verify_mode = ssl.CERT_REQUIRED
    listener = socket.create_server(("127.0.0.1", 0))
    listener.settimeout(20)
    outcome = Outcome()

    def run() -> None:
        try:
            conn, _ = listener.accept()
            conn.settimeout(20)
            with ctx.wrap_socket(conn, server_side=True) as tls_conn:
                subject = dict(x[0] for x in tls_conn.getpeercert()["subject"])
                outcome.peer_cn = subject.get("commonName")
                tls_conn.sendall(b"ok")
                tls_conn.recv(1)  # until the client closes
        except BaseException as exc:  # noqa: BLE001 - the test reads it
            outcome.error = exc
        finally:
            listener.close()
            outcome.done.set()

    threading.Thread(target=run, daemon=True).start()
    return listener.getsockname()[1], outcome


def client_context(ca_dir: Path, cert_dir: Path | None, cert: str = "client") -> ssl.SSLContext:
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)  # verifies the chain and the host name
    ctx.load_verify_locations(cafile=ca_dir / "ca.crt")
    if cert_dir is not None:
        ctx.load_cert_chain(cert_dir / f"{cert}.crt", cert_dir / f"{cert}.key")
    return ctx


def talk(port: int, ctx: ssl.SSLContext, server_hostname: str = "127.0.0.1") -> bytes:
    with socket.create_connection(("127.0.0.1", port), timeout=20) as raw:
        with ctx.wrap_socket(raw, server_hostname=server_hostname) as s:
            return s.recv(2)


def finished(outcome: Outcome) -> Outcome:
    assert outcome.done.wait(20), "the TLS server thread did not finish"
    return outcome


# --- the handshake works, and refuses what it must ----------------------------------------


def test_mutual_tls_handshake_succeeds(tls):
    port, outcome = serve_once(tls)
    assert talk(port, client_context(tls, tls)) == b"ok"
    assert finished(outcome).error is None
    assert outcome.peer_cn == "disque-client"


@pytest.mark.parametrize("name", ["127.0.0.1", "10.1.2.3", "localhost", "node.test"])
def test_the_node_certificate_is_valid_for_every_name_and_address_given(tls, name):
    port, outcome = serve_once(tls)
    assert talk(port, client_context(tls, tls), server_hostname=name) == b"ok"
    assert finished(outcome).error is None


@pytest.mark.parametrize("name", ["127.0.0.2", "other.test"])
def test_a_name_or_address_not_in_the_certificate_is_refused(tls, name):
    port, outcome = serve_once(tls)
    with pytest.raises(ssl.SSLCertVerificationError, match="mismatch") as info:
        talk(port, client_context(tls, tls), server_hostname=name)
    assert "mismatch" in str(info.value) or "match" in str(info.value)
    finished(outcome)


def test_nodes_authenticate_each_other_with_the_node_certificate(tls):
    # The cluster bus: the connecting node presents node.crt as its client certificate.
    port, outcome = serve_once(tls)
    assert talk(port, client_context(tls, tls, cert="node")) == b"ok"
    assert finished(outcome).error is None


def _refused_by_server(port: int, outcome: Outcome, ctx: ssl.SSLContext) -> None:
    # With TLS 1.3 the client may finish its side before the server has judged its
    # certificate: the refusal then shows as an alert or a closed link on the first read.
    try:
        got = talk(port, ctx)
    except (ssl.SSLError, ConnectionError):
        got = None
    assert got in (None, b""), got
    assert isinstance(finished(outcome).error, ssl.SSLError), outcome.error


def test_a_client_certificate_from_another_ca_is_refused(tls, other):
    port, outcome = serve_once(tls)
    _refused_by_server(port, outcome, client_context(tls, other))
    assert "certificate verify failed" in str(outcome.error)


def test_a_client_without_a_certificate_is_refused(tls):
    port, outcome = serve_once(tls)
    _refused_by_server(port, outcome, client_context(tls, None))


def test_a_server_from_another_ca_is_refused(tls, other):
    port, outcome = serve_once(other, ca_dir=tls)
    with pytest.raises(ssl.SSLCertVerificationError, match="unable to get local issuer certificate"):
        talk(port, client_context(tls, tls))
    finished(outcome)


def test_the_client_certificate_cannot_act_as_a_server(tls):
    # client.crt allows clientAuth only: a client refuses it as a server's certificate.
    port, outcome = serve_once(tls, cert="client")
    with pytest.raises(ssl.SSLCertVerificationError, match="unsuitable certificate purpose") as info:
        talk(port, client_context(tls, tls), server_hostname="disque-client")
    assert "purpose" in str(info.value)
    finished(outcome)


@pytest.fixture(scope="module")
def expired(tmp_path_factory) -> Path:
    # Valid for one day, ten days ago.
    start = dt.datetime.now(dt.timezone.utc) - dt.timedelta(days=10)
    return generate(tmp_path_factory.mktemp("expired"), days=1, now=start)


def test_an_expired_node_certificate_is_refused(expired):
    assert x509.load_pem_x509_certificate((expired / "node.crt").read_bytes()).not_valid_after_utc < \
        dt.datetime.now(dt.timezone.utc)  # fmt: skip
    port, outcome = serve_once(expired)
    with pytest.raises(ssl.SSLCertVerificationError, match="certificate has expired") as info:
        talk(port, client_context(expired, expired))
    assert "expired" in str(info.value)
    finished(outcome)


def test_an_expired_client_certificate_is_refused(tls, expired, tmp_path):
    # A server trusting both CAs still refuses the expired client certificate.
    both = tmp_path / "both"
    both.mkdir()
    (both / "ca.crt").write_bytes((tls / "ca.crt").read_bytes() + (expired / "ca.crt").read_bytes())
    port, outcome = serve_once(tls, ca_dir=both)
    _refused_by_server(port, outcome, client_context(tls, expired))
    assert "expired" in str(outcome.error)


@pytest.mark.parametrize("key_type", ["rsa2048", "rsa3072"])
def test_rsa_keys_work_too(tmp_path, key_type):
    d = generate(tmp_path, key_type=key_type)
    key = x509.load_pem_x509_certificate((d / "node.crt").read_bytes()).public_key()
    assert isinstance(key, rsa.RSAPublicKey) and key.key_size == int(key_type[3:])
    port, outcome = serve_once(d)
    assert talk(port, client_context(d, d)) == b"ok"
    assert finished(outcome).error is None


# --- what the certificates say ------------------------------------------------------------


def _eku(cert: x509.Certificate) -> set:
    return set(cert.extensions.get_extension_for_class(x509.ExtendedKeyUsage).value)


def test_certificate_contents(tls):
    load = lambda name: x509.load_pem_x509_certificate((tls / name).read_bytes())  # noqa: E731
    ca, node, client = load("ca.crt"), load("node.crt"), load("client.crt")
    assert ca.extensions.get_extension_for_class(x509.BasicConstraints).value.ca
    assert not node.extensions.get_extension_for_class(x509.BasicConstraints).value.ca
    assert _eku(node) == {ExtendedKeyUsageOID.SERVER_AUTH, ExtendedKeyUsageOID.CLIENT_AUTH}
    assert _eku(client) == {ExtendedKeyUsageOID.CLIENT_AUTH}
    san = node.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert san.get_values_for_type(x509.DNSName) == ["localhost", "node.test"]
    assert [str(a) for a in san.get_values_for_type(x509.IPAddress)] == ["127.0.0.1", "10.1.2.3"]
    assert isinstance(node.public_key(), ec.EllipticCurvePublicKey)
    assert node.public_key().curve.name == "secp256r1"
    assert node.issuer == ca.subject == client.issuer
    lifetime = node.not_valid_after_utc - dt.datetime.now(dt.timezone.utc)
    assert dt.timedelta(days=364) < lifetime <= dt.timedelta(days=365)


def test_two_runs_make_two_different_cas(tls, other):
    a = x509.load_pem_x509_certificate((tls / "ca.crt").read_bytes())
    b = x509.load_pem_x509_certificate((other / "ca.crt").read_bytes())
    assert a.subject != b.subject and a.public_key() != b.public_key()


@pytest.mark.parametrize("kw, text", [
    ({"ips": ("not-an-ip",)}, "not an IP address"),
    ({"dns": ("10.0.0.1",)}, "is an IP address"),
    ({"dns": ("bad name",)}, "not a DNS name"),
    ({"dns": (), "ips": ()}, "at least one"),
    ({"days": 0}, "1 or more"),
    ({"key_type": "dsa"}, "unknown key type"),
])  # fmt: skip
def test_bad_requests_are_refused_clearly(kw, text):
    with pytest.raises(CertError, match=text):
        make_bundle(**kw)


# --- the command ------------------------------------------------------------------------


def _modes(d: Path) -> dict[str, int]:
    return {name: stat.S_IMODE((d / name).stat().st_mode) for name in FILES}


def test_cli_writes_the_files_private_keys_0600_and_says_how_to_use_them(tmp_path):
    d = tmp_path / "certs"
    result = CliRunner().invoke(main, ["gen-certs", str(d), "--ip", "127.0.0.1", "--ip", "10.9.8.7"])
    assert result.exit_code == 0, result.output
    modes = _modes(d)
    assert {n: m for n, m in modes.items() if n.endswith(".key")} == \
        {"ca.key": 0o600, "node.key": 0o600, "client.key": 0o600}  # fmt: skip
    assert all(m == 0o644 for n, m in modes.items() if n.endswith(".crt"))
    for name in FILES:
        assert name in result.output
    for directive in ("tls-port", "tls-cert-file", "tls-key-file", "tls-ca-cert-file"):
        assert directive in result.output
    assert str(d / "node.crt") in result.output
    node = x509.load_pem_x509_certificate((d / "node.crt").read_bytes())
    san = node.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert [str(a) for a in san.get_values_for_type(x509.IPAddress)] == ["127.0.0.1", "10.9.8.7"]
    assert san.get_values_for_type(x509.DNSName) == ["localhost"]


def test_cli_refuses_to_overwrite_without_force(tmp_path):
    d = tmp_path / "certs"
    runner = CliRunner()
    assert runner.invoke(main, ["gen-certs", str(d)]).exit_code == 0
    before = {name: (d / name).read_bytes() for name in FILES}
    result = runner.invoke(main, ["gen-certs", str(d)])
    assert result.exit_code != 0
    assert "--force" in result.output and "not overwriting" in result.output
    assert {name: (d / name).read_bytes() for name in FILES} == before
    # even one file in the way is enough
    (d / "ca.crt").unlink()
    result = runner.invoke(main, ["gen-certs", str(d)])
    assert result.exit_code != 0 and "ca.key" in result.output and not (d / "ca.crt").exists()
    result = runner.invoke(main, ["gen-certs", str(d), "--force", "--key-type", "rsa2048"])
    assert result.exit_code == 0, result.output
    assert all((d / name).read_bytes() != before[name] for name in FILES if name != "ca.crt")
    assert all(m == 0o600 for n, m in _modes(d).items() if n.endswith(".key"))


def test_cli_force_makes_keys_private_even_over_open_files(tmp_path):
    d = tmp_path / "certs"
    d.mkdir()
    (d / "node.key").write_text("old")
    (d / "node.key").chmod(0o644)
    assert CliRunner().invoke(main, ["gen-certs", str(d), "--force"]).exit_code == 0
    assert _modes(d)["node.key"] == 0o600 and (d / "node.key").read_text().startswith("-----BEGIN PRIVATE KEY")


def test_cli_bad_options_are_usage_errors(tmp_path):
    runner = CliRunner()
    result = runner.invoke(main, ["gen-certs", str(tmp_path / "x"), "--ip", "nope"])
    assert result.exit_code != 0 and "not an IP address" in result.output
    result = runner.invoke(main, ["gen-certs", str(tmp_path / "x"), "--key-type", "dsa"])
    assert result.exit_code == 2
    assert not (tmp_path / "x").exists()


def test_cli_help_teaches_with_an_example():
    result = CliRunner().invoke(main, ["gen-certs", "--help"])
    assert result.exit_code == 0
    assert "disque-py gen-certs ./tls" in result.output and "--ip" in result.output
    assert "tls-cert-file" in result.output
