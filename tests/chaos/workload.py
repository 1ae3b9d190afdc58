"""Producers and consumers of a chaos run: trio tasks in the harness process, each with its own
connection, each request to a node picked at random, every outcome written to the history.

Producers send ADDJOB at a fixed total rate (so that two servers compared get the same work),
with a unique body per job. Consumers GETJOB from random nodes and, by a mix, acknowledge
(ACKJOB at the node that gave the job, another one if it fails), FASTACK, drop (take and never
acknowledge: the job comes back after its RETRY) or NACK. In the drain phase every consumer
acknowledges everything.
"""

from __future__ import annotations

import random
import time
from dataclasses import dataclass, field
from typing import Any, Sequence

import hiredis
import trio

from .history import History, body_flags


class ReplyError(Exception):
    pass


class NotSent(ConnectionError):
    """The connection could not be made: the request never left (its job does not exist)."""


class Conn:
    """One RESP connection to one node; :meth:`call` raises OSError/trio.TooSlowError on a dead or slow
    link (the connection is then closed and made again on the next call)."""

    def __init__(self, host: str, port: int) -> None:
        self.host, self.port = host, port
        self.stream: trio.SocketStream | None = None
        self.reader = hiredis.Reader()

    async def call(self, *args: str | bytes | int, timeout: float) -> Any:
        with trio.fail_after(timeout):
            try:
                if self.stream is None:
                    try:
                        self.stream = await trio.open_tcp_stream(self.host, self.port)
                    except OSError as exc:
                        raise NotSent(str(exc)) from exc
                    self.reader = hiredis.Reader()
                out = [b"*%d\r\n" % len(args)]
                for a in args:
                    b = a if isinstance(a, bytes) else str(a).encode()
                    out.append(b"$%d\r\n%s\r\n" % (len(b), b))
                await self.stream.send_all(b"".join(out))
                while True:
                    reply = self.reader.gets()
                    if reply is not False:
                        break
                    data = await self.stream.receive_some(65536)
                    if not data:
                        raise ConnectionResetError("closed by the node")
                    self.reader.feed(data)
            except BaseException:
                await self.close()
                raise
        if isinstance(reply, hiredis.ReplyError):
            raise ReplyError(str(reply))
        return reply

    async def close(self) -> None:
        if self.stream is not None:
            stream, self.stream = self.stream, None
            with trio.CancelScope(shield=True):
                try:
                    await trio.aclose_forcefully(stream)
                except Exception:  # noqa: BLE001 - a broken link: nothing to close cleanly
                    pass


FAILURES = (OSError, trio.TooSlowError, trio.BrokenResourceError, trio.ClosedResourceError, ConnectionError)


@dataclass
class Options:
    producers: int = 4
    consumers: int = 6
    rate: float = 400.0  # jobs a second, all producers together
    queues: int = 3
    replicate: int = 3
    retry: int = 1
    retry0_pct: float = 0.0
    async_pct: float = 0.0
    add_timeout_ms: int = 2000  # ADDJOB's own TIMEOUT (NOREPL after it)
    request_timeout: float = 3.0  # the harness gives up on an ADDJOB reply after this (outcome unknown)
    getjob_timeout_ms: int = 300
    short_timeout: float = 1.5  # ... on the reply of GETJOB (beyond its TIMEOUT), ACKJOB, NACK
    avoid_s: float = 2.0  # a task that failed on a node picks others for this long (as a client fails over)
    mix: dict[str, float] = field(default_factory=lambda: {"ack": 0.90, "fastack": 0.04, "drop": 0.03, "nack": 0.03})
    failing_pct: float = 0.0  # share of poison jobs; above 0, every at-least-once job has a delivery policy
    maxdeliver: int = 3
    backoff: tuple[float, float] = (0.05, 0.4)  # BACKOFF min max, seconds
    nack_delay: float = 0.3  # NACK DELAY of a poison job, one NACK in three
    #: how a producer meets a failed ADDJOB (no ID: a timeout, a dropped connection, NOREPL...):
    #: "once" gives the job up; "retry" sends it again, on any node, until it gets an ID (each try may
    #: make a job); "dedup" does the same with ``DEDUP <key>`` (one job per key)
    producer: str = "once"
    give_up_s: float = 30.0  # a retrying producer gives a job up after this long without an ID
    retry_pause: float = 0.05  # between two tries of one job

    @property
    def retrying(self) -> bool:
        return self.producer in ("retry", "dedup")

    @property
    def failing(self) -> bool:
        return self.failing_pct > 0


class Picker:
    """A task's choice of node: at random, skipping for a while the ones that just failed it (a client
    stuck on a stopped node would stall the workload for the whole fault)."""

    def __init__(self, rng: random.Random, size: int, avoid_s: float) -> None:
        self.rng = rng
        self.size = size
        self.avoid_s = avoid_s
        self.until = [0.0] * size

    def pick(self) -> int:
        now = trio.current_time()
        ok = [i for i in range(self.size) if self.until[i] <= now]
        return self.rng.choice(ok) if ok else self.rng.randrange(self.size)

    def failed(self, node: int) -> None:
        self.until[node] = trio.current_time() + self.avoid_s


class Workload:
    def __init__(self, addresses: Sequence[tuple[str, int]], history: History, run_prefix: str,
                 opts: Options, seed: int, clock: Any = time.monotonic) -> None:  # fmt: skip
        self.addresses = list(addresses)
        self.history = history
        self.prefix = run_prefix
        self.opts = opts
        self.seed = seed
        self.clock = clock
        self.producing = True
        self.consuming = True
        self.draining = False
        self.queue_names = ["chaos%d" % i for i in range(opts.queues)]
        #: every queue consumers read and the settle phase waits on: the dead-letter ones too
        self.all_queues = self.queue_names + ([q + ".dead" for q in self.queue_names] if opts.failing else [])
        self.counts = {"added": 0, "delivered": 0, "add_failures": 0, "get_failures": 0}
        self.adding = 0  # jobs a retrying producer is still trying to add

    # ------------------------------------------------------------------ producers

    async def producer(self, pid: int) -> None:
        o = self.opts
        rng = random.Random(self.seed * 1000 + pid)
        conns = [Conn(h, p) for h, p in self.addresses]
        picker = Picker(rng, len(conns), o.avoid_s)
        period = o.producers / o.rate
        next_at = trio.current_time()
        seq = 0
        try:
            while self.producing:
                next_at += period
                delay = next_at - trio.current_time()
                if delay > 0:
                    await trio.sleep(delay)
                else:
                    next_at = trio.current_time()  # behind (a stalled node): no catch-up burst
                node = picker.pick()
                seq += 1
                retry = 0 if rng.random() < o.retry0_pct else o.retry
                asynchronous = rng.random() < o.async_pct
                policy = o.failing and retry > 0
                poison = policy and rng.random() < o.failing_pct
                flags = ",".join(f for f, on in (("r0", retry == 0), ("a", asynchronous), ("p", poison)) if on)
                body = "%s:%d:%d:%s" % (self.prefix, pid, seq, flags)
                args: list[Any] = ["ADDJOB", rng.choice(self.queue_names), body, o.add_timeout_ms,
                                   "REPLICATE", o.replicate, "RETRY", retry]  # fmt: skip
                if asynchronous:
                    args.append("ASYNC")
                if policy:
                    args += ["BACKOFF", "%g" % o.backoff[0], "%g" % o.backoff[1], "MAXDELIVER", o.maxdeliver]
                ev = self.history.add(op="add", t0=self.clock(), node=node, body=body, replicate=o.replicate,
                                      retry=retry, result="unknown", id=None)  # fmt: skip
                ev["async"] = asynchronous
                if policy:
                    ev["maxdeliver"] = o.maxdeliver
                if o.retrying:
                    self.adding += 1
                    try:
                        await self._add_until_answered(ev, args, conns, picker, node)
                    finally:
                        self.adding -= 1
                    continue
                try:
                    reply = await conns[node].call(*args, timeout=o.request_timeout)
                    ev["result"], ev["id"] = "ok", reply.decode()
                    self.counts["added"] += 1
                except ReplyError as exc:
                    ev["result"], ev["error"] = "error", str(exc)[:100]
                    self.counts["add_failures"] += 1
                except FAILURES as exc:
                    if isinstance(exc, NotSent):
                        ev["result"] = "error"  # never sent: no such job
                    ev["error"] = type(exc).__name__
                    self.counts["add_failures"] += 1
                    picker.failed(node)
                ev["t1"] = self.clock()
        finally:
            for c in conns:
                await c.close()

    async def _add_until_answered(self, ev: dict[str, Any], args: list[Any], conns: list[Conn], picker: Picker,
                                  node: int) -> None:  # fmt: skip
        """A retrying producer's job: ADDJOB again (the same body; with ``DEDUP <body>`` in the
        "dedup" mode) on any node after every error, timeout or dropped connection, until an ID
        comes or ``give_up_s`` has passed. The event gets ``key`` (dedup), ``attempts``, ``nodes``
        (one per try), ``errors`` ([sent, failed, error] of each try that failed) and ``ids``
        (the ID answered)."""
        o = self.opts
        if o.producer == "dedup":
            args = args + ["DEDUP", ev["body"]]
            ev["key"] = ev["body"]
        ev["attempts"], ev["nodes"], ev["ids"], ev["errors"] = 0, [], [], []
        deadline = self.clock() + o.give_up_s
        while True:
            ev["attempts"] += 1
            ev["nodes"].append(node)
            sent = self.clock()
            try:
                reply = await conns[node].call(*args, timeout=o.request_timeout)
            except ReplyError as exc:
                ev["error"] = str(exc)[:100]
                if ev["error"].startswith("ERR"):  # a bad request: no retry makes it good
                    ev["result"] = "error" if not ev["ids"] and ev["attempts"] == 1 else "unknown"
                    break
                picker.failed(node)
            except FAILURES as exc:
                ev["error"] = type(exc).__name__
                picker.failed(node)
            else:
                ev["result"], ev["id"] = "ok", reply.decode()
                ev["ids"].append(ev["id"])
                self.counts["added"] += 1
                break
            self.counts["add_failures"] += 1
            ev["errors"].append([round(sent, 3), round(self.clock(), 3), ev["error"]])
            if self.clock() >= deadline:
                break  # given up: "unknown" (a try may have made the job)
            await trio.sleep(o.retry_pause)
            node = picker.pick()
        ev["t1"] = self.clock()

    # ------------------------------------------------------------------ consumers

    async def consumer(self, cid: int) -> None:
        o = self.opts
        rng = random.Random(self.seed * 1000 + 500 + cid)
        conns = [Conn(h, p) for h, p in self.addresses]
        actions = list(o.mix)
        weights = [o.mix[a] for a in actions]
        picker = Picker(rng, len(conns), o.avoid_s)
        try:
            while self.consuming:
                node = picker.pick()
                counters = ("WITHCOUNTERS",) if o.failing else ()
                try:
                    reply = await conns[node].call("GETJOB", "TIMEOUT", o.getjob_timeout_ms, "COUNT", 10, *counters,
                                                   "FROM", *self.all_queues,
                                                   timeout=o.getjob_timeout_ms / 1000 + o.short_timeout)  # fmt: skip
                except (ReplyError, *FAILURES) as exc:
                    self.counts["get_failures"] += 1
                    if o.failing and not isinstance(exc, (ReplyError, NotSent)):
                        # sent, no reply: the node may have delivered (and counted) jobs nobody saw
                        self.history.add(op="getfail", t=self.clock(), node=node, error=type(exc).__name__)
                    picker.failed(node)
                    await trio.sleep(0.01)
                    continue
                if not reply:
                    continue
                by_action: dict[str, list[str]] = {}
                for item in reply:
                    job_id, body = item[1].decode(), item[2].decode("utf-8", "replace")
                    poison = o.failing and "p" in body_flags(body)
                    fields = _counters(item) if o.failing else {}
                    dead_of = fields.get("dead-letter-of")
                    if dead_of is not None:
                        action = "ack" if self.draining else rng.choices(actions, weights)[0]
                    elif poison:
                        action = "nack"  # always fails, until dead-lettered
                    else:
                        action = "ack" if self.draining else rng.choices(actions, weights)[0]
                    ev = self.history.add(op="get", t=self.clock(), node=node, consumer=cid, id=job_id, body=body,
                                          action=action)  # fmt: skip
                    if o.failing:
                        ev["deliveries"] = fields.get("deliveries")
                        if dead_of is not None:
                            ev["dead_of"] = dead_of.decode()
                            ev["orig_deliveries"] = fields.get("original-deliveries")
                    self.counts["delivered"] += 1
                    key = "nack-poison" if poison and dead_of is None else action
                    by_action.setdefault(key, []).append(job_id)
                for action, ids in by_action.items():
                    if action == "drop":
                        continue
                    if action == "nack-poison":
                        extra = rng.choice(((), ("DELAY", "%g" % o.nack_delay), ("REASON", "poison")))
                        await self._settle_jobs(conns, node, "NACK", ids, rng, extra)
                        continue
                    command = {"ack": "ACKJOB", "fastack": "FASTACK", "nack": "NACK"}[action]
                    await self._settle_jobs(conns, node, command, ids, rng)
        finally:
            for c in conns:
                await c.close()

    async def _settle_jobs(self, conns: list[Conn], node: int, command: str, ids: list[str],
                           rng: random.Random, options: tuple[str, ...] = ()) -> None:  # fmt: skip
        """ACKJOB/FASTACK/NACK at the node that gave the jobs; ACKJOB and FASTACK at another node if it
        fails (any node takes an acknowledgement)."""
        tries = [node]
        if command != "NACK" and len(conns) > 1:
            tries.append(rng.choice([i for i in range(len(conns)) if i != node]))
        for n in tries:
            try:
                await conns[n].call(command, *ids, *options, timeout=self.opts.short_timeout)
            except (ReplyError, *FAILURES):
                continue
            self.history.add(op="ack", t=self.clock(), node=n, ids=ids, command=command, ok=True)
            return
        self.history.add(op="ack", t=self.clock(), node=node, ids=ids, command=command, ok=False)

    async def run(self, nursery: trio.Nursery) -> None:
        for p in range(self.opts.producers):
            nursery.start_soon(self.producer, p)
        for c in range(self.opts.consumers):
            nursery.start_soon(self.consumer, c)


def _counters(item: list) -> dict[str, Any]:
    """GETJOB WITHCOUNTERS' fields after queue, ID and body, by name."""
    return {item[i].decode(): item[i + 1] for i in range(3, len(item) - 1, 2)}
