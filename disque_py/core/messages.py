"""Job-layer bus messages: one small immutable type per kind, and their receivers.

Theory of operation
-------------------
Every message a node receives on the bus's DATA channel (REPLJOB, GOTJOB,
ENQUEUE, QUEUED, WORKING, WILLQUEUE, SETACK, GOTACK, DELJOB, PAUSE, NEEDJOBS,
YOURJOBS, and ours: NACKED, DELIVERED, RETURNED, HASJOB, HAVEJOB, GROUPS) reaches its handler as a
``typing.NamedTuple`` whose first field is its kind, so that its tuple form *is*
the wire form ``(kind, *fields)``. A type is made from its tuple form by
``tuple``'s own constructor, ``_new(SetAck, ("SETACK", id, n))`` (``_new`` is
``tuple.__new__``), in C, without the NamedTuple's ``__new__`` (a Python
function: twice the cost). Compiled, a handler reads a field by its index
(mypyc turns ``m.job_id`` on a NamedTuple into a tuple subscript).

What a node sends is that wire form itself, a plain tuple: the builders
(``set_ack(...)``, ...; one per type, named after it) fill the kind and return
``(kind, *fields)``, which the shell encodes as ``message[0]`` and
``list(message[1:])`` and reads as ``message[0] == "YOURJOBS"``. Only what
arrives is typed: a sent message is never read by its fields (the shell
encodes it, ``on_moves_unsent`` reads it by index), and building a typed one
on both sides cost twice the ~110 ns a type's construction costs over a plain
tuple, 11 times per job at REPLICATE 3 (docs/benchmarks-history.md, "The house rebuilt").
A builder's result is typed ``Sent``, a tuple of any length: compiled code holds a
tuple of a fixed length unboxed and boxes it anew at each use, so ``ask =
repl_job(...)`` sent to two nodes would be two objects, and the shell encodes a
message sent to several nodes once, by identity.

Six kinds have an optional trailing field, so each has two types, one per
wire shape: ``SetAck`` / ``SetAckTwoCopies`` (SETACK id 2 True: "I am your
only other holder's only other holder"), ``GotAck`` / ``GotAckDeleted``
(GOTACK id True True: "and I deleted my copy"), ``DelJob`` /
``DelJobHolders`` (DELJOB id holders: the holders told), ``Nacked`` /
``NackedTrace`` (NACKED id delay reason trace: the failure's traceback) and
``Delivered`` / ``DeliveredReturned`` (DELIVERED id count returned: the
deliveries given back) and ``Returned`` / ``ReturnedDelay`` (RETURNED id
returned delay: RELEASE's DELAY). A trailing field with another value (another type)
than these is ignored, as before, so an older node reads the newer shapes and
a newer node a later version's.

A peer's message is checked here, by the receiver of its kind
(``receivers``, one per kind around the handler of the machine that owns it;
``Node.receive_data`` makes one call per message): types, arity (trailing
extra fields are ignored, for a later version), the shape of job IDs (bytes
of ``JOB_ID_LEN``) and holder lists. A well-formed message is built and
handed to its handler; a malformed one is not, and the receiver returns
False, so ``Node.receive_data`` drops and counts it
(``Node.bus_stats["messages_malformed"]``). Handlers then trust their message
(and return None). Three checks are left, on purpose, to the one place that needs
them, because they cost as much as the rest of a message's handling on the
hot path:

* an ID's full format (``ids.valid_job_id``, a regular expression): an ID
  that is only looked up needs none (a stored job always has a well-formed
  ID, so a malformed one is not found); the handlers that act on an ID they
  do not hold (SETACK answers it, DELJOB tombstones it) check it then, and
  count a malformed one (``Acks.on_setack``, ``Acks.on_deljob``);
* the job array a REPLJOB carries, checked as its handler unpacks it into
  the Job (``wire.job_from_wire``, one pass; a second unpack only to check it
  cost a tenth of the handler), which counts a malformed one
  (``Replication.on_repljob``);
* the jobs of a YOURJOBS, checked one by one as they are imported
  (``Federation.on_yourjobs``): a job held here already needs only its ID
  and queue, and a malformed job leaves out that job, not the others (the
  message counts once).

Imports only ``ids``, ``wire`` and a bound of ``job``; used by every machine that
sends, and by ``node`` (receivers). Compiled (disque_py/_build.py): the types are
NamedTuples, which mypyc makes ordinary Python classes; the builders and the receivers
are native.
"""

from __future__ import annotations

from typing import Any, Callable, Final, NamedTuple, TypeAlias

from .ids import JOB_ID_LEN, NODE_IDS_SEEN, valid_node_ids
from .job import TRACE_MAX
from .wire import RETRY_FIELD, WireJob, returned_from_wire

__all__ = [
    "ReplJob", "GotJob", "Enqueue", "Queued", "Working", "WillQueue", "SetAck", "SetAckTwoCopies",
    "GotAck", "GotAckDeleted", "DelJob", "DelJobHolders", "Pause", "NeedJobs", "YourJobs",
    "Nacked", "NackedTrace", "Delivered", "DeliveredReturned", "Returned", "nacked", "nacked_trace", "delivered",
    "delivered_returned", "returned", "ReturnedDelay", "returned_delay", "HasJob", "HaveJob", "has_job", "have_job",
    "repl_job", "got_job", "enqueue", "queued", "working", "will_queue", "set_ack", "set_ack_two_copies",
    "got_ack", "got_ack_deleted", "del_job", "del_job_holders", "pause", "need_jobs", "your_jobs",
    "receivers", "KINDS", "moves_to_watch", "Sent", "Receiver", "Handler",
]  # fmt: skip

#: What a builder returns and ``Context.send`` takes: ``(kind, *fields)``, boxed (see above).
Sent: TypeAlias = "tuple[object, ...]"

# A type made from its tuple form (the module docstring): ``_new(SetAck, ("SETACK", id, n))``.
_new: Final = tuple.__new__


class ReplJob(NamedTuple):
    """Hold a copy of this job; answer GOTJOB unless ``noreply``."""

    kind: str
    job: WireJob  # job_to_wire form, checked by the handler
    noreply: bool


class GotJob(NamedTuple):
    """I hold a copy of ``job_id`` (an answer to REPLJOB)."""

    kind: str
    job_id: bytes


class Enqueue(NamedTuple):
    """Queue your copy of ``job_id`` now (``delay`` 0) or after ``delay`` seconds."""

    kind: str
    job_id: bytes
    delay: int


class Queued(NamedTuple):
    """I queued ``job_id``: postpone your requeue. ``flags``: QUEUED_INCR_NACKS / _DELIV."""

    kind: str
    job_id: bytes
    flags: int


class Working(NamedTuple):
    """A consumer works on ``job_id``: dequeue it and postpone your requeue."""

    kind: str
    job_id: bytes


class WillQueue(NamedTuple):
    """I will requeue ``job_id`` in about 500 ms (answered QUEUED or SETACK)."""

    kind: str
    job_id: bytes


class SetAck(NamedTuple):
    """``job_id`` is acknowledged; I know ``may_have`` holders."""

    kind: str
    job_id: bytes
    may_have: int


class SetAckTwoCopies(NamedTuple):
    """SETACK from a holder whose only other holder is the receiver (``only_other`` is True)."""

    kind: str
    job_id: bytes
    may_have: int
    only_other: bool


class GotAck(NamedTuple):
    """Answer to SETACK: ``known`` whether the job was known here."""

    kind: str
    job_id: bytes
    known: bool


class GotAckDeleted(NamedTuple):
    """Answer to SetAckTwoCopies: known, and the copy here is deleted already (no DELJOB needed)."""

    kind: str
    job_id: bytes
    known: bool
    deleted: bool


class DelJob(NamedTuple):
    """Delete your copy of ``job_id``."""

    kind: str
    job_id: bytes


class DelJobHolders(NamedTuple):
    """Delete your copy of ``job_id``; ``holders`` were told (pass it on to the others you know)."""

    kind: str
    job_id: bytes
    holders: list[str]


class Pause(NamedTuple):
    """Set queue ``name``'s pause ``flags`` (PAUSE ... BCAST)."""

    kind: str
    name: bytes
    flags: int


class NeedJobs(NamedTuple):
    """Send me up to ``count`` jobs of queue ``name`` (0: cancel my lease)."""

    kind: str
    name: bytes
    count: int  # type: ignore[assignment]  # a field shadows tuple.count, as in any NamedTuple


class YourJobs(NamedTuple):
    """Jobs moved to the receiver (job_to_wire arrays, checked)."""

    kind: str
    jobs: list[Any]  # job_to_wire arrays, each checked by the handler (a peer's: anything)


class Nacked(NamedTuple):
    """A NACK with a delay here (NACK DELAY, or the job's BACKOFF): count a nack, take it out
    of your queue, and queue it no sooner than ``delay`` ms plus a RETRY from now (the node
    that took the NACK queues it at the end of the delay). ``reason``: the NACK's REASON,
    or empty. delivery.py."""

    kind: str
    job_id: bytes
    delay: int
    reason: bytes


class NackedTrace(NamedTuple):
    """NACKED with the NACK's TRACE (the failure's traceback, at most ``job.TRACE_MAX`` bytes)
    after the reason: a trailing field, which an older node ignores."""

    kind: str
    job_id: bytes
    delay: int
    reason: bytes
    trace: bytes


class Delivered(NamedTuple):
    """I handed ``job_id`` to a consumer, and count ``count`` deliveries of it with this one
    (jobs with a delivery policy only, so that MAXDELIVER is judged on every holder;
    delivery.py)."""

    kind: str
    job_id: bytes
    count: int  # type: ignore[assignment]  # a field shadows tuple.count, as in any NamedTuple


class DeliveredReturned(NamedTuple):
    """DELIVERED of a job some of whose deliveries were given back (RELEASE): ``returned`` is
    what the sender knows of them (node -> its count, ``Extra.returned``; a trailing field on
    the wire, ``wire.returned_to_wire``'s list), so a holder that missed a RETURNED learns it."""

    kind: str
    job_id: bytes
    count: int  # type: ignore[assignment]  # a field shadows tuple.count, as in any NamedTuple
    returned: dict[str, int]


class Returned(NamedTuple):
    """I took a RELEASE of ``job_id``: a delivery given back unstarted, which no longer counts
    against MAXDELIVER. ``returned``: the returns the sender knows of, its own included (node ->
    its count; ``wire.returned_to_wire``'s list on the wire). Sent before the QUEUED of the
    job queued again (delivery.py)."""

    kind: str
    job_id: bytes
    returned: dict[str, int]


class ReturnedDelay(NamedTuple):
    """RETURNED of a RELEASE with a DELAY: the job is queued again by the sender when ``delay``
    (ms) ends, so a holder puts its own requeue past it (as for a NACKED with a delay), without
    counting a nack (a trailing field on the wire)."""

    kind: str
    job_id: bytes
    returned: dict[str, int]
    delay: int


class HasJob(NamedTuple):
    """Do you hold ``job_id``, or remember it (a DEDUP job's window)? Answer HAVEJOB (dedup.py)."""

    kind: str
    job_id: bytes


class HaveJob(NamedTuple):
    """The answer to HASJOB: ``have`` True if held or remembered here."""

    kind: str
    job_id: bytes
    have: bool


# -- builders (what the machines send: the plain wire tuple, see the module docstring) ---------
def has_job(job_id: bytes) -> Sent:  # HasJob
    return ("HASJOB", job_id)


def have_job(job_id: bytes, have: bool) -> Sent:  # HaveJob
    return ("HAVEJOB", job_id, have)


def nacked(job_id: bytes, delay: int, reason: bytes) -> Sent:  # Nacked
    return ("NACKED", job_id, delay, reason)


def nacked_trace(job_id: bytes, delay: int, reason: bytes, trace: bytes) -> Sent:  # NackedTrace
    return ("NACKED", job_id, delay, reason, trace)


def delivered(job_id: bytes, count: int) -> Sent:  # Delivered
    return ("DELIVERED", job_id, count)


def delivered_returned(job_id: bytes, count: int, returned: list[str | int]) -> Sent:  # DeliveredReturned
    return ("DELIVERED", job_id, count, returned)


def returned(job_id: bytes, returned: list[str | int]) -> Sent:  # Returned
    return ("RETURNED", job_id, returned)


def returned_delay(job_id: bytes, returned: list[str | int], delay: int) -> Sent:  # ReturnedDelay
    return ("RETURNED", job_id, returned, delay)


def repl_job(job: WireJob, noreply: bool) -> Sent:  # ReplJob
    return ("REPLJOB", job, noreply)


def got_job(job_id: bytes) -> Sent:  # GotJob
    return ("GOTJOB", job_id)


def enqueue(job_id: bytes, delay: int) -> Sent:  # Enqueue
    return ("ENQUEUE", job_id, delay)


def queued(job_id: bytes, flags: int) -> Sent:  # Queued
    return ("QUEUED", job_id, flags)


def working(job_id: bytes) -> Sent:  # Working
    return ("WORKING", job_id)


def will_queue(job_id: bytes) -> Sent:  # WillQueue
    return ("WILLQUEUE", job_id)


def set_ack(job_id: bytes, may_have: int) -> Sent:  # SetAck
    return ("SETACK", job_id, may_have)


def set_ack_two_copies(job_id: bytes) -> Sent:  # SetAckTwoCopies
    return ("SETACK", job_id, 2, True)


def got_ack(job_id: bytes, known: bool) -> Sent:  # GotAck
    return ("GOTACK", job_id, known)


def got_ack_deleted(job_id: bytes) -> Sent:  # GotAckDeleted
    return ("GOTACK", job_id, True, True)


def del_job(job_id: bytes) -> Sent:  # DelJob
    return ("DELJOB", job_id)


def del_job_holders(job_id: bytes, holders: list[str]) -> Sent:  # DelJobHolders
    return ("DELJOB", job_id, holders)


def pause(name: bytes, flags: int) -> Sent:  # Pause
    return ("PAUSE", name, flags)


def need_jobs(name: bytes, count: int) -> Sent:  # NeedJobs
    return ("NEEDJOBS", name, count)


def your_jobs(jobs: list[WireJob]) -> Sent:  # YourJobs
    return ("YOURJOBS", jobs)


# -- receiving (what arrives) ------------------------------------------------------------
# One receiver per kind, made once per node around the handler of the machine that owns the kind
# (``receivers``): it checks a peer's body (a list, checked by its caller), builds the message and
# calls the handler with it, returning what the handler returns (None); False if the body is
# malformed, and then the handler is not called. Checking, building and dispatching are one call:
# a separate decoder's call and the dispatch on its result cost about a tenth of a GOTACK's
# handling. A body of the usual length is unpacked once into locals, which are checked and
# built from (a subscript per field and check cost ~20 opcodes more per message).
# A receiver takes the sender and the body (a list of anything: a peer's); a handler takes the
# sender and the message of its kind (a type above; GROUPS: the body). Both return None, or
# False for a malformed message (limits.py's GROUPS handler checks its own).
Receiver: TypeAlias = "Callable[[str, list[Any]], bool | None]"
Handler: TypeAlias = "Callable[[str, Any], bool | None]"
_ID_LEN: Final = JOB_ID_LEN  # job ID shape, checked inline below (a helper call per message cost ~60 ns)
_NODE_IDS_SEEN: Final = NODE_IDS_SEEN


def _repljob(handle: Handler) -> Receiver:
    # Only the shape here: the job array is checked where the handler builds the Job from it
    # (``wire.job_from_wire``, once), and a bad one counted there (see the module docstring).
    def receive(sender: str, b: list[Any]) -> bool | None:
        if len(b) == 2:
            job, noreply = b
        elif len(b) > 2:
            job, noreply = b[0], b[1]
        else:
            return False
        if type(job) is list and type(noreply) is bool:
            return handle(sender, _new(ReplJob, ("REPLJOB", job, noreply)))
        return False

    return receive


def _id_only(kind: str, cls: type[tuple[str, bytes]]) -> Callable[[Handler], Receiver]:
    def make(handle: Handler) -> Receiver:
        def receive(sender: str, b: list[Any]) -> bool | None:
            if b:
                job_id = b[0]
                if type(job_id) is bytes and len(job_id) == _ID_LEN:
                    return handle(sender, _new(cls, (kind, job_id)))
            return False

        return receive

    return make


def _id_int(kind: str, cls: type[tuple[str, bytes, int]]) -> Callable[[Handler], Receiver]:
    # ENQUEUE id delay, QUEUED id flags
    def make(handle: Handler) -> Receiver:
        def receive(sender: str, b: list[Any]) -> bool | None:
            if len(b) == 2:
                job_id, n = b
            elif len(b) > 2:
                job_id, n = b[0], b[1]
            else:
                return False
            if type(job_id) is bytes and len(job_id) == _ID_LEN and type(n) is int:
                return handle(sender, _new(cls, (kind, job_id, n)))
            return False

        return receive

    return make


def _setack(handle: Handler) -> Receiver:
    def receive(sender: str, b: list[Any]) -> bool | None:
        if len(b) == 2:
            job_id, may_have = b
            if type(may_have) is int and type(job_id) is bytes and len(job_id) == _ID_LEN:
                return handle(sender, _new(SetAck, ("SETACK", job_id, may_have)))
            return False
        if len(b) < 2:
            return False
        job_id, may_have = b[0], b[1]
        if type(may_have) is not int or type(job_id) is not bytes or len(job_id) != _ID_LEN:
            return False
        if b[2] is True:
            return handle(sender, _new(SetAckTwoCopies, ("SETACK", job_id, may_have, True)))
        return handle(sender, _new(SetAck, ("SETACK", job_id, may_have)))

    return receive


def _gotack(handle: Handler) -> Receiver:
    def receive(sender: str, b: list[Any]) -> bool | None:
        if len(b) == 2:
            job_id, known = b
            if type(known) is bool and type(job_id) is bytes and len(job_id) == _ID_LEN:
                return handle(sender, _new(GotAck, ("GOTACK", job_id, known)))
            return False
        if len(b) < 2:
            return False
        job_id, known = b[0], b[1]
        if type(known) is not bool or type(job_id) is not bytes or len(job_id) != _ID_LEN:
            return False
        if b[2] is True:
            return handle(sender, _new(GotAckDeleted, ("GOTACK", job_id, known, True)))
        return handle(sender, _new(GotAck, ("GOTACK", job_id, known)))

    return receive


def _deljob(handle: Handler) -> Receiver:
    def receive(sender: str, b: list[Any]) -> bool | None:
        if not b:
            return False
        job_id = b[0]
        if type(job_id) is not bytes or len(job_id) != _ID_LEN:
            return False
        if len(b) > 1:
            holders = b[1]
            if type(holders) is list:
                try:
                    seen = _NODE_IDS_SEEN.issuperset(holders)  # see ids.NODE_IDS_SEEN
                except TypeError:  # an unhashable element
                    return False
                if not seen and not valid_node_ids(holders):
                    return False
                return handle(sender, _new(DelJobHolders, ("DELJOB", job_id, holders)))
        return handle(sender, _new(DelJob, ("DELJOB", job_id)))

    return receive


def _pause(handle: Handler) -> Receiver:
    def receive(sender: str, b: list[Any]) -> bool | None:
        if len(b) < 2:
            return False
        name, flags = b[0], b[1]
        if type(name) is not bytes or type(flags) is not int:
            return False
        return handle(sender, _new(Pause, ("PAUSE", name, flags)))

    return receive


def _needjobs(handle: Handler) -> Receiver:
    def receive(sender: str, b: list[Any]) -> bool | None:
        if len(b) < 2:
            return False
        name, count = b[0], b[1]
        if type(name) is not bytes or type(count) is not int or count < 0:
            return False
        return handle(sender, _new(NeedJobs, ("NEEDJOBS", name, count)))

    return receive


def _yourjobs(handle: Handler) -> Receiver:
    def receive(sender: str, b: list[Any]) -> bool | None:
        if b:
            jobs = b[0]
            if type(jobs) is list:
                return handle(sender, _new(YourJobs, ("YOURJOBS", jobs)))
        return False

    return receive


def _nacked(handle: Handler) -> Receiver:
    def receive(sender: str, b: list[Any]) -> bool | None:
        if len(b) < 3:
            return False
        job_id, delay, reason = b[0], b[1], b[2]
        if type(job_id) is bytes and len(job_id) == _ID_LEN and type(delay) is int and 0 <= delay < 1 << 40:
            if type(reason) is bytes and len(reason) <= 65536:
                if len(b) > 3 and type(b[3]) is bytes:  # the TRACE (another type: a later field)
                    trace = b[3]
                    if len(trace) > TRACE_MAX:
                        return False
                    return handle(sender, _new(NackedTrace, ("NACKED", job_id, delay, reason, trace)))
                return handle(sender, _new(Nacked, ("NACKED", job_id, delay, reason)))
        return False

    return receive


def _delivered(handle: Handler) -> Receiver:
    def receive(sender: str, b: list[Any]) -> bool | None:
        if len(b) < 2:
            return False
        job_id, count = b[0], b[1]
        if type(job_id) is not bytes or len(job_id) != _ID_LEN or type(count) is not int:
            return False
        if len(b) > 2 and type(b[2]) is list:  # the returns (another type: a later field)
            returned = returned_from_wire(b[2])
            if returned is None:
                return False
            return handle(sender, _new(DeliveredReturned, ("DELIVERED", job_id, count, returned)))
        return handle(sender, _new(Delivered, ("DELIVERED", job_id, count)))

    return receive


def _returned(handle: Handler) -> Receiver:
    def receive(sender: str, b: list[Any]) -> bool | None:
        if len(b) < 2:
            return False
        job_id = b[0]
        if type(job_id) is not bytes or len(job_id) != _ID_LEN:
            return False
        returned = returned_from_wire(b[1])
        if not returned:
            return False
        if len(b) > 2 and type(b[2]) is int:  # RELEASE's DELAY, ms (another type: a later field)
            delay = b[2]
            if not 0 <= delay < 1 << 40:
                return False
            return handle(sender, _new(ReturnedDelay, ("RETURNED", job_id, returned, delay)))
        return handle(sender, _new(Returned, ("RETURNED", job_id, returned)))

    return receive


def _havejob(handle: Handler) -> Receiver:
    def receive(sender: str, b: list[Any]) -> bool | None:
        if len(b) < 2:
            return False
        job_id, have = b[0], b[1]
        if type(job_id) is bytes and len(job_id) == _ID_LEN and type(have) is bool:
            return handle(sender, _new(HaveJob, ("HAVEJOB", job_id, have)))
        return False

    return receive


def _groups(handle: Handler) -> Receiver:
    """GROUPS op ...: the groups' settings and limits (ours); checked by limits.py, which owns
    each op's shape (``Limits.on_groups``, False for a malformed one)."""

    def receive(sender: str, b: list[Any]) -> bool | None:
        if not b or type(b[0]) is not str:
            return False
        return handle(sender, b)

    return receive


_RECEIVERS: Final[dict[str, Callable[[Handler], Receiver]]] = {
    "REPLJOB": _repljob,
    "GOTJOB": _id_only("GOTJOB", GotJob),
    "ENQUEUE": _id_int("ENQUEUE", Enqueue),
    "QUEUED": _id_int("QUEUED", Queued),
    "WORKING": _id_only("WORKING", Working),
    "WILLQUEUE": _id_only("WILLQUEUE", WillQueue),
    "SETACK": _setack,
    "GOTACK": _gotack,
    "DELJOB": _deljob,
    "PAUSE": _pause,
    "NEEDJOBS": _needjobs,
    "YOURJOBS": _yourjobs,
    "NACKED": _nacked,
    "DELIVERED": _delivered,
    "RETURNED": _returned,
    "HASJOB": _id_only("HASJOB", HasJob),
    "HAVEJOB": _havejob,
    "GROUPS": _groups,
}
KINDS: Final = tuple(_RECEIVERS)


def receivers(handlers: dict[str, Handler]) -> dict[str, Receiver]:
    """kind -> receiver around ``handlers[kind]``, for every kind (``Node.receive_data``)."""
    if handlers.keys() != _RECEIVERS.keys():
        raise ValueError("handlers for %s, expected %s" % (sorted(handlers), sorted(_RECEIVERS)))
    return {kind: make(handlers[kind]) for kind, make in _RECEIVERS.items()}


def moves_to_watch(message: tuple[Any, ...]) -> bool:
    """Whether the shell must tell ``Node.on_moves_unsent`` if this message never reaches the
    socket: a YOURJOBS that carries the only copy of a job (RETRY 0)."""
    if message[0] != "YOURJOBS":
        return False
    for wire in message[1]:
        if wire[RETRY_FIELD] == 0:
            return True
    return False
