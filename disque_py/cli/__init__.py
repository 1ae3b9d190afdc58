"""The ``disque-py`` entry point: ``disque-py server`` starts a node; every other command (and
``--help`` anywhere) goes through the click command line, :mod:`disque_py.cli.app`.

    disque-py server [disque.conf] [--port 7712 --loglevel verbose ...]
    disque-py cli|cluster|check-aof|gen-certs|top|dead|worker|workers ...   (see disque_py/cli/app.py)

A node's start is what a restart after kill -9 waits for, so the server's path imports neither
click (some 15-20 ms) nor anything else a node does not use: its arguments are a config file and
``--name value`` directives, which the config loader parses, and nothing more
(:func:`disque_py.cli.server.serve`). The click command ``disque-py server`` (for ``--help`` and for
callers of the click group) runs the same function.
"""

from __future__ import annotations

import sys


def main() -> None:
    """The console script and ``python -m disque_py.cli``: the server's short path, or the click group."""
    args = sys.argv[1:]
    if args[:1] == ["server"] and "--help" not in args and "--" not in args:
        from .server import serve

        serve(args[1:])
        return
    from .app import main as commands

    commands()


if __name__ == "__main__":  # pragma: no cover
    main()
