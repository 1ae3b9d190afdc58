"""A job's deadlines (``retry_deadline``, ``gc_deadline``), its one ``next_at`` slot read by
state, the table of its state's moves (``job.TRANSITIONS``), and the RETRY it gets when ADDJOB
names none (``constants.default_retry``)."""

from __future__ import annotations

import random

import pytest

from disque_py.core.constants import DEFAULT_TTL, default_retry
from disque_py.core.job import (
    ACKED, ACTIVE, GC_RETRY_MAX_MS, GC_RETRY_MIN_MS, QUEUED, STATE_NAMES, TIME_ERROR_MS, TRANSITIONS, WAIT_REPL,
    IllegalTransition, Job, gc_deadline, illegal_transitions, retry_deadline,
)  # fmt: skip

from .conftest import Harness

PEER = "f" * 40
ID = b"D" + b"0" * 39


def extremes(fn, job: Job, start: int) -> tuple[int, int]:
    """The earliest and latest deadline ``fn`` gives, over the whole range of the random draw."""
    return fn(job, start, lambda bits: 0), fn(job, start, lambda bits: TIME_ERROR_MS - 1)


def test_a_retry_period_lasts_retry_seconds_give_or_take_the_time_error():
    job = Job(ID, ACTIVE, b"q", b"b", retry=30)
    low, high = extremes(retry_deadline, job, 5_000)
    assert (low, high) == (5_000 + 30_000 - TIME_ERROR_MS // 2, 5_000 + 30_000 + TIME_ERROR_MS // 2 - 1)
    rng = random.Random(1)
    draws = {retry_deadline(job, 5_000, rng.getrandbits) for _ in range(200)}
    assert min(draws) >= low and max(draws) <= high and len(draws) > 50  # spread, not one value


@pytest.mark.parametrize("ttl, retry", [(None, 300), (1, 1), (9, 1), (10, 1), (25, 2), (100, 10), (2999, 299),
                                        (3000, 300), (5000, 300), (DEFAULT_TTL * 30, 300)])  # fmt: skip
def test_an_addjob_naming_no_retry_gets_disques_default(h: Harness, ttl, retry):
    """A tenth of its TTL, at most 300 s, at least 1 s (Disque's addjobCommand): decided by one
    function, which the task layer asks too (tasks/app.py)."""
    opts = () if ttl is None else ("TTL", ttl)
    job_id = h.cmd("ADDJOB", "q", "b", 0, *opts)
    assert h.node.store.get(job_id).retry == retry == default_retry(DEFAULT_TTL if ttl is None else ttl)
    assert h.cmd("ADDJOB", "q", "b", 0, *opts, "RETRY", 7) and h.node.store.get(h.cmd("QPEEK", "q", -1)[0][1]).retry == 7


def test_gc_attempts_back_off_from_one_second_doubling_up_to_three_minutes():
    job = Job(ID, ACKED)
    middle = lambda bits: TIME_ERROR_MS // 2  # noqa: E731  (no error: the backoff alone)
    waits = []
    for attempts in range(12):
        job.gc_retry = attempts
        waits.append(gc_deadline(job, 1_000, middle) - 1_000)
    assert waits[:4] == [GC_RETRY_MIN_MS, 2 * GC_RETRY_MIN_MS, 4 * GC_RETRY_MIN_MS, 8 * GC_RETRY_MIN_MS]
    assert waits[-1] == GC_RETRY_MAX_MS and max(waits) == GC_RETRY_MAX_MS
    job.gc_retry = 0
    half = TIME_ERROR_MS // 2
    assert extremes(gc_deadline, job, 0) == (GC_RETRY_MIN_MS - half, GC_RETRY_MIN_MS + half - 1)


def test_next_at_reads_as_the_requeue_or_the_gc_attempt_by_state():
    job = Job(ID, QUEUED, b"q", b"b", retry=5, next_at=7_000)
    assert (job.requeue_at, job.gc_at) == (7_000, 0)
    job.set_state(ACTIVE)
    job.set_state(ACKED)
    assert (job.requeue_at, job.gc_at) == (0, 7_000)  # the same slot, now the next GC attempt


def test_the_table_covers_every_state_and_acked_is_never_left():
    assert set(TRANSITIONS) == set(range(len(STATE_NAMES)))
    assert TRANSITIONS[ACKED] == {}
    for src, moves in TRANSITIONS.items():
        assert src not in moves  # a move changes the state
        assert WAIT_REPL not in moves  # only ADDJOB makes a job in wait-repl
        assert all(reason for reason in moves.values())


@pytest.mark.parametrize("src", [WAIT_REPL, ACTIVE, QUEUED, ACKED])
def test_set_state_refuses_every_move_the_table_lacks(src):
    try:
        for to in range(len(STATE_NAMES)):
            job = Job(ID, src)
            if to in TRANSITIONS[src]:
                job.set_state(to)
                assert job.state == to
            else:
                move = "%s -> %s is not a legal transition" % (STATE_NAMES[src], STATE_NAMES[to])
                with pytest.raises(IllegalTransition, match=move):
                    job.set_state(to)
                assert job.state == src
                assert illegal_transitions[-1].startswith("job %r: %s -> %s" % (ID, STATE_NAMES[src], STATE_NAMES[to]))
    finally:
        illegal_transitions.clear()  # made on purpose here, on jobs of no node


def test_a_retry0_job_dequeued_is_not_queued_again_but_a_handed_over_one_is(h: Harness):
    """``next_at`` 0 refuses an ENQUEUE (queued here once); a hand-over (the ENQUEUE message)
    queues its copy here as a fresh one, as before ``fresh`` replaced ``next_at = now``."""
    job_id = h.add("q", "once", "RETRY", 0)
    job = h.node.store.get(job_id)
    assert h.cmd("DEQUEUE", job_id) == 1 and job.state == ACTIVE and job.next_at == 0
    assert h.cmd("ENQUEUE", job_id) == 0 and job.state == ACTIVE
    h.node.receive_data(PEER, "ENQUEUE", [job_id, 0], h.now)
    assert job.state == QUEUED and job.next_at == 0
    assert h.cmd("GETJOB", "FROM", "q") == [[b"q", job_id, b"once"]]
    h.node.receive_data(PEER, "ENQUEUE", [job_id, 0], h.now)
    assert job.state == ACTIVE  # delivered here once: never queued again


def test_wake_ups_due_together_run_a_bounded_batch_a_tick_and_every_one_runs(h: Harness):
    """A tick runs at most ``SCHEDULE_BATCH`` job wake-ups (a slice of the shell's loop); the rest stay
    due (``next_wakeup`` at or before now), and ticks at the same time run them all, earliest first."""
    from disque_py.core.job import TIME_ERROR_MS
    from disque_py.core.node import SCHEDULE_BATCH

    n = SCHEDULE_BATCH * 5 + 3
    ids = [h.add("burst", "b%d" % i, "RETRY", 1) for i in range(n)]
    assert len(h.cmd("GETJOB", "NOHANG", "COUNT", n, "FROM", "burst")) == n  # all active at once
    h.effects()
    due_at = h.now + 1000 + TIME_ERROR_MS  # past every one's requeue, whatever its random part
    h.now = due_at
    node = h.node
    ticks = 0
    while node.next_wakeup() is not None and node.next_wakeup() <= due_at:
        queued = h.cmd("QLEN", "burst")
        node.tick(due_at)
        ticks += 1
        assert 0 < h.cmd("QLEN", "burst") - queued <= SCHEDULE_BATCH and ticks <= n
    assert ticks >= 6 and h.cmd("QLEN", "burst") == n  # every requeue ran, in slices
    assert all(node.store.get(i).state == QUEUED for i in ids)
