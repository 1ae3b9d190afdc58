"""The append-only file across real node processes: kill -9 and restart, truncated and
corrupt files, controlled restarts (aof-enqueue-jobs-once, SHUTDOWN REWRITE-AOF),
background and automatic rewrites, and turning the AOF on and off at runtime.

Every node here runs on a free port with its own ``dir``; a restart starts a new process
on the same port and ``dir`` (the AOF and nodes.conf are there, so a node keeps its ID).
"""

from __future__ import annotations

import os
import random
import re
import signal
import subprocess
import threading
from pathlib import Path

import pytest
import redis
from redis.backoff import NoBackoff
from redis.retry import Retry

from disque_py.cli import launcher
from disque_py.persistence.records import LoadJob, RecordReader

from ..integration.conftest import ROOT, NodeProcess, start_node, wait_for  # noqa: F401  (fixture)

pytestmark = pytest.mark.integration

AOF = {"appendonly": "yes", "appendfsync": "always"}


# --------------------------------------------------------------------------- helpers


def kill9(node: NodeProcess) -> None:
    assert node.proc is not None
    node.proc.kill()
    node.proc.wait(10)


def aof_path(node: NodeProcess) -> Path:
    return Path(node.directives["dir"]) / "disque.aof"


def restart(start_node, node: NodeProcess, **overrides) -> NodeProcess:  # noqa: F811
    """A new process on the same port and dir, with the same directives (and ``overrides``)."""
    directives = {**node.directives, **overrides}
    return start_node(port=node.port, **directives)


def log_mark(node: NodeProcess) -> int:
    try:
        return node.log_path.stat().st_size
    except OSError:
        return 0


def log_since(node: NodeProcess, mark: int) -> str:
    return node.log()[mark:]


def failed_start(node_dir: Path, port: int, **directives) -> tuple[int, str]:
    """Start a node expected to refuse to start: its exit code and what it logged."""
    node = NodeProcess(node_dir.parent, port=port, **{**directives, "dir": str(node_dir)})
    mark = log_mark(node)
    proc = launcher.spawn(node.args(), output=node.log_path, cwd=ROOT, env=dict(os.environ, PYTHONUNBUFFERED="1"))
    try:
        code = proc.wait(20)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait(5)
        raise AssertionError("the node did not refuse to start:\n" + node.log()[mark:])
    return code, node.log()[mark:]


def info(r: redis.Redis) -> dict:
    return r.info("persistence")


def show(r: redis.Redis, job_id: bytes) -> dict | None:
    reply = r.execute_command("SHOW", job_id)
    if reply is None:
        return None
    return {reply[i].decode(): reply[i + 1] for i in range(0, len(reply), 2)}


def addjob(r: redis.Redis, queue: str, body: bytes, *opts) -> bytes:
    return r.execute_command("ADDJOB", queue, body, 5000, *opts)


def records_of(data: bytes) -> list[tuple[int, object]]:
    reader = RecordReader()
    got = reader.feed(data)
    assert reader.finish() is None
    return got


def drain(r: redis.Redis, queues: list[str], want: set[bytes], timeout: float = 10.0) -> dict[bytes, bytes]:
    """GETJOB from ``queues`` until every ID of ``want`` came (or the deadline): ID -> body."""
    got: dict[bytes, bytes] = {}

    def more() -> bool:
        for _, job_id, body in r.execute_command("GETJOB", "TIMEOUT", 100, "COUNT", 100, "FROM", *queues) or []:
            got[job_id] = body
        return want <= set(got)

    try:
        wait_for(more, timeout=timeout, interval=0, what="jobs delivered from %s" % queues)
    except AssertionError:
        raise AssertionError("never delivered again: %r" % sorted(want - set(got))) from None
    return got


def qpeek_all(r: redis.Redis, queue: str) -> list[bytes]:
    return [job[1] for job in r.execute_command("QPEEK", queue, 10000)]


# --------------------------------------------------------------------------- 1. kill -9, always


def test_kill9_with_appendfsync_always_loses_no_job(start_node):  # noqa: F811
    node = start_node(**AOF)
    r = node.client()
    myid = r.execute_command("CLUSTER", "MYID")
    tag = os.urandom(4).hex()
    body = lambda name, i: ("%s-%s-%d" % (name, tag, i)).encode()  # noqa: E731
    waiting = {addjob(r, "qa", body("wait", i), "RETRY", 1): body("wait", i) for i in range(60)}
    taken = {addjob(r, "qt", body("taken", i), "RETRY", 1): body("taken", i) for i in range(30)}
    zero_kept = {addjob(r, "qz", body("zkept", i), "RETRY", 0): body("zkept", i) for i in range(20)}
    zero_taken = {addjob(r, "qz0", body("ztaken", i), "RETRY", 0): body("ztaken", i) for i in range(20)}
    acked = {addjob(r, "qb", body("acked", i), "RETRY", 1): body("acked", i) for i in range(20)}
    deleted = {addjob(r, "qb", body("deleted", i), "RETRY", 1): body("deleted", i) for i in range(20)}
    got = r.execute_command("GETJOB", "NOHANG", "COUNT", 100, "FROM", "qt")
    assert {j[1] for j in got} == set(taken)
    got = r.execute_command("GETJOB", "NOHANG", "COUNT", 100, "FROM", "qz0")
    assert {j[1] for j in got} == set(zero_taken)
    assert r.execute_command("ACKJOB", *acked) == len(acked)
    assert r.execute_command("DELJOB", *deleted) == len(deleted)
    for job_id in zero_taken:
        assert show(r, job_id)["state"] == b"active"
    st = info(r)
    assert (st["aof_enabled"], st["aof_state"], st["aof_last_write_status"]) == (1, "on", "ok")
    wait_for(lambda: info(r)["aof_current_size"] == aof_path(node).stat().st_size > 0, timeout=5,
             what="INFO's aof_current_size is the file's size")  # fmt: skip
    kill9(node)

    node = restart(start_node, node)
    r = node.client()
    assert r.execute_command("CLUSTER", "MYID") == myid  # nodes.conf: the holder the jobs name
    for group in (waiting, taken, zero_kept, zero_taken):
        for job_id, b in group.items():
            job = show(r, job_id)
            assert job is not None, "lost: %r (%r)" % (job_id, b)
            assert job["body"] == b
    for job_id in deleted:
        assert show(r, job_id) is None
    for job_id in acked:
        assert (show(r, job_id) or {}).get("state", b"acked") == b"acked"
    # at-least-once jobs come back through their RETRY timers, bodies intact
    back = drain(r, ["qa", "qt"], set(waiting) | set(taken), timeout=10)
    assert back == {**waiting, **taken}
    # not acked: each comes back once more a RETRY later, so the node's timers ran a while by then
    drain(r, ["qa", "qt"], set(taken), timeout=10)
    # RETRY 0 jobs: never queued again, delivered or not, and not lost
    assert r.execute_command("QLEN", "qz") == 0 and r.execute_command("QLEN", "qz0") == 0
    assert r.execute_command("GETJOB", "NOHANG", "FROM", "qz", "qz0") is None
    for job_id in list(zero_kept) + list(zero_taken):
        assert show(r, job_id)["state"] == b"active"
    assert r.execute_command("QLEN", "qb") == 0


# --------------------------------------------------------------------------- 2. a cluster under load


class Load:
    """A producer (ADDJOB on random nodes) and a consumer (GETJOB + ACKJOB on random nodes)."""

    def __init__(self, ports: list[int], repl: int) -> None:
        self.ports = ports
        self.repl = repl
        self.added: set[bytes] = set()
        self.acked: set[bytes] = set()
        self.ack_unsure: set[bytes] = set()  # ACKJOB sent, no reply: it may have been acked
        self.stop = threading.Event()
        self.errors: list[BaseException] = []
        self.threads = [threading.Thread(target=self._guard, args=(f,)) for f in (self._produce, self._consume)]

    def _client(self, rng: random.Random) -> redis.Redis:
        # no retries: a command that failed is known not to have been answered, never sent twice
        return redis.Redis(host="127.0.0.1", port=rng.choice(self.ports), socket_timeout=5,
                           retry=Retry(NoBackoff(), 0))  # fmt: skip

    def _guard(self, fn) -> None:
        try:
            fn()
        except BaseException as exc:  # noqa: BLE001 - reported by join()
            self.errors.append(exc)

    def _produce(self) -> None:
        rng = random.Random()
        i = 0
        while not self.stop.is_set():
            try:
                job_id = self._client(rng).execute_command(
                    "ADDJOB", "load", b"job-%d" % i, 5000, "REPLICATE", self.repl, "RETRY", 1)  # fmt: skip
            except (redis.ConnectionError, redis.TimeoutError, redis.ResponseError):
                continue  # no ID returned: nothing promised
            finally:
                i += 1
            self.added.add(job_id)

    def _consume(self) -> None:
        rng = random.Random()
        while not self.stop.is_set():
            try:
                got = self._client(rng).execute_command("GETJOB", "TIMEOUT", 50, "COUNT", 5, "FROM", "load")
            except (redis.ConnectionError, redis.TimeoutError, redis.ResponseError):
                continue
            ids = [j[1] for j in got or []]
            if not ids:
                continue
            self.ack_unsure.update(ids)
            try:
                self._client(rng).execute_command("ACKJOB", *ids)
            except (redis.ConnectionError, redis.TimeoutError, redis.ResponseError):
                continue
            self.acked.update(ids)
            self.ack_unsure.difference_update(ids)

    def start(self) -> None:
        for t in self.threads:
            t.start()

    def join(self) -> None:
        self.stop.set()
        for t in self.threads:
            t.join(30)
        assert not self.errors, self.errors


@pytest.mark.parametrize("repl", [1, 3])
def test_cluster_kill9_all_under_load_loses_no_job(start_node, repl):  # noqa: F811
    nodes = start_node.many(3, cluster_node_timeout=2000, **AOF)
    addrs = [(n.host, n.port) for n in nodes]
    launcher.join(addrs, timeout=30)
    ids = [n.client().execute_command("CLUSTER", "MYID") for n in nodes]
    load = Load([n.port for n in nodes], repl)
    load.start()
    wait_for(lambda: len(load.added) >= 60 and len(load.acked) >= 10, timeout=20, what="load running")
    for n in nodes:  # all three at once (the threads still running)
        os.kill(n.proc.pid, signal.SIGKILL)
    for n in nodes:
        n.proc.wait(10)
    load.join()
    must = load.added - load.acked - load.ack_unsure
    assert must, "the load acked everything: nothing to check"

    nodes = [restart(start_node, n) for n in nodes]
    assert [n.client().execute_command("CLUSTER", "MYID") for n in nodes] == ids
    launcher.wait_converged(addrs, timeout=30)
    if repl == 3:
        # A holder answers GOTJOB only once its copy is written: every copy of a job whose ADDJOB
        # returned is in its holder's file, so all three nodes have it (nobody acked it).
        clients = [n.client() for n in nodes]
        missing = [(i, job_id) for job_id in must for i, c in enumerate(clients) if show(c, job_id) is None]
        assert not missing, "%d copies missing, e.g. %r" % (len(missing), missing[:5])
    delivered: set[bytes] = set()

    def drained() -> bool:
        for n in nodes:
            r = n.client()
            got = r.execute_command("GETJOB", "NOHANG", "COUNT", 100, "FROM", "load") or []
            got_ids = [j[1] for j in got]
            if got_ids:
                delivered.update(got_ids)
                r.execute_command("ACKJOB", *got_ids)
        return must <= delivered

    try:
        wait_for(drained, timeout=20, interval=0.05, what="every unacked job delivered")
    except AssertionError:
        raise AssertionError("%d of %d jobs lost: %r" % (len(must - delivered), len(must),
                                                          sorted(must - delivered)[:10])) from None  # fmt: skip


# --------------------------------------------------------------------------- 3. everysec


def test_kill9_with_appendfsync_everysec_loses_no_job(start_node):  # noqa: F811
    # With everysec a record is written (into the OS's page cache) before the reply that depends
    # on it leaves, and fsynced within about a second: a process crash (kill -9) loses nothing,
    # only a power cut or a kernel crash could lose the last 1-2 s, which a test cannot make.
    node = start_node(appendonly="yes", appendfsync="everysec")
    r = node.client()
    assert info(r)["aof_fsync_policy"] == "everysec"
    jobs = [addjob(r, "q", b"e-%d" % i, "RETRY", 0) for i in range(100)]
    jobs.append(addjob(r, "big", os.urandom(16 << 20), "RETRY", 0))  # its record takes a while to write
    kill9(node)  # at once: no second passed for the fsync task
    r = restart(start_node, node).client()
    lost = [job_id for job_id in jobs if show(r, job_id) is None]
    assert not lost, "%d of %d jobs lost" % (len(lost), len(jobs))


def test_everysec_writes_binary_jobs_and_fsyncs_once_a_second(start_node):  # noqa: F811
    node = start_node(appendonly="yes", appendfsync="everysec")
    r = node.client()
    jobs = {addjob(r, "q", b"e-%d" % i, "RETRY", 0): (b"q", b"e-%d" % i) for i in range(50)}
    # binary-safe: CR LF and NUL in names and bodies, an empty body, a body longer than a read chunk
    for q, b in [(b"q\r\nx", b"a\r\nb\x00c"), (b"empty", b""), (b"big", os.urandom(5 << 20))]:
        jobs[addjob(r, q, b, "RETRY", 0)] = (q, b)
    wait_for(lambda: info(r)["aof_fsyncs"] >= 1, timeout=5, what="the once-a-second fsync")
    assert node.stop() == 0  # a clean stop writes what is left
    r = restart(start_node, node).client()
    for job_id, (q, b) in jobs.items():
        job = show(r, job_id)
        assert job is not None and job["body"] == b and job["queue"] == q, job_id


# --------------------------------------------------------------------------- 4. truncated


def test_truncated_file_loads_by_default_and_refuses_with_no(start_node):  # noqa: F811
    node = start_node(**AOF)
    r = node.client()
    jobs = [addjob(r, "q", b"t-%d" % i, "RETRY", 0) for i in range(20)]
    assert node.stop() == 0
    path = aof_path(node)
    data = path.read_bytes()
    recs = records_of(data)
    last_off, last = recs[-1]
    assert isinstance(last, LoadJob) and last.id == jobs[-1]
    cut = last_off + (len(data) - last_off) // 2
    path.write_bytes(data[:cut])

    code, log = failed_start(node.dir, node.port, **{**node.directives, "aof_load_truncated": "no"})
    assert code != 0
    assert "byte offset %d" % last_off in log, log
    assert path.stat().st_size == cut  # left as it was

    mark = log_mark(node)
    node = restart(start_node, node)
    log = log_since(node, mark)
    assert "%d bytes at byte offset %d dropped" % (cut - last_off, last_off) in log, log
    assert path.stat().st_size == last_off
    r = node.client()
    for job_id in jobs[:-1]:
        assert show(r, job_id) is not None, job_id
    assert show(r, jobs[-1]) is None
    # what it writes now follows the last whole record: the next load finds no damage
    more = addjob(r, "q", b"after-the-cut", "RETRY", 0)
    kill9(node)
    mark = log_mark(node)
    node = restart(start_node, node, aof_load_truncated="no")
    assert "ends inside a record" not in log_since(node, mark)
    assert show(node.client(), more)["body"] == b"after-the-cut"
    assert records_of(path.read_bytes())[-1][1].id == more


# --------------------------------------------------------------------------- 5. corrupt


@pytest.mark.parametrize("where", ["body", "numbers", "middle"])
def test_corrupt_record_stops_the_node_naming_its_offset(start_node, where):  # noqa: F811
    node = start_node(**AOF)
    r = node.client()
    jobs = [addjob(r, "q", b"corrupt-me-%02d" % i, "RETRY", 0) for i in range(10)]
    assert node.stop() == 0
    path = aof_path(node)
    data = bytearray(path.read_bytes())
    recs = [(off, rec) for off, rec in records_of(bytes(data)) if isinstance(rec, LoadJob)]  # (VERSION first)
    k = 6
    start, rec = recs[k]
    end = recs[k + 1][0]
    assert isinstance(rec, LoadJob) and rec.id == jobs[k]
    record = bytes(data[start:end])
    if where == "body":
        pos = start + record.index(b"corrupt-me-06") + 5
    elif where == "numbers":
        m = re.search(rb"\r\n(\d+) (\d+) (\d{10,}) ", record)  # repl flags ctime ...
        assert m is not None, record
        pos = start + m.start(3) + 7  # a digit of the creation time
    else:
        pos = (start + end) // 2
    data[pos] ^= 0x01
    path.write_bytes(bytes(data))

    code, log = failed_start(node.dir, node.port, **node.directives)
    assert code != 0
    m = re.search(r"corrupt record at byte offset (\d+)", log)
    assert m is not None, log
    assert int(m.group(1)) == start, (int(m.group(1)), start, pos)


# --------------------------------------------------------------------------- 6. controlled restart


@pytest.mark.parametrize("appendonly", ["no", "yes"])
def test_controlled_restart_requeues_the_queued_jobs_once(start_node, tmp_path, appendonly):  # noqa: F811
    conf = tmp_path / ("disque-%s.conf" % appendonly)
    conf.write_text("# test config\n")
    node = start_node(config_file=str(conf), appendonly=appendonly, appendfsync="always")
    r = node.client()
    queues = ["qa", "qb", "qc"]
    for i in range(90):
        q = queues[i % 3]
        retry = 0 if i % 4 == 0 else 60
        addjob(r, q, b"%s-%d" % (q.encode(), i), "RETRY", retry)
    delivered = {}
    for q in queues:
        for _, job_id, _b in r.execute_command("GETJOB", "NOHANG", "COUNT", 5, "FROM", q):
            delivered[job_id] = show(r, job_id)["retry"]
    assert 0 in delivered.values()
    before = {q: qpeek_all(r, q) for q in queues}
    assert all(len(v) == 25 for v in before.values())
    assert r.execute_command("CONFIG", "SET", "aof-enqueue-jobs-once", "yes") == b"OK"
    assert r.execute_command("CONFIG", "REWRITE") == b"OK"
    assert re.search(r"^aof-enqueue-jobs-once yes$", conf.read_text(), re.M), conf.read_text()
    try:  # the node closes the connection without a reply (a plain socket: no client retries)
        launcher.call(node.port, "SHUTDOWN", "REWRITE-AOF")
    except OSError:
        pass
    assert node.proc.wait(20) == 0

    node = restart(start_node, node)
    r = node.client()
    after = {q: qpeek_all(r, q) for q in queues}
    assert after == before
    for job_id, retry in delivered.items():
        job = show(r, job_id)
        assert job is not None and job["state"] == b"active", (job_id, job)
    text = conf.read_text()
    assert re.search(r"^aof-enqueue-jobs-once no$", text, re.M) and "aof-enqueue-jobs-once yes" not in text, text
    assert r.config_get("aof-enqueue-jobs-once") == {"aof-enqueue-jobs-once": "no"}


# --------------------------------------------------------------------------- 7. rewrites


def test_bgrewriteaof_during_load_loses_nothing_and_shrinks(start_node):  # noqa: F811
    node = start_node(auto_aof_rewrite_percentage=0, **AOF)
    r = node.client()
    old = [addjob(r, "q", b"old-%d" % i, "RETRY", 0) for i in range(300)]
    assert r.execute_command("ACKJOB", *old[:250]) == 250
    live = set(old[250:])
    size_before = info(r)["aof_current_size"]
    added: list[bytes] = []
    stop = threading.Event()

    def produce(k: int) -> None:
        c = node.client()
        i = 0
        while not stop.is_set():
            added.append(addjob(c, "p", b"during-%d-%d" % (k, i), "RETRY", 0))
            i += 1

    threads = [threading.Thread(target=produce, args=(k,)) for k in range(2)]
    for t in threads:
        t.start()
    try:
        wait_for(lambda: len(added) >= 20, timeout=10, what="producer running")
        mark = log_mark(node)
        for n in range(1, 4):
            assert r.execute_command("BGREWRITEAOF")  # +Background append only file rewriting started
            wait_for(lambda: info(r)["aof_rewrite_in_progress"] == 0 and info(r)["aof_rewrites"] == n,
                     timeout=20, what="rewrite %d done" % n)  # fmt: skip
            if n == 1:
                size_after = info(r)["aof_current_size"]
    finally:
        stop.set()
        for t in threads:
            t.join(20)
    assert size_after < size_before, (size_after, size_before)
    appended = [int(x) for x in re.findall(r"(\d+) bytes of new records appended", log_since(node, mark))]
    assert len(appended) == 3 and sum(appended) > 0, appended  # records did arrive during the rewrites
    live |= set(added)
    kill9(node)
    r = restart(start_node, node).client()
    for job_id in live:
        assert show(r, job_id) is not None, job_id
    for job_id in old[:250]:
        assert show(r, job_id) is None


def test_kill9_during_a_rewrite_loses_nothing(start_node):  # noqa: F811
    """The old file stays the one appended to until the new one replaces it (a rename): a crash in
    the middle of a rewrite leaves the old file, with every record written meanwhile."""
    node = start_node(auto_aof_rewrite_percentage=0, **AOF)
    r = node.client()
    p = r.pipeline(transaction=False)
    for i in range(600):
        p.execute_command("ADDJOB", "q", b"x" * 2000, 5000, "RETRY", 0)
    jobs = p.execute()
    p = r.pipeline(transaction=False)
    p.execute_command("BGREWRITEAOF")
    for i in range(20):
        p.execute_command("ADDJOB", "q", b"during-%d" % i, 5000, "RETRY", 0)
    p.execute_command("INFO", "persistence")
    replies = p.execute()
    jobs += replies[1:-1]
    assert replies[-1]["aof_rewrite_in_progress"] == 1  # the crash comes in the middle of it
    kill9(node)
    # the child outlives its parent (as Redis's does) and finishes its temporary file, which
    # nobody renames: the file the node restarts from is the old one, appended to until the kill
    wait_for(lambda: list(Path(node.directives["dir"]).glob("temp-rewriteaof-bg-*.aof")), timeout=20,
             what="the orphaned rewrite's temporary file")
    r = restart(start_node, node).client()
    for job_id in jobs:
        assert show(r, job_id) is not None, job_id


def test_auto_rewrite_triggers_and_shrinks_the_file(start_node):  # noqa: F811
    node = start_node(auto_aof_rewrite_min_size="1kb", auto_aof_rewrite_percentage=100, **AOF)
    r = node.client()
    assert r.config_get("auto-aof-rewrite-min-size")["auto-aof-rewrite-min-size"] in ("1024", "1kb")
    sizes = []
    keep = []
    for i in range(120):
        job_id = addjob(r, "q", b"auto-%d" % i, "RETRY", 0)
        if i % 10 == 0:
            keep.append(job_id)
        else:
            assert r.execute_command("ACKJOB", job_id) == 1
        sizes.append(info(r)["aof_current_size"])
    wait_for(lambda: info(r)["aof_rewrite_in_progress"] == 0, timeout=20, what="no rewrite running")
    assert info(r)["aof_rewrites"] >= 1
    assert "Starting automatic rewriting of the AOF" in node.log()
    assert any(b < a for a, b in zip(sizes, sizes[1:])), sizes  # a rewrite made it smaller
    kill9(node)
    r = restart(start_node, node).client()
    for job_id in keep:
        assert show(r, job_id) is not None
    assert r.execute_command("QLEN", "q") == 0  # RETRY 0: back active, not queued


# --------------------------------------------------------------------------- 8. on and off at runtime


def test_config_set_appendonly_at_runtime(start_node):  # noqa: F811
    node = start_node(appendonly="no", appendfsync="always")
    r = node.client()
    assert info(r)["aof_state"] == "off"
    before = {addjob(r, "q", b"pre-%d" % i, "RETRY", 0): b"pre-%d" % i for i in range(30)}
    assert r.execute_command("CONFIG", "SET", "appendonly", "yes") == b"OK"
    wait_for(lambda: info(r)["aof_state"] == "on", timeout=20, what="aof_state on")
    during = {addjob(r, "q", b"on-%d" % i, "RETRY", 0): b"on-%d" % i for i in range(10)}
    kill9(node)
    node = restart(start_node, node, appendonly="yes")
    r = node.client()
    for job_id, b in {**before, **during}.items():
        job = show(r, job_id)
        assert job is not None and job["body"] == b, job_id
    assert r.execute_command("CONFIG", "SET", "appendonly", "no") == b"OK"
    assert info(r)["aof_state"] == "off"
    after = [addjob(r, "q", b"off-%d" % i, "RETRY", 0) for i in range(10)]
    data = aof_path(node).read_bytes()
    for job_id in after:
        assert job_id not in data
    kill9(node)
    r = restart(start_node, node, appendonly="yes").client()
    for job_id in after:
        assert show(r, job_id) is None
    for job_id in {**before, **during}:
        assert show(r, job_id) is not None


def test_config_set_appendonly_yes_during_a_rewrite_keeps_the_jobs_added_before(start_node):  # noqa: F811
    node = start_node(appendonly="no", appendfsync="always")
    r = node.client()
    first = [addjob(r, "q", b"first-%d" % i, "RETRY", 0) for i in range(200)]
    p = r.pipeline(transaction=False)  # one read, one pass: the rewrite's child is still running at the end
    p.execute_command("BGREWRITEAOF")  # AOF off: a snapshot without the job below
    p.execute_command("ADDJOB", "q", b"after-the-fork", 5000, "RETRY", 0)
    p.execute_command("CONFIG", "SET", "appendonly", "yes")
    _, late, ok = p.execute()
    assert ok == b"OK"
    wait_for(lambda: info(r)["aof_state"] == "on", timeout=20, what="aof_state on")
    kill9(node)
    r = restart(start_node, node, appendonly="yes").client()
    assert all(show(r, job_id) is not None for job_id in first)
    assert show(r, late) is not None


def test_debug_flushall_during_a_rewrite_is_not_undone_by_it(start_node):  # noqa: F811
    node = start_node(auto_aof_rewrite_percentage=0, **AOF)
    r = node.client()
    jobs = [addjob(r, "q", b"x" * 1000, "RETRY", 0) for _ in range(300)]
    p = r.pipeline(transaction=False)
    p.execute_command("BGREWRITEAOF")
    p.execute_command("DEBUG", "FLUSHALL")
    assert p.execute()[1] == b"OK"
    wait_for(lambda: info(r)["aof_rewrite_in_progress"] == 0 and info(r)["aof_rewrite_scheduled"] == 0,
             timeout=20, what="no rewrite running or scheduled")  # fmt: skip
    assert show(r, jobs[0]) is None
    kill9(node)
    r = restart(start_node, node).client()
    back = [job_id for job_id in jobs if show(r, job_id) is not None]
    assert not back, "%d flushed jobs came back" % len(back)


def test_shutdown_while_the_first_rewrite_runs_loses_no_job(start_node):  # noqa: F811
    node = start_node(appendonly="no", appendfsync="always")
    r = node.client()
    jobs = [addjob(r, "q", b"x" * 1000, "RETRY", 0) for _ in range(300)]
    p = r.pipeline(transaction=False)
    p.execute_command("CONFIG", "SET", "appendonly", "yes")
    p.execute_command("SHUTDOWN")
    try:
        replies = p.execute(raise_on_error=False)
    except redis.ConnectionError:  # it exited
        replies = None
    if replies is not None:  # refused: it keeps running until its file is written
        assert isinstance(replies[1], redis.ResponseError), replies
        wait_for(lambda: info(r)["aof_state"] == "on", timeout=20, what="aof_state on")
        kill9(node)
    else:
        assert node.proc.wait(20) is not None
    r = restart(start_node, node, appendonly="yes").client()
    kept = [job_id for job_id in jobs if show(r, job_id) is not None]
    assert len(kept) == len(jobs), "%d of %d jobs lost" % (len(jobs) - len(kept), len(jobs))


def test_info_names_the_wait_rewrite_state_as_disque(start_node):  # noqa: F811
    node = start_node(appendonly="no")
    r = node.client()
    p = r.pipeline(transaction=False)
    for i in range(300):
        p.execute_command("ADDJOB", "q", b"x" * 1000, 5000, "RETRY", 0)
    p.execute()
    p = r.pipeline(transaction=False)
    p.execute_command("CONFIG", "SET", "appendonly", "yes")
    p.execute_command("INFO", "persistence")
    state = p.execute()[1]["aof_state"]
    assert state == "wait-rewrite"  # still rewriting: the same pass
