"""/metrics on real nodes: parsed with prometheus-client's parser, its numbers against INFO."""

from __future__ import annotations

import pytest
from prometheus_client.parser import text_string_to_metric_families

from disque_py.cli import launcher
from tests.integration.conftest import wait_for

from .conftest import admin_port, free_port, http

pytestmark = pytest.mark.integration


def scrape(node) -> dict[str, list]:
    r = http(admin_port(node), "GET", "/metrics")
    assert r.status == 200
    assert r.headers["content-type"].startswith("text/plain")
    fams = {}
    for fam in text_string_to_metric_families(r.body.decode()):
        fams[fam.name] = fam.samples
    return fams


def value(fams, name: str, **labels) -> float:
    for samples in fams.values():
        for sample in samples:
            if sample.name == name and all(sample.labels.get(k) == v for k, v in labels.items()):
                return sample.value
    raise KeyError((name, labels))


def labels_of(fams, name: str, label: str) -> set[str]:
    return {s.labels[label] for s in fams.get(name.removesuffix("_total"), []) if s.name == name}


def test_node_metrics_match_info(admin_node):
    c = admin_node.client()
    for i in range(4):
        c.execute_command("ADDJOB", "a", "job %d" % i, 0)
    c.execute_command("ADDJOB", "b", "x", 0)
    got = c.execute_command("GETJOB", "FROM", "a")
    c.execute_command("ACKJOB", got[0][1])
    info = c.info("all")
    fams = scrape(admin_node)
    info2 = c.info("all")
    node_id = c.execute_command("CLUSTER", "MYID").decode()

    assert value(fams, "disque_node_info", node_id=node_id) == 1
    for metric, field in (("disque_registered_jobs", "registered_jobs"),
                          ("disque_registered_queues", "registered_queues"),
                          ("disque_jobs_added_total", "jobs_added"),
                          ("disque_jobs_delivered_total", "jobs_delivered"),
                          ("disque_jobs_acked_total", "jobs_acked"),
                          ("disque_connected_clients", "connected_clients"),
                          ("disque_blocked_clients", "blocked_clients")):  # fmt: skip
        assert value(fams, metric) == info[field] == info2[field], metric
    assert info["jobs_added"] == 5 and info["jobs_delivered"] == 1
    assert info["total_connections_received"] <= value(fams, "disque_connections_received_total") <= info2["total_connections_received"]
    assert value(fams, "disque_jobs", state="queued") == 4
    assert value(fams, "disque_jobs", state="active") == 0
    assert value(fams, "disque_queue_length", queue="a") == 3
    assert value(fams, "disque_queue_jobs_in_total", queue="a") == 4
    assert value(fams, "disque_queue_jobs_out_total", queue="a") == 1
    assert value(fams, "disque_queue_length", queue="b") == 1
    assert value(fams, "disque_memory_max_bytes") == info["maxmemory"]
    assert value(fams, "disque_aof_enabled") == 0
    assert value(fams, "disque_cluster_known_nodes") == 1
    assert value(fams, "disque_cluster_nodes", state="ok") == 1
    # INFO's whole seconds around the scrape's exact ones
    assert info["uptime_in_seconds"] <= value(fams, "disque_uptime_seconds") < info2["uptime_in_seconds"] + 1
    # the process, the GC and the platform, from prometheus-client's own collectors
    assert value(fams, "process_resident_memory_bytes") > 0
    assert value(fams, "process_open_fds") > 0
    assert "python_gc_objects_collected" in fams and "python_info" in fams

    c.execute_command("PAUSE", "b", "in")
    fams = scrape(admin_node)
    assert value(fams, "disque_queue_paused", queue="b", mode="in") == 1


def test_command_metrics_match_commandstats(admin_node):
    c = admin_node.client()
    for _ in range(7):
        c.execute_command("ADDJOB", "q", "x", 0)
    fams = scrape(admin_node)
    assert "disque_commands" in fams, sorted(fams)
    calls = value(fams, "disque_commands_total", command="addjob")
    assert calls == 7
    assert value(fams, "disque_command_duration_seconds_count", command="addjob") == 7
    assert value(fams, "disque_command_duration_seconds_bucket", command="addjob", le="+Inf") == 7
    assert c.info("commandstats")["cmdstat_addjob"]["calls"] == 7


def test_queue_labels_are_capped_with_the_rest_under_other(admin_node):
    c = admin_node.client()
    for n in range(1, 7):  # q1 holds 1 job ... q6 holds 6
        for _ in range(n):
            c.execute_command("ADDJOB", "q%d" % n, "x", 0)
    c.execute_command("PAUSE", "q1", "out")
    assert c.execute_command("CONFIG", "SET", "admin-metrics-max-queues", "3") == b"OK"
    fams = scrape(admin_node)
    assert labels_of(fams, "disque_queue_length", "queue") == {"q6", "q5", "q4", "_other"}
    assert value(fams, "disque_queue_length", queue="_other") == 1 + 2 + 3
    assert value(fams, "disque_queue_jobs_in_total", queue="_other") == 6
    assert value(fams, "disque_queue_jobs_out_total", queue="_other") == 0
    assert value(fams, "disque_queue_paused", queue="_other", mode="out") == 1
    assert value(fams, "disque_jobs", state="queued") == 21

    c.execute_command("CONFIG", "SET", "admin-metrics-max-queues", "1000")
    fams = scrape(admin_node)
    assert labels_of(fams, "disque_queue_length", "queue") == {"q%d" % n for n in range(1, 7)}


def test_the_clusters_own_queues_have_no_queue_label_and_two_gauges_count_them(admin_node):
    c = admin_node.client()
    c.execute_command("ADDJOB", "a", "x", 0)
    for i in range(3):  # a task's result is a queue of its own, named @result:<job ID>
        c.execute_command("ADDJOB", "@result:%d" % i, "r", 0)
    c.execute_command("ADDJOB", "@result:0", "again", 0)
    fams = scrape(admin_node)
    for family in ("disque_queue_length", "disque_queue_blocked_clients", "disque_queue_jobs_in_total",
                   "disque_queue_jobs_out_total", "disque_queue_import_rate"):  # fmt: skip
        assert labels_of(fams, family, "queue") == {"a"}, family
    assert value(fams, "disque_internal_queues") == 3
    assert value(fams, "disque_internal_queue_jobs") == 4
    assert value(fams, "disque_jobs", state="queued") == 5  # jobs are jobs, wherever queued
    assert value(fams, "disque_registered_queues") == 4  # INFO's count: every queue
    # past the cap, the rest summed under _other holds none of them either
    c.execute_command("ADDJOB", "b", "x", 0)
    c.execute_command("ADDJOB", "b", "y", 0)
    assert c.execute_command("CONFIG", "SET", "admin-metrics-max-queues", "1") == b"OK"
    fams = scrape(admin_node)
    assert labels_of(fams, "disque_queue_length", "queue") == {"b", "_other"}
    assert value(fams, "disque_queue_length", queue="_other") == 1
    assert value(fams, "disque_queue_jobs_in_total", queue="_other") == 1


def test_bus_messages_are_counted_by_kind(start_node):
    a, b = (start_node(admin_port=free_port()) for _ in range(2))
    launcher.join([(n.host, n.port) for n in (a, b)], timeout=30)
    a.client().execute_command("ADDJOB", "q", "x", 0, "REPLICATE", 2)
    wait_for(lambda: value(scrape(a), "disque_bus_messages_sent_total", kind="REPLJOB") >= 1, what="REPLJOB counted")
    wait_for(lambda: value(scrape(b), "disque_bus_messages_received_total", kind="REPLJOB") >= 1, what="received")
    fams = scrape(a)
    assert value(fams, "disque_cluster_known_nodes") == 2
    assert value(fams, "disque_bus_links") >= 1
    assert value(fams, "disque_bus_bytes_sent_total") > 0 and value(fams, "disque_bus_bytes_received_total") > 0


def test_dedup_hits_and_remembered_ids_match_info(admin_node):
    """ADDJOB ... DEDUP answered with an existing ID counts in disque_dedup_hits_total (INFO
    stats dedup_hits); a deleted DEDUP job's ID remembered for the window counts in
    disque_dedup_ids_remembered (INFO stats dedup_ids_remembered)."""
    c = admin_node.client()
    fams = scrape(admin_node)
    assert value(fams, "disque_dedup_hits_total") == 0 and value(fams, "disque_dedup_ids_remembered") == 0
    job_id = c.execute_command("ADDJOB", "d", "first", 0, "DEDUP", "order-1")
    assert c.execute_command("ADDJOB", "d", "second", 0, "DEDUP", "order-1") == job_id
    assert c.execute_command("ADDJOB", "d", "third", 0, "DEDUP", "order-1") == job_id
    c.execute_command("ADDJOB", "d", "other", 0, "DEDUP", "order-2")
    c.execute_command("ADDJOB", "d", "plain", 0)
    fams = scrape(admin_node)
    assert value(fams, "disque_dedup_hits_total") == c.info("stats")["dedup_hits"] == 2
    assert value(fams, "disque_dedup_ids_remembered") == 0
    assert c.execute_command("ACKJOB", job_id) == 1
    wait_for(lambda: c.execute_command("SHOW", job_id) is None, timeout=10, what="the acked job deleted")
    fams = scrape(admin_node)
    assert value(fams, "disque_dedup_ids_remembered") == c.info("stats")["dedup_ids_remembered"] == 1
    assert c.execute_command("ADDJOB", "d", "late", 0, "DEDUP", "order-1") == job_id
    assert value(scrape(admin_node), "disque_dedup_hits_total") == 3
