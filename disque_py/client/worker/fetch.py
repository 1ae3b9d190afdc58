"""Fetching: the one path by which jobs come in, and the fetcher that drives it on trio.

A *round* (:class:`Round`) is the pending outcomes, then ``GETJOB NOHANG COUNT <free slots>
WITHCOUNTERS``, in one round trip: the node runs the outcomes first, so the slots they free are
refilled at once without ever exceeding ``max_in_flight``. A job is *in flight* from the moment
GETJOB returns it until its ACKJOB/FASTACK/NACK got a reply, and there are never more than
``max_in_flight`` of them (so the node never shows more than that many of our jobs
``active``). :class:`FetchPath` builds rounds and counts what they bring, for whoever sends them:
the trio fetcher (:class:`Fetcher`, through the client's pipeline) or a handler thread in direct
mode (:mod:`.direct`, on a blocking connection of its own).

The fetcher (:meth:`Fetcher.run`): one round at a time, where ``n`` is the number of free
slots. With no outcome to carry its GETJOB blocks (not NOHANG) up to ``fetch_timeout_ms``,
and the acker (:mod:`.acks`) sends the outcomes that end meanwhile. It batches: while the
handlers still have buffered jobs it waits until half of the slots are free (it is woken only
then, or when a runner runs dry), so outcomes and jobs move in batches, as in a hand-written
pipelined loop, while the handlers keep working; pending outcomes wait at most
``OUTCOME_LINGER`` seconds for that. It asks the pause (:mod:`.pause`) before each round,
fetches a single probe job when the pause says so, and stops after its current GETJOB on a stop.
"""

from __future__ import annotations

import logging
from collections import deque
from collections.abc import Awaitable, Callable, Sequence
from typing import Any

import trio

from .. import commands as cmd
from ..cluster import Backoff
from ..errors import AuthError, DisqueError
from ..model import Job
from .acks import Acks, Groups, outcome_argvs, outcome_calls
from .handlers import describe_error
from .pause import FailureGate
from .stats import Counters
from .stop import Stop
from .wakeup import Wakeup

__all__ = ["FetchPath", "Round", "Fetcher", "OUTCOME_LINGER"]

log = logging.getLogger("disque_py.worker")

#: Seconds an outcome (ACK/NACK) may wait to travel with a bigger batch.
OUTCOME_LINGER = 0.005


class Round:
    """One round trip of the fetch path (no I/O): the outcomes ``groups`` it carries, then
    ``getjob`` for ``asked`` jobs, sent in order on one connection: as the client's pipeline
    takes them (:meth:`calls`) or as a raw connection does (:meth:`argvs`, :meth:`jobs_of`)."""

    __slots__ = ("groups", "getjob", "asked")

    def __init__(self, groups: Groups, getjob: cmd.Call[list[Job]], asked: int) -> None:
        self.groups = groups
        self.getjob = getjob
        self.asked = asked

    def calls(self) -> list[cmd.Call[Any]]:
        calls = outcome_calls(self.groups)
        calls.append(self.getjob)
        return calls

    def argvs(self) -> list[tuple[Any, ...]]:
        argvs = outcome_argvs(self.groups)
        argvs.append(self.getjob.argv)
        return argvs

    def jobs_of(self, reply: Any) -> list[Job] | BaseException:
        """GETJOB's raw reply read as jobs; its error, or a DisqueError for a reply of the wrong
        shape, as a value."""
        if isinstance(reply, BaseException):
            return reply
        try:
            return self.getjob.parse(reply)
        except Exception as exc:  # noqa: BLE001 - a reply that is not GETJOB's shape
            return DisqueError("unreadable GETJOB reply: %s" % describe_error(exc))

    @staticmethod
    def jobs(results: list[Any]) -> list[Job]:
        """The jobs the round brought (its last result), or the error GETJOB got, raised."""
        got = results[-1]
        if isinstance(got, BaseException):
            raise got
        return got


class FetchPath:
    """How many jobs a round may ask for, the round itself, and what its jobs count for."""

    def __init__(self, queues: Sequence[str | bytes], max_in_flight: int) -> None:
        self.queues = queues
        self.max_in_flight = max_in_flight
        self._getjob_calls: dict[int, cmd.Call[list[Job]]] = {}

    def free(self, in_flight: int, pending: int) -> int:
        """Slots a round may fill: outcomes in the same round free theirs first."""
        return self.max_in_flight - in_flight + pending

    def getjob(self, count: int) -> cmd.Call[list[Job]]:
        call = self._getjob_calls.get(count)
        if call is None:
            call = self._getjob_calls[count] = cmd.getjob(self.queues, count=count, nohang=True, with_counters=True)
        return call

    def round(self, groups: Groups, count: int) -> Round:
        return Round(groups, self.getjob(count), count)

    @staticmethod
    def took(counts: Counters, jobs: list[Job], asked: int) -> bool:
        """Jobs a round brought: fetched, and in flight until their outcomes are answered.
        True if they are fewer than asked for (nothing more is available right now: starved)."""
        n = len(jobs)
        counts.fetched += n
        counts.in_flight += n
        return n < asked


class Fetcher:
    """The trio fetcher (see the module docstring).

    ``arrived(n)``: the run stage's, told of ``n`` new jobs in the buffer; ``done()``: told
    when the fetcher returns; ``lend``: the handler threads' direct mode, tried when the fetcher
    has nothing to do but wait for outcomes (True if it ran).
    """

    def __init__(self, client: Any, queues: Sequence[str | bytes], *, max_in_flight: int, fetch_timeout_ms: int,
                 counters: Counters, acks: Acks, gate: FailureGate, stop: Stop, buffer: deque[Job],
                 wake: Wakeup, rng: Any) -> None:  # fmt: skip
        self.client = client
        self.queues = queues
        self.path = FetchPath(queues, max_in_flight)
        self.fetch_timeout_ms = fetch_timeout_ms
        self.counters = counters
        self.acks = acks
        self.gate = gate
        self.stop = stop
        self.buffer = buffer
        self.wake = wake  # outcomes, free slots, gate or stop
        self.rng = rng
        self.backoff = Backoff(initial=0.1, maximum=5.0)  # after a failed GETJOB
        self.done = False
        self.arrived: Callable[[int], None] = lambda n: None
        self.on_done: Callable[[], None] = lambda: None
        self.lend: Callable[[], Awaitable[bool]] | None = None

    async def run(self) -> None:
        """Fetch while there are free slots; carry pending outcomes in front of the GETJOB."""
        errors = 0
        flush = False
        path, acks, gate, stop, counters, buffer = self.path, self.acks, self.gate, self.stop, self.counters, self.buffer
        arrived = self.arrived
        try:
            while not stop.stopping:
                limit, wait_until = gate.allowance(trio.current_time())
                if wait_until is not None:
                    acks.carry(False)
                    with trio.move_on_at(wait_until):
                        await stop.event.wait()
                    continue
                pending = len(acks.acks) + len(acks.nacks) + len(acks.retries)
                free = path.free(counters.in_flight, pending)
                if limit is not None:
                    free = min(free, limit)
                elif buffer and free < acks.batch_min and not flush:
                    free = 0  # runners still have work: wait until half the slots are free
                if free <= 0:
                    if limit is None and not pending and self.lend is not None and await self.lend():
                        continue
                    # Full: the next outcome frees a slot and we carry it. Held back
                    # by the gate (probing): the acker sends outcomes meanwhile.
                    acks.carry(limit is None)
                    if pending and limit is None:
                        # ...but outcomes never wait long for a batch: a late ACK
                        # could let the node requeue a job that is done
                        with trio.move_on_after(OUTCOME_LINGER) as linger:
                            await self.wake.wait()
                        flush = linger.cancelled_caught
                    else:
                        await self.wake.wait()
                    continue
                flush = False
                groups = acks.take()
                acks.carry(bool(groups))  # a NOHANG exchange is quick: new outcomes can wait for it
                asked = self.address()
                try:
                    got = await self._exchange(groups, free)
                except AuthError as exc:  # no retry can fix a password: stop, raise it from run()
                    log.error("GETJOB failed: %s", exc)
                    stop.fatal(exc)
                    return
                except DisqueError as exc:
                    delay = self.backoff.delay(errors, self.rng)
                    errors += 1
                    log.warning("GETJOB failed (%s); again in %.2f s", exc, delay)
                    acks.carry(False)
                    with trio.move_on_after(delay):
                        await stop.event.wait()
                    continue
                errors = 0
                if got:  # from the node asked (or connected to), unless the client moved meanwhile: not known
                    answered = self.address()
                    stop.fetched(answered if asked is None or answered == asked else None)
                counters.starved = path.took(counters, got, free)
                if limit == 1 and got:
                    gate.took_probe(got[0].id)
                if stop.stopping:
                    for job in got:
                        stop.give_back(job)
                elif got:
                    buffer.extend(got)
                    arrived(len(got))
        finally:
            acks.carry(False)
            self.done = True
            self.on_done()

    def address(self) -> Any:
        """The node the client uses now (None for a client that does not say)."""
        return getattr(self.client, "current_address", None)

    async def _exchange(self, groups: Groups, count: int) -> list[Job]:
        """Send ``groups`` and fetch up to ``count`` jobs (blocking only when there is nothing to send)."""
        if not groups:
            self.acks.carry(False)  # the acker takes over while we block
            return await self.client.get_jobs(
                *self.queues, count=count, timeout_ms=self.fetch_timeout_ms, with_counters=True
            )
        calls = self.path.round(groups, count).calls()
        try:
            results = await self.client.pipeline(calls)
        except DisqueError as exc:
            self.acks.answered(groups, [exc] * (len(calls) - 1))
            raise
        except BaseException:  # cancelled: the acker sends them (again: ACK twice is harmless)
            self.acks.put_back(groups)
            raise
        self.acks.answered(groups, results[:-1])
        return Round.jobs(results)
