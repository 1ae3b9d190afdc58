"""RESP2 wire protocol: request parsing and reply encoding.

Theory of operation
===================

Requests (:class:`RequestParser`)
---------------------------------
A connection feeds every chunk it reads to :meth:`RequestParser.feed`, which
parses eagerly and queues complete commands (``list[bytes]`` argv lists) for
:meth:`RequestParser.commands`.  Like Redis, the parser decides per request,
by its first byte, between the two request syntaxes:

* **multibulk** (``*N\\r\\n$L\\r\\n...``), the hot path, is parsed by
  ``hiredis.Reader`` in C.  Per feed the Python work is one ``feed`` and, per
  command, one ``has_data``/``gets`` pair, ``type(msg) is list`` and a
  ``b"".join(msg)`` that rejects, in C, any non-bytes element (for feeds
  over 64 KiB, where that copy would matter, a bare ``type(x) is bytes``
  loop instead).  No length checks on this path (see Limits).
* **inline** (telnet style ``SET k "v w"\\n``) is parsed here, line by line,
  with Redis-like quoting rules (:func:`split_inline`).

hiredis does not say where a message starts, and ``Reader.has_data()`` is
false in the middle of an array whose complete elements were already
consumed, so the parser tracks message boundaries itself: it drains with
``while reader.has_data(): reader.gets()`` and is *at a boundary* only when
the last ``gets`` returned a message and no byte is left.  Only at a boundary
is the next byte examined to choose between hiredis and the inline parser.

Limitations of this design (deliberate, documented):

* Once a chunk is handed to hiredis, everything in it is RESP to hiredis:
  ``*1\\r\\n$4\\r\\nPING\\r\\nPING\\r\\n`` in *one* read yields ``[b"PING"]``
  then a :class:`ProtocolError` (hiredis meets the type byte ``P``).  The
  other order (inline lines, then multibulk, in one chunk) works: the inline
  parser hands the rest over to hiredis at the line boundary.
* hiredis returns simple strings (``+x``), verbatim strings and big numbers
  as ``bytes`` just like bulk strings, so such array elements are accepted as
  arguments; RESP3 sets (``~``) look like arrays.  Everything else (integers,
  nulls, nested aggregates, errors, doubles, booleans, maps, pushes) is a
  protocol error.  A top-level null (``*-1``, and ``$-1``/``_`` met inside a
  chunk) and ``*0`` are skipped, as Redis skips ``*-1``/``*0``.
* Like Redis and hiredis, the two bytes after a bulk body are skipped without
  checking that they are ``\\r\\n``.

Limits
------
``max_args`` (elements of one request), ``max_bulk_len`` (one argument),
``max_inline_len`` (one inline line) and ``max_query_buffer`` (bytes of one
incomplete request) are all enforced, cheaply:

* *Header pre-check*: when a chunk starts a new multibulk request, its ``*N``
  count is checked before hiredis sees it (hiredis preallocates a list of N
  slots, which must not be attacker sized).  Requests that start later in a
  pipelined chunk are checked once complete (and a count too large to
  allocate makes hiredis raise ``MemoryError``, reported as invalid multibulk
  length; a huge-but-allocatable list is calloc'ed lazily and its filling is
  bounded by ``max_query_buffer``).
* *Complete requests*: ``self._pending`` over-estimates the bytes fed since
  the oldest command of the current feed began.  A request cannot have an
  argument longer than ``max_bulk_len`` unless more than ``max_bulk_len``
  bytes were fed for it, nor more than ``max_args`` elements unless more than
  ``3 * max_args`` bytes were (the smallest element, ``+\\r\\n``, is 3
  bytes).  Only when ``_pending`` exceeds the smaller of the two are lengths
  and counts checked, so small requests never pay for it.  A body of exactly
  ``max_bulk_len`` bytes passes, one byte more fails.
* *Incomplete requests*: hiredis consumes finished elements and compacts its
  buffer once 1 KiB has been consumed, so ``Reader.len()`` is at most
  1023 bytes of consumed prefix + the unfinished element (header <= 23 bytes
  + body so far).  ``Reader.len() > max_bulk_len + BULK_SLACK`` therefore
  proves the pending bulk is oversized: it is reported without waiting for
  the body, and hiredis never holds more than ``max_bulk_len + BULK_SLACK``
  bytes.  ``_pending > max_query_buffer`` bounds a partial request made of
  many elements (``_pending`` may over-estimate by at most the size of the
  chunk in which the previous request ended).
* Inline: an unterminated line longer than ``max_inline_len`` (one extra
  byte allowed if it is the ``\\r`` of a split CRLF), or a complete line
  longer than ``max_inline_len`` (CRLF excluded), is "too big inline
  request".  Inline commands are also held to ``max_args`` and
  ``max_bulk_len`` (same error texts as multibulk), so every argv returned
  by :meth:`RequestParser.commands` respects all limits.

Errors
------
:meth:`RequestParser.feed` never raises.  On malformed input it stores a
:class:`ProtocolError` in ``parser.error`` and ignores any further data.
Commands completed *before* the bad bytes stay queued: :meth:`commands`
returns them first, and raises the stored error only when called with
nothing left to return.  The intended loop is::

    parser.feed(data)
    for argv in parser.commands():
        ...execute and reply...
    if parser.error is not None:
        send(encode(parser.error.reply)); close()

Replies (:func:`encode_reply`, :func:`encode`)
----------------------------------------------
Values from :mod:`disque_py.core.replies` are encoded by exact-type ``is``
dispatch (bytes, Status, int, list first), with an ``isinstance`` fallback
for subclasses, bytearray and memoryview.  Errors and statuses have any CR/LF
replaced by spaces.

:class:`ReplyParser` wraps ``hiredis.Reader`` for our client and the tests.
"""

from __future__ import annotations

from typing import Any, Final, final

import hiredis

from disque_py.core.replies import NULL_ARRAY, OK, Error, Status
from disque_py.core.statics import ERROR, NULL_ARRAY_TYPE, STATUS

__all__ = [
    "BULK_SLACK",
    "INCOMPLETE",
    "ProtocolError",
    "ReplyParser",
    "RequestParser",
    "encode",
    "encode_reply",
    "encode_reply3",
    "encode_request",
    "split_inline",
]

#: Slack over ``max_bulk_len`` tolerated in hiredis' buffer for an incomplete
#: request: 1023 uncompacted consumed bytes + a 23-byte ``$<len>\r\n`` header
#: + CRLF, rounded up.  See "Limits" in the module docstring.
BULK_SLACK: Final = 2048


class _Incomplete:
    __slots__ = ()

    def __repr__(self) -> str:
        return "INCOMPLETE"


#: Returned by :meth:`ReplyParser.gets` when no complete reply is buffered.
INCOMPLETE: Final = _Incomplete()

_PROTO: Final = "ERR Protocol error: "
_E_MULTIBULK: Final = _PROTO + "invalid multibulk length"
_E_BULK: Final = _PROTO + "invalid bulk length"
_E_INLINE: Final = _PROTO + "too big inline request"
_E_QUOTES: Final = _PROTO + "unbalanced quotes in request"
_E_QUERYBUF: Final = _PROTO + "query buffer limit exceeded"


class ProtocolError(Exception):
    """Malformed or over-limit request; the connection must be closed.

    ``reply_text`` is the error line to send (without ``-`` and CRLF), e.g.
    ``"ERR Protocol error: invalid bulk length"``; ``reply`` is the same as
    an :class:`~disque_py.core.replies.Error` ready for :func:`encode`.
    """

    def __init__(self, reply_text: str) -> None:
        super().__init__(reply_text)
        self.reply_text = reply_text

    @property
    def reply(self) -> Error:
        return Error(self.reply_text)


# --------------------------------------------------------------------------
# inline requests
# --------------------------------------------------------------------------

_WS: Final = frozenset(b" \t\n\r\x0b\x0c")
_HEX: Final = frozenset(b"0123456789abcdefABCDEF")
_DQ_ESCAPES: Final = {ord("n"): 10, ord("r"): 13, ord("t"): 9, ord("b"): 8, ord("a"): 7}


def split_inline(line: bytes) -> list[bytes]:
    """Split one inline request line into arguments.

    Arguments are separated by ASCII whitespace (space, ``\t \n \r \v
    \f``; NUL is an ordinary byte, unlike in Redis).  ``"double quoted"`` parts
    understand ``\\n \\r \\t \\b \\a \\xHH`` and ``\\<any>`` (the char
    itself); ``'single quoted'`` parts only ``\\'``.  A quote may start in
    the middle of an argument (``a"b c"`` is ``ab c``) but the closing quote
    must be followed by whitespace or the end of the line.  Violations raise
    :class:`ProtocolError` ("unbalanced quotes in request").
    """
    if b'"' not in line and b"'" not in line:
        return line.split()
    args: list[bytes] = []
    n = len(line)
    i = 0
    while True:
        while i < n and line[i] in _WS:
            i += 1
        if i >= n:
            return args
        cur = bytearray()
        while i < n:
            c = line[i]
            if c in _WS:
                break
            if c == 0x22:  # "
                i += 1
                while True:
                    if i >= n:
                        raise ProtocolError(_E_QUOTES)
                    c = line[i]
                    if c == 0x5C and i + 1 < n:  # backslash
                        nxt = line[i + 1]
                        if (
                            nxt == 0x78  # x
                            and i + 3 < n
                            and line[i + 2] in _HEX
                            and line[i + 3] in _HEX
                        ):
                            cur.append(int(line[i + 2 : i + 4], 16))
                            i += 4
                        else:
                            cur.append(_DQ_ESCAPES.get(nxt, nxt))
                            i += 2
                    elif c == 0x22:
                        i += 1
                        break
                    else:
                        cur.append(c)
                        i += 1
                if i < n and line[i] not in _WS:
                    raise ProtocolError(_E_QUOTES)
                break
            if c == 0x27:  # '
                i += 1
                while True:
                    if i >= n:
                        raise ProtocolError(_E_QUOTES)
                    c = line[i]
                    if c == 0x5C and i + 1 < n and line[i + 1] == 0x27:
                        cur.append(0x27)
                        i += 2
                    elif c == 0x27:
                        i += 1
                        break
                    else:
                        cur.append(c)
                        i += 1
                if i < n and line[i] not in _WS:
                    raise ProtocolError(_E_QUOTES)
                break
            cur.append(c)
            i += 1
        args.append(bytes(cur))


# --------------------------------------------------------------------------
# request parser
# --------------------------------------------------------------------------

_EMPTY: Final = b""
_JOIN_MAX: Final = 64 * 1024  # fast-path element check by b"".join up to this size
_NED: Final = object()  # hiredis "not enough data" sentinel (False is #f)

# RESP type byte hiredis must have read to produce a value of this type.
_TYPE_BYTE: Final = {
    int: "':'",
    float: "','",
    bool: "'#'",
    dict: "'%'",
    list: "'*'",
    hiredis.PushNotification: "'>'",
    hiredis.ReplyError: "'-'",
    bytes: "'$'",
}


def _element_error(value: object) -> str:
    if value is None:  # $-1 or _
        return _E_BULK
    return _PROTO + "expected '$', got " + _TYPE_BYTE.get(type(value), "'?'")


def _hiredis_error(exc: BaseException) -> str:
    if isinstance(exc, MemoryError):
        return _E_MULTIBULK
    text = str(exc)
    low = text.lower()
    if "multi-bulk length" in low:
        return _E_MULTIBULK
    if "bulk string length" in low:
        return _E_BULK
    if "as reply type byte" in low:
        # 'Protocol error, got "P" as reply type byte'
        q = text.find('"')
        ch = text[q + 1 : text.rfind('"')] if q >= 0 else "?"
        return _PROTO + f"expected '$' or '*', got '{ch}'"
    return _PROTO + (text or type(exc).__name__)


@final
class RequestParser:
    """Incremental parser of client requests into argv lists.

    ``feed(data)`` parses eagerly and never raises; ``commands()`` returns
    (and forgets) every command completed so far.  After malformed input,
    ``error`` holds the :class:`ProtocolError`, further data is ignored, and
    ``commands()`` -- once it has returned the commands completed before the
    bad bytes -- raises that error.  See the module docstring for the limits.
    """

    __slots__ = (
        "max_bulk_len",
        "max_args",
        "max_inline_len",
        "max_query_buffer",
        "error",
        "_reader",
        "_ready",
        "_mid",
        "_partial_line",  # (not "_inline": mypyc would name its C field __inline, a C keyword)
        "_pending",
        "_check_over",
        "_count_digits",
        "_short_counts_ok",
        "_join_max",
        "_e_args",
        "_e_bulk",
        "_e_inline",
        "_e_querybuf",
    )

    def __init__(
        self,
        *,
        max_bulk_len: int = 512 * 1024 * 1024,
        max_args: int = 1024 * 1024,
        max_inline_len: int = 64 * 1024,
        max_query_buffer: int = 1024 * 1024 * 1024,
    ) -> None:
        if min(max_bulk_len, max_args, max_inline_len, max_query_buffer) < 1:
            raise ValueError("parser limits must be positive")
        self.max_bulk_len = max_bulk_len
        self.max_args = max_args
        self.max_inline_len = max_inline_len
        self.max_query_buffer = max_query_buffer
        self.error: ProtocolError | None = None
        self._reader = hiredis.Reader(notEnoughData=_NED)
        self._ready: list[list[bytes]] = []
        self._mid = False  # hiredis is inside a request
        self._partial_line = bytearray()  # partial inline line (only when not _mid)
        self._pending = 0  # upper bound of bytes of the current request
        # Per-request length/count checks are only needed above this many
        # bytes (see "Limits" in the module docstring).
        self._check_over = min(max_bulk_len, 3 * max_args)
        self._count_digits = len(str(max_args))
        self._short_counts_ok = max_args >= 99
        self._join_max = min(_JOIN_MAX, self._check_over)
        # Over a limit: Redis's text, then the limit and the directive that sets it (in a
        # node; tests make parsers of their own). A malformed length keeps the bare text.
        self._e_args = _E_MULTIBULK + " (over proto-max-multibulk-len %d)" % max_args
        self._e_bulk = _E_BULK + " (over proto-max-bulk-len %d)" % max_bulk_len
        self._e_inline = _E_INLINE + " (a line over %d bytes; longer requests go as multibulk)" % max_inline_len
        self._e_querybuf = _E_QUERYBUF + " (client-query-buffer-limit %d)" % max_query_buffer

    # -- public API ---------------------------------------------------------

    def feed(self, data: bytes | bytearray | memoryview) -> None:
        """Parse ``data``; complete commands are queued for :meth:`commands`.

        Never raises: malformed input sets :attr:`error` (see the class doc).
        """
        if self.error is not None or not data:
            return
        pos = 0
        was_mid = self._mid
        if not self._mid:
            if type(data) is memoryview:
                data = data.tobytes()
            if self._partial_line or data[0] != 42:  # not '*': inline request(s)
                inline = self._partial_line
                if inline:
                    # Continue the buffered partial line.  Without a newline
                    # just append (amortized O(1): a line sent byte by byte
                    # must not cost O(n^2)).
                    if data.find(b"\n") < 0:
                        inline += data
                        if self._inline_too_long(inline, 0):
                            self._fail(self._e_inline)
                        return
                    data = inline + data
                    self._partial_line = bytearray()
                pos = self._feed_inline(data)
                if pos < 0:
                    return
            # A new multibulk request starts at data[pos]: pre-check its
            # count before hiredis allocates a list that large.  Counts of
            # 1 or 2 digits (nearly all requests) are always fine.
            if (
                not self._short_counts_ok
                or len(data) - pos < 4
                or (data[pos + 2] != 13 and data[pos + 3] != 13)
            ) and self._header_too_big(data, pos):
                self._fail(self._e_args)
                return
        reader = self._reader
        reader.feed(data, pos)  # type: ignore[arg-type]  # hiredis takes any buffer
        n = len(data) - pos
        pending = self._pending + n
        small = pending <= self._join_max
        ready = self._ready
        start = len(ready)
        has_data = reader.has_data
        gets = reader.gets
        # data is not empty, so the loop runs at least once.  It ends through
        # ``else`` exactly when the last gets() returned a request and left no
        # byte behind: a request boundary.
        while has_data():
            try:
                msg = gets()
            except Exception as exc:  # hiredis.ProtocolError, MemoryError, ...
                if self._skip_stray_newlines(exc, data, pos, was_mid, ready[start:]):
                    return
                self._fail(_hiredis_error(exc))
                return
            if msg is _NED:
                break
            if type(msg) is list and msg:
                if small:
                    # join() copies, but only small data, and rejects in C
                    # any element that is not bytes-like (hiredis only makes
                    # bytes): cheaper than a per-argument type loop.
                    try:
                        _EMPTY.join(msg)
                    except TypeError:
                        pass
                    else:
                        ready.append(msg)
                        continue
                elif pending <= self._check_over:
                    for arg in msg:
                        if type(arg) is not bytes:
                            break
                    else:
                        ready.append(msg)
                        continue
            err = self._check(msg)
            if err is not None:
                self._fail(err)
                return
        else:
            self._mid = False
            self._pending = 0
            return
        # In the middle of a request.  If this feed completed requests (or
        # skipped *0 ones: then the bound is merely looser), the current one
        # started inside this chunk.
        self._mid = True
        self._pending = pending = n if len(ready) > start else pending
        if reader.len() > self.max_bulk_len + BULK_SLACK:
            self._fail(self._e_bulk)
        elif pending > self.max_query_buffer:
            self._fail(self._e_querybuf)

    def commands(self) -> list[list[bytes]]:
        """Return and forget the commands completed so far.

        Raises the stored :class:`ProtocolError` when there is none left to
        return and the input was malformed.
        """
        ready = self._ready
        if ready:
            self._ready = []
            return ready
        if self.error is not None:
            raise self.error
        return []  # never hand out the internal list

    # -- internals ----------------------------------------------------------

    def _skip_stray_newlines(self, exc: BaseException, data, pos: int, was_mid: bool, done: list) -> bool:
        """Recover from CR/LF between two multibulk requests of one read.

        Redis reads such bytes as an empty inline line and ignores them;
        ``redis-cli --pipe`` relies on it (it sends ``\r\n`` before its
        closing ECHO). hiredis instead fails on the type byte and does not
        say where. Only on that error, the failure offset is rebuilt from the
        canonical encodings of the requests this read completed, checked
        byte for byte against ``data``, and parsing resumes after the stray
        bytes with a fresh reader. Anything that does not check out (a
        client with non-canonical lengths, other junk) stays an error.
        """
        text = str(exc)
        if not done or ('"\\r"' not in text and '"\\n"' not in text):  # hiredis escapes them
            return False
        encoded = [encode_request(argv) for argv in done]
        first, tail = encoded[0], b"".join(encoded[1:])
        n = len(data)
        end = -1
        if not was_mid:  # the first request started at ``pos``
            cut = pos + len(first) + len(tail)
            if data[pos:cut] == first + tail and cut < n and data[cut] in (10, 13):
                end = cut
        else:  # the first request started in an earlier read
            for p1 in range(min(len(first), n), 0, -1):
                cut = p1 + len(tail)
                if cut < n and data[cut] in (10, 13) and data[p1:cut] == tail and first.endswith(data[:p1]):
                    end = cut
                    break
        if end < 0:
            return False
        while end < n and data[end] in (10, 13, 32, 9):
            end += 1
        self._reader = hiredis.Reader(notEnoughData=_NED)
        self._mid = False
        self._pending = 0
        if end < n:
            self.feed(data[end:])
        return True

    def _fail(self, text: str) -> None:
        self.error = ProtocolError(text)
        self._reader = None  # type: ignore[assignment]  # free its buffer
        self._partial_line = bytearray()
        self._mid = False

    def _feed_inline(self, data: bytes | bytearray) -> int:
        """Parse inline lines from the start of ``data``.

        Returns the offset of a multibulk request met at a line boundary, or
        -1 when everything was consumed (or an error was recorded).
        """
        ready = self._ready
        limit = self.max_inline_len
        n = len(data)
        pos = 0
        while pos < n:
            if data[pos] == 42:  # '*' at a line boundary: multibulk again
                return pos
            nl = data.find(b"\n", pos)
            if nl < 0:
                if self._inline_too_long(data, pos):
                    self._fail(self._e_inline)
                else:
                    self._partial_line = bytearray(data[pos:])
                return -1
            end = nl - 1 if nl > pos and data[nl - 1] == 13 else nl
            if end - pos > limit:
                self._fail(self._e_inline)
                return -1
            line = bytes(data[pos:end])
            pos = nl + 1
            try:
                argv = split_inline(line)
            except ProtocolError as exc:
                self._fail(exc.reply_text)
                return -1
            if argv:
                # Same guarantees as for multibulk requests (only reachable
                # when max_inline_len is configured above them).
                if len(argv) > self.max_args:
                    self._fail(self._e_args)
                    return -1
                if limit > self.max_bulk_len and max(map(len, argv)) > self.max_bulk_len:
                    self._fail(self._e_bulk)
                    return -1
                ready.append(argv)
        return -1

    def _inline_too_long(self, buf: bytes | bytearray, pos: int) -> bool:
        """Is the unterminated line buf[pos:] over max_inline_len?  One more
        byte is allowed if it is the CR of a CRLF split across reads."""
        rest = len(buf) - pos
        limit = self.max_inline_len
        return rest > limit and not (rest == limit + 1 and buf[-1] == 13)

    def _header_too_big(self, data: bytes | bytearray, pos: int) -> bool:
        """Is the ``*N`` count starting at data[pos] known to exceed max_args?"""
        d = self._count_digits
        end = data.find(b"\r", pos + 1, pos + d + 2)
        if end < 0:
            # d+1 bytes without CR: all digits means N > max_args
            return len(data) >= pos + d + 2 and bytes(data[pos + 1 : pos + d + 2]).isdigit()
        if end - pos - 1 != d:
            return False
        digits = bytes(data[pos + 1 : end])
        return digits.isdigit() and int(digits) > self.max_args

    def _check(self, msg: Any) -> str | None:
        """Slow path for one parsed request: queue it if it is a valid
        command, skip it if it is ``*0``/``*-1``, else return the error."""
        if type(msg) is not list:
            if msg is None:  # *-1
                return None
            return _PROTO + "expected '*', got " + _TYPE_BYTE.get(type(msg), "'?'")
        if not msg:  # *0
            return None
        if len(msg) > self.max_args:
            return self._e_args
        max_bulk = self.max_bulk_len
        for arg in msg:
            if type(arg) is not bytes:
                return _element_error(arg)
            if len(arg) > max_bulk:
                return self._e_bulk
        self._ready.append(msg)
        return None


# --------------------------------------------------------------------------
# reply encoding
# --------------------------------------------------------------------------

_CRLF: Final = b"\r\n"
_NULL_BULK: Final = b"$-1\r\n"
_NULL_ARRAY: Final = b"*-1\r\n"
_OK: Final = b"+OK\r\n"
_SMALL: Final = 1024
_BULK_HDR: Final = [b"$%d\r\n" % i for i in range(_SMALL)]
_ARRAY_HDR: Final = [b"*%d\r\n" % i for i in range(_SMALL)]
_INT: Final = [b":%d\r\n" % i for i in range(_SMALL)]


_NO_CRLF: Final = bytes(range(256)).replace(b"\r", b" ").replace(b"\n", b" ")


def _clean_error(value: str) -> bytes:
    if "\r" in value or "\n" in value:
        value = value.replace("\r", " ").replace("\n", " ")
    return value.encode("utf-8", "surrogateescape")


def encode_reply(value: Any, out: bytearray) -> None:
    """Append the RESP2 encoding of ``value`` to ``out``.

    See :mod:`disque_py.core.replies` for the mapping; unknown types raise
    ``TypeError`` (``out`` may then hold a partial encoding).
    """
    t = type(value)
    if t is bytes:
        n = len(value)
        out += _BULK_HDR[n] if n < _SMALL else b"$%d\r\n" % n
        out += value
        out += _CRLF
    elif t is list or t is tuple:
        n = len(value)
        out += _ARRAY_HDR[n] if n < _SMALL else b"*%d\r\n" % n
        for item in value:
            if type(item) is bytes:
                n = len(item)
                out += _BULK_HDR[n] if n < _SMALL else b"$%d\r\n" % n
                out += item
                out += _CRLF
            else:
                encode_reply(item, out)
    elif t is STATUS:
        # Statuses are made by the node (job IDs, pause states), never
        # copied from input, so no CR/LF check on this hot path.
        out += b"+"
        out += value
        out += _CRLF
    elif t is int:
        out += _INT[value] if 0 <= value < _SMALL else b":%d\r\n" % value
    elif value is None:
        out += _NULL_BULK
    elif t is str:
        b = value.encode("utf-8", "surrogateescape")
        out += b"$%d\r\n" % len(b)
        out += b
        out += _CRLF
    elif t is ERROR:
        out += b"-"
        out += _clean_error(value)
        out += _CRLF
    elif t is NULL_ARRAY_TYPE:
        out += _NULL_ARRAY
    elif t is bool:
        out += b":1\r\n" if value else b":0\r\n"
    else:
        _encode_other(value, out)


def _encode_other(value: Any, out: bytearray) -> None:
    # Subclasses and less common types; order matters (Status is bytes,
    # Error is str, bool is int).
    if isinstance(value, Status):
        out += b"+%s\r\n" % bytes(value).translate(_NO_CRLF)
    elif isinstance(value, Error):
        out += b"-"
        out += _clean_error(str(value))
        out += _CRLF
    elif isinstance(value, (bytes, bytearray)):
        out += b"$%d\r\n" % len(value)
        out += value
        out += _CRLF
    elif isinstance(value, memoryview):
        flat = value.cast("B") if value.c_contiguous else value.tobytes()
        out += b"$%d\r\n" % len(flat)
        out += flat
        out += _CRLF
    elif isinstance(value, int):
        out += b":%d\r\n" % int(value)
    elif isinstance(value, str):
        encode_reply(str(value), out)
    elif isinstance(value, (list, tuple)):
        out += b"*%d\r\n" % len(value)
        for item in value:
            encode_reply(item, out)
    elif value is NULL_ARRAY:
        out += _NULL_ARRAY
    elif isinstance(value, dict):  # a map: flat [key, value, ...] in RESP2
        out += b"*%d\r\n" % (2 * len(value))
        for key, item in value.items():
            encode_reply(key, out)
            encode_reply(item, out)
    else:
        raise TypeError(f"cannot encode {type(value).__name__!s} as a RESP reply")


def encode_reply3(value: Any, out: bytearray) -> None:
    """Append the RESP3 encoding of ``value`` (for clients that sent ``HELLO 3``).

    Identical to RESP2 except that nulls are ``_`` (RESP3 parsers need not
    understand ``$-1``/``*-1``) and dicts are maps (``%``).
    """
    t = type(value)
    if value is None or t is NULL_ARRAY_TYPE:
        out += b"_\r\n"
    elif t is list or t is tuple:
        n = len(value)
        out += _ARRAY_HDR[n] if n < _SMALL else b"*%d\r\n" % n
        for item in value:
            encode_reply3(item, out)
    elif t is dict:
        out += b"%%%d\r\n" % len(value)
        for key, item in value.items():
            encode_reply3(key, out)
            encode_reply3(item, out)
    else:
        encode_reply(value, out)


def encode(value: Any) -> bytes:
    """The RESP2 encoding of ``value`` as ``bytes``."""
    out = bytearray()
    encode_reply(value, out)
    return bytes(out)


def encode_request(argv: list[bytes | str | int] | tuple[bytes | str | int, ...]) -> bytes:
    """A request as a multibulk array of bulk strings (str is UTF-8,
    int is its decimal text)."""
    out = bytearray(b"*%d\r\n" % len(argv))
    for arg in argv:
        if isinstance(arg, str):
            arg = arg.encode()
        elif isinstance(arg, int):
            arg = b"%d" % arg
        out += b"$%d\r\n" % len(arg)
        out += arg
        out += _CRLF
    return bytes(out)


# --------------------------------------------------------------------------
# reply parsing (client side)
# --------------------------------------------------------------------------


@final
class ReplyParser:
    """Incremental parser of server replies, backed by ``hiredis.Reader``.

    Bulk and simple strings come back as ``bytes`` (or ``str`` when an
    ``encoding`` is given), integers as ``int``, arrays as ``list``, both
    nulls (``$-1`` and ``*-1``) as ``None``, and error replies as
    ``hiredis.ReplyError`` instances (returned, not raised).  Malformed
    input raises :class:`ProtocolError`.
    """

    __slots__ = ("_reader",)

    def __init__(self, *, encoding: str | None = None) -> None:
        if encoding is None:
            self._reader = hiredis.Reader(notEnoughData=INCOMPLETE)
        else:
            self._reader = hiredis.Reader(notEnoughData=INCOMPLETE, encoding=encoding)

    def feed(self, data: bytes | bytearray | memoryview) -> None:
        if data:
            self._reader.feed(data)  # type: ignore[arg-type]  # hiredis takes any buffer

    def gets(self) -> Any:
        """The next complete reply, or :data:`INCOMPLETE`."""
        try:
            return self._reader.gets()
        except hiredis.ProtocolError as exc:
            raise ProtocolError(_PROTO + str(exc)) from None

    def replies(self) -> list[Any]:
        """All complete replies buffered so far."""
        out = []
        while (reply := self.gets()) is not INCOMPLETE:
            out.append(reply)
        return out
