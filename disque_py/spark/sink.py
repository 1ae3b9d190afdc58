"""Rows to jobs: the ADDJOB commands of a batch write, of a stream sink, and ``foreach_batch``.

No pyspark import here (tests/test_contracts.py): what a row becomes is decided
from the DataFrame's schema by type *names*, so :func:`foreach_batch` runs on a
Spark without Python data sources (3.5), where ``disque_py.spark.source``
cannot be imported.

* :func:`write_columns` finds the body, queue and ``dedupColumn`` columns and
  fails on the driver with a clear error;
* :class:`RowsToJobs` turns a task's rows into pipelined ADDJOB argvs,
  ``batchSize`` at a time, each with its DEDUP key when the write has one:
  the ``dedupColumn``'s value, or a key made of the row's place in the stream
  (:func:`position_prefix` + the row's number in its partition);
* :func:`foreach_batch` is the stream sink as a ``foreachBatch`` function.

Exactly once per row into the queue (docs/SPARK.md, "Stream sink"): Spark runs
a micro-batch again after a crash from its offset log, and re-runs a failed
task; a row of the replay has the same key as the first time (the same sink
id, batch id, partition and row number) as long as the query's source replays
a batch with the same rows in the same order, so its ADDJOB answers the job
already made. Delta does the same per batch with ``txnAppId``/``txnVersion``.
"""

from __future__ import annotations

import datetime
import json
from collections.abc import Callable, Iterator
from typing import Any

from ..client import commands as cmd
from ..core.commands import MAX_DEDUP_KEY
from . import options as opts
from .spread import add_batches

__all__ = ["RowsToJobs", "write_columns", "dedup_key", "position_prefix", "foreach_batch", "QUERY_ID", "BATCH_ID"]

# The local properties Spark sets on every task of a streaming micro-batch (and on the thread
# that runs a foreachBatch function): the query's id, kept in its checkpoint, and the batch's.
QUERY_ID = "sql.streaming.queryId"
BATCH_ID = "streaming.sql.batchId"

_KEY_TYPES = ("string", "binary", "byte", "short", "integer", "long")
_BODY_TYPES = ("string", "binary")


def _type(field: Any) -> str:
    return field.dataType.typeName()


def write_columns(o: opts.Options, schema: Any) -> tuple[int | None, int | None, int | None]:
    """(index of the body column or None for json, index of the queue column or None, index of the
    dedupColumn or None) of a StructType, or a ValueError naming what is wrong."""
    names = schema.fieldNames()
    queue_idx = names.index("queue") if "queue" in names else None
    if queue_idx is not None and _type(schema.fields[queue_idx]) != "string":
        raise ValueError(
            "disque: column 'queue' must be a string (the queue of each row), got %s"
            % schema.fields[queue_idx].dataType.simpleString()
        )
    if queue_idx is None and o.queue is None:
        raise ValueError("disque: option 'queue' is required (or a string column 'queue' naming each row's queue)")
    dedup_idx = _dedup_index(o, schema) if o.dedup_column is not None else None
    if o.body_format == "json":
        return None, queue_idx, dedup_idx
    if "body" not in names:
        raise ValueError(
            "disque: no column 'body' (string or binary) to write; columns are %s. "
            "Select one as 'body', or use .option(\"bodyFormat\", \"json\") to send each row as JSON"
            % ", ".join(names)
        )
    body_idx = names.index("body")
    if _type(schema.fields[body_idx]) not in _BODY_TYPES:
        raise ValueError(
            "disque: column 'body' must be a string or binary, got %s (cast it, or use bodyFormat json)"
            % schema.fields[body_idx].dataType.simpleString()
        )
    return body_idx, queue_idx, dedup_idx


def _dedup_index(o: opts.Options, schema: Any) -> int:
    """The index of ``dedupColumn`` (exact name, else the one column equal to it ignoring case, as
    Spark resolves names); its type must make a stable key: string, binary or an integer."""
    names = schema.fieldNames()
    wanted = o.dedup_column or ""
    if wanted in names:
        idx = names.index(wanted)
    else:
        close = [i for i, n in enumerate(names) if n.lower() == wanted.lower()]
        if len(close) != 1:
            raise ValueError(
                "disque: option 'dedupcolumn' names column '%s', which the DataFrame does not have "
                "(columns: %s)" % (wanted, ", ".join(names))
            )
        idx = close[0]
    if _type(schema.fields[idx]) not in _KEY_TYPES:
        raise ValueError(
            "disque: the dedupColumn '%s' must be a string, binary or integer column (a stable key), got %s; "
            "cast it, e.g. .withColumn(\"%s\", col(\"%s\").cast(\"string\"))"
            % (names[idx], schema.fields[idx].dataType.simpleString(), names[idx], names[idx])
        )
    return idx


def dedup_key(value: Any) -> bytes:
    """A dedupColumn value -> the DEDUP key's bytes: a string as UTF-8, binary as is, an integer in
    decimal (so 42 and "42" are the same key). None or empty raises ValueError (the caller names the
    row)."""
    if value is None:
        raise ValueError("is null")
    if isinstance(value, str):
        key = value.encode("utf-8")
    elif isinstance(value, (bytes, bytearray, memoryview)):
        key = bytes(value)
    elif isinstance(value, int) and not isinstance(value, bool):
        key = str(value).encode("ascii")
    else:
        raise ValueError("is a %s, not a string, binary or integer" % type(value).__name__)
    if not key:
        raise ValueError("is empty")
    if len(key) > MAX_DEDUP_KEY:
        raise ValueError("is %d bytes, at most %d" % (len(key), MAX_DEDUP_KEY))
    return key


def position_prefix(sink_id: str, batch_id: int, part: int) -> bytes:
    """The DEDUP key of row ``n`` of partition ``part`` of micro-batch ``batch_id`` is this + ``n``."""
    return b"%s/%d/%d/" % (sink_id.encode("utf-8"), batch_id, part)


def _json_default(value: Any) -> Any:
    if isinstance(value, (bytes, bytearray)):
        import base64

        return base64.b64encode(value).decode("ascii")
    if isinstance(value, (datetime.date, datetime.datetime, datetime.time)):
        return value.isoformat()
    if hasattr(value, "asDict"):
        return value.asDict(recursive=True)
    return str(value)


class RowsToJobs:
    """A task's rows as ADDJOB argvs. ``prefix``: the stream position of the task's rows (their
    keys are prefix + row number), None for a batch write (keys from ``dedupColumn`` if set)."""

    def __init__(self, o: opts.Options, columns: tuple[int | None, int | None, int | None],
                 prefix: bytes | None = None) -> None:  # fmt: skip
        self.o = o
        self.body_idx, self.queue_idx, self.dedup_idx = columns
        self.prefix = prefix if self.dedup_idx is None else None

    @property
    def keyed(self) -> bool:
        """Whether every job has a DEDUP key (then a batch may be sent again safely)."""
        return self.dedup_idx is not None or self.prefix is not None

    def argvs(self, rows: list, first_row: int) -> list[tuple]:
        o, body_idx, queue_idx, dedup_idx, prefix = self.o, self.body_idx, self.queue_idx, self.dedup_idx, self.prefix
        extra = cmd.addjob_argv("q", b"", **o.addjob_options())[3:]
        out = []
        for n, row in enumerate(rows):
            queue = row[queue_idx] if queue_idx is not None else o.queue
            if queue is None or queue == "":
                raise ValueError("disque: row %d has no queue (its 'queue' column is empty)" % (first_row + n))
            if body_idx is None:
                body = json.dumps(row.asDict(recursive=True), default=_json_default, separators=(",", ":"))
            else:
                body = row[body_idx]
                if body is None:
                    raise ValueError("disque: row %d has a null body" % (first_row + n))
            if type(body) is str:
                body = body.encode("utf-8")
            if prefix is not None:
                out.append((b"ADDJOB", queue.encode("utf-8"), bytes(body), *extra, b"DEDUP", b"%s%d" % (prefix, first_row + n)))
                continue
            if dedup_idx is None:
                out.append((b"ADDJOB", queue.encode("utf-8"), bytes(body), *extra))
                continue
            try:
                key = dedup_key(row[dedup_idx])
            except ValueError as exc:
                # A row without a key cannot be added exactly once: fail rather than add it plainly.
                raise ValueError(
                    "disque: row %d's DEDUP key (dedupColumn '%s') %s; every row of a write with a "
                    "dedupColumn needs a non-empty key (filter or fill those rows first)"
                    % (first_row + n, o.dedup_column, exc)
                ) from None
            out.append((b"ADDJOB", queue.encode("utf-8"), bytes(body), *extra, b"DEDUP", key))
        return out

    def batches(self, iterator: Iterator[Any]) -> Iterator[tuple[int, list[tuple]]]:
        """The rows as (first row number, ADDJOB argvs), ``batchSize`` rows at a time."""
        rows: list = []
        row_no = 0
        for row in iterator:
            rows.append(row)
            if len(rows) >= self.o.batch_size:
                yield row_no, self.argvs(rows, row_no)
                row_no += len(rows)
                rows = []
        if rows:
            yield row_no, self.argvs(rows, row_no)

    def write(self, part: int, rows: Iterator[Any]) -> tuple[int, dict[str, int]]:
        """ADDJOB every row (:func:`spread.add_batches`): (jobs added, per node address)."""
        return add_batches(self.o, part, self.batches(rows), keyed=self.keyed)


def foreach_batch(sink_id: str | None = None, **options: Any) -> Callable[[Any, int], int]:
    """A ``foreachBatch`` function that writes each micro-batch into a queue exactly once per row:
    the stream sink of ``writeStream.format("disque")`` for a Spark without Python data sources.

    ``options`` are the sink's (docs/SPARK.md, any case: ``nodes``, ``queue``, ``replicate``,
    ``dedupColumn``, ...), checked now. ``sink_id`` names the sink in the rows' DEDUP keys (as
    Delta's ``txnAppId``); by default the streaming query's id, which its checkpoint keeps. Returns
    the function, which returns the number of jobs the batch added::

        query = df.writeStream.foreachBatch(foreach_batch(nodes=NODES, queue="out")).start()
    """
    given = {str(k): str(v) for k, v in options.items() if v is not None}
    if sink_id is not None:
        given["sinkId"] = sink_id
    o = opts.parse(given, "sink")

    def run(df: Any, batch_id: int) -> int:
        columns = write_columns(o, df.schema)
        name = o.sink_id
        if o.dedup_column is None and not name:
            name = df.sparkSession.sparkContext.getLocalProperty(QUERY_ID)
            if not name:
                raise ValueError(
                    "disque: this Spark does not tell a foreachBatch function its query's id; "
                    "give foreach_batch(sink_id=...) a stable name for this query"
                )
        batch = int(batch_id)

        def write(part: int, rows: Iterator[Any]) -> Iterator[int]:
            prefix = position_prefix(name, batch, part) if name else None
            yield RowsToJobs(o, columns, prefix).write(part, rows)[0]

        return sum(df.rdd.mapPartitionsWithIndex(write).collect())

    return run
