"""Fixtures for the tasks tests: the client tests' real node processes, and a worker of an app
running in a thread of the test process (stopped, and its stats checked, at the end)."""

from __future__ import annotations

import signal
import subprocess
import threading

import pytest

from disque_py.tasks import make_worker
from tests.client.conftest import addr, cluster3, make_cluster, node, queue, raw  # noqa: F401
from tests.integration.conftest import redis_cli, start_node, wait_for  # noqa: F401


def stop_processes(procs: list[subprocess.Popen]) -> None:
    """SIGTERM to each process still running, then wait for all (SIGKILL after 15 s)."""
    for p in procs:
        if p.poll() is None:
            p.send_signal(signal.SIGTERM)
    for p in procs:
        try:
            p.wait(timeout=15)
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait()


class RunningWorker:
    def __init__(self, app, **options) -> None:
        self.worker, self.runner = make_worker(app, **options)
        self.error: BaseException | None = None
        self.stats = None
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _run(self) -> None:
        try:
            self.stats = self.worker.run_sync(handle_signals=False)
        except BaseException as exc:  # noqa: BLE001 - reported by stop()
            self.error = exc

    def stop(self) -> None:
        """Stop the worker (again: a test may stop it before the fixture does)."""
        if self.thread.is_alive():
            self.worker.stop(grace_period=5.0)
            self.thread.join(15)
        assert not self.thread.is_alive(), "the worker did not stop"
        if self.error is not None:
            raise self.error


@pytest.fixture
def run_worker():
    running: list[RunningWorker] = []

    def start(app, **options) -> RunningWorker:
        options.setdefault("fetch_timeout_ms", 200)
        w = RunningWorker(app, **options)
        running.append(w)
        return w

    yield start
    for w in running:
        w.stop()
