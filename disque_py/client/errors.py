"""Typed exceptions for the client library.

Every error a node sends (``-CODE message``) becomes an instance of a
:class:`ServerError` subclass chosen by its code, so callers write
``except QueueFullError`` rather than parsing strings. Network trouble is a
:class:`ConnectionLost` (or one of its subclasses). Nothing is ever returned
as a value: an error reply always raises.

::

    DisqueError
    ├── ServerError                 any -CODE reply; .code and .message
    │   ├── CommandError            -ERR (syntax, bad option, wrong arity...)
    │   ├── NoReplicationError      -NOREPL
    │   ├── QueueFullError          -MAXLEN
    │   ├── PausedError             -PAUSED
    │   ├── LeavingError            -LEAVING
    │   ├── NoJobError              -NOJOB
    │   ├── BadIdError              -BADID
    │   ├── TooLateError            -TOOLATE
    │   ├── AckedError              -ACKED
    │   └── AuthError               -NOAUTH, -WRONGPASS, -ERR invalid password
    ├── ConnectionLost              the connection broke or could not be made
    │   ├── ReplyTimeout            no reply in time (the connection is dropped)
    │   └── NoNodeAvailable         every known node was tried until the deadline
    └── BatchError                  some commands of a pipelined batch failed
"""

from __future__ import annotations

__all__ = [
    "DisqueError",
    "ServerError",
    "CommandError",
    "NoReplicationError",
    "QueueFullError",
    "PausedError",
    "LeavingError",
    "NoJobError",
    "BadIdError",
    "TooLateError",
    "AckedError",
    "AuthError",
    "ConnectionLost",
    "ReplyTimeout",
    "NoNodeAvailable",
    "BatchError",
    "error_from_reply",
]


class DisqueError(Exception):
    """Base class of every error raised by the client library."""


class ServerError(DisqueError):
    """A node answered with an error reply ``-CODE message``."""

    code: str = "ERR"

    def __init__(self, message: str, code: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        if code is not None:
            self.code = code

    def __str__(self) -> str:
        return "%s %s" % (self.code, self.message) if self.message else self.code


class CommandError(ServerError):
    """``-ERR``: the command was refused (syntax, bad option value...)."""


class NoReplicationError(ServerError):
    """``-NOREPL``: the job could not be replicated to enough nodes in time."""

    code = "NOREPL"


class QueueFullError(ServerError):
    """``-MAXLEN``: the queue is already at the MAXLEN given to ADDJOB."""

    code = "MAXLEN"


class PausedError(ServerError):
    """``-PAUSED``: the queue is paused for input."""

    code = "PAUSED"


class LeavingError(ServerError):
    """``-LEAVING``: the node is leaving the cluster; use another one."""

    code = "LEAVING"


class NoJobError(ServerError):
    """``-NOJOB``: the node does not know this job."""

    code = "NOJOB"


class BadIdError(ServerError):
    """``-BADID``: not a valid job ID."""

    code = "BADID"


class TooLateError(ServerError):
    """``-TOOLATE``: WORKING after half of the job's TTL."""

    code = "TOOLATE"


class AckedError(ServerError):
    """``-ACKED``: WORKING on a job that is already acknowledged."""

    code = "ACKED"


class AuthError(ServerError):
    """Authentication is required or the password is wrong."""

    code = "NOAUTH"


class ConnectionLost(DisqueError):
    """The connection to a node broke (or could not be established)."""

    def __init__(self, message: str, address: tuple[str, int] | None = None) -> None:
        super().__init__(message)
        self.address = address


class ReplyTimeout(ConnectionLost):
    """No reply within the timeout; the connection was closed (its state is unknown)."""


class NoNodeAvailable(ConnectionLost):
    """Every known node was tried, with backoff, until the failover deadline.

    ``attempts`` lists ``(address, error)`` pairs, the most recent last.
    """

    def __init__(self, message: str, attempts: list[tuple[tuple[str, int], BaseException]]) -> None:
        super().__init__(message)
        self.attempts = attempts


class BatchError(DisqueError):
    """Some commands of a pipelined batch (``add_jobs``) failed.

    ``results`` has one entry per input, in order: the reply (a job ID) or
    the :class:`DisqueError` for that item. ``errors`` lists only the errors.
    """

    def __init__(self, results: list) -> None:
        self.results = results
        self.errors = [r for r in results if isinstance(r, DisqueError)]
        first = self.errors[0] if self.errors else None
        super().__init__("%d of %d commands failed, first: %s" % (len(self.errors), len(results), first))


_BY_CODE: dict[str, type[ServerError]] = {
    "ERR": CommandError,
    "NOREPL": NoReplicationError,
    "MAXLEN": QueueFullError,
    "PAUSED": PausedError,
    "LEAVING": LeavingError,
    "NOJOB": NoJobError,
    "BADID": BadIdError,
    "TOOLATE": TooLateError,
    "ACKED": AckedError,
    "NOAUTH": AuthError,
    "WRONGPASS": AuthError,
}

_AUTH_MESSAGES = ("invalid password", "Client sent AUTH, but no password is set")


def error_from_reply(text: str | bytes) -> ServerError:
    """The typed exception for an error reply (without the leading ``-``)."""
    if isinstance(text, bytes):
        text = text.decode("utf-8", "replace")
    code, _, message = text.partition(" ")
    if not code.isupper() or not code.isalpha():  # no code: keep everything as the message
        code, message = "ERR", text
    if code == "ERR" and message.startswith(_AUTH_MESSAGES):
        return AuthError(message, code)
    cls = _BY_CODE.get(code, ServerError)
    return cls(message, code)
