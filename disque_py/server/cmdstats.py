"""Per-command counters: calls, failed calls, total time and a latency histogram.

The dispatcher (:mod:`.dispatch`) owns one :class:`CommandStats`
(``Dispatcher.cmdstats``) and counts every command it runs in
``run_commands``: one dict lookup by the command's name as it came off the
wire (``by_wire``), the bucket (:data:`SMALL_BUCKETS` up to a millisecond,
a ``bisect`` into :data:`LATENCY_BUCKETS_US` above) and a few integer adds (a
stat's ``calls`` is the sum of its buckets). INFO commandstats (:mod:`.admin`) and the admin port's
``/metrics`` read ``by_name``.

Names are the lower-case command names the node knows; any other name is
counted under ``"unknown"``, so a client sending random names cannot grow
the table. CONFIG RESETSTAT empties it (:meth:`CommandStats.reset`).

It imports nothing of the node: a leaf. Compiled in the compiled build (final classes with
typed fields, counted into by the compiled pass, :mod:`.stage`).
"""

from __future__ import annotations

from bisect import bisect_left
from typing import Callable, Final, final

__all__ = ["LATENCY_BUCKETS_US", "SMALL_BUCKETS", "CommandStat", "CommandStats", "UNKNOWN"]

#: upper bounds, in microseconds, of the latency histogram buckets (non-cumulative counts;
#: one more bucket at the end for everything above the last bound)
LATENCY_BUCKETS_US: Final[tuple[int, ...]] = (
    10, 25, 50, 100, 250, 500, 1000, 2500, 5000, 10000, 25000, 50000, 100000, 250000, 1000000,
)  # fmt: skip

#: the bucket of each duration from 0 to 1000 us (most commands): an index instead of a bisect
SMALL_BUCKETS: Final[list[int]] = [bisect_left(LATENCY_BUCKETS_US, usec) for usec in range(1001)]

#: the name every command the node does not know is counted under
UNKNOWN: Final = "unknown"


@final
class CommandStat:
    """One command's counters. ``buckets[i]`` counts the calls that took at most
    ``LATENCY_BUCKETS_US[i]`` microseconds (and more than the bound before it); the last
    bucket the calls above every bound."""

    __slots__ = ("errors", "usec", "buckets")

    def __init__(self) -> None:
        self.errors = 0
        self.usec = 0  # total microseconds
        self.buckets: list[int] = [0] * (len(LATENCY_BUCKETS_US) + 1)

    @property
    def calls(self) -> int:
        """Every call lands in one bucket: their sum is the count (one add fewer per command)."""
        return sum(self.buckets)

    def __repr__(self) -> str:
        return "CommandStat(calls=%d, errors=%d, usec=%d)" % (self.calls, self.errors, self.usec)


@final
class CommandStats:
    """Every command's :class:`CommandStat`, by lower-case name (only the commands seen).

    ``is_known(wire_name)``: whether a name is one of the node's commands, counted under its
    own name (the dispatcher asks its tables); None: every name is."""

    def __init__(self, is_known: Callable[[bytes], bool] | None = None) -> None:
        self.by_name: dict[str, CommandStat] = {}
        #: the same stats by the name's bytes as the dispatcher sees them (``argv[0].lower()``);
        #: known names only, so it stays bounded
        self.by_wire: dict[bytes, CommandStat] = {}
        self.is_known = is_known

    def stat_for(self, wire_name: bytes) -> CommandStat:
        """The stat a command named ``wire_name`` (lower case bytes) counts into, made on
        first use. The slow path of the dispatcher's lookup in ``by_wire``."""
        if self.is_known is not None and not self.is_known(wire_name):
            stat = self.by_name.get(UNKNOWN)
            if stat is None:
                stat = self.by_name[UNKNOWN] = CommandStat()
            return stat  # not kept in by_wire: any number of names may come
        name = wire_name.decode("utf-8", "replace")
        stat = self.by_name.get(name)
        if stat is None:
            stat = self.by_name[name] = CommandStat()
        self.by_wire[wire_name] = stat
        return stat

    def record(self, wire_name: bytes, usec: int, error: bool = False) -> None:
        """Count one call (what the dispatcher does inline; for tests and other callers)."""
        stat = self.by_wire.get(wire_name) or self.stat_for(wire_name)
        stat.usec += usec
        stat.buckets[bisect_left(LATENCY_BUCKETS_US, usec)] += 1
        if error:
            stat.errors += 1

    def reset(self) -> None:
        """CONFIG RESETSTAT: forget every count."""
        self.by_name.clear()
        self.by_wire.clear()

    def info_fields(self) -> dict[str, str]:
        """INFO commandstats, as Redis 7: ``cmdstat_<name>`` -> ``calls=..,usec=..,...``."""
        fields = {}
        for name in sorted(self.by_name):
            s = self.by_name[name]
            if not s.calls:
                continue
            fields["cmdstat_" + name] = "calls=%d,usec=%d,usec_per_call=%.2f,rejected_calls=0,failed_calls=%d" % (
                s.calls, s.usec, s.usec / s.calls, s.errors)  # fmt: skip
        return fields
