"""docs/grafana/disque-py.json: a Grafana 10+ dashboard whose queries use only metrics a node exports."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

DASHBOARD = Path(__file__).resolve().parents[1] / "docs" / "grafana" / "disque-py.json"

#: the metric names a node's /metrics serves (the admin port); histograms by their base name
METRICS = frozenset({
    "disque_node_info", "disque_uptime_seconds", "disque_jobs", "disque_registered_jobs",
    "disque_registered_queues", "disque_connected_clients", "disque_blocked_clients",
    "disque_connections_received_total", "disque_net_input_bytes_total", "disque_net_output_bytes_total",
    "disque_jobs_added_total", "disque_jobs_delivered_total", "disque_jobs_acked_total",
    "disque_jobs_requeued_total", "disque_jobs_expired_total",
    "disque_jobs_imported_total", "disque_jobs_exported_total", "disque_needjobs_sent_total",
    "disque_needjobs_received_total", "disque_yourjobs_sent_total", "disque_yourjobs_received_total",
    "disque_commands_total", "disque_command_errors_total", "disque_command_duration_seconds",
    "disque_queue_length", "disque_queue_blocked_clients", "disque_queue_jobs_in_total",
    "disque_queue_jobs_out_total", "disque_queue_import_rate", "disque_queue_paused",
    "disque_cluster_known_nodes", "disque_cluster_nodes", "disque_bus_links", "disque_bus_bytes_sent_total",
    "disque_bus_bytes_received_total", "disque_bus_messages_sent_total", "disque_bus_messages_received_total",
    "disque_bus_auth_failures_total", "disque_bus_bad_frames_total",
    "disque_memory_used_bytes", "disque_memory_max_bytes", "disque_memory_level",
    "disque_aof_enabled", "disque_aof_size_bytes", "disque_aof_last_write_ok", "disque_aof_rewrites_total",
    # prometheus-client's process and platform collectors
    "process_cpu_seconds_total", "process_resident_memory_bytes", "process_virtual_memory_bytes",
    "process_open_fds", "process_max_fds", "process_start_time_seconds",
    "python_gc_objects_collected_total", "python_gc_objects_uncollectable_total", "python_gc_collections_total",
    "python_info",
})  # fmt: skip
HISTOGRAMS = frozenset({"disque_command_duration_seconds"})

# PromQL words that look like names: aggregation modifiers, set operators, offsets
_KEYWORDS = frozenset({"by", "without", "on", "ignoring", "group_left", "group_right", "and", "or", "unless",
                       "offset", "bool", "inf", "nan"})  # fmt: skip


def metric_names(expr: str) -> set[str]:
    """The metric names a PromQL expression reads (functions, labels, strings and ranges left out)."""
    text = re.sub(r'"(?:[^"\\]|\\.)*"', '""', expr)  # strings
    text = re.sub(r"\{[^}]*\}", "", text)  # label matchers
    text = re.sub(r"\[[^\]]*\]", "", text)  # ranges, [$__rate_interval]
    text = re.sub(r"\b(by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)", "", text)  # label lists
    text = re.sub(r"\$\w+", "", text)  # dashboard variables
    names = set()
    for match in re.finditer(r"[A-Za-z_:][A-Za-z0-9_:]*", text):
        name = match.group(0)
        if name.lower() in _KEYWORDS or text[match.end():].lstrip().startswith("("):
            continue  # a keyword or a function call
        if match.start() > 0 and (text[match.start() - 1].isdigit() or text[match.start() - 1] == "."):
            continue  # part of a number (1e3)
        names.add(name)
    return names


def known(name: str) -> bool:
    if name in METRICS:
        return True
    base, _, suffix = name.rpartition("_")
    return suffix in ("bucket", "sum", "count") and base in HISTOGRAMS


@pytest.fixture(scope="module")
def dashboard() -> dict:
    return json.loads(DASHBOARD.read_text())


def panels(dashboard: dict) -> list[dict]:
    out = []
    for panel in dashboard["panels"]:
        out.append(panel)
        out.extend(panel.get("panels", ()))  # a collapsed row keeps its panels inside
    return out


def test_the_metric_name_reader_finds_names_and_only_names():
    assert metric_names('sum by (queue) (rate(disque_queue_jobs_in_total{instance=~"$instance"}[$__rate_interval]))'
                        ) == {"disque_queue_jobs_in_total"}  # fmt: skip
    assert metric_names("histogram_quantile(0.99, sum by (le, command) (rate(x_bucket[5m]))) / on (a) y > 1e3"
                        ) == {"x_bucket", "y"}  # fmt: skip
    assert not known("disque_made_up_total") and known("disque_command_duration_seconds_bucket")
    assert not known("disque_queue_length_bucket")


def test_it_is_a_grafana_10_dashboard_with_a_datasource_and_an_instance_variable(dashboard):
    assert dashboard["schemaVersion"] >= 36  # Grafana 9.x/10.x
    assert dashboard["title"] and dashboard["uid"]
    variables = {v["name"]: v for v in dashboard["templating"]["list"]}
    assert variables["datasource"]["type"] == "datasource" and variables["datasource"]["query"] == "prometheus"
    instance = variables["instance"]
    assert instance["type"] == "query" and instance["datasource"]["uid"] == "${datasource}"
    assert metric_names(instance["definition"].replace("label_values(", "").split(",")[0]) <= METRICS
    assert instance["multi"] and instance["includeAll"]


def test_panels_have_unique_ids_a_place_and_queries_on_the_datasource_variable(dashboard):
    all_panels = panels(dashboard)
    ids = [p["id"] for p in all_panels]
    assert len(ids) == len(set(ids))
    graphs = [p for p in all_panels if p["type"] != "row"]
    assert len(graphs) >= 12
    for p in graphs:
        assert p["title"], p
        assert {"x", "y", "w", "h"} <= set(p["gridPos"]) and p["gridPos"]["x"] + p["gridPos"]["w"] <= 24, p["title"]
        assert p["datasource"]["uid"] == "${datasource}", p["title"]
        assert p["targets"], p["title"]
        refs = [t["refId"] for t in p["targets"]]
        assert len(refs) == len(set(refs)), p["title"]
        for t in p["targets"]:
            assert t["expr"].strip() and t["datasource"]["uid"] == "${datasource}", p["title"]
            assert 'instance=~"$instance"' in t["expr"], (p["title"], t["expr"])


def test_every_metric_a_query_reads_is_one_a_node_exports(dashboard):
    used = set()
    for p in panels(dashboard):
        for t in p.get("targets", ()):
            names = metric_names(t["expr"])
            assert names, t["expr"]
            unknown = {n for n in names if not known(n)}
            assert not unknown, "%s: %s reads %s" % (p["title"], t["expr"], sorted(unknown))
            used |= names
    # the panels the dashboard promises
    for name in ("disque_jobs", "disque_jobs_added_total", "disque_jobs_delivered_total", "disque_jobs_acked_total",
                 "disque_queue_length", "disque_queue_jobs_in_total", "disque_queue_jobs_out_total",
                 "disque_commands_total", "disque_command_duration_seconds_bucket", "disque_command_errors_total",
                 "disque_bus_bytes_sent_total", "disque_bus_messages_sent_total", "disque_cluster_nodes",
                 "disque_memory_used_bytes", "disque_memory_max_bytes", "process_cpu_seconds_total",
                 "process_resident_memory_bytes"):  # fmt: skip
        assert name in used, name
    exprs = " ".join(t["expr"] for p in panels(dashboard) for t in p.get("targets", ()))
    assert "histogram_quantile(0.5," in exprs and "histogram_quantile(0.99," in exprs
    assert "topk(10," in exprs
