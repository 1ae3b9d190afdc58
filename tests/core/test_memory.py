"""The maxmemory policy (core/memory.py): levels, thresholds crossed both ways, the commands
refused at 100 %, external replication at 75 %, what is let go at 95 %, queue eviction."""

from __future__ import annotations

import pytest

from disque_py.core.effects import BLOCKED, Reply, Send
from disque_py.core.memory import (
    HYSTERESIS,
    JOB_OVERHEAD,
    QUEUE_OVERHEAD,
    OOM_ERROR,
    level_of,
)
from disque_py.core.node import OOM_COMMANDS
from disque_py.core.replies import NULL_ARRAY, Error

PEER = "f" * 40
MB = 1024 * 1024


def set_level(h, level: int) -> None:
    """Pick a limit that puts the node's current estimate at ``level`` and measure."""
    memory = h.node.memory
    used = max(memory.estimate(), 1000)
    memory.used = used
    pct = {0: 50, 1: 80, 2: 97, 3: 120}[level]
    memory.set_limit(used * 100 // pct, h.now)
    assert memory.level == level, (memory.used, memory.limit, memory.level)


@pytest.mark.parametrize(
    "pct, level", [(0, 0), (74, 0), (75, 1), (94, 1), (95, 2), (99, 2), (100, 3), (250, 3)]
)
def test_levels_start_at_75_95_and_100_percent(pct, level):
    assert level_of(pct * 1000, 100 * 1000) == level


def test_a_level_is_left_only_below_its_threshold_minus_the_hysteresis():
    limit = 100_000
    assert level_of(100_000 - HYSTERESIS * 1000, limit, current=3) == 3
    assert level_of(100_000 - HYSTERESIS * 1000 - 1, limit, current=3) == 2
    assert level_of(94_000, limit, current=3) == 2  # under 95 %, not under 93 %: level 2 holds
    assert level_of(92_000, limit, current=3) == 1
    assert level_of(10_000, limit, current=3) == 0
    assert level_of(74_000, limit, current=1) == 1
    assert level_of(72_000, limit, current=1) == 0


def test_the_estimate_follows_jobs_in_and_out(h):
    memory = h.node.memory
    assert memory.update(h.now) is None and memory.used == 0 and memory.level == 0
    body = b"x" * 1000
    ids = [h.add("q", body, "REPLICATE", 1) for _ in range(100)]
    ids += [h.add("other", b"y" * 10, "REPLICATE", 1) for _ in range(50)]
    memory.update(h.now)
    assert h.node.store.item_bytes == 100 * (1000 + len("q")) + 50 * (10 + len("other"))  # exact, no sample
    queues = len(h.node.ctx.queues)
    assert memory.used == 150 * JOB_OVERHEAD + h.node.store.item_bytes + queues * (QUEUE_OVERHEAD + 16)
    for job_id in ids:
        h.cmd("DELJOB", job_id)
    assert h.node.store.item_bytes == 0
    h.advance(5000)  # the tombstones go too
    memory.update(h.now)
    assert memory.used < 100 * 1000 // 10


def test_a_limit_changed_in_place_takes_effect_at_the_next_measure(h):
    """The shell sets ``memory.limit`` on CONFIG SET maxmemory, then measures: the level must be
    computed again, not read from the bounds of the old limit."""
    memory = h.node.memory
    h.add("q", b"x" * 1000, "REPLICATE", 1)
    assert memory.update(h.now) is None and memory.level == 0
    memory.limit = memory.used  # 100 %
    assert memory.update(h.now) == (0, 3)
    memory.limit = 1024**3
    assert memory.update(h.now) == (3, 0)
    assert memory.update(h.now) is None


def test_thresholds_are_crossed_up_and_down_as_jobs_come_and_go(h):
    memory = h.node.memory
    memory.set_limit(100 * (JOB_OVERHEAD + 200))  # room for about 100 small jobs
    seen = []
    ids = []
    for i in range(200):
        reply = h.cmd("ADDJOB", "q", "b" * 10, 0, "REPLICATE", 1)
        if type(reply) is Error:
            break
        ids.append(reply)
        h.now += 20
        change = memory.update(h.now)
        if change:
            seen.append(change)
    # Alone, at level 1 it cannot replicate externally: NOREPL, saying why.
    assert reply == Error(
        "NOREPL Not enough reachable nodes for the requested replication level, since I'm unable to hold "
        "a copy of the message for the following reason: I'm out of memory (0 other nodes reachable, 1 asked)"
    )
    assert seen == [(0, 1)]
    assert h.node.ctx.memory_level == 1
    for job in h.cmd("GETJOB", "COUNT", 1000, "FROM", "q"):
        h.cmd("ACKJOB", job[1])
    h.now += 200
    assert memory.update(h.now) == (1, 0)
    assert h.node.ctx.memory_level == 0
    assert isinstance(h.cmd("ADDJOB", "q", "b", 0, "REPLICATE", 1), bytes)


def test_at_level_3_the_commands_that_grow_memory_get_oom_and_the_rest_work(h):
    queued = h.add("q", "a", "REPLICATE", 1)
    taken = h.add("q", "b", "REPLICATE", 1)
    other = h.add("q", "c", "REPLICATE", 1)
    assert h.cmd("GETJOB", "FROM", "q")[0][1] == queued
    set_level(h, 3)
    assert OOM_COMMANDS == {b"addjob", b"enqueue", b"nack"}  # Disque's "m" commands
    memory = h.node.memory
    # Disque's text (clients match it), then the two numbers behind it
    assert OOM_ERROR == "OOM command not allowed when used memory > 'maxmemory'."
    oom = OOM_ERROR + " (used_memory %d, the estimate of the node's data; maxmemory %d)" % (memory.used, memory.limit)
    assert memory.used > memory.limit > 0
    assert h.cmd("ADDJOB", "q", "x", 0) == oom
    assert h.cmd("ENQUEUE", queued) == oom
    assert h.cmd("NACK", queued) == oom
    assert h.cmd("ADDJOB") == Error("ERR wrong number of arguments for 'addjob' command")
    assert h.node.memory.refused == 3
    # Draining and reading work.
    assert not str(h.cmd("WORKING", queued)).startswith(OOM_ERROR)
    assert h.cmd("SHOW", queued) is not None
    assert h.cmd("QLEN", "q") == 2
    assert h.cmd("GETJOB", "FROM", "q")[0][1] == taken
    assert h.cmd("ACKJOB", taken) == 1
    assert h.cmd("FASTACK", queued) == 1
    assert h.cmd("DEQUEUE", other) == 1
    assert h.cmd("DELJOB", other) == 1
    assert h.cmd("GETJOB", "NOHANG", "FROM", "q") == NULL_ARRAY
    assert h.cmd("PAUSE", "q", "state") is not None
    # Raising the limit gives the commands back at once.
    h.node.memory.set_limit(1024**3, h.now)
    assert h.node.memory.level == 0
    assert isinstance(h.cmd("ADDJOB", "q", "x", 0), bytes)


def test_lowering_maxmemory_takes_effect_at_once(h):
    for _ in range(10):
        h.add("q", "x" * 100, "REPLICATE", 1)
    memory = h.node.memory
    assert memory.update(h.now) is None and memory.level == 0
    assert memory.set_limit(1, h.now) == (0, 3)
    assert h.cmd("ADDJOB", "q", "x", 0).startswith(OOM_ERROR + " (used_memory ")


def test_at_level_1_a_new_job_is_replicated_externally_and_handed_over(h):
    h.node.ctx.reachable = [PEER]
    h.node.ctx.cluster_size = 2
    h.add("q", "warm", "REPLICATE", 1)  # something to measure
    set_level(h, 1)
    assert h.cmd("ADDJOB", "q", "body", 0, "REPLICATE", 1) is BLOCKED
    sends = [e for e in h.effects() if isinstance(e, Send)]
    assert [(e.to, e.message[0]) for e in sends] == [(PEER, "REPLJOB")]
    job_id = sends[0].message[1][0]
    job = h.node.store.get(job_id)
    assert job is not None and h.node.id not in job.delivered  # no copy here
    h.node.receive_data(PEER, "GOTJOB", [job_id], h.now)
    effects = h.effects()
    assert [e.value for e in effects if isinstance(e, Reply)] == [job_id]
    assert [(e.to, e.message[0]) for e in effects if isinstance(e, Send)] == [(PEER, "ENQUEUE")]
    assert h.node.store.get(job_id) is None
    assert h.cmd("QLEN", "q") == 1  # only the job from before


def test_at_level_1_replicate_2_goes_to_two_other_nodes(h):
    other = "e" * 40
    h.node.ctx.reachable = [PEER, other]
    h.node.ctx.cluster_size = 3
    h.add("q", "warm", "REPLICATE", 1)
    set_level(h, 1)
    assert h.cmd("ADDJOB", "q", "body", 0, "REPLICATE", 2) is BLOCKED
    sends = [e for e in h.effects() if isinstance(e, Send)]
    assert sorted(e.to for e in sends) == sorted([PEER, other])
    assert set(sends[0].message[1][-1]) == {PEER, other}  # the holders: not this node


def test_at_level_1_repljob_from_a_peer_is_ignored(h):
    h.node.ctx.reachable = [PEER]
    h.node.ctx.cluster_size = 2
    h.add("q", "warm", "REPLICATE", 1)
    set_level(h, 1)
    before = len(h.node.store)
    wire = [b"D-" + b"ab" * 19, b"q", b"body", 2, 60, 1_700_000_000_000_000_000, 0, 5, 0, 0, [PEER]]
    h.node.receive_data(PEER, "REPLJOB", [wire, False], h.now)
    assert len(h.node.store) == before
    assert not [e for e in h.effects() if isinstance(e, Send)]  # no GOTJOB: the peer asks another


def test_at_level_2_delivered_at_most_once_jobs_are_let_go_and_queued_ones_kept(h):
    delivered = [h.add("q", "x", "REPLICATE", 1, "RETRY", 0) for _ in range(5)]
    for _ in delivered:
        h.cmd("GETJOB", "FROM", "q")
    queued = [h.add("q2", "y", "REPLICATE", 1, "RETRY", 0) for _ in range(3)]
    retried = h.add("q3", "z", "REPLICATE", 1)
    h.cmd("GETJOB", "FROM", "q3")
    memory = h.node.memory
    set_level(h, 2)
    memory.frees = False  # maxmemory-policy noeviction
    assert memory.free(h.now) == 0
    memory.frees = True
    assert memory.free(h.now) == 5
    assert memory.freed_jobs == 5
    assert all(h.cmd("SHOW", i) is None for i in delivered)
    assert all(h.cmd("SHOW", i) is not None for i in queued + [retried])
    assert h.cmd("QLEN", "q2") == 3


def test_at_level_2_an_acked_job_gets_a_gc_attempt_now(h):
    h.node.ctx.reachable = [PEER]
    h.node.ctx.cluster_size = 2
    h.node.ctx.known_nodes = [h.node.id, PEER]
    job_id = h.add("q", "x", "REPLICATE", 1)
    job = h.node.store.get(job_id)
    job.delivered = (h.node.id, PEER)
    h.cmd("ACKJOB", job_id)
    h.effects()
    h.advance(10)
    h.effects()
    job.next_at = h.now + 60_000  # its next GC attempt, far away
    set_level(h, 2)
    h.node.memory.free(h.now)
    sent = h.advance(10)  # the held-back SETACK leaves
    assert [(e.to, e.message[0]) for e in sent if isinstance(e, Send)] == [(PEER, "SETACK")]
    assert h.node.memory.gc_attempts == 1


@pytest.mark.parametrize("level, evicted_after_s", [(0, 300), (1, 10), (2, 2)])
def test_idle_empty_queues_are_evicted_sooner_the_higher_the_level(h, level, evicted_after_s):
    for i in range(20):
        h.add("q%d" % i, "x", "REPLICATE", 1, "RETRY", 0)
        h.cmd("GETJOB", "FROM", "q%d" % i)
    if level:
        set_level(h, level)
    h.advance(evicted_after_s * 1000 - 1500)
    assert len(h.node.queues) == 20
    h.advance(2000)
    assert len(h.node.queues) == 0
