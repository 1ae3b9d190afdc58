"""The clients' TLS settings: redis-py's names, URLs with rediss://, the client context."""

from __future__ import annotations

import ssl

import pytest

from disque_py.client.cluster import parse_address, parse_seeds, split_url
from disque_py.client.config import ClientConfig


@pytest.mark.parametrize(
    "text, expected",
    [
        ("127.0.0.1:7711", ("127.0.0.1:7711", False, None)),
        ("redis://h:7000", ("h:7000", False, None)),
        ("rediss://h:7000", ("h:7000", True, None)),
        ("REDISS://h:7000/0", ("h:7000", True, None)),
        ("disques://:pw@h:7000", ("h:7000", True, "pw")),
        ("redis://user:p:w@h", ("h", False, "p:w")),
        ("disque://[::1]:7000?x=1", ("[::1]:7000", False, None)),
    ],
)
def test_split_url(text, expected):
    assert split_url(text) == expected


def test_addresses_from_urls():
    assert parse_address("rediss://10.0.0.1:7712") == ("10.0.0.1", 7712)
    assert parse_address("redis://node") == ("node", 7711)
    assert parse_seeds("rediss://a:1, rediss://b:2") == [("a", 1), ("b", 2)]


def test_a_tls_url_turns_tls_on_and_gives_the_password():
    cfg = ClientConfig("rediss://:secret@127.0.0.1:7712")
    assert cfg.tls and cfg.password == "secret"
    assert ClientConfig("rediss://:secret@h:1", password="given").password == "given"
    plain = ClientConfig("127.0.0.1:7711")
    assert not plain.tls and plain.ssl_context() is None
    assert ClientConfig("h:1", ssl_ca_certs="/x.pem").tls  # a CA alone means TLS, as it would be useless otherwise


def test_client_context_and_kwargs():
    cfg = ClientConfig("h:1", tls=True, ssl_check_hostname=False)
    ctx = cfg.ssl_context()
    assert isinstance(ctx, ssl.SSLContext) and ctx.verify_mode == ssl.CERT_REQUIRED and not ctx.check_hostname
    assert cfg.ssl_context() is ctx  # built once
    kw = cfg.kwargs()
    assert kw["tls"] is True and kw["ssl_check_hostname"] is False
    with pytest.raises(FileNotFoundError, match="No such file"):
        ClientConfig("h:1", tls=True, ssl_ca_certs="/nonexistent.pem").ssl_context()
