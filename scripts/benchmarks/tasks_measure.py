"""The producer's side of ``scripts/bench tasks``, the same for every task library: standard
library only, so that it runs in the separate venv where dramatiq is installed too.

``measure(send, result, tasks, latency)`` prints one JSON line: tasks/s through send() ->
worker -> result(), send() alone, the sequential round trip (median, p99) and the producer's
CPU seconds. Every result is checked (``add(i, i) == 2 * i``).
"""

from __future__ import annotations

import json
import resource
import statistics
import time
from collections.abc import Callable
from typing import Any


def _cpu() -> float:
    ru = resource.getrusage(resource.RUSAGE_SELF)
    return ru.ru_utime + ru.ru_stime


def measure(send: Callable[[int], Any], result: Callable[[Any, float], Any], tasks: int, latency: int) -> dict:
    t = time.perf_counter()
    first = result(send(0), 120.0)  # the worker is up (and warm) when this returns
    if first != 0:
        raise SystemExit("add(0, 0) answered %r" % (first,))
    ready_s = time.perf_counter() - t
    cpu0 = _cpu()
    t0 = time.perf_counter()
    handles = [send(i) for i in range(tasks)]
    t_sent = time.perf_counter()
    for i, h in enumerate(handles):
        got = result(h, 120.0)
        if got != 2 * i:
            raise SystemExit("add(%d, %d) answered %r" % (i, i, got))
    t1 = time.perf_counter()
    cpu1 = _cpu()
    rtts = []
    for i in range(latency):
        s = time.perf_counter()
        if result(send(i), 30.0) != 2 * i:
            raise SystemExit("add(%d, %d): wrong result" % (i, i))
        rtts.append(time.perf_counter() - s)
    rtts.sort()
    out = {
        "tasks": tasks,
        "tasks_per_s": tasks / (t1 - t0),
        "send_per_s": tasks / (t_sent - t0),
        "producer_cpu_s": cpu1 - cpu0,
        "rtt_median_ms": statistics.median(rtts) * 1000 if rtts else None,
        "rtt_p99_ms": rtts[min(len(rtts) - 1, int(len(rtts) * 0.99))] * 1000 if rtts else None,
        "first_result_s": ready_s,
    }
    print(json.dumps(out), flush=True)
    return out
