"""Client-side throughput: the client library and the worker against raw pipelined redis-py.

    scripts/bench client-lib                   # starts its own node on a free port
    scripts/bench client-lib --port 7711       # or uses a running one
    scripts/bench client-lib --jobs 50000 --repeat 5

Every figure is jobs per second, the best of ``--repeat`` runs, against one
node (the node is a separate process; on a small machine it is usually the
bottleneck, which is the point: the comparison says how much the client
adds on top of the cheapest way to drive the same commands).

* ``add``: ADDJOB of ``--jobs`` small bodies, ``--batch`` per round trip.
  raw = a redis-py pipeline (transaction=False); client = ``Client.add_jobs``
  (sync) and ``aio.Client.add_jobs`` (trio).
* ``consume``: a pre-filled queue drained and acknowledged. raw = one round
  trip per batch of ``n`` jobs: ``ACKJOB <previous batch>`` pipelined with
  ``GETJOB NOHANG COUNT n WITHCOUNTERS``; worker = :class:`Worker` with a
  no-op handler at concurrency c (max_in_flight 2c, hence raw n = 2c).

The client's share of end-to-end time is ``1 - client_rate / raw_rate``: of
the best rates, and (``median share``) the median over the interleaved
pairs of runs, which is steadier on a busy machine. ``--only add`` or
``--only consume``, ``--concurrency 8`` (repeatable) and ``--handler sync``
pick rows; ``--beacon-interval 0`` runs the worker without its beats to the cluster (what
they cost a worker: BENCHMARKS.md, "What the workers' beats cost a node").
"""

from __future__ import annotations

import argparse
import functools
import os
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Callable
from typing import Any

import redis
import trio

from disque_py.cli import launcher
from disque_py.client.aio import Client as AioClient
from disque_py.client.sync import Client
from disque_py.client.worker import Worker

from . import progress

BODY = b"x" * 32


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_node(port: int, directory: str) -> subprocess.Popen:
    proc = launcher.spawn(launcher.node_argv(port, None, "--bind", "127.0.0.1", "--dir", directory,
                                             "--loglevel", "warning"))  # fmt: skip
    try:
        launcher.wait_ready(proc, port, timeout=20)
    except launcher.LaunchError as exc:
        launcher.stop(proc, sig=signal.SIGKILL, timeout=5)
        raise SystemExit("the node did not start: %s" % exc) from None
    return proc


def share(raw_rate: float, client_rate: float) -> float:
    """The client's share of end-to-end time, in percent (0 when the client is faster)."""
    return max(0.0, 1 - client_rate / raw_rate) * 100


def best_of(repeat: int, raw: Callable[[], float], client: Callable[[], float]) -> tuple[float, float, float]:
    """Best rate of each and the median share, runs interleaved (raw, client, raw, client...)
    so both see the same machine."""
    raw_rates, client_rates = [], []
    for _ in range(repeat):
        raw_rates.append(raw())
        client_rates.append(client())
    median = statistics.median(share(r, c) for r, c in zip(raw_rates, client_rates))
    return max(raw_rates), max(client_rates), median


def fill(r: redis.Redis, queue: str, jobs: int, batch: int) -> None:
    for start in range(0, jobs, batch):
        pipe = r.pipeline(transaction=False)
        for _ in range(min(batch, jobs - start)):
            pipe.execute_command("ADDJOB", queue, BODY, 0)
        pipe.execute()


def raw_add(r: redis.Redis, jobs: int, batch: int) -> float:
    queue = "bench-" + uuid.uuid4().hex[:8]
    t = time.perf_counter()
    fill(r, queue, jobs, batch)
    rate = jobs / (time.perf_counter() - t)
    drain(r, queue)
    return rate


def client_add(c: Client, r: redis.Redis, jobs: int, batch: int) -> float:
    queue = "bench-" + uuid.uuid4().hex[:8]
    bodies = [BODY] * jobs
    t = time.perf_counter()
    c.add_jobs(queue, bodies, batch=batch, timeout_ms=0)
    rate = jobs / (time.perf_counter() - t)
    drain(r, queue)
    return rate


def aio_add(port: int, r: redis.Redis, jobs: int, batch: int) -> float:
    queue = "bench-" + uuid.uuid4().hex[:8]
    bodies = [BODY] * jobs

    async def main() -> float:
        async with AioClient("127.0.0.1:%d" % port) as c:
            await c.ping()
            t = time.perf_counter()
            await c.add_jobs(queue, bodies, batch=batch, timeout_ms=0)
            return jobs / (time.perf_counter() - t)

    rate = trio.run(main)
    drain(r, queue)
    return rate


def drain(r: redis.Redis, queue: str) -> None:
    while True:
        got = r.execute_command("GETJOB", "NOHANG", "COUNT", 1000, "FROM", queue)
        if not got:
            return
        r.execute_command("FASTACK", *[item[1] for item in got])


def raw_consume(r: redis.Redis, jobs: int, batch: int, count: int) -> float:
    queue = "bench-" + uuid.uuid4().hex[:8]
    fill(r, queue, jobs, batch)
    done = 0
    previous: list[bytes] = []
    t = time.perf_counter()
    while True:
        pipe = r.pipeline(transaction=False)
        if previous:
            pipe.execute_command("ACKJOB", *previous)
        pipe.execute_command("GETJOB", "NOHANG", "COUNT", count, "WITHCOUNTERS", "FROM", queue)
        got = pipe.execute()[-1]
        if not got:
            break
        previous = [item[1] for item in got]
        done += len(previous)
    elapsed = time.perf_counter() - t
    assert done == jobs, (done, jobs)
    return jobs / elapsed


def worker_consume(port: int, r: redis.Redis, jobs: int, batch: int, concurrency: int, sync_handler: bool,
                   beacon_interval: float | None = 5.0) -> float:  # fmt: skip
    queue = "bench-" + uuid.uuid4().hex[:8]
    fill(r, queue, jobs, batch)

    def noop(job: Any) -> None:
        pass

    async def anoop(job: Any) -> None:
        pass

    handler: Any = noop if sync_handler else anoop

    async def main() -> float:
        async with AioClient("127.0.0.1:%d" % port) as c:
            await c.ping()
            w = Worker(c, queue, handler, concurrency=concurrency, fetch_timeout_ms=50,
                       beacon_interval=beacon_interval)
            t = time.perf_counter()
            async with trio.open_nursery() as nursery:
                nursery.start_soon(w.run)
                while True:  # every job handled and acknowledged
                    stats = w.stats()
                    if stats.processed >= jobs and stats.in_flight == 0:
                        break
                    await trio.sleep(0.005)
                elapsed = time.perf_counter() - t
                w.stop()
            return jobs / elapsed

    rate = trio.run(main)
    remaining = r.execute_command("QLEN", queue)
    assert remaining == 0, remaining
    return rate


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="scripts/bench client-lib", description=__doc__.split("\n\n")[0])
    parser.add_argument("--port", type=int, default=None, help="use a running node (default: start one)")
    parser.add_argument("--jobs", type=int, default=20000)
    parser.add_argument("--batch", type=int, default=100)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--only", choices=["add", "consume"], default=None, help="run one group of rows")
    parser.add_argument("--concurrency", type=int, action="append", default=None,
                        help="worker concurrency (repeatable; default 1 and 8)")  # fmt: skip
    parser.add_argument("--handler", choices=["async", "sync"], default=None, help="one kind of worker handler")
    parser.add_argument("--beacon-interval", type=float, default=5.0,
                        help="the worker's beats to the cluster (WORKER BEAT), seconds; 0: none (default 5)")
    args = parser.parse_args(argv)

    proc = None
    tmp = None
    port = args.port
    if port is None:
        tmp = tempfile.TemporaryDirectory()
        port = _free_port()
        proc = start_node(port, tmp.name)
    try:
        r = redis.Redis(port=port, protocol=2, socket_timeout=30)
        c = Client("127.0.0.1:%d" % port)
        n, b, k = args.jobs, args.batch, args.repeat
        print("node 127.0.0.1:%d, %d jobs of %d bytes, batch %d, best of %d, python %s, %d CPU(s)"
              % (port, n, len(BODY), b, k, sys.version.split()[0], os.cpu_count() or 0))  # fmt: skip
        cells: list[tuple[str, Callable[[], float], Callable[[], float]]] = []  # (label, raw run, client run)
        if args.only in (None, "add"):
            raw_add_run = functools.partial(raw_add, r, n, b)
            cells.append(("add (sync Client.add_jobs)", raw_add_run, lambda: client_add(c, r, n, b)))
            cells.append(("add (trio Client.add_jobs)", raw_add_run, lambda: aio_add(port, r, n, b)))
        kinds = [False, True] if args.handler is None else [args.handler == "sync"]
        for conc in (args.concurrency or (1, 8)) if args.only in (None, "consume") else ():
            for sync_handler in kinds:
                label = "consume (Worker, %s no-op, concurrency %d)" % ("sync" if sync_handler else "async", conc)
                raw_run = functools.partial(raw_consume, r, n, b, 2 * conc)
                worker_run = functools.partial(worker_consume, port, r, n, b, conc, sync_handler,
                                               args.beacon_interval or None)
                cells.append((label, raw_run, worker_run))
        rows: list[tuple[str, float, float, float]] = []
        with progress.bar(len(cells), "scripts/bench client-lib") as bar:
            for label, raw_run, client_run in cells:
                bar.doing(label)
                rows.append((label, *best_of(k, raw_run, client_run)))
                bar.done()
        print("%-46s %12s %12s %14s %14s" % ("operation", "raw jobs/s", "client", "client share", "median share"))
        for label, raw_rate, rate, median in rows:
            print("%-46s %12.0f %12.0f %13.0f%% %13.0f%%" % (label, raw_rate, rate, share(raw_rate, rate), median))
    finally:
        if proc is not None:
            launcher.stop(proc, sig=signal.SIGTERM, timeout=10)
        if tmp is not None:
            tmp.cleanup()


if __name__ == "__main__":
    main()
