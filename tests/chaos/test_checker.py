"""The chaos checker, schedules and command lines on made-up histories (no processes): each promise
the checker guards is shown broken and caught."""

from __future__ import annotations

import pytest

from tests.chaos.__main__ import main as chaos_cli
from tests.chaos.cluster import command
from tests.chaos.history import History, check
from tests.chaos.nemesis import KINDS, Unavailable, schedule
from tests.chaos.run import RunConfig, kinds_for

P = "r7"


def add(h: History, seq: int, t0: float, *, node: int = 0, result: str = "ok", replicate: int = 3,
        retry: int = 1, asynchronous: bool = False) -> str:  # fmt: skip
    flags = ",".join(f for f, on in (("r0", retry == 0), ("a", asynchronous)) if on)
    body = "%s:0:%d:%s" % (P, seq, flags)
    h.add(op="add", t0=t0, t1=t0 + 0.01, node=node, body=body, replicate=replicate, retry=retry,
          result=result, id="D-%d" % seq if result == "ok" else None, **{"async": asynchronous})  # fmt: skip
    return body


def get(h: History, body: str, t: float, action: str = "ack", job_id: str | None = None) -> None:
    seq = int(body.split(":")[2])
    h.add(op="get", t=t, node=1, consumer=0, id=job_id or "D-%d" % seq, body=body, action=action)


def lose(h: History, t: float, *nodes: int) -> None:
    h.add(op="nemesis", t=t, what="kill", nodes=list(nodes), memory_lost=True)


def judge(h: History, acked_left: int | None = 0, settle_s: float | None = 1.0):
    return check(h, run_prefix=P, acked_left=acked_left, settle_s=settle_s)


def test_a_clean_history_is_clean():
    h = History()
    for i in range(5):
        get(h, add(h, i, i), i + 0.5)
    r = judge(h)
    assert r.ok, r.problems
    assert (r.attempted, r.acknowledged, r.delivered_jobs, r.lost, r.duplicates) == (5, 5, 5, 0, 0)


def test_an_acknowledged_job_never_delivered_is_lost():
    h = History()
    add(h, 1, 0.0)
    get(h, add(h, 2, 0.0), 1.0)
    r = judge(h)
    assert r.lost == 1 and not r.ok
    assert "1 acknowledged jobs lost" in r.problems[0] and "D-1" in r.problems[0]


def test_a_job_whose_add_failed_or_got_no_reply_may_be_missing():
    h = History()
    add(h, 1, 0.0, result="error")
    add(h, 2, 0.0, result="unknown")
    r = judge(h)
    assert r.ok and (r.add_errors, r.add_unknown) == (1, 1)


def test_fewer_memory_losses_than_replicas_excuse_nothing():
    h = History()
    add(h, 1, 1.0, replicate=3)
    lose(h, 2.0, 0)
    lose(h, 3.0, 1)
    lose(h, 4.0, 1)  # the same node twice: still two holders at most
    assert judge(h).lost == 1


def test_as_many_memory_losses_as_replicas_excuse_the_job():
    h = History()
    add(h, 1, 1.0, replicate=2)
    lose(h, 2.0, 0)
    lose(h, 3.0, 1)
    r = judge(h)
    assert r.ok and r.lost == 0 and r.lost_excused == 1


def test_memory_lost_before_the_add_excuses_nothing():
    h = History()
    lose(h, 0.5, 0, 1, 2)
    add(h, 1, 1.0, replicate=3)
    assert judge(h).lost == 1


def test_an_async_job_goes_with_the_node_that_took_it():
    h = History()
    add(h, 1, 1.0, node=3, asynchronous=True)
    add(h, 2, 1.0, node=2, asynchronous=True)
    lose(h, 1.5, 3)
    r = judge(h)
    assert (r.lost_async, r.lost) == (1, 1)  # job 2's node kept its memory


def test_redelivery_after_an_ack_is_a_duplicate_and_after_a_drop_or_nack_is_not():
    h = History()
    a = add(h, 1, 0.0)
    get(h, a, 1.0, "ack")
    get(h, a, 2.0, "ack")
    b = add(h, 2, 0.0)
    get(h, b, 1.0, "drop")
    get(h, b, 2.0, "nack")
    get(h, b, 3.0, "fastack")
    get(h, b, 4.0, "ack")
    r = judge(h)
    assert r.ok  # duplicates are counted, not a broken promise
    assert (r.duplicates, r.redeliveries_asked) == (2, 2)
    assert r.duplicate_rate == pytest.approx(1.0)


def test_a_retry0_job_delivered_twice_breaks_the_run_even_after_a_nack():
    h = History()
    a = add(h, 1, 0.0, retry=0)
    get(h, a, 1.0, "nack")
    get(h, a, 2.0, "ack")
    r = judge(h)
    assert r.retry0_twice == 1 and not r.ok


def test_a_retry0_job_never_delivered_is_allowed():
    h = History()
    add(h, 1, 0.0, retry=0)
    r = judge(h)
    assert r.ok and (r.retry0_jobs, r.retry0_undelivered, r.lost) == (1, 1, 0)


def test_unexpected_deliveries_and_wrong_ids_break_the_run():
    h = History()
    h.add(op="get", t=1.0, node=0, consumer=0, id="D-x", body="someone-else", action="ack")
    a = add(h, 1, 0.0)
    get(h, a, 1.0, job_id="D-other")
    r = judge(h)
    assert (r.unexpected, r.wrong_id) == (1, 1) and len(r.problems) == 2


def test_acked_jobs_left_or_no_settling_break_the_run():
    h = History()
    get(h, add(h, 1, 0.0), 1.0)
    assert "1 acknowledged jobs left" in judge(h, acked_left=1).problems[0]
    assert judge(h, acked_left=None, settle_s=None).problems == ["the cluster did not settle"]


def test_the_table_names_every_count_and_the_verdict():
    h = History()
    add(h, 1, 0.0)
    text = judge(h).table("title")
    for row in ("attempted", "acknowledged by ADDJOB", "lost", "duplicated deliveries", "unexpected",
                "RETRY 0 delivered twice", "acked jobs left after settling", "time to settle"):  # fmt: skip
        assert row in text
    assert text.splitlines()[0] == "title" and "FAILED" in text.splitlines()[-1]


def test_a_saved_history_loads_back(tmp_path):
    h = History()
    get(h, add(h, 1, 0.0), 1.0)
    h.save(tmp_path / "h.jsonl")
    assert History.load(tmp_path / "h.jsonl").events == h.events


# ------------------------------------------------------------------ schedules and command lines


def test_a_seed_gives_the_same_schedule_and_faults_are_healed_before_the_next():
    a = schedule(list(KINDS), 5, 60.0, 10.0, 5, 2.0)
    assert a == schedule(list(KINDS), 5, 60.0, 10.0, 5, 2.0)
    assert a != schedule(list(KINDS), 6, 60.0, 10.0, 5, 2.0)
    assert len(a) == 6
    for f, nxt in zip(a, a[1:]):
        assert f.at + f.duration <= nxt.at - 1.0 + 1e-9
    for f in a:
        assert all(0 <= n < 5 for n in f.nodes) and f.at < 59.0


def test_pauses_outlast_the_node_timeout_and_partitions_leave_two_sides():
    for seed in range(20):
        for f in schedule(["pause", "partition"], seed, 30.0, 10.0, 5, 2.0):
            if f.kind == "pause":
                assert f.duration >= 3.0
            else:
                assert 1 <= len(f.nodes) <= 4


def test_the_server_template_takes_placeholders_or_a_program():
    values = {"port": "7711", "host": "10.0.0.1", "dir": "/d", "timeout": "2000", "appendonly": "no",
              "appendfsync": "everysec"}  # fmt: skip
    assert command("srv --port {port} --x {host}", values) == ["srv", "--port", "7711", "--x", "10.0.0.1"]
    argv = command("/opt/disque-server", values)
    assert argv[0] == "/opt/disque-server"
    assert argv[argv.index("--bind") + 1] == "10.0.0.1" and argv[argv.index("--cluster-node-timeout") + 1] == "2000"


def test_a_nemesis_that_cannot_run_here_says_why():
    with pytest.raises(Unavailable, match="partitions: no namespaces"):
        kinds_for(RunConfig(nemesis="partition"), False, "no namespaces", True)
    with pytest.raises(Unavailable, match="AOF"):
        kinds_for(RunConfig(nemesis="fsync"), True, "", True)
    with pytest.raises(ValueError, match="unknown nemesis"):
        kinds_for(RunConfig(nemesis="flood"), True, "", True)
    kinds = kinds_for(RunConfig(nemesis="all"), False, "no namespaces", False)
    assert "partition" not in kinds and "clock" not in kinds and "kill" in kinds


def test_the_replay_command_parses_back_to_the_same_run():
    cfg = RunConfig(nemesis="kill+pause", seconds=12, interval=4, appendonly=True, appendfsync="always")
    cfg.workload.retry0_pct = 0.2
    argv = cfg.replay(99).split()[1:]
    ctx = chaos_cli.make_context("chaos", argv)
    p = ctx.params
    assert (p["nemesis"], p["seconds"], p["interval"], p["seed"], p["aof"], p["retry0_pct"]) == (
        "kill+pause", 12.0, 4.0, 99, "always", 20.0)


def test_a_failing_run_keeps_its_history_logs_and_replay_command(tmp_path):
    from tests.chaos.run import Result, _save

    h = History()
    add(h, 1, 0.0)  # acknowledged, never delivered: lost
    report = judge(h)
    cfg = RunConfig(nemesis="pause", seconds=9, interval=3)
    faults = schedule(["pause"], 4, 9, 3, 5, 2.0)
    result = Result(cfg, 4, report, faults, True, 12.0, report.problems)
    log = tmp_path / "node0.log"
    log.write_text("the node's own words\n")

    class Logs:
        def logs(self):
            return [log, tmp_path / "missing.log"]

    saved = _save(result, h, Logs(), tmp_path / "failed")
    result.saved = saved
    assert History.load(saved / "history.jsonl").events == h.events
    assert (saved / "node0.log").read_text() == "the node's own words\n"
    text = result.table()
    assert "FAILED: 1 acknowledged jobs lost" in text
    assert "replay: scripts/chaos --nemesis pause --seconds 9 --interval 3 --seed 4" in text
    assert "saved: %s" % saved in text
    assert "pause" in (saved / "report.txt").read_text().split("schedule:")[1]


# --------------------------------------------------------------------------- jobs that fail


def add_failing(h: History, seq: int, t0: float, *, poison: bool = True, maxdeliver: int = 3) -> str:
    body = "%s:0:%d:%s" % (P, seq, "p" if poison else "")
    h.add(op="add", t0=t0, t1=t0 + 0.01, node=0, body=body, replicate=3, retry=1, result="ok", id="D-%d" % seq,
          maxdeliver=maxdeliver, **{"async": False})  # fmt: skip
    return body


def get_dead(h: History, body: str, t: float, *, orig_deliveries: int = 3, action: str = "ack",
             job_id: str | None = None) -> None:  # fmt: skip
    from tests.chaos.history import _dead_letter_id

    original = "D-%d" % int(body.split(":")[2])
    h.add(op="get", t=t, node=2, consumer=1, id=job_id or _dead_letter_id(original), body=body, action=action,
          dead_of=original, orig_deliveries=orig_deliveries, deliveries=1)  # fmt: skip


def poison_run(h: History, seq: int, t0: float, deliveries: int = 3) -> str:
    body = add_failing(h, seq, t0)
    for k in range(deliveries):
        get(h, body, t0 + 0.1 * (k + 1), action="nack")
    return body


def test_poison_jobs_dead_lettered_once_after_their_maxdeliver_are_clean():
    h = History()
    for i in range(4):
        get_dead(h, poison_run(h, i, i), i + 0.9)
    get(h, add_failing(h, 9, 0.0, poison=False), 0.5)
    r = judge(h)
    assert r.ok, r.problems
    assert (r.failing, r.poison_jobs, r.dead_lettered, r.lost, r.dead_early) == (True, 4, 4, 0, 0)
    assert "poison jobs / dead-lettered jobs" in r.table()


def test_a_poison_job_delivered_but_never_dead_lettered_is_lost():
    h = History()
    poison_run(h, 1, 0.0)
    r = judge(h)
    assert r.lost == 1 and not r.ok and "D-1" in r.problems[0]


def test_a_job_dead_lettered_before_its_maxdeliver_th_delivery_is_caught():
    h = History()
    get_dead(h, poison_run(h, 1, 0.0, deliveries=2), 1.0)  # the workload saw 2 of 3
    get_dead(h, poison_run(h, 2, 0.0), 1.0, orig_deliveries=2)  # the node counted 2 of 3
    r = judge(h)
    assert r.dead_early == 2 and not r.ok
    assert any("dead-lettered before their MAXDELIVER-th delivery" in p for p in r.problems)


def test_a_getjob_reply_never_seen_excuses_one_delivery_the_workload_missed():
    h = History()
    body = poison_run(h, 1, 0.0, deliveries=2)
    h.add(op="getfail", t=0.5, node=1, error="TooSlowError")
    get_dead(h, body, 1.0)
    r = judge(h)
    assert r.ok, r.problems
    assert (r.dead_early, r.dead_early_excused) == (0, 1)


def test_a_dead_letter_delivered_again_is_allowed_only_after_a_fault():
    h = History()
    body = poison_run(h, 1, 0.0)
    get_dead(h, body, 1.0)
    get_dead(h, body, 2.0)
    r = judge(h)
    assert (r.dead_duplicates, r.dead_duplicates_unexcused) == (1, 1) and not r.ok
    h.add(op="nemesis", t=1.5, what="partition", nodes=[0, 1], memory_lost=False)
    r = judge(h)
    assert (r.dead_duplicates, r.dead_duplicates_unexcused) == (1, 0) and r.ok, r.problems


def test_a_dead_letter_under_another_id_than_its_originals_is_caught():
    h = History()
    get_dead(h, poison_run(h, 1, 0.0), 1.0, job_id="D-other")
    r = judge(h)
    assert r.dead_wrong_id == 1 and not r.ok


def test_a_history_without_failing_jobs_reports_no_failing_rows():
    h = History()
    get(h, add(h, 1, 0.0), 0.5)
    r = judge(h)
    assert r.ok and not r.failing and "poison" not in r.table()


# ------------------------------------------------------------------ producers that retry


def retried(h: History, seq: int, t0: float, *, key: bool, attempts: int = 2, result: str = "ok") -> str:
    """A job a retrying producer sent ``attempts`` times (``key``: with DEDUP)."""
    body = add(h, seq, t0, result=result)
    ev = h.events[-1]
    ev.update(attempts=attempts, nodes=[0] * attempts, ids=[ev["id"]] if result == "ok" else [], errors=[])
    if key:
        ev["key"] = body
    return body


def split(h: History, t: float, until: float) -> None:
    h.add(op="nemesis", t=t, what="partition", nodes=[0], memory_lost=False)
    h.add(op="nemesis", t=until, what="heal", nodes=[0], memory_lost=False)


def test_a_dedup_job_retried_and_delivered_again_after_its_ack_with_the_network_whole_is_caught():
    h = History()
    b = retried(h, 1, 0.0, key=True)
    get(h, b, 0.5)
    get(h, b, 0.6)  # the same ID again, after an acknowledged delivery
    get(h, retried(h, 2, 0.0, key=True, attempts=1), 0.5)
    r = judge(h)
    assert (r.producer, r.keys, r.add_attempts, r.keys_retried) == ("dedup", 2, 3, 1)
    assert r.retry_duplicates == r.retry_duplicates_whole == 1 and not r.ok
    assert "1 deliveries of DEDUP keys sent twice delivered again with the network whole" in r.problems[0]


def test_a_dedup_job_delivered_again_across_a_partition_is_counted_not_failed():
    h = History()
    b = retried(h, 1, 0.0, key=True)
    split(h, 0.2, 3.0)
    get(h, b, 0.5)
    get(h, b, 3.5)
    r = judge(h)
    assert r.ok, r.problems
    assert r.retry_duplicates == 1 and r.retry_duplicates_whole == 0


def test_a_dedup_key_delivered_under_two_ids_is_caught():
    h = History()
    b = retried(h, 1, 0.0, key=True)
    get(h, b, 0.5, action="drop")
    get(h, b, 1.5, job_id="D-other")
    r = judge(h)
    assert r.extra_jobs == 1 and r.keys_extra == 1 and not r.ok
    assert any("DEDUP keys delivered under more than one ID" in p for p in r.problems)


def test_retries_without_a_key_may_make_more_jobs_counted_apart_from_wrong_ids():
    h = History()
    b = retried(h, 1, 0.0, key=False, attempts=3)
    get(h, b, 0.5, job_id="D-first-try")
    get(h, b, 0.6)
    b2 = retried(h, 2, 0.0, key=False, result="unknown", attempts=5)  # given up
    r = judge(h)
    assert r.ok, r.problems
    assert (r.producer, r.wrong_id, r.extra_jobs, r.retry_duplicates, r.retry_duplicates_whole) == ("retry", 0, 1, 1, 1)
    assert r.keys_undelivered == r.keys_given_up == 1 and b2


def test_a_producer_that_does_not_retry_counts_the_jobs_it_gave_up():
    h = History()
    add(h, 1, 0.0, result="error")
    get(h, add(h, 2, 0.0), 0.5)
    r = judge(h)
    assert (r.producer, r.keys, r.keys_undelivered) == ("once", 2, 1)
    assert "no retry" in r.table()


def test_the_producer_options_replay_and_parse_back():
    cfg = RunConfig(nemesis="kill", seed=3)
    cfg.workload.producer = "dedup"
    cfg.workload.mix = {"ack": 0.97, "drop": 0.03}
    argv = cfg.replay(3).split()[1:]
    assert "--producer dedup --mix ack=0.97,drop=0.03" in " ".join(argv)
    p = chaos_cli.make_context("chaos", argv).params
    assert (p["producer"], p["mix"], p["dedup"]) == ("dedup", "ack=0.97,drop=0.03", False)
    assert chaos_cli.make_context("chaos", ["--dedup"]).params["dedup"] is True
