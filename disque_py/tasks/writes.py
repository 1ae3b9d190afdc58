"""What a task's run writes to the cluster: its result job, a chain's next task, a chord's callback.

Each is one ADDJOB through the client's own ``add_job`` with a DEDUP key (``result`` in the
task's result queue, :mod:`.results`; ``chain:<job ID>`` for a chain's next task,
:mod:`.message`; ``chord:<group ID>:<i>`` for a group's members and ``chord:<group ID>`` for
what follows a chord, :mod:`.chords`), so a write tried again after a lost connection, or a
task run twice, adds one job. A write that fails is tried ``RESULT_WRITE_ATTEMPTS`` times
before the task's job is handed back (the error raised, so the worker NACKs it). A write the
node refuses for want of reachable nodes (``-NOREPL ... (N reachable, M asked)``: nodes of the
cluster are down) is made at once with the copies it can have: a result with fewer copies
beats a job handed back to fail the same way until it is a dead letter.

A chord member's result is followed by its chord's check (:func:`write_result`, then
:func:`complete_chord`), before the member's job is acknowledged: see :mod:`.chords`.
"""

from __future__ import annotations

import logging
import re
from typing import Any

import trio

from ..client.worker import Reject, describe_error
from . import chords
from .message import (
    ChainSpec, ChainStep, ChordSpec, ErrorAt, GroupStep, Message, Outcome, Step, addjob_options, chain_key,
    chord_key, encode, encode_outcome, member_key, result_queue,
)  # fmt: skip
from .results import result_options
from .tracing import sendings

__all__ = ["write_result", "write_chain_failure", "add_next_in_chain", "complete_chord", "settle_member",
           "RESULT_WRITE_ATTEMPTS"]  # fmt: skip

log = logging.getLogger("disque_py.tasks")

#: attempts at writing a result before the job is handed back (NACK) instead
RESULT_WRITE_ATTEMPTS = 3

_REACHABLE = re.compile(r"\((\d+) reachable, \d+ asked\)")


async def write_result(client: Any, job: Any, message: Message, serializer: str, outcome: Outcome,
                       reject_unserializable: bool = False) -> None:  # fmt: skip
    """Write the result job, if the message asked for one (see :mod:`.results`). A value the
    serializer cannot carry: an error result instead, and TypeError raised (or, with
    ``reject_unserializable``, Reject: the task succeeded, running it again cannot help).
    A chord's member then checks its chord (:func:`complete_chord`)."""
    spec = message.result
    if spec is None:
        return
    queue = spec.queue or result_queue(job.id)
    try:
        body = encode_outcome(outcome, serializer)
    except TypeError as exc:
        text = "the result of task %s is %s" % (message.task, exc)
        body = encode_outcome(Outcome(False, None, "TypeError", text), serializer)
        if not reject_unserializable:
            raise
        await _add(client, queue, body, result_options(spec.ttl), job)
        await complete_chord(client, job, message, serializer)
        raise Reject("TypeError: " + text) from None
    await _add(client, queue, body, result_options(spec.ttl), job)
    await complete_chord(client, job, message, serializer)


async def write_chain_failure(client: Any, job: Any, chain: ChainSpec, serializer: str, outcome: Outcome) -> None:
    """The chain ends with this failure: its waiter reads the error in the chain's final queue."""
    await _add(client, chain.final, encode_outcome(outcome, serializer), result_options(chain.ttl), job)


async def add_next_in_chain(client: Any, job: Any, message: Message, serializer: str, value: Any) -> None:
    """Add the chain's next task (see :mod:`.message`), given ``value`` first, before this
    job is acknowledged; its key ``chain:<job ID>`` adds it once if this task ran twice (a
    group's members: each its own key, ``chord:<group ID>:<i>``)."""
    chain = message.chain
    assert chain is not None
    # in a traced run: a send span for each job (a group's members each theirs), its context in
    # its body (tasks/tracing.py)
    with sendings(_traced_as(chain.then[0])) as sends:
        try:
            jobs = _next_jobs(chain.then, chain.final, chain.ttl, [send.meta(message.meta) for send in sends],
                              serializer, value, (), chain_key(job.id))  # fmt: skip
        except TypeError as exc:
            text = "the value task %s passes down its chain is %s" % (message.task, exc)
            await write_chain_failure(client, job, chain, serializer, Outcome(False, None, "TypeError", text))
            raise Reject("TypeError: " + text) from None
        for send, (queue, body, options) in zip(sends, jobs):
            send.sent(await _add(client, queue, body, options, job))


def _traced_as(step: Step) -> list[tuple[str, str]]:
    """The name and queue of each send span of a next step: its task's, or each member's of a group."""
    if isinstance(step, GroupStep):
        return [(m.task, m.queue) for m in step.members]
    return [(step.task, step.queue)]


def _next_jobs(then: tuple[Step, ...], final: str, ttl: int, metas: list[dict[str, Any]], serializer: str,
               value: Any, errors: tuple[ErrorAt, ...], key: str) -> list[tuple[str, bytes, dict[str, Any]]]:  # fmt: skip
    """The ADDJOBs of ``then[0]`` given ``value`` (``(queue, body, add_job options)``): one task
    with ``key`` and the rest of ``then`` as its chain, or a group's members, each with its own
    key and the chord that joins them (the rest of ``then`` as what follows it); ``metas``, the
    meta of each (:func:`_traced_as`'s order). TypeError when ``value`` cannot be carried, before
    anything is added."""
    step, rest = then[0], then[1:]
    if isinstance(step, GroupStep):
        chord = ChordSpec(step.id, chords.member_runs([m.queue for m in step.members]), step.on_error, rest, final, ttl)
        return [_step_job(m, value, errors, meta, serializer, None, chord, member_key(step.id, i))
                for i, (m, meta) in enumerate(zip(step.members, metas))]  # fmt: skip
    chain = ChainSpec(rest, final, ttl) if rest else None
    return [_step_job(step, value, errors, metas[0], serializer, chain, None, key)]


def _step_job(step: ChainStep, value: Any, errors: tuple[ErrorAt, ...], meta: dict[str, Any], serializer: str,
              chain: ChainSpec | None, chord: ChordSpec | None, key: str) -> tuple[str, bytes, dict[str, Any]]:  # fmt: skip
    if step.immutable:  # task.si(...): its own arguments only
        args, errors = tuple(step.args), ()
    else:
        args = (value,) + tuple(step.args)
    body = encode(Message(step.task, args, step.kwargs, step.result, meta, chain, chord, errors), serializer)
    options = addjob_options(step.addjob)
    options["dedup"] = key  # the chain's or the chord's key, whatever the step says
    return step.queue, body, options


async def complete_chord(client: Any, job: Any, message: Message, serializer: str) -> None:
    """After a chord member's result is written: when every member has its result, add what
    follows the chord (its callback, given the values in order, with the key ``chord:<group
    ID>``; a group's members), or write the chord's outcome to its final queue (a chord that
    fails, one with nothing after it). Nothing when some member has no result yet: the last
    one's check completes it. ChordPending when too many nodes were silent to tell."""
    spec = message.chord
    if spec is None:
        return
    outcomes = await chords.gather(client, spec)
    if outcomes is None:
        return
    ok = all(o.ok for o in outcomes)
    if not ok and (spec.on_error == "fail" or not spec.then):
        await _add(client, spec.final, encode_outcome(chords.chord_failure(spec, outcomes), serializer),
                   result_options(spec.ttl), job)  # fmt: skip
        return
    values = [o.value if o.ok else None for o in outcomes]
    ids = chords.member_ids(spec)
    errors = tuple(ErrorAt(i, o.error_type or "Exception", o.error_message or "", ids[i])
                   for i, o in enumerate(outcomes) if not o.ok)  # fmt: skip
    with sendings(_traced_as(spec.then[0]) if spec.then else []) as sends:  # the callback's send span (or its group's)
        await _add_after_chord(client, job, spec, sends, message.meta, serializer, values, errors)


async def _add_after_chord(client: Any, job: Any, spec: ChordSpec, sends: list[Any], meta: dict[str, Any],
                           serializer: str, values: list[Any], errors: tuple[ErrorAt, ...]) -> None:  # fmt: skip
    """What follows a chord whose members all have a result (see :func:`complete_chord`)."""
    jobs: list[tuple[str, bytes, dict[str, Any]]] = []
    text = ""
    # the member that completes the chord may be any of them: values another member's serializer
    # carried (msgpack's bytes) are carried by msgpack, whichever it is
    for form in dict.fromkeys((serializer, "msgpack")):
        try:
            if not spec.then:  # the last step of a chain: the values are its result
                jobs = [(spec.final, encode_outcome(Outcome(True, values), form), result_options(spec.ttl))]
            else:
                jobs = _next_jobs(spec.then, spec.final, spec.ttl, [send.meta(meta) for send in sends], form, values,
                                  errors, chord_key(spec.id))  # fmt: skip
            break
        except TypeError as exc:  # every check finds the same: the chord ends here
            text = "the values of chord %s are %s" % (spec.id, exc)
    if not jobs:
        jobs = [(spec.final, encode_outcome(Outcome(False, None, "TypeError", text), serializer),
                 result_options(spec.ttl))]  # fmt: skip
    for i, (queue, body, options) in enumerate(jobs):  # the chord's outcome, if that is all: no send span
        job_id = await _add(client, queue, body, options, job)
        if i < len(sends) and spec.then and queue != spec.final:
            sends[i].sent(job_id)


async def settle_member(client: Any, job: Any, message: Message, serializer: str, last: int) -> bool:
    """A chord member before it runs: True when it must not run (acknowledge it; Reject raised
    for an error), False to run it. Its first delivery runs, with no read; later:

    * Its result is there: a delivery before this one wrote it, and its worker died or lost
      the connection before the acknowledgement. The chord is checked again (that delivery
      may have died before its check) and the task does not run again.
    * No result, and this delivery comes after its last run (``last``, :func:`.chords.last_run`):
      the worker of the last run was lost. Its result is a ``WorkerLost`` error, written now,
      then the chord is checked, and the job dead-lettered.

    A member sent back from the dead letters is a new job, whose body names the member's result
    queue, not its own: it runs when the member has no result (its run writes it and checks),
    and is acknowledged without running when the member has one: its chord used that one, and
    may be over long ago (its callback's key forgotten: a check now would add it again).
    """
    assert message.result is not None  # a chord's member always has one (message.decode)
    queue = message.result.queue or result_queue(job.id)
    sent_back = queue != result_queue(job.id)
    if job.attempt == 1 and not sent_back:
        return False
    outcome = await chords.own_result(client, queue)
    if outcome is None:
        if job.attempt <= last:
            return False
        outcome = Outcome(False, None, "WorkerLost", "the worker of its last run (delivery %d) was lost before it "
                          "wrote a result" % last)  # fmt: skip
        await write_result(client, job, message, serializer, outcome)
    elif sent_back:
        log.info("task %s (%s), a member of chord %s sent back: its result was written before, not run again",
                 message.task, job.id, message.chord.id if message.chord else "?")  # fmt: skip
        return True
    else:
        await complete_chord(client, job, message, serializer)
    if not outcome.ok:
        raise Reject("%s: %s" % (outcome.error_type, outcome.error_message))
    return True


def _fewer_copies(exc: Exception, replicate: Any) -> int | None:
    """The copies to ask for after ``-NOREPL ... (N reachable, M asked)``: N, when it is fewer
    than asked (None: not that refusal)."""
    text = str(exc)
    found = _REACHABLE.search(text) if "NOREPL" in text else None
    if found is None:
        return None
    reachable = int(found.group(1))
    return reachable if 1 <= reachable < (replicate or 1 << 30) else None


async def _add(client: Any, queue: str, body: bytes, options: dict[str, Any], job: Any) -> str:
    """One ADDJOB with a DEDUP key, tried again (written once) up to RESULT_WRITE_ATTEMPTS times;
    with the copies the nodes can make when they say too few are reachable. Its job ID."""
    attempt = 0
    while True:
        try:
            return await client.add_job(queue, body, **options)
        except Exception as exc:  # noqa: BLE001 - tried again (DEDUP: written once)
            fewer = _fewer_copies(exc, options.get("replicate"))
            if fewer is not None:
                log.warning("writing to %s for %s: %s; with %d copies", queue, job.id, exc, fewer)
                options = {**options, "replicate": fewer}
                continue
            attempt += 1
            if attempt == RESULT_WRITE_ATTEMPTS:
                log.error("writing the result of %s failed: %s: handed back", job.id, describe_error(exc))
                raise
            await trio.sleep(0.2 * attempt)
