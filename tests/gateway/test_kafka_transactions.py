"""Kafka transactions through the gateway with librdkafka (confluent-kafka): a transactional producer's
records are held back from read-committed consumers until the commit and vanish at an abort; a
consume-transform-produce loop with ``send_offsets_to_transaction`` moves the group's checkpoints with the
records it writes, and not at all when it aborts; a producer initialised again with the same transactional
id fences the earlier one."""

from __future__ import annotations

import time
from collections.abc import Iterator

import pytest
from confluent_kafka import Consumer, KafkaException, Producer, TopicPartition

import pgstreams
from _gateway_helpers import running_gateway


@pytest.fixture
def gateway(client: pgstreams.Client, dsn: str) -> Iterator[str]:
    with running_gateway(dsn) as address:
        yield address


def _producer(gateway: str, transactional_id: str) -> Producer:
    producer = Producer({"bootstrap.servers": gateway, "transactional.id": transactional_id,
                         "linger.ms": 1, "transaction.timeout.ms": 60000})
    producer.init_transactions(30)
    return producer


def _read_committed(gateway: str, topic: str, partitions: int, group: str = "reader") -> Consumer:
    consumer = Consumer({"bootstrap.servers": gateway, "group.id": group, "enable.auto.commit": False,
                         "isolation.level": "read_committed", "fetch.wait.max.ms": 100})
    consumer.assign([TopicPartition(topic, p, 0) for p in range(partitions)])
    return consumer


def _drain(consumer: Consumer, seconds: float) -> list[bytes]:
    """Every value the consumer receives within ``seconds`` (a bounded read: used to show an absence)."""
    got: list[bytes] = []
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        m = consumer.poll(0.1)
        if m is not None:
            assert m.error() is None, m.error()
            got.append(m.value())
    return got


def _until(consumer: Consumer, count: int, timeout: float = 60) -> list[bytes]:
    got: list[bytes] = []
    deadline = time.monotonic() + timeout
    while len(got) < count and time.monotonic() < deadline:
        m = consumer.poll(0.2)
        if m is not None:
            assert m.error() is None, m.error()
            got.append(m.value())
    return got


def _checkpoint(client: pgstreams.Client, group: str) -> int | None:
    try:
        return client.describe_group(group)[0].checkpoint
    except pgstreams.GroupNotFound:
        return None


def test_records_appear_at_the_commit_and_vanish_at_an_abort(client: pgstreams.Client, gateway: str) -> None:
    client.create_topic("out", partitions=2)
    producer = _producer(gateway, "tx-commit")
    consumer = _read_committed(gateway, "out", 2)
    try:
        producer.begin_transaction()
        for i in range(10):
            producer.produce("out", value=f"c{i}".encode(), key=f"k{i}")
        producer.flush(30)  # the records are at the gateway, in the open transaction
        assert _drain(consumer, 1.0) == []  # held back from a read-committed consumer
        assert client.consumer("out", "native").poll(max_events=100, timeout=0.5) == []  # and from pgstreams
        producer.commit_transaction(30)
        assert sorted(_until(consumer, 10)) == sorted(f"c{i}".encode() for i in range(10))

        producer.begin_transaction()
        for i in range(5):
            producer.produce("out", value=f"a{i}".encode(), key=f"k{i}")
        producer.flush(30)
        producer.abort_transaction(30)
        producer.begin_transaction()
        producer.produce("out", value=b"after", key="k0")
        producer.commit_transaction(30)
        assert _until(consumer, 1) == [b"after"]  # nothing of the aborted transaction, before or after
    finally:
        consumer.close()
    events = client.consumer("out", "check").poll(max_events=100, timeout=5)
    assert sorted(e.value for e in events) == sorted([*(f"c{i}".encode() for i in range(10)), b"after"])


def test_consume_transform_produce_moves_the_offsets_with_the_records(client: pgstreams.Client,
                                                                      gateway: str) -> None:
    client.create_topic("in", partitions=1)
    client.create_topic("out", partitions=1)
    client.publish_many("in", [{"value": f"m{i}".encode()} for i in range(6)])
    consumer = Consumer({"bootstrap.servers": gateway, "group.id": "etl", "enable.auto.commit": False,
                         "auto.offset.reset": "earliest", "isolation.level": "read_committed"})
    consumer.assign([TopicPartition("in", 0)])
    producer = _producer(gateway, "tx-etl")
    try:
        first = _until(consumer, 3, 30)[:3]
        assert len(first) == 3
        producer.begin_transaction()
        for v in first:
            producer.produce("out", value=v.upper())
        producer.send_offsets_to_transaction(consumer.position(consumer.assignment()),
                                             consumer.consumer_group_metadata(), 30)
        producer.abort_transaction(30)  # nothing written, the group's checkpoint unmoved
        assert _checkpoint(client, "etl") is None
        assert client.consumer("out", "check1").poll(max_events=10, timeout=0.5) == []

        producer.begin_transaction()
        for v in first:
            producer.produce("out", value=v.upper())
        producer.send_offsets_to_transaction(consumer.position(consumer.assignment()),
                                             consumer.consumer_group_metadata(), 30)
        producer.commit_transaction(30)
    finally:
        consumer.close()
    out = client.consumer("out", "check2").poll(max_events=10, timeout=5)
    assert [e.value for e in out] == [b"M0", b"M1", b"M2"]
    third = client.consumer("in", "positions").poll(max_events=10, timeout=5)[2]
    # the group's checkpoint moved with them: a restarted consumer of the group resumes after m2
    assert _checkpoint(client, "etl") == third.position
    again = Consumer({"bootstrap.servers": gateway, "group.id": "etl", "enable.auto.commit": False,
                      "auto.offset.reset": "earliest"})
    again.assign([TopicPartition("in", 0)])
    try:
        assert _until(again, 3, 30) == [b"m3", b"m4", b"m5"]
    finally:
        again.close()


def test_a_producer_initialised_again_fences_the_earlier_one(client: pgstreams.Client, gateway: str) -> None:
    client.create_topic("out", partitions=1)
    zombie = _producer(gateway, "tx-same")
    zombie.begin_transaction()
    zombie.produce("out", value=b"zombie")
    zombie.flush(30)
    fresh = _producer(gateway, "tx-same")  # rolls back the zombie's open transaction
    fresh.begin_transaction()
    fresh.produce("out", value=b"fresh")
    fresh.commit_transaction(30)
    with pytest.raises(KafkaException) as info:
        zombie.commit_transaction(30)
    assert info.value.args[0].fatal() or info.value.args[0].txn_requires_abort()
    events = client.consumer("out", "check").poll(max_events=10, timeout=5)
    assert [e.value for e in events] == [b"fresh"]
