"""Replication across real node processes: 7 nodes, kill -9 of holders, acks collected everywhere."""

from __future__ import annotations

import os
import signal

import pytest
import redis

from .conftest import wait_for
from .test_cluster_process import created  # noqa: F401  (fixture)

pytestmark = pytest.mark.integration


def show(port: int, job_id: bytes) -> dict | None:
    reply = redis.Redis(port=port, socket_timeout=5).execute_command("SHOW", job_id)
    if reply is None:
        return None
    return {reply[i].decode(): reply[i + 1] for i in range(0, len(reply), 2)}


def port_of(ports: list[int], node_id: bytes) -> int:
    for p in ports:
        if redis.Redis(port=p).execute_command("CLUSTER", "MYID") == node_id:
            return p
    raise AssertionError("no node with id %r" % node_id)


def test_seven_nodes_kill_two_holders_then_ack_everywhere(created, tmp_path):  # noqa: F811
    ports = created(7, "--node-timeout", "1000")
    origin = redis.Redis(port=ports[0], socket_timeout=10)
    job_id = origin.execute_command("ADDJOB", "q", "survivor", 5000, "REPLICATE", 3, "RETRY", 2)
    info = show(ports[0], job_id)
    holders = info["nodes-delivered"]
    assert len(holders) == 3 and info["state"] == b"queued" and info["repl"] == 3
    holder_ports = [port_of(ports, h) for h in holders]
    for p in holder_ports:
        copy = show(p, job_id)
        assert copy is not None and sorted(copy["nodes-delivered"]) == sorted(holders)
    for p in set(ports) - set(holder_ports):
        assert show(p, job_id) is None
    # consume it on the origin without acking, then kill -9 the origin and one more holder
    assert origin.execute_command("GETJOB", "FROM", "q")[0][1] == job_id
    assert holder_ports[0] == ports[0]  # the creator lists itself first
    victims, survivor = holder_ports[:2], holder_ports[2]
    for p in victims:
        pid = int((tmp_path / "run" / ("node-%d" % p) / "disque.pid").read_text())
        os.kill(pid, signal.SIGKILL)
    # the survivor requeues it after RETRY and delivers it
    r = redis.Redis(port=survivor, socket_timeout=10)
    got = r.execute_command("GETJOB", "TIMEOUT", 10000, "FROM", "q")
    assert got and got[0][1] == job_id and got[0][2] == b"survivor"
    # ACK on a node that never had a copy: a dummy ack that finds the survivor
    others = [p for p in ports if p not in holder_ports]
    assert redis.Redis(port=others[0]).execute_command("ACKJOB", job_id) == 0
    wait_for(lambda: (show(survivor, job_id) or {}).get("state") == b"acked", timeout=10, what="survivor acked")
    # GC cannot finish while two holders are down: the ack waits on the survivor
    # (and is never requeued); the dummy ack is dropped once it found the owner.
    wait_for(lambda: show(others[0], job_id) is None, timeout=10, what="dummy ack dropped")
    assert all(show(p, job_id) is None for p in others)
    # bring the holders back (memory lost): the survivor's GC completes
    from .conftest import NodeProcess

    restarted = []
    try:
        for p in victims:
            node = NodeProcess(tmp_path / "again", port=p, dir=str(tmp_path / "run" / ("node-%d" % p)),
                               cluster_node_timeout=1000)  # fmt: skip
            restarted.append(node.start())
        wait_for(lambda: all(show(p, job_id) is None for p in ports), timeout=30, what="job collected everywhere")
    finally:
        for node in restarted:
            node.stop()


def test_cluster_forget_of_a_dead_holder_lets_the_ack_be_collected(created, tmp_path):  # noqa: F811
    """A holder killed for good never confirms the ack, which then waits on every other holder
    (until TTL, as in Disque). Once the operator runs CLUSTER FORGET on the dead node's ID,
    the next GC attempt counts it as confirmed and the job disappears."""
    ports = created(3, "--node-timeout", "1000")
    origin = redis.Redis(port=ports[0], socket_timeout=10)
    job_id = origin.execute_command("ADDJOB", "q", "body", 5000, "REPLICATE", 3, "RETRY", 60)
    dead = ports[2]
    dead_id = redis.Redis(port=dead).execute_command("CLUSTER", "MYID")
    os.kill(int((tmp_path / "run" / ("node-%d" % dead) / "disque.pid").read_text()), signal.SIGKILL)
    assert origin.execute_command("ACKJOB", job_id) == 1
    survivors = ports[:2]
    wait_for(lambda: all((show(p, job_id) or {}).get("state") == b"acked" for p in survivors), timeout=10,
             what="acked on both survivors")  # fmt: skip
    for p in survivors:
        assert redis.Redis(port=p).execute_command("CLUSTER", "FORGET", dead_id) == b"OK"
    wait_for(lambda: all(show(p, job_id) is None for p in survivors), timeout=30, what="ack collected")


def test_a_stopped_holder_gets_one_copy_of_a_big_job_not_one_per_resend(created, tmp_path):  # noqa: F811
    """A holder that reads nothing (SIGSTOP) leaves the first copy of a 16 MB job queued on the
    origin's link; the origin's resends skip that link instead of queueing another copy each
    time. On timeout the job is deleted everywhere, the stopped node included once it runs again."""
    import threading

    ports = created(3, "--node-timeout", "30000")
    origin = redis.Redis(port=ports[0], socket_timeout=20)
    pid = int((tmp_path / "run" / ("node-%d" % ports[2]) / "disque.pid").read_text())
    body = b"x" * 16_000_000
    result: list = []

    def add() -> None:
        try:
            result.append(origin.execute_command("ADDJOB", "big", body, 3000, "REPLICATE", 3))
        except redis.ResponseError as exc:
            result.append(exc)

    def pending() -> int:
        info = redis.Redis(port=ports[0], socket_timeout=5).execute_command("CLUSTER", "INFO").decode()
        return int(dict(line.split(":", 1) for line in info.split("\r\n") if ":" in line)["cluster_bus_pending_out_bytes"])

    os.kill(pid, signal.SIGSTOP)
    try:
        t = threading.Thread(target=add)
        t.start()
        highest = 0
        while t.is_alive():  # the 3 s ADDJOB timeout: resends at 50, 150, 350, 750, 1550, 2550 ms
            highest = max(highest, pending())
            t.join(0.05)
        assert len(result) == 1 and isinstance(result[0], redis.ResponseError)
        assert str(result[0]).startswith("NOREPL")
        assert 0 < highest < 2 * len(body), highest  # the first copy queued, never a second
    finally:
        os.kill(pid, signal.SIGCONT)
    wait_for(lambda: pending() == 0, timeout=20, what="the origin's link drained")
    ids = [redis.Redis(port=p).execute_command("QPEEK", "big", 1) for p in ports]
    assert ids == [[], [], []]
    wait_for(lambda: all(int(dict(redis.Redis(port=p).info())["registered_jobs"]) == 0 for p in ports),
             timeout=20, what="no copy left on any node")  # fmt: skip


def test_norepl_says_how_many_nodes_were_reachable_and_copies_confirmed(created, tmp_path):  # noqa: F811
    """One node of three lost: every default ADDJOB (REPLICATE 3, the cluster's size) answers
    NOREPL with the numbers once the node is flagged failing; a holder that never answers makes
    the ADDJOB timeout say how many copies were confirmed of how many."""
    ports = created(3, "--node-timeout", "1000")
    origin = redis.Redis(port=ports[0], socket_timeout=10)
    pids = [int((tmp_path / "run" / ("node-%d" % p) / "disque.pid").read_text()) for p in ports]
    # a holder stopped: the other node confirms, the stopped one cannot
    os.kill(pids[2], signal.SIGSTOP)
    try:
        with pytest.raises(redis.ResponseError) as exc:
            origin.execute_command("ADDJOB", "q", "body", 500)
    finally:
        os.kill(pids[2], signal.SIGCONT)
    assert str(exc.value) == (
        "NOREPL Timeout reached before replicating to the requested number of nodes (2 of 3 copies confirmed)")
    # killed: once flagged failing (PFAIL, as Disque counts), no ADDJOB waits for it
    dead_id = redis.Redis(port=ports[2]).execute_command("CLUSTER", "MYID").decode()
    os.kill(pids[2], signal.SIGKILL)
    wait_for(lambda: any(line.startswith(dead_id) and "fail" in line.split()[2]
                         for line in origin.execute_command("CLUSTER", "NODES").decode().splitlines()),
             timeout=15, what="the killed node flagged failing")  # fmt: skip
    for p in ports[:2]:
        with pytest.raises(redis.ResponseError) as exc:
            redis.Redis(port=p, socket_timeout=10).execute_command("ADDJOB", "q", "body", 0)
        assert str(exc.value) == "NOREPL Not enough reachable nodes for the requested replication level (2 reachable, 3 asked)"
    assert len(origin.execute_command("ADDJOB", "q", "body", 5000, "REPLICATE", 2)) == 40
