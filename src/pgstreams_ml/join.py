"""The join pipeline (Spark Structured Streaming): clean topic -> ``training_examples`` table.

Impressions are joined with their clicks (a stream-stream left outer join on ``impression_id`` with the
click inside the attribution window after the impression). Watermarks on both sides bound the state: an
impression without a click is emitted as a negative once the watermark passes the end of its window; a
click later than the watermark allows is dropped (the impression already counted as not clicked). Each
micro-batch is then upserted into ``training_examples`` and enriched point-in-time on the way: for each
impression, the user profile and ad catalogue versions valid at the impression's time, looked up by key in
the enrichment store's history (idempotent per impression, so replayed batches write nothing twice).
"""

from __future__ import annotations

import json
from typing import TYPE_CHECKING

import psycopg

from . import _sql
from .clean import JSON_TS_OPTIONS
from .sparkutil import read_stream, trigger_kwargs, write_table

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession
    from pyspark.sql.streaming import StreamingQuery

    from .config import Topology

#: DDL of a clean event's value.
CLEAN_SCHEMA = (
    "event_id STRING, type STRING, ts TIMESTAMP, user_id STRING, ad_id STRING, impression_id STRING, "
    "slot INT, device STRING, value DOUBLE"
)
#: Columns of the labelled impressions the pipeline writes (the merge adds the enrichment columns).
EXAMPLE_COLUMNS = ("impression_id", "ts", "user_id", "ad_id", "slot", "device", "label", "click_ts")


def parse_clean(df: DataFrame) -> DataFrame:
    """Decode clean-topic rows (column ``value``) into the typed columns of :data:`CLEAN_SCHEMA`."""
    from pyspark.sql import functions as F

    return df.select(
        F.from_json(F.col("value").cast("string"), CLEAN_SCHEMA, JSON_TS_OPTIONS).alias("e")
    ).select("e.*")


def label_impressions(
    events: DataFrame,
    attribution: str = "5 minutes",
    impression_delay: str = "2 minutes",
    click_delay: str = "3 minutes",
) -> DataFrame:
    """Impressions of parsed clean ``events`` with ``label`` 1 if a click on them came within ``attribution``
    (default 5 minutes) after the impression, else 0. On a stream, watermarks allow impressions to be
    ``impression_delay`` (2 minutes) and clicks ``click_delay`` (3 minutes) out of order."""
    from pyspark.sql import functions as F

    imps = events.filter(F.col("type") == "impression").select(
        F.col("event_id").alias("impression_id"),
        "user_id",
        "ad_id",
        "slot",
        "device",
        F.col("ts").alias("imp_ts"),
    )
    clicks = events.filter(F.col("type") == "click").select(
        F.col("impression_id").alias("click_impression_id"), F.col("ts").alias("click_ts")
    )
    if events.isStreaming:
        imps = imps.withWatermark("imp_ts", impression_delay)
        clicks = clicks.withWatermark("click_ts", click_delay)
    cond = F.expr(
        f"click_impression_id = impression_id AND click_ts >= imp_ts AND "
        f"click_ts <= imp_ts + interval {attribution}"
    )
    joined = imps.join(clicks, cond, "leftOuter")
    return joined.select(
        "impression_id",
        F.col("imp_ts").alias("ts"),
        "user_id",
        "ad_id",
        "slot",
        "device",
        F.when(F.col("click_ts").isNotNull(), 1).otherwise(0).alias("label"),
        "click_ts",
    )


def write_examples(labelled: DataFrame, dsn: str, schema: str) -> None:
    """Upsert labelled impressions into ``training_examples``, enriched point-in-time: each executor COPYs its
    rows into a staging table and one statement looks up, by key, the user profile and ad catalogue versions
    valid at each impression's time in the enrichment history (``enriched`` is false when either is missing).
    Idempotent per impression."""
    write_table(labelled, dsn, schema, "stage_examples", "copy_examples", "merge_examples", EXAMPLE_COLUMNS)


class JoinBatchWriter:
    """The ``foreachBatch`` function of the join query: upsert the enriched examples, book the batch."""

    def __init__(self, dsn: str, topo: Topology) -> None:
        self.dsn = dsn
        self.topo = topo

    def __call__(self, batch: DataFrame, batch_id: int) -> None:
        """Write one micro-batch (called by Spark)."""
        from pyspark.sql import functions as F

        batch = batch.persist()
        try:
            stats = batch.agg(F.count("*"), F.sum("label")).collect()[0]
            n = int(stats[0])
            if n:
                write_examples(batch, self.dsn, self.topo.schema)
            out = {"examples": n, "clicks": int(stats[1] or 0)}
            with psycopg.connect(self.dsn, autocommit=True) as conn:
                conn.execute(_sql.q("record_batch", self.topo.schema), ("join", batch_id, n, json.dumps(out)))
        finally:
            batch.unpersist()


def build_join_query(
    spark: SparkSession,
    dsn: str,
    topo: Topology,
    checkpoint: str,
    *,
    trigger: str = "availableNow",
    max_events_per_trigger: int | None = None,
    attribution: str = "5 minutes",
    impression_delay: str = "2 minutes",
    click_delay: str = "3 minutes",
    query_name: str = "join",
) -> StreamingQuery:
    """Start the join query: read ``topo.clean_topic`` as group ``topo.join_group`` and upsert training
    examples. Windows and delays as in :func:`label_impressions`; ``trigger`` as in the clean query."""
    src = read_stream(
        spark,
        dsn,
        topo.clean_topic,
        group=topo.join_group,
        max_events_per_trigger=max_events_per_trigger,
        pgstreams_schema=topo.pgstreams_schema,
    ).load()
    labelled = label_impressions(parse_clean(src), attribution, impression_delay, click_delay)
    return (
        labelled.writeStream.queryName(query_name)
        .option("checkpointLocation", checkpoint)
        .outputMode("append")
        .foreachBatch(JoinBatchWriter(dsn, topo))
        .trigger(**trigger_kwargs(trigger))
        .start()
    )
