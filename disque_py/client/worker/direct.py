"""Direct mode: handler threads that run dry fetch for themselves, on the fetch path's rounds.

Each job otherwise crosses threads twice per round: the trio fetcher wakes a handler thread,
the thread wakes the trio collector (~100 µs together on a small VM, more than a whole round
trip to the node). So when the fetcher has nothing to do but wait for outcomes (every slot in
flight, none pending, no pause, handlers quick, no heartbeats), it *lends* its role to the
threads (:meth:`~.threads.HandlerThreads.lend`): a thread that runs dry sends the ACKs of the jobs
done in direct mode and ``GETJOB NOHANG COUNT <free slots>``, the same :class:`~.fetch.Round` the
fetcher sends, on a blocking connection of its own to the same node, and runs what comes back,
with no thread hand-over at all. One thread at a time does such a round trip (``leading``); it
counts in-flight jobs exactly as the fetcher does (:class:`~.fetch.FetchPath`), so
``max_in_flight`` holds.

Direct mode closes, and the trio side takes over as before, when a round trip brings no job or
fails (the trio client then fails over; direct mode stays off for ``DIRECT_RETRY`` seconds), on
a handler failure or a job to dead-letter, on stop, or when the trio fetcher, checking every
``HELPER_DELAY`` (every ``OUTCOME_LINGER`` with one thread), sees a handler running longer than
that: ACKs must not wait behind a slow handler and buffered jobs then need the other threads.
ACKs not sent yet are handed to the trio side (``handed``), jobs a round trip brought after the
close go to it too (``late``), and the counts travel as a :class:`~.stats.Counters` of deltas
(``delta``) that the trio side adds to the worker's.

Everything here runs under the handler threads' lock (``cond``), which a round trip releases
while it waits for the node.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from typing import Any

from ..model import Job
from ..connection import NodeConnection  # a blocking connection to one node
from .acks import count_settled
from .fetch import FetchPath, Round
from .handlers import describe_error
from .stats import Counters

__all__ = ["DirectFetch", "DIRECT_RETRY", "DIRECT_FETCH"]

log = logging.getLogger("disque_py.worker")

#: Seconds the handler threads stop fetching for themselves after their
#: connection failed (the trio fetcher, which fails over, goes on).
DIRECT_RETRY = 1.0

#: Whether handler threads may fetch for themselves; off, every round goes through the trio fetcher.
DIRECT_FETCH = True


class DirectFetch:
    """Direct mode's state and round trips (see the module docstring).

    ``post()`` wakes the trio side's collector (under the lock); ``client`` is the trio
    client, whose node and settings the direct connection uses; ``counters`` the worker's
    (only ``starved`` is written directly, as the fetcher does).
    """

    def __init__(self, cond: threading.Condition, post: Callable[[], None], client: Any, path: FetchPath,
                 ack_op: str, counters: Counters) -> None:  # fmt: skip
        self.cond = cond
        self.post = post
        self.client = client
        self.path = path
        self.op = ack_op
        self.counters = counters
        self.open = False  # the trio fetcher lends its role
        self.leading = False  # a thread is in a round trip
        self.acks: list[str] = []  # done in direct mode, ACK not sent yet
        self.address: Any = None
        self.retry_at = 0.0  # time.monotonic() before which direct mode does not open (failed)
        self.rounds = 0  # round trips, so far
        self.conn: NodeConnection | None = None
        self.base_in_flight = 0  # the worker's in-flight count when it opened, as of the last take
        # For the trio side to take (take()): what direct mode did since the last take.
        self.dirty = False
        self.delta = Counters()
        self.handed: list[str] = []  # ACKs left to the trio side (direct mode closed)
        self.late: list[Job] = []  # jobs a round trip brought after direct mode closed

    # ---------------------------------------------------------- thread side (under the lock)
    def done(self, job: Job) -> None:
        """A handler returned in direct mode: its ACK goes with the next round trip."""
        self.acks.append(job.id)
        self.delta.processed += 1
        self.dirty = True

    def round(self) -> list[Job] | None:
        """In direct mode with nothing buffered: one round trip (the lock is released
        meanwhile). Returns its jobs for the buffer; closes direct mode when the round trip
        brings nothing or fails."""
        acks, self.acks = self.acks, []
        free = self.path.free(self.base_in_flight + self.delta.in_flight, len(acks))
        if free <= 0:  # slots held by outcomes the trio side sends
            self.acks = acks
            self.close()
            return None
        self.leading = True
        self.rounds += 1
        rnd = self.path.round([(self.op, acks)] if acks else [], free)
        address = self.address
        self.cond.release()
        results: list[Any] | BaseException
        try:
            results = self._send(address, rnd)
        except BaseException as exc:  # noqa: BLE001 - reported below, under the lock
            results = exc
        finally:
            self.cond.acquire()
            self.leading = False
        delta = self.delta  # (the trio side may have taken the last one meanwhile)
        self.dirty = True
        if not self.open:
            self.post()  # closed meanwhile: the trio side waits for this round trip to end
        if acks:
            if isinstance(results, BaseException):
                self.handed += acks  # maybe not sent: sent again (a second ACK is harmless)
            else:
                error = results[0]
                count_settled(delta, self.op, len(acks), error if isinstance(error, BaseException) else None)
        got: Any = results if isinstance(results, BaseException) else results[-1]
        if isinstance(got, BaseException):  # lost, refused or unreadable: the trio side goes on
            self.close()
            self.retry_at = time.monotonic() + DIRECT_RETRY
            self.drop_connection()
            log.info("direct fetching off for %.1f s: %s", DIRECT_RETRY, describe_error(got))
            if not isinstance(got, Exception):
                raise got
            return None
        jobs: list[Job] = got
        self.counters.starved = self.path.took(delta, jobs, free)
        if not jobs:
            self.close()
        elif self.open:
            return jobs
        else:
            self.late += jobs
        return None

    def _send(self, address: Any, rnd: Round) -> list[Any]:
        """The round on the direct connection (connecting first if needed), without the lock."""
        conn = self.conn
        config = self.client.config
        if conn is None or conn.address != address:
            self.drop_connection()
            conn = self.conn = NodeConnection(address, config)
        replies = conn.request_many(rnd.argvs(), config.read_timeout(rnd.getjob))
        replies[-1] = rnd.jobs_of(replies[-1])
        return replies

    def drop_connection(self) -> None:
        conn, self.conn = self.conn, None
        if conn is not None:
            conn.close()

    def close(self) -> None:
        """End direct mode; ACKs not sent go to the trio side."""
        if self.open:
            self.open = False
            if self.acks:
                self.handed += self.acks
                self.acks = []
            self.dirty = True
            self.post()

    # ---------------------------------------------------------- trio side (under the lock)
    def start(self, in_flight: int, address: Any) -> None:
        """Open direct mode: the worker has ``in_flight`` jobs in flight, its client is on ``address``."""
        self.open = True
        self.base_in_flight = in_flight
        self.address = address

    def take(self) -> tuple[Counters, list[str], list[Job]]:
        """What direct mode did since the last take: its counts, the ACKs and the jobs it left to
        the trio side."""
        taken = (self.delta, self.handed, self.late)
        self.base_in_flight += self.delta.in_flight
        self.delta = Counters()
        self.handed, self.late = [], []
        self.dirty = False
        return taken
