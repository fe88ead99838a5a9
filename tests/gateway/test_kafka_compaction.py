"""Compacted topics through the Kafka gateway (confluent-kafka): the compaction settings created, described
and altered as Kafka's topic configs, a null value stored as a tombstone and fetched as one, a record
without a key refused by a compacted topic (INVALID_RECORD) with nothing stored, and a compaction pass
seen by a Kafka consumer: the latest record of each key, at its offset."""

from __future__ import annotations

import time
from collections.abc import Iterator

import pytest
from confluent_kafka import Consumer, KafkaError, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, AlterConfigOpType, ConfigEntry, ConfigResource, NewTopic

import pgstreams
from _gateway_helpers import running_gateway
from pgstreams.maintenance import Maintenance


@pytest.fixture
def gateway(client: pgstreams.Client, dsn: str) -> Iterator[str]:
    with running_gateway(dsn) as address:
        yield address


def test_compaction_configs_tombstones_and_keyless_records_through_kafka(client: pgstreams.Client,
                                                                         gateway: str) -> None:
    admin = AdminClient({"bootstrap.servers": gateway})
    done = admin.create_topics([NewTopic("state", 1, config={
        "cleanup.policy": "compact", "segment.events": "1000", "min.cleanable.dirty.ratio": "0.1",
        "delete.retention.ms": "3600000"})])
    assert [f.result(30) for f in done.values()] == [None]
    (described,) = admin.describe_configs([ConfigResource("topic", "state")]).values()
    configs = described.result(30)
    assert configs["cleanup.policy"].value == "compact" and not configs["cleanup.policy"].is_default
    assert configs["min.cleanable.dirty.ratio"].value == "0.1"
    assert configs["min.compaction.lag.ms"].value == "0" and configs["min.compaction.lag.ms"].is_default
    change = ConfigResource("topic", "state", incremental_configs=[
        ConfigEntry("min.compaction.lag.ms", "0", incremental_operation=AlterConfigOpType.SET)])
    assert [f.result(30) for f in admin.incremental_alter_configs([change]).values()] == [None]
    assert client.describe_topic("state").config["min.compaction.lag.ms"] == 0

    producer = Producer({"bootstrap.servers": gateway, "linger.ms": 5})
    errors: list[object] = []
    for i in range(1500):
        producer.produce("state", value=f"v{i}".encode(), key=f"k{i % 10}")
    producer.produce("state", value=None, key="k3")  # a tombstone
    assert producer.flush(60) == 0
    # as in Kafka, a batch holding a record without a key is refused as a whole
    producer.produce("state", value=b"no key", on_delivery=lambda err, m: errors.append(err))
    assert producer.flush(60) == 0
    assert len(errors) == 1 and errors[0] is not None
    assert errors[0].code() == KafkaError.INVALID_RECORD  # type: ignore[attr-defined]
    events = client.consumer("state", "check").poll(max_events=2000, timeout=5)
    assert len(events) == 1501 and events[-1].key == "k3" and events[-1].value is None
    assert all(e.key is not None for e in events)

    Maintenance(client).run()
    consumer = Consumer({"bootstrap.servers": gateway, "group.id": "reader", "enable.auto.commit": False})
    try:
        consumer.assign([TopicPartition("state", 0, 0)])
        got = []
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and (not got or got[-1][0] < events[-1].position):
            m = consumer.poll(0.5)
            if m is not None:
                assert m.error() is None, m.error()
                got.append((m.offset(), m.key(), m.value()))
    finally:
        consumer.close()
    stored = [(e.position, e.key.encode(), e.value)  # type: ignore[union-attr]
              for e in client.consumer("state", "after").poll(max_events=2000, timeout=5)]
    assert got == stored and len(got) < 1501  # compacted: fewer records, at their offsets
    assert got[-1] == (events[-1].position, b"k3", None)  # the tombstone, a null value
