"""The Job record, its states, the legal moves between them, and its deadlines.

A job moves through four states on a node::

    wait-repl --(replicated enough / ASYNC)--> active <--(fetched)-- queued
                                                 |  --(enqueue)-->   |
                                                 +------ ACKJOB -----+--> acked

``wait-repl`` exists only on the node that created the job while its
synchronous replication is in progress. ``acked`` jobs are kept until the
acknowledgement has been garbage-collected cluster-wide. ``TRANSITIONS`` is
the whole list of moves, each with its reason; ``Job.set_state`` is the one
way a state changes (a job is created in its first state).

Times inside a Job are milliseconds on the node's monotonic clock (the one
the shell feeds into the core), except ``ctime``, which is wall-clock
milliseconds * 1_000_000 plus a per-node tie breaker, as in Disque, and is
used to order queues and to report creation time.

``next_at``: one slot, whose meaning the state decides
-----------------------------------------------------
A job has at most one pending deadline besides its expiry, so one slot holds
it (a slot is 8 bytes per job: a million jobs, 8 MB):

* ``wait-repl``: when it is first queued once its copies are made, the end
  of ADDJOB's DELAY (without one it is queued at once; until then it reads a
  RETRY from ADDJOB, which SHOW reports as Disque does);
* ``active``: when it is queued again (the end of its RETRY period, or of a
  DELAY); 0: never again (AT_MOST_ONCE, a RETRY 0 job queued once here);
* ``queued``: when its RETRY period ends while it waits (a new one starts);
  0 for a RETRY 0 job, never queued again;
* ``acked``: its next garbage-collection attempt (ACK_GC_PENDING: never 0
  once ``Acks.acknowledge`` ran). An acked job is never queued (ACK_ONCE).

``requeue_at`` and ``gc_at`` read it under the state's name (0 in the other
states). Writers set ``next_at`` from ``retry_deadline`` (the end of a RETRY
period: ``enqueue_job``, the requeue timers, WORKING, QUEUED/WORKING from a
peer, a received copy, a restart) or ``gc_deadline`` (the next GC attempt);
the hot paths read ``next_at`` itself.

Both deadlines carry a random error of +-``TIME_ERROR_MS``/2, as Disque's do,
so that the holders of one job do not requeue it (or ask for its acks) at
the same instant.
"""

from __future__ import annotations

from typing import Callable, Final, final

__all__ = [
    "Job",
    "WAIT_REPL",
    "ACTIVE",
    "QUEUED",
    "ACKED",
    "STATE_NAMES",
    "STATE_BY_NAME",
    "state_from_name",
    "F_BCAST_QUEUED",
    "F_BCAST_WILLQUEUE",
    "F_DELIVERED",
    "F_NACK_DELAYED",
    "F_YIELD",
    "F_PRIORITY",
    "FLAGS_MAX",
    "PRIORITY_MIN",
    "PRIORITY_MAX",
    "PRIORITY_DEFAULT",
    "priority_flags",
    "job_priority",
    "F_GROUP",
    "F_ORDERED",
    "GROUP_NAME_MAX",
    "job_group",
    "Extra",
    "TRANSITIONS",
    "IllegalTransition",
    "watch_transitions",
    "illegal_transitions",
    "TIME_ERROR_MS",
    "GC_RETRY_MIN_MS",
    "GC_RETRY_MAX_MS",
    "retry_deadline",
    "gc_deadline",
    "DEAD_SUFFIX",
    "extra_fields",
    "RETURNED_NODES_MAX",
    "TRACE_MAX",
]

WAIT_REPL: Final = 0
ACTIVE: Final = 1
QUEUED: Final = 2
ACKED: Final = 3
STATE_NAMES: Final = ("wait-repl", "active", "queued", "acked")
#: a state's name as bytes -> the state (JSCAN's STATE, the AOF's records)
STATE_BY_NAME: Final = {name.encode(): i for i, name in enumerate(STATE_NAMES)}

# Flags (bit set).
F_BCAST_QUEUED: Final = 1  # the next (re)queue is announced with QUEUED
F_BCAST_WILLQUEUE: Final = 2  # announce WILLQUEUE shortly before requeueing
F_DELIVERED: Final = 4  # this node handed the job to a client at least once
# Active and waiting for the end of a NACK's delay (NACK DELAY, or a BACKOFF): the requeue
# that ends it is not a failed delivery (nothing counted, no dead letter; delivery.py).
F_NACK_DELAYED: Final = 8
# A DEDUP job made here and on another node at once, whose other maker keeps it queued: when its
# copies are made it is not queued here (dedup.py).
F_YIELD: Final = 16

# ADDJOB's PRIORITY (ours; Disque has none): 0 to 9, higher delivered first (queues.py). A job
# without one is at PRIORITY_DEFAULT, in the middle so that there is room below and above, and a
# queue of such jobs is exactly Disque's (FIFO by ctime). The priority is kept in the flag bits
# F_PRIORITY, as 0 for the default (so a job without one costs nothing, not even a slot) and as
# priority + 1 otherwise: it travels with the flags into the AOF's LOADJOB, and on the bus as
# the wire array's optional field (wire.py). It never changes after the job is made.
PRIORITY_MIN: Final = 0
PRIORITY_MAX: Final = 9
PRIORITY_DEFAULT: Final = 5
_PRIORITY_SHIFT: Final = 8
F_PRIORITY: Final = 0xF00  # the bits (a mask, not a flag)
# ADDJOB's GROUP (ours): the job's group name, kept in its Extra (``Extra.group``: it travels
# and persists with the Extra's map, key "g"), and told by this flag, set wherever an Extra with
# a group is given to a job (ADDJOB, the wire, the AOF's JOBEXTRA), so that a queue tests one
# flag word for both a priority and a group (F_ORDERED) and a plain job pays nothing more.
F_GROUP: Final = 0x1000
#: A job a queue does not simply keep FIFO by ctime: one with a priority or a group (queues.py).
F_ORDERED: Final = F_PRIORITY | F_GROUP
#: The longest group name (bytes); a name is never empty.
GROUP_NAME_MAX: Final = 128
#: The largest flags word a job can have (the AOF's loader refuses a larger one).
FLAGS_MAX: Final = F_GROUP | (PRIORITY_MAX + 1) << _PRIORITY_SHIFT | 0xFF


def priority_flags(priority: int) -> int:
    """The flag bits of a job at ``priority`` (PRIORITY_MIN..PRIORITY_MAX): 0 for the default."""
    return 0 if priority == PRIORITY_DEFAULT else (priority + 1) << _PRIORITY_SHIFT


def job_priority(job: "Job") -> int:
    """A job's priority (PRIORITY_DEFAULT without one)."""
    bits = job.flags & F_PRIORITY
    return PRIORITY_DEFAULT if not bits else (bits >> _PRIORITY_SHIFT) - 1


def job_group(job: "Job") -> bytes:
    """A job's group: ADDJOB's GROUP, or b"" (the default group) without one."""
    e = job.extra
    if e is None or e.group is None:
        return b""
    return e.group


# Every move of a job's state on one node, and why it happens. A move not here is a bug:
# tests and simulations raise on it (``watch_transitions``); ``acked`` is never left (ACK_ONCE).
TRANSITIONS: Final[dict[int, dict[int, str]]] = {
    WAIT_REPL: {
        QUEUED: "ADDJOB without synchronous replication nor DELAY: queued at once",
        ACTIVE: "its copies are made (GOTJOB, SETACK), ADDJOB ASYNC with a DELAY, or pushed at "
        "once to a node whose consumer waits; or its replication failed or its client left, "
        "and it is deleted next",
    },
    ACTIVE: {
        QUEUED: "enqueue_job: its DELAY or RETRY ended, ENQUEUE or NACK, moved in (YOURJOBS), "
        "or queued again at a restart (aof-enqueue-jobs-once)",
        ACKED: "acknowledged: ACKJOB, SETACK, or restored acked (AOF)",
    },
    QUEUED: {
        ACTIVE: "taken out of its queue: fetched by GETJOB, DEQUEUE, QUEUED or WORKING from a "
        "peer, acked (dequeued first), or restored (AOF: delivered, or requeued by RETRY "
        "after the restart)",
        ACKED: "restored (AOF): written queued, then acked (a live ack dequeues first)",
    },
    ACKED: {},
}


class IllegalTransition(Exception):
    """A job's state was set to one ``TRANSITIONS`` does not allow from where it was.

    (An Exception, not a RuntimeError: mypyc compiles subclasses of a few builtin
    exceptions only, and nothing catches it by its base.)"""


# What ``watch_transitions`` recorded and ``invariants.check`` has not reported yet.
illegal_transitions: list[str] = []


def state_from_name(name: bytes) -> int | None:
    return STATE_BY_NAME.get(name.lower())


TIME_ERROR_MS: Final = 500  # deadlines are desynchronised by +-250 ms
_HALF_ERROR_MS: Final = TIME_ERROR_MS // 2
GC_RETRY_MIN_MS: Final = 1000  # the GC of an ack backs off from 1 s ...
GC_RETRY_MAX_MS: Final = 180_000  # ... doubling up to 3 min


def retry_deadline(job: "Job", start: int, randbits: Callable[[int], int]) -> int:
    """The end of a RETRY period of ``job`` that starts at ``start`` (ms), give or take
    TIME_ERROR_MS/2 (``randbits``: the node's seeded source, ``Context.randbits``; the error
    is drawn as Disque draws it, a random integer modulo TIME_ERROR_MS).

    The one place it is computed: ``enqueue_job`` (a period starts with every queueing), the
    requeue timers (a period ran out while queued, or while the queue was paused), WORKING
    and the QUEUED/WORKING messages (postponed by a period), a copy received (its first
    period starts after its DELAY) and a restart. Only for a job with a RETRY: one with
    RETRY 0 has no period (``next_at`` 0 once queued)."""
    return start + job.retry * 1000 + randbits(32) % TIME_ERROR_MS - _HALF_ERROR_MS


def gc_deadline(job: "Job", now: int, randbits: Callable[[int], int]) -> int:
    """The next garbage-collection attempt of an acked ``job``: 1 s after ``now`` before its
    first attempt, doubling with each attempt made (``gc_retry``) up to 3 min, give or take
    TIME_ERROR_MS/2. Used by the ack machine after an ack and after each attempt, and for
    an acked job restored from the AOF (its GC starts again)."""
    backoff = GC_RETRY_MIN_MS << job.gc_retry
    if backoff > GC_RETRY_MAX_MS:
        backoff = GC_RETRY_MAX_MS
    return now + backoff + randbits(32) % TIME_ERROR_MS - _HALF_ERROR_MS


@final
class Job:
    """One job as this node knows it. Slots keep it small (memory/job matters)."""

    __slots__ = (
        "id",  # bytes, 40 chars
        "queue",  # bytes, or None for a dummy ack
        "state",
        "flags",
        "repl",  # replication factor asked for
        "ctime",  # wall ms * 1e6 (+ tie breaker)
        "etime",  # expire time, monotonic ms
        "delay",  # seconds
        "retry",  # seconds; 0 = at most once
        "nacks",
        "deliveries",  # additional deliveries
        "body",  # bytes, or None for a dummy ack
        "delivered",  # tuple/set of node IDs that may have a copy
        "confirmed",  # set of node IDs, or None (replication / GC tracking)
        # monotonic ms: the next requeue, or the next GC attempt of an acked job (the state
        # decides; see the module docstring); 0 = none
        "next_at",
        "awake",  # when the scheduler must look at the job; 0 = not scheduled
        "gc_retry",  # GC attempts, drives exponential backoff
        "seq",  # registration order, used by JSCAN cursors and to order the timer heap's ties
        "hpos",  # its index in the job table's timer heap (store.py); -1: not in it
        "extra",  # None, or an Extra: the delivery policy and dead-letter facts (rarely set)
    )

    def __init__(
        self,
        job_id: bytes,
        state: int,
        queue: bytes | None = None,
        body: bytes | None = None,
        repl: int = 1,
        ctime: int = 0,
        etime: int = 0,
        delay: int = 0,
        retry: int = 0,
        next_at: int = 0,
        delivered: tuple = (),
    ) -> None:
        # One constructor call sets everything ADDJOB knows (hot path).
        self.id = job_id
        self.state = state
        self.queue = queue
        self.body = body
        self.repl = repl
        self.ctime = ctime
        self.etime = etime
        self.delay = delay
        self.retry = retry
        self.next_at = next_at
        self.delivered = delivered
        self.flags = 0
        self.nacks = 0
        self.deliveries = 0
        self.confirmed: set[str] | None = None
        self.awake = 0
        self.gc_retry = 0
        self.seq = 0
        self.hpos = -1
        self.extra: Extra | None = None

    def set_state(self, to: int) -> None:
        """Move the job to state ``to``: the one way a job's state changes (``TRANSITIONS``).

        A node checks nothing here: the moves are checked where a wrong one can be caught,
        in tests and simulations, which turn the check on (``watch_transitions``). The check
        would cost every job several dict lookups on the hot path (``enqueue_job``,
        ``fetch``, ``acknowledge``), on every node; the switch costs one attribute read. (A
        switch rather than a swapped method: a compiled Job's methods cannot be replaced.)"""
        if _WATCH.on:
            _check_transition(self, to)
        self.state = to

    @property
    def requeue_at(self) -> int:
        """The next requeue of a job not acked (0: none, or never again); 0 for an acked one."""
        return self.next_at if self.state != ACKED else 0

    @property
    def gc_at(self) -> int:
        """The next GC attempt of an acked job; 0 for one not acked."""
        return self.next_at if self.state == ACKED else 0

    @property
    def state_name(self) -> str:
        return STATE_NAMES[self.state]

    @property
    def is_dummy_ack(self) -> bool:
        """An acked placeholder for an ID this node never had a copy of."""
        return not self.delivered

    def __repr__(self) -> str:
        return f"<Job {self.id.decode()} {self.state_name} q={self.queue!r}>"


@final
class Extra:
    """What a job carries beyond Disque's fields, in one optional slot (``Job.extra``), so
    that a job without any of it costs one ``None``. Made by ADDJOB's BACKOFF, MAXDELIVER,
    DEADLETTER and DEDUP, by a NACK with a REASON, and for a dead letter (``origin``); carried
    by the wire codec (``wire.py``) and the AOF (a JOBEXTRA record). ``delivery.py`` owns what
    the delivery fields mean, ``dedup.py`` the key.

    Times are milliseconds. ``count``: the deliveries of the job this node knows of (its
    own GETJOBs and the DELIVERED messages of the other holders); a lower bound of the
    true count, so MAXDELIVER never dead-letters a job early. ``returned``: the deliveries
    given back unstarted (RELEASE), by the node that took each RELEASE (node ID -> how
    many; None: none), merged by the larger count per node; ``returns`` is their sum, and
    what counts against MAXDELIVER is ``count - returns`` (``delivery.py``, ``delivered``).
    ``origin`` (a dead letter only): (original ID, original queue, deliveries, reason or
    None, the original's delivery options as ADDJOB arguments). ``dedup``: ADDJOB's DEDUP
    key (``dedup.py``). ``trace``: the last failure's traceback (NACK's TRACE, its tail at
    most ``TRACE_MAX`` bytes), or None. ``group``: ADDJOB's GROUP (``queues.py``), or None."""

    __slots__ = ("backoff_min", "backoff_max", "maxdeliver", "deadletter", "count", "reason", "origin", "dedup",
                 "returns", "returned", "trace", "group")  # fmt: skip

    def __init__(self, backoff_min: int = 0, backoff_max: int = 0, maxdeliver: int = 0,
                 deadletter: bytes | None = None, dedup: bytes | None = None) -> None:  # fmt: skip
        self.backoff_min = backoff_min  # ms; backoff_max 0: no BACKOFF
        self.backoff_max = backoff_max
        self.maxdeliver = maxdeliver  # 0: no limit
        self.deadletter = deadletter  # None: <queue>.dead
        self.count = 0
        self.reason: bytes | None = None  # the last NACK's REASON
        self.origin: tuple | None = None
        self.dedup = dedup  # ADDJOB's DEDUP key (dedup.py)
        self.returns = 0  # sum(returned.values()), kept with it
        self.returned: dict[str, int] | None = None
        self.trace: bytes | None = None  # the last failure's traceback (NACK ... TRACE)
        self.group: bytes | None = None  # ADDJOB's GROUP (its job has F_GROUP)

    def __eq__(self, other: object) -> bool:
        if type(other) is not Extra:
            return NotImplemented
        return all(getattr(self, f) == getattr(other, f) for f in _EXTRA_FIELDS)

    __hash__ = None  # type: ignore[assignment]

    def __repr__(self) -> str:
        return "Extra(%s)" % ", ".join("%s=%r" % (f, getattr(self, f)) for f in _EXTRA_FIELDS)

    def delivered(self) -> int:
        """The deliveries that count against MAXDELIVER: those known, minus those given back."""
        n = self.count - self.returns
        return n if n > 0 else 0

    def merge_returned(self, returned: dict[str, int]) -> bool:
        """Take in another holder's ``returned`` (each node's count: the larger); True if it
        taught anything. A job remembers the returns of ``RETURNED_NODES_MAX`` nodes at most."""
        mine = self.returned
        if mine is None:
            mine = self.returned = {}
        changed = False
        for node, n in returned.items():
            had = mine.get(node, 0)
            if n > had and (had or len(mine) < RETURNED_NODES_MAX):
                mine[node] = n
                self.returns += n - had
                changed = True
        return changed

    def options(self) -> list[bytes]:
        """The delivery options as ADDJOB arguments (a dead letter requeued gets them back)."""
        out: list[bytes] = []
        if self.backoff_max:
            out += [b"BACKOFF", _seconds(self.backoff_min), _seconds(self.backoff_max)]
        if self.maxdeliver:
            out += [b"MAXDELIVER", b"%d" % self.maxdeliver]
        if self.deadletter is not None:
            out += [b"DEADLETTER", self.deadletter]
        if self.group is not None:
            out += [b"GROUP", self.group]
        return out


#: The nodes whose RELEASEs of one job are remembered (``Extra.returned``): more nodes than
#: this giving back one job are not counted (its count stays higher: MAXDELIVER comes sooner).
RETURNED_NODES_MAX: Final = 64
#: NACK's TRACE is kept up to this many bytes, its tail (a traceback ends with the failing line).
TRACE_MAX: Final = 16384

#: A job's dead letters go to its queue's name with this appended, unless DEADLETTER names one
#: (delivery.py).
DEAD_SUFFIX: Final = b".dead"


def extra_fields(job: Job, trace: bool = False) -> list:
    """SHOW's fields for a job with an Extra (after Disque's; none for a job without); with
    ``trace`` (SHOW and JSCAN, not GETJOB's WITHCOUNTERS) its last failure's traceback too."""
    e = job.extra
    if e is None:
        return []
    n = e.count - e.returns
    out: list = [b"deliveries", n if n > 0 else 0]
    if e.returns:
        out += [b"returns", e.returns]
    if e.dedup is not None:
        out += [b"dedup", e.dedup]
    if e.group is not None:
        out += [b"group", e.group]
    if e.backoff_max:
        out += [b"backoff-min-ms", e.backoff_min, b"backoff-max-ms", e.backoff_max]
    if e.maxdeliver:
        out += [b"maxdeliver", e.maxdeliver]
    if e.maxdeliver or e.deadletter is not None:
        out += [b"deadletter", e.deadletter if e.deadletter is not None else bytes(job.queue or b"") + DEAD_SUFFIX]
    if e.reason is not None:
        out += [b"last-nack-reason", e.reason]
    if e.origin is not None:
        oid, oqueue, odeliv, oreason, oopts = e.origin
        out += [b"dead-letter-of", oid, b"original-queue", oqueue, b"original-deliveries", odeliv,
                b"dead-letter-reason", oreason, b"original-options", list(oopts)]  # fmt: skip
    if trace and e.trace is not None:
        out += [b"last-failure-trace", e.trace]
    return out


# Extra's fields, for __eq__ and __repr__ (a compiled class has no __slots__ to read).
_EXTRA_FIELDS: Final = ("backoff_min", "backoff_max", "maxdeliver", "deadletter", "count", "reason", "origin", "dedup",
                        "returns", "returned", "trace", "group")  # fmt: skip


def _seconds(ms: int) -> bytes:
    """Milliseconds as the shortest decimal seconds (1500 -> b"1.5", 2000 -> b"2")."""
    whole, frac = divmod(ms, 1000)
    return b"%d" % whole if not frac else (b"%d.%03d" % (whole, frac)).rstrip(b"0")


@final
class _Switch:
    """``watch_transitions``'s switch: one attribute, read by every ``Job.set_state``."""

    __slots__ = ("on",)

    def __init__(self) -> None:
        self.on = False


_WATCH: Final = _Switch()


def _check_transition(job: Job, to: int) -> None:
    """Under ``watch_transitions``: refuses a move ``TRANSITIONS`` lacks."""
    if to not in TRANSITIONS[job.state]:
        what = "job %r: %s -> %s is not a legal transition (from %s: %s)" % (
            job.id, STATE_NAMES[job.state], STATE_NAMES[to], STATE_NAMES[job.state],
            ", ".join(STATE_NAMES[s] for s in TRANSITIONS[job.state]) or "none",
        )  # fmt: skip
        illegal_transitions.append(what)
        raise IllegalTransition(what)


def watch_transitions(on: bool = True) -> None:
    """Check every state change against ``TRANSITIONS`` from now on (``on``), or stop.

    Checked, an illegal move raises ``IllegalTransition`` at its site and is recorded in
    ``illegal_transitions``, which ``invariants.check`` reports (TRANSITIONS) after the
    input, even where a handler's error is caught and logged (the shell's bus feed).
    ``core/invariants.py`` turns it on when imported (tests, simulations, fuzzing); the
    node's shell never imports it, so a node runs unchecked."""
    _WATCH.on = on
