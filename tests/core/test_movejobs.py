"""MOVEJOBS node-id job-id...: jobs queued here leave for another node as a NEEDJOBS from it
would take them (core/federation.py, ``Federation.cmd_movejobs``); ``disque-py drain`` empties
a leaving node with it. Three wired nodes (``wired.Wired``: the real bus codec)."""

from __future__ import annotations

from disque_py.core.job import ACTIVE, QUEUED
from disque_py.core.replies import Error

from .wired import Wired


def add(w: Wired, i: int, *opts) -> bytes:
    reply = w.cmd(i, "ADDJOB", "q", "body", 0, *opts)
    assert isinstance(reply, bytes) and len(reply) == 40, reply
    return bytes(reply)


def test_a_job_with_a_copy_elsewhere_is_queued_on_that_holder_with_its_id():
    w = Wired(3)
    job_id = add(w, 0, "REPLICATE", 2, "RETRY", 30)
    other = next(i for i in w.holders(job_id) if i != 0)
    assert w.queued_on(job_id) == [0]
    assert w.cmd(0, "MOVEJOBS", w.ids[other], job_id) == 1
    assert w.queued_on(job_id) == [other]
    mine = w.job(0, job_id)
    assert mine is not None and mine.state == ACTIVE  # its copy stays until told otherwise
    assert w.cmd(0, "DELJOB", job_id) == 1
    got = w.cmd(other, "GETJOB", "NOHANG", "FROM", "q")
    assert got[0][1] == job_id
    assert w.cmd(other, "ACKJOB", job_id) == 1


def test_a_single_copy_gets_a_new_holder_and_a_retry_zero_job_leaves_whole():
    w = Wired(3)
    once = add(w, 0, "REPLICATE", 1, "RETRY", 0)
    kept = add(w, 0, "REPLICATE", 1, "RETRY", 30)
    assert w.holders(once) == [0] and w.holders(kept) == [0]
    assert w.cmd(0, "MOVEJOBS", w.ids[2], once, kept) == 2
    assert w.queued_on(once) == [2] and w.queued_on(kept) == [2]
    assert w.holders(once) == [2]  # at most once: never two copies
    assert w.job(0, kept).state == ACTIVE and w.ids[2] in w.job(0, kept).delivered
    assert w.ids[0] in w.job(2, kept).delivered


def test_jobs_not_queued_here_are_skipped_and_counted_out():
    w = Wired(3)
    queued = add(w, 0, "REPLICATE", 1)
    taken = add(w, 0, "REPLICATE", 1)
    assert w.cmd(0, "GETJOB", "NOHANG", "FROM", "q")[0][1] == queued
    unknown = bytes(queued[:-4]) + b"ffff"
    assert w.cmd(0, "MOVEJOBS", w.ids[1], taken, unknown, queued) == 1
    assert w.job(0, queued).state == ACTIVE and w.queued_on(taken) == [1]
    assert w.cmd(0, "MOVEJOBS", w.ids[1], taken) == 0  # moved already: active here now


def test_bad_input_is_refused_and_moves_nothing():
    w = Wired(3)
    job_id = add(w, 0, "REPLICATE", 1)
    cases = [
        (["MOVEJOBS", w.ids[1], "not-an-id"], "BADID"),
        (["MOVEJOBS", w.ids[0], job_id], "ERR MOVEJOBS needs another node"),
        (["MOVEJOBS", "f" * 40, job_id], "ERR no link to node"),
        (["MOVEJOBS", b"\xff" * 200, job_id], "ERR no link to node"),
        (["MOVEJOBS", w.ids[1]], "ERR wrong number of arguments"),
    ]
    for argv, prefix in cases:
        reply = w.cmd(0, *argv)
        assert isinstance(reply, Error) and reply.startswith(prefix), (argv, reply)
    w.partition({0}, {1, 2})
    reply = w.cmd(0, "MOVEJOBS", w.ids[1], job_id)
    assert isinstance(reply, Error) and reply.startswith("ERR no link to node")
    assert w.queued_on(job_id) == [0] and w.sent == [s for s in w.sent if s[2] != "YOURJOBS"]
