"""Limits: the groups' settings kept by the cluster, and their limits kept without a leader.

Theory of operation
-------------------
**Settings.** A group's settings (GROUP WEIGHT, GROUP LIMIT) are one :class:`Settings` record
of two parts, each with its own stamp (wall-clock ms of the change, then the node ID that made
it): the weight, and the limits (CONCURRENCY n and RATE r, 0 for none). A node merges what it
hears part by part, the later stamp winning (last writer wins), so every node ends with the same
table whatever the order of the messages. A change is sent at once to every reachable node
(``GROUPS SET``); every ``DIGEST_MS`` each node sends its table's digest (``GROUPS DIGEST``) to
each reachable one, which answers a digest unlike its own with its whole table and asks for the
other's back: a node that was down, cut off or joined later has the table within one period.
The table is journaled (``J_GROUP``: an AOF ``GROUPSET`` record per change, and every record
in a rewrite), so it survives a restart.

**Limits as units held by nodes.** A limit is a number of units: CONCURRENCY n is n units, one
per job of the group delivered and not yet acknowledged; RATE r (deliveries a second) is r * 1000
milli-units, a token bucket on each node refilled at the units it holds, its burst the units it
holds (one second's worth: the cluster's burst is r deliveries at most). Each node holds a share
(``Pool.held``) and delivers a job of the group only within it: a concurrency pool while its own
unacknowledged deliveries (``Pool.used``) are fewer than its units, a rate pool while its bucket
holds a whole delivery. The units of one limit never add up to more than the limit: they are
made once, all on the node that took GROUP LIMIT, and afterwards only moved: a node whose jobs
of the group wait and whose share is used up asks (``GROUPS ASK``) the node that last said it
had the most to spare, which gives what it does not need (``GROUPS GRANT``); a node none of whose
jobs of the group wait gives its idle units at once (``_offer``, at its next ``TICK_MS``) to the
peer that said the most of them wait there, so the limit stays in use while jobs wait anywhere.
Where jobs of the group wait on several nodes, the units spread toward them (``_balance``): each
such node's fair share is the limit split evenly among them, none given more than its demand
(its deliveries not settled plus its jobs waiting, for a concurrency limit; the rest goes to the
others), the remainder one each to the lowest IDs; a node holding more than its share gives its
idle units over it to the one furthest below its own, counting the units it sent that the other
has not said it took. A node with jobs waiting says it has none to spare when asked. A grant leaves the
giver before it is sent; the receiver adds it once (grants are numbered by their giver) and
answers ``GROUPS GRANTED``; the giver sends it again until then. Units in flight are nobody's:
the sum can only fall short of the limit, never exceed it. A job of a group at its limit stays
queued (``GroupTable.held``: the queues skip the group's turn): no NACK, no delivery counted.

**Partitions and failures.** A node that cannot reach a majority of the cluster delivers no job
of a limited group (it is fenced: its share may be taken back by the others); nor does one that
has not heard the shares of a majority (itself counted) for ``FENCE_MS``, whatever its links say,
so that a failure detector slower on its side than on the others' does not let it deliver past
the moment they may take its units back. Every
``GOSSIP_MS`` each node tells every reachable one what it holds of each pool, with, per other
node, the units it has given it and received from it in all (``Pool.sent``, ``Pool.recv``: they
only grow), the longest RETRY of the jobs it has delivered (told at its next tick when it
grows), and the silent incarnations it knows (``Peer.silent``). A node that this node has not
heard from for longer than that RETRY plus ``RECLAIM_MARGIN_MS`` (its deliveries are due back in
their queues by then), or a node's former self (it restarted: a new incarnation, its units
forgotten), has its units taken back by one node: the one with the lowest ID among those that
reach a majority, have heard from every other node not being taken back since it went silent,
and know that incarnation (a node's new self never heard of its former self, nor a node started
since it went silent: a live node of a lower ID that did not say it knows it is passed over). It
adds what the gone node held when it last spoke, plus what others gave it since, minus what
others got from it since (the counters above), and says so in its gossip at once (``void``):
everyone then refuses that incarnation's grants and stops sending it the grants it did not
acknowledge (counted by the taker as the gone one's), and the node itself, if it comes back,
drops what it holds and starts again with nothing as a new incarnation. A grant names the
incarnation it is meant for (and GRANTED the one that took it): one sent again to a node that
restarted is refused by its new self, whose former self is taken back with the grant counted in.
A node refuses the grants of an incarnation silent here for ``RECLAIM_MARGIN_MS`` until it hears
from it again (its gossip then says whether it is void). A node that comes back from a partition
delivers no job of a limited group before it has heard from every node it reaches, so it learns
first whether its units were taken back.

A delivery counts against its node's units until its consumer acknowledges it there, gives it
back (NACK, RELEASE: its count of returns grew), or its RETRY since the delivery passes
(``_used``). A job queued here again by a holder that missed the delivery (a partition cut the
WORKING of ``Requeue.lease``; the job moved back here) is still held by its consumer: that does
not settle it; delivered here again meanwhile, an ack (or return) ends the latest delivery, and
the earlier one counts until its RETRY.

The fields added to GROUPS messages within this release (GRANT's incarnation, GRANTED's, SHARES'
silent list, the digest of current incarnations, and each pool's deliveries not settled) are trailing: a peer that does not send them is read as before (its grants go to
whichever incarnation takes them; a peer that does not say which silent incarnations it knows is
taken to know them all, so the lower ID waits for it: units may stay untaken, never counted twice;
one that sends no digest keeps lost units from being made again; one that does not say what it
uses is taken to use all it holds).

**Units lost.** A grant can be lost for good: sent to an incarnation that is taken back before
it said it took it, or refused by one that restarted. The sum then falls short of the limit, and
with every unit gone the group would never deliver again. ``_restore`` makes them again, on one
node, only when what exists is known exactly: every node reachable, each taking the same
incarnations as current (a digest in SHARES), none silent for anyone, no ledger naming an
incarnation neither current nor taken back, every grant taken, and two gossip rounds in a row,
each node heard again between them, that saw the same holdings and ledgers everywhere. Nothing
moved between the two rounds and nothing was in flight, so the units held are all that exist;
the node of the lowest ID adds what is missing (INFO stats ``group_units_restored``).

A limit changed (a new GROUP LIMIT) makes new units, all on the node that took the command;
jobs delivered before the change count against no new unit (they finish under the old limit).
A single node holds every unit itself (after a restart, once it has been alone for ``ALONE_MS``).
Units held are not persisted: a node that restarts holds none until the others take back its
former self's and give them out again.

What is sans-I/O here: the clock is ``ctx.now``, messages are ``ctx.send``, the table is
journaled through ``ctx.journal``; nothing here blocks or sleeps.
"""

from __future__ import annotations

import zlib
from typing import Any, Final, final

from .commands import check_group_name, parse_int
from .commandspec import CommandSpec
from .context import Context
from .groups import WEIGHT_DEFAULT, WEIGHT_MAX, GroupTable
from .job import QUEUED, Job, job_group
from .replies import Error, err

__all__ = [
    "Limits", "Settings", "Pool", "COMMANDS", "J_GROUP", "CONC", "RATE", "GOSSIP_MS", "DIGEST_MS",
    "RECLAIM_MARGIN_MS", "CONCURRENCY_MAX", "RATE_MAX", "format_rate", "settings_from_wire",
]  # fmt: skip

#: The journal entry of a settings record (store.J_* are jobs'; this one carries a Settings).
J_GROUP: Final = 16
CONC: Final = 0  # a pool's kind: CONCURRENCY
RATE: Final = 1  # RATE (milli-deliveries a second)
GOSSIP_MS: Final = 1000  # each node's shares told to every reachable node this often
DIGEST_MS: Final = 5000  # the settings table's digest sent this often
ASK_MS: Final = 200  # a node whose share is used up asks again this often at most
RESEND_MS: Final = 1000  # a grant not acknowledged is sent again after this
TICK_MS: Final = 50  # how often used shares are looked at again while a group is held
RECLAIM_MARGIN_MS: Final = 2000  # beyond the longest RETRY before a silent node's units come back
#: A node that has not heard the shares of a majority (itself counted) for this long delivers no job
#: of a limited group, whatever its links say: below RECLAIM_MARGIN_MS plus the shortest RETRY (1 s),
#: so it stops before the others may take its units back, however late its failure detector is.
FENCE_MS: Final = 2000
VOID_KEEP_MS: Final = 600_000
#: A node that has been a cluster of one this long holds every unit of each limit (a single node
#: after a restart: nobody else would take its former self's back).
ALONE_MS: Final = 10_000  # how long a void incarnation is told in the gossip
KEEP_ALL: Final = 1 << 62  # Pool.keep when nothing bounds what a node uses of its units
CONCURRENCY_MAX: Final = 100_000
RATE_MAX: Final = 1_000_000  # deliveries a second
GROUPS_MAX: Final = 10_000  # groups with settings at most (GROUP WEIGHT/LIMIT refuse more)

COMMANDS: Final = (
    CommandSpec(b"group", "cmd_group", -2, ("write", "fast"), ("admin",),
                subcommands=(("info", ("inspect",)), ("list", ("inspect",))),
                syntax="GROUP INFO group | LIST [COUNT count] | WEIGHT group weight | "
                       "LIMIT group CONCURRENCY count | LIMIT group RATE per-second | LIMIT group NONE",
                summary="A group's settings, counts and this node's share; its weight; its cluster-wide limits",
                group="queues", since="disque-py 0.2.0"),
)  # fmt: skip


def format_rate(milli: int) -> bytes:
    """Milli-deliveries a second as the shortest decimal (2500 -> b"2.5")."""
    whole, frac = divmod(milli, 1000)
    return b"%d" % whole if not frac else (b"%d.%03d" % (whole, frac)).rstrip(b"0")


def _parse_rate(raw: bytes) -> int | None:
    """RATE's value: a decimal number of deliveries a second, at most 3 decimals, as milli."""
    text = raw.decode("ascii", "replace")
    whole, dot, frac = text.partition(".")
    if not whole.isdigit() or len(whole) > 7 or (dot and (not frac.isdigit() or len(frac) > 3)):
        return None
    return int(whole) * 1000 + (int(frac.ljust(3, "0")) if frac else 0)


@final
class Settings:
    """One group's settings: its weight and its limits, each part with its own stamp."""

    __slots__ = ("name", "weight", "wstamp", "worigin", "conc", "rate", "lstamp", "lorigin")

    def __init__(self, name: bytes) -> None:
        self.name = name
        self.weight = WEIGHT_DEFAULT
        self.wstamp = 0
        self.worigin = ""
        self.conc = 0  # CONCURRENCY; 0: none
        self.rate = 0  # RATE in milli-deliveries a second; 0: none
        self.lstamp = 0
        self.lorigin = ""

    def __eq__(self, other: object) -> bool:
        if type(other) is not Settings:
            return NotImplemented
        return self.to_wire() == other.to_wire()  # type: ignore[attr-defined]

    __hash__ = None  # type: ignore[assignment]

    def __repr__(self) -> str:
        return "Settings(%r)" % (self.to_wire(),)

    def to_wire(self) -> list:
        return [self.name, self.weight, self.wstamp, self.worigin, self.conc, self.rate, self.lstamp, self.lorigin]

    def merge(self, other: Settings) -> tuple[bool, bool]:
        """Take the parts of ``other`` that are later; (weight changed, limits changed)."""
        w = (other.wstamp, other.worigin) > (self.wstamp, self.worigin)
        if w:
            self.weight, self.wstamp, self.worigin = other.weight, other.wstamp, other.worigin
        lim = (other.lstamp, other.lorigin) > (self.lstamp, self.lorigin)
        if lim:
            self.conc, self.rate, self.lstamp, self.lorigin = other.conc, other.rate, other.lstamp, other.lorigin
        return w, lim


def settings_from_wire(v: Any) -> Settings | None:
    """A peer's (or the AOF's) settings record, checked; None when anything is off."""
    if type(v) is not list or len(v) < 8:
        return None
    name, weight, wstamp, worigin, conc, rate, lstamp, lorigin = v[:8]
    if type(name) is not bytes or check_group_name(name) is not None:
        return None
    if type(weight) is not int or not 1 <= weight <= WEIGHT_MAX:
        return None
    if type(conc) is not int or not 0 <= conc <= CONCURRENCY_MAX or type(rate) is not int:
        return None
    if not 0 <= rate <= RATE_MAX * 1000:
        return None
    for stamp, origin in ((wstamp, worigin), (lstamp, lorigin)):
        if type(stamp) is not int or not 0 <= stamp < 1 << 62 or type(origin) is not str or len(origin) > 64:
            return None
    s = Settings(name)
    s.weight, s.wstamp, s.worigin = weight, wstamp, worigin
    s.conc, s.rate, s.lstamp, s.lorigin = conc, rate, lstamp, lorigin
    return s


def _ledger(d: dict) -> bool:
    """A peer's units given or taken, by incarnation: str keys, int values from 0, not too many."""
    if len(d) > 4096:
        return False
    for k, v in d.items():
        if type(k) is not str or type(v) is not int or not 0 <= v < 1 << 62:
            return False
    return True


def _earlier(active: dict[bytes, list[Any]], job_id: bytes, now: int) -> bool:
    """The latest delivery of ``job_id`` here settled: True if an earlier one's consumer may still
    hold it (its RETRY not over: it counts until then, settled by nothing else), else forgotten."""
    entry = active[job_id]
    if entry[3] > now:
        active[job_id] = [entry[0], entry[3], 1 << 62, 0]
        return True
    del active[job_id]
    return False


def _given_back(job: Job) -> int:
    """How many times ``job`` was given back by its consumers (NACK, RELEASE), as this node knows."""
    extra = job.extra
    return job.nacks + (extra.returns if extra is not None else 0)


def fair_shares(total: int, demands: list[tuple[str, int | None]]) -> dict[str, int]:
    """``total`` units split evenly among the nodes of ``demands`` (node ID, demand or None for no
    bound), none given more than its demand (what it is not given goes to the others), the
    remainder one unit each to the lowest IDs. The same answer on every node for the same input."""
    out: dict[str, int] = {}
    left = total
    open_ = sorted(demands)
    while open_:
        even = left // len(open_)
        capped = [(n, d) for n, d in open_ if d is not None and d <= even]
        if not capped:
            break
        for n, d in capped:
            out[n] = d if d is not None else 0
            left -= out[n]
        open_ = [(n, d) for n, d in open_ if n not in out]
    if open_:
        even, extra = divmod(left, len(open_))
        for i, (n, _) in enumerate(open_):
            out[n] = even + (1 if i < extra else 0)
    return out


@final
class Pool:
    """This node's share of one limit (a group's CONCURRENCY or RATE) and its ledger."""

    __slots__ = ("group", "kind", "total", "vstamp", "vorigin", "held", "sent", "recv", "out", "seen", "level",
                 "level_at", "asked_at", "keep")  # fmt: skip

    def __init__(self, group: bytes, kind: int, total: int, vstamp: int, vorigin: str) -> None:
        self.group = group
        self.kind = kind
        self.total = total
        self.vstamp = vstamp  # the limit's version: its stamp and origin
        self.vorigin = vorigin
        self.held = 0  # units held here
        self.sent: dict[str, int] = {}  # member -> units given it, in all
        self.recv: dict[str, int] = {}  # member -> units taken from it, in all
        self.out: dict[int, list[Any]] = {}  # grant number -> [member, node, units, last sent]
        self.seen: dict[str, set[int]] = {}  # member -> grant numbers taken from it
        self.level = 0  # RATE: the bucket, milli-deliveries
        self.level_at = 0
        self.asked_at = 0
        # CONCURRENCY: the most of its units this node uses while jobs of the group wait elsewhere
        # too (its fair share, ``Limits._balance``): the units over it go there as they come free
        self.keep = KEEP_ALL


@final
class Peer:
    """What this node last heard from one incarnation of another node."""

    __slots__ = ("node", "member", "heard", "pools", "void", "silent", "said", "members")

    def __init__(self, node: str, member: str, heard: int) -> None:
        self.node = node
        self.member = member
        self.heard = heard
        # (group, kind) -> [vstamp, vorigin, held, sent, recv, longest RETRY ms, waiting, spare, used]
        self.pools: dict[tuple[bytes, int], list[Any]] = {}
        self.void: dict[str, int] = {}  # the incarnations it says were taken back
        # the silent incarnations it knows (it could take them back); None: it did not say
        self.silent: list | None = None
        self.said = 0  # how many SHARES it sent that were read here (``Limits._restore``)
        self.members: int | None = None  # the digest of the incarnations it took as current (None: not said)


@final
class Limits:
    """The groups' settings and limits on one node (see the module docstring)."""

    def __init__(self, ctx: Context) -> None:
        self.ctx = ctx
        self.table: GroupTable = ctx.groups
        self.settings: dict[bytes, Settings] = {}
        self.digest = 0
        self.pools: dict[tuple[bytes, int], Pool] = {}
        # group -> job ID -> [the job delivered here and not settled, when it is at the latest]
        # (GROUP INFO's active; ``_used``), and job ID -> its group (``acked_here``)
        self.active: dict[bytes, dict[bytes, list[Any]]] = {}
        self.by_id: dict[bytes, bytes] = {}
        self.max_retry: dict[bytes, int] = {}  # group -> the longest RETRY (ms) of a job delivered here
        # this node's life since its start (the wall clock's ms: a restart is a new one; not drawn
        # from ctx.rng, whose sequence the deadlines' random errors follow)
        self.born = ctx.wall_ms()
        self.incarnation = "%x" % self.born
        self.member = ctx.id + "/" + self.incarnation
        self.grant_seq = 0
        self.peers: dict[str, Peer] = {}  # member -> what it said
        self.latest: dict[str, str] = {}  # node -> its member heard last
        self.silent_since: dict[str, int] = {}  # member -> when it went silent (or was replaced)
        self.void: dict[str, int] = {}  # members taken back -> when (told in the gossip)
        self.fenced = False
        self.synced_at = 0  # since when this node reaches a majority (0: it does not)
        self.next_gossip = 0
        self.next_digest = 0
        self.next_tick = 0
        self.offering = False  # a peer said jobs of a group wait there whose units are here (_offer)
        self.alone_since = 0  # since when this node is a cluster of one (0: it is not, or not yet seen)
        ctx.stats["group_units_restored"] = 0  # INFO stats: units made again by ``_restore`` (RATE: per second)
        self.restore_seen: tuple[dict, dict] | None = None  # ``_restore``'s last round: when, and what it saw
        # Until it has compared its table with a peer's (a DIGEST or SET heard), a node of a cluster
        # delivers no job of any group: it may not know a limit yet (a start without the AOF, or
        # with an old one). It asks as soon as it holds jobs of a group (``tick``), so that a
        # cluster without groups never sends a GROUPS message; alone, it needs nobody.
        self.synced = False
        self.table.unsynced = True

    # ------------------------------------------------------------------ the table
    def _member_id(self) -> str:
        if not self.member.startswith(self.ctx.id + "/"):  # CLUSTER RESET HARD: a new ID
            self.member = self.ctx.id + "/" + self.incarnation
        return self.member

    def _stamp(self, prev: int) -> int:
        wall = self.ctx.wall_ms()
        return wall if wall > prev else prev + 1

    def _changed(self, s: Settings, weight: bool, limits: bool) -> None:
        """A record changed (by a command, a peer or the AOF): the weights and pools follow."""
        if weight:
            if s.weight == WEIGHT_DEFAULT:
                self.table.weights.pop(s.name, None)
            else:
                self.table.weights[s.name] = s.weight
        if limits:
            self._limits_changed(s)
        self.digest = self._digest()

    def _digest(self) -> int:
        d = 0
        for s in self.settings.values():
            d ^= zlib.crc32(repr(s.to_wire()).encode())
        return d ^ len(self.settings)

    def merge(self, s: Settings, journal: bool = True) -> bool:
        """Take in a record; True if it changed anything here."""
        mine = self.settings.get(s.name)
        if mine is None:
            if len(self.settings) >= GROUPS_MAX:
                return False
            mine = self.settings[s.name] = Settings(s.name)
        w, lim = mine.merge(s)
        if not (w or lim):
            return False
        self._changed(mine, w, lim)
        if journal and self.ctx.journal is not None:
            self.ctx.journal.append((J_GROUP, mine))
        return True

    def restore(self, s: Settings) -> None:
        """A GROUPSET record of the AOF (persistence/loader.py)."""
        self.merge(s, journal=False)

    def records(self) -> list[Settings]:
        """Every record (an AOF rewrite writes them)."""
        return list(self.settings.values())

    # ------------------------------------------------------------------ pools
    def _limits_changed(self, s: Settings) -> None:
        for kind, total in ((CONC, s.conc), (RATE, s.rate)):
            key = (s.name, kind)
            pool = self.pools.get(key)
            if pool is not None and (pool.vstamp, pool.vorigin) == (s.lstamp, s.lorigin):
                continue
            if total == 0:
                self.pools.pop(key, None)
                continue
            # the units are made once, by the GROUP LIMIT that set it (``_set``); a node that
            # hears of it, or reads it from its AOF, holds none yet
            pool = self.pools[key] = Pool(s.name, kind, total, s.lstamp, s.lorigin)
            pool.level_at = self.ctx.now
            # the others hear this node's shares at once: each delivers the group's jobs only
            # once it has heard a majority's (``FENCE_MS``), not a gossip period later
            self.next_gossip = min(self.next_gossip, self.ctx.now)
        self._update_held()

    def _update_held(self) -> None:
        """Which groups may not deliver now (``GroupTable.held``); queues of the ones let go are
        served (``ctx.ready``)."""
        ctx = self.ctx
        now = ctx.now
        held: set[bytes] = set()
        block_all = self._fenced_now()
        for pool in self.pools.values():
            if block_all:
                held.add(pool.group)
            elif pool.kind == CONC:
                if self._used(pool.group) >= (min(pool.held, pool.keep) if self.offering else pool.held):
                    held.add(pool.group)
            else:
                self._refill(pool, now)
                if pool.level < 1000:
                    held.add(pool.group)
        table = self.table
        released = table.held - held
        table.held = held
        if released:
            for grouped in table.containers:
                q = ctx.queues.get(grouped.queue)
                if q is not None and q.blocked:
                    ctx.ready[q.name] = q

    def _fenced_now(self) -> bool:
        """Whether this node may deliver no job of a limited group: it does not reach a majority,
        or it came back to one and has not heard from every node it reaches since."""
        ctx = self.ctx
        if ctx.cluster_size <= 1:
            self.fenced = False
            return False
        majority = (len(ctx.reachable) + 1) * 2 > ctx.cluster_size
        if not majority:
            self.fenced = True
            self.synced_at = 0
            return True
        if self.pools and ctx.now >= self._heard_until():
            # nothing heard from a majority since: what is heard after now came after the gap
            self.fenced = True
            self.synced_at = ctx.now
            return True
        if self.fenced:
            if not self.synced_at:
                self.synced_at = ctx.now
            for node in ctx.reachable:
                peer = self._current(node)
                if peer is None or peer.heard < self.synced_at:
                    return True
            self.fenced = False
        return False

    def _heard_until(self) -> int:
        """Until when this node counts as hearing a majority: ``FENCE_MS`` after the SHARES of the
        last peer it needs (with itself, a majority of the cluster) were heard."""
        ctx = self.ctx
        need = ctx.cluster_size // 2
        if need <= 0:
            return 1 << 62
        times = []
        for node in ctx.reachable:
            peer = self._current(node)
            if peer is not None and peer.member not in self.void:
                times.append(peer.heard)
        if len(times) < need:
            return 0
        times.sort(reverse=True)
        return times[need - 1] + FENCE_MS

    def _current(self, node: str) -> Peer | None:
        """What this node last heard from ``node``'s latest incarnation, or None."""
        member = self.latest.get(node)
        return self.peers.get(member) if member is not None else None

    def _view(self, node: str, pool: Pool) -> tuple[Peer, list] | None:
        """``node``'s latest incarnation and its word on ``pool`` (this version of the limit), or None."""
        peer = self._current(node)
        view = peer.pools.get((pool.group, pool.kind)) if peer is not None else None
        if peer is None or view is None or (view[0], view[1]) != (pool.vstamp, pool.vorigin):
            return None
        return peer, view

    def _refill(self, pool: Pool, now: int) -> None:
        if now > pool.level_at:
            pool.level = min(pool.held, pool.level + (now - pool.level_at) * pool.held // 1000)
            pool.level_at = now

    def _used(self, group: bytes) -> int:
        """Deliveries of ``group`` made here and not settled, the settled ones forgotten. A
        delivery is settled when its consumer acknowledges it here (ACKJOB, FASTACK:
        ``acked_here``), when the job is back in a queue here given back (a NACK or a RELEASE,
        here or told by another holder: its count of them grew since the delivery), or when
        the RETRY since the delivery passed (its consumer is then taken for gone, as Disque does).
        An acknowledgement heard from another node does not settle it before that: it may be
        another consumer's, of an earlier delivery of the same job (a partition). Nor does a
        requeue by another holder that missed the delivery (a partition cut its WORKING): the
        job moved back here and queued again (``YOURJOBS``) is still held by its consumer."""
        active = self.active.get(group)
        if not active:
            return 0
        now = self.ctx.now
        store = self.ctx.store
        gone = [job_id for job_id, entry in active.items()
                if entry[1] <= now or (entry[0].state == QUEUED and store.get(job_id) is entry[0]
                                       and _given_back(entry[0]) > entry[2])]  # fmt: skip
        by_id = self.by_id
        for job_id in gone:
            if not _earlier(active, job_id, now):
                by_id.pop(job_id, None)
        if not active:
            del self.active[group]
            return 0
        return len(active)

    def acked_here(self, ids: list[bytes]) -> None:
        """ACKJOB or FASTACK of these IDs on this node (acks.py): the deliveries made here settled."""
        by_id = self.by_id
        changed = False
        for job_id in ids:
            group = by_id.pop(job_id, None)
            if group is not None:
                active = self.active.get(group)
                if active is not None and _earlier(active, job_id, self.ctx.now):
                    by_id[job_id] = group
                changed = changed or (group, CONC) in self.pools
        if changed:
            self._update_held()

    def delivered(self, job: Job) -> bool:
        """A job with a group was just delivered here (GETJOB: blocking.py). True if its group has
        a CONCURRENCY limit: the caller gives it a whole RETRY from now (``Requeue.lease``)."""
        group = job_group(job)
        active = self.active.get(group)
        if active is None:
            active = self.active[group] = {}
        now = self.ctx.now
        # settled by its RETRY at the latest (a RETRY 0 job, in a group without a concurrency
        # limit: by its TTL)
        # delivered here again while an earlier delivery's consumer may still hold it (the job
        # queued again by a holder that missed that delivery): that holding is kept, to count
        # until its RETRY once the latest is settled (``_earlier``)
        prev = active.get(job.id)
        earlier = max(prev[1], prev[3]) if prev is not None and prev[1] > now else 0
        active[job.id] = [job, now + job.retry * 1000 if job.retry else job.etime, _given_back(job), earlier]
        self.by_id[job.id] = group
        if job.retry * 1000 > self.max_retry.get(group, 0):
            self.max_retry[group] = job.retry * 1000
            if (group, CONC) in self.pools:
                self.next_gossip = now  # told at the next tick: the others wait that long to take its units
        if (group, CONC) in self.pools or (group, RATE) in self.pools:
            rate = self.pools.get((group, RATE))
            if rate is not None:
                self._refill(rate, now)
                rate.level -= 1000
            self._update_held()
            return (group, CONC) in self.pools
        return False

    def check_add(self, group: bytes | None, retry: int) -> Error | None:
        """ADDJOB ... GROUP g RETRY 0 where g has a CONCURRENCY limit: refused (replication.py)."""
        if group is None or retry != 0:
            return None
        s = self.settings.get(group)
        if s is not None and s.conc:
            return err("GROUP '%s' has a CONCURRENCY limit, which RETRY 0 cannot keep: a job delivered at most "
                       "once is never given back, so a node that fails would hold its share until the job's "
                       "TTL; use a RETRY" % group.decode("utf-8", "replace")[:128])  # fmt: skip
        return None

    def _waiting(self) -> dict[bytes, int]:
        out: dict[bytes, int] = {}
        for grouped in self.table.containers:
            for group, n in grouped.groups().items():
                out[group] = out.get(group, 0) + n
        return out

    # ------------------------------------------------------------------ time
    def wanted(self) -> bool:
        return bool(self.settings or self.pools or self.peers)

    def next_wakeup(self) -> int | None:
        first: int | None = None
        if not self.synced and self.ctx.reachable and self.table.containers:
            first = self.next_digest  # asking a peer for its table (a start, jobs of a group here)
        if not (self.settings or self.pools or self.peers):
            return first
        at = self.next_gossip if first is None else min(first, self.next_gossip)
        if self.settings and self.next_digest < at:
            at = self.next_digest
        if self.table.held or self.offering or any(p.out for p in self.pools.values()):
            at = min(at, self.next_tick)
        if self.pools and not self.fenced and self.ctx.cluster_size > 1:
            at = min(at, max(self.ctx.now, self._heard_until()))  # fenced then, unless heard meanwhile
        return at

    def _sync_check(self) -> None:
        """Having heard a peer's table: the groups' jobs may go (``GroupTable.unsynced`` off)."""
        if self.synced and self.table.unsynced:
            self.table.unsynced = False
            self._update_held()
            self._release_all()

    def _release_all(self) -> None:
        ctx = self.ctx
        for grouped in self.table.containers:
            q = ctx.queues.get(grouped.queue)
            if q is not None and q.blocked:
                ctx.ready[q.name] = q

    def tick(self, now: int) -> None:
        ctx = self.ctx
        if not self.synced:
            if ctx.reachable and self.table.containers and now >= self.next_digest:
                self.next_digest = now + ASK_MS * 5  # asked again until a peer answers
                ctx.send(ctx.reachable, ("GROUPS", "DIGEST", self.digest, True))
            if not (self.settings or self.pools or self.peers):
                return
        if self.pools and not self.fenced and ctx.cluster_size > 1 and now >= self._heard_until():
            self._update_held()  # a majority not heard from for FENCE_MS: fenced (``_fenced_now``)
        if self.table.held or self.pools:
            if now >= self.next_tick:
                self.next_tick = now + TICK_MS
                self._update_held()
                if self.table.held:
                    self._ask(now)
                if self.offering:
                    self._offer()
                self._resend(now)
        if self.settings and now >= self.next_digest:
            self.next_digest = now + DIGEST_MS
            if ctx.reachable:
                ctx.send(ctx.reachable, ("GROUPS", "DIGEST", self.digest))
        if now >= self.next_gossip:
            self.next_gossip = now + GOSSIP_MS
            self._note_silence(now)
            self._reclaim(now)  # first: the incarnations taken back are told at once
            self._restore(now)
            if self.pools and ctx.reachable:
                ctx.send(ctx.reachable, ("GROUPS", "SHARES", self._member_id(), self._gossip(), self._void_list(now),
                                         [m for m in self.silent_since if m in self.peers],
                                         self._members_digest(ctx.reachable)))  # fmt: skip
            if ctx.cluster_size > 1:
                self.alone_since = 0
            elif not self.alone_since:
                self.alone_since = now
            elif now - self.alone_since >= ALONE_MS:
                for pool in self.pools.values():  # alone for long: every unit is here (a restart)
                    if pool.held < pool.total:
                        pool.held = pool.total
                        pool.out.clear()
                        self._update_held()

    def _gossip(self) -> list:
        waiting = self._waiting()
        out: list = []
        for pool in self.pools.values():
            retry = self.max_retry.get(pool.group, 0)  # the longest RETRY delivered here, ever
            used = self._used(pool.group) if pool.kind == CONC else 0
            spare = pool.held - used if pool.kind == CONC else pool.held
            if waiting.get(pool.group):
                spare = 0  # its jobs wait here: it needs every unit it holds
            out.append([pool.group, pool.kind, pool.vstamp, pool.vorigin, pool.held, pool.sent, pool.recv, retry,
                        waiting.get(pool.group, 0), max(0, spare), used])  # fmt: skip
        return out

    def _void_list(self, now: int) -> list:
        for member in [m for m, at in self.void.items() if now - at > VOID_KEEP_MS]:
            del self.void[member]
        return list(self.void)

    def _note_silence(self, now: int) -> None:
        reachable = set(self.ctx.reachable)
        for member, peer in self.peers.items():
            current = self.latest.get(peer.node) == member and peer.node in reachable
            if current:
                self.silent_since.pop(member, None)
            elif member not in self.silent_since and member not in self.void:
                self.silent_since[member] = now

    def _ask(self, now: int) -> None:
        """Ask for units of the held groups whose jobs wait here."""
        waiting = self._waiting()
        ctx = self.ctx
        for pool in self.pools.values():
            need = waiting.get(pool.group, 0)
            if not need or pool.group not in self.table.held or now - pool.asked_at < ASK_MS:
                continue
            best: Peer | None = None
            best_spare = 0
            for node in ctx.reachable:
                seen = self._view(node, pool)
                if seen is None:
                    continue
                peer, view = seen
                if view[7] > best_spare:
                    best, best_spare = peer, view[7]
            if best is None:
                continue
            pool.asked_at = now
            want = need if pool.kind == CONC else pool.total
            ctx.send((best.node,), ("GROUPS", "ASK", self._member_id(), pool.group, pool.kind, pool.vstamp,
                                    pool.vorigin, want))  # fmt: skip
            best.pools[(pool.group, pool.kind)][7] = 0  # asked: not again before it says more

    def _offer(self) -> None:
        """Units idle here (no job of their group waits here) go at once to the peer that said the
        most of its jobs wait there (``Peer.pools``' waiting, from its gossip): the limit stays in
        use while jobs wait somewhere, without waiting for that peer to ask. A concurrency pool
        gives its units not in use, as many as jobs wait there; a rate pool gives all it holds."""
        if self._fenced_now():
            return
        ctx = self.ctx
        waiting = self._waiting()
        for pool in list(self.pools.values()):
            pool.keep = KEEP_ALL
            if waiting.get(pool.group):
                self._balance(pool, waiting[pool.group])
                continue
            key = (pool.group, pool.kind)
            spare = pool.held - self._used(pool.group) if pool.kind == CONC else pool.held
            while spare > 0:
                best: Peer | None = None
                for node in ctx.reachable:
                    seen = self._view(node, pool)
                    if seen is None or seen[1][6] <= 0:
                        continue
                    if best is None or seen[1][6] > best.pools[key][6]:
                        best = seen[0]
                if best is None:
                    break
                view = best.pools[key]
                give = min(spare, view[6]) if pool.kind == CONC else spare
                view[6] = max(0, view[6] - give) if pool.kind == CONC else 0  # not again before it says so
                spare -= give
                self._give(pool, best.node, best.member, give)
        self.offering = self._wants_offers()
        self._update_held()  # the shares kept (``Pool.keep``) may have changed

    def _balance(self, pool: Pool, mine: int) -> None:
        """Jobs of the group wait here (``mine``) and maybe elsewhere: this node's idle units over its
        fair share go to the nodes whose jobs wait, the furthest below its own share first (see the
        module docstring). A peer's holding is what it last said plus what this node has sent it
        since that it has not said it took (``Pool.sent`` against its ``recv``)."""
        used = self._used(pool.group) if pool.kind == CONC else 0
        idle = pool.held - used
        ctx = self.ctx
        me = self._member_id()
        # (node, its peer or None for this node, units held, demand: None where it has no bound)
        rows: list[tuple[str, Peer | None, int, int | None]] = [
            (ctx.id, None, pool.held, used + mine if pool.kind == CONC else None)]
        for node in ctx.reachable:
            seen = self._view(node, pool)
            if seen is None or seen[1][6] <= 0:
                continue
            peer, view = seen
            held = view[2] + max(0, pool.sent.get(peer.member, 0) - view[4].get(me, 0))
            rows.append((node, peer, held, view[8] + view[6] if pool.kind == CONC else None))
        if len(rows) < 2:
            return
        share = fair_shares(pool.total, [(r[0], r[3]) for r in rows])
        if pool.kind == CONC and any(share[r[0]] > r[2] for r in rows[1:]):
            pool.keep = share[ctx.id]  # another node is short: no more of the units over the share used here
        over = min(idle, pool.held - share[ctx.id])
        for node, peer, held, _ in sorted(rows[1:], key=lambda r: r[2] - share[r[0]]):
            if over <= 0 or peer is None:
                break
            give = min(over, share[node] - held)
            if give <= 0:
                break
            self._give(pool, node, peer.member, give)
            over -= give

    def _wants_offers(self) -> bool:
        """Whether a peer said jobs wait there of a group whose units (of a limit) are here."""
        for peer in self.peers.values():
            for key, view in peer.pools.items():
                if view[6] > 0:
                    pool = self.pools.get(key)
                    if pool is not None and pool.held > 0:
                        return True
        return False

    def _resend(self, now: int) -> None:
        reachable = set(self.ctx.reachable)
        for pool in self.pools.values():
            for seq, entry in pool.out.items():
                member, node, units, sent_at = entry
                if now - sent_at >= RESEND_MS and node in reachable:
                    entry[3] = now
                    self._send_grant(pool, node, member, seq, units)

    def _send_grant(self, pool: Pool, node: str, member: str, seq: int, units: int) -> None:
        # ``member``: the incarnation it is for; another one of that node refuses it (``_on_grant``)
        self.ctx.send((node,), ("GROUPS", "GRANT", self._member_id(), pool.group, pool.kind, pool.vstamp,
                                pool.vorigin, seq, units, member))  # fmt: skip

    def _give(self, pool: Pool, node: str, member: str, units: int) -> None:
        if units <= 0:
            return
        pool.held -= units
        if pool.kind == RATE:
            pool.level = min(pool.level, pool.held)
        pool.sent[member] = pool.sent.get(member, 0) + units
        self.grant_seq += 1
        pool.out[self.grant_seq] = [member, node, units, self.ctx.now]
        self._send_grant(pool, node, member, self.grant_seq, units)
        self._update_held()

    # ------------------------------------------------------------------ taking units back
    def _reclaim(self, now: int) -> None:
        """Take back the units of incarnations silent past their RETRY windows (module docstring)."""
        ctx = self.ctx
        if not self.silent_since or ctx.cluster_size <= 1 or self._fenced_now():
            return
        due: list[str] = []
        for member, since in self.silent_since.items():
            peer = self.peers.get(member)
            if peer is None or member in self.void:
                continue
            # its deliveries' RETRY as it said, or as long as any this node delivered of the group
            retry = max([v[5] for v in peer.pools.values()] + [self.max_retry.get(k[0], 0) for k in peer.pools] + [0])
            if now - since > retry + RECLAIM_MARGIN_MS:
                due.append(member)
        if not due:
            return
        due_nodes = {self.peers[m].node for m in due}
        # the others must all have been heard from since the first of these went silent
        first = min(self.silent_since[m] for m in due)
        others = [n for n in ctx.known_nodes if n != ctx.id]
        lower: list[Peer] = []  # live nodes of lower IDs: one of them may take some back instead
        for node in others:
            latest = self.latest.get(node)
            peer = self.peers.get(latest) if latest is not None else None
            live = peer is not None and latest not in self.silent_since
            if live and peer is not None and peer.heard <= first:
                return
            if not live and node not in due_nodes:
                return  # a node neither heard from nor due: it may hold what we would take
            if live and peer is not None and node < ctx.id:
                lower.append(peer)
        for member in due:
            # a live node of a lower ID takes it back, if it knows it (it said it has it silent,
            # or said nothing); not one that never heard of it (a node's new self does not know
            # its former self, nor a node started after it went silent)
            if any(p.silent is None or member in p.silent for p in lower if p.node != self.peers[member].node):
                continue
            self._take_back(member, now)

    def _restore(self, now: int) -> None:
        """Units lost (sent to an incarnation taken back before it said it took them, or refused
        by one) are made again, by one node, only when what every node holds is known exactly:
        every node reachable and current, every node taking the same incarnations as current (a
        digest in SHARES: one that has not heard of a restart yet does not know the former self
        silent), none silent for anyone, no ledger naming an incarnation
        neither current nor taken back (a node's former self), and two gossip rounds in a row
        in which every node's holding and ledgers (``sent``, ``recv``: they only grow) are the
        same, each heard again between the two, and every grant taken (each ``sent`` met by the
        ``recv`` of its receiver). Then nothing moved between the rounds and nothing was in
        flight: the units held add up to what exists, and the lowest ID makes the rest."""
        ctx = self.ctx
        if not self.pools or ctx.cluster_size <= 1 or len(ctx.reachable) + 1 != ctx.cluster_size:
            self.restore_seen = None
            return
        if self.silent_since or self._fenced_now() or any(n < ctx.id for n in ctx.reachable):
            self.restore_seen = None
            return
        me = self._member_id()
        peers: list[Peer] = []
        for node in ctx.reachable:
            peer = self._current(node)
            if peer is None or peer.member in self.void or peer.silent != []:
                self.restore_seen = None
                return
            if peer.members is None or peer.members != self._members_digest(ctx.reachable):
                self.restore_seen = None  # it has not heard of the same incarnations (a restart it missed)
                return
            peers.append(peer)
        state: dict = {}
        short: dict = {}
        for key, pool in self.pools.items():
            rows = [(me, pool.held, pool.sent, pool.recv)]
            for peer in peers:
                view = peer.pools.get(key)
                if view is None or (view[0], view[1]) != (pool.vstamp, pool.vorigin):
                    self.restore_seen = None
                    return
                rows.append((peer.member, view[2], view[3], view[4]))
            recv_of = {m: r for m, _, _, r in rows}
            for m, _, sent, recv in rows:
                for to, units in sent.items():
                    if to in recv_of and recv_of[to].get(m, 0) != units:
                        self.restore_seen = None  # a grant in flight between two of them
                        return
                    if to not in recv_of and to not in self.void:
                        self.restore_seen = None  # units given to an incarnation not taken back yet
                        return
                if any(frm not in recv_of and frm not in self.void for frm in recv):
                    self.restore_seen = None
                    return
            state[key] = [(m, held, sorted(sent.items()), sorted(recv.items())) for m, held, sent, recv in rows]
            held = sum(r[1] for r in rows)
            if held < pool.total:
                short[key] = pool.total - held
        prev = self.restore_seen
        said = {p.member: p.said for p in peers}
        self.restore_seen = (said, state)
        if not short or prev is None or prev[1] != state or any(n <= prev[0].get(m, n) for m, n in said.items()):
            return  # first round, a change, or a node not heard again since: nothing known yet
        for key, units in short.items():
            pool = self.pools[key]
            pool.held += units
            ctx.stats["group_units_restored"] += units if pool.kind == CONC else (units + 999) // 1000
        self.restore_seen = None
        self._update_held()

    def _members_digest(self, nodes: Any) -> int:
        """A digest of the incarnations this node takes as the current ones of itself and ``nodes``."""
        members = sorted([self._member_id()] + [self.latest.get(n, n) for n in nodes])
        return zlib.crc32("\n".join(members).encode())

    def _take_back(self, member: str, now: int) -> None:
        gone = self.peers[member]
        for key, view in gone.pools.items():
            pool = self.pools.get(key)
            if pool is None or (view[0], view[1]) != (pool.vstamp, pool.vorigin):
                continue
            units = view[2]
            sent_then: dict = view[3]
            recv_then: dict = view[4]
            # others' grants to it since, minus its grants to others since; each at least 0: an
            # other's ledger older than the gone one's word (it had not yet said it took a grant
            # the gone one had sent by then) says nothing of what came after it: those units left
            # the gone one's count before it last spoke, and are the other's (held, or taken
            # back with it through the gone one's ``sent``)
            for other_member, other in self._ledgers(key, pool):
                if other_member == member:
                    continue
                o_sent, o_recv = other
                units += max(0, o_sent.get(member, 0) - recv_then.get(other_member, 0))
                units -= max(0, o_recv.get(member, 0) - sent_then.get(other_member, 0))
            if units > 0:
                pool.held += units  # (not in ``recv``: that ledger counts grants, which others' match)
        self._voided(member, now)
        self._update_held()

    def _voided(self, member: str, now: int) -> None:
        """``member`` was taken back (here or by a peer): its grants are refused from now on, and
        the ones given it and not acknowledged are not sent again (the taker counted them as its)."""
        self.void[member] = now
        self.silent_since.pop(member, None)
        for pool in self.pools.values():
            for seq in [s for s, e in pool.out.items() if e[0] == member]:
                del pool.out[seq]

    def _ledgers(self, key: tuple[bytes, int], pool: Pool) -> list[tuple[str, tuple[dict, dict]]]:
        out: list[tuple[str, tuple[dict, dict]]] = [(self._member_id(), (pool.sent, pool.recv))]
        for member, peer in self.peers.items():
            view = peer.pools.get(key)
            if view is not None and (view[0], view[1]) == (pool.vstamp, pool.vorigin):
                out.append((member, (view[3], view[4])))
        return out

    # ------------------------------------------------------------------ the bus
    def on_groups(self, sender: str, body: list) -> Any:
        """A GROUPS message (kind in ``body[0]``); False if malformed (counted by the node)."""
        if not body or type(body[0]) is not str:
            return False
        op = body[0]
        if op == "SET":
            return self._on_set(sender, body)
        if op == "DIGEST":
            if len(body) < 2 or type(body[1]) is not int:
                return False
            if body[1] != self.digest:
                self.ctx.send((sender,), ("GROUPS", "SET", [s.to_wire() for s in self.settings.values()], True))
            else:
                if len(body) > 2 and body[2] is True:  # a node that starts asks: the same table here
                    self.ctx.send((sender,), ("GROUPS", "DIGEST", self.digest, False))
                self._synced()
            return None
        if op == "SHARES":
            return self._on_shares(sender, body)
        if op == "ASK":
            return self._on_ask(sender, body)
        if op == "GRANT":
            return self._on_grant(sender, body)
        if op == "GRANTED":
            return self._on_granted(sender, body)
        return None  # a later version's: ignored

    def _on_set(self, sender: str, body: list) -> Any:
        if len(body) < 2 or type(body[1]) is not list or len(body[1]) > GROUPS_MAX:
            return False
        records = []
        for v in body[1]:
            s = settings_from_wire(v)
            if s is None:
                return False
            records.append(s)
        for s in records:
            self.merge(s)
        self._synced()
        if len(body) > 2 and body[2] is True:  # answer with ours
            self.ctx.send((sender,), ("GROUPS", "SET", [s.to_wire() for s in self.settings.values()], False))
        return None

    def _synced(self) -> None:
        if not self.synced:
            self.synced = True
            self._sync_check()

    def _peer(self, sender: str, member: Any) -> Peer | None:
        if type(member) is not str or not member.startswith(sender + "/") or len(member) > 128:
            return None
        peer = self.peers.get(member)
        if peer is None:
            peer = self.peers[member] = Peer(sender, member, self.ctx.now)
            old = self.latest.get(sender)
            if old is not None and old != member and old not in self.void:
                self.silent_since.setdefault(old, self.ctx.now)  # restarted: its former self is gone
        self.latest[sender] = member
        peer.heard = self.ctx.now
        self.silent_since.pop(member, None)
        return peer

    def _on_shares(self, sender: str, body: list) -> Any:
        if len(body) < 4 or type(body[2]) is not list or type(body[3]) is not list:
            return False
        views: list = body[2]
        for v in views:
            if type(v) is not list or len(v) < 10 or type(v[0]) is not bytes or type(v[1]) is not int:
                return False
            if type(v[2]) is not int or type(v[3]) is not str or type(v[5]) is not dict or type(v[6]) is not dict:
                return False
            if not all(type(x) is int for x in (v[4], v[7], v[8], v[9])):
                return False
            if not (_ledger(v[5]) and _ledger(v[6])):
                return False
        if self._void_member(body[1]):
            return None
        peer = self._peer(sender, body[1])
        if peer is None:
            return False
        # the 11th field (its deliveries not settled) is trailing: a peer without it is read as using all it holds
        peer.said += 1
        peer.pools = {(v[0], v[1]): [v[2], v[3], v[4], v[5], v[6], v[7], v[8], v[9],
                                     v[10] if len(v) > 10 and type(v[10]) is int else v[4]] for v in views}
        self.offering = self._wants_offers()
        me = self._member_id()
        for member in body[3]:
            if type(member) is str and member not in self.void:
                if member == me:
                    self._restart_incarnation()
                else:
                    self._voided(member, self.ctx.now)
        peer.silent = body[4] if len(body) > 4 and type(body[4]) is list and len(body[4]) <= 4096 else None
        peer.members = body[5] if len(body) > 5 and type(body[5]) is int else None
        return None

    def _void_member(self, member: Any) -> bool:
        return type(member) is str and member in self.void

    def _restart_incarnation(self) -> None:
        """This incarnation's units were taken back: drop them, start again as a new one."""
        self.born = max(self.born + 1, self.ctx.wall_ms())
        self.incarnation = "%x" % self.born
        self.member = self.ctx.id + "/" + self.incarnation
        for pool in self.pools.values():
            pool.held = 0
            pool.level = 0
            pool.out.clear()
            pool.sent.clear()
            pool.recv.clear()
            pool.seen.clear()
        self._update_held()

    def _pool_of(self, body: list, at: int) -> Pool | None:
        group, kind, vstamp, vorigin = body[at], body[at + 1], body[at + 2], body[at + 3]
        if type(group) is not bytes or type(kind) is not int or type(vstamp) is not int or type(vorigin) is not str:
            return None
        pool = self.pools.get((group, kind))
        if pool is None or (pool.vstamp, pool.vorigin) != (vstamp, vorigin):
            return None
        return pool

    def _on_ask(self, sender: str, body: list) -> Any:
        if len(body) < 7 or type(body[6]) is not int or type(body[1]) is not str:
            return False
        if self._void_member(body[1]) or self._fenced_now():
            return None
        pool = self._pool_of(body, 2)
        if pool is None:
            return None
        want = body[6]
        waiting = self._waiting().get(pool.group, 0)
        if waiting:
            spare = 0
        else:
            spare = pool.held - self._used(pool.group) if pool.kind == CONC else pool.held
        give = min(want, spare)
        if give > 0:
            self._give(pool, sender, body[1], give)
        return None

    def _on_grant(self, sender: str, body: list) -> Any:
        if len(body) < 8 or type(body[1]) is not str or type(body[6]) is not int or type(body[7]) is not int:
            return False
        member, seq, units = body[1], body[6], body[7]
        if units <= 0 or units > CONCURRENCY_MAX * 1000 * 1000:
            return False
        if self._void_member(member):
            return None  # its units were taken back: its grants are void
        since = self.silent_since.get(member)
        if since is not None and self.ctx.now - since >= RECLAIM_MARGIN_MS:
            # silent here long enough that a node may be taking its units back, and we may not
            # have heard so yet (a partition that heals): not before it is heard from again (its
            # gossip), when it is either current or known void; it sends the grant again
            return None
        if len(body) > 8 and body[8] != self._member_id():
            # meant for this node's former self (sent again after a restart, or to an incarnation
            # taken back): its giver counted it as that one's, which is taken back with it
            return None
        pool = self._pool_of(body, 2)
        if pool is None:
            s = self.settings.get(body[2]) if type(body[2]) is bytes else None
            stale = s is not None and type(body[4]) is int and type(body[5]) is str
            if stale and s is not None and (s.lstamp, s.lorigin) > (body[4], body[5]):
                self.ctx.send((sender,), ("GROUPS", "GRANTED", body[2], body[3], seq, self._member_id()))  # void anyway
            return None  # a limit not known here yet: sent again later
        seen = pool.seen.get(member)
        if seen is None:
            seen = pool.seen[member] = set()
        if seq not in seen:
            seen.add(seq)
            pool.held += units
            pool.recv[member] = pool.recv.get(member, 0) + units
            self._update_held()
        self.ctx.send((sender,), ("GROUPS", "GRANTED", pool.group, pool.kind, seq, self._member_id()))
        return None

    def _on_granted(self, sender: str, body: list) -> Any:
        if len(body) < 4 or type(body[1]) is not bytes or type(body[2]) is not int or type(body[3]) is not int:
            return False
        pool = self.pools.get((body[1], body[2]))
        if pool is not None:
            entry = pool.out.get(body[3])
            if entry is not None and entry[1] == sender and (len(body) < 5 or body[4] == entry[0]):
                del pool.out[body[3]]
        return None

    # ------------------------------------------------------------------ the command
    def cmd_group(self, client: int, argv: list[bytes]) -> object:
        sub = argv[1].lower()
        if sub == b"info" and len(argv) == 3:
            return self._info(argv[2])
        if sub == b"list":
            count = 100
            if len(argv) == 4 and argv[2].lower() == b"count":
                n = parse_int(argv[3])
                if n is None or n <= 0:
                    return err("COUNT must be a positive number")
                count = n
            elif len(argv) != 2:
                return err("syntax error: GROUP LIST [COUNT count]")
            return self._list(count)
        if sub == b"weight" and len(argv) == 4:
            bad = check_group_name(argv[2])
            if bad is not None:
                return bad
            w = parse_int(argv[3])
            if w is None or not 1 <= w <= WEIGHT_MAX:
                return err("WEIGHT must be a number from 1 to %d (deliveries per turn)" % WEIGHT_MAX)
            return self._set(argv[2], w, None)
        if sub == b"limit" and len(argv) >= 4:
            bad = check_group_name(argv[2])
            if bad is not None:
                return bad
            what = argv[3].lower()
            if what == b"none" and len(argv) == 4:
                return self._set(argv[2], None, (0, 0))
            if what == b"concurrency" and len(argv) == 5:
                n = parse_int(argv[4])
                if n is None or not 1 <= n <= CONCURRENCY_MAX:
                    return err("CONCURRENCY must be a number from 1 to %d (jobs delivered and not acknowledged)"
                               % CONCURRENCY_MAX)  # fmt: skip
                s = self.settings.get(argv[2])
                return self._set(argv[2], None, (n, s.rate if s is not None else 0))
            if what == b"rate" and len(argv) == 5:
                r = _parse_rate(argv[4])
                if r is None or not 1000 <= r <= RATE_MAX * 1000:
                    return err("RATE must be a number of deliveries a second from 1 to %d (at most 3 decimals)"
                               % RATE_MAX)  # fmt: skip
                s = self.settings.get(argv[2])
                return self._set(argv[2], None, (s.conc if s is not None else 0, r))
            return err("syntax error: GROUP LIMIT group CONCURRENCY count | RATE per-second | NONE")
        if sub in (b"info", b"weight", b"limit"):
            return err("wrong number of arguments for 'group|%s' command" % sub.decode())
        return err("unknown subcommand '%s'. Try GROUP INFO, LIST, WEIGHT or LIMIT"
                   % argv[1].decode("utf-8", "replace")[:64])  # fmt: skip

    def _set(self, name: bytes, weight: int | None, limits: tuple[int, int] | None) -> object:
        ctx = self.ctx
        mine = self.settings.get(name)
        if mine is None and len(self.settings) >= GROUPS_MAX:
            return err("too many groups with settings (%d): set some back to the defaults first" % GROUPS_MAX)
        s = Settings(name)
        if mine is not None:
            s.merge(mine)
        if weight is not None:
            s.weight, s.wstamp, s.worigin = weight, self._stamp(s.wstamp), ctx.id
        if limits is not None:
            s.conc, s.rate = limits
            s.lstamp, s.lorigin = self._stamp(s.lstamp), ctx.id
        self.merge(s)
        if limits is not None:
            for kind in (CONC, RATE):
                pool = self.pools.get((name, kind))
                if pool is not None and (pool.vstamp, pool.vorigin) == (s.lstamp, s.lorigin):
                    pool.held = pool.level = pool.total  # made here: every unit of the new limit
            self._update_held()
        if ctx.reachable:
            ctx.send(ctx.reachable, ("GROUPS", "SET", [self.settings[name].to_wire()], False))
        return b"OK"

    def _counts(self, group: bytes, waiting: dict[bytes, int]) -> list[object]:
        s = self.settings.get(group)
        conc = self.pools.get((group, CONC))
        rate = self.pools.get((group, RATE))
        if rate is not None:
            self._refill(rate, self.ctx.now)
        return [
            b"name", group,
            b"weight", s.weight if s is not None else WEIGHT_DEFAULT,
            b"concurrency", s.conc if s is not None and s.conc else None,
            b"rate", format_rate(s.rate) if s is not None and s.rate else None,
            b"active", self._used(group),
            b"waiting", waiting.get(group, 0),
            b"share-concurrency", conc.held if conc is not None else None,
            b"share-rate", format_rate(rate.held) if rate is not None else None,
            b"held", group in self.table.held,
        ]  # fmt: skip

    def summary(self, count: int) -> tuple[list[tuple[bytes, int, int, int, int, bool]], int, int, int]:
        """The ``count`` busiest groups as (name, active, waiting, CONCURRENCY, RATE in milli,
        held), then the others' active and waiting summed and how many they are (/metrics, the
        admin page: a bounded number of labels)."""
        waiting = self._waiting()
        names = set(self.settings) | set(waiting) | {g for g in list(self.active) if self._used(g)}
        ranked = sorted(names, key=lambda g: (-(waiting.get(g, 0) + len(self.active.get(g, ()))), g))
        rows: list[tuple[bytes, int, int, int, int, bool]] = []
        for g in ranked[:count]:
            s = self.settings.get(g)
            rows.append((g, len(self.active.get(g, ())), waiting.get(g, 0), s.conc if s is not None else 0,
                         s.rate if s is not None else 0, g in self.table.held))  # fmt: skip
        rest = ranked[count:]
        return (rows, sum(len(self.active.get(g, ())) for g in rest), sum(waiting.get(g, 0) for g in rest),
                len(rest))  # fmt: skip

    def _info(self, group: bytes) -> object:
        bad = check_group_name(group)
        if bad is not None:
            return bad
        return self._counts(group, self._waiting())

    def _list(self, count: int) -> object:
        waiting = self._waiting()
        names = set(self.settings) | set(waiting) | {g for g in self.active if self._used(g)}
        ranked = sorted(names, key=lambda g: (-(waiting.get(g, 0) + len(self.active.get(g, ()))), g))
        return [self._counts(g, waiting) for g in ranked[:count]]

