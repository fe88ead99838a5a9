"""The Spark data source and operations: ``failOnDataLoss`` for batch reads and streams whose offsets point
at events retention removed, a batch read racing a segment drop, and ``max.message.bytes`` in the writer."""

from __future__ import annotations

import logging
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest
from pyspark.errors import StreamingQueryException
from pyspark.sql import SparkSession

import _spark_helpers
import pgstreams
from pgstreams.spark import _batch
from pgstreams.spark._options import read_options

pytestmark = [pytest.mark.spark]

SEG = 1000  # the smallest segment


@pytest.fixture(scope="module")
def spark() -> Iterator[SparkSession]:
    session = _spark_helpers.session("pgstreams-retention-tests")
    yield session
    for q in session.streams.active:
        q.stop()


def _retained(client: pgstreams.Client, topic: str, events: int) -> int:
    """Publish ``events`` events to ``topic`` (retention.events = SEG), run maintenance; return the oldest
    retained position."""
    client.publish_many(topic, [{"value": i, "key": f"k{i % 7}"} for i in range(events)])
    report = client.maintain()
    assert report.segments_removed >= 1
    oldest = client.retention_status(topic)[0].oldest_position
    assert oldest is not None
    return oldest


def _read(spark: SparkSession, dsn: str, topic: str, **options: str) -> list[Any]:
    r = spark.read.format("pgstreams").option("dsn", dsn).option("topic", topic)
    for k, v in options.items():
        r = r.option(k, v)
    return r.load().select("partition", "position").collect()


def test_batch_read_from_offsets_removed_by_retention_fails_naming_topic_partition_and_range(
    spark: SparkSession, client: pgstreams.Client, dsn: str
) -> None:
    client.create_topic("aged", 1, config={"segment.events": SEG, "retention.events": SEG})
    oldest = _retained(client, "aged", 3 * SEG + 50)
    with pytest.raises(Exception) as info:
        _read(spark, dsn, "aged", startingOffsets='{"aged": {"0": 10}}')
    text = str(info.value)
    assert "DataLoss" in text or "retention removed" in text
    assert "'aged'" in text and "partition 0" in text and f"positions 10 to {oldest - 1}" in text
    assert "failOnDataLoss" in text


def test_batch_read_with_fail_on_data_loss_false_reads_from_the_oldest_retained_event(
    spark: SparkSession, client: pgstreams.Client, dsn: str, caplog: pytest.LogCaptureFixture
) -> None:
    client.create_topic("aged2", 1, config={"segment.events": SEG, "retention.events": SEG})
    oldest = _retained(client, "aged2", 3 * SEG + 50)
    rows = _read(spark, dsn, "aged2", startingOffsets='{"aged2": {"0": 10}}', failOnDataLoss="false")
    positions = sorted(r.position for r in rows)
    assert positions[0] == oldest and positions == list(range(oldest, 3 * SEG + 51))
    # the warning (planning runs in Spark's Python worker: here the same planning in this process)
    options = {"dsn": dsn, "topic": "aged2", "startingOffsets": '{"aged2": {"0": 10}}',
               "failOnDataLoss": "false"}
    with caplog.at_level(logging.WARNING, logger="pgstreams.spark"):
        _batch.BatchReader(read_options(options), pgstreams.spark.read_schema(), 1).partitions()
    assert any("'aged2'" in r.getMessage() and f"positions 10 to {oldest - 1}" in r.getMessage()
               and "failOnDataLoss=false" in r.getMessage() for r in caplog.records)
    # earliest is the oldest retained event: no loss, whatever the option
    assert sorted(r.position for r in _read(spark, dsn, "aged2")) == positions


def test_bad_fail_on_data_loss_value_is_refused_naming_the_option(
    spark: SparkSession, client: pgstreams.Client, dsn: str
) -> None:
    client.create_topic("opt", 1)
    with pytest.raises(Exception, match="failOnDataLoss"):
        _read(spark, dsn, "opt", failOnDataLoss="maybe")


def _stream(spark: SparkSession, dsn: str, topic: str, checkpoint: Path, **options: str) -> list[int]:
    """One ``availableNow`` run of a streaming read of ``topic``; the positions it delivered."""
    got: list[int] = []

    def collect(df: Any, _batch_id: int) -> None:
        got.extend(r.position for r in df.select("position").collect())

    r = spark.readStream.format("pgstreams").option("dsn", dsn).option("topic", topic)
    for k, v in options.items():
        r = r.option(k, v)
    q = (r.load().writeStream.foreachBatch(collect).option("checkpointLocation", str(checkpoint))
         .trigger(availableNow=True).start())
    try:
        q.awaitTermination(120)
    except StreamingQueryException as exc:  # the query failed: its error, as Spark reports it
        raise RuntimeError(str(exc)) from None
    finally:
        q.stop()
    return got


def test_stream_whose_offsets_fall_behind_retention_fails_or_reads_on_with_the_option(
    spark: SparkSession, client: pgstreams.Client, dsn: str, tmp_path: Path
) -> None:
    client.create_topic("flow", 2, config={"segment.events": SEG, "retention.events": SEG})
    client.publish_many("flow", [{"value": i, "key": f"k{i % 7}"} for i in range(100)])
    for name in ("strict", "lenient"):
        assert len(_stream(spark, dsn, "flow", tmp_path / name)) == 100  # offsets now at the first 100
    oldest = _retained(client, "flow", 3 * SEG)
    with pytest.raises(RuntimeError) as info:
        _stream(spark, dsn, "flow", tmp_path / "strict")
    text = str(info.value)
    assert "'flow'" in text and "partition" in text and "retention removed" in text
    assert "failOnDataLoss" in text
    got = _stream(spark, dsn, "flow", tmp_path / "lenient", failOnDataLoss="false")
    assert min(got) == oldest and len(got) == len(set(got))
    with psycopg.connect(dsn) as conn:
        tid = client.topic_record("flow").id
        (count,) = conn.execute(f"SELECT count(*) FROM pgstreams.topic_{tid} WHERE position > 100").fetchone()
    assert len(got) == count  # every retained event after the old offsets, once


def test_a_read_racing_a_segment_drop_reports_data_loss_clearly(
    spark: SparkSession, client: pgstreams.Client, dsn: str
) -> None:
    """The source plans a read, retention then removes a segment the read covers, the read runs: with
    failOnDataLoss it fails with the data-loss message; without, it returns the retained events."""
    client.create_topic("race", 1, config={"segment.events": SEG})
    client.publish_many("race", [{"value": i} for i in range(3 * SEG)])
    client.maintain()  # seals the full segments
    opts = read_options({"dsn": dsn, "topic": "race"})
    reader = _batch.BatchReader(opts, pgstreams.spark.read_schema(), 1)
    planned = reader.partitions()
    client.alter_topic("race", {"retention.events": SEG})
    assert client.maintain().segments_removed >= 1  # removed between planning and reading
    with pytest.raises(pgstreams.DataLoss, match=r"'race'.*while this query read them.*partition 0"):
        for split in planned:
            list(reader.read(split))
    lenient_options = read_options({"dsn": dsn, "topic": "race", "failOnDataLoss": "false"})
    lenient = _batch.BatchReader(lenient_options, pgstreams.spark.read_schema(), 1)
    rows = sum(b.num_rows for split in planned for b in lenient.read(split))
    with psycopg.connect(dsn) as conn:
        tid = client.topic_record("race").id
        (count,) = conn.execute(f"SELECT count(*) FROM pgstreams.topic_{tid}").fetchone()
    assert rows == count and count < 3 * SEG


def test_spark_writer_refuses_events_beyond_max_message_bytes_storing_nothing(
    spark: SparkSession, client: pgstreams.Client, dsn: str
) -> None:
    client.create_topic("tiny", 1, config={"max.message.bytes": 100})
    columns = "key string, value string, headers map<string,string>"
    ok = spark.createDataFrame([("k", "v" * 50, {"h": "x"})], columns)
    big = spark.createDataFrame([("k", "v" * 50, {"h": "x" * 60}), ("k", "v", None)], columns).coalesce(1)
    with pytest.raises(Exception) as info:
        big.write.format("pgstreams").option("dsn", dsn).option("topic", "tiny").mode("append").save()
    assert "max.message.bytes" in str(info.value) and "'tiny'" in str(info.value)
    assert client.describe_topic("tiny").events == 0
    ok.write.format("pgstreams").option("dsn", dsn).option("topic", "tiny").mode("append").save()
    assert client.describe_topic("tiny").events == 1
