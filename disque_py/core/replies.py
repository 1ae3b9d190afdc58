"""Reply values: what the core answers, before anything is encoded.

The core never writes bytes to a socket; it returns Python values and the
protocol layer (:mod:`disque_py.protocol.resp`) turns them into RESP2:

=====================  =========================================
Python value           RESP
=====================  =========================================
``Status(b"OK")``      simple string ``+OK``
``Error("ERR ...")``   error ``-ERR ...`` (prefix included)
``int`` / ``bool``     integer ``:<n>``
``bytes`` / ``str``    bulk string (str is UTF-8 encoded)
``None``               null bulk ``$-1``
``NULL_ARRAY``         null array ``*-1`` (GETJOB timeout, QSTAT miss)
``list`` / ``tuple``   array, items encoded recursively
=====================  =========================================

Errors carry their Disque prefix (``NOREPL``, ``MAXLEN``, ``PAUSED``,
``LEAVING``, ``NOJOB``, ``BADID``, ``TOOLATE``, ``NOAUTH``, ``ERR``...) as
the first word, exactly as a client sees it after the ``-``.
"""

from __future__ import annotations

__all__ = ["Status", "Error", "NullArray", "NULL_ARRAY", "OK", "err"]


class Status(bytes):
    """A simple-string reply (``+...``). Must not contain CR or LF."""

    __slots__ = ()


class Error(str):
    """An error reply (``-...``); the text starts with the error prefix."""

    __slots__ = ()

    @property
    def prefix(self) -> str:
        return self.split(" ", 1)[0]


class NullArray:
    """The RESP2 null multi-bulk (``*-1``)."""

    __slots__ = ()
    _instance: "NullArray | None" = None

    def __new__(cls) -> "NullArray":
        if cls._instance is None:
            cls._instance = super().__new__(cls)
        return cls._instance

    def __repr__(self) -> str:
        return "NULL_ARRAY"


NULL_ARRAY = NullArray()
OK = Status(b"OK")


def err(text: str) -> Error:
    """``err("syntax error")`` -> ``Error("ERR syntax error")``."""
    return Error("ERR " + text)


def shown(word: bytes, limit: int = 40) -> str:
    """A client's argument as an error line may quote it: printable ASCII kept, any other
    byte as ``\\xHH`` (so no CR or LF can end the line early), cut at ``limit`` characters."""
    text = "".join(chr(b) if 0x20 <= b < 0x7F and b != 0x5C else "\\x%02x" % b for b in word[: limit + 1])
    return text[:limit] + "..." if len(text) > limit else text


def syntax_error(word: bytes, why: str = "") -> Error:
    """``ERR syntax error near 'RETY'``: Redis's prefix and text, then the argument it stopped
    at (and, with ``why``, what was wrong there), so that a typo is found without the docs."""
    return Error("ERR syntax error near '%s'%s" % (shown(word), ": " + why if why else ""))
