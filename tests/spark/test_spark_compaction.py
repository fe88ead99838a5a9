"""The Spark data source and compacted topics: an ``availableNow`` stream reading while producers publish and
maintenance passes rewrite segments sees every surviving event once; tombstones are written from a NULL
value and read as one; a row without a key written to a compacted topic fails its task, storing nothing."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest
from pyspark.sql import SparkSession
from pyspark.sql.types import BinaryType, StringType, StructField, StructType

import _spark_helpers
import pgstreams
from _core_helpers import drain_group, drain_share
from pgstreams.maintenance import Maintenance

pytestmark = [pytest.mark.spark]

SEG = 1000
COMPACT = {"cleanup.policy": "compact", "segment.events": SEG, "min.cleanable.dirty.ratio": 0.0}


@pytest.fixture(scope="module")
def spark() -> Iterator[SparkSession]:
    session = _spark_helpers.session("pgstreams-compaction-tests")
    yield session
    for q in session.streams.active:
        q.stop()


def _positions(client: pgstreams.Client, topic: str) -> set[int]:
    tid = client.topic_record(topic).id
    with client.connection() as conn:
        return {r[0] for r in conn.execute(f"SELECT position FROM pgstreams.topic_{tid}")}


def _available_now(spark: SparkSession, dsn: str, topic: str, checkpoint: Path) -> list[tuple[int, int]]:
    seen: list[tuple[int, int]] = []

    def collect(df: Any, _batch_id: int) -> None:
        seen.extend((r.partition, r.position) for r in df.select("partition", "position").collect())

    q = (spark.readStream.format("pgstreams").option("dsn", dsn).option("topic", topic)
         .option("maxEventsPerTrigger", "700").load()
         .writeStream.foreachBatch(collect).option("checkpointLocation", str(checkpoint))
         .trigger(availableNow=True).start())
    assert q.awaitTermination(180), "the availableNow query did not finish"
    assert q.exception() is None
    return seen


def test_readers_and_an_available_now_stream_lose_and_repeat_nothing_while_segments_are_rewritten(
        spark: SparkSession, client: pgstreams.Client, dsn: str, tmp_path: Path) -> None:
    """Producers, a stream group, a share group and an ``availableNow`` stream at once, while maintenance
    passes rewrite segments."""
    client.create_topic("state", 2, config=COMPACT)
    done = threading.Event()
    errors: list[BaseException] = []
    group_seen: list[tuple[int, int]] = []
    share_seen: list[tuple[int, int]] = []

    def guarded(fn: Any) -> threading.Thread:
        def run() -> None:
            try:
                fn()
            except BaseException as exc:  # noqa: BLE001 - reported below
                errors.append(exc)
                done.set()
        return threading.Thread(target=run)

    def produce() -> None:
        try:
            with pgstreams.connect(dsn) as producer:
                for r in range(6):
                    producer.publish_many("state", [{"value": r * 1000 + i, "key": f"k{i % 40}"}
                                                    for i in range(SEG)])
        finally:
            done.set()

    def compact() -> None:
        with pgstreams.connect(dsn) as maintainer:
            while not done.is_set():
                Maintenance(maintainer).run()

    def group() -> None:
        drain_group(dsn, "state", "g", group_seen, done)

    def share() -> None:
        drain_share(dsn, "state", "sg", share_seen, done)

    threads = [guarded(f) for f in (produce, compact, group, share)]
    for t in threads:
        t.start()
    stream_seen: list[tuple[int, int]] = []
    while not done.is_set():
        stream_seen += _available_now(spark, dsn, "state", tmp_path / "cp")
    for t in threads:
        t.join(120)
    assert not errors, errors
    Maintenance(client).run()
    stream_seen += _available_now(spark, dsn, "state", tmp_path / "cp")
    survivors = _positions(client, "state")
    for seen in (stream_seen, group_seen, share_seen):
        assert len(seen) == len(set(seen))  # nothing twice
        assert survivors <= {p for _, p in seen}  # no survivor skipped
    assert client.retention_status("state")[0].segments_compacted > 0


def test_tombstones_and_keys_of_spark_writes(spark: SparkSession, client: pgstreams.Client, dsn: str) -> None:
    client.create_topic("state", 1, config=COMPACT)
    schema = StructType([StructField("key", StringType(), True), StructField("value", BinaryType(), True)])
    rows = [("a", b"1"), ("b", b"2"), ("a", None)]
    spark.createDataFrame(rows, schema).write.format("pgstreams").option("dsn", dsn) \
        .option("topic", "state").mode("append").save()
    events = client.consumer("state", "g").poll(max_events=10, timeout=1)  # tasks commit in any order
    assert sorted(((e.key, e.value) for e in events), key=repr) == \
        sorted([("a", b"1"), ("b", b"2"), ("a", None)], key=repr)
    read = spark.read.format("pgstreams").option("dsn", dsn).option("topic", "state").load()
    expected = [(e.position, e.key, None if e.value is None else bytearray(e.value)) for e in events]
    got = [(r.position, r.key, r.value) for r in read.collect()]
    assert sorted(got, key=repr) == sorted(expected, key=repr)
    with pytest.raises(Exception, match=r"KeyRequired|every event needs a key"):
        spark.createDataFrame([(None, b"x")], schema).write.format("pgstreams").option("dsn", dsn) \
            .option("topic", "state").mode("append").save()
    with psycopg.connect(dsn) as conn:
        tid = client.topic_record("state").id
        assert conn.execute(f"SELECT count(*) FROM pgstreams.topic_{tid}").fetchone() == (3,)
