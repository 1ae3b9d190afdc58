"""A minimal stand-in for the task App, following the interface the scheduler relies on
(``app.client()``, ``app.periodic_tasks``, ``task.name``, ``task.send_with(dedup=...)``), so
that disque_py.tasks.periodic is tested against real nodes on its own.

It writes the documented job body (``{"v": 1, "task": ..., "args": [], "kwargs": {}, ...}``)
with two fields of ``meta`` the tests read: ``dedup`` (the key it was sent with) and ``nonce``
(unique per ADDJOB sent), so that two jobs made for one key would show as two bodies.

Run as a scheduler process: ``python -m tests.tasks.standin NODES --every 2 --name tick``
(stops on SIGTERM).
"""

from __future__ import annotations

import argparse
import json
import logging
import signal
import threading
import uuid
from typing import Any

from disque_py.client import Client
from disque_py.tasks import periodic
from disque_py.tasks.cron import Schedule


class StandinTask:
    def __init__(self, app: "StandinApp", name: str, queue: str, replicate: int | None = None) -> None:
        self.app, self.name, self.queue, self.replicate = app, name, queue, replicate
        self.sent: list[str] = []

    def send_with(self, args=(), kwargs=None, delay=None, dedup=None, ttl=None, replicate=None, retry=None) -> str:
        meta: dict[str, Any] = {"nonce": uuid.uuid4().hex}
        if dedup is not None:
            meta["dedup"] = dedup
        body = json.dumps({"v": 1, "task": self.name, "args": list(args), "kwargs": kwargs or {},
                           "result": None, "meta": meta})  # fmt: skip
        argv: list[Any] = ["ADDJOB", self.queue, body, 2000]
        for word, value in (("DELAY", delay), ("TTL", ttl), ("RETRY", retry), ("DEDUP", dedup),
                            ("REPLICATE", replicate or self.replicate)):  # fmt: skip
            if value is not None:
                argv += [word, value]
        job_id = self.app.client().execute(*argv)
        job_id = job_id.decode() if isinstance(job_id, bytes) else job_id
        self.sent.append(job_id)
        return job_id


class StandinApp:
    def __init__(self, nodes: str, **client_options: Any) -> None:
        self._client = Client(nodes, **client_options)
        self.tasks: dict[str, StandinTask] = {}
        self.periodic_tasks: list[tuple[StandinTask, Schedule]] = []

    def client(self) -> Client:
        return self._client

    def periodic(self, name: str, schedule: Schedule, queue: str = "default", **options: Any) -> StandinTask:
        task = StandinTask(self, name, queue, **options)
        self.tasks[name] = task
        self.periodic_tasks.append((task, schedule))
        return task


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("nodes")
    parser.add_argument("--every", type=float, default=2)
    parser.add_argument("--name", default="tick")
    parser.add_argument("--queue", default="periodic")
    parser.add_argument("--prefer", default=None, help="host:port of the node to use while it answers")
    args = parser.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(process)d %(levelname)s %(message)s")
    app = StandinApp(args.nodes, socket_timeout=2.0, connect_timeout=0.5, failover_timeout=5.0,
                     prefer=args.prefer)
    app.periodic(args.name, Schedule.every(args.every), queue=args.queue)
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    print("scheduling", flush=True)
    periodic.run_scheduler(app, stop)


if __name__ == "__main__":
    main()
