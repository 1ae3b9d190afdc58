"""``disque-py top`` against real node processes: a 2-node cluster, its queues, a dead node, the keys."""

from __future__ import annotations

import json
import os
import pty
import select
import signal
import sys
import termios
import threading
import time

import pytest
from click.testing import CliRunner

from disque_py.cli import launcher
from disque_py.cli.app import main

from .conftest import ROOT, wait_for


@pytest.fixture
def pair(start_node):
    a, b = start_node(), start_node()
    launcher.join([("127.0.0.1", a.port), ("127.0.0.1", b.port)], timeout=30)
    return a, b


def top(*args: str, nodes) -> tuple[int, str]:
    seeds = ",".join("127.0.0.1:%d" % n.port for n in nodes)
    result = CliRunner().invoke(main, ["top", "--nodes", seeds, "--once", "--interval", "0.5", *args])
    assert result.exception is None or isinstance(result.exception, SystemExit), result.output
    return result.exit_code, result.output


def top_json(*args: str, nodes) -> dict:
    seeds = ",".join("127.0.0.1:%d" % n.port for n in nodes)
    result = CliRunner().invoke(main, ["top", "--nodes", seeds, "--json", "--interval", "0.5", *args])
    assert result.exit_code == 0, result.output
    return json.loads(result.stdout)


def add(node, queue: str, n: int) -> None:
    r = node.client()
    pipe = r.pipeline(transaction=False)
    for i in range(n):
        pipe.execute_command("ADDJOB", queue, "job %d" % i, 0, "REPLICATE", 1)
    pipe.execute()


class Producer(threading.Thread):
    """Adds a job to ``queue`` on every node in turn until stopped."""

    def __init__(self, nodes, queue: str) -> None:
        super().__init__(daemon=True)
        self.clients = [n.client() for n in nodes]
        self.queue = queue
        self.done = threading.Event()
        self.added = 0

    def run(self) -> None:
        while not self.done.is_set():
            self.clients[self.added % len(self.clients)].execute_command("ADDJOB", self.queue, "x", 0, "REPLICATE", 1)
            self.added += 1
            time.sleep(0.002)

    def stop(self) -> None:
        self.done.set()
        self.join(10)


def test_queues_are_summed_over_the_nodes_with_an_in_rate_while_a_producer_runs(pair):
    a, b = pair
    add(a, "steady", 30)
    add(b, "steady", 12)
    add(b, "only-b", 4)
    producer = Producer(pair, "busy")
    producer.start()
    try:
        wait_for(lambda: producer.added > 20, what="the producer")
        data = top_json(nodes=[a])  # b is found through a's HELLO
        code, table = top(nodes=[a])
    finally:
        producer.stop()
    queues = {q["name"]: q for q in data["queues"]}
    assert queues["steady"]["len"] == 42
    assert {v["len"] for v in queues["steady"]["nodes"].values()} == {30, 12}
    assert queues["only-b"]["len"] == 4 and len(queues["only-b"]["nodes"]) == 1
    assert queues["busy"]["in_rate"] > 0
    assert queues["busy"]["len"] > 0 and len(queues["busy"]["nodes"]) == 2
    assert queues["steady"]["in_rate"] == 0
    ids = {a.client().execute_command("CLUSTER", "MYID").decode(), b.client().execute_command("CLUSTER", "MYID").decode()}
    assert {n["id"] for n in data["nodes"]} == ids and all(n["reachable"] for n in data["nodes"])
    assert {n["address"] for n in data["nodes"]} == {"127.0.0.1:%d" % a.port, "127.0.0.1:%d" % b.port}
    assert sum(n["jobs"] for n in data["nodes"]) >= 46
    # both memories, as INFO names them: the data estimate (a few KB here) and the process's RSS
    assert all(0 < n["used_memory"] < n["used_memory_rss"] for n in data["nodes"])
    assert code == 0
    row = next(line for line in table.splitlines() if line.startswith("steady "))
    assert row.split()[1] == "42"
    assert "127.0.0.1:%d" % b.port in table


def test_no_discover_asks_only_the_nodes_given(pair):
    a, b = pair
    add(b, "on-b", 3)
    data = top_json("--no-discover", nodes=[a])
    assert [n["address"] for n in data["nodes"]] == ["127.0.0.1:%d" % a.port]
    assert "on-b" not in {q["name"] for q in data["queues"]}


def _blocked(node, queue: str, n: int) -> list:
    """``n`` clients blocked in GETJOB on ``queue`` (the clients are returned: a client collected
    closes its connection)."""
    out = []
    for _ in range(n):
        r = node.client(socket_timeout=30)
        conn = r.connection_pool.get_connection()
        conn.send_command("GETJOB", "TIMEOUT", 20000, "FROM", queue)
        out.append((r, conn))
    return out


class Consumer(threading.Thread):
    """Takes jobs from ``queue`` on ``node`` (GETJOB + FASTACK) until stopped."""

    def __init__(self, node, queue: str) -> None:
        super().__init__(daemon=True)
        self.client = node.client()
        self.queue = queue
        self.done = threading.Event()
        self.taken = 0

    def run(self) -> None:
        while not self.done.is_set():
            for _, job_id, _ in self.client.execute_command("GETJOB", "TIMEOUT", 100, "FROM", self.queue) or ():
                self.client.execute_command("FASTACK", job_id)
                self.taken += 1

    def stop(self) -> None:
        self.done.set()
        self.join(10)


@pytest.mark.parametrize("by, field, descending, first", [
    ("length", "len", True, None), ("in", "in_rate", True, "q-fed"), ("out", "out_rate", True, "q-fed"),
    ("blocked", "blocked", True, "q-waited"), ("name", "name", False, "q-fed"),
])  # fmt: skip
def test_sorting_by_each_key_orders_the_rows(pair, by, field, descending, first):
    a, b = pair
    add(a, "q-long", 9)
    add(b, "q-mid", 5)
    add(a, "q-short", 1)
    waiting = _blocked(a, "q-waited", 2) + _blocked(b, "q-waited2", 1)
    wait_for(lambda: a.client().execute_command("QSTAT", "q-waited")[9] == 2
             and b.client().execute_command("QSTAT", "q-waited2")[9] == 1, what="blocked clients")  # fmt: skip
    producer, consumer = Producer([a], "q-fed"), Consumer(a, "q-fed")
    producer.start()
    consumer.start()
    try:
        wait_for(lambda: producer.added > 10 and consumer.taken > 5, what="the producer and the consumer")
        seen = {}
        for reverse in ((), ("--reverse",)):
            data = top_json("--sort", by, *reverse, nodes=[a, b])
            values = [q[field] or 0 for q in data["queues"]]
            names = [q["name"] for q in data["queues"]]
            assert {"q-long", "q-mid", "q-short", "q-waited", "q-waited2", "q-fed"} <= set(names)
            down = descending != bool(reverse)
            assert values == sorted(values, reverse=down), (by, reverse, list(zip(names, values)))
            for i in range(1, len(values)):  # ties are in name order
                if values[i] == values[i - 1] and by != "name":
                    assert names[i - 1] < names[i], (by, reverse, list(zip(names, values)))
            seen[bool(reverse)] = names
    finally:
        producer.stop()
        consumer.stop()
        for _, conn in waiting:
            conn.disconnect()
    names = seen[False]
    if first is not None:
        assert names[0] == first and seen[True][-1] == first
    if by == "length":
        assert names.index("q-long") < names.index("q-mid") < names.index("q-short")


def test_a_dead_node_is_shown_unreachable_and_top_still_answers(pair):
    a, b = pair
    add(a, "left", 2)
    b_address = "127.0.0.1:%d" % b.port
    b.stop(signal.SIGKILL)
    data = top_json(nodes=[a])  # b is still in a's HELLO
    nodes = {n["address"]: n for n in data["nodes"]}
    assert nodes["127.0.0.1:%d" % a.port]["reachable"]
    assert not nodes[b_address]["reachable"] and nodes[b_address]["error"]
    assert {q["name"]: q["len"] for q in data["queues"]} == {"left": 2}
    code, table = top(nodes=[a])
    assert code == 0
    line = next(line for line in table.splitlines() if b_address in line)
    assert " NO " in line
    # nothing answers: the view is printed all the same, and the exit status says so
    a.stop(signal.SIGKILL)
    code, out = top(nodes=[a])
    assert code == 1 and "NO" in out and "no node answered" in out


def test_a_paused_queue_shows_its_pause(pair):
    a, b = pair
    add(a, "held", 3)
    add(b, "held", 2)
    add(a, "half", 1)
    add(b, "half", 1)
    a.client().execute_command("PAUSE", "held", "all", "BCAST")
    a.client().execute_command("PAUSE", "half", "in")  # this node only
    wait_for(lambda: b.client().execute_command("QSTAT", "held")[-1] == b"all", what="the PAUSE broadcast")
    queues = {q["name"]: q for q in top_json(nodes=[a])["queues"]}
    assert (queues["held"]["paused"], queues["held"]["paused_everywhere"]) == ("all", True)
    assert (queues["half"]["paused"], queues["half"]["paused_everywhere"]) == ("in", False)
    _, table = top(nodes=[a])
    assert next(line for line in table.splitlines() if line.startswith("held ")).split()[5] == "all"
    assert next(line for line in table.splitlines() if line.startswith("half ")).split()[5] == "in*"


def test_bad_arguments_are_usage_errors():
    result = CliRunner().invoke(main, ["top", "--nodes", "somehost:99999", "--once"])
    assert result.exit_code == 2 and "bad port" in result.output and "--nodes" in result.output
    result = CliRunner().invoke(main, ["top", "--user", "bob", "--once"])
    assert result.exit_code == 2 and "--password" in result.output
    result = CliRunner().invoke(main, ["top", "--help"])
    assert result.exit_code == 0 and "l length" in result.output and "--once" in result.output


class Terminal:
    """``disque-py top`` live in a pseudo-terminal."""

    def __init__(self, *args: str) -> None:
        # PYTHONFAULTHANDLER: a program that does not exit is sent SIGABRT, and says where it was
        env = dict(os.environ, COLUMNS="140", LINES="40", PYTHONPATH=str(ROOT), PYTHONFAULTHANDLER="1")
        self.pid, self.fd = pty.fork()
        if self.pid == 0:  # the child: the program on the terminal
            try:
                os.chdir(ROOT)
                os.execve(sys.executable, [sys.executable, "-m", "disque_py.cli", "top", *args], env)
            finally:
                os._exit(127)
        self.output = b""

    def read_until(self, predicate, timeout: float = 20.0) -> None:
        deadline = time.monotonic() + timeout
        while not predicate(self.output.decode("utf-8", "replace")):
            left = deadline - time.monotonic()
            assert left > 0, "timed out; the terminal shows:\n%s" % self.output.decode("utf-8", "replace")[-3000:]
            ready, _, _ = select.select([self.fd], [], [], min(left, 0.2))
            if ready:
                try:
                    self.output += os.read(self.fd, 65536)
                except OSError:  # the child closed the terminal
                    return

    def send(self, keys: bytes) -> None:
        self.output = b""
        os.write(self.fd, keys)

    def wait(self, timeout: float = 20.0) -> int:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            pid, status = os.waitpid(self.pid, os.WNOHANG)
            if pid:
                return os.waitstatus_to_exitcode(status)
            try:  # keep reading: a full terminal would block the program's last writes
                if select.select([self.fd], [], [], 0.1)[0]:
                    os.read(self.fd, 65536)
            except OSError:
                time.sleep(0.05)
        os.kill(self.pid, signal.SIGABRT)  # its threads' stacks written to the terminal
        stacks = b""
        end = time.monotonic() + 5
        while time.monotonic() < end and not os.waitpid(self.pid, os.WNOHANG)[0]:
            try:
                if select.select([self.fd], [], [], 0.1)[0]:
                    stacks += os.read(self.fd, 65536)
            except OSError:
                break
        try:
            os.kill(self.pid, signal.SIGKILL)
            os.waitpid(self.pid, 0)
        except (ProcessLookupError, ChildProcessError):
            pass
        raise AssertionError("top did not exit; where it was:\n%s" % stacks.decode("utf-8", "replace")[-6000:])

    def close(self) -> None:
        try:
            os.kill(self.pid, signal.SIGKILL)
            os.waitpid(self.pid, 0)
        except (ProcessLookupError, ChildProcessError):
            pass
        os.close(self.fd)


def test_keys_sort_the_live_view_and_q_leaves_with_the_terminal_restored(pair):
    a, b = pair
    add(a, "zz-long", 6)
    add(b, "aa-short", 2)
    term = Terminal("--nodes", "127.0.0.1:%d" % a.port, "--interval", "0.3")
    try:
        term.read_until(lambda out: "aa-short" in out and "zz-long" in out and "q quit" in out)
        assert not termios.tcgetattr(term.fd)[3] & termios.ICANON  # cbreak while it runs
        term.send(b"n")
        term.read_until(lambda out: "QUEUE(n)^" in out and out.rfind("aa-short") < out.rfind("zz-long"))
        term.send(b"l")
        term.read_until(lambda out: "LEN(l)v" in out and out.rfind("zz-long") < out.rfind("aa-short"))
        term.send(b"r")
        term.read_until(lambda out: "LEN(l)^" in out and out.rfind("aa-short") < out.rfind("zz-long"))
        term.send(b"q")
        assert term.wait() == 0
        attrs = termios.tcgetattr(term.fd)
        assert attrs[3] & termios.ICANON and attrs[3] & termios.ECHO  # restored
    finally:
        term.close()


def test_ctrl_c_leaves_the_live_view_cleanly(pair):
    a, _ = pair
    term = Terminal("--nodes", "127.0.0.1:%d" % a.port, "--interval", "0.3")
    try:
        term.read_until(lambda out: "q quit" in out)
        term.send(b"\x03")  # the terminal turns it into SIGINT
        assert term.wait() == 0
        assert termios.tcgetattr(term.fd)[3] & termios.ICANON
    finally:
        term.close()


def test_over_tls_with_a_password_the_nodes_given_are_asked_and_the_others_shown(start_node, tmp_path_factory):
    sys.path.insert(0, str(ROOT / "tests"))
    from tls_certs import make_certs

    from .conftest import free_port

    certs = make_certs(tmp_path_factory.mktemp("certs"))
    tls = {"tls_cert_file": str(certs.server_cert), "tls_key_file": str(certs.server_key),
           "tls_ca_cert_file": str(certs.ca), "requirepass": "pw"}  # fmt: skip
    a, b = start_node(tls_port=free_port(), **tls), start_node(tls_port=free_port(), **tls)
    launcher.join([("127.0.0.1", a.port), ("127.0.0.1", b.port)], password="pw", timeout=30)
    add(a, "secure", 3)
    tls_port = int(a.directives["tls_port"])
    args = ["--tls", "--cacert", str(certs.ca), "--cert", str(certs.client_cert), "--key", str(certs.client_key)]
    result = CliRunner().invoke(main, ["top", "--nodes", "127.0.0.1:%d" % tls_port, "--once", "--json", "--interval",
                                       "0.3", "-a", "pw", *args])  # fmt: skip
    assert result.exit_code == 0, result.output
    data = json.loads(result.output)
    nodes = {n["address"]: n for n in data["nodes"]}
    assert nodes["127.0.0.1:%d" % tls_port]["reachable"]
    assert {q["name"]: q["len"] for q in data["queues"]} == {"secure": 3}
    other = nodes["127.0.0.1:%d" % b.port]  # found by HELLO at its plain port, which TLS does not reach
    assert not other["reachable"] and "tls-port" in other["error"]
    # a wrong password: the node is shown unreachable with the node's words
    result = CliRunner().invoke(main, ["top", "--nodes", "127.0.0.1:%d" % a.port, "--once", "--json", "--interval",
                                       "0.1", "-a", "wrong"])  # fmt: skip
    assert result.exit_code == 1
    data = json.loads(result.stdout)
    assert "no node answered" in result.stderr
    assert not data["nodes"][0]["reachable"] and "pass" in data["nodes"][0]["error"].lower()
