"""The clean pipeline (Spark Structured Streaming): raw topic -> clean topic + quarantine topic.

Per record: parse the JSON text; check the event type, the required fields, field values and the
timestamp (which must carry ``Z`` or an offset; Chicago-clock offsets are normalised to UTC, timestamps
without a zone are rejected rather than guessed); the first failing check is the record's quarantine
reason (:data:`pgstreams_ml.events.REASONS`). Valid events are written to the clean topic in a normalised
form (UTC ``ts``, typed fields, ``event_id`` and ``event_type`` columns set); rejected records go to the
quarantine topic with the reason, a detail, the raw text and the raw record's coordinates and headers.

The query keeps no state: duplicates are dropped by the clean topic itself, which stores each ``event_id``
once (idempotent publishing), so a duplicate is found however late it comes, and each micro-batch is one
stage with no shuffle and no state store to commit. Exactly once end to end: the query's offsets live in
its checkpoint; a micro-batch that Spark replays after a failure recomputes the same rows, and both
outputs are written with deterministic event ids (the event's own id; ``q:<topic>:<partition>:<position>``
of the raw record), which the topics store only once.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Iterator, Mapping
from typing import TYPE_CHECKING, Any

import psycopg

import pgstreams

from . import _sql, events
from .domain import DEVICES, SLOTS
from .sparkutil import executor_client, read_stream, trigger_kwargs

if TYPE_CHECKING:
    from pyspark.sql import Column, DataFrame, Row, SparkSession
    from pyspark.sql.streaming import StreamingQuery

    from .config import Topology

#: JSON options that render timestamps as UTC ISO 8601 with microseconds.
JSON_TS_OPTIONS = {"timestampFormat": "yyyy-MM-dd'T'HH:mm:ss.SSSSSSXXX", "timeZone": "UTC"}


def raw_json_schema() -> str:
    """DDL of the lenient parse: every field as a string, plus the corrupt-record column."""
    return ", ".join(f"{f} STRING" for f in events.RAW_FIELDS) + ", _corrupt_record STRING"


def _blank(c: Column) -> Column:
    from pyspark.sql import functions as F

    return c.isNull() | (F.trim(c) == "")


def parse_raw(raw: DataFrame) -> DataFrame:
    """Validate raw records. ``raw`` has the ``pgstreams`` source's columns (``topic``, ``partition``,
    ``position``, ``value``, ``headers``, ``created_at``, ...). Returns one row per record with the typed
    fields, ``reason`` (``None`` when valid) and ``detail``."""
    from pyspark.sql import functions as F

    text = F.col("value").cast("string")
    j = F.from_json(
        text, raw_json_schema(), {"columnNameOfCorruptRecord": "_corrupt_record", "mode": "PERMISSIVE"}
    )
    df = raw.select(
        F.col("topic").alias("raw_topic"),
        F.col("partition").alias("raw_partition"),
        F.col("position").alias("raw_position"),
        F.col("created_at").alias("raw_created_at"),
        F.col("headers").alias("raw_headers"),
        text.alias("raw_text"),
        j.alias("j"),
    )
    etype = F.col("j.type")
    invalid_json = F.col("j").isNull() | F.col("j._corrupt_record").isNotNull()
    unknown_type = ~F.coalesce(etype.isin(*events.EVENT_TYPES), F.lit(False))
    missing_names = F.concat_ws(
        ",",
        *[
            F.when(
                etype.isin(*[t for t, req in events.REQUIRED.items() if f in req]) & _blank(F.col(f"j.{f}")),
                F.lit(f),
            )
            for f in events.RAW_FIELDS
            if f != "type"
        ],
    )
    slot = F.col("j.slot").try_cast("int")
    value = F.col("j.value").try_cast("double")
    bad_fields = F.concat_ws(
        ",",
        F.when((etype == "impression") & (slot.isNull() | ~slot.isin(*SLOTS)), F.lit("slot")),
        F.when((etype == "impression") & ~F.col("j.device").isin(*DEVICES), F.lit("device")),
        F.when((etype == "conversion") & (value.isNull() | (value < 0)), F.lit("value")),
    )
    ts_text = F.col("j.ts")
    naive = ts_text.rlike(events.NAIVE_TS_RE)
    ts = F.try_to_timestamp(ts_text, F.lit(events.SPARK_TS_PATTERN))
    reason = (
        F.when(invalid_json, F.lit(events.INVALID_JSON))
        .when(unknown_type, F.lit(events.UNKNOWN_EVENT_TYPE))
        .when(missing_names != "", F.lit(events.MISSING_FIELD))
        .when(bad_fields != "", F.lit(events.INVALID_FIELD))
        .when(naive, F.lit(events.TIMESTAMP_WITHOUT_ZONE))
        .when(ts.isNull(), F.lit(events.INVALID_TIMESTAMP))
    )
    detail = (
        F.when(invalid_json, F.lit("value is not a JSON object"))
        .when(unknown_type, F.concat(F.lit("type "), F.coalesce(F.to_json(F.array(etype)), F.lit("null"))))
        .when(missing_names != "", F.concat(F.lit("missing "), missing_names))
        .when(bad_fields != "", F.concat(F.lit("invalid "), bad_fields))
        .when(naive | ts.isNull(), F.concat(F.lit("ts "), F.coalesce(ts_text, F.lit("null"))))
    )
    return df.select(
        "raw_topic",
        "raw_partition",
        "raw_position",
        "raw_created_at",
        "raw_headers",
        "raw_text",
        F.col("j.event_id").alias("event_id"),
        etype.alias("type"),
        ts.alias("ts"),
        F.col("j.user_id").alias("user_id"),
        F.col("j.ad_id").alias("ad_id"),
        F.col("j.impression_id").alias("impression_id"),
        slot.alias("slot"),
        F.col("j.device").alias("device"),
        value.alias("value"),
        reason.alias("reason"),
        detail.alias("detail"),
    )


def dedup_key() -> Column:
    """The de-duplication key: the event id of a valid event; the raw record's own coordinates otherwise (a
    rejected record is never a duplicate)."""
    from pyspark.sql import functions as F

    return F.when(F.col("reason").isNull(), F.col("event_id")).otherwise(
        F.concat(
            F.lit("raw:"),
            F.col("raw_partition").cast("string"),
            F.lit(":"),
            F.col("raw_position").cast("string"),
        )
    )


def deduplicate(parsed: DataFrame, window: str = "10 minutes") -> DataFrame:
    """Drop valid events whose ``event_id`` was already seen within ``window`` (default 10 minutes) of ingest
    time (the log's ``created_at``), keeping the first. On a batch DataFrame: plain ``dropDuplicates``.
    (The clean query does not use it: the clean topic's idempotent event ids drop duplicates.)"""
    keyed = parsed.withColumn("dedup_key", dedup_key())
    if not parsed.isStreaming:
        return keyed.dropDuplicates(["dedup_key"]).drop("dedup_key")
    return (
        keyed.withWatermark("raw_created_at", window)
        .dropDuplicatesWithinWatermark(["dedup_key"])
        .drop("dedup_key")
    )


#: The columns of an output row, in order (the event fields the topics take).
OUTPUT_FIELDS = ("value", "key", "headers", "event_type", "event_id")


def _clean_fields() -> list[Column]:
    """:data:`OUTPUT_FIELDS` of a valid row: the normalised event as JSON, keyed by user (the impression
    for events without one), the raw coordinates as headers, the event's own type and id."""
    from pyspark.sql import functions as F

    body = F.struct("event_id", "type", "ts", "user_id", "ad_id", "impression_id", "slot", "device", "value")
    return [
        F.to_json(body, JSON_TS_OPTIONS),
        F.coalesce(F.col("user_id"), F.col("impression_id")),
        F.create_map(
            F.lit("raw_partition"),
            F.col("raw_partition").cast("string"),
            F.lit("raw_position"),
            F.col("raw_position").cast("string"),
        ),
        F.col("type"),
        F.col("event_id"),
    ]


def _quarantine_fields() -> list[Column]:
    """:data:`OUTPUT_FIELDS` of a rejected row: ``reason``, ``detail``, the raw text and coordinates as
    JSON, no key, the raw headers plus ``reason``, the reason as event type, ``q:<topic>:<partition>:
    <position>`` as event id."""
    from pyspark.sql import functions as F

    body = F.struct(
        "reason",
        "detail",
        "raw_topic",
        "raw_partition",
        "raw_position",
        "raw_created_at",
        "raw_headers",
        "raw_text",
    )
    raw_headers = F.coalesce(F.col("raw_headers"), F.create_map().cast("map<string,string>"))
    return [
        F.to_json(body, JSON_TS_OPTIONS),
        F.lit(None).cast("string"),
        F.map_concat(
            F.map_filter(raw_headers, lambda k, _v: k != "reason"),
            F.create_map(F.lit("reason"), F.col("reason")),
        ),
        F.col("reason"),
        F.concat(
            F.lit("q:"),
            F.col("raw_topic"),
            F.lit(":"),
            F.col("raw_partition").cast("string"),
            F.lit(":"),
            F.col("raw_position").cast("string"),
        ),
    ]


def clean_rows(parsed: DataFrame) -> DataFrame:
    """The clean topic's rows (``value``, ``key``, ``headers``, ``event_type``, ``event_id``) of the valid
    rows of ``parsed``."""
    from pyspark.sql import functions as F

    ok = parsed.filter(F.col("reason").isNull())
    return ok.select(*[c.alias(n) for c, n in zip(_clean_fields(), OUTPUT_FIELDS, strict=True)])


def quarantine_rows(parsed: DataFrame) -> DataFrame:
    """The quarantine topic's rows of the rejected rows of ``parsed``: the value holds ``reason``,
    ``detail``, the raw text and coordinates; headers are the raw headers plus ``reason``."""
    from pyspark.sql import functions as F

    bad = parsed.filter(F.col("reason").isNotNull())
    return bad.select(*[c.alias(n) for c, n in zip(_quarantine_fields(), OUTPUT_FIELDS, strict=True)])


def output_rows(parsed: DataFrame, topo: Topology) -> DataFrame:
    """Both outputs of ``parsed`` in one projection (one pass over the micro-batch): per row the topic it
    goes to (``out_topic``: the clean topic, or the quarantine topic for a rejected record), its
    ``reason`` (``None`` when clean) and the fields of :func:`clean_rows` or :func:`quarantine_rows`."""
    from pyspark.sql import functions as F

    ok = F.col("reason").isNull()
    return parsed.select(
        F.when(ok, F.lit(topo.clean_topic)).otherwise(F.lit(topo.quarantine_topic)).alias("out_topic"),
        F.col("reason"),
        *[
            F.when(ok, c).otherwise(q).alias(n)
            for c, q, n in zip(_clean_fields(), _quarantine_fields(), OUTPUT_FIELDS, strict=True)
        ],
    )


#: The count of clean rows whose event id the clean topic already held (a duplicate of an event published
#: before, in this micro-batch or an earlier one): not stored.
DUPLICATES = "duplicates"
#: The count of quarantine rows the quarantine topic already held (only a replayed micro-batch has any).
ALREADY_QUARANTINED = "already_quarantined"


def publish_partition(
    dsn: str, pgstreams_schema: str, topo: Topology, rows: Iterable[Row | Mapping[str, Any]]
) -> Iterator[tuple[str, int]]:
    """Publish one task's rows of :func:`output_rows` (runs on an executor): per output topic, one
    ``publish_many`` (one transaction). Rows whose event id the topic already holds are not stored again:
    a duplicate of an event published before (the clean query keeps no state: the clean topic's idempotent
    event ids drop duplicates), or any row of a micro-batch replayed after a failure. Yields ``(name,
    count)``: ``clean`` (events stored in the clean topic), :data:`DUPLICATES` (clean rows not stored),
    each quarantine reason (rows sent to the quarantine topic) and :data:`ALREADY_QUARANTINED` (those
    not stored)."""
    by_topic: dict[str, list[pgstreams.Message]] = {}
    reasons: dict[str, int] = {}
    for r in rows:
        topic = r["out_topic"]
        by_topic.setdefault(topic, []).append(
            pgstreams.Message(
                value=r["value"],
                key=r["key"],
                headers=dict(r["headers"] or {}),
                event_type=r["event_type"],
                event_id=r["event_id"],
            )
        )
        if r["reason"] is not None:
            reasons[r["reason"]] = reasons.get(r["reason"], 0) + 1
    if not by_topic:
        return
    client = executor_client(dsn, pgstreams_schema)
    for topic, msgs in by_topic.items():
        stored = client.publish_many(topic, msgs)
        if topic == topo.clean_topic:
            yield "clean", stored
            yield DUPLICATES, len(msgs) - stored
        elif len(msgs) > stored:
            yield ALREADY_QUARANTINED, len(msgs) - stored
    yield from reasons.items()


def batch_counts(published: Iterable[tuple[str, int]]) -> dict[str, int]:
    """The counts of a clean micro-batch (booked in ``pipeline_batches.rows_out``): the tasks' counts of
    :func:`publish_partition` added up, zeros left out."""
    counts: dict[str, int] = {}
    for name, n in published:
        counts[name] = counts.get(name, 0) + int(n)
    return {k: n for k, n in counts.items() if n}


class CleanBatchWriter:
    """The ``foreachBatch`` function of the clean query (its micro-batches are rows of
    :func:`output_rows`): one Spark job per micro-batch (one stage, no shuffle) publishes both outputs
    from the executors (:func:`publish_partition`), then the batch is booked in ``pipeline_batches`` through
    a connection the writer keeps (on the driver)."""

    def __init__(self, dsn: str, topo: Topology) -> None:
        self.dsn = dsn
        self.topo = topo
        self._conn: psycopg.Connection | None = None

    def __getstate__(self) -> dict[str, Any]:
        state = dict(self.__dict__)
        state["_conn"] = None  # a connection does not travel
        return state

    def _book(self, batch_id: int, counts: dict[str, int]) -> None:
        # rows in: every raw record of the batch (an already quarantined row was counted by its reason)
        rows_in = sum(n for k, n in counts.items() if k != ALREADY_QUARANTINED)
        args = ("clean", batch_id, rows_in, json.dumps(counts))
        for attempt in (1, 2):
            if self._conn is None or self._conn.closed or self._conn.broken:
                self._conn = psycopg.connect(self.dsn, autocommit=True)
            try:
                self._conn.execute(_sql.q("record_batch", self.topo.schema), args)
                return
            except psycopg.OperationalError:
                self._conn.close()
                self._conn = None
                if attempt == 2:
                    raise

    def __call__(self, batch: DataFrame, batch_id: int) -> None:
        """Write one micro-batch of :func:`output_rows` (called by Spark): the query's plan holds the
        projection, so each batch costs the driver a few calls into Spark only."""
        dsn, schema, topo = self.dsn, self.topo.pgstreams_schema, self.topo
        # rows reach the Python workers pickled: ``mapInArrow`` would hand them over as Arrow batches, but
        # PySpark refuses it without pandas, which the application does not need otherwise
        published = batch.rdd.mapPartitions(lambda rows: publish_partition(dsn, schema, topo, rows)).collect()
        self._book(batch_id, batch_counts(published))

    def close(self) -> None:
        """Close the booking connection."""
        if self._conn is not None:
            self._conn.close()
            self._conn = None


def build_clean_query(
    spark: SparkSession,
    dsn: str,
    topo: Topology,
    checkpoint: str,
    *,
    trigger: str = "availableNow",
    max_events_per_trigger: int | None = None,
    query_name: str = "clean",
) -> StreamingQuery:
    """Start the clean query: read ``topo.raw_topic`` as group ``topo.clean_group``, write
    ``topo.clean_topic`` and ``topo.quarantine_topic``. ``checkpoint`` is the query's checkpoint directory;
    ``trigger`` is ``availableNow`` (default), ``once`` or an interval like ``2 seconds``. Stateless: each
    micro-batch is one Spark stage (read, parse, publish) and duplicates are dropped by the clean topic's
    idempotent event ids (:func:`publish_partition`)."""
    raw = read_stream(
        spark,
        dsn,
        topo.raw_topic,
        group=topo.clean_group,
        max_events_per_trigger=max_events_per_trigger,
        pgstreams_schema=topo.pgstreams_schema,
    ).load()
    return (
        output_rows(parse_raw(raw), topo)
        .writeStream.queryName(query_name)
        .option("checkpointLocation", checkpoint)
        .foreachBatch(CleanBatchWriter(dsn, topo))
        .trigger(**trigger_kwargs(trigger))
        .start()
    )
