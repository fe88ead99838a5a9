"""Typed operations on stream-group checkpoints: one cursor (a position) per (group, topic, partition)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import psycopg

from ..models import CommitOutcome
from .events import Cursor
from .executor import Executor
from .libpq import usable


def _positions(cursors: Mapping[int, Cursor], partitions: Sequence[int]) -> list[int]:
    return [cursors[p] for p in partitions]


class CheckpointStore:
    """Checkpoints of one schema."""

    def __init__(self, executor: Executor) -> None:
        self.ex = executor

    def load(self, conn: psycopg.Connection, group: str, topic_id: int, partitions: Sequence[int]
             ) -> dict[int, Cursor]:
        """The checkpoints of ``group`` on these partitions (partitions without one are absent)."""
        rows = self.ex.all("load_checkpoints", (group, topic_id, list(partitions)), conn=conn)
        return {int(p): int(pos) for p, pos in rows}

    def create(self, conn: psycopg.Connection, group: str, topic_id: int, starts: Mapping[int, Cursor]
               ) -> None:
        """Create the checkpoints of ``starts`` that do not exist yet (existing ones win)."""
        ps = sorted(starts)
        self.ex.run("init_checkpoints", (group, topic_id, ps, _positions(starts, ps)),
                    conn=conn)

    def store(self, conn: psycopg.Connection, group: str, topic_id: int, targets: Mapping[int, Cursor],
              expected: Mapping[int, Cursor], lease: tuple[str, Mapping[int, int]] | None = None,
              durable: bool = True) -> dict[int, CommitOutcome]:
        """Store ``targets`` given the ``expected`` previous checkpoints; per partition, what happened.

        With ``lease`` (member id, lease epoch per partition) a partition whose lease the member no longer
        holds under that epoch is refused (:attr:`CommitOutcome.FENCED`). ``durable=False`` on an idle
        autocommit connection: the commit does not wait for its WAL flush (see the query
        ``store_checkpoints_lazy``); in a transaction of the caller's it has no effect.
        """
        ps = sorted(targets)
        args = (ps, _positions(targets, ps), _positions(expected, ps))
        lazy = "" if durable or not usable(conn) else "_lazy"
        if lease is None:
            rows = self.ex.all("store_checkpoints" + lazy, (group, topic_id, *args), conn=conn)
        else:
            member, epochs = lease
            rows = self.ex.all("store_checkpoints_fenced" + lazy,
                               (group, topic_id, member, *args, [epochs.get(p, -1) for p in ps]), conn=conn)
        return {int(p): CommitOutcome(code) for p, code in rows}

    def seek(self, group: str, topic_id: int, cursors: Mapping[int, Cursor],
             conn: psycopg.Connection | None = None) -> None:
        """Set the checkpoints to ``cursors`` (they may move backwards)."""
        ps = sorted(cursors)
        self.ex.run("seek_checkpoints", (group, topic_id, ps, _positions(cursors, ps)),
                    conn=conn)

    def mirror(self, conn: psycopg.Connection, group: str, topic_id: int, cursors: Mapping[int, Cursor]
               ) -> None:
        """Set the checkpoints to ``cursors`` like :meth:`seek`, on ``conn`` (in the caller's transaction,
        if one is open); a checkpoint already there is left untouched, its ``updated_at`` too."""
        ps = sorted(cursors)
        self.ex.run("mirror_checkpoints", (group, topic_id, ps, _positions(cursors, ps)),
                    conn=conn)
