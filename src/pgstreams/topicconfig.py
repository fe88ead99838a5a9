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
- ``cleanup.policy`` (default ``delete``): ``delete`` (retention only), ``compact`` (keep at least the
  latest event of every key; see :mod:`pgstreams.maintenance`) or ``compact,delete`` (both; ``delete,compact``
  is the same). A compacted topic refuses events without a key.
- ``min.compaction.lag.ms`` (default 0): an event is never compacted younger than this.
- ``max.compaction.lag.ms`` (default 9223372036854775807, never): a sealed segment holding superseded
  events is compacted once its oldest event is older than this, whatever its dirty ratio.
- ``delete.retention.ms`` (default 86400000, a day): how long a tombstone stays once written (a consumer
  reading from the start within that time sees every delete).
- ``min.cleanable.dirty.ratio`` (default 0.5): a sealed segment is rewritten once this share of its events
  has a newer event of their key (0 to 1).

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
MIN_COMPACTION_LAG_MS = "min.compaction.lag.ms"
MAX_COMPACTION_LAG_MS = "max.compaction.lag.ms"
DELETE_RETENTION_MS = "delete.retention.ms"
MIN_CLEANABLE_DIRTY_RATIO = "min.cleanable.dirty.ratio"

#: The values of ``cleanup.policy``.
CLEANUP_POLICIES = ("delete", "compact", "compact,delete")
#: The largest 64-bit integer: Kafka's "never" for ``max.compaction.lag.ms``.
NEVER_MS = 2**63 - 1

#: Every topic configuration key with its default (-1: unlimited).
TOPIC_CONFIG_DEFAULTS: Mapping[str, int | str | float] = {
    RETENTION_MS: -1,
    RETENTION_EVENTS: -1,
    RETENTION_BYTES: -1,
    MAX_MESSAGE_BYTES: 1_048_588,
    SEGMENT_EVENTS: DEFAULT_SEGMENT_SIZE,
    CLEANUP_POLICY: "delete",
    MIN_COMPACTION_LAG_MS: 0,
    MAX_COMPACTION_LAG_MS: NEVER_MS,
    DELETE_RETENTION_MS: 86_400_000,
    MIN_CLEANABLE_DIRTY_RATIO: 0.5,
}

#: The smallest ``segment.events``.
MIN_SEGMENT_EVENTS = 1000
_UNLIMITED_OK = frozenset({RETENTION_MS, RETENTION_EVENTS, RETENTION_BYTES})
_ZERO_OK = frozenset({MIN_COMPACTION_LAG_MS, DELETE_RETENTION_MS})
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
    elif key in _ZERO_OK:
        if n < 0:
            raise InvalidConfig(f"{key}: expected an integer >= 0, got {n}")
    elif n < 1:
        raise InvalidConfig(f"{key}: expected a positive integer, got {n}")
    if n >= 2**63:
        raise InvalidConfig(f"{key}: {n} is too large")
    return n


def _ratio(key: str, value: object) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float, str)):
        raise InvalidConfig(f"{key}: expected a number from 0 to 1, got {value!r}")
    try:
        x = float(value)
    except ValueError:
        raise InvalidConfig(f"{key}: expected a number from 0 to 1, got {value!r}") from None
    if not 0.0 <= x <= 1.0:  # NaN too
        raise InvalidConfig(f"{key}: expected a number from 0 to 1, got {value!r}")
    return x


def _policy(value: object) -> str:
    parts = sorted({p.strip() for p in value.split(",")}) if isinstance(value, str) else []
    policy = ",".join(parts)
    if policy not in CLEANUP_POLICIES:
        raise InvalidConfig(f"cleanup.policy: expected one of {', '.join(CLEANUP_POLICIES)}, got {value!r}")
    return policy


def check_value(key: object, value: object) -> int | str | float:
    """The validated, normalised value of ``key`` (integers from ints or digit strings); raises
    :class:`InvalidConfig` naming the key for an unknown key or a bad value."""
    if not isinstance(key, str) or key not in TOPIC_CONFIG_DEFAULTS:
        known = ", ".join(sorted(TOPIC_CONFIG_DEFAULTS))
        raise InvalidConfig(f"unknown topic config key {key!r} (known: {known})")
    if key == CLEANUP_POLICY:
        return _policy(value)
    if key == MIN_CLEANABLE_DIRTY_RATIO:
        return _ratio(key, value)
    return _integer(key, value)


def check_consistent(config: Mapping[str, Any]) -> None:
    """Check the keys of a topic's whole configuration (as stored after a change) against each other:
    ``min.compaction.lag.ms`` may not exceed ``max.compaction.lag.ms``. Raises :class:`InvalidConfig`
    naming both."""
    lo = int(config.get(MIN_COMPACTION_LAG_MS, TOPIC_CONFIG_DEFAULTS[MIN_COMPACTION_LAG_MS]))
    hi = int(config.get(MAX_COMPACTION_LAG_MS, TOPIC_CONFIG_DEFAULTS[MAX_COMPACTION_LAG_MS]))
    if lo > hi:
        raise InvalidConfig(f"{MIN_COMPACTION_LAG_MS} ({lo}) must not exceed {MAX_COMPACTION_LAG_MS} ({hi})")


def compacts(config: Mapping[str, Any]) -> bool:
    """Whether a topic of configuration ``config`` (its stored keys) is compacted (``cleanup.policy``
    ``compact`` or ``compact,delete``)."""
    return "compact" in str(config.get(CLEANUP_POLICY, "delete"))


def check_config(config: object) -> dict[str, int | str | float]:
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
