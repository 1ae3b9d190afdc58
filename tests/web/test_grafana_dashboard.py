"""docs/grafana/disque-py.json: a Grafana 10+ dashboard whose queries use only metrics real nodes export."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

from disque_py.cli import launcher
from tests.integration.conftest import fail_unclean, free_port, unclean
from tests.web.conftest import http

DASHBOARD = Path(__file__).resolve().parents[2] / "docs" / "grafana" / "disque-py.json"

@pytest.fixture(scope="module")
def exported(tmp_path_factory) -> frozenset[str]:
    """The sample names real nodes serve on /metrics: two joined nodes with their admin port on,
    a job replicated to both (bus messages of each kind), taken and acknowledged, a queue paused."""
    work = tmp_path_factory.mktemp("dash")
    nodes = []
    try:
        for i in range(2):
            port, admin = free_port(), free_port()
            d = work / str(i)
            d.mkdir()
            proc = launcher.spawn(launcher.node_argv(port, d, "--admin-port", str(admin)), output=d / "log")
            nodes.append((proc, port, admin))
            launcher.wait_ready(proc, port, timeout=30, logs=[d / "log"])
        launcher.join([("127.0.0.1", p) for _, p, _ in nodes], timeout=30)
        port = nodes[0][1]
        job = launcher.call(port, "ADDJOB", "q", "body", "5000", "REPLICATE", "2")
        launcher.call(port, "GETJOB", "FROM", "q")
        launcher.call(port, "ACKJOB", job)
        launcher.call(port, "PAUSE", "paused-q", "in")
        reply = http(nodes[0][2], "GET", "/metrics")
        assert reply.status == 200
        names = {s.name for fam in text_string_to_metric_families(reply.body.decode()) for s in fam.samples}
        return frozenset(names)
    finally:
        fail_unclean([unclean("node on port %d" % port, launcher.stop(proc, timeout=10)) for proc, port, _ in nodes])


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


def known(name: str, exported: frozenset[str]) -> bool:
    return name in exported


@pytest.fixture(scope="module")
def dashboard() -> dict:
    return json.loads(DASHBOARD.read_text())


def panels(dashboard: dict) -> list[dict]:
    out = []
    for panel in dashboard["panels"]:
        out.append(panel)
        out.extend(panel.get("panels", ()))  # a collapsed row keeps its panels inside
    return out


def test_the_metric_name_reader_finds_names_and_only_names(exported):
    assert metric_names('sum by (queue) (rate(disque_queue_jobs_in_total{instance=~"$instance"}[$__rate_interval]))'
                        ) == {"disque_queue_jobs_in_total"}  # fmt: skip
    assert metric_names("histogram_quantile(0.99, sum by (le, command) (rate(x_bucket[5m]))) / on (a) y > 1e3"
                        ) == {"x_bucket", "y"}  # fmt: skip
    assert not known("disque_made_up_total", exported) and known("disque_command_duration_seconds_bucket", exported)
    assert not known("disque_queue_length_bucket", exported)


def test_it_is_a_grafana_10_dashboard_with_a_datasource_and_an_instance_variable(dashboard, exported):
    assert dashboard["schemaVersion"] >= 36  # Grafana 9.x/10.x
    assert dashboard["title"] and dashboard["uid"]
    variables = {v["name"]: v for v in dashboard["templating"]["list"]}
    assert variables["datasource"]["type"] == "datasource" and variables["datasource"]["query"] == "prometheus"
    instance = variables["instance"]
    assert instance["type"] == "query" and instance["datasource"]["uid"] == "${datasource}"
    assert metric_names(instance["definition"].replace("label_values(", "").split(",")[0]) <= exported
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


def test_every_metric_a_query_reads_is_one_a_node_exports(dashboard, exported):
    used = set()
    for p in panels(dashboard):
        for t in p.get("targets", ()):
            names = metric_names(t["expr"])
            assert names, t["expr"]
            unknown = {n for n in names if not known(n, exported)}
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
