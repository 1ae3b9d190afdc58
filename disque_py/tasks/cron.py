"""When periodic tasks fire: ``Schedule.every(seconds)`` and ``Schedule.cron("*/5 * * * *")``.

A schedule cuts time into *slots*: a slot starts at a fire time and lasts until the next one.
Every scheduler of the app computes the same slots from the schedule alone (no state, no
coordination), which is what lets each of them add the slot's job under the same
deduplication key (``disque_py.tasks.periodic``).

* ``every(s)``: fire times are the multiples of ``s`` seconds since the Unix epoch (so
  ``every(60)`` fires at each whole minute, ``every(3600)`` at each whole hour of UTC). An
  ``offset`` shifts them: ``every(86400, offset=3 * 3600)`` fires daily at 03:00 UTC.
* ``cron(expr, tz=None)``: the five fields of crontab(5) - minute (0-59), hour (0-23), day of
  month (1-31), month (1-12 or ``jan``-``dec``), day of week (0-7, 0 and 7 both Sunday, or
  ``sun``-``sat``). Each field is ``*``, a number, a range ``a-b``, a step ``*/n``, ``a-b/n`` or
  ``a/n`` (from ``a`` to the field's end), or a comma-separated list of these; names are
  case-insensitive and work in ranges (``mon-fri``). The macros ``@yearly`` (``@annually``),
  ``@monthly``, ``@weekly``, ``@daily`` (``@midnight``) and ``@hourly`` stand for their
  usual expansions.

  Day of month and day of week follow Vixie cron: when both are restricted (neither field
  starts with ``*``), a day matches if *either* matches (``0 0 1,15 * mon`` fires on the 1st,
  the 15th and every Monday); when one starts with ``*`` (``*`` or ``*/n``), only the other
  counts.

  Times are UTC unless ``tz`` names a zone (``zoneinfo``, e.g. ``"Europe/Paris"``). In a zone
  with daylight saving time, a wall-clock time that does not exist (the hour skipped in
  spring) does not fire, and one that happens twice (the hour repeated in autumn) fires at
  its first occurrence only.

A schedule answers two questions, in Unix seconds: ``next_after(t)`` (the first fire time
strictly after ``t``) and ``slot_start(t)`` (the last fire time at or before ``t``: the start of
the slot ``t`` is in). An expression that never fires (``0 0 30 2 *``) is refused when parsed.
"""

from __future__ import annotations

import datetime as _dt
import math
from dataclasses import dataclass

__all__ = ["Schedule", "CronExpr", "parse_cron"]

_UTC = _dt.timezone.utc
_MONTHS = {m: i + 1 for i, m in enumerate("jan feb mar apr may jun jul aug sep oct nov dec".split())}
_DAYS = {d: i for i, d in enumerate("sun mon tue wed thu fri sat".split())}
_MACROS = {
    "@yearly": "0 0 1 1 *",
    "@annually": "0 0 1 1 *",
    "@monthly": "0 0 1 * *",
    "@weekly": "0 0 * * 0",
    "@daily": "0 0 * * *",
    "@midnight": "0 0 * * *",
    "@hourly": "0 * * * *",
}
#: (name, lowest, highest, names) of the five fields; day of week accepts 7 for Sunday.
_FIELDS = (
    ("minute", 0, 59, None),
    ("hour", 0, 23, None),
    ("day of month", 1, 31, None),
    ("month", 1, 12, _MONTHS),
    ("day of week", 0, 7, _DAYS),
)
#: How far a search goes before concluding the expression never fires (Feb 29 on a given
#: weekday recurs within 28 years).
_SEARCH_YEARS = 30


def _value(text: str, lo: int, hi: int, names: dict[str, int] | None, field: str) -> int:
    word = text.lower()
    if names is not None and word in names:
        return names[word]
    if not text.isdigit():
        raise ValueError("cron %s: %r is not a number%s" % (field, text, " or a name" if names else ""))
    v = int(text)
    if not lo <= v <= hi:
        raise ValueError("cron %s: %d is out of range %d-%d" % (field, v, lo, hi))
    return v


def _field(text: str, lo: int, hi: int, names: dict[str, int] | None, field: str) -> frozenset[int]:
    if not text:
        raise ValueError("cron %s: empty" % field)
    out: set[int] = set()
    for part in text.split(","):
        if not part:
            raise ValueError("cron %s: empty item in list %r" % (field, text))
        rng, slash, step_text = part.partition("/")
        step = 1
        if slash:
            if not step_text.isdigit() or int(step_text) == 0:
                raise ValueError("cron %s: step %r must be a positive number" % (field, step_text))
            step = int(step_text)
        if rng == "*":
            a, b = lo, hi
        elif "-" in rng:
            left, _, right = rng.partition("-")
            a = _value(left, lo, hi, names, field)
            b = _value(right, lo, hi, names, field)
            if a > b:
                raise ValueError("cron %s: range %s goes backwards" % (field, rng))
        else:
            a = _value(rng, lo, hi, names, field)
            b = hi if slash else a  # a/n: from a to the field's end
        out.update(range(a, b + 1, step))
    return frozenset(out)


@dataclass(frozen=True)
class CronExpr:
    """A parsed five-field expression: the sets of values each field allows."""

    text: str
    minutes: frozenset[int]
    hours: frozenset[int]
    days: frozenset[int]
    months: frozenset[int]
    weekdays: frozenset[int]  # 0 = Sunday (7 folded into 0)
    day_star: bool  # the day-of-month field starts with '*'
    weekday_star: bool

    def day_matches(self, d: _dt.date) -> bool:
        dom = d.day in self.days
        dow = (d.isoweekday() % 7) in self.weekdays
        if self.day_star or self.weekday_star:
            return dom and dow  # the starred one allows every day it can
        return dom or dow

    # -- searching wall-clock times (naive datetimes, whole minutes) -------------------
    def next_match(self, t: _dt.datetime) -> _dt.datetime:
        """The first matching minute strictly after the naive ``t``."""
        t = t.replace(second=0, microsecond=0) + _dt.timedelta(minutes=1)
        limit = t.year + _SEARCH_YEARS
        while t.year <= limit:
            if t.month not in self.months:
                t = (t.replace(day=1, hour=0, minute=0) + _dt.timedelta(days=32)).replace(day=1)
                continue
            if not self.day_matches(t.date()):
                t = t.replace(hour=0, minute=0) + _dt.timedelta(days=1)
                continue
            if t.hour not in self.hours:
                t = t.replace(minute=0) + _dt.timedelta(hours=1)
                continue
            if t.minute not in self.minutes:
                t += _dt.timedelta(minutes=1)
                continue
            return t
        raise ValueError("cron expression %r never fires" % self.text)

    def prev_match(self, t: _dt.datetime) -> _dt.datetime:
        """The last matching minute at or before the naive ``t``."""
        t = t.replace(second=0, microsecond=0)
        limit = t.year - _SEARCH_YEARS
        while t.year >= limit:
            if t.month not in self.months:
                t = t.replace(day=1, hour=23, minute=59) - _dt.timedelta(days=1)
                continue
            if not self.day_matches(t.date()):
                t = t.replace(hour=23, minute=59) - _dt.timedelta(days=1)
                continue
            if t.hour not in self.hours:
                t = t.replace(minute=59) - _dt.timedelta(hours=1)
                continue
            if t.minute not in self.minutes:
                t -= _dt.timedelta(minutes=1)
                continue
            return t
        raise ValueError("cron expression %r never fires" % self.text)


def parse_cron(text: str) -> CronExpr:
    """Parse a five-field expression or a macro; ValueError says what is wrong."""
    expr = _MACROS.get(text.strip().lower(), text)
    parts = expr.split()
    if len(parts) != 5:
        raise ValueError("cron expression %r: 5 fields expected (minute hour day month weekday), got %d"
                         % (text, len(parts)))  # fmt: skip
    sets = [_field(p, lo, hi, names, name) for p, (name, lo, hi, names) in zip(parts, _FIELDS)]
    weekdays = frozenset(d % 7 for d in sets[4])
    cron = CronExpr(text, sets[0], sets[1], sets[2], sets[3], weekdays, parts[2].startswith("*"),
                    parts[4].startswith("*"))  # fmt: skip
    cron.next_match(_dt.datetime(2000, 1, 1))  # raises for one that never fires
    return cron


class Schedule:
    """When a periodic task fires. Build with :meth:`every` or :meth:`cron`."""

    __slots__ = ("period", "offset", "expr", "tz")

    def __init__(self, period: float | None = None, offset: float = 0.0, expr: CronExpr | None = None,
                 tz: _dt.tzinfo | None = None) -> None:  # fmt: skip
        self.period = period
        self.offset = offset
        self.expr = expr
        self.tz = tz

    @classmethod
    def every(cls, seconds: float, offset: float = 0.0) -> "Schedule":
        """Every ``seconds`` (at least 1), at multiples of it since the epoch, plus ``offset``."""
        if isinstance(seconds, bool) or not isinstance(seconds, (int, float)) or not math.isfinite(seconds):
            raise ValueError("every= takes a number of seconds, not %r" % (seconds,))
        if seconds < 1:
            raise ValueError("every= must be at least 1 second (got %r)" % seconds)
        return cls(period=float(seconds), offset=float(offset) % seconds)

    @classmethod
    def cron(cls, expr: str, tz: str | _dt.tzinfo | None = None) -> "Schedule":
        """A crontab expression (see the module docstring), in UTC or the zone ``tz``."""
        if isinstance(tz, str):
            from zoneinfo import ZoneInfo

            tz = ZoneInfo(tz)
        return cls(expr=parse_cron(expr), tz=tz)

    @classmethod
    def of(cls, every: float | None = None, cron: str | None = None, tz: str | _dt.tzinfo | None = None) -> "Schedule":
        """The schedule of ``@app.periodic(every=... | cron=...)``: exactly one of the two."""
        if (every is None) == (cron is None):
            raise ValueError("a periodic task takes every=seconds or cron=\"...\" (one of the two)")
        if every is not None:
            if tz is not None:
                raise ValueError("tz= goes with cron=, not every=")
            return cls.every(every)
        return cls.cron(cron, tz=tz)  # type: ignore[arg-type]

    def __repr__(self) -> str:
        if self.expr is None:
            return "Schedule.every(%g%s)" % (self.period, ", offset=%g" % self.offset if self.offset else "")
        return "Schedule.cron(%r%s)" % (self.expr.text, ", tz=%r" % str(self.tz) if self.tz else "")

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Schedule) and repr(self) == repr(other)

    def __hash__(self) -> int:
        return hash(repr(self))

    # -- fire times ----------------------------------------------------------------------
    def next_after(self, t: float) -> float:
        """The first fire time strictly after ``t`` (Unix seconds)."""
        if self.expr is None:
            assert self.period is not None
            n = math.floor((t - self.offset) / self.period) + 1
            return n * self.period + self.offset
        # From the wall time of t; in a repeated hour the first occurrence of the minutes
        # after it may still be before t: those are skipped.
        wall = _dt.datetime.fromtimestamp(t, self.tz or _UTC).replace(tzinfo=None, fold=0)
        while True:
            wall = self.expr.next_match(wall)
            at = self._instant(wall)
            if at is not None and at > t:
                return at

    def slot_start(self, t: float) -> float:
        """The last fire time at or before ``t``: the start of the slot ``t`` falls in."""
        if self.expr is None:
            assert self.period is not None
            n = math.floor((t - self.offset) / self.period)
            return n * self.period + self.offset
        wall = _dt.datetime.fromtimestamp(t, self.tz or _UTC).replace(tzinfo=None, fold=0)
        while True:
            wall = self.expr.prev_match(wall)
            at = self._instant(wall)
            if at is not None and at <= t:
                break
            wall -= _dt.timedelta(minutes=1)
        if self.tz is not None:  # t in a repeated hour: fire times of its first pass came later
            while (after := self.next_after(at)) <= t:
                at = after
        return at

    def _instant(self, wall: _dt.datetime) -> float | None:
        """The Unix time of a wall-clock minute: its first occurrence; None if it does not exist."""
        if self.tz is None:
            return wall.replace(tzinfo=_UTC).timestamp()
        aware = wall.replace(tzinfo=self.tz, fold=0)
        back = aware.astimezone(_UTC).astimezone(self.tz).replace(tzinfo=None)
        if back != wall:
            return None  # in the gap of a clock change forward
        return aware.timestamp()

    def period_at(self, start: float) -> float:
        """How long the slot starting at ``start`` lasts."""
        return self.next_after(start) - start
