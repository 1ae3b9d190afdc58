"""The client's settings, declared once: :class:`ClientConfig`'s constructor.

Both clients (:class:`~.sync.Client`, :class:`~.aio.Client`) take exactly these keyword
arguments: their ``__init__`` is ``@takes_settings``, which builds a :class:`ClientConfig` from
the call and hands it over, and which type checkers read as ``ClientConfig``'s signature (a
``ParamSpec``), so a new setting is one edit here. The worker and the programs that talk to
each node on their own (``disque-py top``, ``dead``, the Spark source) build one directly.
"""

from __future__ import annotations

import inspect
import random
import ssl
from collections.abc import Callable
from typing import Any, Concatenate, ParamSpec, TypeVar

from . import commands as cmd
from .cluster import Address, Affinity, Backoff, parse_address, parse_seeds, seed_items, split_url

__all__ = ["ClientConfig", "takes_settings"]

P = ParamSpec("P")
S = TypeVar("S")


def _url_username(url: str) -> str | None:
    """The user of ``"rediss://alice:pw@host:port"`` (None for ``":pw@"`` or no credentials)."""
    rest = url.strip().split("://", 1)[-1].split("/", 1)[0].split("?", 1)[0]
    if "@" not in rest:
        return None
    cred = rest.rpartition("@")[0]
    return cred.split(":", 1)[0] or None if ":" in cred else None


class ClientConfig:
    """A client's settings: where the nodes are, how to sign in, how long to wait, how to fail over.

    ``seeds``: ``"host:port"`` strings (or one comma-separated string, or ``(host, port)``
    pairs, or URLs: ``rediss://:password@host:port`` says TLS and the password); the other
    nodes are learnt from HELLO. ``password`` (and ``username``, an ACL user): AUTH.
    ``socket_timeout``: seconds to wait for a reply (plus whatever the command may block);
    ``connect_timeout``: for a connection (and its TLS handshake). ``failover_timeout``: how
    long to try the nodes, round after round with ``backoff`` pauses, before
    :class:`~.errors.NoNodeAvailable`. ``refresh_interval``: HELLO again this often (None:
    never). ``affinity``: move to the node that made most of the jobs received lately (True,
    or an :class:`~.cluster.Affinity`). ``retry_writes``: send an ADDJOB without a DEDUP key
    again after a lost connection (it may then duplicate a job); ``max_retries``: how many
    times a command is resent. ``max_idle``: idle connections the trio client keeps (the
    blocking client has one). ``clock``, ``sleep``, ``rng``: injectable for tests (None: the
    client's own: ``time.monotonic`` and ``time.sleep``, or ``trio.current_time`` and
    ``trio.sleep``; ``sleep`` is awaited by the trio client). ``tls`` and ``ssl_*``:
    redis-py's names (SECURITY.md). ``prefer``: one address (a seed or not) tried first
    whenever it is not marked down, instead of a random seed: for a caller that spreads its
    own clients over the nodes; the other nodes remain the failover. ``client_name``: each
    connection sends ``CLIENT SETNAME`` with it when opened, so that ``CLIENT LIST`` shows who
    it is (printable ASCII without spaces, as the command demands; a worker names its own
    ``disque-py-worker:<host>:<pid>``).
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
        max_idle: int = 8,
        clock: Callable[[], float] | None = None,
        sleep: Callable[[float], Any] | None = None,
        rng: random.Random | None = None,
        tls: bool = False,
        ssl_ca_certs: str | None = None,
        ssl_certfile: str | None = None,
        ssl_keyfile: str | None = None,
        ssl_password: str | None = None,
        ssl_check_hostname: bool = True,
        prefer: Any = None,
        client_name: str | None = None,
    ) -> None:
        if client_name is not None and (not client_name or any(not 32 < ord(c) < 127 for c in client_name)):
            raise ValueError("client_name must be printable ASCII without spaces, got %r" % client_name)
        # CLIENT SETNAME on every connection when set (None: connections stay unnamed).
        self.client_name = client_name or None
        self.seeds: list[Address] = parse_seeds(seeds)
        # The node to use whenever it is up (None: a random seed, then the HELLO list).
        self.prefer: Address | None = parse_address(prefer) if prefer is not None else None
        # A seed written as a URL may say TLS (rediss://) and carry the password (redis-py's form).
        for item in seed_items(seeds):
            if isinstance(item, str):
                _, url_tls, url_password = split_url(item)
                tls = tls or url_tls
                if password is None and url_password is not None:
                    password = url_password
                    if username is None:
                        username = _url_username(item)
        self.password = password
        # A named user (AUTH username password); None: the default user.
        self.username = username or None
        # TLS, with redis-py's names: the CA to check the node's certificate against (None: the
        # system's), and our certificate and key when the node asks for one (tls-auth-clients).
        self.tls = bool(tls or ssl_ca_certs or ssl_certfile)
        self.ssl_ca_certs = ssl_ca_certs
        self.ssl_certfile = ssl_certfile
        self.ssl_keyfile = ssl_keyfile
        self.ssl_password = ssl_password
        self.ssl_check_hostname = ssl_check_hostname
        self._ssl_context: ssl.SSLContext | None = None
        self.socket_timeout = socket_timeout
        self.connect_timeout = connect_timeout
        self.failover_timeout = failover_timeout
        self.backoff = backoff or Backoff()
        self.refresh_interval = refresh_interval
        self.affinity: Affinity | None = (Affinity() if affinity is True else affinity) or None
        self.retry_writes = retry_writes
        self.max_retries = max_retries
        self.max_idle = max_idle
        # None: the client's own (time.monotonic and time.sleep, or trio.current_time and trio.sleep)
        self.clock, self.sleep = clock, sleep
        self.rng = rng or random.Random()

    def kwargs(self) -> dict[str, Any]:
        """Keyword arguments that rebuild an equivalent client (fresh affinity and rng; no
        ``prefer``: a caller that spreads its clients gives each its own; no ``clock``,
        ``sleep`` or ``max_idle``: each kind of client has its own)."""
        return {
            "password": self.password,
            "username": self.username,
            "socket_timeout": self.socket_timeout,
            "connect_timeout": self.connect_timeout,
            "failover_timeout": self.failover_timeout,
            "backoff": self.backoff,
            "refresh_interval": self.refresh_interval,
            "affinity": self.affinity is not None,
            "retry_writes": self.retry_writes,
            "max_retries": self.max_retries,
            "client_name": self.client_name,
            **self.tls_kwargs(),
        }

    def tls_kwargs(self) -> dict[str, Any]:
        """The TLS settings as keyword arguments of either client."""
        return {
            "tls": self.tls,
            "ssl_ca_certs": self.ssl_ca_certs,
            "ssl_certfile": self.ssl_certfile,
            "ssl_keyfile": self.ssl_keyfile,
            "ssl_password": self.ssl_password,
            "ssl_check_hostname": self.ssl_check_hostname,
        }

    def ssl_context(self) -> ssl.SSLContext | None:
        """The client-side context (built once; None without TLS). A missing or bad file raises
        ``OSError``/``ssl.SSLError`` here, at the first connection."""
        if not self.tls:
            return None
        if self._ssl_context is None:
            ctx = ssl.create_default_context(cafile=self.ssl_ca_certs)
            ctx.check_hostname = self.ssl_check_hostname
            if self.ssl_certfile:
                ctx.load_cert_chain(self.ssl_certfile, self.ssl_keyfile, password=self.ssl_password)
            self._ssl_context = ctx
        return self._ssl_context

    def read_timeout(self, call: cmd.Call[Any] | cmd.Batch[Any]) -> float | None:
        """How long to wait for ``call``'s reply: the socket timeout plus what it may block."""
        return self.reply_timeout(call.blocks)

    def reply_timeout(self, blocks: float | None) -> float | None:
        """The socket timeout plus ``blocks`` seconds (None: without bound)."""
        if blocks is None or self.socket_timeout is None:
            return None
        return self.socket_timeout + blocks


def _taking(make: Callable[P, ClientConfig]) -> Callable[[Callable[[S, ClientConfig], None]], Callable[Concatenate[S, P], None]]:
    def decorate(init: Callable[[S, ClientConfig], None]) -> Callable[Concatenate[S, P], None]:
        def __init__(self: S, /, *args: P.args, **kwargs: P.kwargs) -> None:
            init(self, make(*args, **kwargs))

        __init__.__doc__ = init.__doc__
        __init__.__qualname__ = getattr(init, "__qualname__", "__init__")
        __init__.__signature__ = inspect.signature(ClientConfig.__init__)  # type: ignore[attr-defined]
        return __init__

    return decorate


#: For a client's ``__init__(self, config)``: the client is called with :class:`ClientConfig`'s
#: arguments (its signature, for type checkers and ``help()``), and ``__init__`` gets the config.
takes_settings = _taking(ClientConfig)
