"""Handlers of the observability tests, run by worker processes (``pgstreams worker obs_app:NAME``)."""

from __future__ import annotations

import pgstreams


def fail_fives(event: pgstreams.Event) -> None:
    """At-least-once, no writes: fails on every event whose value is a multiple of 5."""
    if isinstance(event.value, int) and event.value % 5 == 0:
        raise ValueError(f"value {event.value} is a multiple of 5")


async def async_fail_fives(event: pgstreams.Event) -> None:
    """:func:`fail_fives` as an ``async def`` handler."""
    fail_fives(event)
