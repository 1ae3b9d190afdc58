"""A rolling upgrade, proved: three nodes of the last release (its tag's tree, pure Python, with
this checkout's interpreter, AOF on) under a steady load of producers and consumers
(REPLICATE 2, about 500 jobs/s), each restarted in turn on this tree with the same directory and
AOF; every job whose ADDJOB was answered is delivered, duplicates are counted, and each node
shows the others' releases as they change (docs/OPERATIONS.md, "Upgrading")."""

from __future__ import annotations

import io
import os
import re
import subprocess
import sys
import tarfile
import threading
import time
from collections import Counter
from pathlib import Path

import pytest
import redis
from redis.backoff import NoBackoff
from redis.retry import Retry

from disque_py import __version__
from disque_py.cli import launcher
from disque_py.core.features import release_key

from ..ci import in_ci
from .conftest import ROOT, NodeProcess, stop_all, wait_for

pytestmark = pytest.mark.integration

RATE = 500  # jobs/s, over every producer
PRODUCERS = 2
RETRY = 3  # s: a delivery cut by a restart comes back this soon


def previous_release() -> tuple[str, str] | None:
    """The last release before this tree's: its version and a git revision of it (None: not found).
    A tag vX.Y.Z when the clone has one; else, since a clone may come without tags and with no
    origin to fetch them from, the commit before the one that set this tree's version in
    disque_py/__init__.py (a release's version is changed by the first commit after it)."""
    for tag in git("tag", "--list", "v*", "--sort=-v:refname").split():
        if release_key(tag[1:]) < release_key(__version__):
            return tag[1:], tag
    for line in git("log", "--format=%H %P", "-G", "^__version__", "--", "disque_py/__init__.py").splitlines():
        commit, *parents = line.split()
        if not parents:
            continue
        m = re.search(r'^__version__\s*=\s*"([^"]+)"', git("show", parents[0] + ":disque_py/__init__.py"), re.M)
        if m and release_key(m.group(1)) < release_key(__version__):
            return m.group(1), parents[0]
    return None


def git(*args: str) -> str:
    """git's output in this checkout (whoever owns it: CI may run as another user than the clone's)."""
    done = subprocess.run(["git", "-c", "safe.directory=*", *args], cwd=ROOT, capture_output=True, text=True, timeout=60)
    if done.returncode:
        raise RuntimeError("git %s: %s" % (" ".join(args), done.stderr.strip()))
    return done.stdout


def release_tree(tag: str, into: Path) -> Path:
    """The files of ``tag`` (``git archive``), unpacked under ``into``."""
    data = subprocess.run(["git", "-c", "safe.directory=*", "archive", "--format=tar", tag], cwd=ROOT,
                          capture_output=True, timeout=60, check=True).stdout  # fmt: skip
    tree = into / tag
    with tarfile.open(fileobj=io.BytesIO(data)) as tar:
        # (our own repository's files; the filter where this Python has it, as 3.14 makes it the default)
        tar.extractall(tree, **({"filter": "data"} if hasattr(tarfile, "data_filter") else {}))
    return tree


class ReleaseNode(NodeProcess):
    """A node run from a release's tree (``tree``): pure Python, this checkout's interpreter."""

    def __init__(self, tmp: Path, tree: Path, **directives) -> None:
        super().__init__(tmp, **directives)
        self.tree = tree

    def spawn(self) -> subprocess.Popen:
        env = {k: v for k, v in os.environ.items() if not k.startswith("DISQUE_PY_")}
        env.update(PYTHONUNBUFFERED="1", PYTHONPATH=str(self.tree), DISQUE_PY_PURE="1")
        # (run from the tree: python -m puts the working directory first on the path)
        return launcher.spawn(self.args(), output=self.log_path, cwd=self.tree, env=env)


def connect(port: int) -> redis.Redis:
    """A connection that fails at once while its node is down (no retries: the load goes on elsewhere)."""
    return redis.Redis(port=port, socket_timeout=3, socket_connect_timeout=1, retry=Retry(NoBackoff(), 0))


def release_of(node: NodeProcess) -> str:
    return node.client().info("server")["disque_py_version"]


def releases_seen(node: NodeProcess) -> dict[str, str]:
    """CLUSTER NODES on ``node``: each node's ID -> the release shown last on its line."""
    text = node.client().execute_command("CLUSTER", "NODES").decode()
    return {f[0]: f[6] for f in (line.split() for line in text.splitlines()) if len(f) > 6}


class Load:
    """Producers (ADDJOB ... REPLICATE 2, to any node up) and one consumer per node (GETJOB,
    ACKJOB), in threads, until stopped. ``added``: the IDs whose ADDJOB was answered;
    ``received``: every delivery, counted by ID."""

    def __init__(self, ports: list[int]) -> None:
        self.ports = ports
        self.added: set[bytes] = set()
        self.received: Counter[bytes] = Counter()
        self.add_errors = 0
        self.lock = threading.Lock()
        self.producing = threading.Event()
        self.consuming = threading.Event()
        self.threads = [threading.Thread(target=self._produce, args=(i,), daemon=True) for i in range(PRODUCERS)]
        self.threads += [threading.Thread(target=self._consume, args=(p,), daemon=True) for p in ports]

    def start(self) -> None:
        self.producing.set()
        self.consuming.set()
        for t in self.threads:
            t.start()

    def _produce(self, index: int) -> None:
        period = PRODUCERS / RATE
        conns = [connect(p) for p in self.ports]
        n = 0
        at = time.monotonic()
        while self.producing.is_set():
            n += 1
            r = conns[(index + n) % len(conns)]
            try:
                job_id = r.execute_command("ADDJOB", "upgrade", "job-%d-%d" % (index, n), 2000,
                                           "REPLICATE", 2, "RETRY", RETRY)  # fmt: skip
                with self.lock:
                    self.added.add(job_id)
            except redis.RedisError:  # a node restarting, or NOREPL while its copy cannot be made
                with self.lock:
                    self.add_errors += 1
            at += period
            time.sleep(max(0.0, at - time.monotonic()))

    def _consume(self, port: int) -> None:
        r = connect(port)
        while self.consuming.is_set():
            try:
                got = r.execute_command("GETJOB", "TIMEOUT", 100, "COUNT", 50, "FROM", "upgrade") or []
                ids = [job[1] for job in got]
                if ids:
                    r.execute_command("ACKJOB", *ids)
                    with self.lock:
                        self.received.update(ids)
            except redis.RedisError:
                time.sleep(0.1)  # its node is restarting

    def missing(self) -> set[bytes]:
        with self.lock:
            return self.added - set(self.received)

    def stop(self) -> None:
        self.producing.clear()
        self.consuming.clear()
        for t in self.threads:
            t.join(10)


def last_release(tmp_path: Path) -> tuple[str, Path]:
    """The last release before this tree's (its version) and its files; a skip outside CI when the
    clone has no tag older than this tree's release, a failure in CI."""
    try:
        found = previous_release()
    except (OSError, subprocess.SubprocessError, RuntimeError) as e:
        assert not in_ci(), "the last release could not be found: %s" % e
        pytest.skip("the last release could not be found: %s" % e)
    if found is None:
        assert not in_ci(), "no release older than %s in this clone's history: CI needs one" % __version__
        pytest.skip("no release older than this tree's in this clone's history")
    version, rev = found
    return version, release_tree(rev, tmp_path / "releases")


def test_rolling_upgrade_from_the_last_release_loses_nothing(tmp_path):
    old, tree = last_release(tmp_path)
    directives = {"appendonly": "yes", "appendfsync": "everysec", "cluster_node_timeout": 3000}
    nodes: list[NodeProcess] = [ReleaseNode(tmp_path, tree, **directives).start() for _ in range(3)]
    load = None
    try:
        assert [release_of(n) for n in nodes] == [old] * 3
        launcher.join([(n.host, n.port) for n in nodes], timeout=30)
        ids = [n.client().execute_command("CLUSTER", "MYID").decode() for n in nodes]
        load = Load([n.port for n in nodes])
        load.start()
        wait_for(lambda: len(load.added) >= RATE // 2, timeout=10, what="the load running")
        started = time.monotonic()
        for i in range(3):
            if i:  # an old node hears the new ones' announcements: dropped as a kind it does not know
                info = nodes[i].client().execute_command("CLUSTER", "INFO").decode()
                assert int(info.split("cluster_stats_messages_malformed:")[1].split()[0]) >= i, info
            assert nodes[i].stop() == 0
            nodes[i] = NodeProcess(tmp_path, port=nodes[i].port, **directives).start()  # this tree, same dir
            assert release_of(nodes[i]) == __version__
            assert "AOF loaded" in nodes[i].log()
            launcher.wait_converged([(n.host, n.port) for n in nodes], timeout=20)
            # the new node tells each peer's release apart: its own, and those of the old ones
            # once a second PONG came with no answer to its announcement
            want = {nid: (__version__ if j <= i else old) for j, nid in enumerate(ids)}
            wait_for(lambda: releases_seen(nodes[i]) == want, timeout=10, what="the releases in CLUSTER NODES")
            before = len(load.added)
            wait_for(lambda: len(load.added) >= before + RATE // 2, timeout=10, what="jobs added after the restart")
        load.producing.clear()
        elapsed = time.monotonic() - started
        wait_for(lambda: not load.missing(), timeout=30, interval=0.2, what="every job added delivered")
        load.stop()
        duplicates = sum(n - 1 for n in load.received.values() if n > 1)
        print("rolling upgrade %s -> %s: %d jobs added in %.1f s (%.0f/s), %d ADDJOBs refused or cut, %d delivered, "
              "%d duplicates" % (old, __version__, len(load.added), elapsed, len(load.added) / elapsed, load.add_errors,
                                 sum(load.received.values()), duplicates))  # fmt: skip
        assert len(load.added) >= RATE * elapsed / 2  # a steady load all along
        assert duplicates <= len(load.added) // 10, duplicates  # counted; a few, from deliveries cut by a restart
        # every node on this release now, each seeing the others as such, and nothing unknown on the bus
        for n in nodes:
            assert set(releases_seen(n).values()) == {__version__}
            info = n.client().execute_command("CLUSTER", "INFO").decode()
            assert "cluster_stats_messages_unknown:0" in info and "cluster_stats_messages_malformed:0" in info
        # each AOF: the old release's records, then this one's VERSION and its own
        for n in nodes:
            data = (Path(n.directives["dir"]) / "disque.aof").read_bytes()
            assert b"\r\nVERSION\r\n$%d\r\n%s\r\n" % (len(__version__), __version__.encode()) in data
    finally:
        if load is not None:
            load.stop()
        stop_all(nodes)


def test_downgrade_drains_the_node_then_runs_the_last_release(tmp_path):
    """Back one node to the last release (docs/OPERATIONS.md, "Downgrading"): the older release
    refuses this one's AOF, so the node is drained first, its AOF moved aside; it then serves
    beside the newer nodes, both ways, and no job is lost."""
    old, tree = last_release(tmp_path)
    directives = {"appendonly": "yes", "appendfsync": "everysec"}
    nodes: list[NodeProcess] = [NodeProcess(tmp_path, **directives).start() for _ in range(3)]
    try:
        launcher.join([(n.host, n.port) for n in nodes], timeout=30)
        a, b, c = nodes
        jobs = {c.client().execute_command("ADDJOB", "down", "j%d" % i, 5000, "REPLICATE", 2, "RETRY", 60)
                for i in range(60)}  # fmt: skip
        drained = subprocess.run([sys.executable, "-m", "disque_py.cli", "drain", "127.0.0.1:%d" % c.port,
                                  "--max-time", "60"], capture_output=True, text=True, timeout=90, cwd=ROOT)  # fmt: skip
        assert drained.returncode == 0, drained.stdout + drained.stderr
        assert c.stop() == 0
        aof = Path(c.directives["dir"]) / "disque.aof"
        again = ReleaseNode(tmp_path, tree, port=c.port, **directives)
        assert again.exit_code_at_start() != 0  # the older release stops at this one's VERSION record
        aof.rename(aof.with_suffix(".aof.0.2"))
        nodes[2] = c = ReleaseNode(tmp_path, tree, port=c.port, **directives).start()
        assert release_of(c) == old
        c.client().execute_command("CLUSTER", "LEAVING", "no")
        launcher.wait_converged([(n.host, n.port) for n in nodes], timeout=20)
        ids = {n: n.client().execute_command("CLUSTER", "MYID").decode() for n in nodes}
        wait_for(lambda: releases_seen(a)[ids[c]] == old, timeout=10, what="a telling c's release")
        # jobs both ways: added on the older node, copied to a newer one; every job delivered
        jobs |= {c.client().execute_command("ADDJOB", "down", "k%d" % i, 5000, "REPLICATE", 2, "RETRY", 60)
                 for i in range(20)}  # fmt: skip
        received: Counter[bytes] = Counter()

        def consumed() -> bool:
            for n in nodes:
                got = n.client().execute_command("GETJOB", "NOHANG", "COUNT", 100, "FROM", "down") or []
                if got:
                    n.client().execute_command("ACKJOB", *[j[1] for j in got])
                    received.update(j[1] for j in got)
            return jobs <= set(received)

        wait_for(consumed, timeout=20, interval=0.1, what="every job delivered")
        assert sum(received.values()) == len(jobs)  # nothing twice
    finally:
        stop_all(nodes)
