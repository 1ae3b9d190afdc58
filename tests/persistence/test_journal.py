"""The journal -> records -> loader round trip, on the core alone (no files, no processes).

A node journals while it serves; the records its journal becomes are fed to a fresh node
with the same ID (a restart), in one piece or a byte at a time; what comes back is
compared with what the first node held, as SHOW reports it.
"""

from __future__ import annotations

import pytest

from disque_py.core import invariants
from disque_py.core.job import ACKED, ACTIVE, F_BCAST_WILLQUEUE, QUEUED
from disque_py.core.node import Node
from disque_py.core.store import J_LOAD
from disque_py.persistence.journal import encode_entries, snapshot
from disque_py.persistence.loader import Loader
from disque_py.persistence.records import CorruptRecord
from tests.core.conftest import NODE_ID, T0, Harness

WALL = 1_700_000_000_000 - T0


def journaling() -> tuple[Harness, list]:
    h = Harness()
    journal: list = []
    h.node.set_journal(journal)
    return h, journal


def restart(data: bytes, *, after_ms: int = 0, enqueue_once: bool = False, step: int = 0):
    """A new node (same ID, later clock) loaded from ``data``; ``step`` > 0 feeds it in slices."""
    now = T0 + after_ms
    node = Node(NODE_ID, seed=b"other-seed", now=now, wall_offset=WALL)
    loader = Loader(node)
    if step:
        for i in range(0, len(data), step):
            loader.feed(data[i : i + step])
    else:
        loader.feed(data)
    truncated, counts = loader.finish(enqueue_once)
    invariants.check(node)
    return node, truncated, counts


def shown(node: Node, job_id: bytes) -> dict | None:
    got = node.execute(1, [b"SHOW", job_id], node.ctx.now)
    if got is None:
        return None
    info = dict(zip(got[::2], got[1::2]))
    for volatile in (b"ttl", b"next-requeue-within", b"next-awake-within", b"nodes-confirmed"):
        info.pop(volatile, None)
    return info


def test_every_job_comes_back_as_show_reports_it_active_and_requeued_by_its_retry():
    h, journal = journaling()
    ids = [h.add("q1", "a%d" % i, "RETRY", 5) for i in range(5)] + [h.add("q2", "b", "RETRY", 0)]
    delayed = h.add("q3", "later", "DELAY", 30, "RETRY", 60)
    data = encode_entries(journal, WALL)
    journal.clear()
    node, truncated, counts = restart(data, after_ms=1000)
    assert truncated is None
    assert counts["jobs"] == 7 and counts["queued"] == 0
    for job_id in ids + [delayed]:
        before, after = shown(h.node, job_id), shown(node, job_id)
        before[b"state"] = "active"  # queued before the restart: back as active
        if job_id == delayed:
            before[b"state"] = after[b"state"]
        assert after == before
    # at-least-once jobs are queued again by their RETRY timer; the RETRY 0 one never
    assert node.execute(1, [b"QLEN", b"q1"], node.ctx.now) == 0
    h2 = Harness()
    h2.node, h2.now = node, node.ctx.now
    h2.advance(6000)
    assert node.execute(1, [b"QLEN", b"q1"], h2.now) == 5
    assert node.execute(1, [b"QLEN", b"q2"], h2.now) == 0
    assert node.store.get(ids[-1]).state == ACTIVE


def test_acked_deleted_and_delivered_retry0_jobs_keep_their_fate():
    h, journal = journaling()
    acked = h.add("q", "acked", "RETRY", 5)
    deleted = h.add("q", "deleted", "RETRY", 5)
    once = h.add("r0", "once", "RETRY", 0)
    kept = h.add("r0", "kept", "RETRY", 0)
    assert h.cmd("ACKJOB", acked) == 1
    assert h.cmd("DELJOB", deleted) == 1
    got = h.cmd("GETJOB", "NOHANG", "COUNT", 1, "FROM", "r0")
    assert got[0][1] == once
    data = encode_entries(journal, WALL)
    node, _, counts = restart(data, after_ms=500, enqueue_once=True)
    assert node.store.get(acked) is None  # alone, an ack is collected at once: DELJOB followed
    assert node.store.get(deleted) is None
    assert node.store.get(once).state == ACTIVE  # delivered once: never queued again
    assert node.store.get(kept).state == QUEUED  # controlled restart: queued again
    assert counts["queued"] == 1


def test_an_acked_job_comes_back_acked_and_its_gc_starts_again():
    h, journal = journaling()
    peer = "f" * 40
    h.node.ctx.cluster_size = 2
    h.node.ctx.known_nodes = [NODE_ID, peer]
    job_id = h.add("q", "body", "RETRY", 5, "REPLICATE", 1)
    h.node.store.get(job_id).delivered = (NODE_ID, peer)  # a copy elsewhere: the GC must ask it
    assert h.cmd("ACKJOB", job_id) == 1
    assert h.node.store.get(job_id).state == ACKED
    node, _, counts = restart(encode_entries(journal, WALL), after_ms=100)
    assert node.store.get(job_id).state == ACKED and counts["acked"] == 1
    assert node.next_wakeup() is not None and node.next_wakeup() <= node.ctx.now + 10_000  # a GC attempt, not the TTL


def test_a_controlled_restart_restores_every_queue_in_order_from_a_snapshot():
    h, journal = journaling()
    for q in ("a", "b"):
        for i in range(20):
            h.add(q, "%s%d" % (q, i), "RETRY", 0 if i % 3 == 0 else 10)
    h.cmd("GETJOB", "NOHANG", "COUNT", 3, "FROM", "a")
    before = {q: h.cmd("QPEEK", q, 100) for q in (b"a", b"b")}
    data = b"".join(snapshot(h.node.store.values(), WALL))
    node, _, counts = restart(data, after_ms=100, enqueue_once=True)
    for q, items in before.items():
        assert node.execute(1, [b"QPEEK", q, b"100"], node.ctx.now) == items
    assert counts["queued"] == 37


def test_the_same_records_a_byte_at_a_time():
    h, journal = journaling()
    for i in range(10):
        h.add("q", "x" * i, "RETRY", 3)
    h.cmd("ACKJOB", next(iter(h.node.store.values())).id)
    data = encode_entries(journal, WALL)
    whole, _, _ = restart(data, after_ms=10)
    sliced, _, _ = restart(data, after_ms=10, step=1)
    assert sorted(j.id for j in whole.store.values()) == sorted(j.id for j in sliced.store.values())
    for job in whole.store.values():
        assert shown(sliced, job.id) == shown(whole, job.id)


def test_expired_jobs_are_not_restored():
    h, journal = journaling()
    h.cmd("ADDJOB", "q", "short", 0, "TTL", 2, "RETRY", 1)
    h.add("q", "long", "RETRY", 1)
    node, _, counts = restart(encode_entries(journal, WALL), after_ms=5000)
    assert counts["jobs"] == 1 and len(node.store) == 1


def test_a_cut_tail_is_reported_and_what_precedes_it_loads():
    h, journal = journaling()
    ids = [h.add("q", "j%d" % i) for i in range(3)]
    data = encode_entries(journal, WALL)
    node, truncated, _ = restart(data[:-7])
    assert truncated is not None and truncated.offset < len(data) - 7
    assert sorted(j.id for j in node.store.values()) == sorted(ids[:2])


def test_a_damaged_record_raises_with_its_offset_after_applying_the_ones_before():
    h, journal = journaling()
    h.add("q", "first")
    first_len = len(encode_entries(journal, WALL))
    h.add("q", "second")
    data = bytearray(encode_entries(journal, WALL))
    data[first_len + 60] ^= 0x20
    node = Node(NODE_ID, seed=b"s", now=T0, wall_offset=WALL)
    loader = Loader(node)
    with pytest.raises(CorruptRecord, match=r"^corrupt AOF record at byte offset \d+: checksum mismatch") as exc:
        loader.feed(bytes(data))
    assert exc.value.offset == first_len
    assert len(node.store) == 1


def test_wait_repl_jobs_and_dummy_acks_are_not_written_until_they_count():
    h, journal = journaling()
    h.node.ctx.cluster_size = 2
    h.node.ctx.reachable = ["f" * 40]
    h.node.ctx.known_nodes = [NODE_ID, "f" * 40]
    reply = h.cmd("ADDJOB", "q", "body", 0, "REPLICATE", 2, client=7)
    assert not isinstance(reply, bytes)  # waiting for its copy
    assert encode_entries(journal, WALL) == b""
    h.cmd("ACKJOB", "D-01234567-" + "a" * 24 + "-05a1")  # unknown here: a dummy ack
    assert encode_entries(journal, WALL) == b""


def test_the_one_step_encoder_writes_the_same_bytes_as_the_record_and_its_encoder():
    from disque_py.persistence.records import encode_job, encode_loadjob, load_job_record

    h, journal = journaling()
    for i in range(60):
        h.add("q%d" % (i % 4), b"\x00\r\n" * (i % 3) + b"body-%d" % i, "RETRY", i % 3, "DELAY", i % 2)
    h.cmd("GETJOB", "NOHANG", "COUNT", 7, "FROM", "q1")
    some = next(iter(h.node.store.values()))
    h.cmd("ACKJOB", some.id)
    jobs = h.node.store.values()
    assert jobs
    for job in jobs:
        assert encode_job(job, WALL) == encode_loadjob(load_job_record(job, WALL))


def test_a_job_whose_requeue_time_passed_while_the_node_was_down_waits_a_whole_retry_announced():
    # Found by the chaos harness: requeued at once after a kill -9 and a restart, a job another
    # node had acknowledged meanwhile came back as a duplicate. As a copy received from a peer, it
    # now waits a whole RETRY and sends WILLQUEUE first, so that node can answer SETACK.
    h, journal = journaling()
    job_id = h.add("q", "body", "RETRY", 2)
    data = encode_entries(journal, WALL)
    node, _, _ = restart(data, after_ms=60_000)
    assert node.store.get(job_id).flags & F_BCAST_WILLQUEUE
    h2 = Harness()
    h2.node, h2.now = node, node.ctx.now
    assert node.execute(1, [b"QLEN", b"q"], h2.now) == 0
    h2.advance(1400)  # RETRY 2 s, less the largest time error
    assert node.execute(1, [b"QLEN", b"q"], h2.now) == 0
    h2.advance(1200)
    assert node.execute(1, [b"QLEN", b"q"], h2.now) == 1


def test_priorities_come_back_and_order_the_queues_again():
    from disque_py.core.job import FLAGS_MAX, job_priority
    from disque_py.persistence.records import encode_job, encode_loadjob, load_job_record

    h, journal = journaling()
    for i in range(6):
        h.add("q", "low%d" % i, "RETRY", 10, "PRIORITY", 0)
        h.add("q", "plain%d" % i, "RETRY", 10)
        h.add("q", "high%d" % i, "RETRY", 10, "PRIORITY", 9, *(["MAXDELIVER", 3] if i % 2 else []))
    before = h.cmd("QPEEK", "q", 100)
    assert [b[2] for b in before[:3]] == [b"high0", b"high1", b"high2"]
    for job in h.node.store.values():
        assert job.flags <= FLAGS_MAX and encode_job(job, WALL) == encode_loadjob(load_job_record(job, WALL))
    for data in (encode_entries(journal, WALL), b"".join(snapshot(h.node.store.values(), WALL))):
        node, truncated, counts = restart(data, after_ms=100, enqueue_once=True)
        assert truncated is None and counts["queued"] == 18
        assert node.execute(1, [b"QPEEK", b"q", b"100"], node.ctx.now) == before
        for job in h.node.store.values():
            assert shown(node, job.id) == shown(h.node, job.id)
            assert job_priority(node.store.get(job.id)) == job_priority(job)


def test_a_loadjob_whose_flags_name_no_priority_is_corrupt():
    from disque_py.core.job import FLAGS_MAX

    h, journal = journaling()
    job_id = h.add("q", "body", "PRIORITY", 9)
    data = encode_entries(journal, WALL)
    job = h.node.store.get(job_id)
    assert job.flags <= FLAGS_MAX
    job.flags = FLAGS_MAX + 1  # priority bits for 10: none such
    with pytest.raises(CorruptRecord, match="number out of range"):
        restart(encode_entries([(J_LOAD, job)], WALL))
    assert restart(data)[0].store.get(job_id) is not None


def test_groups_come_back_and_take_their_turns_again():
    from disque_py.core.job import F_GROUP, job_group

    h, journal = journaling()
    for i in range(4):
        h.add("q", "a%d" % i, "RETRY", 10, "GROUP", "A")
        h.add("q", "b%d" % i, "RETRY", 10, "GROUP", "B", *(["PRIORITY", 7] if i == 3 else []))
        h.add("q", "plain%d" % i, "RETRY", 10)
    before = h.cmd("QPEEK", "q", 100)
    assert [b[2] for b in before[:4]] == [b"b3", b"a0", b"b0", b"plain0"]
    for data in (encode_entries(journal, WALL), b"".join(snapshot(h.node.store.values(), WALL))):
        node, truncated, counts = restart(data, after_ms=100, enqueue_once=True)
        assert truncated is None and counts["queued"] == 12
        assert node.execute(1, [b"QPEEK", b"q", b"100"], node.ctx.now) == before
        for job in h.node.store.values():
            back = node.store.get(job.id)
            assert shown(node, job.id) == shown(h.node, job.id)
            assert job_group(back) == job_group(job) and back.flags & F_GROUP == job.flags & F_GROUP
