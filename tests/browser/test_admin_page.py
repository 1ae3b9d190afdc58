"""The admin page at ``/`` driven in headless Chromium against real nodes: the cluster map, live
queue rates, pausing from the page, the job inspector's actions and the error banner.

Every wait is playwright's ``expect`` (or ``wait_for``) with a deadline; the cluster is shared
by the module, so each test works on queues of its own.
"""

from __future__ import annotations

import re
import threading

import pytest
import redis

from .conftest import admin_node, join, node_id, stop_all
from tests.integration.conftest import wait_for

try:
    from playwright.sync_api import Error as PlaywrightError, expect
except ImportError:  # pragma: no cover - the fixtures skip first
    PlaywrightError = Exception
    expect = None

pytestmark = [pytest.mark.integration, pytest.mark.xdist_group("browser")]

POSITIVE = re.compile(r"^(0\.\d*[1-9]|[1-9])")  # a data-rate-* attribute above zero


def qstat(r: redis.Redis, queue: str) -> dict[bytes, object]:
    flat = r.execute_command("QSTAT", queue)
    return dict(zip(flat[::2], flat[1::2])) if flat else {}


def confirm(page) -> None:
    dialog = page.get_by_test_id("confirm-dialog")
    expect(dialog).to_be_visible()
    page.get_by_test_id("confirm-ok").click()
    expect(dialog).to_be_hidden()


def test_the_page_shows_every_node_of_the_cluster(cluster, open_page):
    page = open_page(cluster[0])
    expect(page).to_have_title("Disque admin")
    headers = page.context.request.get(page.url).headers
    assert "frame-ancestors 'none'" in headers["content-security-policy"]  # actions cannot be clickjacked
    rows = page.get_by_test_id("node-row")
    expect(rows).to_have_count(3)
    for n in cluster:
        row = page.locator('[data-testid=node-row][data-node-id="%s"]' % node_id(n))
        expect(row).to_have_attribute("data-reachable", "yes")
        expect(row).to_contain_text("127.0.0.1:%d" % n.port)
        expect(row).to_contain_text("connected")
    me = page.locator('[data-testid=node-row][data-node-id="%s"]' % node_id(cluster[0]))
    expect(me).to_contain_text("myself")
    # two memories, each labelled: INFO used_memory (the estimate maxmemory is checked against, a few
    # KiB for these nodes) and used_memory_rss (the process: tens of MiB for the interpreter alone)
    expect(page.get_by_test_id("memory-data-header")).to_have_text("data (estimate)")
    expect(page.get_by_test_id("memory-rss-header")).to_have_text("RSS")
    expect(page.get_by_test_id("memory-data-header")).to_have_attribute("title", re.compile("INFO used_memory:.*maxmemory"))
    expect(page.get_by_test_id("memory-rss-header")).to_have_attribute("title", re.compile("INFO used_memory_rss:"))
    expect(me.get_by_test_id("node-memory-data")).to_have_text(re.compile(r"^\d+(\.\d)? (B|KiB|MiB)$"))
    expect(me.get_by_test_id("node-memory-rss")).to_have_text(re.compile(r"^\d+\.\d (MiB|GiB)$"))
    expect(page.get_by_test_id("conn-status")).to_have_attribute("data-state", "connected")
    expect(page.get_by_test_id("error-banner")).to_be_hidden()


def test_a_filled_queue_shows_its_length_and_a_moving_rate(cluster, open_page):
    stop = threading.Event()
    added = []

    def produce() -> None:
        r = cluster[1].client()
        while not stop.is_set():
            added.append(r.execute_command("ADDJOB", "rates", "tick", 0, "REPLICATE", 2))
            stop.wait(0.02)

    producer = threading.Thread(target=produce, daemon=True)
    producer.start()
    try:
        page = open_page(cluster[0])
        row = page.locator('[data-testid=queue-row][data-queue="rates"]')
        expect(row).to_be_visible()
        expect(row).to_have_attribute("data-rate-in", POSITIVE)
        expect(row.get_by_test_id("queue-len")).to_have_text(re.compile(r"^[1-9][\d,]*$"))
        expect(row.get_by_test_id("queue-rate-in")).to_have_text(re.compile(r"^(0\.\d*[1-9]|[1-9])"))
        expect(row.get_by_test_id("queue-spark").locator("polyline.spark-in")).to_have_count(1)
        # the filter box hides the other queues and keeps this one
        cluster[0].client().execute_command("ADDJOB", "other-queue", "x", 0, "REPLICATE", 1)
        expect(page.locator('[data-testid=queue-row][data-queue="other-queue"]')).to_be_visible()
        page.get_by_test_id("queue-filter").fill("rat")
        expect(page.locator('[data-testid=queue-row][data-queue="other-queue"]')).to_have_count(0)
        expect(row).to_be_visible()
    finally:
        stop.set()
        producer.join(10)
    assert added  # the producer did run


def test_pausing_from_the_page_stops_consumers_and_unpausing_lets_them_go_on(cluster, open_page):
    r0 = cluster[0].client()
    for i in range(3):
        r0.execute_command("ADDJOB", "paused-q", "job %d" % i, 0, "REPLICATE", 1)
    page = open_page(cluster[0])
    row = page.locator('[data-testid=queue-row][data-queue="paused-q"]')
    expect(row).to_have_attribute("data-paused", "none")

    # cancelling the confirmation changes nothing
    row.get_by_test_id("queue-pause").click()
    expect(page.get_by_test_id("confirm-message")).to_contain_text("paused-q")
    page.get_by_test_id("confirm-cancel").click()
    expect(page.get_by_test_id("confirm-dialog")).to_be_hidden()
    assert qstat(r0, "paused-q")[b"pause"] == b"none"

    row.get_by_test_id("queue-pause-mode").select_option("all")
    row.get_by_test_id("queue-pause").click()
    confirm(page)
    expect(row).to_have_attribute("data-paused", "all")
    expect(row.get_by_test_id("queue-paused")).to_have_text("all")
    for n in cluster:  # PAUSE ... BCAST reaches every node
        wait_for(lambda: qstat(n.client(), "paused-q").get(b"pause") == b"all", timeout=10, what="the pause on %d" % n.port)
    assert r0.execute_command("GETJOB", "NOHANG", "FROM", "paused-q") is None

    row.get_by_test_id("queue-unpause").click()
    confirm(page)
    expect(row).to_have_attribute("data-paused", "none")
    assert qstat(r0, "paused-q")[b"pause"] == b"none"
    got = r0.execute_command("GETJOB", "NOHANG", "FROM", "paused-q")
    assert got and got[0][0] == b"paused-q"


def test_the_job_inspector_shows_a_job_safely_and_acknowledges_it(cluster, open_page):
    r0 = cluster[0].client()
    body = '<img src=x onerror="document.title=\'owned\'"><b>bold</b> & "quotes"'
    job_id = r0.execute_command("ADDJOB", "inspect-q", body, 0, "REPLICATE", 2).decode()
    page = open_page(cluster[0])
    page.get_by_test_id("job-id").fill(job_id)
    page.get_by_test_id("job-lookup").click()
    expect(page.get_by_test_id("job-view")).to_be_visible()
    expect(page.get_by_test_id("job-field-id")).to_have_text(job_id)
    expect(page.get_by_test_id("job-field-queue")).to_have_text("inspect-q")
    expect(page.get_by_test_id("job-field-state")).to_have_text("queued")
    expect(page.get_by_test_id("job-field-body")).to_have_text(body)  # as text, not as markup
    expect(page.get_by_test_id("job-view").locator("img, b")).to_have_count(0)
    expect(page).to_have_title("Disque admin")

    # dequeue, cancelled: the job stays queued
    page.get_by_test_id("job-dequeue").click()
    expect(page.get_by_test_id("confirm-message")).to_contain_text(job_id)
    page.get_by_test_id("confirm-cancel").click()
    assert r0.execute_command("QLEN", "inspect-q") == 1

    page.get_by_test_id("job-ack").click()
    confirm(page)
    result = page.get_by_test_id("job-result")
    expect(result).to_have_attribute("data-result", "1")
    expect(result).to_contain_text("ack")

    def acked_or_gone() -> bool:
        show = r0.execute_command("SHOW", job_id)
        return show is None or dict(zip(show[::2], show[1::2]))[b"state"] == b"acked"

    wait_for(acked_or_gone, timeout=10, what="the job acknowledged")
    expect(page.get_by_test_id("error-banner")).to_be_hidden()


def test_a_queue_s_first_jobs_open_in_the_job_inspector(cluster, open_page):
    r2 = cluster[2].client()
    job_id = r2.execute_command("ADDJOB", "detail-q", "first body", 0, "REPLICATE", 1).decode()
    page = open_page(cluster[0])
    page.locator('[data-testid=queue-row][data-queue="detail-q"]').get_by_test_id("queue-name").click()
    detail = page.get_by_test_id("queue-detail")
    expect(detail).to_be_visible()
    expect(detail).to_contain_text("first body")
    detail.get_by_test_id("queue-job").filter(has_text=job_id).click()
    expect(page.get_by_test_id("job-id")).to_have_value(job_id)
    expect(page.get_by_test_id("job-field-body")).to_have_text("first body")
    expect(page.get_by_test_id("job-field-node")).to_have_text(node_id(cluster[2])[:8])  # found on its node
    # dequeue, confirmed: out of its queue, still known
    page.get_by_test_id("job-dequeue").click()
    confirm(page)
    expect(page.get_by_test_id("job-result")).to_have_attribute("data-result", "1")
    expect(page.get_by_test_id("job-field-state")).to_have_text("active")
    assert r2.execute_command("QLEN", "detail-q") == 0


def test_the_clusters_own_queues_show_only_when_asked(cluster, open_page):
    # a task's result lives in a queue whose name starts with @ (one on each of two nodes here)
    cluster[0].client().execute_command("ADDJOB", "@result:page-own", '{"v":1,"ok":true,"value":1}', 0, "REPLICATE", 1)
    cluster[2].client().execute_command("ADDJOB", "@result:page-peer", '{"v":1,"ok":true,"value":2}', 0, "REPLICATE", 1)
    cluster[2].client().execute_command("ADDJOB", "page-plain", "x", 0, "REPLICATE", 1)
    page = open_page(cluster[0])
    own = page.locator('[data-testid=queue-row][data-queue^="@"]')
    expect(page.locator('[data-testid=queue-row][data-queue="page-plain"]')).to_have_count(1)
    expect(own).to_have_count(0)
    toggle = page.get_by_test_id("queue-all")
    expect(toggle).not_to_be_checked()
    toggle.check()
    expect(page.locator('[data-testid=queue-row][data-queue="@result:page-own"]')).to_have_count(1)
    expect(page.locator('[data-testid=queue-row][data-queue="@result:page-peer"]')).to_have_count(1)
    toggle.uncheck()
    expect(own).to_have_count(0)
    expect(page.locator('[data-testid=queue-row][data-queue="page-plain"]')).to_have_count(1)


def test_a_body_that_is_not_utf8_shows_as_base64(cluster, open_page):
    job_id = cluster[0].client().execute_command("ADDJOB", "binary-q", b"\xff\xfe\x00<", 0, "REPLICATE", 1).decode()
    page = open_page(cluster[0])
    page.get_by_test_id("job-id").fill(job_id)
    page.get_by_test_id("job-id").press("Enter")
    expect(page.get_by_test_id("job-field-body")).to_have_text("//4APA==")
    expect(page.locator('#job-body tr[data-field="body"] th')).to_contain_text("base64")


def test_api_errors_show_in_the_banner(cluster, open_page):
    page = open_page(cluster[0])
    expect(page.get_by_test_id("node-row")).to_have_count(3)
    banner = page.get_by_test_id("error-banner")
    expect(banner).to_be_hidden()
    page.get_by_test_id("job-id").fill("not-a-job-id")
    page.get_by_test_id("job-lookup").click()
    expect(banner).to_be_visible()
    expect(banner).to_contain_text("400")
    page.get_by_test_id("error-dismiss").click()
    expect(banner).to_be_hidden()
    # a well-formed ID that no node knows: 404, in the banner too
    unknown = "D-%s-AAAAAAAAAAAAAAAAAAAAAAAA-0001" % node_id(cluster[0])[:8]
    page.get_by_test_id("job-id").fill(unknown)
    page.get_by_test_id("job-lookup").click()
    expect(banner).to_contain_text("404")
    expect(page.get_by_test_id("job-view")).to_be_hidden()


def test_an_unreachable_node_and_an_unreachable_page_node_show_as_such(tmp_path, open_page):
    nodes = [admin_node(tmp_path), admin_node(tmp_path)]
    try:
        join(nodes)
        page = open_page(nodes[0])
        other = page.locator('[data-testid=node-row][data-node-id="%s"]' % node_id(nodes[1]))
        expect(other).to_have_attribute("data-reachable", "yes")
        nodes[1].stop()
        expect(other).to_have_attribute("data-reachable", "no", timeout=20_000)
        expect(other).to_contain_text("unreachable")
        nodes[0].stop()  # now the node serving the page itself is gone
        expect(page.get_by_test_id("conn-status")).to_have_attribute("data-state", "unreachable")
        expect(page.get_by_test_id("error-banner")).to_contain_text("cannot be reached")
    finally:
        stop_all(nodes)


def test_with_a_password_the_page_needs_the_credentials(tmp_path, open_page):
    node = admin_node(tmp_path, requirepass="s3cret")
    try:
        for wrong in (None, {"username": "admin", "password": "wrong"}):  # the page itself is refused
            try:
                page = open_page(node, wrong)
            except PlaywrightError as exc:  # Chromium gives up on the challenge: a failed navigation
                assert "INVALID_AUTH_CREDENTIALS" in str(exc)
            else:  # or it shows the 401 answer
                expect(page.locator("body")).to_contain_text("authentication required")
                expect(page.get_by_test_id("nodes-table")).to_have_count(0)
        page = open_page(node, {"username": "admin", "password": "s3cret"})
        expect(page.get_by_test_id("node-row")).to_have_count(1)
        expect(page.get_by_test_id("conn-status")).to_have_attribute("data-state", "connected")
    finally:
        stop_all([node])
