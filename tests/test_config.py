"""Tests for disque_py.config: parsing, loading, CONFIG GET/SET/REWRITE."""

from __future__ import annotations

import os
import re
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from disque_py import config as C
from disque_py.config import (
    DIRECTIVES,
    REWRITE_MARKER,
    ClientBufferLimit,
    Config,
    ConfigError,
    Kind,
    config_get,
    config_set,
    format_memory,
    load_config,
    parse_config_text,
    parse_memory,
    quote_arg,
    rewrite_config,
    runtime_directives,
    split_args,
)

ROOT = Path(__file__).resolve().parent.parent
EXAMPLE = ROOT / "disque.conf.example"


def write(tmp_path: Path, text: str, name: str = "disque.conf") -> Path:
    p = tmp_path / name
    p.write_text(text)
    return p


def get_map(cfg: Config, pattern: bytes = b"*") -> dict[bytes, bytes]:
    flat = config_get(cfg, pattern)
    return dict(zip(flat[::2], flat[1::2]))


# ---------------------------------------------------------------------------
# Directive table
# ---------------------------------------------------------------------------

DISQUE_DIRECTIVES = """
timeout tcp-keepalive port tcp-backlog bind unixsocket unixsocketperm dir
loglevel logfile syslog-enabled syslog-ident syslog-facility databases include
maxclients maxmemory maxmemory-policy maxmemory-samples activerehashing
daemonize hz appendonly appendfilename no-appendfsync-on-rewrite appendfsync
auto-aof-rewrite-percentage auto-aof-rewrite-min-size
aof-rewrite-incremental-fsync aof-load-truncated aof-enqueue-jobs-once
requirepass pidfile rename-command cluster-config-file cluster-node-timeout
slowlog-log-slower-than slowlog-max-len latency-monitor-threshold
client-output-buffer-limit watchdog-period
""".split()
OURS = ["proto-max-bulk-len", "proto-max-multibulk-len", "client-query-buffer-limit",
        "cluster-secret", "protected-mode", "user"]
#: The admin HTTP port (server/web.py); admin-metrics-max-queues at run time.
OURS += ["admin-port", "admin-bind", "admin-tls", "admin-metrics-max-queues"]
#: ADDJOB's DEDUP keys (core/dedup.py), at run time.
OURS += ["dedup-window"]
#: Redis 6's TLS directives (server/tls.py); all of them but tls-port and tls-cluster at run time.
TLS = ["tls-port", "tls-cert-file", "tls-key-file", "tls-key-file-pass", "tls-ca-cert-file", "tls-ca-cert-dir",
       "tls-auth-clients", "tls-protocols", "tls-ciphers", "tls-ciphersuites", "tls-prefer-server-ciphers",
       "tls-cluster"]
OURS += TLS
OURS.append("log-format")  # text or json log lines (server/logs.py)


def test_table_has_every_directive():
    assert set(DIRECTIVES) == set(DISQUE_DIRECTIVES) | set(OURS)
    for d in DIRECTIVES.values():
        assert isinstance(d.kind, Kind)
        assert d.attr == d.name.replace("-", "_")


def test_defaults():
    cfg = Config()
    assert cfg.port == 7711
    assert cfg.bind == []
    assert cfg.maxmemory == 1024**3
    assert cfg.maxclients == 10000
    assert cfg.timeout == 0
    assert cfg.tcp_keepalive == 0
    assert cfg.loglevel == "notice"
    assert cfg.logfile == ""
    assert cfg.dir == os.getcwd()
    assert cfg.pidfile == "/var/run/disque.pid"
    assert cfg.pidfile_path is None  # default pidfile is never written
    assert cfg.cluster_config_file == "nodes.conf"
    assert cfg.cluster_node_timeout == 15000
    assert cfg.hz == 10
    assert cfg.appendonly is False
    assert cfg.appendfilename == "disque.aof"
    assert cfg.appendfsync == "everysec"
    assert cfg.maxmemory_policy == "acks"
    assert cfg.maxmemory_samples == 5
    assert cfg.tcp_backlog == 511
    assert cfg.databases == 16
    assert cfg.activerehashing is True
    assert cfg.aof_load_truncated is True
    assert cfg.aof_rewrite_incremental_fsync is True
    assert cfg.aof_enqueue_jobs_once is False
    assert cfg.auto_aof_rewrite_percentage == 100
    assert cfg.auto_aof_rewrite_min_size == 64 * 1024**2
    assert cfg.slowlog_log_slower_than == 10000
    assert cfg.slowlog_max_len == 128
    assert cfg.latency_monitor_threshold == 0
    assert cfg.syslog_ident == "disque"
    assert cfg.syslog_facility == "local0"
    assert cfg.unixsocketperm == 0
    assert cfg.client_output_buffer_limit == {"normal": ClientBufferLimit(0, 0, 0)}
    assert cfg.proto_max_bulk_len == 512 * 1024**2
    assert cfg.proto_max_multibulk_len == 1048576
    assert cfg.client_query_buffer_limit == 1024**3
    assert cfg.cluster_secret == ""
    assert cfg.requirepass == ""
    assert cfg.watchdog_period == 0
    assert cfg.config_file is None
    assert cfg.rename_commands == {}
    assert cfg.explicit == set()


def test_get_and_attribute_access():
    cfg = Config()
    assert cfg.get("cluster-node-timeout") == cfg.cluster_node_timeout
    assert cfg.get("cluster_node_timeout") == 15000
    with pytest.raises(KeyError, match="nope"):
        cfg.get("nope")
    with pytest.raises(KeyError, match="include"):
        cfg.get("include")
    with pytest.raises(AttributeError, match="has no attribute 'no_such_thing'"):
        cfg.no_such_thing
    cfg.port = 1234  # direct assignment stores without validation
    assert cfg.get("port") == 1234
    assert not cfg.is_default("port")


def test_runtime_directives_list():
    rt = set(runtime_directives())
    expected = {
        "requirepass", "maxclients", "appendonly", "dir", "client-output-buffer-limit",
        "aof-rewrite-incremental-fsync", "aof-load-truncated", "activerehashing",
        "tcp-keepalive", "aof-enqueue-jobs-once", "maxmemory-samples", "timeout",
        "auto-aof-rewrite-percentage", "auto-aof-rewrite-min-size", "admin-metrics-max-queues",
        "slowlog-log-slower-than", "slowlog-max-len", "latency-monitor-threshold",
        "cluster-node-timeout", "hz", "watchdog-period", "maxmemory", "loglevel",
        "maxmemory-policy", "appendfsync", "proto-max-bulk-len",
        "proto-max-multibulk-len", "client-query-buffer-limit", "protected-mode",
    } | (set(TLS) - {"tls-port", "tls-cluster"}) | {"log-format", "dedup-window"}
    assert rt == expected


# ---------------------------------------------------------------------------
# Line splitting / parse_config_text
# ---------------------------------------------------------------------------


def test_split_args_basic_and_quotes():
    assert split_args(b"port 7711") == [b"port", b"7711"]
    assert split_args("  a\t b   c  ") == [b"a", b"b", b"c"]
    assert split_args(b"") == []
    assert split_args(b'logfile ""') == [b"logfile", b""]
    assert split_args(b'x "a b" \'c d\'') == [b"x", b"a b", b"c d"]
    assert split_args(b'x "\\n\\r\\t\\b\\a\\"\\\\\\q"') == [b"x", b'\n\r\t\b\a"\\q']
    assert split_args(b'x "\\x41\\x7a\\xff"') == [b"x", b"Az\xff"]
    assert split_args(b"x 'it\\'s' 'a\\nb'") == [b"x", b"it's", b"a\\nb"]
    assert split_args(b'x ab"cd"') == [b"x", b"abcd"]


def test_split_args_unbalanced():
    assert split_args(b'x "abc') is None
    assert split_args(b"x 'abc") is None
    assert split_args(b'x "abc"def') is None  # closing quote must end the word
    assert split_args(b"x 'abc'def") is None


@given(st.text(alphabet=st.characters(codec="utf-8", exclude_categories=("Cs",)), max_size=40))
@settings(max_examples=200, deadline=None)
def test_quote_arg_roundtrip(s):
    out = split_args(b"x " + quote_arg(s).encode())
    assert out is not None and out[1].decode() == s


def test_parse_config_text():
    text = """
# a comment
   # indented comment

PORT 7712
bind 127.0.0.1 ::1
requirepass "with space"
logfile ''
"""
    assert parse_config_text(text) == [
        ("port", ["7712"]),
        ("bind", ["127.0.0.1", "::1"]),
        ("requirepass", ["with space"]),
        ("logfile", [""]),
    ]
    assert parse_config_text(b"hz 5\r\n") == [("hz", ["5"])]


def test_parse_config_text_unbalanced_reports_line():
    with pytest.raises(ConfigError, match="Unbalanced quotes") as ei:
        parse_config_text('port 1\n\nrequirepass "oops\n', filename="x.conf")
    e = ei.value
    assert e.linenum == 3
    assert e.filename == "x.conf"
    assert e.line == 'requirepass "oops'
    assert "Unbalanced quotes" in e.message
    assert "at line 3" in str(e) and "x.conf" in str(e) and 'requirepass "oops' in str(e)


# ---------------------------------------------------------------------------
# Memory units
# ---------------------------------------------------------------------------


@pytest.mark.parametrize("text,value", [
    ("0", 0), ("100", 100), ("100b", 100), ("1k", 1000), ("1kb", 1024), ("1K", 1000),
    ("1KB", 1024), ("2m", 2_000_000), ("2mb", 2 * 1024**2), ("3g", 3_000_000_000),
    ("3gb", 3 * 1024**3), ("1Gb", 1024**3), ("-5", -5),
])
def test_parse_memory(text, value):
    assert parse_memory(text) == value


@pytest.mark.parametrize("text", ["", "abc", "1x", "1 kb", "1.5gb", "kb", "+1"])
def test_parse_memory_bad(text):
    assert parse_memory(text) is None


def test_format_memory():
    assert format_memory(0) == "0"
    assert format_memory(1024**3) == "1gb"
    assert format_memory(64 * 1024**2) == "64mb"
    assert format_memory(2048) == "2kb"
    assert format_memory(1000) == "1000"
    for n in (1, 1000, 1024, 1536, 3 * 1024**3, 1000**3):
        assert parse_memory(format_memory(n)) == n


# ---------------------------------------------------------------------------
# Loading files
# ---------------------------------------------------------------------------


def test_load_every_implemented_directive(tmp_path):
    work = tmp_path / "work"
    work.mkdir()
    p = write(tmp_path, f"""
port 7800
bind 127.0.0.1 ::1
dir {work}
logfile "disque.log"
loglevel WARNING
pidfile disque.pid
requirepass "s3cret pass"
maxclients 50
maxmemory 100mb
timeout 30
tcp-keepalive 60
cluster-config-file nodes-7800.conf
cluster-node-timeout 5000
proto-max-bulk-len 1m
proto-max-multibulk-len 1000
client-query-buffer-limit 2gb
cluster-secret abc
""")
    cfg = load_config(str(p), [])
    assert cfg.config_file == str(p)
    assert cfg.port == 7800
    assert cfg.bind == ["127.0.0.1", "::1"]
    assert cfg.dir == str(work)
    assert cfg.logfile == "disque.log"
    assert (work / "disque.log").exists()  # checked like Disque: opened for append
    assert cfg.resolve_path(cfg.logfile) == str(work / "disque.log")
    assert cfg.loglevel == "warning"
    assert cfg.pidfile == "disque.pid"
    assert cfg.pidfile_path == str(work / "disque.pid")
    assert cfg.requirepass == "s3cret pass"
    assert cfg.maxclients == 50
    assert cfg.maxmemory == 100 * 1024**2
    assert cfg.timeout == 30
    assert cfg.tcp_keepalive == 60
    assert cfg.cluster_config_file == "nodes-7800.conf"
    assert cfg.cluster_node_timeout == 5000
    assert cfg.proto_max_bulk_len == 1_000_000
    assert cfg.proto_max_multibulk_len == 1000
    assert cfg.client_query_buffer_limit == 2 * 1024**3
    assert cfg.cluster_secret == "abc"
    assert {"port", "bind", "dir", "pidfile"} <= cfg.explicit
    assert "hz" not in cfg.explicit


def test_load_other_directive_types(tmp_path):
    p = write(tmp_path, """
daemonize yes
syslog-enabled YES
syslog-ident myapp
syslog-facility LOCAL3
unixsocket /tmp/d.sock
unixsocketperm 755
tcp-backlog 128
databases 4
hz 1000
activerehashing no
watchdog-period 200
maxmemory-policy NoEviction
maxmemory-samples 10
client-output-buffer-limit normal 1mb 512kb 30
appendonly yes
appendfilename "jobs.aof"
appendfsync always
no-appendfsync-on-rewrite yes
auto-aof-rewrite-percentage 50
auto-aof-rewrite-min-size 1g
aof-rewrite-incremental-fsync no
aof-load-truncated no
aof-enqueue-jobs-once yes
slowlog-log-slower-than -1
slowlog-max-len 10
latency-monitor-threshold 100
rename-command CONFIG ""
rename-command DEBUG mydebug
""")
    cfg = load_config(str(p), [])
    assert cfg.daemonize is True
    assert cfg.syslog_enabled is True
    assert cfg.syslog_ident == "myapp"
    assert cfg.syslog_facility == "local3"
    assert cfg.unixsocket == "/tmp/d.sock"
    assert cfg.unixsocketperm == 0o755
    assert cfg.tcp_backlog == 128
    assert cfg.databases == 4
    assert cfg.hz == 500  # clamped
    assert cfg.activerehashing is False
    assert cfg.watchdog_period == 200
    assert cfg.maxmemory_policy == "noeviction"
    assert cfg.maxmemory_samples == 10
    assert cfg.client_output_buffer_limit == {"normal": ClientBufferLimit(1024**2, 512 * 1024, 30)}
    assert cfg.appendonly is True
    assert cfg.appendfilename == "jobs.aof"
    assert cfg.appendfsync == "always"
    assert cfg.no_appendfsync_on_rewrite is True
    assert cfg.auto_aof_rewrite_percentage == 50
    assert cfg.auto_aof_rewrite_min_size == 1_000_000_000
    assert cfg.aof_rewrite_incremental_fsync is False
    assert cfg.aof_load_truncated is False
    assert cfg.aof_enqueue_jobs_once is True
    assert cfg.slowlog_log_slower_than == -1
    assert cfg.slowlog_max_len == 10
    assert cfg.latency_monitor_threshold == 100
    assert cfg.rename_commands == {"config": "", "debug": "mydebug"}
    m = get_map(cfg)
    assert m[b"unixsocketperm"] == b"755"
    assert m[b"client-output-buffer-limit"] == b"normal 1048576 524288 30"
    assert b"rename-command" not in m and b"include" not in m


def test_hz_clamped_low(tmp_path):
    assert load_config(None, ["--hz", "0"]).hz == 1


def test_last_occurrence_wins(tmp_path):
    p = write(tmp_path, "port 1000\nport 2000\n")
    assert load_config(str(p), []).port == 2000


def test_overrides_beat_file(tmp_path):
    p = write(tmp_path, "port 7000\nbind 10.0.0.1\nloglevel debug\n")
    cfg = load_config(str(p), ["--port", "7712", "--bind", "127.0.0.1", "::1",
                               "--requirepass", "a b", "--logfile", ""])
    assert cfg.port == 7712
    assert cfg.bind == ["127.0.0.1", "::1"]
    assert cfg.loglevel == "debug"
    assert cfg.requirepass == "a b"
    assert cfg.logfile == ""


def test_overrides_without_file():
    cfg = load_config(None, ["--port", "0", "--cluster-node-timeout", "3000"])
    assert cfg.config_file is None
    assert cfg.port == 0 and cfg.cluster_node_timeout == 3000


def test_override_errors():
    with pytest.raises(ConfigError, match="Invalid port") as ei:
        load_config(None, ["--port", "7000", "--port", "99999"])
    e = ei.value
    assert e.filename == C.COMMAND_LINE and e.linenum == 2
    assert e.line == "port 99999" and e.message == "Invalid port"
    with pytest.raises(ConfigError, match="Bad directive"):
        load_config(None, ["--no-such-thing", "1"])
    with pytest.raises(ConfigError, match="Bad directive"):
        load_config(None, ["--port"])
    with pytest.raises(ConfigError, match="Unexpected argument '7711'"):
        load_config(None, ["7711"])


def test_include(tmp_path):
    (tmp_path / "inc").mkdir()
    write(tmp_path, "maxclients 77\ninclude nested.conf\n", "inc/common.conf")
    write(tmp_path, "hz 20\n", "inc/nested.conf")
    # Relative include names are resolved against 'dir' as configured so far
    # (Disque chdir()s there), so set it first.
    main = write(tmp_path, f"dir {tmp_path}/inc\ninclude common.conf\nport 7001\n"
                 "maxclients 88\n")
    cfg = load_config(str(main), [])
    assert cfg.maxclients == 88 and cfg.hz == 20 and cfg.port == 7001
    assert cfg.config_file == str(main)


def test_include_missing_and_error_inside(tmp_path):
    main = write(tmp_path, f"port 1\ninclude {tmp_path}/missing.conf\n")
    with pytest.raises(ConfigError, match="missing.conf") as ei:
        load_config(str(main), [])
    assert ei.value.linenum == 2 and "missing.conf" in ei.value.message

    inc = write(tmp_path, "\nhz abc\n", "bad.conf")
    main.write_text(f"include {inc}\n")
    with pytest.raises(ConfigError, match="argument must be an integer") as ei:
        load_config(str(main), [])
    assert ei.value.filename == str(inc) and ei.value.linenum == 2


def test_include_loop(tmp_path):
    p = tmp_path / "loop.conf"
    p.write_text(f"include {p}\n")
    with pytest.raises(ConfigError, match="include"):
        load_config(str(p), [])


def test_missing_config_file(tmp_path):
    with pytest.raises(ConfigError, match="Can't open config file"):
        load_config(str(tmp_path / "nope.conf"), [])


def test_relative_config_path_is_made_absolute(tmp_path, monkeypatch):
    write(tmp_path, "port 1\n")
    monkeypatch.chdir(tmp_path)
    cfg = load_config("disque.conf", [])
    assert cfg.config_file == str(tmp_path / "disque.conf")


BAD_LINES = [
    ("port 70000", "Invalid port"),
    ("port -1", "Invalid port"),
    ("port 77x", "Invalid port"),
    ("port 1 2", "Bad directive or wrong number of arguments"),
    ("bogus 1", "Bad directive or wrong number of arguments"),
    ("bind", "Bad directive or wrong number of arguments"),
    ("bind " + " ".join(f"10.0.0.{i}" for i in range(17)), "Too many bind addresses"),
    ("timeout -1", "Invalid timeout value"),
    ("tcp-keepalive -5", "Invalid tcp-keepalive value"),
    ("tcp-backlog -1", "Invalid backlog value"),
    ("unixsocketperm 800", "Invalid socket file permissions"),
    ("unixsocketperm 1777", "Invalid socket file permissions"),
    ("loglevel loud", "Invalid log level"),
    ("syslog-facility local9", "Invalid log facility"),
    ("daemonize maybe", "argument must be 'yes' or 'no'"),
    ("appendonly 1", "argument must be 'yes' or 'no'"),
    ("databases 0", "Invalid number of databases"),
    ("maxclients 0", "Invalid max clients limit"),
    ("maxmemory 0", "memory limit greater than zero"),
    ("maxmemory lots", "memory limit greater than zero"),
    ("maxmemory-policy allkeys-lru", "Invalid maxmemory policy"),
    ("maxmemory-samples 0", "maxmemory-samples must be 1 or greater"),
    ("appendfilename dir/x.aof", "can't be a path"),
    ("appendfsync sometimes", "argument must be 'no', 'always' or 'everysec'"),
    ("auto-aof-rewrite-percentage -1", "Invalid negative percentage"),
    ("auto-aof-rewrite-min-size -1mb", "size"),
    ("requirepass " + "x" * 513, "Password is longer than 512"),
    ("rename-command CONFIG", "Bad directive or wrong number of arguments"),
    ("cluster-node-timeout 0", "cluster node timeout must be 1 or greater"),
    ("latency-monitor-threshold -1", "latency threshold can't be negative"),
    ("client-output-buffer-limit slave 0 0 0", "Unrecognized client limit class"),
    ("client-output-buffer-limit normal 0 0 -1", "Negative number of seconds"),
    ("client-output-buffer-limit normal 0 0", "Bad directive"),
    ("hz fast", "integer"),
    ("proto-max-bulk-len 0", "1024 or greater"),
    ("proto-max-bulk-len 1023", "1024 or greater"),
    ("proto-max-multibulk-len 15", "16 or greater"),
    ("client-query-buffer-limit 100", "1024 or greater"),
    ("include", "Bad directive"),
    ('port "7711', "Unbalanced quotes"),
]


@pytest.mark.parametrize("line,msg", BAD_LINES)
def test_bad_values_report_file_and_line(tmp_path, line, msg):
    p = write(tmp_path, f"# header\nport 7711\n\n{line}\nhz 10\n")
    with pytest.raises(ConfigError, match=re.escape(msg)) as ei:
        load_config(str(p), [])
    e = ei.value
    assert msg in e.message
    assert e.filename == str(p)
    assert e.linenum == 4
    assert e.line == line
    text = str(e)
    assert "at line 4" in text and str(p) in text and line in text


def test_bad_dir(tmp_path):
    p = write(tmp_path, f"dir {tmp_path}/does-not-exist\n")
    with pytest.raises(ConfigError, match="No such file or directory") as ei:
        load_config(str(p), [])
    assert ei.value.linenum == 1
    f = write(tmp_path, "x", "afile")
    with pytest.raises(ConfigError, match="Not a directory"):
        load_config(None, ["--dir", str(f)])


def test_dir_relative_resolution(tmp_path):
    (tmp_path / "a" / "b").mkdir(parents=True)
    cfg = load_config(None, ["--dir", str(tmp_path / "a"), "--dir", "b"])
    assert cfg.dir == str(tmp_path / "a" / "b")


def test_bad_logfile(tmp_path):
    p = write(tmp_path, f"port 1\nlogfile {tmp_path}/no/such/dir/x.log\n")
    with pytest.raises(ConfigError, match="Can't open the log file") as ei:
        load_config(str(p), [])
    assert ei.value.linenum == 2


def test_logfile_resolved_against_final_dir(tmp_path):
    (tmp_path / "w").mkdir()
    cfg = load_config(None, ["--logfile", "x.log", "--dir", str(tmp_path / "w")])
    assert (tmp_path / "w" / "x.log").exists()
    assert cfg.resolve_path(cfg.logfile) == str(tmp_path / "w" / "x.log")


def test_pidfile_only_when_explicit(tmp_path):
    assert load_config(None, []).pidfile_path is None
    cfg = load_config(None, ["--pidfile", "/var/run/disque.pid"])
    assert cfg.pidfile_path == "/var/run/disque.pid"
    cfg = load_config(None, ["--dir", str(tmp_path), "--pidfile", "d.pid"])
    assert cfg.pidfile_path == str(tmp_path / "d.pid")


def test_rename_command_checked_against_known_commands():
    cmds = ["ping", "config", "debug", "info"]
    cfg = load_config(None, ["--rename-command", "CONFIG", "cfg"], commands=cmds)
    assert cfg.rename_commands == {"config": "cfg"}
    with pytest.raises(ConfigError, match="No such command"):
        load_config(None, ["--rename-command", "nosuch", "x"], commands=cmds)
    with pytest.raises(ConfigError, match="already exists"):
        load_config(None, ["--rename-command", "debug", "PING"], commands=cmds)
    # Without a command list anything is accepted (the server checks later).
    assert load_config(None, ["--rename-command", "nosuch", "x"]).rename_commands == {"nosuch": "x"}


def test_load_utf8_and_hex_escapes(tmp_path):
    p = tmp_path / "u.conf"
    p.write_bytes('requirepass "p\\xc3\\xa4ss"\nsyslog-ident "ünï"\n'.encode())
    cfg = load_config(str(p), [])
    assert cfg.requirepass == "päss"
    assert cfg.syslog_ident == "ünï"


# ---------------------------------------------------------------------------
# CONFIG GET
# ---------------------------------------------------------------------------


def test_config_get_star_lists_everything_once():
    cfg = Config()
    flat = config_get(cfg, b"*")
    names = flat[::2]
    assert len(names) == len(set(names))
    expected = {n.encode() for n, d in DIRECTIVES.items() if d.in_get}
    assert set(names) == expected
    assert b"include" not in names and b"rename-command" not in names
    assert all(isinstance(x, bytes) for x in flat)


def test_config_get_patterns():
    cfg = load_config(None, ["--bind", "127.0.0.1", "::1", "--maxmemory", "2mb"])
    assert config_get(cfg, b"port") == [b"port", b"7711"]
    assert config_get(cfg, b"PORT") == [b"port", b"7711"]
    assert config_get(cfg, b"nothing-matches-this") == []
    m = get_map(cfg, b"max*")
    assert set(m) == {b"maxmemory", b"maxmemory-policy", b"maxmemory-samples", b"maxclients"}
    assert m[b"maxmemory"] == str(2 * 1024**2).encode()  # plain bytes
    m = get_map(cfg, b"*-policy")
    assert m == {b"maxmemory-policy": b"acks"}
    assert get_map(cfg, b"bind") == {b"bind": b"127.0.0.1 ::1"}


def test_config_get_rendering():
    cfg = Config()
    m = get_map(cfg)
    assert m[b"appendonly"] == b"no"
    assert m[b"activerehashing"] == b"yes"
    assert m[b"maxmemory"] == b"1073741824"
    assert m[b"client-output-buffer-limit"] == b"normal 0 0 0"
    assert m[b"loglevel"] == b"notice"
    assert m[b"bind"] == b""
    assert m[b"requirepass"] == b""
    assert m[b"dir"] == os.getcwd().encode()
    assert m[b"pidfile"] == b"/var/run/disque.pid"
    assert m[b"tcp-keepalive"] == b"0"
    assert m[b"unixsocketperm"] == b"0"
    assert cfg.render_directive("maxmemory") == "1073741824"
    assert cfg.render_directive("maxmemory", for_file=True) == "1gb"
    assert cfg.render_directive("logfile", for_file=True) == '""'
    assert cfg.render_directive("client-output-buffer-limit", for_file=True) == "normal 0 0 0"


# ---------------------------------------------------------------------------
# CONFIG SET
# ---------------------------------------------------------------------------


@pytest.mark.parametrize("name,value,expected", [
    ("timeout", "30", 30),
    ("tcp-keepalive", "60", 60),
    ("tcp-keepalive", "yes", 1),
    ("tcp-keepalive", "no", 0),
    ("loglevel", "DEBUG", "debug"),
    ("maxmemory", "2gb", 2 * 1024**3),
    ("maxmemory", "1000", 1000),
    ("maxmemory-policy", "noeviction", "noeviction"),
    ("maxmemory-samples", "3", 3),
    ("maxclients", "5", 5),
    ("requirepass", "secret", "secret"),
    ("requirepass", "", ""),
    ("cluster-node-timeout", "1000", 1000),
    ("hz", "100", 100),
    ("hz", "0", 1),
    ("hz", "100000", 500),
    ("appendfsync", "always", "always"),
    ("appendonly", "yes", True),
    ("activerehashing", "no", False),
    ("aof-load-truncated", "no", False),
    ("aof-rewrite-incremental-fsync", "no", False),
    ("aof-enqueue-jobs-once", "yes", True),
    ("auto-aof-rewrite-percentage", "0", 0),
    ("auto-aof-rewrite-min-size", "1mb", 1024**2),
    ("slowlog-log-slower-than", "0", 0),
    ("slowlog-log-slower-than", "-1", -1),
    ("slowlog-max-len", "1000", 1000),
    ("latency-monitor-threshold", "5", 5),
    ("watchdog-period", "100", 100),
    ("proto-max-bulk-len", "1kb", 1024),
    ("proto-max-multibulk-len", "16", 16),
    ("client-query-buffer-limit", "64mb", 64 * 1024**2),
    ("client-output-buffer-limit", "normal 100 50 10",
     {"normal": ClientBufferLimit(100, 50, 10)}),
])
def test_config_set_runtime(name, value, expected):
    cfg = Config()
    config_set(cfg, name.encode(), value.encode())
    assert cfg.get(name) == expected
    assert name in cfg.explicit


def test_config_set_name_case_insensitive():
    cfg = Config()
    config_set(cfg, b"MaxClients", b"7")
    assert cfg.maxclients == 7


def test_config_set_dir(tmp_path):
    cfg = Config()
    config_set(cfg, b"dir", str(tmp_path).encode())
    assert cfg.dir == str(tmp_path)
    (tmp_path / "sub").mkdir()
    config_set(cfg, b"dir", b"sub")
    assert cfg.dir == str(tmp_path / "sub")
    with pytest.raises(ConfigError, match="Changing directory: No such file"):
        config_set(cfg, b"dir", b"nope")
    assert cfg.dir == str(tmp_path / "sub")


@pytest.mark.parametrize("name", [
    "port", "bind", "logfile", "pidfile", "cluster-config-file", "daemonize",
    "databases", "unixsocket", "appendfilename", "include", "rename-command",
    "cluster-secret", "syslog-enabled", "tcp-backlog", "no-appendfsync-on-rewrite",
    "no-such-param",
])
def test_config_set_not_runtime(name):
    cfg = Config()
    before = cfg.as_dict()
    with pytest.raises(ConfigError, match=f"^Unsupported CONFIG parameter: {name.upper()}$"):
        config_set(cfg, name.upper().encode(), b"1")
    assert cfg.as_dict() == before


@pytest.mark.parametrize("name,value", [
    ("timeout", "-1"),
    ("timeout", "abc"),
    ("timeout", "1.5"),
    ("tcp-keepalive", "-1"),
    ("tcp-keepalive", "maybe"),
    ("maxclients", "0"),
    ("maxmemory", "-1"),
    ("maxmemory", "0"),
    ("maxmemory", "1zb"),
    ("maxmemory-policy", "volatile-lru"),
    ("loglevel", "loud"),
    ("log-format", "xml"),
    ("appendonly", "1"),
    ("appendfsync", "sometimes"),
    ("cluster-node-timeout", "0"),
    ("hz", "-1"),
    ("requirepass", "x" * 513),
    ("proto-max-bulk-len", "0"),
    # below the floors, CONFIG SET would lock every client out (CONFIG SET itself has 4 arguments)
    ("proto-max-bulk-len", "5"),
    ("proto-max-multibulk-len", "3"),
    ("client-query-buffer-limit", "1"),
    ("client-output-buffer-limit", "normal 1 2"),
    ("client-output-buffer-limit", "pubsub 1 2 3"),
    ("client-output-buffer-limit", "normal 1 2 -3"),
    ("client-output-buffer-limit", "normal x 2 3"),
])
def test_config_set_bad_values(name, value):
    cfg = Config()
    before = cfg.as_dict()
    with pytest.raises(ConfigError, match=f"^{re.escape(f'Invalid argument {value!r} for CONFIG SET {name!r}')}$"):
        config_set(cfg, name.encode(), value.encode())
    assert cfg.as_dict() == before
    assert name not in cfg.explicit


def test_on_change_hooks():
    cfg = Config()
    calls = []
    cfg.on_change.append(lambda n, o, v: calls.append(("a", n, o, v)))
    cfg.on_change.append(lambda n, o, v: calls.append(("b", n, o, v)))
    config_set(cfg, b"maxmemory", b"10mb")
    config_set(cfg, b"LOGLEVEL", b"debug")
    assert calls == [
        ("a", "maxmemory", 1024**3, 10 * 1024**2),
        ("b", "maxmemory", 1024**3, 10 * 1024**2),
        ("a", "loglevel", "notice", "debug"),
        ("b", "loglevel", "notice", "debug"),
    ]
    calls.clear()
    with pytest.raises(ConfigError, match="Invalid argument 'bad' for CONFIG SET 'maxmemory'"):
        config_set(cfg, b"maxmemory", b"bad")
    with pytest.raises(ConfigError, match="Unsupported CONFIG parameter: port"):
        config_set(cfg, b"port", b"1")
    assert calls == []  # no hooks on failure


def test_on_change_hook_can_veto():
    cfg = Config()
    seen = []

    def first(name, old, new):
        seen.append((name, old, new))

    def veto(name, old, new):
        if name == "maxclients" and new > 100:
            raise ConfigError("The operating system is not able to handle the "
                              "specified number of clients, try with 100")

    cfg.on_change += [first, veto]
    with pytest.raises(ConfigError, match="try with 100"):
        config_set(cfg, b"maxclients", b"1000")
    assert cfg.maxclients == 10000
    assert "maxclients" not in cfg.explicit
    # The hook that had accepted the change is told about the revert.
    assert seen == [("maxclients", 10000, 1000), ("maxclients", 1000, 10000)]
    config_set(cfg, b"maxclients", b"50")
    assert cfg.maxclients == 50


def test_config_set_then_get():
    cfg = Config()
    config_set(cfg, b"client-output-buffer-limit", b"normal 1mb 2kb 5")
    assert get_map(cfg, b"client-output-buffer-limit") == {
        b"client-output-buffer-limit": b"normal 1048576 2048 5"}
    config_set(cfg, b"appendonly", b"yes")
    assert get_map(cfg, b"appendonly") == {b"appendonly": b"yes"}


# ---------------------------------------------------------------------------
# CONFIG REWRITE
# ---------------------------------------------------------------------------

ORIGINAL = """\
# My disque config
#   with several comment lines

port 7000

# memory
maxmemory 100mb
MAXCLIENTS 500
include {inc}
rename-command DEBUG ""
timeout 10
timeout 20
unknown-directive-from-the-future 1
appendfilename "disque.aof"

# the end
"""


@pytest.fixture
def conf(tmp_path):
    inc = write(tmp_path, "hz 10\n", "inc.conf")
    p = write(tmp_path, ORIGINAL.format(inc=inc))
    return p


def test_rewrite_requires_config_file():
    with pytest.raises(ConfigError, match="The server is running without a config file"):
        rewrite_config(Config())


def test_rewrite_unchanged_keeps_file_identical(tmp_path):
    p = write(tmp_path, "# hello\nport 7000\n\n# bye\nmaxmemory 100mb\nloglevel notice\n")
    cfg = load_config(str(p), [])
    before = p.read_text()
    rewrite_config(cfg)
    assert p.read_text() == before


def test_rewrite_preserves_comments_and_order(conf, tmp_path):
    # The loader rejects the unknown directive, so build the Config by hand
    # as if the file had been edited after startup.
    cfg = Config()
    cfg.config_file = str(conf)
    cfg.port = 7000
    cfg.maxmemory = 100 * 1024**2
    cfg.maxclients = 500
    cfg.timeout = 20
    config_set(cfg, b"maxclients", b"600")
    config_set(cfg, b"timeout", b"0")
    config_set(cfg, b"loglevel", b"warning")  # not in file, non-default -> appended
    config_set(cfg, b"hz", b"10")  # default, not in file -> not added
    config_set(cfg, b"maxmemory-policy", b"acks")  # default -> not added
    config_set(cfg, b"requirepass", b"pw")
    rewrite_config(cfg)
    lines = conf.read_text().splitlines()
    inc = tmp_path / "inc.conf"
    assert lines == [
        "# My disque config",
        "#   with several comment lines",
        "",
        "port 7000",
        "",
        "# memory",
        "maxmemory 100mb",
        "maxclients 600",
        f"include {inc}",
        'rename-command DEBUG ""',
        "timeout 0",  # first occurrence updated, duplicate dropped
        "unknown-directive-from-the-future 1",
        'appendfilename "disque.aof"',
        "",
        "# the end",
        REWRITE_MARKER,  # appended lines follow the directive table order
        "loglevel warning",
        'requirepass "pw"',
    ]
    # A second rewrite with nothing changed is a no-op, and the marker is
    # not duplicated when more lines get appended.
    text = conf.read_text()
    rewrite_config(cfg)
    assert conf.read_text() == text
    config_set(cfg, b"appendonly", b"yes")
    rewrite_config(cfg)
    lines = conf.read_text().splitlines()
    assert lines.count(REWRITE_MARKER) == 1
    assert lines[-1] == "appendonly yes"


def test_rewrite_appends_non_default_overrides_and_reloads(tmp_path):
    work = tmp_path / "w"
    work.mkdir()
    p = write(tmp_path, "# only a comment\n")
    cfg = load_config(str(p), [
        "--port", "7712", "--bind", "127.0.0.1", "::1", "--dir", str(work),
        "--requirepass", 'we"ird \\ pass\n', "--maxmemory", "1500000",
        "--client-output-buffer-limit", "normal", "1mb", "0", "10",
        "--pidfile", "/var/run/disque.pid", "--cluster-secret", "s",
        "--hz", "10",
    ])
    rewrite_config(cfg)
    text = p.read_text()
    assert text.startswith("# only a comment\n" + REWRITE_MARKER + "\n")
    assert "port 7712\n" in text
    assert "bind 127.0.0.1 ::1\n" in text
    assert f'dir "{work}"\n' in text
    assert "maxmemory 1500000\n" in text
    assert "client-output-buffer-limit normal 1mb 0 10\n" in text
    assert 'pidfile "/var/run/disque.pid"\n' in text  # explicit pidfile persisted
    assert "\nhz " not in text  # default value not added
    again = load_config(str(p), [])
    for name in ("port", "bind", "dir", "requirepass", "maxmemory",
                 "client-output-buffer-limit", "cluster-secret"):
        assert again.get(name) == cfg.get(name), name
    assert again.pidfile_path == "/var/run/disque.pid"


def test_rewrite_removes_cleared_nullable_values(tmp_path):
    p = write(tmp_path, "requirepass old\n# keep\nrequirepass older\nport 1\n")
    cfg = load_config(str(p), [])
    config_set(cfg, b"requirepass", b"")
    rewrite_config(cfg)
    assert p.read_text() == "# keep\nport 1\n"


def test_rewrite_changed_value_in_place_formats_memory(tmp_path):
    p = write(tmp_path, "# a\nmaxmemory 1g\n# b\n")
    cfg = load_config(str(p), [])
    rewrite_config(cfg)
    assert p.read_text() == "# a\nmaxmemory 1g\n# b\n"  # unchanged value kept verbatim
    config_set(cfg, b"maxmemory", b"2gb")
    rewrite_config(cfg)
    assert p.read_text() == "# a\nmaxmemory 2gb\n# b\n"


def test_rewrite_keeps_unparsable_line_as_comment(tmp_path):
    p = write(tmp_path, "port 1\n")
    cfg = load_config(str(p), [])
    p.write_text('port 1\nrequirepass "broken\n')
    rewrite_config(cfg)
    assert p.read_text() == 'port 1\n# ??? requirepass "broken\n'


def test_rewrite_missing_file_is_created(tmp_path):
    p = write(tmp_path, "port 1234\n")
    cfg = load_config(str(p), [])
    p.unlink()
    rewrite_config(cfg)
    assert p.read_text() == REWRITE_MARKER + "\nport 1234\n"


def test_rewrite_is_atomic(tmp_path, monkeypatch):
    p = write(tmp_path, "# comment one\nport 7000\n# comment two\n")
    os.chmod(p, 0o600)
    cfg = load_config(str(p), [])
    ino = os.stat(p).st_ino
    config_set(cfg, b"timeout", b"5")
    rewrite_config(cfg)
    assert os.stat(p).st_ino != ino  # replaced, not rewritten in place
    assert os.stat(p).st_mode & 0o777 == 0o600  # permissions preserved
    assert p.read_text() == ("# comment one\nport 7000\n# comment two\n"
                             + REWRITE_MARKER + "\ntimeout 5\n")
    assert sorted(os.listdir(tmp_path)) == ["disque.conf"]  # no temp files left

    # A failure while replacing leaves the old file intact and no temp file.
    before = p.read_text()

    def boom(src, dst):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(C.os, "replace", boom)
    config_set(cfg, b"timeout", b"6")
    with pytest.raises(ConfigError, match="Rewriting config file: No space left"):
        rewrite_config(cfg)
    assert p.read_text() == before
    assert sorted(os.listdir(tmp_path)) == ["disque.conf"]


def test_rewrite_follows_symlink(tmp_path):
    real = write(tmp_path, "port 1\n", "real.conf")
    link = tmp_path / "link.conf"
    link.symlink_to(real)
    cfg = load_config(str(link), [])
    config_set(cfg, b"timeout", b"9")
    rewrite_config(cfg)
    assert link.is_symlink()
    assert "timeout 9" in real.read_text()


# ---------------------------------------------------------------------------
# disque.conf.example
# ---------------------------------------------------------------------------


def test_example_config_loads_with_defaults(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    cfg = load_config(str(EXAMPLE), [])
    defaults = Config()
    for name, d in DIRECTIVES.items():
        if d.stored and name != "rename-command":
            assert cfg.get(name) == defaults.get(name), name
    assert cfg.pidfile_path is None


def test_example_mentions_every_directive():
    text = EXAMPLE.read_text()
    for name in DIRECTIVES:
        assert re.search(rf"^(# )?{re.escape(name)}\b", text, re.M), name


def test_example_commented_directives_are_valid(tmp_path):
    # Uncommenting any example directive line must still load.
    for line in EXAMPLE.read_text().splitlines():
        m = re.match(r"# ([a-z-]+) (.*)$", line)
        if not m or m.group(1) not in DIRECTIVES or m.group(1) == "include":
            continue
        parse_config_text(line[2:])
        if m.group(1) in ("dir", "logfile", "pidfile", "unixsocket"):
            continue
        load_config(None, ["--" + m.group(1)] + [a.decode() for a in split_args(m.group(2))])


def test_example_rewrite_is_noop(tmp_path):
    p = tmp_path / "disque.conf"
    p.write_text(EXAMPLE.read_text())
    cfg = load_config(str(p), [])
    cfg.dir = str(tmp_path)
    rewrite_config(cfg)
    new = p.read_text().splitlines()
    old = EXAMPLE.read_text().splitlines()
    assert len(new) == len(old)
    diff = [(a, b) for a, b in zip(old, new) if a != b]
    assert diff == [("dir ./", f'dir "{tmp_path}"')]


def _example_markers() -> dict[str, tuple[bool, bool]]:
    """For each directive, whether the comment block above its first line in
    disque.conf.example says [NOT YET ACTIVE] and [RUNTIME]."""
    block: list[str] = []
    seen: dict[str, tuple[bool, bool]] = {}
    for line in EXAMPLE.read_text().splitlines():
        if not line.strip():
            block = []
            continue
        m = re.match(r"^(?:# )?([a-z-]+)(?: |$)", line)
        if m and m.group(1) in DIRECTIVES:
            text = " ".join(block)
            seen.setdefault(m.group(1), ("[NOT YET ACTIVE]" in text, "[RUNTIME]" in text))
            continue
        block.append(line)
    return seen


def test_example_says_honestly_which_directives_act():
    # The table's `implemented` flag is the truth the example, the README and the
    # start-up warning (inactive_settings) are built on: they must not drift apart.
    markers = _example_markers()
    for name, d in DIRECTIVES.items():
        not_active, runtime = markers[name]
        assert not_active == (not d.implemented), name
        assert runtime == d.runtime, name
    assert DIRECTIVES["maxmemory"].implemented  # acted on (core/memory.py)
    assert not DIRECTIVES["maxmemory-samples"].implemented  # accepted, not used
    assert DIRECTIVES["tcp-backlog"].implemented and DIRECTIVES["cluster-secret"].implemented


def test_inactive_settings_names_only_changed_directives_without_effect():
    cfg = load_config(None, ["--maxmemory-samples", "10", "--no-appendfsync-on-rewrite", "yes", "--appendonly", "yes",
                             "--port", "7800", "--hz", "10", "--rename-command", "DEBUG", "", "--maxmemory", "100mb"])
    # hz 10 is its default: set, but nothing differs from an unset node; appendonly and maxmemory act
    assert C.inactive_settings(cfg) == ["rename-command", "maxmemory-samples", "no-appendfsync-on-rewrite"]
    assert C.inactive_settings(load_config(None, [])) == []
