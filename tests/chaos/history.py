"""What happened in a chaos run, and the checker that judges it.

The workload and the nemesis append plain dicts to a :class:`History`
(saved as JSON lines when a run fails). Every job body is unique and says
how the job was added (``<run>:<producer>:<seq>:<flags>``, flags ``r0``
for RETRY 0 and ``a`` for ASYNC), so a delivery names its job even when the
ADDJOB reply never came back.

Events, by ``op``:

* ``add``: ``t0``/``t1`` (sent, answered), ``node``, ``body``, ``replicate``,
  ``retry``, ``async``, ``result`` (``ok`` with ``id``, ``error`` with
  ``error``, or ``unknown``: the link failed or timed out, the job may exist);
* ``get``: ``t``, ``node``, ``consumer``, ``id``, ``body``, ``action``
  (``ack``, ``fastack``, ``drop``: taken and never acknowledged, ``nack``);
* ``ack``: ``t``, ``node``, ``id``, ``ok`` (the ACKJOB/FASTACK reply came);
* ``nemesis``: ``t``, ``what``, ``nodes``, ``memory_lost`` (the nodes lost
  what they held: kill -9 without an AOF);
* ``phase``: ``t``, ``name`` (``start``, ``heal``, ``settled``, ``end``).

:func:`check` turns a history into a :class:`Report`, one table per run.
A job is **lost** when ADDJOB returned its ID and it was never delivered,
unless it may legally be gone: a RETRY 0 job (at most once), an ASYNC job
whose receiving node lost its memory before it was delivered, or a job
for which at least REPLICATE distinct nodes lost their memory after its
ADDJOB was sent (then every copy may have been on them). Fewer than that,
and some node still holds a copy: not delivering it is a loss. Jobs never
expire in a run (their TTL is far longer).

A delivery is a **duplicate** when an earlier delivery of the same job was
acknowledged by its consumer (ACKJOB or FASTACK sent); a redelivery after a
consumer dropped or NACKed the job is what was asked for, not a duplicate.

Jobs that fail (the workload's ``failing_pct``): ``add`` events carry the
job's ``maxdeliver``, ``get`` events the node's counted ``deliveries`` and,
for a dead letter, ``dead_of`` (the original's ID) and ``orig_deliveries``;
``getfail`` events (``t``, ``node``) are GETJOBs sent whose reply never came
(the node may have delivered jobs nobody saw). Then:

* a poison job (flag ``p``) is **lost** unless its dead letter was delivered
  (the loss excuses above apply); any other job is delivered or dead-lettered;
* a dead letter's ID is the one derived from its original's
  (``ids.dead_letter_id``): one dead letter per job, never two;
* **dead-lettered early**: the node counted fewer than MAXDELIVER deliveries
  (``orig_deliveries``), or the workload saw fewer, more fewer than the
  GETJOBs without a reply between the ADDJOB and the dead letter's delivery;
* a dead letter delivered again after an acknowledged delivery is a
  duplicate like any, allowed only when a fault came between the original's
  ADDJOB and that delivery (holders on both sides of a split may each make it).

Producers that retry (the workload's ``producer``, "retry" or "dedup"): one
``add`` event per job meant, with ``attempts``, ``nodes``, ``errors`` and,
for "dedup", its ``key``; a delivery under another ID than the one answered
is then allowed without a key (each try may have made a job). Then
(:func:`_check_producer_retries`): jobs never delivered, extra jobs made for
one key (must be 0 with keys), and deliveries after an acknowledged one of
jobs sent more than once, "whole" when no partition came between the first
ADDJOB and that delivery (must be 0 with keys).
"""

from __future__ import annotations

import json
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterable


class History:
    def __init__(self) -> None:
        self.events: list[dict[str, Any]] = []

    def add(self, **event: Any) -> dict[str, Any]:
        self.events.append(event)
        return event

    def save(self, path: Path) -> None:
        with open(path, "w") as f:
            for e in self.events:
                f.write(json.dumps(e, sort_keys=True) + "\n")

    @classmethod
    def load(cls, path: Path) -> "History":
        h = cls()
        with open(path) as f:
            h.events = [json.loads(line) for line in f if line.strip()]
        return h

    def of(self, op: str) -> list[dict[str, Any]]:
        return [e for e in self.events if e["op"] == op]

    def phase(self, name: str) -> float | None:
        for e in self.events:
            if e["op"] == "phase" and e["name"] == name:
                return e["t"]
        return None


def body_flags(body: str) -> set[str]:
    """The flags a body was made with (``r0``, ``a``)."""
    parts = body.split(":")
    return set(parts[3].split(",")) - {""} if len(parts) == 4 else set()


def _dead_letter_id(job_id: str) -> str:
    from disque_py.core.ids import dead_letter_id

    return dead_letter_id(job_id.encode()).decode()


@dataclass
class Report:
    attempted: int = 0
    acknowledged: int = 0
    add_errors: int = 0
    add_unknown: int = 0
    delivered_jobs: int = 0
    deliveries: int = 0
    lost: int = 0
    lost_excused: int = 0
    lost_async: int = 0
    retry0_jobs: int = 0
    retry0_undelivered: int = 0
    retry0_twice: int = 0
    duplicates: int = 0
    redeliveries_asked: int = 0
    unexpected: int = 0
    wrong_id: int = 0
    acked_left: int | None = None
    settle_s: float | None = None
    memory_losses: int = 0
    faults: int = 0
    failing: bool = False  # jobs that fail: the rows below are reported
    poison_jobs: int = 0
    dead_lettered: int = 0  # jobs whose dead letter was delivered
    dead_early: int = 0
    dead_early_excused: int = 0
    dead_wrong_id: int = 0
    dead_duplicates: int = 0
    dead_duplicates_unexcused: int = 0
    producer: str = "once"  # how producers met a failed ADDJOB (workload Options.producer)
    keys: int = 0  # jobs the producers meant to add (a key each in the "dedup" mode)
    add_attempts: int = 0  # ADDJOBs sent for them
    keys_retried: int = 0  # jobs sent more than once
    keys_undelivered: int = 0  # jobs never delivered, whatever ADDJOB answered
    keys_given_up: int = 0  # jobs a producer stopped trying without an ID
    extra_jobs: int = 0  # jobs made beyond the first for one key (distinct IDs delivered, less one)
    keys_extra: int = 0  # keys delivered under more than one ID
    retry_duplicates: int = 0  # deliveries after an acknowledged delivery, of jobs sent more than once
    retry_duplicates_whole: int = 0  # ... of which no partition came between the first ADDJOB and that delivery
    error_kinds: dict[str, int] = field(default_factory=lambda: defaultdict(int))  # ADDJOB errors by prefix
    examples: dict[str, list[str]] = field(default_factory=lambda: defaultdict(list))

    @property
    def duplicate_rate(self) -> float:
        return self.duplicates / self.acknowledged if self.acknowledged else 0.0

    @property
    def problems(self) -> list[str]:
        """What broke a promise (empty: the run is clean)."""
        out = []
        if self.lost:
            out.append("%d acknowledged jobs lost (e.g. %s)" % (self.lost, ", ".join(self.examples["lost"][:3])))
        if self.retry0_twice:
            out.append("%d RETRY 0 jobs delivered twice (e.g. %s)"
                       % (self.retry0_twice, ", ".join(self.examples["retry0_twice"][:3])))  # fmt: skip
        if self.unexpected:
            out.append("%d deliveries of jobs never attempted" % self.unexpected)
        if self.wrong_id:
            out.append("%d deliveries under another ID than ADDJOB returned" % self.wrong_id)
        if self.dead_early:
            out.append("%d jobs dead-lettered before their MAXDELIVER-th delivery (e.g. %s)"
                       % (self.dead_early, ", ".join(self.examples["dead_early"][:3])))  # fmt: skip
        if self.dead_wrong_id:
            out.append("%d dead letters under another ID than their original's (e.g. %s)"
                       % (self.dead_wrong_id, ", ".join(self.examples["dead_wrong_id"][:3])))  # fmt: skip
        if self.dead_duplicates_unexcused:
            out.append("%d dead letters delivered again with no fault to split their holders (e.g. %s)"
                       % (self.dead_duplicates_unexcused, ", ".join(self.examples["dead_duplicates"][:3])))  # fmt: skip
        if self.producer == "dedup" and self.extra_jobs:
            out.append("%d DEDUP keys delivered under more than one ID (e.g. %s)"
                       % (self.keys_extra, ", ".join(self.examples["keys_extra"][:3])))  # fmt: skip
        if self.producer == "dedup" and self.retry_duplicates_whole:
            out.append("%d deliveries of DEDUP keys sent twice delivered again with the network whole (e.g. %s)"
                       % (self.retry_duplicates_whole, ", ".join(self.examples["retry_duplicates_whole"][:3])))  # fmt: skip
        if self.acked_left:
            out.append("%d acknowledged jobs left on the nodes after settling" % self.acked_left)
        if self.acked_left is None or self.settle_s is None:
            out.append("the cluster did not settle")
        return out

    @property
    def ok(self) -> bool:
        return not self.problems

    def rows(self) -> list[tuple[str, str, str]]:
        def n(x: int | None) -> str:
            return "-" if x is None else "{:,}".format(x)

        return [
            ("attempted", n(self.attempted), ""),
            ("acknowledged by ADDJOB", n(self.acknowledged),
             "%s errors%s, %s no reply" % (n(self.add_errors), self._kinds(), n(self.add_unknown))),
            ("delivered (jobs / deliveries)", "%s / %s" % (n(self.delivered_jobs), n(self.deliveries)), ""),
            ("lost", n(self.lost), "must be 0"),
            ("  gone with their holders' memory", n(self.lost_excused + self.lost_async),
             "%s nodes lost memory; allowed" % n(self.memory_losses)),
            ("duplicated deliveries", n(self.duplicates), "%.3f %% of acknowledged jobs" % (100 * self.duplicate_rate)),
            ("  redeliveries asked for", n(self.redeliveries_asked), "after a drop or a NACK"),
            ("unexpected (never attempted)", n(self.unexpected + self.wrong_id), "must be 0"),
            ("RETRY 0 delivered twice", n(self.retry0_twice), "must be 0"),
            ("RETRY 0 never delivered", "%s of %s" % (n(self.retry0_undelivered), n(self.retry0_jobs)),
             "at most once allows it"),
            ("acked jobs left after settling", n(self.acked_left), "must be 0"),
            ("time to settle", "-" if self.settle_s is None else "%.1f s" % self.settle_s, "after the heal"),
        ] + ([
            ("poison jobs / dead-lettered jobs", "%s / %s" % (n(self.poison_jobs), n(self.dead_lettered)),
             "every poison job dead-lettered (else lost)"),
            ("dead-lettered early", n(self.dead_early),
             "must be 0; %s with unseen GETJOB replies" % n(self.dead_early_excused)),
            ("dead letters under a wrong ID", n(self.dead_wrong_id), "must be 0"),
            ("dead letters delivered again", n(self.dead_duplicates),
             "%s with no fault: must be 0" % n(self.dead_duplicates_unexcused)),
        ] if self.failing else []) + ([
            ("producer retries / jobs retried", "%s / %s" % (n(self.add_attempts - self.keys), n(self.keys_retried)),
             "%s: after every error, timeout, dropped link" % self.producer),
            ("jobs never delivered", n(self.keys_undelivered),
             "of %s meant; %s given up with no ID" % (n(self.keys), n(self.keys_given_up))),
            ("extra jobs made for one key", n(self.extra_jobs), "%s keys under 2+ IDs%s" % (
                n(self.keys_extra), "; must be 0" if self.producer == "dedup" else "")),
            ("duplicates of jobs retried", n(self.retry_duplicates), "%s with the network whole%s" % (
                n(self.retry_duplicates_whole), ": must be 0" if self.producer == "dedup" else "")),
        ] if self.producer != "once" else [("jobs never delivered", n(self.keys_undelivered),
                                            "of %s meant; no retry" % n(self.keys))])  # fmt: skip

    def _kinds(self) -> str:
        if not self.error_kinds:
            return ""
        top = sorted(self.error_kinds.items(), key=lambda kv: -kv[1])
        return " (%s)" % ", ".join("%s %d" % kv for kv in top)

    def table(self, title: str = "") -> str:
        rows = self.rows()
        w0 = max(len(r[0]) for r in rows)
        w1 = max(len(r[1]) for r in rows)
        lines = [title] if title else []
        lines += ["  %-*s  %*s  %s" % (w0, a, w1, b, c) for a, b, c in rows]
        lines.append("  verdict: " + ("clean" if self.ok else "FAILED: " + "; ".join(self.problems)))
        return "\n".join(lines)

    def as_dict(self) -> dict[str, Any]:
        d = {k: v for k, v in self.__dict__.items() if k != "examples"}
        d["error_kinds"] = dict(self.error_kinds)
        d["duplicate_rate"] = self.duplicate_rate
        d["ok"] = self.ok
        return d


def check(history: History, *, run_prefix: str, acked_left: int | None, settle_s: float | None) -> Report:
    """Judge a run (module docstring). ``acked_left`` and ``settle_s`` come from the settle phase (None:
    it did not settle)."""
    r = Report(acked_left=acked_left, settle_s=settle_s)
    adds = history.of("add")
    gets = history.of("get")
    losses = [e for e in history.of("nemesis") if e.get("memory_lost")]
    r.faults = len(history.of("nemesis"))
    r.memory_losses = sum(len(e["nodes"]) for e in losses)
    by_body: dict[str, dict[str, Any]] = {}
    for a in adds:
        r.attempted += 1
        by_body[a["body"]] = a
        if a["result"] == "ok":
            r.acknowledged += 1
        elif a["result"] == "error":
            r.add_errors += 1
            r.error_kinds[(a.get("error") or "?").split()[0]] += 1
        else:
            r.add_unknown += 1
    deliveries: dict[str, list[dict[str, Any]]] = defaultdict(list)
    dead: dict[str, list[dict[str, Any]]] = defaultdict(list)  # original's body -> its dead letter's deliveries
    for g in gets:
        r.deliveries += 1
        body = g["body"]
        a = by_body.get(body)
        if a is None or not body.startswith(run_prefix + ":"):
            r.unexpected += 1
            r.examples["unexpected"].append(body[:60])
            continue
        if g.get("dead_of") is not None:
            dead[body].append(g)
            continue
        # without a key, each try of a job retried may have made a job of its own
        if a["result"] == "ok" and a["id"] != g["id"] and ("key" in a or a.get("attempts", 1) == 1):
            r.wrong_id += 1
            r.examples["wrong_id"].append("%s %s!=%s" % (body, g["id"], a["id"]))
        deliveries[body].append(g)
    r.delivered_jobs = len(deliveries)
    for body, ds in deliveries.items():
        ds.sort(key=lambda g: g["t"])
        acked_before = False
        for i, g in enumerate(ds):
            if i:
                if acked_before:
                    r.duplicates += 1
                    r.examples["duplicates"].append(body)
                else:
                    r.redeliveries_asked += 1
            if g["action"] in ("ack", "fastack"):
                acked_before = True
        if by_body[body]["retry"] == 0 and len(ds) > 1:
            r.retry0_twice += 1
            r.examples["retry0_twice"].append(body)
    _check_dead_letters(r, history, by_body, deliveries, dead)
    _check_producer_retries(r, history, adds, deliveries)
    for a in adds:
        if a["retry"] == 0:
            r.retry0_jobs += 1
            if a["body"] not in deliveries:
                r.retry0_undelivered += 1
            continue
        if a["body"] in dead:
            continue  # dead-lettered: its dead letter was delivered
        poison = "p" in body_flags(a["body"])
        if a["result"] != "ok" or (a["body"] in deliveries and not poison):
            continue
        after = [e for e in losses if e["t"] >= a["t0"]]
        gone = {n for e in after for n in e["nodes"]}
        if a.get("async") and a["node"] in gone:
            r.lost_async += 1
        elif len(gone) >= a["replicate"]:
            r.lost_excused += 1
        else:
            r.lost += 1
            r.examples["lost"].append("%s (%s)" % (a["id"], a["body"]))
    return r


Deliveries = dict[str, list[dict[str, Any]]]  # a job's body -> its deliveries


def _split_times(history: History) -> list[tuple[float, float]]:
    """When the network was cut: (from, to) of every partition, the last one to the run's heal."""
    out = []
    start = None
    for e in history.events:
        if e["op"] == "nemesis" and e["what"] in ("partition", "partition-one"):
            start = e["t"]
        elif start is not None and ((e["op"] == "nemesis" and e["what"] == "heal") or
                                    (e["op"] == "phase" and e["name"] == "heal")):  # fmt: skip
            out.append((start, e["t"]))
            start = None
    if start is not None:
        out.append((start, float("inf")))
    return out


def _check_producer_retries(r: Report, history: History, adds: list[dict[str, Any]], deliveries: Deliveries) -> None:
    """Per job the producers meant to add (one ``add`` event each, its tries inside): never
    delivered, made more than once (distinct IDs delivered for it), delivered again after an
    acknowledged delivery when it was sent more than once (a duplicate its producer's retries may
    have caused; "whole" when no partition came between its first ADDJOB and that delivery)."""
    r.producer = next((("dedup" if "key" in a else "retry") for a in adds if "attempts" in a), "once")
    splits = _split_times(history)
    for a in adds:
        r.keys += 1
        tries = a.get("attempts", 1)
        r.add_attempts += tries
        ds = deliveries.get(a["body"], [])
        if not ds:
            r.keys_undelivered += 1
            if "attempts" in a and a["result"] != "ok":
                r.keys_given_up += 1
        ids = {g["id"] for g in ds}
        if len(ids) > 1:
            r.keys_extra += 1
            r.extra_jobs += len(ids) - 1
            r.examples["keys_extra"].append("%s (%s)" % (a["body"], " ".join(sorted(ids))))
        if tries < 2:
            continue
        r.keys_retried += 1
        acked_before = False
        for g in ds:  # in time order (check sorted them)
            if acked_before:
                r.retry_duplicates += 1
                if not any(s < g["t"] and e > a["t0"] for s, e in splits):
                    r.retry_duplicates_whole += 1
                    r.examples["retry_duplicates_whole"].append("%s %s" % (g["id"], a["body"]))
            if g["action"] in ("ack", "fastack"):
                acked_before = True


def _check_dead_letters(r: Report, history: History, by_body: dict[str, dict[str, Any]], deliveries: Deliveries,
                        dead: Deliveries) -> None:  # fmt: skip
    """The promises of jobs that fail (module docstring)."""
    r.failing = any("maxdeliver" in a for a in by_body.values())
    r.poison_jobs = sum(1 for a in by_body.values() if "p" in body_flags(a["body"]) and a["result"] == "ok")
    r.dead_lettered = len(dead)
    unseen = sorted(e["t"] for e in history.of("getfail"))
    nemeses = sorted(e["t"] for e in history.of("nemesis"))
    for body, ds in dead.items():
        ds.sort(key=lambda g: g["t"])
        a = by_body[body]
        original = ds[0]["dead_of"]
        if (a["result"] == "ok" and original != a["id"]) or any(
                g["dead_of"] != original or g["id"] != _dead_letter_id(original) for g in ds):  # fmt: skip
            r.dead_wrong_id += 1
            r.examples["dead_wrong_id"].append("%s (%s)" % (ds[0]["id"], body))
        n = a.get("maxdeliver") or 0
        first = ds[0]
        seen = sum(1 for g in deliveries.get(body, ()) if g["t"] <= first["t"])
        if min(g.get("orig_deliveries") or 0 for g in ds) < n:
            r.dead_early += 1
            r.examples["dead_early"].append("%s: the node counted %s of %d" % (body, first.get("orig_deliveries"), n))
        elif seen < n:
            blind = sum(1 for t in unseen if a["t0"] <= t <= first["t"])
            if n - seen <= blind:
                r.dead_early_excused += 1
            else:
                r.dead_early += 1
                r.examples["dead_early"].append("%s: delivered %d times of %d" % (body, seen, n))
        acked_before = False
        for i, g in enumerate(ds):
            if i and acked_before:
                r.dead_duplicates += 1
                if not any(a["t0"] <= t <= g["t"] for t in nemeses):
                    r.dead_duplicates_unexcused += 1
                    r.examples["dead_duplicates"].append(g["id"])
            if g["action"] in ("ack", "fastack"):
                acked_before = True


def merge_counts(reports: Iterable[Report]) -> dict[str, int]:
    """Sums over several runs (the soak's running counts)."""
    total: dict[str, int] = defaultdict(int)
    for rep in reports:
        for k in ("attempted", "acknowledged", "deliveries", "lost", "duplicates", "retry0_twice", "unexpected"):
            total[k] += getattr(rep, k)
    return dict(total)
