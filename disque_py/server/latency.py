"""The latency monitor: events that took at least ``latency-monitor-threshold`` milliseconds.

As Redis's: each event (``command``, ``expire-cycle``, ``cron``, ``aof-write``,
``aof-fsync-always``) keeps its latest :data:`HISTORY_LEN` samples, one per
second (two in the same second keep the larger), and the largest ever
seen. Threshold 0 (the default) turns it off, and then the callers do not
even read the clock: they test ``threshold_us`` first.

Fed by the dispatcher (commands, :mod:`.dispatch`), the core's timers and
the cron (:mod:`.timers`) and the AOF (:mod:`.aof`), each with a one-line
hook; read by LATENCY LATEST | HISTORY | RESET | DOCTOR (:mod:`.admin`).
``threshold_us`` is kept current by the dispatcher (its config hook).

A leaf: imports nothing of the node.
"""

from __future__ import annotations

import time

__all__ = ["LatencyMonitor", "HISTORY_LEN", "EVENTS"]

HISTORY_LEN = 160  # samples kept per event (Redis's LATENCY_TS_LEN)

#: the events this node records, and what each measures (LATENCY DOCTOR)
EVENTS = {
    "command": "a client command, from the start of its run to its reply",
    "expire-cycle": "a run of the core's timers (expiries, requeues, ack collection, replication retries)",
    "cron": "the 100 ms upkeep (memory measure, client checks, periodic garbage collection)",
    "aof-write": "a write to the append only file done on the event loop (appendfsync everysec / no)",
    "aof-fsync-always": "an fdatasync of the append only file with appendfsync always (replies wait for it)",
}


class EventSeries:
    __slots__ = ("samples", "max")

    def __init__(self) -> None:
        self.samples: list[list[int]] = []  # [unix second, ms], oldest first
        self.max = 0


class LatencyMonitor:
    def __init__(self, threshold_ms: int = 0) -> None:
        self.threshold_us = threshold_ms * 1000  # 0: off
        self.events: dict[str, EventSeries] = {}

    def observe(self, event: str, start_ns: int) -> None:
        """A hook's one call after its work: record ``event`` if it ran since ``start_ns``
        (``time.perf_counter_ns()``) for at least the threshold."""
        usec = (time.perf_counter_ns() - start_ns) // 1000
        if self.threshold_us and usec >= self.threshold_us:
            self.add(event, usec // 1000)

    def add(self, event: str, ms: int, now: int | None = None) -> None:
        """One sample of ``event``: ``ms`` milliseconds (a caller checked the threshold)."""
        if now is None:
            now = int(time.time())
        series = self.events.get(event)
        if series is None:
            series = self.events[event] = EventSeries()
        if ms > series.max:
            series.max = ms
        samples = series.samples
        if samples and samples[-1][0] == now:
            if ms > samples[-1][1]:
                samples[-1][1] = ms
            return
        samples.append([now, ms])
        if len(samples) > HISTORY_LEN:
            del samples[0]

    def latest(self) -> list[list]:
        """LATENCY LATEST: [event, time of the latest sample, its ms, the largest ms]."""
        return [[name.encode(), s.samples[-1][0], s.samples[-1][1], s.max]
                for name, s in sorted(self.events.items()) if s.samples]  # fmt: skip

    def history(self, event: str) -> list[list[int]]:
        series = self.events.get(event)
        return [] if series is None else [list(sample) for sample in series.samples]

    def reset(self, events: list[str] | None = None) -> int:
        """Forget the events named (all if None); how many there were."""
        if events is None:
            n = len(self.events)
            self.events.clear()
            return n
        n = 0
        for name in set(events):
            if self.events.pop(name, None) is not None:
                n += 1
        return n

    def doctor(self) -> str:
        """A few lines a human can read: what was seen, and what to look at."""
        if not self.threshold_us:
            return ("The latency monitor is off: set latency-monitor-threshold to a number of "
                    "milliseconds (CONFIG SET latency-monitor-threshold 100) to record slow events.\n")  # fmt: skip
        if not self.events:
            return ("No event took %d milliseconds or more since the monitor started or was last reset.\n"
                    % (self.threshold_us // 1000))  # fmt: skip
        lines = ["Events that took at least %d milliseconds:" % (self.threshold_us // 1000)]
        for i, (name, s) in enumerate(sorted(self.events.items()), 1):
            ms = [sample[1] for sample in s.samples]
            lines.append(
                "%d. %s: %d samples, latest %d ms, average %d ms, worst %d ms. %s."
                % (i, name, len(ms), ms[-1] if ms else 0, sum(ms) // len(ms) if ms else 0, s.max,
                   EVENTS.get(name, "an event").capitalize())
            )  # fmt: skip
        advice = []
        if "command" in self.events:
            advice.append("See SLOWLOG GET for the slow commands themselves (slowlog-log-slower-than).")
        if any(name.startswith("aof-") for name in self.events):
            advice.append("AOF writes are slow: the disk is busy or slow; appendfsync everysec waits less.")
        if "expire-cycle" in self.events or "cron" in self.events:
            advice.append("The node's own upkeep is slow: many jobs expiring or requeued at once, "
                          "many clients, or a full garbage collection (INFO memory).")  # fmt: skip
        return "\n".join(lines + [""] + advice) + "\n"
