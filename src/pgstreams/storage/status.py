"""Typed operations reading the database-wide status (topics, partitions, group lag, members) for
metrics exporters and the web console, in O(topics + partitions + groups + members) work."""

from __future__ import annotations

import time
from collections.abc import Sequence
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
        """Everything at once, on one connection (see :class:`StatusSnapshot`): a few schema-wide
        queries, then one statement per topic for its partitions and one per topic with checkpoints, all
        sent in one round trip (prepared: a connection plans each once)."""
        started = time.perf_counter()
        with self.ex.connection() as conn:
            conn.prepared_max = None  # keep every topic's statements planned
            now_row = self.ex.one("status_now", conn=conn)
            dlts = {r[0] for r in self.ex.all("status_dead_letter_topics", conn=conn)}
            topic_rows = self.ex.all("status_topics", {"schema": self.ex.schema}, conn=conn, row=dict_row)
            sealed = self.ex.all("status_sealed", conn=conn)
            leases = {(r["group"], int(r["topic_id"]), int(r["partition"])): r
                      for r in self.ex.all("status_leases", conn=conn, row=dict_row)}
            member_rows = self.ex.all("status_members", conn=conn, row=dict_row)
            read = {int(r[0]) for r in self.ex.all("status_checkpointed_topics", conn=conn)}
            per_topic = self._per_topic(conn, topic_rows, read)
        stats: dict[tuple[int, int], list[tuple[int, int, int, bool]]] = {}
        for tid, part, lo, hi, events, removed in sealed:
            stats.setdefault((int(tid), int(part)), []).append((int(lo), int(hi), int(events), bool(removed)))
        topics, parts, groups = [], [], []
        for t in topic_rows:
            tid, name, end = int(t["topic_id"]), t["topic"], int(t["sealed_end"])
            topics.append(TopicStatus(
                name, int(t["partitions"]), int(t["bytes"] or 0), int(t["segments"] or 0), t["retention_ms"],
                t["retention_events"], t["retention_bytes"], name.endswith(_DLT_SUFFIX) or name in dlts,
                t["created_at"].astimezone(timezone.utc)))
            part_rows, checkpoint_rows = per_topic[tid]
            heads: dict[int, int | None] = {}
            for p, head, tail in part_rows:
                segs = stats.get((tid, int(p)), [])
                stored = int(tail) + sum(n for lo, hi, n, gone in segs if not gone and hi <= end)
                removed = sum(n for lo, hi, n, gone in segs if gone)
                heads[int(p)] = None if head is None else int(head)
                parts.append(PartitionStats(name, int(p), heads[int(p)], stored, stored + removed))
            size = int(t["segment_size"])
            for r in checkpoint_rows:
                p, cp = int(r["partition"]), int(r["checkpoint"])
                after = (cp // size + 1) * size  # the end of the segment holding the checkpoint
                lag = int(r["tail"]) + int(r["in_segment"]) + sum(
                    n for lo, hi, n, gone in stats.get((tid, p), [])
                    if not gone and lo >= after and hi <= end)
                lease = leases.get((r["group"], tid, p), {})
                groups.append(GroupLag(
                    r["group"], name, p, cp or None, heads.get(p), lag,
                    max(0.0, float(r["lag_seconds"])) if lag and r["lag_seconds"] is not None else 0.0,
                    float(r["checkpoint_age"] or 0.0), lease.get("owner"), bool(lease.get("stale")),
                    lease.get("retry_state")))
        groups.sort(key=lambda g: (g.group, g.topic, g.partition))
        members = tuple(MemberStatus(
            r["group"], r["topic"], r["member_id"], r["host"], r["pid"], float(r["heartbeat_age"] or 0.0),
            bool(r["stale"]), int(r["partitions"])) for r in member_rows)
        return StatusSnapshot(now_row[0].astimezone(timezone.utc), tuple(topics), tuple(parts), tuple(groups),
                              members, time.perf_counter() - started)

    def _per_topic(self, conn: psycopg.Connection, topic_rows: Sequence[dict[str, Any]],
                   checkpointed: set[int]) -> dict[int, tuple[list[tuple[Any, ...]], list[dict[str, Any]]]]:
        """Per topic: its partitions' rows and its checkpoints' rows (read for the ``checkpointed``
        topics only), every statement sent in one pipeline."""
        curs: dict[int, tuple[Any, Any]] = {}
        with conn.pipeline():
            for t in topic_rows:
                tid = int(t["topic_id"])
                params = {"topic_id": tid, "partitions": int(t["partitions"]), "sealed": int(t["sealed_end"]),
                          "size": int(t["segment_size"])}
                pc = conn.cursor()
                pc.execute(self.ex.query("status_topic_partitions", tid), params, prepare=True)
                cc = None
                if tid in checkpointed:
                    cc = conn.cursor(row_factory=dict_row)
                    cc.execute(self.ex.query("status_topic_checkpoints", tid), params, prepare=True)
                curs[tid] = (pc, cc)
        return {tid: (pc.fetchall(), [] if cc is None else cc.fetchall()) for tid, (pc, cc) in curs.items()}
