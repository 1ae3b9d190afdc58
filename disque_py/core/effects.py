"""Effects: what the core asks the shell to do, as plain records.

The reply to the command being executed is the return value of
``Node.execute``; everything else the core wants done (answer a client that
was blocked, send a message to a peer, ...) is queued as an effect and
collected by the shell with ``Node.take_effects()`` after each input.
Nobody changes an effect once made; the dataclasses are not ``frozen``
only because a frozen one costs 2.5x as much to build (a few per job).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Final

__all__ = ["Reply", "Send", "BLOCKED", "NO_REPLY"]


@dataclass(slots=True)
class Reply:
    """Answer ``client`` (blocked until now) with ``value``; it is unblocked."""

    client: int
    value: Any  # any reply a command gives: the shell's encoder takes it by its type (and, compiled,
    # a dataclass field annotated ``object`` does not load: mypyc looks the name up in the module)


@dataclass(slots=True)
class Send:
    """Send a cluster message to the node ``to`` (a node ID)."""

    to: str
    message: tuple  # its wire form, (kind, *fields) (messages.py)


class _Blocked:
    __slots__ = ()

    def __repr__(self) -> str:
        return "BLOCKED"


#: Returned by ``Node.execute`` when the client is now blocked; its answer
#: will come later as a ``Reply`` effect.
BLOCKED: Final = _Blocked()


class _NoReply:
    __slots__ = ()

    def __repr__(self) -> str:
        return "NO_REPLY"


#: Returned by a command handler that answers nothing (the shell's SHUTDOWN closes the link).
NO_REPLY: Final = _NoReply()
