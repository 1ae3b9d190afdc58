"""Every client call against real nodes (1 node and a 3-node cluster), sync and trio.

One scenario, written once as ``async`` code, runs against the trio client
directly and against the synchronous client through a thin adapter that
calls its methods (blocking calls inside a trio test are fine: the node is
another process).
"""

from __future__ import annotations

import inspect
import uuid

import msgpack
import pytest
import trio

from disque_py import (
    BadIdError,
    BatchError,
    Client,
    CommandError,
    HelloInfo,
    Job,
    NoJobError,
    NoReplicationError,
    PausedError,
    QueueFullError,
    TooLateError,
)
from disque_py.aio import Client as AioClient

from .conftest import addr, raw, wait_for

pytestmark = pytest.mark.integration


class SyncAsAsync:
    """The synchronous client's methods, awaitable; iterators become async iterators."""

    def __init__(self, client: Client) -> None:
        self._client = client

    def __getattr__(self, name: str):
        attr = getattr(self._client, name)
        if not callable(attr):
            return attr

        def call(*args, **kwargs):
            result = attr(*args, **kwargs)
            if inspect.isgenerator(result):
                return _aiter(result)
            return _done(result)

        return call

    async def aclose(self) -> None:
        self._client.close()


async def _done(value):
    return value


async def _aiter(gen):
    for item in gen:
        yield item


@pytest.fixture(params=["sync", "trio"])
def flavor(request) -> str:
    return request.param


@pytest.fixture(params=[1, 3], ids=["1node", "3nodes"])
def nodes(request):
    if request.param == 1:
        return [request.getfixturevalue("node")]
    return request.getfixturevalue("cluster3")


def make_client(flavor: str, seeds, **kw):
    if flavor == "sync":
        return SyncAsAsync(Client(seeds, **kw))
    return AioClient(seeds, **kw)


async def test_every_call(flavor, nodes):
    c = make_client(flavor, [addr(n) for n in nodes])
    q = "api-" + uuid.uuid4().hex[:10]
    try:
        assert await c.ping() == "PONG"
        hello = await c.hello()
        assert isinstance(hello, HelloInfo) and hello.version == 1
        assert len(hello.nodes) == len(nodes) and {n.port for n in hello.nodes} == {n.port for n in nodes}
        assert hello.node_id == c.current_node_id and hello.myself.port == c.current_address[1]
        assert all(n.priority == 1 for n in hello.nodes)
        prefix = hello.node_id[:8]

        # add_job: str and bytes bodies, every option
        jid = await c.add_job(q, "héllo")
        assert len(jid) == 40 and jid[2:10] == prefix
        jid2 = await c.add_job(q, b"\x00\xff binary", replicate=1, retry=7, ttl=600, maxlen=100)
        delayed = await c.add_job(q, b"later", delay=60, ttl=3600)
        jid_async = await c.add_job(q, b"async", async_=True)
        assert await c.qlen(q) == 3  # the delayed one is not queued yet

        show = await c.show(jid2)
        assert show["id"] == jid2 and show["queue"] == q and show["state"] == "queued"
        assert show["retry"] == 7 and show["repl"] == 1 and show["body"] == b"\x00\xff binary"
        assert (await c.show(delayed))["state"] == "active" and (await c.show(delayed))["delay"] == 60
        assert (await c.show(jid))["repl"] == min(3, len(nodes))

        # qpeek / qstat
        peek = await c.qpeek(q, 2)
        assert [j.id for j in peek] == [jid, jid2] and all(isinstance(j, Job) for j in peek)
        assert (await c.qpeek(q, -1))[0].id == jid_async
        stat = await c.qstat(q)
        assert stat["name"] == q and stat["len"] == 3 and stat["pause"] == "none"
        assert await c.qstat("no-such-queue-" + q) is None

        # get_jobs with counters; text/bytes bodies
        got = await c.get_jobs(q, count=2)
        assert [j.id for j in got] == [jid, jid2]
        assert got[0].body == "héllo".encode() and got[0].text() == "héllo" and got[1].body == b"\x00\xff binary"
        assert got[0].queue == q and got[0].nacks == 0 and got[0].additional_deliveries == 0
        assert got[0].attempt == 1 and got[0].node_prefix == prefix
        with pytest.raises(UnicodeDecodeError, match="can't decode byte 0xff"):
            got[1].text()
        assert (await c.show(jid))["state"] == "active"

        # working / nack -> counters
        assert await c.working(jid2) == 7
        assert await c.nack(jid, jid2) == 2
        again = await c.get_jobs(q, count=3, timeout_ms=500)
        by_id = {j.id: j for j in again}
        assert by_id[jid].nacks == 1 and by_id[jid].attempt == 2 and jid_async in by_id
        without = await c.get_jobs(q, nohang=True)
        assert without == []
        assert await c.get_jobs(q, timeout_ms=30) == []
        assert await c.get_job(q, nohang=True) is None

        # ack, fast_ack
        assert await c.ack(jid) == 1
        assert await c.fast_ack(jid_async) == 1
        assert await c.show(jid_async) is None
        acked = await c.show(jid)
        assert acked is None or acked["state"] == "acked"

        # enqueue / dequeue / del_job
        assert await c.enqueue(jid2) == 1 and await c.qlen(q) == 1
        assert await c.dequeue(jid2) == 1 and await c.qlen(q) == 0
        assert await c.del_job(jid2, delayed) == 2
        assert await c.show(jid2) is None

        # add_jobs: several batches, order kept
        bodies = [b"b%03d" % i for i in range(23)]
        ids = await c.add_jobs(q, bodies, batch=5, replicate=1)
        assert len(ids) == 23 and len(set(ids)) == 23
        assert [j.body for j in await c.qpeek(q, 23)] == bodies
        assert [j.id for j in await c.qpeek(q, 23)] == ids
        assert await c.add_jobs(q, []) == []

        # scans (once the ack of jid has been collected everywhere: it stays, acked, until then)
        with trio.fail_after(10):
            while await c.show(jid) is not None:
                await trio.sleep(0.01)
        names = [n async for n in c.qscan(count=1)]
        assert q in names
        found = [i async for i in c.jscan(queue=q, count=3)]
        assert sorted(found) == sorted(ids)
        states = [d async for d in c.jscan(queue=q, states=["queued"], reply="all")]
        assert len(states) == 23 and all(d["state"] == "queued" and d["queue"] == q for d in states)
        assert [i async for i in c.jscan(queue=q, states="active")] == []
        assert q in [n async for n in c.qscan(minlen=23)] and q not in [n async for n in c.qscan(minlen=24)]
        # the cluster's own queues (a name starting with @, a task's result): only with all=True (QSCAN ... ALL)
        own = "@result:" + q
        own_id = await c.add_job(own, b"r", replicate=1)
        assert own not in [n async for n in c.qscan()] and own in [n async for n in c.qscan(all=True)]
        assert own in [n async for n in c.qscan(all=True, minlen=1, count=1)]
        assert await c.del_job(own_id) == 1
        await c.get_jobs(q, count=23)
        await c.ack(*ids)

        # JSON and msgpack helpers
        await c.add_json(q, {"a": [1, 2], "ü": None})
        await c.add_msgpack(q, {"n": 1, "raw": b"\xff"})
        j1, j2 = await c.get_jobs(q, count=2)
        assert j1.json() == {"a": [1, 2], "ü": None} and j1.body == b'{"a":[1,2],"\xc3\xbc":null}'
        assert j2.msgpack() == {"n": 1, "raw": b"\xff"} and msgpack.unpackb(j2.body) == {"n": 1, "raw": b"\xff"}
        await c.ack(j1.id, j2.id)

        # pause
        assert await c.pause(q, "in") == "in"
        with pytest.raises(PausedError, match="^PAUSED .*paused") as paused:
            await c.add_job(q, b"x")
        assert paused.value.code == "PAUSED" and "paused" in str(paused.value)
        assert await c.pause(q, "state") == "in"
        assert await c.pause(q, "none") == "none"

        # info
        info = await c.info()
        assert info["disque_version"] == "1.0-rc1" and isinstance(info["registered_jobs"], int)
        jobs_section = await c.info("jobs")
        assert set(jobs_section) == {"registered_jobs"}
        assert (await c.execute("QLEN", q)) == 0

        # typed errors
        await c.add_job(q, b"1", maxlen=1)
        with pytest.raises(QueueFullError, match="^MAXLEN "):
            await c.add_job(q, b"2", maxlen=1)
        with pytest.raises(BatchError, match="^2 of 2 commands failed, first: MAXLEN ") as batch:
            await c.add_jobs(q, [b"3", b"4"], maxlen=1)
        assert [type(e) for e in batch.value.results] == [QueueFullError, QueueFullError]
        with pytest.raises(BadIdError, match="^BADID "):
            await c.ack("not-an-id")
        with pytest.raises(NoJobError, match="^NOJOB "):
            await c.working("D-00000000-AAAAAAAAAAAAAAAAAAAAAAAA-05a1")
        with pytest.raises(CommandError, match="^ERR .*DELAY is greater than TTL") as bad:
            await c.add_job(q, b"x", delay=10, ttl=5)
        assert bad.value.code == "ERR" and "DELAY" in bad.value.message
        if len(nodes) == 1:
            with pytest.raises(NoReplicationError, match="^NOREPL "):
                await c.add_job(q, b"x", replicate=2)
        else:
            with pytest.raises(CommandError, match="^ERR .*RETRY set to 0"):  # RETRY 0 needs REPLICATE 1
                await c.add_job(q, b"x", retry=0)
            assert len(await c.add_job(q, b"amo", retry=0, replicate=1)) == 40
        short = await c.add_job(q, b"short", ttl=1, replicate=1)

        async def too_late():
            try:
                await c.working(short)
            except TooLateError:
                return True
            await trio.sleep(0.05)
            return False

        with trio.fail_after(5):
            while not await too_late():
                pass

        # client-side validation
        with pytest.raises(TypeError, match="job body must be bytes or str, not int"):
            await c.add_job(q, 12)
        with pytest.raises(ValueError, match="count must be >= 1"):
            await c.get_jobs(q, count=0)
        with pytest.raises(ValueError, match="needs at least one queue"):
            await c.get_jobs()
        with pytest.raises(ValueError, match="at least one job ID"):
            await c.ack()
        with pytest.raises(ValueError, match="unknown PAUSE option 'sideways'"):
            await c.pause(q, "sideways")
        with pytest.raises(ValueError, match="unknown job state 'lost'"):
            [i async for i in c.jscan(states=["lost"])]
    finally:
        await c.aclose()


async def test_delivery_options_and_dead_letters(flavor, node):
    """ADDJOB BACKOFF/MAXDELIVER/DEADLETTER, NACK DELAY/REASON/DEAD, and the Job's counters."""
    c = make_client(flavor, addr(node))
    q = "dlq-" + uuid.uuid4().hex[:10]
    try:
        jid = await c.add_job(q, b"payload", retry=5, backoff=(0.2, 1), maxdeliver=2, deadletter=q + ".failed")
        [job] = await c.get_jobs(q)
        assert (job.id, job.deliveries, job.maxdeliver, job.deadletter) == (jid, 1, 2, q + ".failed")
        assert job.backoff == (0.2, 1.0) and job.attempt == 1 and not job.last_delivery
        assert job.last_nack_reason is None and not job.is_dead_letter
        assert await c.nack(jid, delay=0.3, reason="x" * 2000) == 1  # REASON cut to 1024 bytes
        shown = await c.show(jid)
        assert shown["last-nack-reason"] == "x" * 1024 and 0 < shown["next-requeue-within"] <= 300
        assert await c.get_jobs(q, nohang=True) == []  # delayed: not back yet
        [job] = await c.get_jobs(q, timeout_ms=5000)
        assert job.deliveries == 2 and job.attempt == 2 and job.last_delivery
        assert job.last_nack_reason == "x" * 1024
        assert await c.nack(jid, reason="second failure") == 1  # its MAXDELIVER: dead-lettered
        [dead] = await c.get_jobs(q + ".failed", timeout_ms=5000)
        assert dead.body == b"payload" and dead.is_dead_letter
        assert (dead.dead_letter_of, dead.original_queue, dead.original_deliveries) == (jid, q, 2)
        assert dead.dead_letter_reason == "second failure"
        assert dead.original_options == ("BACKOFF", "0.2", "1", "MAXDELIVER", "2", "DEADLETTER", q + ".failed")
        assert await c.show(jid) is None  # the original is acknowledged
        await c.ack(dead.id)

        # NACK DEAD: now, whatever MAXDELIVER; a Disque job shows none of the new fields
        jid = await c.add_job(q, "plain")
        [job] = await c.get_jobs(q)
        assert job.deliveries is None and job.maxdeliver is None and job.backoff is None and not job.last_delivery
        assert await c.nack(jid, dead=True, reason="never retry") == 1
        [dead] = await c.get_jobs(q + ".dead", timeout_ms=5000)
        assert dead.dead_letter_of == jid and dead.dead_letter_reason == "never retry" and dead.body == b"plain"
        await c.ack(dead.id)

        with pytest.raises(CommandError, match="RETRY 0"):  # the node's checks: MAXDELIVER on a RETRY 0 job
            await c.add_job(q, b"x", maxdeliver=2, retry=0)
        with pytest.raises(ValueError, match="either DEAD or DELAYed, not both"):
            await c.nack(jid, delay=1, dead=True)
        with pytest.raises(ValueError, match="backoff min .* is above its max"):
            await c.add_job(q, b"x", backoff=(2, 1))
        with pytest.raises(ValueError, match="maxdeliver must be >= 1, got 0"):
            await c.add_job(q, b"x", maxdeliver=0)
    finally:
        await c.aclose()


async def test_release_gives_a_delivery_back(flavor, node):
    """RELEASE (ours): the jobs delivered here are queued again now, and their delivery does not
    count (no nack, nothing against MAXDELIVER); the reply counts the jobs queued."""
    c = make_client(flavor, addr(node))
    q = "rel-" + uuid.uuid4().hex[:10]
    try:
        ids = await c.add_jobs(q, [b"a", b"b", b"c"], retry=30, maxdeliver=1)
        got = await c.get_jobs(q, count=2)
        assert [j.id for j in got] == ids[:2] and all(j.last_delivery for j in got)
        assert await c.release(*ids) == 2  # the third was queued, not delivered: not counted
        for job_id in ids[:2]:
            shown = await c.show(job_id)
            assert (shown["state"], shown["nacks"], shown["returns"], shown["deliveries"]) == ("queued", 0, 1, 0)
        again = await c.get_jobs(q, count=3)
        assert sorted(j.id for j in again) == sorted(ids) and all(j.deliveries == 1 and j.attempt == 1 for j in again)
        # DELAY: given back now, queued when the delay ends (the job's returns: 2 for this one)
        delayed = ids[0]
        assert await c.release(delayed, delay=0.5) == 1
        assert (await c.show(delayed))["state"] == "active" and await c.qlen(q) == 0
        [back] = await c.get_jobs(q, count=1, timeout_ms=5000)
        assert (back.id, back.returns, back.attempt, back.deliveries) == (delayed, 2, 1, 1)
        with pytest.raises(ValueError, match="delay must be a finite number >= 0"):
            await c.release(delayed, delay=-1)
        assert await c.ack(*ids) == 3 and await c.release(*ids) == 0  # acknowledged: never queued again
        assert await c.qlen(q + ".dead") == 0
        with pytest.raises(BadIdError, match="Invalid Job ID format"):
            await c.release(ids[0], "not-an-id")  # refused as a whole
        with pytest.raises(ValueError, match="at least one job ID"):
            await c.release()
    finally:
        await c.aclose()


async def test_nack_trace_is_shown_and_handed_to_the_dead_letter(flavor, node):
    """NACK ... TRACE from either face: SHOW's last-failure-trace (never GETJOB's counters),
    kept by its tail past 16 KiB, and the dead letter's."""
    c = make_client(flavor, addr(node))
    q = "trace-" + uuid.uuid4().hex[:10]
    tb = ('Traceback (most recent call last):\n  File "app.py", line 7, in charge\n    card = cards["missing"]\n'
          "KeyError: 'missing'\n")
    try:
        jid = await c.add_job(q, b"payload", retry=5, maxdeliver=2)
        await c.get_jobs(q)
        assert await c.nack(jid, delay=0.1, reason="KeyError: 'missing'", trace=tb) == 1
        shown = await c.show(jid)
        assert shown["last-failure-trace"] == tb and shown["last-nack-reason"] == "KeyError: 'missing'"
        [job] = await c.get_jobs(q, timeout_ms=5000)
        assert job.last_nack_reason == "KeyError: 'missing'"
        huge = "x" * 200_000 + "\n" + tb  # the tail is what is kept: the failing line and the error
        assert await c.nack(jid, reason="again", trace=huge) == 1  # its MAXDELIVER: dead-lettered
        [dead] = await c.get_jobs(q + ".dead", timeout_ms=5000)
        kept = (await c.show(dead.id))["last-failure-trace"]
        assert len(kept.encode()) <= 16384 and kept.endswith(tb) and kept.startswith("[traceback cut: its first ")
        await c.ack(dead.id)
    finally:
        await c.aclose()


async def test_non_utf8_queue_and_body(flavor, node):
    c = make_client(flavor, addr(node))
    q = b"bin-\xff\xfe-" + uuid.uuid4().hex[:6].encode()
    try:
        jid = await c.add_job(q, b"\xc3\x28\xff")
        [job] = await c.get_jobs(q)
        assert job.id == jid and job.body == b"\xc3\x28\xff"
        assert job.queue.encode("utf-8", "surrogateescape") == q  # round-trips
        assert await c.ack(job.id) == 1
        assert await c.qlen(job.queue) == 0
    finally:
        await c.aclose()


async def test_reconnects_after_close(flavor, node, queue):
    c = make_client(flavor, addr(node))
    await c.add_job(queue, b"1")
    await c.aclose()
    assert await c.qlen(queue) == 1  # used again: connects again
    await c.aclose()


def test_sync_client_is_a_context_manager_and_thread_safe(node, queue):
    import threading

    with Client(addr(node)) as c:
        errors = []

        def produce(k):
            try:
                for i in range(50):
                    c.add_job(queue, b"%d-%d" % (k, i))
            except Exception as exc:  # noqa: BLE001
                errors.append(exc)

        threads = [threading.Thread(target=produce, args=(k,)) for k in range(4)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert not errors and c.qlen(queue) == 200
        while c.get_jobs(queue, count=100, nohang=True):
            pass
        wait_for(lambda: raw(node).execute_command("QLEN", queue) == 0, what="drained")


async def test_aio_client_shared_by_tasks(node, queue):
    """A blocking GETJOB in one task does not hold up ACKs from another."""
    async with AioClient(addr(node)) as c:
        results = []

        async def consumer():
            results.extend(await c.get_jobs(queue, timeout_ms=5000))

        async with trio.open_nursery() as n:
            n.start_soon(consumer)
            await trio.sleep(0)  # let it block first: then the pool opens another connection
            ids = await c.add_jobs(queue, [b"a"])
        assert [j.id for j in results] == ids
        assert await c.ack(*ids) == 1
