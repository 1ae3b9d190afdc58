"""`disque-py dead list|show|requeue|purge` against a real 3-node cluster."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from .conftest import ROOT, wait_for

pytestmark = pytest.mark.integration


def dead(node, *args: str, input: str | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "disque_py.cli", "dead", *args, "--nodes", "127.0.0.1:%d" % node.port],
                          capture_output=True, text=True, timeout=60, cwd=ROOT, input=input)  # fmt: skip


def dead_letter(c, queue: str, body: str, reason: str) -> str:
    job_id = c.execute_command("ADDJOB", queue, body, 0, "RETRY", 1, "MAXDELIVER", 1, "REPLICATE", 2).decode()
    assert c.execute_command("GETJOB", "NOHANG", "FROM", queue)[0][1].decode() == job_id
    assert c.execute_command("NACK", job_id, "REASON", reason) == 1
    return job_id


def qlen(nodes, queue: str) -> int:
    return sum(n.client().execute_command("QLEN", queue) for n in nodes)


def test_dead_list_show_requeue_purge(cluster3):
    a, b, c = cluster3
    originals = [dead_letter(b.client(), "orders", "o-%d" % i, "timeout") for i in range(3)]
    dead_letter(c.client(), "mail", "m-0", "bounced")

    # list asks a only; b and c are found through HELLO, and copies on two nodes count once
    got = wait_for(lambda: json.loads(dead(a, "list", "--json").stdout), what="a listing")
    assert [(q["name"], q["count"], q["original_queues"]) for q in got] == [
        ("orders.dead", 3, {"orders": 3}), ("mail.dead", 1, {"mail": 1})]
    out = dead(a, "list")
    assert out.returncode == 0, out.stderr
    assert out.stdout.splitlines()[0].split() == ["QUEUE", "JOBS", "FROM", "OLDEST"]

    out = dead(a, "show", "orders.dead", "--json")
    jobs = json.loads(out.stdout)
    assert sorted(j["original_id"] for j in jobs) == sorted(originals)
    assert {(j["original_queue"], j["deliveries"], j["reason"]) for j in jobs} == {("orders", 1, "timeout")}
    text = dead(a, "show", "orders.dead").stdout
    assert "timeout" in text and jobs[0]["id"] in text

    # requeue one: back in orders, the dead letter gone
    out = dead(a, "requeue", "orders.dead", jobs[0]["id"])
    assert out.returncode == 0, out.stderr
    line, summary = out.stdout.splitlines()
    old_id, arrow, new_id = line.split()
    assert (old_id, arrow, summary) == (jobs[0]["id"], "->", "requeued 1 dead letter of orders.dead")
    assert qlen(cluster3, "orders") == 1
    # the new ID is the job now in orders (on the nodes that hold a copy of it)
    [shown, *_] = [r for r in (n.client().execute_command("SHOW", new_id) for n in cluster3) if r]
    fields = dict(zip(shown[::2], shown[1::2]))
    assert (fields[b"queue"], fields[b"body"]) == (b"orders", jobs[0]["body"].encode())
    assert len(json.loads(dead(a, "show", "orders.dead", "--json").stdout)) == 2

    # an ID that is not a dead letter of the queue, or neither IDs nor --all: nothing done
    out = dead(a, "requeue", "orders.dead", "D-00000000-000000000000000000000000-05a1")
    assert out.returncode == 1 and "not a dead letter" in out.stderr
    assert dead(a, "purge", "orders.dead").returncode == 2
    # purge asks first: "n" keeps them
    out = dead(a, "purge", "orders.dead", "--all", input="n\n")
    assert out.returncode == 1
    assert len(json.loads(dead(a, "show", "orders.dead", "--json").stdout)) == 2

    out = dead(a, "purge", "orders.dead", "--all", "--yes", "--progress")
    assert (out.returncode, out.stdout.strip()) == (0, "purged 2 dead letters of orders.dead"), out.stderr
    assert json.loads(dead(a, "show", "orders.dead", "--json").stdout) == []
    assert qlen(cluster3, "orders.dead") == 0
    assert [q["name"] for q in json.loads(dead(a, "list", "--json").stdout)] == ["mail.dead"]

    # requeue --all with a progress bar, the new IDs as JSON on stdout (the count on stderr)
    [letter] = json.loads(dead(a, "show", "mail.dead", "--json").stdout)
    out = dead(a, "requeue", "mail.dead", "--all", "--progress", "--json")
    assert out.returncode == 0 and "requeued 1 dead letter of mail.dead" in out.stderr, out.stderr
    [(old_id, new_id)] = json.loads(out.stdout).items()
    assert old_id == letter["id"] and new_id.startswith("D-") and new_id != old_id
    assert qlen(cluster3, "mail") == 1 and qlen(cluster3, "mail.dead") == 0


def test_dead_show_names_a_tasks_name_and_arguments(cluster3):
    a = cluster3[0]
    body = json.dumps({"v": 1, "task": "shop.tasks.charge", "args": [42, "EUR"], "kwargs": {"retry": False}})
    dead_letter(a.client(), "payments", body, "KeyError: 'card'")
    dead_letter(a.client(), "payments", "not a task", "bad body")
    [task_job] = [j for j in json.loads(dead(a, "show", "payments.dead", "--json").stdout) if j["task"]]
    assert (task_job["task"], task_job["arguments"]) == ("shop.tasks.charge", "42, 'EUR', retry=False")
    table = dead(a, "show", "payments.dead").stdout.splitlines()
    assert table[0].split() == ["ID", "ORIGINAL", "QUEUE", "TASK", "ARGUMENTS", "DELIVERIES", "AGE", "REASON"]
    assert any("shop.tasks.charge" in row and "42, 'EUR', retry=False" in row for row in table[1:])
    # plain jobs only: no task columns
    dead_letter(a.client(), "plain", "x", "why")
    header = dead(a, "show", "plain.dead").stdout.splitlines()[0].split()
    assert header == ["ID", "ORIGINAL", "QUEUE", "DELIVERIES", "AGE", "REASON"]


def test_dead_show_prints_each_ones_last_traceback(cluster3):
    from tests.tasks.tracing import ERROR_LINE, FAILING_LINE, fail_for_good, failing_app

    a = cluster3[0]
    f = failing_app("127.0.0.1:%d" % a.port)
    try:
        ref, err = fail_for_good(f)  # two deliveries, each failing at the known line
    finally:
        f.app.close()
    dead_q = f.queue + ".dead"
    [job] = wait_for(lambda: json.loads(dead(a, "show", dead_q, "--json").stdout), what="the dead letter")
    assert (job["original_id"], job["task"], job["reason"]) == (ref.id, "tracing.fails", ERROR_LINE)
    assert job["traceback"] == err.traceback and FAILING_LINE in job["traceback"]
    out = dead(a, "show", dead_q)
    assert out.returncode == 0, out.stderr
    table, _, traces = out.stdout.partition("\n\n")
    assert ref.id not in table and job["id"] in table.splitlines()[1]
    heading, *lines = traces.rstrip("\n").split("\n")
    assert heading == "%s: the traceback of its last failure" % job["id"]
    assert lines == ["    " + line for line in err.traceback.rstrip("\n").split("\n")]
    assert "    " + ERROR_LINE == lines[-1] and any(FAILING_LINE in line for line in lines)
    brief = dead(a, "show", dead_q, "--no-traceback").stdout.splitlines()
    assert brief[0] == table.splitlines()[0] and len(brief) == 2 and job["id"] in brief[1]  # the table only

    # a traceback is anyone's text: its control characters are shown, never sent to the terminal
    c = a.client()
    job_id = c.execute_command("ADDJOB", "hostile", "x", 0, "RETRY", 1, "MAXDELIVER", 1).decode()
    c.execute_command("GETJOB", "NOHANG", "FROM", "hostile")
    assert c.execute_command("NACK", job_id, "REASON", "bad\x1b]0;owned\x07", "TRACE", "Trace\x1b[2J\r\nEnd\x00") == 1
    text = wait_for(lambda: dead(a, "show", "hostile.dead").stdout, what="the hostile dead letter")
    assert "\x1b" not in text and "\x07" not in text and "\x00" not in text
    assert "bad\\x1b]0;owned\\x07" in text and text.endswith("    Trace\\x1b[2J\\x0d\n    End\\x00\n")


def test_dead_help_teaches_with_examples():
    out = subprocess.run([sys.executable, "-m", "disque_py.cli", "dead", "--help"], capture_output=True, text=True,
                         timeout=60, cwd=ROOT)  # fmt: skip
    assert out.returncode == 0
    assert "disque-py dead requeue orders.dead --all" in out.stdout
    for sub in ("list", "show", "requeue", "purge"):
        assert sub in out.stdout


def test_no_node_answering_is_said(tmp_path):
    from .conftest import free_port

    out = subprocess.run([sys.executable, "-m", "disque_py.cli", "dead", "list", "--nodes", "127.0.0.1:%d" % free_port(),
                          "--timeout", "1"], capture_output=True, text=True, timeout=60, cwd=ROOT)  # fmt: skip
    assert out.returncode == 1 and "no node answered" in out.stderr
