"""A stop that costs nothing, with real processes: ``disque-py worker MODULE:app`` processes
stopped with SIGTERM give back the tasks they fetched and never started (RELEASE), so that a
task with ``retries=0`` (MAXDELIVER 1) still runs exactly once, on another worker, and never
ends as a dead letter. The issue's report, then a rolling restart of two workers while 2,000
tasks flow.

Each task run appends a line to ``runs.log`` (one ``write`` on a file opened with O_APPEND), so
the test counts the runs of every task across the processes.
"""

from __future__ import annotations

import collections
import importlib
import re
import subprocess
import sys
import textwrap
import threading
from pathlib import Path

import pytest

from disque_py.client.sync import Client
from disque_py.tasks import GroupRef
from tests.client.conftest import start_cluster, stop_all

from .conftest import ROOT, wait_for
from .worker_procs import WorkerProcess

pytestmark = pytest.mark.integration

TASKS_MODULE = textwrap.dedent("""
    import os, time
    from disque_py.tasks import App

    DIR = os.environ["GIVEBACK_DIR"]
    app = App()

    def _ran(kind, n):
        fd = os.open(os.path.join(DIR, "runs.log"), os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        try:
            os.write(fd, b"%s %d %d\\n" % (kind.encode(), n, os.getpid()))
        finally:
            os.close(fd)

    @app.task(queue="once", retries=0)
    def once(n):
        # runs until the test lets it finish (the file "go")
        _ran("once", n)
        while not os.path.exists(os.path.join(DIR, "go")):
            time.sleep(0.01)
        return n * 10

    @app.task(queue="flow", retries=0)
    def flow(n):
        _ran("flow", n)
        time.sleep(0.01)
        return n
""")

#: the worker's exit line (WorkerStats.__str__)
EXIT_LINE = re.compile(r"worker stopped: processed=(\d+) failed=(\d+) retried=(\d+) dead=(\d+) released=(\d+) "
                       r"fetched=(\d+) in_flight=(\d+)")  # fmt: skip


def addr(node) -> str:
    return "%s:%d" % (node.host, node.port)


@pytest.fixture
def tasks(tmp_path, monkeypatch):
    """The tasks module, written in ``tmp_path`` and imported here too (to send)."""
    (tmp_path / "givebackapp.py").write_text(TASKS_MODULE)
    monkeypatch.setenv("GIVEBACK_DIR", str(tmp_path))
    monkeypatch.syspath_prepend(str(tmp_path))
    sys.modules.pop("givebackapp", None)

    def load(nodes: str):
        monkeypatch.setenv("DISQUE_NODES", nodes)
        return importlib.import_module("givebackapp")

    yield load
    mod = sys.modules.pop("givebackapp", None)
    if mod is not None:
        mod.app.close()


@pytest.fixture
def workers():
    started: list[WorkerProcess] = []

    def start(directory: Path, node, *args: str) -> WorkerProcess:
        proc = WorkerProcess(directory, "givebackapp:app", "-n", addr(node), *args,
                             env={"GIVEBACK_DIR": str(directory)})  # fmt: skip
        started.append(proc)
        return proc

    yield start
    for proc in started:
        proc.close()


def runs(directory: Path, kind: str) -> list[int]:
    """The task numbers of ``kind`` that ran, one per run, in the order they started."""
    try:
        lines = (directory / "runs.log").read_text().splitlines()
    except FileNotFoundError:
        return []
    return [int(line.split()[1]) for line in lines if line.startswith(kind + " ")]


def exit_counts(log: str) -> dict[str, int]:
    match = EXIT_LINE.search(log)
    assert match, log[-3000:]
    names = ("processed", "failed", "retried", "dead", "released", "fetched", "in_flight")
    return dict(zip(names, map(int, match.groups())))


def no_dead_letters(*nodes) -> None:
    """``disque-py dead list`` over the cluster finds none."""
    out = subprocess.run([sys.executable, "-m", "disque_py.cli", "dead", "list", "--nodes",
                          ",".join(addr(n) for n in nodes)],
                         cwd=str(ROOT), capture_output=True, timeout=60)  # fmt: skip
    assert out.returncode == 0 and out.stdout.decode().strip() == "no dead letters", out


def test_sigterm_gives_back_the_tasks_not_started_as_never_delivered(node, tasks, workers, tmp_path):
    """The issue's report: ``-c 1 --max-in-flight 8``, tasks with retries=0, SIGTERM while the
    first runs. The worker finishes it, gives back the 7 it fetched and never started (no attempt
    used: no nack, no delivery counted, no dead letter), exits 0; a second worker runs them all."""
    mod = tasks(addr(node))
    refs = [mod.once.send(n) for n in range(10)]  # all queued before the worker's first GETJOB: it takes 8
    first = workers(tmp_path, node, "-c", "1", "--max-in-flight", "8")
    wait_for(lambda: len(runs(tmp_path, "once")) == 1, timeout=30, what="the first task to start")
    first.proc.send_signal(15)
    wait_for(lambda: "worker stopping" in first.log(), timeout=15, what="the worker to take the SIGTERM")
    (tmp_path / "go").touch()  # the running task finishes within the grace period
    assert first.proc.wait(20) == 0, first.log()[-3000:]
    counts = exit_counts(first.log())
    assert counts == {"processed": 1, "failed": 0, "retried": 0, "dead": 0, "released": 7, "fetched": 8,
                      "in_flight": 0}, first.log()[-3000:]  # fmt: skip
    [ran] = runs(tmp_path, "once")
    c = Client(addr(node))
    shown = {n: c.show(ref.id) for n, ref in enumerate(refs) if n != ran}
    for n, info in shown.items():
        assert info["state"] == "queued" and info["nacks"] == 0 and info["deliveries"] == 0, (n, info)
    assert sorted(info.get("returns", 0) for info in shown.values()) == [0, 0] + [1] * 7
    assert c.qlen("once.dead") == 0

    second = workers(tmp_path, node, "-c", "1", "--max-in-flight", "8")
    assert GroupRef(refs).results(timeout=60) == [n * 10 for n in range(10)]
    assert sorted(runs(tmp_path, "once")) == list(range(10))  # each exactly once
    second.stop()
    assert exit_counts(second.log())["processed"] == 9
    assert c.qlen("once.dead") == 0
    no_dead_letters(node)


@pytest.fixture
def two_nodes(tmp_path_factory):
    nodes = start_cluster(tmp_path_factory.mktemp("giveback2"), 2, cluster_node_timeout=1000, loglevel="notice")
    yield nodes
    stop_all(nodes)


def test_a_rolling_restart_of_two_workers_while_2000_tasks_flow(two_nodes, tasks, workers, tmp_path):
    """Two ``disque-py worker`` processes, one per node, each restarted 5 times (SIGTERM, wait for
    its exit, start a new one) while 2,000 tasks with retries=0 are sent and run: every task runs
    exactly once and returns its value, there is no dead letter, and the stops did give back
    tasks (the workers' exit lines)."""
    total, restarts = 2000, 10
    mod = tasks(addr(two_nodes[0]))
    refs: list = []
    sender_error: list[BaseException] = []

    def send() -> None:
        try:
            for n in range(total):
                refs.append(mod.flow.send(n))
        except BaseException as exc:  # noqa: BLE001 - reported by the test
            sender_error.append(exc)

    options = ("-c", "2", "--max-in-flight", "16")
    current = [workers(tmp_path, node, *options) for node in two_nodes]
    stopped: list[WorkerProcess] = []
    sender = threading.Thread(target=send, name="sender", daemon=True)
    sender.start()
    for i in range(restarts):
        # restart i once the workers ran (i + 1) / (restarts + 2) of the tasks: all while they flow
        mark = (i + 1) * total // (restarts + 2)
        wait_for(lambda: len(runs(tmp_path, "flow")) >= mark, timeout=60, what="%d tasks run" % mark)
        assert len(runs(tmp_path, "flow")) < total, "the tasks ran out before restart %d" % i
        slot = i % 2
        old = current[slot]
        old.stop()  # SIGTERM, and a clean exit
        stopped.append(old)
        current[slot] = workers(tmp_path, two_nodes[slot], *options)
    sender.join(60)
    assert not sender.is_alive() and not sender_error, sender_error
    assert GroupRef(refs).results(timeout=90) == list(range(total))
    ran = collections.Counter(runs(tmp_path, "flow"))
    assert sorted(ran) == list(range(total)) and set(ran.values()) == {1}, [n for n, k in ran.items() if k > 1]
    for proc in current:
        proc.stop()
    exits = [exit_counts(proc.log()) for proc in stopped + current]
    assert all(e["failed"] == e["retried"] == e["dead"] == e["in_flight"] == 0 for e in exits), exits
    assert sum(e["processed"] for e in exits) == total
    assert sum(e["released"] for e in exits) > 0, exits  # the stops had tasks in hand, and gave them back
    assert all(Client(addr(n)).qlen("flow.dead") == 0 for n in two_nodes)
    no_dead_letters(*two_nodes)
