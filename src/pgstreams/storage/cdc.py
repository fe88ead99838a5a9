"""Typed operations of change data capture (:mod:`pgstreams.cdc`): the captures' rows (``cdc_captures``,
``cdc_tables`` of migration 0034; ``cdc_snapshots``, the incremental snapshots, of migration 0036), and
what the server's logical decoding needs (its settings and the role's rights, publications, replication
slots, decoded changes, the captured tables' catalog)."""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import NamedTuple

import psycopg
from psycopg import sql

from .executor import Executor
from .queries import QuerySet

#: The queries rendered with identifiers of their own (publications, tables, columns, a snapshot).
CDC_QUERIES = QuerySet("pgstreams.storage", "sql", "cdc")

#: The settings of a capturer's connection: values decoded as text are read in these forms (ISO dates in
#: UTC, hexadecimal bytea, floats that read back exactly).
DECODING_SETTINGS = {"DateStyle": "ISO, YMD", "TimeZone": "UTC", "IntervalStyle": "postgres",
                     "extra_float_digits": "3", "bytea_output": "hex"}


def lsn_text(lsn: int) -> str:
    """A WAL position as PostgreSQL writes a ``pg_lsn`` (``16/B374D848``)."""
    return f"{lsn >> 32:X}/{lsn & 0xFFFFFFFF:X}"


def lsn_of(text: str) -> int:
    """A ``pg_lsn`` text as an integer."""
    high, _, low = text.partition("/")
    return (int(high, 16) << 32) | int(low, 16)


class ServerSettings(NamedTuple):
    """What logical decoding needs of the server and of the role: ``wal_level``, the server's version
    number, whether ``user`` may use replication slots (``REPLICATION`` or superuser); the ``database``."""

    wal_level: str
    version: int
    replication: bool
    user: str
    database: str


class TableIdentity(NamedTuple):
    """A table's kind (``r`` table, ``p`` partitioned, ...), replica identity (``d`` default, ``i`` index,
    ``f`` full, ``n`` nothing), primary key columns and replica identity index columns."""

    kind: str
    identity: str
    primary_key: tuple[str, ...]
    identity_index: tuple[str, ...]


@dataclass(frozen=True)
class CaptureRecord:
    """A capture's stored row (see migration 0034) with its tables (``schema.table``)."""

    name: str
    slot: str
    publication: str
    partitions: int
    snapshot: str
    confirmed_lsn: int
    transactions: int
    changes: int
    created_at: datetime
    confirmed_at: datetime | None
    tables: tuple[str, ...]
    tombstones: bool = False


class SlotState(NamedTuple):
    """A replication slot as the server reports it: ``active`` (a process reads it), ``lag_bytes`` (WAL
    written since its confirmed position), ``retained_bytes`` (WAL it keeps: since its restart position),
    ``wal_status`` and ``safe_wal_size`` (``None`` before PostgreSQL 13 or without a size limit),
    ``confirmed_lsn``."""

    active: bool
    lag_bytes: int
    retained_bytes: int
    wal_status: str | None
    safe_wal_size: int | None
    confirmed_lsn: int


class SnapshotJob(NamedTuple):
    """The incremental snapshot a capture works on: its ``id``, table, ``chunk_size`` and ``last_key`` (the
    key columns' text of the last row stored; ``None`` before the first chunk)."""

    id: int
    schema: str
    table: str
    chunk_size: int
    last_key: tuple[str, ...] | None


@dataclass(frozen=True)
class SnapshotRecord:
    """An incremental snapshot's stored row (see migration 0036)."""

    capture: str
    schema: str
    table: str
    chunk_size: int
    rows: int
    chunks: int
    requested_at: datetime
    finished_at: datetime | None


class ExportedSlot(NamedTuple):
    """A slot just created with an exported snapshot: its replication connection (the snapshot lasts
    while it is open), consistent position and snapshot name."""

    conn: psycopg.Connection
    lsn: int
    snapshot: str

    def close(self) -> None:
        """End the exported snapshot (the slot stays)."""
        self.conn.close()


def _tables(tables: Sequence[tuple[str, str]]) -> sql.Composable:
    return sql.SQL(", ").join(sql.Identifier(s, t) for s, t in tables)


class CdcStore:
    """Captures and the server's logical decoding, for one schema."""

    def __init__(self, executor: Executor) -> None:
        self.ex = executor

    def _render(self, name: str, **identifiers: sql.Composable) -> sql.Composed:
        return CDC_QUERIES.render(name, self.ex.schema, identifiers)

    # -- the server and the tables ------------------------------------------------------------------------
    def server_settings(self, conn: psycopg.Connection | None = None) -> ServerSettings:
        """The server's ``wal_level`` and version, the role's replication right."""
        row = self.ex.one("cdc_server_settings", conn=conn)
        return ServerSettings(str(row[0]), int(row[1]), bool(row[2]), str(row[3]), str(row[4]))

    def table_identity(self, schema: str, table: str, conn: psycopg.Connection | None = None
                       ) -> TableIdentity | None:
        """Table ``schema.table``'s kind, replica identity and key columns; ``None``: no such relation."""
        row = self.ex.one("cdc_table_identity", (schema, table), conn=conn)
        if row is None:
            return None
        return TableIdentity(str(row[0]), str(row[1]), tuple(row[2]), tuple(row[3]))

    def table_columns(self, conn: psycopg.Connection, schema: str, table: str) -> list[tuple[str, int]]:
        """The columns of ``schema.table`` (name, type oid), in order."""
        return [(str(r[0]), int(r[1])) for r in self.ex.all("cdc_table_columns", (schema, table), conn=conn)]

    def array_elements(self, conn: psycopg.Connection, oids: Sequence[int]) -> dict[int, int]:
        """The element type of each array type among ``oids``."""
        return {int(r[0]): int(r[1]) for r in self.ex.all("cdc_array_elements", (list(oids),), conn=conn)}

    def snapshot_rows(self, conn: psycopg.Connection, schema: str, table: str, columns: Sequence[str],
                      size: int = 5000) -> Iterator[list[tuple[str | None, ...]]]:
        """The rows of ``schema.table`` (``columns``, each as text) in batches of ``size``, read in
        ``conn``'s open transaction (its snapshot) with a server-side cursor."""
        cols = sql.SQL(", ").join(sql.SQL("{}::text").format(sql.Identifier(c)) for c in columns)
        query = self._render("cdc_snapshot_read", columns=cols, table=sql.Identifier(schema, table))
        with conn.cursor(name="pgstreams_cdc_snapshot") as cur:
            cur.itersize = size
            cur.execute(query)
            while batch := cur.fetchmany(size):
                yield batch

    def read_chunk(self, conn: psycopg.Connection, schema: str, table: str, columns: Sequence[str],
                   key: Sequence[str], after: Sequence[str] | None, limit: int
                   ) -> list[tuple[str | None, ...]]:
        """The next ``limit`` rows of ``schema.table`` by ``key`` (columns), those after the key values
        ``after`` (their text; ``None``: from the first), ``columns`` each as text, in ``conn``'s
        transaction."""
        cols = sql.SQL(", ").join(sql.SQL("{}::text").format(sql.Identifier(c)) for c in columns)
        keys = sql.SQL(", ").join(sql.Identifier(c) for c in key)
        where: sql.Composable = sql.SQL("")
        params: list[object] = []
        if after is not None:
            values = sql.SQL(", ").join(sql.Placeholder() * len(key))
            where = sql.SQL("WHERE ({}) > ({})").format(keys, values)
            params += list(after)
        order = sql.SQL(", ").join(sql.Identifier("row", c) for c in key)
        query = self._render("cdc_chunk_read", columns=cols, table=sql.Identifier(schema, table), order=order,
                             after=where)
        return list(conn.execute(query, [*params, limit]).fetchall())

    # -- incremental snapshots ------------------------------------------------------------------------
    def emit_message(self, conn: psycopg.Connection, prefix: str, content: str) -> None:
        """Write a transactional logical decoding message (in the caller's transaction, or its own)."""
        self.ex.one("cdc_emit_message", (prefix, content), conn=conn)

    def begin_repeatable_read(self, conn: psycopg.Connection) -> None:
        """Make ``conn``'s new transaction repeatable read and read only (its first statement)."""
        self.ex.execute(conn, self._render("cdc_begin_snapshot"))

    def current_snapshot(self, conn: psycopg.Connection) -> str:
        """The snapshot of ``conn``'s transaction as ``pg_current_snapshot()`` writes it."""
        return str(self.ex.one("cdc_current_snapshot", conn=conn)[0])

    def request_snapshot(self, conn: psycopg.Connection, capture: str, schema: str, table: str,
                         chunk_size: int) -> None:
        """Record an incremental snapshot of ``schema.table`` for ``capture`` (one that was there starts
        over), in the caller's transaction."""
        self.ex.run("cdc_snapshot_forget", (capture, schema, table), conn=conn)
        self.ex.run("cdc_snapshot_request", (capture, schema, table, chunk_size), conn=conn)

    def next_snapshot(self, conn: psycopg.Connection, capture: str) -> SnapshotJob | None:
        """The oldest unfinished incremental snapshot of ``capture``; ``None``: none."""
        r = self.ex.one("cdc_snapshot_next", (capture,), conn=conn)
        if r is None:
            return None
        return SnapshotJob(int(r[0]), str(r[1]), str(r[2]), int(r[3]), None if r[4] is None else tuple(r[4]))

    def snapshot_progress(self, conn: psycopg.Connection, job: int, last_key: Sequence[str] | None,
                          rows: int, finished: bool) -> bool:
        """Move snapshot ``job``'s cursor past a chunk of ``rows`` rows ending at ``last_key`` (``None``:
        an empty chunk), finished when ``finished``; false when the snapshot is no longer there."""
        row = self.ex.one("cdc_snapshot_progress", {"id": job, "rows": rows, "finished": finished,
                                                    "last_key": None if last_key is None else list(last_key)},
                          conn=conn)
        return row is not None

    def snapshots(self, capture: str | None = None, conn: psycopg.Connection | None = None
                  ) -> list[SnapshotRecord]:
        """The incremental snapshots of ``capture`` (or of every capture), by capture and table."""
        rows = self.ex.all("cdc_snapshots", {"capture": capture}, conn=conn)
        return [SnapshotRecord(str(r[0]), str(r[1]), str(r[2]), int(r[3]), int(r[4]), int(r[5]), r[6], r[7])
                for r in rows]

    # -- publications and slots -----------------------------------------------------------------------
    def create_publication(self, conn: psycopg.Connection, publication: str,
                           tables: Sequence[tuple[str, str]]) -> None:
        """Create ``publication`` for ``tables`` (schema, table)."""
        self.ex.execute(conn, self._render("cdc_create_publication", publication=sql.Identifier(publication),
                                           tables=_tables(tables)))

    def publication_add(self, conn: psycopg.Connection, publication: str,
                        tables: Sequence[tuple[str, str]]) -> None:
        """Add ``tables`` to ``publication``."""
        self.ex.execute(conn, self._render("cdc_publication_add", publication=sql.Identifier(publication),
                                           tables=_tables(tables)))

    def drop_publication(self, conn: psycopg.Connection, publication: str) -> None:
        """Drop ``publication`` if it exists."""
        self.ex.execute(conn, self._render("cdc_drop_publication", publication=sql.Identifier(publication)))

    def slot_exists(self, conn: psycopg.Connection, slot: str) -> bool:
        """Whether replication slot ``slot`` exists in this database."""
        return self.ex.one("cdc_slot_exists", (slot,), conn=conn) is not None

    def create_slot(self, conn: psycopg.Connection, slot: str) -> int:
        """Create logical replication slot ``slot`` (pgoutput); its consistent position."""
        return lsn_of(self.ex.one("cdc_create_slot", (slot,), conn=conn)[0])

    def export_slot(self, slot: str) -> ExportedSlot:
        """Create logical replication slot ``slot`` (pgoutput) over a replication connection, exporting
        the snapshot of its consistent position: a transaction that imports it
        (:meth:`import_snapshot`) sees the database exactly as of the slot's first change. The snapshot
        lasts until :meth:`ExportedSlot.close`."""
        assert self.ex.pool is not None
        conn = psycopg.connect(str(self.ex.pool.conninfo), replication="database", autocommit=True)
        try:
            # a walsender takes the simple query protocol only
            res = conn.pgconn.exec_(sql.SQL("CREATE_REPLICATION_SLOT {} LOGICAL pgoutput EXPORT_SNAPSHOT")
                                    .format(sql.Identifier(slot)).as_bytes(conn))
            if res.status != psycopg.pq.ExecStatus.TUPLES_OK:
                raise psycopg.errors.error_from_result(res, encoding=conn.info.encoding)
            point, snapshot = res.get_value(0, 1), res.get_value(0, 2)
            assert point is not None and snapshot is not None
        except BaseException:
            conn.close()
            raise
        return ExportedSlot(conn, lsn_of(bytes(point).decode()), bytes(snapshot).decode())

    def import_snapshot(self, conn: psycopg.Connection, snapshot: str) -> None:
        """Begin a repeatable-read, read-only transaction on ``conn`` (idle, set up with
        :meth:`prepare_capturer` first) that sees the exported ``snapshot``."""
        conn.autocommit = False
        self.ex.execute(conn, self._render("cdc_begin_snapshot"))
        self.ex.execute(conn, self._render("cdc_set_snapshot", snapshot=sql.Literal(snapshot)))

    def drop_slot(self, conn: psycopg.Connection, slot: str) -> None:
        """Drop replication slot ``slot`` (it must not be in use)."""
        self.ex.one("cdc_drop_slot", (slot,), conn=conn)

    def slot_state(self, slot: str, conn: psycopg.Connection | None = None) -> SlotState | None:
        """Replication slot ``slot`` as the server reports it; ``None``: no such slot."""
        row = self.ex.one("cdc_slot_state", (slot,), conn=conn)
        if row is None:
            return None
        return SlotState(bool(row[0]), int(row[1] or 0), int(row[2] or 0), row[3],
                         None if row[4] is None else int(row[4]), lsn_of(row[5]) if row[5] else 0)

    # -- captures -------------------------------------------------------------------------------------
    def insert_capture(self, conn: psycopg.Connection, name: str, slot: str, publication: str,
                       partitions: int, snapshot: str, lsn: int, tombstones: bool = False) -> None:
        """Record a new capture, confirmed at ``lsn`` (in the caller's transaction)."""
        self.ex.run("cdc_insert_capture", {"name": name, "slot": slot, "publication": publication,
                                           "partitions": partitions, "snapshot": snapshot,
                                           "tombstones": tombstones, "lsn": lsn_text(lsn)}, conn=conn)

    def insert_table(self, conn: psycopg.Connection, capture: str, schema: str, table: str, topic: str
                     ) -> None:
        """Record that ``capture`` captures ``schema.table`` into ``topic``."""
        self.ex.run("cdc_insert_table", (capture, schema, table, topic), conn=conn)

    def captures(self, name: str | None = None, conn: psycopg.Connection | None = None
                 ) -> list[CaptureRecord]:
        """Every capture (or capture ``name`` only), by name."""
        rows = self.ex.all("cdc_captures", {"name": name}, conn=conn)
        return [CaptureRecord(str(r[0]), str(r[1]), str(r[2]), int(r[3]), str(r[4]), lsn_of(r[5]), int(r[6]),
                              int(r[7]), r[8], r[9], tuple(r[10]), bool(r[11])) for r in rows]

    def capture_tables(self, conn: psycopg.Connection, name: str) -> list[tuple[str, str, str]]:
        """The tables of capture ``name``: (schema, table, topic)."""
        rows = self.ex.all("cdc_capture_tables", (name,), conn=conn)
        return [(str(r[0]), str(r[1]), str(r[2])) for r in rows]

    def delete_capture(self, conn: psycopg.Connection, name: str) -> tuple[str, str] | None:
        """Forget capture ``name``; its (slot, publication), ``None`` when there was none."""
        row = self.ex.one("cdc_delete_capture", (name,), conn=conn)
        return None if row is None else (str(row[0]), str(row[1]))

    def confirm(self, conn: psycopg.Connection, name: str, expected: int, lsn: int, transactions: int,
                changes: int) -> bool:
        """Move capture ``name`` from position ``expected`` to ``lsn`` in the caller's transaction, counting
        ``transactions`` and ``changes``; false (nothing changed) when it is no longer at ``expected``."""
        row = self.ex.one("cdc_confirm", {"name": name, "expected": lsn_text(expected), "lsn": lsn_text(lsn),
                                          "transactions": transactions, "changes": changes}, conn=conn)
        return row is not None

    # -- capturing ------------------------------------------------------------------------------------
    def prepare_capturer(self, conn: psycopg.Connection) -> None:
        """Set up a capturer's connection (:data:`DECODING_SETTINGS`)."""
        self.ex.configure(conn, DECODING_SETTINGS)

    def try_lock(self, conn: psycopg.Connection, name: str) -> bool:
        """Take capture ``name``'s capturer lock on ``conn`` (a session lock) if it is free."""
        return bool(self.ex.one("cdc_capture_lock", (name,), conn=conn)[0])

    def unlock(self, conn: psycopg.Connection, name: str) -> None:
        """Release capture ``name``'s capturer lock held by ``conn``."""
        self.ex.one("cdc_capture_unlock", (name,), conn=conn)

    def flush_lsn(self, conn: psycopg.Connection) -> int:
        """The server's WAL position flushed to disk."""
        return lsn_of(self.ex.one("cdc_flush_lsn", conn=conn)[0])

    def peek(self, conn: psycopg.Connection, slot: str, publication: str, upto: int, limit: int,
             messages: bool = False) -> list[bytes]:
        """The pgoutput messages of the source transactions committed before ``upto`` from ``slot``'s
        position on, whole transactions until about ``limit`` messages (the slot does not move); with
        ``messages`` (PostgreSQL 14+), the logical decoding messages too."""
        rows = self.ex.all("cdc_peek_messages" if messages else "cdc_peek",
                           (slot, lsn_text(upto), limit, publication), conn=conn)
        return [bytes(r[0]) for r in rows]

    def log_snapshot(self, conn: psycopg.Connection) -> bool:
        """Write a record of the running transactions to the WAL (``pg_log_standby_snapshot()``), which
        lets a slot's restart position move at its next advance; false where the server (before
        PostgreSQL 16) or the role (neither superuser nor granted it) cannot."""
        try:
            with conn.transaction():
                self.ex.one("cdc_log_snapshot", conn=conn)
        except (psycopg.errors.UndefinedFunction, psycopg.errors.InsufficientPrivilege):
            return False
        return True

    def advance(self, conn: psycopg.Connection, slot: str, lsn: int) -> None:
        """Move ``slot``'s confirmed position to ``lsn`` (the server keeps no WAL before it for the slot)."""
        self.ex.one("cdc_advance", (slot, lsn_text(lsn)), conn=conn)
