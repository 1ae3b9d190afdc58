"""The trio client: ``from disque_py.aio import Client`` (same API as ``disque_py.Client``, awaited).

The implementation lives in :mod:`disque_py.client.aio`; the worker runtime
(:class:`disque_py.Worker`) is built on it.
"""

from __future__ import annotations

from .client.aio import Client
from .client.worker import Worker

__all__ = ["Client", "Worker"]
