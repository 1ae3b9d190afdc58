"""The job wire codec: one job as the array peers exchange in REPLJOB and YOURJOBS.

A job travels as a fixed array (``job_to_wire``): id, queue, body, repl, ttl,
ctime, delay, retry, nacks, deliveries, nodes. It packs, unpacks and checks in
half the time of a map with named fields (the receiver of a REPLJOB spent a
quarter of its time there). Extra trailing fields are ignored, so a later
version may append some.

``job_from_wire`` checks a peer's array and builds the ``Job`` in one pass
(one unpack of the array), where the job is needed: a REPLJOB's handler
(``Replication.on_repljob``, which counts a malformed one) and, for a YOURJOBS
job not held here already, ``Federation`` (a held one is not built into a
second Job). Imports nothing of the node: callers are ``replication`` and
``federation`` (encode, build).
"""

from __future__ import annotations

from typing import Any

from .ids import NODE_IDS_SEEN, valid_job_id, valid_node_ids
from .job import ACTIVE, Job

__all__ = ["JOB_WIRE_FIELDS", "RETRY_FIELD", "job_from_wire", "job_to_wire"]

JOB_WIRE_FIELDS = 11
RETRY_FIELD = 7  # index of RETRY in the array (moves_to_watch reads it)
_MAX_I64 = (1 << 63) - 1
_MAX_DELAY = 1 << 31
_INT = int
_NODE_IDS_SEEN = NODE_IDS_SEEN


def job_to_wire(job: Job, now: int) -> list:
    """The job as sent to peers (see the module docstring for the field order)."""
    return [
        bytes(job.id), job.queue, job.body, job.repl, max(0, job.etime - now), job.ctime,
        job.delay, job.retry, job.nacks, job.deliveries, list(job.delivered),
    ]  # fmt: skip


def job_from_wire(d: Any, now: int) -> Job | None:
    """A Job from a peer's array, or None when anything is off (extra trailing fields are ignored)."""
    if type(d) is not list or len(d) < JOB_WIRE_FIELDS:
        return None
    if len(d) > JOB_WIRE_FIELDS:
        d = d[:JOB_WIRE_FIELDS]
    job_id, queue, body, repl, ttl, ctime, delay, retry, nacks, deliv, nodes = d
    # Plain inline checks (no helper calls): this runs for every replicated or moved job.
    if not (type(job_id) is bytes and valid_job_id(job_id) and type(queue) is bytes and type(body) is bytes):
        return None
    if not (type(repl) is _INT and type(ttl) is _INT and type(ctime) is _INT and type(delay) is _INT):
        return None
    if not (type(retry) is _INT and type(nacks) is _INT and type(deliv) is _INT):
        return None
    if not (1 <= repl <= 65535 and 0 <= delay <= _MAX_DELAY and 0 <= retry <= _MAX_DELAY):
        return None
    if not (0 <= ttl <= _MAX_I64 and 0 <= ctime <= _MAX_I64 and 0 <= nacks <= _MAX_I64 and 0 <= deliv <= _MAX_I64):
        return None
    if type(nodes) is not list or len(nodes) > 65535:
        return None
    try:
        seen = _NODE_IDS_SEEN.issuperset(nodes)  # see ids.NODE_IDS_SEEN
    except TypeError:  # an unhashable element
        return None
    if not seen and not valid_node_ids(nodes):
        return None
    job = Job(job_id, ACTIVE, queue, body, repl, ctime, now + ttl, delay, retry, 0, tuple(dict.fromkeys(nodes)))
    job.nacks = nacks
    job.deliveries = deliv
    return job
