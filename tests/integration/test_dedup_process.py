"""ADDJOB ... DEDUP across real node processes: 3 nodes, REPLICATE 3, through the clients.

The same key on every node answers one ID and one job; a producer whose connection is killed
mid-ADDJOB, or whose node is killed with kill -9, retries with the same key and ends with one
job per key, none lost; the window survives a restart with the AOF; CONFIG SET dedup-window
is checked and applies.
"""

from __future__ import annotations

import signal
import threading
import time

import pytest
import redis
import trio

from disque_py import Client, ConnectionLost, NoNodeAvailable, NoReplicationError
from disque_py.cli import launcher
from disque_py.aio import Client as AioClient
from disque_py.core.ids import dedup_job_id

from .conftest import NodeProcess, start_all, wait_for

pytestmark = pytest.mark.integration


@pytest.fixture
def cluster(tmp_path):
    """``cluster(n, **directives)``: n joined nodes; stopped (cleanly, or killed by the test) at the end."""
    started: list[NodeProcess] = []

    def make(n: int = 3, **directives) -> list[NodeProcess]:
        directives.setdefault("cluster_node_timeout", 1000)
        directives.setdefault("loglevel", "notice")
        nodes = start_all([NodeProcess(tmp_path, **directives) for _ in range(n)])
        started.extend(nodes)
        launcher.join([("127.0.0.1", x.port) for x in nodes], timeout=20, interval=0.05)
        return nodes

    make.started = started  # type: ignore[attr-defined]  # restart() adds the node it starts again
    yield make
    for node in started:
        if node.proc is not None and node.proc.poll() is None:
            assert node.stop() in (0, None), node.log()[-4000:]


def r(node: NodeProcess) -> redis.Redis:
    return node.client(protocol=2)


def addr(node: NodeProcess) -> str:
    return "127.0.0.1:%d" % node.port


def info(node: NodeProcess, section: str) -> dict:
    return r(node).info(section)


def queued_everywhere(nodes: list[NodeProcess], queue: str) -> int:
    return sum(r(n).execute_command("QLEN", queue) for n in nodes if n.proc.poll() is None)


def jobs_everywhere(nodes: list[NodeProcess], queue: str) -> set[bytes]:
    """Every job ID any live node holds for ``queue`` (JSCAN, all pages)."""
    ids: set[bytes] = set()
    for n in nodes:
        if n.proc.poll() is not None:
            continue
        cursor = 0
        while True:
            cursor, page = r(n).execute_command("JSCAN", cursor, "COUNT", 1000, "QUEUE", queue)
            ids.update(page)
            cursor = int(cursor)
            if cursor == 0:
                break
    return ids


def restart(node: NodeProcess, cluster) -> NodeProcess:
    """The same node again: same port, same directory (nodes.conf, AOF); stopped with the
    ``cluster`` fixture's nodes at the end."""
    again = NodeProcess(node.dir.parent, **{**node.directives, "port": node.port})
    cluster.started.append(again)
    return again.start()


def wait_mesh(nodes: list[NodeProcess]) -> None:
    def whole() -> bool:
        for n in nodes:
            text = r(n).execute_command("CLUSTER", "INFO").decode()
            if "cluster_reachable_nodes:%d" % (len(nodes) - 1) not in text:
                return False
        return True

    wait_for(whole, timeout=30, what="every node reaching every other")


def test_same_key_on_each_node_answers_one_id_and_one_job(cluster):
    nodes = cluster(3)
    expected = dedup_job_id(b"orders", b"order-7", 1).decode()
    ids = set()
    for i, n in enumerate(nodes):  # a different body each time: ignored after the first
        ids.add(Client(addr(n), retry_writes=False).add_job("orders", b"v%d" % i, replicate=3, dedup="order-7"))
    ids.add(r(nodes[1]).execute_command("ADDJOB", "orders", "raw", 5000, "REPLICATE", 3, "DEDUP", "order-7").decode())

    async def trio_add() -> str:
        return await AioClient(addr(nodes[2]), retry_writes=False).add_job("orders", b"trio", replicate=3, dedup="order-7")

    ids.add(trio.run(trio_add))
    assert ids == {expected}
    assert queued_everywhere(nodes, "orders") == 1
    assert jobs_everywhere(nodes, "orders") == {expected.encode()}
    hits = sum(info(n, "stats")["dedup_hits"] for n in nodes)
    assert hits == 4  # every ADDJOB after the first was answered with the ID, adding nothing
    for n in nodes:  # every node holds its copy, and SHOW names the key
        shown = r(n).execute_command("SHOW", expected)
        fields = {shown[i]: shown[i + 1] for i in range(0, len(shown), 2)}
        assert fields[b"dedup"] == b"order-7" and fields[b"body"] == b"v0" and fields[b"repl"] == 3
    # the consumer sees the key
    job = wait_for(lambda: Client([addr(n) for n in nodes]).get_job("orders", timeout_ms=1000), what="the job")
    assert (job.id, job.dedup, job.body) == (expected, "order-7", b"v0")
    # bad input: clear errors, the node goes on
    for key, msg in ((b"", "empty"), (b"k" * 513, "512")):
        with pytest.raises(redis.ResponseError, match=msg):
            r(nodes[0]).execute_command("ADDJOB", "orders", "x", 0, "DEDUP", key)
    assert r(nodes[0]).ping()


def _addjob_connection(node: NodeProcess) -> str | None:
    """addr= of the client whose last command is ADDJOB (blocked waiting for its copies)."""
    for line in r(node).execute_command("CLIENT", "LIST").decode().splitlines():
        fields = dict(f.split("=", 1) for f in line.split() if "=" in f)
        if fields.get("cmd") == "addjob":
            return fields["addr"]
    return None


@pytest.mark.parametrize("dedup", [None, "invoice-1"])
def test_a_connection_killed_mid_addjob(cluster, dedup):
    """With a key, the client re-sends the ADDJOB on another node although retry_writes=False,
    and gets the same ID: one job. Without a key it raises, as before (the ADDJOB may have run)."""
    a, _, c = nodes = cluster(3)
    c.proc.send_signal(signal.SIGSTOP)  # A's ADDJOB REPLICATE 3 waits for C's copy
    outcome: dict = {}

    def produce() -> None:
        client = Client([addr(a)], retry_writes=False, socket_timeout=20, failover_timeout=20)
        client.ping()
        try:
            outcome["id"] = client.add_job("bills", b"body", replicate=3, timeout_ms=15000, dedup=dedup)
        except Exception as exc:  # noqa: BLE001 - checked below
            outcome["error"] = exc
        outcome["address"] = client.current_address

    producer = threading.Thread(target=produce)
    try:
        producer.start()
        victim = wait_for(lambda: _addjob_connection(a), timeout=10, what="the ADDJOB waiting on A")
        assert r(a).execute_command("CLIENT", "KILL", "ADDR", victim) == 1
        # the retry goes to B or C (it cannot finish before C runs again: REPLICATE 3)
    finally:
        c.proc.send_signal(signal.SIGCONT)
        producer.join(30)
    assert not producer.is_alive()
    if dedup is None:
        assert isinstance(outcome.get("error"), ConnectionLost) and "id" not in outcome
        return
    expected = dedup_job_id(b"bills", b"invoice-1", 1).decode()
    assert outcome.get("id") == expected, outcome
    assert outcome["address"] != ("127.0.0.1", a.port)  # answered by another node
    wait_for(lambda: jobs_everywhere(nodes, "bills") == {expected.encode()}, timeout=10, what="one job")
    wait_for(lambda: queued_everywhere(nodes, "bills") == 1, timeout=10, what="queued once")


def test_producer_retrying_with_keys_through_kill9_adds_each_job_once(cluster):
    """A producer adds 40 keyed jobs, retrying each (same key) after every error; node C is
    killed with kill -9 after the 10th, and started again (empty) once the producer has been
    refused a few times (REPLICATE 3 needs it: -NOREPL meanwhile), then killed again after the
    30th and started again. At the end every key has exactly one job in the cluster and none is
    lost."""
    nodes = cluster(3)
    producer = Client([addr(n) for n in nodes], retry_writes=False, socket_timeout=3, failover_timeout=3)
    keys = ["k%02d" % i for i in range(40)]
    got: dict[str, str] = {}
    errors = 0
    for i, key in enumerate(keys):
        if i in (10, 30):
            nodes[2].proc.send_signal(signal.SIGKILL)
            nodes[2].proc.wait(10)
        deadline = time.monotonic() + 60
        refused = 0
        while True:
            try:
                got[key] = producer.add_job("batch", b"job " + key.encode(), replicate=3, timeout_ms=500,
                                           retry=1, dedup=key)  # fmt: skip
                break
            except (NoReplicationError, ConnectionLost, NoNodeAvailable):
                errors += 1  # the job may or may not be there: ask again, same key
                refused += 1
                assert time.monotonic() < deadline, "key %s never added" % key
                if refused == 5 and nodes[2].proc.poll() is not None:
                    nodes[2] = restart(nodes[2], cluster)
                time.sleep(0.05)
    wait_mesh(nodes)
    expected = {key: dedup_job_id(b"batch", key.encode(), 1).decode() for key in keys}
    assert got == expected
    assert errors > 0  # the kill was felt: some ADDJOBs failed and were asked again
    wait_for(lambda: jobs_everywhere(nodes, "batch") == {i.encode() for i in expected.values()},
             timeout=20, what="one job per key, none missing")  # fmt: skip
    # each job is queued on one node only: draining the cluster gives every key once (the jobs
    # queued on C when it was killed come back from their other copies after RETRY 1)
    consumer = Client([addr(n) for n in nodes])
    seen: list[str] = []
    deadline = time.monotonic() + 30
    while len(seen) < len(keys) and time.monotonic() < deadline:
        for job in consumer.get_jobs("batch", count=50, timeout_ms=500):
            seen.append(job.dedup)
            consumer.ack(job.id)
    assert sorted(seen) == keys
    assert consumer.get_jobs("batch", nohang=True) == []


def test_the_window_survives_a_restart_with_the_aof(cluster):
    """Acknowledged and deleted everywhere, the key is remembered in the AOF: the restarted node
    answers the same ID and adds nothing."""
    nodes = cluster(3, appendonly="yes")
    client = Client([addr(n) for n in nodes])
    job_id = client.add_job("mail", b"welcome", replicate=3, dedup="user-42")
    job = client.get_job("mail", timeout_ms=5000)
    assert job is not None and job.id == job_id and job.dedup == "user-42"
    client.ack(job_id)
    wait_for(lambda: all(r(n).execute_command("SHOW", job_id) is None for n in nodes), timeout=20,
             what="the acknowledged job deleted everywhere")  # fmt: skip
    assert [info(n, "stats")["dedup_ids_remembered"] for n in nodes] == [1, 1, 1]
    victim = nodes[0]
    assert victim.stop() == 0
    nodes[0] = victim = restart(victim, cluster)
    wait_mesh(nodes)
    assert info(victim, "stats")["dedup_ids_remembered"] == 1
    again = r(victim).execute_command("ADDJOB", "mail", "welcome again", 5000, "REPLICATE", 3, "DEDUP", "user-42")
    assert again.decode() == job_id
    assert info(victim, "stats")["dedup_hits"] == 1
    assert queued_everywhere(nodes, "mail") == 0 and jobs_everywhere(nodes, "mail") == set()


def test_config_dedup_window_is_checked_and_applies(cluster):
    nodes = cluster(3)
    first = r(nodes[0])
    assert first.execute_command("CONFIG", "GET", "dedup-window") == [b"dedup-window", b"600"]
    for bad in ("-1", "abc", "1.5", ""):
        with pytest.raises(redis.ResponseError, match="Invalid argument '%s' for CONFIG SET 'dedup-window'" % bad):
            first.execute_command("CONFIG", "SET", "dedup-window", bad)
    assert first.execute_command("CONFIG", "GET", "dedup-window") == [b"dedup-window", b"600"]
    for n in nodes:
        assert r(n).execute_command("CONFIG", "SET", "dedup-window", "1") == b"OK"
        assert r(n).execute_command("CONFIG", "GET", "dedup-window") == [b"dedup-window", b"1"]
    client = Client([addr(n) for n in nodes])
    job_id = client.add_job("short", b"first", replicate=3, dedup="once")
    job = client.get_job("short", timeout_ms=5000)
    client.ack(job.id)
    wait_for(lambda: all(r(n).execute_command("SHOW", job_id) is None for n in nodes), timeout=20,
             what="the acknowledged job deleted everywhere")  # fmt: skip
    # within the window (remembered somewhere) a retry adds nothing; once every node forgot it,
    # the same key makes a new job
    wait_for(lambda: all(info(n, "stats")["dedup_ids_remembered"] == 0 for n in nodes), timeout=15,
             what="the ID forgotten after the 1 s window")  # fmt: skip
    hits = sum(info(n, "stats")["dedup_hits"] for n in nodes)
    assert client.add_job("short", b"second", replicate=3, dedup="once") == job_id
    assert sum(info(n, "stats")["dedup_hits"] for n in nodes) == hits  # not a hit: a new job
    assert queued_everywhere(nodes, "short") == 1
    job = client.get_job("short", timeout_ms=5000)
    assert job.body == b"second" and job.dedup == "once"
