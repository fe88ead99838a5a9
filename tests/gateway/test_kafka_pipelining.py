"""Produce requests a client sends without waiting for the replies (Kafka's in-flight requests): the
gateway answers them in order, each with the offset of its own first record, stores every request's records
in order, and a partition refused among them costs that partition only."""

from __future__ import annotations

import io
import socket
import struct
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from kio.records.schema import NewRecordBatch, Record
from kio.records.writers import write_new_batch
from kio.schema.init_producer_id.v0.request import InitProducerIdRequest
from kio.schema.init_producer_id.v0.response import InitProducerIdResponse
from kio.schema.produce.v3.request import PartitionProduceData, ProduceRequest, TopicProduceData
from kio.schema.produce.v3.response import ProduceResponse
from kio.serial import entity_reader
from kio.static.primitive import TZAwareMicros, i8, i16, i32, i32Timedelta, i64

import pgstreams
from _gateway_helpers import read_frame, request_frame, running_gateway


@pytest.fixture
def gateway(client: pgstreams.Client, dsn: str) -> Iterator[str]:
    with running_gateway(dsn) as address:
        yield address


def _frame(key: int, version: int, correlation: int, request: Any) -> bytes:
    return request_frame(key, version, correlation, request, "pipeline")


def _batch(values: list[bytes], producer: tuple[int, int] = (-1, -1), sequence: int = -1) -> bytes:
    now = TZAwareMicros.parse(datetime.now(UTC).replace(microsecond=0))
    records = tuple(Record(attributes=i8(0), timestamp=now, offset=i64(i), key=b"k", value=v, headers=())
                    for i, v in enumerate(values))
    buf = io.BytesIO()
    write_new_batch(buf, NewRecordBatch(producer_id=i64(producer[0]), producer_epoch=i16(producer[1]),
                                        base_sequence=i32(sequence), records=records, attributes=i16(0)))
    return buf.getvalue()


def _produce(correlation: int, partitions: dict[int, bytes]) -> bytes:
    request = ProduceRequest(transactional_id=None, acks=i16(-1),
                             timeout=i32Timedelta.parse(timedelta(seconds=30)),
                             topic_data=(TopicProduceData(name="t", partition_data=tuple(
                                 PartitionProduceData(index=i32(p), records=b)
                                 for p, b in partitions.items())),))
    return _frame(0, 3, correlation, request)


def _exchange(address: str, frames: list[bytes]) -> list[tuple[int, bytes]]:
    """Send every frame at once, then read as many replies: (correlation id, reply body) each."""
    host, port = address.rsplit(":", 1)
    with socket.create_connection((host, int(port)), timeout=60) as sock:
        sock.sendall(b"".join(frames))
        out = []
        for _ in frames:
            frame = read_frame(sock)
            out.append((struct.unpack_from(">i", frame)[0], frame))
    return out


def _partitions(frame: bytes) -> dict[int, tuple[int, int]]:
    """A Produce v3 reply's partitions of topic ``t``: (error code, base offset) each."""
    reply = entity_reader(ProduceResponse)(memoryview(frame), 4)[0]
    (topic,) = reply.responses
    return {int(p.index): (int(p.error_code), int(p.base_offset)) for p in topic.partition_responses}


def test_pipelined_requests_are_answered_in_order_each_with_its_own_first_offset(
        client: pgstreams.Client, gateway: str) -> None:
    client.create_topic("t", partitions=2)
    init = _exchange(gateway, [_frame(22, 0, 1, InitProducerIdRequest(
        transactional_id=None, transaction_timeout=i32Timedelta.parse(timedelta(seconds=60))))])[0][1]
    answer = entity_reader(InitProducerIdResponse)(memoryview(init), 4)[0]
    producer = (int(answer.producer_id), int(answer.producer_epoch))
    frames = []
    for i in range(40):
        # partition 0: plain batches; partition 1: one idempotent producer's batches, in sequence
        frames.append(_produce(100 + i, {0: _batch([f"p0-r{i}-{j}".encode() for j in range(3)]),
                                         1: _batch([f"p1-r{i}-{j}".encode() for j in range(2)], producer,
                                                   2 * i)}))
    replies = _exchange(gateway, frames)
    assert [c for c, _ in replies] == list(range(100, 140))
    events = client.consumer("t", "check").poll(max_events=1000, timeout=10)
    position = {e.value: e.position for e in events}
    assert len(position) == 40 * 5
    for i, (_c, frame) in enumerate(replies):
        parts = _partitions(frame)
        assert parts[0] == (0, position[f"p0-r{i}-0".encode()]), i
        assert parts[1] == (0, position[f"p1-r{i}-0".encode()]), i
    for p, n in ((0, 3), (1, 2)):
        values = [e.value for e in events if e.partition == p]
        assert values == [f"p{p}-r{i}-{j}".encode() for i in range(40) for j in range(n)]


def test_a_partition_refused_among_pipelined_requests_costs_that_partition_only(
        client: pgstreams.Client, gateway: str) -> None:
    client.create_topic("t", partitions=2, config={"max.message.bytes": "1000"})
    frames = [_produce(1, {0: _batch([b"a"]), 1: _batch([b"b"])}),
              _produce(2, {0: _batch([b"c", b"x" * 5000]), 1: _batch([b"d"])}),
              _produce(3, {0: _batch([b"e"]), 1: _batch([b"f", b"g"])})]
    replies = [_partitions(frame) for _c, frame in _exchange(gateway, frames)]
    assert replies[1][0][0] != 0 and replies[1][0][1] == -1  # the batch with a record too large
    assert all(code == 0 for n, r in enumerate(replies) for p, (code, _) in r.items() if (n, p) != (1, 0))
    events = client.consumer("t", "check").poll(max_events=100, timeout=10)
    assert sorted(e.value for e in events) == [b"a", b"b", b"d", b"e", b"f", b"g"]  # nothing of "c"
    by_value = {e.value: e.position for e in events}
    assert replies[2][1] == (0, by_value[b"f"]) and replies[1][1] == (0, by_value[b"d"])
