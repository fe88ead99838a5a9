"""Typed operations of compaction (compacted topics, ``0033_compaction.sql``): the key map, the plan of a
pass, the rewrite of a segment (a copy of its survivors built without locking the topic, then swapped in
by a short transaction), leftovers of an interrupted rewrite, pins of segments read by page, and the
figures per topic. The SQL is in
``sql/queries/compaction.sql`` and the migration."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timezone

import psycopg

from ..models import CompactionStatus
from .executor import Executor

#: Seconds a reader's pin keeps compaction off the segments it reads by page (renewed by each task).
PIN_SECONDS = 3600.0


@dataclass(frozen=True)
class Rewrite:
    """What the copy of a segment's survivors holds: the events ``kept``, those ``removed`` (0: nothing to
    remove, no copy was made) and the ``tombstones`` among them."""

    kept: int
    removed: int
    tombstones: int


def _utc(dt: datetime | None) -> datetime | None:
    return None if dt is None else dt.astimezone(timezone.utc)


class CompactionStore:
    """Compaction's operations on one schema (see the module docstring). The steps run on a connection of
    the maintenance pass, in autocommit mode: each is its own transaction."""

    def __init__(self, executor: Executor) -> None:
        self.ex = executor

    def leftovers(self, conn: psycopg.Connection, topic_id: int) -> int:
        """Drop the tables an interrupted rewrite of the topic left (copies never swapped in, replaced
        segments not dropped); return how many."""
        row = self.ex.one("compaction_leftovers", (topic_id,), conn=conn)
        return int(row[0]) if row else 0

    def map_segments(self, conn: psycopg.Connection, topic_id: int, limit: int | None = None) -> int:
        """Map the topic's sealed segments not mapped yet into its key map, the oldest ``limit`` of them
        (default all) in one read; return how many."""
        with conn.transaction():
            row = self.ex.one("compaction_map", (topic_id, limit), conn=conn)
        return int(row[0]) if row else 0

    def plan(self, conn: psycopg.Connection, topic_id: int, now: datetime | None) -> list[tuple[int, str]]:
        """The segments to rewrite as of ``now`` (``None``: the server's time), oldest first, with the
        reason of each (``dirty``, ``lag``, ``tombstones``, ``older``)."""
        return [(int(s), str(r)) for s, r in self.ex.all("compaction_plan", (topic_id, now), conn=conn)]

    def build(self, conn: psycopg.Connection, topic_id: int, segment: int, now: datetime | None) -> Rewrite:
        """Copy the survivors of ``segment`` as of ``now`` (``None``: the server's time) into a table of
        their own (no copy when nothing would be removed)."""
        with conn.transaction():
            self.ex.one("compaction_settings", conn=conn)
            row = self.ex.one("compact_build", (topic_id, segment, now), conn=conn)
        assert row is not None
        return Rewrite(int(row[0]), int(row[1]), int(row[2]))

    def swap(self, conn: psycopg.Connection, topic_id: int, segment: int, rewrite: Rewrite,
             lock_timeout_ms: int) -> bool:
        """Replace ``segment`` by its copy in one transaction, waiting at most ``lock_timeout_ms`` for the
        topic table's lock (false: not replaced, the copy waits for a later pass), then drop the replaced
        table."""
        with conn.transaction():
            row = self.ex.one("compact_swap", (topic_id, segment, rewrite.removed, rewrite.tombstones,
                                               lock_timeout_ms), conn=conn)
        done = bool(row and row[0])
        if done:
            self.leftovers(conn, topic_id)
        return done

    def ran(self, conn: psycopg.Connection, topic_id: int) -> None:
        """Record that compaction looked at the topic."""
        self.ex.one("compaction_ran", (topic_id,), conn=conn)

    def pin(self, conn: psycopg.Connection, topic_id: int, los: list[int] | None,
            seconds: float = PIN_SECONDS) -> None:
        """Pin segments of the topic (by first position; ``None``: all of them) for ``seconds`` (default
        :data:`PIN_SECONDS`): compaction does not rewrite them meanwhile. Then waits for a rewrite being
        swapped in now, so that the segments read afterwards stay as they are while pinned."""
        self.ex.one("pin_segments", (topic_id, los, seconds), conn=conn)
        self.ex.all("pinned_barrier", topic_id=topic_id, conn=conn)

    def status(self, topic: str | None = None) -> list[CompactionStatus]:
        """Compaction's figures of every topic (or of ``topic``), by name."""
        return [
            CompactionStatus(str(n), None if r is None else float(r), _utc(ran), _utc(at), int(s), int(e),
                             int(t), int(b))
            for n, r, ran, at, s, e, t, b in self.ex.all("compaction_status", (topic, topic))
        ]
