"""Typed operations on stream-group checkpoints: one cursor (a position) per (group, topic, partition).

The statements the asyncio store (:mod:`pgstreams.storage.asyncstore`) runs too are written here once:
loading, creating, seeking (``*_call``, see :mod:`pgstreams.storage.calls`), storing
(:func:`store_query`, :func:`store_args`, :func:`outcomes_of`) and the creation of a group's missing
checkpoints at a start position (:func:`missing_checkpoints`).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from datetime import datetime
from typing import Any

import psycopg

from ..models import CommitOutcome
from .calls import ALL, RUN, Call, Steps, nothing, perform, perform_steps
from .events import Cursor, fences_call, idle_autocommit, time_cursors_call
from .executor import Executor

#: The cursor before every event of a partition.
ORIGIN: Cursor = 0


def _positions(cursors: Mapping[int, Cursor], partitions: Sequence[int]) -> list[int]:
    return [cursors[p] for p in partitions]


def head_cursors(fences: Mapping[int, int]) -> dict[int, Cursor]:
    """Per partition, the cursor before its read fence ``fences[p]``: after every event committed when the
    fence was read (those of transactions still open on the partition are read later)."""
    return {p: f - 1 for p, f in fences.items()}


def load_checkpoints_call(group: str, topic_id: int, partitions: Sequence[int]) -> Call[dict[int, Cursor]]:
    """The checkpoints of ``group`` on these partitions (partitions without one are absent)."""
    return Call("load_checkpoints", (group, topic_id, list(partitions)),
                lambda rows: {int(p): int(pos) for p, pos in rows}, fetch=ALL)


def init_checkpoints_call(group: str, topic_id: int, starts: Mapping[int, Cursor]) -> Call[None]:
    """Create the checkpoints of ``starts`` that do not exist yet (existing ones win)."""
    ps = sorted(starts)
    return Call("init_checkpoints", (group, topic_id, ps, _positions(starts, ps)), nothing, fetch=RUN)


def seek_checkpoints_call(group: str, topic_id: int, cursors: Mapping[int, Cursor]) -> Call[None]:
    """Set the checkpoints to ``cursors`` (they may move backwards)."""
    ps = sorted(cursors)
    return Call("seek_checkpoints", (group, topic_id, ps, _positions(cursors, ps)), nothing, fetch=RUN)


def missing_checkpoints(group: str, topic_id: int, partitions: Sequence[int], start: str | datetime
                        ) -> Steps[dict[int, Cursor]]:
    """Give ``group`` a checkpoint on each of ``partitions`` that has none, at ``start``: ``"earliest"``
    before the first event, ``"latest"`` before the read fence (after every event committed now), a
    datetime before the first event created at or after it (below the fence); the existing ones are kept.
    Returns the checkpoints of ``partitions`` (a procedure: see :data:`pgstreams.storage.calls.Steps`)."""
    parts = list(partitions)
    cursors: dict[int, Cursor] = yield load_checkpoints_call(group, topic_id, parts)
    missing = [p for p in parts if p not in cursors]
    if not missing:
        return cursors
    if start == "earliest":
        starts = dict.fromkeys(missing, ORIGIN)
    else:
        fences: dict[int, int] = yield fences_call(topic_id, missing)
        if isinstance(start, datetime):
            starts = yield time_cursors_call(topic_id, fences, start)
        else:
            starts = head_cursors(fences)
    yield init_checkpoints_call(group, topic_id, starts)
    loaded: dict[int, Cursor] = yield load_checkpoints_call(group, topic_id, parts)
    return loaded


def store_query(lazy: bool, fenced: bool = False) -> str:
    """The query storing checkpoints: fenced by a lease claim or not; ``lazy``: the commit does not wait for
    its WAL flush (see :func:`lazy_commit`)."""
    name = "store_checkpoints_fenced" if fenced else "store_checkpoints"
    return name + "_lazy" if lazy else name


def lazy_commit(durable: bool, conn: psycopg.Connection[Any] | psycopg.AsyncConnection[Any]) -> bool:
    """Whether a store of checkpoints on ``conn`` commits without waiting for its WAL flush: asked for
    (``durable=False``) on a connection idle in autocommit mode; in a transaction of the caller's, the
    transaction's own setting holds."""
    return not durable and idle_autocommit(conn)


def store_args(targets: Mapping[int, Cursor], expected: Mapping[int, Cursor]
               ) -> tuple[list[int], list[int], list[int]]:
    """The partitions of ``targets`` in order, their targets and their expected previous checkpoints."""
    ps = sorted(targets)
    return ps, [targets[p] for p in ps], [expected[p] for p in ps]


def outcomes_of(rows: Sequence[Sequence[Any]]) -> dict[int, CommitOutcome]:
    """Per partition, what storing its checkpoint did (the rows of :func:`store_query`'s query)."""
    return {int(p): CommitOutcome(code) for p, code in rows}


class CheckpointStore:
    """Checkpoints of one schema."""

    def __init__(self, executor: Executor) -> None:
        self.ex = executor

    def load(self, conn: psycopg.Connection, group: str, topic_id: int, partitions: Sequence[int]
             ) -> dict[int, Cursor]:
        """The checkpoints of ``group`` on these partitions (partitions without one are absent)."""
        return perform(self.ex, load_checkpoints_call(group, topic_id, partitions), conn)

    def create(self, conn: psycopg.Connection, group: str, topic_id: int, starts: Mapping[int, Cursor]
               ) -> None:
        """Create the checkpoints of ``starts`` that do not exist yet (existing ones win)."""
        perform(self.ex, init_checkpoints_call(group, topic_id, starts), conn)

    def create_missing(self, conn: psycopg.Connection, group: str, topic_id: int, partitions: Sequence[int],
                       start: str | datetime) -> dict[int, Cursor]:
        """Give ``group`` a checkpoint at ``start`` on each of ``partitions`` that has none (see
        :func:`missing_checkpoints`); the checkpoints of ``partitions``."""
        return perform_steps(self.ex, missing_checkpoints(group, topic_id, partitions, start), conn)

    def store(self, conn: psycopg.Connection, group: str, topic_id: int, targets: Mapping[int, Cursor],
              expected: Mapping[int, Cursor], lease: tuple[str, Mapping[int, int]] | None = None,
              durable: bool = True) -> dict[int, CommitOutcome]:
        """Store ``targets`` given the ``expected`` previous checkpoints; per partition, what happened.

        With ``lease`` (member id, lease epoch per partition) a partition whose lease the member no longer
        holds under that epoch is refused (:attr:`CommitOutcome.FENCED`). ``durable=False`` on an idle
        autocommit connection: the commit does not wait for its WAL flush (see the query
        ``store_checkpoints_lazy``); in a transaction of the caller's it has no effect.
        """
        ps, to, expect = store_args(targets, expected)
        query = store_query(lazy_commit(durable, conn), lease is not None)
        if lease is None:
            rows = self.ex.all(query, (group, topic_id, ps, to, expect), conn=conn)
        else:
            member, epochs = lease
            rows = self.ex.all(query, (group, topic_id, member, ps, to, expect,
                                       [epochs.get(p, -1) for p in ps]), conn=conn)
        return outcomes_of(rows)

    def seek(self, group: str, topic_id: int, cursors: Mapping[int, Cursor],
             conn: psycopg.Connection | None = None) -> None:
        """Set the checkpoints to ``cursors`` (they may move backwards)."""
        perform(self.ex, seek_checkpoints_call(group, topic_id, cursors), conn)

    def mirror(self, conn: psycopg.Connection, group: str, topic_id: int, cursors: Mapping[int, Cursor]
               ) -> None:
        """Set the checkpoints to ``cursors`` like :meth:`seek`, on ``conn`` (in the caller's transaction,
        if one is open); a checkpoint already there is left untouched, its ``updated_at`` too."""
        ps = sorted(cursors)
        self.ex.run("mirror_checkpoints", (group, topic_id, ps, _positions(cursors, ps)),
                    conn=conn)
