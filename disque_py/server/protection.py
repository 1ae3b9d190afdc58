"""Protected mode: a node nobody has secured serves only its own machine.

Redis's rule, which we follow: protected mode is *active* when the operator left
``protected-mode`` at ``yes``, gave no ``bind`` address (so the node listens on every
interface) and set no password. Then a client whose peer address is not loopback is
told why and how to open up (:data:`DENIED`), and disconnected; clients on loopback
are served as usual. Configuring any one of ``bind``, ``requirepass`` or
``protected-mode no`` is taken as the operator's decision and ends it.

The decision is made once per accepted connection (:class:`.clients.Acceptor`), never
per command. :func:`protected` reads the configuration as it is at that moment, so a
``CONFIG SET protected-mode no`` or ``CONFIG SET requirepass ...`` from a loopback client
opens the node for the next connection. When password-protected users arrive, "no
password" here becomes "the default user needs no password".
"""

from __future__ import annotations

import ipaddress
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from ..config import Config

__all__ = ["DENIED", "is_loopback", "protected", "refuse", "startup_note"]

#: The one line a refused client reads (an error reply, then the node closes the link).
DENIED = (
    b"-DENIED disque-py is running in protected mode: no bind address and no password are configured, "
    b"so it only serves clients connecting from this machine (loopback). To let this client in, do one of: "
    b"1) set a password with 'requirepass' and have clients AUTH; "
    b"2) list the addresses to listen on with 'bind' in disque.conf (and restart), as the operator's choice; "
    b"3) from a loopback client run CONFIG SET protected-mode no (and CONFIG REWRITE to keep it), "
    b"only if this port is not reachable from networks you do not trust; "
    b"4) start the node with --protected-mode no, with the same caution.\r\n"
)


def protected(config: "Config", acl: Any = None) -> bool:
    """True when non-loopback clients are to be refused (read at each accept): protected-mode is
    yes, no bind is configured, and the ``default`` user needs no password (no requirepass, and
    no ``user default`` line giving it one or turning it off; ``acl`` is the node's
    :class:`.acl.Acl`, when it has one)."""
    if not config.protected_mode or config.bind or config.requirepass:
        return False
    if acl is not None:
        default = acl.default
        return default.enabled and default.nopass
    return True


def is_loopback(peer: Any) -> bool:
    """Whether a peer address (``getpeername()``'s result) is on this machine.

    127.0.0.0/8, ``::1`` and IPv4-mapped loopback (``::ffff:127.0.0.1``) are; so is a
    unix socket (its peer is a path string, often empty). Anything unreadable is not.
    """
    if isinstance(peer, (str, bytes)):
        return True  # AF_UNIX
    try:
        host = peer[0]
        if isinstance(host, str) and "%" in host:
            host = host.partition("%")[0]  # fe80::1%eth0: the scope does not matter here
        ip = ipaddress.ip_address(host)
    except (TypeError, ValueError, IndexError):
        return False
    mapped = getattr(ip, "ipv4_mapped", None)
    if mapped is not None:
        ip = mapped
    return ip.is_loopback


def refuse(config: "Config", peer: Any, acl: Any = None) -> bool:
    """True when a connection from ``peer`` must be refused with :data:`DENIED`."""
    return protected(config, acl) and not is_loopback(peer)


def startup_note(config: "Config", acl: Any = None) -> str | None:
    """The line the node logs at start when protected mode is active, else None."""
    if not protected(config, acl):
        return None
    return (
        "Protected mode is on: no bind address and no requirepass are configured, so only clients on "
        "loopback (127.0.0.0/8, ::1) are served and any other client gets -DENIED. To serve other "
        "hosts, set requirepass, or bind, or (on a trusted network only) protected-mode no."
    )
