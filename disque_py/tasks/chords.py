"""Chords: a group's members joined by a callback, run once after the last of them, by no one in charge.

``(group(add.s(1, 2), add.s(3, 4)) | total.s()).send()`` adds each member with, in its body, the
chord that joins them (:class:`~.message.ChordSpec`: the group's ID, its members' queues, the
failure policy and what runs after). No process holds the chord's state: the cluster does.

Exactly once, and from where
----------------------------
* **Every ID is known beforehand.** Member ``i`` is added with the key ``chord:<group ID>:<i>``
  in its queue, so its job ID follows from queue and key (``ids.dedup_job_id``), and its
  result's ID from its own (the result job's key is ``result`` in its result queue). The
  callback is added with the key ``chord:<group ID>``.
* **Write, check, add, acknowledge.** The worker that ran a member writes its result, then
  reads every member's result (:func:`gather`), and when all are there adds the callback
  with the values in its body, and only then acknowledges its own job. The last member to
  write is the one whose check finds every result (any member that checked before it missed
  its result, which was not written yet); two that write at the same moment may both find
  them all, and both add the callback: its key makes it one job. A worker killed anywhere
  between writing and acknowledging leaves its job unacknowledged: it comes back (after its
  RETRY), is not run again (its result is there: :func:`own_result`) and checks again. So the
  callback is never lost (some check after the last write finds them all) nor doubled (every
  add uses one key).
* **Reading every node.** A result is a job with copies on some nodes; a check asks every
  node of the client's last HELLO for every result (``SHOW``, :func:`read_async`), and a
  result counts as there if any node shows it. A node that does not answer may hold the only
  copies of a result: a check that misses results while fewer nodes are silent than the
  copies a result is made with (:data:`COPIES`, as ADDJOB's default: ``min(3, nodes)``) has
  its answer (the nodes that answered meet every set of copies); with as many silent nodes or
  more it asks again for :data:`PATIENCE` seconds, then raises :class:`ChordPending`: the
  member's job is handed back (NACK) and checks again on its next delivery, without running.
  A result written while nodes were down has fewer copies; the guarantee holds while one of
  its copies answers (as a job lives while one of its copies lives).
* **The values ride in the callback's body**, read from the results as the cluster keeps them
  (the first written, if a member ran twice), so the callback does not depend on the results'
  TTL, and every check that finds them all builds the same body.
* **A member whose worker died on its last delivery.** A chord member is sent with one delivery
  more than its task's retries allow (``MAXDELIVER retries + 2``): the worker treats delivery
  ``retries + 1`` as the last run (a failure then is written as the member's error result and
  dead-letters it with NACK DEAD, :func:`last_run`), and the one after it, which comes only
  when the worker of the last run died or never acknowledged, runs nothing: it writes a
  ``WorkerLost`` result (unless one is there already), checks the chord and dead-letters
  the job. So even a member that can never succeed completes its chord.

The limits: the callback's key is remembered for its job's life and the nodes'
``dedup-window`` after (600 s by default), so every check must come within that of the first
add. Checks come from a member's run, and again only from a delivery of a member whose worker
did not acknowledge it (after the member's RETRY): keep members' ``retry`` (300 s at most by
default) and their run time below ``dedup-window``. A member sent back from the dead letters
(a new job, its body naming the member's result queue) checks only if it writes the member's
result: one that finds it there is acknowledged without running (:func:`.writes.settle_member`).
A member's result is kept as long as any member may still run (the longest member's ``ttl``),
so the last check finds the first result. The user's side of this: (docs/TASKS.md, "Chords").

This module reads (both faces); what is written (results, the callback) is :mod:`.writes`'s.
"""

from __future__ import annotations

import dataclasses
import random
import time
from typing import Any, NamedTuple

import trio

from ..client import commands as cmd
from ..core.ids import dead_letter_id, dedup_job_id
from .message import ChordSpec, Message, MessageError, Outcome, decode_outcome, member_key, result_queue
from .results import RESULT_DEDUP, TaskError

__all__ = ["ChordPending", "COPIES", "PATIENCE", "Progress", "member_ids", "result_id", "gather", "own_result",
           "member_runs", "read_async", "read_sync", "progress", "chord_failure", "with_errors", "last_run"]  # fmt: skip

#: the copies ADDJOB makes of a job that names none (Disque's: min(3, the cluster's nodes)); a
#: result is made with that many unless fewer nodes were reachable when it was written
COPIES = 3
#: seconds a check asks again while too many nodes are silent to tell a missing result, before it gives up
PATIENCE = 5.0
#: pause between two such asks (seconds)
PATIENCE_PAUSE = 0.5
#: results read per round of a check (the first round; each next one reads twice as many): a
#: member that is not the last stops at the first round that misses one
FIRST_ROUND = 32


class ChordPending(Exception):
    """A chord's check could not tell whether every member is done: too many nodes were silent."""


class Progress(NamedTuple):
    """How far a group is: ``done`` members with an outcome (``failed`` of them failed) of ``total``."""

    done: int
    total: int
    failed: int = 0

    def __str__(self) -> str:
        return "%d/%d" % (self.done, self.total)


def member_ids(spec: ChordSpec | str, runs: tuple[tuple[str, int], ...] = ()) -> list[str]:
    """The members' job IDs, in order (each from its queue and key, as the node made it), of a
    chord's body, or of its group's ID and its members' ``(queue, count)`` runs."""
    group_id, runs = (spec.id, spec.members) if isinstance(spec, ChordSpec) else (spec, runs)
    out: list[str] = []
    for queue, count in runs:
        q = queue.encode("utf-8", "surrogateescape")
        for _ in range(count):
            out.append(dedup_job_id(q, member_key(group_id, len(out)).encode(), 1).decode())
    return out


def result_id(job_id: str) -> str:
    """The job ID of the result of the task ``job_id`` (written with the key ``result`` in its queue)."""
    return result_job_id(result_queue(job_id))


def result_job_id(queue: str) -> str:
    """The job ID of the result written to ``queue`` (its key is ``result``, its RETRY above 0)."""
    return dedup_job_id(queue.encode("utf-8", "surrogateescape"), RESULT_DEDUP.encode(), 1).decode()


def member_runs(queues: list[str]) -> tuple[tuple[str, int], ...]:
    """The members' queues as a chord body names them: ``(queue, count)`` runs, in order."""
    runs: list[list[Any]] = []
    for queue in queues:
        if runs and runs[-1][0] == queue:
            runs[-1][1] += 1
        else:
            runs.append([queue, 1])
    return tuple((q, n) for q, n in runs)


def _decoded(body: bytes) -> Outcome:
    try:
        return decode_outcome(body)
    except (MessageError, TypeError) as exc:
        return Outcome(False, None, "MessageError", "unreadable result: %s" % exc)


def copies_for(nodes: int) -> int:
    return max(1, min(COPIES, nodes))


class Reading(NamedTuple):
    """What every node said of some job IDs: the bodies found (by ID), the nodes asked and the
    silent ones (no answer)."""

    found: dict[str, bytes]
    asked: int
    silent: int

    def conclusive(self) -> bool:
        """True when an ID no node showed is nowhere: fewer nodes were silent than a job's copies."""
        return self.silent < copies_for(self.asked)


def _reading(ids: list[str], answers: list[tuple[Any, Any]]) -> Reading:
    found: dict[str, bytes] = {}
    silent = 0
    for _, replies in answers:
        if isinstance(replies, Exception) or not isinstance(replies, list):
            silent += 1
            continue
        for job_id, reply in zip(ids, replies):
            if job_id in found or not isinstance(reply, list):
                continue
            fields = cmd.parse_flat_map(reply) or {}
            body = fields.get("body")
            if isinstance(body, bytes):
                found[job_id] = body
    return Reading(found, len(answers), silent)


async def read_async(client: Any, ids: list[str]) -> Reading:
    """``SHOW`` each ID on every node (a trio client's :meth:`on_every_node`)."""
    return _reading(ids, await client.on_every_node([("SHOW", i) for i in ids]))


def read_sync(client: Any, ids: list[str]) -> Reading:
    """``SHOW`` each ID on every node (a blocking client's :meth:`on_every_node`)."""
    return _reading(ids, client.on_every_node([("SHOW", i) for i in ids]))


async def _read_patiently(client: Any, ids: list[str], what: str) -> Reading:
    """:func:`read_async`, asked again while it misses some ID and is not conclusive; ChordPending
    after :data:`PATIENCE` seconds of that."""
    deadline = time.monotonic() + PATIENCE
    while True:
        reading = await read_async(client, ids)
        if len(reading.found) == len(ids) or reading.conclusive():
            return reading
        if time.monotonic() >= deadline:
            raise ChordPending("%s: %d of %d nodes did not answer, and %d result(s) were on none of the others"
                               % (what, reading.silent, reading.asked, len(ids) - len(reading.found)))  # fmt: skip
        await trio.sleep(PATIENCE_PAUSE)


async def gather(client: Any, spec: ChordSpec) -> list[Outcome] | None:
    """Every member's outcome, in order, when every member has its result; None when some has
    none (an earlier member's check: the last one completes the chord). Reads in rounds (in a
    random order, so that members finishing together do not all read the same results first)
    and stops at the first round that misses one. ChordPending: too many nodes were silent."""
    ids = [result_id(m) for m in member_ids(spec)]
    order = list(range(len(ids)))
    random.shuffle(order)
    found: dict[str, bytes] = {}
    start, size = 0, FIRST_ROUND
    while start < len(order):
        batch = [ids[i] for i in order[start:start + size]]
        reading = await _read_patiently(client, batch, "chord %s" % spec.id)
        if len(reading.found) < len(batch):
            return None
        found.update(reading.found)
        start, size = start + size, size * 2
    return [_decoded(found[rid]) for rid in ids]


async def own_result(client: Any, queue: str) -> Outcome | None:
    """The result in ``queue`` if the cluster holds one (a delivery before this one wrote it);
    None when no node showed it."""
    rid = result_job_id(queue)
    reading = await read_async(client, [rid])
    body = reading.found.get(rid)
    return None if body is None else _decoded(body)


def progress(client: Any, ids: list[str], result_queues: list[str]) -> Progress:
    """How many of the tasks ``ids`` (whose results go to ``result_queues``) have an outcome,
    read on every node (a blocking client): a result, or a dead letter without one (its worker
    lost on its last delivery)."""
    rids = [result_job_id(q) for q in result_queues]
    reading = read_sync(client, rids)
    failed = 0
    for rid in rids:
        body = reading.found.get(rid)
        if body is not None and not _decoded(body).ok:
            failed += 1
    done = len(reading.found)
    missing = [i for i, rid in enumerate(rids) if rid not in reading.found]
    if missing:
        dead = [dead_letter_id(ids[i].encode("ascii", "replace")).decode() for i in missing]
        lost = len(read_sync(client, dead).found)
        done, failed = done + lost, failed + lost
    return Progress(done, len(ids), failed)


def chord_failure(spec: ChordSpec, outcomes: list[Outcome]) -> Outcome:
    """The outcome of a chord that fails (``on_error="fail"``): a ``ChordError`` naming the
    members that failed, with their errors."""
    ids = member_ids(spec)
    failed = [(i, o) for i, o in enumerate(outcomes) if not o.ok]
    parts = ["member %d (%s) %s: %s" % (i, ids[i], o.error_type, o.error_message) for i, o in failed[:5]]
    if len(failed) > 5:
        parts.append("and %d more" % (len(failed) - 5))
    return Outcome(False, None, "ChordError", "%d of %d members failed: %s" % (len(failed), len(outcomes),
                   "; ".join(parts)))  # fmt: skip


def with_errors(message: Message) -> Message:
    """The message a callback called with its members' errors runs with: each error in place in
    its first argument, as a :class:`~.results.TaskError`."""
    if not message.errors:
        return message
    values = list(message.args[0])
    for e in message.errors:
        values[e.at] = TaskError(e.type, e.message, e.job or None)
    return dataclasses.replace(message, args=(values,) + tuple(message.args[1:]))


def last_run(job: Any, task: Any) -> int:
    """The delivery that is a chord member's last run: one before its job's MAXDELIVER (the
    delivery after it is the spare, for a worker lost during the last run), or its task's
    ``retries + 1`` for a job sent without one."""
    if job.maxdeliver is not None:
        return max(1, job.maxdeliver - 1)
    return task.retries + 1
