"""``Produce``: Kafka records become pgstreams events.

A record's value is stored as bytes (an event whose value a pgstreams consumer reads as ``bytes``), its
key as text (UTF-8), its headers as the event's headers (UTF-8, one value per name), in the partition the
client chose. The record batches of one partition are stored in one transaction, all or none. Their
time is the time of the commit (Kafka's ``LogAppendTime``), not the producer's.

Not yet served here: compressed batches, idempotent and transactional producers (their batches are
refused with an error that names the reason; see ``docs/kafka.md``).
"""

from __future__ import annotations

from typing import Any

import psycopg
from kio.records.readers import read_batch
from kio.records.schema import RecordBatch
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
        if len(view) - offset < 61:
            break  # a partial batch at the end (Kafka's clients may send one): ignored, as Kafka does
        try:
            batch, size = read_batch(view, offset)
        except (ValueError, IndexError) as exc:
            if _compressed(view, offset):
                raise RecordError(ErrorCode.unsupported_compression_type,
                                  "compressed record batches are not served yet") from None
            raise RecordError(ErrorCode.corrupt_message, f"a malformed record batch: {exc}") from None
        offset += size
        out.extend(_batch_events(batch))
    return out


def _compressed(view: memoryview, offset: int) -> bool:
    attributes = int.from_bytes(view[offset + 21:offset + 23], "big", signed=True)
    return bool(attributes & COMPRESSION_MASK)


def _batch_events(batch: RecordBatch) -> list[dict[str, Any]]:
    if batch.attributes & COMPRESSION_MASK:
        raise RecordError(ErrorCode.unsupported_compression_type,
                          "compressed record batches are not served yet")
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
