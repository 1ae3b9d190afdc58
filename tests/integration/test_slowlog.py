"""SLOWLOG, LATENCY, INFO commandstats and log-format json on real node processes, through redis-py."""

from __future__ import annotations

import json
import time

import pytest
import redis

from .conftest import wait_for

pytestmark = pytest.mark.integration


def test_slowlog_records_every_command_with_threshold_zero(start_node):
    node = start_node(slowlog_log_slower_than=0)
    r = node.client()
    r.execute_command("CLIENT", "SETNAME", "producer")
    r.execute_command("ADDJOB", "q", "body", 0)
    started = time.monotonic()
    r.execute_command("QLEN", "q")
    took_us = (time.monotonic() - started) * 1e6  # the round trip holds the command's run
    entries = r.slowlog_get(2)
    assert [e["command"] for e in entries] == [b"QLEN q", b"ADDJOB q body 0"]
    newest = entries[0]
    assert newest["id"] > entries[1]["id"]
    assert isinstance(newest["duration"], int) and 0 <= newest["duration"] <= took_us  # in microseconds
    assert abs(newest["start_time"] - time.time()) < 60
    assert newest["client_name"] == b"producer"
    assert newest["client_address"].startswith(b"127.0.0.1:")
    # raw shape, as Redis: id, time, usec, args, addr, name
    raw = r.execute_command("SLOWLOG", "GET", 1)
    assert len(raw) == 1 and len(raw[0]) == 6 and isinstance(raw[0][3], list)
    assert r.slowlog_len() >= 4  # CLIENT, ADDJOB, QLEN, SLOWLOG GET and more


def test_slowlog_max_len_get_count_and_reset(start_node):
    node = start_node(slowlog_log_slower_than=0, slowlog_max_len=5)
    r = node.client()
    for i in range(20):
        r.execute_command("ECHO", "m%d" % i)
    assert r.slowlog_len() == 5
    assert len(r.slowlog_get()) == 5  # default count 10, only 5 kept
    assert len(r.slowlog_get(3)) == 3
    assert len(r.execute_command("SLOWLOG", "GET", -1)) == 5
    assert r.slowlog_reset()
    assert r.slowlog_len() == 1  # the RESET itself, logged once it had run
    assert r.config_set("slowlog-log-slower-than", -1)
    r.slowlog_reset()
    r.execute_command("PING")
    assert r.slowlog_len() == 0  # off


def test_slowlog_cuts_long_arguments(start_node):
    node = start_node(slowlog_log_slower_than=0)
    r = node.client()
    r.execute_command("ADDJOB", "q", "x" * 300, 0)
    [entry] = r.execute_command("SLOWLOG", "GET", 1)
    assert entry[3][:2] == [b"ADDJOB", b"q"]
    assert entry[3][2] == b"x" * 128 + b"... (172 more bytes)"


def test_slowlog_never_keeps_passwords(start_node):
    node = start_node(slowlog_log_slower_than=0, requirepass="s3cret")
    r = node.client()
    r.execute_command("ACL", "SETUSER", "ops", "on", ">hidden", "~*", "+@all")
    r.config_set("requirepass", "n3w")
    redis.Redis(host=node.host, port=node.port, username="ops", password="hidden", socket_timeout=10).ping()
    logged = b" ".join(b" ".join(e[3]) for e in r.execute_command("SLOWLOG", "GET", -1))
    assert b"AUTH" in logged and b"SETUSER" in logged and b"requirepass" in logged
    for secret in (b"s3cret", b"hidden", b"n3w"):
        assert secret not in logged


def test_slowlog_and_latency_bad_arguments_get_clear_errors(node):
    r = node.client()
    for argv, text in [
        (("SLOWLOG",), "wrong number of arguments for 'slowlog'"),
        (("SLOWLOG", "NOPE"), "unknown subcommand"),
        (("SLOWLOG", "GET", "ten"), "not an integer"),
        (("SLOWLOG", "GET", "-5"), "greater than or equal to -1"),
        (("SLOWLOG", "LEN", "x"), "unknown subcommand or wrong number of arguments"),
        (("LATENCY",), "wrong number of arguments for 'latency'"),
        (("LATENCY", "HISTORY"), "unknown subcommand or wrong number of arguments"),
        (("LATENCY", "NOPE"), "Try LATENCY HELP"),
    ]:
        with pytest.raises(redis.ResponseError, match=text):
            r.execute_command(*argv)
    assert r.execute_command("PING")  # the node serves on
    help_lines = r.execute_command("SLOWLOG", "HELP")
    assert any(b"RESET" in line for line in help_lines)
    assert any(b"HISTORY" in line for line in r.execute_command("LATENCY", "HELP"))


def test_latency_catches_a_slow_command_history_and_reset(start_node):
    node = start_node(latency_monitor_threshold=50, slowlog_log_slower_than=100000)
    r = node.client()
    assert r.execute_command("LATENCY", "LATEST") == []
    r.execute_command("PING")
    assert r.execute_command("LATENCY", "LATEST") == []  # below the threshold
    r.execute_command("DEBUG", "SLEEP", "0.12")
    [[event, when, latest, worst]] = r.execute_command("LATENCY", "LATEST")
    assert event == b"command" and 120 <= latest == worst < 5000 and when > 1_600_000_000
    history = r.execute_command("LATENCY", "HISTORY", "command")
    assert len(history) == 1 and history[0][1] == latest
    assert r.execute_command("LATENCY", "HISTORY", "nosuch") == []
    assert b"command" in r.execute_command("LATENCY", "DOCTOR")
    # the same command went to the slow log (100 ms there)
    assert r.slowlog_get(1)[0]["command"] == b"DEBUG SLEEP 0.12"
    assert r.execute_command("LATENCY", "RESET", "nosuch") == 0
    assert r.execute_command("LATENCY", "RESET") == 1
    assert r.execute_command("LATENCY", "LATEST") == []
    # off at run time: nothing more is recorded
    r.config_set("latency-monitor-threshold", 0)
    r.execute_command("DEBUG", "SLEEP", "0.06")
    assert r.execute_command("LATENCY", "LATEST") == []


def test_info_commandstats_counts_what_was_sent(node):
    r = node.client()
    r.config_resetstat()
    for _ in range(3):
        r.execute_command("ADDJOB", "q", "b", 0)
    r.execute_command("QLEN", "q")
    with pytest.raises(redis.ResponseError, match="wrong number of arguments for 'qlen' command"):
        r.execute_command("QLEN")  # wrong arity: a failed call
    with pytest.raises(redis.ResponseError, match="unknown command 'NOSUCHCMD'"):
        r.execute_command("NOSUCHCMD")
    stats = r.info("commandstats")
    assert stats["cmdstat_addjob"]["calls"] == 3 and stats["cmdstat_addjob"]["failed_calls"] == 0
    assert stats["cmdstat_qlen"]["calls"] == 2 and stats["cmdstat_qlen"]["failed_calls"] == 1
    assert stats["cmdstat_unknown"]["calls"] == 1 and stats["cmdstat_unknown"]["failed_calls"] == 1
    addjob = stats["cmdstat_addjob"]
    assert isinstance(addjob["usec"], int) and addjob["usec_per_call"] == pytest.approx(addjob["usec"] / 3, abs=0.01)
    assert "cmdstat_addjob" not in r.info()  # not in the default INFO, as Redis
    assert "cmdstat_addjob" in r.info("all") and "cmdstat_addjob" in r.info("everything")
    r.config_resetstat()
    assert "cmdstat_addjob" not in r.info("commandstats")


def test_command_table_and_acl_categories_know_slowlog_and_latency(node):
    admin = node.client()
    admin.execute_command("ACL", "SETUSER", "ops", "on", ">pw", "~*", "+@inspect")
    admin.execute_command("ACL", "SETUSER", "boss", "on", ">pw2", "~*", "+@admin")
    assert {b"slowlog", b"latency"} <= set(admin.command_list())
    ops = node.client(username="ops", password="pw")
    assert isinstance(ops.slowlog_len(), int)
    ops.execute_command("LATENCY", "LATEST")
    with pytest.raises(redis.exceptions.NoPermissionError, match=r"no permissions to run the 'slowlog\|reset' command"):
        ops.slowlog_reset()
    with pytest.raises(redis.exceptions.NoPermissionError, match=r"no permissions to run the 'latency\|reset' command"):
        ops.execute_command("LATENCY", "RESET")
    boss = node.client(username="boss", password="pw2")
    assert boss.slowlog_reset()
    assert isinstance(boss.execute_command("LATENCY", "RESET"), int)


def test_log_format_json_gives_one_object_per_line(start_node, tmp_path):
    logfile = tmp_path / "json.log"
    node = start_node(log_format="json", logfile=str(logfile))
    r = node.client()

    def records():
        return [json.loads(line) for line in logfile.read_text().splitlines() if line.strip()]

    ready = wait_for(lambda: [x for x in records() if "Ready to accept" in x["message"]], what="the ready line")
    assert ready[0]["level"] == "notice" and ready[0]["pid"] > 0
    assert ready[0]["node_id"] == r.execute_command("HELLO")[1].decode()
    assert "timestamp" in ready[0]
    r.config_set("loglevel", "verbose")
    r.config_set("log-format", "text")
    r.config_set("log-format", "json")
    # each change is logged in the format it leaves, then the next line takes the new one
    lines = wait_for(lambda: [x for x in logfile.read_text().splitlines() if "log-format" in x][-2:],
                     what="both CONFIG SET lines")  # fmt: skip
    assert len(lines) == 2
    assert json.loads(lines[0])["message"] == "CONFIG SET log-format: json -> text"
    assert lines[1].split(":", 1)[0].isdigit() and lines[1].endswith("CONFIG SET log-format: text -> json")
    r.execute_command("PING")
    r.config_set("loglevel", "notice")  # logged after the switch: JSON again
    last = wait_for(lambda: [x for x in logfile.read_text().splitlines() if "loglevel" in x and "notice" in x],
                    what="the loglevel line")  # fmt: skip
    assert json.loads(last[-1])["level"] == "notice"
    with pytest.raises(redis.ResponseError, match="Invalid log format|log-format"):
        r.config_set("log-format", "xml")
