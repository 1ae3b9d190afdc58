"""The docs match the program: what README.md and docs/*.md tell a user to type runs, against
real nodes, and every disque.conf directive they name exists.

What runs, and the conventions the docs keep for it:

- **The tour.** A fenced block whose lines read ``127.0.0.1:7711> CMD`` is a redis-cli session:
  each command runs with redis-cli on a fresh node (port substituted) and the lines under it are
  its documented output, compared line by line with redis-cli's (``--no-raw``, as at a terminal);
  a job ID stands for whatever ID the node made, the same documented ID for the same real one, and
  ``D-...`` in a command for the last job ID seen. A step shown without output must answer neither
  an error nor ``(nil)``. A ``# comment`` after a command is the reader's, not redis-cli's.
- **Shell blocks** (```sh, ```console, ```bash): every command runs, in a directory of its own
  holding ``disque.conf`` (disque.conf.example on the substituted port), with ``.venv/bin`` first
  on PATH. Ports 7711-7713, 8711-8713 (admin) and 17711 become free ports; a block that starts
  no node of its own gets one (with its admin port, and a job in ``emails`` for the documented
  IDs). ``disque-py server ...`` must come up on its port and stop cleanly on SIGTERM;
  ``scripts/cluster`` runs as ``python -m disque_py.cli.devcluster`` (the script itself ``cd``s into
  the checkout); redis-cli answers are read with ``--no-raw`` so that errors show as errors.
  A command that cannot run here is skipped with its reason, never silently: by a rule of
  :data:`CANNOT_RUN` (other machines, Spark, package installs, runs of minutes, placeholders), or
  for a whole block by a line ``<!-- docs-test: skip REASON -->`` just before it.
- **Directives.** Every name the docs give as a directive (a backticked word of a directive's
  family, ``CONFIG GET|SET name``, ``--name`` of ``disque-py server``, a line of
  disque.conf.example) is in :data:`disque_py.config.DIRECTIVES`; every directive is in
  disque.conf.example, whose ``[RUNTIME]`` and ``[NOT YET ACTIVE]`` marks agree with the table.
"""

from __future__ import annotations

import os
import re
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from disque_py.cli import launcher
from disque_py.config import DIRECTIVES
from disque_py.util.globmatch import glob_match
from tests.integration.conftest import ROOT, NodeProcess, _bindable, fail_unclean, free_port, stop_all, unclean

pytestmark = pytest.mark.integration

# docs/benchmarks-history.md is a record of past measurements, kept as they were taken (ports,
# trees and commits of their day), not instructions to follow: BENCHMARKS.md is the current page.
HISTORY = {"benchmarks-history.md"}
DOCS = [ROOT / "README.md", *sorted(p for p in (ROOT / "docs").glob("*.md") if p.name not in HISTORY)]
EXAMPLE = ROOT / "disque.conf.example"
SHELL = ("sh", "console", "bash")
SKIP_MARK = re.compile(r"<!--\s*docs-test:\s*skip\s+(.*?)\s*-->")
PROMPT = re.compile(r"^127\.0\.0\.1:7711> (.*)$")
JOB_ID = re.compile(r"D-[0-9a-f]{8}-[A-Za-z0-9+/]{24}-[0-9a-f]{4}")
VENV_BIN = Path(sys.executable).parent

#: Commands that cannot run in a test, each with the reason (the first rule that matches wins).
CANNOT_RUN: list[tuple[re.Pattern, str]] = [
    (re.compile(r"^pip install"), "installs packages (the test runs in the installed environment)"),
    (re.compile(r"^scripts/test\s*$"), "runs the whole test suite, of which this test is part"),
    (re.compile(r"^scripts/test\s"), "runs a part of the test suite with pytest (this test runs inside it)"),
    (re.compile(r"^scripts/(bench|chaos|fuzz)\b"), "runs for minutes (benchmarks, chaos or fuzzing)"),
    (re.compile(r"\b10\.0\.0\.\d"), "names other machines (10.0.0.x)"),
    (re.compile(r"<[a-z][a-z-]*>"), "has a placeholder to fill in"),
    (re.compile(r"^examples/run-spark-pipeline"), "needs Spark (Java 17+ and pyspark): tests/spark runs it"),
    (re.compile(r"disque-py top(?!.*--(once|json))"), "interactive until q; tests/integration/test_top.py drives it"),
]


# ------------------------------------------------------------------------------ reading the docs
@dataclass
class Block:
    path: Path
    line: int  # of the opening fence, 1-based
    lang: str
    lines: list[str]
    skip: str | None  # the reason of a <!-- docs-test: skip ... --> line just before it

    @property
    def where(self) -> str:
        return "%s:%d" % (self.path.relative_to(ROOT), self.line)


def blocks(path: Path) -> list[Block]:
    found, text = [], path.read_text().splitlines()
    i = 0
    while i < len(text):
        m = re.match(r"^(\s*)```(\w*)\s*$", text[i])
        if not m:
            i += 1
            continue
        indent, lang, start = m.group(1), m.group(2), i
        j = i + 1
        while j < len(text) and text[j].strip() != "```":
            j += 1
        body = [line[len(indent):] if line.startswith(indent) else line.lstrip() for line in text[i + 1:j]]
        before = next((text[k] for k in range(start - 1, -1, -1) if text[k].strip()), "")
        skip = SKIP_MARK.search(before)
        found.append(Block(path, start + 1, lang, body, skip.group(1) if skip else None))
        i = j + 1
    return found


ALL_BLOCKS = [b for path in DOCS for b in blocks(path)]
TOURS = [b for b in ALL_BLOCKS if any(PROMPT.match(line) for line in b.lines)]


@dataclass
class Command:
    block: Block
    text: str  # continuation lines joined, the trailing comment kept (bash ignores it)
    expected: list[str] = field(default_factory=list)  # a console block's output lines

    @property
    def bare(self) -> str:
        return strip_comment(self.text)


def strip_comment(text: str) -> str:
    """The command without its trailing ``# comment`` (outside quotes)."""
    quote = None
    for i, ch in enumerate(text):
        if quote:
            if ch == quote:
                quote = None
        elif ch in "'\"":
            quote = ch
        elif ch == "#" and (i == 0 or text[i - 1].isspace()):
            return text[:i].rstrip()
    return text.rstrip()


def commands(block: Block) -> list[Command]:
    out: list[Command] = []
    pending = ""
    console = block.lang == "console"
    for line in block.lines:
        if console and not pending and not line.startswith("$ "):
            if out and line.strip():
                out[-1].expected.append(line)
            continue
        line = line[2:] if console and line.startswith("$ ") else line
        if not pending and (not line.strip() or line.lstrip().startswith("#")):
            continue
        if line.rstrip().endswith("\\"):
            pending += line.rstrip()[:-1] + " "
            continue
        out.append(Command(block, (pending + line.strip()).strip()))
        pending = ""
    return out


SHELL_BLOCKS = [b for b in ALL_BLOCKS if b.lang in SHELL]
SHELL_COMMANDS = [c for b in SHELL_BLOCKS for c in commands(b)]


def cannot_run(cmd: Command) -> str | None:
    if cmd.block.skip:
        return cmd.block.skip
    for pattern, reason in CANNOT_RUN:
        if pattern.search(cmd.bare):
            return reason
    return None


def test_the_docs_have_what_this_test_reads():
    # the tour and the shell blocks are found where they are (a changed fence would empty the test)
    # the tour, then BACKOFF and dead letters, then DEDUP
    assert [b.path.name for b in TOURS] == ["README.md"] * 4, [b.where for b in TOURS]
    assert len(SHELL_COMMANDS) >= 25
    runnable = [c for c in SHELL_COMMANDS if not cannot_run(c)]
    assert len(runnable) >= 12
    readme = ROOT / "README.md"
    first = blocks(readme)[0]  # the first screen: exactly two commands, and the first one runs
    assert [c.bare for c in commands(first)] == ["scripts/cluster start", "scripts/test"]
    assert first.skip is None and not cannot_run(commands(first)[0])


# ------------------------------------------------------------------------------ running a block
def ports_free(base: int) -> bool:
    return all(_bindable(p) for i in range(3) for p in (base + i, base + i + 1000, base + i + 10000))


def free_base() -> int:
    for _ in range(100):
        base = free_port()
        if base + 1002 + 10000 <= 65535 and ports_free(base):
            return base
    raise RuntimeError("no free ports")


def substitute(text: str, base: int) -> str:
    """The docs' ports (7711-7713, admin 8711-8713, bus 17711-17713) moved to ``base``."""
    def port(m: re.Match) -> str:
        n = int(m.group(0))
        for doc, real in ((17711, base + 10000), (8711, base + 1000), (7711, base)):
            if doc <= n <= doc + 2:
                return str(real + n - doc)
        return m.group(0)

    return re.sub(r"\b(1771[1-3]|871[1-3]|771[1-3])\b", port, text)


def shell_line(text: str, base: int) -> str:
    text = substitute(text, base)
    text = re.sub(r"(^|\s)\.venv/bin/", r"\1%s/" % VENV_BIN, text)
    text = re.sub(r"(^|\s)scripts/cluster(\s|$)", r"\1%s -m disque_py.cli.devcluster\2" % sys.executable, text)
    if re.match(r"^\S*python -m disque_py\.cli\.devcluster start\b", text) and "--base-port" not in text:
        text = re.sub(r"(disque_py\.cli\.devcluster start)", r"\1 --base-port %d" % base, text, count=1)
    text = re.sub(r"(^|\s)redis-cli(\s)", r"\1redis-cli --no-raw\2", text)  # errors read as errors
    return text


def server_argv(text: str, base: int) -> tuple[list[str], int] | None:
    """A ``disque-py server`` command: its argv (a port added when the docs leave the default 7711)
    and the port it must come up on; None for any other command."""
    argv = shlex.split(strip_comment(text))
    if len(argv) < 2 or not argv[0].endswith("disque-py") or argv[1] != "server":
        return None
    args = argv[2:]
    conf = args[0] if args and not args[0].startswith("-") else None
    rest = args[1:] if conf else args
    opts = dict(zip(rest[0::2], rest[1::2]))
    if "--port" not in opts and not conf:
        args += ["--port", str(base)]
        opts["--port"] = str(base)
    port = int(opts.get("--port", base))
    if port == 0:
        port = int(opts["--tls-port"])
    return [str(VENV_BIN / "disque-py"), "server", *args], port


@dataclass
class Place:
    dir: Path
    base: int
    env: dict[str, str]
    job_ids: list[str] = field(default_factory=list)


def env_for(tmp: Path) -> dict[str, str]:
    return dict(os.environ, PATH="%s:%s" % (VENV_BIN, os.environ.get("PATH", "")), PYTHONPATH=str(ROOT),
                PYTHONUNBUFFERED="1")  # fmt: skip


def starts_nodes(block: Block) -> bool:
    return any(re.search(r"(scripts/cluster start|disque-py (server|cluster create))", c.bare)
               for c in commands(block))  # fmt: skip


def stop_everything_under(path: Path) -> None:
    """Stop every node a block started (found by its pid file); fail if one had to be killed."""
    problems = []
    for pidfile in path.rglob("*.pid"):
        try:
            pid = int(pidfile.read_text().strip())
        except (OSError, ValueError):
            continue
        m = re.search(r"node-(\d+)", str(pidfile))
        stopped = launcher.stop(pid, port=int(m.group(1)) if m else None, sig=signal.SIGTERM, timeout=10)
        problems.append(unclean("the node of %s" % pidfile.relative_to(path), stopped))
    fail_unclean(problems)


def run_server(argv: list[str], port: int, place: Place) -> str:
    log = place.dir / ("server-%d.log" % port)
    with open(log, "wb") as out:
        proc = subprocess.Popen(argv, cwd=place.dir, env=place.env, stdout=out, stderr=subprocess.STDOUT)
    try:
        deadline = time.monotonic() + 20
        ready = re.compile(r"Ready to accept (TLS )?connections on .* port %d\b" % port)
        while time.monotonic() < deadline and proc.poll() is None:
            try:  # served: it says so, and the port answers
                if ready.search(log.read_text()):
                    socket.create_connection(("127.0.0.1", port), timeout=0.5).close()
                    break
            except OSError:
                pass
            time.sleep(0.05)
        else:
            pytest.fail("%s did not come up on port %d:\n%s" % (" ".join(argv), port, log.read_text()[-2000:]))
        proc.send_signal(signal.SIGTERM)
        code = proc.wait(timeout=20)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    text = log.read_text()
    assert code == 0 and "Traceback" not in text, "%s exited %s:\n%s" % (" ".join(argv), code, text[-2000:])
    return text


def run_shell(cmd: Command, place: Place) -> None:
    server = server_argv(substitute(cmd.text, place.base).replace(".venv/bin/", "%s/" % VENV_BIN), place.base)
    if server:
        run_server(*server, place)
        return
    line = shell_line(cmd.text, place.base)
    for doc_id in JOB_ID.findall(line):
        assert place.job_ids, "%s names a job (%s) but no job was made" % (cmd.block.where, doc_id)
        line = line.replace(doc_id, place.job_ids[-1])
    proc = subprocess.run(["bash", "-o", "pipefail", "-c", line], cwd=place.dir, env=place.env,
                          capture_output=True, text=True, timeout=90)  # fmt: skip
    said = proc.stdout + proc.stderr
    what = "%s: %s\n(ran: %s)\n%s" % (cmd.block.where, cmd.text, line, said[-3000:])
    assert proc.returncode == 0, what
    assert "Traceback" not in said, what
    if "redis-cli" in line:
        assert not re.search(r"^\(error\)", proc.stdout, re.M), what
    if line.lstrip().startswith("curl"):
        assert '"error"' not in proc.stdout, what
    if cmd.expected:
        assert proc.stdout.splitlines() == cmd.expected, what


@pytest.mark.parametrize("cmd", [c for c in SHELL_COMMANDS if cannot_run(c)],
                         ids=lambda c: "%s %s" % (c.block.where, c.bare[:60]))  # fmt: skip
def test_command_that_cannot_run_here(cmd):
    # one skip per command, with its reason, so that the report lists what the docs test leaves out
    pytest.skip(cannot_run(cmd))


@pytest.mark.parametrize("block", [b for b in SHELL_BLOCKS if any(not cannot_run(c) for c in commands(b))],
                         ids=lambda b: b.where)  # fmt: skip
def test_shell_block_runs(block, tmp_path):
    runnable = [c for c in commands(block) if not cannot_run(c)]
    if any("redis-cli" in c.text for c in runnable) and not shutil.which("redis-cli"):
        pytest.skip("redis-cli not found (apt-get install redis-tools; scripts/test installs it as root)")
    if any(c.bare.startswith("curl") for c in runnable) and not shutil.which("curl"):
        pytest.skip("curl not found")
    base = free_base()
    place = Place(tmp_path, base, env_for(tmp_path))
    (tmp_path / "disque.conf").write_text(re.sub(r"(?m)^port 7711$", "port %d" % base, EXAMPLE.read_text()))
    node = None
    try:
        if not starts_nodes(block):
            # the users the block signs in as (curl -u name:pass), with the rights its comment gives
            users = {}
            for c in runnable:
                m = re.search(r"-u (\w+):(\S+).*\(user \1 on >\2 ([^)]*)\)", c.text)
                if m:
                    users["user"] = (m.group(1), "on", ">" + m.group(2), *m.group(3).split())
            node = NodeProcess(tmp_path / "nodes", port=base, admin_port=base + 1000, **users).start()
            place.job_ids.append(node.client().execute_command("ADDJOB", "emails", "hello", 0).decode())
        for cmd in runnable:
            run_shell(cmd, place)
    finally:
        try:
            stop_all([node] if node is not None else [])
        finally:
            stop_everything_under(tmp_path)


# ------------------------------------------------------------------------------ the tour
@dataclass
class Step:
    command: str
    expected: list[str]


def tour_steps(block: Block) -> list[Step]:
    steps: list[Step] = []
    for line in block.lines:
        m = PROMPT.match(line)
        if m:
            steps.append(Step(strip_comment(m.group(1)), []))
        elif steps and line.strip():
            steps[-1].expected.append(line)
        # lines before the first prompt ($ redis-cli -p 7711) start the session
    return steps


def expected_pattern(lines: list[str], bound: dict[str, str]) -> re.Pattern:
    """The documented output as a pattern: a job ID matches any ID (the same documented ID the
    same real one, and one already seen that one)."""
    groups: dict[str, str] = {}
    parts = []
    for piece in re.split("(%s)" % JOB_ID.pattern, "\n".join(lines)):
        if not JOB_ID.fullmatch(piece):
            parts.append(re.escape(piece))
        elif piece in bound:
            parts.append(re.escape(bound[piece]))
        elif piece in groups:
            parts.append("(?P=%s)" % groups[piece])
        else:
            groups[piece] = "id%d" % len(groups)
            parts.append("(?P<%s>%s)" % (groups[piece], JOB_ID.pattern))
    return re.compile("".join(parts) + r"\Z"), groups


@pytest.mark.parametrize("block", TOURS, ids=lambda b: b.where)
def test_the_tour_runs_as_written(block, tmp_path):
    if not shutil.which("redis-cli"):
        pytest.skip("redis-cli not found (apt-get install redis-tools; scripts/test installs it as root)")
    node = NodeProcess(tmp_path).start()
    bound: dict[str, str] = {}  # documented job ID -> the node's
    last_id = None
    try:
        for step in tour_steps(block):
            command = step.command
            for doc_id, real in bound.items():
                command = command.replace(doc_id, real)
            if "D-..." in command:
                assert last_id, "%s: %s names the last job, but none was seen" % (block.where, step.command)
                command = command.replace("D-...", last_id)
            argv = ["redis-cli", "--no-raw", "-p", str(node.port), *shlex.split(command)]
            proc = subprocess.run(argv, capture_output=True, text=True, timeout=60)
            got = proc.stdout.rstrip("\n")
            what = "%s: %s\ndocumented:\n%s\nanswered:\n%s%s" % (block.where, step.command, "\n".join(step.expected),
                                                                 got, proc.stderr)  # fmt: skip
            assert proc.returncode == 0, what
            if step.expected:
                pattern, groups = expected_pattern(step.expected, bound)
                m = pattern.match(got)
                assert m, what
                bound.update({doc: m.group(name) for doc, name in groups.items()})
            else:
                assert not got.startswith("(error)") and got != "(nil)", what
            ids = JOB_ID.findall(got)
            last_id = ids[-1] if ids else last_id
    finally:
        stop_all([node])


# ------------------------------------------------------------------------------ directives
#: The families directive names belong to: a backticked word of one of these is taken as a directive.
FAMILIES = re.compile(
    r"^(tls-|admin-|cluster-(config|node|secret)|aof-|append|auto-aof-|client-(output|query)|proto-|maxmemory"
    r"|slowlog-|latency-monitor|log-|tcp-|syslog-|unixsocket|protected-|requirepass|maxclients|loglevel|logfile"
    r"|pidfile|activerehashing|watchdog|databases|daemonize|rename-command|no-appendfsync)"
)


#: Names of a directive's family that are something else, and what.
NOT_DIRECTIVES = {
    "aof-write": "a LATENCY event",
    "aof-fsync-always": "a LATENCY event",
}


def named_directives(text: str) -> set[str]:
    names = set()
    for code in re.findall(r"`([^`\n]+)`", text):
        first = code.split()[0] if code.split() else ""
        if first.startswith("--"):
            first = first[2:]
        if FAMILIES.match(first) and re.fullmatch(r"[a-z][a-z0-9*-]*", first) and first not in NOT_DIRECTIVES:
            names.add(first)
        names.update(re.findall(r"CONFIG (?:SET|GET) ([a-z][a-z0-9*-]*)", code))  # in code: any name
    for name in re.findall(r"CONFIG (?:SET|GET) ([a-z][a-z0-9*-]*)", text):
        if re.search(r"[-*]", name):  # in prose, "CONFIG SET of any tls-* setting" is no directive
            names.add(name)
    for line in re.findall(r"disque-py server[^\n]*(?:\\\n[^\n]*)*", text):
        names.update(n for n in re.findall(r"--([a-z][a-z0-9-]*)", line) if n != "name")  # --name value: any
    return names


def example_lines() -> list[str]:
    """The directive lines of disque.conf.example: set, or commented out (``# name value`` after a
    line holding only ``#``, or after another such line)."""
    names, previous_was = [], False
    previous = ""
    for line in EXAMPLE.read_text().splitlines():
        m = re.match(r"^(#? ?)([a-z][a-z0-9-]*)( .*)?$", line)
        is_directive = bool(m) and (not m.group(1) or previous.rstrip() == "#" or previous_was)
        if is_directive:
            names.append(m.group(2))
        previous_was, previous = is_directive, line
    return names


def directive_matches(name: str) -> bool:
    if "*" in name:
        return any(glob_match(name.encode(), d.encode()) for d in DIRECTIVES)
    return name in DIRECTIVES


@pytest.mark.parametrize("path", [*DOCS, EXAMPLE], ids=lambda p: str(p.relative_to(ROOT)))
def test_every_directive_the_docs_name_exists(path):
    text = path.read_text()
    names = named_directives(text)
    if path == EXAMPLE:
        names.update(example_lines())
    unknown = sorted(n for n in names if not directive_matches(n))
    assert not unknown, "%s names directives the node does not have: %s" % (path.name, unknown)


def test_the_directive_finder_finds_them():
    # a test that cannot fail is no test: the finder sees a wrong name where the docs would put one
    assert named_directives("set `tls-cluster-port 1` or `CONFIG SET maxmemory-lmit 1`") == {
        "tls-cluster-port", "maxmemory-lmit"}  # fmt: skip
    assert not directive_matches("tls-cluster-port") and directive_matches("auto-aof-rewrite-*")
    readme = named_directives((ROOT / "README.md").read_text())
    assert {"appendfsync", "cluster-secret", "tls-auth-clients", "aof-enqueue-jobs-once"} <= readme


def example_sections() -> list[tuple[str, list[str]]]:
    """disque.conf.example as (comment paragraph, directive names below it) pairs."""
    sections: list[tuple[str, list[str]]] = []
    comment: list[str] = []
    names: list[str] = []
    for line in EXAMPLE.read_text().splitlines() + [""]:
        m = re.match(r"^#? ?([a-z][a-z0-9-]+)( \S.*)?$", line)
        if m and m.group(1) in DIRECTIVES and (not line.startswith("#") or not comment or comment[-1] == ""):
            names.append(m.group(1))
        elif line.startswith("#") and not line.startswith("####"):
            if names:
                sections.append((" ".join(comment), names))
                comment, names = [], []
            comment.append(line.lstrip("# ").rstrip() if line.strip("#").strip() else "")
        elif not line.strip() or line.startswith("####"):
            if names:
                sections.append((" ".join(comment), names))
                comment, names = [], []
            elif line.startswith("####"):
                comment = []
    return sections


def test_disque_conf_example_has_every_directive_marked_as_the_node_treats_it():
    sections = example_sections()
    shown = [n for _, names in sections for n in names]
    assert sorted(set(shown)) == sorted(DIRECTIVES), "missing: %s" % sorted(set(DIRECTIVES) - set(shown))
    wrong = []
    for comment, names in sections:
        for name in names:
            d = DIRECTIVES[name]
            if ("[RUNTIME]" in comment) != d.runtime:
                wrong.append("%s: [RUNTIME] %s, CONFIG SET %s" % (name, "shown" if "[RUNTIME]" in comment else "not shown",
                                                                 "takes it" if d.runtime else "refuses it"))  # fmt: skip
            if ("[NOT YET ACTIVE]" in comment) == d.implemented:
                wrong.append("%s: [NOT YET ACTIVE] %s, implemented=%s" % (
                    name, "shown" if "[NOT YET ACTIVE]" in comment else "not shown", d.implemented))
    assert not wrong, "\n".join(wrong)
