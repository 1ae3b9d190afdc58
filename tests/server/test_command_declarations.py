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
from disque_py.core.commandspec import ALWAYS, FLAGS, KEY_KINDS, CommandSpec, bind, check_unique
from disque_py.core.memory import OOM_ERROR
from disque_py.core.node import CORE_COMMANDS, OOM_COMMANDS
from disque_py.server.acl import CATEGORY_NAMES
from disque_py.server.app import NODE_COMMANDS, Server
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
                                   server.node.blocking, server.node.dedup, server.node.delivery)}  # fmt: skip
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
