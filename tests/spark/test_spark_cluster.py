"""The Spark data source over a cluster of three shards (option ``dsn`` holding three DSNs): a batch read
whose Spark partitions each read one shard, an ``availableNow`` stream with offsets per shard
reading every event once in per-key order, and the writer routing rows by key."""

from __future__ import annotations

import json
from collections import defaultdict
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from pyspark.sql import SparkSession
from pyspark.sql import functions as F

import _spark_helpers
import pgstreams
from _core_helpers import new_database
from pgstreams.cluster import ClusterClient, init_cluster, shard_for_key

pytestmark = pytest.mark.timeout(600)


@pytest.fixture(scope="module")
def spark() -> Iterator[SparkSession]:
    session = _spark_helpers.session("pgstreams-cluster-tests")
    yield session
    session.stop()


@pytest.fixture
def shards(server_dsn: str) -> list[str]:
    dsns = [new_database(server_dsn, "spark_shard_") for _ in range(3)]
    init_cluster(dsns)
    return dsns


def _cluster(dsns: list[str]) -> ClusterClient:
    client = pgstreams.connect(dsns)
    assert isinstance(client, ClusterClient)
    return client


def test_read_stream_and_write_over_a_cluster(spark: SparkSession, shards: list[str], tmp_path: Path) -> None:
    dsn = ",".join(shards)
    keys = [f"k{i}" for i in range(30)]
    with _cluster(shards) as cluster:
        cluster.create_topic("src", 4)
        cluster.create_topic("dst", 4)
        cluster.publish_many("src", [{"value": json.dumps({"k": k, "n": n}).encode(), "key": k}
                                     for n in range(10) for k in keys])
    df = spark.read.format("pgstreams").option("dsn", dsn).option("topic", "src").load()
    assert df.rdd.getNumPartitions() >= 3  # each shard's input partitions, planned by its own reader
    rows = df.select("shard", "partition", "position", "key",
                     F.spark_partition_id().alias("task")).collect()
    assert len(rows) == 300
    tasks: dict[int, set[int]] = defaultdict(set)
    for r in rows:
        tasks[r["task"]].add(r["shard"])
    assert all(len(v) == 1 for v in tasks.values())  # a Spark partition reads one shard
    assert all(r["shard"] == shard_for_key(r["key"], 4, 3) for r in rows)

    got: list[dict[str, Any]] = []

    def collect(batch: Any, batch_id: int) -> None:
        got.extend(r.asDict() for r in batch.orderBy("shard", "partition", "position").collect())

    checkpoint = tmp_path / "ck"
    query = (spark.readStream.format("pgstreams").option("dsn", dsn).option("topic", "src")
             .option("maxEventsPerTrigger", "40").option("group", "spark").load()
             .writeStream.foreachBatch(collect).option("checkpointLocation", str(checkpoint))
             .trigger(availableNow=True).start())
    assert query.awaitTermination(300) is not False
    assert query.exception() is None
    assert len(got) == 300
    seqs: dict[str, list[int]] = defaultdict(list)
    for r in got:
        seqs[r["key"]].append(json.loads(r["value"])["n"])
    assert all(v == list(range(10)) for v in seqs.values()), seqs
    offsets = sorted((checkpoint / "offsets").iterdir())
    assert "shards" in offsets[-1].read_text()
    with _cluster(shards) as cluster:  # the group's checkpoints were mirrored on every shard
        assert all(all(s.lag == 0 for s in c.describe_group("spark", "src")) for c in cluster.shards)

    (spark.read.format("pgstreams").option("dsn", dsn).option("topic", "src").load()
     .select("key", "value").write.format("pgstreams").option("dsn", dsn).option("topic", "dst")
     .mode("append").save())
    with _cluster(shards) as cluster:
        consumer = cluster.consumer("dst", "check")
        written: list[pgstreams.Event] = []
        while got_events := consumer.poll(500, 1.0):
            written += got_events
            consumer.commit()
    assert len(written) == 300
    where: dict[str, set[tuple[int, int]]] = defaultdict(set)
    for e in written:
        where[e.key or ""].add((e.shard, e.partition))
        assert e.shard == shard_for_key(e.key or "", 4, 3)
    assert all(len(v) == 1 for v in where.values())
