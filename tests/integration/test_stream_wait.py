"""The planning of a streaming micro-batch waits for new events (option ``maxWaitMs``) instead of asking the
database at every trigger, and the publishers' notifications end that wait: the stream reader of
``spark.readStream.format("pgstreams")`` driven directly, as Spark's driver drives it, without a JVM."""

from __future__ import annotations

import threading
import time

import pytest
from pyspark.sql.streaming.datasource import ReadAllAvailable

import pgstreams
import pgstreams.spark
from _core_helpers import until
from pgstreams.spark._options import MAX_WAIT_MS, read_options
from pgstreams.spark._stream import StreamReader


def _reader(dsn: str, **options: str) -> StreamReader:
    return StreamReader(read_options({"dsn": dsn, "topic": "idle", **options}), pgstreams.spark.read_schema())


def test_an_idle_stream_waits_max_wait_ms_for_events_then_reports_no_new_data(client: pgstreams.Client,
                                                                              dsn: str) -> None:
    client.create_topic("idle", partitions=2)
    client.publish("idle", {"n": 1}, key="a")
    reader = _reader(dsn, maxWaitMs="600")
    try:
        start = reader.initialOffset()
        first = reader.latestOffset(start, ReadAllAvailable())
        assert sum(first["idle"].values()) > 0  # an event: no wait
        began = time.monotonic()
        again = reader.latestOffset(first, ReadAllAvailable())
        waited = time.monotonic() - began
        assert again == first
        assert waited >= 0.55, waited
        assert waited < 5, waited
    finally:
        reader.stop()
    assert MAX_WAIT_MS > 0  # waiting is the default


def test_a_published_event_ends_the_wait_at_once(client: pgstreams.Client, dsn: str) -> None:
    client.create_topic("idle", partitions=2)
    reader = _reader(dsn, maxWaitMs="60000")
    published: list[float] = []

    def publish_later() -> None:
        with pgstreams.connect(dsn) as other:
            # once the reader waits: it marks the topic as waited for, then publishers notify
            until(lambda: other.run(lambda c: c.execute(
                "SELECT count(*) FROM pgstreams.topic_waiters").fetchone()[0]) > 0, 60, "the reader's mark")
            other.publish("idle", {"n": 2}, key="b")
        published.append(time.monotonic())

    try:
        start = reader.initialOffset()
        thread = threading.Thread(target=publish_later)
        thread.start()
        end = reader.latestOffset(start, ReadAllAvailable())
        returned = time.monotonic()
        thread.join()
        assert sum(end["idle"].values()) > 0
        assert published and returned - published[0] < 5, "the wait was not ended by the notification"
    finally:
        reader.stop()


def test_available_now_and_a_zero_wait_do_not_wait(client: pgstreams.Client, dsn: str) -> None:
    client.create_topic("idle", partitions=1)
    for options in ({"maxWaitMs": "0"}, {"maxWaitMs": "60000"}):
        reader = _reader(dsn, **options)
        try:
            if options["maxWaitMs"] != "0":
                reader.prepareForTriggerAvailableNow()
            start = reader.initialOffset()
            began = time.monotonic()
            assert reader.latestOffset(start, ReadAllAvailable()) == start
            assert time.monotonic() - began < 5
        finally:
            reader.stop()


@pytest.mark.parametrize("value", ["-1", "soon", "1.5"])
def test_bad_max_wait_ms_is_refused_with_its_name(value: str) -> None:
    with pytest.raises(pgstreams.InvalidArgument, match="maxWaitMs"):
        read_options({"dsn": "postgresql://nowhere", "topic": "idle", "maxWaitMs": value})
