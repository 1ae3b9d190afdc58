"""``disque-py server``: run one node in the foreground, from a config file and ``--name value``
directives, until SIGTERM or SHUTDOWN. Reached from :func:`disque_py.cli.main` without click (a
start is what a restart waits for) and from the click command of the same name; it imports
nothing before it needs it.
"""

from __future__ import annotations

import gc
import signal
import sys
from typing import NoReturn


def _fail(message: str) -> NoReturn:
    print(message, file=sys.stderr, flush=True)
    sys.exit(1)


def serve(args: tuple[str, ...] | list[str]) -> None:
    """Run one node in the foreground with ``args`` (an optional config file, then directives) until
    SIGTERM or SHUTDOWN; a bad argument or config exits 1 with the reason on stderr."""
    # The node's imports (trio, the core, the bus: about 50k objects) make next to no garbage:
    # the collector stays off through them, and run_node's policy (server/gcpolicy.py) turns it on.
    gc.disable()
    from ..util.quickimport import import_trio

    trio = import_trio()  # without the ldconfig subprocess trio's import runs (util/quickimport.py)

    from ..config import ConfigError, load_config
    from ..server.app import run_node
    from ..server.logs import setup_logging

    path = None
    rest = list(args)
    # where an option may start: first, or after the config file (later words may be values, "-1" or not)
    heads = rest[:1] if not rest or rest[0].startswith("-") else rest[1:2]
    short = next((a for a in heads if len(a) >= 2 and a[0] == "-" and a[1] != "-" and not _is_number(a)), None)
    if short is not None:  # directives are --name value, as redis-server's: no one-letter options
        hint = _SHORT_HINTS.get(short[:2], "write directives as --name value, e.g. --port 7711")
        _fail("Unknown option '%s': disque-py server takes a config file and/or directives as --name "
              "value; %s" % (short, hint))  # fmt: skip
    if rest and not rest[0].startswith("--"):
        path = rest.pop(0)
    try:
        cfg = load_config(path, rest)
    except ConfigError as exc:
        _fail("*** FATAL CONFIG FILE ERROR ***\n%s" % exc)
    except OSError as exc:
        _fail("Fatal error, can't open config file '%s': %s" % (path, exc.strerror))
    if cfg.admin_port:  # the admin HTTP port is an extra: say so before anything starts
        from ..util.extras import install_hint

        hint = install_hint("admin", "admin-port")
        if hint:
            _fail("Fatal: %s (or leave admin-port at 0)" % hint)
    setup_logging(cfg.resolve_path(cfg.logfile) if cfg.logfile else "", cfg.loglevel, cfg.log_format)
    # As Disque: a closed terminal (SIGHUP) must not take the node and its jobs with it.
    signal.signal(signal.SIGHUP, signal.SIG_IGN)
    try:
        try:
            trio.run(run_node, cfg)
        except* OSError as group:  # e.g. a port already in use: say it plainly, exit 1
            from ..server.logs import log

            for exc in group.exceptions:
                log.warning("Fatal: %s", exc.strerror if isinstance(exc, OSError) and exc.strerror else exc)
            sys.exit(1)
    except KeyboardInterrupt:
        pass


_SHORT_HINTS = {
    "-p": "did you mean --port?",
    "-h": "did you mean --bind? (--help for help)",
    "-a": "did you mean --requirepass?",
    "-c": "give the config file as the first argument, without an option",
}


def _is_number(arg: str) -> bool:
    try:
        float(arg)
    except ValueError:
        return False
    return True
