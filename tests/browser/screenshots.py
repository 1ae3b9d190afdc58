"""Screenshots of the admin page for the docs, taken from a real small cluster.

    python -m tests.browser.screenshots [--out docs/img] [--seconds 20]

Starts three nodes with their admin port on, feeds a few queues (producers, and consumers
that fetch and acknowledge), pauses one queue, lets the page sample the rates for a while and
saves ``admin-page.png`` (the whole page) and ``admin-job-inspector.png`` (the job inspector
showing one job) in ``--out``. Uses Debian's Chromium, as the browser tests do.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import threading
import time
from pathlib import Path

from playwright.sync_api import expect, sync_playwright

from .conftest import CHROMIUM, CHROMIUM_ARGS, admin_node, join, stop_all

ROOT = Path(__file__).resolve().parents[2]

#: queue -> (jobs added a second, jobs consumed a second)
WORKLOAD = {"orders": (40, 30), "emails": (12, 12), "thumbnails": (6, 0), "reports": (2, 3)}


def _feed(nodes, queue: str, per_second: float, stop: threading.Event, node_index: int) -> None:
    r = nodes[node_index % len(nodes)].client()
    n = 0
    start = time.monotonic()
    while not stop.is_set():
        n += 1
        body = json.dumps({"queue": queue, "seq": n, "at": round(time.time(), 3)})
        r.execute_command("ADDJOB", queue, body, 0, "REPLICATE", 2, "RETRY", 60)
        stop.wait(max(0.0, start + n / per_second - time.monotonic()))


def _consume(nodes, queue: str, per_second: float, stop: threading.Event, node_index: int) -> None:
    r = nodes[node_index % len(nodes)].client()
    n = 0
    start = time.monotonic()
    while not stop.is_set():
        got = r.execute_command("GETJOB", "TIMEOUT", 200, "FROM", queue)
        for _, job_id, _ in got or []:
            r.execute_command("ACKJOB", job_id)
            n += 1
        stop.wait(max(0.0, start + n / per_second - time.monotonic()))


def take(out: Path, seconds: float) -> list[Path]:
    out.mkdir(parents=True, exist_ok=True)
    stop = threading.Event()
    threads: list[threading.Thread] = []
    with tempfile.TemporaryDirectory(prefix="disque-shots-") as tmp:
        nodes = []
        try:
            for _ in range(3):
                nodes.append(admin_node(Path(tmp)))
            join(nodes)
            # a backlog so that lengths differ, then the live traffic
            r = nodes[0].client()
            for i in range(150):
                r.execute_command("ADDJOB", "thumbnails", json.dumps({"image": "img-%04d.jpg" % i, "size": [320, 240]}), 0, "REPLICATE", 2)
            for i in range(8):
                r.execute_command("ADDJOB", "invoices.eu", json.dumps({"invoice": 9000 + i}), 0, "REPLICATE", 2)
            r.execute_command("PAUSE", "invoices.eu", "out", "BCAST")
            for k, (queue, (rate_in, rate_out)) in enumerate(WORKLOAD.items()):
                threads.append(threading.Thread(target=_feed, args=(nodes, queue, rate_in, stop, k), daemon=True))
                if rate_out:
                    threads.append(threading.Thread(target=_consume, args=(nodes, queue, rate_out, stop, k + 1), daemon=True))
            for t in threads:
                t.start()
            job_id = r.execute_command(
                "ADDJOB", "payments", json.dumps({"payment": "p-20391", "amount": "149.90", "currency": "EUR",
                                                  "customer": {"id": 5521, "email": "ana@example.com"}}, indent=2),
                0, "REPLICATE", 3, "RETRY", 120, "TTL", 86400,
            ).decode()  # fmt: skip
            with sync_playwright() as pw:
                browser = pw.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
                page = browser.new_page(viewport={"width": 1280, "height": 820}, device_scale_factor=1)
                page.goto("http://%s:%d/" % (nodes[0].host, nodes[0].admin_port))
                expect(page.get_by_test_id("node-row")).to_have_count(3)
                expect(page.locator('[data-testid=queue-row][data-queue="orders"]')).to_be_visible()
                page.wait_for_timeout(seconds * 1000)  # the sparklines fill as the page samples
                page.get_by_test_id("job-id").fill(job_id)
                page.get_by_test_id("job-lookup").click()
                expect(page.get_by_test_id("job-view")).to_be_visible()
                page.mouse.move(1270, 5)  # no hover highlight in the shots
                full = out / "admin-page.png"
                page.screenshot(path=str(full), full_page=True)
                inspector = out / "admin-job-inspector.png"
                page.set_viewport_size({"width": 760, "height": 820})  # the inspector alone, without the blank right half
                page.locator("#jobs").screenshot(path=str(inspector))
                browser.close()
            return [full, inspector]
        finally:
            stop.set()
            for t in threads:
                t.join(5)
            stop_all(nodes)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", type=Path, default=ROOT / "docs" / "img")
    ap.add_argument("--seconds", type=float, default=20.0, help="how long the page samples before the shot")
    args = ap.parse_args(argv)
    for path in take(args.out, args.seconds):
        print("%s (%d KB)" % (path, path.stat().st_size // 1024))
    return 0


if __name__ == "__main__":
    sys.exit(main())
