"""Where the source's work goes: which node a write connection uses, which node a job is read from.

No pyspark here, so this is tested against real nodes without a Spark session.

* **write**: a write task (Spark partition ``part``) opens ``connections``
  clients; client ``k`` uses the node :func:`first_node` names, the list
  ``nodes`` rotated by ``part + k``, so the tasks of a write together use
  every node listed, whatever the client's own random choice would have
  been. That node is the client's ``prefer`` address: tried first, and the
  others are its failover when it is down (then the client's usual order).
  The first ``connections`` batches of a task go one to each connection, so
  a task with that many batches adds jobs on each of its nodes; later
  batches go to whichever connection is free first (a slow node gets fewer).
* **read**: :func:`assign_snapshot` gives every job to exactly one node: the
  one where it is queued, else one of the nodes that hold a copy.
"""

from __future__ import annotations

import queue as queue_mod
import threading
from collections.abc import Iterable, Sequence
from typing import Any

from ..client import commands as cmd
from ..client.cluster import Address
from ..client.errors import DisqueError
from ..client.sync import Client
from . import options as opts
from .links import Links, address_text

__all__ = ["first_node", "add_batches", "assign_snapshot", "scan_ids", "SCAN_COUNT"]

SCAN_COUNT = 1000


# ==================================================================== write
def _raw(reply: Any) -> Any:
    """An ADDJOB's reply as it came (a job ID, or the error as a value: the pipeline's)."""
    return reply


def first_node(nodes: Sequence[Address], part: int, k: int) -> Address:
    """The node that connection ``k`` of write task ``part`` uses while it is up."""
    return nodes[(part + k) % len(nodes)]


def add_batches(
    o: opts.Options, part: int, batches: Iterable[tuple[int, list[tuple]]], keyed: bool | None = None
) -> tuple[int, dict[str, int]]:
    """ADDJOB every batch of ``batches`` ((first row number, argvs) pairs, read lazily) over
    ``o.connections`` clients, each pipelining a batch at a time on its own node (see the module
    docstring). Returns (jobs added, jobs added per node address). The first failed job stops
    the reading of ``batches`` and raises RuntimeError naming its row, once every connection
    is done. ``keyed``: every ADDJOB carries DEDUP (default: the write has a ``dedupColumn``)."""
    nodes = list(o.nodes)
    blocks = cmd.addjob("q", b"", **o.addjob_options()).blocks
    dedup = o.dedup_column is not None if keyed is None else keyed
    # Batch k < connections goes to connection k, so each connection of a task with enough rows
    # adds jobs on its node; the later batches go to whichever connection is free first.
    firsts: list[queue_mod.Queue] = [queue_mod.Queue(maxsize=1) for _ in range(o.connections)]
    work: queue_mod.Queue = queue_mod.Queue(maxsize=o.connections * 2)
    lock = threading.Lock()
    errors: list[tuple[int, str]] = []  # (row number, message)
    counts: dict[str, int] = {}
    total = [0]

    def send(client: Client, first: int, argvs: list[tuple]) -> None:
        try:
            # With DEDUP keys a batch whose connection was lost is sent again (its rest, to another
            # node): the jobs already made answer their IDs. Without keys that could add them twice.
            results = client.pipeline([cmd.Call(argv, _raw, blocks, dedup) for argv in argvs])
        except DisqueError as exc:
            with lock:
                errors.append((first, "%s: %s" % (type(exc).__name__, exc)))
            return
        node = address_text(client.current_address) if client.current_address else "?"
        ok = 0
        for n, result in enumerate(results):
            if isinstance(result, DisqueError):
                with lock:
                    errors.append((first + n, "-%s %s" % (getattr(result, "code", "ERR"), result)))
                break
            ok += 1
        with lock:
            total[0] += ok
            counts[node] = counts.get(node, 0) + ok

    def sender(k: int) -> None:
        # The client connects at its first batch: a connection given none opens no socket.
        client = Client(nodes, prefer=first_node(nodes, part, k), connect_timeout=o.connect_timeout,
                        refresh_interval=None, **o.connection_options())  # fmt: skip
        try:
            item = firsts[k].get()
            while item is not None:
                if not errors:  # after a failed job the batches are drained without sending
                    send(client, *item)
                item = work.get()
        finally:
            client.close()

    threads = [threading.Thread(target=sender, args=(k,), daemon=True) for k in range(o.connections)]
    for t in threads:
        t.start()
    given = 0
    try:
        for batch in batches:
            (firsts[given] if given < o.connections else work).put(batch)
            given += 1
            if errors:
                break
    finally:
        for k in range(given, o.connections):
            firsts[k].put(None)  # never given a batch: ends at once
        for _ in range(min(given, o.connections)):
            work.put(None)  # one end mark for each connection that reads the shared queue
        for t in threads:
            t.join()
    if errors:
        row, message = min(errors)
        raise RuntimeError(
            "disque: ADDJOB failed for row %d of partition %d: %s (%d jobs of this task were added)"
            % (row, part, message, total[0])
        )
    return total[0], counts


# ==================================================================== read
def scan_ids(links: Links, node: Address, queues: Sequence[str | None], state: str | None = None) -> list[str]:
    """The IDs of the jobs of ``queues`` (None: every queue) on ``node`` (JSCAN, in the given state)."""
    out: list[str] = []
    for q in queues:
        cursor = 0
        while True:
            call = cmd.jscan(cursor, count=SCAN_COUNT, queue=q, states=(state,) if state else ())
            cursor, ids = call.parse(links.call(node, *call.argv))
            out += ids
            if cursor == 0:
                break
    return out


def assign_snapshot(links: Links, nodes: Sequence[Address], queues: Sequence[str]) -> dict[Address, list[str]]:
    """Every job of ``queues`` (none: every queue) on ``nodes``, each given to one node, its IDs
    sorted: the node where it is queued, else one of those holding a copy (spread by ID)."""
    queues_or_all: list[str | None] = list(queues) or [None]
    holders: dict[str, list[Address]] = {}
    queued_at: dict[str, Address] = {}
    for node in nodes:
        for job_id in scan_ids(links, node, queues_or_all):
            holders.setdefault(job_id, []).append(node)
        for job_id in scan_ids(links, node, queues_or_all, "queued"):
            queued_at.setdefault(job_id, node)
    assigned: dict[Address, list[str]] = {n: [] for n in nodes}
    for job_id, where in holders.items():
        node = queued_at.get(job_id) or where[hash(job_id) % len(where)]
        assigned[node].append(job_id)
    for ids in assigned.values():
        ids.sort()
    return assigned
