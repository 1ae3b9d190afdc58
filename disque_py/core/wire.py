"""The job wire codec: one job as the array peers exchange in REPLJOB and YOURJOBS.

A job travels as a fixed array (``job_to_wire``): id, queue, body, repl, ttl,
ctime, delay, retry, nacks, deliveries, nodes. It packs, unpacks and checks in
half the time of a map with named fields (the receiver of a REPLJOB spent a
quarter of its time there). Extra trailing fields are ignored, so a later
version may append some. One is appended already, only for a job whose
``extra`` is set (delivery policy, dead-letter facts): a map with short keys
(``extra_to_wire``), which the AOF's JOBEXTRA record stores too; a node that
does not know it ignores it, and a job without it travels as before. A key the
map's reader does not know is ignored too, so a field added later (``rt``, the
deliveries given back; ``t``, the last failure's traceback) reads as absent on
a node or in an AOF of before it.

A job's group (ADDJOB's GROUP) is in the Extra's map, key ``g`` (1 to
``job.GROUP_NAME_MAX`` bytes, else the job is malformed); a job that has one
gets ``job.F_GROUP`` on arrival.

A job with a priority (ADDJOB's PRIORITY, other than the default:
``job.F_PRIORITY``) has one field more, after that map (a nil in its place for a
job without one): the priority, an integer from 0 to 9. A node of before it
ignores it; a peer's priority out of range, or not an integer, makes the job
malformed (refused, and counted as any malformed job).

``job_from_wire`` checks a peer's array and builds the ``Job`` in one pass
(one unpack of the array), where the job is needed: a REPLJOB's handler
(``Replication.on_repljob``, which counts a malformed one) and, for a YOURJOBS
job not held here already, ``Federation`` (a held one is not built into a
second Job). Imports nothing of the node: callers are ``replication`` and
``federation`` (encode, build).
"""

from __future__ import annotations

from typing import Any, Final, TypeAlias

from .constants import DURATION_MAX, INT64_MAX, REPLICATE_MAX
from .ids import NODE_IDS_SEEN, valid_job_id, valid_node_ids
from .job import (
    ACTIVE, F_GROUP, F_PRIORITY, GROUP_NAME_MAX, PRIORITY_DEFAULT, PRIORITY_MAX, RETURNED_NODES_MAX, TRACE_MAX, Extra, Job, job_priority,
    priority_flags,
)

__all__ = [
    "JOB_WIRE_FIELDS", "RETRY_FIELD", "WireJob", "job_from_wire", "job_to_wire", "extra_to_wire", "extra_from_wire",
    "returned_to_wire", "returned_from_wire",
]  # fmt: skip

JOB_WIRE_FIELDS: Final = 11
RETRY_FIELD: Final = 7  # index of RETRY in the array (moves_to_watch reads it)

#: A job on the bus: its fields in a fixed order, of several types (bytes, ints, the holders'
#: list, the Extra's map), and from a peer anything at all until ``job_from_wire`` checked it.
WireJob: TypeAlias = "list[Any]"


def job_to_wire(job: Job, now: int) -> WireJob:
    """The job as sent to peers (see the module docstring for the field order)."""
    wire: WireJob = [
        bytes(job.id), job.queue, job.body, job.repl, max(0, job.etime - now), job.ctime,
        job.delay, job.retry, job.nacks, job.deliveries, list(job.delivered),
    ]  # fmt: skip
    if job.extra is not None:
        wire.append(extra_to_wire(job.extra))
    if job.flags & F_PRIORITY:
        if job.extra is None:
            wire.append(None)
        wire.append(job_priority(job))
    return wire


_MAX_NAME: Final = 1 << 20  # a queue name or a reason in an Extra, at most


def extra_to_wire(e: Extra) -> dict:
    """An Extra as a map with short keys, only the fields set (msgpack packs it)."""
    d: dict = {}
    if e.backoff_max:
        d["bm"] = e.backoff_min
        d["bx"] = e.backoff_max
    if e.maxdeliver:
        d["md"] = e.maxdeliver
    if e.deadletter is not None:
        d["dl"] = e.deadletter
    if e.count:
        d["c"] = e.count
    if e.reason is not None:
        d["r"] = e.reason
    if e.origin is not None:
        d["o"] = list(e.origin)
    if e.dedup is not None:
        d["k"] = e.dedup
    if e.returned:
        d["rt"] = returned_to_wire(e.returned)
    if e.trace is not None:
        d["t"] = e.trace
    if e.group is not None:
        d["g"] = e.group
    return d


def returned_to_wire(returned: dict[str, int]) -> list:
    """``Extra.returned`` as the bus and the AOF carry it: a flat list, node, count, node, count..."""
    out: list = []
    for node, n in returned.items():
        out.append(node)
        out.append(n)
    return out


def returned_from_wire(v: Any) -> dict[str, int] | None:
    """``returned_to_wire``'s list as a dict, or None when anything is off (an odd length, more
    than ``RETURNED_NODES_MAX`` nodes, a node ID or a count of the wrong shape)."""
    if type(v) is not list or len(v) % 2 or len(v) > 2 * RETURNED_NODES_MAX:
        return None
    out: dict[str, int] = {}
    for i in range(0, len(v), 2):
        node, n = v[i], v[i + 1]
        if type(node) is not str or not _small_int(n):
            return None
        out[node] = n
    if not NODE_IDS_SEEN.issuperset(out) and not valid_node_ids(list(out)):
        return None
    return out


def _small_int(v: Any) -> bool:
    return type(v) is int and 0 <= v <= INT64_MAX


def _name(v: Any) -> bool:
    return type(v) is bytes and len(v) <= _MAX_NAME


def extra_from_wire(d: Any) -> Extra | None:
    """An Extra from ``extra_to_wire``'s map, or None when anything is off (unknown keys
    are ignored, for a later version)."""
    if type(d) is not dict:
        return None
    e = Extra()
    get = d.get
    bm, bx, md, dl, c, r, o = get("bm", 0), get("bx", 0), get("md", 0), get("dl"), get("c", 0), get("r"), get("o")
    k = get("k")
    if k is not None and not (type(k) is bytes and 0 < len(k) <= 512):
        return None
    t = get("t")
    if t is not None and not (type(t) is bytes and len(t) <= TRACE_MAX):
        return None
    g = get("g")
    if g is not None and not (type(g) is bytes and 0 < len(g) <= GROUP_NAME_MAX):
        return None
    rt = get("rt")
    returned: dict[str, int] | None = None
    if rt is not None:
        returned = returned_from_wire(rt)
        if returned is None:
            return None
    if not (_small_int(bm) and _small_int(bx) and bm <= bx and _small_int(md) and _small_int(c)):
        return None
    if (dl is not None and not _name(dl)) or (r is not None and not _name(r)):
        return None
    if o is not None:
        if type(o) is not list or len(o) != 5:
            return None
        oid, oqueue, odeliv, oreason, oopts = o
        if not (type(oid) is bytes and valid_job_id(oid) and _name(oqueue) and _small_int(odeliv)):
            return None
        if (oreason is not None and not _name(oreason)) or type(oopts) is not list or len(oopts) > 16:
            return None
        if not all(_name(x) for x in oopts):
            return None
        o = (oid, oqueue, odeliv, oreason, oopts)
    e.backoff_min, e.backoff_max, e.maxdeliver, e.deadletter, e.count, e.reason, e.origin = bm, bx, md, dl, c, r, o
    e.dedup = k
    e.trace = t
    e.group = g
    if returned:
        e.merge_returned(returned)
    return e


def job_from_wire(d: Any, now: int) -> Job | None:
    """A Job from a peer's array, or None when anything is off (extra trailing fields are ignored)."""
    if type(d) is not list or len(d) < JOB_WIRE_FIELDS:
        return None
    extra = None
    priority = PRIORITY_DEFAULT
    if len(d) > JOB_WIRE_FIELDS:
        extra = d[JOB_WIRE_FIELDS]
        if len(d) > JOB_WIRE_FIELDS + 1:
            raw = d[JOB_WIRE_FIELDS + 1]  # checked before it is an int (compiled: a typed local)
            if type(raw) is not int or not 0 <= raw <= PRIORITY_MAX:
                return None
            priority = raw
        d = d[:JOB_WIRE_FIELDS]
        if type(extra) is dict:
            extra = extra_from_wire(extra)
            if extra is None:
                return None
        else:
            extra = None  # not ours: a later version's field
    job_id, queue, body, repl, ttl, ctime, delay, retry, nacks, deliv, nodes = d
    # Plain inline checks (no helper calls): this runs for every replicated or moved job.
    if not (type(job_id) is bytes and valid_job_id(job_id) and type(queue) is bytes and type(body) is bytes):
        return None
    if not (type(repl) is int and type(ttl) is int and type(ctime) is int and type(delay) is int):
        return None
    if not (type(retry) is int and type(nacks) is int and type(deliv) is int):
        return None
    if not (1 <= repl <= REPLICATE_MAX and 0 <= delay <= DURATION_MAX and 0 <= retry <= DURATION_MAX):
        return None
    if not (0 <= ttl <= INT64_MAX and 0 <= ctime <= INT64_MAX and 0 <= nacks <= INT64_MAX and 0 <= deliv <= INT64_MAX):
        return None
    if type(nodes) is not list or len(nodes) > REPLICATE_MAX:
        return None
    try:
        seen = NODE_IDS_SEEN.issuperset(nodes)  # see ids.NODE_IDS_SEEN
    except TypeError:  # an unhashable element
        return None
    if not seen and not valid_node_ids(nodes):
        return None
    job = Job(job_id, ACTIVE, queue, body, repl, ctime, now + ttl, delay, retry, 0, tuple(dict.fromkeys(nodes)))
    job.nacks = nacks
    job.deliveries = deliv
    if priority != PRIORITY_DEFAULT:
        job.flags = priority_flags(priority)
    if extra is not None:
        job.extra = extra
        if extra.group is not None:
            job.flags |= F_GROUP
    return job
