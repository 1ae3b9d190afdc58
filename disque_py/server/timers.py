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

:class:`Cron` is the 100 ms step: ops/s sampling (INFO), what is added to
``every_step`` (the memory measure, ``Dispatcher.measure_memory``) and once a second the
periodic full garbage collection (:mod:`.gcpolicy`); its ``check_step``, a periodic step of its
own, a slice of the client checks (output limits, idle timeouts; the client loop's
``check_clients``: each client about once a second, a slice of about 30 µs at most).

The periodic steps (the cron's and the cluster's 100 ms tick, Disque's
``serverCron`` and ``clusterCron``) run with the core's timers, added with
:meth:`CoreTimers.every_period`: while the loop waits directly they cost one
return from its ``epoll.poll`` each 100 ms and no trio task, sleep or cancel
scope (three trio tasks sleeping 100 ms or 1 s were most of an idle node's
CPU: each sleep is a cancel scope whose deadline fires a ``Cancelled`` through
trio's machinery). When the loop waits through trio, :meth:`CoreTimers.run`
runs them at the same times.

The timers are started by the node (:mod:`.app`); what they act on is handed to
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

__all__ = ["CoreTimers", "Cron", "PERIOD_MS"]

#: The periodic steps' period (ms): Disque's cron runs 10 times a second (hz 10).
PERIOD_MS = 100

#: How long one run of the core's timers may go on ticking (ns): a tick runs a bounded batch of
#: the job wake-ups due (``Node.tick``); while more are due the run ticks again, as long as a tick
#: as long as the last one still fits in this, and leaves the rest to the loop's next pass.
TICK_SLICE_NS = 60_000

#: How long the periodic steps due may run back to back (ns) before the next one waits for the
#: loop's next pass (CoreTimers.due).
STEPS_SLICE_NS = 50_000

# What a periodic step left (CoreTimers._run_periodic): the round is over, its next step is due
# now, or the same step again after a pass of the loop (it returned 0).
_DONE, _NEXT, _AGAIN = 0, 1, 2


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
        self._periodic: list[Callable[[], int | None]] = []  # the periodic steps (every_period)
        self._periodic_at = 0  # ms: when they run next
        self._periodic_next = 0  # the step to run next (one a call: _run_periodic)
        self._period_wanted = PERIOD_MS  # the shortest period the steps run so far asked for

    def every_period(self, step: Callable[[], int | None]) -> None:
        """Run ``step`` periodically from now on, with the others, in the order added (the cron's
        step, the cluster's tick), back to back while they are short (``due``). Each returns the
        ms it wants until the next run (None: :data:`PERIOD_MS`); all run again after the
        shortest of them. A step that returns 0 has more to do in this round: it runs again
        after the loop's next pass, before the round's next step (the cluster's tick sends its
        PINGs so, a few a call). What a step produces it carries out itself
        (``apply_effects``)."""
        if not self._periodic:
            self._periodic_at = now_ms() + PERIOD_MS
        self._periodic.append(step)
        self.lot.unpark_all()  # the timer task's deadline may be later

    def _run_periodic(self, now: int) -> int:
        """The next of the periodic steps due, so that the loop can make a pass between two of
        them (``due`` runs them back to back for STEPS_SLICE_NS at most): ``_NEXT`` when the
        round's next step is due now, ``_AGAIN`` when this one returned 0 (more of its work is
        due, after a pass of the loop), ``_DONE`` when the round is over."""
        i = self._periodic_next
        wanted = self._periodic[i]()
        if wanted == 0:
            return _AGAIN
        wanted = wanted or PERIOD_MS
        if not i or wanted < self._period_wanted:
            self._period_wanted = wanted
        i += 1
        if i < len(self._periodic):
            self._periodic_next = i
            return _NEXT
        self._periodic_next = 0
        period = self._period_wanted
        # The next run one period after this one was due, so late wake-ups do not drift; after
        # a long stall (a clock jump, a stopped process) one period from now, with no catching up.
        due = self._periodic_at + period
        self._periodic_at = due if due > now else now + period
        return _DONE

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
        """Run the core's timers and the periodic steps if due; the seconds left until the next."""
        node = self.node
        nxt = node.next_wakeup()
        periodic = self._periodic_at if self._periodic else None
        if nxt is None and periodic is None:
            return math.inf
        now = now_ms()
        if periodic is not None and periodic <= now:
            # The steps due run back to back while they are short (an idle node's: one wake-up
            # for all of them), and the next waits for the loop's next pass once they have run
            # for STEPS_SLICE_NS: a job arriving meanwhile waits behind one slice, not their sum.
            # A step with more to do (it returned 0) goes on after the loop's next pass.
            began = perf_counter_ns()
            while more := self._run_periodic(now):
                if more == _AGAIN or perf_counter_ns() - began > STEPS_SLICE_NS:
                    return 0.0  # the next step after the loop's next pass
            periodic = self._periodic_at
            nxt = node.next_wakeup()
        if nxt is not None and nxt <= now:
            self._tick()
            nxt = node.next_wakeup()
            now = now_ms()
        if periodic is not None and (nxt is None or periodic < nxt):
            nxt = periodic
        if nxt is None:
            return math.inf
        return (nxt - now) / 1000.0

    def _tick(self) -> None:
        glue = self.glue
        bus = glue.bus if glue is not None else None
        if bus is not None:
            bus.hold()  # what the tick sends to peers leaves in one write per peer
        latency = self.latency
        start = perf_counter_ns() if latency is not None and latency.threshold_us else 0
        try:
            node = self.node
            if glue is not None:
                node.ctx.backlogged = glue.backlogged()
            # A tick runs a bounded batch of what is due (Node.tick): more ticks while they are
            # due, for TICK_SLICE_NS at most, and what is left waits for the loop's next pass.
            # A tick starts only if one as long as the last still fits.
            now = now_ms()
            began = t = perf_counter_ns()
            node.tick(now)
            until = began + TICK_SLICE_NS
            while True:
                last, t = t, perf_counter_ns()
                if t + (t - last) > until:
                    break
                nxt = node.next_wakeup()
                if nxt is None or nxt > now:
                    break
                node.tick(now)
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
            if self._periodic and (nxt is None or self._periodic_at < nxt):
                nxt = self._periodic_at
            self.deadline = nxt
            deadline = math.inf if nxt is None else nxt / 1000.0
            with trio.move_on_at(deadline):
                await self.lot.park()
            if not self.loop_runs_timers:
                now = now_ms()
                if self._periodic and self._periodic_at <= now:
                    self._run_periodic(now)
                self._tick()


class Cron:
    """Disque's serverCron: ops/s samples and ``every_step`` (:meth:`step`, run by the core's
    timers: ``CoreTimers.every_period``), and a slice of the client checks
    (``check_clients(timeout, hz)``, each client about once a second: :meth:`check_step`, a
    periodic step of its own); once a second the GC policy and ``every_second`` (the workers'
    table drops the silent ones). Every 100 ms while the node is busy
    (a command, or a job-layer message from a peer: ``activity``, in the last second), every second
    while it is idle."""

    PERIOD = PERIOD_MS / 1000.0
    IDLE_MS = 1000  # the step's period while nothing happens
    ACTIVE_FOR_MS = 1000  # busy this long after the last command or peer's job message

    def __init__(self, config: "Config", stats: dict[str, int], check_clients: Callable[[float, int], Any]) -> None:
        self.config = config
        self.stats = stats
        self.check_clients = check_clients
        self._ops_samples: list[int] = [0] * 16
        self._ops_idx = 0
        self._last_ops = 0
        self.every_step: list[Callable[[], None]] = []  # run at every step (the memory measure)
        self.every_second: list[Callable[[], Any]] = []  # run once a second
        self.latency: "LatencyMonitor | None" = None  # set by the node: slow steps are recorded
        self.activity: Callable[[], int] = lambda: 0  # a count that grows with peers' job messages (the bus's)
        self._last_activity = 0
        self._last_at: int | None = None  # ms of the last step
        self._second_at = 0  # ms: the once-a-second work is due
        self._busy_until = 0  # ms
        self._period = PERIOD_MS  # the step's period (ms) as the last step decided

    def step(self) -> int:
        """One step; the ms until it wants the next."""
        latency = self.latency
        start = perf_counter_ns() if latency is not None and latency.threshold_us else 0
        wanted = self._step(now_ms())
        if start:
            latency.observe("cron", start)
        return wanted

    def check_step(self) -> int:
        """A slice of the client checks, each client about once a second (``check_clients``,
        clients.py): a periodic step of its own, after :meth:`step` (``every_period``), so that
        the loop makes a pass between the two; at the step's period, and every 100 ms while a
        round over the clients is not done (more clients than a slice covers: an idle node
        with thousands of clients still looks at each within seconds, not minutes)."""
        period = self._period
        done = self.check_clients(self.config.timeout, 1000 // period)
        return period if done else PERIOD_MS

    def _step(self, now: int) -> int:
        total = self.stats.get("total_commands_processed", 0)
        activity = self.activity()
        elapsed = now - self._last_at if self._last_at is not None else PERIOD_MS
        self._last_at = now
        # ops/s over the time since the last step (a step of an idle node covers a second)
        self._ops_samples[self._ops_idx % len(self._ops_samples)] = (total - self._last_ops) * 1000 // max(elapsed, 1)
        self._ops_idx += 1
        if total != self._last_ops or activity != self._last_activity:
            self._busy_until = now + self.ACTIVE_FOR_MS
        self._last_ops = total
        self._last_activity = activity
        for step in self.every_step:
            step()
        self._period = period = PERIOD_MS if now < self._busy_until else self.IDLE_MS
        if not self._second_at:
            self._second_at = now + 1000  # a second after the first step
        elif now >= self._second_at:
            self._second_at = now + 1000 if now - self._second_at >= 1000 else self._second_at + 1000
            gcpolicy.policy.maybe_full()
            for step in self.every_second:
                step()
        return period

    def instantaneous_ops(self) -> int:
        n = min(self._ops_idx, len(self._ops_samples))
        return sum(self._ops_samples[:n]) // n if n else 0
