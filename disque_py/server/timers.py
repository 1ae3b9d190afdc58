"""Time-driven work of a node: the core's timers and the cron.

:class:`CoreTimers` runs ``Node.tick`` when the core's next wake-up is due
(requeues, ack GC, replication retries, NEEDJOBS, held-back bus messages).
While the client loop waits in its own epoll (:mod:`.waiting`) the loop runs
them itself: it calls :meth:`CoreTimers.due` after every pass and waits no
longer than the time it returns, so a timer costs no trio task switch,
cancel scope or deadline. When the loop waits through trio instead (another
I/O backend, a virtual clock in tests, two nodes in one trio run), the trio
task :meth:`CoreTimers.run` runs them, woken by :meth:`CoreTimers.poke`
when an input may have set an earlier timer. The client loop decides which
(:meth:`CoreTimers.hand_over`). Before each tick the cluster service says
which peers' links are backlogged, and the bus holds what the tick sends so
that it leaves in one write per peer.

:class:`Cron` is the 100 ms task: ops/s sampling (INFO), what is added to
``every_step`` (the memory measure, ``Dispatcher.measure_memory``), and once a second
the client checks (output limits, idle timeouts; the client loop's
``check_clients``) and the periodic full garbage collection (:mod:`.gcpolicy`).

Both are started by the node (:mod:`.app`); what they act on is handed to
them (the core, callables, the bus owner), not looked up. With the latency
monitor on (``latency`` set, threshold > 0) a tick is timed as the
``expire-cycle`` event and a cron step as ``cron`` (:mod:`.latency`).
"""

from __future__ import annotations

import math
from time import perf_counter_ns
from typing import TYPE_CHECKING, Any, Callable

import trio

from . import gcpolicy
from .contracts import now_ms

if TYPE_CHECKING:
    from ..config import Config
    from ..core.node import Node
    from .contracts import BusGlue
    from .latency import LatencyMonitor

__all__ = ["CoreTimers", "Cron"]


class CoreTimers:
    """The core's timers. ``apply_effects`` carries out what a tick produced; ``glue`` (the
    cluster service, may be set after construction) gives the bus and the backlogged peers."""

    def __init__(self, node: "Node", apply_effects: Callable[[], None], glue: "BusGlue | None" = None) -> None:
        self.node = node
        self._apply_effects = apply_effects
        self.glue = glue
        self.lot = trio.lowlevel.ParkingLot()
        self.deadline: int | None = None  # what the timer task sleeps until (ms), None: no timer
        self.loop_runs_timers = False  # see hand_over
        self.latency: "LatencyMonitor | None" = None  # set by the node: slow ticks are recorded

    def hand_over(self, to_loop: bool) -> None:
        """The client loop takes the core's timers over (True) or gives them back (False)."""
        self.loop_runs_timers = to_loop
        self.lot.unpark_all()

    def poke(self) -> None:
        """An input may have set an earlier timer: wake the timer task if it sleeps past it."""
        if self.loop_runs_timers:
            return  # the loop looks at the next timer after every pass
        nxt = self.node.next_wakeup()
        if nxt is not None and (self.deadline is None or nxt < self.deadline):
            self.lot.unpark_all()

    def due(self) -> float:
        """Run the core's timers if one is due; the seconds left until the next one."""
        node = self.node
        nxt = node.next_wakeup()
        if nxt is None:
            return math.inf
        now = now_ms()
        if nxt <= now:
            self._tick()
            nxt = node.next_wakeup()
            if nxt is None:
                return math.inf
            now = now_ms()
        return (nxt - now) / 1000.0

    def _tick(self) -> None:
        glue = self.glue
        bus = glue.bus if glue is not None else None
        if bus is not None:
            bus.hold()  # what the tick sends to peers leaves in one write per peer
        latency = self.latency
        start = perf_counter_ns() if latency is not None and latency.threshold_us else 0
        try:
            if glue is not None:
                self.node.ctx.backlogged = glue.backlogged()
            self.node.tick(now_ms())
            self._apply_effects()
        finally:
            if bus is not None:
                bus.release()
            if start:
                latency.observe("expire-cycle", start)

    async def run(self) -> None:
        """The timer task: runs the timers while the client loop does not."""
        node = self.node
        while True:
            if self.loop_runs_timers:
                self.deadline = None
                await self.lot.park()
                continue
            nxt = node.next_wakeup()
            self.deadline = nxt
            deadline = math.inf if nxt is None else nxt / 1000.0
            with trio.move_on_at(deadline):
                await self.lot.park()
            if not self.loop_runs_timers:
                self._tick()


class Cron:
    """Every 100 ms: ops/s samples; every second: ``check_clients(timeout)``, the GC policy and
    ``every_second`` (the workers' table drops the silent ones)."""

    PERIOD = 0.1

    def __init__(self, config: "Config", stats: dict[str, int], check_clients: Callable[[float], None]) -> None:
        self.config = config
        self.stats = stats
        self.check_clients = check_clients
        self._ops_samples: list[int] = [0] * 16
        self._ops_idx = 0
        self._last_ops = 0
        self.every_step: list[Callable[[], None]] = []  # run every PERIOD (the memory measure)
        self.every_second: list[Callable[[], Any]] = []  # run every 10th step
        self.latency: "LatencyMonitor | None" = None  # set by the node: slow steps are recorded

    async def run(self) -> None:
        while True:
            await trio.sleep(self.PERIOD)
            self.step()

    def step(self) -> None:
        latency = self.latency
        start = perf_counter_ns() if latency is not None and latency.threshold_us else 0
        self._step()
        if start:
            latency.observe("cron", start)

    def _step(self) -> None:
        total = self.stats.get("total_commands_processed", 0)
        self._ops_samples[self._ops_idx % len(self._ops_samples)] = (total - self._last_ops) * 10
        self._ops_idx += 1
        self._last_ops = total
        for step in self.every_step:
            step()
        if self._ops_idx % 10 == 0:
            self.check_clients(self.config.timeout)
            gcpolicy.policy.maybe_full()
            for step in self.every_second:
                step()

    def instantaneous_ops(self) -> int:
        n = min(self._ops_idx, len(self._ops_samples))
        return sum(self._ops_samples[:n]) // n if n else 0
