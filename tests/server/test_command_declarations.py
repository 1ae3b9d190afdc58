"""One declaration per command (core/commandspec.py): everything else is made from it.

A command is declared once, beside the code that answers it (a machine's ``COMMANDS`` in
core/*.py, ``admin.COMMANDS``, ``cluster.COMMANDS``). These tests walk what a node really
dispatches from and what it derives, so that a command added anywhere but in a declaration
(a handler put into a table by hand, a name added to the ACL or the -OOM set only, a
``cmd_*`` method nobody declared) fails here.
"""

from __future__ import annotations

import ast
import importlib
import pkgutil
from pathlib import Path

import pytest

import disque_py.core
import disque_py.server
from disque_py.config import load_config
from disque_py.core.commandspec import ALWAYS, DISQUE, FLAGS, GROUPS, KEY_KINDS, CommandSpec, bind, check_unique
from disque_py.core.memory import OOM_ERROR
from disque_py.core.node import CORE_COMMANDS, OOM_COMMANDS
from disque_py.core.replies import Status
from disque_py.server.acl import CATEGORY_NAMES
from disque_py.server.app import NODE_COMMANDS, Server
from disque_py.server.commanddocs import SyntaxProblem, alternatives, read_syntax
from disque_py.server.connection import Connection

ROOT = Path(__file__).resolve().parents[2]
SPECS = {spec.name: spec for spec in NODE_COMMANDS}


@pytest.fixture
async def server(tmp_path):
    config = load_config(None, ["--port", "0", "--dir", str(tmp_path), "--bind", "127.0.0.1"])
    return Server(config)  # composed, not run: its tables are what a running node dispatches from


class _Sock:
    def fileno(self) -> int:
        return -1


def _run(server, *argv: bytes):
    conn = Connection(1, _Sock(), "127.0.0.1:5555", "127.0.0.1:7711", 0.0, None)
    return server.dispatcher.dispatch(conn, list(argv), 0)


def _modules():
    """Every module of the core and the shell, imported."""
    for package in (disque_py.core, disque_py.server):
        for info in pkgutil.iter_modules(package.__path__):
            yield importlib.import_module(package.__name__ + "." + info.name)


def test_every_declaration_is_in_one_module_and_named_once():
    declared = [spec.name for spec in NODE_COMMANDS]
    assert len(declared) == len(set(declared)) == len(SPECS)
    # the node's list is the modules' own COMMANDS, nothing added, no module's list left out
    by_module = [spec.name for module in _modules() for spec in getattr(module, "COMMANDS", ())]
    by_module.append(b"hello")  # the node's own (node.py)
    assert sorted(by_module) == sorted(declared)
    with pytest.raises(ValueError, match="declared twice"):
        check_unique(NODE_COMMANDS + (SPECS[b"nack"]._replace(handler="cmd_other"),))


def test_no_handler_exists_without_a_declaration():
    """A ``cmd_*`` method of any class of the core or the shell that no declaration names is a
    command someone wired by hand, or forgot to declare."""
    handlers = {spec.handler for spec in NODE_COMMANDS}
    found = 0
    for module in _modules():
        for cls in vars(module).values():
            if isinstance(cls, type) and cls.__module__ == module.__name__:
                for attr in vars(cls):
                    if attr.startswith("cmd_"):
                        found += 1
                        assert attr in handlers, "%s.%s is not declared" % (cls.__qualname__, attr)
    assert found >= len(CORE_COMMANDS) + 1  # the machines' and CLUSTER's were looked at


async def test_every_name_the_node_dispatches_has_exactly_one_declaration_and_is_bound_from_it(server):
    core, shell = server.node.commands, server.dispatcher.admin
    assert not set(core) & set(shell)  # a name is answered by one table only
    assert set(core) | set(shell) == set(SPECS)  # nothing dispatched undeclared, nothing declared idle
    assert set(core) == {spec.name for spec in CORE_COMMANDS}
    for table in (core, shell):
        for name, (handler, arity) in table.items():
            spec = SPECS[name]
            assert arity == spec.arity, name
            assert handler.__name__ == spec.handler, name  # the declared handler, not one put in by hand
    machines = {type(m) for m in (server.node.lifecycle, server.node.requeue, server.node.acks,
                                   server.node.blocking, server.node.dedup, server.node.delivery,
                                   server.node.federation, server.node.limits)}  # fmt: skip
    for name in core:
        owner = getattr(core[name][0], "__self__", None)
        assert owner is server.node or type(owner) in machines, name


def test_declarations_are_well_formed():
    for spec in NODE_COMMANDS:
        assert isinstance(spec, CommandSpec) and spec.name == spec.name.lower() and spec.arity
        assert set(spec.flags) <= FLAGS and not {"write", "readonly"} <= set(spec.flags), spec
        assert spec.keys is None or spec.keys in KEY_KINDS
        for acl in (spec.acl, *(a for _, a in spec.subcommands)):
            assert acl == ALWAYS or (acl and set(acl) <= set(CATEGORY_NAMES)), spec


async def test_the_oom_table_refuses_exactly_the_denyoom_declarations(server):
    node = server.node
    plain = dict(node.commands)
    assert OOM_COMMANDS == {spec.name for spec in NODE_COMMANDS if "denyoom" in spec.flags}
    assert OOM_COMMANDS == {b"addjob", b"enqueue", b"nack"}  # Disque's "m" commands
    assert _run(server, b"ADDJOB", b"q", b"body", b"0", b"REPLICATE", b"1").startswith(b"D-")
    node.memory.set_limit(1, 0)  # level 3
    assert node.memory.level == 3
    oom = node.commands
    assert set(oom) == set(plain)
    assert {name for name in oom if oom[name] != plain[name]} == OOM_COMMANDS
    assert all(oom[name][1] == plain[name][1] for name in oom)  # same arities
    assert _run(server, b"NACK", b"D-00000000-0000000000000000000000-0000").startswith(OOM_ERROR + " (used_memory ")
    node.memory.set_limit(1 << 40, 0)
    assert node.commands is node._commands_ok


async def test_command_replies_are_made_from_the_declarations(server):
    entries = _run(server, b"COMMAND")
    assert [e[0] for e in entries] == [spec.name for spec in NODE_COMMANDS]
    for entry in entries:
        spec = SPECS[entry[0]]
        assert entry == [spec.name, spec.arity, [f.encode() for f in spec.flags], 0, 0, 0]
    assert _run(server, b"COMMAND", b"COUNT") == len(NODE_COMMANDS)
    assert _run(server, b"COMMAND", b"LIST") == [spec.name for spec in NODE_COMMANDS]
    assert _run(server, b"COMMAND", b"INFO", b"NACK", b"nosuch")[1] is None


async def test_the_acl_rights_are_made_from_the_declarations(server):
    rights = server.acl.rights
    categories = {cat: set() for cat in CATEGORY_NAMES}
    always = set()
    for spec in NODE_COMMANDS:
        for key, acl in ((spec.name.decode(), spec.acl),
                         *((spec.name.decode() + "|" + sub, a) for sub, a in spec.subcommands)):  # fmt: skip
            if acl == ALWAYS:
                always.add(key)
            for cat in () if acl == ALWAYS else acl:
                categories[cat].add(key)
    assert rights.categories == categories and list(rights.categories) == list(CATEGORY_NAMES)
    assert rights.always == always
    assert rights.keys == {spec.name: spec.keys for spec in NODE_COMMANDS if spec.keys is not None}
    assert rights.subcommands == {spec.name for spec in NODE_COMMANDS if spec.subcommands}
    assert rights.plain == {spec.name: (None if spec.acl == ALWAYS else spec.name.decode(), spec.keys)
                            for spec in NODE_COMMANDS if not spec.subcommands}  # fmt: skip
    assert _run(server, b"ACL", b"CAT") == [c.encode() for c in CATEGORY_NAMES]


def _literals(path: Path) -> set[str]:
    out = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Constant) and isinstance(node.value, (str, bytes)):
            value = node.value.decode("latin-1") if isinstance(node.value, bytes) else node.value
            out.add(value)
    return out


@pytest.mark.parametrize("path", ["disque_py/server/acl.py", "disque_py/core/memory.py"])
def test_the_acl_and_the_memory_policy_name_no_command(path):
    """Their command knowledge is derived: a name written there by hand is a second declaration."""
    names = {spec.name.decode() for spec in NODE_COMMANDS}
    names |= {spec.name.decode() + "|" + sub for spec in NODE_COMMANDS for sub, _ in spec.subcommands}
    assert not (_literals(ROOT / path) & names)


def test_bind_makes_the_table_once_from_a_lookup():
    specs = (CommandSpec(b"one", "f", 2, ("readonly",), ALWAYS), CommandSpec(b"two", "g", -1, (), ALWAYS))
    functions = {"f": len, "g": repr}
    assert bind(specs, functions.__getitem__) == {b"one": (len, 2), b"two": (repr, -1)}
    with pytest.raises(KeyError, match="'f'"):
        bind(specs, {}.__getitem__)  # a declaration naming no handler fails when the node is made


# ------------------------------------------------------------------ what a person is told (help, COMMAND DOCS)

#: Disque 1.0-rc1's commands: its server.c's serverCommandTable, and QUIT (answered before the table
#: is looked up). Of these we have no MONITOR, and no LOADJOB (Disque's AOF records; ours differ).
DISQUE_COMMANDS = {
    b"auth", b"ping", b"info", b"shutdown", b"monitor", b"debug", b"config", b"cluster", b"client", b"slowlog",
    b"time", b"command", b"latency", b"hello", b"addjob", b"getjob", b"ackjob", b"fastack", b"deljob", b"show",
    b"loadjob", b"bgrewriteaof", b"qlen", b"qpeek", b"qstat", b"qscan", b"jscan", b"enqueue", b"nack", b"dequeue",
    b"working", b"pause", b"quit",
}  # fmt: skip


async def test_every_command_the_node_answers_says_its_syntax_summary_and_group(server):
    """Walks what the node dispatches: a command declared without its syntax, summary or group
    (help and COMMAND DOCS would have nothing to say of it) fails here."""
    dispatched = set(server.node.commands) | set(server.dispatcher.admin)
    assert dispatched == set(SPECS)
    for name in sorted(dispatched):
        spec = SPECS[name]
        upper = name.decode().upper()
        assert spec.syntax.split(" ")[0] == upper, spec.syntax
        read_syntax(spec)  # the notation (commandspec's docstring), or SyntaxProblem
        assert spec.summary and "\n" not in spec.summary and len(spec.summary) <= 90, spec.summary
        assert spec.summary[0].isupper() and not spec.summary.endswith("."), spec.summary
        assert spec.group in GROUPS, spec
        forms = alternatives(spec)
        assert all(form.startswith(upper) for form in forms)
        # a subcommand whose rights are its own is a form of the syntax, so that help can say its rights
        assert {sub for sub, _ in spec.subcommands} <= {f.split()[1].lower() for f in forms if " " in f}, spec
    assert {spec.group for spec in NODE_COMMANDS} == set(GROUPS)  # no group is empty


def test_since_tells_disques_commands_from_ours():
    ours = {spec.name for spec in NODE_COMMANDS if spec.since != DISQUE}
    assert ours == set(SPECS) - DISQUE_COMMANDS == {b"echo", b"acl", b"worker", b"release", b"movejobs",
                                                         b"group"}
    # each of ours names the release that brought it: GROUP came with 0.2.0, the rest with 0.1.0
    assert {name: SPECS[name].since for name in ours} == {
        **{name: "disque-py 0.1.0" for name in ours - {b"group"}}, b"group": "disque-py 0.2.0"}


@pytest.mark.parametrize("syntax, problem", [
    ("PONG", "must start with PING"),
    ("PING [message", "the brackets do not pair"),
    ("PING ] message [", "a ] closes nothing"),
    ("PING Message", "'Message' is neither a token"),
    ("PING [message ...]", "must repeat what comes just before it"),
    ("PING message ...", r"\.\.\. only as in x \[x \.\.\.\]"),
    ("PING a | ", "an alternative is empty"),
    ("PING A||B", "an empty choice in 'A\\|\\|B'"),
    ("PING []", r"\[\] holds nothing"),
])  # fmt: skip
def test_a_syntax_that_breaks_the_notation_is_refused(syntax, problem):
    with pytest.raises(SyntaxProblem, match=problem):
        read_syntax(CommandSpec(b"ping", "ping", -1, (), ALWAYS, syntax=syntax))


def test_a_group_must_be_one_of_the_groups():
    with pytest.raises(ValueError, match="unknown group 'jbos'"):
        check_unique([CommandSpec(b"one", "f", 2, (), ALWAYS, group="jbos")])


def redis_params(arguments: list) -> str:
    """The parameters redis-cli 7 prints from COMMAND DOCS' arguments (its cliAddArgument)."""
    out = []
    for arg in arguments:
        kind, flags = arg[b"type"], set(arg.get(b"flags", ()))
        token = arg.get(b"token", b"").decode()
        if kind == b"oneof":
            repeat = "|".join(redis_params([a]) for a in arg[b"arguments"])
        elif kind == b"block":
            repeat = redis_params(arg[b"arguments"])
        elif kind == b"pure-token":
            repeat = ""
        else:
            repeat = arg[b"name"].decode()
        head = token + " " if token and kind != b"pure-token" else token
        text = head + repeat
        if b"multiple" in flags:
            text += " [" + (head if b"multiple_token" in flags else "") + repeat + " ...]"
        out.append("[" + text + "]" if b"optional" in flags else text)
    return " ".join(out)


async def test_command_docs_are_made_from_the_declarations(server):
    docs = _run(server, b"COMMAND", b"DOCS")
    assert list(docs) == [spec.name for spec in NODE_COMMANDS]
    for spec in NODE_COMMANDS:
        doc = docs[spec.name]
        assert (doc[b"summary"], doc[b"since"], doc[b"group"]) == (spec.summary.encode(), spec.since.encode(),
                                                                   spec.group.encode())  # fmt: skip
        # Redis 7's argument maps, read back as redis-cli 7 does, give the declared syntax (its
        # subcommand forms joined by a bare |, as Redis writes a oneof)
        params = spec.syntax.partition(" ")[2].replace(" | ", "|")
        assert redis_params(doc.get(b"arguments", [])) == params, spec.name
        assert (b"arguments" in doc) == bool(params)
        for arg in doc.get(b"arguments", []):
            assert set(arg) <= {b"name", b"type", b"token", b"flags", b"arguments"}
            assert all(isinstance(f, Status) for f in arg.get(b"flags", ()))  # simple strings, as redis-cli asserts
    assert _run(server, b"COMMAND", b"DOCS", b"AddJob", b"nosuch", b"addjob") == {b"addjob": docs[b"addjob"]}
    assert _run(server, b"COMMAND", b"DOCS", b"nosuch", b"\xff\x00", b"") == {}  # junk: nothing, no error
    getjob = docs[b"getjob"][b"arguments"]
    assert getjob[1] == {b"name": b"ms-timeout", b"type": b"string", b"token": b"TIMEOUT", b"flags": [Status(b"optional")]}
    assert getjob[-1] == {b"name": b"queue", b"type": b"string", b"flags": [Status(b"multiple")]}
