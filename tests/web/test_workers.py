"""Workers on the admin port: /metrics' gauges of the workers a node hears from (WORKER BEAT)."""

from __future__ import annotations

import pytest

from tests.integration.conftest import wait_for

from .test_metrics import scrape, value

pytestmark = pytest.mark.integration


def test_the_gauges_count_the_live_workers_and_their_jobs(admin_node):
    c = admin_node.client()
    running = '{"running": [{"id": "D-1", "queue": "q"}, {"id": "D-2", "queue": "q"}]}'
    assert c.execute_command("WORKER", "BEAT", "a:1:x", 100, running) == b"OK"
    assert c.execute_command("WORKER", "BEAT", "b:2:x", 60000, "{}") == b"OK"
    fams = scrape(admin_node)
    assert (value(fams, "disque_workers"), value(fams, "disque_worker_jobs_running")) == (2, 2)
    assert c.info("clients")["connected_workers"] == 2
    # a: silent for 3 x 100 ms, gone (the cron's second, or the next read)
    wait_for(lambda: value(scrape(admin_node), "disque_workers") == 1, what="a gone")
    assert value(scrape(admin_node), "disque_worker_jobs_running") == 0
    assert c.execute_command("WORKER", "FORGET", "b:2:x") == 1
    assert value(scrape(admin_node), "disque_workers") == 0 and c.info("clients")["connected_workers"] == 0
