"""Stream consumers as operators see them: named connections in ``CLIENT LIST``, and their lag.

A streaming consumer that is not a worker (a Spark query reading the ``disque`` source) beats
to no node: it names its connections instead (``CLIENT SETNAME``, docs/SPARK.md, "Lag"):

    disque-py-spark:<consumer>:<queue>,<queue>,...

``<consumer>`` is the query's name (letters, digits, ``.``, ``_``, ``-``); each queue name is
percent-encoded (:func:`urllib.parse.quote`, nothing kept but letters, digits and ``_.-~``),
so a name stays what ``CLIENT SETNAME`` accepts (printable ASCII, no spaces) whatever the
queues are called. Nodes keep nothing new: the programs ask every node ``CLIENT LIST``, group
the named connections by consumer (:func:`merge`), and measure each consumer's queues with the
commands any client has (:func:`lag_argvs`, :func:`lag_heads`, :func:`oldest_ms`: QLEN,
QPEEK and SHOW's ctime of each queue's head, on every node). No I/O here: the admin page
(``web/api.py``) drives these steps.

A name is read leniently and bounded: a connection whose name does not parse is not a
consumer, and at most :data:`MAX_QUEUES` queues are measured in all (any client may name
itself anything).
"""

from __future__ import annotations

import os
import re
import socket
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import quote, unquote

__all__ = ["PREFIX", "MAX_QUEUES", "NAME_RE", "client_name", "default_name", "parse_name", "parse_client_list",
           "Consumer", "merge", "measured", "lag_argvs", "lag_heads", "oldest_ms", "settle"]  # fmt: skip

#: How a stream consumer's connection names start (the kind: ``spark``).
PREFIX = "disque-py-spark:"
#: Queues measured at most over every consumer listed (the rest are listed, not measured).
MAX_QUEUES = 1000
#: A consumer's own name.
NAME_RE = re.compile(r"[A-Za-z0-9._-]{1,128}")


def client_name(consumer: str, queues: Iterable[str]) -> str:
    """The ``CLIENT SETNAME`` of a consumer of ``queues``."""
    if not NAME_RE.fullmatch(consumer):
        raise ValueError("a consumer name is 1 to 128 letters, digits, '.', '_' or '-', got %r" % consumer)
    return PREFIX + consumer + ":" + ",".join(quote(q, safe="") for q in queues)


def default_name() -> str:
    """``spark-<host>-<pid>``: the process that runs a query's source, when the query names none."""
    host = re.sub(r"[^A-Za-z0-9.-]", "-", socket.gethostname())[:80] or "host"
    return "spark-%s-%d" % (host, os.getpid())


def parse_name(name: str) -> tuple[str, list[str]] | None:
    """``(consumer, queues)`` from a connection name, None if it is not a consumer's."""
    if not name.startswith(PREFIX):
        return None
    consumer, sep, rest = name[len(PREFIX) :].partition(":")
    if not sep or not NAME_RE.fullmatch(consumer):
        return None
    queues = [unquote(q, errors="replace") for q in rest.split(",") if q]
    return consumer, list(dict.fromkeys(queues))


def parse_client_list(text: Any) -> list[dict[str, str]]:
    """CLIENT LIST's reply (one line per connection, ``key=value`` fields) -> one dict each."""
    if isinstance(text, (bytes, bytearray)):
        text = bytes(text).decode("utf-8", "replace")
    if not isinstance(text, str):
        return []
    out = []
    for line in text.splitlines():
        fields = dict(part.partition("=")[::2] for part in line.split(" ") if "=" in part)
        if fields:
            out.append(fields)
    return out


@dataclass(slots=True)
class Consumer:
    """One consumer over the cluster: its queues, its connections on each node (node ID ->
    count), and, once measured, its lag: jobs queued in its queues on every node, and the age in
    seconds of the oldest of them (None: none queued, or not measured)."""

    name: str
    kind: str
    queues: list[str]
    connections: dict[str, int] = field(default_factory=dict)
    idle: float | None = None  # seconds since the least idle of its connections last sent a command
    queued: int | None = None
    oldest_age: float | None = None
    per_queue: dict[str, dict[str, Any]] = field(default_factory=dict)

    def as_json(self) -> dict[str, Any]:
        per_queue = [{"name": q, **self.per_queue[q]} for q in self.queues if q in self.per_queue]
        return {"name": self.name, "kind": self.kind, "queues": self.queues, "connections": self.connections,
                "idle": self.idle, "queued": self.queued, "oldest_age": self.oldest_age, "per_queue": per_queue}  # fmt: skip


def merge(per_node: Iterable[tuple[str, Any]]) -> list[Consumer]:
    """``(node ID, CLIENT LIST reply)`` pairs -> one :class:`Consumer` per name (its queues the
    union of what its connections say), by name."""
    found: dict[str, Consumer] = {}
    for node_id, reply in per_node:
        for entry in parse_client_list(reply):
            parsed = parse_name(entry.get("name", ""))
            if parsed is None:
                continue
            name, queues = parsed
            c = found.get(name)
            if c is None:
                c = found[name] = Consumer(name=name, kind=PREFIX[len("disque-py-") : -1], queues=[])
            c.queues.extend(q for q in queues if q not in c.queues)
            c.connections[node_id] = c.connections.get(node_id, 0) + 1
            try:
                idle = float(entry.get("idle", ""))
            except ValueError:
                continue
            c.idle = idle if c.idle is None else min(c.idle, idle)
    return sorted(found.values(), key=lambda c: c.name)


def measured(consumers: list[Consumer]) -> tuple[list[str], bool]:
    """The queues to measure (every consumer's, in order, at most :data:`MAX_QUEUES`), and
    whether some were left out."""
    queues = list(dict.fromkeys(q for c in consumers for q in c.queues))
    return queues[:MAX_QUEUES], len(queues) > MAX_QUEUES


def lag_argvs(queues: list[str]) -> list[list[bytes]]:
    """The first round on each node: QLEN and QPEEK 1 of each queue."""
    argvs = []
    for q in queues:
        name = q.encode("utf-8", "surrogateescape")
        argvs += [[b"QLEN", name], [b"QPEEK", name, b"1"]]
    return argvs


def lag_heads(queues: list[str], replies: list[Any]) -> tuple[dict[str, int], dict[str, bytes]]:
    """The first round's replies -> (queue -> jobs queued here, queue -> ID of its oldest job)."""
    lens: dict[str, int] = {}
    heads: dict[str, bytes] = {}
    for i, q in enumerate(queues):
        qlen, peek = replies[2 * i : 2 * i + 2] if len(replies) >= 2 * i + 2 else (None, None)
        if isinstance(qlen, int) and not isinstance(qlen, bool):
            lens[q] = qlen
        if isinstance(peek, list) and peek and isinstance(peek[0], list) and len(peek[0]) >= 2:
            if isinstance(peek[0][1], (bytes, bytearray)):
                heads[q] = bytes(peek[0][1])
    return lens, heads


def oldest_ms(show: Any) -> int | None:
    """The creation time (Unix milliseconds) in a SHOW reply; None for nil or an error."""
    if not isinstance(show, list):
        return None
    for i in range(0, len(show) - 1, 2):
        if show[i] == b"ctime" and isinstance(show[i + 1], int) and show[i + 1] > 0:
            return show[i + 1] // 1_000_000  # Disque's ctime: milliseconds * 1e6
    return None


def settle(consumers: list[Consumer], lens: dict[str, int], oldest: dict[str, int], now_ms: int) -> None:
    """Each consumer's lag from the queues' totals over the cluster (``lens``: jobs queued;
    ``oldest``: the creation time, Unix ms, of the oldest queued job)."""
    for c in consumers:
        mine = [q for q in c.queues if q in lens]
        if not mine:
            continue
        c.queued = sum(lens[q] for q in mine)
        for q in mine:
            age = None if q not in oldest or not lens[q] else max(0, now_ms - oldest[q]) / 1000.0
            c.per_queue[q] = {"queued": lens[q], "oldest_age": age}
        ages = [p["oldest_age"] for p in c.per_queue.values() if p["oldest_age"] is not None]
        c.oldest_age = max(ages) if ages else None
