"""Kafka's record batches (format v2, "magic 2"), read and written without an object per record.

A batch is a header (base offset, length, leader epoch, magic, CRC-32C of the rest, attributes, last offset
delta, base and max timestamps, producer id, epoch and base sequence, record count) followed by the
records, each a zig-zag varint length, attributes, timestamp and offset deltas, key, value and headers
(https://kafka.apache.org/documentation/#recordbatch). ``Produce`` and ``Fetch`` carry thousands of records
a second, so both directions work on bytes directly: a record becomes a tuple of its key, value and
headers when read, and a row of the event store becomes its bytes when written.

:class:`RecordError` and :func:`decompress` serve this format and the legacy message sets
(:mod:`pgstreams.kafka.legacy`) alike.
"""

from __future__ import annotations

import struct
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import timedelta
from typing import Any, Final

import cramjam
import crc32c
from kio.schema.errors import ErrorCode

#: The attribute bits of a record batch: its compression codec, its timestamp type, and whether it is
#: transactional or a control batch.
COMPRESSION_MASK: Final = 0x07
TRANSACTIONAL_BIT: Final = 0x10
CONTROL_BIT: Final = 0x20

#: A record batch's header (v2): base offset, length, leader epoch, magic, CRC-32C, attributes, last
#: offset delta, base and max timestamps, producer id and epoch, base sequence, record count.
HEADER: Final = struct.Struct(">qiibIhiqqqhii")
#: Bytes of the header covered by the CRC: from the attributes on.
_CRC_FROM: Final = 21
_TAIL = struct.Struct(">hiqqqhii")  # the header from the attributes on

#: A record read from a batch: its key, value (``None``: null) and headers (name and value pairs; a
#: header's value may be null).
RecordTuple = tuple[bytes | None, bytes | None, list[tuple[bytes, bytes | None]]]


class MalformedBatch(ValueError):
    """A record batch whose bytes do not follow the format (truncated, or its lengths disagree)."""


class RecordError(Exception):
    """Records that cannot be stored: the Kafka error code and a message for the producer."""

    def __init__(self, code: ErrorCode, message: str) -> None:
        super().__init__(message)
        self.code = code


#: The compression codecs of Kafka's attributes (the low three bits), by number.
CODECS: Final = {1: "gzip", 2: "snappy", 3: "lz4", 4: "zstd"}

_XERIAL = b"\x82SNAPPY\x00"


def decompress(codec: int, data: bytes) -> bytes:
    """``data`` decompressed with Kafka's compression ``codec`` (1 gzip, 2 snappy: the Java client's xerial
    framing or raw, 3 lz4: a frame, 4 zstd); :class:`RecordError` when it does not decompress
    (``CORRUPT_MESSAGE``) or the codec is none of Kafka's (``UNSUPPORTED_COMPRESSION_TYPE``)."""
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
        raise RecordError(ErrorCode.corrupt_message,
                          f"records compressed with {CODECS[codec]} that do not decompress: {exc}") from None
    raise RecordError(ErrorCode.unsupported_compression_type, f"compression codec {codec} is not Kafka's")


@dataclass(frozen=True, slots=True)
class BatchHeader:
    """What a record batch's header says (the fields a broker uses)."""

    base_offset: int
    length: int
    magic: int
    crc: int
    attributes: int
    last_offset_delta: int
    base_timestamp: int
    producer_id: int
    producer_epoch: int
    base_sequence: int
    count: int

    @property
    def size(self) -> int:
        """The whole batch's size in bytes (the length counts from after the length field)."""
        return self.length + 12


def read_header(view: memoryview | bytes, offset: int) -> BatchHeader:
    """The header of the batch at ``offset`` (:class:`MalformedBatch` when truncated)."""
    try:
        (base_offset, length, _epoch, magic, crc, attributes, last_delta, base_ts, _max_ts, producer_id,
         producer_epoch, base_sequence, count) = HEADER.unpack_from(view, offset)
    except struct.error as exc:
        raise MalformedBatch(f"a truncated record batch: {exc}") from None
    return BatchHeader(base_offset, length, magic, crc, attributes, last_delta, base_ts, producer_id,
                       producer_epoch, base_sequence, count)


def crc_ok(view: memoryview | bytes, offset: int, header: BatchHeader) -> bool:
    """Whether the CRC-32C of the batch at ``offset`` matches its header's."""
    return bool(crc32c.crc32c(view[offset + _CRC_FROM:offset + header.size]) == header.crc)


def _varint(buf: bytes | memoryview, at: int) -> tuple[int, int]:
    """The zig-zag varint at ``at`` and the offset after it."""
    b = buf[at]
    if b < 0x80:
        return (b >> 1) ^ -(b & 1), at + 1
    result, shift = b & 0x7F, 7
    while True:
        at += 1
        b = buf[at]
        result |= (b & 0x7F) << shift
        if b < 0x80:
            return (result >> 1) ^ -(result & 1), at + 1
        shift += 7
        if shift > 63:
            raise MalformedBatch("a varint longer than 10 bytes")


def _bytes(buf: bytes | memoryview, at: int) -> tuple[bytes | None, int]:
    n, at = _varint(buf, at)
    if n < 0:
        if n != -1:
            raise MalformedBatch(f"a field of length {n}")
        return None, at
    end = at + n
    if end > len(buf):
        raise MalformedBatch("a field longer than its batch")
    return bytes(buf[at:end]), end


def read_records(body: bytes | memoryview, count: int) -> list[RecordTuple]:
    """The ``count`` records in ``body`` (a batch's bytes after its header, decompressed)."""
    if not isinstance(body, bytes):
        body = bytes(body)  # indexing bytes is faster than indexing a memoryview
    out: list[RecordTuple] = []
    append = out.append
    at = 0
    try:
        for _ in range(count):
            # one-byte varints (most lengths and deltas) are read inline; longer ones by _varint
            b = body[at]
            if b < 0x80:
                length, at = (b >> 1) ^ -(b & 1), at + 1
            else:
                length, at = _varint(body, at)
            end = at + length
            at += 1  # attributes (unused)
            at = at + 1 if body[at] < 0x80 else _varint(body, at)[1]  # timestamp delta (unused)
            at = at + 1 if body[at] < 0x80 else _varint(body, at)[1]  # offset delta (unused)
            b = body[at]
            if b < 0x80:
                n, at = (b >> 1) ^ -(b & 1), at + 1
            else:
                n, at = _varint(body, at)
            if n >= 0:
                key: bytes | None = body[at:at + n]
                at += n
            elif n == -1:
                key = None
            else:
                raise MalformedBatch(f"a key of length {n}")
            b = body[at]
            if b < 0x80:
                n, at = (b >> 1) ^ -(b & 1), at + 1
            else:
                n, at = _varint(body, at)
            if n >= 0:
                value: bytes | None = body[at:at + n]
                at += n
            elif n == -1:
                value = None
            else:
                raise MalformedBatch(f"a value of length {n}")
            headers: list[tuple[bytes, bytes | None]] = []
            if body[at] == 0:
                at += 1
            else:
                n, at = _varint(body, at)
                for _h in range(n):
                    name, at = _bytes(body, at)
                    hvalue, at = _bytes(body, at)
                    headers.append((name or b"", hvalue))
            if at != end:
                raise MalformedBatch("a record whose fields do not add up to its length")
            append((key, value, headers))
    except IndexError:
        raise MalformedBatch("a record longer than its batch") from None
    return out


def _zigzag(n: int) -> bytes:
    z = (n << 1) ^ (n >> 63)
    out = bytearray()
    while z >= 0x80:
        out.append((z & 0x7F) | 0x80)
        z >>= 7
    out.append(z)
    return bytes(out)


#: The zig-zag varints of -1 to 16,382, ready made (lengths, deltas and counts of most records).
_SMALL: Final = [_zigzag(n) for n in range(-1, 16383)]


def varint(n: int) -> bytes:
    """``n`` as a zig-zag varint."""
    return _SMALL[n + 1] if -1 <= n < 16382 else _zigzag(n)


_ZERO = b"\x00"
_NULL = b"\x01"  # the zig-zag varint of -1: a null key or value
_MILLIS = timedelta(milliseconds=1)


def write_batch(rows: Sequence[Sequence[Any]], budget: int, first: bool) -> bytes:
    """One uncompressed record batch of event-store rows (``partition, position, xid, created since the
    epoch, kind, key, payload, headers``), offsets their positions, timestamps their creation times: the
    first row always when ``first``, then rows while the batch stays within ``budget`` bytes; empty when
    no row fits."""
    if not rows:
        return b""
    parts: list[bytes] = []
    size = HEADER.size
    base_offset = int(rows[0][1])
    base_ts = rows[0][3] // _MILLIS
    max_ts = base_ts
    last = base_offset
    for row in rows:
        position, since, key, payload, headers = row[1], row[3], row[5], row[6], row[7]
        ts = since // _MILLIS
        if headers:
            hparts = [varint(len(headers))]
            for name, value in headers.items():
                hn, hv = name.encode(), value.encode()
                hparts += (varint(len(hn)), hn, varint(len(hv)), hv)
            head = b"".join(hparts)
        else:
            head = _ZERO
        if key is None:
            k = _NULL
        else:
            kb = key.encode()
            k = varint(len(kb)) + kb
        if payload is None:
            v = _NULL
        else:
            value = payload if type(payload) is bytes else bytes(payload)
            v = varint(len(value)) + value
        body = b"".join((_ZERO, varint(ts - base_ts), varint(position - base_offset), k, v, head))
        record = varint(len(body)) + body
        if parts and size + len(record) > budget:
            break
        if not parts and not first and size + len(record) > budget:
            return b""
        parts.append(record)
        size += len(record)
        last = position
        if ts > max_ts:
            max_ts = ts
    tail = _TAIL.pack(0, last - base_offset, base_ts, max_ts, -1, -1, -1, len(parts))
    records = b"".join(parts)
    crc = crc32c.crc32c(records, crc32c.crc32c(tail))
    head = HEADER.pack(base_offset, size - 12, 0, 2, crc, 0, last - base_offset, base_ts, max_ts, -1, -1, -1,
                       len(parts))
    return head + records
