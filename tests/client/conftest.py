"""Fixtures for the client tests: real node processes, shared where the tests allow it.

* ``node``: one node for the whole session (tests use their own queue names);
* ``cluster3``: three joined nodes for the whole session (never harmed);
* ``make_cluster(n)``: a private cluster for tests that kill nodes or make
  them leave (``cluster-node-timeout`` 1000 ms);
* ``auth_node``: a node with ``requirepass``.

Every wait polls a condition with a deadline (``wait_for``); nothing sleeps
and hopes.
"""

from __future__ import annotations

import itertools
import uuid

import pytest
import redis
import trio

from disque_py.cli import launcher
from tests.integration.conftest import (  # noqa: F401
    ROOT, NodeProcess, free_port, start_all, start_node, stop_all, wait_for,
)

PASSWORD = "s3cret-pw"


def cluster_info(node: NodeProcess) -> dict[str, str]:
    text = node.client(protocol=2).execute_command("CLUSTER", "INFO").decode()
    return dict(line.split(":", 1) for line in text.split("\r\n") if ":" in line)


def join(nodes: list[NodeProcess], timeout: float = 20.0) -> None:
    """CLUSTER MEET from the first node, then wait until every node reaches every other."""
    launcher.join([("127.0.0.1", n.port) for n in nodes], timeout=timeout, interval=0.05)


def start_cluster(base, n: int, **directives) -> list[NodeProcess]:
    nodes = start_all([NodeProcess(base, **directives) for _ in range(n)])
    if n > 1:
        join(nodes)
    return nodes


@pytest.fixture(scope="session")
def node(tmp_path_factory) -> NodeProcess:
    nodes = start_cluster(tmp_path_factory.mktemp("single"), 1, loglevel="notice")
    yield nodes[0]
    stop_all(nodes)


@pytest.fixture(scope="session")
def cluster3(tmp_path_factory) -> list[NodeProcess]:
    nodes = start_cluster(tmp_path_factory.mktemp("cluster3"), 3, loglevel="notice")
    yield nodes
    stop_all(nodes)


@pytest.fixture(scope="session")
def auth_node(tmp_path_factory) -> NodeProcess:
    nodes = start_cluster(tmp_path_factory.mktemp("auth"), 1, requirepass=PASSWORD, loglevel="notice")
    yield nodes[0]
    stop_all(nodes)


@pytest.fixture
def make_cluster(tmp_path):
    started: list[NodeProcess] = []
    counter = itertools.count()

    def make(n: int, **directives) -> list[NodeProcess]:
        directives.setdefault("cluster_node_timeout", 1000)
        directives.setdefault("loglevel", "notice")
        nodes = start_cluster(tmp_path / ("c%d" % next(counter)), n, **directives)
        started.extend(nodes)
        return nodes

    yield make
    stop_all(started)


@pytest.fixture
def queue() -> str:
    """A queue name nobody else uses."""
    return "q-" + uuid.uuid4().hex[:12]


def addr(node: NodeProcess) -> str:
    return "127.0.0.1:%d" % node.port


def raw(node: NodeProcess) -> redis.Redis:
    """A plain redis-py client (RESP2) for checking server-side state."""
    return node.client(protocol=2)


async def run_until(worker, condition, timeout: float = 10.0, poll: float = 0.005):
    """Run the worker until ``condition()`` holds, then stop it; returns the final stats."""
    with trio.fail_after(timeout):
        async with trio.open_nursery() as nursery:
            nursery.start_soon(worker.run)
            while not condition():
                await trio.sleep(poll)
            worker.stop()
    return worker.stats()


async def sample_in_flight(monitor, queue: str, worker, server: list[int], local: list[int], every: float) -> None:
    """Forever: the node's count of the queue's active jobs (JSCAN through the trio client
    ``monitor``) into ``server``, the worker's own in-flight count into ``local``. BUSYLOOP:
    one call, so one instant; a scan in several calls may see a job acked before and the
    next one fetched after, and count both."""
    while True:
        active = [i async for i in monitor.jscan(queue=queue, states="active", busyloop=True)]
        server.append(len(active))
        local.append(worker.stats().in_flight)
        await trio.sleep(every)
