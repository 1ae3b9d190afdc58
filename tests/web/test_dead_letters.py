"""Dead letters on the admin port: /api/dead and its actions on a real 3-node cluster, and
/metrics' count of dead-lettered jobs per original queue."""

from __future__ import annotations

import pytest

from tests.integration.conftest import wait_for

from .conftest import admin_port, http, job_path, validated
from .test_metrics import scrape, value

pytestmark = pytest.mark.integration


def dead_letter(c, queue: str, body: str, reason: str | None = None) -> str:
    """A job of ``queue`` that fails past MAXDELIVER 1: its dead letter lands in ``queue``.dead."""
    job_id = c.execute_command("ADDJOB", queue, body, 0, "RETRY", 1, "MAXDELIVER", 1).decode()
    got = c.execute_command("GETJOB", "NOHANG", "FROM", queue)
    assert got and got[0][1].decode() == job_id
    args = ["NACK", job_id] + (["REASON", reason] if reason else [])
    assert c.execute_command(*args) == 1
    return job_id


def test_dead_letter_queues_jobs_requeue_and_purge_across_the_cluster(cluster3):
    a, b, _ = cluster3
    port = admin_port(a)
    ids = [dead_letter(b.client(), "orders", "o-%d" % i, "downstream 503") for i in range(3)]
    dead_letter(a.client(), "emails", "e-0")

    def listed():
        r = validated(http(port, "GET", "/api/dead"), "get", "/api/dead")
        return r.json() if sum(q["count"] for q in r.json()["queues"]) == 4 else None

    got = wait_for(listed, what="4 dead letters listed")
    assert got["unreachable"] == []
    assert [(q["name"], q["count"], q["original_queues"]) for q in got["queues"]] == [
        ("orders.dead", 3, {"orders": 3}), ("emails.dead", 1, {"emails": 1})]

    path = "/api/dead/orders.dead"
    r = validated(http(port, "GET", path), "get", path, "/api/dead/{name}", name="orders.dead")
    jobs = r.json()["jobs"]
    assert sorted(j["original_id"] for j in jobs) == sorted(ids)
    assert {(j["original_queue"], j["deliveries"], j["reason"], j["body"][:2]) for j in jobs} == {
        ("orders", 1, "downstream 503", "o-")}
    assert all(j["age"] >= 0 and j["options"] == ["MAXDELIVER", "1"] for j in jobs)

    # requeue one: back in "orders" with its options, gone from orders.dead
    one = jobs[0]
    apath = "/api/dead/orders.dead/requeue"
    r = validated(http(port, "POST", apath, body={"ids": [one["id"]]}), "post", apath, "/api/dead/{name}/requeue",
                  name="orders.dead")  # fmt: skip
    assert (r.json()["done"], r.json()["errors"]) == (1, {})
    new_id = r.json()["requeued_as"][one["id"]]
    job = http(port, "GET", job_path(new_id)).json()
    assert (job["queue"], job["body"]) == ("orders", one["body"])
    assert sum(n.client().execute_command("QLEN", "orders") for n in cluster3) == 1
    assert wait_for(lambda: len(http(port, "GET", path).json()["jobs"]) == 2, what="one left")

    # bad requests change nothing
    assert validated(http(port, "POST", apath, body={}), "post", apath, "/api/dead/{name}/requeue",
                     name="orders.dead").status == 400  # fmt: skip
    r = http(port, "POST", apath, body={"ids": ["D-00000000-000000000000000000000000-05a1"]})
    assert r.status == 404
    assert len(http(port, "GET", path).json()["jobs"]) == 2

    # purge all of orders.dead
    ppath = "/api/dead/orders.dead/purge"
    r = validated(http(port, "POST", ppath, body={"all": True}), "post", ppath, "/api/dead/{name}/purge",
                  name="orders.dead")  # fmt: skip
    assert (r.json()["done"], r.json()["errors"]) == (2, {})
    assert wait_for(lambda: http(port, "GET", path).json()["jobs"] == [], what="orders.dead empty")
    assert [q["name"] for q in http(port, "GET", "/api/dead").json()["queues"]] == ["emails.dead"]


def test_a_dead_letter_comes_with_its_last_traceback(admin_node):
    from tests.tasks.tracing import ERROR_LINE, FAILING_LINE, fail_for_good, failing_app

    port = admin_port(admin_node)
    f = failing_app("127.0.0.1:%d" % admin_node.port)
    try:
        ref, err = fail_for_good(f)
    finally:
        f.app.close()
    path = "/api/dead/%s.dead" % f.queue

    def listed():
        r = validated(http(port, "GET", path), "get", path, "/api/dead/{name}", name=f.queue + ".dead")
        return r.json()["jobs"]

    [job] = wait_for(listed, what="the task's dead letter")
    assert (job["original_id"], job["reason"]) == (ref.id, ERROR_LINE)
    assert job["traceback"] == err.traceback and FAILING_LINE in job["traceback"]
    assert job["traceback"].endswith("\n" + ERROR_LINE + "\n")
    # one without (a plain NACK): null
    dead_letter(admin_node.client(), "plain", "x", "why")
    path = "/api/dead/plain.dead"
    [plain] = wait_for(lambda: http(port, "GET", path).json()["jobs"], what="the plain dead letter")
    assert plain["traceback"] is None and plain["reason"] == "why"
    validated(http(port, "GET", path), "get", path, "/api/dead/{name}", name="plain.dead")


def test_requeue_gives_the_job_back_to_its_queue_with_its_options(admin_node):
    c = admin_node.client()
    port = admin_port(admin_node)
    job_id = c.execute_command("ADDJOB", "q", "payload", 0, "RETRY", 5, "BACKOFF", 0.5, 30, "MAXDELIVER", 3).decode()
    c.execute_command("GETJOB", "NOHANG", "FROM", "q")
    assert c.execute_command("NACK", job_id, "DEAD", "REASON", "bad input") == 1
    dead = http(port, "GET", "/api/dead/q.dead").json()["jobs"]
    assert [(d["original_id"], d["reason"], d["deliveries"]) for d in dead] == [(job_id, "bad input", 1)]
    r = http(port, "POST", "/api/dead/q.dead/requeue", body={"all": True})
    assert r.json()["done"] == 1
    assert c.execute_command("QLEN", "q.dead") == 0
    ((queue, new_id, body),) = c.execute_command("QPEEK", "q", 1)
    assert (queue, body) == (b"q", b"payload")
    show = c.execute_command("SHOW", new_id)
    fields = {show[i].decode(): show[i + 1] for i in range(0, len(show), 2)}
    assert (fields["maxdeliver"], fields["backoff-min-ms"], fields["backoff-max-ms"], fields["retry"]) == (3, 500, 30000, 5)
    assert "dead-letter-of" not in fields


def test_metrics_count_dead_letters_per_original_queue(admin_node):
    c = admin_node.client()
    for i in range(2):
        dead_letter(c, "billing", "b-%d" % i)
    dead_letter(c, "mail", "m")
    fams = scrape(admin_node)
    assert value(fams, "disque_queue_jobs_dead_lettered_total", queue="billing") == 2
    assert value(fams, "disque_queue_jobs_dead_lettered_total", queue="mail") == 1
    assert value(fams, "disque_jobs_dead_lettered_total") == 3
    job_id = c.execute_command("ADDJOB", "slow", "x", 0, "RETRY", 5).decode()
    c.execute_command("GETJOB", "NOHANG", "FROM", "slow")
    c.execute_command("NACK", job_id, "DELAY", 2)
    assert value(scrape(admin_node), "disque_jobs_nack_delayed_total") == 1

    assert c.execute_command("CONFIG", "SET", "admin-metrics-max-queues", "1") == b"OK"
    fams = scrape(admin_node)
    assert value(fams, "disque_queue_jobs_dead_lettered_total", queue="billing") == 2
    assert value(fams, "disque_queue_jobs_dead_lettered_total", queue="_other") == 1
