"""The stable key-to-partition function.

A key is encoded as UTF-8 and hashed with 32-bit murmur2 exactly as Kafka's default partitioner does
(``toPositive(murmur2(key)) % partitions``), so a key lands on the same partition in every process,
Python version and machine, and on the same partition number as a Kafka producer would choose.
Events without a key are spread round-robin over the partitions by each client, starting from a
random partition.
"""

from __future__ import annotations

from .errors import InvalidArgument

_M = 0x5BD1E995
_MASK = 0xFFFFFFFF


def murmur2(data: bytes) -> int:
    """Kafka's 32-bit murmur2 hash of ``data`` (seed ``0x9747b28c``), as a signed 32-bit integer."""
    length = len(data)
    h = (0x9747B28C ^ length) & _MASK
    n4 = length // 4
    for i in range(n4):
        i4 = i * 4
        k = data[i4] | (data[i4 + 1] << 8) | (data[i4 + 2] << 16) | (data[i4 + 3] << 24)
        k = (k * _M) & _MASK
        k ^= k >> 24
        k = (k * _M) & _MASK
        h = (h * _M) & _MASK
        h ^= k
    rest = length % 4
    tail = n4 * 4
    if rest == 3:
        h ^= data[tail + 2] << 16
    if rest >= 2:
        h ^= data[tail + 1] << 8
    if rest >= 1:
        h ^= data[tail]
        h = (h * _M) & _MASK
    h ^= h >> 13
    h = (h * _M) & _MASK
    h ^= h >> 15
    return h - (1 << 32) if h & 0x80000000 else h


def partition_for_key(key: str | bytes, partitions: int) -> int:
    """The partition of ``key`` in a topic of ``partitions`` partitions.

    ``(murmur2(utf8(key)) & 0x7fffffff) % partitions``, identical to Kafka's default partitioner.
    Raises :class:`pgstreams.InvalidArgument` unless ``key`` is str or bytes and ``partitions`` a
    positive integer.
    """
    if isinstance(partitions, bool) or not isinstance(partitions, int) or partitions < 1:
        raise InvalidArgument(f"partitions must be a positive integer, got {partitions!r}")
    if isinstance(key, str):
        try:
            data = key.encode("utf-8")
        except UnicodeEncodeError:
            raise InvalidArgument(f"key {key!r} is not valid Unicode (unpaired surrogate)") from None
    elif isinstance(key, (bytes, bytearray, memoryview)):
        data = bytes(key)
    else:
        raise InvalidArgument(f"key must be str or bytes, not {type(key).__name__}")
    return (murmur2(data) & 0x7FFFFFFF) % partitions
