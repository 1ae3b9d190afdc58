"""Workers on the admin port: /api/workers asks every node of a real 2-node cluster (checked
against openapi.json) while real worker processes beat to one or the other, and /metrics' gauges."""

from __future__ import annotations

import pytest

from disque_py.cli import launcher
from tests.integration.conftest import wait_for
from tests.integration.worker_procs import WorkerProcess, holders_module, release, started

from .conftest import admin_port, free_port, http, refused_then_allowed, validated
from .test_metrics import scrape, value

pytestmark = pytest.mark.integration


def addr(node) -> str:
    return "%s:%d" % (node.host, node.port)


def test_api_workers_lists_the_workers_of_every_node_with_their_jobs(start_node, tmp_path, monkeypatch):
    a, b = start_node(admin_port=free_port()), start_node(admin_port=free_port())
    launcher.join([(a.host, a.port), (b.host, b.port)], timeout=30)
    directory, mod = holders_module(tmp_path, monkeypatch, addr(b))
    procs = [WorkerProcess(directory, "holders:hold", "-q", "plain-q", "-n", addr(a), "--beacon-interval", "0.3"),
             WorkerProcess(directory, "holders:app", "-n", addr(b), "--beacon-interval", "0.3")]  # fmt: skip
    try:
        job_id = a.client().execute_command("ADDJOB", "plain-q", "x", 0).decode()
        ref = mod.crunch.send(1)
        wait_for(lambda: started(directory, job_id) and started(directory, ref.id), timeout=30, what="jobs started")

        def asked():
            r = validated(http(admin_port(a), "GET", "/api/workers"), "get", "/api/workers")
            workers = r.json()["workers"]
            return r.json() if len(workers) == 2 and all(w["running"] for w in workers) else None

        got = wait_for(asked, timeout=20, interval=0.2, what="both workers, each running its job")
        assert got["unreachable"] == []
        by_pid = {w["pid"]: w for w in got["workers"]}
        node_ids = {n: n.client().execute_command("CLUSTER", "MYID").decode() for n in (a, b)}
        plain, tasks = by_pid[procs[0].pid], by_pid[procs[1].pid]
        assert (plain["node"], [j["id"] for j in plain["running"]]) == (node_ids[a], [job_id])
        assert tasks["node"] == node_ids[b]
        assert [(j["id"], j["label"]) for j in tasks["running"]] == [(ref.id, mod.crunch.name)]

        # each node's gauges count the workers that beat to it
        for node in (a, b):
            fams = scrape(node)
            assert value(fams, "disque_workers") == 1 and value(fams, "disque_worker_jobs_running") == 1

        release(directory)
        for p in procs:
            p.stop()
        r = validated(http(admin_port(b), "GET", "/api/workers"), "get", "/api/workers")
        assert r.json()["workers"] == []  # stopped cleanly: gone at once
        assert value(scrape(a), "disque_workers") == 0
    finally:
        for p in procs:
            p.close()


def test_api_workers_needs_the_right_to_inspect(start_node, tmp_path):
    assert refused_then_allowed(start_node, tmp_path, "/api/workers", "+@consume").json()["workers"] == []


def test_the_gauges_count_the_live_workers_and_their_jobs(admin_node):
    c = admin_node.client()
    running = '{"running": [{"id": "D-1", "queue": "q"}, {"id": "D-2", "queue": "q"}]}'
    # a beats every second (gone after 3 s of silence): the scrape below comes well before, even
    # on a loaded machine (at 100 ms the first scrape came after a was gone)
    assert c.execute_command("WORKER", "BEAT", "a:1:x", 1000, running) == b"OK"
    assert c.execute_command("WORKER", "BEAT", "b:2:x", 60000, "{}") == b"OK"
    fams = scrape(admin_node)
    assert (value(fams, "disque_workers"), value(fams, "disque_worker_jobs_running")) == (2, 2)
    assert c.info("clients")["connected_workers"] == 2
    # a: silent for 3 x 1 s, gone (the cron's second, or the next read)
    wait_for(lambda: value(scrape(admin_node), "disque_workers") == 1, timeout=20, interval=0.2, what="a gone")
    assert value(scrape(admin_node), "disque_worker_jobs_running") == 0
    assert c.execute_command("WORKER", "FORGET", "b:2:x") == 1
    assert value(scrape(admin_node), "disque_workers") == 0 and c.info("clients")["connected_workers"] == 0
