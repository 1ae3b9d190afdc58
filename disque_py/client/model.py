"""Value types returned by the clients: jobs, node lists, dead letters.

All are frozen dataclasses. Bodies are always ``bytes`` (a node stores
bytes); text and structured payloads are helpers on top (``Job.text()``,
``Job.json()``, ``Job.msgpack()``). Queue names and job IDs are ``str``;
queue names that are not valid UTF-8 round-trip through
``surrogateescape``.
"""

from __future__ import annotations

import base64
import json as _json
import time
from dataclasses import dataclass, field
from typing import Any

__all__ = ["Job", "DeliveryInfo", "NodeInfo", "HelloInfo", "DeadLetter", "encode_body", "encode_name", "decode_name"]


def encode_body(body: bytes | bytearray | memoryview | str) -> bytes:
    """Bodies are bytes; ``str`` is encoded as UTF-8."""
    if isinstance(body, str):
        return body.encode("utf-8")
    if isinstance(body, (bytes, bytearray, memoryview)):
        return bytes(body)
    raise TypeError("a job body must be bytes or str, not %s" % type(body).__name__)


def encode_name(name: str | bytes) -> bytes:
    """Queue names and IDs: ``str`` (UTF-8, surrogateescape) or ``bytes``."""
    if isinstance(name, str):
        return name.encode("utf-8", "surrogateescape")
    if isinstance(name, (bytes, bytearray)):
        return bytes(name)
    raise TypeError("expected str or bytes, not %s" % type(name).__name__)


def decode_name(raw: bytes) -> str:
    return raw.decode("utf-8", "surrogateescape")


@dataclass(frozen=True, slots=True)
class DeliveryInfo:
    """What the node reports about a job with disque-py's delivery options, or a dead
    letter (see :class:`Job`, whose properties of the same names read it)."""

    deliveries: int | None = None
    maxdeliver: int | None = None
    deadletter: str | None = None
    backoff: tuple[float, float] | None = None
    last_nack_reason: str | None = None
    dead_letter_of: str | None = None
    original_queue: str | None = None
    original_deliveries: int | None = None
    dead_letter_reason: str | None = None
    original_options: tuple[str, ...] | None = None
    dedup: str | None = None
    returns: int | None = None


_NO_DELIVERY_INFO = DeliveryInfo()


@dataclass(frozen=True, slots=True)
class Job:
    """One job as delivered by GETJOB (or listed by QPEEK).

    ``nacks`` and ``additional_deliveries`` are the server's counters (zero
    when the command did not ask for them). ``attempt`` numbers this
    delivery: 1 for a job delivered for the first time.

    ``delivery`` is set only for jobs that use disque-py's delivery options
    (``ADDJOB ... BACKOFF / MAXDELIVER / DEADLETTER / DEDUP``, a ``NACK ... REASON``,
    a dead letter) and only when GETJOB was asked for counters
    (``WITHCOUNTERS``, the clients' default); None for Disque's own jobs.
    Its fields read as properties of the job (None when not reported):

    * ``deliveries``: deliveries counted by the cluster, this one included;
    * ``maxdeliver``, ``deadletter``, ``backoff`` (``(min_s, max_s)``): the
      job's own policy (``deadletter`` is the effective queue, e.g. ``q.dead``);
    * ``last_nack_reason``: the REASON of the job's last NACK;
    * for a dead letter: ``dead_letter_of`` (the original job's ID),
      ``original_queue``, ``original_deliveries``, ``dead_letter_reason`` and
      ``original_options`` (the ADDJOB options to give it back to its queue);
    * ``returns``: how often a delivery was given back unstarted (RELEASE), also
      :attr:`Job.returns` (0 when not reported);
    * ``dedup``: the job's deduplication key (``ADDJOB ... DEDUP key``, ``add_job(...,
      dedup=key)``), as ``str`` (bytes that are not UTF-8 round-trip through
      ``surrogateescape``).
    """

    queue: str
    id: str
    body: bytes
    nacks: int = 0
    additional_deliveries: int = 0
    delivery: DeliveryInfo | None = None

    @property
    def deliveries(self) -> int | None:
        return (self.delivery or _NO_DELIVERY_INFO).deliveries

    @property
    def maxdeliver(self) -> int | None:
        return (self.delivery or _NO_DELIVERY_INFO).maxdeliver

    @property
    def deadletter(self) -> str | None:
        return (self.delivery or _NO_DELIVERY_INFO).deadletter

    @property
    def backoff(self) -> tuple[float, float] | None:
        return (self.delivery or _NO_DELIVERY_INFO).backoff

    @property
    def last_nack_reason(self) -> str | None:
        return (self.delivery or _NO_DELIVERY_INFO).last_nack_reason

    @property
    def dead_letter_of(self) -> str | None:
        return (self.delivery or _NO_DELIVERY_INFO).dead_letter_of

    @property
    def original_queue(self) -> str | None:
        return (self.delivery or _NO_DELIVERY_INFO).original_queue

    @property
    def original_deliveries(self) -> int | None:
        return (self.delivery or _NO_DELIVERY_INFO).original_deliveries

    @property
    def dead_letter_reason(self) -> str | None:
        return (self.delivery or _NO_DELIVERY_INFO).dead_letter_reason

    @property
    def original_options(self) -> tuple[str, ...] | None:
        return (self.delivery or _NO_DELIVERY_INFO).original_options

    @property
    def dedup(self) -> str | None:
        return (self.delivery or _NO_DELIVERY_INFO).dedup

    @property
    def returns(self) -> int:
        """How often a delivery of the job was given back unstarted (RELEASE: a worker that
        stopped, or one that did not know its task); 0 when not reported."""
        return (self.delivery or _NO_DELIVERY_INFO).returns or 0

    @property
    def node_prefix(self) -> str:
        """The first 8 characters of the ID of the node that created the job."""
        return self.id[2:10]

    @property
    def attempt(self) -> int:
        """Which delivery this is: ``nacks + additional_deliveries + 1``, or the node's
        ``deliveries`` when that is more (it also counts deliveries on other nodes; a job
        given no delivery option at ADDJOB is counted only from its first NACK REASON on)."""
        attempt = self.nacks + self.additional_deliveries + 1
        if self.delivery is None:
            return attempt
        deliveries = self.delivery.deliveries
        return deliveries if deliveries is not None and deliveries > attempt else attempt

    @property
    def is_dead_letter(self) -> bool:
        """True for a job the cluster dead-lettered (``dead_letter_of`` names the original)."""
        return self.dead_letter_of is not None

    @property
    def last_delivery(self) -> bool:
        """True when the job's own MAXDELIVER makes this delivery its last: a failure now
        dead-letters it."""
        info = self.delivery
        if info is None or info.maxdeliver is None or info.deliveries is None:
            return False
        return info.deliveries >= info.maxdeliver

    def text(self, encoding: str = "utf-8", errors: str = "strict") -> str:
        return self.body.decode(encoding, errors)

    def json(self) -> Any:
        """The body parsed as JSON (``json.loads`` accepts UTF-8 bytes)."""
        return _json.loads(self.body)

    def msgpack(self) -> Any:
        """The body unpacked with msgpack (``pip install msgpack``)."""
        import msgpack

        return msgpack.unpackb(self.body, raw=False)


@dataclass(frozen=True, slots=True)
class NodeInfo:
    """A node as listed by HELLO. Lower ``priority`` is better (1 ok, 10 failing?, 100 leaving)."""

    id: str
    host: str
    port: int
    priority: int

    @property
    def address(self) -> tuple[str, int]:
        return (self.host, self.port)

    @property
    def prefix(self) -> str:
        return self.id[:8]


@dataclass(frozen=True, slots=True)
class HelloInfo:
    """The reply to Disque's ``HELLO``: protocol version, our node's ID, every node."""

    version: int
    node_id: str
    nodes: tuple[NodeInfo, ...]

    @property
    def myself(self) -> NodeInfo | None:
        for node in self.nodes:
            if node.id == self.node_id:
                return node
        return None


@dataclass(frozen=True, slots=True)
class DeadLetter:
    """The JSON body of a dead letter written by a client (the worker did this before
    dead letters were kept by the cluster; see :attr:`Job.dead_letter_of` for those).

    Stored as JSON: the original body goes in ``"body"`` when it is valid
    UTF-8, else base64-encoded in ``"body_base64"``; the last failure's traceback in
    ``"traceback"`` when there is one. ``DeadLetter.parse`` gives back the original
    bytes either way.
    """

    queue: str
    id: str
    body: bytes
    error: str
    attempt: int
    nacks: int = 0
    additional_deliveries: int = 0
    time: float = field(default_factory=time.time)
    traceback: str | None = None

    @classmethod
    def from_job(cls, job: Job, error: str, traceback: str | None = None) -> "DeadLetter":
        return cls(job.queue, job.id, job.body, error, job.attempt, job.nacks, job.additional_deliveries,
                   traceback=traceback)  # fmt: skip

    def encode(self) -> bytes:
        doc: dict[str, Any] = {
            "queue": self.queue,
            "id": self.id,
            "error": self.error,
            "attempt": self.attempt,
            "nacks": self.nacks,
            "additional_deliveries": self.additional_deliveries,
            "time": self.time,
        }
        if self.traceback is not None:
            doc["traceback"] = self.traceback
        try:
            doc["body"] = self.body.decode("utf-8")
        except UnicodeDecodeError:
            doc["body_base64"] = base64.b64encode(self.body).decode("ascii")
        # surrogateescape'd queue names are not encodable: escape them
        return _json.dumps(doc, ensure_ascii=True).encode("ascii")

    @classmethod
    def parse(cls, body: bytes | Job) -> "DeadLetter":
        if isinstance(body, Job):
            body = body.body
        doc = _json.loads(body)
        if "body_base64" in doc:
            raw = base64.b64decode(doc["body_base64"])
        else:
            raw = doc["body"].encode("utf-8")
        trace = doc.get("traceback")
        return cls(
            doc["queue"], doc["id"], raw, doc["error"], int(doc["attempt"]),
            int(doc.get("nacks", 0)), int(doc.get("additional_deliveries", 0)), float(doc.get("time", 0.0)),
            trace if isinstance(trace, str) else None,
        )  # fmt: skip
