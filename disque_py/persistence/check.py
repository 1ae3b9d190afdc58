"""``disque-py check-aof``: check an append-only file offline, and cut off a bad tail.

Theory of operation
-------------------
:func:`check` reads the file from the start in chunks and hands them to a
:class:`~.records.RecordReader`, counting the records by kind. It stops at the
first problem, which is one of two:

* a **truncated tail**: the file ends inside a record (``RecordReader.finish``
  says so). A node killed or a machine losing power in the middle of a write
  leaves one; it is harmless, and a node started with ``aof-load-truncated
  yes`` (the default) loads the records before it and drops the rest;
* a **corrupt record**: bytes that are not a valid record (``CorruptRecord``),
  such as a flipped bit caught by the record's CRC-32. Nothing after it can be
  trusted to start where a record starts, so the check does not look further.

Either way the problem has the byte offset where the bad record starts: every
byte before it belongs to a valid record. :func:`cut` repairs the file by
truncating it at that offset, after copying the bytes it removes to
``FILE.bad-<offset>`` next to it (never overwriting one), so that nothing is
lost without a trace. A corrupt record in the middle of the file takes the
valid records after it along: the check reports how many bytes that is, and
the copy keeps them.

The check never writes to the file; :func:`run` (the command) cuts only with
``--fix``, after asking, and only if the file still has the size it had when
it was checked (a node still appending to it would otherwise lose records).

Plain blocking file I/O: this is a command-line tool, not part of a node.
"""

from __future__ import annotations

import os
import shlex
import sys
from collections import Counter
from dataclasses import dataclass, field
from operator import itemgetter
from typing import Callable

from .records import (
    KINDS, Acked, Active, CorruptRecord, DedupGone, DelJob, JobExtra, LoadJob, Queued, RecordReader, Version,
)

__all__ = ["CHUNK", "PROGRESS_MIN_SIZE", "Problem", "Report", "check", "cut", "run"]

#: Bytes read at a time.
CHUNK = 256 << 10  # smaller pieces decode no faster, larger ones slower (cache)
#: Files from this size on get a progress bar (on a terminal only).
PROGRESS_MIN_SIZE = 16 << 20

_NAMES = {LoadJob: "LOADJOB", Queued: "QUEUED", Active: "ACTIVE", Acked: "ACKED", DelJob: "DELJOB", JobExtra: "JOBEXTRA",
          DedupGone: "DEDUPGONE", Version: "VERSION"}
#: Kind names in the order of the format's table.
KIND_NAMES = tuple(k.decode() for k in KINDS)


@dataclass(frozen=True)
class Problem:
    """The first bad record: where it starts and how many bytes from there to the end of the file."""

    kind: str  # "truncated" or "corrupt"
    offset: int
    dropped: int
    reason: str = ""


@dataclass
class Report:
    path: str
    size: int  # bytes read: the size of the file when the check ended
    counts: dict[str, int] = field(default_factory=dict)  # valid records by kind
    problem: Problem | None = None
    #: the file's size changed while it was read: something (a node) is writing it
    changed: bool = False

    @property
    def records(self) -> int:
        return sum(self.counts.values())

    @property
    def valid(self) -> bool:
        return self.problem is None

    @property
    def good_end(self) -> int:
        """Bytes of valid records from the start of the file."""
        return self.size if self.problem is None else self.problem.offset


def check(path: str | os.PathLike, *, chunk: int = CHUNK, progress: Callable[[int], None] | None = None) -> Report:
    """Read the AOF at ``path`` and say whether every byte of it is a valid record.

    ``progress`` is called with the number of bytes of each chunk read. Raises
    OSError when the file cannot be opened or read.
    """
    counts: Counter = Counter()
    reader = RecordReader()
    problem = None
    read = 0
    records = itemgetter(1)
    with open(path, "rb") as f:
        size0 = os.fstat(f.fileno()).st_size
        while True:
            data = f.read(chunk)
            if not data:
                break
            read += len(data)
            if progress is not None:
                progress(len(data))
            try:
                got = reader.feed(data)
            except CorruptRecord as exc:
                counts.update(map(type, map(records, exc.records)))
                # the rest of the file is not read: its size says how much is lost
                size = os.fstat(f.fileno()).st_size
                problem = Problem("corrupt", exc.offset, size - exc.offset, exc.reason)
                read = size
                break
            counts.update(map(type, map(records, got)))
        if problem is None:
            tail = reader.finish()
            if tail is not None:
                problem = Problem("truncated", tail.offset, tail.dropped, "the file ends inside a record")
    by_name = {name: 0 for name in KIND_NAMES}
    for kind, n in counts.items():
        by_name[_NAMES[kind]] += n
    return Report(str(path), read, by_name, problem, changed=read != size0)


def bad_copy_path(path: str | os.PathLike, offset: int) -> str:
    """Where :func:`cut` keeps the bytes it removes: FILE.bad-OFFSET, or FILE.bad-OFFSET.N if that exists."""
    base = "%s.bad-%d" % (os.fspath(path), offset)
    candidate, n = base, 0
    while os.path.lexists(candidate):
        n += 1
        candidate = "%s.%d" % (base, n)
    return candidate


def cut(path: str | os.PathLike, offset: int, *, expected_size: int | None = None) -> tuple[str, int]:
    """Copy the bytes of ``path`` from ``offset`` on to a new file, then truncate ``path`` at ``offset``.

    Returns (the copy's path, bytes removed). With ``expected_size``, refuses
    (ValueError) when the file no longer has that size. Both files are synced
    before it returns.
    """
    with open(path, "r+b") as f:
        size = os.fstat(f.fileno()).st_size
        if expected_size is not None and size != expected_size:
            raise ValueError("the file is %d bytes now, %d when it was checked: is a node still writing it?"
                             % (size, expected_size))  # fmt: skip
        if offset > size:
            raise ValueError("offset %d is beyond the end of the file (%d bytes)" % (offset, size))
        copy = bad_copy_path(path, offset)
        f.seek(offset)
        with open(copy, "xb") as out:  # "x": never overwrite
            while True:
                data = f.read(CHUNK)
                if not data:
                    break
                out.write(data)
            out.flush()
            os.fsync(out.fileno())
        f.truncate(offset)
        f.flush()
        os.fsync(f.fileno())
    return copy, size - offset


# --------------------------------------------------------------------------- the command


def _n(value: int) -> str:
    return "{:,}".format(value)


def _counts_text(report: Report) -> str:
    kinds = ", ".join("%s %s" % (name, _n(n)) for name, n in report.counts.items() if n)
    return "%s record%s%s" % (_n(report.records), "" if report.records == 1 else "s", " (%s)" % kinds if kinds else "")


def describe(report: Report) -> list[str]:
    """The lines that tell what the check found."""
    lines = ["%s: %s bytes" % (report.path, _n(report.size))]
    p = report.problem
    if p is None:
        lines.append("AOF is valid: %s%s" % (_counts_text(report), ", empty file" if report.size == 0 else ""))
    else:
        lines.append("Valid up to byte offset %d: %s" % (p.offset, _counts_text(report)))
        if p.kind == "truncated":
            lines.append("Truncated tail at byte offset %d (0x%x): the last %s bytes are an incomplete record"
                         % (p.offset, p.offset, _n(p.dropped)))  # fmt: skip
            lines.append("  (a write cut short, e.g. by a crash; with aof-load-truncated yes a node loads "
                         "the records before it)")  # fmt: skip
        else:
            lines.append("Corrupt record at byte offset %d (0x%x): %s" % (p.offset, p.offset, p.reason))
            lines.append("  %s bytes from there to the end cannot be loaded (the file is not read past the damage)"
                         % _n(p.dropped))  # fmt: skip
        lines.append("AOF is not valid")
    if report.changed:
        lines.append("Warning: the file changed size while it was read: stop the node that writes it")
    return lines


def _check_with_progress(path: str, show: bool | None) -> Report:
    import click

    size = os.path.getsize(path)
    if show is None:
        show = size >= PROGRESS_MIN_SIZE and sys.stderr.isatty()
    if not show:
        return check(path)
    with click.progressbar(length=size, label="Checking", file=sys.stderr, show_pos=False,
                           show_percent=True, show_eta=True) as bar:  # fmt: skip
        return check(path, progress=bar.update)


def run(path: str, *, fix: bool = False, yes: bool = False, progress: bool | None = None) -> int:
    """The ``check-aof`` command: 0 valid (or fixed), 1 a problem left as it is, 2 the file cannot be read."""
    import click

    try:
        report = _check_with_progress(path, progress)
    except OSError as exc:
        click.echo("Error: cannot read %s: %s" % (path, exc.strerror or exc), err=True)
        return 2
    for line in describe(report):
        click.echo(line)
    p = report.problem
    if p is None:
        if fix:
            click.echo("Nothing to fix")
        return 0
    if not fix:
        click.echo("To cut the file at byte %d, stop the node using it and run: disque-py check-aof --fix %s"
                   % (p.offset, shlex.quote(path)))  # fmt: skip
        return 1
    click.echo("This truncates %s from %s to %s bytes, keeping %s and removing %s bytes; the removed bytes "
               "are copied to %s first." % (path, _n(report.size), _n(p.offset), _counts_text(report),
                                            _n(p.dropped), bad_copy_path(path, p.offset)))  # fmt: skip
    if not yes and not click.confirm("Continue?", default=False):
        click.echo("Not fixed: the file is unchanged")
        return 1
    try:
        copy, removed = cut(path, p.offset, expected_size=report.size)
    except (OSError, ValueError) as exc:
        click.echo("Error: could not fix %s: %s" % (path, getattr(exc, "strerror", None) or exc), err=True)
        return 1
    click.echo("Truncated %s at byte %d: %s bytes removed, saved in %s" % (path, p.offset, _n(removed), copy))
    again = check(path)
    if not again.valid:  # cannot happen unless the file changed again
        for line in describe(again):
            click.echo(line)
        return 1
    click.echo("AOF is valid now: %s kept, %s bytes dropped" % (_counts_text(again), _n(removed)))
    return 0
