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


_conns: dict[int, object] = {}


async def async_record(event: pgstreams.Event) -> None:
    """``async def``, at-least-once: logs the delivery in ``deliveries`` (see ``workers_app.create_tables``)
    over an async connection to ``$OBS_APP_DSN``, after yielding to the event loop; fails on multiples of
    5 like :func:`fail_fives`."""
    import asyncio
    import os

    import psycopg

    await asyncio.sleep(0)
    conn = _conns.get(id(asyncio.get_running_loop()))
    if conn is None:
        conn = _conns[id(asyncio.get_running_loop())] = await psycopg.AsyncConnection.connect(
            os.environ["OBS_APP_DSN"], autocommit=True)
    assert isinstance(conn, psycopg.AsyncConnection)
    await conn.execute("INSERT INTO deliveries (topic, partition, position, member) VALUES (%s, %s, %s, %s)",
                       (event.topic, event.partition, event.position, os.environ.get("WORKERS_APP_NAME", "")))
    fail_fives(event)
