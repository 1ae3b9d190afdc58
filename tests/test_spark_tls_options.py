"""The Spark source's TLS and user options, checked without Spark."""

from __future__ import annotations

import pytest

from disque_py.spark import options as opts
from disque_py.spark.links import Links


def test_no_tls_by_default():
    o = opts.parse({"nodes": "h:1", "queue": "q"}, "write")
    assert not o.tls and o.username is None
    assert o.connection_options() == {
        "password": None, "username": None, "tls": False, "ssl_ca_certs": None, "ssl_certfile": None,
        "ssl_keyfile": None,
    }  # fmt: skip


def test_tls_options_and_user():
    o = opts.parse({"nodes": "h:1", "TLS": "true", "tls.caCert": "/c/ca.crt", "tls.cert": "/c/client.crt",
                    "tls.key": "/c/client.key", "username": "alice", "password": "pw"}, "read")  # fmt: skip
    assert (o.tls, o.tls_cacert, o.tls_cert, o.tls_key) == (True, "/c/ca.crt", "/c/client.crt", "/c/client.key")
    assert o.connection_options() == {
        "password": "pw", "username": "alice", "tls": True, "ssl_ca_certs": "/c/ca.crt",
        "ssl_certfile": "/c/client.crt", "ssl_keyfile": "/c/client.key",
    }  # fmt: skip
    # a CA file alone means TLS, as in the clients
    assert opts.parse({"nodes": "h:1", "queue": "q", "tls.cacert": "/c/ca.crt"}, "stream").tls


def test_rediss_nodes_mean_tls():
    o = opts.parse({"nodes": "rediss://h1:7711, rediss://h2:7712"}, "read")
    assert o.tls and o.nodes == (("h1", 7711), ("h2", 7712))
    assert not opts.parse({"nodes": "redis://h1:7711"}, "read").tls


@pytest.mark.parametrize(
    "raw, message",
    [
        ({"tls": "maybe"}, "option 'tls' must be true or false"),
        ({"tls": "false", "tls.cacert": "/ca"}, "option 'tls.cacert' is given but 'tls' is false"),
        ({"tls": "no", "tls.cert": "/c", "tls.key": "/k"}, "option 'tls.cert' is given but 'tls' is false"),
        ({"tls.key": "/k"}, "option 'tls.key' needs 'tls.cert'"),
        ({"username": "alice"}, "option 'username' needs 'password'"),
        ({"tls.ca": "/ca"}, "unknown option 'tls.ca'"),
    ],
)
def test_bad_tls_options(raw, message):
    with pytest.raises(ValueError, match=message):
        opts.parse({"nodes": "h:1", **raw}, "read")


@pytest.mark.parametrize(
    "nodes, message",
    [
        ("rediss://h1:1,h2:2", "mixes rediss:// \\(TLS\\) and plain entries"),
        ("rediss://:pw@h1:1", "must not carry credentials"),
    ],
)
def test_bad_tls_nodes(nodes, message):
    with pytest.raises(ValueError, match=message):
        opts.parse({"nodes": nodes}, "read")
    with pytest.raises(ValueError, match="option 'tls' is false but 'nodes' are rediss://"):
        opts.parse({"nodes": "rediss://h:1", "tls": "false"}, "read")


def test_links_carry_the_options():
    o = opts.parse({"nodes": "h:1", "tls.cacert": "/ca", "username": "u", "password": "p"}, "read")
    links = Links(o.nodes, connect_timeout=o.connect_timeout, **o.connection_options())
    assert links.config.tls and links.config.ssl_ca_certs == "/ca"
    assert (links.config.username, links.config.password) == ("u", "p")

