"""What the append-only file costs a node: ADDJOB throughput by fsync policy, load time, rewrite.

    scripts/bench aof                                  everything, disque-py only
    scripts/bench aof --disque-server PATH             the same on Disque 1.0-rc1, run by run beside ours
    scripts/bench aof --quick                          smoke run: small n, 20,000 jobs to load
    scripts/bench aof --only throughput                a subset of: throughput, load (load + rewrite)
    scripts/bench aof --write-aof FILE --node-id ID --jobs N   only write a load file, then exit

Method
------
Every node runs pinned to CPU 0 and the load to CPU 1, like the other suites
(``benchmarks.common``: its launcher, its ``BenchBase.redis_benchmark`` and its
``SyncClient``); every node gets a fresh directory under a scratch directory
(``--scratch``, default a new one in the system's temporary directory, never
the checkout). fsync goes to whatever disk that directory is on: the report
says which file system it was.

* **Throughput** (``throughput``): ``redis-benchmark`` with 50 clients sends
  ``ADDJOB q <100-byte body> 0`` unpipelined (-P 1) and with -P 32, to a
  single fresh node started with each AOF setting: ``--appendonly no``
  (off), then ``--appendonly yes --appendfsync`` ``no``, ``everysec`` and
  ``always``. With ``--disque-server`` every run on our node is followed (or
  preceded) by the same run on Disque with the same flags: the order of the
  two alternates from one setting to the next and from round to round
  (``--rounds``, default 2, ABBA), so that drift of the machine cancels; the
  figure of a cell is the median of its rounds. Ratios: everysec/off,
  always/everysec, and ours/Disque for each setting.
* **Load** (``load``): an AOF of ``--jobs`` (default 1,000,000) LOADJOB
  records written with ``disque_py.persistence.records`` (IDs from
  ``disque_py.core.ids`` with the node's own ID, REPLICATE 1 with the node as
  the only holder, queued in one of ``--queues`` queues, a ``--body-size``
  body, a TTL of a day), its ID first read from the node itself (CLUSTER
  MYID, kept in nodes.conf across the restart). The node is then started with
  ``--appendonly yes`` on it; the clock runs from the spawn to the first
  ``PONG`` and to INFO jobs ``registered_jobs`` reaching the count.
  Disque (``--disque-server``) cannot read our file: it is filled with the
  same number of jobs by ``redis-benchmark -P 32`` (AOF on), rewritten
  (BGREWRITEAOF, so its file also holds one record per job), stopped and
  timed on the same restart.
* **Rewrite** (with ``load``, on the node just loaded): BGREWRITEAOF, then the
  clock runs until INFO persistence shows ``aof_rewrite_in_progress:0`` and
  ``aof_rewrite_scheduled:0``. Meanwhile one connection sends ``ADDJOB`` (or
  ``PING``, ``--probe``) one at a time and records each round trip; the
  p50/p99/max are compared with one second of the same probe before the
  rewrite.

If the node refuses ``--appendonly``/``--appendfsync`` (it exits) or starts
without the AOF on (INFO persistence ``aof_enabled`` is not 1), the run stops
with a message saying so. Prints a Markdown table and saves the raw JSON into
bench-results/ (or ``--write FILE``).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import socket
import statistics
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import hiredis

from disque_py.cli import launcher
from disque_py.core.ids import JobIdGenerator
from disque_py.core.job import QUEUED
from disque_py.persistence.records import LoadJob, encode_many
from disque_py.util.rss import rss_bytes

from . import progress
from .common import (
    CLIENT_CPU,
    HOST,
    SERVER_CPU,
    BenchBase,
    BenchError,
    Server,
    Sizes,
    SyncClient,
    _run,
    default_results_path,
    encode,
    log,
    machine_info,
    port_in_use,
    write_results,
)

SUITES = ("throughput", "load")
#: AOF settings measured, in order: name -> the node's flags.
MODES: dict[str, list[str]] = {
    "off": ["--appendonly", "no"],
    "no": ["--appendonly", "yes", "--appendfsync", "no"],
    "everysec": ["--appendonly", "yes", "--appendfsync", "everysec"],
    "always": ["--appendonly", "yes", "--appendfsync", "always"],
}
AOF_NAME = "disque.aof"
LOAD_TTL = 86_400
LOAD_RETRY = 300
WRITE_BATCH = 10_000
#: Seconds to wait for a node to load its AOF (1M jobs take well under this).
LOAD_TIMEOUT = 900.0
REWRITE_TIMEOUT = 900.0
#: How often the rewrite's end is polled (INFO persistence), seconds.
REWRITE_POLL = 0.05


# --------------------------------------------------------------------------- the load file


def write_load_file(path: str | Path, node_id: str, jobs: int, *, body_size: int = 32, queues: int = 100,
                    now_ms: int | None = None, seed: bytes | None = None) -> int:
    """An AOF of ``jobs`` LOADJOB records of queued single-node jobs created by ``node_id``; returns its size.

    Realistic records: 40-character IDs from the node's ID generator, REPLICATE 1
    with the node as the only holder, a TTL of a day, RETRY 300 s, queues
    ``queue-0`` ... ``queue-<queues-1>``, a body of ``body_size`` bytes.
    """
    if len(node_id) != 40:
        raise ValueError("a node ID has 40 characters")
    now = int(time.time() * 1000) if now_ms is None else now_ms
    gen = JobIdGenerator(node_id, seed if seed is not None else os.urandom(20))
    holders = (node_id,)
    queue_names = [b"queue-%d" % q for q in range(max(1, queues))]
    expire, requeue = now + LOAD_TTL * 1000, now + LOAD_RETRY * 1000
    size = 0
    with open(path, "wb") as f:
        for start in range(0, jobs, WRITE_BATCH):
            batch = []
            for i in range(start, min(jobs, start + WRITE_BATCH)):
                body = (b"job-%d-" % i).ljust(body_size, b"x")[:body_size] if body_size else b""
                batch.append(LoadJob(gen.new_id(LOAD_TTL, LOAD_RETRY), QUEUED, 1, 0, now * 1_000_000 + i, expire,
                                     0, LOAD_RETRY, 0, 0, requeue, queue_names[i % len(queue_names)], holders,
                                     body))  # fmt: skip
            data = encode_many(batch)
            f.write(data)
            size += len(data)
    return size


# --------------------------------------------------------------------------- helpers


def _pct(values: list[float], p: float) -> float | None:
    if not values:
        return None
    s = sorted(values)
    return s[min(len(s) - 1, int(round(p / 100.0 * (len(s) - 1))))]


def _latency(ns: list[int]) -> dict[str, Any]:
    ms = [x / 1e6 for x in ns]
    return {"count": len(ms), "p50_ms": _pct(ms, 50), "p99_ms": _pct(ms, 99), "max_ms": max(ms) if ms else None}


def _median(values: list[float]) -> float | None:
    values = [v for v in values if v is not None]
    return statistics.median(values) if values else None


def _ratio(a: float | None, b: float | None) -> float | None:
    return a / b if a is not None and b else None


def filesystem_of(path: Path) -> str:
    out = _run(["df", "-T", str(path)]).splitlines()
    return " ".join(out[-1].split()[:2]) if len(out) >= 2 else "?"


class Probe:
    """One connection that sends one command at a time and records each round trip (ns)."""

    def __init__(self, port: int, command: tuple[str, ...]) -> None:
        self.sock = socket.create_connection((HOST, port), timeout=30)
        self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.reader = hiredis.Reader()
        self.payload = encode(*command)
        self.errors = 0

    def once(self) -> int:
        t = time.perf_counter_ns()
        self.sock.sendall(self.payload)
        while True:
            reply = self.reader.gets()
            if reply is not False:
                break
            data = self.sock.recv(65536)
            if not data:
                raise BenchError("the node closed the probe's connection")
            self.reader.feed(data)
        if isinstance(reply, hiredis.ReplyError):
            self.errors += 1
        return time.perf_counter_ns() - t

    def run_for(self, seconds: float) -> list[int]:
        out = []
        end = time.monotonic() + seconds
        while time.monotonic() < end:
            out.append(self.once())
        return out

    def close(self) -> None:
        self.sock.close()


def _try_call(port: int, *args: str) -> Any:
    """One command on a fresh connection: the reply (an error reply as an Exception), None if unreachable."""
    try:
        with socket.create_connection((HOST, port), timeout=5) as s:
            reader = hiredis.Reader()
            s.sendall(encode(*args))
            while True:
                reply = reader.gets()
                if reply is not False:
                    return reply
                data = s.recv(65536)
                if not data:
                    return None
                reader.feed(data)
    except OSError:
        return None


def _info(reply: Any) -> dict[str, str]:
    if not isinstance(reply, bytes):
        return {}
    text = reply.decode(errors="replace")
    return dict(line.split(":", 1) for line in text.splitlines() if ":" in line and not line.startswith("#"))


# --------------------------------------------------------------------------- the runner


@dataclass
class AofBench(BenchBase):
    """``BenchBase`` whose nodes get the AOF flags of ``aof_flags`` (and their directory under ``scratch``)."""

    aof_flags: list[str] = field(default_factory=lambda: list(MODES["off"]))
    rounds: int = 2
    load_jobs: int = 1_000_000
    load_body: int = 32
    load_queues: int = 100
    probe: str = "addjob"
    #: the servers measured, in order (default: disque-py, then Disque when ``disque_server`` is set)
    servers_measured: tuple[str, ...] | None = None
    #: the run's progress bar (one step per cell and round, a load and a rewrite per server)
    bar: progress.Bar = field(default_factory=lambda: progress.Bar(0, ""))

    def kinds(self) -> list[str]:
        if self.servers_measured is not None:
            return list(self.servers_measured)
        return super().kinds()

    def disque_argv(self, port: int, workdir: Path, cpu: str = SERVER_CPU) -> list[str]:
        return launcher.node_argv(port, workdir, "--bind", HOST, "--logfile", str(workdir / "log"),
                                  "--appendfilename", AOF_NAME, *self.aof_flags, python=self.python, script=True,
                                  cpu=cpu)  # fmt: skip

    def reference_argv(self, port: int, workdir: Path, cpu: str = SERVER_CPU) -> list[str]:
        assert self.disque_server
        return launcher.pinned([self.disque_server, "--port", str(port), "--bind", HOST, "--dir", str(workdir),
                                "--logfile", str(workdir / "log"), "--daemonize", "no",
                                "--appendfilename", AOF_NAME, *self.aof_flags], cpu)  # fmt: skip

    def redis_argv(self, port: int, workdir: Path, cpu: str = SERVER_CPU) -> list[str]:
        """redis-server (the yardstick, ``--servers ...,redis-server``) with the same AOF flags, no RDB."""
        return launcher.pinned(["redis-server", "--port", str(port), "--save", "", "--bind", HOST,
                                "--dir", str(workdir), "--logfile", str(workdir / "log"), *self.aof_flags], cpu)  # fmt: skip

    @staticmethod
    def key(kind: str, name: str) -> str:
        """Results key: ``name`` for disque-py, ``ref_<name>`` for Disque, ``redis_<name>`` for redis-server."""
        return "redis_" + name if kind == "redis-server" else BenchBase.key(kind, name)

    # ---- nodes with the AOF

    def start_aof(self, kind: str, mode_flags: list[str], workdir: Path | None = None,
                  wait: bool = True) -> Server:  # fmt: skip
        """A node of ``kind`` with ``mode_flags``; its AOF checked on (or off) once it answers."""
        self.aof_flags = list(mode_flags)
        if workdir is None:
            workdir = Path(tempfile.mkdtemp(prefix="%s-" % kind, dir=self.tmp))
        argv = self.server_argv(kind, self.base_port, workdir)
        self.record(argv)
        server = Server(kind, argv, self.base_port, workdir)
        self.servers.append(server)
        server.spawn()
        if wait:
            self.ready(server, mode_flags)
        return server

    def ready(self, server: Server, mode_flags: list[str], timeout: float = 20.0) -> None:
        flags = " ".join(mode_flags)
        try:
            server.wait_ready(timeout)
        except BenchError as exc:
            raise BenchError("%s did not start with %s: %s%s" % (
                server.kind, flags, exc,
                "\nDoes this checkout's node have the append-only file (issue 33)?" if server.kind == "disque-py"
                else "")) from None  # fmt: skip
        self.check_aof_state(server, mode_flags)

    def check_aof_state(self, server: Server, mode_flags: list[str]) -> None:
        want = "1" if "yes" in mode_flags else "0"
        got = _info(_try_call(server.port, "INFO", "persistence")).get("aof_enabled")
        if got != want:
            raise BenchError(
                "%s was started with %s but INFO persistence says aof_enabled:%s: %s" % (
                    server.kind, " ".join(mode_flags), got,
                    "this checkout's node does not have the append-only file yet (issue 33)"
                    if server.kind == "disque-py" else "not the server expected")
            )  # fmt: skip

    def aof_size(self, server: Server) -> int | None:
        try:
            if server.kind == "redis-server":  # redis 7: a directory of base and incremental files
                return sum(f.stat().st_size for f in (server.workdir / "appendonlydir").iterdir())
            return (server.workdir / AOF_NAME).stat().st_size
        except OSError:
            return None

    # ---- throughput

    def bench_throughput(self) -> None:
        kinds = self.kinds()
        step = 0
        for name, n, pipeline in (("p1", self.sizes.n_p1, 1), ("p32", self.sizes.n_p32, 32)):
            for rnd in range(self.rounds):
                modes = list(MODES) if rnd % 2 == 0 else list(reversed(MODES))
                for mode in modes:
                    order = kinds if step % 2 == 0 else list(reversed(kinds))
                    step += 1
                    for kind in order:
                        key = self.key(kind, "aof_%s_%s" % (mode, name))
                        log("ADDJOB -P %d, n=%d, AOF %s (%s, round %d)" % (pipeline, n, mode, kind, rnd + 1))
                        self.bar.doing("%s %s %s r%d" % (name, mode, kind, rnd + 1))
                        node = self.start_aof(kind, MODES[mode])
                        try:
                            if kind == "redis-server":  # the yardstick: a list, under the same AOF settings
                                r = self.redis_benchmark(node, n, pipeline, "LPUSH", "q", self.body)
                                with SyncClient(node.port) as c:
                                    r["registered_jobs"] = int(c.call("LLEN", "q"))
                            else:
                                r = self.redis_benchmark(node, n, pipeline, "ADDJOB", "q", self.body, "0")
                                with SyncClient(node.port) as c:
                                    r["registered_jobs"] = int(c.info("jobs")["registered_jobs"])
                            r["aof_bytes"] = self.aof_size(node)
                            r["round"] = rnd + 1
                            if r["registered_jobs"] < n:
                                self.notes.append("%s: only %d of %d jobs registered" % (key, r["registered_jobs"], n))
                            self.results.setdefault(key, {"runs": []})["runs"].append(r)
                        finally:
                            self.stop(node)
                        self.bar.done()
        for entry in self.results.values():
            if "runs" in entry:
                entry["requests_per_s"] = _median([r["requests_per_s"] for r in entry["runs"]])

    # ---- load and rewrite

    def node_id(self, workdir: Path) -> str:
        """Start our node once in ``workdir`` (AOF off) for its ID, kept in nodes.conf there."""
        node = self.start_aof("disque-py", MODES["off"], workdir)
        try:
            with SyncClient(node.port) as c:
                node_id = c.call("CLUSTER", "MYID").decode()
        finally:
            self.stop(node)
        return node_id

    def wait_loaded(self, server: Server, jobs: int, t0: float) -> dict[str, Any]:
        """From the spawn at ``t0``: seconds to the first PONG and to ``registered_jobs`` >= ``jobs``."""
        deadline = t0 + LOAD_TIMEOUT
        t_pong = None
        last, last_change = -1, time.monotonic()
        while True:
            if server.proc is not None and server.proc.poll() is not None:
                raise BenchError("%s exited while loading its AOF (%s):\n%s"
                                 % (server.kind, server.proc.returncode, server.tail()))  # fmt: skip
            now = time.monotonic()
            if now > deadline:
                raise BenchError("%s had not loaded %d jobs after %.0f s" % (server.kind, jobs, LOAD_TIMEOUT))
            if t_pong is None:
                if _try_call(server.port, "PING") == b"PONG":
                    t_pong = time.monotonic() - t0
                    if _info(_try_call(server.port, "INFO", "persistence")).get("loading") != "1":
                        self.check_aof_state(server, MODES["everysec"])  # fail fast: no AOF, nothing to wait for
                    continue
                time.sleep(0.005)
                continue
            info = _info(_try_call(server.port, "INFO", "jobs"))
            registered = int(info.get("registered_jobs", -1))
            if registered >= jobs:
                return {"ping_s": round(t_pong, 3), "loaded_s": round(time.monotonic() - t0, 3),
                        "registered_jobs": registered}  # fmt: skip
            if registered != last:
                last, last_change = registered, now
            elif now - last_change > 10 and _info(_try_call(server.port, "INFO", "persistence")).get("loading") != "1":
                raise BenchError("%s answers but holds %d of the %d jobs of its AOF (no change for 10 s)"
                                 % (server.kind, registered, jobs))  # fmt: skip
            time.sleep(0.005)

    def rewrite(self, server: Server, measure: bool = True) -> dict[str, Any]:
        """BGREWRITEAOF, timed to the end of the rewrite, with a probe's round trips before and during it
        (without ``measure``: no probe)."""
        command = ("ADDJOB", "probe", "x", "0") if self.probe == "addjob" else ("PING",)
        probe = Probe(server.port, command)
        try:
            before = probe.run_for(1.0) if measure else []
            size_before = self.aof_size(server)
            with SyncClient(server.port) as c:
                # A rewrite the server started by itself (Disque's auto-aof-rewrite, during a fill) would
                # refuse ours: let it end first.
                deadline = time.monotonic() + REWRITE_TIMEOUT
                while _rewriting(c.info("persistence")):
                    if time.monotonic() > deadline:
                        raise BenchError("%s: a rewrite already running did not end in %.0f s"
                                         % (server.kind, REWRITE_TIMEOUT))  # fmt: skip
                    time.sleep(REWRITE_POLL)
                t0 = time.monotonic()
                reply = _try_call(server.port, "BGREWRITEAOF")
                if isinstance(reply, Exception) or reply is None:
                    raise BenchError("%s refused BGREWRITEAOF: %s" % (server.kind, reply))
                during: list[int] = []
                seen_running = False
                next_poll = t0
                while True:
                    now = time.monotonic()
                    if now >= next_poll:
                        info = c.info("persistence")
                        running = _rewriting(info)
                        seen_running |= running
                        if not running:
                            elapsed = time.monotonic() - t0
                            break
                        if now - t0 > REWRITE_TIMEOUT:
                            raise BenchError("%s: the rewrite was still running after %.0f s" % (server.kind, REWRITE_TIMEOUT))
                        next_poll = now + REWRITE_POLL
                    if measure:
                        during.append(probe.once())
                    else:
                        time.sleep(REWRITE_POLL)
                status = info.get("aof_last_bgrewrite_status")
        finally:
            probe.close()
        if status not in (None, "ok"):
            raise BenchError("%s: the rewrite failed (aof_last_bgrewrite_status:%s)" % (server.kind, status))
        return {"rewrite_s": round(elapsed, 3), "seen_in_progress": seen_running, "probe": " ".join(command),
                "probe_errors": probe.errors, "latency_before": _latency(before), "latency_during": _latency(during),
                "aof_bytes_before": size_before, "aof_bytes_after": self.aof_size(server)}  # fmt: skip

    def bench_load(self) -> None:
        for kind in self.kinds():
            if kind == "redis-server":  # the yardstick is measured in the throughput suite only
                continue
            key = self.key(kind, "aof_load")
            workdir = Path(tempfile.mkdtemp(prefix="load-%s-" % kind, dir=self.tmp))
            jobs = self.load_jobs
            r: dict[str, Any] = {"jobs": jobs}
            if kind == "disque-py":
                node_id = self.node_id(workdir)
                log("writing an AOF of %d jobs for node %s" % (jobs, node_id[:8]))
                t = time.monotonic()
                r["aof_bytes"] = write_load_file(workdir / AOF_NAME, node_id, jobs, body_size=self.load_body,
                                                 queues=self.load_queues)  # fmt: skip
                r["write_s"] = round(time.monotonic() - t, 2)
            else:
                log("filling Disque with %d jobs (AOF on), then BGREWRITEAOF" % jobs)
                node = self.start_aof(kind, MODES["everysec"], workdir)
                try:
                    body = "x" * self.load_body
                    r["fill"] = self.redis_benchmark(node, jobs, 32, "-r", str(self.load_queues), "ADDJOB",
                                                     "queue-__rand_int__", body, "0")  # fmt: skip
                    self.rewrite(node, measure=False)
                    with SyncClient(node.port) as c:
                        filled = int(c.info("jobs")["registered_jobs"])
                finally:
                    self.stop(node)
                r["aof_bytes"] = (workdir / AOF_NAME).stat().st_size
                if filled != jobs:
                    self.notes.append("%s: Disque held %d jobs after the fill, not %d" % (key, filled, jobs))
                    jobs = r["jobs"] = filled
            log("loading %d jobs from a %d-byte AOF (%s)" % (jobs, r["aof_bytes"], kind))
            self.bar.doing("load %s" % kind)
            t0 = time.monotonic()
            node = self.start_aof(kind, MODES["everysec"], workdir, wait=False)
            try:
                r.update(self.wait_loaded(node, jobs, t0))
                self.check_aof_state(node, MODES["everysec"])
                if kind == "disque-py":
                    with SyncClient(node.port) as c:
                        if c.call("CLUSTER", "MYID").decode() != node_id:
                            self.notes.append("%s: the node came back under a new ID: it loaded another "
                                              "node's jobs" % key)  # fmt: skip
                r["jobs_per_s"] = round(jobs / r["loaded_s"]) if r["loaded_s"] else None
                r["node_rss_kb"] = _rss_kb(node)
                self.results[key] = r
                self.bar.done()
                log("BGREWRITEAOF with %d jobs (%s), probe %s" % (jobs, kind, self.probe.upper()))
                self.bar.doing("rewrite %s" % kind)
                self.results[self.key(kind, "aof_rewrite")] = dict(self.rewrite(node), jobs=jobs)
                self.bar.done()
            finally:
                self.stop(node)
                shutil.rmtree(workdir, ignore_errors=True)


def _rewriting(persistence: dict[str, str]) -> bool:
    """INFO persistence says an AOF rewrite is running or scheduled."""
    return persistence.get("aof_rewrite_in_progress") == "1" or persistence.get("aof_rewrite_scheduled") == "1"


def _rss_kb(server: Server) -> int | None:
    try:
        pid = server.proc.pid
    except AttributeError:
        return None
    return rss_bytes(pid) // 1024 or None


# --------------------------------------------------------------------------- report


def _r(v: float | None) -> str:
    return "—" if v is None else "{:,.0f}/s".format(v)


def _x(v: float | None) -> str:
    return "—" if v is None else "%.2f" % v


def _ms(v: float | None) -> str:
    return "—" if v is None else "%.2f ms" % v


def markdown_report(bench: AofBench, machine: dict[str, Any]) -> str:
    res = bench.results
    out = ["# disque-py AOF benchmark", "",
           "%s, %s CPUs, Python %s, commit %s, %s; scratch on %s." % (
               machine.get("cpu_model", "?"), machine.get("nproc"), machine.get("python"), machine.get("git_commit"),
               machine.get("date"), machine.get("scratch_fs", "?"))]  # fmt: skip
    if machine.get("disque_server"):
        out.append("Reference: %s." % machine["disque_server"])
    if any(k.startswith(("aof_", "ref_aof_")) and k.endswith(("_p1", "_p32")) for k in res):
        out += ["", "ADDJOB, %d clients, %d-byte body, median of %d round(s):" % (bench.clients, bench.body_size,
                                                                                 bench.rounds), "",
                "| server | -P | off | appendfsync no | everysec | always | everysec/off | always/everysec |",
                "|---|---|---|---|---|---|---|---|"]  # fmt: skip
        for name, p in (("p1", 1), ("p32", 32)):
            for kind in bench.kinds():
                rate = {m: res.get(bench.key(kind, "aof_%s_%s" % (m, name)), {}).get("requests_per_s") for m in MODES}
                out.append("| %s | %d | %s | %s | %s | %s | %s | %s |" % (
                    kind, p, *(_r(rate[m]) for m in MODES), _x(_ratio(rate["everysec"], rate["off"])),
                    _x(_ratio(rate["always"], rate["everysec"]))))  # fmt: skip
        for other, label in (("disque", "Disque"), ("redis-server", "redis-server (LPUSH)")):
            if {"disque-py", other} <= set(bench.kinds()):
                out += ["", "disque-py / %s, same runs:" % label, "",
                        "| -P | off | appendfsync no | everysec | always |", "|---|---|---|---|---|"]  # fmt: skip
                for name, p in (("p1", 1), ("p32", 32)):
                    cells = []
                    for m in MODES:
                        ours = res.get("aof_%s_%s" % (m, name), {}).get("requests_per_s")
                        ref = res.get(bench.key(other, "aof_%s_%s" % (m, name)), {}).get("requests_per_s")
                        cells.append(_x(_ratio(ours, ref)))
                    out.append("| %d | %s |" % (p, " | ".join(cells)))
    if any(k.endswith("aof_load") for k in res):
        out += ["", "Load (start with --appendonly yes on an AOF of N jobs) and BGREWRITEAOF on the loaded node:", "",
                "| server | jobs | AOF bytes | first PONG | all jobs | jobs/s | RSS | rewrite | probe p50 / p99 / max "
                "before | during |", "|---|---|---|---|---|---|---|---|---|---|"]  # fmt: skip
        for kind in bench.kinds():
            load = res.get(bench.key(kind, "aof_load"))
            rw = res.get(bench.key(kind, "aof_rewrite"), {})
            if not load:
                continue
            lb, ld = rw.get("latency_before", {}), rw.get("latency_during", {})
            out.append("| %s | {:,} | {:,} | %.2f s | %.2f s | %s | %s | %s | %s | %s |".format(
                load["jobs"], load["aof_bytes"]) % (
                kind, load["ping_s"], load["loaded_s"], _r(load.get("jobs_per_s")),
                "%.0f MB" % (load["node_rss_kb"] / 1024) if load.get("node_rss_kb") else "—",
                "%.2f s" % rw["rewrite_s"] if "rewrite_s" in rw else "—",
                " / ".join(_ms(lb.get(k)) for k in ("p50_ms", "p99_ms", "max_ms")),
                " / ".join(_ms(ld.get(k)) for k in ("p50_ms", "p99_ms", "max_ms")) + " (%s)" % ld.get("count", 0)))  # fmt: skip
        if {"disque-py", "disque"} <= set(bench.kinds()):
            ours, ref = res.get("aof_load"), res.get("ref_aof_load")
            if ours and ref:
                out.append("")
                out.append("Load rate disque-py / Disque: %s." % _x(_ratio(ours.get("jobs_per_s"), ref.get("jobs_per_s"))))
    if bench.notes:
        out += ["", *("Note: " + n for n in bench.notes)]
    return "\n".join(out) + "\n"


# --------------------------------------------------------------------------- main


def parse_args(argv: list[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        prog="scripts/bench aof",
        description="What the append-only file costs: ADDJOB throughput with the AOF off and with appendfsync "
        "no/everysec/always (-P 1 and -P 32, 50 clients), the time to load an AOF of 1M jobs, and a rewrite "
        "(BGREWRITEAOF) with the latency a client sees meanwhile. With --disque-server, Disque 1.0-rc1 runs "
        "the same, run by run. Nodes on CPU %s, load on CPU %s." % (SERVER_CPU, CLIENT_CPU),
    )  # fmt: skip
    p.add_argument("--quick", action="store_true", help="smoke run: n=2,000 / 10,000, 1 round, 20,000 jobs to load")
    p.add_argument("--only", default=",".join(SUITES), help="comma-separated subset of: %s" % ",".join(SUITES))
    p.add_argument("--base-port", type=int, default=17711, help="the node's port (default 17711)")
    p.add_argument("--disque-server", metavar="PATH", default=None,
                   help="a disque-server binary of Disque 1.0-rc1: every run is also made on it")
    p.add_argument("--n-p1", type=int, default=None, help="ADDJOB requests per -P 1 run (default 100,000)")
    p.add_argument("--n-p32", type=int, default=None, help="ADDJOB requests per -P 32 run (default 500,000)")
    p.add_argument("--rounds", type=int, default=None, help="rounds of every throughput run (default 2, quick 1)")
    p.add_argument("--jobs", type=int, default=None, help="jobs in the AOF to load (default 1,000,000)")
    p.add_argument("--load-body", type=int, default=32, help="body bytes of the loaded jobs (default 32)")
    p.add_argument("--queues", type=int, default=100, help="queues the loaded jobs are spread over (default 100)")
    p.add_argument("--probe", choices=("addjob", "ping"), default="addjob",
                   help="the command whose latency is measured during the rewrite (default addjob)")
    p.add_argument("--scratch", metavar="DIR", default=None,
                   help="where the nodes' directories (and AOFs) go; default a new directory in $TMPDIR. "
                        "fsync costs what this file system makes it cost")
    p.add_argument("--servers", default=None,
                   help="comma-separated servers to measure, in order: disque-py, disque, redis-server (default "
                        "disque-py, and disque with --disque-server; redis-server, a yardstick, runs LPUSH under "
                        "the same AOF settings, in the throughput suite only)")
    p.add_argument("--write", metavar="FILE", help="JSON results file (default bench-results/<date>-<commit>-aof.json)")
    p.add_argument("--write-aof", metavar="FILE", help="only write a load file of --jobs jobs for --node-id, then exit")
    p.add_argument("--node-id", default=None, help="with --write-aof: the 40-character ID of the node that loads it")
    a = p.parse_args(argv)
    a.suites = [s.strip() for s in a.only.split(",") if s.strip()]
    unknown = sorted(set(a.suites) - set(SUITES))
    if unknown:
        p.error("unknown suite(s) %s; choose from %s" % (", ".join(unknown), ", ".join(SUITES)))
    for name in ("n_p1", "n_p32", "rounds", "jobs"):
        v = getattr(a, name)
        if v is not None and v < 1:
            p.error("--%s must be >= 1" % name.replace("_", "-"))
    if a.load_body < 0 or a.queues < 1:
        p.error("--load-body must be >= 0 and --queues >= 1")
    if a.write_aof and (not a.node_id or len(a.node_id) != 40):
        p.error("--write-aof needs --node-id, the 40-character ID of the node (CLUSTER MYID)")
    a.servers_measured = None
    if a.servers:
        a.servers_measured = tuple(x.strip() for x in a.servers.split(",") if x.strip())
        if not a.servers_measured or set(a.servers_measured) - {"disque-py", "disque", "redis-server"}:
            p.error("--servers: a comma-separated list of disque-py, disque, redis-server")
        if "disque" in a.servers_measured and not a.disque_server:
            p.error("--servers disque needs --disque-server PATH")
    if a.disque_server:
        found = shutil.which(a.disque_server)
        if not found:
            p.error("--disque-server %s: no such executable" % a.disque_server)
        a.disque_server = os.path.abspath(found)
    if a.scratch and Path(a.scratch).resolve().is_relative_to(Path(__file__).resolve().parents[2]) and \
            not Path(a.scratch).resolve().is_relative_to(Path(__file__).resolve().parents[2] / "bench-results"):
        p.error("--scratch: not inside the checkout (bench-results/ is fine)")  # fmt: skip
    if not 1 <= a.base_port <= 65535 - 10000:
        p.error("--base-port leaves no room for the cluster bus (+10000)")
    return a


def sizes_of(a: argparse.Namespace) -> tuple[Sizes, int, int]:
    """(Sizes with n_p1 and n_p32, rounds, jobs to load) from the options."""
    sizes = Sizes(n_p1=2_000, n_p32=10_000) if a.quick else Sizes()
    if a.n_p1:
        sizes.n_p1 = a.n_p1
    if a.n_p32:
        sizes.n_p32 = a.n_p32
    rounds = a.rounds or (1 if a.quick else 2)
    jobs = a.jobs or (20_000 if a.quick else 1_000_000)
    return sizes, rounds, jobs


def _on_sigterm(signum: int, frame: object) -> None:
    raise KeyboardInterrupt


def main(argv: list[str] | None = None) -> int:
    a = parse_args(sys.argv[1:] if argv is None else argv)
    sizes, rounds, jobs = sizes_of(a)
    if a.write_aof:
        t = time.monotonic()
        size = write_load_file(a.write_aof, a.node_id, jobs, body_size=a.load_body, queues=a.queues)
        log("%s: %d jobs, %d bytes, %.1f s" % (a.write_aof, jobs, size, time.monotonic() - t))
        return 0
    signal.signal(signal.SIGTERM, _on_sigterm)
    try:  # the rewrite's probe runs in this process: on the load's CPU (every node is pinned by taskset)
        os.sched_setaffinity(0, {int(CLIENT_CPU)})
    except (OSError, ValueError):
        pass
    scratch = Path(a.scratch) if a.scratch else None
    if scratch:
        scratch.mkdir(parents=True, exist_ok=True)
    try:
        missing = [t for t in ("taskset", "redis-benchmark") if not shutil.which(t)]
        if missing:
            raise BenchError("missing: %s (util-linux, redis-tools)" % ", ".join(missing))
        if (os.cpu_count() or 1) < 2:
            raise BenchError("needs at least 2 CPUs (node on CPU %s, load on CPU %s)" % (SERVER_CPU, CLIENT_CPU))
        for port in (a.base_port, a.base_port + 10000):
            if port_in_use(port):
                raise BenchError("port %d is already in use: pick another --base-port" % port)
        bench = AofBench(sizes, a.base_port, disque_server=a.disque_server, rounds=rounds, load_jobs=jobs,
                         load_body=a.load_body, load_queues=a.queues, probe=a.probe, servers_measured=a.servers_measured,
                         tmp=Path(tempfile.mkdtemp(prefix="disque-bench-aof-", dir=scratch)))  # fmt: skip
        machine = machine_info(sys.executable)
        machine["scratch_fs"] = filesystem_of(bench.tmp)
        if a.disque_server:
            machine["disque_server"] = "%s (%s)" % (a.disque_server, _run([a.disque_server, "--version"]))
        t0 = time.monotonic()
        try:
            kinds = len(bench.kinds())
            steps = (2 * bench.rounds * len(MODES) * kinds if "throughput" in a.suites else 0) + (
                2 * len([k for k in bench.kinds() if k != "redis-server"]) if "load" in a.suites else 0)
            with progress.bar(steps, "scripts/bench aof") as bench.bar:
                if "throughput" in a.suites:
                    bench.bench_throughput()
                if "load" in a.suites:
                    bench.bench_load()
        finally:
            bench.stop_all()  # and the scratch directory
    except BenchError as exc:
        print("scripts/bench aof: error: %s" % exc, file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print("scripts/bench aof: interrupted; every process started was stopped", file=sys.stderr)
        return 130
    report = markdown_report(bench, machine)
    sys.stdout.write(report)
    default = default_results_path(machine["git_commit"])
    out = Path(a.write) if a.write else default.with_name(default.stem + "-aof.json")
    write_results(out, machine, {"quick": a.quick, "suites": a.suites, "clients": bench.clients, "body_size": bench.body_size,
                  "n_p1": sizes.n_p1, "n_p32": sizes.n_p32, "rounds": rounds, "load_jobs": jobs,
                  "load_body": a.load_body, "queues": a.queues, "probe": a.probe, "modes": MODES, "servers": bench.kinds(),
                  "server_cpu": SERVER_CPU, "client_cpu": CLIENT_CPU}, bench, report, t0)
    log("raw results: %s (%.0f s)" % (out, time.monotonic() - t0))
    return 0


if __name__ == "__main__":
    sys.exit(main())
