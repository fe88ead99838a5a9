"""Formatting for the console's templates: values (JSON pretty-printed, bytes as hex), times, sizes,
and small SVG charts drawn on the server."""

from __future__ import annotations

import json
from collections.abc import Sequence
from datetime import datetime, timezone
from typing import Any

from markupsafe import Markup, escape


def value_text(value: Any) -> tuple[str, str]:
    """An event value for display and its kind: JSON pretty-printed (``json``), text (``text``), or bytes
    as hex (``bytes``)."""
    if isinstance(value, bytes | bytearray | memoryview):
        data = bytes(value)
        return " ".join(data[i:i + 16].hex(" ") for i in range(0, len(data), 16)), "bytes"
    if isinstance(value, str):
        return value, "text"
    return json.dumps(value, indent=2, ensure_ascii=False, sort_keys=True), "json"


def when(dt: datetime | None) -> str:
    """A time in UTC, ISO 8601 to the millisecond (empty for none)."""
    if dt is None:
        return ""
    return dt.astimezone(timezone.utc).isoformat(timespec="milliseconds").replace("+00:00", "Z")


def count(n: int | None) -> str:
    """A count with thousands separators (136,267); empty for None."""
    return "" if n is None else f"{n:,}"


def size(n: int | None) -> str:
    """Bytes for people (1.5 MiB)."""
    if n is None:
        return ""
    value = float(n)
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if value < 1024 or unit == "TiB":
            return f"{value:.0f} {unit}" if unit == "B" else f"{value:.1f} {unit}"
        value /= 1024
    return f"{n} B"  # pragma: no cover


def age(since: datetime | None, now: datetime) -> str:
    """How long before ``now`` ``since`` was, for people: 0.4 s, 12 s, 5 min, 3 h, 2 d (empty for none)."""
    if since is None:
        return ""
    seconds = max(0.0, (now - since).total_seconds())
    if seconds < 10:
        return f"{seconds:.1f} s"
    for unit, length in (("d", 86400), ("h", 3600), ("min", 60)):
        if seconds >= length:
            return f"{seconds / length:.0f} {unit}"
    return f"{seconds:.0f} s"


def duration(ms: int | None) -> str:
    """A retention by age (milliseconds) for people: 7d, 12h, 30m, 45s."""
    if ms is None:
        return ""
    seconds = ms / 1000
    for unit, length in (("d", 86400), ("h", 3600), ("m", 60)):
        if seconds >= length and seconds % length == 0:
            return f"{int(seconds // length)}{unit}"
    return f"{seconds:g}s"


def sparkline(values: Sequence[float], label: str, unit: str = "", width: int = 140, height: int = 28
              ) -> Markup:
    """A small line chart of ``values`` (oldest first) as inline SVG, titled ``label``, followed by its
    scale (the chart runs from 0 at the bottom to the largest value at the top, in ``unit``); a dash when
    there are fewer than two."""
    if len(values) < 2:
        return Markup('<span class="muted" title="collecting samples">&mdash;</span>')
    top = max(values) or 1.0
    step = width / (len(values) - 1)
    points = " ".join(f"{i * step:.1f},{height - 2 - (v / top) * (height - 4):.1f}"
                      for i, v in enumerate(values))
    scale = f"{top:,.0f}" if top >= 100 else f"{top:.3g}"
    return Markup(
        f'<svg class="spark" width="{width}" height="{height}" viewBox="0 0 {width} {height}" role="img" '
        f'aria-label="{escape(label)}"><title>{escape(label)}</title>'
        f'<polyline fill="none" stroke="currentColor" stroke-width="1.5" points="{points}"/></svg>'
        f'<span class="spark-scale small muted" title="the chart\'s scale">0&ndash;{escape(scale)}'
        f'{escape(unit)}</span>')
