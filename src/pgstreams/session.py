"""The session: one connection context to a pgstreams schema, under the public :class:`pgstreams.Client`.

A :class:`Session` owns the pool, the storage layer (:class:`pgstreams.storage.Store`), the cache of
topics, the notifier and the listener (the wake-up hints), and the retry after a lost connection. The
producer, consumers, groups, share groups, maintenance, administration and the worker runtime work on a
session (through :class:`pgstreams.ports.SessionPort`), never on the client that made it. :func:`denied`
turns PostgreSQL's refusals into :class:`pgstreams.PermissionDenied`.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Generic, TypeVar

import psycopg

from .errors import ClientClosed, ConfigurationError, MigrationError, PermissionDenied, TopicNotFound
from .names import check_topic
from .pooler import DEFAULT_POOLER, Pooler, connection_options, keeps_sessions
from .ports import TopicView
from .reconnect import Reconnect, redact, retriable, server_label
from .storage import CORE, Store, TopicRecord
from .storage.executor import keepalive_conninfo, pools_transactions, session_conninfo, session_setup
from .storage.libpq import CheckedPool
from .storage.libpq.pools import CLOSED
from .storage.notifications import Listener, Notifier

__all__ = ["Session", "denied"]

log = logging.getLogger("pgstreams.session")

T = TypeVar("T")
StateT = TypeVar("StateT", bound=TopicView)


@contextmanager
def denied(action: str) -> Iterator[None]:
    """Turn PostgreSQL's refusal (SQLSTATE 42501) of the block into :class:`PermissionDenied` naming
    ``action`` and PostgreSQL's object."""
    try:
        yield
    except psycopg.errors.InsufficientPrivilege as exc:
        detail = (exc.diag.message_primary or str(exc)).strip()
        raise PermissionDenied(f"permission denied to {action} ({detail})") from None
    except PermissionDenied as exc:
        detail = str(exc).removeprefix("permission denied: ")
        raise PermissionDenied(f"permission denied to {action} ({detail})") from None


class Session(Generic[StateT]):
    """A connection context to schema ``schema`` of the database at ``dsn``. Thread-safe.

    Opening one connects once to check the server and the schema (``migrate``: apply pending migrations;
    else refuse a schema that lacks some with :class:`pgstreams.MigrationError`), then opens a pool of up
    to ``pool_size`` autocommit connections. ``poll_interval`` is how often waiting loops poll when no
    notification arrives, ``retry_timeout`` how long a call is retried after a lost connection (see
    :mod:`pgstreams.reconnect`). ``state_of`` makes the cached state of a topic from its stored row (what
    :meth:`topic_state` returns); ``mark_window`` is how long (seconds) the waits after a consumer marked a
    topic as waited for recheck fast (see :class:`pgstreams.storage.notifications.Listener`). ``pooler``
    (default ``"session"``): the mode of a connection pooler in front of the server (see
    :mod:`pgstreams.pooler`): in ``"transaction"`` mode no connection keeps anything in its server session
    between transactions. ``listen_dsn`` (default ``None``): where the listener's connection goes (the
    server straight, or a pooler in session mode: it only LISTENs); without one it LISTENs on a
    connection like the pool's, or, in ``"transaction"`` mode, not at all (waiting loops poll every
    ``poll_interval``). :class:`pgstreams.Client` makes one with its validated options; :meth:`close`
    closes it.
    """

    def __init__(self, dsn: str, *, schema: str, migrate: bool, pool_size: int, poll_interval: float,
                 retry_timeout: float, state_of: Callable[[TopicRecord], StateT], mark_window: float,
                 pooler: Pooler = DEFAULT_POOLER, listen_dsn: str | None = None) -> None:
        self._dsn = dsn
        self.schema = schema
        #: the mode of the connection pooler in front of the server (:mod:`pgstreams.pooler`)
        self.pooler: Pooler = pooler
        self.poll_interval = float(poll_interval)
        self.retry_timeout = float(retry_timeout)
        #: the server as ``user@host:port/dbname``, never with a password
        self.server = server_label(dsn)
        try:
            probe = psycopg.connect(dsn, connect_timeout=10, **connection_options(pooler))
        except psycopg.Error as exc:
            raise ConfigurationError(
                f"cannot connect to PostgreSQL at {self.server}: {redact(str(exc).strip(), dsn)}") from None
        with probe, denied(f"use schema {schema!r} (see pgstreams grant)"):
            if migrate:
                CORE.migrate(probe, schema)
            else:
                pending = CORE.pending(probe, schema)
                if pending:
                    raise MigrationError(
                        f"schema {schema!r} lacks migrations {pending}: run `pgstreams migrate`")
            if keeps_sessions(pooler) and pools_transactions(probe, schema):
                log.warning("the connection pooler in front of PostgreSQL at %s runs consecutive "
                            "transactions in different server sessions (transaction pooling): connect with "
                            "pooler=\"transaction\" (--pooler transaction), or prepared statements, session "
                            "settings, advisory locks and LISTEN break (docs/operations.md)", self.server)
            self._conninfo = session_conninfo(dsn, probe.pgconn.info, self.retry_timeout)
            self._pool = CheckedPool(
                self._conninfo, min_size=1, max_size=pool_size, kwargs=connection_options(pooler), open=True,
                name="pgstreams",
                configure=session_setup(pooler),
                timeout=max(self.retry_timeout, 1.0),
            )
            #: the retry after a lost connection (:class:`pgstreams.reconnect.Reconnect`)
            self.retry = Reconnect(self._pool, dsn, self.retry_timeout)
            #: the storage layer of the schema
            self.store = Store(self._pool, schema, self.retry, pooler=pooler)
        self._state_of = state_of
        self._topics: dict[str, StateT] = {}
        self._topics_lock = threading.Lock()
        #: the wake-up notifications this session sends after its publishes' commits
        self.notifier = Notifier(self.raw_connection, schema)
        self._listen_conninfo = None if listen_dsn is None else keepalive_conninfo(listen_dsn)
        listen: Callable[[], psycopg.Connection] | None = (
            self._listen_connection if listen_dsn is not None
            else self.raw_connection if keeps_sessions(pooler) else None)
        #: the notifications this session's waiting loops wait for (off behind a transaction pooler without
        #: ``listen_dsn``: they poll)
        self.listener = Listener(listen, schema, self._mark_waiting, fast_window=mark_window,
                                 poll_interval=self.poll_interval)
        self._closed = False
        self._released = False

    def __repr__(self) -> str:
        return f"<pgstreams.Session server={self.server!r} schema={self.schema!r}>"

    @property
    def session(self) -> Session[StateT]:
        """This session: a session is accepted wherever a client is (see
        :class:`pgstreams.ports.HasSession`)."""
        return self

    @property
    def dsn(self) -> str:
        """The DSN the session connects with (it may hold a password: never print it; see :attr:`server`)."""
        return self._dsn

    @property
    def conninfo(self) -> str:
        """The DSN the session's connections are made with: :attr:`dsn` with the TCP keepalive settings
        of :func:`pgstreams.storage.executor.session_conninfo` where it sets none (it may hold a password:
        never print it)."""
        return self._conninfo

    # -- connections ---------------------------------------------------------------------------------
    def raw_connection(self) -> psycopg.Connection:
        """A new autocommit connection of the session's own, outside the pool, made and set up as the
        pool's are (the caller closes it); :class:`pgstreams.ClientClosed` once the session is closed."""
        if self._released:
            raise ClientClosed(CLOSED)
        return self._pool.fresh()

    def _listen_connection(self) -> psycopg.Connection:
        """A new autocommit connection to ``listen_dsn`` (with TCP keepalives where it sets none), for the
        listener only."""
        if self._released:
            raise ClientClosed(CLOSED)
        assert self._listen_conninfo is not None
        return psycopg.connect(self._listen_conninfo, autocommit=True, connect_timeout=10)

    @contextmanager
    def connection(self) -> Iterator[psycopg.Connection]:
        """Borrow a pooled autocommit connection. Waiting for one is bounded by ``retry_timeout``; the body
        is not retried (see :meth:`run`)."""
        try:
            cm = self._pool.connection()
            conn = cm.__enter__()
        except Exception as exc:
            if retriable(exc):
                raise self.retry.lost(exc) from exc
            raise
        try:
            yield conn
        except BaseException as exc:
            if not cm.__exit__(type(exc), exc, exc.__traceback__):
                raise
        else:
            cm.__exit__(None, None, None)

    def run(self, fn: Callable[[psycopg.Connection], T]) -> T:
        """``fn(conn)`` on a pooled autocommit connection; if it fails because the connection broke or the
        server restarted, run again on a fresh one until ``retry_timeout`` passes (then
        :class:`pgstreams.ConnectionLost`). ``fn`` must be safe to run again."""
        with self.retry.run_errors():
            return self.retry.pooled(fn)

    def _mark_waiting(self, topic_id: int, ttl: float) -> None:
        """Mark topic ``topic_id`` as waited for (see :meth:`.Listener.waiting`): on a pooled connection if
        one is free within 0.1 s, not retried (a consumer is about to wait)."""
        with self._pool.connection(timeout=0.1) as c:
            self.store.executor.one("topic_waiting", (topic_id, ttl), conn=c)

    # -- topics --------------------------------------------------------------------------------------
    def topic_state(self, name: str, *, refresh: bool = False, conn: psycopg.Connection | None = None
                    ) -> StateT:
        """The session's state of topic ``name`` (its row as last read, and what ``state_of`` keeps with
        it), read once and cached; ``refresh`` reads the row again. ``conn``: a connection the caller
        already holds (one must not wait for a second pooled one while holding one). Validates ``name``
        (:class:`pgstreams.InvalidName`); raises :class:`TopicNotFound`."""
        if not refresh and type(name) is str:
            state = self._topics.get(name)  # cached names were checked when cached
            if state is not None:
                return state
        check_topic(name)
        record = self.store.topics.get(name, conn)
        if record is None:
            with self._topics_lock:
                self._topics.pop(name, None)
            raise TopicNotFound(f"topic {name!r} does not exist")
        state = self._state_of(record)
        with self._topics_lock:
            self._topics[name] = state
        return state

    def topic_record(self, name: str, *, refresh: bool = False) -> TopicRecord:
        """The stored row of topic ``name`` (its id names its storage); see :meth:`topic_state`."""
        return self.topic_state(name, refresh=refresh).record

    def forget_topic(self, name: str) -> None:
        """Forget the cached state of topic ``name`` (it changed or is gone): read again when next used."""
        with self._topics_lock:
            self._topics.pop(name, None)

    def forget_topic_id(self, topic_id: int) -> None:
        """Forget the cached state of the topic with id ``topic_id`` (its row changed): read again when next
        used."""
        with self._topics_lock:
            for name in [n for n, st in self._topics.items() if st.id == topic_id]:
                del self._topics[name]

    # -- closing -------------------------------------------------------------------------------------
    def close(self) -> None:
        """Stop the notifier (sending what is pending first) and the listener, close the status reads'
        connections and the pool. Idempotent."""
        if self._closed:
            return
        self._closed = True
        self.notifier.stop(5)  # its last notifications may need a connection of its own
        self.listener.stop(5)
        self._released = True  # from here on, no new connection (ClientClosed)
        self.store.status.close()
        self._pool.close()
