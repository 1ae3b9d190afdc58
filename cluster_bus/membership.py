"""Cluster membership: the node table, gossip, failure detection, nodes.conf.

Theory of operation
-------------------
This is Disque's cluster.c membership half (the node table, PING/PONG/MEET/FAIL,
gossip, PFAIL/FAIL agreement, FORGET/RESET/LEAVING, the nodes.conf format),
written as a sans-I/O state machine. It owns no socket, task, clock or file.

*Inputs* are method calls stamped with ``now`` (monotonic milliseconds, an
int): operator commands (``meet``, ``forget``, ``reset``, ``set_leaving``),
link events reported by the shell (``link_up``, ``link_failed``,
``link_down``, ``link_peer``), bus messages (``receive``) and time passing
(``tick``, Disque's ``clusterCron``: every 100 ms while the cluster is in
flux, less often once it is settled, as ``idle_tick_ms`` says; the PINGs it finds due may be
left to ``send_pings``, a few a call, so that the shell can cut a tick into bounded steps:
"Ticks in slices" below). *Effects* are frozen
records the shell drains with ``take_effects()`` after every input and carries
out in order: ``Connect``, ``Send``, ``Close``, ``SaveConfig``, ``Log``.

Links. Every other node has at most one *outbound* link, opened by us (we
emit ``Connect``; the shell answers ``link_up(node_id, link)`` or
``link_failed(node_id)``). Everything we send to that node travels on it.
Links opened by peers are *inbound*: the shell announces each one with
``link_peer(link, peer_ip, local_ip)`` as soon as it is accepted (after
authentication, if any) so that a MEET arriving on it can be turned into a
handshake towards the peer's address, and so that a PING can reveal that a
known node moved. PING and MEET are answered with a PONG on the link they
came from, whichever kind it is. Link ids are opaque ints owned by the shell;
``Close(link)`` means "close it"; a later ``link_down`` for the same id is
harmless.

Node life cycle. ``meet`` (or gossip about an unknown node, or a MEET from an
unknown sender) creates a HANDSHAKE node with a random temporary id. Once the
first PING/PONG/MEET arrives on its outbound link the node is renamed to the
sender's real id and HANDSHAKE is cleared -- or, if that id is already known,
the handshake node is dropped (after refreshing the known node's address).
Handshake nodes that do not complete within ``max(node_timeout, 1000)`` ms
are deleted.

Failure detection. A node whose PING has waited more than ``node_timeout``
for its PONG is flagged PFAIL locally. Gossip carries each sender's view of
other nodes; a PFAIL/FAIL entry is a *failure report* from the sender, valid
for ``node_timeout * 2``. When a PFAIL node collects reports from a majority
(``size // 2 + 1``, counting ourselves) it becomes FAIL and a ``Fail`` message
is broadcast so every node agrees at once. A PONG on the outbound link clears
PFAIL and FAIL.

Releases. A node told its ``release`` (its software's version, e.g. ``"0.2.0"``) and
``features`` (the optional parts of the job layer's protocol it understands: names the bus
never reads) with ``announce`` announces them on every outbound link it opens, right after
its PING or MEET,
as ``Data(VERSION_KIND, [release, [feature, ...]])``; a node that gets one on an inbound link
answers with its own on that link, and one that gets the answer on its outbound link records
it on the node (``ClusterNode.release`` and ``.features``): what the process at the other end
of the link we send on understands. A new link starts unknown again (``None``: the peer may
have restarted on another release). A node of before releases (0.1.0) hands the ``Data`` to
its job layer, which drops an unknown kind, and never answers: once a second PONG came on
the link with no answer (the answer leaves right after the first PONG), its release is
``unannounced`` (the shell names the release of before announcements; ``""`` by default) and
its features ``None``. A malformed announcement is counted
(``stats["versions_malformed"]``) and ignored. ``nodes_text`` (CLUSTER NODES) shows each
node's release as a last field once ``announce`` was called (``-`` while unknown, ``?`` for
announced none and no ``unannounced``); ``save_text``
(nodes.conf) does not, so the file stays the format every release reads.

Ticks in slices. A PING built (its gossip section) and sent is most of what a tick costs in
a busy node whose caches the tick finds cold (60-80 µs of a shell's tick of ~100). ``tick(now,
max_pings=0)`` only walks the table (reconnects, timeouts, PFAIL) and queues the PINGs it finds
due, each node once; ``send_pings(now, limit)`` then sends the next ``limit`` of them, oldest
first, and says how many are left, so that the shell sends them in steps of its own, a pass of
its loop between two. A queued node whose PING is no longer wanted when its turn comes (gone, its
link closed, a PING already waiting for its PONG) is skipped. A PING's PONG is waited for from
when it is sent (``ping_sent``): queued for a few passes of the loop, each node is still pinged
within node_timeout / 2 of its last PONG plus that delay, and a node that stopped answering is
PFAIL that much later at most. ``tick(now)`` with no ``max_pings`` sends every PING due at once.

Invariants (checked by tests):

* MYSELF_SAFE: no message can flag this node PFAIL/FAIL, rename it, change
  its address from gossip, or delete it.
* ONE_OUTBOUND: a node has at most one outbound link and at most one
  ``Connect`` in flight.
* IDS_VALID: every id in the table is 40 lowercase hex characters, so
  ``save_text()`` always reloads.

Deviations from Disque are listed in ``DEVIATIONS`` below.
"""

from __future__ import annotations

import ipaddress
import random
from operator import attrgetter
from typing import Any, Iterable

from .messages import (
    FrozenRecord,
    BUS_PORT_OFFSET,
    MAX_FEATURES,
    MAX_RELEASE_LEN,
    VERSION_KIND,
    NODE_FAIL,
    NODE_HANDSHAKE,
    NODE_LEAVING,
    NODE_MEET,
    NODE_MYSELF,
    NODE_NOADDR,
    NODE_PFAIL,
    Data,
    Fail,
    Gossip,
    Meet,
    Ping,
    Pong,
)

__all__ = [
    "Membership",
    "MembershipError",
    "ClusterNode",
    "Connect",
    "Send",
    "Close",
    "SaveConfig",
    "Log",
    "BLACKLIST_TTL_MS",
    "FAIL_REPORT_VALIDITY_MULT",
    "MAX_PORT",
    "valid_release",
    "release_text",
]

DEVIATIONS = """
* Gossip may include PFAIL/FAIL nodes that currently have no outbound link
  (Disque skips every disconnected node). Disque's non-blocking connect keeps
  a link object alive while a reconnection to a dead node is being attempted,
  so such nodes do get gossiped there; here a failed connect leaves no link,
  and without this a dead node could never gather the reports to become FAIL.
* ``ping_sent`` is set when a Connect is emitted (if no ping is pending), as
  Disque's cron effectively does by queueing a PING on the fresh link at once.
* A message whose sender id is our own, or a handshake node's temporary id,
  is treated as coming from an unknown node (Disque would trust it).
* A MEET from an unknown sender does not create a second handshake node for
  an address already in handshake.
* Ids must be 40 lowercase hex characters everywhere (messages, nodes.conf).
* ``save_text`` leaves out handshake nodes, as Disque's clusterSaveConfig
  does; ``nodes_text`` (CLUSTER NODES) shows them.
* The PINGs a tick finds due may leave a few passes of the shell's loop after
  it (``tick(now, max_pings=0)``, then ``send_pings``: "Ticks in slices");
  Disque's cron sends them all in the cron.
* A PING or MEET from a known node we have no outbound link to (and are not
  connecting to) connects at once; Disque waits for its next cron (up to
  100 ms), and a restarted node's queued jobs waited for that link.
"""

BLACKLIST_TTL_MS = 60_000
FAIL_REPORT_VALIDITY_MULT = 2
MAX_PORT = 65535 - BUS_PORT_OFFSET
RANDOM_PING_MS = 1000  # one random ping a second (Disque: every 10th run of its 10 Hz cron)
RANDOM_PING_SAMPLES = 5
TICK_MS = 100  # the tick's period while the cluster is in flux
IDLE_TICK_MAX_MS = 500  # the longest period of a settled cluster's tick (idle_tick_ms)

_HEX_DIGITS = "0123456789abcdef"
_VIEW_FIELDS = attrgetter("id", "ip", "port", "flags", "link", "features")

# Flag names, in the order CLUSTER NODES prints them.
_FLAG_NAMES: tuple[tuple[int, str], ...] = (
    (NODE_MYSELF, "myself"),
    (NODE_PFAIL, "fail?"),
    (NODE_FAIL, "fail"),
    (NODE_HANDSHAKE, "handshake"),
    (NODE_NOADDR, "noaddr"),
    (NODE_LEAVING, "leaving"),
)
_FLAG_BY_NAME = {name: flag for flag, name in _FLAG_NAMES}
_FLAG_BY_NAME["noflags"] = 0


class MembershipError(Exception):
    """An operator error (bad MEET/FORGET argument) or a corrupted nodes.conf."""


# ---------------------------------------------------------------------------
# Effects
# ---------------------------------------------------------------------------
_put = object.__setattr__  # a field's value, set past the class's refusal (messages.FrozenRecord)


# Frozen records (``messages.FrozenRecord``: what ``@dataclass(frozen=True, slots=True)`` gave them,
# without the decorator's work when a node starts).
class Connect(FrozenRecord):
    """Open an outbound link to ``ip:bus_port``; report link_up/link_failed."""

    __slots__ = __match_args__ = ("node_id", "ip", "bus_port")
    node_id: str
    ip: str
    bus_port: int

    def __init__(self, node_id: str, ip: str, bus_port: int) -> None:
        _put(self, "node_id", node_id)
        _put(self, "ip", ip)
        _put(self, "bus_port", bus_port)


class Send(FrozenRecord):
    """Send ``msg`` (a messages.* object) on ``link``."""

    __slots__ = __match_args__ = ("link", "msg")
    link: int
    msg: Any

    def __init__(self, link: int, msg: Any) -> None:
        _put(self, "link", link)
        _put(self, "msg", msg)


class Close(FrozenRecord):
    """Close ``link``; the membership has already forgotten it."""

    __slots__ = __match_args__ = ("link",)
    link: int

    def __init__(self, link: int) -> None:
        _put(self, "link", link)


class SaveConfig(FrozenRecord):
    """Persist ``save_text()`` (atomically)."""

    __slots__ = ()


class Log(FrozenRecord):
    __slots__ = __match_args__ = ("level", "text")
    level: str  # "warning", "notice", "verbose" or "debug"
    text: str

    def __init__(self, level: str, text: str) -> None:
        _put(self, "level", level)
        _put(self, "text", text)


# ---------------------------------------------------------------------------
# Table entries
# ---------------------------------------------------------------------------
class ClusterNode:
    """One row of the node table (ourselves included)."""

    __slots__ = (
        "id",
        "ip",
        "port",
        "flags",
        "ping_sent",
        "pong_received",
        "link",
        "ctime",
        "fail_reports",
        "fail_time",
        "release",
        "features",
        "link_pongs",
    )

    def __init__(self, node_id: str, ip: str, port: int, flags: int, ctime: int) -> None:
        self.id = node_id
        self.ip = ip
        self.port = port
        self.flags = flags
        self.ping_sent = 0  # monotonic ms of the oldest unanswered PING, 0 = none
        self.pong_received = 0  # monotonic ms of the last PONG, 0 = never
        self.link: int | None = None  # our outbound link to it
        self.ctime = ctime
        self.fail_reports: dict[str, int] = {}  # reporter id -> monotonic ms
        self.fail_time = 0
        # What the process at the end of our outbound link announced ("Releases"): None while
        # unknown; Membership.unannounced, with no features, when it announced none.
        self.release: str | None = None
        self.features: frozenset[str] | None = None
        self.link_pongs = 0  # PONGs on the current outbound link

    def __repr__(self) -> str:
        return "ClusterNode(%s %s:%d %s)" % (self.id[:8], self.ip, self.port, flags_text(self.flags))


class _Link:
    """What we know about one link: whose outbound link it is, or who talks on it, and the peer ip."""

    __slots__ = ("node", "ip", "local_ip", "ctime", "sender")

    def __init__(self, node: ClusterNode | None, ip: str | None, local_ip: str | None, ctime: int) -> None:
        self.node = node  # None for inbound links
        self.ip = ip  # the peer's address as seen on the socket
        self.local_ip = local_ip  # our address on this socket (inbound only)
        self.ctime = ctime
        self.sender: str | None = None  # inbound: the known node whose PINGs come on it


# ---------------------------------------------------------------------------
# Small helpers
# ---------------------------------------------------------------------------
def flags_text(flags: int) -> str:
    names = [name for flag, name in _FLAG_NAMES if flags & flag]
    return ",".join(names) if names else "noflags"


def is_node_id(value: Any) -> bool:
    # strip() takes every hex digit off both ends: only an all-hex string is left empty (a C
    # loop; a generator over the 40 characters was a tenth of an idle node's gossip handling)
    return type(value) is str and len(value) == 40 and not value.strip(_HEX_DIGITS)


def normalize_ip(ip: Any) -> str | None:
    """The canonical text of an IPv4/IPv6 address, or None if it is not one."""
    if type(ip) is not str or not ip or len(ip) > 64:
        return None
    try:
        return str(ipaddress.ip_address(ip))
    except ValueError:
        return None


def _valid_port(port: Any) -> bool:
    return type(port) is int and 0 < port <= MAX_PORT


def _is_int(value: Any) -> bool:
    return type(value) is int


_RELEASE_CHARS = frozenset("0123456789abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ.+-_")


def valid_release(value: Any) -> bool:
    """A release as announced: 1..MAX_RELEASE_LEN letters, digits and ``.+-_`` (``0.2.0``)."""
    return type(value) is str and 0 < len(value) <= MAX_RELEASE_LEN and _RELEASE_CHARS.issuperset(value)


def valid_feature(value: Any) -> bool:
    """A feature's name: as a release."""
    return valid_release(value)


def release_text(release: str | None) -> str:
    """A node's release in CLUSTER NODES: ``-`` while unknown, ``?`` when it announced none."""
    if release is None:
        return "-"
    return release or "?"


# ---------------------------------------------------------------------------
# The state machine
# ---------------------------------------------------------------------------
class Membership:
    """One node's view of the cluster. See the module docstring."""

    def __init__(
        self,
        my_id: str,
        my_ip: str,
        my_port: int,
        *,
        node_timeout: int,
        now: int,
        rng: random.Random,
        wall_offset: int = 0,
        leaving: bool = False,
    ) -> None:
        if not is_node_id(my_id):
            raise MembershipError("Invalid node identifier")
        self.node_timeout = int(node_timeout)
        self.rng = rng
        self.wall_offset = wall_offset
        self._now = now
        flags = NODE_MYSELF | (NODE_LEAVING if leaving else 0)
        self.myself = ClusterNode(my_id, normalize_ip(my_ip) or "", my_port, flags, now)
        self._version: list | None = None  # our announcement (None: none, as a node of before them)
        self.unannounced = ""
        self._nodes: dict[str, ClusterNode] = {my_id: self.myself}
        self._links: dict[int, _Link] = {}
        self._connecting: dict[str, tuple[str, int]] = {}  # node id -> address being connected
        self._banned: dict[str, int] = {}  # node id -> ban end (monotonic ms)
        self._effects: list[Any] = []
        self._save = False
        self._random_ping_at = now  # when the last random ping went (tick)
        self._pings_due: dict[str, ClusterNode] = {}  # node id -> node: PINGs the ticks found due, unsent
        #: after each tick: no handshake, connect, missing link or failing node (the server then ticks
        #: less often: :meth:`idle_tick_ms`)
        self.settled = False
        self.stats: dict[str, int] = {
            "messages_sent": 0,
            "messages_received": 0,
            "auth_failures": 0,
            "bad_frames": 0,
            "links_closed": 0,
            "versions_malformed": 0,
        }

    def announce(self, release: str, features: Iterable[str], unannounced: str = "") -> None:
        """Announce ``release`` and ``features`` on every outbound link from now on ("Releases");
        ``unannounced``: the release a peer that announces none is taken to run."""
        features = sorted(set(features))
        if not valid_release(release) or len(features) > MAX_FEATURES or not all(map(valid_feature, features)):
            raise MembershipError("Invalid release or feature")
        if unannounced and not valid_release(unannounced):
            raise MembershipError("Invalid release")
        self.myself.release = release
        self.myself.features = frozenset(features)
        self._version = [release, features]
        self.unannounced = unannounced

    # =====================================================================
    # Views
    # =====================================================================
    @property
    def my_id(self) -> str:
        return self.myself.id

    @property
    def leaving(self) -> bool:
        return bool(self.myself.flags & NODE_LEAVING)

    def node(self, node_id: str) -> ClusterNode | None:
        return self._nodes.get(node_id)

    def link_of(self, node_id: str) -> int | None:
        n = self._nodes.get(node_id)
        if n is None or n.flags & NODE_HANDSHAKE:
            return None
        return n.link

    def reachable(self) -> list[str]:
        """Other nodes we may talk to now: no handshake/PFAIL/FAIL/LEAVING, and an address to send to.

        A NOADDR node (someone else answered at its address) has no outbound
        link and gets none until it turns up again, and failure detection skips
        it as Disque's does: counted as reachable, it would let an ADDJOB wait
        for a GOTJOB that can never come.
        """
        skip = NODE_MYSELF | NODE_HANDSHAKE | NODE_LEAVING | NODE_PFAIL | NODE_FAIL | NODE_NOADDR
        return [n.id for n in self._nodes.values() if not n.flags & skip]

    def releases(self) -> list[tuple[str, str | None, frozenset[str] | None]]:
        """Every other node (handshakes aside): its ID, release and features ("Releases")."""
        me = self.myself
        return [(n.id, n.release, n.features) for n in self._nodes.values()
                if n is not me and not n.flags & NODE_HANDSHAKE]  # fmt: skip

    def view_key(self) -> tuple:
        """What :meth:`reachable`, :meth:`known`, :meth:`size`, :meth:`hello`, :meth:`link_of` and the
        features of :meth:`releases` are made of (every node's id, address, flags, link and announced
        features): while it is equal, so are they (the
        server refreshes the core's view of the cluster only when it changed)."""
        return tuple(map(_VIEW_FIELDS, self._nodes.values()))

    def known(self) -> list[str]:
        return [n.id for n in self._nodes.values() if not n.flags & NODE_HANDSHAKE]

    def size(self) -> int:
        return sum(1 for n in self._nodes.values() if not n.flags & NODE_HANDSHAKE)

    def hello(self) -> list[tuple[str, str, int, int]]:
        out = []
        for n in self._nodes.values():
            if n.flags & NODE_HANDSHAKE:
                continue
            priority = 1
            if n.link is None and n is not self.myself:
                priority = 5
            if n.flags & NODE_PFAIL:
                priority = 10
            if n.flags & (NODE_FAIL | NODE_LEAVING):
                priority = 100
            out.append((n.id, n.ip, n.port, priority))
        return out

    def _wall(self, t: int) -> int:
        return t + self.wall_offset if t else 0

    def _describe(self, n: ClusterNode, release: bool = False) -> str:
        connected = n.link is not None or n is self.myself
        return "%s %s:%d %s %d %d %s%s\n" % (
            n.id,
            n.ip,
            n.port,
            flags_text(n.flags),
            self._wall(n.ping_sent),
            self._wall(n.pong_received),
            "connected" if connected else "disconnected",
            " " + release_text(n.release) if release else "",
        )

    def nodes_text(self) -> str:
        """CLUSTER NODES: Disque's fields, then each node's release ("Releases")."""
        announced = self._version is not None  # (a table that announces nothing keeps Disque's lines)
        return "".join(self._describe(n, announced) for n in self._nodes.values())

    def save_text(self) -> str:
        return "".join(self._describe(n) for n in self._nodes.values() if not n.flags & NODE_HANDSHAKE)

    def info_fields(self) -> dict[str, int | str]:
        fields: dict[str, int | str] = {
            "cluster_state": "ok",
            "cluster_known_nodes": len(self._nodes),
            "cluster_reachable_nodes": len(self.reachable()),
            "cluster_size": self.size(),
            "cluster_stats_messages_sent": self.stats.get("messages_sent", 0),
            "cluster_stats_messages_received": self.stats.get("messages_received", 0),
        }
        for key, value in self.stats.items():
            if key not in ("messages_sent", "messages_received"):
                fields["cluster_stats_" + key] = value
        return fields

    def take_effects(self) -> list:
        effects, self._effects = self._effects, []
        return effects

    # =====================================================================
    # Loading nodes.conf
    # =====================================================================
    @classmethod
    def from_text(
        cls,
        text: str,
        *,
        my_port: int,
        node_timeout: int,
        now: int,
        rng: random.Random,
        wall_offset: int = 0,
    ) -> Membership:
        """Rebuild the table from ``save_text()`` output (Disque's nodes.conf).

        A zero-length file means "no configuration" in Disque; the shell should
        treat it like a missing file rather than call this.
        """

        def corrupted(reason: str, lineno: int | None = None) -> MembershipError:
            where = " (line %d)" % lineno if lineno is not None else ""
            return MembershipError("corrupted cluster config file: %s%s" % (reason, where))

        if not isinstance(text, str):
            raise corrupted("not text")
        nodes: dict[str, ClusterNode] = {}
        myself: ClusterNode | None = None
        for lineno, line in enumerate(text.splitlines(), 1):
            argv = line.split()
            if not argv:
                continue
            if argv[0].lower() == "vars":
                continue  # no persistent vars yet; unknown ones are skipped as Disque does
            if len(argv) != 6:
                raise corrupted("expected 6 fields, got %d" % len(argv), lineno)
            node_id, addr, flag_field, ping_field, pong_field, _link_state = argv
            if not is_node_id(node_id):
                raise corrupted("bad node id %r" % node_id[:64], lineno)
            ip, colon, port_text = addr.rpartition(":")
            if not colon:
                raise corrupted("bad address %r" % addr[:64], lineno)
            try:
                port = int(port_text)
                ping_sent = int(ping_field)
                pong_received = int(pong_field)
            except ValueError:
                raise corrupted("bad number", lineno) from None
            if not 0 <= port <= MAX_PORT:
                raise corrupted("bad port %d" % port, lineno)
            if ip:
                norm = normalize_ip(ip)
                if norm is None:
                    raise corrupted("bad ip %r" % ip[:64], lineno)
                ip = norm
            flags = 0
            for name in flag_field.split(","):
                flag = _FLAG_BY_NAME.get(name.lower())
                if flag is None:
                    raise corrupted("unknown flag %r" % name[:32], lineno)
                flags |= flag
            n = nodes.get(node_id)
            if n is None:
                n = nodes[node_id] = ClusterNode(node_id, ip, port, 0, now)
            n.ip, n.port = ip, port
            n.flags |= flags
            if flags & NODE_MYSELF:
                if myself is not None and myself is not n:
                    raise corrupted("more than one myself node", lineno)
                myself = n
            if flags & NODE_FAIL:
                n.fail_time = now
            if ping_sent:
                n.ping_sent = now
            if pong_received:
                n.pong_received = now
        if myself is None:
            raise corrupted("no myself node")
        m = cls(myself.id, myself.ip, my_port, node_timeout=node_timeout, now=now, rng=rng, wall_offset=wall_offset)
        myself.port = my_port
        myself.ping_sent = myself.pong_received = 0
        myself.flags &= NODE_MYSELF | NODE_LEAVING
        m.myself = myself
        m._nodes = nodes
        return m

    # =====================================================================
    # Operator commands
    # =====================================================================
    def meet(self, ip: str, port: int, now: int) -> None:
        """CLUSTER MEET: start a handshake with ip:port (a no-op if one is running)."""
        self._now = now
        if self._start_handshake(ip, port) is None and not self._handshake_in_progress_raw(ip, port):
            raise MembershipError("Invalid node address specified: %s:%s" % (ip, port))
        self._flush()

    def forget(self, node_id: str, now: int) -> None:
        """CLUSTER FORGET: drop a node and keep gossip from re-adding it for 60 s."""
        self._now = now
        if type(node_id) is not str or len(node_id) != 40:
            raise MembershipError("Invalid node identifier")
        n = self._nodes.get(node_id)
        if n is None:
            raise MembershipError("Unknown node %s" % node_id)
        if n is self.myself:
            raise MembershipError("I tried hard but I can't forget myself...")
        self._banned[node_id] = now + BLACKLIST_TTL_MS
        self._delete_node(n)
        self._log("notice", "Forgot node %s (banned from gossip for %d s)" % (node_id, BLACKLIST_TTL_MS // 1000))
        self._save = True
        self._flush()

    def reset(self, hard: bool, now: int, new_id: str | None = None) -> None:
        """CLUSTER RESET: forget every other node; HARD also takes a new id."""
        self._now = now
        if hard:
            if new_id is None:
                new_id = self._random_id()
            if not is_node_id(new_id) or (new_id in self._nodes and new_id != self.myself.id):
                raise MembershipError("Invalid node identifier")
        for n in list(self._nodes.values()):
            if n is not self.myself:
                self._delete_node(n)
        self._connecting.clear()
        if hard and new_id is not None and new_id != self.myself.id:
            del self._nodes[self.myself.id]
            self.myself.id = new_id
            self._nodes[new_id] = self.myself
        self._log("notice", "Cluster %s reset, I'm %s" % ("hard" if hard else "soft", self.myself.id))
        self._save = True
        self._flush()

    def set_leaving(self, leaving: bool, now: int) -> None:
        """CLUSTER LEAVING yes|no. Peers learn it from our next PING/PONG."""
        self._now = now
        old = self.myself.flags
        if leaving:
            self.myself.flags |= NODE_LEAVING
        else:
            self.myself.flags &= ~NODE_LEAVING
        if old != self.myself.flags:
            self._log("notice", "This node is %s the cluster" % ("leaving" if leaving else "no longer leaving"))
            self._save = True
        self._flush()

    # =====================================================================
    # Link events from the shell
    # =====================================================================
    def link_peer(self, link: int, ip: str, local_ip: str | None = None) -> None:
        """An inbound link was accepted from ``ip``; ``local_ip`` is our end.

        Call before the first ``receive`` on that link (repeating it is cheap
        and harmless). The peer ip lets a MEET from an unknown node start a
        handshake back to it, and a PING reveal a known node's new address. ``local_ip``, when given, lets a MEET teach
        us our own address (as Disque does when it has none configured).
        """
        info = self._links.get(link)
        if info is None:
            self._links[link] = _Link(None, normalize_ip(ip), normalize_ip(local_ip), self._now)
        elif info.node is None:
            # Already announced (the shell may repeat this before every
            # message): only fill in what was missing.
            if info.ip is None:
                info.ip = normalize_ip(ip)
            if local_ip is not None and info.local_ip is None:
                info.local_ip = normalize_ip(local_ip)
        # else: the id is one of our outbound links; nothing to learn.

    def link_up(self, node_id: str, link: int, now: int) -> None:
        """Our Connect for ``node_id`` succeeded: greet the node on ``link``."""
        self._now = now
        target = self._connecting.pop(node_id, None)
        n = self._nodes.get(node_id)
        if (
            n is None
            or n is self.myself
            or n.link is not None
            or n.flags & NODE_NOADDR
            or link in self._links
            or target != (n.ip, n.port)
        ):
            # Stale: the node went away, moved, or is already linked.
            self._effects.append(Close(link))
            self._flush()
            return
        n.link = link
        self._links[link] = _Link(n, n.ip, None, now)
        pending = n.ping_sent
        if n.flags & NODE_MEET:
            self._send(link, self._gossip_message(Meet))
            n.flags &= ~NODE_MEET
        else:
            self._send(link, self._gossip_message(Ping))
        # a new link may reach another process (a restart, on another release): unknown again
        n.release = n.features = None
        n.link_pongs = 0
        if self._version is not None:
            self._send(link, Data(self.myself.id, VERSION_KIND, self._version))
        # Keep the oldest unanswered ping so failure detection is not reset
        # by reconnecting.
        n.ping_sent = pending or max(now, 1)
        self._flush()

    def link_failed(self, node_id: str, now: int) -> None:
        """Our Connect for ``node_id`` failed (refused, timed out, auth failed)."""
        self._now = now
        self._connecting.pop(node_id, None)
        n = self._nodes.get(node_id)
        if n is not None and n is not self.myself and n.ping_sent == 0:
            n.ping_sent = max(now, 1)
        self._flush()

    def link_down(self, link: int, now: int) -> None:
        """A link (either direction) is gone. Outbound ones reconnect on tick()."""
        self._now = now
        info = self._links.pop(link, None)
        if info is not None and info.node is not None and info.node.link == link:
            info.node.link = None
        self._flush()

    # =====================================================================
    # Messages
    # =====================================================================
    def receive(self, link: int, msg: Any, now: int) -> None:
        """A message arrived on ``link``. Only PING/PONG/MEET/FAIL are acted on."""
        self._now = now
        self.stats["messages_received"] += 1
        kind = type(msg)
        if kind is Fail:
            self._receive_fail(msg)
        elif kind is Ping or kind is Pong or kind is Meet:
            self._receive_ping(link, msg, kind)
        elif kind is Data and msg.kind == VERSION_KIND:
            self._receive_version(link, msg)
        self._flush()

    def _receive_version(self, link: int, msg: Data) -> None:
        """A release announcement ("Releases"): answered on an inbound link, recorded from our own."""
        body = msg.body
        if (
            type(body) is not list
            or len(body) < 2  # a later release may add fields: ignored
            or not valid_release(body[0])
            or type(body[1]) is not list
            or len(body[1]) > MAX_FEATURES
            or not all(valid_feature(f) for f in body[1])
        ):
            self.stats["versions_malformed"] += 1
            return
        info = self._links.get(link)
        if info is None:
            return
        n = info.node
        if n is None:  # a peer's outbound link: it asks
            if self._version is not None:
                self._send(link, Data(self.myself.id, VERSION_KIND, self._version))
        elif n.link == link and n.id == msg.sender:
            n.release = body[0]
            n.features = frozenset(body[1])

    def _lookup_sender(self, sender_id: Any) -> ClusterNode | None:
        if not is_node_id(sender_id):
            return None
        n = self._nodes.get(sender_id)
        if n is None or n is self.myself or n.flags & NODE_HANDSHAKE:
            return None
        return n

    def _receive_fail(self, msg: Fail) -> None:
        sender = self._lookup_sender(msg.sender)
        if sender is None or not is_node_id(msg.node_id):
            return
        n = self._nodes.get(msg.node_id)
        if n is None or n.flags & (NODE_FAIL | NODE_MYSELF | NODE_HANDSHAKE):
            return
        n.flags = (n.flags | NODE_FAIL) & ~NODE_PFAIL
        n.fail_time = self._now
        self._log("notice", "FAIL message received from %s about %s" % (sender.id, n.id))
        self._save = True

    def _receive_ping(self, link: int, msg: Any, kind: type) -> None:
        sender_id = msg.sender
        gossip = msg.gossip
        if (
            not is_node_id(sender_id)
            or not _valid_port(msg.port)
            or not _is_int(msg.flags)
            or not isinstance(gossip, (tuple, list))
        ):
            return  # malformed: drop without answering
        myself = self.myself
        info = self._links.get(link)
        link_node = info.node if info is not None else None
        from_myself = sender_id == myself.id
        sender = self._lookup_sender(sender_id)
        if sender is not None and link_node is None and info is not None:
            info.sender = sender.id  # its outbound link: closed with it when it stops answering

        if kind is not Pong:
            # Learn our own address from the socket a MEET came in on.
            if (kind is Meet or not myself.ip) and info is not None and info.local_ip and info.local_ip != myself.ip:
                myself.ip = info.local_ip
                self._log("warning", "IP address for this node updated to %s" % myself.ip)
                self._save = True
            if kind is Meet and sender is None and not from_myself:
                peer_ip = info.ip if info is not None else None
                if peer_ip is not None and not self._handshake_in_progress(peer_ip, msg.port):
                    self._add_node(ClusterNode(self._random_id(), peer_ip, msg.port, NODE_HANDSHAKE, self._now))
                    self._log("verbose", "MEET from unknown node %s:%d: starting handshake" % (peer_ip, msg.port))
                    self._save = True
                # Trusted because of the message type, but with no known sender
                # only address refreshes of failing nodes can result.
                self._process_gossip(None, gossip)
            self._send(link, self._gossip_message(Pong))

        if link_node is not None:
            if link_node.flags & NODE_HANDSHAKE:
                if sender is not None or from_myself:
                    # We already know whoever answers here: refresh its
                    # address and drop the temporary entry.
                    if sender is not None and self._update_address(sender, link, msg.port):
                        self._save = True
                    self._delete_node(link_node)
                    return
                if sender_id in self._nodes:
                    # Claims another handshake node's temporary id: nonsense.
                    self._delete_node(link_node)
                    return
                self._rename(link_node, sender_id)
                link_node.flags &= ~NODE_HANDSHAKE
                self._log("notice", "Handshake with node %s completed (%s:%d)" % (sender_id, link_node.ip, link_node.port))
                self._save = True
            elif link_node.id != sender_id:
                # Someone else answers at this address now.
                self._log("verbose", "Node %s answers as %s: address forgotten" % (link_node.id, sender_id))
                link_node.flags |= NODE_NOADDR
                link_node.ip = ""
                link_node.port = 0
                self._close_outbound(link_node)
                self._save = True
                return

        if sender is not None and kind is Ping and self._update_address(sender, link, msg.port):
            self._save = True

        if link_node is not None and kind is Pong:
            link_node.pong_received = max(self._now, 1)
            link_node.ping_sent = 0
            link_node.link_pongs += 1
            if link_node.link_pongs >= 2 and link_node.release is None and self._version is not None:
                link_node.release = self.unannounced  # no answer to our announcement: a node of before them
            if link_node.flags & NODE_PFAIL:
                link_node.flags &= ~NODE_PFAIL
                self._log("verbose", "Node %s is reachable again (PFAIL cleared)" % link_node.id)
                self._save = True
            elif link_node.flags & NODE_FAIL:
                link_node.flags &= ~NODE_FAIL
                self._log("notice", "Clear FAIL state for node %s: it is reachable again" % link_node.id)
                self._save = True

        if sender is not None:
            if (kind is not Pong and sender.link is None and sender.id not in self._connecting and sender.ip
                    and not sender.flags & NODE_NOADDR):  # fmt: skip
                # It talks to us and we have no link to it (it restarted, or a cut healed): connect
                # now, not at the next tick (up to 100 ms later; the job layer only sends on our
                # own links, so a restarted node's jobs waited for that).
                self._connecting[sender.id] = (sender.ip, sender.port)
                self._effects.append(Connect(sender.id, sender.ip, sender.port + BUS_PORT_OFFSET))
            old = sender.flags
            sender.flags = (sender.flags & ~NODE_LEAVING) | (msg.flags & NODE_LEAVING)
            if sender.flags != old:
                state = "is leaving" if sender.flags & NODE_LEAVING else "is no longer leaving"
                self._log("notice", "Node %s %s the cluster" % (sender.id, state))
                self._save = True
            self._process_gossip(sender, gossip)

    def _process_gossip(self, sender: ClusterNode | None, entries: Any) -> None:
        for g in entries:
            if type(g) is not Gossip or not is_node_id(g.node_id) or not _is_int(g.flags):
                continue
            n = self._nodes.get(g.node_id)
            if n is not None:
                if sender is not None and n is not self.myself and not n.flags & NODE_HANDSHAKE and n is not sender:
                    if g.flags & (NODE_PFAIL | NODE_FAIL):
                        if sender.id not in n.fail_reports:
                            self._log("verbose", "Node %s reported node %s as not reachable" % (sender.id, n.id))
                        n.fail_reports[sender.id] = self._now
                        self._mark_failing_if_needed(n)
                    elif n.fail_reports.pop(sender.id, None) is not None:
                        self._log("verbose", "Node %s reported node %s is back online" % (sender.id, n.id))
                        self._cleanup_reports(n)
                # A failing node seen elsewhere at a new address: try there.
                if n.flags & (NODE_PFAIL | NODE_FAIL) and (n.ip != g.ip or n.port != g.port):
                    self._start_handshake(g.ip, g.port)
            elif sender is not None and not g.flags & NODE_NOADDR and not self._is_banned(g.node_id):
                self._start_handshake(g.ip, g.port)

    # =====================================================================
    # Time
    # =====================================================================
    def tick(self, now: int, max_pings: int | None = None) -> None:
        """Disque's clusterCron: reconnect, ping, detect failures. Of the PINGs due, at most
        ``max_pings`` are sent now (None: all); the rest wait for :meth:`send_pings` ("Ticks in
        slices")."""
        self._now = now
        timeout = self.node_timeout
        handshake_timeout = max(timeout, 1000)
        settled = not self._connecting

        for n in list(self._nodes.values()):
            if n.flags & (NODE_MYSELF | NODE_NOADDR):
                continue
            if n.flags & NODE_HANDSHAKE or n.link is None:
                settled = False
            if n.flags & NODE_HANDSHAKE and now - n.ctime > handshake_timeout:
                self._log("verbose", "Handshake with %s:%d timed out" % (n.ip, n.port))
                self._delete_node(n)
                continue
            if n.link is None and n.id not in self._connecting:
                if n.ping_sent == 0:
                    # The PING goes out as soon as the link is up; for failure
                    # detection it is pending from now.
                    n.ping_sent = max(now, 1)
                if n.ip:
                    self._connecting[n.id] = (n.ip, n.port)
                    self._effects.append(Connect(n.id, n.ip, n.port + BUS_PORT_OFFSET))

        if now - self._random_ping_at >= RANDOM_PING_MS:
            self._random_ping_at = now
            # Ping the node with the oldest PONG among a few random ones.
            candidates = list(self._nodes.values())
            best: ClusterNode | None = None
            for _ in range(RANDOM_PING_SAMPLES):
                n = self.rng.choice(candidates)
                if n.link is None or n.ping_sent or n.flags & (NODE_MYSELF | NODE_HANDSHAKE):
                    continue
                if best is None or n.pong_received < best.pong_received:
                    best = n
            if best is not None:
                self._pings_due[best.id] = best

        for n in list(self._nodes.values()):
            if n.flags & (NODE_MYSELF | NODE_NOADDR | NODE_HANDSHAKE):
                continue
            if (
                n.link is not None
                and now - self._links[n.link].ctime > timeout
                and n.ping_sent
                and n.pong_received < n.ping_sent
                and now - n.ping_sent > timeout // 2
            ):
                # Waiting too long for a PONG on an old link: reconnect, the
                # link itself may be the problem.
                self._close_outbound(n)
                self._close_inbound(n)
            if n.link is not None and n.ping_sent == 0 and now - n.pong_received > timeout // 2:
                self._pings_due[n.id] = n
                continue
            if n.ping_sent == 0:
                continue
            if now - n.ping_sent > timeout and not n.flags & (NODE_PFAIL | NODE_FAIL):
                n.flags |= NODE_PFAIL
                self._close_inbound(n)
                self._log("verbose", "Node %s is possibly failing (no PONG for %d ms)" % (n.id, now - n.ping_sent))
        if settled:
            settled = not any(n.flags & (NODE_PFAIL | NODE_FAIL) for n in self._nodes.values())
        self.settled = settled
        self._send_due(max_pings)
        self._flush()

    def send_pings(self, now: int, limit: int = 1) -> int:
        """Send up to ``limit`` of the PINGs the ticks found due and left unsent, oldest first;
        how many are still waiting ("Ticks in slices")."""
        self._now = now
        self._send_due(limit)
        self._flush()
        return len(self._pings_due)

    def pings_due(self) -> int:
        """How many PINGs the ticks found due are still unsent (:meth:`send_pings`)."""
        return len(self._pings_due)

    def idle_tick_ms(self) -> int:
        """How often :meth:`tick` needs to run now: every 100 ms (Disque's cron) while anything is in
        flux (a handshake, a connect, a node without a link, a failing node), else every 1/20 of the
        node timeout, at most 500 ms: a ping or a PFAIL is then at most that late (3 % of the default
        15 s), and an idle node of a quiet cluster is woken 2 times a second instead of 10."""
        if not self.settled:
            return TICK_MS
        return max(TICK_MS, min(IDLE_TICK_MAX_MS, self.node_timeout // 20))

    # =====================================================================
    # Internals
    # =====================================================================
    def _flush(self) -> None:
        if self._save:
            self._save = False
            self._effects.append(SaveConfig())

    def _log(self, level: str, text: str) -> None:
        self._effects.append(Log(level, text))

    def _send(self, link: int, msg: Any) -> None:
        self.stats["messages_sent"] += 1
        self._effects.append(Send(link, msg))

    def _random_id(self) -> str:
        while True:
            node_id = "%040x" % self.rng.getrandbits(160)
            if node_id not in self._nodes:
                return node_id

    def _send_due(self, limit: int | None) -> None:
        """Up to ``limit`` (None: every one) of the queued PINGs still wanted, oldest first."""
        due = self._pings_due
        nodes = self._nodes
        while due and (limit is None or limit > 0):
            node_id = next(iter(due))
            n = due.pop(node_id)
            if nodes.get(node_id) is not n or n.link is None or n.ping_sent or n.flags & NODE_HANDSHAKE:
                continue  # gone, renamed, unlinked, or pinged meanwhile (a new link's PING): not wanted now
            self._ping(n)
            if limit is not None:
                limit -= 1

    def _ping(self, n: ClusterNode) -> None:
        assert n.link is not None
        self._send(n.link, self._gossip_message(Ping))
        n.ping_sent = max(self._now, 1)

    def _gossip_message(self, kind: type) -> Any:
        me = self.myself
        return kind(me.id, me.port, me.flags, self._gossip_entries())

    def _gossip_entries(self) -> tuple[Gossip, ...]:
        """A few random nodes, failing ones first (Disque's selection)."""
        nodes = list(self._nodes.values())
        fresh = len(nodes) - 2  # minus ourselves and the receiver
        wanted = min(max(3, len(nodes) // 10), fresh)
        tries = wanted * 3
        chosen: dict[str, Gossip] = {}
        choice = self.rng.choice
        while fresh > 0 and len(chosen) < wanted and tries > 0:
            tries -= 1
            n = choice(nodes)
            if n is self.myself:
                continue
            failing = n.flags & (NODE_PFAIL | NODE_FAIL)
            if tries > wanted * 2 and not failing:
                continue  # the first picks are reserved for failing nodes
            if n.flags & (NODE_HANDSHAKE | NODE_NOADDR) or (n.link is None and not failing):
                fresh -= 1
                continue
            if n.id in chosen:
                continue
            fresh -= 1
            chosen[n.id] = Gossip(n.id, n.ip, n.port, n.flags, self._wall(n.ping_sent), self._wall(n.pong_received))
        return tuple(chosen.values())

    def _add_node(self, n: ClusterNode) -> None:
        self._nodes[n.id] = n

    def _delete_node(self, n: ClusterNode) -> None:
        """Remove a node, its outbound link and every report it made."""
        if n is self.myself:
            return
        for other in self._nodes.values():
            other.fail_reports.pop(n.id, None)
        self._close_outbound(n)
        self._connecting.pop(n.id, None)
        self._nodes.pop(n.id, None)

    def _rename(self, n: ClusterNode, new_id: str) -> None:
        del self._nodes[n.id]
        self._connecting.pop(n.id, None)
        n.id = new_id
        self._nodes[new_id] = n

    def _close_outbound(self, n: ClusterNode) -> None:
        if n.link is not None:
            self._links.pop(n.link, None)
            self._effects.append(Close(n.link))
            n.link = None

    def _close_inbound(self, n: ClusterNode) -> None:
        """Close the links ``n`` talks to us on: it stopped answering our PINGs. Whatever it
        sent before a cut and its kernel still retransmits would otherwise be read when the
        network heals, seconds late (a job moved here then, after its ack was collected,
        came back to life); a live node reconnects at once."""
        for link in [k for k, info in self._links.items() if info.sender == n.id]:  # only inbound ones have one
            del self._links[link]
            self._effects.append(Close(link))

    def _update_address(self, n: ClusterNode, link: int, port: int) -> bool:
        """If ``n`` talks to us from a new ip:port on ``link``, move it there."""
        if link == n.link:
            return False
        info = self._links.get(link)
        ip = info.ip if info is not None else None
        if ip is None or (n.ip == ip and n.port == port):
            return False
        n.ip, n.port = ip, port
        # A connect still in flight targets the old address: link_up will
        # notice and close it, then tick() connects to the new one.
        self._close_outbound(n)
        n.flags &= ~NODE_NOADDR
        self._log("warning", "Address updated for node %s, now %s:%d" % (n.id, ip, port))
        return True

    def _handshake_in_progress(self, ip: str, port: int) -> bool:
        for n in self._nodes.values():
            if n.flags & NODE_HANDSHAKE and n.port == port and n.ip == ip:
                return True
        return False

    def _handshake_in_progress_raw(self, ip: Any, port: Any) -> bool:
        norm = normalize_ip(ip)
        return norm is not None and _valid_port(port) and self._handshake_in_progress(norm, port)

    def _start_handshake(self, ip: Any, port: Any) -> ClusterNode | None:
        """Add a HANDSHAKE|MEET node for ip:port; None if invalid or already running."""
        norm = normalize_ip(ip)
        if norm is None or not _valid_port(port):
            return None
        if self._handshake_in_progress(norm, port):
            return None
        n = ClusterNode(self._random_id(), norm, port, NODE_HANDSHAKE | NODE_MEET, self._now)
        self._add_node(n)
        self._log("verbose", "Starting handshake with %s:%d" % (norm, port))
        return n

    def _is_banned(self, node_id: str) -> bool:
        now = self._now
        for key in [k for k, until in self._banned.items() if until < now]:
            del self._banned[key]
        return node_id in self._banned

    def _cleanup_reports(self, n: ClusterNode) -> None:
        oldest = self._now - self.node_timeout * FAIL_REPORT_VALIDITY_MULT
        stale = [rid for rid, t in n.fail_reports.items() if t < oldest]
        for rid in stale:
            del n.fail_reports[rid]

    def _mark_failing_if_needed(self, n: ClusterNode) -> None:
        """PFAIL -> FAIL once a majority (counting us) reports the node failing."""
        if not n.flags & NODE_PFAIL or n.flags & NODE_FAIL:
            return
        self._cleanup_reports(n)
        if len(n.fail_reports) + 1 < self.size() // 2 + 1:
            return
        n.flags = (n.flags & ~NODE_PFAIL) | NODE_FAIL
        n.fail_time = self._now
        self._log("notice", "Marking node %s as failing (quorum reached)" % n.id)
        msg = Fail(self.myself.id, n.id)
        for other in self._nodes.values():
            if other.link is not None and not other.flags & (NODE_MYSELF | NODE_HANDSHAKE):
                self._send(other.link, msg)
        self._save = True
