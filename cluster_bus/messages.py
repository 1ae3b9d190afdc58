"""Cluster bus messages: one frozen class per type (a frozen dataclass's behaviour, see ``_Message``).

The bus knows nothing of jobs. Membership messages (PING, PONG, MEET, FAIL)
are understood here and by :mod:`cluster_bus.membership`; everything the job
layer sends (REPLJOB, GOTJOB, SETACK, NEEDJOBS, ...) travels as ``Data``: a
``kind`` string and a msgpack-able ``body`` the bus never looks into. Several
such messages queued for one link in the same scheduler turn travel together
as one ``DataBatch`` (one frame, one encode, one decode), which is how a
node replicating thousands of jobs a second keeps its per-message costs down.

Authentication messages (AUTH_*) only appear at the start of a link when
``cluster-secret`` is set; see :mod:`cluster_bus.codec`.

Node IDs are 40-character lowercase hex strings; ``port`` is always the
node's *client* port (the bus listens on port + 10000), as in Disque.
"""

from __future__ import annotations

from dataclasses import FrozenInstanceError
from enum import IntEnum
from typing import Any, Union

__all__ = [
    "FrozenRecord",
    "PROTOCOL_VERSION",
    "BUS_PORT_OFFSET",
    "VERSION_KIND",
    "MAX_RELEASE_LEN",
    "MAX_FEATURES",
    "MsgType",
    "Gossip",
    "Ping",
    "Pong",
    "Meet",
    "Fail",
    "Data",
    "DataBatch",
    "MAX_BATCH",
    "AuthHello",
    "AuthChallenge",
    "AuthProof",
    "Message",
    "NODE_MYSELF",
    "NODE_PFAIL",
    "NODE_FAIL",
    "NODE_HANDSHAKE",
    "NODE_NOADDR",
    "NODE_MEET",
    "NODE_LEAVING",
]

PROTOCOL_VERSION = 1
BUS_PORT_OFFSET = 10000

VERSION_KIND = "VERSION"
"""The ``Data`` kind of a node's release announcement (:mod:`cluster_bus.membership`, "Releases"):
body ``[release, [feature, ...]]``. A ``Data`` message because a node of before it (release 0.1.0)
passes an unknown ``Data`` kind to its job layer, which counts and drops it, where an unknown
message type or field would close the link."""
MAX_RELEASE_LEN = 32
MAX_FEATURES = 64

# Node flags, as Disque's CLUSTER_NODE_* (the values travel in gossip).
NODE_PFAIL = 1 << 0
NODE_FAIL = 1 << 1
NODE_MYSELF = 1 << 2
NODE_HANDSHAKE = 1 << 3
NODE_NOADDR = 1 << 4
NODE_MEET = 1 << 5
NODE_LEAVING = 1 << 7


class MsgType(IntEnum):
    PING = 0
    PONG = 1
    MEET = 2
    FAIL = 3
    DATA = 16
    DATA_BATCH = 17
    AUTH_HELLO = 32
    AUTH_CHALLENGE = 33
    AUTH_PROOF = 34


_put = object.__setattr__  # a field's value, set past the class's refusal (as a frozen dataclass does)


class _Message:
    """What ``@dataclass(frozen=True, slots=True)`` gave these classes, written once: a node's
    start imports this module, and the dataclass decorator compiled six methods per class there
    (some 3 ms of a start). Each class lists its fields in ``__match_args__`` (its ``__slots__``
    too) and sets them in a plain ``__init__``; equality, hash, repr, pickling and the refusal to
    change a field (``dataclasses.FrozenInstanceError``) are a frozen dataclass's."""

    __slots__ = ()
    __match_args__: tuple[str, ...] = ()

    def _values(self) -> tuple[Any, ...]:
        return tuple([getattr(self, name) for name in self.__match_args__])

    def __eq__(self, other: object) -> bool:
        if other.__class__ is self.__class__:
            return self._values() == other._values()  # type: ignore[attr-defined]
        return NotImplemented

    def __hash__(self) -> int:
        return hash(self._values())

    def __repr__(self) -> str:
        fields = ", ".join("%s=%r" % (name, getattr(self, name)) for name in self.__match_args__)
        return "%s(%s)" % (type(self).__qualname__, fields)

    def __setattr__(self, name: str, value: Any) -> None:
        raise FrozenInstanceError("cannot assign to field %r" % name)

    def __delattr__(self, name: str) -> None:
        raise FrozenInstanceError("cannot delete field %r" % name)

    def __getstate__(self) -> tuple[Any, ...]:
        return self._values()

    def __setstate__(self, state: tuple[Any, ...]) -> None:
        for name, value in zip(self.__match_args__, state):
            _put(self, name, value)


#: The base of the membership's effects too (membership.py): the same frozen-dataclass behaviour
#: without the decorator's work at import.
FrozenRecord = _Message


class Gossip(_Message):
    """What the sender knows about one other node."""

    __slots__ = __match_args__ = ("node_id", "ip", "port", "flags", "ping_sent", "pong_received")
    node_id: str
    ip: str
    port: int
    flags: int
    ping_sent: int  # ms, 0 = no ping pending (sender's clock, informative)
    pong_received: int  # ms (sender's clock, informative)

    def __init__(self, node_id: str, ip: str, port: int, flags: int, ping_sent: int, pong_received: int) -> None:
        _put(self, "node_id", node_id)
        _put(self, "ip", ip)
        _put(self, "port", port)
        _put(self, "flags", flags)
        _put(self, "ping_sent", ping_sent)
        _put(self, "pong_received", pong_received)


class _Heartbeat(_Message):
    """The fields of PING, PONG and MEET (each its own class: a PING never equals a PONG)."""

    __slots__ = __match_args__ = ("sender", "port", "flags", "gossip")
    sender: str
    port: int  # sender's client port
    flags: int  # sender's own flags (LEAVING travels this way)
    gossip: tuple[Gossip, ...]

    def __init__(self, sender: str, port: int, flags: int, gossip: tuple[Gossip, ...] = ()) -> None:
        _put(self, "sender", sender)
        _put(self, "port", port)
        _put(self, "flags", flags)
        _put(self, "gossip", gossip)


class Ping(_Heartbeat):
    __slots__ = ()


class Pong(_Heartbeat):
    __slots__ = ()


class Meet(_Heartbeat):
    """A PING that also asks the receiver to add the sender to its table."""

    __slots__ = ()


class Fail(_Message):
    """``sender`` reached agreement that ``node_id`` is failing."""

    __slots__ = __match_args__ = ("sender", "node_id")
    sender: str
    node_id: str

    def __init__(self, sender: str, node_id: str) -> None:
        _put(self, "sender", sender)
        _put(self, "node_id", node_id)


class Data(_Message):
    """An application message (the job layer's); opaque to the bus."""

    __slots__ = __match_args__ = ("sender", "kind", "body")
    sender: str
    kind: str
    body: Any

    def __init__(self, sender: str, kind: str, body: Any) -> None:
        _put(self, "sender", sender)
        _put(self, "kind", kind)
        _put(self, "body", body)


MAX_BATCH = 4096
"""Most application messages one ``DataBatch`` carries."""


class DataBatch(_Message):
    """Several application messages from one sender, in order: ``items`` is a
    sequence of ``(kind, body)`` pairs, each exactly what a ``Data`` carries."""

    __slots__ = __match_args__ = ("sender", "items")
    sender: str
    items: Any

    def __init__(self, sender: str, items: Any) -> None:
        _put(self, "sender", sender)
        _put(self, "items", items)


class AuthHello(_Message):
    """Initiator -> responder: my nonce (starts the challenge-response)."""

    __slots__ = __match_args__ = ("nonce",)
    nonce: bytes

    def __init__(self, nonce: bytes) -> None:
        _put(self, "nonce", nonce)


class AuthChallenge(_Message):
    """Responder -> initiator: my nonce and my proof of the secret."""

    __slots__ = __match_args__ = ("nonce", "proof")
    nonce: bytes
    proof: bytes

    def __init__(self, nonce: bytes, proof: bytes) -> None:
        _put(self, "nonce", nonce)
        _put(self, "proof", proof)


class AuthProof(_Message):
    """Initiator -> responder: my proof of the secret."""

    __slots__ = __match_args__ = ("proof",)
    proof: bytes

    def __init__(self, proof: bytes) -> None:
        _put(self, "proof", proof)


Message = Union[Ping, Pong, Meet, Fail, Data, DataBatch, AuthHello, AuthChallenge, AuthProof]

MESSAGE_TYPES: dict[type, MsgType] = {
    Ping: MsgType.PING,
    Pong: MsgType.PONG,
    Meet: MsgType.MEET,
    Fail: MsgType.FAIL,
    Data: MsgType.DATA,
    DataBatch: MsgType.DATA_BATCH,
    AuthHello: MsgType.AUTH_HELLO,
    AuthChallenge: MsgType.AUTH_CHALLENGE,
    AuthProof: MsgType.AUTH_PROOF,
}
