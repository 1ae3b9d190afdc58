"""The options every program that talks to nodes shares, declared once.

``disque-py cli``, ``worker``, ``dead``, ``top`` and ``workers`` take the same words for where the
nodes are and how to log in, so that what works for one works for all:

* ``-h HOST`` and ``-p PORT`` name one node (redis-cli's words); ``-n/--nodes LIST`` names
  several (``host:port``, comma separated or the option repeated); with none of them,
  ``$DISQUE_NODES`` (the same list), else ``127.0.0.1:7711``. ``-h``/``-p`` and ``--nodes``
  together: that node first, then the list.
* ``-a/--password`` (or ``$DISQUE_PASSWORD``) and ``--user``: AUTH.
* ``--tls``, ``--cacert``, ``--cert``, ``--key``: TLS (a CA or a certificate implies ``--tls``).

:func:`node_options` adds them to a click command and hands the command one
:class:`NodeOptions` as its ``conn`` argument; :meth:`NodeOptions.addresses` parses the list.
"""

from __future__ import annotations

import functools
import os
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import click

__all__ = ["DEFAULT_NODE", "ENV_NODES", "ENV_PASSWORD", "NodeOptions", "node_options", "split_nodes"]

DEFAULT_NODE = "127.0.0.1:7711"
ENV_NODES = "DISQUE_NODES"
ENV_PASSWORD = "DISQUE_PASSWORD"


def split_nodes(items: tuple[str, ...] | list[str]) -> list[str]:
    """``("a:1,b:2", "c:3")`` -> ``["a:1", "b:2", "c:3"]`` (commas or spaces), each once, in order."""
    out = [part for item in items for part in item.replace(",", " ").split()]
    return list(dict.fromkeys(out))


@dataclass(frozen=True)
class NodeOptions:
    """Where the nodes are and how to log in, as the command line said (see the module docstring)."""

    nodes: tuple[str, ...]  #: node addresses as given (``host:port``, or a URL for the worker)
    source: str  #: which words gave them: "--nodes", "-h/-p", "$DISQUE_NODES" or "default"
    password: str | None = None
    username: str | None = None
    tls: bool = False
    cacert: str | None = None
    cert: str | None = None
    key: str | None = None

    @property
    def given(self) -> bool:
        """True when the command line or the environment named the nodes (not the default)."""
        return self.source != "default"

    @property
    def credentials_given(self) -> bool:
        return bool(self.password is not None or self.username or self.tls or self.cacert or self.cert or self.key)

    def addresses(self) -> list[tuple[str, int]]:
        """The nodes as (host, port), each once; click's BadParameter names a malformed one."""
        from ..client.cluster import parse_address

        out: list[tuple[str, int]] = []
        for item in self.nodes:
            try:
                address = parse_address(item)
            except ValueError as exc:
                raise click.BadParameter(str(exc), param_hint=_HINT[self.source]) from None
            if address not in out:
                out.append(address)
        return out

    def first(self) -> tuple[str, int]:
        return self.addresses()[0]


_HINT = {"--nodes": "--nodes", "-h/-p": "-h/-p", "$DISQUE_NODES": "$DISQUE_NODES", "default": "--nodes"}


def resolve(host: str | None, port: int | None, nodes: tuple[str, ...], environ: Any = os.environ) -> tuple[tuple[str, ...], str]:
    """The nodes and which words gave them: -h/-p and --nodes (both: that node first), else
    $DISQUE_NODES, else 127.0.0.1:7711."""
    listed = split_nodes(nodes)
    one: list[str] = []
    if host is not None or port is not None:
        h = host if host is not None else "127.0.0.1"
        one = ["[%s]:%d" % (h, port or 7711) if ":" in h and not h.startswith("[") else "%s:%d" % (h, port or 7711)]
    if one or listed:
        return tuple(dict.fromkeys(one + listed)), ("-h/-p" if one and not listed else "--nodes")
    env = split_nodes([environ.get(ENV_NODES, "")])
    if env:
        return tuple(env), "$DISQUE_NODES"
    return (DEFAULT_NODE,), "default"


def node_options(*, what: str = "the nodes") -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """A click decorator: the shared options, collected into one ``conn: NodeOptions`` argument.

    ``what`` words the help (e.g. "the node" for ``disque-py cli``)."""

    def decorate(command: Callable[..., Any]) -> Callable[..., Any]:
        @functools.wraps(command)
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            host, port, nodes = kwargs.pop("host"), kwargs.pop("port"), kwargs.pop("nodes")
            password, username = kwargs.pop("password"), kwargs.pop("username")
            tls, cacert, cert, key = kwargs.pop("tls"), kwargs.pop("cacert"), kwargs.pop("cert"), kwargs.pop("key")
            if username and password is None:
                raise click.BadParameter("--user needs --password (-a)", param_hint="--user")
            if key and not cert:
                raise click.BadParameter("--key needs --cert", param_hint="--key")
            listed, source = resolve(host, port, nodes)
            kwargs["conn"] = NodeOptions(listed, source, password, username, bool(tls or cacert or cert), cacert,
                                         cert, key)  # fmt: skip
            return command(*args, **kwargs)

        options = [
            click.option("-h", "--host", default=None, metavar="HOST",
                         help="A node's address (with -p) [default: 127.0.0.1, or $DISQUE_NODES]."),
            click.option("-p", "--port", default=None, type=click.IntRange(1, 65535), metavar="PORT",
                         help="A node's client port (its tls-port with --tls) [default: 7711]."),
            click.option("-n", "--nodes", multiple=True, metavar="HOST:PORT,...",
                         help="Nodes to talk to: comma separated, or the option repeated "
                              "[default: $DISQUE_NODES, else 127.0.0.1:7711]."),
            click.option("-a", "--password", default=None, envvar=ENV_PASSWORD,
                         help="Password (requirepass, or the --user's) to AUTH with [env DISQUE_PASSWORD]."),
            click.option("--user", "username", default=None, help="AUTH as this user (with --password)."),
            click.option("--tls", is_flag=True, help="Connect with TLS (give the nodes' tls-ports)."),
            click.option("--cacert", default=None, type=click.Path(dir_okay=False),
                         help="CA to check %s certificates with (implies --tls)."
                              % (what + ("'" if what.endswith("s") else "'s"))),
            click.option("--cert", default=None, type=click.Path(dir_okay=False),
                         help="Client certificate, for nodes with tls-auth-clients (implies --tls)."),
            click.option("--key", default=None, type=click.Path(dir_okay=False), help="Private key of --cert."),
        ]  # fmt: skip
        for option in reversed(options):
            wrapper = option(wrapper)
        return wrapper

    return decorate
