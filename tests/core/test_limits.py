"""GROUP INFO|LIST|WEIGHT|LIMIT (ours): the groups' settings kept by the cluster, and limits
kept by shares that move between nodes, never above the limit (core/limits.py)."""

from __future__ import annotations

import os
import random

import pytest

from disque_py.core.effects import Reply
from disque_py.core.limits import CONC, RATE
from disque_py.core.node import Node

from .conftest import Harness


def getjobs(h, count: int) -> list[bytes]:
    got = h.cmd("GETJOB", "NOHANG", "COUNT", count, "FROM", "q")
    return [bytes(item[2]) for item in got] if isinstance(got, list) else []

from .wired import WALL, Wired


def info(reply) -> dict:
    return {k.decode(): v for k, v in zip(reply[::2], reply[1::2])}


# =============================================================== one node
def test_group_info_weight_and_limits_on_one_node(h):
    assert info(h.cmd("GROUP", "INFO", "A")) == {
        "name": b"A", "weight": 1, "concurrency": None, "rate": None, "active": 0, "waiting": 0,
        "share-concurrency": None, "share-rate": None, "held": False,
    }  # fmt: skip
    assert h.cmd("GROUP", "WEIGHT", "A", 3) == b"OK"
    assert h.cmd("GROUP", "LIMIT", "A", "CONCURRENCY", 2) == b"OK"
    for i in range(5):
        h.add("q", "a%d" % i, "GROUP", "A", "RETRY", 30)
    h.add("q", "b0", "GROUP", "B")
    got = h.cmd("GETJOB", "NOHANG", "COUNT", 10, "FROM", "q")
    assert [bytes(j[2]) for j in got] == [b"a0", b"a1", b"b0"]  # A stops at 2; B is not held up
    a = info(h.cmd("GROUP", "INFO", "A"))
    assert a["weight"] == 3 and a["concurrency"] == 2 and a["active"] == 2 and a["waiting"] == 3
    assert a["share-concurrency"] == 2 and a["held"] is True
    assert h.cmd("QLEN", "q") == 3  # the jobs over the limit wait, queued: no NACK, no delivery counted
    assert h.cmd("ACKJOB", got[0][1]) == 1
    h.advance(100)
    assert getjobs(h, 10) == [b"a2"]
    assert h.cmd("NACK", got[1][1]) == 1  # given back: the share is free again, the job first in A
    h.advance(100)
    assert getjobs(h, 10) == [b"a1"]
    assert h.cmd("GROUP", "LIMIT", "A", "NONE") == b"OK"
    assert getjobs(h, 10) == [b"a3", b"a4"]
    listed = [info(e) for e in h.cmd("GROUP", "LIST")]
    assert [e["name"] for e in listed][:2] == [b"A", b"B"] and listed[0]["active"] == 4  # a1 to a4


def test_a_blocked_consumer_is_served_when_the_group_gets_under_its_limit(h):
    h.cmd("GROUP", "LIMIT", "A", "CONCURRENCY", 1)
    first = h.add("q", "a0", "GROUP", "A")
    h.add("q", "a1", "GROUP", "A")
    assert getjobs(h, 5) == [b"a0"]
    assert h.cmd("GETJOB", "TIMEOUT", 5000, "FROM", "q", client=2) is not None  # blocks
    assert h.replies() == {}
    h.cmd("ACKJOB", first)
    replies = {e.client: e.value for e in h.advance(100) if isinstance(e, Reply)}
    assert [bytes(j[2]) for j in replies[2]] == [b"a1"]


def test_a_rate_limit_lets_its_burst_go_then_one_job_per_interval(h):
    h.cmd("GROUP", "LIMIT", "A", "RATE", 2)
    for i in range(20):
        h.add("q", "a%d" % i, "GROUP", "A")
    got = getjobs(h, 20)
    assert got == [b"a0", b"a1"]  # the burst: one second's worth
    h.advance(499)
    assert getjobs(h, 20) == []
    h.advance(1)
    assert getjobs(h, 20) == [b"a2"]
    h.advance(2000)
    assert len(getjobs(h, 20)) == 2  # never more than the burst
    assert info(h.cmd("GROUP", "INFO", "A"))["rate"] == b"2"


@pytest.mark.parametrize(
    "args, error",
    [
        (["LIMIT", "A", "CONCURRENCY", 0], "ERR CONCURRENCY must be a number from 1 to 100000"),
        (["LIMIT", "A", "CONCURRENCY", -3], "ERR CONCURRENCY must be a number from 1 to 100000"),
        (["LIMIT", "A", "CONCURRENCY", "x"], "ERR CONCURRENCY must be a number from 1 to 100000"),
        (["LIMIT", "A", "RATE", "fast"], "ERR RATE must be a number of deliveries a second from 1"),
        (["LIMIT", "A", "RATE", "0"], "ERR RATE must be a number of deliveries a second from 1"),
        (["LIMIT", "A", "RATE", "1.2345"], "ERR RATE must be a number of deliveries a second from 1"),
        (["LIMIT", "A", "RATE", "nan"], "ERR RATE must be a number of deliveries a second from 1"),
        (["LIMIT", "A", "SPEED", 3], "ERR syntax error: GROUP LIMIT group CONCURRENCY"),
        (["LIMIT", "A"], "ERR wrong number of arguments for 'group|limit' command"),
        (["WEIGHT", "A", 0], "ERR WEIGHT must be a number from 1 to 1000"),
        (["WEIGHT", "A", 1001], "ERR WEIGHT must be a number from 1 to 1000"),
        (["WEIGHT", "", 2], "ERR GROUP name must not be empty"),
        (["WEIGHT", "x" * 129, 2], "ERR GROUP name is 129 bytes, at most 128"),
        (["INFO", ""], "ERR GROUP name must not be empty"),
        (["INFO"], "ERR wrong number of arguments for 'group|info' command"),
        (["LIST", "COUNT", 0], "ERR COUNT must be a positive number"),
        (["NOPE", "A"], "ERR unknown subcommand 'NOPE'. Try GROUP INFO, LIST, WEIGHT or LIMIT"),
    ],
)
def test_bad_group_commands_are_refused_and_change_nothing(h, args, error):
    reply = h.cmd("GROUP", *args)
    assert str(reply).startswith(error), reply
    assert h.node.limits.settings == {} and h.node.ctx.groups.weights == {}
    assert h.cmd("GROUP", "WEIGHT") == "ERR wrong number of arguments for 'group|weight' command"


def test_retry_0_jobs_are_refused_in_a_group_with_a_concurrency_limit(h):
    h.cmd("GROUP", "LIMIT", "A", "CONCURRENCY", 3)
    reply = h.cmd("ADDJOB", "q", "x", 0, "GROUP", "A", "RETRY", 0)
    assert str(reply).startswith("ERR GROUP 'A' has a CONCURRENCY limit, which RETRY 0 cannot keep")
    assert h.cmd("QLEN", "q") == 0
    h.add("q", "x", "GROUP", "B", "RETRY", 0)  # another group: fine
    h.add("q", "x", "GROUP", "A", "RETRY", 5)


# =============================================================== the cluster
def test_settings_reach_every_node_and_one_that_comes_later():
    c = Wired(3)
    assert c.cmd(0, "GROUP", "WEIGHT", "A", 4) == b"OK"
    assert c.cmd(1, "GROUP", "LIMIT", "A", "CONCURRENCY", 6) == b"OK"
    for i in range(3):
        a = info(c.cmd(i, "GROUP", "INFO", "A"))
        assert (a["weight"], a["concurrency"]) == (4, 6), i
    assert c.node(2).ctx.groups.weights == {b"A": 4}
    # a node restarted with nothing (no AOF) has the table again within one digest period
    c.nodes[2] = Node(c.ids[2], seed=b"again", now=c.now, wall_offset=WALL)
    c._views()
    assert info(c.cmd(2, "GROUP", "INFO", "A"))["weight"] == 1
    c.advance(5100)
    a = info(c.cmd(2, "GROUP", "INFO", "A"))
    assert (a["weight"], a["concurrency"]) == (4, 6)


def test_the_later_change_wins_on_every_node_whatever_the_order():
    c = Wired(2)
    c.partition({0}, {1})
    c.cmd(0, "GROUP", "WEIGHT", "A", 2)
    c.now += 5
    c.cmd(1, "GROUP", "WEIGHT", "A", 7)  # later
    c.cmd(0, "GROUP", "LIMIT", "A", "RATE", "3.5")
    c.heal()
    c.advance(5100)
    for i in range(2):
        a = info(c.cmd(i, "GROUP", "INFO", "A"))
        assert (a["weight"], a["rate"]) == (7, b"3.5"), i


class Consumers:
    """A consumer on each node of ``c``: takes jobs of queue q (GETJOB NOHANG), holds each for a
    while (less than its RETRY), then acknowledges it where it got it. ``held`` is their own
    count, sampled after every step."""

    def __init__(self, c: Wired, rng: random.Random, hold_ms=(50, 600)) -> None:
        self.c = c
        self.rng = rng
        self.hold_ms = hold_ms
        self.holding: dict[int, list[tuple[int, bytes]]] = {i: [] for i in range(len(c.ids))}
        self.done: set[bytes] = set()
        self.most = 0

    @property
    def held(self) -> int:
        return sum(len(v) for v in self.holding.values())

    def step(self, ms: int) -> None:
        c = self.c
        for i in c.live():
            mine = self.holding[i]
            for due, job_id in [x for x in mine if x[0] <= c.now]:
                mine.remove((due, job_id))
                c.cmd(i, "ACKJOB", job_id)
                self.done.add(job_id)
            got = c.cmd(i, "GETJOB", "NOHANG", "COUNT", self.rng.randint(1, 3), "FROM", "q")
            for item in got if isinstance(got, list) else []:
                mine.append((c.now + self.rng.randint(*self.hold_ms), bytes(item[1])))
            self.most = max(self.most, self.held)
        c.advance(ms)

    def drop(self, i: int) -> None:
        """Node i is gone: its consumer's jobs go with it (unacknowledged: their RETRY brings them back)."""
        self.holding[i] = []


def held_units(c: Wired, kind: int = CONC) -> int:
    """The units of group A's limit held or in flight, but those of a node whose incarnation another
    node took back (void: fenced, it drops them when it hears)."""
    void = set()
    for i in c.live():
        void |= set(c.node(i).limits.void)
    total = 0
    for i in c.live():
        if c.node(i).limits.member in void:
            continue
        pool = c.node(i).limits.pools.get((b"A", kind))
        if pool is not None:
            total += pool.held + sum(e[2] for e in pool.out.values())
    return total


@pytest.mark.parametrize("seed", [1, 2])
def test_a_concurrency_limit_holds_across_nodes_and_shares_move_to_the_demand(seed):
    rng = random.Random(seed)
    c = Wired(3)
    limit = 4
    c.cmd(0, "GROUP", "LIMIT", "A", "CONCURRENCY", limit)
    ids = set()
    for n in range(40):
        ids.add(bytes(c.cmd(rng.randrange(3), "ADDJOB", "q", "a%d" % n, 0, "GROUP", "A", "RETRY", 5, "REPLICATE", 2)))
    cons = Consumers(c, rng)
    for _ in range(400):
        cons.step(rng.randint(5, 60))
        assert cons.held <= limit
        assert held_units(c) <= limit
        if cons.done >= ids:
            break
    assert cons.done >= ids and cons.most == limit  # all of them, the limit reached, never passed
    got = [i for i in range(3) if c.node(i).limits.pools[(b"A", CONC)].recv]
    assert got, "no share moved"


def test_idle_units_go_at_once_to_a_node_whose_jobs_wait():
    """A node whose jobs of the group are all done gives its units to the node that said its jobs
    wait, at its next look (TICK_MS), not a gossip period later when that node would ask."""
    c = Wired(2)
    c.cmd(0, "GROUP", "LIMIT", "A", "CONCURRENCY", 3)
    c.cmd(0, "ADDJOB", "q", "here", 0, "GROUP", "A", "RETRY", 5, "REPLICATE", 1)
    for i in range(10):
        c.cmd(1, "ADDJOB", "q", "there%d" % i, 0, "GROUP", "A", "RETRY", 5, "REPLICATE", 1)
    c.advance(1500)  # both have told the other their shares and what waits there
    pools = [c.node(i).limits.pools[(b"A", CONC)] for i in range(2)]
    # one job waits on node 0: it keeps one unit (its demand), the others went where ten wait
    assert (pools[0].held, pools[1].held) == (1, 2)
    limits = [c.node(i).limits for i in range(2)]
    while min(lim.next_gossip for lim in limits) - c.now < 300:  # no gossip (nor an ask after it) soon
        c.advance(50)
    got = c.cmd(0, "GETJOB", "NOHANG", "COUNT", 5, "FROM", "q")
    assert [bytes(j[2]) for j in got] == [b"here"]
    c.cmd(0, "ACKJOB", got[0][1])
    c.advance(120)
    assert (pools[0].held, pools[1].held) == (0, 3)
    assert len(c.cmd(1, "GETJOB", "NOHANG", "COUNT", 10, "FROM", "q")) == 3


def test_units_spread_evenly_over_the_nodes_whose_jobs_wait_and_then_stay():
    """A limit made on one node, jobs waiting and consumers on all three: each node ends with its
    fair share (6 / 3), every node's consumers get jobs, and once spread the units stop moving."""
    rng = random.Random(7)
    c = Wired(3)
    c.cmd(0, "GROUP", "LIMIT", "A", "CONCURRENCY", 6)
    for n in range(300):
        c.cmd(n % 3, "ADDJOB", "q", "a%d" % n, 0, "GROUP", "A", "RETRY", 30, "REPLICATE", 1)
    cons = Consumers(c, rng, hold_ms=(100, 300))
    pools = [c.node(i).limits.pools[(b"A", CONC)] for i in range(3)]
    for _ in range(150):  # 1.5 s: two gossip periods
        cons.step(10)
        assert cons.held <= 6 and held_units(c) <= 6
    assert [p.held for p in pools] == [2, 2, 2]
    given = [c.node(i).limits.grant_seq for i in range(3)]
    served: dict[int, set[bytes]] = {i: set() for i in range(3)}
    for _ in range(300):  # 3 s more: the shares stay where they are while the demand does
        cons.step(10)
        for i in range(3):
            served[i] |= {job_id for _, job_id in cons.holding[i]}
        assert cons.held <= 6 and held_units(c) <= 6
    assert [c.node(i).limits.grant_seq for i in range(3)] == given
    assert [p.held for p in pools] == [2, 2, 2]
    # each node's consumer served by its two units: about 3 s / 0.2 s x 2 = 30 jobs each
    assert all(len(served[i]) >= 20 for i in range(3)), {i: len(v) for i, v in served.items()}


def test_a_node_with_less_demand_than_its_even_share_keeps_only_its_demand():
    """Waiting jobs on two nodes, 1 on one and 50 on the other, a limit of 5: the first keeps one unit,
    the other holds four, whoever made the limit."""
    c = Wired(2)
    c.cmd(1, "GROUP", "LIMIT", "A", "CONCURRENCY", 5)
    c.cmd(1, "ADDJOB", "q", "one", 0, "GROUP", "A", "RETRY", 30, "REPLICATE", 1)
    for n in range(50):
        c.cmd(0, "ADDJOB", "q", "m%d" % n, 0, "GROUP", "A", "RETRY", 30, "REPLICATE", 1)
    c.advance(2500)
    assert [c.node(i).limits.pools[(b"A", CONC)].held for i in range(2)] == [4, 1]


def test_units_lost_are_made_again_once_by_the_lowest_id_when_nothing_moves():
    """Units gone from every count (lost in flight) come back: once two gossip rounds in a row saw
    the same holdings and ledgers everywhere, every grant taken, the lowest ID makes what is
    missing, once; then the limit is reached again, never passed."""
    c = Wired(3)
    c.cmd(2, "GROUP", "LIMIT", "A", "CONCURRENCY", 3)
    c.advance(2500)
    pools = [c.node(i).limits.pools[(b"A", CONC)] for i in range(3)]
    assert sum(p.held for p in pools) == 3
    for p in pools:
        p.held = 0  # as if every unit had gone to incarnations taken back before they said they took them
    lowest = min(range(3), key=lambda i: c.ids[i])
    for n in range(20):
        c.cmd(n % 3, "ADDJOB", "q", "a%d" % n, 0, "GROUP", "A", "RETRY", 30, "REPLICATE", 1)
    c.advance(4500)
    assert [p.held for p in pools] != [0, 0, 0] and held_units(c) == 3
    assert c.node(lowest).ctx.stats["group_units_restored"] == 3
    assert sum(c.node(i).ctx.stats["group_units_restored"] for i in range(3)) == 3
    cons = Consumers(c, random.Random(3), hold_ms=(50, 100))
    for _ in range(300):
        cons.step(10)
        assert cons.held <= 3 and held_units(c) <= 3
    assert cons.most == 3 and len(cons.done) == 20


def test_no_unit_is_made_again_while_a_grant_is_in_flight():
    """A grant sent and not yet taken (its receiver cut off from the giver only) is not a lost unit:
    nobody makes it again while the ledgers disagree, however long."""
    c = Wired(3)
    c.cmd(0, "GROUP", "LIMIT", "A", "CONCURRENCY", 2)
    c.advance(2500)
    for i in range(3):
        c.node(i).limits.pools[(b"A", CONC)].held = 0
    pool0 = c.node(0).limits.pools[(b"A", CONC)]
    pool0.held = 0
    pool0.sent[c.node(1).limits.member] = pool0.sent.get(c.node(1).limits.member, 0) + 2  # in flight to node 1
    for _ in range(100):
        c.advance(100)
        assert sum(c.node(i).ctx.stats["group_units_restored"] for i in range(3)) == 0


def test_a_node_that_hears_no_majority_stops_delivering_whatever_its_links_say():
    """A node cut off in a way its failure detector has not seen yet (muted: still reachable in
    everyone's view, hearing and saying nothing) delivers no job of a limited group once it has
    not heard the others' shares for FENCE_MS: before they could take its units back (the
    shortest RETRY plus RECLAIM_MARGIN_MS after they last heard it)."""
    from disque_py.core.limits import FENCE_MS, RECLAIM_MARGIN_MS

    assert FENCE_MS < 1000 + RECLAIM_MARGIN_MS
    c = Wired(3)
    c.cmd(0, "GROUP", "LIMIT", "A", "CONCURRENCY", 3)
    for n in range(100):
        c.cmd(0, "ADDJOB", "q", "a%d" % n, 0, "GROUP", "A", "RETRY", 1, "REPLICATE", 1)
    c.advance(2500)
    got = c.cmd(0, "GETJOB", "NOHANG", "COUNT", 1, "FROM", "q")
    assert len(got) == 1
    c.cmd(0, "ACKJOB", got[0][1])
    c.muted = {0}
    cut = c.now
    delivered_at = []
    while c.now - cut < FENCE_MS + 1000:
        got = c.cmd(0, "GETJOB", "NOHANG", "COUNT", 1, "FROM", "q")
        if isinstance(got, list) and got:
            delivered_at.append(c.now - cut)
            c.cmd(0, "ACKJOB", got[0][1])
        c.advance(50)
    assert delivered_at and max(delivered_at) < FENCE_MS  # it went on until then, then stopped
    c.muted = set()
    c.advance(3000)  # heard again from both: it delivers again
    assert len(c.cmd(0, "GETJOB", "NOHANG", "COUNT", 1, "FROM", "q")) == 1


def test_fair_shares_split_evenly_bounded_by_demand_remainder_to_the_lowest_ids():
    from disque_py.core.limits import fair_shares

    assert fair_shares(5, [("b", None), ("a", None)]) == {"a": 3, "b": 2}
    assert fair_shares(5, [("b", 1), ("a", 10)]) == {"a": 4, "b": 1}
    assert fair_shares(6, [("a", 0), ("b", 1), ("c", 9)]) == {"a": 0, "b": 1, "c": 5}
    assert fair_shares(2, [("a", 5), ("b", 5), ("c", 5)]) == {"a": 1, "b": 1, "c": 0}
    assert fair_shares(3, [("a", 1), ("b", 1)]) == {"a": 1, "b": 1}  # more units than demand: none forced on
    for total in range(0, 12):
        for demands in ([("a", 2), ("b", None), ("c", 7)], [("x", 1), ("y", 1), ("z", 1)]):
            got = fair_shares(total, demands)
            assert sum(got.values()) <= total and all(got[n] <= d for n, d in demands if d is not None)


#: DISQUE_PY_GROUPS_PROOF=1: a hundred seeded schedules instead of two (the CI runs two)
SEEDS = range(3, 103) if os.environ.get("DISQUE_PY_GROUPS_PROOF") == "1" else (3, 4)


def schedule_of(rng: random.Random) -> dict[int, tuple[str, int]]:
    """A fault schedule: step -> (cut | heal | crash | restart, node): a partition of one node from
    the others and its heal, then a crash of one node and its restart (empty: no AOF)."""
    cut = rng.randint(10, 80)
    heal = cut + rng.randint(20, 200)
    crash = heal + rng.randint(10, 100)
    restart = crash + rng.randint(10, 150)
    return {cut: ("cut", rng.randrange(3)), heal: ("heal", 0), crash: ("crash", rng.randrange(3)),
            restart: ("restart", -1)}  # fmt: skip


@pytest.mark.parametrize("seed", SEEDS)
def test_a_partition_and_a_crash_never_take_the_cluster_above_the_limit(seed):
    rng = random.Random(seed)
    c = Wired(3)
    limit = rng.randint(2, 4)
    c.cmd(rng.randrange(3), "GROUP", "LIMIT", "A", "CONCURRENCY", limit)
    ids = set()
    for n in range(60):
        ids.add(bytes(c.cmd(rng.randrange(3), "ADDJOB", "q", "a%d" % n, 0, "GROUP", "A", "RETRY", 3, "REPLICATE", 3)))
    cons = Consumers(c, rng)
    schedule = schedule_of(rng)
    crashed = -1
    for step in range(1500):
        what, node = schedule.get(step, ("", 0))
        if what == "cut":
            c.partition({node}, set(range(3)) - {node})
        elif what == "heal":
            c.heal()
        elif what == "crash":
            crashed = node
            c.crash(node)
            cons.drop(node)
        elif what == "restart":
            c.nodes[crashed] = Node(c.ids[crashed], seed=b"again", now=c.now, wall_offset=WALL)
            c._views()
        cons.step(rng.randint(5, 60))
        assert cons.held <= limit, (step, what)
        assert held_units(c) <= limit, step
        if step > max(schedule) and cons.done >= ids:
            break
    assert cons.done >= ids  # every job done in the end: the shares came back to who needs them


def test_a_rate_limit_holds_across_nodes():
    rng = random.Random(5)
    c = Wired(3)
    c.cmd(2, "GROUP", "LIMIT", "A", "RATE", 5)
    for n in range(120):
        c.cmd(n % 3, "ADDJOB", "q", "a%d" % n, 0, "GROUP", "A", "REPLICATE", 1)
    times: list[int] = []
    cons = Consumers(c, rng, hold_ms=(1, 5))
    start = c.now
    while len(times) < 60 and c.now - start < 60_000:
        before = len(cons.done)
        cons.step(20)
        times += [c.now] * (len(cons.done) - before)
    assert len(times) >= 60
    for i, t in enumerate(times):  # in any second, at most the rate plus the burst (one second's worth)
        assert sum(1 for u in times[i:] if u - t < 1000) <= 10
    assert held_units(c, RATE) <= 5000


def test_settings_and_weights_come_back_from_the_aof():
    from disque_py.persistence.journal import encode_entries, snapshot

    from ..persistence.test_journal import restart

    h = Harness()
    journal: list = []
    h.node.set_journal(journal)
    h.cmd("GROUP", "WEIGHT", "A", 5)
    h.cmd("GROUP", "LIMIT", "A", "CONCURRENCY", 9)
    h.cmd("GROUP", "LIMIT", "B", "RATE", "1.5")
    h.add("q", "x", "GROUP", "A")
    groups = h.node.limits.records()
    for data in (encode_entries(journal, WALL),
                 b"".join(snapshot(h.node.store.values(), WALL, groups=groups))):  # fmt: skip
        node, truncated, counts = restart(data)
        assert node.limits.records() == groups
        a = info(node.execute(1, [b"GROUP", b"INFO", b"A"], node.ctx.now))
        assert (a["weight"], a["concurrency"]) == (5, 9)
        assert node.ctx.groups.weights == {b"A": 5}


def test_a_grant_meant_for_a_former_self_is_refused():
    """A grant names the incarnation it is for: sent again after its taker restarted, the new
    incarnation refuses it (its giver counted it as the former self's, which is taken back with
    it), and acknowledges only its own."""
    c = Wired(2)
    c.cmd(0, "GROUP", "LIMIT", "A", "CONCURRENCY", 3)
    c.advance(100)
    lim = c.node(1).limits
    pool = lim.pools[(b"A", CONC)]
    giver = c.node(0).limits.member
    body = ["GRANT", giver, b"A", CONC, pool.vstamp, pool.vorigin, 900, 1]
    before = pool.held
    c.node(1).limits.on_groups(c.ids[0], body + [c.ids[1] + "/former"])
    assert pool.held == before and 900 not in pool.seen.get(giver, set())
    c.node(1).limits.on_groups(c.ids[0], body + [lim.member])
    assert pool.held == before + 1


def test_a_delivery_queued_again_by_another_holder_still_counts():
    """A job queued again here without being given back (another holder that missed the delivery
    requeued it and moved it here) is still held by its consumer: its unit stays used until its
    RETRY; a NACK settles it at once."""
    c = Wired(1)
    c.cmd(0, "GROUP", "LIMIT", "A", "CONCURRENCY", 1)
    c.cmd(0, "ADDJOB", "q", "a", 0, "GROUP", "A", "RETRY", 5)
    c.cmd(0, "ADDJOB", "q", "b", 0, "GROUP", "A", "RETRY", 5)
    got = c.cmd(0, "GETJOB", "NOHANG", "COUNT", 2, "FROM", "q")
    assert len(got) == 1
    node = c.node(0)
    job = node.ctx.store.get(bytes(got[0][1]))
    node.requeue.enqueue_job(job, False, True)  # as a copy moved in (YOURJOBS) is queued
    assert node.limits._used(b"A") == 1
    assert "A" in {g.decode() for g in node.ctx.groups.held}  # no other job of A goes meanwhile
    c.advance(5600)  # its RETRY since the delivery passed: its consumer is taken for gone
    assert node.limits._used(b"A") == 0


def test_an_ack_after_a_second_delivery_leaves_the_first_counted_until_its_retry():
    """Delivered here twice (queued again between by a holder that missed the first delivery), the
    job's ack ends the latest holding: the first consumer may still hold it until its RETRY."""
    c = Wired(1)
    c.cmd(0, "GROUP", "LIMIT", "A", "CONCURRENCY", 2)
    c.cmd(0, "ADDJOB", "q", "a", 0, "GROUP", "A", "RETRY", 5)
    node = c.node(0)
    job_id = bytes(c.cmd(0, "GETJOB", "NOHANG", "FROM", "q")[0][1])
    c.advance(1000)
    node.requeue.enqueue_job(node.ctx.store.get(job_id), False, True)  # moved back, queued again
    assert bytes(c.cmd(0, "GETJOB", "NOHANG", "FROM", "q")[0][1]) == job_id
    c.cmd(0, "ACKJOB", job_id)
    assert node.limits._used(b"A") == 1  # the first delivery, 4 s of its RETRY left
    c.advance(4100)
    assert node.limits._used(b"A") == 0
