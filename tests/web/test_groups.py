"""Groups on the admin port: /api/groups merges every node's GROUP LIST (checked against
openapi.json), the busiest first with the rest in one _other row; /metrics' group gauges, capped
the same way; the client's group_* methods on the same real nodes."""

from __future__ import annotations

import pytest

from disque_py import Client
from disque_py.cli import launcher
from tests.integration.conftest import wait_for

from .conftest import admin_port, free_port, http, validated
from .test_metrics import labels_of, scrape, value

pytestmark = pytest.mark.integration


def test_api_groups_metrics_and_the_client_on_two_nodes(start_node):
    a, b = start_node(admin_port=free_port()), start_node(admin_port=free_port())
    launcher.join([(a.host, a.port), (b.host, b.port)], timeout=30)
    with Client("%s:%d" % (a.host, a.port)) as client:
        assert client.group_limit("t1", concurrency=2) == "OK"
        assert client.group_limit("t1", rate=2.5) == "OK"
        assert client.group_weight("t2", 3) == "OK"
        with pytest.raises(ValueError, match="a group name is 1 to 128 bytes"):
            client.group_info("")
        with pytest.raises(ValueError, match="weight must be from 1 to 1000"):
            client.group_weight("t2", 1001)
        with pytest.raises(TypeError, match="one at a time"):
            client.group_limit("t1", concurrency=1, rate=1)
        for i in range(3):
            client.add_job("q", b"x%d" % i, group="t1", retry=30, replicate=1)
        for i in range(5):
            client.add_job("q", b"y%d" % i, group="t2", replicate=1)
        for n in range(3, 6):
            client.add_job("q", b"z", group="t%d" % n, replicate=1)
        # (a node that starts holds the groups until it has compared settings with a peer, and a
        # limited group until it has heard the shares of a majority: at once on a connected cluster)
        wait_for(lambda: not client.group_info("t1")["held"], timeout=10, what="t1's jobs deliverable on a")
        got: list = []
        wait_for(lambda: got.extend(client.get_jobs("q", count=3 - len(got), nohang=True)) or len(got) == 3,
                 timeout=10, what="three jobs delivered")  # fmt: skip
        info = client.group_info("t1")
        assert (info["concurrency"], info["rate"], info["weight"]) == (2, 2.5, 1)
        assert info["active"] + info["waiting"] == 3 and info["active"] >= 1
    bc = b.client()
    assert wait_for(lambda: bc.execute_command("GROUP", "INFO", "t2")[3] == 3, timeout=10, what="the weight on b")

    r = validated(http(admin_port(b), "GET", "/api/groups?limit=2"), "get", "/api/groups")
    data = r.json()
    assert data["unreachable"] == [] and data["truncated"] is True
    names = [g["name"] for g in data["groups"]]
    assert names[:2] == ["t2", "t1"] and names[-1] == "_other"  # the busiest two, then the rest summed
    assert data["groups"][-1]["groups"] == 3 and data["groups"][-1]["waiting"] == 3
    t1 = data["groups"][1]
    assert t1["concurrency"] == 2 and t1["rate"] == 2.5 and t1["active"] + t1["waiting"] == 3
    assert len(got) == 3

    c = a.client()
    assert c.execute_command("CONFIG", "SET", "admin-metrics-max-queues", "2") == b"OK"
    fams = scrape(a)
    assert labels_of(fams, "disque_group_waiting", "group") == {"t2", "t1", "_other"}
    assert value(fams, "disque_group_waiting", group="_other") == 3
    assert value(fams, "disque_group_limit_concurrency", group="t1") == 2
    assert value(fams, "disque_group_limit_rate", group="t1") == 2.5
    assert value(fams, "disque_group_active", group="t1") + value(fams, "disque_group_waiting", group="t1") == 3
