"""Membership tests: unit checks plus an in-memory cluster with virtual time.

``SimNet`` wires N ``Membership`` instances through a fake network: a
``Connect`` effect succeeds at once (both ends get a link id; the acceptor is
told the peer ip with ``link_peer``) unless the target is down or on the other
side of a partition, in which case ``link_failed`` is reported. ``Send``
effects are delivered FIFO within the same virtual instant. Partitions drop
messages silently on existing links (like a real network split); killing a node
closes its links, and reviving it reloads it from the last ``SaveConfig``.
"""

from __future__ import annotations

import random
import re
from collections import deque
from collections.abc import Callable

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from cluster_bus.membership import (
    BLACKLIST_TTL_MS,
    ClusterNode,
    Close,
    Connect,
    Log,
    Membership,
    MembershipError,
    SaveConfig,
    Send,
    is_node_id,
)
from cluster_bus.messages import (
    BUS_PORT_OFFSET,
    NODE_FAIL,
    NODE_HANDSHAKE,
    NODE_LEAVING,
    NODE_MEET,
    NODE_MYSELF,
    NODE_NOADDR,
    NODE_PFAIL,
    AuthHello,
    Data,
    Fail,
    Gossip,
    Meet,
    Ping,
    Pong,
)

NODE_TIMEOUT = 2000
TICK_MS = 100
START = 1_000_000
PORT = 7711
WALL = 1_700_000_000_000 - START  # wall_offset used everywhere

LINE_RE = re.compile(
    r"^(?P<id>[0-9a-f]{40}) (?P<ip>[0-9a-f.:]*):(?P<port>\d+) "
    r"(?P<flags>(myself|fail\?|fail|handshake|noaddr|leaving)(,(myself|fail\?|fail|handshake|noaddr|leaving))*|noflags) "
    r"(?P<ping>\d+) (?P<pong>\d+) (?P<link>connected|disconnected)$"
)


def hexid(rng: random.Random) -> str:
    return "%040x" % rng.getrandbits(160)


# ---------------------------------------------------------------------------
# The simulated network
# ---------------------------------------------------------------------------
class SimNet:
    def __init__(self, n: int, seed: int = 1, node_timeout: int = NODE_TIMEOUT) -> None:
        self.now = START
        self.node_timeout = node_timeout
        rng = random.Random(seed)
        self.seed = seed
        self.ips = ["10.0.0.%d" % (i + 1) for i in range(n)]
        self.ids = [hexid(rng) for _ in range(n)]
        self.members: list[Membership | None] = [
            Membership(
                self.ids[i],
                self.ips[i],
                PORT,
                node_timeout=node_timeout,
                now=self.now,
                rng=random.Random(seed * 1000 + i),
                wall_offset=WALL,
            )
            for i in range(n)
        ]
        self.group = [0] * n
        # link id -> (owner index, peer index, peer's link id)
        self.links: dict[int, tuple[int, int, int]] = {}
        self.next_link = 1
        self.disk: list[str | None] = [m.save_text() for m in self.members]
        self.logs: list[list[Log]] = [[] for _ in range(n)]
        self.pending: deque[Callable[[], None]] = deque()
        self.saves = [0] * n

    # -- plumbing ---------------------------------------------------------
    def m(self, i: int) -> Membership:
        m = self.members[i]
        assert m is not None
        return m

    def alive(self, i: int) -> bool:
        return self.members[i] is not None

    def can_talk(self, a: int, b: int) -> bool:
        return self.alive(a) and self.alive(b) and self.group[a] == self.group[b]

    def index_of(self, ip: str, port: int) -> int | None:
        if port != PORT or ip not in self.ips:
            return None
        return self.ips.index(ip)

    def call(self, i: int, fn: Callable[[Membership], None]) -> None:
        """Feed one input to node i, then carry out effects until quiet."""
        self.pending.append(lambda: self._input(i, fn))
        while self.pending:
            self.pending.popleft()()

    def _input(self, i: int, fn: Callable[[Membership], None]) -> None:
        m = self.members[i]
        if m is None:
            return
        fn(m)
        effects = m.take_effects()
        assert sum(1 for e in effects if isinstance(e, SaveConfig)) <= 1
        for e in effects:
            self._effect(i, e)
        check_invariants(m)

    def _effect(self, i: int, e) -> None:
        if isinstance(e, Send):
            entry = self.links.get(e.link)
            if entry is None:  # closed meanwhile
                return
            owner, peer, peer_link = entry
            assert owner == i, "node %d sent on a link it does not own" % i
            if peer_link in self.links and self.can_talk(i, peer):
                msg = e.msg
                self.pending.append(lambda: self._input(peer, lambda pm: pm.receive(peer_link, msg, self.now)))
        elif isinstance(e, Connect):
            target = self.index_of(e.ip, e.bus_port - BUS_PORT_OFFSET)
            node_id = e.node_id
            if target is None or not self.can_talk(i, target):
                self.pending.append(lambda: self._input(i, lambda m: m.link_failed(node_id, self.now)))
                return
            out, inn = self.next_link, self.next_link + 1
            self.next_link += 2
            self.links[out] = (i, target, inn)
            self.links[inn] = (target, i, out)
            ip_i, ip_t = self.ips[i], self.ips[target]
            self.pending.append(lambda: self._input(target, lambda tm: tm.link_peer(inn, ip_i, ip_t)))
            self.pending.append(lambda: self._input(i, lambda m: m.link_up(node_id, out, self.now)))
        elif isinstance(e, Close):
            entry = self.links.pop(e.link, None)
            if entry is None:
                return
            owner, peer, peer_link = entry
            # The shell reports link_down for links it closed too: must be harmless.
            self.pending.append(lambda: self._input(owner, lambda m: m.link_down(e.link, self.now)))
            if peer_link in self.links and self.can_talk(owner, peer):
                del self.links[peer_link]
                self.pending.append(lambda: self._input(peer, lambda pm: pm.link_down(peer_link, self.now)))
        elif isinstance(e, SaveConfig):
            self.disk[i] = self.m(i).save_text()
            self.saves[i] += 1
        elif isinstance(e, Log):
            assert e.level in ("warning", "notice", "verbose", "debug")
            self.logs[i].append(e)
        else:  # pragma: no cover
            raise AssertionError("unknown effect %r" % (e,))

    # -- scenario controls -------------------------------------------------
    def meet(self, a: int, b: int) -> None:
        self.call(a, lambda m: m.meet(self.ips[b], PORT, self.now))

    def step(self) -> None:
        self.now += TICK_MS
        for i in range(len(self.members)):
            self.call(i, lambda m: m.tick(self.now))

    def run(self, ms: int) -> None:
        end = self.now + ms
        while self.now < end:
            self.step()

    def run_until(self, cond: Callable[[], bool], max_ms: int, every: Callable[[], None] | None = None) -> int:
        start = self.now
        while not cond():
            assert self.now - start <= max_ms, "condition not met within %d ms" % max_ms
            self.step()
            if every is not None:
                every()
        return self.now - start

    def kill(self, i: int) -> None:
        self.members[i] = None
        for link, (owner, peer, peer_link) in list(self.links.items()):
            if owner == i:
                del self.links[link]
                if peer_link in self.links:
                    del self.links[peer_link]
                    self.call(peer, lambda pm, pl=peer_link: pm.link_down(pl, self.now))

    def revive(self, i: int) -> None:
        text = self.disk[i]
        assert text is not None
        self.members[i] = Membership.from_text(
            text,
            my_port=PORT,
            node_timeout=self.node_timeout,
            now=self.now,
            rng=random.Random(self.seed * 1000 + i + 500),
            wall_offset=WALL,
        )

    def partition(self, *groups: set[int]) -> None:
        for g, members in enumerate(groups):
            for i in members:
                self.group[i] = g

    def heal(self) -> None:
        self.group = [0] * len(self.group)

    # -- predicates --------------------------------------------------------
    def alive_indexes(self) -> list[int]:
        return [i for i in range(len(self.members)) if self.alive(i)]

    def flags(self, i: int, j: int) -> int | None:
        n = self.m(i).node(self.ids[j])
        return None if n is None else n.flags

    def all_clean(self) -> bool:
        """Every alive node knows every node, with no handshake/fail flags."""
        n = len(self.members)
        for i in self.alive_indexes():
            m = self.m(i)
            if sorted(m.known()) != sorted(self.ids) or len(m.nodes_text().splitlines()) != n:
                return False
            if len(m.reachable()) != n - 1:
                return False
            for j in range(n):
                if j != i and self.flags(i, j) != 0:
                    return False
        return True


def check_invariants(m: Membership) -> None:
    """Table invariants that hold after every input."""
    nodes = m._nodes
    assert m.node(m.my_id) is m.myself
    assert m.myself.flags & NODE_MYSELF
    assert not m.myself.flags & (NODE_PFAIL | NODE_FAIL | NODE_HANDSHAKE | NODE_NOADDR)
    assert sum(1 for n in nodes.values() if n.flags & NODE_MYSELF) == 1
    links = set()
    for node_id, n in nodes.items():
        assert node_id == n.id and is_node_id(node_id)
        assert not n.flags & NODE_PFAIL or not n.flags & NODE_FAIL
        assert m.my_id not in n.fail_reports
        if n.link is not None:
            assert n.link not in links
            links.add(n.link)
            assert m._links[n.link].node is n
    for node_id in m._connecting:
        assert nodes[node_id].link is None


def drive(m: Membership, fn: Callable[[], None]) -> list:
    fn()
    return m.take_effects()


# ---------------------------------------------------------------------------
# Two nodes
# ---------------------------------------------------------------------------
def test_two_nodes_meet() -> None:
    net = SimNet(2)
    net.meet(0, 1)
    assert net.m(0).node(net.ids[1]) is None  # only a handshake node so far
    assert len(net.m(0).nodes_text().splitlines()) == 2
    assert "handshake" in net.m(0).nodes_text()
    assert net.m(0).size() == 1 and len(net.m(0).known()) == 1
    elapsed = net.run_until(net.all_clean, 3000)
    assert elapsed <= 1000
    for i, j in ((0, 1), (1, 0)):
        m = net.m(i)
        assert m.size() == 2 and m.reachable() == [net.ids[j]]
        assert m.link_of(net.ids[j]) is not None
        lines = m.nodes_text().splitlines()
        assert len(lines) == 2
        parsed = {}
        for line in lines:
            mo = LINE_RE.match(line)
            assert mo, line
            parsed[mo["id"]] = mo
        me, other = parsed[net.ids[i]], parsed[net.ids[j]]
        assert me["flags"] == "myself" and me["link"] == "connected"
        assert (me["ip"], me["port"]) == (net.ips[i], str(PORT))
        assert other["flags"] == "noflags" and other["link"] == "connected"
        assert (other["ip"], other["port"]) == (net.ips[j], str(PORT))
        assert int(other["pong"]) > START + WALL  # wall-clock ms
        assert any("Handshake with node %s completed" % net.ids[j] in log.text for log in net.logs[i])
        info = m.info_fields()
        assert info["cluster_state"] == "ok"
        assert info["cluster_known_nodes"] == 2 and info["cluster_size"] == 2
        assert info["cluster_reachable_nodes"] == 1
        assert info["cluster_stats_messages_sent"] > 0 and info["cluster_stats_messages_received"] > 0
        assert info["cluster_stats_bad_frames"] == 0
    # The saved config knows the peer too.
    assert net.ids[1] in net.disk[0] and net.ids[0] in net.disk[1]
    # Meeting again a known node: a handshake that resolves to the known id.
    net.meet(0, 1)
    net.run_until(net.all_clean, 3000)
    assert len(net.m(0).nodes_text().splitlines()) == 2


def test_meet_validation_and_dedup() -> None:
    rng = random.Random(5)
    m = Membership(hexid(rng), "127.0.0.1", PORT, node_timeout=NODE_TIMEOUT, now=START, rng=rng)
    for ip, port in (("nope", 7711), ("300.1.1.1", 7711), ("", 7711), ("1.2.3.4", 0), ("1.2.3.4", 65535 - 9999), ("1.2.3.4", -3)):
        with pytest.raises(MembershipError, match="Invalid node address specified: "):
            m.meet(ip, port, START)
    m.meet("::FFFF:1.2.3.4", 7000, START)
    m.meet("::ffff:1.2.3.4", 7000, START)  # same address, normalised: no-op
    m.meet("1.2.3.4", 55535, START)
    hs = [n for n in m._nodes.values() if n.flags & NODE_HANDSHAKE]
    assert len(hs) == 2 and all(n.flags & NODE_MEET for n in hs)
    assert m.size() == 1 and m.known() == [m.my_id] and m.hello() == [(m.my_id, "127.0.0.1", PORT, 1)]
    # One Connect per node while in flight.
    m.tick(START + 100)
    connects = [e for e in m.take_effects() if isinstance(e, Connect)]
    assert len(connects) == 2
    assert {c.bus_port for c in connects} == {17000, 65535}
    m.tick(START + 200)
    assert not [e for e in m.take_effects() if isinstance(e, Connect)]
    # First connect fails, the other succeeds: MEET goes out, MEET flag cleared.
    a, b = connects
    m.link_failed(a.node_id, START + 250)
    m.link_up(b.node_id, 42, START + 250)
    eff = m.take_effects()
    assert [type(e) for e in eff] == [Send] and isinstance(eff[0].msg, Meet)
    assert not m.node(b.node_id).flags & NODE_MEET
    assert m.stats["messages_sent"] == 1
    m.tick(START + 300)
    assert [e.node_id for e in m.take_effects() if isinstance(e, Connect)] == [a.node_id]
    # Handshake nodes die after max(node_timeout, 1000) ms.
    m.tick(START + NODE_TIMEOUT + 101)
    eff = m.take_effects()
    assert Close(42) in eff
    assert len(m._nodes) == 1
    # A link_up for a node that is gone is closed at once.
    m.link_up(b.node_id, 43, START + NODE_TIMEOUT + 200)
    assert m.take_effects() == [Close(43)]


# ---------------------------------------------------------------------------
# Gossip convergence
# ---------------------------------------------------------------------------
def test_chain_of_eight_converges() -> None:
    times = []
    for seed in (1, 2, 3):
        net = SimNet(8, seed=seed)
        for i in range(7):
            net.meet(i, i + 1)
        elapsed = net.run_until(net.all_clean, 10_000)
        times.append(elapsed)
        for i in range(8):
            assert net.m(i).size() == 8
            assert not [n for n in net.m(i)._nodes.values() if n.flags & NODE_HANDSHAKE]
    # Observed (node_timeout 2 s, 100 ms ticks): ~1.5-3 s of virtual time.
    print("8-node chain convergence (ms, per seed):", times)
    assert max(times) <= 10_000


def test_gossip_selection() -> None:
    net = SimNet(12, seed=4)
    for i in range(1, 12):
        net.meet(0, i)
    net.run_until(net.all_clean, 10_000)
    m = net.m(0)
    for _ in range(50):
        entries = m._gossip_entries()
        assert len(entries) == 3  # max(3, 12 // 10) with every node linked
        assert len({g.node_id for g in entries}) == len(entries)
        assert m.my_id not in {g.node_id for g in entries}
    # Failing nodes are favoured, even without a link.
    failing = net.ids[5]
    n = m.node(failing)
    m._close_outbound(n)
    m.take_effects()
    n.flags |= NODE_PFAIL
    hits = sum(any(g.node_id == failing for g in m._gossip_entries()) for _ in range(200))
    other = net.ids[6]
    other_hits = sum(any(g.node_id == other for g in m._gossip_entries()) for _ in range(200))
    assert hits > 40 and hits > other_hits  # a mild bias, as in Disque
    n.flags |= NODE_NOADDR
    assert not any(g.node_id == failing for _ in range(50) for g in m._gossip_entries())
    # Two nodes: nothing to gossip about.
    two = SimNet(2)
    assert two.m(0)._gossip_entries() == ()


# ---------------------------------------------------------------------------
# Failure detection
# ---------------------------------------------------------------------------
def build(n: int, seed: int = 1) -> SimNet:
    net = SimNet(n, seed=seed)
    for i in range(1, n):
        net.meet(0, i)
    net.run_until(net.all_clean, 10_000)
    return net


def test_killed_nodes_become_fail_then_recover() -> None:
    net = build(7, seed=7)
    dead = (5, 6)
    for i in dead:
        net.kill(i)
    alive = net.alive_indexes()

    def all_fail() -> bool:
        return all(net.flags(i, j) == NODE_FAIL for i in alive for j in dead)

    elapsed = net.run_until(all_fail, 6 * NODE_TIMEOUT)
    assert elapsed > NODE_TIMEOUT
    for i in alive:
        m = net.m(i)
        assert sorted(m.reachable()) == sorted(net.ids[j] for j in alive if j != i)
        assert m.size() == 7
        hello = {h[0]: h[3] for h in m.hello()}
        assert all(hello[net.ids[j]] == 100 for j in dead)
        assert "fail" in net.disk[i].split(net.ids[5])[1].splitlines()[0]
    assert any("Marking node" in log.text for i in alive for log in net.logs[i])

    for i in dead:
        net.revive(i)
    # The reloaded nodes still flag each other and maybe the others: all clear.
    net.run_until(net.all_clean, 4 * NODE_TIMEOUT)
    assert any("Clear FAIL state" in log.text for i in alive for log in net.logs[i])


def test_partition_minority_pfail_majority_fail() -> None:
    net = build(7, seed=11)
    minority, majority = {0, 1, 2}, {3, 4, 5, 6}
    net.partition(minority, majority)

    def check_minority() -> None:
        for i in minority:
            for j in majority:
                assert not (net.flags(i, j) or 0) & NODE_FAIL, "minority side reached FAIL without a majority"

    def majority_fails_minority() -> bool:
        return all(net.flags(i, j) == NODE_FAIL for i in majority for j in minority)

    net.run_until(majority_fails_minority, 6 * NODE_TIMEOUT, every=check_minority)

    def minority_pfails_majority() -> bool:
        return all(net.flags(i, j) == NODE_PFAIL for i in minority for j in majority)

    net.run_until(minority_pfails_majority, 4 * NODE_TIMEOUT, every=check_minority)
    # Long after the reports would have sufficed, still no FAIL on the minority side.
    end = net.now + 3 * NODE_TIMEOUT
    while net.now < end:
        net.step()
        check_minority()
    for i in minority:
        assert net.m(i).reachable() == [net.ids[j] for j in minority if j != i] or sorted(
            net.m(i).reachable()
        ) == sorted(net.ids[j] for j in minority if j != i)
    net.heal()
    net.run_until(net.all_clean, 4 * NODE_TIMEOUT)


def test_fail_message_and_pong_clear() -> None:
    net = build(3, seed=3)
    m0 = net.m(0)
    # A FAIL from a known sender marks the node at once, even without PFAIL.
    net.call(0, lambda m: m.receive(999, Fail(net.ids[1], net.ids[2]), net.now))
    assert net.flags(0, 2) == NODE_FAIL
    assert net.saves[0] >= 1
    # The next PONG on our outbound link clears it.
    net.run_until(lambda: net.flags(0, 2) == 0, 2 * NODE_TIMEOUT)
    assert m0.node(net.ids[2]).fail_time > 0


# ---------------------------------------------------------------------------
# FORGET, RESET, LEAVING, HELLO
# ---------------------------------------------------------------------------
def test_forget_and_ban() -> None:
    net = build(4, seed=5)
    m0 = net.m(0)
    with pytest.raises(MembershipError, match="^Invalid node identifier$"):
        m0.forget("abc", net.now)
    with pytest.raises(MembershipError, match="^Unknown node " + "f" * 40 + "$"):
        m0.forget("f" * 40, net.now)
    with pytest.raises(MembershipError, match="can't forget myself"):
        m0.forget(m0.my_id, net.now)
    assert not [e for e in m0.take_effects() if not isinstance(e, Log)]

    forgotten = net.ids[3]
    t0 = net.now
    net.call(0, lambda m: m.forget(forgotten, net.now))
    assert m0.node(forgotten) is None and m0.size() == 3
    assert forgotten not in net.disk[0]
    # Gossip from nodes 1 and 2 keeps mentioning node 3: it must not come back.
    while net.now - t0 < BLACKLIST_TTL_MS - 200:
        net.step()
        assert m0.node(forgotten) is None
        assert not any(n.ip == net.ips[3] for n in m0._nodes.values() if n.flags & NODE_HANDSHAKE)
    # After the ban, gossip re-adds it.
    net.run_until(lambda: m0.node(forgotten) is not None and m0.node(forgotten).flags == 0, 20_000)
    assert net.all_clean()


def test_reset_soft_and_hard() -> None:
    net = build(4, seed=6)
    m0 = net.m(0)
    old_id = m0.my_id
    net.call(0, lambda m: m.reset(False, net.now))
    assert m0.my_id == old_id and m0.known() == [old_id] and m0.size() == 1
    assert m0.reachable() == [] and net.disk[0].count("\n") == 1
    # Peers still ping us, but pings from unknown senders add nothing.
    net.run(3 * NODE_TIMEOUT)
    assert m0.known() == [old_id]
    assert all(net.flags(i, 0) == 0 for i in (1, 2, 3))
    # Meet again: back in the cluster with the same id.
    net.meet(0, 1)
    net.run_until(net.all_clean, 10_000)

    new_id = "ab" * 20
    net.call(0, lambda m: m.reset(True, net.now, new_id))
    assert m0.my_id == new_id and m0.known() == [new_id] and m0.node(old_id) is None
    assert m0.save_text().startswith(new_id + " 10.0.0.1:7711 myself ")
    # Peers reach a node answering with another id: the old id loses its address.
    net.run_until(lambda: all((net.m(i).node(old_id).flags & NODE_NOADDR) for i in (1, 2, 3)), 3 * NODE_TIMEOUT)
    for i in (1, 2, 3):
        assert " :0 noaddr" in net.m(i).nodes_text()
        # known (until forgotten), but nothing can be sent to it
        assert old_id in net.m(i).known() and old_id not in net.m(i).reachable()
    with pytest.raises(MembershipError, match="Invalid node identifier"):
        m0.reset(True, net.now, "not-an-id")
    # Hard reset without an id draws one.
    net.call(0, lambda m: m.reset(True, net.now))
    assert m0.my_id not in (old_id, new_id) and is_node_id(m0.my_id)


def test_leaving_travels_and_hello_priorities() -> None:
    net = build(5, seed=8)
    leaver = 2
    net.call(leaver, lambda m: m.set_leaving(True, net.now))
    assert net.m(leaver).leaving
    assert "myself,leaving" in net.disk[leaver]
    me = {h[0]: h for h in net.m(leaver).hello()}
    assert me[net.ids[leaver]][3] == 100  # myself, leaving

    def everyone_knows() -> bool:
        return all(net.flags(i, leaver) == NODE_LEAVING for i in range(5) if i != leaver)

    elapsed = net.run_until(everyone_knows, NODE_TIMEOUT + 1000)
    print("LEAVING known everywhere after %d ms" % elapsed)
    for i in range(5):
        if i == leaver:
            continue
        m = net.m(i)
        assert net.ids[leaver] not in m.reachable() and len(m.reachable()) == 3
        prio = {h[0]: h[3] for h in m.hello()}
        assert prio[net.ids[leaver]] == 100
        assert prio[m.my_id] == 1
        assert all(prio[net.ids[j]] == 1 for j in range(5) if j not in (i, leaver))
        assert "leaving" in m.nodes_text()
    # Kill a node: without a link its priority is 5 at node 0, then 10 (PFAIL), then 100 (FAIL).
    net.kill(4)
    net.call(0, lambda m: m.tick(net.now))
    m0 = net.m(0)
    assert {h[0]: h[3] for h in m0.hello()}[net.ids[4]] == 5
    n4 = m0.node(net.ids[4])
    n4.flags |= NODE_PFAIL
    assert {h[0]: h[3] for h in m0.hello()}[net.ids[4]] == 10
    n4.flags = NODE_FAIL
    assert {h[0]: h[3] for h in m0.hello()}[net.ids[4]] == 100
    n4.flags = 0
    # Leaving can be cleared, and that travels too.
    net.call(leaver, lambda m: m.set_leaving(False, net.now))
    net.run_until(lambda: all(net.flags(i, leaver) == 0 for i in range(4) if i != leaver), NODE_TIMEOUT + 1000)


# ---------------------------------------------------------------------------
# nodes.conf
# ---------------------------------------------------------------------------
def test_save_and_load_round_trip() -> None:
    net = build(4, seed=9)
    m0 = net.m(0)
    net.call(0, lambda m: m.set_leaving(True, net.now))
    n2 = m0.node(net.ids[2])
    n2.flags |= NODE_PFAIL
    n3 = m0.node(net.ids[3])
    n3.flags |= NODE_NOADDR
    text = m0.save_text()
    m0.meet("9.9.9.9", 1234, net.now)
    assert m0.save_text() == text  # handshake nodes are not saved
    assert "9.9.9.9:1234" in m0.nodes_text()
    loaded = Membership.from_text(text + "\nvars leaving 1\n\n", my_port=PORT, node_timeout=NODE_TIMEOUT, now=5, rng=random.Random(1))
    assert loaded.my_id == m0.my_id and loaded.leaving
    assert sorted(loaded.known()) == sorted(m0.known())
    for node_id in m0.known():
        a, b = m0.node(node_id), loaded.node(node_id)
        assert (a.ip, a.port, a.flags) == (b.ip, b.port, b.flags)
        assert b.link is None
    assert loaded.node(net.ids[1]).pong_received == 5  # reloaded as "now"
    assert "disconnected" in loaded.nodes_text()
    check_invariants(loaded)
    # Round trip is stable once timestamps are normalised.
    again = Membership.from_text(loaded.save_text(), my_port=PORT, node_timeout=NODE_TIMEOUT, now=5, rng=random.Random(1))
    assert again.save_text() == loaded.save_text()
    # my_port comes from the configuration, not the file.
    moved = Membership.from_text(text, my_port=7000, node_timeout=NODE_TIMEOUT, now=5, rng=random.Random(1))
    assert moved.myself.port == 7000
    # The one-line file the single-node shell writes today (empty ip accepted too).
    nid = "0123456789abcdef" * 2 + "01234567"
    for line in ("%s 127.0.0.1:7711 myself 0 0 connected\n" % nid, "%s :7711 myself 0 0 connected" % nid):
        one = Membership.from_text(line, my_port=PORT, node_timeout=NODE_TIMEOUT, now=5, rng=random.Random(1))
        assert one.known() == [nid] and one.size() == 1


@pytest.mark.parametrize(
    "text",
    [
        "",
        "\n\n",
        "garbage",
        "vars leaving 1\n",
        "%s 1.2.3.4:7711 myself 0 0" % ("a" * 40),
        "%s 1.2.3.4:7711 myself 0 0 connected extra" % ("a" * 40),
        "%s 1.2.3.4:7711 myself 0 0 connected" % ("a" * 39),
        "%s 1.2.3.4:7711 myself 0 0 connected" % ("A" * 40),
        "%s 1.2.3.4 myself 0 0 connected" % ("a" * 40),
        "%s 1.2.3.4:port myself 0 0 connected" % ("a" * 40),
        "%s 1.2.3.4:99999 myself 0 0 connected" % ("a" * 40),
        "%s nothost:7711 myself 0 0 connected" % ("a" * 40),
        "%s 1.2.3.4:7711 myself,weird 0 0 connected" % ("a" * 40),
        "%s 1.2.3.4:7711 myself x 0 connected" % ("a" * 40),
        "%s 1.2.3.4:7711 noflags 0 0 connected" % ("a" * 40),
        "%s 1.2.3.4:7711 myself 0 0 connected\n%s 1.2.3.5:7711 myself 0 0 connected" % ("a" * 40, "b" * 40),
    ],
)
def test_corrupted_config(text: str) -> None:
    with pytest.raises(MembershipError, match="^corrupted cluster config file: "):
        Membership.from_text(text, my_port=PORT, node_timeout=NODE_TIMEOUT, now=5, rng=random.Random(1))


# ---------------------------------------------------------------------------
# Hostile and odd inputs
# ---------------------------------------------------------------------------
def joined_pair() -> tuple[Membership, str, int, int]:
    """A node that knows one peer P: returns (m, P's id, outbound link, inbound link)."""
    rng = random.Random(21)
    m = Membership(hexid(rng), "10.0.0.1", PORT, node_timeout=NODE_TIMEOUT, now=START, rng=rng, wall_offset=WALL)
    peer = hexid(rng)
    m.meet("10.0.0.2", PORT, START)
    m.tick(START + 100)
    (c,) = [e for e in m.take_effects() if isinstance(e, Connect)]
    m.link_up(c.node_id, 1, START + 100)
    m.receive(1, Pong(peer, PORT, 0), START + 110)
    m.link_peer(2, "10.0.0.2", "10.0.0.1")
    m.receive(2, Ping(peer, PORT, 0), START + 120)
    m.take_effects()
    assert m.node(peer).flags == 0 and m.link_of(peer) == 1
    return m, peer, 1, 2


def table_snapshot(m: Membership):
    return {nid: (n.ip, n.port, n.flags, n.link) for nid, n in m._nodes.items()}


def test_unknown_senders_and_myself_gossip_are_ignored() -> None:
    m, peer, out, inn = joined_pair()
    me = m.my_id
    before = table_snapshot(m)
    stranger = "e" * 40
    other = "d" * 40
    g_me_fail = Gossip(me, "10.0.0.1", PORT, NODE_FAIL | NODE_PFAIL, 1, 1)
    g_new = Gossip(other, "10.0.0.9", PORT, 0, 0, 0)
    # PING from an unknown sender: answered, nothing learnt.
    m.link_peer(7, "10.0.0.7")
    m.receive(7, Ping(stranger, PORT, NODE_LEAVING, (g_me_fail, g_new)), START + 200)
    eff = m.take_effects()
    assert len(eff) == 1 and isinstance(eff[0], Send) and eff[0].link == 7 and isinstance(eff[0].msg, Pong)
    assert eff[0].msg.sender == me
    assert table_snapshot(m) == before
    # PONG/FAIL from unknown senders: nothing at all.
    m.receive(7, Pong(stranger, PORT, 0, (g_new,)), START + 200)
    m.receive(7, Fail(stranger, peer), START + 200)
    assert m.take_effects() == [] and table_snapshot(m) == before
    # A known sender claims I am failing: ignored. FAIL about myself: ignored.
    m.receive(inn, Ping(peer, PORT, 0, (g_me_fail,)), START + 300)
    m.receive(inn, Fail(peer, me), START + 300)
    assert m.myself.flags == NODE_MYSELF and table_snapshot(m) == before
    # A message pretending to come from myself changes nothing.
    m.receive(inn, Ping(me, PORT, NODE_LEAVING, (Gossip(peer, "10.0.0.2", PORT, NODE_FAIL, 0, 0),)), START + 300)
    assert not m.leaving and m.node(peer).fail_reports == {}
    # MEET from an unknown sender on an inbound link: handshake towards the peer ip.
    m.link_peer(8, "10.0.0.8", "10.0.0.1")
    m.receive(8, Meet(stranger, 7000, 0, (g_new,)), START + 400)
    eff = m.take_effects()
    assert any(isinstance(e, Send) and isinstance(e.msg, Pong) for e in eff)
    hs = [n for n in m._nodes.values() if n.flags & NODE_HANDSHAKE]
    assert [(n.ip, n.port, n.flags) for n in hs] == [("10.0.0.8", 7000, NODE_HANDSHAKE)]
    # The same MEET again does not add a second handshake node.
    m.receive(8, Meet(stranger, 7000, 0), START + 401)
    assert len([n for n in m._nodes.values() if n.flags & NODE_HANDSHAKE]) == 1
    # Without a known peer ip the MEET is answered but adds nothing.
    m.receive(9, Meet("c" * 40, 7000, 0), START + 402)
    assert len([n for n in m._nodes.values() if n.flags & NODE_HANDSHAKE]) == 1
    check_invariants(m)
    # Data and auth frames are counted, not acted on.
    m.take_effects()
    received = m.stats["messages_received"]
    m.receive(inn, Data(peer, "GOTJOB", {"x": 1}), START + 500)
    m.receive(inn, AuthHello(b"n"), START + 500)
    assert m.take_effects() == [] and m.stats["messages_received"] == received + 2


def test_bogus_gossip_addresses() -> None:
    m, peer, out, inn = joined_pair()
    bad = [
        ("999.1.1.1", 7711),
        ("", 7711),
        ("localhost", 7711),
        ("1.2.3.4", 0),
        ("1.2.3.4", 70000),
        ("1.2.3.4", -1),
        (None, 7711),
        ("1.2.3.4", "7711"),
        ("1.2.3.4", True),
        ("x" * 1000, 7711),
    ]
    entries = tuple(Gossip("%040x" % k, ip, port, 0, 0, 0) for k, (ip, port) in enumerate(bad, 1))
    m.receive(inn, Ping(peer, PORT, 0, entries), START + 200)
    m.receive(inn, Ping(peer, PORT, 0, (Gossip("x", "1.2.3.4", 7711, 0, 0, 0), "junk", None)), START + 200)
    assert not [n for n in m._nodes.values() if n.flags & NODE_HANDSHAKE]
    # NOADDR gossip is not followed either.
    m.receive(inn, Ping(peer, PORT, 0, (Gossip("f" * 40, "1.2.3.4", 7711, NODE_NOADDR, 0, 0),)), START + 200)
    assert not [n for n in m._nodes.values() if n.flags & NODE_HANDSHAKE]
    # A valid one is.
    m.receive(inn, Ping(peer, PORT, 0, (Gossip("f" * 40, "1.2.3.4", 7711, 0, 0, 0),)), START + 200)
    assert [(n.ip, n.port) for n in m._nodes.values() if n.flags & NODE_HANDSHAKE] == [("1.2.3.4", 7711)]
    # Malformed headers are dropped without a reply.
    m.take_effects()
    for msg in (Ping(peer, "7711", 0), Ping(peer, PORT, None), Ping(peer, PORT, 0, None), Ping(None, PORT, 0), Meet(peer, 0, 0)):
        m.receive(inn, msg, START + 300)
    assert m.take_effects() == []
    check_invariants(m)


def test_address_update_and_mismatched_pong() -> None:
    m, peer, out, inn = joined_pair()
    # The peer pings us from a new address: we move it and drop the old link.
    m.link_peer(5, "10.0.0.22")
    m.receive(5, Ping(peer, 7001, 0), START + 200)
    eff = m.take_effects()
    assert Close(out) in eff and SaveConfig() in eff
    assert any(isinstance(e, Log) and "Address updated" in e.text for e in eff)
    assert (m.node(peer).ip, m.node(peer).port, m.link_of(peer)) == ("10.0.0.22", 7001, None)
    assert Connect(peer, "10.0.0.22", 17001) in eff  # it talks to us: reconnected at once, there
    m.tick(START + 300)
    assert not [e for e in m.take_effects() if isinstance(e, Connect)]  # in flight: not twice
    # Someone else answers our PING there: NOADDR, link closed, no reconnects.
    m.link_up(peer, 6, START + 310)
    m.take_effects()
    m.receive(6, Pong("9" * 40, 7001, 0), START + 320)
    eff = m.take_effects()
    assert Close(6) in eff
    n = m.node(peer)
    assert n.flags & NODE_NOADDR and (n.ip, n.port) == ("", 0)
    assert peer not in m.reachable()
    m.tick(START + 400)
    assert not [e for e in m.take_effects() if isinstance(e, Connect)]
    # It comes back with a PING on an inbound link: address restored.
    m.receive(inn, Ping(peer, PORT, 0), START + 500)
    assert not m.node(peer).flags & NODE_NOADDR and m.node(peer).ip == "10.0.0.2"
    assert peer in m.reachable()


def test_pfail_and_failure_reports_expire() -> None:
    m, peer, out, inn = joined_pair()
    # Add two more known peers by hand-driven handshakes.
    ids = [peer]
    for k, ip in enumerate(("10.0.0.3", "10.0.0.4")):
        nid = "%040x" % (k + 77)
        m.meet(ip, PORT, START + 130)
        m.tick(START + 130)
        (c,) = [e for e in m.take_effects() if isinstance(e, Connect)]
        m.link_up(c.node_id, 100 + k, START + 130)
        m.receive(100 + k, Pong(nid, PORT, 0), START + 130)
        ids.append(nid)
    m.take_effects()
    assert m.size() == 4
    victim, reporter = ids[2], ids[0]
    # Stop answering: the victim becomes PFAIL after node_timeout.
    t = START + 130
    logs = []
    while not m.node(victim).flags & NODE_PFAIL:
        t += 100
        m.tick(t)
        effects = m.take_effects()
        logs += [e.text for e in effects if isinstance(e, Log)]
        for e in effects:  # everyone but the victim answers
            if isinstance(e, Send) and isinstance(e.msg, Ping) and e.link != 101:
                owner = {1: ids[0], 100: ids[1]}[e.link]
                m.receive(e.link, Pong(owner, PORT, 0), t)
        assert t < START + 10 * NODE_TIMEOUT
    assert t - START > NODE_TIMEOUT
    assert any("possibly failing" in text for text in logs)
    # One report + me = 2 < 3 needed (4 nodes): stays PFAIL.
    report = (Gossip(victim, "10.0.0.4", PORT, NODE_PFAIL, 0, 0),)
    m.receive(inn, Ping(reporter, PORT, 0, report), t)
    assert m.node(victim).flags == NODE_PFAIL and reporter in m.node(victim).fail_reports
    # A second report after the first expired (node_timeout*2) does not count.
    t += 2 * NODE_TIMEOUT + 1
    m.link_peer(55, "10.0.0.3")
    m.receive(55, Ping(ids[1], PORT, 0, report), t)
    assert m.node(victim).flags == NODE_PFAIL
    assert list(m.node(victim).fail_reports) == [ids[1]]
    # A fresh one does: FAIL, broadcast to every linked node.
    m.take_effects()
    m.receive(inn, Ping(reporter, PORT, 0, report), t + 10)
    assert m.node(victim).flags == NODE_FAIL
    eff = m.take_effects()
    fails = [e for e in eff if isinstance(e, Send) and isinstance(e.msg, Fail)]
    assert {e.link for e in fails} == {1, 100} and all(e.msg.node_id == victim for e in fails)
    assert SaveConfig() in eff
    # A clean report from a reporter withdraws it.
    m.receive(inn, Ping(reporter, PORT, 0, (Gossip(victim, "10.0.0.4", PORT, 0, 0, 0),)), t + 20)
    assert reporter not in m.node(victim).fail_reports
    # FORGET of a reporter removes its reports everywhere.
    m.forget(ids[1], t + 30)
    assert m.node(victim).fail_reports == {}


# ---------------------------------------------------------------------------
# Property test: random garbage never raises nor breaks the table
# ---------------------------------------------------------------------------
ids_st = st.one_of(
    st.sampled_from(["a" * 40, "b" * 40, "0" * 40]),
    st.text(max_size=45),
    st.none(),
    st.integers(),
)
ip_st = st.one_of(st.sampled_from(["10.0.0.2", "10.0.0.3", "::1", "", "bad"]), st.text(max_size=10), st.none())
port_st = st.one_of(st.integers(min_value=-5, max_value=70000), st.sampled_from([7711, 0]), st.text(max_size=3))
flags_st = st.one_of(st.integers(min_value=0, max_value=255), st.none())
gossip_st = st.builds(Gossip, ids_st, ip_st, port_st, flags_st, st.integers(0, 10), st.integers(0, 10))
gossips_st = st.one_of(st.lists(gossip_st, max_size=4).map(tuple), st.none(), st.lists(st.integers(), max_size=2))
msg_st = st.one_of(
    st.builds(Ping, ids_st, port_st, flags_st, gossips_st),
    st.builds(Pong, ids_st, port_st, flags_st, gossips_st),
    st.builds(Meet, ids_st, port_st, flags_st, gossips_st),
    st.builds(Fail, ids_st, ids_st),
    st.builds(Data, ids_st, st.text(max_size=5), st.none()),
)


@settings(max_examples=150, deadline=None)
@given(st.lists(st.tuples(st.sampled_from([1, 2, 3, 4]), msg_st, st.booleans()), max_size=12))
def test_random_messages_never_raise(script) -> None:
    m, peer, out, inn = joined_pair()
    m.link_peer(3, "10.0.0.3")
    t = START + 200
    for link, msg, tick in script:
        t += 50
        m.receive(link, msg, t)
        if tick:
            m.tick(t)
        effects = m.take_effects()
        assert sum(isinstance(e, SaveConfig) for e in effects) <= 1
        check_invariants(m)
        text = m.save_text()
        Membership.from_text(text, my_port=PORT, node_timeout=NODE_TIMEOUT, now=t, rng=random.Random(0))
        for line in m.nodes_text().splitlines():
            assert LINE_RE.match(line), line


def test_cluster_node_repr_and_views() -> None:
    n = ClusterNode("a" * 40, "1.2.3.4", 7711, NODE_PFAIL | NODE_LEAVING, 0)
    assert "fail?,leaving" in repr(n)
    m, peer, out, inn = joined_pair()
    assert m.node("nope") is None and m.link_of("nope") is None
    m.stats["auth_failures"] += 2
    assert m.info_fields()["cluster_stats_auth_failures"] == 2
    # link_down of our outbound link: reconnect on the next tick, not twice.
    m.link_down(out, START + 200)
    m.link_down(out, START + 200)
    m.tick(START + 300)
    m.tick(START + 400)
    assert [e for e in m.take_effects() if isinstance(e, Connect)] == [Connect(peer, "10.0.0.2", PORT + BUS_PORT_OFFSET)]
    assert {h[0]: h[3] for h in m.hello()}[peer] == 5


def test_connect_in_flight_to_an_old_address_is_dropped() -> None:
    m, peer, out, inn = joined_pair()
    m.link_down(out, START + 200)
    m.tick(START + 300)
    assert Connect(peer, "10.0.0.2", PORT + BUS_PORT_OFFSET) in m.take_effects()
    # While that connect is in flight the peer shows up at a new address.
    m.link_peer(11, "10.0.0.33")
    m.receive(11, Ping(peer, PORT, 0), START + 310)
    m.take_effects()
    m.tick(START + 350)  # still one connect in flight: no second Connect
    assert not [e for e in m.take_effects() if isinstance(e, Connect)]
    m.link_up(peer, 12, START + 360)
    assert m.take_effects() == [Close(12)]
    m.tick(START + 400)
    assert Connect(peer, "10.0.0.33", PORT + BUS_PORT_OFFSET) in m.take_effects()
    m.link_up(peer, 13, START + 410)
    assert m.link_of(peer) == 13
    (send,) = m.take_effects()
    assert isinstance(send.msg, Ping) and send.link == 13


def test_a_peer_that_stops_answering_loses_its_inbound_links_too() -> None:
    """What a peer sent before a cut must not be read when the network heals: its links to us
    close when it stops answering our PINGs (overdue PONG on the outbound link, then PFAIL)."""
    m, peer, out, inn = joined_pair()
    other = "%040x" % 99
    m.link_peer(5, "10.0.0.5")
    m.receive(5, Ping(other, PORT, 0), START + 130)  # an unknown node's link: never closed here
    m.take_effects()
    t = START + 130
    closed: list[int] = []
    while out not in closed:
        t += TICK_MS
        m.tick(t)
        closed += [e.link for e in m.take_effects() if isinstance(e, Close)]
        assert t < START + 2 * NODE_TIMEOUT
    assert sorted(closed) == [out, inn]  # both directions at once, not the stranger's link
    assert m.link_of(peer) is None and not m.node(peer).flags & NODE_PFAIL
    # It reconnects (a new inbound link) but still does not answer: PFAIL closes the new one.
    m.link_peer(6, "10.0.0.2", "10.0.0.1")
    m.receive(6, Ping(peer, PORT, 0), t)
    m.take_effects()
    closed = []
    while not m.node(peer).flags & NODE_PFAIL:
        t += TICK_MS
        m.tick(t)
        for e in m.take_effects():
            if isinstance(e, Connect):
                m.link_failed(e.node_id, t)  # its address does not answer
            elif isinstance(e, Close):
                closed.append(e.link)
        assert t < START + 4 * NODE_TIMEOUT
    assert closed == [6]
    # Back again: its new link is kept.
    m.link_peer(7, "10.0.0.2", "10.0.0.1")
    m.receive(7, Ping(peer, PORT, 0), t + 1)
    assert not [e for e in m.take_effects() if isinstance(e, Close)]
    check_invariants(m)


# ---------------------------------------------------------------------------
# Releases: what each node announces, and what it knows of its peers
# ---------------------------------------------------------------------------
def _announced(net: SimNet, releases: dict[int, tuple[str, tuple[str, ...]]]) -> None:
    for i, (release, features) in releases.items():
        net.m(i).announce(release, features, unannounced="0.1.0")


def test_releases_are_announced_on_every_link_and_learned_from_the_answer() -> None:
    net = SimNet(3)
    _announced(net, {0: ("0.2.0", ("priority", "returned")), 1: ("0.3.0", ("priority", "returned", "zz"))})
    # node 2 announces nothing, as a node of before announcements (0.1.0)
    net.meet(0, 1)
    net.meet(0, 2)
    net.run_until(net.all_clean, 5000)
    a = net.m(0)
    b, c = a.node(net.ids[1]), a.node(net.ids[2])
    assert (b.release, b.features) == ("0.3.0", frozenset({"priority", "returned", "zz"}))
    assert net.m(1).node(net.ids[0]).release == "0.2.0"
    # the silent one: unknown until a second PONG came without an answer, then "0.1.0"
    net.run_until(lambda: None not in (c.release, net.m(1).node(net.ids[2]).release), 10_000)
    assert (c.release, c.features) == ("0.1.0", None)
    assert net.m(1).node(net.ids[2]).release == "0.1.0"
    # CLUSTER NODES: Disque's six fields, then the release; nodes.conf without it
    rows = {line.split()[0]: line.split() for line in a.nodes_text().splitlines()}
    assert [len(r) for r in rows.values()] == [7, 7, 7]
    assert {k: r[6] for k, r in rows.items()} == {net.ids[0]: "0.2.0", net.ids[1]: "0.3.0", net.ids[2]: "0.1.0"}
    assert all(LINE_RE.match(line) for line in a.save_text().splitlines())
    # the one that announces nothing keeps Disque's lines exactly, and never answers
    assert all(LINE_RE.match(line) for line in net.m(2).nodes_text().splitlines())
    assert net.m(2).node(net.ids[0]).release is None
    assert all(m.stats["versions_malformed"] == 0 for m in net.members)


def test_a_new_link_forgets_what_the_last_one_said() -> None:
    """A peer restarted (on another release, maybe) is unknown again until it answers."""
    net = SimNet(2)
    _announced(net, {0: ("0.2.0", ("priority",)), 1: ("0.2.0", ("priority",))})
    net.meet(0, 1)
    net.run_until(lambda: net.all_clean() and net.m(0).node(net.ids[1]).release == "0.2.0", 5000)
    net.kill(1)
    net.revive(1)  # from its nodes.conf, announcing nothing now: "downgraded"
    net.run_until(lambda: net.m(0).node(net.ids[1]).release == "0.1.0", 20_000)
    assert net.m(0).node(net.ids[1]).features is None


@pytest.mark.parametrize("body", [
    None, "0.2.0", [], ["0.2.0"], [7, []], ["", []], ["x" * 33, []], ["0.2 0", []], ["0.2.0", "priority"],
    ["0.2.0", [1]], ["0.2.0", ["a b"]], ["0.2.0", ["f"] * 65], [["0.2.0"], []], [b"0.2.0", []],
])  # fmt: skip
def test_a_malformed_announcement_is_counted_and_ignored(body) -> None:
    net = SimNet(2)
    _announced(net, {0: ("0.2.0", ()), 1: ("0.2.0", ())})
    net.meet(0, 1)
    net.run_until(lambda: net.all_clean() and net.m(0).node(net.ids[1]).release == "0.2.0", 5000)
    a = net.m(0)
    out = a.link_of(net.ids[1])
    # on our outbound link (an answer) and on an inbound one (a question): neither is taken
    a.receive(out, Data(net.ids[1], "VERSION", body), net.now)
    inbound = next(link for link, (owner, peer, _) in net.links.items() if owner == 0 and link != out)
    a.receive(inbound, Data(net.ids[1], "VERSION", body), net.now)
    assert a.stats["versions_malformed"] == 2
    assert a.node(net.ids[1]).release == "0.2.0"
    assert not [e for e in a.take_effects() if isinstance(e, Send)]  # no answer to a malformed one


def test_a_later_release_may_add_fields_to_its_announcement() -> None:
    net = SimNet(2)
    _announced(net, {0: ("0.2.0", ()), 1: ("0.2.0", ())})
    net.meet(0, 1)
    net.run_until(lambda: net.all_clean() and net.m(0).node(net.ids[1]).release == "0.2.0", 5000)
    a = net.m(0)
    a.receive(a.link_of(net.ids[1]), Data(net.ids[1], "VERSION", ["9.1.0", ["x"], {"more": 1}]), net.now)
    assert (a.node(net.ids[1]).release, a.node(net.ids[1]).features) == ("9.1.0", frozenset({"x"}))
    # an answer on our link from someone else than the node at its end is not taken
    a.receive(a.link_of(net.ids[1]), Data(net.ids[0], "VERSION", ["9.9.9", []]), net.now)
    assert a.node(net.ids[1]).release == "9.1.0"


def test_announce_checks_its_arguments() -> None:
    m = SimNet(1).m(0)
    for release, features in (("", ()), ("0.2 0", ()), ("0.2.0", ("a b",)), ("0.2.0", ["f%d" % i for i in range(65)])):
        with pytest.raises(MembershipError, match="Invalid release or feature"):
            m.announce(release, features)
    with pytest.raises(MembershipError, match="Invalid release"):
        m.announce("0.2.0", (), unannounced="0 1")
    m.announce("0.2.0", ("b", "a", "a"))
    assert m.myself.release == "0.2.0" and m.myself.features == frozenset({"a", "b"})


class AdaptiveNet(SimNet):
    """Each node ticks when its own ``idle_tick_ms`` says (as a node's timers run it), on a 100 ms grid."""

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.next_tick = [self.now] * len(self.members)
        self.ticks = [0] * len(self.members)

    def step(self) -> None:
        self.now += TICK_MS
        for i, m in enumerate(self.members):
            if m is not None and self.now >= self.next_tick[i]:
                self.call(i, lambda m: m.tick(self.now))
                self.ticks[i] += 1
                self.next_tick[i] = self.now + m.idle_tick_ms()


def test_a_settled_cluster_ticks_less_often_and_still_fails_a_killed_node_in_time() -> None:
    timeout = 15_000
    net = AdaptiveNet(5, seed=3, node_timeout=timeout)
    for i in range(1, 5):
        net.meet(0, i)
    net.run_until(net.all_clean, 20_000)
    net.run(2_000)
    assert all(m.settled and m.idle_tick_ms() == 500 for m in net.members)  # 1/20 of 15 s, at most 500 ms
    pings_before = [m.stats["messages_sent"] for m in net.members]
    ticks_before = list(net.ticks)
    net.run(20_000)
    assert all(t - t0 <= 41 for t, t0 in zip(net.ticks, ticks_before))  # 2 a second, not 10
    # the random ping is once a second whatever the tick: ~20 each, plus the scheduled ones and the PONGs
    assert all(m.stats["messages_sent"] - p >= 20 for m, p in zip(net.members, pings_before))

    net.kill(4)
    alive = net.alive_indexes()
    net.run(TICK_MS * 6)
    assert all(not net.m(i).settled and net.m(i).idle_tick_ms() == TICK_MS for i in alive)  # a link is down
    elapsed = net.run_until(lambda: all(net.flags(i, 4) == NODE_FAIL for i in alive), 4 * timeout)
    assert timeout < elapsed <= int(1.5 * timeout)


def test_the_idle_tick_follows_the_node_timeout_within_its_bounds() -> None:
    for timeout, expected in ((15_000, 500), (3_000, 150), (1_000, 100), (60_000, 500)):
        net = AdaptiveNet(2, node_timeout=timeout)
        net.meet(0, 1)
        net.run_until(net.all_clean, 4 * max(timeout, 1000))
        net.run(1_000)
        assert [m.idle_tick_ms() for m in net.members] == [expected, expected]
    lone = Membership("a" * 40, "10.0.0.1", PORT, node_timeout=15_000, now=START, rng=random.Random(1))
    assert lone.idle_tick_ms() == TICK_MS  # before its first tick: in flux
    lone.tick(START + 100)
    assert lone.settled and lone.idle_tick_ms() == 500  # alone: nothing to wait for


def test_the_view_key_changes_when_a_peer_announces_its_features() -> None:
    """The server refreshes the core's view (and which peers lack a feature) only when the key
    changed: a peer's announcement, arriving after the link settled, must change it."""
    net = SimNet(2)
    net.meet(0, 1)
    net.run_until(net.all_clean, 5000)
    a = net.m(0)
    before = a.view_key()
    a.receive(a.link_of(net.ids[1]), Data(net.ids[1], "VERSION", ["0.2.0", ["priority"]]), net.now)
    assert a.node(net.ids[1]).features == frozenset({"priority"})
    assert a.view_key() != before


def test_a_ping_from_a_node_we_have_no_link_to_connects_at_once() -> None:
    """A node that restarted (or a healed cut) talks to us before our next tick: its PING makes
    the Connect at once, not up to a tick later; once, while that connect is in flight."""
    m, peer, out, inn = joined_pair()
    m.link_down(out, START + 200)
    m.take_effects()
    m.link_peer(21, "10.0.0.2")
    m.receive(21, Ping(peer, PORT, 0), START + 210)
    assert [e for e in m.take_effects() if isinstance(e, Connect)] == [Connect(peer, "10.0.0.2", PORT + BUS_PORT_OFFSET)]
    m.receive(21, Ping(peer, PORT, 0), START + 220)
    m.tick(START + 300)
    assert not [e for e in m.take_effects() if isinstance(e, Connect)]  # still in flight
    m.link_up(peer, 22, START + 310)
    assert m.link_of(peer) == 22
    m.take_effects()
    m.receive(21, Ping(peer, PORT, 0), START + 320)  # linked: nothing more
    assert not [e for e in m.take_effects() if isinstance(e, Connect)]


# ---------------------------------------------------------------------------
# Ticks in slices: the PINGs a tick finds due, sent a few at a time
# ---------------------------------------------------------------------------
class SlicedNet(SimNet):
    """Each node's tick only walks the table (``max_pings=0``); then passes of 1 ms each, in which
    every node sends at most ``per_pass`` of the PINGs it found due (as the server's steps do)."""

    def __init__(self, *args, per_pass: int = 1, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.per_pass = per_pass
        self.pings: dict[tuple[int, int], list[int]] = {}  # (from, to) -> when each PING was sent
        self.sent = {"walk": 0, "pass": 0}  # the most messages one call of each sent
        self.passes = 0

    def counted(self, kind: str, fn: Callable[[Membership], None]) -> Callable[[Membership], None]:
        def call(m: Membership) -> None:
            before = m.stats["messages_sent"]
            fn(m)
            self.sent[kind] = max(self.sent[kind], m.stats["messages_sent"] - before)

        return call

    def _effect(self, i: int, e) -> None:
        if isinstance(e, Send) and isinstance(e.msg, Ping) and e.link in self.links:
            peer = self.links[e.link][1]
            self.pings.setdefault((i, peer), []).append(self.now)
        super()._effect(i, e)

    def step(self) -> None:
        self.now += TICK_MS
        for i in range(len(self.members)):
            self.call(i, self.counted("walk", lambda m: m.tick(self.now, max_pings=0)))
        start = self.now
        while any(m is not None and m.pings_due() for m in self.members):
            self.now += 1
            self.passes += 1
            for i, m in enumerate(self.members):
                if m is not None and m.pings_due():
                    self.call(i, self.counted("pass", lambda m: m.send_pings(self.now, self.per_pass)))
        self.now = start  # the passes took a few ms of the next tick's 100


def test_a_tick_can_leave_its_pings_to_send_pings_and_each_peer_is_still_pinged_in_time() -> None:
    n = 7
    net = SlicedNet(n, seed=5)
    for i in range(1, n):
        net.meet(0, i)
    net.run_until(net.all_clean, 10_000)
    net.pings.clear()
    start = net.now
    net.run(10 * NODE_TIMEOUT)
    assert net.passes > 0  # pings were left to the passes
    assert net.sent == {"walk": 0, "pass": 1}  # a walk sends nothing, a pass one PING
    # Every node pinged every other at least every node_timeout / 2 after its PONG, at the tick
    # that found it due (TICK_MS) and the passes it waited (one ms each, n - 1 at most).
    for i in range(n):
        for j in range(n):
            if i != j:
                times = [start] + net.pings[(i, j)] + [net.now]
                assert max(b - a for a, b in zip(times, times[1:])) <= NODE_TIMEOUT // 2 + TICK_MS + n - 1
    # A killed node is PFAIL then FAIL in the same time as with whole ticks.
    net.kill(6)
    alive = net.alive_indexes()
    elapsed = net.run_until(lambda: all(net.flags(i, 6) == NODE_FAIL for i in alive), 4 * NODE_TIMEOUT)
    assert NODE_TIMEOUT < elapsed <= int(1.5 * NODE_TIMEOUT)


def test_send_pings_sends_at_most_its_limit_oldest_first_and_skips_what_is_no_longer_wanted() -> None:
    net = build(5, seed=9)
    m = net.m(0)
    peers = [m.node(net.ids[j]) for j in range(1, 5)]
    t = net.now + NODE_TIMEOUT  # every PONG is older than node_timeout / 2: all four are due
    m.tick(t, max_pings=0)
    assert m.pings_due() == 4 and not [e for e in m.take_effects() if isinstance(e, Send)]
    order = list(m._pings_due)
    assert m.send_pings(t + 1, 2) == 2
    sent = [e for e in m.take_effects() if isinstance(e, Send)]
    assert [s.link for s in sent] == [m.node(nid).link for nid in order[:2]]
    assert all(isinstance(s.msg, Ping) for s in sent)
    assert [m.node(nid).ping_sent for nid in order[:2]] == [t + 1, t + 1]  # the PONG is awaited from then
    # The next tick finds the two still unsent due again: queued once each.
    m.tick(t + 100, max_pings=0)
    assert m.pings_due() == 2 and not [e for e in m.take_effects() if isinstance(e, Send)]
    # One's link goes down, the other is forgotten: neither is pinged, and nothing is left.
    gone_link, forgotten = m.node(order[2]).link, order[3]
    m.link_down(gone_link, t + 101)
    m.forget(forgotten, t + 101)
    m.take_effects()
    assert m.send_pings(t + 102, 10) == 0
    assert not [e for e in m.take_effects() if isinstance(e, Send)]
    # A PING sent meanwhile on a new link (link_up) is not doubled by the queued one.
    again = m.node(order[2])
    m.tick(t + 200, max_pings=0)
    (c,) = [e for e in m.take_effects() if isinstance(e, Connect) and e.node_id == again.id]
    m.link_up(again.id, 99, t + 201)
    assert len([e for e in m.take_effects() if isinstance(e, Send) and isinstance(e.msg, Ping)]) == 1
    m._pings_due[again.id] = again  # (as if a tick had found it due before its link came back)
    assert m.send_pings(t + 202, 1) == 0 and not m.take_effects()
    # With no limit a tick sends every PING due at once, as before.
    t2 = t + 10 * NODE_TIMEOUT
    for p in peers:
        if p.link is not None:
            p.ping_sent = 0
    m.tick(t2)
    assert m.pings_due() == 0
    assert len([e for e in m.take_effects() if isinstance(e, Send) and isinstance(e.msg, Ping)]) == 3
    check_invariants(m)
