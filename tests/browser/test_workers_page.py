"""The admin page's workers view in headless Chromium against real nodes and real worker processes:
each live worker with the job it runs now (its task's name for a task), a job opened in the
inspector from there, the counters after the jobs are done, and a worker gone once it stops."""

from __future__ import annotations

import pytest

from tests.integration.conftest import wait_for
from tests.integration.worker_procs import WorkerProcess, holders_module, release, started

try:
    from playwright.sync_api import expect
except ImportError:  # pragma: no cover - the fixtures skip first
    expect = None

pytestmark = [pytest.mark.integration, pytest.mark.xdist_group("browser")]


def addr(node) -> str:
    return "%s:%d" % (node.host, node.port)


def test_the_workers_view_shows_each_worker_and_what_it_runs(cluster, open_page, tmp_path, monkeypatch):
    a, b, _ = cluster
    directory, mod = holders_module(tmp_path, monkeypatch, addr(b))
    page = open_page(a)
    expect(page.get_by_test_id("workers-empty")).to_be_visible()  # no worker yet: said so
    procs = [WorkerProcess(directory, "holders:hold", "-q", "page-q", "-n", addr(b), "--beacon-interval", "0.3"),
             WorkerProcess(directory, "holders:app", "-n", addr(b), "--beacon-interval", "0.3")]  # fmt: skip
    try:
        job_id = b.client().execute_command("ADDJOB", "page-q", "x", 0).decode()
        ref = mod.crunch.send(3)
        wait_for(lambda: started(directory, job_id) and started(directory, ref.id), timeout=30, what="jobs started")

        rows = page.get_by_test_id("worker-row")
        expect(rows).to_have_count(2)
        expect(page.get_by_test_id("worker-count")).to_have_text("(2)")
        expect(page.get_by_test_id("workers-empty")).to_be_hidden()
        plain = page.locator('[data-testid=worker-row][data-worker-id^="%s"]' % ("%s:%d:" % (_host(), procs[0].pid)))
        tasks = page.locator('[data-testid=worker-row][data-worker-id^="%s"]' % ("%s:%d:" % (_host(), procs[1].pid)))
        plain_job = plain.locator('[data-testid=worker-job][data-job-id="%s"]' % job_id)
        expect(plain_job.get_by_test_id("worker-job-label")).to_have_text("holders:hold")  # a plain handler: its name
        task_job = tasks.locator('[data-testid=worker-job][data-job-id="%s"]' % ref.id)
        expect(task_job.get_by_test_id("worker-job-label")).to_have_text(mod.crunch.name)

        # the job opens in the inspector
        plain_job.get_by_role("button").click()
        expect(page.get_by_test_id("job-view")).to_be_visible()
        expect(page.get_by_test_id("job-id")).to_have_value(job_id)
        expect(page.locator('#job-body tr[data-field="queue"] td')).to_have_text("page-q")

        release(directory)
        expect(plain.get_by_test_id("worker-processed")).to_have_text("1")
        expect(tasks.get_by_test_id("worker-processed")).to_have_text("1")
        expect(plain.get_by_test_id("worker-running")).to_have_text("idle")

        procs[0].stop()
        expect(rows).to_have_count(1)
        expect(tasks).to_have_count(1)
    finally:
        for p in procs:
            p.close()


def _host() -> str:
    import socket

    return socket.gethostname()
