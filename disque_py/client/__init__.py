"""Client library and worker runtime for disque-py (and any Disque 1.0 node).

* :class:`Client` - synchronous, on redis-py (this package's ``sync`` module);
* :class:`AsyncClient` (also :class:`disque_py.aio.Client`) - the same API for trio (``aio`` module);
  both made from one declaration of each command (``commands``, listed in ``base``) and of the
  settings (:class:`ClientConfig`, ``config``);
* :class:`NodeConnection` - a blocking connection to one given node, without failover
  (``connection`` module), for programs that ask each node on its own;
* :class:`Worker` - fetch / handle / ack with flow control, retries,
  dead letters and graceful shutdown (``worker`` module);
* shared, I/O-free parts: ``commands`` (argv and reply parsing),
  ``cluster`` (node choice, backoff, affinity), ``model`` (value types),
  ``errors`` (typed exceptions).

See docs/CLIENT.md for a guide with examples.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from . import errors as _errors

if TYPE_CHECKING:  # what the lazy names are, for type checkers and IDEs
    from .cluster import Affinity, Backoff
    from .errors import (
        AckedError,
        AuthError,
        BadIdError,
        BatchError,
        CommandError,
        ConnectionLost,
        DisqueError,
        LeavingError,
        NoJobError,
        NoNodeAvailable,
        NoReplicationError,
        PausedError,
        QueueFullError,
        ReplyTimeout,
        ServerError,
        TooLateError,
    )
    from .aio import Client as AsyncClient
    from .config import ClientConfig
    from .connection import NodeConnection
    from .model import DeadLetter, HelloInfo, Job, NodeInfo
    from .sync import Client
    from .worker import DEFAULT_DEAD_LETTER, Worker, WorkerSettings, WorkerStats, current_worker

# Imported on first use (module __getattr__), so that ``disque-py server``,
# which only registers the ``worker`` command, does not load redis-py and
# the client at start-up.
_WHERE = {
    "Client": "sync",
    "AsyncClient": "aio",
    "ClientConfig": "config",
    "NodeConnection": "connection",
    "Worker": "worker",
    "WorkerSettings": "worker",
    "WorkerStats": "worker",
    "current_worker": "worker",
    "DEFAULT_DEAD_LETTER": "worker",
    "Job": "model",
    "HelloInfo": "model",
    "NodeInfo": "model",
    "DeadLetter": "model",
    "Backoff": "cluster",
    "Affinity": "cluster",
    # the exception classes: errors.py is dependency-free, so reading its
    # __all__ costs nothing and keeps one list of them
    **dict.fromkeys((n for n in _errors.__all__ if n != "error_from_reply"), "errors"),
}

#: a name here that its module spells otherwise
_RENAMED = {"AsyncClient": "Client"}

__all__ = list(_WHERE)


def __getattr__(name: str) -> Any:
    module = _WHERE.get(name)
    if module is None:
        raise AttributeError("module 'disque_py.client' has no attribute %r" % name)
    value = getattr(importlib.import_module("." + module, __name__), _RENAMED.get(name, name))
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_WHERE))
