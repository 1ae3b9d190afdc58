"""A minimal stand-in for the task App, following the interface the scheduler relies on
(``app.client()``, ``app.periodic_tasks``, ``task.name``, ``task.send_with(dedup=..., result_ttl=0)``), so
that disque_py.tasks.periodic is tested against real nodes on its own.

It writes the documented job body (``{"v": 1, "task": ..., "args": [], "kwargs": {}, ...}``)
with two fields of ``meta`` the tests read (beside the scheduler's ``periodic_slot``): ``dedup`` (the key it was sent with) and ``nonce``
(unique per ADDJOB sent), so that two jobs made for one key would show as two bodies.

The real-process proof runs the real App in ``disque-py worker`` processes
(tests/tasks/test_periodic_process.py); this stand-in keeps the scheduler's own tests free of
the worker.
"""

from __future__ import annotations

import json
import uuid
from typing import Any

from disque_py.client import Client
from disque_py.tasks.cron import Schedule


class StandinTask:
    def __init__(self, app: "StandinApp", name: str, queue: str, replicate: int | None = None) -> None:
        self.app, self.name, self.queue, self.replicate = app, name, queue, replicate
        self.sent: list[str] = []

    def send_with(self, args=(), kwargs=None, delay=None, dedup=None, ttl=None, replicate=None, retry=None,
                  meta=None, result_ttl=None) -> str:
        meta = {**(meta or {}), "nonce": uuid.uuid4().hex}
        if dedup is not None:
            meta["dedup"] = dedup
        body = json.dumps({"v": 1, "task": self.name, "args": list(args), "kwargs": kwargs or {},
                           "result": {"ttl": result_ttl} if result_ttl else None, "meta": meta})  # fmt: skip
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
