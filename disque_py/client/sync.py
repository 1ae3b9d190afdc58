"""The synchronous client, on redis-py.

Design
------
One :class:`Client` holds at most one connection (a
:class:`~.connection.NodeConnection`: redis-py does the socket, AUTH and the hiredis
parsing) to the node it currently uses, and a :class:`~.cluster.Topology` saying which nodes exist.
Every public method builds a :class:`~.commands.Call` and runs it through
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

import json
import random
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import Any, TypeVar

from . import commands as cmd
from .cluster import Address, Affinity, Backoff, Topology
from .config import ClientConfig
from .connection import NodeConnection
from .errors import (
    AuthError,
    BatchError,
    ConnectionLost,
    DisqueError,
    LeavingError,
    NoNodeAvailable,
    ServerError,
)
from .model import HelloInfo, Job

__all__ = ["Client"]

T = TypeVar("T")


class Client:
    """A Disque client for one thread of control (commands are serialised by a lock).

    ``seeds``: ``"host:port"`` strings (or one comma-separated string, or
    ``(host, port)`` pairs); the others are learnt from HELLO. See the
    module docstring for failover, refresh and affinity. ``prefer``: one
    address (a seed or not) tried first whenever it is not marked down,
    instead of a random seed: for a caller that spreads its own clients over
    the nodes; the other nodes remain the failover.
    """

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
        clock: Callable[[], float] = time.monotonic,
        sleep: Callable[[float], Any] = time.sleep,
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
        self._clock = clock
        self._sleep = sleep
        self._rng = self.config.rng
        self._topology = Topology(self.config.seeds, self._rng, prefer=self.config.prefer)
        self._conn: NodeConnection | None = None
        self._node_id: str | None = None
        self._next_refresh = 0.0
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

    @property
    def current_node_id(self) -> str | None:
        return self._node_id if self._conn is not None else None

    @property
    def nodes(self) -> list:
        """The node list from the last HELLO."""
        return list(self._topology.nodes.values())

    def on_other_nodes(self, argvs: Sequence[Sequence[Any]]) -> list[tuple[Address, list[Any]]]:
        """Send ``argvs`` (pipelined) to every node of the last HELLO but the one in use, each
        over a connection of its own that is closed after: ``[(address, replies)]`` for the
        nodes that answered (errors as values); a node that does not answer is left out. For
        the rare look around the cluster (a task's result held on another node); nothing
        here changes the node the client uses."""
        with self._lock:
            self._ensure()
            current = self._conn.address if self._conn is not None else None
            addresses = [n.address for n in self._topology.nodes.values() if n.address != current]
        out: list[tuple[Address, list[Any]]] = []
        for address in addresses:
            try:
                conn = NodeConnection(address, self.config)
            except DisqueError:
                continue
            try:
                out.append((address, conn.request_many(argvs, self.config.socket_timeout)))
            except DisqueError:
                pass
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

    def _hello(self, conn: NodeConnection) -> HelloInfo:
        call = cmd.hello()
        hello = cmd.parse_hello(conn.request(call.argv, self.config.read_timeout(call)), via_host=conn.address[0])
        self._topology.update(hello, self._clock())
        self._next_refresh = self._clock() + (self.config.refresh_interval or 0.0)
        return hello

    def _adopt(self, conn: NodeConnection, hello: HelloInfo) -> None:
        self._conn = conn
        self._node_id = hello.node_id
        self._topology.mark_up(conn.address)

    def _open(self, address: Address) -> tuple[NodeConnection, HelloInfo]:
        conn = NodeConnection(address, self.config)
        try:
            return conn, self._hello(conn)
        except BaseException:
            conn.close()
            raise

    def _connect(self) -> None:
        """Connect to some node (see the module docstring) or raise NoNodeAvailable."""
        deadline = self._clock() + self.config.failover_timeout
        attempts: list[tuple[Address, BaseException]] = []
        rounds = 0
        while True:
            for address in self._topology.candidates(self._clock()):
                try:
                    conn, hello = self._open(address)
                except AuthError:
                    raise
                except (ConnectionLost, ServerError) as exc:
                    attempts.append((address, exc))
                    self._topology.mark_down(address, self._clock())
                    continue
                self._adopt(conn, hello)
                self._maybe_move()
                return
            now = self._clock()
            if now >= deadline:
                tried = sorted({"%s:%d" % a for a, _ in attempts})
                raise NoNodeAvailable(
                    "no node reachable after %.1f s (tried %s; last error: %s)"
                    % (self.config.failover_timeout, ", ".join(tried), attempts[-1][1] if attempts else "-"),
                    attempts,
                )
            self._sleep(min(self.config.backoff.delay(rounds, self._rng), max(0.0, deadline - now)))
            rounds += 1

    def _move_to(self, address: Address) -> bool:
        """Switch to ``address`` if it answers; keep the current node otherwise."""
        if self._conn is not None and self._conn.address == address:
            return False
        try:
            conn, hello = self._open(address)
        except DisqueError:
            self._topology.mark_down(address, self._clock())
            return False
        self._drop()
        self._adopt(conn, hello)
        return True

    def _maybe_move(self) -> None:
        target = self._topology.better_node(self._node_id, self._clock())
        if target is not None:
            self._move_to(target)

    def _ensure(self) -> NodeConnection:
        if self._conn is None:
            self._connect()
        elif self.config.refresh_interval is not None and self._clock() >= self._next_refresh:
            self._hello(self._conn)
            self._maybe_move()
        assert self._conn is not None
        return self._conn

    def _call(self, call: cmd.Call[T]) -> T:
        with self._lock:
            failures = 0
            while True:
                try:
                    conn = self._ensure()
                    reply = conn.request(call.argv, self.config.read_timeout(call))
                except NoNodeAvailable:
                    raise
                except ConnectionLost:
                    self._drop(mark_down=True)
                    failures += 1
                    if failures > self.config.max_retries or not (call.retry_safe or self.config.retry_writes):
                        raise
                    if failures > 1:
                        self._sleep(self.config.backoff.delay(failures - 2, self._rng))
                    continue
                except LeavingError:
                    if self._node_id:
                        self._topology.set_priority(self._node_id, 100, self._clock())
                    failures += 1
                    if failures > self.config.max_retries:
                        raise
                    target = self._topology.better_node(self._node_id, self._clock())
                    if target is None or not self._move_to(target):
                        raise
                    continue
                return call.parse(reply)

    def _pipeline(self, argvs: list[tuple[Any, ...]], blocks: float | None, retry_safe: bool) -> list[Any]:
        """Send a batch at once; replies (errors as values) in order, with failover."""
        call = cmd.Call((), lambda r: r, blocks=blocks, retry_safe=retry_safe)
        results: list[Any] = []
        with self._lock:
            failures = 0
            while len(results) < len(argvs):
                try:
                    conn = self._ensure()
                    results += conn.request_many(argvs[len(results) :], self.config.read_timeout(call))
                except NoNodeAvailable:
                    raise
                except ConnectionLost as exc:
                    results += getattr(exc, "partial", [])
                    self._drop(mark_down=True)
                    failures += 1
                    if failures > self.config.max_retries or not (retry_safe or self.config.retry_writes):
                        raise
                    if failures > 1:
                        self._sleep(self.config.backoff.delay(failures - 2, self._rng))
        return results

    def _observe(self, jobs: list[Job]) -> None:
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
            with self._lock:
                self._move_to(node.address)

    # ------------------------------------------------------------ jobs
    def add_job(
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
        return self._call(cmd.addjob(
            queue, body, timeout_ms=timeout_ms, replicate=replicate, delay=delay,
            retry=retry, ttl=ttl, maxlen=maxlen, async_=async_,
            backoff=backoff, maxdeliver=maxdeliver, deadletter=deadletter, dedup=dedup,
        ))  # fmt: skip

    def add_jobs(
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
            results += self._pipeline(argvs[start : start + batch], probe.blocks, retry_safe=safe)
        if any(isinstance(r, DisqueError) for r in results):
            raise BatchError([r if isinstance(r, DisqueError) else r.decode("ascii") for r in results])
        return [r.decode("ascii") for r in results]

    def add_json(self, queue: str | bytes, obj: Any, **opts: Any) -> str:
        """ADDJOB with ``obj`` serialised as compact JSON (UTF-8)."""
        return self.add_job(queue, json.dumps(obj, separators=(",", ":"), ensure_ascii=False).encode(), **opts)

    def add_msgpack(self, queue: str | bytes, obj: Any, **opts: Any) -> str:
        """ADDJOB with ``obj`` packed with msgpack."""
        import msgpack

        return self.add_job(queue, msgpack.packb(obj, use_bin_type=True), **opts)

    def get_jobs(
        self,
        *queues: str | bytes,
        count: int = 1,
        timeout_ms: int | None = None,
        nohang: bool = False,
        with_counters: bool = True,
    ) -> list[Job]:
        """GETJOB: up to ``count`` jobs from the first non-empty queues.

        Blocks until a job arrives, or ``timeout_ms`` (then returns ``[]``);
        ``nohang=True`` never blocks.
        """
        jobs = self._call(cmd.getjob(queues, count=count, timeout_ms=timeout_ms, nohang=nohang,
                                     with_counters=with_counters))  # fmt: skip
        self._observe(jobs)
        return jobs

    def get_job(self, *queues: str | bytes, timeout_ms: int | None = None, nohang: bool = False) -> Job | None:
        """One job, or None on timeout."""
        jobs = self.get_jobs(*queues, count=1, timeout_ms=timeout_ms, nohang=nohang)
        return jobs[0] if jobs else None

    def ack(self, *ids: str | bytes) -> int:
        """ACKJOB: acknowledge (cluster-wide); returns how many this node knew."""
        return self._call(cmd.ids_command(b"ACKJOB", ids))

    def fast_ack(self, *ids: str | bytes) -> int:
        """FASTACK: best-effort acknowledgement and deletion everywhere."""
        return self._call(cmd.ids_command(b"FASTACK", ids))

    def nack(
        self, *ids: str | bytes, delay: float | None = None, reason: str | bytes | None = None, dead: bool = False
    ) -> int:
        """NACK: put the jobs back now, counting a failed attempt (plain ``NACK id...``, as Disque).

        disque-py's options: ``delay`` seconds before they are queued again
        (cluster-wide); ``reason`` kept as the jobs' last failure (cut to 1024
        bytes); ``dead=True`` dead-letters them now, whatever their MAXDELIVER.
        """
        return self._call(cmd.nack(ids, delay=delay, reason=reason, dead=dead))

    def enqueue(self, *ids: str | bytes) -> int:
        return self._call(cmd.ids_command(b"ENQUEUE", ids))

    def dequeue(self, *ids: str | bytes) -> int:
        return self._call(cmd.ids_command(b"DEQUEUE", ids))

    def del_job(self, *ids: str | bytes) -> int:
        return self._call(cmd.ids_command(b"DELJOB", ids))

    def working(self, job_id: str | bytes) -> int:
        """WORKING: postpone the requeue; returns the job's RETRY in seconds."""
        return self._call(cmd.working(job_id))

    def show(self, job_id: str | bytes) -> dict[str, Any] | None:
        """SHOW: the job's fields (``body`` as bytes), or None if unknown here."""
        return self._call(cmd.show(job_id))

    # ------------------------------------------------------------ queues
    def qlen(self, queue: str | bytes) -> int:
        return self._call(cmd.qlen(queue))

    def qstat(self, queue: str | bytes) -> dict[str, Any] | None:
        return self._call(cmd.qstat(queue))

    def qpeek(self, queue: str | bytes, count: int = 1) -> list[Job]:
        return self._call(cmd.qpeek(queue, count))

    def qscan(
        self,
        *,
        count: int | None = None,
        busyloop: bool = False,
        minlen: int | None = None,
        maxlen: int | None = None,
        importrate: int | None = None,
    ) -> Iterator[str]:
        """Every queue name (QSCAN, page after page)."""
        cursor = 0
        while True:
            cursor, names = self._call(cmd.qscan(cursor, count=count, busyloop=busyloop, minlen=minlen,
                                                 maxlen=maxlen, importrate=importrate))  # fmt: skip
            yield from names
            if cursor == 0:
                return

    def jscan(
        self,
        *,
        count: int | None = None,
        busyloop: bool = False,
        queue: str | bytes | None = None,
        states: Iterable[str] | str = (),
        reply: str = "id",
    ) -> Iterator[Any]:
        """Every job (JSCAN, page after page): IDs, or dicts with ``reply="all"``."""
        cursor = 0
        states = tuple([states] if isinstance(states, str) else states)
        while True:
            cursor, items = self._call(cmd.jscan(cursor, count=count, busyloop=busyloop, queue=queue,
                                                 states=states, reply=reply))  # fmt: skip
            yield from items
            if cursor == 0:
                return

    def pause(self, queue: str | bytes, *flags: str) -> str:
        """PAUSE queue in|out|all|none|state [bcast] -> the pause state."""
        return self._call(cmd.pause(queue, flags))

    # ------------------------------------------------------------ server
    def info(self, section: str | None = None) -> dict[str, Any]:
        return self._call(cmd.info(section))

    def hello(self) -> HelloInfo:
        """HELLO (also refreshes the client's node list)."""
        with self._lock:
            failures = 0
            while True:
                try:
                    return self._hello(self._ensure())
                except ConnectionLost:
                    self._drop(mark_down=True)
                    failures += 1
                    if failures > self.config.max_retries:
                        raise

    def ping(self) -> str:
        return self._call(cmd.ping())

    def execute(self, *argv: Any) -> Any:
        """Any command, raw RESP2 reply (errors still raise typed exceptions)."""
        return self._call(cmd.Call(tuple(argv), lambda r: r, blocks=None, retry_safe=False))
