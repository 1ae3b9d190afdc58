"""What one node's machines share: its state, its outbox, and the operations they lend each other.

Theory of operation
-------------------
A node is eight machines (``lifecycle``, ``requeue``, ``acks``, ``replication``,
``federation``, ``blocking``, ``delivery``, ``dedup``) composed by ``node.Node``. They share one
``Context``, made first and handed to each machine's constructor:

* plain state every machine reads: the node's ID and clock (``now``, set by
  ``Node`` on every input), the job store and its schedule (``store``), the
  queues by name (``queues``), the counters (``stats``), the random source,
  and the cluster view the membership layer keeps current through ``Node``
  (``cluster_size``, ``reachable``, ``backlogged``, ``known_nodes``,
  ``leaving``);
* the outbox: ``effects`` (what ``Node.take_effects`` hands the shell),
  ``send`` and ``send_lazy`` (ack GC messages, batched for up to
  ``GC_MESSAGE_DELAY_MS``);
* two shared work lists, each with one consumer: ``ready`` (queues that got
  a job while clients wait on them; anyone adds, ``Blocking`` serves them at
  the end of each input) and ``push_leases`` (``Federation``'s leases, which
  ``Requeue.enqueue_job`` only tests for emptiness and membership);
* the operations one machine offers the others, by name (the list below,
  with the machine that provides each). ``Node`` fills them in once every
  machine exists, so no machine imports another: this module is the lowest
  of the core's node modules, and everything reaches the others through it.
  A machine calls ``ctx.delete_job(job)``, never ``lifecycle._something``.
"""

from __future__ import annotations

import random
from typing import Any, Callable, Final, TYPE_CHECKING, final

from . import ids as ids_mod
from .effects import Send
from .job import TIME_ERROR_MS  # noqa: F401  (re-exported: deadlines' random error, job.py)
from .queues import Queue
from .store import JobStore

if TYPE_CHECKING:  # only lower modules: nothing here imports this one back
    from .job import Job

__all__ = ["Context", "TIME_ERROR_MS", "GC_MESSAGE_DELAY_MS", "GC_MESSAGE_BATCH_MAX"]

# Ack garbage-collection messages (SETACK, GOTACK, DELJOB) wait up to this
# long so that those of many jobs share one bus frame and one wake-up of the
# peer; nothing waits on them but memory (see docs/ARCHITECTURE.md).
GC_MESSAGE_DELAY_MS: Final = 5
GC_MESSAGE_BATCH_MAX: Final = 1024


def _unbound(*args: Any) -> Any:
    raise RuntimeError("Context operation used before Node bound it")


# The operations lent between machines, by name: Context's annotated callables below (a
# compiled class has no ``__annotations__`` to read them from; tests/core checks the two agree).
PORTS: Final = (
    "reschedule", "delete_job", "enqueue_job", "dequeue_job", "requeue_due", "acknowledge", "gc_due", "bury",
    "is_buried", "replication_achieved", "replication_failed", "replication_dropped", "replicate_job",
    "delivered", "timed_out", "dead_letter_copied", "replication_add", "dedup_addjob", "dedup_merge",
    "dedup_gone", "dedup_deleted", "dedup_remember", "fetch", "need_jobs", "renew_on_take", "push_if_wanted",
)  # fmt: skip


@final
class Context:
    # Slots, not a dict: the machines read and set these on every input, and a dict this size
    # (over 30 keys) is past what CPython's attribute caches handle best (see __slots__ below).
    # Operations lent between machines (filled in by Node; see the module docstring).
    # lifecycle: the job table's schedule and a job's end
    reschedule: Callable[["Job"], None]  # recompute the job's one wake-up (ONE_TIMER)
    delete_job: Callable[["Job"], None]  # forget a job here (expiry, DELJOB, GC ...)
    # requeue: putting jobs in queues and taking them out
    enqueue_job: Callable[..., bool]  # (job, nack=False): queue it (or push it); False if not
    dequeue_job: Callable[["Job"], bool]  # queued -> active
    requeue_due: Callable[["Job"], None]  # the job's requeue / WILLQUEUE time may have come
    # acks: acknowledgement, its GC, tombstones
    acknowledge: Callable[..., None]  # (job, schedule_gc=True): ACK_ONCE
    gc_due: Callable[["Job"], None]  # one GC attempt for an acked job
    bury: Callable[[bytes], None]  # remember a dead job's ID for a while
    is_buried: Callable[[bytes], bool]
    # replication: the client of a job waiting for its copies
    replication_achieved: Callable[["Job"], bool]  # enough copies; False if forgotten here
    replication_failed: Callable[..., None]  # (job, reply, deleted_elsewhere=False): tell the client, delete every copy
    replication_dropped: Callable[["Job"], None]  # a wait-repl job is being deleted here
    replicate_job: Callable[["Job", int, bool], int]  # (job, more holders, noreply): send copies
    # delivery: delivery limits and dead letters (jobs with an Extra only)
    delivered: Callable[["Job"], None]  # a job with an Extra was handed to a consumer
    timed_out: Callable[["Job"], bool]  # its RETRY ended while active: True if dead-lettered
    dead_letter_copied: Callable[["Job", str], None]  # a GOTJOB for a dead letter made here
    # replication: ADDJOB's work once parsed (dedup.py calls it when a DEDUP job is to be made)
    replication_add: Callable[[int, Any, "bytes | None"], Any]
    # dedup: DEDUP keys
    dedup_addjob: Callable[[int, Any], Any]  # ADDJOB with a DEDUP key: a hit, BLOCKED, or made
    dedup_merge: Callable[["Job", str, bool, bool], None]  # a copy of a DEDUP job held here came (made there?, holders learned?)
    dedup_gone: Callable[[bytes], bool]  # a DEDUP job's ID within its window after deletion here
    dedup_deleted: Callable[["Job"], None]  # a DEDUP job is deleted here: remember its ID
    dedup_remember: Callable[[bytes, int], None]  # (ID, until): remember a deleted DEDUP job's ID (AOF)
    # blocking: delivery to consumers
    fetch: Callable[[Queue], "Job | None"]  # take the queue's first job for delivery
    # federation: moving jobs between nodes
    need_jobs: Callable[[Queue, int], None]  # ask other nodes for jobs of this queue
    renew_on_take: Callable[[Queue], None]  # a consumer took a job: top-up rule
    push_if_wanted: Callable[[Queue, "Job"], bool]  # push to a leased peer instead of queueing

    __slots__ = (
        *PORTS,
        "id", "myself_only", "seed", "ids", "now", "wall_offset", "address", "rng", "randbits", "store",
        "queues", "_queue_seq", "stats", "bus_stats", "cluster_size", "reachable", "backlogged",
        "known_nodes", "live_nodes", "leaving", "journal", "memory_level", "effects", "lazy", "lazy_at", "ready", "push_leases",
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
        self.bus_stats = {"messages_malformed": 0}  # peers' messages dropped (Node.bus_stats)
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
        # What the AOF must learn (store.J_LOAD ...): the store's list, or None without an AOF.
        self.journal: list | None = None
        # 0-3, set by memory.Memory: >= 1 replicate new jobs externally, >= 2 evict idle queues
        # after 2 s (see memory.py).
        self.memory_level = 0
        # Outbox.
        self.effects: list[Any] = []
        self.lazy: list[Any] = []  # Sends held back until lazy_at (GC_MESSAGE_DELAY_MS)
        self.lazy_at = 0
        # Shared work lists (never rebound: Node and machines keep references to them).
        self.ready: dict[bytes, Queue] = {}
        self.push_leases: dict[bytes, dict[str, list[int]]] = {}
        for name in PORTS:
            if not hasattr(self, name):
                setattr(self, name, _unbound)

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
            q = Queue(name, self.now, self._queue_seq)
            self.queues[name] = q
        return q

    # -- outbox --------------------------------------------------------------------
    def send(self, nodes: Any, message: tuple) -> None:
        """Send ``message`` to each of ``nodes`` but this one."""
        me = self.id
        effects = self.effects
        for node in nodes:
            if node != me:
                effects.append(Send(node, message))

    def send_lazy(self, nodes: Any, message: tuple) -> None:
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
