"""Fuzz target: the client request parser (``disque_py.protocol.resp.RequestParser``).

The input is the bytes a client sends (multibulk or inline requests, or anything). What
must hold, for any bytes:

* ``feed`` never raises and ``commands`` raises nothing but ``ProtocolError``;
* every command returned is a non-empty list of ``bytes`` within the parser's limits,
  and survives ``encode_request`` -> parse unchanged;
* the same parser with small limits (so that short inputs reach every limit check), fed
  the bytes at once and in slices (cut where a seed drawn from the input says), keeps
  both properties;
* the commands found, written again as a well-formed stream (multibulk requests, and
  inline lines for those that need no quoting), give the same commands however that
  stream is cut. Raw bytes need not: a read handed to hiredis is RESP to its end (see
  ``check_resp`` for an example), as the module documents.
"""

from __future__ import annotations

import random
import re
import zlib

from disque_py.protocol.resp import ProtocolError, RequestParser, encode_request

#: small limits, so that short inputs reach every limit check
SMALL_LIMITS = dict(max_bulk_len=16, max_args=5, max_inline_len=24, max_query_buffer=96)
DEFAULT_LIMITS: dict[str, int] = {}


def cuts_for(data: bytes, seed: int | None = None) -> list[int]:
    """Where to cut ``data`` into slices: drawn from a seed (by default the input's CRC)."""
    if len(data) < 2:
        return []
    rng = random.Random(zlib.crc32(data) if seed is None else seed)
    n = rng.randint(1, min(len(data) - 1, 12))
    if rng.random() < 0.15:  # now and then, one byte at a time
        return list(range(1, len(data)))
    return sorted(rng.sample(range(1, len(data)), n))


def slices(data: bytes, cuts: list[int]) -> list[bytes]:
    bounds = [0, *cuts, len(data)]
    return [data[a:b] for a, b in zip(bounds, bounds[1:])]


def parse(chunks: list[bytes], limits: dict[str, int]) -> tuple[list[list[bytes]], ProtocolError | None]:
    """Feed ``chunks`` one by one as a connection would: the commands, then the error if any."""
    parser = RequestParser(**limits)
    out: list[list[bytes]] = []
    for chunk in chunks:
        parser.feed(chunk)
        if parser.error is not None:
            break
        out.extend(parser.commands())  # no error yet: never raises
    try:
        while ready := parser.commands():  # the commands before the bad bytes, then the error
            out.extend(ready)
        rest = parser.commands()
    except ProtocolError as exc:
        assert parser.error is exc
        assert exc.reply_text.startswith("ERR Protocol error: "), exc.reply_text
        return out, exc
    assert rest == [] and parser.error is None, (rest, parser.error)
    return out, None


def check_command(argv: list[bytes], limits: dict[str, int]) -> None:
    defaults = RequestParser()
    max_args = limits.get("max_args", defaults.max_args)
    max_bulk = limits.get("max_bulk_len", defaults.max_bulk_len)
    assert type(argv) is list and 0 < len(argv) <= max_args, argv
    for arg in argv:
        assert type(arg) is bytes and len(arg) <= max_bulk, argv
    again, error = parse([encode_request(argv)], {})
    assert error is None and again == [argv], (argv, again, error)


_SAFE = re.compile(rb"[!-~]+")  # printable, no space: an inline argument as it is


def _inline_safe(argv: list[bytes]) -> bool:
    return all(_SAFE.fullmatch(a) and b'"' not in a and b"'" not in a for a in argv) and argv[0][:1] != b"*"


def canonical_streams(commands: list[list[bytes]]) -> list[tuple[bytes, list[list[bytes]]]]:
    """Well-formed streams and the commands they hold: ``commands`` as multibulk requests,
    and those whose arguments need no quoting as inline lines (CRLF or LF ended)."""
    streams = [(b"".join(encode_request(argv) for argv in commands), commands)]
    plain = [argv for argv in commands if _inline_safe(argv)]
    if plain:
        streams.append((b"".join(b" ".join(argv) + (b"\r\n" if i % 2 else b"\n") for i, argv in enumerate(plain)), plain))
    return streams


def check_resp(data: bytes, seed: int | None = None) -> None:
    cuts = cuts_for(data, seed)
    whole: list[list[bytes]] = []
    for limits in (DEFAULT_LIMITS, SMALL_LIMITS):
        at_once, _ = parse([data], limits)
        cut, _ = parse(slices(data, cuts), limits)
        for argv in at_once + cut:
            check_command(argv, limits)
        if limits is DEFAULT_LIMITS:
            whole = at_once
    # Slicing: a well-formed stream gives the same commands however it is cut. Raw bytes
    # need not: a read handed to hiredis is RESP to its end, so "*0\r\n~1\r\n$1\r\nx\r\n"
    # in one read holds a RESP3 set (the command [b"x"]), but cut after "*0\r\n" the inline
    # requests "~1", "$1", "x", as the module documents.
    for stream, want in canonical_streams(whole) if whole else ():
        got, error = parse(slices(stream, cuts_for(stream, seed)), DEFAULT_LIMITS)
        once, once_error = parse([stream], DEFAULT_LIMITS)
        assert error is None and once_error is None and got == once == want, (stream, got, once, error, once_error)


def TestOneInput(data: bytes) -> None:
    check_resp(data)
