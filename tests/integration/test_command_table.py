"""COMMAND on a real node: what it says of Disque's commands is what it always said, byte for byte.

The entries are made from the commands' declarations (core/commandspec.py); this pins their
bytes on the wire, as a node process writes them, against the table below (the node's COMMAND
reply before the declarations existed: Disque 1.0-rc1's arities and flags, plus the shell's
commands). Encoded here by hand, not with the project's encoder.
"""

from __future__ import annotations

import socket

import hiredis

from .conftest import read_reply


#: name, arity, flags: the entries COMMAND has always given, in the order COMMAND INFO is asked.
EXPECTED = (
    (b"cluster", -2, (b"admin", b"readonly")),
    (b"auth", -2, (b"readonly", b"loading", b"fast")),
    (b"ping", -1, (b"readonly", b"fast")),
    (b"echo", 2, (b"readonly", b"fast")),
    (b"quit", 1, (b"readonly", b"fast")),
    (b"time", 1, (b"readonly", b"fast")),
    (b"info", -1, (b"readonly", b"loading")),
    (b"command", -1, (b"readonly", b"loading")),
    (b"client", -2, (b"admin", b"readonly")),
    (b"config", -2, (b"admin", b"readonly")),
    (b"shutdown", -1, (b"admin", b"readonly", b"loading")),
    (b"bgrewriteaof", 1, (b"admin", b"readonly")),
    (b"debug", -2, (b"admin",)),
    (b"acl", -2, (b"admin", b"readonly", b"loading")),
    (b"slowlog", -2, (b"admin", b"readonly", b"loading")),
    (b"latency", -2, (b"admin", b"readonly", b"loading")),
    (b"worker", -2, (b"readonly", b"fast")),  # ours (server/workers.py): the workers' beats
    (b"addjob", -4, (b"write", b"denyoom", b"fast")),
    (b"getjob", -2, (b"write", b"fast")),
    (b"ackjob", -1, (b"write", b"fast")),
    (b"fastack", -1, (b"write", b"fast")),
    (b"deljob", -1, (b"write", b"fast")),
    (b"show", 2, (b"readonly", b"fast")),
    (b"qlen", 2, (b"readonly", b"fast")),
    (b"qpeek", 3, (b"readonly",)),
    (b"qstat", 2, (b"readonly", b"fast")),
    (b"qscan", -1, (b"readonly",)),
    (b"jscan", -1, (b"readonly",)),
    (b"enqueue", -1, (b"write", b"denyoom", b"fast")),
    (b"nack", -1, (b"write", b"denyoom", b"fast")),
    (b"dequeue", -1, (b"write", b"fast")),
    (b"working", 2, (b"write", b"fast")),
    (b"pause", -3, (b"readonly", b"fast")),
    (b"hello", 1, (b"readonly", b"fast")),
    (b"release", -2, (b"write", b"fast")),  # ours (core/delivery.py): deliveries given back unstarted
    (b"movejobs", -3, (b"write", b"fast")),  # ours (core/federation.py): a drain moves a node's queued jobs
    (b"group", -2, (b"write", b"fast")),  # ours (core/limits.py): groups' weights and cluster-wide limits
)


def entry_bytes(name: bytes, arity: int, flags: tuple[bytes, ...]) -> bytes:
    out = b"*6\r\n$%d\r\n%s\r\n:%d\r\n*%d\r\n" % (len(name), name, arity, len(flags))
    out += b"".join(b"+%s\r\n" % f for f in flags)
    return out + b":0\r\n:0\r\n:0\r\n"


def raw_reply(node, *argv: bytes) -> bytes:
    """One command's reply exactly as the node wrote it."""
    request = b"*%d\r\n" % len(argv) + b"".join(b"$%d\r\n%s\r\n" % (len(a), a) for a in argv)
    with socket.create_connection((node.host, node.port), timeout=10) as sock:
        sock.sendall(request)
        return read_reply(sock)


def test_command_info_of_every_command_is_byte_identical(node):
    names = [name for name, _, _ in EXPECTED]
    expected = b"*%d\r\n" % len(EXPECTED) + b"".join(entry_bytes(*e) for e in EXPECTED)
    assert raw_reply(node, b"COMMAND", b"INFO", *names) == expected
    upper = raw_reply(node, b"COMMAND", b"INFO", b"NACK", b"nosuch", b"GetJob")
    assert upper == b"*3\r\n" + entry_bytes(*EXPECTED[29]) + b"$-1\r\n" + entry_bytes(*EXPECTED[18])


def test_command_lists_the_same_entries_and_count(node):
    whole = raw_reply(node, b"COMMAND")
    assert whole.startswith(b"*%d\r\n" % len(EXPECTED))
    reader = hiredis.Reader()
    reader.feed(whole)
    got = reader.gets()
    # each entry byte-identical (the array's order follows the declarations' modules: no client reads it)
    assert sorted(entry_bytes(e[0], e[1], tuple(e[2])) for e in got) == sorted(entry_bytes(*e) for e in EXPECTED)
    assert raw_reply(node, b"COMMAND", b"COUNT") == b":%d\r\n" % len(EXPECTED)
    assert sorted(node.client().command_list()) == sorted(name for name, _, _ in EXPECTED)
    # and redis-py reads it as it always did
    table = node.client().command()
    assert table["addjob"]["arity"] == -4 and set(table["nack"]["flags"]) == {"write", "denyoom", "fast"}
