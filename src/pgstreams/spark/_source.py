"""The ``pgstreams`` PySpark data source."""

from __future__ import annotations

from pyspark.sql.datasource import (
    DataSource,
    DataSourceReader,
    DataSourceStreamReader,
    DataSourceStreamWriter,
    DataSourceWriter,
)
from pyspark.sql.types import StructType

from ..errors import InvalidArgument
from . import _db
from ._batch import BatchReader
from ._options import read_options, write_options
from ._stream import StreamReader
from ._write import BatchWriter, StreamWriter, check_schema

#: The schema of every DataFrame read from topics (``created_at`` is a UTC instant).
SCHEMA_DDL = ("topic string, partition int, position long, key string, value binary, "
              "headers map<string,string>, event_type string, event_id string, correlation_id string, "
              "causation_id string, created_at timestamp")


def read_schema() -> StructType:
    """The read schema as a :class:`StructType` (``value`` is the only non-nullable column)."""
    from pyspark.sql.types import (
        BinaryType,
        IntegerType,
        LongType,
        MapType,
        StringType,
        StructField,
        TimestampType,
    )

    return StructType([
        StructField("topic", StringType(), False),
        StructField("partition", IntegerType(), False),
        StructField("position", LongType(), False),
        StructField("key", StringType(), True),
        StructField("value", BinaryType(), False),
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

    def schema(self) -> StructType:
        """The read schema, after checking the options and that the topics exist."""
        opts = read_options(self.options)
        with _db.connect(opts.dsn) as conn:
            _db.ensure_migrated(conn, opts.schema)
            _db.check_server(conn)
            _db.topics(conn, opts.schema, opts.topics, "topics" if "topics" in self.options else "topic")
        return read_schema()

    def _check_read_schema(self, schema: StructType) -> None:
        if [f.name for f in schema.fields] != [f.name for f in read_schema().fields]:
            raise InvalidArgument("the pgstreams source has a fixed schema (see pgstreams.spark.SCHEMA_DDL); "
                                  "do not call .schema() on the reader, select columns afterwards")

    def reader(self, schema: StructType) -> DataSourceReader:
        """The batch reader."""
        self._check_read_schema(schema)
        opts = read_options(self.options)
        for name in ("maxEventsPerTrigger",):
            if name in self.options:
                raise InvalidArgument(f"option {name!r} applies to streaming reads only")
        return BatchReader(opts, read_schema(), opts.min_partitions or self.default_min_partitions)

    def streamReader(self, schema: StructType) -> DataSourceStreamReader:
        """The stream reader."""
        self._check_read_schema(schema)
        opts = read_options(self.options)
        for name in ("endingOffsets", "endingTimestamp", "minPartitions", "maxRecordsPerPartition"):
            if name in self.options:
                raise InvalidArgument(f"option {name!r} applies to batch reads only")
        return StreamReader(opts, read_schema())

    def _writer_parts(self, schema: StructType, overwrite: bool) -> tuple:
        if overwrite:
            raise InvalidArgument("topics are append-only: write with mode('append')")
        opts = write_options(self.options)
        used = check_schema(schema)
        with _db.connect(opts.dsn) as conn:
            _db.ensure_migrated(conn, opts.schema)
            _db.check_server(conn)
            meta = _db.topics(conn, opts.schema, [opts.topic])[0]
        return opts, meta, used

    def writer(self, schema: StructType, overwrite: bool) -> DataSourceWriter:
        """The batch writer (``mode('append')`` only)."""
        return BatchWriter(*self._writer_parts(schema, overwrite))

    def streamWriter(self, schema: StructType, overwrite: bool) -> DataSourceStreamWriter:
        """The streaming writer (``outputMode('append')`` only)."""
        return StreamWriter(*self._writer_parts(schema, overwrite))
