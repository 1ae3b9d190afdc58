"""The optional parts of disque-py and what each needs installed.

``pip install disque-py`` gives the client, the worker, the CLI and a node; three parts
need more, installed as extras:

* ``admin``: the admin HTTP port of a node (``admin-port``: the web page, /metrics,
  the JSON API): hypercorn, starlette, prometheus-client;
* ``top``: ``disque-py top``'s live tables: rich (``top --once --json`` needs nothing);
* ``otel``: the tasks' traces (opentelemetry-api), imported by ``tasks.tracing`` alone, when
  an app first sends or runs a task; without it, traces are off.

:func:`missing` says which of an extra's modules cannot be found, without importing them
(the CLI asks before it starts a node with an admin port, or ``top``'s tables), and
:func:`install_hint` is the line that tells the operator what to install. A leaf: imports
nothing of disque_py.
"""

from __future__ import annotations

import importlib.util

__all__ = ["EXTRAS", "missing", "install_hint"]

#: extra -> the top-level modules it brings (import names, not distribution names)
EXTRAS: dict[str, tuple[str, ...]] = {
    "admin": ("hypercorn", "starlette", "prometheus_client"),
    "top": ("rich",),
    "otel": ("opentelemetry",),
}


def missing(extra: str) -> list[str]:
    """The modules of ``extra`` that this interpreter cannot import (none: all are there)."""
    out = []
    for name in EXTRAS[extra]:
        try:
            found = importlib.util.find_spec(name) is not None
        except (ImportError, ValueError):  # an import hook refusing it, or a half-imported module
            found = False
        if not found:
            out.append(name)
    return out


def install_hint(extra: str, what: str) -> str | None:
    """None when ``extra`` is installed; else one line for the operator: ``what`` needs it, and how
    to install it."""
    gone = missing(extra)
    if not gone:
        return None
    return "%s needs the '%s' extra, which is not installed (no %s): pip install 'disque-py[%s]'" % (
        what, extra, ", ".join(gone), extra)  # fmt: skip
