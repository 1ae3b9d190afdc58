"""Cluster behaviour against real processes: dead seeds, auth, SIGKILL and LEAVING mid-stream, affinity.

Backoff timing uses injected fake clocks (no real sleeping); real waits
poll conditions with deadlines.
"""

from __future__ import annotations

import random
import signal
import socket
import threading
import uuid

import pytest
import trio

from disque_py import Affinity, AuthError, Backoff, Client, ConnectionLost, NoNodeAvailable, ReplyTimeout, Worker
from disque_py.aio import Client as AioClient

from .conftest import PASSWORD, addr, free_port, raw, wait_for

pytestmark = pytest.mark.integration


class FakeTime:
    """A virtual clock: ``sleep`` only advances it and records the delay."""

    def __init__(self) -> None:
        self.now = 0.0
        self.sleeps: list[float] = []

    def clock(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.sleeps.append(seconds)
        self.now += seconds

    async def asleep(self, seconds: float) -> None:
        self.sleep(seconds)


def dead_seeds(n: int = 3) -> list[str]:
    return ["127.0.0.1:%d" % free_port() for _ in range(n)]


def check_exhausted(exc: NoNodeAvailable, seeds: list[str], fake: FakeTime, backoff: Backoff, timeout: float):
    # every seed tried in every round, rounds separated by the backoff, until the deadline
    tried = ["%s:%d" % a for a, _ in exc.attempts]
    rounds = len(fake.sleeps) + 1
    assert len(tried) == rounds * len(seeds) and set(tried) == set(seeds)
    for r in range(rounds):
        assert sorted(tried[r * 3 : (r + 1) * 3]) == sorted(seeds)
    assert fake.now == pytest.approx(timeout)
    for k, d in enumerate(fake.sleeps[:-1]):
        assert backoff.base(k) * (1 - backoff.jitter) <= d <= backoff.base(k)
    for s in seeds:
        assert s in str(exc)


def test_unreachable_seeds_sync_backoff_on_virtual_clock():
    seeds = dead_seeds()
    fake = FakeTime()
    exact = Backoff(initial=0.1, maximum=0.4, factor=2.0, jitter=0.0)
    c = Client(seeds, failover_timeout=1.0, backoff=exact, clock=fake.clock, sleep=fake.sleep, connect_timeout=1)
    with pytest.raises(NoNodeAvailable, match="^no node reachable after 1.0 s") as info:
        c.qlen("q")
    # 0.1 + 0.2 + 0.4 = 0.7, then the rest up to the deadline (0.3), then the last round
    assert fake.sleeps == pytest.approx([0.1, 0.2, 0.4, 0.3])
    check_exhausted(info.value, seeds, fake, exact, 1.0)
    assert "no node reachable after 1.0 s" in str(info.value)

    fake2 = FakeTime()
    jittered = Backoff(initial=0.05, maximum=1.0, jitter=0.5)
    c2 = Client(seeds, failover_timeout=3.0, backoff=jittered, clock=fake2.clock, sleep=fake2.sleep,
                rng=random.Random(5))  # fmt: skip
    with pytest.raises(NoNodeAvailable, match="^no node reachable after 3.0 s") as info2:
        c2.add_job("q", b"x")
    check_exhausted(info2.value, seeds, fake2, jittered, 3.0)
    assert len(fake2.sleeps) >= 6


async def test_unreachable_seeds_trio_backoff_on_virtual_clock():
    seeds = dead_seeds()
    fake = FakeTime()
    backoff = Backoff(initial=0.05, maximum=0.5, jitter=0.5)
    c = AioClient(seeds, failover_timeout=2.0, backoff=backoff, clock=fake.clock, sleep=fake.asleep,
                  rng=random.Random(1))  # fmt: skip
    with pytest.raises(NoNodeAvailable, match="^no node reachable after 2.0 s") as info:
        await c.get_jobs("q", nohang=True)
    check_exhausted(info.value, seeds, fake, backoff, 2.0)


def test_one_dead_seed_is_skipped(node):
    seeds = dead_seeds(2) + [addr(node)]
    for seed in range(5):  # whatever the random order, the live node is found at once
        c = Client(seeds, rng=random.Random(seed), sleep=lambda s: pytest.fail("should not back off"))
        assert c.ping() == "PONG" and c.current_address == ("127.0.0.1", node.port)
        c.close()


async def test_auth(auth_node, queue):
    seeds = addr(auth_node)
    for kw, reason in (({}, "^NOAUTH "), ({"password": "wrong"}, "^ERR invalid password")):
        with pytest.raises(AuthError, match=reason):
            Client(seeds, **kw).qlen(queue)
        with pytest.raises(AuthError, match=reason):
            await AioClient(seeds, **kw).qlen(queue)
    c = Client(seeds, password=PASSWORD)
    jid = c.add_job(queue, b"x")
    async with AioClient(seeds, password=PASSWORD) as ac:
        assert [j.id for j in await ac.get_jobs(queue)] == [jid]
        assert await ac.ack(jid) == 1
    # a worker with a wrong password stops and says why
    w = Worker(seeds, queue, lambda job: None, password="wrong")
    with trio.fail_after(10):
        with pytest.raises(AuthError, match="^ERR invalid password"):
            await w.run()


def kill(node) -> None:
    node.proc.send_signal(signal.SIGKILL)
    node.proc.wait(10)


def test_lost_node_reads_retry_writes_surface_when_asked(start_node):
    node = start_node(loglevel="notice")
    c = Client(addr(node), retry_writes=False, failover_timeout=0.3)
    assert c.ping() == "PONG"
    kill(node)
    with pytest.raises(ConnectionLost, match=r"^connection to 127.0.0.1:\d+ lost") as lost:
        c.add_job("q", b"x")  # ADDJOB may have run: not re-sent with retry_writes=False
    assert type(lost.value) is ConnectionLost and lost.value.address == ("127.0.0.1", node.port)
    with pytest.raises(NoNodeAvailable, match="^no node reachable after 0.3 s"):
        c.qlen("q")  # reads are retried, until failover_timeout


def answers(node) -> bool:
    """PING answered within 50 ms?"""
    try:
        with socket.create_connection(("127.0.0.1", node.port), timeout=0.05) as s:
            s.sendall(b"PING\r\n")
            return s.recv(16).startswith(b"+PONG")
    except OSError:
        return False


async def test_reply_timeout(start_node):
    node = start_node(loglevel="notice")
    sleeper = raw(node)
    for flavor in ("sync", "trio"):
        if flavor == "sync":
            c = Client(addr(node), socket_timeout=0.2, max_retries=0)
            c.ping()
        else:
            c = AioClient(addr(node), socket_timeout=0.2, max_retries=0)
            await c.ping()
        async with trio.open_nursery() as nursery:
            nursery.start_soon(trio.to_thread.run_sync, sleeper.execute_command, "DEBUG", "SLEEP", "1")
            await trio.to_thread.run_sync(wait_for, lambda: not answers(node), 5, 0.01, "the node to sleep")
            with pytest.raises(ReplyTimeout, match="^no reply from 127.0.0.1:%d " % node.port):
                if flavor == "sync":
                    c.qlen("q")
                else:
                    await c.qlen("q")


def test_sync_consumer_fails_over_when_its_node_is_killed(make_cluster):
    a, b, c = make_cluster(3)
    q = "kill-" + uuid.uuid4().hex[:8]
    producer = Client(addr(a))
    ids = set(producer.add_jobs(q, [b"%d" % i for i in range(120)], retry=1))  # REPLICATE 3: every node has a copy
    consumer = Client(addr(a))  # one seed: the others come from HELLO
    handled: list[str] = []
    while len(handled) < 40:
        jobs = consumer.get_jobs(q, count=5, timeout_ms=1000)
        handled += [j.id for j in jobs]
        consumer.ack(*[j.id for j in jobs])
    in_hand = consumer.get_jobs(q, count=5)  # fetched, not acknowledged when the node dies
    assert len(set(handled)) == len(handled) == 40  # healthy: nothing twice
    kill(a)
    consumer.ack(*[j.id for j in in_hand])  # goes to a surviving node
    handled += [j.id for j in in_hand]
    assert consumer.current_address in (("127.0.0.1", b.port), ("127.0.0.1", c.port))
    # the survivors requeue A's jobs after RETRY; each queues its share
    other = Client(addr(b) if consumer.current_address[1] == c.port else addr(c))

    def drain() -> bool:
        for cl in (consumer, other):
            jobs = cl.get_jobs(q, count=50, nohang=True)
            if jobs:
                cl.ack(*[j.id for j in jobs])
                handled.extend(j.id for j in jobs)
        return ids <= set(handled)

    wait_for(drain, timeout=20, interval=0.05, what="every job handled after the kill")
    assert set(handled) == ids  # nothing lost (duplicates after the kill are allowed: at-least-once)


class Tracker:
    """Which jobs are being handled right now; records overlaps while the cluster is healthy."""

    def __init__(self) -> None:
        self.lock = threading.Lock()  # plain-function handlers run in threads
        self.active: dict[str, int] = {}
        self.handled: list[str] = []
        self.healthy = True
        self.overlaps: list[str] = []
        self.by_worker: dict[str, int] = {}

    def handler(self, name: str):
        async def handle(job) -> None:
            if self.active.get(job.id) and self.healthy:
                self.overlaps.append(job.id)
            self.active[job.id] = self.active.get(job.id, 0) + 1
            try:
                await trio.sleep(0.001)
            finally:
                self.active[job.id] -= 1
            self.handled.append(job.id)
            self.by_worker[name] = self.by_worker.get(name, 0) + 1

        return handle

    def sync_handler(self, name: str):
        """A quick plain function: its threads fetch for themselves (direct mode)."""

        def handle(job) -> None:
            with self.lock:
                if self.active.get(job.id) and self.healthy:
                    self.overlaps.append(job.id)
                self.active[job.id] = self.active.get(job.id, 0) + 1
            with self.lock:
                self.active[job.id] -= 1
                self.handled.append(job.id)
                self.by_worker[name] = self.by_worker.get(name, 0) + 1

        return handle

    def make(self, kind: str, name: str):
        return self.handler(name) if kind == "async" else self.sync_handler(name)


@pytest.mark.parametrize("kind", ["async", "sync"])
async def test_workers_fail_over_when_a_node_is_killed(make_cluster, kind):
    nodes = make_cluster(3)
    q = "wkill-" + uuid.uuid4().hex[:8]
    ids: set[str] = set()
    per_node = 100 if kind == "async" else 1000  # quick sync handlers: enough to be mid-stream at the kill
    for n in nodes:  # producers on every node: each node queues its own jobs
        ids |= set(Client(addr(n)).add_jobs(q, [b"%d" % i for i in range(per_node)], retry=1))
    tracker = Tracker()
    clients = [AioClient(addr(n)) for n in nodes]
    workers = [
        Worker(cl, q, tracker.make(kind, "w%d" % i), concurrency=4, max_in_flight=8, fetch_timeout_ms=200)
        for i, cl in enumerate(clients)
    ]
    with trio.fail_after(30):
        async with trio.open_nursery() as nursery:
            for w in workers:
                nursery.start_soon(w.run)
            while tracker.by_worker.get("w0", 0) < 30:
                await trio.sleep(0.005)
            tracker.healthy = False
            await trio.to_thread.run_sync(kill, nodes[0])
            while not ids <= set(tracker.handled):
                await trio.sleep(0.02)
            moved = clients[0].current_address
            for w in workers:
                w.stop()
    assert not tracker.overlaps
    if kind == "sync":  # their threads fetched for themselves
        assert all(w._threads is not None and w._threads.direct.rounds > 0 for w in workers)
    assert moved in {("127.0.0.1", n.port) for n in nodes[1:]}
    assert set(tracker.handled) == ids


@pytest.mark.parametrize("kind", ["async", "sync"])
async def test_worker_moves_off_a_leaving_node(make_cluster, kind):
    a, b, c = make_cluster(3)
    q = "leave-" + uuid.uuid4().hex[:8]
    first = set(Client(addr(a)).add_jobs(q, [b"a%d" % i for i in range(60 if kind == "async" else 2000)]))
    tracker = Tracker()
    client = AioClient(addr(a))
    w = Worker(client, q, tracker.make(kind, "w"), concurrency=2, fetch_timeout_ms=100)
    with trio.fail_after(20):
        async with trio.open_nursery() as nursery:
            nursery.start_soon(w.run)
            while len(tracker.handled) < 20:
                await trio.sleep(0.005)
            raw(a).execute_command("CLUSTER", "LEAVING", "yes")  # mid-stream
            # A's queue is still served; then GETJOB answers -LEAVING and the client moves
            while client.current_address == ("127.0.0.1", a.port):
                await trio.sleep(0.01)
            new_port = client.current_address[1]
            assert new_port in (b.port, c.port)
            assert first <= set(tracker.handled)
            target = b if new_port == b.port else c
            second = set(Client(addr(target)).add_jobs(q, [b"b%d" % i for i in range(30)], replicate=2))
            while not second <= set(tracker.handled):
                await trio.sleep(0.01)
            w.stop()
    assert not tracker.overlaps
    assert sorted(tracker.handled) == sorted(first | second)  # each exactly once: healthy cluster


def test_sync_client_avoids_and_leaves_a_leaving_node(make_cluster):
    a, b, c = make_cluster(3)
    fake = FakeTime()
    client = Client(addr(a), refresh_interval=10.0, clock=fake.clock, sleep=fake.sleep)
    client.ping()
    assert client.current_address == ("127.0.0.1", a.port)
    raw(a).execute_command("CLUSTER", "LEAVING", "yes")
    client.ping()
    assert client.current_address == ("127.0.0.1", a.port)  # not refreshed yet
    fake.now += 10.0  # the periodic HELLO is due
    client.ping()
    assert client.current_address[1] in (b.port, c.port)
    # connecting to a leaving seed moves at once to a better node
    fresh = Client(addr(a))
    fresh.ping()
    assert fresh.current_address[1] in (b.port, c.port)
    assert {n.port: n.priority for n in fresh.nodes}[a.port] == 100


async def test_affinity_moves_the_consumer_to_the_producing_node(cluster3):
    a, b, _ = cluster3
    q = "aff-" + uuid.uuid4().hex[:8]
    ids = Client(addr(a)).add_jobs(q, [b"%d" % i for i in range(20)])  # created (and queued) on A
    ra, rb = raw(a), raw(b)
    assert ra.execute_command("DEQUEUE", *ids) == 20
    assert rb.execute_command("ENQUEUE", *ids) == 20  # now B serves A's jobs (what federation would do)
    a_id = ra.execute_command("CLUSTER", "MYID").decode()
    sync = Client(addr(b), affinity=Affinity(window=10, share=0.5, min_jobs=10))
    jobs = sync.get_jobs(q, count=10)
    assert len(jobs) == 10 and all(j.node_prefix == a_id[:8] for j in jobs)
    assert sync.current_node_id == a_id  # most jobs came from A: moved there
    async with AioClient(addr(b), affinity=Affinity(window=10, share=0.5, min_jobs=10)) as ac:
        jobs += await ac.get_jobs(q, count=10)
        assert ac.current_node_id == a_id
    assert sorted(j.id for j in jobs) == sorted(ids)
    assert sync.ack(*ids) == 20


def test_on_other_nodes_asks_every_node_but_the_one_in_use(cluster3):
    q = "oon-" + uuid.uuid4().hex[:8]
    raw(cluster3[1]).execute_command("ADDJOB", q, "here", 0, "REPLICATE", 1)
    with Client(addr(cluster3[0])) as c:
        c.ping()
        assert c.current_address == (cluster3[0].host, cluster3[0].port)
        answers = dict(c.on_other_nodes([("QLEN", q), ("NOSUCHCOMMAND",)]))
        assert set(answers) == {(n.host, n.port) for n in cluster3[1:]}
        one, two = answers[(cluster3[1].host, cluster3[1].port)], answers[(cluster3[2].host, cluster3[2].port)]
        assert one[0] == 1 and two[0] == 0
        assert all(isinstance(r[1], Exception) and "unknown command" in str(r[1]) for r in (one, two))
        assert c.current_address == (cluster3[0].host, cluster3[0].port)  # still on its node


def test_on_every_node_asks_them_all_and_names_the_silent_ones_on_both_faces(make_cluster):
    nodes = make_cluster(3)
    q = "oen-" + uuid.uuid4().hex[:8]
    raw(nodes[1]).execute_command("ADDJOB", q, "here", 0, "REPLICATE", 1)
    everyone = {(n.host, n.port) for n in nodes}

    async def trio_face():
        async with AioClient(addr(nodes[0])) as ac:
            first = dict(await ac.on_every_node([("QLEN", q)]))
            again = dict(await ac.on_every_node([("QLEN", q), ("NOSUCHCOMMAND",)]))  # its idle connections
            kill(nodes[2])
            after = dict(await ac.on_every_node([("QLEN", q)]))
            return first, again, after, ac.current_address

    with Client(addr(nodes[0])) as c:
        answers = dict(c.on_every_node([("QLEN", q)]))
        assert set(answers) == everyone  # the node in use included
        assert [answers[(n.host, n.port)] for n in nodes] == [[0], [1], [0]]
        first, again, after, current = trio.run(trio_face)
        assert first == answers and set(again) == everyone
        assert all(isinstance(r[1], Exception) and "unknown command" in str(r[1]) for r in again.values())
        assert current == (nodes[0].host, nodes[0].port)  # still on its node
        # a node that does not answer is named, with the error in place of its replies
        for seen in (after, dict(c.on_every_node([("QLEN", q)]))):
            assert set(seen) == everyone and isinstance(seen[(nodes[2].host, nodes[2].port)], ConnectionLost)
            assert seen[(nodes[1].host, nodes[1].port)] == [1]
