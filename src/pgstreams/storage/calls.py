"""Calls: the statements the sync stores and the asyncio store both run, each written once, without I/O.

A :class:`Call` is one named core query with its parameters and the reading of its result (the first row,
every row, or the number of rows affected). The typed operations of the sync stores
(:class:`~pgstreams.storage.EventStore`, :class:`~pgstreams.storage.CheckpointStore`,
:class:`~pgstreams.storage.TopicStore` and :class:`~pgstreams.storage.Segments`) run theirs with
:func:`perform` on an :class:`~pgstreams.storage.Executor`; the asyncio store
(:class:`pgstreams.storage.asyncstore.AsyncStore`) runs the very same calls with
``AsyncExecutor.perform``. A procedure of several statements with decisions between them (creating a
group's missing checkpoints at a start position) is a generator that yields its calls and receives each
one's result (:data:`Steps`), run by :func:`perform_steps` or ``AsyncExecutor.perform_steps``: the
decisions are written once, and tested without a server by sending the results in.

Why calls instead of generating the sync store from the async one (as ``unasync`` does)? The two sides
differ on purpose where it pays: the sync store sends the topic's row with a single publish in one
round trip and streams ``publish_many``'s rows into its COPY, the asyncio store awaits psycopg's async
connections. What must agree, the statement, its parameters and what its rows mean, is data, and data
is shared most simply as values.

The statements that go straight through libpq on the hot paths (a single publish, ``publish_many``'s
COPY, a poll, a commit) are not calls: the functions that build their inputs and read their outputs are
shared instead (:mod:`pgstreams.storage.events`, :mod:`pgstreams.storage.checkpoints`).
"""

from __future__ import annotations

from collections.abc import Callable, Generator
from typing import Any, Final, Generic, NamedTuple, TypeVar

import psycopg
from psycopg.rows import RowFactory, tuple_row

from .executor import Executor, Params

T = TypeVar("T")

#: What a call reads: the first row (``None`` when there is none), every row, or the number of rows the
#: statement affected.
ONE: Final = 0
ALL: Final = 1
RUN: Final = 2


class Call(NamedTuple, Generic[T]):
    """One named core query: its ``params``, the topic whose storage it names (``topic_id``, ``None``
    for none), what it reads (``fetch``: :data:`ONE`, :data:`ALL` or :data:`RUN`) and ``read``, the value
    made of that (the first row or ``None``, the list of rows, or the row count). ``row`` is the row
    factory (default tuples); ``prepare`` as psycopg's (default: psycopg decides)."""

    query: str
    params: Params
    read: Callable[[Any], T]
    topic_id: int | None = None
    fetch: int = ONE
    row: RowFactory[Any] = tuple_row
    prepare: bool | None = None


#: A procedure of several calls: a generator that yields each call and is sent its result; it returns
#: the procedure's value.
Steps = Generator[Call[Any], Any, T]


def perform(ex: Executor, call: Call[T], conn: psycopg.Connection | None = None) -> T:
    """Run ``call`` with ``ex`` on ``conn`` (default: a pooled connection, retried as the executor's
    calls are) and return its value."""
    if call.fetch == ONE:
        got = ex.one(call.query, call.params, conn=conn, topic_id=call.topic_id, row=call.row,
                     prepare=call.prepare)
    elif call.fetch == ALL:
        got = ex.all(call.query, call.params, conn=conn, topic_id=call.topic_id, row=call.row,
                     prepare=call.prepare)
    else:
        got = ex.run(call.query, call.params, conn=conn, topic_id=call.topic_id, prepare=call.prepare)
    return call.read(got)


def perform_steps(ex: Executor, steps: Steps[T], conn: psycopg.Connection) -> T:
    """Run the procedure ``steps`` with ``ex`` on ``conn``: each call it yields, its result sent back."""
    result: Any = None
    while True:
        try:
            call = steps.send(result)
        except StopIteration as done:
            return done.value
        result = perform(ex, call, conn)


def first_int(row: Any) -> int:
    """The first column of ``row`` as an int, 0 for no row (or a null)."""
    return int(row[0]) if row and row[0] is not None else 0


def first_bool(row: Any) -> bool:
    """The first column of ``row`` as a bool, false for no row."""
    return bool(row and row[0])


def nothing(_: Any) -> None:
    """The value of a call run for its effect."""
    return None


__all__ = ["ALL", "ONE", "RUN", "Call", "Steps", "first_bool", "first_int", "nothing", "perform",
           "perform_steps"]
