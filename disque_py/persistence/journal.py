"""From the core's journal to AOF bytes, and a node's whole table as records (sans-I/O).

The core appends ``(kind, job)`` pairs to its journal (``core.store.J_LOAD`` ...) as
jobs are registered, replicated, delivered (RETRY 0), acknowledged and forgotten. The
shell drains the journal once per pass and hands it to :func:`encode_entries`, which
makes one string of records for one write: a job registered and changed within the pass
is written in its state at that moment, which is never older than the change.

What is left out, and why:

* a job still waiting for its copies (wait-repl): the client has no ID yet. The core
  journals it again once replication is achieved (``Replication.achieved``).
* dummy acks (an ACK for a job this node never held: no body): Disque does not persist
  acks at all; their GC works without them, and a lost one costs at most a duplicate
  delivery, never a lost job.

:func:`snapshot` is the rewrite's view: one LOADJOB per job, in its current state.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from typing import Any

from ..core.job import WAIT_REPL, Job
from ..core.limits import J_GROUP, Settings
from ..core.store import J_ACKED, J_ACTIVE, J_DEL, J_GONE, J_LOAD
from .records import (
    encode_acked, encode_active, encode_deljob, encode_extra, encode_gone, encode_groupset, encode_job, encode_version,
)

__all__ = ["encode_entries", "snapshot"]


def encode_entries(entries: Iterable[tuple[int, Any]], wall_offset: int) -> bytes:
    """The records of a pass's journal entries, as one string of bytes (a job's, or for
    ``J_GROUP`` a group's settings: core/limits.py)."""
    out: list[bytes] = []
    add = out.append
    for kind, entry in entries:
        if kind == J_GROUP:
            add(encode_groupset(entry))
            continue
        job: Job = entry
        if job.body is None:  # a dummy ack
            continue
        if kind == J_LOAD:
            if job.state != WAIT_REPL:
                add(encode_job(job, wall_offset))
                if job.extra is not None:
                    add(encode_extra(job))
        elif kind == J_DEL:
            add(encode_deljob(job.id))
        elif kind == J_ACKED:
            add(encode_acked(job.id))
        elif kind == J_ACTIVE:
            add(encode_active(job.id))
        elif kind == J_GONE:  # next_at: the end of its dedup window (lifecycle.py)
            add(encode_gone(job.id, job.next_at + wall_offset))
    return b"".join(out)


def snapshot(jobs: Iterable[Job], wall_offset: int, chunk: int = 4096,
             gone: Iterable[tuple[bytes, int]] = (), release: str = "",
             groups: Iterable[Settings] = ()) -> Iterator[bytes]:  # fmt: skip
    """The VERSION record of ``release`` (the writer's, when given), the groups' settings
    (``groups``: ``Limits.records``), the DEDUP IDs remembered (``gone``: (ID, until on the
    core's clock), ``Lifecycle.gone``), then every job's LOADJOB, ``chunk`` jobs to a string (a
    rewrite writes them one by one)."""
    out: list[bytes] = [encode_version(release)] if release else []
    out += [encode_groupset(s) for s in groups]
    for job_id, until in gone:
        out.append(encode_gone(job_id, until + wall_offset))
    for job in jobs:
        if job.body is None or job.state == WAIT_REPL:
            continue
        out.append(encode_job(job, wall_offset))
        if job.extra is not None:
            out.append(encode_extra(job))
        if len(out) >= chunk:
            yield b"".join(out)
            out = []
    if out:
        yield b"".join(out)
