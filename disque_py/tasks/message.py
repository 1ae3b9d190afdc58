"""The documented job body of a task and of its result, and the serializers.

A task's job body (JSON by default, msgpack per task) is one map::

    {"v": 1,                          # format version (optional; 1 if missing)
     "task": "myapp.tasks.add",       # the task's name (required)
     "args": [1, 2],                  # positional arguments (optional, default [])
     "kwargs": {"x": 3},              # keyword arguments (optional, default {})
     "result": {"ttl": 300},          # store the result for 300 s (optional; null/missing: none)
     "meta": {...},                   # anything the producer wants the hooks to see (optional);
                                      # "traceparent"/"tracestate": W3C trace context (.tracing)
     "chain": {...}}                  # the tasks to run after this one (optional; below)

``result`` may also name the queue to write the result to (``{"ttl": 300, "queue":
"my-results"}``); without it the result goes to the queue ``@result:<job ID>``
(:func:`result_queue`), so a producer that knows only the ID from ADDJOB finds it. A name
that starts with ``@`` is one of the cluster's own queues (``core.constants.INTERNAL_QUEUE_PREFIX``):
a queue in every respect, but QSCAN, ``disque-py top``, the admin page and /metrics leave it
out unless asked. Workers before that wrote to ``result:<job ID>``
(:data:`LEGACY_RESULT_QUEUE_PREFIX`), which waiters still read (:mod:`.results`).
A producer in another language needs nothing else::

    redis-cli ADDJOB default '{"v":1,"task":"myapp.tasks.add","args":[1,2],"result":{"ttl":60}}' 0

A chain (``add.s(1, 2) | mul.s(10)``) rides in its first task's body::

    "chain": {"then": [{"task": "myapp.tasks.mul", "queue": "math", "args": [10],
                        "kwargs": {}, "addjob": [5000, "RETRY", 300, "MAXDELIVER", 4],
                        "result": {"ttl": 300}}],
              "final": "@result:chain-...",        # the last task's result queue
              "ttl": 300}                          # its result TTL (errors are written there)

When the task succeeds, the worker adds the first of ``then`` with the value as its first
argument (not a step marked ``"immutable": true``, a ``task.si(...)``: its own arguments only),
the rest of ``then`` as its chain, ADDJOB's options as ``addjob`` lists them (its timeout first)
and the deduplication key ``chain:<this job's ID>``: a task run twice adds its next one once,
and the producer knows every ID beforehand (``ids.dedup_job_id``). When a task of the
chain fails for good, its error is written to ``final`` as well.

A chain's step may be a group (``add.s(1) | group(...) | total.s()``): its item in ``then`` is
``{"group": {"id": "<group ID>", "members": [step, ...], "on_error": "fail"}}``, and the worker
adds every member (the value first, unless immutable) with the key ``chord:<group ID>:<i>`` and,
in its body, the chord that joins them::

    "chord": {"id": "<group ID>",                   # the members' keys: chord:<id>:<i>
              "members": [["math", 20]],            # their queues, in runs: member i's ID follows
              "on_error": "fail",                   # or "call"
              "then": [...],                        # the callback and what follows it (may be empty)
              "final": "@result:chain-...",         # the last task's result queue
              "ttl": 300}                           # its result TTL

Every member's ID follows from its queue and key (``ids.dedup_job_id``), its result's from its
ID (its body names that result queue, so that the member sent back as a new job, a dead letter
requeued, still writes the result its chord reads); the worker that writes a member's result
checks them all, and the one that finds every
result adds ``then[0]`` (given the list of values) with the key ``chord:<group ID>``
(:mod:`.chords`). A callback called with errors (``"on_error": "call"``) carries them as
``"errors": [{"at": 2, "type": "ValueError", "message": "boom", "job": "D-..."}]``: the items
of its first argument at those places are the members' errors (the worker passes a
``TaskError`` there).

The msgpack form is the same map packed; the worker tells the two apart by the
first byte (``{``, after any blanks: JSON; a msgpack map header: msgpack), and
writes the result in the form the task came in.

A result is a job too, in the same serializer::

    {"v": 1, "ok": true,  "value": 3}
    {"v": 1, "ok": false, "error": {"type": "ValueError", "message": "boom",
                                    "traceback": "Traceback (most recent call last):\n..."}}

``traceback`` (optional: a writer may leave it out, a reader may find none) is the task's
formatted traceback, its tail at most 16 KiB (the worker's ``trace_of``).

This module is pure (no I/O): the tests read it directly.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any, TypeGuard

from ..core.constants import INTERNAL_QUEUE_PREFIX

__all__ = [
    "FORMAT_VERSION",
    "SERIALIZERS",
    "RESULT_QUEUE_PREFIX",
    "LEGACY_RESULT_QUEUE_PREFIX",
    "MessageError",
    "ResultSpec",
    "ChainStep",
    "GroupStep",
    "ChainSpec",
    "ChordSpec",
    "ErrorAt",
    "ON_ERROR",
    "Message",
    "Outcome",
    "detect",
    "dumps",
    "loads",
    "encode",
    "decode",
    "encode_outcome",
    "decode_outcome",
    "result_queue",
    "chain_result_queue",
    "legacy_result_queue",
    "chain_key",
    "chord_key",
    "member_key",
    "addjob_options",
]

FORMAT_VERSION = 1
SERIALIZERS = ("json", "msgpack")
#: a task's result queue is ``@result:<job ID>``: one of the cluster's own queues (see above)
RESULT_QUEUE_PREFIX = INTERNAL_QUEUE_PREFIX.decode("ascii") + "result:"
#: where workers wrote a task's result before it moved to the cluster's own queues; a waiter
#: still reads it (QPEEK only), so a result an older worker wrote during an upgrade is found
LEGACY_RESULT_QUEUE_PREFIX = "result:"
#: the longest result TTL a body may ask for (seconds): 30 days
MAX_RESULT_TTL = 30 * 86400
#: what a chord does when a member failed: fail the chord, or call its callback with the errors
ON_ERROR = ("fail", "call")
#: the most members a chord body may name (a hostile body must not make a worker loop for good)
MAX_MEMBERS = 100_000


class MessageError(ValueError):
    """A body that is not a task message of this format (the job can never run)."""


def chain_key(job_id: str) -> str:
    """The deduplication key of the task a chain adds after the job ``job_id``."""
    return "chain:" + job_id


def member_key(group_id: str, index: int) -> str:
    """The deduplication key of member ``index`` of the group (chord) ``group_id``."""
    return "chord:%s:%d" % (group_id, index)


def chord_key(group_id: str) -> str:
    """The deduplication key of what a chord adds once its members are done (its callback)."""
    return "chord:" + group_id


def result_queue(job_id: str) -> str:
    """The queue a task's result goes to when its body names none: ``@result:<job ID>``."""
    return RESULT_QUEUE_PREFIX + job_id


def chain_result_queue(token: str) -> str:
    """The queue of a chain's last result (``@result:chain-<token>``), named by its sender."""
    return RESULT_QUEUE_PREFIX + "chain-" + token


def legacy_result_queue(queue: str) -> str | None:
    """Where a worker of the earlier layout wrote the result that now goes to ``queue``
    (``result:<job ID>`` for ``@result:<job ID>``); None for any other queue (a chain's own
    queue, or one the body names: the body says where, whoever writes it)."""
    if not queue.startswith(RESULT_QUEUE_PREFIX):
        return None
    rest = queue[len(RESULT_QUEUE_PREFIX):]
    return LEGACY_RESULT_QUEUE_PREFIX + rest if len(rest) == 40 and rest.startswith("D-") else None


def detect(body: bytes) -> str:
    """``"json"`` or ``"msgpack"`` from the first byte; MessageError for anything else."""
    stripped = body.lstrip(b" \t\r\n")
    if not stripped:
        raise MessageError("empty body")
    first = stripped[0]
    if first == 0x7B:  # '{'
        return "json"
    if 0x80 <= first <= 0x8F or first in (0xDE, 0xDF):  # fixmap, map16, map32
        return "msgpack"
    raise MessageError("body is neither a JSON object nor a msgpack map (first byte 0x%02x)" % first)


def dumps(obj: Any, serializer: str) -> bytes:
    """``obj`` serialized; TypeError (naming the culprit) for what the serializer cannot carry."""
    if serializer == "json":
        try:
            return json.dumps(obj, separators=(",", ":"), ensure_ascii=False, allow_nan=False).encode("utf-8")
        except (TypeError, ValueError) as exc:
            raise TypeError("not JSON serializable: %s" % exc) from None
    if serializer == "msgpack":
        import msgpack

        try:
            return msgpack.packb(obj, use_bin_type=True)
        except (TypeError, ValueError, OverflowError) as exc:
            raise TypeError("not msgpack serializable: %s" % exc) from None
    raise ValueError("unknown serializer %r (expected one of %s)" % (serializer, ", ".join(SERIALIZERS)))


def loads(body: bytes) -> tuple[Any, str]:
    """The object in ``body`` and the serializer it was written with."""
    serializer = detect(body)
    try:
        if serializer == "json":
            return json.loads(body), serializer
        import msgpack

        return msgpack.unpackb(body, raw=False, strict_map_key=False), serializer
    except Exception as exc:  # noqa: BLE001 - any decoding failure is a bad body
        raise MessageError("unreadable %s body: %s" % (serializer, exc)) from None


@dataclass(frozen=True, slots=True)
class ResultSpec:
    ttl: int
    queue: str | None = None  # None: result_queue(job id)


@dataclass(frozen=True, slots=True)
class ChainStep:
    """A task to run after another, with the previous one's value as its first argument."""

    task: str
    queue: str
    args: tuple[Any, ...] = ()
    kwargs: dict[str, Any] = field(default_factory=dict)
    addjob: tuple[Any, ...] = ()  # ADDJOB's words after the body: timeout, then options
    result: ResultSpec | None = None
    immutable: bool = False  # given its own arguments only, not the previous task's value (task.si)


#: ADDJOB's options that take one value, as the clients' ``add_job`` keywords: (keyword, type).
_ADDJOB_VALUES: dict[str, tuple[str, type]] = {
    "REPLICATE": ("replicate", int), "DELAY": ("delay", int), "RETRY": ("retry", int), "TTL": ("ttl", int),
    "MAXLEN": ("maxlen", int), "MAXDELIVER": ("maxdeliver", int), "DEADLETTER": ("deadletter", str),
    "DEDUP": ("dedup", str),
}  # fmt: skip


def _word_number(word: Any, kind: type) -> Any:
    if _is_int(word) or (kind is float and isinstance(word, float)):
        return word
    if isinstance(word, str):
        try:
            return int(word)
        except ValueError:
            if kind is float:
                try:
                    return float(word)
                except ValueError:
                    pass
    raise MessageError("%r is not a number in a chained task's ADDJOB options" % (word,))


def addjob_options(words: tuple[Any, ...] | list[Any]) -> dict[str, Any]:
    """A chain step's ``addjob`` words (ADDJOB's after the body: its timeout, then options) as the
    clients' ``add_job`` keywords (``timeout_ms``, ``retry``, ``backoff``...), so that the worker
    adds the step with the client's own ADDJOB; MessageError for a word that is none of ADDJOB's."""
    if not words:
        return {}
    options: dict[str, Any] = {"timeout_ms": _word_number(words[0], int)}
    i = 1
    while i < len(words):
        name = str(words[i]).upper()
        if name == "ASYNC":
            options["async_"] = True
            i += 1
        elif name == "BACKOFF" and i + 2 < len(words):
            options["backoff"] = (_word_number(words[i + 1], float), _word_number(words[i + 2], float))
            i += 3
        elif name in _ADDJOB_VALUES and i + 1 < len(words):
            keyword, kind = _ADDJOB_VALUES[name]
            value = words[i + 1]
            options[keyword] = _word_number(value, int) if kind is int else str(value)
            i += 2
        else:
            raise MessageError("%r is not an ADDJOB option (with its values) in a chained task" % (words[i],))
    return options


@dataclass(frozen=True, slots=True)
class GroupStep:
    """A group in a chain: its members are added together, each with the chord that joins them
    (:class:`ChordSpec`, what follows the group as its ``then``)."""

    id: str  # the group's ID: its members' keys chord:<id>:<i>, its callback's chord:<id>
    members: tuple[ChainStep, ...]
    on_error: str = "fail"


#: a step of a chain: a task, or a group
Step = ChainStep | GroupStep


@dataclass(frozen=True, slots=True)
class ChainSpec:
    then: tuple[Step, ...]
    final: str  # the last task's result queue
    ttl: int  # its result TTL


@dataclass(frozen=True, slots=True)
class ChordSpec:
    """What a member of a chord carries: the group's ID and its members' queues (from which
    every member's ID follows), the failure policy and what runs once all are done."""

    id: str
    members: tuple[tuple[str, int], ...]  # (queue, count) runs, in the members' order
    on_error: str
    then: tuple[Step, ...]  # the callback and what follows it; empty: the values are the final result
    final: str
    ttl: int

    @property
    def size(self) -> int:
        return sum(count for _, count in self.members)


@dataclass(frozen=True, slots=True)
class ErrorAt:
    """A member's error in the list a chord's callback is given (``on_error="call"``)."""

    at: int  # its place in the callback's first argument
    type: str
    message: str
    job: str  # the member's job ID


@dataclass(frozen=True, slots=True)
class Message:
    task: str
    args: tuple[Any, ...] = ()
    kwargs: dict[str, Any] = field(default_factory=dict)
    result: ResultSpec | None = None
    meta: dict[str, Any] = field(default_factory=dict)
    chain: ChainSpec | None = None
    chord: ChordSpec | None = None
    errors: tuple[ErrorAt, ...] = ()  # the items of args[0] that are a chord's members' errors


def _result_obj(spec: ResultSpec) -> dict[str, Any]:
    obj: dict[str, Any] = {"ttl": spec.ttl}
    if spec.queue is not None:
        obj["queue"] = spec.queue
    return obj


def encode(message: Message, serializer: str = "json") -> bytes:
    obj: dict[str, Any] = {"v": FORMAT_VERSION, "task": message.task, "args": list(message.args),
                           "kwargs": message.kwargs}  # fmt: skip
    if message.result is not None:
        obj["result"] = _result_obj(message.result)
    if message.meta:
        obj["meta"] = message.meta
    if message.chain is not None:
        chain = message.chain
        obj["chain"] = {"then": [_step_obj(st) for st in chain.then], "final": chain.final, "ttl": chain.ttl}
    if message.chord is not None:
        chord = message.chord
        obj["chord"] = {"id": chord.id, "members": [[q, n] for q, n in chord.members], "on_error": chord.on_error,
                        "then": [_step_obj(st) for st in chord.then], "final": chord.final, "ttl": chord.ttl}  # fmt: skip
    if message.errors:
        obj["errors"] = [{"at": e.at, "type": e.type, "message": e.message, "job": e.job} for e in message.errors]
    return dumps(obj, serializer)


def _step_obj(st: Step) -> dict[str, Any]:
    if isinstance(st, GroupStep):
        return {"group": {"id": st.id, "members": [_step_obj(m) for m in st.members], "on_error": st.on_error}}
    return {"task": st.task, "queue": st.queue, "args": list(st.args), "kwargs": st.kwargs, "addjob": list(st.addjob),
            "result": None if st.result is None else _result_obj(st.result),
            **({"immutable": True} if st.immutable else {})}  # fmt: skip


def _is_int(value: Any) -> TypeGuard[int]:
    return isinstance(value, int) and not isinstance(value, bool)


def decode(body: bytes) -> tuple[Message, str]:
    """A task message and its serializer; MessageError saying what is wrong otherwise."""
    obj, serializer = loads(body)
    if not isinstance(obj, dict):
        raise MessageError("the body is not a map")
    version = obj.get("v", FORMAT_VERSION)
    if version != FORMAT_VERSION:
        raise MessageError("unsupported format version %r (this worker reads %d)" % (version, FORMAT_VERSION))
    unknown = set(obj) - {"v", "task", "args", "kwargs", "result", "meta", "chain", "chord", "errors"}
    if unknown:
        raise MessageError("unknown field(s): %s" % ", ".join(sorted(map(str, unknown))))
    task = obj.get("task")
    if not isinstance(task, str) or not task:
        raise MessageError("'task' must be a non-empty string")
    args, kwargs = _args(obj, "")
    result = _result_spec(obj.get("result"), "result")
    meta = obj.get("meta")
    if meta is None:
        meta = {}
    if not isinstance(meta, dict):
        raise MessageError("'meta' must be a map")
    chain = _chain_spec(obj.get("chain"))
    chord = _chord_spec(obj.get("chord"))
    if chord is not None:
        if chain is not None:
            raise MessageError("a chord's member carries no 'chain': what follows is the chord's 'then'")
        if result is None:
            raise MessageError("a chord's member needs its result ('result': its TTL and queue)")
    errors = _errors(obj.get("errors"), args)
    return Message(task, args, kwargs, result, meta, chain, chord, errors), serializer


def _args(obj: dict, where: str) -> tuple[tuple[Any, ...], dict[str, Any]]:
    args = obj.get("args", [])
    if args is None:
        args = []
    if not isinstance(args, list):
        raise MessageError("'%sargs' must be an array" % where)
    kwargs = obj.get("kwargs", {})
    if kwargs is None:
        kwargs = {}
    if not isinstance(kwargs, dict) or not all(isinstance(k, str) for k in kwargs):
        raise MessageError("'%skwargs' must be a map with string keys" % where)
    return tuple(args), kwargs


def _result_spec(spec: Any, name: str) -> ResultSpec | None:
    if spec is None:
        return None
    if not isinstance(spec, dict):
        raise MessageError("'%s' must be a map or null" % name)
    ttl = spec.get("ttl")
    if not _is_int(ttl) or not 1 <= ttl <= MAX_RESULT_TTL:
        raise MessageError("'%s.ttl' must be an integer of seconds in [1, %d]" % (name, MAX_RESULT_TTL))
    queue = spec.get("queue")
    if queue is not None and (not isinstance(queue, str) or not queue):
        raise MessageError("'%s.queue' must be a non-empty string" % name)
    if set(spec) - {"ttl", "queue"}:
        raise MessageError("unknown field(s) in '%s': %s" % (name, ", ".join(sorted(map(str, set(spec) - {"ttl", "queue"})))))
    return ResultSpec(ttl, queue)


_STEP_FIELDS = frozenset({"task", "queue", "args", "kwargs", "addjob", "result", "immutable"})


def _final_and_ttl(obj: dict, name: str) -> tuple[str, int]:
    final = obj.get("final")
    if not isinstance(final, str) or not final:
        raise MessageError("'%s.final' must be a non-empty string" % name)
    ttl: Any = obj.get("ttl")
    if not _is_int(ttl) or not 1 <= ttl <= MAX_RESULT_TTL:
        raise MessageError("'%s.ttl' must be an integer of seconds in [1, %d]" % (name, MAX_RESULT_TTL))
    return final, ttl


def _unknown(obj: dict, allowed: Any, name: str) -> None:
    if set(obj) - set(allowed):
        raise MessageError("unknown field(s) in '%s': %s" % (name, ", ".join(sorted(map(str, set(obj) - set(allowed))))))


def _chain_spec(obj: Any) -> ChainSpec | None:
    if obj is None:
        return None
    if not isinstance(obj, dict):
        raise MessageError("'chain' must be a map or null")
    _unknown(obj, ("then", "final", "ttl"), "chain")
    then = obj.get("then")
    if not isinstance(then, list) or not then:
        raise MessageError("'chain.then' must be a non-empty array")
    final, ttl = _final_and_ttl(obj, "chain")
    return ChainSpec(_steps(then, "chain.then"), final, ttl)


def _steps(then: list, name: str, groups: bool = True) -> tuple[Step, ...]:
    steps: list[Step] = []
    for i, st in enumerate(then):
        where = "%s[%d]" % (name, i)
        if not isinstance(st, dict):
            raise MessageError("'%s' must be a map" % where)
        if groups and "group" in st:
            _unknown(st, ("group",), where)
            steps.append(_group_step(st["group"], where + ".group"))
        else:
            steps.append(_task_step(st, where))
    return tuple(steps)


def _task_step(st: dict, name: str) -> ChainStep:
    where = name + "."
    _unknown(st, _STEP_FIELDS, name)
    task, queue = st.get("task"), st.get("queue")
    if not isinstance(task, str) or not task:
        raise MessageError("'%stask' must be a non-empty string" % where)
    if not isinstance(queue, str) or not queue:
        raise MessageError("'%squeue' must be a non-empty string" % where)
    args, kwargs = _args(st, where)
    addjob = st.get("addjob", [])
    if (not isinstance(addjob, list) or not addjob or not _is_int(addjob[0]) or addjob[0] < 0
            or not all(isinstance(w, str) or _is_int(w) for w in addjob)):  # fmt: skip
        raise MessageError("'%saddjob' must be an array: a timeout (ms), then ADDJOB's options" % where)
    immutable = st.get("immutable", False)
    if not isinstance(immutable, bool):
        raise MessageError("'%simmutable' must be true or false" % where)
    return ChainStep(task, queue, args, kwargs, tuple(addjob), _result_spec(st.get("result"), where + "result"), immutable)


def _group_id(value: Any, name: str) -> str:
    if not isinstance(value, str) or not 1 <= len(value) <= 128:
        raise MessageError("'%s' must be a string of 1 to 128 characters" % name)
    return value


def _on_error(value: Any, name: str) -> str:
    if value not in ON_ERROR:
        raise MessageError("'%s' must be one of %s" % (name, ", ".join('"%s"' % p for p in ON_ERROR)))
    return value


def _group_step(obj: Any, name: str) -> GroupStep:
    if not isinstance(obj, dict):
        raise MessageError("'%s' must be a map" % name)
    _unknown(obj, ("id", "members", "on_error"), name)
    members = obj.get("members")
    if not isinstance(members, list) or not members or len(members) > MAX_MEMBERS:
        raise MessageError("'%s.members' must be an array of 1 to %d steps" % (name, MAX_MEMBERS))
    steps = _steps(members, name + ".members", groups=False)
    for i, st in enumerate(steps):
        assert isinstance(st, ChainStep)
        if st.result is None:
            raise MessageError("'%s.members[%d].result' must give the member's result (its TTL and queue)" % (name, i))
    return GroupStep(_group_id(obj.get("id"), name + ".id"), steps,  # type: ignore[arg-type]
                     _on_error(obj.get("on_error", "fail"), name + ".on_error"))  # fmt: skip


def _chord_spec(obj: Any) -> ChordSpec | None:
    if obj is None:
        return None
    if not isinstance(obj, dict):
        raise MessageError("'chord' must be a map or null")
    _unknown(obj, ("id", "members", "on_error", "then", "final", "ttl"), "chord")
    runs = obj.get("members")
    if not isinstance(runs, list) or not runs:
        raise MessageError("'chord.members' must be a non-empty array of [queue, count]")
    members: list[tuple[str, int]] = []
    for i, run in enumerate(runs):
        if (not isinstance(run, list) or len(run) != 2 or not isinstance(run[0], str) or not run[0]
                or not _is_int(run[1]) or run[1] < 1):  # fmt: skip
            raise MessageError("'chord.members[%d]' must be [queue, count], a non-empty queue and a count >= 1" % i)
        members.append((run[0], run[1]))
    if sum(n for _, n in members) > MAX_MEMBERS:
        raise MessageError("'chord.members' names more than %d members" % MAX_MEMBERS)
    then = obj.get("then", [])
    if not isinstance(then, list):
        raise MessageError("'chord.then' must be an array")
    final, ttl = _final_and_ttl(obj, "chord")
    return ChordSpec(_group_id(obj.get("id"), "chord.id"), tuple(members), _on_error(obj.get("on_error", "fail"),
                     "chord.on_error"), _steps(then, "chord.then"), final, ttl)  # fmt: skip


def _errors(obj: Any, args: tuple[Any, ...]) -> tuple[ErrorAt, ...]:
    if obj is None:
        return ()
    values = args[0] if args else None
    if not isinstance(obj, list) or not isinstance(values, list):
        raise MessageError("'errors' must be an array, and the first argument the list it names places of")
    errors = []
    for i, e in enumerate(obj):
        where = "errors[%d]" % i
        if not isinstance(e, dict):
            raise MessageError("'%s' must be a map" % where)
        _unknown(e, ("at", "type", "message", "job"), where)
        at: Any = e.get("at")
        if not _is_int(at) or not 0 <= at < len(values):
            raise MessageError("'%s.at' must be a place in the first argument (0 to %d)" % (where, len(values) - 1))
        if not all(isinstance(e.get(k, ""), str) for k in ("type", "message", "job")) or not e.get("type"):
            raise MessageError("'%s' needs a 'type' (and 'message', 'job') as strings" % where)
        errors.append(ErrorAt(at, e["type"], e.get("message", ""), e.get("job", "")))
    return tuple(errors)


@dataclass(frozen=True, slots=True)
class Outcome:
    """What a task's run left: its value, or its error's type name, message and traceback."""

    ok: bool
    value: Any = None
    error_type: str | None = None
    error_message: str | None = None
    error_traceback: str | None = None


def encode_outcome(outcome: Outcome, serializer: str = "json") -> bytes:
    if outcome.ok:
        return dumps({"v": FORMAT_VERSION, "ok": True, "value": outcome.value}, serializer)
    error = {"type": outcome.error_type or "Exception", "message": outcome.error_message or ""}
    if outcome.error_traceback is not None:
        error["traceback"] = outcome.error_traceback
    return dumps({"v": FORMAT_VERSION, "ok": False, "error": error}, serializer)


def decode_outcome(body: bytes) -> Outcome:
    obj, _ = loads(body)
    if not isinstance(obj, dict) or not isinstance(obj.get("ok"), bool):
        raise MessageError("not a task result")
    if obj["ok"]:
        return Outcome(True, obj.get("value"))
    error = obj.get("error")
    if not isinstance(error, dict):
        raise MessageError("a failed result without its 'error' map")
    trace = error.get("traceback")
    return Outcome(False, None, str(error.get("type") or "Exception"), str(error.get("message") or ""),
                   trace if isinstance(trace, str) and trace else None)  # fmt: skip
