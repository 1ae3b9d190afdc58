"""The client's commands, each declared once: argv, reply parser, options, docstring.

Each builder returns a :class:`Call`: the argv to send, a function turning
the raw RESP reply into the typed result, how long the server may
legitimately take before answering (a blocking GETJOB, a synchronous
ADDJOB), and whether the command may be sent again after the connection
broke without an answer. A few return a :class:`Batch` (commands pipelined
a round at a time: ``add_jobs``, ``pipeline``).

The builders named as the client's methods (``addjob`` for ``add_job``, ``get_jobs``, ``ack``,
``nack``, ``qscan`` ...) *are* those methods' declarations: the signature, the defaults and the
docstring of ``Client.add_job`` and ``AsyncClient.add_job`` are ``addjob``'s, because both
clients are built from them (:mod:`.base` lists them once: ``add_job = command(cmd.addjob)``).
Adding an option to a command is one edit here. The blocking client (:mod:`.sync`) and the
trio client (:mod:`.aio`) only move bytes; every bit of command semantics lives here, once.

Raw replies are what a RESP2 parser produces (hiredis or redis-py with
``protocol=2``): ``bytes`` for bulk and status strings, ``int``, ``list``,
``None``.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any, Generic, NamedTuple, TypeVar

from .errors import BatchError, DisqueError
from .model import DeliveryInfo, HelloInfo, Job, NodeInfo, decode_name, encode_body, encode_name
from .workers import parse_list as _parse_worker_list

__all__ = [
    "Call",
    "Batch",
    "DEFAULT_ADD_TIMEOUT_MS",
    "addjob",
    "addjob_argv",
    "group_name",
    "group_info",
    "group_list",
    "group_weight",
    "group_limit",
    "add_jobs",
    "add_json",
    "add_msgpack",
    "dedup_key",
    "dedup_keys",
    "get_jobs",
    "get_job",
    "getjob",
    "ack",
    "fast_ack",
    "enqueue",
    "dequeue",
    "release",
    "del_job",
    "ids_command",
    "nack",
    "nack_argv",
    "cut_reason",
    "cut_trace",
    "working",
    "show",
    "qlen",
    "qstat",
    "qpeek",
    "qscan",
    "jscan",
    "pause",
    "worker_beat",
    "worker_list",
    "worker_forget",
    "info",
    "hello",
    "ping",
    "execute",
    "pipeline",
    "run",
    "parse_hello",
    "parse_getjob",
    "parse_info",
]

T = TypeVar("T")

#: ADDJOB's ms-timeout when the caller gives none: how long a synchronous
#: replication may take before the node answers -NOREPL.
DEFAULT_ADD_TIMEOUT_MS = 5000

JOB_STATES = ("wait-repl", "active", "queued", "acked")
PAUSE_FLAGS = ("in", "out", "all", "none", "state", "bcast")


class Call(NamedTuple, Generic[T]):
    """One command: what to send and how to read the answer (an immutable value, cheap to
    make: one per command sent).

    ``blocks``: seconds the server may legitimately wait before answering
    (added to the client's socket timeout); ``None`` means without bound
    (GETJOB without TIMEOUT). ``retry_safe``: sending it again after a lost
    connection cannot do harm beyond what at-least-once delivery allows
    (only ADDJOB without a DEDUP key is not: it may create a duplicate).
    ``delivers``: for a command that hands out jobs (GETJOB), the jobs of its parsed
    result: a client with ``affinity`` watches which node made them.
    """

    argv: tuple[Any, ...]
    parse: Callable[[Any], T]
    blocks: float | None = 0.0
    retry_safe: bool = True
    delivers: Callable[[T], Sequence[Job]] | None = None


@dataclass(frozen=True, slots=True)
class Batch(Generic[T]):
    """Commands pipelined a round at a time (one round trip each), with failover.

    ``rounds``: each round's argvs and whether that round may be sent again after a lost
    connection (the replies already received are kept, the rest is resent); ``blocks`` as
    :class:`Call`'s, for every round; ``finish`` turns every reply, in order (error replies as
    :class:`~.errors.ServerError` values), into the result; ``delivers`` as :class:`Call`'s.
    """

    rounds: list[tuple[list[tuple[Any, ...]], bool]]
    blocks: float | None
    finish: Callable[[list[Any]], T]
    delivers: Callable[[T], Sequence[Job]] | None = None


def _identity(reply: Any) -> Any:
    return reply


def _str(reply: Any) -> str:
    return reply.decode("utf-8", "surrogateescape") if isinstance(reply, bytes) else str(reply)


def _int(reply: Any) -> int:
    return int(reply)


def _check_int(name: str, value: int | None, minimum: int) -> None:
    if value is None:
        return
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError("%s must be an int, not %s" % (name, type(value).__name__))
    if value < minimum:
        raise ValueError("%s must be >= %d, got %d" % (name, minimum, value))


def _ids(ids: Iterable[str | bytes]) -> list[bytes]:
    out = [encode_name(i) for i in ids]
    if not out:
        raise ValueError("at least one job ID is needed")
    return out


# ---------------------------------------------------------------- jobs


def addjob(
    queue: str | bytes,
    body: bytes | str,
    *,
    timeout_ms: int = DEFAULT_ADD_TIMEOUT_MS,
    replicate: int | None = None,
    delay: int | None = None,
    retry: int | None = None,
    ttl: int | None = None,
    maxlen: int | None = None,
    async_: bool = False,
    backoff: tuple[float, float] | None = None,
    maxdeliver: int | None = None,
    deadletter: str | bytes | None = None,
    priority: int | None = None,
    group: str | bytes | None = None,
    dedup: str | bytes | None = None,
) -> Call[str]:
    """ADDJOB: queue a job, return its ID. Times are in seconds except ``timeout_ms``.

    disque-py's delivery options (sent only when given): ``backoff=(min_s, max_s)``
    requeues the job after min x 2^(nacks-1) seconds (capped at max) on each plain
    NACK; ``maxdeliver=n`` dead-letters it on a failure of its n-th delivery, into
    ``deadletter`` (default ``<queue>.dead``). Disque's nodes refuse them.

    ``priority=p`` (0 to 9; ``ADDJOB ... PRIORITY p``, disque-py's, Disque has none): the
    higher first, first in first out within a priority; a job without one is at 5.

    ``group=name`` (1 to 128 bytes; ``ADDJOB ... GROUP name``, disque-py's): the groups of a
    queue take turns (by weight: ``group_weight``), first in first out within a group; a
    group's limits (``group_limit``) hold its jobs back, queued, while it is at them.

    ``dedup=key`` (str or bytes, 1 to 512 bytes; ``ADDJOB ... DEDUP key``): every ADDJOB of
    this queue and key, on any node, returns the same job ID and adds nothing, for the
    whole life of the job and the node's ``dedup-window`` (600 s by default) after it is
    acknowledged or deleted; the body and options of the later calls are ignored. Such a
    call is therefore always sent again after a lost connection or a reply timeout, on
    another node, even with ``retry_writes=False``: the retry answers the same ID. Without
    a key the call is sent exactly as before.
    """
    _check_int("timeout_ms", timeout_ms, 0)
    _check_int("replicate", replicate, 1)
    _check_int("delay", delay, 0)
    _check_int("retry", retry, 0)
    _check_int("ttl", ttl, 1)
    _check_int("maxlen", maxlen, 1)
    argv: list[Any] = [b"ADDJOB", encode_name(queue), encode_body(body), timeout_ms]
    if replicate is not None:
        argv += [b"REPLICATE", replicate]
    if delay is not None:
        argv += [b"DELAY", delay]
    if retry is not None:
        argv += [b"RETRY", retry]
    if ttl is not None:
        argv += [b"TTL", ttl]
    if maxlen is not None:
        argv += [b"MAXLEN", maxlen]
    if async_:
        argv.append(b"ASYNC")
    # disque-py's options (issue 46): sent only when given, so Disque's calls are unchanged
    if backoff is not None:
        try:
            low, high = backoff
        except (TypeError, ValueError):
            raise TypeError("backoff must be a (min_seconds, max_seconds) pair") from None
        low, high = _seconds("backoff min", low), _seconds("backoff max", high)
        if low > high:
            raise ValueError("backoff min (%s) is above its max (%s)" % (low, high))
        argv += [b"BACKOFF", low, high]
    if maxdeliver is not None:
        _check_int("maxdeliver", maxdeliver, 1)
        argv += [b"MAXDELIVER", maxdeliver]
    if deadletter is not None:
        argv += [b"DEADLETTER", encode_name(deadletter)]
    if priority is not None:
        _check_int("priority", priority, 0)
        if priority > 9:
            raise ValueError("priority must be from 0 to 9, got %d" % priority)
        argv += [b"PRIORITY", priority]
    if group is not None:
        argv += [b"GROUP", group_name(group)]
    if dedup is not None:  # last: add_jobs appends each body's own key there
        argv += [b"DEDUP", dedup_key(dedup)]
    blocks = None if timeout_ms == 0 and not async_ else timeout_ms / 1000.0
    return Call(tuple(argv), _str, blocks=blocks, retry_safe=dedup is not None)


def addjob_argv(queue: str | bytes, body: bytes | str, **options: Any) -> tuple[Any, ...]:
    """ADDJOB's argv alone; ``options`` are :func:`addjob`'s."""
    return addjob(queue, body, **options).argv


#: the longest DEDUP key a node takes, in bytes
MAX_DEDUP_KEY_BYTES = 512


def dedup_key(key: str | bytes) -> bytes:
    """A DEDUP key as sent: ``str`` (UTF-8) or ``bytes``, 1 to 512 bytes."""
    if isinstance(key, str):
        raw = key.encode("utf-8", "surrogateescape")
    elif isinstance(key, (bytes, bytearray, memoryview)):
        raw = bytes(key)
    else:
        raise TypeError("a dedup key must be str or bytes, not %s" % type(key).__name__)
    if not raw:
        raise ValueError("a dedup key must not be empty")
    if len(raw) > MAX_DEDUP_KEY_BYTES:
        raise ValueError("a dedup key is at most %d bytes, got %d" % (MAX_DEDUP_KEY_BYTES, len(raw)))
    return raw


def _seconds(name: str, value: float) -> bytes:
    """Seconds for BACKOFF / NACK DELAY: a number >= 0, sent with at most 3 decimals."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise TypeError("%s must be a number of seconds, not %s" % (name, type(value).__name__))
    if not value >= 0 or value == float("inf"):
        raise ValueError("%s must be a finite number >= 0, got %r" % (name, value))
    if isinstance(value, int):
        return b"%d" % value
    text = ("%.3f" % value).rstrip("0").rstrip(".")
    return text.encode("ascii")


def add_jobs(
    queue: str | bytes, bodies: Iterable[bytes | str], *, batch: int = 100,
    dedup: Callable[[Any], str | bytes | None] | Iterable[str | bytes | None] | None = None, **options: Any
) -> Batch[list[str]]:  # fmt: skip
    """Many ADDJOBs, pipelined ``batch`` at a time; IDs in input order. ``options`` are
    :meth:`add_job`'s (the same for every job).

    ``dedup``: a deduplication key per body (see :meth:`add_job`), either a function called
    with each body that returns its key (or None), or a sequence of keys, one per body (None
    for a body without one). A batch whose jobs all have a key is sent again after a lost
    connection even with ``retry_writes=False`` (the jobs already added answer their IDs
    again); run twice, the call adds nothing the second time and returns the same IDs.

    Raises :class:`~.errors.BatchError` (with every result) if any failed.
    """
    if batch < 1:
        raise ValueError("batch must be >= 1")
    bodies = list(bodies)
    keys = dedup_keys(bodies, dedup)
    # One ADDJOB checked and built, the body swapped in for each job (and its key appended).
    template = addjob(queue, b"", **options)
    head, tail = template.argv[:2], template.argv[3:]
    argvs = [
        (*head, encode_body(body), *tail) if key is None else (*head, encode_body(body), *tail, b"DEDUP", dedup_key(key))
        for body, key in zip(bodies, keys)
    ]  # fmt: skip
    rounds = [
        (argvs[start : start + batch], all(key is not None for key in keys[start : start + batch]))
        for start in range(0, len(argvs), batch)
    ]  # fmt: skip
    return Batch(rounds, template.blocks, _job_ids)


def _job_ids(replies: list[Any]) -> list[str]:
    if any(isinstance(r, DisqueError) for r in replies):
        raise BatchError([r if isinstance(r, DisqueError) else r.decode("ascii") for r in replies])
    return [r.decode("ascii") for r in replies]


def dedup_keys(bodies: Sequence[Any], dedup: Any) -> list[Any]:
    """``add_jobs``' ``dedup`` -> one key (or None) per body: a function of the body (called
    with each body as given; it returns the key, or None for no key), or a sequence of keys of
    the same length as the bodies (None where a body has no key). A single key is refused: it
    would make the whole batch one job."""
    if dedup is None:
        return [None] * len(bodies)
    if isinstance(dedup, (str, bytes, bytearray, memoryview)):
        raise TypeError("add_jobs' dedup is one key per body (a list) or a function of the body, not a single key")
    if callable(dedup):
        return [dedup(body) for body in bodies]
    keys = list(dedup)
    if len(keys) != len(bodies):
        raise ValueError("add_jobs got %d dedup keys for %d bodies" % (len(keys), len(bodies)))
    return keys


def add_json(queue: str | bytes, obj: Any, **options: Any) -> Call[str]:
    """ADDJOB with ``obj`` serialised as compact JSON (UTF-8); ``options`` are :meth:`add_job`'s."""
    return addjob(queue, json.dumps(obj, separators=(",", ":"), ensure_ascii=False).encode(), **options)


def add_msgpack(queue: str | bytes, obj: Any, **options: Any) -> Call[str]:
    """ADDJOB with ``obj`` packed with msgpack; ``options`` are :meth:`add_job`'s."""
    import msgpack

    return addjob(queue, msgpack.packb(obj, use_bin_type=True), **options)


def parse_getjob(reply: Any) -> list[Job]:
    """GETJOB's reply: nil, or ``[queue, id, body]`` items (+ counters)."""
    if not reply:
        return []
    jobs = []
    names: dict[bytes, str] = {}
    for item in reply:
        raw_name = item[0]
        name = names.get(raw_name)
        if name is None:
            name = names[raw_name] = decode_name(raw_name)
        n = len(item)
        if n == 7 and item[3] == b"nacks" and item[5] == b"additional-deliveries":
            nacks, additional = int(item[4]), int(item[6])  # WITHCOUNTERS, the usual shape
        elif n > 3:
            fields = {item[i]: item[i + 1] for i in range(3, n - 1, 2)}
            nacks = int(fields.get(b"nacks", 0))
            additional = int(fields.get(b"additional-deliveries", 0))
            if len(fields) > 2:  # a job with delivery options, or a dead letter
                info = DeliveryInfo(**_job_extras(fields))
                jobs.append(Job(name, item[1].decode("ascii"), item[2], nacks, additional, info))
                continue
        else:
            nacks = additional = 0
        jobs.append(Job(name, item[1].decode("ascii"), item[2], nacks, additional))
    return jobs


def _opt_int(value: Any) -> int | None:
    return None if value is None else int(value)


def _opt_text(value: Any) -> str | None:
    return value.decode("utf-8", "replace") if isinstance(value, bytes) else value


def _job_extras(fields: dict[bytes, Any]) -> dict[str, Any]:
    """WITHCOUNTERS' fields beyond Disque's two -> :class:`DeliveryInfo`'s keyword arguments."""
    get = fields.get
    out: dict[str, Any] = {
        "deliveries": _opt_int(get(b"deliveries")),
        "returns": _opt_int(get(b"returns")),
        "maxdeliver": _opt_int(get(b"maxdeliver")),
        "last_nack_reason": _opt_text(get(b"last-nack-reason")),
        "dead_letter_of": _opt_text(get(b"dead-letter-of")),
        "original_deliveries": _opt_int(get(b"original-deliveries")),
        "dead_letter_reason": _opt_text(get(b"dead-letter-reason")),
    }
    if get(b"dedup") is not None:
        out["dedup"] = decode_name(get(b"dedup"))
    if get(b"deadletter") is not None:
        out["deadletter"] = decode_name(get(b"deadletter"))
    if get(b"original-queue") is not None:
        out["original_queue"] = decode_name(get(b"original-queue"))
    if get(b"backoff-min-ms") is not None and get(b"backoff-max-ms") is not None:
        out["backoff"] = (int(get(b"backoff-min-ms")) / 1000.0, int(get(b"backoff-max-ms")) / 1000.0)
    options = get(b"original-options")
    if isinstance(options, list):
        out["original_options"] = tuple(_opt_text(o) for o in options)
    return out


def _same(jobs: list[Job]) -> list[Job]:
    return jobs


def get_jobs(
    *queues: str | bytes,
    count: int = 1,
    timeout_ms: int | None = None,
    nohang: bool = False,
    with_counters: bool = True,
) -> Call[list[Job]]:
    """GETJOB: up to ``count`` jobs from the first non-empty queues.

    Blocks until a job arrives, or ``timeout_ms`` (then returns ``[]``): ``timeout_ms`` None
    (or 0, GETJOB without TIMEOUT) waits for ever, as Disque does; ``nohang=True`` never
    blocks. (``GETJOB [NOHANG] [TIMEOUT ms] [COUNT n] [WITHCOUNTERS] FROM q...``)
    """
    if not queues:
        raise ValueError("get_jobs needs at least one queue")
    _check_int("count", count, 1)
    _check_int("timeout_ms", timeout_ms, 0)
    argv: list[Any] = [b"GETJOB"]
    if nohang:
        argv.append(b"NOHANG")
    if timeout_ms:
        argv += [b"TIMEOUT", timeout_ms]
    if count != 1:
        argv += [b"COUNT", count]
    if with_counters:
        argv.append(b"WITHCOUNTERS")
    argv.append(b"FROM")
    argv += [encode_name(q) for q in queues]
    if nohang:
        blocks: float | None = 0.0
    else:
        blocks = timeout_ms / 1000.0 if timeout_ms else None
    return Call(tuple(argv), parse_getjob, blocks=blocks, delivers=_same)


def getjob(queues: Sequence[str | bytes], **options: Any) -> Call[list[Job]]:
    """:func:`get_jobs` with the queues as one sequence."""
    return get_jobs(*queues, **options)


def _first_job(reply: Any) -> Job | None:
    jobs = parse_getjob(reply)
    return jobs[0] if jobs else None


def _the_job(job: Job | None) -> tuple[Job, ...]:
    return () if job is None else (job,)


def get_job(*queues: str | bytes, timeout_ms: int | None = None, nohang: bool = False) -> Call[Job | None]:
    """One job (GETJOB), or None on timeout."""
    call = get_jobs(*queues, timeout_ms=timeout_ms, nohang=nohang)
    return Call(call.argv, _first_job, blocks=call.blocks, delivers=_the_job)


def ids_command(name: bytes, ids: Iterable[str | bytes]) -> Call[int]:
    """ACKJOB, FASTACK, NACK, ENQUEUE, DEQUEUE, RELEASE, DELJOB: ids -> an integer."""
    return Call((name, *_ids(ids)), _int)


def ack(*ids: str | bytes) -> Call[int]:
    """ACKJOB: acknowledge (cluster-wide); returns how many this node knew."""
    return ids_command(b"ACKJOB", ids)


def fast_ack(*ids: str | bytes) -> Call[int]:
    """FASTACK: best-effort acknowledgement and deletion everywhere."""
    return ids_command(b"FASTACK", ids)


def enqueue(*ids: str | bytes) -> Call[int]:
    """ENQUEUE: queue the jobs again now (those not queued); returns how many were queued."""
    return ids_command(b"ENQUEUE", ids)


def dequeue(*ids: str | bytes) -> Call[int]:
    """DEQUEUE: take the jobs out of their queues (they stay active); returns how many."""
    return ids_command(b"DEQUEUE", ids)


def release(*ids: str | bytes, delay: float | None = None) -> Call[int]:
    """RELEASE (disque-py's): give back jobs delivered and never started. Each job active on
    this node is queued again now (or after ``delay`` seconds), as ENQUEUE does, and its delivery
    does not count: no nack, no additional delivery, nothing against MAXDELIVER. Returns how
    many were given back. (``RELEASE id... [DELAY s]``)"""
    if delay is None:
        return ids_command(b"RELEASE", ids)
    return Call((b"RELEASE", *_ids(ids), b"DELAY", _seconds("delay", delay)), _int)


def del_job(*ids: str | bytes) -> Call[int]:
    """DELJOB: delete the jobs on this node only; returns how many it held."""
    return ids_command(b"DELJOB", ids)


#: NACK's REASON is kept by the node up to this many bytes.
MAX_REASON_BYTES = 1024
#: NACK's TRACE is kept by the node up to this many bytes: its tail (``core/job.py``'s TRACE_MAX).
MAX_TRACE_BYTES = 16384


def _utf8(text: str) -> bytes:
    """``text`` as UTF-8; bytes kept in a str by ``surrogateescape`` come back as they were, any
    other lone surrogate (an exception's message may hold one) as ``\\udXXX``."""
    try:
        return text.encode("utf-8", "surrogateescape")
    except UnicodeEncodeError:
        return text.encode("utf-8", "backslashreplace")


def cut_reason(reason: str | bytes) -> bytes:
    """A failure reason as NACK's REASON takes it: UTF-8, at most 1024 bytes (cut on a
    character boundary)."""
    raw = _utf8(reason) if isinstance(reason, str) else bytes(reason)
    if len(raw) <= MAX_REASON_BYTES:
        return raw
    cut = raw[:MAX_REASON_BYTES]
    return cut.decode("utf-8", "ignore").encode("utf-8") if isinstance(reason, str) else cut


def cut_trace(trace: str | bytes) -> bytes:
    """A traceback as NACK's TRACE takes it: UTF-8, at most 16 KiB. A longer one keeps its tail
    (where a traceback names the failing line and the error), from the start of a line, after
    a first line saying how much was cut."""
    raw = _utf8(trace) if isinstance(trace, str) else bytes(trace)
    if len(raw) <= MAX_TRACE_BYTES:
        return raw
    head = b"[traceback cut: its first %d bytes left out]\n" % len(raw)  # sized below, never longer
    start = len(raw) - (MAX_TRACE_BYTES - len(head))
    line = raw.find(b"\n", start, len(raw) - 1)
    if line >= 0:
        start = line + 1
    while start < len(raw) and 0x80 <= raw[start] < 0xC0:  # a continuation byte: not a character's start
        start += 1
    return b"[traceback cut: its first %d bytes left out]\n" % start + raw[start:]


def nack(*ids: str | bytes, delay: float | None = None, reason: str | bytes | None = None,
         trace: str | bytes | None = None, dead: bool = False) -> Call[int]:  # fmt: skip
    """NACK: put the jobs back now, counting a failed attempt (plain ``NACK id...``, as Disque).

    disque-py's options: ``delay`` seconds before they are queued again
    (cluster-wide); ``reason`` kept as the jobs' last failure (cut to 1024
    bytes); ``trace`` kept as that failure's traceback (SHOW's ``last-failure-trace``,
    handed to a dead letter; its tail, at most 16 KiB); ``dead=True`` dead-letters
    them now, whatever their MAXDELIVER.
    (``NACK id... [DELAY s] [REASON text] [TRACE text] [DEAD]``)
    """
    argv: list[Any] = [b"NACK", *_ids(ids)]
    if dead and delay is not None:
        raise ValueError("a NACK is either DEAD or DELAYed, not both")
    if delay is not None:
        argv += [b"DELAY", _seconds("delay", delay)]
    if reason is not None:
        argv += [b"REASON", cut_reason(reason)]
    if trace is not None:
        argv += [b"TRACE", cut_trace(trace)]
    if dead:
        argv.append(b"DEAD")
    return Call(tuple(argv), _int)


def nack_argv(ids: Iterable[str | bytes], **options: Any) -> tuple[Any, ...]:
    """NACK's argv alone, the IDs as one iterable; ``options`` are :func:`nack`'s."""
    return nack(*ids, **options).argv


def working(job_id: str | bytes) -> Call[int]:
    """WORKING: postpone the requeue; returns the job's RETRY in seconds."""
    return Call((b"WORKING", encode_name(job_id)), _int)


_SHOW_TEXT = {"id", "queue", "state"}


def _decode_value(key: str, value: Any) -> Any:
    if key == "body":
        return value
    if isinstance(value, bytes):
        return decode_name(value) if key in ("queue", "name") else value.decode("utf-8", "replace")
    if isinstance(value, list):
        return [_decode_value(key, v) for v in value]
    return value


def parse_flat_map(reply: Any) -> dict[str, Any] | None:
    """``[key, value, key, value...]`` -> a dict with str keys (nil -> None).

    Byte values become ``str`` except ``body``, which stays ``bytes``.
    """
    if reply is None:
        return None
    out = {}
    for i in range(0, len(reply) - 1, 2):
        key = reply[i].decode("ascii", "replace")
        out[key] = _decode_value(key, reply[i + 1])
    return out


def show(job_id: str | bytes) -> Call[dict[str, Any] | None]:
    """SHOW: the job's fields (``body`` as bytes), or None if unknown here."""
    return Call((b"SHOW", encode_name(job_id)), parse_flat_map)


# ---------------------------------------------------------------- queues


def qlen(queue: str | bytes) -> Call[int]:
    """QLEN: how many jobs the queue holds on this node."""
    return Call((b"QLEN", encode_name(queue)), _int)


def qstat(queue: str | bytes) -> Call[dict[str, Any] | None]:
    """QSTAT: the queue's fields on this node (a dict), or None if it does not exist here."""
    return Call((b"QSTAT", encode_name(queue)), parse_flat_map)


def _parse_qpeek(reply: Any) -> list[Job]:
    return parse_getjob(reply)


def qpeek(queue: str | bytes, count: int = 1) -> Call[list[Job]]:
    """QPEEK: the oldest ``count`` jobs of the queue, or the newest with a negative count
    (they stay queued)."""
    if isinstance(count, bool) or not isinstance(count, int):
        raise TypeError("count must be an int")
    return Call((b"QPEEK", encode_name(queue), count), _parse_qpeek)


def _parse_scan_names(reply: Any) -> tuple[int, list[str]]:
    return int(reply[0]), [decode_name(n) for n in reply[1]]


def qscan(
    cursor: int,
    *,
    count: int | None = None,
    busyloop: bool = False,
    minlen: int | None = None,
    maxlen: int | None = None,
    importrate: int | None = None,
    all: bool = False,
) -> Call[tuple[int, list[str]]]:
    """Every queue name (QSCAN, page after page; one page: (next cursor, names)).

    ``all``: the cluster's own queues too (names starting with ``@``, a task's result), which
    QSCAN leaves out unless asked (``QSCAN ... ALL``, an option of ours)."""
    argv: list[Any] = [b"QSCAN", cursor]
    if count is not None:
        argv += [b"COUNT", count]
    if busyloop:
        argv.append(b"BUSYLOOP")
    if minlen is not None:
        argv += [b"MINLEN", minlen]
    if maxlen is not None:
        argv += [b"MAXLEN", maxlen]
    if importrate is not None:
        argv += [b"IMPORTRATE", importrate]
    if all:
        argv.append(b"ALL")
    return Call(tuple(argv), _parse_scan_names)


def _parse_jscan_ids(reply: Any) -> tuple[int, list[Any]]:
    return int(reply[0]), [i.decode("ascii") for i in reply[1]]


def _parse_jscan_all(reply: Any) -> tuple[int, list[Any]]:
    return int(reply[0]), [parse_flat_map(item) for item in reply[1]]


def jscan(
    cursor: int,
    *,
    count: int | None = None,
    busyloop: bool = False,
    queue: str | bytes | None = None,
    states: Iterable[str] | str = (),
    reply: str = "id",
) -> Call[tuple[int, list[Any]]]:
    """Every job (JSCAN, page after page): IDs, or dicts with ``reply="all"`` (SHOW's fields).

    ``queue``: only that queue's; ``states``: only jobs in those states (``"queued"``, or
    several)."""
    if reply not in ("id", "all"):
        raise ValueError("reply must be 'id' or 'all'")
    argv: list[Any] = [b"JSCAN", cursor]
    if count is not None:
        argv += [b"COUNT", count]
    if busyloop:
        argv.append(b"BUSYLOOP")
    if queue is not None:
        argv += [b"QUEUE", encode_name(queue)]
    for state in [states] if isinstance(states, str) else states:
        if state not in JOB_STATES:
            raise ValueError("unknown job state %r (one of %s)" % (state, ", ".join(JOB_STATES)))
        argv += [b"STATE", state.encode()]
    argv += [b"REPLY", reply.encode()]
    return Call(tuple(argv), _parse_jscan_all if reply == "all" else _parse_jscan_ids)


def pause(queue: str | bytes, *flags: str) -> Call[str]:
    """PAUSE queue in|out|all|none|state [bcast] -> the pause state."""
    if not flags:
        raise ValueError("PAUSE needs at least one of: %s" % ", ".join(PAUSE_FLAGS))
    for flag in flags:
        if flag.lower() not in PAUSE_FLAGS:
            raise ValueError("unknown PAUSE option %r (one of %s)" % (flag, ", ".join(PAUSE_FLAGS)))
    return Call((b"PAUSE", encode_name(queue), *(f.encode() for f in flags)), _str)


# ---------------------------------------------------------------- groups (ours: core/limits.py)


def group_name(group: str | bytes) -> bytes:
    """A group's name as sent: 1 to 128 bytes (ValueError otherwise, before anything is sent)."""
    raw = encode_name(group)
    if not 0 < len(raw) <= 128:
        raise ValueError("a group name is 1 to 128 bytes, got %d" % len(raw))
    return raw


def _parse_group(reply: Any) -> dict[str, Any]:
    """GROUP INFO's map: ``rate`` and ``share-rate`` as floats, ``held`` as a bool."""
    out = parse_flat_map(reply) or {}
    for key in ("rate", "share-rate"):
        if out.get(key) is not None:
            out[key] = float(out[key])
    if "held" in out:
        out["held"] = bool(out["held"])
    return out


def _parse_group_list(reply: Any) -> list[dict[str, Any]]:
    return [_parse_group(entry) for entry in reply or ()]


def group_info(group: str | bytes) -> Call[dict[str, Any]]:
    """GROUP INFO: a group's weight, limits (``concurrency``, ``rate``: None without), this node's
    ``active`` (delivered, not acknowledged), ``waiting`` (queued) and share of each limit."""
    return Call((b"GROUP", b"INFO", group_name(group)), _parse_group)


def group_list(count: int | None = None) -> Call[list[dict[str, Any]]]:
    """GROUP LIST [COUNT n]: GROUP INFO of the groups this node knows (with settings, jobs or
    deliveries), the busiest first, at most ``count`` (100 by default)."""
    argv: list[Any] = [b"GROUP", b"LIST"]
    if count is not None:
        _check_int("count", count, 1)
        argv += [b"COUNT", count]
    return Call(tuple(argv), _parse_group_list)


def group_weight(group: str | bytes, weight: int) -> Call[str]:
    """GROUP WEIGHT: the group's deliveries per turn in its queues (1 to 1000), cluster-wide."""
    _check_int("weight", weight, 1)
    if weight > 1000:
        raise ValueError("weight must be from 1 to 1000, got %d" % weight)
    return Call((b"GROUP", b"WEIGHT", group_name(group), weight), _str)


def group_limit(group: str | bytes, *, concurrency: int | None = None, rate: float | None = None) -> Call[str]:
    """GROUP LIMIT: at most ``concurrency`` jobs of the group delivered and not acknowledged,
    or ``rate`` deliveries a second (burst: one second's worth), across the cluster; one of the
    two at a time (a call for each to set both); neither: no limit (``LIMIT group NONE``)."""
    name = group_name(group)
    if concurrency is not None and rate is not None:
        raise TypeError("give concurrency= or rate=, one at a time (a call for each)")
    if concurrency is not None:
        _check_int("concurrency", concurrency, 1)
        return Call((b"GROUP", b"LIMIT", name, b"CONCURRENCY", concurrency), _str)
    if rate is not None:
        if isinstance(rate, bool) or not isinstance(rate, (int, float)) or not 1 <= rate <= 1_000_000:
            raise ValueError("rate must be a number of deliveries a second from 1 to 1000000, got %r" % (rate,))
        text = ("%.3f" % rate).rstrip("0").rstrip(".")
        return Call((b"GROUP", b"LIMIT", name, b"RATE", text.encode()), _str)
    return Call((b"GROUP", b"LIMIT", name, b"NONE"), _str)


# ---------------------------------------------------------------- workers (ours: server/workers.py)


def _worker_id(worker_id: str | bytes) -> bytes:
    raw = worker_id.encode() if isinstance(worker_id, str) else bytes(worker_id)
    if not raw or any(c <= 32 or c >= 127 for c in raw):
        raise ValueError("a worker ID is printable ASCII without spaces, got %r" % (worker_id,))
    return raw


def worker_beat(worker_id: str | bytes, interval: float, info: dict[str, Any] | bytes) -> Call[str]:
    """WORKER BEAT: this worker lives, and says ``info`` (a dict, sent as JSON) of itself; the node
    forgets it after 3 ``interval`` seconds without a beat (disque-py's command, docs/CLIENT.md)."""
    ms = round(interval * 1000)
    body = info if isinstance(info, bytes) else json.dumps(info, separators=(",", ":"), allow_nan=False).encode()
    return Call((b"WORKER", b"BEAT", _worker_id(worker_id), b"%d" % ms, body), _str)


def worker_list() -> Call[list[dict[str, Any]]]:
    """WORKER LIST: the live workers this node hears from, one dict each (``client/workers.py``
    merges the nodes' answers)."""
    return Call((b"WORKER", b"LIST"), _parse_worker_list)


def worker_forget(worker_id: str | bytes) -> Call[int]:
    """WORKER FORGET: drop a worker now (a clean stop); 1, or 0 if the node did not know it."""
    return Call((b"WORKER", b"FORGET", _worker_id(worker_id)), _int)


# ---------------------------------------------------------------- server


def _number(text: str) -> Any:
    try:
        return int(text)
    except ValueError:
        pass
    try:
        return float(text)
    except ValueError:
        return text


def parse_info(reply: Any) -> dict[str, Any]:
    """INFO text -> ``{field: value}`` (numbers converted), sections flattened."""
    text = reply.decode("utf-8", "replace") if isinstance(reply, bytes) else str(reply)
    out: dict[str, Any] = {}
    for line in text.splitlines():
        if not line or line.startswith("#") or ":" not in line:
            continue
        key, _, value = line.partition(":")
        out[key] = _number(value)
    return out


def info(section: str | None = None) -> Call[dict[str, Any]]:
    """INFO: the node's fields (numbers converted), every section or one, flattened."""
    argv = (b"INFO",) if section is None else (b"INFO", section.encode())
    return Call(argv, parse_info)


def parse_hello(reply: Any, via_host: str | None = None) -> HelloInfo:
    """``[version, my_id, [id, ip, port, priority]...]`` -> :class:`HelloInfo`.

    A node bound to every interface may announce an empty or wildcard IP;
    for those the host we reached the node with (``via_host``) is used.
    """
    version = int(reply[0])
    my_id = reply[1].decode("ascii")
    nodes = []
    for entry in reply[2:]:
        node_id, ip, port, priority = entry[:4]
        host = ip.decode("ascii", "replace")
        if host in ("", "0.0.0.0", "::", "*") and via_host:
            host = via_host
        nodes.append(NodeInfo(node_id.decode("ascii"), host, int(port), int(priority)))
    return HelloInfo(version, my_id, tuple(nodes))


def hello() -> Call[Any]:
    """Disque's HELLO; parsed by the client, which knows the host it used."""
    return Call((b"HELLO",), _identity)


def ping() -> Call[str]:
    """PING -> ``"PONG"``."""
    return Call((b"PING",), _str)


def execute(*argv: Any) -> Call[Any]:
    """Any command, raw RESP2 reply (errors still raise typed exceptions)."""
    return Call(tuple(argv), _identity, blocks=None, retry_safe=False)


def run(call: Call[T]) -> Call[T]:
    """A command already built as a :class:`Call` (argv, reply parser, how long the node may
    block, whether a resend is safe), sent as it is: ``client.run(commands.addjob(...))``, or a
    Call of one's own for a command this module does not declare."""
    return call


def pipeline(calls: Sequence[Call[Any]]) -> Batch[list[Any]]:
    """Several commands in one round trip, on one connection, executed in order.

    Returns each command's parsed result, or its :class:`~.errors.ServerError`
    as a value. Built with :mod:`disque_py.client.commands`, e.g.
    ``[commands.ack(*ids), commands.get_jobs("q", nohang=True)]``
    (the worker acknowledges and fetches this way). Connection trouble
    fails over like any command; commands already answered are not resent.
    """
    calls = list(calls)
    if not calls:
        return Batch([], 0.0, _no_replies)
    blocks: float | None = 0.0
    for call in calls:
        blocks = None if call.blocks is None or blocks is None else max(blocks, call.blocks)
    argvs = [c.argv for c in calls]
    finish = _Replies(calls)
    return Batch([(argvs, all(c.retry_safe for c in calls))], blocks, finish, finish.delivered)


def _no_replies(replies: list[Any]) -> list[Any]:
    return []


class _Replies:
    """A pipeline's replies, each read by its call's parser (errors stay values)."""

    __slots__ = ("calls",)

    def __init__(self, calls: list[Call[Any]]) -> None:
        self.calls = calls

    def __call__(self, replies: list[Any]) -> list[Any]:
        return [r if isinstance(r, DisqueError) else c.parse(r) for c, r in zip(self.calls, replies)]

    def delivered(self, results: list[Any]) -> list[Job]:
        return [
            job for c, r in zip(self.calls, results) if c.delivers is not None and not isinstance(r, DisqueError)
            for job in c.delivers(r)
        ]  # fmt: skip
