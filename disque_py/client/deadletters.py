"""Dead letters as an operator sees them: found, listed, requeued and purged.

A dead letter is a job whose SHOW has ``dead-letter-of`` (the node makes one when a job
fails past its MAXDELIVER, or is NACKed with DEAD; ``core/delivery.py``), and
``last-failure-trace`` when the original's last failure was NACKed with its traceback. A dead-letter
queue is a queue holding such jobs. No server command lists them: every node of the
cluster is asked ``JSCAN ... REPLY all`` (a job lives on several nodes, so what they say
is merged by job ID, the queued copy preferred), and what is not a dead letter, or is
already acknowledged, is left out.

This module does no I/O. ``disque-py dead`` (``cli/dead.py``, sync connections) and the
admin web app (``web/api.py``, trio) both drive the same steps:

* :func:`scan` is a generator that yields a pipeline (a list of argvs) for one node and
  is sent that pipeline's replies (error replies as exception values); it returns the
  node's dead letters. :func:`drive` runs one with a plain ``pipeline(argvs) -> replies``.
* :func:`requeue_steps` and :func:`purge_steps` are the same for the actions on a batch
  of dead letters held by one node. A requeue is ``ADDJOB <original queue> <body>`` with
  the dead letter's REPLICATE, RETRY and remaining TTL and the ``original-options`` the
  node kept (BACKOFF, MAXDELIVER ...), then, only for the jobs ADDJOB took, ``ACKJOB`` of
  the dead letter: a failure between the two leaves a job in both queues, never in none.
  A purge is ``ACKJOB`` (it spreads through the cluster as a client's does).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Generator, Iterable
from dataclasses import dataclass, field
from typing import Any

__all__ = [
    "DeadLetter", "DeadQueue", "from_fields", "scan", "merge", "summarize", "requeue_argv", "requeue_steps",
    "purge_steps", "drive", "by_node", "chunks", "sort_jobs", "StepResult", "ReplyError", "SCAN_COUNT",
    "ADDJOB_TIMEOUT_MS", "BATCH",
]  # fmt: skip

#: JSCAN's COUNT per call
SCAN_COUNT = 500
#: ADDJOB's replication timeout when a dead letter goes back to its queue
ADDJOB_TIMEOUT_MS = 5000
#: dead letters per pipelined batch of a requeue or a purge (the progress bar moves per batch)
BATCH = 100

Pipeline = list[list[bytes]]


def _text(value: Any) -> str:
    if isinstance(value, (bytes, bytearray)):
        return bytes(value).decode("utf-8", "replace")
    return "" if value is None else str(value)


def _bytes(value: Any) -> bytes:
    if isinstance(value, (bytes, bytearray)):
        return bytes(value)
    return str(value).encode()


def _int(value: Any) -> int:
    try:
        return int(value)
    except (TypeError, ValueError):
        return 0


@dataclass(slots=True)
class DeadLetter:
    """One dead letter, as SHOW (or JSCAN REPLY all) tells it."""

    id: str
    queue: bytes  # the dead-letter queue
    state: str
    body: bytes
    ttl: int  # seconds left
    ctime_ns: int
    retry: int
    repl: int
    original_id: str
    original_queue: bytes
    deliveries: int  # of the original, when it was dead-lettered
    reason: bytes | None
    options: list[bytes]  # original-options: what ADDJOB is given back on a requeue
    node: str = ""  # the node it was found on (its queued copy's when one is queued)
    trace: bytes | None = None  # last-failure-trace: the traceback of the original's last failure

    def age(self, now: float | None = None) -> float:
        """Seconds since the dead letter was made (from its ctime)."""
        return max(0.0, (time.time() if now is None else now) - self.ctime_ns / 1e9)

    def as_json(self, now: float | None = None) -> dict[str, Any]:
        out = {
            "id": self.id, "queue": _text(self.queue), "state": self.state,
            "original_id": self.original_id, "original_queue": _text(self.original_queue),
            "deliveries": self.deliveries, "reason": None if self.reason is None else _text(self.reason),
            "age": round(self.age(now), 3), "ctime": self.ctime_ns, "ttl": self.ttl, "retry": self.retry,
            "repl": self.repl, "options": [_text(o) for o in self.options], "node": self.node,
            "traceback": None if self.trace is None else _text(self.trace),
        }  # fmt: skip
        try:
            out["body"], out["body_encoding"] = self.body.decode("utf-8"), "utf-8"
        except UnicodeDecodeError:
            import base64

            out["body"], out["body_encoding"] = base64.b64encode(self.body).decode("ascii"), "base64"
        return out


def from_fields(reply: Any, node: str = "") -> DeadLetter | None:
    """A SHOW reply (a flat list of names and values) -> a :class:`DeadLetter`, or None when the
    job is not one (or the reply is not a job)."""
    if isinstance(reply, dict):
        f = {_text(k): v for k, v in reply.items()}
    elif isinstance(reply, (list, tuple)):
        f = {_text(reply[i]): reply[i + 1] for i in range(0, len(reply) - 1, 2)}
    else:
        return None
    if f.get("dead-letter-of") is None or f.get("id") is None:
        return None
    reason = f.get("dead-letter-reason")
    trace = f.get("last-failure-trace")
    options = f.get("original-options") or []
    return DeadLetter(
        id=_text(f["id"]), queue=_bytes(f.get("queue", b"")), state=_text(f.get("state")),
        body=_bytes(f.get("body", b"")), ttl=_int(f.get("ttl")), ctime_ns=_int(f.get("ctime")),
        retry=_int(f.get("retry")), repl=max(1, _int(f.get("repl"))), original_id=_text(f["dead-letter-of"]),
        original_queue=_bytes(f.get("original-queue", b"")), deliveries=_int(f.get("original-deliveries")),
        reason=None if reason is None else _bytes(reason),
        options=[_bytes(o) for o in options] if isinstance(options, (list, tuple)) else [], node=node,
        trace=None if trace is None else _bytes(trace),
    )  # fmt: skip


class ReplyError(Exception):
    """A node answered a step with an error."""


def scan(queue: bytes | None = None, node: str = "", count: int = SCAN_COUNT) -> Generator[Pipeline, list[Any], list[DeadLetter]]:
    """One node's dead letters (of ``queue`` only when given), acknowledged ones left out:
    ``JSCAN <cursor> COUNT n REPLY all [QUEUE q]`` until the cursor comes back to 0."""
    found: list[DeadLetter] = []
    cursor = b"0"
    while True:
        argv = [b"JSCAN", cursor, b"COUNT", b"%d" % count, b"REPLY", b"all"]
        if queue is not None:
            argv += [b"QUEUE", queue]
        (reply,) = yield [argv]
        if isinstance(reply, BaseException):
            raise ReplyError(str(reply))
        if not isinstance(reply, (list, tuple)) or len(reply) != 2:
            raise ReplyError("unexpected JSCAN reply: %r" % (reply,))
        for item in reply[1] or ():
            dl = from_fields(item, node)
            if dl is not None and dl.state != "acked":
                found.append(dl)
        cursor = _bytes(reply[0])
        if cursor == b"0":
            return found


def merge(per_node: Iterable[Iterable[DeadLetter]]) -> dict[str, DeadLetter]:
    """Dead letters found on several nodes, one per job ID: the copy queued somewhere wins
    (a requeue or a purge then goes to the node that would deliver it)."""
    out: dict[str, DeadLetter] = {}
    for found in per_node:
        for dl in found:
            have = out.get(dl.id)
            if have is None or (have.state != "queued" and dl.state == "queued"):
                out[dl.id] = dl
    return out


@dataclass(slots=True)
class DeadQueue:
    """A dead-letter queue: how many dead letters, from which queues, the oldest's age."""

    name: bytes
    count: int = 0
    originals: dict[bytes, int] = field(default_factory=dict)
    oldest_ctime_ns: int = 0

    def as_json(self, now: float | None = None) -> dict[str, Any]:
        now = time.time() if now is None else now
        return {
            "name": _text(self.name), "count": self.count,
            "original_queues": {_text(k): v for k, v in sorted(self.originals.items())},
            "oldest_age": round(max(0.0, now - self.oldest_ctime_ns / 1e9), 3) if self.oldest_ctime_ns else 0,
        }  # fmt: skip


def summarize(dead: Iterable[DeadLetter]) -> list[DeadQueue]:
    """Dead letters grouped by their queue, the fullest queue first."""
    queues: dict[bytes, DeadQueue] = {}
    for dl in dead:
        q = queues.get(dl.queue)
        if q is None:
            q = queues[dl.queue] = DeadQueue(dl.queue)
        q.count += 1
        q.originals[dl.original_queue] = q.originals.get(dl.original_queue, 0) + 1
        if not q.oldest_ctime_ns or dl.ctime_ns < q.oldest_ctime_ns:
            q.oldest_ctime_ns = dl.ctime_ns
    return sorted(queues.values(), key=lambda q: (-q.count, q.name))


def sort_jobs(dead: Iterable[DeadLetter]) -> list[DeadLetter]:
    """Oldest first (the order they died in)."""
    return sorted(dead, key=lambda d: (d.ctime_ns, d.id))


def by_node(dead: Iterable[DeadLetter]) -> dict[str, list[DeadLetter]]:
    """Dead letters grouped by the node they were found on (cut them with :func:`chunks`)."""
    out: dict[str, list[DeadLetter]] = {}
    for dl in dead:
        out.setdefault(dl.node, []).append(dl)
    return out


def requeue_argv(dl: DeadLetter) -> list[bytes]:
    """ADDJOB of the dead letter's body to its original queue, with its REPLICATE, RETRY and the
    TTL it has left, then the options the original was added with."""
    ttl = max(1, dl.ttl)
    argv = [b"ADDJOB", dl.original_queue, dl.body, b"%d" % ADDJOB_TIMEOUT_MS, b"REPLICATE", b"%d" % dl.repl,
            b"RETRY", b"%d" % min(dl.retry, ttl), b"TTL", b"%d" % ttl]  # fmt: skip
    return argv + list(dl.options)


@dataclass(slots=True)
class StepResult:
    done: list[str] = field(default_factory=list)  # dead-letter IDs requeued or purged
    new_ids: dict[str, str] = field(default_factory=dict)  # requeue: dead-letter ID -> the new job's ID
    errors: dict[str, str] = field(default_factory=dict)  # dead-letter ID -> why not


def requeue_steps(batch: list[DeadLetter]) -> Generator[Pipeline, list[Any], StepResult]:
    """Requeue ``batch`` (held by one node): the ADDJOBs pipelined, then one ACKJOB of the dead
    letters whose ADDJOB succeeded (never of the others)."""
    result = StepResult()
    replies = yield [requeue_argv(dl) for dl in batch]
    taken = []
    for dl, reply in zip(batch, replies):
        if isinstance(reply, BaseException) or reply is None:
            result.errors[dl.id] = str(reply) if reply is not None else "ADDJOB gave no job ID"
        else:
            taken.append(dl)
            result.new_ids[dl.id] = _text(reply)
    if taken:
        (ack,) = yield [[b"ACKJOB", *(dl.id.encode() for dl in taken)]]
        if isinstance(ack, BaseException):
            for dl in taken:  # requeued, but the dead letter stays: say so, it will be seen twice
                result.errors[dl.id] = "requeued as %s, but ACKJOB of the dead letter failed: %s" % (
                    result.new_ids[dl.id], ack)
            return result
        result.done = [dl.id for dl in taken]
    return result


def purge_steps(batch: list[DeadLetter]) -> Generator[Pipeline, list[Any], StepResult]:
    """Acknowledge ``batch`` (held by one node): one ACKJOB, which spreads through the cluster."""
    result = StepResult()
    (ack,) = yield [[b"ACKJOB", *(dl.id.encode() for dl in batch)]]
    if isinstance(ack, BaseException):
        result.errors = {dl.id: str(ack) for dl in batch}
    else:
        result.done = [dl.id for dl in batch]
    return result


def drive(steps: Generator[Pipeline, list[Any], Any], pipeline: Callable[[Pipeline], list[Any]]) -> Any:
    """Run a generator of this module with a ``pipeline(argvs) -> replies`` (errors as values);
    its return value."""
    try:
        argvs = next(steps)
        while True:
            argvs = steps.send(pipeline(argvs))
    except StopIteration as stop:
        return stop.value


def chunks(items: list[DeadLetter], size: int = BATCH) -> Iterable[list[DeadLetter]]:
    for start in range(0, len(items), size):
        yield items[start:start + size]
