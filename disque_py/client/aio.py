"""The trio client: the same API as :class:`disque_py.Client`, with ``await``.

Design
------
Commands, reply parsing, node choice, backoff and affinity are shared with
the synchronous client (:mod:`.commands`, :mod:`.cluster`); this module
only does trio I/O, over :class:`~.resp.RespConnection` (trio streams +
``hiredis.Reader``).

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

import json
import random
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable
from typing import Any, TypeVar

import trio

from . import commands as cmd
from .cluster import Address, Affinity, Backoff, Topology
from .config import ClientConfig
from .errors import (
    AuthError,
    BatchError,
    ConnectionLost,
    DisqueError,
    LeavingError,
    NoNodeAvailable,
    ServerError,
)
from .model import HelloInfo, Job, NodeInfo
from .resp import RespConnection

__all__ = ["Client"]

T = TypeVar("T")


class Client:
    """A trio Disque client, safe to share between tasks. See the module docstring."""

    def __init__(
        self,
        seeds: Any = "127.0.0.1:7711",
        *,
        password: str | None = None,
        username: str | None = None,
        socket_timeout: float | None = 5.0,
        connect_timeout: float = 2.0,
        failover_timeout: float = 10.0,
        backoff: Backoff | None = None,
        refresh_interval: float | None = 30.0,
        affinity: bool | Affinity = False,
        retry_writes: bool = True,
        max_retries: int = 5,
        max_idle: int = 8,
        clock: Callable[[], float] | None = None,
        sleep: Callable[[float], Awaitable[Any]] | None = None,
        rng: random.Random | None = None,
        tls: bool = False,
        ssl_ca_certs: str | None = None,
        ssl_certfile: str | None = None,
        ssl_keyfile: str | None = None,
        ssl_password: str | None = None,
        ssl_check_hostname: bool = True,
        prefer: Any = None,
    ) -> None:
        self.config = ClientConfig(
            seeds, password=password, username=username, socket_timeout=socket_timeout,
            connect_timeout=connect_timeout,
            failover_timeout=failover_timeout, backoff=backoff, refresh_interval=refresh_interval,
            affinity=affinity, retry_writes=retry_writes, max_retries=max_retries, rng=rng,
            tls=tls, ssl_ca_certs=ssl_ca_certs, ssl_certfile=ssl_certfile, ssl_keyfile=ssl_keyfile,
            ssl_password=ssl_password, ssl_check_hostname=ssl_check_hostname, prefer=prefer,
        )  # fmt: skip
        self.max_idle = max_idle
        self._clock = clock or trio.current_time
        self._sleep = sleep or trio.sleep
        self._rng = self.config.rng
        self._topology = Topology(self.config.seeds, self._rng, prefer=self.config.prefer)
        self._node: Address | None = None
        self._node_id: str | None = None
        self._generation = 0
        self._idle: list[RespConnection] = []
        self._lock = trio.Lock()
        self._next_refresh = 0.0
        self._refreshing = False

    @classmethod
    def from_config(cls, config: ClientConfig, **overrides: Any) -> "Client":
        """A trio client with the settings of another client (e.g. a synchronous one)."""
        return cls(config.seeds, **{**config.kwargs(), **overrides})

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
        await trio.lowlevel.checkpoint()

    async def connect(self) -> "Client":
        """Connect now instead of at the first command."""
        conn = await self._acquire()
        self._release(conn)
        return self

    @property
    def current_address(self) -> Address | None:
        return self._node

    @property
    def current_node_id(self) -> str | None:
        return self._node_id if self._node is not None else None

    @property
    def nodes(self) -> list[NodeInfo]:
        return list(self._topology.nodes.values())

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
        if user:  # a named user: AUTH username password
            try:
                await conn.request((b"AUTH", user, self.config.password), self.config.socket_timeout)
            except BaseException:
                conn.close()
                raise
        return conn

    async def _open(self, address: Address) -> tuple[RespConnection, HelloInfo]:
        """A new connection to ``address`` and its HELLO (which updates the node list)."""
        conn = await self._open_connection(address)
        try:
            call = cmd.hello()
            hello = cmd.parse_hello(await conn.request(call.argv, self.config.read_timeout(call)), address[0])
        except BaseException:
            conn.close()
            raise
        self._topology.update(hello, self._clock())
        self._next_refresh = self._clock() + (self.config.refresh_interval or 0.0)
        return conn, hello

    def _adopt(self, conn: RespConnection, hello: HelloInfo) -> None:
        self._invalidate()
        self._node = conn.address
        self._node_id = hello.node_id
        conn.generation = self._generation
        self._idle.append(conn)
        self._topology.mark_up(conn.address)

    async def _connect(self) -> None:
        deadline = self._clock() + self.config.failover_timeout
        attempts: list[tuple[Address, BaseException]] = []
        rounds = 0
        while True:
            for address in self._topology.candidates(self._clock()):
                try:
                    conn, hello = await self._open(address)
                except AuthError:
                    raise
                except (ConnectionLost, ServerError) as exc:
                    attempts.append((address, exc))
                    self._topology.mark_down(address, self._clock())
                    continue
                self._adopt(conn, hello)
                await self._maybe_move()
                return
            now = self._clock()
            if now >= deadline:
                tried = sorted({"%s:%d" % a for a, _ in attempts})
                raise NoNodeAvailable(
                    "no node reachable after %.1f s (tried %s; last error: %s)"
                    % (self.config.failover_timeout, ", ".join(tried), attempts[-1][1] if attempts else "-"),
                    attempts,
                )
            await self._sleep(min(self.config.backoff.delay(rounds, self._rng), max(0.0, deadline - now)))
            rounds += 1

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
        target = self._topology.better_node(self._node_id, self._clock())
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

    async def _failed(self, failures: int, retry_safe: bool) -> bool:
        """After a lost connection: may we retry? Sleeps the backoff from the second retry on."""
        if failures > self.config.max_retries or not (retry_safe or self.config.retry_writes):
            return False
        if failures > 1:
            await self._sleep(self.config.backoff.delay(failures - 2, self._rng))
        return True

    async def _leaving(self, failures: int) -> bool:
        if self._node_id:
            self._topology.set_priority(self._node_id, 100, self._clock())
        if failures > self.config.max_retries:
            return False
        target = self._topology.better_node(self._node_id, self._clock())
        return target is not None and await self._move_to(target)

    async def _call(self, call: cmd.Call[T]) -> T:
        failures = 0
        while True:
            generation = self._generation
            conn: RespConnection | None = None
            try:
                conn = await self._acquire()
                reply = await conn.request(call.argv, self.config.read_timeout(call))
            except NoNodeAvailable:
                raise
            except ConnectionLost as exc:
                self._lost(conn.generation if conn is not None else generation, exc.address)
                failures += 1
                if not await self._failed(failures, call.retry_safe):
                    raise
                continue
            except LeavingError:
                assert conn is not None
                self._release(conn)
                failures += 1
                if not await self._leaving(failures):
                    raise
                continue
            except BaseException:
                if conn is not None:
                    self._release(conn)
                raise
            self._release(conn)
            return call.parse(reply)

    async def _pipeline(self, argvs: list[tuple[Any, ...]], blocks: float | None, retry_safe: bool) -> list[Any]:
        probe = cmd.Call((), lambda r: r, blocks=blocks, retry_safe=retry_safe)
        results: list[Any] = []
        failures = 0
        while len(results) < len(argvs):
            generation = self._generation
            conn: RespConnection | None = None
            try:
                conn = await self._acquire()
                results += await conn.request_many(argvs[len(results) :], self.config.read_timeout(probe))
            except NoNodeAvailable:
                raise
            except ConnectionLost as exc:
                results += getattr(exc, "partial", [])
                self._lost(conn.generation if conn is not None else generation, exc.address)
                failures += 1
                if not await self._failed(failures, retry_safe):
                    raise
                continue
            except BaseException:
                if conn is not None:
                    self._release(conn)
                raise
            self._release(conn)
        return results

    async def _observe(self, jobs: list[Job]) -> None:
        affinity = self.config.affinity
        if affinity is None or not jobs:
            return
        affinity.observe(j.node_prefix for j in jobs)
        prefix = affinity.suggest(self._node_id[:8] if self._node_id else None)
        if prefix is None:
            return
        affinity.reset()
        node = self._topology.node_with_prefix(prefix)
        current = self._topology.nodes.get(self._node_id or "")
        if node is not None and (current is None or node.priority <= current.priority):
            await self._move_to(node.address)

    # ------------------------------------------------------------ jobs
    async def add_job(
        self,
        queue: str | bytes,
        body: bytes | str,
        *,
        timeout_ms: int = cmd.DEFAULT_ADD_TIMEOUT_MS,
        replicate: int | None = None,
        delay: int | None = None,
        retry: int | None = None,
        ttl: int | None = None,
        maxlen: int | None = None,
        async_: bool = False,
        backoff: tuple[float, float] | None = None,
        maxdeliver: int | None = None,
        deadletter: str | bytes | None = None,
        dedup: str | bytes | None = None,
    ) -> str:
        """ADDJOB: queue a job, return its ID. Times are in seconds except ``timeout_ms``.

        disque-py's delivery options (sent only when given): ``backoff=(min_s, max_s)``
        requeues the job after min x 2^(nacks-1) seconds (capped at max) on each plain
        NACK; ``maxdeliver=n`` dead-letters it on a failure of its n-th delivery, into
        ``deadletter`` (default ``<queue>.dead``). Disque's nodes refuse them.

        ``dedup=key`` (str or bytes, 1 to 512 bytes; ``ADDJOB ... DEDUP key``): every ADDJOB of
        this queue and key, on any node, returns the same job ID and adds nothing, for the
        whole life of the job and the node's ``dedup-window`` (600 s by default) after it is
        acknowledged or deleted; the body and options of the later calls are ignored. Such a
        call is therefore always sent again after a lost connection or a reply timeout, on
        another node, even with ``retry_writes=False``: the retry answers the same ID. Without
        a key the call is sent exactly as before.
        """
        return await self._call(cmd.addjob(
            queue, body, timeout_ms=timeout_ms, replicate=replicate, delay=delay,
            retry=retry, ttl=ttl, maxlen=maxlen, async_=async_,
            backoff=backoff, maxdeliver=maxdeliver, deadletter=deadletter, dedup=dedup,
        ))  # fmt: skip

    async def add_jobs(
        self, queue: str | bytes, bodies: Iterable[bytes | str], *, batch: int = 100,
        dedup: Callable[[Any], str | bytes | None] | Iterable[str | bytes | None] | None = None, **opts: Any
    ) -> list[str]:
        """Many ADDJOBs, pipelined ``batch`` at a time; IDs in input order.

        ``dedup``: a deduplication key per body (see :meth:`add_job`), either a function called
        with each body that returns its key (or None), or a sequence of keys, one per body (None
        for a body without one). A batch whose jobs all have a key is sent again after a lost
        connection even with ``retry_writes=False`` (the jobs already added answer their IDs
        again); run twice, the call adds nothing the second time and returns the same IDs.

        Raises :class:`~.errors.BatchError` (with every result) if any failed.
        """
        if batch < 1:
            raise ValueError("batch must be >= 1")
        bodies = list(bodies)
        keys = cmd.dedup_keys(bodies, dedup)
        argvs = [cmd.addjob_argv(queue, body, dedup=key, **opts) for body, key in zip(bodies, keys)]
        if not argvs:
            return []
        probe = cmd.addjob(queue, b"", **opts)
        results: list[Any] = []
        for start in range(0, len(argvs), batch):
            safe = all(key is not None for key in keys[start : start + batch])
            results += await self._pipeline(argvs[start : start + batch], probe.blocks, retry_safe=safe)
        if any(isinstance(r, DisqueError) for r in results):
            raise BatchError([r if isinstance(r, DisqueError) else r.decode("ascii") for r in results])
        return [r.decode("ascii") for r in results]

    async def add_json(self, queue: str | bytes, obj: Any, **opts: Any) -> str:
        return await self.add_job(queue, json.dumps(obj, separators=(",", ":"), ensure_ascii=False).encode(), **opts)

    async def add_msgpack(self, queue: str | bytes, obj: Any, **opts: Any) -> str:
        import msgpack

        return await self.add_job(queue, msgpack.packb(obj, use_bin_type=True), **opts)

    async def get_jobs(
        self,
        *queues: str | bytes,
        count: int = 1,
        timeout_ms: int | None = None,
        nohang: bool = False,
        with_counters: bool = True,
    ) -> list[Job]:
        """GETJOB: up to ``count`` jobs; ``[]`` after ``timeout_ms`` (None: wait for one)."""
        jobs = await self._call(cmd.getjob(queues, count=count, timeout_ms=timeout_ms, nohang=nohang,
                                           with_counters=with_counters))  # fmt: skip
        await self._observe(jobs)
        return jobs

    async def get_job(self, *queues: str | bytes, timeout_ms: int | None = None, nohang: bool = False) -> Job | None:
        jobs = await self.get_jobs(*queues, count=1, timeout_ms=timeout_ms, nohang=nohang)
        return jobs[0] if jobs else None

    async def ack(self, *ids: str | bytes) -> int:
        return await self._call(cmd.ids_command(b"ACKJOB", ids))

    async def fast_ack(self, *ids: str | bytes) -> int:
        return await self._call(cmd.ids_command(b"FASTACK", ids))

    async def nack(
        self, *ids: str | bytes, delay: float | None = None, reason: str | bytes | None = None, dead: bool = False
    ) -> int:
        """NACK: put the jobs back now, counting a failed attempt (plain ``NACK id...``, as Disque).

        disque-py's options: ``delay`` seconds before they are queued again
        (cluster-wide); ``reason`` kept as the jobs' last failure (cut to 1024
        bytes); ``dead=True`` dead-letters them now, whatever their MAXDELIVER.
        """
        return await self._call(cmd.nack(ids, delay=delay, reason=reason, dead=dead))

    async def enqueue(self, *ids: str | bytes) -> int:
        return await self._call(cmd.ids_command(b"ENQUEUE", ids))

    async def dequeue(self, *ids: str | bytes) -> int:
        return await self._call(cmd.ids_command(b"DEQUEUE", ids))

    async def del_job(self, *ids: str | bytes) -> int:
        return await self._call(cmd.ids_command(b"DELJOB", ids))

    async def working(self, job_id: str | bytes) -> int:
        return await self._call(cmd.working(job_id))

    async def show(self, job_id: str | bytes) -> dict[str, Any] | None:
        return await self._call(cmd.show(job_id))

    # ------------------------------------------------------------ queues
    async def qlen(self, queue: str | bytes) -> int:
        return await self._call(cmd.qlen(queue))

    async def qstat(self, queue: str | bytes) -> dict[str, Any] | None:
        return await self._call(cmd.qstat(queue))

    async def qpeek(self, queue: str | bytes, count: int = 1) -> list[Job]:
        return await self._call(cmd.qpeek(queue, count))

    async def qscan(
        self,
        *,
        count: int | None = None,
        busyloop: bool = False,
        minlen: int | None = None,
        maxlen: int | None = None,
        importrate: int | None = None,
    ) -> AsyncIterator[str]:
        """Every queue name: ``async for name in client.qscan(): ...``."""
        cursor = 0
        while True:
            cursor, names = await self._call(cmd.qscan(cursor, count=count, busyloop=busyloop, minlen=minlen,
                                                       maxlen=maxlen, importrate=importrate))  # fmt: skip
            for name in names:
                yield name
            if cursor == 0:
                return

    async def jscan(
        self,
        *,
        count: int | None = None,
        busyloop: bool = False,
        queue: str | bytes | None = None,
        states: Iterable[str] | str = (),
        reply: str = "id",
    ) -> AsyncIterator[Any]:
        """Every job: ``async for job_id in client.jscan(): ...``."""
        cursor = 0
        states = tuple([states] if isinstance(states, str) else states)
        while True:
            cursor, items = await self._call(cmd.jscan(cursor, count=count, busyloop=busyloop, queue=queue,
                                                       states=states, reply=reply))  # fmt: skip
            for item in items:
                yield item
            if cursor == 0:
                return

    async def pause(self, queue: str | bytes, *flags: str) -> str:
        return await self._call(cmd.pause(queue, flags))

    # ------------------------------------------------------------ server
    async def info(self, section: str | None = None) -> dict[str, Any]:
        return await self._call(cmd.info(section))

    async def hello(self) -> HelloInfo:
        """HELLO (also refreshes the client's node list)."""
        reply = await self._call(cmd.hello())
        hello = cmd.parse_hello(reply, via_host=self._node[0] if self._node else None)
        self._topology.update(hello, self._clock())
        return hello

    async def ping(self) -> str:
        return await self._call(cmd.ping())

    async def pipeline(self, calls: list[cmd.Call[Any]]) -> list[Any]:
        """Several commands in one round trip, on one connection, executed in order.

        Returns each command's parsed result, or its :class:`~.errors.ServerError`
        as a value. Built with :mod:`disque_py.client.commands`, e.g.
        ``[commands.ids_command(b"ACKJOB", ids), commands.getjob(["q"], nohang=True)]``
        (the worker acknowledges and fetches this way). Connection trouble
        fails over like any command; commands already answered are not resent.
        """
        if not calls:
            return []
        blocks: float | None = 0.0
        for call in calls:
            blocks = None if call.blocks is None or blocks is None else max(blocks, call.blocks)
        replies = await self._pipeline([c.argv for c in calls], blocks, all(c.retry_safe for c in calls))
        results = [r if isinstance(r, DisqueError) else c.parse(r) for c, r in zip(calls, replies)]
        for call, result in zip(calls, results):
            if call.argv[0] == b"GETJOB" and isinstance(result, list):
                await self._observe(result)
        return results

    async def execute(self, *argv: Any) -> Any:
        """Any command, raw RESP2 reply (errors still raise typed exceptions)."""
        return await self._call(cmd.Call(tuple(argv), lambda r: r, blocks=None, retry_safe=False))
