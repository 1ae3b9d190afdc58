"""Which build runs: the modules mypyc compiles, or pure Python (the reference).

``COMPILED_MODULES`` is the list of disque_py's modules setup.py hands to mypyc (group
"disque_py"); cluster_bus's (the bus codec) are in ``cluster_bus/_build.py`` (group
"cluster_bus"), whose check this module uses. A compiled module is an extension file beside
its source (``job.cpython-311-x86_64-linux-gnu.so`` beside ``job.py``), which Python's
import system prefers to the source. The build writes ``MANIFEST`` in each package: one
line per module with the size, mtime and SHA-256 of the source it compiled. ``select()``
runs once, when ``disque_py`` is imported, before any of these modules (cluster_bus, which
disque_py imports first, has decided for itself by then), and decides for both packages:

* ``DISQUE_PY_PURE=1`` in the environment: pure Python;
* no manifest (never built, or built without a compiler): pure Python;
* a module's source differs from the one compiled, or its extension file is missing
  (edited, checked out, half-built): pure Python, and one line on stderr saying which file
  is newer than the build. A compiled module never shadows edited source;
* otherwise the compiled modules.

Pure Python with extension files present means a finder placed first on ``sys.meta_path``
that loads these modules from their ``.py``. All of them or none: compiled modules of one
group call each other directly, so a mix would hold two ``Job`` classes; and a node runs
the bus codec compiled only when it runs its own modules compiled, so that INFO server's
``build`` is one word for the whole node (a stale codec makes the node pure, a stale
disque_py module makes the codec pure too, unless something imported it before).

``describe()`` is INFO server's ``build`` field. Nothing here imports the rest of
disque_py; the common case costs a few ``stat`` calls.
"""

from __future__ import annotations

import sys

# The check itself is cluster_bus's (cluster_bus/_build.py: disque_py may import cluster_bus,
# not the reverse); importing it runs cluster_bus's own decision first.
from cluster_bus import _build as _bus
from cluster_bus._build import MANIFEST, PURE_ENV, extension_path, file_digest, manifest_line, source_path

__all__ = [
    "COMPILED_MODULES", "MANIFEST", "PURE_ENV", "all_modules", "check", "describe", "extension_path",
    "file_digest", "manifest_line", "running_compiled", "select", "source_path", "write_manifest",
]  # fmt: skip

# Hot, annotated, leaf-most modules first. A module joins when mypy checks it clean and the
# whole suite passes with it compiled (docs/ARCHITECTURE.md, "The compiled build").
COMPILED_MODULES: tuple[str, ...] = (
    "disque_py.core.statics",
    "disque_py.core.ids",
    "disque_py.core.job",
    "disque_py.core.store",
    "disque_py.core.groups",
    "disque_py.core.queues",
    "disque_py.core.wire",
    "disque_py.core.messages",
    "disque_py.core.effects",
    "disque_py.core.commandspec",
    "disque_py.core.context",
    "disque_py.core.commands",
    "disque_py.core.lifecycle",
    "disque_py.core.leases",
    "disque_py.core.requeue",
    "disque_py.core.replication",
    "disque_py.core.acks",
    "disque_py.core.delivery",
    "disque_py.core.federation",
    "disque_py.core.blocking",
    "disque_py.core.dedup",
    "disque_py.core.memory",
    "disque_py.core.node",
    "disque_py.persistence.journal",
    "disque_py.persistence.loader",
    "disque_py.persistence.records",
    "disque_py.protocol.resp",
    "disque_py.server.cmdstats",
    "disque_py.server.connection",
    "disque_py.server.stage",
)


# (mode, detail): ("compiled", "N modules") or ("pure", reason). Set by select().
_state: tuple[str, str] = ("pure", "not selected")


def all_modules() -> tuple[str, ...]:
    """Every compiled module a node runs: cluster_bus's and disque_py's."""
    return _bus.COMPILED_MODULES + COMPILED_MODULES


def write_manifest(directory: str, source_root: str = _bus.ROOT) -> str:
    """Called by setup.py once the extensions are built: record the sources compiled."""
    return _bus.write_package_manifest(directory, "disque_py", COMPILED_MODULES, source_root)


def check(root: str = _bus.ROOT) -> tuple[bool, str]:
    """(True, "N modules") when both packages' compiled builds match every source; else (False, reason)."""
    ok, detail = _bus.check(root)
    if ok:
        ok, detail = _bus.check_modules("disque_py", COMPILED_MODULES, root)
    return (True, "%d modules" % len(all_modules())) if ok else (False, detail)


def select() -> tuple[str, str]:
    global _state
    bus = _bus.state()  # decided when cluster_bus was imported (above), stderr said why if stale
    own = _bus.decide("disque_py", COMPILED_MODULES)
    if own[0] == "compiled" and bus[0] == "compiled":
        _state = ("compiled", "%d modules" % len(all_modules()))
    elif own[0] == "pure":
        _state = own
    else:  # disque_py's build is current, cluster_bus's is not (stderr said why, unless missing)
        _state = ("pure", "incomplete build: cluster_bus is not built" if bus[1] == "not built" else bus[1])
        if bus[1] == "not built":
            _bus.say_not_used(_state[1])
        _bus.run_pure(COMPILED_MODULES)
    if _state[0] == "pure":
        _bus.go_pure(_state[1])  # the codec too, unless something imported it already
    return _state


def running_compiled() -> list[str]:
    """The modules of ``all_modules()`` imported as compiled extensions, now."""
    return _bus.running_compiled(all_modules())


def describe() -> str:
    """INFO server's ``build``: ``compiled (N modules)`` or ``pure (reason)``."""
    mode, detail = _state
    loaded = running_compiled()
    imported = [m for m in all_modules() if m in sys.modules]
    if len(loaded) != (len(imported) if mode == "compiled" else 0):  # imported before select()
        return "mixed (%d of %d imported modules compiled)" % (len(loaded), len(imported))
    return "%s (%s)" % (mode, detail)
