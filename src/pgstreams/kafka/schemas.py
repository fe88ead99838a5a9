"""Kafka message schemas that ``kio`` does not have: ``Produce`` versions 0 to 2.

``kio`` generates its classes from the message schemas of Kafka 4, which dropped the oldest versions of
several APIs (KIP-896). These are the classes of ``Produce`` v0-v2 as ``kio`` generated them from Kafka
3.9's ``ProduceRequest.json`` and ``ProduceResponse.json`` (same field names, types and ``kafka_type``
metadata), so that ``kio``'s reader and writer serve them like its own: the requests carry no
transactional id (it came with v3, as did record batches v2), v0's response has no throttle time (v1 adds
it, at the end) and v2's adds each partition's ``log_append_time``. :data:`SCHEMAS` maps an API key and
version to its request and response classes; :mod:`pgstreams.kafka.codec` looks there before ``kio``.
"""

from __future__ import annotations

import dataclasses
import datetime
import typing
from dataclasses import dataclass, field
from typing import ClassVar, Final, TypeVar

from kio.schema.errors import ErrorCode
from kio.schema.request_header.v1.header import RequestHeader
from kio.schema.response_header.v0.header import ResponseHeader
from kio.schema.types import TopicName
from kio.static.constants import EntityType
from kio.static.primitive import Records as _Records
from kio.static.primitive import TZAware, i16, i32, i32Timedelta, i64
from kio.static.protocol import Entity

_NO_THROTTLE = i32Timedelta.parse(datetime.timedelta(milliseconds=0))

_E = TypeVar("_E")


def _entity(cls: type[_E]) -> type[_E]:
    """``cls`` with its fields' types resolved: ``kio`` reads them at run time, and this module's
    annotations are postponed (strings)."""
    hints = typing.get_type_hints(cls)
    for f in dataclasses.fields(cls):  # type: ignore[arg-type]
        f.type = hints[f.name]
    return cls


# The request: the same fields in versions 0, 1 and 2 (v1 only told the broker that the client reads a
# throttle time, v2 that it sends messages of format v1).


@_entity
@dataclass(frozen=True, slots=True, kw_only=True)
class PartitionProduceData:
    """A partition's records in a ``Produce`` request of versions 0 to 2."""

    __type__: ClassVar = EntityType.nested
    __version__: ClassVar[i16] = i16(0)
    __flexible__: ClassVar[bool] = False
    __api_key__: ClassVar[i16] = i16(0)
    __header_schema__: ClassVar[type[RequestHeader]] = RequestHeader
    index: i32 = field(metadata={"kafka_type": "int32"})
    records: _Records | None = field(metadata={"kafka_type": "records"})


@_entity
@dataclass(frozen=True, slots=True, kw_only=True)
class TopicProduceData:
    """A topic's partitions in a ``Produce`` request of versions 0 to 2."""

    __type__: ClassVar = EntityType.nested
    __version__: ClassVar[i16] = i16(0)
    __flexible__: ClassVar[bool] = False
    __api_key__: ClassVar[i16] = i16(0)
    __header_schema__: ClassVar[type[RequestHeader]] = RequestHeader
    name: TopicName = field(metadata={"kafka_type": "string"})
    partition_data: tuple[PartitionProduceData, ...]


@_entity
@dataclass(frozen=True, slots=True, kw_only=True)
class ProduceRequestV0:
    """``Produce`` v0: acks, timeout and the records of each partition (message sets)."""

    __type__: ClassVar = EntityType.request
    __version__: ClassVar[i16] = i16(0)
    __flexible__: ClassVar[bool] = False
    __api_key__: ClassVar[i16] = i16(0)
    __header_schema__: ClassVar[type[RequestHeader]] = RequestHeader
    acks: i16 = field(metadata={"kafka_type": "int16"})
    timeout: i32Timedelta = field(metadata={"kafka_type": "timedelta_i32"})
    topic_data: tuple[TopicProduceData, ...]


@_entity
@dataclass(frozen=True, slots=True, kw_only=True)
class ProduceRequestV1(ProduceRequestV0):
    """``Produce`` v1: v0's fields."""

    __version__: ClassVar[i16] = i16(1)


@_entity
@dataclass(frozen=True, slots=True, kw_only=True)
class ProduceRequestV2(ProduceRequestV0):
    """``Produce`` v2: v0's fields."""

    __version__: ClassVar[i16] = i16(2)


# The responses.


@_entity
@dataclass(frozen=True, slots=True, kw_only=True)
class PartitionProduceResponseV0:
    """A partition's outcome in a ``Produce`` response of versions 0 and 1."""

    __type__: ClassVar = EntityType.nested
    __version__: ClassVar[i16] = i16(0)
    __flexible__: ClassVar[bool] = False
    __api_key__: ClassVar[i16] = i16(0)
    __header_schema__: ClassVar[type[ResponseHeader]] = ResponseHeader
    index: i32 = field(metadata={"kafka_type": "int32"})
    error_code: ErrorCode = field(metadata={"kafka_type": "error_code"})
    base_offset: i64 = field(metadata={"kafka_type": "int64"})


@_entity
@dataclass(frozen=True, slots=True, kw_only=True)
class PartitionProduceResponseV2:
    """A partition's outcome in a ``Produce`` response of version 2: with its log append time (-1 when
    the time is the producer's)."""

    __type__: ClassVar = EntityType.nested
    __version__: ClassVar[i16] = i16(2)
    __flexible__: ClassVar[bool] = False
    __api_key__: ClassVar[i16] = i16(0)
    __header_schema__: ClassVar[type[ResponseHeader]] = ResponseHeader
    index: i32 = field(metadata={"kafka_type": "int32"})
    error_code: ErrorCode = field(metadata={"kafka_type": "error_code"})
    base_offset: i64 = field(metadata={"kafka_type": "int64"})
    log_append_time: TZAware | None = field(metadata={"kafka_type": "datetime_i64"}, default=None)


@_entity
@dataclass(frozen=True, slots=True, kw_only=True)
class TopicProduceResponseV0:
    """A topic's partitions in a ``Produce`` response of versions 0 and 1."""

    __type__: ClassVar = EntityType.nested
    __version__: ClassVar[i16] = i16(0)
    __flexible__: ClassVar[bool] = False
    __api_key__: ClassVar[i16] = i16(0)
    __header_schema__: ClassVar[type[ResponseHeader]] = ResponseHeader
    name: TopicName = field(metadata={"kafka_type": "string"})
    partition_responses: tuple[PartitionProduceResponseV0, ...]


@_entity
@dataclass(frozen=True, slots=True, kw_only=True)
class TopicProduceResponseV2:
    """A topic's partitions in a ``Produce`` response of version 2."""

    __type__: ClassVar = EntityType.nested
    __version__: ClassVar[i16] = i16(2)
    __flexible__: ClassVar[bool] = False
    __api_key__: ClassVar[i16] = i16(0)
    __header_schema__: ClassVar[type[ResponseHeader]] = ResponseHeader
    name: TopicName = field(metadata={"kafka_type": "string"})
    partition_responses: tuple[PartitionProduceResponseV2, ...]


@_entity
@dataclass(frozen=True, slots=True, kw_only=True)
class ProduceResponseV0:
    """``Produce`` v0's response: no throttle time."""

    __type__: ClassVar = EntityType.response
    __version__: ClassVar[i16] = i16(0)
    __flexible__: ClassVar[bool] = False
    __api_key__: ClassVar[i16] = i16(0)
    __header_schema__: ClassVar[type[ResponseHeader]] = ResponseHeader
    responses: tuple[TopicProduceResponseV0, ...]


@_entity
@dataclass(frozen=True, slots=True, kw_only=True)
class ProduceResponseV1:
    """``Produce`` v1's response: v0's, then the throttle time."""

    __type__: ClassVar = EntityType.response
    __version__: ClassVar[i16] = i16(1)
    __flexible__: ClassVar[bool] = False
    __api_key__: ClassVar[i16] = i16(0)
    __header_schema__: ClassVar[type[ResponseHeader]] = ResponseHeader
    responses: tuple[TopicProduceResponseV0, ...]
    throttle_time: i32Timedelta = field(metadata={"kafka_type": "timedelta_i32"}, default=_NO_THROTTLE)


@_entity
@dataclass(frozen=True, slots=True, kw_only=True)
class ProduceResponseV2:
    """``Produce`` v2's response: v1's, each partition with its log append time."""

    __type__: ClassVar = EntityType.response
    __version__: ClassVar[i16] = i16(2)
    __flexible__: ClassVar[bool] = False
    __api_key__: ClassVar[i16] = i16(0)
    __header_schema__: ClassVar[type[ResponseHeader]] = ResponseHeader
    responses: tuple[TopicProduceResponseV2, ...]
    throttle_time: i32Timedelta = field(metadata={"kafka_type": "timedelta_i32"}, default=_NO_THROTTLE)


#: The request and response classes of each (API key, version) that ``kio`` lacks.
SCHEMAS: Final[dict[tuple[int, int], tuple[type[Entity], type[Entity]]]] = {
    (0, 0): (ProduceRequestV0, ProduceResponseV0),
    (0, 1): (ProduceRequestV1, ProduceResponseV1),
    (0, 2): (ProduceRequestV2, ProduceResponseV2),
}
