"""Client command parsing: argv (list of bytes) -> typed request or an Error.

Validation and error texts follow Disque 1.0-rc1 so that existing clients
see the same replies. Nothing here touches node state.
"""

from __future__ import annotations

import re
from collections.abc import Container
from typing import Final, final

from .constants import DEFAULT_TTL, INT64_MAX, INT64_MIN, REPLICATE_MAX, default_retry
from .ids import valid_job_id
from .job import GROUP_NAME_MAX, PRIORITY_MAX, PRIORITY_MIN, TRACE_MAX, priority_flags, state_from_name
from .replies import Error, err, syntax_error

__all__ = [
    "AddJob",
    "Nack",
    "GetJob",
    "ScanArgs",
    "parse_addjob",
    "plain_addjob_timeout",
    "DEFAULT_RETRY",
    "check_group_name",
    "parse_nack",
    "parse_release",
    "trace_tail",
    "parse_seconds_ms",
    "NACK_OPTIONS",
    "parse_getjob",
    "parse_qscan",
    "parse_jscan",
    "parse_int",
    "parse_timeout",
    "check_job_ids",
    "SYNTAX_ERROR",
    "NOT_AN_INTEGER",
    "BADID",
]

SYNTAX_ERROR: Final = err("syntax error")
_NEEDS_VALUE: Final = "a value must follow it"
NOT_AN_INTEGER: Final = err("value is not an integer or out of range")
BADID: Final = Error("BADID Invalid Job ID format.")
RETRY0_NEEDS_REPLICATE1: Final = err("With RETRY set to 0 please explicitly set REPLICATE to 1 (at-most-once delivery)")
#: An ADDJOB that names neither a RETRY nor a TTL (its common form) gets this RETRY.
_DEFAULT_RETRY: Final = default_retry(DEFAULT_TTL)


def parse_int(raw: bytes) -> int | None:
    """Strict signed 64-bit integer, as Redis parses it (no spaces, no '+')."""
    n = len(raw)
    if n == 1:  # one digit: ADDJOB's timeout 0, a REPLICATE, a COUNT (most integers a node reads)
        d = raw[0] - 0x30
        return d if 0 <= d <= 9 else None
    if not n or n > 20:
        return None
    first = raw[0]
    if not (0x30 <= first <= 0x39 or (first == 0x2D and len(raw) > 1)):
        return None
    if len(raw) > 1 and (raw[0] == 0x30 or raw[:2] == b"-0"):
        return None  # leading zeros are not canonical
    if not (raw[1:] if first == 0x2D else raw).isdigit():
        return None
    value = int(raw)
    if value > INT64_MAX or value < INT64_MIN:
        return None
    return value


def parse_timeout(raw: bytes) -> int | Error:
    value = parse_int(raw)
    if value is None:
        return err("timeout is not an integer or out of range")
    if value < 0:
        return err("timeout is negative")
    return value


def check_job_ids(ids: list[bytes], known: Container[bytes] = ()) -> Error | None:
    """BADID if an ID is malformed. IDs in ``known`` (a node's stored jobs, whose IDs
    were checked when they arrived) are taken as they are: no pattern match per ACK."""
    for job_id in ids:
        if job_id not in known and not valid_job_id(job_id):
            return BADID
    return None


_SECONDS_RE: Final = re.compile(rb"(0|[1-9][0-9]{0,9})(?:\.([0-9]{1,3}))?")


def parse_seconds_ms(raw: bytes) -> int | None:
    """Non-negative decimal seconds with up to three decimals (``2``, ``0.5``, ``1.25``) as
    milliseconds; None for anything else (a sign, an exponent, nan, more decimals)."""
    m = _SECONDS_RE.fullmatch(raw)
    if m is None:
        return None
    frac = m[2] or b""
    return int(m[1]) * 1000 + (int(frac.ljust(3, b"0")) if frac else 0)


@final
class AddJob:
    __slots__ = ("queue", "body", "timeout", "replicate", "ttl", "retry", "delay", "maxlen", "async_", "extra",
                 "priority", "group")  # fmt: skip

    def __init__(self, queue: bytes, body: bytes, timeout: int) -> None:
        self.queue = queue
        self.body = body
        self.timeout = timeout
        self.replicate: int | None = None  # None -> cluster default
        self.ttl = DEFAULT_TTL
        self.retry = -1  # none named: default_retry(ttl), once the TTL is known
        self.delay = 0
        self.maxlen = 0
        self.async_ = False
        # [backoff min ms, max ms, maxdeliver, deadletter queue, dedup key]: BACKOFF, MAXDELIVER,
        # DEADLETTER (delivery.py), DEDUP (dedup.py); None without any (one slot: ADDJOB's hot path)
        self.extra: list | None = None
        self.priority = 0  # PRIORITY's flag bits (job.priority_flags): 0, the default
        self.group: bytes | None = None  # GROUP's name (queues.py, groups.py); None: the default group

    @property
    def dedup(self) -> bytes | None:
        """DEDUP's key, or None."""
        return None if self.extra is None else self.extra[4]


#: The most body + queue name bytes a job may have. Replicating or moving a job sends
#: it in one cluster bus message, and a bus frame carries at most 64 MiB; the job's
#: other fields (its holders' IDs included) and the framing fit in the rest.
#: Disque has no such limit below the protocol's 512 MB, but its jobs meant to be small.
MAX_JOB_BYTES: Final = 60 * 1024 * 1024
_ADDJOB_VALUED: Final = (b"replicate", b"ttl", b"retry", b"delay", b"maxlen", b"dedup", b"priority", b"group")
#: The longest DEDUP key (bytes).
MAX_DEDUP_KEY: Final = 512


def _too_big(argv: list[bytes]) -> Error:
    return err("Job too big: %d bytes of body and queue name, at most %d can be replicated or moved "
               "(a fixed limit: one cluster bus message carries a job)"
               % (len(argv[2]) + len(argv[1]), MAX_JOB_BYTES))  # fmt: skip


def plain_addjob_timeout(argv: list[bytes]) -> int | Error:
    """ADDJOB queue body ms-timeout, without options (``len(argv) == 4``): its timeout, or the
    error ``parse_addjob`` would give it. The caller makes the job with the defaults
    (``DEFAULT_TTL``, ``DEFAULT_RETRY``), no request object built."""
    if len(argv[2]) + len(argv[1]) > MAX_JOB_BYTES:
        return _too_big(argv)
    return parse_timeout(argv[3])


#: RETRY when ADDJOB names none and its TTL is the default (``default_retry(DEFAULT_TTL)``)
DEFAULT_RETRY: Final = _DEFAULT_RETRY


def parse_addjob(argv: list[bytes]) -> AddJob | Error:
    """ADDJOB queue body ms-timeout [REPLICATE n] [DELAY s] [RETRY s] [TTL s] [MAXLEN n] [ASYNC]
    [BACKOFF min max] [MAXDELIVER n] [DEADLETTER queue] (delivery.py) [DEDUP key] (dedup.py)
    [PRIORITY p] [GROUP name] (queues.py, groups.py)"""
    timeout = parse_timeout(argv[3])
    if isinstance(timeout, Error):
        timeout_error = timeout
        timeout = 0
    else:
        timeout_error = None
    if len(argv[2]) + len(argv[1]) > MAX_JOB_BYTES:
        return _too_big(argv)
    req = AddJob(argv[1], argv[2], timeout)
    n = len(argv)
    if n == 4:  # the common case: no options
        if timeout_error is not None:
            return timeout_error
        req.retry = _DEFAULT_RETRY
        return req
    # The options of an ADDJOB (argv[4:]) parsed and checked once: a producer sends the same ones
    # job after job. Only options that passed every check are kept, so a hit can fail only on
    # what depends on this job (its timeout, a DEADLETTER equal to its queue).
    # A DEDUP key last (as our clients send it) is one job's: the options before it are looked up.
    dedup = None
    if n >= 6 and argv[n - 2].lower() == b"dedup" and 0 < len(argv[n - 1]) <= MAX_DEDUP_KEY:
        dedup = argv[n - 1]
        key = tuple(argv[4 : n - 2])
    else:
        key = tuple(argv[4:])
    seen = _OPTIONS_SEEN.get(key)
    if seen is not None:
        if timeout_error is not None:
            return timeout_error
        req.replicate, req.ttl, req.retry, req.delay, req.maxlen, req.async_, extra, req.priority, req.group = seen
        if dedup is not None:
            extra = [None, None, None, None, dedup] if extra is None else extra[:4] + [dedup]
        req.extra = extra
        if extra is not None and extra[3] is not None and extra[3] == req.queue:
            return DEADLETTER_IS_QUEUE
        return req
    bad = _parse_options(req, argv, n)
    if bad is not None:
        return bad
    if timeout_error is not None:  # options are validated first, as Disque
        return timeout_error
    if req.retry == 0 and (req.replicate or 1) > 1:  # again with the default factor in Node
        return RETRY0_NEEDS_REPLICATE1
    if req.delay >= req.ttl:
        return err("The specified DELAY is greater than TTL. Job refused since would never be delivered "
                   "(DELAY %d s, TTL %d s)" % (req.delay, req.ttl))  # fmt: skip
    if req.retry == -1:
        req.retry = default_retry(req.ttl)
    extra = req.extra
    if extra is not None:
        bad = _check_delivery_options(req)
        if bad is not None:
            return bad
    if dedup is not None or extra is None or extra[4] is None:  # kept without the job's own key
        if len(_OPTIONS_SEEN) >= _OPTIONS_SEEN_MAX:
            _OPTIONS_SEEN.clear()
        if dedup is not None:
            extra = None if extra[:4] == [None, None, None, None] else extra[:4] + [None]  # type: ignore[index]
        _OPTIONS_SEEN[key] = (req.replicate, req.ttl, req.retry, req.delay, req.maxlen, req.async_, extra,
                              req.priority, req.group)  # fmt: skip
    return req


def check_group_name(name: bytes) -> Error | None:
    """A group's name (ADDJOB's GROUP, the GROUP command's): 1 to GROUP_NAME_MAX bytes."""
    if not name:
        return err("GROUP name must not be empty")
    if len(name) > GROUP_NAME_MAX:
        return err("GROUP name is %d bytes, at most %d" % (len(name), GROUP_NAME_MAX))
    return None


#: ADDJOB's options already parsed (``parse_addjob``): argv[4:] -> the fields they set. The
#: fields are shared (``extra`` too: nothing changes a parsed request's list). Emptied when full.
_OPTIONS_SEEN: Final[dict[tuple, tuple]] = {}
_OPTIONS_SEEN_MAX: Final = 1024


def _parse_options(req: AddJob, argv: list[bytes], n: int) -> Error | None:
    """ADDJOB's options (``argv[4:]``) into ``req``; the first one wrong as an Error."""
    i = 4
    while i < n:
        opt = argv[i].lower()
        has_value = i + 1 < n
        if opt == b"replicate" and has_value:
            v = parse_int(argv[i + 1])
            if v is None or v <= 0 or v > REPLICATE_MAX:
                return err("REPLICATE must be between 1 and %d" % REPLICATE_MAX)
            req.replicate = v
            i += 2
        elif opt == b"ttl" and has_value:
            v = parse_int(argv[i + 1])
            if v is None or v <= 0:
                return err("TTL must be a number > 0")
            req.ttl = v
            i += 2
        elif opt == b"retry" and has_value:
            v = parse_int(argv[i + 1])
            if v is None or v < 0:
                return err("RETRY time must be a non negative number")
            req.retry = v
            i += 2
        elif opt == b"delay" and has_value:
            v = parse_int(argv[i + 1])
            if v is None or v < 0:
                return err("DELAY time must be a non negative number")
            req.delay = v
            i += 2
        elif opt == b"maxlen" and has_value:
            v = parse_int(argv[i + 1])
            if v is None or v <= 0:
                return err("MAXLEN must be a positive number")
            req.maxlen = v
            i += 2
        elif opt == b"async":
            req.async_ = True
            i += 1
        elif opt == b"priority" and has_value:
            v = parse_int(argv[i + 1])
            if v is None or not PRIORITY_MIN <= v <= PRIORITY_MAX:
                return err("PRIORITY must be a number from %d to %d (higher first)" % (PRIORITY_MIN, PRIORITY_MAX))
            req.priority = priority_flags(v)
            i += 2
        elif opt == b"group" and has_value:
            bad = check_group_name(argv[i + 1])
            if bad is not None:
                return bad
            req.group = argv[i + 1]
            i += 2
        elif opt == b"dedup" and has_value:
            if req.dedup is not None:
                return err("DEDUP given twice")
            key = argv[i + 1]
            if not key:
                return err("DEDUP key must not be empty")
            if len(key) > MAX_DEDUP_KEY:
                return err("DEDUP key is %d bytes, at most %d" % (len(key), MAX_DEDUP_KEY))
            if req.extra is None:
                req.extra = [None, None, None, None, None]
            req.extra[4] = key
            i += 2
        elif opt in _DELIVERY_OPTIONS:
            got = _delivery_option(req, opt, argv, i)
            if isinstance(got, Error):
                return got
            i = got
        elif opt in _ADDJOB_VALUED:
            return syntax_error(argv[i], _NEEDS_VALUE)
        else:
            return syntax_error(argv[i])
    return None


_DELIVERY_OPTIONS: Final = (b"backoff", b"maxdeliver", b"deadletter")
DEADLETTER_IS_QUEUE: Final = err("DEADLETTER must name another queue than the job's own")


def _delivery_option(req: AddJob, opt: bytes, argv: list[bytes], i: int) -> int | Error:
    """BACKOFF min max, MAXDELIVER n, DEADLETTER queue at ``argv[i]``: the index after it."""
    extra = req.extra
    if extra is None:
        extra = req.extra = [None, None, None, None, None]
    n = len(argv)
    if opt == b"backoff":
        if i + 2 >= n:
            return syntax_error(argv[i], "two values must follow it (min and max seconds)")
        if extra[0] is not None:
            return err("BACKOFF given twice")
        lo, hi = parse_seconds_ms(argv[i + 1]), parse_seconds_ms(argv[i + 2])
        if lo is None or hi is None:
            return err("BACKOFF min and max must be non negative numbers of seconds (up to 3 decimals)")
        if lo > hi:
            return err("BACKOFF min is above max (%s s > %s s)" % (argv[i + 1].decode(), argv[i + 2].decode()))
        if hi == 0:
            return err("BACKOFF max must be above 0")
        extra[0], extra[1] = lo, hi
        return i + 3
    if i + 1 >= n:
        return syntax_error(argv[i], _NEEDS_VALUE)
    if opt == b"maxdeliver":
        if extra[2] is not None:
            return err("MAXDELIVER given twice")
        v = parse_int(argv[i + 1])
        if v is None or v <= 0:
            return err("MAXDELIVER must be a number of deliveries >= 1")
        extra[2] = v
    else:
        if extra[3] is not None:
            return err("DEADLETTER given twice")
        if not argv[i + 1]:
            return err("DEADLETTER needs a queue name")
        extra[3] = argv[i + 1]
    return i + 2


def _check_delivery_options(req: AddJob) -> Error | None:
    lo, hi, maxdeliver, deadletter, _ = req.extra  # type: ignore[misc]
    if req.retry == 0 and (hi is not None or maxdeliver is not None):
        return err("BACKOFF and MAXDELIVER need a RETRY above 0: a RETRY 0 job is never delivered twice")
    if hi is not None and hi > req.ttl * 1000:
        return err("BACKOFF max is beyond the job's TTL (%d s)" % req.ttl)
    if deadletter is not None and deadletter == req.queue:
        return DEADLETTER_IS_QUEUE
    return None


@final
class Nack:
    """NACK's options: DELAY (ms, or None), REASON (or None), TRACE (its tail, or None), DEAD."""

    __slots__ = ("ids", "delay", "reason", "trace", "dead")

    def __init__(self, ids: list[bytes]) -> None:
        self.ids = ids
        self.delay: int | None = None
        self.reason: bytes | None = None
        self.trace: bytes | None = None
        self.dead = False


NACK_OPTIONS: Final = frozenset((b"delay", b"reason", b"trace", b"dead"))
MAX_REASON: Final = 1024


def trace_tail(text: bytes) -> bytes:
    """A TRACE as the node keeps it: its last ``TRACE_MAX`` bytes (a traceback ends with the
    failing line and the error), starting at a UTF-8 character's first byte."""
    if len(text) <= TRACE_MAX:
        return text
    start = len(text) - TRACE_MAX
    end = min(start + 4, len(text))
    while start < end and 0x80 <= text[start] < 0xC0:  # a continuation byte: not a character's start
        start += 1
    return text[start:]


def parse_nack(argv: list[bytes]) -> Nack | Error:
    """NACK id ... [DELAY seconds] [REASON text] [TRACE text] [DEAD]: the job IDs come first;
    the first argument that is an option's name ends them. A TRACE longer than TRACE_MAX is
    kept by its tail (``trace_tail``)."""
    n = len(argv)
    i = 1
    while i < n and argv[i].lower() not in NACK_OPTIONS:
        i += 1
    req = Nack(argv[1:i])
    if i == 1:
        return err("wrong number of arguments for 'nack' command")
    seen: set[bytes] = set()
    while i < n:
        opt = argv[i].lower()
        if opt not in NACK_OPTIONS:
            return syntax_error(argv[i])
        if opt in seen:
            return err("%s given twice" % opt.decode().upper())
        seen.add(opt)
        if opt == b"dead":
            req.dead = True
            i += 1
            continue
        if i + 1 >= n:
            return syntax_error(argv[i], _NEEDS_VALUE)
        value = argv[i + 1]
        if opt == b"delay":
            ms = parse_seconds_ms(value)
            if ms is None:
                return err("DELAY must be a non negative number of seconds (up to 3 decimals)")
            req.delay = ms
        elif opt == b"trace":
            req.trace = trace_tail(value)
        else:
            if len(value) > MAX_REASON:
                return err("REASON is %d bytes, at most %d" % (len(value), MAX_REASON))
            req.reason = value
        i += 2
    if req.dead and req.delay is not None:
        return err("DEAD and DELAY together: a job dead-lettered is not queued again")
    return req


def parse_release(argv: list[bytes]) -> tuple[list[bytes], int] | Error:
    """RELEASE id ... [DELAY seconds]: the job IDs, then the delay in ms (0: queued now)."""
    n = len(argv)
    i = 1
    while i < n and argv[i].lower() != b"delay":
        i += 1
    if i == 1:
        return err("wrong number of arguments for 'release' command")
    ids = argv[1:i]
    if i == n:
        return ids, 0
    if i + 1 >= n:
        return syntax_error(argv[i], _NEEDS_VALUE)
    if i + 2 != n:
        return syntax_error(argv[i + 2])
    ms = parse_seconds_ms(argv[i + 1])
    if ms is None:
        return err("DELAY must be a non negative number of seconds (up to 3 decimals)")
    return ids, ms


@final
class GetJob:
    __slots__ = ("queues", "timeout", "count", "nohang", "withcounters")

    def __init__(self) -> None:
        self.queues: list[bytes] = []  # empty until FROM (a FROM with no queue is refused)
        self.timeout = 0
        self.count = 1
        self.nohang = False
        self.withcounters = False


def parse_getjob(argv: list[bytes]) -> GetJob | Error:
    """GETJOB [NOHANG] [TIMEOUT ms] [COUNT n] [WITHCOUNTERS] FROM q1 ... qN"""
    req = GetJob()
    from_seen = False
    n = len(argv)
    i = 1
    while i < n:
        opt = argv[i].lower()
        has_value = i + 1 < n
        if opt == b"from":
            req.queues = argv[i + 1 :]
            from_seen = True
            break
        elif opt == b"nohang":
            req.nohang = True
            i += 1
        elif opt == b"withcounters":
            req.withcounters = True
            i += 1
        elif opt == b"timeout" and has_value:
            t = parse_timeout(argv[i + 1])
            if isinstance(t, Error):
                return t
            req.timeout = t
            i += 2
        elif opt == b"count" and has_value:
            v = parse_int(argv[i + 1])
            if v is None or v <= 0:
                return err("COUNT must be a number greater than zero")
            req.count = v
            i += 2
        elif opt in (b"timeout", b"count"):
            return syntax_error(argv[i], _NEEDS_VALUE)
        else:
            return syntax_error(argv[i], "the queues must follow FROM")
    if not req.queues:
        if n == 1 or not from_seen:
            return syntax_error(argv[-1], "FROM and at least one queue must follow")
        return syntax_error(argv[-1], "at least one queue must follow it")
    return req


@final
class ScanArgs:
    __slots__ = ("cursor", "count", "busyloop", "minlen", "maxlen", "importrate", "queue", "states", "reply_all",
                 "internal")  # fmt: skip

    def __init__(self) -> None:
        self.cursor = 0
        self.count = 100
        self.busyloop = False
        self.minlen = -1
        self.maxlen = -1
        self.importrate = -1
        self.queue: bytes | None = None
        self.states: set[int] = set()
        self.reply_all = False
        self.internal = False  # QSCAN ALL: the cluster's own queues too (constants.INTERNAL_QUEUE_PREFIX)


_QSCAN_VALUED: Final = (b"count", b"minlen", b"maxlen", b"importrate")
_JSCAN_VALUED: Final = (b"count", b"queue", b"state", b"reply")


def _parse_scan(argv: list[bytes], jobs: bool) -> ScanArgs | Error:
    args = ScanArgs()
    cursor_set = False
    n = len(argv)
    i = 1
    while i < n:
        opt = argv[i].lower()
        has_value = i + 1 < n
        if opt == b"count" and has_value:
            v = parse_int(argv[i + 1])
            if v is None:
                return NOT_AN_INTEGER
            args.count = v
            i += 2
        elif opt == b"busyloop":
            args.busyloop = True
            i += 1
        elif not jobs and opt == b"all":
            args.internal = True
            i += 1
        elif not jobs and opt in (b"minlen", b"maxlen", b"importrate") and has_value:
            v = parse_int(argv[i + 1])
            if v is None:
                return NOT_AN_INTEGER
            setattr(args, opt.decode(), v)
            i += 2
        elif jobs and opt == b"queue" and has_value:
            args.queue = argv[i + 1]
            i += 2
        elif jobs and opt == b"state" and has_value:
            state = state_from_name(argv[i + 1])
            if state is None:
                return err("Invalid job state name")
            args.states.add(state)
            i += 2
        elif jobs and opt == b"reply" and has_value:
            kind = argv[i + 1].lower()
            if kind == b"id":
                args.reply_all = False
            elif kind == b"all":
                args.reply_all = True
            else:
                return err("Invalid REPLY type, try ID or ALL")
            i += 2
        elif opt in (_JSCAN_VALUED if jobs else _QSCAN_VALUED):  # an option, its value missing
            return syntax_error(argv[i], _NEEDS_VALUE)
        else:
            if cursor_set:
                return syntax_error(argv[i], "the cursor was given already")
            raw = argv[i]
            if not raw.isdigit() or len(raw) > 20 or int(raw) >= 1 << 64:
                return err("invalid cursor")
            args.cursor = int(raw)
            cursor_set = True
            i += 1
    if args.count < 1:
        args.count = 1
    return args


def parse_qscan(argv: list[bytes]) -> ScanArgs | Error:
    """QSCAN [cursor] [COUNT n] [BUSYLOOP] [MINLEN n] [MAXLEN n] [IMPORTRATE r] [ALL] (ALL: ours, the
    cluster's own queues too)"""
    return _parse_scan(argv, jobs=False)


def parse_jscan(argv: list[bytes]) -> ScanArgs | Error:
    """JSCAN [cursor] [COUNT n] [BUSYLOOP] [QUEUE q] [STATE s ...] [REPLY all|id]"""
    return _parse_scan(argv, jobs=True)
