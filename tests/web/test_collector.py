"""The metrics collector in process, on a core node and a hand-made handle (no server)."""

from __future__ import annotations

import os
import time

from prometheus_client import generate_latest
from prometheus_client.parser import text_string_to_metric_families

from disque_py.config import Config
from disque_py.core.node import Node
from disque_py.web.handle import NodeHandle, Peer
from disque_py.web.metrics import LATENCY_BUCKETS_US, OTHER, make_registry

ME = "a" * 40


class FakeStat:
    def __init__(self, calls, errors, usec, buckets):
        self.calls, self.errors, self.usec, self.buckets = calls, errors, usec, buckets


class FakeStats:
    def __init__(self, by_name):
        self.by_name = by_name


def make(queues: dict[str, int], cmdstats=None, cap: int = 1000) -> tuple[Node, NodeHandle]:
    node = Node(ME, seed=os.urandom(20), now=1000, wall_offset=0, address=("127.0.0.1", 7711))
    node.ctx.cluster_size = 1
    for name, n in queues.items():
        for i in range(n):
            node.execute(1, [b"ADDJOB", name.encode(), b"x", b"0"], 1000)
    cfg = Config()
    cfg.admin_metrics_max_queues = cap
    handle = NodeHandle(
        config=cfg, acl=None, node=node, stats={"total_connections_received": 3}, clients={},
        start_time=time.time(), run_command=None, ask_peer=None,
        peers=lambda: [Peer(ME, "127.0.0.1", 7711, ("myself",), True),
                       Peer("b" * 40, "127.0.0.1", 7712, ("pfail",), False)],
        cmdstats=lambda: cmdstats,
    )  # fmt: skip
    return node, handle


def samples(handle) -> dict[tuple, float]:
    out = {}
    for fam in text_string_to_metric_families(generate_latest(make_registry(handle)).decode()):
        for s in fam.samples:
            out[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return out


def test_command_families_from_the_dispatchers_stats():
    buckets = [0] * (len(LATENCY_BUCKETS_US) + 1)
    buckets[0], buckets[3], buckets[-1] = 5, 2, 1  # <=10us, <=100us, >1s
    _, handle = make({}, FakeStats({"addjob": FakeStat(8, 1, 1_500_000, buckets)}))
    got = samples(handle)
    cmd = (("command", "addjob"),)
    assert got[("disque_commands_total", cmd)] == 8
    assert got[("disque_command_errors_total", cmd)] == 1
    assert got[("disque_command_duration_seconds_count", cmd)] == 8
    assert got[("disque_command_duration_seconds_sum", cmd)] == 1.5
    le = lambda v: (("command", "addjob"), ("le", v))  # noqa: E731
    assert got[("disque_command_duration_seconds_bucket", le("1e-05"))] == 5
    assert got[("disque_command_duration_seconds_bucket", le("0.0001"))] == 7  # cumulative
    assert got[("disque_command_duration_seconds_bucket", le("1.0"))] == 7
    assert got[("disque_command_duration_seconds_bucket", le("+Inf"))] == 8


def test_no_command_families_without_stats():
    _, handle = make({"q": 1})
    assert not any(name.startswith("disque_command") for name, _ in samples(handle))


def test_the_queue_cap_keeps_the_longest_and_sums_the_rest():
    _, handle = make({"q%d" % n: n for n in range(1, 8)}, cap=2)
    got = samples(handle)
    queues = {dict(labels)["queue"] for name, labels in got if name == "disque_queue_length"}
    assert queues == {"q7", "q6", OTHER}
    assert got[("disque_queue_length", (("queue", OTHER),))] == sum(range(1, 6))
    assert got[("disque_queue_jobs_in_total", (("queue", OTHER),))] == sum(range(1, 6))
    assert got[("disque_jobs", (("state", "queued"),))] == sum(range(1, 8))
    assert got[("disque_cluster_nodes", (("state", "pfail"),))] == 1
    assert got[("disque_cluster_known_nodes", ())] == 2


def test_a_node_with_many_queues_is_scraped_with_the_cap():
    node, handle = make({}, cap=1000)
    for i in range(20_000):
        node.execute(1, [b"ADDJOB", b"q%d" % i, b"x", b"0"], 1000)
    got = samples(handle)
    labels = [labels for name, labels in got if name == "disque_queue_length"]
    assert len(labels) == 1001
    assert got[("disque_queue_length", (("queue", OTHER),))] == 19_000
