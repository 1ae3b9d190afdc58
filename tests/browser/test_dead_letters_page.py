"""The admin page's dead-letter view in headless Chromium against real nodes: the dead-letter
queues with their counts, a queue's jobs (original queue, deliveries, reason), requeueing one
job to its original queue, and purging the rest after the confirmation."""

from __future__ import annotations

import pytest

from tests.integration.conftest import wait_for

from .test_admin_page import confirm

try:
    from playwright.sync_api import expect
except ImportError:  # pragma: no cover - the fixtures skip first
    expect = None

pytestmark = [pytest.mark.integration, pytest.mark.xdist_group("browser")]


def dead_letter(c, queue: str, body: str, reason: str) -> str:
    job_id = c.execute_command("ADDJOB", queue, body, 0, "RETRY", 1, "MAXDELIVER", 1).decode()
    assert c.execute_command("GETJOB", "NOHANG", "FROM", queue)[0][1].decode() == job_id
    assert c.execute_command("NACK", job_id, "REASON", reason) == 1
    return job_id


def test_the_dead_letter_view_lists_requeues_and_purges(cluster, open_page):
    a, b, _ = cluster
    for i in range(3):
        dead_letter(b.client(), "pay", "charge-%d" % i, "card declined")
    page = open_page(a)

    row = page.locator('[data-testid=dead-row][data-queue="pay.dead"]')
    expect(row.get_by_test_id("dead-jobs")).to_have_text("3")
    expect(row.get_by_test_id("dead-from")).to_have_text("pay (3)")

    row.get_by_test_id("dead-name").click()
    detail = page.get_by_test_id("dead-detail")
    jobs = detail.get_by_test_id("dead-job")
    expect(jobs).to_have_count(3)
    expect(jobs.first.get_by_test_id("dead-job-origin")).to_have_text("pay")
    expect(jobs.first.get_by_test_id("dead-job-deliveries")).to_have_text("1")
    expect(jobs.first.get_by_test_id("dead-job-reason")).to_have_text("card declined")

    # requeue one: cancel first changes nothing, then confirm
    jobs.first.get_by_test_id("dead-job-requeue").click()
    page.get_by_test_id("confirm-cancel").click()
    expect(page.get_by_test_id("confirm-dialog")).to_be_hidden()
    expect(jobs).to_have_count(3)
    jobs.first.get_by_test_id("dead-job-requeue").click()
    confirm(page)
    expect(page.get_by_test_id("dead-result")).to_have_attribute("data-done", "1")
    expect(jobs).to_have_count(2)
    expect(row.get_by_test_id("dead-jobs")).to_have_text("2")
    assert wait_for(lambda: sum(n.client().execute_command("QLEN", "pay") for n in cluster) == 1,
                    what="the job back in pay")  # fmt: skip

    # purge all
    row.get_by_test_id("dead-purge-all").click()
    confirm(page)
    expect(page.get_by_test_id("dead-result")).to_have_attribute("data-done", "2")
    # the acks reach the other holders within milliseconds, the view's next refresh (every 5 s)
    # shows it: a busy machine may need the one after
    expect(row).to_have_count(0, timeout=15_000)
    expect(detail.get_by_test_id("dead-detail-empty")).to_be_visible(timeout=15_000)
    assert sum(n.client().execute_command("QLEN", "pay.dead") for n in cluster) == 0
