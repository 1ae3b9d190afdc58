"""Jobs that fail well, on real node processes: MAXDELIVER and dead letters, NACK DELAY,
BACKOFF, a kill -9 mid-backoff, and the bad input of ADDJOB and NACK (disque_py/core/delivery.py).

Three nodes, REPLICATE 3: every node holds a copy of each job, so every node can be asked.
"""

from __future__ import annotations

import os
import signal
import time

import pytest
import redis

from disque_py.core.ids import dead_letter_id

from .conftest import wait_for
from .test_cluster_process import created  # noqa: F401  (fixture)

pytestmark = pytest.mark.integration

#: a node's clock is in whole milliseconds: a delay may end up to that much before the
#: harness's own clock says (it starts the clock before sending the NACK, which covers most)
EARLY = 0.002


def client(port: int) -> redis.Redis:
    return redis.Redis(port=port, socket_timeout=10)


def show(port: int, job_id: bytes) -> dict | None:
    reply = client(port).execute_command("SHOW", job_id)
    if reply is None:
        return None
    return {reply[i].decode(): reply[i + 1] for i in range(0, len(reply), 2)}


def stats(port: int) -> dict:
    return client(port).info()


def qlen(port: int, queue: str) -> int:
    return client(port).execute_command("QLEN", queue)


def getjob_nohang(port: int, queue: str) -> list:
    return client(port).execute_command("GETJOB", "NOHANG", "FROM", queue) or []


def kill9(tmp_path, port: int) -> None:
    os.kill(int((tmp_path / "run" / ("node-%d" % port) / "disque.pid").read_text()), signal.SIGKILL)


def all_holders(ports: list[int], job_id: bytes) -> None:
    wait_for(lambda: all(show(p, job_id) is not None for p in ports), timeout=10, what="a copy on every node")


def test_a_job_nacked_on_another_node_each_time_is_dead_lettered_once_after_its_3rd_delivery(created):  # noqa: F811
    ports = created(3, "--node-timeout", "3000")
    job_id = client(ports[0]).execute_command("ADDJOB", "q", "poison", 5000, "REPLICATE", 3, "RETRY", 60,
                                              "MAXDELIVER", 3)  # fmt: skip
    all_holders(ports, job_id)
    for p in ports:
        info = show(p, job_id)
        assert info["maxdeliver"] == 3 and info["deadletter"] == b"q.dead" and info["deliveries"] == 0
    dl_id = dead_letter_id(job_id)
    # delivery n on node n-1, NACKed on the next node (which has only a copy, and queues it)
    for n in range(1, 4):
        here, nacker = ports[n - 1], ports[n % 3]
        if n > 1:
            wait_for(lambda: qlen(here, "q") == 1, timeout=10, what="queued again on the nacking node")
        got = client(here).execute_command("GETJOB", "NOHANG", "FROM", "q")
        assert got and got[0][1] == job_id and got[0][2] == b"poison"
        # every holder learns of the delivery (DELIVERED); the count is never above the truth
        wait_for(lambda: all(show(p, job_id)["deliveries"] == n for p in ports), timeout=10,
                 what="delivery %d counted on every node" % n)  # fmt: skip
        assert all(show(p, dl_id) is None for p in ports)  # never dead-lettered before the 3rd delivery
        assert client(nacker).execute_command("NACK", job_id, "REASON", "fail %d" % n) == 1
    # the 3rd failure dead-letters it: one dead letter, the same ID on every node
    wait_for(lambda: all(show(p, dl_id) is not None for p in ports), timeout=10, what="the dead letter everywhere")
    for p in ports:
        dl = show(p, dl_id)
        assert dl["queue"] == b"q.dead" and dl["body"] == b"poison" and dl["repl"] == 3
        assert dl["dead-letter-of"] == job_id and dl["original-queue"] == b"q"
        assert dl["original-deliveries"] == 3 and dl["dead-letter-reason"] == b"fail 3"
        assert dl["original-options"] == [b"MAXDELIVER", b"3"]
        assert dl["retry"] == 60
    # the original: acknowledged everywhere, then collected
    wait_for(lambda: all((show(p, job_id) or {"state": b"acked"})["state"] == b"acked" for p in ports), timeout=10,
             what="the original acked everywhere")  # fmt: skip
    wait_for(lambda: all(show(p, job_id) is None for p in ports), timeout=20, what="the original collected")
    assert all(qlen(p, "q") == 0 for p in ports)
    # exactly one dead letter cluster-wide: queued on one node, made once
    assert sum(qlen(p, "q.dead") for p in ports) == 1
    for p in ports:
        assert client(p).execute_command("JSCAN", "QUEUE", "q.dead")[1] == [dl_id]
    # it is an ordinary job: delivered once, acked, gone everywhere
    dl_port = next(p for p in ports if qlen(p, "q.dead") == 1)
    got = client(dl_port).execute_command("GETJOB", "NOHANG", "WITHCOUNTERS", "FROM", "q.dead")
    assert got[0][1] == dl_id and got[0][2] == b"poison"
    fields = dict(zip(got[0][3::2], got[0][4::2]))
    assert fields[b"dead-letter-of"] == job_id and fields[b"original-deliveries"] == 3
    assert client(dl_port).execute_command("ACKJOB", dl_id) == 1
    wait_for(lambda: all(show(p, dl_id) is None for p in ports), timeout=20, what="the dead letter collected")
    assert all(getjob_nohang(p, "q.dead") == [] and getjob_nohang(p, "q") == [] for p in ports)


def test_nack_delay_is_invisible_on_every_node_until_it_ends(created):  # noqa: F811
    ports = created(3, "--node-timeout", "3000")
    job_id = client(ports[0]).execute_command("ADDJOB", "q", "later", 5000, "REPLICATE", 3, "RETRY", 30)
    all_holders(ports, job_id)
    assert client(ports[0]).execute_command("GETJOB", "NOHANG", "FROM", "q")[0][1] == job_id
    t0 = time.monotonic()
    assert client(ports[0]).execute_command("NACK", job_id, "DELAY", 2) == 1
    within = show(ports[0], job_id)["next-requeue-within"]
    assert 1000 <= within <= 2000, within
    # every holder counted the nack (NACKED) and holds the job back
    wait_for(lambda: all(show(p, job_id)["nacks"] == 1 for p in ports), timeout=1.5, what="NACKED heard")
    # poll every node (QLEN, GETJOB NOHANG) until one delivers it: a reply that shows the job
    # received before 2 s after the NACK was sent would prove it queued early (EARLY: the
    # nodes' clocks tick in whole milliseconds)
    checks, got, deadline = 0, None, t0 + 10
    while got is None and time.monotonic() < deadline:
        for p in ports:
            length, jobs = qlen(p, "q"), getjob_nohang(p, "q")
            received = time.monotonic() - t0
            if jobs:
                assert received >= 2.0 - EARLY, "delivered by node %d %.3f s after NACK DELAY 2" % (p, received)
                got = (p, jobs)
                break
            assert length == 0 or received >= 2.0 - EARLY, "queued on node %d %.3f s after NACK DELAY 2" % (p, received)
            if received < 2.0:
                checks += 1
        time.sleep(0.02)
    assert checks >= 9  # three rounds at least on every node before the delay ended
    assert got is not None, "not delivered 10 s after NACK DELAY 2"
    port, jobs = got
    assert jobs[0][1] == job_id and jobs[0][2] == b"later"
    assert client(port).execute_command("ACKJOB", job_id) == 1
    wait_for(lambda: all(show(p, job_id) is None for p in ports), timeout=20, what="collected")


def test_backoff_grows_with_each_nack(created):  # noqa: F811
    ports = created(3, "--node-timeout", "3000")
    r = client(ports[0])
    job_id = r.execute_command("ADDJOB", "q", "flaky", 5000, "REPLICATE", 3, "RETRY", 30, "BACKOFF", 0.2, 1.5)
    all_holders(ports, job_id)
    info = show(ports[0], job_id)
    assert info["backoff-min-ms"] == 200 and info["backoff-max-ms"] == 1500
    # nack k: 200 * 2^(k-1) ms capped at 1500, +-10 % within [200, 1500]
    bounds = [(200, 220), (360, 440), (720, 880), (1350, 1500), (1350, 1500)]
    waited = []
    for k, (lo, hi) in enumerate(bounds, 1):
        got = r.execute_command("GETJOB", "TIMEOUT", 5000, "WITHCOUNTERS", "FROM", "q")
        assert got and got[0][1] == job_id
        if k > 1:
            waited.append(time.monotonic() - t0)
        fields = dict(zip(got[0][3::2], got[0][4::2]))
        assert fields[b"nacks"] == k - 1 and fields[b"deliveries"] == k
        t0 = time.monotonic()
        assert r.execute_command("NACK", job_id) == 1
        within = show(ports[0], job_id)["next-requeue-within"]
        since_ms = (time.monotonic() - t0) * 1000  # the node's NACK and SHOW both fall in it
        assert lo - since_ms - 1 <= within <= hi, (k, within, since_ms)
        assert qlen(ports[0], "q") == 0
    # the time between deliveries grew too: each at least its nack's lower bound (and within ten
    # times its upper one, which a loaded machine keeps: the order of the waits is the bounds')
    for (lo, hi), w in zip(bounds, waited):
        assert lo / 1000 - EARLY <= w <= 10 * hi / 1000, waited
    got = r.execute_command("GETJOB", "TIMEOUT", 5000, "FROM", "q")
    assert got and got[0][1] == job_id
    assert r.execute_command("ACKJOB", job_id) == 1


def test_kill_9_of_the_holder_mid_backoff_loses_nothing(created, tmp_path):  # noqa: F811
    ports = created(3, "--node-timeout", "1000")
    job_id = client(ports[0]).execute_command("ADDJOB", "q", "survivor", 5000, "REPLICATE", 3, "RETRY", 2,
                                              "BACKOFF", 3, 10)  # fmt: skip
    all_holders(ports, job_id)
    assert client(ports[0]).execute_command("GETJOB", "NOHANG", "FROM", "q")[0][1] == job_id
    t0 = time.monotonic()
    assert client(ports[0]).execute_command("NACK", job_id) == 1
    # the other holders heard of the backoff: they hold the job back past it
    wait_for(lambda: all(show(p, job_id)["nacks"] == 1 for p in ports[1:]), timeout=5, what="NACKED heard")
    for p in ports[1:]:
        assert show(p, job_id)["next-requeue-within"] >= 2000
    kill9(tmp_path, ports[0])
    got, survivor, deadline = None, None, time.monotonic() + 20
    while not got and time.monotonic() < deadline:  # either survivor may queue it first
        for survivor in ports[1:]:
            got = client(survivor).execute_command("GETJOB", "TIMEOUT", 200, "FROM", "q")
            if got:
                break
    assert got and got[0][1] == job_id and got[0][2] == b"survivor"
    assert time.monotonic() - t0 >= 2.7  # not before the backoff (3 s, -10 %)
    assert client(survivor).execute_command("ACKJOB", job_id) == 1


def test_bad_delivery_options_are_refused_and_change_nothing(created):  # noqa: F811
    ports = created(3, "--node-timeout", "3000")
    r = client(ports[0])
    job_id = r.execute_command("ADDJOB", "q", "kept", 60000, "REPLICATE", 3, "RETRY", 30, "TTL", 100,
                               "BACKOFF", 1, 5, "MAXDELIVER", 5)  # fmt: skip
    all_holders(ports, job_id)
    assert r.execute_command("GETJOB", "NOHANG", "FROM", "q")[0][1] == job_id
    wait_for(lambda: all(show(p, job_id)["deliveries"] == 1 for p in ports), timeout=10, what="delivery counted")

    def snapshot() -> list:
        out = []
        for p in ports:
            info = show(p, job_id)
            out.append((info["state"], info["nacks"], info["deliveries"], info.get("last-nack-reason"),
                        qlen(p, "q"), stats(p)["registered_jobs"]))  # fmt: skip
        return out

    before = snapshot()
    add = ["ADDJOB", "q", "x", 0, "RETRY", 10, "TTL", 60]
    bad_addjobs = [
        (["BACKOFF", -1, 2], "BACKOFF min and max must be non negative"),
        (["BACKOFF", "x", 2], "BACKOFF min and max must be non negative"),
        (["BACKOFF", 1, "y"], "BACKOFF min and max must be non negative"),
        (["BACKOFF", 3, 2], "BACKOFF min is above max"),
        (["BACKOFF", 0, 0], "BACKOFF max must be above 0"),
        (["BACKOFF", 1, 61], "BACKOFF max is beyond the job's TTL"),
        (["BACKOFF", 1], "syntax error"),
        (["MAXDELIVER", 0], "MAXDELIVER must be a number of deliveries >= 1"),
        (["MAXDELIVER", -2], "MAXDELIVER must be a number of deliveries >= 1"),
        (["MAXDELIVER", "three"], "MAXDELIVER must be a number of deliveries >= 1"),
        (["DEADLETTER", "q"], "DEADLETTER must name another queue"),
        (["DEADLETTER", ""], "DEADLETTER needs a queue name"),
        (["BACKOFF", 1, 2, "BACKOFF", 1, 2], "BACKOFF given twice"),
        (["MAXDELIVER", 2, "MAXDELIVER", 3], "MAXDELIVER given twice"),
        (["DEADLETTER", "a", "DEADLETTER", "b"], "DEADLETTER given twice"),
    ]
    for opts, message in bad_addjobs:
        with pytest.raises(redis.ResponseError) as exc:
            r.execute_command(*add, *opts)
        assert str(exc.value).startswith(message) or message in str(exc.value), (opts, str(exc.value))
    for opts in (["MAXDELIVER", 3], ["BACKOFF", 1, 2]):  # RETRY 0: never delivered twice
        with pytest.raises(redis.ResponseError, match="need a RETRY above 0"):
            r.execute_command("ADDJOB", "q", "x", 0, "RETRY", 0, "TTL", 60, *opts)
    bad_nacks = [
        (["DELAY", -1], "DELAY must be a non negative number"),
        (["DELAY", "soon"], "DELAY must be a non negative number"),
        (["DELAY", 1000], "is beyond the TTL left to job"),
        (["DEAD", "DELAY", 1], "DEAD and DELAY together"),
        (["DELAY", 1, "DELAY", 2], "DELAY given twice"),
        (["REASON", "a", "REASON", "b"], "REASON given twice"),
        (["DEAD", "DEAD"], "DEAD given twice"),
        (["REASON", "x" * 1025], "REASON is 1025 bytes, at most 1024"),
        (["DELAY", 1, "SOON"], "syntax error near"),
        (["DELAY"], "syntax error"),
    ]
    for nodeport in ports:  # any holder refuses the same way
        for opts, message in bad_nacks:
            with pytest.raises(redis.ResponseError) as exc:
                client(nodeport).execute_command("NACK", job_id, *opts)
            assert message in str(exc.value), (opts, str(exc.value))
    assert snapshot() == before
    assert all(show(p, dead_letter_id(job_id)) is None for p in ports)
    # and the job still works as it should
    assert r.execute_command("NACK", job_id, "REASON", "ok now") == 1
    wait_for(lambda: all(show(p, job_id)["last-nack-reason"] == b"ok now" for p in ports), timeout=10,
             what="the reason everywhere")  # fmt: skip
    assert all(client(p).ping() for p in ports)  # no node crashed on any of it
