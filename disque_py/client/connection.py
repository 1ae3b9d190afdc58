"""A blocking connection to one node (redis-py), shared by the blocking client and the programs.

:class:`NodeConnection` is the public way to talk to one given node without the client's
failover: ``disque-py top`` and ``dead`` ask every node, the Spark source pools one per node, and
the worker's handler threads use one in direct mode. The blocking client holds one to its
current node.
"""

from __future__ import annotations

import inspect
from collections.abc import Sequence
from typing import Any

import redis
from redis.backoff import NoBackoff
from redis.retry import Retry

from .cluster import Address
from .config import ClientConfig
from .errors import ConnectionLost, ReplyTimeout, error_from_reply

__all__ = ["NodeConnection"]


# No CLIENT SETINFO round trips at connect: redis-py >= 7 takes driver_info=None, older ones lib_name=None.
_NO_SETINFO: dict[str, Any] = (
    {"driver_info": None}
    if "driver_info" in inspect.signature(redis.connection.AbstractConnection.__init__).parameters
    else {"lib_name": None, "lib_version": None}
)


class _RawErrorParser(redis.connection.DefaultParser):  # type: ignore[misc, valid-type]
    """redis-py's parser without its error-code mapping: errors keep their full text."""

    EXCEPTION_CLASSES: dict = {}


class NodeConnection:
    """One blocking connection to one node: RESP2 over redis-py (which does the socket, TLS,
    AUTH and hiredis parsing), error replies raised (or returned, pipelined) as this
    package's typed errors, network trouble as :class:`~.errors.ConnectionLost`.

    No failover, no node list: for a program that talks to each node on its own
    (``disque-py top`` and ``dead``, the Spark source, the worker's direct mode). The
    blocking :class:`~.sync.Client` holds one to the node it uses. Connects in the
    constructor (``config``: :class:`~.config.ClientConfig`'s password, user, timeouts, TLS).
    """

    def __init__(self, address: Address, config: ClientConfig) -> None:
        self.address = address
        tls: dict[str, Any] = {}
        conn_class: type[redis.Connection] = redis.Connection
        if config.tls:  # redis-py does the TLS; the same names as its ssl_* arguments
            conn_class = redis.SSLConnection
            tls = {
                "ssl_ca_certs": config.ssl_ca_certs,
                "ssl_certfile": config.ssl_certfile,
                "ssl_keyfile": config.ssl_keyfile,
                "ssl_password": config.ssl_password,
                "ssl_check_hostname": config.ssl_check_hostname,
            }
        self._conn = conn_class(
            **tls,
            host=address[0],
            port=address[1],
            password=config.password,
            username=config.username if config.password is not None else None,
            socket_timeout=config.socket_timeout,
            socket_connect_timeout=config.connect_timeout,
            protocol=2,
            parser_class=_RawErrorParser,
            retry=Retry(NoBackoff(), 0),
            client_name=config.client_name,  # CLIENT SETNAME at connect, when the config names it
            **_NO_SETINFO,
        )
        try:
            self._conn.connect()
        except redis.ResponseError as exc:
            self.close()
            raise error_from_reply(str(exc)) from None
        except (redis.RedisError, OSError) as exc:
            self.close()
            raise ConnectionLost("cannot connect to %s:%d: %s" % (address + (exc,)), address) from None

    def _lost(self, exc: BaseException) -> ConnectionLost:
        self.close()
        if isinstance(exc, redis.TimeoutError):
            return ReplyTimeout("no reply from %s:%d in time" % self.address, self.address)
        return ConnectionLost("connection to %s:%d lost: %s" % (self.address + (exc,)), self.address)

    def request(self, argv: Sequence[Any], timeout: float | None) -> Any:
        try:
            self._conn.send_command(*argv, check_health=False)
            return self._conn.read_response(timeout=timeout)
        except redis.ResponseError as exc:
            raise error_from_reply(str(exc)) from None
        except (redis.RedisError, OSError) as exc:
            raise self._lost(exc) from None
        except BaseException:
            self.close()  # interrupted half-way: the stream is out of step
            raise

    def request_many(self, argvs: Sequence[Sequence[Any]], timeout: float | None) -> list[Any]:
        """Pipelined: every reply in order, error replies as exception values.

        A lost connection raises :class:`ConnectionLost` with ``partial``:
        the replies received before it broke.
        """
        self.send_many(argvs)
        return self.read_many(len(argvs), timeout)

    def send_many(self, argvs: Sequence[Sequence[Any]]) -> None:
        """The sending half of :meth:`request_many` (then :meth:`read_many`): several connections can
        have their commands in flight at once."""
        try:
            self._conn.send_packed_command(self._conn.pack_commands(argvs), check_health=False)
        except (redis.RedisError, OSError) as exc:
            lost = self._lost(exc)
            lost.partial = []  # type: ignore[attr-defined]
            raise lost from None
        except BaseException:
            self.close()
            raise

    def read_many(self, count: int, timeout: float | None) -> list[Any]:
        """The replies to the last ``count`` commands sent (see :meth:`request_many`)."""
        out: list[Any] = []
        try:
            for _ in range(count):
                try:
                    out.append(self._conn.read_response(timeout=timeout))
                except redis.ResponseError as exc:
                    out.append(error_from_reply(str(exc)))
        except (redis.RedisError, OSError) as exc:
            lost = self._lost(exc)
            lost.partial = out  # type: ignore[attr-defined]
            raise lost from None
        except BaseException:
            self.close()
            raise
        return out

    def close(self) -> None:
        try:
            self._conn.disconnect()
        except Exception:  # noqa: BLE001 - closing a broken socket may fail; it is gone anyway
            pass
