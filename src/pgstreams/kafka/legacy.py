"""Kafka's legacy message sets (message formats v0 and v1, "magic 0" and "magic 1"), read into records.

``Produce`` v0 to v2 carry them: Kafka's clients before 0.11 and clients configured for such brokers
(librdkafka's ``api.version.request=false`` with ``broker.version.fallback`` 0.9 or 0.10). A message set is
a sequence of entries, each an offset (``int64``, the producer's to choose) and a size (``int32``) followed
by a message (https://kafka.apache.org/protocol#protocol_message_sets)::

    Message => Crc(uint32) Magic(int8) Attributes(int8) [Timestamp(int64), magic 1] Key(bytes) Value(bytes)

``Crc`` is the CRC-32 (IEEE, :func:`zlib.crc32`) of the message from ``Magic`` on. The attributes' low
three bits are the compression codec (gzip, snappy, lz4; zstd came with record batches v2): a compressed
message is a wrapper whose value is an inner message set, compressed, of uncompressed messages of the same
magic (their offsets relative to the wrapper's in magic 1). A message becomes a record of its key and
value, with no headers (they came with v2); its timestamp (magic 1) is not kept, as a record batch's is
not: an event's time is the time it was stored (see ``docs/kafka.md``).

A message whose CRC does not match, that is malformed or does not decompress raises
:class:`~pgstreams.kafka.records.RecordError` with ``CORRUPT_MESSAGE``, a codec that is not served with
``UNSUPPORTED_COMPRESSION_TYPE``, as Kafka answers them.
"""

from __future__ import annotations

import struct
import zlib
from typing import Final

from kio.schema.errors import ErrorCode

from .records import CODECS, COMPRESSION_MASK, RecordError, RecordTuple, decompress

#: An entry's offset and size (the message's, after them).
_ENTRY: Final = struct.Struct(">qi")
#: A message's CRC, magic and attributes.
_HEAD: Final = struct.Struct(">Ibb")
_LENGTH: Final = struct.Struct(">i")
#: Where the magic byte is from an entry's start, in a message set and a record batch v2 alike (after the
#: offset, the size, and the CRC or the batch's leader epoch).
MAGIC_AT: Final = 16
#: The smallest message of each magic: CRC, magic, attributes, (timestamp,) key and value lengths.
_SMALLEST: Final = {0: 14, 1: 22}

_LZ4 = 3
_LZ4_MAGIC = b"\x04\x22\x4d\x18"


def read_message(view: memoryview | bytes, offset: int) -> tuple[list[RecordTuple], int]:
    """The records of the message set entry at ``offset`` of ``view`` (one, or the inner messages of a
    compressed one), and the entry's size; :class:`RecordError` for one that cannot be stored."""
    magic, attributes, key, value, end = _message(view, offset, len(view))
    codec = attributes & COMPRESSION_MASK
    if not codec:
        return [(key, value, [])], end - offset
    if codec > _LZ4:
        raise RecordError(ErrorCode.unsupported_compression_type,
                          f"compression codec {CODECS.get(codec, codec)} is not served in message format "
                          f"v{magic} (only gzip, snappy and lz4; zstd needs record batches v2)")
    if value is None:
        raise RecordError(ErrorCode.corrupt_message, "a compressed message without a value")
    data = bytes(value)
    if codec == _LZ4 and magic == 0:
        data = lz4_header_fixed(data)
    inner = decompress(codec, data)
    records: list[RecordTuple] = []
    at = 0
    while at < len(inner):
        inner_magic, inner_attributes, key, value, at = _message(inner, at, len(inner))
        if inner_magic != magic:
            raise RecordError(ErrorCode.corrupt_message, f"a message of magic {inner_magic} inside a "
                                                         f"compressed message of magic {magic}")
        if inner_attributes & COMPRESSION_MASK:
            raise RecordError(ErrorCode.corrupt_message, "a compressed message inside a compressed message")
        records.append((key, value, []))
    if not records:
        raise RecordError(ErrorCode.corrupt_message, "a compressed message with no message inside")
    return records, end - offset


def _message(buf: memoryview | bytes, offset: int, limit: int
             ) -> tuple[int, int, bytes | None, bytes | None, int]:
    """The message set entry at ``offset`` of ``buf`` (which ends at ``limit``), its CRC checked: its magic,
    attributes, key, value and the offset after it."""
    if limit - offset < _ENTRY.size + _HEAD.size:
        raise RecordError(ErrorCode.corrupt_message, "a truncated message")
    _offset, size = _ENTRY.unpack_from(buf, offset)
    start = offset + _ENTRY.size
    end = start + size
    crc, magic, attributes = _HEAD.unpack_from(buf, start)
    if magic not in _SMALLEST:
        raise RecordError(ErrorCode.corrupt_message, f"a message of magic {magic} in a message set")
    if size < _SMALLEST[magic] or end > limit:
        raise RecordError(ErrorCode.corrupt_message, f"a message of magic {magic} and {size} bytes in "
                                                     f"{limit - start} bytes")
    if zlib.crc32(buf[start + 4:end]) != crc:
        raise RecordError(ErrorCode.corrupt_message, "a message whose CRC does not match")
    at = start + _HEAD.size + (8 if magic == 1 else 0)  # the timestamp (magic 1) is not kept
    key, at = _bytes(buf, at, end)
    value, at = _bytes(buf, at, end)
    if at != end:
        raise RecordError(ErrorCode.corrupt_message, "a message whose fields do not add up to its size")
    return magic, attributes, key, value, end


def _bytes(buf: memoryview | bytes, at: int, end: int) -> tuple[bytes | None, int]:
    if end - at < _LENGTH.size:
        raise RecordError(ErrorCode.corrupt_message, "a message whose fields do not add up to its size")
    (n,) = _LENGTH.unpack_from(buf, at)
    at += _LENGTH.size
    if n == -1:
        return None, at
    if n < 0 or at + n > end:
        raise RecordError(ErrorCode.corrupt_message, f"a key or value of {n} bytes in {end - at}")
    return bytes(buf[at:at + n]), at + n


def lz4_header_fixed(frame: bytes) -> bytes:
    """An lz4 frame of message format v0 with the header checksum its descriptor has. Kafka 0.8 and 0.9
    computed that checksum over the frame's magic number too (KAFKA-3160), and so do clients producing
    for them (kafka-python's and librdkafka's framing for magic 0); Kafka's reader ignores it in v0
    messages, and message format v1 has it right (KIP-57). Either form decodes once it is recomputed."""
    if len(frame) < 7 or not frame.startswith(_LZ4_MAGIC):
        return frame  # not an lz4 frame: decompressing it says so
    flags = frame[4]
    # the descriptor: flags, block descriptor, then the content size and the dictionary id when flagged
    end = 6 + (8 if flags & 0x08 else 0) + (4 if flags & 0x01 else 0)
    if len(frame) <= end:
        return frame
    checksum = (xxh32(frame[4:end]) >> 8) & 0xFF
    return frame[:end] + bytes((checksum,)) + frame[end + 1:]


_P1, _P2, _P3, _P4, _P5 = 2654435761, 2246822519, 3266489917, 668265263, 374761393
_MASK = 0xFFFFFFFF


def _rotl(x: int, r: int) -> int:
    return ((x << r) | (x >> (32 - r))) & _MASK


def xxh32(data: bytes) -> int:
    """XXH32 (seed 0) of ``data`` shorter than 16 bytes: an lz4 frame descriptor's checksum (at most 14
    bytes); :class:`ValueError` for longer data."""
    n = len(data)
    if n >= 16:
        raise ValueError("xxh32 here serves inputs shorter than 16 bytes")
    h = (_P5 + n) & _MASK
    at = 0
    while at + 4 <= n:
        (word,) = struct.unpack_from("<I", data, at)
        h = _rotl((h + word * _P3) & _MASK, 17) * _P4 & _MASK
        at += 4
    while at < n:
        h = _rotl((h + data[at] * _P5) & _MASK, 11) * _P1 & _MASK
        at += 1
    h ^= h >> 15
    h = h * _P2 & _MASK
    h ^= h >> 13
    h = h * _P3 & _MASK
    return h ^ (h >> 16)
