"""A sent task, controlled from anywhere: revoke, cancel, status, progress (docs/TASKS.md).

Everything here needs only the task's job ID (``TaskRef.for_job(app, id)`` in any process) and
reads or writes the cluster with the app's sync client:

* :func:`revoke`: the task never runs. Its result is written first, a ``TaskRevoked`` error
  (the result job's DEDUP key makes the first result written win: a worker that finishes
  after the revoke cannot write a success over it, and one that finished before wins), which
  wakes every waiter at once; then its job is acknowledged cluster-wide (``ACKJOB``: the node
  that holds no copy broadcasts the ack, every holder drops the job from its queue or its
  delay, and the AOF keeps the ack across a restart).
* :func:`cancel`: a revoke, and the worker that runs the job is told to stop it: a notice in
  that worker's control queue (``@control:<worker ID>``, ``client/worker/control.py``) on the
  node its beats go to, read by a blocking GETJOB the worker keeps there. The worker is found
  in ``WORKER LIST`` on every node (its beats list the jobs it runs); a job started since the
  worker's last beat is not listed yet, so when no worker lists a job that was delivered, every
  live worker of the job's queue is told (rare, and one ADDJOB each).
* A revoked task sent with a DEDUP key (``send_with(dedup=...)``) frees its key: the revoke
  leaves a marker, a job ``@revoked:<job ID>`` on every node (its ID follows from the task's,
  :func:`marker_id`), kept as long as a node may remember the key (the job's life and the
  node's ``dedup-window``). A send with that key finds it (:func:`live_key`, one SHOW) and adds
  its job with the key's next generation (:func:`generation_key`): a new job, with an ID of its
  own, at once and on any node. The node's memory of the old ID stays as it is (it is what
  makes a producer's retry safe), and the revoked job keeps its ID, its result and its status.
* :func:`status`: one pipeline per node (``QPEEK`` of the result queue, ``SHOW`` of the job
  and of its dead letter, ``WORKER LIST``), read as a :class:`TaskStatus`.
* :func:`progress`: what the task last reported (``ctx.progress(...)``), from the beats.
"""

from __future__ import annotations

import hashlib
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from ..client import commands as cmd
from ..client.connection import NodeConnection
from ..client.errors import DisqueError
from ..client.worker.control import NOTICE_TTL, cancel_notice, control_queue
from ..client.workers import WorkerView, merge
from ..core.ids import dead_letter_id, dedup_job_id, ttl_minutes_from_id
from .message import MessageError, Outcome, decode_outcome, encode_outcome
from .periodic import DEFAULT_DEDUP_WINDOW, REACHABLE, dedup_window

__all__ = ["TaskStatus", "STATES", "REVOKED", "revoke", "cancel", "status", "progress", "marker_id", "generation_key",
           "live_key"]

#: The error type of a revoked task's result (``results.TaskRevoked``).
REVOKED = "TaskRevoked"

#: Every state :func:`status` may tell (``unknown``: no job, no result, no dead letter: the
#: task expired, its result did, it was sent without a result and is done, or no such ID).
STATES = ("queued", "delayed", "running", "retrying", "done", "failed", "dead", "revoked", "unknown")
#: A revoked result kept this long when the app keeps none by default (seconds).
REVOKED_RESULT_TTL = 600
log = logging.getLogger("disque_py.tasks")

#: The queue of a revoked DEDUP job's marker: ``@revoked:<job ID>`` (one of the cluster's own).
MARKER_QUEUE_PREFIX = "@revoked:"
#: Generations of a key looked at by one send before it gives up (each one a revoke).
GENERATIONS_MAX = 1000


@dataclass(frozen=True)
class TaskStatus:
    """Where a task is (:data:`STATES`), with what the cluster says of it there.

    ``until``: delayed: when it is queued; retrying: when its next attempt is queued (Unix
    seconds, from the node's timer). ``attempt``: the deliveries so far (running, retrying) or
    the one it waits for. ``worker``, ``node``, ``since``, ``progress``: running: the worker
    (its ID), the node it beats to, when the job started (the worker's clock), its last
    ``progress`` report (``{"done", "total", "note"}``) or None; ``since`` is None for a job
    started after the worker's last beat. ``error``: failed, dead, revoked: ``"Type: message"``
    (dead: the dead letter's reason). ``queue``: the task's queue, when a node knows the job.
    """

    state: str
    job_id: str
    queue: str | None = None
    until: float | None = None
    attempt: int | None = None
    worker: str | None = None
    node: str | None = None
    since: float | None = None
    progress: dict[str, Any] | None = None
    error: str | None = None


# ------------------------------------------------------------ asking every node
def _everywhere(client: Any, argvs: list[tuple[Any, ...]]) -> list[tuple[Any, list[Any]]]:
    """``argvs`` pipelined on every node: ``[(address, replies)]``, the node in use first
    (errors as values); a node that does not answer is left out."""
    out: list[tuple[Any, list[Any]]] = []
    try:
        here = client.pipeline([cmd.execute(*argv) for argv in argvs])
        out.append((client.current_address, here))
    except DisqueError:
        pass
    out += client.on_other_nodes(argvs)
    return out


def _node_name(address: Any) -> str:
    return "%s:%s" % tuple(address) if isinstance(address, tuple) else str(address)


def _workers(answers: list[tuple[Any, list[Any]]], index: int) -> tuple[list[WorkerView], dict[str, Any]]:
    """The live workers (merged) from the ``index``-th reply of each node, and the address of
    each node by its name (``WorkerView.node``)."""
    addresses = {_node_name(address): address for address, _ in answers}
    views = merge((_node_name(address), replies[index]) for address, replies in answers if len(replies) > index)
    return views, addresses


def _shows(answers: list[tuple[Any, list[Any]]], index: int) -> list[dict[str, Any]]:
    out = []
    for _, replies in answers:
        reply = replies[index] if len(replies) > index else None
        if isinstance(reply, list) and reply:
            try:
                out.append(cmd.parse_flat_map(reply))
            except Exception:  # noqa: BLE001 - not a SHOW reply: nothing learnt
                continue
    return out


def _revoked_ttl(ref: Any) -> int:
    task = ref.app.tasks.get(ref.task_name)
    ttl = task.effective_result_ttl if task is not None else ref.app.result_ttl
    return int(ttl) or REVOKED_RESULT_TTL


# ------------------------------------------------------------ revoke and cancel
def _write_revoked(ref: Any, text: str, result_options: Callable[[int], dict[str, Any]]) -> str | None:
    """ADD the revoked result (the first result written wins); the result job's ID."""
    if ref.result_queue is None:
        return None
    body = encode_outcome(Outcome(False, None, REVOKED, text), "json")
    return str(ref.app.client().add_job(ref.result_queue, body, **result_options(_revoked_ttl(ref))))


def _standing(ref: Any, result_id: str | None) -> bool:
    """Whether the task's result (job ``result_id``) is the revoked one: SHOW where the client
    is, else on every node (nothing taken from a waiter); True when no node shows it (nothing
    else can stand), or without a result queue."""
    if result_id is None:
        return True
    client = ref.app.client()
    shown = client.show(result_id)
    if shown is None:
        found = _shows(_everywhere(client, [("SHOW", result_id)]), 0)
        shown = found[0] if found else None
    if shown is None:
        return True
    try:
        return decode_outcome(shown.get("body")).error_type == REVOKED
    except (MessageError, TypeError):
        return True


def revoke(ref: Any, result_options: Callable[[int], dict[str, Any]]) -> bool:
    """The task never runs (see the module docstring); True if its revoked result stands (False:
    it had finished already, and its result stays). ``ref``: a ``TaskRef``; ``result_options``:
    ``results.result_options``, the ADDJOB options of a result job."""
    result_id = _write_revoked(ref, "task %s (%s) was revoked" % (ref.task_name, ref.id), result_options)
    known = ref.app.client().ack(ref.id)
    return _free_key(ref, known, _standing(ref, result_id))


def cancel(ref: Any, result_options: Callable[[int], dict[str, Any]]) -> bool:
    """:func:`revoke`, and the worker that runs the task stops it (see the module docstring);
    True if the revoked result stands."""
    client = ref.app.client()
    argvs: list[tuple[Any, ...]] = [("SHOW", ref.id)]
    shows = _shows(_everywhere(client, argvs), 0)
    result_id = _write_revoked(ref, "task %s (%s) was cancelled" % (ref.task_name, ref.id), result_options)
    known = client.ack(ref.id)  # cluster-wide: a retry cannot bring it back, whatever the worker does
    standing = _free_key(ref, known or any(s.get("state") != "acked" for s in shows), _standing(ref, result_id))
    delivered = any(int(s.get("deliveries") or 0) > 0 or int(s.get("nacks") or 0) > 0 for s in shows)
    if shows and not delivered:
        return standing  # queued or delayed: the revoke is all it takes
    answers = _everywhere(client, [("WORKER", "LIST")])
    views, addresses = _workers(answers, 0)
    targets = [w for w in views if any(r.id == ref.id for r in w.running)]
    if not targets:
        # started since its worker's last beat (or no node knows it any more): every live worker
        # of its queue (of any queue, if that is not known either) is told
        queues = {s.get("queue") for s in shows if s.get("queue")}
        targets = [w for w in views if not queues or queues & set(w.queues)]
    for worker in targets:
        _notify(client, addresses.get(worker.node), worker.id, ref.id)
    return standing


# ------------------------------------------------------------ a revoked DEDUP key, freed
def is_dedup_id(job_id: str) -> bool:
    """Whether ``job_id`` may be an ADDJOB DEDUP's (``ids.dedup_job_id``: its TTL field is the
    largest); a plain job with a TTL of 45 days or more looks the same (its marker is harmless)."""
    try:
        return ttl_minutes_from_id(job_id.encode("ascii")) >= 0xFFFE
    except (ValueError, UnicodeEncodeError):
        return False


def marker_id(job_id: str) -> str:
    """The job ID of the marker a revoke of the DEDUP job ``job_id`` leaves (module docstring)."""
    return dedup_job_id((MARKER_QUEUE_PREFIX + job_id).encode("ascii", "replace"), b"revoked", 1).decode()


def generation_key(key: bytes, generation: int) -> bytes:
    """A send's DEDUP key ``key`` once its jobs were revoked ``generation`` times: the key itself
    first, then one of a fixed length (a 512-byte key has a next generation too)."""
    if generation == 0:
        return key
    return b"revoked-%d:%s" % (generation, hashlib.sha256(key).hexdigest().encode())


def live_key(client: Any, queue: str, key: bytes, retry: int) -> bytes:
    """The generation of ``key`` whose job was not revoked (``key`` itself unless a revoke freed
    it): one SHOW of its marker, where the client is, per generation looked at."""
    raw_queue = queue.encode("utf-8", "surrogateescape")
    for generation in range(GENERATIONS_MAX):
        candidate = generation_key(key, generation)
        job_id = dedup_job_id(raw_queue, candidate, retry).decode()
        if client.show(marker_id(job_id)) is None:
            return candidate
    raise RuntimeError("the DEDUP key %r was revoked %d times" % (key, GENERATIONS_MAX))


def _free_key(ref: Any, live: Any, standing: bool) -> bool:
    """After a revoke that stands of a job that was there (``live``: ACKJOB found it, or a SHOW
    did), a DEDUP job's marker, on every node and for as long as a node may remember its key:
    a send with the key then makes a new job (:func:`live_key`). Returns ``standing``."""
    if not standing or not is_dedup_id(ref.id):
        return standing
    client = ref.app.client()
    if not live and ref.result_queue is None:  # no result to tell: was the job there at all?
        shows = _shows(_everywhere(client, [("SHOW", ref.id)]), 0)
        if not any(s.get("state") != "acked" for s in shows):
            return standing  # done (or never there): its key stays taken
    task = ref.app.tasks.get(ref.task_name)
    life = int(getattr(task, "ttl", 0) or 86400)
    window = dedup_window(client)
    ttl = life + int(DEFAULT_DEDUP_WINDOW if window is None else window) + 60
    replicate = max(1, len(client.hello().nodes))
    body = b'{"revoked": "%s"}' % ref.id.encode()
    while True:  # on every node; with the copies the nodes can make when some are down
        try:
            client.add_job(MARKER_QUEUE_PREFIX + ref.id, body, ttl=ttl, delay=ttl - 1, replicate=replicate,
                           dedup="revoked")  # fmt: skip
            return standing
        except DisqueError as exc:
            fewer = REACHABLE.search(str(exc))
            if fewer is not None and 1 <= int(fewer.group(1)) < replicate:
                replicate = int(fewer.group(1))
                continue
            if "NOREPL" not in str(exc):  # NOREPL: the marker is kept with the copies made (DEDUP)
                log.warning("revoked task %s: its DEDUP key stays taken (no marker: %s)", ref.id, exc)
            return standing


def _notify(client: Any, address: Any, worker_id: str, job_id: str) -> None:
    """ADD a cancel notice to the worker's control queue on the node it beats to."""
    argv = cmd.addjob_argv(control_queue(worker_id), cancel_notice(job_id), replicate=1, retry=0, ttl=NOTICE_TTL)
    if address is None or address == client.current_address:
        try:
            client.execute(*argv)
        except DisqueError:
            pass
        return
    try:
        conn = NodeConnection(address, client.config)
    except DisqueError:
        return
    try:
        conn.request(argv, client.config.socket_timeout)
    except DisqueError:
        pass
    finally:
        conn.close()


# ------------------------------------------------------------ status and progress
def _error_text(outcome: Outcome) -> str:
    kind = outcome.error_type or "Exception"
    return "%s: %s" % (kind, outcome.error_message) if outcome.error_message else kind


def _running_on(views: list[WorkerView], job_id: str) -> tuple[WorkerView, Any] | None:
    for worker in views:
        for job in worker.running:
            if job.id == job_id:
                return worker, job
    return None


def status(ref: Any) -> TaskStatus:
    """Where the task is now (see :class:`TaskStatus` and the module docstring)."""
    client = ref.app.client()
    job_id = ref.id
    dead_id = dead_letter_id(job_id.encode("utf-8", "replace")).decode("ascii", "replace")
    argvs: list[tuple[Any, ...]] = [("SHOW", job_id), ("WORKER", "LIST"), ("SHOW", dead_id)]
    if ref.result_queue is not None:
        argvs.append(("QPEEK", ref.result_queue, 1))
    answers = _everywhere(client, argvs)
    now = time.time()
    outcome = None
    if ref.result_queue is not None:
        for _, replies in answers:
            reply = replies[3] if len(replies) > 3 else None
            if isinstance(reply, list) and reply and isinstance(reply[0], list) and len(reply[0]) > 2:
                try:
                    outcome = decode_outcome(reply[0][2])
                except (MessageError, TypeError) as exc:
                    outcome = Outcome(False, None, "MessageError", "unreadable result: %s" % exc)
                break
    shows = _shows(answers, 0)
    queue = next((s.get("queue") for s in shows if s.get("queue")), None)
    if outcome is not None and outcome.error_type == REVOKED:
        return TaskStatus("revoked", job_id, queue, error=_error_text(outcome))
    dead = _shows(answers, 2)
    if dead:
        reason = dead[0].get("dead-letter-reason") or "dead-lettered"
        return TaskStatus("dead", job_id, queue or dead[0].get("original-queue"), error=str(reason))
    if outcome is not None:
        if outcome.ok:
            return TaskStatus("done", job_id, queue)
        return TaskStatus("failed", job_id, queue, error=_error_text(outcome))
    views, _ = _workers(answers, 1)
    found = _running_on(views, job_id)
    if found is not None:
        worker, job = found
        return TaskStatus("running", job_id, queue or job.queue, attempt=_attempt(shows) or None, worker=worker.id,
                          node=worker.node, since=job.since or None, progress=job.progress)  # fmt: skip
    if not shows:
        return TaskStatus("unknown", job_id)
    if any(s.get("state") == "queued" for s in shows):
        return TaskStatus("queued", job_id, queue, attempt=_attempt(shows) + 1)
    nacks = max(int(s.get("nacks") or 0) + int(s.get("additional-deliveries") or 0) for s in shows)
    deliveries = max(int(s.get("deliveries") or 0) for s in shows)
    waits = [int(s["next-requeue-within"]) for s in shows if isinstance(s.get("next-requeue-within"), int)]
    until = now + min(waits) / 1000.0 if waits else None
    if deliveries == 0 and nacks == 0:
        delayed = any(int(s.get("delay") or 0) > 0 for s in shows)
        return TaskStatus("delayed" if delayed else "queued", job_id, queue, until=until if delayed else None,
                          attempt=1)  # fmt: skip
    if nacks > 0 and nacks >= deliveries:
        return TaskStatus("retrying", job_id, queue, until=until, attempt=deliveries)
    # delivered and not given back: a worker has it, started after its last beat
    return TaskStatus("running", job_id, queue, attempt=deliveries)


def _attempt(shows: list[dict[str, Any]]) -> int:
    return max((int(s.get("deliveries") or 0) for s in shows), default=0)


def progress(ref: Any) -> dict[str, Any] | None:
    """The task's last progress report while it runs (``{"done", "total", "note"}``), or None."""
    views, _ = _workers(_everywhere(ref.app.client(), [("WORKER", "LIST")]), 0)
    found = _running_on(views, ref.id)
    return None if found is None else found[1].progress
