"""ADDJOB's groups as operators see them across the cluster, no I/O: each node's GROUP LIST
(``commands.group_list``'s dicts) merged by group name, the busiest first, the rest summed in
one row (a bounded number of rows: /api/groups of the admin page and ``disque-py top``)."""

from __future__ import annotations

from typing import Any, Iterable

__all__ = ["merge_groups", "OTHER"]

#: The name of the row that sums the groups past the limit.
OTHER = "_other"


def merge_groups(lists: Iterable[tuple[str, Any]], limit: int = 50) -> tuple[list[dict[str, Any]], bool]:
    """(node ID, that node's GROUP LIST as dicts) pairs -> (rows, whether some were summed).

    A row: ``name``, ``weight``, ``concurrency`` and ``rate`` (the cluster-wide settings: None
    without a limit), ``active`` and ``waiting`` summed over the nodes, ``held`` (at its limit on
    some node), ``nodes`` (node ID -> its active, waiting and share of each limit). Past ``limit``
    rows the others are summed in a last row named :data:`OTHER` (``groups``: how many)."""
    merged: dict[str, dict[str, Any]] = {}
    for node_id, entries in lists:
        if not isinstance(entries, list):
            continue
        for e in entries:
            if not isinstance(e, dict) or not isinstance(e.get("name"), str):
                continue
            row = merged.get(e["name"])
            if row is None:
                row = merged[e["name"]] = {"name": e["name"], "weight": e.get("weight") or 1,
                                           "concurrency": e.get("concurrency"), "rate": e.get("rate"),
                                           "active": 0, "waiting": 0, "held": False, "nodes": {}}  # fmt: skip
            row["active"] += int(e.get("active") or 0)
            row["waiting"] += int(e.get("waiting") or 0)
            row["held"] = row["held"] or bool(e.get("held"))
            row["nodes"][node_id] = {"active": e.get("active"), "waiting": e.get("waiting"),
                                     "share_concurrency": e.get("share-concurrency"),
                                     "share_rate": e.get("share-rate")}  # fmt: skip
    rows = sorted(merged.values(), key=lambda r: (-(r["active"] + r["waiting"]), r["name"]))
    if len(rows) <= limit:
        return rows, False
    rest = rows[limit:]
    other = {"name": OTHER, "weight": None, "concurrency": None, "rate": None,
             "active": sum(r["active"] for r in rest), "waiting": sum(r["waiting"] for r in rest),
             "held": any(r["held"] for r in rest), "nodes": {}, "groups": len(rest)}  # fmt: skip
    return rows[:limit] + [other], True
