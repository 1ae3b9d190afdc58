"""Job IDs.

A job ID is 40 ASCII characters::

    D-dcb833cf-8YL1NT17e9+wsA/09NqxscQI-05a1
    |  |        |                        |
    |  |        |                        TTL in minutes, 4 hex digits
    |  |        144 pseudo-random bits, standard base64 (24 chars)
    |  first 8 hex digits of the creating node's ID
    fixed "D-"

The random parts are made ID_BATCH at a time: 18 bytes each of one
SHAKE-256(seed || counter) output, with a seed drawn once per process by the
shell and a 64-bit counter of batches (one hash and one base64 encoding per
batch instead of one of each per ID). The TTL field is
clamped to 0..65535 minutes and its parity says what kind of job it is: even
for at-most-once jobs (RETRY 0), odd otherwise. That lets a node that has
never seen a job decide from the ID alone whether an ACK for it needs a
"dummy ack" (only for at-least-once jobs) and when such an ACK may expire.

Everything here works on ``bytes``: IDs arrive from the network as bytes and
are used as dictionary keys as they are.
"""

from __future__ import annotations

import binascii
import hashlib
import re
from typing import Final, final

__all__ = [
    "JOB_ID_LEN",
    "JobIdGenerator",
    "valid_job_id",
    "ttl_minutes_from_id",
    "is_at_most_once_id",
    "node_prefix_from_id",
    "dead_letter_id",
    "dedup_job_id",
    "NODE_ID_LEN",
    "NODE_IDS_SEEN",
    "valid_node_ids",
]

JOB_ID_LEN: Final = 40
#: Job IDs whose random parts one hash makes (JobIdGenerator).
ID_BATCH: Final = 64
_ID_RE: Final = re.compile(rb"D-[0-9a-fA-F]{8}-[A-Za-z0-9+/]{24}-[0-9a-fA-F]{4}")

NODE_ID_LEN: Final = 40
# Node IDs already found well formed by valid_node_ids. A cluster has few nodes and their IDs
# come back in every REPLJOB and DELJOB, so a caller first asks
# ``NODE_IDS_SEEN.issuperset(nodes)`` (one set lookup in C per ID; TypeError for an unhashable
# element) and calls valid_node_ids only if that fails: two checks in Python per ID cost ~1,000
# instructions more for three holders. Never more than NODE_IDS_SEEN_MAX (then emptied).
NODE_IDS_SEEN: Final[set[str]] = set()
NODE_IDS_SEEN_MAX: Final = 4096


def valid_node_ids(nodes: list) -> bool:
    """Every element of ``nodes`` a ``str`` of NODE_ID_LEN; remembered in NODE_IDS_SEEN if so."""
    for n in nodes:
        if type(n) is not str or len(n) != NODE_ID_LEN:
            return False
    if len(NODE_IDS_SEEN) > NODE_IDS_SEEN_MAX:
        NODE_IDS_SEEN.clear()
    NODE_IDS_SEEN.update(nodes)
    return True


@final
class JobIdGenerator:
    """Makes job IDs for one node. ``seed`` comes from the shell (urandom)."""

    __slots__ = ("_prefix", "_seed", "_counter", "_suffixes", "_batch", "_next", "_last_ttl", "_last_retry",
                 "_last_suffix")  # fmt: skip

    def __init__(self, node_id: str, seed: bytes) -> None:
        if len(node_id) < 8:
            raise ValueError("node id too short")
        self._prefix = b"D-" + node_id[:8].encode("ascii") + b"-"
        self._seed = bytes(seed)
        self._counter = 0  # batches made
        self._suffixes: dict[tuple[int, bool], bytes] = {}
        self._batch = b""  # the base64 random parts of the current batch, 24 characters each
        self._next = 0  # where the next ID's random part starts in it
        # the last ID's TTL, whether it had a RETRY, and their suffix: a producer sends the same
        # options job after job, so the suffixes' table is looked up only when they change
        self._last_ttl = -1
        self._last_retry = False
        self._last_suffix = b""

    def _refill(self) -> None:
        self._counter += 1
        digest = hashlib.shake_256(self._seed + self._counter.to_bytes(8, "little")).digest(18 * ID_BATCH)
        # 18 bytes are 24 base64 characters without padding, so the encoding of the whole batch
        # is the encodings of its 18-byte parts one after the other.
        self._batch = binascii.b2a_base64(digest, newline=False)
        self._next = 0

    def new_id(self, ttl_seconds: int, retry: int) -> bytes:
        i = self._next
        if i == len(self._batch):
            self._refill()
            i = 0
        self._next = i + 24
        if ttl_seconds == self._last_ttl and (retry > 0) == self._last_retry:
            return self._prefix + self._batch[i : i + 24] + self._last_suffix
        suffix = self._suffix(ttl_seconds, retry)
        self._last_ttl = ttl_seconds
        self._last_retry = retry > 0
        self._last_suffix = suffix
        return self._prefix + self._batch[i : i + 24] + suffix

    def _suffix(self, ttl_seconds: int, retry: int) -> bytes:
        key = (ttl_seconds, retry > 0)
        suffix = self._suffixes.get(key)
        if suffix is None:
            minutes = ttl_seconds // 60
            if minutes > 0xFFFF:
                minutes = 0xFFFF
            elif minutes < 0:
                minutes = 1
            minutes = (minutes | 1) if retry > 0 else (minutes & ~1)
            suffix = b"-%04x" % minutes
            if len(self._suffixes) < 4096:
                self._suffixes[key] = suffix
        return suffix


# What the ID checks accept: a compiled module checks a ``bytes`` argument for exactly bytes,
# and IDs arrive from parsers and AOF records as any of these.
BytesLike = bytes | bytearray | memoryview


def valid_job_id(job_id: BytesLike) -> bool:
    """Shape and alphabet check; lookups do the rest.

    Stricter than Disque (which checks only length and dashes): every ID a
    node generates matches, and anything else could never be found anyway.
    It also guarantees that an ID is safe to echo as a status reply.
    """
    return len(job_id) == JOB_ID_LEN and _ID_RE.fullmatch(job_id) is not None


def dead_letter_id(job_id: BytesLike) -> bytes:
    """The ID of ``job_id``'s dead letter: the same node prefix and TTL field, and 144 bits
    of SHA1 of the original ID. The same on every node, so two holders that dead-letter one
    job at once (a race, or both sides of a partition) make copies of one job, which the
    holders merge, never two jobs."""
    digest = hashlib.sha1(b"dead-letter:" + bytes(job_id)).digest()
    return bytes(job_id[:11]) + binascii.b2a_base64(digest[:18], newline=False) + bytes(job_id[35:])


def dedup_job_id(queue: BytesLike, key: BytesLike, retry: int) -> bytes:
    """The ID of the job that ADDJOB ... DEDUP ``key`` adds to ``queue`` (dedup.py): a function
    of the queue, the key and at-most-once-ness alone, so that every node that takes the same
    ADDJOB makes the same job, whatever its other options. The node part and the random part
    are SHA-256 of queue and key (no node made it alone); the TTL field is the largest (the
    job's TTL is its own, the ID says only that it is long), with the usual parity: odd for a
    job with a RETRY, even for an at-most-once one (RETRY 0: another ID than the same key's
    with a RETRY)."""
    digest = hashlib.sha256(b"dedup:%d:%s:%s" % (len(queue), bytes(queue), bytes(key))).digest()
    minutes = 0xFFFF if retry > 0 else 0xFFFE
    return b"D-%s-%s-%04x" % (digest[:4].hex().encode(), binascii.b2a_base64(digest[4:22], newline=False), minutes)


def ttl_minutes_from_id(job_id: bytes) -> int:
    return int(job_id[36:40], 16)


def is_at_most_once_id(job_id: bytes) -> bool:
    """True for IDs of RETRY 0 jobs (even TTL field)."""
    return ttl_minutes_from_id(job_id) & 1 == 0


def node_prefix_from_id(job_id: bytes) -> str:
    return job_id[2:10].decode("ascii", "replace")
