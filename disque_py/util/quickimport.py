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


def import_trio() -> ModuleType:
    """``import trio``, with ``find_library("pthread")`` answered from the libraries already mapped
    (see the module docstring)."""
    if "trio" in sys.modules or not sys.platform.startswith("linux"):
        import trio

        return trio
    import ctypes.util

    original: Callable[[str], str | None] = ctypes.util.find_library

    def find_library(name: str) -> str | None:
        if name == "pthread":
            path = loaded_library()
            if path is not None:
                return path
        return original(name)

    ctypes.util.find_library = find_library
    try:
        import trio
    finally:
        ctypes.util.find_library = original
    return trio
