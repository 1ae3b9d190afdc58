"""The pure parts of revoke/cancel/progress: notices, a progress report, what a beat carries."""

from __future__ import annotations

import json

import pytest

from disque_py.client.worker.beacon import Beacon
from disque_py.client.worker.control import cancel_notice, control_queue, read_notice
from disque_py.client.workers import from_entry
from disque_py.tasks import TaskContext, TaskRevoked
from disque_py.tasks.results import unwrap
from disque_py.tasks.message import Outcome


def test_a_notice_round_trips_and_hostile_bodies_read_as_nothing():
    assert control_queue("h:1:ab") == "@control:h:1:ab"
    assert read_notice(cancel_notice("D-1")) == "D-1"
    for body in (b"", b"\xff\xfe", b"[1]", b'{"cancel": 5}', b'{"cancel": ""}', b'{"cancel": "' + b"x" * 65 + b'"}',
                 b"[" * 100000, b"null", None):
        assert read_notice(body) is None, body


def test_progress_is_checked_and_goes_to_the_reporter():
    got = []
    ctx = TaskContext(None, "D-1", "q", (), {}, {}, 1, False, reporter=lambda *a: got.append(a))
    ctx.progress(3, 10, "rows")
    assert got == [("D-1", 3, 10, "rows")]
    with pytest.raises(ValueError, match="finite"):
        ctx.progress(float("nan"))
    with pytest.raises(TypeError, match="number"):
        ctx.progress("3")
    with pytest.raises(TypeError, match="note"):
        ctx.progress(1, 2, 3)
    TaskContext(None, "", "q", (), {}, {}, 1, False).progress(1)  # called directly: nothing


def test_a_beat_carries_progress_only_for_jobs_that_report_it():
    class Job:
        def __init__(self, job_id):
            self.id, self.queue = job_id, "q"

    stats = type("S", (), dict(processed=0, failed=0, retried=0, dead=0, fetched=0, in_flight=0))
    beacon = Beacon(None, "w", 5, queues=["q"], concurrency=2, max_in_flight=4, handler="h", stats=stats,
                    stopping=lambda: False)  # fmt: skip
    jobs = {}

    async def run(job):  # a coroutine with a frame: "running"
        pass

    for job_id in ("a", "b"):
        coro = run(Job(job_id))
        jobs[job_id] = coro
        beacon.jobs[id(coro)] = (Job(job_id), 1.0, coro)
    plain = beacon.info()
    assert all("progress" not in entry for entry in plain["running"])
    beacon.report("a", 1, 4, "x" * 500)
    beacon.report("gone", 1)
    info = beacon.info()
    by_id = {e["id"]: e for e in info["running"]}
    assert by_id["a"]["progress"]["done"] == 1 and len(by_id["a"]["progress"]["note"]) == 200
    assert "progress" not in by_id["b"] and "gone" not in beacon.progress  # a job that ended is dropped
    view = from_entry({"id": "w", "info": json.loads(beacon.encoded())}, "n")
    assert view.running[0].progress["total"] == 4 and view.running[0].progress_text().startswith("1/4 x")
    for coro in jobs.values():
        coro.close()


def test_lenient_progress_and_the_revoked_error():
    view = from_entry({"id": "w", "info": {"running": [{"id": "j", "progress": {"done": "x"}},
                                                        {"id": "k", "progress": {"done": 2, "total": True}}]}}, "n")
    assert view.running[0].progress is None and view.running[1].progress == {"done": 2, "total": None, "note": None}
    with pytest.raises(TaskRevoked, match="^TaskRevoked: gone$"):
        unwrap(Outcome(False, None, "TaskRevoked", "gone"), "D-1")
