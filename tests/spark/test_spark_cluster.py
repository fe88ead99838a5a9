"""The Spark data source over a cluster of three shards, the test session's three PostgreSQL servers
(option ``dsn`` holding their three DSNs): a batch read whose Spark partitions each read one shard, an
``availableNow`` stream with offsets per shard, the batch writer routing rows by key, and a streaming
writer that stores each event once on each shard when a micro-batch that committed on some shards and
not on another runs again from the query's checkpoint. Every read, and every topic written, is checked
for per-key order: each key's events on one (shard, partition), in the order they were published.

These tests use :func:`shard_servers` (tests/conftest.py), so they run on the Spark tests' xdist worker
with the other cluster tests.
"""

from __future__ import annotations

import json
import time
from collections import defaultdict
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest
from pyspark.errors import StreamingQueryException
from pyspark.sql import SparkSession
from pyspark.sql import functions as F

import _spark_helpers
from _cluster_helpers import KeyedRead, assert_key_order, cluster, read_all
from _core_helpers import wait_until
from pgstreams.cluster import shard_for_key

pytestmark = pytest.mark.timeout(600)


@pytest.fixture(scope="module")
def spark() -> Iterator[SparkSession]:
    session = _spark_helpers.session("pgstreams-cluster-tests")
    yield session
    for q in session.streams.active:
        q.stop()


def _publish(dsns: list[str], topic: str, keys: list[str], rounds: int) -> None:
    """``rounds`` events per key on ``topic`` (created with 4 partitions), values ``{"k", "n"}`` as JSON
    bytes, ``n`` counting each key's events from 0 in publish order."""
    with cluster(dsns) as client:
        client.publish_many(topic, [{"value": json.dumps({"k": k, "n": n}).encode(), "key": k}
                                    for n in range(rounds) for k in keys])


def _reads(rows: list[Any]) -> list[KeyedRead]:
    """Spark rows (``key``, ``shard``, ``partition``, ``value``) as :class:`KeyedRead`, in their order."""
    out = []
    for r in rows:
        value = json.loads(r["value"])
        assert value["k"] == r["key"]
        out.append(KeyedRead(r["key"], r["shard"], r["partition"], 0, value["n"]))
    return out


def test_read_stream_and_write_over_a_cluster(spark: SparkSession, cluster_dsns: list[str],
                                              tmp_path: Path) -> None:
    dsn = ",".join(cluster_dsns)
    keys = [f"k{i}" for i in range(30)]
    with cluster(cluster_dsns) as client:
        client.create_topic("src", 4)
        client.create_topic("dst", 4)
    _publish(cluster_dsns, "src", keys, 10)
    df = spark.read.format("pgstreams").option("dsn", dsn).option("topic", "src").load()
    assert df.rdd.getNumPartitions() >= 3  # each shard's input partitions, planned by its own reader
    rows = df.select("shard", "partition", "position", "key", "value",
                     F.spark_partition_id().alias("task")).collect()
    assert len(rows) == 300
    tasks: dict[int, set[int]] = defaultdict(set)
    for r in rows:
        tasks[r["task"]].add(r["shard"])
    assert all(len(v) == 1 for v in tasks.values())  # a Spark partition reads one shard
    assert all(r["shard"] == shard_for_key(r["key"], 4, 3) for r in rows)
    # in read order (position order within each (shard, partition): a batch read returns its page
    # ranges' rows in storage order), each key's events come in publish order
    in_read_order = sorted(rows, key=lambda r: (r["shard"], r["partition"], r["position"]))
    assert_key_order(_reads(in_read_order), rounds=10)

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
    assert_key_order(_reads(got), rounds=10)  # micro-batch after micro-batch: every event once, in order
    offsets = sorted((checkpoint / "offsets").iterdir())
    assert "shards" in offsets[-1].read_text()
    with cluster(cluster_dsns) as client:  # the group's checkpoints were mirrored on every shard
        assert all(all(s.lag == 0 for s in c.describe_group("spark", "src")) for c in client.shards)

    # each key's rows in one task, in read order: the writer keeps a task's order of a key's rows (rows of
    # a key spread over several tasks, as the page ranges of a batch read spread them, are stored in the
    # order the tasks commit)
    (spark.read.format("pgstreams").option("dsn", dsn).option("topic", "src").load()
     .repartition("key").sortWithinPartitions("shard", "partition", "position")
     .select("key", "value").write.format("pgstreams").option("dsn", dsn).option("topic", "dst")
     .mode("append").save())
    with cluster(cluster_dsns) as client:
        # routed by key, each key's events in the order they were published on the source
        written = read_all(client, "dst", "check", 300, rounds=10)
    assert len(written) == 300
    assert all(e.shard == shard_for_key(e.key or "", 4, 3) for e in written)


def test_a_stream_writing_to_a_cluster_stores_each_event_once_per_shard_across_a_restart(
        spark: SparkSession, cluster_dsns: list[str], tmp_path: Path) -> None:
    """Micro-batch 1 of a streaming copy (cluster to cluster) commits its tasks' rows on shards 0 and 1,
    and fails on shard 2 (the write tasks' connections to shard 2 are ended while they wait for a lock
    the test holds). Started again from its checkpoint, the query runs micro-batch 1 again: shards 0
    and 1 find those tasks done and store nothing twice, shard 2 stores its part. Every source event is
    then on the target once, each key's in publish order."""
    dsn = ",".join(cluster_dsns)
    keys = [f"k{i}" for i in range(30)]
    rounds = 8  # about 80 events per shard, 30 per shard and micro-batch: micro-batches 0, 1 and 2
    with cluster(cluster_dsns) as client:
        client.create_topic("src", 4)
        client.create_topic("dst", 4)
    _publish(cluster_dsns, "src", keys, rounds)
    trapped = tmp_path / "trapped"

    def wait_for_the_trap(value: bytes) -> bytes:
        # the rows of micro-batch 0 wait until the test has set its trap for micro-batch 1
        import time
        from pathlib import Path

        from pyspark import TaskContext

        ctx = TaskContext.get()
        if ctx is not None and ctx.getLocalProperty("streaming.sql.batchId") == "0":
            deadline = time.monotonic() + 300
            while not Path(str(trapped)).exists() and time.monotonic() < deadline:
                time.sleep(0.05)
        return value

    def copy() -> Any:
        src = (spark.readStream.format("pgstreams").option("dsn", dsn).option("topic", "src")
               .option("maxEventsPerTrigger", "30").option("group", "copier").load())
        gated = F.udf(wait_for_the_trap, "binary", useArrow=False)("value").alias("value")
        return (src.select("key", gated).writeStream.format("pgstreams").option("dsn", dsn)
                .option("topic", "dst").option("checkpointLocation", str(tmp_path / "ck"))
                .trigger(availableNow=True))

    query = copy().start()
    sink = f"query-{query.id}"

    def done(shard: int, batch: int) -> int:
        """The task rows of micro-batch `batch` committed on shard `shard`."""
        with psycopg.connect(cluster_dsns[shard]) as conn:
            row = conn.execute("SELECT count(*) FROM pgstreams.spark_sink_tasks WHERE sink_id = %s "
                               "AND batch_id = %s", (sink, batch)).fetchone()
            return int(row[0]) if row else 0

    # the trap: shard 2's task rows of micro-batch 1, claimed in a transaction left open, so that every
    # write task of micro-batch 1, having committed on shards 0 and 1, waits on shard 2
    hold = psycopg.connect(cluster_dsns[2])
    try:
        hold.execute("INSERT INTO pgstreams.spark_sink_tasks (sink_id, batch_id, task_partition, topic_id) "
                     "SELECT %s, 1, p, id FROM pgstreams.topics, generate_series(0, 63) p WHERE name = 'dst'",
                     (sink,))
        trapped.touch()
        # the sessions waiting for the trap (not those of micro-batch 0's tasks, which may wait for each
        # other a moment on shard 2)
        waiting = "SELECT pid FROM pg_stat_activity WHERE %s = ANY(pg_blocking_pids(pid))"
        with psycopg.connect(cluster_dsns[2], autocommit=True) as watch:
            pid = hold.info.backend_pid
            wait_until(lambda: watch.execute(waiting, (pid,)).fetchall() or not query.isActive, 300,
                       "a write task of micro-batch 1 waiting on shard 2")
            assert query.isActive, query.exception()
            # end the waiting tasks' sessions on shard 2 (and those of any task that comes to wait next)
            # until the micro-batch has failed the query
            deadline = time.monotonic() + 300
            while query.isActive:
                assert time.monotonic() < deadline, "the query did not fail"
                for (task,) in watch.execute(waiting, (pid,)).fetchall():
                    watch.execute("SELECT pg_terminate_backend(%s)", (task,))
                time.sleep(0.1)
            # while the trap still holds: micro-batch 1 committed tasks on shards 0 and 1, none on shard 2.
            # (Once the trap is gone, a task of the failed micro-batch that Spark has not stopped yet may
            # still commit its part on shard 2: the same rows the restarted micro-batch would write, so the
            # restart then finds that task done, which is what the check at the end allows for.)
            assert done(0, 1) > 0 and done(1, 1) > 0 and done(2, 1) == 0
    finally:
        hold.close()  # the trap's rows were never committed
    with pytest.raises(StreamingQueryException):
        query.awaitTermination(60)

    again = copy().start()
    assert again.awaitTermination(300) is not False
    assert again.exception() is None
    with cluster(cluster_dsns) as client:
        # every source event once on the target (n from 0 to rounds - 1 per key, none twice), in order
        written = read_all(client, "dst", "check", len(keys) * rounds, rounds=rounds)
        assert len(written) == len(keys) * rounds
        assert client.consumer("dst", "check").poll(100, 0.5) == []
        assert all(s.lag == 0 for c in client.shards for s in c.describe_group("copier", "src"))
