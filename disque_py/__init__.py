"""disque-py: a distributed, in-memory job broker compatible with Disque 1.0-rc1.

The client library is importable from here (lazily, so running a node does
not load it): ``disque_py.Client`` (blocking), ``disque_py.AsyncClient`` (trio; also
``disque_py.aio.Client``), ``disque_py.Worker``, ``disque_py.ClientConfig``, ``disque_py.Job``,
the exceptions (``disque_py.DisqueError``...). See docs/CLIENT.md.

The package's root holds only what a user imports; the programs an operator runs (``disque-py
server|cli|top|dead|worker|workers|cluster|gen-certs|check-aof``) live in ``disque_py.cli``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from ._build import select as _select_build

if TYPE_CHECKING:  # what the lazy names are, for type checkers and IDEs
    from .client import AckedError, Affinity, AsyncClient, AuthError, Backoff, BadIdError, BatchError, Client
    from .client import ClientConfig, CommandError, ConnectionLost, DeadLetter, DisqueError, HelloInfo, Job
    from .client import LeavingError, NodeInfo, NoJobError, NoNodeAvailable, NoReplicationError, PausedError
    from .client import QueueFullError, ReplyTimeout, ServerError, TooLateError, Worker, WorkerStats
    from .client import current_worker

# The compiled build or pure Python, decided before any compiled module can be imported
# (disque_py/_build.py): a stale build is never used.
_select_build()

__version__ = "0.2.0"
DISQUE_COMPAT_VERSION = "1.0-rc1"

_CLIENT_NAMES = (
    "Client", "AsyncClient", "ClientConfig", "Worker", "WorkerSettings", "WorkerStats", "current_worker", "Job", "HelloInfo", "NodeInfo", "DeadLetter",
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
