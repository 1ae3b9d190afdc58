"""Where the Spark source's writes go and where its snapshot reads each job, on real nodes, without Spark.

The writer's tasks must use every node listed (each connection on the node
chosen for it, not on the client's random seed) and fail over when that node
is down; the read planner must give each job to the node where it is queued.
"""

from __future__ import annotations

import contextlib
import random
import socket
import threading
import uuid

import pytest

from disque_py.client import Client
from disque_py.client.cluster import Topology
from disque_py.spark import options as opts
from disque_py.spark.links import Links, address_text
from disque_py.spark.spread import add_batches, assign_snapshot, first_node
from tests.client.conftest import start_cluster, stop_all


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    nodes = start_cluster(tmp_path_factory.mktemp("spread"), 3, loglevel="notice")
    yield nodes
    stop_all(nodes)


@pytest.fixture
def addresses(cluster) -> list[tuple[str, int]]:
    return [("127.0.0.1", n.port) for n in cluster]


def write_options(nodes, **extra) -> opts.Options:
    raw = {"nodes": ",".join(address_text(a) for a in nodes), "connectTimeout": "0.5", **extra}
    return opts.parse(raw, "write")


def batches(queue: str, rows: int, batch: int):
    """(first row, ADDJOB argvs) as the Spark writer makes them, ``batch`` rows at a time."""
    for first in range(0, rows, batch):
        yield first, [(b"ADDJOB", queue.encode(), b"row-%d" % n, b"5000") for n in range(first, min(rows, first + batch))]


def qlen_by_node(addresses, queue: str) -> dict[tuple[str, int], int]:
    out = {}
    for address in addresses:
        with Client(address_text(address), refresh_interval=None) as c:
            out[address] = c.qlen(queue)
    return out


@contextlib.contextmanager
def closing_listener():
    """A node that is down in the way a crashed process behind its port is: every connection is
    accepted and closed at once. Yields (address, a list of the accepted connections' peers)."""
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    sock.listen(64)
    accepted: list = []
    stop = threading.Event()

    def run() -> None:
        sock.settimeout(0.1)
        while not stop.is_set():
            try:
                conn, peer = sock.accept()
            except OSError:
                continue
            accepted.append(peer)
            conn.close()

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    try:
        yield sock.getsockname()[:2], accepted
    finally:
        stop.set()
        thread.join()
        sock.close()


# ------------------------------------------------------------------------------------ the client option
def test_a_preferred_address_comes_first_while_it_is_up_and_last_while_it_is_down():
    seeds = [("s", p) for p in range(1, 6)]
    for seed in range(20):  # whatever the client's random order
        topo = Topology(seeds, random.Random(seed), down_for=5.0, prefer=("s", 4))
        assert topo.candidates(0.0)[0] == ("s", 4)
        assert sorted(topo.candidates(0.0)) == seeds
        topo.mark_down(("s", 4), 1.0)
        assert topo.candidates(2.0)[-1] == ("s", 4)  # down: the others are the failover
        assert topo.candidates(7.0)[0] == ("s", 4)  # back after down_for


def test_a_client_connects_to_its_preferred_node_not_to_a_random_seed(addresses):
    for address in addresses * 3:
        with Client([address_text(a) for a in addresses], prefer=address, refresh_interval=None) as c:
            c.ping()
            assert c.current_address == address


# ------------------------------------------------------------------------------------ write spread
def test_each_write_task_adds_its_jobs_on_the_node_chosen_for_it(addresses):
    """One connection per task: task p writes only to node p mod 3, whatever the seeds' shuffle."""
    queue = "spread-" + uuid.uuid4().hex[:8]
    o = write_options(addresses, connections="1", batchSize="50")
    for part in range(6):
        added, counts = add_batches(o, part, batches("%s-%d" % (queue, part), 100, 50))
        assert added == 100
        expected = first_node(addresses, part, 0)
        assert expected == addresses[part % 3]
        assert counts == {address_text(expected): 100}
        lens = qlen_by_node(addresses, "%s-%d" % (queue, part))
        assert lens == {a: (100 if a == expected else 0) for a in addresses}, "task %d" % part


def test_a_task_with_enough_batches_adds_jobs_on_every_node_of_its_connections(addresses):
    """2 tasks of 4 connections over 3 nodes (the Spark test's shape): every node gets jobs, and
    each task's jobs are on exactly the nodes its connections were given."""
    queue = "spread-" + uuid.uuid4().hex[:8]
    o = write_options(addresses, connections="4", batchSize="100")
    for part in range(2):
        q = "%s-%d" % (queue, part)
        added, counts = add_batches(o, part, batches(q, 1000, 100))
        assert added == 1000 and sum(counts.values()) == 1000
        chosen = {first_node(addresses, part, k) for k in range(4)}
        assert chosen == set(addresses)
        lens = qlen_by_node(addresses, q)
        assert sum(lens.values()) == 1000
        assert {a for a, n in lens.items() if n > 0} == chosen, "task %d: %r" % (part, lens)


def test_a_connection_whose_node_is_down_tries_it_first_then_fails_over(addresses):
    with closing_listener() as (dead, accepted):
        nodes = [dead, *addresses]
        o = write_options(nodes, connections="4", batchSize="50")
        queue = "spread-" + uuid.uuid4().hex[:8]
        added, counts = add_batches(o, 0, batches(queue, 400, 50))
        # Connection 0 of task 0 is given the dead node: it tries it once, then another node;
        # connections 1..3 are given the live nodes and never try it.
        assert first_node(nodes, 0, 0) == dead
        assert len(accepted) == 1
    assert added == 400 and address_text(dead) not in counts
    lens = qlen_by_node(addresses, queue)
    assert sum(lens.values()) == 400 and all(n > 0 for n in lens.values())


def test_a_task_given_a_refused_address_fails_over_without_losing_a_job(addresses):
    with socket.socket() as s:  # a port nothing listens on once it is closed
        s.bind(("127.0.0.1", 0))
        refused = s.getsockname()[:2]
    nodes = [refused, *addresses]
    assert first_node(nodes, 4, 0) == refused
    queue = "spread-" + uuid.uuid4().hex[:8]
    added, counts = add_batches(write_options(nodes, connections="1", batchSize="50"), 4, batches(queue, 200, 50))
    assert added == 200 and address_text(refused) not in counts
    assert sum(qlen_by_node(addresses, queue).values()) == 200


# ------------------------------------------------------------------------------------ read planner
def test_the_read_planner_gives_each_job_to_the_node_where_it_is_queued(addresses):
    queue = "spread-" + uuid.uuid4().hex[:8]
    o = write_options(addresses, connections="1", batchSize="40", replicate="3")
    for part in range(3):
        add_batches(o, part, batches(queue, 120, 40))
    queued_at = {}
    for address in addresses:
        with Client(address_text(address), refresh_interval=None) as c:
            for job in c.jscan(queue=queue, states=("queued",), reply="all"):
                queued_at[job["id"]] = address
    assert len(queued_at) == 360
    links = Links(addresses)
    try:
        assigned = assign_snapshot(links, addresses, [queue])
    finally:
        links.close()
    got = {job_id: node for node, ids in assigned.items() for job_id in ids}
    assert got == queued_at  # each job once, from where it is queued (every node holds a copy)
    assert all(len(assigned[a]) == 120 for a in addresses)  # so the read is spread as the write was
