"""The node process's garbage collector policy (``server/gcpolicy.py``).

The collector's state is global to a process, so each case runs in a fresh
interpreter: it installs the policy, makes long-lived and cyclic objects, and
prints what it observed as JSON.
"""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap

PRELUDE = """
import gc, json, weakref
from disque_py.server.gcpolicy import policy, YOUNG_THRESHOLD

class Item:  # a long-lived tracked container, as a stored Job is
    __slots__ = ("n", "peer", "__weakref__")
    def __init__(self, n):
        self.n = n
        self.peer = None

def cycle():
    a, b = Item(1), Item(2)
    a.peer, b.peer = b, a
    return weakref.ref(a)

def churn(n):  # n objects alive for a moment: enough to trigger young collections
    batch = [Item(0) for _ in range(n)]
    del batch
"""


def run(body: str) -> dict:
    script = PRELUDE + textwrap.dedent(body)
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout.strip().splitlines()[-1])


def test_survivors_are_frozen_and_never_examined_again():
    seen = run("""
        policy.install()
        before = gc.get_freeze_count()
        kept = [Item(i) for i in range(50_000)]  # five young collections' worth
        churn(YOUNG_THRESHOLD)
        print(json.dumps({
            "young": policy.young_collections,
            "frozen_growth": gc.get_freeze_count() - before,
            "unfrozen": sum(gc.get_count()),
            "policy": policy.info()["gc_policy"],
        }))
    """)
    assert seen["policy"] == "freeze-survivors"
    assert seen["young"] >= 5
    assert seen["frozen_growth"] >= 50_000  # every kept item now sits in the permanent generation
    assert seen["unfrozen"] < 2 * 10_000  # what the collector still looks at: the last moments' objects


def test_short_lived_cycles_are_still_collected_young():
    seen = run("""
        policy.install()
        ref = cycle()  # garbage at once: the next young collection frees it
        churn(3 * YOUNG_THRESHOLD)
        print(json.dumps({"alive": ref() is not None, "full": policy.full_collections}))
    """)
    assert seen == {"alive": False, "full": 0}


def test_a_cycle_that_dies_after_being_frozen_waits_for_the_full_collection():
    seen = run("""
        policy.install()
        holder = [Item(0)]
        holder[0].peer = Item(0)
        holder[0].peer.peer = holder[0]  # a cycle, alive through the next young collections
        ref = weakref.ref(holder[0])
        churn(3 * YOUNG_THRESHOLD)
        holder.clear()  # now garbage, but frozen
        churn(3 * YOUNG_THRESHOLD)
        alive_before = ref() is not None
        freed = policy.full_collect("test")
        info = policy.info()
        print(json.dumps({
            "alive_before": alive_before, "alive_after": ref() is not None, "freed": freed,
            "full": info["gc_full_collections"], "last_freed": info["gc_last_full_freed"],
            "frozen_again": gc.get_freeze_count() > 0,
        }))
    """)
    assert seen["alive_before"] is True
    assert seen["alive_after"] is False
    assert seen["freed"] >= 2 and seen["last_freed"] == seen["freed"]
    assert seen["full"] == 1
    assert seen["frozen_again"] is True


def test_explicit_thresholds_mean_the_plain_generational_collector():
    seen = run("""
        policy.install("700,10,10")
        before = gc.get_freeze_count()
        kept = [Item(i) for i in range(20_000)]
        churn(5_000)
        print(json.dumps({
            "policy": policy.info()["gc_policy"],
            "frozen_growth": gc.get_freeze_count() - before,
            "threshold": list(gc.get_threshold()),
        }))
    """)
    assert seen == {"policy": "generational", "frozen_growth": 0, "threshold": [700, 10, 10]}


def test_the_periodic_full_collection_backs_off_while_it_finds_nothing():
    seen = run("""
        from disque_py.server.gcpolicy import FULL_PERIOD_MIN_S, FULL_PERIOD_MAX_S, FULL_FREED_LOW
        policy.install()
        periods, fulls = [], []
        def due(late=1.0):  # the cron's call, `late` seconds after the period has passed
            policy.maybe_full(policy.last_full_at + policy.full_period + late)
            periods.append(policy.info()["gc_full_period_s"])
            fulls.append(policy.full_collections)
        due(late=-1.0)
        for _ in range(6):
            due()
        holders = []  # cycles that survive young collections, then die: what a full one is for
        for _ in range(FULL_FREED_LOW):
            a, b = Item(0), Item(0)
            a.peer, b.peer = b, a
            holders.append(a)
        churn(3 * YOUNG_THRESHOLD)
        holders.clear()
        due(late=-1.0)
        due()
        print(json.dumps({"periods": periods, "fulls": fulls, "freed": policy.last_full_freed,
                          "min": FULL_PERIOD_MIN_S, "max": FULL_PERIOD_MAX_S}))
    """)
    hour, day = seen["min"], seen["max"]
    assert (hour, day) == (3600, 86400)
    # not due yet; then each collection that frees (almost) nothing doubles the period, up to a day
    assert seen["periods"][:7] == [hour, 2 * hour, 4 * hour, 8 * hour, 16 * hour, day, day]
    assert seen["fulls"][:7] == [0, 1, 2, 3, 4, 5, 6]
    # a collection that finds a leak brings it back to an hour (and not one before it is due)
    assert seen["fulls"][7:] == [6, 7]
    assert seen["freed"] >= 10_000  # FULL_FREED_LOW: the leak is worth sweeping hourly again
    assert seen["periods"][7:] == [day, hour]


def test_the_policy_turns_the_collector_on_that_the_start_turned_off():
    # `disque-py server` keeps the collector off through its imports; the node's policy must turn
    # it on, or cycles made while it serves would never be freed.
    seen = run("""
        gc.disable()
        policy.install()
        ref = cycle()
        churn(3 * YOUNG_THRESHOLD)
        print(json.dumps({"enabled": gc.isenabled(), "alive": ref() is not None}))
    """)
    assert seen == {"enabled": True, "alive": False}


def test_a_paused_bulk_build_runs_no_collection_and_is_frozen_after():
    seen = run("""
        policy.install()
        young = policy.young_collections
        before = gc.get_freeze_count()
        with policy.paused():
            off = gc.isenabled()
            kept = [Item(i) for i in range(50_000)]  # five young collections' worth
            during = policy.young_collections - young
        after = {"enabled": gc.isenabled(), "frozen_growth": gc.get_freeze_count() - before}
        gc.disable()
        try:
            with policy.paused():
                raise ValueError
        except ValueError:
            pass
        print(json.dumps({"off": off, "during": during, **after, "left_off": not gc.isenabled()}))
    """)
    assert seen["off"] is False and seen["during"] == 0  # no collection through the build
    assert seen["enabled"] is True  # the collector is back on
    assert seen["frozen_growth"] >= 50_000  # what was built sits in the permanent generation
    assert seen["left_off"] is True  # a collector that was off stays off, an error inside or not


def test_the_frozen_objects_are_counted_when_asked_not_at_start():
    # Counting walks every frozen object (a start's 50k: milliseconds before the first client);
    # install() leaves it to the first INFO memory, which then says what the collector holds.
    seen = run("""
        walks = []
        real = gc.get_freeze_count
        gc.get_freeze_count = lambda: walks.append(1) or real()  # the same count, each walk noted
        kept = [Item(i) for i in range(10_000)]
        policy.install()
        at_start = len(walks)
        asked = policy.frozen_objects()
        again = policy.frozen_objects()  # within FROZEN_COUNT_TTL: the same count, no walk
        freed = policy.full_collect("test")
        print(json.dumps({"at_start": at_start, "asked": asked, "real": real(), "again": again,
                          "walks": len(walks)}))
    """)
    assert seen["at_start"] == 0
    assert seen["asked"] == seen["again"] >= 10_000
    assert seen["walks"] == 2  # the first ask, and the log line of the full collection (counted again)
    assert seen["real"] >= seen["asked"] - 100
