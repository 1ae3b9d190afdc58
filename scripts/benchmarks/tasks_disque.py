"""disque-py's side of ``scripts/bench tasks``: an ``add`` task of a ``disque_py.tasks.App`` and
its producer (the same measure as dramatiq's).

    worker:   disque-py worker benchmarks.tasks_disque:app -c 8
    producer: python -m benchmarks.tasks_disque --tasks 5000 --latency 200

The nodes come from ``BENCH_DISQUE_NODES``.
"""

from __future__ import annotations

import argparse
import os

from disque_py.tasks import App

app = App(nodes=os.environ.get("BENCH_DISQUE_NODES", "127.0.0.1:7711"))


@app.task(name="bench.add", queue="bench", retries=0, result_ttl=300)
def add(a, b):
    return a + b


def main() -> None:
    from .tasks_measure import measure

    p = argparse.ArgumentParser()
    p.add_argument("--tasks", type=int, default=5000)
    p.add_argument("--latency", type=int, default=200)
    args = p.parse_args()
    measure(lambda i: add.send(i, i), lambda ref, timeout: ref.result(timeout=timeout), args.tasks, args.latency)


if __name__ == "__main__":
    main()
