"""Batch and ordered reads of the Spark data source over events too large to aggregate a page at a time.

PostgreSQL builds no value over 1 GB: a chunk query over pages holding more than that (large events are
stored out of line, so one heap page can hold hundreds of them) must fall back to fewer pages, then to
one row per event. These tests drive the source's reader directly (planning and reading in this process,
against the real server); no Spark session is needed to move 1.1 GB.
"""

from __future__ import annotations

import hashlib
import json

import psycopg

import pgstreams
from pgstreams.spark._batch import ScanSplit, Split
from pgstreams.spark._source import PgStreamsDataSource

SIZE = 25_000_000
LARGE = 45  # 1.125 GB in all, on one or two heap pages


def value(i: int) -> bytes:
    return (b"%08d" % i) * (SIZE // 8)


def read_all(options: dict[str, str]) -> tuple[list[type], dict[int, tuple[int, str]]]:
    """The kinds of input partitions planned and, per position, the value's length and digest."""
    source = PgStreamsDataSource(options)
    reader = source.reader(source.schema())
    parts = reader.partitions()
    got: dict[int, tuple[int, str]] = {}
    for part in parts:
        for batch in reader.read(part):
            for pos, val in zip(batch.column("position").to_pylist(), batch.column("value").to_pylist(),
                                strict=True):
                assert pos not in got, f"position {pos} read twice"
                got[pos] = (len(val), hashlib.sha1(val).hexdigest())
    return [type(p) for p in parts], got


def test_reads_of_events_too_large_to_aggregate_a_page_at_once(dsn: str) -> None:
    with pgstreams.connect(dsn) as client:
        client.create_topic("large", 1, config={"max.message.bytes": 100_000_000})  # 25 MB events
        for i in range(LARGE):
            client.publish("large", value(i), key=f"k{i}")
        client.publish_many("large", [{"value": b"small %d" % i} for i in range(10)])
    with psycopg.connect(dsn) as conn:
        rows = conn.execute("SELECT position, value FROM pgstreams.topic_1 ORDER BY position").fetchall()
    want = {int(p): (len(v), hashlib.sha1(v).hexdigest()) for p, v in rows}
    assert len(want) == LARGE + 10 and sum(n for n, _ in want.values()) > 1 << 30

    kinds, got = read_all({"dsn": dsn, "topic": "large"})
    assert kinds == [ScanSplit] and got == want

    # from the fourth event on: an ordered read through the read-order index
    start = sorted(want)[3]
    ordered = {"large": {"0": start}}
    kinds, got = read_all({"dsn": dsn, "topic": "large", "startingOffsets": json.dumps(ordered)})
    assert kinds == [Split] and got == {p: v for p, v in want.items() if p >= start}
