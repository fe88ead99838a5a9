"""The data source over a cluster of shards (option ``dsn`` holding several DSNs, see docs/shards.md).

Each shard is read and written by the single-server readers and writers, one per shard, on its own DSN:
a batch read plans every shard's input partitions (one Spark partition per (shard, partition) at least)
and tags each partition with its shard; a stream's offset holds each shard's offset
(``{"shards": [offset of shard 0, offset of shard 1, ...]}``), each advanced below its own shard's read
fences; the writer routes each row by its key (:func:`pgstreams.cluster.shard_for_key`; rows without
a key are spread over the shards) and writes each shard's rows with that shard's exactly-once writer.
Rows read from a cluster carry a ``shard`` column.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import pyarrow as pa
from pyspark.sql.datasource import (
    DataSourceArrowWriter,
    DataSourceReader,
    DataSourceStreamArrowWriter,
    DataSourceStreamReader,
    Filter,
    InputPartition,
    WriterCommitMessage,
)
from pyspark.sql.streaming.datasource import ReadLimit, SupportsTriggerAvailableNow
from pyspark.sql.types import IntegerType, StructField, StructType

from ..cluster.client import shard_for_key
from ..cluster.layout import check_layout, split_dsns
from ..errors import InvalidArgument, TopicConflict, TopicNotFound
from ..pooler import DEFAULT_POOLER, Pooler
from ..storage import Store, TopicRecord
from . import _db
from ._batch import BatchReader
from ._options import ReadOptions, WriteOptions
from ._stream import StreamReader
from ._write import BatchWriter, StreamWriter, task_identity

#: The column that rows read from a cluster carry: the shard holding the event.
SHARD_COLUMN = "shard"


def shard_dsns(dsn: str) -> list[str]:
    """The DSNs of option ``dsn`` as resolved (several separated by commas: a cluster's shards, in order;
    an empty conninfo, libpq's environment, is one server)."""
    return split_dsns(dsn) or [dsn]


def cluster_schema(schema: StructType) -> StructType:
    """The read schema of a cluster: the single-server one and ``shard``."""
    return StructType([*schema.fields, StructField(SHARD_COLUMN, IntegerType(), False)])


def check_cluster(dsns: Sequence[str], schema: str, pooler: Pooler = DEFAULT_POOLER) -> None:
    """The layout check of :func:`pgstreams.connect` (``LayoutMismatch`` naming a difference)."""
    store = Store(None, schema)
    layouts = []
    for dsn in dsns:
        with _db.connect(dsn, pooler=pooler) as conn:
            _db.ensure_migrated(conn, schema)
            layouts.append(store.cluster.layout(conn))
    check_layout(dsns, layouts)


_SHARD_FIELD = pa.field(SHARD_COLUMN, pa.int32(), nullable=False)


def _tag(batch: pa.RecordBatch, shard: int) -> pa.RecordBatch:
    return batch.append_column(_SHARD_FIELD, pa.array(np.full(batch.num_rows, shard, dtype=np.int32)))


@dataclass
class ShardPartition(InputPartition):
    """A Spark input partition of one shard: the shard's place and its reader's input partition."""

    shard: int
    inner: InputPartition


class ClusterBatchReader(DataSourceReader):
    """``spark.read`` over a cluster: every shard's input partitions, read by that shard's reader."""

    def __init__(self, readers: Sequence[BatchReader]) -> None:
        self.readers = list(readers)

    def pushFilters(self, filters: list[Filter]) -> Any:
        """Push the filters to every shard's reader (they are the same; the rest is returned once)."""
        left: list[Filter] = list(filters)
        for reader in self.readers:
            left = list(reader.pushFilters(list(filters)))
        return iter(left)

    def partitions(self) -> list[InputPartition]:
        """Every shard's input partitions, tagged with the shard."""
        return [ShardPartition(i, p) for i, r in enumerate(self.readers) for p in r.partitions()]

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        """Read one shard's input partition; its rows get the ``shard`` column."""
        assert isinstance(partition, ShardPartition)
        for batch in self.readers[partition.shard].read(partition.inner):
            yield _tag(batch, partition.shard)


def _shard_offsets(data: Any, shards: int) -> list[dict]:
    if not isinstance(data, dict) or not isinstance(data.get("shards"), list):
        raise InvalidArgument(f"this stream reads a cluster of {shards} shards, but its offset {data!r} is "
                              "not one of a cluster: start the query with a new checkpoint location")
    offsets = data["shards"]
    if len(offsets) != shards:
        raise InvalidArgument(f"this stream's offset holds {len(offsets)} shards, the cluster has {shards}")
    return offsets


class ClusterStreamReader(DataSourceStreamReader, SupportsTriggerAvailableNow):
    """``spark.readStream`` over a cluster: one stream reader per shard; an offset holds every shard's."""

    def __init__(self, readers: Sequence[StreamReader]) -> None:
        self.readers = list(readers)

    def initialOffset(self) -> dict:
        """Every shard's initial offset."""
        return {"shards": [r.initialOffset() for r in self.readers]}

    def getDefaultReadLimit(self) -> ReadLimit:
        """The read limit of option ``maxEventsPerTrigger`` (applied to each shard)."""
        return self.readers[0].getDefaultReadLimit()

    def prepareForTriggerAvailableNow(self) -> None:
        """Every shard's ``availableNow`` target."""
        for r in self.readers:
            r.prepareForTriggerAvailableNow()

    def reportLatestOffset(self) -> dict | None:
        """Every shard's latest offset (``None`` until each knows one)."""
        latest = [r.reportLatestOffset() for r in self.readers]
        return None if any(x is None for x in latest) else {"shards": latest}

    def latestOffset(self, start: dict, limit: ReadLimit) -> dict:
        """Each shard's end offset of the next micro-batch, below its own read fences (without waiting for
        new events: option ``maxWaitMs`` applies to streams of one server)."""
        starts = _shard_offsets(start, len(self.readers))
        return {"shards": [r.latest_offset(s, limit, 0.0) for r, s in zip(self.readers, starts, strict=True)]}

    def partitions(self, start: dict, end: dict) -> list[InputPartition]:
        """Every shard's input partitions between its start and end offsets."""
        n = len(self.readers)
        pairs = zip(self.readers, _shard_offsets(start, n), _shard_offsets(end, n), strict=True)
        return [ShardPartition(i, p) for i, (r, s, e) in enumerate(pairs) for p in r.partitions(s, e)]

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        """Read one shard's input partition; its rows get the ``shard`` column."""
        assert isinstance(partition, ShardPartition)
        for batch in self.readers[partition.shard].read(partition.inner):
            yield _tag(batch, partition.shard)

    def commit(self, end: dict) -> None:
        """Every shard's reader commits its part (a ``group`` option mirrors checkpoints on each shard)."""
        for r, e in zip(self.readers, _shard_offsets(end, len(self.readers)), strict=True):
            r.commit(e)

    def stop(self) -> None:
        """Close every shard's reader."""
        for r in self.readers:
            r.stop()


def shard_readers(opts: ReadOptions, dsns: Sequence[str]) -> list[ReadOptions]:
    """``opts`` for each shard (its DSN; ``minPartitions`` shared out)."""
    share = None if opts.min_partitions is None else max(1, -(-opts.min_partitions // len(dsns)))
    return [dataclasses.replace(opts, dsn=d, min_partitions=share) for d in dsns]


# -- writing -----------------------------------------------------------------------------------------
@dataclass
class ClusterCommit(WriterCommitMessage):
    """What one write task did on each shard (``None`` for a shard it wrote nothing to)."""

    parts: tuple[WriterCommitMessage | None, ...]


def split_by_shard(batch: pa.RecordBatch, partitions: int, span: int, offset: int) -> list[pa.RecordBatch]:
    """``batch``'s rows per shard: by key (:func:`shard_for_key`), rows without one spread over the shards
    in turn from ``offset``."""
    n = batch.num_rows
    shards = (np.arange(offset, offset + n) % span).astype(np.int32)
    if "key" in batch.schema.names:
        for i, k in enumerate(batch.column("key").to_pylist()):
            if k is not None:
                shards[i] = shard_for_key(k, partitions, span)
    return [batch.filter(pa.array(shards == s)) for s in range(span)]


class _Router:
    """Splits a task's rows by shard and writes each shard's part with that shard's writer, in turn."""

    def __init__(self, writers: Sequence[Any], meta: TopicRecord, span: int) -> None:
        self.writers = list(writers)
        self.partitions = meta.partitions
        self.span = span

    def route(self, iterator: Iterator[pa.RecordBatch]) -> list[list[pa.RecordBatch]]:
        per: list[list[pa.RecordBatch]] = [[] for _ in range(self.span)]
        part, _, _ = task_identity()
        offset = part
        for batch in iterator:
            for s, piece in enumerate(split_by_shard(batch, self.partitions, self.span, offset)):
                if piece.num_rows:
                    per[s].append(piece)
            offset += batch.num_rows
        return per

    def write(self, iterator: Iterator[pa.RecordBatch]) -> ClusterCommit:
        per = self.route(iterator)
        return ClusterCommit(tuple(w.write(iter(per[s])) for s, w in enumerate(self.writers)))

    def parts(self, messages: list[WriterCommitMessage | None], shard: int
              ) -> list[WriterCommitMessage | None]:
        return [m.parts[shard] if isinstance(m, ClusterCommit) else None for m in messages]


class ClusterBatchWriter(DataSourceArrowWriter):
    """``df.write`` to a cluster's topic: each task's rows go to their keys' shards, each shard's part
    published once (the single-server writer's exactly-once per task, on each shard)."""

    def __init__(self, writers: Sequence[BatchWriter], meta: TopicRecord, span: int) -> None:
        self.router = _Router(writers, meta, span)

    def write(self, iterator: Iterator[pa.RecordBatch]) -> ClusterCommit:
        """Publish one task's rows on their shards."""
        return self.router.write(iterator)

    def commit(self, messages: list[WriterCommitMessage | None]) -> None:
        """Every task succeeded: each shard's writer drops its bookkeeping."""
        for s, w in enumerate(self.router.writers):
            w.commit(self.router.parts(messages, s))

    def abort(self, messages: list[WriterCommitMessage | None]) -> None:
        """A task failed for good: each shard's writer drops its bookkeeping."""
        for s, w in enumerate(self.router.writers):
            w.abort(self.router.parts(messages, s))


class ClusterStreamWriter(DataSourceStreamArrowWriter):
    """``df.writeStream`` to a cluster's topic: exactly-once per micro-batch task on each shard."""

    def __init__(self, writers: Sequence[StreamWriter], meta: TopicRecord, span: int) -> None:
        self.router = _Router(writers, meta, span)

    def write(self, iterator: Iterator[pa.RecordBatch]) -> ClusterCommit:
        """Publish one task's rows of the micro-batch on their shards, once."""
        return self.router.write(iterator)

    def commit(self, messages: list[WriterCommitMessage | None], batchId: int) -> None:
        """The micro-batch is complete on every shard."""
        for s, w in enumerate(self.router.writers):
            w.commit(self.router.parts(messages, s), batchId)

    def abort(self, messages: list[WriterCommitMessage | None], batchId: int) -> None:
        """Nothing to undo (see :meth:`pgstreams.spark._write.StreamWriter.abort`)."""
        for s, w in enumerate(self.router.writers):
            w.abort(self.router.parts(messages, s), batchId)


def topic_span(dsns: Sequence[str], schema: str, topic: str, pooler: Pooler = DEFAULT_POOLER
               ) -> tuple[list[TopicRecord], int]:
    """The topic's record on each shard of its span, and its span (``TopicConflict`` for a topic created
    without the cluster)."""
    store = Store(None, schema)
    with _db.connect(dsns[0], pooler=pooler) as conn:
        span = store.cluster.span(topic, conn)
    if span is None:
        raise TopicNotFound(f"option 'topic': topic {topic!r} does not exist")
    if span[1] is None:
        raise TopicConflict(f"topic {topic!r} was created on shard 0 without the cluster")
    metas = []
    for dsn in dsns[: span[1]]:
        with _db.connect(dsn, pooler=pooler) as conn:
            metas.append(_db.topics(conn, schema, [topic])[0])
    return metas, span[1]


def writer_options(opts: WriteOptions, dsns: Sequence[str]) -> list[WriteOptions]:
    """``opts`` for each shard."""
    return [dataclasses.replace(opts, dsn=d) for d in dsns]
