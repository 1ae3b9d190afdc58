"""The job table and the wake-up schedule (``core/store.py``), against a plain model.

The store's promises: ``pop_due`` returns each due job once, earliest first, and
never a job that was unregistered or moved later; the heap holds each scheduled
job once, in place (no stale entries, nothing to rebuild); JSCAN cursors see
every job present for the whole scan exactly once.
"""

from __future__ import annotations

import random

import pytest

from disque_py.core.job import Job
from disque_py.core.store import SHARDS, JobStore


def job(i: int) -> Job:
    return Job(b"D-%038d" % i, 0)


def scheduled(n: int, at: int) -> tuple[JobStore, list[Job]]:
    """A store of n jobs, all due at ``at``."""
    store = JobStore()
    jobs = [job(i) for i in range(n)]
    for j in jobs:
        store.register(j)
        store.schedule(j, at)
    return store, jobs


def test_table_lookups_count_and_duplicates():
    store = JobStore()
    jobs = [job(i) for i in range(1000)]
    assert all(store.register(j) for j in jobs)
    assert not store.register(job(5))  # same ID
    assert len(store) == 1000 and jobs[7].id in store and store.get(jobs[7].id) is jobs[7]
    assert store.get(b"D-nope") is None and b"D-nope" not in store
    assert sorted(j.seq for j in store.values()) == list(range(1, 1001))
    assert {k for k, _ in store.items()} == {j.id for j in jobs}
    assert store.unregister(jobs[7]) and not store.unregister(jobs[7])
    assert len(store) == 999 and jobs[7].id not in store
    used = {i for i, shard in enumerate(store._shards) if shard}
    assert len(used) > SHARDS // 2  # IDs spread over the shards


def _heap_ok(store: JobStore) -> None:
    """The heap's invariant: every job knows its index, and no child comes before its parent."""
    heap = store._heap
    for i, j in enumerate(heap):
        assert j.hpos == i and j.awake > 0
        if i:
            parent = heap[(i - 1) >> 1]
            assert (parent.awake, parent.seq) <= (j.awake, j.seq)


@pytest.mark.parametrize("seed", range(8))
def test_schedule_matches_a_model(seed):
    """Random schedules, reschedules (earlier and later), unregistrations and pops: what pop_due
    returns is exactly what a dict of wake-up times says is due, in time order, and the heap
    holds each scheduled job exactly once."""
    rng = random.Random(seed)
    store = JobStore()
    model: dict[bytes, int] = {}  # job ID -> wake-up time, for scheduled and registered jobs
    live: list[Job] = []
    now = 1000
    for step in range(30_000):
        r = rng.random()
        if r < 0.12 or not live:
            j = job(step)
            store.register(j)
            live.append(j)
        elif r < 0.75:
            j = rng.choice(live)
            at = now + (rng.randint(1, 400) if rng.random() < 0.5 else rng.randint(10**6, 2 * 10**6))
            store.schedule(j, at)
            model[j.id] = at
        elif r < 0.80:
            k = rng.randrange(len(live))
            live[k], live[-1] = live[-1], live[k]
            j = live.pop()
            store.unregister(j)
            model.pop(j.id, None)
            assert j.hpos == -1 and j.awake == 0
        else:
            now += rng.randint(0, 60)
            limit = rng.choice((3, 10000))
            due = store.pop_due(now, limit=limit)
            seqs = {j.id: j.seq for j in live}
            expected = sorted((at, seqs[jid]) for jid, at in model.items() if at <= now)
            assert len(due) == min(len(expected), limit)
            assert [(model[j.id], j.seq) for j in due] == expected[: len(due)]
            for j in due:
                del model[j.id]  # taken: not scheduled until the caller says so
        assert store.timer_entries == len(model)  # one slot per scheduled job, no stale entries
        if step % 1000 == 0:
            _heap_ok(store)
        assert store.next_awake() == (min(model.values()) if model else None)
    _heap_ok(store)


def test_rescheduling_never_grows_the_heap():
    """A job rescheduled many times takes one slot (the old heap kept one entry per scheduling,
    stale ones included, and had to be rebuilt); a job scheduled before it was registered, or
    unregistered, is never returned."""
    store, jobs = scheduled(20_000, 5000)
    for n in range(60_000):
        store.schedule(jobs[n % len(jobs)], 6000 + (n * 7919) % 50_000)
    assert store.timer_entries == len(jobs)
    _heap_ok(store)
    stray = job(10**6)
    store.schedule(stray, 1)  # not registered: skipped when due
    gone = jobs[5]
    store.unregister(gone)
    due = store.pop_due(10**9, limit=10**6)
    assert stray not in due and gone not in due
    assert sorted(j.seq for j in due) == sorted(j.seq for j in jobs if j is not gone)  # each once
    assert [j.awake for j in due] == [0] * len(due) and store.timer_entries == 0
    late = job(10**6 + 1)
    store.schedule(late, 700)  # scheduled, then registered: its tie-break (seq) changes in place
    store.register(late)
    _heap_ok(store)
    assert store.pop_due(700) == [late]


def test_scan_cursors_return_every_job_present_for_the_whole_scan_once():
    store = JobStore()
    jobs = [job(i) for i in range(3000)]
    for j in jobs[:2000]:
        store.register(j)
    assert sorted(j.seq for j in store.scan_from(0)) == list(range(1, 2001))
    seen: list[Job] = []
    cursor, step = 0, 0
    while True:  # a scan in pieces of 97 jobs, with the table changing between them
        it = store.scan_from(cursor)
        piece = [j for _, j in zip(range(97), it)]
        seen += piece
        nxt = next(it, None)
        store.register(jobs[2000 + step])  # registered during the scan
        store.unregister(jobs[step * 7])  # deleted during the scan (maybe already seen)
        step += 1
        if nxt is None:
            break
        cursor = store.cursor_of(nxt)
        assert cursor != 0
    ids = [j.id for j in seen]
    assert len(ids) == len(set(ids))  # nothing twice
    always = {j.id for j in jobs[:2000]} - {jobs[k * 7].id for k in range(step)}
    assert always <= set(ids)  # everything present for the whole scan
    assert list(JobStore().scan_from(0)) == []


def test_clear_forgets_every_job_and_its_wake_up():
    store, jobs = scheduled(3000, 10)
    for k in range(4000):
        store.schedule(jobs[k % 3000], 20 + k)
    store.clear()
    assert len(store) == 0 and store.next_awake() is None
    assert all(j.awake == 0 and j.hpos == -1 for j in jobs) and store.timer_entries == 0
    store.register(jobs[0])
    store.schedule(jobs[0], 50)
    assert store.pop_due(50) == [jobs[0]]


def test_jobs_due_in_the_same_millisecond_come_in_registration_order():
    """Ties in the heap are broken by registration order, whatever order the jobs were scheduled in
    (or their IDs sort in), and a job scheduled twice at one time is returned once; two objects of
    one ID (a job deleted, then its copy received again) tie without an error."""
    store = JobStore()
    jobs = [job(i) for i in random.Random(3).sample(range(10_000), 200)]  # IDs not in registration order
    for j in jobs:
        store.register(j)
    for j in random.Random(7).sample(jobs, len(jobs)):
        store.schedule(j, 5_000 if j.seq % 2 else 4_000)
    store.schedule(jobs[3], 9_000)
    store.schedule(jobs[3], 4_000)  # back: an entry at 4,000 twice for the same job
    due = store.pop_due(10_000)
    early = sorted((j for j in jobs if j.seq % 2 == 0 or j is jobs[3]), key=lambda j: j.seq)
    late = sorted((j for j in jobs if j.seq % 2 and j is not jobs[3]), key=lambda j: j.seq)
    assert due == early + late
    store.schedule(jobs[0], 20_000)
    store.unregister(jobs[0])
    again = Job(jobs[0].id, 0)
    store.register(again)
    store.schedule(again, 20_000)
    assert store.pop_due(30_000) == [again] and {again, again} == {again}
