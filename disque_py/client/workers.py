"""Live workers as operators see them: what ``WORKER LIST`` says, merged over the cluster.

A worker beats to the node its client uses (``worker/beacon.py``: ``WORKER BEAT``), so each
node knows only its own; a worker that failed over may still be listed, for a few seconds, by
the node it left. The programs ask every node ``WORKER LIST`` and merge by worker ID here,
keeping the freshest beat (:func:`merge`). No I/O: ``disque-py workers`` and ``top``
(``cli/``, sync connections) and the admin page (``web/api.py``, trio) read the replies with
the same code, and show the same fields (:meth:`WorkerView.as_json`).

What a worker sends (its *info*, a JSON object; docs/CLIENT.md, "Workers in plain sight") is
read leniently: a field missing or of the wrong type reads as empty, so that a worker of
another version, or another program speaking the command, is still listed.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

__all__ = ["RunningJob", "WorkerView", "parse_list", "from_entry", "merge", "age_text"]


def _int(value: Any) -> int:
    return value if isinstance(value, int) and not isinstance(value, bool) else 0


def _num(value: Any) -> float:
    return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else 0.0


def _str(value: Any) -> str:
    return value if isinstance(value, str) else ""


@dataclass(slots=True)
class RunningJob:
    """A job a worker runs: its ID, queue, when its handler started (the worker's clock, Unix
    seconds), the label the worker gives it (a task's name; empty for a plain handler) and its
    last progress report (``{"done", "total", "note"}``; None: none)."""

    id: str
    queue: str
    since: float
    label: str = ""
    progress: dict[str, Any] | None = None

    def as_json(self, now: float) -> dict[str, Any]:
        return {"id": self.id, "queue": self.queue, "since": self.since, "label": self.label,
                "running_for": round(max(0.0, now - self.since), 3) if self.since else None,
                "progress": self.progress}  # fmt: skip

    def progress_text(self) -> str:
        """``3/10 note``, ``3 note``, or empty: the progress for a table cell."""
        p = self.progress
        if not p:
            return ""
        done, total = p.get("done"), p.get("total")
        text = "%g/%g" % (done, total) if total is not None else "%g" % done
        note = p.get("note")
        return text + (" " + note if note else "")


@dataclass(slots=True)
class WorkerView:
    """One live worker: what it said of itself, and what the node that heard it last adds."""

    id: str
    host: str
    pid: int
    started: float  # Unix seconds
    version: str
    handler: str  # what it runs: "module:function", or the task app
    queues: list[str]
    concurrency: int
    max_in_flight: int
    interval: float  # seconds between its beats
    processed: int
    failed: int
    retried: int
    dead: int
    fetched: int
    in_flight: int
    stopping: bool
    running: list[RunningJob]
    running_total: int  # its running jobs (the list may be cut to fit a beat)
    node: str  # the ID of the node that heard its freshest beat
    addr: str  # the connection that beat came on, as that node saw it
    last_beat_ago: float  # seconds, when the node was asked
    nodes: list[str] = field(default_factory=list)  # every node that lists it

    def label_of(self, job: RunningJob) -> str:
        """What a running job is shown as: its label (a task's name), else the worker's handler."""
        return job.label or self.handler

    def as_json(self, now: float) -> dict[str, Any]:
        """The fields the programs and the admin API show (openapi.json's ``Worker``)."""
        return {
            "id": self.id, "host": self.host, "pid": self.pid, "started": self.started, "version": self.version,
            "handler": self.handler, "queues": self.queues, "concurrency": self.concurrency,
            "max_in_flight": self.max_in_flight, "interval": self.interval, "processed": self.processed,
            "failed": self.failed, "retried": self.retried, "dead": self.dead, "fetched": self.fetched,
            "in_flight": self.in_flight, "stopping": self.stopping,
            "running": [r.as_json(now) for r in self.running], "running_total": self.running_total,
            "node": self.node, "addr": self.addr, "last_beat_ago": self.last_beat_ago, "nodes": self.nodes,
        }  # fmt: skip


def _progress(value: Any) -> dict[str, Any] | None:
    """A running job's ``progress`` read leniently: ``done`` a number, ``total`` one or None,
    ``note`` a string or None; anything else reads as no progress."""
    if not isinstance(value, dict):
        return None
    done, total, note = value.get("done"), value.get("total"), value.get("note")
    if isinstance(done, bool) or not isinstance(done, (int, float)):
        return None
    if isinstance(total, bool) or not isinstance(total, (int, float)):
        total = None
    return {"done": done, "total": total, "note": note if isinstance(note, str) else None}


def parse_list(reply: Any) -> list[dict[str, Any]]:
    """WORKER LIST's reply (bulk strings of JSON) -> the entries; one that is not a JSON object
    is left out. Anything but a list (an error reply, a node without the command) -> []."""
    if not isinstance(reply, list):
        return []
    out = []
    for item in reply:
        try:
            entry = json.loads(item)
        except (TypeError, ValueError, RecursionError):
            continue
        if isinstance(entry, dict):
            out.append(entry)
    return out


def from_entry(entry: dict[str, Any], node_id: str) -> WorkerView | None:
    """One WORKER LIST entry, as ``node_id`` answered it (None without a worker ID)."""
    worker_id = _str(entry.get("id"))
    if not worker_id:
        return None
    info = entry.get("info")
    if not isinstance(info, dict):
        info = {}
    running = []
    listed = info.get("running")
    for item in listed if isinstance(listed, list) else ():
        if isinstance(item, dict) and _str(item.get("id")):
            running.append(RunningJob(_str(item.get("id")), _str(item.get("queue")), _num(item.get("since")),
                                      _str(item.get("label")), _progress(item.get("progress"))))  # fmt: skip
    queues = info.get("queues")
    return WorkerView(
        id=worker_id, host=_str(info.get("host")), pid=_int(info.get("pid")), started=_num(info.get("started")),
        version=_str(info.get("version")), handler=_str(info.get("handler")),
        queues=[q for q in queues if isinstance(q, str)] if isinstance(queues, list) else [],
        concurrency=_int(info.get("concurrency")), max_in_flight=_int(info.get("max_in_flight")),
        interval=_num(info.get("interval")) or _int(entry.get("interval_ms")) / 1000.0,
        processed=_int(info.get("processed")), failed=_int(info.get("failed")), retried=_int(info.get("retried")),
        dead=_int(info.get("dead")), fetched=_int(info.get("fetched")), in_flight=_int(info.get("in_flight")),
        stopping=info.get("stopping") is True, running=running,
        running_total=max(_int(info.get("running_total")), len(running)),
        node=node_id, addr=_str(entry.get("addr")), last_beat_ago=_num(entry.get("last_beat_ago")), nodes=[node_id],
    )  # fmt: skip


def merge(per_node: Iterable[tuple[str, Any]]) -> list[WorkerView]:
    """``(node ID, WORKER LIST reply)`` pairs -> one view per worker ID, from the node that heard
    its freshest beat, with every node that lists it; by host, then pid, then ID."""
    found: dict[str, WorkerView] = {}
    for node_id, reply in per_node:
        for entry in parse_list(reply):
            view = from_entry(entry, node_id)
            if view is None:
                continue
            seen = found.get(view.id)
            if seen is None:
                found[view.id] = view
                continue
            nodes = seen.nodes + [node_id]
            if view.last_beat_ago < seen.last_beat_ago:
                found[view.id] = seen = view
            seen.nodes = nodes
    return sorted(found.values(), key=lambda w: (w.host, w.pid, w.id))


def age_text(seconds: float | None) -> str:
    """``4s``, ``3m12s``, ``2h05m``, ``3d04h``: a duration for a table cell."""
    if seconds is None:
        return "-"
    s = int(max(0.0, seconds))
    if s < 60:
        return "%.1fs" % max(0.0, seconds) if seconds < 10 else "%ds" % s
    if s < 3600:
        return "%dm%02ds" % (s // 60, s % 60)
    if s < 86400:
        return "%dh%02dm" % (s // 3600, s % 3600 // 60)
    return "%dd%02dh" % (s // 86400, s % 86400 // 3600)
