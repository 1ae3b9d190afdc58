"""disque-py: a distributed, in-memory job broker compatible with Disque 1.0-rc1.

The client library is importable from here (lazily, so running a node does
not load it): ``disque_py.Client``, ``disque_py.Worker``, ``disque_py.Job``,
the exceptions (``disque_py.DisqueError``...). The trio client is
``disque_py.aio.Client``. See docs/CLIENT.md.
"""

from __future__ import annotations

from typing import Any

from ._build import select as _select_build

# The compiled build or pure Python, decided before any compiled module can be imported
# (disque_py/_build.py): a stale build is never used.
_select_build()

__version__ = "0.1.0"
DISQUE_COMPAT_VERSION = "1.0-rc1"

_CLIENT_NAMES = (
    "Client", "Worker", "WorkerStats", "current_worker", "Job", "HelloInfo", "NodeInfo", "DeadLetter",
    "Backoff", "Affinity", "DisqueError", "ServerError", "CommandError", "NoReplicationError",
    "QueueFullError", "PausedError", "LeavingError", "NoJobError", "BadIdError", "TooLateError",
    "AckedError", "AuthError", "ConnectionLost", "ReplyTimeout", "NoNodeAvailable", "BatchError",
)  # fmt: skip

__all__ = ["__version__", "DISQUE_COMPAT_VERSION", *_CLIENT_NAMES]


def __getattr__(name: str) -> Any:
    if name in _CLIENT_NAMES:
        from . import client

        return getattr(client, name)
    raise AttributeError("module 'disque_py' has no attribute %r" % name)
