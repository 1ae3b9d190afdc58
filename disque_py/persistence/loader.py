"""Rebuild a node's jobs from AOF bytes (sans-I/O: the shell reads the file and feeds us).

:class:`Loader` takes the file's bytes in any slicing, decodes them with
``records.RecordReader`` and applies each record to the node's job table through the
core's restore operations (``Lifecycle.restore_*``), in file order: a later LOADJOB of
an ID replaces the earlier one, ACKED/ACTIVE change a job's state, DELJOB forgets it.
``finish`` then reports a partial record at the end (``records.Truncated``) and hands
the table to ``Node.restore_finish``, which gives every job its wake-up (and, for a
controlled restart, puts queued jobs back in their queues).

A damaged record raises ``records.CorruptRecord`` (its byte offset and reason) after the
records before it were applied; what the shell does then (stop the node) is its call.
A VERSION record is noted (``last_release``: the last one read, "" before any, as in a file
of 0.1.0's; ``newer``: the first release newer than ``release``, this node's, that wrote
some of the file), so that the shell can say what a record it cannot read came from.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from ..core.features import release_key
from ..core.lifecycle import Lifecycle
from .records import (
    Acked, Active, DedupGone, DelJob, GroupSet, JobExtra, LoadJob, Queued, Record, RecordReader, Truncated, Version,
)

if TYPE_CHECKING:
    from ..core.node import Node

__all__ = ["Loader"]


class Loader:
    def __init__(self, node: "Node", release: str = "") -> None:
        self.node = node
        self.reader = RecordReader()
        self.records = 0
        self.expired = 0  # LOADJOBs of jobs whose TTL ended meanwhile
        self.release = release  # this node's
        self.last_release = ""  # the last VERSION record's ("": none yet)
        self.newer = ""  # the first release newer than ours that wrote part of the file
        life = node.lifecycle
        self._life: Lifecycle = life
        self._by_kind = {
            Active: life.restore_active,
            Acked: life.restore_acked,
            DelJob: life.restore_deleted,
            Queued: life.restore_queued,
        }

    @property
    def offset(self) -> int:
        """Bytes taken so far (whole records and a partial one)."""
        return self.reader.offset

    def feed(self, data: bytes) -> int:
        """Apply every record completed by ``data``; returns how many."""
        try:
            got = self.reader.feed(data)
        except Exception as exc:
            # CorruptRecord: apply what came before the damage, then let it go up
            self._apply(getattr(exc, "records", []))
            raise
        self._apply(got)
        return len(got)

    def _apply(self, got: list[tuple[int, Record]]) -> None:
        life = self._life  # typed: compiled, restore_job is a native call with native fields
        by_kind = self._by_kind
        expired = 0
        for item in got:
            record = item[1]
            if isinstance(record, LoadJob):
                r: LoadJob = record
                if not life.restore_job(r.id, r.state, r.repl, r.flags, r.ctime, r.expire, r.delay, r.retry, r.nacks,
                                        r.deliveries, r.requeue, r.queue, r.nodes, r.body):  # fmt: skip
                    expired += 1
            elif type(record) is JobExtra:
                life.restore_extra(record.id, record.extra)
            elif type(record) is DedupGone:
                life.restore_gone(record.id, record.until)
            elif isinstance(record, Version):  # (isinstance: mypy narrows the else branch by it)
                self._version(record.release)
            elif isinstance(record, GroupSet):  # (isinstance: the else below is then typed without it)
                self.node.limits.restore(record.settings)
            else:
                by_kind[type(record)](record.id)
        self.records += len(got)
        self.expired += expired

    def _version(self, release: str) -> None:
        self.last_release = release
        if not self.newer and self.release and release_key(release) > release_key(self.release):
            self.newer = release

    def finish(self, enqueue_once: bool) -> tuple[Truncated | None, dict[str, int]]:
        """The end of the file: a partial record left (or None), and the restored counts."""
        truncated = self.reader.finish()
        node = self.node
        counts = node.restore_finish(enqueue_once)
        node.take_effects()  # nothing to tell anyone: nobody is connected yet
        return truncated, counts
