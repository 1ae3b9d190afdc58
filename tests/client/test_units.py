"""The I/O-free parts: error mapping, reply parsing, addresses, backoff, node choice, affinity, failure gate."""

from __future__ import annotations

import dataclasses
import random

import pytest

from disque_py.client import commands as cmd
from disque_py.client.cluster import Affinity, Backoff, Topology, parse_address, parse_seeds
from disque_py.client.errors import (
    AckedError,
    AuthError,
    BadIdError,
    BatchError,
    CommandError,
    LeavingError,
    NoJobError,
    NoReplicationError,
    PausedError,
    QueueFullError,
    ServerError,
    TooLateError,
    error_from_reply,
)
from disque_py.client.model import DeadLetter, HelloInfo, Job, NodeInfo
from disque_py.client.worker import FailureGate, describe_error

ID = "D-dcb833cf-8YL1NT17e9+wsA/09NqxscQI-05a1"


@pytest.mark.parametrize(
    "reply, cls, code",
    [
        ("NOREPL Timeout reached", NoReplicationError, "NOREPL"),
        ("MAXLEN Queue is already longer", QueueFullError, "MAXLEN"),
        ("PAUSED Queue paused in input, try later", PausedError, "PAUSED"),
        ("LEAVING This node is leaving the cluster", LeavingError, "LEAVING"),
        ("NOJOB Job not known", NoJobError, "NOJOB"),
        ("BADID Invalid Job ID format.", BadIdError, "BADID"),
        ("TOOLATE Half of job TTL already elapsed", TooLateError, "TOOLATE"),
        ("ACKED Job already acknowledged.", AckedError, "ACKED"),
        ("NOAUTH Authentication required.", AuthError, "NOAUTH"),
        ("WRONGPASS invalid username-password pair", AuthError, "WRONGPASS"),
        ("ERR invalid password", AuthError, "ERR"),
        ("ERR MAXLEN must be a positive number", CommandError, "ERR"),  # an ERR, not a MAXLEN
        ("ERR syntax error", CommandError, "ERR"),
        ("NOPROTO sorry", ServerError, "NOPROTO"),
        ("something lowercase", CommandError, "ERR"),
        (b"NOJOB bytes too", NoJobError, "NOJOB"),
    ],
)
def test_error_mapping(reply, cls, code):
    err = error_from_reply(reply)
    assert type(err) is cls and err.code == code
    text = reply.decode() if isinstance(reply, bytes) else reply
    assert str(err) == (text if text.split(" ")[0].isupper() else "ERR " + text)


def test_batch_error_lists_results():
    e = BatchError(["id1", QueueFullError("full"), "id3"])
    assert e.errors == [e.results[1]] and "1 of 3" in str(e)


def test_parse_getjob_and_job_properties():
    reply = [
        [b"q", ID.encode(), b"body", b"nacks", 2, b"additional-deliveries", 1],
        [b"q2", ID.encode(), b"\xff"],
    ]
    a, b = cmd.parse_getjob(reply)
    assert a == Job("q", ID, b"body", 2, 1) and a.attempt == 4 and a.node_prefix == "dcb833cf"
    assert b.nacks == 0 and b.attempt == 1 and b.body == b"\xff"
    assert cmd.parse_getjob(None) == []
    with pytest.raises(dataclasses.FrozenInstanceError, match="cannot assign to field 'body'"):
        a.body = b"x"


def test_job_helpers():
    assert Job("q", ID, b'{"a": 1}').json() == {"a": 1}
    import msgpack

    assert Job("q", ID, msgpack.packb([1, "x"])).msgpack() == [1, "x"]
    assert Job("q", ID, "é".encode("latin-1")).text("latin-1") == "é"


def test_parse_hello_and_info():
    reply = [1, b"aaaa1111" + b"0" * 32, [b"aaaa1111" + b"0" * 32, b"", b"7711", b"1"],
             [b"bbbb2222" + b"0" * 32, b"10.0.0.2", b"7712", b"100"]]  # fmt: skip
    hello = cmd.parse_hello(reply, via_host="seed.example")
    assert hello.version == 1 and hello.myself == NodeInfo("aaaa1111" + "0" * 32, "seed.example", 7711, 1)
    assert hello.nodes[1].address == ("10.0.0.2", 7712) and hello.nodes[1].priority == 100
    assert hello.nodes[1].prefix == "bbbb2222"
    info = cmd.parse_info(b"# Server\r\ndisque_version:1.0-rc1\r\nuptime:12\r\nratio:1.5\r\n\r\n# Jobs\r\nx:y\r\n")
    assert info == {"disque_version": "1.0-rc1", "uptime": 12, "ratio": 1.5, "x": "y"}


def test_command_argv():
    call = cmd.addjob("q", "é", timeout_ms=100, replicate=2, delay=3, retry=4, ttl=50, maxlen=9, async_=True)
    assert call.argv == (b"ADDJOB", b"q", "é".encode(), 100, b"REPLICATE", 2, b"DELAY", 3, b"RETRY", 4,
                         b"TTL", 50, b"MAXLEN", 9, b"ASYNC")  # fmt: skip
    assert not call.retry_safe and call.blocks == 0.1
    assert cmd.addjob("q", b"", timeout_ms=0).blocks is None  # waits for replication without bound
    get = cmd.getjob(["a", "b"], count=5, timeout_ms=200)
    assert get.argv == (b"GETJOB", b"TIMEOUT", 200, b"COUNT", 5, b"WITHCOUNTERS", b"FROM", b"a", b"b")
    assert get.blocks == 0.2 and get.retry_safe
    assert cmd.getjob(["a"]).blocks is None and cmd.getjob(["a"], nohang=True).blocks == 0.0
    assert cmd.jscan(0, queue="q", states=["queued", "active"], reply="all").argv == (
        b"JSCAN",
        0,
        b"QUEUE",
        b"q",
        b"STATE",
        b"queued",
        b"STATE",
        b"active",
        b"REPLY",
        b"all",
    )
    for bad in (dict(replicate=0), dict(ttl=0), dict(delay=-1), dict(maxlen=0), dict(timeout_ms=-1)):
        with pytest.raises(ValueError, match="^%s must be >= " % next(iter(bad))):
            cmd.addjob("q", b"x", **bad)
    with pytest.raises(TypeError, match="retry must be an int, not bool"):
        cmd.addjob("q", b"x", retry=True)
    with pytest.raises(TypeError, match="job body must be bytes or str, not NoneType"):
        cmd.addjob("q", None)


@pytest.mark.parametrize(
    "text, expected",
    [("h:1", ("h", 1)), ("h", ("h", 7711)), ("[::1]:7712", ("::1", 7712)), ("::1", ("::1", 7711)),
     (("h", "9"), ("h", 9))],
)  # fmt: skip
def test_parse_address(text, expected):
    assert parse_address(text) == expected


def test_parse_seeds():
    assert parse_seeds("a:1, b:2 a:1") == [("a", 1), ("b", 2)]
    assert parse_seeds(["a:1", ("b", 2), "c:3,d:4"]) == [("a", 1), ("b", 2), ("c", 3), ("d", 4)]
    assert parse_seeds(("h", 5)) == [("h", 5)]
    for bad in ("", []):
        with pytest.raises(ValueError, match="at least one node address is needed"):
            parse_seeds(bad)
    for bad in ("h:0", "h:99999", "h:x"):
        with pytest.raises(ValueError, match="bad port in node address '%s'" % bad):
            parse_seeds(bad)


def test_backoff_grows_caps_and_jitters():
    exact = Backoff(initial=0.1, maximum=1.0, factor=2.0, jitter=0.0)
    assert [exact.delay(n, random.Random()) for n in range(6)] == pytest.approx([0.1, 0.2, 0.4, 0.8, 1.0, 1.0])
    assert exact.base(10_000) == 1.0
    jittered = Backoff(initial=1.0, maximum=8.0, jitter=0.5)
    rng = random.Random(3)
    for n in range(8):
        for _ in range(50):
            d = jittered.delay(n, rng)
            assert jittered.base(n) * 0.5 <= d <= jittered.base(n)
    # the same seed gives the same delays
    assert [jittered.delay(n, random.Random(9)) for n in range(4)] == [
        jittered.delay(n, random.Random(9)) for n in range(4)
    ]
    with pytest.raises(ValueError, match="^invalid backoff"):
        Backoff(initial=2, maximum=1)


def node(i: int, priority: int = 1) -> NodeInfo:
    return NodeInfo(("%08d" % i) + "x" * 32, "10.0.0.%d" % i, 7711, priority)


def test_topology_orders_by_priority_and_avoids_down_nodes():
    topo = Topology([("seed", 1)], random.Random(1), down_for=5.0)
    assert topo.candidates(0.0) == [("seed", 1)]
    topo.update(HelloInfo(1, node(1).id, (node(1), node(2), node(3, 100), node(4, 10))))
    order = topo.candidates(0.0)
    assert set(order[:2]) == {node(1).address, node(2).address}
    assert order[2:] == [node(4).address, node(3).address, ("seed", 1)]
    topo.mark_down(node(1).address, now=10.0)
    assert topo.candidates(11.0)[0] == node(2).address and topo.candidates(11.0)[-1] == node(1).address
    assert topo.candidates(15.0)[0] in (node(1).address, node(2).address)  # back after down_for
    # random order within a priority: each comes first for some seed
    seen = set()
    for seed in range(20):
        t = Topology([], random.Random(seed))
        t.update(HelloInfo(1, node(1).id, (node(1), node(2))))
        seen.add(t.candidates(0.0)[0])
    assert seen == {node(1).address, node(2).address}


def test_topology_better_node_only_for_lower_priority():
    topo = Topology([], random.Random(0))
    topo.update(HelloInfo(1, node(1).id, (node(1), node(2), node(3))))
    assert topo.better_node(node(1).id, 0.0) is None
    topo.set_priority(node(1).id, 100)  # -LEAVING
    assert topo.better_node(node(1).id, 0.0) in (node(2).address, node(3).address)
    topo.mark_down(node(2).address, 0.0)
    assert topo.better_node(node(1).id, 1.0) == node(3).address
    assert topo.node_with_prefix("00000003") == node(3) and topo.node_with_prefix("zz") is None
    assert topo.better_node("unknown", 0.0) is None


def test_topology_trusts_a_node_about_itself_over_gossip():
    topo = Topology([], random.Random(0), leaving_for=60.0)
    topo.update(HelloInfo(1, node(1).id, (node(1, 100), node(2))), now=0.0)  # node 1 says: leaving
    topo.update(HelloInfo(1, node(2).id, (node(1, 1), node(2))), now=1.0)  # node 2 has not heard yet
    assert topo.nodes[node(1).id].priority == 100
    topo.update(HelloInfo(1, node(2).id, (node(1, 1), node(2))), now=61.0)  # old news by now
    assert topo.nodes[node(1).id].priority == 1
    topo.set_priority(node(2).id, 100, now=61.0)  # -LEAVING from node 2
    topo.update(HelloInfo(1, node(1).id, (node(1), node(2))), now=62.0)
    assert topo.nodes[node(2).id].priority == 100 and topo.better_node(node(2).id, 62.0) == node(1).address


def test_affinity_suggests_the_dominant_other_node():
    a = Affinity(window=10, share=0.5, min_jobs=5)
    a.observe(["me"] * 4)
    assert a.suggest("me") is None  # not enough jobs yet
    a.observe(["other"] * 3)
    assert a.suggest("me") is None  # 3 of 7 is not most
    a.observe(["other"] * 3)
    assert a.suggest("me") == "other"  # 6 of 10
    assert a.suggest("other") is None  # already there
    a.reset()
    assert a.suggest("me") is None
    with pytest.raises(ValueError, match="^invalid affinity parameters"):
        Affinity(share=1.5)


def test_failure_gate_backs_off_then_probes():
    gate = FailureGate(Backoff(initial=1.0, maximum=4.0, jitter=0.0), window=2, rng=random.Random())
    assert gate.allowance(0.0) == (None, None)
    assert gate.failure("a", 0.0) is None  # one job failed: keep going
    assert gate.failure("b", 0.0) == 1.0  # every job of the window failed: back off 1 s
    assert gate.allowance(0.5) == (0, 1.0)
    assert gate.failure("c", 0.6) is None  # in-hand jobs failing do not extend it
    assert gate.allowance(1.0) == (1, None)  # probe one job
    gate.took_probe("p1")
    assert gate.allowance(1.1) == (0, None)  # wait for its outcome
    assert gate.failure("old", 1.2) is None  # an older job failing is not the probe
    gate.success("old2")  # nor is an older job succeeding
    assert gate.allowance(1.25) == (0, None)
    assert gate.failure("p1", 1.3) == 2.0  # probe failed: longer
    assert gate.allowance(3.3) == (1, None)
    gate.took_probe("p2")
    gate.neutral("p2")  # dead-lettered without running: probe again
    assert gate.allowance(3.4) == (1, None)
    gate.took_probe("p3")
    assert gate.failure("p3", 4.0) == 4.0
    gate.allowance(8.0)
    gate.took_probe("p4")
    assert gate.failure("p4", 8.0) == 4.0  # capped
    gate.allowance(12.0)
    gate.took_probe("p5")
    gate.success("p5")
    assert gate.allowance(12.1) == (None, None) and gate.level == 0 and gate.failing == 0


def test_failure_gate_trips_on_most_jobs_failing_not_on_a_few_poison_jobs():
    gate = FailureGate(Backoff(initial=1.0, maximum=4.0, jitter=0.0), window=20, rng=random.Random(), ratio=0.9)
    # 10 poison jobs failing again and again among good jobs: never a pause
    for round_ in range(5):
        for i in range(40):
            if i % 4 == 0:
                assert gate.failure("poison-%d" % (i // 4), float(round_)) is None
            else:
                gate.success("good-%d-%d" % (round_, i))
    assert gate.state == FailureGate.OPEN
    # a job failing again counts once: 10 failing jobs, 20 attempts each, cannot fill a window of 20
    for _ in range(20):
        for i in range(10):
            assert gate.failure("poison-%d" % i, 6.0) is None
    assert gate.state == FailureGate.OPEN and gate.failing == 10
    # an outage: every new job fails; at 18 of the last 20, pause
    delays = [gate.failure("new-%d" % i, 7.0) for i in range(10)]
    assert delays[:7] == [None] * 7 and delays[7] == 1.0  # the 8th new one: 18 of the last 20 failed
    assert gate.state == FailureGate.BACKING_OFF
    with pytest.raises(ValueError, match="backoff_after must be >= 1"):
        FailureGate(Backoff(), window=0, rng=random.Random())
    with pytest.raises(ValueError, match=r"backoff_ratio must be in \(0, 1\]"):
        FailureGate(Backoff(), window=5, rng=random.Random(), ratio=0.0)


class Unprintable(Exception):
    def __str__(self):
        raise RuntimeError("no str")


class Hopeless(Exception):
    def __str__(self):
        raise RuntimeError("no str")

    def __repr__(self):
        raise RuntimeError("no repr")


def test_describe_error_never_raises():
    assert describe_error(ValueError("boom")) == "ValueError: boom"
    assert describe_error(KeyError()) == "KeyError"
    assert describe_error(Unprintable("x")).startswith("Unprintable: Unprintable(")
    assert describe_error(Hopeless()) == "Hopeless: <unprintable Hopeless>"


def test_dead_letter_round_trip():
    for body in (b"plain text", b"\xff\x00\xfe", "ünï".encode()):
        job = Job("q\udcff", ID, body, 3, 1)
        dl = DeadLetter.from_job(job, "ValueError: boom")
        back = DeadLetter.parse(dl.encode())
        assert back == dl and back.body == body and back.attempt == 5 and back.queue == "q\udcff"
    assert b"body_base64" in DeadLetter.from_job(Job("q", ID, b"\xff"), "e").encode()
    assert b'"body": "plain"' in DeadLetter.from_job(Job("q", ID, b"plain"), "e").encode()


def test_public_names_and_lazy_imports():
    import subprocess
    import sys

    import disque_py
    import disque_py.aio
    import disque_py.client as client

    assert set(client.__all__) == set(client._WHERE)
    for name in disque_py.__all__:
        assert getattr(disque_py, name) is not None
    assert disque_py.aio.Client.__module__ == "disque_py.client.aio"
    # the server's command line does not load the client (nor redis-py)
    probe = "import sys, disque_py.cli; print('redis' in sys.modules, 'disque_py.client.sync' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, check=True, timeout=30)
    assert out.stdout.split() == [b"False", b"False"]


def test_disque_calls_send_what_they_sent_and_new_options_only_when_given():
    assert cmd.addjob_argv("q", b"b") == (b"ADDJOB", b"q", b"b", 5000)
    assert cmd.addjob_argv("q", b"b", retry=3, ttl=60) == (b"ADDJOB", b"q", b"b", 5000, b"RETRY", 3, b"TTL", 60)
    assert cmd.nack("D-1", "D-2").argv == cmd.nack_argv(["D-1", "D-2"]) == (b"NACK", b"D-1", b"D-2")
    assert cmd.addjob_argv("q", b"b", backoff=(0.5, 30), maxdeliver=3, deadletter="q.x")[4:] == (
        b"BACKOFF", b"0.5", b"30", b"MAXDELIVER", 3, b"DEADLETTER", b"q.x")  # fmt: skip
    assert cmd.nack_argv(["D-1"], delay=1.23456, reason="boom") == (
        b"NACK", b"D-1", b"DELAY", b"1.235", b"REASON", b"boom")  # fmt: skip
    assert cmd.nack_argv(["D-1"], delay=0.0001) == (b"NACK", b"D-1", b"DELAY", b"0")
    assert cmd.nack_argv(["D-1"], dead=True) == (b"NACK", b"D-1", b"DEAD")
    for bad, why in ((dict(delay=-1), "delay must be a finite number >= 0, got -1"),
                     (dict(delay=float("nan")), "delay must be a finite number >= 0, got nan"),
                     (dict(delay=1, dead=True), "either DEAD or DELAYed, not both")):  # fmt: skip
        with pytest.raises(ValueError, match=why):
            cmd.nack_argv(["D-1"], **bad)
    with pytest.raises(TypeError, match="delay must be a number of seconds, not str"):
        cmd.nack_argv(["D-1"], delay="1")
    with pytest.raises(TypeError, match=r"backoff must be a \(min_seconds, max_seconds\) pair"):
        cmd.addjob_argv("q", b"b", backoff=1)
    # REASON: at most 1024 bytes, never half a character
    assert cmd.cut_reason("é" * 600) == ("é" * 512).encode() and len(cmd.cut_reason("a" + "é" * 600)) == 1023
    assert cmd.cut_reason(b"\xff" * 2000) == b"\xff" * 1024
    # a lone surrogate (an exception's message may hold one) is sent escaped, not raised
    assert cmd.cut_reason("bad \ud800") == b"bad \\ud800" and cmd.cut_reason("\udcff") == b"\xff"


def test_nack_trace_is_sent_whole_or_by_its_tail():
    tb = "Traceback (most recent call last):\n  File \"t.py\", line 3, in f\nKeyError: 'missing'\n"
    assert cmd.nack_argv(["D-1"], delay=1, reason="KeyError: 'missing'", trace=tb) == (
        b"NACK", b"D-1", b"DELAY", b"1", b"REASON", b"KeyError: 'missing'", b"TRACE", tb.encode())  # fmt: skip
    assert cmd.nack_argv(["D-1"], trace=b"tb", dead=True) == (b"NACK", b"D-1", b"TRACE", b"tb", b"DEAD")
    assert cmd.cut_trace(b"x" * cmd.MAX_TRACE_BYTES) == b"x" * cmd.MAX_TRACE_BYTES  # up to the limit: as it is
    # longer: its tail, from a line's start, after a line that says what was cut
    lines = "".join("  File \"f%d.py\", line %d, in g\n" % (i, i) for i in range(4000)) + "KeyError: 'é'\n"
    cut = cmd.cut_trace(lines)
    assert len(cut) <= cmd.MAX_TRACE_BYTES and cut.endswith("KeyError: 'é'\n".encode())
    head, first, rest = cut.split(b"\n", 2)
    left_out = len(lines.encode()) - len(cut) + len(head) + 1
    assert head == b"[traceback cut: its first %d bytes left out]" % left_out
    assert first.startswith(b'  File "f') and lines.encode().endswith(first + b"\n" + rest)
    # one endless line (no line start to cut at): never half a character, never over the limit
    for text in ("é" * 20000, "€" * 9000 + "x", b"\x80" * 20000, "\ud800" * 9000):
        cut = cmd.cut_trace(text)
        assert len(cut) <= cmd.MAX_TRACE_BYTES and cut.startswith(b"[traceback cut: its first ")
        if isinstance(text, str):
            cut.decode("utf-8")


def test_job_extras_from_withcounters():
    plain = [[b"q", b"D-1", b"b", b"nacks", 2, b"additional-deliveries", 1]]
    [job] = cmd.parse_getjob(plain)
    assert job == Job("q", "D-1", b"b", 2, 1) and job.attempt == 4 and job.deliveries is None
    rich = [[b"q", b"D-1", b"b", b"nacks", 1, b"additional-deliveries", 0, b"deliveries", 5,
             b"backoff-min-ms", 500, b"backoff-max-ms", 2000, b"maxdeliver", 5, b"deadletter", b"q.dead",
             b"last-nack-reason", b"boom"]]  # fmt: skip
    [job] = cmd.parse_getjob(rich)
    assert (job.deliveries, job.maxdeliver, job.deadletter, job.backoff) == (5, 5, "q.dead", (0.5, 2.0))
    assert job.attempt == 5 and job.last_delivery and job.last_nack_reason == "boom" and not job.is_dead_letter


def test_dedup_key_is_sent_only_when_given_and_makes_addjob_safe_to_resend():
    assert cmd.addjob_argv("q", b"b", dedup="order-1") == (b"ADDJOB", b"q", b"b", 5000, b"DEDUP", b"order-1")
    assert cmd.addjob_argv("q", b"b", dedup=b"\xff\x00")[4:] == (b"DEDUP", b"\xff\x00")
    assert cmd.addjob_argv("q", b"b", dedup="k" * 512)[-1] == b"k" * 512
    assert not cmd.addjob("q", b"b").retry_safe  # a plain ADDJOB may duplicate when re-sent
    assert cmd.addjob("q", b"b").argv == (b"ADDJOB", b"q", b"b", 5000)
    assert cmd.addjob("q", b"b", dedup="k").retry_safe
    for bad, exc in (("", ValueError), (b"", ValueError), ("k" * 513, ValueError), ("é" * 257, ValueError), (7, TypeError)):
        with pytest.raises(exc, match="dedup key"):
            cmd.addjob_argv("q", b"b", dedup=bad)


def test_add_jobs_dedup_keys_per_body():
    bodies = [b"a", b"b", b"c"]
    assert cmd.dedup_keys(bodies, None) == [None, None, None]
    assert cmd.dedup_keys(bodies, lambda body: b"k-" + body) == [b"k-a", b"k-b", b"k-c"]
    assert cmd.dedup_keys(bodies, ["1", None, "3"]) == ["1", None, "3"]
    assert cmd.dedup_keys(bodies, iter(["1", "2", "3"])) == ["1", "2", "3"]
    with pytest.raises(ValueError, match="2 dedup keys for 3 bodies"):
        cmd.dedup_keys(bodies, ["1", "2"])
    with pytest.raises(TypeError, match="not a single key"):
        cmd.dedup_keys(bodies, "one-key")


def test_job_dedup_from_withcounters_and_its_absence():
    reply = [[b"q", b"D-1", b"b", b"nacks", 0, b"additional-deliveries", 0, b"deliveries", 1, b"dedup", b"order-\xff"]]
    [job] = cmd.parse_getjob(reply)
    assert job.dedup == "order-\udcff" and job.attempt == 1 and job.maxdeliver is None
    assert job.dedup.encode("utf-8", "surrogateescape") == b"order-\xff"  # round-trips to the key sent
    [plain] = cmd.parse_getjob([[b"q", b"D-1", b"b", b"nacks", 0, b"additional-deliveries", 0]])
    assert plain.dedup is None
    [bare] = cmd.parse_getjob([[b"q", b"D-1", b"b"]])
    assert bare.dedup is None
