"""``/metrics``: the node read at scrape time, in Prometheus' text format.

:class:`NodeCollector` keeps nothing between scrapes: each ``collect`` reads the
node's counters, its queues and (when the node has them) the dispatcher's command
stats, so an idle node pays nothing for being scraped rarely. It lives in a registry
of its own (:func:`make_registry`) with prometheus-client's process, GC and platform
collectors, so nothing else in the process leaks into the page.

Queues: at most ``admin-metrics-max-queues`` distinct ``queue`` labels, the longest
queues (``heapq.nlargest``: O(n log k), not a full sort); the rest are summed under
``queue="_other"`` (lengths, blocked clients, counters and import rates; paused
queues among them count under their mode). One pass over the queues builds every
queue family. The cluster's own queues (names starting with ``@``: tasks' results) have no
``queue`` label and are not in ``_other``: two gauges count them and their jobs
(``disque_internal_queues``, ``disque_internal_queue_jobs``), so that results, one queue each,
add no series.

The names are those of the observability contract (docs/OBSERVABILITY.md).
"""

from __future__ import annotations

import heapq
import sys
import time
from operator import attrgetter
from typing import Any, Iterator

from prometheus_client import CollectorRegistry, GCCollector, PlatformCollector, ProcessCollector
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily, Metric
from prometheus_client.utils import floatToGoString

from ..core.job import STATE_NAMES
from ..core.queues import PAUSE_NAMES, PAUSED_ALL
from .handle import NodeHandle, split_queues

__all__ = ["NodeCollector", "make_registry", "OTHER"]

OTHER = "_other"
#: the command latency buckets' upper bounds in microseconds (server/cmdstats.py's, per the
#: observability contract; read from the stats' own module when it has them)
LATENCY_BUCKETS_US = (10, 25, 50, 100, 250, 500, 1000, 2500, 5000, 10000, 25000, 50000, 100000, 250000, 1000000)
#: walk the job table for the per-state counts only up to this many jobs (a scrape stays cheap:
#: ~0.5 us a job); above it only ``queued`` (the queues' lengths) is shown
STATE_WALK_MAX = 20_000
_JOBS = attrgetter("jobs")
_BLOCKED = attrgetter("blocked")
_JOBS_IN = attrgetter("jobs_in")
_JOBS_OUT = attrgetter("jobs_out")
_SOURCES = attrgetter("sources")
_FLAGS = attrgetter("flags")
_STATE = attrgetter("state")


def _name(value: bytes) -> str:
    return value.decode("utf-8", "replace")


class NodeCollector:
    """A prometheus-client collector over one node (see the module docstring)."""

    def __init__(self, handle: NodeHandle) -> None:
        self.h = handle

    def describe(self) -> list[Metric]:
        return []  # no describe-time work: the registry does not call collect at registration

    def collect(self) -> Iterator[Metric]:
        h = self.h
        node = h.node
        cfg = h.config
        stats = h.stats
        nstats = node.stats

        info = GaugeMetricFamily("disque_node_info", "The node's identity", labels=["node_id", "version"])
        info.add_metric([node.id, h.version], 1)
        yield info
        yield GaugeMetricFamily("disque_uptime_seconds", "Seconds since the node started", value=time.time() - h.start_time)

        # One length per queue, the only per-queue Python call (a SortedKeyList's __len__), shared
        # by the job states and the queue families; the rest runs in C (map/attrgetter/sum/filter,
        # heapq with a C key).
        vals, own = split_queues(node.queues)
        lens = list(map(len, map(_JOBS, vals)))
        own_jobs = sum(map(len, map(_JOBS, own)))
        yield from self._jobs(node, sum(lens) + own_jobs)
        yield GaugeMetricFamily("disque_registered_jobs", "Jobs known to this node", value=len(node.ctx.store))
        yield GaugeMetricFamily("disque_registered_queues", "Queues known to this node", value=len(node.queues))
        yield GaugeMetricFamily("disque_internal_queues", "The cluster's own queues known to this node (names "
                                "starting with @: tasks' results), which have no queue label", value=len(own))  # fmt: skip
        yield GaugeMetricFamily("disque_internal_queue_jobs", "Jobs queued in the cluster's own queues", value=own_jobs)
        yield GaugeMetricFamily("disque_connected_clients", "Open client connections", value=len(h.clients))
        yield GaugeMetricFamily("disque_blocked_clients", "Clients blocked in GETJOB", value=node.blocked_clients)
        workers, running = h.workers()
        yield GaugeMetricFamily("disque_workers", "Live workers beating to this node (WORKER BEAT)", value=workers)
        yield GaugeMetricFamily("disque_worker_jobs_running", "Jobs the workers beating to this node run now",
                                value=running)  # fmt: skip

        def counter(name: str, doc: str, value: Any) -> CounterMetricFamily:
            return CounterMetricFamily(name, doc, value=value or 0)

        yield counter("disque_connections_received", "Client connections accepted", stats.get("total_connections_received"))
        yield counter("disque_net_input_bytes", "Bytes read from clients", stats.get("total_net_input_bytes"))
        yield counter("disque_net_output_bytes", "Bytes written to clients", stats.get("total_net_output_bytes"))
        for key, doc in (
            ("jobs_added", "Jobs added by ADDJOB here"),
            ("jobs_delivered", "Jobs delivered by GETJOB here"),
            ("jobs_acked", "Jobs acknowledged here"),
            ("jobs_requeued", "Jobs queued again after their retry time"),
            ("jobs_expired", "Jobs deleted at their TTL"),
            ("jobs_imported", "Jobs imported from other nodes (federation)"),
            ("jobs_exported", "Jobs moved to other nodes (federation)"),
            ("needjobs_sent", "NEEDJOBS messages sent"),
            ("needjobs_received", "NEEDJOBS messages received"),
            ("yourjobs_sent", "YOURJOBS messages sent"),
            ("yourjobs_received", "YOURJOBS messages received"),
            ("jobs_dead_lettered", "Jobs made dead letters here (MAXDELIVER reached, or NACK ... DEAD)"),
            ("jobs_nack_delayed", "NACKs with a delay (DELAY, or the job's BACKOFF) handled here"),
            ("dedup_hits", "ADDJOBs with a DEDUP key answered with an existing job's ID (nothing added)"),
            ("group_units_restored", "Units of groups' limits lost in flight and made again by this node"),
        ):
            yield counter("disque_" + key, doc, nstats.get(key, 0))
        yield GaugeMetricFamily("disque_dedup_ids_remembered",
                                "IDs of deleted DEDUP jobs remembered for their dedup window",
                                value=len(node.lifecycle.gone))  # fmt: skip

        yield from self._commands()
        yield from self._queues(node, cfg, vals, lens)
        yield self._dead_letters(node, cfg)
        yield from self._groups(node, cfg)
        yield from self._bus(h)
        yield from self._memory(node, cfg)
        yield from self._aof(h)

    # ------------------------------------------------------------------ parts
    def _jobs(self, node: Any, queued: int) -> Iterator[Metric]:
        """Jobs by state: the queued ones are the queues' lengths; the others need a walk of the
        job table, done only while it is small enough (STATE_WALK_MAX): then only ``queued``."""
        store = node.ctx.store
        fam = GaugeMetricFamily("disque_jobs", "Jobs known to this node, by state", labels=["state"])
        if len(store) <= STATE_WALK_MAX:
            counts = [0, 0, 0, 0]
            for shard in store._shards:
                for state in map(_STATE, shard.values()):
                    counts[state] += 1
            for i, state in enumerate(STATE_NAMES):
                fam.add_metric([state], counts[i])
        else:
            fam.add_metric(["queued"], queued)
        yield fam

    def _commands(self) -> Iterator[Metric]:
        stats = self.h.cmdstats()
        if stats is None:
            return
        by_name = getattr(stats, "by_name", None)
        if not by_name:
            return
        bounds = getattr(sys.modules.get(type(stats).__module__), "LATENCY_BUCKETS_US", LATENCY_BUCKETS_US)
        calls = CounterMetricFamily("disque_commands", "Commands run, by name", labels=["command"])
        errors = CounterMetricFamily("disque_command_errors", "Commands that replied with an error", labels=["command"])
        hist = HistogramMetricFamily("disque_command_duration_seconds", "Time spent running commands", labels=["command"])
        les = [floatToGoString(b / 1e6) for b in bounds] + ["+Inf"]
        for name, st in sorted(by_name.items()):
            calls.add_metric([name], st.calls)
            errors.add_metric([name], st.errors)
            acc = 0
            buckets = []
            for le, n in zip(les, st.buckets):
                acc += n
                buckets.append((le, acc))
            hist.add_metric([name], buckets, st.usec / 1e6)
        yield calls
        yield errors
        yield hist

    def _queues(self, node: Any, cfg: Any, vals: list[Any], lens: list[int]) -> Iterator[Metric]:
        cap = int(getattr(cfg, "admin_metrics_max_queues", 1000))
        now = node.ctx.now
        length = GaugeMetricFamily("disque_queue_length", "Jobs queued", labels=["queue"])
        blocked = GaugeMetricFamily("disque_queue_blocked_clients", "Clients blocked on the queue", labels=["queue"])
        jin = CounterMetricFamily("disque_queue_jobs_in", "Jobs queued into the queue", labels=["queue"])
        jout = CounterMetricFamily("disque_queue_jobs_out", "Jobs taken from the queue", labels=["queue"])
        rate = GaugeMetricFamily("disque_queue_import_rate", "Jobs imported per second", labels=["queue"])
        paused = GaugeMetricFamily("disque_queue_paused", "1 for the queue's pause mode", labels=["queue", "mode"])
        over = len(vals) > cap
        if over:
            picked = heapq.nlargest(cap, range(len(vals)), key=lens.__getitem__)
        else:
            picked = range(len(vals))
        top = []
        for i in picked:
            q = vals[i]
            top.append(q)
            name = _name(q.name)
            length.add_metric([name], lens[i])
            blocked.add_metric([name], q.blocked)
            jin.add_metric([name], q.jobs_in)
            jout.add_metric([name], q.jobs_out)
            rate.add_metric([name], q.import_rate(now) if q.sources else 0)
            if q.flags & PAUSED_ALL:
                paused.add_metric([name, PAUSE_NAMES[q.flags & PAUSED_ALL]], 1)
        if over:
            # the rest, summed: everything minus the top
            n_len = sum(lens) - sum(lens[i] for i in picked)
            n_blk = sum(map(_BLOCKED, vals)) - sum(map(_BLOCKED, top))
            n_in = sum(map(_JOBS_IN, vals)) - sum(map(_JOBS_IN, top))
            n_out = sum(map(_JOBS_OUT, vals)) - sum(map(_JOBS_OUT, top))
            topset = set(map(id, top))
            n_rate = sum(q.import_rate(now) for q in filter(_SOURCES, vals) if id(q) not in topset)
            modes = [0, 0, 0, 0]
            for q in filter(_FLAGS, vals):
                if q.flags & PAUSED_ALL and id(q) not in topset:
                    modes[q.flags & PAUSED_ALL] += 1
            length.add_metric([OTHER], n_len)
            blocked.add_metric([OTHER], n_blk)
            jin.add_metric([OTHER], n_in)
            jout.add_metric([OTHER], n_out)
            rate.add_metric([OTHER], n_rate)
            for i in (1, 2, 3):
                if modes[i]:
                    paused.add_metric([OTHER, PAUSE_NAMES[i]], modes[i])
        yield length
        yield blocked
        yield jin
        yield jout
        yield rate
        yield paused

    def _groups(self, node: Any, cfg: Any) -> Iterator[Metric]:
        """ADDJOB's GROUPs (core/limits.py): each group's deliveries here not acknowledged, jobs
        waiting here and cluster-wide limits; the ``admin-metrics-max-queues`` busiest groups,
        the rest summed under ``_other`` (one label per group: bounded as the queues are)."""
        limits = getattr(node, "limits", None)
        active = GaugeMetricFamily("disque_group_active", "Jobs of the group delivered here, not acknowledged",
                                   labels=["group"])  # fmt: skip
        waiting = GaugeMetricFamily("disque_group_waiting", "Jobs of the group queued here", labels=["group"])
        conc = GaugeMetricFamily("disque_group_limit_concurrency", "The group's CONCURRENCY limit (cluster-wide)",
                                 labels=["group"])  # fmt: skip
        rate = GaugeMetricFamily("disque_group_limit_rate", "The group's RATE limit, deliveries a second "
                                 "(cluster-wide)", labels=["group"])  # fmt: skip
        held = GaugeMetricFamily("disque_group_held", "1 while the group is at its limit here", labels=["group"])
        if limits is not None and (limits.settings or limits.active or limits.table.containers):
            cap = int(getattr(cfg, "admin_metrics_max_queues", 1000))
            rows, other_active, other_waiting, others = limits.summary(cap)
            for name, n_active, n_waiting, n_conc, n_rate, is_held in rows:
                label = _name(name)
                active.add_metric([label], n_active)
                waiting.add_metric([label], n_waiting)
                if n_conc:
                    conc.add_metric([label], n_conc)
                if n_rate:
                    rate.add_metric([label], n_rate / 1000)
                held.add_metric([label], 1 if is_held else 0)
            if others:
                active.add_metric([OTHER], other_active)
                waiting.add_metric([OTHER], other_waiting)
        yield active
        yield waiting
        yield conc
        yield rate
        yield held

    def _dead_letters(self, node: Any, cfg: Any) -> Metric:
        """Jobs dead-lettered here, by their original queue (``Delivery.dead_by_queue``): the
        ``admin-metrics-max-queues`` queues with the most, the rest summed under ``_other``."""
        fam = CounterMetricFamily("disque_queue_jobs_dead_lettered", "Jobs of the queue made dead letters here",
                                  labels=["queue"])  # fmt: skip
        counts = dict(node.delivery.dead_by_queue)
        cap = int(getattr(cfg, "admin_metrics_max_queues", 1000))
        names = list(counts)
        if len(names) > cap:
            names = heapq.nlargest(cap, names, key=counts.__getitem__)
        for name in names:
            fam.add_metric([_name(name)], counts.pop(name))
        if counts:
            fam.add_metric([OTHER], sum(counts.values()))
        return fam

    def _bus(self, h: NodeHandle) -> Iterator[Metric]:
        peers = h.peers()
        known = [p for p in peers if "handshake" not in p.flags]
        yield GaugeMetricFamily("disque_cluster_known_nodes", "Nodes in the node table (this one included)", value=len(known))
        states = {"ok": 0, "pfail": 0, "fail": 0}
        for p in known:
            states["fail" if "fail" in p.flags else "pfail" if "pfail" in p.flags else "ok"] += 1
        fam = GaugeMetricFamily("disque_cluster_nodes", "Known nodes by failure state", labels=["state"])
        for state, n in states.items():
            fam.add_metric([state], n)
        yield fam
        yield GaugeMetricFamily("disque_bus_links", "Open cluster bus links", value=h.bus_links())
        cs = h.cluster_stats()
        yield CounterMetricFamily("disque_bus_bytes_sent", "Bytes written to bus links", value=cs.get("bytes_sent", 0))
        yield CounterMetricFamily("disque_bus_bytes_received", "Bytes read from bus links", value=cs.get("bytes_received", 0))
        sent, received = h.messages_by_kind()
        fam = CounterMetricFamily("disque_bus_messages_sent", "Job-layer bus messages sent, by kind", labels=["kind"])
        for kind, n in sorted(sent.items()):
            fam.add_metric([kind], n)
        yield fam
        fam = CounterMetricFamily("disque_bus_messages_received", "Job-layer bus messages received, by kind", labels=["kind"])
        for kind, n in sorted(received.items()):
            fam.add_metric([kind], n)
        yield fam
        yield CounterMetricFamily("disque_bus_auth_failures", "Bus links that failed authentication", value=cs.get("auth_failures", 0))
        yield CounterMetricFamily("disque_bus_bad_frames", "Bus links closed on a bad frame", value=cs.get("bad_frames", 0))

    def _memory(self, node: Any, cfg: Any) -> Iterator[Metric]:
        memory = node.memory
        yield GaugeMetricFamily("disque_memory_used_bytes", "Estimated memory of the node's data (what maxmemory reads)",
                                value=memory.estimate())  # fmt: skip
        yield GaugeMetricFamily("disque_memory_max_bytes", "maxmemory (0: no limit)", value=cfg.maxmemory)
        yield GaugeMetricFamily("disque_memory_level", "Memory level 0-3 (75 %, 95 %, 100 % of maxmemory)", value=memory.level)

    def _aof(self, h: NodeHandle) -> Iterator[Metric]:
        info = h.aof_info() or {}
        yield GaugeMetricFamily("disque_aof_enabled", "1 when the AOF is on", value=int(info.get("aof_enabled", 0) or 0))
        size = info.get("aof_current_size", 0)
        yield GaugeMetricFamily("disque_aof_size_bytes", "Size of the AOF", value=int(size) if str(size).isdigit() else 0)
        yield GaugeMetricFamily("disque_aof_last_write_ok", "1 when the last AOF write succeeded",
                                value=int(info.get("aof_last_write_status", "ok") == "ok"))  # fmt: skip
        rewrites = info.get("aof_rewrites", 0)
        yield CounterMetricFamily("disque_aof_rewrites", "AOF rewrites done", value=int(rewrites) if str(rewrites).isdigit() else 0)


def make_registry(handle: NodeHandle) -> CollectorRegistry:
    """A registry of its own: the node, the process, the GC, the platform."""
    registry = CollectorRegistry(auto_describe=False)
    registry.register(NodeCollector(handle))
    ProcessCollector(registry=registry)
    GCCollector(registry=registry)
    PlatformCollector(registry=registry)
    return registry
