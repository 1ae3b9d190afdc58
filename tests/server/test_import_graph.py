"""The shell's modules form no import circle, and only the CLI reaches ``app``.

Every import between modules of ``disque_py/server`` counts, those under
``if TYPE_CHECKING:`` included: they tie two modules together as tightly.
"""

from __future__ import annotations

import ast
from pathlib import Path

import disque_py.server

SERVER = Path(disque_py.server.__file__).parent


def _graph() -> dict[str, set[str]]:
    modules = {p.stem for p in SERVER.glob("*.py")} - {"__init__"}
    graph: dict[str, set[str]] = {}
    for name in modules:
        deps: set[str] = set()
        for node in ast.walk(ast.parse((SERVER / (name + ".py")).read_text(encoding="utf-8"))):
            if isinstance(node, ast.ImportFrom):
                if node.level == 1:
                    targets = [node.module.split(".")[0]] if node.module else [a.name for a in node.names]
                elif node.level == 0 and (node.module or "").startswith("disque_py.server."):
                    targets = [node.module.split(".")[2]]
                else:
                    continue
            elif isinstance(node, ast.Import):
                targets = [a.name.split(".")[2] for a in node.names if a.name.startswith("disque_py.server.")]
            else:
                continue
            deps.update(t for t in targets if t in modules and t != name)
        graph[name] = deps
    return graph


def test_no_module_of_the_shell_imports_one_that_imports_it_back():
    graph = _graph()

    def reaches(start: str) -> set[str]:
        seen: set[str] = set()
        todo = list(graph[start])
        while todo:
            mod = todo.pop()
            if mod not in seen:
                seen.add(mod)
                todo.extend(graph[mod])
        return seen

    circles = sorted(mod for mod in graph if mod in reaches(mod))
    assert circles == [], "modules on an import circle: %s" % circles


def test_app_composes_the_parts_and_nothing_in_the_shell_imports_it():
    graph = _graph()
    assert [mod for mod, deps in graph.items() if "app" in deps] == []
    assert {"clients", "dispatch", "timers", "cluster", "admin"} <= graph["app"]
    for part in ("clients", "dispatch", "timers", "cluster", "admin"):
        others = {"clients", "dispatch", "timers", "cluster", "admin"} - {part}
        assert not graph[part] & others, "%s imports %s" % (part, graph[part] & others)
