"""DEDUP keys (``core/dedup.py``) on the cluster model: producers that retry with the same key.

Each key is added at once on two random nodes (two producers, or one whose first try
seemed lost); a producer whose reply is NOREPL or does not come within 1 s tries again, with
the same key, on another node, until it has an ID. With ``faults`` the network loses and
delays messages and cuts the cluster in two for a while (then heals). Then consumers drain
every node (GETJOB + ACKJOB) until nothing is left.

Checks: every key's ID is ``dedup_job_id`` (one ID per key, wherever it was answered);
none lost (every key's job delivered at least once); without faults, each ID delivered
exactly once (two creations at once merged into one queued job). With faults a
redelivery is allowed (one job per side of a cut, Disque's at-least-once), not a loss.
"""

from __future__ import annotations

import os
import random

import pytest

from disque_py.core.ids import dedup_job_id
from disque_py.core.effects import BLOCKED
from disque_py.core.replies import Error, Status

from .cluster_model import SimCluster

N_KEYS = 12


def _seeds(default: int) -> list[int]:
    if os.environ.get("SIM_SEED"):
        return [int(os.environ["SIM_SEED"])]
    return list(range(int(os.environ.get("SIM_SEEDS", default))))


def _run(seed: int, faults: bool) -> None:
    w = random.Random(seed * 31 + 7)
    n = 5
    params = dict(loss=w.choice([0.0, 0.02, 0.05]), delay=(0, w.choice([1, 5, 30]))) if faults else {}
    cluster = SimCluster(n, seed, **params)
    replicate = w.choice([2, 3])
    if faults:
        cut_at = w.randint(0, 2000)
        side = set(w.sample(range(n), 2))
        cluster.at(cut_at, lambda: cluster.partition(side, set(range(n)) - side))
        cluster.at(cut_at + w.randint(500, 4000), cluster.heal)
    answered: dict[bytes, set[bytes]] = {}
    for k in range(N_KEYS):
        key = b"key-%d" % k
        clients = []
        for i in w.sample(range(n), 2):
            c = cluster.client(i)
            clients.append((c, c.cmd("ADDJOB", "q", key, 500, "REPLICATE", replicate, "RETRY", 2, "DEDUP", key)))
        tries = 0
        while clients:
            c, r = clients.pop(0)
            if r is BLOCKED:
                cluster.try_run_until(lambda: c.pending is None or c.gone, 1000)
                r = c.replies[-1] if c.pending is None and c.replies else None
            if isinstance(r, Status):
                answered.setdefault(key, set()).add(bytes(r))
                continue
            assert r is None or (isinstance(r, Error) and r.prefix == "NOREPL"), r
            c.close()
            if key in answered:
                continue  # the other producer has its ID
            tries += 1
            assert tries < 50, "key %r never got an ID" % key
            c = cluster.client(w.randrange(n))
            clients.append((c, c.cmd("ADDJOB", "q", key, 500, "REPLICATE", replicate, "RETRY", 2, "DEDUP", key)))
        cluster.run_for(w.randint(0, 300))
    cluster.heal()
    for key, got in answered.items():
        assert got == {dedup_job_id(b"q", key, 2)}, (key, got)
    assert len(answered) == N_KEYS
    # drain
    deliveries: dict[bytes, int] = {}
    consumers = [cluster.client(i) for i in range(n)]
    for _ in range(200):
        for c in consumers:
            r = c.cmd("GETJOB", "NOHANG", "COUNT", 10, "FROM", "q")
            if isinstance(r, list):
                for item in r:
                    jid = bytes(item[1])
                    deliveries[jid] = deliveries.get(jid, 0) + 1
                    c.cmd("ACKJOB", jid)
        cluster.run_for(500)
        if not any(len(cluster.node(i).store) for i in range(n)):
            break
    ids = {dedup_job_id(b"q", b"key-%d" % k, 2) for k in range(N_KEYS)}
    assert set(deliveries) == ids, "lost: %r" % (ids - set(deliveries))
    if not faults:
        assert all(v == 1 for v in deliveries.values()), deliveries


@pytest.mark.parametrize("seed", _seeds(30))
def test_dedup_producers_healthy(seed):
    _run(seed, faults=False)


@pytest.mark.parametrize("seed", _seeds(40))
def test_dedup_producers_under_loss_and_a_partition(seed):
    _run(seed, faults=True)
