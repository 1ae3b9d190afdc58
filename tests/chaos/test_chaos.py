"""Chaos on real node processes, a short run of each nemesis (tests/chaos/run.py).

Each run starts 5 nodes (each in its own network namespace when the tests run as root), runs
producers and consumers for ``SECONDS`` while its nemesis strikes every ``INTERVAL`` seconds,
heals, settles and checks the history: nothing acknowledged lost (beyond what nodes that lost
their memory may take with them), no RETRY 0 job delivered twice, no unexpected delivery, no
acknowledged job left behind. The seed is random (``CHAOS_SEED`` fixes it); a failing run prints
its table, the command that replays its schedule and where its history and logs are kept.

The runs share one xdist group: one at a time, so five nodes never compete with five others for
the machine's cores. Longer runs: ``scripts/chaos --minutes 30 --nemesis all``.
"""

from __future__ import annotations

import os
import random
from pathlib import Path

import pytest

from tests.chaos.nemesis import Unavailable
from tests.chaos.run import RunConfig, run
from tests.chaos.workload import Options

# The harness's own limits govern (a settle over 90 s fails the run with its history saved and
# its replay command printed); pytest's 60 s default would kill a slow settle on a loaded
# machine with nothing to replay it from.
pytestmark = [pytest.mark.xdist_group("chaos"), pytest.mark.timeout(240)]

SECONDS = 10.0  # two or three faults: the first at 0.5-1.5 s, then one every INTERVAL (nemesis.schedule)
INTERVAL = 4.0


def chaos(tmp_path: Path, nemesis: str, *, aof: str = "off", retry0_pct: float = 0.0, async_pct: float = 0.0,
          seconds: float = SECONDS, failing_pct: float = 0.0, nodes: int = 5, **workload):  # fmt: skip
    seed = int(os.environ.get("CHAOS_SEED") or random.SystemRandom().randrange(1, 10**6))
    cfg = RunConfig(
        nemesis=nemesis, seconds=seconds, interval=INTERVAL, seed=seed, nodes=nodes,
        appendonly=aof != "off", appendfsync=aof if aof != "off" else "everysec",
        workload=Options(rate=300, retry0_pct=retry0_pct, async_pct=async_pct, failing_pct=failing_pct, **workload),
        save_dir=tmp_path / "failed", settle_timeout=90,
    )  # fmt: skip
    print("chaos: nemesis %s, seed %d (CHAOS_SEED=%d replays it)" % (nemesis, seed, seed), flush=True)
    try:
        result = run(cfg, workdir=tmp_path / "nodes")
    except Unavailable as exc:
        pytest.skip("nemesis %s: %s" % (nemesis, exc))
    print(result.table())
    assert result.ok, "\n" + result.table()
    assert result.faults and result.report.acknowledged >= 50  # the work did run (a loaded machine slows it)
    assert result.report.delivered_jobs >= result.report.acknowledged - result.report.lost_excused
    return result


def test_kill_without_aof_loses_only_what_every_holder_forgot(tmp_path):
    r = chaos(tmp_path, "kill", retry0_pct=0.1, async_pct=0.1)
    assert r.report.memory_losses >= 1


def test_kill_with_aof_everysec_loses_nothing(tmp_path):
    r = chaos(tmp_path, "kill", aof="everysec")
    assert r.report.memory_losses == 0 and r.report.lost_excused == 0


def test_killing_every_node_at_once_with_aof_always_loses_nothing(tmp_path):
    r = chaos(tmp_path, "kill-all", aof="always")
    assert r.report.lost_excused == 0 and r.report.lost_async == 0


def test_pauses_longer_than_the_node_timeout(tmp_path):
    chaos(tmp_path, "pause", retry0_pct=0.1)


def test_partitions_of_random_halves(tmp_path):
    chaos(tmp_path, "partition", retry0_pct=0.2)


def test_partitions_of_one_node(tmp_path):
    chaos(tmp_path, "partition-one")


def test_clock_jumps(tmp_path):
    r = chaos(tmp_path, "clock", retry0_pct=0.1)
    assert r.actions["clock"] == len(r.faults)


def test_a_full_disk_refuses_new_jobs_with_misconf(tmp_path):
    r = chaos(tmp_path, "disk", aof="everysec")
    assert r.report.error_kinds.get("MISCONF", 0) > 0, r.report.error_kinds


def test_a_failed_fsync_with_aof_always_stops_the_node_and_loses_nothing(tmp_path):
    r = chaos(tmp_path, "fsync", aof="always")
    assert r.actions.get("stopped", 0) >= 1 and r.actions["stopped"] == r.actions["fsync-fail"], r.actions
    assert r.report.lost_excused == 0


def test_every_nemesis_mixed(tmp_path):
    chaos(tmp_path, "all", aof="everysec", retry0_pct=0.1, async_pct=0.05, seconds=16.0)


def test_jobs_that_fail_are_dead_lettered_once_never_early_under_kills_and_partitions(tmp_path):
    """BACKOFF and MAXDELIVER 3 on every job, a tenth of them always NACKed (plainly, with DELAY,
    with REASON): each reaches its dead-letter queue as the job derived from it, after its 3rd
    delivery at the soonest; a dead letter delivered twice only across a fault."""
    r = chaos(tmp_path, "kill+partition", failing_pct=0.1)
    rep = r.report
    assert rep.failing and rep.poison_jobs >= 20
    assert rep.dead_lettered >= rep.poison_jobs - rep.lost_excused - rep.lost_async


def test_producers_retrying_with_dedup_keys_add_each_job_once_under_kills_and_partitions(tmp_path):
    """3 nodes, REPLICATE 3; every producer sends ADDJOB ... DEDUP <key> again, on any node, after
    every error, timeout and dropped connection until it gets an ID: no job lost, one ID per key,
    and no job its producer sent twice delivered again after an acknowledgement unless a partition
    came in between. Consumers use the usual mix, FASTACK included (a DEDUP job FASTACKed while
    its first node still waited for a dead holder's copy once came back:
    tests/core/test_dedup_fastack.py)."""
    r = chaos(tmp_path, "kill+partition", nodes=3, producer="dedup")
    rep = r.report
    assert rep.producer == "dedup" and rep.keys_retried >= 1, "no producer had to retry: nothing shown"
    assert rep.extra_jobs == 0 and rep.retry_duplicates_whole == 0 and rep.lost == 0
    assert rep.keys_given_up == 0 and rep.keys_undelivered == rep.lost_excused  # kill -9 without an AOF may excuse some
