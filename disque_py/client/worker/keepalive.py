"""A job's heartbeats (off by default): ``WORKING <id>`` while its handler runs, so that a handler
longer than the job's RETRY keeps it from being queued again.

``heartbeat=<seconds>`` sends WORKING every that many seconds; ``heartbeat=True`` starts after
one second and then uses half of the RETRY that WORKING returns. They stop with the handler, on
-NOJOB/-TOOLATE/-ACKED, or for RETRY 0 jobs. Each runs as a task in the handlers' nursery.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

import trio

from ..errors import AckedError, DisqueError, NoJobError, TooLateError
from ..model import Job

__all__ = ["Keepalive"]

log = logging.getLogger("disque_py.worker")


class Keepalive:
    """Starts a job's heartbeats (:meth:`start`); ``spawn`` starts a task in the handlers' nursery."""

    def __init__(self, client: Any, heartbeat: bool | float, spawn: Callable[..., None]) -> None:
        self.client = client
        self.heartbeat = heartbeat
        self.spawn = spawn

    def start(self, job: Job) -> trio.CancelScope:
        """Heartbeats for ``job`` until the returned scope is cancelled (none when they are off)."""
        scope = trio.CancelScope()
        if self.heartbeat:
            self.spawn(self._beat, job, scope)
        return scope

    async def _beat(self, job: Job, scope: trio.CancelScope) -> None:
        fixed = None if self.heartbeat is True else float(self.heartbeat)
        with scope:
            await trio.sleep(fixed or 1.0)
            while True:
                try:
                    retry = await self.client.working(job.id)
                except (NoJobError, TooLateError, AckedError) as exc:
                    log.info("heartbeat for %s stopped: %s", job.id, exc)
                    return
                except DisqueError as exc:
                    log.warning("WORKING %s failed: %s", job.id, exc)
                    retry = None
                if retry == 0:
                    return
                await trio.sleep(fixed or max((retry or 1) / 2.0, 0.5))
