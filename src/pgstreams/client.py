"""The client: connection, topics, publishing and group status."""

from __future__ import annotations

import functools
import hashlib
import itertools
import json
import math
import os
import random
import threading
import weakref
from collections.abc import Iterable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import datetime, timezone
from typing import TYPE_CHECKING, Any

import psycopg
from psycopg import pq
from psycopg.rows import tuple_row
from psycopg.types.json import Jsonb
from psycopg.types.string import BytesBinaryDumper
from psycopg_pool import ConnectionPool

from . import migrate as _migrate
from ._codec import KIND_BYTES, check_headers, check_optional_str, encode_value
from ._names import check_group, check_partitions, check_schema, check_topic
from ._notify import Listener, Notifier, channel
from ._queries import query, seq_name
from .errors import ConfigurationError, InvalidArgument, MigrationError, TopicConflict, TopicNotFound
from .models import (
    GroupInfo,
    GroupPartitionStatus,
    Message,
    PartitionInfo,
    PublishResult,
    TopicDescription,
    TopicInfo,
)
from .partitioner import partition_for_key

if TYPE_CHECKING:
    from .consumer import Consumer, Start

#: Default number of positions per storage segment of a topic (the unit retention drops).
DEFAULT_SEGMENT_SIZE = 1_000_000
_MESSAGE_FIELDS = frozenset(Message.__dataclass_fields__)
_COPY_COLUMNS = (
    "partition", "kind", "key", "value", "headers", "event_type", "event_id", "correlation_id", "causation_id"
)
# Keys repeat: remember recent keys' partitions (murmur2 in Python costs microseconds per key).
_key_partition = functools.lru_cache(maxsize=16384)(partition_for_key)
# Binary COPY dumpers per column. kind is a one-byte ASCII "char", whose binary form is that byte: the
# text dumper writes exactly it.
_COPY_TYPES = ("int4", "text", "text", "bytea", "jsonb", "text", "text", "text", "text")


@dataclass
class _TopicMeta:
    id: int
    name: str
    partitions: int
    segment_size: int
    hi: int
    rr: Iterator[int]
    room_due: int = 0  # events publish_many may still COPY before it re-checks the segments ahead
    stats_next: int = 0  # the position from which this client checks a segment's statistics again
    copied_to: int = -1  # a lower bound of the last position publish_many stored (-1: unknown)


# Parameter types and formats of _insert_statement: int4, "char", text, bytea (binary), jsonb, text x 4.
_INSERT_OIDS = (23, 18, 25, 17, 3802, 25, 25, 25, 25)
_INSERT_FORMATS = (0, 0, 0, 1, 0, 0, 0, 0, 0)


@functools.lru_cache(maxsize=1024)
def _insert_statement(schema: str, topic_id: int) -> tuple[bytes, bytes]:
    """Name and text (with $n placeholders) of a topic's single-event insert, for libpq."""
    parts = _insert_sql(schema, topic_id).split(b"%s")
    text = parts[0] + b"".join(b"$%d" % i + part for i, part in enumerate(parts[1:], 1))
    return b"pgstreams_insert_" + hashlib.sha1(text).hexdigest()[:16].encode(), text


@functools.lru_cache(maxsize=1024)
def _insert_sql(schema: str, topic_id: int) -> bytes:
    """The single-event insert of a topic, rendered once (psycopg re-renders a Composed every time)."""
    return query("insert_event", schema, topic_id).as_bytes(None)


def _utc(dt: datetime) -> datetime:
    return dt.astimezone(timezone.utc)


def _bad_text(s: str) -> str | None:
    """Why PostgreSQL text cannot hold ``s`` (a NUL character, an unpaired surrogate), else ``None``."""
    if "\x00" in s:
        return "contains a NUL character"
    if not s.isascii():
        try:
            s.encode("utf-8")
        except UnicodeEncodeError:
            return "is not valid Unicode (unpaired surrogate)"
    return None


def resolve_dsn(dsn: str | None) -> str:
    """The DSN to use: ``dsn``, else ``$PGSTREAMS_DSN``, else the embedded server's."""
    if dsn:
        return dsn
    env = os.environ.get("PGSTREAMS_DSN")
    if env:
        return env
    from .embedded import embedded_dsn

    return embedded_dsn()


def connect(
    dsn: str | None = None,
    *,
    schema: str = "pgstreams",
    migrate: bool = True,
    pool_size: int = 10,
    poll_interval: float = 0.25,
) -> Client:
    """Connect to PostgreSQL and return a :class:`Client` (also usable as a context manager).

    ``dsn`` defaults to ``$PGSTREAMS_DSN``, else an embedded PostgreSQL started on demand (see
    :mod:`pgstreams.embedded`). ``schema`` (default ``"pgstreams"``) holds every table. ``migrate``
    (default true) applies pending migrations. ``pool_size`` (default 10) bounds the connection pool.
    ``poll_interval`` (default 0.25 s) is how often waiting consumers poll when no notification arrives.
    """
    _check_options(schema, migrate, pool_size, poll_interval)
    if dsn is not None and not isinstance(dsn, str):
        raise InvalidArgument(f"dsn must be a string, not {type(dsn).__name__}")
    if dsn is not None and not dsn.strip():
        # an empty DSN would silently fall back to $PGSTREAMS_DSN or the embedded server
        raise InvalidArgument("dsn must not be empty (None uses $PGSTREAMS_DSN or the embedded server)")
    return Client(resolve_dsn(dsn), schema=schema, migrate=migrate, pool_size=pool_size,
                  poll_interval=float(poll_interval))


def _check_options(schema: object, migrate: object, pool_size: object, poll_interval: object) -> None:
    """Validate the options of :func:`connect` and :class:`Client` before anything is connected."""
    check_schema(schema)
    if not isinstance(migrate, bool):  # migrate="no" would be truthy and migrate
        raise InvalidArgument(f"migrate must be True or False, not {migrate!r}")
    if isinstance(pool_size, bool) or not isinstance(pool_size, int) or pool_size < 1:
        raise InvalidArgument(f"pool_size must be a positive integer, got {pool_size!r}")
    if (isinstance(poll_interval, bool) or not isinstance(poll_interval, (int, float))
            or not 0 < poll_interval < math.inf):
        raise InvalidArgument(f"poll_interval must be a positive number, got {poll_interval!r}")


class Client:
    """A connection to a pgstreams database. Thread-safe; create one per process. A context manager:
    leaving the ``with`` block closes it.

    Prefer :func:`connect`, which resolves the DSN and validates arguments. The arguments and their
    defaults are those of :func:`connect` (``schema="pgstreams"``, ``migrate=True``, ``pool_size=10``,
    ``poll_interval=0.25``), except that ``dsn`` is required.
    """

    def __init__(
        self, dsn: str, *, schema: str = "pgstreams", migrate: bool = True, pool_size: int = 10,
        poll_interval: float = 0.25,
    ) -> None:
        if not isinstance(dsn, str) or not dsn.strip():
            raise InvalidArgument(f"dsn must be a non-empty string, not {dsn!r}")
        _check_options(schema, migrate, pool_size, poll_interval)
        self.dsn = dsn
        self.schema = schema
        self.poll_interval = float(poll_interval)
        try:
            probe = psycopg.connect(dsn, autocommit=True,
                                    connect_timeout=10)
        except psycopg.Error as exc:
            raise ConfigurationError(f"cannot connect to PostgreSQL: {str(exc).strip()}") from exc
        with probe:
            if migrate:
                _migrate.migrate(probe, schema)
            else:
                shipped = {m.version for m in _migrate.available()}
                done = set(_migrate.applied_versions(probe, schema))
                if shipped - done:
                    raise MigrationError(
                        f"schema {schema!r} lacks migrations {sorted(shipped - done)}: "
                        "run `pgstreams migrate`"
                    )
        self._pool = ConnectionPool(
            dsn, min_size=1, max_size=pool_size, kwargs={"autocommit": True}, open=True, name="pgstreams"
        )
        self._topics: dict[str, _TopicMeta] = {}
        self._topics_lock = threading.Lock()
        self._notifier = Notifier(self._raw_connect, schema)
        # per pooled connection: its encoding and the statements _insert_direct prepared on it
        self._prepared: weakref.WeakKeyDictionary[psycopg.Connection, tuple[str, set[bytes]]] = (
            weakref.WeakKeyDictionary())
        self._prepared_lock = threading.Lock()
        self._listener = Listener(self._raw_connect, schema)
        self._closed = False

    # -- plumbing -----------------------------------------------------------------------------------
    def _raw_connect(self) -> psycopg.Connection:
        return psycopg.connect(self.dsn, autocommit=True)

    @contextmanager
    def connection(self) -> Iterator[psycopg.Connection]:
        """Borrow a pooled autocommit connection (for ad-hoc SQL on the same database)."""
        with self._pool.connection() as conn:
            yield conn

    def close(self) -> None:
        """Close the pool and background threads. Idempotent."""
        if self._closed:
            return
        self._closed = True
        self._notifier.stop(5)  # sends what is pending first
        self._listener.stop(5)
        self._pool.close()

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"<pgstreams.Client schema={self.schema!r}>"

    def _q(self, name: str, topic_id: int | None = None) -> psycopg.sql.Composed:
        return query(name, self.schema, topic_id)

    def _topic(
        self, name: str, *, refresh: bool = False, conn: psycopg.Connection | None = None
    ) -> _TopicMeta:
        if not refresh and type(name) is str:
            meta = self._topics.get(name)  # cached names were checked when cached
            if meta is not None:
                return meta
        check_topic(name)
        if conn is not None:  # a caller already holding a pooled connection must not wait for another
            row = conn.cursor(row_factory=tuple_row).execute(self._q("topic_by_name"), (name,)).fetchone()
        else:
            with self._pool.connection() as c:
                row = c.cursor(row_factory=tuple_row).execute(self._q("topic_by_name"), (name,)).fetchone()
        if row is None:
            with self._topics_lock:
                self._topics.pop(name, None)
            raise TopicNotFound(f"topic {name!r} does not exist")
        tid, tname, parts, seg, _cfg, _created, hi = row
        meta = _TopicMeta(tid, tname, parts, seg, int(hi or 0), itertools.count(random.randrange(parts)))
        with self._topics_lock:
            self._topics[name] = meta
        return meta

    def _forget(self, name: str) -> None:
        with self._topics_lock:
            self._topics.pop(name, None)

    # -- topics --------------------------------------------------------------------------------------
    def create_topic(
        self, name: str, partitions: int = 1, *, segment_size: int = DEFAULT_SEGMENT_SIZE
    ) -> TopicInfo:
        """Create topic ``name`` with ``partitions`` partitions (default 1, at most
        :data:`pgstreams.MAX_PARTITIONS`).

        Idempotent for an identical definition; raises :class:`TopicConflict` if the topic exists with
        another partition count or segment size, :class:`InvalidName` for a bad name. ``segment_size``
        (default 1,000,000 positions) is the storage unit that retention drops.
        """
        check_topic(name)
        check_partitions(partitions)
        if isinstance(segment_size, bool) or not isinstance(segment_size, int) or segment_size < 1000:
            raise InvalidArgument(f"segment_size must be an integer >= 1000, got {segment_size!r}")
        with self._pool.connection() as conn, conn.transaction():
            cur = conn.cursor(row_factory=tuple_row)
            row = cur.execute(self._q("insert_topic"), (name, partitions, segment_size, Jsonb({}))).fetchone()
            if row is not None:
                cur.execute(self._q("create_topic_storage"), (row[0],))
        info = self._info(name)
        if info.partitions != partitions:
            raise TopicConflict(
                f"topic {name!r} exists with {info.partitions} partitions, not {partitions}"
            )
        if info.segment_size != segment_size:
            raise TopicConflict(
                f"topic {name!r} exists with segment_size {info.segment_size}, not {segment_size}"
            )
        return info

    def _info(self, name: str) -> TopicInfo:
        with self._pool.connection() as conn:
            row = conn.cursor(row_factory=tuple_row).execute(self._q("topic_by_name"), (name,)).fetchone()
        if row is None:
            raise TopicNotFound(f"topic {name!r} does not exist")
        return TopicInfo(row[1], row[2], _utc(row[5]), row[3], row[4])

    def list_topics(self) -> list[TopicInfo]:
        """All topics, by name."""
        with self._pool.connection() as conn:
            rows = conn.cursor(row_factory=tuple_row).execute(self._q("list_topics")).fetchall()
        return [TopicInfo(r[1], r[2], _utc(r[5]), r[3], r[4]) for r in rows]

    def describe_topic(self, name: str) -> TopicDescription:
        """A topic's definition with, per partition, its event count and head position.

        Counting is proportional to the topic's size.
        """
        meta = self._topic(name, refresh=True)
        info = self._info(name)
        with self._pool.connection() as conn:
            rows = conn.cursor(row_factory=tuple_row).execute(
                self._q("partition_stats", meta.id), (meta.partitions,)
            ).fetchall()
        return TopicDescription(info, tuple(PartitionInfo(p, int(n), h) for p, n, h in rows))

    def delete_topic(self, name: str) -> None:
        """Delete a topic, its events and every group checkpoint on it. Raises :class:`TopicNotFound`."""
        check_topic(name)
        with self._pool.connection() as conn, conn.transaction():
            cur = conn.cursor(row_factory=tuple_row)
            row = cur.execute(self._q("delete_topic"), (name,)).fetchone()
            if row is None:
                raise TopicNotFound(f"topic {name!r} does not exist")
            cur.execute(psycopg.sql.SQL("DROP TABLE IF EXISTS {} CASCADE").format(
                psycopg.sql.Identifier(self.schema, f"topic_{row[0]}")))
            cur.execute(psycopg.sql.SQL("DROP SEQUENCE IF EXISTS {}").format(
                psycopg.sql.Identifier(self.schema, f"topic_{row[0]}_seq")))
        self._forget(name)

    # -- publishing ----------------------------------------------------------------------------------
    def _partition(self, meta: _TopicMeta, key: str | None, partition: object) -> int:
        if partition is not None:
            if isinstance(partition, bool) or not isinstance(partition, int):
                raise InvalidArgument(f"partition must be an integer, not {type(partition).__name__}")
            if not 0 <= partition < meta.partitions:
                raise InvalidArgument(
                    f"partition {partition} out of range for topic {meta.name!r} "
                    f"(0 to {meta.partitions - 1})"
                )
            return partition
        if key is not None:
            return _key_partition(key, meta.partitions)
        return next(meta.rr) % meta.partitions

    def _row(self, meta: _TopicMeta, value: Any, key: object, headers: object, partition: object,
             event_type: object, event_id: object, correlation_id: object, causation_id: object) -> tuple:
        # runs once per event in publish_many: the checks of absent fields are skipped inline
        if key is not None:
            if not isinstance(key, str):
                raise InvalidArgument(f"key must be a string or None, not {type(key).__name__}")
            if why := _bad_text(key):
                raise InvalidArgument(f"key {key!r} {why}")
        hdrs = None if headers is None else check_headers(headers)
        if hdrs:
            for k, v in hdrs.items():
                if why := _bad_text(k) or _bad_text(v):
                    raise InvalidArgument(f"header {k!r}: {v!r} {why}")
        if event_type is None and event_id is None and correlation_id is None and causation_id is None:
            et = eid = cid = sid = None
        else:
            et = check_optional_str("event_type", event_type)
            eid = check_optional_str("event_id", event_id)
            cid = check_optional_str("correlation_id", correlation_id)
            sid = check_optional_str("causation_id", causation_id)
            for name, text in (("event_type", et), ("event_id", eid), ("correlation_id", cid),
                               ("causation_id", sid)):
                if text is not None and (why := _bad_text(text)):
                    raise InvalidArgument(f"{name} {text!r} {why}")
        if partition is None and key is not None:
            p = _key_partition(key, meta.partitions)
        else:
            p = self._partition(meta, key, partition)
        if type(value) is bytes:
            kind, payload = KIND_BYTES, value
        else:
            try:
                kind, payload = encode_value(value)
            except UnicodeEncodeError as exc:
                raise InvalidArgument(f"value is not valid Unicode (unpaired surrogate): {exc}") from None
        return (p, kind, key, payload, Jsonb(hdrs) if hdrs else None, et, eid, cid, sid)

    def _ensure_room(self, meta: _TopicMeta, position: int, conn: psycopg.Connection | None = None) -> None:
        """Keep at least one empty segment ahead of ``position``. ``conn``: an autocommit connection the
        caller holds (taking a second pooled one while holding one can exhaust the pool and hang)."""
        if position + meta.segment_size < meta.hi:
            return
        if conn is not None:
            row = conn.execute(
                self._q("ensure_segments", meta.id), (meta.id, position + meta.segment_size)
            ).fetchone()
        else:
            with self._pool.connection() as c:
                row = c.execute(
                    self._q("ensure_segments", meta.id), (meta.id, position + meta.segment_size)
                ).fetchone()
        if row and row[0]:
            meta.hi = int(row[0])

    def publish(
        self,
        topic: str,
        value: Any,
        *,
        key: str | None = None,
        headers: Mapping[str, str] | None = None,
        partition: int | None = None,
        event_type: str | None = None,
        event_id: str | None = None,
        correlation_id: str | None = None,
        causation_id: str | None = None,
        conn: psycopg.Connection | None = None,
    ) -> PublishResult:
        """Publish one event and return where it was stored.

        ``value`` is bytes, str or any JSON-serialisable object; consumers get the same type back (JSON
        values as ``json.loads`` returns them: a tuple comes back as a list, dict keys as strings).
        ``key`` picks the partition with :func:`pgstreams.partitioner.partition_for_key` unless
        ``partition`` is given; with neither, partitions are used round-robin. With ``event_id``,
        publishing is idempotent: if the topic already holds that id nothing is stored and the first
        result is returned (with ``duplicate=True``). With ``conn`` (a psycopg connection), the event
        joins that connection's open transaction and is visible only once the caller commits.
        Every keyword argument defaults to ``None``: no key, headers, event type or ids, a pooled
        connection in its own transaction.
        """
        meta = self._topic(topic)
        row = self._row(meta, value, key, headers, partition, event_type, event_id, correlation_id,
                        causation_id)
        if conn is not None:
            if not isinstance(conn, psycopg.Connection):
                raise InvalidArgument(f"conn must be a psycopg Connection, not {type(conn).__name__}")
            result = self._insert(conn, meta, row)
            conn.execute("SELECT pg_notify(%s, %s)", (channel(self.schema), str(meta.id)))
        else:
            # getconn/putconn: the connection() context manager costs as much again on this path
            c = self._pool.getconn()
            try:
                try:
                    result = self._insert(c, meta, row, pooled=True)
                except psycopg.errors.UndefinedTable:
                    meta = self._topic(topic, refresh=True, conn=c)
                    result = self._insert(c, meta, row, pooled=True)
                except psycopg.errors.CheckViolation:
                    # the position fell beyond the last segment: add segments and retry once
                    self._ensure_room(meta, self._last_position(c, meta), conn=c)
                    result = self._insert(c, meta, row, pooled=True)
                if result.position >= meta.stats_next:
                    self._check_stats(c, meta, result.position)
            finally:
                self._pool.putconn(c)
            self._notifier.poke(meta.id)
        self._ensure_room(meta, result.position)
        return result

    def _last_position(self, conn: psycopg.Connection, meta: _TopicMeta) -> int:
        row = conn.execute(self._q("sequence_last_value", meta.id)).fetchone()
        return int(row[0]) if row else 0

    def _insert(self, conn: psycopg.Connection, meta: _TopicMeta, row: tuple, pooled: bool = False
                ) -> PublishResult:
        if pooled and row[6] is None:
            return PublishResult(meta.name, row[0], self._insert_direct(conn, meta, row))
        cur = conn.cursor(row_factory=tuple_row)
        if row[6] is None:
            pos = cur.execute(_insert_sql(self.schema, meta.id), row, prepare=True).fetchone()
            assert pos is not None
            return PublishResult(meta.name, row[0], int(pos[0]))
        params = dict(zip(_COPY_COLUMNS, row, strict=True))
        params.update(topic_id=meta.id, seq=seq_name(self.schema, meta.id))
        got = cur.execute(self._q("insert_event_idempotent", meta.id), params).fetchone()
        if got is not None:
            return PublishResult(meta.name, row[0], int(got[0]))
        prev = cur.execute(self._q("existing_event_id"), (meta.id, row[6])).fetchone()
        if prev is None:  # pragma: no cover - the conflicting row vanished (topic recreated)
            raise TopicNotFound(f"topic {meta.name!r} changed while publishing")
        return PublishResult(meta.name, int(prev[0]), int(prev[1]), duplicate=True)

    def _insert_direct(self, conn: psycopg.Connection, meta: _TopicMeta, row: tuple, retry: bool = True
                       ) -> int:
        """Insert an event without event id on a pooled autocommit connection; return its position.

        Straight through libpq: psycopg's query layer (adaptation, prepared-statement bookkeeping) cost
        twice the client CPU of this whole call. The statement is prepared once per connection.
        """
        name, text = _insert_statement(self.schema, meta.id)
        with self._prepared_lock:
            state = self._prepared.get(conn)
            if state is None:
                state = self._prepared[conn] = (conn.info.encoding, set())
        enc, names = state
        pg = conn.pgconn
        if name not in names:
            res = pg.prepare(name, text, _INSERT_OIDS)
            if res.status != pq.ExecStatus.COMMAND_OK:
                raise psycopg.errors.error_from_result(res, encoding=enc)
            names.add(name)
        p, kind, key, payload, hdrs, et, _eid, cid, sid = row
        params: list[bytes | None] = [
            b"%d" % p, kind.encode(), None if key is None else key.encode(enc), payload,
            None if hdrs is None else json.dumps(hdrs.obj).encode(enc),
            None if et is None else et.encode(enc), None,
            None if cid is None else cid.encode(enc), None if sid is None else sid.encode(enc),
        ]
        res = pg.exec_prepared(name, params, _INSERT_FORMATS)  # type: ignore[arg-type]  # None: NULL
        if res.status != pq.ExecStatus.TUPLES_OK:
            if retry and res.error_field(pq.DiagnosticField.SQLSTATE) == b"26000":
                names.discard(name)  # the prepared statement was discarded (DISCARD ALL, DEALLOCATE)
                return self._insert_direct(conn, meta, row, retry=False)
            raise psycopg.errors.error_from_result(res, encoding=enc)
        return int(res.get_value(0, 0))  # type: ignore[arg-type]

    def publish_many(self, topic: str, events: Iterable[Message | Mapping[str, Any]]) -> int:
        """Publish events in one transaction with COPY: all or none. Returns the number stored.

        ``events`` holds :class:`Message` objects or dicts with the same keys (``value`` required).
        Events whose ``event_id`` the topic already holds (or that repeat one earlier in the batch) are
        not stored and not counted.
        """
        meta = self._topic(topic)
        if isinstance(events, (Message, Mapping, str, bytes)) or not isinstance(events, Iterable):
            raise InvalidArgument(
                f"events must be an iterable of Message objects or dicts, not {type(events).__name__}"
            )
        rows = []
        has_ids = False
        for i, ev in enumerate(events):
            if isinstance(ev, Message):
                fields: Mapping[str, Any] = ev.__dict__
            elif isinstance(ev, Mapping):
                unknown = set(ev) - _MESSAGE_FIELDS
                if unknown:
                    raise InvalidArgument(f"event {i}: unknown field(s) {sorted(unknown)}")
                if "value" not in ev:
                    raise InvalidArgument(f"event {i}: missing 'value'")
                fields = ev
            else:
                raise InvalidArgument(f"event {i}: expected a Message or a dict, not {type(ev).__name__}")
            try:
                row = self._row(meta, fields["value"], fields.get("key"), fields.get("headers"),
                                fields.get("partition"), fields.get("event_type"), fields.get("event_id"),
                                fields.get("correlation_id"), fields.get("causation_id"))
            except InvalidArgument as exc:
                raise InvalidArgument(f"event {i}: {exc}") from None
            has_ids = has_ids or row[6] is not None
            rows.append(row)
        if not rows:
            return 0
        with self._pool.connection() as conn:
            stored = self._copy(conn, meta, rows, has_ids)
        self._notifier.poke(meta.id)
        return stored

    def _copy(self, conn: psycopg.Connection, meta: _TopicMeta, rows: list[tuple], has_ids: bool) -> int:
        # Reading the sequence to keep segments ahead costs a round trip: do it once every 1/16 segment
        # of events; if other clients' events outran it, the COPY fails (no segment for a position)
        # and is retried once after adding segments.
        last = -1
        if meta.room_due <= 0:
            meta.room_due = max(1, meta.segment_size // 16)
            last = self._last_position(conn, meta)
            self._ensure_room(meta, last + len(rows), conn=conn)
        meta.room_due -= len(rows)
        try:
            stored = self._copy_rows(conn, meta, rows, has_ids)
        except psycopg.errors.CheckViolation:
            self._ensure_room(meta, self._last_position(conn, meta) + len(rows), conn=conn)
            stored = self._copy_rows(conn, meta, rows, has_ids)
        # positions of other clients' events only move the true last position further: this is a lower
        # bound, re-read with the segments every 1/16 segment
        if last >= 0:
            meta.copied_to = last + len(rows)
        elif meta.copied_to >= 0:
            meta.copied_to += len(rows)
        if meta.copied_to >= meta.stats_next:
            self._check_stats(conn, meta, meta.copied_to)
        return stored

    def _check_stats(self, conn: psycopg.Connection, meta: _TopicMeta, position: int) -> None:
        """Make sure the segment holding ``position`` has column statistics (a round trip once per segment
        and client; see ``analyze_segment`` in 0001_initial.sql): without them a poll of a new topic
        sorts whole partitions."""
        if position < meta.stats_next:
            return
        try:
            row = conn.execute(self._q("analyze_segment"), (meta.id, position)).fetchone()
        except psycopg.errors.UndefinedFunction:  # a schema migrated before the function existed
            row = (True,)
        if row is None or row[0]:  # done for this segment
            meta.stats_next = (position // meta.segment_size + 1) * meta.segment_size
        else:  # too few rows yet
            meta.stats_next = position + min(1000, meta.segment_size // 2)

    def _copy_rows(self, conn: psycopg.Connection, meta: _TopicMeta, rows: list[tuple], has_ids: bool) -> int:
        cols = psycopg.sql.SQL(", ").join(psycopg.sql.Identifier(c) for c in _COPY_COLUMNS)
        if not has_ids:
            # one COPY statement on the autocommit connection is one transaction: all rows or none
            stmt = psycopg.sql.SQL("COPY {} ({}) FROM STDIN (FORMAT BINARY)").format(
                psycopg.sql.Identifier(self.schema, f"topic_{meta.id}"), cols)
            cur = conn.cursor()
            # by oid, bytea would get the (Python) dumper of psycopg.Binary: use the C one for bytes
            cur.adapters.register_dumper(None, BytesBinaryDumper)
            with cur.copy(stmt) as cp:
                cp.set_types(_COPY_TYPES)
                for r in rows:
                    cp.write_row(r)
            return len(rows)
        with conn.transaction():
            cur = conn.cursor()
            cur.execute(self._q("staging_table"))
            stmt = psycopg.sql.SQL("COPY pgstreams_staging (ord, {}) FROM STDIN").format(cols)
            with cur.copy(stmt) as cp:
                for i, r in enumerate(rows):
                    cp.write_row((i, *r))
            cur.execute(self._q("insert_staged", meta.id),
                        {"topic_id": meta.id, "seq": seq_name(self.schema, meta.id)})
            return cur.rowcount

    # -- consuming -----------------------------------------------------------------------------------
    def consumer(self, topic: str, group: str, *, start: Start = "earliest") -> Consumer:
        """A :class:`Consumer` of ``topic`` in stream group ``group``.

        ``start`` applies to partitions the group has no checkpoint on yet: ``"earliest"`` (default,
        replay everything), ``"latest"`` (only events published from now on) or an aware ``datetime``
        (events from that time on). Existing checkpoints always win. No event of a transaction still in
        progress is skipped: while one of this database is open, ``"latest"`` and a time may also
        deliver some events committed just before the start.
        """
        from .consumer import Consumer, create_checkpoints

        create_checkpoints(self, topic, group, start=start)
        return Consumer(self, topic, group, start=start)

    # -- groups --------------------------------------------------------------------------------------
    def describe_group(self, group: str, topic: str | None = None) -> list[GroupPartitionStatus]:
        """Per topic and partition of ``group``: checkpoint, head and lag. Raises ``GroupNotFound``."""
        from .errors import GroupNotFound

        check_group(group)
        if topic is not None:
            check_topic(topic)
        out: list[GroupPartitionStatus] = []
        with self._pool.connection() as conn:
            cur = conn.cursor(row_factory=tuple_row)
            topics = cur.execute(self._q("groups_of"), (group, group)).fetchall()
            for _g, tname, tid in topics:
                if topic is not None and tname != topic:
                    continue
                for r in cur.execute(self._q("group_status", tid), (tid, group, group)).fetchall():
                    out.append(GroupPartitionStatus(r[0], r[1], r[2], r[3], r[4], int(r[5]), _utc(r[6])))
        if not out:
            raise GroupNotFound(f"group {group!r} has no checkpoints"
                                + (f" on topic {topic!r}" if topic else ""))
        return out

    def list_groups(self) -> list[GroupInfo]:
        """Every group with checkpoints, the topics it reads and its total lag."""
        with self._pool.connection() as conn:
            rows = conn.cursor(row_factory=tuple_row).execute(self._q("groups_of"), (None, None)).fetchall()
        groups: dict[str, list[str]] = {}
        for g, t, _tid in rows:
            groups.setdefault(g, []).append(t)
        out = []
        for g, ts in groups.items():
            lag = sum(s.lag for s in self.describe_group(g))
            out.append(GroupInfo(g, tuple(ts), lag))
        return out
