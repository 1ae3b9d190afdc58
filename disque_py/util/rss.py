"""A process's resident set size (RSS): the one reader of it in disque-py.

:func:`rss_bytes` reads ``/proc/<pid>/statm`` (its second field, resident pages, times the
page size): one small read. Where there is no ``/proc`` (macOS, the BSDs), the calling
process's own value falls back to its peak RSS (``getrusage``'s ``ru_maxrss``), the closest
figure such a system gives without a helper library; another process's is then unknown (0).

Read by the node only when asked (``server/admin.py``: INFO memory's ``used_memory_rss``; an
idle node reads it never) and by the benchmarks (a node process's RSS after a load).
A leaf: imports nothing of disque_py.
"""

from __future__ import annotations

import os
import sys

__all__ = ["rss_bytes"]

_PAGE = os.sysconf("SC_PAGE_SIZE") if hasattr(os, "sysconf") else 4096


def rss_bytes(pid: int | None = None) -> int:
    """The resident set size of process ``pid`` (None: this process) in bytes; 0 if unknown."""
    try:
        with open("/proc/self/statm" if pid is None else "/proc/%d/statm" % pid, "rb") as f:
            return int(f.read().split()[1]) * _PAGE
    except (OSError, ValueError, IndexError):
        pass
    if pid is not None and pid != os.getpid():
        return 0
    try:
        import resource
    except ImportError:  # not a Unix
        return 0
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return peak if sys.platform == "darwin" else peak * 1024  # bytes on macOS, KiB elsewhere
