"""Periodic slots with real processes: 3 nodes, 3 scheduler processes, a task every 2 s for
30 s; halfway one scheduler and one node are killed (SIGKILL). Each slot's job is in the
cluster exactly once, and none is missing while a scheduler lived.

The scheduler processes are ``python -m tests.tasks.standin`` (periodic.run_scheduler with a
stand-in app that follows the task app's interface), each preferring a node of its own.
"""

from __future__ import annotations

import json
import math
import os
import signal
import subprocess
import sys
import time
from collections import defaultdict

import pytest

from disque_py import launcher
from tests.integration.conftest import ROOT, wait_for

pytestmark = pytest.mark.integration

PERIOD = 2
RUN = 30


def jobs_on(node, queue: str) -> dict[str, bytes]:
    """{job ID: body} of every job of ``queue`` this node holds (queued or not)."""
    r = node.client()
    out: dict[str, bytes] = {}
    cursor = b"0"
    while True:
        cursor, ids = r.execute_command("JSCAN", cursor, "COUNT", 1000, "QUEUE", queue)
        for job_id in ids:
            shown = r.execute_command("SHOW", job_id)
            if shown is not None:
                fields = dict(zip(shown[::2], shown[1::2]))
                out[job_id.decode()] = fields[b"body"]
        if cursor in (b"0", 0):
            return out


@pytest.mark.timeout(120)
def test_three_schedulers_two_deaths_each_slot_once(start_node, tmp_path):
    nodes = [start_node() for _ in range(3)]
    launcher.join([(n.host, n.port) for n in nodes], timeout=30)
    seeds = ",".join("127.0.0.1:%d" % n.port for n in nodes)
    env = dict(os.environ, PYTHONPATH=str(ROOT), PYTHONUNBUFFERED="1")
    procs = []
    for i, n in enumerate(nodes):
        log = open(tmp_path / ("scheduler-%d.log" % i), "w")
        procs.append(subprocess.Popen(
            [sys.executable, "-m", "tests.tasks.standin", seeds, "--every", str(PERIOD), "--name", "tick",
             "--prefer", "127.0.0.1:%d" % n.port],
            cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT))  # fmt: skip
    logs = [tmp_path / ("scheduler-%d.log" % i) for i in range(3)]
    try:
        wait_for(lambda: all("scheduling" in p.read_text() for p in logs), timeout=20, what="three schedulers")
        began = time.time()
        time.sleep(RUN / 2)
        procs[0].kill()  # a scheduler, on node 0
        nodes[1].proc.kill()  # a node, the one scheduler 1 uses
        killed_at = time.time()
        time.sleep(RUN / 2)
        ended = time.time()
        for p in procs[1:]:
            assert p.poll() is None, "a scheduler died:\n" + logs[procs.index(p)].read_text()
    finally:
        for p in procs:
            if p.poll() is None:
                p.send_signal(signal.SIGTERM)
        for p in procs:
            try:
                p.wait(timeout=10)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()
    nodes[1].proc.wait()

    # Every job of the queue the nodes alive hold, by slot. Two schedulers may make a slot's
    # job on two nodes at once: same ID, copies merged, queued on one node only.
    ids_by_slot: dict[int, set[str]] = defaultdict(set)
    queued_by_slot: dict[int, list[int]] = defaultdict(list)
    bodies_by_slot: dict[int, set[str]] = defaultdict(set)
    for n in (nodes[0], nodes[2]):
        for job_id, body in jobs_on(n, "periodic").items():
            meta = json.loads(body)["meta"]
            slot = int(meta["dedup"].rsplit(":", 1)[1])
            ids_by_slot[slot].add(job_id)
            bodies_by_slot[slot].add(meta["nonce"])
        for job in n.client().execute_command("QPEEK", "periodic", 1000):
            queued_by_slot[int(json.loads(job[2])["meta"]["dedup"].rsplit(":", 1)[1])].append(n.port)
    twice = {s: ids for s, ids in ids_by_slot.items() if len(ids) > 1}
    assert not twice, "slots with two jobs: %s" % twice
    queued_twice = {s: ports for s, ports in queued_by_slot.items() if len(ports) > 1}
    assert not queued_twice, "slots queued on two nodes: %s" % queued_twice
    first = math.ceil(began / PERIOD) * PERIOD
    last = math.floor((ended - 1) / PERIOD) * PERIOD  # a slot that started 1 s before the end at least
    expected = set(range(first, last + 1, PERIOD))
    missing = sorted(expected - set(ids_by_slot))
    assert not missing, "slots missing (node and scheduler killed at %.1f): %s\n%s" % (
        killed_at, missing, "\n".join(p.read_text()[-3000:] for p in logs))
    assert len(expected) >= RUN // PERIOD - 2
    merged = sum(len(b) > 1 for b in bodies_by_slot.values())
    print("slots: %d, made on two nodes at once and merged: %d, queued on a live node: %d"
          % (len(ids_by_slot), merged, len(queued_by_slot)))
