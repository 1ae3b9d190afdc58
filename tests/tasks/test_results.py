"""Where results live, with real nodes: in the cluster's own queues (``@result:<job ID>``), which
``disque-py top``, the admin API and /metrics leave out unless asked (``--all``, ``?all=1``,
``QSCAN ... ALL``), still replicated and gone after their ``result_ttl``; periodic slots keep
none unless their declaration asks; a result an older worker wrote under the old name
(``result:<job ID>``) is still found."""

from __future__ import annotations

import json
import threading
import uuid

import pytest
from click.testing import CliRunner
from prometheus_client.parser import text_string_to_metric_families

from disque_py.cli import launcher
from disque_py.cli.app import main
from disque_py.tasks import App, GroupRef, ResultTimeout, TaskRef, current_task
from disque_py.tasks.periodic import start_scheduler
from tests.integration.conftest import free_port
from tests.web.conftest import http, validated

from .conftest import addr, raw, wait_for

pytestmark = pytest.mark.integration

#: a result's body as the worker writes it (tasks/message.py), for results written by hand
OK_3 = b'{"v":1,"ok":true,"value":3}'


@pytest.fixture
def admin3(start_node):
    """Three joined nodes, each with an admin port."""
    nodes = start_node.many(3, each=lambda: {"admin_port": free_port()})
    launcher.join([(n.host, n.port) for n in nodes], timeout=30)
    return nodes


def qscan(node, *options) -> set[str]:
    reply = raw(node).execute_command("QSCAN", "BUSYLOOP", *options)
    return {name.decode() for name in reply[1]}


def top_queues(nodes, *options: str) -> set[str]:
    seeds = ",".join(addr(n) for n in nodes)
    result = CliRunner().invoke(main, ["top", "--nodes", seeds, "--json", "--interval", "0.2", *options])
    assert result.exit_code == 0, result.output
    data = json.loads(result.stdout)
    assert data["all_queues"] is ("--all" in options)
    return {q["name"] for q in data["queues"]}


def api_queues(node, query: str = "") -> set[str]:
    port = int(node.directives["admin_port"])
    reply = validated(http(port, "GET", "/api/queues" + query), "GET", "/api/queues")
    assert reply.status == 200, reply.body
    return {q["name"] for q in reply.json()["queues"]}


def scrape(node) -> list:
    reply = http(int(node.directives["admin_port"]), "GET", "/metrics")
    assert reply.status == 200
    return [s for fam in text_string_to_metric_families(reply.body.decode()) for s in fam.samples]


def series(node) -> set[tuple]:
    """The series /metrics has, by name and labels, but those the test's own traffic adds by
    itself (a command run for the first time, a bus message of a new kind)."""
    return {(s.name, tuple(sorted(s.labels.items()))) for s in scrape(node)
            if "command" not in s.labels and "kind" not in s.labels}  # fmt: skip


def value(node, name: str) -> float:
    (got,) = [s.value for s in scrape(node) if s.name == name]
    return got


def test_a_hundred_results_leave_top_the_api_and_metrics_as_they_were_unless_asked(admin3, run_worker):
    q = "t-" + uuid.uuid4().hex[:8]
    app = App(addr(admin3[0]), result_ttl=120)
    try:

        @app.task(queue=q, retries=0)
        def add(a, b):
            return a + b

        run_worker(app, concurrency=4)
        # the task queue exists and has worked once (no result), and a plain queue holds jobs
        assert add.send_with(args=(0, 0), result_ttl=0).id
        for i in range(3):
            raw(admin3[1]).execute_command("ADDJOB", "plain-" + q, "job %d" % i, 0)
        wait_for(lambda: value(admin3[0], "disque_jobs_acked_total") >= 1, what="the first task acknowledged")
        before_top = top_queues(admin3)
        before_api = api_queues(admin3[0])
        before_series = [series(n) for n in admin3]
        assert {q, "plain-" + q} <= before_top and before_top == before_api

        refs = app.group([add.s(i, i) for i in range(100)]).send().refs
        assert [r.result(timeout=30) for r in refs] == [2 * i for i in range(100)]
        results = {r.result_queue for r in refs}
        assert results == {"@result:" + r.id for r in refs}

        # left out: top (table and --json), the admin API of any node, QSCAN, /metrics
        assert top_queues(admin3) == before_top
        assert api_queues(admin3[0]) == before_api and api_queues(admin3[2]) == before_api
        assert not results & set().union(*(qscan(n) for n in admin3))
        assert [series(n) for n in admin3] == before_series
        # ... but counted, on the node that holds them, by two gauges of their own
        assert value(admin3[0], "disque_internal_queues") >= 100
        assert value(admin3[0], "disque_internal_queue_jobs") == 100
        assert value(admin3[2], "disque_internal_queue_jobs") == 0
        # shown when asked, with the other queue of the cluster's own here: the worker's control
        # queue (@control:<worker ID>, its cancel notices)
        shown = top_queues(admin3, "--all")
        control = {name for name in shown if name.startswith("@control:")}
        assert len(control) == 1 and shown == before_top | results | control
        assert results <= qscan(admin3[0], "ALL")
        assert api_queues(admin3[1], "?all=1") == before_api | results | control
        assert api_queues(admin3[1], "?all=true") == api_queues(admin3[1], "?all=1")
        assert api_queues(admin3[1], "?all=0") == before_api
        bad = http(int(admin3[0].directives["admin_port"]), "GET", "/api/queues?all=yes")
        assert (bad.status, bad.json()["error"]) == (400, "all must be 1 or 0 (or true or false)")
        # one of them read through the API by its name, as any queue
        one = sorted(results)[0]
        port = int(admin3[2].directives["admin_port"])
        reply = http(port, "GET", "/api/queues/" + one)
        assert reply.status == 200 and reply.json()["len"] == 1
    finally:
        app.close()


def test_a_result_is_replicated_read_from_another_node_and_gone_after_its_result_ttl(admin3, run_worker):
    q = "t-" + uuid.uuid4().hex[:8]
    here, there, third = (App(addr(n), result_ttl=60) for n in admin3)
    try:

        @here.task(queue=q, retries=0)
        def add(a, b):
            return a + b

        run_worker(here)
        ref = add.send_with(args=(1, 2), result_ttl=2)
        assert ref.result(timeout=10) == 3
        ((_, result_id, _),) = raw(admin3[0]).execute_command("QPEEK", ref.result_queue, 1)
        holders = [n for n in admin3 if raw(n).execute_command("SHOW", result_id) is not None]
        assert len(holders) >= 2, "the result job has copies on other nodes"
        assert TaskRef.for_job(there, ref.id).result(timeout=10) == 3  # from another node
        # its TTL (2 s) ends: every copy is gone, on every node, and a waiter times out
        wait_for(lambda: all(raw(n).execute_command("SHOW", result_id) is None for n in admin3), timeout=20,
                 what="the result's copies gone after its TTL")  # fmt: skip
        assert all(raw(n).execute_command("QLEN", ref.result_queue) == 0 for n in admin3)
        with pytest.raises(ResultTimeout, match="no result for task"):
            TaskRef.for_job(third, ref.id).result(timeout=1.5)
    finally:
        for app in (here, there, third):
            app.close()


def test_a_periodic_task_keeps_no_result_unless_its_declaration_asks(node, run_worker):
    q = "p-" + uuid.uuid4().hex[:8]
    app = App(addr(node), result_ttl=600)
    ran: dict[str, list[str]] = {"quiet": [], "kept": []}

    @app.periodic(every=1, queue=q, name=q + ".quiet")
    def quiet():
        ran["quiet"].append(current_task().job_id)

    @app.periodic(every=1, queue=q, name=q + ".kept", result_ttl=30)
    def kept():
        ran["kept"].append(current_task().job_id)
        return "kept"

    r = raw(node)
    run_worker(app, concurrency=2)
    _, stop = start_scheduler(app)
    try:
        wait_for(lambda: len(ran["quiet"]) >= 3 and len(ran["kept"]) >= 3, timeout=15, what="three runs of each")
    finally:
        stop.set()
    runs = {name: list(ids) for name, ids in ran.items()}
    # each run is over (its result, if any, written before its job's ACK: the job is gone)
    wait_for(lambda: all(r.execute_command("SHOW", i) is None for ids in runs.values() for i in ids),
             what="every run acknowledged")  # fmt: skip
    queues = qscan(node, "ALL")
    for job_id in runs["quiet"]:
        assert "@result:" + job_id not in queues and "result:" + job_id not in queues
    for job_id in runs["kept"]:
        assert r.execute_command("QLEN", "@result:" + job_id) == 1
    # sent by hand, the same task keeps its result as any task (the app's result_ttl)
    assert quiet.send().result(timeout=10) is None


def write_old(node, job_id: str, body: bytes = OK_3) -> None:
    """A result as a worker of the earlier layout wrote it: in ``result:<job ID>``."""
    raw(node).execute_command("ADDJOB", "result:" + job_id, body, 0, "TTL", 60, "RETRY", 15, "DEDUP", "result")


def take(node, queue: str) -> str:
    """Take the task's job by hand (so that no worker of this layout runs it)."""
    ((_, job_id, _),) = raw(node).execute_command("GETJOB", "TIMEOUT", 5000, "FROM", queue)
    return job_id.decode()


def test_a_result_an_older_worker_wrote_under_the_old_name_is_found(cluster3):
    q = "t-" + uuid.uuid4().hex[:8]
    here, there = App(addr(cluster3[0]), result_ttl=60), App(addr(cluster3[1]), result_ttl=60)
    try:

        @here.task(queue=q, retries=0)
        def add(a, b):
            return a + b

        # written before anyone waits: the first look reads both names
        ref = add.send(1, 2)
        write_old(cluster3[0], take(cluster3[0], q))
        assert ref.done() and ref.result(timeout=0) == 3
        # from another node, where it is not queued: found by the look around the cluster
        assert TaskRef.for_job(there, ref.id).result(timeout=10) == 3
        assert raw(cluster3[0]).execute_command("QLEN", "result:" + ref.id) == 1  # read, never taken
        # written while a waiter waits
        late = add.send(1, 2)
        job_id = take(cluster3[0], q)
        threading.Timer(0.3, write_old, (cluster3[0], job_id)).start()
        assert late.result(timeout=10) == 3
        # in a group, beside a result under the new name (written by hand too)
        refs = [add.send(1, 2), add.send(1, 2)]
        old_id, new_id = take(cluster3[0], q), take(cluster3[0], q)
        write_old(cluster3[2], old_id, b'{"v":1,"ok":false,"error":{"type":"KeyError","message":"old"}}')
        raw(cluster3[0]).execute_command("ADDJOB", "@result:" + new_id, b'{"v":1,"ok":true,"value":7}', 0)
        group = GroupRef([TaskRef.for_job(here, old_id), TaskRef.for_job(here, new_id)])
        got = group.results(timeout=10, return_exceptions=True)
        assert str(got[0]) == "KeyError: old" and got[1] == 7
        assert {r.id for r in refs} == {old_id, new_id}
        # the waiter never made a plain queue of the old name where it waited
        assert "result:" + late.id not in qscan(cluster3[1]) | qscan(cluster3[2])
    finally:
        here.close()
        there.close()
