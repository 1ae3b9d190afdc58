"""The admin page's stream consumers in headless Chromium against real nodes: a consumer named as
a Spark query's connections are (client/consumers.py) shown with its queues' backlog and the age
of their oldest job, the backlog growing as a producer outpaces it and gone once it is consumed;
a caller without the admin right is told why the view is empty."""

from __future__ import annotations

import pytest

from disque_py.client import Client
from disque_py.client import consumers as cs

from tests.integration.conftest import stop_all

from .conftest import admin_node

try:
    from playwright.sync_api import expect
except ImportError:  # pragma: no cover - the fixtures skip first
    expect = None

pytestmark = [pytest.mark.integration, pytest.mark.xdist_group("browser")]


def test_the_consumers_view_shows_each_consumer_and_its_lag(cluster, open_page):
    a, b, _ = cluster
    page = open_page(a)
    expect(page.get_by_test_id("consumers-empty")).to_be_visible()
    queue = "page-stream-q"
    where = "%s:%d" % (b.host, b.port)
    reader = Client(where, refresh_interval=None, client_name=cs.client_name("etl-page", [queue]))
    producer = Client(where, refresh_interval=None)
    try:
        reader.ping()
        producer.add_jobs(queue, [b"x"] * 4, replicate=1, retry=30)
        row = page.locator('[data-testid=consumer-row][data-consumer="etl-page"]')
        expect(row.get_by_test_id("consumer-queued")).to_have_text("4", timeout=20_000)  # asked every 5 ticks
        expect(page.get_by_test_id("consumers-empty")).to_be_hidden()
        expect(row.get_by_test_id("consumer-oldest")).not_to_have_text("–")

        producer.add_jobs(queue, [b"x"] * 6, replicate=1, retry=30)
        expect(row.get_by_test_id("consumer-queued")).to_have_text("10", timeout=20_000)

        jobs = reader.get_jobs(queue, count=100, nohang=True)
        reader.ack(*[j.id for j in jobs])
        expect(row.get_by_test_id("consumer-queued")).to_have_text("0", timeout=20_000)
        expect(row.get_by_test_id("consumer-oldest")).to_have_text("–")

        reader.close()
        expect(row).to_have_count(0, timeout=20_000)
        expect(page.get_by_test_id("consumers-empty")).to_be_visible()
    finally:
        reader.close()
        producer.close()


def test_a_caller_without_the_admin_right_is_told_why(tmp_path, open_page):
    conf = tmp_path / "users.conf"
    conf.write_text("requirepass defpw\nuser viewer on >vpw allkeys +@consume +@inspect\n")
    node = admin_node(tmp_path, config_file=str(conf))
    try:
        page = open_page(node, {"username": "viewer", "password": "vpw"})
        expect(page.get_by_test_id("consumers-empty")).to_contain_text("needs the admin right")
        expect(page.get_by_test_id("node-row")).to_have_count(1)  # the rest of the page is there
        assert "/api/consumers" not in page.get_by_test_id("error-list").inner_text()  # not in the banner
    finally:
        stop_all([node])
