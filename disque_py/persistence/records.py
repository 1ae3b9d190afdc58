"""The AOF record format: encode records, decode them incrementally (sans-I/O).

Theory of operation
-------------------
Like Disque's AOF (aof.c), the file is a sequence of Redis-protocol commands:
each record is one RESP array of bulk strings, so ``head -c`` or ``less`` shows
it, and tools that read a Redis AOF can walk it. Every record is::

    *N\\r\\n $len\\r\\n KIND\\r\\n  ... fields ...  $8\\r\\n <crc32>\\r\\n

The last element is the CRC-32 (zlib's) of every byte of the record before
that element, from the ``*`` on, as 8 lowercase hex digits. Disque relies on
the protocol's framing alone; we add the checksum because a bit flip inside a
body or a number would otherwise load as a wrong job. CRC-32 detects every
error burst of up to 32 bits, so any one damaged byte of a record is found:
either the framing breaks (``CorruptRecord``) or the checksum does. The one
exception: damage that makes a record claim more bytes than the rest of the
file holds (a longer declared length) looks to any reader like a file
cut inside that record, and is reported as ``Truncated`` like one, at that
record's offset and with every byte from it on counted as dropped. Never is a
damaged record decoded.

The kinds (``KINDS``: name, number of elements, decoder) are named after
Disque's commands where one exists:

* ``LOADJOB id state numbers nodes queue body``: a job's creation, or its
  whole state again (a later LOADJOB for the same ID replaces it). ``state``
  is the state's name (``queued`` ...); ``numbers`` is one element of nine
  decimal integers separated by single spaces: repl, flags, ctime, expire,
  delay, retry, nacks, deliveries, requeue. ``expire`` and ``requeue`` are
  wall-clock milliseconds (absolute, so a restart does not stretch a TTL;
  ``requeue`` is the requeue/GC slot of the job, 0 for none); ``nodes`` is
  the node IDs that may hold a copy, separated by single spaces. These are
  ``wire.job_to_wire``'s fields with the TTL made absolute, plus what SHOW
  reports of the state (the confirmed set is replication bookkeeping that a
  restart starts again, and the wake-up follows from the times), and the
  job's flag bits (``core.job.F_*``), as Disque's serialized job has them
  (ADDJOB's PRIORITY among them: ``core.job.F_PRIORITY``; a loader of before
  it, whose flags stop at 255, refuses the LOADJOB of a job with one).
  A job without a queue or body (a dummy ack) is written with empty ones.
* ``QUEUED id``, ``ACTIVE id`` (delivered or dequeued), ``ACKED id``,
  ``DELJOB id``: the state changes that matter, and the end of a job.
* ``JOBEXTRA id extra``: what a job carries beyond Disque's fields (its
  delivery policy, counted deliveries, last NACK reason, a dead letter's
  origin: ``core.job.Extra``), written right after the job's LOADJOB, only for
  a job that has it. ``extra`` is the wire codec's map (``core.wire.
  extra_to_wire``) packed with msgpack; a job without it writes nothing new.
* ``DEDUPGONE id until``: a DEDUP job was deleted here; its ID is remembered
  (a repeat ADDJOB answers it, adding nothing) until ``until``, wall-clock ms
  (``core/dedup.py``).
* ``VERSION release``: the records after it were written by disque-py ``release``
  (``0.2.0``; 1-32 letters, digits and ``.+-_``). A node writes it first in a file it
  makes (a rewrite) and when it starts appending to a file whose last VERSION is not its
  own (or that has none: written by 0.1.0, the release before this record). A loader
  that meets a record it cannot read after a newer release's VERSION says so
  (``server/aof.py``): a newer release's kinds are unknown to an older one, which refuses
  them rather than guessing (the format's rule below).
* ``GROUPSET name settings``: a group's settings (GROUP WEIGHT, GROUP LIMIT:
  ``core/limits.py``), the bus's record (``Settings.to_wire``) packed with
  msgpack; written at each change and for every group in a rewrite; loaded in
  order, the later stamp of each part winning, as the bus merges them.

Why the numbers share one element: a bulk string per field would make a
LOADJOB 16 elements long, and decoding costs a few hundred nanoseconds of
Python per element; one regular expression and nine ``int`` calls are
cheaper, and the line still reads as plain text (``3 0 1732...``). msgpack would be as fast
but not readable; the body stays its own element, binary-safe. The layout of
a kind is fixed (its count is checked): a later version adds a kind instead
of appending fields, so a count damaged by a bit flip is never taken for a
newer layout.

Decoding (``RecordReader``) takes bytes in any slicing, down to one byte at a
time, with the same result as all at once: ``feed`` returns each record
completed so far with the byte offset where it starts, and ``finish`` says
whether a partial record is left at the end (``Truncated``: its offset, the
bytes it holds). Anything malformed raises ``CorruptRecord`` (an ``AofError``)
with the offset of the record it is in and the reason, as soon as the bytes
that show it are there; nothing else escapes. No declared length is allocated
before its bytes arrive, and lengths beyond ``MAX_BULK_LEN`` are corrupt.

Speed: the element-by-element parser (``RecordReader._parse``) costs a few
hundred nanoseconds of Python per element. Most records are taken instead by a
fast path (``_fast``): one regular expression matches a record's framing and
every element but the body in C, and the same field checks build the record
(``_build_loadjob``, a kind's decoder); it steps aside
for anything else, so the element-by-element parser alone decides what is
corrupt and why. ``scripts/benchmarks/bench_aof_records.py`` measures it.
hiredis, which parses RESP in C, does not fit: it does not say where a reply
ends (the offsets), preallocates a nested array's declared count, and skips the
two bytes after a bulk string unchecked.

Imports nothing of the shell and no I/O (tests/test_contracts.py).
"""

from __future__ import annotations

import re
import zlib
from dataclasses import dataclass
from typing import Any, Callable, Final, NamedTuple, final

import msgpack

from ..core.constants import DURATION_MAX, INT64_MAX, REPLICATE_MAX
from ..core.ids import JOB_ID_LEN, NODE_ID_LEN, NODE_IDS_SEEN, valid_job_id, valid_node_ids
from ..core.job import FLAGS_MAX, GROUP_NAME_MAX, STATE_BY_NAME, STATE_NAMES, Extra, Job
from ..core.limits import Settings, settings_from_wire
from ..core.wire import extra_from_wire, extra_to_wire

__all__ = [
    "AofError",
    "CorruptRecord",
    "Truncated",
    "LoadJob",
    "Queued",
    "Active",
    "Acked",
    "DelJob",
    "JobExtra",
    "DedupGone",
    "Version",
    "Record",
    "KINDS",
    "MAX_BULK_LEN",
    "RecordReader",
    "encode",
    "encode_many",
    "encode_loadjob",
    "encode_job",
    "encode_queued",
    "encode_active",
    "encode_acked",
    "encode_deljob",
    "encode_extra",
    "encode_groupset",
    "GroupSet",
    "encode_gone",
    "encode_version",
    "load_job_record",
]

#: Largest bulk string a record may declare (the default of proto-max-bulk-len: a job
#: body a client could send). Beyond it a record is corrupt.
# (Final: compiled, a module constant is read natively rather than from the module's dict.)
MAX_BULK_LEN: Final = 512 * 1024**2
_LEN_DIGITS: Final = len(str(MAX_BULK_LEN))
_STATE_BYTES = tuple(name.encode() for name in STATE_NAMES)
_NUMBERS = 9


class AofError(Exception):
    """Every error the record decoder raises."""


class CorruptRecord(AofError):
    """The bytes at ``offset`` (where the damaged record starts) are not a valid record."""

    def __init__(self, offset: int, reason: str, records: list | None = None) -> None:
        super().__init__(f"corrupt AOF record at byte offset {offset}: {reason}")
        self.offset = offset
        self.reason = reason
        #: the records completed by the same ``feed`` call before the damaged one
        self.records = records if records is not None else []


class Truncated(NamedTuple):
    """A partial record at the end: it starts at ``offset`` and holds ``dropped`` bytes."""

    offset: int
    dropped: int


_LOADJOB_FIELDS = ("id", "state", "repl", "flags", "ctime", "expire", "delay", "retry", "nacks", "deliveries",
                   "requeue", "queue", "nodes", "body")  # fmt: skip


@final
class LoadJob:
    """A job's whole state (creation, or a replacement). Times are wall-clock ms.

    A final class with typed slots, not a tuple: a load builds and reads a million of them,
    and compiled, building one is a native call and reading a field a load from the struct
    (a NamedTuple's fields are read through the tuple, its ``__new__`` is interpreted).
    Compared by value, like the other records.
    """

    __slots__ = ("id", "state", "repl", "flags", "ctime", "expire", "delay", "retry", "nacks", "deliveries",
                 "requeue", "queue", "nodes", "body")  # _LOADJOB_FIELDS

    def __init__(self, id: bytes, state: int, repl: int, flags: int, ctime: int, expire: int, delay: int,
                 retry: int, nacks: int, deliveries: int, requeue: int, queue: bytes, nodes: tuple,
                 body: bytes) -> None:  # fmt: skip
        self.id = id
        self.state = state  # core.job.WAIT_REPL ... ACKED
        self.repl = repl
        self.flags = flags
        self.ctime = ctime
        self.expire = expire  # absolute wall-clock ms
        self.delay = delay
        self.retry = retry
        self.nacks = nacks
        self.deliveries = deliveries
        self.requeue = requeue  # absolute wall-clock ms of the next requeue (GC attempt if acked); 0 = none
        self.queue = queue
        self.nodes = nodes  # node IDs (str) that may hold a copy
        self.body = body

    def fields(self) -> tuple:
        """Every field, in the record's order."""
        return (self.id, self.state, self.repl, self.flags, self.ctime, self.expire, self.delay, self.retry,
                self.nacks, self.deliveries, self.requeue, self.queue, self.nodes, self.body)  # fmt: skip

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, LoadJob):
            return NotImplemented
        return self.fields() == other.fields()

    def __ne__(self, other: object) -> bool:
        if not isinstance(other, LoadJob):
            return NotImplemented
        return self.fields() != other.fields()

    def __hash__(self) -> int:
        return hash(self.fields())

    def __repr__(self) -> str:
        return "LoadJob(%s)" % ", ".join("%s=%r" % kv for kv in zip(_LOADJOB_FIELDS, self.fields()))


# The one-ID kinds are slotted frozen dataclasses so that Queued(x) != Active(x).
@dataclass(frozen=True, slots=True)
class Queued:
    id: bytes


@dataclass(frozen=True, slots=True)
class Active:
    id: bytes


@dataclass(frozen=True, slots=True)
class Acked:
    id: bytes


@dataclass(frozen=True, slots=True)
class DelJob:
    id: bytes


@dataclass(frozen=True, slots=True)
class JobExtra:
    id: bytes
    extra: Extra


@dataclass(frozen=True, slots=True)
class DedupGone:
    id: bytes
    until: int  # wall-clock ms


@dataclass(frozen=True, slots=True)
class Version:
    release: str  # the disque-py release that wrote the records after this one


@dataclass(frozen=True, slots=True)
class GroupSet:
    """A group's settings (GROUP WEIGHT, GROUP LIMIT: core/limits.py), as the bus carries them."""

    settings: Settings


Record = LoadJob | Queued | Active | Acked | DelJob | JobExtra | DedupGone | Version | GroupSet


# --- encoding -------------------------------------------------------------------------


def _finish(parts: list[bytes]) -> bytes:
    """The record of the elements ``parts`` (kind first), its checksum appended."""
    out = bytearray(b"*%d\r\n" % (len(parts) + 1))
    for p in parts:
        out += b"$%d\r\n" % len(p)
        out += p
        out += b"\r\n"
    out += b"$8\r\n%08x\r\n" % zlib.crc32(out)
    return bytes(out)


def encode_loadjob(r: LoadJob) -> bytes:
    numbers = b"%d %d %d %d %d %d %d %d %d" % (
        r.repl, r.flags, r.ctime, r.expire, r.delay, r.retry, r.nacks, r.deliveries, r.requeue,
    )  # fmt: skip
    nodes = " ".join(r.nodes).encode("ascii")
    return _finish([b"LOADJOB", bytes(r.id), _STATE_BYTES[r.state], numbers, nodes, bytes(r.queue), bytes(r.body)])


def encode_queued(job_id: bytes) -> bytes:
    return _finish([b"QUEUED", bytes(job_id)])


def encode_active(job_id: bytes) -> bytes:
    return _finish([b"ACTIVE", bytes(job_id)])


def encode_acked(job_id: bytes) -> bytes:
    return _finish([b"ACKED", bytes(job_id)])


def encode_extra(job: Job) -> bytes:
    """The JOBEXTRA record of a job whose ``extra`` is set."""
    return _finish([b"JOBEXTRA", bytes(job.id), _packb(extra_to_wire(job.extra))])  # type: ignore[arg-type]


def _encode_jobextra(r: JobExtra) -> bytes:
    return _finish([b"JOBEXTRA", bytes(r.id), _packb(extra_to_wire(r.extra))])


_packb = msgpack.Packer(use_bin_type=True).pack


def encode_gone(job_id: bytes, until: int) -> bytes:
    """The DEDUPGONE record: ``job_id`` remembered until ``until`` (wall-clock ms)."""
    return _finish([b"DEDUPGONE", bytes(job_id), b"%d" % until])


def encode_groupset(s: Settings) -> bytes:
    """The GROUPSET record of a group's settings."""
    return _finish([b"GROUPSET", bytes(s.name), _packb(s.to_wire())])


def _decode_groupset(e: list[bytes]) -> GroupSet:
    try:
        d = msgpack.unpackb(e[2], raw=False, strict_map_key=True, max_ext_len=0, max_str_len=256,
                            max_bin_len=256, max_array_len=16, max_map_len=0)  # fmt: skip
    except Exception:
        raise _Bad("GROUPSET: malformed record") from None
    s = settings_from_wire(d)
    if s is None or s.name != e[1]:
        raise _Bad("GROUPSET: malformed record")
    return GroupSet(s)


def _encode_dedupgone(r: DedupGone) -> bytes:
    return encode_gone(r.id, r.until)


def encode_deljob(job_id: bytes) -> bytes:
    return _finish([b"DELJOB", bytes(job_id)])


def encode_version(release: str) -> bytes:
    """The VERSION record: what follows was written by ``release``."""
    raw = release.encode()
    if _RELEASE_RE.fullmatch(raw) is None:
        raise ValueError("a release is 1-%d letters, digits and .+-_: %r" % (_RELEASE_MAX, release))
    return _finish([b"VERSION", raw])


_ENCODERS: dict[type, Callable[[Any], bytes]] = {
    LoadJob: encode_loadjob,
    JobExtra: _encode_jobextra,
    DedupGone: _encode_dedupgone,
    GroupSet: lambda r: encode_groupset(r.settings),
    Queued: lambda r: encode_queued(r.id),
    Active: lambda r: encode_active(r.id),
    Acked: lambda r: encode_acked(r.id),
    DelJob: lambda r: encode_deljob(r.id),
    Version: lambda r: encode_version(r.release),
}


def encode(record: Record) -> bytes:
    """One record's bytes."""
    return _ENCODERS[type(record)](record)


def encode_many(records) -> bytes:
    """Many records as one string of bytes (one write for a pass's records)."""
    encoders = _ENCODERS
    return b"".join([encoders[type(r)](r) for r in records])


def load_job_record(job: Job, wall_offset: int) -> LoadJob:
    """The LOADJOB record of ``job``.

    ``wall_offset`` is wall-clock ms minus the core's clock (``Node.wall_offset``).
    """
    requeue = job.next_at  # its next requeue, or its next GC attempt if acked (job.py)
    return LoadJob(
        job.id, job.state, job.repl, job.flags, job.ctime, job.etime + wall_offset, job.delay,
        job.retry, job.nacks, job.deliveries, requeue + wall_offset if requeue else 0,
        job.queue if job.queue is not None else b"", tuple(job.delivered),
        job.body if job.body is not None else b"",
    )  # fmt: skip


_NODES_BYTES: dict[tuple, bytes] = {}  # holders' tuple -> its element (a cluster has few)
_LOADJOB_HEAD = b"*8\r\n$7\r\nLOADJOB\r\n$40\r\n"


def encode_job(job: Job, wall_offset: int, _crc=zlib.crc32) -> bytes:
    """``encode_loadjob(load_job_record(job, wall_offset))``, the same bytes, in one step.

    The AOF's hot path (every job written goes through it): no intermediate record, one
    format for the framing, the holders' element cached by tuple (docs/benchmarks-history.md, "The append only file")."""
    requeue = job.next_at
    numbers = b"%d %d %d %d %d %d %d %d %d" % (
        job.repl, job.flags, job.ctime, job.etime + wall_offset, job.delay, job.retry, job.nacks,
        job.deliveries, requeue + wall_offset if requeue else 0,
    )  # fmt: skip
    delivered = job.delivered
    if type(delivered) is not tuple:
        delivered = tuple(delivered)
    nodes = _NODES_BYTES.get(delivered)
    if nodes is None:
        nodes = " ".join(delivered).encode("ascii")
        if len(_NODES_BYTES) >= 4096:
            _NODES_BYTES.clear()
        _NODES_BYTES[delivered] = nodes
    queue = job.queue if job.queue is not None else b""
    body = job.body if job.body is not None else b""
    state = _STATE_BYTES[job.state]
    rec = b"%s%s\r\n$%d\r\n%s\r\n$%d\r\n%s\r\n$%d\r\n%s\r\n$%d\r\n%s\r\n$%d\r\n%s\r\n" % (
        _LOADJOB_HEAD, job.id, len(state), state, len(numbers), numbers, len(nodes), nodes,
        len(queue), queue, len(body), body,
    )  # fmt: skip
    return b"%s$8\r\n%08x\r\n" % (rec, _crc(rec))


# --- decoding -------------------------------------------------------------------------


class _Bad(Exception):
    """A record's reason to be corrupt, before its offset is attached."""


_NUMBERS_RE = re.compile(rb" ".join([rb"(\d{1,19})"] * _NUMBERS))


def _decode_loadjob(e: list[bytes]) -> LoadJob:
    m = _NUMBERS_RE.fullmatch(e[3])  # ASCII digits only: int() would take signs, "_", spaces
    if m is None:
        raise _Bad("LOADJOB: expected 9 decimal numbers")
    if not valid_job_id(e[1]):
        raise _Bad("LOADJOB: malformed job ID")
    state = STATE_BY_NAME.get(e[2])
    if state is None:
        raise _Bad("LOADJOB: unknown state")
    g = m.groups()
    return _build_loadjob(e[1], state, int(g[0]), int(g[1]), int(g[2]), int(g[3]), int(g[4]), int(g[5]), int(g[6]),
                          int(g[7]), int(g[8]), e[4], e[5], e[6])  # fmt: skip


def _build_loadjob(job_id: bytes, state: int, repl: int, flags: int, ctime: int, expire: int, delay: int,
                   retry: int, nacks: int, deliv: int, requeue: int, nodes_bytes: bytes, queue: bytes,
                   body: bytes) -> LoadJob:  # fmt: skip
    """The LoadJob of a LOADJOB's elements, its ID and state already checked, its 9 numbers
    read from their digits. Raises _Bad for a number out of range or a malformed node ID."""
    if not (1 <= repl <= REPLICATE_MAX and flags <= FLAGS_MAX and delay <= DURATION_MAX and retry <= DURATION_MAX):
        raise _Bad("LOADJOB: number out of range")
    if ctime > INT64_MAX or expire > INT64_MAX or nacks > INT64_MAX or deliv > INT64_MAX or requeue > INT64_MAX:
        raise _Bad("LOADJOB: number out of range")
    nodes = _NODES_SEEN.get(nodes_bytes)
    if nodes is None:
        nodes = _decode_nodes(nodes_bytes)
    return LoadJob(job_id, state, repl, flags, ctime, expire, delay, retry, nacks, deliv, requeue, queue, nodes, body)


# The holders' element of the LOADJOBs already decoded: a cluster has few nodes, so
# the same few strings come back in most records. At most _NODES_SEEN_MAX (then emptied).
_NODES_SEEN: Final[dict[bytes, tuple]] = {}
_NODES_SEEN_MAX: Final = 4096


def _decode_nodes(nodes_bytes: bytes) -> tuple:
    if not nodes_bytes:
        return ()
    try:
        nodes = nodes_bytes.decode("ascii").split(" ")
    except UnicodeDecodeError:
        raise _Bad("LOADJOB: malformed node ID") from None
    if not NODE_IDS_SEEN.issuperset(nodes) and not valid_node_ids(nodes):
        raise _Bad("LOADJOB: malformed node ID")
    if len(_NODES_SEEN) >= _NODES_SEEN_MAX:
        _NODES_SEEN.clear()
    nodes_tuple = _NODES_SEEN[nodes_bytes] = tuple(nodes)
    return nodes_tuple


def _id_decoder(kind: type[Queued] | type[Active] | type[Acked] | type[DelJob]) -> Callable[[list[bytes]], Record]:
    name = kind.__name__.upper()

    def decode(e: list[bytes]) -> Record:
        if not valid_job_id(e[1]):
            raise _Bad(f"{name}: malformed job ID")
        return kind(e[1])

    return decode


_MAX_EXTRA = 1 << 22


def _decode_jobextra(e: list[bytes]) -> JobExtra:
    if not valid_job_id(e[1]):
        raise _Bad("JOBEXTRA: malformed job ID")
    try:
        d = msgpack.unpackb(e[2], raw=False, strict_map_key=True, max_ext_len=0, max_str_len=_MAX_EXTRA,
                            max_bin_len=_MAX_EXTRA, max_array_len=1024, max_map_len=64)  # fmt: skip
    except Exception:
        raise _Bad("JOBEXTRA: malformed map") from None
    extra = extra_from_wire(d)
    if extra is None:
        raise _Bad("JOBEXTRA: malformed map")
    return JobExtra(bytes(e[1]), extra)


_DIGITS_RE = re.compile(rb"\d{1,19}")


def _decode_dedupgone(e: list[bytes]) -> DedupGone:
    if not valid_job_id(e[1]):
        raise _Bad("DEDUPGONE: malformed job ID")
    if _DIGITS_RE.fullmatch(e[2]) is None or int(e[2]) > INT64_MAX:
        raise _Bad("DEDUPGONE: expected a decimal number")
    return DedupGone(bytes(e[1]), int(e[2]))


_RELEASE_MAX: Final = 32
_RELEASE_RE: Final = re.compile(rb"[0-9A-Za-z.+_-]{1,32}")


def _decode_version(e: list[bytes]) -> Version:
    if _RELEASE_RE.fullmatch(e[1]) is None:
        raise _Bad("VERSION: a release is 1-32 letters, digits and .+-_")
    return Version(e[1].decode("ascii"))


class Kind(NamedTuple):
    count: int  # type: ignore[assignment]  # elements, the kind and the checksum included
    decode: Callable[[list[bytes]], Record]  # the elements before the checksum -> record; raises _Bad
    limits: tuple  # the largest length of each element before the checksum


_ID_LIMITS = (16, JOB_ID_LEN)
_NODES_LIMIT: Final = REPLICATE_MAX * (NODE_ID_LEN + 1)
#: Every kind of record by name. A new kind is one more row (and its record type, encoder).
KINDS: dict[bytes, Kind] = {
    b"LOADJOB": Kind(8, _decode_loadjob,
                     (16, JOB_ID_LEN, 16, _NUMBERS * 20, _NODES_LIMIT, MAX_BULK_LEN, MAX_BULK_LEN)),
    b"QUEUED": Kind(3, _id_decoder(Queued), _ID_LIMITS),
    b"ACTIVE": Kind(3, _id_decoder(Active), _ID_LIMITS),
    b"ACKED": Kind(3, _id_decoder(Acked), _ID_LIMITS),
    b"DELJOB": Kind(3, _id_decoder(DelJob), _ID_LIMITS),
    b"JOBEXTRA": Kind(4, _decode_jobextra, (16, JOB_ID_LEN, _MAX_EXTRA)),
    b"DEDUPGONE": Kind(4, _decode_dedupgone, (16, JOB_ID_LEN, 20)),
    b"VERSION": Kind(3, _decode_version, (16, _RELEASE_MAX)),
    b"GROUPSET": Kind(4, _decode_groupset, (16, GROUP_NAME_MAX, 512)),
}  # fmt: skip
_COUNTS = frozenset(k.count for k in KINDS.values())
_KIND_LIMIT = 16
_INCOMPLETE = None


# The fast path: one regular expression finds a well-formed record's framing and every
# element but the body in C. It accepts only records that ``RecordReader._parse`` accepts,
# as the same record; on anything else (a partial record, damage, a queue name with CR or
# LF, an unusual node ID) it steps aside and the element-by-element parser decides, with
# its exact reason.
_FAST_ID: Final = re.compile(rb"\*3\r\n\$(\d)\r\n([A-Z]{1,9})\r\n\$40\r\n(.{40})\r\n\$8\r\n([0-9a-f]{8})\r\n", re.DOTALL)
# A LOADJOB's state element ("$6\r\nqueued") matched whole, and its length digits compared
# as written (_DECIMAL), not read: the common record costs no int() but its numbers' and body's.
_STATE_BY_ELEMENT: Final = {b"$%d\r\n%s" % (len(name), name): i for name, i in STATE_BY_NAME.items()}
_FAST_LOADJOB: Final = re.compile(
    rb"\*8\r\n\$7\r\nLOADJOB\r\n\$40\r\n(D-[0-9a-fA-F]{8}-[A-Za-z0-9+/]{24}-[0-9a-fA-F]{4})\r\n("
    + rb"|".join(re.escape(e) for e in _STATE_BY_ELEMENT)
    + rb")\r\n\$(\d{1,3})\r\n"
    + rb" ".join([rb"(\d{1,19})"] * _NUMBERS)
    + rb"\r\n\$(\d{1,7})\r\n([0-9A-Za-z ]*)\r\n\$(\d{1,9})\r\n([^\r\n]*)\r\n\$(\d{1,9})\r\n",
    re.DOTALL,
)
_crc32: Final = zlib.crc32
_DECIMAL: Final = tuple(b"%d" % i for i in range(1000))


def _num(digits: bytes) -> int:
    """``int(digits)`` of a run of 1-19 ASCII digits (matched as such): one digit is read
    directly, as most of a LOADJOB's numbers are (flags, delay, counters: 0). Compiled,
    11 ns rather than int()'s 45; interpreted, the same as int()."""
    if len(digits) == 1:
        return digits[0] - 48
    return int(digits)


def _says(digits: bytes, n: int) -> bool:
    """Whether the length ``digits`` read ``n`` as written, without a leading zero (with one,
    the fast path steps aside: the element-by-element parser reads it)."""
    if n < 1000:
        return digits == _DECIMAL[n]
    return digits == b"%d" % n


def _fast(buf: bytearray, pos: int) -> tuple[Record, int] | None:
    """The record at ``pos`` and its end, if the fast path can take it; raises _Bad as _parse would."""
    if pos + 1 >= len(buf):
        return None
    count = buf[pos + 1]
    if count == 56:  # "*8"
        m = _FAST_LOADJOB.match(buf, pos)
        if m is None:
            return None
        # groups: 0 id, 1 state's element, 2 numbers' length, 3-11 the numbers,
        # 12 nodes' length, 13 nodes, 14 queue's length, 15 queue, 16 body's length
        g = m.groups()
        state = _STATE_BY_ELEMENT.get(g[1])
        nodes: bytes = g[13]
        queue: bytes = g[15]
        if state is None or not _says(g[2], m.end(12) - m.start(4)) or not _says(g[12], len(nodes)):
            return None
        n = int(g[16])
        if not _says(g[14], len(queue)) or n > MAX_BULK_LEN or len(nodes) > _NODES_LIMIT:
            return None
        bs = m.end()
        be = bs + n
        # the body's CRLF, then the checksum element as _parse compares it (one format and
        # one compare: cheaper than a second expression and int(..., 16))
        end = be + 16
        if buf[be:end] != b"\r\n$8\r\n%08x\r\n" % _crc32(buf[pos : be + 2]):
            return None
        return _build_loadjob(g[0], state, _num(g[3]), _num(g[4]), _num(g[5]), _num(g[6]), _num(g[7]), _num(g[8]),
                              _num(g[9]), _num(g[10]), _num(g[11]), nodes, queue, bytes(buf[bs:be])), end
    if count == 51:  # "*3"
        m = _FAST_ID.match(buf, pos)
        if m is None:
            return None
        name_len, name, job_id, crc = m.groups()
        kind = KINDS.get(name)
        if kind is None or kind.count != 3 or int(name_len) != len(name):
            return None
        end = m.end()
        if int(crc, 16) != _crc32(buf[pos : end - 14]):
            return None
        return kind.decode([name, job_id]), end
    return None


@final
class RecordReader:
    """Incremental decoder: ``feed`` bytes, get records with their offsets; ``finish`` at EOF.

    Once a ``CorruptRecord`` is raised, every later call raises it again.
    """

    __slots__ = ("_buf", "_base", "_error", "_finished")

    def __init__(self, offset: int = 0) -> None:
        self._buf = bytearray()
        self._base = offset  # absolute offset of _buf[0]
        self._error: CorruptRecord | None = None
        self._finished = False

    @property
    def offset(self) -> int:
        """Where the next record starts (bytes fed and decoded so far)."""
        return self._base

    def feed(self, data: bytes | bytearray | memoryview) -> list[tuple[int, Record]]:
        """Every record completed by ``data``, as (offset, record), in file order."""
        if self._error is not None:
            raise self._error
        if self._finished:
            raise AofError("feed after finish")
        buf = self._buf
        buf += data
        out: list[tuple[int, Record]] = []
        pos = 0
        end = len(buf)
        base = self._base
        try:
            while pos < end:
                got = _fast(buf, pos)  # called by name: compiled, a native call
                if got is None:
                    got = RecordReader._parse(buf, pos, end)
                    if got is None:
                        break
                out.append((base + pos, got[0]))
                pos = got[1]
        except _Bad as exc:
            self._error = CorruptRecord(base + pos, str(exc), out)
            del buf[:pos]
            self._base = base + pos
            raise self._error from None
        if pos:
            del buf[:pos]
            self._base = base + pos
        return out

    def finish(self) -> Truncated | None:
        """At the end of the file: the partial record left, if any."""
        if self._error is not None:
            raise self._error
        self._finished = True
        if not self._buf:
            return None
        return Truncated(self._base, len(self._buf))

    @staticmethod
    def _parse(buf: bytearray, pos: int, end: int) -> tuple[Record, int] | None:
        """One record at ``pos``: (record, its end), None if incomplete; raises _Bad.

        Every check is made as soon as its bytes are in, and never depends on how many
        bytes follow them, so any slicing of the input raises the same error.
        """
        start = pos
        if buf[pos] != 42:  # "*"
            raise _Bad("expected '*'")
        window = pos + 5  # "*" + at most 2 digits + CRLF
        nl = buf.find(b"\r\n", pos + 1, window)
        if nl < 0:
            if end >= window:
                raise _Bad("malformed element count")
            return _INCOMPLETE
        digits = buf[pos + 1 : nl]
        if not digits.isdigit():
            raise _Bad("malformed element count")
        count = int(digits)
        if count not in _COUNTS:
            raise _Bad(f"no kind of record has {count} elements")
        pos = nl + 2
        elements: list[bytes] = []
        append = elements.append
        limits: tuple = (_KIND_LIMIT,)
        kind = None
        for i in range(count):
            # element header: "$" digits CRLF
            if pos >= end:
                return _INCOMPLETE
            if buf[pos] != 36:  # "$"
                raise _Bad("expected '$'")
            window = pos + 3 + _LEN_DIGITS
            nl = buf.find(b"\r\n", pos + 1, window)
            if nl < 0:
                if end >= window:
                    raise _Bad("malformed length")
                return _INCOMPLETE
            digits = buf[pos + 1 : nl]
            if not digits.isdigit():
                raise _Bad("malformed length")
            n = int(digits)
            last = i == count - 1
            if last:
                if n != 8:
                    raise _Bad("malformed checksum")
            elif n > limits[i]:
                raise _Bad("element too long")
            s = nl + 2
            e = s + n
            if e + 2 > end:
                return _INCOMPLETE
            if buf[e] != 13 or buf[e + 1] != 10:
                raise _Bad("expected CRLF after a bulk string")
            if last:
                if buf[s:e] != b"%08x" % zlib.crc32(buf[start:pos]):
                    raise _Bad("checksum mismatch")
                assert kind is not None
                return kind.decode(elements), e + 2
            append(bytes(buf[s:e]))
            if i == 0:
                kind = KINDS.get(elements[0])
                if kind is None:
                    raise _Bad("unknown kind of record")
                if kind.count != count:
                    raise _Bad(f"{elements[0].decode()} has {kind.count} elements, not {count}")
                limits = kind.limits
            pos = e + 2
        raise AssertionError("unreachable")  # the checksum element returns
