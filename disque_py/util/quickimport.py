"""``import trio`` without the ``ldconfig`` it spawns (:func:`import_trio`), for a node's start.

trio names its worker threads through ``pthread_setname_np``, and finds the library that holds
it when ``trio._core._thread_cache`` is imported: ``ctypes.util.find_library("pthread")``,
which on Linux runs ``/sbin/ldconfig -p`` in a subprocess and parses its output. That fork and
exec is part of every ``import trio``: 3-10 ms of a node's start on a quiet machine, 50-100 ms
on a busy one (measured: ``find_library("pthread")`` alone, 54-101 ms at a load average of 17).

The library is in the process already (the interpreter links it): the path a loaded
``libpthread.so*`` (or, where the pthread functions live in libc, ``libc.so*``) is mapped from,
read from ``/proc/self/maps``, is what ``find_library`` would find. ``import_trio`` answers
that one question so while trio is imported, and puts ``find_library`` back; anywhere
``/proc/self/maps`` has no such line, ``find_library`` answers as it always does.

When nothing has imported ``ctypes.util`` yet (a node's start), trio is given a stand-in for
it (``_StandIn``) rather than the standard module with that one function changed: the standard
``ctypes.util`` imports ``shutil``, ``bz2``, ``lzma`` and ``tempfile`` (about 2 ms), which
serving does not use. trio reads ``ctypes.util`` only while it is imported; afterwards the name
is free again, and the first ``import ctypes.util`` loads the standard module.
"""

from __future__ import annotations

import sys
from types import ModuleType
from typing import Callable

__all__ = ["import_trio", "loaded_library"]


def loaded_library(prefixes: tuple[str, ...] = ("libpthread.so", "libc.so"), maps: str = "/proc/self/maps") -> str | None:
    """The path of the first library mapped into this process whose file name starts with one of
    ``prefixes`` (in that order of preference), or None."""
    found: dict[str, str] = {}
    try:
        with open(maps, encoding="utf-8", errors="replace") as f:
            for line in f:
                path = line.rstrip("\n").rpartition(" ")[2]
                if not path.startswith("/"):
                    continue
                name = path.rpartition("/")[2]
                for prefix in prefixes:
                    if name.startswith(prefix) and prefix not in found:
                        found[prefix] = path
    except OSError:
        return None
    for prefix in prefixes:
        if prefix in found:
            return found[prefix]
    return None


def _pthread_or(real: Callable[[str], str | None]) -> Callable[[str], str | None]:
    """``find_library`` answering ``"pthread"`` from the libraries mapped, anything else as ``real``."""

    def find_library(name: str) -> str | None:
        if name == "pthread":
            path = loaded_library()
            if path is not None:
                return path
        return real(name)

    return find_library


def _real_util() -> ModuleType:
    """The standard ``ctypes.util``, imported now if it is not (the stand-in taken out first)."""
    import ctypes

    if not isinstance(sys.modules.get("ctypes.util"), _StandIn):
        import ctypes.util

        return ctypes.util
    del sys.modules["ctypes.util"]
    if isinstance(getattr(ctypes, "util", None), _StandIn):
        del ctypes.util
    import ctypes.util

    return ctypes.util


class _StandIn(ModuleType):
    """``ctypes.util`` while trio is imported, when nothing has imported it yet: the standard
    module imports ``shutil`` (and through it ``bz2``, ``lzma``, ``fnmatch``) and ``tempfile``,
    which nothing else of a node's start needs. It answers ``find_library("pthread")`` from
    ``/proc/self/maps``; anything else it is asked loads the standard module and asks it."""

    def __getattr__(self, name: str) -> object:
        return getattr(_real_util(), name)


def import_trio() -> ModuleType:
    """``import trio``, with ``find_library("pthread")`` answered from the libraries already mapped
    (see the module docstring)."""
    if "trio" in sys.modules or not sys.platform.startswith("linux"):
        import trio

        return trio
    import ctypes

    real = sys.modules.get("ctypes.util")
    if real is None:
        stand_in = _StandIn("ctypes.util")
        stand_in.find_library = _pthread_or(lambda name: _real_util().find_library(name))  # type: ignore[attr-defined]
        sys.modules["ctypes.util"] = stand_in
        ctypes.util = stand_in  # type: ignore[attr-defined]  # what `import ctypes.util` then reads
        try:
            import trio
        finally:
            if sys.modules.get("ctypes.util") is stand_in:
                del sys.modules["ctypes.util"]
            if getattr(ctypes, "util", None) is stand_in:
                del ctypes.util
        return trio
    import ctypes.util

    original: Callable[[str], str | None] = ctypes.util.find_library
    ctypes.util.find_library = _pthread_or(original)
    try:
        import trio
    finally:
        ctypes.util.find_library = original
    return trio
