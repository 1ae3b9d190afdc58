"""Acknowledging: the outcomes waiting to be sent, who sends them, what their answers free.

An outcome is ``ACKJOB`` (``FASTACK`` with ``fast_ack``) for a job done, a plain ``NACK`` for
a job handed back, or a NACK with options (``DELAY``, ``REASON``, ``TRACE``, ``DEAD``; one command per job)
for a failure (:mod:`.outcome` decides which). A job stays *in flight* until the node answered
its outcome: only then is its slot free (:meth:`Acks.settled`).

Who sends them: the fetcher *carries* them in front of its next ``GETJOB NOHANG`` (one round
trip, see :mod:`.fetch`); while it cannot (its GETJOB blocks, a pause, a stop) the *acker*
(:meth:`Acks.run`, a task of its own) sends them, one ``ACKJOB id id ...`` (or FASTACK / NACK)
per batch, and the NACKs with options in one pipeline. A NACK with options the node refuses (a
DELAY beyond the job's TTL) is sent again plain, so the job is never lost; a node that refuses
NACK's options altogether (Disque's own) switches the worker to plain NACKs and to dead letters
it ADDs itself (``legacy``); one that refuses only TRACE (an older disque-py) gets the same NACK
without it, and no TRACE from then on (``takes_trace``).

Jobs fetched and never started (a stop) are *given back*, never NACKed: ``RELEASE id id ...``
(disque-py's) queues them again at once without counting their delivery (no attempt used, no
nack, nothing against MAXDELIVER). The acker sends them, one RELEASE per node: to the node each
job came from (:meth:`Acks.release`'s ``origin``), through the client when that is the client's
node, else on a connection of its own (the client's node if that one cannot be reached). A node
that does not know RELEASE (Disque's own) gets ``ENQUEUE`` instead, which queues them as well but
lets their delivery count; the worker logs it once per node.
"""

from __future__ import annotations

import logging
from collections import deque
from collections.abc import Awaitable, Callable
from typing import Any

import trio

from .. import commands as cmd
from ..connection import NodeConnection  # a blocking connection to one node
from ..errors import BadIdError, DisqueError, ServerError
from ..model import Job
from .stats import Counters
from .wakeup import Wakeup

__all__ = ["Acks", "OPS", "Groups", "outcome_argvs", "outcome_calls", "count_settled"]

log = logging.getLogger("disque_py.worker")

OPS = {"ack": b"ACKJOB", "fast_ack": b"FASTACK", "nack": b"NACK", "release": b"RELEASE", "enqueue": b"ENQUEUE"}

#: A NACK with options (or a RELEASE with a delay) waiting to be sent: ("retry", "dead" or
#: "release", the job, the command).
Retry = tuple[str, Job, tuple[Any, ...]]

#: Outcomes taken to be sent: ``(op, ids)`` groups (one command each) and ``("retry", [(kind,
#: job, argv)...])`` (one command per job).
Groups = list[tuple[str, list[Any]]]


def outcome_argvs(groups: Groups, encoded: bool = False) -> list[tuple[Any, ...]]:
    """The commands that send ``groups``, in order: one per ``(op, ids)`` group (the IDs as
    bytes if ``encoded``, else as they are: a raw connection's packer encodes them), one per
    NACK with options."""
    argvs: list[tuple[Any, ...]] = []
    for op, items in groups:
        if op == "retry":
            argvs += [argv for _, _, argv in items]
        else:
            argvs.append((OPS[op], *([i.encode() for i in items] if encoded else items)))
    return argvs


def outcome_calls(groups: Groups) -> list[cmd.Call[Any]]:
    """:func:`outcome_argvs` as the client's pipeline takes them (each answers an integer)."""
    return [cmd.Call(argv, int) for argv in outcome_argvs(groups, encoded=True)]


def count_settled(counters: Counters, op: str, count: int, error: BaseException | None) -> None:
    """``count`` outcomes sent with one command were answered (``error``: it failed): their
    slots are free. The trio side's count and direct mode's (:mod:`.direct`) alike."""
    if error is not None:
        counters.ack_errors += 1
        log.error("%s of %d job(s) failed: %s", OPS[op].decode(), count, error)
    counters.in_flight -= count


class Acks:
    """The outcomes waiting to be sent, and their sending (see the module docstring).

    ``buffer``, ``counters``, ``max_in_flight`` and ``fetch_wake`` are the fetcher's: an
    outcome wakes it only when it can act on it (its batching rule, :meth:`queued`).
    """

    def __init__(self, client: Any, counters: Counters, buffer: deque[Job], *, max_in_flight: int,
                 fast_ack: bool, fetch_wake: Wakeup) -> None:  # fmt: skip
        self.client = client
        self.counters = counters
        self.buffer = buffer
        self.max_in_flight = max_in_flight
        #: the fetcher waits for this many free slots while runners still have buffered jobs
        self.batch_min = max(1, (max_in_flight + 1) // 2)
        self.op = "fast_ack" if fast_ack else "ack"
        self.fetch_wake = fetch_wake
        self.wake = Wakeup()  # outcomes the fetcher will not carry, or the end: for the acker
        self.acks: list[str] = []  # IDs to ACKJOB (or FASTACK)
        self.nacks: list[str] = []  # IDs to NACK (plain: handed back)
        self.retries: list[Retry] = []  # NACKs with options (DELAY, REASON, DEAD), one command each
        self.releases: dict[Any, list[str]] = {}  # IDs to give back, by the node they came from (None: the client's)
        self.no_release: set[Any] = set()  # nodes that do not know RELEASE: ENQUEUE there
        self.carrying = False  # the fetcher will send outcomes with its next GETJOB
        self.legacy = False  # the node refused NACK's options (a Disque node): plain NACKs, ADDJOB dead letters
        self.takes_trace = True  # False once a node refused NACK's TRACE (an older disque-py): NACKs without it
        self.done = False  # no job will end any more: the acker sends what is left and returns

    # ------------------------------------------------------------ queueing
    def pending(self) -> int:
        return len(self.acks) + len(self.nacks) + len(self.retries)

    def queued(self) -> None:
        """An outcome was queued: wake the acker if it must send it; wake the fetcher only
        when it can act on it (see its batching rule) or when the first outcome starts its
        linger time."""
        if not self.carrying:
            self.wake.fire()
            self.fetch_wake.fire()
        elif self.fetch_wake.task is not None:
            pending = len(self.acks) + len(self.nacks) + len(self.retries)
            if (
                pending == 1
                or not self.buffer
                or self.max_in_flight - self.counters.in_flight + pending >= self.batch_min
            ):
                self.fetch_wake.fire()

    def ack(self, job: Job) -> None:
        """ACKJOB (FASTACK) the job: done, or dead-lettered by the worker's own handler."""
        self.acks.append(job.id)
        self.queued()

    def nack(self, job: Job) -> None:
        """A plain NACK: the job goes back to its queue now."""
        self.nacks.append(job.id)
        self.queued()

    def release(self, job: Job, origin: Any) -> None:
        """Give back a job no handler started: RELEASE on ``origin``, the node it came from (None:
        the client's node). The acker sends it, never the fetcher (a stop ends its rounds)."""
        self.releases.setdefault(origin, []).append(job.id)
        self.wake.fire()

    def nack_with(self, kind: str, job: Job, argv: tuple[Any, ...]) -> None:
        """Queue one NACK with options for a job (``kind``: "retry" or "dead"), or a RELEASE with
        a delay ("release": a job given back for another worker, :class:`~.handlers.GiveBack`)."""
        self.retries.append((kind, job, argv))
        self.queued()

    def take(self) -> Groups:
        """The pending outcomes, taken to be sent."""
        groups: Groups = []
        if self.acks:
            groups.append((self.op, self.acks))
            self.acks = []
        if self.nacks:
            groups.append(("nack", self.nacks))
            self.nacks = []
        if self.retries:
            groups.append(("retry", self.retries))
            self.retries = []
        return groups

    def put_back(self, groups: Groups) -> None:
        """Outcomes maybe not sent (cancelled): the acker sends them (again: twice is harmless)."""
        for op, items in groups:
            if op == "retry":
                self.retries.extend(items)
            else:
                (self.nacks if op == "nack" else self.acks).extend(items)

    def carry(self, carrying: bool) -> None:
        """Whether the fetcher will send pending outcomes itself (else the acker does)."""
        if self.carrying != carrying:
            self.carrying = carrying
            if not carrying and (self.acks or self.nacks or self.retries):
                self.wake.fire()

    # ------------------------------------------------------------ answers
    def answered(self, groups: Groups, results: list[Any]) -> None:
        """Replies to :func:`outcome_calls`' commands, in order (a DisqueError for a failed one)."""
        it = iter(results)
        for op, items in groups:
            if op == "retry":
                for entry in items:
                    result = next(it)
                    self._retry_answered(entry, result if isinstance(result, BaseException) else None)
            else:
                result = next(it)
                self.settled(op, len(items), result if isinstance(result, BaseException) else None)

    def settled(self, op: str, count: int, error: BaseException | None) -> None:
        """Outcomes answered (or failed for good): their slots are free, the fetcher may fill them."""
        count_settled(self.counters, op, count, error)
        self.fetch_wake.fire()

    def _retry_answered(self, entry: Retry, error: BaseException | None) -> None:
        """A NACK with options answered. Refused (a DELAY beyond the job's TTL, a node without
        these options): the job is NACKed plainly instead, so it is never lost."""
        if error is None:
            self.settled("nack", 1, None)
            return
        kind, job, argv = entry
        if b"TRACE" in argv and "TRACE" in str(error):  # an older disque-py node: the same NACK without it
            if self.takes_trace:
                self.takes_trace = False
                log.warning("the node does not know NACK's TRACE (%s): failures are sent without their "
                            "traceback from now on", error)  # fmt: skip
            at = argv.index(b"TRACE")
            self.retries.append((kind, job, argv[:at] + argv[at + 2:]))  # its slot stays taken until answered
            self.queued()
            return
        counters = self.counters
        counters.ack_errors += 1
        # Disque's NACK takes every argument for a job ID (-BADID); ours refuses unknown words
        if (isinstance(error, BadIdError) or "syntax error" in str(error)) and not self.legacy:
            self.legacy = True
            log.warning("the node does not know NACK's DELAY/REASON/DEAD (a Disque node?): failed jobs are "
                        "NACKed at once and dead letters written by the worker from now on")  # fmt: skip
        log.error("%s for job %s failed (%s): plain NACK instead", argv[0].decode(), job.id, error)
        if kind == "dead":
            counters.dead -= 1
            counters.retried += 1
        elif kind == "release":  # a node without RELEASE, or a DELAY past the TTL: a NACK counts it
            counters.released -= 1
            counters.retried += 1
        self.nacks.append(job.id)  # its slot stays taken until this NACK is answered
        self.queued()

    # ------------------------------------------------------------ the acker
    async def run(self) -> None:
        """Send the outcomes the fetcher cannot carry; returns once the work is over and all are sent."""
        client = self.client
        while True:
            if self.releases:  # one RELEASE per node (None: the client's node)
                releases, self.releases = self.releases, {}
                here = getattr(client, "current_address", None)
                by_node: dict[Any, list[str]] = {}
                for origin, ids in releases.items():
                    by_node.setdefault(here if origin is None else origin, []).extend(ids)
                for node, ids in by_node.items():
                    await self._give_back(node, ids)
                continue
            if (self.acks or self.nacks or self.retries) and not self.carrying:
                for op, items in self.take():
                    if op == "retry":  # one command per job, in one round trip
                        group = [(op, items)]
                        try:
                            results = await client.pipeline(outcome_calls(group))
                        except DisqueError as exc:
                            results = [exc] * len(items)
                        self.answered(group, results)
                        continue
                    try:
                        await getattr(client, op)(*items)
                    except DisqueError as exc:
                        self.settled(op, len(items), exc)
                    else:
                        self.settled(op, len(items), None)
                continue
            if self.done and not (self.acks or self.nacks or self.retries):
                return
            await self.wake.wait()

    # ------------------------------------------------------------ jobs given back
    async def _give_back(self, node: Any, ids: list[str]) -> None:
        """RELEASE ``ids`` on ``node`` (see the module docstring); their slots are free once
        the node answered."""
        here = getattr(self.client, "current_address", None)
        if node is not None and node != here:
            try:
                await self._give_back_on(node, ids, lambda op: self._elsewhere(node, op, ids))
                return
            except DisqueError as exc:  # unreachable: its copies' holders can take them
                log.info("giving back %d job(s) to %s:%s failed (%s): through the client's node instead",
                         len(ids), node[0], node[1], exc)  # fmt: skip
        try:
            await self._give_back_on(here, ids, lambda op: getattr(self.client, op)(*ids))
        except DisqueError as exc:
            self.settled("release", len(ids), exc)

    async def _give_back_on(self, node: Any, ids: list[str], send: Callable[[str], Awaitable[int]]) -> None:
        """RELEASE with ``send`` (ENQUEUE on a node known not to have it); a refusal settles the
        jobs with an error, a connection lost is raised."""
        op = "enqueue" if node in self.no_release else "release"
        try:
            try:
                queued = await send(op)
            except ServerError as exc:
                if op != "release" or not unknown_command(exc):
                    raise
                self.no_release.add(node)
                log.warning("the node%s does not know RELEASE (a Disque node?): jobs not started are given back "
                            "there with ENQUEUE, which counts their delivery",
                            "" if node is None else " at %s:%s" % node)  # fmt: skip
                op = "enqueue"
                queued = await send(op)
        except ServerError as exc:
            self.settled(op, len(ids), exc)
            return
        if queued < len(ids):  # acknowledged meanwhile, queued again already, or not held there
            log.info("%s: %d of %d job(s) queued again", OPS[op].decode(), queued, len(ids))
        self.settled(op, len(ids), None)

    async def _elsewhere(self, address: Any, op: str, ids: list[str]) -> int:
        """``op`` for ``ids`` on the node at ``address``, on a connection of its own (in a thread)."""
        argv = (OPS[op], *[i.encode() for i in ids])
        return await trio.to_thread.run_sync(_request_at, address, self.client.config, argv, abandon_on_cancel=True)


def unknown_command(error: ServerError) -> bool:
    """The node does not know the command (``-ERR unknown command '...'``)."""
    return error.code == "ERR" and error.message.lower().startswith("unknown command")


def _request_at(address: Any, config: Any, argv: tuple[Any, ...]) -> Any:
    conn = NodeConnection(address, config)
    try:
        return conn.request(argv, config.socket_timeout)
    finally:
        conn.close()
