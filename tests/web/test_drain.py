"""POST /api/nodes/{id}/drain on a real 3-node cluster: the admin page's way to empty a node
before it is stopped (client/drain.py's rounds, one per call, as `disque-py drain` runs them)."""

from __future__ import annotations

import pytest

from tests.integration.conftest import wait_for

from .conftest import admin_port, http, validated

pytestmark = pytest.mark.integration


def test_a_node_is_drained_through_the_api_and_every_job_delivered_once(cluster3):
    a, b, c = cluster3
    port = admin_port(a)  # asked through a's admin page, the node drained is b
    rb = b.client()
    b_id = rb.execute_command("CLUSTER", "MYID").decode()
    ids = [rb.execute_command("ADDJOB", "drained", "j%d" % i, 0, "REPLICATE", 1 + i % 2, "RETRY", 5).decode()
           for i in range(30)]  # fmt: skip
    ids += [rb.execute_command("ADDJOB", "drained", "once%d" % i, 0, "REPLICATE", 1, "RETRY", 0).decode()
            for i in range(5)]  # fmt: skip

    def round_():
        reply = validated(http(port, "POST", "/api/nodes/%s/drain" % b_id[:10]), "post", "/api/nodes/{id}/drain",
                          id=b_id[:10])  # fmt: skip
        assert reply.status == 200, reply.body
        return reply.json()

    first = round_()
    # (a job may leave by federation, to a consumer waiting elsewhere, before the drain moves it)
    assert first["node"] == b_id and first["left"]["queued"] == 35 and 30 <= first["moved"] <= 35, first
    assert set(first["targets"]) == {a.client().execute_command("CLUSTER", "MYID").decode(),
                                     c.client().execute_command("CLUSTER", "MYID").decode()}  # fmt: skip
    assert b"leaving" in rb.execute_command("CLUSTER", "NODES").split(b"\n")[0]
    last = wait_for(lambda: (lambda r: r if r["done"] else None)(round_()), timeout=30, what="the drain done")
    assert last["left"]["total"] == 0 and last["pending"] == 0
    assert rb.info()["registered_jobs"] == 0
    # every job once, from the other two nodes
    got: list[str] = []
    for node in (a, c):
        r = node.client()
        while True:
            jobs = r.execute_command("GETJOB", "NOHANG", "COUNT", 100, "FROM", "drained")
            if not jobs:
                break
            got += [j[1].decode() for j in jobs]
            r.execute_command("ACKJOB", *[j[1] for j in jobs])
    assert sorted(got) == sorted(ids)
    # bad input
    assert http(port, "POST", "/api/nodes/nosuchnode/drain").status == 404
    assert http(port, "POST", "/api/nodes/%s/drain" % b_id[:3]).status == 404  # a prefix under 8 names nobody
