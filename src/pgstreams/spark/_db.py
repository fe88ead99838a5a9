"""Database access shared by the readers and writers of the Spark data source: the Spark bulk queries
(``queries.sql``), and the storage layer's operations for what is core state (migrations, topics, the read
fences, checkpoints)."""

from __future__ import annotations

import contextlib
import functools
import time
from collections.abc import Iterable, Iterator, Mapping, Sequence
from datetime import datetime

import psycopg

from ..errors import ConfigurationError, MigrationError, TopicNotFound
from ..pooler import DEFAULT_POOLER, Pooler, connection_options, keeps_sessions
from ..reconnect import DEFAULT_RETRY_TIMEOUT, FIRST_BACKOFF, MAX_BACKOFF, retriable
from ..storage import CORE, Store, TopicRecord
from ._options import Cursor
from ._sql import query, topic_query


@functools.lru_cache(maxsize=64)
def store(schema: str, pooler: Pooler = DEFAULT_POOLER) -> Store:
    """The storage operations of ``schema``, over the connections the caller passes (Spark's processes
    hold plain connections, no pool), for connections in mode ``pooler``."""
    return Store(None, schema, pooler=pooler)


#: Seconds the work of a running query (read and write tasks, the stream's offsets and commits on the
#: driver) keeps trying to connect while the server refuses connections (restarting, starting up), with
#: the client's backoff; analysing a query (options, schema, planning a batch read) does not wait.
RUNTIME_CONNECT_WAIT = DEFAULT_RETRY_TIMEOUT


def connect(dsn: str, wait: float = 0.0, pooler: Pooler = DEFAULT_POOLER) -> psycopg.Connection:
    """An autocommit connection tuned for bulk reads (no JIT compilation, no parallel workers). ``wait``
    (seconds, default 0): how long to keep trying while the server refuses connections (see
    :func:`pgstreams.reconnect.retriable`), pausing 50 ms doubling up to 1 s between attempts. ``pooler``
    (option ``pooler``, see :mod:`pgstreams.pooler`): behind a transaction pooler the connection prepares
    no statement and changes no session setting (a server session serves other clients between
    transactions: set ``jit = off`` for the role instead)."""
    deadline = time.monotonic() + wait
    pause = FIRST_BACKOFF
    options = connection_options(pooler)
    while True:
        try:
            conn = psycopg.connect(dsn, connect_timeout=15, **options)
            break
        except psycopg.Error as exc:
            if not retriable(exc) or time.monotonic() + pause > deadline:
                raise ConfigurationError(
                    f"option 'dsn': cannot connect to PostgreSQL: {str(exc).strip()}") from exc
        time.sleep(pause)
        pause = min(pause * 2, MAX_BACKOFF)
    if keeps_sessions(pooler):
        conn.execute(query("bulk_read_settings", "pgstreams"))
    return conn


#: Idle connections of :func:`reused`, per DSN and pooler mode, kept by this process.
_IDLE: dict[tuple[str, Pooler], list[psycopg.Connection]] = {}
#: How many idle connections :func:`reused` keeps per DSN and process (a write task uses two, a read
#: task chained before it in the same worker one more).
IDLE_KEPT = 3


@contextlib.contextmanager
def reused(dsn: str, wait: float = 0.0, pooler: Pooler = DEFAULT_POOLER) -> Iterator[psycopg.Connection]:
    """A connection of :func:`connect` that this process keeps for its later tasks: Spark reuses its
    Python workers, so a read or write task of a streaming query's next micro-batch does not pay for a new
    session.
    An idle connection of ``dsn`` is taken if one answers (one round trip; else a new one is made), handed
    back when the block ends and closed instead when the block raises (or is not idle then). Nothing of
    the driver's process is used: only ``dsn``."""
    idle = _IDLE.setdefault((dsn, pooler), [])
    conn: psycopg.Connection | None = None
    while idle and conn is None:
        candidate = idle.pop()
        try:
            candidate.execute("SELECT 1")
            conn = candidate
        except psycopg.Error:
            candidate.close()
    if conn is None:
        conn = connect(dsn, wait, pooler)
    try:
        yield conn
    except BaseException:
        conn.close()
        raise
    if (not conn.closed and conn.info.transaction_status == psycopg.pq.TransactionStatus.IDLE
            and len(idle) < IDLE_KEPT):
        idle.append(conn)
    else:
        conn.close()


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


def topics(conn: psycopg.Connection, schema: str, names: Sequence[str],
           option: str = "topic") -> list[TopicRecord]:
    """The topics ``names`` in that order; raises :class:`TopicNotFound` naming the missing ones."""
    found = store(schema).topics.find(names, conn)
    missing = [n for n in names if n not in found]
    if missing:
        raise TopicNotFound(f"option {option!r}: topic(s) {', '.join(repr(m) for m in missing)} do not exist "
                            f"in schema {schema!r}")
    return [found[n] for n in names]


def fences(conn: psycopg.Connection, schema: str, topic: TopicRecord,
           partitions: Iterable[int] | None = None) -> dict[int, int]:
    """The read fence of each partition of ``topic`` (default: all): every event below it is committed or
    rolled back for good, so reads in later statements, on any connection, see all of them. Only open
    transactions that publish to a partition hold its fence back."""
    parts = list(range(topic.partitions) if partitions is None else partitions)
    return store(schema).events.fences(conn, topic.id, parts)


def latest(fences: Mapping[int, int]) -> dict[int, Cursor]:
    """The cursor after every event below each fence."""
    return {p: f - 1 for p, f in fences.items()}


def time_cursors(conn: psycopg.Connection, schema: str, topic: TopicRecord, fences: Mapping[int, int],
                 at: datetime) -> dict[int, Cursor]:
    """Per partition of ``fences``, the cursor just before its first event below its fence created at or
    after ``at`` (the fence's cursor when there is none)."""
    return store(schema).events.time_cursors(conn, topic.id, fences, at)


def legacy_cursors(conn: psycopg.Connection, schema: str, topic: TopicRecord, fences: Mapping[int, int],
                   legacy: Mapping[int, tuple[int, int]]) -> dict[int, Cursor]:
    """Per partition of ``legacy``, the cursor standing for an offset of the former form ``(xid,
    position)`` ("after this event" when events were read in ``(xid, position)`` order): just before the
    first event below the fence that came after it in that order, at most the fence's cursor. Nothing that
    came after it is skipped; events published by older transactions at larger positions are read again."""
    ps = sorted(legacy)
    rows = conn.execute(topic_query("legacy_cursors", schema, topic.id), {
        "partitions": ps, "xids": [str(legacy[p][0]) for p in ps], "positions": [legacy[p][1] for p in ps],
        "fences": [fences[p] for p in ps],
    }).fetchall()
    return {int(p): int(c) for p, c in rows}


def group_cursors(conn: psycopg.Connection, schema: str, group: str, topic: TopicRecord) -> dict[int, Cursor]:
    """The checkpoints of ``group`` on ``topic`` (partitions without one are absent)."""
    return store(schema).checkpoints.load(conn, group, topic.id, range(topic.partitions))


def count_between(conn: psycopg.Connection, schema: str, topic: TopicRecord, starts: Mapping[int, Cursor],
                  ends: Mapping[int, Cursor], cap: int) -> dict[int, int]:
    """Per partition of ``starts``, the number of events in ``(start, end]``, counted up to ``cap``."""
    ps = sorted(starts)
    rows = conn.execute(topic_query("count_between", schema, topic.id), {
        "partitions": ps, "positions": [starts[p] for p in ps], "end_positions": [ends[p] for p in ps],
        "cap": cap,
    }).fetchall()
    return {int(p): int(n) for p, n in rows}


def nth_cursors(conn: psycopg.Connection, schema: str, topic: TopicRecord, starts: Mapping[int, Cursor],
                ends: Mapping[int, Cursor], nth: Mapping[int, int]) -> dict[int, Cursor | None]:
    """Per partition of ``nth``, the cursor of the ``nth`` event in ``(start, end]`` (``None`` if there
    are fewer)."""
    ps = sorted(nth)
    rows = conn.execute(topic_query("nth_cursors", schema, topic.id), {
        "partitions": ps, "positions": [starts[p] for p in ps], "end_positions": [ends[p] for p in ps],
        "nth": [nth[p] for p in ps],
    }).fetchall()
    return {int(p): (None if c is None else int(c)) for p, c in rows}


def removed_between(conn: psycopg.Connection, schema: str, topic_id: int, starts: Mapping[int, Cursor],
                    ends: Mapping[int, Cursor]) -> dict[int, tuple[int, int, int]]:
    """Per partition of ``starts``, what retention removed of its events in ``(start, end]``: the first and
    last removed position there and about how many events (partitions that lost nothing are absent)."""
    ps = sorted(p for p in starts if ends[p] > starts[p])
    if not ps:
        return {}
    rows = conn.execute(query("removed_between", schema), {
        "topic_id": topic_id, "partitions": ps, "positions": [starts[p] for p in ps],
        "end_positions": [ends[p] for p in ps],
    }).fetchall()
    return {int(p): (int(a), int(b), int(n)) for p, a, b, n in rows}
