"""Which build runs: the modules mypyc compiles, or pure Python (the reference).

The check is the same for every package with compiled modules (``cluster_bus`` here,
``disque_py`` in ``disque_py/_build.py``, which reuses these functions: ``cluster_bus``
never imports ``disque_py``). A compiled module is an extension file beside its source
(``codec.cpython-311-x86_64-linux-gnu.so`` beside ``codec.py``), which Python's import
system prefers to the source. The build writes ``MANIFEST`` in the package: one line per
module with the size, mtime and SHA-256 of the source it compiled. ``check_modules`` says
whether a package's compiled modules match their sources:

* no manifest (never built, or built without a compiler): not built;
* a module's source differs from the one compiled, or its extension file is missing
  (edited, checked out, half-built): stale, naming the file. A compiled module never
  shadows edited source;
* otherwise current.

``decide`` turns that into the package's build, once, when the package is imported and
before any of its compiled modules can be: ``DISQUE_PY_PURE=1`` in the environment, a
missing or a stale build mean pure Python (a stale one says so in one line on stderr).
Pure Python with extension files present means ``SourceFirst``, a finder placed first on
``sys.meta_path`` that loads the named modules from their ``.py``.

``cluster_bus``'s own compiled modules (``COMPILED_MODULES``) are one mypyc group of their
own, so its decision (``select()``, run by ``cluster_bus/__init__.py``) needs nothing of
``disque_py``: ``import cluster_bus.codec`` alone never loads a stale codec. ``disque_py``
makes one decision for both packages (``run_pure`` below). Nothing here imports the rest of
the package; the common case costs a few ``stat`` calls.
"""

from __future__ import annotations

import os
import sys
from importlib.machinery import EXTENSION_SUFFIXES, ModuleSpec
from typing import Iterable, Sequence

MANIFEST = "_compiled.txt"
PURE_ENV = "DISQUE_PY_PURE"

# cluster_bus's modules that mypyc compiles (setup.py; group "cluster_bus").
COMPILED_MODULES: tuple[str, ...] = ("cluster_bus.codec",)

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))  # holds the packages

# (mode, detail): ("compiled", "N modules") or ("pure", reason). Set by select().
_state: tuple[str, str] = ("pure", "not selected")


def source_path(module: str, root: str = ROOT) -> str:
    return os.path.join(root, *module.split(".")) + ".py"


def extension_path(module: str, root: str = ROOT) -> str | None:
    """The compiled extension file of ``module`` beside its source, or None."""
    base = os.path.join(root, *module.split("."))
    for suffix in EXTENSION_SUFFIXES:
        if os.path.exists(base + suffix):
            return base + suffix
    return None


def file_digest(path: str) -> str:
    import hashlib

    with open(path, "rb") as f:
        return hashlib.sha256(f.read()).hexdigest()


def manifest_line(module: str, root: str = ROOT) -> str:
    st = os.stat(source_path(module, root))
    return "%s %d %d %s" % (module, st.st_size, st.st_mtime_ns, file_digest(source_path(module, root)))


def write_package_manifest(directory: str, package: str, modules: Sequence[str], source_root: str = ROOT) -> str:
    """Called by setup.py once a package's extensions are built: record the sources compiled."""
    path = os.path.join(directory, package, MANIFEST)
    lines = [manifest_line(m, source_root) for m in modules]
    with open(path + ".tmp", "w") as f:
        f.write("\n".join(lines) + "\n")
    os.replace(path + ".tmp", path)
    return path


def check_modules(package: str, modules: Sequence[str], root: str = ROOT) -> tuple[bool, str]:
    """(True, "N modules") when a package's compiled build matches every source; else (False, reason)."""
    try:
        with open(os.path.join(root, package, MANIFEST)) as f:
            recorded = {}
            for line in f:
                parts = line.split()
                if len(parts) == 4:
                    recorded[parts[0]] = parts[1:]
    except OSError:
        return False, "not built"
    for module in modules:
        src = source_path(module, root)
        if module not in recorded:
            return False, "stale: %s is not in the build" % os.path.relpath(src, root)
        if extension_path(module, root) is None:
            return False, "incomplete build: %s has no compiled module" % os.path.relpath(src, root)
        size, mtime, digest = recorded[module]
        try:
            st = os.stat(src)
        except OSError:
            return False, "stale: %s is missing" % os.path.relpath(src, root)
        if str(st.st_size) == size and str(st.st_mtime_ns) == mtime:
            continue  # the common case: untouched since the build
        if file_digest(src) != digest:
            return False, "stale: %s changed since the build" % os.path.relpath(src, root)
    return True, "%d modules" % len(modules)


def pure_requested() -> bool:
    return os.environ.get(PURE_ENV, "") not in ("", "0")


def say_not_used(detail: str) -> None:
    """One line on stderr when a build exists but is not used (never for "not built")."""
    if detail != "not built":
        sys.stderr.write(
            "disque-py: the compiled build is not used (%s): running pure Python; "
            "scripts/build rebuilds it\n" % detail
        )


class SourceFirst:
    """A meta path finder: the modules named load from their ``.py`` (pure Python).

    One per process, first on ``sys.meta_path``; each package's pure decision adds its
    modules to ``names``."""

    def __init__(self) -> None:
        self.names: set[str] = set()

    def find_spec(self, fullname: str, path: Sequence[str] | None, target: object = None) -> ModuleSpec | None:
        if fullname not in self.names:
            return None
        from importlib.util import spec_from_file_location  # only when pure Python is chosen

        leaf = fullname.rpartition(".")[2] + ".py"
        for entry in path or sys.path:
            candidate = os.path.join(entry, leaf)
            if os.path.isfile(candidate):
                return spec_from_file_location(fullname, candidate)
        return None


def run_pure(modules: Iterable[str]) -> None:
    """From now on, ``modules`` load from their source (those already imported stay as
    they are: ``running_compiled`` tells)."""
    finder = next((f for f in sys.meta_path if isinstance(f, SourceFirst)), None)
    if finder is None:
        finder = SourceFirst()
        sys.meta_path.insert(0, finder)
    finder.names.update(modules)


def decide(package: str, modules: Sequence[str], root: str = ROOT) -> tuple[str, str]:
    """A package's build: ("compiled", "N modules") or ("pure", why), pure made so."""
    if pure_requested():
        state = ("pure", "%s set" % PURE_ENV)  # no "=": INFO parsers split values on it
    else:
        ok, detail = check_modules(package, modules, root)
        state = ("compiled", detail) if ok else ("pure", detail)
        if not ok:
            say_not_used(detail)
    if state[0] == "pure":
        run_pure(modules)
    return state


def running_compiled(modules: Iterable[str]) -> list[str]:
    """The modules named imported as compiled extensions, now."""
    out = []
    for name in modules:
        mod = sys.modules.get(name)
        if mod is not None and not (getattr(mod, "__file__", None) or "").endswith(".py"):
            out.append(name)
    return out


def check(root: str = ROOT) -> tuple[bool, str]:
    """cluster_bus's compiled build against its sources."""
    return check_modules("cluster_bus", COMPILED_MODULES, root)


def select() -> tuple[str, str]:
    """cluster_bus's build, decided on its own (``cluster_bus/__init__.py``)."""
    global _state
    _state = decide("cluster_bus", COMPILED_MODULES)
    return _state


def state() -> tuple[str, str]:
    return _state


def go_pure(reason: str) -> None:
    """A caller's decision for the whole process (``disque_py``: all compiled or none)."""
    global _state
    if _state[0] != "pure":
        _state = ("pure", reason)
        run_pure(COMPILED_MODULES)
