"""The cron parser and Schedule against a table of known expressions and their next times."""

from __future__ import annotations

import datetime as dt
import random

import pytest

from disque_py.tasks.cron import Schedule, parse_cron

UTC = dt.timezone.utc


def ts(text: str) -> float:
    """'2026-01-01 00:05' (UTC) -> Unix seconds."""
    return dt.datetime.fromisoformat(text).replace(tzinfo=UTC).timestamp()


def utc(t: float) -> str:
    return dt.datetime.fromtimestamp(t, UTC).strftime("%Y-%m-%d %H:%M:%S")


# (expression, after (UTC), the next fire time (UTC)); 2026-01-01 is a Thursday.
NEXT = [
    ("*/5 * * * *", "2026-01-01 00:00:00", "2026-01-01 00:05:00"),  # strictly after
    ("*/5 * * * *", "2026-01-01 00:03:17", "2026-01-01 00:05:00"),
    ("* * * * *", "2026-01-01 00:00:59", "2026-01-01 00:01:00"),
    ("0 * * * *", "2026-01-01 10:00:00", "2026-01-01 11:00:00"),
    ("30 2 * * *", "2026-01-01 03:00:00", "2026-01-02 02:30:00"),
    ("0 0 1 * *", "2026-01-15 00:00:00", "2026-02-01 00:00:00"),
    ("0 9 * * mon-fri", "2026-01-02 10:00:00", "2026-01-05 09:00:00"),  # Friday -> Monday
    ("0 9 * * MON-FRI", "2026-01-02 08:59:59", "2026-01-02 09:00:00"),
    # both day fields restricted: either matches (Vixie)
    ("0 0 1,15 * mon", "2026-01-01 00:00:00", "2026-01-05 00:00:00"),  # Monday the 5th
    ("0 0 13 * fri", "2026-01-01 00:00:00", "2026-01-02 00:00:00"),  # Friday the 2nd
    # day of month starts with '*': both must match (odd days that are Mondays)
    ("0 0 */2 * mon", "2026-01-01 00:00:00", "2026-01-05 00:00:00"),
    ("0 0 */2 * mon", "2026-01-05 00:00:00", "2026-01-19 00:00:00"),  # the 12th is even
    ("0 0 * * 7", "2026-01-01 00:00:00", "2026-01-04 00:00:00"),  # 7 is Sunday
    ("0 0 * * 0", "2026-01-01 00:00:00", "2026-01-04 00:00:00"),
    ("0 0 29 2 *", "2026-01-01 00:00:00", "2028-02-29 00:00:00"),
    ("15 14 1 jan,jul *", "2026-01-02 00:00:00", "2026-07-01 14:15:00"),
    ("@hourly", "2026-01-01 00:59:59", "2026-01-01 01:00:00"),
    ("@weekly", "2026-01-01 00:00:00", "2026-01-04 00:00:00"),
    ("@daily", "2026-01-01 00:00:00", "2026-01-02 00:00:00"),
    ("@monthly", "2026-01-01 00:00:00", "2026-02-01 00:00:00"),
    ("@yearly", "2026-01-01 00:00:00", "2027-01-01 00:00:00"),
    ("5/15 * * * *", "2026-01-01 00:50:00", "2026-01-01 01:05:00"),
    ("10-20/5 * * * *", "2026-01-01 00:15:00", "2026-01-01 00:20:00"),
    ("10-20/5 * * * *", "2026-01-01 00:20:00", "2026-01-01 01:10:00"),
    ("0 22 * * 1-5/2", "2026-01-02 23:00:00", "2026-01-05 22:00:00"),  # Mon, Wed, Fri
    ("59 23 31 12 *", "2026-12-31 23:59:00", "2027-12-31 23:59:00"),
    ("0 0 31 * *", "2026-01-31 00:00:00", "2026-03-31 00:00:00"),  # no Feb 31
    ("0 12 * jun sun", "2026-05-01 00:00:00", "2026-06-07 12:00:00"),
    ("0,30 8-9 * * *", "2026-01-01 09:30:00", "2026-01-02 08:00:00"),
]


@pytest.mark.parametrize("expr,after,expected", NEXT)
def test_next_after_table(expr, after, expected):
    s = Schedule.cron(expr)
    assert utc(s.next_after(ts(after))) == expected
    # the slot the next time opens starts at it, and the second before it is in the previous slot
    assert s.slot_start(ts(expected)) == ts(expected)
    assert s.slot_start(ts(expected) - 1) <= ts(after)


# (expression, at (UTC), the start of the slot at that time)
SLOT = [
    ("*/5 * * * *", "2026-01-01 00:03:17", "2026-01-01 00:00:00"),
    ("*/5 * * * *", "2026-01-01 00:05:00", "2026-01-01 00:05:00"),
    ("0 9 * * mon-fri", "2026-01-04 12:00:00", "2026-01-02 09:00:00"),  # Sunday -> Friday's
    ("0 0 29 2 *", "2027-06-01 00:00:00", "2024-02-29 00:00:00"),
    ("0 0 1,15 * mon", "2026-01-14 00:00:00", "2026-01-12 00:00:00"),
]


@pytest.mark.parametrize("expr,at,expected", SLOT)
def test_slot_start_table(expr, at, expected):
    assert utc(Schedule.cron(expr).slot_start(ts(at))) == expected


def test_time_zone_and_daylight_saving():
    paris = Schedule.cron("30 2 * * *", tz="Europe/Paris")
    # 2026-03-29: 02:00 CET jumps to 03:00 CEST, 02:30 does not exist that day
    assert utc(paris.next_after(ts("2026-03-28 12:00:00"))) == "2026-03-30 00:30:00"
    # 2026-10-25: 03:00 CEST falls back to 02:00 CET, 02:30 happens twice: the first one fires
    first = paris.next_after(ts("2026-10-24 12:00:00"))
    assert utc(first) == "2026-10-25 00:30:00"
    assert utc(paris.next_after(first)) == "2026-10-26 01:30:00"
    assert paris.slot_start(ts("2026-10-25 01:45:00")) == first  # in the second 02:45
    assert utc(Schedule.cron("0 9 * * *", tz="Europe/Paris").next_after(ts("2026-01-01 00:00:00"))) == (
        "2026-01-01 08:00:00"
    )
    # every 5 minutes through the repeated hour: the first pass fires, the second does not
    five = Schedule.cron("*/5 * * * *", tz="Europe/Paris")
    assert utc(five.slot_start(ts("2026-10-25 01:32:00"))) == "2026-10-25 00:55:00"
    assert utc(five.next_after(ts("2026-10-25 00:55:00"))) == "2026-10-25 02:00:00"


def test_every():
    s = Schedule.every(2)
    assert s.slot_start(101.5) == 100 and s.next_after(100) == 102 and s.next_after(101.9) == 102
    assert s.slot_start(100) == 100 and s.period_at(100) == 2
    daily = Schedule.every(86400, offset=3 * 3600)
    assert utc(daily.next_after(ts("2026-01-01 04:00:00"))) == "2026-01-02 03:00:00"
    assert utc(daily.slot_start(ts("2026-01-01 02:00:00"))) == "2025-12-31 03:00:00"
    assert Schedule.every(60) == Schedule.every(60.0) and Schedule.every(60) != Schedule.every(30)


@pytest.mark.parametrize(
    "expr,message",
    [
        ("* * * *", "5 fields"),
        ("* * * * * *", "5 fields"),
        ("60 * * * *", "out of range"),
        ("* 24 * * *", "out of range"),
        ("* * 0 * *", "out of range"),
        ("* * * 13 *", "out of range"),
        ("* * * * 8", "out of range"),
        ("*/0 * * * *", "step"),
        ("*/x * * * *", "step"),
        ("5-1 * * * *", "backwards"),
        ("x * * * *", "not a number"),
        ("* * * foo *", "not a number or a name"),
        ("1,,2 * * * *", "empty"),
        ("0 0 30 2 *", "never fires"),
    ],
)
def test_bad_expressions(expr, message):
    with pytest.raises(ValueError, match=message):
        Schedule.cron(expr)


@pytest.mark.parametrize("seconds, message", [
    (0, "must be at least 1 second"), (0.5, "must be at least 1 second"), (-1, "must be at least 1 second"),
    (float("inf"), "takes a number of seconds"), ("60", "takes a number of seconds"), (True, "takes a number of seconds"),
])  # fmt: skip
def test_bad_every(seconds, message):
    with pytest.raises(ValueError, match="every= " + message):
        Schedule.every(seconds)


def _matches(text: str, t: dt.datetime) -> bool:
    """A second reading of crontab(5), minute by minute, to compare the search with."""
    fields = text.split()
    names = {**{m: i + 1 for i, m in enumerate("jan feb mar apr may jun jul aug sep oct nov dec".split())},
             **{d: i for i, d in enumerate("sun mon tue wed thu fri sat".split())}}  # fmt: skip

    def ok(field: str, v: int, lo: int, hi: int) -> bool:
        for part in field.split(","):
            rng, _, step = part.partition("/")
            if rng == "*":
                a, b = lo, hi
            else:
                ends = [int(x) if x.isdigit() else names[x] for x in rng.split("-")]
                a, b = ends[0], ends[-1] if len(ends) == 2 else (hi if step else ends[0])
            if a <= v <= b and (v - a) % int(step or 1) == 0:
                return True
        return False

    dow = t.isoweekday() % 7
    dom_ok, dow_ok = ok(fields[2], t.day, 1, 31), ok(fields[4], dow, 0, 7) or (dow == 0 and ok(fields[4], 7, 0, 7))
    day = (dom_ok and dow_ok) if fields[2][0] == "*" or fields[4][0] == "*" else (dom_ok or dow_ok)
    return ok(fields[0], t.minute, 0, 59) and ok(fields[1], t.hour, 0, 23) and ok(fields[3], t.month, 1, 12) and day


def test_search_agrees_with_minute_by_minute_matching():
    rng = random.Random(48)
    pieces = {
        0: ["*", "*/7", "0", "5-20/5", "1,31,59", "30"],
        1: ["*", "*/5", "0", "9-17", "3,23"],
        2: ["*", "*/3", "1", "10-15", "1,15,31", "29"],
        3: ["*", "*/4", "feb", "1-3", "6,12"],
        4: ["*", "*/2", "mon-fri", "0", "7", "sat,sun", "2-4"],
    }
    for _ in range(60):
        expr = " ".join(rng.choice(pieces[i]) for i in range(5))
        cron = parse_cron(expr)
        t = dt.datetime(2026, 1, 1) + dt.timedelta(minutes=rng.randrange(400 * 24 * 60))
        found = cron.next_match(t)
        probe = t.replace(second=0) + dt.timedelta(minutes=1)
        while probe < found and (found - t) < dt.timedelta(days=40):  # every minute in between fails
            assert not _matches(expr, probe), (expr, probe)
            probe += dt.timedelta(minutes=1)
        assert _matches(expr, found), (expr, found)
        back = cron.prev_match(found - dt.timedelta(minutes=1))
        assert back < found and _matches(expr, back) and cron.next_match(back) == found, expr


def test_of_takes_one_of_every_and_cron():
    assert Schedule.of(every=60) == Schedule.every(60)
    assert Schedule.of(cron="*/5 * * * *") == Schedule.cron("*/5 * * * *")
    assert repr(Schedule.of(cron="0 9 * * *", tz="Europe/Paris")) == "Schedule.cron('0 9 * * *', tz='Europe/Paris')"
    for bad, message in (({}, "one of the two"), ({"every": 60, "cron": "* * * * *"}, "one of the two"),
                         ({"every": 60, "tz": "UTC"}, "tz= goes with cron=, not every=")):  # fmt: skip
        with pytest.raises(ValueError, match=message):
            Schedule.of(**bad)
