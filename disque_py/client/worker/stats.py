"""What a worker counts: :class:`Counters` (written by the stages, in the trio thread) and
:class:`WorkerStats`, the frozen snapshot :meth:`Worker.stats` returns."""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["WorkerStats", "Counters"]


@dataclass(frozen=True, slots=True)
class WorkerStats:
    """Counters since the worker started.

    ``processed``: handler succeeded (the job is acknowledged, or about
    to be); ``failed``: handler raised; ``retried``: jobs NACKed (failures
    below ``max_attempts``, and jobs whose handler the end of the grace period
    cut short); ``dead``: jobs dead-lettered (NACK DEAD sent, or the custom
    handler done); ``in_flight``: fetched and not yet ACKed/NACKed/released
    (the node's answer counts); ``running``: handlers running (a handler
    thread counts from taking its job); ``backoffs``: failure backoffs
    started; ``ack_errors``: ACK/NACK/RELEASE commands that failed;
    ``starved``: see :meth:`Worker.starved`; ``released``: jobs fetched and
    never started, given back at a stop (RELEASE: no attempt used; neither a
    failure nor a retry).
    """

    fetched: int
    processed: int
    failed: int
    retried: int
    dead: int
    in_flight: int
    running: int
    backoffs: int
    ack_errors: int
    starved: bool
    released: int = 0

    def __str__(self) -> str:
        """The counters as one line for people and for grep (the worker's exit line):
        ``processed=12 failed=1 retried=1 dead=0 released=3 fetched=16 in_flight=0 running=0 backoffs=0
        ack_errors=0``."""
        return ("processed=%d failed=%d retried=%d dead=%d released=%d fetched=%d in_flight=%d running=%d "
                "backoffs=%d ack_errors=%d" % (self.processed, self.failed, self.retried, self.dead, self.released,
                                               self.fetched, self.in_flight, self.running, self.backoffs,
                                               self.ack_errors))  # fmt: skip


class Counters:
    """The worker's counts, shared by its stages. ``in_flight``: fetched and not settled (the
    node answered the ACK/NACK), never above ``max_in_flight``; ``running``: async handlers
    running (the handler threads count theirs); ``starved``: the last fetch got fewer jobs than
    it asked for."""

    __slots__ = ("fetched", "processed", "failed", "retried", "dead", "released", "in_flight", "running",
                 "backoffs", "ack_errors", "starved")  # fmt: skip

    def __init__(self) -> None:
        self.fetched = self.processed = self.failed = self.retried = self.dead = self.released = 0
        self.in_flight = self.running = self.backoffs = self.ack_errors = 0
        self.starved = False
