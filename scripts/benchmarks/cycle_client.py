"""The add->get->ack cycle client: one process (``scripts/bench client``, or ``python -m
benchmarks.bench client`` started by the harness) pinned to the load CPU, raw non-blocking sockets, epoll
and one ``hiredis.Reader`` per connection. See the Method notes of :mod:`benchmarks.bench` ("Cycles").
"""

from __future__ import annotations

import argparse
import json
import resource
import select
import socket
import sys
import time
from typing import Any

from .common import BenchError, HOST, encode


def run_cycles(
    port: int,
    *,
    conns: int = 50,
    duration: float | None = 10.0,
    count: int | None = None,
    body_size: int = 100,
    kind: str = "disque",
    shared_queue: bool = False,
    groups: int = 0,
    batch: int = 1,
) -> dict[str, Any]:
    """Drive ``conns`` connections through add -> get -> ack cycles; return stats.

    ``kind="disque"``: ``ADDJOB q body 0`` -> ``GETJOB NOHANG FROM q`` ->
    ``ACKJOB id``. ``kind="redis"``: ``LPUSH q body`` -> ``RPOP q`` -> ``DEL q``,
    the same shape of traffic against redis-server, to measure the client's own
    ceiling. Each connection has one request in flight; the cycle latency is
    from sending the first command to reading the third reply. Runs for
    ``duration`` seconds, or until ``count`` cycles completed when given; no
    cycle is started after the deadline and the ones in flight are finished.
    ``groups`` > 0 (disque only): connection ``i`` adds its jobs with ``GROUP g<i % groups>``.
    ``batch`` > 1 (disque only): a cycle is ``batch`` ADDJOBs sent as one pipeline, one ``GETJOB
    NOHANG COUNT batch``, one ``ACKJOB`` of the IDs it returned; ``cycles`` and ``jobs_per_s`` then
    count jobs, the latencies are of whole batches.
    """
    import hiredis

    if kind not in ("disque", "redis"):
        raise ValueError("kind must be 'disque' or 'redis'")
    if groups and kind != "disque":
        raise ValueError("groups are Disque's only")
    if batch < 1 or (batch > 1 and kind != "disque"):
        raise ValueError("batch must be 1, or more with kind='disque'")
    body = b"x" * body_size
    ReplyError = hiredis.ReplyError

    class Conn:
        __slots__ = ("sock", "reader", "stage", "t0", "first", "second", "third", "left")

    by_fd: dict[int, Conn] = {}
    ep = select.epoll()
    for i in range(conns):
        queue = b"bench-q" if shared_queue else b"bench-%d" % i
        c = Conn()
        c.sock = socket.create_connection((HOST, port), timeout=10)
        c.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        # Non-blocking: no poll() inside each send/recv as with a timeout. A send of one
        # small command with nothing else in flight always fits the socket buffer.
        c.sock.setblocking(False)
        c.reader = hiredis.Reader()
        c.stage = 0
        c.t0 = 0.0
        c.left = batch
        if kind == "disque":
            c.first = encode(b"ADDJOB", queue, body, b"0", *((b"GROUP", b"g%d" % (i % groups)) if groups else ())) * batch
            c.second = (encode(b"GETJOB", b"NOHANG", b"COUNT", b"%d" % batch, b"FROM", queue) if batch > 1
                        else encode(b"GETJOB", b"NOHANG", b"FROM", queue))  # fmt: skip
            c.third = None
        else:
            c.first = encode(b"LPUSH", queue, body)
            c.second = encode(b"RPOP", queue)
            c.third = encode(b"DEL", queue)
        by_fd[c.sock.fileno()] = c
        ep.register(c.sock.fileno(), select.EPOLLIN)

    def fail(c: Conn, reply: Any) -> None:
        raise BenchError("unexpected reply at step %d of a cycle: %r" % (c.stage + 1, reply))

    latencies: list[float] = []
    record = latencies.append
    now = time.perf_counter
    empty_gets = 0
    started = 0
    limit = count if count is not None else float("inf")
    ru0 = resource.getrusage(resource.RUSAGE_SELF)
    t_start = now()
    deadline = t_start + duration if (duration is not None and count is None) else float("inf")
    active = 0
    for c in by_fd.values():
        if started >= limit:
            break
        started += 1
        active += 1
        c.t0 = now()
        c.sock.send(c.first)
    t_last = t_start
    ackjob_head = b"*2\r\n$6\r\nACKJOB\r\n$%d\r\n"

    while active:
        events = ep.poll(5.0)
        if not events:
            raise BenchError("no reply for 5 s from port %d" % port)
        for fd, _ in events:
            c = by_fd[fd]
            try:
                data = c.sock.recv(65536)
            except BlockingIOError:
                continue
            if not data:
                raise BenchError("the server closed a connection")
            c.reader.feed(data)
            reply = c.reader.gets()
            while reply is not False:
                if isinstance(reply, ReplyError):
                    fail(c, reply)
                stage = c.stage
                if stage == 0:  # ADDJOB / LPUSH replied
                    c.left -= 1
                    if c.left:
                        reply = c.reader.gets()
                        continue  # more of the batch's ADDJOB replies to come
                    c.left = batch
                    c.stage = 1
                    c.sock.send(c.second)
                elif stage == 1:  # GETJOB / RPOP replied
                    if reply is None:
                        empty_gets += 1
                        c.sock.send(c.second)
                    elif c.third is None:
                        if type(reply) is not list:
                            fail(c, reply)
                        c.stage = 2
                        if batch > 1:
                            if len(reply) != batch:
                                fail(c, "%d jobs, not %d" % (len(reply), batch))
                            c.sock.send(encode(b"ACKJOB", *[job[1] for job in reply]))
                        else:
                            job_id = reply[0][1]
                            c.sock.send(ackjob_head % len(job_id) + job_id + b"\r\n")
                    else:
                        c.stage = 2
                        c.sock.send(c.third)
                else:  # ACKJOB / DEL replied: one cycle done
                    if type(reply) is not int or (batch > 1 and reply != batch):
                        fail(c, reply)
                    t = now()
                    record(t - c.t0)
                    t_last = t
                    if t < deadline and started < limit:
                        started += 1
                        c.stage = 0
                        c.t0 = t
                        c.sock.send(c.first)
                    else:
                        active -= 1
                reply = c.reader.gets()

    ru1 = resource.getrusage(resource.RUSAGE_SELF)
    for c in by_fd.values():
        c.sock.close()
    ep.close()
    elapsed = t_last - t_start
    cpu = (ru1.ru_utime - ru0.ru_utime) + (ru1.ru_stime - ru0.ru_stime)
    latencies.sort()
    done = len(latencies)
    jobs = done * batch

    def pct(p: float) -> float:
        return round(latencies[min(done - 1, int(p / 100.0 * done))] * 1000.0, 3) if done else 0.0

    return {
        "kind": kind,
        "conns": conns,
        "queues": "shared" if shared_queue else "per-connection",
        "groups": groups,
        "body_size": body_size,
        "batch": batch,
        "cycles": jobs,
        "elapsed_s": round(elapsed, 3),
        "cycles_per_s": round(jobs / elapsed, 1) if elapsed > 0 else 0.0,
        "requests_per_s": round((batch + 2) * done / elapsed, 1) if elapsed > 0 else 0.0,
        "p50_ms": pct(50),
        "p99_ms": pct(99),
        "p999_ms": pct(99.9),
        "max_ms": round(latencies[-1] * 1000.0, 3) if done else 0.0,
        "empty_gets": empty_gets,
        "client_cpu_pct": round(100.0 * cpu / elapsed, 1) if elapsed > 0 else 0.0,
    }


def run_consumer(
    port: int,
    queue: str,
    *,
    conns: int = 20,
    duration: float = 10.0,
    hold_ms: float = 0.0,
    timeout_ms: int = 100,
) -> dict[str, Any]:
    """Consume a queue filled beforehand: ``conns`` connections, each ``GETJOB TIMEOUT timeout_ms
    FROM queue`` (blocking: a job of a group at its limit waits in the queue, and the node hands it
    over when the group is under its limit again), then holds the job ``hold_ms`` (a consumer at
    work) and ``ACKJOB``s it, for ``duration`` seconds. Returns the deliveries (GETJOB replies with
    a job), their rate, and the deliveries of each whole second from the start (``per_second``), to
    tell a burst at the start from the steady rate."""
    import heapq

    import hiredis

    ReplyError = hiredis.ReplyError
    get = encode(b"GETJOB", b"TIMEOUT", str(timeout_ms), b"FROM", queue)
    hold = hold_ms / 1000.0
    by_fd: dict[int, Any] = {}
    socks = []
    ep = select.epoll()
    for _ in range(conns):
        sock = socket.create_connection((HOST, port), timeout=10)
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        sock.setblocking(False)
        socks.append(sock)
        by_fd[sock.fileno()] = [sock, hiredis.Reader(), 0]  # socket, parser, 0: waits for GETJOB, 1: ACKJOB
        ep.register(sock.fileno(), select.EPOLLIN)
    now = time.perf_counter
    ru0 = resource.getrusage(resource.RUSAGE_SELF)
    t_start = now()
    deadline = t_start + duration
    stamps: list[float] = []
    timeouts = 0
    due: list[tuple[float, int, bytes]] = []  # (when, fd, ACKJOB): the jobs held
    for fd, c in by_fd.items():
        c[0].send(get)
    active = conns
    while active:
        t = now()
        while due and due[0][0] <= t:
            _, fd, ack = heapq.heappop(due)
            by_fd[fd][0].send(ack)
        wait = (due[0][0] - t) if due else 5.0
        events = ep.poll(max(0.0, wait))
        if not events and not due:
            raise BenchError("no reply for 5 s from port %d" % port)
        for fd, _ in events:
            c = by_fd[fd]
            try:
                data = c[0].recv(65536)
            except BlockingIOError:
                continue
            if not data:
                raise BenchError("the server closed a connection")
            c[1].feed(data)
            reply = c[1].gets()
            while reply is not False:
                if isinstance(reply, ReplyError):
                    raise BenchError("unexpected reply: %r" % reply)
                t = now()
                if c[2] == 0:  # GETJOB replied
                    if reply is None:
                        timeouts += 1
                        if t < deadline:
                            c[0].send(get)
                        else:
                            active -= 1
                    else:
                        stamps.append(t)
                        job_id = reply[0][1]
                        c[2] = 1
                        ack = encode(b"ACKJOB", job_id)
                        if hold > 0:
                            heapq.heappush(due, (t + hold, fd, ack))
                        else:
                            c[0].send(ack)
                else:  # ACKJOB replied
                    c[2] = 0
                    if t < deadline:
                        c[0].send(get)
                    else:
                        active -= 1
                reply = c[1].gets()
    ru1 = resource.getrusage(resource.RUSAGE_SELF)
    for sock in socks:
        sock.close()
    ep.close()
    counted = [s for s in stamps if s < deadline]
    per_second = [0] * max(1, int(duration))
    for s in counted:
        i = int(s - t_start)
        if i < len(per_second):
            per_second[i] += 1
    cpu = (ru1.ru_utime - ru0.ru_utime) + (ru1.ru_stime - ru0.ru_stime)
    return {
        "queue": queue,
        "conns": conns,
        "hold_ms": hold_ms,
        "deliveries": len(counted),
        "elapsed_s": round(duration, 3),
        "deliveries_per_s": round(len(counted) / duration, 1),
        "per_second": per_second,
        "empty_gets": timeouts,
        "client_cpu_pct": round(100.0 * cpu / (now() - t_start), 1),
    }


def client_main(argv: list[str]) -> int:
    """``python -m benchmarks.bench client ...``: run :func:`run_cycles`, print JSON."""
    p = argparse.ArgumentParser(prog="scripts/bench client", description=run_cycles.__doc__)
    p.add_argument("--port", type=int, default=7711)
    p.add_argument("--conns", type=int, default=50)
    p.add_argument("--duration", type=float, default=10.0, help="seconds (default 10)")
    p.add_argument("--count", type=int, default=None, help="total cycles instead of a duration")
    p.add_argument("--body-size", type=int, default=100)
    p.add_argument("--kind", choices=("disque", "redis"), default="disque")
    p.add_argument("--shared-queue", action="store_true", help="one queue for all connections")
    p.add_argument("--groups", type=int, default=0, help="connection i adds its jobs with GROUP g<i %% N>")
    p.add_argument("--consume", metavar="QUEUE", default=None,
                   help="only consume QUEUE, filled beforehand (blocking GETJOB, --hold-ms, ACKJOB)")
    p.add_argument("--hold-ms", type=float, default=0.0, help="--consume: how long each job is held before its ACKJOB")
    p.add_argument("--batch", type=int, default=1,
                   help="jobs a cycle: BATCH ADDJOBs pipelined, GETJOB NOHANG COUNT BATCH, one ACKJOB of them (disque)")
    a = p.parse_args(argv)
    try:
        if a.consume is not None:
            result = run_consumer(a.port, a.consume, conns=a.conns, duration=a.duration, hold_ms=a.hold_ms)
        else:
            result = run_cycles(
                a.port, conns=a.conns, duration=a.duration, count=a.count,
                body_size=a.body_size, kind=a.kind, shared_queue=a.shared_queue, groups=a.groups, batch=a.batch,
            )  # fmt: skip
    except (BenchError, OSError) as exc:
        print("error: %s" % exc, file=sys.stderr)
        return 1
    print(json.dumps(result))
    return 0
