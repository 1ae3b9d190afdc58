"""Connection settings shared by the synchronous and the trio client (and copied by the worker)."""

from __future__ import annotations

import random
from typing import Any

from . import commands as cmd
from .cluster import Address, Affinity, Backoff, parse_seeds

__all__ = ["ClientConfig"]


class ClientConfig:
    """Seeds, password, timeouts and cluster behaviour; see :class:`~.sync.Client`."""

    def __init__(
        self,
        seeds: Any = "127.0.0.1:7711",
        *,
        password: str | None = None,
        socket_timeout: float | None = 5.0,
        connect_timeout: float = 2.0,
        failover_timeout: float = 10.0,
        backoff: Backoff | None = None,
        refresh_interval: float | None = 30.0,
        affinity: bool | Affinity = False,
        retry_writes: bool = True,
        max_retries: int = 5,
        rng: random.Random | None = None,
    ) -> None:
        self.seeds: list[Address] = parse_seeds(seeds)
        self.password = password
        self.socket_timeout = socket_timeout
        self.connect_timeout = connect_timeout
        self.failover_timeout = failover_timeout
        self.backoff = backoff or Backoff()
        self.refresh_interval = refresh_interval
        self.affinity: Affinity | None = (Affinity() if affinity is True else affinity) or None
        self.retry_writes = retry_writes
        self.max_retries = max_retries
        self.rng = rng or random.Random()

    def kwargs(self) -> dict[str, Any]:
        """Keyword arguments that rebuild an equivalent client (fresh affinity and rng)."""
        return {
            "password": self.password,
            "socket_timeout": self.socket_timeout,
            "connect_timeout": self.connect_timeout,
            "failover_timeout": self.failover_timeout,
            "backoff": self.backoff,
            "refresh_interval": self.refresh_interval,
            "affinity": self.affinity is not None,
            "retry_writes": self.retry_writes,
            "max_retries": self.max_retries,
        }

    def read_timeout(self, call: cmd.Call) -> float | None:
        if call.blocks is None or self.socket_timeout is None:
            return None
        return self.socket_timeout + call.blocks
