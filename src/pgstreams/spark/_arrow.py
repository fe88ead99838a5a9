"""Arrow conversions of the Spark data source, vectorised (no Python loop over rows except for headers).

Reading: a chunk query (``scan_pages`` / ``chunk_ordered`` in ``queries.sql``) returns each column as one
byte string built by PostgreSQL; :func:`decode_chunk` wraps those bytes into Arrow arrays.

Writing: :func:`encode_copy` turns an Arrow record batch into the text format of ``COPY ... FROM STDIN``
with Arrow compute functions and numpy.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from ..errors import InvalidArgument
from ._sql import DELIMITER, NULL_MARK, OPTIONAL_COLUMNS, Layout

#: Microseconds between the Unix epoch and PostgreSQL's epoch (2000-01-01).
PG_EPOCH_US = 946_684_800_000_000
#: Variable-length columns of a chunk, in the order of their lengths and data.
_VAR_COLUMNS = ("value", "key", "event_type", "event_id", "correlation_id", "causation_id", "headers")
HEADERS_TYPE = pa.map_(pa.string(), pa.string())


def _offsets(lengths: np.ndarray) -> tuple[np.ndarray, np.ndarray | None, int]:
    """Arrow offsets, validity bitmap (``None`` if no nulls) and null count from lengths (-1 = NULL)."""
    n = len(lengths)
    valid = lengths >= 0
    nulls = int(n - np.count_nonzero(valid))
    offsets = np.zeros(n + 1, dtype=np.int32)
    np.cumsum(np.where(valid, lengths, 0), out=offsets[1:])
    bitmap = np.packbits(valid, bitorder="little") if nulls else None
    return offsets, bitmap, nulls


def _var_array(typ: pa.DataType, lengths: np.ndarray, data: Any) -> pa.Array:
    """A string or binary array from per-row lengths (-1 = NULL) and the values back to back (a
    bytes-like object, or ``None`` when there are none)."""
    n = len(lengths)
    offsets, bitmap, nulls = _offsets(lengths)
    if nulls == n:
        return pa.nulls(n, typ)
    return pa.Array.from_buffers(typ, n, [None if bitmap is None else pa.py_buffer(bitmap),
                                          pa.py_buffer(offsets), pa.py_buffer(b"" if data is None else data)],
                                 null_count=nulls)


def split_delimited(data: bytes | None, n: int, present: int) -> tuple[np.ndarray, np.ndarray] | None:
    """Per-row lengths (-1 = NULL) and the texts back to back of a delimited column: ``n`` texts
    separated by byte 0x01, NULL written as the one-byte text 0x02, ``present`` of them not NULL.

    Returns ``None`` when that is ambiguous: a text holds 0x01 (more separators than ``n - 1``) or is
    the text 0x02 (more NULL marks than NULLs); the column must then be read by length.
    """
    if present == 0:
        return np.full(n, -1, dtype=np.int32), np.empty(0, dtype=np.uint8)
    buf = np.frombuffer(data or b"", dtype=np.uint8)
    separator = buf == DELIMITER
    cuts = np.flatnonzero(separator)
    if len(cuts) != n - 1:
        return None
    starts = np.empty(n, dtype=np.int64)
    starts[0] = 0
    starts[1:] = cuts + 1
    ends = np.empty(n, dtype=np.int64)
    ends[:-1] = cuts
    ends[-1] = len(buf)
    lengths = (ends - starts).astype(np.int32)
    nulls = lengths == 1
    nulls[nulls] = buf[starts[nulls]] == NULL_MARK
    null_count = int(np.count_nonzero(nulls))
    if null_count != n - present:
        return None
    if null_count:
        keep = ~separator
        keep[starts[nulls]] = False
        lengths[nulls] = -1
        return lengths, buf[keep]
    return lengths, buf[~separator]


def constant_string(value: str, n: int) -> pa.Array:
    """A string array of ``n`` copies of ``value`` (built from buffers)."""
    raw = value.encode("utf-8")
    offsets = np.arange(0, (n + 1) * len(raw), len(raw) or 1, dtype=np.int32)[: n + 1]
    if not raw:
        offsets = np.zeros(n + 1, dtype=np.int32)
    return pa.Array.from_buffers(pa.string(), n, [None, pa.py_buffer(offsets), pa.py_buffer(raw * n)])


def _headers(lengths: np.ndarray, data: Any, typ: pa.DataType) -> pa.Array:
    """The headers column from the JSON texts of the rows that have headers (one ``json.loads`` call)."""
    n = len(lengths)
    valid = lengths >= 0
    count = int(np.count_nonzero(valid))
    if count == 0 or data is None or len(data) == 0:
        return pa.nulls(n, typ)
    sizes = lengths[valid].astype(np.int64)
    starts = np.concatenate([[0], np.cumsum(sizes)[:-1]])
    # the objects are back to back: put commas between them and brackets around, then parse once
    joined = np.insert(np.frombuffer(data, dtype=np.uint8), starts[1:], ord(","))
    objects = json.loads(b"[" + joined.tobytes() + b"]")
    compact = pa.array(objects, type=typ)
    if count == n:
        return compact
    index = np.cumsum(valid, dtype=np.int64) - 1
    return compact.take(pa.array(index, mask=~valid))


def decode_chunk(row: Sequence[Any], topic: str, partition: int | None, schema: pa.Schema,
                 layout: Layout) -> tuple[pa.RecordBatch | None, int | None, dict[str, str]]:
    """The record batch of one chunk row (queried with the optional columns in ``layout``), the cursor
    of its last event (its position) for ordered chunks, and the optional columns this chunk needs in
    another form (``{column: "delimited" | "by_length"}``: values in a column not queried, ambiguous
    delimited texts; then the chunk must be queried again with them and there is no batch).

    ``partition`` is the topic partition of every event of the chunk, or ``None`` for a page scan chunk
    (``scan_pages``), whose column 10 holds the partition of each event.

    Returns ``(None, None, {})`` for an empty chunk.
    """
    if not row[0]:
        return None, None, {}
    data = dict(zip(_VAR_COLUMNS, row[3:10], strict=True))
    counts = np.frombuffer(row[11], dtype=">i8").reshape(-1, len(OPTIONAL_COLUMNS)).sum(axis=0)
    present = dict(zip(OPTIONAL_COLUMNS, counts.tolist(), strict=True))
    needs = {c: "delimited" for c in OPTIONAL_COLUMNS
             if present[c] and c not in layout.delimited and c not in layout.by_length}
    positions = np.frombuffer(row[0], dtype=">i8").astype(np.int64)
    n = len(positions)
    absent = np.full(n, -1, dtype=np.int32)
    length_of: dict[str, np.ndarray] = {}
    for c in layout.delimited:
        split = split_delimited(data[c], n, present[c])
        if split is None:
            needs[c] = "by_length"
        else:
            length_of[c], data[c] = split
    if needs:
        return None, None, needs
    created = np.frombuffer(row[1], dtype=">i8").astype(np.int64) + PG_EPOCH_US
    lengths = np.frombuffer(row[2], dtype=">i4").astype(np.int32).reshape(n, 1 + len(layout.by_length))
    length_of.update({c: lengths[:, 1 + i] for i, c in enumerate(layout.by_length)})

    def strings(name: str) -> pa.Array:
        return _var_array(pa.string(), length_of.get(name, absent), data[name])

    arrays: dict[str, pa.Array] = {
        "topic": constant_string(topic, n),
        "partition": pa.array(np.full(n, partition, dtype=np.int32) if partition is not None else
                              np.frombuffer(row[10], dtype=">i4").astype(np.int32)),
        "position": pa.array(positions),
        "value": _var_array(pa.binary(), lengths[:, 0], data["value"]),
        "key": strings("key"),
        "event_type": strings("event_type"),
        "event_id": strings("event_id"),
        "correlation_id": strings("correlation_id"),
        "causation_id": strings("causation_id"),
        "headers": _headers(length_of.get("headers", absent), data["headers"], schema.field("headers").type),
        "created_at": pa.Array.from_buffers(pa.timestamp("us", tz="UTC"), n, [None, pa.py_buffer(created)]),
    }
    batch = pa.RecordBatch.from_arrays([arrays[f.name] for f in schema], schema=schema)
    return batch, (int(positions[-1]) if partition is not None else None), {}


# --------------------------------------------------------------------------------------------------------
# writing

_HEX = np.frombuffer(b"0123456789abcdef", dtype=np.uint8)
_ESCAPES = (("\\", "\\\\"), ("\t", "\\t"), ("\n", "\\n"), ("\r", "\\r"))
_NULL = "\\N"


def _as_binary(arr: pa.Array) -> pa.Array:
    if pa.types.is_large_string(arr.type) or pa.types.is_large_binary(arr.type):
        arr = arr.cast(pa.large_binary()).cast(pa.binary())
    elif pa.types.is_string(arr.type):
        arr = arr.cast(pa.binary())
    elif pa.types.is_binary_view(arr.type) or pa.types.is_string_view(arr.type):
        arr = arr.cast(pa.binary())
    return arr


def hex_bytea(arr: pa.Array) -> pa.Array:
    """A binary array's values as COPY text ``bytea`` input: ``\\\\x`` followed by hex digits."""
    arr = _as_binary(arr)
    if arr.offset:
        arr = pa.concat_arrays([arr])  # re-base the offsets of a slice
    n = len(arr)
    offsets = np.frombuffer(arr.buffers()[1], dtype=np.int32, count=n + 1)
    start, end = int(offsets[0]), int(offsets[-1])
    data = np.frombuffer(arr.buffers()[2], dtype=np.uint8, count=end)[start:end] if end > start else \
        np.zeros(0, dtype=np.uint8)
    digits = np.empty((len(data), 2), dtype=np.uint8)
    digits[:, 0] = _HEX[data >> 4]
    digits[:, 1] = _HEX[data & 0x0F]
    hexed = pa.Array.from_buffers(pa.binary(), n, [arr.buffers()[0], pa.py_buffer((offsets - start) * 2),
                                                   pa.py_buffer(digits)], null_count=arr.null_count)
    return pc.binary_join_element_wise(pa.scalar(b"\\\\x"), hexed, pa.scalar(b""))


def escape_text(arr: pa.Array) -> pa.Array:
    """Escape a string array for the COPY text format (backslash, tab, newline, carriage return)."""
    arr = _as_binary(arr)
    if len(arr) == 0 or arr.null_count == len(arr):
        return arr
    if not pc.any(pc.match_substring_regex(arr, r"[\\\t\n\r]")).as_py():
        return arr
    for old, new in _ESCAPES:
        arr = pc.replace_substring(arr, old.encode(), new.encode())
    return arr


def headers_json(arr: pa.Array) -> pa.Array:
    """A ``map<string,string>`` array as JSON object texts (NULL stays NULL)."""
    out: list[str | None] = []
    for i, entries in enumerate(arr.to_pylist()):
        if entries is None:
            out.append(None)
            continue
        obj: dict[str, str] = {}
        for k, v in entries:
            if v is None:
                raise InvalidArgument(f"column 'headers': row {i} has a NULL value for header {k!r}")
            obj[k] = v
        out.append(json.dumps(obj, separators=(",", ":"), ensure_ascii=False) if obj else None)
    return pa.array(out, type=pa.string())


def _murmur2_partitions(keys: pa.Array, partitions: int) -> np.ndarray:
    """Kafka's ``(murmur2(utf8(key)) & 0x7fffffff) % partitions`` for every non-null key (-1 for NULL)."""
    keys = _as_binary(keys)
    if keys.offset:
        keys = pa.concat_arrays([keys])
    n = len(keys)
    out = np.full(n, -1, dtype=np.int64)
    offsets = np.frombuffer(keys.buffers()[1], dtype=np.int32, count=n + 1).astype(np.int64)
    data_buf = keys.buffers()[2]
    data = np.frombuffer(data_buf, dtype=np.uint8) if data_buf is not None else np.zeros(0, np.uint8)
    data = np.concatenate([data, np.zeros(8, dtype=np.uint8)])
    lengths = offsets[1:] - offsets[:-1]
    valid = np.ones(n, dtype=bool) if keys.null_count == 0 else \
        np.asarray(keys.is_valid().to_numpy(zero_copy_only=False), dtype=bool)
    m = np.uint32(0x5BD1E995)
    with np.errstate(over="ignore"):
        for length in np.unique(lengths[valid]):
            rows = np.nonzero(valid & (lengths == length))[0]
            length = int(length)
            matrix = data[offsets[rows][:, None] + np.arange(length)].astype(np.uint32) if length else \
                np.zeros((len(rows), 0), dtype=np.uint32)
            h = np.full(len(rows), (0x9747B28C ^ length) & 0xFFFFFFFF, dtype=np.uint32)
            for i in range(length // 4):
                k = (matrix[:, 4 * i] | (matrix[:, 4 * i + 1] << 8) | (matrix[:, 4 * i + 2] << 16)
                     | (matrix[:, 4 * i + 3] << 24)).astype(np.uint32)
                k = k * m
                k ^= k >> np.uint32(24)
                k = k * m
                h = h * m
                h ^= k
            rest, tail = length % 4, (length // 4) * 4
            if rest == 3:
                h ^= matrix[:, tail + 2] << np.uint32(16)
            if rest >= 2:
                h ^= matrix[:, tail + 1] << np.uint32(8)
            if rest >= 1:
                h ^= matrix[:, tail]
                h = h * m
            h ^= h >> np.uint32(13)
            h = h * m
            h ^= h >> np.uint32(15)
            out[rows] = (h & np.uint32(0x7FFFFFFF)).astype(np.int64) % partitions
    return out


class Partitioner:
    """Chooses the partition of each row: the ``partition`` column, else the key's hash, else round-robin
    starting from ``start``."""

    def __init__(self, partitions: int, start: int) -> None:
        self.partitions = partitions
        self.next = start % partitions

    def assign(self, explicit: pa.Array | None, keys: pa.Array | None, n: int) -> np.ndarray:
        """Partition numbers for ``n`` rows; raises :class:`InvalidArgument` for an out-of-range one."""
        out = np.full(n, -1, dtype=np.int64)
        if explicit is not None:
            vals = np.asarray(explicit.fill_null(-1).to_numpy(zero_copy_only=False), dtype=np.int64)
            given = vals >= 0
            bad = given & (vals >= self.partitions) | (np.asarray(explicit.is_valid()) & (vals < 0))
            if bad.any():
                raise InvalidArgument(
                    f"column 'partition': {int(vals[np.nonzero(bad)[0][0]])} is out of range for a topic "
                    f"of {self.partitions} partitions (0 to {self.partitions - 1})")
            out[given] = vals[given]
        missing = out < 0
        if keys is not None and missing.any():
            hashed = _murmur2_partitions(keys, self.partitions)
            use = missing & (hashed >= 0)
            out[use] = hashed[use]
            missing = out < 0
        count = int(np.count_nonzero(missing))
        if count:
            out[missing] = (self.next + np.arange(count)) % self.partitions
            self.next = (self.next + count) % self.partitions
        return out


def _column(batch: pa.RecordBatch, name: str) -> pa.Array | None:
    idx = batch.schema.get_field_index(name)
    return None if idx < 0 else batch.column(idx)


def encode_copy(batch: pa.RecordBatch, partitioner: Partitioner, *, ordinal: int | None = None) -> bytes:
    """The rows of ``batch`` in COPY text format for the columns ``(partition, kind, key, value, headers,
    event_type, event_id, correlation_id, causation_id)``, preceded by ``ord`` (numbered from
    ``ordinal``) when ``ordinal`` is given (the staging table of idempotent publishing)."""
    n = batch.num_rows
    if n == 0:
        return b""
    value = _column(batch, "value")
    assert value is not None
    key = _column(batch, "key")
    if value.null_count:  # a NULL value is a tombstone: it needs a key
        keyless = pc.is_null(value) if key is None else pc.and_(pc.is_null(value), pc.is_null(key))
        if pc.any(keyless).as_py():
            row = int(np.flatnonzero(keyless.to_numpy(zero_copy_only=False))[0])
            raise InvalidArgument(f"column 'value': row {row} is NULL without a key (a tombstone, an "
                                  "event without a value, needs a key)")
    kind = b"b" if pa.types.is_binary(value.type) or pa.types.is_large_binary(value.type) else b"s"
    parts = partitioner.assign(_column(batch, "partition"), key, n)
    cols: list[pa.Array] = []
    if ordinal is not None:
        cols.append(pa.array(np.arange(ordinal, ordinal + n, dtype=np.int64)).cast(pa.string()))
    cols.append(pa.array(parts).cast(pa.string()))
    cols.append(constant_string(kind.decode(), n))
    cols.append(escape_text(key) if key is not None else pa.nulls(n, pa.binary()))
    cols.append(hex_bytea(value))
    headers = _column(batch, "headers")
    cols.append(escape_text(headers_json(headers)) if headers is not None else pa.nulls(n, pa.binary()))
    for name in ("event_type", "event_id", "correlation_id", "causation_id"):
        col = _column(batch, name)
        if col is not None and name != "event_type" and len(col) != col.null_count:
            empty = pc.equal(pc.binary_length(_as_binary(col)), 0)
            if pc.any(empty).as_py():
                raise InvalidArgument(f"column {name!r} must not hold empty strings (use NULL)")
        cols.append(escape_text(col) if col is not None else pa.nulls(n, pa.binary()))
    cols = [_as_binary(c) for c in cols]
    line = pc.binary_join_element_wise(*cols, pa.scalar(b"\t"), null_handling="replace",
                                       null_replacement=_NULL.encode())
    line = pc.binary_join_element_wise(line, pa.scalar(b"\n"), pa.scalar(b""))
    if line.offset:
        line = pa.concat_arrays([line])
    offsets = np.frombuffer(line.buffers()[1], dtype=np.int32, count=n + 1)
    return line.buffers()[2].to_pybytes()[int(offsets[0]):int(offsets[-1])]


def _lengths(arr: pa.Array) -> np.ndarray:
    """The byte length of each value of a string or binary array (0 for NULL) as int64."""
    return pc.fill_null(pc.binary_length(arr), 0).to_numpy(zero_copy_only=False).astype(np.int64)


def event_sizes(batch: pa.RecordBatch) -> np.ndarray:
    """Per row, the size ``max.message.bytes`` limits (as :func:`pgstreams.producer.event_size`): the
    value's bytes plus the key's and the header names' and values' (UTF-8)."""
    n = batch.num_rows
    value = _column(batch, "value")
    assert value is not None
    sizes = _lengths(value)
    key = _column(batch, "key")
    if key is not None:
        sizes += _lengths(key)
    headers = _column(batch, "headers")
    if headers is not None and len(headers) != headers.null_count:
        if headers.offset:
            headers = pa.concat_arrays([headers])
        flat = _lengths(headers.keys) + _lengths(headers.items)
        total = np.concatenate([[0], np.cumsum(flat)])
        offsets = headers.offsets.to_numpy(zero_copy_only=False)[: n + 1]
        sizes += total[offsets[1:]] - total[offsets[:-1]]
    return sizes
