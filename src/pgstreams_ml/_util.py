"""Small helpers: durations, code version, waiting with a deadline."""

from __future__ import annotations

import functools
import re
import subprocess
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from pgstreams.errors import InvalidArgument

from . import __version__

_DURATION_RE = re.compile(r"(\d+(?:\.\d+)?)(h|m|s)")


def parse_duration(text: str | float | int, what: str = "duration") -> float:
    """Seconds in ``text``: a number of seconds, or units like ``4h``, ``90m``, ``1h30m``, ``45s``.

    Raises :class:`pgstreams.InvalidArgument` naming ``what`` for anything else or a negative value.
    """
    if isinstance(text, bool):
        raise InvalidArgument(f"{what} must be a duration like 4h, 90m or 30s, not {text!r}")
    if isinstance(text, (int, float)):
        value = float(text)
    else:
        s = str(text).strip().lower()
        try:
            value = float(s)
        except ValueError:
            pos, value = 0, 0.0
            for m in _DURATION_RE.finditer(s):
                if m.start() != pos:
                    break
                value += float(m.group(1)) * {"h": 3600, "m": 60, "s": 1}[m.group(2)]
                pos = m.end()
            if pos != len(s) or not s:
                raise InvalidArgument(
                    f"{what} must be a duration like 4h, 90m or 30s, not {text!r}"
                ) from None
    if value < 0 or value != value:
        raise InvalidArgument(f"{what} must not be negative, got {text!r}")
    return value


def interval_seconds(text: str) -> float:
    """Seconds in a Spark interval such as ``15 minutes`` or ``1 hour`` (units second, minute, hour, day,
    singular or plural), else in a duration of :func:`parse_duration` (``what`` is ``window``)."""
    num, _, unit = text.strip().partition(" ")
    unit = unit.rstrip("s") or "second"
    mult = {"second": 1, "minute": 60, "hour": 3600, "day": 86400}.get(unit)
    if mult is None:
        return parse_duration(text, "window")
    return float(num) * mult


@functools.cache
def code_version() -> str:
    """The application's version plus the git commit of its source tree when it runs from a checkout."""
    root = Path(__file__).resolve().parents[2]
    try:
        out = subprocess.run(
            ["git", "-C", str(root), "rev-parse", "--short=12", "HEAD"],
            capture_output=True,
            text=True,
            timeout=5,
            check=False,
        )
        commit = out.stdout.strip() if out.returncode == 0 else ""
    except (OSError, subprocess.SubprocessError):
        commit = ""
    return f"{__version__}+{commit}" if commit else __version__


def wait_until(
    predicate: Callable[[], bool],
    timeout: float,
    interval: float = 0.2,
    stop: Callable[[], bool] | None = None,
) -> bool:
    """Poll ``predicate`` every ``interval`` seconds (default 0.2) until it is true (return true) or
    ``timeout`` seconds passed or ``stop()`` is true (return false)."""
    deadline = time.monotonic() + timeout
    while True:
        if predicate():
            return True
        if time.monotonic() >= deadline or (stop is not None and stop()):
            return False
        time.sleep(interval)


def read_committed(client: Any, topic: str, group: str, timeout: float = 120.0) -> list[Any]:
    """Every event of ``topic`` committed when the call starts (and any committed meanwhile), read from
    the beginning as ``group`` (rewound first).

    An empty poll does not end the read: a partition's read fence can trail committed events (a
    transaction still open that published to it), so the read goes on until it holds as many events as
    the topic held at the start, then takes whatever else is visible. Raises ``TimeoutError`` naming the
    topic when that takes longer than ``timeout``.
    """
    expected = client.describe_topic(topic).events
    consumer = client.consumer(topic, group)
    consumer.seek_to_beginning()
    out: list[Any] = []
    deadline = time.monotonic() + timeout
    while len(out) < expected:
        got = consumer.poll(max_events=10_000, timeout=1.0)
        out.extend(got)
        if not got and time.monotonic() > deadline:
            raise TimeoutError(f"read {len(out)} of the {expected} events of topic {topic!r} "
                               f"in {timeout:.0f} s")
    while got := consumer.poll(max_events=10_000, timeout=0.0):
        out.extend(got)
    return out
