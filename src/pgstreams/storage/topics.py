"""Typed operations on topics and their storage: definitions, segments, statistics, per-partition figures.

The statements the asyncio store (:mod:`pgstreams.storage.asyncstore`) runs too are written here once
(``*_call``, see :mod:`pgstreams.storage.calls`), and so are the decisions of keeping segments ahead
(:class:`Segments`: when to add segments and how far, when a segment's statistics are done).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime, timezone
from typing import Any

import psycopg
from psycopg.rows import dict_row
from psycopg.types.json import Jsonb

from ..models import PartitionInfo, TopicInfo
from .calls import Call, first_int, perform
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


def record_of(row: dict[str, Any]) -> TopicRecord:
    """A topic's row, read as a dict, as a :class:`TopicRecord`."""
    return TopicRecord(int(row["id"]), row["name"], int(row["partitions"]), int(row["segment_size"]),
                       dict(row["config"] or {}), row["created_at"], int(row.get("segments_end") or 0),
                       int(row.get("last_position") or 0))


def _record_or_none(row: dict[str, Any] | None) -> TopicRecord | None:
    return None if row is None else record_of(row)


def topic_call(schema: str, name: str) -> Call[TopicRecord | None]:
    """The topic named ``name`` in ``schema``, ``None`` if there is none."""
    return Call("topic_by_name", {"name": name, "schema": schema}, _record_or_none, row=dict_row)


def last_position_call(topic_id: int) -> Call[int]:
    """The last position the topic's sequence handed out (0 before any)."""
    return Call("sequence_last_value", None, first_int, topic_id)


def ensure_segments_call(topic_id: int, until: int) -> Call[int]:
    """Make segments cover positions up to ``until``; the first position no segment covers after (0:
    unknown)."""
    return Call("ensure_segments", (topic_id, until), first_int, topic_id)


def analyze_segment_call(topic_id: int, position: int) -> Call[bool]:
    """Give the segment holding ``position`` statistics; whether it is done for that segment."""
    return Call("analyze_segment", (topic_id, position), lambda row: row is None or bool(row[0]))


class TopicStore:
    """Topic definitions and storage of one schema."""

    def __init__(self, executor: Executor) -> None:
        self.ex = executor

    def get(self, name: str, conn: psycopg.Connection | None = None) -> TopicRecord | None:
        """The topic named ``name``, ``None`` if there is none."""
        return perform(self.ex, topic_call(self.ex.schema, name), conn)

    def find(self, names: Sequence[str], conn: psycopg.Connection | None = None) -> dict[str, TopicRecord]:
        """The topics among ``names`` that exist, by name (one query)."""
        rows = self.ex.all("topics_by_names", (list(names),), conn=conn, row=dict_row)
        return {r["name"]: record_of(r) for r in rows}

    def all(self, conn: psycopg.Connection | None = None) -> list[TopicRecord]:
        """Every topic, by name."""
        return [record_of(r) for r in self.ex.all("list_topics", conn=conn, row=dict_row)]

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
            self.ex.one("compaction_leftovers", (row[0],), conn=conn)  # an interrupted rewrite's tables
        return True

    def partition_figures(self, topic: TopicRecord) -> list[PartitionInfo]:
        """Per partition: events stored and head (proportional to the topic's size)."""
        rows = self.ex.all("partition_stats", (topic.partitions, topic.id))
        return [PartitionInfo(int(p), int(n), None if h is None else int(h)) for p, n, h in rows]

    def last_position(self, topic_id: int, conn: psycopg.Connection | None = None) -> int:
        """The last position the topic's sequence handed out (0 before any)."""
        return perform(self.ex, last_position_call(topic_id), conn)


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

    def room_until(self, position: int) -> int:
        """The position segments must cover so that an empty segment lies beyond ``position``; 0 when they
        do already (as last seen)."""
        until = position + self.segment_size
        return 0 if until < self.covered else until

    def room_made(self, covered: int) -> None:
        """Take in the first position no segment covers, as adding segments returned it (0: unknown)."""
        if covered:
            self.covered = covered

    def stats_due(self, position: int) -> bool:
        """Whether the segment holding ``position`` may still lack its column statistics."""
        return position >= self.stats_from

    def stats_checked(self, position: int, done: bool) -> None:
        """Take in the check of the statistics of the segment holding ``position``: ``done`` for that
        segment (the next segment is checked from its start), else too few rows yet (checked again some
        positions later)."""
        if done:
            self.stats_from = (position // self.segment_size + 1) * self.segment_size
        else:
            self.stats_from = position + min(1000, self.segment_size // 2)

    def ensure_room(self, ex: Executor, position: int, conn: psycopg.Connection | None = None) -> None:
        """Make sure at least one empty segment lies beyond ``position``. ``conn``: an autocommit connection
        the caller holds (taking a second pooled one while holding one can exhaust the pool)."""
        until = self.room_until(position)
        if until:
            self.room_made(perform(ex, ensure_segments_call(self.topic_id, until), conn))

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
        if not self.stats_due(position):
            return
        try:
            done = perform(ex, analyze_segment_call(self.topic_id, position), conn)
        except psycopg.errors.UndefinedFunction:  # a schema migrated before the function existed
            done = True
        self.stats_checked(position, done)
