"""The SQL of stream-group reading: checkpoints, start cursors, polls."""

from __future__ import annotations

from collections.abc import Mapping
from datetime import datetime
from typing import TYPE_CHECKING, Any

import psycopg
from psycopg.rows import tuple_row

if TYPE_CHECKING:
    from ..client import Client
    from .reader import Cursor, LeaseClaim

class CheckpointSql:
    """Every statement of stream-group reading, one method per named query of one group and topic; rows
    are returned as the driver gives them. Nothing else in :mod:`pgstreams.consumer` runs SQL."""

    __slots__ = ("_client", "_group", "_tid")

    def __init__(self, client: Client, group: str, topic_id: int) -> None:
        self._client = client
        self._group = group
        self._tid = topic_id

    def load(self, conn: psycopg.Connection, partitions: list[int]) -> list[tuple[Any, ...]]:
        return conn.cursor(row_factory=tuple_row).execute(
            self._client._q("load_checkpoints"), (self._group, self._tid, partitions)).fetchall()

    def init(self, conn: psycopg.Connection, starts: Mapping[int, Cursor]) -> None:
        ps = sorted(starts)
        conn.cursor(row_factory=tuple_row).execute(
            self._client._q("init_checkpoints"),
            (self._group, self._tid, ps, [str(starts[p][0]) for p in ps], [starts[p][1] for p in ps]))

    def heads(self, conn: psycopg.Connection, partitions: list[int]) -> list[tuple[Any, ...]]:
        return conn.cursor(row_factory=tuple_row).execute(
            self._client._q("head_cursors", self._tid), (partitions,)).fetchall()

    def times(self, conn: psycopg.Connection, partitions: list[int], dt: datetime) -> list[tuple[Any, ...]]:
        return conn.cursor(row_factory=tuple_row).execute(
            self._client._q("time_cursors", self._tid), (partitions, dt)).fetchall()

    def position(self, conn: psycopg.Connection, partition: int, position: int) -> tuple[Any, ...] | None:
        return conn.cursor(row_factory=tuple_row).execute(
            self._client._q("position_cursor", self._tid), (partition, position)).fetchone()

    def poll(self, conn: psycopg.Connection, params: dict[str, Any]) -> list[tuple[Any, ...]]:
        return conn.cursor(row_factory=tuple_row, binary=True).execute(
            self._client._q("poll", self._tid), params, prepare=True).fetchall()

    def store(self, conn: psycopg.Connection, targets: Mapping[int, Cursor], expected: Mapping[int, Cursor],
              lease: LeaseClaim | None) -> list[tuple[Any, ...]]:
        ps = sorted(targets)
        params = (self._group, self._tid, ps, [str(targets[p][0]) for p in ps], [targets[p][1] for p in ps],
                  [str(expected[p][0]) for p in ps], [expected[p][1] for p in ps])
        cur = conn.cursor(row_factory=tuple_row)
        if lease is None:
            return cur.execute(self._client._q("store_checkpoints"), params).fetchall()
        return cur.execute(self._client._q("store_checkpoints_fenced"),
                           (*params[:2], lease.member_id, *params[2:],
                            [lease.epochs.get(p, -1) for p in ps])).fetchall()

    def seek(self, conn: psycopg.Connection, cursors: Mapping[int, Cursor]) -> None:
        ps = sorted(cursors)
        conn.execute(self._client._q("seek_checkpoints"), (self._group, self._tid, ps,
                                                           [str(cursors[p][0]) for p in ps],
                                                           [cursors[p][1] for p in ps]))

    def limit_idle(self, conn: psycopg.Connection, seconds: float) -> None:
        conn.execute("SELECT set_config('idle_in_transaction_session_timeout', %s, true)",
                     (str(round(seconds * 1000)),))
