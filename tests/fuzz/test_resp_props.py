"""Properties of the request parser (the checks of ``fuzz_resp``, on hypothesis' inputs)."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from disque_py.protocol.resp import encode_request

from .fuzz_resp import DEFAULT_LIMITS, check_resp, parse, slices

FAST = settings(max_examples=150, deadline=None)

argv = st.lists(st.binary(max_size=24), min_size=1, max_size=6)
token = st.text(st.characters(min_codepoint=0x21, max_codepoint=0x7E, exclude_characters="\"'"), min_size=1,
               max_size=12).map(str.encode)
inline_argv = st.lists(token, min_size=1, max_size=5).filter(lambda a: a[0][:1] != b"*")
resp_bytes = st.one_of(
    st.binary(max_size=200),
    st.lists(st.sampled_from([b"*", b"$", b"\r\n", b"\n", b"1", b"2", b"-1", b"0", b"PING", b" ", b'"', b"'",
                              b"\\x4", b"+", b":", b"~", b"_", b"%", b"99999999999"]), max_size=40).map(b"".join),
)  # fmt: skip


def cut_points(data: bytes):
    return st.lists(st.integers(1, max(1, len(data) - 1)), max_size=10, unique=True).map(sorted)


@FAST
@given(resp_bytes, st.integers(0, 2**32))
def test_any_bytes_any_slicing(data, seed):
    check_resp(data, seed)


@FAST
@given(st.lists(argv, min_size=1, max_size=6), st.data())
def test_multibulk_requests_in_any_slices(commands, data):
    stream = b"".join(encode_request(a) for a in commands)
    cuts = [c for c in data.draw(cut_points(stream)) if 0 < c < len(stream)]
    got, error = parse(slices(stream, cuts), DEFAULT_LIMITS)
    assert error is None and got == commands


@FAST
@given(st.lists(inline_argv, min_size=1, max_size=6), st.booleans(), st.data())
def test_inline_requests_in_any_slices(commands, crlf, data):
    stream = b"".join(b" ".join(a) + (b"\r\n" if crlf else b"\n") for a in commands)
    cuts = [c for c in data.draw(cut_points(stream)) if 0 < c < len(stream)]
    got, error = parse(slices(stream, cuts), DEFAULT_LIMITS)
    assert error is None and got == commands


@FAST
@given(st.lists(argv, min_size=1, max_size=4), st.data())
def test_one_byte_at_a_time(commands, data):
    stream = b"".join(encode_request(a) for a in commands)
    got, error = parse([stream[i : i + 1] for i in range(len(stream))], DEFAULT_LIMITS)
    assert error is None and got == commands
