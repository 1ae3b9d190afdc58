"""Which build runs: the modules mypyc compiles, or pure Python (the reference).

``COMPILED_MODULES`` is the one list of the modules setup.py hands to mypyc. A compiled
module is an extension file beside its source (``job.cpython-311-x86_64-linux-gnu.so``
beside ``job.py``), which Python's import system prefers to the source. The build writes
``MANIFEST`` beside this file: one line per module with the size, mtime and SHA-256 of the
source it compiled. ``select()`` runs once, when ``disque_py`` is imported, before any of
these modules, and decides:

* ``DISQUE_PY_PURE=1`` in the environment: pure Python;
* no manifest (never built, or built without a compiler): pure Python;
* a module's source differs from the one compiled, or its extension file is missing
  (edited, checked out, half-built): pure Python, and one line on stderr saying which file
  is newer than the build. A compiled module never shadows edited source;
* otherwise the compiled modules.

Pure Python with extension files present means a finder placed first on ``sys.meta_path``
that loads these modules from their ``.py``. All of them or none: compiled modules of one
build call each other directly, so a mix would hold two ``Job`` classes.

``describe()`` is INFO server's ``build`` field. Nothing here imports the rest of
disque_py; the common case costs a few ``stat`` calls.
"""

from __future__ import annotations

import os
import sys
from importlib.machinery import EXTENSION_SUFFIXES, ModuleSpec
from typing import Sequence

# Hot, annotated, leaf-most modules first. A module joins when mypy checks it clean and the
# whole suite passes with it compiled (docs/ARCHITECTURE.md, "The compiled build").
COMPILED_MODULES: tuple[str, ...] = (
    "disque_py.core.ids",
    "disque_py.core.job",
    "disque_py.core.store",
    "disque_py.core.queues",
    "disque_py.core.wire",
    "disque_py.core.effects",
    "disque_py.core.commandspec",
    "disque_py.core.context",
    "disque_py.core.memory",
    "disque_py.core.dedup",
    "disque_py.core.commands",
    "disque_py.core.requeue",
    "disque_py.core.acks",
    "disque_py.core.replication",
    "disque_py.core.delivery",
    "disque_py.core.lifecycle",
    "disque_py.core.federation",
    "disque_py.core.blocking",
    "disque_py.core.node",
    "disque_py.persistence.journal",
    "disque_py.persistence.loader",
    "disque_py.persistence.records",
    "disque_py.protocol.resp",
    "disque_py.server.cmdstats",
    "disque_py.server.connection",
    "disque_py.server.stage",
)

MANIFEST = "_compiled.txt"
PURE_ENV = "DISQUE_PY_PURE"

_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))  # holds disque_py/

# (mode, detail): ("compiled", "N modules") or ("pure", reason). Set by select().
_state: tuple[str, str] = ("pure", "not selected")


def source_path(module: str, root: str = _ROOT) -> str:
    return os.path.join(root, *module.split(".")) + ".py"


def extension_path(module: str, root: str = _ROOT) -> str | None:
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


def manifest_line(module: str, root: str = _ROOT) -> str:
    st = os.stat(source_path(module, root))
    return "%s %d %d %s" % (module, st.st_size, st.st_mtime_ns, file_digest(source_path(module, root)))


def write_manifest(directory: str, source_root: str = _ROOT) -> str:
    """Called by setup.py once the extensions are built: record the sources compiled."""
    path = os.path.join(directory, "disque_py", MANIFEST)
    lines = [manifest_line(m, source_root) for m in COMPILED_MODULES]
    with open(path + ".tmp", "w") as f:
        f.write("\n".join(lines) + "\n")
    os.replace(path + ".tmp", path)
    return path


def check(root: str = _ROOT) -> tuple[bool, str]:
    """(True, "N modules") when the compiled build matches every source; else (False, reason)."""
    try:
        with open(os.path.join(root, "disque_py", MANIFEST)) as f:
            recorded = {}
            for line in f:
                parts = line.split()
                if len(parts) == 4:
                    recorded[parts[0]] = parts[1:]
    except OSError:
        return False, "not built"
    for module in COMPILED_MODULES:
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
    return True, "%d modules" % len(COMPILED_MODULES)


class _SourceFirst:
    """A meta path finder: the compiled modules load from their ``.py`` (pure Python)."""

    names = frozenset(COMPILED_MODULES)

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


def select() -> tuple[str, str]:
    global _state
    if os.environ.get(PURE_ENV, "") not in ("", "0"):
        _state = ("pure", "%s set" % PURE_ENV)  # no "=": INFO parsers split values on it
    else:
        ok, detail = check()
        _state = ("compiled", detail) if ok else ("pure", detail)
        if not ok and detail != "not built":
            sys.stderr.write(
                "disque-py: the compiled build is not used (%s): running pure Python; "
                "scripts/build rebuilds it\n" % detail
            )
    if _state[0] == "pure" and not any(isinstance(f, _SourceFirst) for f in sys.meta_path):
        sys.meta_path.insert(0, _SourceFirst())
    return _state


def running_compiled() -> list[str]:
    """The modules of COMPILED_MODULES imported as compiled extensions, now."""
    out = []
    for name in COMPILED_MODULES:
        mod = sys.modules.get(name)
        if mod is not None and not (getattr(mod, "__file__", None) or "").endswith(".py"):
            out.append(name)
    return out


def describe() -> str:
    """INFO server's ``build``: ``compiled (N modules)`` or ``pure (reason)``."""
    mode, detail = _state
    if mode == "compiled":
        loaded = running_compiled()
        imported = [m for m in COMPILED_MODULES if m in sys.modules]
        if len(loaded) != len(imported):  # something imported them before select()
            return "mixed (%d of %d imported modules compiled)" % (len(loaded), len(imported))
    return "%s (%s)" % (mode, detail)
