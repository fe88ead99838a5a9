"""The captures of a database (``client.cdc``): adding tables, listing, describing and removing captures,
and the capturers and services that run them.

A capture is named by its topic prefix and owns a publication and a logical replication slot (plugin
``pgoutput``) named after it (:func:`slot_name`). Adding checks first, and changes nothing when a check
fails: the server's ``wal_level``, the role's ``REPLICATION`` right, each table (it exists, is not one of
pgstreams' own, and has a primary key or a replica identity).
"""

from __future__ import annotations

import builtins
import dataclasses
import hashlib
import logging
import re
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import TYPE_CHECKING, Literal

import psycopg

from ..errors import ConfigurationError, ConnectionLost, InvalidArgument, InvalidName, PermissionDenied
from ..models import Message
from ..names import check_partitions, check_topic
from ..services import Service
from ..storage.cdc import CaptureRecord, SnapshotRecord, lsn_text
from .capture import (
    DEFAULT_BATCH,
    DEFAULT_CAPTURE_INTERVAL,
    DEFAULT_TAKEOVER_INTERVAL,
    CaptureNotFound,
    Capturer,
    CaptureService,
)
from .events import EventMaker, Source, topic_name
from .snapshots import (
    DEFAULT_CHUNK_SIZE,
    MESSAGES_VERSION,
    SnapshotStatus,
    check_chunk_size,
    chunk_key,
    request,
    table_shape,
)
from .values import TypeMap

if TYPE_CHECKING:
    from .capture import CaptureClient

Snapshot = Literal["initial", "never"]
#: The topic prefix of a capture unless ``topic_prefix`` says otherwise (it names the capture).
DEFAULT_TOPIC_PREFIX = "cdc"
#: The partitions of a capture's topics unless ``partitions`` says otherwise.
DEFAULT_CDC_PARTITIONS = 1
#: Whether a new capture first reads the tables' rows (``"initial"``) or only their changes (``"never"``).
DEFAULT_SNAPSHOT: Snapshot = "never"
#: Rows of a snapshot read and stored at a time.
SNAPSHOT_BATCH = 5000
#: WAL a capture's slot may keep on the server (bytes) before the slot guard warns (and drops it if asked).
DEFAULT_MAX_RETAINED = 1 << 30
#: Seconds between two checks of the slot guard's service (:meth:`Cdc.guard_service`).
DEFAULT_GUARD_INTERVAL = 60.0

log = logging.getLogger("pgstreams.cdc")


@dataclass(frozen=True)
class SlotAlarm:
    """A capture whose slot keeps too much WAL (``retained_bytes``, over the guard's limit) or lost WAL it
    needed (``wal_status`` ``"lost"``); ``dropped`` when the guard dropped the slot."""

    capture: str
    slot: str
    retained_bytes: int
    wal_status: str | None
    dropped: bool

_MANAGED_HINT = ("(on a managed service set its parameter instead: rds.logical_replication = 1 on Amazon RDS "
                 "and Aurora, cloudsql.logical_decoding = on on Cloud SQL, wal_level = logical on Azure)")


@dataclass(frozen=True)
class CaptureInfo:
    """A capture: ``name`` (its topic prefix), ``slot`` and ``publication`` it owns, its topics'
    ``partitions``, ``snapshot`` (``"initial"`` or ``"never"``), ``tables`` (``schema.table``) and their
    ``topics``, ``confirmed_lsn`` (the end of the last source transaction stored), ``transactions`` and
    ``changes`` stored, ``created_at``, ``confirmed_at``, ``tombstones`` (a tombstone follows each delete);
    the slot as the server reports it (``None``
    when the slot is gone): ``slot_active`` (a process reads it), ``lag_bytes`` (WAL written since its
    confirmed position), ``retained_bytes`` (WAL the server keeps for it), ``wal_status`` and
    ``safe_wal_size``; its incremental ``snapshots`` (:class:`SnapshotStatus`, by table)."""

    name: str
    slot: str
    publication: str
    partitions: int
    snapshot: str
    tables: tuple[str, ...]
    topics: tuple[str, ...]
    confirmed_lsn: str
    transactions: int
    changes: int
    created_at: datetime
    confirmed_at: datetime | None
    tombstones: bool = False
    slot_active: bool | None = None
    lag_bytes: int | None = None
    retained_bytes: int | None = None
    wal_status: str | None = None
    safe_wal_size: int | None = None
    snapshots: tuple[SnapshotStatus, ...] = ()


def slot_name(database: str, schema: str, prefix: str) -> str:
    """The replication slot (and publication) of the capture ``prefix`` of ``schema`` in ``database`` (slot
    names are the server's, shared by its databases): ``pgstreams_``, schema and prefix in the characters
    a slot name allows, and a digest of the three that keeps different ones apart."""
    readable = re.sub(r"[^a-z0-9_]", "_", f"{schema}_{prefix}".lower())[:40]
    digest = hashlib.sha1(f"{database}\0{schema}\0{prefix}".encode()).hexdigest()[:8]
    return f"pgstreams_{readable}_{digest}"


def parse_table(name: object) -> tuple[str, str]:
    """``schema.table`` or ``table`` (schema ``public``) as (schema, table)."""
    if not isinstance(name, str) or not name or name.count(".") > 1 or "" in name.split("."):
        raise InvalidName(f"invalid table {name!r}: give TABLE or SCHEMA.TABLE")
    schema, _, table = name.rpartition(".")
    return schema or "public", table


class Cdc:
    """Change data capture of a client's database (``client.cdc``; see :mod:`pgstreams.cdc`)."""

    def __init__(self, client: CaptureClient) -> None:
        self.client = client
        self.session = client.session
        self.store = client.session.store.cdc

    # -- checks ---------------------------------------------------------------------------------------
    def check_server(self, conn: psycopg.Connection | None = None) -> None:
        """Raise :class:`ConfigurationError` unless ``wal_level`` is ``logical``, and
        :class:`PermissionDenied` unless the role may use replication slots; each says what to change."""
        settings = self.store.server_settings(conn)
        if settings.wal_level != "logical":
            raise ConfigurationError(
                f"change data capture needs wal_level = logical and the server has {settings.wal_level}: "
                "run ALTER SYSTEM SET wal_level = logical and restart PostgreSQL " + _MANAGED_HINT)
        if not settings.replication:
            raise PermissionDenied(
                f"role {settings.user!r} may not use replication slots: ALTER ROLE {settings.user} "
                f"REPLICATION (on Amazon RDS: GRANT rds_replication TO {settings.user})")

    def _check_table(self, schema: str, table: str, conn: psycopg.Connection) -> None:
        name = f"{schema}.{table}"
        if schema == self.session.schema:
            raise InvalidArgument(f"{name} is a table of pgstreams' own (schema {schema}): never captured")
        identity = self.store.table_identity(schema, table, conn)
        if identity is None:
            raise InvalidArgument(f"table {name} does not exist")
        if identity.kind != "r":
            raise InvalidArgument(f"{name} is not a plain table (kind {identity.kind!r}): capture its "
                                  "partitions, or a table")
        if identity.identity == "n":
            raise InvalidArgument(f"table {name} has REPLICA IDENTITY NOTHING: its updates and deletes "
                                  f"cannot be captured; ALTER TABLE {name} REPLICA IDENTITY DEFAULT (with "
                                  "a primary key) or FULL")
        if identity.identity == "d" and not identity.primary_key:
            raise InvalidArgument(f"table {name} has no primary key: add one, or ALTER TABLE {name} "
                                  "REPLICA IDENTITY FULL (or USING INDEX a unique index)")

    # -- administration -------------------------------------------------------------------------------
    def add(self, tables: Sequence[str], *, topic_prefix: str = DEFAULT_TOPIC_PREFIX,
            partitions: int = DEFAULT_CDC_PARTITIONS, snapshot: Snapshot = DEFAULT_SNAPSHOT,
            tombstones: bool = False) -> CaptureInfo:
        """Capture ``tables`` (``schema.table`` or ``table``: schema ``public``) into topics
        ``topic_prefix.schema.table`` (created with ``partitions``, default 1). The capture named
        ``topic_prefix`` (default ``"cdc"``) is created (with its publication and slot) unless it exists;
        then the tables are added to it. ``snapshot="initial"``: a new capture first stores every existing
        row (``op: r``), consistently with the changes that follow; tables added to an existing capture get
        an incremental snapshot (:meth:`snapshot`) instead. Default ``"never"``.
        ``tombstones`` (a new capture only; default false): each delete is followed by a tombstone, an event
        of the key with a null value (what compacted topics drop a key for).
        Raises :class:`InvalidArgument`, :class:`ConfigurationError`, :class:`PermissionDenied` naming
        what to change; nothing is changed then."""
        check_topic(topic_prefix)
        check_partitions(partitions)
        if snapshot not in ("initial", "never"):
            raise InvalidArgument(f"snapshot must be 'initial' or 'never', not {snapshot!r}")
        if not isinstance(tombstones, bool):
            raise InvalidArgument(f"tombstones must be True or False, not {tombstones!r}")
        if isinstance(tables, str) or not tables:
            raise InvalidArgument("give one or more tables")
        parsed = list(dict.fromkeys(parse_table(t) for t in tables))
        for s, t in parsed:
            try:
                check_topic(topic_name(topic_prefix, s, t))
            except InvalidName:
                raise InvalidName(f"table {s}.{t} cannot name a topic (topic names use [A-Za-z0-9._-])"
                                  ) from None
        with self.session.connection() as conn:
            self.check_server(conn)
            for s, t in parsed:
                self._check_table(s, t, conn)
            existing = self.store.captures(topic_prefix, conn)
            if existing:
                self._add_tables(conn, existing[0], parsed, snapshot)
            else:
                self._create(conn, topic_prefix, parsed, partitions, snapshot, tombstones)
        return self.describe(topic_prefix)

    def _add_tables(self, conn: psycopg.Connection, record: CaptureRecord, tables: list[tuple[str, str]],
                    snapshot: Snapshot) -> None:
        new = [(s, t) for s, t in tables if f"{s}.{t}" not in record.tables]
        if new and snapshot == "initial":
            self._check_snapshots(conn, new)
        for s, t in new:
            self.client.create_topic(topic_name(record.name, s, t), record.partitions)
        if new:
            with conn.transaction():
                self.store.publication_add(conn, record.publication, new)
                for s, t in new:
                    self.store.insert_table(conn, record.name, s, t, topic_name(record.name, s, t))
                    if snapshot == "initial":
                        request(self.store, conn, self.session.schema, record.name, (s, t),
                                DEFAULT_CHUNK_SIZE)

    def _create(self, conn: psycopg.Connection, prefix: str, tables: list[tuple[str, str]], partitions: int,
                snapshot: Snapshot, tombstones: bool) -> None:
        slot = slot_name(self.store.server_settings(conn).database, self.session.schema, prefix)
        if self.store.slot_exists(conn, slot):  # left by an add that did not finish
            self.store.drop_slot(conn, slot)
        self.store.drop_publication(conn, slot)
        for s, t in tables:
            self.client.create_topic(topic_name(prefix, s, t), partitions)
        self.store.create_publication(conn, slot, tables)
        if snapshot == "never":
            lsn = self.store.create_slot(conn, slot)
            with conn.transaction():
                self._record(conn, prefix, slot, partitions, snapshot, lsn, tables, tombstones)
            return
        exported = self.store.export_slot(slot)
        try:
            self._snapshot(prefix, slot, partitions, tables, exported.lsn, exported.snapshot, tombstones)
        finally:
            exported.close()

    def _record(self, conn: psycopg.Connection, prefix: str, slot: str, partitions: int, snapshot: Snapshot,
                lsn: int, tables: list[tuple[str, str]], tombstones: bool) -> None:
        self.store.insert_capture(conn, prefix, slot, slot, partitions, snapshot, lsn, tombstones)
        for s, t in tables:
            self.store.insert_table(conn, prefix, s, t, topic_name(prefix, s, t))

    def _snapshot(self, prefix: str, slot: str, partitions: int, tables: list[tuple[str, str]], lsn: int,
                  snapshot: str, tombstones: bool) -> None:
        """Store every row of ``tables`` as of the slot's exported ``snapshot`` and the new capture, in one
        transaction: the stream then starts exactly after them."""
        reader = self.session.raw_connection()
        writer = self.session.raw_connection()
        try:
            self.store.prepare_capturer(reader)
            self.store.import_snapshot(reader, snapshot)
            types = TypeMap(lambda oids: self.store.array_elements(reader, oids))
            maker = EventMaker(_now_ms)
            source = Source(lsn, None, _now_ms())
            stored = 0
            with writer.transaction():
                self._record(writer, prefix, slot, partitions, "initial", lsn, tables, tombstones)
                for s, t in tables:
                    shape = table_shape(self.store, reader, prefix, types, s, t)
                    names = [c.name for c in shape.columns]
                    for batch in self.store.snapshot_rows(reader, s, t, names, SNAPSHOT_BATCH):
                        events: list[Message] = [maker.snapshot_row(shape, source, row) for row in batch]
                        stored += self.client.producer.copy_in(writer, shape.topic, events)
                self.store.confirm(writer, prefix, lsn, lsn, 0, stored)
        finally:
            reader.close()
            writer.close()

    def _check_snapshots(self, conn: psycopg.Connection, tables: Sequence[tuple[str, str]]) -> None:
        """Raise unless the server sends logical decoding messages and each table has a key to read its
        chunks by."""
        version = self.store.server_settings(conn).version
        if version < MESSAGES_VERSION:
            raise ConfigurationError(f"incremental snapshots need PostgreSQL 14 or later (its pgoutput sends "
                                     f"the watermarks); the server is {version // 10000}")
        for s, t in tables:
            identity = self.store.table_identity(s, t, conn)
            if identity is None or not chunk_key(identity):
                raise InvalidArgument(f"table {s}.{t} has neither a primary key nor a replica identity "
                                      "index to read it in chunks by: add a primary key for an incremental "
                                      "snapshot")

    def snapshot(self, tables: Sequence[str], *, capture: str = DEFAULT_TOPIC_PREFIX,
                 chunk_size: int = DEFAULT_CHUNK_SIZE) -> builtins.list[SnapshotStatus]:
        """Read ``tables`` (captured by ``capture``, default ``"cdc"``) again while the capture streams: an
        incremental snapshot, ``chunk_size`` rows at a time by key (default :data:`DEFAULT_CHUNK_SIZE`),
        whose rows become events ``op: r`` in the stream, without a change lost or reordered (see
        :mod:`pgstreams.cdc.snapshots`). The capturing process does the work in its rounds; a table
        snapshotted again starts over. Returns the snapshots requested (progress: :meth:`describe`).
        Raises :class:`CaptureNotFound`, :class:`InvalidArgument` (a table that does not exist or that
        the capture does not capture), :class:`ConfigurationError` (before PostgreSQL 14); nothing is
        changed then."""
        check_topic(capture)
        check_chunk_size(chunk_size)
        if isinstance(tables, str) or not tables:
            raise InvalidArgument("give one or more tables")
        parsed = list(dict.fromkeys(parse_table(t) for t in tables))
        with self.session.connection() as conn:
            found = self.store.captures(capture, conn)
            if not found:
                raise CaptureNotFound(f"capture {capture!r} does not exist (see pgstreams cdc list)")
            record = found[0]
            for s, t in parsed:
                if self.store.table_identity(s, t, conn) is None:
                    raise InvalidArgument(f"table {s}.{t} does not exist")
                if f"{s}.{t}" not in record.tables:
                    raise InvalidArgument(f"table {s}.{t} is not captured by capture {capture!r} (it "
                                          f"captures {', '.join(record.tables)}): pgstreams cdc add it first")
            self._check_snapshots(conn, parsed)
            with conn.transaction():
                for job in parsed:
                    request(self.store, conn, self.session.schema, capture, job, chunk_size)
            wanted = {f"{s}.{t}" for s, t in parsed}
            return [_status(r) for r in self.store.snapshots(capture, conn)
                    if f"{r.schema}.{r.table}" in wanted]

    def list(self) -> list[CaptureInfo]:
        """Every capture of the database, by name (slot figures included)."""
        return [self._info(r) for r in self.store.captures()]

    def describe(self, name: str) -> CaptureInfo:
        """Capture ``name`` and its slot's state. Raises :class:`CaptureNotFound`."""
        check_topic(name)
        found = self.store.captures(name)
        if not found:
            raise CaptureNotFound(f"capture {name!r} does not exist (see pgstreams cdc list)")
        return self._info(found[0])

    def _info(self, r: CaptureRecord) -> CaptureInfo:
        slot = self.store.slot_state(r.slot)
        topics = tuple(topic_name(r.name, *t.split(".", 1)) for t in r.tables)
        info = CaptureInfo(r.name, r.slot, r.publication, r.partitions, r.snapshot, r.tables, topics,
                           lsn_text(r.confirmed_lsn), r.transactions, r.changes, r.created_at, r.confirmed_at,
                           r.tombstones, snapshots=tuple(_status(s) for s in self.store.snapshots(r.name)))
        if slot is None:
            return info
        return dataclasses.replace(info, slot_active=slot.active, lag_bytes=slot.lag_bytes,
                                   retained_bytes=slot.retained_bytes, wal_status=slot.wal_status,
                                   safe_wal_size=slot.safe_wal_size)

    def remove(self, name: str) -> CaptureInfo:
        """Stop capturing ``name``: drop its slot and publication and forget it (its topics and events
        stay). Raises :class:`CaptureNotFound`, and :class:`InvalidArgument` while a process captures it
        (stop it first)."""
        info = self.describe(name)
        conn = self.session.raw_connection()
        try:
            if not self.store.try_lock(conn, name):
                raise InvalidArgument(f"capture {name!r} is being captured by another process: stop it first")
            # the slot first: a remove that stops half-way is done again by the next one
            if self.store.slot_exists(conn, info.slot):
                self.store.drop_slot(conn, info.slot)
            self.store.drop_publication(conn, info.publication)
            self.store.delete_capture(conn, name)
        finally:
            conn.close()
        return info

    def guard(self, max_retained: int = DEFAULT_MAX_RETAINED, *, drop: bool = False,
              spare: Iterable[str] = ()) -> builtins.list[SlotAlarm]:
        """The slot guard: every capture whose slot keeps more than ``max_retained`` bytes of WAL (default
        :data:`DEFAULT_MAX_RETAINED`), or lost WAL it needed, is logged as a warning; with ``drop``, such a
        slot that no process reads is dropped rather than let it fill the server's disk (logged at
        CRITICAL level: the capture's changes since its confirmed position are lost, remove it and add it
        again). The slots of the captures named in ``spare`` (those the calling process runs, which read
        them once they hold their lock) are never dropped. Returns the alarms."""
        spared = set(spare)
        if isinstance(max_retained, bool) or not isinstance(max_retained, int) or max_retained < 0:
            raise InvalidArgument(f"max_retained must be a number of bytes >= 0, got {max_retained!r}")
        alarms: builtins.list[SlotAlarm] = []
        for r in self.store.captures():
            slot = self.store.slot_state(r.slot)
            if slot is None or (slot.retained_bytes <= max_retained and slot.wal_status != "lost"):
                continue
            dropped = False
            log.warning("cdc: the slot %s of capture %s keeps %d bytes of WAL (limit %d, wal_status %s): it "
                        "does not advance; is pgstreams cdc run running?", r.slot, r.name,
                        slot.retained_bytes, max_retained, slot.wal_status)
            if drop and not slot.active and r.name not in spared:
                dropped = self._drop_unread(r)
            if dropped:
                log.critical("cdc: DROPPED the slot %s of capture %s to keep the server's disk: its changes "
                             "after %s are lost; pgstreams cdc remove %s, then add it again", r.slot, r.name,
                             lsn_text(r.confirmed_lsn), r.name)
            alarms.append(SlotAlarm(r.name, r.slot, slot.retained_bytes, slot.wal_status, dropped))
        return alarms

    def _drop_unread(self, r: CaptureRecord) -> bool:
        """Drop capture ``r``'s slot unless a process captures it (holds its lock: it reads the slot
        between its rounds too); whether it was dropped."""
        conn = self.session.raw_connection()
        try:
            if not self.store.try_lock(conn, r.name):
                log.warning("cdc: the slot %s of capture %s is not dropped: a process captures it", r.slot,
                            r.name)
                return False
            if not self.store.slot_exists(conn, r.slot):
                return False
            self.store.drop_slot(conn, r.slot)
            return True
        finally:
            conn.close()

    def guard_service(self, max_retained: int = DEFAULT_MAX_RETAINED, *, drop: bool = False,
                      interval: float = DEFAULT_GUARD_INTERVAL, spare: Iterable[str] = ()) -> Service:
        """A service that runs :meth:`guard` every ``interval`` seconds (default
        :data:`DEFAULT_GUARD_INTERVAL`; the first check at its start): run by ``pgstreams cdc run`` and by
        workers that capture, with ``spare`` the captures they run (their slots are never dropped: at the
        start the guard may check before their capture services took their locks). A check that fails
        (the server away) is logged and done again next time."""
        spared = tuple(spare)
        if isinstance(max_retained, bool) or not isinstance(max_retained, int) or max_retained < 0:
            raise InvalidArgument(f"max_retained must be a number of bytes >= 0, got {max_retained!r}")

        def check() -> None:
            try:
                self.guard(max_retained, drop=drop, spare=spared)
            except (psycopg.Error, ConnectionLost) as exc:
                log.warning("cdc: the slot guard failed (checked again in %gs): %s", interval, exc)

        return Service("cdc-slot-guard", check, interval)

    # -- capturing ------------------------------------------------------------------------------------
    def capturer(self, name: str, *, batch: int = DEFAULT_BATCH) -> Capturer:
        """A :class:`Capturer` of capture ``name`` (:meth:`Capturer.acquire` takes it)."""
        check_topic(name)
        return Capturer(self.client, name, batch=batch)

    def service(self, name: str, *, interval: float = DEFAULT_CAPTURE_INTERVAL,
                takeover: float = DEFAULT_TAKEOVER_INTERVAL, batch: int = DEFAULT_BATCH) -> CaptureService:
        """A :class:`CaptureService` of capture ``name`` (not started; options as it takes them)."""
        check_topic(name)
        return CaptureService(self.client, name, interval=interval, takeover=takeover, batch=batch)

    def capture(self, name: str) -> int:
        """Capture ``name`` in this thread until its slot has nothing more; the events stored. Raises
        :class:`InvalidArgument` when another process captures it."""
        capturer = self.capturer(name)
        try:
            if not capturer.acquire():
                raise InvalidArgument(f"capture {name!r} is being captured by another process")
            return capturer.run_until_idle()
        finally:
            capturer.release()


def _status(r: SnapshotRecord) -> SnapshotStatus:
    return SnapshotStatus(r.capture, f"{r.schema}.{r.table}", r.chunk_size, r.rows, r.chunks, r.requested_at,
                          r.finished_at)


def _now_ms() -> int:
    return int(time.time() * 1000)
