"""The trio client: the same API as :class:`disque_py.Client`, with ``await``.

Design
------
Commands, reply parsing, node choice, backoff and affinity are shared with
the synchronous client: the commands are declared once (:mod:`.commands`) and both clients
are made from the declarations (:mod:`.base`), the settings are :class:`~.config.ClientConfig`'s,
and the cluster decisions :mod:`.cluster`'s and :mod:`.base`'s. This module only does trio
I/O, over :class:`~.resp.RespConnection` (trio streams + ``hiredis.Reader``).

Unlike the synchronous client, one :class:`Client` may be used by many
tasks at once: it keeps a small pool of connections *to the node it
currently uses*. A task running a blocking GETJOB holds one connection
while others ACK through another. Every choice of node has a generation
number; connections carry the generation they were opened in, so when the
client moves (failover, ``-LEAVING``, a lower-priority node in HELLO,
affinity) the old node's connections are closed as they come back to the
pool, and a failure reported by several tasks at once triggers one
failover only.

Failover, retries and their backoff behave as described in
:mod:`disque_py.client.sync`. ``clock``, ``sleep`` and ``rng`` are
injectable (defaults: ``trio.current_time``, ``trio.sleep``, a fresh
``random.Random``); trio's ``MockClock`` works too.

Cancellation is safe: a request cancelled half-way closes its connection
(the stream would be out of step), and the command is not retried.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, TypeVar

import trio

from . import commands as cmd
from .base import TrioBase
from .cluster import Address
from .commands import Batch, Call
from .config import ClientConfig, takes_settings
from .errors import ConnectionLost, DisqueError, LeavingError, NoNodeAvailable, ServerError
from .model import HelloInfo, Job
from .resp import RespConnection

__all__ = ["Client"]

T = TypeVar("T")


class Client(TrioBase):
    """A trio Disque client, safe to share between tasks. See the module docstring.

    Takes :class:`~.config.ClientConfig`'s arguments, as the blocking client does
    (``max_idle``: idle connections kept; ``sleep`` is awaited).
    """

    @takes_settings
    def __init__(self, config: ClientConfig) -> None:
        super().__init__(config, trio.current_time, trio.sleep)
        self.max_idle = config.max_idle
        self._node: Address | None = None
        self._generation = 0
        self._idle: list[RespConnection] = []
        self._lock = trio.Lock()
        self._refreshing = False
        self._side: dict[Address, list[RespConnection]] = {}  # on_every_node's idle connections, per node

    # ------------------------------------------------------------ lifecycle
    async def __aenter__(self) -> "Client":
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    async def aclose(self) -> None:
        """Close idle connections; connections in use close when released.

        The client reconnects if it is used again.
        """
        self._invalidate()
        side, self._side = self._side, {}
        for conns in side.values():
            for conn in conns:
                conn.close()
        await trio.lowlevel.checkpoint()

    async def connect(self) -> "Client":
        """Connect now instead of at the first command."""
        conn = await self._acquire()
        self._release(conn)
        return self

    @property
    def current_address(self) -> Address | None:
        """The address of the node in use, or None when not connected."""
        return self._node

    async def hello(self) -> HelloInfo:
        """HELLO (also refreshes the client's node list)."""
        reply = await self._call(cmd.hello())
        return self._learn(reply, self._node[0] if self._node else None)

    async def on_every_node(self, argvs: Sequence[Sequence[Any]]) -> list[tuple[Address, list[Any] | DisqueError]]:
        """Send ``argvs`` (pipelined) to every node of the last HELLO, the one in use included,
        all at once: ``[(address, replies)]`` for every node, with the error in place of the
        replies of a node that did not answer (error replies are values in the list). For reads
        that must tell "no node has it" from "a node did not say" (a chord's results,
        docs/TASKS.md). Each node's connections are kept apart from the pool of the node in use
        (at most ``max_idle`` idle per node); nothing here changes the node in use."""
        if self._node is None or not self._topology.nodes:
            await self.connect()  # the node list comes with the first HELLO
        addresses = [n.address for n in self._topology.nodes.values()]
        out: list[Any] = [None] * len(addresses)

        async def ask(i: int, address: Address) -> None:
            idle = self._side.setdefault(address, [])
            try:
                conn = idle.pop() if idle else await self._open_connection(address)
            except DisqueError as exc:
                out[i] = exc
                return
            try:
                out[i] = await conn.request_many(argvs, self.config.socket_timeout)
            except DisqueError as exc:
                conn.close()
                for stale in idle:  # the node went away: its other idle connections with it
                    stale.close()
                idle.clear()
                out[i] = exc
                return
            except BaseException:
                conn.close()
                raise
            if len(idle) < self.max_idle:
                idle.append(conn)
            else:
                conn.close()

        async with trio.open_nursery() as nursery:
            for i, address in enumerate(addresses):
                nursery.start_soon(ask, i, address)
        return list(zip(addresses, out))

    # ------------------------------------------------------------ plumbing
    def _invalidate(self) -> None:
        """Forget the current node: a new generation, idle connections closed."""
        self._generation += 1
        self._node = None
        idle, self._idle = self._idle, []
        for conn in idle:
            conn.close()

    def _lost(self, generation: int, address: Address | None) -> None:
        """A connection of ``generation`` failed: fail over (once per generation)."""
        if generation == self._generation and self._node is not None:
            self._topology.mark_down(address or self._node, self._clock())
            self._invalidate()

    def _release(self, conn: RespConnection) -> None:
        if conn.broken or conn.generation != self._generation or len(self._idle) >= self.max_idle:
            conn.close()
        else:
            self._idle.append(conn)

    async def _open_connection(self, address: Address) -> RespConnection:
        user = self.config.username if self.config.password is not None else None
        conn = await RespConnection.open(
            address,
            connect_timeout=self.config.connect_timeout,
            password=None if user else self.config.password,
            timeout=self.config.socket_timeout,
            ssl_context=self.config.ssl_context(),
        )
        name = self.config.client_name
        if user or name:
            try:
                if user:  # a named user: AUTH username password
                    await conn.request((b"AUTH", user, self.config.password), self.config.socket_timeout)
                if name:  # seen in CLIENT LIST
                    await conn.request((b"CLIENT", b"SETNAME", name), self.config.socket_timeout)
            except BaseException:
                conn.close()
                raise
        return conn

    async def _open(self, address: Address) -> tuple[RespConnection, HelloInfo]:
        """A new connection to ``address`` and its HELLO (which updates the node list)."""
        conn = await self._open_connection(address)
        try:
            call = cmd.hello()
            return conn, self._learn(await conn.request(call.argv, self.config.read_timeout(call)), address[0])
        except BaseException:
            conn.close()
            raise

    def _adopt(self, conn: RespConnection, hello: HelloInfo) -> None:
        self._invalidate()
        self._node = conn.address
        self._node_id = hello.node_id
        conn.generation = self._generation
        self._idle.append(conn)
        self._topology.mark_up(conn.address)

    async def _connect(self) -> None:
        rounds = self._connect_rounds()
        while True:
            for address in rounds.candidates():
                try:
                    conn, hello = await self._open(address)
                except (ConnectionLost, ServerError) as exc:
                    rounds.failed(address, exc)
                    continue
                self._adopt(conn, hello)
                await self._maybe_move()
                return
            await self._sleep(rounds.pause())

    async def _move_to(self, address: Address) -> bool:
        if self._node == address:
            return False
        try:
            conn, hello = await self._open(address)
        except DisqueError:
            self._topology.mark_down(address, self._clock())
            return False
        self._adopt(conn, hello)
        return True

    async def _maybe_move(self) -> None:
        target = self._better_node()
        if target is not None:
            await self._move_to(target)

    async def _refresh(self) -> None:
        """HELLO on the current node; move if a better node appeared."""
        self._refreshing = True
        try:
            self._next_refresh = self._clock() + (self.config.refresh_interval or 0.0)
            await self.hello()
            await self._maybe_move()
        except DisqueError:
            pass  # the next command notices a dead node
        finally:
            self._refreshing = False

    async def _acquire(self) -> RespConnection:
        """A connection to the current node (connecting, refreshing or opening one as needed)."""
        if self._node is None:
            async with self._lock:
                if self._node is None:
                    await self._connect()
        elif self.config.refresh_interval is not None and not self._refreshing and self._clock() >= self._next_refresh:
            await self._refresh()
        while self._idle:
            conn = self._idle.pop()
            if not conn.broken and conn.generation == self._generation:
                return conn
            conn.close()
        generation, address = self._generation, self._node
        if address is None:  # lost again while we waited: let the caller retry
            raise ConnectionLost("no current node")
        try:
            conn = await self._open_connection(address)
        except ConnectionLost:
            self._lost(generation, address)
            raise
        conn.generation = generation
        return conn

    async def _resend(self, failures: int, retry_safe: bool) -> bool:
        """After a lost connection: whether to send the command again, after the pause it is due."""
        pause = self._retry_pause(failures, retry_safe)
        if pause:
            await self._sleep(pause)
        return pause is not None

    async def _follow(self, jobs: Sequence[Job]) -> None:
        """Affinity: move to the node the jobs received lately come from, if it is time to."""
        target = self._affinity_target(jobs)
        if target is not None:
            await self._move_to(target)

    async def _call(self, call: Call[T]) -> T:
        failures = 0
        while True:
            generation = self._generation
            conn: RespConnection | None = None
            try:
                conn = await self._acquire()
                reply = await conn.request(call.argv, self.config.reply_timeout(call.blocks))
            except NoNodeAvailable:
                raise
            except ConnectionLost as exc:
                self._lost(conn.generation if conn is not None else generation, exc.address)
                failures += 1
                if not await self._resend(failures, call.retry_safe):
                    raise
                continue
            except LeavingError:
                assert conn is not None
                self._release(conn)
                failures += 1
                target = self._leaving_target(failures)
                if target is None or not await self._move_to(target):
                    raise
                continue
            except BaseException:
                if conn is not None:
                    self._release(conn)
                raise
            self._release(conn)
            result = call.parse(reply)
            if call.delivers is not None and self.config.affinity is not None:
                await self._follow(call.delivers(result))
            return result

    async def _pipeline(self, argvs: list[tuple[Any, ...]], blocks: float | None, retry_safe: bool) -> list[Any]:
        """Send a batch at once; replies (errors as values) in order, with failover."""
        timeout = self.config.reply_timeout(blocks)
        results: list[Any] = []
        failures = 0
        while len(results) < len(argvs):
            generation = self._generation
            conn: RespConnection | None = None
            try:
                conn = await self._acquire()
                results += await conn.request_many(argvs[len(results) :], timeout)
            except NoNodeAvailable:
                raise
            except ConnectionLost as exc:
                results += getattr(exc, "partial", [])
                self._lost(conn.generation if conn is not None else generation, exc.address)
                failures += 1
                if not await self._resend(failures, retry_safe):
                    raise
            finally:
                if conn is not None:
                    self._release(conn)  # back to the pool, or closed if it broke
        return results

    async def _batch(self, batch: Batch[T]) -> T:
        replies: list[Any] = []
        for argvs, retry_safe in batch.rounds:
            replies += await self._pipeline(argvs, batch.blocks, retry_safe)
        result = batch.finish(replies)
        if batch.delivers is not None and self.config.affinity is not None:
            await self._follow(batch.delivers(result))
        return result
