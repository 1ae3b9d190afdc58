"""A DEDUP job fastacked on another holder while the node that took its ADDJOB still waits for
its copies (one holder silent: dead, not yet known to be). Found by the chaos harness's dedup
producers under kill -9 (``scripts/chaos --nodes 3 --nemesis kill --producer dedup``): a job
delivered and FASTACKed on one node was delivered again, under the same ID, from the node that
had taken its ADDJOB.

Three cores on one manual clock (``test_delivery.Cluster``), messages to node 2 dropped while
the others still count it reachable.
"""

from __future__ import annotations

from disque_py.core.effects import BLOCKED
from disque_py.core.ids import dedup_job_id

from .test_delivery import Cluster


class SilentCluster(Cluster):
    """Messages to the nodes in ``silent`` vanish (a node killed, not yet marked failed)."""

    def __init__(self, n: int = 3) -> None:
        self.silent: set[int] = set()
        super().__init__(n)

    def settle(self) -> None:
        self.inbox = type(self.inbox)(m for m in self.inbox if m[1] not in self.silent)
        while self.inbox:
            super().settle()
            self.inbox = type(self.inbox)(m for m in self.inbox if m[1] not in self.silent)


def test_a_dedup_job_fastacked_elsewhere_while_waiting_for_copies_is_not_queued_again():
    c = SilentCluster(3)
    c.silent.add(2)
    argv = [b"ADDJOB", b"q", b"body", b"5000", b"REPLICATE", b"3", b"RETRY", b"1", b"DEDUP", b"k"]
    assert c.node(0).execute(7, argv, c.now) is BLOCKED  # node 2 never confirms
    c._collect(0)
    c.settle()
    job_id = dedup_job_id(b"q", b"k", 1)
    assert c.job(1, job_id) is not None  # node 1 holds a copy
    c.advance(1500)  # node 1's RETRY timer: it queues its copy (node 0 is still replicating)
    assert c.queued_on(job_id) == [1]
    assert c.getjob(1) == job_id
    assert c.cmd(1, "FASTACK", job_id) == 1  # DELJOB to the holders: node 0 still waits for node 2
    c.advance(10)  # the DELJOB reaches node 0
    assert c.queued_on(job_id) == [], "a fastacked job queued again"
