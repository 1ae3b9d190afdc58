"""Operator-facing log lines, in the Redis/Disque shape.

    12345:M 21 Nov 2026 05:09:31.123 * Ready to accept connections on port 7711

The level character follows Redis: ``.`` debug, ``-`` verbose, ``*`` notice,
``#`` warning. ``loglevel`` names map onto Python logging levels.

Every shell module logs to ``log`` (the ``disque`` logger); a traceback
(``exc_info``) follows its line. The CLI calls :func:`setup_logging` before
the node starts; CONFIG SET loglevel calls :func:`set_level` (:mod:`.app`).
"""

from __future__ import annotations

import logging
import os
import sys
import time

LEVELS = {"debug": logging.DEBUG, "verbose": 15, "notice": logging.INFO, "warning": logging.WARNING}
_CHARS = {logging.DEBUG: ".", 15: "-", logging.INFO: "*", logging.WARNING: "#", logging.ERROR: "#", logging.CRITICAL: "#"}

logging.addLevelName(15, "VERBOSE")
log = logging.getLogger("disque")


class _Formatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        t = record.created
        stamp = time.strftime("%d %b %Y %H:%M:%S", time.localtime(t)) + ".%03d" % int((t % 1) * 1000)
        text = "%d:M %s %s %s" % (os.getpid(), stamp, _CHARS.get(record.levelno, "*"), record.getMessage())
        if record.exc_info:
            text += "\n" + self.formatException(record.exc_info)
        return text


def setup_logging(logfile: str, loglevel: str) -> None:
    handler: logging.Handler
    if logfile:
        handler = logging.FileHandler(logfile)
    else:
        handler = logging.StreamHandler(sys.stdout)
    handler.setFormatter(_Formatter())
    log.handlers[:] = [handler]
    log.propagate = False
    set_level(loglevel)


def set_level(loglevel: str) -> None:
    log.setLevel(LEVELS.get(loglevel, logging.INFO))
