"""The synchronous client, on redis-py.

Design
------
One :class:`Client` holds at most one connection (a
:class:`~.connection.NodeConnection`: redis-py does the socket, AUTH and the hiredis
parsing) to the node it currently uses, and a :class:`~.cluster.Topology` saying which nodes
exist. Its commands are declared in :mod:`.commands` and shared with the trio client
(:mod:`.base`): each builds a :class:`~.commands.Call` and runs it through
:meth:`Client._call`, which owns the cluster behaviour:

* no connection yet: try the candidates (random seeds at first, then the
  HELLO list by priority) one by one; a full round without success sleeps
  ``backoff.delay(round)`` and starts again, until ``failover_timeout``
  seconds have passed, then :class:`~.errors.NoNodeAvailable` lists every
  attempt. An :class:`~.errors.AuthError` stops at once (a wrong password
  is not cured by trying another node);
* after connecting, and every ``refresh_interval`` seconds, HELLO
  refreshes the node list; when another node has a lower priority (ours is
  leaving) the client moves there;
* a lost connection (or a reply timeout) marks the node down for a few
  seconds and the command is sent again on another node; ``-LEAVING``
  moves the client at once. The second and later retries of one command
  wait ``backoff.delay`` first. ADDJOB is re-sent only with
  ``retry_writes=True`` (the default): the first one may have been
  executed, so a retried ADDJOB can duplicate a job, the usual
  at-least-once trade-off. An ADDJOB with a deduplication key
  (``add_job(..., dedup=key)``) is always re-sent, whatever
  ``retry_writes`` says: any node answers the retry with the ID of the job
  the first one may have added, and adds nothing;
* with ``affinity=True`` :meth:`get_jobs` feeds an :class:`~.cluster.Affinity`
  and the client moves to the node that created most recent jobs.

The clock, ``sleep`` and the random generator are injectable so the
backoff can be tested on a virtual clock. A lock serialises commands, so a
``Client`` can be shared between threads (a blocking ``get_jobs`` then
delays the others: use one client per consuming thread).

Replies are parsed as RESP2 (``protocol=2``) with redis-py's error mapping
turned off, so every error reply reaches :func:`~.errors.error_from_reply`
whole.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Sequence
from typing import Any, TypeVar

from . import commands as cmd
from .base import SyncBase
from .cluster import Address
from .commands import Batch, Call
from .config import ClientConfig, takes_settings
from .connection import NodeConnection
from .errors import ConnectionLost, DisqueError, LeavingError, NoNodeAvailable, ServerError
from .model import HelloInfo, Job

__all__ = ["Client"]

T = TypeVar("T")


class Client(SyncBase):
    """A Disque client for one thread of control (commands are serialised by a lock).

    Takes :class:`~.config.ClientConfig`'s arguments: ``seeds`` (``"host:port"`` strings, or
    one comma-separated string, or ``(host, port)`` pairs; the others are learnt from
    HELLO), then keywords (password, timeouts, failover, TLS, ``prefer`` ...). See the
    module docstring for failover, refresh and affinity.
    """

    @takes_settings
    def __init__(self, config: ClientConfig) -> None:
        super().__init__(config, time.monotonic, time.sleep)
        self._conn: NodeConnection | None = None
        self._lock = threading.RLock()

    # ------------------------------------------------------------ lifecycle
    def __enter__(self) -> "Client":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        """Close the connection (the client reconnects if used again)."""
        with self._lock:
            self._drop()

    def connect(self) -> "Client":
        """Connect now instead of at the first command (raises like a command would)."""
        with self._lock:
            if self._conn is None:
                self._connect()
        return self

    @property
    def current_address(self) -> Address | None:
        """The address of the node in use, or None when not connected."""
        return self._conn.address if self._conn is not None else None

    def hello(self) -> HelloInfo:
        """HELLO (also refreshes the client's node list)."""
        with self._lock:
            reply = self._call(cmd.hello())
            address = self.current_address
            return self._learn(reply, address[0] if address else None)

    def on_other_nodes(self, argvs: Sequence[Sequence[Any]]) -> list[tuple[Address, list[Any]]]:
        """Send ``argvs`` (pipelined) to every node of the last HELLO but the one in use, each
        over a connection of its own that is closed after: ``[(address, replies)]`` for the
        nodes that answered (errors as values); a node that does not answer is left out. For
        the rare look around the cluster (a task's result held on another node); nothing
        here changes the node the client uses."""
        with self._lock:
            self._ensure()
            current = self.current_address
            addresses = [n.address for n in self._topology.nodes.values() if n.address != current]
        return [(a, replies) for a, replies in self._ask_each(addresses, argvs) if not isinstance(replies, Exception)]

    def on_every_node(self, argvs: Sequence[Sequence[Any]]) -> list[tuple[Address, list[Any] | DisqueError]]:
        """Send ``argvs`` (pipelined) to every node of the last HELLO, the one in use included,
        each over a connection of its own that is closed after: ``[(address, replies)]`` for
        every node, with the error in place of the replies of a node that did not answer (error
        replies are values in the list). For reads that must tell "no node has it" from "a node
        did not say" (a chord's results, docs/TASKS.md); nothing here changes the node in use."""
        with self._lock:
            self._ensure()
            addresses = [n.address for n in self._topology.nodes.values()]
        return self._ask_each(addresses, argvs)

    def _ask_each(self, addresses: list[Address], argvs: Sequence[Sequence[Any]]) -> list[tuple[Address, Any]]:
        out: list[tuple[Address, Any]] = []
        for address in addresses:
            try:
                conn = NodeConnection(address, self.config)
            except DisqueError as exc:
                out.append((address, exc))
                continue
            try:
                out.append((address, conn.request_many(argvs, self.config.socket_timeout)))
            except DisqueError as exc:
                out.append((address, exc))
            finally:
                conn.close()
        return out

    # ------------------------------------------------------------ plumbing
    def _drop(self, mark_down: bool = False) -> None:
        if self._conn is not None:
            if mark_down:
                self._topology.mark_down(self._conn.address, self._clock())
            self._conn.close()
            self._conn = None

    def _open(self, address: Address) -> tuple[NodeConnection, HelloInfo]:
        """A new connection to ``address`` and its HELLO (which updates the node list)."""
        conn = NodeConnection(address, self.config)
        try:
            call = cmd.hello()
            return conn, self._learn(conn.request(call.argv, self.config.read_timeout(call)), address[0])
        except BaseException:
            conn.close()
            raise

    def _adopt(self, conn: NodeConnection, hello: HelloInfo) -> None:
        self._conn = conn
        self._node_id = hello.node_id
        self._topology.mark_up(conn.address)

    def _connect(self) -> None:
        """Connect to some node (see the module docstring) or raise NoNodeAvailable."""
        rounds = self._connect_rounds()
        while True:
            for address in rounds.candidates():
                try:
                    conn, hello = self._open(address)
                except (ConnectionLost, ServerError) as exc:
                    rounds.failed(address, exc)
                    continue
                self._adopt(conn, hello)
                self._maybe_move()
                return
            self._sleep(rounds.pause())

    def _move_to(self, address: Address) -> bool:
        """Switch to ``address`` if it answers; keep the current node otherwise."""
        if self.current_address == address:
            return False
        try:
            conn, hello = self._open(address)
        except DisqueError:
            self._topology.mark_down(address, self._clock())
            return False
        self._drop()
        self._adopt(conn, hello)
        return True

    def _ensure(self) -> NodeConnection:
        """The connection to the current node: connecting, or refreshing the node list (and
        moving if a better node appeared) when it is due."""
        if self._conn is None:
            self._connect()
        elif self.config.refresh_interval is not None and self._clock() >= self._next_refresh:
            call = cmd.hello()
            self._learn(self._conn.request(call.argv, self.config.read_timeout(call)), self._conn.address[0])
            self._maybe_move()
        assert self._conn is not None
        return self._conn

    def _maybe_move(self) -> None:
        target = self._better_node()
        if target is not None:
            self._move_to(target)

    def _resend(self, failures: int, retry_safe: bool) -> bool:
        """After a lost connection (dropped here, its node marked down): whether to send the
        command again, after the pause it is due."""
        self._drop(mark_down=True)
        pause = self._retry_pause(failures, retry_safe)
        if pause:
            self._sleep(pause)
        return pause is not None

    def _follow(self, jobs: Sequence[Job]) -> None:
        """Affinity: move to the node the jobs received lately come from, if it is time to."""
        target = self._affinity_target(jobs)
        if target is not None:
            self._move_to(target)

    def _call(self, call: Call[T]) -> T:
        with self._lock:
            failures = 0
            while True:
                try:
                    reply = self._ensure().request(call.argv, self.config.reply_timeout(call.blocks))
                except NoNodeAvailable:
                    raise
                except ConnectionLost:
                    failures += 1
                    if not self._resend(failures, call.retry_safe):
                        raise
                    continue
                except LeavingError:
                    failures += 1
                    target = self._leaving_target(failures)
                    if target is None or not self._move_to(target):
                        raise
                    continue
                result = call.parse(reply)
                if call.delivers is not None and self.config.affinity is not None:
                    self._follow(call.delivers(result))
                return result

    def _pipeline(self, argvs: list[tuple[Any, ...]], blocks: float | None, retry_safe: bool) -> list[Any]:
        """Send a batch at once; replies (errors as values) in order, with failover."""
        timeout = self.config.reply_timeout(blocks)
        results: list[Any] = []
        with self._lock:
            failures = 0
            while len(results) < len(argvs):
                try:
                    results += self._ensure().request_many(argvs[len(results) :], timeout)
                except NoNodeAvailable:
                    raise
                except ConnectionLost as exc:
                    results += getattr(exc, "partial", [])
                    failures += 1
                    if not self._resend(failures, retry_safe):
                        raise
        return results

    def _batch(self, batch: Batch[T]) -> T:
        replies: list[Any] = []
        for argvs, retry_safe in batch.rounds:
            replies += self._pipeline(argvs, batch.blocks, retry_safe)
        result = batch.finish(replies)
        if batch.delivers is not None and self.config.affinity is not None:
            self._follow(batch.delivers(result))
        return result
