"""The TLS context from the tls-* directives (server/tls.py), without a node: what each
directive turns into, and the errors a bad value or file gives (CONFIG SET shows them)."""

from __future__ import annotations

import ssl
import sys
from pathlib import Path

import pytest

from disque_py.config import Config, ConfigError, config_set
from disque_py.server.tls import build_server_context, parse_protocols

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from tls_certs import make_certs  # noqa: E402


@pytest.fixture(scope="module")
def certs(tmp_path_factory):
    return make_certs(tmp_path_factory.mktemp("certs"))


def configured(certs, **values) -> Config:
    cfg = Config()
    cfg.tls_port = 7712
    cfg.tls_cert_file = str(certs.server_cert)
    cfg.tls_key_file = str(certs.server_key)
    cfg.tls_ca_cert_file = str(certs.ca)
    for name, value in values.items():
        setattr(cfg, name, value)
    return cfg


@pytest.mark.parametrize(
    "text, expected",
    [
        ("", (ssl.TLSVersion.TLSv1_2, ssl.TLSVersion.TLSv1_3)),
        ("TLSv1.2 TLSv1.3", (ssl.TLSVersion.TLSv1_2, ssl.TLSVersion.TLSv1_3)),
        ("tlsv1.3", (ssl.TLSVersion.TLSv1_3, ssl.TLSVersion.TLSv1_3)),
        ("TLSv1.2", (ssl.TLSVersion.TLSv1_2, ssl.TLSVersion.TLSv1_2)),
        ("TLSv1.3  TLSv1.1 TLSv1.2", (ssl.TLSVersion.TLSv1_1, ssl.TLSVersion.TLSv1_3)),
    ],
)
def test_protocols(text, expected):
    assert parse_protocols(text) == expected


@pytest.mark.parametrize("text", ["TLSv1.4", "SSLv3", "TLSv1 TLSv1.3"])
def test_bad_protocols(text):
    with pytest.raises(ConfigError, match="tls-protocols"):
        parse_protocols(text)


def test_context_follows_the_directives(certs):
    ctx = build_server_context(configured(certs))
    assert ctx.verify_mode == ssl.CERT_REQUIRED  # tls-auth-clients yes, as Redis's default
    assert ctx.minimum_version == ssl.TLSVersion.TLSv1_2
    ctx = build_server_context(configured(certs, tls_auth_clients="optional", tls_protocols="TLSv1.3",
                                          tls_prefer_server_ciphers=True))  # fmt: skip
    assert ctx.verify_mode == ssl.CERT_OPTIONAL
    assert ctx.minimum_version == ctx.maximum_version == ssl.TLSVersion.TLSv1_3
    assert ctx.options & ssl.OP_CIPHER_SERVER_PREFERENCE
    ctx = build_server_context(configured(certs, tls_auth_clients="no", tls_ca_cert_file="",
                                          tls_ciphers="ECDHE-ECDSA-AES128-GCM-SHA256"))  # fmt: skip
    assert ctx.verify_mode == ssl.CERT_NONE
    assert {c["name"] for c in ctx.get_ciphers() if c["protocol"] == "TLSv1.2"} == {"ECDHE-ECDSA-AES128-GCM-SHA256"}


@pytest.mark.parametrize(
    "values, message",
    [
        ({"tls_cert_file": ""}, "needs tls-cert-file and tls-key-file"),
        ({"tls_ca_cert_file": ""}, "tls-ca-cert-file or tls-ca-cert-dir"),
        ({"tls_cert_file": "/nonexistent.crt"}, "/nonexistent.crt"),
        ({"tls_key_file": "CLIENT_KEY"}, "Failed to load certificate"),
        ({"tls_ca_cert_file": "/nonexistent-ca.crt"}, "CA certificates"),
        ({"tls_ciphers": "NO-SUCH-CIPHER"}, "tls-ciphers"),
        ({"tls_ciphersuites": "TLS_NO_SUCH_SUITE"}, "tls-ciphersuites"),
        ({"tls_key_file": "ENC_KEY", "tls_key_file_pass": "wrong"}, "Failed to load certificate"),
    ],
)
def test_bad_settings_say_what_is_wrong(certs, values, message):
    values = {k: {"CLIENT_KEY": str(certs.client_key), "ENC_KEY": str(certs.server_key_encrypted)}.get(v, v)
              for k, v in values.items()}  # fmt: skip
    with pytest.raises(ConfigError, match=message):
        build_server_context(configured(certs, **values))


def test_encrypted_key(certs):
    cfg = configured(certs, tls_key_file=str(certs.server_key_encrypted), tls_key_file_pass=certs.PASSWORD.decode())
    assert build_server_context(cfg).verify_mode == ssl.CERT_REQUIRED


def test_config_set_validates_the_enum_and_a_hook_vetoes_a_bad_file(certs):
    cfg = configured(certs)
    with pytest.raises(ConfigError, match="Invalid argument 'maybe' for CONFIG SET 'tls-auth-clients'"):
        config_set(cfg, b"tls-auth-clients", b"maybe")

    def hook(name, old, new):
        build_server_context(cfg)

    cfg.on_change.append(hook)
    with pytest.raises(ConfigError, match="^Failed to load certificate or key: /nonexistent.crt"):
        config_set(cfg, b"tls-cert-file", b"/nonexistent.crt")
    assert cfg.tls_cert_file == str(certs.server_cert)  # the old value stays
    config_set(cfg, b"tls-cert-file", str(certs.server_cert2).encode())
    assert cfg.tls_cert_file == str(certs.server_cert2)
    with pytest.raises(ConfigError, match="Unsupported CONFIG parameter"):
        config_set(cfg, b"tls-port", b"7713")  # as Redis 6.0: not at run time


def _handshake(server: ssl.SSLContext, client: ssl.SSLContext) -> tuple[str | None, bytes | None]:
    """A handshake in memory; (the version agreed, the client certificate the server got)."""
    s_in, s_out, c_in, c_out = ssl.MemoryBIO(), ssl.MemoryBIO(), ssl.MemoryBIO(), ssl.MemoryBIO()
    srv = server.wrap_bio(s_in, s_out, server_side=True)
    cli = client.wrap_bio(c_in, c_out, server_hostname="127.0.0.1")
    done = {"s": False, "c": False}
    for _ in range(20):
        for name, end, out, peer_in in (("c", cli, c_out, s_in), ("s", srv, s_out, c_in)):
            if not done[name]:
                try:
                    end.do_handshake()
                    done[name] = True
                except ssl.SSLWantReadError:
                    pass
            peer_in.write(out.read())
        if all(done.values()):
            break
    return srv.version(), srv.getpeercert(binary_form=True)


def test_the_peers_context_shakes_hands_with_the_servers(certs):
    """What the cluster bus would use for its outbound links (build_client_context)."""
    from disque_py.server.tls import build_client_context

    cfg = configured(certs)
    version, peer_cert = _handshake(build_server_context(cfg), build_client_context(cfg))
    assert version == "TLSv1.3" and peer_cert  # the node presented its own certificate as a client
    with pytest.raises(ConfigError, match="between nodes"):
        build_client_context(configured(certs, tls_ca_cert_file=""))
