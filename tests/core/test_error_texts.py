"""Errors that carry the numbers: NOREPL says how many nodes were reachable and how many
copies were asked (or confirmed), after Disque's own text, which clients match on."""

from __future__ import annotations

from disque_py.core.effects import BLOCKED, Send
from disque_py.core.replies import Error

PEER = "f" * 40
LOST = "e" * 40
NOT_ENOUGH = "NOREPL Not enough reachable nodes for the requested replication level"


def three_nodes_one_lost(h):
    h.node.ctx.cluster_size = 3  # the lost node is still a member: the default REPLICATE is 3
    h.node.ctx.known_nodes = [h.node.id, PEER, LOST]
    h.node.ctx.reachable = [PEER]
    h.node.ctx.live_nodes = 1


def test_default_addjob_with_a_node_lost_says_reachable_and_asked(h):
    three_nodes_one_lost(h)
    reply = h.cmd("ADDJOB", "q", "body", 0)
    assert reply == Error(NOT_ENOUGH + " (2 reachable, 3 asked)")
    assert reply.prefix == "NOREPL"
    assert h.cmd("ADDJOB", "q", "body", 0, "REPLICATE", 5) == Error(NOT_ENOUGH + " (2 reachable, 5 asked)")
    assert h.cmd("QLEN", "q") == 0


def test_a_node_without_a_link_but_not_failing_is_counted_reachable(h):
    three_nodes_one_lost(h)
    h.node.ctx.live_nodes = 2  # PFAIL not reached yet: Disque still counts it, so the ADDJOB waits
    assert h.cmd("ADDJOB", "q", "body", 0) is BLOCKED
    h.node.ctx.live_nodes = 0
    h.node.ctx.reachable = []
    assert h.cmd("ADDJOB", "q", "body", 0, "REPLICATE", 2) == Error(NOT_ENOUGH + " (1 reachable, 2 asked)")


def test_leaving_node_says_why_and_counts_only_the_others(h):
    three_nodes_one_lost(h)
    h.node.ctx.leaving = True
    assert h.cmd("ADDJOB", "q", "body", 0, "REPLICATE", 2) == Error(
        NOT_ENOUGH + ", since I'm unable to hold a copy of the message for the following reason: "
        "I'm leaving the cluster (1 other nodes reachable, 2 asked)"
    )
    # Two short: Disque gives no reason then, the numbers still come.
    assert h.cmd("ADDJOB", "q", "body", 0, "REPLICATE", 3) == Error(NOT_ENOUGH + " (1 other nodes reachable, 3 asked)")


def test_timeout_says_how_many_copies_were_confirmed_of_how_many(h):
    h.node.ctx.cluster_size = 3
    h.node.ctx.known_nodes = [h.node.id, PEER, LOST]
    h.node.ctx.reachable = [PEER, LOST]
    h.node.ctx.live_nodes = 2
    assert h.cmd("ADDJOB", "q", "body", 500) is BLOCKED
    sends = [e for e in h.effects() if isinstance(e, Send)]
    job_id = sends[0].message[1][0]
    h.node.receive_data(PEER, "GOTJOB", [job_id], h.now)  # LOST never answers
    assert not h.replies()
    effects = h.advance(500)
    replies = [e.value for e in effects if getattr(e, "client", None) == 1]
    assert replies == [
        Error("NOREPL Timeout reached before replicating to the requested number of nodes (2 of 3 copies confirmed)")
    ]
    assert h.node.store.get(job_id) is None


def test_timeout_0_waits_with_no_limit_as_disque(h):
    # ADDJOB's timeout 0 is no limit (Disque's too): a holder that never answers keeps the
    # client waiting until the job's TTL ends, which answers NOREPL.
    h.node.ctx.cluster_size = 2
    h.node.ctx.reachable = [PEER]
    h.node.ctx.live_nodes = 1
    assert h.cmd("ADDJOB", "q", "body", 0, "TTL", 5) is BLOCKED
    h.effects()
    h.advance(4_000)
    assert not h.replies()
    effects = h.advance(1_500)
    replies = [e.value for e in effects if getattr(e, "client", None) == 1]
    assert len(replies) == 1 and replies[0].startswith("NOREPL job removed (expired?)"), replies


def test_maxlen_says_how_many_are_queued_and_the_maxlen_asked(h):
    for _ in range(3):
        h.add("q", "x")
    assert h.cmd("ADDJOB", "q", "x", 0, "MAXLEN", 3) == Error(
        "MAXLEN Queue is already longer than the specified MAXLEN count (3 jobs queued, MAXLEN 3)"
    )
    assert isinstance(h.cmd("ADDJOB", "q", "x", 0, "MAXLEN", 4), bytes)


def test_delay_over_ttl_says_both(h):
    assert h.cmd("ADDJOB", "q", "x", 0, "DELAY", 20, "TTL", 10) == (
        "ERR The specified DELAY is greater than TTL. Job refused since would never be delivered (DELAY 20 s, TTL 10 s)"
    )


def test_retry_0_with_the_default_replicate_says_the_default(h):
    h.node.ctx.cluster_size = 3
    h.node.ctx.reachable = [PEER, LOST]
    h.node.ctx.live_nodes = 2
    assert h.cmd("ADDJOB", "q", "x", 0, "RETRY", 0) == (
        "ERR With RETRY set to 0 please explicitly set REPLICATE to 1 (at-most-once delivery) "
        "(REPLICATE is 3 by default here)"
    )
    assert h.cmd("ADDJOB", "q", "x", 0, "RETRY", 0, "REPLICATE", 2) == (
        "ERR With RETRY set to 0 please explicitly set REPLICATE to 1 (at-most-once delivery)"
    )
