"""The admin page in a real browser: Debian's headless Chromium driven by playwright, against
real node processes with their admin port on.

The browser is the system's ``/usr/bin/chromium`` (``scripts/test`` installs it when it runs as
root); playwright's own browser downloads are never used. Without either, every test here is
skipped and says why.
"""

from __future__ import annotations

import os
import re
from pathlib import Path

import pytest
import redis

from tests.integration.conftest import NodeProcess, free_port, stop_all, wait_for

CHROMIUM = os.environ.get("DISQUE_TEST_CHROMIUM", "/usr/bin/chromium")
CHROMIUM_ARGS = [
    "--headless=new", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
    "--disable-background-networking", "--disable-component-update", "--disable-sync",
]  # fmt: skip

try:
    from playwright.sync_api import sync_playwright
except ImportError:  # pragma: no cover - depends on the environment
    sync_playwright = None

#: the page's console may report the API's 4xx answers (which the tests provoke), and a request
#: cut by a change of the host's network interfaces (ERR_NETWORK_CHANGED: the chaos tests and the
#: groups' partition proof add and remove interfaces for their network namespaces while this runs;
#: the page's next refresh asks again); nothing else
EXPECTED_CONSOLE = re.compile(r"Failed to load resource: the server responded with a status of 4\d\d|"
                              r"net::ERR_CONNECTION_REFUSED|net::ERR_NETWORK_CHANGED")


def _skip_reason() -> str | None:
    if sync_playwright is None:
        return "playwright is not installed (pip install playwright; the browser itself comes from Debian)"
    if not os.access(CHROMIUM, os.X_OK):
        return "%s not found (apt-get install chromium; scripts/test installs it when run as root)" % CHROMIUM
    return None


@pytest.fixture(scope="session")
def browser():
    reason = _skip_reason()
    if reason:
        pytest.skip(reason)
    with sync_playwright() as pw:
        b = pw.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        try:
            yield b
        finally:
            b.close()


class Page:
    """A browser tab on a node's admin page that fails the test on any script error or any
    console error the test did not provoke (a CSP violation, a missing file)."""

    def __init__(self, browser, url: str, credentials: dict[str, str] | None = None) -> None:
        self.context = browser.new_context(viewport={"width": 1280, "height": 900}, http_credentials=credentials)
        self.context.set_default_timeout(15_000)
        self.page = self.context.new_page()
        self.problems: list[str] = []
        self.page.on("pageerror", lambda exc: self.problems.append("page error: %s" % exc))
        self.page.on("console", self._console)
        self.url = url

    def _console(self, msg) -> None:
        if msg.type == "error" and not EXPECTED_CONSOLE.search(msg.text):
            self.problems.append("console error: %s" % msg.text)

    def open(self):
        self.page.goto(self.url)
        return self.page

    def close(self) -> None:
        self.context.close()


@pytest.fixture
def open_page(browser):
    pages: list[Page] = []

    def open_(node: NodeProcess, credentials: dict[str, str] | None = None):
        p = Page(browser, "http://%s:%d/" % (node.host, node.admin_port), credentials)
        pages.append(p)
        return p.open()

    yield open_
    problems = [msg for p in pages for msg in p.problems]
    for p in pages:
        p.close()
    assert not problems, "\n".join(problems)


def admin_node(tmp: Path, **directives) -> NodeProcess:
    node = NodeProcess(tmp, admin_port=free_port(), **directives)
    node.admin_port = node.directives["admin_port"]
    return node.start()


def node_id(node: NodeProcess) -> str:
    return node.client().execute_command("CLUSTER", "MYID").decode()


def join(nodes: list[NodeProcess]) -> None:
    """MEET every node from the first one and wait until each sees all the others connected."""
    first = nodes[0].client()
    for other in nodes[1:]:
        assert first.execute_command("CLUSTER", "MEET", other.host, other.port) == b"OK"

    def meshed() -> bool:
        for n in nodes:
            rows = [line.split() for line in n.client().execute_command("CLUSTER", "NODES").decode().splitlines()]
            if len(rows) != len(nodes) or any(row[5] != "connected" for row in rows):
                return False
        return True

    wait_for(meshed, timeout=20, what="%d nodes in a full mesh" % len(nodes))


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    """Three nodes with their admin port on, in a full mesh; shared by a module's tests, which
    therefore each use queues of their own."""
    if _skip_reason():
        pytest.skip(_skip_reason())
    tmp = tmp_path_factory.mktemp("browser-cluster")
    nodes: list[NodeProcess] = []
    try:
        for _ in range(3):
            nodes.append(admin_node(tmp))
        join(nodes)
        yield nodes
    finally:
        stop_all(nodes)


def client(node: NodeProcess) -> redis.Redis:
    return node.client()
