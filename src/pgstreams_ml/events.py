"""Event formats shared by the simulator and the pipelines: types, required fields, quarantine reasons and
timestamps (including America/Chicago offsets, as a producer on a Chicago clock sends them)."""

from __future__ import annotations

import re
from datetime import datetime, timedelta, timezone

#: Event types on the raw topic.
EVENT_TYPES: tuple[str, ...] = ("impression", "click", "conversion")
#: Event types on the updates topic.
UPDATE_TYPES: tuple[str, ...] = ("user_profile", "ad_catalogue")
#: Fields each raw event type must carry (non-null).
REQUIRED: dict[str, tuple[str, ...]] = {
    "impression": ("event_id", "ts", "user_id", "ad_id", "slot", "device"),
    "click": ("event_id", "ts", "impression_id", "user_id", "ad_id"),
    "conversion": ("event_id", "ts", "impression_id", "value"),
}
#: Every field a raw event may carry.
RAW_FIELDS: tuple[str, ...] = (
    "event_id",
    "type",
    "ts",
    "user_id",
    "ad_id",
    "impression_id",
    "slot",
    "device",
    "value",
)

#: Quarantine reasons, in the order the cleaner checks them (the first failing check is the reason).
INVALID_JSON = "invalid_json"
UNKNOWN_EVENT_TYPE = "unknown_event_type"
MISSING_FIELD = "missing_field"
INVALID_FIELD = "invalid_field"
TIMESTAMP_WITHOUT_ZONE = "timestamp_without_zone"
INVALID_TIMESTAMP = "invalid_timestamp"
REASONS: tuple[str, ...] = (
    INVALID_JSON,
    UNKNOWN_EVENT_TYPE,
    MISSING_FIELD,
    INVALID_FIELD,
    TIMESTAMP_WITHOUT_ZONE,
    INVALID_TIMESTAMP,
)

#: A timestamp without a zone: ``2025-03-09T01:59:58.123`` (ambiguous: rejected, never guessed).
NAIVE_TS_RE = r"^\d{4}-\d{2}-\d{2}T\d{2}:\d{2}:\d{2}(\.\d{1,6})?$"
#: The Spark datetime pattern of accepted timestamps (ISO 8601 with ``Z`` or a numeric offset).
SPARK_TS_PATTERN = "yyyy-MM-dd'T'HH:mm:ss[.SSSSSS]XXX"
_ZONED_RE = re.compile(r"^\d{4}-\d{2}-\d{2}T\d{2}:\d{2}:\d{2}(\.\d{1,6})?(Z|[+-]\d{2}:\d{2})$")


def _nth_sunday(year: int, month: int, n: int) -> datetime:
    d = datetime(year, month, 1)
    d += timedelta(days=(6 - d.weekday()) % 7)
    return d + timedelta(weeks=n - 1)


def chicago_offset(when: datetime) -> timedelta:
    """America/Chicago's UTC offset at instant ``when`` (aware): -5 h in daylight time (second Sunday of
    March 02:00 local to first Sunday of November 02:00 local), else -6 h. The US rule since 2007, written
    out so that no time-zone database is needed."""
    u = when.astimezone(timezone.utc).replace(tzinfo=None)
    start = _nth_sunday(u.year, 3, 2) + timedelta(hours=2 + 6)  # 02:00 CST = 08:00 UTC
    end = _nth_sunday(u.year, 11, 1) + timedelta(hours=2 + 5)  # 02:00 CDT = 07:00 UTC
    return timedelta(hours=-5) if start <= u < end else timedelta(hours=-6)


def format_ts(when: datetime, style: str = "utc") -> str:
    """Format aware ``when`` with millisecond precision: ``utc`` (``...Z``), ``chicago`` (local time with its
    offset, e.g. ``-06:00``), or ``naive_chicago`` (local time without any zone: malformed on purpose)."""
    u = when.astimezone(timezone.utc)
    if style == "utc":
        return u.strftime("%Y-%m-%dT%H:%M:%S.") + f"{u.microsecond // 1000:03d}Z"
    off = chicago_offset(u)
    local = (u + off).replace(tzinfo=None)
    text = local.strftime("%Y-%m-%dT%H:%M:%S.") + f"{local.microsecond // 1000:03d}"
    if style == "naive_chicago":
        return text
    if style == "chicago":
        hours = int(off.total_seconds() // 3600)
        return f"{text}{hours:+03d}:00"
    raise ValueError(f"unknown timestamp style {style!r}")


def parse_ts(text: object) -> datetime | None:
    """Parse an ISO 8601 timestamp that carries ``Z`` or a numeric offset into an aware UTC datetime;
    ``None`` for anything else (including timestamps without a zone)."""
    if not isinstance(text, str) or not _ZONED_RE.match(text):
        return None
    try:
        return datetime.fromisoformat(text.replace("Z", "+00:00")).astimezone(timezone.utc)
    except ValueError:
        return None
