"""What the admin HTTP port costs the client path, and how long a scrape of a big node takes.

    scripts/bench admin                    both parts (about 6 minutes)
    scripts/bench admin --quick            small n, one round
    scripts/bench admin --only scrape      only the scrape of a node with --queues queues
    scripts/bench admin --rounds 3         more alternations

Method
------
**Client path.** One disque-py node at a time, pinned to CPU 0, in three modes:

* ``off``: no ``admin-port``;
* ``idle``: ``admin-port`` set, nothing reads it;
* ``watched``: ``admin-port`` set, a Prometheus-style scraper GETs ``/metrics``
  every second and the admin page is open in headless Chromium (Debian's
  ``/usr/bin/chromium``, driven by playwright; it polls the JSON API every
  second, as a person watching it would). Without Chromium, a poller that GETs
  the page's API calls (``/api/cluster``, ``/api/queues``) every second stands
  in, and the report says so.

``redis-benchmark`` (50 clients) sends ``ADDJOB q <100-byte body> 0``,
unpipelined and with ``-P 32``; the scraper, the browser and the load run on
CPU 1. Each cell runs ``--rounds`` times with the modes in alternating order
(off, idle, watched, then the reverse), every run on an empty node; the
median is shown, and the loss of each mode against ``off`` from the same run.
Beside the throughput, the node's own CPU time per ADDJOB (from
``/proc/PID/stat`` around the run): the browser and the scraper share CPU 1
with the load generator, so the throughput of ``watched`` also measures the
load generator's share of that CPU, while the node's CPU per job measures
only what watching costs the node.

**Scrape.** One node with ``--queues`` queues (default 100,000; one job each,
added by pipelined ADDJOBs), then ``/metrics`` is read ``--scrapes`` times
(default 20) over one kept-alive HTTP connection; the wall time of each GET is
taken at the client. Prints the median, the 90th percentile and the maximum,
the size of the answer and the number of series, and the same for
``/api/queues`` (the page's default limit).

Prints Markdown tables and saves the raw JSON in bench-results/.
"""

from __future__ import annotations

import argparse
import http.client
import json
import os
import shutil
import statistics
import subprocess
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import redis

from disque_py.cli import launcher

from . import progress
from .common import CLIENT_CPU, HOST, SERVER_CPU, machine_info, parse_redis_benchmark

BODY = "x" * 100
MODES = ("off", "idle", "watched")
CHROMIUM = "/usr/bin/chromium"


def _start(port: int, admin: int | None, work: Path, name: str) -> Any:
    d = work / name
    d.mkdir(parents=True, exist_ok=True)
    extra = ["--bind", HOST]
    if admin is not None:
        extra += ["--admin-port", str(admin)]
    proc = launcher.spawn(launcher.pinned(launcher.node_argv(port, d, *extra), SERVER_CPU), output=d / "node.log")
    launcher.wait_ready(proc, port, timeout=30, logs=[d / "node.log"])
    if admin is not None:
        _wait_http(admin)
    return proc


def _wait_http(port: int, timeout: float = 15.0) -> None:
    deadline = time.monotonic() + timeout
    while True:
        try:
            status, _ = _get(port, "/healthz")
            if status == 200:
                return
        except OSError:
            pass
        if time.monotonic() > deadline:
            raise SystemExit("the admin port %d never answered /healthz" % port)
        time.sleep(0.05)


def _get(port: int, path: str, conn: http.client.HTTPConnection | None = None) -> tuple[int, bytes]:
    own = conn is None
    c = conn or http.client.HTTPConnection(HOST, port, timeout=10)
    try:
        c.request("GET", path)
        r = c.getresponse()
        return r.status, r.read()
    finally:
        if own:
            c.close()


def _cpu_seconds(pid: int) -> float:
    """The process's user + system CPU time so far (/proc/PID/stat)."""
    fields = Path("/proc/%d/stat" % pid).read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _bench(port: int, n: int, pipeline: int) -> float:
    argv = ["taskset", "-c", CLIENT_CPU, "redis-benchmark", "-h", HOST, "-p", str(port), "-c", "50",
            "-n", str(n), "-P", str(pipeline), "-q", "ADDJOB", "q", BODY, "0"]  # fmt: skip
    out = subprocess.run(argv, capture_output=True, text=True, errors="replace")
    if out.returncode != 0:
        raise SystemExit("redis-benchmark failed: %s\n%s" % (" ".join(argv), out.stderr[-2000:]))
    return parse_redis_benchmark(out.stdout)[0]


class Watcher:
    """A scraper of /metrics every second, and the admin page open in Chromium (or a poller)."""

    def __init__(self, admin: int) -> None:
        self.admin = admin
        self.stop = threading.Event()
        self.scrapes = 0
        self.page_polls = 0
        self.browser = shutil.which(CHROMIUM) is not None
        self.errors: list[str] = []
        self.threads = [threading.Thread(target=self._scrape, daemon=True),
                        threading.Thread(target=self._page, daemon=True)]  # fmt: skip

    def __enter__(self) -> "Watcher":
        for t in self.threads:
            t.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop.set()
        for t in self.threads:
            t.join(timeout=30)

    def _scrape(self) -> None:
        conn = http.client.HTTPConnection(HOST, self.admin, timeout=10)
        while not self.stop.wait(1.0):
            try:
                status, _ = _get(self.admin, "/metrics", conn)
                self.scrapes += status == 200
            except OSError as exc:
                self.errors.append("scrape: %s" % exc)
                conn = http.client.HTTPConnection(HOST, self.admin, timeout=10)

    def _page(self) -> None:
        if self.browser:
            try:
                self._browser()
                return
            except Exception as exc:  # noqa: BLE001 - fall back to the poller, and say so
                self.errors.append("browser: %s" % exc)
                self.browser = False
        conn = http.client.HTTPConnection(HOST, self.admin, timeout=10)
        while not self.stop.wait(1.0):
            try:
                for path in ("/api/cluster", "/api/queues"):
                    _get(self.admin, path, conn)
                self.page_polls += 1
            except OSError as exc:
                self.errors.append("poll: %s" % exc)
                conn = http.client.HTTPConnection(HOST, self.admin, timeout=10)

    def _browser(self) -> None:
        from playwright.sync_api import sync_playwright

        with sync_playwright() as pw:
            browser = pw.chromium.launch(executable_path=CHROMIUM, args=[
                "--headless=new", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                "--disable-background-networking", "--disable-component-update", "--disable-sync"])  # fmt: skip
            try:
                page = browser.new_page()
                page.on("response", lambda r: self._count(r.url))
                page.goto("http://%s:%d/" % (HOST, self.admin))
                while not self.stop.wait(0.25):
                    pass
            finally:
                browser.close()

    def _count(self, url: str) -> None:
        if "/api/queues" in url:
            self.page_polls += 1


def _cell(args: argparse.Namespace, work: Path, port: int, admin: int, pipeline: int, bar: Any) -> dict[str, Any]:
    # long enough runs (about 10 s each) that the once-a-second scrape and page polls are in them
    n = (50000 if pipeline == 1 else 200000) if args.quick else (250000 if pipeline == 1 else 1000000)
    runs: dict[str, list[float]] = {m: [] for m in MODES}
    cpu_us: dict[str, list[float]] = {m: [] for m in MODES}  # the node's CPU per ADDJOB, microseconds
    notes: dict[str, Any] = {}
    for r in range(args.rounds):
        for mode in MODES if r % 2 == 0 else tuple(reversed(MODES)):
            bar.doing("-P %d %s" % (pipeline, mode))
            proc = _start(port, None if mode == "off" else admin, work, "%s-%d-%d" % (mode, pipeline, r))
            try:
                if mode == "watched":
                    with Watcher(admin) as w:
                        w.stop.wait(3.0)  # the page loaded, a scrape or two done: then the load
                        cpu0 = _cpu_seconds(proc.pid)
                        runs[mode].append(_bench(port, n, pipeline))
                        cpu_us[mode].append((_cpu_seconds(proc.pid) - cpu0) * 1e6 / n)
                    notes = {"scrapes": w.scrapes, "page_polls": w.page_polls,
                             "page": "chromium" if w.browser else "poller", "errors": w.errors[:5]}  # fmt: skip
                else:
                    cpu0 = _cpu_seconds(proc.pid)
                    runs[mode].append(_bench(port, n, pipeline))
                    cpu_us[mode].append((_cpu_seconds(proc.pid) - cpu0) * 1e6 / n)
            finally:
                launcher.stop(proc, timeout=10)
            bar.done()
            progress.echo("  -P %-2d %-8s %9.0f/s  node CPU %.2f us/job" % (pipeline, mode, runs[mode][-1],
                                                                          cpu_us[mode][-1]), err=False)  # fmt: skip
    row: dict[str, Any] = {"pipeline": pipeline, "n": n, "runs": runs, "cpu_us": cpu_us, "watchers": notes}
    for m in MODES:
        row[m] = statistics.median(runs[m])
        row[m + "_cpu_us"] = statistics.median(cpu_us[m])
    row["idle_loss"] = 1 - row["idle"] / row["off"]
    row["watched_loss"] = 1 - row["watched"] / row["off"]
    return row


def client_path(args: argparse.Namespace, work: Path) -> list[dict[str, Any]]:
    port, admin = args.base_port, args.base_port + 1000
    rows = []
    with progress.bar(2 * args.rounds * len(MODES), "ADDJOB, admin port off/idle/watched") as bar:
        for pipeline in (1, 32):
            rows.append(_cell(args, work, port, admin, pipeline, bar))
    print()
    print("| ADDJOB | -P | admin off | on, idle | loss | on, scraped + page open | loss |")
    print("|---|---|---|---|---|---|---|")
    for r in rows:
        print("| jobs/s | %d | %.0f | %.0f | %+.1f %% | %.0f | %+.1f %% |" % (
            r["pipeline"], r["off"], r["idle"], 100 * r["idle_loss"], r["watched"], 100 * r["watched_loss"]))
        print("| node CPU per job | %d | %.2f us | %.2f us | %+.1f %% | %.2f us | %+.1f %% |" % (
            r["pipeline"], r["off_cpu_us"], r["idle_cpu_us"], 100 * (r["idle_cpu_us"] / r["off_cpu_us"] - 1),
            r["watched_cpu_us"], 100 * (r["watched_cpu_us"] / r["off_cpu_us"] - 1)))
    for r in rows:
        print("(-P %d watched by: %s)" % (r["pipeline"], r["watchers"]))
    return rows


def scrape(args: argparse.Namespace, work: Path) -> dict[str, Any]:
    port, admin = args.base_port, args.base_port + 1000
    proc = _start(port, admin, work, "scrape")
    try:
        r = redis.Redis(host=HOST, port=port)
        t0 = time.monotonic()
        batch = 2000
        for start in range(0, args.queues, batch):
            pipe = r.pipeline(transaction=False)
            for i in range(start, min(args.queues, start + batch)):
                pipe.execute_command("ADDJOB", "queue:%d" % i, BODY, 0)
            pipe.execute()
        fill = time.monotonic() - t0
        queues = int(r.info("queues")["registered_queues"])
        result: dict[str, Any] = {"queues": queues, "fill_seconds": fill}
        conn = http.client.HTTPConnection(HOST, admin, timeout=30)
        for path in ("/metrics", "/api/queues"):
            times, size = [], 0
            _get(admin, path, conn)  # the first one warms the imports and caches: not counted
            for _ in range(args.scrapes):
                t = time.perf_counter()
                status, body = _get(admin, path, conn)
                times.append((time.perf_counter() - t) * 1000)
                if status != 200:
                    raise SystemExit("%s answered %d" % (path, status))
                size = len(body)
            times.sort()
            cell = {"median_ms": statistics.median(times), "p90_ms": times[int(0.9 * (len(times) - 1))],
                    "max_ms": times[-1], "bytes": size}  # fmt: skip
            if path == "/metrics":
                cell["series"] = sum(1 for line in body.decode().splitlines() if line and not line.startswith("#"))
            result[path] = cell
            print("%-12s %d queues: median %.1f ms, p90 %.1f ms, max %.1f ms, %d bytes%s" % (
                path, queues, cell["median_ms"], cell["p90_ms"], cell["max_ms"], size,
                ", %d series" % cell["series"] if "series" in cell else ""), flush=True)
        return result
    finally:
        launcher.stop(proc, timeout=20)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="scripts/bench admin", description=__doc__.split("Method")[0].strip(),
                                formatter_class=argparse.RawDescriptionHelpFormatter)  # fmt: skip
    p.add_argument("--quick", action="store_true", help="n = 50,000 (-P 1) and 200,000 (-P 32) instead of 250,000 and 1,000,000, one round, 10,000 queues")
    p.add_argument("--rounds", type=int, default=None, help="alternations of the three modes (default 2)")
    p.add_argument("--queues", type=int, default=None, help="queues on the scraped node (default 100,000)")
    p.add_argument("--scrapes", type=int, default=20)
    p.add_argument("--base-port", type=int, default=17911)
    p.add_argument("--only", default="client,scrape", help="a subset of: client, scrape")
    p.add_argument("--write", metavar="FILE", default=None)
    args = p.parse_args(argv)
    # the scraper, the browser (its processes inherit this) and the load share the client's CPU:
    # only the node runs on SERVER_CPU
    os.sched_setaffinity(0, {int(CLIENT_CPU)})
    args.rounds = args.rounds or (1 if args.quick else 2)
    args.queues = args.queues or (10000 if args.quick else 100000)
    work = Path(tempfile.mkdtemp(prefix="disque-bench-admin-"))
    only = set(args.only.split(","))
    out: dict[str, Any] = {"machine": machine_info(launcher.server_command()[0]), "args": vars(args)}
    if "client" in only:
        out["client_path"] = client_path(args, work)
    if "scrape" in only:
        out["scrape"] = scrape(args, work)
    path = Path(args.write) if args.write else Path("bench-results") / ("admin-%s.json" % time.strftime("%Y%m%d-%H%M%S"))
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(out, indent=2))
    print("\nraw results: %s" % path)
    shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
