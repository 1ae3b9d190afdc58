"""How long a node takes from exec to its first PONG, and its memory once idle (``scripts/bench start``).

Each run starts a fresh node in an empty directory (pinned to CPU 0 like every other benchmark), and
times from just before the fork to the first ``+PONG``: a connect-retry loop with 1 ms sleeps, then
``PING``. The node is killed (SIGKILL) as soon as it answers, and the CPU it used until then (user +
system, from ``wait4``) is reported beside the wall time: on a machine that others share, the wall
time swings by 2x and the CPU far less. Reported: the median, minimum and maximum of ``--runs``
starts, for each way of starting a node, and the resident memory of one more node of that way left
idle ``--idle`` seconds after its first PONG (``VmRSS`` of ``/proc/PID/status``):

* ``cluster``: the ``disque-py`` console script with the arguments ``scripts/cluster start`` gives a
  node (its very command line, ``disque_py.cli.devcluster.node_command``: loopback, pid file, log
  file, an admin page at port + 1000): the start a user sees;
* ``script``: the console script with nothing but ``--port`` and ``--dir`` (no admin page, logs
  to stdout);
* ``module``: ``python -m disque_py.cli server`` (what the tests and the other benchmarks run);
* ``aof``: the console script with ``--appendonly yes`` on an empty directory (the AOF opened for
  appending before clients are served);
* ``disque``: Disque 1.0-rc1 itself, with ``--disque-server PATH``.

One untimed start comes first, so that the bytecode caches exist (a ``PYTHONDONTWRITEBYTECODE`` in the
environment is dropped for the node: an installed package has its caches). ``--importtime`` also
prints the modules a ``cluster`` node imports before its first PONG (``python -X importtime``),
heaviest first. The build is the one ``disque_py/_build.py`` selects (``DISQUE_PY_PURE=1``: pure Python).

    scripts/bench start                       9 runs of each way, Markdown table
    scripts/bench start --only cluster --runs 21 --importtime
    scripts/bench start --disque-server ~/disque/src/disque-server
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Callable

from disque_py.cli import devcluster, launcher

from .common import HOST, SERVER_CPU, machine_info

#: Bound on one start (a node that does not answer by then is a failure, not a figure).
START_TIMEOUT = 30.0

#: A way of starting a node: (port, its empty directory) -> the command line.
Command = Callable[[int, Path], list[str]]


def _node_env() -> dict[str, str]:
    env = dict(os.environ)
    env.pop("PYTHONDONTWRITEBYTECODE", None)
    return env


def first_pong(port: int, t0: float, proc: subprocess.Popen, timeout: float = START_TIMEOUT) -> float:
    """Seconds from ``t0`` to the first ``+PONG`` on ``port``: connect, retrying every millisecond."""
    deadline = t0 + timeout
    while time.perf_counter() < deadline:
        if proc.poll() is not None:
            raise RuntimeError("the node exited with status %s before answering" % proc.returncode)
        try:
            with socket.create_connection((HOST, port), timeout=timeout) as sock:
                sock.sendall(b"*1\r\n$4\r\nPING\r\n")
                reply = b""
                while b"\r\n" not in reply:
                    chunk = sock.recv(64)
                    if not chunk:
                        break
                    reply += chunk
                if reply.startswith(b"+PONG"):
                    return time.perf_counter() - t0
        except OSError:
            pass
        time.sleep(0.001)
    raise RuntimeError("no PONG on port %d within %.0f s" % (port, timeout))


def _stop(proc: subprocess.Popen) -> None:
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def _start(command: Command, port: int, workdir: Path, env: dict[str, str] | None,
           stderr: Any) -> tuple[subprocess.Popen, float]:  # fmt: skip
    """Start a node of ``command`` in ``workdir``; (the process, seconds to its first PONG)."""
    full = launcher.pinned(command(port, workdir), SERVER_CPU)
    t0 = time.perf_counter()
    proc = subprocess.Popen(full, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=stderr, env=env,
                            cwd=workdir)  # fmt: skip
    try:
        return proc, first_pong(port, t0, proc)
    except BaseException:
        _stop(proc)
        raise


def time_start(command: Command, port: int, *, env: dict[str, str] | None = None,
               stderr: Any = subprocess.DEVNULL) -> tuple[float, float]:  # fmt: skip
    """One start: (seconds to the first PONG, CPU seconds the node used until then).

    The node is killed (SIGKILL) the moment it answers, and its CPU read from the kernel's
    accounting of the dead process (``wait4``): a figure that a busy machine inflates far less than
    the wall time."""
    workdir = Path(tempfile.mkdtemp(prefix="bench-start-"))
    try:
        proc, wall = _start(command, port, workdir, env, stderr)
        try:
            proc.kill()
            _pid, status, usage = os.wait4(proc.pid, 0)
            proc.returncode = os.waitstatus_to_exitcode(status)
            return wall, usage.ru_utime + usage.ru_stime
        finally:
            _stop(proc)
    finally:
        shutil.rmtree(workdir, ignore_errors=True)


def rss_kb(pid: int) -> int:
    """A process's resident memory in KiB (``VmRSS`` of /proc/PID/status)."""
    for line in Path("/proc/%d/status" % pid).read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    raise RuntimeError("no VmRSS for pid %d" % pid)


def idle_rss(command: Command, port: int, idle: float, *, env: dict[str, str] | None = None) -> int:
    """The resident memory (KiB) of a node of ``command`` left idle ``idle`` seconds after its first PONG."""
    workdir = Path(tempfile.mkdtemp(prefix="bench-start-"))
    try:
        proc, _wall = _start(command, port, workdir, env, subprocess.DEVNULL)
        try:
            time.sleep(idle)
            if proc.poll() is not None:
                raise RuntimeError("the node exited with status %s while idle" % proc.returncode)
            # the node, not taskset: taskset execs it, so the pid is the node's
            return rss_kb(proc.pid)
        finally:
            _stop(proc)
    finally:
        shutil.rmtree(workdir, ignore_errors=True)


def _plain(argv: list[str], *extra: str) -> Command:
    return lambda port, workdir: [*argv, "--port", str(port), "--dir", str(workdir), *extra]


def _cluster(python: str) -> Command:
    return lambda port, workdir: devcluster.node_command(port, workdir, *devcluster.admin_args(port), python=python)


def ways(python: str, disque_server: str | None) -> dict[str, Command]:
    script = launcher.server_command(python, script=True)
    out = {
        "cluster": _cluster(python),
        "script": _plain(script),
        "module": _plain(launcher.server_command(python)),
        "aof": _plain(script, "--appendonly", "yes"),
    }
    if disque_server:
        out["disque"] = _plain([disque_server])
    return out


def importtime(python: str, port: int, top: int) -> list[tuple[int, str]]:
    """The modules a ``cluster`` node started with ``-X importtime`` imported before its first PONG,
    by cumulative µs."""
    cluster = _cluster(python)

    def command(p: int, workdir: Path) -> list[str]:
        argv = cluster(p, workdir)  # the console script (a Python file), or python -m without one
        return [python, "-X", "importtime", *(argv[1:] if argv[0] == python else argv)]

    with tempfile.TemporaryFile("w+") as err:
        time_start(command, port, env=_node_env(), stderr=err)
        err.seek(0)
        rows = []
        for line in err:
            if not line.startswith("import time:") or "cumulative" in line:
                continue
            _own, cumulative, name = line.split(":", 1)[1].split("|")
            rows.append((int(cumulative), name.rstrip()))
    rows.sort(reverse=True)
    return rows[:top]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="scripts/bench start", description=__doc__.split("\n\n")[0])
    ap.add_argument("--runs", type=int, default=9, help="starts per way (median reported; default 9)")
    ap.add_argument("--port", type=int, default=19811, help="client port of the started nodes")
    ap.add_argument("--python", default=sys.executable, help="the Python (and its disque-py script) to start")
    ap.add_argument("--only", default="", help="a subset of: cluster, script, module, aof, disque (comma-separated)")
    ap.add_argument("--idle", type=float, default=3.0, help="seconds a node idles after its first PONG before its RSS is read")
    ap.add_argument("--disque-server", default=None, help="also time Disque 1.0-rc1's disque-server")
    ap.add_argument("--importtime", action="store_true", help="also list the heaviest imports before the PONG")
    ap.add_argument("--write", default=None, help="save the raw results as JSON to this file")
    args = ap.parse_args(argv)
    if launcher.port_in_use(args.port):
        print("port %d is in use" % args.port, file=sys.stderr)
        return 1
    env = _node_env()
    chosen = ways(args.python, args.disque_server)
    if args.only:
        keep = {w.strip() for w in args.only.split(",") if w.strip()}
        chosen = {k: v for k, v in chosen.items() if k in keep}
    results: dict[str, Any] = {}
    print("| start | runs | to first PONG: median | min | max | node CPU until then: median | RSS idle %g s |" % args.idle)
    print("|---|---|---|---|---|---|---|")
    for name, command in chosen.items():
        time_start(command, args.port, env=env)  # untimed: writes the bytecode caches
        runs = [time_start(command, args.port, env=env) for _ in range(args.runs)]
        rss = idle_rss(command, args.port, args.idle, env=env)
        ms = [round(wall * 1000, 1) for wall, _cpu in runs]
        cpu = [round(c * 1000, 1) for _wall, c in runs]
        results[name] = {"argv": command(args.port, Path("DIR")), "ms": ms, "median_ms": round(statistics.median(ms), 1),
                         "cpu_ms": cpu, "median_cpu_ms": round(statistics.median(cpu), 1), "rss_idle_kb": rss}  # fmt: skip
        print("| %s | %d | %.1f ms | %.1f ms | %.1f ms | %.1f ms | %.1f MB |" % (
            name, len(ms), statistics.median(ms), min(ms), max(ms), statistics.median(cpu), rss / 1024), flush=True)  # fmt: skip
    if args.importtime:
        rows = importtime(args.python, args.port, 40)
        results["importtime"] = rows
        print("\nimports of a cluster node before its first PONG (python -X importtime, cumulative, heaviest first):")
        for us, name in rows:
            print("%8.1f ms  %s" % (us / 1000, name))
    machine = machine_info(args.python)
    print("\nmachine: %s, %s CPUs, Python %s, load average %s" % (
        machine.get("cpu_model"), machine.get("nproc"), machine.get("python"),
        " ".join("%.2f" % x for x in os.getloadavg())))  # fmt: skip
    if args.write:
        Path(args.write).write_text(json.dumps({"machine": machine, "results": results}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
