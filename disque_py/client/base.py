"""One client, two faces: what the blocking and the trio client share.

:class:`ClientBase` lists the client's commands once, each made from its declaration in
:mod:`.commands` (a function with the method's signature and docstring that returns a
:class:`~.commands.Call`: argv, reply parser, how long it may block, whether it may be resent)::

    add_job = command(cmd.addjob)      # Client.add_job(...) -> str; await AsyncClient.add_job(...)

A face turns each declaration into a method when it is defined (:class:`SyncBase`,
:class:`TrioBase`): the blocking client's ``add_job`` runs ``self._call(cmd.addjob(...))`` and
returns the value; the trio client's is ``async`` and awaits the same. So a command, or an
option of one, is added in :mod:`.commands` alone, and both faces have it, with its
signature and docstring (``help()``, ``inspect.signature``) and, for type checkers, its
parameters and result (the descriptors' ``__get__`` is typed per face with a ``ParamSpec``).
``tests/client/test_faces.py`` checks both faces against the declarations.

The faces keep only what moves bytes: connecting, failing over and resending (``_call``,
``_pipeline``), each with its own I/O (redis-py behind a lock; trio streams, a pool of
connections). What they decide alike is here: how long to wait before resending, where to
go when a node is leaving, what a HELLO teaches, which node the jobs come from (affinity),
the rounds of a connection attempt and their deadline.
"""

from __future__ import annotations

import inspect
from collections.abc import AsyncIterator, Callable, Coroutine, Iterator, Sequence
from typing import Any, Concatenate, Generic, ParamSpec, TypeVar, cast, overload

from . import commands as cmd
from .cluster import Address, Topology
from .commands import Batch, Call
from .config import ClientConfig
from .errors import AuthError, NoNodeAvailable
from .model import HelloInfo, Job, NodeInfo

__all__ = ["ClientBase", "SyncBase", "TrioBase", "command", "pipelined", "paged"]

P = ParamSpec("P")
T = TypeVar("T")
C = TypeVar("C", bound="ClientBase")


# ---------------------------------------------------------------- declarations -> methods


class _Declared(Generic[P, T]):
    """A client method made from a declaration of :mod:`.commands`; each face makes its own
    function from it (:meth:`blocking`, :meth:`awaited`), named, documented and signed as the
    declaration."""

    build: Callable[..., Any]
    #: how many leading parameters of the declaration the method does not take (a scan's cursor)
    skip = 0

    def __set_name__(self, owner: type, name: str) -> None:
        self.name = name

    def __get__(self, obj: Any, owner: type) -> Any:
        return self  # reached on ClientBase only: each face holds the functions made for it

    def blocking(self) -> Callable[..., Any]:
        raise NotImplementedError

    def awaited(self) -> Callable[..., Any]:
        raise NotImplementedError

    def returns(self, awaited: bool) -> str:
        """The method's return annotation for ``help()``: the declaration's ``Call[X]`` -> ``X``."""
        return _inner(inspect.signature(self.build).return_annotation)

    def dress(self, method: Callable[..., Any], face: type, awaited: bool) -> Callable[..., Any]:
        """``method`` named, documented and signed as the declaration, for ``face``."""
        sig = inspect.signature(self.build)
        params = list(sig.parameters.values())[self.skip :]
        this = inspect.Parameter("self", inspect.Parameter.POSITIONAL_OR_KEYWORD)
        method.__name__ = self.name
        method.__qualname__ = "%s.%s" % (face.__qualname__, self.name)
        method.__module__ = face.__module__
        method.__doc__ = self.build.__doc__
        method.__signature__ = sig.replace(parameters=[this, *params], return_annotation=self.returns(awaited))  # type: ignore[attr-defined]
        method.__wrapped__ = self.build  # type: ignore[attr-defined]
        return method


def _inner(annotation: Any) -> str:
    text = str(annotation)
    for wrapper in ("Call[", "Batch["):
        if text.startswith(wrapper) and text.endswith("]"):
            return text[len(wrapper) : -1]
    return text


class command(_Declared[P, T]):
    """A method that sends one command: ``name = command(cmd.builder)``."""

    def __init__(self, build: Callable[P, Call[T]]) -> None:
        self.build = build

    @overload
    def __get__(self, obj: None, owner: type) -> command[P, T]: ...
    @overload
    def __get__(self, obj: SyncBase, owner: type) -> Callable[P, T]: ...
    @overload
    def __get__(self, obj: TrioBase, owner: type) -> Callable[P, Coroutine[Any, Any, T]]: ...
    @overload
    def __get__(self, obj: ClientBase, owner: type) -> Callable[P, Any]: ...
    def __get__(self, obj: Any, owner: type) -> Any:
        return self

    def blocking(self) -> Callable[..., Any]:
        build = self.build

        def method(self: SyncBase, *args: Any, **kwargs: Any) -> Any:
            return self._call(build(*args, **kwargs))

        return method

    def awaited(self) -> Callable[..., Any]:
        build = self.build

        async def method(self: TrioBase, *args: Any, **kwargs: Any) -> Any:
            return await self._call(build(*args, **kwargs))

        return method


class pipelined(command[P, T]):
    """A method that pipelines commands a round at a time (a :class:`~.commands.Batch`)."""

    def __init__(self, build: Callable[P, Batch[T]]) -> None:
        self.build = build

    def blocking(self) -> Callable[..., Any]:
        build = self.build

        def method(self: SyncBase, *args: Any, **kwargs: Any) -> Any:
            batch = build(*args, **kwargs)
            return self._batch(batch)

        return method

    def awaited(self) -> Callable[..., Any]:
        build = self.build

        async def method(self: TrioBase, *args: Any, **kwargs: Any) -> Any:
            batch = build(*args, **kwargs)
            return await self._batch(batch)

        return method


def _next_page(call: Call[Any], cursor: int) -> Call[Any]:
    """The same scan from ``cursor`` (QSCAN's and JSCAN's cursor is their first argument)."""
    return call._replace(argv=(call.argv[0], cursor, *call.argv[2:]))


class paged(_Declared[P, T]):
    """A method that iterates over a scan, page after page (QSCAN, JSCAN): the declaration
    takes the cursor first, the method does not; the blocking face returns an iterator, the
    trio face an async iterator."""

    skip = 1

    def __init__(self, build: Callable[Concatenate[int, P], Call[tuple[int, list[T]]]]) -> None:
        self.build = build

    @overload
    def __get__(self, obj: None, owner: type) -> paged[P, T]: ...
    @overload
    def __get__(self, obj: SyncBase, owner: type) -> Callable[P, Iterator[T]]: ...
    @overload
    def __get__(self, obj: TrioBase, owner: type) -> Callable[P, AsyncIterator[T]]: ...
    @overload
    def __get__(self, obj: ClientBase, owner: type) -> Callable[P, Any]: ...
    def __get__(self, obj: Any, owner: type) -> Any:
        return self

    def returns(self, awaited: bool) -> str:
        page = _inner(super().returns(awaited))  # tuple[int, list[X]]
        item = page[len("tuple[int, list[") : -2] if page.startswith("tuple[int, list[") else "Any"
        return ("AsyncIterator[%s]" if awaited else "Iterator[%s]") % item

    def blocking(self) -> Callable[..., Any]:
        build = self.build

        def method(self: SyncBase, *args: Any, **kwargs: Any) -> Iterator[Any]:
            call = build(0, *args, **kwargs)  # checked once, before the first page
            while True:
                cursor, items = self._call(call)
                yield from items
                if cursor == 0:
                    return
                call = _next_page(call, cursor)

        return method

    def awaited(self) -> Callable[..., Any]:
        build = self.build

        async def method(self: TrioBase, *args: Any, **kwargs: Any) -> AsyncIterator[Any]:
            call = build(0, *args, **kwargs)
            while True:
                cursor, items = await self._call(call)
                for item in items:
                    yield item
                if cursor == 0:
                    return
                call = _next_page(call, cursor)

        return method


# ---------------------------------------------------------------- what both faces are


class ClientBase:
    """What both clients are and decide alike; a face adds the I/O (see the module docstring)."""

    def __init__(self, config: ClientConfig, clock: Callable[[], float], sleep: Callable[[float], Any]) -> None:
        self.config = config
        self._clock = config.clock or clock
        self._sleep = config.sleep or sleep
        self._rng = config.rng
        self._topology = Topology(config.seeds, self._rng, prefer=config.prefer)
        self._node_id: str | None = None
        self._next_refresh = 0.0

    @classmethod
    def from_config(cls: type[C], config: ClientConfig, **overrides: Any) -> C:
        """A client of this kind with the settings of another client, of either kind
        (:meth:`ClientConfig.kwargs`); ``overrides`` are settings too."""
        make: Any = cls  # a face's constructor takes ClientConfig's arguments (takes_settings)
        return cast(C, make(config.seeds, **{**config.kwargs(), **overrides}))

    @property
    def current_address(self) -> Address | None:
        """The address of the node in use, or None when not connected."""
        raise NotImplementedError

    @property
    def current_node_id(self) -> str | None:
        """The ID of the node in use, or None when not connected."""
        return self._node_id if self.current_address is not None else None

    @property
    def nodes(self) -> list[NodeInfo]:
        """The node list from the last HELLO."""
        return list(self._topology.nodes.values())

    # ------------------------------------------------------------ the commands (commands.py)
    add_job = command(cmd.addjob)
    add_jobs = pipelined(cmd.add_jobs)
    add_json = command(cmd.add_json)
    add_msgpack = command(cmd.add_msgpack)
    get_jobs = command(cmd.get_jobs)
    get_job = command(cmd.get_job)
    ack = command(cmd.ack)
    fast_ack = command(cmd.fast_ack)
    nack = command(cmd.nack)
    enqueue = command(cmd.enqueue)
    dequeue = command(cmd.dequeue)
    release = command(cmd.release)
    del_job = command(cmd.del_job)
    working = command(cmd.working)
    show = command(cmd.show)
    qlen = command(cmd.qlen)
    qstat = command(cmd.qstat)
    qpeek = command(cmd.qpeek)
    qscan = paged(cmd.qscan)
    jscan = paged(cmd.jscan)
    pause = command(cmd.pause)
    group_info = command(cmd.group_info)
    group_list = command(cmd.group_list)
    group_weight = command(cmd.group_weight)
    group_limit = command(cmd.group_limit)
    worker_beat = command(cmd.worker_beat)
    worker_list = command(cmd.worker_list)
    worker_forget = command(cmd.worker_forget)
    info = command(cmd.info)
    ping = command(cmd.ping)
    execute = command(cmd.execute)
    run = command(cmd.run)
    pipeline = pipelined(cmd.pipeline)

    # ------------------------------------------------------------ decided alike
    def _learn(self, reply: Any, host: str | None) -> HelloInfo:
        """A HELLO's reply (from a node reached at ``host``, which stands for a node that
        announces no address): the node list; the next refresh is due ``refresh_interval``
        from now."""
        hello = cmd.parse_hello(reply, via_host=host)
        self._topology.update(hello, self._clock())
        self._next_refresh = self._clock() + (self.config.refresh_interval or 0.0)
        return hello

    def _retry_pause(self, failures: int, retry_safe: bool) -> float | None:
        """After the ``failures``-th lost connection of one command: None if it must fail
        (too many, or an ADDJOB that may not be resent), else the pause before it is sent
        again (none the first time, the backoff from the second on)."""
        if failures > self.config.max_retries or not (retry_safe or self.config.retry_writes):
            return None
        return self.config.backoff.delay(failures - 2, self._rng) if failures > 1 else 0.0

    def _leaving_target(self, failures: int) -> Address | None:
        """After a -LEAVING reply: our node is leaving (priority 100 until a HELLO says
        otherwise); the node to move to and resend, or None if the command must fail."""
        if self._node_id:
            self._topology.set_priority(self._node_id, 100, self._clock())
        if failures > self.config.max_retries:
            return None
        return self._better_node()

    def _better_node(self) -> Address | None:
        """A node worth moving to although ours works (ours is leaving), or None."""
        return self._topology.better_node(self._node_id, self._clock())

    def _affinity_target(self, jobs: Sequence[Job]) -> Address | None:
        """With ``affinity``: the jobs just received are watched; the node that made most of
        the recent ones, when it is worth moving there, else None."""
        affinity = self.config.affinity
        if affinity is None or not jobs:
            return None
        affinity.observe(j.node_prefix for j in jobs)
        prefix = affinity.suggest(self._node_id[:8] if self._node_id else None)
        if prefix is None:
            return None
        affinity.reset()
        node = self._topology.node_with_prefix(prefix)
        current = self._topology.nodes.get(self._node_id or "")
        if node is not None and (current is None or node.priority <= current.priority):
            return node.address
        return None

    def _connect_rounds(self) -> ConnectRounds:
        return ConnectRounds(self)


class ConnectRounds:
    """One attempt to connect, shared by both faces' loops: the candidates of each round
    (:meth:`~.cluster.Topology.candidates`), each failure marked down and remembered, the
    backoff between rounds, :class:`~.errors.NoNodeAvailable` (listing every attempt) once
    ``failover_timeout`` has passed. An :class:`~.errors.AuthError` stops at once: a wrong
    password is not cured by trying another node."""

    def __init__(self, client: ClientBase) -> None:
        self.client = client
        self.deadline = client._clock() + client.config.failover_timeout
        self.attempts: list[tuple[Address, BaseException]] = []
        self.rounds = 0

    def candidates(self) -> list[Address]:
        return self.client._topology.candidates(self.client._clock())

    def failed(self, address: Address, exc: Exception) -> None:
        if isinstance(exc, AuthError):
            raise exc
        self.attempts.append((address, exc))
        self.client._topology.mark_down(address, self.client._clock())

    def pause(self) -> float:
        """The pause before the next round, or NoNodeAvailable past the deadline."""
        client, now = self.client, self.client._clock()
        if now >= self.deadline:
            tried = sorted({"%s:%d" % a for a, _ in self.attempts})
            raise NoNodeAvailable(
                "no node reachable after %.1f s (tried %s; last error: %s)"
                % (client.config.failover_timeout, ", ".join(tried), self.attempts[-1][1] if self.attempts else "-"),
                self.attempts,
            )
        self.rounds += 1
        return min(client.config.backoff.delay(self.rounds - 1, client._rng), max(0.0, self.deadline - now))


def _install(face: type, awaited: bool) -> None:
    """Give ``face`` (a client class) a method for every declaration of ClientBase it does
    not define itself."""
    for name, declared in vars(ClientBase).items():
        if isinstance(declared, _Declared) and name not in vars(face):
            method = declared.awaited() if awaited else declared.blocking()
            setattr(face, name, declared.dress(method, face, awaited))


class SyncBase(ClientBase):
    """The blocking face: each command a method that returns its value. A class that
    derives from it directly (:class:`disque_py.client.sync.Client`) gets the methods."""

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        if SyncBase in cls.__bases__:
            _install(cls, awaited=False)

    def _call(self, call: Call[T]) -> T:
        """Send one command, with failover; its parsed reply."""
        raise NotImplementedError

    def _batch(self, batch: Batch[T]) -> T:
        """Send a batch's rounds, with failover; its result."""
        raise NotImplementedError


class TrioBase(ClientBase):
    """The trio face: each command a coroutine method. A class that derives from it
    directly (:class:`disque_py.client.aio.Client`) gets the methods."""

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        if TrioBase in cls.__bases__:
            _install(cls, awaited=True)

    async def _call(self, call: Call[T]) -> T:
        """Send one command, with failover; its parsed reply."""
        raise NotImplementedError

    async def _batch(self, batch: Batch[T]) -> T:
        """Send a batch's rounds, with failover; its result."""
        raise NotImplementedError
