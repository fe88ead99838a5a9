"""Produce v0 to v2 through the Kafka gateway: Kafka's legacy message sets (message formats v0 and v1, plain
or compressed with gzip, snappy and lz4) become events that pgstreams' own consumer reads with the same key
and value, no headers, and the time they were stored; a message whose CRC does not match is refused with
``CORRUPT_MESSAGE`` and nothing of its partition is stored; each version's reply has its own fields;
``ApiVersions`` advertises Produce 0 to 9 (and Metadata from v0, which such clients ask with); and real
clients configured for old brokers (kafka-python's ``api_version``, librdkafka's
``broker.version.fallback=0.9.0``) produce through the gateway.

The message sets sent as they are come from kafka-python's legacy record builder (its own encoder, CRCs
and codecs, including Kafka 0.8's lz4 header checksum for magic 0), and the requests and replies are
written and read here with ``struct``, so that no code of the gateway checks itself."""

from __future__ import annotations

import gzip
import logging
import re
import socket
import struct
import time
import zlib
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta

import cramjam
import lz4.frame
import pytest
import xxhash
from confluent_kafka import Producer
from kafka import KafkaProducer
from kafka.record.legacy_records import LegacyRecordBatchBuilder
from kio.schema.api_versions.v0.request import ApiVersionsRequest
from kio.schema.api_versions.v0.response import ApiVersionsResponse
from kio.schema.metadata.v0.request import MetadataRequest, MetadataRequestTopic
from kio.schema.metadata.v0.response import MetadataResponse
from kio.schema.produce.v3.request import PartitionProduceData, ProduceRequest, TopicProduceData
from kio.schema.produce.v3.response import ProduceResponse
from kio.static.primitive import i16, i32, i32Timedelta

import pgstreams
from _gateway_helpers import RawConnection, read_frame, running_gateway
from pgstreams.kafka.legacy import xxh32

NONE, GZIP, SNAPPY, LZ4, ZSTD = 0, 1, 2, 3, 4
CORRUPT_MESSAGE, UNSUPPORTED_FOR_MESSAGE_FORMAT, UNSUPPORTED_COMPRESSION_TYPE = 2, 43, 76
#: The CreateTime the tests' magic 1 messages carry (2001-09-09): not what events keep.
CREATE_TIME = 1_000_000_000_000

Records = list[tuple[bytes | None, bytes]]


@pytest.fixture
def gateway(client: pgstreams.Client, dsn: str) -> Iterator[str]:
    with running_gateway(dsn) as address:
        yield address


def _message_set(magic: int, codec: int, records: Records) -> bytes:
    """``records`` as a message set of ``magic`` (compressed in one wrapper with ``codec``), by
    kafka-python's encoder; magic 1 messages carry :data:`CREATE_TIME`."""
    builder = LegacyRecordBatchBuilder(magic, codec, 1 << 20)
    for i, (key, value) in enumerate(records):
        assert builder.append(i, timestamp=CREATE_TIME, key=key, value=value) is not None
    return bytes(builder.build())


def _wrapper(magic: int, codec: int, compressed: bytes) -> bytes:
    """A compressed message of ``magic`` whose value is ``compressed``, its own CRC right."""
    body = struct.pack(">bb", magic, codec) + (struct.pack(">q", CREATE_TIME) if magic else b"") + \
        struct.pack(">ii", -1, len(compressed)) + compressed
    message = struct.pack(">I", zlib.crc32(body)) + body
    return struct.pack(">qi", 0, len(message)) + message


def _string(text: str) -> bytes:
    data = text.encode()
    return struct.pack(">h", len(data)) + data


def _produce_frame(version: int, correlation: int, topic: str, parts: dict[int, bytes], acks: int = 1
                   ) -> bytes:
    """A Produce request of ``version`` (0 to 2: no transactional id) with each partition's records."""
    body = struct.pack(">hii", acks, 30_000, 1) + _string(topic) + struct.pack(">i", len(parts))
    for partition, records in parts.items():
        body += struct.pack(">ii", partition, len(records)) + records
    payload = struct.pack(">hhi", 0, version, correlation) + _string("legacy-test") + body
    return struct.pack(">i", len(payload)) + payload


class _Reply:
    """A Produce v0-v2 reply, read field by field: per partition its error code, base offset and (v2) log
    append time; the throttle time (v1 on)."""

    def __init__(self, version: int, frame: bytes) -> None:
        self.partitions: dict[int, tuple[int, int, int | None]] = {}
        at = 4  # the correlation id
        (topics,) = struct.unpack_from(">i", frame, at)
        at += 4
        assert topics == 1
        (name_size,) = struct.unpack_from(">h", frame, at)
        at += 2 + name_size
        (count,) = struct.unpack_from(">i", frame, at)
        at += 4
        for _ in range(count):
            index, error, base = struct.unpack_from(">ihq", frame, at)
            at += 14
            append_time = None
            if version >= 2:
                (append_time,) = struct.unpack_from(">q", frame, at)
                at += 8
            self.partitions[index] = (error, base, append_time)
        self.throttle: int | None = None
        if version >= 1:
            (self.throttle,) = struct.unpack_from(">i", frame, at)
            at += 4
        assert at == len(frame), f"{len(frame) - at} bytes after a Produce v{version} reply"


def _produce(bootstrap: str, version: int, topic: str, parts: dict[int, bytes]) -> _Reply:
    host, port = bootstrap.rsplit(":", 1)
    with socket.create_connection((host, int(port)), timeout=60) as sock:
        sock.sendall(_produce_frame(version, 7, topic, parts))
        frame = read_frame(sock)
    assert struct.unpack_from(">i", frame)[0] == 7
    return _Reply(version, frame)


def _consume(client: pgstreams.Client, topic: str, count: int, timeout: float = 60) -> list[pgstreams.Event]:
    """The first ``count`` events of ``topic`` read by a pgstreams consumer (fails after ``timeout``)."""
    consumer = client.consumer(topic, f"check-{time.monotonic_ns()}")
    got: list[pgstreams.Event] = []
    deadline = time.monotonic() + timeout
    while len(got) < count and time.monotonic() < deadline:
        got += consumer.poll(max_events=count - len(got), timeout=1)
    assert len(got) == count, f"{len(got)} of {count} events"
    return got


def _stored_now(event: pgstreams.Event, before: datetime, after: datetime) -> bool:
    """Whether ``event`` is stamped with a time between ``before`` and ``after`` (a second's slack between
    the clocks of the test and the database)."""
    return before - timedelta(seconds=1) <= event.created_at <= after + timedelta(seconds=1)


def test_api_versions_advertises_produce_from_version_0(gateway: str) -> None:
    with RawConnection(gateway, timeout=30) as conn:
        reply = conn.call(18, 0, ApiVersionsRequest(), ApiVersionsResponse)
    assert reply.error_code == 0
    served = {int(k.api_key): (int(k.min_version), int(k.max_version)) for k in reply.api_keys}
    assert served[0] == (0, 9)
    assert served[3] == (0, 12)  # Metadata v0: what clients for brokers before 0.10 ask with


def test_metadata_v0_of_no_topic_lists_every_topic(client: pgstreams.Client, gateway: str) -> None:
    client.create_topic("a", partitions=2)
    client.create_topic("b", partitions=1)
    with RawConnection(gateway, timeout=30) as conn:
        every = conn.call(3, 0, MetadataRequest(topics=()), MetadataResponse)  # v0 cannot send a null list
        one = conn.call(3, 0, MetadataRequest(topics=(MetadataRequestTopic(name="b"),)), MetadataResponse)
    assert {t.name: len(t.partitions) for t in every.topics} == {"a": 2, "b": 1}
    assert [t.name for t in one.topics] == ["b"]


@pytest.mark.parametrize(("version", "magic"), [(0, 0), (1, 0), (2, 1), (2, 0)],
                         ids=["v0-magic0", "v1-magic0", "v2-magic1", "v2-magic0"])
def test_uncompressed_messages_of_produce_v0_to_v2_become_events_of_their_key_and_value_stamped_when_stored(
        client: pgstreams.Client, gateway: str, version: int, magic: int) -> None:
    client.create_topic("t", partitions=2)
    records: Records = [(b"k1", b"first"), (None, b"\x00\xff binary"), (b"k3", b"")]
    before = datetime.now(UTC)
    reply = _produce(gateway, version, "t", {1: _message_set(magic, NONE, records)})
    after = datetime.now(UTC)
    error, base, _append_time = reply.partitions[1]
    assert error == 0
    events = _consume(client, "t", 3)
    assert [(e.partition, e.key, e.value) for e in events] == [
        (1, "k1", b"first"), (1, None, b"\x00\xff binary"), (1, "k3", b"")]
    assert events[0].position == base
    assert all(not e.headers for e in events)  # no headers before record batches v2
    # the time of storing, as for record batches v2 (not the producer's CreateTime of a magic 1 message)
    assert all(_stored_now(e, before, after) for e in events), [e.created_at for e in events]


def test_the_replies_of_produce_v0_v1_v2_have_their_versions_fields(client: pgstreams.Client,
                                                                      gateway: str) -> None:
    client.create_topic("t", partitions=1)
    for version in (0, 1, 2):  # _Reply fails when a reply has a field more or less than its version
        reply = _produce(gateway, version, "t", {0: _message_set(min(version, 1), NONE, [(b"k", b"v")])})
        error, base, append_time = reply.partitions[0]
        assert error == 0 and base >= 0
        assert reply.throttle == (None if version == 0 else 0)
        assert append_time == (None if version < 2 else -1)


def _compressed_set(codec: int, magic: int, records: Records, framing: str) -> bytes:
    """``records`` in one message of ``magic`` compressed with ``codec`` (``framing``: snappy's)."""
    if framing == "raw snappy":  # the framing librdkafka uses: snappy's raw format, not xerial's blocks
        inner = _message_set(magic, NONE, records)
        return _wrapper(magic, SNAPPY, bytes(cramjam.snappy.compress_raw(inner)))
    return _message_set(magic, codec, records)


@pytest.mark.parametrize(("codec", "framing"), [(GZIP, "gzip"), (SNAPPY, "xerial snappy"),
                                                (SNAPPY, "raw snappy"), (LZ4, "lz4")],
                         ids=["gzip", "xerial-snappy", "raw-snappy", "lz4"])
@pytest.mark.parametrize("magic", [0, 1])
def test_compressed_messages_become_the_events_of_their_inner_messages(
        client: pgstreams.Client, gateway: str, magic: int, codec: int, framing: str) -> None:
    client.create_topic("t", partitions=1)
    records: Records = [(f"key-{i}".encode(), f"value {i} ".encode() * 20) for i in range(25)]
    data = _compressed_set(codec, magic, records, framing)
    assert data[17] & 0x07 == codec and len(data) < sum(len(v) for _, v in records)  # one wrapper
    if codec == LZ4 and magic == 0:
        # Kafka 0.8's framing, whose header checksum covers the frame's magic number: lz4 refuses it
        value = data[26:]  # after the offset, size, CRC, magic, attributes, null key and value's size
        assert struct.unpack_from(">i", data, 22)[0] == len(value)
        with pytest.raises(RuntimeError):
            lz4.frame.decompress(value)
    reply = _produce(gateway, 2 if magic else 1, "t", {0: data})
    error, base, _ = reply.partitions[0]
    assert error == 0
    events = _consume(client, "t", 25)
    assert [(e.key, e.value) for e in events] == [(k.decode(), v) for k, v in records]
    assert events[0].position == base


def test_the_lz4_header_checksum_is_xxh32() -> None:
    # the gateway's XXH32 (for the descriptors of lz4 frames, shorter than 16 bytes) against xxHash's own
    for n in range(16):
        for data in (bytes(range(n)), bytes(range(255, 255 - n, -1)), b"\x04\x22\x4d\x18\x60\x40"[:n]):
            assert xxh32(data) == xxhash.xxh32_intdigest(data), data


def _corrupt_last_byte(data: bytes) -> bytes:
    return data[:-1] + bytes((data[-1] ^ 0xFF,))


@pytest.mark.parametrize("where", ["message", "inner message"])
def test_a_message_whose_crc_does_not_match_is_refused_and_nothing_of_its_partition_is_stored(
        client: pgstreams.Client, gateway: str, where: str) -> None:
    client.create_topic("t", partitions=2)
    records: Records = [(b"a", b"one"), (b"b", b"two"), (b"c", b"three")]
    if where == "message":  # the last message's value changed after its CRC was computed
        bad = _corrupt_last_byte(_message_set(1, NONE, records))
    else:  # the wrapper is sound, one message inside it is not
        bad = _wrapper(1, GZIP, gzip.compress(_corrupt_last_byte(_message_set(1, NONE, records))))
    reply = _produce(gateway, 2, "t", {0: bad, 1: _message_set(1, NONE, [(b"d", b"fine")])})
    assert reply.partitions[0][:2] == (CORRUPT_MESSAGE, -1)
    assert reply.partitions[1][0] == 0  # the other partition of the request is stored
    assert [(e.key, e.value) for e in _consume(client, "t", 1)] == [("d", b"fine")]
    assert client.read_events("t", 0) == []  # the reply came after the commit: nothing was stored


def test_zstd_does_not_exist_before_record_batches_v2(client: pgstreams.Client, gateway: str) -> None:
    client.create_topic("t", partitions=1)
    inner = _message_set(1, NONE, [(b"k", b"v")])
    reply = _produce(gateway, 2, "t", {0: _wrapper(1, ZSTD, bytes(cramjam.zstd.compress(inner)))})
    assert reply.partitions[0][0] == UNSUPPORTED_COMPRESSION_TYPE
    assert client.read_events("t", 0) == []


def test_legacy_messages_in_produce_v3_are_refused(client: pgstreams.Client, gateway: str) -> None:
    client.create_topic("t", partitions=1)
    records = _message_set(1, NONE, [(b"k", b"v")])
    request = ProduceRequest(transactional_id=None, acks=i16(1),
                             timeout=i32Timedelta.parse(timedelta(seconds=30)),
                             topic_data=(TopicProduceData(name="t", partition_data=(
                                 PartitionProduceData(index=i32(0), records=records),)),))
    with RawConnection(gateway, timeout=30) as conn:
        reply = conn.call(0, 3, request, ProduceResponse)
    assert reply.responses[0].partition_responses[0].error_code == UNSUPPORTED_FOR_MESSAGE_FORMAT
    assert client.read_events("t", 0) == []


def _sent_produce_requests(caplog: pytest.LogCaptureFixture) -> list[tuple[int, int, int]]:
    """The Produce requests kafka-python sent (from its own log): version, and the magic and codec of
    each partition's first message."""
    out = []
    for record in caplog.records:
        args = record.args
        if record.name == "kafka.protocol.parser" and isinstance(args, tuple) and len(args) == 3 \
                and type(args[2]).__name__ == "ProduceRequest":
            request = args[2]
            for topic in request.topic_data:
                for part in topic.partition_data:
                    records = bytes(part.records)
                    out.append((int(request.API_VERSION), records[16], records[17] & 0x07))
    return out


@pytest.mark.parametrize(("api_version", "compression", "produce_version", "magic"), [
    ((0, 8, 2), None, 0, 0),
    ((0, 9), "gzip", 1, 0),
    ((0, 9), "lz4", 1, 0),  # Kafka 0.8's lz4 header checksum
    ((0, 10, 1), "snappy", 2, 1),
    ((0, 10, 1), "lz4", 2, 1),
], ids=["0.8.2-none", "0.9-gzip", "0.9-lz4", "0.10.1-snappy", "0.10.1-lz4"])
def test_kafka_python_configured_for_an_old_broker_produces_through_the_gateway(
        client: pgstreams.Client, gateway: str, caplog: pytest.LogCaptureFixture,
        api_version: tuple[int, ...], compression: str | None, produce_version: int, magic: int) -> None:
    client.create_topic("t", partitions=1)
    caplog.set_level(logging.DEBUG, logger="kafka.protocol.parser")
    producer = KafkaProducer(bootstrap_servers=gateway, api_version=api_version, compression_type=compression,
                             linger_ms=200, batch_size=1 << 20)
    try:
        futures = [producer.send("t", key=f"k{i}".encode(), value=f"value {i} ".encode() * 10)
                   for i in range(10)]
        producer.flush(60)
        offsets = [f.get(timeout=60).offset for f in futures]
    finally:
        producer.close(timeout=30)
    codec = {None: NONE, "gzip": GZIP, "snappy": SNAPPY, "lz4": LZ4}[compression]
    sent = _sent_produce_requests(caplog)
    assert sent and all(s == (produce_version, magic, codec) for s in sent), sent
    events = _consume(client, "t", 10)
    assert [(e.position, e.key, e.value) for e in events] == [
        (o, f"k{i}", f"value {i} ".encode() * 10) for i, o in enumerate(offsets)]


#: librdkafka's account of a produce: its Produce version, message format and codec.
_RDKAFKA_PRODUCE = re.compile(r"Produce MessageSet with \d+ message\(s\) \(.*ApiVersion (\d+), "
                              r"MsgVersion (\d+),.*, (\w+)\)$")


@pytest.mark.parametrize("codec", ["gzip", "snappy", "lz4"])
def test_librdkafka_with_the_0_9_fallback_produces_compressed_messages_through_the_gateway(
        client: pgstreams.Client, gateway: str, codec: str) -> None:
    # three partitions: librdkafka 2.x misjudges the memory a Metadata v0 reply needs when its topic has one
    # partition ("tmpabuf memory shortage"), whatever the broker
    client.create_topic("t", partitions=3)
    lines: list[str] = []

    class Lines(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            lines.append(record.getMessage())

    log = logging.getLogger(f"test-rdkafka-{codec}")
    log.setLevel(logging.DEBUG)
    log.addHandler(Lines())
    producer = Producer({"bootstrap.servers": gateway, "api.version.request": False,
                         "broker.version.fallback": "0.9.0", "compression.codec": codec, "linger.ms": 200,
                         "debug": "msg"}, logger=log)
    reports: list[tuple[object, int]] = []
    for i in range(20):
        producer.produce("t", key=f"k{i}", value=f"value {i} ".encode() * 10, partition=0,
                         on_delivery=lambda err, m: reports.append((err, m.offset())))
    assert producer.flush(60) == 0
    assert len(reports) == 20 and all(err is None for err, _ in reports), reports
    accounts = {m.groups() for m in map(_RDKAFKA_PRODUCE.search, lines) if m}
    assert accounts == {("1", "0", codec)}, lines  # Produce v1, message format v0, compressed
    events = _consume(client, "t", 20)
    assert [(e.position, e.key, e.value) for e in events] == [
        (o, f"k{i}", f"value {i} ".encode() * 10) for i, (_, o) in enumerate(reports)]
