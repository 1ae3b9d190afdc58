"""`disque-py cli` against real nodes: its output compared with redis-cli's for the same replies,
piped (raw) and on a pseudo-terminal (formatted); wrong ports answered in one line."""

from __future__ import annotations

import re
import shlex
import shutil
import socket
import subprocess
import sys

import pytest

from .conftest import ROOT, free_port

CLI = [sys.executable, "-m", "disque_py.cli", "cli"]
TIMEOUT = 60  # generous: the cli must answer far sooner, and the assertions are on what it says


def ours(*args: str, stdin: str | None = None) -> subprocess.CompletedProcess:
    return subprocess.run(CLI + list(args), capture_output=True, timeout=TIMEOUT, cwd=ROOT, input=stdin and stdin.encode())


def on_tty(argv: list[str]) -> bytes:
    """``argv``'s output on a pseudo-terminal (util-linux script), as a person would see it."""
    if not shutil.which("script"):
        pytest.skip("no `script` to run a command on a pseudo-terminal")
    out = subprocess.run(["script", "-qec", shlex.join(argv), "/dev/null"], capture_output=True, timeout=TIMEOUT,
                         cwd=ROOT, stdin=subprocess.DEVNULL)  # fmt: skip
    return out.stdout


def mask(text: bytes) -> bytes:
    """Counters that differ between two connections (client ids, ports, file descriptors) made equal:
    the node may not yet have closed the last client's socket when the next one connects."""
    text = re.sub(rb"(\bid[= ]|\"id\" => \(integer\) )\d+", rb"\1N", text)
    text = re.sub(rb"\bfd=\d+", b"fd=F", text)
    return re.sub(rb"addr=127\.0\.0\.1:\d+", b"addr=A", text)


@pytest.fixture
def filled(node):
    c = node.client()
    c.execute_command("ADDJOB", "q", 'a "quoted" \\ body\twith\nnewline', 0)
    c.execute_command("ADDJOB", "q", b"\x01\xffbinary", 0)
    return node


COMMANDS = [
    ["PING"],
    ["QLEN", "q"],
    ["QLEN", "nothing"],
    ["GETJOB", "NOHANG", "FROM", "nothing"],  # nil
    ["QPEEK", "q", "5"],  # nested arrays, quoted and binary bodies
    ["QPEEK", "nothing", "5"],  # empty array
    ["CONFIG", "GET", "max*"],
    ["NOSUCHCOMMAND", "x"],  # error
    ["HELLO"],
    ["INFO", "jobs"],  # multi-line text: verbatim in both modes
    ["CLUSTER", "NODES"],
    ["CLUSTER", "INFO"],
    ["CLIENT", "LIST"],
    ["QSCAN"],
    ["HELLO", "3"],  # RESP3: a map
]


@pytest.mark.parametrize("command", COMMANDS, ids=lambda c: " ".join(c))
def test_output_is_redis_clis_piped_and_on_a_terminal(filled, redis_cli, command):
    port = str(filled.port)
    theirs = subprocess.run([redis_cli, "-p", port, *command], capture_output=True, timeout=TIMEOUT).stdout
    mine = ours("-p", port, *command)
    assert mask(mine.stdout) == mask(theirs), (mine, theirs)
    assert mine.returncode == (2 if command[0] == "NOSUCHCOMMAND" else 0)
    theirs = on_tty([redis_cli, "-p", port, *command])
    mine_tty = on_tty([*CLI, "-p", port, *command])
    assert mask(mine_tty) == mask(theirs)
    assert b"(error) ERR" in mine_tty if command[0] == "NOSUCHCOMMAND" else True


def test_raw_and_no_raw_force_the_mode(filled):
    port = str(filled.port)
    assert ours("-p", port, "--no-raw", "QLEN", "q").stdout == b"(integer) 2\n"
    assert on_tty([*CLI, "-p", port, "--raw", "QLEN", "q"]).replace(b"\r\n", b"\n") == b"2\n"
    assert on_tty([*CLI, "-p", port, "QLEN", "q"]).replace(b"\r\n", b"\n") == b"(integer) 2\n"


def test_an_id_piped_is_bare_so_that_ackjob_takes_it(node):
    port = str(node.port)
    script = 'id=$(%s -p %s ADDJOB emails x 0) && %s -p %s ACKJOB "$id"' % (
        shlex.join(CLI), port, shlex.join(CLI), port)  # fmt: skip
    out = subprocess.run(["sh", "-c", script], capture_output=True, timeout=TIMEOUT, cwd=ROOT)
    assert out.stdout == b"1\n", out
    assert node.client().execute_command("QLEN", "emails") == 0


def test_repeat_and_interval(node):
    out = ours("-p", str(node.port), "-r", "3", "-i", "0.05", "QLEN", "q")
    assert out.stdout == b"0\n0\n0\n" and out.returncode == 0, out


def test_commands_read_from_stdin_like_redis_cli(node, redis_cli):
    lines = "ADDJOB q one 0\nQLEN q\n3 QLEN q\nCONFIG GET maxclients\n"
    mine = ours("-p", str(node.port), stdin=lines)
    assert mine.returncode == 0, mine
    out = mine.stdout.decode().splitlines()
    assert out[0].startswith("D-") and out[1:] == ["1", "1", "1", "1", "maxclients", "10000"]


def test_the_prompt_on_a_terminal(node):
    if not shutil.which("script"):
        pytest.skip("no `script`")
    argv = shlex.join([*CLI, "-p", str(node.port)])
    out = subprocess.run(["script", "-qec", argv, "/dev/null"], input=b"QLEN q\nquit\n", capture_output=True,
                         timeout=TIMEOUT, cwd=ROOT, env={"DISQUE_CLI_HISTFILE": "/dev/null", "PATH": "/usr/bin:/bin",
                                                         "TERM": "dumb", "PYTHONPATH": str(ROOT)})  # fmt: skip
    text = out.stdout.decode(errors="replace")
    assert "127.0.0.1:%d> " % node.port in text and "(integer) 0" in text, text


# --------------------------------------------------------------------------- wrong ports


def one_line(out: subprocess.CompletedProcess) -> str:
    err = out.stderr.decode()
    assert out.returncode == 1, out
    assert "Traceback" not in err and out.stdout == b"", out
    assert err.count("\n") == 1, err
    return err.strip()


def test_the_admin_port_is_named_with_the_client_port(start_node):
    port = free_port()
    admin = port + 1000
    node = start_node(port=port, admin_port=admin)
    line = one_line(ours("-p", str(admin), "PING"))
    assert line == ("127.0.0.1:%d answered HTTP: it is a node's admin port; its client port is %d "
                    "(disque-py cli -p %d)" % (admin, node.port, node.port))  # fmt: skip


def test_an_http_server_that_is_no_admin_port(start_node):
    node = start_node(admin_port=free_port())
    admin = node.directives["admin_port"]
    line = one_line(ours("-p", str(admin), "PING"))
    assert "answered HTTP" in line and "not a client port" in line, line


def test_the_cluster_bus_port_is_named_with_the_client_port(node):
    line = one_line(ours("-p", str(node.port + 10000), "PING"))
    assert line == ("127.0.0.1:%d closed the connection without answering: it is a node's cluster bus port; "
                    "its client port is %d (disque-py cli -p %d)" % (node.port + 10000, node.port, node.port))


def test_nothing_listening(node):
    port = free_port()
    assert one_line(ours("-p", str(port), "PING")) == (
        "Could not connect to disque-py at 127.0.0.1:%d: Connection refused" % port)


def test_a_port_that_says_nothing_is_given_up_after_the_timeout():
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen()
        port = listener.getsockname()[1]
        line = one_line(ours("-p", str(port), "-t", "0.5", "PING"))
    assert line == ("127.0.0.1:%d accepted the connection but did not answer PING in 0.5 s: is it a disque-py "
                    "client port? (--timeout to wait longer)" % port)


def test_a_tls_port_without_tls_and_a_plain_port_with_it(start_node, tmp_path_factory):
    from .test_tls import start_tls
    from .test_tls import certs as make_certs

    certs = make_certs.__wrapped__(tmp_path_factory)

    node = start_tls(start_node, certs)
    line = one_line(ours("-p", str(node.tls_port), "PING"))
    assert line == "127.0.0.1:%d speaks TLS: it is a TLS port (a node's tls-port?): add --tls (and --cacert ...)" % (
        node.tls_port)
    line = one_line(ours("-p", str(node.port), "--tls", "--cacert", str(certs.ca), "PING"))
    assert "TLS handshake failed" in line and "leave out --tls" in line, line
