"""The JSON API on real nodes, every answer checked against openapi.json."""

from __future__ import annotations

import json

import pytest

from tests.integration.conftest import wait_for

from .conftest import admin_port, http, job_path, validated

pytestmark = pytest.mark.integration


def test_openapi_description_is_served_and_valid(admin_node):
    from openapi_spec_validator import validate

    r = http(admin_port(admin_node), "GET", "/api/openapi.json")
    assert r.status == 200
    validate(r.json())
    assert {"/api/cluster", "/api/queues", "/api/jobs/{id}", "/healthz", "/readyz", "/metrics"} <= set(r.json()["paths"])


def test_health_and_readiness_of_a_lone_node(admin_node):
    port = admin_port(admin_node)
    r = validated(http(port, "GET", "/healthz"), "get", "/healthz")
    assert (r.status, r.body) == (200, b"ok")
    r = validated(http(port, "GET", "/readyz"), "get", "/readyz")
    assert (r.status, r.json()) == (200, {"ready": True})


def test_readyz_says_why_a_leaving_node_is_not_ready(admin_node):
    port = admin_port(admin_node)
    admin_node.client().execute_command("CLUSTER", "LEAVING", "yes")
    r = validated(http(port, "GET", "/readyz"), "get", "/readyz")
    assert r.status == 503
    assert r.json() == {"ready": False, "reason": "leaving the cluster"}
    admin_node.client().execute_command("CLUSTER", "LEAVING", "no")
    assert http(port, "GET", "/readyz").status == 200


def test_queues_job_and_actions_on_one_node(admin_node):
    port = admin_port(admin_node)
    c = admin_node.client()
    ids = [c.execute_command("ADDJOB", "orders", "body-%d" % i, 0).decode() for i in range(3)]
    c.execute_command("ADDJOB", "other", b"\xff\xfe binary", 0)

    r = validated(http(port, "GET", "/api/queues"), "get", "/api/queues")
    queues = r.json()
    assert queues["truncated"] is False
    assert [q["name"] for q in queues["queues"]] == ["orders", "other"]  # longest first
    orders = queues["queues"][0]
    assert (orders["len"], orders["jobs_in"], orders["jobs_out"], orders["paused"]) == (3, 3, 0, "none")
    assert list(orders["nodes"].values())[0]["len"] == 3

    r = validated(http(port, "GET", "/api/queues?limit=1"), "get", "/api/queues")
    assert r.json()["truncated"] is True and len(r.json()["queues"]) == 1
    assert validated(http(port, "GET", "/api/queues?limit=x"), "get", "/api/queues").status == 400

    r = validated(http(port, "GET", "/api/queues/orders"), "get", "/api/queues/orders", "/api/queues/{name}", name="orders")
    detail = r.json()
    assert [j["id"] for j in detail["jobs"]] == ids
    assert detail["jobs"][0] == {"id": ids[0], "body": "body-0", "body_encoding": "utf-8"}
    r = http(port, "GET", "/api/queues/other")
    assert r.json()["jobs"][0]["body_encoding"] == "base64"
    r = validated(http(port, "GET", "/api/queues/nosuch"), "get", "/api/queues/nosuch", "/api/queues/{name}", name="nosuch")
    assert r.status == 404

    r = validated(http(port, "POST", "/api/queues/orders/pause", body={"mode": "out"}),
                  "post", "/api/queues/orders/pause", "/api/queues/{name}/pause", name="orders")  # fmt: skip
    assert r.json() == {"name": "orders", "paused": "out"}
    assert c.execute_command("QSTAT", "orders")[-1] == b"out"
    assert http(port, "POST", "/api/queues/orders/pause", body={"mode": "sideways"}).status == 400
    http(port, "POST", "/api/queues/orders/pause", body={"mode": "none"})

    path = job_path(ids[0])
    r = validated(http(port, "GET", path), "get", path, "/api/jobs/{id}", id=ids[0])
    job = r.json()
    assert (job["id"], job["queue"], job["state"], job["body"]) == (ids[0], "orders", "queued", "body-0")
    assert job["node"] == c.execute_command("CLUSTER", "MYID").decode()
    assert job["dedup"] is None  # a job without a DEDUP key
    keyed = c.execute_command("ADDJOB", "orders", "keyed", 0, "DEDUP", "order-9").decode()
    path = job_path(keyed)
    assert validated(http(port, "GET", path), "get", path, "/api/jobs/{id}", id=keyed).json()["dedup"] == "order-9"
    c.execute_command("DELJOB", keyed)

    r = validated(http(port, "POST", job_path(ids[1], "dequeue")), "post", job_path(ids[1], "dequeue"),
                  "/api/jobs/{id}/dequeue", id=ids[1])  # fmt: skip
    assert r.json() == {"id": ids[1], "action": "dequeue", "result": 1}
    assert http(port, "GET", job_path(ids[1])).json()["state"] == "active"
    r = validated(http(port, "POST", job_path(ids[1], "nack")), "post", job_path(ids[1], "nack"),
                  "/api/jobs/{id}/nack", id=ids[1])  # fmt: skip
    assert r.json()["result"] == 1
    assert http(port, "GET", job_path(ids[1])).json()["nacks"] == 1
    r = validated(http(port, "POST", job_path(ids[0], "ack")), "post", job_path(ids[0], "ack"),
                  "/api/jobs/{id}/ack", id=ids[0])  # fmt: skip
    assert r.json() == {"id": ids[0], "action": "ack", "result": 1}
    wait_for(lambda: http(port, "GET", job_path(ids[0])).status == 404, what="the acked job to go")

    bad = "/api/jobs/D-nothing"
    r = validated(http(port, "GET", bad), "get", bad, "/api/jobs/{id}", id="D-nothing")
    assert r.status == 400 and "error" in r.json()
    unknown = ids[0][:-4] + "ffff"
    r = validated(http(port, "GET", job_path(unknown)), "get", job_path(unknown), "/api/jobs/{id}", id=unknown)
    assert r.status == 404
    assert http(port, "POST", job_path(unknown, "ack")).status == 404
    assert http(port, "POST", job_path(ids[2], "frobnicate")).status == 404


def test_errors_are_json(admin_node):
    port = admin_port(admin_node)
    for method, path, status in (("GET", "/nope", 404), ("DELETE", "/api/queues", 405),
                                 ("POST", "/api/queues/q/pause", 400)):  # fmt: skip
        r = http(port, method, path)
        assert r.status == status, (method, path)
        assert "error" in r.json()
    r = http(port, "POST", "/api/queues/q/pause", body=None)
    assert r.status == 400
    conn_body = b"not json"
    import http.client as httpc

    conn = httpc.HTTPConnection("127.0.0.1", port, timeout=10)
    conn.request("POST", "/api/queues/q/pause", body=conn_body, headers={"Content-Type": "application/json"})
    resp = conn.getresponse()
    assert resp.status == 400 and "error" in json.loads(resp.read())
    conn.close()


def test_the_cluster_view_and_a_job_held_on_another_node(cluster3):
    a, b, c = cluster3
    port = admin_port(a)
    ids = {n.port: n.client().execute_command("CLUSTER", "MYID").decode() for n in cluster3}

    def view():
        r = validated(http(port, "GET", "/api/cluster"), "get", "/api/cluster")
        return r.json()

    def all_in():
        v = view()
        return len(v["nodes"]) == 3 and all(n["reachable"] and n["link"] == "connected" for n in v["nodes"]) and v

    v = wait_for(all_in, timeout=20, what="three reachable nodes")
    assert v["myself"] == ids[a.port]
    by_id = {n["id"]: n for n in v["nodes"]}
    assert set(by_id) == set(ids.values())
    for n in cluster3:
        entry = by_id[ids[n.port]]
        assert entry["port"] == n.port and entry["admin_port"] == admin_port(n)
        assert entry["error"] is None
        assert entry["info"]["uptime_in_seconds"] <= n.client().info("server")["uptime_in_seconds"]
    assert by_id[ids[a.port]]["flags"] == ["myself"]

    # a job only node c holds (REPLICATE 1, no async push): found through c, acted on at c
    job = c.client().execute_command("ADDJOB", "remote", "held by c", 0, "REPLICATE", 1).decode()
    b.client().execute_command("ADDJOB", "remote", "held by b", 0, "REPLICATE", 1)
    assert a.client().execute_command("SHOW", job) is None
    path = job_path(job)
    r = validated(http(port, "GET", path), "get", path, "/api/jobs/{id}", id=job)
    assert r.status == 200
    assert (r.json()["node"], r.json()["body"]) == (ids[c.port], "held by c")

    def remote_queue():
        r = validated(http(port, "GET", "/api/queues"), "get", "/api/queues")
        q = [q for q in r.json()["queues"] if q["name"] == "remote"]
        return q and q[0]["len"] == 2 and q[0]

    q = wait_for(remote_queue, what="the queue summed over b and c")
    assert set(q["nodes"]) >= {ids[b.port], ids[c.port]}
    r = http(port, "GET", "/api/queues/remote")
    assert {j["body"] for j in r.json()["jobs"]} == {"held by b", "held by c"}

    r = validated(http(port, "POST", job_path(job, "dequeue")), "post", job_path(job, "dequeue"),
                  "/api/jobs/{id}/dequeue", id=job)  # fmt: skip
    assert r.json()["result"] == 1
    assert c.client().execute_command("QLEN", "remote") == 0

    # a node that is down is shown as unreachable, quickly
    c.stop()
    import time

    t0 = time.monotonic()
    v = view()
    took = time.monotonic() - t0
    entry = {n["id"]: n for n in v["nodes"]}[ids[c.port]]
    assert entry["reachable"] is False and entry["info"] is None and entry["error"]
    assert took < 5, took  # bounded by the peer timeout, not hanging
    assert validated(http(port, "GET", "/api/queues"), "get", "/api/queues").status == 200


def test_the_page_route_serves_the_page_when_it_is_installed(admin_node):
    from disque_py.web.app import STATIC_DIR

    r = http(admin_port(admin_node), "GET", "/")
    if (STATIC_DIR / "index.html").is_file():
        assert r.status == 200 and r.headers["content-type"].startswith("text/html")
    else:
        assert r.status == 404 and "not installed" in r.json()["error"]
