"""Spark plumbing shared by the pipelines: the session, topic reads and writes through ``pgstreams.spark``,
and idempotent writes of DataFrames into PostgreSQL tables from the executors."""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Iterable, Sequence
from datetime import datetime, timezone
from typing import TYPE_CHECKING, Any

import psycopg

from pgstreams.spark_daemon import use_compiled_pyspark

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession
    from pyspark.sql.streaming import DataStreamReader


#: Failures of a streaming query that restarting it (from its checkpoint: nothing is lost or repeated) gets
#: past: Spark gives a new Python planner process a fixed few seconds to connect back, which a heavily
#: loaded machine can miss.
TRANSIENT_QUERY_FAILURES = ("Python worker failed to connect back",)
#: How many times a query that failed transiently is restarted.
QUERY_RESTARTS = 5


#: Spark's checkpoint file manager that renames through the Hadoop ``FileSystem`` API. For a local checkpoint
#: folder the default (``FileContext``) one starts a ``stat``/``ls`` process per rename when Hadoop's native
#: library is missing (as in pyspark's own jars): tens of milliseconds of every micro-batch, twice (offset
#: and commit logs). A local file system renames atomically either way.
FILE_SYSTEM_CHECKPOINTS = (
    "org.apache.spark.sql.execution.streaming.checkpointing.FileSystemBasedCheckpointFileManager"
)


def is_local_path(location: str) -> bool:
    """Whether a checkpoint ``location`` is a folder of the local file system (no scheme, or ``file:``)."""
    return "://" not in location or location.startswith("file:")


def checkpoint_conf(location: str) -> dict[str, str]:
    """Session settings for queries checkpointing under ``location``: the ``FileSystem`` checkpoint file
    manager (:data:`FILE_SYSTEM_CHECKPOINTS`) for a local folder, nothing otherwise."""
    if is_local_path(location):
        return {"spark.sql.streaming.checkpointFileManagerClass": FILE_SYSTEM_CHECKPOINTS}
    return {}


def is_transient(exc: Any) -> bool:
    """Whether a streaming query's failure ``exc`` is one a restart gets past
    (:data:`TRANSIENT_QUERY_FAILURES`)."""
    text = str(exc)
    return any(t in text for t in TRANSIENT_QUERY_FAILURES)


def spark_session(
    master: str | None = None,
    app_name: str = "pgstreams-ml",
    shuffle_partitions: int = 4,
    conf: dict[str, str] | None = None,
) -> SparkSession:
    """Get or create a SparkSession for the pipelines and register the ``pgstreams`` data source.

    ``master`` defaults to ``$SPARK_MASTER`` or ``local[2]``. The web UI is off, the session time zone is
    UTC, shuffles use ``shuffle_partitions`` (default 4) partitions, and Python workers run this
    interpreter unless ``PYSPARK_PYTHON`` says otherwise, forked from pgstreams' daemon
    (:mod:`pgstreams.spark_daemon`: pgstreams and psycopg imported once, not by each worker), and with
    a local or standalone master import the installed, compiled PySpark
    (:func:`pgstreams.spark_daemon.use_compiled_pyspark`). A local master keeps the driver on 127.0.0.1
    (``$SPARK_LOCAL_IP``, unless already set). ``conf`` adds settings.
    """
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
    chosen = master or os.environ.get("SPARK_MASTER", "local[2]")
    # Python workers import the installed, compiled PySpark rather than compile it from Spark's archive
    use_compiled_pyspark(chosen)
    if chosen.startswith("local"):
        # a local session talks to itself only; the driver JVM reads this when it starts
        os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    from pyspark.sql import SparkSession

    builder = (
        SparkSession.builder.master(chosen)
        .appName(app_name)
        .config("spark.ui.enabled", "false")
        .config("spark.ui.showConsoleProgress", "false")
        .config("spark.sql.session.timeZone", "UTC")
        .config("spark.sql.shuffle.partitions", str(shuffle_partitions))
        .config("spark.default.parallelism", str(max(2, shuffle_partitions)))
        .config("spark.python.authenticate.socketTimeout", "120s")
        .config("spark.python.daemon.module", "pgstreams.spark_daemon")
        .config("spark.network.timeout", "300s")
        .config("spark.driver.memory", os.environ.get("PGSTREAMS_SPARK_MEMORY", "2g"))
    )
    for k, v in (conf or {}).items():
        builder = builder.config(k, v)
    spark = builder.getOrCreate()
    spark.sparkContext.setLogLevel(os.environ.get("PGSTREAMS_SPARK_LOG_LEVEL", "ERROR"))
    register_source(spark)
    return spark


def register_source(spark: SparkSession) -> bool:
    """Register the ``pgstreams`` Spark data source if :mod:`pgstreams.spark` is installed; return whether it
    is available."""
    try:
        import pgstreams.spark as pss
    except ImportError:
        return False
    reg = getattr(pss, "register", None)
    if reg is None:
        return False
    reg(spark)
    return True


def read_stream(
    spark: SparkSession,
    dsn: str,
    topic: str,
    *,
    group: str | None = None,
    max_events_per_trigger: int | None = None,
    pgstreams_schema: str = "pgstreams",
    starting_offsets: str = "earliest",
) -> DataStreamReader:
    """A ``readStream`` of ``topic`` through the ``pgstreams`` source, from ``starting_offsets`` (default
    earliest) with the query's progress mirrored into ``group``'s checkpoints when given."""
    r = (
        spark.readStream.format("pgstreams")
        .option("dsn", dsn)
        .option("topic", topic)
        .option("startingOffsets", starting_offsets)
    )
    if group:
        r = r.option("group", group)
    if max_events_per_trigger:
        r = r.option("maxEventsPerTrigger", str(int(max_events_per_trigger)))
    if pgstreams_schema != "pgstreams":
        r = r.option("schema", pgstreams_schema)
    return r


def write_topic(df: DataFrame, dsn: str, topic: str, pgstreams_schema: str = "pgstreams") -> None:
    """Append ``df`` (columns ``value`` and optional ``key``, ``headers``, ``event_type``, ``event_id``) to
    ``topic`` with the ``pgstreams`` batch writer. Rows whose ``event_id`` the topic already holds are not
    stored again, so a replayed micro-batch publishes nothing twice."""
    w = df.write.format("pgstreams").option("dsn", dsn).option("topic", topic).mode("append")
    if pgstreams_schema != "pgstreams":
        w = w.option("schema", pgstreams_schema)
    w.save()


def trigger_kwargs(trigger: str) -> dict[str, Any]:
    """``DataStreamWriter.trigger`` arguments for ``"availableNow"``, ``"once"`` or an interval such as
    ``"2 seconds"``."""
    if trigger == "availableNow":
        return {"availableNow": True}
    if trigger == "once":
        return {"once": True}
    return {"processingTime": trigger}


def aware(value: Any) -> Any:
    """``value`` with a naive ``datetime`` (PySpark hands out timestamps as naive local times) made an aware
    UTC datetime; anything else unchanged."""
    if isinstance(value, datetime) and value.tzinfo is None:
        return value.astimezone(timezone.utc)
    return value


def _copy_partition(
    rows: Iterable[Any], dsn: str, stage_sql: str, copy_sql: str, merge_sql: str, columns: Sequence[str]
) -> None:
    batch = [tuple(aware(r[c]) for c in columns) for r in rows]
    if not batch:
        return
    with psycopg.connect(dsn) as conn:
        cur = conn.cursor()
        cur.execute(stage_sql)
        with cur.copy(copy_sql) as cp:
            for t in batch:
                cp.write_row(t)
        cur.execute(merge_sql)
        conn.commit()


def write_table(
    df: DataFrame, dsn: str, schema: str, stage: str, copy: str, merge: str, columns: Sequence[str]
) -> None:
    """Write ``df``'s ``columns`` into PostgreSQL from the executors: each partition COPYs into a temporary
    table (named query ``stage``, then ``copy``) and merges it with the named query ``merge`` (an idempotent
    upsert) in one transaction."""
    # imported here: Spark's Python workers import this module to run _copy_partition, which needs psycopg
    # alone, and pgstreams_ml._sql would add the pgstreams client's import (0.15 to 0.4 s) to every new one
    from . import _sql

    stage_sql = _sql.q(stage, schema).as_string(None)
    copy_sql = _sql.q(copy, schema).as_string(None)
    merge_sql = _sql.q(merge, schema).as_string(None)
    cols = list(columns)
    df.select(*cols).foreachPartition(
        lambda rows: _copy_partition(rows, dsn, stage_sql, copy_sql, merge_sql, cols)
    )


#: Columns of a topic as the ``pgstreams`` source gives them.
TOPIC_DDL = (
    "topic STRING, partition INT, position BIGINT, key STRING, value BINARY, headers MAP<STRING,STRING>, "
    "event_type STRING, event_id STRING, correlation_id STRING, causation_id STRING, created_at TIMESTAMP"
)


def read_topic_local(
    spark: SparkSession, client: Any, topic: str, group: str = "ml-local-reader"
) -> DataFrame:
    """A whole topic as a batch DataFrame with the source's columns, read in this process through the core
    client (group ``group``, rewound first). For small topics: tests, debugging, notebooks."""
    # imported here, as in write_table
    from ._util import read_committed

    rows = []
    for e in read_committed(client, topic, group):
        v = e.value
        if isinstance(v, str):
            v = v.encode()
        elif not isinstance(v, (bytes, bytearray)):
            v = json.dumps(v).encode()
        rows.append(
            (
                e.topic,
                e.partition,
                e.position,
                e.key,
                bytes(v),
                dict(e.headers),
                e.event_type,
                e.event_id,
                e.correlation_id,
                e.causation_id,
                e.created_at,
            )
        )
    return spark.createDataFrame(rows, TOPIC_DDL)


_EXECUTOR_CLIENTS: dict[tuple[str, str], Any] = {}


def executor_client(dsn: str, pgstreams_schema: str = "pgstreams") -> Any:
    """A :class:`pgstreams.Client` for code running in Spark tasks: one per Python worker process, DSN and
    schema, created on first use from the arguments alone (nothing of the driver's process) and kept for
    the worker's later tasks (Spark reuses its Python workers), so a micro-batch does not pay for new
    connections. It does not migrate (the driver did) and pools at most 2 connections."""
    key = (dsn, pgstreams_schema)
    client = _EXECUTOR_CLIENTS.get(key)
    if client is None:
        import pgstreams  # imported here, as in write_table

        client = pgstreams.connect(dsn, schema=pgstreams_schema, migrate=False, pool_size=2)
        _EXECUTOR_CLIENTS[key] = client
    return client
