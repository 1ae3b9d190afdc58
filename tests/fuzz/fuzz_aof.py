"""Fuzz target: the append-only file reader (``disque_py.persistence``).

The input is an AOF's bytes, with one convenience: each ``$8\\r\\n????????\\r\\n`` (a
record's checksum element, its eight digits replaced by question marks) is given the
CRC-32 the record needs (the bytes from the end of the previous such element). The seeds
are records written that way, readable, so that mutated records still reach the checks
behind the checksum, and what a node makes of the records it loads.

What must hold, for any bytes:

* ``RecordReader`` raises nothing but ``CorruptRecord``, and gives the same records (and
  offsets), the same ``CorruptRecord`` (offset and reason) or the same ``Truncated`` tail
  whether fed at once or in slices;
* every record decoded, encoded again, decodes to itself (not always to the same bytes:
  leading zeros in a number are read as written);
* ``Loader`` feeding a node raises nothing but ``CorruptRecord`` (after applying the
  records before it), ``finish`` returns the reader's tail, and the node it built keeps
  its invariants (``core.invariants``) after loading and as time passes;
* ``check.check`` on the same bytes in a file reports what the reader found.
"""

from __future__ import annotations

import os
import re
import tempfile
import zlib
from typing import Any

from disque_py.core import invariants
from disque_py.core.node import Node
from disque_py.persistence import check as aof_check
from disque_py.persistence.loader import Loader
from disque_py.persistence.records import CorruptRecord, RecordReader, Truncated, encode

from .fuzz_resp import cuts_for, slices

NODE_ID = "0123456789abcdef0123456789abcdef01234567"
T0 = 1_000_000_000
WALL = 1_700_000_000_000 - T0
PLACEHOLDER = re.compile(rb"\$8\r\n\?{8}\r\n")


def fix_crcs(data: bytes) -> bytes:
    """``data`` with every checksum placeholder replaced by the CRC its record needs."""
    out = bytearray()
    start = 0  # where the current record starts in ``out``
    pos = 0
    for m in PLACEHOLDER.finditer(data):
        out += data[pos : m.start()]
        out += b"$8\r\n%08x\r\n" % zlib.crc32(out[start:])
        start = len(out)
        pos = m.end()
    out += data[pos:]
    return bytes(out)


def read(chunks: list[bytes]) -> tuple[list, tuple[int, str] | None, Truncated | None]:
    """Decode ``chunks``: the records with their offsets, the corruption (offset, reason)
    if any, else the truncated tail if any."""
    reader = RecordReader()
    got: list = []
    for chunk in chunks:
        try:
            got += reader.feed(chunk)
        except CorruptRecord as exc:
            got += exc.records
            try:
                reader.feed(b"")
            except CorruptRecord as again:
                assert again is exc  # it stays failed
            else:
                raise AssertionError("a failed reader took more bytes")
            return got, (exc.offset, exc.reason), None
    return got, None, reader.finish()


def load(chunks: list[bytes], enqueue_once: bool) -> tuple[Node, Any]:
    node = Node(NODE_ID, seed=b"fuzz-seed", now=T0, wall_offset=WALL)
    loader = Loader(node)
    try:
        for chunk in chunks:
            loader.feed(chunk)
    except CorruptRecord:
        # Half loaded: jobs get their wake-ups only in ``finish``, so the invariants are not
        # expected to hold; the shell stops the node (server/aof.py).
        return node, "corrupt"
    tail, counts = loader.finish(enqueue_once)
    assert set(counts) >= {"jobs", "queued", "acked", "expired"}, counts
    return node, tail


_TMP = os.path.join(tempfile.gettempdir(), "disque-py-fuzz-%d.aof" % os.getpid())


def check_aof(data: bytes, seed: int | None = None) -> None:
    data = fix_crcs(data)
    pieces = slices(data, cuts_for(data, seed))
    records, corrupt, tail = read([data])
    assert read(pieces) == (records, corrupt, tail), "slicing changed the result"
    # Records follow each other from offset 0; each one's encoding decodes to it again.
    # (Not always to the same bytes: a number may have leading zeros, "0005", which the
    # writer never makes; the checksum covers them, so they are read as written.)
    offset = 0
    for at, record in records:
        assert at >= offset and (at == 0 or at > offset - 1), (at, offset)
        raw = encode(record)
        again = RecordReader().feed(raw)
        assert again == [(0, record)], (record, again)
        offset = at + 1
    if records:
        assert records[0][0] == 0
    end = records[-1][0] + 1 if records else 0
    if corrupt is not None:
        assert corrupt[0] >= end, (corrupt, end)
    elif tail is not None:
        assert tail.offset >= end and tail.offset + tail.dropped == len(data), (tail, end)

    enqueue_once = bool(zlib.crc32(data) & 1)
    node, loaded_tail = load(pieces, enqueue_once)
    assert loaded_tail == ("corrupt" if corrupt is not None else tail), (loaded_tail, corrupt, tail)
    if corrupt is None:
        invariants.check(node)
        now = T0
        for step in (1, 1000, 60_000, 3_600_000, 86_400_000 * 30):  # the loaded jobs' timers run
            now += step
            node.tick(now)
            node.take_effects()
            invariants.check(node)

    with open(_TMP, "wb") as f:
        f.write(data)
    try:
        report = aof_check.check(_TMP, chunk=max(1, len(pieces[0])))
    finally:
        os.unlink(_TMP)
    assert report.records == len(records), (report, records)
    if corrupt is not None:
        assert report.problem is not None and report.problem.kind == "corrupt"
        assert (report.problem.offset, report.problem.reason) == corrupt
    elif tail is not None:
        assert report.problem is not None and report.problem.kind == "truncated"
        assert (report.problem.offset, report.problem.dropped) == tail
    else:
        assert report.problem is None


def TestOneInput(data: bytes) -> None:
    check_aof(data)
