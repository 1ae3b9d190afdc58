"""What the admin web app is given of its node: plain data and callables, no shell types.

The shell (``server/web.py``) fills one :class:`NodeHandle` per node; the views
(:mod:`.api`), the metrics (:mod:`.metrics`) and the access checks
(:mod:`.access`) read it. Nothing here imports the shell, so the web package can be
tested with a handle made by hand, and the shell's parts never depend on it.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from itertools import compress, repeat
from operator import not_
from typing import Any, Awaitable, Callable, Mapping

from ..core.constants import INTERNAL_QUEUE_PREFIX

__all__ = ["NodeHandle", "Peer", "split_queues"]


def split_queues(queues: Mapping[bytes, Any]) -> tuple[list[Any], list[Any]]:
    """The core's queues (its table: name -> queue) in two lists, each in the table's order:
    those an operator watches, and the cluster's own (a name starting with ``@``,
    ``core.constants.INTERNAL_QUEUE_PREFIX``: a task's result), which the queue list and
    /metrics leave out unless asked. One pass over the names in C (``bytes.startswith`` mapped
    over the keys: about what the lengths' pass costs, 5 ms for 100k queues), and no copy more
    when there is none of the cluster's own."""
    vals = list(queues.values())
    own = list(map(bytes.startswith, queues, repeat(INTERNAL_QUEUE_PREFIX)))
    if not any(own):
        return vals, []
    return list(compress(vals, map(not_, own))), list(compress(vals, own))


@dataclass(frozen=True, slots=True)
class Peer:
    """One row of the node table, as the cluster view shows it."""

    id: str
    ip: str
    port: int
    flags: tuple[str, ...]  # "myself", "pfail", "fail", "handshake", "noaddr", "leaving"
    connected: bool  # our outbound bus link to it is up (always True for ourselves)


@dataclass
class NodeHandle:
    config: Any  # disque_py.config.Config
    acl: Any  # server/acl.Acl
    node: Any  # core Node (read only: queues, store, stats)
    stats: dict[str, int]  # INFO stats of the shell
    clients: dict[int, Any]  # the open client connections
    start_time: float
    #: run one command as the given acl user (None: every right) through the dispatcher, in
    #: process; returns the reply value (core/replies.py types)
    run_command: Callable[[list[bytes], Any], Any]
    #: the node table
    peers: Callable[[], list[Peer]]
    #: ask a peer: (ip, port, argvs, auth (user, password) or None) -> replies (errors as exceptions)
    ask_peer: Callable[[str, int, list[list[bytes]], Any], Awaitable[list[Any]]]
    cluster_stats: Callable[[], dict[str, int]] = dict  # bus counters (membership + bus)
    bus_links: Callable[[], int] = lambda: 0
    messages_by_kind: Callable[[], tuple[dict[str, int], dict[str, int]]] = lambda: ({}, {})
    aof_info: Callable[[], dict[str, Any]] = dict
    cmdstats: Callable[[], Any] = lambda: None  # server.cmdstats.CommandStats when the node has it
    loading: Callable[[], bool] = lambda: False
    #: the live workers this node hears from (WORKER BEAT) and the jobs they said they run
    workers: Callable[[], tuple[int, int]] = lambda: (0, 0)
    version: str = ""
    extra: dict[str, Any] = field(default_factory=dict)
