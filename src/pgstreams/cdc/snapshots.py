"""Incremental snapshots: a captured table's rows read again while the capture streams, without losing or
reordering a change (the watermark method of Netflix's DBLog).

A snapshot reads its table in chunks of ``chunk_size`` rows by key, and only the capturing process does the
work, in its rounds (:class:`Snapshotter`, run by :class:`pgstreams.cdc.Capturer`). A chunk is:

1. a **low watermark**: a transactional logical decoding message (``pg_logical_emit_message``) naming the
   chunk's window, committed;
2. the chunk's **read**: the next rows after the snapshot's cursor, by key, in a repeatable-read
   transaction that also notes its snapshot (which source transactions it saw);
3. a **high watermark**, committed.

The capture then meets these in its stream, in commit order. Every row change of the table between the low
and the high watermark drops the row of its key from the chunk (the change's own event carries the row
from there on), and so does one before the low watermark made by a transaction the read did not see (a
transaction whose commit was written just before the low watermark but not yet visible when the read
began). At the high watermark the chunk's remaining rows become events (``op: r``), stored in the
transaction of the events around them, with the snapshot's new cursor. A capture that stops in the middle
of a window forgets the chunk (its watermarks then mean nothing) and reads it again from the stored cursor.
"""

from __future__ import annotations

import json
import secrets
from collections.abc import Iterable
from dataclasses import dataclass, field
from datetime import datetime
from typing import TYPE_CHECKING, Final

import psycopg

from ..errors import InvalidArgument
from ..models import Message
from .events import EventMaker, Shape, Source
from .pgoutput import Column, LogicalMessage, Relation, Tuple
from .values import TypeMap

if TYPE_CHECKING:
    from ..storage.cdc import CdcStore, SnapshotJob, TableIdentity

#: Rows an incremental snapshot reads at a time unless ``chunk_size`` says otherwise.
DEFAULT_CHUNK_SIZE: Final = 1024
#: The largest ``chunk_size`` (a chunk is held in the capturing process's memory until its high watermark).
MAX_CHUNK_SIZE: Final = 100_000
#: The prefix of the logical decoding messages of incremental snapshots (watermarks and requests).
WATERMARK_PREFIX: Final = "pgstreams.cdc"
#: The first server version whose pgoutput sends logical decoding messages (PostgreSQL 14).
MESSAGES_VERSION: Final = 140000


@dataclass(frozen=True)
class SnapshotStatus:
    """An incremental snapshot of table ``table`` (``schema.table``) in capture ``capture``: its
    ``chunk_size``, the ``rows`` (events ``op: r``) and ``chunks`` stored so far, when it was
    ``requested_at`` and ``finished_at`` (``None`` while chunks remain)."""

    capture: str
    table: str
    chunk_size: int
    rows: int
    chunks: int
    requested_at: datetime
    finished_at: datetime | None

    @property
    def finished(self) -> bool:
        """Whether every chunk is stored."""
        return self.finished_at is not None


def check_chunk_size(chunk_size: object) -> int:
    """``chunk_size`` if it is a whole number from 1 to :data:`MAX_CHUNK_SIZE`, else
    :class:`InvalidArgument`."""
    if isinstance(chunk_size, int) and not isinstance(chunk_size, bool) and 0 < chunk_size <= MAX_CHUNK_SIZE:
        return chunk_size
    raise InvalidArgument(f"chunk size must be a whole number from 1 to {MAX_CHUNK_SIZE}, got {chunk_size!r}")


def chunk_key(identity: TableIdentity) -> tuple[str, ...]:
    """The columns a table's chunks are read by: its primary key, else its replica identity index
    (a table with ``REPLICA IDENTITY FULL`` and neither has none)."""
    return identity.primary_key or identity.identity_index


def table_shape(store: CdcStore, conn: psycopg.Connection, prefix: str, types: TypeMap, schema: str,
                table: str) -> Shape:
    """The shape of ``schema.table`` as its catalog describes it now (what a Relation message would say),
    keyed as the capture keys its events: primary key, else replica identity index, else every column."""
    cols = store.table_columns(conn, schema, table)
    identity = store.table_identity(schema, table, conn)
    index = identity.identity_index if identity else ()
    relation = Relation(0, schema, table, identity.identity if identity else "d",
                        tuple(Column(n, oid, -1, n in index) for n, oid in cols))
    shape = Shape.of(relation, prefix, types, identity.primary_key if identity else ())
    if not shape.key:
        shape.key = tuple(range(len(cols)))
    return shape


def _content(schema: str, capture: str, mark: str, window: str | None = None) -> str:
    body: dict[str, str] = {"schema": schema, "capture": capture, "mark": mark}
    if window is not None:
        body["window"] = window
    return json.dumps(body, separators=(",", ":"))


def request(store: CdcStore, conn: psycopg.Connection, schema: str, capture: str, job: tuple[str, str],
            chunk_size: int) -> None:
    """Record an incremental snapshot of table ``job`` (schema, table) for ``capture`` and tell its
    capturing process through its stream (in the caller's transaction: it learns it at the commit)."""
    store.request_snapshot(conn, capture, job[0], job[1], chunk_size)
    store.emit_message(conn, WATERMARK_PREFIX, _content(schema, capture, "request"))


class Visibility:
    """Which source transactions a snapshot saw, from ``pg_current_snapshot()``'s text
    (``xmin:xmax:xip,...``), for the 32-bit transaction ids of pgoutput's Begin messages."""

    def __init__(self, text: str) -> None:
        xmin, xmax, xip = text.split(":")
        self.xmin = int(xmin) & 0xFFFFFFFF
        self.span = (int(xmax) - int(xmin)) & 0xFFFFFFFF
        self.running = {int(x) & 0xFFFFFFFF for x in xip.split(",") if x}

    def sees(self, xid: int) -> bool:
        """Whether a transaction ``xid`` that committed was visible to the snapshot."""
        offset = (xid - self.xmin) & 0xFFFFFFFF
        if offset >= 1 << 31:  # before xmin: ended before the snapshot
            return True
        return offset < self.span and xid not in self.running


@dataclass
class Chunk:
    """A chunk read and waiting for its high watermark in the stream: ``rows`` by event key (in key
    order), the key of the last row read (the snapshot's next cursor), whether it is the table's last."""

    job: SnapshotJob
    window: str
    shape: Shape
    visibility: Visibility
    rows: dict[str, Tuple] = field(default_factory=dict)
    last_key: tuple[str, ...] | None = None
    last: bool = False
    read: int = 0
    opened: bool = False

    def of(self, schema: str, table: str) -> bool:
        """Whether the chunk is of table ``schema.table``."""
        return self.job.schema == schema and self.job.table == table

    def changed(self, txid: int, keys: Iterable[str | None]) -> None:
        """Row changes of the table by source transaction ``txid``: their keys' rows leave the chunk when
        the change is inside the window, or the read did not see it."""
        if self.opened or not self.visibility.sees(txid):
            for key in keys:
                if key is not None:
                    self.rows.pop(key, None)

    def truncated(self, txid: int) -> None:
        """The table truncated by ``txid``: every row leaves the chunk (under the same rule)."""
        if self.opened or not self.visibility.sees(txid):
            self.rows.clear()

    def events(self, maker: EventMaker, source: Source) -> list[Message]:
        """The events of the rows left (``op: r``), at the high watermark's ``source``."""
        return [maker.snapshot_row(self.shape, source, values) for values in self.rows.values()]


class Snapshotter:
    """The incremental snapshots of a capturer: :meth:`open` reads a chunk between its watermarks;
    :meth:`watermark` tells the capturer what a logical decoding message of the stream means."""

    def __init__(self, store: CdcStore, schema: str, capture: str, types: TypeMap,
                 supported: bool) -> None:
        self.store = store
        self.schema = schema
        self.capture = capture
        self.types = types
        #: whether the server decodes logical decoding messages (PostgreSQL 14+)
        self.supported = supported
        #: whether an unfinished snapshot may be waiting (checked at the next :meth:`open`)
        self.pending = supported
        #: the chunk waiting for its high watermark
        self.chunk: Chunk | None = None

    @property
    def busy(self) -> bool:
        """Whether a chunk is open or a snapshot may be waiting."""
        return self.chunk is not None or self.pending

    def _mark(self, mark: str, window: str) -> str:
        return _content(self.schema, self.capture, mark, window)

    def open(self, conn: psycopg.Connection) -> Chunk | None:
        """Read the next chunk of the oldest unfinished snapshot between its watermarks (``conn``:
        the capturer's, autocommit); ``None`` when a chunk is open already or no snapshot waits."""
        if self.chunk is not None or not self.pending:
            return None
        job = self.store.next_snapshot(conn, self.capture)
        if job is None:
            self.pending = False
            return None
        window = secrets.token_hex(8)
        identity = self.store.table_identity(job.schema, job.table, conn)
        key = chunk_key(identity) if identity is not None else ()
        self.store.emit_message(conn, WATERMARK_PREFIX, self._mark("low", window))
        with conn.transaction():
            self.store.begin_repeatable_read(conn)
            visibility = Visibility(self.store.current_snapshot(conn))
            shape = table_shape(self.store, conn, self.capture, self.types, job.schema, job.table)
            columns = [c.name for c in shape.columns]
            rows = self.store.read_chunk(conn, job.schema, job.table, columns, key, job.last_key,
                                         job.chunk_size) if key and identity is not None else []
        self.store.emit_message(conn, WATERMARK_PREFIX, self._mark("high", window))
        chunk = Chunk(job, window, shape, visibility, read=len(rows), last=len(rows) < job.chunk_size)
        positions = [columns.index(k) for k in key]
        for values in rows:
            chunk.rows[shape.key_of(shape.row(values))] = values
        if rows:
            chunk.last_key = tuple(str(rows[-1][i]) for i in positions)
        self.chunk = chunk
        return chunk

    def watermark(self, message: LogicalMessage) -> Chunk | None:
        """Read a logical decoding message of the stream: a request makes :meth:`open` look again; the low
        watermark of the open chunk opens its window; its high watermark returns the chunk (closed: the
        capturer stores its rows and cursor). Other messages (other captures', the application's) mean
        nothing here."""
        if message.prefix != WATERMARK_PREFIX:
            return None
        try:
            body = json.loads(message.content)
        except ValueError:
            return None
        if not isinstance(body, dict) or (body.get("schema"), body.get("capture")) != (self.schema,
                                                                                          self.capture):
            return None
        if body.get("mark") == "request":
            self.pending = True
            return None
        chunk = self.chunk
        if chunk is None or body.get("window") != chunk.window:
            return None  # the watermarks of a chunk this process did not read (it started since)
        if body.get("mark") == "low":
            chunk.opened = True
            return None
        if body.get("mark") == "high":
            self.chunk = None
            self.pending = True
            return chunk
        return None

    def stored(self, conn: psycopg.Connection, chunk: Chunk) -> None:
        """Move the chunk's snapshot past it (in the transaction that stores its events)."""
        self.store.snapshot_progress(conn, chunk.job.id, chunk.last_key, len(chunk.rows), chunk.last)
