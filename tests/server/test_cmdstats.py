"""The stores behind INFO commandstats, SLOWLOG and LATENCY, and the dispatcher that feeds them.

The stores are plain objects (server/cmdstats.py, slowlog.py, latency.py); the
dispatcher is driven in process with a real core and a stand-in connection.
"""

from __future__ import annotations

import pytest

from disque_py.config import Config, config_set
from disque_py.core.node import Node
from disque_py.server import admin
from disque_py.server.acl import Acl
from disque_py.server.app import NODE_COMMANDS
from disque_py.server.cmdstats import LATENCY_BUCKETS_US, UNKNOWN, CommandStat, CommandStats
from disque_py.server.connection import Connection
from disque_py.server.dispatch import Dispatcher
from disque_py.server.latency import HISTORY_LEN, LatencyMonitor
from disque_py.server.slowlog import MAX_ARG_BYTES, MAX_ARGS, SlowLog

# --------------------------------------------------------------------------- CommandStats


def test_a_stat_starts_at_zero_with_one_bucket_past_the_last_bound():
    stat = CommandStat()
    assert (stat.calls, stat.errors, stat.usec) == (0, 0, 0)
    assert stat.buckets == [0] * (len(LATENCY_BUCKETS_US) + 1)
    assert list(LATENCY_BUCKETS_US) == sorted(LATENCY_BUCKETS_US)


@pytest.mark.parametrize(
    "usec, bucket",
    [(0, 0), (10, 0), (11, 1), (25, 1), (26, 2), (1000, 6), (1001, 7), (1_000_000, 14), (1_000_001, 15),
     (10**9, 15)],
)  # fmt: skip
def test_a_call_lands_in_the_first_bucket_whose_bound_holds_it(usec, bucket):
    stats = CommandStats()
    stats.record(b"ping", usec)
    buckets = stats.by_name["ping"].buckets
    assert buckets[bucket] == 1 and sum(buckets) == 1


def test_calls_errors_and_time_add_up_per_name():
    stats = CommandStats()
    stats.record(b"addjob", 5)
    stats.record(b"addjob", 7, error=True)
    stats.record(b"getjob", 100)
    add = stats.by_name["addjob"]
    assert (add.calls, add.errors, add.usec) == (2, 1, 12)
    assert stats.by_name["getjob"].calls == 1
    assert set(stats.by_name) == {"addjob", "getjob"}


def test_unknown_names_share_one_stat_and_are_not_cached():
    stats = CommandStats(lambda name: name in (b"ping",))
    for i in range(100):
        stats.record(b"nosuch%d" % i, 1)
    stats.record(b"ping", 1)
    assert set(stats.by_name) == {UNKNOWN, "ping"}
    assert stats.by_name[UNKNOWN].calls == 100
    assert set(stats.by_wire) == {b"ping"}  # bounded by the node's commands


def test_reset_forgets_everything_and_counting_starts_again():
    stats = CommandStats()
    stats.record(b"ping", 3)
    stats.reset()
    assert stats.by_name == {} and stats.info_fields() == {}
    stats.record(b"ping", 4)
    assert stats.by_name["ping"].calls == 1 and stats.by_name["ping"].usec == 4


def test_info_fields_have_redis_7_shape():
    stats = CommandStats()
    stats.record(b"qlen", 3)
    stats.record(b"qlen", 4, error=True)
    assert stats.info_fields() == {
        "cmdstat_qlen": "calls=2,usec=7,usec_per_call=3.50,rejected_calls=0,failed_calls=1"
    }


# --------------------------------------------------------------------------- SlowLog


def test_slowlog_newest_first_trimmed_to_max_len_ids_keep_growing():
    log = SlowLog(max_len=3)
    for i in range(5):
        log.add([b"cmd%d" % i], 100 + i, "127.0.0.1:1", b"")
    assert len(log) == 3
    entries = log.get(-1)
    assert [e[0] for e in entries] == [4, 3, 2]
    assert [e[3] for e in entries] == [[b"cmd4"], [b"cmd3"], [b"cmd2"]]
    assert entries[0][2] == 104 and entries[0][4] == b"127.0.0.1:1" and entries[0][5] == b""
    assert [e[0] for e in log.get(2)] == [4, 3]
    assert log.get(0) == []
    log.reset()
    assert len(log) == 0 and log.get() == []
    log.add([b"x"], 1, "a:1", b"name")
    assert log.get()[0][0] == 5 and log.get()[0][5] == b"name"  # IDs go on after RESET, as Redis


def test_slowlog_lowering_max_len_trims_at_the_next_entry():
    log = SlowLog(max_len=10)
    for i in range(10):
        log.add([b"c"], 1, "a:1", b"")
    log.max_len = 2
    log.add([b"c"], 1, "a:1", b"")
    assert len(log) == 2


def test_slowlog_cuts_long_arguments_and_many_arguments_as_redis():
    log = SlowLog()
    big = b"x" * (MAX_ARG_BYTES + 72)
    log.add([b"ADDJOB", b"q", big], 1, "a:1", b"")
    args = log.get()[0][3]
    assert args[2] == b"x" * MAX_ARG_BYTES + b"... (72 more bytes)"
    argv = [b"ACKJOB"] + [b"D-%d" % i for i in range(49)]  # 50 arguments
    log.add(argv, 1, "a:1", b"")
    args = log.get()[0][3]
    assert len(args) == MAX_ARGS
    assert args[: MAX_ARGS - 1] == argv[: MAX_ARGS - 1]
    assert args[-1] == b"... (19 more arguments)"
    log.add(argv[:MAX_ARGS], 1, "a:1", b"")  # exactly 32: kept whole
    assert log.get()[0][3] == argv[:MAX_ARGS]


@pytest.mark.parametrize(
    "argv, kept",
    [
        ([b"AUTH", b"pw"], [b"AUTH", b"(redacted)"]),
        ([b"auth", b"user", b"pw"], [b"auth", b"(redacted)", b"(redacted)"]),
        ([b"HELLO", b"3", b"AUTH", b"u", b"pw", b"SETNAME", b"n"],
         [b"HELLO", b"3", b"AUTH", b"(redacted)", b"(redacted)", b"SETNAME", b"n"]),
        ([b"ACL", b"SETUSER", b"bob", b"on", b">pw"], [b"ACL", b"SETUSER", b"bob", b"(redacted)", b"(redacted)"]),
        ([b"CONFIG", b"SET", b"requirepass", b"pw"], [b"CONFIG", b"SET", b"requirepass", b"(redacted)"]),
        ([b"CONFIG", b"SET", b"maxclients", b"10"], [b"CONFIG", b"SET", b"maxclients", b"10"]),
        ([b"ACL", b"WHOAMI"], [b"ACL", b"WHOAMI"]),
    ],
)  # fmt: skip
def test_slowlog_never_keeps_a_password(argv, kept):
    log = SlowLog()
    log.add(argv, 1, "a:1", b"")
    assert log.get()[0][3] == kept


# --------------------------------------------------------------------------- LatencyMonitor


def test_latency_keeps_one_sample_per_second_the_largest():
    mon = LatencyMonitor(threshold_ms=10)
    mon.add("command", 20, now=1000)
    mon.add("command", 50, now=1000)
    mon.add("command", 30, now=1000)
    mon.add("command", 15, now=1001)
    assert mon.history("command") == [[1000, 50], [1001, 15]]
    assert mon.latest() == [[b"command", 1001, 15, 50]]


def test_latency_history_is_capped_and_max_survives_the_cap():
    mon = LatencyMonitor(threshold_ms=1)
    mon.add("cron", 999, now=0)
    for t in range(1, HISTORY_LEN + 50):
        mon.add("cron", 5, now=t)
    history = mon.history("cron")
    assert len(history) == HISTORY_LEN and history[0][0] == 50 and history[-1][0] == HISTORY_LEN + 49
    assert mon.latest() == [[b"cron", HISTORY_LEN + 49, 5, 999]]


def test_latency_reset_named_events_or_all():
    mon = LatencyMonitor(threshold_ms=1)
    for event in ("command", "cron", "expire-cycle"):
        mon.add(event, 3, now=1)
    assert mon.reset(["cron", "nosuch", "cron"]) == 1
    assert [e[0] for e in mon.latest()] == [b"command", b"expire-cycle"]
    assert mon.reset() == 2 and mon.latest() == [] and mon.history("command") == []


def test_latency_observe_records_only_at_or_above_the_threshold():
    import time

    mon = LatencyMonitor(threshold_ms=0)
    mon.observe("cron", time.perf_counter_ns() - 10**9)  # off: nothing, however slow
    assert mon.latest() == []
    # a threshold of 5 s, which no pause of a loaded machine between two lines reaches
    mon.threshold_us = 5_000_000
    mon.observe("cron", time.perf_counter_ns())  # fast: nothing
    assert mon.latest() == []
    mon.observe("cron", time.perf_counter_ns() - 6 * 10**9)  # 6 s ago
    [[name, _, latest, worst]] = mon.latest()
    assert name == b"cron" and 6000 <= latest == worst < 60_000


def test_latency_doctor_says_something_useful_in_each_state():
    mon = LatencyMonitor(threshold_ms=0)
    assert "off" in mon.doctor()
    mon.threshold_us = 100_000
    assert "No event" in mon.doctor()
    mon.add("command", 250, now=1)
    text = mon.doctor()
    assert "command" in text and "250 ms" in text and "SLOWLOG" in text


# --------------------------------------------------------------------------- the dispatcher feeds them


class _Sock:
    def fileno(self) -> int:
        return -1


def _dispatcher(**settings):
    cfg = Config()
    for name, value in settings.items():
        config_set(cfg, name.replace("_", "-").encode(), str(value).encode())
    node = Node("0" * 40, seed=b"s" * 20, now=0)
    d = Dispatcher(node, cfg, {}, acl=Acl.from_config(cfg, NODE_COMMANDS))
    ctx = admin.AdminContext(
        config=cfg, node=node, stats=d.stats, clients={}, start_time=0.0, request_shutdown=lambda: None,
        close_client=lambda c: None, ops_per_sec=lambda: 0, commands=NODE_COMMANDS,
        acl=d.acl, cmdstats=d.cmdstats, slowlog=d.slowlog, latency=d.latency,
    )  # fmt: skip
    d.admin = admin.build_table(ctx)
    conn = Connection(1, _Sock(), "127.0.0.1:5555", "127.0.0.1:7711", 0.0, None)
    return d, conn


def _run(d, conn, *commands):
    d.run_commands(conn, [list(argv) for argv in commands])
    out = bytes(conn.out)
    conn.out.clear()
    return out


async def test_dispatch_counts_calls_errors_and_unknown_names():
    d, conn = _dispatcher()
    _run(d, conn, [b"PING"], [b"ping"], [b"ADDJOB", b"q", b"b", b"0"], [b"QLEN"], [b"NOSUCH"], [b"other"])
    by = d.cmdstats.by_name
    assert by["ping"].calls == 2 and by["ping"].errors == 0
    assert by["addjob"].calls == 1
    assert by["qlen"].calls == 1 and by["qlen"].errors == 1  # wrong arity
    assert by[UNKNOWN].calls == 2 and by[UNKNOWN].errors == 2
    for stat in by.values():
        assert sum(stat.buckets) == stat.calls


async def test_dispatch_feeds_the_slowlog_by_its_threshold_live():
    d, conn = _dispatcher(slowlog_log_slower_than=0)
    conn.name = b"worker-1"
    _run(d, conn, [b"PING"], [b"ECHO", b"hi"])
    entries = d.slowlog.get(-1)
    assert [e[3] for e in entries] == [[b"ECHO", b"hi"], [b"PING"]]
    assert entries[0][4] == b"127.0.0.1:5555" and entries[0][5] == b"worker-1"
    config_set(d.config, b"slowlog-log-slower-than", b"-1")  # off
    _run(d, conn, [b"PING"])
    assert len(d.slowlog) == 2
    config_set(d.config, b"slowlog-log-slower-than", b"0")
    config_set(d.config, b"slowlog-max-len", b"1")
    _run(d, conn, [b"PING"], [b"TIME"])
    assert len(d.slowlog) == 1 and d.slowlog.get()[0][3] == [b"TIME"]


async def test_dispatch_records_a_slow_command_as_a_latency_event():
    d, conn = _dispatcher(latency_monitor_threshold=20, slowlog_log_slower_than=-1)
    _run(d, conn, [b"PING"])
    assert d.latency.latest() == []
    assert _run(d, conn, [b"DEBUG", b"SLEEP", b"0.03"]) == b"+OK\r\n"
    [[event, _, ms, worst]] = d.latency.latest()
    assert event == b"command" and 30 <= ms == worst
    assert len(d.slowlog) == 0  # the slow log is off


async def test_config_resetstat_empties_the_command_stats_not_the_slowlog():
    d, conn = _dispatcher(slowlog_log_slower_than=0)
    _run(d, conn, [b"PING"])
    assert _run(d, conn, [b"CONFIG", b"RESETSTAT"]) == b"+OK\r\n"
    assert "ping" not in d.cmdstats.by_name
    assert len(d.slowlog) == 2


async def test_an_empty_command_never_breaks_the_counting():
    d, conn = _dispatcher()
    assert _run(d, conn, [], [b"PING"]).endswith(b"+PONG\r\n")
    assert d.cmdstats.by_name[UNKNOWN].errors == 1 and d.cmdstats.by_name["ping"].calls == 1


# --------------------------------------------------------------------------- the timers' hooks


async def test_a_slow_cron_step_and_a_slow_core_tick_are_latency_events():
    import time

    from disque_py.server.timers import CoreTimers, Cron

    mon = LatencyMonitor(threshold_ms=20)
    cron = Cron(Config(), {}, lambda timeout, hz: None)
    cron.step()  # no monitor yet: nothing read, nothing recorded
    cron.latency = mon
    cron.step()  # fast
    assert mon.latest() == []
    cron.every_step.append(lambda: time.sleep(0.03))
    cron.step()
    assert [e[0] for e in mon.latest()] == [b"cron"] and mon.latest()[0][2] >= 30

    node = Node("0" * 40, seed=b"s" * 20, now=0)
    timers = CoreTimers(node, lambda: time.sleep(0.03))  # the effects of the tick take 30 ms
    timers.latency = mon
    timers._tick()
    assert [e[0] for e in mon.latest()] == [b"cron", b"expire-cycle"]
    mon.threshold_us = 0  # off: a slow tick is not recorded
    mon.reset()
    timers._tick()
    assert mon.latest() == []


async def test_info_in_a_pipeline_counts_every_command_before_it():
    """Core commands run on the dispatcher's fast path are counted in total_commands_processed
    before anything the shell answers reads it, as when each went through dispatch."""
    d, conn = _dispatcher()
    for key in ("total_connections_received", "rejected_connections", "total_net_input_bytes",
                "total_net_output_bytes", "accept_errors", "protocol_errors",
                "client_output_buffer_limit_disconnections"):  # the client loop's own (INFO stats)
        d.stats.setdefault(key, 0)
    out = _run(d, conn, [b"ADDJOB", b"q", b"a", b"0"], [b"QLEN", b"q"], [b"INFO", b"stats"], [b"PING"])
    assert b"total_commands_processed:3\r\n" in out
    assert d.stats["total_commands_processed"] == 4
