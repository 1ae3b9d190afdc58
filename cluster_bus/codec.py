"""Cluster bus wire codec: message encoding, framing and link authentication.

This module is sans-I/O: it only turns messages into bytes and bytes into
messages.  It never touches sockets, clocks or random sources; nonces are
handed in by the caller.

Frames
======

Every unit on a bus link is a *frame*::

    +----------------+---------------------------+
    | N (4 bytes BE) | payload (N bytes)         |
    +----------------+---------------------------+

``0 < N <= max_frame`` (64 MiB by default).  :class:`FrameDecoder` turns a
byte stream into payloads; :func:`frame` builds one frame.  A header that
declares ``N == 0`` or ``N > max_frame`` is rejected as soon as the four
header bytes are in, without waiting for (or buffering) the body.

Message bodies
==============

Without a cluster secret the payload of each frame is a message *body*: one
msgpack array (``use_bin_type=True``; str is UTF-8 text, bytes are bin)::

    Ping/Pong/Meet  [version, type, sender, port, flags, [gossip, ...]]
        gossip      [node_id, ip, port, flags, ping_sent, pong_received]
    Fail            [version, type, sender, node_id]
    Data            [version, type, sender, kind, body]
    DataBatch       [version, type, sender, [[kind, body], ...]]   (1..MAX_BATCH items)
    AuthHello       [version, type, nonce]
    AuthChallenge   [version, type, nonce, proof]
    AuthProof       [version, type, proof]

``version`` is :data:`~cluster_bus.messages.PROTOCOL_VERSION`, ``type`` a
:class:`~cluster_bus.messages.MsgType`.  :func:`decode_message` checks
everything: exact version, known type, exact field count and each field's
type and range (node ids are 40 lowercase hex chars, ports and flags are
ints in 0..65535, times are ints in 0..2**63-1, ``bool`` is never an int,
at most 1024 gossip entries, nonces are 16 bytes, proofs 32 bytes,
``Data.kind`` is 1..32 chars).  ``Data.body`` is any msgpack value; note
that msgpack has no tuples (they come back as lists) and that map keys must
be ``str`` or ``bytes`` (the decoder refuses other keys, which keeps a
peer from building hash-colliding maps; :func:`encode_message` checks this
too so a bad body fails at the sender, not at the peer).

Authentication (only when ``cluster-secret`` is set)
====================================================

The first frames of a link are a mutual HMAC-SHA256 challenge-response in
plain framed messages; ``S`` is the secret, ``Ni``/``Nr`` are 16 random
bytes chosen by the initiator (the connecting side) and the responder::

    initiator                                      responder
        |  AuthHello(Ni)                               |
        |--------------------------------------------->|
        |  AuthChallenge(Nr, Pr)                       |  Pr = HMAC(S, "disque-py bus v1 responder" | Ni | Nr)
        |<---------------------------------------------|
     verify Pr                                         |
        |  AuthProof(Pi)                               |  Pi = HMAC(S, "disque-py bus v1 initiator" | Ni | Nr)
        |--------------------------------------------->|
        |                                          verify Pi

Both sides then derive two link keys with HKDF-SHA256 (length 32,
``salt = Ni | Nr``, ``info = "disque-py bus v1 i->r"`` and ``"... r->i"``,
input key material ``S``).  The labels differ per role so that a proof can't
be reflected back to its sender, and the responder refuses ``Nr == Ni``.

From then on every frame is sealed by a :class:`LinkSession`::

    | N (4 BE) | seq (8 BE) | body | MAC (32) |     MAC = HMAC-SHA256(send key, seq | body)

``seq`` starts at 0 in each direction and grows by one per frame; the
receiver accepts exactly the next sequence number, so replayed, reordered,
dropped or reflected (other direction) frames all fail.  There is no
encryption: the secret authenticates peers and frames, it does not hide
traffic.

:func:`decode_message` decodes every type wherever it appears; the link layer
must only accept Auth* messages during the handshake (the handshake classes
enforce that) and refuse them afterwards.

Errors
======

:class:`BusProtocolError` (malformed frame or message) and its subclass
:class:`AuthError` (failed handshake, bad MAC, replay) both mean the link
can't be trusted any more: the caller closes it (and counts the event); it
never tries to resynchronise.  :class:`FrameDecoder`, the handshakes and the
receive side of a :class:`LinkSession` stay failed after their first error.
Local misuse (e.g. encoding something that isn't a message, a nonce of the
wrong size) raises ``TypeError``/``ValueError`` instead.

Compiled: mypyc compiles this module (setup.py, ``cluster_bus/_build.py``; the messages stay
interpreted). Public entry points that check their arguments' types take ``Any``, so that a
wrong type raises the documented error rather than mypyc's argument check.

Performance note: the per-frame MAC uses ``cryptography``'s HMAC with a
pre-keyed context that is ``copy()``-ed per frame, which measured faster
than both a fresh ``cryptography`` HMAC and the stdlib ``hmac`` module.
"""

from __future__ import annotations

import re
import struct
from typing import Any, Final, final

import msgpack

from .messages import (
    PROTOCOL_VERSION,
    AuthChallenge,
    AuthHello,
    AuthProof,
    Data,
    DataBatch,
    MAX_BATCH,
    Fail,
    Gossip,
    Meet,
    Message,
    MsgType,
    Ping,
    Pong,
)

__all__ = [
    "MAX_FRAME_DEFAULT",
    "MAX_GOSSIP",
    "NONCE_SIZE",
    "PROOF_SIZE",
    "MAC_SIZE",
    "SEQ_SIZE",
    "SEAL_OVERHEAD",
    "MAX_BODY",
    "DATA_BATCH_OVERHEAD",
    "BusProtocolError",
    "AuthError",
    "encode_message",
    "decode_message",
    "encode_data_item",
    "data_batch_body",
    "frame",
    "FrameDecoder",
    "InitiatorHandshake",
    "ResponderHandshake",
    "LinkSession",
]

MAX_FRAME_DEFAULT: Final = 64 * 1024 * 1024
MAX_GOSSIP: Final = 1024
NONCE_SIZE: Final = 16
PROOF_SIZE: Final = 32
MAC_SIZE: Final = 32
SEQ_SIZE: Final = 8
SEAL_OVERHEAD: Final = SEQ_SIZE + MAC_SIZE
#: Largest body :func:`encode_message` produces: it fits a frame, sealed or not.
MAX_BODY: Final = MAX_FRAME_DEFAULT - SEAL_OVERHEAD

_MAX_IP_LEN: Final = 46  # longest textual IPv6 (with embedded IPv4)
_MAX_KIND_LEN: Final = 32
_MAX_TIME: Final = 2**63
_MAX_SEQ: Final = 2**64

_HDR: Final = struct.Struct(">I")
_SEQ: Final = struct.Struct(">Q")
_NODE_ID_RE: Final = re.compile(r"[0-9a-f]{40}")

_RESPONDER_LABEL: Final = b"disque-py bus v1 responder"
_INITIATOR_LABEL: Final = b"disque-py bus v1 initiator"
_KEY_INFO_I2R: Final = b"disque-py bus v1 i->r"
_KEY_INFO_R2I: Final = b"disque-py bus v1 r->i"

# The message types as plain ints (compared with what a peer sent, per message).
_PING: Final = int(MsgType.PING)
_PONG: Final = int(MsgType.PONG)
_MEET: Final = int(MsgType.MEET)
_FAIL: Final = int(MsgType.FAIL)
_DATA: Final = int(MsgType.DATA)
_DATA_BATCH: Final = int(MsgType.DATA_BATCH)
_AUTH_HELLO: Final = int(MsgType.AUTH_HELLO)
_AUTH_CHALLENGE: Final = int(MsgType.AUTH_CHALLENGE)
_AUTH_PROOF: Final = int(MsgType.AUTH_PROOF)


class BusProtocolError(Exception):
    """The peer sent something malformed; the link must be closed. ``foreign``: the protocol
    the first bytes of the link were in, when they were recognisably not the bus's ("RESP",
    "HTTP", "TLS": a client on the wrong port; see :func:`foreign_protocol`), else None."""

    def __init__(self, reason: str, foreign: str | None = None) -> None:
        super().__init__(reason)
        self.reason = reason
        self.foreign = foreign


def foreign_protocol(head: bytes) -> str | None:
    """Which client protocol ``head``, the first bytes a peer sent, is in, if it is one a person
    points at a wrong port: RESP (``*`` and a digit, or an inline command such as ``PING``),
    HTTP (a request line) or TLS (a handshake record). None for anything else."""
    if len(head) >= 2 and head[:1] == b"*" and head[1:2].isdigit():
        return "RESP"
    if len(head) >= 3 and head[0] == 0x16 and head[1] == 0x03:
        return "TLS"
    word = head.split(b" ", 1)[0].split(b"\r", 1)[0].upper()
    if word in (b"GET", b"POST", b"HEAD", b"PUT", b"DELETE", b"OPTIONS", b"PATCH") and b" " in head:
        return "HTTP"
    if word in (b"PING", b"INFO", b"HELLO", b"AUTH", b"QUIT", b"ADDJOB", b"GETJOB", b"CLUSTER", b"COMMAND"):
        return "RESP"
    return None


class AuthError(BusProtocolError):
    """Authentication failed (handshake or per-frame MAC/sequence)."""


# ---------------------------------------------------------------------------
# Messages <-> bodies
# ---------------------------------------------------------------------------


def encode_message(msg: Message) -> bytes:
    """Encode ``msg`` as a msgpack body (no frame header).

    The message is validated with the same rules as :func:`decode_message`,
    so what this returns is always accepted by a peer; invalid fields raise
    ``ValueError``, a non-message or non-msgpack-able ``Data.body``
    ``TypeError``.
    """
    m: Any = msg  # fields are checked here, not assumed to have their declared types
    cls = type(msg)
    fields: list[Any]
    if cls is Ping or cls is Pong or cls is Meet:
        mtype = _PING if cls is Ping else _PONG if cls is Pong else _MEET
        _check_node_id(m.sender, "sender")
        _check_u16(m.port, "port")
        _check_u16(m.flags, "flags")
        gossip = m.gossip
        if not isinstance(gossip, (tuple, list)) or len(gossip) > MAX_GOSSIP:
            raise ValueError(f"gossip must be a sequence of at most {MAX_GOSSIP} entries")
        entries: list[Any] = []
        for g in gossip:
            if type(g) is not Gossip:
                raise TypeError("gossip entries must be Gossip")
            _check_node_id(g.node_id, "gossip node id")
            _check_ip(g.ip)
            _check_u16(g.port, "gossip port")
            _check_u16(g.flags, "gossip flags")
            _check_time(g.ping_sent, "ping_sent")
            _check_time(g.pong_received, "pong_received")
            entries.append([g.node_id, g.ip, g.port, g.flags, g.ping_sent, g.pong_received])
        fields = [PROTOCOL_VERSION, mtype, m.sender, m.port, m.flags, entries]
    elif cls is Data:
        _check_node_id(m.sender, "sender")
        _check_kind(m.kind)
        _check_body(m.body, 0)
        fields = [PROTOCOL_VERSION, _DATA, m.sender, m.kind, m.body]
    elif cls is DataBatch:
        _check_node_id(m.sender, "sender")
        items = m.items
        if not isinstance(items, (tuple, list)) or not 1 <= len(items) <= MAX_BATCH:
            raise ValueError(f"DataBatch.items must hold 1..{MAX_BATCH} entries")
        packed: list[Any] = []
        for item in items:
            kind, body = item
            _check_kind(kind)
            if not isinstance(body, _BODY_LEAVES):
                _check_body(body, 0)
            packed.append((kind, body))
        fields = [PROTOCOL_VERSION, _DATA_BATCH, m.sender, packed]
    elif cls is Fail:
        _check_node_id(m.sender, "sender")
        _check_node_id(m.node_id, "node_id")
        fields = [PROTOCOL_VERSION, _FAIL, m.sender, m.node_id]
    elif cls is AuthHello:
        _check_bytes(m.nonce, NONCE_SIZE, "nonce")
        fields = [PROTOCOL_VERSION, _AUTH_HELLO, bytes(m.nonce)]
    elif cls is AuthChallenge:
        _check_bytes(m.nonce, NONCE_SIZE, "nonce")
        _check_bytes(m.proof, PROOF_SIZE, "proof")
        fields = [PROTOCOL_VERSION, _AUTH_CHALLENGE, bytes(m.nonce), bytes(m.proof)]
    elif cls is AuthProof:
        _check_bytes(m.proof, PROOF_SIZE, "proof")
        fields = [PROTOCOL_VERSION, _AUTH_PROOF, bytes(m.proof)]
    else:
        raise TypeError(f"not a bus message: {cls.__name__}")
    try:
        body = msgpack.packb(fields, use_bin_type=True)
    except (TypeError, ValueError, OverflowError) as e:
        raise TypeError(f"cannot encode {cls.__name__}: {e}") from e
    if len(body) > MAX_BODY:
        raise ValueError(f"encoded message too large ({len(body)} > {MAX_BODY} bytes)")
    return body


def encode_data_item(kind: Any, body: Any, *, check_body: bool = True) -> bytes:
    """Encode one application message for a :class:`DataBatch`, at once.

    Checked like ``Data`` (a bad kind or body raises here, at the sender).
    Encoding when the message is queued, not when the batch leaves, means a
    caller may change ``body`` afterwards without changing what was sent.
    ``check_body=False`` skips the walk that refuses map keys other than str
    and bytes (a tenth of a replicated ADDJOB's cost at its origin): for
    bodies whose shape is fixed by code, such as the job layer's (the
    cluster simulation encodes every one of its messages with the check on).
    """
    _check_kind(kind)
    if check_body and not isinstance(body, _BODY_LEAVES):
        _check_body(body, 0)
    try:
        return _packb((kind, body))
    except (TypeError, ValueError, OverflowError) as e:
        raise TypeError(f"cannot encode Data.body: {e}") from e


def data_batch_body(sender: Any, items: list[bytes]) -> bytes:
    """The body of a ``DataBatch`` from items made by :func:`encode_data_item`.

    The caller keeps ``1 <= len(items) <= MAX_BATCH`` and the total under
    :data:`MAX_BODY` (see ``Bus.send_data``).
    """
    n: int = len(items)
    if not 1 <= n <= MAX_BATCH:
        raise ValueError(f"a DataBatch holds 1..{MAX_BATCH} items")
    if n < 16:
        header = bytes((0x90 | n,))
    else:
        header = b"\xdc" + n.to_bytes(2, "big")
    return _packb_prefix(sender) + header + b"".join(items)


DATA_BATCH_OVERHEAD: Final = 64  # at most what data_batch_body adds: array headers, version, type, sender


def _packb_prefix(sender: Any) -> bytes:
    _check_node_id(sender, "sender")
    return _BATCH_PREFIX + _packb(sender)


_packer: Final = msgpack.Packer(use_bin_type=True)
_packb: Final = _packer.pack
_BATCH_PREFIX: Final[bytes] = b"\x94" + _packb(PROTOCOL_VERSION) + _packb(_DATA_BATCH)  # array of 4, version, type


def _check_node_id(v: Any, what: str) -> None:
    if type(v) is not str or len(v) != 40 or _NODE_ID_RE.fullmatch(v) is None:
        raise ValueError(f"{what} must be 40 lowercase hex chars")


def _check_u16(v: Any, what: str) -> None:
    if type(v) is not int or not 0 <= v <= 0xFFFF:
        raise ValueError(f"{what} must be an int in 0..65535")


def _check_time(v: Any, what: str) -> None:
    if type(v) is not int or not 0 <= v < _MAX_TIME:
        raise ValueError(f"{what} must be an int in 0..2**63-1")


def _check_ip(v: Any) -> None:
    if type(v) is not str or len(v) > _MAX_IP_LEN:
        raise ValueError(f"ip must be a str of at most {_MAX_IP_LEN} chars")


def _check_kind(v: Any) -> None:
    if type(v) is not str or not 1 <= len(v) <= _MAX_KIND_LEN:
        raise ValueError(f"kind must be a str of 1..{_MAX_KIND_LEN} chars")


def _check_bytes(v: Any, size: int, what: str) -> None:
    if not isinstance(v, (bytes, bytearray, memoryview)) or len(v) != size:
        raise ValueError(f"{what} must be {size} bytes")


_BODY_LEAVES: Final = (type(None), bool, int, float, str, bytes, bytearray, memoryview)
_MAX_BODY_DEPTH: Final = 500  # below msgpack's packer limit (511) and unpacker stack (1024)


def _check_body(v: Any, depth: int) -> None:
    """Refuse map keys the decoder would refuse (anything but str/bytes)."""
    if isinstance(v, dict):
        if depth >= _MAX_BODY_DEPTH:
            raise ValueError("Data.body nested too deeply")
        for k, item in v.items():
            if type(k) is not str and type(k) is not bytes:
                raise TypeError(f"Data.body map keys must be str or bytes, not {type(k).__name__}")
            if not isinstance(item, _BODY_LEAVES):
                _check_body(item, depth + 1)
    elif isinstance(v, (list, tuple)):
        if depth >= _MAX_BODY_DEPTH:
            raise ValueError("Data.body nested too deeply")
        for item in v:
            if not isinstance(item, _BODY_LEAVES):
                _check_body(item, depth + 1)
    # Anything else: leaves, or types msgpack itself will refuse.


def decode_message(body: Any, max_size: int = MAX_FRAME_DEFAULT) -> Message:
    """Decode and strictly validate one message body.

    Raises :class:`BusProtocolError` (and nothing else) on any defect.
    """
    try:
        n: int = len(body)
    except TypeError:
        raise BusProtocolError("body is not bytes") from None
    if n > max_size:
        raise BusProtocolError("message too large")
    # unpackb has no max_buffer_size: the length check above plays its role.
    try:
        obj = msgpack.unpackb(
            body,
            raw=False,
            use_list=True,
            strict_map_key=True,
            max_str_len=max_size,
            max_bin_len=max_size,
            max_array_len=max_size,
            max_map_len=max_size // 2,
            max_ext_len=0,
            ext_hook=_reject_ext,
        )
    except BusProtocolError:
        raise
    except Exception as e:  # ExtraData, FormatError, StackError, ValueError, ...
        raise BusProtocolError(f"bad msgpack: {type(e).__name__}") from None
    try:
        return _build(obj)
    except BusProtocolError:
        raise
    except Exception as e:  # defensive: validation should have caught it
        raise BusProtocolError(f"bad message: {type(e).__name__}") from None


def _reject_ext(code: Any, data: Any) -> Any:
    raise BusProtocolError("msgpack ext types are not allowed")


def _build(obj: Any) -> Message:
    if type(obj) is not list or len(obj) < 2:
        raise BusProtocolError("message is not an array")
    version = obj[0]
    if type(version) is not int or version != PROTOCOL_VERSION:
        raise BusProtocolError("unsupported version")
    t_obj = obj[1]
    if type(t_obj) is not int:
        raise BusProtocolError("bad message type")
    t: int = t_obj
    n: int = len(obj)
    if t == _PING or t == _PONG or t == _MEET:
        if n != 6:
            raise BusProtocolError("bad field count")
        _, _, sender, port, flags, raw_gossip = obj
        _need_node_id(sender)
        _need_u16(port)
        _need_u16(flags)
        if type(raw_gossip) is not list:
            raise BusProtocolError("gossip is not an array")
        if len(raw_gossip) > MAX_GOSSIP:
            raise BusProtocolError("too many gossip entries")
        gossip = tuple([_build_gossip(g) for g in raw_gossip])
        if t == _PING:
            return Ping(sender, port, flags, gossip)
        if t == _PONG:
            return Pong(sender, port, flags, gossip)
        return Meet(sender, port, flags, gossip)
    if t == _DATA:
        if n != 5:
            raise BusProtocolError("bad field count")
        _, _, sender, kind, payload = obj
        _need_node_id(sender)
        if type(kind) is not str or not 1 <= len(kind) <= _MAX_KIND_LEN:
            raise BusProtocolError("bad data kind")
        return Data(sender, kind, payload)
    if t == _DATA_BATCH:
        if n != 4:
            raise BusProtocolError("bad field count")
        _, _, sender, items = obj
        _need_node_id(sender)
        if type(items) is not list or not 1 <= len(items) <= MAX_BATCH:
            raise BusProtocolError("bad data batch")
        for item in items:
            if type(item) is not list or len(item) != 2:
                raise BusProtocolError("bad data batch entry")
            kind = item[0]
            if type(kind) is not str or not 1 <= len(kind) <= _MAX_KIND_LEN:
                raise BusProtocolError("bad data kind")
        return DataBatch(sender, items)
    if t == _FAIL:
        if n != 4:
            raise BusProtocolError("bad field count")
        _, _, sender, node_id = obj
        _need_node_id(sender)
        _need_node_id(node_id)
        return Fail(sender, node_id)
    if t == _AUTH_HELLO:
        if n != 3:
            raise BusProtocolError("bad field count")
        return AuthHello(_need_bytes(obj[2], NONCE_SIZE, "bad nonce"))
    if t == _AUTH_CHALLENGE:
        if n != 4:
            raise BusProtocolError("bad field count")
        return AuthChallenge(
            _need_bytes(obj[2], NONCE_SIZE, "bad nonce"),
            _need_bytes(obj[3], PROOF_SIZE, "bad proof"),
        )
    if t == _AUTH_PROOF:
        if n != 3:
            raise BusProtocolError("bad field count")
        return AuthProof(_need_bytes(obj[2], PROOF_SIZE, "bad proof"))
    raise BusProtocolError("unknown message type")


def _build_gossip(g: Any) -> Gossip:
    if type(g) is not list or len(g) != 6:
        raise BusProtocolError("bad gossip entry")
    node_id, ip, port, flags, ping_sent, pong_received = g
    _need_node_id(node_id)
    if type(ip) is not str or len(ip) > _MAX_IP_LEN:
        raise BusProtocolError("bad gossip ip")
    _need_u16(port)
    _need_u16(flags)
    if type(ping_sent) is not int or not 0 <= ping_sent < _MAX_TIME:
        raise BusProtocolError("bad gossip ping time")
    if type(pong_received) is not int or not 0 <= pong_received < _MAX_TIME:
        raise BusProtocolError("bad gossip pong time")
    return Gossip(node_id, ip, port, flags, ping_sent, pong_received)


def _need_node_id(v: Any) -> None:
    if type(v) is not str or len(v) != 40 or _NODE_ID_RE.fullmatch(v) is None:
        raise BusProtocolError("bad node id")


def _need_u16(v: Any) -> None:
    if type(v) is not int or not 0 <= v <= 0xFFFF:
        raise BusProtocolError("bad port or flags")


def _need_bytes(v: Any, size: int, reason: str) -> bytes:
    if type(v) is not bytes or len(v) != size:
        raise BusProtocolError(reason)
    return v


# ---------------------------------------------------------------------------
# Framing
# ---------------------------------------------------------------------------


def frame(payload: bytes) -> bytes:
    """Prefix ``payload`` with its 4-byte big-endian length."""
    n: int = len(payload)
    if not 0 < n <= MAX_FRAME_DEFAULT:
        raise ValueError(f"frame payload must be 1..{MAX_FRAME_DEFAULT} bytes, got {n}")
    return _HDR.pack(n) + payload


@final
class FrameDecoder:
    """Reassemble frames from a byte stream.

    ``feed`` returns the payloads completed by ``data`` (possibly none,
    possibly many).  A zero or oversized declared length raises
    :class:`BusProtocolError` as soon as the header is complete; after any
    error the decoder is failed and every later ``feed`` raises too.
    """

    __slots__ = ("_buf", "_max", "_error", "_started", "_foreign")

    def __init__(self, max_frame: int = MAX_FRAME_DEFAULT) -> None:
        if not 0 < max_frame <= 0xFFFFFFFF:
            raise ValueError("max_frame must be in 1..2**32-1")
        self._buf = bytearray()
        self._max = max_frame
        self._error: str | None = None
        self._started = False  # a frame came through: later bytes are the bus's, or garbage
        self._foreign: str | None = None

    @property
    def buffered(self) -> int:
        """Bytes received but not yet returned as a payload."""
        return len(self._buf)

    def feed(self, data: Any) -> list[bytes]:
        if self._error is not None:
            raise BusProtocolError(self._error, self._foreign)
        buf = self._buf
        buf += data
        avail: int = len(buf)
        out: list[bytes] = []
        pos: int = 0
        unpack_from = _HDR.unpack_from
        maxf: int = self._max
        with memoryview(buf) as mv:
            while avail - pos >= 4:
                n: int = unpack_from(buf, pos)[0]
                if n == 0 or n > maxf:
                    self._error = ("zero-length frame" if n == 0
                                   else "frame too large: %d bytes declared, at most %d" % (n, maxf))  # fmt: skip
                    if pos == 0 and not self._started:
                        self._foreign = foreign_protocol(bytes(buf[:16]))
                    break
                end: int = pos + 4 + n
                if end > avail:
                    break
                out.append(mv[pos + 4 : end].tobytes())
                pos = end
        if self._error is not None:
            buf.clear()
            raise BusProtocolError(self._error, self._foreign)
        if pos:
            self._started = True
            del buf[:pos]
        return out


# ---------------------------------------------------------------------------
# Authentication
# ---------------------------------------------------------------------------


# ``cryptography`` (some 5 ms to import) is loaded by the first authenticated link, not by every
# node's start: a cluster without cluster-secret never needs it.
crypto_hmac: Any = None
hashes: Any = None
HKDF: Any = None
InvalidSignature: Any = None


def _load_crypto() -> None:
    global crypto_hmac, hashes, HKDF, InvalidSignature
    if InvalidSignature is None:
        from cryptography.exceptions import InvalidSignature as invalid
        from cryptography.hazmat.primitives import hashes as hash_algorithms
        from cryptography.hazmat.primitives import hmac as hmac_module
        from cryptography.hazmat.primitives.kdf.hkdf import HKDF as hkdf

        crypto_hmac, hashes, HKDF, InvalidSignature = hmac_module, hash_algorithms, hkdf, invalid


def _hmac(key: bytes, *parts: bytes) -> bytes:
    _load_crypto()
    h = crypto_hmac.HMAC(key, hashes.SHA256())
    for p in parts:
        h.update(p)
    return h.finalize()


def _hmac_verify(key: bytes, expected: bytes, *parts: bytes) -> bool:
    _load_crypto()
    h = crypto_hmac.HMAC(key, hashes.SHA256())
    for p in parts:
        h.update(p)
    try:
        h.verify(expected)  # constant-time
    except InvalidSignature:
        return False
    return True


def _derive(secret: bytes, salt: bytes, info: bytes) -> bytes:
    _load_crypto()
    return HKDF(algorithm=hashes.SHA256(), length=32, salt=salt, info=info).derive(secret)


def _check_secret_nonce(secret: Any, nonce: Any) -> tuple[bytes, bytes]:
    if not isinstance(secret, (bytes, bytearray, memoryview)) or len(secret) == 0:
        raise ValueError("secret must be non-empty bytes")
    if not isinstance(nonce, (bytes, bytearray, memoryview)) or len(nonce) != NONCE_SIZE:
        raise ValueError(f"nonce must be {NONCE_SIZE} bytes")
    return bytes(secret), bytes(nonce)


def _decode_auth(payload: bytes) -> Message:
    try:
        return decode_message(payload)
    except AuthError:
        raise
    except BusProtocolError as e:
        raise AuthError(f"malformed auth message: {e.reason}") from None


class _Handshake:
    __slots__ = ("_secret", "_nonce", "_state", "_session")

    def __init__(self, secret: Any, nonce: Any) -> None:
        self._secret, self._nonce = _check_secret_nonce(secret, nonce)
        self._state = "start"
        self._session: LinkSession | None = None

    @property
    def done(self) -> bool:
        return self._session is not None

    @property
    def session(self) -> LinkSession:
        """The authenticated link session (AuthError before completion)."""
        if self._session is None:
            raise AuthError("handshake not complete")
        return self._session

    def _fail(self, reason: str) -> AuthError:
        self._state = "failed"
        self._secret = b""
        return AuthError(reason)

    def _keys(self, nonce_i: bytes, nonce_r: bytes) -> tuple[bytes, bytes]:
        salt = nonce_i + nonce_r
        return (
            _derive(self._secret, salt, _KEY_INFO_I2R),
            _derive(self._secret, salt, _KEY_INFO_R2I),
        )


@final
class InitiatorHandshake(_Handshake):
    """The connecting side: ``start()``, then ``receive(challenge)``."""

    __slots__ = ()

    def start(self) -> bytes:
        """Return the framed AuthHello to send first."""
        if self._state != "start":
            raise self._fail("handshake already started")
        self._state = "hello-sent"
        return frame(encode_message(AuthHello(self._nonce)))

    def receive(self, payload: bytes) -> bytes:
        """Check the responder's AuthChallenge; return the framed AuthProof.

        On return ``session`` is ready.
        """
        if self._state != "hello-sent":
            raise self._fail("unexpected message in state " + self._state)
        try:
            msg = _decode_auth(payload)
        except AuthError as e:
            raise self._fail(e.reason) from None
        if type(msg) is not AuthChallenge:
            raise self._fail("expected AuthChallenge")
        nonce_i, nonce_r = self._nonce, msg.nonce
        if nonce_r == nonce_i:
            raise self._fail("nonce reuse")
        if not _hmac_verify(self._secret, msg.proof, _RESPONDER_LABEL, nonce_i, nonce_r):
            raise self._fail("bad responder proof")
        proof_i = _hmac(self._secret, _INITIATOR_LABEL, nonce_i, nonce_r)
        k_i2r, k_r2i = self._keys(nonce_i, nonce_r)
        self._session = LinkSession(send_key=k_i2r, recv_key=k_r2i)
        self._state = "done"
        self._secret = b""
        return frame(encode_message(AuthProof(proof_i)))


@final
class ResponderHandshake(_Handshake):
    """The accepting side: ``receive(hello)`` -> challenge, ``receive(proof)`` -> None."""

    __slots__ = ("_nonce_i",)

    def __init__(self, secret: Any, nonce: Any) -> None:
        super().__init__(secret, nonce)
        self._nonce_i = b""

    def receive(self, payload: bytes) -> bytes | None:
        state = self._state
        if state == "start":
            try:
                msg = _decode_auth(payload)
            except AuthError as e:
                raise self._fail(e.reason) from None
            if type(msg) is not AuthHello:
                raise self._fail("expected AuthHello")
            if msg.nonce == self._nonce:
                raise self._fail("nonce reuse")
            self._nonce_i = msg.nonce
            proof_r = _hmac(self._secret, _RESPONDER_LABEL, msg.nonce, self._nonce)
            self._state = "challenge-sent"
            return frame(encode_message(AuthChallenge(self._nonce, proof_r)))
        if state == "challenge-sent":
            try:
                msg = _decode_auth(payload)
            except AuthError as e:
                raise self._fail(e.reason) from None
            if type(msg) is not AuthProof:
                raise self._fail("expected AuthProof")
            nonce_i, nonce_r = self._nonce_i, self._nonce
            if not _hmac_verify(self._secret, msg.proof, _INITIATOR_LABEL, nonce_i, nonce_r):
                raise self._fail("bad initiator proof")
            k_i2r, k_r2i = self._keys(nonce_i, nonce_r)
            self._session = LinkSession(send_key=k_r2i, recv_key=k_i2r)
            self._state = "done"
            self._secret = b""
            return None
        raise self._fail("unexpected message in state " + state)


@final
class LinkSession:
    """Per-link authenticated framing (after a successful handshake).

    ``seal(body)`` returns a complete frame to write; ``open(payload)``
    takes a payload from :class:`FrameDecoder` and returns the body.
    """

    __slots__ = ("_send_mac", "_recv_mac", "_send_seq", "_recv_seq", "_recv_error")

    def __init__(self, send_key: Any, recv_key: Any) -> None:
        if len(send_key) != 32 or len(recv_key) != 32:
            raise ValueError("link keys must be 32 bytes")
        _load_crypto()  # (open's ``except InvalidSignature`` relies on it too)
        # Pre-keyed contexts, copied per frame (cheaper than re-keying).
        self._send_mac: Any = crypto_hmac.HMAC(bytes(send_key), hashes.SHA256())
        self._recv_mac: Any = crypto_hmac.HMAC(bytes(recv_key), hashes.SHA256())
        self._send_seq = 0
        self._recv_seq = 0
        self._recv_error: str | None = None

    @property
    def send_seq(self) -> int:
        """Sequence number of the next sealed frame."""
        return self._send_seq

    @property
    def recv_seq(self) -> int:
        """Sequence number the next opened frame must carry."""
        return self._recv_seq

    def seal(self, body: bytes) -> bytes:
        """Return ``len | seq | body | MAC`` ready to write."""
        seq: int = self._send_seq
        if seq >= _MAX_SEQ:
            raise AuthError("send sequence exhausted")
        n: int = SEAL_OVERHEAD + len(body)
        if n > MAX_FRAME_DEFAULT:
            raise ValueError("body too large to seal")
        seq_b = _SEQ.pack(seq)
        h = self._send_mac.copy()
        h.update(seq_b)
        h.update(body)
        self._send_seq = seq + 1
        return b"".join((_HDR.pack(n), seq_b, body, h.finalize()))

    def open(self, payload: bytes) -> bytes:
        """Verify a sealed payload (without its length header); return the body."""
        if self._recv_error is not None:
            raise AuthError(self._recv_error)
        n: int = len(payload)
        if n < SEAL_OVERHEAD:
            self._recv_error = "truncated frame"
            raise AuthError(self._recv_error)
        with memoryview(payload) as mv:
            h = self._recv_mac.copy()
            h.update(mv[: n - MAC_SIZE])
            try:
                h.verify(mv[n - MAC_SIZE :].tobytes())  # constant-time
            except InvalidSignature:
                self._recv_error = "bad MAC"
                raise AuthError(self._recv_error) from None
            if _SEQ.unpack_from(mv, 0)[0] != self._recv_seq:
                self._recv_error = "replayed or out of order frame"
                raise AuthError(self._recv_error)
            self._recv_seq += 1
            return mv[SEQ_SIZE : n - MAC_SIZE].tobytes()
