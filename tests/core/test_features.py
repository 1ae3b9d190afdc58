"""What each peer understands (``core/features.py``): a node sends a peer of an older release
only what that release understands, and a cluster of one release sends everything untouched."""

from __future__ import annotations

from disque_py.core.effects import Reply, Send
from disque_py.core.features import FEATURES, UNANNOUNCED, adapt, for_peer, release_key
from disque_py.core.job import job_priority
from disque_py.core.wire import job_to_wire

from .wired import Wired

ID = b"D-01234567-AAAAAAAAAAAAAAAAAAAAAAAA-05a1"


def test_the_release_of_before_announcements_understood_everything_of_ours_so_far():
    """0.1.0 had PRIORITY and RELEASE: a rolling upgrade from it trims nothing."""
    assert FEATURES <= UNANNOUNCED


def test_for_peer_trims_what_a_peer_does_not_understand():
    wire = [ID, b"q", b"body", 2, 100, 1, 0, 300, 0, 0, []]
    with_priority = wire + [None, 9]
    with_extra_and_priority = wire + [{"md": 3}, 9]
    none: frozenset[str] = frozenset()
    assert for_peer(("REPLJOB", with_priority, False), none) == ("REPLJOB", wire, False)
    assert for_peer(("REPLJOB", with_extra_and_priority, True), none) == ("REPLJOB", wire + [{"md": 3}], True)
    assert for_peer(("YOURJOBS", [with_priority, wire]), none) == ("YOURJOBS", [wire, wire])
    assert for_peer(("RETURNED", ID, ["a" * 40, 1]), none) is None
    assert for_peer(("RETURNED", ID, ["a" * 40, 1], 500), none) is None
    assert for_peer(("DELIVERED", ID, 2, ["a" * 40, 1]), none) == ("DELIVERED", ID, 2)
    # what a peer understands goes as it is (the same object: encoded once for every peer)
    for message in (("REPLJOB", with_priority, False), ("RETURNED", ID, []), ("DELIVERED", ID, 2, []),
                    ("GOTJOB", ID), ("REPLJOB", "not a list", False), ("YOURJOBS", "x")):  # fmt: skip
        assert for_peer(message, FEATURES) is message
    assert for_peer(("DELIVERED", ID, 2), none) == ("DELIVERED", ID, 2)
    assert for_peer(("REPLJOB", with_priority, False), frozenset({"returned"}))[1] == wire


def test_adapt_changes_only_the_messages_to_lacking_peers():
    a, b = "a" * 40, "b" * 40
    message = ("RETURNED", ID, [])
    reply = Reply(1, b"OK")
    kept = Send(a, message)
    got = adapt([reply, kept, Send(b, message), Send(b, ("GOTJOB", ID))], {b: frozenset()})
    assert got[:2] == [reply, kept] and got[0] is reply and got[1] is kept
    assert got[2:] == [Send(b, ("GOTJOB", ID))]


def test_a_peer_of_an_older_release_gets_a_copy_without_priority_and_no_returned():
    w = Wired(3)
    old = w.ids[2]
    w.node(0).ctx.lacking = {old: frozenset()}  # as the shell sets it from the peer's announcement
    job_id = w.cmd(0, "ADDJOB", "q", "urgent", 0, "REPLICATE", 3, "PRIORITY", 9, "RETRY", 60)
    assert job_priority(w.job(0, job_id)) == 9 and job_priority(w.job(1, job_id)) == 9
    assert job_priority(w.job(2, job_id)) == 5  # what it understands: the default
    w.sent.clear()
    got = w.cmd(0, "GETJOB", "NOHANG", "FROM", "q")
    assert got[0][1] == job_id
    assert w.cmd(0, "RELEASE", job_id) == 1
    returned_to = {dst for src, dst, kind in w.sent if kind == "RETURNED"}
    assert returned_to == {1}  # never to the peer that does not know RETURNED
    assert w.job(1, job_id).extra.returned == {w.ids[0]: 1}


def test_a_cluster_of_one_release_sends_everything_as_it_is():
    w = Wired(2)
    assert w.node(0).ctx.lacking == {}
    job_id = w.cmd(0, "ADDJOB", "q", "urgent", 0, "REPLICATE", 2, "PRIORITY", 9)
    assert job_priority(w.job(1, job_id)) == 9
    assert len(job_to_wire(w.job(1, job_id), w.now)) == 13


def test_releases_compare_by_their_numbers():
    assert release_key("0.10.0") > release_key("0.9.9") > release_key("0.2.0") > release_key("0.1.0")
    assert release_key("1.0rc1") == (1, 0) and release_key("x.y") == (0, 0)
