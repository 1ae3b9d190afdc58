"""What a run becomes: ACK, a retry (NACK with DELAY), or a dead letter; and which jobs must not run.

* success: ACKJOB (``fast_ack=True``: FASTACK);
* failure: ``NACK <id> DELAY <s> REASON <error>``: the job is retried by
  the cluster after ``retry_backoff.delay(attempt - 1)`` seconds
  (exponential, jittered; the node holds it meanwhile, so the other jobs
  go on), and its next delivery carries the error as
  ``last_nack_reason``. No DELAY when ``retry_backoff`` is None or the
  job has a BACKOFF of its own (the node's backoff decides). A NACK the
  node refuses (a DELAY beyond the job's TTL) is sent again plain;
* a failure on attempt ``max_attempts`` (:attr:`~disque_py.client.model.Job.attempt`), or
  a job *fetched* with an attempt above it (it failed elsewhere, or timed
  out): the dead-letter handler gets it. The default,
  :data:`~.settings.DEFAULT_DEAD_LETTER`, is ``NACK <id> DEAD REASON <error>``: the
  node dead-letters it (a new job in ``<queue>.dead`` or the job's
  DEADLETTER queue, whose SHOW names the original). A custom handler runs,
  then the job is acknowledged; if it fails the job is NACKed instead;
* a failure on the delivery the job's own MAXDELIVER makes its last:
  ``NACK <id> REASON <error>``, and the node dead-letters it;
* :class:`~.handlers.Reject` raised: dead-lettered at once, with its message as the reason.
* :class:`~.handlers.GiveBack` raised (a task this worker does not know): given back for another
  worker, ``RELEASE <id> DELAY <s>``, no attempt used; dead-lettered once given back ``limit``
  times (:attr:`~disque_py.client.model.Job.returns`).

On a node that refuses NACK's options (Disque's own), the first refusal
switches the worker back to plain NACKs and to dead letters it ADDs itself:
a JSON :class:`~disque_py.client.model.DeadLetter` in ``<queue>.dead``.

A failure is told here, once (:meth:`Outcomes.fail`): its text, its log line, its count, the
pause it may start (:mod:`.pause`) and the command that reports it.
"""

from __future__ import annotations

import logging
from collections import OrderedDict
from collections.abc import Awaitable, Callable
from typing import Any

import trio

from .. import commands as cmd
from ..model import DeadLetter, Job
from .acks import Acks
from .handlers import GiveBack, Reject, describe_error, is_async_callable, reason_of
from .pause import FailureGate
from .settings import DEFAULT_DEAD_LETTER, WorkerSettings
from .stats import Counters
from .stop import Stop
from .wakeup import Wakeup

__all__ = ["Outcomes"]

log = logging.getLogger("disque_py.worker")

#: the failures remembered (their text) for a job's dead letter, should it come back above max_attempts
LAST_ERRORS = 1000


class Outcomes:
    """Turns a handler's result into the outcome to send (see the module docstring)."""

    def __init__(self, settings: WorkerSettings, client: Any, counters: Counters, acks: Acks, gate: FailureGate,
                 stop: Stop, fetch_wake: Wakeup, spawn: Callable[[Callable[[], Awaitable[Any]]], None],
                 rng: Any) -> None:  # fmt: skip
        self.max_attempts = settings.max_attempts
        self.retry_backoff = settings.retry_backoff
        self.dead_letter_handler = settings.dead_letter
        self.dead_is_async = callable(settings.dead_letter) and is_async_callable(settings.dead_letter)
        self.client = client
        self.counters = counters
        self.acks = acks
        self.gate = gate
        self.stop = stop
        self.fetch_wake = fetch_wake
        self.spawn = spawn  # starts a task in the handlers' nursery
        self.rng = rng
        self.last_errors: OrderedDict[str, str] = OrderedDict()

    def succeeded(self, job: Job) -> None:
        """The handler returned: ACK (the common case, kept short)."""
        self.counters.processed += 1
        gate = self.gate
        if gate.failing or gate.state is not FailureGate.OPEN:
            gate.success(job.id)
        acks = self.acks
        acks.acks.append(job.id)
        acks.queued()

    async def finish(self, job: Job, error: BaseException | None) -> None:
        """After the handler: ACK, or NACK / dead-letter with the error."""
        if error is None:
            self.succeeded(job)
            return
        text = self.fail(job, error)
        if text is not None:
            await self.dead_letter(job, text, failure_counted=True)

    def failed_later(self, job: Job, error: BaseException) -> None:
        """:meth:`finish` for a failure reported from outside the handlers' tasks (a handler
        thread): a dead letter, if due, runs as a task of its own."""
        text = self.fail(job, error)
        if text is not None:
            self.spawn(lambda: self.dead_letter(job, text, failure_counted=True))

    def failed_at_cancel(self, job: Job) -> None:
        """A failure reported while the handlers are being cancelled (the grace period is over):
        no dead letter can run now, the job is NACKed plainly."""
        self.counters.failed += 1
        self.counters.retried += 1
        self.acks.nack(job)

    def fail(self, job: Job, error: BaseException) -> str | None:
        """Count a handler failure and NACK the job, or return the error text if it must be dead-lettered."""
        if type(error) is GiveBack:
            return self.given_back(job, error)
        counters = self.counters
        counters.failed += 1
        rejected = isinstance(error, Reject)
        text = reason_of(error)
        fatal = not isinstance(error, Exception)
        self.record_failure(job)
        dead = rejected or (self.max_attempts is not None and job.attempt >= self.max_attempts and not fatal)
        if rejected:
            log.warning("job %s rejected (attempt %d): %s", job.id, job.attempt, text)
        elif dead:
            log.warning("job %s failed on its last attempt (%d): %s", job.id, job.attempt, text)
        elif fatal or self.acks.legacy:
            log.warning("job %s failed (attempt %d): %s", job.id, job.attempt, text)
            self._remember_error(job.id, text)
            counters.retried += 1
            self.acks.nack(job)  # back at once
        elif job.last_delivery:  # its own MAXDELIVER: the node dead-letters it on this NACK
            log.warning("job %s failed on its last delivery (%d, MAXDELIVER): %s", job.id, job.attempt, text)
            counters.dead += 1
            self.acks.nack_with("dead", job, cmd.nack_argv([job.id], reason=text))
        else:
            delay = self.retry_delay(job)
            log.warning("job %s failed (attempt %d)%s: %s", job.id, job.attempt,
                        "" if delay is None else ", again in %.3f s" % delay, text)  # fmt: skip
            counters.retried += 1
            self.acks.nack_with("retry", job, cmd.nack_argv([job.id], delay=delay, reason=text))
        if fatal:  # KeyboardInterrupt, SystemExit...: stop gracefully, re-raise from run()
            self.stop.fatal(error)
        return text if dead else None

    def given_back(self, job: Job, error: GiveBack) -> str | None:
        """A handler gave the job back for another worker (:class:`~.handlers.GiveBack`):
        RELEASE ... DELAY, no attempt used; its text if it must be dead-lettered instead (given
        back ``limit`` times already)."""
        text = reason_of(error)
        self.gate.neutral(job.id)
        if job.returns >= error.limit:
            self.counters.failed += 1
            log.warning("job %s given back %d times: dead-lettered: %s", job.id, job.returns, text)
            return text
        self.counters.released += 1
        log.info("job %s given back (%d of %d), queued again in %.3g s: %s", job.id, job.returns + 1, error.limit,
                 error.delay, text)  # fmt: skip
        self.acks.nack_with("release", job, cmd.release(job.id, delay=error.delay).argv)
        return None

    def retry_delay(self, job: Job) -> float | None:
        """Seconds before a failed job comes back (NACK's DELAY): exponential in its attempt,
        from ``retry_backoff``; None (the node decides) without it, or when the job has a
        BACKOFF of its own."""
        if self.retry_backoff is None or job.backoff is not None:
            return None
        return round(self.retry_backoff.delay(job.attempt - 1, self.rng), 3)

    def record_failure(self, job: Job) -> None:
        """A failure counts for the consumer-wide pause."""
        delay = self.gate.failure(job.id, trio.current_time())
        if delay is not None:
            self.counters.backoffs += 1
            gate = self.gate
            log.warning("%d of the last %d jobs failed: fetching paused for %.2f s",
                        gate.failing, len(gate.recent), delay)  # fmt: skip
        self.fetch_wake.fire()

    def _remember_error(self, job_id: str, text: str) -> None:
        last = self.last_errors
        last[job_id] = text
        last.move_to_end(job_id)
        while len(last) > LAST_ERRORS:
            last.popitem(last=False)

    # ------------------------------------------------------------ jobs that must not run
    async def screen(self, job: Job) -> bool:
        """Deal with a job that must not run (stopping, too many attempts); True if it was."""
        if self.stop.stopping:
            self.stop.give_back(job)
            return True
        if self.max_attempts is not None and job.attempt > self.max_attempts:
            previous = self.last_errors.pop(job.id, None)
            reason = "attempt %d > max_attempts %d" % (job.attempt, self.max_attempts)
            self.gate.neutral(job.id)
            text = "%s; last error: %s" % (reason, previous) if previous else reason
            await self.dead_letter(job, text, failure_counted=False)
            return True
        return False

    async def dead_letter(self, job: Job, error: str, *, failure_counted: bool) -> None:
        handler = self.dead_letter_handler
        counters = self.counters
        if handler is DEFAULT_DEAD_LETTER and not self.acks.legacy:  # the cluster's dead letter
            counters.dead += 1
            self.last_errors.pop(job.id, None)
            self.acks.nack_with("dead", job, cmd.nack_argv([job.id], reason=error, dead=True))
            return
        try:
            if handler is DEFAULT_DEAD_LETTER:  # a node without NACK DEAD: a JSON DeadLetter
                await self.client.add_job(job.queue + ".dead", DeadLetter.from_job(job, error).encode())
            elif handler is None:
                log.error("job %s discarded after %d attempts: %s", job.id, job.attempt, error)
            elif self.dead_is_async:
                await handler(job, error)
            else:
                await trio.to_thread.run_sync(handler, job, error, abandon_on_cancel=True)
        except trio.Cancelled:
            self.stop.hand_back(job)
            raise
        except Exception as exc:  # noqa: BLE001 - keep the job: NACK it, it comes back later
            log.error("dead-lettering job %s failed (%s): NACKed instead", job.id, describe_error(exc))
            if not failure_counted:  # a failure to process it all the same: it counts for the backoff
                self.record_failure(job)
            counters.retried += 1
            self.acks.nack(job)
            return
        counters.dead += 1
        self.last_errors.pop(job.id, None)
        self.acks.ack(job)
