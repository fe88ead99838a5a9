"""Typed operations of operations: topic configuration changes, maintenance steps (segments ahead,
sealing, retention, member expiry), retention status, data-loss bookkeeping, group administration and
pg_cron jobs. The SQL is in ``sql/queries/operations.sql`` and ``0008_operations.sql``."""

from __future__ import annotations

import json
import threading
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime, timezone
from typing import Any

import psycopg
from psycopg import sql
from psycopg.rows import dict_row
from psycopg.types.json import Jsonb

from ..models import RetentionStatus
from ..pooler import keeps_sessions
from .executor import CORE_QUERIES, Executor

#: What releases a lock a maintenance step holds.
Release = Callable[[], None]


@dataclass(frozen=True)
class RemovedSegment:
    """A segment retention removed (or is removing), as seen for one partition: the segment's end
    ``hi``, the first and last positions of the partition's events in it, and how many there were."""

    partition: int
    segment: int
    hi: int
    first_position: int
    last_position: int
    events: int


@dataclass(frozen=True)
class TopicToCheck:
    """A topic a maintenance pass checks: its id, and its last drawn position and configuration when the
    pass listed it."""

    topic_id: int
    last_position: int
    config: dict[str, Any]


def _utc(dt: datetime | None) -> datetime | None:
    return None if dt is None else dt.astimezone(timezone.utc)


class OperationsStore:
    """Operations on one schema (see the module docstring)."""

    def __init__(self, executor: Executor) -> None:
        self.ex = executor

    def _segment_query(self, name: str, topic_id: int, segment: int) -> sql.Composed:
        tables = self.ex.tables(topic_id)
        return CORE_QUERIES.render(
            name, self.ex.schema, {**tables.identifiers, "segment": tables.segment(segment)}
        )

    # -- topic configuration -------------------------------------------------------------------------
    def alter_topic(
        self, name: str, config: Mapping[str, Any] | None, delete: Sequence[str], partitions: int | None
    ) -> tuple[int, int, dict[str, Any]] | None:
        """In one transaction: set ``config`` keys and remove ``delete`` keys of topic ``name``, and raise its
        partition count to ``partitions`` (groups reading it start the new partitions at their first
        event). Returns ``(id, partitions before, config after)``; ``None`` when there is no such topic.
        The caller has validated everything; a decrease is refused here too (ValueError)."""
        with self.ex.connection() as conn, conn.transaction():
            row = self.ex.one("lock_topic", (name,), conn=conn)
            if row is None:
                return None
            topic_id, before, stored = int(row[0]), int(row[1]), dict(row[2] or {})
            merged = {k: v for k, v in stored.items() if k not in delete}
            merged.update(config or {})
            if merged != stored:
                self.ex.run("set_topic_config", (Jsonb(merged), topic_id), conn=conn)
            if partitions is not None and partitions != before:
                if partitions < before:
                    raise ValueError(f"topic {name!r} has {before} partitions: decreasing is not possible")
                self.ex.run("set_topic_partitions", (partitions, topic_id), conn=conn)
                grown = {"first": before, "count": partitions, "topic_id": topic_id}
                self.ex.run("checkpoints_for_new_partitions", grown, conn=conn)
                self.ex.run("leases_for_new_partitions", grown, conn=conn)
            return topic_id, before, merged

    # -- maintenance ---------------------------------------------------------------------------------
    def prepare_pass(self, conn: psycopg.Connection) -> None:
        """Set up ``conn`` (a connection of its own) for a maintenance pass: its commits do not wait for
        their WAL flush. A pass commits many small transactions (per topic: segments ahead, sealing,
        retention marks, each step of a detach); WAL stays in order, so a mark is durable before the
        detach and drop that follow it, and a transaction that drops a table flushes WAL anyway. (A setting
        of the session, or behind a transaction pooler of each transaction: see
        :meth:`Executor.configure`.)"""
        self.ex.configure(conn, {"synchronous_commit": "off"})

    def lock_pass(self, conn: psycopg.Connection) -> Release:
        """Wait for and take the schema's maintenance lock for a pass on ``conn``; the call that releases
        it. Straight to the server (or behind a session pooler) a session lock of ``conn``; behind a
        transaction pooler, where ``conn``'s statements may each run in another server session, the same
        lock for one transaction, held open for the pass on a connection of its own (:meth:`_held`)."""
        if not keeps_sessions(self.ex.pooler):
            held = self._held("maintenance_xact_lock")
            assert held is not None  # the lock is waited for
            return held
        self.ex.one("maintenance_lock", (self.ex.schema,), conn=conn)

        def release() -> None:
            if not conn.closed:
                self.ex.one("maintenance_unlock", (self.ex.schema,), conn=conn)
        return release

    def _held(self, query: str) -> Release | None:
        """Run lock query ``query`` (a transaction-level advisory lock of the schema: waited for, or tried)
        in a transaction of a connection of its own, kept open while the lock is held: the call that ends
        that transaction (releasing the lock) and closes the connection, or ``None`` when the lock was
        tried and is taken. The transaction takes no snapshot between its statements and writes nothing:
        it holds back neither vacuum nor a read fence."""
        conn = self.ex.new_connection()
        try:
            conn.autocommit = False  # the lock query begins the transaction that holds the lock
            row = self.ex.one(query, (self.ex.schema,), conn=conn)
            if row is not None and row[0] is False:
                conn.close()
                return None
        except BaseException:
            conn.close()
            raise

        def release() -> None:
            try:
                if not conn.closed:
                    conn.rollback()
            except psycopg.Error:  # pragma: no cover - closing ends the transaction anyway
                pass
            finally:
                conn.close()
        return release

    def try_lead(self, conn: psycopg.Connection, holder: str, ttl: float) -> bool:
        """Try to become the schema's maintenance leader (``holder`` names the candidate): straight to the
        server, a session lock of ``conn`` held until :meth:`resign` or the connection ends (``ttl`` is
        not used); behind a transaction pooler, the schema's maintenance lease for ``ttl`` seconds
        (renewed by :meth:`still_leads`, lost if not renewed in time)."""
        if not keeps_sessions(self.ex.pooler):
            return self.still_leads(conn, holder, ttl)
        row = self.ex.one("maintenance_leader_lock", (self.ex.schema,), conn=conn)
        return bool(row and row[0])

    def still_leads(self, conn: psycopg.Connection, holder: str, ttl: float) -> bool:
        """Whether ``holder``, which leads, still does: straight to the server its session lock lasts as
        long as ``conn`` (this raises if ``conn`` broke); behind a transaction pooler its lease is renewed
        for ``ttl`` seconds (false if it ran out and another took it meanwhile)."""
        if keeps_sessions(self.ex.pooler):
            self.ex.one("ping", conn=conn)
            return True
        row = self.ex.one("maintenance_lead", {"holder": holder, "ttl_ms": round(ttl * 1000)}, conn=conn)
        return row is not None

    def resign(self, conn: psycopg.Connection, holder: str) -> None:
        """Give up the leadership ``holder`` holds (its session lock on ``conn``, or its lease)."""
        if keeps_sessions(self.ex.pooler):
            self.ex.one("maintenance_leader_unlock", (self.ex.schema,), conn=conn)
        else:
            self.ex.run("maintenance_resign", (holder,), conn=conn)

    def maintenance_leader(self) -> str | None:
        """The holder of the schema's maintenance lease (behind a transaction pooler), ``None`` when nobody
        holds it or it ran out."""
        row = self.ex.one("maintenance_leader")
        return None if row is None else str(row[0])

    def ping(self, conn: psycopg.Connection) -> None:
        """Raise if ``conn`` is broken."""
        self.ex.one("ping", conn=conn)

    def topic_ids(self, conn: psycopg.Connection) -> list[int]:
        """Every topic id."""
        return [int(r[0]) for r in self.ex.all("topic_ids", conn=conn)]

    def topics_to_check(self, conn: psycopg.Connection) -> list[TopicToCheck]:
        """The topics whose state moved since a pass last checked them (new events, another
        configuration, segments left to seal or detach, retention by age due, never checked), with their
        last drawn position and configuration as read now; idle topics are not listed."""
        return [TopicToCheck(int(t), int(p), dict(c or {}))
                for t, p, c in self.ex.all("maintenance_topics", conn=conn)]

    def topic_checked(self, conn: psycopg.Connection, topic: TopicToCheck) -> None:
        """Record that a pass checked ``topic`` (as :meth:`topics_to_check` returned it): retention ran on
        it, and the next passes skip it while its state does not move."""
        self.ex.one("topic_checked", (topic.topic_id, topic.last_position, Jsonb(topic.config)), conn=conn)

    def prepare_segments(self, conn: psycopg.Connection, topic_id: int) -> int:
        """Create segments ahead of the publishers and give the segment being filled statistics; return the
        number of segments created."""
        row = self.ex.one("prepare_segments", (topic_id,), conn=conn)
        return int(row[0]) if row else 0

    def seal_segments(self, conn: psycopg.Connection, topic_id: int) -> int:
        """Record the figures of the segments every read fence has passed; return how many."""
        row = self.ex.one("seal_segments", (topic_id,), conn=conn)
        return int(row[0]) if row else 0

    def retention_plan(self, conn: psycopg.Connection, topic_id: int) -> list[tuple[int, int, int]]:
        """The segments retention removes now, oldest first: ``(segment, events, bytes)``."""
        return [
            (int(s), int(e or 0), int(b or 0))
            for s, e, b in self.ex.all("retention_plan", (topic_id,), conn=conn)
        ]

    def mark_removing(
        self, conn: psycopg.Connection, topic_id: int, segments: Sequence[int], events: int, size: int
    ) -> int:
        """Mark ``segments`` as being removed and count them as removed (committed before detaching);
        count what share groups lose with them (``share_retention_loss()``) and return it."""
        row = self.ex.one("mark_removing", (topic_id, list(segments), events, size), conn=conn)
        return int(row[0] or 0) if row is not None else 0

    def retention_ran(self, conn: psycopg.Connection, topic_id: int) -> None:
        """Record that retention ran on the topic."""
        self.ex.one("retention_ran", (topic_id,), conn=conn)

    def removing_segments(self, conn: psycopg.Connection, topic_id: int) -> list[int]:
        """The segments marked as being removed and not dropped yet."""
        return [int(r[0]) for r in self.ex.all("removing_segments", (topic_id,), conn=conn)]

    def detach_segment(self, conn: psycopg.Connection, topic_id: int, segment: int) -> None:
        """Detach a marked segment without blocking publishers or readers (``DETACH PARTITION ...
        CONCURRENTLY``, or ``FINALIZE`` of one interrupted) and record it as detached: its events are
        gone from the topic; :meth:`drop_detached` frees its space. ``conn`` must be in autocommit
        mode."""
        tables = self.ex.tables(topic_id)
        segment_name = f'"{self.ex.schema}"."{tables.segment_prefix}{int(segment)}"'
        row = self.ex.one("segment_detach_state", (segment_name, tables.table_regclass), conn=conn)
        if row is not None:
            name = "finalize_detach" if row[0] else "detach_segment"
            self._detach(conn, self._segment_query(name, topic_id, segment))
        self.ex.run("segment_detached", (topic_id, segment), conn=conn)

    def _detach(self, conn: psycopg.Connection, query: sql.Composed) -> None:
        """Run a detach (``DETACH PARTITION ... CONCURRENTLY`` or ``FINALIZE``) on ``conn``. Such a
        statement runs outside any transaction block, so behind a transaction pooler no setting of one
        transaction reaches it: there its waits are bounded by cancelling it once it ran longer than the
        ``lock_timeout`` given to ``conn`` (:meth:`Executor.configure`), raised as
        :class:`psycopg.errors.LockNotAvailable` as PostgreSQL's own lock timeout is (the detach is
        finished by the next pass)."""
        limit = self.ex.settings(conn).get("lock_timeout")
        if keeps_sessions(self.ex.pooler) or not limit or int(limit) <= 0:
            conn.execute(query)
            return
        guard = threading.Lock()
        state = {"running": True, "cancelled": False}

        def cancel() -> None:
            with guard:  # never once the statement returned: the cancel would reach the next one
                if state["running"]:
                    state["cancelled"] = True
                    conn.cancel_safe()

        timer = threading.Timer(int(limit) / 1000, cancel)
        timer.daemon = True
        timer.start()
        try:
            conn.execute(query)
        except psycopg.errors.QueryCanceled:
            if state["cancelled"]:
                raise psycopg.errors.LockNotAvailable(
                    f"canceling statement due to lock timeout (the detach ran longer than {int(limit)} ms)"
                ) from None
            raise
        finally:
            with guard:
                state["running"] = False
            timer.cancel()

    def remove_segment(self, conn: psycopg.Connection, topic_id: int, segment: int) -> None:
        """Detach a marked segment (:meth:`detach_segment`), drop it and forget it. ``conn`` must be in
        autocommit mode."""
        self.detach_segment(conn, topic_id, segment)
        self.drop_detached(conn, topic_id, segment)

    def detached_segments(self, conn: psycopg.Connection) -> list[tuple[int, int]]:
        """The detached segments not dropped yet, as ``(topic id, segment)``, oldest first."""
        return [(int(t), int(s)) for t, s in self.ex.all("detached_segments", conn=conn)]

    def drop_detached(self, conn: psycopg.Connection, topic_id: int, segment: int) -> None:
        """Drop a detached segment's table (it locks nothing the topic's users touch) and forget it."""
        self.ex.execute(conn, self._segment_query("drop_segment_table", topic_id, segment))
        self.ex.run("forget_segment", (topic_id, segment), conn=conn)

    def try_purge_lock(self, conn: psycopg.Connection) -> Release | None:
        """Take the schema's purge lock if free: the call that releases it, ``None`` when another purge
        holds it. A session lock of ``conn``, or behind a transaction pooler the same lock for a
        transaction held open on a connection of its own (as :meth:`lock_pass`)."""
        if not keeps_sessions(self.ex.pooler):
            return self._held("purge_xact_lock")
        row = self.ex.one("purge_lock", (self.ex.schema,), conn=conn)
        if not (row and row[0]):
            return None

        def release() -> None:
            if not conn.closed:
                self.ex.one("purge_unlock", (self.ex.schema,), conn=conn)
        return release

    def expire_members(self, conn: psycopg.Connection) -> int:
        """Expire the members of every group that missed their session timeout; return how many."""
        row = self.ex.one("expire_members", conn=conn)
        return int(row[0]) if row else 0

    def record_pass(
        self, conn: psycopg.Connection, seconds: float, runner: str, summary: Mapping[str, Any]
    ) -> None:
        """Record the schema's last maintenance pass."""
        self.ex.run("record_maintenance", (seconds * 1000, runner, Jsonb(dict(summary))), conn=conn)

    def last_pass(self) -> dict[str, Any] | None:
        """The schema's last maintenance pass: ``ran_at`` (``None``: never), ``duration_ms``, ``runner``
        (``python`` or ``sql``), ``summary``."""
        row: dict[str, Any] | None = self.ex.one("last_maintenance", row=dict_row)
        if row is not None:
            row["ran_at"] = _utc(row["ran_at"])
        return row

    def maintain_sql(
        self, conn: psycopg.Connection | None = None, lock_timeout_ms: int = 100
    ) -> dict[str, Any]:
        """Run the SQL function ``maintain()`` (what pg_cron runs); return its summary."""
        row = self.ex.one("maintain_sql", (lock_timeout_ms,), conn=conn)
        out: dict[str, Any] = row[0] if row and isinstance(row[0], dict) else json.loads(row[0])
        return out

    # -- retention -------------------------------------------------------------------------------------
    def retention_status(self, topic: str | None = None) -> list[RetentionStatus]:
        """Every topic's retention status (of one ``topic`` if given), by name."""
        out = []
        for r in self.ex.all("retention_status", (topic, topic), row=dict_row):
            r["oldest_at"] = _utc(r["oldest_at"])
            r["retention_ran_at"] = _utc(r["retention_ran_at"])
            r["compacted_at"] = _utc(r["compacted_at"])
            r["dirty_ratio"] = None if r["dirty_ratio"] is None else float(r["dirty_ratio"])
            for k in ("bytes", "segments", "segments_removed", "events_removed", "bytes_removed",
                      "segments_compacted", "events_compacted", "tombstones_removed", "bytes_compacted"):
                r[k] = int(r[k] or 0)
            out.append(RetentionStatus(**r))
        return out

    def grant(self, role: str, privilege: str, topic: str | None, group: str | None) -> None:
        """Grant ``role`` a privilege (``produce`` on ``topic``, ``consume`` for ``group`` on ``topic``,
        ``admin``), in one transaction (see ``0011_roles.sql``)."""
        def go(conn: psycopg.Connection) -> None:
            with conn.transaction():
                self.ex.one("grant_role", (role, privilege, topic, group), conn=conn)

        self.ex.pooled(go)

    def revoke(self, role: str, privilege: str, topic: str | None, group: str | None) -> int:
        """Revoke what :meth:`grant` granted (``topic``/``group`` ``None``: every one); how many grants
        went."""
        row = self.ex.one("revoke_role", (role, privilege, topic, group))
        return int(row[0]) if row else 0

    def record_losses(
        self, conn: psycopg.Connection, group: str, topic_id: int, losses: Sequence[tuple[int, int, int]]
    ) -> None:
        """Record ``(partition, segment, events)`` lost by ``group`` (each once per group)."""
        self.ex.run(
            "record_losses",
            (
                group,
                topic_id,
                [p for p, _, _ in losses],
                [s for _, s, _ in losses],
                [n for _, _, n in losses],
            ),
            conn=conn,
        )

    def retained_floors(self, conn: psycopg.Connection | None, topic_id: int) -> dict[int, int]:
        """Per partition, the last position retention removed (partitions without removals are absent)."""
        return {int(p): int(pos) for p, pos in self.ex.all("retained_floors", (topic_id,), conn=conn)}

    # -- groups ----------------------------------------------------------------------------------------
    def live_members(self, group: str, topic: str | None) -> list[str]:
        """The members of ``group`` (on ``topic`` if given) that are alive (heartbeat within their
        session timeout)."""
        return [r[0] for r in self.ex.all("live_members", (group, topic, topic))]

    def group_topics(self, group: str) -> list[str]:
        """The topics ``group`` has checkpoints on."""
        return [r[0] for r in self.ex.all("group_topics", (group,))]

    def checkpoints(self, group: str, topic_id: int) -> dict[int, int]:
        """The checkpoints of ``group`` on a topic, by partition."""
        return {int(p): int(pos) for p, pos in self.ex.all("group_topic_checkpoints", (group, topic_id))}

    def shift(
        self, conn: psycopg.Connection, topic_id: int, partition: int, position: int, by: int, fence: int
    ) -> int | None:
        """The checkpoint ``by`` events after (``by`` > 0, below ``fence``) or before (``by`` < 0) the
        checkpoint at ``position``; ``None`` when the partition holds fewer events that way."""
        if by >= 0:
            row = self.ex.one(
                "shift_forward", (partition, position, fence, by - 1), conn=conn, topic_id=topic_id
            )
        else:
            row = self.ex.one("shift_back", (partition, position, -by), conn=conn, topic_id=topic_id)
        return None if row is None else int(row[0])

    def delete_group(self, group: str, topic_ids: Sequence[int] | None) -> int:
        """Delete the state of ``group`` on ``topic_ids`` (``None``: everywhere, with its configuration);
        return the number of checkpoints deleted."""
        with self.ex.connection() as conn, conn.transaction():
            row = self.ex.one(
                "delete_group",
                {"group": group, "topic_ids": None if topic_ids is None else list(topic_ids)},
                conn=conn,
            )
            self.ex.run("delete_group_config", (group, group), conn=conn)
        return int(row[0]) if row else 0

    # -- pg_cron -----------------------------------------------------------------------------------------
    def pg_cron_settings(self) -> tuple[bool, str | None, str]:
        """Whether pg_cron is loaded (``shared_preload_libraries``), the database it runs in
        (``cron.database_name``, ``None`` when pg_cron is not loaded) and this database's name."""
        row = self.ex.one("pg_cron_settings")
        assert row is not None
        return bool(row[0]), row[1], row[2]
