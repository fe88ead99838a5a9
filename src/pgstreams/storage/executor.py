"""The sync executor: runs the named queries of one schema on pooled (or the caller's) connections.

Typed operations (:mod:`.topics`, :mod:`.events`, :mod:`.checkpoints`, :mod:`.groups`) build on it; an
async executor over an async pool can offer the same methods without touching their callers.
"""

from __future__ import annotations

import functools
import threading
import weakref
from collections.abc import Awaitable, Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any, TypeVar

import psycopg
from psycopg import sql
from psycopg.conninfo import conninfo_to_dict, make_conninfo
from psycopg.rows import RowFactory, tuple_row
from psycopg_pool import ConnectionPool

from ..pooler import DEFAULT_POOLER, Pooler, connection_options, keeps_sessions
from .identity import remember
from .naming import TopicTables
from .queries import QuerySet

if TYPE_CHECKING:
    from ..reconnect import Reconnect

#: The named queries of the core (``pgstreams/storage/sql/queries/*.sql``).
CORE_QUERIES = QuerySet("pgstreams.storage", "sql", "queries")

Params = Sequence[Any] | dict[str, Any] | None
T = TypeVar("T")


@functools.lru_cache(maxsize=4096)
def core_query(name: str, schema: str, topic_id: int | None = None) -> sql.Composed:
    """Core query ``name`` for ``schema`` and, for per-topic queries, the storage of ``topic_id``."""
    if topic_id is None:
        return CORE_QUERIES.get(name, schema)
    return CORE_QUERIES.render(name, schema, TopicTables(schema, topic_id).identifiers)


class Executor:
    """Runs core queries of ``schema`` on connections of ``pool`` (autocommit) or on a connection the
    caller passes (which may be inside the caller's transaction). Without a pool (``None``, for processes
    that hold plain connections, such as Spark tasks) every call must pass its connection. With
    ``retry`` (a :class:`pgstreams.reconnect.Reconnect`), a call on a pooled connection that fails with a
    retriable error runs again on a fresh one (see :mod:`pgstreams.reconnect`). ``pooler`` (default
    ``"session"``): the mode of a connection pooler in front of the server (:mod:`pgstreams.pooler`), which
    decides what the operations may keep in a server session."""

    def __init__(self, pool: ConnectionPool | None, schema: str, retry: Reconnect | None = None, *,
                 pooler: Pooler = DEFAULT_POOLER) -> None:
        self.pool = pool
        self.schema = schema
        self.retry = retry
        self.pooler: Pooler = pooler
        # the settings of each transaction on connections of the callers' own (see configure)
        self._local: weakref.WeakKeyDictionary[psycopg.Connection, dict[str, str]] = (
            weakref.WeakKeyDictionary())
        self._local_lock = threading.Lock()

    def query(self, name: str, topic_id: int | None = None) -> sql.Composed:
        """Core query ``name`` rendered for this schema (and topic)."""
        return core_query(name, self.schema, topic_id)

    def tables(self, topic_id: int) -> TopicTables:
        """The storage names of a topic in this schema."""
        return TopicTables(self.schema, topic_id)

    @contextmanager
    def connection(self, conn: psycopg.Connection | None = None) -> Iterator[psycopg.Connection]:
        """``conn`` if given, else a pooled autocommit connection for the block."""
        if conn is not None:
            yield conn
            return
        if self.pool is None:
            raise RuntimeError("this executor has no pool: pass the connection to use")
        with self.pool.connection() as pooled:
            yield pooled

    def new_connection(self) -> psycopg.Connection:
        """A new autocommit connection outside the pool, made and set up as the pool's are (the pool's
        ``fresh()`` where it has one: :class:`~.libpq.pools.CheckedPool`); the caller closes it."""
        if self.pool is None:
            raise RuntimeError("this executor has no pool: pass the connection to use")
        fresh: Callable[[], psycopg.Connection] | None = getattr(self.pool, "fresh", None)
        if fresh is not None:
            return fresh()
        conn = psycopg.connect(str(self.pool.conninfo), **connection_options(self.pooler))
        setup = session_setup(self.pooler)
        if setup is not None:
            try:
                setup(conn)
            except BaseException:
                conn.close()
                raise
        return conn

    def pooled(self, fn: Callable[[psycopg.Connection], T]) -> T:
        """``fn(conn)`` on a pooled connection; with a retry rule, run again on fresh connections after a
        retriable failure (so ``fn`` must be safe to run again)."""
        if self.retry is not None:
            return self.retry.pooled(fn)
        with self.connection() as c:
            return fn(c)

    # -- settings of a connection ----------------------------------------------------------------------
    def configure(self, conn: psycopg.Connection, settings: Mapping[str, str]) -> None:
        """Give the statements this executor runs on ``conn`` (a connection of the caller's own, such as a
        group member's or a maintenance pass's) ``settings`` (names and values as ``SET`` takes them).
        Straight to the server (or behind a session pooler) session settings of ``conn``, set now in one
        round trip. Behind a transaction pooler, where a session setting would stay with a server session
        that serves other clients (and the next transaction may run on another one), settings of each
        transaction instead: every statement this executor runs on ``conn`` is sent after
        ``set_config(..., true)`` of each, in the same round trip and transaction (a psycopg pipeline)."""
        names, values = list(settings), [str(v) for v in settings.values()]
        if keeps_sessions(self.pooler):
            conn.execute(self.query("apply_settings"), {"local": False, "names": names, "values": values})
            return
        with self._local_lock:
            self._local[conn] = {**self._local.get(conn, {}), **dict(zip(names, values, strict=True))}

    def settings(self, conn: psycopg.Connection) -> dict[str, str]:
        """The settings :meth:`configure` gave the transactions on ``conn`` (behind a transaction pooler;
        empty otherwise: there they are the session's)."""
        return dict(self._local.get(conn, {})) if self._local else {}

    def _cursor(self, c: psycopg.Connection, query: sql.Composed, params: Params, row: RowFactory[Any],
                prepare: bool | None, binary: bool = False) -> psycopg.Cursor[Any]:
        """``query`` run on ``c``: its cursor, with the settings of :meth:`configure` in front behind a
        transaction pooler."""
        local = self._local.get(c) if self._local else None
        cur = c.cursor(row_factory=row, binary=binary)
        if not local:
            return cur.execute(query, params, prepare=prepare)
        with c.pipeline():  # one transaction (one sync): the settings are those of the query's transaction
            c.execute(self.query("apply_settings"),
                      {"local": True, "names": list(local), "values": list(local.values())})
            cur.execute(query, params, prepare=prepare)
        return cur

    def execute(self, conn: psycopg.Connection, query: sql.Composed) -> None:
        """Run ``query`` (rendered already: a segment's DDL) on ``conn`` for its effect, with the settings
        of :meth:`configure`."""
        self._cursor(conn, query, None, tuple_row, None)

    # -- named queries ---------------------------------------------------------------------------------
    def one(self, name: str, params: Params = None, *, conn: psycopg.Connection | None = None,
            topic_id: int | None = None, row: RowFactory[Any] = tuple_row, prepare: bool | None = None
            ) -> Any:
        """The first row of query ``name`` (``None`` when there is none). On a pooled connection (no
        ``conn``) retried as by :meth:`pooled`."""
        query = self.query(name, topic_id)

        def go(c: psycopg.Connection) -> Any:
            return self._cursor(c, query, params, row, prepare).fetchone()

        return go(conn) if conn is not None else self.pooled(go)

    def all(self, name: str, params: Params = None, *, conn: psycopg.Connection | None = None,
            topic_id: int | None = None, row: RowFactory[Any] = tuple_row, prepare: bool | None = None,
            binary: bool = False) -> list[Any]:
        """Every row of query ``name`` (retried as :meth:`one`)."""
        query = self.query(name, topic_id)

        def go(c: psycopg.Connection) -> list[Any]:
            return self._cursor(c, query, params, row, prepare, binary).fetchall()

        return go(conn) if conn is not None else self.pooled(go)

    def run(self, name: str, params: Params = None, *, conn: psycopg.Connection | None = None,
            topic_id: int | None = None, prepare: bool | None = None) -> int:
        """Run query ``name`` for its effect; return the number of rows it affected (retried as
        :meth:`one`)."""
        query = self.query(name, topic_id)

        def go(c: psycopg.Connection) -> int:
            return self._cursor(c, query, params, tuple_row, prepare).rowcount

        return go(conn) if conn is not None else self.pooled(go)


#: The set-up of every connection pgstreams makes, in one round trip: the session settings (JIT off:
#: pgstreams' statements are short, and a generic plan's cost estimate, a poll's over a topic of many
#: segments, can pass ``jit_above_cost``: JIT compilation then cost a poll of 1,000 events 60 to 80 ms, for
#: a read of 1 ms), and the server's process id of the session (see :mod:`.identity`).
SESSION_SETUP = "SELECT set_config('jit', 'off', false), pg_backend_pid()"


def configure_session(conn: psycopg.Connection) -> None:
    """Apply :data:`SESSION_SETUP` to a new autocommit connection (a pool's ``configure`` callback) and
    record the server process it runs on (:func:`.identity.remember`)."""
    row = conn.execute(SESSION_SETUP).fetchone()
    assert row is not None
    remember(conn.pgconn, row[1])


async def configure_session_async(conn: psycopg.AsyncConnection[Any]) -> None:
    """:func:`configure_session` for an async connection."""
    row = await (await conn.execute(SESSION_SETUP)).fetchone()
    assert row is not None
    remember(conn.pgconn, row[1])


def session_setup(pooler: Pooler) -> Callable[[psycopg.Connection], None] | None:
    """How a new connection is set up in mode ``pooler`` (see :mod:`pgstreams.pooler`): by
    :func:`configure_session`, or, behind a transaction pooler, not at all (``None``): a session setting
    would stay on a server session that serves other clients, and the server process of the set-up says
    nothing of the next transaction's (so none is recorded: see :mod:`.identity`)."""
    return configure_session if keeps_sessions(pooler) else None


def session_setup_async(pooler: Pooler) -> Callable[[psycopg.AsyncConnection[Any]], Awaitable[None]] | None:
    """:func:`session_setup` for async connections."""
    return configure_session_async if keeps_sessions(pooler) else None


#: The TCP settings (libpq connection parameters) of the connections a client makes, unless its DSN (or a
#: service file, or the environment) sets them: keepalives, so that the kernel notices a peer gone while a
#: connection is idle or awaits results (first probe after 10 s of silence, then every 5 s, 3 unanswered
#: probes), and ``tcp_user_timeout`` (see :func:`session_conninfo`), so that data the server does not
#: acknowledge ends the connection instead of waiting for the kernel's retransmissions for many minutes.
#: They apply to TCP connections only (libpq ignores them on a Unix socket).
KEEPALIVES = {"keepalives": "1", "keepalives_idle": "10", "keepalives_interval": "5", "keepalives_count": "3"}
#: The least ``tcp_user_timeout`` of a client's connections, in seconds (a shorter ``retry_timeout`` does not
#: shorten it: a brief loss of packets must not end connections).
MIN_USER_TIMEOUT = 10.0


def pools_transactions(conn: psycopg.Connection, schema: str, tries: int = 3) -> bool:
    """Whether ``conn`` (autocommit, idle) is seen to reach PostgreSQL through a pooler in transaction mode:
    the process id given at login names no server process (a pooler stands between) and, of ``tries`` + 1
    transactions in a row, two ran in different server processes. A cheap guess that errs towards "no": a
    pooler that hands the same server session back every time (PgBouncer does while it has one idle) is not
    noticed. Costs one round trip straight to the server, ``tries`` + 1 behind a pooler."""
    query = core_query("server_process", schema)
    row = conn.execute(query).fetchone()
    first = None if row is None else int(row[0])
    if first is None or first == conn.pgconn.backend_pid:
        return False
    for _ in range(tries):
        row = conn.execute(query).fetchone()
        if row is not None and int(row[0]) != first:
            return True
    return False


def keepalive_conninfo(dsn: str) -> str:
    """``dsn`` with the TCP keepalives of :data:`KEEPALIVES` where its text sets none (a connection of the
    listener's, to a ``listen_dsn``: a LISTEN connection cut silently is noticed within a minute)."""
    given = conninfo_to_dict(dsn)
    missing = {k: v for k, v in KEEPALIVES.items() if k not in given}
    return make_conninfo(dsn, **missing) if missing else dsn


def session_conninfo(dsn: str, effective: Sequence[Any], retry_timeout: float) -> str:
    """``dsn`` with :data:`KEEPALIVES` and ``tcp_user_timeout`` (``retry_timeout``, at least
    :data:`MIN_USER_TIMEOUT` seconds) added where the connection options in effect (``effective``: a
    connection's ``pgconn.info``, which shows what the DSN, a service file or the environment set) leave
    them unset. The waits of :mod:`.libpq` give up after ``tcp_user_timeout`` without a sign of the server."""
    given = {o.keyword.decode(): o.val for o in effective}
    wanted = dict(KEEPALIVES, tcp_user_timeout=str(int(max(retry_timeout, MIN_USER_TIMEOUT) * 1000)))
    missing = {k: v for k, v in wanted.items() if k in given and not given[k]}
    return make_conninfo(dsn, **missing) if missing else dsn
