"""Results as jobs of the cluster.

A task whose message asks for a result (``"result": {"ttl": s}``) gets one job
written by the worker that ran it, before its own job is acknowledged:

* in the queue ``@result:<task job ID>`` (or the queue the message names), so
  that a waiter needs nothing but the ID ADDJOB gave back. ``@``: one of the cluster's own
  queues, which QSCAN (unless ``ALL``), ``disque-py top``, the admin page and /metrics leave
  out, so that results do not crowd the queues an operator watches;
* with ``TTL`` = the result TTL: the cluster forgets it after that, on every node;
* with ``DEDUP result``: a write retried after a lost connection, or a task run
  twice (at-least-once), adds one result job: the first one written wins, and the
  later writes get its ID back;
* replicated as any job (ADDJOB's default), so it outlives the node it was
  written to.

A waiter of one result (:meth:`TaskRef.result`) first reads it with ``QPEEK`` where its
client is: one round trip, and nothing taken. When it is not there (not written yet, on
another node, held by another waiter), a waiter on any node takes it with ``GETJOB TIMEOUT
... FROM <queue>`` (the node fetches it from the others if it holds no copy) and puts it
straight back with ``ENQUEUE``, so every waiter, anywhere, reads it until its TTL ends.
A result another waiter took to its node stays there a while: that node, which just
imported into the queue, does not hand it on (federation's rule against ping-pong), so a
waiter that got nothing from a GETJOB of ``PEEK_EVERY`` seconds also reads the queue with
``QPEEK`` on every other node (``Client.on_other_nodes``) before it waits again. It also
looks for the task's dead letter then (``SHOW``, its ID derived from the task's): a task whose
worker died during its last delivery is dead-lettered by the node and no result is written,
so the waiter gets a ``WorkerLost`` error with the cluster's reason (and the traceback of the
last failure the cluster kept, ``last-failure-trace``: an earlier delivery's), not a timeout. Many results
are awaited with one GETJOB over their queues (:func:`wait_outcomes`).

Workers of the earlier layout wrote a task's result to ``result:<task job ID>``. So that a
result such a worker writes during a rolling upgrade is found, a waiter reads that name too,
with QPEEK only: at its first look (in the same round trip as the new name) and at each look
around (here and on the other nodes), so within ``PEEK_EVERY`` seconds of the write. It never
waits on it with GETJOB, which would make a plain queue of that name on the node for as long
as it waits. The other way round, a waiter of the earlier layout does not read ``@result:``:
upgrade the processes that wait for results before the workers.
"""

from __future__ import annotations

import time
from typing import Any

from ..client import commands as cmd
from ..core.ids import dead_letter_id
from . import control
from .control import REVOKED
from .message import (RESULT_QUEUE_PREFIX, MessageError, Outcome, decode_outcome, encode_outcome,
                      legacy_result_queue, result_queue)  # fmt: skip

__all__ = ["TaskError", "TaskRevoked", "RemoteTraceback", "ResultTimeout", "NoResult", "TaskRef", "wait_outcomes", "result_argv",
           "result_options", "RESULT_DEDUP"]

#: the DEDUP key of every result job (its queue is the task's own, so one key is enough)
RESULT_DEDUP = "result"
#: seconds of GETJOB without a result before the other nodes are looked at (QPEEK), and between two looks
PEEK_EVERY = 1.0


class RemoteTraceback(Exception):
    """The traceback of a task's failure, in the worker that ran it: the cause of its
    :class:`TaskError`, so that one raised and not caught prints it above its own (as
    ``concurrent.futures`` shows a process's)."""

    def __init__(self, text: str) -> None:
        super().__init__(text)
        self.text = text

    def __str__(self) -> str:
        return '\n"""\n%s"""' % self.text


class TaskError(Exception):
    """The task failed: ``type`` is its error's type name, ``message`` its message.

    ``str()`` reads ``"ValueError: boom"``; ``job_id`` is the task's job; ``traceback`` the
    task's formatted traceback in the worker that ran it (its tail, at most 16 KiB), or None
    (a worker that sent none, or a task rejected before it ran). With one, the error's
    ``__cause__`` is a :class:`RemoteTraceback`: a TaskError not caught prints the task's
    traceback above its own.
    """

    def __init__(self, type_name: str, message: str, job_id: str | None = None, traceback: str | None = None) -> None:
        super().__init__("%s: %s" % (type_name, message) if message else type_name)
        self.type = type_name
        self.message = message
        self.job_id = job_id
        self.traceback = traceback
        if traceback:
            self.__cause__ = RemoteTraceback(traceback)


class TaskRevoked(TaskError):
    """The task was revoked or cancelled (``ref.revoke()``, ``ref.cancel()``): it never ran, or
    was stopped while it ran; its ``type`` is ``"TaskRevoked"``."""


class ResultTimeout(TimeoutError):
    """No result within the timeout (the task has not finished, or its result expired)."""


class NoResult(Exception):
    """The task was sent without a result to wait for (``result_ttl=0``)."""


def result_options(ttl: int) -> dict[str, Any]:
    """ADDJOB's options of a result job kept ``ttl`` seconds, as the clients' ``add_job`` keywords
    (see the module docstring)."""
    ttl = max(2, int(ttl))
    retry = max(1, min(30, ttl // 4))  # a waiter that died between GETJOB and ENQUEUE: back after this
    return {"ttl": ttl, "retry": retry, "dedup": RESULT_DEDUP}


def result_argv(queue: str, outcome: Outcome, serializer: str, ttl: int) -> tuple[Any, ...]:
    """The ADDJOB that writes a result job (see the module docstring)."""
    return cmd.addjob_argv(queue, encode_outcome(outcome, serializer), **result_options(ttl))


def _decoded(queue: str, body: Any) -> Outcome:
    """A result job's body as an Outcome; an unreadable one is a MessageError outcome."""
    try:
        return decode_outcome(body)
    except (MessageError, TypeError) as exc:
        return Outcome(False, None, "MessageError", "unreadable result in %s: %s" % (queue, exc))


def _outcome_of(job: Any) -> Outcome:
    return _decoded(job.queue, job.body)


def _qpeek(queue: str) -> tuple[Any, ...]:
    return ("QPEEK", queue, 1)


def _peek(client: Any, queue: str) -> Outcome | None:
    """The result where the client is, read with QPEEK (nothing taken): in ``queue`` and, for a
    task's own queue, under the name an older worker wrote it to, in one round trip."""
    legacy = legacy_result_queue(queue)
    names = [queue] if legacy is None else [queue, legacy]
    try:
        replies = client.pipeline([cmd.execute(*_qpeek(name)) for name in names])
    except Exception:  # noqa: BLE001 - the GETJOB that follows says what is wrong, or fails over
        return None
    for name, jobs in zip(names, replies):
        if isinstance(jobs, list) and jobs:
            return _decoded(name, jobs[0][2])
    return None


def _dead_letter_show(queue: str) -> tuple[Any, ...] | None:
    """SHOW of the dead letter of the task whose result goes to ``queue`` (None when the queue
    is not a task's own ``@result:<job ID>``)."""
    if not queue.startswith(RESULT_QUEUE_PREFIX):
        return None
    job_id = queue[len(RESULT_QUEUE_PREFIX):].encode("ascii", "replace")
    if len(job_id) != 40:
        return None
    return ("SHOW", dead_letter_id(job_id))


def _lost(show: Any) -> Outcome | None:
    """The outcome of a task whose job is a dead letter without a result written (its worker
    died on its last delivery): a ``WorkerLost`` error with the cluster's reason."""
    try:
        fields = cmd.parse_flat_map(show) if isinstance(show, list) else None
    except Exception:  # noqa: BLE001 - not a SHOW reply: nothing learnt
        return None
    if not fields:
        return None
    reason = fields.get("dead-letter-reason") or "dead-lettered"
    trace = fields.get("last-failure-trace")
    return Outcome(False, None, "WorkerLost", "the task's job was dead-lettered by the cluster after %s "
                   "deliveries without a result: %s" % (fields.get("original-deliveries", "?"), reason),
                   trace if isinstance(trace, str) and trace else None)  # fmt: skip


def _look_around(client: Any, queues: list[str]) -> dict[str, Outcome]:
    """After a while without a result: QPEEK ``queues`` on every other node the client knows
    (a result held there), and the names older workers wrote results to here and there; for
    what is still missing, SHOW the task's dead letter here and there (a task whose worker died
    on its last delivery: the node dead-lettered it, and no result will come)."""
    legacy = [(q, old) for q in queues if (old := legacy_result_queue(q)) is not None]
    shows = [(q, argv) for q in queues if (argv := _dead_letter_show(q)) is not None]
    # (the pending queue a read answers for, the read); here the GETJOB reads ``queues`` itself
    there = [(q, _qpeek(q)) for q in queues] + [(q, _qpeek(old)) for q, old in legacy] + shows
    here = [(q, _qpeek(old)) for q, old in legacy] + shows
    answers: list[list[tuple[tuple[str, tuple[Any, ...]], Any]]] = []
    if here:
        try:
            answers.append(list(zip(here, client.pipeline([cmd.execute(*argv) for _, argv in here]))))
        except Exception:  # noqa: BLE001 - the GETJOB that follows says what is wrong
            pass
    look = getattr(client, "on_other_nodes", None)
    try:
        if look is not None:
            answers += [list(zip(there, replies)) for _, replies in look([argv for _, argv in there])]
    except Exception:  # noqa: BLE001 - the GETJOB goes on waiting
        pass
    got: dict[str, Outcome] = {}
    lost: dict[str, Outcome] = {}
    for answer in answers:
        for (queue, argv), reply in answer:
            if argv[0] == "QPEEK":
                if queue not in got and isinstance(reply, list) and reply:
                    job = reply[0]
                    got[queue] = _decoded(argv[1], job[2] if isinstance(job, list) and len(job) > 2 else b"")
            elif queue not in lost:
                outcome = _lost(reply)
                if outcome is not None:
                    lost[queue] = outcome
    for queue, outcome in lost.items():
        got.setdefault(queue, outcome)  # a result found anywhere wins
    return got


def wait_outcomes(client: Any, queues: list[str], timeout: float | None) -> dict[str, Outcome]:
    """Wait for result jobs in ``queues`` (a sync client); ``{queue: outcome}`` for those that
    came within ``timeout`` seconds (None: until all came). Every one read is put back."""
    pending = list(dict.fromkeys(queues))
    got: dict[str, Outcome] = {}
    if len(pending) == 1:
        # one result, most often there already: QPEEK reads it where the client is, in one round
        # trip and without taking it (nothing to put back); not there (not written yet, another
        # node's, or held by another waiter): the GETJOB below waits, and fetches it from others
        peeked = _peek(client, pending[0])
        if peeked is not None:
            return {pending[0]: peeked}
    deadline = None if timeout is None else time.monotonic() + timeout
    slice_ms = int(PEEK_EVERY * 1000)
    while pending:
        if deadline is None:
            wait_ms: int | None = slice_ms
            nohang = False
        else:
            left = deadline - time.monotonic()
            wait_ms = min(int(left * 1000), slice_ms)
            nohang = wait_ms < 1
            if nohang:
                wait_ms = None
        jobs = client.get_jobs(*pending, count=len(pending), timeout_ms=wait_ms, nohang=nohang, with_counters=False)
        if not jobs and wait_ms == slice_ms:
            # a whole slice without it: held on another node that does not hand it on (above)
            got.update(_look_around(client, pending))
            pending = [q for q in pending if q not in got]
            if not pending:
                break
        if jobs:
            try:
                client.enqueue(*[j.id for j in jobs])  # back for any other waiter, until the TTL ends
            except Exception:  # noqa: BLE001 - it comes back after its RETRY anyway
                pass
        for job in jobs:
            if job.queue not in got:
                got[job.queue] = _outcome_of(job)
        pending = [q for q in pending if q not in got]
        if pending and nohang:
            break
        if pending and deadline is not None and time.monotonic() >= deadline and not jobs:
            break
    return got


class TaskRef:
    """A sent task: ``id`` is its job ID; :meth:`result` waits for what it returned."""

    __slots__ = ("app", "id", "task_name", "result_queue", "_outcome")

    def __init__(self, app: Any, job_id: str, task_name: str, result_queue_name: str | None) -> None:
        self.app = app
        self.id = job_id
        self.task_name = task_name
        self.result_queue = result_queue_name
        self._outcome: Outcome | None = None

    def __repr__(self) -> str:
        return "TaskRef(%r, id=%r)" % (self.task_name, self.id)

    @classmethod
    def for_job(cls, app: Any, job_id: str, task_name: str = "?", queue: str | None = None) -> "TaskRef":
        """A ref for a job ID got elsewhere (another process, another language)."""
        return cls(app, job_id, task_name, queue or result_queue(job_id))

    def outcome(self, timeout: float | None = None) -> Outcome:
        """The raw :class:`Outcome` (value or error), without raising the task's error."""
        if self._outcome is None:
            if self.result_queue is None:
                raise NoResult("task %s (%s) was sent without a result (result_ttl=0)" % (self.task_name, self.id))
            got = wait_outcomes(self.app.client(), [self.result_queue], timeout)
            if self.result_queue not in got:
                raise ResultTimeout("no result for task %s (%s) within %s s" % (self.task_name, self.id, timeout))
            self._outcome = got[self.result_queue]
        return self._outcome

    def result(self, timeout: float | None = None) -> Any:
        """What the task returned; raises :class:`TaskError` (its error's type name and message)
        if it failed for good, :class:`ResultTimeout` after ``timeout`` seconds (None: wait)."""
        return unwrap(self.outcome(timeout), self.id)

    def done(self) -> bool:
        """True when the result is there (does not wait)."""
        try:
            self.outcome(0)
        except ResultTimeout:
            return False
        return True

    # Celery's AsyncResult words, where they mean the same (docs/TASKS.md, "From Celery and dramatiq")
    def get(self, timeout: float | None = None, propagate: bool = True) -> Any:
        """Celery's ``get``: :meth:`result`; ``propagate=False`` returns a failed task's
        :class:`TaskError` instead of raising it."""
        if propagate:
            return self.result(timeout)
        try:
            return self.result(timeout)
        except TaskError as exc:
            return exc

    def ready(self) -> bool:
        """Celery's ``ready``: :meth:`done` (the task succeeded, or failed for good)."""
        return self.done()

    def successful(self) -> bool:
        """The task succeeded (False while there is no result)."""
        return self.done() and self._outcome is not None and self._outcome.ok

    def failed(self) -> bool:
        """The task failed for good (False while there is no result)."""
        return self.done() and self._outcome is not None and not self._outcome.ok

    # Control (tasks/control.py): from any process that knows the job ID
    def revoke(self) -> bool:
        """The task never runs, on any node, and every waiter gets :class:`TaskRevoked` at once;
        True if the revoke stands (False: the task had finished, its result stays). A running
        task runs on (see :meth:`cancel`) but its success is not written over the revoke."""
        return control.revoke(self, result_options)

    def cancel(self) -> bool:
        """:meth:`revoke`, and the worker running the task stops it (within a second): it ends as
        revoked, never retried, never dead-lettered. True if the revoke stands."""
        return control.cancel(self, result_options)

    def progress(self) -> Any:
        """The task's last ``progress(done, total, note)`` report while it runs
        (``{"done", "total", "note"}``), or None."""
        return control.progress(self)

    @property
    def status(self) -> "_StatusWord":
        """Celery's ``status`` (:attr:`state`), which called, ``ref.status()``, tells where the
        task is: a :class:`~.control.TaskStatus` (queued, delayed, running, retrying, done,
        failed, dead, revoked)."""
        return _StatusWord(self.state, self)

    @property
    def state(self) -> str:
        """Celery's states that a result can tell: ``"SUCCESS"``, ``"FAILURE"``, ``"REVOKED"``, else ``"PENDING"``
        (queued, delayed, running or retried, or expired: there is no result to say which)."""
        if not self.done():
            return "PENDING"
        if self._outcome is not None and self._outcome.error_type == REVOKED:
            return "REVOKED"
        return "SUCCESS" if self._outcome is not None and self._outcome.ok else "FAILURE"


class _StatusWord(str):
    """``ref.status``: Celery's state word, and ``ref.status()``: the task's :class:`TaskStatus`."""

    __slots__ = ("_ref",)

    def __new__(cls, word: str, ref: TaskRef) -> "_StatusWord":
        self = super().__new__(cls, word)
        self._ref = ref
        return self

    def __call__(self) -> Any:
        return control.status(self._ref)


def unwrap(outcome: Outcome, job_id: str | None) -> Any:
    if outcome.ok:
        return outcome.value
    if outcome.error_type == REVOKED:
        raise TaskRevoked(REVOKED, outcome.error_message or "", job_id, outcome.error_traceback)
    raise TaskError(outcome.error_type or "Exception", outcome.error_message or "", job_id, outcome.error_traceback)
