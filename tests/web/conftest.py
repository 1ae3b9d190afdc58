"""Real nodes with their admin port on, and what the tests need to talk HTTP to them.

No HTTP client library: ``http.client`` for well-formed requests, raw sockets for the
malformed ones. Responses of the JSON API are checked against ``disque_py/web/openapi.json``
with openapi-core (:func:`validated`).
"""

from __future__ import annotations

import base64
import http.client as httpc
import json
import ssl
import time
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from urllib.parse import quote

import pytest

from disque_py.cli import launcher
from tests.integration.conftest import NodeProcess, free_port, wait_for  # noqa: F401
from tests.integration.conftest import node as node  # noqa: F401 - fixtures
from tests.integration.conftest import start_node as start_node  # noqa: F401

OPENAPI = Path(__file__).resolve().parents[2] / "disque_py" / "web" / "openapi.json"


@dataclass
class Reply:
    status: int
    headers: dict[str, str]
    body: bytes

    def json(self):
        return json.loads(self.body)


def http(port: int, method: str, path: str, *, body=None, auth: tuple[str, str] | None = None,
         host: str = "127.0.0.1", tls: ssl.SSLContext | None = None, timeout: float = 10) -> Reply:  # fmt: skip
    headers = {}
    data = None
    if body is not None:
        data = json.dumps(body).encode()
        headers["Content-Type"] = "application/json"
    if auth is not None:
        headers["Authorization"] = "Basic " + base64.b64encode(("%s:%s" % auth).encode()).decode()
    if tls is not None:
        conn = httpc.HTTPSConnection(host, port, timeout=timeout, context=tls)
    else:
        conn = httpc.HTTPConnection(host, port, timeout=timeout)
    try:
        conn.request(method, path, body=data, headers=headers)
        resp = conn.getresponse()
        return Reply(resp.status, {k.lower(): v for k, v in resp.getheaders()}, resp.read())
    finally:
        conn.close()


@lru_cache(maxsize=1)
def _openapi():
    from openapi_core import OpenAPI

    return OpenAPI.from_dict(json.loads(OPENAPI.read_text()))


def validated(reply: Reply, method: str, path: str, pattern: str | None = None, **view_args) -> Reply:
    """Check ``reply`` against the description (status, content type, schema); returns it."""
    from openapi_core.testing import MockRequest, MockResponse

    request = MockRequest("http://localhost", method, path, path_pattern=pattern, view_args=view_args or None)
    ctype = reply.headers.get("content-type", "").split(";")[0]
    response = MockResponse(reply.body, status_code=reply.status, content_type=ctype)
    _openapi().validate_response(request, response)
    return reply


def job_path(job_id: str, action: str = "") -> str:
    return "/api/jobs/" + quote(job_id, safe="/+") + ("/" + action if action else "")


def ping_within(node: NodeProcess, deadline: float = 2.0) -> float:
    """PING the node's client port on a new connection; the seconds it took (fails past ``deadline``)."""
    t0 = time.monotonic()
    assert launcher.ping(node.port, host=node.host, timeout=deadline), "the client port did not answer PING"
    return time.monotonic() - t0


@pytest.fixture
def admin_node(start_node):  # noqa: F811
    """One node with its admin port on."""
    return start_node(admin_port=free_port())


def admin_port(node: NodeProcess) -> int:
    return int(node.directives["admin_port"])


@pytest.fixture
def cluster3(start_node):  # noqa: F811
    """Three joined nodes, each with an admin port."""
    nodes = start_node.many(3, each=lambda: {"admin_port": free_port()})
    launcher.join([(n.host, n.port) for n in nodes], timeout=30)
    return nodes


def refused_then_allowed(start_node, tmp_path: Path, path: str, rights: str) -> Reply:  # noqa: F811
    """A node with a password and a user ``w`` of ``rights``: ``GET path`` answers ``w`` 403 and
    no one 401; the default user's answer (200) is returned. Every answer checked against
    openapi.json."""
    conf = tmp_path / "users.conf"
    conf.write_text("requirepass defpw\nuser w on >wpw allkeys %s\n" % rights)
    node = start_node(config_file=str(conf), admin_port=free_port())
    node.password = "defpw"
    port = int(node.directives["admin_port"])
    r = validated(http(port, "GET", path, auth=("w", "wpw")), "get", path)
    assert r.status == 403, r.body
    assert validated(http(port, "GET", path), "get", path).status == 401
    r = validated(http(port, "GET", path, auth=("default", "defpw")), "get", path)
    assert r.status == 200, r.body
    return r
