"""Typed operations reading the database-wide status (topics, partitions, group lag, members) for
metrics exporters and the web console, in O(topics + partitions + groups + members) work."""

from __future__ import annotations

import time
from collections.abc import Iterable
from datetime import datetime, timezone
from typing import Any

import psycopg
from psycopg.rows import dict_row

from ..models import GroupLag, MemberStatus, PartitionStats, StatusSnapshot, TopicStatus
from .executor import Executor

#: The suffix of default dead-letter topics (as :data:`pgstreams.groups.config.DEAD_LETTER_SUFFIX`).
_DLT_SUFFIX = ".dlt"


def _utc(dt: datetime | None) -> datetime | None:
    return None if dt is None else dt.astimezone(timezone.utc)


class StatusStore:
    """The status of one schema."""

    def __init__(self, executor: Executor) -> None:
        self.ex = executor

    def partitions(self, topic: str | None = None, *, conn: psycopg.Connection | None = None
                   ) -> list[PartitionStats]:
        """Head, events stored and events published of every partition (of ``topic`` if given)."""
        rows = self.ex.all("status_partitions", (topic, topic), conn=conn, row=dict_row)
        return [PartitionStats(r["topic"], int(r["partition"]), None if r["head"] is None else int(r["head"]),
                                int(r["events"] or 0), int(r["events"] or 0) + int(r["removed_events"] or 0))
                for r in rows]

    def browse(self, topic_id: int, partition: int, position: int, limit: int) -> list[tuple[Any, ...]]:
        """Up to ``limit`` committed events of a partition from ``position`` on, as poll rows (see
        ``pgstreams.consumer.reader.ROW_FIELDS``)."""
        return self.ex.all("browse_events", {"partition": partition, "position": position, "limit": limit},
                           topic_id=topic_id)

    def position_at(self, topic_id: int, partition: int, at: datetime) -> int | None:
        """The first position of a partition holding an event created at or after ``at``."""
        row = self.ex.one("browse_position_at", (partition, at), topic_id=topic_id)
        return None if row is None or row[0] is None else int(row[0])

    def snapshot(self) -> StatusSnapshot:
        """Everything at once, on one connection (see :class:`StatusSnapshot`)."""
        started = time.perf_counter()
        with self.ex.connection() as conn:
            now_row = self.ex.one("status_now", conn=conn)
            dlts = {r[0] for r in self.ex.all("status_dead_letter_topics", conn=conn)}
            topic_rows = self.ex.all("status_topics", conn=conn, row=dict_row)
            parts = self.partitions(conn=conn)
            group_rows = self.ex.all("status_groups", conn=conn, row=dict_row)
            behind = self._lag_seconds(conn, {int(r["topic_id"]) for r in group_rows if r["lag"]})
            member_rows = self.ex.all("status_members", conn=conn, row=dict_row)
        topics = tuple(TopicStatus(
            r["topic"], int(r["partitions"]), int(r["bytes"] or 0), int(r["segments"] or 0),
            r["retention_ms"], r["retention_events"], r["retention_bytes"], _utc(r["oldest_at"]),
            r["topic"].endswith(_DLT_SUFFIX) or r["topic"] in dlts, r["created_at"].astimezone(timezone.utc))
            for r in topic_rows)
        groups = tuple(GroupLag(
            r["group"], r["topic"], int(r["partition"]), r["checkpoint"], r["head"], int(r["lag"] or 0),
            (behind.get((r["group"], int(r["topic_id"]), int(r["partition"]))) or 0.0) if r["lag"] else 0.0,
            float(r["checkpoint_age"] or 0.0), r["owner"], bool(r["stale"]), r["retry_state"])
            for r in group_rows)
        members = tuple(MemberStatus(
            r["group"], r["topic"], r["member_id"], r["host"], r["pid"], float(r["heartbeat_age"] or 0.0),
            bool(r["stale"]), int(r["partitions"])) for r in member_rows)
        return StatusSnapshot(now_row[0].astimezone(timezone.utc), topics, tuple(parts), groups, members,
                              time.perf_counter() - started)

    def _lag_seconds(self, conn: psycopg.Connection, topic_ids: Iterable[int]
                     ) -> dict[tuple[str, int, int], float]:
        """Per (group, topic id, partition) with events to read: the age of the first unread event. One
        statement per topic, all sent in one round trip."""
        ids = sorted(topic_ids)
        if not ids:
            return {}
        out: dict[tuple[str, int, int], float] = {}
        curs: list[tuple[int, Any]] = []
        with conn.pipeline():
            for tid in ids:
                cur = conn.cursor()
                cur.execute(self.ex.query("status_first_unread", tid), (tid,))
                curs.append((tid, cur))
        for tid, cur in curs:
            for group, partition, seconds in cur.fetchall():
                if seconds is not None:
                    out[(group, tid, int(partition))] = max(0.0, float(seconds))
        return out
