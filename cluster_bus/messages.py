"""Cluster bus messages: one frozen dataclass per type.

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

from dataclasses import dataclass
from enum import IntEnum
from typing import Any, Union

__all__ = [
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


@dataclass(frozen=True, slots=True)
class Gossip:
    """What the sender knows about one other node."""

    node_id: str
    ip: str
    port: int
    flags: int
    ping_sent: int  # ms, 0 = no ping pending (sender's clock, informative)
    pong_received: int  # ms (sender's clock, informative)


@dataclass(frozen=True, slots=True)
class Ping:
    sender: str
    port: int  # sender's client port
    flags: int  # sender's own flags (LEAVING travels this way)
    gossip: tuple[Gossip, ...] = ()


@dataclass(frozen=True, slots=True)
class Pong:
    sender: str
    port: int
    flags: int
    gossip: tuple[Gossip, ...] = ()


@dataclass(frozen=True, slots=True)
class Meet:
    """A PING that also asks the receiver to add the sender to its table."""

    sender: str
    port: int
    flags: int
    gossip: tuple[Gossip, ...] = ()


@dataclass(frozen=True, slots=True)
class Fail:
    """``sender`` reached agreement that ``node_id`` is failing."""

    sender: str
    node_id: str


@dataclass(frozen=True, slots=True)
class Data:
    """An application message (the job layer's); opaque to the bus."""

    sender: str
    kind: str
    body: Any


MAX_BATCH = 4096
"""Most application messages one ``DataBatch`` carries."""


@dataclass(frozen=True, slots=True)
class DataBatch:
    """Several application messages from one sender, in order: ``items`` is a
    sequence of ``(kind, body)`` pairs, each exactly what a ``Data`` carries."""

    sender: str
    items: Any


@dataclass(frozen=True, slots=True)
class AuthHello:
    """Initiator -> responder: my nonce (starts the challenge-response)."""

    nonce: bytes


@dataclass(frozen=True, slots=True)
class AuthChallenge:
    """Responder -> initiator: my nonce and my proof of the secret."""

    nonce: bytes
    proof: bytes


@dataclass(frozen=True, slots=True)
class AuthProof:
    """Initiator -> responder: my proof of the secret."""

    proof: bytes


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
