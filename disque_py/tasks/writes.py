"""What a task's run writes to the cluster: its result job, and a chain's next task.

Each is one ADDJOB through the client's own ``add_job`` with a DEDUP key (``result`` in the
task's result queue, :mod:`.results`; ``chain:<job ID>`` for a chain's next task,
:mod:`.message`), so a write tried again after a lost connection, or a task run twice, adds
one job. A write that fails is tried ``RESULT_WRITE_ATTEMPTS`` times before the task's job is
handed back (the error raised, so the worker NACKs it).
"""

from __future__ import annotations

import logging
from typing import Any

import trio

from ..client.worker import Reject, describe_error
from .message import ChainSpec, Message, Outcome, addjob_options, chain_key, encode, encode_outcome, result_queue
from .results import result_options
from .tracing import sending

__all__ = ["write_result", "write_chain_failure", "add_next_in_chain", "RESULT_WRITE_ATTEMPTS"]

log = logging.getLogger("disque_py.tasks")

#: attempts at writing a result before the job is handed back (NACK) instead
RESULT_WRITE_ATTEMPTS = 3


async def write_result(client: Any, job: Any, message: Message, serializer: str, outcome: Outcome,
                       reject_unserializable: bool = False) -> None:  # fmt: skip
    """Write the result job, if the message asked for one (see :mod:`.results`). A value the
    serializer cannot carry: an error result instead, and TypeError raised (or, with
    ``reject_unserializable``, Reject: the task succeeded, running it again cannot help)."""
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
        raise Reject("TypeError: " + text) from None
    await _add(client, queue, body, result_options(spec.ttl), job)


async def write_chain_failure(client: Any, job: Any, chain: ChainSpec, serializer: str, outcome: Outcome) -> None:
    """The chain ends with this failure: its waiter reads the error in the chain's final queue."""
    await _add(client, chain.final, encode_outcome(outcome, serializer), result_options(chain.ttl), job)


async def add_next_in_chain(client: Any, job: Any, message: Message, serializer: str, value: Any) -> None:
    """Add the chain's next task (see :mod:`.message`), given ``value`` first, before this
    job is acknowledged; its key ``chain:<job ID>`` adds it once if this task ran twice."""
    chain = message.chain
    assert chain is not None
    step, rest = chain.then[0], chain.then[1:]
    args = tuple(step.args) if step.immutable else (value,) + tuple(step.args)  # task.si(...): its own only
    with sending(step.task, step.queue) as send:  # in a traced run: a send span, its context in the body
        nxt = Message(step.task, args, step.kwargs, step.result, send.meta(message.meta),
                      ChainSpec(rest, chain.final, chain.ttl) if rest else None)  # fmt: skip
        try:
            body = encode(nxt, serializer)
        except TypeError as exc:
            text = "the value task %s passes down its chain is %s" % (message.task, exc)
            await write_chain_failure(client, job, chain, serializer, Outcome(False, None, "TypeError", text))
            raise Reject("TypeError: " + text) from None
        options = addjob_options(step.addjob)
        options["dedup"] = chain_key(job.id)  # the chain's key, whatever the step says
        send.sent(await _add(client, step.queue, body, options, job))


async def _add(client: Any, queue: str, body: bytes, options: dict[str, Any], job: Any) -> str:
    """One ADDJOB with a DEDUP key, tried again (written once) up to RESULT_WRITE_ATTEMPTS times; its job ID."""
    for attempt in range(RESULT_WRITE_ATTEMPTS):
        try:
            return await client.add_job(queue, body, **options)
        except Exception as exc:  # noqa: BLE001 - tried again (DEDUP: written once)
            if attempt == RESULT_WRITE_ATTEMPTS - 1:
                log.error("writing the result of %s failed: %s: handed back", job.id, describe_error(exc))
                raise
            await trio.sleep(0.2 * (attempt + 1))
