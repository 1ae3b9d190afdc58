"""dramatiq's side of ``scripts/bench tasks``: an ``add`` actor on the Redis broker with the
Results middleware (Redis backend), and its producer. Runs only in the separate venv where
``scripts/bench tasks`` installs dramatiq (never a dependency of disque-py).

    worker:   <venv>/bin/dramatiq benchmarks.tasks_dramatiq --processes 1 --threads 8
    producer: <venv>/bin/python -m benchmarks.tasks_dramatiq --tasks 5000 --latency 200

The Redis URL comes from ``BENCH_REDIS_URL``.
"""

from __future__ import annotations

import argparse
import os

import dramatiq
from dramatiq.brokers.redis import RedisBroker
from dramatiq.results import Results
from dramatiq.results.backends import RedisBackend

URL = os.environ.get("BENCH_REDIS_URL", "redis://127.0.0.1:6379/0")
broker = RedisBroker(url=URL)
broker.add_middleware(Results(backend=RedisBackend(url=URL)))
dramatiq.set_broker(broker)


@dramatiq.actor(queue_name="bench", store_results=True, max_retries=0)
def add(a, b):
    return a + b


def main() -> None:
    from .tasks_measure import measure

    p = argparse.ArgumentParser()
    p.add_argument("--tasks", type=int, default=5000)
    p.add_argument("--latency", type=int, default=200)
    args = p.parse_args()
    measure(lambda i: add.send(i, i), lambda m, timeout: m.get_result(block=True, timeout=int(timeout * 1000)),
            args.tasks, args.latency)  # fmt: skip


if __name__ == "__main__":
    main()
