"""Fixtures for the tasks tests: the client tests' real node processes, and a worker of an app
running in a thread of the test process (stopped, and its stats checked, at the end)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from disque_py.tasks import make_worker
from tests.client.conftest import addr, cluster3, make_cluster, node, queue, raw  # noqa: F401
from tests.integration.conftest import redis_cli, start_node, wait_for  # noqa: F401


def start_worker_process(app: str, node, log_path: Path, *extra: str, log_level: str = "warning") -> subprocess.Popen:
    """``disque-py worker APP`` on ``node`` in a process of its own, its output in ``log_path``."""
    root = Path(__file__).resolve().parent.parent.parent
    env = dict(os.environ, PYTHONPATH=str(root), PYTHONUNBUFFERED="1")
    with open(log_path, "ab") as log:
        return subprocess.Popen(
            [sys.executable, "-m", "disque_py.cli", "worker", app, "-n", addr(node), "--fetch-timeout", "200",
             "--grace-period", "5", "--log-level", log_level, *extra],
            cwd=str(root), env=env, stdout=log, stderr=subprocess.STDOUT,
        )  # fmt: skip


def stop_worker_process(proc: subprocess.Popen, log_path: Path) -> None:
    """SIGTERM, and the worker must exit 0 within 20 s (its log's tail shown if not)."""
    proc.send_signal(signal.SIGTERM)
    try:
        code = proc.wait(20)
    except subprocess.TimeoutExpired:
        proc.kill()
        raise AssertionError("worker did not stop on SIGTERM:\n" + log_path.read_text()[-3000:])
    assert code == 0, log_path.read_text()[-3000:]


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
