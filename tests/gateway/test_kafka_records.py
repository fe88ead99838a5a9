"""The gateway's record batch codec (``pgstreams.kafka.records``) against kio's independent reader and
writer of the same format: what one writes the other reads, field by field."""

from __future__ import annotations

import io
from datetime import UTC, datetime, timedelta

import pytest
from kio.records.readers import read_record
from kio.records.schema import NewRecordBatch, Record, RecordHeader
from kio.records.writers import write_new_batch
from kio.static.primitive import TZAwareMicros, i8, i16, i32, i64

from pgstreams.kafka.records import (
    HEADER,
    MalformedBatch,
    crc_ok,
    read_header,
    read_records,
    varint,
    write_batch,
)

_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)


def _row(position: int, seconds: float, key: str | None, value: bytes | None,
         headers: dict[str, str] | None = None) -> tuple[object, ...]:
    return (0, position, 1, timedelta(seconds=seconds), 0, key, value, headers)


def test_a_written_batch_reads_back_in_kio_with_offsets_times_keys_values_and_headers() -> None:
    rows = [_row(10, 1_700_000_000.123, "k1", b"v" * 300, {"h": "x", "trace": "é"}),
            _row(13, 1_700_000_001.5, None, b""),
            _row(20_000, 1_700_000_000.0, "", b"\x00\xff", None)]
    data = write_batch(rows, 10**6, first=True)
    header = read_header(data, 0)
    assert header.size == len(data) and header.magic == 2 and crc_ok(data, 0, header)
    assert header.base_offset == 10 and header.last_offset_delta == 20_000 - 10 and header.count == 3
    assert header.base_timestamp == 1_700_000_000_123 and header.producer_id == -1
    body = data[HEADER.size:]
    at, got = 0, []
    for _ in range(header.count):
        rec, used = read_record(body, i64(header.base_timestamp), i64(header.base_offset), at)
        at += used
        got.append(rec)
    assert at == len(body)
    assert [int(r.offset) for r in got] == [10, 13, 20_000]
    assert [r.key for r in got] == [b"k1", None, b""]
    assert [r.value for r in got] == [b"v" * 300, b"", b"\x00\xff"]
    assert [{h.key: h.value for h in r.headers} for r in got] == [
        {b"h": b"x", b"trace": "é".encode()}, {}, {}]
    # kio keeps whole seconds of a record's time; the delta itself is in milliseconds
    assert [r.timestamp.timestamp() for r in got] == [1_700_000_000, 1_700_000_001, 1_700_000_000]
    assert read_records(body, 3)[1] == (None, b"", [])


def test_a_batch_written_by_kio_reads_back_with_null_values_and_headers() -> None:
    records = tuple(
        Record(attributes=i8(0), timestamp=TZAwareMicros.parse(_EPOCH + timedelta(seconds=i)),
               offset=i64(i), key=None if i % 2 else f"key{i}".encode(), value=None if i == 3 else b"x" * i,
               headers=(RecordHeader(key=b"n", value=None if i == 2 else b"v"),) if i else ())
        for i in range(5))
    buf = io.BytesIO()
    write_new_batch(buf, NewRecordBatch(producer_id=i64(7), producer_epoch=i16(1), base_sequence=i32(40),
                                        records=records, attributes=i16(0)))
    data = buf.getvalue()
    header = read_header(data, 0)
    assert crc_ok(data, 0, header) and header.count == 5
    assert (header.producer_id, header.producer_epoch, header.base_sequence) == (7, 1, 40)
    got = read_records(memoryview(data)[HEADER.size:], header.count)
    assert got == [(b"key0", b"", []), (None, b"x", [(b"n", b"v")]), (b"key2", b"xx", [(b"n", None)]),
                   (None, None, [(b"n", b"v")]), (b"key4", b"xxxx", [(b"n", b"v")])]


def test_a_changed_byte_fails_the_crc_and_a_truncated_record_is_malformed() -> None:
    data = bytearray(write_batch([_row(1, 1.0, "k", b"value")], 10**6, first=True))
    header = read_header(data, 0)
    data[-1] ^= 0xFF
    assert not crc_ok(data, 0, header)
    with pytest.raises(MalformedBatch):
        read_records(bytes(data[HEADER.size:-3]), header.count)
    with pytest.raises(MalformedBatch):
        read_header(bytes(data[:20]), 0)


def test_the_byte_budget_keeps_whole_records_and_the_first_one_always() -> None:
    rows = [_row(i, 1.0, "k", b"v" * 100) for i in range(10)]
    whole = write_batch(rows, 10**6, first=True)
    assert read_header(whole, 0).count == 10
    record = (len(whole) - HEADER.size) // 10  # every record is as large
    some = write_batch(rows, 400, first=True)
    assert read_header(some, 0).count == (400 - HEADER.size) // record == 3 and len(some) <= 400
    assert read_header(write_batch(rows, 10, first=True), 0).count == 1  # the first, however large
    assert write_batch(rows, 10, first=False) == b""  # not the first of the reply: nothing that fits


@pytest.mark.parametrize("n", [-1, 0, 1, 63, 64, 8191, 16381, 16382, 2**31, -(2**40)])
def test_varints_are_zig_zag(n: int) -> None:
    z = (n << 1) ^ (n >> 63)
    out = bytearray()
    while True:
        if z < 0x80:
            out.append(z)
            break
        out.append((z & 0x7F) | 0x80)
        z >>= 7
    assert varint(n) == bytes(out)
