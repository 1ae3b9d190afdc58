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


def test_a_dead_letters_traceback_unfolds_as_text_and_stays_unfolded(cluster, open_page):
    from tests.tasks.tracing import ERROR_LINE, FAILING_LINE, fail_for_good, failing_app

    a = cluster[0]
    f = failing_app("127.0.0.1:%d" % a.port)
    try:
        _, err = fail_for_good(f)  # a task failing at a known line until its retries are spent
    finally:
        f.app.close()
    page = open_page(a)
    row = page.locator('[data-testid=dead-row][data-queue="%s.dead"]' % f.queue)
    row.get_by_test_id("dead-name").click()
    detail = page.get_by_test_id("dead-detail")
    expect(detail.get_by_test_id("dead-job")).to_have_count(1)
    expect(detail.get_by_test_id("dead-job-reason")).to_have_text(ERROR_LINE)
    trace = detail.get_by_test_id("dead-job-trace")
    text = trace.get_by_test_id("dead-job-trace-text")
    expect(text).to_be_hidden()  # folded: a line per dead letter until asked
    trace.locator("summary").click()
    expect(text).to_be_visible()
    assert text.text_content() == err.traceback and FAILING_LINE in err.traceback
    # a refresh draws the view anew: what was unfolded stays so
    before = text.element_handle()
    page.get_by_test_id("dead-refresh").click()
    page.wait_for_function("node => !node.isConnected", arg=before)
    expect(text).to_be_visible()
    assert text.text_content() == err.traceback


def test_a_traceback_that_looks_like_html_is_shown_as_text(cluster, open_page):
    c = cluster[1].client()
    trace = 'Traceback:\n<img src=x onerror="document.title=\'owned\'"><b>bold</b> & "quotes"\nKeyError: \'<i>\'\n'
    job_id = c.execute_command("ADDJOB", "html-trace", "x", 0, "RETRY", 1, "MAXDELIVER", 1).decode()
    assert c.execute_command("GETJOB", "NOHANG", "FROM", "html-trace")[0][1].decode() == job_id
    assert c.execute_command("NACK", job_id, "REASON", "<b>no</b>", "TRACE", trace) == 1
    page = open_page(cluster[0])
    page.locator('[data-testid=dead-row][data-queue="html-trace.dead"]').get_by_test_id("dead-name").click()
    detail = page.get_by_test_id("dead-detail")
    detail.get_by_test_id("dead-job-trace").locator("summary").click()
    text = detail.get_by_test_id("dead-job-trace-text")
    expect(text).to_be_visible()
    assert text.text_content() == trace
    expect(detail.get_by_test_id("dead-job-reason")).to_have_text("<b>no</b>")
    expect(detail.locator("img, b, i")).to_have_count(0)
    expect(page).to_have_title("Disque admin")
