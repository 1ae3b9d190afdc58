"""Revoke, cancel, status and progress of sent tasks (tasks/control.py), on 3 real nodes with
real ``disque-py worker`` processes attached to another node than the one the caller uses."""

from __future__ import annotations

import copy
import os
import signal
import subprocess
import sys
import threading
import time

import pytest

from disque_py.client.sync import Client
from disque_py.core.ids import dead_letter_id, dedup_job_id
from disque_py.tasks import App, TaskError, TaskRef, TaskRevoked
from tests.client.conftest import ROOT, start_cluster, stop_all
from tests.integration.conftest import wait_for

from .conftest import addr, start_worker_process, stop_worker_process

APP = "tests.tasks.controlapp:app"


@pytest.fixture(scope="module")
def nodes(tmp_path_factory):
    started = start_cluster(tmp_path_factory.mktemp("control3"), 3, cluster_node_timeout=1000, loglevel="notice")
    yield started
    stop_all(started)


@pytest.fixture
def app(nodes, monkeypatch):
    from tests.tasks import controlapp

    monkeypatch.setattr(controlapp.app, "nodes", [addr(nodes[2])])
    yield controlapp.app
    controlapp.app.close()


def start_worker(node, log_path, *extra):
    return start_worker_process(APP, node, log_path, "--beacon-interval", "2", *extra, log_level="info")


def stop_worker(proc, log_path):
    stop_worker_process(proc, log_path)


@pytest.fixture
def worker(nodes, tmp_path):
    procs = []

    def start(*extra):
        log = tmp_path / ("w%d.log" % len(procs))
        proc = start_worker(nodes[0], log, *extra)
        procs.append((proc, log))
        return proc

    yield start
    for proc, log in procs:
        stop_worker(proc, log)


def fresh_app(nodes, node_index=1):
    """Another process's view: an app that knows no task, only the nodes."""
    return App(nodes=[addr(nodes[node_index])])


def dead_letter_of(nodes, job_id):
    """SHOW of the task's dead letter on any node, or None."""
    for n in nodes:
        with Client([addr(n)]) as one:
            shown = one.show(dead_letter_id(job_id.encode()).decode())
            if shown is not None:
                return shown
    return None


def test_revoke_a_hundred_delayed_tasks_from_a_process_that_knows_only_their_ids(nodes, app, worker):
    from tests.tasks.controlapp import quick

    worker("--queues", "ctl-quick")
    sent = time.monotonic()
    refs = [quick.send_with(args=(n,), delay=10) for n in range(100)]
    other = fresh_app(nodes, 1)  # knows no task: only the IDs
    errors: list = [None] * 100
    started = threading.Barrier(11)

    def wait(k):
        started.wait()
        for i in range(k, 100, 10):
            t0 = time.monotonic()
            try:
                refs[i].result(timeout=20)
                errors[i] = "ran"
            except TaskRevoked as exc:
                errors[i] = (exc, time.monotonic() - t0)

    waiters = [threading.Thread(target=wait, args=(k,)) for k in range(10)]
    for t in waiters:
        t.start()
    started.wait()
    time.sleep(0.3)  # the waiters block in their GETJOB
    t0 = time.monotonic()
    stood = [TaskRef.for_job(other, ref.id).revoke() for ref in refs]
    revoked_in = time.monotonic() - t0
    for t in waiters:
        t.join(20)
    woke = time.monotonic() - t0
    assert all(stood), [(i, refs[i].outcome(1)) for i, s in enumerate(stood) if not s][:3]
    assert all(isinstance(e, tuple) and isinstance(e[0], TaskRevoked) and e[0].type == "TaskRevoked" for e in errors), errors
    assert woke < revoked_in + 1.0, (woke, revoked_in)  # every waiter woke at once, not at its timeout
    assert time.monotonic() - sent < 10, "too slow to revoke before the delay ended"
    time.sleep(max(0.0, sent + 11 - time.monotonic()))  # past their delay: none runs
    for ref in refs[:10]:
        with pytest.raises(TaskRevoked, match="^TaskRevoked: task .* was (revoked|cancelled)"):
            ref.result(timeout=1)
        assert ref.status().state == "revoked"
    with Client([addr(n) for n in nodes]) as client:
        for n in nodes:
            with Client([addr(n)]) as one:
                assert all(one.show(ref.id) is None for ref in refs)
    other.close()


def test_a_revoked_dedup_key_makes_a_new_job_at_once_from_every_node(nodes, app, worker):
    from tests.tasks.controlapp import quick

    key = "once-%d" % time.monotonic_ns()
    first = quick.send_with(args=(1,), delay=30, dedup=key)
    others = [fresh_app(nodes, i) for i in range(3)]
    try:
        assert [quick_via(o).send_with(args=(9,), delay=30, dedup=key).id for o in others] == [first.id] * 3
        assert TaskRef.for_job(others[0], first.id).revoke()
        # at once, on every node: one new job (with an ID of its own), the same for every sender
        again = [quick_via(o).send_with(args=(2,), dedup=key).id for o in others]
        assert again[0] != first.id and again == [again[0]] * 3, (first.id, again)
        worker("--queues", "ctl-quick")
        assert TaskRef.for_job(app, again[0]).result(timeout=10) == 20
        with pytest.raises(TaskRevoked, match="^TaskRevoked: task .* was revoked"):
            first.result(timeout=1)
        assert first.status().state == "revoked"
        # a revoke of a task that ran stands not, and its key stays taken
        assert not TaskRef.for_job(others[1], again[0]).revoke()
        assert quick.send_with(args=(3,), dedup=key).id == again[0]
        # revoked again (this time before it runs): a third job
        third = quick.send_with(args=(4,), delay=30, dedup="%s-b" % key)
        assert third.revoke()
        fourth = quick_via(others[2]).send_with(args=(4,), dedup="%s-b" % key)
        assert fourth.id != third.id and fourth.result(timeout=10) == 40
        # a periodic slot's schedulers send the same slot: a revoked slot stays revoked
        slot = quick.send_with(args=(5,), delay=30, dedup="%s-slot" % key, meta={"periodic_slot": 1})
        assert slot.revoke()
        assert quick.send_with(args=(5,), delay=30, dedup="%s-slot" % key, meta={"periodic_slot": 1}).id == slot.id
    finally:
        for other in others:
            other.close()


def quick_via(other):
    """``quick`` sent through ``other`` (an app on another node)."""
    from tests.tasks.controlapp import quick

    task = copy.copy(quick)
    task.app = other
    return task


def test_status_at_each_stage(nodes, app, worker):
    from tests.tasks.controlapp import fails, long_async, quick

    delayed = quick.send_with(args=(1,), delay=30)
    st = delayed.status()
    assert st.state == "delayed" and st.until is not None and 25 < st.until - time.time() <= 31, st
    queued = quick.send(2)
    assert queued.status().state == "queued"
    failing = fails.send(3)
    running = long_async.send(30)
    worker("--queues", "ctl-quick,ctl-fail,ctl-async", "-c", "4")
    assert queued.result(timeout=20) == 20
    assert queued.status().state == "done"
    wait_for(lambda: running.status().state == "running" and running.status().worker, timeout=10)
    st = running.status()
    assert st.since and st.node and st.attempt == 1, st
    wait_for(lambda: failing.status().state == "retrying", timeout=10)
    st = failing.status()
    assert st.attempt == 1 and st.until is not None and 0 < st.until - time.time() <= 4.5, st
    with pytest.raises(TaskError, match="^ValueError: fails 3"):
        failing.result(timeout=20)
    wait_for(lambda: failing.status().state == "dead", timeout=10)
    assert "ValueError: fails 3" in failing.status().error
    # purge its dead letter: the error result says failed
    with Client([addr(n) for n in nodes]) as client:
        client.ack(dead_letter_id(failing.id.encode()).decode())
    wait_for(lambda: failing.status().state == "failed", timeout=10)
    assert running.cancel()
    assert running.status().state == "revoked"
    assert delayed.revoke() and delayed.status().state == "revoked"
    assert TaskRef.for_job(app, "D-00000000-000000000000000000000000-05a1").status().state == "unknown"


@pytest.mark.parametrize("task_name", ["long_async", "long_sync"])
def test_cancel_running_tasks_on_a_worker_of_another_node(nodes, app, worker, task_name):
    from tests.tasks import controlapp

    task = getattr(controlapp, task_name)
    worker("--queues", task.queue, "-c", "8")
    refs = [task.send(60) for _ in range(8)]
    for ref in refs:
        wait_for(lambda: ref.progress() is not None, timeout=20)  # running, and its progress seen
    other = fresh_app(nodes, 1)
    took = []
    for ref in refs:
        t0 = time.monotonic()
        assert TaskRef.for_job(other, ref.id).cancel()
        wait_for(lambda: ref.progress() is None and _not_running(other, ref.id), timeout=5)
        took.append(time.monotonic() - t0)
        with pytest.raises(TaskRevoked, match="^TaskRevoked: task .* was (revoked|cancelled)"):
            ref.result(timeout=1)
    took.sort()
    print("cancel -> stopped, %s: p50 %.3f s, max %.3f s" % (task_name, took[len(took) // 2], took[-1]))
    assert took[-1] < 3.0, took
    time.sleep(1.5)  # no retry, no dead letter
    for ref in refs:
        assert ref.status().state == "revoked"
        assert dead_letter_of(nodes, ref.id) is None
    other.close()


def _not_running(app, job_id):
    from disque_py.tasks.control import _everywhere, _running_on, _workers

    views, _ = _workers(_everywhere(app.client(), [("WORKER", "LIST")]), 0)
    return _running_on(views, job_id) is None


def test_cancel_of_a_task_not_running_yet_is_a_revoke(nodes, app, worker):
    from tests.tasks.controlapp import quick

    ref = quick.send_with(args=(5,), delay=2)
    assert ref.cancel()
    worker("--queues", "ctl-quick")
    time.sleep(3)
    with pytest.raises(TaskRevoked, match="^TaskRevoked: task .* was (revoked|cancelled)"):
        ref.result(timeout=1)


def test_progress_of_a_bound_task_seen_by_another_process(nodes, app, worker):
    from tests.tasks.controlapp import bound_progress

    worker("--queues", "ctl-bound")
    ref = bound_progress.send(25)
    other = TaskRef.for_job(fresh_app(nodes, 1), ref.id)
    seen = []
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline and len(seen) < 3:
        p = other.progress()
        if p is not None and (not seen or p != seen[-1]):
            seen.append(p)
        time.sleep(0.05)
    assert len(seen) >= 3 and all(p["total"] == 25 and p["note"] == "bound" for p in seen), seen
    assert [p["done"] for p in seen] == sorted(p["done"] for p in seen)
    st = other.status()
    assert st.state == "running" and st.progress and st.progress["total"] == 25
    out = subprocess.run([sys.executable, "-m", "disque_py.cli", "workers", "-n", addr(nodes[1])], cwd=str(ROOT),
                         capture_output=True, text=True, timeout=30)  # fmt: skip
    assert "/25 bound" in out.stdout, out.stdout + out.stderr
    assert ref.result(timeout=30) == 25


def test_a_revoked_job_never_runs_after_its_node_restarts_from_the_aof(tmp_path):
    from tests.integration.conftest import NodeProcess, stop_all

    node = NodeProcess(tmp_path, appendonly="yes", appendfsync="always").start()
    started = [node]
    app = App(nodes=[addr(node)], result_ttl=120)
    from tests.tasks import controlapp

    try:
        quick = app.task(name=controlapp.quick.name, queue="ctl-quick", retries=0)(controlapp.quick.fn)
        # a job loaded from the AOF waits its RETRY before it is queued again (Disque's rule): 2 s
        kept = quick.send_with(args=(1,), retry=2)  # the control: not revoked, it runs
        gone = [quick.send_with(args=(2,), delay=2, retry=2), quick.send_with(args=(3,), retry=2)]
        assert all(ref.revoke() for ref in gone)
        app.close()
        assert node.stop() in (0, None), node.log()[-3000:]
        again = NodeProcess(node.dir.parent, **{**node.directives, "port": node.port}).start()
        started.append(again)
        proc = subprocess.Popen(
            [sys.executable, "-m", "disque_py.cli", "worker", APP, "-n", addr(again), "--queues", "ctl-quick",
             "--fetch-timeout", "200", "--log-level", "warning"],
            cwd=str(ROOT), env=dict(os.environ, PYTHONPATH=str(ROOT)), stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )  # fmt: skip
        try:
            assert kept.result(timeout=30) == 10  # the worker runs what the AOF kept
            # the worker writes the result before it acknowledges the job: wait for the ack
            # (each SHOW read once: an acked job may be collected between two reads)
            seen: list = []

            def acked() -> bool:
                seen[:] = [app.client().show(kept.id)]
                return seen[0] is None or seen[0]["state"] == "acked"

            wait_for(acked, timeout=10, what="the kept job acknowledged")
            time.sleep(2.5)  # past the delay and the RETRY of any job that came back
            for ref in gone:
                assert app.client().show(ref.id) is None  # the ack was in the AOF: no job came back
                # the revoked result is kept too (loaded as active, it is queued again after its RETRY)
                result = app.client().show(dedup_job_id(ref.result_queue.encode(), b"result", 1).decode())
                assert result is not None and b"TaskRevoked" in result["body"], result
        finally:
            proc.send_signal(signal.SIGTERM)
            proc.wait(20)
    finally:
        app.close()
        stop_all(started)
