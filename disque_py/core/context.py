"""What one node's machines share: its state and its outbox.

Theory of operation
-------------------
A node is ten machines composed by ``node.Node``. Each is handed, as typed constructor
arguments, this ``Context`` and the machines it calls, all of them built before it (the
order, and who receives whom, is in ``node.py``'s docstring): no machine calls one built
after it, and no module imports one that imports it back. The context holds what every
machine reads and no machine owns:

* plain state: the node's ID and clock (``now``, set by ``Node`` on every input), the job
  store and its schedule (``store``), the queues by name (``queues``), the counters
  (``stats``), the random source, and the cluster view the membership layer keeps current
  (``cluster_size``, ``reachable``, ``backlogged``, ``known_nodes``, ``live_nodes``,
  ``leaving``, ``lacking``: the shell sets them on ``node.ctx``);
* the outbox: ``effects`` (what ``Node.take_effects`` hands the shell), ``send`` and
  ``send_lazy`` (ack GC messages, batched for up to ``GC_MESSAGE_DELAY_MS``);
* two shared tables, each with one owner, read by a machine below it: ``ready`` (queues that
  got a job while clients wait on them: whoever queues a job adds, ``Blocking`` serves them at
  the end of each input, through ``Node``) and ``repl_clients`` with ``repl_client_jobs``
  (the ADDJOB clients waiting for their job's copies: ``Replication`` keeps them, and
  ``Lifecycle.delete_job`` answers the client of a job it deletes meanwhile, as Disque's
  ``unregisterJob`` does).

No operation lives here: a machine calls another one's method on the object it was handed.
"""

from __future__ import annotations

import random
from typing import Final, Iterable, final

from . import ids as ids_mod
from .effects import Reply, Send
from .job import TIME_ERROR_MS  # noqa: F401  (re-exported: deadlines' random error, job.py)
from .groups import GroupTable
from .queues import Queue
from .store import JobStore

__all__ = ["Context", "TIME_ERROR_MS", "GC_MESSAGE_DELAY_MS", "GC_MESSAGE_BATCH_MAX"]

# Ack garbage-collection messages (SETACK, GOTACK, DELJOB) wait up to this
# long so that those of many jobs share one bus frame and one wake-up of the
# peer; nothing waits on them but memory (see docs/ARCHITECTURE.md).
GC_MESSAGE_DELAY_MS: Final = 5
GC_MESSAGE_BATCH_MAX: Final = 1024


@final
class Context:
    # Slots, not a dict: the machines read and set these on every input, and a dict this size
    # (over 20 keys) is past what CPython's attribute caches handle best.
    __slots__ = (
        "id", "myself_only", "seed", "ids", "now", "wall_offset", "address", "rng", "randbits", "store",
        "queues", "_queue_seq", "stats", "bus_stats", "cluster_size", "reachable", "backlogged",
        "known_nodes", "live_nodes", "leaving", "journal", "memory_level", "effects", "lazy", "lazy_at", "ready",
        "repl_clients", "repl_client_jobs", "lacking", "groups",
    )  # fmt: skip

    def __init__(self, node_id: str, seed: bytes, now: int, wall_offset: int, address: tuple[str, int]) -> None:
        self.id = node_id
        self.myself_only = (node_id,)  # shared holder tuple of a REPLICATE 1 job
        self.seed = seed
        self.ids = ids_mod.JobIdGenerator(node_id, seed)
        self.now = now
        self.wall_offset = wall_offset
        self.address = address
        self.rng = random.Random(seed)
        self.randbits = self.rng.getrandbits  # the deadlines' random error (job.py)
        self.store = JobStore()
        self.queues: dict[bytes, Queue] = {}
        self._queue_seq = 0
        self.stats: dict[str, int] = {
            "jobs_added": 0,
            "jobs_delivered": 0,
            "jobs_acked": 0,
            "jobs_expired": 0,
            "jobs_requeued": 0,
        }
        self.bus_stats = {"messages_malformed": 0, "messages_unknown": 0}  # peers' messages dropped (Node.bus_stats)
        # Cluster view; the membership layer keeps these current (through Node).
        self.cluster_size = 1
        self.reachable: list[str] = []  # other nodes we can talk to now
        # Nodes whose link holds output its socket has not taken yet, as of the last tick (the
        # shell sets it before each): REPLJOB resends skip them, new copies go elsewhere first.
        self.backlogged: frozenset[str] | set[str] = frozenset()
        self.known_nodes: list[str] = [node_id]
        # Other nodes not failing (no PFAIL/FAIL/handshake/leaving), linked or not: what ADDJOB's
        # REPLICATE is checked against, as in Disque. A node whose link just dropped still counts
        # until it is PFAIL; its copy is asked for once its link is back (the add-a-node timer).
        self.live_nodes = 0
        self.leaving = False
        # Peers that lack some of our protocol's features, with what they understand (the shell
        # sets it from their announcements): what goes to them passes through features.for_peer.
        self.lacking: dict[str, frozenset[str]] = {}
        # What the AOF must learn (store.J_LOAD ...): the store's list, or None without an AOF.
        self.journal: list | None = None
        # 0-3, set by memory.Memory: >= 1 replicate new jobs externally, >= 2 evict idle queues
        # after 2 s (see memory.py).
        self.memory_level = 0
        # Outbox.
        self.effects: list[Reply | Send] = []
        self.lazy: list[Send] = []  # Sends held back until lazy_at (GC_MESSAGE_DELAY_MS)
        self.lazy_at = 0
        # Shared tables (never rebound: Node and the machines keep references to them).
        self.ready: dict[bytes, Queue] = {}
        # job ID -> the ADDJOB client waiting for its copies, and back (replication.py)
        self.repl_clients: dict[bytes, int] = {}
        self.repl_client_jobs: dict[int, bytes] = {}
        # the groups' settings (GROUP WEIGHT, groups.py), read by every grouped queue
        self.groups = GroupTable()
        self.groups.view = self  # (read for cluster_size: groups.py cannot import this module)

    def set_id(self, node_id: str) -> None:
        self.id = node_id
        self.myself_only = (node_id,)
        self.ids = ids_mod.JobIdGenerator(node_id, self.seed)

    # -- time ----------------------------------------------------------------------
    # (A deadline's random error is drawn by job.retry_deadline / job.gc_deadline from
    # ``randbits``: getrandbits() is C and returns an int; randrange() is pure Python and
    # showed up at 10 % of ADDJOB time in profiles, int(random() * n) costs twice as much.)
    def wall_ms(self) -> int:
        return self.now + self.wall_offset

    # -- queues --------------------------------------------------------------------
    def get_queue(self, name: bytes) -> Queue:
        q = self.queues.get(name)
        if q is None:
            self._queue_seq += 1
            q = Queue(name, self.now, self._queue_seq, self.groups)
            self.queues[name] = q
        return q

    # -- outbox --------------------------------------------------------------------
    def send(self, nodes: Iterable[str], message: tuple) -> None:
        """Send ``message`` to each of ``nodes`` but this one."""
        me = self.id
        effects = self.effects
        for node in nodes:
            if node != me:
                effects.append(Send(node, message))

    def send_lazy(self, nodes: Iterable[str], message: tuple) -> None:
        """Like ``send``, for ack GC messages: they leave within GC_MESSAGE_DELAY_MS."""
        me = self.id
        lazy = self.lazy
        for node in nodes:
            if node != me:
                lazy.append(Send(node, message))
        if lazy:
            if len(lazy) >= GC_MESSAGE_BATCH_MAX:
                self.flush_lazy()
            elif not self.lazy_at:
                self.lazy_at = self.now + GC_MESSAGE_DELAY_MS

    def flush_lazy(self) -> None:
        self.effects.extend(self.lazy)
        self.lazy = []
        self.lazy_at = 0
