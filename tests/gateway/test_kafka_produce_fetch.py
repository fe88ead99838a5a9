"""Producing and fetching through the Kafka gateway with real clients: the same data both ways (key, value,
headers), offsets that are event positions (below the read fence, with gaps), ListOffsets by earliest,
latest and time, and batches compressed with every Kafka codec."""

from __future__ import annotations

import time
from collections.abc import Iterator

import pytest
from confluent_kafka import Consumer, Producer, TopicPartition
from kafka import KafkaConsumer, KafkaProducer
from kafka import TopicPartition as KTopicPartition

import pgstreams
from _gateway_helpers import running_gateway
from pgstreams.partitioner import partition_for_key


@pytest.fixture
def gateway(client: pgstreams.Client, dsn: str) -> Iterator[str]:
    with running_gateway(dsn) as address:
        yield address


Consumed = list[tuple[int, int, bytes, bytes, list]]


def _consume(consumer: Consumer, count: int, timeout: float = 60) -> Consumed:
    got: Consumed = []
    deadline = time.monotonic() + timeout
    while len(got) < count and time.monotonic() < deadline:
        m = consumer.poll(0.5)
        if m is None:
            continue
        assert m.error() is None, m.error()
        got.append((m.partition(), m.offset(), m.key(), m.value(), m.headers() or []))
    return got


def test_records_produced_by_librdkafka_are_events_and_come_back_the_same(client: pgstreams.Client,
                                                                         gateway: str) -> None:
    client.create_topic("orders", partitions=3)
    producer = Producer({"bootstrap.servers": gateway, "linger.ms": 5, "partitioner": "murmur2_random"})
    reports: list[tuple[object, int, int]] = []
    for i in range(30):
        producer.produce("orders", value=f"order {i}".encode(), key=f"customer-{i % 7}",
                         headers=[("source", b"shop"), ("n", str(i).encode())],
                         on_delivery=lambda err, m: reports.append((err, m.partition(), m.offset())))
    assert producer.flush(60) == 0
    assert len(reports) == 30 and all(err is None for err, _, _ in reports), reports
    # pgstreams sees the same events, each where its partitioner puts the key (Kafka's murmur2)
    events = client.consumer("orders", "check").poll(max_events=100, timeout=5)
    assert len(events) == 30
    for e in events:
        assert isinstance(e.value, bytes) and e.value.startswith(b"order ")
        assert e.partition == partition_for_key(e.key, 3)
        assert e.headers == {"source": "shop", "n": e.value.decode().split()[1]}
    by_offset = {(e.partition, e.position): e for e in events}
    assert {(p, o) for _, p, o in reports} <= set(by_offset)
    # and a Kafka consumer reads them back, offsets being positions
    consumer = Consumer({"bootstrap.servers": gateway, "group.id": "unused", "enable.auto.commit": False})
    try:
        consumer.assign([TopicPartition("orders", p, 0) for p in range(3)])
        got = _consume(consumer, 30)
    finally:
        consumer.close()
    assert len(got) == 30
    for p, offset, key, value, headers in got:
        e = by_offset[(p, offset)]
        assert key == e.key.encode() and value == e.value
        assert dict((k, v.decode()) for k, v in headers) == e.headers


def test_events_published_by_pgstreams_reach_kafka_clients_with_their_bytes(client: pgstreams.Client,
                                                                          gateway: str) -> None:
    client.create_topic("mixed", partitions=2)
    client.publish("mixed", b"\x00\xffraw", key="a", headers={"kind": "bytes"})
    client.publish("mixed", "text é", key="b")
    client.publish("mixed", {"n": 1, "ok": True}, key="c")
    consumer = KafkaConsumer(bootstrap_servers=gateway, enable_auto_commit=False)
    got: dict[bytes, tuple[bytes, list]] = {}
    try:
        consumer.assign([KTopicPartition("mixed", 0), KTopicPartition("mixed", 1)])
        consumer.seek_to_beginning()
        deadline = time.monotonic() + 60
        while len(got) < 3 and time.monotonic() < deadline:
            for records in consumer.poll(timeout_ms=500).values():
                got.update({m.key: (m.value, m.headers) for m in records})
    finally:
        consumer.close()
    assert got == {b"a": (b"\x00\xffraw", [("kind", b"bytes")]), b"b": ("text é".encode(), []),
                   b"c": (b'{"n":1,"ok":true}', [])}


def test_offsets_are_positions_below_the_read_fence_and_list_offsets_finds_them(client: pgstreams.Client,
                                                                               gateway: str) -> None:
    client.create_topic("t", partitions=2)
    before = int(time.time() * 1000) - 1000
    for i in range(10):
        client.publish("t", f"{i}", partition=i % 2)  # positions alternate: each partition's have gaps
    events = client.consumer("t", "check").poll(max_events=100, timeout=5)
    positions = {p: sorted(e.position for e in events if e.partition == p) for p in (0, 1)}
    assert all(len(positions[p]) == 5 for p in (0, 1))
    consumer = Consumer({"bootstrap.servers": gateway, "group.id": "unused", "enable.auto.commit": False})
    try:
        for p in (0, 1):
            low, high = consumer.get_watermark_offsets(TopicPartition("t", p), timeout=30, cached=False)
            assert low == positions[p][0] and high > positions[p][-1]
        found = consumer.offsets_for_times([TopicPartition("t", 0, before),
                                            TopicPartition("t", 1, int(time.time() * 1000) + 3_600_000)],
                                           timeout=30)
        assert found[0].offset == positions[0][0]
        assert found[1].offset == -1  # nothing at or after that time
        consumer.assign([TopicPartition("t", 1, positions[1][2])])
        got = _consume(consumer, 3)
        assert [o for _, o, *_ in got] == positions[1][2:]
    finally:
        consumer.close()


@pytest.mark.parametrize("codec", ["gzip", "snappy", "lz4", "zstd"])
def test_batches_compressed_with_every_codec_are_stored_whole(client: pgstreams.Client, gateway: str,
                                                              codec: str) -> None:
    client.create_topic("t", partitions=1)
    producer = Producer({"bootstrap.servers": gateway, "compression.type": codec, "linger.ms": 20})
    errors: list[object] = []
    # large and compressible, so that librdkafka compresses (it sends a batch as is when that is smaller)
    values = [f"{i:05d}".encode() * 2000 for i in range(20)]
    for i, value in enumerate(values):
        producer.produce("t", value=value, key=f"k{i}", headers=[("codec", codec.encode())],
                         on_delivery=lambda err, m: errors.append(err))
    assert producer.flush(60) == 0
    assert errors == [None] * 20
    events = client.consumer("t", "check").poll(max_events=100, timeout=5)
    assert [e.value for e in events] == values
    assert all(e.headers == {"codec": codec} for e in events)
    if codec == "gzip":  # and from another client
        kp = KafkaProducer(bootstrap_servers=gateway, enable_idempotence=False, compression_type="gzip")
        try:
            kp.send("t", key=b"kp", value=b"z" * 10_000).get(timeout=30)
        finally:
            kp.close()
        assert client.describe_topic("t").events == 21


def test_committed_offsets_are_the_pgstreams_groups_checkpoints_both_ways(client: pgstreams.Client,
                                                                          gateway: str) -> None:
    client.create_topic("t", partitions=2)
    for i in range(6):
        client.publish("t", f"{i}", partition=i % 2)
    consumer = Consumer({"bootstrap.servers": gateway, "group.id": "billing", "enable.auto.commit": False})
    try:
        consumer.assign([TopicPartition("t", 0, 0), TopicPartition("t", 1, 0)])
        got = _consume(consumer, 6)
        assert len(got) == 6
        consumer.commit(asynchronous=False)
        last = {p: max(o for q, o, *_ in got if q == p) for p in (0, 1)}
        committed = consumer.committed([TopicPartition("t", 0), TopicPartition("t", 1)], timeout=30)
        assert {tp.partition: tp.offset for tp in committed} == {p: last[p] + 1 for p in (0, 1)}
    finally:
        consumer.close()
    # the Kafka group is the pgstreams group: checkpoints at the last offsets read, no lag
    status = {s.partition: s for s in client.describe_group("billing", "t")}
    assert {p: s.checkpoint for p, s in status.items()} == last and all(s.lag == 0 for s in status.values())
    # moved back by pgstreams, the Kafka client sees the move
    client.reset_group("billing", "t", to_earliest=True)
    # (the origin, before every event, shows as no checkpoint: position 0)
    moved = {s.partition: s.checkpoint or 0 for s in client.describe_group("billing", "t")}
    assert all(moved[p] < last[p] for p in (0, 1))
    reader = KafkaConsumer(bootstrap_servers=gateway, group_id="billing", enable_auto_commit=False)
    try:
        seen = {p: reader.committed(KTopicPartition("t", p)) for p in (0, 1)}
        assert seen == {p: moved[p] + 1 for p in (0, 1)}
    finally:
        reader.close()


def test_a_waiting_fetch_returns_as_soon_as_an_event_is_published(client: pgstreams.Client,
                                                                 gateway: str) -> None:
    client.create_topic("t", partitions=1)
    consumer = Consumer({"bootstrap.servers": gateway, "group.id": "unused", "enable.auto.commit": False,
                         "fetch.wait.max.ms": 20000, "fetch.min.bytes": 1})
    try:
        consumer.assign([TopicPartition("t", 0, 0)])
        assert consumer.poll(1.0) is None  # its fetch now waits at the gateway, for up to 20 s
        delays = []
        for i in range(3):
            sent = time.monotonic()
            client.publish("t", f"{i}")
            got = _consume(consumer, 1, timeout=30)
            delays.append(time.monotonic() - sent)
            assert len(got) == 1
        # woken by the publisher's notification, not at the end of the fetch's wait
        assert max(delays) < 5, delays
    finally:
        consumer.close()
