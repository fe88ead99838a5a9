"""Typed operations on topics and their storage: definitions, segments, statistics, per-partition figures."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime, timezone
from typing import Any

import psycopg
from psycopg.rows import dict_row
from psycopg.types.json import Jsonb

from ..models import PartitionInfo, TopicInfo
from .executor import Executor


@dataclass(frozen=True)
class TopicRecord:
    """A topic's row: its id (which names its storage), definition, and ``segments_end``, the first
    position no segment covers yet (0 before any)."""

    id: int
    name: str
    partitions: int
    segment_size: int
    config: dict[str, Any]
    created_at: datetime
    segments_end: int = 0
    #: the last position handed out when the row was read (0 when unknown): a lower bound of later ones
    last_position: int = 0

    def info(self) -> TopicInfo:
        """The public definition (:class:`pgstreams.TopicInfo`), times in UTC."""
        return TopicInfo(self.name, self.partitions, self.created_at.astimezone(timezone.utc),
                         self.segment_size, self.config)


def _record(row: dict[str, Any]) -> TopicRecord:
    return TopicRecord(int(row["id"]), row["name"], int(row["partitions"]), int(row["segment_size"]),
                       dict(row["config"] or {}), row["created_at"], int(row.get("segments_end") or 0),
                       int(row.get("last_position") or 0))


class TopicStore:
    """Topic definitions and storage of one schema."""

    def __init__(self, executor: Executor) -> None:
        self.ex = executor

    def get(self, name: str, conn: psycopg.Connection | None = None) -> TopicRecord | None:
        """The topic named ``name``, ``None`` if there is none."""
        row = self.ex.one("topic_by_name", {"name": name, "schema": self.ex.schema}, conn=conn, row=dict_row)
        return None if row is None else _record(row)

    def find(self, names: Sequence[str], conn: psycopg.Connection | None = None) -> dict[str, TopicRecord]:
        """The topics among ``names`` that exist, by name (one query)."""
        rows = self.ex.all("topics_by_names", (list(names),), conn=conn, row=dict_row)
        return {r["name"]: _record(r) for r in rows}

    def all(self, conn: psycopg.Connection | None = None) -> list[TopicRecord]:
        """Every topic, by name."""
        return [_record(r) for r in self.ex.all("list_topics", conn=conn, row=dict_row)]

    def create(self, name: str, partitions: int, segment_size: int, config: dict[str, Any]) -> bool:
        """Create the topic and its storage in one transaction; False if a topic of that name exists (its
        definition is left as it is)."""
        def create(conn: psycopg.Connection) -> bool:  # run again after a lost connection: idempotent
            with conn.transaction():
                row = self.ex.one("insert_topic", (name, partitions, segment_size, Jsonb(config)), conn=conn)
                if row is None:
                    return False
                self.ex.one("create_topic_storage", (row[0],), conn=conn)
            return True

        return self.ex.pooled(create)

    def delete(self, name: str) -> bool:
        """Delete the topic, its storage and every group state on it in one transaction; False if there is
        no such topic."""
        with self.ex.connection() as conn, conn.transaction():
            row = self.ex.one("delete_topic", (name,), conn=conn)
            if row is None:
                return False
            self.ex.run("drop_topic_storage", conn=conn, topic_id=row[0])
            self.ex.run("drop_topic_sequence", conn=conn, topic_id=row[0])
        return True

    def partition_figures(self, topic: TopicRecord) -> list[PartitionInfo]:
        """Per partition: events stored and head (proportional to the topic's size)."""
        rows = self.ex.all("partition_stats", (topic.partitions, topic.id))
        return [PartitionInfo(int(p), int(n), None if h is None else int(h)) for p, n, h in rows]

    def last_position(self, topic_id: int, conn: psycopg.Connection | None = None) -> int:
        """The last position the topic's sequence handed out (0 before any)."""
        row = self.ex.one("sequence_last_value", conn=conn, topic_id=topic_id)
        return int(row[0]) if row else 0


@dataclass
class Segments:
    """Keeps empty storage segments ahead of the positions a writer uses, and gives each new segment
    column statistics once it holds enough rows. One per topic and writer (a client, a Spark task).

    ``covered`` is the first position no segment covers yet as last seen; ``stats_from`` the position
    from which a segment's statistics are checked again.
    """

    topic_id: int
    segment_size: int
    covered: int = 0
    stats_from: int = 0

    def ensure_room(self, ex: Executor, position: int, conn: psycopg.Connection | None = None) -> None:
        """Make sure at least one empty segment lies beyond ``position``. ``conn``: an autocommit connection
        the caller holds (taking a second pooled one while holding one can exhaust the pool)."""
        if position + self.segment_size < self.covered:
            return
        row = ex.one("ensure_segments", (self.topic_id, position + self.segment_size), conn=conn,
                     topic_id=self.topic_id)
        if row and row[0]:
            self.covered = int(row[0])

    def ensure_room_after(self, ex: Executor, count: int, conn: psycopg.Connection | None = None) -> int:
        """Room for ``count`` more positions after the last one handed out; return that last position."""
        last = TopicStore(ex).last_position(self.topic_id, conn)
        self.ensure_room(ex, last + count, conn)
        return last

    def check_stats_between(self, ex: Executor, first: int, last: int,
                            conn: psycopg.Connection | None = None) -> None:
        """:meth:`check_stats` for each segment holding positions ``[first, last]`` (a writer that stored a
        range in one go, which may span segments), at the last of them in each segment."""
        size = self.segment_size
        for index in range(first // size, last // size + 1):
            self.check_stats(ex, min(last, (index + 1) * size - 1), conn)

    def check_stats(self, ex: Executor, position: int, conn: psycopg.Connection | None = None) -> None:
        """Make sure the segment holding ``position`` has column statistics (a round trip once per segment
        and writer; see ``analyze_segment`` in 0001_initial.sql): without them a poll of a new topic sorts
        whole partitions."""
        if position < self.stats_from:
            return
        try:
            row = ex.one("analyze_segment", (self.topic_id, position), conn=conn)
        except psycopg.errors.UndefinedFunction:  # a schema migrated before the function existed
            row = (True,)
        if row is None or row[0]:  # done for this segment
            self.stats_from = (position // self.segment_size + 1) * self.segment_size
        else:  # too few rows yet
            self.stats_from = position + min(1000, self.segment_size // 2)
