"""Admission control of streaming reads (``maxEventsPerTrigger``), through the stream reader that Spark
calls on the driver: how the cap is shared among partitions and topics, planned without a SparkSession."""

from __future__ import annotations

import pytest
from pyspark.sql.streaming.datasource import ReadAllAvailable, ReadMaxRows

import pgstreams
from pgstreams.spark._source import PgStreamsDataSource, read_schema

pytestmark = [pytest.mark.spark]


def _batches(dsn: str, cap: int, **options: str) -> list[dict[str, dict[int, int]]]:
    """The events per topic and partition of each micro-batch an ``availableNow`` read with
    ``maxEventsPerTrigger`` ``cap`` plans, until nothing is left."""
    reader = PgStreamsDataSource({"dsn": dsn, "maxEventsPerTrigger": str(cap), **options}).streamReader(
        read_schema())
    try:
        reader.prepareForTriggerAvailableNow()
        start = reader.initialOffset()
        out = []
        while True:
            end = reader.latestOffset(start, ReadMaxRows(cap))
            if end == start:
                return out
            sizes: dict[str, dict[int, int]] = {}
            for split in reader.partitions(start, end):
                rows = sum(b.num_rows for b in reader.read(split))
                sizes.setdefault(split.topic, {})[split.partition] = rows  # type: ignore[attr-defined]
            out.append(sizes)
            start = end
    finally:
        reader.stop()


def test_the_cap_is_shared_equally_and_a_short_partition_leaves_the_rest_to_the_others(dsn: str) -> None:
    with pgstreams.connect(dsn) as client:
        client.create_topic("uneven", 3)
        counts = {0: 5, 1: 100, 2: 100}
        for p, n in counts.items():
            client.publish_many("uneven", [{"value": i, "partition": p} for i in range(n)])
        batches = _batches(dsn, 60, topic="uneven")
    # 60 in parts of 20; partition 0 has 5: its 15 go to the others (28 and 27, the first by one more)
    assert batches[0] == {"uneven": {0: 5, 1: 28, 2: 27}}
    assert all(sum(sum(b.values()) for b in batch.values()) <= 60 for batch in batches)
    total: dict[int, int] = {}
    for batch in batches:
        for p, n in batch["uneven"].items():
            total[p] = total.get(p, 0) + n
    assert total == counts  # every event once
    assert [sum(b["uneven"].values()) for b in batches] == [60, 60, 60, 25]


def test_the_cap_is_shared_over_the_partitions_of_several_topics_and_a_small_cap_reaches_each(
        dsn: str) -> None:
    with pgstreams.connect(dsn) as client:
        client.create_topic("ta", 2)
        client.create_topic("tb", 1)
        for p in (0, 1):
            client.publish_many("ta", [{"value": i, "partition": p} for i in range(10)])
        client.publish_many("tb", [{"value": i} for i in range(10)])
        first = _batches(dsn, 9, topics="ta,tb")[0]
        assert first == {"ta": {0: 3, 1: 3}, "tb": {0: 3}}
        # a cap below the number of partitions: one event each to the first ones in topic, partition order
        assert _batches(dsn, 2, topics="ta,tb")[0] == {"ta": {0: 1, 1: 1}}
        # without a cap: everything at once
        reader = PgStreamsDataSource({"dsn": dsn, "topics": "ta,tb"}).streamReader(read_schema())
        try:
            start = reader.initialOffset()
            end = reader.latestOffset(start, ReadAllAvailable())
            assert sum(sum(b.num_rows for b in reader.read(s)) for s in reader.partitions(start, end)) == 30
        finally:
            reader.stop()
