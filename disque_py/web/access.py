"""Who may use the admin port: HTTP Basic auth against the node's users, and the rights asked.

* With no password anywhere (the ``default`` user is on and ``nopass``) a request
  without credentials is the ``default`` user, as a client that never sends AUTH.
* Otherwise a request needs ``Authorization: Basic`` with ``user:password`` (checked by
  :meth:`Acl.authenticate`), or any user name and the ``requirepass`` password (the
  ``default`` user, as ``AUTH <password>``). Else 401 with a ``WWW-Authenticate``
  challenge. ``/healthz`` needs nothing.
* Reading (``/metrics``, ``/readyz`` details, ``GET /api/...``) needs every command of
  the ``@inspect`` category; an action needs the right to its command, checked by the
  dispatcher as for a client (the command runs as that user).

The user found is returned with the credentials, which the node passes on (AUTH) when it
asks its peers for the cluster views.
"""

from __future__ import annotations

import base64
import binascii
from dataclasses import dataclass
from typing import Any

__all__ = ["Caller", "authenticate", "may_read", "INSPECT"]

#: What reading needs: the commands of @inspect (server/acl.py CATEGORIES["inspect"]).
INSPECT = frozenset({"qlen", "qstat", "qpeek", "show", "qscan", "jscan", "info"})


@dataclass(frozen=True, slots=True)
class Caller:
    user: Any  # acl.User
    credentials: tuple[bytes, bytes] | None  # (user name, password) to pass on to peers


def _basic(header: str | None) -> tuple[bytes, bytes] | None:
    if not header:
        return None
    scheme, _, value = header.partition(" ")
    if scheme.lower() != "basic":
        return None
    try:
        raw = base64.b64decode(value.strip(), validate=True)
    except (binascii.Error, ValueError):
        return None
    name, sep, password = raw.partition(b":")
    if not sep:
        return None
    return name, password


def authenticate(acl: Any, header: str | None) -> Caller | None:
    """The caller of a request with this ``Authorization`` header, or None (401)."""
    creds = _basic(header)
    if creds is None:
        if acl.default_open:
            return Caller(acl.default, None)
        return None
    name, password = creds
    user = acl.authenticate(name, password) if name else None
    if user is not None:
        return Caller(user, creds)
    default = acl.default
    if default.enabled and default.passwords and acl.authenticate(b"default", password) is not None:
        return Caller(default, (b"default", password))
    if not name and acl.default_open:  # an empty user name and no password configured
        return Caller(default, None)
    return None


def may_read(user: Any) -> bool:
    return INSPECT <= user.commands
