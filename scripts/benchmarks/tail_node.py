"""A disque-py node whose periodic work is timed, slice by slice (``scripts/bench tail``'s node A).

    python -m benchmarks.tail_node --port 7711 --dir D ...     (the arguments of ``disque-py server``)

Before the node is built, the classes of the shell that run the periodic work are wrapped (the node
itself is not changed: a node started the usual way runs none of this):

* ``core-tick``: ``CoreTimers._tick``, the core's due timers (``Node.tick``: requeues, expiries, ack
  GC, replication retries) and what they produced carried out;
* ``periodic:<step>``: every step added with ``CoreTimers.every_period`` (``Cron.step``, the cluster
  service's ``ClusterService.tick``: the membership's walk, pings, failure detection);
* inside the cron's step, each part on its own: ``check-clients`` (output limits, idle timeouts),
  ``memory`` (``Dispatcher.measure_memory``), ``gc-full`` (``GcPolicy.maybe_full``);
* ``gc-gen0/1/2``: every collection of CPython's collector (``gc.callbacks``).

SIGUSR1 writes what was recorded since the previous SIGUSR1 to the JSON file named by
``TAIL_SLICES_OUT`` (written whole, then renamed over) and starts afresh: the benchmark sends one when
its load starts, one when it ends. Per kind: n, p50, p99, max (µs) and how many took over 100 µs.
"""

from __future__ import annotations

import gc
import json
import os
import signal
import sys
from time import perf_counter_ns
from typing import Any, Callable

#: A slice over this long holds a job that arrives meanwhile past the issue's line (µs).
LINE_US = 100.0

_rec: dict[str, list[float]] = {}


def note(kind: str, start_ns: int) -> None:
    _rec.setdefault(kind, []).append((perf_counter_ns() - start_ns) / 1000.0)


def timed(kind: str, fn: Callable[..., Any]) -> Callable[..., Any]:
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        start = perf_counter_ns()
        try:
            return fn(*args, **kwargs)
        finally:
            note(kind, start)

    return wrapper


def summary(rec: dict[str, list[float]]) -> dict[str, dict[str, float]]:
    out = {}
    for kind, values in rec.items():
        values = sorted(values)
        n = len(values)
        out[kind] = {"n": n, "p50": round(values[n // 2], 1), "p99": round(values[min(n - 1, int(n * 0.99))], 1),
                     "max": round(values[-1], 1), "over_line": sum(1 for v in values if v > LINE_US),
                     "total_ms": round(sum(values) / 1000.0, 2)}  # fmt: skip
    return out


def dump(signum: int, frame: object) -> None:
    global _rec
    rec, _rec = _rec, {}
    path = os.environ["TAIL_SLICES_OUT"]
    with open(path + ".tmp", "w") as f:
        json.dump(summary(rec), f)
    os.replace(path + ".tmp", path)


def instrument() -> None:
    from disque_py.server import clients, dispatch, gcpolicy, timers

    timers.CoreTimers._tick = timed("core-tick", timers.CoreTimers._tick)
    every_period = timers.CoreTimers.every_period

    def every_period_timed(self: Any, step: Callable[[], int | None]) -> None:
        name = getattr(step, "__qualname__", None) or type(step).__name__
        every_period(self, timed("periodic:" + name, step))

    timers.CoreTimers.every_period = every_period_timed
    clients.ClientLoop.check_clients = timed("check-clients", clients.ClientLoop.check_clients)
    dispatch.Dispatcher.measure_memory = timed("memory", dispatch.Dispatcher.measure_memory)
    gcpolicy.GcPolicy.maybe_full = timed("gc-full", gcpolicy.GcPolicy.maybe_full)
    started = [0]

    def on_gc(phase: str, info: dict[str, int]) -> None:
        if phase == "start":
            started[0] = perf_counter_ns()
        elif started[0]:
            note("gc-gen%d" % info["generation"], started[0])

    gc.callbacks.append(on_gc)
    signal.signal(signal.SIGUSR1, dump)


def main() -> None:
    instrument()
    from disque_py.cli.server import serve

    serve(sys.argv[1:])


if __name__ == "__main__":
    main()
