"""Tests for disque_py.protocol.resp: request parsing, reply encoding."""

from __future__ import annotations

import enum
import random

import hiredis
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from disque_py.core.replies import NULL_ARRAY, OK, Error, Status, err
from disque_py.protocol.resp import (
    BULK_SLACK,
    INCOMPLETE,
    ProtocolError,
    ReplyParser,
    RequestParser,
    encode,
    encode_reply,
    encode_request,
    split_inline,
)

HYPO = settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])

E_MULTIBULK = "ERR Protocol error: invalid multibulk length"
E_BULK = "ERR Protocol error: invalid bulk length"
E_INLINE = "ERR Protocol error: too big inline request"
E_QUOTES = "ERR Protocol error: unbalanced quotes in request"
E_QUERYBUF = "ERR Protocol error: query buffer limit exceeded"


# --------------------------------------------------------------------------
# helpers
# --------------------------------------------------------------------------


def mb(*args: bytes | str | int) -> bytes:
    return encode_request(args)


def feed_chunks(chunks, **limits):
    """Feed chunks; return (all commands, error or None)."""
    p = RequestParser(**limits)
    cmds = []
    for c in chunks:
        p.feed(c)
        try:
            cmds += p.commands()  # after an error: what was complete before it
        except ProtocolError as exc:
            assert exc is p.error
            break
        if p.error is not None:
            with pytest.raises(ProtocolError, match="^ERR Protocol error: ") as again:
                p.commands()
            assert again.value is p.error  # the same error again, the parser stays failed
            break
    return cmds, p.error


def parse(data: bytes, **limits):
    return feed_chunks([data], **limits)


def parse_bytewise(data: bytes, **limits):
    return feed_chunks([data[i : i + 1] for i in range(len(data))], **limits)


def split_at(data: bytes, cuts) -> list[bytes]:
    cuts = sorted(set(c for c in cuts if 0 < c < len(data)))
    out, prev = [], 0
    for c in cuts:
        out.append(data[prev:c])
        prev = c
    out.append(data[prev:])
    return out


def expect_error(chunks, text, **limits):
    cmds, error = feed_chunks(chunks, **limits)
    assert isinstance(error, ProtocolError), (cmds, error)
    # Over a limit, Redis's text is followed by the limit in parentheses
    # (test_limit_errors_name_the_limit_and_its_directive has them whole).
    assert error.reply_text == text or error.reply_text.startswith(text + " ("), error.reply_text
    return cmds


# --------------------------------------------------------------------------
# multibulk
# --------------------------------------------------------------------------

COMMANDS = [
    [b"PING"],
    [b"ADDJOB", b"queue", b"body", b"0"],
    [b"GETJOB", b"TIMEOUT", b"100", b"FROM", b"q1", b"q2"],
    [b"SET", b"", b"x" * 3000],
    [b"ACKJOB"] + [b"D-%08d-abc-05a1" % i for i in range(50)],
]


def test_multibulk_whole_equals_bytewise():
    data = b"".join(mb(*c) for c in COMMANDS)
    whole, error = parse(data)
    assert error is None
    assert whole == COMMANDS
    bytewise, error = parse_bytewise(data)
    assert error is None
    assert bytewise == COMMANDS


def test_multibulk_random_splits_and_many_commands():
    rnd = random.Random(42)
    cmds = [[b"CMD%d" % i, bytes(rnd.randrange(256) for _ in range(rnd.randrange(40)))] for i in range(2000)]
    data = b"".join(mb(*c) for c in cmds)
    assert parse(data) == (cmds, None)
    for _ in range(5):
        chunks = split_at(data, [rnd.randrange(len(data)) for _ in range(300)])
        assert feed_chunks(chunks) == (cmds, None)


def test_large_pipeline_over_64k_uses_type_loop_path():
    cmds = [[b"ADDJOB", b"q", b"body%d" % i, b"0"] for i in range(5000)]
    data = b"".join(mb(*c) for c in cmds)
    assert len(data) > 64 * 1024
    assert parse(data) == (cmds, None)


def test_commands_drains():
    p = RequestParser()
    p.feed(mb("PING") + mb("PING"))
    assert p.commands() == [[b"PING"], [b"PING"]]
    assert p.commands() == []
    assert p.error is None


def test_binary_bodies():
    bodies = [b"\r\n", b"\x00\x00", b"a\r\nb\r\n", b"*1\r\n$4\r\nPING\r\n", b"$-1\r\n", bytes(range(256)), b"\n"]
    cmds = [[b"ADDJOB", b"q", body, b"0"] for body in bodies]
    data = b"".join(mb(*c) for c in cmds)
    assert parse(data) == (cmds, None)
    assert parse_bytewise(data) == (cmds, None)


def test_input_types_bytearray_memoryview():
    data = mb("ADDJOB", "q", "x\r\ny", "0")
    p = RequestParser()
    p.feed(bytearray(data[:7]))
    p.feed(memoryview(data)[7:])
    p.feed(memoryview(b"PING\r\n"))
    p.feed(bytearray(b"QLEN q\r\n"))
    p.feed(memoryview(data))
    assert p.commands() == [[b"ADDJOB", b"q", b"x\r\ny", b"0"], [b"PING"], [b"QLEN", b"q"]] + [
        [b"ADDJOB", b"q", b"x\r\ny", b"0"]
    ]
    for cmd in p.commands():
        assert all(type(a) is bytes for a in cmd)


def test_empty_and_null_multibulk_are_skipped():
    data = b"*0\r\n*-1\r\n" + mb("PING") + b"*0\r\n" + mb("QLEN", "q") + b"*-1\r\n"
    assert parse(data) == ([[b"PING"], [b"QLEN", b"q"]], None)
    assert parse_bytewise(data) == ([[b"PING"], [b"QLEN", b"q"]], None)


def test_empty_feed_is_noop():
    p = RequestParser()
    p.feed(b"")
    p.feed(b"*1\r\n")
    p.feed(b"")
    p.feed(b"$4\r\nPING\r\n")
    assert p.commands() == [[b"PING"]]


def test_simple_string_elements_are_accepted_leniently():
    # hiredis cannot tell +x from $1 x; documented leniency.
    assert parse(b"*2\r\n+GET\r\n$1\r\nk\r\n") == ([[b"GET", b"k"]], None)


# --------------------------------------------------------------------------
# inline
# --------------------------------------------------------------------------


@pytest.mark.parametrize(
    "line, argv",
    [
        (b"PING", [b"PING"]),
        (b"  SET   k \t v  ", [b"SET", b"k", b"v"]),
        (b'SET k "hello world"', [b"SET", b"k", b"hello world"]),
        (b'SET k ""', [b"SET", b"k", b""]),
        (b"SET k ''", [b"SET", b"k", b""]),
        (b'"a\\n\\r\\t\\b\\a\\\\\\"z"', [b"a\n\r\t\b\a\\\"z"]),
        (b'"\\x41\\x4a\\xff\\x00"', [b"AJ\xff\x00"]),
        (b'"\\x4"', [b"x4"]),  # not two hex digits: \x is just x
        (b'"\\xzz"', [b"xzz"]),
        (b'"\\q"', [b"q"]),
        (b"'it\\'s' 'a\\nb'", [b"it's", b"a\\nb"]),
        (b"'say \"hi\"'", [b'say "hi"']),
        (b"\"it's\"", [b"it's"]),
        (b'ab"c d"', [b"abc d"]),  # quote may open mid-argument
        (b"ab'c d' e", [b"abc d", b"e"]),
        (b'"a" "b"\t"c"', [b"a", b"b", b"c"]),
        (b"\xff\xfe \x00", [b"\xff\xfe", b"\x00"]),
    ],
)
def test_split_inline(line, argv):
    assert split_inline(line) == argv


@pytest.mark.parametrize(
    "line",
    [b'"abc', b"'abc", b'"abc"def', b"'abc'def", b'"a\\"', b"'a\\'", b'x "', b"\"a\\x4\"'"],
)
def test_split_inline_unbalanced(line):
    with pytest.raises(ProtocolError, match="^ERR Protocol error: unbalanced quotes") as info:
        split_inline(line)
    assert info.value.reply_text == E_QUOTES


def test_inline_requests_crlf_and_lf():
    data = b"PING\r\nQLEN q\nSET k \"v w\"\r\n\r\n\n   \r\nQUIT\n"
    expected = [[b"PING"], [b"QLEN", b"q"], [b"SET", b"k", b"v w"], [b"QUIT"]]
    assert parse(data) == (expected, None)
    assert parse_bytewise(data) == (expected, None)


def test_inline_partial_line_waits():
    p = RequestParser()
    p.feed(b"QLEN my")
    assert p.commands() == []
    p.feed(b"queue\r")
    assert p.commands() == []
    p.feed(b"\n")
    assert p.commands() == [[b"QLEN", b"myqueue"]]


def test_inline_then_multibulk_in_one_chunk():
    data = b"PING\r\nQLEN q\n" + mb("ADDJOB", "q", "b\r\n", "0") + mb("PING")
    expected = [[b"PING"], [b"QLEN", b"q"], [b"ADDJOB", b"q", b"b\r\n", b"0"], [b"PING"]]
    assert parse(data) == (expected, None)
    assert parse_bytewise(data) == (expected, None)


def test_multibulk_then_inline_in_separate_chunks():
    chunks = [mb("PING"), b"QLEN q\r\n", mb("HELLO"), b"PING\n"]
    assert feed_chunks(chunks) == ([[b"PING"], [b"QLEN", b"q"], [b"HELLO"], [b"PING"]], None)


def test_inline_after_multibulk_in_same_chunk_is_a_protocol_error():
    # Documented limitation: hiredis sees the inline bytes.  The command
    # before them is still delivered.
    cmds = expect_error([mb("PING") + b"PING\r\n"], "ERR Protocol error: expected '$' or '*', got 'P'")
    assert cmds == [[b"PING"]]


def test_inline_unbalanced_quotes_error_after_previous_commands():
    cmds = expect_error([b'PING\r\nSET k "v\r\nPING\r\n'], E_QUOTES)
    assert cmds == [[b"PING"]]


# --------------------------------------------------------------------------
# limits
# --------------------------------------------------------------------------


@pytest.mark.parametrize("max_args", [5, 99, 100, 1000, 12345])
def test_max_args_boundary(max_args):
    ok = mb(*(["x"] * max_args))
    bad = mb(*(["x"] * (max_args + 1)))
    assert parse(ok, max_args=max_args) == ([[b"x"] * max_args], None)
    assert parse_bytewise(ok, max_args=max_args)[1] is None
    assert expect_error([bad], E_MULTIBULK, max_args=max_args) == []
    # header alone, at a chunk start: rejected before any element arrives
    assert expect_error([b"*%d\r\n" % (max_args + 1)], E_MULTIBULK, max_args=max_args) == []
    assert expect_error([b"*%d\r" % (max_args + 1)], E_MULTIBULK, max_args=max_args) == []
    # not at a chunk start (pipelined): detected when complete
    assert expect_error([mb("PING") + bad], E_MULTIBULK, max_args=max_args) == [[b"PING"]]
    assert expect_error([b"PING\r\n" + bad], E_MULTIBULK, max_args=max_args) == [[b"PING"]]
    # byte by byte: header split across feeds
    assert expect_error([bad[i : i + 1] for i in range(len(bad))], E_MULTIBULK, max_args=max_args) == []


def test_huge_multibulk_count_rejected_without_allocation():
    for header in (b"*99999999999\r\n", b"*4294967295\r\n", b"*2000000\r\n"):
        assert expect_error([header], E_MULTIBULK) == []
    # beyond hiredis' own range, in the middle of a chunk
    assert expect_error([mb("PING") + b"*4294967296\r\n"], E_MULTIBULK) == [[b"PING"]]


@pytest.mark.parametrize("max_bulk_len", [1, 100, 10_000])
def test_max_bulk_len_boundary(max_bulk_len):
    ok = mb("k", b"v" * max_bulk_len)
    bad = mb("k", b"v" * (max_bulk_len + 1))
    assert parse(ok, max_bulk_len=max_bulk_len) == ([[b"k", b"v" * max_bulk_len]], None)
    assert parse_bytewise(ok, max_bulk_len=max_bulk_len)[1] is None
    assert expect_error([bad], E_BULK, max_bulk_len=max_bulk_len) == []
    assert expect_error([ok + bad], E_BULK, max_bulk_len=max_bulk_len) == [[b"k", b"v" * max_bulk_len]]
    assert expect_error([bad[i : i + 1] for i in range(len(bad))], E_BULK, max_bulk_len=max_bulk_len) == []
    # split into a few uneven chunks
    chunks = split_at(bad, [3, 17, len(bad) // 2, len(bad) - 2])
    assert expect_error(chunks, E_BULK, max_bulk_len=max_bulk_len) == []


def test_oversized_incomplete_bulk_detected_early():
    limit = 10_000
    header = b"*2\r\n$3\r\nSET\r\n$1000000000\r\n"
    # Within max_bulk_len + slack: still waiting (it might be legitimate).
    p = RequestParser(max_bulk_len=limit)
    p.feed(header)
    p.feed(b"x" * limit)
    assert p.error is None and p.commands() == []
    # Slightly over max_bulk_len + slack, body far from complete: rejected.
    chunks = [header, b"x" * (limit + BULK_SLACK + 1)]
    assert expect_error(chunks, E_BULK, max_bulk_len=limit) == []
    # Same, arriving in small pieces after a pipelined prefix.
    prefix = b"".join(mb("PING", "x" * 50) for _ in range(40))
    body = b"x" * (limit + BULK_SLACK + 100)
    chunks = [prefix + header] + [body[i : i + 997] for i in range(0, len(body), 997)]
    cmds = expect_error(chunks, E_BULK, max_bulk_len=limit)
    assert len(cmds) == 40


def test_incomplete_bulk_at_limit_is_not_a_false_positive():
    limit = 10_000
    prefix = b"".join(mb("PING", "x" * 50) for _ in range(40))  # ~2.6 KB consumed
    cmd = mb("SET", "k", b"v" * limit)
    for chunks in ([prefix + cmd[:-2], cmd[-2:]], [prefix + cmd[:-1], cmd[-1:]], [prefix, cmd[:20], cmd[20:-1], cmd[-1:]]):
        cmds, error = feed_chunks(chunks, max_bulk_len=limit)
        assert error is None
        assert cmds[-1] == [b"SET", b"k", b"v" * limit]


def test_max_query_buffer_incomplete_request():
    limit = 1000
    # An incomplete request of many small elements: exactly `limit` bytes pass
    head = b"*100000\r\n"
    elem = b"$1\r\na\r\n"
    n_elem = (limit - len(head)) // len(elem)
    data = head + elem * n_elem
    data += b"$5\r\nabcde"[: limit - len(data)]
    assert len(data) == limit
    p = RequestParser(max_query_buffer=limit)
    p.feed(data)
    assert p.error is None
    p.feed(b"a")
    assert p.error is not None and p.error.reply_text == E_QUERYBUF + " (client-query-buffer-limit %d)" % limit
    # byte by byte too
    assert expect_error([(data + b"a")[i : i + 1] for i in range(limit + 1)], E_QUERYBUF, max_query_buffer=limit) == []


def test_max_query_buffer_does_not_limit_complete_pipelines():
    limit = 1000
    data = b"".join(mb("PING", "x" * 20) for _ in range(500))
    assert len(data) > 10 * limit
    rnd = random.Random(1)
    chunks = split_at(data, [rnd.randrange(len(data)) for _ in range(200)])
    cmds, error = feed_chunks(chunks, max_query_buffer=limit)
    assert error is None and len(cmds) == 500


@pytest.mark.parametrize("limit", [1, 10, 1000])
def test_max_inline_len_boundary(limit):
    line = b"x" * limit
    for eol in (b"\n", b"\r\n"):
        assert parse(line + eol, max_inline_len=limit) == ([[line]], None)
        assert parse_bytewise(line + eol, max_inline_len=limit) == ([[line]], None)
        expect_error([line + b"y" + eol], E_INLINE, max_inline_len=limit)
        expect_error([(line + b"y" + eol)[i : i + 1] for i in range(limit + 1 + len(eol))], E_INLINE, max_inline_len=limit)
    # no newline yet: waits up to the limit (+ a possible CR), then fails
    p = RequestParser(max_inline_len=limit)
    p.feed(line)
    assert p.error is None
    p.feed(b"\r")
    assert p.error is None
    p.feed(b"\n")
    assert p.commands() == [[line]]
    assert expect_error([line + b"y"], E_INLINE, max_inline_len=limit) == []
    assert expect_error([b"Q\n" + line + b"y"], E_INLINE, max_inline_len=limit) == [[b"Q"]]


def test_inline_respects_max_args_and_max_bulk_len():
    assert parse(b"a b c\n", max_args=3) == ([[b"a", b"b", b"c"]], None)
    assert expect_error([b"a b\na b c d\n"], E_MULTIBULK, max_args=3) == [[b"a", b"b"]]
    assert parse(b"abc\n", max_bulk_len=3) == ([[b"abc"]], None)
    assert expect_error([b'x\n"abcd"\n'], E_BULK, max_bulk_len=3) == [[b"x"]]


def test_inline_line_fed_byte_by_byte_is_linear():
    line = b"SET k " + b"v" * 60_000
    p = RequestParser()
    for i in range(len(line)):
        p.feed(line[i : i + 1])
    assert p.error is None and p.commands() == []
    p.feed(b"\r")
    p.feed(b"\n")
    assert p.commands() == [[b"SET", b"k", b"v" * 60_000]]


def test_limits_must_be_positive():
    with pytest.raises(ValueError, match="parser limits must be positive"):
        RequestParser(max_args=0)


# --------------------------------------------------------------------------
# malformed input
# --------------------------------------------------------------------------


@pytest.mark.parametrize(
    "data, text",
    [
        (b"*abc\r\n", E_MULTIBULK),
        (b"*-5\r\n", E_MULTIBULK),
        (b"*1x\r\n", E_MULTIBULK),
        (b"*1\r\n$-5\r\n", E_BULK),
        (b"*1\r\n$x\r\n", E_BULK),
        (b"*1\r\n$99999999999999999999\r\n", E_BULK),
        (b"*1\r\n$-1\r\n", E_BULK),
        (b"*1\r\n_\r\n", E_BULK),
        (b"*2\r\n$1\r\na\r\n*1\r\n$1\r\nb\r\n", "ERR Protocol error: expected '$', got '*'"),
        (b"*1\r\n:5\r\n", "ERR Protocol error: expected '$', got ':'"),
        (b"*1\r\n-ERR x\r\n", "ERR Protocol error: expected '$', got '-'"),
        (b"*1\r\n,1.5\r\n", "ERR Protocol error: expected '$', got ','"),
        (b"*1\r\n#t\r\n", "ERR Protocol error: expected '$', got '#'"),
        (b"*1\r\n%1\r\n$1\r\na\r\n$1\r\nb\r\n", "ERR Protocol error: expected '$', got '%'"),
        (b"*1\r\n>1\r\n$1\r\na\r\n", "ERR Protocol error: expected '$', got '>'"),
        (b"*1\r\nX\r\n", "ERR Protocol error: expected '$' or '*', got 'X'"),
        (b"*1\r\n:abc\r\n", "ERR Protocol error: Bad integer value"),
    ],
)
def test_malformed(data, text):
    expect_error([data], text)
    expect_error([data[i : i + 1] for i in range(len(data))], text)
    # after a good command in the same chunk: the good one is delivered
    assert expect_error([mb("PING") + data], text) == [[b"PING"]]


@pytest.mark.parametrize(
    "data",
    [mb("PING") + b":1\r\n", mb("PING") + b"$3\r\nfoo\r\n", mb("PING") + b"#f\r\n", mb("PING") + b"-ERR\r\n"],
)
def test_non_array_request_inside_a_chunk(data):
    cmds, error = parse(data)
    assert cmds == [[b"PING"]]
    assert isinstance(error, ProtocolError)
    assert error.reply_text.startswith("ERR Protocol error: expected '*', got ")


def test_error_is_sticky_and_commands_raise_after_draining():
    p = RequestParser()
    p.feed(mb("PING") + b"*1\r\n:1\r\n" + mb("QLEN", "q"))
    assert isinstance(p.error, ProtocolError)
    assert p.commands() == [[b"PING"]]  # completed before the bad bytes
    with pytest.raises(ProtocolError, match=r"^ERR Protocol error: expected '\$', got ':'") as info:
        p.commands()
    assert info.value is p.error
    assert info.value.reply == Error("ERR Protocol error: expected '$', got ':'")
    assert encode(info.value.reply) == b"-ERR Protocol error: expected '$', got ':'\r\n"
    p.feed(mb("PING"))  # ignored
    with pytest.raises(ProtocolError, match=r"^ERR Protocol error: expected '\$', got ':'"):
        p.commands()


def test_protocol_error_str():
    e = ProtocolError(E_BULK)
    assert str(e) == E_BULK and e.reply_text == E_BULK


# --------------------------------------------------------------------------
# property tests: requests
# --------------------------------------------------------------------------

argv_st = st.lists(st.binary(max_size=40), min_size=1, max_size=8)


@HYPO
@given(st.lists(argv_st, min_size=1, max_size=20), st.lists(st.integers(min_value=0, max_value=5000), max_size=30))
def test_prop_multibulk_roundtrip_random_splits(cmds, cuts):
    data = b"".join(mb(*c) for c in cmds)
    assert feed_chunks(split_at(data, cuts)) == (cmds, None)


def inline_quote(arg: bytes) -> bytes:
    return b'"' + b"".join(b"\\x%02x" % c for c in arg) + b'"'


@HYPO
@given(
    st.lists(st.lists(st.binary(min_size=0, max_size=10), min_size=1, max_size=5), min_size=1, max_size=10),
    st.lists(st.integers(min_value=0, max_value=2000), max_size=20),
    st.sampled_from([b"\n", b"\r\n"]),
)
def test_prop_inline_quoted_roundtrip(cmds, cuts, eol):
    data = b"".join(b" ".join(inline_quote(a) for a in c) + eol for c in cmds)
    assert feed_chunks(split_at(data, cuts)) == (cmds, None)


token_st = st.text(alphabet="abcxyzABC0129_:.-", min_size=1, max_size=8).map(str.encode)


@HYPO
@given(st.lists(st.lists(token_st, min_size=1, max_size=5), min_size=1, max_size=10))
def test_prop_inline_mixed_with_multibulk(cmds):
    # Alternate inline and multibulk requests; every chunk holds inline lines
    # followed by one multibulk request (the supported mixing order).
    chunks, cur = [], b""
    for i, c in enumerate(cmds):
        if i % 2 == 0:
            cur += b" ".join(c) + b"\r\n"
        else:
            chunks.append(cur + mb(*c))
            cur = b""
    if cur:
        chunks.append(cur)
    assert feed_chunks(chunks) == (cmds, None)


garbage_st = st.one_of(
    st.binary(max_size=200),
    st.lists(
        st.sampled_from(
            [b"*", b"$", b":", b"-", b"+", b"_", b"#", b",", b"%", b">", b"~", b"=", b"(", b"|",
             b"1", b"2", b"0", b"-1", b"99999999999", b"\r\n", b"\r", b"\n", b"a", b'"', b"'", b"\\", b" "]
        ),
        max_size=80,
    ).map(b"".join),
)


@HYPO
@given(garbage_st, st.lists(st.integers(min_value=0, max_value=300), max_size=10), st.sampled_from([{}, {"max_args": 3, "max_bulk_len": 5, "max_inline_len": 8, "max_query_buffer": 30}]))
def test_prop_garbage_only_protocol_errors(data, cuts, limits):
    p = RequestParser(**limits)
    for chunk in split_at(data, cuts):
        p.feed(chunk)  # must never raise
        try:
            cmds = p.commands()
        except ProtocolError as exc:
            assert exc is p.error
            assert exc.reply_text.startswith("ERR Protocol error: ")
            assert "\r" not in exc.reply_text and "\n" not in exc.reply_text
            break
        for argv in cmds:
            assert type(argv) is list and argv
            assert all(type(a) is bytes for a in argv)
            if limits:
                assert len(argv) <= 3
                assert all(len(a) <= 5 for a in argv)


# --------------------------------------------------------------------------
# encoder
# --------------------------------------------------------------------------


class Color(enum.IntEnum):
    RED = 7


class MyStr(str):
    pass


class MyStatus(Status):
    pass


@pytest.mark.parametrize(
    "value, wire",
    [
        (OK, b"+OK\r\n"),
        (Status(b"QUEUED"), b"+QUEUED\r\n"),
        (MyStatus(b"X"), b"+X\r\n"),
        (Error("ERR bad"), b"-ERR bad\r\n"),
        (err("line1\r\nline2\n"), b"-ERR line1  line2 \r\n"),
        (Error("NOJOB é"), "-NOJOB é\r\n".encode()),
        (0, b":0\r\n"),
        (1023, b":1023\r\n"),
        (1024, b":1024\r\n"),
        (-5, b":-5\r\n"),
        (2**70, b":%d\r\n" % 2**70),
        (True, b":1\r\n"),
        (False, b":0\r\n"),
        (Color.RED, b":7\r\n"),
        (b"", b"$0\r\n\r\n"),
        (b"a\r\nb\x00", b"$5\r\na\r\nb\x00\r\n"),
        (b"x" * 2000, b"$2000\r\n" + b"x" * 2000 + b"\r\n"),
        (bytearray(b"ab"), b"$2\r\nab\r\n"),
        (memoryview(b"abc"), b"$3\r\nabc\r\n"),
        (memoryview(b"abcdef")[::2], b"$3\r\nace\r\n"),
        ("é", b"$2\r\n\xc3\xa9\r\n"),
        (MyStr("hi"), b"$2\r\nhi\r\n"),
        (None, b"$-1\r\n"),
        (NULL_ARRAY, b"*-1\r\n"),
        ([], b"*0\r\n"),
        ((), b"*0\r\n"),
        ([b"a", 1, None], b"*3\r\n$1\r\na\r\n:1\r\n$-1\r\n"),
        ((b"q", [b"id", b"body"]), b"*2\r\n$1\r\nq\r\n*2\r\n$2\r\nid\r\n$4\r\nbody\r\n"),
        ([OK, Error("ERR x"), NULL_ARRAY, [[]]], b"*4\r\n+OK\r\n-ERR x\r\n*-1\r\n*1\r\n*0\r\n"),
        ([b"x"] * 1500, b"*1500\r\n" + b"$1\r\nx\r\n" * 1500),
    ],
)
def test_encode_exact(value, wire):
    assert encode(value) == wire
    out = bytearray(b"prefix")
    encode_reply(value, out)
    assert out == b"prefix" + wire


def test_memoryview_non_byte_format():
    import array

    a = array.array("H", [1, 2])
    assert encode(memoryview(a)) == b"$4\r\n" + a.tobytes() + b"\r\n"


@pytest.mark.parametrize("value", [1.5, object(), {b"a"}, [1, 2.5]])
def test_encode_unknown_types(value):
    with pytest.raises(TypeError, match="^cannot encode (float|object|set) as a RESP reply$"):
        encode(value)


def test_dict_is_a_flat_array_in_resp2_and_a_map_in_resp3():
    from disque_py.protocol.resp import encode_reply3

    assert encode({b"proto": 2, b"id": b"x"}) == b"*4\r\n$5\r\nproto\r\n:2\r\n$2\r\nid\r\n$1\r\nx\r\n"
    out = bytearray()
    encode_reply3({b"proto": 3, b"n": None, b"l": [NULL_ARRAY, b"a"]}, out)
    assert out == b"%3\r\n$5\r\nproto\r\n:3\r\n$1\r\nn\r\n_\r\n$1\r\nl\r\n*2\r\n_\r\n$1\r\na\r\n"


def test_commands_never_returns_internal_list():
    p = RequestParser()
    first = p.commands()
    first.append([b"junk"])
    p.feed(b"*1\r\n$4\r\nPING\r\n")
    assert p.commands() == [[b"PING"]]


def test_encode_request():
    assert encode_request([b"GET", "k", 5]) == b"*3\r\n$3\r\nGET\r\n$1\r\nk\r\n$1\r\n5\r\n"
    assert encode_request(()) == b"*0\r\n"


# --------------------------------------------------------------------------
# reply parser and encoder round trip
# --------------------------------------------------------------------------


def test_reply_parser_basic():
    rp = ReplyParser()
    wire = encode([OK, 3, b"x"]) + encode(Error("NOJOB none")) + encode(None) + encode(NULL_ARRAY)
    rp.feed(wire[:5])
    assert rp.gets() is INCOMPLETE
    rp.feed(wire[5:])
    replies = rp.replies()
    assert replies[0] == [b"OK", 3, b"x"]
    assert isinstance(replies[1], hiredis.ReplyError) and str(replies[1]) == "NOJOB none"
    assert replies[2:] == [None, None]
    assert rp.replies() == []
    rp.feed(b"#f\r\n")
    assert rp.gets() is False


def test_reply_parser_encoding_and_errors():
    rp = ReplyParser(encoding="utf-8")
    rp.feed(encode("é"))
    assert rp.gets() == "é"
    rp.feed(b"?bad\r\n")
    with pytest.raises(ProtocolError, match=r'^ERR Protocol error: .*got "\?" as reply type byte'):
        rp.gets()


def _expected(value):
    """What hiredis gives back for an encoded reply value."""
    if isinstance(value, Status):
        return bytes(value)
    if isinstance(value, Error):
        return ("error", str(value))
    if value is NULL_ARRAY or value is None:
        return None
    if isinstance(value, bool):
        return int(value)
    if isinstance(value, str):
        return value.encode()
    if isinstance(value, (list, tuple)):
        return [_expected(v) for v in value]
    return value


def _normalize(reply):
    if isinstance(reply, hiredis.ReplyError):
        return ("error", str(reply))
    if isinstance(reply, list):
        return [_normalize(r) for r in reply]
    return reply


reply_leaf = st.one_of(
    st.binary(max_size=30),
    st.text(max_size=10),
    st.integers(min_value=-(2**63), max_value=2**63 - 1),
    st.booleans(),
    st.none(),
    st.just(NULL_ARRAY),
    st.binary(max_size=20).map(lambda b: Status(b.replace(b"\r", b"").replace(b"\n", b""))),
    st.text(alphabet=st.characters(blacklist_categories=["Cs"], blacklist_characters="\r\n"), max_size=20).map(
        lambda s: Error("ERR " + s)
    ),
)
reply_st = st.recursive(reply_leaf, lambda inner: st.one_of(st.lists(inner, max_size=5), st.tuples(inner, inner)), max_leaves=30)


@HYPO
@given(st.lists(reply_st, min_size=1, max_size=5), st.lists(st.integers(min_value=0, max_value=2000), max_size=10))
def test_prop_encoder_roundtrip(values, cuts):
    wire = b"".join(encode(v) for v in values)
    rp = ReplyParser()
    got = []
    for chunk in split_at(wire, cuts):
        rp.feed(chunk)
        got += rp.replies()
    assert [_normalize(r) for r in got] == [_expected(v) for v in values]


# --- stray CR/LF between multibulk requests (redis-cli --pipe sends one) ---

PIPE_TAIL = b"\r\n*2\r\n$4\r\nECHO\r\n$20\r\n" + b"0123456789abcdefghij" + b"\r\n"


@pytest.mark.parametrize("split", [None, 1, 7, 100, 4096])
def test_stray_newlines_between_requests_are_skipped(split):
    body = b"".join(encode_request([b"ADDJOB", b"q", b"j%d" % i, b"0"]) for i in range(300))
    stream = body + PIPE_TAIL + b"\n\r\n" + encode_request([b"PING"])
    p = RequestParser()
    got = []
    chunks = [stream] if split is None else [stream[i : i + split] for i in range(0, len(stream), split)]
    for chunk in chunks:
        p.feed(chunk)
        assert p.error is None
        got += p.commands()
    assert len(got) == 302
    assert got[300] == [b"ECHO", b"0123456789abcdefghij"] and got[301] == [b"PING"]


def test_every_cut_point_with_stray_newline():
    stream = encode_request([b"ECHO", b"a\r\nb"]) * 3 + b"\r\n" + encode_request([b"PING"])
    for cut in range(1, len(stream)):
        p = RequestParser()
        p.feed(stream[:cut])
        got = p.commands()
        p.feed(stream[cut:])
        assert p.error is None, cut
        got += p.commands()
        assert got[-1] == [b"PING"] and len(got) == 4, cut


def test_other_junk_between_requests_is_still_an_error():
    p = RequestParser()
    p.feed(encode_request([b"PING"]) + b"x\r\n")
    assert p.commands() == [[b"PING"]]
    assert p.error is not None


def test_limit_errors_name_the_limit_and_its_directive():
    def error_of(data, **limits):
        cmds, error = feed_chunks([data], **limits)
        assert isinstance(error, ProtocolError), (cmds, error)
        return error.reply_text

    assert error_of(b"*5\r\n", max_args=4) == E_MULTIBULK + " (over proto-max-multibulk-len 4)"
    assert error_of(b"*1\r\n$5\r\nhello\r\n", max_bulk_len=4) == E_BULK + " (over proto-max-bulk-len 4)"
    assert error_of(b"a b c d e\n", max_args=4) == E_MULTIBULK + " (over proto-max-multibulk-len 4)"
    assert error_of(b"x" * 20, max_inline_len=16) == (
        E_INLINE + " (a line over 16 bytes; longer requests go as multibulk)")
    assert error_of(b"*2\r\n$3\r\nabc\r\n$100\r\n" + b"y" * 40, max_query_buffer=32) == (
        E_QUERYBUF + " (client-query-buffer-limit 32)")
    # A malformed length is no limit: Redis's bare text.
    assert error_of(b"*1\r\n$x\r\n") == E_BULK
    assert error_of(b"*abc\r\n") == E_MULTIBULK
