"""The nemeses: a schedule of faults drawn from a seed, and the hands that carry it out.

A schedule is a list of :class:`Fault` (start time, kind, nodes, duration,
argument), drawn from ``random.Random(seed)`` alone, so the same seed,
nemesis, length and interval give the same faults at the same offsets: the
replay command a failed run prints. Each fault is healed before the next one
starts (the interval leaves a second at least between them).

Kinds:

* ``kill``: kill -9 one node, restart it 1-3 s later (its memory is lost
  unless it has an AOF);
* ``kill-all``: kill -9 every node at once, restart them all 1-2 s later;
* ``pause``: SIGSTOP one node for 1.5-2.5 node timeouts, then SIGCONT;
* ``partition``: cut the cluster into two random halves for 3-6 s;
* ``partition-one``: cut one node from all the others for 3-6 s;
* ``clock``: jump one node's clock, forward by 2-30 s (or back by up to 3 s);
* ``disk``: fill one node's disk (its own tmpfs) for 2-5 s;
* ``fsync``: make one node's next AOF fsync fail; with ``appendfsync
  always`` the node stops, and is restarted;
* ``all``: each fault one of the kinds this run can do, at random.
"""

from __future__ import annotations

import random
import time
from dataclasses import dataclass
from typing import Callable

import trio

from .cluster import Cluster
from .history import History

KINDS = ("kill", "kill-all", "pause", "partition", "partition-one", "clock", "disk", "fsync")


class Unavailable(Exception):
    """This run cannot do that nemesis here (the reason is the message)."""


@dataclass(frozen=True)
class Fault:
    at: float
    kind: str
    nodes: tuple[int, ...]
    duration: float
    arg: int = 0

    def describe(self) -> str:
        nodes = ",".join("n%d" % n for n in self.nodes)
        extra = " %+d ms" % self.arg if self.kind == "clock" else " for %.1f s" % self.duration
        return "%6.1f s  %-13s %s%s" % (self.at, self.kind, nodes, extra)


def schedule(kinds: list[str], seed: int, seconds: float, interval: float, size: int,
             node_timeout_s: float) -> list[Fault]:  # fmt: skip
    rng = random.Random(seed)
    faults = []
    t = rng.uniform(0.5, 1.5)
    room = max(1.0, interval - 1.0)
    while t < seconds - 1.0:
        kind = rng.choice(kinds)
        node = rng.randrange(size)
        if kind == "kill":
            f = Fault(t, kind, (node,), min(room, rng.uniform(1.0, 3.0)))
        elif kind == "kill-all":
            f = Fault(t, kind, tuple(range(size)), min(room, rng.uniform(1.0, 2.0)))
        elif kind == "pause":
            f = Fault(t, kind, (node,), min(room, rng.uniform(1.5, 2.5) * node_timeout_s))
        elif kind == "partition":
            order = list(range(size))
            rng.shuffle(order)
            cut = rng.randrange(1, size)
            f = Fault(t, kind, tuple(order[:cut]), min(room, rng.uniform(3.0, 6.0)))
        elif kind == "partition-one":
            f = Fault(t, kind, (node,), min(room, rng.uniform(3.0, 6.0)))
        elif kind == "clock":
            ms = rng.randrange(2000, 30000) if rng.random() < 0.8 else -rng.randrange(100, 3000)
            f = Fault(t, kind, (node,), 0.0, ms)
        elif kind == "disk":
            f = Fault(t, kind, (node,), min(room, rng.uniform(2.0, 5.0)))
        elif kind == "fsync":
            f = Fault(t, kind, (node,), 0.0)
        else:
            raise ValueError("unknown nemesis %r" % kind)
        faults.append(f)
        t += interval
    return faults


class Nemesis:
    """Carries out a schedule on ``cluster``, writing each step to ``history``."""

    def __init__(self, cluster: Cluster, history: History, faults: list[Fault],
                 clock: Callable[[], float] = time.monotonic, log: Callable[[str], None] = lambda s: None) -> None:  # fmt: skip
        self.cluster = cluster
        self.history = history
        self.faults = faults
        self.clock = clock
        self.log = log
        self.done = 0

    def note(self, what: str, nodes: tuple[int, ...] | list[int], memory_lost: bool = False, **extra: object) -> None:
        self.history.add(op="nemesis", t=self.clock(), what=what, nodes=list(nodes), memory_lost=memory_lost,
                         **extra)  # fmt: skip
        self.log("nemesis: %s %s" % (what, ",".join("n%d" % n for n in nodes)))

    async def run(self, started: float) -> None:
        for fault in self.faults:
            await trio.sleep_until(started + fault.at)
            await self.apply(fault)
            self.done += 1

    async def apply(self, f: Fault) -> None:
        c = self.cluster
        nodes = [c.nodes[i] for i in f.nodes]
        lose = not c.appendonly

        def sync(fn: Callable[..., object], *args: object) -> object:
            return trio.to_thread.run_sync(fn, *args)

        if f.kind in ("kill", "kill-all"):
            for n in nodes:
                await sync(c.kill, n)
            self.note(f.kind, f.nodes, memory_lost=lose, heal=False)
            await trio.sleep(f.duration)
            for n in nodes:
                c.spawn(n)
            for n in nodes:
                await sync(c.wait_ready, n)
            self.note("restart", f.nodes)
        elif f.kind == "pause":
            c.pause(nodes[0])
            self.note("pause", f.nodes)
            await trio.sleep(f.duration)
            c.resume(nodes[0])
            self.note("resume", f.nodes)
        elif f.kind in ("partition", "partition-one"):
            side = set(f.nodes)
            other = [i for i in range(len(c.nodes)) if i not in side]
            await sync(c.net.partition, [sorted(side), other])
            self.note(f.kind, f.nodes)
            await trio.sleep(f.duration)
            await sync(c.net.heal)
            self.note("heal", f.nodes)
        elif f.kind == "clock":
            try:
                await sync(c.call, nodes[0], "DEBUG", "JUMP-CLOCK", f.arg)
            except OSError:
                pass  # the node is down: nothing to jump
            self.note("clock", f.nodes, ms=f.arg)
        elif f.kind == "disk":
            await sync(c.fill_disk, nodes[0])
            self.note("disk-full", f.nodes)
            await trio.sleep(f.duration)
            c.free_disk(nodes[0])
            self.note("disk-freed", f.nodes)
        elif f.kind == "fsync":
            await self._fail_fsync(nodes[0], f)

    async def _fail_fsync(self, node, f: Fault) -> None:
        c = self.cluster
        try:
            await trio.to_thread.run_sync(c.call, node, "DEBUG", "FAIL-FSYNC", 1)
        except OSError:
            return
        self.note("fsync-fail", f.nodes)
        if c.appendfsync != "always":
            return  # everysec retries the fsync a second later: nothing more to do
        with trio.move_on_after(5.0):  # the node stops at its next fsync (the workload writes)
            while c.alive(node):
                await trio.sleep(0.05)
        if c.alive(node):
            await trio.to_thread.run_sync(c.call, node, "DEBUG", "FAIL-FSYNC", 0)
            return
        self.note("stopped", f.nodes, code=node.proc.returncode)
        c.spawn(node)
        await trio.to_thread.run_sync(c.wait_ready, node)
        self.note("restart", f.nodes)

    async def heal_all(self) -> None:
        """Whatever is still broken, mended: partitions healed, paused nodes resumed, dead ones restarted,
        disks freed."""
        c = self.cluster
        await trio.to_thread.run_sync(c.net.heal)
        for n in c.nodes:
            c.resume(n)
            c.free_disk(n)
        for n in c.nodes:
            if not c.alive(n):
                self.note("unexpected-exit", [n.index], code=n.proc.returncode if n.proc else None)
                c.spawn(n)
                await trio.to_thread.run_sync(c.wait_ready, n)
