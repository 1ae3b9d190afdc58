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
(:func:`now_ms`) and :data:`NO_REPLY` (the core's ``effects.NO_REPLY``, beside ``BLOCKED``:
compiled, the command stage reads it as a C static).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Callable, Iterable, Protocol

import trio

from ..core.effects import NO_REPLY

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
    "Commit",
    "ClientOutput",
    "CoreHost",
]

_shift_ms = 0  # moved only by the fault hooks (:mod:`.faults`), for the chaos tests
_clock_time: Callable[[], float] = trio.current_time  # see bind_clock


def now_ms() -> int:
    """The time every input to the core is stamped with: trio's clock, in ms (plus the shift a
    fault hook may have set)."""
    return int(_clock_time() * 1000) + _shift_ms


def bind_clock() -> Callable[[], None]:
    """Inside a node's trio run: :func:`now_ms` reads the run's clock object directly
    (``trio.current_time()`` goes through two more Python frames to reach it, and the client
    loop reads the time a few times per pass). Returns the undo, for the end of the run."""
    global _clock_time
    _clock_time = trio.lowlevel.current_clock().current_time

    def unbind() -> None:
        global _clock_time
        _clock_time = trio.current_time

    return unbind


def shift_clock(ms: int) -> None:
    """Move :func:`now_ms` by ``ms`` from now on (the fault hooks' clock jump)."""
    global _shift_ms
    _shift_ms += ms


def clock_shift_ms() -> int:
    """How far :func:`now_ms` is from trio's clock, in ms."""
    return _shift_ms


class CommandRunner(Protocol):
    """What the client loop hands commands to (:class:`.dispatch.Dispatcher` in a node)."""

    def run_commands(self, conn: "Connection", commands: list[list[bytes]]) -> bool:
        """Run ``commands`` of ``conn`` in order, encoding replies into ``conn.out``; park the
        rest in ``conn.pending`` when it blocks or its output reaches ``OUT_HOLD``. True if
        they journaled records: their replies then wait for the pass's commit."""

    def apply_effects(self) -> None:
        """Carry out what the commands run so far produced for others (through the
        :class:`ClientOutput` the runner was wired to)."""

    def client_closed(self, client_id: int) -> None:
        """A connection is gone (its blocked command, if any, is dropped); the loop applies
        the effects next."""


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

    def send_item(self, node_id: str, item: bytes, watch: Any = None) -> bool:
        """Queue a job-layer message (bus bytes) on ``node_id``'s link."""


class Commit(Protocol):
    """The commit stage of the client loop's pass: the AOF (:class:`.aof.Aof`).

    Tickets: a batch number, what held output and held bus messages wait for; the AOF
    calls the loop's ``release(seq)`` when batch ``seq`` (and every earlier one) is done.
    """

    def pending(self) -> bool:
        """Records are journaled and not done, and output must wait for them: a bus
        message made now waits for the pass's ticket."""

    def commit(self) -> int:
        """The end of a pass: take what it journaled (everysec/no: written now, one
        ``write``; always: to the writer task, written and fsynced off the loop). The ticket
        the pass's dependent output waits for; 0: nothing to wait for."""


class BusGlue(BusHolder, Protocol):
    """What the core's timers need of the cluster service before each tick."""

    def backlogged(self) -> frozenset[str]:
        """Reachable nodes whose link still holds unsent output."""


class ClientOutput(Protocol):
    """What the dispatcher needs of the client loop to carry out the core's effects."""

    clients: dict[int, "Connection"]

    def woken(self, conn: "Connection", depends: bool) -> None:
        """A reply was put in ``conn``'s output by somebody else's input (it was blocked);
        ``depends``: on records not done yet. The pass's end sends it and runs what
        ``conn`` pipelined behind its blocking command."""

    def send_item(self, node_id: str, item: bytes, watch: Any = None) -> bool:
        """A bus message: queued on the link now, or held until the records made
        before it are done."""


class CoreHost(Protocol):
    """What the cluster service needs of the node it glues the bus to
    (:class:`.cluster.CoreFeed` in a node; the bus simulation's own in tests)."""

    node: "Node"

    def apply_effects(self) -> None: ...

    def cluster_data(self, sender: str, items: Iterable[tuple[str, Any]]) -> None:
        """Job-layer messages from ``sender``, in order: feed them to the core."""
