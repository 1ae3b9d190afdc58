"""cluster_bus.messages: each message is a frozen value, as the frozen dataclasses it replaced were.

The classes are written by hand (a node's start imports them; the dataclass decorator compiled
six methods per class there), so what the decorator gave is checked here: construction by
position and by name with the same defaults, equality and hash by type and fields, a repr that
names each field, no field changed or added after construction, pickling and copying, and
``match`` by position.
"""

from __future__ import annotations

import copy
import dataclasses
import pickle

import pytest

from cluster_bus.messages import (
    MESSAGE_TYPES,
    AuthChallenge,
    AuthHello,
    AuthProof,
    Data,
    DataBatch,
    Fail,
    Gossip,
    Meet,
    Ping,
    Pong,
)

A = "0123456789abcdef0123456789abcdef01234567"
B = "fedcba9876543210fedcba9876543210fedcba98"
GOSSIP = Gossip(B, "10.0.0.2", 7712, 0, 5, 6)

#: One message of each type, and the fields it was built with (in order).
SAMPLES = [
    (GOSSIP, ("node_id", "ip", "port", "flags", "ping_sent", "pong_received"), (B, "10.0.0.2", 7712, 0, 5, 6)),
    (Ping(A, 7711, 0, (GOSSIP,)), ("sender", "port", "flags", "gossip"), (A, 7711, 0, (GOSSIP,))),
    (Pong(A, 7711, 1), ("sender", "port", "flags", "gossip"), (A, 7711, 1, ())),
    (Meet(A, 7711, 2), ("sender", "port", "flags", "gossip"), (A, 7711, 2, ())),
    (Fail(A, B), ("sender", "node_id"), (A, B)),
    (Data(A, "REPLJOB", [1, b"x"]), ("sender", "kind", "body"), (A, "REPLJOB", [1, b"x"])),
    (DataBatch(A, (("GOTJOB", 1),)), ("sender", "items"), (A, (("GOTJOB", 1),))),
    (AuthHello(b"n" * 16), ("nonce",), (b"n" * 16,)),
    (AuthChallenge(b"n" * 16, b"p" * 32), ("nonce", "proof"), (b"n" * 16, b"p" * 32)),
    (AuthProof(b"p" * 32), ("proof",), (b"p" * 32,)),
]

IDS = [type(m).__name__ for m, _names, _values in SAMPLES]


@pytest.mark.parametrize(("msg", "names", "values"), SAMPLES, ids=IDS)
def test_a_message_holds_its_fields_by_position_and_by_name(msg: object, names: tuple[str, ...],
                                                            values: tuple[object, ...]) -> None:  # fmt: skip
    cls = type(msg)
    assert tuple(getattr(msg, n) for n in names) == values
    assert cls.__match_args__ == names
    by_name = cls(**dict(zip(names, values)))
    assert by_name == msg
    if cls is not Data:  # the Data sample's body is a list: unhashable, as with a dataclass
        assert hash(by_name) == hash(msg)
    assert repr(msg) == "%s(%s)" % (cls.__name__, ", ".join("%s=%r" % (n, v) for n, v in zip(names, values)))
    assert not hasattr(msg, "__dict__")


@pytest.mark.parametrize(("msg", "names", "values"), SAMPLES, ids=IDS)
def test_a_message_is_frozen(msg: object, names: tuple[str, ...], values: tuple[object, ...]) -> None:
    with pytest.raises(dataclasses.FrozenInstanceError, match="cannot assign to field '%s'" % names[0]):
        setattr(msg, names[0], values[0])
    with pytest.raises(dataclasses.FrozenInstanceError, match="cannot delete field '%s'" % names[0]):
        delattr(msg, names[0])
    with pytest.raises(AttributeError, match="'extra'"):  # nor a field it does not have
        msg.extra = 1  # type: ignore[attr-defined]
    assert getattr(msg, names[0]) == values[0]


@pytest.mark.parametrize(("msg", "names", "values"), SAMPLES, ids=IDS)
def test_a_message_survives_pickle_and_copy(msg: object, names: tuple[str, ...], values: tuple[object, ...]) -> None:
    for again in (pickle.loads(pickle.dumps(msg)), copy.copy(msg), copy.deepcopy(msg)):
        assert type(again) is type(msg) and again == msg
        assert tuple(getattr(again, n) for n in names) == values


def test_equality_and_hash_are_by_type_and_fields() -> None:
    assert Ping(A, 7711, 0) == Ping(A, 7711, 0, ()) and hash(Ping(A, 7711, 0)) == hash(Ping(A, 7711, 0, ()))
    assert Ping(A, 7711, 0) != Pong(A, 7711, 0) != Meet(A, 7711, 0)  # same fields, another type
    assert Ping(A, 7711, 0) != Ping(A, 7712, 0)
    assert Ping(A, 7711, 0) != (A, 7711, 0, ())
    assert {Fail(A, B), Fail(A, B), Fail(B, A)} == {Fail(A, B), Fail(B, A)}
    with pytest.raises(TypeError, match="unhashable"):  # a body that is a list, as a dataclass's
        hash(Data(A, "K", [1]))
    with pytest.raises(TypeError, match="missing 1 required positional argument: 'flags'"):
        Ping(A, 7711)  # type: ignore[call-arg]
    with pytest.raises(TypeError, match="unexpected keyword argument 'C'"):
        Fail(A, B, C=1)  # type: ignore[call-arg]


def test_match_by_position_and_every_type_has_a_wire_type() -> None:
    match Meet(A, 7711, 4, (GOSSIP,)):
        case Ping():
            raise AssertionError("a MEET is not a PING")
        case Meet(sender, port, flags, (Gossip(node_id),)):
            assert (sender, port, flags, node_id) == (A, 7711, 4, B)
    assert set(MESSAGE_TYPES) == {type(m) for m, _n, _v in SAMPLES} - {Gossip}
