"""Typed operations reading the database-wide status (topics, partitions, group lag, members) for
metrics exporters and the web console, in O(topics + partitions + groups + members) work."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, ExitStack, contextmanager, nullcontext
from datetime import datetime, timezone
from typing import Any

import psycopg
from psycopg.rows import RowFactory, dict_row, tuple_row

from ..models import (
    GroupLag,
    MemberStatus,
    PartitionStats,
    ShareGroupStatus,
    StatusSnapshot,
    TopicStatus,
)
from .executor import Executor
from .libpq import collect_statements, send_statements, statement, text_params, usable

#: Topics to read again (plus topics whose lag to read again) from which a status read splits its work
#: over two connections.
_SPLIT_FROM = 100

#: How long (seconds) the size of a topic read by a status read serves the next reads while the topic's
#: segments stay the same (no segment created, sealed or removed), default for
#: :attr:`StatusStore.size_max_age`. The other figures of a topic that changed are read again by every
#: status read; its size, which grows by pages, is the costliest of them to look up (every fork of every
#: relation of each segment) and the one scrapes need least often.
SIZE_MAX_AGE = 10.0

#: The server's relative cost of a status read's work, per topic read again: its partitions
#: (``status_partitions()``), its size (``status_sizes()``); and per topic whose lag is read again
#: (``status_checkpoints()``). Measured at 1,000 topics and 100 groups, both connections at work on 2
#: cores: about 150, 60 and 900 us.
_PARTITIONS_COST, _SIZES_COST, _LAG_COST = 150, 60, 900


def _partitions_here(topics: int, sized: int, lagging: int) -> int:
    """Of ``topics`` topics whose partitions a status read splitting its work reads, how many the first
    connection reads: the second one reads the sizes of ``sized`` topics, the lag of ``lagging`` topics
    and the rest, so that both have about as much work."""
    total = topics * _PARTITIONS_COST + sized * _SIZES_COST + lagging * _LAG_COST
    return min(topics, round(total / 2 / _PARTITIONS_COST))


def _segments(key: tuple[Any, ...]) -> tuple[int, int]:
    """Of a topic's key in a snapshot, what its segments are: how many, and where the sealed ones end."""
    return key[3], key[2]


#: The suffix of default dead-letter topics (as :data:`pgstreams.groups.config.DEAD_LETTER_SUFFIX`).
_DLT_SUFFIX = ".dlt"


def _utc(dt: datetime | None) -> datetime | None:
    return None if dt is None else dt.astimezone(timezone.utc)


def _share_status(r: dict[str, Any]) -> ShareGroupStatus:
    """A row of ``status_shares`` as a model (as :meth:`pgstreams.storage.ShareStore.status` maps it)."""
    r["oldest_lock"] = _utc(r["oldest_lock"])
    for k in ("acquired", "available", "waiting", "delivered_too_often", "removed_too_often", "rejected",
              "dead_lettered", "lost_events"):
        r[k] = int(r[k] or 0)
    return ShareGroupStatus(**r)


class StatusStore:
    """The status of one schema."""

    def __init__(self, executor: Executor) -> None:
        self.ex = executor
        #: per topic id, the figures kept from the last snapshot (see :meth:`snapshot`): the topic's key
        #: then (creation, partitions, where sealed segments end, segments, last position), its unsealed
        #: partition rows, its size, and per (group, partition, checkpoint) the first unread event's time,
        #: the unread events of the unsealed segments and of the segment holding the checkpoint
        self._kept: dict[int, tuple[tuple[Any, ...], list[tuple[Any, ...]], int,
                                    dict[tuple[str, int, int], tuple[Any, ...]]]] = {}
        self._lock = threading.Lock()
        #: topics to read again from which a snapshot splits its work over two connections
        self.split_from = _SPLIT_FROM
        #: how long a topic's size read by a snapshot serves the next ones while its segments stay the
        #: same (seconds; 0: every snapshot reads the size of every topic that changed)
        self.size_max_age = SIZE_MAX_AGE
        #: per topic id: when its size was read (monotonic), its segments then (count, where the sealed
        #: ones end) and the size
        self._sized: dict[int, tuple[float, tuple[int, int], int]] = {}
        #: topics whose size served again after they changed (it may be behind until read again)
        self._inexact: set[int] = set()
        #: topics the last snapshot found (from split_from on, a snapshot reads the marks apart)
        self._topics_seen = 0
        self._conns: list[psycopg.Connection] = []
        self._read_lock = threading.Lock()

    @contextmanager
    def _reading(self) -> Iterator[tuple[psycopg.Connection, Callable[[], AbstractContextManager[
            psycopg.Connection]]]]:
        """The connection of a snapshot and a maker of its second one: two connections of the reads' own,
        made at first use and kept (a connection that has read every segment once has their catalog
        entries and files at hand: a read on a new one costs a third more), or pooled ones while another
        thread's read holds those. A read that fails closes them (the next one makes new ones)."""
        if self.ex.pool is None or not self._read_lock.acquire(blocking=False):
            with self.ex.connection() as conn:
                yield conn, self.ex.connection
            return
        try:
            conns = [c for c in self._conns if not c.closed]
            while len(conns) < 2:
                conns.append(self.ex.new_connection())
            self._conns = conns
            try:
                yield conns[0], lambda: nullcontext(conns[1])
            except BaseException:
                self.close()
                raise
        finally:
            self._read_lock.release()

    def close(self) -> None:
        """Close the connections of the reads' own."""
        conns, self._conns = self._conns, []
        for c in conns:
            c.close()

    def browse(self, topic_id: int, partition: int, position: int, limit: int) -> list[tuple[Any, ...]]:
        """Up to ``limit`` committed events of a partition from ``position`` on, as poll rows (see
        ``pgstreams.consumer.reader.ROW_FIELDS``)."""
        return self.ex.all("browse_events", {"partition": partition, "position": position, "limit": limit},
                           topic_id=topic_id)

    def browse_before(self, topic_id: int, partition: int, before: int, limit: int) -> list[tuple[Any, ...]]:
        """Up to ``limit`` committed events of a partition before position ``before``, newest first, as
        poll rows."""
        return self.ex.all("browse_events_before", {"partition": partition, "before": before, "limit": limit},
                           topic_id=topic_id)

    def browse_key(self, topic_id: int, partition: int, key: str, before: int, scan: int, limit: int
                   ) -> tuple[list[tuple[Any, ...]], int | None, int]:
        """The events with ``key`` among at most ``scan`` committed events of a partition before position
        ``before`` (newest first, at most ``limit``), as poll rows; the lowest position walked (``None``:
        no event before ``before``) and how many events the walk went through."""
        args = {"partition": partition, "before": before, "scan": scan, "key": key, "limit": limit}
        rows = self.ex.all("browse_key", args, topic_id=topic_id)
        lowest, walked = rows[0][-2], int(rows[0][-1])
        return [tuple(r[:-2]) for r in rows if r[1] is not None], lowest, walked

    def position_at(self, topic_id: int, partition: int, at: datetime) -> int | None:
        """The first position of a partition holding an event created at or after ``at``."""
        row = self.ex.one("browse_position_at", (partition, at), topic_id=topic_id)
        return None if row is None or row[0] is None else int(row[0])

    def snapshot(self) -> StatusSnapshot:
        """Everything at once, on one connection (see :class:`StatusSnapshot`), in a constant number of
        statements and two round trips whatever the number of topics: the schema-wide reads (share groups
        included) and each
        topic's marks (``status_marks()``, migration 0014), then, for the topics that may have changed
        since the last snapshot, their partitions, sizes and checkpoints' lag (``status_partitions()``,
        ``status_sizes()``, ``status_checkpoints()``; when many topics changed, the sizes and lag on a second
        connection at the same time as the partitions). The figures of a topic whose sequence has not moved
        since a read that found no registered publisher are kept from that read (see the migration)."""
        started = time.perf_counter()
        with self._reading() as (conn, second), ExitStack() as stack:
            other: psycopg.Connection | None = None
            if self._topics_seen >= self.split_from and usable(conn):
                # many topics: their marks on the second connection meanwhile
                other = stack.enter_context(second())
                marks_of = statement("status_marks", self.ex.schema)
                send_statements(other, [(marks_of, [])])
            with conn.pipeline():
                cursors = [self._send(conn, name, row) for name, row in (
                    ("status_now", tuple_row), ("status_dead_letter_topics", tuple_row),
                    ("status_topics", dict_row), ("status_sealed", tuple_row), ("status_leases", dict_row),
                    ("status_members", dict_row), ("status_checkpoint_positions", dict_row),
                    ("status_shares", dict_row))]
                if other is None:
                    mc = self._send(conn, "status_marks", tuple_row)
            now_row, dlt_rows, topic_rows, sealed, lease_rows, member_rows, cp_rows, share_rows = (
                c.fetchall() for c in cursors)
            mark_rows = collect_statements(other)[0] if other is not None else mc.fetchall()
            self._topics_seen = len(topic_rows)
            now = now_row[0][0]
            marks = {int(r[0]): (int(r[1]), bool(r[2])) for r in mark_rows}
            keys = {int(t["topic_id"]): (t["created_at"], int(t["partitions"]), int(t["sealed_end"]),
                                         int(t["segments"] or 0), marks.get(int(t["topic_id"]), (None,))[0])
                    for t in topic_rows}
            with self._lock:
                kept = {tid: (rows, size, figures) for tid, (key, rows, size, figures) in self._kept.items()
                        if keys.get(tid) == key}
            checkpoints: dict[int, list[dict[str, Any]]] = {}
            for r in cp_rows:
                checkpoints.setdefault(int(r["topic_id"]), []).append(r)
            stale = [t for t in topic_rows if int(t["topic_id"]) not in kept]
            lagging = [t for t in topic_rows if self._unknown_lag(checkpoints, kept, int(t["topic_id"]))]
            ids = [int(t["topic_id"]) for t in stale]
            froms = [int(t["sealed_end"]) for t in stale]
            # each topic's last position handed out: the segments after it hold no event yet (0025)
            last = {tid: key[4] or 0 for tid, key in keys.items()}
            lasts = [last[i] for i in ids]
            # sizes read recently enough, of the same segments, serve again (see SIZE_MAX_AGE)
            clock = time.monotonic()
            with self._lock:
                recent = {tid: self._sized[tid][2] for tid in ids if self._fresh_size(tid, keys[tid], clock)}
                # kept topics whose size was served again after their last change, once it is too old
                expired = [tid for tid in kept if tid in self._inexact
                           and not self._fresh_size(tid, keys[tid], clock)]
            size_ids = [i for i in ids if i not in recent] + expired
            sized = {"topic_ids": size_ids, "last": [last[i] for i in size_ids]}
            lag = {"lag_ids": [int(t["topic_id"]) for t in lagging],
                   "from": [int(t["sealed_end"]) for t in lagging],
                   "size": [int(t["segment_size"]) for t in lagging]}
            # many topics to read again: their sizes, lag and some of their partitions on a second
            # connection, sent first, so that the server reads them while it reads the other
            # partitions on this one (two server processes at work, with about as much work each)
            if len(ids) + len(lagging) < self.split_from or not usable(conn):
                other = None  # a connection taken for the marks stays unused
            elif other is None:
                other = stack.enter_context(second())
            here = len(ids)  # the topics whose partitions this connection reads
            if other is not None:
                enc = other.info.encoding
                here = _partitions_here(len(ids), len(size_ids), len(lagging))
                sizes_of, lag_of, parts_of = (statement(q, self.ex.schema) for q in (
                    "status_bytes", "status_checkpoints_of", "status_partitions"))
                rest = {"topic_ids": ids[here:], "from": froms[here:], "last": lasts[here:]}
                send_statements(other, [
                    (sizes_of, text_params(sizes_of, sized, enc)),
                    (lag_of, text_params(lag_of, lag, enc)),
                    (parts_of, text_params(parts_of, rest, enc))])
            with conn.pipeline():
                pc = self._send(conn, "status_partitions", tuple_row,
                                {"topic_ids": ids[:here], "from": froms[:here], "last": lasts[:here]})
                if other is None:
                    bc = self._send(conn, "status_bytes", tuple_row, sized)
                    cc = self._send(conn, "status_checkpoints_of", tuple_row, lag)
            part_rows = pc.fetchall()
            if other is not None:
                byte_rows, cp_lag_rows, rest_rows = collect_statements(other)
                part_rows += rest_rows
            else:
                byte_rows, cp_lag_rows = bc.fetchall(), cc.fetchall()
            unsealed: dict[int, list[tuple[Any, ...]]] = {tid: entry[0] for tid, entry in kept.items()}
            unsealed.update((tid, []) for tid in ids)
            for r in part_rows:
                unsealed[int(r[0])].append(r)
            sizes = {tid: entry[1] for tid, entry in kept.items()}
            sizes.update(recent)
            read_sizes = {int(r[0]): int(r[1] or 0) for r in byte_rows}
            sizes.update(read_sizes)
            lags: dict[int, dict[tuple[str, int, int], tuple[Any, ...]]] = {
                tid: dict(entry[2]) for tid, entry in kept.items()}
            for group, topic_id, partition, checkpoint, first_unread_at, tail, in_segment in cp_lag_rows:
                lags.setdefault(int(topic_id), {})[(group, int(partition), int(checkpoint))] = (
                    first_unread_at, int(tail), int(in_segment))
        with self._lock:
            self._sized = {tid: entry for tid, entry in self._sized.items() if tid in keys}
            self._sized.update((tid, (clock, _segments(keys[tid]), size))
                               for tid, size in read_sizes.items() if tid in keys)
            self._inexact = (self._inexact | set(recent)) - set(read_sizes)
            self._inexact &= set(keys)
            # kept for the next snapshot: topics kept now, and those read now that no publisher held
            self._kept = {tid: (keys[tid], unsealed[tid], sizes.get(tid, 0), lags.get(tid, {}))
                          for tid in keys
                          if tid in unsealed and (tid in kept or not marks.get(tid, (0, True))[1])}
        dlts = {r[0] for r in dlt_rows}
        leases = {(r["group"], int(r["topic_id"]), int(r["partition"])): r for r in lease_rows}
        stats: dict[tuple[int, int], list[tuple[int, int, int, bool, int]]] = {}
        for tid, part, lo, hi, events, removed, last in sealed:
            stats.setdefault((int(tid), int(part)), []).append(
                (int(lo), int(hi), int(events), bool(removed), int(last)))
        topics, parts, groups = [], [], []
        for t in topic_rows:
            tid, name, end = int(t["topic_id"]), t["topic"], int(t["sealed_end"])
            topics.append(TopicStatus(
                name, int(t["partitions"]), sizes.get(tid, 0), int(t["segments"] or 0), t["retention_ms"],
                t["retention_events"], t["retention_bytes"], name.endswith(_DLT_SUFFIX) or name in dlts,
                t["created_at"].astimezone(timezone.utc),
                None if t["dirty_ratio"] is None else float(t["dirty_ratio"]),
                None if t["compacted_at"] is None else t["compacted_at"].astimezone(timezone.utc),
                int(t["events_compacted"]), int(t["bytes_compacted"])))
            tail = {int(r[1]): (int(r[2]), int(r[3])) for r in unsealed.get(tid, [])}
            heads: dict[int, int | None] = {}
            for p in range(int(t["partitions"])):
                segs = [seg for seg in stats.get((tid, p), []) if seg[1] <= end]
                live = [seg for seg in segs if not seg[3]]
                newest, events = tail.get(p, (None, 0))
                if newest is None and live:
                    newest = max(seg[4] for seg in live)
                stored = events + sum(seg[2] for seg in live)
                heads[p] = newest
                removed = sum(seg[2] for seg in segs if seg[3])
                parts.append(PartitionStats(name, p, newest, stored, stored + removed))
            size = int(t["segment_size"])
            for r in checkpoints.get(tid, []):
                p, cp = int(r["partition"]), int(r["checkpoint"])
                figures = lags.get(tid, {}).get((r["group"], p, cp))
                if figures is None:
                    continue  # created after the topic's checkpoints were read: in the next snapshot
                first_unread_at, unsealed_unread, in_segment = figures
                after = (cp // size + 1) * size  # the end of the segment holding the checkpoint
                lag = unsealed_unread + in_segment + sum(
                    n for lo, hi, n, gone, _ in stats.get((tid, p), [])
                    if not gone and lo >= after and hi <= end)
                behind = 0.0
                if lag and first_unread_at is not None:
                    behind = (now - first_unread_at).total_seconds()
                lease = leases.get((r["group"], tid, p), {})
                groups.append(GroupLag(
                    r["group"], name, p, cp or None, heads.get(p), lag, max(0.0, behind),
                    float(r["checkpoint_age"] or 0.0), lease.get("owner"), bool(lease.get("stale")),
                    lease.get("retry_state")))
        groups.sort(key=lambda g: (g.group, g.topic, g.partition))
        members = tuple(MemberStatus(
            r["group"], r["topic"], r["member_id"], r["host"], r["pid"], float(r["heartbeat_age"] or 0.0),
            bool(r["stale"]), int(r["partitions"])) for r in member_rows)
        return StatusSnapshot(now.astimezone(timezone.utc), tuple(topics), tuple(parts),
                              tuple(groups), members, time.perf_counter() - started,
                              tuple(_share_status(r) for r in share_rows))

    def _fresh_size(self, topic_id: int, key: tuple[Any, ...], clock: float) -> bool:
        """Whether the size last read of ``topic_id`` (whose key is ``key``) may serve again at ``clock``:
        younger than :attr:`size_max_age`, read while the topic had the same segments."""
        entry = self._sized.get(topic_id)
        return entry is not None and clock - entry[0] < self.size_max_age and entry[1] == _segments(key)

    @staticmethod
    def _unknown_lag(checkpoints: dict[int, list[dict[str, Any]]],
                     kept: dict[int, tuple[Any, int, dict[tuple[str, int, int], tuple[Any, ...]]]],
                     topic_id: int) -> bool:
        """Whether some checkpoint of ``topic_id`` has no kept lag figures (new, or moved)."""
        known = kept[topic_id][2] if topic_id in kept else {}
        return any((r["group"], int(r["partition"]), int(r["checkpoint"])) not in known
                   for r in checkpoints.get(topic_id, []))

    def _send(self, conn: psycopg.Connection, name: str, row: RowFactory[Any],
              params: dict[str, Any] | None = None) -> psycopg.Cursor[Any]:
        """Send core query ``name`` on ``conn`` (in its pipeline); the caller fetches the rows."""
        cur = conn.cursor(row_factory=row)
        cur.execute(self.ex.query(name), params)
        return cur
