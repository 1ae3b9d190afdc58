"""The slow log: the last commands that took at least ``slowlog-log-slower-than`` microseconds.

Fed by the dispatcher (:mod:`.dispatch`, ``run_commands``) only when a command
was slow, so nothing is allocated for the others; read and emptied by SLOWLOG
GET | LEN | RESET (:mod:`.admin`). As Redis: a negative threshold turns it
off, 0 logs every command; the newest entry comes first; an entry keeps at
most :data:`MAX_ARGS` arguments (the last one saying how many more there
were) and each at most :data:`MAX_ARG_BYTES` bytes (then how many more
bytes); ``slowlog-max-len`` is applied as entries are added, so lowering it
trims at the next one; RESET empties the log but IDs keep growing. Secrets
never reach it: the arguments of AUTH, the password of HELLO ... AUTH, the
rules of ACL SETUSER and the value of CONFIG SET of a password directive are
kept as ``(redacted)``.

A leaf: imports nothing of the node.
"""

from __future__ import annotations

import time
from collections import deque
from typing import NamedTuple

__all__ = ["SlowLog", "SlowEntry", "MAX_ARGS", "MAX_ARG_BYTES"]

MAX_ARGS = 32  # arguments kept per entry (Redis's SLOWLOG_ENTRY_MAX_ARGC)
MAX_ARG_BYTES = 128  # bytes kept per argument (Redis's SLOWLOG_ENTRY_MAX_STRING)


class SlowEntry(NamedTuple):
    id: int
    time: int  # unix seconds
    usec: int  # how long the command ran
    args: list[bytes]
    addr: str  # the client's ip:port
    name: bytes  # the client's name (CLIENT SETNAME), b"" if none

    def reply(self) -> list:
        return [self.id, self.time, self.usec, self.args, self.addr.encode(), self.name]


REDACTED = b"(redacted)"
_SECRET_DIRECTIVES = frozenset({b"requirepass", b"tls-key-file-pass", b"cluster-secret", b"user"})


def redact(argv: list[bytes]) -> list[bytes]:
    """``argv`` with passwords replaced by ``(redacted)`` (the same list if it holds none)."""
    name = argv[0].lower()
    if name == b"auth":
        return argv[:1] + [REDACTED] * (len(argv) - 1)
    if name == b"hello":
        out = list(argv)
        for i in range(2, len(out)):
            if b"auth" in (out[i - 1].lower(), out[i - 2].lower()):  # AUTH user pass
                out[i] = REDACTED
        return out
    if name == b"acl" and len(argv) > 3 and argv[1].lower() == b"setuser":
        return argv[:3] + [REDACTED] * (len(argv) - 3)
    if name == b"config" and len(argv) > 3 and argv[1].lower() == b"set" and argv[2].lower() in _SECRET_DIRECTIVES:
        return argv[:3] + [REDACTED] * (len(argv) - 3)
    return argv


def _trim_args(argv: list[bytes]) -> list[bytes]:
    if argv and argv[0].lower() in (b"auth", b"hello", b"acl", b"config"):
        argv = redact(argv)
    n = len(argv)
    keep = argv if n <= MAX_ARGS else argv[: MAX_ARGS - 1]
    args = []
    for a in keep:
        if len(a) > MAX_ARG_BYTES:
            a = a[:MAX_ARG_BYTES] + b"... (%d more bytes)" % (len(a) - MAX_ARG_BYTES)
        args.append(bytes(a))  # a copy: the parser's buffers are not kept alive
    if n > MAX_ARGS:
        args.append(b"... (%d more arguments)" % (n - MAX_ARGS + 1))
    return args


class SlowLog:
    def __init__(self, max_len: int = 128) -> None:
        self.entries: deque[SlowEntry] = deque()  # newest first
        self.max_len = max_len
        self.next_id = 0

    def add(self, argv: list[bytes], usec: int, addr: str, name: bytes) -> None:
        entries = self.entries
        entries.appendleft(SlowEntry(self.next_id, int(time.time()), usec, _trim_args(argv), addr, name or b""))
        self.next_id += 1
        while len(entries) > self.max_len:
            entries.pop()

    def get(self, count: int = 10) -> list[list]:
        """The ``count`` newest entries as SLOWLOG GET replies them (negative: all)."""
        entries = self.entries
        if count < 0 or count >= len(entries):
            return [e.reply() for e in entries]
        return [entries[i].reply() for i in range(count)]

    def __len__(self) -> int:
        return len(self.entries)

    def reset(self) -> None:
        self.entries.clear()
