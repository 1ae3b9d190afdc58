"""What each peer understands: the optional parts of the job layer's protocol, by name.

Theory of operation
-------------------
A release adds to the bus in two ways only: a message kind (RETURNED), or a trailing field
(a job's priority after its Extra map, a DELIVERED's count of deliveries given back). A
node of before either ignores a trailing field and drops an unknown kind (``Node.receive_data``
counts it), so an addition is never fatal; but a message or a field it ignores is work lost
(a RETURNED not counted, a priority not kept), so a node sends each peer only what it
understands. Each addition is named here (``FEATURES``); a node announces its release and
these names on every link it opens (``cluster_bus.membership``, "Releases"), and the shell
hands the core, as ``Context.lacking``, the peers whose announced set lacks one of ours (a
peer that announced none is taken to be ``UNANNOUNCED_RELEASE``, which understood
``UNANNOUNCED``). ``Node.take_effects`` passes a message to such a peer through
``for_peer`` first: left as it is, trimmed of the fields the peer does not know, or not sent.
In a cluster of one release ``lacking`` is empty, and the effects go out untouched (one test
of an empty dict per input).

A feature added later: one name in ``FEATURES`` and its rule in ``for_peer`` (what an older
peer gets instead). Never remove a name while a supported release may announce it.

Releases are compared by ``release_key`` (the AOF's loader asks whether a file was written by
a newer one). Imports only ``effects``.
"""

from __future__ import annotations

from typing import Any, Final

from .effects import Send

__all__ = ["FEATURES", "UNANNOUNCED", "UNANNOUNCED_RELEASE", "for_peer", "adapt", "release_key"]

#: What this release understands and may send (announced on the bus):
#: ``priority``: a job's priority, the wire's 13th field (ADDJOB PRIORITY);
#: ``returned``: RETURNED messages and DELIVERED's count of deliveries given back (RELEASE).
FEATURES: Final = frozenset({"priority", "returned"})

#: The release of a peer that announces nothing (announcements came with the next one), and
#: what it understood.
UNANNOUNCED_RELEASE: Final = "0.1.0"
UNANNOUNCED: Final = frozenset({"priority", "returned"})

_PRIORITY_FIELD: Final = 12  # index of the priority in a job's wire array (core/wire.py)


def _job_without_priority(wire: Any) -> Any:
    if type(wire) is not list or len(wire) <= _PRIORITY_FIELD:
        return wire
    wire = wire[:_PRIORITY_FIELD]
    if wire[-1] is None:  # the Extra map's place, held for the priority
        wire.pop()
    return wire


def for_peer(message: tuple, features: frozenset[str]) -> tuple | None:
    """``message`` as a peer that understands ``features`` may get it; None: not sent at all."""
    kind = message[0]
    if "priority" not in features:
        if kind == "REPLJOB" and len(message) > 1:
            message = (kind, _job_without_priority(message[1]), *message[2:])
        elif kind == "YOURJOBS" and len(message) > 1 and type(message[1]) is list:
            message = (kind, [_job_without_priority(w) for w in message[1]], *message[2:])
    if "returned" not in features:
        if kind == "RETURNED":
            return None
        if kind == "DELIVERED" and len(message) > 3:
            message = message[:3]
    return message


def adapt(effects: list, lacking: dict[str, frozenset[str]]) -> list:
    """``Node.take_effects``' effects with each message to a peer of ``lacking`` passed through
    ``for_peer`` (a copy of the Send where it changed; dropped where it is not sent)."""
    out: list = []
    for effect in effects:
        features = lacking.get(effect.to) if isinstance(effect, Send) else None
        if features is None:
            out.append(effect)
            continue
        message = for_peer(effect.message, features)
        if message is None:
            continue
        out.append(effect if message is effect.message else Send(effect.to, message))
    return out


def release_key(release: str) -> tuple[int, ...]:
    """``"0.2.0"`` as ``(0, 2, 0)``, for comparing releases: the leading digits of each dotted
    part (``"1.0rc1"`` reads ``(1, 0)``; a part without digits reads 0)."""
    key: list[int] = []
    for part in release.split("."):
        digits = ""
        for ch in part:
            if not ch.isdigit():
                break
            digits += ch
        key.append(int(digits) if digits else 0)
    return tuple(key)
