"""One chaos run, start to verdict: network, nodes, workload, nemesis, heal, settle, check.

:func:`run` is what the CI tests and ``scripts/chaos`` call. Phases:

1. a network (a namespace per node when root, see :mod:`.net`) and ``nodes``
   real node processes, joined with CLUSTER MEET;
2. ``seconds`` of workload (:mod:`.workload`) while the nemesis carries out
   its schedule (:mod:`.nemesis`);
3. the producers stop, every fault is healed, consumers acknowledge all
   they get, and the run waits (``settle_timeout`` at most) until the cluster
   has settled: no node queues anything, no node holds an acknowledged job
   or an at-least-once job, and every job ADDJOB acknowledged that is not
   allowed to be gone was delivered;
4. :func:`.history.check` judges the history. A run that fails keeps its
   history (``history.jsonl``), every node's log, the report and the command
   that replays its schedule under ``save_dir``.
"""

from __future__ import annotations

import json
import os
import random
import shlex
import shutil
import tempfile
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Callable

import trio

from .cluster import Cluster, default_server
from .history import History, Report, check
from .nemesis import KINDS, Fault, Nemesis, Unavailable, schedule
from .net import LoopbackNetwork, network
from .workload import FAILURES, Conn, Options, ReplyError, Workload


@dataclass
class RunConfig:
    nemesis: str = "kill"
    seconds: float = 40.0
    interval: float = 10.0
    seed: int | None = None
    nodes: int = 5
    server: str | None = None  # a command template (cluster.py); None: disque-py
    appendonly: bool = False
    appendfsync: str = "everysec"
    node_timeout: int = 2000
    settle_timeout: float = 120.0
    netns: bool = True
    workload: Options = field(default_factory=Options)
    save_dir: Path | None = None  # where a failing run (or every run, with keep) is saved
    keep: bool = False

    def replay(self, seed: int) -> str:
        """The command that runs this schedule again."""
        o = self.workload
        args = ["scripts/chaos", "--nemesis", self.nemesis, "--seconds", "%g" % self.seconds,
                "--interval", "%g" % self.interval, "--seed", str(seed), "--nodes", str(self.nodes),
                "--replicate", str(o.replicate), "--retry", str(o.retry), "--rate", "%g" % o.rate]  # fmt: skip
        if o.retry0_pct:
            args += ["--retry0-pct", "%g" % (o.retry0_pct * 100)]
        if o.async_pct:
            args += ["--async-pct", "%g" % (o.async_pct * 100)]
        if o.failing_pct:
            args += ["--failing-pct", "%g" % (o.failing_pct * 100), "--maxdeliver", str(o.maxdeliver)]
        if o.producer != "once":
            args += ["--producer", o.producer]
        if o.mix != Options().mix:
            args += ["--mix", ",".join("%s=%g" % kv for kv in o.mix.items())]
        if self.appendonly:
            args += ["--aof", self.appendfsync]
        if self.server:
            args += ["--server", self.server]
        return " ".join(shlex.quote(a) for a in args)


@dataclass
class Result:
    config: RunConfig
    seed: int
    report: Report
    faults: list[Fault]
    netns: bool
    elapsed: float
    problems: list[str]
    actions: dict[str, int] = field(default_factory=dict)  # what the nemesis did, by kind (kill, stopped...)
    saved: Path | None = None

    @property
    def ok(self) -> bool:
        return not self.problems

    def table(self) -> str:
        c = self.config
        o = c.workload
        title = ("chaos: nemesis %s, seed %d, %d nodes (%s), %s, AOF %s, REPLICATE %d RETRY %d, %g s, %d faults"
                 % (c.nemesis, self.seed, c.nodes, "namespaces" if self.netns else "loopback",
                    "disque-py" if not c.server else c.server.split()[0].rsplit("/", 1)[-1],
                    c.appendfsync if c.appendonly else "off", o.replicate, o.retry, c.seconds,
                    len(self.faults)))  # fmt: skip
        if o.producer != "once":
            title += ", producers %s" % ("retry with DEDUP keys" if o.producer == "dedup" else "retry without keys")
        text = self.report.table(title)
        extra = [p for p in self.problems if p not in self.report.problems]
        if extra:
            text += "\n  also: " + "; ".join(extra)
        if not self.ok:
            text += "\n  replay: " + c.replay(self.seed)
            if self.saved:
                text += "\n  saved: %s" % self.saved
        return text


def kinds_for(cfg: RunConfig, can_partition: bool, why_not: str, hooks: bool) -> list[str]:
    """The fault kinds of this run; :class:`Unavailable` when the one asked for cannot be done here."""
    wanted = list(KINDS) if cfg.nemesis == "all" else cfg.nemesis.split("+")
    reasons = {}
    if not can_partition:
        reasons["partition"] = reasons["partition-one"] = "partitions: " + why_not
    if not hooks:
        reasons["clock"] = reasons["fsync"] = "the server has no fault hooks (DEBUG JUMP-CLOCK/FAIL-FSYNC)"
    if not cfg.appendonly:
        reasons["disk"] = reasons["fsync"] = "needs the AOF (--aof)"
    if os.geteuid() != 0:
        reasons["disk"] = "a full disk needs a tmpfs, so root"
    for k in wanted:
        if k not in KINDS:
            raise ValueError("unknown nemesis %r (one of %s, all)" % (k, ", ".join(KINDS)))
    if cfg.nemesis == "all":
        kinds = [k for k in wanted if k not in reasons]
        return kinds
    missing = [k for k in wanted if k in reasons]
    if missing:
        raise Unavailable("; ".join(reasons[k] for k in missing))
    return wanted


def _settled(cluster: Cluster, queues: list[str]) -> tuple[bool, int, str]:
    """(settled, acked jobs left, what is left) from every node: nothing queued, nothing acknowledged
    left, no at-least-once job left (RETRY 0 jobs a consumer dropped stay until their TTL)."""
    from disque_py.core.ids import is_at_most_once_id  # the ID's TTL parity

    acked = 0
    left = []
    for n in cluster.nodes:
        qlen = sum(int(cluster.call(n, "QLEN", q)) for q in queues)
        jobs = _jscan(cluster, n)
        acked_ids = _jscan(cluster, n, "STATE", "acked")
        acked += len(acked_ids)
        retrying = [j for j in jobs if not is_at_most_once_id(j.encode()) and j not in acked_ids]
        if qlen or acked_ids or retrying:
            left.append("n%d: %d queued, %d acked, %d at-least-once" % (n.index, qlen, len(acked_ids), len(retrying)))
    return not left, acked, "; ".join(left)


def _jscan(cluster: Cluster, node: Any, *filters: str) -> set[str]:
    out: set[str] = set()
    cursor = "0"
    while True:
        reply = cluster.call(node, "JSCAN", cursor, "COUNT", 1000, *filters)
        cursor = reply[0].decode()
        out.update(j.decode() for j in reply[1])
        if cursor == "0":
            return out


def run(cfg: RunConfig, *, workdir: Path | None = None, log: Callable[[str], None] = lambda s: None,
        progress: Callable[[float, Workload | None, Nemesis | None], None] | None = None) -> Result:  # fmt: skip
    """One run (module docstring); raises :class:`.nemesis.Unavailable` when the nemesis cannot run here."""
    seed = cfg.seed if cfg.seed is not None else random.SystemRandom().randrange(1, 10**6)
    own_workdir = workdir is None
    workdir = Path(tempfile.mkdtemp(prefix="disque-chaos-")) if workdir is None else Path(workdir)
    started_wall = time.monotonic()
    hooks = cfg.server is None
    with network(cfg.nodes, want_netns=cfg.netns) as net:
        kinds = kinds_for(cfg, net.can_partition, net.why_not, hooks)
        if not kinds:
            raise Unavailable("no nemesis can run here")
        needs_disk = "disk" in kinds
        cluster = Cluster(net, workdir, server=cfg.server, node_timeout=cfg.node_timeout, appendonly=cfg.appendonly,
                          appendfsync=cfg.appendfsync, disk=needs_disk,
                          base_port=7711 if not isinstance(net, LoopbackNetwork) else _free_base(cfg.nodes))  # fmt: skip
        faults = schedule(kinds, seed, cfg.seconds, cfg.interval, cfg.nodes, cfg.node_timeout / 1000)
        history = History()
        prefix = "r%d" % seed
        problems: list[str] = []
        settle_s: float | None = None
        acked_left: int | None = None
        try:
            log("starting %d nodes (%s)" % (cfg.nodes, "namespaces" if net.can_partition else net.why_not))
            cluster.start()
            workload = Workload([n.address for n in cluster.nodes], history, prefix, cfg.workload, seed)
            nemesis = Nemesis(cluster, history, faults, log=log)

            async def main() -> None:
                nonlocal settle_s, acked_left
                t0 = trio.current_time()
                history.add(op="phase", t=time.monotonic(), name="start")
                async with trio.open_nursery() as nursery:
                    await workload.run(nursery)
                    nursery.start_soon(nemesis.run, t0)
                    while trio.current_time() - t0 < cfg.seconds or nemesis.done < len(faults):
                        if progress:
                            progress(trio.current_time() - t0, workload, nemesis)
                        await trio.sleep(0.5)
                        if trio.current_time() - t0 > cfg.seconds + 60:
                            problems.append("the nemesis did not finish its schedule")
                            break
                    workload.producing = False
                    await nemesis.heal_all()
                    with trio.move_on_after(cfg.workload.give_up_s + cfg.workload.request_timeout):
                        while workload.adding:  # retrying producers finish the job they are on
                            await trio.sleep(0.1)
                    workload.draining = True
                    healed = time.monotonic()
                    history.add(op="phase", t=healed, name="heal")
                    log("healed; settling")
                    left = ""
                    with trio.move_on_after(cfg.settle_timeout):
                        while True:
                            await trio.sleep(0.5)
                            if progress:
                                progress(trio.current_time() - t0, workload, nemesis)
                            if _undelivered(history, prefix):
                                continue  # the consumers are still catching up
                            try:
                                done, acked, left = await trio.to_thread.run_sync(_settled, cluster,
                                                                                  workload.all_queues)  # fmt: skip
                            except (OSError, ReplyError, Exception) as exc:  # noqa: BLE001 - a node may be slow
                                left = repr(exc)
                                continue
                            if done:
                                settle_s = time.monotonic() - healed
                                acked_left = acked
                                break
                    if settle_s is None:
                        problems.append("did not settle within %.0f s: %s" % (cfg.settle_timeout, left or
                                        "%d acknowledged jobs undelivered" % _undelivered(history, prefix)))  # fmt: skip
                        try:
                            _, acked_left, _ = await trio.to_thread.run_sync(_settled, cluster, workload.all_queues)
                        except Exception:  # noqa: BLE001
                            acked_left = None
                    history.add(op="phase", t=time.monotonic(), name="settled")
                    workload.consuming = False
                    nursery.cancel_scope.deadline = trio.current_time() + cfg.workload.request_timeout + 1

            trio.run(main)
            for e in history.of("nemesis"):
                if e["what"] == "unexpected-exit":
                    problems.append("node n%d exited on its own (code %s)" % (e["nodes"][0], e.get("code")))
        finally:
            problems += cluster.stop()  # a node that did not stop on SHUTDOWN or SIGTERM is one
        report = check(history, run_prefix=prefix, acked_left=acked_left, settle_s=settle_s)
        problems = report.problems + [p for p in problems if p not in report.problems]
        actions: dict[str, int] = {}
        for e in history.of("nemesis"):
            actions[e["what"]] = actions.get(e["what"], 0) + 1
        result = Result(cfg, seed, report, faults, net.can_partition, time.monotonic() - started_wall, problems,
                        actions)  # fmt: skip
        if cfg.save_dir is not None and (cfg.keep or not result.ok):
            result.saved = _save(result, history, cluster, cfg.save_dir)
    if own_workdir:
        shutil.rmtree(workdir, ignore_errors=True)
    return result


def _undelivered(history: History, prefix: str) -> int:
    """Jobs ADDJOB acknowledged that no consumer got yet and that must come (the checker's losses)."""
    return check(history, run_prefix=prefix, acked_left=0, settle_s=0.0).lost


def _free_base(n: int) -> int:
    from tests.integration.conftest import consecutive_free_ports

    return consecutive_free_ports(n)


def _save(result: Result, history: History, cluster: Cluster, save_dir: Path) -> Path:
    d = Path(save_dir) / ("%s-%s-seed%d" % (time.strftime("%Y%m%d-%H%M%S"), result.config.nemesis, result.seed))
    d.mkdir(parents=True, exist_ok=True)
    history.save(d / "history.jsonl")
    for p in cluster.logs():
        if p.exists():
            shutil.copy(p, d / p.name)
    (d / "report.txt").write_text(result.table() + "\n\nschedule:\n" +
                                  "\n".join(f.describe() for f in result.faults) + "\n")  # fmt: skip
    (d / "report.json").write_text(json.dumps({"seed": result.seed, "replay": result.config.replay(result.seed),
                                               "report": result.report.as_dict(), "problems": result.problems,
                                               "faults": [asdict(f) for f in result.faults]}, indent=2))  # fmt: skip
    return d
