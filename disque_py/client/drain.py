"""Draining a node as operators see it, no I/O: what ``disque-py drain`` (``cli/drain.py``, sync
connections) and ``POST /api/drain`` (``web/api.py``) both run.

A drain empties one node before it is stopped, keeping every job (its ID, its copies on the
other nodes) and delivering none twice:

1. ``CLUSTER LEAVING yes`` on it (Disque's: no copies of new jobs there, ``-LEAVING`` to a
   GETJOB that would block, priority 100 in ``HELLO``, no NEEDJOBS from it).
2. Rounds (:func:`round_steps`) until it holds nothing: ``JSCAN ... REPLY all`` lists its jobs;
   each queued one leaves with ``MOVEJOBS`` (the node's, federation's move: YOURJOBS, IDs
   kept) for a node that holds a copy already, so no holder is added and the job's copies
   elsewhere stay as they were, or, for a job whose only copy is here, for another node
   (round robin), which becomes its holder. An at-least-once job keeps its copy here until
   the receiver shows it (``SHOW``): only then is it dropped here (``DELJOB``, this node only).
   Until then its copy here requeues after RETRY as any copy does, so a move lost on the way
   loses nothing. A RETRY 0 job's one copy leaves whole. Delivered jobs (active here, not
   acknowledged) are waited for: acknowledged, they are collected as usual; not, their RETRY
   queues them here again and the next round moves them.

Each step is a generator that yields ``(node ID, pipeline)`` (a list of argvs for that node)
and is sent the pipeline's replies (errors as exception values), as ``deadletters.py``'s.
Why client-side, with one command of the node's (MOVEJOBS): every other part was there (JSCAN,
SHOW, DELJOB, CLUSTER LEAVING), and only the node can hand a job to another node with its ID.
"""

from __future__ import annotations

from collections.abc import Callable, Generator
from dataclasses import dataclass, field
from typing import Any

__all__ = ["Left", "Drain", "round_steps", "drive", "BATCH", "SCAN_COUNT"]

#: JSCAN's COUNT per call, and job IDs per MOVEJOBS, SHOW pipeline and DELJOB
SCAN_COUNT = 1000
BATCH = 500

Step = tuple[str, list[list[bytes]]]


class DrainError(Exception):
    """A reply the drain cannot go on with (a refused JSCAN, say)."""


def _text(value: Any) -> str:
    return bytes(value).decode("utf-8", "replace") if isinstance(value, (bytes, bytearray)) else str(value)


@dataclass
class Left:
    """What the draining node holds, as its last scan saw it."""

    queued: int = 0
    active: int = 0
    acked: int = 0
    other: int = 0  # waiting for copies, or a state this version does not name

    @property
    def total(self) -> int:
        return self.queued + self.active + self.acked + self.other

    def as_json(self) -> dict[str, int]:
        return {"total": self.total, "queued": self.queued, "active": self.active, "acked": self.acked,
                "other": self.other}  # fmt: skip


@dataclass
class Drain:
    """One drain's memory across rounds: the moves not confirmed yet, and the counts."""

    node: str  # the draining node's ID
    peers: list[str]  # the nodes jobs may go to (not leaving, not failing)
    pending: dict[str, str] = field(default_factory=dict)  # job ID -> the node it was moved to
    moved: int = 0  # jobs sent by MOVEJOBS
    dropped: int = 0  # copies here dropped once their receiver showed them
    left: Left = field(default_factory=Left)
    errors: list[str] = field(default_factory=list)  # the last round's refusals (a peer gone, ...)
    _next: int = 0  # round robin over the peers

    @property
    def done(self) -> bool:
        return self.left.total == 0 and not self.pending

    def target(self, holders: list[str], bad: set[str]) -> str | None:
        for n in holders:
            if n != self.node and n in self.peers and n not in bad:
                return n
        choices = [p for p in self.peers if p not in bad]
        if not choices:
            return None
        self._next += 1
        return choices[self._next % len(choices)]


def _fields(item: Any) -> dict[str, Any]:
    if isinstance(item, dict):
        return {_text(k): v for k, v in item.items()}
    if isinstance(item, (list, tuple)):
        return {_text(item[i]): item[i + 1] for i in range(0, len(item) - 1, 2)}
    return {}


def _chunks(ids: list[bytes]) -> list[list[bytes]]:
    return [ids[i:i + BATCH] for i in range(0, len(ids), BATCH)]


def round_steps(d: Drain) -> Generator[Step, list[Any], Drain]:
    """One round (the module docstring's step 2): scan, move the queued jobs, confirm earlier
    moves and drop the copies confirmed. Returns ``d``, updated."""
    me = d.node
    left = Left()
    queued: list[tuple[bytes, int, list[str]]] = []  # (ID, RETRY, holders)
    here: set[str] = set()
    cursor = b"0"
    while True:
        (reply,) = yield me, [[b"JSCAN", cursor, b"COUNT", b"%d" % SCAN_COUNT, b"REPLY", b"all"]]
        if isinstance(reply, BaseException) or not isinstance(reply, (list, tuple)) or len(reply) != 2:
            raise DrainError("JSCAN on %s: %s" % (me[:8], reply))
        for item in reply[1] or ():
            f = _fields(item)
            job_id, state = f.get("id"), _text(f.get("state", ""))
            if not isinstance(job_id, (bytes, bytearray)):
                continue
            here.add(_text(job_id))
            if state == "queued":
                left.queued += 1
                holders = [_text(n) for n in f.get("nodes-delivered") or ()]
                retry = int(f.get("retry") or 0)
                queued.append((bytes(job_id), retry, holders))
            elif state == "active":
                left.active += 1
            elif state == "acked":
                left.acked += 1
            else:
                left.other += 1
        cursor = bytes(reply[0]) if isinstance(reply[0], (bytes, bytearray)) else str(reply[0]).encode()
        if cursor == b"0":
            break
    d.errors = []
    # a copy gone from here (collected after an ack, say) is not waited for any more
    d.pending = {j: t for j, t in d.pending.items() if j in here}
    # moves: grouped by receiver
    bad: set[str] = set()
    by_target: dict[str, list[tuple[bytes, int]]] = {}
    for job_id, retry, holders in queued:
        t = d.target(holders, bad)
        if t is None:
            d.errors.append("no node to move jobs to")
            break
        by_target.setdefault(t, []).append((job_id, retry))
    for t, jobs in by_target.items():
        for part in [jobs[i:i + BATCH] for i in range(0, len(jobs), BATCH)]:
            (reply,) = yield me, [[b"MOVEJOBS", t.encode(), *(j for j, _ in part)]]
            if isinstance(reply, BaseException) or not isinstance(reply, int):
                d.errors.append("MOVEJOBS to %s: %s" % (t[:8], reply))
                break
            d.moved += reply
            for job_id, retry in part:
                if retry:  # an at-least-once copy stays here until the receiver shows it
                    d.pending[_text(job_id)] = t
    # confirmations: SHOW on each receiver, then DELJOB here of what they hold
    by_receiver: dict[str, list[str]] = {}
    for j, t in d.pending.items():
        by_receiver.setdefault(t, []).append(j)
    confirmed: list[bytes] = []
    for t, ids in by_receiver.items():
        for part in _chunks([j.encode() for j in ids]):
            replies = yield t, [[b"SHOW", j] for j in part]
            for j, r in zip(part, replies):
                if r is not None and not isinstance(r, BaseException) and _fields(r):
                    confirmed.append(j)
    for part in _chunks(confirmed):
        (reply,) = yield me, [[b"DELJOB", *part]]
        if isinstance(reply, BaseException):
            d.errors.append("DELJOB on %s: %s" % (me[:8], reply))
            continue
        d.dropped += int(reply)
        for j in part:
            d.pending.pop(_text(j), None)
    d.left = left
    return d


def drive(steps: Generator[Step, list[Any], Any], call: Callable[[str, list[list[bytes]]], list[Any]]) -> Any:
    """Run a generator of this module with a ``call(node ID, argvs) -> replies`` (errors as
    values); its return value."""
    try:
        node, argvs = next(steps)
        while True:
            node, argvs = steps.send(call(node, argvs))
    except StopIteration as stop:
        return stop.value
