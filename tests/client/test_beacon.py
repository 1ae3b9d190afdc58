"""The worker's beats (client/worker/beacon.py) and what the programs make of WORKER LIST
(client/workers.py), without I/O; the same on real processes: tests/integration/test_workers_process.py.

A node that does not know WORKER is Disque 1.0-rc1 itself, which these tests cannot start: its
answer is given by a stand-in client (``ERR unknown command 'WORKER'``, Disque's text)."""

from __future__ import annotations

import json
import logging

import pytest
import trio

from disque_py.client import workers as wk
from disque_py.client.errors import CommandError, ConnectionLost, ServerError
from disque_py.client.model import Job
from disque_py.client.worker import WorkerSettings, WorkerStats
from disque_py.client.worker.beacon import MAX_INFO, Beacon, make_worker_id, worker_client_name
from disque_py.server.workers import MAX_INFO as NODE_MAX_INFO

STATS = WorkerStats(fetched=9, processed=7, failed=1, retried=1, dead=0, in_flight=2, running=2, backoffs=0,
                    ack_errors=0, starved=False)  # fmt: skip


class StandIn:
    """Answers WORKER BEAT with ``errors`` in turn (None: +OK)."""

    def __init__(self, *errors) -> None:
        self.errors = list(errors)
        self.beats: list[tuple] = []

    async def worker_beat(self, worker_id, interval, info):
        self.beats.append((worker_id, interval, json.loads(info)))
        error = self.errors.pop(0) if self.errors else None
        if error is not None:
            raise error
        return "OK"


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def beacon(client=None, **kw) -> Beacon:
    options = dict(queues=["q1", "q2"], concurrency=4, max_in_flight=8, handler="mod:fn", stats=lambda: STATS,
                   stopping=lambda: False, clock=Clock())  # fmt: skip
    options.update(kw)
    return Beacon(client or StandIn(), "h:1:abc", 0.5, **options)


async def _handler(job):
    await trio.sleep(1)


def start(b: Beacon, job: Job, since: float):
    """``job``'s handler handed to a runner at ``since`` (as Runners call it); its coroutine."""
    b.clock.now = since
    return b.track(_handler)(job)


def test_an_async_handlers_jobs_are_listed_while_their_coroutine_runs_and_swept_after():
    b = beacon(concurrency=2)
    first = start(b, Job("q1", "D-1", b""), 990.0)
    second = start(b, Job("q1", "D-2", b""), 995.0)
    assert [(job.id, since) for job, since in b.running()] == [("D-1", 990.0), ("D-2", 995.0)]
    first.close()  # done (returned, raised or cancelled: its frame is gone)
    assert [job.id for job, _ in b.running()] == ["D-2"]
    for i in range(30):  # quick jobs: the table is swept, never longer than 2 x concurrency + 16 + 1
        start(b, Job("q2", "D-q%d" % i, b""), 996.0 + i).close()
        assert len(b.jobs) <= 2 * 2 + 16 + 1
    assert [job.id for job, _ in b.running()] == ["D-2"]
    second.close()


def test_a_beat_says_who_the_worker_is_what_it_runs_and_its_counters():
    b = beacon(describe=lambda job: "task:" + job.queue)
    coros = [start(b, Job("q1", "D-1", b""), 990.0), start(b, Job("q2", "D-2", b""), 980.0)]
    b.clock.now = 1000.0
    info = json.loads(b.encoded())
    for coro in coros:
        coro.close()
    assert info["running"] == [{"id": "D-2", "queue": "q2", "since": 980.0, "label": "task:q2"},
                               {"id": "D-1", "queue": "q1", "since": 990.0, "label": "task:q1"}]  # fmt: skip
    assert {k: info[k] for k in ("id", "queues", "concurrency", "max_in_flight", "handler", "interval", "processed",
                                 "failed", "retried", "dead", "fetched", "in_flight", "stopping", "running_total",
                                 "started")} == {  # fmt: skip
        "id": "h:1:abc", "queues": ["q1", "q2"], "concurrency": 4, "max_in_flight": 8, "handler": "mod:fn",
        "interval": 0.5, "processed": 7, "failed": 1, "retried": 1, "dead": 0, "fetched": 9, "in_flight": 2,
        "stopping": False, "running_total": 2, "started": 1000.0}  # the clock when the beacon was made
    assert isinstance(info["pid"], int) and info["host"]


def test_a_beat_stays_under_the_nodes_limit_however_much_runs():
    b = beacon(describe=lambda job: "x" * 10_000, queues=["queue-%d-%s" % (i, "y" * 300) for i in range(500)],
               concurrency=5000)  # fmt: skip
    coros = [start(b, Job("q" * 500, "D-%d" % i, b""), 1000.0 - i) for i in range(5000)]
    body = b.encoded()
    for coro in coros:
        coro.close()
    info = json.loads(body)
    assert len(body) <= MAX_INFO < NODE_MAX_INFO
    assert info["running_total"] == 5000 and 0 < len(info["running"]) <= 100
    assert all(len(r["label"]) == 200 and len(r["queue"]) == 200 for r in info["running"])
    assert info["running"][0]["id"] == "D-4999"  # the oldest first


def test_a_broken_describe_leaves_labels_empty_and_is_logged_once(caplog):
    b = beacon(describe=lambda job: 1 / 0)
    coros = [start(b, Job("q", "D-1", b""), 1.0), start(b, Job("q", "D-2", b""), 2.0)]
    with caplog.at_level(logging.WARNING, "disque_py.worker"):
        assert [r["label"] for r in b.info()["running"]] == ["", ""]
        b.info()
    for coro in coros:
        coro.close()
    assert len([r for r in caplog.records if "describe(job) failed" in r.message]) == 1


async def test_a_node_without_the_command_turns_the_beacon_off_after_one_line(caplog):
    client = StandIn(CommandError("unknown command 'WORKER'"))
    b = beacon(client)
    with caplog.at_level(logging.INFO, "disque_py.worker"):
        with trio.fail_after(5):
            await b.run()  # returns: no more beats
    assert b.off and len(client.beats) == 1 and not await b.beat()
    assert [r.message for r in caplog.records if "does not take WORKER BEAT" in r.message] == [
        "worker h:1:abc: the node does not take WORKER BEAT (ERR unknown command 'WORKER'); it is not listed by "
        "`disque-py workers`, and runs on"]
    await b.forget()  # nothing to forget, nothing sent


async def test_other_failures_are_logged_once_and_the_beats_go_on(caplog):
    client = StandIn(ConnectionLost("down", ("h", 1)), ServerError("too many workers", "ERR"),
                     ServerError("too many workers", "ERR"), None, None)  # fmt: skip
    b = beacon(client)
    with caplog.at_level(logging.INFO, "disque_py.worker"):
        for _ in range(5):
            assert await b.beat()
    # no node reachable: the fetcher's to say; a refusal: said once, and when it is over
    failed = [r.message for r in caplog.records if "a beat failed" in r.message]
    again = [r for r in caplog.records if "beats reach the cluster again" in r.message]
    assert failed == ["worker h:1:abc: a beat failed (ERR too many workers); trying again every 0.5s"]
    assert len(again) == 1 and b.beats == 2 and not b.off


def test_the_ids_and_names_are_what_the_node_accepts():
    a, b = make_worker_id(), make_worker_id()
    assert a != b and a.rsplit(":", 1)[0] == b.rsplit(":", 1)[0]
    for text in (a, worker_client_name()):
        assert text and all(32 < ord(c) < 127 for c in text)
    assert worker_client_name().startswith("disque-py-worker:")


def test_settings_and_the_exit_line():
    assert WorkerSettings().beacon_interval == 5.0 and WorkerSettings(beacon_interval=None).beacon_interval is None
    for bad in (0, 0.05, -1, 86401):
        with pytest.raises(ValueError, match="beacon_interval must be between 0.1 and 86400 seconds"):
            WorkerSettings(beacon_interval=bad)
    assert str(STATS) == ("processed=7 failed=1 retried=1 dead=0 released=0 fetched=9 in_flight=2 running=2 "
                          "backoffs=0 ack_errors=0")  # fmt: skip


# ---------------------------------------------------------------- the programs' side
def entry(worker_id: str, ago: float, **info) -> bytes:
    return json.dumps({"id": worker_id, "addr": "127.0.0.1:1", "client_id": 1, "interval_ms": 2000,
                       "last_beat_ago": ago, "beats": 3, "info": info}).encode()  # fmt: skip


def test_the_nodes_answers_are_merged_by_worker_freshest_beat_first():
    merged = wk.merge([
        ("n1", [entry("b:2:x", 4.0, host="b", pid=2, processed=1), entry("a:1:x", 0.5, host="a", pid=1)]),
        ("n2", [entry("b:2:x", 0.2, host="b", pid=2, processed=5, running=[{"id": "D-1", "queue": "q", "since": 1.0}]),
                b"not json", b'"a string"', entry("", 1.0)]),
        ("n3", CommandError("unknown command 'WORKER'")),  # Disque's own: nothing to add
    ])  # fmt: skip
    assert [(w.id, w.node, w.nodes, w.processed) for w in merged] == [
        ("a:1:x", "n1", ["n1"], 0), ("b:2:x", "n2", ["n1", "n2"], 5)]
    b = merged[1]
    assert b.interval == 2.0 and b.running_total == 1 and b.label_of(b.running[0]) == ""
    assert b.as_json(11.0)["running"] == [{"id": "D-1", "queue": "q", "since": 1.0, "label": "", "running_for": 10.0,
                                            "progress": None}]


def test_an_entry_of_another_shape_is_read_leniently():
    odd = {"id": "w", "info": {"pid": "7", "queues": "q", "running": [{"id": 5}, "x", {"id": "D-1", "since": "no"}],
                               "stopping": "yes", "concurrency": True}}  # fmt: skip
    w = wk.from_entry(odd, "n")
    assert (w.pid, w.queues, w.stopping, w.concurrency, [r.id for r in w.running]) == (0, [], False, 0, ["D-1"])
    assert w.running[0].as_json(5.0)["running_for"] is None
    assert wk.from_entry({"info": {}}, "n") is None and wk.parse_list(b"oops") == []
    ages = [wk.age_text(s) for s in (None, 0.25, 42, 192, 7500, 270000)]
    assert ages == ["-", "0.2s", "42s", "3m12s", "2h05m", "3d03h"]
