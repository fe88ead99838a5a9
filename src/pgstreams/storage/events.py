"""Typed operations on events: inserting one, copying many, polling in read order, start cursors.

An event to store is an :data:`EventRow`: ``(partition, kind, key, payload, headers, event_type,
event_id, correlation_id, causation_id, producer)``, validated and encoded by the producer (``producer``:
the producer tag of a retriable publish, see ``0010_idempotent_producer.sql``, else ``None``). Read
order within a partition is the position; a cursor is the position of the last event read, ``0`` before
every event. Every write first registers its transaction as a publisher of its partitions, and every
read stays below the partitions' read fences (see ``0004_partition_fence.sql``).

The statements the asyncio store (:mod:`pgstreams.storage.asyncstore`) runs too are written here once:
as :class:`~pgstreams.storage.calls.Call` values (``*_call`` functions: a publish with an event id,
the retried publish's look-ups, fences, start cursors, the topic's version) and, for the statements of
the hot paths that go straight through libpq, as the functions that build their inputs and read their
results (:func:`poll_steps`, :func:`split_trailer`, :func:`copy_message`, :func:`insert_params`).
"""

from __future__ import annotations

import functools
import json
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any, Final, NamedTuple, Protocol, cast

import psycopg
from psycopg import pq
from psycopg.types.json import Jsonb
from psycopg.types.string import BytesBinaryDumper

from ..pooler import DEFAULT_POOLER, Pooler, keeps_sessions
from .calls import ALL, RUN, Call, first_bool, first_int, nothing, perform
from .executor import Executor, core_query
from .libpq import Direct, Statement, int_array, statement, usable

#: A cursor in read order: the position of the last event read; 0 is before every event.
Cursor = int


#: An event as stored: a plain tuple (one is built per published event, and a named tuple's constructor
#: costs a tenth of ``publish_many``'s time per event) in the column order of :data:`EVENT_COLUMNS`.
EventRow = tuple[int, str, "str | None", "bytes | None", "Jsonb | None", "str | None", "str | None",
                 "str | None", "str | None", "int | None"]
#: The columns of an :data:`EventRow`, as the insert and COPY statements name them.
EVENT_COLUMNS = ("partition", "kind", "key", "value", "headers", "event_type", "event_id", "correlation_id",
                 "causation_id", "producer")
#: Where an :data:`EventRow` holds the partition and the event id.
PARTITION: Final = 0
EVENT_ID: Final = 6
#: Where an :data:`EventRow` holds its producer tag.
PRODUCER: Final = 9


class Rows(Protocol):
    """Event rows to COPY: a list, or rows made as they are iterated (``pgstreams.producer.Batch``)."""

    def __len__(self) -> int: ...

    def __iter__(self) -> Iterator[EventRow]: ...


class StoredAt(NamedTuple):
    """Where an event was stored; ``duplicate`` when its event id existed (the first copy's place)."""

    partition: int
    position: int
    duplicate: bool = False


#: Binary COPY types per column. kind is a one-byte ASCII "char", whose binary form is that byte: the
#: text dumper writes exactly it.
COPY_TYPES = ("int4", "text", "text", "bytea", "jsonb", "text", "text", "text", "text", "int8")
#: The element types of the arrays of ``insert_many_returning``, in :data:`EVENT_COLUMNS` order.
INSERT_MANY_TYPES = ("int4", '"char"', "text", "bytea", "jsonb", "text", "text", "text", "text", "int8")
# Parameter types and formats of the single-event insert: int4 (the partition, twice), "char", text, bytea
# (binary), jsonb, text x 4, int8 (the producer tag). insert_event_own takes the single key's high bits
# (int8) last instead of the second partition; insert_event_own_lean binds partition, kind, key, value,
# the producer tag and the key's high bits.
_INSERT_OIDS = (23, 23, 18, 25, 17, 3802, 25, 25, 25, 25, 20)
_INSERT_FORMATS = (0, 0, 0, 0, 1, 0, 0, 0, 0, 0, 0)
_OWN_OIDS = (23, 18, 25, 17, 3802, 25, 25, 25, 25, 20, 20)
_OWN_FORMATS = (0, 0, 0, 1, 0, 0, 0, 0, 0, 0, 0)
_LEAN_OIDS = (23, 18, 25, 17, 20, 20)
_LEAN_FORMATS = (0, 0, 0, 1, 0, 0)


@functools.lru_cache(maxsize=1024)

def staging_table(pooler: Pooler) -> str:
    """The query creating the staging table of batches with event ids in mode ``pooler``: a temporary
    table of the session whose rows vanish at commit, or behind a transaction pooler one dropped at commit
    (a table kept would stay with a server session that serves other clients)."""
    return "staging_table" if keeps_sessions(pooler) else "staging_table_dropped"

def _insert_sql(schema: str, topic_id: int) -> bytes:
    """The single-event insert of a topic, rendered once (psycopg re-renders a Composed every time)."""
    return core_query("insert_event", schema, topic_id).as_bytes(None)


#: Topic ids below this register an autocommit single-event publish with one advisory lock (query
#: insert_event_own); larger ones with next_position()'s two.
SINGLE_KEY_TOPICS = 1024


class TopicVersion(NamedTuple):
    """What a publishing client compares with its cached row of a topic: the partition count and
    configuration; and ``waiting``, whether a consumer waits for the topic's events (see
    ``0027_topic_waiters.sql``)."""

    partitions: int
    config: dict[str, Any]
    waiting: bool = True

    @classmethod
    def of(cls, partitions: int | str | bytes, config: str | bytes | None, waiting: object) -> TopicVersion:
        """From the columns of query ``topic_version`` (as Python values, or as text from libpq)."""
        return cls(int(partitions), json.loads(config) if config else {}, waiting in (True, "t", b"t"))


_NOTIFY: Final = b"SELECT pg_notify($1, $2)"


#: The shapes of a single-event insert's parameters (see :func:`insert_params`).
SHARED: Final = 0  # insert_event: the partition twice, then the rest of the row
OWN: Final = 1  # insert_event_own: the row, then the single key's high bits
LEAN: Final = 2  # insert_event_own_lean: partition, kind, key, value, producer tag, the key's high bits


class InsertStatement(NamedTuple):
    """A topic's single-event insert in its own transaction, for libpq: the statement, its parameter
    types and formats, the shape of its parameters (:data:`SHARED`, :data:`OWN` or :data:`LEAN`) and, for
    the single-key shapes, the high bits of the key of the topic's partition 0 (see
    :func:`single_key`)."""

    statement: Statement
    oids: tuple[int, ...]
    formats: tuple[int, ...]
    shape: int
    topic_key: int = 0


def single_key(topic_id: int, partition: int) -> int:
    """The high bits of the single key (``0006_single_key_publish.sql``) with which an autocommit publish
    to ``partition`` of topic ``topic_id`` (both below 1024) registers: ``(7 << 60) | (partition << 50) |
    (topic id << 40)``; the insert adds the topic's last position mod 2^40."""
    return (7 << 60) | (partition << 50) | (topic_id << 40)


@functools.lru_cache(maxsize=1024)
def _insert_statements(schema: str, topic_id: int) -> tuple[InsertStatement, InsertStatement]:
    """A topic's single-event inserts in their own transaction, for libpq: for events with headers, an
    event type, correlation or causation id, and for events without."""
    if topic_id < SINGLE_KEY_TOPICS:
        key = single_key(topic_id, 0)
        return (InsertStatement(statement("insert_event_own", schema, topic_id), _OWN_OIDS, _OWN_FORMATS, OWN,
                                key),
                InsertStatement(statement("insert_event_own_lean", schema, topic_id), _LEAN_OIDS,
                                _LEAN_FORMATS, LEAN, key))
    full = InsertStatement(statement("insert_event", schema, topic_id), _INSERT_OIDS, _INSERT_FORMATS, SHARED)
    return full, full


def insert_statement(schema: str, topic_id: int, row: EventRow) -> InsertStatement:
    """The single-event insert of ``row`` (no event id) in its own transaction, for libpq: the lean one
    when the row has no headers, event type, correlation or causation id."""
    full, lean = _insert_statements(schema, topic_id)
    # headers, event type, correlation and causation id (the event id is None on this path)
    if row[4] is None and row[5] is None and row[7] is None and row[8] is None:
        return lean
    return full


def insert_params(row: EventRow, encoding: str, ins: InsertStatement) -> list[bytes | None]:
    """The text (value: binary) parameters of ``ins``, the single-event insert of ``row`` (see
    :class:`InsertStatement`)."""
    p, kind, key, payload, hdrs, et, _eid, cid, sid, producer = row
    k = None if key is None else key.encode(encoding)
    tag = None if producer is None else b"%d" % producer
    if ins.shape == LEAN:
        return [b"%d" % p, kind.encode(), k, payload, tag, b"%d" % (ins.topic_key | (p << 50))]
    part = b"%d" % p
    rest: list[bytes | None] = [
        kind.encode(), k, payload,
        None if hdrs is None else json.dumps(hdrs.obj).encode(encoding),
        None if et is None else et.encode(encoding), None,
        None if cid is None else cid.encode(encoding), None if sid is None else sid.encode(encoding),
        tag,
    ]
    if ins.shape == OWN:
        return [part, *rest, b"%d" % (ins.topic_key | (p << 50))]
    return [part, part, *rest]


# -- what the sync and the asyncio store share -------------------------------------------------------------
#: Whether statements may go straight through libpq on a connection, sync or async: autocommit and idle (in
#: a caller's transaction a failed statement would abort it, so psycopg's own path runs there). It is
#: :func:`pgstreams.storage.libpq.usable`, which reads only what both kinds of connection have.
idle_autocommit = cast(Callable[[psycopg.Connection[Any] | psycopg.AsyncConnection[Any]], bool], usable)
#: The statements of a checked poll (:meth:`EventStore.poll_checked`): the fences, then the read below them.
POLL_CHECKED = ("load_fences", "poll_checked")
#: :data:`POLL_CHECKED`, then the read fences it read below (one round trip).
POLL_FENCED = (*POLL_CHECKED, "loaded_fences")
#: The queries whose rows come in binary form (event rows).
BINARY_QUERIES = frozenset({"poll", "poll_checked"})
#: A poll's statements for libpq: the statement, its parameters in text form, the result format.
PollSteps = list[tuple[Statement, list[bytes], int]]


def fences_query(pooler: Pooler) -> str:
    """The query that loads a poll's fences for the read sent with it, in mode ``pooler``: ``load_fences``,
    which keeps them (and whether they were clean, for the next poll) in settings of the session, or behind
    a transaction pooler ``load_fences_local``, in settings of the poll's transaction only."""
    return "load_fences" if keeps_sessions(pooler) else "load_fences_local"


def poll_steps(schema: str, topic_id: int, params: Mapping[str, Any], queries: Sequence[str],
               pooler: Pooler = DEFAULT_POOLER) -> PollSteps:
    """The statements of a poll straight through libpq, in one round trip: the generic-plan setting, then
    ``queries`` (:data:`POLL_CHECKED`, ...) with ``params`` (``partitions``, ``positions``: the cursors,
    ``limit`` per partition, ``total``) in text form; event rows come in binary form. ``load_fences`` is
    the query of :func:`fences_query` for ``pooler``."""
    text = {"partitions": int_array(params["partitions"]), "positions": int_array(params["positions"]),
            "limit": b"%d" % params["limit"], "total": b"%d" % params["total"]}
    steps = []
    for q in ("generic_plans", *queries):
        st = statement(fences_query(pooler) if q == "load_fences" else q, schema, topic_id)
        steps.append((st, [text[n] for n in st.params], 1 if q in BINARY_QUERIES else 0))
    return steps


def split_trailer(rows: list[tuple[Any, ...]]) -> tuple[list[tuple[Any, ...]], bool, int]:
    """The rows of query ``poll_checked`` without their trailer row (taken off ``rows`` in place), whether
    a segment retention removed lies after a cursor (then read them with ``removed_after_cursors``, in a
    later statement), and the topic's partition count."""
    trailer = rows.pop()
    return rows, bool(trailer[2]), int(trailer[1] or 0)


def copy_message(schema: str, topic_id: int, partitions: Sequence[int]) -> bytes:
    """``publish_many``'s registration as a publisher of ``partitions`` and its binary COPY of events
    without ids, as one message for libpq (one implicit transaction, one round trip)."""
    fence = statement("join_fence", schema, topic_id).text.replace(b"$1", b"'" + int_array(partitions) + b"'")
    return fence.rstrip().rstrip(b";") + b"; " + statement("copy_events_tagged", schema, topic_id).text


def _stored_at(row: Any) -> StoredAt | None:
    return None if row is None else StoredAt(int(row[0]), int(row[1]))


def _duplicate(row: Any) -> StoredAt:
    if row is None:  # pragma: no cover - the conflicting row vanished (topic recreated)
        raise psycopg.errors.UndefinedTable("the topic changed while publishing")
    return StoredAt(int(row[0]), int(row[1]), duplicate=True)


def _version(row: Any) -> TopicVersion | None:
    return None if row is None else TopicVersion.of(*row)


def insert_with_id_call(topic_id: int, row: EventRow) -> Call[StoredAt | None]:
    """Insert ``row``, an event with an id, unless the topic holds its id: where it was stored, ``None``
    when the id was there (then :func:`existing_event_call`)."""
    params: dict[str, Any] = dict(zip(EVENT_COLUMNS, row, strict=True))
    params["topic_id"] = topic_id
    partition = row[PARTITION]
    return Call("insert_event_idempotent", params,
                lambda got: None if got is None else StoredAt(partition, int(got[0])), topic_id)


def existing_event_call(topic_id: int, row: EventRow) -> Call[StoredAt]:
    """Where the topic holds the event with the id of ``row`` (a duplicate)."""
    return Call("existing_event_id", (topic_id, row[EVENT_ID]), _duplicate)


def topic_version_call(topic_id: int) -> Call[TopicVersion | None]:
    """The partition count and configuration of topic ``topic_id`` now (``None``: no such topic)."""
    return Call("topic_version", (topic_id,), _version)


def session_busy_call(pid: int) -> Call[bool]:
    """Whether the role's session ``pid`` may still be running a statement or transaction."""
    return Call("session_busy", (pid,), first_bool)


def produced_call(topic_id: int, partitions: Sequence[int], floor: int, producer: int
                  ) -> Call[StoredAt | None]:
    """Where an event tagged ``producer`` is stored in ``partitions`` above position ``floor`` (the lowest
    such event when several are), ``None`` if nowhere."""
    return Call("produced", {"partitions": list(partitions), "floor": floor, "producer": producer},
                _stored_at, topic_id)


def count_produced_call(topic_id: int, partitions: Sequence[int], floor: int, producer: int) -> Call[int]:
    """How many events tagged ``producer`` ``partitions`` hold above position ``floor``."""
    return Call("count_produced", {"partitions": list(partitions), "floor": floor, "producer": producer},
                first_int, topic_id)


def notify_call(channel: str, payload: str) -> Call[None]:
    """Send a notification (delivered when its transaction commits)."""
    return Call("notify", (channel, payload), nothing)


def fences_call(topic_id: int, partitions: Sequence[int]) -> Call[dict[int, int]]:
    """The read fence of each partition (see :meth:`EventStore.fences`)."""
    ps = list(partitions)
    return Call("fences", (ps,), lambda row: dict(zip(ps, (int(f) for f in row[0]), strict=True)), topic_id,
                prepare=True)


def time_cursors_call(topic_id: int, fences: Mapping[int, int], at: Any) -> Call[dict[int, Cursor]]:
    """Per partition of ``fences``, the cursor before its first event below its fence created at or after
    ``at`` (the fence's cursor when none is)."""
    ps = sorted(fences)
    return Call("time_cursors", (ps, [fences[p] for p in ps], at),
                lambda rows: {int(p): (fences[p] if pos is None else int(pos)) - 1 for p, pos in rows},
                topic_id, ALL)


def join_fence_call(topic_id: int, partitions: Sequence[int]) -> Call[None]:
    """Register the open transaction as a publisher of ``partitions`` (see :meth:`EventStore.join_fence`)."""
    return Call("join_fence", (list(partitions),), nothing, topic_id, RUN, prepare=True)


class EventStore:
    """Event writes and reads of one schema."""

    def __init__(self, executor: Executor) -> None:
        self.ex = executor
        self._direct = Direct()

    # -- writing ---------------------------------------------------------------------------------------
    def insert(self, conn: psycopg.Connection, topic_id: int, row: EventRow) -> StoredAt:
        """Insert one event on ``conn`` (in the caller's transaction, if one is open)."""
        if row[EVENT_ID] is not None:
            return self._insert_idempotent(conn, topic_id, row)
        got = conn.execute(_insert_sql(self.ex.schema, topic_id), (row[0], *row), prepare=True).fetchone()
        assert got is not None
        return StoredAt(row[PARTITION], int(got[0]))

    def insert_pooled(self, conn: psycopg.Connection, topic_id: int, row: EventRow,
                      notify: tuple[str, str] | None = None,
                      version: Callable[[TopicVersion | None], None] | None = None) -> StoredAt:
        """Insert one event on a pooled autocommit connection (its own transaction). With ``notify``
        (channel, payload), also send that notification once the insert committed, in the same round
        trip (events with an id: in a second one). With ``version``, also read the topic's
        :class:`TopicVersion` in the same round trip (events with an id: in another one) and pass it to
        ``version`` (``None``: the topic is gone)."""
        if row[EVENT_ID] is not None:
            stored = self._insert_idempotent(conn, topic_id, row)
            if notify is not None:
                self.notify(conn, *notify)
            if version is not None:
                version(self.topic_version(conn, topic_id))
            return stored
        return StoredAt(row[PARTITION], self._insert_direct(conn, topic_id, row, notify, version=version))

    def topic_version(self, conn: psycopg.Connection | None, topic_id: int) -> TopicVersion | None:
        """The partition count and configuration of topic ``topic_id`` now (``None``: no such topic)."""
        return perform(self.ex, topic_version_call(topic_id), conn)

    def _insert_idempotent(self, conn: psycopg.Connection, topic_id: int, row: EventRow) -> StoredAt:
        stored = perform(self.ex, insert_with_id_call(topic_id, row), conn)
        return stored if stored is not None else perform(self.ex, existing_event_call(topic_id, row), conn)

    def _insert_direct(self, conn: psycopg.Connection, topic_id: int, row: EventRow,
                       notify: tuple[str, str] | None = None, retry: bool = True,
                       version: Callable[[TopicVersion | None], None] | None = None) -> int:
        """Insert an event without event id; return its position. With ``notify`` and ``version``, see
        :meth:`insert_pooled`.

        Straight through libpq: psycopg's query layer (adaptation, prepared-statement bookkeeping) cost
        twice the client CPU of this whole call. The statement is prepared once per connection.
        """
        ins = insert_statement(self.ex.schema, topic_id, row)
        st = ins.statement
        enc = self._direct.prepare(conn, st, ins.oids)
        params = insert_params(row, enc, ins)
        checked: pq.abc.PGresult | None = None
        if version is not None:
            after: list[tuple[bytes, Sequence[bytes | None]]] = []
            if notify is not None:
                after.append((_NOTIFY, (notify[0].encode(enc), notify[1].encode(enc))))
            after.append((statement("topic_version", self.ex.schema).text, (b"%d" % topic_id,)))
            results = self._direct.exec_then(conn, st, params, ins.formats, after)
            res, checked = results[0], results[-1]
        elif notify is None:
            res = self._direct.exec_prepared(conn, st, params, ins.formats)
        else:
            res = self._direct.exec_then_notify(conn, st, params, ins.formats,
                                                (notify[0].encode(enc), notify[1].encode(enc)))
        if res.status != pq.ExecStatus.TUPLES_OK:
            if retry and res.error_field(pq.DiagnosticField.SQLSTATE) == b"26000":
                self._direct.forget(conn)  # the statement was discarded (DISCARD ALL, DEALLOCATE)
                return self._insert_direct(conn, topic_id, row, notify, retry=False, version=version)
            raise psycopg.errors.error_from_result(res, encoding=enc)
        if version is not None and checked is not None and checked.status == pq.ExecStatus.TUPLES_OK:
            if checked.ntuples == 0:
                version(None)
            else:
                config = checked.get_value(0, 1)
                version(TopicVersion.of(checked.get_value(0, 0) or 0, config and bytes(config).decode(enc),
                                        checked.get_value(0, 2)))
        return int(res.get_value(0, 0))  # type: ignore[arg-type]

    def copy(self, conn: psycopg.Connection, topic_id: int, rows: Rows, has_ids: bool,
             partitions: Sequence[int] | None = None) -> int:
        """Store ``rows`` in one transaction with COPY; return how many were stored (events whose id the
        topic holds already, or that repeat one earlier in ``rows``, are not). ``partitions``: the rows'
        partitions (default: read from the rows), given when the rows are made as the COPY takes them
        (an error raised while iterating them rolls the COPY back and is raised)."""
        if partitions is None:
            partitions = sorted({r[PARTITION] for r in rows})
        if not has_ids and usable(conn):
            # the registration and the COPY in one message: one implicit transaction, one round trip
            self._direct.copy_in(conn, copy_message(self.ex.schema, topic_id, partitions), COPY_TYPES, rows)
            return len(rows)
        with conn.transaction():
            self.join_fence(conn, topic_id, partitions)
            cur = conn.cursor()
            if not has_ids:
                # by oid, bytea would get the (Python) dumper of psycopg.Binary: use the C one for bytes
                cur.adapters.register_dumper(None, BytesBinaryDumper)
                with cur.copy(self.ex.query("copy_events_tagged", topic_id)) as cp:
                    cp.set_types(COPY_TYPES)
                    for r in rows:
                        cp.write_row(r)
                return len(rows)
            cur.execute(self.ex.query(staging_table(self.ex.pooler)))
            with cur.copy(self.ex.query("copy_staging_tagged")) as cp:
                for i, r in enumerate(rows):
                    cp.write_row((i, *r))
            return self.insert_staged(conn, topic_id)

    # -- retried publishes -----------------------------------------------------------------------------
    def new_producer_id(self, conn: psycopg.Connection) -> int:
        """A producer id of the schema's own, for a new client (cycling below 2^31)."""
        row = self.ex.one("new_producer_id", conn=conn)
        assert row is not None
        return int(row[0])

    def session_busy(self, conn: psycopg.Connection, pid: int) -> bool:
        """Whether the role's session ``pid`` may still be running a statement or transaction."""
        return perform(self.ex, session_busy_call(pid), conn)

    def produced(self, conn: psycopg.Connection, topic_id: int, partitions: Sequence[int], floor: int,
                 producer: int) -> StoredAt | None:
        """Where an event tagged ``producer`` is stored in ``partitions`` above position ``floor`` (the
        lowest such event when several are), ``None`` if nowhere."""
        return perform(self.ex, produced_call(topic_id, partitions, floor, producer), conn)

    def count_produced(self, conn: psycopg.Connection, topic_id: int, partitions: Sequence[int], floor: int,
                       producer: int) -> int:
        """How many events tagged ``producer`` ``partitions`` hold above position ``floor``."""
        return perform(self.ex, count_produced_call(topic_id, partitions, floor, producer), conn)

    def join_fence(self, conn: psycopg.Connection, topic_id: int, partitions: Sequence[int]) -> None:
        """Register the transaction open on ``conn`` as a publisher of these partitions (readers hold the
        partitions back until it ends); call it before inserting by COPY."""
        perform(self.ex, join_fence_call(topic_id, partitions), conn)

    def create_staging(self, conn: psycopg.Connection) -> None:
        """Create the session's staging table for batches with event ids (rows vanish at commit; behind a
        transaction pooler the table too)."""
        self.ex.run(staging_table(self.ex.pooler), conn=conn)

    def insert_staged(self, conn: psycopg.Connection, topic_id: int) -> int:
        """Move the staged rows into the topic, dropping known event ids; return how many were stored.
        Registers the transaction as a publisher of the staged rows' partitions first."""
        self.ex.run("join_fence_staged", conn=conn, topic_id=topic_id)
        cur = conn.execute(self.ex.query("insert_staged", topic_id),
                           {"topic_id": topic_id, "seq": self.ex.tables(topic_id).sequence_regclass})
        return cur.rowcount

    def notify(self, conn: psycopg.Connection, channel: str, payload: str) -> None:
        """Send a notification on ``conn`` (delivered when its transaction commits)."""
        perform(self.ex, notify_call(channel, payload), conn)

    # -- reading -----------------------------------------------------------------------------------------
    def fences(self, conn: psycopg.Connection, topic_id: int, partitions: Sequence[int]) -> dict[int, int]:
        """The read fence of each partition: every event below it is committed or rolled back for good,
        so a read in a later statement (or transaction) sees all of them; read only below it."""
        return perform(self.ex, fences_call(topic_id, partitions), conn)

    def time_cursors(self, conn: psycopg.Connection, topic_id: int, fences: Mapping[int, int], at: Any
                     ) -> dict[int, Cursor]:
        """Per partition, the cursor before its first event below its fence created at or after ``at``
        (the fence's cursor when none is): every event from there on is read."""
        return perform(self.ex, time_cursors_call(topic_id, fences, at), conn)

    def poll(self, conn: psycopg.Connection, topic_id: int, params: dict[str, Any]) -> list[tuple[Any, ...]]:
        """The rows of a poll: the partitions' fences, then the events below them, sent together (one
        round trip; the read's snapshot is newer than the fences). ``params``: ``partitions``,
        ``positions`` (the cursors), ``limit`` (per partition), ``total``."""
        return self._poll(conn, topic_id, params, ("load_fences", "poll"))[1]

    def poll_checked(self, conn: psycopg.Connection, topic_id: int, params: dict[str, Any]
                     ) -> tuple[list[tuple[Any, ...]], list[tuple[int, ...]], int]:
        """:meth:`poll`, the segments retention removed that held events after the cursors (``(partition,
        segment, hi, first position, last position, events)`` rows, usually none) and the topic's
        partition count. The read's own snapshot tells whether a removed segment lies after a cursor (its
        last row, see the query ``poll_checked``); only then are the segments read, in a later statement.
        Removed segments are marked before they are detached, so a read that missed one of them always
        learns of it."""
        rows, removed_after, partitions = split_trailer(self._poll(conn, topic_id, params, POLL_CHECKED)[1])
        removed: list[tuple[int, ...]] = []
        if removed_after:
            removed = self._poll(conn, topic_id, params, ("removed_after_cursors",))[0]
        return rows, removed, partitions

    def _poll(self, conn: psycopg.Connection, topic_id: int, params: dict[str, Any], queries: tuple[str, ...]
              ) -> list[list[tuple[Any, ...]]]:
        if not usable(conn):  # in the caller's transaction
            with conn.pipeline():
                curs = []
                for q in queries:
                    cur = conn.cursor(binary=q in BINARY_QUERIES)
                    name = fences_query(self.ex.pooler) if q == "load_fences" else q
                    cur.execute(self.ex.query(name, topic_id), params, prepare=True)
                    curs.append(cur)
            return [cur.fetchall() for cur in curs]
        # straight through libpq (see storage.libpq): psycopg's query layer cost most of the client CPU
        # of a poll that finds a few events
        return self._direct.pipeline(conn, poll_steps(self.ex.schema, topic_id, params, queries,
                                                      self.ex.pooler))[1:]
