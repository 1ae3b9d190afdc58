"""The core's shape, read off the source: the order Node builds its machines in, who receives
whom, and the drawing of it in node.py's docstring and docs/ARCHITECTURE.md.

Each machine receives, as typed constructor arguments, the machines it calls, all of them built
before it (``node.py``, "Who calls whom"): so no machine calls one above it. The import rule
(``tests/test_contracts.py``: no module imports one that imports it back) holds the modules to
it; this holds the drawings to the code, and the code to the rule."""

from __future__ import annotations

import ast
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
CORE = ROOT / "disque_py" / "core"
#: module of each machine class Node builds
MODULES = {
    "Limits": "limits", "Lifecycle": "lifecycle", "Leases": "leases", "Requeue": "requeue", "Replication": "replication",
    "Acks": "acks", "Delivery": "delivery", "Federation": "federation", "Blocking": "blocking",
    "Dedup": "dedup", "Memory": "memory",
}  # fmt: skip
_DRAWN = re.compile(r"^\s*([A-Z][a-z]+)\(ctx((?:, [a-z_]+)*)(?:, on_level=Node's)?\)", re.M)


def _class(module: str, name: str) -> ast.ClassDef:
    tree = ast.parse((CORE / (module + ".py")).read_text())
    return next(n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == name)


def _init(cls: ast.ClassDef) -> ast.FunctionDef:
    return next(n for n in cls.body if isinstance(n, ast.FunctionDef) and n.name == "__init__")


def received(name: str) -> list[str]:
    """The machine classes ``name``'s constructor takes, in order (read from its annotations)."""
    args = _init(_class(MODULES[name], name)).args.args[1:]
    assert args[0].arg == "ctx" and ast.unparse(args[0].annotation) == "Context", name
    return [ast.unparse(a.annotation) for a in args[1:] if ast.unparse(a.annotation) in MODULES]


def built() -> list[tuple[str, list[str]]]:
    """(class, the classes of its machine arguments) in the order Node.__init__ builds them."""
    names: dict[str, str] = {}  # name bound to a machine (self.x, x) -> its class
    order = []
    for stmt in _init(_class("node", "Node")).body:  # self.x = x = Class(ctx, ...)
        call = stmt.value if isinstance(stmt, ast.Assign) else None
        if isinstance(call, ast.Call) and isinstance(call.func, ast.Name) and call.func.id in MODULES:
            order.append((call.func.id, [names[ast.unparse(a)] for a in call.args[1:] if ast.unparse(a) in names]))
            for target in stmt.targets:
                names[ast.unparse(target).removeprefix("self.")] = call.func.id
    return order


def drawn(text: str) -> list[tuple[str, list[str]]]:
    return [(m[1], [a.capitalize() for a in m[2].split(", ") if a]) for m in _DRAWN.finditer(text)]


def test_every_machine_receives_only_machines_built_before_it():
    order = built()
    assert [name for name, _ in order] == list(MODULES)  # every machine, once, in this order
    seen: set[str] = set()
    for name, args in order:
        assert set(args) <= seen, "%s is handed %s, not built yet" % (name, sorted(set(args) - seen))
        assert args == received(name), name  # handed what its constructor is typed to take
        seen.add(name)


def test_the_drawings_of_the_order_are_the_code():
    order = built()
    node_doc = ast.get_docstring(ast.parse((CORE / "node.py").read_text()))
    assert drawn(node_doc) == order
    assert drawn((ROOT / "docs" / "ARCHITECTURE.md").read_text()) == order


def test_the_context_lends_no_operation():
    """What the machines share holds state and the outbox only: no callable slot to fill in later
    (a machine calls another on the object it was handed)."""
    cls = _class("context", "Context")
    annotated = [n for n in cls.body if isinstance(n, ast.AnnAssign)]
    assert not [ast.unparse(n) for n in annotated if "Callable" in ast.unparse(n.annotation)]
    slots = next(n for n in cls.body if isinstance(n, ast.Assign) and ast.unparse(n.targets[0]) == "__slots__")
    assert all(isinstance(e, ast.Constant) for e in slots.value.elts)  # no names spliced in (*PORTS)
