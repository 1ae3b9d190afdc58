"""Cluster awareness without I/O: seeds, the node list, choosing a node, backoff, affinity.

Both clients keep one :class:`Topology` and ask it where to connect:

* Before any HELLO, the candidates are the seeds in random order ("connect
  to a random reachable one"), so ordinary clients spread over the seeds.
* The client's ``prefer`` address, if it has one, comes first whenever it
  is not marked down: a caller that spreads its own connections
  (the Spark writer gives each one a node) picks the node, and the others
  are the failover.
* After a HELLO, they are the nodes it listed, best (lowest) priority
  first, in random order within a priority, then any seed not listed.
  Nodes that failed recently go last (but are still tried: they may be
  back).
* :meth:`Topology.better_node` says when to move although the current
  node works: when another node has a strictly lower priority (ours is
  leaving, priority 100).
* The client refreshes the list (HELLO) every ``refresh_interval`` seconds.

:class:`Backoff` computes the pause between reconnection rounds (and the
worker's pause after repeated failures): exponential, capped, with jitter,
from an injected ``random.Random`` so tests are deterministic.

:class:`Affinity` watches which node created the jobs a consumer receives
(the 8-character node prefix inside every job ID). When most of a window
of recent jobs came from one other node that is in the node list, the
client moves there: that node produces what we consume, so consuming there
saves hops once jobs move between nodes.
"""

from __future__ import annotations

import random
from collections import Counter, deque
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from .model import HelloInfo, NodeInfo

__all__ = ["Address", "Backoff", "Topology", "Affinity", "parse_address", "parse_node_list", "parse_seeds", "split_url"]

Address = tuple[str, int]

DEFAULT_PORT = 7711


#: URL schemes a seed may be written with; those in ``TLS_SCHEMES`` mean TLS (as redis-py's ``rediss://``).
URL_SCHEMES = ("redis://", "rediss://", "disque://", "disques://")
TLS_SCHEMES = ("rediss://", "disques://")


def split_url(text: str) -> tuple[str, bool, str | None]:
    """``"rediss://:pw@host:port/0"`` -> (``"host:port"``, TLS?, password or None); a plain
    ``"host:port"`` comes back as it is (TLS False, no password)."""
    low = text.strip().lower()
    scheme = next((s for s in URL_SCHEMES if low.startswith(s)), None)
    if scheme is None:
        return text, False, None
    rest = text.strip()[len(scheme):]
    rest = rest.split("/", 1)[0].split("?", 1)[0]  # a database number or options: not ours
    password = None
    if "@" in rest:
        cred, _, rest = rest.rpartition("@")
        if ":" in cred:
            password = cred.split(":", 1)[1] or None
        elif cred:
            password = cred
    return rest, scheme in TLS_SCHEMES, password


def parse_address(text: str | Address) -> Address:
    """``"host:port"``, ``"[v6]:port"``, ``"host"`` (port 7711), a URL
    (``redis://``, ``rediss://``, ``disque://``: see :func:`split_url`) or a (host, port) pair."""
    if isinstance(text, tuple):
        host, port = text
        return (str(host), int(port))
    text = split_url(text)[0].strip()
    if not text:
        raise ValueError("empty node address")
    if text.startswith("["):
        host, _, rest = text[1:].partition("]")
        port = rest[1:] if rest.startswith(":") else ""
    elif text.count(":") == 1:
        host, _, port = text.partition(":")
    else:
        host, port = text, ""
    if not port:
        return (host, DEFAULT_PORT)
    if not port.isdigit() or not 0 < int(port) < 65536:
        raise ValueError("bad port in node address %r" % text)
    return (host, int(port))


def seed_items(seeds: str | Address | Iterable[str | Address]) -> list:
    """The seeds one by one (strings or pairs), as :func:`parse_seeds` reads them."""
    if isinstance(seeds, str):
        return seeds.replace(",", " ").split()
    if isinstance(seeds, tuple) and len(seeds) == 2 and isinstance(seeds[1], int):
        return [seeds]
    items: list = []
    for s in seeds:
        items.extend(s.replace(",", " ").split() if isinstance(s, str) else [s])
    return items


def parse_node_list(text: str) -> list[Address]:
    """``"h:p,h:p"`` (spaces allowed, ``[v6]:port`` too) -> addresses, in order, each once;
    ValueError names a bad one (the command lines' ``--nodes``: ``disque-py top``, ``dead``)."""
    out: list[Address] = []
    for item in text.replace(" ", ",").split(","):
        if not item:
            continue
        if item.startswith("["):
            host, _, port = item[1:].partition("]:")
        else:
            host, _, port = item.rpartition(":")
        if not host or not port.isdigit() or not 0 < int(port) < 65536:
            raise ValueError("expected HOST:PORT, got %r" % item)
        out.append((host, int(port)))
    if not out:
        raise ValueError("no node given")
    return list(dict.fromkeys(out))


def parse_seeds(seeds: str | Address | Iterable[str | Address]) -> list[Address]:
    """Seeds as one string (comma or space separated), one pair, or an iterable of either."""
    out: list[Address] = []
    for item in seed_items(seeds):
        addr = parse_address(item)
        if addr not in out:
            out.append(addr)
    if not out:
        raise ValueError("at least one node address is needed")
    return out


@dataclass(frozen=True, slots=True)
class Backoff:
    """Exponential backoff with jitter.

    ``delay(n)`` is ``min(maximum, initial * factor**n)`` scaled by a random
    factor in ``(1 - jitter, 1]``: ``jitter=0`` is deterministic, ``1`` is
    "full jitter".
    """

    initial: float = 0.05
    maximum: float = 2.0
    factor: float = 2.0
    jitter: float = 0.5

    def __post_init__(self) -> None:
        if self.initial < 0 or self.maximum < self.initial or self.factor < 1 or not 0 <= self.jitter <= 1:
            raise ValueError("invalid backoff %r" % (self,))

    def base(self, attempt: int) -> float:
        if attempt >= 64:
            return self.maximum
        return min(self.maximum, self.initial * self.factor ** max(0, attempt))

    def delay(self, attempt: int, rng: random.Random) -> float:
        return self.base(attempt) * (1.0 - self.jitter * rng.random())


class Topology:
    """What the client knows about the cluster, and where to connect next."""

    def __init__(
        self,
        seeds: Sequence[Address],
        rng: random.Random,
        *,
        down_for: float = 5.0,
        leaving_for: float = 60.0,
        prefer: Address | None = None,
    ) -> None:
        self.seeds = list(seeds)
        self.rng = rng
        self.prefer = prefer
        self.down_for = down_for
        self.leaving_for = leaving_for
        self.nodes: dict[str, NodeInfo] = {}  # by node ID, from the last HELLO
        self._down_until: dict[Address, float] = {}
        # What a node said about itself (its own HELLO entry, or -LEAVING):
        # fresher than gossip, which may still list a leaving node at priority 1.
        self._self_reported: dict[str, tuple[int, float]] = {}

    # -- learning ----------------------------------------------------------
    def update(self, hello: HelloInfo, now: float = 0.0) -> None:
        """Replace the node list with a HELLO's (an empty list keeps the old one).

        The answering node's own priority is remembered for ``leaving_for``
        seconds and wins over a better priority gossiped by other nodes.
        """
        me = hello.myself
        if me is not None:
            self._self_reported[me.id] = (me.priority, now + self.leaving_for)
        if not hello.nodes:
            return
        nodes = {}
        for n in hello.nodes:
            reported = self._self_reported.get(n.id)
            if reported is not None and reported[1] > now and reported[0] > n.priority:
                n = NodeInfo(n.id, n.host, n.port, reported[0])
            nodes[n.id] = n
        self.nodes = nodes

    def mark_down(self, address: Address, now: float) -> None:
        self._down_until[address] = now + self.down_for

    def mark_up(self, address: Address) -> None:
        self._down_until.pop(address, None)

    def set_priority(self, node_id: str, priority: int, now: float = 0.0) -> None:
        """What a node told us about itself before the next HELLO (-LEAVING: priority 100)."""
        self._self_reported[node_id] = (priority, now + self.leaving_for)
        node = self.nodes.get(node_id)
        if node is not None:
            self.nodes[node_id] = NodeInfo(node.id, node.host, node.port, priority)

    # -- choosing ----------------------------------------------------------
    def candidates(self, now: float) -> list[Address]:
        """Addresses to try, in order (see the module docstring)."""
        by_priority: dict[int, list[Address]] = {}
        for node in self.nodes.values():
            by_priority.setdefault(node.priority, []).append(node.address)
        ordered: list[Address] = []
        for priority in sorted(by_priority):
            group = by_priority[priority]
            self.rng.shuffle(group)
            ordered.extend(group)
        seeds = [s for s in self.seeds if s not in ordered]
        self.rng.shuffle(seeds)
        ordered.extend(seeds)
        if self.prefer is not None:
            ordered = [self.prefer, *(a for a in ordered if a != self.prefer)]
        up = [a for a in ordered if self._down_until.get(a, 0.0) <= now]
        down = [a for a in ordered if self._down_until.get(a, 0.0) > now]
        return up + down

    def node_at(self, address: Address) -> NodeInfo | None:
        for node in self.nodes.values():
            if node.address == address:
                return node
        return None

    def better_node(self, current_id: str | None, now: float) -> Address | None:
        """An address worth moving to although the current node works, or None.

        Only a strictly lower priority is a reason to move.
        """
        current = self.nodes.get(current_id or "")
        if current is None:
            return None
        best = [
            n for n in self.nodes.values()
            if n.priority < current.priority and self._down_until.get(n.address, 0.0) <= now
        ]  # fmt: skip
        if not best:
            return None
        lowest = min(n.priority for n in best)
        choices = [n.address for n in best if n.priority == lowest]
        return choices[self.rng.randrange(len(choices))]

    def node_with_prefix(self, prefix: str) -> NodeInfo | None:
        for node in self.nodes.values():
            if node.id.startswith(prefix):
                return node
        return None


class Affinity:
    """Which node created most of the jobs received lately.

    ``window`` recent jobs are remembered; :meth:`suggest` names a node
    prefix once at least ``min_jobs`` were seen and more than ``share`` of
    them carry that (other) node's prefix. The window restarts after a
    suggestion, so a move is followed by a fresh observation.
    """

    def __init__(self, window: int = 100, share: float = 0.5, min_jobs: int = 20) -> None:
        if not 0 < share < 1 or window < 1 or not 0 < min_jobs <= window:
            raise ValueError("invalid affinity parameters")
        self.window = window
        self.share = share
        self.min_jobs = min_jobs
        self._recent: deque[str] = deque(maxlen=window)

    def observe(self, prefixes: Iterable[str]) -> None:
        self._recent.extend(prefixes)

    def suggest(self, current_prefix: str | None) -> str | None:
        if len(self._recent) < self.min_jobs:
            return None
        prefix, count = Counter(self._recent).most_common(1)[0]
        if prefix == current_prefix or count <= self.share * len(self._recent):
            return None
        return prefix

    def reset(self) -> None:
        self._recent.clear()
