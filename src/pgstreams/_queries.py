"""Named SQL queries loaded once from ``sql/queries.sql`` and composed with quoted identifiers."""

from __future__ import annotations

import functools
import re
from importlib import resources

from psycopg import sql

_NAME_RE = re.compile(r"^-- name: (\w+)\s*$", re.MULTILINE)


@functools.cache
def _load() -> dict[str, str]:
    text = (resources.files("pgstreams") / "sql" / "queries.sql").read_text("utf-8")
    parts = _NAME_RE.split(text)
    out: dict[str, str] = {}
    for name, body in zip(parts[1::2], parts[2::2], strict=True):
        out[name] = body.strip().rstrip(";")
    return out


def names() -> list[str]:
    """Names of all queries."""
    return sorted(_load())


@functools.lru_cache(maxsize=4096)
def query(name: str, schema: str, topic_id: int | None = None) -> sql.Composed:
    """The query ``name`` for ``schema`` (and the event table / sequence of ``topic_id``)."""
    body = _load()[name]
    params: dict[str, sql.Composable] = {"schema": sql.Identifier(schema)}
    if topic_id is not None:
        params["table"] = sql.Identifier(schema, f"topic_{int(topic_id)}")
        params["seq"] = sql.Identifier(schema, f"topic_{int(topic_id)}_seq")
    return sql.SQL(body).format(**params)


def seq_name(schema: str, topic_id: int) -> str:
    """The qualified, quoted name of a topic's position sequence, as a ``regclass`` literal value."""
    return f'"{schema}"."topic_{int(topic_id)}_seq"'
