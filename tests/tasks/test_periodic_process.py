"""Periodic slots with real worker processes: 3 nodes, 3 ``disque-py worker
tests.tasks.periodicapp:app`` processes (each runs the app's scheduler and its tasks), a task
every 2 s for 22 s; 7 to 9 s in (three slots or four), one worker and one node are killed
(SIGKILL), and the run goes on for 13 to 15 s, less than the nodes' timeout. Each slot's task
ran exactly once, and none is missing while a scheduler lived: in the window before the
cluster flags the node killed too, when an ADDJOB of three copies waits for the dead node's
copy (each scheduler adds slots from threads of its own: one waiting slot holds up no other),
and when two schedulers make the slot's job on two nodes at once and neither gets its copies
(one of the two nodes queues it).

Every run appends ``<slot> <pid> <job ID> <attempt>`` to one file (tests/tasks/periodicapp.py),
so what is checked is what ran, not what was queued: one job per slot. The worker is killed
a second into a slot of 2 s (a run takes microseconds), most often between two runs; but a
loaded machine may run a slot late, and a worker killed in the middle of a run (or whose node
is killed before its ACK) leaves its job to run again, which is the at-least-once of every
task (docs/TASKS.md, "Guarantees"), not a second job for the slot: a job runs again only
after a run by one of those two workers.
"""

from __future__ import annotations

import math
import os
import subprocess
import sys
import time
from collections import defaultdict

import pytest

from disque_py.cli import launcher
from tests.integration.conftest import ROOT, wait_for

from .conftest import stop_processes

pytestmark = pytest.mark.integration

PERIOD = 2
RUN = 22
BEFORE_KILL = 6  # then the first slot's second: the kills come 7 to 9 s in


def start_worker(seeds: str, prefer: str, runs, log_path) -> subprocess.Popen:
    env = {k: v for k, v in os.environ.items() if k != "DISQUE_NODES"}
    env.update(PYTHONPATH=str(ROOT), PYTHONUNBUFFERED="1", PERIODIC_NODES=seeds, PERIODIC_PREFER=prefer,
               PERIODIC_RUNS=str(runs))  # fmt: skip
    with open(log_path, "ab") as log:
        return subprocess.Popen(
            [sys.executable, "-m", "disque_py.cli", "worker", "tests.tasks.periodicapp:app", "-c", "2",
             "--fetch-timeout", "200", "--grace-period", "5", "--log-level", "info"],
            cwd=str(ROOT), env=env, stdout=log, stderr=subprocess.STDOUT,
        )  # fmt: skip


def runs_by_slot(runs) -> dict[int, list[tuple[int, str, int]]]:
    out: dict[int, list[tuple[int, str, int]]] = defaultdict(list)
    if runs.exists():
        for line in runs.read_text().splitlines():
            slot, pid, job_id, attempt = line.split()
            out[int(slot)].append((int(pid), job_id, int(attempt)))
    return out


@pytest.mark.timeout(120)
def test_three_workers_a_worker_and_a_node_killed_each_slot_ran_once(start_node, tmp_path):
    nodes = start_node.many(3)
    launcher.join([(n.host, n.port) for n in nodes], timeout=30)
    seeds = ",".join("127.0.0.1:%d" % n.port for n in nodes)
    runs = tmp_path / "runs.txt"
    logs = [tmp_path / ("worker-%d.log" % i) for i in range(3)]
    procs = [start_worker(seeds, "127.0.0.1:%d" % n.port, runs, logs[i]) for i, n in enumerate(nodes)]
    try:
        wait_for(lambda: all("periodic scheduler: 1 task(s)" in p.read_text() for p in logs), timeout=20,
                 what="three schedulers")  # fmt: skip
        began = time.time()
        # a second into a slot: between two runs of the task
        at = math.ceil((began + BEFORE_KILL) / PERIOD) * PERIOD + 1
        time.sleep(at - time.time())
        procs[0].kill()  # a worker (its scheduler and its tasks), on node 0
        nodes[1].proc.kill()  # a node, the one worker 1 uses
        killed_at = time.time()
        time.sleep(max(0.0, began + RUN - time.time()))
        ended = time.time()
        for i in (1, 2):
            assert procs[i].poll() is None, "a worker died:\n" + logs[i].read_text()[-3000:]
        first = math.ceil(began / PERIOD) * PERIOD
        last = math.floor((ended - 1) / PERIOD) * PERIOD  # a slot that started 1 s before the end at least
        expected = set(range(first, last + 1, PERIOD))
        # a slot's job queued on the node killed is queued again by another after its RETRY (4 s)
        try:
            wait_for(lambda: expected <= set(runs_by_slot(runs)), timeout=20, what="every slot run")
        except Exception:
            ran = runs_by_slot(runs)
            raise AssertionError("slots not run (worker and node killed at %.1f): %s\n%s" % (
                killed_at, sorted(expected - set(ran)), "\n".join(p.read_text()[-3000:] for p in logs)))
    finally:
        stop_processes(procs)
    nodes[1].proc.wait()

    ran = runs_by_slot(runs)
    twice = {slot: r for slot, r in ran.items() if len({job_id for _, job_id, _ in r}) > 1}
    assert not twice, "slots made more than one job: %s" % twice
    cut = {procs[0].pid, procs[1].pid}  # the worker killed, and the worker of the node killed
    again = {slot: r for slot, r in ran.items() if len(r) > 1 and any(pid not in cut for pid, _, _ in r[:-1])}
    assert not again, "jobs run again after a run no kill cut short: %s" % again
    assert expected <= set(ran)
    assert len(expected) >= RUN // PERIOD - 2
    # nothing ran for a slot that was not a slot of this run, and each slot was one job
    assert all(slot % PERIOD == 0 for slot in ran)
    pids = {pid for r in ran.values() for pid, _, _ in r}
    print("slots run: %d (expected %d), by %d worker process(es); retried runs: %d"
          % (len(ran), len(expected), len(pids), sum(a > 1 for r in ran.values() for _, _, a in r)))
