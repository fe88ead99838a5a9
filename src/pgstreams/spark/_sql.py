"""Named SQL queries of the Spark data source (``queries.sql`` beside this module), loaded and rendered by
the storage layer's loader with a topic's storage names from :class:`pgstreams.storage.TopicTables`, and
the SQL fragments a chunk query is composed of."""

from __future__ import annotations

import functools
from dataclasses import dataclass

from psycopg import sql

from ..storage import QuerySet, TopicTables

#: The queries of ``queries.sql``.
QUERIES = QuerySet("pgstreams.spark", "queries.sql")


#: The optional columns of a chunk query, in the order of its result columns.
OPTIONAL_COLUMNS = ("key", "event_type", "event_id", "correlation_id", "causation_id", "headers")
#: The byte separating the texts of a delimited column, and the text standing for NULL in one.
DELIMITER, NULL_MARK = 0x01, 0x02
_LENGTH = sql.SQL("int4send(coalesce(octet_length({}), -1))")


@dataclass(frozen=True)
class Layout:
    """How a chunk query returns the optional columns (the rest of its layout is fixed).

    ``delimited`` columns come back as their texts separated by byte 0x01, NULL written as the one-byte
    text 0x02 (no per-row length: the cheapest form, unambiguous unless a text holds 0x01 or is 0x02,
    which the decoder detects); ``by_length`` columns as their bytes back to back with per-row lengths;
    the others not at all. The count of values of every optional column comes back in any case, so a
    chunk holding values in a column not returned is noticed (and queried again with it).
    """

    delimited: tuple[str, ...] = ("key", "event_type")
    by_length: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        for column in (*self.delimited, *self.by_length):
            if column not in OPTIONAL_COLUMNS:
                raise ValueError(f"not an optional column: {column!r}")
        if set(self.delimited) & set(self.by_length):
            raise ValueError("a column is either delimited or by length")

    def with_needs(self, needs: dict[str, str]) -> Layout:
        """This layout with each column of ``needs`` moved to its form there (``delimited`` /
        ``by_length``)."""
        form = {c: "delimited" for c in self.delimited} | {c: "by_length" for c in self.by_length} | needs
        return Layout(tuple(c for c in OPTIONAL_COLUMNS if form.get(c) == "delimited"),
                      tuple(c for c in OPTIONAL_COLUMNS if form.get(c) == "by_length"))


def _column(alias: str, column: str) -> sql.Composable:
    return sql.SQL(".").join([sql.Identifier(alias), sql.Identifier(column)])


def _ref(alias: str, column: str) -> sql.Composable:
    """A column as a chunk query aggregates it (headers as JSON text)."""
    ref = _column(alias, column)
    return sql.Composed([ref, sql.SQL("::text")]) if column == "headers" else ref


def lengths(alias: str, layout: Layout) -> sql.Composable:
    """The per-row lengths expression of a chunk query: value, then the ``by_length`` columns."""
    parts: list[sql.Composable] = [_LENGTH.format(_column(alias, "value"))]
    parts.extend(_LENGTH.format(_ref(alias, c)) for c in layout.by_length)
    return sql.SQL(" || ").join(parts)


def optional(alias: str, layout: Layout) -> sql.Composable:
    """The select list of the optional columns of a chunk query, in the form ``layout`` gives them."""
    parts: list[sql.Composable] = []
    for column in OPTIONAL_COLUMNS:
        ref = _ref(alias, column)
        if column in layout.by_length:
            parts.append(sql.SQL("convert_to(string_agg({}, ''), 'UTF8')").format(ref))
        elif column in layout.delimited:
            parts.append(sql.SQL("convert_to(string_agg(coalesce({}, chr({})), chr({})), 'UTF8')").format(
                ref, sql.Literal(NULL_MARK), sql.Literal(DELIMITER)))
        else:
            parts.append(sql.SQL("NULL::bytea"))
    return sql.SQL(",\n       ").join(parts)


def counts(alias: str) -> sql.Composable:
    """The counts of values of the optional columns of a chunk (int8 big-endian each, in order)."""
    return sql.SQL(" || ").join(sql.SQL("int8send(count({}))").format(_column(alias, c))
                                for c in OPTIONAL_COLUMNS)


#: The start cursors of a multi-partition page scan (``scan_pages``), an array indexed by ``partition + 1``
#: (used only when some partition read does not start at the beginning).
SCAN_LOWER_BOUND = sql.SQL("AND e.position > (%(starts)s::int8[])[e.partition + 1]")


def query(name: str, schema: str) -> sql.Composed:
    """The query ``name`` for ``schema`` (cached)."""
    return QUERIES.get(name, schema)


@functools.lru_cache(maxsize=4096)
def topic_query(name: str, schema: str, topic_id: int) -> sql.Composed:
    """The query ``name`` for ``schema`` and the storage of topic ``topic_id`` (cached)."""
    return QUERIES.render(name, schema, TopicTables(schema, topic_id).identifiers)


def chunk_query(name: str, schema: str, topic_id: int, filters: sql.Composable | None = None,
                layout: Layout | None = None, bounds: sql.Composable | None = None,
                per_event: bool = False) -> sql.Composed:
    """The chunk query ``name`` (``scan_pages`` or ``chunk_ordered``) for ``schema``, the storage of
    ``topic_id``, ``filters`` (a composed SQL fragment of pushed-down conditions, each starting with
    ``AND``), the ``layout`` of the optional columns and, for page scans, the start ``bounds`` and whether
    to return one row per event instead of one per page group. Not cached (fragments are not hashable):
    a reader renders each form it uses once."""
    layout = layout or Layout()
    params: dict[str, sql.Composable] = dict(TopicTables(schema, topic_id).identifiers)
    body = QUERIES.text(name)
    if "{filters}" in body:
        params["filters"] = filters if filters is not None else sql.SQL("")
    if "{bounds}" in body:
        params["bounds"] = bounds if bounds is not None else sql.SQL("")
    alias = "r" if name == "chunk_ordered" else "e"
    if "{lengths}" in body:
        params["lengths"] = lengths(alias, layout)
    if "{optional}" in body:
        params["optional"] = optional(alias, layout)
    if "{per_event}" in body:
        params["per_event"] = sql.SQL("GROUP BY e.ctid" if per_event else "")
    if "{counts}" in body:
        params["counts"] = counts(alias)
    return QUERIES.render(name, schema, params)
