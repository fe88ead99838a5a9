"""Typed operations on groups: membership and leases, retry state, configuration and status."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from datetime import datetime, timezone
from typing import Any

import psycopg
from psycopg.rows import dict_row

from ..models import GroupInfo, GroupPartitionStatus, MemberInfo
from .executor import Executor

#: A member's leases as the membership functions return them: ``(alive, owned partitions, their epochs,
#: partitions to hand over, partitions waited for)``.
LeaseRow = tuple[Any, ...]

_STATUS_TIMES = ("updated_at", "acquired_at", "last_heartbeat", "error_at")


def _utc(dt: datetime | None) -> datetime | None:
    return None if dt is None else dt.astimezone(timezone.utc)


def _status(row: dict[str, Any]) -> GroupPartitionStatus:
    for name in _STATUS_TIMES:
        row[name] = _utc(row[name])
    row["lag"] = int(row["lag"] or 0)
    row["stale"] = bool(row["stale"])
    row["lost_events"] = int(row.get("lost_events") or 0)
    return GroupPartitionStatus(**row)


class GroupStore:
    """Group state of one schema. Membership calls take the connection to use (members keep connections
    of their own for heartbeats and balancing)."""

    def __init__(self, executor: Executor) -> None:
        self.ex = executor

    # -- membership ------------------------------------------------------------------------------------
    def prepare_member_connection(self, conn: psycopg.Connection, lock_timeout: float) -> None:
        """Set up a member's own connection: waits for lease locks give up after ``lock_timeout`` s (a
        setting of its session, or of each of its transactions behind a transaction pooler: see
        :meth:`Executor.configure`)."""
        self.ex.configure(conn, {"lock_timeout": str(round(lock_timeout * 1000))})

    def register(self, conn: psycopg.Connection | None, group: str, topic_id: int, member_id: str, host: str,
                 pid: int, heartbeat_interval: float, session_timeout: float) -> None:
        """Register (or re-register) a member."""
        self.ex.one("register_member", (group, topic_id, member_id, host, pid,
                                        round(heartbeat_interval * 1000), round(session_timeout * 1000)),
                    conn=conn)

    def leases(self, name: str, conn: psycopg.Connection | None, group: str, topic_id: int, member_id: str
               ) -> LeaseRow | None:
        """Run membership function ``name`` (``member_heartbeat``, ``member_leases`` or ``balance_leases``)
        and return the member's leases after it."""
        if name not in ("member_heartbeat", "member_leases", "balance_leases"):
            raise ValueError(f"not a lease function: {name!r}")
        row: LeaseRow | None = self.ex.one(name, (group, topic_id, member_id), conn=conn)
        return row

    def release(self, conn: psycopg.Connection | None, group: str, topic_id: int, member_id: str,
                epochs: Mapping[int, int]) -> list[int]:
        """Hand over the partitions of ``epochs`` (partition -> epoch owned under); return those released."""
        ps = sorted(epochs)
        row = self.ex.one("release_leases", (group, topic_id, member_id, ps, [epochs[p] for p in ps]),
                          conn=conn)
        return list(row[0]) if row and row[0] else []

    def leave(self, conn: psycopg.Connection | None, group: str, topic_id: int, member_id: str) -> int:
        """Release every lease of the member and unregister it; return the number released."""
        row = self.ex.one("leave_group", (group, topic_id, member_id), conn=conn)
        return int(row[0]) if row else 0

    def members(self, group: str, topic: str | None) -> list[MemberInfo]:
        """The registered members of ``group`` (on one ``topic`` if given), stale ones included."""
        out = []
        for r in self.ex.all("group_members", (group, topic, topic), row=dict_row):
            out.append(MemberInfo(
                r["group"], r["topic"], r["member_id"], r["host"], r["pid"], r["registered_at"].astimezone(
                    timezone.utc), r["last_heartbeat"].astimezone(timezone.utc),
                r["heartbeat_interval_ms"] / 1000, r["session_timeout_ms"] / 1000, bool(r["stale"]),
                tuple(r["partitions"] or ())))
        return out

    # -- retry state -----------------------------------------------------------------------------------
    def retry_attempts(self, group: str, topic_id: int, partitions: Sequence[int]
                       ) -> dict[tuple[int, int], int]:
        """The failing event each partition was stuck on under a previous owner: (partition, position) ->
        attempts so far."""
        rows = self.ex.all("retry_states", (group, topic_id, list(partitions)))
        return {(int(p), int(pos)): int(n) for p, pos, n in rows}

    def set_retry_state(self, group: str, topic_id: int, partition: int, member_id: str, state: str,
                        position: int, attempts: int, error: str) -> None:
        """Record that ``partition`` is stuck on the event at ``position`` (``state``: retrying or
        blocked)."""
        self.ex.run("set_retry_state",
                    (state, position, attempts, error, group, topic_id, partition, member_id))

    def clear_retry_state(self, group: str, topic_id: int, partitions: Sequence[int]) -> None:
        """Forget the retry state of ``partitions`` (their failing event was handled or dead-lettered)."""
        self.ex.run("clear_retry_state", (group, topic_id, sorted(partitions)))

    def limit_idle_transaction(self, conn: psycopg.Connection, seconds: float) -> None:
        """End the session if the open transaction on ``conn`` sits idle longer than ``seconds``."""
        self.ex.one("set_idle_timeout", (str(round(seconds * 1000)),), conn=conn)

    # -- configuration ---------------------------------------------------------------------------------
    def config(self, group: str) -> dict[str, Any] | None:
        """The stored configuration row of ``group`` (``None``: never configured)."""
        row: dict[str, Any] | None = self.ex.one("get_group_config", (group,), row=dict_row)
        return row

    def put_config(self, group: str, heartbeat_interval: float, session_timeout: float, dead_letter: bool,
                   dead_letter_topic: str | None) -> None:
        """Store the configuration of ``group``."""
        self.ex.run("put_group_config", (group, round(heartbeat_interval * 1000),
                                         round(session_timeout * 1000), dead_letter, dead_letter_topic))

    # -- status ----------------------------------------------------------------------------------------
    def status(self, group: str, topic: str | None = None) -> list[GroupPartitionStatus]:
        """The state of ``group`` per topic and partition (of one ``topic`` if given), by topic and
        partition; empty when it has no checkpoints. The lag comes from the sealed segments' statistics,
        at most one bucket of rows of the segment holding the checkpoint, and the rows of the unsealed
        segments (``partition_progress()``, migration 0024)."""
        rows = self.ex.all("consumer_group_status", (group, topic, topic), row=dict_row)
        return [_status(r) for r in rows]

    def summaries(self) -> list[GroupInfo]:
        """Every group with checkpoints, the topics it reads and its total lag (one query)."""
        return [GroupInfo(r["group"], tuple(r["topics"]), int(r["lag"] or 0))
                for r in self.ex.all("list_groups", row=dict_row)]
