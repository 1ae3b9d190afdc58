"""Properties of the bus codec and handshake (``fuzz_bus``) on hypothesis' inputs."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from cluster_bus.codec import encode_message, frame
from cluster_bus.messages import Data, DataBatch, Fail, Gossip, Meet, Ping, Pong

from .fuzz_bus import MODE_PLAIN, MODE_SESSION, PEER_ID, check_bus

FAST = settings(max_examples=150, deadline=None)

node_id = st.sampled_from([PEER_ID, "a" * 40, "b" * 40, "0123456789abcdef0123456789abcdef01234567"])
u16 = st.integers(0, 0xFFFF)
time_ = st.integers(0, 2**63 - 1)
gossip = st.builds(Gossip, node_id, st.sampled_from(["127.0.0.1", "::1", "", "10.0.0.1", "x"]), u16, u16, time_, time_)
job_id = st.sampled_from([b"D-01234567-AAAAAAAAAAAAAAAAAAAAAAAA-05a1", b"D-aaaaaaaa-BBBBBBBBBBBBBBBBBBBBBBBB-0001"])
leaf = st.one_of(st.none(), st.booleans(), st.integers(-(2**63), 2**64 - 1), st.binary(max_size=40), st.text(max_size=20), job_id)
body = st.recursive(leaf, lambda c: st.lists(c, max_size=5) | st.dictionaries(st.text(max_size=5), c, max_size=4), max_leaves=20)
kind = st.sampled_from(["REPLJOB", "GOTJOB", "ENQUEUE", "QUEUED", "WORKING", "WILLQUEUE", "SETACK", "GOTACK",
                        "DELJOB", "PAUSE", "NEEDJOBS", "YOURJOBS", "HASJOB", "HAVEJOB", "X"])  # fmt: skip
message = st.one_of(
    st.builds(Ping, node_id, u16, u16, st.lists(gossip, max_size=4).map(tuple)),
    st.builds(Pong, node_id, u16, u16, st.lists(gossip, max_size=4).map(tuple)),
    st.builds(Meet, node_id, u16, u16, st.lists(gossip, max_size=4).map(tuple)),
    st.builds(Fail, node_id, node_id),
    st.builds(Data, node_id, kind, st.lists(body, max_size=4)),
    # well-formed HASJOB / HAVEJOB (core/dedup.py), and a HAVEJOB's answer of any type
    st.builds(Data, node_id, st.just("HASJOB"), st.tuples(job_id).map(list)),
    st.builds(Data, node_id, st.just("HAVEJOB"), st.tuples(job_id, st.one_of(st.booleans(), leaf)).map(list)),
    st.builds(DataBatch, node_id, st.lists(st.tuples(kind, st.lists(body, max_size=3)).map(list), min_size=1, max_size=4)),
)


@FAST
@given(st.binary(max_size=300), st.integers(0, 2**32))
def test_any_bytes_in_any_mode(data, seed):
    check_bus(data, seed)


@FAST
@given(st.lists(message, min_size=1, max_size=5), st.sampled_from([MODE_PLAIN, MODE_SESSION]), st.integers(0, 2**32))
def test_valid_messages_reach_the_machines(msgs, mode, seed):
    check_bus(bytes([mode]) + b"".join(frame(encode_message(m)) for m in msgs), seed)


@FAST
@given(st.lists(message, min_size=1, max_size=3), st.integers(0, 3), st.data())
def test_damaged_streams(msgs, mode, data):
    stream = bytearray(bytes([mode]) + b"".join(frame(encode_message(m)) for m in msgs))
    i = data.draw(st.integers(1, len(stream) - 1))
    stream[i] = data.draw(st.integers(0, 255))
    check_bus(bytes(stream), data.draw(st.integers(0, 2**32)))
