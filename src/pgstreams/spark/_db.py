"""Database access shared by the readers and writers of the Spark data source: the Spark bulk queries
(``queries.sql``), and the storage layer's operations for what is core state (migrations, topics, the read
fence, checkpoints)."""

from __future__ import annotations

import functools
from collections.abc import Iterable, Sequence
from datetime import datetime

import psycopg

from ..errors import ConfigurationError, MigrationError, TopicNotFound
from ..storage import CORE, Store, TopicRecord
from ._options import ORIGIN, Cursor
from ._sql import query, topic_query

#: The largest position (used as an open upper bound of cursors).
MAX_POSITION = 2**63 - 1


@functools.lru_cache(maxsize=64)
def store(schema: str) -> Store:
    """The storage operations of ``schema``, over the connections the caller passes (Spark's processes
    hold plain connections, no pool)."""
    return Store(None, schema)


def connect(dsn: str) -> psycopg.Connection:
    """An autocommit connection tuned for bulk reads (no JIT compilation, no parallel workers)."""
    try:
        conn = psycopg.connect(dsn, autocommit=True, connect_timeout=15)
    except psycopg.Error as exc:
        raise ConfigurationError(f"option 'dsn': cannot connect to PostgreSQL: {str(exc).strip()}") from exc
    conn.execute(query("bulk_read_settings", "pgstreams"))
    return conn


def ensure_migrated(conn: psycopg.Connection, schema: str) -> None:
    """Apply pending pgstreams migrations to ``schema`` (raise a clear error if that is not permitted)."""
    if not CORE.pending(conn, schema):
        return
    try:
        CORE.migrate(conn, schema)
    except psycopg.Error as exc:
        raise MigrationError(f"schema {schema!r} needs pgstreams migrations and they could not be applied: "
                             f"{str(exc).strip()} (run `pgstreams migrate`)") from exc


def check_server(conn: psycopg.Connection) -> None:
    """Check the database encoding (UTF8 is required)."""
    row = conn.execute(query("server_info", "pgstreams")).fetchone()
    assert row is not None
    if str(row[0]).upper() not in ("UTF8", "UTF-8"):
        raise ConfigurationError(f"pgstreams.spark needs a UTF8 database, this one is {row[0]}")


def fence(conn: psycopg.Connection, schema: str) -> int:
    """The read fence of ``schema`` (``read_fence()``): every transaction of this database below it has
    ended, so no event can appear below it any more. Transactions of other databases on the same server
    do not hold it back (they cannot write this database's events)."""
    return store(schema).events.read_fence(conn)


def topics(conn: psycopg.Connection, schema: str, names: Sequence[str],
           option: str = "topic") -> list[TopicRecord]:
    """The topics ``names`` in that order; raises :class:`TopicNotFound` naming the missing ones."""
    found = store(schema).topics.find(names, conn)
    missing = [n for n in names if n not in found]
    if missing:
        raise TopicNotFound(f"option {option!r}: topic(s) {', '.join(repr(m) for m in missing)} do not exist "
                            f"in schema {schema!r}")
    return [found[n] for n in names]


def _cursors(rows: Iterable[tuple[int, int | None, int | None]]) -> dict[int, Cursor | None]:
    return {int(p): (None if x is None or pos is None else (int(x), int(pos))) for p, x, pos in rows}


def heads(conn: psycopg.Connection, schema: str, topic: TopicRecord, partitions: Sequence[int],
          fence_xid: int) -> dict[int, Cursor]:
    """Per partition, the cursor of the last event visible under ``fence_xid`` (``ORIGIN`` if none)."""
    rows = conn.execute(topic_query("heads", schema, topic.id),
                        {"partitions": list(partitions), "fence": str(fence_xid)}).fetchall()
    return {p: (c or ORIGIN) for p, c in _cursors(rows).items()}


def position_cursors(conn: psycopg.Connection, schema: str, topic: TopicRecord, targets: dict[int, int],
                     fence_xid: int) -> dict[int, Cursor | None]:
    """Per partition, the cursor just before its first visible event at or after a position
    (``None``: none)."""
    ps = sorted(targets)
    rows = conn.execute(topic_query("position_cursors", schema, topic.id),
                        {"partitions": ps, "targets": [targets[p] for p in ps],
                         "fence": str(fence_xid)}).fetchall()
    return {p: (None if c is None else (c[0], c[1] - 1)) for p, c in _cursors(rows).items()}


def time_cursors(conn: psycopg.Connection, schema: str, topic: TopicRecord, partitions: Sequence[int],
                 at: datetime, fence_xid: int) -> dict[int, Cursor | None]:
    """Per partition, the cursor just before its first visible event (in read order) created at or after
    ``at`` (``None``: none)."""
    rows = conn.execute(topic_query("time_cursors", schema, topic.id),
                        {"partitions": list(partitions), "at": at, "fence": str(fence_xid)}).fetchall()
    return {p: (None if c is None else (c[0], c[1] - 1)) for p, c in _cursors(rows).items()}


def group_cursors(conn: psycopg.Connection, schema: str, group: str, topic: TopicRecord) -> dict[int, Cursor]:
    """The checkpoints of ``group`` on ``topic`` (partitions without one are absent)."""
    return store(schema).checkpoints.load(conn, group, topic.id, range(topic.partitions))


def count_between(conn: psycopg.Connection, schema: str, topic: TopicRecord, starts: dict[int, Cursor],
                  ends: dict[int, Cursor], cap: int) -> dict[int, int]:
    """Per partition, the number of events in ``(start, end]``, counted up to ``cap``."""
    ps = sorted(starts)
    rows = conn.execute(topic_query("count_between", schema, topic.id), {
        "partitions": ps, "xids": [str(starts[p][0]) for p in ps], "positions": [starts[p][1] for p in ps],
        "end_xids": [str(ends[p][0]) for p in ps], "end_positions": [ends[p][1] for p in ps], "cap": cap,
    }).fetchall()
    return {int(p): int(n) for p, n in rows}


def nth_cursors(conn: psycopg.Connection, schema: str, topic: TopicRecord, starts: dict[int, Cursor],
                nth: dict[int, int]) -> dict[int, Cursor | None]:
    """Per partition, the cursor of the ``nth`` event after its start (``None`` if there are fewer)."""
    ps = sorted(nth)
    rows = conn.execute(topic_query("nth_cursors", schema, topic.id), {
        "partitions": ps, "xids": [str(starts[p][0]) for p in ps], "positions": [starts[p][1] for p in ps],
        "nth": [nth[p] for p in ps],
    }).fetchall()
    return _cursors(rows)
