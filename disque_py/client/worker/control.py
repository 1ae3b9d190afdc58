"""The worker's control queue: notices for this worker alone (a job to cancel), within a second.

A worker whose settings name an ``on_cancel`` (the task runner's) keeps one blocking GETJOB on
``@control:<worker id>`` (:func:`control_queue`; the ``@`` prefix marks the cluster's own
queues, left out of QSCAN and ``top`` unless asked for) on a connection of its own, to the node
its client uses, which is the node its beats go to (:mod:`.beacon`): whoever wants this worker
to stop a job reads that node in ``WORKER LIST`` and ADDs a notice there (:func:`cancel_notice`,
``{"cancel": "<job ID>"}``). The GETJOB returns at once, so the worker learns within a round
trip; nothing is polled per job, and an idle worker's control queue costs one blocked client
on its node. Each notice is FASTACKed when read and handed to ``on_cancel(job_id)`` in the trio
thread; one that cannot be read is dropped (logged at debug). Without ``on_cancel`` nothing of
this runs.

A notice ADDed while the worker's client moves to another node waits in the old node's queue
until its TTL ends (:data:`NOTICE_TTL`): the sender (:mod:`disque_py.tasks.control`) also ACKs
the job cluster-wide, so a job missed here is at least never retried.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable
from typing import Any

import trio

from ..errors import DisqueError, ServerError

__all__ = ["Control", "CONTROL_PREFIX", "control_queue", "cancel_notice", "read_notice", "NOTICE_TTL"]

log = logging.getLogger("disque_py.worker")

#: The control queue of worker ``<id>`` is ``@control:<id>``.
CONTROL_PREFIX = "@control:"
#: Seconds a notice waits for its worker (ADDJOB's TTL): a worker gone meanwhile never reads it.
NOTICE_TTL = 60
#: Seconds one GETJOB of the control queue blocks before it is sent again.
BLOCK_S = 5.0
#: Seconds before the next GETJOB after one failed (no node, a refused command).
FAILED_PAUSE_S = 1.0
#: Notices taken at once.
BATCH = 64


def control_queue(worker_id: str) -> str:
    """The control queue of the worker ``worker_id``."""
    return CONTROL_PREFIX + worker_id


def cancel_notice(job_id: str) -> bytes:
    """A notice's body: stop the job ``job_id`` (if this worker runs it)."""
    return json.dumps({"cancel": job_id}, separators=(",", ":")).encode()


def read_notice(body: Any) -> str | None:
    """The job ID a notice's body asks to cancel, or None (not a notice of this version)."""
    try:
        notice = json.loads(body)
    except (TypeError, ValueError, RecursionError):
        return None
    job_id = notice.get("cancel") if isinstance(notice, dict) else None
    return job_id if isinstance(job_id, str) and 0 < len(job_id) <= 64 else None


class Control:
    """One worker's reader of its control queue (see the module docstring)."""

    def __init__(self, client: Any, worker_id: str, on_cancel: Callable[[str], Any]) -> None:
        self.client = client
        self.queue = control_queue(worker_id)
        self.on_cancel = on_cancel
        self.notices = 0  # notices read
        self._failing = False

    async def run(self) -> None:
        """Read notices until cancelled."""
        while True:
            try:
                jobs = await self.client.get_jobs(self.queue, count=BATCH, timeout_ms=int(BLOCK_S * 1000))
            except ServerError as exc:
                if exc.code == "NOPERM" or "unknown command" in str(exc).lower():
                    log.info("worker control queue %s: refused (%s); cancel notices are not read", self.queue, exc)
                    return
                self._failed(exc)
                await trio.sleep(FAILED_PAUSE_S)
                continue
            except DisqueError as exc:
                self._failed(exc)
                await trio.sleep(FAILED_PAUSE_S)
                continue
            self._failing = False
            if not jobs:
                continue
            try:
                await self.client.fast_ack(*[job.id for job in jobs])
            except DisqueError as exc:  # the notice's TTL ends it anyway
                log.debug("worker control queue %s: FASTACK failed: %s", self.queue, exc)
            for job in jobs:
                job_id = read_notice(job.body)
                if job_id is None:
                    log.debug("worker control queue %s: a notice not understood dropped: %r", self.queue, job.body[:100])
                    continue
                self.notices += 1
                try:
                    self.on_cancel(job_id)
                except Exception as exc:  # noqa: BLE001 - one notice must not end the reader
                    log.warning("worker control queue %s: on_cancel(%s) failed: %s", self.queue, job_id, exc)

    def _failed(self, exc: BaseException) -> None:
        if not self._failing:
            self._failing = True
            log.debug("worker control queue %s: GETJOB failed (%s); trying again", self.queue, exc)
