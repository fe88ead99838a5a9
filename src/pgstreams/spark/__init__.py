"""pgstreams for Apache Spark: ``format("pgstreams")`` for batch and streaming reads and writes.

Install with ``pip install pgstreams[spark]`` (pyspark >= 4.0, pyarrow, numpy)::

    import pgstreams.spark
    pgstreams.spark.register(spark)
    df = spark.read.format("pgstreams").option("dsn", dsn).option("topic", "clicks").load()

See ``docs/spark.md`` for every option, the offsets format and the exactly-once guarantees.
"""

from __future__ import annotations

try:
    import pyarrow  # noqa: F401
    import pyspark  # noqa: F401
except ImportError as exc:  # pragma: no cover - depends on the installation
    raise ImportError("pgstreams.spark needs pyspark and pyarrow: pip install 'pgstreams[spark]'") from exc

from typing import TYPE_CHECKING

from pyspark.sql import functions as F
from pyspark.sql.types import StringType, StructField, StructType

from ._source import SCHEMA_DDL, PgStreamsDataSource, read_schema

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession

__all__ = ["SCHEMA_DDL", "PgStreamsDataSource", "decode_json", "read_schema", "register"]

#: The Spark setting that lets Python data sources take filters over (off by default in Spark 4).
PUSHDOWN_CONF = "spark.sql.python.filterPushdown.enabled"


def register(spark: SparkSession, *, min_partitions: int | None = None) -> type[PgStreamsDataSource]:
    """Register ``format("pgstreams")`` in ``spark`` and return the registered class.

    Also turns on ``spark.sql.python.filterPushdown.enabled`` (Spark refuses to plan a Python data
    source that implements filter pushdown while it is off). ``min_partitions`` is the default of
    the ``minPartitions`` reading option; by default the session's ``defaultParallelism``, so that a
    batch read keeps every core busy. Calling it again is harmless.
    """
    if min_partitions is None:
        try:
            min_partitions = int(spark.sparkContext.defaultParallelism)
        except Exception:  # noqa: BLE001 - Spark Connect sessions have no SparkContext
            min_partitions = 1
    if isinstance(min_partitions, bool) or not isinstance(min_partitions, int) or min_partitions < 1:
        raise ValueError(f"min_partitions must be a positive integer, got {min_partitions!r}")
    spark.conf.set(PUSHDOWN_CONF, "true")
    # a subclass defined here is shipped by value, carrying the default to the planner processes
    source = type("PgStreamsDataSource", (PgStreamsDataSource,),
                  {"default_min_partitions": min_partitions, "__module__": __name__ + "._registered"})
    spark.dataSource.register(source)
    return source


def decode_json(df: DataFrame, schema: StructType | str, *, column: str = "value",
                into: str | None = None, corrupt_column: str | None = None) -> DataFrame:
    """Parse the JSON in ``column`` (default ``value``, binary or string) with ``schema`` (a
    :class:`StructType` or a DDL string such as ``"user string, ad int, price double"``).

    By default the parsed fields replace ``column`` as top-level columns (the other columns, such as
    ``topic``, ``position`` and ``created_at``, are kept); with ``into``, the parsed struct goes into
    that one column instead and ``column`` is kept. Values that are not valid JSON give NULL fields;
    with ``corrupt_column``, such a value's raw text is put in that (string) column, NULL otherwise.
    Works on batch and streaming DataFrames (it is Spark's ``from_json``, run in the JVM).
    """
    parsed = StructType.fromDDL(schema) if isinstance(schema, str) else schema
    if not isinstance(parsed, StructType):
        raise TypeError(f"schema must be a StructType or a DDL string of fields, not {schema!r}")
    parsed_schema: StructType = parsed
    if column not in df.columns:
        raise ValueError(f"decode_json: the DataFrame has no column {column!r}")
    options: dict[str, str] = {"mode": "PERMISSIVE"}
    if corrupt_column:
        parsed_schema = StructType([*parsed_schema.fields, StructField(corrupt_column, StringType(), True)])
        options["columnNameOfCorruptRecord"] = corrupt_column
    text = F.col(column).cast("string")
    struct = F.from_json(text, parsed_schema, options)
    if into:
        return df.withColumn(into, struct)
    tmp = "__pgstreams_json"
    others = [F.col(c) for c in df.columns if c != column]
    return df.withColumn(tmp, struct).select(*others, f"{tmp}.*")
