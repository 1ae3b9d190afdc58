"""Job-layer bus messages: one small immutable type per kind, and their decoder.

Theory of operation
-------------------
Every message a node sends or receives on the bus's DATA channel (REPLJOB,
GOTJOB, ENQUEUE, QUEUED, WORKING, WILLQUEUE, SETACK, GOTACK, DELJOB, PAUSE,
NEEDJOBS, YOURJOBS) is a ``typing.NamedTuple`` whose first field is its kind,
so that its tuple form *is* the wire form ``(kind, *fields)``: the shell
encodes ``message[0]`` and ``list(message[1:])`` as before, byte for byte,
and reads ``message[0] == "YOURJOBS"``. Builders (``set_ack(...)``, ...) fill
the kind; they call ``tuple.__new__`` directly, which costs a third of a
NamedTuple's own constructor (a few messages are built per job).

Three kinds have an optional trailing field, so each has two types, one per
wire shape: ``SetAck`` / ``SetAckTwoCopies`` (SETACK id 2 True: "I am your
only other holder's only other holder"), ``GotAck`` / ``GotAckDeleted``
(GOTACK id True True: "and I deleted my copy") and ``DelJob`` /
``DelJobHolders`` (DELJOB id holders: the holders told). A trailing field
with another value than these is ignored, as before.

``decode(kind, body)`` is where a peer's message is checked: types, arity
(trailing extra fields are ignored, for a later version), the shape of job
IDs (bytes of ``JOB_ID_LEN``), holder lists, and the job array a REPLJOB
carries (``wire.check_wire_job``). It returns the typed message, or ``None``
for anything malformed, which ``Node.receive_data`` drops and counts
(``Node.bus_stats["messages_malformed"]``). Handlers then trust their message.
Two checks are left, on purpose, to the one place that needs them, because
they cost as much as the rest of a message's handling on the hot path:

* an ID's full format (``ids.valid_job_id``, a regular expression): an ID
  that is only looked up needs none (a stored job always has a well-formed
  ID, so a malformed one is not found); the handlers that act on an ID they
  do not hold (SETACK answers it, DELJOB tombstones it) check it then, and
  count a malformed one (``Acks.on_setack``, ``Acks.on_deljob``);
* the jobs of a YOURJOBS, checked one by one as they are imported
  (``Federation.on_yourjobs``): a job held here already needs only its ID
  and queue, and a malformed job leaves out that job, not the others (the
  message counts once).

Imports only ``ids`` and ``wire``; used by every machine that sends, and by
``node`` (decode).
"""

from __future__ import annotations

from typing import Any, Callable, NamedTuple

from .ids import JOB_ID_LEN
from .wire import RETRY_FIELD, check_wire_job

__all__ = [
    "ReplJob", "GotJob", "Enqueue", "Queued", "Working", "WillQueue", "SetAck", "SetAckTwoCopies",
    "GotAck", "GotAckDeleted", "DelJob", "DelJobHolders", "Pause", "NeedJobs", "YourJobs",
    "repl_job", "got_job", "enqueue", "queued", "working", "will_queue", "set_ack", "set_ack_two_copies",
    "got_ack", "got_ack_deleted", "del_job", "del_job_holders", "pause", "need_jobs", "your_jobs",
    "decode", "DECODERS", "KINDS", "moves_to_watch",
]  # fmt: skip

_new = tuple.__new__


class ReplJob(NamedTuple):
    """Hold a copy of this job; answer GOTJOB unless ``noreply``."""

    kind: str
    job: list  # job_to_wire form, checked
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
    holders: list


class Pause(NamedTuple):
    """Set queue ``name``'s pause ``flags`` (PAUSE ... BCAST)."""

    kind: str
    name: bytes
    flags: int


class NeedJobs(NamedTuple):
    """Send me up to ``count`` jobs of queue ``name`` (0: cancel my lease)."""

    kind: str
    name: bytes
    count: int


class YourJobs(NamedTuple):
    """Jobs moved to the receiver (job_to_wire arrays, checked)."""

    kind: str
    jobs: list


# -- builders (what the machines send) -----------------------------------------------------
def repl_job(job: list, noreply: bool) -> ReplJob:
    return _new(ReplJob, ("REPLJOB", job, noreply))


def got_job(job_id: bytes) -> GotJob:
    return _new(GotJob, ("GOTJOB", job_id))


def enqueue(job_id: bytes, delay: int) -> Enqueue:
    return _new(Enqueue, ("ENQUEUE", job_id, delay))


def queued(job_id: bytes, flags: int) -> Queued:
    return _new(Queued, ("QUEUED", job_id, flags))


def working(job_id: bytes) -> Working:
    return _new(Working, ("WORKING", job_id))


def will_queue(job_id: bytes) -> WillQueue:
    return _new(WillQueue, ("WILLQUEUE", job_id))


def set_ack(job_id: bytes, may_have: int) -> SetAck:
    return _new(SetAck, ("SETACK", job_id, may_have))


def set_ack_two_copies(job_id: bytes) -> SetAckTwoCopies:
    return _new(SetAckTwoCopies, ("SETACK", job_id, 2, True))


def got_ack(job_id: bytes, known: bool) -> GotAck:
    return _new(GotAck, ("GOTACK", job_id, known))


def got_ack_deleted(job_id: bytes) -> GotAckDeleted:
    return _new(GotAckDeleted, ("GOTACK", job_id, True, True))


def del_job(job_id: bytes) -> DelJob:
    return _new(DelJob, ("DELJOB", job_id))


def del_job_holders(job_id: bytes, holders: list) -> DelJobHolders:
    return _new(DelJobHolders, ("DELJOB", job_id, holders))


def pause(name: bytes, flags: int) -> Pause:
    return _new(Pause, ("PAUSE", name, flags))


def need_jobs(name: bytes, count: int) -> NeedJobs:
    return _new(NeedJobs, ("NEEDJOBS", name, count))


def your_jobs(jobs: list) -> YourJobs:
    return _new(YourJobs, ("YOURJOBS", jobs))


# -- decoding (what arrives) --------------------------------------------------------------
# Each decoder gets the body as a list (checked by ``decode``) and returns the message or None.
_ID_LEN = JOB_ID_LEN  # job ID shape, checked inline below (a helper call per message cost ~60 ns)


def _dec_repljob(b: list) -> ReplJob | None:
    if len(b) >= 2 and type(b[1]) is bool and check_wire_job(b[0]):
        return _new(ReplJob, ("REPLJOB", b[0], b[1]))
    return None


def _dec_id_only(kind: str, cls: type) -> Callable[[list], Any]:
    def dec(b: list) -> Any:
        if b and type(b[0]) is bytes and len(b[0]) == _ID_LEN:
            return _new(cls, (kind, b[0]))
        return None

    return dec


def _dec_enqueue(b: list) -> Enqueue | None:
    if len(b) >= 2 and type(b[0]) is bytes and len(b[0]) == _ID_LEN and type(b[1]) is int:
        return _new(Enqueue, ("ENQUEUE", b[0], b[1]))
    return None


def _dec_queued(b: list) -> Queued | None:
    if len(b) >= 2 and type(b[0]) is bytes and len(b[0]) == _ID_LEN and type(b[1]) is int:
        return _new(Queued, ("QUEUED", b[0], b[1]))
    return None


def _dec_setack(b: list) -> SetAck | SetAckTwoCopies | None:
    if len(b) < 2 or type(b[1]) is not int or type(b[0]) is not bytes or len(b[0]) != _ID_LEN:
        return None
    if len(b) > 2 and b[2] is True:
        return _new(SetAckTwoCopies, ("SETACK", b[0], b[1], True))
    return _new(SetAck, ("SETACK", b[0], b[1]))


def _dec_gotack(b: list) -> GotAck | GotAckDeleted | None:
    if len(b) < 2 or type(b[1]) is not bool or type(b[0]) is not bytes or len(b[0]) != _ID_LEN:
        return None
    if len(b) > 2 and b[2] is True:
        return _new(GotAckDeleted, ("GOTACK", b[0], b[1], True))
    return _new(GotAck, ("GOTACK", b[0], b[1]))


def _dec_deljob(b: list) -> DelJob | DelJobHolders | None:
    if not b or type(b[0]) is not bytes or len(b[0]) != _ID_LEN:
        return None
    if len(b) > 1 and type(b[1]) is list:
        holders = b[1]
        for n in holders:
            if type(n) is not str or len(n) != 40:
                return None
        return _new(DelJobHolders, ("DELJOB", b[0], holders))
    return _new(DelJob, ("DELJOB", b[0]))


def _dec_pause(b: list) -> Pause | None:
    if len(b) >= 2 and type(b[0]) is bytes and type(b[1]) is int:
        return _new(Pause, ("PAUSE", b[0], b[1]))
    return None


def _dec_needjobs(b: list) -> NeedJobs | None:
    if len(b) >= 2 and type(b[0]) is bytes and type(b[1]) is int and b[1] >= 0:
        return _new(NeedJobs, ("NEEDJOBS", b[0], b[1]))
    return None


def _dec_yourjobs(b: list) -> YourJobs | None:
    if not b or type(b[0]) is not list:
        return None
    return _new(YourJobs, ("YOURJOBS", b[0]))


DECODERS: dict[str, Callable[[list], Any]] = {
    "REPLJOB": _dec_repljob,
    "GOTJOB": _dec_id_only("GOTJOB", GotJob),
    "ENQUEUE": _dec_enqueue,
    "QUEUED": _dec_queued,
    "WORKING": _dec_id_only("WORKING", Working),
    "WILLQUEUE": _dec_id_only("WILLQUEUE", WillQueue),
    "SETACK": _dec_setack,
    "GOTACK": _dec_gotack,
    "DELJOB": _dec_deljob,
    "PAUSE": _dec_pause,
    "NEEDJOBS": _dec_needjobs,
    "YOURJOBS": _dec_yourjobs,
}
KINDS = tuple(DECODERS)


def decode(kind: Any, body: Any) -> Any:
    """The typed message for a peer's ``(kind, body)``, or None if anything is off."""
    dec = DECODERS.get(kind) if type(kind) is str else None
    if dec is None or type(body) is not list:
        return None
    return dec(body)


def moves_to_watch(message: tuple) -> bool:
    """Whether the shell must tell ``Node.on_moves_unsent`` if this message never reaches the
    socket: a YOURJOBS that carries the only copy of a job (RETRY 0)."""
    if message[0] != "YOURJOBS":
        return False
    for wire in message[1]:
        if wire[RETRY_FIELD] == 0:
            return True
    return False
