"""PgQ operations (the ``pgq`` extension of Skytools, Debian's ``postgresql-<major>-pgq3``), with psycopg.

PgQ stores events in rotating tables per queue and hands them to each registered consumer in *batches*:
the events between two *ticks* (snapshots taken by ``pgq.ticker()``, normally called by the ``pgqd``
daemon). A consumer asks for its next batch (``pgq.next_batch``), reads it (``pgq.get_batch_events``)
and closes it (``pgq.finish_batch``). Values go to ``ev_data`` (text: 100 characters), keys to
``ev_extra1``, and every event has ``ev_type`` ``'b'``.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import datetime, timezone

import psycopg
from psycopg import sql

from .._common import BATCH, DONE, VALUE_SIZE, LatencyArgs, LatencySink, Paced, key, stamped_value, value

#: seconds between two calls of ``pgq.ticker()`` during the latency measurement
TICK_INTERVAL = 0.01
#: seconds a consumer sleeps when ``pgq.next_batch`` has no batch for it
IDLE_POLL = 0.005

_INSERT_ONE = "SELECT pgq.insert_event(%s, 'b', %s, %s, NULL, NULL, NULL)"
_INSERT_MANY = ("SELECT count(pgq.insert_event(%s, 'b', d, k, NULL, NULL, NULL))"
                " FROM unnest(%s::text[], %s::text[]) AS t(d, k)")
_COPY = "COPY {} (ev_time, ev_type, ev_data, ev_extra1) FROM STDIN (FORMAT BINARY)"
_NEXT = "SELECT pgq.next_batch(%s, %s)"
_EVENTS = ("SELECT ev_id, ev_time, ev_txid, ev_retry, ev_type, ev_data, ev_extra1, ev_extra2, ev_extra3,"
           " ev_extra4 FROM pgq.get_batch_events(%s)")
_FINISH = "SELECT pgq.finish_batch(%s)"


def text_value(i: int, size: int = VALUE_SIZE) -> str:
    """A ``size``-character text value, distinct per ``i`` (``ev_data`` is text, not bytea)."""
    return value(i, size).hex()[:size]


def stamped_text(size: int = VALUE_SIZE) -> str:
    """A ``size``-character text value starting with the current time (see :func:`stamp_bytes`)."""
    return stamped_value(8).hex().ljust(size, ".")


def stamp_bytes(data: str) -> bytes:
    """The stamp of :func:`stamped_text` as :func:`bench._common.stamp_of` reads it."""
    return bytes.fromhex(data[:16])


@dataclass(frozen=True)
class PgqTarget:
    """A PgQ queue in a benchmark database (and, for readers, a registered consumer)."""

    dsn: str
    queue: str
    consumer: str = ""
    batch: int = BATCH
    expected: int = 0  # events a reader stops after


def _rows(n: int, start: int = 0) -> tuple[list[str], list[str]]:
    return [text_value(i) for i in range(start, start + n)], [key(i) for i in range(start, start + n)]


def setup_database(dsn: str) -> None:
    """``CREATE EXTENSION pgq`` in the benchmark database."""
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute("CREATE EXTENSION IF NOT EXISTS pgq")


def create_queue(dsn: str, queue: str, consumers: Sequence[str] = (), **config: str) -> None:
    """Create ``queue``, set its ticker ``config`` (``pgq.set_queue_config``) and register ``consumers``."""
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute("SELECT pgq.create_queue(%s)", (queue,))
        for name, setting in config.items():
            conn.execute("SELECT pgq.set_queue_config(%s, %s, %s)", (queue, name, setting))
        for consumer in consumers:
            conn.execute("SELECT pgq.register_consumer(%s, %s)", (queue, consumer))


def version(dsn: str) -> str:
    """The installed PgQ version (``pgq.version()``)."""
    with psycopg.connect(dsn, autocommit=True) as conn:
        row = conn.execute("SELECT pgq.version()").fetchone()
    return str(row[0]) if row else "unknown"


@contextmanager
def insert_batch_op(t: PgqTarget) -> Iterator[Callable[[], int]]:
    """Operation: one transaction of ``t.batch`` ``pgq.insert_event`` calls (one statement over arrays)."""
    data, keys = _rows(t.batch)
    with psycopg.connect(t.dsn, autocommit=True) as conn:
        cur = conn.cursor()

        def op() -> int:
            cur.execute(_INSERT_MANY, (t.queue, data, keys), prepare=True)
            return int(cur.fetchone()[0])  # type: ignore[index]

        yield op


@contextmanager
def copy_batch_op(t: PgqTarget) -> Iterator[Callable[[], int]]:
    """Operation: one transaction that asks ``pgq.current_event_table`` for the queue's event table and
    COPYs ``t.batch`` events into it (binary), the bulk path PgQ documents beside ``insert_event``."""
    data, keys = _rows(t.batch)
    with psycopg.connect(t.dsn, autocommit=True) as conn:
        cur = conn.cursor()

        def op() -> int:
            with conn.transaction():
                table = cur.execute("SELECT pgq.current_event_table(%s)", (t.queue,),
                                    prepare=True).fetchone()[0]  # type: ignore[index]
                stmt = sql.SQL(_COPY).format(sql.Identifier(*str(table).split(".", 1)))
                now = datetime.now(timezone.utc)
                with cur.copy(stmt) as cp:
                    cp.set_types(("timestamptz", "text", "text", "text"))
                    for d, k in zip(data, keys, strict=True):
                        cp.write_row((now, "b", d, k))
            return len(data)

        yield op


@contextmanager
def insert_one_op(t: PgqTarget) -> Iterator[Callable[[], int]]:
    """Operation: one autocommit ``SELECT pgq.insert_event(...)`` (prepared)."""
    import os

    data, keys = _rows(t.batch, start=os.getpid())
    with psycopg.connect(t.dsn, autocommit=True) as conn:
        cur = conn.cursor()
        i = 0

        def op() -> int:
            nonlocal i
            j = i % len(data)
            cur.execute(_INSERT_ONE, (t.queue, data[j], keys[j]), prepare=True)
            cur.fetchone()
            i += 1
            return 1

        yield op


def _read_batch(conn: psycopg.Connection, cur: psycopg.Cursor, t: PgqTarget) -> list[tuple] | None:
    """One transaction: the consumer's next batch, its events as tuples, and the batch finished;
    ``None`` when there is no batch yet."""
    with conn.transaction():
        batch = cur.execute(_NEXT, (t.queue, t.consumer), prepare=True).fetchone()[0]  # type: ignore[index]
        if batch is None:
            return None
        rows = cur.execute(_EVENTS, (batch,), prepare=True).fetchall()
        cur.execute(_FINISH, (batch,), prepare=True)
    return rows


@contextmanager
def consume_op(t: PgqTarget) -> Iterator[Callable[[], int]]:
    """Operation: read and finish one batch (see :func:`_read_batch`), until ``t.expected`` events were
    read or no batch is left."""
    with psycopg.connect(t.dsn, autocommit=True) as conn:
        cur = conn.cursor(binary=True)
        seen = 0

        def op() -> int:
            nonlocal seen
            if seen >= t.expected:
                return DONE
            rows = _read_batch(conn, cur, t)
            if rows is None:
                return DONE
            seen += len(rows)
            return len(rows)

        yield op


def fill(t: PgqTarget, n: int) -> None:
    """Untimed: ``n`` events into ``t.queue`` in transactions of ``t.batch``, with a tick after each, so
    that every batch a consumer gets holds ``t.batch`` events."""
    data, keys = _rows(t.batch)
    with psycopg.connect(t.dsn, autocommit=True) as conn:
        done = 0
        while done < n:
            conn.execute(_INSERT_MANY, (t.queue, data, keys), prepare=True)
            conn.execute("SELECT pgq.ticker(%s)", (t.queue,))
            done += len(data)


@dataclass
class PgqLatencyArgs(LatencyArgs):
    """:class:`bench._common.LatencyArgs` plus the PgQ consumer's name."""

    consumer: str = ""


@contextmanager
def latency_producer(args: PgqLatencyArgs) -> Iterator[Callable[[], int]]:
    """Operation: at a steady pace, the stamped events due: one autocommit ``insert_event`` for one, one
    transaction of them for more."""
    with psycopg.connect(args.dsn, autocommit=True) as conn:
        cur = conn.cursor()

        def send(n: int) -> None:
            if n == 1:
                cur.execute(_INSERT_ONE, (args.target, stamped_text(), key(0)), prepare=True)
            else:
                cur.execute(_INSERT_MANY, (args.target, [stamped_text() for _ in range(n)],
                                           [key(i) for i in range(n)]), prepare=True)
            cur.fetchone()

        yield Paced(args.rate, send)


@contextmanager
def latency_consumer(args: PgqLatencyArgs) -> Iterator[Callable[[], int]]:
    """Operation: take the next batch (sleeping :data:`IDLE_POLL` when there is none), record each event's
    latency, finish the batch. The consumer registers itself first."""
    t = PgqTarget(args.dsn, args.target, args.consumer)
    with psycopg.connect(args.dsn, autocommit=True) as conn:
        conn.execute("SELECT pgq.register_consumer(%s, %s)", (t.queue, t.consumer))  # from the next tick on
        cur = conn.cursor()
        sink = LatencySink(args.skip)

        def op() -> int:
            rows = _read_batch(conn, cur, t)
            if rows is None:
                time.sleep(IDLE_POLL)
                return 0
            for row in rows:
                sink.add(stamp_bytes(row[5]))
            return len(rows)

        op.extra = sink.extra  # type: ignore[attr-defined]
        yield op


@contextmanager
def ticker_op(args: PgqLatencyArgs) -> Iterator[Callable[[], int]]:
    """Operation: every :data:`TICK_INTERVAL` s, ``SELECT pgq.ticker()`` (what ``pgqd`` does, at its
    ``ticker_period``)."""
    with psycopg.connect(args.dsn, autocommit=True) as conn:
        cur = conn.cursor()
        ticks = 0
        t0 = 0.0

        def op() -> int:
            nonlocal ticks, t0
            if not ticks:
                t0 = time.perf_counter()
            wait = t0 + ticks * TICK_INTERVAL - time.perf_counter()
            if wait > 0:
                time.sleep(wait)
            cur.execute("SELECT pgq.ticker()", prepare=True)
            ticks += 1
            return 1

        yield op
