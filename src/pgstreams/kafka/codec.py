"""Kafka's framing and message encoding, through ``kio`` (classes generated from Kafka's own message
schemas, one per API version).

A frame is a big-endian ``int32`` size followed by that many bytes: a request header (version 1, or 2 for
the flexible versions of an API), then the request. A reply is a size, a response header (version 0, or 1
for flexible versions; ``ApiVersions`` always 0) and the response. Handlers describe a response as plain
values (:func:`build`), whatever the version asked: fields the version lacks are dropped, nested
structures take the version's own classes. The versions ``kio`` lacks (Kafka 4 dropped them) have classes
of the same kind in :mod:`pgstreams.kafka.schemas`.
"""

from __future__ import annotations

import dataclasses
import datetime
import functools
import io
import struct
import types
import typing
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Final

from kio.index import load_request_schema, load_response_schema
from kio.schema.request_header.v1.header import RequestHeader as RequestHeaderV1
from kio.schema.request_header.v2.header import RequestHeader as RequestHeaderV2
from kio.serial import entity_reader, entity_writer
from kio.static.protocol import Entity

from .schemas import SCHEMAS

#: The largest request frame accepted (Kafka's ``socket.request.max.bytes`` default, 100 MiB).
MAX_FRAME: Final = 100 * 1024 * 1024

_SIZE = struct.Struct(">i")
_PREFIX = struct.Struct(">hhi")  # api key, api version, correlation id


class FrameError(Exception):
    """A frame that cannot be read (its connection is closed; no other is affected)."""


@dataclass(frozen=True)
class Request:
    """A decoded request: its header's fields and the body."""

    api_key: int
    api_version: int
    correlation_id: int
    client_id: str | None
    body: Any


def frame_size(prefix: bytes) -> int:
    """The size announced by a frame's 4-byte prefix; :class:`FrameError` when out of range."""
    (size,) = _SIZE.unpack(prefix)
    if size < _PREFIX.size or size > MAX_FRAME:
        raise FrameError(f"a request frame of {size} bytes (the limit is {MAX_FRAME})")
    return size


def peek(frame: bytes) -> tuple[int, int, int]:
    """A frame's API key, API version and correlation id (common to every request header version)."""
    key, version, correlation = _PREFIX.unpack_from(frame)
    return int(key), int(version), int(correlation)


def decode(frame: bytes) -> Request:
    """Decode a request frame (of an API and version that are served)."""
    key, version, correlation = peek(frame)
    schema = request_type(key, version)
    header_type = RequestHeaderV2 if schema.__flexible__ else RequestHeaderV1
    view = memoryview(frame)
    try:
        header, used = _reader(header_type)(view, 0)
        body, _size = _reader(schema)(view, used)
    except Exception as exc:  # noqa: BLE001 - kio raises several kinds on truncated or malformed input
        raise FrameError(f"a malformed {schema.__name__} v{version}: {exc}") from None
    # bytes after the request are ignored, as Kafka's brokers do (some clients send a few)
    return Request(key, version, correlation, header.client_id, body)


@functools.cache
def _reader(entity: type[Entity]) -> Any:
    return entity_reader(entity)


@functools.cache
def _writer(entity: type[Entity]) -> Any:
    return entity_writer(entity)


def request_type(key: int, version: int) -> type[Entity]:
    """The request class of ``version`` of API ``key``."""
    own = SCHEMAS.get((key, version))
    return own[0] if own is not None else load_request_schema(key, version)


def response_type(key: int, version: int) -> type[Entity]:
    """The response class of ``version`` of API ``key``."""
    own = SCHEMAS.get((key, version))
    return own[1] if own is not None else load_response_schema(key, version)


def encode(correlation_id: int, response: Entity) -> bytes:
    """A reply frame: size, the response header of the response's schema (version 0 for
    ``ApiVersions``, as Kafka's schemas say) and ``response``."""
    buf = io.BytesIO()
    buf.write(b"\0\0\0\0")
    header_schema = type(response).__header_schema__  # type: ignore[attr-defined]
    buf.write(_SIZE.pack(correlation_id))
    if header_schema.__version__ >= 1:
        buf.write(b"\0")  # no tagged fields
    _writer(type(response))(buf, response)
    out = buf.getbuffer()
    _SIZE.pack_into(out, 0, len(out) - 4)
    return bytes(out)


def build(entity: type[Entity], values: Mapping[str, Any]) -> Any:
    """An instance of ``entity`` (a kio class of one API version) from plain values: keys the version
    lacks are dropped, fields not given take their defaults, nested mappings become the version's nested
    classes and integers its integer types; ``None`` for a string the version cannot leave null is
    empty."""
    hints = _hints(entity)
    kwargs: dict[str, Any] = {}
    for f in dataclasses.fields(entity):  # type: ignore[arg-type,unused-ignore]
        if f.name not in values:
            continue
        kwargs[f.name] = _convert(hints[f.name], values[f.name])
    return entity(**kwargs)


@functools.cache
def _hints(entity: type) -> dict[str, Any]:
    return typing.get_type_hints(entity)


def _convert(hint: Any, value: Any) -> Any:
    if value is None:
        # a field that older versions cannot leave null (a string before it became nullable): empty
        return "" if hint is str else b"" if hint is bytes else None
    origin = typing.get_origin(hint)
    if origin is tuple:
        (item,) = [a for a in typing.get_args(hint) if a is not Ellipsis]
        return tuple(_convert(item, v) for v in value)
    if origin in (typing.Union, types.UnionType):
        for arg in typing.get_args(hint):
            if arg is not type(None):
                return _convert(arg, value)
    if isinstance(hint, type):
        if dataclasses.is_dataclass(hint) and isinstance(value, Mapping):
            return build(typing.cast(type[Entity], hint), value)
        if issubclass(hint, int) and not issubclass(hint, bool) and isinstance(value, int) \
                and type(value) is not hint:
            return hint(value)
        if issubclass(hint, datetime.timedelta) and isinstance(value, (int, float)):
            return hint.parse(datetime.timedelta(milliseconds=value))  # type: ignore[attr-defined]
    return value


def refusal(entity: type[Entity], code: int) -> Any:
    """A response of ``entity`` (a kio class of one API version) that only says ``code``: its top-level
    ``error_code`` set, every other field without a default empty (0, "", nothing), as Kafka answers a
    request it refuses as a whole; ``None`` when the response has no top-level error code."""
    hints = _hints(entity)
    names = {f.name for f in dataclasses.fields(entity)}  # type: ignore[arg-type,unused-ignore]
    if "error_code" not in names:
        return None
    values: dict[str, Any] = {"error_code": code}
    for f in dataclasses.fields(entity):  # type: ignore[arg-type,unused-ignore]
        if f.name in values or f.default is not dataclasses.MISSING or \
                f.default_factory is not dataclasses.MISSING:
            continue
        values[f.name] = _empty(hints[f.name])
    return build(entity, values)


def _empty(hint: Any) -> Any:
    origin = typing.get_origin(hint)
    if origin is tuple:
        return ()
    if origin in (typing.Union, types.UnionType):
        return None
    if isinstance(hint, type):
        if issubclass(hint, str):
            return ""
        if issubclass(hint, bytes):
            return b""
        if issubclass(hint, datetime.timedelta):
            return 0
        if issubclass(hint, int):
            return 0
    return None
