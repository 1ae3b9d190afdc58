"""Operator-facing log lines, in the Redis/Disque shape or as JSON.

    12345:M 21 Nov 2026 05:09:31.123 * Ready to accept connections on port 7711

The level character follows Redis: ``.`` debug, ``-`` verbose, ``*`` notice,
``#`` warning. ``loglevel`` names map onto Python logging levels.

With ``log-format json`` each line is one JSON object instead (python-json-logger)::

    {"timestamp": "2026-11-21T05:09:31.123+00:00", "level": "notice", "message": "Ready ...",
     "pid": 12345, "role": "node", "node_id": "5a1f..."}

``level`` uses the ``loglevel`` names (``warning`` for errors too); a traceback
goes into ``exc_info`` of the same object; ``node_id`` appears once the node
knows its ID (:func:`set_node_id`).

Every shell module logs to ``log`` (the ``disque`` logger); a traceback
(``exc_info``) follows its line. The CLI calls :func:`setup_logging` before
the node starts; CONFIG SET loglevel calls :func:`set_level` and CONFIG SET
log-format :func:`set_format` (:mod:`.app`).
"""

from __future__ import annotations

import logging
import os
import sys
import time
from typing import Any

LEVELS = {"debug": logging.DEBUG, "verbose": 15, "notice": logging.INFO, "warning": logging.WARNING}
_CHARS = {logging.DEBUG: ".", 15: "-", logging.INFO: "*", logging.WARNING: "#", logging.ERROR: "#", logging.CRITICAL: "#"}
_NAMES = {logging.DEBUG: "debug", 15: "verbose", logging.INFO: "notice", logging.WARNING: "warning",
          logging.ERROR: "warning", logging.CRITICAL: "warning"}  # fmt: skip
FORMATS = ("text", "json")

logging.addLevelName(15, "VERBOSE")
log = logging.getLogger("disque")

_node_id = ""  # put into JSON lines once known


class _Formatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        t = record.created
        stamp = time.strftime("%d %b %Y %H:%M:%S", time.localtime(t)) + ".%03d" % int((t % 1) * 1000)
        text = "%d:M %s %s %s" % (os.getpid(), stamp, _CHARS.get(record.levelno, "*"), record.getMessage())
        if record.exc_info:
            text += "\n" + self.formatException(record.exc_info)
        return text


def _json_formatter() -> logging.Formatter:
    """One JSON object per record: timestamp (ISO 8601, UTC), level, message, pid, role, node_id.

    The class is made on first use: a node that logs text does not import python-json-logger."""
    global _JsonFormatter
    if _JsonFormatter is None:
        import datetime

        from pythonjsonlogger.json import JsonFormatter

        class JsonLines(JsonFormatter):
            def __init__(self) -> None:
                super().__init__("%(message)s", json_ensure_ascii=False)

            def add_fields(self, log_data: dict[str, Any], record: logging.LogRecord,
                           message_dict: dict[str, Any]) -> None:  # fmt: skip
                log_data["timestamp"] = datetime.datetime.fromtimestamp(
                    record.created, datetime.timezone.utc).isoformat(timespec="milliseconds")  # fmt: skip
                log_data["level"] = _NAMES.get(record.levelno, "notice")
                super().add_fields(log_data, record, message_dict)
                log_data["pid"] = os.getpid()
                log_data["role"] = "node"
                if _node_id:
                    log_data["node_id"] = _node_id

        _JsonFormatter = JsonLines
    return _JsonFormatter()


_JsonFormatter: Any = None


def _formatter(fmt: str) -> logging.Formatter:
    return _json_formatter() if fmt == "json" else _Formatter()


def setup_logging(logfile: str, loglevel: str, fmt: str = "text") -> None:
    handler: logging.Handler
    if logfile:
        handler = logging.FileHandler(logfile)
    else:
        handler = logging.StreamHandler(sys.stdout)
    handler.setFormatter(_formatter(fmt))
    log.handlers[:] = [handler]
    log.propagate = False
    set_level(loglevel)


def set_level(loglevel: str) -> None:
    log.setLevel(LEVELS.get(loglevel, logging.INFO))


def set_format(fmt: str) -> None:
    """``log-format``: ``text`` (Redis's shape) or ``json``, for every handler from the next line."""
    for handler in log.handlers:
        handler.setFormatter(_formatter(fmt))


def set_node_id(node_id: str) -> None:
    global _node_id
    _node_id = node_id
