"""What the parts of the shell need of each other, as small typed contracts.

The shell is four parts composed by :mod:`.app`: the client loop
(:mod:`.clients`: accepts and reads connections), the dispatcher
(:mod:`.dispatch`: runs commands, carries out the core's effects), the timers
(:mod:`.timers`: the core's wake-ups and the cron) and the cluster service
(:mod:`.cluster`: the bus glue). None of them imports another; each is handed
the few callables or objects it uses, typed by the protocols below. This
module sits low in the import graph (it imports nothing of the shell but
:mod:`.connection`, and that only for types) so that every part can name
them.

It also holds the two things every part shares: the shell's clock
(:func:`now_ms`) and :data:`NO_REPLY`.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Iterable, Protocol

import trio

if TYPE_CHECKING:
    from cluster_bus.links import Bus

    from ..core.node import Node
    from .connection import Connection

__all__ = [
    "NO_REPLY",
    "now_ms",
    "shift_clock",
    "clock_shift_ms",
    "CommandRunner",
    "TimerControl",
    "BusHolder",
    "BusGlue",
    "OutputGate",
    "ClientOutput",
    "CoreHost",
]

NO_REPLY = object()  # a command handler answers nothing (SHUTDOWN closes the link)


_shift_ms = 0  # moved only by the fault hooks (:mod:`.faults`), for the chaos tests


def now_ms() -> int:
    """The time every input to the core is stamped with: trio's clock, in ms (plus the shift a
    fault hook may have set)."""
    return int(trio.current_time() * 1000) + _shift_ms


def shift_clock(ms: int) -> None:
    """Move :func:`now_ms` by ``ms`` from now on (the fault hooks' clock jump)."""
    global _shift_ms
    _shift_ms += ms


def clock_shift_ms() -> int:
    """How far :func:`now_ms` is from trio's clock, in ms."""
    return _shift_ms


class CommandRunner(Protocol):
    """What the client loop hands commands to (:class:`.dispatch.Dispatcher` in a node)."""

    def run_commands(self, conn: "Connection", commands: list[list[bytes]]) -> None:
        """Run ``commands`` of ``conn`` in order, encoding replies into ``conn.out``; park the
        rest in ``conn.pending`` when it blocks or its output reaches ``OUT_HOLD``."""

    def apply_effects(self) -> None:
        """Carry out what the commands run so far produced for others."""

    def client_closed(self, client_id: int) -> None:
        """A connection is gone (its blocked command, if any, is dropped)."""


class TimerControl(Protocol):
    """The core's timers as the client loop drives them (:class:`.timers.CoreTimers`)."""

    def hand_over(self, to_loop: bool) -> None:
        """The loop runs the timers itself from now on (True) or gives them back (False)."""

    def due(self) -> float:
        """Run the timers that are due; the seconds left until the next one."""

    def poke(self) -> None:
        """An input may have set an earlier timer: let the timer task look again."""


class BusHolder(Protocol):
    """Whoever owns the cluster bus: ``bus`` is None until it runs (:class:`.cluster.ClusterService`)."""

    bus: "Bus | None"


class OutputGate(Protocol):
    """What the client loop asks of the AOF (:class:`.aof.Aof`) before it sends output."""

    def hold_seq(self, conn: "Connection") -> int:
        """The AOF batch ``conn``'s output must wait for (its records, or output held before
        it); 0: none, send it. Clears ``conn.journaled``."""

    in_pass: bool  # set by the loop at a pass's start; kick clears it

    def kick(self) -> None:
        """The end of a pass: write what it journaled."""


class BusGlue(BusHolder, Protocol):
    """What the core's timers need of the cluster service before each tick."""

    def backlogged(self) -> frozenset[str]:
        """Reachable nodes whose link still holds unsent output."""


class ClientOutput(Protocol):
    """What the dispatcher needs of the client loop to deliver replies to other clients."""

    clients: dict[int, "Connection"]

    def send_soon(self, conn: "Connection") -> None: ...

    def resume_reading(self, conn: "Connection") -> None: ...


class CoreHost(Protocol):
    """What the cluster service needs of the node it glues the bus to
    (:class:`.cluster.CoreFeed` in a node; the bus simulation's own in tests)."""

    node: "Node"

    def apply_effects(self) -> None: ...

    def cluster_data(self, sender: str, items: Iterable[tuple[str, Any]]) -> None:
        """Job-layer messages from ``sender``, in order: feed them to the core."""
