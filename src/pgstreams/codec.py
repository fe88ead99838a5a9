"""Encoding of event values and headers to their stored form, and back."""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from .errors import InvalidArgument

KIND_BYTES = "b"
KIND_TEXT = "s"
KIND_JSON = "j"

#: JSON as values are stored: compact, UTF-8 as is, no NaN (``json.dumps`` with these arguments builds an
#: encoder at every call; this one is built once)
encode_json = json.JSONEncoder(separators=(",", ":"), ensure_ascii=False, allow_nan=False).encode


def encode_value(value: Any) -> tuple[str, bytes]:
    """Return ``(kind, payload)`` for a value: bytes as is, str as UTF-8, anything else as JSON. (An event
    with a key and the value ``None`` is a *tombstone*, stored without a value: see
    :func:`pgstreams.producer.rows.encode_row`.)"""
    if isinstance(value, (bytes, bytearray, memoryview)):
        return KIND_BYTES, bytes(value)
    if isinstance(value, str):
        return KIND_TEXT, value.encode("utf-8")
    try:
        text = encode_json(value)
    except (TypeError, ValueError) as exc:
        raise InvalidArgument(f"value is not bytes, str or JSON-serialisable: {exc}") from exc
    return KIND_JSON, text.encode("utf-8")


def decode_value(kind: str, payload: bytes | None) -> Any:
    """Inverse of :func:`encode_value` (no payload: ``None``, a tombstone)."""
    if payload is None:
        return None
    if kind == KIND_BYTES:
        return bytes(payload)
    if kind == KIND_TEXT:
        return bytes(payload).decode("utf-8")
    return json.loads(bytes(payload))


def check_headers(headers: object) -> dict[str, str] | None:
    """Validate headers: ``None`` or a mapping of str to str."""
    if headers is None:
        return None
    if not isinstance(headers, Mapping):
        raise InvalidArgument(f"headers must be a mapping of str to str, not {type(headers).__name__}")
    out: dict[str, str] = {}
    for k, v in headers.items():
        if not isinstance(k, str) or not isinstance(v, str):
            raise InvalidArgument(f"headers must map str to str; bad entry {k!r}: {v!r}")
        out[k] = v
    return out


def check_optional_str(name: str, value: object, max_len: int = 1000) -> str | None:
    """Validate an optional short text field such as ``event_type`` or ``event_id``."""
    if value is None:
        return None
    if not isinstance(value, str):
        raise InvalidArgument(f"{name} must be a string, not {type(value).__name__}")
    if not value or len(value) > max_len:
        raise InvalidArgument(f"{name} must have 1 to {max_len} characters")
    return value
