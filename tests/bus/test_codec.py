"""Tests for cluster_bus.codec: messages, framing, handshake, sealed links."""

from __future__ import annotations

import hashlib
import re
import struct

import msgpack
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from cluster_bus.codec import (
    MAC_SIZE,
    MAX_FRAME_DEFAULT,
    MAX_GOSSIP,
    SEAL_OVERHEAD,
    AuthError,
    BusProtocolError,
    FrameDecoder,
    InitiatorHandshake,
    LinkSession,
    ResponderHandshake,
    data_batch_body,
    decode_message,
    foreign_protocol,
    encode_data_item,
    encode_message,
    frame,
)
from cluster_bus.messages import (
    NODE_FAIL,
    NODE_LEAVING,
    NODE_PFAIL,
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
    MsgType,
    Ping,
    Pong,
)

A = "0123456789abcdef0123456789abcdef01234567"
B = "fedcba9876543210fedcba9876543210fedcba98"
C = "a" * 40
NONCE_I = bytes(range(16))
NONCE_R = bytes(range(16, 32))
SECRET = b"correct horse battery staple"

FAST = settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def gossip(node_id: str = C, **kw) -> Gossip:
    fields = dict(ip="192.168.1.10", port=7711, flags=NODE_PFAIL, ping_sent=0, pong_received=1_700_000_000_123)
    fields.update(kw)
    return Gossip(node_id, **fields)


def raw(*fields) -> bytes:
    return msgpack.packb(list(fields), use_bin_type=True)


def g_raw(**kw) -> list:
    g = gossip(**kw)
    return [g.node_id, g.ip, g.port, g.flags, g.ping_sent, g.pong_received]


# ---------------------------------------------------------------------------
# Round trips
# ---------------------------------------------------------------------------

ROUND_TRIP = [
    Ping(A, 7711, 0),
    Ping(A, 7711, NODE_LEAVING, (gossip(), gossip(B, ip="::ffff:255.255.255.255", flags=NODE_FAIL))),
    Pong(B, 65535, 65535, (gossip(ip="", port=0, flags=0, ping_sent=2**63 - 1, pong_received=0),)),
    Meet(A, 0, 0, tuple(gossip(format(i, "040x")) for i in range(MAX_GOSSIP))),
    Fail(A, B),
    Data(A, "REPLJOB", {"id": "D-1234", "body": b"\x00\xff", "ttl": 86400, "nodes": [A, B], "x": None}),
    Data(A, "k", None),
    Data(A, "k" * 32, True),
    Data(A, "GOTJOB", -(2**63)),
    Data(A, "GOTJOB", 2**64 - 1),
    Data(A, "f", 3.25),
    Data(A, "s", "héllo ✓"),
    Data(A, "b", b""),
    Data(A, "l", [1, [2, [3, {"a": {"b": [b"x", False]}}]]]),
    Data(A, "m", {b"bytes-key": 1, "str-key": 2}),
    DataBatch(A, [["REPLJOB", [{"id": b"D-1", "nodes": [A, B]}, False]], ["GOTJOB", [b"D-1"]], ["k" * 32, None]]),
    DataBatch(A, [["k", i] for i in range(MAX_BATCH)]),
    AuthHello(NONCE_I),
    AuthChallenge(NONCE_R, b"\x01" * 32),
    AuthProof(b"\xfe" * 32),
]


@pytest.mark.parametrize("msg", ROUND_TRIP, ids=lambda m: type(m).__name__)
def test_round_trip(msg):
    body = encode_message(msg)
    assert decode_message(body) == msg
    # and through the framing
    assert FrameDecoder().feed(frame(body)) == [body]


def test_tuples_come_back_as_lists():
    msg = Data(A, "t", (1, (2, 3)))
    assert decode_message(encode_message(msg)) == Data(A, "t", [1, [2, 3]])


def test_gossip_is_tuple_of_gossip():
    msg = decode_message(encode_message(Ping(A, 1, 2, [gossip()])))
    assert msg.gossip == (gossip(),)
    assert type(msg.gossip) is tuple


def test_wire_layout():
    assert msgpack.unpackb(encode_message(Fail(A, B))) == [PROTOCOL_VERSION, MsgType.FAIL, A, B]
    assert msgpack.unpackb(encode_message(Ping(A, 7711, 4, (gossip(),)))) == [
        PROTOCOL_VERSION,
        MsgType.PING,
        A,
        7711,
        4,
        [g_raw()],
    ]


# ---------------------------------------------------------------------------
# Encoder refuses what the decoder would refuse
# ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("msg", "error", "reason"),
    [
        (Ping(A.upper(), 1, 0), ValueError, "sender must"),
        (Ping(A[:39], 1, 0), ValueError, "sender must"),
        (Ping(A, True, 0), ValueError, "port must"),
        (Ping(A, 65536, 0), ValueError, "port must"),
        (Ping(A, 1, -1), ValueError, "flags must"),
        (Ping(A, 1, 0, tuple(gossip() for _ in range(MAX_GOSSIP + 1))), ValueError, "gossip must"),
        (Ping(A, 1, 0, (gossip(ip="x" * 47),)), ValueError, "ip must"),
        (Ping(A, 1, 0, (gossip(ping_sent=2**63),)), ValueError, "ping_sent must"),
        (Fail(A, "zz" * 20), ValueError, "node_id must"),
        (Data(A, "", 1), ValueError, "kind must"),
        (Data(A, "k" * 33, 1), ValueError, "kind must"),
        (Data(A, "k", {1: 2}), TypeError, "Data.body map keys must"),
        (Data(A, "k", [{"a": {(1,): 2}}]), TypeError, "Data.body map keys must"),
        (DataBatch(A, []), ValueError, "DataBatch.items must"),
        (DataBatch(A, [("k", i) for i in range(MAX_BATCH + 1)]), ValueError, "DataBatch.items must"),
        (DataBatch(A, [("", 1)]), ValueError, "kind must"),
        (DataBatch(A, [("k", {1: 2})]), TypeError, "Data.body map keys must"),
        (DataBatch(B[:39], [("k", 1)]), ValueError, "sender must"),
        (AuthHello(b"short"), ValueError, "nonce must"),
        (AuthChallenge(NONCE_R, b"x" * 31), ValueError, "proof must"),
        (AuthProof(b"x" * 33), ValueError, "proof must"),
    ],
)
def test_encode_rejects_invalid(msg, error, reason):
    with pytest.raises(error, match=f"^{re.escape(reason)} "):
        encode_message(msg)


def test_encode_rejects_non_messages():
    with pytest.raises(TypeError, match="not a bus message"):
        encode_message(gossip())
    with pytest.raises(TypeError, match="cannot encode Data"):
        encode_message(Data(A, "k", {1, 2}))


# ---------------------------------------------------------------------------
# Decoder: strict validation, BusProtocolError only
# ---------------------------------------------------------------------------

# A Data message up to (excluding) its body: [1, DATA, A, "k", <body>]
DATA_PREFIX = b"\x95\x01\x10\xd9\x28" + A.encode() + b"\xa1k"
assert decode_message(DATA_PREFIX + b"\xc0") == Data(A, "k", None)

BAD_BODIES = {
    "empty": (b"", "bad msgpack: ValueError"),
    "not msgpack": (b"\xc1", "bad msgpack: FormatError"),
    "not an array": (raw(1, 2)[1:], "bad msgpack: ExtraData"),
    "map": (msgpack.packb({"v": 1}), "message is not an array"),
    "short array": (raw(PROTOCOL_VERSION), "message is not an array"),
    "extra data": (encode_message(Fail(A, B)) + b"\x00", "bad msgpack: ExtraData"),
    "wrong version": (raw(2, MsgType.FAIL, A, B), "unsupported version"),
    "version zero": (raw(0, MsgType.FAIL, A, B), "unsupported version"),
    "bool version": (raw(True, MsgType.FAIL, A, B), "unsupported version"),
    "str version": (raw("1", MsgType.FAIL, A, B), "unsupported version"),
    "unknown type": (raw(PROTOCOL_VERSION, 99, A, B), "unknown message type"),
    "bool type": (raw(PROTOCOL_VERSION, False, A, 7711, 0, []), "bad message type"),
    "negative type": (raw(PROTOCOL_VERSION, -1, A, B), "unknown message type"),
    "fail too few": (raw(PROTOCOL_VERSION, MsgType.FAIL, A), "bad field count"),
    "fail too many": (raw(PROTOCOL_VERSION, MsgType.FAIL, A, B, C), "bad field count"),
    "ping too few": (raw(PROTOCOL_VERSION, MsgType.PING, A, 7711, 0), "bad field count"),
    "ping too many": (raw(PROTOCOL_VERSION, MsgType.PING, A, 7711, 0, [], 1), "bad field count"),
    "short node id": (raw(PROTOCOL_VERSION, MsgType.FAIL, A[:39], B), "bad node id"),
    "long node id": (raw(PROTOCOL_VERSION, MsgType.FAIL, A + "0", B), "bad node id"),
    "uppercase node id": (raw(PROTOCOL_VERSION, MsgType.FAIL, A, B.upper()), "bad node id"),
    "non hex node id": (raw(PROTOCOL_VERSION, MsgType.FAIL, "g" * 40, B), "bad node id"),
    "node id with newline": (raw(PROTOCOL_VERSION, MsgType.FAIL, A[:39] + "\n", B), "bad node id"),
    "bytes node id": (raw(PROTOCOL_VERSION, MsgType.FAIL, A.encode(), B), "bad node id"),
    "bool port": (raw(PROTOCOL_VERSION, MsgType.PING, A, True, 0, []), "bad port or flags"),
    "float port": (raw(PROTOCOL_VERSION, MsgType.PING, A, 7711.0, 0, []), "bad port or flags"),
    "port too big": (raw(PROTOCOL_VERSION, MsgType.PONG, A, 65536, 0, []), "bad port or flags"),
    "negative port": (raw(PROTOCOL_VERSION, MsgType.PONG, A, -1, 0, []), "bad port or flags"),
    "flags too big": (raw(PROTOCOL_VERSION, MsgType.MEET, A, 1, 1 << 16, []), "bad port or flags"),
    "bool flags": (raw(PROTOCOL_VERSION, MsgType.MEET, A, 1, False, []), "bad port or flags"),
    "gossip not a list": (raw(PROTOCOL_VERSION, MsgType.PING, A, 1, 0, {}), "gossip is not an array"),
    "gossip none": (raw(PROTOCOL_VERSION, MsgType.PING, A, 1, 0, None), "gossip is not an array"),
    "too much gossip": (raw(PROTOCOL_VERSION, MsgType.PING, A, 1, 0, [g_raw()] * (MAX_GOSSIP + 1)), "too many gossip entries"),
    "gossip entry short": (raw(PROTOCOL_VERSION, MsgType.PING, A, 1, 0, [g_raw()[:5]]), "bad gossip entry"),
    "gossip entry long": (raw(PROTOCOL_VERSION, MsgType.PING, A, 1, 0, [g_raw() + [0]]), "bad gossip entry"),
    "gossip entry map": (raw(PROTOCOL_VERSION, MsgType.PING, A, 1, 0, [{"a": 1}]), "bad gossip entry"),
    "gossip bad id": (raw(PROTOCOL_VERSION, MsgType.PING, A, 1, 0, [g_raw(node_id="A" * 40)]), "bad node id"),
    "gossip long ip": (raw(PROTOCOL_VERSION, MsgType.PING, A, 1, 0, [g_raw(ip="1" * 47)]), "bad gossip ip"),
    "gossip bytes ip": (raw(PROTOCOL_VERSION, MsgType.PING, A, 1, 0, [g_raw(ip=b"1.2.3.4")]), "bad gossip ip"),
    "gossip bool port": (raw(PROTOCOL_VERSION, MsgType.PING, A, 1, 0, [g_raw(port=True)]), "bad port or flags"),
    "gossip negative time": (raw(PROTOCOL_VERSION, MsgType.PING, A, 1, 0, [g_raw(ping_sent=-1)]), "bad gossip ping time"),
    "gossip huge time": (raw(PROTOCOL_VERSION, MsgType.PING, A, 1, 0, [g_raw(pong_received=2**63)]), "bad gossip pong time"),
    "gossip bool time": (raw(PROTOCOL_VERSION, MsgType.PING, A, 1, 0, [g_raw(pong_received=True)]), "bad gossip pong time"),
    "gossip float time": (raw(PROTOCOL_VERSION, MsgType.PING, A, 1, 0, [g_raw(ping_sent=1.5)]), "bad gossip ping time"),
    "data empty kind": (raw(PROTOCOL_VERSION, MsgType.DATA, A, "", 1), "bad data kind"),
    "data long kind": (raw(PROTOCOL_VERSION, MsgType.DATA, A, "k" * 33, 1), "bad data kind"),
    "data bytes kind": (raw(PROTOCOL_VERSION, MsgType.DATA, A, b"k", 1), "bad data kind"),
    "data no body": (raw(PROTOCOL_VERSION, MsgType.DATA, A, "k"), "bad field count"),
    "data int map key": (raw(PROTOCOL_VERSION, MsgType.DATA, A, "k", {1: 2}), "bad msgpack: ValueError"),
    "data ext": (raw(PROTOCOL_VERSION, MsgType.DATA, A, "k", msgpack.ExtType(5, b"abc")), "bad msgpack: ValueError"),
    "data empty ext": (DATA_PREFIX + b"\xc7\x00\x05", "msgpack ext types are not allowed"),
    "data timestamp": (raw(PROTOCOL_VERSION, MsgType.DATA, A, "k", msgpack.Timestamp(1, 0)), "bad msgpack: ValueError"),
    "bad utf8": (DATA_PREFIX + b"\xa2\xff\xfe", "bad msgpack: UnicodeDecodeError"),
    "too deep": (DATA_PREFIX + b"\x91" * 5000 + b"\xc0", "bad msgpack: StackError"),
    "hello short nonce": (raw(PROTOCOL_VERSION, MsgType.AUTH_HELLO, b"x" * 15), "bad nonce"),
    "hello long nonce": (raw(PROTOCOL_VERSION, MsgType.AUTH_HELLO, b"x" * 17), "bad nonce"),
    "hello str nonce": (raw(PROTOCOL_VERSION, MsgType.AUTH_HELLO, "x" * 16), "bad nonce"),
    "hello extra": (raw(PROTOCOL_VERSION, MsgType.AUTH_HELLO, NONCE_I, NONCE_I), "bad field count"),
    "challenge short proof": (raw(PROTOCOL_VERSION, MsgType.AUTH_CHALLENGE, NONCE_R, b"p" * 31), "bad proof"),
    "challenge no proof": (raw(PROTOCOL_VERSION, MsgType.AUTH_CHALLENGE, NONCE_R), "bad field count"),
    "proof long": (raw(PROTOCOL_VERSION, MsgType.AUTH_PROOF, b"p" * 33), "bad proof"),
    "proof none": (raw(PROTOCOL_VERSION, MsgType.AUTH_PROOF, None), "bad proof"),
    "huge array header": (b"\xdd\xff\xff\xff\xff", "bad msgpack: ValueError"),
    "huge str header": (b"\x93\x01\x10\xdb\xff\xff\xff\xff", "bad msgpack: ValueError"),
}


@pytest.mark.parametrize(("body", "reason"), list(BAD_BODIES.values()), ids=list(BAD_BODIES))
def test_decode_rejects(body, reason):
    with pytest.raises(BusProtocolError, match=f"^{re.escape(reason)}$"):
        decode_message(body)


def test_wrong_version_reason():
    with pytest.raises(BusProtocolError, match="unsupported version"):
        decode_message(raw(PROTOCOL_VERSION + 1, MsgType.FAIL, A, B))


def test_decode_rejects_non_bytes():
    with pytest.raises(BusProtocolError, match="body is not bytes"):
        decode_message(None)  # type: ignore[arg-type]
    with pytest.raises(BusProtocolError, match="bad msgpack"):
        decode_message("not bytes")  # type: ignore[arg-type]


def test_decode_size_limit():
    body = encode_message(Data(A, "k", b"x" * 1000))
    assert decode_message(body, max_size=len(body)).body == b"x" * 1000
    with pytest.raises(BusProtocolError, match="message too large"):
        decode_message(body, max_size=len(body) - 1)


SMALL = ROUND_TRIP[:3] + ROUND_TRIP[4:6] + ROUND_TRIP[-3:]  # without the 1024-gossip Meet


@pytest.mark.parametrize("msg", SMALL, ids=lambda m: type(m).__name__)
def test_every_truncation_rejected(msg):
    body = encode_message(msg)
    for i in range(len(body)):
        with pytest.raises(BusProtocolError, match="bad msgpack"):
            decode_message(body[:i])


@FAST
@given(st.binary(max_size=512))
def test_fuzz_decode_random_bytes(data):
    try:
        decode_message(data)
    except BusProtocolError:
        pass


_leaf = st.none() | st.booleans() | st.integers(-(2**70), 2**70) | st.floats() | st.text(max_size=20)
_leaf = _leaf | st.binary(max_size=20)
_any = st.recursive(
    _leaf,
    lambda kids: st.lists(kids, max_size=4) | st.dictionaries(st.text(max_size=5) | st.integers(), kids, max_size=4),
    max_leaves=12,
)


@FAST
@given(st.lists(_any, max_size=7), st.sampled_from([PROTOCOL_VERSION, PROTOCOL_VERSION + 1]))
def test_fuzz_decode_structured_garbage(fields, version):
    """Msgpack-valid but arbitrarily typed arrays, with real type codes."""
    for t in MsgType:
        try:
            body = raw(version, int(t), *fields)
        except (OverflowError, ValueError, TypeError):
            return
        try:
            decode_message(body)
        except BusProtocolError:
            pass


@FAST
@given(st.sampled_from(SMALL), st.data())
def test_fuzz_decode_mutated(msg, data):
    body = bytearray(encode_message(msg))
    for _ in range(data.draw(st.integers(1, 4))):
        i = data.draw(st.integers(0, len(body) - 1))
        body[i] = data.draw(st.integers(0, 255))
    try:
        decode_message(bytes(body))
    except BusProtocolError:
        pass


# ---------------------------------------------------------------------------
# Framing
# ---------------------------------------------------------------------------


def test_frame_helper():
    assert frame(b"abc") == b"\x00\x00\x00\x03abc"
    with pytest.raises(ValueError, match=r"frame payload must be 1\.\."):
        frame(b"")


def test_frames_split_at_every_boundary():
    payloads = [encode_message(m) for m in ROUND_TRIP[:3] + ROUND_TRIP[4:]] + [b"x"]
    stream = b"".join(frame(p) for p in payloads)
    for cut in range(len(stream) + 1):
        dec = FrameDecoder()
        got = dec.feed(stream[:cut]) + dec.feed(stream[cut:])
        assert got == payloads
        assert dec.buffered == 0


def test_frames_byte_by_byte_and_all_at_once():
    payloads = [bytes([i]) * (i + 1) for i in range(50)]
    stream = b"".join(frame(p) for p in payloads)
    dec = FrameDecoder()
    got = []
    for i in range(len(stream)):
        got += dec.feed(stream[i : i + 1])
    assert got == payloads
    assert FrameDecoder().feed(stream) == payloads
    assert FrameDecoder().feed(bytearray(stream)) == payloads
    assert FrameDecoder().feed(memoryview(stream)) == payloads


def test_partial_frame_is_kept():
    dec = FrameDecoder()
    assert dec.feed(frame(b"hello") + b"\x00\x00") == [b"hello"]
    assert dec.buffered == 2
    assert dec.feed(b"\x00\x02h") == []
    assert dec.feed(b"i") == [b"hi"]


def test_oversize_header_rejected_before_body():
    dec = FrameDecoder(max_frame=100)
    assert dec.feed(frame(b"a" * 100)) == [b"a" * 100]
    assert dec.feed(b"\x00\x00") == []
    with pytest.raises(BusProtocolError, match="too large"):
        dec.feed(b"\x00\x65")  # 101: no body sent at all
    with pytest.raises(BusProtocolError, match="frame too large"):
        dec.feed(b"")  # stays failed
    with pytest.raises(BusProtocolError, match="frame too large"):
        dec.feed(frame(b"ok"))


def test_default_limit_and_huge_header():
    dec = FrameDecoder()
    with pytest.raises(BusProtocolError, match="frame too large"):
        dec.feed(struct.pack(">I", MAX_FRAME_DEFAULT + 1))
    with pytest.raises(BusProtocolError, match="frame too large"):
        FrameDecoder().feed(b"\xff\xff\xff\xff")


def test_zero_length_frame_rejected():
    dec = FrameDecoder()
    with pytest.raises(BusProtocolError, match="zero"):
        dec.feed(frame(b"ok") + b"\x00\x00\x00\x00" + frame(b"later"))
    with pytest.raises(BusProtocolError, match="zero-length frame"):
        dec.feed(frame(b"ok"))


def test_bad_max_frame():
    with pytest.raises(ValueError, match="max_frame must be"):
        FrameDecoder(0)


@FAST
@given(st.lists(st.binary(max_size=64), max_size=20))
def test_fuzz_frame_decoder(chunks):
    dec = FrameDecoder(max_frame=1024)
    try:
        for c in chunks:
            for p in dec.feed(c):
                assert 0 < len(p) <= 1024
    except BusProtocolError:
        with pytest.raises(BusProtocolError, match="frame too large|zero-length frame"):
            dec.feed(b"")


@FAST
@given(st.lists(st.binary(min_size=1, max_size=300), min_size=1, max_size=10), st.data())
def test_fuzz_frame_reassembly(payloads, data):
    stream = b"".join(frame(p) for p in payloads)
    cuts = sorted(data.draw(st.lists(st.integers(0, len(stream)), max_size=10)))
    dec = FrameDecoder()
    got = []
    prev = 0
    for c in cuts + [len(stream)]:
        got += dec.feed(stream[prev:c])
        prev = c
    assert got == payloads


# ---------------------------------------------------------------------------
# Handshake
# ---------------------------------------------------------------------------


def handshake(secret_i=SECRET, secret_r=SECRET, nonce_i=NONCE_I, nonce_r=NONCE_R):
    ini = InitiatorHandshake(secret_i, nonce_i)
    res = ResponderHandshake(secret_r, nonce_r)
    to_r, to_i = FrameDecoder(), FrameDecoder()
    [hello] = to_r.feed(ini.start())
    [challenge] = to_i.feed(res.receive(hello))
    [proof] = to_r.feed(ini.receive(challenge))
    assert res.receive(proof) is None
    return ini, res


def test_handshake_messages_are_plain_frames():
    ini = InitiatorHandshake(SECRET, NONCE_I)
    res = ResponderHandshake(SECRET, NONCE_R)
    hello = ini.start()
    assert decode_message(hello[4:]) == AuthHello(NONCE_I)
    challenge = res.receive(hello[4:])
    msg = decode_message(challenge[4:])
    assert isinstance(msg, AuthChallenge) and msg.nonce == NONCE_R
    import hmac as std_hmac

    expected = std_hmac.new(SECRET, b"disque-py bus v1 responder" + NONCE_I + NONCE_R, hashlib.sha256).digest()
    assert msg.proof == expected
    proof = decode_message(ini.receive(challenge[4:])[4:])
    assert proof.proof == std_hmac.new(SECRET, b"disque-py bus v1 initiator" + NONCE_I + NONCE_R, hashlib.sha256).digest()


def test_sessions_interoperate():
    ini, res = handshake()
    a, b = ini.session, res.session
    assert ini.done and res.done
    to_r, to_i = FrameDecoder(), FrameDecoder()
    for i in range(200):
        body = encode_message(Data(A, "k", i))
        sealed = a.seal(body)
        assert len(sealed) == 4 + SEAL_OVERHEAD + len(body)
        [p] = to_r.feed(sealed)
        assert decode_message(b.open(p)) == Data(A, "k", i)
        [p] = to_i.feed(b.seal(body + b"!"))
        assert b.recv_seq == i + 1
        assert a.open(p) == body + b"!"
    # many frames in one chunk
    stream = b"".join(a.seal(bytes([i])) for i in range(100))
    assert [b.open(p) for p in to_r.feed(stream)] == [bytes([i]) for i in range(100)]


def test_sealed_frame_layout():
    ini, res = handshake()
    sealed = ini.session.seal(b"body")
    assert sealed[:4] == struct.pack(">I", 8 + 4 + 32)
    assert sealed[4:12] == b"\x00" * 8
    assert sealed[12:16] == b"body"
    assert ini.session.seal(b"body")[4:12] == struct.pack(">Q", 1)


def test_different_nonces_give_different_keys():
    a1, _ = handshake()
    a2, _ = handshake(nonce_r=bytes(16))
    assert a1.session.seal(b"x") != a2.session.seal(b"x")


def test_wrong_secret_on_responder_fails_at_initiator():
    ini = InitiatorHandshake(SECRET, NONCE_I)
    res = ResponderHandshake(b"other secret", NONCE_R)
    challenge = res.receive(ini.start()[4:])
    with pytest.raises(AuthError, match="bad responder proof"):
        ini.receive(challenge[4:])
    with pytest.raises(AuthError, match="handshake not complete"):
        ini.session
    assert not ini.done


def test_wrong_secret_on_initiator_fails_at_initiator_first():
    # The initiator checks the responder's proof first, so it notices.
    ini = InitiatorHandshake(b"other secret", NONCE_I)
    res = ResponderHandshake(SECRET, NONCE_R)
    challenge = res.receive(ini.start()[4:])
    with pytest.raises(AuthError, match="bad responder proof"):
        ini.receive(challenge[4:])


def test_forged_proof_fails_at_responder():
    # An initiator without the secret that skips verification and sends garbage.
    res = ResponderHandshake(SECRET, NONCE_R)
    res.receive(encode_message(AuthHello(NONCE_I)))
    with pytest.raises(AuthError, match="bad initiator proof"):
        res.receive(encode_message(AuthProof(b"\x00" * 32)))
    with pytest.raises(AuthError, match="handshake not complete"):
        res.session
    with pytest.raises(AuthError, match="unexpected message in state failed"):  # stays failed
        res.receive(encode_message(AuthProof(b"\x00" * 32)))


def test_proof_under_other_secret_fails_at_responder():
    evil = InitiatorHandshake(b"other secret", NONCE_I)
    res = ResponderHandshake(SECRET, NONCE_R)
    res.receive(evil.start()[4:])
    # the attacker computes its proof with its own secret
    import hmac as std_hmac

    forged = std_hmac.new(b"other secret", b"disque-py bus v1 initiator" + NONCE_I + NONCE_R, hashlib.sha256).digest()
    with pytest.raises(AuthError, match="bad initiator proof"):
        res.receive(encode_message(AuthProof(forged)))


def test_reflected_responder_proof_rejected():
    # Sending the responder's own proof back must not work (role labels differ).
    res = ResponderHandshake(SECRET, NONCE_R)
    challenge = decode_message(res.receive(encode_message(AuthHello(NONCE_I)))[4:])
    with pytest.raises(AuthError, match="bad initiator proof"):
        res.receive(encode_message(AuthProof(challenge.proof)))


def test_responder_rejects_proof_before_challenge():
    res = ResponderHandshake(SECRET, NONCE_R)
    with pytest.raises(AuthError, match="expected AuthHello"):
        res.receive(encode_message(AuthProof(b"\x00" * 32)))


@pytest.mark.parametrize(
    "msg",
    [Ping(A, 1, 0), Data(A, "k", 1), AuthChallenge(NONCE_R, b"\x00" * 32), AuthProof(b"\x00" * 32)],
    ids=lambda m: type(m).__name__,
)
def test_responder_wants_hello_first(msg):
    with pytest.raises(AuthError, match="expected AuthHello"):
        ResponderHandshake(SECRET, NONCE_R).receive(encode_message(msg))


@pytest.mark.parametrize(
    "msg",
    [Ping(A, 1, 0), AuthHello(NONCE_I), AuthChallenge(NONCE_R, b"\x00" * 32)],
    ids=lambda m: type(m).__name__,
)
def test_responder_wants_proof_second(msg):
    res = ResponderHandshake(SECRET, NONCE_R)
    res.receive(encode_message(AuthHello(NONCE_I)))
    with pytest.raises(AuthError, match="expected AuthProof"):
        res.receive(encode_message(msg))


@pytest.mark.parametrize(
    "msg",
    [Ping(A, 1, 0), AuthHello(NONCE_R), AuthProof(b"\x00" * 32)],
    ids=lambda m: type(m).__name__,
)
def test_initiator_wants_challenge(msg):
    ini = InitiatorHandshake(SECRET, NONCE_I)
    ini.start()
    with pytest.raises(AuthError, match="expected AuthChallenge"):
        ini.receive(encode_message(msg))


def test_initiator_wrong_states():
    ini = InitiatorHandshake(SECRET, NONCE_I)
    res = ResponderHandshake(SECRET, NONCE_R)
    challenge = res.receive(encode_message(AuthHello(NONCE_I)))[4:]
    with pytest.raises(AuthError, match="unexpected message in state start"):  # receive before start
        ini.receive(challenge)
    ini2 = InitiatorHandshake(SECRET, NONCE_I)
    ini2.start()
    with pytest.raises(AuthError, match="handshake already started"):  # start twice
        ini2.start()
    ini3, _ = handshake()
    with pytest.raises(AuthError, match="unexpected message in state done"):  # receive after completion
        ini3.receive(challenge)


def test_responder_after_completion():
    _, res = handshake()
    with pytest.raises(AuthError, match="unexpected message in state done"):
        res.receive(encode_message(AuthHello(NONCE_I)))


def test_nonce_reuse_rejected():
    res = ResponderHandshake(SECRET, NONCE_I)
    with pytest.raises(AuthError, match="nonce"):
        res.receive(encode_message(AuthHello(NONCE_I)))
    ini = InitiatorHandshake(SECRET, NONCE_I)
    ini.start()
    with pytest.raises(AuthError, match="nonce"):
        ini.receive(encode_message(AuthChallenge(NONCE_I, b"\x00" * 32)))


def test_malformed_handshake_payload_is_auth_error():
    res = ResponderHandshake(SECRET, NONCE_R)
    with pytest.raises(AuthError, match="malformed auth message"):
        res.receive(b"\xc1garbage")
    ini = InitiatorHandshake(SECRET, NONCE_I)
    ini.start()
    with pytest.raises(AuthError, match="malformed auth message"):
        ini.receive(b"")


def test_handshake_argument_checks():
    with pytest.raises(ValueError, match="secret must be"):
        InitiatorHandshake(b"", NONCE_I)
    with pytest.raises(ValueError, match="nonce must be 16 bytes"):
        ResponderHandshake(SECRET, b"short")
    with pytest.raises(ValueError, match="secret must be"):
        InitiatorHandshake("str secret", NONCE_I)  # type: ignore[arg-type]


# ---------------------------------------------------------------------------
# Sealed link
# ---------------------------------------------------------------------------


def sessions():
    ini, res = handshake()
    return ini.session, res.session


def payload(sealed: bytes) -> bytes:
    [p] = FrameDecoder().feed(sealed)
    return p


def test_replayed_frame_rejected():
    a, b = sessions()
    p = payload(a.seal(b"one"))
    assert b.open(p) == b"one"
    with pytest.raises(AuthError, match="replayed or out of order"):
        b.open(p)


def test_reordered_frames_rejected():
    a, b = sessions()
    p0, p1 = payload(a.seal(b"0")), payload(a.seal(b"1"))
    with pytest.raises(AuthError, match="out of order"):
        b.open(p1)
    with pytest.raises(AuthError, match="replayed or out of order"):  # the receive side stays failed
        b.open(p0)


def test_dropped_frame_detected():
    a, b = sessions()
    b.open(payload(a.seal(b"0")))
    a.seal(b"lost")
    with pytest.raises(AuthError, match="replayed or out of order"):
        b.open(payload(a.seal(b"2")))


@pytest.mark.parametrize("where", ["seq", "body", "mac"])
def test_flipped_bit_rejected(where):
    a, b = sessions()
    p = bytearray(payload(a.seal(b"some body bytes")))
    idx = {"seq": 7, "body": 10, "mac": len(p) - 1}[where]
    for bit in range(8):
        a2, b2 = sessions()
        q = bytearray(payload(a2.seal(b"some body bytes")))
        q[idx] ^= 1 << bit
        with pytest.raises(AuthError, match="bad MAC"):
            b2.open(bytes(q))
    assert b.open(bytes(p)) == b"some body bytes"


def test_truncated_frames_rejected():
    p = payload(sessions()[0].seal(b"body"))
    for n in range(len(p)):
        _, b = sessions()
        with pytest.raises(AuthError, match="truncated frame" if n < SEAL_OVERHEAD else "bad MAC"):
            b.open(p[:n])


def test_extended_frame_rejected():
    a, b = sessions()
    with pytest.raises(AuthError, match="bad MAC"):
        b.open(payload(a.seal(b"body")) + b"\x00")


def test_direction_confusion_rejected():
    a, b = sessions()
    # A frame a sealed for a->b can't be opened by a (b->a direction) ...
    with pytest.raises(AuthError, match="bad MAC"):
        a.open(payload(a.seal(b"x")))
    # ... nor a frame b sealed by b itself.
    with pytest.raises(AuthError, match="bad MAC"):
        b.open(payload(b.seal(b"x")))


def test_frame_from_other_link_rejected():
    a1, _ = sessions()
    ini, res = handshake(nonce_i=bytes(16), nonce_r=b"\x01" * 16)
    with pytest.raises(AuthError, match="bad MAC"):
        res.session.open(payload(a1.seal(b"x")))


def test_empty_body_sealable():
    a, b = sessions()
    sealed = a.seal(b"")
    assert len(sealed) == 4 + MAC_SIZE + 8
    assert b.open(payload(sealed)) == b""


def test_link_session_key_check():
    with pytest.raises(ValueError, match="link keys must be 32 bytes"):
        LinkSession(b"short", b"x" * 32)


@FAST
@given(st.binary(max_size=120))
def test_fuzz_open_random(data):
    _, b = sessions()
    with pytest.raises(AuthError, match="truncated frame|bad MAC|replayed or out of order"):
        b.open(data)


# ---------------------------------------------------------------------------
# Property: every valid message round-trips
# ---------------------------------------------------------------------------

_node_ids = st.text(alphabet="0123456789abcdef", min_size=40, max_size=40)
_u16 = st.integers(0, 65535)
_time = st.integers(0, 2**63 - 1)
_gossip = st.builds(Gossip, _node_ids, st.text(max_size=46), _u16, _u16, _time, _time)
_gossips = st.lists(_gossip, max_size=8).map(tuple)
_body = st.recursive(
    st.none() | st.booleans() | st.integers(-(2**63), 2**64 - 1) | st.floats(allow_nan=False) | st.text() | st.binary(),
    lambda kids: st.lists(kids, max_size=4) | st.dictionaries(st.text(max_size=5) | st.binary(max_size=5), kids, max_size=4),
    max_leaves=12,
)
_messages = st.one_of(
    st.builds(Ping, _node_ids, _u16, _u16, _gossips),
    st.builds(Pong, _node_ids, _u16, _u16, _gossips),
    st.builds(Meet, _node_ids, _u16, _u16, _gossips),
    st.builds(Fail, _node_ids, _node_ids),
    st.builds(Data, _node_ids, st.text(min_size=1, max_size=32), _body),
    st.builds(AuthHello, st.binary(min_size=16, max_size=16)),
    st.builds(AuthChallenge, st.binary(min_size=16, max_size=16), st.binary(min_size=32, max_size=32)),
    st.builds(AuthProof, st.binary(min_size=32, max_size=32)),
)


@FAST
@given(_messages)
def test_fuzz_round_trip(msg):
    assert decode_message(encode_message(msg)) == msg


# ---------------------------------------------------------------------------
# DataBatch built from pre-encoded items (the bus's fast path)
# ---------------------------------------------------------------------------


@pytest.mark.parametrize("n", [1, 15, 16, 300, MAX_BATCH])
def test_data_batch_body_decodes_as_a_batch(n):
    items = [("GOTJOB", [b"D-%d" % i, {"n": i}]) for i in range(n)]
    body = data_batch_body(A, [encode_data_item(k, v) for k, v in items])
    msg = decode_message(body)
    assert msg == DataBatch(A, [[k, v] for k, v in items])
    assert body == encode_message(DataBatch(A, items))


def test_encode_data_item_checks_like_data():
    for kind, value, error, reason in [
        ("", 1, ValueError, "kind must be"),
        ("k" * 33, 1, ValueError, "kind must be"),
        ("k", {1: 2}, TypeError, "map keys must be str or bytes"),
        ("k", {1, 2}, TypeError, "cannot encode Data.body"),
        ("k", 2**70, TypeError, "cannot encode Data.body"),
    ]:
        with pytest.raises(error, match=reason):
            encode_data_item(kind, value)
    with pytest.raises(ValueError, match=r"holds 1\.\.4096 items"):
        data_batch_body(A, [])
    with pytest.raises(ValueError, match="sender must be"):
        data_batch_body("nope", [encode_data_item("k", 1)])


@pytest.mark.parametrize(
    ("fields", "reason"),
    [
        ([1, 17, A], "bad field count"),  # no items
        ([1, 17, A, []], "bad data batch"),  # empty batch
        ([1, 17, A, "k"], "bad data batch"),  # items not an array
        ([1, 17, A, [["k"]]], "bad data batch entry"),  # entry without a body
        ([1, 17, A, [["k", 1, 2]]], "bad data batch entry"),  # entry with too much
        ([1, 17, A, [[1, 1]]], "bad data kind"),  # kind not a str
        ([1, 17, A, [["", 1]]], "bad data kind"),  # empty kind
        ([1, 17, A, [["k" * 33, 1]]], "bad data kind"),  # kind too long
        ([1, 17, A, ["k"]], "bad data batch entry"),  # entry not an array
        ([1, 17, "x" * 40, [["k", 1]]], "bad node id"),  # bad sender
        ([1, 17, A, [["k", i] for i in range(MAX_BATCH + 1)]], "bad data batch"),  # too many
    ],
)
def test_decode_rejects_bad_batches(fields, reason):
    with pytest.raises(BusProtocolError, match=f"^{reason}$"):
        decode_message(raw(*fields))


# --------------------------------------------------------------------------- clients on the bus port


@pytest.mark.parametrize(
    "head, protocol",
    [
        (b"*1\r\n$4\r\nPING\r\n", "RESP"),
        (b"PING\r\n", "RESP"),
        (b"info\r\n", "RESP"),
        (b"GET / HTTP/1.1\r\nHost: x\r\n\r\n", "HTTP"),
        (b"\x16\x03\x01\x02\x00\x01\x00\x01\xfc\x03\x03", "TLS"),
        (b"\xff\xff\xff\xff", None),
        (b"GETAWAY", None),
    ],
)
def test_a_clients_first_bytes_are_recognised(head, protocol):
    assert foreign_protocol(head) == protocol
    d = FrameDecoder()
    with pytest.raises(BusProtocolError, match="frame too large") as caught:
        d.feed(head)
    assert caught.value.foreign == protocol
    with pytest.raises(BusProtocolError, match="frame too large") as again:  # failed for good, the same way
        d.feed(b"more")
    assert again.value.foreign == protocol


def test_bad_bytes_after_a_good_frame_are_not_called_a_client():
    d = FrameDecoder()
    assert d.feed(frame(b"ok")) == [b"ok"]
    with pytest.raises(BusProtocolError, match="frame too large") as caught:
        d.feed(b"*1\r\n$4\r\nPING\r\n")
    assert caught.value.foreign is None
    # the length the bytes declared, and the limit
    assert caught.value.reason == "frame too large: %d bytes declared, at most %d" % (
        int.from_bytes(b"*1\r\n", "big"), MAX_FRAME_DEFAULT)
