"""The periodic scheduler against a real node, with a clock of the test's own."""

from __future__ import annotations

import json
import logging
import threading

import pytest

from disque_py.tasks import periodic
from disque_py.tasks.cron import Schedule
from disque_py.tasks.periodic import Scheduler, slot_key
from tests.integration.conftest import wait_for

from .standin import StandinApp

pytestmark = pytest.mark.integration


class Clock:
    def __init__(self, t: float) -> None:
        self.t = t

    def __call__(self) -> float:
        return self.t


@pytest.fixture
def node(start_node):
    """A node of its own for each test (the schedulers' queues and CONFIG changes stay there)."""
    return start_node()


def app_on(node, **client_options) -> StandinApp:
    return StandinApp("127.0.0.1:%d" % node.port, **client_options)


def bodies(node, queue: str) -> list[dict]:
    r = node.client()
    ids = r.execute_command("QPEEK", queue, 1000)
    return [json.loads(job[2]) for job in ids]


def test_slot_key():
    assert slot_key("myapp.tasks.cleanup", 1_700_000_000.0) == "periodic:myapp.tasks.cleanup:1700000000"
    assert slot_key("t", 1.5) == "periodic:t:1.500"


def test_each_slot_once_however_many_schedulers(node):
    clock = Clock(1_000_000.5)
    apps = [app_on(node) for _ in range(3)]
    for app in apps:
        app.periodic("cleanup", Schedule.every(10), queue="pq")
    schedulers = [Scheduler(app.periodic_tasks, clock=clock) for app in apps]
    for when in (1_000_000.5, 1_000_003, 1_000_010, 1_000_012, 1_000_020.2):
        clock.t = when
        for s in schedulers:
            wake = s.step()
            assert wake == s.entries[0].next_start
    # slots 1_000_000 (current when they started), 1_000_010, 1_000_020: each added by all three
    assert [s.added for s in schedulers] == [3, 3, 3]
    got = bodies(node, "pq")
    assert sorted(b["meta"]["dedup"] for b in got) == [
        "periodic:cleanup:1000000", "periodic:cleanup:1000010", "periodic:cleanup:1000020"]
    assert {b["task"] for b in got} == {"cleanup"} and all(b["v"] == 1 for b in got)
    # the three schedulers were answered the same ID for a slot
    sent = [app.tasks["cleanup"].sent for app in apps]
    assert sent[0] == sent[1] == sent[2] and len(set(sent[0])) == 3


def test_a_slot_done_and_acked_is_not_added_again_by_a_late_scheduler(node):
    clock = Clock(1_998_000.0)  # a whole hour (3600 x 555)
    first = app_on(node)
    first.periodic("report", Schedule.every(3600), queue="pq")
    assert Scheduler(first.periodic_tasks, clock=clock).step() == 2_001_600
    r = node.client()
    queue, job_id, _ = r.execute_command("GETJOB", "NOHANG", "FROM", "pq")[0]
    assert r.execute_command("ACKJOB", job_id) == 1
    wait_for(lambda: r.execute_command("SHOW", job_id) is None, what="the acked job gone")
    hits = int(r.info("stats")["dedup_hits"])
    # a worker starting 4 minutes into the slot: within the lateness, it adds the slot, which
    # the node still remembers (dedup-window after the ack): nothing new
    clock.t = 1_998_240.0
    late = app_on(node)
    late.periodic("report", Schedule.every(3600), queue="pq")
    s = Scheduler(late.periodic_tasks, clock=clock)
    s.step()
    assert s.added == 1 and late.tasks["report"].sent == [job_id.decode()]
    assert r.execute_command("QLEN", "pq") == 0 and int(r.info("stats")["dedup_hits"]) == hits + 1
    # one starting past the lateness (300 s) does not add that slot at all: the next one
    clock.t = 1_998_301.0
    later = app_on(node)
    later.periodic("report", Schedule.every(3600), queue="pq")
    s = Scheduler(later.periodic_tasks, clock=clock)
    assert s.step() == 2_001_600 and s.added == 0 and later.tasks["report"].sent == []


def test_lateness_is_bounded_by_the_slot_and_missed_slots_are_not_backfilled(node):
    clock = Clock(3_000_000.0)
    app = app_on(node)
    app.periodic("tick", Schedule.every(2), queue="pq")
    s = Scheduler(app.periodic_tasks, clock=clock)
    s.step()
    clock.t = 3_000_011.0  # the scheduler was stopped (a long GC pause, a suspended VM)
    s.step()
    # 3_000_002 .. 3_000_008 are past their lateness (2 s, the slot's length): not added;
    # the current slot is
    assert s.missed == 1 and s.added == 2
    assert sorted(b["meta"]["dedup"] for b in bodies(node, "pq")) == [
        "periodic:tick:3000000", "periodic:tick:3000010"]


def test_failed_adds_are_tried_again_until_the_slot_ends(node, caplog):
    clock = Clock(4_000_020.0)
    app = app_on(node)
    task = app.periodic("flaky", Schedule.every(60), queue="pq")
    real = task.send_with
    failures = [RuntimeError("connection reset"), RuntimeError("again")]

    def send_with(**options):
        if failures:
            raise failures.pop(0)
        return real(**options)

    task.send_with = send_with
    s = Scheduler(app.periodic_tasks, clock=clock)
    with caplog.at_level(logging.WARNING, logger="disque_py.tasks.periodic"):
        assert s.step() == 4_000_020 + periodic.RETRY_PAUSE
        assert s.step() == 4_000_020 + periodic.RETRY_PAUSE  # not before the pause
        clock.t += periodic.RETRY_PAUSE
        s.step()
        clock.t += periodic.RETRY_PAUSE
        assert s.step() == 4_000_080
    assert (s.failed, s.added, s.missed) == (2, 1, 0)
    assert "adding periodic:flaky:4000020 failed (attempt 1): connection reset" in caplog.text
    assert [b["meta"]["dedup"] for b in bodies(node, "pq")] == ["periodic:flaky:4000020"]

    # always failing: tried until the slot's lateness ends, then the next slot
    failures[:] = [RuntimeError("down")] * 1000
    clock.t = 4_000_080
    s.step()
    clock.t = 4_000_139.9
    s.step()
    clock.t = 4_000_140.0
    failures.clear()
    assert s.step() == 4_000_200 and s.missed == 1 and s.added == 2


def test_with_adder_threads_a_slot_that_waits_does_not_hold_up_the_next(node):
    # an ADDJOB can wait seconds for a copy (a node killed and not flagged yet): with adder
    # threads, the slot after it is added on time, and the waiting one when its ADDJOB returns
    clock = Clock(6_000_000.0)
    app = app_on(node)
    task = app.periodic("slow", Schedule.every(2), queue="pq")
    real = task.send_with
    release = threading.Event()
    waiting = threading.Event()

    def send_with(**options):
        if options["dedup"].endswith(":6000000"):
            waiting.set()
            assert release.wait(10)
        return real(**options)

    task.send_with = send_with
    s = Scheduler(app.periodic_tasks, clock=clock, adders=2)
    try:
        assert s.step() == 6_000_002  # slot 6_000_000 handed to a thread, the next is due at 2
        assert waiting.wait(5)
        clock.t = 6_000_002.5
        assert s.step() == 6_000_004
        wait_for(lambda: s.added == 1, what="the next slot added while the first waits")
        assert [b["meta"]["dedup"] for b in bodies(node, "pq")] == ["periodic:slow:6000002"]
        release.set()
        wait_for(lambda: s.added == 2, what="the waiting slot added")
        assert sorted(b["meta"]["dedup"] for b in bodies(node, "pq")) == [
            "periodic:slow:6000000", "periodic:slow:6000002"]
        assert s.missed == 0
    finally:
        release.set()
        s.close()


def test_an_adder_thread_gives_up_a_slot_when_its_lateness_ends(node):
    clock = Clock(7_000_000.0)
    app = app_on(node)
    task = app.periodic("down", Schedule.every(2), queue="pq")
    calls = []

    def send_with(**options):
        calls.append(options["dedup"])
        if len(calls) == 3:
            clock.t = 7_000_002.0  # the slot's lateness (2 s, its length) ends meanwhile
        raise RuntimeError("connection refused")

    task.send_with = send_with
    s = Scheduler(app.periodic_tasks, clock=clock, adders=1)
    try:
        s.step()
        wait_for(lambda: s.missed == 1, what="the slot given up")
        assert calls == ["periodic:down:7000000"] * 3 and s.added == 0 and s.failed == 3
    finally:
        s.close()


def test_norepl_for_too_few_nodes_adds_the_slot_with_fewer_copies(node, caplog):
    clock = Clock(5_000_040.0)
    app = app_on(node)
    app.periodic("sync", Schedule.every(60), queue="pq", replicate=3)  # one node: NOREPL
    s = Scheduler(app.periodic_tasks, clock=clock)
    with caplog.at_level(logging.WARNING, logger="disque_py.tasks.periodic"):
        assert s.step() == 5_000_100
    assert (s.added, s.failed) == (1, 1)
    assert "(1 reachable, 3 asked)" in caplog.text and "with REPLICATE 1" in caplog.text
    assert node.client().execute_command("QLEN", "pq") == 1


def test_lateness_stays_below_half_the_dedup_window(node):
    app = app_on(node)
    assert periodic.dedup_window(app.client()) == 600
    node.client().execute_command("CONFIG", "SET", "dedup-window", 100)
    assert periodic.dedup_window(app.client()) == 100
    app.periodic("t", Schedule.every(3600), queue="pq")
    seen = []
    original = periodic.Scheduler.run

    def run(self, stop):
        seen.append(self.lateness)

    periodic.Scheduler.run = run
    try:
        periodic.run_scheduler(app, threading.Event())
        periodic.run_scheduler(app, threading.Event(), lateness=30)
    finally:
        periodic.Scheduler.run = original
    assert seen == [50, 30]


def test_run_scheduler_in_a_thread_with_the_real_clock(node):
    app = app_on(node)
    app.periodic("every-second", Schedule.every(1), queue="pq")
    thread, stop = periodic.start_scheduler(app)
    try:
        wait_for(lambda: node.client().execute_command("QLEN", "pq") >= 3, timeout=10, what="three slots")
    finally:
        stop.set()
        thread.join(timeout=10)
    assert not thread.is_alive()
    keys = sorted(b["meta"]["dedup"] for b in bodies(node, "pq"))
    starts = [int(k.rsplit(":", 1)[1]) for k in keys]
    assert starts == list(range(starts[0], starts[0] + len(starts)))  # consecutive seconds, none twice


def test_an_app_without_periodic_tasks_returns_at_once(node):
    app = app_on(node)
    periodic.run_scheduler(app, threading.Event())  # returns: nothing to schedule
