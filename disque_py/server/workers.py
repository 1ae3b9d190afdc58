"""The workers a node hears from: the WORKER command, a part of the shell.

A worker (``client/worker/beacon.py``) says every few seconds who it is and what it is doing,
``WORKER BEAT <worker-id> <interval-ms> <info-json>``, to the node its client uses. The node
keeps the last word of each (:class:`WorkerTable`), so that ``disque-py workers``, ``top`` and
the admin page can list the live workers of a cluster by asking every node ``WORKER LIST``.

* ``WORKER BEAT id interval-ms info``: registers or refreshes ``id``. ``info`` is a JSON object
  (UTF-8, at most :data:`MAX_INFO` bytes; NaN and Infinity refused), kept as sent. The entry
  lives :data:`MISSED_BEATS` intervals after its last beat: a worker killed with -9 drops off
  by itself. ``+OK``.
* ``WORKER FORGET id``: a clean stop drops at once; ``:1``, or ``:0`` for an unknown ID.
* ``WORKER LIST``: one JSON object per live worker (a bulk string each), the node's own view
  around what the worker sent: ``{"id", "addr" (the connection the last beat came on),
  "client_id", "interval_ms", "last_beat_ago" (seconds), "beats", "info": {...}}``.
* ``WORKER HELP``.

Nothing of it is journaled or replicated: a worker beats again within its interval, to
whichever node its client uses then. Entries past their time are dropped when the table is
listed or counted and by the cron every second (:meth:`WorkerTable.expire`); a node that
hears from no worker pays nothing. At most :data:`MAX_WORKERS` entries, so the table holds
at most ``MAX_WORKERS * MAX_INFO`` bytes of info (160 MiB) whatever its clients send.

Rights (``server/acl.py``): BEAT and FORGET are a consumer's (``@consume``), LIST is
inspecting (``@inspect``, as INFO). INFO's ``# Clients`` section shows ``connected_workers``
and ``/metrics`` the gauges ``disque_workers`` and ``disque_worker_jobs_running``
(docs/CLIENT.md, "Workers in plain sight"; docs/OBSERVABILITY.md).

Composed by :mod:`.app` (its :data:`COMMANDS` bound to the table, the cron's second calls
:meth:`WorkerTable.expire`); it imports no other part of the shell.
"""

from __future__ import annotations

from typing import Any, Callable

from ..core.commandspec import ALWAYS, CommandSpec
from ..core.replies import OK, Status, err, shown
from .contracts import now_ms

__all__ = ["COMMANDS", "WorkerTable", "MAX_INFO", "MAX_WORKERS", "MAX_ID", "MISSED_BEATS", "MIN_INTERVAL_MS",
           "MAX_INTERVAL_MS"]  # fmt: skip

#: The longest info a BEAT may carry, in bytes.
MAX_INFO = 16 * 1024
#: The most workers one node keeps; a BEAT of a new one past it is refused.
MAX_WORKERS = 10_000
#: The longest worker ID, in bytes (printable ASCII without spaces, as a client name).
MAX_ID = 256
#: A worker silent for this many of its intervals drops off.
MISSED_BEATS = 3
#: The interval a BEAT may announce, in ms: beats faster than 10 a second tell nothing more.
MIN_INTERVAL_MS = 100
MAX_INTERVAL_MS = 86_400_000

_CONSUME = ("consume",)

#: The command this part answers (core/commandspec.py); ``server/app.py`` binds it to the table.
COMMANDS = (
    CommandSpec(b"worker", "cmd_worker", -2, ("readonly", "fast"), _CONSUME, subcommands=(
        ("beat", _CONSUME), ("forget", _CONSUME), ("list", ("inspect",)), ("help", ALWAYS),
    ), syntax="WORKER BEAT worker-id interval-ms info-json | FORGET worker-id | LIST | HELP",
       summary="The live workers: their beats (gone 3 intervals after the last), goodbyes, the list",
       group="workers", since="disque-py 0.1.0"),
)  # fmt: skip

HELP = [
    b"WORKER <subcommand> [<arg> ...]. Subcommands are:",
    b"BEAT <worker-id> <interval-ms> <info-json>",
    b"    Register or refresh a worker; it drops off after 3 intervals without a beat.",
    b"FORGET <worker-id>",
    b"    Drop a worker now (it stopped cleanly).",
    b"LIST",
    b"    The live workers this node hears from, one JSON object each.",
    b"HELP",
    b"    Print this help.",
]


def _reject_constant(name: str) -> Any:
    raise ValueError("%s is not JSON" % name)


class _Entry:
    """One worker as the node last heard of it."""

    __slots__ = ("id", "interval_ms", "info", "running", "last", "expires", "addr", "client_id", "beats")

    def __init__(self, worker_id: str) -> None:
        self.id = worker_id
        self.interval_ms = 0
        self.info = b"{}"  # the JSON object, as sent (checked)
        self.running = 0  # the length of its "running" list, for the gauge
        self.last = 0  # now_ms() of the last beat
        self.expires = 0
        self.addr = ""
        self.client_id = 0
        self.beats = 0


class WorkerTable:
    """The live workers of one node and the WORKER command (see the module docstring).

    ``clock``: ms, the shell's (:func:`.contracts.now_ms`); tests give their own."""

    def __init__(self, clock: Callable[[], int] = now_ms) -> None:
        self.clock = clock
        self.entries: dict[str, _Entry] = {}

    # ------------------------------------------------------------ reads (INFO, /metrics, the cron)
    def expire(self, now: int | None = None) -> int:
        """Drop the entries past their time; how many went."""
        entries = self.entries
        if not entries:
            return 0
        now = self.clock() if now is None else now
        gone = [key for key, e in entries.items() if e.expires <= now]
        for key in gone:
            del entries[key]
        return len(gone)

    def count(self) -> int:
        """Live workers (INFO ``connected_workers``, ``disque_workers``)."""
        self.expire()
        return len(self.entries)

    def running(self) -> int:
        """Jobs the live workers said they run (``disque_worker_jobs_running``)."""
        self.expire()
        return sum(e.running for e in self.entries.values())

    # ------------------------------------------------------------ the command
    def cmd_worker(self, conn: Any, argv: list[bytes]) -> Any:
        """WORKER BEAT | FORGET | LIST | HELP (COMMANDS)."""
        sub = argv[1].lower()
        n = len(argv)
        if sub == b"beat" and n == 5:
            return self.beat(conn, argv[2], argv[3], argv[4])
        if sub == b"forget" and n == 3:
            return int(self.entries.pop(argv[2].decode("latin-1"), None) is not None)
        if sub == b"list" and n == 2:
            return self.listing()
        if sub == b"help" and n == 2:
            return [Status(line) for line in HELP]
        return err("unknown subcommand or wrong number of arguments for '%s'. Try WORKER HELP." % shown(argv[1]))

    def beat(self, conn: Any, raw_id: bytes, raw_interval: bytes, info: bytes) -> Any:
        if not 0 < len(raw_id) <= MAX_ID or any(c <= 32 or c >= 127 for c in raw_id):
            return err("invalid worker ID '%s': 1 to %d printable characters, no spaces" % (shown(raw_id), MAX_ID))
        try:
            interval = int(raw_interval)
        except ValueError:
            interval = -1
        if not MIN_INTERVAL_MS <= interval <= MAX_INTERVAL_MS:
            return err("invalid interval '%s': milliseconds between %d and %d"
                       % (shown(raw_interval), MIN_INTERVAL_MS, MAX_INTERVAL_MS))  # fmt: skip
        if len(info) > MAX_INFO:
            return err("worker info too large: %d bytes, at most %d" % (len(info), MAX_INFO))
        import json  # at the first beat: a node no worker talks to does not load it

        try:
            obj = json.loads(info.decode("utf-8"), parse_constant=_reject_constant)
        except (UnicodeDecodeError, ValueError, RecursionError) as exc:
            return err("worker info is not JSON: %s" % str(exc).splitlines()[0][:100])
        if not isinstance(obj, dict):
            return err("worker info must be a JSON object")
        worker_id = raw_id.decode("ascii")
        entries = self.entries
        now = self.clock()
        entry = entries.get(worker_id)
        if entry is None:
            if len(entries) >= MAX_WORKERS and (self.expire(now) == 0 or len(entries) >= MAX_WORKERS):
                return err("too many workers: this node keeps %d at most" % MAX_WORKERS)
            entry = entries[worker_id] = _Entry(worker_id)
        running = obj.get("running")
        entry.interval_ms = interval
        entry.info = info
        entry.running = len(running) if isinstance(running, list) else 0
        entry.last = now
        entry.expires = now + MISSED_BEATS * interval
        entry.addr = getattr(conn, "addr", "")
        entry.client_id = getattr(conn, "id", 0)
        entry.beats += 1
        return OK

    def listing(self) -> list[bytes]:
        """WORKER LIST's reply: one JSON object per live worker, longest known first."""
        import json

        now = self.clock()
        self.expire(now)
        out = []
        for e in self.entries.values():
            head = json.dumps({
                "id": e.id, "addr": e.addr, "client_id": e.client_id, "interval_ms": e.interval_ms,
                "last_beat_ago": round((now - e.last) / 1000.0, 3), "beats": e.beats,
            }, separators=(",", ":"))  # fmt: skip
            out.append(head[:-1].encode() + b',"info":' + e.info + b"}")
        return out
