"""Connections of the Spark source to named nodes: pipelined commands to one node at a time.

The source must talk to a *given* node (take jobs from it, acknowledge and
show them where they are, scan it), which the cluster-aware
:class:`disque_py.client.Client` deliberately hides, so this is a small
pool of raw connections (the client's :class:`~disque_py.client.connection.NodeConnection`:
redis-py with hiredis, RESP2, our error types; TLS and a named user as the client's)
keyed by address, plus the cluster's node
list from HELLO. No pyspark here.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Iterable, Sequence
from typing import Any

from ..client import commands as cmd
from ..client.cluster import Address
from ..client.config import ClientConfig
from ..client.connection import NodeConnection
from ..client.errors import ConnectionLost, DisqueError

__all__ = ["Links", "address_text", "parse_address_text", "Unreachable"]


DOWN_FOR = 5.0


class Unreachable(ConnectionError):
    """No node of the list answered; the message names every node tried and why."""


def address_text(address: Address) -> str:
    host, port = address
    return ("[%s]:%d" if ":" in host else "%s:%d") % (host, port)


def parse_address_text(text: str) -> Address:
    if text.startswith("["):
        host, _, port = text[1:].partition("]:")
    else:
        host, _, port = text.rpartition(":")
    return (host, int(port))


class Links:
    """Connections to the nodes of one cluster, opened on first use, dropped when they fail."""

    def __init__(
        self,
        seeds: Sequence[Address],
        *,
        password: str | None = None,
        username: str | None = None,
        connect_timeout: float = 2.0,
        socket_timeout: float | None = 30.0,
        tls: bool = False,
        ssl_ca_certs: str | None = None,
        ssl_certfile: str | None = None,
        ssl_keyfile: str | None = None,
        client_name: str | None = None,
    ) -> None:
        self.seeds = list(seeds)
        self.config = ClientConfig(
            list(seeds) or "127.0.0.1:7711", password=password, username=username, socket_timeout=socket_timeout,
            connect_timeout=connect_timeout, tls=tls, ssl_ca_certs=ssl_ca_certs, ssl_certfile=ssl_certfile,
            ssl_keyfile=ssl_keyfile, client_name=client_name,
        )  # fmt: skip
        self._conns: dict[Address, NodeConnection] = {}
        self._down: dict[Address, float] = {}  # address -> monotonic time to try it again
        self._nodes: list[Address] = []
        self._ids: dict[Address, str] = {}
        self._reached: dict[str, Address] = {}  # TLS: node id -> the address (a seed) that reached it
        self._nodes_at = 0.0

    # ---------------------------------------------------------------- connections
    def conn(self, address: Address) -> NodeConnection:
        """The connection to ``address``, opened if needed. A node that refused a connection is
        not tried again for ``DOWN_FOR`` seconds (ConnectionLost at once), so a dead node in the
        HELLO list costs one connect timeout, not one per call."""
        conn = self._conns.get(address)
        if conn is None:
            until = self._down.get(address)
            if until is not None and time.monotonic() < until:
                raise ConnectionLost("%s is marked down (it refused a connection)" % address_text(address), address)
            try:
                conn = NodeConnection(address, self.config)
            except ConnectionLost:
                self._down[address] = time.monotonic() + DOWN_FOR
                raise
            self._down.pop(address, None)
            self._conns[address] = conn
        return conn

    def drop(self, address: Address) -> None:
        conn = self._conns.pop(address, None)
        if conn is not None:
            conn.close()

    def close(self) -> None:
        for address in list(self._conns):
            self.drop(address)

    def call(self, address: Address, *argv: Any, timeout: float | None = None) -> Any:
        """One command; errors raise (ConnectionLost drops the connection)."""
        try:
            return self.conn(address).request(argv, timeout if timeout is not None else self.config.socket_timeout)
        except ConnectionLost:
            self._conns.pop(address, None)
            raise

    def call_many(self, address: Address, argvs: Sequence[Sequence[Any]], timeout: float | None = None) -> list[Any]:
        """Pipelined; replies in order, error replies as exception values."""
        if not argvs:
            return []
        try:
            return self.conn(address).request_many(argvs, timeout if timeout is not None else self.config.socket_timeout)
        except ConnectionLost:
            self._conns.pop(address, None)
            raise

    def call_all(self, work: dict[Address, Sequence[Sequence[Any]]], timeout: float | None = None) -> dict[Address, Any]:
        """Pipelines to several nodes at once: every node's commands are sent before any reply is
        read, so the nodes work in parallel. node -> its replies (errors as values), or the
        DisqueError that broke its connection."""
        timeout = timeout if timeout is not None else self.config.socket_timeout
        out: dict[Address, Any] = {}
        sent: list[Address] = []
        for address, argvs in work.items():
            if not argvs:
                out[address] = []
                continue
            try:
                self.conn(address).send_many(argvs)
            except DisqueError as exc:
                self._conns.pop(address, None)
                out[address] = exc
                continue
            sent.append(address)
        for address in sent:
            try:
                out[address] = self._conns[address].read_many(len(work[address]), timeout)
            except DisqueError as exc:
                self._conns.pop(address, None)
                out[address] = exc
        return out

    # ---------------------------------------------------------------- the cluster
    def nodes(self, max_age: float = 30.0) -> list[Address]:
        """Every node of the cluster (HELLO from the first seed or known node that answers).

        Raises :class:`Unreachable` naming every node tried."""
        now = time.monotonic()
        if self._nodes and now - self._nodes_at < max_age:
            return list(self._nodes)
        tried: list[str] = []
        for address in list(dict.fromkeys([*self._nodes, *self.seeds])):
            try:
                hello = cmd.parse_hello(self.call(address, b"HELLO", timeout=self.config.connect_timeout + 5),
                                        via_host=address[0])  # fmt: skip
            except DisqueError as exc:
                tried.append("%s (%s)" % (address_text(address), exc))
                self.drop(address)
                continue
            nodes = list(hello.nodes)
            if self.config.tls:
                # HELLO lists plain client ports (0 for a node with only a tls-port), which TLS does
                # not reach: a node is known by the address that reached it, this one and every seed.
                self._reached[hello.node_id] = address
                self._learn_seeds()
                nodes = [dataclasses.replace(n, host=self._reached[n.id][0], port=self._reached[n.id][1])
                         if n.id in self._reached else n for n in nodes]  # fmt: skip
            nodes = [n for n in nodes if n.port > 0]
            self._nodes = [n.address for n in sorted(nodes, key=lambda n: n.id)] or [address]
            self._ids = {n.address: n.id for n in nodes}
            self._nodes_at = now
            return list(self._nodes)
        raise Unreachable("disque: no node of the cluster answered (tried %s)" % "; ".join(tried))

    def _learn_seeds(self) -> None:
        """Which node each seed is (its HELLO's own ID), once per seed that answers."""
        known = set(self._reached.values())
        for seed in self.seeds:
            if seed in known:
                continue
            try:
                hello = cmd.parse_hello(self.call(seed, b"HELLO", timeout=self.config.connect_timeout + 5),
                                        via_host=seed[0])  # fmt: skip
            except DisqueError:
                self.drop(seed)
                continue
            self._reached.setdefault(hello.node_id, seed)

    def node_id(self, address: Address) -> str | None:
        return self._ids.get(address)

    def reachable(self, addresses: Iterable[Address]) -> list[Address]:
        """The addresses that answer PING now (others are dropped)."""
        out = []
        for address in addresses:
            try:
                self.call(address, b"PING", timeout=self.config.connect_timeout + 1)
            except DisqueError:
                self.drop(address)
                continue
            out.append(address)
        return out
