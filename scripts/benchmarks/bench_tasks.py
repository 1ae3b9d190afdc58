"""Tasks through ``send() -> worker -> result()`` on one node, beside dramatiq on redis-server.

    scripts/bench tasks                        both, 5,000 tasks and 200 round trips each
    scripts/bench tasks --only dramatiq        one side (disque or dramatiq)
    scripts/bench tasks --tasks 20000 --concurrency 8 --repeat 3
    scripts/bench tasks --dramatiq-venv DIR    where dramatiq lives (default bench-results/dramatiq-venv)
    scripts/bench tasks --otel                 and what traces cost: disque-py's side three ways
    scripts/bench tasks --beats                and what the worker's beats cost: disque-py's side twice

``--otel`` runs disque-py's side three ways, one after the other within each of ``--repeat``'s
rounds: ``disque`` (opentelemetry-api installed, no tracer provider: traces off), ``disque-no-otel``
(its import refused, as where the ``otel`` extra is not installed) and ``disque-traced`` (the SDK's
provider in the producer and the worker, every span recorded and handed to an exporter that drops
it); the producer checks that its traces were on or off as the row says.

``--beats`` runs disque-py's side twice the same way: ``disque`` (the worker beats to the node
every 5 s, its default, and keeps its control queue: ``disque-py workers``, ``ref.status()``,
``ref.progress()`` and ``ref.cancel()`` read or use them) and ``disque-no-beats`` (the worker
started with ``--beacon-interval 0``).

Each side: a broker (one disque-py node, or redis-server with no persistence) pinned to CPU
0, one worker process with ``--concurrency`` threads and the producer pinned to CPU 1
(taskset; ``--no-pin`` to leave them free). The task is ``add(a, b)`` with its result kept
(disque-py: ``@app.task(result_ttl=300)``, waited for with ``ref.result()``; dramatiq: an
actor with ``store_results=True`` and the Results middleware on the Redis backend, waited for
with ``message.get_result(block=True)``). The producer (``benchmarks.tasks_measure``) sends
``--tasks`` tasks, then waits for every result in order and checks it; then it makes
``--latency`` sequential round trips. Reported per side (best of ``--repeat`` by tasks/s):

* tasks/s: tasks / (first send .. last result), and send()/s alone;
* round trip: median and p99 of one send() then result(), ms;
* CPU per task, microseconds: the producer's during the throughput phase, the worker's and
  the broker's over the whole run (warm-up and round trips included; dramatiq's worker is
  its process tree), divided by the tasks they handled.

dramatiq is never a dependency of disque-py: the first run creates a venv of its own under
bench-results/ and installs ``dramatiq[redis]`` from PyPI there (``pip`` must reach PyPI), or
uses ``--dramatiq-venv`` if given one that has it. Results go to bench-results/tasks-<time>.json.
The sides run in turn within each round (best of ``--repeat`` kept), so that the machine's drift
falls on each alike.
"""

from __future__ import annotations

import argparse
import functools
import importlib.util
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from disque_py.cli import launcher

from .common import proc_cpu_seconds

ROOT = Path(__file__).resolve().parents[2]
SCRIPTS = ROOT / "scripts"
BROKER_CPU, LOAD_CPU = "0", "1"


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _pin(cpu: str, argv: list[str], pin: bool) -> list[str]:
    return ["taskset", "-c", cpu, *argv] if pin and shutil.which("taskset") else argv


def tree_pids(pid: int) -> list[int]:
    """``pid`` and its descendants (from /proc/*/task/*/children)."""
    out, todo = [], [pid]
    while todo:
        p = todo.pop()
        out.append(p)
        try:
            for task in os.listdir("/proc/%d/task" % p):
                with open("/proc/%d/task/%s/children" % (p, task)) as f:
                    todo += [int(c) for c in f.read().split()]
        except OSError:
            continue
    return out


def tree_cpu(pid: int) -> float:
    return sum(proc_cpu_seconds(p) or 0.0 for p in tree_pids(pid))


def _stop(proc: subprocess.Popen, timeout: float = 15) -> None:
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            for p in reversed(tree_pids(proc.pid)):
                try:
                    os.kill(p, signal.SIGKILL)
                except OSError:
                    pass
            proc.wait()


def run_side(name: str, broker_argv: list[str], broker_port: int, worker_argv: list[str],
             producer_argv: list[str], env: dict[str, str], args: Any, scratch: Path) -> dict:  # fmt: skip
    """One run: broker, worker, producer; the producer's JSON plus the CPU figures."""
    log = open(scratch / ("%s.log" % name), "a")
    broker = subprocess.Popen(_pin(BROKER_CPU, broker_argv, args.pin), stdout=log, stderr=subprocess.STDOUT,
                              cwd=scratch, env=env)  # fmt: skip
    worker = None
    try:
        launcher.wait_ready(broker, broker_port, timeout=20)
        worker = subprocess.Popen(_pin(LOAD_CPU, worker_argv, args.pin), stdout=log, stderr=subprocess.STDOUT,
                                  cwd=SCRIPTS, env=env)  # fmt: skip
        b0, w0 = proc_cpu_seconds(broker.pid) or 0.0, tree_cpu(worker.pid)
        out = subprocess.run(_pin(LOAD_CPU, producer_argv, args.pin), capture_output=True, text=True, cwd=SCRIPTS,
                             env=env, timeout=1800)  # fmt: skip
        b1, w1 = proc_cpu_seconds(broker.pid) or 0.0, tree_cpu(worker.pid)
        if out.returncode != 0:
            raise RuntimeError("%s producer failed (%d):\n%s" % (name, out.returncode, out.stderr[-3000:]))
        res = json.loads(out.stdout.strip().splitlines()[-1])
        handled = res["tasks"] + args.latency + 1
        res["producer_cpu_us"] = res["producer_cpu_s"] / res["tasks"] * 1e6
        res["worker_cpu_us"] = (w1 - w0) / handled * 1e6
        res["broker_cpu_us"] = (b1 - b0) / handled * 1e6
        res["total_cpu_us"] = res["producer_cpu_us"] + res["worker_cpu_us"] + res["broker_cpu_us"]
        return res
    finally:
        if worker is not None:
            _stop(worker)
        _stop(broker)
        log.close()


#: refuses opentelemetry in the benchmark's processes (--otel's disque-no-otel), as where it is not installed
REFUSE_OTEL = """
import sys


class _NotInstalled:
    def find_spec(self, name, path=None, target=None):
        if name.partition(".")[0] == "opentelemetry":
            raise ModuleNotFoundError("No module named %r (refused by scripts/bench tasks)" % name, name=name)
        return None


sys.meta_path.insert(0, _NotInstalled())
"""


# -- the sides -----------------------------------------------------------------------------------
def disque_side(args: Any, scratch: Path, otel: str = "", beats: bool = True) -> dict | str:
    if importlib.util.find_spec("disque_py.tasks") is None:
        return "skipped: disque_py.tasks is not in this tree"
    try:
        from disque_py.tasks import App  # noqa: F401
    except ImportError as exc:
        return "skipped: disque_py.tasks.App cannot be imported (%s)" % exc
    port = _free_port()
    node_dir = scratch / ("node-%d" % port)
    node_dir.mkdir(parents=True, exist_ok=True)
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(SCRIPTS), str(ROOT)]),
               BENCH_DISQUE_NODES="127.0.0.1:%d" % port, BENCH_OTEL=otel)  # fmt: skip
    if otel == "off":
        refuse = scratch / "refuse-otel"
        refuse.mkdir(exist_ok=True)
        (refuse / "sitecustomize.py").write_text(REFUSE_OTEL)
        env["PYTHONPATH"] = os.pathsep.join([str(refuse), env["PYTHONPATH"]])
    elif otel and importlib.util.find_spec("opentelemetry.sdk") is None:
        return "skipped: opentelemetry-sdk is not installed (the dev extra has it)"
    broker = launcher.node_argv(port, None, "--bind", "127.0.0.1", "--dir", str(node_dir), "--loglevel", "warning")
    worker = [sys.executable, "-m", "disque_py.cli", "worker", "benchmarks.tasks_disque:app",
              "-n", "127.0.0.1:%d" % port, "-c", str(args.concurrency)]  # fmt: skip
    if not beats:
        worker += ["--beacon-interval", "0"]
    producer = [sys.executable, "-m", "benchmarks.tasks_disque", "--tasks", str(args.tasks),
                "--latency", str(args.latency)]  # fmt: skip
    return run_side("disque", broker, port, worker, producer, env, args, scratch)


def dramatiq_python(venv: Path) -> Path:
    """The python of a venv with dramatiq[redis], created on first use."""
    py = venv / "bin" / "python"
    if py.exists() and subprocess.run([str(py), "-c", "import dramatiq, redis"], capture_output=True).returncode == 0:
        return py
    print(">> installing dramatiq[redis] into %s (a venv of its own, not disque-py's)" % venv, file=sys.stderr)
    if not py.exists():
        subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
    subprocess.run([str(py), "-m", "pip", "install", "-q", "dramatiq[redis]"], check=True)
    return py


def dramatiq_side(args: Any, scratch: Path) -> dict | str:
    redis_server = shutil.which("redis-server")
    if redis_server is None:
        return "skipped: no redis-server (apt-get install redis-server)"
    try:
        py = dramatiq_python(Path(args.dramatiq_venv))
    except (subprocess.CalledProcessError, OSError) as exc:
        return "skipped: could not install dramatiq (%s); pass --dramatiq-venv DIR of a venv with dramatiq[redis]" % exc
    port = _free_port()
    url = "redis://127.0.0.1:%d/0" % port
    env = dict(os.environ, PYTHONPATH=str(SCRIPTS), BENCH_REDIS_URL=url)
    broker = [redis_server, "--port", str(port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no"]
    worker = [str(py.parent / "dramatiq"), "benchmarks.tasks_dramatiq", "--processes", "1",
              "--threads", str(args.concurrency)]  # fmt: skip
    producer = [str(py), "-m", "benchmarks.tasks_dramatiq", "--tasks", str(args.tasks), "--latency", str(args.latency)]
    return run_side("dramatiq", broker, port, worker, producer, env, args, scratch)


SIDES = {"disque": disque_side, "dramatiq": dramatiq_side}
#: --otel: disque-py's side three ways (see the module docstring)
OTEL_SIDES = {"disque": functools.partial(disque_side, otel="api"),
              "disque-no-otel": functools.partial(disque_side, otel="off"),
              "disque-traced": functools.partial(disque_side, otel="sdk")}  # fmt: skip
#: --beats: disque-py's side with the worker's beats and without
BEATS_SIDES = {"disque": disque_side, "disque-no-beats": functools.partial(disque_side, beats=False)}


def report(results: dict[str, Any]) -> str:
    lines = [
        "| | tasks/s (send -> worker -> result) | send() /s | round trip median / p99 | "
        "CPU per task: producer / worker / broker / total |",
        "|---|---:|---:|---:|---:|",
    ]
    for name, r in results.items():
        if isinstance(r, str):
            lines.append("| %s | %s | | | |" % (name, r))
            continue
        lines.append("| %s | %s | %s | %.2f / %.2f ms | %.0f / %.0f / %.0f / %.0f us |" % (
            name, "{:,.0f}".format(r["tasks_per_s"]), "{:,.0f}".format(r["send_per_s"]), r["rtt_median_ms"],
            r["rtt_p99_ms"], r["producer_cpu_us"], r["worker_cpu_us"], r["broker_cpu_us"], r["total_cpu_us"]))  # fmt: skip
    ours, theirs = results.get("disque"), results.get("dramatiq")
    if isinstance(ours, dict) and isinstance(theirs, dict):
        ratio = ours["tasks_per_s"] / theirs["tasks_per_s"]
        lines.append("")
        lines.append("disque-py / dramatiq tasks/s: %.2fx (target >= 1.0: %s); CPU per task %+.0f us"
                     % (ratio, "met" if ratio >= 1.0 else "NOT met", ours["total_cpu_us"] - theirs["total_cpu_us"]))  # fmt: skip
    for bare_name, bare_what, others in (
            ("disque-no-otel", "no opentelemetry", (("disque", "opentelemetry installed, no provider"),
                                                    ("disque-traced", "traced"))),
            ("disque-no-beats", "no beats", (("disque", "beats every 5 s"),))):  # fmt: skip
        bare = results.get(bare_name)
        if not isinstance(bare, dict):
            continue
        for name, what in others:
            r = results.get(name)
            if isinstance(r, dict):
                lines.append("%s / %s: tasks/s %.2fx; CPU per task: producer %+.0f us, worker %+.0f us, broker %+.0f us"
                             % (what, bare_what, r["tasks_per_s"] / bare["tasks_per_s"],
                                r["producer_cpu_us"] - bare["producer_cpu_us"], r["worker_cpu_us"] - bare["worker_cpu_us"],
                                r["broker_cpu_us"] - bare["broker_cpu_us"]))  # fmt: skip
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="scripts/bench tasks", description=__doc__.split("\n\n")[0])
    p.add_argument("--only", choices=sorted(SIDES), default=None, help="one side only")
    p.add_argument("--tasks", type=int, default=5000, help="tasks of the throughput phase (default 5000)")
    p.add_argument("--latency", type=int, default=200, help="sequential round trips (default 200)")
    p.add_argument("--concurrency", type=int, default=8, help="worker threads (default 8)")
    p.add_argument("--repeat", type=int, default=1, help="runs per side, the best kept (default 1)")
    p.add_argument("--dramatiq-venv", default=str(ROOT / "bench-results" / "dramatiq-venv"))
    p.add_argument("--no-pin", dest="pin", action="store_false", help="no taskset")
    p.add_argument("--write", metavar="FILE", help="JSON results (default bench-results/tasks-<time>.json)")
    p.add_argument("--otel", action="store_true", help="disque-py's side three ways: what traces cost")
    p.add_argument("--beats", action="store_true", help="disque-py's side with and without the worker's beats")
    args = p.parse_args(argv)
    if os.cpu_count() == 1:
        args.pin = False
    sides = dict(SIDES)
    if args.otel:
        sides = {**OTEL_SIDES, "dramatiq": dramatiq_side}
    elif args.beats:
        sides = {**BEATS_SIDES, "dramatiq": dramatiq_side}
    names = [n for n in sides if args.only is None or n.partition("-")[0] == args.only]
    results: dict[str, Any] = {name: None for name in names}
    stopped: set[str] = set()  # skipped or failed: not tried again
    with tempfile.TemporaryDirectory(prefix="bench-tasks-") as tmp:
        for run in range(args.repeat):  # the sides in turn within each round: the drift falls on each alike
            for name in names:
                if name in stopped:
                    continue
                print(">> %s, run %d of %d" % (name, run + 1, args.repeat), file=sys.stderr)
                try:
                    r = sides[name](args, Path(tmp))
                except (RuntimeError, launcher.LaunchError, subprocess.TimeoutExpired) as exc:
                    r = "failed: %s" % str(exc).strip().splitlines()[-1][:300]
                    print(str(exc), file=sys.stderr)
                best = results[name]
                if isinstance(r, str):
                    stopped.add(name)
                    results[name] = best if isinstance(best, dict) else r
                elif not isinstance(best, dict) or r["tasks_per_s"] > best["tasks_per_s"]:
                    results[name] = r
    text = report(results)
    print("%d tasks, %d round trips, worker concurrency %d, python %s, %d CPU(s)%s"
          % (args.tasks, args.latency, args.concurrency, sys.version.split()[0], os.cpu_count() or 0,
             ", pinned (broker CPU %s, worker and producer CPU %s)" % (BROKER_CPU, LOAD_CPU) if args.pin else ""))  # fmt: skip
    print(text)
    stamp = time.strftime("%Y%m%d-%H%M%S")
    out = Path(args.write) if args.write else ROOT / "bench-results" / ("tasks-%s.json" % stamp)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({"options": vars(args), "results": results}, indent=2))
    print("results: %s" % out, file=sys.stderr)
    return 1 if any(isinstance(r, str) and r.startswith("failed") for r in results.values()) else 0


if __name__ == "__main__":
    sys.exit(main())
