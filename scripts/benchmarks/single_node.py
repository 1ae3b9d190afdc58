"""The single-node suites: ``addjob``, ``getjob``, ``cycles``, ``memory`` and the ``redis``
yardstick (a fresh server for every test; see the Method notes of :mod:`benchmarks.bench`).
"""

from __future__ import annotations

import shutil
import time
from typing import Any

from .common import BenchBase, Server, SyncClient, log


CYCLE_BATCH = 100  # jobs a cycle of the batched cycles (``cycles_batch``)


class SingleNodeSuites(BenchBase):
    """The single-node suites, each on a fresh server per test."""

    def bench_addjob(self) -> None:
        for name, n, pipeline in (("addjob_p1", self.sizes.n_p1, 1), ("addjob_p32", self.sizes.n_p32, 32)):
            for kind in self.kinds():
                key = self.key(kind, name)
                log("ADDJOB -P %d, n=%d (%s)" % (pipeline, n, kind))
                node = self.start(kind)
                try:
                    r = self.redis_benchmark(node, n, pipeline, "ADDJOB", "q", self.body, "0")
                    with SyncClient(node.port) as c:
                        r["registered_jobs"] = int(c.info("jobs")["registered_jobs"])
                    if r["registered_jobs"] < n:
                        self.notes.append("%s: only %d of %d jobs registered" % (key, r["registered_jobs"], n))
                    self.results[key] = r
                finally:
                    self.stop(node)

    def fill_then(
        self, server: Server, n: int, fill: tuple[str, ...], measure: tuple[str, ...], length: tuple[str, ...]
    ) -> dict[str, Any]:
        """Fill a queue/list with n + clients*32 items, then measure ``measure`` with -P 32."""
        fill_n = n + self.clients * 32
        filled = self.redis_benchmark(server, fill_n, 32, *fill)
        with SyncClient(server.port) as c:
            before = int(c.call(*length))
        r = self.redis_benchmark(server, n, 32, *measure)
        with SyncClient(server.port) as c:
            left = int(c.call(*length))
        r.update(filled=before, served=before - left, left=left, fill_requests_per_s=filled["requests_per_s"])
        return r

    def bench_getjob(self) -> None:
        n = self.sizes.n_p32
        for kind in self.kinds():
            key = self.key(kind, "getjob_p32")
            log("GETJOB NOHANG -P 32, n=%d (queue filled first with ADDJOB -P 32; %s)" % (n, kind))
            node = self.start(kind)
            try:
                r = self.fill_then(
                    node, n, ("ADDJOB", "q", self.body, "0"), ("GETJOB", "NOHANG", "FROM", "q"), ("QLEN", "q")
                )
                if r["left"] <= 0:
                    self.notes.append("%s: the queue ran dry, some GETJOBs may have returned nothing" % key)
                self.results[key] = r
            finally:
                self.stop(node)

    def bench_cycles(self) -> None:
        for kind in self.kinds():
            log("ADDJOB -> GETJOB NOHANG -> ACKJOB cycles, %d connections (%s)" % (self.conns, kind))
            node = self.start(kind)
            try:
                r = self.run_client(node, "disque")
                with SyncClient(node.port) as c:
                    r["registered_jobs_after"] = int(c.info("jobs")["registered_jobs"])
                self.results[self.key(kind, "cycles")] = r
            finally:
                self.stop(node)
        for kind in self.kinds():
            log("the same cycles in batches of %d jobs (ADDJOB pipelined, GETJOB COUNT, one ACKJOB; %s)"
                % (CYCLE_BATCH, kind))  # fmt: skip
            node = self.start(kind)
            try:
                r = self.run_client(node, "disque", "--batch", str(CYCLE_BATCH))
                with SyncClient(node.port) as c:
                    r["registered_jobs_after"] = int(c.info("jobs")["registered_jobs"])
                self.results[self.key(kind, "cycles_batch")] = r
            finally:
                self.stop(node)

    def bench_memory(self) -> None:
        """Bytes per job held, twice: ``used_memory`` (ours is the node's estimate, core/memory.py;
        Disque's its allocator's count) and the process's RSS, each after minus before the fill. With
        ``--disque-server`` the same fill on Disque 1.0-rc1 (``ref_memory_N``)."""
        for jobs in self.sizes.memory_jobs:
            for kind in self.kinds():
                log("memory per job: %d jobs with a %d-byte body (%s)" % (jobs, self.body_size, kind))
                node = self.start(kind)
                try:
                    with SyncClient(node.port) as c:
                        mem = c.info("memory")
                        before, rss_before = int(mem["used_memory"]), int(mem["used_memory_rss"])
                    t0 = time.monotonic()
                    fill = self.redis_benchmark(node, jobs, 32, "ADDJOB", "q", self.body, "0")
                    with SyncClient(node.port) as c:
                        mem = c.info("memory")
                        after, rss_after = int(mem["used_memory"]), int(mem["used_memory_rss"])
                        registered = int(c.info("jobs")["registered_jobs"])
                    if registered < jobs:
                        self.notes.append("memory (%s): only %d of %d jobs registered" % (kind, registered, jobs))
                    self.results[self.key(kind, "memory_%d" % jobs)] = {
                        "jobs": registered,
                        "body_size": self.body_size,
                        "used_memory_before": before,
                        "used_memory_after": after,
                        "bytes_per_job": round((after - before) / registered, 1) if registered else None,
                        "rss_before": rss_before,
                        "rss_after": rss_after,
                        "rss_bytes_per_job": round((rss_after - rss_before) / registered, 1) if registered else None,
                        "fill_requests_per_s": fill["requests_per_s"],
                        "fill_s": round(time.monotonic() - t0, 2),
                    }
                finally:
                    self.stop(node)

    def bench_redis(self) -> None:
        if not shutil.which("redis-server"):
            note = "redis-server not found: the redis yardstick was skipped (apt-get install redis-server)"
            log(note)
            self.notes.append(note)
            return
        for key, n, pipeline in (("redis_lpush_p1", self.sizes.n_p1, 1), ("redis_lpush_p32", self.sizes.n_p32, 32)):
            log("redis-server LPUSH -P %d, n=%d" % (pipeline, n))
            server = self.start("redis-server")
            try:
                self.results[key] = self.redis_benchmark(server, n, pipeline, "LPUSH", "q", self.body)
            finally:
                self.stop(server)
        n = self.sizes.n_p32
        log("redis-server RPOP -P 32, n=%d (list filled first with LPUSH -P 32)" % n)
        server = self.start("redis-server")
        try:
            self.results["redis_rpop_p32"] = self.fill_then(
                server, n, ("LPUSH", "q", self.body), ("RPOP", "q"), ("LLEN", "q")
            )
        finally:
            self.stop(server)
        log("redis-server LPUSH -> RPOP -> DEL cycles (the client's own ceiling)")
        server = self.start("redis-server")
        try:
            self.results["redis_cycles"] = self.run_client(server, "redis")
        finally:
            self.stop(server)
