"""The ``queues`` suite: what 200,000 idle queues cost one node of three, in memory and in CPU
(see the Method notes of :mod:`benchmarks.bench`, "Idle queues").
"""

from __future__ import annotations

import time

from .common import BenchBase, BenchError, Server, SyncClient, encode, log


class QueuesSuite(BenchBase):
    """The queues suite: what many idle queues cost a node."""

    @staticmethod
    def _cpu_pct(node: Server, window: float) -> float | None:
        """``node``'s CPU use over the next ``window`` seconds, in % of one core."""
        c0 = node.cpu_seconds()
        t0 = time.monotonic()
        time.sleep(window)
        c1 = node.cpu_seconds()
        if c0 is None or c1 is None:
            return None
        return round(100.0 * (c1 - c0) / (time.monotonic() - t0), 1)

    def bench_queues(self) -> None:
        """Idle queues on node A of a 3-node cluster: memory per queue, and node CPU with nothing
        to do, then with one client blocked on another queue (the federation tick runs)."""
        n, window = self.sizes.idle_queues, self.sizes.idle_window
        log("queues: %s idle queues on one node of 3, CPU over %g s idle and with a blocked client"
            % ("{:,}".format(n), window))  # fmt: skip
        nodes = self.start_fed_cluster("queues")
        a = nodes[0]
        try:
            with SyncClient(a.port, timeout=60.0) as c:
                before = int(c.info("memory")["used_memory"])
                t0 = time.monotonic()
                for start in range(0, n, 10_000):  # each queue gets a job, which is then deleted
                    names = ["idle-%d" % i for i in range(start, min(n, start + 10_000))]
                    ids = c.pipeline([("ADDJOB", q, "x", 0, "REPLICATE", 1) for q in names])
                    bad = [r for r in ids if not isinstance(r, bytes)]
                    if bad:
                        raise BenchError("queues: ADDJOB failed: %s" % bad[0])
                    c.call("FASTACK", *ids)
                fill_s = time.monotonic() - t0
                registered = int(c.info("queues")["registered_queues"])
                after = int(c.info("memory")["used_memory"])
                idle_cpu = self._cpu_pct(a, window)
                with SyncClient(a.port, timeout=window + 30.0) as blocked:
                    blocked.sock.sendall(encode("GETJOB", "TIMEOUT", int((window + 5) * 1000), "FROM", "waiting"))
                    deadline = time.monotonic() + 10.0
                    while int(c.info("clients")["blocked_clients"]) < 1:
                        if time.monotonic() > deadline:
                            raise BenchError("queues: the GETJOB did not block")
                        time.sleep(0.05)
                    blocked_cpu = self._cpu_pct(a, window)
            if registered < n:
                self.notes.append("queues: only %d of %d queues registered" % (registered, n))
            self.results["queues_idle"] = {
                "queues": registered,
                "used_memory_before": before,
                "used_memory_after": after,
                "bytes_per_queue": round((after - before) / registered, 1) if registered else None,
                "fill_s": round(fill_s, 2),
                "window_s": window,
                "node_cpu_idle_pct": idle_cpu,
                "node_cpu_blocked_pct": blocked_cpu,
            }
        finally:
            self.shutdown_nodes(nodes, label="queues")
