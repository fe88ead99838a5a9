"""Typed operations on share groups: settings, frontiers, acquiring and settling events, status.

The state of a share group (see ``0007_share_groups.sql``): a frontier per partition and a row per event
in flight (acquired, available again, waiting, or being dead-lettered); done events have no row.
"""

from __future__ import annotations

import functools
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import timezone
from typing import Any

import psycopg
from psycopg import sql
from psycopg.rows import dict_row

from ..models import ShareGroupStatus
from .events import fences_query
from .executor import Executor
from .libpq import Direct, Statement, Step, statement, statement_of, text_params, usable
from .naming import TopicTables
from .queries import QuerySet

#: The acquisition of new events (``sql/shares/advance.sql``), rendered per topic and lock mode.
SHARE_QUERIES = QuerySet("pgstreams.storage", "sql", "shares")


@functools.lru_cache(maxsize=1024)
def _advance(schema: str, topic_id: int, wait: bool) -> sql.Composed:
    ids = dict(TopicTables(schema, topic_id).identifiers)
    ids["wait"] = sql.SQL("" if wait else "SKIP LOCKED")
    # the frontier row by the tid share_frontiers() found (migration 0023), unless waiting for it: a row
    # another consumer moved meanwhile is then locked in its new version (which the statement's snapshot
    # does not see, so it is found by key again to be updated), where a tid would pass it over and lock the
    # next partition's row while still holding it (two consumers waiting so would deadlock)
    ids["frontier_at"] = sql.SQL("" if wait else "sp.ctid = c.at AND")
    ids["locked_at"] = sql.SQL("" if wait else "sp.ctid = f.at AND")
    return SHARE_QUERIES.render("share_advance", schema, ids)

@functools.lru_cache(maxsize=1024)
def _advance_statement(schema: str, topic_id: int, wait: bool) -> Statement:
    return statement_of("share_advance_wait" if wait else "share_advance", _advance(schema, topic_id, wait)
                        .as_bytes(None))

#: What :meth:`ShareStore.acquire` returns per event: the columns of a poll's row (see
#: ``pgstreams.consumer.ROW_FIELDS``), then the delivery count, the state (``"a"`` acquired, ``"d"``
#: claimed for the dead-letter topic) and the first position of its batch row (``None``: its own row).
AcquiredRow = tuple[Any, ...]

#: An acquisition to settle: ``(partition, position, delivery count, first position of its batch row or
#: None)``.
Held = tuple[int, int, int, "int | None"]

#: The actions of :meth:`ShareStore.settle`.
ACK, RELEASE, RENEW, REJECT, FINISH_DEAD_LETTER = "k", "l", "n", "j", "x"


@dataclass(frozen=True)
class ShareSettings:
    """A share group's settings as stored (those of its latest consumer)."""

    queue: bool
    lock_timeout: float
    max_deliveries: int
    dead_letter: str | None
    ordering: str | None


class ShareStore:
    """Share-group state of one schema."""

    def __init__(self, executor: Executor) -> None:
        self.ex = executor
        self._direct = Direct()

    def upsert_group(self, conn: psycopg.Connection | None, group: str, topic_id: int, *, queue: bool,
                     lock_timeout: float, max_deliveries: int, dead_letter: str | None,
                     ordering: str | None) -> None:
        """Create the group on the topic, or store these settings as its current ones."""
        self.ex.run("share_group_upsert", {
            "group": group, "topic_id": topic_id, "queue": queue,
            "lock_timeout_ms": round(lock_timeout * 1000), "max_deliveries": max_deliveries,
            "dead_letter": dead_letter, "ordering": ordering}, conn=conn)

    def settings(self, group: str, topic_id: int) -> ShareSettings | None:
        """The stored settings of the group on the topic (``None``: no such share group)."""
        row = self.ex.one("share_group_get", (group, topic_id))
        if row is None:
            return None
        return ShareSettings(bool(row[0]), int(row[1]) / 1000, int(row[2]), row[3], row[4])

    def may_use(self, group: str, topic_id: int) -> bool:
        """Whether the current role may use the group on the topic (an admin, or granted ``consume``); the
        rows of the others are invisible to it (row-level security, migration 0012)."""
        row = self.ex.one("share_may_use", (group, topic_id))
        return bool(row and row[0])

    def partitions(self, conn: psycopg.Connection | None, group: str, topic_id: int) -> set[int]:
        """The partitions the group has a frontier on."""
        return {int(r[0]) for r in self.ex.all("share_partitions_of", (group, topic_id), conn=conn)}

    def init_partitions(self, conn: psycopg.Connection | None, group: str, topic_id: int,
                        frontiers: Mapping[int, int]) -> None:
        """Give the group these frontiers where it has none yet."""
        ps = sorted(frontiers)
        self.ex.run("share_partitions_init", {"group": group, "topic_id": topic_id, "partitions": ps,
                                              "positions": [frontiers[p] for p in ps]}, conn=conn)

    def acquire(self, conn: psycopg.Connection, group: str, topic_id: int, partitions: Sequence[int], *,
                owner: str, max_events: int, lock_timeout: float, max_deliveries: int, dead_letter: bool,
                ordered: bool, window: int, expired: bool, turn: int = 0, wait: bool = False,
                expired_window: float | None = None) -> list[AcquiredRow]:
        """Acquire up to ``max_events`` events of ``partitions`` for ``owner``: events due again (with
        ``expired``, also those whose lock expired), then new events past the frontiers, below the read
        fences, in one round trip (see ``share_take_due()`` and ``share_advance``). New events come from
        the first partition with some from the ``turn``-th of ``partitions`` on. ``wait``: wait for a
        consumer advancing that partition now (default: skip such partitions). ``expired_window``: with
        ``expired``, look only at the locks that expired in the last ``expired_window`` seconds (default
        ``None``: all of them; see migration 0026)."""
        params = {
            "group": group, "partitions": list(partitions), "turn": turn, "owner": owner,
            "max": max_events, "lock_ms": round(lock_timeout * 1000), "max_deliveries": max_deliveries,
            "dead_letter": dead_letter, "ordered": ordered, "window": window, "expired": expired,
            "expired_window_ms": None if expired_window is None else max(1, round(expired_window * 1000))}
        if usable(conn):
            return self._acquire_direct(conn, topic_id, params, wait)
        with conn.pipeline(), conn.transaction():
            conn.execute(self.ex.query("share_acquisition_settings"))
            due = None
            if not wait:
                due = conn.cursor(binary=True)
                due.execute(self.ex.query("share_take_due", topic_id), params, prepare=True)
            conn.execute(self.ex.query(fences_query(self.ex.pooler), topic_id), params, prepare=True)
            new = conn.cursor(binary=True)
            new.execute(_advance(self.ex.schema, topic_id, wait), params, prepare=True)
        rows: list[AcquiredRow] = due.fetchall() if due is not None else []
        rows += new.fetchall()
        return rows

    def _acquire_direct(self, conn: psycopg.Connection, topic_id: int, params: dict[str, Any], wait: bool
                        ) -> list[AcquiredRow]:
        """:meth:`acquire`'s statements straight through libpq, in one round trip and one implicit
        transaction (``conn`` idle in autocommit mode)."""
        schema = self.ex.schema
        enc = conn.info.encoding
        steps: list[Step] = [(statement("share_acquisition_settings", schema), (), 0)]
        if not wait:
            due = statement("share_take_due", schema, topic_id)
            steps.append((due, text_params(due, params, enc), 1))
        fences = statement(fences_query(self.ex.pooler), schema, topic_id)
        steps.append((fences, text_params(fences, params, enc), 0))
        adv = _advance_statement(schema, topic_id, wait)
        steps.append((adv, text_params(adv, params, enc), 1))
        results = self._direct.pipeline(conn, steps)
        rows: list[AcquiredRow] = results[1] if not wait else []
        rows += results[-1]
        return rows

    def settle(self, conn: psycopg.Connection, group: str, topic_id: int, owner: str, action: str,
               held: Sequence[Held], *, delay: float = 0.0, lock_timeout: float = 0.0,
               max_deliveries: int = 0, dead_letter: bool = False) -> dict[tuple[int, int], str]:
        """Settle acquisitions of ``owner`` with ``action``; return the outcome code per ``(partition,
        position)`` (see ``share_settle``)."""
        rows = self.ex.all("share_settle", {
            "group": group, "topic_id": topic_id, "owner": owner,
            "partitions": [h[0] for h in held], "positions": [h[1] for h in held],
            "deliveries": [h[2] for h in held], "batches": [h[3] for h in held],
            "action": action, "delay_ms": round(delay * 1000),
            "lock_ms": round(lock_timeout * 1000), "max_deliveries": max_deliveries,
            "dead_letter": dead_letter}, conn=conn, prepare=True)
        return {(int(p), int(pos)): str(o) for p, pos, o in rows}

    def forget(self, conn: psycopg.Connection, group: str, topic_id: int, owner: str,
               events: Sequence[tuple[int, int]]) -> int:
        """Remove ``owner``'s rows of these ``(partition, position)``: events retention removed, counted as
        lost to the group; return how many rows it removed."""
        row = self.ex.one("share_forget", {"group": group, "topic_id": topic_id, "owner": owner,
                                           "partitions": [e[0] for e in events],
                                           "positions": [e[1] for e in events]}, conn=conn)
        return int(row[0]) if row is not None else 0

    def ack_batches(self, conn: psycopg.Connection, group: str, topic_id: int, owner: str,
                    batches: Mapping[tuple[int, int], Sequence[int]]) -> set[tuple[int, int]]:
        """Ack whole batch rows of ``owner``, given as ``(partition, first position) -> every position``;
        return those acked (the others are no longer held as a batch: settle their events one by one)."""
        if usable(conn):
            st = statement("share_ack_batches", self.ex.schema)
            values = _batch_values(conn.info.encoding, group, topic_id, owner, batches)
            [got] = self._direct.pipeline(conn, [(st, [values[n] for n in st.params], 0)])
            return {(int(p), int(pos)) for p, pos in got}
        keys = list(batches)
        rows = self.ex.all("share_ack_batches", {
            "group": group, "topic_id": topic_id, "owner": owner, "partitions": [k[0] for k in keys],
            "firsts": [k[1] for k in keys],
            "batches": ["{" + ",".join(map(str, batches[k])) + "}" for k in keys]}, conn=conn, prepare=True)
        return {(int(p), int(pos)) for p, pos in rows}

    def ack_batches_all(self, conn: psycopg.Connection, group: str, topic_id: int, owner: str,
                        batches: Mapping[tuple[int, int], Sequence[int]], *, commit: bool) -> bool:
        """Ack whole batch rows of ``owner`` all or nothing, in one round trip: in ``conn``'s open
        transaction followed by its ``COMMIT`` (``commit``), or as a transaction of its own (``conn`` idle in
        autocommit mode). ``True``: every row was acked and the acks (with the transaction) committed.
        ``False``: some batch was no longer held, nothing was acked, and ``conn``'s transaction (with
        ``commit``) is left failed for the caller to roll back. Other errors are raised."""
        st = statement("share_ack_batches_all", self.ex.schema)
        values = _batch_values(conn.info.encoding, group, topic_id, owner, batches)
        try:
            self._direct.run_then_commit(conn, st, [values[n] for n in st.params], commit=commit)
        except psycopg.Error as exc:
            if exc.sqlstate == "PSA01":
                return False
            raise
        return True

    def count(self, conn: psycopg.Connection, group: str, topic_id: int, partition: int, *,
              too_often: int = 0, rejected: int = 0, dead_lettered: int = 0) -> None:
        """Add to the group's counters of a partition."""
        self.ex.one("share_count", (group, topic_id, partition, too_often, rejected, dead_lettered),
                    conn=conn)

    def status(self, group: str, topic: str | None = None) -> list[ShareGroupStatus]:
        """The state of share group ``group`` per topic and partition (of one ``topic`` if given)."""
        rows = self.ex.all("share_status", {"group": group, "topic": topic}, row=dict_row)
        out = []
        for r in rows:
            lock = r["oldest_lock"]
            r["oldest_lock"] = None if lock is None else lock.astimezone(timezone.utc)
            for k in ("acquired", "available", "waiting", "delivered_too_often", "removed_too_often",
                      "rejected", "dead_lettered", "lost_events"):
                r[k] = int(r[k] or 0)
            out.append(ShareGroupStatus(**r))
        return out

    def state_rows(self, group: str, topic_id: int, conn: psycopg.Connection | None = None) -> int:
        """How many rows the group keeps for the topic (events in flight, waiting, being dead-lettered)."""
        row = self.ex.one("share_state_rows", (group, topic_id), conn=conn)
        return int(row[0])

    def groups(self) -> list[tuple[str, str, bool]]:
        """Every share group: ``(group, topic, queue)``."""
        return [(r[0], r[1], bool(r[2])) for r in self.ex.all("share_groups_list")]


def _batch_values(enc: str, group: str, topic_id: int, owner: str,
                  batches: Mapping[tuple[int, int], Sequence[int]]) -> dict[str, bytes]:
    """The parameters (text form) of the batch-row acks: ``(partition, first position) -> positions``."""
    keys = list(batches)
    return {
        "group": group.encode(enc), "topic_id": b"%d" % topic_id, "owner": owner.encode(enc),
        "partitions": b"{" + b",".join(b"%d" % k[0] for k in keys) + b"}",
        "firsts": b"{" + b",".join(b"%d" % k[1] for k in keys) + b"}",
        "batches": b"{" + b",".join(
            b'"{' + b",".join(b"%d" % p for p in batches[k]) + b'}"' for k in keys) + b"}"}
