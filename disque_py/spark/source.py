"""The ``disque`` data source for PySpark: batch write, batch read, at-least-once streaming read,
exactly-once stream sink.

Users reach it as ``spark.read.format("disque")`` (found through the top-level
module ``pyspark_disque``, no registration needed) or after
``spark.dataSource.register(DisqueDataSource)``. The user guide is
docs/SPARK.md; what runs where:

* **write** (``DisqueWriter``, one per Spark task, on executors): the rows
  become ADDJOB commands, pipelined ``batchSize`` at a time over
  ``connections`` client connections (threads; a synchronous ADDJOB holds
  its connection until its copies are made, so one connection cannot go
  faster than its round trips), each on its own node (``spread.first_node``:
  the ``nodes`` list rotated by partition and connection, so the tasks use
  every node listed) and failing over as our client does when that node is
  down (``spread.add_batches``). A task's commit message carries its counts; the
  first failed job fails the task with its error. Spark may run a task
  again: writes are at-least-once, or, with ``dedupColumn``, exactly once
  into the queue within the nodes' dedup window (each ADDJOB carries DEDUP
  and that column's value: a retried task, a re-sent batch or a write run
  again gets the IDs of the jobs already made and adds nothing).
* **read** (``DisqueReader``): ``partitions()`` runs on the driver. A
  snapshot (default) lists the IDs on every node of the cluster (JSCAN,
  IDs only), gives each job to exactly one node (the one where it is
  queued, else one of its holders, spread), and cuts each node's IDs into
  partitions; ``read()`` on an executor fetches the bodies from that node
  (pipelined SHOW). Nothing is taken. ``mode=consume`` makes one
  partition per node that takes jobs (GETJOB NOHANG) and acknowledges
  them after handing them to Spark: at-most-once, because a batch read has
  no commit.
* **stream** (``DisqueStreamReader``): ``latestOffset``, ``partitions``
  and ``commit`` run in one long-lived driver process. ``latestOffset``
  takes jobs (GETJOB NOHANG on every node) and returns an offset that
  *names* them (``{"seq": n, "jobs": {"host:port": [id...]}}``), so they
  are in Spark's offset log before the batch runs; the bodies travel to
  the executors inside the partitions. ``commit(end)`` acknowledges the
  jobs of every batch up to ``end`` (ACKJOB, idempotent). A batch replayed
  after a crash has no bodies in memory: they are fetched again by ID
  (SHOW), and a job acknowledged or expired meanwhile is skipped and
  counted in the log. While a batch is in Spark's hands a thread sends
  WORKING for its jobs before their RETRY runs out, so a slow batch is not
  delivered twice. Spark commits a batch only when it plans the next one,
  so when nothing new arrives the source ends one empty batch to get the
  last one committed. Guarantee: at-least-once (a job is acknowledged only
  after the sink committed its batch); a batch that was running when the
  query died is delivered again. Each row's ``ctime`` (event time) comes
  from a SHOW pipelined with the take (``eventTime``). How much a batch
  takes: ``maxJobsPerTrigger`` (Spark's ReadMaxRows), ``maxBytesPerTrigger``
  (``_Prefetcher._pop``), ``minJobsPerTrigger``/``maxTriggerDelay`` (no batch
  until that many are ready, or the delay passed since the last one).
  ``reportLatestOffset`` carries the lag (queued jobs, the oldest one's age,
  jobs held), which Spark puts in every progress event.
* **stream sink** (``DisqueStreamWriter``, on executors): each micro-batch
  as a batch write whose every row has a DEDUP key, its ``dedupColumn`` or
  ``sinkId/batch/partition/row`` (:mod:`.sink`): a batch Spark runs again
  adds no job twice.
"""

from __future__ import annotations

import dataclasses
import datetime
import logging
import queue as queue_mod
import threading
import time
from collections.abc import Iterator, Sequence
from typing import Any

from pyspark.sql.datasource import (
    DataSource,
    DataSourceReader,
    DataSourceStreamReader,
    DataSourceStreamWriter,
    DataSourceWriter,
    InputPartition,
    WriterCommitMessage,
)
from pyspark.sql.streaming.datasource import ReadAllAvailable, ReadLimit, ReadMaxRows, SupportsTriggerAvailableNow
from pyspark.sql.types import BinaryType, LongType, StringType, StructField, StructType, TimestampType

from ..client import commands as cmd
from ..client import consumers
from ..client.cluster import Address
from ..client.errors import DisqueError, ServerError
from ..core.ids import is_at_most_once_id
from . import options as opts
from .links import Links, Unreachable, address_text, parse_address_text
from .sink import BATCH_ID, QUERY_ID, RowsToJobs, position_prefix, write_columns
from .spread import SCAN_COUNT, assign_snapshot, scan_ids

__all__ = ["DisqueDataSource", "SCHEMA", "DisqueCommitMessage"]

log = logging.getLogger("disque_py.spark")

SCHEMA = StructType([
    StructField("id", StringType(), False),
    StructField("queue", StringType(), False),
    StructField("body", BinaryType(), False),
    StructField("state", StringType(), True),
    StructField("ctime", TimestampType(), True),
    StructField("ttl", LongType(), True),
    StructField("retry", LongType(), True),
    StructField("nacks", LongType(), True),
    StructField("additional_deliveries", LongType(), True),
    StructField("node", StringType(), True),
])  # fmt: skip
FIELDS = [f.name for f in SCHEMA.fields]

# Past this many jobs, a stream trigger with no limit (ReadAllAvailable) stops taking: a producer
# faster than the stream must not make one micro-batch endless.
ALL_AVAILABLE_CAP = 1_000_000
ACK_CHUNK = 1000  # IDs per ACKJOB / ENQUEUE command
PREFETCH_ALL = 20_000  # jobs held ahead when Spark asks for all available (no maxJobsPerTrigger)


def _arrow_schema() -> Any:
    import pyarrow as pa

    return pa.schema([
        pa.field("id", pa.string(), False), pa.field("queue", pa.string(), False),
        pa.field("body", pa.binary(), False), pa.field("state", pa.string()),
        pa.field("ctime", pa.timestamp("us", tz="UTC")), pa.field("ttl", pa.int64()),
        pa.field("retry", pa.int64()), pa.field("nacks", pa.int64()),
        pa.field("additional_deliveries", pa.int64()), pa.field("node", pa.string()),
    ])  # fmt: skip


def to_batch(rows: Sequence[Sequence[Any]]) -> Any:
    """Rows in SCHEMA order -> one pyarrow RecordBatch of exactly SCHEMA's Arrow types."""
    import pyarrow as pa

    schema = _arrow_schema()
    columns = list(zip(*rows)) if rows else [()] * len(FIELDS)
    arrays = [pa.array(col, type=field.type) for col, field in zip(columns, schema)]
    return pa.RecordBatch.from_arrays(arrays, schema=schema)


def _ctime(value: Any) -> datetime.datetime | None:
    # SHOW's ctime is wall-clock milliseconds * 1e6 (Disque's): microseconds are ctime // 1000.
    if not isinstance(value, int) or value <= 0:
        return None
    return datetime.datetime.fromtimestamp(value // 1000 / 1e6, tz=datetime.timezone.utc)


def _show_ctime(reply: Any) -> datetime.datetime | None:
    """The creation time in a SHOW reply (None for nil or an error)."""
    if not isinstance(reply, list):
        return None
    for i in range(0, len(reply) - 1, 2):
        if reply[i] == b"ctime":
            return _ctime(reply[i + 1])
    return None


def _show_row(reply: Any, node: str) -> tuple | None:
    """A SHOW reply (flat list) -> a SCHEMA row, None for nil."""
    if not isinstance(reply, list):
        return None
    f = {reply[i]: reply[i + 1] for i in range(0, len(reply) - 1, 2)}
    if f.get(b"state") in (None, b"acked") or f.get(b"queue") is None or f.get(b"body") is None:
        return None  # acknowledged (a tombstone, or a dummy ack without the job): not a job to read
    return (
        f[b"id"].decode("ascii"), cmd.decode_name(f[b"queue"]), f[b"body"], f[b"state"].decode("ascii"),
        _ctime(f.get(b"ctime")), f.get(b"ttl"), f.get(b"retry"), f.get(b"nacks"),
        f.get(b"additional-deliveries"), node,
    )  # fmt: skip


def _links(o: opts.Options, socket_timeout: float | None = 30.0) -> Links:
    # A stream's connections carry its name and queues (CLIENT SETNAME), so the nodes' CLIENT
    # LIST tells who consumes what: the admin page's consumers and their lag (client/consumers.py).
    name = consumers.client_name(o.consumer_name, o.queues) if o.use == "stream" and o.consumer_name else None
    return Links(o.nodes, connect_timeout=o.connect_timeout, socket_timeout=socket_timeout, client_name=name,
                 **o.connection_options())  # fmt: skip


def _cluster(o: opts.Options) -> tuple[Links, list[Address]]:
    """Links and every reachable node of the cluster, or a clear Unreachable."""
    links = _links(o)
    nodes = links.nodes()
    live = links.reachable(nodes)
    if not live:
        raise Unreachable("disque: no node of the cluster answered (tried %s)" % ", ".join(map(address_text, nodes)))
    return links, live


# ==================================================================== the data source
class DisqueDataSource(DataSource):
    """``format("disque")``: jobs of a Disque cluster as rows (see the module docstring)."""

    @classmethod
    def name(cls) -> str:
        return "disque"

    def schema(self) -> StructType:
        return SCHEMA

    def writer(self, schema: StructType, overwrite: bool) -> DataSourceWriter:
        if overwrite:
            raise ValueError("disque: a queue cannot be overwritten; use .mode(\"append\")")
        o = opts.parse(self.options, "write")
        columns = write_columns(o, schema)
        links, _ = _cluster(o)  # fail here, once, if no node answers (not in every task)
        links.close()
        return DisqueWriter(o, columns)

    def streamWriter(self, schema: StructType, overwrite: bool) -> DataSourceStreamWriter:
        if overwrite:
            raise ValueError("disque: a queue cannot be overwritten; use outputMode(\"append\")")
        o = opts.parse(self.options, "sink")
        columns = write_columns(o, schema)
        links, _ = _cluster(o)
        links.close()
        return DisqueStreamWriter(o, columns)

    def reader(self, schema: StructType) -> DataSourceReader:
        _check_read_schema(schema)
        o = opts.parse(self.options, "read")
        links, _ = _cluster(o)
        links.close()
        return DisqueReader(o)

    def streamReader(self, schema: StructType) -> DataSourceStreamReader:
        _check_read_schema(schema)
        o = opts.parse(self.options, "stream")
        # the default name is this process's (the driver side of the query), fixed here so that
        # every copy of the reader (executors: pickled) names its connections the same
        return DisqueStreamReader(dataclasses.replace(o, consumer_name=o.consumer_name or consumers.default_name()))


def _check_read_schema(schema: StructType) -> None:
    if schema.fieldNames() != FIELDS:
        raise ValueError("disque: the read schema is fixed (%s); do not pass .schema(...)" % ", ".join(FIELDS))


# ==================================================================== write
class DisqueCommitMessage(WriterCommitMessage):
    """What one write task did: jobs added, and per node address."""

    def __init__(self, jobs: int, nodes: dict[str, int]) -> None:
        self.jobs = jobs
        self.nodes = nodes


class _Jobs:
    """What a batch writer and the stream writer share: the options and the columns (checked on the
    driver), and the task's rows made jobs (on an executor)."""

    def __init__(self, o: opts.Options, columns: tuple[int | None, int | None, int | None]) -> None:
        self.o = o
        self.columns = columns

    def _add(self, iterator: Iterator[Any], stream: bool) -> DisqueCommitMessage:
        from pyspark import TaskContext

        context = TaskContext.get()
        part = context.partitionId() if context is not None else 0
        prefix = None
        if stream and self.o.dedup_column is None:
            sink_id = self.o.sink_id or (context.getLocalProperty(QUERY_ID) if context is not None else None)
            batch = context.getLocalProperty(BATCH_ID) if context is not None else None
            if not sink_id or batch is None:
                raise RuntimeError("disque: a stream sink task without its query's id and batch id (Spark's "
                                   "local properties %s, %s)" % (QUERY_ID, BATCH_ID))  # fmt: skip
            prefix = position_prefix(sink_id, int(batch), part)
        return DisqueCommitMessage(*RowsToJobs(self.o, self.columns, prefix).write(part, iterator))


class DisqueWriter(_Jobs, DataSourceWriter):
    def write(self, iterator: Iterator[Any]) -> DisqueCommitMessage:
        return self._add(iterator, stream=False)

    def commit(self, messages: list[WriterCommitMessage | None]) -> None:
        jobs = sum(m.jobs for m in messages if isinstance(m, DisqueCommitMessage))
        log.info("disque write: %d jobs added by %d tasks", jobs, len(messages))

    def abort(self, messages: list[WriterCommitMessage | None]) -> None:
        jobs = sum(m.jobs for m in messages if isinstance(m, DisqueCommitMessage))
        log.warning("disque write failed: %d jobs were added before the failure and stay queued", jobs)


# ==================================================================== stream write
class DisqueStreamWriter(_Jobs, DataSourceStreamWriter):
    """``writeStream.format("disque")``: each micro-batch's rows become jobs as in a batch write,
    each with a DEDUP key (its ``dedupColumn`` value, else ``sinkId/batch/partition/row``: see
    :mod:`.sink`), so a batch Spark runs again after a crash, or a task it retries, adds no job
    twice. ``commit`` and ``abort`` run on the driver and only log: the jobs are in the queues
    once ``write`` returns (a consumer may take them before the batch is committed)."""

    def write(self, iterator: Iterator[Any]) -> DisqueCommitMessage:
        return self._add(iterator, stream=True)

    def commit(self, messages: list[WriterCommitMessage | None], batchId: int) -> None:
        jobs = sum(m.jobs for m in messages if isinstance(m, DisqueCommitMessage))
        log.info("disque sink: batch %d, %d jobs added by %d tasks", batchId, jobs, len(messages))

    def abort(self, messages: list[WriterCommitMessage | None], batchId: int) -> None:
        jobs = sum(m.jobs for m in messages if isinstance(m, DisqueCommitMessage))
        log.warning("disque sink: batch %d failed; %d jobs were added and stay queued (the batch's rerun "
                    "adds them no second time)", batchId, jobs)  # fmt: skip


# ==================================================================== batch read
class _NodeIds(InputPartition):
    """Fetch these job IDs from this node (snapshot, or a replayed stream batch)."""

    def __init__(self, node: str, ids: list[str]) -> None:
        self.node = node
        self.ids = ids


class _Consume(InputPartition):
    """Take and acknowledge jobs of these queues from this node."""

    def __init__(self, node: str, queues: list[str]) -> None:
        self.node = node
        self.queues = queues


def _all_queues(links: Links, nodes: Sequence[Address]) -> list[str]:
    names: dict[str, None] = {}
    for node in nodes:
        cursor = 0
        while True:
            call = cmd.qscan(cursor, count=SCAN_COUNT)
            cursor, page = call.parse(links.call(node, *call.argv))
            names.update(dict.fromkeys(page))
            if cursor == 0:
                break
    return sorted(names)


def _fetch(links: Links, node: Address, ids: Sequence[str], batch: int) -> Iterator[list[tuple]]:
    """Rows for ``ids`` from ``node`` (pipelined SHOW), ``batch`` at a time; unknown IDs skipped."""
    name = address_text(node)
    for start in range(0, len(ids), batch):
        chunk = ids[start : start + batch]
        replies = links.call_many(node, [(b"SHOW", i.encode("ascii")) for i in chunk])
        yield [row for row in (_show_row(r, name) for r in replies) if row is not None]


class DisqueReader(DataSourceReader):
    def __init__(self, o: opts.Options) -> None:
        self.o = o

    def partitions(self) -> Sequence[InputPartition]:
        o = self.o
        links, nodes = _cluster(o)
        try:
            if o.mode == "consume":
                queues = list(o.queues) or _all_queues(links, nodes)
                return [_Consume(address_text(n), queues) for n in nodes] if queues else []
            assigned = assign_snapshot(links, nodes, o.queues)
        finally:
            links.close()
        parts: list[InputPartition] = []
        for node, ids in assigned.items():
            for start in range(0, len(ids), o.jobs_per_partition):
                parts.append(_NodeIds(address_text(node), ids[start : start + o.jobs_per_partition]))
        log.info("disque read: %d jobs on %d nodes in %d partitions", sum(map(len, assigned.values())), len(nodes),
                 len(parts))  # fmt: skip
        return parts

    def read(self, partition: InputPartition) -> Iterator[Any]:
        o = self.o
        if isinstance(partition, _Consume):
            yield from _consume(o, parse_address_text(partition.node), partition.queues)
            return
        assert isinstance(partition, _NodeIds)
        links = _links(o)
        try:
            for rows in _fetch(links, parse_address_text(partition.node), partition.ids, o.batch_size):
                if rows:
                    yield to_batch(rows)
        finally:
            links.close()


def _consume(o: opts.Options, node: Address, queues: list[str]) -> Iterator[Any]:
    """Take jobs from ``node`` until its queues stay empty for ``drainWait``; ack each batch after
    Spark has it (at-most-once: nothing tells a batch read that Spark finished)."""
    links = _links(o)
    name = address_text(node)
    argv = (b"GETJOB", b"NOHANG", b"COUNT", o.batch_size, b"WITHCOUNTERS", b"FROM", *(q.encode() for q in queues))
    try:
        idle_since: float | None = None
        while True:
            jobs = cmd.parse_getjob(links.call(node, *argv))
            if not jobs:
                now = time.monotonic()
                idle_since = idle_since or now
                if now - idle_since >= o.drain_wait:
                    return
                time.sleep(0.05)
                continue
            idle_since = None
            yield to_batch([
                (j.id, j.queue, j.body, "active", None, None, None, j.nacks, j.additional_deliveries, name)
                for j in jobs
            ])  # fmt: skip
            links.call(node, b"ACKJOB", *(j.id.encode() for j in jobs))
    finally:
        links.close()


# ==================================================================== streaming read
class _Rows(InputPartition):
    """Rows taken by the driver for this batch, shipped to the executor as they are."""

    def __init__(self, rows: list[tuple]) -> None:
        self.rows = rows


def _group(offset: dict) -> dict[str, list[str]]:
    jobs = offset.get("jobs") or {}
    return {node: list(ids) for node, ids in jobs.items() if ids}


class _Heartbeat:
    """Sends WORKING for jobs in Spark's hands before their RETRY runs out (a thread, own links).

    The taker sends the first WORKING at once (its reply is the job's RETRY); from then on each
    job is due at half its RETRY; ``workingInterval`` overrides that with a fixed period."""

    def __init__(self, o: opts.Options) -> None:
        self.o = o
        self.links = _links(o, socket_timeout=10.0)
        self.lock = threading.Lock()
        self.due: dict[str, tuple[float, Address]] = {}  # job id -> (next WORKING at, node)
        self.sent = 0
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def _start(self) -> None:
        if self._thread is None:
            self._thread = threading.Thread(target=self._run, name="disque-working", daemon=True)
            self._thread.start()

    def _half(self, retry: float) -> float:
        return self.o.working_interval if self.o.working_interval is not None else max(0.05, retry / 2)

    def add(self, jobs: list[tuple[str, str, Address]], retries: Sequence[Any] | None = None) -> None:
        """Watch (id, queue, node); ``retries``: each job's RETRY if known (a WORKING reply)."""
        now = time.monotonic()
        with self.lock:
            for n, (job_id, queue, node) in enumerate(jobs):
                retry = retries[n] if retries is not None else None
                if not (isinstance(retry, int) and retry > 0):
                    retry = 1  # unknown: soon
                self.due[job_id] = (now + self._half(float(retry)), node)
        self._start()

    def remove(self, ids: list[str]) -> None:
        with self.lock:
            for job_id in ids:
                self.due.pop(job_id, None)

    def _run(self) -> None:
        while not self._stop.wait(0.1):
            now = time.monotonic()
            with self.lock:
                ready = [(job_id, node) for job_id, (at, node) in self.due.items() if at <= now]
            by_node: dict[Address, list[str]] = {}
            for job_id, node in ready:
                by_node.setdefault(node, []).append(job_id)
            for node, ids in by_node.items():
                try:
                    replies = self.links.call_many(node, [(b"WORKING", i.encode()) for i in ids])
                except DisqueError as exc:
                    log.warning("disque stream: WORKING to %s failed (%s); retrying", address_text(node), exc)
                    replies = [None] * len(ids)
                self.sent += len(ids)
                later = time.monotonic()
                with self.lock:
                    for job_id, reply in zip(ids, replies):
                        if job_id not in self.due:
                            continue
                        if isinstance(reply, int) and reply > 0:
                            self.due[job_id] = (later + self._half(float(reply)), node)
                        elif isinstance(reply, ServerError):
                            del self.due[job_id]  # acked, or gone: nothing to keep
                        else:
                            self.due[job_id] = (later + 0.5, node)

    def stop(self) -> None:
        self._stop.set()
        self.links.close()


class _Prefetcher:
    """Takes the next micro-batch's jobs while Spark runs the current one (a thread, own links).

    ``latestOffset`` then finds them ready instead of waiting for the nodes: the take (GETJOB,
    WORKING) overlaps Spark's work. It holds at most one batch ahead (``want``, the size Spark
    last asked for, at most ``PREFETCH_ALL``), and under ``Trigger.AvailableNow`` never more than
    the jobs counted at the start (``limit_total``). Jobs held here are kept from requeueing by
    the WORKING thread like those of a running batch; if the query dies they come back after
    their RETRY, as for any consumer that dies."""

    def __init__(self, reader: "DisqueStreamReader") -> None:
        self.reader = reader
        self.links = _links(reader.o)
        self.lock = threading.Condition()
        self.buffer: dict[str, list[tuple]] = {}
        self.count = 0
        self.bytes = 0  # body bytes in the buffer
        self.held: set[str] = set()  # IDs in the buffer or in batches not yet committed
        self.want = 0
        self.total: int | None = None  # availableNow: jobs left to take in all
        self.dry = False  # the last take came back short: the queues are empty for now
        self.error: BaseException | None = None
        self._stop = False
        self._thread: threading.Thread | None = None

    def limit_total(self, n: int) -> None:
        with self.lock:
            self.total = n

    def forget(self, ids: list[str]) -> None:
        with self.lock:
            self.held.difference_update(ids)

    def _want(self, n: int) -> None:
        self.want = n
        if self._thread is None:
            self._thread = threading.Thread(target=self._run, name="disque-take", daemon=True)
            self._thread.start()
        self.lock.notify_all()

    def ready(self, hold: int) -> int:
        """The jobs ready now, and keep taking until ``hold`` are (``minJobsPerTrigger``)."""
        with self.lock:
            self._want(max(self.want, hold))
            return self.count

    def grab(self, limit: int, hold: int = 0) -> dict[str, list[tuple]]:
        """Up to ``limit`` jobs (and ``maxBytesPerTrigger`` of bodies) for a new batch: waits until
        that many are ready or the queues run dry (under availableNow: until ``drainWait`` passed
        with nothing ready). ``hold``: jobs to keep taking ahead (``minJobsPerTrigger``)."""
        o = self.reader.o
        with self.lock:
            self._want(max(min(limit, PREFETCH_ALL), hold))
            self.dry = False
            deadline = time.monotonic() + 30
            idle_since: float | None = None
            while True:
                if self.error is not None:
                    error, self.error = self.error, None
                    raise error
                if self.count >= min(self.want, limit) or (self.total is not None and self.count >= self.total):
                    break
                if o.max_bytes_per_trigger is not None and self.bytes >= o.max_bytes_per_trigger:
                    break
                now = time.monotonic()
                if self.dry:
                    if self.count or self.total is None:
                        break
                    # availableNow and nothing ready: jobs may still be moving between nodes
                    idle_since = idle_since or now
                    if self.total <= 0 or now - idle_since >= o.drain_wait:
                        self.total = 0
                        break
                if now >= deadline:
                    break
                self.lock.wait(0.05)
            return self._pop(limit, o.max_bytes_per_trigger)

    def _pop(self, limit: int, max_bytes: int | None = None) -> dict[str, list[tuple]]:
        out: dict[str, list[tuple]] = {}
        n = 0
        size = 0
        for node in list(self.buffer):
            if n >= limit or (max_bytes is not None and size >= max_bytes):
                break
            rows = self.buffer[node]
            cut = limit - n
            if max_bytes is not None:
                k = 0
                while k < min(cut, len(rows)) and (size + len(rows[k][2]) <= max_bytes or n + k == 0):
                    size += len(rows[k][2])
                    k += 1
                cut = k
            part, rest = rows[:cut], rows[cut:]
            if part:
                out[node] = part
                n += len(part)
                self.bytes -= sum(len(r[2]) for r in part)
            if rest:
                self.buffer[node] = rest
            else:
                del self.buffer[node]
        self.count -= n
        if self.total is not None:
            self.total -= n
        self.lock.notify_all()
        return out

    def _run(self) -> None:
        reader = self.reader
        while True:
            with self.lock:
                while not self._stop:
                    need = self.want - self.count
                    if self.total is not None:
                        need = min(need, self.total - self.count)
                    if need > 0:
                        break
                    self.lock.wait(0.5)
                if self._stop:
                    return
                held = self.held
            chunk = min(need, reader.o.batch_size * 4)
            try:
                taken = reader._take(chunk, self.links, held)
            except BaseException as exc:  # noqa: BLE001 - handed to latestOffset, which raises it
                with self.lock:
                    self.error = exc
                    self.want = 0
                    self.lock.notify_all()
                continue
            n = sum(len(rows) for rows in taken.values())
            with self.lock:
                for node, rows in taken.items():
                    self.buffer.setdefault(node, []).extend(rows)
                    self.bytes += sum(len(r[2]) for r in rows)
                self.count += n
                if n < chunk:
                    self.dry = True
                self.lock.notify_all()
                if n < chunk and not self._stop:
                    self.lock.wait(0.1 if n == 0 else 0.02)  # an empty queue is polled, not hammered

    def stop(self) -> None:
        with self.lock:
            self._stop = True
            self.lock.notify_all()
        self.links.close()


class _Acker:
    """Acknowledges committed batches in a thread of its own (own links), so that Spark's planning
    of the next batch does not wait for the nodes to collect the acks of every copy. ACKJOB goes
    to the node that gave each job, every node at once; a node that fails is replaced by another
    live one (an ACKJOB anywhere is collected cluster-wide). :meth:`flush` waits until all is sent."""

    def __init__(self, o: opts.Options) -> None:
        self.o = o
        self.links = _links(o)
        self.work: queue_mod.Queue = queue_mod.Queue()
        self.acked = 0
        self.failed = 0
        self._thread: threading.Thread | None = None

    def submit(self, groups: dict[str, list[str]]) -> None:
        if not any(groups.values()):
            return
        if self._thread is None:
            self._thread = threading.Thread(target=self._run, name="disque-ack", daemon=True)
            self._thread.start()
        self.work.put(groups)

    def flush(self) -> None:
        if self._thread is not None:
            self.work.join()

    def stop(self) -> None:
        if self._thread is not None:
            self.work.put(None)
        self.links.close()

    def _run(self) -> None:
        while True:
            groups = self.work.get()
            try:
                if groups is None:
                    return
                self._send(groups)
            except Exception:  # noqa: BLE001 - never let the thread die: jobs would only come back later
                log.exception("disque stream: acknowledging a committed batch failed")
            finally:
                self.work.task_done()

    def _send(self, groups: dict[str, list[str]]) -> None:
        pending = {parse_address_text(node): ids for node, ids in groups.items() if ids}
        for _attempt in range(5):
            work = {node: [(b"ACKJOB", *(i.encode() for i in ids[k : k + ACK_CHUNK]))
                           for k in range(0, len(ids), ACK_CHUNK)] for node, ids in pending.items()}  # fmt: skip
            replies = self.links.call_all(work)
            failed = {node: pending[node] for node, reply in replies.items() if isinstance(reply, DisqueError)}
            self.acked += sum(len(ids) for node, ids in pending.items() if node not in failed)
            if not failed:
                return
            try:
                live = self.links.reachable(self.links.nodes(max_age=0))
            except Unreachable:
                live = []
            spare = [n for n in live if n not in failed]
            for node in failed:
                log.warning("disque stream: ACKJOB on %s failed; trying %s", address_text(node),
                            address_text(spare[0]) if spare else "again")  # fmt: skip
            if spare:
                pending = {}
                for k, ids in enumerate(failed.values()):
                    pending.setdefault(spare[k % len(spare)], []).extend(ids)
            else:
                pending = failed
                time.sleep(1)
        self.failed += sum(len(ids) for ids in pending.values())
        log.error("disque stream: %d committed jobs could not be acknowledged; they will be delivered again",
                  sum(len(ids) for ids in pending.values()))  # fmt: skip


class DisqueStreamReader(DataSourceStreamReader, SupportsTriggerAvailableNow):
    def __init__(self, o: opts.Options) -> None:
        self.o = o
        links, nodes = _cluster(o)  # fail fast: no node reachable, RETRY 0 jobs queued
        try:
            self._refuse_at_most_once(links, nodes)
        finally:
            links.close()
        self._setup()

    def _setup(self) -> None:
        # No connection is opened here: Spark pickles a copy of this reader for read() on the
        # executors (only ``o`` travels, see __getstate__).
        self.links = _links(self.o)
        self.batches: dict[int, dict[str, list[tuple]]] = {}  # seq -> node -> rows (in memory)
        self.acked_through = -1
        self.last_seq = 0
        self.heartbeat = _Heartbeat(self.o)
        self.acker = _Acker(self.o)
        self.prefetch = _Prefetcher(self)
        self.retry_hint: dict[str, int] = {}  # queue -> the smallest RETRY seen in a WORKING reply
        self.available_now: int | None = None  # jobs left to take under Trigger.AvailableNow
        self.last_batch_at = time.monotonic()  # minJobsPerTrigger waits at most maxTriggerDelay from here
        self.stats = {"taken": 0, "replayed": 0, "replay_skipped": 0, "empty_batches": 0,
                      "redelivered_skipped": 0}
        self._next_node = 0

    def __getstate__(self) -> dict:
        return {"o": self.o}

    def __setstate__(self, state: dict) -> None:
        self.o = state["o"]
        self._setup()

    # ---------------------------------------------------------------- helpers
    def _to_touch(self, jobs: list) -> list:
        """The jobs just taken that get a WORKING now: all (``workingOnTake``, the default), else
        the first one, only to learn its queue's RETRY (the heartbeat then sends WORKING at half of
        it; meanwhile another holder may queue a job again: a duplicate with a chance of about
        time-in-hand / RETRY)."""
        if self.o.working_on_take or not jobs:
            return jobs
        return jobs[:1] if jobs[0].queue not in self.retry_hint else []

    def _nodes(self, links: Links | None = None) -> list[Address]:
        try:
            return (links or self.links).nodes()
        except Unreachable:
            return list(self.o.nodes)

    def _refuse_at_most_once(self, links: Links, nodes: list[Address]) -> None:
        for node in nodes:
            for q in self.o.queues:
                peek = links.call(node, b"QPEEK", q.encode(), 1)
                for item in peek or []:
                    if is_at_most_once_id(item[1]):
                        raise ValueError(self._at_most_once_message(q))

    @staticmethod
    def _at_most_once_message(queue: str) -> str:
        return (
            "disque: queue '%s' holds RETRY 0 jobs (at-most-once), which a stream cannot deliver again "
            "after a failure; add them with RETRY > 0, or read them with "
            "spark.read.format(\"disque\").option(\"mode\", \"consume\")" % queue
        )

    def _ack(self, groups: dict[str, list[str]]) -> None:
        """Acknowledge every ID, in the background (see :class:`_Acker`)."""
        for ids in groups.values():
            self.heartbeat.remove(ids)
            self.prefetch.forget(ids)
        self.acker.submit(groups)

    def _take(self, budget: int, links: Links, held: set[str]) -> dict[str, list[tuple]]:
        """Up to ``budget`` jobs: GETJOB NOHANG on every node at once, round after round, each
        round also carrying the WORKING of the jobs the previous round took there, until the budget
        is met or every node came back short."""
        o = self.o
        taken: dict[str, list[tuple]] = {}
        count = 0
        get_tail = (b"WITHCOUNTERS", b"FROM", *(q.encode() for q in o.queues))
        # A job already in our hands (this take, the buffer, a batch not yet committed: ``held``)
        # that another holder queued again before our WORKING reached it is delivered once.
        seen = held
        ctimes: dict[str, datetime.datetime | None] = {}
        nodes = self._nodes(links)
        active = list(nodes)
        working: dict[Address, list] = {}
        while True:
            work: dict[Address, list[tuple]] = {}
            asked: dict[Address, int] = {}
            touched: dict[Address, list] = {}
            left = budget - count
            for node in nodes:
                touched[node] = self._to_touch(working.get(node, []))
                argvs = [(b"WORKING", j.id.encode()) for j in touched[node]]
                if left > 0 and node in active:
                    asked[node] = min(o.batch_size, -(-left // len(active)))
                    argvs.append((b"GETJOB", b"NOHANG", b"COUNT", asked[node], *get_tail))
                if o.event_time:  # the creation times of the previous round's jobs (SHOW's ctime)
                    argvs += [(b"SHOW", j.id.encode()) for j in working.get(node, [])]
                if argvs:
                    work[node] = argvs
            if not work:
                break
            replies = links.call_all(work)
            next_working: dict[Address, list] = {}
            for node, reply in replies.items():
                took = working.get(node, [])
                sent = touched.get(node, [])
                if len(sent) < len(took):  # workingOnTake false: the others are due at half a RETRY
                    rest = took[len(sent) :]
                    self.heartbeat.add([(j.id, j.queue, node) for j in rest], [self.retry_hint.get(j.queue) for j in rest])
                if isinstance(reply, DisqueError):
                    log.warning("disque stream: %s failed (%s)", address_text(node), reply)
                    if node in active:
                        active.remove(node)
                    self.heartbeat.add([(j.id, j.queue, node) for j in sent])  # WORKING again soon
                    continue
                # WORKING at once: another holder may queue a job again at any moment after it
                # left its queue here (its own RETRY timer), long before half a RETRY.
                self.heartbeat.add([(j.id, j.queue, node) for j in sent], reply[: len(sent)])
                for j, retry in zip(sent, reply):
                    if isinstance(retry, int) and retry > 0 and retry < self.retry_hint.get(j.queue, 1 << 62):
                        self.retry_hint[j.queue] = retry
                if o.event_time:
                    shown = working.get(node, [])
                    for j, show in zip(shown, reply[len(reply) - len(shown) :]):
                        ctimes[j.id] = _show_ctime(show)
                if node not in asked:
                    continue
                got = reply[len(sent)]
                jobs = [] if isinstance(got, DisqueError) else cmd.parse_getjob(got)
                if len(jobs) < asked[node]:
                    active.remove(node)  # its queues ran dry (for this take)
                if not jobs:
                    continue
                bad = next((j for j in jobs if is_at_most_once_id(j.id.encode())), None)
                if bad is not None:
                    # Put back what this call took, and refuse: these jobs cannot be delivered twice.
                    links.call(node, b"ENQUEUE", *(j.id.encode() for j in jobs))
                    raise ValueError(self._at_most_once_message(bad.queue))
                fresh = [j for j in jobs if j.id not in seen]
                self.stats["redelivered_skipped"] += len(jobs) - len(fresh)
                if not fresh:
                    continue
                name = address_text(node)
                taken.setdefault(name, []).extend(
                    (j.id, j.queue, j.body, "active", None, None, None, j.nacks, j.additional_deliveries, name)
                    for j in fresh
                )  # fmt: skip
                count += len(fresh)
                next_working[node] = fresh
                with self.prefetch.lock:
                    seen.update(j.id for j in fresh)
            working = next_working
        self.stats["taken"] += count
        if ctimes:
            taken = {node: [(*r[:4], ctimes.get(r[0]), *r[5:]) for r in rows] for node, rows in taken.items()}
        return taken

    def _queued_now(self) -> int:
        return self._backlog(oldest=False)[0]

    def _backlog(self, oldest: bool = True) -> tuple[int, int | None]:
        """(jobs queued in the source's queues on every node, age in milliseconds of the oldest of
        them or None): QLEN, and QPEEK + SHOW's ctime of each queue's head, per node."""
        total = 0
        first_ms: int | None = None
        for node in self._nodes():
            argvs: list[tuple] = []
            for q in self.o.queues:
                argvs.append((b"QLEN", q.encode()))
                if oldest:
                    argvs.append((b"QPEEK", q.encode(), 1))
            try:
                replies = self.links.call_many(node, argvs)
                total += sum(r for r in replies if isinstance(r, int))
                heads = [r[0][1] for r in replies if isinstance(r, list) and r and isinstance(r[0], list)]
                shows = self.links.call_many(node, [(b"SHOW", i) for i in heads])
            except DisqueError:
                continue
            for show in shows:
                created = _show_ctime(show)
                if created is not None:
                    ms = int(created.timestamp() * 1000)
                    first_ms = ms if first_ms is None else min(first_ms, ms)
        age = None if first_ms is None else max(0, int(time.time() * 1000) - first_ms)
        return total, age

    # ---------------------------------------------------------------- Spark's calls
    def initialOffset(self) -> dict:
        return {"seq": 0, "jobs": {}}

    def getDefaultReadLimit(self) -> ReadLimit:
        n = self.o.max_jobs_per_trigger
        return ReadMaxRows(n) if n else ReadAllAvailable()

    def prepareForTriggerAvailableNow(self) -> None:
        self.available_now = self._queued_now()
        self.prefetch.limit_total(self.available_now)
        log.info("disque stream: availableNow, %d jobs queued now", self.available_now)

    def reportLatestOffset(self) -> dict | None:
        # Shown as ``latestOffset`` in the query's progress (Python sources have no custom metrics):
        # the lag. ``queued``: jobs waiting in the source queues; ``oldestAgeMs``: how long the
        # oldest of them has waited; ``held``: jobs taken by this query and not yet acknowledged.
        queued, age = self._backlog()
        with self.prefetch.lock:
            held = len(self.prefetch.held)
        return {"seq": self.last_seq, "queued": queued, "oldestAgeMs": age, "held": held}

    def latestOffset(self, start: dict, limit: ReadLimit) -> dict:
        seq = int(start.get("seq", 0))
        # Batches planned after ``start`` that Spark never ran (it asked again from an older
        # start): give their jobs back now instead of after their RETRY.
        for stale in [s for s in self.batches if s > seq]:
            self._release(self.batches.pop(stale))
        wanted = limit.max_rows if isinstance(limit, ReadMaxRows) else ALL_AVAILABLE_CAP
        low = self.o.min_jobs_per_trigger if self.available_now is None else None  # as Kafka's
        if low is not None:
            ready = self.prefetch.ready(low)
            if ready < min(low, wanted) and time.monotonic() - self.last_batch_at < self.o.max_trigger_delay:
                return self._nothing_new(start, seq)
        taken = self.prefetch.grab(wanted, low or 0)
        if taken:
            self.last_batch_at = time.monotonic()
            n = sum(len(r) for r in taken.values())
            if self.available_now is not None:
                self.available_now = max(0, self.available_now - n)
            self.batches[seq + 1] = taken
            self.last_seq = seq + 1
            return {"seq": seq + 1, "jobs": {node: [r[0] for r in rows] for node, rows in taken.items()}}
        return self._nothing_new(start, seq)

    def _nothing_new(self, start: dict, seq: int) -> dict:
        if _group(start) and seq > self.acked_through:
            # Nothing new, but the batch that ended at ``start`` is not committed: Spark commits it
            # only when it plans another batch, so end an empty one.
            self.stats["empty_batches"] += 1
            self.last_seq = seq + 1
            return {"seq": seq + 1, "jobs": {}}
        # Nothing to run: let the acknowledgements of committed batches reach the nodes before
        # Spark may end the query (availableNow) and kill this process.
        self.acker.flush()
        return start

    def _release(self, batch: dict[str, list[tuple]]) -> None:
        for node_text, rows in batch.items():
            ids = [r[0] for r in rows]
            self.heartbeat.remove(ids)
            self.prefetch.forget(ids)
            try:
                self.links.call(parse_address_text(node_text), b"ENQUEUE", *(i.encode() for i in ids))
            except DisqueError:
                pass  # they come back after their RETRY

    def partitions(self, start: dict, end: dict) -> Sequence[InputPartition]:
        start_seq, end_seq = int(start.get("seq", 0)), int(end.get("seq", 0))
        if start_seq > self.acked_through and _group(start):
            # The batch that ended at ``start`` was committed by the sink (Spark runs batches in
            # order), but its acknowledgement may have been lost with a previous driver.
            self._ack(_group(start))
            self.acked_through = start_seq
        groups = _group(end)
        if not groups:
            return []
        batch = self.batches.get(end_seq)
        if batch is None or {n: [r[0] for r in rows] for n, rows in batch.items() if rows} != groups:
            batch = self.batches[end_seq] = self._replay(end_seq, groups)
        rows = [row for node_rows in batch.values() for row in node_rows]
        n = max(1, min(self.o.num_partitions, len(rows)))
        return [_Rows(rows[k::n]) for k in range(n)]

    def _replay(self, seq: int, groups: dict[str, list[str]]) -> dict[str, list[tuple]]:
        """A batch named in the offset log but not taken by this process: fetch it again by ID."""
        out: dict[str, list[tuple]] = {}
        wanted = sum(len(ids) for ids in groups.values())
        for node_text, ids in groups.items():
            missing = list(ids)
            found_rows: dict[str, tuple] = {}
            for node in [parse_address_text(node_text), *self._nodes()]:
                if not missing:
                    break
                try:
                    fetched = [row for rows in _fetch(self.links, node, missing, 1000) for row in rows]
                except DisqueError:
                    continue
                found = {row[0] for row in fetched}
                rows = [(r[0], r[1], r[2], "active", r[4], r[5], r[6], r[7], r[8], r[9]) for r in fetched]
                # They may have been queued again meanwhile: WORKING takes them out of their queue
                # (on every node) before the next batch could take them a second time.
                try:
                    retries = self.links.call_many(node, [(b"WORKING", r[0].encode()) for r in rows])
                except DisqueError:
                    retries = [None] * len(rows)
                found_rows.update((r[0], r) for r in rows)
                self.heartbeat.add([(r[0], r[1], node) for r in rows], retries)
                with self.prefetch.lock:
                    self.prefetch.held.update(r[0] for r in rows)
                missing = [i for i in missing if i not in found]
            # In the offset's order, under the offset's node: the same rows in the same partitions
            # as the first run (a stream sink keys its rows by their place in the batch).
            out[node_text] = [found_rows[i] for i in ids if i in found_rows]
        got = sum(len(r) for r in out.values())
        self.stats["replayed"] += got
        self.stats["replay_skipped"] += wanted - got
        log.warning(
            "disque stream: the batch ending at offset seq %d (Spark batch %d) is replayed from its IDs: "
            "%d jobs fetched again, %d skipped (acknowledged or expired meanwhile)", seq, seq - 1, got, wanted - got,
        )  # fmt: skip
        return out

    def read(self, partition: InputPartition) -> Iterator[Any]:
        assert isinstance(partition, _Rows)
        if partition.rows:
            yield to_batch(partition.rows)

    def commit(self, end: dict) -> None:
        end_seq = int(end.get("seq", 0))
        groups: dict[str, list[str]] = {}
        for seq in sorted(s for s in self.batches if s <= end_seq):
            for node, rows in self.batches.pop(seq).items():
                groups.setdefault(node, []).extend(r[0] for r in rows)
        if end_seq > self.acked_through:
            for node, ids in _group(end).items():
                groups.setdefault(node, []).extend(ids)
        groups = {node: list(dict.fromkeys(ids)) for node, ids in groups.items()}
        if groups:
            self._ack(groups)
        self.acked_through = max(self.acked_through, end_seq)

    def stop(self) -> None:
        self.prefetch.stop()
        self.acker.flush()
        self.acker.stop()
        self.heartbeat.stop()
        self.links.close()
