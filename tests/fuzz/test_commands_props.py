"""Properties of a node's command layer: random requests of known commands with random or
garbage arguments never raise, every reply encodes, the invariants hold (``fuzz_commands``)."""

from __future__ import annotations

import msgpack
from hypothesis import given, settings
from hypothesis import strategies as st

from disque_py.protocol.resp import encode_request

from .fuzz_commands import CONTROLS, Driver, check_commands
from .test_bus_props import body, kind

NAMES = sorted(Driver().node.commands)
WORDS = [b"FROM", b"TIMEOUT", b"COUNT", b"RETRY", b"TTL", b"DELAY", b"REPLICATE", b"ASYNC", b"NOHANG",
         b"WITHCOUNTERS", b"MAXLEN", b"BUSYLOOP", b"REPLY", b"all", b"in", b"out", b"none", b"state",
         b"MINLEN", b"IMPORTRATE", b"QUEUE", b"STATE", b"queued", b"active", b"acked", b"BLOCKING", b"0", b"1",
         b"-1", b"q", b"r", b"$0", b"$1", b"$2", b"D-01234567-AAAAAAAAAAAAAAAAAAAAAAAA-05a1"]  # fmt: skip
arg = st.one_of(
    st.sampled_from(WORDS),
    st.integers(-(2**64), 2**64).map(lambda i: b"%d" % i),
    st.integers(0, 100_000).map(lambda i: b"%d" % i),
    st.binary(max_size=12),
)
command = st.one_of(
    st.tuples(st.sampled_from(NAMES), st.lists(arg, max_size=10)).map(lambda t: [t[0], *t[1]]),
    st.tuples(st.sampled_from(CONTROLS), st.lists(arg, max_size=2)).map(lambda t: [t[0], *t[1]]),
    st.tuples(kind, st.lists(body, max_size=4)).map(lambda t: [b".recv", t[0].encode(), msgpack.packb(t[1])]),
    st.tuples(st.sampled_from([b"addjob"]), st.sampled_from([b"q", b"r"]), st.binary(max_size=8),
              st.sampled_from([b"0", b"100"]), st.lists(arg, max_size=8)).map(lambda t: [*t[:4], *t[4]]),  # fmt: skip
)


@settings(max_examples=120, deadline=None)
@given(st.lists(command, min_size=1, max_size=40))
def test_random_commands_never_break_a_node(commands):
    stream = b"".join(encode_request(c) for c in commands)
    check_commands(stream)


@settings(max_examples=100, deadline=None)
@given(st.binary(max_size=300))
def test_random_bytes_as_commands(data):
    check_commands(data)
