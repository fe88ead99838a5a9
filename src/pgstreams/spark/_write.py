"""Writing DataFrames to a topic (``df.write`` and ``df.writeStream`` with ``format("pgstreams")``).

Each Spark task publishes its rows in one PostgreSQL transaction that also inserts a row
``(sink id, batch id, task partition)`` into ``spark_sink_tasks``. A task that Spark runs again (a retry,
a speculative copy, a micro-batch replayed after the driver died) finds that row and publishes nothing:
its events are already committed. The sink id of a streaming query is its query id, which Spark keeps
in the checkpoint; the batch id is the micro-batch number. Rows of older micro-batches are deleted once
a later batch commits.
"""

from __future__ import annotations

import random
import uuid
from collections.abc import Iterator
from dataclasses import dataclass

import numpy as np
import pyarrow as pa
from pyspark import TaskContext
from pyspark.sql.datasource import (
    DataSourceArrowWriter,
    DataSourceStreamArrowWriter,
    WriterCommitMessage,
)
from pyspark.sql.types import (
    BinaryType,
    ByteType,
    IntegerType,
    LongType,
    MapType,
    ShortType,
    StringType,
    StructType,
)

from ..errors import InvalidArgument, KeyRequired, MessageTooLarge
from ..storage import Segments, TopicRecord, notification_channel
from ..topicconfig import MAX_MESSAGE_BYTES, TOPIC_CONFIG_DEFAULTS, compacts
from . import _db
from ._arrow import Partitioner, encode_copy, event_sizes
from ._options import WriteOptions
from ._sql import topic_query

#: Columns a written DataFrame may have, with what each must be.
ACCEPTED = ("value", "key", "headers", "partition", "event_type", "event_id", "correlation_id",
            "causation_id")
#: Columns of the read schema that writing ignores (so a read DataFrame can be written back as is).
IGNORED = ("topic", "position", "created_at")


def check_schema(schema: StructType) -> list[str]:
    """Validate the columns of a DataFrame to write; return the names of those that are used."""
    names = [f.name for f in schema.fields]
    lowered = [n.lower() for n in names]
    if len(set(lowered)) != len(lowered):
        raise InvalidArgument(f"duplicate column names in the DataFrame to write: {names}")
    if "value" not in names:
        raise InvalidArgument(f"column 'value' (binary or string) is required to write events; "
                              f"the DataFrame has {names}")
    used: list[str] = []
    for f in schema.fields:
        t = f.dataType
        if f.name in IGNORED:
            continue
        if f.name not in ACCEPTED:
            raise InvalidArgument(f"column {f.name!r} is not an event field: accepted columns are "
                                  f"{', '.join(ACCEPTED)} (and {', '.join(IGNORED)}, which are ignored)")
        if f.name == "value":
            ok = isinstance(t, (BinaryType, StringType))
            want = "binary or string"
        elif f.name == "headers":
            ok = (isinstance(t, MapType) and isinstance(t.keyType, StringType)
                  and isinstance(t.valueType, StringType))
            want = "map<string,string>"
        elif f.name == "partition":
            ok = isinstance(t, (IntegerType, LongType, ShortType, ByteType))
            want = "an integer type"
        else:
            ok = isinstance(t, StringType)
            want = "string"
        if not ok:
            raise InvalidArgument(f"column {f.name!r} must be {want}, not {t.simpleString()}")
        used.append(f.name)
    return used


@dataclass
class TaskCommit(WriterCommitMessage):
    """What one write task did: ``events`` rows received, ``stored`` events published (fewer when
    ``event_id`` duplicates were dropped), ``replayed`` when the task had already been committed."""

    sink_id: str
    batch_id: int
    task_partition: int
    events: int
    stored: int
    replayed: bool


def _select(batch: pa.RecordBatch, used: list[str]) -> pa.RecordBatch:
    names = [n for n in batch.schema.names if n in used]
    return batch.select(names) if len(names) != batch.num_columns else batch


def check_sizes(batch: pa.RecordBatch, meta: TopicRecord, offset: int) -> None:
    """Raise :class:`MessageTooLarge` for the first row of ``batch`` (the task's ``offset``-th row first)
    larger than the topic's ``max.message.bytes``: the task's transaction then rolls back, storing nothing."""
    limit = int(meta.config.get(MAX_MESSAGE_BYTES, TOPIC_CONFIG_DEFAULTS[MAX_MESSAGE_BYTES]))
    sizes = event_sizes(batch)
    over = np.flatnonzero(sizes > limit)
    if len(over):
        i = int(over[0])
        raise MessageTooLarge(f"row {offset + i} of the task: an event of {int(sizes[i])} bytes exceeds "
                              f"max.message.bytes ({limit}) of topic {meta.name!r}; the task stored nothing")


def check_keys(batch: pa.RecordBatch, meta: TopicRecord, offset: int) -> None:
    """Raise :class:`KeyRequired` for the first row of ``batch`` without a key when the topic is compacted:
    the task's transaction then rolls back, storing nothing."""
    if not compacts(meta.config):
        return
    idx = batch.schema.get_field_index("key")
    if idx < 0:
        raise KeyRequired(f"topic {meta.name!r} is compacted: every event needs a key, and the DataFrame has "
                          "no column 'key'; the task stored nothing")
    keys = batch.column(idx)
    if keys.null_count:
        row = int(np.flatnonzero(keys.is_null().to_numpy(zero_copy_only=False))[0])
        raise KeyRequired(f"row {offset + row} of the task has no key, and topic {meta.name!r} is compacted: "
                          "every event needs a key; the task stored nothing")


def write_task(opts: WriteOptions, meta: TopicRecord, used: list[str], sink_id: str, batch_id: int,
               task_partition: int, batches: Iterator[pa.RecordBatch]) -> TaskCommit:
    """Publish the rows of one task in one transaction, once per ``(sink_id, batch_id, task_partition)``.

    The transaction registers as a publisher of the partitions it writes to (the read fence, see
    :meth:`pgstreams.storage.EventStore.join_fence`) once it has claimed the task, before its rows draw
    positions: readers hold those partitions back until it ends.

    Both connections are this process's reused ones (:func:`_db.reused`): the next micro-batch's task in
    this Python worker does not pay for new sessions. Segments for the next rows are added before each
    batch on the second, autocommit, connection (``side``),
    so the task's transaction holds no lock on new segments; once committed, the segments the rows went
    to get column statistics if they have none yet (as every writer does, see
    :class:`pgstreams.storage.Segments`).
    """
    has_ids = "event_id" in used
    storage = _db.store(opts.schema, opts.pooler)
    ex, events_store = storage.executor, storage.events
    segments = Segments(meta.id, meta.segment_size, covered=meta.segments_end)
    wait = _db.RUNTIME_CONNECT_WAIT
    with _db.reused(opts.dsn, wait, opts.pooler) as conn, _db.reused(opts.dsn, wait, opts.pooler) as side:
        first = -1  # the last position handed out before the task's first row: every row comes after it
        with conn.transaction():
            cur = conn.cursor()
            if not storage.sinks.claim(conn, sink_id, batch_id, task_partition, meta.id):
                for _ in batches:
                    pass
                return TaskCommit(sink_id, batch_id, task_partition, 0, 0, True)
            partitioner = Partitioner(meta.partitions, random.randrange(meta.partitions))
            if has_ids:
                # the rows draw their positions in insert_staged, which registers them as publishers
                events_store.create_staging(conn)
                copy_stmt = ex.query("copy_staging")
            else:
                # the rows draw their positions as the COPY stores them, in any partition: register the
                # transaction as a publisher of every partition first (readers hold them back until it ends)
                events_store.join_fence(conn, meta.id, range(meta.partitions))
                copy_stmt = topic_query("copy_events", opts.schema, meta.id)
            events = 0
            with cur.copy(copy_stmt) as cp:
                for batch in batches:
                    n = batch.num_rows
                    if n == 0:
                        continue
                    check_sizes(batch, meta, events)
                    check_keys(batch, meta, events)
                    payload = encode_copy(_select(batch, used), partitioner,
                                          ordinal=events if has_ids else None)
                    last = segments.ensure_room_after(ex, n, side)
                    if first < 0:
                        first = last
                    cp.write(payload)
                    events += n
            stored = events
            if has_ids and events:
                stored = events_store.insert_staged(conn, meta.id)
            storage.sinks.record(conn, sink_id, batch_id, task_partition, events, stored)
            if stored:
                events_store.notify(conn, notification_channel(opts.schema), str(meta.id))
        if stored:
            # the rows hold positions above first, the last one at least first + events (other writers'
            # rows may lie in between): the segments of that range are the ones this task filled
            segments.check_stats_between(ex, first + 1, first + events, side)
    return TaskCommit(sink_id, batch_id, task_partition, events, stored, False)


def task_identity() -> tuple[int, str | None, str | None]:
    """The running Spark task's partition id, streaming query id and micro-batch id (``None`` for a batch
    write); raises :class:`RuntimeError` outside a Spark task."""
    ctx = TaskContext.get()
    if ctx is None:  # pragma: no cover - always set inside a Spark task
        raise RuntimeError("pgstreams.spark writers run inside Spark tasks only")
    return (ctx.partitionId(), ctx.getLocalProperty("sql.streaming.queryId"),
            ctx.getLocalProperty("streaming.sql.batchId"))


def _forget(opts: WriteOptions, sink_id: str, before_batch: int | None = None) -> None:
    """Drop a sink's task rows: all of them, or those of batches before ``before_batch``."""
    sinks = _db.store(opts.schema).sinks
    with _db.connect(opts.dsn, _db.RUNTIME_CONNECT_WAIT, opts.pooler) as conn:
        if before_batch is None:
            sinks.forget(conn, sink_id)
        else:
            sinks.forget_before(conn, sink_id, before_batch)


class BatchWriter(DataSourceArrowWriter):
    """The writer of ``df.write.format("pgstreams")``: each task publishes its rows atomically, and a
    retried task publishes nothing twice. A job that fails keeps the events of the tasks that finished."""

    def __init__(self, opts: WriteOptions, meta: TopicRecord, used: list[str]) -> None:
        self.opts = opts
        self.meta = meta
        self.used = used
        self.job_id = f"write-{uuid.uuid4()}"

    def write(self, iterator: Iterator[pa.RecordBatch]) -> TaskCommit:
        """Publish one task's rows."""
        part, _, _ = task_identity()
        return write_task(self.opts, self.meta, self.used, self.job_id, 0, part, iterator)

    def commit(self, messages: list[WriterCommitMessage | None]) -> None:
        """Every task succeeded: drop the job's bookkeeping rows."""
        _forget(self.opts, self.job_id)

    def abort(self, messages: list[WriterCommitMessage | None]) -> None:
        """A task failed for good: drop the job's bookkeeping rows (finished tasks stay published)."""
        _forget(self.opts, self.job_id)


class StreamWriter(DataSourceStreamArrowWriter):
    """The writer of ``df.writeStream.format("pgstreams")``: exactly-once per micro-batch task."""

    def __init__(self, opts: WriteOptions, meta: TopicRecord, used: list[str]) -> None:
        self.opts = opts
        self.meta = meta
        self.used = used

    def write(self, iterator: Iterator[pa.RecordBatch]) -> TaskCommit:
        """Publish one task's rows of the current micro-batch, once."""
        part, query_id, batch = task_identity()
        if not query_id or batch is None:  # pragma: no cover - Spark always sets both for micro-batches
            raise RuntimeError("the streaming query id and batch id are not set in this task")
        return write_task(self.opts, self.meta, self.used, f"query-{query_id}", int(batch), part, iterator)

    def commit(self, messages: list[WriterCommitMessage | None], batchId: int) -> None:
        """The micro-batch is complete: older batches can never be replayed, forget them."""
        sinks = {m.sink_id for m in messages if isinstance(m, TaskCommit)}
        for sink in sinks:
            _forget(self.opts, sink, batchId)

    def abort(self, messages: list[WriterCommitMessage | None], batchId: int) -> None:
        """Nothing to undo: committed tasks are recorded and will be skipped when the batch runs again."""
