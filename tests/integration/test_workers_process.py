"""Workers in plain sight, on real processes: worker processes (``disque-py worker``) beat to a
node process, ``disque-py workers`` (a process too) lists them with the job each runs, a clean
stop drops a worker at once, one killed with -9 drops after 3 of its intervals, their
connections are named in CLIENT LIST, and bad WORKER input gets clear errors while the node
serves on."""

from __future__ import annotations

import json
import re
import socket
import subprocess
import sys
import time

import pytest
import redis
import trio
from click.testing import CliRunner

from disque_py.cli.app import main
from disque_py.client.aio import Client as AioClient
from disque_py.client.config import ClientConfig
from disque_py.client.connection import NodeConnection

from .conftest import ROOT, wait_for
from .worker_procs import WorkerProcess, holders_module, listed_when, release, started, workers_json

pytestmark = pytest.mark.integration


def addr(node) -> str:
    return "%s:%d" % (node.host, node.port)


def client_names(r: redis.Redis) -> list[str]:
    lines = r.execute_command("CLIENT", "LIST").decode().splitlines()
    return [line.split(" name=", 1)[1].split(" ", 1)[0] for line in lines]


@pytest.fixture
def holders(tmp_path, monkeypatch, node):
    return holders_module(tmp_path, monkeypatch, addr(node))


@pytest.fixture
def workers():
    started_procs: list[WorkerProcess] = []

    def start(*args, **kw) -> WorkerProcess:
        proc = WorkerProcess(*args, **kw)
        started_procs.append(proc)
        return proc

    yield start
    for proc in started_procs:
        proc.close()


def test_two_workers_are_listed_with_the_job_each_runs_then_drop_off_on_stop_and_on_kill(node, holders, workers):
    directory, mod = holders
    r = node.client()
    plain = workers(directory, "holders:hold", "-q", "plain-q", "-n", addr(node), "--beacon-interval", "0.3")
    tasks = workers(directory, "holders:app", "-n", addr(node), "-c", "2", "--beacon-interval", "1")
    job_id = r.execute_command("ADDJOB", "plain-q", "payload", 0).decode()
    ref = mod.crunch.send(7)
    wait_for(lambda: started(directory, job_id) and started(directory, ref.id), timeout=30, what="both jobs started")

    def both_running(by_id) -> bool:
        return len(by_id) == 2 and all(w["running"] for w in by_id.values())

    got = listed_when([addr(node)], both_running, "two workers, each with its job")
    by_pid = {w["pid"]: w for w in got["workers"]}
    assert set(by_pid) == {plain.pid, tasks.pid} and got["unreachable"] == []
    p, t = by_pid[plain.pid], by_pid[tasks.pid]
    host = socket.gethostname()
    assert p["id"].startswith("%s:%d:" % (host, plain.pid)) and p["host"] == host
    assert (p["queues"], p["concurrency"], p["handler"], p["interval"]) == (["plain-q"], 1, "holders:hold", 0.3)
    assert [(j["id"], j["queue"], j["label"]) for j in p["running"]] == [(job_id, "plain-q", "")]
    assert (t["queues"], t["concurrency"], t["interval"]) == (["crunching"], 2, 1.0)
    assert [(j["id"], j["queue"], j["label"]) for j in t["running"]] == [(ref.id, "crunching", mod.crunch.name)]
    for w in (p, t):
        assert w["running_total"] == 1 and w["in_flight"] == 1 and w["processed"] == 0 and not w["stopping"]
        assert 0 <= w["running"][0]["running_for"] < 60 and w["node"] == got["workers"][0]["node"]
        assert w["last_beat_ago"] <= 3 * w["interval"] and w["addr"].startswith("127.0.0.1:")

    # each names its connections (CLIENT LIST's name=), as INFO counts them
    names = client_names(r)
    for proc in (plain, tasks):
        assert "disque-py-worker:%s:%d" % (host, proc.pid) in names
    assert r.info("clients")["connected_workers"] == 2

    # the table: each worker, and its job under it
    out = subprocess.run([sys.executable, "-m", "disque_py.cli", "workers", "-p", str(node.port)], cwd=str(ROOT),
                         capture_output=True, timeout=30)  # fmt: skip
    text = out.stdout.decode()
    assert out.returncode == 0 and text.startswith("WORKER ") and "LAST BEAT" in text.splitlines()[0], text
    assert p["id"] in text and t["id"] in text
    assert any(line.startswith("    " + job_id) and "holders:hold" in line for line in text.splitlines()), text
    assert any(line.startswith("    " + ref.id) and mod.crunch.name in line for line in text.splitlines()), text

    # top --once --json has them under "workers"
    result = CliRunner().invoke(main, ["top", "--nodes", addr(node), "--json", "--interval", "0.2"])
    assert result.exit_code == 0, result.output
    top_workers = {w["id"]: w for w in json.loads(result.stdout)["workers"]}
    assert set(top_workers) == {p["id"], t["id"]}
    assert [j["id"] for j in top_workers[p["id"]]["running"]] == [job_id]
    # and its tables: a line per worker, with what it runs now
    result = CliRunner().invoke(main, ["top", "--nodes", addr(node), "--once", "--interval", "0.2"])
    assert result.exit_code == 0, result.output
    lines = result.output.splitlines()
    assert any(line.startswith("WORKER") and "NOW RUNNING" in line for line in lines), result.output
    assert any(line.startswith(t["id"]) and mod.crunch.name in line for line in lines), result.output
    assert any(line.startswith(p["id"]) and "holders:hold" in line for line in lines), result.output

    # done: the counters move, nothing runs
    release(directory)
    listed_when([addr(node)], lambda by_id: all(w["processed"] == 1 and not w["running"] for w in by_id.values()),
                "both jobs done")  # fmt: skip
    assert ref.result(timeout=10) == 7

    # a clean stop: off the list at once (WORKER FORGET), its exit line readable
    log = plain.stop()
    assert p["id"] not in {w["id"] for w in workers_json(addr(node))["workers"]}
    assert "worker stopped: processed=1 failed=0 retried=0 dead=0 released=0 fetched=1 in_flight=0" in log
    assert "WorkerStats(" not in log

    # killed with -9: still listed, until 3 of its intervals have passed without a beat
    tasks.kill()
    killed = time.monotonic()
    assert [w["id"] for w in workers_json(addr(node))["workers"]] == [t["id"]]
    wait_for(lambda: workers_json(addr(node))["workers"] == [], timeout=15, interval=0.2, what="the killed worker gone")
    gone_after = time.monotonic() - killed
    assert 1.0 <= gone_after <= 3.0 + 5.0, gone_after  # its last beat was within 1 s before the kill
    assert r.info("clients")["connected_workers"] == 0


def test_bad_worker_input_gets_clear_errors_and_the_node_serves_on(node):
    r = node.client()
    cases = [
        (("WORKER", "BEAT", "w1", "-1000", "{}"), "invalid interval '-1000'"),
        (("WORKER", "BEAT", "w1", "1000", "not json"), "worker info is not JSON"),
        (("WORKER", "BEAT", "w1", "1000", "[" * 16000), "worker info is not JSON: maximum recursion depth"),
        (("WORKER", "BEAT", "w1", "1000", "x" * 20000), "worker info too large: 20000 bytes, at most 16384"),
        (("WORKER", "BEAT", "w 1", "1000", "{}"), "invalid worker ID 'w 1'"),
        (("WORKER", "BEAT", "w1", "1000"), "wrong number of arguments for 'BEAT'"),
        (("WORKER", "LIST", "extra"), "wrong number of arguments for 'LIST'"),
        (("WORKER", "EXPLODE"), "unknown subcommand or wrong number of arguments for 'EXPLODE'. Try WORKER HELP."),
        (("WORKER",), "wrong number of arguments for 'worker' command"),
    ]
    for argv, text in cases:
        with pytest.raises(redis.ResponseError, match=re.escape(text)):
            r.execute_command(*argv)
    assert r.ping() and r.execute_command("WORKER", "LIST") == []
    assert r.execute_command("WORKER", "BEAT", "w1", "1000", '{"ok":1}') == b"OK"
    assert json.loads(r.execute_command("WORKER", "LIST")[0])["info"] == {"ok": 1}
    assert "Traceback" not in node.log()


def test_rights_beats_are_a_consumers_and_the_list_is_inspecting(start_node, tmp_path):
    conf = tmp_path / "users.conf"
    conf.write_text("user w on >wpw allkeys +@consume\nuser ops on >opw allkeys +@inspect\n"
                    "user nobeat on >npw allkeys +@consume -worker|beat\n")  # fmt: skip
    node = start_node(config_file=str(conf))
    consumer = node.client(username="w", password="wpw")
    ops = node.client(username="ops", password="opw")
    assert consumer.execute_command("WORKER", "BEAT", "w1", "60000", "{}") == b"OK"  # listed all along
    assert consumer.execute_command("WORKER", "FORGET", "nope") == 0
    with pytest.raises(redis.exceptions.NoPermissionError, match=r"no permissions to run the 'worker\|list' command"):
        consumer.execute_command("WORKER", "LIST")
    assert [json.loads(e)["id"] for e in ops.execute_command("WORKER", "LIST")] == ["w1"]
    with pytest.raises(redis.exceptions.NoPermissionError, match=r"no permissions to run the 'worker\|beat' command"):
        ops.execute_command("WORKER", "BEAT", "w2", "1000", "{}")
    assert consumer.execute_command("WORKER", "HELP")

    # a worker whose user may not beat says so once and works on, unlisted
    (tmp_path / "quick.py").write_text("def handle(job):\n    pass\n")
    proc = WorkerProcess(tmp_path, "quick:handle", "-q", "q", "-n", addr(node), "--user", "nobeat", "-a", "npw",
                         "--beacon-interval", "0.2")  # fmt: skip
    try:
        r = node.client()
        for i in range(3):
            r.execute_command("ADDJOB", "q", "j%d" % i, 0)
        wait_for(lambda: r.execute_command("QLEN", "q") == 0 and r.info()["registered_jobs"] == 0, timeout=30,
                 what="the jobs done")  # fmt: skip
        time.sleep(0.5)  # a few intervals: the beacon stays off
        log = proc.stop()
    finally:
        proc.close()
    assert log.count("does not take WORKER BEAT") == 1, log
    assert "processed=3" in log
    assert [json.loads(e)["id"] for e in ops.execute_command("WORKER", "LIST")] == ["w1"]


def test_client_name_names_each_connection_of_both_faces(node):
    r = node.client()
    conn = NodeConnection((node.host, node.port), ClientConfig(client_name="billing-report"))
    try:
        assert conn.request((b"PING",), 5) == b"PONG"
        assert "billing-report" in client_names(r)
    finally:
        conn.close()

    async def trio_face() -> None:
        async with AioClient(addr(node), client_name="trio-face") as c:
            assert await c.ping() == "PONG"
            assert "trio-face" in client_names(r)

    trio.run(trio_face)
    with pytest.raises(ValueError, match="printable ASCII without spaces"):
        ClientConfig(client_name="has space")
