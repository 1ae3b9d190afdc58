"""The job table and the wake-up schedule (``core/store.py``), against a plain model.

The store's promises: ``pop_due`` returns each due job once, earliest first, and
never a job that was unregistered or moved later; the heap is rebuilt a slice
at a time, so no ``schedule`` call walks the whole table; JSCAN cursors see
every job present for the whole scan exactly once.
"""

from __future__ import annotations

import random

import pytest

from disque_py.core.job import Job
from disque_py.core.store import REBUILD_SLICE, SHARDS, JobStore


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


@pytest.mark.parametrize("seed", range(8))
def test_schedule_matches_a_model_through_rebuilds(seed):
    """Random schedules, reschedules, unregistrations and pops, with enough stale
    entries to rebuild the heap several times: what pop_due returns is exactly what
    a dict of wake-up times says is due, in time order."""
    rng = random.Random(seed)
    store = JobStore()
    model: dict[bytes, int] = {}  # job ID -> wake-up time, for scheduled and registered jobs
    live: list[Job] = []
    now = 1000
    rebuilds = 0
    was_rebuilding = False
    for step in range(30_000):
        r = rng.random()
        if r < 0.12 or not live:
            j = job(step)
            store.register(j)
            live.append(j)
        elif r < 0.75:
            j = rng.choice(live)
            # far-off wake-ups (TTLs) leave stale entries that only a rebuild removes
            at = now + (rng.randint(1, 400) if rng.random() < 0.5 else rng.randint(10**6, 2 * 10**6))
            store.schedule(j, at)
            model[j.id] = at
        elif r < 0.80:
            k = rng.randrange(len(live))
            live[k], live[-1] = live[-1], live[k]
            j = live.pop()
            store.unregister(j)
            model.pop(j.id, None)
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
        if store.rebuilding and not was_rebuilding:
            rebuilds += 1
        was_rebuilding = store.rebuilding
        assert store.next_awake() == (min(model.values()) if model else None)
    assert rebuilds >= 2


def test_a_rebuild_moves_a_slice_per_call_and_frees_the_old_heap_gradually():
    store, jobs = scheduled(20_000, 5000)
    assert (store.timer_entries, store.rebuilds) == (len(jobs), 0)
    n = 0
    while not store.rebuilding:  # reschedules leave stale entries behind
        store.schedule(jobs[n % len(jobs)], 6000 + n)
        n += 1
    assert store.timer_entries > 2 * len(jobs)
    sizes = []
    calls = 0
    while store.rebuilding:
        before = len(store._next)
        store.schedule(jobs[calls % 100], 100_000 + calls)
        calls += 1
        if store.rebuilding:
            sizes.append(len(store._next) - before)
    # each call carries at most a slice of the table (plus its own entry), never the whole of it
    assert max(sizes) <= REBUILD_SLICE + 1
    assert calls >= len(jobs) // (REBUILD_SLICE + 1)
    assert len(store._heap) < 2 * len(jobs)  # the new heap: live entries, not the stale pile
    assert store._old  # the replaced heap is let go over the next calls
    assert store.rebuilds == 1
    while store._old:
        store.schedule(jobs[calls % 100], 200_000 + calls)
        calls += 1
    assert store.timer_entries < 2 * len(jobs)  # what INFO memory shows as timer_heap_entries
    due = store.pop_due(10**9, limit=10**6)
    assert sorted(j.seq for j in due) == sorted(j.seq for j in jobs)  # each job once, none lost
    assert [j.awake for j in due] == [0] * len(jobs)


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


def test_clear_forgets_jobs_and_any_rebuild():
    store, jobs = scheduled(3000, 10)
    for k in range(4000):
        store.schedule(jobs[k % 3000], 20 + k)
    store.clear()
    assert len(store) == 0 and store.next_awake() is None and not store.rebuilding
    assert all(j.awake == 0 for j in jobs)
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
