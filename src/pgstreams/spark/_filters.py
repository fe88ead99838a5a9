"""Filter pushdown of batch reads: which Spark filters PostgreSQL (or planning) evaluates exactly.

* ``topic`` and ``partition`` (``=``, ``IN``, ``<``, ``<=``, ``>``, ``>=``) choose what is planned at all;
* ``position`` comparisons prune segments and become SQL conditions;
* ``created_at`` comparisons, and ``event_type`` / ``key`` equality or ``IN``, become SQL conditions.

Everything else is left to Spark.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from datetime import datetime, timezone
from typing import Any

from psycopg import sql
from pyspark.sql.datasource import (
    EqualTo,
    Filter,
    GreaterThan,
    GreaterThanOrEqual,
    In,
    LessThan,
    LessThanOrEqual,
)

_OPS = {EqualTo: "=", GreaterThan: ">", GreaterThanOrEqual: ">=", LessThan: "<", LessThanOrEqual: "<="}
_SQL_COLUMNS = {"position": int, "created_at": datetime, "event_type": str, "key": str}


@dataclass
class Pushed:
    """The filters a batch reader took over."""

    topics: set[str] | None = None
    partition_ranges: list[tuple[str, Any]] = field(default_factory=list)
    conditions: list[tuple[str, str, Any]] = field(default_factory=list)

    def keeps_topic(self, name: str) -> bool:
        """Whether the pushed topic filters keep topic ``name``."""
        return self.topics is None or name in self.topics

    def keeps_partition(self, p: int) -> bool:
        """Whether the pushed partition filters keep partition ``p``."""
        return all(_compare(p, op, value) for op, value in self.partition_ranges)

    def position_bounds(self) -> tuple[int, int]:
        """The position range ``[lo, hi)`` the pushed position filters allow."""
        lo, hi = 0, 2**63 - 1
        for col, op, value in self.conditions:
            if col != "position":
                continue
            if op in ("=", ">="):
                lo = max(lo, value)
            if op == ">":
                lo = max(lo, value + 1)
            if op == "=":
                hi = min(hi, value + 1)
            if op == "<":
                hi = min(hi, value)
            if op == "<=":
                hi = min(hi, value + 1)
        return lo, hi

    def sql(self) -> tuple[sql.Composable, dict[str, Any]]:
        """The SQL conditions (each ``AND e.<column> <op> <param>``) and their parameters."""
        parts: list[sql.Composable] = []
        params: dict[str, Any] = {}
        for i, (col, op, value) in enumerate(self.conditions):
            name = f"f{i}"
            column = sql.SQL("e.") + sql.Identifier(col)
            if op == "in":
                parts.append(sql.SQL(" AND {} = ANY({})").format(column, sql.Placeholder(name)))
            else:
                parts.append(sql.SQL(" AND {} {} {}").format(column, sql.SQL(op), sql.Placeholder(name)))
            params[name] = value
        return sql.Composed(parts), params


def _compare(p: int, op: str, value: Any) -> bool:
    if op == "in":
        return p in value
    if op == "=":
        return bool(p == value)
    if op == ">":
        return bool(p > value)
    if op == ">=":
        return bool(p >= value)
    if op == "<":
        return bool(p < value)
    return bool(p <= value)


def _column(f: Filter) -> str | None:
    attr = getattr(f, "attribute", None)
    if not isinstance(attr, tuple) or len(attr) != 1:
        return None
    return str(attr[0])


def _coerce(kind: type, value: Any) -> Any:
    if kind is int:
        return value if isinstance(value, int) and not isinstance(value, bool) else None
    if kind is str:
        return value if isinstance(value, str) else None
    if isinstance(value, datetime):
        return value if value.tzinfo is not None else value.replace(tzinfo=timezone.utc)
    return None


def push(filters: Iterable[Filter], pushed: Pushed) -> list[Filter]:
    """Take over the filters that can be evaluated exactly; return the others (for Spark)."""
    rest: list[Filter] = []
    for f in filters:
        if not _take(f, pushed):
            rest.append(f)
    return rest


def _take(f: Filter, pushed: Pushed) -> bool:
    col = _column(f)
    if col is None:
        return False
    op = "in" if isinstance(f, In) else _OPS.get(type(f))
    if op is None:
        return False
    value = f.value  # type: ignore[attr-defined]
    if col == "topic":
        if op == "=" and isinstance(value, str):
            names = {value}
        elif op == "in" and all(isinstance(v, str) for v in value):
            names = set(value)
        else:
            return False
        pushed.topics = names if pushed.topics is None else pushed.topics & names
        return True
    if col == "partition":
        if op == "in":
            if not all(isinstance(v, int) and not isinstance(v, bool) for v in value):
                return False
            pushed.partition_ranges.append(("in", frozenset(value)))
            return True
        if isinstance(value, int) and not isinstance(value, bool):
            pushed.partition_ranges.append((op, value))
            return True
        return False
    kind = _SQL_COLUMNS.get(col)
    if kind is None:
        return False
    if op == "in":
        if col not in ("event_type", "key"):
            return False
        values = [_coerce(kind, v) for v in value]
        if any(v is None for v in values):
            return False
        pushed.conditions.append((col, "in", values))
        return True
    if col in ("event_type", "key") and op != "=":
        return False
    coerced = _coerce(kind, value)
    if coerced is None:
        return False
    pushed.conditions.append((col, op, coerced))
    return True
