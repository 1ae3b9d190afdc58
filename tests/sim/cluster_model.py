"""A deterministic fault-injection model of a disque-py cluster.

Theory of operation
-------------------
``SimCluster`` runs N sans-I/O job cores (:class:`disque_py.core.node.Node`)
in one thread on a virtual clock. Nothing real happens: no socket, no task,
no wall clock. Everything random (node IDs, node RNG seeds, latencies, loss,
duplication, workload) comes from one integer seed, so a seed is a complete
description of a run and replays bit for bit (see ``trace_digest``).

* Time. ``now`` is virtual milliseconds starting at ``T0``. Every node sees
  its own monotonic clock, ``now + mono_offset[i]`` (different origins, as on
  different machines), and its own wall clock, ``wall_offset[i]`` apart from
  the others by at most ``wall_skew_ms``. A node is ticked at its
  ``next_wakeup()`` and at least every ``TICK_MAX_MS``.
* Network. A ``Send`` effect becomes ``cluster_bus.messages.Data``, is
  encoded with the real bus codec, sits in a heap of deliveries for a random
  latency in ``delay``, then is decoded and handed to ``receive_data``. On the
  way it may be lost (``loss``) or duplicated (``dup``); independent latencies
  reorder messages unless ``reorder=False`` (then each link is FIFO). A
  message is dropped when its link is cut: a partition between the two
  nodes, or either end crashed, at send time or at any moment while in
  flight (as a TCP link torn down with its buffers). A YOURJOBS carrying a
  RETRY 0 job cut at send time comes back to its sender
  (``Node.on_moves_unsent``), as the shell hands back moves that never
  left; one lost or cut in flight does not. Before each tick a
  node's ``backlogged`` set names the peers it has messages in flight to,
  as the real shell names links with output not yet taken by the socket.
* Membership. Each node's ``cluster_size``/``known_nodes``/``reachable``/
  ``leaving`` are set by the model: reachable = alive, not partitioned away,
  not leaving. Changes reach the nodes' views after ``detect_delay_ms``
  (0 = at once), like failure detection lag.
* Faults: ``partition(*groups)``, ``heal()``, ``crash(i)`` (the node object is
  dropped: no ticks, its links cut, its blocked clients gone), ``restart(i)``
  (a new ``Node`` with the same ID and empty memory), ``set_leaving(i, flag)``,
  ``link_down(a, b)`` / ``link_up(a, b)`` (a's own link to b only, as a TCP link
  torn down and reconnected: b's link to a, and b's view of a, unchanged).
* Clients. ``client(i)`` returns a :class:`SimClient`; ``cmd(...)`` runs a
  command now and returns its reply or ``BLOCKED``; a blocked client's reply
  arrives as a ``Reply`` effect, is kept in ``replies[(i, client_id)]`` and
  ends ``wait_reply()``.
* Ledger. :class:`Ledger` records what clients were told and did (job IDs
  returned by ADDJOB with the holders at that moment, deliveries, acks,
  crashes with the jobs each one wiped) for the end-of-run checks.
* Failures. Any exception raised by a node (its message handlers' included:
  ``receive_data`` lets them through), any invariant it breaks after an
  input (``disque_py/core/invariants.py``, checked after every one) and any
  message of a node dropped as malformed becomes a :class:`SimFailure` naming the seed, the virtual time and a one-line
  replay command; so does ``SimCluster.fail``. ``tests/sim/conftest.py``
  adds the seeds of every cluster a failing test built to its report.
"""

from __future__ import annotations

import hashlib
import heapq
import os
import random
import re
import shlex
from collections import Counter, defaultdict, deque
from dataclasses import dataclass, field
from typing import Any, Callable, Iterable

from cluster_bus.codec import decode_message, encode_message
from cluster_bus.messages import Data
from disque_py.core import invariants
from disque_py.core.effects import BLOCKED, Reply, Send
from disque_py.core.ids import dead_letter_id
from disque_py.core.messages import moves_to_watch
from disque_py.core.job import ACKED, ACTIVE, QUEUED, STATE_NAMES, WAIT_REPL
from disque_py.core.node import Node
from disque_py.core.replies import NULL_ARRAY, Error, Status
from disque_py.core.wire import job_from_wire

__all__ = [
    "T0",
    "TICK_MAX_MS",
    "BLOCKED",
    "NULL_ARRAY",
    "WAIT_REPL",
    "ACTIVE",
    "QUEUED",
    "ACKED",
    "SimCluster",
    "SimClient",
    "SimFailure",
    "ClientGone",
    "Ledger",
    "AddRecord",
    "RandomRun",
    "created_clusters",
]

T0 = 1_000_000_000  # virtual ms at the start of every run
WALL_EPOCH = 1_700_000_000_000  # wall-clock ms at T0 (before per-node skew)
TICK_MAX_MS = 100  # a live node is ticked at least this often
INTROSPECT_CLIENT = 0  # client id the harness uses for SHOW (never handed out)
_INF = float("inf")
_EV_DELIVER = 0
_EV_VIEW = 1
_EV_CALL = 2

# Clusters built by the running test (the last few); conftest.py reports their seeds on failure.
_created: deque["SimCluster"] = deque(maxlen=20)


def created_clusters() -> list["SimCluster"]:
    return list(_created)


def reset_created() -> None:
    _created.clear()


def default_replay_command() -> str:
    """Re-run the current pytest test (the model is deterministic)."""
    current = os.environ.get("PYTEST_CURRENT_TEST", "")
    nodeid = current.rsplit(" ", 1)[0] if current else "tests/sim"
    prefix = ""
    if os.environ.get("PYTHONHASHSEED"):
        prefix = "PYTHONHASHSEED=%s " % os.environ["PYTHONHASHSEED"]
    return prefix + ".venv/bin/pytest " + shlex.quote(nodeid)


class SimFailure(AssertionError):
    """A check failed or a node raised; the message says how to replay it."""


class ClientGone(Exception):
    """The client's node crashed (or the client was closed) before it got its reply."""


# ---------------------------------------------------------------------------
# Ledger
# ---------------------------------------------------------------------------
@dataclass
class AddRecord:
    job_id: bytes
    node: int  # where ADDJOB ran
    time: int  # virtual ms the ID was returned
    queue: bytes
    retry: int
    replicate: int
    async_: bool
    holders: tuple[int, ...]  # nodes holding a copy when the ID was returned


@dataclass
class Ledger:
    """What clients were told and did, for end-of-run checks."""

    adds: dict[bytes, AddRecord] = field(default_factory=dict)
    deliveries: list[tuple[int, int, bytes]] = field(default_factory=list)  # (t, node, id)
    delivered: Counter = field(default_factory=Counter)  # id -> times delivered
    acks: list[tuple[int, int, bytes, str]] = field(default_factory=list)  # (t, node, id, ACKJOB|FASTACK)
    acked: dict[bytes, int] = field(default_factory=dict)  # id -> first ack time
    nacks: list[tuple[int, int, bytes]] = field(default_factory=list)
    working: list[tuple[int, int, bytes]] = field(default_factory=list)
    crashes: list[tuple[int, int, dict[bytes, int]]] = field(default_factory=list)  # (t, node, id -> state)
    restarts: list[tuple[int, int]] = field(default_factory=list)
    lost: dict[bytes, set[int]] = field(default_factory=lambda: defaultdict(set))  # id -> nodes that lost a copy

    def on_command(self, t: int, node: int, argv: list[bytes]) -> None:
        name = argv[0].upper()
        if name in (b"ACKJOB", b"FASTACK"):
            for job_id in argv[1:]:
                self.acks.append((t, node, job_id, name.decode()))
                self.acked.setdefault(job_id, t)
        elif name == b"NACK":
            for job_id in argv[1:]:
                self.nacks.append((t, node, job_id))
        elif name == b"WORKING":
            self.working.append((t, node, argv[1]))

    def on_reply(self, cluster: "SimCluster", node: int, argv: list[bytes], value: Any) -> None:
        name = argv[0].upper()
        t = cluster.now
        if name == b"ADDJOB":
            if isinstance(value, bytes) and len(value) == 40:
                job_id = bytes(value)
                opts = _addjob_options(argv, cluster.n)
                self.adds[job_id] = AddRecord(
                    job_id, node, t, argv[1], opts["retry"], opts["replicate"], opts["async"],
                    tuple(cluster.holders(job_id)),
                )  # fmt: skip
        elif name == b"GETJOB":
            if isinstance(value, list):
                for item in value:
                    job_id = bytes(item[1])
                    self.deliveries.append((t, node, job_id))
                    self.delivered[job_id] += 1

    def on_move_dropped(self, node: int, jobs: list) -> None:
        """A YOURJOBS was dropped: its at-most-once jobs had no other copy.

        Moving a RETRY 0 job moves its only copy (duplicating it would break
        at-most-once), so a move whose link fails loses it, exactly like a
        crash of the node holding it; at-least-once jobs keep their other
        copies and are not affected.
        """
        for wire in jobs:
            job = job_from_wire(wire, 0)
            if job is not None and job.retry == 0:
                self.lost[bytes(job.id)].add(node)

    def on_crash(self, t: int, node: int, jobs: dict[bytes, int]) -> None:
        self.crashes.append((t, node, jobs))
        for job_id in jobs:
            self.lost[job_id].add(node)


def _addjob_options(argv: list[bytes], n_nodes: int) -> dict[str, Any]:
    out: dict[str, Any] = {"replicate": None, "retry": None, "ttl": 86400, "async": False}
    i = 4
    while i < len(argv):
        opt = argv[i].lower()
        if opt == b"async":
            out["async"] = True
            i += 1
            continue
        if opt in (b"replicate", b"retry", b"ttl", b"delay", b"maxlen") and i + 1 < len(argv):
            out[opt.decode()] = int(argv[i + 1])
            i += 2
            continue
        i += 1
    if out["replicate"] is None:
        out["replicate"] = min(3, n_nodes)
    if out["retry"] is None:
        out["retry"] = max(1, min(out["ttl"] // 10, 300))
    return out


# ---------------------------------------------------------------------------
# Clients
# ---------------------------------------------------------------------------
class SimClient:
    """One client connection to one node."""

    def __init__(self, cluster: "SimCluster", node: int, client_id: int) -> None:
        self.cluster = cluster
        self.node = node
        self.id = client_id
        self.incarnation = cluster.incarnation[node]
        self.pending: list[bytes] | None = None  # argv of the command waiting for its reply
        self.pending_since = 0
        self.replies: list[Any] = []
        self.gone = False

    def __repr__(self) -> str:
        return "<SimClient %d on node %d%s>" % (self.id, self.node, " gone" if self.gone else "")

    @property
    def last(self) -> Any:
        return self.replies[-1] if self.replies else None

    def cmd(self, *args: Any) -> Any:
        """Run a command now; its reply, or BLOCKED (then see ``wait_reply``)."""
        if self.gone:
            raise ClientGone("%r: its node crashed or it was closed" % self)
        if self.pending is not None:
            raise RuntimeError("%r is still waiting for %r" % (self, self.pending[0]))
        argv = [a if isinstance(a, bytes) else str(a).encode() for a in args]
        return self.cluster._execute(self, argv)

    def wait_reply(self, max_ms: int = 10_000) -> Any:
        """Run the simulation until the pending reply arrives; return it.

        If the last command's reply is already in, it is returned at once.
        """
        if self.pending is None:
            if self.replies:
                return self.replies[-1]
            raise RuntimeError("%r has sent no command" % self)
        argv = self.pending
        self.cluster.try_run_until(lambda: self.pending is None or self.gone, max_ms)
        if self.gone:
            raise ClientGone("%r: node %d went away before replying to %r" % (self, self.node, argv[0]))
        if self.pending is not None:
            self.cluster.fail("client %d on node %d got no reply to %r within %d ms" % (self.id, self.node, argv, max_ms))
        return self.replies[-1]

    def close(self) -> None:
        if self.gone:
            return
        self.gone = True
        self.pending = None
        if self.cluster.alive[self.node] and self.cluster.incarnation[self.node] == self.incarnation:
            self.cluster._call_node(self.node, "client_closed", self.id)

    def _resolve(self, value: Any) -> None:
        argv = self.pending
        self.pending = None
        self.replies.append(value)
        if argv is not None:
            self.cluster._after_reply(self, argv, value)


# ---------------------------------------------------------------------------
# The cluster
# ---------------------------------------------------------------------------
class SimCluster:
    def __init__(
        self,
        n_nodes: int,
        seed: int,
        *,
        loss: float = 0.0,
        dup: float = 0.0,
        delay: tuple[int, int] = (1, 5),
        reorder: bool = True,
        detect_delay_ms: int = 0,
        mono_offsets: bool = True,
        wall_skew_ms: int = 50,
        record_trace: bool = False,
        trace_tail: int = 400,
        replay: str | None = None,
    ) -> None:
        if n_nodes < 1:
            raise ValueError("n_nodes >= 1")
        self.n = n_nodes
        self.seed = seed
        self.loss = loss
        self.dup = dup
        self.delay = delay
        self.reorder = reorder
        self.detect_delay_ms = detect_delay_ms
        self.replay = replay
        self.rng = random.Random(seed)
        self.now = T0
        self.ids: list[str] = []
        while len(self.ids) < n_nodes:  # distinct 8-hex prefixes (they start job IDs)
            nid = "%040x" % self.rng.getrandbits(160)
            if all(nid[:8] != other[:8] for other in self.ids):
                self.ids.append(nid)
        self.index = {nid: i for i, nid in enumerate(self.ids)}
        self.mono_offset = [self.rng.randrange(0, 10**9) if mono_offsets else 0 for _ in range(n_nodes)]
        self.wall_offset = [
            WALL_EPOCH - T0 + (self.rng.randint(-wall_skew_ms, wall_skew_ms) if wall_skew_ms else 0)
            - self.mono_offset[i]
            for i in range(n_nodes)
        ]  # fmt: skip
        self.alive = [True] * n_nodes
        self.incarnation = [0] * n_nodes
        self.leaving_flag = [False] * n_nodes
        self.forgotten: set[int] = set()  # given up on by CLUSTER FORGET on every other node
        self.group_of = [0] * n_nodes
        self.links_down: set[tuple[int, int]] = set()  # (a, b): a's own link to b is down (link_down)
        self._cut = [[0] * n_nodes for _ in range(n_nodes)]  # link epochs: bumped when a link is torn down
        self._link_last = [[0] * n_nodes for _ in range(n_nodes)]  # FIFO mode: last delivery time per link
        # messages sent and not yet delivered (or dropped in flight), per link: what a node's
        # ``backlogged`` set is made of before each tick, as the shell's unsent link output
        self._inflight = [[0] * n_nodes for _ in range(n_nodes)]
        self.nodes: list[Node | None] = [None] * n_nodes
        self._next_tick: list[float] = [_INF] * n_nodes
        self._last_tick = [T0] * n_nodes
        self._same_ms_ticks = [0] * n_nodes
        self._events: list[tuple[int, int, int, Any]] = []
        self._seq = 0
        self._next_client = INTROSPECT_CLIENT + 1
        self.clients: dict[tuple[int, int], SimClient] = {}
        self.replies: dict[tuple[int, int], list[Any]] = defaultdict(list)
        self.ledger = Ledger()
        self.reply_hooks: list[Callable[[SimClient, list[bytes], Any], None]] = []
        self.stats: Counter = Counter()
        self.latencies: list[int] = []  # of delivered messages (first 10k)
        self._trace_hash = hashlib.blake2b(digest_size=16)
        self.trace: list[str] | None = [] if record_trace else None
        self.trace_tail: deque[str] = deque(maxlen=trace_tail)
        for i in range(n_nodes):
            self._boot(i)
        self._apply_views()
        _created.append(self)

    # ------------------------------------------------------------------ utils
    def __repr__(self) -> str:
        return "<SimCluster n=%d seed=%d t=%d ms>" % (self.n, self.seed, self.elapsed)

    @property
    def elapsed(self) -> int:
        """Virtual ms since the start."""
        return self.now - T0

    def node(self, i: int) -> Node:
        node = self.nodes[i]
        if node is None:
            raise ClientGone("node %d is down" % i)
        return node

    def node_now(self, i: int) -> int:
        return self.now + self.mono_offset[i]

    def replay_command(self) -> str:
        return self.replay or default_replay_command()

    def describe(self) -> str:
        return "seed=%d t=%d ms; replay: %s" % (self.seed, self.elapsed, self.replay_command())

    def fail(self, message: str, *, tail: bool = True) -> None:
        text = "%s\n  [sim %s]" % (message, self.describe())
        if tail:
            text += "\n  last events:\n" + "\n".join(list(self.trace_tail)[-40:])
        raise SimFailure(text)

    def check(self, condition: Any, message: str) -> None:
        if not condition:
            self.fail(message)

    def _note(self, text: str, quiet: bool = False) -> None:
        line = "%8d %s" % (self.elapsed, text)
        self._trace_hash.update(line.encode())
        if self.trace is not None:
            self.trace.append(line)
        if not quiet:
            self.trace_tail.append(line)

    def trace_digest(self) -> str:
        """A hash of every event so far; equal digests = identical runs."""
        return self._trace_hash.hexdigest()

    # ---------------------------------------------------------------- nodes
    def _boot(self, i: int) -> None:
        inc = self.incarnation[i]
        node_seed = hashlib.sha256(b"%d:%d:%d" % (self.seed, i, inc)).digest()[:16]
        node = Node(
            self.ids[i],
            seed=node_seed,
            now=self.node_now(i),
            wall_offset=self.wall_offset[i],
            address=("127.0.0.%d" % (i + 1), 7711),
        )
        node.ctx.leaving = self.leaving_flag[i]
        self.nodes[i] = node
        self.alive[i] = True
        self._last_tick[i] = self.now
        self._set_view(i)
        self._schedule_tick(i)

    def _call_node(self, i: int, method: str, *args: Any) -> Any:
        node = self.nodes[i]
        assert node is not None
        try:
            result = getattr(node, method)(*args)
            invariants.check(node)  # core/invariants.py, after every input
            if node.bus_stats["messages_malformed"]:  # every message here comes from a real node
                raise AssertionError("a message from a node was dropped as malformed")
        except SimFailure:
            raise
        except Exception as e:  # noqa: BLE001 - any exception in a node fails the run
            tail = "\n".join(list(self.trace_tail)[-40:])
            raise SimFailure(
                "node %d raised in %s%r: %r\n  [sim %s]\n  last events:\n%s"
                % (i, method, _short(args), e, self.describe(), tail)
            ) from e
        self._flush(i)
        self._schedule_tick(i)
        return result

    def _schedule_tick(self, i: int) -> None:
        node = self.nodes[i]
        if node is None:
            self._next_tick[i] = _INF
            return
        at = self._last_tick[i] + TICK_MAX_MS
        wake = node.next_wakeup()
        if wake is not None:
            wake -= self.mono_offset[i]
            if wake < at:
                at = wake if wake > self.now else self.now
        self._next_tick[i] = at

    def _tick(self, i: int) -> None:
        if self._last_tick[i] == self.now:
            self._same_ms_ticks[i] += 1
            if self._same_ms_ticks[i] > 1000:
                self.fail("node %d: next_wakeup() keeps returning a past time (busy loop)" % i)
        else:
            self._same_ms_ticks[i] = 0
        self._last_tick[i] = self.now
        self.stats["ticks"] += 1
        node = self.nodes[i]
        if node is not None:
            ids = self.ids
            node.ctx.backlogged = frozenset(ids[j] for j, n in enumerate(self._inflight[i]) if n)
        self._call_node(i, "tick", self.node_now(i))

    # -------------------------------------------------------------- effects
    def _flush(self, i: int) -> None:
        node = self.nodes[i]
        if node is None:
            return
        effects = node.take_effects()
        if not effects:
            return
        for effect in effects:
            kind = type(effect)
            if kind is Reply:
                self._deliver_reply(i, effect.client, effect.value)
            elif kind is Send:
                self._send(i, effect)
            else:
                self.fail("node %d produced an unknown effect %r" % (i, effect))

    def _send(self, src: int, effect: Send) -> None:
        message = effect.message
        kind = message[0]
        what = kind + _job_tag(message)
        dst = self.index.get(effect.to)
        try:
            frame = encode_message(Data(self.ids[src], kind, list(message[1:])))
        except Exception as e:  # noqa: BLE001 - the real bus would fail the same way
            self.fail("node %d sent a message the bus cannot encode: %r -> %r" % (src, message, e))
        self.stats["sent"] += 1
        self.stats["sent:" + kind] += 1
        if kind == "YOURJOBS":
            self._moving = (src, message[1])
        else:
            self._moving = None
        if dst is None or dst == src:
            self._never_left(src, effect)
            self.stats["dropped_unknown"] += 1
            self._note("S %d->? %s unknown destination %s" % (src, what, effect.to[:8]))
            return
        if not self.connected(src, dst) or (src, dst) in self.links_down:
            self._never_left(src, effect)
            self.stats["dropped_cut"] += 1
            self._note("S %d->%d %s cut" % (src, dst, what))
            return
        rng = self.rng
        if self.loss and rng.random() < self.loss:
            self._move_dropped()
            self.stats["lost"] += 1
            self._note("S %d->%d %s lost" % (src, dst, what))
            return
        copies = 2 if self.dup and rng.random() < self.dup else 1
        if copies == 2:
            self.stats["duplicated"] += 1
        lo, hi = self.delay
        for c in range(copies):
            at = self.now + (rng.randint(lo, hi) if hi > lo else lo)
            if not self.reorder:
                last = self._link_last[src][dst]
                if at < last:
                    at = last
                self._link_last[src][dst] = at
            payload = (src, dst, frame, what, self._cut[src][dst], self.incarnation[src], self.incarnation[dst], self.now)
            self._push(at, _EV_DELIVER, payload)
            self._inflight[src][dst] += 1
        self._note("S %d->%d %s x%d" % (src, dst, what, copies))

    def _never_left(self, src: int, effect: Send) -> None:
        """A message with no link to leave on. A move that carries the only copy of a job comes
        back to its sender as the shell hands it back (``Bus.send_item(watch=...)``, then
        ``Node.on_moves_unsent``), in a later event: the link's end is noticed after the send.
        Anything else is dropped; moves lost in flight are not handed back (they may arrive)."""
        message = effect.message
        if message[0] != "YOURJOBS" or not moves_to_watch(message):
            self._move_dropped()
            return
        incarnation = self.incarnation[src]

        def back() -> None:
            if self.nodes[src] is None or self.incarnation[src] != incarnation:
                self.ledger.on_move_dropped(src, message[1])  # gone with the node's memory
                return
            self.stats["moves_returned"] += 1
            self._note("B %d moves back %s" % (src, _job_tag(message)))
            self._call_node(src, "on_moves_unsent", effect.to, message, self.node_now(src))

        self.at(0, back)

    def _move_dropped(self) -> None:
        if self._moving is not None:
            self.ledger.on_move_dropped(*self._moving)

    def _deliver(self, payload: tuple) -> None:
        src, dst, frame, kind, epoch, src_inc, dst_inc, sent_at = payload
        self._inflight[src][dst] -= 1
        if (
            not self.alive[dst]
            or self.incarnation[dst] != dst_inc
            or self.incarnation[src] != src_inc
            or self._cut[src][dst] != epoch
            or not self.connected(src, dst)
            or (src, dst) in self.links_down
        ):
            self.stats["dropped_in_flight"] += 1
            self._note("R %d<-%d %s dropped in flight" % (dst, src, kind))
            if kind.startswith("YOURJOBS"):
                try:
                    self.ledger.on_move_dropped(src, decode_message(frame).body[0])
                except Exception:  # noqa: BLE001 - accounting only
                    pass
            return
        try:
            msg = decode_message(frame)
        except Exception as e:  # noqa: BLE001
            self.fail("the bus codec cannot decode what node %d sent (%s): %r" % (src, kind, e))
        self.stats["delivered"] += 1
        if len(self.latencies) < 10_000:
            self.latencies.append(self.now - sent_at)
        self._note("R %d<-%d %s" % (dst, src, kind))
        self._call_node(dst, "receive_data", msg.sender, msg.kind, msg.body, self.node_now(dst))

    def _deliver_reply(self, i: int, client_id: int, value: Any) -> None:
        self.replies[(i, client_id)].append(value)
        self._note("P %d c%d %s" % (i, client_id, _short(value)))
        client = self.clients.get((i, client_id))
        if client is not None and not client.gone:
            client._resolve(value)

    def _after_reply(self, client: SimClient, argv: list[bytes], value: Any) -> None:
        self.ledger.on_reply(self, client.node, argv, value)
        for hook in self.reply_hooks:
            hook(client, argv, value)

    # --------------------------------------------------------------- clients
    def client(self, i: int) -> SimClient:
        self.node(i)  # raises if down
        cid = self._next_client
        self._next_client += 1
        c = SimClient(self, i, cid)
        self.clients[(i, cid)] = c
        return c

    def _execute(self, client: SimClient, argv: list[bytes]) -> Any:
        i = client.node
        if not self.alive[i] or self.incarnation[i] != client.incarnation:
            client.gone = True
            raise ClientGone("%r: node %d is down or restarted" % (client, i))
        self.ledger.on_command(self.now, i, argv)
        node = self.nodes[i]
        assert node is not None
        try:
            reply = node.execute(client.id, argv, self.node_now(i))
        except Exception as e:  # noqa: BLE001
            raise SimFailure("node %d raised on %r: %r\n  [sim %s]" % (i, argv, e, self.describe())) from e
        self._note("C %d c%d %s -> %s" % (i, client.id, _short(argv), _short(reply)), quiet=reply is NULL_ARRAY)
        if reply is BLOCKED:
            client.pending = argv
            client.pending_since = self.now
        else:
            client.replies.append(reply)
            self.replies[(i, client.id)].append(reply)
        self._flush(i)
        self._schedule_tick(i)
        if reply is not BLOCKED:
            self._after_reply(client, argv, reply)
        return reply

    def cmd(self, i: int, *args: Any) -> Any:
        """One-shot command on node i through a fresh client."""
        return self.client(i).cmd(*args)

    # ----------------------------------------------------------- introspection
    def holders(self, job_id: bytes, *, include_dummy: bool = False) -> list[int]:
        """Live nodes that have the job registered (any state)."""
        job_id = bytes(job_id)
        out = []
        for i, node in enumerate(self.nodes):
            if node is None:
                continue
            job = node.store.get(job_id)
            if job is not None and (include_dummy or job.delivered or job.queue is not None):
                out.append(i)
        return out

    def state_of(self, i: int, job_id: bytes) -> int | None:
        node = self.nodes[i]
        if node is None:
            return None
        job = node.store.get(bytes(job_id))
        return None if job is None else job.state

    def states(self, job_id: bytes) -> dict[int, str]:
        """{node: state name} over live nodes that know the job."""
        out = {}
        for i in range(self.n):
            s = self.state_of(i, job_id)
            if s is not None:
                out[i] = STATE_NAMES[s]
        return out

    def queued_on(self, job_id: bytes) -> list[int]:
        return [i for i in range(self.n) if self.state_of(i, job_id) == QUEUED]

    def jobs_everywhere(self) -> dict[int, dict[bytes, int]]:
        """{node: {job id: state}} for every live node."""
        return {
            i: {jid: j.state for jid, j in node.store.items()}
            for i, node in enumerate(self.nodes)
            if node is not None
        }

    def show(self, i: int, job_id: bytes) -> dict[str, Any] | None:
        """SHOW on node i as a dict; node IDs in lists come back as str."""
        node = self.node(i)
        value = node.execute(INTROSPECT_CLIENT, [b"SHOW", bytes(job_id)], self.node_now(i))
        self._flush(i)
        if value is None:
            return None
        if isinstance(value, Error):
            self.fail("SHOW on node %d answered %r" % (i, value))
        out: dict[str, Any] = {}
        for key, val in zip(value[::2], value[1::2]):
            key = key.decode() if isinstance(key, bytes) else str(key)
            if key in ("nodes-delivered", "nodes-confirmed"):
                val = [v.decode() if isinstance(v, bytes) else v for v in val]
            elif key == "state" and isinstance(val, bytes):
                val = val.decode()
            out[key] = val
        return out

    # --------------------------------------------------------------- topology
    def connected(self, a: int, b: int) -> bool:
        return self.alive[a] and self.alive[b] and self.group_of[a] == self.group_of[b]

    def _sever(self, a: int, b: int) -> None:
        self._cut[a][b] += 1
        self._cut[b][a] += 1

    def partition(self, *groups: Iterable[int]) -> None:
        """Only nodes in the same group talk; nodes in no group are isolated."""
        before = [[self.group_of[a] == self.group_of[b] for b in range(self.n)] for a in range(self.n)]
        group_of = [-(i + 1) for i in range(self.n)]
        for g, members in enumerate(groups):
            for i in members:
                if not 0 <= i < self.n:
                    raise ValueError("no node %d" % i)
                group_of[i] = g
        self.group_of = group_of
        for a in range(self.n):
            for b in range(a + 1, self.n):
                if before[a][b] and group_of[a] != group_of[b]:
                    self._sever(a, b)
        self._note("F partition %s" % ([sorted(g) for g in groups],))
        self._topology_changed()

    def link_down(self, a: int, b: int) -> None:
        """Node a's own link to node b is torn down, with what it carried: a's view loses b (after
        ``detect_delay_ms``, as the others), b's link to a and b's view of a stay as they are."""
        self.links_down.add((a, b))
        self._cut[a][b] += 1
        self._note("F link down %d->%d" % (a, b))
        self._topology_changed()

    def link_up(self, a: int, b: int) -> None:
        """Node a's link to node b is up again (a reconnects): b is in a's view again."""
        self.links_down.discard((a, b))
        self._note("F link up %d->%d" % (a, b))
        self._topology_changed()

    def heal(self) -> None:
        self.group_of = [0] * self.n
        self._note("F heal")
        self._topology_changed()

    def crash(self, i: int) -> None:
        """Stop node i: memory, links and blocked clients are gone."""
        node = self.node(i)
        jobs = {jid: j.state for jid, j in node.store.items() if j.delivered or j.queue is not None}
        self.ledger.on_crash(self.now, i, jobs)
        self.nodes[i] = None
        self.alive[i] = False
        self.incarnation[i] += 1
        for b in range(self.n):
            if b != i:
                self._sever(i, b)
        for (ni, _), c in self.clients.items():
            if ni == i and not c.gone:
                c.gone = True
                c.pending = None
        self._next_tick[i] = _INF
        self._note("F crash %d (%d jobs lost)" % (i, len(jobs)))
        self._topology_changed()

    def restart(self, i: int) -> None:
        """A fresh process with the same node ID and no memory."""
        if self.alive[i]:
            raise RuntimeError("node %d is running" % i)
        self.ledger.restarts.append((self.now, i))
        self._boot(i)
        self._note("F restart %d" % i)
        self._topology_changed()

    def set_leaving(self, i: int, flag: bool = True) -> None:
        self.leaving_flag[i] = flag
        if self.nodes[i] is not None:
            self.nodes[i].ctx.leaving = flag
        self._note("F leaving %d %s" % (i, flag))
        self._topology_changed()

    def forget(self, i: int) -> None:
        """CLUSTER FORGET node i on every other node: the operator gave it up (out of every
        node table, including those of nodes that restart later: nodes.conf keeps it out)."""
        self.forgotten.add(i)
        self._note("F forget %d" % i)
        self._topology_changed()

    def meet(self, i: int) -> None:
        """A forgotten node i joins again under the same ID (CLUSTER MEET): known everywhere."""
        self.forgotten.discard(i)
        self._note("F meet %d" % i)
        self._topology_changed()

    def _topology_changed(self) -> None:
        if self.detect_delay_ms <= 0:
            self._apply_views()
        else:
            self._push(self.now + self.detect_delay_ms, _EV_VIEW, None)

    def _set_view(self, i: int) -> None:
        node = self.nodes[i]
        if node is None:
            return
        known = [j for j in range(self.n) if j == i or j not in self.forgotten]
        node.ctx.cluster_size = len(known)
        node.ctx.known_nodes = [self.ids[j] for j in known]
        node.ctx.reachable = [
            self.ids[j]
            for j in known
            if j != i and self.connected(i, j) and not self.leaving_flag[j] and (i, j) not in self.links_down
        ]  # fmt: skip
        node.ctx.leaving = self.leaving_flag[i]

    def _apply_views(self) -> None:
        for i in range(self.n):
            self._set_view(i)
            self._schedule_tick(i)  # a new view may bring a timer forward, as the shell asks after every pass

    # ------------------------------------------------------------------- time
    def _push(self, at: int, kind: int, payload: Any) -> None:
        self._seq += 1
        heapq.heappush(self._events, (at, self._seq, kind, payload))

    def at(self, delay_ms: int, fn: Callable[[], None]) -> None:
        """Call fn after delay_ms of virtual time (scripted faults)."""
        self._push(self.now + delay_ms, _EV_CALL, fn)

    def _advance(self, target: int, until: Callable[[], bool] | None = None) -> bool:
        events = self._events
        next_tick = self._next_tick
        rng_n = range(self.n)
        while True:
            ev_at = events[0][0] if events else _INF
            tk_at = _INF
            tk_i = -1
            for i in rng_n:
                t = next_tick[i]
                if t < tk_at:
                    tk_at = t
                    tk_i = i
            at = ev_at if ev_at <= tk_at else tk_at
            if at > target:
                break
            if at > self.now:
                self.now = at
            if ev_at <= tk_at:
                _, _, kind, payload = heapq.heappop(events)
                if kind == _EV_DELIVER:
                    self._deliver(payload)
                elif kind == _EV_VIEW:
                    self._apply_views()
                else:
                    payload()
            else:
                self._tick(tk_i)
            if until is not None and until():
                return True
        self.now = target
        return until is not None and until()

    def run_for(self, ms: int) -> None:
        self._advance(self.now + ms)

    def try_run_until(self, predicate: Callable[[], bool], max_ms: int) -> bool:
        """Advance until predicate() holds (checked after every event) or max_ms pass."""
        if predicate():
            return True
        return self._advance(self.now + max_ms, predicate)

    def run_until(self, predicate: Callable[[], bool], max_ms: int, what: str | None = None) -> int:
        """Like try_run_until but fails on timeout; returns the virtual ms it took."""
        start = self.now
        if not self.try_run_until(predicate, max_ms):
            what = what or getattr(predicate, "__name__", "predicate")
            self.fail("timed out after %d virtual ms waiting for %s" % (max_ms, what))
        return self.now - start


def _job_tag(message: tuple) -> str:
    """' <job id>' for trace lines when the message is about one job."""
    if len(message) > 1:
        arg = message[1]
        if isinstance(arg, dict):
            arg = arg.get("id")
        if isinstance(arg, bytes) and len(arg) == 40:
            return " " + arg.decode("ascii", "replace")
    return ""


def _short(value: Any, limit: int = 120) -> str:
    if isinstance(value, (list, tuple)):
        text = "[" + " ".join(_short(v, 48) for v in value) + "]"
    elif isinstance(value, bytes):
        text = value.decode("utf-8", "replace")
    else:
        text = repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."


# ---------------------------------------------------------------------------
# Randomised workload with faults, then heal and drain (test_random_faults.py)
# ---------------------------------------------------------------------------
QUEUES = (b"q0", b"q1", b"q2")
DEAD_QUEUES = tuple(q + b".dead" for q in QUEUES)  # where failing jobs go (``failing``)
_histories_left = 20  # failing runs per process whose job history is replayed into the message


#: Healthy runs: how long after an ack another delivery still counts as a race with the SETACKs.
ACK_SETTLE_MS = 1000


class RandomRun:
    """Random traffic + random faults on a 5-node cluster, then heal and drain.

    ``replicate`` bounds REPLICATE; ``dummy_acks`` lets ACKJOB/FASTACK/NACK/
    WORKING go to any node (not only the one that delivered the job);
    ``faults`` switches loss/dup/partitions/crashes on; ``replace``: one node
    crashes for good during the run and, a moment later, every other node
    forgets it (CLUSTER FORGET), as an operator replacing a lost machine
    would; ``failing``: jobs that fail (``core/delivery.py``): some ADDJOBs
    carry MAXDELIVER and BACKOFF, a "poison" job is never acked (NACKed, with
    a DELAY or a REASON, or left to time out) until it is dead-lettered, dead
    letters are acked, and checks (g)-(i) hold; ``releasing``: consumers also give
    jobs back unstarted (RELEASE, ``core/delivery.py``), and without faults check (g)
    counts the deliveries given back as none. Everything derives from ``seed``.
    """

    def __init__(
        self,
        seed: int,
        *,
        n_nodes: int = 5,
        replicate: tuple[int, int] = (1, 3),
        dummy_acks: bool = True,
        faults: bool = True,
        replace: bool = False,
        failing: bool = False,
        releasing: bool = False,
        limited: bool = False,
        fault_ms: int = 15_000,
        drain_max_ms: int = 400_000,
        replay: str | None = None,
        record_trace: bool = False,
    ) -> None:
        self.seed = seed
        self._args = dict(n_nodes=n_nodes, replicate=replicate, dummy_acks=dummy_acks, faults=faults,
                          replace=replace, failing=failing, releasing=releasing, limited=limited, fault_ms=fault_ms,
                          drain_max_ms=drain_max_ms, replay=replay)  # fmt: skip
        self.wrng = random.Random(seed * 7919 + 1)  # workload decisions, separate from the network's RNG
        w = self.wrng
        self.replicate = replicate
        self.dummy_acks = dummy_acks
        self.faults = faults
        self.fault_ms = fault_ms
        self.drain_max_ms = drain_max_ms
        if faults:
            loss = w.choice([0.0, 0.01, 0.03, 0.05])
            dup = w.choice([0.0, 0.0, 0.02, 0.05])
            delay = (0, w.choice([1, 5, 30]))
            detect = w.choice([0, 0, 100, 1000])
        else:
            loss, dup, delay, detect = 0.0, 0.0, (1, 5), 0
        self.params = dict(loss=loss, dup=dup, delay=delay, detect_delay_ms=detect)
        self.cluster = SimCluster(n_nodes, seed, replay=replay, record_trace=record_trace, **self.params)
        self.cluster.reply_hooks.append(self._validate_reply)
        self.pool: dict[int, list[SimClient]] = defaultdict(list)
        self.outstanding: dict[bytes, int] = {}  # delivered, not acked by us: id -> node that delivered it
        self.partition_until = 0
        self.down: int | None = None
        self.restart_at = 0
        # replace: which node crashes for good, when, and how long before the others forget it
        self.replace = replace
        self.replaced: int | None = None  # set once it crashed
        if replace:
            self.replace_node = w.randrange(n_nodes)
            self.replace_at = self.cluster.now + w.randint(0, fault_ms // 2)
            self.forget_after = w.randint(100, 3000)
        self.counter = 0
        # failing: the workload's draws for it come from their own RNG, so that the other
        # variants' seeds replay as before
        self.failing = failing
        self.frng = random.Random(seed * 104729 + 46)
        self.maxdeliver: dict[bytes, int] = {}  # job id -> its MAXDELIVER (0: none)
        self.poison: set[bytes] = set()  # never acked by a consumer: must end dead-lettered
        self.dead_ids: dict[bytes, set[bytes]] = defaultdict(set)  # original id -> dead letters delivered
        self.fail_problems: list[str] = []
        self.drain_ms = 0
        # releasing: its draws from an RNG of its own too (the other variants' seeds unchanged)
        self.releasing = releasing
        self.rrng = random.Random(seed * 15485863 + 7)
        self.held: Counter = Counter()  # id -> deliveries a consumer holds (got, not ended since)
        # id -> deliveries given back: a RELEASE answered 1 of a delivery held, while no node had
        # the job acked or dead-lettered (a RELEASE of a job nobody held is one too for the node:
        # its count only goes lower)
        self.given_back: Counter = Counter()
        # limited: some jobs in a group with a CONCURRENCY limit (GROUP LIMIT at the start); its draws
        # from an RNG of its own too. The consumers' own count of those they hold: each delivery
        # until its consumer acks, NACKs or releases it, or its RETRY since the delivery passes
        # (the node then takes its consumer for gone and may deliver it again)
        self.limited = limited
        self.lrng = random.Random(seed * 6700417 + 11)
        self.limit = self.lrng.randint(1, 3)
        self.limited_retry: dict[bytes, int] = {}  # job ID -> its RETRY (ms), for the jobs of the group
        self.limited_held: dict[bytes, list[int]] = defaultdict(list)  # job ID -> when each holding ends
        self.limited_most = 0
        self.limit_problems: list[str] = []

    # -- helpers ---------------------------------------------------------------
    def _live(self) -> list[int]:
        return [i for i in range(self.cluster.n) if self.cluster.alive[i]]

    def _free_client(self, i: int) -> SimClient:
        for c in self.pool[i]:
            if not c.gone and c.pending is None:
                return c
        self.pool[i] = [c for c in self.pool[i] if not c.gone]
        c = self.cluster.client(i)
        self.pool[i].append(c)
        return c

    def _validate_reply(self, client: SimClient, argv: list[bytes], value: Any) -> None:
        name = argv[0].upper()
        ok = True
        if name == b"ADDJOB":
            ok = (isinstance(value, Status) and len(value) == 40) or (isinstance(value, Error) and value.prefix == "NOREPL")
        elif name == b"GETJOB":
            ok = value is NULL_ARRAY or (isinstance(value, list) and all(len(item) == 3 for item in value))
        elif name == b"PAUSE":
            ok = value == b"none"
        elif name in (b"ACKJOB", b"FASTACK", b"NACK"):
            ok = type(value) is int
        elif name == b"WORKING":
            ok = type(value) is int or (isinstance(value, Error) and value.prefix in ("NOJOB", "ACKED", "TOOLATE"))
        if not ok:
            self.cluster.fail("unexpected reply on node %d to %r: %r" % (client.node, _short(argv), value))
        if self.failing:
            self._failing_reply(client, argv, value)
        if self.limited:
            self._limited_reply(argv, value)
        if name == b"GETJOB" and isinstance(value, list):
            for item in value:
                job_id = bytes(item[1])
                self.held[job_id] += 1
                if job_id not in self.cluster.ledger.acked:
                    self.outstanding[job_id] = client.node
        elif name in (b"ACKJOB", b"FASTACK", b"NACK", b"RELEASE"):
            for raw in argv[1:2] if name == b"RELEASE" else argv[1:]:
                job_id = bytes(raw)
                if self.held[job_id] <= 0:
                    continue
                if name == b"RELEASE" and value == 1 and self._unsettled(job_id):
                    self.given_back[job_id] += 1
                self.held[job_id] -= 1

    def _limited_reply(self, argv: list[bytes], value: Any) -> None:
        """``limited``: note the jobs of the group; count the deliveries of them the consumers hold
        at every delivery, never above the limit."""
        name = argv[0].upper()
        now = self.cluster.now
        if name == b"ADDJOB" and isinstance(value, Status) and b"GROUP" in argv:
            upper = [bytes(a).upper() if isinstance(a, bytes) else a for a in argv]
            self.limited_retry[bytes(value)] = int(argv[upper.index(b"RETRY") + 1]) * 1000
        elif name == b"GETJOB" and isinstance(value, list):
            for item in value:
                retry = self.limited_retry.get(bytes(item[1]))
                if retry is not None:
                    self.limited_held[bytes(item[1])].append(now + retry)
            held = 0
            for job_id, ends in list(self.limited_held.items()):
                ends[:] = [e for e in ends if e > now]
                if not ends:
                    del self.limited_held[job_id]
                else:
                    held += 1  # a job, however many times delivered (at least once: see the docstring)
            self.limited_most = max(self.limited_most, held)
            if held > self.limit:
                self.limit_problems.append("(l) at %d ms the consumers hold %d jobs of a group limited to %d: %s"
                                           % (now - T0, held, self.limit, sorted(j.decode() for j in self.limited_held)))  # fmt: skip
        elif name in (b"ACKJOB", b"FASTACK", b"NACK", b"RELEASE"):
            for raw in argv[1:2] if name == b"RELEASE" else argv[1:]:
                ends = self.limited_held.get(bytes(raw))
                if ends:
                    # the latest holding of it ends: the workload acts on a job's latest delivery
                    # (``outstanding`` names its node; the drain acks what it was just given), and
                    # the consumers of its earlier deliveries hold them until their RETRY passes
                    ends.pop()
                    if not ends:
                        del self.limited_held[bytes(raw)]

    def _unsettled(self, job_id: bytes) -> bool:
        """No node has ``job_id`` acked, nor holds its dead letter."""
        c = self.cluster
        if c.holders(dead_letter_id(job_id)):
            return False
        return not any(node is not None and (job := node.store.get(job_id)) is not None and job.state == ACKED
                       for node in c.nodes)  # fmt: skip

    def _failing_reply(self, client: SimClient, argv: list[bytes], value: Any) -> None:
        """``failing``: note each job's MAXDELIVER and poison; at each delivery of a dead letter,
        check (g) against the true deliveries of its original (the ledger's) and note (h)."""
        name = argv[0].upper()
        if name == b"ADDJOB" and isinstance(value, Status):
            job_id = bytes(value)
            upper = [a.upper() for a in argv]
            self.maxdeliver[job_id] = int(argv[upper.index(b"MAXDELIVER") + 1]) if b"MAXDELIVER" in upper else 0
            if argv[2].startswith(b"poison"):
                self.poison.add(job_id)
        elif name == b"GETJOB" and isinstance(value, list):
            node = self.cluster.nodes[client.node]
            delivered = self.cluster.ledger.delivered
            for item in value:
                if not bytes(item[0]).endswith(b".dead"):
                    continue
                dl_id = bytes(item[1])
                job = node.store.get(dl_id) if node is not None else None
                origin = job.extra.origin if job is not None and job.extra is not None else None
                if origin is None:
                    self.fail_problems.append("(g) %s delivered from %r is no dead letter" % (dl_id.decode(), item[0]))
                    continue
                oid, oqueue, odeliv, reason, options = origin
                self.dead_ids[oid].add(dl_id)
                true = delivered[oid]
                limit = self.maxdeliver.get(oid, 0)
                if true < limit or odeliv > true or odeliv < 1:
                    self.fail_problems.append(
                        "(g) %s dead-lettered after %d true deliveries (MAXDELIVER %d, it says %d), seen on node %d"
                        % (oid.decode(), true, limit, odeliv, client.node)
                    )  # fmt: skip
                # Deliveries given back count as none. Without faults every holder hears of each
                # return (RETURNED, or the next DELIVERED): a count never above the deliveries
                # not given back, so none dead-letters early. (With faults a holder that missed
                # the RETURNED may count the delivery given back: one early at most, per return.)
                back = self.given_back[oid]
                if back and not self.faults and (true - back < limit or odeliv > true - back):
                    self.fail_problems.append(
                        "(g) %s dead-lettered after %d true deliveries, %d given back (MAXDELIVER %d, it says %d), "
                        "seen on node %d" % (oid.decode(), true, back, limit, odeliv, client.node)
                    )  # fmt: skip

    def _failing_options(self, args: list, retry: int) -> None:
        """``failing``: delivery options for an ADDJOB (a RETRY 0 job takes none)."""
        f = self.frng
        if not retry or f.random() < 0.3:
            return
        if f.random() < 0.5:
            args[2] = b"poison-%d" % self.counter
            args += [b"MAXDELIVER", f.randint(1, 3)]
        elif f.random() < 0.5:
            args += [b"MAXDELIVER", f.randint(2, 6)]
        if f.random() < 0.5:
            args += [b"BACKOFF", f.choice([b"0.05", b"0.1", b"0.2"]), f.choice([b"0.5", b"1", b"2"])]

    def _failing_consume(self, i: int, job_id: bytes) -> bool:
        """``failing``: what a consumer does with a poison job or a dead letter (True if done)."""
        if job_id in self.poison:
            f = self.frng
            a = f.random()
            if a < 0.4:
                self._free_client(i).cmd(b"NACK", job_id, b"DELAY", f.choice([b"0.1", b"0.5", b"1.5"]))
            elif a < 0.7:
                self._free_client(i).cmd(b"NACK", job_id, b"REASON", b"poison on node %d" % i)
            elif a < 0.85:
                self._free_client(i).cmd(b"NACK", job_id)
            else:
                del self.outstanding[job_id]  # the consumer died: a RETRY timeout
            return True
        return False

    # -- phases ----------------------------------------------------------------
    def run(self) -> "RandomRun":
        c = self.cluster
        end = c.now + self.fault_ms
        w = self.wrng
        if self.limited:
            self.cluster.client(self.lrng.randrange(c.n)).cmd(b"GROUP", b"LIMIT", b"limited", b"CONCURRENCY", self.limit)
        while c.now < end:
            c.run_for(w.randint(10, 200))
            if self.replace:
                self._replace_step()
            if self.faults:
                self._faults_step()
            for _ in range(w.randint(1, 2)):
                self._traffic_step()
        self._heal_all()
        self._drain()
        return self

    def _replace_step(self) -> None:
        c, i = self.cluster, self.replace_node
        if self.replaced is None:
            if c.now >= self.replace_at:
                if self.down == i:  # down for a restart already: it will not come back
                    self.down = None
                else:
                    c.crash(i)
                self.replaced = i
                self.forget_at = c.now + self.forget_after
        elif i not in c.forgotten and c.now >= self.forget_at:
            c.forget(i)

    def _faults_step(self) -> None:
        c, w = self.cluster, self.wrng
        if self.partition_until and c.now >= self.partition_until:
            c.heal()
            self.partition_until = 0
        elif not self.partition_until and w.random() < 0.012:
            members = list(range(c.n))
            w.shuffle(members)
            k = w.randint(1, 2)
            c.partition(members[:k], members[k:])
            self.partition_until = c.now + w.randint(300, 4000)
        if self.down is not None and c.now >= self.restart_at:
            c.restart(self.down)
            self.down = None
        elif self.down is None and w.random() < 0.006:
            self.down = w.randrange(c.n)
            self.restart_at = c.now + w.randint(300, 5000)
            if self.down == self.replaced:
                self.down = None  # gone for good already
            else:
                c.crash(self.down)

    def _traffic_step(self) -> None:
        c, w = self.cluster, self.wrng
        live = self._live()
        if not live:
            return
        r = w.random()
        if r < 0.35:
            i = w.choice(live)
            lo, hi = self.replicate
            repl = w.randint(lo, hi)
            retry = 0 if repl == 1 and w.random() < 0.3 else w.randint(1, 5)
            self.counter += 1
            args = [b"ADDJOB", w.choice(QUEUES), b"job-%d" % self.counter, w.choice([500, 1000, 3000]),
                    b"REPLICATE", repl, b"RETRY", retry, b"TTL", 3600]  # fmt: skip
            if repl > 1 and w.random() < 0.1:
                args.append(b"ASYNC")
            if self.failing:
                self._failing_options(args, retry)
            if self.limited and retry and self.lrng.random() < 0.5:
                args += [b"GROUP", b"limited"]
            self._free_client(i).cmd(*args)
        elif r < 0.62:
            i = w.choice(live)
            self._free_client(i).cmd(b"GETJOB", b"NOHANG", b"COUNT", w.randint(1, 3), b"FROM", *QUEUES)
        elif r < 0.65:  # harmless cluster traffic (PAUSE ... none): exercises the network even with REPLICATE 1
            self._free_client(w.choice(live)).cmd(b"PAUSE", w.choice(QUEUES), b"none", b"bcast")
        elif self.outstanding:
            job_id = w.choice(sorted(self.outstanding))
            where = self.outstanding[job_id]
            at_most_once = int(job_id[36:40], 16) & 1 == 0
            if self.dummy_acks and not at_most_once:
                i = w.choice(live)
            elif c.alive[where]:
                i = where
            else:
                return
            if self.releasing and self.rrng.random() < 0.15:
                # given back unstarted (0 if not active there), half of them after a delay
                delay = [b"DELAY", b"%.1f" % self.rrng.uniform(0.1, 3)] if self.rrng.random() < 0.5 else []
                self._free_client(i).cmd(b"RELEASE", job_id, *delay)
                del self.outstanding[job_id]
                return
            if self.failing and self._failing_consume(i, job_id):
                return
            a = w.random()
            if a < 0.55:
                self._free_client(i).cmd(b"ACKJOB", job_id)
                del self.outstanding[job_id]
            elif a < 0.65 and not at_most_once:
                self._free_client(i).cmd(b"FASTACK", job_id)
                del self.outstanding[job_id]
            elif a < 0.8:
                self._free_client(i).cmd(b"NACK", job_id)
            else:
                self._free_client(i).cmd(b"WORKING", job_id)

    def _heal_all(self) -> None:
        c = self.cluster
        c.loss = 0.0
        c.dup = 0.0
        if self.partition_until:
            c.heal()
            self.partition_until = 0
        if self.down is not None:
            c.restart(self.down)
            self.down = None
        c.run_for(max(c.detect_delay_ms, 0) + 100)

    def quiescent(self) -> bool:
        """No pending client, nothing left but delivered at-most-once jobs."""
        c = self.cluster
        for clients in self.pool.values():
            if any(cl.pending is not None and not cl.gone for cl in clients):
                return False
        for node in c.nodes:
            if node is None:
                continue
            for job in node.store.values():
                if job.retry != 0 or job.state != ACTIVE:
                    return False
        return True

    def _drain(self) -> None:
        c = self.cluster
        start = c.now
        deadline = c.now + self.drain_max_ms
        consumers = {i: c.client(i) for i in range(c.n) if c.alive[i]}
        while c.now < deadline:
            for i in range(c.n):
                if not c.alive[i]:
                    continue  # replaced: gone for good
                queues = QUEUES + DEAD_QUEUES if self.failing else QUEUES
                reply = consumers[i].cmd(b"GETJOB", b"NOHANG", b"COUNT", 100, b"FROM", *queues)
                if isinstance(reply, list):
                    ids = [bytes(item[1]) for item in reply]
                    poison = [j for j in ids if j in self.poison]
                    if poison:
                        consumers[i].cmd(b"NACK", *poison)
                        ids = [j for j in ids if j not in self.poison]
                    if ids:
                        consumers[i].cmd(b"ACKJOB", *ids)
                    for job_id in ids:
                        self.outstanding.pop(job_id, None)
            c.run_for(250)
            if self.quiescent():
                break
        c.run_for(3000)  # let the last acks be collected
        self.drain_ms = c.now - start

    # -- checks ----------------------------------------------------------------
    def expected_delivered(self) -> list[AddRecord]:
        """Jobs that must have been delivered: ID returned, some copy never lost."""
        out = []
        ledger = self.cluster.ledger
        for rec in ledger.adds.values():
            lost = ledger.lost.get(rec.job_id, set())
            if rec.async_ and rec.node in lost:
                continue  # ASYNC: only the creator's copy is certain
            if len(lost) >= rec.replicate:
                continue  # as many nodes lost it as were asked to hold it
            out.append(rec)
        return out

    def check(self) -> None:
        c = self.cluster
        ledger = c.ledger
        problems = []
        # (a) at-least-once: every job that kept a copy was delivered
        for rec in self.expected_delivered():
            if ledger.delivered[rec.job_id] == 0:
                problems.append(
                    "(a) job %s (node %d, REPLICATE %d, RETRY %d%s, holders at ADDJOB %s, lost on %s) never delivered; now on %s"
                    % (rec.job_id.decode(), rec.node, rec.replicate, rec.retry, " ASYNC" if rec.async_ else "",
                       list(rec.holders), sorted(ledger.lost.get(rec.job_id, ())), c.states(rec.job_id))
                )  # fmt: skip
        # (b) at-most-once: RETRY 0 jobs delivered at most once
        for rec in ledger.adds.values():
            if rec.retry == 0 and ledger.delivered[rec.job_id] > 1:
                times = [(t - T0, n) for t, n, j in ledger.deliveries if j == rec.job_id]
                problems.append("(b) RETRY 0 job %s delivered %d times (t, node): %s"
                                % (rec.job_id.decode(), ledger.delivered[rec.job_id], times))  # fmt: skip
        # (c) acked jobs are gone everywhere; no acked job (dummy or not) is left
        everywhere = c.jobs_everywhere()
        for job_id in ledger.acked:
            where = {i: STATE_NAMES[jobs[job_id]] for i, jobs in everywhere.items() if job_id in jobs}
            if where:
                problems.append("(c) acked job %s still registered after drain: %s" % (job_id.decode(), where))
        for i, jobs in everywhere.items():
            for job_id, state in jobs.items():
                if state == ACKED and job_id not in ledger.acked:
                    problems.append("(c) node %d still holds %s in acked state" % (i, job_id.decode()))
        # (f) healthy runs only: an acknowledged job (ACKJOB or FASTACK) is never handed out again,
        # beyond the few milliseconds its SETACKs or DELJOBs take to reach the other holders
        if not self.faults:
            for t, i, job_id in ledger.deliveries:
                acked_at = ledger.acked.get(job_id)
                if acked_at is not None and t > acked_at + ACK_SETTLE_MS:
                    problems.append("(f) job %s delivered on node %d %d ms after its first ack, with no fault"
                                    % (job_id.decode(), i, t - acked_at))  # fmt: skip
        if self.limited:
            problems += self.limit_problems
        if self.failing:
            problems += self.fail_problems
            # (h) one dead-letter ID per original, the one derived from its ID
            for oid, dls in self.dead_ids.items():
                if dls != {dead_letter_id(oid)}:
                    problems.append("(h) job %s has dead letters %s" % (oid.decode(), sorted(d.decode() for d in dls)))
            # (i) none lost: every job of (a) with a RETRY was acked by a consumer or its dead letter delivered;
            # a poison job never acked
            for rec in self.expected_delivered():
                jid = rec.job_id
                if rec.retry == 0:
                    continue  # at most once: (a) and (b) say it all
                if jid in self.poison and jid in ledger.acked:
                    problems.append("(i) poison job %s acked by a consumer" % jid.decode())
                if jid not in ledger.acked and not self.dead_ids.get(jid):
                    if len(ledger.lost.get(dead_letter_id(jid), ())) >= rec.replicate:
                        continue  # its dead letter was made, then lost on as many nodes as (a) allows
                    problems.append("(i) job %s (MAXDELIVER %d%s, %d deliveries) neither acked nor dead-lettered; now on %s"
                                    % (jid.decode(), self.maxdeliver.get(jid, 0), ", poison" if jid in self.poison else "",
                                       ledger.delivered[jid], c.states(jid)))  # fmt: skip
        # (e) liveness: the drain emptied the cluster (only delivered RETRY 0 jobs may stay)
        for i, node in enumerate(c.nodes):
            if node is None:
                continue
            for job_id, job in node.store.items():
                if job.state != ACKED and (job.retry != 0 or job.state != ACTIVE):
                    problems.append("(e) node %d still holds %s in state %s (RETRY %d) after the drain"
                                    % (i, job_id.decode(), STATE_NAMES[job.state], job.retry))  # fmt: skip
        if problems:
            more = "" if len(problems) <= 10 else "\n  ... and %d more" % (len(problems) - 10)
            job_ids = re.findall(r"D-[0-9a-f]{8}-[A-Za-z0-9+/]{24}-[0-9a-f]{4}", problems[0])
            global _histories_left
            history = ["   (not replayed: too many failing runs in this session; use the replay command)"]
            if job_ids and _histories_left > 0:
                _histories_left -= 1
                history = self.history(job_ids[0])
            c.fail(
                "%d problem(s) after heal + drain (%s):\n  %s%s\n  history of the first one (replayed with its trace):\n%s"
                % (len(problems), self.summary(), "\n  ".join(problems[:10]), more, "\n".join(history)),
                tail=False,
            )

    def history(self, job_id: str, limit: int = 80) -> list[str]:
        """Every event about one job, from a deterministic re-run that records the trace."""
        if self.cluster.trace is not None:
            trace = self.cluster.trace
        else:
            again = RandomRun(self.seed, record_trace=True, **self._args).run()
            trace = again.cluster.trace or []
        lines = [line for line in trace if job_id in line or " F " in line]
        if len(lines) > limit:
            lines = lines[: limit // 2] + ["   ..."] + lines[-limit // 2 :]
        return lines

    def summary(self) -> str:
        c = self.cluster
        led = c.ledger
        return "params %s; %d jobs added, %d deliveries, %d acks, %d crashes, drain %d ms, %d msgs sent, %d lost, %d dup" % (
            self.params, len(led.adds), len(led.deliveries), len(led.acks), len(led.crashes), self.drain_ms,
            c.stats["sent"], c.stats["lost"], c.stats["duplicated"],
        )  # fmt: skip
