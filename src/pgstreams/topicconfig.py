"""Per-topic configuration: the keys (Kafka's names where they fit), their defaults and validation.

A topic stores only the keys set on it (``topics.config``); every other key has its default from
:data:`TOPIC_CONFIG_DEFAULTS`. Values are validated here, before anything is stored: an unknown key or a
bad value raises :class:`pgstreams.InvalidConfig` naming the key, and nothing changes.

- ``retention.ms`` (default -1, keep forever): remove a segment once its newest event is older.
- ``retention.events`` (default -1, unlimited): remove the oldest segments while the topic keeps at least
  this many events (per topic).
- ``retention.bytes`` (default -1, unlimited): remove the oldest segments while the topic keeps at least
  this many bytes on disk (per topic).
- ``max.message.bytes`` (default 1048588): the largest event accepted (value, key and headers as stored).
- ``segment.events`` (default 1000000): positions per storage segment, the unit retention removes; set at
  creation only.
- ``cleanup.policy`` (default ``delete``): ``delete`` only (``compact`` is refused: not supported yet).

Unlike Kafka, whose ``retention.bytes`` is per partition, the retention limits are per topic: a segment
holds events of every partition of its topic, and retention removes whole segments.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from .errors import InvalidConfig
from .models import DEFAULT_SEGMENT_SIZE, ConfigEntry

RETENTION_MS = "retention.ms"
RETENTION_EVENTS = "retention.events"
RETENTION_BYTES = "retention.bytes"
MAX_MESSAGE_BYTES = "max.message.bytes"
SEGMENT_EVENTS = "segment.events"
CLEANUP_POLICY = "cleanup.policy"

#: Every topic configuration key with its default (-1: unlimited).
TOPIC_CONFIG_DEFAULTS: Mapping[str, int | str] = {
    RETENTION_MS: -1,
    RETENTION_EVENTS: -1,
    RETENTION_BYTES: -1,
    MAX_MESSAGE_BYTES: 1_048_588,
    SEGMENT_EVENTS: DEFAULT_SEGMENT_SIZE,
    CLEANUP_POLICY: "delete",
}

#: The smallest ``segment.events``.
MIN_SEGMENT_EVENTS = 1000
_UNLIMITED_OK = frozenset({RETENTION_MS, RETENTION_EVENTS, RETENTION_BYTES})
#: The keys that can only be set when the topic is created.
CREATE_ONLY = frozenset({SEGMENT_EVENTS})


def _integer(key: str, value: object) -> int:
    if isinstance(value, bool):
        raise InvalidConfig(f"{key}: expected an integer, got {value!r}")
    if isinstance(value, int):
        n = value
    elif isinstance(value, str) and value.strip().lstrip("-").isdigit():
        n = int(value.strip())
    else:
        raise InvalidConfig(f"{key}: expected an integer, got {value!r}")
    if key in _UNLIMITED_OK:
        if n < -1 or n == 0:
            raise InvalidConfig(f"{key}: expected a positive integer or -1 (unlimited), got {n}")
    elif key == SEGMENT_EVENTS:
        if n < MIN_SEGMENT_EVENTS:
            raise InvalidConfig(f"{key}: expected an integer >= {MIN_SEGMENT_EVENTS}, got {n}")
    elif n < 1:
        raise InvalidConfig(f"{key}: expected a positive integer, got {n}")
    if n >= 2**63:
        raise InvalidConfig(f"{key}: {n} is too large")
    return n


def check_value(key: object, value: object) -> int | str:
    """The validated, normalised value of ``key`` (integers from ints or digit strings); raises
    :class:`InvalidConfig` naming the key for an unknown key or a bad value."""
    if not isinstance(key, str) or key not in TOPIC_CONFIG_DEFAULTS:
        known = ", ".join(sorted(TOPIC_CONFIG_DEFAULTS))
        raise InvalidConfig(f"unknown topic config key {key!r} (known: {known})")
    if key == CLEANUP_POLICY:
        if value == "compact":
            raise InvalidConfig("cleanup.policy: 'compact' is not supported yet (only 'delete')")
        if value != "delete":
            raise InvalidConfig(f"cleanup.policy: expected 'delete', got {value!r}")
        return "delete"
    return _integer(key, value)


def check_config(config: object) -> dict[str, int | str]:
    """Validate a whole configuration mapping (see :func:`check_value`); returns a normalised copy."""
    if config is None:
        return {}
    if not isinstance(config, Mapping):
        raise InvalidConfig(f"config must be a mapping of keys to values, not {type(config).__name__}")
    return {k: check_value(k, v) for k, v in config.items()}


def effective(stored: Mapping[str, Any], segment_size: int) -> tuple[ConfigEntry, ...]:
    """Every key's value for a topic: the stored ones, else the default (marked as such);
    ``segment.events`` is the topic's segment size."""
    out = []
    for key, default in TOPIC_CONFIG_DEFAULTS.items():
        if key == SEGMENT_EVENTS:
            out.append(ConfigEntry(key, segment_size, segment_size == default))
        elif key in stored:
            out.append(ConfigEntry(key, stored[key], False))
        else:
            out.append(ConfigEntry(key, default, True))
    return tuple(out)
