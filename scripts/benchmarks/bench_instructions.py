"""Instructions per job of a real node process, counted by callgrind: a deterministic figure that
every change to the hot path can quote (wall-clock rates on a shared 2-core machine move by 5-10 %
from run to run; this moves by far less).

    scripts/bench instructions                      every load, N1=500 and N2=3000 jobs, twice each (~20 min)
    scripts/bench instructions --quick              N1=200, N2=1000, once each (about a minute)
    scripts/bench instructions --only cycle-batched,replicate3-cycle
    scripts/bench instructions --tree ../other      run the nodes from another checkout's disque_py
    scripts/bench instructions --save-baseline      rewrite scripts/benchmarks/instructions-baseline.json
    scripts/bench instructions --check              exit 1 if a load costs more than 1 % over the baseline

Method
------
Each node is ``valgrind --tool=callgrind --callgrind-out-file=... python -m disque_py.cli server
--port P --dir D`` (started, joined and awaited with ``disque_py.cli.launcher``), with
``PYTHONPATH`` = the source tree measured (``--tree``, default this checkout) and
``PYTHONHASHSEED=0``; the python is the one running this script (the project's venv). A normal
(not instrumented) client process drives a fixed load over one connection, waiting for every
reply: fixed queue name, fixed 32-byte body, fixed order. When the load is done the client waits
until every node's ``INFO jobs`` shows ``registered_jobs:0`` (so acknowledgement and garbage
collection of the jobs are inside the count), then sends SHUTDOWN to every node; callgrind writes
its totals when the process exits, and the ``totals:`` line of each output file is read (the sum
over the nodes of the load).

A load is run with N1 and with N2 jobs; instructions per job = (total(N2) - total(N1)) / (N2 - N1),
so start-up (importing the interpreter and the node's modules, about 1.4 G instructions), the
join of a cluster and shutdown cancel out. ``--repeat`` (default 2) runs each pair again; the
figure is the mean of the repeats and the spread (max - min) / mean is printed beside it.

Loads:

* ``cycle-batched``: one node; per batch of 110 jobs: 100 ADDJOB sent as one pipeline, one
  ``GETJOB COUNT 100 FROM q``, one ``ACKJOB`` of the 100 IDs it returned, then 10 unpipelined
  ADDJOB -> GETJOB -> ACKJOB cycles (job counts are rounded down to whole batches).
* ``cycle-unpipelined``: one node; ADDJOB -> GETJOB -> ACKJOB, one command at a time.
* ``replicate3-cycle``: three nodes joined with CLUSTER MEET; ``ADDJOB q body 0 REPLICATE 3``,
  GETJOB, ACKJOB, all on the first node; instructions of the three nodes summed. It runs a tenth
  of N1 and N2 (50 and 300 by default): every job takes several bus round trips between three
  instrumented processes, about half a second each on a busy machine.
* ``addjob-aof-everysec``: one node with ``--appendonly yes --appendfsync everysec``; unpipelined
  ADDJOB only (the jobs stay queued: the wait for ``registered_jobs:0`` is skipped).
* ``cycle-batched-policy``: ``cycle-batched`` with ``BACKOFF 1 60 MAXDELIVER 5`` on every ADDJOB
  (what a job with a delivery policy costs; the issue's budget is 10 % over ``cycle-batched``).
* ``replicate3-cycle-policy`` (only with ``--only``): ``replicate3-cycle`` with the same policy,
  whose deliveries are told to the other holders (DELIVERED).

What is not per job: timers (the 100 ms cron, cluster-bus pings, the once-a-second fsync) cost
instructions in proportion to the wall time the nodes are up, and under callgrind a node runs
some 50x slower, more when the machine is busy: measured at 4-6 M instructions per second for one
idle node, about 15 unpipelined jobs' worth. Left in, they make the figure follow the machine's
load (a 3000-job run that takes 10 s instead of 5 s adds 3-8 % per job). So each pair
gets a third run: N1 jobs, then ``--idle`` seconds (default 5) of waiting before the drain. With
``up`` = wall time from every node answering PING to SHUTDOWN,

    idle rate        = (total(N1 + idle) - total(N1)) / (up(N1 + idle) - up(N1))
    instructions/job = (total(N2) - total(N1) - idle rate x (up(N2) - up(N1))) / (N2 - N1)

The uncorrected figure and the idle rate are printed beside it (and kept in the JSON), and so is a
least-squares fit of start-up + per-job x jobs + rate x up over every run of the load (``fit``).

Limits: the correction assumes the timers cost the same per second whether the node is busy or
idle, which holds only roughly (a busy event loop wakes more often). On a quiet machine the runs
are short and the correction small; on a machine loaded by other work (load average 10-15 on two
cores) a 3000-job run took 5-40 s and the spread between repeats after correction was ~1 % for
cycle-batched but up to 10 % for cycle-unpipelined and far more for replicate3-cycle, whose three
nodes spend most of their instructions on timers while they wait for each other. Run it on a
quiet machine, check the spread column, and rerun a load whose spread is over 1 %.

The table compares each load with the committed baseline (``instructions-baseline.json`` beside
this file: the commit, python and command it was measured with) and flags every load that moved
by more than ``--threshold`` % (1 by default), better or worse. The exit code is 0 (it is a
report) unless ``--check`` is given and a load got worse by more than the threshold.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import re
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Callable, Sequence

import hiredis

from disque_py.cli import launcher
from disque_py.protocol.resp import encode_request

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
BASELINE = HERE / "instructions-baseline.json"
LOADS = ("cycle-batched", "cycle-unpipelined", "replicate3-cycle", "addjob-aof-everysec", "cycle-batched-policy")
#: Loads run only when named with --only (slow, or for one question).
OPTIONAL_LOADS = ("replicate3-cycle-policy",)
#: The delivery policy the *-policy loads give every job (core/delivery.py): what a job that uses
#: it costs beside one that does not.
POLICY = ("BACKOFF", "1", "60", "MAXDELIVER", "5")
QUEUE = "instructions-q"
BODY = b"instructions-benchmark-body-0032"[:32].ljust(32, b".")
BATCH = 100
UNPIPELINED_PER_BATCH = 10
DRAIN_TIMEOUT = 120.0
START_TIMEOUT = 180.0
STOP_TIMEOUT = 180.0


# --------------------------------------------------------------------------- pure parts


_TOTALS = re.compile(rb"^(?:totals|summary):\s*(\d+)", re.MULTILINE)


def parse_totals(text: bytes | str) -> int:
    """The instruction count of a callgrind output file: its ``totals:`` line (``summary:`` in
    older files), the first number on it (Ir, the only event collected by default)."""
    data = text.encode() if isinstance(text, str) else text
    found = {m.group(0).split(b":")[0]: int(m.group(1)) for m in _TOTALS.finditer(data)}
    if b"totals" in found:
        return found[b"totals"]
    if b"summary" in found:
        return found[b"summary"]
    raise ValueError("no totals: or summary: line in the callgrind output")


def per_job(total1: int, total2: int, jobs1: int, jobs2: int, seconds1: float = 0.0, seconds2: float = 0.0,
            idle_rate: float = 0.0) -> float:
    """Instructions per job from two runs that differ only in the number of jobs (and in how long
    their nodes ran, ``seconds``: with ``idle_rate``, the instructions timers cost per second of
    that, the difference is taken off first)."""
    if jobs2 <= jobs1:
        raise ValueError("the second run needs more jobs than the first (%d <= %d)" % (jobs2, jobs1))
    return (total2 - total1 - idle_rate * (seconds2 - seconds1)) / (jobs2 - jobs1)


def idle_rate(total1: int, total_idle: int, seconds1: float, seconds_idle: float) -> float:
    """Instructions per wall second of nodes that only wait: a run with the same jobs as run 1 but
    left idle for a while longer, against run 1."""
    if seconds_idle <= seconds1:
        raise ValueError("the idle run must last longer than the run it is compared with")
    return (total_idle - total1) / (seconds_idle - seconds1)


def fit(runs: Sequence[tuple[int, float, int]]) -> tuple[float, float, float]:
    """Least squares of total = start-up + per-job x jobs + rate x seconds up over every run of a load
    (``(jobs, seconds, total)``); returns (start-up, per-job, rate). With the three runs of one
    repeat it is the per-pair figure; over several repeats it uses every run at once."""
    rows = [(1.0, float(n), float(w)) for n, w, _ in runs]
    ys = [float(t) for _, _, t in runs]
    m = [[sum(r[i] * r[j] for r in rows) for j in range(3)] + [sum(r[i] * y for r, y in zip(rows, ys))] for i in range(3)]
    for col in range(3):  # Gauss-Jordan with partial pivoting on the normal equations
        piv = max(range(col, 3), key=lambda r: abs(m[r][col]))
        if abs(m[piv][col]) < 1e-12:
            raise ValueError("the runs do not tell jobs from seconds apart")
        m[col], m[piv] = m[piv], m[col]
        for r in range(3):
            if r != col:
                f = m[r][col] / m[col][col]
                m[r] = [a - f * b for a, b in zip(m[r], m[col])]
    a, b, c = (m[i][3] / m[i][i] for i in range(3))
    return a, b, c


def spread(values: Sequence[float]) -> float:
    """(max - min) / mean, as a fraction; 0 for fewer than two values."""
    if len(values) < 2:
        return 0.0
    mean = sum(values) / len(values)
    return (max(values) - min(values)) / mean if mean else 0.0


@dataclass
class Row:
    load: str
    value: float | None  # instructions per job; None: not measured (n/a)
    baseline: float | None
    change: float | None  # percent, + is more instructions (worse)
    flag: str  # "", "WORSE", "BETTER"


def compare(results: dict[str, float | None], baseline: dict[str, float | None], threshold: float = 1.0) -> list[Row]:
    """One row per measured load: its change against the baseline in percent, flagged WORSE or
    BETTER when it moved by more than ``threshold`` percent."""
    rows = []
    for load, value in results.items():
        base = baseline.get(load)
        change = None if value is None or not base else (value - base) / base * 100.0
        flag = ""
        if change is not None and abs(change) > threshold:
            flag = "WORSE" if change > 0 else "BETTER"
        rows.append(Row(load, value, base, change, flag))
    return rows


def jobs_of(load: str, n: int) -> int:
    """The number of jobs a load really runs when asked for ``n`` (cycle-batched: whole batches;
    replicate3-cycle: a tenth, as each job costs three nodes several bus round trips, each
    slow under callgrind)."""
    if load.startswith("cycle-batched"):
        per = BATCH + UNPIPELINED_PER_BATCH
        return max(1, n // per) * per
    if load.startswith("replicate3-cycle"):
        return max(1, n // 10)
    return n


def markdown(rows: list[Row], spreads: dict[str, float], threshold: float,
             extra: dict[str, str] | None = None, extra_head: str = "") -> str:
    extra = extra or {}
    out = [
        "| load | instructions/job | spread | baseline | change | |" + (" %s |" % extra_head if extra_head else ""),
        "|---|---:|---:|---:|---:|---|" + ("---:|" if extra_head else ""),
    ]
    for r in rows:
        value = "n/a" if r.value is None else "{:,.0f}".format(r.value)
        base = "–" if r.baseline is None else "{:,.0f}".format(r.baseline)
        change = "–" if r.change is None else "%+.2f %%" % r.change
        sp = "–" if r.load not in spreads else "%.2f %%" % (spreads[r.load] * 100)
        flag = "**%s** (> %g %%)" % (r.flag, threshold) if r.flag else ""
        more = (" %s |" % extra.get(r.load, "–")) if extra_head else ""
        out.append("| %s | %s | %s | %s | %s | %s |%s" % (r.load, value, sp, base, change, flag, more))
    return "\n".join(out)


# --------------------------------------------------------------------------- client


class Conn:
    """One blocking connection that waits for every reply (error replies raise)."""

    def __init__(self, port: int) -> None:
        self.sock = socket.create_connection((launcher.HOST, port), timeout=120)
        self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.reader = hiredis.Reader()

    def _reply(self) -> object:
        while True:
            reply = self.reader.gets()
            if reply is not False:
                if isinstance(reply, hiredis.ReplyError):
                    raise launcher.ReplyError(str(reply))
                return reply
            data = self.sock.recv(1 << 16)
            if not data:
                raise ConnectionError("the node closed the connection")
            self.reader.feed(data)

    def call(self, *args: str | bytes | int) -> object:
        self.sock.sendall(encode_request(args))
        return self._reply()

    def pipeline(self, commands: list[Sequence[str | bytes | int]]) -> list[object]:
        self.sock.sendall(b"".join(encode_request(c) for c in commands))
        return [self._reply() for _ in commands]

    def close(self) -> None:
        self.sock.close()


def _cycle(c: Conn, replicate: int | None = None, opts: tuple = ()) -> None:
    extra = ("REPLICATE", replicate) if replicate else ()
    jid = c.call("ADDJOB", QUEUE, BODY, 0, *extra, *opts)
    got = c.call("GETJOB", "FROM", QUEUE)
    if not got or got[0][1] != jid:
        raise RuntimeError("GETJOB returned %r, not the job just added (%r)" % (got, jid))
    c.call("ACKJOB", jid)


def load_cycle_batched(c: Conn, n: int, opts: tuple = ()) -> None:
    for _ in range(jobs_of("cycle-batched", n) // (BATCH + UNPIPELINED_PER_BATCH)):
        c.pipeline([("ADDJOB", QUEUE, BODY, 0, *opts)] * BATCH)
        got = c.call("GETJOB", "COUNT", BATCH, "FROM", QUEUE)
        if len(got) != BATCH:
            raise RuntimeError("GETJOB COUNT %d returned %d jobs" % (BATCH, len(got)))
        c.call("ACKJOB", *[job[1] for job in got])
        for _ in range(UNPIPELINED_PER_BATCH):
            _cycle(c, None, opts)


def load_cycle_batched_policy(c: Conn, n: int) -> None:
    load_cycle_batched(c, n, POLICY)


def load_replicate3_policy(c: Conn, n: int) -> None:
    for _ in range(jobs_of("replicate3-cycle", n)):
        _cycle(c, 3, POLICY)


def load_cycle_unpipelined(c: Conn, n: int) -> None:
    for _ in range(n):
        _cycle(c)


def load_replicate3(c: Conn, n: int) -> None:
    for _ in range(jobs_of("replicate3-cycle", n)):
        _cycle(c, replicate=3)


def load_addjob(c: Conn, n: int) -> None:
    for _ in range(n):
        c.call("ADDJOB", QUEUE, BODY, 0)


@dataclass(frozen=True)
class LoadSpec:
    nodes: int
    run: Callable[[Conn, int], None]
    directives: tuple[str, ...] = ()
    drain: bool = True  # wait for registered_jobs:0 on every node before SHUTDOWN


SPECS = {
    "cycle-batched": LoadSpec(1, load_cycle_batched),
    "cycle-unpipelined": LoadSpec(1, load_cycle_unpipelined),
    "replicate3-cycle": LoadSpec(3, load_replicate3),
    "addjob-aof-everysec": LoadSpec(1, load_addjob, ("--appendonly", "yes", "--appendfsync", "everysec"), drain=False),
    "cycle-batched-policy": LoadSpec(1, load_cycle_batched_policy),
    "replicate3-cycle-policy": LoadSpec(3, load_replicate3_policy),
}


# --------------------------------------------------------------------------- runs


class NotSupported(RuntimeError):
    """The tree measured does not run this load (a node refused its directives)."""


@dataclass
class Run:
    load: str
    jobs: int
    total: int  # instructions, summed over the nodes
    seconds: float  # wall time from the first spawn to the last exit
    load_seconds: float
    window: float  # wall time from every node answering PING to SHUTDOWN: when its timers run
    per_node: list[int] = field(default_factory=list)


def _registered_jobs(port: int) -> int:
    text = launcher.call(port, "INFO", "jobs", timeout=30)
    text = text.decode() if isinstance(text, bytes) else str(text)
    for line in text.splitlines():
        if line.startswith("registered_jobs:"):
            return int(line.split(":", 1)[1])
    raise RuntimeError("INFO jobs has no registered_jobs line")


def _wait_drained(ports: list[int], timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while True:
        counts = [_registered_jobs(p) for p in ports]
        if not any(counts):
            return
        if time.monotonic() > deadline:
            raise RuntimeError("jobs still registered after %.0f s: %s" % (timeout, counts))
        time.sleep(0.2)


class Harness:
    def __init__(self, tree: Path, python: str, scratch: Path, base_port: int, verbose: bool = True) -> None:
        self.tree, self.python, self.scratch, self.base_port, self.verbose = tree, python, scratch, base_port, verbose
        self.count = 0

    def log(self, msg: str) -> None:
        if self.verbose:
            print(msg, file=sys.stderr, flush=True)

    def _start(self, k: int, where: Path, directives: Sequence[str]) -> tuple[subprocess.Popen, int, Path]:
        port = self.base_port + k
        if launcher.port_in_use(port) or launcher.port_in_use(port + 10000):
            raise RuntimeError("port %d (or its bus port %d) is in use: pick another --base-port" % (port, port + 10000))
        d = where / ("node%d" % k)
        d.mkdir(parents=True)
        out = d / "callgrind.out"
        argv = ["valgrind", "--tool=callgrind", "--callgrind-out-file=%s" % out]
        argv += launcher.node_argv(port, d, *directives, python=self.python)
        env = dict(os.environ, PYTHONPATH=str(self.tree), PYTHONHASHSEED="0")
        proc = launcher.spawn(argv, output=d / "node.log", cwd=d, env=env)
        return proc, port, d

    def run(self, load: str, n: int, *, idle: float = 0.0) -> Run:
        """One run: start the load's nodes under callgrind, drive ``n`` jobs, then sit idle ``idle``
        seconds, drain, SHUTDOWN, read the totals."""
        spec = SPECS[load]
        self.count += 1
        where = self.scratch / ("%02d-%s-%d" % (self.count, load, n))
        started = time.monotonic()
        nodes = []
        try:
            for k in range(spec.nodes):
                nodes.append(self._start(k, where, spec.directives))
            for proc, port, d in nodes:
                try:
                    launcher.wait_ready(proc, port, timeout=START_TIMEOUT, logs=[d / "node.log"])
                except launcher.LaunchError as exc:
                    if spec.directives and proc.poll() is not None:
                        raise NotSupported("the node refused %s: %s" % (" ".join(spec.directives), exc)) from exc
                    raise
            ports = [port for _, port, _ in nodes]
            ready = time.monotonic()
            if len(ports) > 1:
                launcher.join([(launcher.HOST, p) for p in ports], timeout=START_TIMEOUT)
            load_started = time.monotonic()
            c = Conn(ports[0])
            try:
                spec.run(c, n)
                if idle:
                    time.sleep(idle)
            finally:
                c.close()
            load_seconds = time.monotonic() - load_started
            if spec.drain:
                _wait_drained(ports, DRAIN_TIMEOUT)
            window = time.monotonic() - ready
            for _, port, _ in nodes:
                launcher.shutdown(port, timeout=30)
            for proc, port, d in nodes:
                if not launcher.wait_exit(proc, STOP_TIMEOUT):
                    raise RuntimeError("node on port %d did not exit after SHUTDOWN:\n%s" % (port, launcher.tail([d / "node.log"])))
                if proc.returncode != 0:
                    raise RuntimeError("node on port %d exited with %s:\n%s" % (port, proc.returncode, launcher.tail([d / "node.log"])))
        except BaseException:
            for _, port, d in nodes:
                self.log("node on port %d, the end of its log:\n%s" % (port, launcher.tail([d / "node.log"])))
            raise
        finally:
            for proc, port, _ in nodes:
                if proc.poll() is None:
                    launcher.stop(proc, timeout=10)
        totals = [parse_totals((d / "callgrind.out").read_bytes()) for _, _, d in nodes]
        run = Run(load, jobs_of(load, n), sum(totals), time.monotonic() - started, load_seconds, window, totals)
        self.log("  %-20s %5d jobs%s  %15s instructions  %5.1f s (load %.1f s, nodes up %.1f s)"
                 % (load, run.jobs, " + idle %gs" % idle if idle else "", "{:,}".format(run.total), run.seconds,
                    load_seconds, window))  # fmt: skip
        return run


# --------------------------------------------------------------------------- command line


def _git(tree: Path, *args: str) -> str:
    try:
        return subprocess.run(["git", "-C", str(tree), *args], capture_output=True, text=True, check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "unknown"


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        prog="scripts/bench instructions",
        description=__doc__.split("\n\n", 1)[0],
        epilog=__doc__.split("\n\n", 1)[1],
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--only", default=",".join(LOADS), help="comma-separated loads (default: all of %s; also: %s)" % (", ".join(LOADS), ", ".join(OPTIONAL_LOADS)))
    p.add_argument("--n1", type=int, default=None, help="jobs of the smaller run (default 500; --quick 200)")
    p.add_argument("--n2", type=int, default=None, help="jobs of the larger run (default 3000; --quick 1000)")
    p.add_argument("--repeat", type=int, default=None, help="pairs of runs per load (default 2; --quick 1)")
    p.add_argument("--quick", action="store_true", help="smaller runs, once each: a smoke run, not a baseline")
    p.add_argument("--idle", type=float, default=5.0, help="seconds of the idle-cost run (0: skip it; default 5)")
    p.add_argument("--tree", default=str(ROOT), help="source tree whose disque_py the nodes run (default: this checkout)")
    p.add_argument("--python", default=sys.executable, help="python that runs the nodes (default: this one)")
    p.add_argument("--base-port", type=int, default=21611, help="client port of the first node (default 21611; bus ports +10000)")
    p.add_argument("--scratch", default=None, help="directory for node dirs and callgrind files (default: a temp dir, removed)")
    p.add_argument("--keep", action="store_true", help="keep the scratch directory (callgrind files for callgrind_annotate)")
    p.add_argument("--baseline", default=str(BASELINE), help="baseline JSON to compare with (default: %(default)s)")
    p.add_argument("--save-baseline", action="store_true", help="write the results as the new baseline")
    p.add_argument("--threshold", type=float, default=1.0, help="percent a load may move before it is flagged (default 1)")
    p.add_argument("--check", action="store_true", help="exit 1 if a load is worse than the baseline by > --threshold")
    p.add_argument("--json", metavar="FILE", help="write the raw results (every run) to FILE")
    a = p.parse_args(argv)
    a.loads = [x.strip() for x in a.only.split(",") if x.strip()]
    for load in a.loads:
        if load not in SPECS:
            p.error("--only: unknown load %r (known: %s)" % (load, ", ".join(LOADS)))
    a.n1 = a.n1 if a.n1 is not None else (200 if a.quick else 500)
    a.n2 = a.n2 if a.n2 is not None else (1000 if a.quick else 3000)
    a.repeat = a.repeat if a.repeat is not None else (1 if a.quick else 2)
    if a.n1 < 1 or a.n2 <= a.n1:
        p.error("need 1 <= --n1 < --n2")
    if a.repeat < 1:
        p.error("--repeat must be at least 1")
    tree = Path(a.tree) / "disque_py"
    if not ((tree / "cli" / "__init__.py").is_file() or (tree / "cli.py").is_file()):  # older trees: cli.py
        p.error("--tree: %s has no disque_py/cli/__init__.py" % a.tree)
    if shutil.which("valgrind") is None:
        p.error("valgrind is not installed (apt-get install valgrind)")
    return a


def main(argv: list[str] | None = None) -> int:
    a = parse_args(argv)
    tree = Path(a.tree).resolve()
    commit = _git(tree, "rev-parse", "--short", "HEAD")
    code_commit = _git(tree, "log", "-1", "--format=%h", "--", "disque_py", "cluster_bus")  # the node's code last changed
    status = _git(tree, "status", "--porcelain", "--untracked-files=no", "--", "disque_py", "cluster_bus")
    dirty = status not in ("", "unknown")
    command = "scripts/bench instructions " + " ".join(argv if argv is not None else sys.argv[1:])
    pyver = subprocess.run([a.python, "-c", "import platform; print(platform.python_version())"],
                           capture_output=True, text=True).stdout.strip()  # fmt: skip
    scratch = Path(a.scratch) if a.scratch else Path(tempfile.mkdtemp(prefix="bench-instructions-"))
    scratch.mkdir(parents=True, exist_ok=True)
    h = Harness(tree, a.python, scratch, a.base_port)
    h.log("tree %s at %s%s, python %s, N1=%d N2=%d, %d repeat(s); scratch %s"
          % (tree, commit, " (modified)" if dirty else "", pyver, a.n1, a.n2, a.repeat, scratch))  # fmt: skip
    started = time.monotonic()
    raw: dict = {"commit": commit, "code_commit": code_commit, "dirty": dirty, "tree": str(tree), "python": pyver, "command": command,
                 "n1": a.n1, "n2": a.n2, "repeat": a.repeat, "idle": a.idle, "runs": [], "loads": {}, "spread": {}, "raw": {}, "raw_spread": {},
                 "idle_rate": {}, "repeats": {}}  # fmt: skip
    results: dict[str, float | None] = {}
    spreads: dict[str, float] = {}
    try:
        for load in a.loads:
            values, raws, rates = [], [], []
            try:
                for _ in range(a.repeat):
                    r1, r2 = h.run(load, a.n1), h.run(load, a.n2)
                    r3 = h.run(load, a.n1, idle=a.idle) if a.idle > 0 else None
                    raw["runs"] += [asdict(r) for r in (r1, r2, r3) if r is not None]
                    rate = idle_rate(r1.total, r3.total, r1.window, r3.window) if r3 is not None else 0.0
                    rates.append(rate)
                    raws.append(per_job(r1.total, r2.total, r1.jobs, r2.jobs))
                    values.append(per_job(r1.total, r2.total, r1.jobs, r2.jobs, r1.window, r2.window, rate))
            except NotSupported as exc:
                h.log("  %s: n/a (%s)" % (load, str(exc).splitlines()[0]))
                results[load] = None
                continue
            results[load] = sum(values) / len(values)
            spreads[load] = spread(values)
            raw["spread"][load] = spreads[load]
            raw["raw"][load] = sum(raws) / len(raws)
            raw["raw_spread"][load] = spread(raws)
            raw["idle_rate"][load] = sum(rates) / len(rates)
            raw["repeats"][load] = {"corrected": values, "raw": raws, "idle_rate": rates}
            if a.idle > 0:
                runs = [(r["jobs"], r["window"], r["total"]) for r in raw["runs"] if r["load"] == load]
                raw.setdefault("fit", {})[load] = fit(runs)[1]
    finally:
        if not a.keep and not a.scratch:
            shutil.rmtree(scratch, ignore_errors=True)
    raw["loads"] = results
    raw["seconds"] = time.monotonic() - started

    baseline: dict = {}
    if Path(a.baseline).is_file():
        baseline = json.loads(Path(a.baseline).read_text())
    rows = compare(results, baseline.get("loads", {}), a.threshold)
    print()
    print("Instructions per job (callgrind), tree at %s, python %s, N1=%d N2=%d, %d repeat(s), %.0f s"
          % (commit, pyver, a.n1, a.n2, a.repeat, raw["seconds"]))  # fmt: skip
    if baseline:
        print("Baseline: %s at %s (python %s): %s" % (Path(a.baseline).name, baseline.get("commit"),
                                                      baseline.get("python"), baseline.get("command")))  # fmt: skip
    print()
    extra = {k: "{:,.0f} ({:.2f} %) / {:,.1f} M / {:,.0f}".format(raw["raw"][k], raw["raw_spread"][k] * 100,
                                                                 raw["idle_rate"][k] / 1e6, raw.get("fit", {}).get(k, 0))
             for k in raw["raw"]}  # fmt: skip
    print(markdown(rows, spreads, a.threshold, extra,
                   "uncorrected/job (spread) / idle instr. per s / least-squares over all runs"))
    print()
    print("instructions/job: (total(N2) - total(N1) - idle rate x (time up(N2) - time up(N1))) / (N2 - N1); the idle rate")
    print("(timers: cron, bus pings, fsync) is measured per load by a third run of N1 jobs left idle %g s longer." % a.idle)
    if a.json:
        Path(a.json).write_text(json.dumps(raw, indent=2) + "\n")
    if a.save_baseline:
        keep = {k: raw[k] for k in ("commit", "code_commit", "dirty", "python", "command", "n1", "n2", "repeat", "idle", "loads",
                                    "spread", "raw", "raw_spread", "idle_rate", "fit")
                if k in raw}  # fmt: skip
        keep["platform"] = platform.machine()
        Path(a.baseline).write_text(json.dumps(keep, indent=2) + "\n")
        print("\nBaseline written to %s" % a.baseline)
    if a.check and any(r.flag == "WORSE" for r in rows):
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
