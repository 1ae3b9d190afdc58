"""What ``disque-py cli`` needs besides click: a blocking RESP connection that keeps every
reply's type, and the two ways redis-cli prints a reply.

Why not redis-py: it turns replies into Python values (INFO into a dict, CONFIG GET into
another, status and bulk strings into the same bytes), and the command line must print
what the node sent, as redis-cli does. Why not hiredis alone: its Python reader does not
say a status from a bulk string either. The parser below is small and only serves a
person at a terminal or a shell script, so speed does not matter here.

Printing follows redis-cli 7 (checked against ``redis-cli`` on a live node; see
tests/integration/test_cli_process.py):

* on a terminal (``tty`` mode): ``(integer) 1``, ``(nil)``, ``(error) ERR ...``, bulk
  strings quoted with C escapes, arrays numbered and indented, ``(empty array)``, RESP3
  maps as ``1# key => value``, sets with ``~``, ``(double)``, ``(true)``;
* piped, or ``--raw``: one item a line, strings as they are, nil an empty line, an error
  followed by an empty line;
* a few commands whose reply is text made for people (INFO, CLUSTER NODES, CLUSTER INFO,
  CLIENT LIST, LATENCY DOCTOR ...) are printed as they came in both modes: real newlines.

The connection's first exchange is a probe, bounded by the timeout: ``PING`` followed by
an empty line. A node answers the PING (and ignores the empty line, as Redis does); an
HTTP server answers ``400`` at once (the empty line ends its request); a TLS server
answers with an alert. Each is recognised and said in one line with what to do
(:class:`WrongPort`), instead of waiting or printing a traceback.
"""

from __future__ import annotations

import socket
import ssl
import time
from collections.abc import Sequence

__all__ = [
    "Bool",
    "Connection",
    "ConnectFailed",
    "Double",
    "ErrorReply",
    "Map",
    "Push",
    "ReplyLost",
    "RespSet",
    "Status",
    "Verbatim",
    "WrongPort",
    "format_raw",
    "format_tty",
    "is_verbatim_command",
    "render",
]

# ----------------------------------------------------------------------------- reply types


class Status(bytes):
    """``+OK``: printed bare."""


class ErrorReply(bytes):
    """``-ERR ...``."""


class Verbatim(bytes):
    """RESP3 ``=``: text printed as it is, even on a terminal (the ``txt:`` tag dropped)."""


class Double(bytes):
    """RESP3 ``,``: kept as the node wrote it."""


class BigNumber(bytes):
    """RESP3 ``(``: kept as the node wrote it."""


class Bool:
    __slots__ = ("value",)

    def __init__(self, value: bool) -> None:
        self.value = value

    def __repr__(self) -> str:
        return "Bool(%r)" % self.value


class Map(list):
    """RESP3 ``%``: keys and values alternate, in the node's order."""


class RespSet(list):
    """RESP3 ``~``."""


class Push(list):
    """RESP3 ``>``."""


class ProtocolError(Exception):
    """Bytes that are not RESP."""


_NEED_MORE = object()


def _parse(buf: bytes, pos: int):
    """One reply from ``buf[pos:]``: ``(reply, next position)``, or ``(_NEED_MORE, pos)``."""
    end = buf.find(b"\r\n", pos)
    if end < 0:
        if len(buf) - pos > 1 and buf[pos : pos + 1] not in b"+-:$*%~>_#,(=|!":
            raise ProtocolError("not RESP")
        return _NEED_MORE, pos
    kind, line, nxt = buf[pos : pos + 1], buf[pos + 1 : end], end + 2
    try:
        if kind == b"+":
            return Status(line), nxt
        if kind == b"-":
            return ErrorReply(line), nxt
        if kind == b":":
            return int(line), nxt
        if kind == b"_":
            return None, nxt
        if kind == b"#":
            return Bool(line == b"t"), nxt
        if kind == b",":
            return Double(line), nxt
        if kind == b"(":
            return BigNumber(line), nxt
        if kind in (b"$", b"=", b"!"):
            n = int(line)
            if n < 0:
                return None, nxt
            if len(buf) < nxt + n + 2:
                return _NEED_MORE, pos
            data = buf[nxt : nxt + n]
            if kind == b"$":
                return data, nxt + n + 2
            if kind == b"!":
                return ErrorReply(data), nxt + n + 2
            return Verbatim(data[4:] if data[3:4] == b":" else data), nxt + n + 2
        if kind in (b"*", b"%", b"~", b">", b"|"):
            n = int(line)
            if n < 0:
                return None, nxt
            count = n * 2 if kind in (b"%", b"|") else n
            items = []
            at = nxt
            for _ in range(count):
                item, at = _parse(buf, at)
                if item is _NEED_MORE:
                    return _NEED_MORE, pos
                items.append(item)
            if kind == b"|":  # an attribute comes before the reply it describes: skip it
                return _parse(buf, at)
            cls = {b"*": list, b"%": Map, b"~": RespSet, b">": Push}[kind]
            return cls(items), at
    except ValueError:
        raise ProtocolError("bad RESP line %r" % bytes(buf[pos : end][:40])) from None
    raise ProtocolError("not RESP")


# ----------------------------------------------------------------------------- printing

# Commands whose reply is text laid out for people: printed as it came, in both modes.
_VERBATIM = {
    b"info": None,
    b"lolwut": None,
    b"debug": (2, (b"htstats", b"htstats-key", b"client-eviction")),
    b"memory": (2, (b"malloc-stats", b"doctor")),
    b"cluster": (-2, (b"nodes", b"info")),  # negative: exactly that many words
    b"client": (2, (b"list", b"info")),
    b"latency": (0, ()),  # special: GRAPH with 3 words, DOCTOR with 2
    b"proxy": (2, (b"info",)),
}


def is_verbatim_command(argv: Sequence[bytes | str]) -> bool:
    """True for the commands redis-cli prints verbatim (their reply is text with newlines)."""
    if not argv:
        return False
    words = [a.encode("utf-8", "surrogateescape") if isinstance(a, str) else bytes(a) for a in argv]
    name = words[0].lower()
    if name not in _VERBATIM:
        return False
    rule = _VERBATIM[name]
    if rule is None:
        return True
    sub = words[1].lower() if len(words) > 1 else b""
    if name == b"latency":
        return (len(words) == 3 and sub == b"graph") or (len(words) == 2 and sub == b"doctor")
    count, subs = rule
    enough = len(words) == -count if count < 0 else len(words) >= count
    return enough and sub in subs


#: redis-cli's escapes inside a quoted string; other bytes outside printable ASCII are \xNN
_ESCAPES = {0x5C: b"\\\\", 0x22: b'\\"', 0x0A: b"\\n", 0x0D: b"\\r", 0x09: b"\\t", 0x07: b"\\a", 0x08: b"\\b"}


def quote(data: bytes) -> bytes:
    """A string as redis-cli shows it on a terminal: in double quotes, C escapes for the rest."""
    out = bytearray(b'"')
    for byte in data:
        escaped = _ESCAPES.get(byte)
        if escaped is not None:
            out += escaped
        elif 0x20 <= byte < 0x7F:
            out.append(byte)
        else:
            out += b"\\x%02x" % byte
    out += b'"'
    return bytes(out)


def _multiline(reply) -> bool:
    if isinstance(reply, Map):
        return len(reply) > 2 or (len(reply) == 2 and _multiline(reply[1]))
    if isinstance(reply, list):
        return len(reply) > 1 or (len(reply) == 1 and _multiline(reply[0]))
    return False


_EMPTY = {Map: b"(empty hash)\n", RespSet: b"(empty set)\n", Push: b"(empty push)\n"}


def format_tty(reply, prefix: bytes = b"") -> bytes:
    """The terminal form: one or more lines, each ending with a newline."""
    if isinstance(reply, ErrorReply):
        return b"(error) " + reply + b"\n"
    if isinstance(reply, Status):
        return bytes(reply) + b"\n"
    if isinstance(reply, Bool):
        return b"(true)\n" if reply.value else b"(false)\n"
    if isinstance(reply, int):
        return b"(integer) %d\n" % reply
    if isinstance(reply, Double):
        return b"(double) " + reply + b"\n"
    if isinstance(reply, BigNumber):
        return b"(big number) " + reply + b"\n"
    if isinstance(reply, Verbatim):
        return bytes(reply) + b"\n"
    if isinstance(reply, bytes):
        return quote(reply) + b"\n"
    if reply is None:
        return b"(nil)\n"
    if isinstance(reply, list):
        if not reply:
            return _EMPTY.get(type(reply), b"(empty array)\n")
        is_map = isinstance(reply, Map)
        count = len(reply) // 2 if is_map else len(reply)
        width = len(str(count))
        inner = prefix + b" " * (width + 2)
        mark = b"#" if is_map else b"~" if isinstance(reply, RespSet) else b")"
        out = bytearray()
        step = 2 if is_map else 1
        for n, i in enumerate(range(0, len(reply), step), 1):
            out += (prefix if i else b"") + b"%*d" % (width, n) + mark + b" "
            out += format_tty(reply[i], inner)
            if is_map:
                del out[-1:]  # the key's newline: its value follows on the same line
                out += b" => "
                if _multiline(reply[i + 1]):
                    out += b"\n" + inner
                out += format_tty(reply[i + 1], inner)
        return bytes(out)
    return str(reply).encode() + b"\n"


def format_raw(reply) -> bytes:
    """The piped form (no final newline: :func:`render` adds it): items one a line, as they are."""
    if reply is None:
        return b""
    if isinstance(reply, ErrorReply):
        return bytes(reply) + b"\n"
    if isinstance(reply, Bool):
        return b"(true)" if reply.value else b"(false)"
    if isinstance(reply, int):
        return b"%d" % reply
    if isinstance(reply, bytes):
        return bytes(reply)
    if isinstance(reply, Map):
        return b"\n".join(format_raw(reply[i]) + b" " + format_raw(reply[i + 1]) for i in range(0, len(reply), 2))
    if isinstance(reply, list):
        return b"\n".join(format_raw(item) for item in reply)
    return str(reply).encode()


def render(reply, *, raw: bool, verbatim: bool = False) -> bytes:
    """What redis-cli writes for ``reply``: ``verbatim`` for :func:`is_verbatim_command`'s commands."""
    if verbatim:
        return format_raw(reply)
    if raw:
        return format_raw(reply) + b"\n"
    return format_tty(reply)


# ----------------------------------------------------------------------------- the connection


class ConnectFailed(Exception):
    """No connection (refused, unreachable, timed out, TLS failed): ``str()`` is one line."""


class WrongPort(ConnectFailed):
    """Something answered, but not a disque-py client port: ``str()`` says what it is."""


class ReplyLost(Exception):
    """The connection broke during a command."""


def _pack(argv: Sequence[bytes | str]) -> bytes:
    out = [b"*%d\r\n" % len(argv)]
    for arg in argv:
        # surrogateescape: the bytes of a command-line argument that is not UTF-8, as they were
        data = arg.encode("utf-8", "surrogateescape") if isinstance(arg, str) else bytes(arg)
        out.append(b"$%d\r\n%s\r\n" % (len(data), data))
    return b"".join(out)


# A node answers the PING and ignores the empty line after it (an inline command with no
# words); an HTTP/1.1 server takes the empty line as the end of a malformed request and
# answers 400 at once, where it would otherwise wait for the rest of the request.
_PROBE = _pack([b"PING"]) + b"\r\n"


def _tls_record(data: bytes) -> bool:
    """A TLS record header: an alert (21) or a handshake (22), version 3.x."""
    return len(data) >= 2 and data[0] in (21, 22) and data[1] == 3


def _answers_resp(host: str, port: int, timeout: float) -> bool:
    """Does ``host:port`` answer a PING in RESP (a reply of any kind, an error too)?"""
    if not 0 < port < 65536:
        return False
    try:
        with socket.create_connection((host, port), timeout=timeout) as sock:
            sock.settimeout(timeout)
            sock.sendall(_PROBE)
            data = sock.recv(64)
    except OSError:
        return False
    return data[:1] in (b"+", b"-")


def _speaks_tls(host: str, port: int, timeout: float) -> bool:
    """Does ``host:port`` answer a TLS ClientHello with TLS (whatever it thinks of our certificate)?"""
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    context.check_hostname = False
    context.verify_mode = ssl.CERT_NONE
    try:
        with socket.create_connection((host, port), timeout=timeout) as sock:
            with context.wrap_socket(sock, server_hostname=host):
                return True
    except (ssl.SSLEOFError, ssl.SSLZeroReturnError):
        return False
    except ssl.SSLError:  # an alert or a record we did not like: TLS all the same
        return True
    except OSError:
        return False


def _admin_port_of(host: str, port: int, timeout: float) -> int | None:
    """The admin-port of the node at ``host:port`` (None: not known, or no node)."""
    try:
        conn = Connection(host, port, timeout=timeout, probe=False)
    except ConnectFailed:
        return None
    try:
        reply = conn.request([b"CONFIG", b"GET", b"admin-port"], timeout)
    except (ReplyLost, OSError):
        return None
    finally:
        conn.close()
    if isinstance(reply, list) and len(reply) == 2 and isinstance(reply[1], bytes):
        try:
            return int(reply[1])
        except ValueError:
            return None
    return None


# scripts/cluster (disque_py/cli/devcluster.py) and the README put a node's admin port at its client port + 1000;
# the cluster bus is always at the client port + 10000 (cluster_bus, BUS_PORT_OFFSET)
_ADMIN_OFFSET = 1000
_BUS_OFFSET = 10000


class Connection:
    """One blocking connection to a node. ``timeout`` bounds the connect, the TLS handshake and
    the first exchange (the probe, AUTH); a command afterwards waits as long as it takes (GETJOB
    blocks by design) unless :meth:`request` is given a timeout."""

    def __init__(
        self, host: str, port: int, *, timeout: float = 5.0, ssl_context: ssl.SSLContext | None = None,
        password: str | None = None, username: str | None = None, probe: bool = True,
    ) -> None:  # fmt: skip
        self.host, self.port, self.timeout = host, port, timeout
        self.tls = ssl_context is not None
        self._buf = b""
        self._pos = 0
        self.where = "%s:%d" % (host, port)
        try:
            sock = socket.create_connection((host, port), timeout=timeout)
        except socket.timeout:
            raise ConnectFailed("Could not connect to disque-py at %s: no answer in %.1f s (--timeout)"
                                % (self.where, timeout)) from None  # fmt: skip
        except OSError as exc:
            raise ConnectFailed("Could not connect to disque-py at %s: %s" % (self.where, exc.strerror or exc)) from None
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        if ssl_context is not None:
            try:
                sock = ssl_context.wrap_socket(sock, server_hostname=host)
            except socket.timeout:
                sock.close()
                raise ConnectFailed("Could not connect to disque-py at %s: no TLS handshake in %.1f s (is it a "
                                    "TLS port?)" % (self.where, timeout)) from None  # fmt: skip
            except (ssl.SSLError, OSError) as exc:
                sock.close()
                reason = getattr(exc, "reason", None) or exc.strerror or exc
                hint = ""
                if isinstance(exc, ssl.SSLError) and "WRONG_VERSION_NUMBER" in str(exc):
                    hint = ": it does not speak TLS, leave out --tls"
                raise ConnectFailed("Could not connect to disque-py at %s: TLS handshake failed (%s)%s"
                                    % (self.where, reason, hint)) from None  # fmt: skip
        self.sock = sock
        if probe:
            self._probe()
        if password is not None:
            argv = [b"AUTH", password] if username is None else [b"AUTH", username, password]
            try:
                reply = self.request(argv, timeout)
            except ReplyLost as exc:
                self.close()
                raise ConnectFailed(str(exc)) from None
            if isinstance(reply, ErrorReply):
                self.close()
                raise ConnectFailed("AUTH failed: %s" % reply.decode("utf-8", "replace"))

    def _probe(self) -> None:
        try:
            self.sock.settimeout(self.timeout)
            self.sock.sendall(_PROBE)
            reply = self._read(first=True)
        except socket.timeout:
            self.close()
            raise WrongPort("%s accepted the connection but did not answer PING in %.1f s: is it a disque-py "
                            "client port? (--timeout to wait longer)" % (self.where, self.timeout)) from None
        except (ConnectionResetError, ProtocolError, ReplyLost) as exc:
            self.close()
            raise WrongPort(self._what_answered(exc)) from None
        except OSError as exc:
            self.close()
            raise ConnectFailed("Could not connect to disque-py at %s: %s" % (self.where, exc.strerror or exc)) from None
        if isinstance(reply, ErrorReply) and reply.startswith(b"DENIED"):
            self.close()
            raise ConnectFailed("%s refused us: %s" % (self.where, reply.decode("utf-8", "replace")))

    def _what_answered(self, exc: Exception) -> str:
        """One line on what answered our PING instead of a node (see the module docstring)."""
        head = self._buf[:16]
        host, port, timeout = self.host, self.port, min(self.timeout, 1.0)
        if head.startswith(b"HTTP/"):
            client = port - _ADMIN_OFFSET
            if _answers_resp(host, client, timeout) and _admin_port_of(host, client, timeout) == port:
                return ("%s answered HTTP: it is a node's admin port; its client port is %d (disque-py cli -p %d)"
                        % (self.where, client, client))  # fmt: skip
            return ("%s answered HTTP: it is a web server (a node's admin-port?), not a client port; a node's "
                    "client port is its `port` directive (7711 by default)" % self.where)  # fmt: skip
        if _tls_record(head):
            if self.tls:
                return "%s answered with a TLS alert inside TLS: not a disque-py client port" % self.where
            return "%s answered TLS: it is a TLS port (a node's tls-port?): add --tls (and --cacert ...)" % self.where
        if not self._buf and not self.tls and _speaks_tls(host, port, timeout):
            return "%s speaks TLS: it is a TLS port (a node's tls-port?): add --tls (and --cacert ...)" % self.where
        if not self._buf:
            client = port - _BUS_OFFSET
            if client > 0 and _answers_resp(host, client, timeout):
                return ("%s closed the connection without answering: it is a node's cluster bus port; its client "
                        "port is %d (disque-py cli -p %d)" % (self.where, client, client))  # fmt: skip
            return "%s closed the connection without answering PING: not a disque-py client port?" % self.where
        return "%s answered %r, not RESP: not a disque-py client port" % (self.where, bytes(head))

    def _read(self, first: bool = False):
        while True:
            if self._pos < len(self._buf):
                reply, pos = _parse(self._buf, self._pos)
                if reply is not _NEED_MORE:
                    self._buf, self._pos = self._buf[pos:], 0
                    return reply
            data = self.sock.recv(65536)
            if not data:
                raise ReplyLost("%s closed the connection" % self.where)
            self._buf += data

    def request(self, argv: Sequence[bytes | str], timeout: float | None = None):
        """Send one command and return its reply (an error reply is an :class:`ErrorReply`).
        Raises :class:`ReplyLost` when the connection breaks or ``timeout`` passes."""
        try:
            self.sock.settimeout(timeout)
            self.sock.sendall(_pack(argv))
            return self._read()
        except socket.timeout:
            self.close()
            raise ReplyLost("no reply from %s in %.1f s" % (self.where, timeout)) from None
        except ProtocolError as exc:
            self.close()
            raise ReplyLost("%s: protocol error (%s)" % (self.where, exc)) from None
        except OSError as exc:
            self.close()
            raise ReplyLost("%s: %s" % (self.where, exc.strerror or exc)) from None

    def close(self) -> None:
        try:
            self.sock.close()
        except (AttributeError, OSError):
            pass


def sleep(seconds: float) -> None:
    """``-i``: the pause between repeated commands."""
    if seconds > 0:
        time.sleep(seconds)
