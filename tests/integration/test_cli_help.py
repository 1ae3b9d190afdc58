"""`help` in `disque-py cli` (cli/commandhelp.py), on real processes: the commands' syntax and
summary as the node's declarations say them (core/commandspec.py), answered by the cli whether the
node is up or down, piped, one-shot and at a terminal prompt with Tab completion; and redis-cli 7's
own `help`, which reads the same declarations from COMMAND DOCS."""

from __future__ import annotations

import re
import shlex
import shutil
import subprocess
import sys

import pytest

from disque_py.server.app import NODE_COMMANDS
from disque_py.server.commanddocs import alternatives

from .conftest import ROOT, free_port

CLI = [sys.executable, "-m", "disque_py.cli", "cli"]
TIMEOUT = 60
SPECS = {spec.name.decode(): spec for spec in NODE_COMMANDS}


def ours(*args: str | int, stdin: str | None = None) -> subprocess.CompletedProcess:
    return subprocess.run(CLI + [str(a) for a in args], capture_output=True, text=True, timeout=TIMEOUT, cwd=ROOT,
                          input=stdin)  # fmt: skip


def entry(name: str, group: bool = True) -> str:
    """What help prints of one command (piped: its syntax lines are not cut)."""
    spec = SPECS[name]
    lines = ["", *("  " + form for form in alternatives(spec)), "  summary: " + spec.summary, "  since: " + spec.since]
    if group:
        lines.append("  group: " + spec.group)
    return "\n".join(lines) + "\n"


def listed(text: str) -> list[str]:
    """The commands a help text shows, in order (each entry's first line)."""
    return [m.group(1) for m in re.finditer(r"^\n  ([A-Z]+)[ \n]", "\n" + text, re.M)]


@pytest.fixture
def down() -> int:
    return free_port()  # nothing listens there


def test_help_is_the_same_with_the_node_up_or_down(node, down):
    for topic in ([], ["addjob"], ["@queues"], ["@consume"], ["cluster", "meet"]):
        up, off = ours("-p", node.port, "help", *topic), ours("-p", down, "help", *topic)
        assert (up.returncode, up.stderr) == (off.returncode, off.stderr) == (0, ""), (topic, up, off)
        assert up.stdout == off.stdout and up.stdout, topic


def test_help_alone_says_how_to_ask(down):
    out = ours("-p", down, "help").stdout
    assert '"help @<group>" to get a list of commands in <group>' in out and '"help <command>"' in out
    assert "Groups: @jobs @queues @workers @cluster @connection @server\n" in out
    assert "Rights (ACL categories): @produce @consume @inspect @admin\n" in out
    assert ours("-p", down, "?").stdout == out  # redis-cli's other word for it


def test_help_command_is_its_declaration_in_any_case(down):
    out = ours("-p", down, "help", "addjob")
    assert out.stdout == entry("addjob") + "  rights: @produce\n\n"
    assert out.stdout.splitlines()[1] == ("  ADDJOB queue_name job ms-timeout [REPLICATE count] [DELAY sec] [RETRY sec] "
                                          "[TTL sec] [MAXLEN count] [ASYNC] [BACKOFF min max] [MAXDELIVER count] "
                                          "[DEADLETTER queue] [DEDUP key] [PRIORITY 0-9] [GROUP name]")  # fmt: skip
    assert ours("-p", down, "HELP", "ADDJOB").stdout == ours("-p", down, "Help", "AddJob").stdout == out.stdout
    # a command with subcommands: one line per form, its own rights where they differ; one form asked
    worker = ours("-p", down, "help", "WORKER").stdout
    assert worker == entry("worker") + "  rights: @consume; LIST: @inspect; HELP: any connection\n\n"
    meet = ours("-p", down, "help", "cluster", "MEET").stdout
    assert meet.splitlines()[1:3] == ["  CLUSTER MEET ip port", "  summary: " + SPECS["cluster"].summary]


def test_help_group_lists_the_group_and_help_right_what_it_grants(down):
    out = ours("-p", down, "help", "@QUEUES").stdout
    assert listed(out) == ["GROUP", "PAUSE", "QLEN", "QPEEK", "QSCAN", "QSTAT"]
    assert listed(out) == sorted(n.upper() for n, s in SPECS.items() if s.group == "queues")
    assert entry("qlen", group=False) + "  rights: @produce, @consume or @inspect\n" in out
    consume = ours("-p", down, "help", "@consume").stdout
    assert consume.startswith("Commands the @consume right grants (ACL SETUSER name +@consume):\n")
    assert {"ACKJOB", "GETJOB", "NACK", "RELEASE", "WORKER", "QLEN"} <= set(listed(consume))
    assert not {"ADDJOB", "DELJOB", "CONFIG", "PING"} & set(listed(consume))
    # WORKER's beats are @consume's, its list @inspect's: only the forms the right grants
    assert "  WORKER BEAT worker-id interval-ms info-json\n  WORKER FORGET worker-id\n  summary:" in consume
    assert "WORKER LIST" not in consume and "WORKER LIST" in ours("-p", down, "help", "@inspect").stdout


@pytest.mark.parametrize("words, says", [
    (["nosuchcommand"], "No help for 'nosuchcommand': not a command of the node. Try \"help\" (the groups), "
                        "\"help @<group>\" or \"help <command>\""),
    (["@nosuch"], "No help for '@nosuch': the groups are @jobs @queues @workers @cluster @connection @server, "
                  "the rights @produce @consume @inspect @admin"),
    (["qlen", "x"], "No help for 'qlen x': QLEN has no subcommands"),
    (["config", "nope"], "No help for 'config nope': CONFIG has the subcommands GET, SET, REWRITE, RESETSTAT"),
])  # fmt: skip
def test_help_on_nothing_known_is_one_line(down, words, says):
    out = ours("-p", down, "help", *words)
    assert (out.returncode, out.stdout, out.stderr) == (2, says + "\n", "")


def test_help_read_from_stdin_with_the_node_down(down):
    out = ours("-p", down, stdin="help qlen\nhelp @workers\n")
    assert (out.returncode, out.stderr) == (0, "")
    assert out.stdout == entry("qlen") + "  rights: @produce, @consume or @inspect\n\n" + ours(
        "-p", down, "help", "@workers").stdout
    # a command, though, needs the node: the run ends there, as it did before any line was read
    out = ours("-p", down, stdin="help qlen\nQLEN q\nhelp qlen\n")
    assert out.returncode == 1 and out.stdout.count("summary:") == 1
    assert out.stderr == "Could not connect to disque-py at 127.0.0.1:%d: Connection refused\n" % down


def test_help_between_commands_read_from_stdin(node):
    out = ours("-p", node.port, stdin="QLEN q\nhelp QLEN\nQLEN q\n")
    assert out.returncode == 0, out
    assert out.stdout == "0\n" + entry("qlen") + "  rights: @produce, @consume or @inspect\n\n" + "0\n"


def on_terminal(port: int, keys: bytes) -> str:
    """What a person sees typing ``keys`` at the prompt (a pseudo-terminal: util-linux script)."""
    if not shutil.which("script"):
        pytest.skip("no `script` to run a command on a pseudo-terminal")
    argv = shlex.join([*CLI, "-p", str(port)])
    out = subprocess.run(["script", "-qec", argv, "/dev/null"], input=keys, capture_output=True, timeout=TIMEOUT,
                         cwd=ROOT, env={"DISQUE_CLI_HISTFILE": "/dev/null", "PATH": "/usr/bin:/bin", "TERM": "dumb",
                                        "PYTHONPATH": str(ROOT)})  # fmt: skip
    return out.stdout.decode(errors="replace").replace("\r\n", "\n")


def test_tab_completes_commands_subcommands_and_help_topics(node):
    text = on_terminal(node.port, b"QLE\t q\nhelp ADDJ\t\nhelp @que\t\nCLUSTER MY\t\nquit\n")
    assert "> QLEN  q\n(integer) 0\n" in text, text  # QLE + Tab: QLEN and a space
    assert "> help ADDJOB \n\n  ADDJOB queue_name job ms-timeout [REPLICATE count]" in text, text
    assert "> help @queues \n\n  GROUP INFO group" in text, text
    assert re.search(r"> CLUSTER MYID \n\"[0-9a-f]{40}\"\n", text), text


def test_the_prompt_answers_help_with_the_node_down(down):
    text = on_terminal(down, b"help qlen\nquit\n")
    assert "not connected> help qlen\n\n  QLEN queue_name\n  summary: " in text, text
    assert "Could not connect to disque-py at 127.0.0.1:%d" % down in text


def test_redis_cli_7_reads_the_same_declarations_from_command_docs(node, redis_cli):
    for group in ("jobs", "queues", "workers", "cluster", "connection", "server"):
        out = subprocess.run([redis_cli, "-p", str(node.port), "help", "@" + group], capture_output=True,
                             text=True, timeout=TIMEOUT).stdout  # fmt: skip
        text = re.sub(r"\x1b\[[0-9;]*m", "", out).replace("\r\n", "\n")  # its colours off
        names = sorted(n for n, s in SPECS.items() if s.group == group)
        assert listed(text) == [n.upper() for n in names], text
        for name in names:
            spec = SPECS[name]
            # redis-cli writes a command's name and then the parameters it made of COMMAND DOCS'
            # arguments: the declared syntax (its subcommand forms joined by a bare |, as Redis's oneof)
            upper, _, params = spec.syntax.partition(" ")
            assert "\n  %s %s\n  summary: %s\n  since: %s\n" % (upper, params.replace(" | ", "|"), spec.summary,
                                                                spec.since) in text, (name, text)  # fmt: skip
