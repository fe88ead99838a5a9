"""Decoded changes to events in the form of Debezium's: topic ``PREFIX.schema.table``, key the row's primary
key as JSON, value ``{before, after, source, op, ts_ms}``.

``op`` is ``c`` (insert), ``u`` (update), ``d`` (delete), ``r`` (a row read by a snapshot) or ``t``
(truncate). An update that changes the key is a delete of the old key followed by an insert of the new
one (as Debezium does), so every event of a key stays in the key's partition, in order. ``source`` is
``{lsn, txId, ts_ms, schema, table, snapshot}``: ``lsn`` the source transaction's commit position,
``txId`` its id, ``ts_ms`` its commit time (milliseconds since the Unix epoch), ``snapshot`` true for the
rows of a snapshot. The value's ``ts_ms`` is when the capture made the event. Headers name the source
transaction (:data:`TXID_HEADER`, :data:`LSN_HEADER`).
"""

from __future__ import annotations

import functools
import json
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any, Final

from ..models import Message
from .pgoutput import UNCHANGED, Begin, Column, Delete, Insert, Relation, Tuple, Update
from .values import Converter, TypeMap

#: The value a column of ``after`` has when it is TOASTed and the update did not change it (the server
#: does not send it; ``REPLICA IDENTITY FULL`` makes ``before`` hold it). Never ``null``: that is SQL NULL.
UNCHANGED_TOAST: Final = "__pgstreams_unchanged_toast"
#: The header naming the source transaction's id.
TXID_HEADER: Final = "cdc.txId"
#: The header naming the source transaction's commit position (``pg_lsn`` text).
LSN_HEADER: Final = "cdc.lsn"


#: A key's JSON text: compact, and made by one encoder (``json.dumps`` with options makes one per call).
_KEY_JSON = json.JSONEncoder(separators=(",", ":"), ensure_ascii=False).encode


def topic_name(prefix: str, schema: str, table: str) -> str:
    """The topic of the events of ``schema.table`` in a capture of topic prefix ``prefix``."""
    return f"{prefix}.{schema}.{table}"


@dataclass
class Shape:
    """A captured table as the capture knows it now: its relation (from the last Relation message), topic,
    converters and key columns (the primary key's, else the replica identity's)."""

    relation: Relation
    topic: str
    converters: list[Converter]
    key: tuple[int, ...]
    identity: tuple[int, ...] = field(default=())

    @classmethod
    def of(cls, relation: Relation, prefix: str, types: TypeMap, primary_key: Sequence[str]) -> Shape:
        """The shape of ``relation``: key columns ``primary_key`` if it has one, else those the Relation
        message marks as its replica identity."""
        cols = relation.columns
        types.learn({c.type_oid for c in cols})
        names = [c.name for c in cols]
        identity = tuple(i for i, c in enumerate(cols) if c.key)
        key = tuple(names.index(k) for k in primary_key if k in names) or identity
        return cls(relation, topic_name(prefix, relation.schema, relation.name),
                   [types.converter(c.type_oid) for c in cols], key, identity)

    @property
    def columns(self) -> tuple[Column, ...]:
        """The table's columns."""
        return self.relation.columns

    def row(self, values: Tuple, only: Sequence[int] | None = None) -> dict[str, Any]:
        """A decoded tuple as a JSON object (columns ``only``, by index, when given)."""
        out: dict[str, Any] = {}
        cols, convs = self.relation.columns, self.converters
        for i in (range(len(values)) if only is None else only):
            v = values[i]
            out[cols[i].name] = None if v is None else UNCHANGED_TOAST if v is UNCHANGED else convs[i](v)  # type: ignore[arg-type]
        return out

    def key_of(self, row: dict[str, Any]) -> str:
        """The event key of a row (JSON of its key columns, in their order)."""
        cols = self.relation.columns
        return _KEY_JSON({cols[i].name: row.get(cols[i].name) for i in self.key})


@dataclass(frozen=True)
class Source:
    """The source transaction of events: commit position, id (``None`` for a snapshot's rows), commit time
    (ms)."""

    lsn: int
    txid: int | None
    ts_ms: int

    @classmethod
    def of(cls, begin: Begin) -> Source:
        """The source transaction that ``begin`` starts."""
        return cls(begin.final_lsn, begin.xid, begin.commit_time // 1000)

    @functools.cached_property
    def headers(self) -> dict[str, str]:
        """The headers of its events (made once per transaction)."""
        lsn = f"{self.lsn >> 32:X}/{self.lsn & 0xFFFFFFFF:X}"
        return {TXID_HEADER: "" if self.txid is None else str(self.txid), LSN_HEADER: lsn}


class EventMaker:
    """Makes the events of changes: ``now_ms`` is the clock of the values' ``ts_ms``; with ``tombstones``,
    each delete is followed by a tombstone (the key with a null value: what a compacted topic drops the key
    for)."""

    def __init__(self, now_ms: Callable[[], int], tombstones: bool = False) -> None:
        self.now_ms = now_ms
        self.tombstones = tombstones

    def _event(self, shape: Shape, source: Source, op: str, before: dict[str, Any] | None,
               after: dict[str, Any] | None, key: str | None, snapshot: bool = False,
               partition: int | None = None) -> Message:
        rel = shape.relation
        value = {"before": before, "after": after,
                 "source": {"lsn": source.lsn, "txId": source.txid, "ts_ms": source.ts_ms,
                            "schema": rel.schema, "table": rel.name, "snapshot": snapshot},
                 "op": op, "ts_ms": self.now_ms()}
        return Message(value=value, key=key, partition=partition, headers=source.headers)

    def change(self, shape: Shape, source: Source, change: Insert | Update | Delete) -> Iterator[Message]:
        """The events of one row change (two for an update that changes the key)."""
        if isinstance(change, Insert):
            after = shape.row(change.new)
            yield self._event(shape, source, "c", None, after, shape.key_of(after))
        elif isinstance(change, Update):
            after = shape.row(change.new)
            before = None
            if change.old is not None:
                before = shape.row(change.old, shape.identity if change.old_is_key else None)
            key = shape.key_of(after)
            if before is not None and (old_key := shape.key_of(before)) != key:
                yield self._event(shape, source, "d", before, None, old_key)
                if self.tombstones:
                    yield self._tombstone(source, old_key)
                yield self._event(shape, source, "c", None, after, key)
            else:
                yield self._event(shape, source, "u", before, after, key)
        else:
            before = shape.row(change.old, shape.identity if change.old_is_key else None)
            key = shape.key_of(before)
            yield self._event(shape, source, "d", before, None, key)
            if self.tombstones:
                yield self._tombstone(source, key)

    def _tombstone(self, source: Source, key: str) -> Message:
        return Message(value=None, key=key, headers=source.headers)

    def truncate(self, shape: Shape, source: Source, partitions: int) -> Iterator[Message]:
        """The events of a truncate of ``shape``'s table: one per partition of its topic (each reader of
        a partition learns it in order with the rows' events), without key."""
        for p in range(partitions):
            yield self._event(shape, source, "t", None, None, None, partition=p)

    def snapshot_row(self, shape: Shape, source: Source, values: Tuple) -> Message:
        """The event of a row read by a snapshot (``op: r``)."""
        after = shape.row(values)
        return self._event(shape, source, "r", None, after, shape.key_of(after), snapshot=True)

