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

import logging
import os
import shutil
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING

from pyspark.sql import functions as F
from pyspark.sql.types import StringType, StructField, StructType

from ._source import SCHEMA_DDL, PgStreamsDataSource, read_schema

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession

__all__ = ["SCHEMA_DDL", "PgStreamsDataSource", "decode_json", "read_schema", "register", "workers_python"]

#: The Spark setting that lets Python data sources take filters over (off by default in Spark 4).
PUSHDOWN_CONF = "spark.sql.python.filterPushdown.enabled"

log = logging.getLogger(__name__)


def register(spark: SparkSession, *, min_partitions: int | None = None) -> type[PgStreamsDataSource]:
    """Register ``format("pgstreams")`` in ``spark`` and return the registered class.

    Also turns on ``spark.sql.python.filterPushdown.enabled`` (Spark refuses to plan a Python data
    source that implements filter pushdown while it is off). ``min_partitions`` is the default of
    the ``minPartitions`` reading option; by default the session's ``defaultParallelism``, so that a
    batch read keeps every core busy. The source's Python processes run an interpreter that can import
    pgstreams (see :func:`workers_python`). Calling it again is harmless.
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
    # the data source's Python processes run the interpreter the context names when it is registered
    with workers_python(spark):
        spark.dataSource.register(source)
    return source


@contextmanager
def workers_python(spark: SparkSession) -> Iterator[str | None]:
    """While registering: the interpreter the data source's Python processes (planning, reading,
    writing) will run, set on the session's context; yields it (``None``: left to Spark).

    Spark starts them with the context's ``pythonExec`` (``$PYSPARK_PYTHON``, ``spark.pyspark.python``,
    else ``python3`` on the ``PATH``): often not the interpreter pgstreams is installed in (a virtual
    environment not activated). With a local master, when that interpreter cannot import
    ``pgstreams.spark``, the data source runs this process's interpreter instead (the context is put back
    after, so the application's own UDFs keep theirs), with a warning. With another master the workers'
    interpreter is on other machines: it is left as configured."""
    try:
        sc = spark.sparkContext
        configured = sc.pythonExec
        local = str(sc.master).startswith("local")
    except Exception:  # noqa: BLE001 - Spark Connect sessions have no SparkContext
        yield None
        return
    chosen = configured
    if local and configured and not _same_interpreter(configured) and not _imports_pgstreams(configured):
        chosen = sys.executable
        log.warning("Spark's Python workers run %s, which cannot import pgstreams: the pgstreams data source "
                    "runs %s instead (set PYSPARK_PYTHON to the interpreter pgstreams is installed in)",
                    configured, chosen)
    sc.pythonExec = chosen
    try:
        yield chosen
    finally:
        sc.pythonExec = configured


def _same_interpreter(exe: str) -> bool:
    found = shutil.which(exe)
    return found is not None and os.path.abspath(found) == os.path.abspath(sys.executable)


def _imports_pgstreams(exe: str) -> bool:
    """Whether the interpreter ``exe`` (a path, or a name on the ``PATH``) can import ``pgstreams.spark``."""
    try:
        done = subprocess.run([exe, "-c", "import pgstreams.spark"], capture_output=True, timeout=120)
    except (OSError, subprocess.TimeoutExpired):
        return False
    return done.returncode == 0


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
