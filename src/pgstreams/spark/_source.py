"""The ``pgstreams`` PySpark data source."""

from __future__ import annotations

from pyspark.sql.datasource import (
    DataSource,
    DataSourceReader,
    DataSourceStreamReader,
    DataSourceStreamWriter,
    DataSourceWriter,
)
from pyspark.sql.types import (
    BinaryType,
    IntegerType,
    LongType,
    MapType,
    StringType,
    StructField,
    StructType,
    TimestampType,
)

from ..errors import InvalidArgument
from ..storage import TopicRecord
from . import _cluster, _db
from ._batch import BatchReader
from ._options import WriteOptions, read_options, write_options
from ._stream import StreamReader
from ._write import BatchWriter, StreamWriter, check_schema

#: The schema of every DataFrame read from topics (``created_at`` is a UTC instant).
SCHEMA_DDL = ("topic string, partition int, position long, key string, value binary, "
              "headers map<string,string>, event_type string, event_id string, correlation_id string, "
              "causation_id string, created_at timestamp")


def read_schema() -> StructType:
    """The read schema as a :class:`StructType` (``value`` is NULL for a tombstone: an event with a key
    and no value)."""
    return StructType([
        StructField("topic", StringType(), False),
        StructField("partition", IntegerType(), False),
        StructField("position", LongType(), False),
        StructField("key", StringType(), True),
        StructField("value", BinaryType(), True),  # NULL: a tombstone
        StructField("headers", MapType(StringType(), StringType()), True),
        StructField("event_type", StringType(), True),
        StructField("event_id", StringType(), True),
        StructField("correlation_id", StringType(), True),
        StructField("causation_id", StringType(), True),
        StructField("created_at", TimestampType(), False),
    ])


class PgStreamsDataSource(DataSource):
    """``format("pgstreams")``: batch and streaming reads of topics, batch and streaming writes.

    Options are documented in ``docs/spark.md``; register with :func:`pgstreams.spark.register`.
    """

    #: Default for option ``minPartitions`` (set by :func:`pgstreams.spark.register` to the session's
    #: default parallelism, so that every core gets work).
    default_min_partitions: int = 1

    @classmethod
    def name(cls) -> str:
        """The format name: ``pgstreams``."""
        return "pgstreams"

    def _dsns(self, dsn: str) -> list[str]:
        """The shards' DSNs of option ``dsn`` (one for a single server)."""
        return _cluster.shard_dsns(dsn)

    def _schema_of(self, dsn: str) -> StructType:
        return read_schema() if len(self._dsns(dsn)) == 1 else _cluster.cluster_schema(read_schema())

    def schema(self) -> StructType:
        """The read schema, after checking the options and that the topics exist (over a cluster of
        shards: the layout too, and the rows carry a ``shard`` column)."""
        opts = read_options(self.options)
        dsns = self._dsns(opts.dsn)
        if len(dsns) > 1:
            _cluster.check_cluster(dsns, opts.schema, opts.pooler)
        for dsn in dsns:
            with _db.connect(dsn, pooler=opts.pooler) as conn:
                _db.ensure_migrated(conn, opts.schema)
                _db.check_server(conn)
                _db.topics(conn, opts.schema, opts.topics, "topics" if "topics" in self.options else "topic")
        return self._schema_of(opts.dsn)

    def _check_read_schema(self, schema: StructType) -> None:
        expected = self._schema_of(read_options(self.options).dsn)
        if [f.name for f in schema.fields] != [f.name for f in expected.fields]:
            raise InvalidArgument("the pgstreams source has a fixed schema (see pgstreams.spark.SCHEMA_DDL); "
                                  "do not call .schema() on the reader, select columns afterwards")

    def reader(self, schema: StructType) -> DataSourceReader:
        """The batch reader."""
        self._check_read_schema(schema)
        opts = read_options(self.options)
        for name in ("maxEventsPerTrigger",):
            if name in self.options:
                raise InvalidArgument(f"option {name!r} applies to streaming reads only")
        dsns = self._dsns(opts.dsn)
        if len(dsns) > 1:
            each = max(1, self.default_min_partitions // len(dsns))
            return _cluster.ClusterBatchReader([BatchReader(o, read_schema(), o.min_partitions or each)
                                                for o in _cluster.shard_readers(opts, dsns)])
        return BatchReader(opts, read_schema(), opts.min_partitions or self.default_min_partitions)

    def streamReader(self, schema: StructType) -> DataSourceStreamReader:
        """The stream reader."""
        self._check_read_schema(schema)
        opts = read_options(self.options)
        for name in ("endingOffsets", "endingTimestamp", "minPartitions", "maxRecordsPerPartition"):
            if name in self.options:
                raise InvalidArgument(f"option {name!r} applies to batch reads only")
        dsns = self._dsns(opts.dsn)
        if len(dsns) > 1:
            return _cluster.ClusterStreamReader([StreamReader(o, read_schema())
                                                 for o in _cluster.shard_readers(opts, dsns)])
        return StreamReader(opts, read_schema())

    def _writer_parts(self, schema: StructType, overwrite: bool) -> tuple:
        if overwrite:
            raise InvalidArgument("topics are append-only: write with mode('append')")
        opts = write_options(self.options)
        used = check_schema(schema)
        with _db.connect(opts.dsn, pooler=opts.pooler) as conn:
            _db.ensure_migrated(conn, opts.schema)
            _db.check_server(conn)
            meta = _db.topics(conn, opts.schema, [opts.topic])[0]
        return opts, meta, used

    def _cluster_parts(self, schema: StructType, overwrite: bool
                       ) -> tuple[list[tuple[WriteOptions, TopicRecord, list[str]]], int] | None:
        """Over a cluster: each shard's writer arguments (of the topic's span) and the span."""
        if overwrite:
            raise InvalidArgument("topics are append-only: write with mode('append')")
        opts = write_options(self.options)
        dsns = self._dsns(opts.dsn)
        if len(dsns) == 1:
            return None
        used = check_schema(schema)
        _cluster.check_cluster(dsns, opts.schema, opts.pooler)
        metas, span = _cluster.topic_span(dsns, opts.schema, opts.topic, opts.pooler)
        return [(o, m, used) for o, m in zip(_cluster.writer_options(opts, dsns), metas, strict=False)], span

    def writer(self, schema: StructType, overwrite: bool) -> DataSourceWriter:
        """The batch writer (``mode('append')`` only); over a cluster, rows go to their keys' shards."""
        cluster = self._cluster_parts(schema, overwrite)
        if cluster is not None:
            parts, span = cluster
            return _cluster.ClusterBatchWriter([BatchWriter(*p) for p in parts], parts[0][1], span)
        return BatchWriter(*self._writer_parts(schema, overwrite))

    def streamWriter(self, schema: StructType, overwrite: bool) -> DataSourceStreamWriter:
        """The streaming writer (``outputMode('append')`` only); over a cluster, by key as :meth:`writer`."""
        cluster = self._cluster_parts(schema, overwrite)
        if cluster is not None:
            parts, span = cluster
            return _cluster.ClusterStreamWriter([StreamWriter(*p) for p in parts], parts[0][1], span)
        return StreamWriter(*self._writer_parts(schema, overwrite))
