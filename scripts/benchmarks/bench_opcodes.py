"""Where a job's instructions go, by Python function: the opcodes each function of a real node
executes per job, counted by a ``sys.settrace`` opcode tracer, for a tree or two trees side by side.

``scripts/bench instructions`` says how many instructions a job costs; this says where, in the
interpreter's own unit: each function's executed bytecode instructions (its own, not its callees'),
per job, as (count at N2 jobs - count at N1 jobs) / (N2 - N1). C code (the parser, the encoders'
C parts, syscalls) is not seen, and the tracer slows the node some fifty times, so what runs per
second of wall time (timers, the memory measure every 10 ms) weighs more than on a real node:
use it to find what a change moved, and ``scripts/bench instructions`` to measure it.

    scripts/bench opcodes                                  the batched cycle on this checkout, top 30
    scripts/bench opcodes --load cycle-unpipelined --top 50
    scripts/bench opcodes --tree ../before --compare .     two trees: each function's count and the change

The loads are ``scripts/bench instructions``' single-node ones (bench_instructions.SPECS).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import sys
import tempfile
from collections import Counter
from pathlib import Path

from disque_py.cli import launcher

from .bench_instructions import SPECS, Conn, jobs_of

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
SINGLE_NODE = [name for name, spec in SPECS.items() if spec.nodes == 1 and spec.drain]


def trace_main() -> None:
    """``python -m benchmarks.bench_opcodes --trace OUT -- ARGS``: run ``disque_py.cli ARGS``
    with every opcode counted by function, written to OUT (JSON) when the process exits."""
    import atexit
    import runpy
    import threading

    out, args = sys.argv[2], sys.argv[4:]
    counts: Counter = Counter()

    def local(frame, event, arg):  # noqa: ARG001
        if event == "opcode":
            counts[frame.f_code] += 1
        return local

    def install(frame, event, arg):  # noqa: ARG001
        frame.f_trace_opcodes = True
        return local

    def dump() -> None:
        sys.settrace(None)
        by_name: Counter = Counter()
        for code, n in counts.items():
            by_name["%s:%s" % (code.co_filename, code.co_qualname)] += n
        Path(out).write_text(json.dumps(by_name))

    atexit.register(dump)
    sys.argv = ["disque-py", *args]
    sys.settrace(install)
    threading.settrace(install)
    runpy.run_module("disque_py.cli", run_name="__main__")


def _short(name: str) -> str:
    """A function's key without the tree it came from (so two trees compare)."""
    name = re.sub(r"^.*?/(disque_py|cluster_bus)/", r"\1/", name)
    return re.sub(r"^.*?/site-packages/", "", name)


def count(tree: Path, load: str, n: int, scratch: Path, port: int) -> Counter:
    """Opcodes by function of one node of ``tree`` serving ``load`` for ``n`` jobs."""
    d = Path(tempfile.mkdtemp(dir=scratch))
    out = d / "opcodes.json"
    argv = [sys.executable, "-m", "benchmarks.bench_opcodes", "--trace", str(out), "--",
            "server", "--port", str(port), "--dir", str(d)]  # fmt: skip
    env = dict(os.environ, PYTHONPATH="%s:%s" % (tree, HERE.parent), PYTHONHASHSEED="0")
    proc = launcher.spawn(argv, output=d / "node.log", cwd=d, env=env)
    try:
        launcher.wait_ready(proc, port, timeout=120, logs=[d / "node.log"])
        conn = Conn(port)
        try:
            SPECS[load].run(conn, n)
        finally:
            conn.close()
    finally:
        launcher.stop(proc, port=port, timeout=120)
    return Counter({_short(k): v for k, v in json.loads(out.read_text()).items()})


def per_job(tree: Path, load: str, n1: int, n2: int, scratch: Path, port: int) -> dict[str, float]:
    a = count(tree, load, n1, scratch, port)
    b = count(tree, load, n2, scratch, port)
    jobs = jobs_of(load, n2) - jobs_of(load, n1)
    return {k: (b[k] - a[k]) / jobs for k in set(a) | set(b)}


def main(argv: list[str] | None = None) -> int:
    if (argv or sys.argv[1:])[:1] == ["--trace"]:
        trace_main()
        return 0
    p = argparse.ArgumentParser(prog="scripts/bench opcodes", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)  # fmt: skip
    p.add_argument("--load", default="cycle-batched", choices=SINGLE_NODE, help="the load (default %(default)s)")
    p.add_argument("--tree", default=str(ROOT), help="source tree the node runs (default: this checkout)")
    p.add_argument("--compare", metavar="TREE", help="a second tree: both counts and the change per function")
    p.add_argument("--n1", type=int, default=440, help="jobs of the smaller run (default %(default)s)")
    p.add_argument("--n2", type=int, default=2200, help="jobs of the larger run (default %(default)s)")
    p.add_argument("--top", type=int, default=30, help="functions shown (default %(default)s)")
    p.add_argument("--base-port", type=int, default=21711, help="the node's port (default %(default)s)")
    a = p.parse_args(argv)
    if launcher.port_in_use(a.base_port):
        p.error("port %d is in use: pick another --base-port" % a.base_port)
    with tempfile.TemporaryDirectory(prefix="bench-opcodes-") as scratch:
        first = per_job(Path(a.tree).resolve(), a.load, a.n1, a.n2, Path(scratch), a.base_port)
        second = None
        if a.compare:
            second = per_job(Path(a.compare).resolve(), a.load, a.n1, a.n2, Path(scratch), a.base_port)
    print("Python opcodes per job, %s, N1=%d N2=%d; %s" % (a.load, a.n1, a.n2, a.tree))
    if second is None:
        print("total %.1f" % sum(first.values()))
        for k, v in sorted(first.items(), key=lambda kv: -kv[1])[: a.top]:
            print("%9.1f  %s" % (v, k))
        return 0
    print("against %s\ntotal %.1f -> %.1f" % (a.compare, sum(first.values()), sum(second.values())))
    keys = sorted(set(first) | set(second), key=lambda k: -abs(second.get(k, 0) - first.get(k, 0)))
    for k in keys[: a.top]:
        before, after = first.get(k, 0.0), second.get(k, 0.0)
        print("%9.1f %9.1f %+9.1f  %s" % (before, after, after - before, k))
    return 0


if __name__ == "__main__":
    sys.exit(main())
