"""Fuzz target: the cluster bus codec and its authenticated handshake (``cluster_bus``).

The input's first byte picks a mode (its value modulo 4); the rest is what a peer sends
on a link, a byte stream of length-prefixed frames:

``MODE_PLAIN``      no cluster secret: each frame is a message body, decoded;
``MODE_RESPONDER``  with a secret, we accepted the link: the frames go to
                    ``ResponderHandshake`` (and, should it complete, a session);
``MODE_INITIATOR``  with a secret, we connected: ``InitiatorHandshake`` sent its hello
                    and gets the frames;
``MODE_SESSION``    with a secret, after a real handshake: each frame's payload is sealed
                    by the peer's session (so it passes the MAC) and opened by ours, then
                    decoded; the raw payloads are also opened by a second session, as
                    forged frames, which must fail.

What must hold: the frame decoder, the handshakes, sessions and ``decode_message`` raise
nothing but ``BusProtocolError`` (or its ``AuthError``) and stay failed after one; frames
come out the same however the stream is cut; every message decoded re-encodes and
decodes to itself (Auth* and Data aside, see below); and what a decoded message does to
the node's sans-I/O machines raises nothing: PING/PONG/MEET/FAIL go to a ``Membership``,
DATA (and each DATA_BATCH item) to a core ``Node`` whose invariants must hold after.
"""

from __future__ import annotations

import random

from cluster_bus.codec import (
    AuthError,
    BusProtocolError,
    FrameDecoder,
    InitiatorHandshake,
    LinkSession,
    ResponderHandshake,
    decode_message,
    encode_message,
)
from cluster_bus.membership import Membership
from cluster_bus.messages import AuthChallenge, AuthHello, AuthProof, Data, DataBatch
from disque_py.core import invariants
from disque_py.core.node import Node

from .fuzz_resp import cuts_for, slices

MODE_PLAIN, MODE_RESPONDER, MODE_INITIATOR, MODE_SESSION = range(4)
SECRET = b"fuzz cluster secret"
MY_ID = "a" * 40
PEER_ID = "f" * 40
NONCE_I = b"I" * 16
NONCE_R = b"R" * 16
MAX_FRAME = 1 << 16  # smaller than the default, so that the limit is reached too
T0 = 1_000_000_000
_AUTH = (AuthHello, AuthChallenge, AuthProof)


def frames_of(stream: bytes, seed: int | None = None) -> tuple[list[bytes], BusProtocolError | None]:
    """The payloads of ``stream`` fed in slices (and the error that ended it), checked
    against the stream fed at once."""
    results = []
    for chunks in ([stream], slices(stream, cuts_for(stream, seed))):
        decoder = FrameDecoder(MAX_FRAME)
        payloads: list[bytes] = []
        error = None
        for chunk in chunks:
            try:
                payloads += decoder.feed(chunk)
            except BusProtocolError as exc:
                error = exc
                break
        if error is not None:
            try:
                decoder.feed(b"\0\0\0\1x")
            except BusProtocolError:
                pass
            else:
                raise AssertionError("a failed frame decoder took more bytes")
        results.append((payloads, None if error is None else error.reason))
    (whole, whole_error), (cut, cut_error) = results
    # The same frames and the same error; but the frames completed by the read that ends in
    # an error are not returned (the link closes: they are not delivered), so on an error
    # the frames of the stream at once are a prefix of those of the slices.
    assert whole_error == cut_error, results
    assert whole == cut if whole_error is None else whole == cut[: len(whole)], results
    return cut, None if cut_error is None else BusProtocolError(cut_error)


class Machines:
    """What a node does with the messages a link delivers (the sans-I/O parts)."""

    def __init__(self) -> None:
        self.now = T0
        self.membership = Membership(MY_ID, "127.0.0.1", 7711, node_timeout=5000, now=T0, rng=random.Random(1))
        self.membership.link_peer(1, "127.0.0.2", "127.0.0.1")
        self.node = Node(MY_ID, seed=b"fuzz-seed", now=T0)
        self.node.ctx.cluster_size = 2
        self.node.ctx.known_nodes = [MY_ID, PEER_ID]
        self.node.ctx.reachable = [PEER_ID]

    def deliver(self, msg) -> None:
        self.now += 10
        if type(msg) is Data:
            self.node.receive_data(msg.sender, msg.kind, msg.body, self.now)
        elif type(msg) is DataBatch:
            for kind, body in msg.items:
                self.node.receive_data(msg.sender, kind, body, self.now)
        else:
            self.membership.receive(1, msg, self.now)
            self.membership.tick(self.now)
            self.membership.take_effects()
        self.node.take_effects()
        invariants.check(self.node)


def decode(payload: bytes, machines: Machines | None) -> None:
    try:
        msg = decode_message(payload, MAX_FRAME)
    except BusProtocolError:
        return
    if type(msg) not in _AUTH:
        if type(msg) not in (Data, DataBatch):
            # Data bodies are any msgpack value; the encoder refuses some the decoder takes
            # (nesting deeper than it lets a sender build), so only the others round-trip.
            assert decode_message(encode_message(msg)) == msg, msg
        if machines is not None:
            machines.deliver(msg)


def _fails_with_auth_error(call, *args) -> None:
    try:
        call(*args)
    except AuthError:
        return
    raise AssertionError("%r accepted a forged input" % call)


def check_bus(data: bytes, seed: int | None = None) -> None:
    if not data:
        return
    mode, stream = data[0] % 4, data[1:]
    payloads, _ = frames_of(stream, seed)
    if mode == MODE_PLAIN:
        machines = Machines()
        for payload in payloads:
            decode(payload, machines)
    elif mode == MODE_RESPONDER:
        hs = ResponderHandshake(SECRET, NONCE_R)
        for payload in payloads:
            try:
                hs.receive(payload)
            except AuthError:
                _fails_with_auth_error(hs.receive, payload)  # it stays failed
                break
            if hs.done:  # only a peer that knows the secret gets here
                raise AssertionError("handshake completed without the secret")
    elif mode == MODE_INITIATOR:
        hs = InitiatorHandshake(SECRET, NONCE_I)
        hs.start()
        for payload in payloads:
            _fails_with_auth_error(hs.receive, payload)
        _fails_with_auth_error(lambda: hs.session)
    else:
        mine, peers = _sessions()
        forged = _sessions()[0]  # the same keys, but it gets the payloads unsealed
        machines = Machines()
        for payload in payloads:
            sealed = peers.seal(payload)
            got, error = frames_of(sealed, seed)
            assert error is None and len(got) == 1, (got, error)
            body = mine.open(got[0])
            assert body == payload
            decode(body, machines)
            _fails_with_auth_error(forged.open, payload)
        if payloads:  # a replayed frame
            _fails_with_auth_error(mine.open, frames_of(peers_replay(payloads[-1]), seed)[0][0])


def _sessions() -> tuple[LinkSession, LinkSession]:
    """Two ends of a link after a real handshake: (the initiator's, the responder's)."""
    ini = InitiatorHandshake(SECRET, NONCE_I)
    res = ResponderHandshake(SECRET, NONCE_R)
    challenge = res.receive(FrameDecoder().feed(ini.start())[0])
    proof = ini.receive(FrameDecoder().feed(challenge)[0])
    assert res.receive(FrameDecoder().feed(proof)[0]) is None
    return ini.session, res.session


def peers_replay(payload: bytes) -> bytes:
    """A frame sealed again from sequence 0: a replay for a receiver past it."""
    return _sessions()[1].seal(payload)


def TestOneInput(data: bytes) -> None:
    check_bus(data)
