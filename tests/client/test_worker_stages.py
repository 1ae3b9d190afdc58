"""The worker's stages that do no I/O, on their own: its settings, the fetch path's rounds, the
outcomes' answers, and what a stop does with the jobs in hand. (The stages at work, against
real nodes: test_worker.py, test_direct.py.)"""

from __future__ import annotations

import random
from collections import deque

import pytest
import trio

from disque_py.client import commands as cmd
from disque_py.client.errors import DisqueError, error_from_reply
from disque_py.client.model import Job
from disque_py.client.worker import DEFAULT_PAUSE_BACKOFF, Worker, WorkerSettings
from disque_py.client.worker.acks import Acks
from disque_py.client.worker.fetch import FetchPath, Round
from disque_py.client.worker.pause import FailureGate
from disque_py.client.worker.stats import Counters
from disque_py.client.worker.stop import Stop
from disque_py.client.worker.wakeup import Wakeup


def job(job_id: str) -> Job:
    return Job("q", job_id, b"body", 0, 0)


def test_settings_are_checked_when_made_and_keywords_replace_them():
    default = WorkerSettings()
    assert default.in_flight_limit == 2 and default.pause_backoff is DEFAULT_PAUSE_BACKOFF
    four = WorkerSettings.of(default, {"concurrency": 4})
    assert four.concurrency == 4 and four.in_flight_limit == 8  # the default follows, also in a copy
    assert WorkerSettings.of(WorkerSettings(max_in_flight=10), {"concurrency": 3}).in_flight_limit == 10
    assert WorkerSettings.of(default, {}) is default
    for bad, error in (
        (dict(concurrency=0), "concurrency must be >= 1"),
        (dict(concurrency=2, max_in_flight=1), r"max_in_flight \(1\) must be >= concurrency \(2\)"),
        (dict(max_attempts=0), r"max_attempts must be >= 1 \(or None\)"),
        (dict(fetch_timeout_ms=0), "fetch_timeout_ms must be >= 1"),
        (dict(backoff_after=0), "backoff_after must be >= 1"),
        (dict(backoff_ratio=1.5), r"backoff_ratio must be in \(0, 1\]"),
    ):
        with pytest.raises(ValueError, match=error):
            WorkerSettings(**bad)
        with pytest.raises(ValueError, match=error):  # the same through the worker's keywords
            Worker("127.0.0.1:1", "q", lambda j: None, **bad)
    with pytest.raises(TypeError, match=r"unexpected keyword argument\(s\): colour, size"):
        Worker("127.0.0.1:1", "q", lambda j: None, size=1, colour="red")
    w = Worker("127.0.0.1:1", "q", lambda j: None, settings=WorkerSettings(concurrency=2, max_attempts=9),
               max_attempts=3)  # fmt: skip
    assert (w.settings.concurrency, w.settings.max_attempts, w.concurrency, w.max_in_flight) == (2, 3, 2, 4)


def test_a_round_carries_the_outcomes_before_its_getjob_and_reads_its_replies():
    path = FetchPath(["q1", "q2"], max_in_flight=8)
    assert path.free(in_flight=8, pending=3) == 3  # the round's outcomes free their slots first
    nack = cmd.nack_argv(["D-3"], delay=1.5, reason="boom")
    rnd = path.round([("ack", ["D-1", "D-2"]), ("retry", [("retry", job("D-3"), nack)])], 3)
    assert rnd.argvs() == [
        (b"ACKJOB", "D-1", "D-2"),  # IDs as they are: a raw connection's packer encodes them
        (b"NACK", b"D-3", b"DELAY", b"1.5", b"REASON", b"boom"),
        (b"GETJOB", b"NOHANG", b"COUNT", 3, b"WITHCOUNTERS", b"FROM", b"q1", b"q2"),
    ]
    assert path.round([], 3).calls() == [rnd.getjob] and path.getjob(3) is rnd.getjob  # one call per count
    calls = rnd.calls()  # the same commands, as the client's pipeline takes them
    assert [c.argv for c in calls] == [(b"ACKJOB", b"D-1", b"D-2"), *rnd.argvs()[1:]] and calls[0].parse(b"2") == 2
    got = rnd.jobs_of([[b"q1", b"D-9", b"body", b"nacks", 1, b"additional-deliveries", 2]])
    [job9] = Round.jobs([2, got])
    assert (job9.queue, job9.id, job9.body, job9.attempt) == ("q1", "D-9", b"body", 4)
    counts = Counters()
    assert path.took(counts, [job9], 3) is True  # fewer than asked for: starved
    assert path.took(counts, [job9] * 3, 3) is False
    assert counts.fetched == counts.in_flight == 4
    for garbage in (b"not a list", [[b"q", 42]]):  # errors and unreadable replies are values...
        with pytest.raises(DisqueError, match="unreadable GETJOB reply"):
            Round.jobs([1, rnd.jobs_of(garbage)])  # ... raised when the jobs are asked for
    refused = error_from_reply("NOREPL Timeout reached")
    assert rnd.jobs_of(refused) is refused
    with pytest.raises(DisqueError, match="NOREPL"):
        Round.jobs([refused])


def make_acks(counters: Counters, buffer: deque | None = None) -> Acks:
    return Acks(None, counters, buffer if buffer is not None else deque(), max_in_flight=4, fast_ack=True,
                fetch_wake=Wakeup())  # fmt: skip


def test_a_refused_nack_with_options_goes_back_plain_and_a_node_without_them_is_remembered():
    counters = Counters()
    counters.in_flight, counters.dead = 3, 1
    acks = make_acks(counters)
    acks.ack(job("D-2"))
    acks.nack_with("dead", job("D-1"), cmd.nack_argv(["D-1"], reason="x", dead=True))
    groups = acks.take()
    assert [op for op, _ in groups] == ["fast_ack", "retry"] and acks.pending() == 0
    acks.answered(groups, [1, error_from_reply("BADID Invalid Job ID format")])  # Disque's NACK
    assert acks.legacy and acks.nacks == ["D-1"]  # sent again plain: the job is never lost
    assert (counters.in_flight, counters.ack_errors, counters.dead, counters.retried) == (2, 1, 0, 1)
    acks.put_back(groups)  # not sure they were sent (cancelled): they go again
    assert acks.acks == ["D-2"] and len(acks.retries) == 1 and acks.pending() == 3


def test_a_node_without_nacks_trace_gets_the_same_nack_without_it():
    """An older disque-py node refuses TRACE alone ("syntax error near 'TRACE'"): the NACK goes
    again without it (its DELAY, REASON or DEAD kept), and no NACK carries one from then on."""
    counters = Counters()
    counters.in_flight, counters.dead = 2, 1
    acks = make_acks(counters)
    acks.nack_with("retry", job("D-1"), cmd.nack_argv(["D-1"], delay=1, reason="x", trace="tb"))
    acks.nack_with("dead", job("D-2"), cmd.nack_argv(["D-2"], reason="y", trace="tb", dead=True))
    groups = acks.take()
    refused = error_from_reply("ERR syntax error near 'TRACE'")
    acks.answered(groups, [refused, refused])
    assert not acks.takes_trace and not acks.legacy and acks.nacks == []
    assert [(kind, argv) for kind, _, argv in acks.retries] == [
        ("retry", (b"NACK", b"D-1", b"DELAY", b"1", b"REASON", b"x")),
        ("dead", (b"NACK", b"D-2", b"REASON", b"y", b"DEAD"))]  # fmt: skip
    assert (counters.in_flight, counters.ack_errors, counters.dead) == (2, 0, 1)  # still in flight, still dead
    acks.answered(acks.take(), [1, 1])
    assert counters.in_flight == 0 and acks.pending() == 0


def test_a_stop_halts_the_threads_before_it_gives_back_the_jobs_not_started():
    counters = Counters()
    buffer = deque([job("D-1"), job("D-2")])
    acks = make_acks(counters, buffer)
    gate = FailureGate(DEFAULT_PAUSE_BACKOFF, 20, random.Random())
    gate.state, gate.probe = FailureGate.PROBING, "D-2"
    stop = Stop(5.0, counters, acks, gate, buffer, acks.fetch_wake)
    seen_at_halt: list[int] = []
    stop.halts.append(lambda: seen_at_halt.append(len(buffer)))

    async def main() -> None:
        stop.now(None)

    trio.run(main)
    assert stop.stopping and stop.event.is_set() and seen_at_halt == [2]
    assert not buffer and acks.releases == {None: ["D-1", "D-2"]} and not acks.nacks
    assert counters.released == 2 and counters.retried == 0
    assert gate.probe is None  # the probe was given back without running: another will be fetched


def test_a_job_given_back_goes_to_the_node_it_came_from():
    """While the client stays on one node nothing is kept; once it moved, the jobs still buffered
    keep the node they came from, and only those (the others go to where the client is)."""
    counters = Counters()
    buffer: deque = deque()
    acks = make_acks(counters, buffer)
    stop = Stop(5.0, counters, acks, FailureGate(DEFAULT_PAUSE_BACKOFF, 20, random.Random()), buffer, Wakeup())
    a, b = ("127.0.0.1", 7711), ("127.0.0.1", 7712)
    stop.fetched(a)
    buffer.extend([job("D-1"), job("D-2")])
    stop.fetched(a)
    assert stop.earlier == {}  # the same node: nothing to remember
    stop.fetched(b)  # the client moved: D-1 and D-2 came from a
    buffer.append(job("D-3"))
    assert stop.earlier == {"D-1": a, "D-2": a}
    buffer.popleft()  # D-1 starts; the client moves once more (not known where D-4 came from)
    stop.fetched(None)
    buffer.append(job("D-4"))
    assert stop.earlier == {"D-2": a, "D-3": b}
    for _ in range(3):
        stop.give_back(buffer.popleft())
    assert acks.releases == {a: ["D-2"], b: ["D-3"], None: ["D-4"]} and not stop.earlier
    assert counters.released == 3 and counters.retried == 0


class ReleasingClient:
    """A node's answers to RELEASE and ENQUEUE, for the acker; ``knows_release=False``: Disque's."""

    def __init__(self, knows_release: bool) -> None:
        self.knows_release = knows_release
        self.sent: list[tuple[str, ...]] = []
        self.current_address = ("127.0.0.1", 7711)

    async def release(self, *ids):
        await trio.sleep(0)
        self.sent.append(("RELEASE", *ids))
        if not self.knows_release:
            raise error_from_reply("ERR unknown command 'RELEASE'")
        return len(ids)

    async def enqueue(self, *ids):
        await trio.sleep(0)
        self.sent.append(("ENQUEUE", *ids))
        return len(ids)


@pytest.mark.parametrize("knows_release", [True, False])
def test_the_acker_gives_back_with_one_release_per_node_or_enqueue_on_a_disque_node(knows_release, caplog):
    counters = Counters()
    counters.in_flight = 5
    client = ReleasingClient(knows_release)
    acks = Acks(client, counters, deque(), max_in_flight=8, fast_ack=False, fetch_wake=Wakeup())

    async def main() -> None:
        async with trio.open_nursery() as nursery:
            nursery.start_soon(acks.run)
            for n in (1, 2, 3):
                acks.release(job("D-%d" % n), None)
            acks.release(job("D-4"), client.current_address)
            while counters.in_flight > 1:
                await trio.sleep(0.01)
            acks.release(job("D-5"), None)  # later: a node known not to have RELEASE gets ENQUEUE at once
            acks.done = True
            acks.wake.fire()

    with caplog.at_level("INFO", logger="disque_py.worker"):
        trio.run(main)
    assert counters.in_flight == 0 and counters.ack_errors == 0 and not acks.releases
    # one command for the node: None is the client's node, whose address D-4 names
    if knows_release:
        assert client.sent == [("RELEASE", "D-1", "D-2", "D-3", "D-4"), ("RELEASE", "D-5")]
        assert "RELEASE" not in caplog.text
    else:
        assert client.sent == [("RELEASE", "D-1", "D-2", "D-3", "D-4"), ("ENQUEUE", "D-1", "D-2", "D-3", "D-4"),
                               ("ENQUEUE", "D-5")]  # fmt: skip
        assert caplog.text.count("does not know RELEASE") == 1  # logged once for the node
