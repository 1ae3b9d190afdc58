"""A task worker's counts (:class:`TaskMetrics`) and their Prometheus exporter (``/metrics``).

The counts are kept by the runner (:mod:`.runner`) for each task name; :func:`serve_metrics`
serves them, with the worker's own job counters, in Prometheus's format on a port of their own
(a thread of prometheus_client's; the ``admin`` extra), when ``disque-py worker`` is given
``--metrics-port``.
"""

from __future__ import annotations

import threading
from typing import Any

from ..client.worker import Worker

__all__ = ["TaskMetrics", "serve_metrics"]


class TaskMetrics:
    """Counts per task name: done, failed (for good), retried, rejected, given back (a task this
    worker does not know, for another worker), revoked (cancelled: ``TaskRef.cancel()``), and
    the run time."""

    BUCKETS = (0.001, 0.005, 0.01, 0.05, 0.1, 0.5, 1.0, 5.0, 10.0, 60.0, float("inf"))

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.done: dict[str, int] = {}
        self.failed: dict[str, int] = {}
        self.retried: dict[str, int] = {}
        self.rejected: dict[str, int] = {}
        self.given_back: dict[str, int] = {}
        self.revoked: dict[str, int] = {}
        self.duration_sum: dict[str, float] = {}
        self.duration_buckets: dict[str, list[int]] = {}

    def count(self, kind: str, task: str, duration: float | None = None) -> None:
        with self._lock:
            table = getattr(self, kind)
            table[task] = table.get(task, 0) + 1
            if duration is not None:
                self.duration_sum[task] = self.duration_sum.get(task, 0.0) + duration
                buckets = self.duration_buckets.setdefault(task, [0] * len(self.BUCKETS))
                for i, bound in enumerate(self.BUCKETS):
                    if duration <= bound:
                        buckets[i] += 1

    def total(self, kind: str) -> int:
        with self._lock:
            return sum(getattr(self, kind).values())

    def snapshot(self) -> dict[str, Any]:
        with self._lock:
            return {
                "done": dict(self.done), "failed": dict(self.failed), "retried": dict(self.retried),
                "rejected": dict(self.rejected), "given_back": dict(self.given_back),
                "revoked": dict(self.revoked),
                "duration_sum": dict(self.duration_sum),
                "duration_buckets": {k: list(v) for k, v in self.duration_buckets.items()},
            }  # fmt: skip

    def collector(self, worker: Worker | None = None) -> Any:
        """A prometheus_client collector of these counts (and the worker's, if given)."""
        from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily

        metrics = self
        buckets = self.BUCKETS

        class _Collector:
            def collect(self) -> Any:
                snap = metrics.snapshot()
                for kind, help_text in (
                    ("done", "Tasks that succeeded"),
                    ("failed", "Tasks that failed for good (dead-lettered)"),
                    ("retried", "Task runs that failed and will be retried"),
                    ("rejected", "Task jobs that could not run (bad body, unknown task, wrong arguments)"),
                    ("given_back", "Task jobs given back for another worker (a task this one does not know)"),
                    ("revoked", "Task jobs cancelled (TaskRef.cancel()): stopped, or not run"),
                ):
                    family = CounterMetricFamily("disque_py_tasks_%s" % kind, help_text, labels=["task"])
                    for name, value in sorted(snap[kind].items()):
                        family.add_metric([name], value)
                    yield family
                hist = HistogramMetricFamily("disque_py_task_duration_seconds", "Run time of tasks", labels=["task"])
                for name, counts in sorted(snap["duration_buckets"].items()):
                    bounds = [("+Inf" if b == float("inf") else repr(b), c) for b, c in zip(buckets, counts)]
                    hist.add_metric([name], bounds, snap["duration_sum"].get(name, 0.0))
                yield hist
                if worker is not None:
                    stats = worker.stats()
                    for attr in ("fetched", "processed", "failed", "retried", "dead", "ack_errors"):
                        yield CounterMetricFamily("disque_py_worker_jobs_%s" % attr, "Worker jobs %s" % attr,
                                                  value=getattr(stats, attr))  # fmt: skip
                    for attr in ("in_flight", "running"):
                        yield GaugeMetricFamily("disque_py_worker_jobs_%s" % attr, "Worker jobs %s" % attr,
                                                value=getattr(stats, attr))  # fmt: skip

        return _Collector()


def serve_metrics(metrics: TaskMetrics, port: int, host: str = "127.0.0.1", worker: Worker | None = None) -> Any:
    """Serve ``/metrics`` on ``host:port`` (a thread of prometheus_client's); returns the server."""
    from prometheus_client import CollectorRegistry, start_http_server

    registry = CollectorRegistry(auto_describe=False)
    registry.register(metrics.collector(worker))
    server, _thread = start_http_server(port, addr=host, registry=registry)
    return server
