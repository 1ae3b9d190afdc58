"""What a run becomes: ACK, a retry (NACK with DELAY), or a dead letter; and which jobs must not run.

* success: ACKJOB (``fast_ack=True``: FASTACK);
* failure: ``NACK <id> DELAY <s> REASON <error> TRACE <traceback>``: the job is retried by
  the cluster after ``retry_backoff.delay(attempt - 1)`` seconds
  (exponential, jittered; the node holds it meanwhile, so the other jobs
  go on), and its next delivery carries the error as
  ``last_nack_reason``. No DELAY when ``retry_backoff`` is None or the
  job has a BACKOFF of its own (the node's backoff decides). The traceback
  (:func:`~.handlers.trace_of`, its tail at most 16 KiB) is the job's
  ``last-failure-trace`` in SHOW, and its dead letter's. A NACK the
  node refuses (a DELAY beyond the job's TTL) is sent again plain;
* a failure on attempt ``max_attempts`` (:attr:`~disque_py.client.model.Job.attempt`), or
  a job *fetched* with an attempt above it (it failed elsewhere, or timed
  out): the dead-letter handler gets it. The default,
  :data:`~.settings.DEFAULT_DEAD_LETTER`, is ``NACK <id> DEAD REASON <error> TRACE <traceback>``: the
  node dead-letters it (a new job in ``<queue>.dead`` or the job's
  DEADLETTER queue, whose SHOW names the original). A custom handler runs,
  then the job is acknowledged; if it fails the job is NACKed instead;
* a failure on the delivery the job's own MAXDELIVER makes its last:
  ``NACK <id> REASON <error> TRACE <traceback>``, and the node dead-letters it;
* :class:`~.handlers.Reject` raised: dead-lettered at once, with its message as the reason.
* :class:`~.handlers.GiveBack` raised (a task this worker does not know): given back for another
  worker, ``RELEASE <id> DELAY <s>``, no attempt used; dead-lettered once given back ``limit``
  times (:attr:`~disque_py.client.model.Job.returns`).

On a node that refuses NACK's options (Disque's own), the first refusal
switches the worker back to plain NACKs and to dead letters it ADDs itself:
a JSON :class:`~disque_py.client.model.DeadLetter` in ``<queue>.dead`` (with the traceback).
A node that knows NACK's options but not TRACE (an older disque-py) gets them without it
(:mod:`.acks`).

A failure is told here, once (:meth:`Outcomes.fail`): its text and traceback (formatted once),
its log line (one record of ``disque_py.worker``: WARNING for a failure retried, ERROR for one
that ends the job, the traceback under the line), its count, the pause it may start
(:mod:`.pause`) and the command that reports it. A job that succeeds costs none of it.
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
from .handlers import GiveBack, Reject, describe_error, is_async_callable, reason_of, trace_of
from .pause import FailureGate
from .settings import DEFAULT_DEAD_LETTER, WorkerSettings
from .stats import Counters
from .stop import Stop
from .wakeup import Wakeup

__all__ = ["Outcomes"]

log = logging.getLogger("disque_py.worker")

#: the failures remembered (their text) for a job's dead letter, should it come back above max_attempts
LAST_ERRORS = 1000

#: what a failure that ends the job leaves for its dead letter: its text and traceback
Failure = tuple[str, str | None]


class Outcomes:
    """Turns a handler's result into the outcome to send (see the module docstring)."""

    def __init__(self, settings: WorkerSettings, client: Any, counters: Counters, acks: Acks, gate: FailureGate,
                 stop: Stop, fetch_wake: Wakeup, spawn: Callable[[Callable[[], Awaitable[Any]]], None],
                 rng: Any) -> None:  # fmt: skip
        self.max_attempts = settings.max_attempts
        self.retry_backoff = settings.retry_backoff
        self.dead_letter_handler = settings.dead_letter
        self.describe = settings.describe
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
        failure = self.fail(job, error)
        if failure is not None:
            await self.dead_letter(job, failure[0], failure_counted=True, trace=failure[1])

    def failed_later(self, job: Job, error: BaseException) -> None:
        """:meth:`finish` for a failure reported from outside the handlers' tasks (a handler
        thread): a dead letter, if due, runs as a task of its own."""
        failure = self.fail(job, error)
        if failure is not None:
            self.spawn(lambda: self.dead_letter(job, failure[0], failure_counted=True, trace=failure[1]))

    def failed_at_cancel(self, job: Job) -> None:
        """A failure reported while the handlers are being cancelled (the grace period is over):
        no dead letter can run now, the job is NACKed plainly."""
        self.counters.failed += 1
        self.counters.retried += 1
        self.acks.nack(job)

    def fail(self, job: Job, error: BaseException) -> Failure | None:
        """Count a handler failure, log it and NACK the job; or return its text and traceback if
        it must be dead-lettered."""
        if type(error) is GiveBack:
            return self.given_back(job, error)
        counters = self.counters
        counters.failed += 1
        rejected = isinstance(error, Reject)
        text = reason_of(error)
        fatal = not isinstance(error, Exception)
        trace = None if fatal else trace_of(error)  # a fatal one is raised again from run(), with its own
        self.record_failure(job)
        dead = rejected or (self.max_attempts is not None and job.attempt >= self.max_attempts and not fatal)
        what = self._name(job)
        if dead:  # the job ends here: dead-lettered (or, with dead_letter=None, dropped) next
            fate = ", discarded" if self.dead_letter_handler is None else ""
            self._log(logging.ERROR, "%s %s (attempt %d)%s: %s", what,
                      "rejected" if rejected else "failed on its last attempt", job.attempt, fate, text,
                      trace)  # fmt: skip
        elif fatal or self.acks.legacy:
            self._log(logging.WARNING, "%s failed (attempt %d): %s", what, job.attempt, text, trace)
            self._remember_error(job.id, text)
            counters.retried += 1
            self.acks.nack(job)  # back at once
        elif job.last_delivery:  # its own MAXDELIVER: the node dead-letters it on this NACK
            self._log(logging.ERROR, "%s failed on its last delivery (attempt %d, MAXDELIVER): %s", what, job.attempt,
                      text, trace)  # fmt: skip
            counters.dead += 1
            self.acks.nack_with("dead", job, cmd.nack_argv([job.id], reason=text, trace=self._sent(trace)))
        else:
            delay = self.retry_delay(job)
            self._log(logging.WARNING, "%s failed (attempt %d)%s: %s", what, job.attempt,
                      "" if delay is None else ", again in %.3f s" % delay, text, trace)  # fmt: skip
            counters.retried += 1
            self.acks.nack_with("retry", job, cmd.nack_argv([job.id], delay=delay, reason=text,
                                                             trace=self._sent(trace)))  # fmt: skip
        if fatal:  # KeyboardInterrupt, SystemExit...: stop gracefully, re-raise from run()
            self.stop.fatal(error)
        return (text, trace) if dead else None

    def _name(self, job: Job) -> str:
        """How a failed job is named in the log: ``job <id>``, with its label when the worker
        has ``describe`` (a task's name)."""
        describe = self.describe
        if describe is None:
            return "job " + job.id
        try:
            return "job %s (%s)" % (job.id, describe(job))
        except Exception:  # noqa: BLE001 - the beacon says so once; the failure is logged all the same
            return "job " + job.id

    def _sent(self, trace: str | None) -> str | None:
        """The traceback a NACK carries: none to a node that does not take TRACE."""
        return trace if self.acks.takes_trace else None

    @staticmethod
    def _log(level: int, msg: str, *args: Any) -> None:
        """One record per failure: the line, then the traceback (the last of ``args``) under it.
        A lone surrogate (an exception's message may hold one) is written as ``\\udXXX``: a log
        file that takes UTF-8 strictly must not lose the record."""
        *args, trace = args
        args = [a.encode("utf-8", "backslashreplace").decode("utf-8") if type(a) is str else a for a in args]
        if trace:
            log.log(level, msg + "\n%s", *args, trace.rstrip("\n"))
        else:
            log.log(level, msg, *args)

    def given_back(self, job: Job, error: GiveBack) -> Failure | None:
        """A handler gave the job back for another worker (:class:`~.handlers.GiveBack`):
        RELEASE ... DELAY, no attempt used; its text if it must be dead-lettered instead (given
        back ``limit`` times already)."""
        text = reason_of(error)
        self.gate.neutral(job.id)
        if job.returns >= error.limit:
            self.counters.failed += 1
            self._log(logging.ERROR, "%s given back %d times: dead-lettered: %s", self._name(job), job.returns, text,
                      None)  # fmt: skip
            return text, None
        self.counters.released += 1
        self._log(logging.INFO, "%s given back (%d of %d), queued again in %.3g s: %s", self._name(job),
                  job.returns + 1, error.limit, error.delay, text, None)  # fmt: skip
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

    async def dead_letter(self, job: Job, error: str, *, failure_counted: bool, trace: str | None = None) -> None:
        """Dead-letter ``job`` with ``error`` (and its failure's traceback, to the cluster's dead
        letter or the JSON one; a ``dead_letter`` handler of the worker gets the text only)."""
        handler = self.dead_letter_handler
        counters = self.counters
        if handler is DEFAULT_DEAD_LETTER and not self.acks.legacy:  # the cluster's dead letter
            counters.dead += 1
            self.last_errors.pop(job.id, None)
            self.acks.nack_with("dead", job, cmd.nack_argv([job.id], reason=error, trace=self._sent(trace), dead=True))
            return
        try:
            if handler is DEFAULT_DEAD_LETTER:  # a node without NACK DEAD: a JSON DeadLetter
                await self.client.add_job(job.queue + ".dead", DeadLetter.from_job(job, error, trace).encode())
            elif handler is None:
                if not failure_counted:  # a failure's own line said so (fail())
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
