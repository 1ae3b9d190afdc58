"""``disque-py top``: a live view of a cluster's queues and nodes.

Two halves that do not know each other:

* **gathering** (:class:`Collector`, :func:`compute`): every node given, and
  every node their HELLO lists, is asked on its own connection (a
  ``NodeConnection``, as the Spark source does: ``Client`` hides which node it
  talks to) for ``INFO``, ``HELLO``, ``CLUSTER NODES`` and ``WORKER LIST`` in one
  pipelined round trip, then its queues with a ``QSCAN`` cursor loop and one pipelined
  ``QSTAT`` per queue (the cluster's own queues, ``@`` names such as a task's result, only
  with ``all_queues``: ``QSCAN ... ALL``). The nodes are asked in parallel (a thread each), so a
  stopped node costs its timeout once per sample, not once per node. Two
  samples make a :class:`View`: queues summed across the nodes that hold
  them, with in/out rates from the ``jobs-in``/``jobs-out`` counters of
  each node between the two samples, and the live workers merged by ID
  (``client/workers.py``). An unreachable node is a row saying so, never an
  exception.
* **showing** (:func:`render`, :func:`run_live`, :func:`run_once`): rich
  tables, sorted by a column; the live loop reads keys from the terminal in
  cbreak mode (restored on exit) without blocking the refresh.
"""

from __future__ import annotations

import json
import os
import re
import select
import sys
import time
from collections.abc import Callable, Iterable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, field
from typing import Any

from ..client import commands as cmd
from ..client import workers as wk
from ..client.cluster import Address, parse_node_list as parse_nodes
from ..client.config import ClientConfig
from ..client.connection import NodeConnection
from ..client.errors import DisqueError
from ..client.groups import merge_groups
from ..client.model import decode_name

__all__ = [
    "Collector", "NodeSample", "QueueStat", "Sample", "View", "QueueRow", "NodeRow", "compute", "sort_queues",
    "render", "run_live", "run_once", "parse_nodes", "SORT_KEYS", "Keys",
]  # fmt: skip

#: the groups top shows (the busiest; the rest in one line)
GROUPS_SHOWN = 20
#: QSCAN's COUNT per call, and QSTATs per pipelined batch
SCAN_COUNT = 1000
QSTAT_BATCH = 500

#: sort column -> (key letter, descending by default)
SORT_KEYS: dict[str, tuple[str, bool]] = {
    "length": ("l", True),
    "in": ("i", True),
    "out": ("o", True),
    "blocked": ("b", True),
    "name": ("n", False),
}
KEY_TO_SORT = {letter: name for name, (letter, _) in SORT_KEYS.items()}


# ============================================================== gathering
@dataclass(slots=True)
class QueueStat:
    """One queue on one node: QSTAT's fields that top shows."""

    len: int
    blocked: int
    jobs_in: int
    jobs_out: int
    paused: str  # none | in | out | all


@dataclass(slots=True)
class NodeSample:
    """What one node said at one sample (``reachable`` False: ``error`` says why)."""

    address: Address
    at: float  # time.monotonic() when its queues were read
    reachable: bool
    error: str | None = None
    id: str | None = None
    info: dict[str, Any] = field(default_factory=dict)
    hello: list[tuple[str, str, int, int]] = field(default_factory=list)  # (id, host, port, priority)
    peers: dict[str, tuple[str, ...]] = field(default_factory=dict)  # CLUSTER NODES: id -> flags
    queues: dict[str, QueueStat] = field(default_factory=dict)
    truncated: bool = False  # more queues than max_queues
    workers: Any = None  # its WORKER LIST reply (an error for a node without the command)
    groups: Any = None  # its GROUP LIST reply, read (an error for a node without the command)


@dataclass(slots=True)
class Sample:
    wall: float  # time.time()
    nodes: list[NodeSample]
    all_queues: bool = False  # the cluster's own queues (@...) were asked for too


def _text(address: Address) -> str:
    host, port = address
    return ("[%s]:%d" if ":" in host else "%s:%d") % (host, port)


def _error_text(exc: BaseException) -> str:
    return str(exc) or type(exc).__name__


class Collector:
    """Samples a cluster: the ``seeds`` and, with ``discover``, every node their HELLO lists.

    Connections are kept between samples and reopened after a failure. A node
    that was discovered and that no node lists any more (forgotten) is dropped;
    a seed is always shown. Over TLS, HELLO lists the nodes' plain ports, which
    TLS does not reach: a node that is not among the seeds is then shown but
    not asked (give its tls-port in the seeds).
    """

    def __init__(
        self,
        seeds: Sequence[Address],
        *,
        discover: bool = True,
        password: str | None = None,
        username: str | None = None,
        tls: bool = False,
        cacert: str | None = None,
        cert: str | None = None,
        key: str | None = None,
        timeout: float = 2.0,
        max_queues: int = 10000,
        all_queues: bool = False,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.seeds = list(seeds)
        self.discover = discover
        self.max_queues = max_queues
        self.all_queues = all_queues
        self._scan_options: tuple[bytes, ...] = (b"ALL",) if all_queues else ()
        self.config = ClientConfig(
            self.seeds, password=password, username=username, socket_timeout=timeout, connect_timeout=timeout,
            tls=tls, ssl_ca_certs=cacert, ssl_certfile=cert, ssl_keyfile=key,
        )  # fmt: skip
        self.timeout = timeout
        self.clock = clock
        self.addresses: list[Address] = list(self.seeds)  # what is sampled, seeds first
        self.ids: dict[Address, str] = {}  # last ID each address answered with (or HELLO gave)
        self._conns: dict[Address, NodeConnection] = {}
        self._pool = ThreadPoolExecutor(max_workers=16, thread_name_prefix="top")

    def close(self) -> None:
        self._pool.shutdown(wait=False, cancel_futures=True)
        for conn in list(self._conns.values()):
            conn.close()
        self._conns.clear()

    def __enter__(self) -> "Collector":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -------------------------------------------------------------- one node
    def _conn(self, address: Address) -> NodeConnection:
        conn = self._conns.get(address)
        if conn is None:
            conn = self._conns[address] = NodeConnection(address, self.config)
        return conn

    def sample_node(self, address: Address) -> NodeSample:
        """One node's INFO, HELLO, CLUSTER NODES and queues; any failure gives an unreachable sample."""
        if self.config.tls and address not in self.seeds:
            return NodeSample(address, self.clock(), False, id=self.ids.get(address),
                              error="not asked: HELLO lists plain ports; give its tls-port in --nodes")  # fmt: skip
        try:
            return self._sample_node(address)
        except (DisqueError, OSError, ValueError, IndexError, TypeError) as exc:
            conn = self._conns.pop(address, None)
            if conn is not None:
                conn.close()
            return NodeSample(address, self.clock(), False, error=_error_text(exc), id=self.ids.get(address))

    def _sample_node(self, address: Address) -> NodeSample:
        conn = self._conn(address)
        info_r, hello_r, nodes_r, workers_r, groups_r = conn.request_many(
            [(b"INFO",), (b"HELLO",), (b"CLUSTER", b"NODES"), (b"WORKER", b"LIST"),
             (b"GROUP", b"LIST", b"COUNT", b"%d" % GROUPS_SHOWN)],
            self.timeout)  # fmt: skip
        for reply in (info_r, hello_r):
            if isinstance(reply, BaseException):
                raise reply
        info = cmd.parse_info(info_r)
        hello = cmd.parse_hello(hello_r, via_host=address[0])
        peers: dict[str, tuple[str, ...]] = {}
        if isinstance(nodes_r, bytes):
            for line in nodes_r.decode("utf-8", "replace").splitlines():
                parts = line.split()
                if len(parts) >= 3:
                    peers[parts[0]] = tuple(f for f in parts[2].split(",") if f and f != "-")
        groups = None if isinstance(groups_r, BaseException) else cmd.group_list().parse(groups_r)
        node = NodeSample(address, 0.0, True, id=hello.node_id, info=info, peers=peers, workers=workers_r,
                          hello=[(n.id, n.host, n.port, n.priority) for n in hello.nodes], groups=groups)  # fmt: skip
        names: list[bytes] = []
        cursor = 0
        while True:
            reply = conn.request((b"QSCAN", cursor, b"COUNT", SCAN_COUNT, *self._scan_options), self.timeout)
            cursor = int(reply[0])
            names.extend(reply[1])
            if len(names) >= self.max_queues:
                node.truncated = cursor != 0 or len(names) > self.max_queues
                del names[self.max_queues:]
                break
            if cursor == 0:
                break
        for start in range(0, len(names), QSTAT_BATCH):
            batch = names[start:start + QSTAT_BATCH]
            replies = conn.request_many([(b"QSTAT", n) for n in batch], self.timeout)
            for name, reply in zip(batch, replies):
                if reply is None or isinstance(reply, BaseException):
                    continue  # gone between QSCAN and QSTAT
                stat = cmd.parse_flat_map(reply) or {}
                node.queues[decode_name(name)] = QueueStat(
                    int(stat.get("len", 0)), int(stat.get("blocked", 0)), int(stat.get("jobs-in", 0)),
                    int(stat.get("jobs-out", 0)), str(stat.get("pause", "none")),
                )  # fmt: skip
        node.at = self.clock()
        return node

    # -------------------------------------------------------------- the cluster
    def _sample_many(self, addresses: Sequence[Address]) -> list[NodeSample]:
        return list(self._pool.map(self.sample_node, addresses))

    def sample(self) -> Sample:
        """Every node once (the ones HELLO names for the first time too, in the same sample)."""
        wall = time.time()
        samples = self._sample_many(self.addresses)
        for _ in range(3):  # nodes found through nodes found: a few rounds at most
            for s in samples:
                if s.id:
                    self.ids[s.address] = s.id
            if not self.discover:
                break
            new = self._learn(samples)
            if not new:
                break
            samples += self._sample_many(new)
        if self.discover:
            samples = self._forget(samples)
        return Sample(wall, samples, self.all_queues)

    def _learn(self, samples: Iterable[NodeSample]) -> list[Address]:
        """Addresses of the nodes HELLO lists that are not sampled yet (by ID, then by address)."""
        known_ids = set(self.ids.get(a) for a in self.addresses)
        new: list[Address] = []
        for s in samples:
            for node_id, host, port, _ in s.hello:
                address = (host, port)
                if node_id in known_ids or port <= 0 or address in self.addresses:
                    continue
                known_ids.add(node_id)
                self.ids[address] = node_id
                self.addresses.append(address)
                new.append(address)
        return new

    def _forget(self, samples: list[NodeSample]) -> list[NodeSample]:
        listed = {node_id for s in samples for node_id, *_ in s.hello}
        if not listed:  # nobody answered: keep showing everything
            return samples
        keep = [s for s in samples if s.reachable or s.address in self.seeds or s.id in listed]
        gone = {s.address for s in samples} - {s.address for s in keep}
        if gone:
            self.addresses = [a for a in self.addresses if a not in gone]
            for address in gone:
                self.ids.pop(address, None)
                conn = self._conns.pop(address, None)
                if conn is not None:
                    conn.close()
        return keep


# ============================================================== the view
@dataclass(slots=True)
class QueueRow:
    name: str
    len: int
    in_rate: float | None  # jobs/s (None until two samples)
    out_rate: float | None
    blocked: int
    paused: str  # none | in | out | all: what any node pauses
    paused_everywhere: bool  # every node holding it pauses the same way
    nodes: dict[str, dict[str, Any]]  # node id (or address) -> its len, blocked, jobs_in, jobs_out, paused


@dataclass(slots=True)
class NodeRow:
    id: str | None
    address: str
    reachable: bool
    error: str | None
    flags: tuple[str, ...]  # as the reachable nodes see it (pfail, fail, leaving, ...)
    jobs: int | None
    queues: int | None
    clients: int | None
    blocked_clients: int | None
    ops_per_sec: float | None
    used_memory: int | None  # INFO's used_memory: the estimate of the node's data that maxmemory is checked against
    max_memory: int | None
    truncated: bool
    used_memory_rss: int | None = None  # the process's resident set size (INFO used_memory_rss)


@dataclass(slots=True)
class View:
    wall: float
    interval: float | None  # seconds between the two samples the rates come from
    queues: list[QueueRow]
    nodes: list[NodeRow]
    truncated: bool
    workers: list[wk.WorkerView] = field(default_factory=list)  # the live workers, merged over the nodes
    all_queues: bool = False  # the cluster's own queues (@...) are among ``queues``
    groups: list[dict[str, Any]] = field(default_factory=list)  # ADDJOB's groups, merged (client/groups.py)

    def to_json(self) -> dict[str, Any]:
        data = asdict(self)
        data["workers"] = [w.as_json(self.wall) for w in self.workers]
        return data


_PAUSE_BITS = {"none": 0, "in": 1, "out": 2, "all": 3}
_PAUSE_NAMES = {v: k for k, v in _PAUSE_BITS.items()}


def _node_key(s: NodeSample) -> str:
    return s.id or _text(s.address)


def compute(current: Sample, previous: Sample | None = None) -> View:
    """The view of ``current``; rates from the counters' change since ``previous``.

    A node's rate counts only when it answered both samples. A queue it did not
    have at the previous sample contributes its whole counter (it was created
    since); a counter that went down (the queue was evicted and created again,
    the node restarted) contributes its new value, as Prometheus' rate() does.
    """
    before: dict[str, NodeSample] = {}
    if previous is not None:
        before = {_node_key(s): s for s in previous.nodes if s.reachable}
    rows: dict[str, QueueRow] = {}
    rated: set[str] = set()
    gaps: list[float] = []
    for s in current.nodes:
        if not s.reachable:
            continue
        key = _node_key(s)
        old = before.get(key)
        dt = (s.at - old.at) if old is not None else 0.0
        if dt > 0:
            gaps.append(dt)
        for name, q in s.queues.items():
            row = rows.get(name)
            if row is None:
                row = rows[name] = QueueRow(name, 0, None, None, 0, "none", True, {})
            row.len += q.len
            row.blocked += q.blocked
            row.nodes[key] = {"len": q.len, "blocked": q.blocked, "jobs_in": q.jobs_in, "jobs_out": q.jobs_out,
                              "paused": q.paused}  # fmt: skip
            if dt > 0:
                prev = old.queues.get(name) if old is not None else None
                d_in = q.jobs_in - prev.jobs_in if prev is not None else q.jobs_in
                d_out = q.jobs_out - prev.jobs_out if prev is not None else q.jobs_out
                d_in = q.jobs_in if d_in < 0 else d_in
                d_out = q.jobs_out if d_out < 0 else d_out
                row.in_rate = (row.in_rate or 0.0) + d_in / dt
                row.out_rate = (row.out_rate or 0.0) + d_out / dt
                rated.add(name)
    for row in rows.values():
        modes = {info["paused"] for info in row.nodes.values()}
        bits = 0
        for mode in modes:
            bits |= _PAUSE_BITS.get(mode, 0)
        row.paused = _PAUSE_NAMES[bits]
        row.paused_everywhere = len(modes) == 1
        if row.name not in rated and previous is not None and gaps:
            row.in_rate = row.out_rate = 0.0  # only on nodes that answered once: nothing known moved
    views: dict[str, tuple[str, ...]] = {}  # node id -> flags, merged from every reachable node's table
    for s in current.nodes:
        for node_id, flags in s.peers.items():
            if node_id == s.id:
                continue
            merged = set(views.get(node_id, ())) | {f for f in flags if f not in ("myself", "noflags")}
            views[node_id] = tuple(sorted(merged))
    nodes = []
    for s in current.nodes:
        info = s.info
        nodes.append(NodeRow(
            id=s.id, address=_text(s.address), reachable=s.reachable, error=s.error,
            flags=views.get(s.id or "", ()),
            jobs=info.get("registered_jobs"), queues=info.get("registered_queues"),
            clients=info.get("connected_clients"), blocked_clients=info.get("blocked_clients"),
            ops_per_sec=info.get("instantaneous_ops_per_sec"), used_memory=info.get("used_memory"),
            max_memory=info.get("maxmemory"), truncated=s.truncated, used_memory_rss=info.get("used_memory_rss"),
        ))  # fmt: skip
    interval = max(gaps) if gaps else None
    truncated = any(s.truncated for s in current.nodes)
    workers = wk.merge((_node_key(s), s.workers) for s in current.nodes if s.reachable)
    groups, _ = merge_groups([(_node_key(s), s.groups) for s in current.nodes if s.reachable], GROUPS_SHOWN)
    return View(current.wall, interval, sort_queues(list(rows.values()), "length"), nodes, truncated, workers,
                current.all_queues, groups)  # fmt: skip


def sort_queues(rows: list[QueueRow], by: str = "length", reverse: bool = False) -> list[QueueRow]:
    """Rows sorted by a column of :data:`SORT_KEYS` (its natural direction, flipped by ``reverse``);
    ties by name. A rate not known yet sorts as 0."""
    if by not in SORT_KEYS:
        raise ValueError("sort by one of %s" % ", ".join(SORT_KEYS))
    descending = SORT_KEYS[by][1] != reverse
    by_name = sorted(rows, key=lambda r: r.name, reverse=(by == "name" and descending))
    if by == "name":
        return by_name
    value: Callable[[QueueRow], float] = {
        "length": lambda r: r.len,
        "in": lambda r: r.in_rate or 0.0,
        "out": lambda r: r.out_rate or 0.0,
        "blocked": lambda r: r.blocked,
    }[by]
    return sorted(by_name, key=value, reverse=descending)  # stable: ties stay by name


# ============================================================== showing
def human_bytes(n: int | None) -> str:
    if n is None:
        return "-"
    value = float(n)
    for unit in ("B", "K", "M", "G", "T"):
        if value < 1024 or unit == "T":
            return ("%d%s" if unit == "B" else "%.1f%s") % (value, unit)
        value /= 1024
    return str(n)  # pragma: no cover


def short_error(text: str) -> str:
    """The reason alone, for a table cell: "cannot connect to h:p: Error 111 connecting to h:p.
    Connection refused." -> "connection refused" (the JSON keeps the whole text)."""
    text = re.sub(r"^(cannot connect to|connection to) \S+?:\d+( lost)?: ", "", text)
    text = re.sub(r"^Error -?\d+ (connecting to|while reading from) \S+?\. ", "", text)
    text = text.strip().rstrip(".")
    return text[:1].lower() + text[1:] if text[:1].isupper() and not text[1:2].isupper() else text


def _rate(value: float | None) -> str:
    if value is None:
        return "-"
    return "%.1f" % value if value < 100 else "%d" % round(value)


def _num(value: Any) -> str:
    return "-" if value is None else str(value)


def render(view: View | None, *, sort: str = "length", reverse: bool = False, limit: int | None = None,
           status: str = "", keys_help: bool = False):  # fmt: skip
    """The screen: a title line, the queue table (sorted, at most ``limit`` rows) and the node table."""
    from rich.console import Group
    from rich.table import Table
    from rich.text import Text

    if view is None:
        return Group(Text("disque-py top: first sample..." + (" " + status if status else "")))
    arrow = "v" if SORT_KEYS[sort][1] != reverse else "^"
    rows = sort_queues(view.queues, sort, reverse)
    shown = rows if limit is None else rows[: max(0, limit)]
    up = sum(n.reachable for n in view.nodes)
    title = Text.assemble(
        ("disque-py top", "bold"),
        "  %s  nodes %d/%d up  queues %d%s" % (time.strftime("%H:%M:%S", time.localtime(view.wall)), up,
                                              len(view.nodes), len(rows),
                                              " (the cluster's own too)" if view.all_queues else ""),  # fmt: skip
        ("  (more queues than --max-queues on a node: not all shown)" if view.truncated else "", "yellow"),
        ("  " + status if status else "", "dim"),
    )
    queues = Table(box=None, header_style="bold reverse", pad_edge=False, collapse_padding=True)
    headers = [("name", "QUEUE", "left"), ("length", "LEN", "right"), ("in", "IN/s", "right"),
               ("out", "OUT/s", "right"), ("blocked", "BLOCKED", "right")]  # fmt: skip
    for key, label, justify in headers:
        letter = SORT_KEYS[key][0]
        text = "%s(%s)%s" % (label, letter, arrow if key == sort else "")
        queues.add_column(text, justify=justify, overflow="fold", no_wrap=False, min_width=len(text))  # type: ignore[arg-type]
    queues.add_column("PAUSED")
    queues.add_column("NODES", justify="right")
    for r in shown:
        paused = r.paused if r.paused_everywhere or r.paused == "none" else r.paused + "*"
        queues.add_row(r.name, str(r.len), _rate(r.in_rate), _rate(r.out_rate), str(r.blocked),
                       Text(paused, style="bold yellow" if r.paused != "none" else ""), str(len(r.nodes)))  # fmt: skip
    if not rows:
        queues.add_row(Text("(no queues)", style="dim"), "", "", "", "", "", "")
    nodes = Table(box=None, header_style="bold reverse", pad_edge=False, collapse_padding=True)
    cells = []
    for n in view.nodes:
        data = human_bytes(n.used_memory)  # the estimate the maxmemory policy reads, against its limit
        if n.max_memory:
            data += "/" + human_bytes(n.max_memory)
        note = ",".join(n.flags)
        if n.error:
            note = (note + " " if note else "") + short_error(n.error)
        cells.append([(n.id or "?")[:8], n.address, "yes" if n.reachable else "NO", _num(n.jobs), _num(n.queues),
                      _num(n.clients), _num(n.ops_per_sec), data if n.reachable else "-",
                      human_bytes(n.used_memory_rss) if n.reachable else "-", note])  # fmt: skip
    # two memories, each named: the data estimate maxmemory is checked against (INFO used_memory)
    # and the process's RSS (used_memory_rss), tens of MB for the interpreter alone
    headers = [("NODE", "left"), ("ADDRESS", "left"), ("UP", "left"), ("JOBS", "right"), ("QUEUES", "right"),
               ("CLIENTS", "right"), ("OPS/s", "right"), ("DATA(est)/MAX", "right"), ("RSS", "right")]  # fmt: skip
    for i, (label, justify) in enumerate(headers):  # these never shrink: the last column gives way
        width = max([len(label)] + [len(row[i]) for row in cells])
        nodes.add_column(label, justify=justify, no_wrap=True, min_width=width)  # type: ignore[arg-type]
    nodes.add_column("FLAGS / ERROR", no_wrap=True, overflow="ellipsis")  # one line per node: the JSON has it all
    for n, row in zip(view.nodes, cells):
        up = Text(row[2], style="green" if n.reachable else "bold red")
        nodes.add_row(*row[:2], up, *row[3:-1], Text(row[-1], style="" if n.reachable else "red"))
    parts: list[Any] = [title, queues]
    if limit is not None and len(rows) > len(shown):
        parts.append(Text("... %d more queue(s)" % (len(rows) - len(shown)), style="dim"))
    parts += [Text(""), nodes]
    if view.groups:
        parts += [Text(""), _groups_table(view)]
    if view.workers:
        parts += [Text(""), _workers_table(view)]
    if keys_help:
        parts.append(Text("sort: l length  i in/s  o out/s  b blocked  n name  r reverse   q quit", style="dim"))
    return Group(*parts)


def _now_running(w: wk.WorkerView, now: float) -> str:
    """What a worker runs, in one cell: its oldest job's label (or queue) and for how long, and how
    many more."""
    if not w.running:
        return "-" if not w.running_total else "%d job(s)" % w.running_total
    job = w.running[0]
    text = "%s %s" % (w.label_of(job) or job.queue, wk.age_text(now - job.since) if job.since else "")
    more = w.running_total - 1
    return text.rstrip() + (" +%d" % more if more > 0 else "")


def _groups_table(view: View):
    """One line per group (ADDJOB's GROUP): the busiest ``GROUPS_SHOWN``, the rest in one line."""
    from rich.table import Table
    from rich.text import Text

    table = Table(box=None, header_style="bold reverse", pad_edge=False, collapse_padding=True)
    for label, justify in (("GROUP", "left"), ("WEIGHT", "right"), ("ACTIVE", "right"), ("WAITING", "right"),
                           ("LIMIT", "right"), ("RATE/s", "right")):  # fmt: skip
        table.add_column(label, justify=justify, no_wrap=True)  # type: ignore[arg-type]
    for g in view.groups:
        name = g["name"] if not g.get("groups") else "%s (%d groups)" % (g["name"], g["groups"])
        table.add_row(Text(name, style="bold yellow" if g.get("held") else ""), _num(g.get("weight")),
                      str(g["active"]), str(g["waiting"]), _num(g.get("concurrency")),
                      "-" if g.get("rate") is None else "%g" % g["rate"])  # fmt: skip
    return table


def _workers_table(view: View):
    """One line per live worker (``disque-py workers`` has their jobs one per line)."""
    from rich.table import Table

    table = Table(box=None, header_style="bold reverse", pad_edge=False, collapse_padding=True)
    for label, justify in (("WORKER", "left"), ("QUEUES", "left"), ("CONC", "right"), ("RUN", "right"),
                           ("DONE", "right"), ("FAILED", "right"), ("BEAT", "right")):  # fmt: skip
        table.add_column(label, justify=justify, no_wrap=True)  # type: ignore[arg-type]
    table.add_column("NOW RUNNING", no_wrap=True, overflow="ellipsis")
    for w in view.workers:
        table.add_row(w.id, ",".join(w.queues), str(w.concurrency), str(w.running_total), str(w.processed),
                      str(w.failed), wk.age_text(w.last_beat_ago), _now_running(w, view.wall))  # fmt: skip
    return table


class Keys:
    """Single key presses from a terminal, without blocking: cbreak mode while in use, restored after.

    Not a terminal (a pipe, a test's CliRunner): :meth:`read` only waits.
    """

    def __init__(self, stream=None) -> None:
        self.stream = stream if stream is not None else sys.stdin
        self.fd: int | None = None
        self._saved: Any = None

    def __enter__(self) -> "Keys":
        try:
            fd = self.stream.fileno()
        except (AttributeError, OSError, ValueError):
            return self
        if not os.isatty(fd):
            return self
        import termios
        import tty

        self._saved = termios.tcgetattr(fd)
        tty.setcbreak(fd)
        self.fd = fd
        return self

    def __exit__(self, *exc: object) -> None:
        if self.fd is not None:
            import termios

            termios.tcsetattr(self.fd, termios.TCSADRAIN, self._saved)
            self.fd = None

    def read(self, timeout: float) -> str | None:
        """A key pressed within ``timeout`` seconds, or None."""
        if self.fd is None:
            time.sleep(max(0.0, timeout))
            return None
        ready, _, _ = select.select([self.fd], [], [], max(0.0, timeout))
        if not ready:
            return None
        data = os.read(self.fd, 32)
        if not data:  # the terminal went away
            return "q"
        return data[:1].decode("latin-1")


def run_live(collector: Collector, *, interval: float = 1.0, sort: str = "length", reverse: bool = False,
             limit: int | None = None, console=None, keys: Keys | None = None) -> None:  # fmt: skip
    """Refresh every ``interval`` seconds until 'q' or Ctrl-C; keys re-sort at once."""
    from rich.console import Console
    from rich.live import Live

    console = console or Console()
    keys = keys or Keys()
    previous: Sample | None = None
    view: View | None = None

    def screen():
        rows = limit
        if console.is_terminal:  # what fits under the title, above the node table and the keys
            shown = len(view.nodes) + (len(view.workers) + 2 if view.workers else 0) if view else 0
            fits = max(3, console.size.height - shown - 8)
            rows = fits if rows is None else min(rows, fits)
        return render(view, sort=sort, reverse=reverse, limit=rows, keys_help=keys.fd is not None)

    try:
        with keys, Live(screen(), console=console, auto_refresh=False, transient=False,
                        vertical_overflow="crop") as live:  # fmt: skip
            next_at = time.monotonic()
            while True:
                wait = next_at - time.monotonic()
                key = keys.read(wait) if wait > 0 else None
                if key is not None:
                    key = key.lower()
                    if key == "q":
                        return
                    if key == "r":
                        reverse = not reverse
                    elif key in KEY_TO_SORT:
                        sort, reverse = KEY_TO_SORT[key], False
                    else:
                        continue
                    live.update(screen(), refresh=True)
                    continue
                current = collector.sample()
                next_at = time.monotonic() + interval
                view = compute(current, previous)
                previous = current
                live.update(screen(), refresh=True)
    except KeyboardInterrupt:
        return


def take_view(collector: Collector, interval: float, sleep: Callable[[float], Any] = time.sleep) -> View:
    """Two samples ``interval`` seconds apart, so that the rates exist."""
    first = collector.sample()
    sleep(interval)
    return compute(collector.sample(), first)


def run_once(collector: Collector, *, interval: float = 1.0, sort: str = "length", reverse: bool = False,
             as_json: bool = False, limit: int | None = None, out=None) -> View:  # fmt: skip
    """Print one view (tables, or JSON with the rows sorted as asked) and return it."""
    out = out or sys.stdout
    view = take_view(collector, interval)
    if as_json:
        data = view.to_json()
        data["sort"], data["reverse"] = sort, reverse
        data["queues"] = [asdict(r) for r in sort_queues(view.queues, sort, reverse)][:limit]
        out.write(json.dumps(data, indent=2) + "\n")
        out.flush()
        return view
    from rich.console import Console

    width = None
    if not (hasattr(out, "isatty") and out.isatty()) and "COLUMNS" not in os.environ:
        width = 160  # a pipe: wide enough that names are not folded
    Console(file=out, width=width).print(render(view, sort=sort, reverse=reverse, limit=limit))
    return view
