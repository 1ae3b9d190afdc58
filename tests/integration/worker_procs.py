"""Real worker processes for the tests of workers in plain sight (``disque-py worker ...`` in a
subprocess): handlers that hold their job until the test lets them go, so that a worker is
running it when the cluster is asked.

``HOLD_MODULE`` is written into the test's directory as ``holders.py``: ``holders:hold`` (a plain
function: the handler threads) and ``holders:app`` (a task app whose task ``crunch`` runs in the
task runner, an ``async def`` handler). Each writes ``<marks>/started-<job id>`` when its job
starts and waits until ``<marks>/release`` exists.
"""

from __future__ import annotations

import importlib
import json
import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path
from types import ModuleType

from .conftest import ROOT, wait_for

HOLD_MODULE = textwrap.dedent("""
    import os, time
    from disque_py.tasks import App, current_task

    MARKS = os.environ["HOLD_MARKS"]
    app = App()

    def _hold(job_id):
        open(os.path.join(MARKS, "started-" + job_id.replace("/", "_")), "w").close()
        while not os.path.exists(os.path.join(MARKS, "release")):
            time.sleep(0.02)

    def hold(job):
        _hold(job.id)

    @app.task(queue="crunching", retries=0)
    def crunch(n):
        _hold(current_task().job_id)
        return n
""")


class WorkerProcess:
    """``python -m disque_py.cli worker <target> ...`` in ``directory``, its output in a log file."""

    def __init__(self, directory: Path, target: str, *args: str, env: dict[str, str] | None = None) -> None:
        self.directory = directory
        count = len(list(directory.glob("worker-*")))
        self.log_path = directory / ("worker-%s-%d.log" % (target.replace(":", "-"), count))
        full_env = dict(os.environ, PYTHONPATH=str(ROOT), PYTHONUNBUFFERED="1", HOLD_MARKS=str(directory / "marks"),
                        **(env or {}))  # fmt: skip
        with open(self.log_path, "wb") as log:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "disque_py.cli", "worker", target, "--fetch-timeout", "100",
                 "--grace-period", "5", *args],
                cwd=str(directory), env=full_env, stdout=log, stderr=subprocess.STDOUT,
            )  # fmt: skip

    @property
    def pid(self) -> int:
        return self.proc.pid

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def stop(self) -> str:
        """SIGTERM, and the exit must be clean; returns the log."""
        self.proc.send_signal(signal.SIGTERM)
        try:
            code = self.proc.wait(20)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
            raise AssertionError("the worker did not stop on SIGTERM:\n" + self.log()[-3000:]) from None
        assert code == 0, self.log()[-3000:]
        return self.log()

    def kill(self) -> None:
        self.proc.kill()
        self.proc.wait()

    def close(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()


def holders_dir(tmp_path: Path) -> Path:
    """``tmp_path`` with ``holders.py`` and an empty ``marks`` directory."""
    (tmp_path / "holders.py").write_text(HOLD_MODULE)
    (tmp_path / "marks").mkdir(exist_ok=True)
    return tmp_path


def holders_module(tmp_path: Path, monkeypatch, nodes: str) -> tuple[Path, ModuleType]:
    """:func:`holders_dir`, and ``holders`` imported in this process (its app sends to ``nodes``)."""
    directory = holders_dir(tmp_path)
    monkeypatch.setenv("DISQUE_NODES", nodes)
    monkeypatch.setenv("HOLD_MARKS", str(directory / "marks"))
    monkeypatch.syspath_prepend(str(directory))
    sys.modules.pop("holders", None)  # another test's
    return directory, importlib.import_module("holders")


def started(directory: Path, job_id: str) -> bool:
    return (directory / "marks" / ("started-" + job_id.replace("/", "_"))).exists()


def release(directory: Path) -> None:
    (directory / "marks" / "release").touch()


def workers_json(*nodes: str, timeout: float = 30) -> dict:
    """``disque-py workers --json`` as a process of its own, against ``nodes`` (``host:port``)."""
    out = subprocess.run([sys.executable, "-m", "disque_py.cli", "workers", "--json", "--nodes", ",".join(nodes)],
                         cwd=str(ROOT), capture_output=True, timeout=timeout,
                         env=dict(os.environ, PYTHONPATH=str(ROOT)))  # fmt: skip
    assert out.returncode == 0, out.stderr.decode()
    return json.loads(out.stdout)


def listed_when(nodes: list[str], predicate, what: str, timeout: float = 20) -> dict:
    """``disque-py workers --json`` asked until ``predicate(its workers by ID)`` holds."""
    def asked() -> dict | None:
        data = workers_json(*nodes)
        return data if predicate({w["id"]: w for w in data["workers"]}) else None

    return wait_for(asked, timeout=timeout, interval=0.2, what=what)
