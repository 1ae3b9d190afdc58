"""The JSON API's views: the node asked assembles the cluster-wide answers.

Local answers run in process: commands go through the node's dispatcher as an internal
connection authenticated as the caller (``NodeHandle.run_command``: the same command
code, ACL checks, effects and AOF journaling as a client's), and the queue listing reads
the core's queue table directly (one pass, no command per queue). Peers are asked over
their client ports (``NodeHandle.ask_peer``: RESP, AUTH with the caller's credentials,
one pipelined batch per peer, all peers at once, :data:`PEER_TIMEOUT` each); a peer that
does not answer in time is shown as unreachable with the error, never waited for longer.

Actions (pause, ack, nack, dequeue) are the commands clients use: ``PAUSE q mode BCAST``
here, ``ACKJOB`` here (it spreads through the cluster as a client's does), ``NACK`` and
``DEQUEUE`` on every node that holds the job. Dead letters (list, show, requeue, purge) are
``deadletters.py``'s steps, the ones ``disque-py dead`` runs, driven here over the same asks.
"""

from __future__ import annotations

import base64
import heapq
import json
import operator
import time
from typing import Any, Callable

import trio
from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from ..client import commands as cmd
from ..client import consumers as cs
from ..client import deadletters
from ..client import drain as dr
from ..client import workers as wk
from ..client.groups import merge_groups
from ..core.ids import valid_job_id
from ..core.queues import PAUSE_NAMES, PAUSED_ALL
from ..core.replies import Error, NullArray, Status
from .access import Caller
from .handle import NodeHandle, Peer, split_queues

__all__ = ["ApiError", "readiness", "cluster", "queues", "queue", "pause", "job_get", "job_action", "dead_queues",
           "dead_queue", "dead_action", "workers", "consumers", "PEER_TIMEOUT"]

#: Longest wait for one peer's answers (connect included), in seconds.
PEER_TIMEOUT = 1.5
DEFAULT_LIMIT = 500
MAX_LIMIT = 100_000
#: Queues read from one peer at most (QSTAT each, pipelined).
PEER_QUEUES_MAX = 20_000
LOCAL_KEEP_MIN = 1000  # this node's queues made into rows at least (the longest), see _local_queue_rows
_JOBS = operator.attrgetter("jobs")
PEEK_JOBS = 10
#: INFO's names: used_memory is the estimate of the node's data that maxmemory is checked against,
#: used_memory_rss the process's resident set size (the page labels them "data (estimate)" and "RSS").
_INFO_FIELDS = (
    "registered_jobs", "registered_queues", "connected_clients", "blocked_clients", "used_memory",
    "used_memory_rss", "uptime_in_seconds", "jobs_added", "jobs_delivered", "jobs_acked",
)  # fmt: skip


class ApiError(Exception):
    def __init__(self, status: int, text: str) -> None:
        super().__init__(text)
        self.status = status
        self.text = text


class CommandError(Exception):
    """An error reply (local or a peer's)."""


# ---------------------------------------------------------------- helpers
def _text(value: Any) -> str:
    if isinstance(value, (bytes, bytearray)):
        return bytes(value).decode("utf-8", "replace")
    return str(value)


def norm(value: Any) -> Any:
    """A reply value as plain Python: bytes, int, None, lists; an error reply raises."""
    if isinstance(value, Error):
        raise CommandError(str(value))
    if isinstance(value, Exception):
        raise CommandError(str(value))
    if isinstance(value, NullArray):
        return None
    if isinstance(value, Status):
        return bytes(value)
    if isinstance(value, str):
        return value.encode()
    if isinstance(value, list):
        return [norm(v) for v in value]
    if isinstance(value, dict):
        return [x for k, v in value.items() for x in (norm(k), norm(v))]
    return value


def _pairs(reply: list) -> dict[str, Any]:
    return {_text(reply[i]): reply[i + 1] for i in range(0, len(reply) - 1, 2)}


def _int(value: Any) -> int:
    try:
        return int(value)
    except (TypeError, ValueError):
        return 0


def parse_info(text: Any) -> dict[str, str]:
    out = {}
    for line in _text(text).splitlines():
        if line and not line.startswith("#") and ":" in line:
            k, _, v = line.partition(":")
            out[k] = v
    return out


def _caller_user(caller: Caller) -> Any:
    return caller.user


def run_local(h: NodeHandle, caller: Caller, argvs: list[list[bytes]]) -> list[Any]:
    """Commands on this node, in process, as the caller; replies (errors as exception values)."""
    out: list[Any] = []
    for argv in argvs:
        try:
            out.append(norm(h.run_command(argv, caller.user)))
        except CommandError as exc:
            out.append(exc)
    return out


async def ask(h: NodeHandle, caller: Caller, peer: Peer, argvs: list[list[bytes]]) -> list[Any]:
    """Commands on ``peer`` (this node: in process); raises on a connection problem or timeout."""
    if "myself" in peer.flags:
        return run_local(h, caller, argvs)
    with trio.fail_after(PEER_TIMEOUT):
        replies = await h.ask_peer(peer.ip, peer.port, argvs, caller.credentials)
    out = []
    for r in replies:
        try:
            out.append(norm(r))
        except CommandError as exc:
            out.append(exc)
    return out


async def ask_all(h: NodeHandle, caller: Caller, peers: list[Peer], argvs_of) -> dict[str, Any]:
    """``argvs_of(peer)``'s commands on every peer at once: node id -> replies or the exception."""
    results: dict[str, Any] = {}

    async def one(peer: Peer) -> None:
        try:
            results[peer.id] = await ask(h, caller, peer, argvs_of(peer))
        except trio.TooSlowError:
            results[peer.id] = ConnectionError("no answer in %.1f s" % PEER_TIMEOUT)
        except Exception as exc:  # noqa: BLE001 - any failure of one peer is shown, not raised
            results[peer.id] = exc

    async with trio.open_nursery() as nursery:
        for peer in peers:
            nursery.start_soon(one, peer)
    return results


def _members(h: NodeHandle) -> list[Peer]:
    """Nodes to ask: every known node but those in handshake or without an address."""
    return [p for p in h.peers() if "handshake" not in p.flags and "noaddr" not in p.flags]


def _json(value: Any, status: int = 200) -> Response:
    return JSONResponse(value, status_code=status)


# ---------------------------------------------------------------- readiness
def readiness(h: NodeHandle) -> tuple[bool, str]:
    if h.loading():
        return False, "loading the AOF"
    if h.node.ctx.leaving:
        return False, "leaving the cluster"
    peers = [p for p in h.peers() if "myself" not in p.flags and "handshake" not in p.flags]
    if peers and not any(p.connected and not ({"pfail", "fail"} & set(p.flags)) for p in peers):
        return False, "no reachable peer"
    return True, ""


# ---------------------------------------------------------------- cluster
async def cluster(request: Request, h: NodeHandle, caller: Caller) -> Response:
    peers = _members(h)
    answers = await ask_all(h, caller, peers, lambda p: [[b"INFO", b"all"], [b"CONFIG", b"GET", b"admin-port"]])
    myself = h.node.id
    nodes = []
    for p in h.peers():
        if "handshake" in p.flags:
            continue
        got = answers.get(p.id)
        info = None
        err = None
        admin_port = None
        if isinstance(got, list):
            if isinstance(got[0], Exception):
                err = str(got[0])
            else:
                fields = parse_info(got[0])
                info = {k: _int(fields.get(k)) for k in _INFO_FIELDS}
            if isinstance(got[1], list) and len(got[1]) == 2:
                admin_port = _int(got[1][1]) or None
        elif got is not None:
            err = str(got) or type(got).__name__
        else:
            err = "no address"
        if p.id == myself:
            admin_port = int(getattr(h.config, "admin_port", 0) or 0) or None
        nodes.append({
            "id": p.id,
            "ip": p.ip,
            "port": p.port,
            "admin_port": admin_port,
            "flags": list(p.flags),
            "link": "connected" if p.connected else "disconnected",
            "leaving": "leaving" in p.flags,
            "reachable": info is not None,
            "info": info,
            "error": err,
        })  # fmt: skip
    return _json({"myself": myself, "time": time.time(), "nodes": nodes})


# ---------------------------------------------------------------- queues
def _local_queue_rows(h: NodeHandle, caller: Caller, limit: int, internal: bool) -> tuple[list[dict[str, Any]], bool]:
    """This node's queues as rows; past ``max(2 * limit, LOCAL_KEEP_MIN)`` queues only the longest
    ones (picked in C, as /metrics does: a row per queue cost 3 us, 300 ms for 100k queues, and the
    page asks every second), and then the answer says it was cut. The cluster's own queues (``@``
    names) only with ``internal``, as QSCAN's ALL."""
    node = h.node
    now = node.ctx.now
    user = caller.user
    queues = list(node.queues.values()) if internal else split_queues(node.queues)[0]
    if not user.allkeys:
        queues = [q for q in queues if user.may_use(q.name)]
    keep = max(2 * limit, LOCAL_KEEP_MIN)
    cut = len(queues) > keep
    if cut:
        lens = list(map(len, map(_JOBS, queues)))
        queues = [queues[i] for i in heapq.nlargest(keep, range(len(queues)), key=lens.__getitem__)]
    rows = []
    for q in queues:
        rows.append({
            "name": q.name,
            "len": len(q.jobs),
            "blocked": q.blocked,
            "jobs_in": q.jobs_in,
            "jobs_out": q.jobs_out,
            "import_rate": q.import_rate(now) if q.sources else 0,
            "paused": PAUSE_NAMES[q.flags & PAUSED_ALL],
        })  # fmt: skip
    return rows, cut


def _stat_row(stat: dict[str, Any]) -> dict[str, Any]:
    return {
        "name": stat.get("name", b""),
        "len": _int(stat.get("len")),
        "blocked": _int(stat.get("blocked")),
        "jobs_in": _int(stat.get("jobs-in")),
        "jobs_out": _int(stat.get("jobs-out")),
        "import_rate": _int(stat.get("import-rate")),
        "paused": _text(stat.get("pause", b"none")),
    }


async def _peer_queue_rows(h: NodeHandle, caller: Caller, peer: Peer,
                           internal: bool) -> tuple[list[dict[str, Any]], bool]:  # fmt: skip
    """A peer's queues: QSCAN BUSYLOOP (ALL with ``internal``) for the names, then QSTAT of each
    (pipelined)."""
    scan = [b"QSCAN", b"BUSYLOOP", b"COUNT", b"1000"] + ([b"ALL"] if internal else [])
    reply = await ask(h, caller, peer, [scan])
    scan = reply[0]
    if isinstance(scan, Exception):
        raise scan
    names = scan[1] if isinstance(scan, list) and len(scan) == 2 else []
    truncated = len(names) > PEER_QUEUES_MAX
    names = names[:PEER_QUEUES_MAX]
    if not names:
        return [], truncated
    stats = await ask(h, caller, peer, [[b"QSTAT", n] for n in names])
    rows = []
    for stat in stats:
        if isinstance(stat, list):
            rows.append(_stat_row(_pairs(stat)))
    return rows, truncated


_PAUSE_BITS = {name: flags for flags, name in enumerate(PAUSE_NAMES)}


def _merge(per_node: dict[str, list[dict[str, Any]]]) -> dict[bytes, dict[str, Any]]:
    merged: dict[bytes, dict[str, Any]] = {}
    for node_id, rows in per_node.items():
        for row in rows:
            name = row["name"]
            m = merged.get(name)
            if m is None:
                m = merged[name] = {"name": name, "len": 0, "blocked": 0, "jobs_in": 0, "jobs_out": 0,
                                    "import_rate": 0, "_pause": 0, "nodes": {}}  # fmt: skip
            for k in ("len", "blocked", "jobs_in", "jobs_out", "import_rate"):
                m[k] += row[k]
            m["_pause"] |= _PAUSE_BITS.get(row["paused"], 0)
            m["nodes"][node_id] = {k: row[k] for k in ("len", "blocked", "jobs_in", "jobs_out", "paused")}
    return merged


def _public(m: dict[str, Any]) -> dict[str, Any]:
    out = {k: v for k, v in m.items() if not k.startswith("_")}
    out["name"] = _text(m["name"])
    out["paused"] = PAUSE_NAMES[m["_pause"]]
    return out


async def _gather_rows(h: NodeHandle, caller: Caller, limit: int, internal: bool) -> tuple[dict[str, list], bool]:
    per_node: dict[str, list] = {}
    truncated = False
    myself = h.node.id

    async def one(peer: Peer) -> None:
        nonlocal truncated
        if peer.id == myself:
            per_node[peer.id], cut = _local_queue_rows(h, caller, limit, internal)
            truncated = truncated or cut
            return
        try:
            with trio.fail_after(PEER_TIMEOUT * 2):
                rows, cut = await _peer_queue_rows(h, caller, peer, internal)
        except Exception:  # noqa: BLE001 - an unreachable peer adds nothing (the cluster view says why)
            return
        per_node[peer.id] = rows
        truncated = truncated or cut

    async with trio.open_nursery() as nursery:
        for peer in _members(h):
            nursery.start_soon(one, peer)
    return per_node, truncated


def _limit(request: Request) -> int:
    raw = request.query_params.get("limit")
    if raw is None:
        return DEFAULT_LIMIT
    try:
        limit = int(raw)
    except ValueError:
        raise ApiError(400, "limit must be an integer") from None
    if limit < 1 or limit > MAX_LIMIT:
        raise ApiError(400, "limit must be between 1 and %d" % MAX_LIMIT)
    return limit


def _all(request: Request) -> bool:
    """``?all=1``: the cluster's own queues (``@`` names, tasks' results) too."""
    raw = request.query_params.get("all")
    if raw is None or raw in ("0", "false"):
        return False
    if raw in ("1", "true"):
        return True
    raise ApiError(400, "all must be 1 or 0 (or true or false)")


async def queues(request: Request, h: NodeHandle, caller: Caller) -> Response:
    limit = _limit(request)
    per_node, truncated = await _gather_rows(h, caller, limit, _all(request))
    merged = list(_merge(per_node).values())
    merged.sort(key=lambda m: (-m["len"], m["name"]))
    if len(merged) > limit:
        truncated = True
        merged = merged[:limit]
    return _json({"time": time.time(), "truncated": truncated, "queues": [_public(m) for m in merged]})


def _queue_name(request: Request) -> bytes:
    name = request.path_params["name"]
    if not name:
        raise ApiError(400, "a queue name is needed")
    return name.encode("utf-8", "surrogateescape")


async def queue(request: Request, h: NodeHandle, caller: Caller) -> Response:
    name = _queue_name(request)
    peers = _members(h)
    answers = await ask_all(h, caller, peers, lambda p: [[b"QSTAT", name], [b"QPEEK", name, b"%d" % PEEK_JOBS]])
    per_node: dict[str, list] = {}
    age = None
    idle = None
    import_from: list[str] = []
    jobs: list[dict[str, Any]] = []
    seen: set[bytes] = set()
    denied = None
    order = sorted(answers, key=lambda nid: nid != h.node.id)  # this node's jobs first
    for node_id in order:
        got = answers[node_id]
        if not isinstance(got, list):
            continue
        stat, peek = got
        if isinstance(stat, Exception):
            if "NOPERM" in str(stat):
                denied = str(stat)
            continue
        if not isinstance(stat, list):
            continue
        fields = _pairs(stat)
        per_node[node_id] = [_stat_row(fields)]
        a, i = _int(fields.get("age")), _int(fields.get("idle"))
        age = a if age is None else max(age, a)
        idle = i if idle is None else min(idle, i)
        for src in fields.get("import-from") or []:
            src = _text(src)
            if src not in import_from:
                import_from.append(src)
        if isinstance(peek, list):
            for item in peek:
                if len(jobs) >= PEEK_JOBS:
                    break
                if isinstance(item, list) and len(item) == 3 and item[1] not in seen:
                    seen.add(item[1])
                    jobs.append({"id": _text(item[1]), **_body(item[2])})
    if denied and not per_node:
        raise ApiError(403, denied)
    merged = _merge(per_node)
    if name not in merged:
        raise ApiError(404, "no node knows the queue")
    out = _public(merged[name])
    out.update({"age": age or 0, "idle": idle or 0, "import_from": import_from, "jobs": jobs})
    return _json(out)


async def _json_body(request: Request) -> dict[str, Any]:
    raw = await request.body()
    if len(raw) > 65536:
        raise ApiError(413, "request body too large")
    try:
        body = json.loads(raw or b"{}")
    except (ValueError, UnicodeDecodeError):
        raise ApiError(400, "the request body is not JSON") from None
    if not isinstance(body, dict):
        raise ApiError(400, "the request body must be a JSON object")
    return body


def _check(reply: Any) -> Any:
    if isinstance(reply, Exception):
        text = str(reply)
        status = 403 if text.startswith(("NOPERM", "NOAUTH")) else 400
        raise ApiError(status, text)
    return reply


async def pause(request: Request, h: NodeHandle, caller: Caller) -> Response:
    name = _queue_name(request)
    body = await _json_body(request)
    mode = body.get("mode")
    if mode not in PAUSE_NAMES:
        raise ApiError(400, "mode must be one of none, in, out, all")
    reply = _check(run_local(h, caller, [[b"PAUSE", name, mode.encode(), b"BCAST"]])[0])
    return _json({"name": _text(name), "paused": _text(reply)})


# ---------------------------------------------------------------- jobs
def _body(body: Any) -> dict[str, str]:
    raw = body if isinstance(body, (bytes, bytearray)) else _text(body).encode()
    try:
        return {"body": bytes(raw).decode("utf-8"), "body_encoding": "utf-8"}
    except UnicodeDecodeError:
        return {"body": base64.b64encode(raw).decode("ascii"), "body_encoding": "base64"}


def _job_id(rest: str, actions: tuple[str, ...] = ()) -> tuple[bytes, str]:
    """The job ID of a path (IDs may hold '/', so the fixed length splits it) and the action."""
    raw = rest.encode("utf-8", "surrogateescape")
    job_id, tail = raw[:40], raw[40:].decode("utf-8", "replace")
    action = tail[1:] if tail.startswith("/") else tail
    if actions:
        if action not in actions:
            raise ApiError(404, "not found")
    elif action:
        raise ApiError(404, "not found")
    if not valid_job_id(job_id):
        raise ApiError(400, "malformed job ID")
    return job_id, action


def _show_object(reply: list, node_id: str) -> dict[str, Any]:
    f = _pairs(reply)
    out = {
        "id": _text(f.get("id")),
        "queue": _text(f.get("queue")),
        "state": _text(f.get("state")),
        "repl": _int(f.get("repl")),
        "ttl": _int(f.get("ttl")),
        "ctime": _int(f.get("ctime")),
        "delay": _int(f.get("delay")),
        "retry": _int(f.get("retry")),
        "nacks": _int(f.get("nacks")),
        "additional_deliveries": _int(f.get("additional-deliveries")),
        "nodes_delivered": [_text(n) for n in f.get("nodes-delivered") or []],
        "nodes_confirmed": [_text(n) for n in f.get("nodes-confirmed") or []],
        "next_requeue_within": f.get("next-requeue-within"),
        "next_awake_within": f.get("next-awake-within"),
        # ADDJOB's DEDUP key (null for a job without one)
        "dedup": _text(f["dedup"]) if f.get("dedup") is not None else None,
    }  # fmt: skip
    out.update(_body(f.get("body", b"")))
    out["node"] = node_id
    return out


async def _holders(h: NodeHandle, caller: Caller, job_id: bytes) -> dict[str, Any]:
    """node id -> its SHOW reply, for every node that holds the job (this one asked first)."""
    local = run_local(h, caller, [[b"SHOW", job_id]])[0]
    if isinstance(local, Exception):
        _check(local)
    found: dict[str, Any] = {}
    if isinstance(local, list):
        found[h.node.id] = local
    others = [p for p in _members(h) if "myself" not in p.flags]
    answers = await ask_all(h, caller, others, lambda p: [[b"SHOW", job_id]])
    for node_id, got in answers.items():
        if isinstance(got, list) and isinstance(got[0], list):
            found[node_id] = got[0]
    return found


async def job_get(request: Request, h: NodeHandle, caller: Caller) -> Response:
    job_id, _ = _job_id(request.path_params["rest"])
    local = _check(run_local(h, caller, [[b"SHOW", job_id]])[0])
    if isinstance(local, list):
        return _json(_show_object(local, h.node.id))
    others = [p for p in _members(h) if "myself" not in p.flags]
    answers = await ask_all(h, caller, others, lambda p: [[b"SHOW", job_id]])
    for node_id, got in answers.items():
        if isinstance(got, list) and isinstance(got[0], list):
            return _json(_show_object(got[0], node_id))
    raise ApiError(404, "no node knows the job")


_ACTIONS = {"ack": b"ACKJOB", "nack": b"NACK", "dequeue": b"DEQUEUE"}


async def job_action(request: Request, h: NodeHandle, caller: Caller) -> Response:
    job_id, action = _job_id(request.path_params["rest"], tuple(_ACTIONS))
    command = _ACTIONS[action]
    holders = await _holders(h, caller, job_id)
    if not holders:
        raise ApiError(404, "no node knows the job")
    myself = h.node.id
    if action == "ack":
        # One ACKJOB spreads the acknowledgement through the cluster; run it where the job is
        # known (here if this node holds it).
        targets = [myself] if myself in holders else [next(iter(holders))]
    else:
        targets = list(holders)
    peers = {p.id: p for p in _members(h)}
    result = 0
    for node_id in targets:
        peer = peers.get(node_id)
        if peer is None:
            continue
        try:
            reply = (await ask(h, caller, peer, [[command, job_id]]))[0]
        except trio.TooSlowError:
            raise ApiError(504, "node %s did not answer" % node_id[:8]) from None
        except Exception as exc:  # noqa: BLE001
            raise ApiError(502, "node %s: %s" % (node_id[:8], exc)) from None
        result += _int(_check(reply))
    return _json({"id": _text(job_id), "action": action, "result": result})


# ---------------------------------------------------------------- workers
def _each_node(answers: dict[str, Any],
               parse: Callable[[Any], Any]) -> tuple[list[tuple[str, Any]], list[dict[str, str]]]:
    """``ask_all``'s answers to one command: (node ID, parsed reply) for each node that answered,
    and the unreachable ones with their error; an ApiError 403 when every answer was a refusal
    of the caller's rights (NOPERM, NOAUTH)."""
    lists: list[tuple[str, Any]] = []
    unreachable: list[dict[str, str]] = []
    for node_id, got in answers.items():
        reply = got[0] if isinstance(got, list) else got
        if isinstance(reply, Exception):
            unreachable.append({"id": node_id, "error": str(reply) or type(reply).__name__})
        else:
            lists.append((node_id, parse(reply)))
    denied = [u["error"] for u in unreachable if u["error"].startswith(("NOPERM", "NOAUTH"))]
    if denied and not lists:
        raise ApiError(403, denied[0])
    return lists, unreachable


async def workers(request: Request, h: NodeHandle, caller: Caller) -> Response:
    """Every node's WORKER LIST, merged by worker ID (client/workers.py, as `disque-py workers`)."""
    answers = await ask_all(h, caller, _members(h), lambda p: [[b"WORKER", b"LIST"]])
    lists, unreachable = _each_node(answers, lambda reply: reply)
    now = time.time()
    found = wk.merge(lists)
    return _json({"time": now, "workers": [w.as_json(now) for w in found], "unreachable": unreachable})


async def groups(request: Request, h: NodeHandle, caller: Caller) -> Response:
    """Every node's GROUP LIST, merged by group (client/groups.py, as `disque-py top`): the
    ``limit`` busiest groups, the rest summed in one ``_other`` row."""
    limit = _limit(request)
    # each node is asked for more than the view shows, so that the rows merged are the cluster's
    # busiest and the _other row sums what the nodes have beyond them (up to that many each)
    asked = b"%d" % max(100, 4 * limit)
    answers = await ask_all(h, caller, _members(h), lambda p: [[b"GROUP", b"LIST", b"COUNT", asked]])
    lists, unreachable = _each_node(answers, cmd.group_list().parse)
    rows, truncated = merge_groups(lists, limit)
    return _json({"time": time.time(), "truncated": truncated, "groups": rows, "unreachable": unreachable})


# ---------------------------------------------------------------- stream consumers
async def consumers(request: Request, h: NodeHandle, caller: Caller) -> Response:
    """Stream consumers (Spark queries) by the names of their connections in every node's
    CLIENT LIST, each with its lag: its queues' jobs queued on every node (QLEN) and the age of
    the oldest of them (QPEEK and SHOW's ctime of each queue's head), client/consumers.py. The
    queues are measured only when some consumer is connected: a cluster without one is asked
    CLIENT LIST and nothing more."""
    peers = _members(h)
    answers = await ask_all(h, caller, peers, lambda p: [[b"CLIENT", b"LIST"]])
    lists, unreachable = _each_node(answers, lambda reply: reply)
    found = cs.merge(lists)
    queues, truncated = cs.measured(found)
    if queues:
        answered = {node_id for node_id, _ in lists}
        firsts = await ask_all(h, caller, [p for p in peers if p.id in answered], lambda p: cs.lag_argvs(queues))
        lens: dict[str, int] = {}
        heads: dict[str, dict[str, bytes]] = {}
        for node_id, replies in firsts.items():
            if isinstance(replies, list):
                node_lens, heads[node_id] = cs.lag_heads(queues, replies)
                for q, n in node_lens.items():
                    lens[q] = lens.get(q, 0) + n
        shows = await ask_all(h, caller, [p for p in peers if heads.get(p.id)],
                              lambda p: [[b"SHOW", i] for i in heads[p.id].values()])  # fmt: skip
        oldest: dict[str, int] = {}
        for node_id, replies in shows.items():
            if not isinstance(replies, list):
                continue
            for q, reply in zip(heads[node_id], replies):
                ms = cs.oldest_ms(reply)
                if ms is not None:
                    oldest[q] = min(oldest.get(q, ms), ms)
        cs.settle(found, lens, oldest, int(time.time() * 1000))
    return _json({"time": time.time(), "truncated": truncated, "consumers": [c.as_json() for c in found],
                  "unreachable": unreachable})  # fmt: skip


# ---------------------------------------------------------------- dead letters
# The steps are deadletters.py's, shared with `disque-py dead`; here they are driven over
# ``ask`` (this node in process, peers on their client ports).
async def _drive(h: NodeHandle, caller: Caller, peer: Peer, steps: Any) -> Any:
    try:
        argvs = next(steps)
        while True:
            argvs = steps.send(await ask(h, caller, peer, argvs))
    except StopIteration as stop:
        return stop.value


async def _dead_letters(h: NodeHandle, caller: Caller, queue: bytes | None) -> tuple[dict[str, Any], list[dict[str, str]]]:
    """Every node's dead letters (of ``queue``), merged by job ID; and the nodes that could not say."""
    found: list[list[Any]] = []
    unreachable: list[dict[str, str]] = []

    async def one(peer: Peer) -> None:
        try:
            found.append(await _drive(h, caller, peer, deadletters.scan(queue, peer.id)))
        except trio.TooSlowError:
            unreachable.append({"id": peer.id, "error": "no answer in %.1f s" % PEER_TIMEOUT})
        except Exception as exc:  # noqa: BLE001 - one node's failure is shown, not raised
            unreachable.append({"id": peer.id, "error": str(exc) or type(exc).__name__})

    async with trio.open_nursery() as nursery:
        for peer in _members(h):
            nursery.start_soon(one, peer)
    denied = [u["error"] for u in unreachable if u["error"].startswith(("NOPERM", "NOAUTH"))]
    if denied:
        raise ApiError(403, denied[0])
    return deadletters.merge(found), unreachable


async def dead_queues(request: Request, h: NodeHandle, caller: Caller) -> Response:
    found, unreachable = await _dead_letters(h, caller, None)
    now = time.time()
    queues = [q.as_json(now) for q in deadletters.summarize(found.values())]
    return _json({"time": now, "queues": queues, "unreachable": unreachable})


async def dead_queue(request: Request, h: NodeHandle, caller: Caller) -> Response:
    name = _queue_name(request)
    limit = _limit(request)
    found, unreachable = await _dead_letters(h, caller, name)
    now = time.time()
    jobs = deadletters.sort_jobs(found.values())
    return _json({"time": now, "name": _text(name), "count": len(jobs), "truncated": len(jobs) > limit,
                  "jobs": [j.as_json(now) for j in jobs[:limit]], "unreachable": unreachable})  # fmt: skip


_DEAD_ACTIONS = {"requeue": deadletters.requeue_steps, "purge": deadletters.purge_steps}


async def dead_action(request: Request, h: NodeHandle, caller: Caller) -> Response:
    """POST /api/dead/{name}/requeue|purge with ``{"ids": [...]}`` or ``{"all": true}``."""
    action = request.url.path.rsplit("/", 1)[-1]
    steps_of = _DEAD_ACTIONS.get(action)
    if steps_of is None:
        raise ApiError(404, "not found")
    name = _queue_name(request)
    body = await _json_body(request)
    ids = body.get("ids")
    every = body.get("all") is True
    if every == (ids is not None):
        raise ApiError(400, 'give "ids" (a list of job IDs) or "all": true')
    if ids is not None and (not isinstance(ids, list) or not ids or not all(isinstance(i, str) for i in ids)):
        raise ApiError(400, '"ids" must be a non-empty list of job IDs')
    found, unreachable = await _dead_letters(h, caller, name)
    if every:
        chosen = deadletters.sort_jobs(found.values())
    else:
        missing = [i for i in ids if i not in found]
        if missing:
            raise ApiError(404, "not a dead letter of %s: %s" % (_text(name), ", ".join(missing[:10])))
        chosen = [found[i] for i in dict.fromkeys(ids)]
    peers = {p.id: p for p in _members(h)}
    done: list[str] = []
    errors: dict[str, str] = {}
    requeued_as: dict[str, str] = {}
    for node_id, held in deadletters.by_node(chosen).items():
        for batch in deadletters.chunks(held):
            peer = peers.get(node_id)
            try:
                if peer is None:
                    raise ConnectionError("node %s is not in the node table any more" % node_id[:8])
                got = await _drive(h, caller, peer, steps_of(batch))
            except trio.TooSlowError:
                got = deadletters.StepResult(errors={d.id: "node %s did not answer" % node_id[:8] for d in batch})
            except Exception as exc:  # noqa: BLE001 - said per job, the others go on
                got = deadletters.StepResult(errors={d.id: "node %s: %s" % (node_id[:8], exc) for d in batch})
            done += got.done
            errors.update(got.errors)
            requeued_as.update((k, v) for k, v in got.new_ids.items() if k in got.done)
    return _json({"name": _text(name), "action": action, "done": len(done), "ids": done, "errors": errors,
                  "requeued_as": requeued_as, "unreachable": unreachable})  # fmt: skip


# ---------------------------------------------------------------- drain
# client/drain.py's steps, shared with `disque-py drain`, one round per call: the caller polls
# (the page, a script) until ``done``. What a drain remembers across rounds (the moves not
# confirmed yet) is kept here, per draining node, until it is done.
_DRAINS: dict[str, dr.Drain] = {}


def _node_named(h: NodeHandle, wanted: str) -> Peer:
    """The member whose ID is ``wanted``, or starts with it (8 characters at least)."""
    found = [p for p in _members(h) if p.id == wanted or (len(wanted) >= 8 and p.id.startswith(wanted))]
    if len(found) != 1:
        raise ApiError(404, "no node %s in the node table" % wanted if not found else "node %s is ambiguous" % wanted)
    return found[0]


async def drain_node(request: Request, h: NodeHandle, caller: Caller) -> Response:
    """POST /api/nodes/{id}/drain: CLUSTER LEAVING yes on the node, then one round of its drain
    (its queued jobs moved to other nodes, earlier moves confirmed); ``done`` once it holds nothing."""
    node = _node_named(h, request.path_params["id"])
    try:
        _check((await ask(h, caller, node, [[b"CLUSTER", b"LEAVING", b"yes"]]))[0])
    except trio.TooSlowError:
        raise ApiError(504, "node %s did not answer" % node.id[:8]) from None
    except ApiError:
        raise
    except Exception as exc:  # noqa: BLE001
        raise ApiError(502, "node %s: %s" % (node.id[:8], exc)) from None
    peers = {p.id: p for p in _members(h)}
    targets = [p.id for p in peers.values()
               if p.id != node.id and not {"leaving", "fail", "pfail", "handshake"} & set(p.flags)]  # fmt: skip
    d = _DRAINS.get(node.id)
    if d is None:
        d = _DRAINS[node.id] = dr.Drain(node.id, targets)
    else:
        d.peers = targets
    steps = dr.round_steps(d)
    try:
        at, argvs = next(steps)
        while True:
            peer = peers.get(at)
            try:
                if peer is None:
                    raise ConnectionError("node %s is not in the node table" % at[:8])
                replies: list[Any] = await ask(h, caller, peer, argvs)
            except trio.TooSlowError:
                replies = [ConnectionError("node %s did not answer" % at[:8])] * len(argvs)
            except Exception as exc:  # noqa: BLE001 - said per command: the round goes on
                replies = [exc] * len(argvs)
            at, argvs = steps.send(replies)
    except StopIteration:
        pass
    except dr.DrainError as exc:
        _DRAINS.pop(node.id, None)
        text = str(exc)
        raise ApiError(403 if "NOPERM" in text or "NOAUTH" in text else 502, text) from None
    if d.done:
        _DRAINS.pop(node.id, None)
    return _json({"node": node.id, "done": d.done, "left": d.left.as_json(), "pending": len(d.pending),
                  "moved": d.moved, "dropped": d.dropped, "targets": targets, "errors": list(d.errors)})  # fmt: skip
