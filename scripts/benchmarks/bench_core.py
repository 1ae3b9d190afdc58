"""CPU per job spent in the sans-I/O core alone, by input: ``scripts/bench core``.

Three :class:`~disque_py.core.node.Node` objects are wired directly: every
``Send`` effect is handed at once to its destination's ``receive_data`` (no
encoding, no sockets, no trio), and time advances by hand. Ten consumers on
node A block in ``GETJOB``; one producer adds jobs on node B (``--same-node``:
on A); each job a consumer receives is acknowledged with ``ACKJOB`` and the
consumer blocks again. The time spent inside each node for each kind of
input (a client command or a bus message) is summed and reported per job,
which shows what the core costs for a job that moves between nodes against
one that stays, and where. With ``--backlog`` the producer adds every job
first and the consumers come after: the jobs then move by pull (NEEDJOBS
answered by YOURJOBS batches, on timer ticks 5 ms apart), the path a
cluster takes once a producing node holds a backlog, instead of the push
of a job to a node whose consumers wait. What the shell adds (sockets,
RESP, the bus codec) is measured by ``scripts/bench`` itself.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections import Counter
from typing import Any

from disque_py.core.effects import Reply, Send
from disque_py.core.node import Node
from disque_py.core.replies import Error

__all__ = ["run_core", "core_main"]

CONSUMERS = 10
TICK_EVERY = 25  # jobs between timer ticks (ack GC messages leave on ticks)
GETJOB = [b"GETJOB", b"TIMEOUT", b"100000", b"FROM", b"q"]


def run_core(
    jobs: int = 20000, replicate: int = 1, same_node: bool = False, body_size: int = 100, backlog: bool = False
) -> dict[str, Any]:
    """Run the workload; returns µs per job by ``"<node> <input>"``, message counts and delivery checks.
    ``backlog``: every job is added before the consumers block (see the module's docstring)."""
    ids = ["a" * 40, "b" * 40, "c" * 40]
    nodes = {
        nid: Node(nid, seed=bytes([i + 1]) * 8, now=1000, address=("127.0.0.1", 7711 + i))
        for i, nid in enumerate(ids)
    }
    for nid, n in nodes.items():
        n.ctx.cluster_size = len(nodes)
        n.ctx.reachable = [x for x in nodes if x != nid]
        n.ctx.known_nodes = list(nodes)
    a, b = nodes[ids[0]], nodes[ids[1]]
    producer = a if same_node else b
    name = {nid: "ABC"[i] for i, nid in enumerate(ids)}
    spent: Counter[str] = Counter()
    messages: Counter[str] = Counter()
    received: Counter[bytes] = Counter()
    replies: list[Reply] = []
    clock = time.perf_counter

    def pump(now: int) -> None:
        moved = True
        while moved:
            moved = False
            for nid, n in nodes.items():
                for effect in n.take_effects():
                    if type(effect) is Send:
                        moved = True
                        kind = effect.message[0]
                        messages[kind] += 1
                        t = clock()
                        nodes[effect.to].receive_data(nid, kind, list(effect.message[1:]), now)
                        spent["%s %s" % (name[effect.to], kind)] += clock() - t
                    elif nid == a.id and type(effect) is Reply and type(effect.value) is list:
                        replies.append(effect)

    def execute(n: Node, kind: str, client: int, argv: list[bytes], now: int) -> Any:
        t = clock()
        reply = n.execute(client, argv, now)
        spent["%s %s" % (name[n.id], kind)] += clock() - t
        return reply

    def tick(now: int) -> None:
        for n in nodes.values():
            t = clock()
            n.tick(now)
            spent["%s tick" % name[n.id]] += clock() - t
        pump(now)

    def consume(now: int) -> None:
        while replies:
            r = replies.pop()
            for item in r.value:
                received[item[1]] += 1
                execute(a, "ACKJOB", r.client, [b"ACKJOB", item[1]], now)
            again = execute(a, "GETJOB", r.client, list(GETJOB), now)
            if type(again) is list:  # a job was queued on A already: served at once, not blocked
                replies.append(Reply(r.client, again))
            pump(now)

    def block_consumers(now: int) -> None:
        for client in range(CONSUMERS):
            reply = a.execute(client, list(GETJOB), now)
            if type(reply) is list:
                replies.append(Reply(client, reply))
        pump(now)

    now = 1000
    if not backlog:
        block_consumers(now)
    body = b"x" * body_size
    addjob_errors = 0
    for i in range(jobs):
        now = 1000 + i // 5
        reply = execute(producer, "ADDJOB", 100 + i, [b"ADDJOB", b"q", body, b"0", b"REPLICATE", b"%d" % replicate], now)
        if type(reply) is Error:
            addjob_errors += 1
        pump(now)
        consume(now)
        if i % TICK_EVERY == 0:
            tick(now + 6)
    if backlog:  # the consumers come now; the jobs reach A by pull, on timer ticks
        now += 6
        block_consumers(now)
        consume(now)
        deadline = now + 600_000  # ten simulated minutes, far beyond what a healthy drain takes
        while len(received) < jobs - addjob_errors and now < deadline:
            now += 5
            tick(now)
            consume(now)
    for k in range(60):  # let the ack GC finish everywhere
        tick(now + 6 + k * 10)
    total = sum(spent.values())
    return {
        "jobs": jobs,
        "replicate": replicate,
        "where": "A->A" if same_node else "B->A",
        "backlog": backlog,
        "us_per_job": round(total / jobs * 1e6, 2),
        "by_input_us_per_job": {k: round(v / jobs * 1e6, 2) for k, v in spent.most_common()},
        "messages_per_job": {k: round(v / jobs, 2) for k, v in messages.most_common()},
        "received_once": sum(1 for v in received.values() if v == 1),
        "duplicates": sum(1 for v in received.values() if v > 1),
        "addjob_errors": addjob_errors,
        "jobs_left": {name[nid]: len(n.store) for nid, n in nodes.items()},
    }


def core_main(argv: list[str]) -> int:
    """``scripts/bench core ...``: run :func:`run_core`, print a table (or JSON)."""
    p = argparse.ArgumentParser(prog="scripts/bench core", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)  # fmt: skip
    p.add_argument("--jobs", type=int, default=20000, help="jobs to add (default 20000)")
    p.add_argument("--replicate", type=int, default=1, choices=(1, 2, 3), help="REPLICATE of each job (default 1)")
    p.add_argument("--same-node", action="store_true", help="the producer on A, with the consumers")
    p.add_argument("--backlog", action="store_true",
                   help="add every job before the consumers block: the jobs move by pull, not push")  # fmt: skip
    p.add_argument("--json", action="store_true", help="print the raw result as JSON")
    a = p.parse_args(argv)
    if a.jobs < 1:
        p.error("--jobs must be >= 1")
    r = run_core(a.jobs, a.replicate, a.same_node, backlog=a.backlog)
    if a.json:
        print(json.dumps(r))
        return 0
    print("%s%s, REPLICATE %d, %d jobs: %.1f µs of core CPU per job" % (
        r["where"], " from a backlog" if r["backlog"] else "", r["replicate"], r["jobs"], r["us_per_job"]))
    for key, us in r["by_input_us_per_job"].items():
        print("  %-14s %6.2f µs/job" % (key, us))
    print("messages per job: %s" % (", ".join("%s %.2f" % kv for kv in r["messages_per_job"].items()) or "none"))
    print("received once: %d, duplicates: %d, ADDJOB errors: %d, jobs left per node: %s"
          % (r["received_once"], r["duplicates"], r["addjob_errors"], r["jobs_left"]))  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(core_main(sys.argv[1:]))
