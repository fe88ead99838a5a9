"""Streaming reads: offsets below the partitions' read fences, admission control, ``availableNow``.

An offset is, per topic and partition, a cursor: the position of the last event read ("after this
position"; 0 is before every event), the form of a stream group's checkpoint::

    {"clicks": {"0": 1733, "1": 1730}}

The end offset of a micro-batch is, per partition, at most the cursor before its read fence taken when
the batch is planned (``pgstreams.storage.EventStore.fences``): every event below the fence is committed
or rolled back for good, so no event can later appear at or before that cursor. An event of a transaction
still open then lies at or above the fence, hence beyond every end offset handed out so far: a later
micro-batch reads it, none skips it. A transaction holds back only the partitions it publishes to.
Replaying a batch from Spark's checkpoint reads the same ``(start, end]`` ranges and so the same events.

Offsets of the former form ``{"xid": x, "position": p}`` (read order by transaction, then position), in
the checkpoints of queries started before, are still accepted: they are resolved against the stored events
(:func:`pgstreams.spark._db.legacy_cursors`) so that nothing is skipped, which may read a few events
again. New offsets are always written in the form above.
"""

from __future__ import annotations

import time
from collections.abc import Iterator, Mapping
from typing import Any, Union

import psycopg
import pyarrow as pa
from pyspark.sql.datasource import DataSourceStreamReader, InputPartition
from pyspark.sql.streaming.datasource import (
    ReadAllAvailable,
    ReadLimit,
    ReadMaxRows,
    SupportsTriggerAvailableNow,
)
from pyspark.sql.types import StructType

from ..client import DEFAULT_POLL_INTERVAL
from ..errors import InvalidArgument
from ..pooler import keeps_sessions
from ..producer.state import MARK_WINDOW
from ..storage import TopicRecord
from ..storage.notifications import Listener
from . import _db
from ._batch import Split, check_loss, lift_origins, read_split, resolve_cursor, specs
from ._options import ORIGIN, Cursor, ReadOptions, legacy_cursor

#: Per topic and partition, a cursor.
Offsets = dict[str, dict[int, Cursor]]
#: Offsets as read from JSON: per topic and partition, a cursor or a former ``(xid, position)`` offset.
RawOffsets = dict[str, dict[int, Union[Cursor, tuple[int, int]]]]
#: Per topic and partition, the read fence.
Fences = dict[str, dict[int, int]]


def to_json(offsets: Offsets) -> dict[str, Any]:
    """The JSON form of offsets (topics in query order, partitions in numeric order)."""
    return {t: {str(p): int(c) for p, c in sorted(parts.items())} for t, parts in offsets.items()}


def from_json(data: Mapping[str, Any]) -> RawOffsets:
    """Offsets from their JSON form: per partition a cursor (an integer >= 0) or, from offsets recorded
    in the former form, ``(xid, position)``."""
    out: RawOffsets = {}
    for t, parts in data.items():
        out[t] = {}
        for p, c in parts.items():
            legacy = legacy_cursor(c)
            if legacy is not None:
                out[t][int(p)] = legacy
            elif isinstance(c, int) and not isinstance(c, bool) and c >= 0:
                out[t][int(p)] = c
            else:
                raise InvalidArgument(f"offset of topic {t!r} partition {p}: expected a position >= 0, "
                                      f"got {c!r}")
    return out


class StreamReader(DataSourceStreamReader, SupportsTriggerAvailableNow):
    """The stream reader of ``spark.readStream.format("pgstreams")`` (one instance per query, on the
    driver)."""

    def __init__(self, opts: ReadOptions, schema: StructType) -> None:
        self.opts = opts
        self.schema = schema
        self._conn: psycopg.Connection | None = None
        self._metas: list[TopicRecord] | None = None
        self._target: Offsets | None = None
        self._mirrored: Offsets | None = None
        self._listen: Listener | None = None

    # -- plumbing -------------------------------------------------------------------------------------
    def _connection(self) -> psycopg.Connection:
        if self._conn is None or self._conn.closed or self._conn.broken:
            self._conn = _db.connect(self.opts.dsn, _db.RUNTIME_CONNECT_WAIT, self.opts.pooler)
        return self._conn

    def _run(self, fn: Any) -> Any:
        """Run ``fn(conn)``, reconnecting once if the connection was lost."""
        try:
            return fn(self._connection())
        except psycopg.OperationalError:
            if self._conn is not None:
                self._conn.close()
            self._conn = None
            return fn(self._connection())

    def _topics(self, conn: psycopg.Connection) -> list[TopicRecord]:
        if self._metas is None:
            self._metas = _db.topics(conn, self.opts.schema, self.opts.topics, "topics")
        return self._metas

    def _fences(self, conn: psycopg.Connection) -> Fences:
        """The read fence of every partition of every topic read (each topic in one statement)."""
        return {m.name: _db.fences(conn, self.opts.schema, m) for m in self._topics(conn)}

    def _latest(self, conn: psycopg.Connection) -> Offsets:
        """Per partition, the cursor before its read fence now."""
        return {t: _db.latest(f) for t, f in self._fences(conn).items()}

    def _resolve(self, conn: psycopg.Connection, data: Mapping[str, Any], fences: Fences | None = None
                 ) -> Offsets:
        """Offsets from their JSON form, offsets of the former form resolved to cursors (with ``fences``,
        taken now when not given)."""
        raw = from_json(data)
        out: Offsets = {}
        metas = {m.name: m for m in self._topics(conn)}
        for t, parts in raw.items():
            out[t] = {p: c for p, c in parts.items() if isinstance(c, int)}
            legacy = {p: c for p, c in parts.items() if not isinstance(c, int)}
            if legacy and t in metas:
                if fences is None:
                    fences = self._fences(conn)
                out[t].update(_db.legacy_cursors(conn, self.opts.schema, metas[t], fences[t], legacy))
        return out

    # -- offsets --------------------------------------------------------------------------------------
    def initialOffset(self) -> dict:
        """Where a new query starts: ``startingTimestamp``, else ``startingOffsets`` (default earliest)."""
        def run(conn: psycopg.Connection) -> Offsets:
            out: Offsets = {}
            for m in self._topics(conn):
                fences = _db.fences(conn, self.opts.schema, m)
                out[m.name] = resolve_cursor(conn, self.opts, m, fences,
                                             specs(self.opts, m.name, list(fences), ending=False))
            return out
        return to_json(self._run(run))

    def getDefaultReadLimit(self) -> ReadLimit:
        """``ReadMaxRows(maxEventsPerTrigger)`` when that option is set, else everything available."""
        if self.opts.max_events_per_trigger:
            return ReadMaxRows(self.opts.max_events_per_trigger)
        return ReadAllAvailable()

    def prepareForTriggerAvailableNow(self) -> None:
        """Fix the target of ``trigger(availableNow=True)``: every event below the read fences now."""
        self._target = self._run(self._latest)

    def reportLatestOffset(self) -> dict | None:
        """The offset before the read fences now (shown in the query progress)."""
        return to_json(self._run(self._latest))

    def latestOffset(self, start: dict, limit: ReadLimit) -> dict:
        """The end offset of the next micro-batch: everything below the read fences (up to the
        ``availableNow`` target), at most ``limit`` events when the limit is ``ReadMaxRows``. With no new
        event, it waits up to option ``maxWaitMs`` for one (woken by the publishers' notifications), so
        that an idle query does not ask the database at every trigger."""
        return self.latest_offset(start, limit, self.opts.max_wait_ms / 1000)

    def latest_offset(self, start: dict, limit: ReadLimit, wait: float) -> dict:
        """:meth:`latestOffset`, waiting up to ``wait`` s for new events when there are none."""
        def run(conn: psycopg.Connection) -> tuple[Offsets, bool]:
            upper = self._target
            fences = self._fences(conn) if upper is None or _has_legacy(start) else None
            if upper is None:
                assert fences is not None
                upper = {t: _db.latest(f) for t, f in fences.items()}
            begin = self._resolve(conn, start, fences)
            # Spark asks for the next batch only once the previous one is complete: ``start`` is processed
            self._mirror(conn, begin)
            metas = {m.name: m for m in self._topics(conn)}
            starts: Offsets = {t: {p: begin.get(t, {}).get(p, ORIGIN) for p in range(metas[t].partitions)}
                               for t in metas}
            ends: Offsets = {t: {p: max(starts[t][p], upper.get(t, {}).get(p, ORIGIN)) for p in starts[t]}
                             for t in starts}
            if isinstance(limit, ReadMaxRows):
                ends = self._limit(conn, metas, starts, ends, int(limit.max_rows))
            return ends, ends != starts

        if self._target is not None:
            wait = 0.0  # ``availableNow`` reads up to a fixed target: nothing to wait for
        deadline = time.monotonic() + wait
        recheck = 0.0
        while True:
            # the notifications counted before the read: one that comes after it ends the wait below
            generations = self._listener().generations(self._run(self._topic_ids)) if wait else None
            ends, moving = self._run(run)
            left = deadline - time.monotonic()
            if moving or generations is None or left <= 0:
                return to_json(ends)
            recheck = self._listener().wait_for_events(generations, left, recheck)

    def _topic_ids(self, conn: psycopg.Connection) -> list[int]:
        return [m.id for m in self._topics(conn)]

    def _listener(self) -> Listener:
        """The LISTEN connection (a thread of this process) that wakes :meth:`latestOffset`'s wait."""
        if self._listen is None:
            opts = self.opts
            # behind a transaction pooler a LISTEN would stay with a server session that serves others:
            # no listener then, the wait polls
            connect = (lambda: _db.connect(opts.dsn)) if keeps_sessions(opts.pooler) else None
            self._listen = Listener(connect, opts.schema, self._mark_waiting, fast_window=MARK_WINDOW,
                                    poll_interval=DEFAULT_POLL_INTERVAL)
        return self._listen

    def _mark_waiting(self, topic_id: int, ttl: float) -> None:
        """Mark ``topic_id`` as waited for, so that publishers notify (called by :meth:`Listener.waiting`
        in the thread of :meth:`latestOffset`, on the reader's connection)."""
        _db.store(self.opts.schema).executor.one("topic_waiting", (topic_id, ttl), conn=self._connection())

    def _limit(self, conn: psycopg.Connection, metas: dict[str, TopicRecord], starts: Offsets,
               ends: Offsets, max_rows: int) -> Offsets:
        """The ends of a micro-batch of at most ``max_rows`` events (``maxEventsPerTrigger``): every
        partition with new events gets an equal part of the cap (by one more for the first ones, in topic
        and partition order, when it does not divide); a partition with fewer new events than its part
        is read to its end and leaves the rest to the others, part by part again.

        Each round asks the index for the cursor of each partition's part-th new event (one query per
        topic); only the partitions that have fewer are counted. So planning a batch reads about as many
        index entries as the batch has events, however long the backlog."""
        schema = self.opts.schema
        out: Offsets = {t: dict(parts) for t, parts in starts.items()}
        live = sorted((t, p) for t in metas for p in starts[t] if ends[t][p] > starts[t][p])
        budget = max_rows
        while budget > 0 and live:
            share, rem = divmod(budget, len(live))
            want = {k: share + (1 if i < rem else 0) for i, k in enumerate(live)}
            want = {k: n for k, n in want.items() if n > 0}
            found: dict[tuple[str, int], Cursor | None] = {}
            for t in sorted({k[0] for k in want}):
                nth = {p: n for (tt, p), n in want.items() if tt == t}
                got = _db.nth_cursors(conn, schema, metas[t], {p: starts[t][p] for p in nth},
                                      {p: ends[t][p] for p in nth}, nth)
                found.update({(t, p): c for p, c in got.items()})
            short = [k for k in want if found.get(k) is None]
            if not short:
                for (t, p), cursor in found.items():
                    assert cursor is not None
                    out[t][p] = min(cursor, ends[t][p])
                return out
            # fewer new events than their part: read to the end; what they leave goes to the others
            for t in sorted({k[0] for k in short}):
                mine = {p: starts[t][p] for (tt, p) in short if tt == t}
                counts = _db.count_between(conn, schema, metas[t], mine, {p: ends[t][p] for p in mine},
                                           max_rows + 1)
                for p in mine:
                    budget -= counts.get(p, 0)
                    out[t][p] = ends[t][p]
            live = [k for k in live if k not in short]
        return out

    # -- reading --------------------------------------------------------------------------------------
    def partitions(self, start: dict, end: dict) -> list[InputPartition]:
        """One input partition per topic partition with events in ``(start, end]``."""
        def run(conn: psycopg.Connection) -> tuple[Offsets, Offsets, dict[str, int]]:
            fences = self._fences(conn) if _has_legacy(start) or _has_legacy(end) else None
            ids = {m.name: m.id for m in self._topics(conn)}
            begin, stop = self._resolve(conn, start, fences), self._resolve(conn, end, fences)
            for t, parts in stop.items():
                if t not in ids:
                    continue
                starts = lift_origins(conn, self.opts, ids[t],
                                      {p: begin.get(t, {}).get(p, ORIGIN) for p in parts})
                # offsets that point at events retention removed: fail (failOnDataLoss) or read on
                check_loss(conn, self.opts, t, ids[t], starts, dict(parts))
                begin[t] = starts
            return begin, stop, ids
        begin, stop, ids = self._run(run)
        out: list[InputPartition] = []
        for t, parts in stop.items():
            for p, e in sorted(parts.items()):
                s = begin.get(t, {}).get(p, ORIGIN)
                if e > s:
                    out.append(Split(t, ids[t], p, s, e))
        return out

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        """The events of one topic partition in ``(start, end]``, in read order (none for the empty
        partition Spark plans when :meth:`partitions` found nothing to read)."""
        if isinstance(partition, Split):
            return read_split(self.opts, self.schema, partition)
        return iter(())

    def commit(self, end: dict) -> None:
        """Spark has processed everything up to ``end``: mirror it to option ``group``'s checkpoints."""
        if self.opts.group is not None:
            self._run(lambda conn: self._mirror(conn, self._resolve(conn, end)))

    def _mirror(self, conn: psycopg.Connection, offsets: Offsets) -> None:
        """Store ``offsets`` as the checkpoints of option ``group`` (when set and changed)."""
        group = self.opts.group
        if group is None or offsets == self._mirrored or not offsets:
            return
        metas = {m.name: m for m in self._topics(conn)}
        checkpoints = _db.store(self.opts.schema).checkpoints
        with conn.transaction():
            for t, parts in offsets.items():
                checkpoints.mirror(conn, group, metas[t].id, parts)
        self._mirrored = offsets

    def stop(self) -> None:
        """Close the connections."""
        if self._listen is not None:
            self._listen.stop(5.0)
            self._listen = None
        if self._conn is not None:
            self._conn.close()
            self._conn = None


def _has_legacy(data: Mapping[str, Any]) -> bool:
    """Whether JSON offsets hold an offset of the former ``{"xid": .., "position": ..}`` form."""
    return any(isinstance(c, dict) for parts in data.values() for c in parts.values())
