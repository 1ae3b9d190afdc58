"""The node's table of workers (server/workers.py): WORKER BEAT, LIST, FORGET and HELP on a clock of
the test's own; what a bad or hostile BEAT gets. The same command on real processes:
tests/integration/test_workers_process.py."""

from __future__ import annotations

import json

import pytest

from disque_py.core.replies import Error, Status
from disque_py.server import workers as wmod
from disque_py.server.workers import MAX_INFO, MAX_WORKERS, WorkerTable


class Conn:
    def __init__(self, cid: int = 7, addr: str = "10.0.0.9:40001") -> None:
        self.id = cid
        self.addr = addr


class Clock:
    def __init__(self) -> None:
        self.now = 1_000_000

    def __call__(self) -> int:
        return self.now


@pytest.fixture
def clock():
    return Clock()


@pytest.fixture
def table(clock):
    return WorkerTable(clock)


def run(table: WorkerTable, *argv, conn=None):
    words = [a if isinstance(a, bytes) else str(a).encode() for a in argv]
    return table.cmd_worker(conn or Conn(), [b"WORKER", *words])


def listed(table: WorkerTable) -> list[dict]:
    return [json.loads(e) for e in run(table, "LIST")]


def test_a_beat_registers_the_worker_with_the_nodes_view_around_its_info(table, clock):
    info = {"host": "h1", "pid": 42, "running": [{"id": "D-1", "queue": "q"}, {"id": "D-2", "queue": "q"}]}
    assert run(table, "BEAT", "h1:42:abc", 1000, json.dumps(info), conn=Conn(3, "127.0.0.1:5000")) == Status(b"OK")
    clock.now += 250
    [entry] = listed(table)
    assert entry == {"id": "h1:42:abc", "addr": "127.0.0.1:5000", "client_id": 3, "interval_ms": 1000,
                     "last_beat_ago": 0.25, "beats": 1, "info": info}  # fmt: skip
    assert (table.count(), table.running()) == (1, 2)
    # a second beat refreshes it, from wherever it comes
    assert run(table, "BEAT", "h1:42:abc", 2000, '{"host":"h1"}', conn=Conn(9, "127.0.0.1:6000")) == Status(b"OK")
    [entry] = listed(table)
    assert (entry["beats"], entry["interval_ms"], entry["addr"]) == (2, 2000, "127.0.0.1:6000")
    assert entry["last_beat_ago"] == 0
    assert table.running() == 0


def test_a_silent_worker_drops_off_after_three_intervals_and_forget_drops_at_once(table, clock):
    run(table, "BEAT", "a", 1000, "{}")
    run(table, "BEAT", "b", 500, "{}")
    clock.now += 1499
    assert sorted(e["id"] for e in listed(table)) == ["a", "b"]
    clock.now += 1  # b: 3 x 500 ms without a beat
    assert [e["id"] for e in listed(table)] == ["a"]
    clock.now += 1500
    assert listed(table) == [] and table.count() == 0
    run(table, "BEAT", "c", 1000, "{}")
    assert run(table, "FORGET", "c") == 1 and run(table, "FORGET", "c") == 0
    assert listed(table) == []


def test_the_cron_expiry_drops_the_silent_and_costs_nothing_when_empty(table, clock):
    assert table.expire() == 0
    run(table, "BEAT", "a", 100, "{}")
    run(table, "BEAT", "b", 1000, "{}")
    clock.now += 300
    assert table.expire() == 1 and list(table.entries) == ["b"]


@pytest.mark.parametrize("argv, text", [
    (("BEAT", "w", "-5", "{}"), "ERR invalid interval '-5': milliseconds between 100 and 86400000"),
    (("BEAT", "w", "99", "{}"), "ERR invalid interval '99'"),
    (("BEAT", "w", "1e3", "{}"), "ERR invalid interval '1e3'"),
    (("BEAT", "w", "86400001", "{}"), "ERR invalid interval '86400001'"),
    (("BEAT", "w w", "1000", "{}"), "ERR invalid worker ID 'w w': 1 to 256 printable characters, no spaces"),
    (("BEAT", "", "1000", "{}"), "ERR invalid worker ID ''"),
    (("BEAT", "x" * 257, "1000", "{}"), "ERR invalid worker ID 'xxxx"),
    (("BEAT", b"w\r\n", "1000", "{}"), "ERR invalid worker ID 'w\\x0d\\x0a'"),
    (("BEAT", "w", "1000", "[1, 2]"), "ERR worker info must be a JSON object"),
    (("BEAT", "w", "1000", "not json"), "ERR worker info is not JSON: Expecting value"),
    (("BEAT", "w", "1000", '{"a": NaN}'), "ERR worker info is not JSON: NaN is not JSON"),
    (("BEAT", "w", "1000", '{"a": Infinity}'), "ERR worker info is not JSON: Infinity is not JSON"),
    (("BEAT", "w", "1000", b'{"a": "\xff"}'), "ERR worker info is not JSON: 'utf-8' codec can't decode"),
    (("BEAT", "w", "1000", "[" * 16000), "ERR worker info is not JSON: maximum recursion depth"),
    (("BEAT", "w", "1000", '{"a": "' + "x" * MAX_INFO + '"}'), "ERR worker info too large: 16393 bytes, at most 16384"),
    (("BEAT", "w", "1000"), "ERR unknown subcommand or wrong number of arguments for 'BEAT'. Try WORKER HELP."),
    (("BEAT", "w", "1000", "{}", "extra"), "ERR unknown subcommand or wrong number of arguments for 'BEAT'"),
    (("LIST", "x"), "ERR unknown subcommand or wrong number of arguments for 'LIST'"),
    (("FORGET",), "ERR unknown subcommand or wrong number of arguments for 'FORGET'"),
    (("NOPE",), "ERR unknown subcommand or wrong number of arguments for 'NOPE'. Try WORKER HELP."),
])  # fmt: skip
def test_bad_input_gets_a_clear_error_and_changes_nothing(table, argv, text):
    run(table, "BEAT", "kept", 1000, '{"ok": true}')
    reply = run(table, *argv)
    assert isinstance(reply, Error) and reply.startswith(text), reply
    assert "\r" not in reply and "\n" not in reply
    assert [e["id"] for e in listed(table)] == ["kept"] and listed(table)[0]["info"] == {"ok": True}


def test_the_table_holds_at_most_max_workers(table, clock, monkeypatch):
    monkeypatch.setattr(wmod, "MAX_WORKERS", 3)
    for name in ("a", "b", "c"):
        assert run(table, "BEAT", name, 1000, "{}") == Status(b"OK")
    reply = run(table, "BEAT", "d", 1000, "{}")
    assert reply == Error("ERR too many workers: this node keeps 3 at most")
    assert run(table, "BEAT", "a", 1000, "{}") == Status(b"OK")  # one already known still beats
    clock.now += 2999
    run(table, "BEAT", "b", 1000, "{}")
    clock.now += 1  # a and c are past their time: room for d, found at the refusal's own expiry
    assert run(table, "BEAT", "d", 1000, "{}") == Status(b"OK")
    assert sorted(table.entries) == ["b", "d"]
    assert MAX_WORKERS == 10_000  # the real bound is untouched


def test_help_lists_the_subcommands(table):
    lines = run(table, "HELP")
    assert all(isinstance(line, Status) for line in lines)
    text = b"\n".join(lines).decode()
    for word in ("BEAT <worker-id> <interval-ms> <info-json>", "FORGET <worker-id>", "LIST", "HELP"):
        assert word in text
