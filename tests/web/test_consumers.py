"""Stream consumers on the admin port: /api/consumers asks every node of a real 2-node cluster
(checked against openapi.json) while real clients, named as a Spark query's connections are
(client/consumers.py), read queues that a producer fills faster than they are consumed."""

from __future__ import annotations

import time

import pytest

from disque_py.cli import launcher
from disque_py.client import Client
from disque_py.client import consumers as cs
from tests.integration.conftest import wait_for

from .conftest import admin_port, free_port, http, refused_then_allowed, validated

pytestmark = pytest.mark.integration


def addr(node) -> str:
    return "%s:%d" % (node.host, node.port)


def consumers(node) -> dict:
    r = validated(http(admin_port(node), "GET", "/api/consumers"), "get", "/api/consumers")
    assert r.status == 200, r.body
    return r.json()


def named(node, name: str) -> Client:
    """A real client of ``node`` alone, its connections named ``name`` (CLIENT SETNAME)."""
    c = Client(addr(node), refresh_interval=None, client_name=name)
    c.ping()  # connects, and names the connection
    return c


def test_api_consumers_shows_each_consumer_with_its_backlog_and_oldest_job(start_node):
    a, b = start_node(admin_port=free_port()), start_node(admin_port=free_port())
    launcher.join([(a.host, a.port), (b.host, b.port)], timeout=30)
    ids = {n: n.client().execute_command("CLUSTER", "MYID").decode() for n in (a, b)}
    assert consumers(a) == {"time": pytest.approx(time.time(), abs=60), "truncated": False, "consumers": [],
                            "unreachable": []}  # fmt: skip

    images, odd = "images", "odd name, with: a comma/é"  # any queue name survives the connection name
    name = cs.client_name("etl-images", [images, odd])
    clients = [named(a, name), named(a, name), named(b, name), named(b, cs.client_name("other", ["thumbs"]))]
    plain = named(a, "disque-py-worker:h:1")  # not a stream consumer
    producer_a, producer_b = Client(addr(a), refresh_interval=None), Client(addr(b), refresh_interval=None)
    try:
        t0 = time.time()
        producer_a.add_jobs(images, [b"x"] * 3, replicate=1, retry=30)
        producer_b.add_jobs(odd, [b"y"] * 2, replicate=1, retry=30)
        got = consumers(b)  # asked on the other node: the answer is the cluster's
        assert got["unreachable"] == [] and got["truncated"] is False
        by_name = {c["name"]: c for c in got["consumers"]}
        assert sorted(by_name) == ["etl-images", "other"]
        etl = by_name["etl-images"]
        assert (etl["kind"], etl["queues"], etl["connections"]) == ("spark", [images, odd], {ids[a]: 2, ids[b]: 1})
        assert etl["queued"] == 5
        waited = time.time() - t0
        assert 0 <= etl["oldest_age"] <= waited + 1
        per_queue = {q["name"]: q for q in etl["per_queue"]}
        assert (per_queue[images]["queued"], per_queue[odd]["queued"]) == (3, 2)
        assert by_name["other"]["queued"] == 0 and by_name["other"]["oldest_age"] is None

        # The producer outpaces the consumer: the backlog grows and its oldest job ages.
        time.sleep(1.1)  # the age is in milliseconds of the nodes' wall clock: let it grow measurably
        producer_a.add_jobs(images, [b"x"] * 20, replicate=1, retry=30)
        later = {c["name"]: c for c in consumers(a)["consumers"]}["etl-images"]
        assert later["queued"] == 25
        assert later["oldest_age"] >= etl["oldest_age"] + 1.0

        # Consumed to the end: no backlog, no oldest job.
        jobs = clients[0].get_jobs(images, count=100, nohang=True) + clients[2].get_jobs(odd, count=100, nohang=True)
        assert len(jobs) == 25
        clients[0].ack(*[j.id for j in jobs])
        drained = {c["name"]: c for c in consumers(a)["consumers"]}["etl-images"]
        assert (drained["queued"], drained["oldest_age"]) == (0, None)

        # A consumer gone is gone from the list.
        for c in clients[:3]:
            c.close()
        wait_for(lambda: [c["name"] for c in consumers(a)["consumers"]] == ["other"], 10,
                 what="the closed consumer's connections gone")  # fmt: skip
    finally:
        for c in (*clients, plain, producer_a, producer_b):
            c.close()


def test_hostile_names_are_not_consumers_and_the_queues_measured_are_bounded(admin_node):
    many = cs.client_name("greedy", ["q%d" % i for i in range(cs.MAX_QUEUES + 50)])
    names = ["disque-py-spark:", "disque-py-spark::q", "disque-py-spark:a/b:q", "disque-py-spark:x",
             "disque-py-spark:ok:%ZZ,,%", many]  # fmt: skip
    clients = [named(admin_node, n) for n in names]
    try:
        got = consumers(admin_node)
        by_name = {c["name"]: c for c in got["consumers"]}
        assert sorted(by_name) == ["greedy", "ok"]
        assert by_name["ok"]["queues"] == ["%ZZ", "%"]
        # at most MAX_QUEUES measured, consumers in name order: greedy's first, then none left for ok
        assert got["truncated"] is True
        assert len(by_name["greedy"]["queues"]) == cs.MAX_QUEUES + 50
        assert len(by_name["greedy"]["per_queue"]) == cs.MAX_QUEUES and by_name["greedy"]["queued"] == 0
        assert (by_name["ok"]["per_queue"], by_name["ok"]["queued"]) == ([], None)
        assert admin_node.client().ping()  # the node is fine
    finally:
        for c in clients:
            c.close()


def test_api_consumers_needs_the_right_to_list_clients(start_node, tmp_path):
    # CLIENT LIST is an admin command: reading the queues is not enough
    assert refused_then_allowed(start_node, tmp_path, "/api/consumers", "+@consume +@inspect").json()["consumers"] == []
