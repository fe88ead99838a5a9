"""Idempotent producers through the Kafka gateway: a batch sent again (as a producer does after a lost
reply) is stored once and answered with where it was stored, a batch out of order or of a fenced epoch is
refused and stores nothing; and librdkafka and kafka-python, idempotent by choice and by default,
produce through it."""

from __future__ import annotations

import io
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from confluent_kafka import Producer
from kafka import KafkaProducer
from kio.records.schema import NewRecordBatch, Record
from kio.records.writers import write_new_batch
from kio.schema.init_producer_id.v0.request import InitProducerIdRequest
from kio.schema.init_producer_id.v0.response import InitProducerIdResponse
from kio.schema.init_producer_id.v3.request import InitProducerIdRequest as InitProducerIdRequestV3
from kio.schema.init_producer_id.v3.response import InitProducerIdResponse as InitProducerIdResponseV3
from kio.schema.produce.v3.request import PartitionProduceData, ProduceRequest, TopicProduceData
from kio.schema.produce.v3.response import ProduceResponse
from kio.static.primitive import TZAwareMicros, i8, i16, i32, i32Timedelta, i64

import pgstreams
from _gateway_helpers import RawConnection, running_gateway


@pytest.fixture
def gateway(client: pgstreams.Client, dsn: str) -> Iterator[str]:
    with running_gateway(dsn) as address:
        yield address


def _call(bootstrap: str, key: int, version: int, request: Any, response_type: Any) -> Any:
    with RawConnection(bootstrap, timeout=30) as conn:
        return conn.call(key, version, request, response_type)


def _init_producer(bootstrap: str) -> tuple[int, int]:
    r = _call(bootstrap, 22, 0, InitProducerIdRequest(
        transactional_id=None, transaction_timeout=i32Timedelta.parse(timedelta(seconds=60))),
        InitProducerIdResponse)
    assert r.error_code == 0
    return int(r.producer_id), int(r.producer_epoch)


def _produce(bootstrap: str, producer: tuple[int, int], sequence: int, values: list[bytes]
             ) -> tuple[int, int]:
    """A Produce v3 of one batch of ``values`` to partition 0 of ``t``: (error code, base offset)."""
    now = TZAwareMicros.parse(datetime.now(UTC).replace(microsecond=0))
    records = tuple(Record(attributes=i8(0), timestamp=now, offset=i64(i), key=b"k", value=v, headers=())
                    for i, v in enumerate(values))
    buf = io.BytesIO()
    write_new_batch(buf, NewRecordBatch(producer_id=i64(producer[0]), producer_epoch=i16(producer[1]),
                                        base_sequence=i32(sequence), records=records, attributes=i16(0)))
    request = ProduceRequest(transactional_id=None, acks=i16(-1),
                             timeout=i32Timedelta.parse(timedelta(seconds=30)),
                             topic_data=(TopicProduceData(name="t", partition_data=(
                                 PartitionProduceData(index=i32(0), records=buf.getvalue()),)),))
    r = _call(bootstrap, 0, 3, request, ProduceResponse)
    part = r.responses[0].partition_responses[0]
    return int(part.error_code), int(part.base_offset)


def test_a_batch_sent_again_is_stored_once_and_out_of_order_or_fenced_batches_store_nothing(
        client: pgstreams.Client, gateway: str) -> None:
    client.create_topic("t", partitions=1)
    producer = _init_producer(gateway)
    first = _produce(gateway, producer, 0, [b"a", b"b"])
    assert first[0] == 0
    assert _produce(gateway, producer, 0, [b"a", b"b"]) == first  # sent again: the same answer
    assert client.describe_topic("t").events == 2
    second = _produce(gateway, producer, 2, [b"c"])
    assert second[0] == 0 and second[1] > first[1]
    assert _produce(gateway, producer, 0, [b"a", b"b"]) == first  # still remembered (the last 5 batches)
    assert _produce(gateway, producer, 5, [b"x"])[0] == 45  # OUT_OF_ORDER_SEQUENCE_NUMBER: 3 expected
    assert client.describe_topic("t").events == 3
    # a new epoch of the same producer fences the old one
    bumped = _call(gateway, 22, 3, InitProducerIdRequestV3(
        transactional_id=None, transaction_timeout=i32Timedelta.parse(timedelta(seconds=60)),
        producer_id=i64(producer[0]), producer_epoch=i16(producer[1])), InitProducerIdResponseV3)
    assert bumped.error_code == 0
    assert (bumped.producer_id, bumped.producer_epoch) == (producer[0], producer[1] + 1)
    assert _produce(gateway, producer, 3, [b"old"])[0] == 47  # INVALID_PRODUCER_EPOCH
    assert _produce(gateway, (producer[0], producer[1] + 1), 0, [b"new"])[0] == 0
    assert _produce(gateway, (123456789, 0), 0, [b"?"])[0] == 59  # UNKNOWN_PRODUCER_ID
    events = client.consumer("t", "check").poll(max_events=100, timeout=5)
    assert [e.value for e in events] == [b"a", b"b", b"c", b"new"]


def test_idempotent_librdkafka_and_kafka_python_producers_store_each_record_once(
        client: pgstreams.Client, gateway: str) -> None:
    client.create_topic("t", partitions=3)
    producer = Producer({"bootstrap.servers": gateway, "enable.idempotence": True, "linger.ms": 5})
    errors: list[object] = []
    for i in range(60):
        producer.produce("t", value=f"{i}".encode(), key=f"k{i}",
                         on_delivery=lambda err, m: errors.append(err))
    assert producer.flush(60) == 0 and errors == [None] * 60
    kp = KafkaProducer(bootstrap_servers=gateway)  # idempotent by default
    try:
        for i in range(60, 70):
            kp.send("t", key=f"k{i}".encode(), value=f"{i}".encode()).get(timeout=30)
    finally:
        kp.close()
    values = sorted(int(e.value) for e in client.consumer("t", "check").poll(max_events=200, timeout=5))
    assert values == list(range(70))
