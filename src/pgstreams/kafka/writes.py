"""``Produce``: Kafka records become pgstreams events.

A record's value is stored as bytes (an event whose value a pgstreams consumer reads as ``bytes``), its
key as text (UTF-8), its headers as the event's headers (UTF-8, one value per name), in the partition the
client chose. The record batches of one partition are stored in one transaction, all or none. Their
time is the time of the commit (Kafka's ``LogAppendTime``), not the producer's.

Batches compressed with any of Kafka's codecs (gzip, snappy, lz4, zstd) are decompressed with
``cramjam``. Not yet served here: idempotent and transactional producers (their batches are refused with
an error that names the reason; see ``docs/kafka.md``).
"""

from __future__ import annotations

import struct
from dataclasses import dataclass
from typing import Any

import cramjam
import crc32c
import psycopg
from kio.records.readers import read_record
from kio.records.schema import Record
from kio.schema.errors import ErrorCode

from ..errors import PgStreamsError
from .codec import Request
from .handlers import Context
from .reads import topic_record

#: The attribute bits of a record batch: its compression codec, and whether it is transactional or a
#: control batch.
COMPRESSION_MASK, TRANSACTIONAL_BIT, CONTROL_BIT = 0x07, 0x10, 0x20


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
                events = _events(pd.records or b"")
                base = await _store(ctx, t.name, index, events) if events else -1
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


def _events(records: bytes) -> list[dict[str, Any]]:
    """The events of the record batches in ``records`` (:class:`RecordError` for one that cannot be
    stored)."""
    out: list[dict[str, Any]] = []
    view = memoryview(records)
    offset = 0
    while offset < len(view):
        if len(view) - offset < _HEADER.size:
            break  # a partial batch at the end (Kafka's clients may send one): ignored, as Kafka does
        batch, size = read_batch(view, offset)
        offset += size
        out.extend(_batch_events(batch))
    return out


#: A record batch's header (v2): base offset, length, leader epoch, magic, CRC-32C, attributes, last
#: offset delta, base and max timestamps, producer id and epoch, base sequence, record count.
_HEADER = struct.Struct(">qiibIhiqqqhii")
_XERIAL = b"\x82SNAPPY\x00"


@dataclass(frozen=True)
class Batch:
    """A decoded record batch (v2): what ``Produce`` needs of it."""

    attributes: int
    producer_id: int
    records: tuple[Record, ...]


def read_batch(view: memoryview, offset: int) -> tuple[Batch, int]:
    """The record batch at ``offset`` and its size; its records decompressed (gzip, snappy, lz4, zstd)."""
    try:
        (base_offset, length, _epoch, magic, crc, attributes, _last, base_ts, _max_ts, producer_id,
         _producer_epoch, _sequence, count) = _HEADER.unpack_from(view, offset)
    except struct.error as exc:
        raise RecordError(ErrorCode.corrupt_message, f"a truncated record batch: {exc}") from None
    end = offset + 12 + length
    if magic != 2:
        raise RecordError(ErrorCode.unsupported_for_message_format,
                          f"record batches of magic {magic} are not served (only v2)")
    if end > len(view) or length < _HEADER.size - 12:
        raise RecordError(ErrorCode.corrupt_message, "a record batch longer than its request")
    if crc32c.crc32c(view[offset + 21:end]) != crc:
        raise RecordError(ErrorCode.corrupt_message, "a record batch whose CRC does not match")
    body: bytes | memoryview = view[offset + _HEADER.size:end]
    codec = attributes & COMPRESSION_MASK
    if codec:
        body = _decompress(codec, bytes(body))
    records = []
    at = 0
    try:
        for _ in range(count):
            record, used = read_record(body, base_ts, base_offset, at)
            records.append(record)
            at += used
    except (ValueError, IndexError) as exc:
        raise RecordError(ErrorCode.corrupt_message, f"a malformed record: {exc}") from None
    return Batch(attributes, producer_id, tuple(records)), end - offset


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


def _batch_events(batch: Batch) -> list[dict[str, Any]]:
    if batch.attributes & (TRANSACTIONAL_BIT | CONTROL_BIT):
        raise RecordError(ErrorCode.invalid_request, "transactional record batches are not served yet")
    if batch.producer_id >= 0:
        raise RecordError(ErrorCode.invalid_request,
                          "idempotent producers are not served yet: set enable.idempotence=false")
    events = []
    for rec in batch.records:
        try:
            key = None if rec.key is None else bytes(rec.key).decode("utf-8")
            headers: dict[str, str] = {}
            for h in rec.headers:
                name = bytes(h.key or b"").decode("utf-8")
                if name in headers:
                    raise RecordError(ErrorCode.invalid_record, f"header {name!r} appears twice in a record")
                headers[name] = "" if h.value is None else bytes(h.value).decode("utf-8")
        except UnicodeDecodeError as exc:
            raise RecordError(ErrorCode.invalid_record,
                              f"a record's key or header is not UTF-8 text: {exc}") from None
        events.append({"key": key, "headers": headers or None,
                       "value": None if rec.value is None else bytes(rec.value)})
    return events


async def _store(ctx: Context, topic: str, partition: int, events: list[dict[str, Any]]) -> int:
    """Store ``events`` in ``partition`` in one transaction; the position of the first."""
    client = ctx.client

    async def attempt(conn: psycopg.AsyncConnection) -> int:
        first = -1
        async with conn.transaction():
            for e in events:
                stored = await client.publish(topic, e["value"], key=e["key"], headers=e["headers"],
                                              partition=partition, conn=conn)
                if first < 0:
                    first = stored.position
        return first

    async with client.connection() as conn:
        return await attempt(conn)
