"""Capturing: reading a capture's slot and storing its changes as events, exactly once.

A :class:`Capturer` holds the capture's lock (a session advisory lock on a connection of its own: one
process captures a slot at a time; when it dies its connection ends and another takes over) and runs
rounds. A round:

1. peeks at the slot (``pg_logical_slot_peek_binary_changes``: whole source transactions committed before
   the server's flushed WAL position, about ``batch`` messages at most; the slot does not move);
2. decodes them (:mod:`.pgoutput`) and makes the events of every transaction past the capture's confirmed
   position (:mod:`.events`);
3. stores those events (one COPY per topic) and the capture's new position (the end of the last
   transaction) in **one** transaction, the position only if it still is the one read at the start
   (compare and set): the events of a source transaction become visible together, and are stored once;
4. advances the slot (``pg_replication_slot_advance``) to that position, or, when the slot had nothing
   more, to the WAL position it was read up to (the server keeps no WAL for the slot before it: an idle
   capture does not pin WAL).

With an incremental snapshot waiting (:mod:`.snapshots`), a round first reads the next chunk of its table
between two watermarks; the chunk's rows become events when the round meets the high watermark in the
stream, stored with the snapshot's cursor in the transaction of step 3.

A crash before step 3 commits leaves everything as it was: the next round reads the same transactions
again. A crash between 3 and 4 leaves the slot behind the stored position: the next round skips every
transaction at or below it. :class:`CaptureService` runs a capturer as a :class:`pgstreams.Service`.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol

import psycopg

from ..errors import ConnectionLost, PgStreamsError
from ..models import Message
from ..services import Service
from ..storage.cdc import CaptureRecord
from .events import EventMaker, Shape, Source
from .pgoutput import Begin, Commit, Delete, Insert, LogicalMessage, Relation, Truncate, Update, decode
from .snapshots import MESSAGES_VERSION, Chunk, Snapshotter
from .values import TypeMap

if TYPE_CHECKING:
    from ..ports import HasSession, Publisher
    from ..producer import Producer

    class CaptureClient(HasSession, Publisher, Protocol):
        """What capturing needs of a client: its session, creating topics, and its producer."""

        @property
        def producer(self) -> Producer: ...

log = logging.getLogger("pgstreams.cdc")

#: Messages a round peeks at most (it stops after the transaction that reaches it).
DEFAULT_BATCH = 20_000
#: Seconds between two rounds of a capture service when the slot had nothing more.
DEFAULT_CAPTURE_INTERVAL = 0.1
#: Seconds between two tries of a capture service to take a capture another process holds.
DEFAULT_TAKEOVER_INTERVAL = 1.0


class CaptureNotFound(PgStreamsError, LookupError):
    """No capture of that name."""


class CaptureLost(PgStreamsError):
    """The capture's stored position moved under this capturer (another one stored): it stops."""


@dataclass(frozen=True)
class Round:
    """What a round did: source ``transactions`` and ``changes`` (events) stored, the capture's
    ``confirmed`` position after it, and whether the slot may hold ``more`` right away."""

    transactions: int
    changes: int
    confirmed: int
    more: bool


class Capturer:
    """Captures capture ``name`` (see the module's docstring). ``batch``: messages a round peeks at most
    (default :data:`DEFAULT_BATCH`). ``on_step``, called with ``"peeked"``, ``"stored"`` and
    ``"advanced"`` as a round passes each point, and ``"chunk"`` after it read a chunk of an incremental
    snapshot (tracing and fault tests). Not thread-safe."""

    def __init__(self, client: CaptureClient, name: str, *, batch: int = DEFAULT_BATCH,
                 clock: Callable[[], float] = time.time, on_step: Callable[[str], None] | None = None
                 ) -> None:
        self.client = client
        self.session = client.session
        self.store = self.session.store.cdc
        self.name = name
        self.batch = batch
        self._now_ms = lambda: int(clock() * 1000)
        self.maker = EventMaker(self._now_ms)
        self.on_step = on_step
        self.record: CaptureRecord | None = None
        self.confirmed = 0
        self._slot_lsn = 0
        self._conn: psycopg.Connection | None = None
        self._shapes: dict[int, Shape] = {}
        self._keys: dict[tuple[str, str], tuple[str, ...]] = {}
        self._topics: set[str] = set()
        self._types: TypeMap | None = None
        self._log_snapshots = True
        self.snapshots: Snapshotter | None = None

    @property
    def holds(self) -> bool:
        """Whether this capturer holds the capture (its lock, on a live connection)."""
        return self._conn is not None and not self._conn.closed

    def acquire(self) -> bool:
        """Take the capture's lock if it is free; false when another process captures it. Raises
        :class:`CaptureNotFound`."""
        if self.holds:
            return True
        conn = self.session.raw_connection()
        try:
            self.store.prepare_capturer(conn)
            if not self.store.try_lock(conn, self.name):
                conn.close()
                return False
            found = self.store.captures(self.name, conn)
            if not found:
                raise CaptureNotFound(f"capture {self.name!r} does not exist (see pgstreams cdc list)")
            self.record = found[0]
            slot = self.store.slot_state(self.record.slot, conn)
            if slot is None:
                raise CaptureNotFound(f"the replication slot {self.record.slot!r} of capture {self.name!r} "
                                      "is gone (dropped by hand, or by the slot guard): remove the capture "
                                      "and add it again")
        except BaseException:
            conn.close()
            raise
        self._conn = conn
        self.maker = EventMaker(self._now_ms, self.record.tombstones)
        self.confirmed = self.record.confirmed_lsn
        self._slot_lsn = slot.confirmed_lsn
        self._shapes.clear()
        self._types = TypeMap(lambda oids: self.store.array_elements(conn, oids))
        supported = self.store.server_settings(conn).version >= MESSAGES_VERSION
        self.snapshots = Snapshotter(self.store, self.session.schema, self.name, self._types, supported)
        log.info("cdc: this process captures %s (slot %s) from %X/%X", self.name, self.record.slot,
                 self.confirmed >> 32, self.confirmed & 0xFFFFFFFF)
        return True

    def release(self) -> None:
        """Give the capture up (closing the connection releases its lock)."""
        conn, self._conn = self._conn, None
        if conn is not None and not conn.closed:
            try:
                conn.close()
            except psycopg.Error:  # pragma: no cover - already broken
                pass

    def _step(self, point: str) -> None:
        if self.on_step is not None:
            self.on_step(point)

    def _shape(self, conn: psycopg.Connection, relation: Relation) -> Shape:
        table = (relation.schema, relation.name)
        key = self._keys.get(table)
        if key is None:
            identity = self.store.table_identity(relation.schema, relation.name, conn)
            key = self._keys[table] = identity.primary_key if identity is not None else ()
        assert self.record is not None and self._types is not None
        return Shape.of(relation, self.record.name, self._types, key)

    def round(self) -> Round:
        """One round (see the module's docstring). Raises :class:`CaptureLost` when another capturer
        stored meanwhile, psycopg's errors when the connection breaks (then :meth:`release`)."""
        conn, record, snapshots = self._conn, self.record, self.snapshots
        if conn is None or record is None or snapshots is None:
            raise CaptureLost(f"this process does not hold capture {self.name!r} (acquire it first)")
        if snapshots.open(conn) is not None:
            self._step("chunk")
        upto = self.store.flush_lsn(conn)
        messages = self.store.peek(conn, record.slot, record.publication, upto, self.batch,
                                   snapshots.supported)
        self._step("peeked")
        more = len(messages) >= self.batch
        by_topic: dict[str, list[Message]] = {}
        transactions = changes = 0
        last = self.confirmed
        source: Source | None = None
        closed: list[Chunk] = []
        before = 0
        for data in messages:
            msg = decode(data)
            chunk = snapshots.chunk
            if isinstance(msg, Begin):
                source = Source.of(msg) if msg.final_lsn >= self.confirmed else None
                before = changes
            elif isinstance(msg, Relation):
                self._shapes[msg.oid] = shape = self._shape(conn, msg)
                if shape.topic not in self._topics:
                    self.client.create_topic(shape.topic, record.partitions)
                    self._topics.add(shape.topic)
            elif source is None:
                continue  # a transaction stored before
            elif isinstance(msg, Commit):
                if changes > before:  # not a transaction of watermarks only
                    transactions += 1
                last = msg.end_lsn
                source = None
            elif isinstance(msg, (Insert, Update, Delete)):
                shape = self._shapes[msg.relation]
                events = by_topic.setdefault(shape.topic, [])
                made = list(self.maker.change(shape, source, msg))
                events += made
                changes += len(made)
                if chunk is not None and chunk.of(shape.relation.schema, shape.relation.name):
                    assert source.txid is not None
                    chunk.changed(source.txid, (ev.key for ev in made))
            elif isinstance(msg, LogicalMessage):
                done = snapshots.watermark(msg)
                if done is not None:  # its high watermark: the rows left, here in the stream
                    made = done.events(self.maker, Source(source.lsn, None, source.ts_ms))
                    by_topic.setdefault(done.shape.topic, []).extend(made)
                    changes += len(made)
                    closed.append(done)
            elif isinstance(msg, Truncate):
                for oid in msg.relations:
                    shape = self._shapes[oid]
                    if chunk is not None and chunk.of(shape.relation.schema, shape.relation.name):
                        assert source.txid is not None
                        chunk.truncated(source.txid)
                    parts = self.session.topic_state(shape.topic, conn=conn).partitions
                    events = by_topic.setdefault(shape.topic, [])
                    for ev in self.maker.truncate(shape, source, parts):
                        events.append(ev)
                        changes += 1
        if last > self.confirmed:
            producer = self.client.producer
            with conn.transaction():
                for topic, events in by_topic.items():
                    producer.copy_in(conn, topic, events)
                for done in closed:
                    snapshots.stored(conn, done)
                if not self.store.confirm(conn, self.name, self.confirmed, last, transactions, changes):
                    raise CaptureLost(f"capture {self.name!r} moved past {self.confirmed:X} under this "
                                      "process (another one captures it)")
            self.confirmed = last
            self._step("stored")
        target = self.confirmed if more else max(self.confirmed, upto)
        if target > self._slot_lsn:
            self.store.advance(conn, record.slot, target)
            self._slot_lsn = target
            self._step("advanced")
            if changes and self._log_snapshots:
                # else the slot's restart position moves only when the server logs its running
                # transactions (every 15 s at most), and every peek decodes the WAL again from there
                self._log_snapshots = self.store.log_snapshot(conn)
        return Round(transactions, changes, self.confirmed, more or snapshots.busy)

    def run_until_idle(self, stop: Callable[[], bool] = lambda: False) -> int:
        """Rounds until the slot has nothing more (or ``stop()``); the events stored."""
        total = 0
        while True:
            done = self.round()
            total += done.changes
            if not done.more or stop():
                return total


class CaptureService(Service):
    """Captures capture ``name`` while this process holds it (:class:`Capturer`): a round every
    ``interval`` seconds (default :data:`DEFAULT_CAPTURE_INTERVAL`; back to back while the slot has
    more), and, while another process holds it, a try to take it over every ``takeover`` seconds (default
    :data:`DEFAULT_TAKEOVER_INTERVAL`). A lost connection is logged and the capture taken again at the
    next tick; a missing capture or a :class:`CaptureLost` kills the service (loudly: see
    :class:`pgstreams.services.Supervisor`)."""

    def __init__(self, client: CaptureClient, name: str, *, interval: float = DEFAULT_CAPTURE_INTERVAL,
                 takeover: float = DEFAULT_TAKEOVER_INTERVAL, batch: int = DEFAULT_BATCH) -> None:
        super().__init__(f"cdc-{name}", interval=self._wait)
        self.capturer = Capturer(client, name, batch=batch)
        self._every = interval
        self._takeover = takeover
        #: events this service stored
        self.changes = 0

    def _wait(self) -> float:
        return self._every if self.capturer.holds else self._takeover

    def step(self) -> None:
        """Take the capture if free, then capture until the slot has nothing more."""
        capturer = self.capturer
        try:
            if not capturer.acquire():
                return
            self.changes += capturer.run_until_idle(self.stopping.is_set)
        except (psycopg.OperationalError, ConnectionLost) as exc:
            log.warning("cdc: capture %s failed (taken again at the next tick): %s", capturer.name,
                        str(exc).strip())
            capturer.release()

    def finish(self) -> None:
        """Give the capture up, so that another process takes it over."""
        self.capturer.release()
