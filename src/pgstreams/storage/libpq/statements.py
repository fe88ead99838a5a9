"""Statements rendered for libpq: ``$n`` placeholders, a prepared-statement name per text, parameters in
text form, and what a connection has prepared."""

from __future__ import annotations

import functools
import hashlib
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import psycopg
from psycopg.adapt import Transformer

from ..executor import core_query

_NAMED = re.compile(rb"%\((\w+)\)s")


@dataclass(frozen=True)
class Statement:
    """A query rendered for libpq: its prepared-statement name, text with ``$n`` placeholders, and the
    names of its parameters in ``$n`` order."""

    name: bytes
    text: bytes
    params: tuple[str, ...]


@functools.lru_cache(maxsize=4096)
def statement(query: str, schema: str, topic_id: int | None = None) -> Statement:
    """Core query ``query`` rendered for ``schema`` (and topic) with ``$n`` placeholders: its ``%s``
    parameters in order, or its ``%(name)s`` parameters numbered in order of first appearance."""
    return statement_of(query, core_query(query, schema, topic_id).as_bytes(None))


def statement_of(name: str, text: bytes) -> Statement:
    """A :class:`Statement` named after ``name`` (and a digest of its text) from a query's text with
    psycopg placeholders (``%s``, or ``%(name)s`` numbered in order of first appearance; ``%%`` is ``%``)."""
    if b"%s" in text:
        parts = text.split(b"%s")
        text = parts[0] + b"".join(b"$%d" % i + part for i, part in enumerate(parts[1:], 1))
        text = text.replace(b"%%", b"%")
        digest = hashlib.sha1(text).hexdigest()[:16]
        return Statement(f"pgstreams_{name}_{digest}".encode(), text, ())
    names: list[str] = []

    def number(m: re.Match[bytes]) -> bytes:
        key = m.group(1).decode()
        if key not in names:
            names.append(key)
        return b"$%d" % (names.index(key) + 1)

    text = _NAMED.sub(number, text).replace(b"%%", b"%")
    digest = hashlib.sha1(text).hexdigest()[:16]
    return Statement(f"pgstreams_{name}_{digest}".encode(), text, tuple(names))


def text_params(st: Statement, values: Mapping[str, Any], encoding: str) -> list[bytes | None]:
    """``values`` of ``st``'s named parameters in ``$n`` order, in text form: ``None`` (NULL), booleans,
    integers, strings and lists of integers."""
    out: list[bytes | None] = []
    for name in st.params:
        v = values[name]
        if v is None:
            out.append(None)
        elif v is True or v is False:
            out.append(b"t" if v else b"f")
        elif isinstance(v, int):
            out.append(b"%d" % v)
        elif isinstance(v, str):
            out.append(v.encode(encoding))
        elif isinstance(v, (list, tuple)):
            out.append(int_array(v))
        else:
            raise TypeError(f"parameter {name!r}: no text form for {type(v).__name__}")
    return out


def int_array(values: Sequence[int]) -> bytes:
    """An integer array parameter in text form."""
    return b"{" + b",".join(b"%d" % v for v in values) + b"}"


#: A step of a pipeline: the statement, its parameters in text form (None: NULL), the result format
#: (0 text, 1 binary).
Step = tuple[Statement, Sequence[bytes | None], int]


#: The wake-up sent after a publish, in a transaction of its own: ``pg_notify(channel, payload)``.
NOTIFY = b"SELECT pg_notify($1, $2)"
#: The SQLSTATE of preparing a statement whose name the connection holds already.
DUPLICATE_PREPARED = b"42P05"


def prepares(conn: psycopg.Connection[Any] | psycopg.AsyncConnection[Any]) -> bool:
    """Whether statements may be prepared by name on ``conn``: unless psycopg's preparation is off on it
    (``prepare_threshold=None``: a connection behind a transaction pooler, see
    :func:`pgstreams.pooler.connection_options`, where a named statement prepared in one transaction may be
    missing in the next, or belong to another client)."""
    return conn.prepare_threshold is not None


class ConnectionStatements:
    """What a connection has prepared, whether it prepares statements by name at all (:func:`prepares`;
    else each runs as an unnamed statement, with the parameter types recorded for it in ``types``), and a
    transformer that loads its rows."""

    __slots__ = ("encoding", "named", "prepared", "transformer", "types")

    def __init__(self, conn: psycopg.Connection[Any] | psycopg.AsyncConnection[Any]) -> None:
        self.encoding = conn.info.encoding
        self.named = prepares(conn)
        self.prepared: set[bytes] = set()
        self.types: dict[bytes, Sequence[int] | None] = {}
        self.transformer = Transformer(conn)

