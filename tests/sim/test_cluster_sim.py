"""Whole clusters in one process: membership + bus + job core, memory streams, virtual time."""

from __future__ import annotations

import pytest
import trio

from disque_py.core.effects import BLOCKED

from .netsim import MemoryNetwork, SimServer, wait_until

NODE_TIMEOUT = 3000  # ms; virtual time, so it costs nothing


async def start_cluster(
    nursery, tmp_path, n: int, base: int = 7000, per_node: list[dict] | None = None, **directives
) -> tuple[MemoryNetwork, list[SimServer]]:
    net = MemoryNetwork(nursery)
    nodes = []
    for i in range(n):
        d = tmp_path / ("n%d" % i)
        d.mkdir(exist_ok=True)
        extra = dict(directives, **(per_node[i] if per_node else {}))
        s = SimServer(net, base + i, d, cluster_node_timeout=NODE_TIMEOUT, **extra)
        await nursery.start(s.run)
        nodes.append(s)
    return net, nodes


def all_know(nodes: list[SimServer], n: int) -> bool:
    return all(s.known() == n for s in nodes)


async def test_chain_of_seven_becomes_full_mesh(nursery, tmp_path, autojump_clock):
    net, nodes = await start_cluster(nursery, tmp_path, 7)
    for a, b in zip(nodes, nodes[1:]):
        assert a.cmd("CLUSTER", "MEET", "127.0.0.1", b.port) == b"OK"
    took = await wait_until(lambda: all_know(nodes, 7), timeout=30, what="full mesh")
    assert took < 15
    for s in nodes:
        assert s.node.ctx.cluster_size == 7
        assert len(s.node.ctx.reachable) == 6
        lines = s.cmd("CLUSTER", "NODES").decode().splitlines()
        assert len(lines) == 7
        assert all(line.split()[2] in ("myself", "noflags") for line in lines), lines
        assert all(line.split()[5] == "connected" for line in lines)  # (then each node's release)
        hello = s.node.execute(1, [b"HELLO"], int(trio.current_time() * 1000))
        assert hello[0] == 1 and len(hello) == 2 + 7
        assert {entry[3] for entry in hello[2:]} == {b"1"}


async def test_killed_nodes_fail_and_recover(nursery, tmp_path, autojump_clock):
    net, nodes = await start_cluster(nursery, tmp_path, 7)
    for b in nodes[1:]:
        nodes[0].cmd("CLUSTER", "MEET", "127.0.0.1", b.port)
    await wait_until(lambda: all_know(nodes, 7), timeout=30, what="full mesh")
    victims, alive = nodes[5:], nodes[:5]
    ids = [v.cluster.my_id for v in victims]
    for v in victims:
        v.kill()
    await wait_until(
        lambda: all(s.flags(v) == "fail" for s in alive for v in victims),
        timeout=NODE_TIMEOUT * 4 / 1000,
        what="victims flagged FAIL everywhere",
    )
    for s in alive:
        assert not set(ids) & set(s.node.ctx.reachable)
        prio = {e[0]: e[3] for e in s.node.execute(1, [b"HELLO"], int(trio.current_time() * 1000))[2:]}
        assert all(prio[i.encode()] == b"100" for i in ids)
    # bring them back with the same identity (nodes.conf kept in their dirs)
    revived = []
    for v, old_id in zip(victims, ids):
        r = SimServer(net, v.port, v.config.dir, cluster_node_timeout=NODE_TIMEOUT)
        assert r.cluster.my_id == old_id
        await nursery.start(r.run)
        revived.append(r)
    everyone = alive + revived
    await wait_until(
        lambda: all(len(s.node.ctx.reachable) == 6 for s in everyone),
        timeout=NODE_TIMEOUT * 4 / 1000,
        what="FAIL cleared everywhere",
    )
    for s in alive:
        assert all(s.flags(r) == "noflags" for r in revived)


async def test_partition_minority_sees_pfail_majority_fail_then_heal(nursery, tmp_path, autojump_clock):
    net, nodes = await start_cluster(nursery, tmp_path, 7)
    for b in nodes[1:]:
        nodes[0].cmd("CLUSTER", "MEET", "127.0.0.1", b.port)
    await wait_until(lambda: all_know(nodes, 7), timeout=30, what="full mesh")
    minority, majority = nodes[:3], nodes[3:]
    net.partition({s.port + 10000 for s in minority}, {s.port + 10000 for s in majority})
    await wait_until(
        lambda: all(s.flags(m) == "fail" for s in majority for m in minority),
        timeout=NODE_TIMEOUT * 4 / 1000,
        what="majority flags the minority FAIL",
    )
    for s in minority:
        for m in majority:
            assert s.flags(m) in ("fail?", "fail"), s.flags(m)
    # the minority (3 of 7) cannot reach a majority on its own
    assert all(s.flags(m) == "fail?" for s in minority for m in majority)
    net.heal()
    await wait_until(
        lambda: all(len(s.node.ctx.reachable) == 6 for s in nodes),
        timeout=NODE_TIMEOUT * 4 / 1000,
        what="partition healed",
    )


async def test_forget_leaving_and_pause_bcast(nursery, tmp_path, autojump_clock):
    net, nodes = await start_cluster(nursery, tmp_path, 3)
    for b in nodes[1:]:
        nodes[0].cmd("CLUSTER", "MEET", "127.0.0.1", b.port)
    await wait_until(lambda: all_know(nodes, 3), timeout=30, what="full mesh")
    # LEAVING travels by gossip and shows as priority 100 everywhere
    assert nodes[2].cmd("CLUSTER", "LEAVING", "yes") == b"OK"
    assert nodes[2].cmd("CLUSTER", "LEAVING") == b"yes"
    leaving_id = nodes[2].cluster.my_id.encode()

    def sees_leaving(s: SimServer) -> bool:
        hello = s.node.execute(1, [b"HELLO"], int(trio.current_time() * 1000))
        return any(e[0] == leaving_id and e[3] == b"100" for e in hello[2:])

    await wait_until(lambda: all(sees_leaving(s) for s in nodes), timeout=10, what="leaving flag everywhere")
    assert nodes[0].flags(nodes[2]) == "leaving"
    assert nodes[2].node.ctx.leaving
    # PAUSE ... bcast sets the state on the other nodes
    now = int(trio.current_time() * 1000)
    assert nodes[0].node.execute(1, [b"PAUSE", b"q", b"in", b"bcast"], now) == b"in"
    nodes[0].apply_effects()
    await wait_until(
        lambda: all(s.node.execute(1, [b"PAUSE", b"q", b"state"], 0) == b"in" for s in nodes[1:]),
        timeout=5,
        what="pause state broadcast",
    )
    # FORGET: gone, and gossip does not bring it back during the ban
    forgotten = nodes[1].cluster.my_id
    for s in (nodes[0], nodes[2]):
        assert s.cmd("CLUSTER", "FORGET", forgotten) == b"OK"
    await trio.sleep(20)
    assert all(forgotten not in s.cluster.membership.known() for s in (nodes[0], nodes[2]))
    assert nodes[0].cmd("CLUSTER", "FORGET", "x" * 40).startswith("ERR Unknown node")
    assert nodes[0].cmd("CLUSTER", "FORGET", "short").startswith("ERR Invalid node identifier")
    assert "forget myself" in nodes[0].cmd("CLUSTER", "FORGET", nodes[0].cluster.my_id)


async def test_cluster_secret_keeps_outsiders_out(nursery, tmp_path, autojump_clock):
    secrets = [{"cluster_secret": "s3cret"}, {"cluster_secret": "s3cret"}, {"cluster_secret": "other"}, {}]
    net, nodes = await start_cluster(nursery, tmp_path, 4, per_node=secrets)
    members, outsiders = nodes[:2], nodes[2:]
    members[0].cmd("CLUSTER", "MEET", "127.0.0.1", members[1].port)
    await wait_until(lambda: all_know(members, 2), timeout=20, what="members meet")
    for o in outsiders:  # wrong secret, and no secret at all
        members[0].cmd("CLUSTER", "MEET", "127.0.0.1", o.port)
        o.cmd("CLUSTER", "MEET", "127.0.0.1", members[1].port)
    await trio.sleep(10)
    assert [s.known() for s in nodes] == [2, 2, 1, 1]
    assert sum(s.cluster.stats["auth_failures"] for s in nodes) >= 2
    info = members[0].cmd("CLUSTER", "INFO").decode()
    assert "cluster_known_nodes:2" in info


@pytest.mark.parametrize("hard", [False, True])
async def test_reset(nursery, tmp_path, autojump_clock, hard):
    net, nodes = await start_cluster(nursery, tmp_path, 2)
    nodes[0].cmd("CLUSTER", "MEET", "127.0.0.1", nodes[1].port)
    await wait_until(lambda: all_know(nodes, 2), timeout=20, what="meet")
    old = nodes[0].cluster.my_id
    assert nodes[0].cmd("CLUSTER", "RESET", "HARD" if hard else "SOFT") == b"OK"
    assert nodes[0].known() == 1
    assert (nodes[0].cluster.my_id != old) == hard
    assert nodes[0].node.id == nodes[0].cluster.my_id


async def test_a_node_that_reset_its_id_is_not_waited_for(nursery, tmp_path, autojump_clock):
    """After CLUSTER RESET HARD the old ID has no address: ADDJOB must not wait for it."""
    net, nodes = await start_cluster(nursery, tmp_path, 3)
    for b in nodes[1:]:
        nodes[0].cmd("CLUSTER", "MEET", "127.0.0.1", b.port)
    await wait_until(lambda: all_know(nodes, 3), timeout=30, what="full mesh")
    old = nodes[2].cluster.my_id
    assert nodes[2].cmd("CLUSTER", "RESET", "HARD") == b"OK"
    await wait_until(lambda: all(" :0 noaddr" in s.cmd("CLUSTER", "NODES").decode() for s in nodes[:2]),
                     timeout=NODE_TIMEOUT * 3 / 1000, what="old ID without address")  # fmt: skip
    now = int(trio.current_time() * 1000)
    for s in nodes[:2]:
        assert s.node.ctx.cluster_size == 3 and old not in s.node.ctx.reachable
        # the default factor is the cluster size (3): only one other node can take a copy
        reply = s.node.execute(1, [b"ADDJOB", b"q", b"body", b"0"], now)
        assert str(reply).startswith("NOREPL Not enough reachable nodes"), reply
        # two copies still can be made: the client waits for the other node's GOTJOB
        assert s.node.execute(2, [b"ADDJOB", b"q", b"body", b"0", b"REPLICATE", b"2"], now) is BLOCKED


async def test_replayed_frame_closes_the_link_and_is_counted(nursery, tmp_path, autojump_clock):
    net, nodes = await start_cluster(nursery, tmp_path, 3, cluster_secret="s3cret")
    for b in nodes[1:]:
        nodes[0].cmd("CLUSTER", "MEET", "127.0.0.1", b.port)
    await wait_until(lambda: all(len(s.node.ctx.reachable) == 2 for s in nodes), timeout=20, what="mesh")
    a, b = nodes[0], nodes[1]
    net.replay_next_write(a.port + 10000, b.port + 10000)
    await wait_until(lambda: b.cluster.stats["auth_failures"] >= 1, timeout=10, what="replay detected")
    # the link was dropped and re-established; the cluster stays whole
    await trio.sleep(NODE_TIMEOUT * 2 / 1000)
    assert all(len(s.node.ctx.reachable) == 2 for s in nodes)
    assert all(s.flags(o) == "noflags" for s in nodes for o in nodes if o is not s)


async def test_garbage_on_a_link_is_counted_and_the_node_carries_on(nursery, tmp_path, autojump_clock):
    net, nodes = await start_cluster(nursery, tmp_path, 2)
    nodes[0].cmd("CLUSTER", "MEET", "127.0.0.1", nodes[1].port)
    await wait_until(lambda: all(len(s.node.ctx.reachable) == 1 for s in nodes), timeout=20, what="meet")
    evil = await net.transport(9999).open_connection("127.0.0.1", nodes[1].port + 10000)
    await evil.send_all(b"\x00\x00\x00\x05\xc1\xc1\xc1\xc1\xc1")  # a frame of invalid msgpack
    await wait_until(lambda: nodes[1].cluster.stats["bad_frames"] >= 1, timeout=5, what="bad frame counted")
    assert await evil.receive_some(10) == b""  # closed on us
    await trio.sleep(NODE_TIMEOUT * 2 / 1000)
    assert len(nodes[1].node.ctx.reachable) == 1


async def test_a_silent_inbound_link_is_closed_and_counted(nursery, tmp_path, autojump_clock):
    """A connection to the bus that never says anything only holds a descriptor: closed after 5 s."""
    from cluster_bus.links import HANDSHAKE_TIMEOUT

    net, nodes = await start_cluster(nursery, tmp_path, 2)
    nodes[0].cmd("CLUSTER", "MEET", "127.0.0.1", nodes[1].port)
    await wait_until(lambda: all(len(s.node.ctx.reachable) == 1 for s in nodes), timeout=20, what="meet")
    bus = nodes[1].cluster.bus
    silent = await net.transport(9999).open_connection("127.0.0.1", nodes[1].port + 10000)
    t0 = trio.current_time()
    with trio.fail_after(HANDSHAKE_TIMEOUT * 3):
        assert await silent.receive_some(10) == b""  # closed on us
    assert HANDSHAKE_TIMEOUT <= trio.current_time() - t0 < HANDSHAKE_TIMEOUT + 1
    assert bus.stats["silent_links"] == 1 and nodes[1].cluster.stats["bad_frames"] == 1
    # the peers' own links, which spoke at once, are untouched
    await trio.sleep(NODE_TIMEOUT * 2 / 1000)
    assert len(nodes[1].node.ctx.reachable) == 1 and bus.stats["silent_links"] == 1


async def test_a_flood_of_silent_links_cycles_through_a_bounded_number(nursery, tmp_path, autojump_clock):
    """Beyond MAX_UNHEARD_LINKS inbound links waiting for a first message, each new one closes the
    oldest at once instead of holding a descriptor for 5 s; the peers' links are untouched."""
    from cluster_bus.links import HANDSHAKE_TIMEOUT, MAX_UNHEARD_LINKS

    net, nodes = await start_cluster(nursery, tmp_path, 2)
    nodes[0].cmd("CLUSTER", "MEET", "127.0.0.1", nodes[1].port)
    await wait_until(lambda: all(len(s.node.ctx.reachable) == 1 for s in nodes), timeout=20, what="meet")
    bus = nodes[1].cluster.bus
    links_before = len(bus.links)
    t0 = trio.current_time()
    silent = [await net.transport(9999).open_connection("127.0.0.1", nodes[1].port + 10000)
              for _ in range(MAX_UNHEARD_LINKS + 10)]  # fmt: skip
    await wait_until(lambda: bus.stats["evicted_links"] == 10, timeout=1, what="the oldest ten evicted")
    for s in silent[:10]:
        with trio.fail_after(1):
            assert await s.receive_some(10) == b""  # closed on us, long before the 5 s deadline
    assert trio.current_time() - t0 < 1
    assert len(bus.links) == links_before + MAX_UNHEARD_LINKS
    with trio.fail_after(HANDSHAKE_TIMEOUT * 3):  # the rest go at their deadline, as before
        for s in silent[10:]:
            assert await s.receive_some(10) == b""
    assert bus.stats["silent_links"] == MAX_UNHEARD_LINKS and bus.stats["evicted_links"] == 10
    await trio.sleep(NODE_TIMEOUT * 2 / 1000)
    assert len(nodes[1].node.ctx.reachable) == 1 and len(bus.links) == links_before


@pytest.mark.parametrize("secret", [None, "s3cret"])
async def test_data_sent_in_one_turn_travels_as_one_batch_in_order(nursery, tmp_path, autojump_clock, secret):
    extra = {"cluster_secret": secret} if secret else {}
    net, nodes = await start_cluster(nursery, tmp_path, 2, **extra)
    a, b = nodes
    a.cmd("CLUSTER", "MEET", "127.0.0.1", b.port)
    await wait_until(lambda: all(len(s.node.ctx.reachable) == 1 for s in nodes), timeout=20, what="meet")
    bus_stats = a.cluster.bus.stats
    frames_before, data_before = bus_stats["frames_sent"], bus_stats["data_sent"]
    b.data.clear()
    for i in range(500):
        assert a.cluster.send_data(b.cluster.my_id, "TEST", [i, b"x" * (i % 7)])
    with pytest.raises(TypeError, match="cannot encode Data.body"):  # a bad body fails at the sender, and only that message
        a.cluster.send_data(b.cluster.my_id, "TEST", [{1, 2}])
    await wait_until(lambda: len([d for d in b.data if d[1] == "TEST"]) == 500, timeout=5, what="delivery")
    got = [d for d in b.data if d[1] == "TEST"]
    assert [d[2] for d in got] == [[i, b"x" * (i % 7)] for i in range(500)]
    assert all(d[0] == a.cluster.my_id for d in got)
    assert bus_stats["data_sent"] - data_before == 500
    assert bus_stats["frames_sent"] - frames_before < 10  # one batch, give or take a ping
    assert b.cluster.bus.stats["data_received"] >= 500


async def test_the_cluster_tick_sends_its_pings_in_steps_and_still_fails_a_killed_node_in_time(
    nursery, tmp_path, autojump_clock, monkeypatch
):
    """ClusterService.tick in steps (issue 59): a walk of the table that sends nothing, then, while
    PINGs are due, steps that build one or send it (here one of the two a step: PING_SLICE_NS
    leaves no time for a second), returning 0 meanwhile; every peer is still pinged and a killed
    node still flagged FAIL everywhere within the usual time."""
    from disque_py.server import cluster as cluster_mod

    monkeypatch.setattr(cluster_mod, "PING_SLICE_NS", -1)  # never time for a second turn in a step
    net, nodes = await start_cluster(nursery, tmp_path, 6)
    for b in nodes[1:]:
        nodes[0].cmd("CLUSTER", "MEET", "127.0.0.1", b.port)
    await wait_until(lambda: all_know(nodes, 6), timeout=30, what="full mesh")
    steps: list[tuple[bool, int, int, int]] = []  # (a walk, PINGs built, frames sent, what it returned)
    service = nodes[0].cluster
    tick = service.tick
    m, bus = service.membership, service.bus
    assert bus is not None

    def counted() -> int:
        walk = not m.pings_due() and not service._ping_built
        built, framed = m.stats["messages_sent"], bus.stats["frames_sent"]
        wanted = tick()
        steps.append((walk, m.stats["messages_sent"] - built, bus.stats["frames_sent"] - framed, wanted))
        return wanted

    service.tick = counted  # (the run loop looks it up at every call)
    await trio.sleep(NODE_TIMEOUT * 2 / 1000)
    walks = [s for s in steps if s[0]]
    turns = [s for s in steps if not s[0]]
    assert all(built == framed == 0 for _, built, framed, _ in walks)  # a walk sends nothing
    # a PING built, or sent (or neither: a message that came in between sent it with its answer)
    assert all(built + framed <= 1 for _, built, framed, _ in turns)
    assert sum(built for _, built, _, _ in turns) >= 5 and any(framed for _, _, framed, _ in turns)
    assert any(wanted == 0 for _, _, _, wanted in walks)  # PINGs found due: the steps go on
    assert all(wanted == 0 for _, built, _, wanted in turns if built)  # built: sent at the next step
    victim = nodes[5]
    victim.kill()
    took = await wait_until(
        lambda: all(s.flags(victim) == "fail" for s in nodes[:5]),
        timeout=NODE_TIMEOUT * 4 / 1000,
        what="the victim flagged FAIL everywhere",
    )
    assert NODE_TIMEOUT / 1000 < took <= 1.5 * NODE_TIMEOUT / 1000
