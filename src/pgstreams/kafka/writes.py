"""``Produce``: Kafka records become pgstreams events.

A record's value is stored as bytes (an event whose value a pgstreams consumer reads as ``bytes``), its
key as text (UTF-8), its headers as the event's headers (UTF-8, one value per name), in the partition the
client chose. The record batches of one partition are stored in one transaction, all or none. Their
time is the time of the commit (Kafka's ``LogAppendTime``), not the producer's.

Batches compressed with any of Kafka's codecs (gzip, snappy, lz4, zstd) are decompressed with
``cramjam``. An idempotent producer's batches (``InitProducerId``) are checked against its last batches
on the partition (``0029_kafka_producers.sql``), in the transaction that stores them: a batch sent again
is stored once, one out of order is refused. Transactional producers are not served yet (their batches
are refused with an error that names the reason; see ``docs/kafka.md``).
"""

from __future__ import annotations

import struct
from dataclasses import dataclass
from typing import Any

import cramjam
import psycopg
from kio.schema.errors import ErrorCode

from ..errors import PgStreamsError
from .codec import Request
from .handlers import Context, topic_record
from .records import (
    COMPRESSION_MASK,
    CONTROL_BIT,
    HEADER,
    TRANSACTIONAL_BIT,
    MalformedBatch,
    RecordTuple,
    crc_ok,
    read_header,
    read_records,
)


class RecordError(Exception):
    """A record batch that cannot be stored: the Kafka error code and a message for the producer."""

    def __init__(self, code: ErrorCode, message: str) -> None:
        super().__init__(message)
        self.code = code


#: Marks a produce with ``acks=0``: Kafka sends no reply to it.
NO_REPLY: dict[str, Any] = {}


async def produce(ctx: Context, req: Request) -> dict[str, Any]:
    """``Produce``: each partition's batches stored in one transaction; ``base_offset`` is the position of
    the first event stored."""
    body = req.body
    responses = []
    for t in body.topic_data:
        record = await topic_record(ctx, t.name)
        parts = []
        for pd in t.partition_data:
            index = int(pd.index)
            if record is None or not 0 <= index < record.partitions:
                parts.append(_error(index, ErrorCode.unknown_topic_or_partition, None))
                continue
            try:
                if body.transactional_id is not None:
                    raise RecordError(ErrorCode.invalid_request,
                                      "transactional producers are not served yet")
                batches = _batches(pd.records or b"")
                base = await _store(ctx, t.name, record.id, index, batches) if batches else -1
            except RecordError as exc:
                parts.append(_error(index, exc.code, str(exc)))
                continue
            except PgStreamsError as exc:
                parts.append(_error(index, ErrorCode.invalid_record, str(exc)))
                continue
            parts.append({"index": index, "error_code": ErrorCode.none, "base_offset": base,
                          "log_append_time": None, "log_start_offset": -1, "record_errors": [],
                          "error_message": None})
        responses.append({"name": t.name, "partition_responses": parts})
    if int(body.acks) == 0:
        return NO_REPLY
    return {"responses": responses, "throttle_time": 0}


def _error(index: int, code: ErrorCode, message: str | None) -> dict[str, Any]:
    return {"index": index, "error_code": code, "base_offset": -1, "log_append_time": None,
            "log_start_offset": -1, "record_errors": [], "error_message": message}


def _batches(records: bytes) -> list[Batch]:
    """The record batches in ``records`` (:class:`RecordError` for one that cannot be stored)."""
    out: list[Batch] = []
    view = memoryview(records)
    offset = 0
    while offset < len(view):
        if len(view) - offset < HEADER.size:
            break  # a partial batch at the end (Kafka's clients may send one): ignored, as Kafka does
        batch, size = read_batch(view, offset)
        offset += size
        _check(batch)
        out.append(batch)
    return out


_XERIAL = b"\x82SNAPPY\x00"


@dataclass(frozen=True)
class Batch:
    """A decoded record batch (v2): what ``Produce`` needs of it."""

    attributes: int
    producer_id: int
    producer_epoch: int
    base_sequence: int
    records: list[RecordTuple]


def read_batch(view: memoryview, offset: int) -> tuple[Batch, int]:
    """The record batch at ``offset`` and its size; its records decompressed (gzip, snappy, lz4, zstd)."""
    try:
        header = read_header(view, offset)
    except MalformedBatch as exc:
        raise RecordError(ErrorCode.corrupt_message, str(exc)) from None
    end = offset + header.size
    if header.magic != 2:
        raise RecordError(ErrorCode.unsupported_for_message_format,
                          f"record batches of magic {header.magic} are not served (only v2)")
    if end > len(view) or header.length < HEADER.size - 12:
        raise RecordError(ErrorCode.corrupt_message, "a record batch longer than its request")
    if not crc_ok(view, offset, header):
        raise RecordError(ErrorCode.corrupt_message, "a record batch whose CRC does not match")
    body: bytes | memoryview = view[offset + HEADER.size:end]
    codec = header.attributes & COMPRESSION_MASK
    if codec:
        body = _decompress(codec, bytes(body))
    try:
        records = read_records(body, header.count)
    except MalformedBatch as exc:
        raise RecordError(ErrorCode.corrupt_message, f"a malformed record: {exc}") from None
    return Batch(header.attributes, header.producer_id, header.producer_epoch, header.base_sequence,
                 records), end - offset


def _decompress(codec: int, data: bytes) -> bytes:
    try:
        if codec == 1:
            return bytes(cramjam.gzip.decompress(data))
        if codec == 2:
            if data.startswith(_XERIAL):  # the Java client's framing: blocks of raw snappy
                out, at = bytearray(), 16
                while at < len(data):
                    (size,) = struct.unpack_from(">i", data, at)
                    out += bytes(cramjam.snappy.decompress_raw(data[at + 4:at + 4 + size]))
                    at += 4 + size
                return bytes(out)
            return bytes(cramjam.snappy.decompress_raw(data))
        if codec == 3:
            return bytes(cramjam.lz4.decompress(data))
        if codec == 4:
            return bytes(cramjam.zstd.decompress(data))
    except Exception as exc:  # noqa: BLE001 - every codec raises its own kind
        raise RecordError(ErrorCode.corrupt_message, f"a record batch that does not decompress: {exc}") \
            from None
    raise RecordError(ErrorCode.unsupported_compression_type, f"compression codec {codec} is not Kafka's")


def _check(batch: Batch) -> None:
    if batch.attributes & (TRANSACTIONAL_BIT | CONTROL_BIT):
        raise RecordError(ErrorCode.invalid_request, "transactional record batches are not served yet")


def _events_of(batch: Batch) -> list[dict[str, Any]]:
    events = []
    for key, value, pairs in batch.records:
        try:
            headers: dict[str, str] = {}
            for name_bytes, header_value in pairs:
                name = name_bytes.decode("utf-8")
                if name in headers:
                    raise RecordError(ErrorCode.invalid_record, f"header {name!r} appears twice in a record")
                headers[name] = "" if header_value is None else header_value.decode("utf-8")
            text = None if key is None else key.decode("utf-8")
        except UnicodeDecodeError as exc:
            raise RecordError(ErrorCode.invalid_record,
                              f"a record's key or header is not UTF-8 text: {exc}") from None
        events.append({"key": text, "headers": headers or None, "value": value})
    return events


#: How many of a producer's last batches per partition are remembered (Kafka's limit on the batches an
#: idempotent producer has in flight, ``max.in.flight.requests.per.connection``).
REMEMBERED_BATCHES = 5


async def _store(ctx: Context, topic: str, topic_id: int, partition: int, batches: list[Batch]) -> int:
    """Store ``batches`` in ``partition`` in one transaction; the position of the first event (of a batch
    stored before, when it is one an idempotent producer sent again)."""
    client = ctx.client
    ex = client.store.ex
    if len(batches) == 1 and batches[0].producer_id < 0 and len(batches[0].records) == 1:
        # one record of no idempotent producer: the client's own publish (one round trip, its position)
        (e,) = _events_of(batches[0])
        stored = await client.publish(topic, e["value"], key=e["key"], headers=e["headers"],
                                      partition=partition)
        return stored.position
    first = -1
    async with client.connection() as conn, conn.transaction():
        for batch in batches:
            events = _events_of(batch)  # every record checked before anything is stored
            known = await _sequence_state(ex, conn, batch, topic_id, partition)
            if isinstance(known, int):  # stored before: answered with where it was stored
                first = known if first < 0 else first
                continue
            # one COPY in the transaction (no notification inside it: one after the commit, below); the
            # batch's first position found with the read index, above the topic's last before the COPY
            # (less one: a sequence not yet used reads as its first value, not as 0)
            floor = await client.store.last_position(topic_id, conn) - 1
            await client.publish_many(topic, [{**e, "partition": partition} for e in events], conn=conn)
            at = await client.store.first_position_of_transaction(conn, topic_id, partition, floor)
            at = -1 if at is None else at
            first = at if first < 0 else first
            if known is not None:
                seqs, counts, positions = known
                await ex.run("kafka_sequences_put", (
                    batch.producer_id, topic_id, partition, batch.producer_epoch,
                    [*seqs, batch.base_sequence][-REMEMBERED_BATCHES:],
                    [*counts, len(batch.records)][-REMEMBERED_BATCHES:],
                    [*positions, at][-REMEMBERED_BATCHES:]), conn=conn)
    client.sync.session.notifier.poke(topic_id)  # wake the topic's waiting consumers (coalesced)
    return first


Remembered = tuple[list[int], list[int], list[int]]


async def _sequence_state(ex: Any, conn: psycopg.AsyncConnection, batch: Batch, topic_id: int,
                          partition: int) -> Remembered | int | None:
    """For a batch of an idempotent producer: the producer's remembered batches on the partition (to be
    stored with this one), or the position of this batch when it was stored before; ``RecordError`` for a
    batch out of order or of an old epoch. ``None`` for a batch of no producer."""
    if batch.producer_id < 0:
        return None
    row = await ex.one("kafka_producer_epoch", (batch.producer_id,), conn=conn)
    if row is None:
        raise RecordError(ErrorCode.unknown_producer_id, f"producer id {batch.producer_id} is unknown")
    if batch.producer_epoch < row[0]:
        raise RecordError(ErrorCode.invalid_producer_epoch,
                          f"producer epoch {batch.producer_epoch} is older than {row[0]}")
    got = await ex.one("kafka_sequences_get", (batch.producer_id, topic_id, partition), conn=conn)
    if got is None or batch.producer_epoch > got[0]:  # a new producer, or a new epoch: from sequence 0
        if batch.base_sequence != 0:
            raise RecordError(ErrorCode.out_of_order_sequence_number,
                              f"the first batch of a producer epoch starts at sequence "
                              f"{batch.base_sequence}, not 0")
        return [], [], []
    seqs, counts, positions = list(got[1]), list(got[2]), list(got[3])
    for seq, count, position in zip(seqs, counts, positions, strict=True):
        if seq == batch.base_sequence and count == len(batch.records):
            return int(position)  # sent again: stored once
    expected = (seqs[-1] + counts[-1]) % 2**31
    if batch.base_sequence != expected:
        code = ErrorCode.duplicate_sequence_number if batch.base_sequence < seqs[0] \
            else ErrorCode.out_of_order_sequence_number
        raise RecordError(code, f"batch sequence {batch.base_sequence}, expected {expected}")
    return seqs, counts, positions


async def init_producer_id(ctx: Context, req: Request) -> dict[str, Any]:
    """``InitProducerId``: a new producer id (epoch 0), or, given a producer's id and current epoch, its
    next epoch (earlier epochs are then fenced). Transactional ids are not served yet."""
    body = req.body
    fail = {"throttle_time": 0, "producer_id": -1, "producer_epoch": -1}
    if body.transactional_id is not None:
        return {**fail, "error_code": ErrorCode.invalid_request}
    ex = ctx.client.store.ex
    pid = int(getattr(body, "producer_id", -1))
    epoch = int(getattr(body, "producer_epoch", -1))

    async def go(conn: psycopg.AsyncConnection) -> Any:
        if pid >= 0 and epoch >= 0:
            return await ex.one("kafka_producer_bump", (pid, epoch), conn=conn)
        return await ex.one("kafka_producer_new", (), conn=conn)

    row = await ctx.client.run(go)
    if row is None:
        return {**fail, "error_code": ErrorCode.invalid_producer_epoch}
    return {"throttle_time": 0, "error_code": ErrorCode.none, "producer_id": int(row[0]),
            "producer_epoch": int(row[1])}
