"""Batch reads: planning input partitions and reading them as Arrow record batches.

Every Spark input partition reads one topic partition. A topic partition read from the beginning (or
from far back) is split into ranges of heap pages of its segments; each task reads its pages in chunks
with TID range scans, so every page is read once per topic partition and no index is walked. A read of
only the last few events of a partition (fewer than ``ORDERED_CAP``) uses the read-order index instead.
The read fence of every topic partition is taken once when Spark plans the query, and every end cursor is
capped below it, so all tasks see one consistent set of events: in each partition, those below its fence
(every one of them committed, or rolled back, for good by then).
"""

from __future__ import annotations

import logging
import math
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import psycopg
import pyarrow as pa
from psycopg import sql
from pyspark.sql.datasource import DataSourceReader, Filter, InputPartition
from pyspark.sql.pandas.types import to_arrow_schema
from pyspark.sql.types import StructType

from ..errors import DataLoss
from ..storage import TopicRecord, TopicTables
from . import _db
from ._arrow import decode_chunk
from ._filters import Pushed, push
from ._options import (
    ORIGIN,
    AtGroup,
    AtLegacyCursor,
    AtPosition,
    AtTime,
    Cursor,
    Earliest,
    Latest,
    ReadOptions,
    Spec,
)
from ._sql import (
    DELIMITER,
    OPTIONAL_COLUMNS,
    SCAN_LOWER_BOUND,
    Layout,
    chunk_query,
    query,
)

log = logging.getLogger("pgstreams.spark")

#: How often a chunk query that failed while retention removed a segment it read is tried again
#: (``failOnDataLoss=false``; later tries no longer see the segment).
RACE_RETRIES = 3

#: Below this many events a partition range is read through the read-order index.
ORDERED_CAP = 100_000


#: Events aggregated together in a page scan query (one result row per group of about this many events).
GROUP_EVENTS = 2048
#: Bytes (as stored, TOAST included) aggregated together at most, for topics of large events.
GROUP_BYTES = 16 << 20
#: Bytes of events one chunk query aims at (besides ``arrowBatchSize`` events): chunks of large events
#: hold fewer events, so a task's memory stays bounded.
CHUNK_BYTES = 64 << 20
#: Bytes of one Arrow record batch at most (Arrow's binary and string arrays address 2 GiB).
BATCH_BYTES = 256 << 20
#: The first chunk of a page range reads this fraction of the planned pages, the next ones as many as the
#: bytes read so far say fit in CHUNK_BYTES (storage size can understate events' size: compression).
FIRST_CHUNK_SHARE = 16


@dataclass(frozen=True)
class PageRange:
    """Pages ``[first_page, end_page)`` of the segment holding positions ``[lo, hi)``, read
    ``pages_per_chunk`` pages per query, aggregated ``pages_per_group`` pages per result row."""

    lo: int
    hi: int
    first_page: int
    end_page: int
    pages_per_chunk: int
    pages_per_group: int = 1


@dataclass
class Split(InputPartition):
    """One Spark input partition: the events of one topic partition in ``(start, end]``, read in read
    order through the index (``end`` is below the partition's read fence)."""

    topic: str
    topic_id: int
    partition: int
    start: Cursor
    end: Cursor


@dataclass
class ScanSplit(InputPartition):
    """One Spark input partition of a multi-partition page scan: the events found in the page ranges
    ``pages`` that lie, for their topic partition ``p``, in ``(starts[p], ends[p]]`` (indexed by partition
    number; ``ends[p]`` is below the partition's read fence, 0 for partitions not read), read in one pass
    over the pages."""

    topic: str
    topic_id: int
    starts: tuple[Cursor, ...]
    ends: tuple[Cursor, ...]
    pages: tuple[PageRange, ...]


def resolve_cursor(conn: Any, opts: ReadOptions, topic: TopicRecord, fences: dict[int, int],
                   spec_of: dict[int, Spec]) -> dict[int, Cursor]:
    """Turn per-partition specs into cursors, each at most its partition's fence cursor (``fences``: the
    read fence of every partition of ``spec_of``, taken before)."""
    times = {s.at for s in spec_of.values() if isinstance(s, AtTime)}
    at_time: dict[int, Cursor] = {}
    for when in times:
        ps = [p for p, s in spec_of.items() if isinstance(s, AtTime) and s.at == when]
        at_time.update(_db.time_cursors(conn, opts.schema, topic, {p: fences[p] for p in ps}, when))
    legacy = {p: (s.xid, s.position) for p, s in spec_of.items() if isinstance(s, AtLegacyCursor)}
    at_legacy = _db.legacy_cursors(conn, opts.schema, topic, fences, legacy) if legacy else {}
    group = (_db.group_cursors(conn, opts.schema, opts.group, topic)
             if opts.group and any(isinstance(s, AtGroup) for s in spec_of.values()) else {})
    out: dict[int, Cursor] = {}
    for p, spec in spec_of.items():
        if isinstance(spec, Earliest):
            cursor = ORIGIN
        elif isinstance(spec, Latest):
            cursor = fences[p] - 1
        elif isinstance(spec, AtPosition):
            cursor = max(ORIGIN, spec.position - 1)
        elif isinstance(spec, AtLegacyCursor):
            cursor = at_legacy[p]
        elif isinstance(spec, AtGroup):
            cursor = group.get(p, ORIGIN)
        else:
            cursor = at_time[p]
        out[p] = min(cursor, fences[p] - 1)
    return lift_origins(conn, opts, topic.id, out)


def lift_origins(conn: Any, opts: ReadOptions, topic_id: int,
                 cursors: dict[int, Cursor]) -> dict[int, Cursor]:
    """``cursors`` with every cursor at the origin (earliest) moved past the events retention removed
    (the same events are read): later checks for data loss then see only what is removed from then on."""
    if ORIGIN not in cursors.values():
        return cursors
    floors = _db.store(opts.schema).operations.retained_floors(conn, topic_id)
    return {p: (floors.get(p, ORIGIN) if c == ORIGIN else c) for p, c in cursors.items()}


def check_loss(conn: Any, opts: ReadOptions, topic: str, topic_id: int, starts: dict[int, Cursor],
               ends: dict[int, Cursor], *, racing: bool = False) -> bool:
    """Whether retention removed events of ``topic`` in ``(starts[p], ends[p]]`` (a start cursor at the
    origin means earliest: the oldest retained event, no loss). With option ``failOnDataLoss`` (default
    true, as Spark's Kafka source) raise :class:`DataLoss` naming the topic, partitions and removed
    positions; otherwise log a warning (reading goes on from the oldest retained event). ``racing``: the
    check follows a read, so the removal happened while the query read."""
    checked = {p: c for p, c in starts.items() if c != ORIGIN or racing}
    found = _db.removed_between(conn, opts.schema, topic_id, checked, ends)
    if not found:
        return False
    what = "; ".join(f"partition {p}: positions {a} to {b} (about {n} event{'s' if n != 1 else ''})"
                     for p, (a, b, n) in sorted(found.items()))
    if racing:
        msg = (f"topic {topic!r}: retention removed events while this query read them ({what}); some of "
               f"them may be missing from the result")
    else:
        msg = (f"topic {topic!r}: the offsets point at events retention removed before they were read "
               f"({what})")
    if opts.fail_on_data_loss:
        raise DataLoss(f"{msg}. Some data was lost: the events aged out of the topic by its retention "
                       f"settings. If you do not want the query to fail on such cases, set the source option "
                       f"'failOnDataLoss' to 'false' (it then reads on from the oldest retained event).")
    log.warning("%s; reading on from the oldest retained event (failOnDataLoss=false)", msg)
    return True


def specs(opts: ReadOptions, topic: str, partitions: Sequence[int], *, ending: bool) -> dict[int, Spec]:
    """The spec of each partition: the timestamp option wins over the offsets option (as in Kafka)."""
    when = opts.ending_time if ending else opts.starting_time
    option = opts.ending if ending else opts.starting
    out: dict[int, Spec] = {}
    for p in partitions:
        out[p] = AtTime(when) if when is not None else option.spec(topic, p)
    return out


class BatchReader(DataSourceReader):
    """The batch reader of ``spark.read.format("pgstreams")``."""

    def __init__(self, opts: ReadOptions, schema: StructType, min_partitions: int) -> None:
        self.opts = opts
        self.schema = schema
        self.min_partitions = min_partitions
        self.pushed = Pushed()

    def pushFilters(self, filters: list[Filter]) -> list[Filter]:
        """Take over the filters on ``topic``, ``partition``, ``position``, ``created_at``,
        ``event_type`` and ``key`` that PostgreSQL evaluates exactly; return the others."""
        return push(filters, self.pushed)

    def partitions(self) -> list[InputPartition]:
        """Plan the input partitions (at least one per topic partition that has events to read)."""
        opts = self.opts
        with _db.connect(opts.dsn, pooler=opts.pooler) as conn:
            _db.check_server(conn)
            metas = [m for m in _db.topics(conn, opts.schema, opts.topics, "topics")
                     if self.pushed.keeps_topic(m.name)]
            plans: list[tuple[TopicRecord, int, Cursor, Cursor]] = []
            for meta in metas:
                parts = [p for p in range(meta.partitions) if self.pushed.keeps_partition(p)]
                if not parts:
                    continue
                fences = _db.fences(conn, opts.schema, meta, parts)
                starts = resolve_cursor(conn, opts, meta, fences, specs(opts, meta.name, parts, ending=False))
                ends = resolve_cursor(conn, opts, meta, fences, specs(opts, meta.name, parts, ending=True))
                check_loss(conn, opts, meta.name, meta.id, starts, ends)
                plans.extend((meta, p, starts[p], ends[p]) for p in parts if starts[p] < ends[p])
            splits: list[InputPartition] = []
            per_partition = max(1, math.ceil(self.min_partitions / max(1, len(plans))))
            small: dict[tuple[int, int], bool] = {}
            for meta in metas:
                mine = {p: (s, e) for m, p, s, e in plans if m is meta and s != ORIGIN}
                if mine:
                    counts = _db.count_between(conn, opts.schema, meta, {p: v[0] for p, v in mine.items()},
                                               {p: v[1] for p, v in mine.items()}, ORDERED_CAP)
                    small.update({(meta.id, p): n < ORDERED_CAP for p, n in counts.items()})
            scans: dict[int, dict[int, tuple[Cursor, Cursor]]] = {}
            for meta, p, start, end in plans:
                if small.get((meta.id, p)):
                    splits.append(Split(meta.name, meta.id, p, start, end))
                else:
                    scans.setdefault(meta.id, {})[p] = (start, end)
            for meta in metas:
                if meta.id in scans:
                    # the tasks read pages of the segments measured now: compaction leaves them as they are
                    _db.store(opts.schema).compaction.pin(conn, meta.id, None)
                    segments = self._segments(conn, meta)
                    splits.extend(self._scan_splits(meta, scans[meta.id], segments, per_partition))
        return splits

    def _scan_splits(self, meta: TopicRecord, cursors: dict[int, tuple[Cursor, Cursor]],
                     segments: list[tuple[int, int, int, int, int]], per_partition: int) -> list[ScanSplit]:
        """Split the pages of the topic's segments into ranges, each read in one pass for every topic
        partition of ``cursors`` (``(start, end]`` each): at least ``per_partition`` ranges per topic
        partition read."""
        total_pages = sum(s[2] for s in segments)
        if total_pages == 0:
            return []
        share = len(cursors) / meta.partitions
        events = sum(s[3] for s in segments) * share
        k = per_partition * len(cursors)
        if self.opts.max_records_per_partition:
            k = max(k, math.ceil(events / self.opts.max_records_per_partition))
        k = max(1, min(k, total_pages))
        bounds = [round(i * total_pages / k) for i in range(k + 1)]
        starts = tuple(cursors[p][0] if p in cursors else ORIGIN for p in range(meta.partitions))
        ends = tuple(cursors[p][1] if p in cursors else ORIGIN for p in range(meta.partitions))
        out: list[ScanSplit] = []
        for i in range(k):
            want_lo, want_hi = bounds[i], bounds[i + 1]
            ranges: list[PageRange] = []
            base = 0
            for lo, hi, pages, seg_events, stored in segments:
                a, b = max(want_lo, base), min(want_hi, base + pages)
                if a < b:
                    rows_per_page = max(1.0, seg_events * share / pages)
                    event_bytes = max(1.0, stored / max(1, seg_events))
                    chunk_events = min(self.opts.batch_size, CHUNK_BYTES / event_bytes)
                    group_events = min(GROUP_EVENTS, GROUP_BYTES / event_bytes)
                    per_chunk = max(1, math.ceil(chunk_events / rows_per_page))
                    per_group = min(per_chunk, max(1, math.ceil(group_events / rows_per_page)))
                    ranges.append(PageRange(lo, hi, a - base, b - base, per_chunk, per_group))
                base += pages
            if ranges:
                out.append(ScanSplit(meta.name, meta.id, starts, ends, tuple(ranges)))
        return out

    def _segments(self, conn: Any, meta: TopicRecord) -> list[tuple[int, int, int, int, int]]:
        """``(lo, hi, pages, events, stored bytes)`` of the topic's attached segments within the pushed
        position bounds."""
        lo_bound, hi_bound = self.pushed.position_bounds()
        tables = TopicTables(self.opts.schema, meta.id)
        rows = conn.execute(query("attached_segments", self.opts.schema),
                            {"topic_id": meta.id, "parent": tables.table_regclass,
                             "segment_prefix": tables.segment_prefix}).fetchall()
        last_pos = _db.store(self.opts.schema).topics.last_position(meta.id, conn)
        out = []
        for lo, hi, pages, stored in rows:
            lo, hi, pages = int(lo), int(hi), int(pages)
            if pages <= 0 or hi <= lo_bound or lo >= hi_bound:
                continue
            events = max(0, min(hi, last_pos + 1) - lo)
            out.append((lo, hi, pages, events, int(stored)))
        return out

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        """Read one input partition as Arrow record batches (none for the empty partition Spark plans
        when :meth:`partitions` found nothing to read)."""
        if isinstance(partition, ScanSplit):
            return read_scan(self.opts, self.schema, partition, self.pushed)
        if isinstance(partition, Split):
            return read_split(self.opts, self.schema, partition, self.pushed)
        return iter(())


def too_large(exc: psycopg.Error) -> bool:
    """Whether PostgreSQL refused a chunk query for the size of a value it had to build (1 GB at most)."""
    return exc.sqlstate in ("54000", "53200") or "invalid memory alloc request size" in str(exc)


class _Chunks:
    """Runs one chunk query (``chunk_ordered`` or ``scan_pages``) chunk after chunk, first with ``key``
    and ``event_type`` delimited and the other optional columns left out; a chunk that needs a column in
    another form (values in a column left out, ambiguous delimited texts) is queried again with it, and
    the rest of the read keeps that form."""

    def __init__(self, opts: ReadOptions, name: str, topic_id: int, filters: sql.Composable,
                 bounds: sql.Composable | None = None) -> None:
        self._make = lambda layout, per_event: chunk_query(name, opts.schema, topic_id, filters, layout,
                                                           bounds, per_event)
        self._use(Layout())

    def _use(self, layout: Layout) -> None:
        self.layout = layout
        self._stmts: dict[bool, sql.Composed] = {}
        self._delimited = [4 + OPTIONAL_COLUMNS.index(c) for c in layout.delimited]

    def _stmt(self, per_event: bool) -> sql.Composed:
        if per_event not in self._stmts:
            self._stmts[per_event] = self._make(self.layout, per_event)
        return self._stmts[per_event]

    def fetch(self, cur: Any, params: dict[str, Any], topic: str, partition: int | None, schema: pa.Schema,
              per_event: bool = False) -> tuple[list[pa.RecordBatch], Cursor | None, int, int]:
        """The record batches of one chunk (none if it is empty; more than one only past
        ``BATCH_BYTES``), for ordered chunks its last cursor, and its events and bytes.

        Raises :class:`psycopg.Error` (see :func:`too_large`) when a value of the query would pass
        PostgreSQL's size limit: the caller then asks for less at once.
        """
        while True:
            rows = cur.execute(self._stmt(per_event), params).fetchall()
            runs: list[list[Any]] = [[]]
            run_bytes = size = 0
            for row in rows:
                row_bytes = sum(len(v) for v in row if v is not None)
                if runs[-1] and run_bytes + row_bytes > BATCH_BYTES:
                    runs.append([])
                    run_bytes = 0
                runs[-1].append(row)
                run_bytes += row_bytes
                size += row_bytes
            batches: list[pa.RecordBatch] = []
            last: Cursor | None = None
            needs: dict[str, str] = {}
            for run in runs:
                batch, last, needs = decode_chunk(concat_rows(run, self._delimited), topic, partition, schema,
                                                  self.layout)
                if needs:
                    break
                if batch is not None:
                    batches.append(batch)
            if not needs:
                return batches, last, sum(b.num_rows for b in batches), size
            self._use(self.layout.with_needs(needs))


def concat_rows(rows: Sequence[Sequence[Any]], delimited: Sequence[int] = ()) -> Sequence[Any]:
    """The rows of a chunk query (one per page group) as one row: each column's byte strings
    concatenated, the columns numbered in ``delimited`` with a separator byte between rows (their texts
    are separated by it within a row), ``None`` where every row has ``None`` (no rows: all ``None``)."""
    if len(rows) == 1:
        return rows[0]
    if not rows:
        return (None,) * 12
    sep = bytes([DELIMITER])
    return tuple(None if all(v is None for v in column)
                 else (sep if i in delimited else b"").join(v for v in column if v is not None)
                 for i, column in enumerate(zip(*rows, strict=True)))


def read_split(opts: ReadOptions, schema: StructType, split: Split,
               pushed: Pushed | None = None) -> Iterator[pa.RecordBatch]:
    """The events of ``split`` in read order as record batches of at most ``opts.batch_size`` rows.

    Chunks are queried through :class:`_Chunks` (optional columns added once found in use), sized by
    bytes as well as events (see ``CHUNK_BYTES``); a chunk PostgreSQL refuses for size is asked again for
    half the events.
    """
    arrow_schema = to_arrow_schema(schema, timezone="UTC")
    filters, fparams = (pushed or Pushed()).sql()
    base = {"partition": split.partition, "end": split.end, **fparams}
    chunks = _Chunks(opts, "chunk_ordered", split.topic_id, filters)
    limit = max(1, opts.batch_size // FIRST_CHUNK_SHARE)
    # a connection kept by the Python worker: a streaming query reads a few small splits per micro-batch
    with _db.reused(opts.dsn, _db.RUNTIME_CONNECT_WAIT, opts.pooler) as conn:
        cur = conn.cursor(binary=True)
        cursor = split.start
        tries = 0
        while True:
            try:
                batches, last, events, size = chunks.fetch(
                    cur, {**base, "position": cursor, "limit": limit}, split.topic,
                    split.partition, arrow_schema)
            except psycopg.Error as exc:
                if too_large(exc) and limit > 1:
                    limit = max(1, limit // 2)  # events too large for one aggregate: fewer at once
                    continue
                if raced(conn, opts, split.topic, split.topic_id, {split.partition: split.start},
                         {split.partition: split.end}, exc) and tries < RACE_RETRIES:
                    tries += 1
                    continue
                raise
            if last is None:
                break
            yield from batches
            cursor = last
            if events < limit:
                break
            limit = max(1, min(opts.batch_size, int(events * CHUNK_BYTES / max(1, size))))
        if opts.fail_on_data_loss:
            check_loss(conn, opts, split.topic, split.topic_id, {split.partition: split.start},
                       {split.partition: split.end}, racing=True)


def read_scan(opts: ReadOptions, schema: StructType, split: ScanSplit,
              pushed: Pushed | None = None) -> Iterator[pa.RecordBatch]:
    """The events of a multi-partition page scan as record batches, one per chunk of pages (more when a
    chunk passes ``BATCH_BYTES``).

    Each chunk is one ``scan_pages`` query: PostgreSQL aggregates every column of the events of each group
    of pages into one byte string, which :func:`decode_chunk` wraps into Arrow arrays (numpy, no loop over
    rows); optional columns are added through :class:`_Chunks` once found in use. Chunks are sized by
    bytes as well as events (see ``CHUNK_BYTES``); a chunk PostgreSQL refuses for size (see
    :func:`too_large`) is read again in smaller page groups, then one row per event.
    """
    arrow_schema = to_arrow_schema(schema, timezone="UTC")
    filters, fparams = (pushed or Pushed()).sql()
    params: dict[str, Any] = {"ends": list(split.ends), **fparams}
    bounds: sql.Composable | None = None
    if any(split.starts):
        bounds = SCAN_LOWER_BOUND
        params["starts"] = list(split.starts)
    chunks = _Chunks(opts, "scan_pages", split.topic_id, filters, bounds)
    with _db.connect(opts.dsn, _db.RUNTIME_CONNECT_WAIT, opts.pooler) as conn:
        # the planner's pin holds compaction off these segments; renewed for as long as this task may read
        _db.store(opts.schema).compaction.pin(conn, split.topic_id, [r.lo for r in split.pages])
        cur = conn.cursor(binary=True)
        tries = 0
        for r in split.pages:
            group_cap, per_event = r.pages_per_group, False
            chunk = max(1, r.pages_per_chunk // FIRST_CHUNK_SHARE)
            a = r.first_page
            while a < r.end_page:
                b = min(a + chunk, r.end_page)
                page_params = {"lo": r.lo, "hi": r.hi, "first_page": a, "end_page": b,
                               "group": min(group_cap, chunk)}
                try:
                    batches, _, _, size = chunks.fetch(cur, {**params, **page_params}, split.topic, None,
                                                       arrow_schema, per_event)
                except psycopg.Error as exc:
                    if not too_large(exc) or per_event:
                        if raced(conn, opts, split.topic, split.topic_id, *_scan_bounds(split, r), exc) \
                                and tries < RACE_RETRIES:
                            tries += 1
                            continue
                        raise
                    # a page group too large for one aggregate: fewer pages at once, then one row per event
                    if chunk > 1 or group_cap > 1:
                        chunk = group_cap = max(1, min(chunk, group_cap) // 2)
                    else:
                        per_event = True
                    continue
                yield from batches
                chunk = max(1, min(r.pages_per_chunk, int((b - a) * CHUNK_BYTES / max(1, size))))
                a, per_event = b, per_event and size >= BATCH_BYTES  # pages of huge events go on per event
            if opts.fail_on_data_loss:
                check_loss(conn, opts, split.topic, split.topic_id, *_scan_bounds(split, r), racing=True)


def _scan_bounds(split: ScanSplit, r: PageRange) -> tuple[dict[int, Cursor], dict[int, Cursor]]:
    """The start and end cursors of the partitions ``split`` reads, cut to the positions of the segment of
    page range ``r``."""
    parts = [p for p in range(len(split.ends)) if split.ends[p] > split.starts[p]]
    starts = {p: max(split.starts[p], r.lo - 1) for p in parts}
    ends = {p: min(split.ends[p], r.hi - 1) for p in parts}
    return starts, ends


def raced(conn: Any, opts: ReadOptions, topic: str, topic_id: int, starts: dict[int, Cursor],
          ends: dict[int, Cursor], exc: psycopg.Error) -> bool:
    """After a chunk query failed with ``exc``: whether retention removed events it was reading (a segment
    dropped under the query). Raises :class:`DataLoss` saying so with option ``failOnDataLoss`` (default
    true), else logs a warning and returns true: the query is tried again without the segment."""
    if conn.closed or conn.broken:
        return False
    try:
        return check_loss(conn, opts, topic, topic_id, starts, ends, racing=True)
    except DataLoss as loss:
        raise loss from exc
