"""Named SQL queries of the Spark data source, loaded once from ``queries.sql`` beside this module."""

from __future__ import annotations

import functools
import re
from importlib import resources

from psycopg import sql

_NAME_RE = re.compile(r"^-- name: (\w+)\s*$", re.MULTILINE)


@functools.cache
def _load() -> dict[str, str]:
    text = (resources.files("pgstreams.spark") / "queries.sql").read_text("utf-8")
    parts = _NAME_RE.split(text)
    return {name: body.strip().rstrip(";") for name, body in zip(parts[1::2], parts[2::2], strict=True)}


#: Columns whose byte lengths a chunk query returns only when they are in use (``value``'s always).
OPTIONAL_COLUMNS = ("key", "event_type", "event_id", "correlation_id", "causation_id", "headers")
_LENGTH = sql.SQL("int4send(coalesce(octet_length({}), -1))")


def lengths(alias: str, columns: tuple[str, ...]) -> sql.Composable:
    """The per-row lengths expression of a chunk query: value, then ``columns`` (of OPTIONAL_COLUMNS)."""
    value = sql.SQL(".").join([sql.Identifier(alias), sql.Identifier("value")])
    parts: list[sql.Composable] = [_LENGTH.format(value)]
    for column in columns:
        if column not in OPTIONAL_COLUMNS:
            raise ValueError(f"not an optional column: {column!r}")
        ref: sql.Composable = sql.SQL(".").join([sql.Identifier(alias), sql.Identifier(column)])
        if column == "headers":
            ref = sql.Composed([ref, sql.SQL("::text")])
        parts.append(_LENGTH.format(ref))
    return sql.SQL(" || ").join(parts)


def optional(alias: str, columns: tuple[str, ...]) -> sql.Composable:
    """The select list of the optional columns of a chunk query: each column's bytes aggregated when it is
    one of ``columns`` (in use), else an empty byte string if the chunk holds a value in it (else NULL)."""
    parts: list[sql.Composable] = []
    for column in OPTIONAL_COLUMNS:
        ref: sql.Composable = sql.SQL(".").join([sql.Identifier(alias), sql.Identifier(column)])
        if column in columns:
            if column == "headers":
                ref = sql.Composed([ref, sql.SQL("::text")])
            parts.append(sql.SQL("convert_to(string_agg({}, ''), 'UTF8')").format(ref))
        else:
            parts.append(sql.SQL("CASE WHEN count({}) > 0 THEN ''::bytea END").format(ref))
    return sql.SQL(",\n       ").join(parts)


#: The cursor conditions of a page chunk, used only when the range is not the whole visible partition.
LOWER_BOUND = sql.SQL("AND (e.xid, e.position) > (%(xid)s::text::xid8, %(position)s)")
UPPER_BOUND = sql.SQL("AND (e.xid, e.position) <= (%(end_xid)s::text::xid8, %(end_position)s)")

#: The conditions of a multi-partition page scan (``scan_pages``): only some topic partitions, and cursors
#: per topic partition (arrays indexed by ``partition + 1``), each used only when needed.
SCAN_PARTITIONS = sql.SQL("AND e.partition = ANY(%(partitions)s::int[])")
SCAN_LOWER_BOUND = sql.SQL("AND (e.xid, e.position) > ((%(xids)s::text[])[e.partition + 1]::xid8, "
                           "(%(positions)s::int8[])[e.partition + 1])")
SCAN_UPPER_BOUND = sql.SQL("AND (e.xid, e.position) <= ((%(end_xids)s::text[])[e.partition + 1]::xid8, "
                           "(%(end_positions)s::int8[])[e.partition + 1])")


def query(name: str, schema: str, topic_id: int | None = None, filters: sql.Composable | None = None,
          columns: tuple[str, ...] = OPTIONAL_COLUMNS, bounds: sql.Composable | None = None) -> sql.Composed:
    """The query ``name`` for ``schema``, the event table and sequence of ``topic_id``, ``filters``
    (a composed SQL fragment of pushed-down conditions, each starting with ``AND``) and, for chunk
    queries, the optional ``columns`` whose lengths are returned and the cursor ``bounds``."""
    params: dict[str, sql.Composable] = {"schema": sql.Identifier(schema)}
    if topic_id is not None:
        params["table"] = sql.Identifier(schema, f"topic_{int(topic_id)}")
        params["seq"] = sql.Identifier(schema, f"topic_{int(topic_id)}_seq")
    body = _load()[name]
    if "{filters}" in body:
        params["filters"] = filters if filters is not None else sql.SQL("")
    if "{bounds}" in body:
        params["bounds"] = bounds if bounds is not None else sql.SQL("")
    alias = "r" if name == "chunk_ordered" else "e"
    if "{lengths}" in body:
        params["lengths"] = lengths(alias, columns)
    if "{optional}" in body:
        params["optional"] = optional(alias, columns)
    return sql.SQL(body).format(**params)


def table_regclass(schema: str, topic_id: int) -> str:
    """The quoted, qualified name of a topic's event table, as a ``regclass`` literal value."""
    return f'"{schema}"."topic_{int(topic_id)}"'
