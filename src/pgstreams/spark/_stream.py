"""Streaming reads: offsets that respect the gap-free fence, admission control, ``availableNow``.

An offset is, per topic and partition, a read-order cursor ``{"xid": x, "position": p}`` meaning "after
this event"::

    {"clicks": {"0": {"xid": 7412, "position": 1733}, "1": {"xid": 7410, "position": 1730}}}

The end offset of a micro-batch is, per partition, the cursor of an event whose transaction id is below
the read fence (``read_fence()``) at planning time: every transaction of the database below that fence
has ended, so no event can later appear at or before that cursor. A transaction that commits later has a
transaction id at or above the fence, hence a cursor beyond every end offset handed out so far: it is
read by a later micro-batch, never skipped. Replaying a batch from the checkpoint reads the same
``(start, end]`` ranges and so the same events.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

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

from ..storage import TopicRecord
from . import _db
from ._batch import Split, read_split, resolve_cursor, specs
from ._options import ORIGIN, Cursor, ReadOptions

Offsets = dict[str, dict[int, Cursor]]


def to_json(offsets: Offsets) -> dict[str, Any]:
    """The JSON form of offsets (topics in query order, partitions in numeric order)."""
    return {t: {str(p): {"xid": c[0], "position": c[1]} for p, c in sorted(parts.items())}
            for t, parts in offsets.items()}


def from_json(data: dict[str, Any]) -> Offsets:
    """Offsets from their JSON form."""
    return {t: {int(p): (int(c["xid"]), int(c["position"])) for p, c in parts.items()}
            for t, parts in data.items()}


def allocate(limit: int, available: dict[int, int]) -> dict[int, int]:
    """Split ``limit`` events over partitions in proportion to what each has available (as Kafka's
    source does for ``maxOffsetsPerTrigger``); every partition with events gets at least one when the
    limit allows, and no partition gets more than it has."""
    total = sum(available.values())
    if total <= limit:
        return dict(available)
    share = {p: min(n, (n * limit) // total) for p, n in available.items()}
    left = limit - sum(share.values())
    # hand out the remainder one by one, largest remaining backlog first (deterministic order)
    for p in sorted(available, key=lambda q: (-(available[q] - share[q]), q)):
        if left <= 0:
            break
        if share[p] < available[p]:
            share[p] += 1
            left -= 1
    return share


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

    # -- plumbing -------------------------------------------------------------------------------------
    def _connection(self) -> psycopg.Connection:
        if self._conn is None or self._conn.closed or self._conn.broken:
            self._conn = _db.connect(self.opts.dsn)
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

    def _heads(self, conn: psycopg.Connection) -> Offsets:
        fence_xid = _db.fence(conn, self.opts.schema)
        return {m.name: _db.heads(conn, self.opts.schema, m, range(m.partitions), fence_xid)
                for m in self._topics(conn)}

    # -- offsets --------------------------------------------------------------------------------------
    def initialOffset(self) -> dict:
        """Where a new query starts: ``startingTimestamp``, else ``startingOffsets`` (default earliest)."""
        def run(conn: psycopg.Connection) -> Offsets:
            fence_xid = _db.fence(conn, self.opts.schema)
            out: Offsets = {}
            for m in self._topics(conn):
                parts = list(range(m.partitions))
                out[m.name] = resolve_cursor(conn, self.opts, m, parts,
                                             specs(self.opts, m.name, parts, ending=False), fence_xid,
                                             ending=False)
            return out
        return to_json(self._run(run))

    def getDefaultReadLimit(self) -> ReadLimit:
        """``ReadMaxRows(maxEventsPerTrigger)`` when that option is set, else everything available."""
        if self.opts.max_events_per_trigger:
            return ReadMaxRows(self.opts.max_events_per_trigger)
        return ReadAllAvailable()

    def prepareForTriggerAvailableNow(self) -> None:
        """Fix the target of ``trigger(availableNow=True)``: what is visible now."""
        self._target = self._run(self._heads)

    def reportLatestOffset(self) -> dict | None:
        """The latest visible offset (shown in the query progress)."""
        return to_json(self._run(self._heads))

    def latestOffset(self, start: dict, limit: ReadLimit) -> dict:
        """The end offset of the next micro-batch: everything visible (up to the ``availableNow`` target),
        at most ``limit`` events when the limit is ``ReadMaxRows``."""
        begin = from_json(start)
        # Spark asks for the next batch only once the previous one is complete: ``start`` is processed
        self._mirror(begin)

        def run(conn: psycopg.Connection) -> Offsets:
            upper = self._target if self._target is not None else self._heads(conn)
            metas = {m.name: m for m in self._topics(conn)}
            starts: Offsets = {t: {p: begin.get(t, {}).get(p, ORIGIN) for p in range(metas[t].partitions)}
                               for t in metas}
            ends: Offsets = {t: {p: max(starts[t][p], upper.get(t, {}).get(p, ORIGIN)) for p in starts[t]}
                             for t in starts}
            if isinstance(limit, ReadMaxRows):
                ends = self._limit(conn, metas, starts, ends, int(limit.max_rows))
            return ends
        return to_json(self._run(run))

    def _limit(self, conn: psycopg.Connection, metas: dict[str, TopicRecord], starts: Offsets,
               ends: Offsets, max_rows: int) -> Offsets:
        available: dict[tuple[str, int], int] = {}
        for t, meta in metas.items():
            moving = {p: starts[t][p] for p in starts[t] if ends[t][p] > starts[t][p]}
            if moving:
                counts = _db.count_between(conn, self.opts.schema, meta, moving,
                                           {p: ends[t][p] for p in moving}, max_rows + 1)
                available.update({(t, p): n for p, n in counts.items() if n})
        keys = sorted(available)
        index = {k: i for i, k in enumerate(keys)}
        share = allocate(max_rows, {index[k]: available[k] for k in keys})
        out: Offsets = {t: dict(parts) for t, parts in starts.items()}
        for t, meta in metas.items():
            nth = {p: share[index[(t, p)]] for p in starts[t] if (t, p) in index}
            partial = {p: n for p, n in nth.items() if 0 < n < available[(t, p)]}
            for p, n in nth.items():
                if n and n >= available[(t, p)]:
                    out[t][p] = ends[t][p]
            if partial:
                found = _db.nth_cursors(conn, self.opts.schema, meta, starts[t], partial)
                for p, cursor in found.items():
                    out[t][p] = cursor if cursor is not None and cursor <= ends[t][p] else ends[t][p]
        return out

    # -- reading --------------------------------------------------------------------------------------
    def partitions(self, start: dict, end: dict) -> list[InputPartition]:
        """One input partition per topic partition with events in ``(start, end]``."""
        begin, stop = from_json(start), from_json(end)
        ids = {m.name: m.id for m in self._run(self._topics)}
        out: list[InputPartition] = []
        for t, parts in stop.items():
            for p, e in sorted(parts.items()):
                s = begin.get(t, {}).get(p, ORIGIN)
                if e > s:
                    out.append(Split(t, ids[t], p, s, e, e[0] + 1))
        return out

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        """The events of one topic partition in ``(start, end]``, in read order."""
        assert isinstance(partition, Split)
        return read_split(self.opts, self.schema, partition)

    def commit(self, end: dict) -> None:
        """Spark has processed everything up to ``end``: mirror it to option ``group``'s checkpoints."""
        self._mirror(from_json(end))

    def _mirror(self, offsets: Offsets) -> None:
        """Store ``offsets`` as the checkpoints of option ``group`` (when set and changed)."""
        group = self.opts.group
        if group is None or offsets == self._mirrored or not offsets:
            return

        def run(conn: psycopg.Connection) -> None:
            metas = {m.name: m for m in self._topics(conn)}
            checkpoints = _db.store(self.opts.schema).checkpoints
            with conn.transaction():
                for t, parts in offsets.items():
                    checkpoints.mirror(conn, group, metas[t].id, parts)
        self._run(run)
        self._mirrored = offsets

    def stop(self) -> None:
        """Close the connection."""
        if self._conn is not None:
            self._conn.close()
            self._conn = None
