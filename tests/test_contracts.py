"""The house's rules, read off the source: who may import whom.

* No import circle among the modules of ``disque_py`` and ``cluster_bus``. An import
  under ``if TYPE_CHECKING:`` or inside a function counts: it ties the two modules
  as tightly (one cannot be read, changed or tested without the other).
* The core (``disque_py.core``) is sans-I/O: it imports nothing of the rest of
  ``disque_py`` (the shell, the protocol, the config, the client) and none of the
  modules that do I/O or read the clock.
* The AOF record format (``disque_py.persistence.records``) is sans-I/O as well: it
  may import the core, and nothing else of ``disque_py`` nor any module the core may not.
* ``cluster_bus`` is a library of its own: it never imports ``disque_py``.
* The shell's parts (``server.clients``, ``dispatch``, ``timers``, ``cluster``, ``workers``,
  ``admin``) do not import each other: each is handed what it needs, and only
  ``server.app`` composes them (nothing in the shell imports ``app``).
* The Spark source (``disque_py.spark``) is a client of the cluster: it imports no
  part of the server, and pyspark only in ``spark.source``.
* The benchmarks (``scripts/benchmarks``, the ``benchmarks`` package) have no circle
  either, and their shared module (``benchmarks.common``) imports none of the suites
  or harnesses built on it.
* The tasks layer (``disque_py.tasks``) is a client of the cluster: it imports the
  client (``disque_py.client``), two leaves of the core at most (``core.ids``, the IDs of
  DEDUP jobs and dead letters, and ``core.constants``, ADDJOB's default RETRY), and nothing
  of a node; those two leaves import nothing of ``disque_py``. opentelemetry (the ``otel`` extra)
  is imported by ``tasks.tracing`` alone, and only when first asked (inside a function).
* The programs an operator runs (``disque_py.cli``: the click entry, ``server``, ``cli``, ``top``,
  ``dead``, ``worker``, the dev cluster, the launcher, certificates) are the top floor: nothing
  else of ``disque_py`` imports them. The package's root holds at most 8 modules (what a user
  imports), and ``disque_py.util``'s leaves import nothing of ``disque_py``.
* The admin web app (``disque_py.web``) is handed its node (``web.handle.NodeHandle``):
  it imports no part of the shell, and in the shell only ``server.web`` (which serves
  it) imports it.
* The client's private names stay in the client: no module outside ``disque_py.client``
  imports a name that starts with ``_`` from it (a program that talks to one node uses
  the public ``client.connection.NodeConnection``), nor calls a private method the client's
  faces define (``client._call(...)``: ``client.run(call)`` and ``client.pipeline(calls)``
  are the public ways to send a command built with ``client.commands``).

The graph comes from the syntax tree, so a module is judged without being imported.
The rules are first shown to catch a breach in a small tree made for the purpose,
so that a green run on the real tree means something.
"""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("disque_py", "cluster_bus")
CORE = "disque_py.core"
#: What the core may not import: I/O, the clock, threads and processes, logging.
CORE_FORBIDDEN = frozenset({
    "trio", "socket", "os", "time", "select", "selectors", "asyncio", "threading",
    "subprocess", "signal", "logging", "io", "pathlib", "shutil",
})  # fmt: skip
SHELL = "disque_py.server"
RECORDS = "disque_py.persistence.records"
SPARK = "disque_py.spark"
WEB = "disque_py.web"
TASKS = "disque_py.tasks"
PROGRAMS = "disque_py.cli"
UTIL = "disque_py.util"
CLIENT = "disque_py.client"
#: the most modules the package's root may hold (the programs live in disque_py.cli)
ROOT_MODULES_MAX = 8
#: What the tasks layer may import besides the client and itself: the package, two leaves of the
#: core (which import nothing), the extras' check.
TASKS_MAY_IMPORT = frozenset({"disque_py", "disque_py.core.ids", "disque_py.core.constants", "disque_py.util.extras"})
#: the only module that imports opentelemetry, never when it is itself imported
TRACING = TASKS + ".tracing"
SHELL_PARTS = frozenset(SHELL + "." + p for p in ("clients", "dispatch", "timers", "cluster", "admin", "workers"))


def module_files(root: Path, packages=PACKAGES) -> dict[str, Path]:
    mods = {}
    for package in packages:
        for path in sorted((root / package).rglob("*.py")):
            parts = list(path.relative_to(root).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts.pop()
            mods[".".join(parts)] = path
    return mods


def import_graph(root: Path, packages=PACKAGES) -> tuple[dict[str, set[str]], dict[str, set[str]]]:
    """(internal edges, external top-level names imported) for every module."""
    mods = module_files(root, packages)
    internal: dict[str, set[str]] = {m: set() for m in mods}
    external: dict[str, set[str]] = {m: set() for m in mods}

    def owner(name: str) -> str | None:
        while name and name not in mods:
            name = name.rpartition(".")[0]
        return name or None

    for mod, path in mods.items():
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), str(path))):
            if isinstance(node, ast.Import):
                targets = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom):
                start = imported_from(mod, path, node)
                # "from . import x" names module x when there is one, else the package
                targets = [start + "." + alias.name if start + "." + alias.name in mods else start
                           for alias in node.names]  # fmt: skip
            else:
                continue
            for target in targets:
                inside = owner(target)
                if inside is not None:
                    if inside != mod:
                        internal[mod].add(inside)
                else:
                    external[mod].add(target.partition(".")[0])
    return internal, external


def imported_from(mod: str, path: Path, node: ast.ImportFrom) -> str:
    """The module a ``from ... import`` of module ``mod`` (at ``path``) reads, made absolute."""
    if not node.level:
        return node.module or ""
    base = mod.split(".") if path.name == "__init__.py" else mod.split(".")[:-1]
    base = base[: len(base) - (node.level - 1)]
    return ".".join(base + ([node.module] if node.module else []))


def private_client_imports(root: Path, packages=PACKAGES) -> list[str]:
    """Every import of a private name (``_x``, not ``__x__``) of the client from outside it."""
    out = []
    for mod, path in module_files(root, packages).items():
        if mod == CLIENT or mod.startswith(CLIENT + "."):
            continue
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), str(path))):
            if isinstance(node, ast.ImportFrom):
                start = imported_from(mod, path, node)
                if start == CLIENT or start.startswith(CLIENT + "."):
                    out += [f"{mod} imports the client's private {start}.{alias.name}" for alias in node.names
                            if alias.name.startswith("_") and not alias.name.endswith("__")]  # fmt: skip
    return out


#: the modules whose classes are the client's faces: their private methods stay inside the client
CLIENT_FACES = ("base.py", "sync.py", "aio.py", "connection.py")


def private_client_calls(root: Path, packages=PACKAGES) -> list[str]:
    """Every use, outside the client, of a private method (``_x``) that the client's faces define."""
    private: set[str] = set()
    for name in CLIENT_FACES:
        path = root / "disque_py" / "client" / name
        if path.is_file():
            for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), str(path))):
                if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.name.startswith("_") \
                        and not node.name.endswith("__"):  # fmt: skip
                    private.add(node.name)
    out = []
    for mod, path in module_files(root, packages).items():
        if mod == CLIENT or mod.startswith(CLIENT + ".") or not mod.startswith("disque_py"):
            continue
        tree = ast.parse(path.read_text(encoding="utf-8"), str(path))
        # a name the module defines itself (a method, an attribute it sets) is its own
        own = {n.name for n in ast.walk(tree) if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))}
        own |= {n.attr for n in ast.walk(tree) if isinstance(n, ast.Attribute) and isinstance(n.ctx, ast.Store)}
        for node in ast.walk(tree):
            if isinstance(node, ast.Attribute) and node.attr in private and node.attr not in own:
                out.append(f"{mod}:{node.lineno} uses the client's private .{node.attr}")
    return out


def eager_imports(path: Path) -> set[str]:
    """The top-level names a module imports when it is imported: not inside a function, nor under
    ``if TYPE_CHECKING:`` (a class's body, a try or an if run at import, and count)."""
    out: set[str] = set()

    def visit(nodes: list) -> None:
        for node in nodes:
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                continue
            if isinstance(node, ast.If) and ast.unparse(node.test) in ("TYPE_CHECKING", "typing.TYPE_CHECKING"):
                visit(node.orelse)
                continue
            if isinstance(node, ast.Import):
                out.update(alias.name.partition(".")[0] for alias in node.names)
            elif isinstance(node, ast.ImportFrom) and not node.level and node.module:
                out.add(node.module.partition(".")[0])
            for name in ("body", "orelse", "finalbody", "handlers"):
                visit(getattr(node, name, None) or [])

    visit(ast.parse(path.read_text(encoding="utf-8"), str(path)).body)
    return out


def circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components with more than one module (Tarjan), sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph.get(v, ())):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return sorted(found)


def breaches(root: Path, packages=PACKAGES) -> list[str]:
    """Every broken rule, one line each; empty when the house is in order."""
    internal, external = import_graph(root, packages)
    out = ["circle: " + " <-> ".join(c) for c in circles(internal)]
    for mod in sorted(internal):
        if mod == CORE or mod.startswith(CORE + "."):
            for target in sorted(internal[mod]):
                if not (target == CORE or target.startswith(CORE + ".")):
                    out.append(f"the core imports {target}: {mod}")
            for name in sorted(external[mod] & CORE_FORBIDDEN):
                out.append(f"the core imports {name}: {mod}")
        if mod == RECORDS:
            for target in sorted(internal[mod]):
                if not (target == CORE or target.startswith(CORE + ".") or target == "disque_py.persistence"):
                    out.append(f"the AOF records import {target}: {mod}")
            for name in sorted(external[mod] & CORE_FORBIDDEN):
                out.append(f"the AOF records import {name}: {mod}")
        if mod.startswith(SHELL + "."):
            for target in sorted(internal[mod]):
                if target == SHELL + ".app" or (mod in SHELL_PARTS and target in SHELL_PARTS):
                    out.append(f"the shell's {mod} imports {target}")
        if mod.startswith(SPARK + "."):
            # a client of the cluster: no server, no config; pyspark only where the source lives
            for target in sorted(internal[mod]):
                if target.startswith((SHELL, "disque_py.config", "disque_py.cli.launcher")):
                    out.append(f"the Spark source imports {target}: {mod}")
            if "pyspark" in external[mod] and mod != SPARK + ".source":
                out.append(f"pyspark imported outside {SPARK}.source: {mod}")
        if mod == TASKS or mod.startswith(TASKS + "."):
            # a client of the cluster: the client and itself (two leaves of the core at most),
            # nothing of a node
            for target in sorted(internal[mod]):
                if not target.startswith((TASKS, "disque_py.client")) and target not in TASKS_MAY_IMPORT:
                    out.append(f"the tasks layer imports {target}: {mod}")
        if "opentelemetry" in external[mod] and mod != TRACING:
            out.append(f"opentelemetry imported outside {TRACING}: {mod}")
        if mod == TRACING and "opentelemetry" in eager_imports(module_files(root, packages)[mod]):
            out.append(f"opentelemetry imported by {TRACING} when it is imported (not when first asked)")
        if mod in TASKS_MAY_IMPORT and mod.startswith(CORE + "."):
            for target in sorted(internal[mod]):
                if target.partition(".")[0] == "disque_py":
                    out.append(f"the leaf {mod} (the tasks layer's) imports {target}")
        if mod == WEB or mod.startswith(WEB + "."):
            for target in sorted(internal[mod]):
                if target.startswith(SHELL + ".") or target == SHELL:
                    out.append(f"the web app imports {target}: {mod}")
        if mod.startswith(SHELL + ".") and mod != SHELL + ".web":
            for target in sorted(internal[mod]):
                if target == WEB or target.startswith(WEB + "."):
                    out.append(f"the shell's {mod} imports the web app {target}")
        if not (mod == PROGRAMS or mod.startswith(PROGRAMS + ".")):
            for target in sorted(internal[mod]):
                if target == PROGRAMS or target.startswith(PROGRAMS + "."):
                    out.append(f"{mod} imports the programs' {target}")
        if mod.startswith(UTIL + "."):
            for target in sorted(internal[mod]):
                if target.partition(".")[0] == "disque_py" and target != UTIL:
                    out.append(f"the leaf {mod} imports {target}")
        if mod.partition(".")[0] == "cluster_bus":
            for target in sorted(internal[mod]):
                if target.partition(".")[0] == "disque_py":
                    out.append(f"cluster_bus imports {target}: {mod}")
    out += private_client_imports(root, packages)
    out += private_client_calls(root, packages)
    top = sorted(m for m in internal if m.startswith("disque_py.") and m.count(".") == 1
                 and (root / "disque_py" / (m.partition(".")[2] + ".py")).is_file())  # fmt: skip
    if len(top) + 1 > ROOT_MODULES_MAX:  # + disque_py/__init__.py
        out.append(f"the package root holds {len(top) + 1} modules (at most {ROOT_MODULES_MAX}): {', '.join(top)}")
    return out


def test_the_house_has_no_circle_and_the_arrows_point_inward():
    assert breaches(ROOT) == []


def test_the_benchmarks_have_no_circle_and_common_builds_on_nothing_of_theirs():
    internal, _ = import_graph(ROOT / "scripts", ("benchmarks",))
    assert "benchmarks.bench" in internal and "benchmarks.common" in internal["benchmarks.bench_spark"]
    assert circles(internal) == []
    assert internal["benchmarks.common"] <= {"benchmarks.progress"}


def test_the_graph_sees_every_module_and_the_core_edges():
    internal, external = import_graph(ROOT)
    assert "disque_py.core.node" in internal and "cluster_bus.links" in internal
    assert any(t.startswith(CORE + ".") for t in internal["disque_py.core.node"])
    assert "trio" in external["cluster_bus.links"]
    assert SHELL_PARTS <= internal[SHELL + ".app"]  # app composes every part


# --- the rules catch what they are for, in a tree made to break them ---------


def _tree(tmp_path: Path, files: dict[str, str]) -> Path:
    for name, text in files.items():
        path = tmp_path / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    for package in ("disque_py", "disque_py/core", "disque_py/server", "disque_py/persistence", "cluster_bus"):
        init = tmp_path / package / "__init__.py"
        if not init.exists():
            init.parent.mkdir(parents=True, exist_ok=True)
            init.write_text("")
    return tmp_path


def test_a_circle_through_a_type_only_import_is_caught(tmp_path):
    root = _tree(tmp_path, {
        "disque_py/server/app.py": "from .clients import ClientLoop\n",
        "disque_py/server/clients.py": "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from .app import Server\n",
    })  # fmt: skip
    assert breaches(root) == [
        "circle: disque_py.server.app <-> disque_py.server.clients",
        "the shell's disque_py.server.clients imports disque_py.server.app",
    ]


def test_a_circle_of_three_through_a_function_level_import_is_caught(tmp_path):
    root = _tree(tmp_path, {
        "disque_py/core/node.py": "from . import acks\n",
        "disque_py/core/acks.py": "from .replication import x\n",
        "disque_py/core/replication.py": "def f():\n    from .node import Node\n",
    })  # fmt: skip
    assert breaches(root) == [
        "circle: disque_py.core.acks <-> disque_py.core.node <-> disque_py.core.replication"
    ]


def test_the_core_doing_io_or_reaching_for_the_shell_is_caught(tmp_path):
    root = _tree(tmp_path, {
        "disque_py/core/node.py": "import time\nimport os.path\nfrom ..server import app\n",
        "disque_py/server/app.py": "import trio\nfrom ..core.node import Node\n",
    })  # fmt: skip
    assert breaches(root) == [
        "circle: disque_py.core.node <-> disque_py.server.app",
        "the core imports disque_py.server.app: disque_py.core.node",
        "the core imports os: disque_py.core.node",
        "the core imports time: disque_py.core.node",
    ]


def test_the_aof_records_doing_io_or_reaching_for_the_shell_is_caught(tmp_path):
    root = _tree(tmp_path, {
        "disque_py/persistence/records.py": (
            "import os\nimport zlib\nfrom ..core.job import Job\nfrom ..server import dispatch\n"
            "from ..config import Config\n"
        ),
        "disque_py/core/job.py": "",
        "disque_py/server/dispatch.py": "",
        "disque_py/config.py": "",
    })  # fmt: skip
    assert breaches(root) == [
        "the AOF records import disque_py.config: disque_py.persistence.records",
        "the AOF records import disque_py.server.dispatch: disque_py.persistence.records",
        "the AOF records import os: disque_py.persistence.records",
    ]


def test_a_shell_part_reaching_for_another_or_for_app_is_caught(tmp_path):
    root = _tree(tmp_path, {
        "disque_py/server/app.py": "from . import clients, dispatch\n",
        "disque_py/server/clients.py": "from .dispatch import Dispatcher\n",
        "disque_py/server/dispatch.py": "",
        "disque_py/server/timers.py": "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from .app import Server\n",
    })  # fmt: skip
    assert breaches(root) == [
        "the shell's disque_py.server.clients imports disque_py.server.dispatch",
        "the shell's disque_py.server.timers imports disque_py.server.app",
    ]


def test_an_arrow_up_to_the_programs_a_leaf_that_reaches_and_a_crowded_root_are_caught(tmp_path):
    files = {
        "disque_py/cli/__init__.py": "",
        "disque_py/cli/launcher.py": "from ..client import sync\n",
        "disque_py/client/__init__.py": "",
        "disque_py/client/sync.py": "",
        "disque_py/server/app.py": "from ..cli.launcher import start\n",
        "disque_py/util/__init__.py": "",
        "disque_py/util/rss.py": "from ..config import Config\n",
        "disque_py/config.py": "",
    }
    files.update({"disque_py/loose%d.py" % i: "" for i in range(7)})
    root = _tree(tmp_path, files)
    assert breaches(root) == [
        "disque_py.server.app imports the programs' disque_py.cli.launcher",
        "the leaf disque_py.util.rss imports disque_py.config",
        "the package root holds 9 modules (at most 8): disque_py.config, disque_py.loose0, disque_py.loose1, "
        "disque_py.loose2, disque_py.loose3, disque_py.loose4, disque_py.loose5, disque_py.loose6",
    ]
    (root / "disque_py" / "loose6.py").unlink()  # eight, __init__.py included: allowed
    assert not any(line.startswith("the package root") for line in breaches(root))


def test_cluster_bus_importing_disque_py_is_caught(tmp_path):
    root = _tree(tmp_path, {
        "cluster_bus/links.py": "from disque_py.core.effects import Send\n",
        "disque_py/core/effects.py": "",
    })  # fmt: skip
    assert breaches(root) == ["cluster_bus imports disque_py.core.effects: cluster_bus.links"]


def test_the_spark_source_reaching_for_the_server_or_pyspark_elsewhere_is_caught(tmp_path):
    root = _tree(tmp_path, {
        "disque_py/spark/options.py": "import pyspark\n",
        "disque_py/spark/source.py": "import pyspark\nfrom ..server.dispatch import Dispatcher\n",
        "disque_py/server/dispatch.py": "",
    })  # fmt: skip
    assert breaches(root) == [
        "pyspark imported outside disque_py.spark.source: disque_py.spark.options",
        "the Spark source imports disque_py.server.dispatch: disque_py.spark.source",
    ]


def test_the_web_app_reaching_for_the_shell_or_a_shell_part_for_it_is_caught(tmp_path):
    root = _tree(tmp_path, {
        "disque_py/web/__init__.py": "",
        "disque_py/web/api.py": "from ..server.dispatch import Dispatcher\nfrom ..core.ids import valid_job_id\n",
        "disque_py/web/app.py": "from . import api\n",
        "disque_py/core/ids.py": "",
        "disque_py/server/dispatch.py": "from ..web.app import make_app\n",
        "disque_py/server/web.py": "from ..web.app import make_app\n",
    })  # fmt: skip
    assert breaches(root) == [
        "circle: disque_py.server.dispatch <-> disque_py.web.api <-> disque_py.web.app",
        "the shell's disque_py.server.dispatch imports the web app disque_py.web.app",
        "the web app imports disque_py.server.dispatch: disque_py.web.api",
    ]


def test_the_tasks_layer_reaching_for_the_server_is_caught(tmp_path):
    root = _tree(tmp_path, {
        "disque_py/tasks/__init__.py": "",
        "disque_py/tasks/app.py": "from ..client import commands\nfrom ..server.dispatch import Dispatcher\n",
        "disque_py/tasks/runner.py": (
            "from ..core.node import Node\nfrom ..core.ids import dedup_job_id\n"
            "from ..core.constants import default_retry\n"
        ),
        "disque_py/client/__init__.py": "",
        "disque_py/client/commands.py": "",
        "disque_py/server/dispatch.py": "",
        "disque_py/core/node.py": "",
        "disque_py/core/ids.py": "",
        "disque_py/core/constants.py": "from .job import Job\n",
        "disque_py/core/job.py": "",
    })  # fmt: skip
    assert breaches(root) == [
        "the leaf disque_py.core.constants (the tasks layer's) imports disque_py.core.job",
        "the tasks layer imports disque_py.server.dispatch: disque_py.tasks.app",
        "the tasks layer imports disque_py.core.node: disque_py.tasks.runner",
    ]


def test_opentelemetry_imported_elsewhere_or_eagerly_is_caught(tmp_path):
    files = {
        "disque_py/tasks/__init__.py": "",
        "disque_py/tasks/runner.py": "def f():\n    from opentelemetry import trace\n",
        "disque_py/tasks/tracing.py": "try:\n    import opentelemetry.trace\nexcept ImportError:\n    pass\n",
    }
    root = _tree(tmp_path, files)
    assert breaches(root) == [
        "opentelemetry imported outside disque_py.tasks.tracing: disque_py.tasks.runner",
        "opentelemetry imported by disque_py.tasks.tracing when it is imported (not when first asked)",
    ]
    # lazily, and for type checkers only: allowed
    (root / "disque_py/tasks/runner.py").write_text("")
    (root / "disque_py/tasks/tracing.py").write_text(
        "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from opentelemetry import trace\n"
        "class Otel:\n    def __init__(self):\n        from opentelemetry import trace\n"
    )
    assert breaches(root) == []


def test_a_private_method_of_the_client_called_from_outside_is_caught(tmp_path):
    root = _tree(tmp_path, {
        "disque_py/client/__init__.py": "",
        "disque_py/client/sync.py": "class Client:\n    def _call(self, call): ...\n    def run(self, call): ...\n",
        "disque_py/client/worker.py": "def f(client):\n    return client._call(1)\n",
        "disque_py/tasks/__init__.py": "",
        "disque_py/tasks/app.py": "from ..client import sync\ndef f(c):\n    c.run(1)\n    return c._call(1)\n",
    })  # fmt: skip
    assert breaches(root) == ["disque_py.tasks.app:4 uses the client's private ._call"]


def test_a_private_name_of_the_client_imported_from_outside_is_caught(tmp_path):
    root = _tree(tmp_path, {
        "disque_py/client/__init__.py": "",
        "disque_py/client/sync.py": "from .connection import NodeConnection as _Connection\n",
        "disque_py/client/connection.py": "",
        "disque_py/cli/__init__.py": "",
        "disque_py/cli/top.py": "from ..client.sync import _Connection\nfrom ..client.connection import NodeConnection\n",
        "disque_py/spark/links.py": "from disque_py.client.sync import Client, _Connection\n",
    })  # fmt: skip
    assert breaches(root) == [
        "disque_py.cli.top imports the client's private disque_py.client.sync._Connection",
        "disque_py.spark.links imports the client's private disque_py.client.sync._Connection",
    ]
