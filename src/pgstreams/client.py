"""The client: the public facade of pgstreams over a session.

:class:`Client` publishes (through :mod:`pgstreams.producer`), makes consumers (:mod:`pgstreams.consumer`)
and administers (the mixins of :mod:`pgstreams.admin`: topics, groups, share groups and queues, grants, dead
letters), all over its :class:`pgstreams.session.Session` (``client.session``): the pool, the storage
layer, the topic cache and the wake-ups, which is what the layers below work on.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable, Iterable, Mapping
from contextlib import AbstractContextManager
from typing import Any, TypeVar

import psycopg

from .admin import DeadLetterAdmin, GrantAdmin, GroupAdmin, ShareAdmin, TopicAdmin
from .cdc import Cdc
from .consumer import Consumer, Start, create_checkpoints
from .errors import InvalidArgument, PermissionDenied
from .maintenance import DEFAULT_COMPACTION_BUDGET, DEFAULT_COMPACTION_DUTY, DEFAULT_PURGE_BUDGET, Maintenance
from .models import (
    DEFAULT_SEGMENT_SIZE,
    MaintenanceReport,
    Message,
    PublishResult,
    StatusSnapshot,
)
from .names import check_schema
from .pooler import Pooler, check_listen_dsn, check_pooler
from .producer import MARK_WINDOW, Producer, TopicState
from .reconnect import DEFAULT_RETRY_TIMEOUT
from .session import Session, denied
from .storage import TopicRecord
from .storage.notifications import channel

__all__ = ["DEFAULT_POLL_INTERVAL", "DEFAULT_POOL_SIZE", "DEFAULT_RETRY_TIMEOUT", "DEFAULT_SCHEMA",
           "DEFAULT_SEGMENT_SIZE", "Client", "check_connect_options"]

T = TypeVar("T")

#: The schema holding every pgstreams table unless ``connect(schema=...)`` says otherwise.
DEFAULT_SCHEMA = "pgstreams"
#: Connections per client pool (``connect(pool_size=...)``).
DEFAULT_POOL_SIZE = 10

#: Seconds between fallback polls of a waiting consumer when no notification arrives.
DEFAULT_POLL_INTERVAL = 0.25
#: The reserved header holding a publish delay in seconds (``publish(delay=...)``).
DELAY_HEADER = "pgstreams.delay"
#: Longest publish delay (seconds): a year.
MAX_PUBLISH_DELAY = 365 * 86_400.0


def check_connect_options(schema: object, migrate: object, pool_size: object, poll_interval: object,
                          retry_timeout: object = DEFAULT_RETRY_TIMEOUT, idempotent: object = True) -> None:
    """Validate the options of :func:`pgstreams.connect`, :class:`Client`, :class:`pgstreams.ClusterClient`
    and :func:`pgstreams.aio.connect` before anything is connected (:class:`InvalidArgument` naming the
    option)."""
    check_schema(schema)
    if not isinstance(idempotent, bool):  # idempotent="no" would be truthy
        raise InvalidArgument(f"idempotent must be True or False, not {idempotent!r}")
    if not isinstance(migrate, bool):  # migrate="no" would be truthy and migrate
        raise InvalidArgument(f"migrate must be True or False, not {migrate!r}")
    if isinstance(pool_size, bool) or not isinstance(pool_size, int) or pool_size < 1:
        raise InvalidArgument(f"pool_size must be a positive integer, got {pool_size!r}")
    if (isinstance(poll_interval, bool) or not isinstance(poll_interval, (int, float))
            or not 0 < poll_interval < math.inf):
        raise InvalidArgument(f"poll_interval must be a positive number, got {poll_interval!r}")
    if (isinstance(retry_timeout, bool) or not isinstance(retry_timeout, (int, float))
            or not 0 <= retry_timeout < math.inf):
        raise InvalidArgument(f"retry_timeout must be a number of seconds >= 0, got {retry_timeout!r}")


class Client(TopicAdmin, GroupAdmin, ShareAdmin, GrantAdmin, DeadLetterAdmin):
    """A connection to a pgstreams database. Thread-safe; create one per process. A context manager:
    leaving the ``with`` block closes it.

    Prefer :func:`connect`, which resolves the DSN and validates arguments. The arguments and their
    defaults are those of :func:`connect` (``schema="pgstreams"``, ``migrate=True``, ``pool_size=10``,
    ``poll_interval=0.25``, ``retry_timeout=30``, ``idempotent=True``, ``pooler=None``,
    ``listen_dsn=None``), except that ``dsn`` is required.

    ``session`` is the client's :class:`pgstreams.session.Session`, what consumers, workers and the other
    layers below the client work on; ``store`` is its storage layer of the client's schema
    (:class:`pgstreams.storage.Store`), for pgstreams' own modules and extensions. The administration
    methods come from the mixins of :mod:`pgstreams.admin`.
    """

    def __init__(
        self, dsn: str, *, schema: str = DEFAULT_SCHEMA, migrate: bool = True,
        pool_size: int = DEFAULT_POOL_SIZE, poll_interval: float = DEFAULT_POLL_INTERVAL,
        retry_timeout: float = DEFAULT_RETRY_TIMEOUT, idempotent: bool = True, pooler: Pooler | None = None,
        listen_dsn: str | None = None,
    ) -> None:
        if not isinstance(dsn, str) or not dsn:
            raise InvalidArgument("dsn must be a non-empty string")
        check_connect_options(schema, migrate, pool_size, poll_interval, retry_timeout, idempotent)
        mode = check_pooler(pooler)
        listen = check_listen_dsn(listen_dsn)
        session = Session(dsn, schema=schema, migrate=migrate, pool_size=pool_size,
                          poll_interval=poll_interval, retry_timeout=retry_timeout, state_of=TopicState.of,
                          mark_window=MARK_WINDOW, pooler=mode, listen_dsn=listen)
        self._session = session
        #: the session's storage layer, retry rule and wake-up services, bound once (one hop for callers)
        self.store = session.store
        self.retry = session.retry
        self.notifier = session.notifier
        self.listener = session.listener
        self._producer = Producer(session.store, session.topic_state, session.notifier.poke,
                                  session.notifier.claim, channel(schema), session.raw_connection,
                                  functools.partial(session.run, session.store.events.new_producer_id),
                                  session.retry, forget=session.forget_topic_id, idempotent=idempotent)
        self._closed = False

    # -- plumbing -----------------------------------------------------------------------------------
    @property
    def session(self) -> Session[TopicState]:
        """The client's session (see :mod:`pgstreams.session`)."""
        return self._session

    @property
    def producer_id(self) -> int:
        """This client's producer id (see :mod:`pgstreams.producer`), drawn from the database at its first
        publish (or here), so that a client that only reads or administers draws none."""
        return self._producer.draw()

    @property
    def cdc(self) -> Cdc:
        """Change data capture of this database (:class:`pgstreams.cdc.Cdc`: add, list, describe and remove
        captures, and capture them)."""
        return Cdc(self)

    @property
    def producer(self) -> Producer:
        """The client's :class:`pgstreams.producer.Producer` (its producer tags are shared by the asyncio
        client built over this one)."""
        return self._producer

    @property
    def dsn(self) -> str:
        """The DSN the client connects with (it may hold a password: never print it; see :attr:`server`)."""
        return self._session.dsn

    @property
    def conninfo(self) -> str:
        """The DSN the client's connections are made with: :attr:`dsn` with the TCP keepalive settings
        of :func:`pgstreams.storage.executor.session_conninfo` where it sets none (it may hold a password:
        never print it)."""
        return self._session.conninfo

    @property
    def schema(self) -> str:
        """The schema holding the client's tables."""
        return self._session.schema

    @property
    def server(self) -> str:
        """The server as ``user@host:port/dbname``, never with a password."""
        return self._session.server

    @property
    def pooler(self) -> Pooler:
        """The mode of the connection pooler in front of the server (``"session"`` unless
        ``connect(pooler="transaction")``; see :mod:`pgstreams.pooler`)."""
        return self._session.pooler

    @property
    def poll_interval(self) -> float:
        """Seconds between fallback polls of a waiting consumer when no notification arrives."""
        return self._session.poll_interval

    @property
    def retry_timeout(self) -> float:
        """Seconds a call is retried after a lost connection (0: not retried)."""
        return self._session.retry_timeout

    def raw_connection(self) -> psycopg.Connection:
        """A new autocommit connection of the client's own, outside the pool (the caller closes it)."""
        return self._session.raw_connection()

    def connection(self) -> AbstractContextManager[psycopg.Connection]:
        """Borrow a pooled autocommit connection (for ad-hoc SQL on the same database). Waiting for one
        is bounded by ``retry_timeout``; the body is not retried (see :meth:`run`)."""
        return self._session.connection()

    def run(self, fn: Callable[[psycopg.Connection], T]) -> T:
        """``fn(conn)`` on a pooled autocommit connection; if it fails because the connection broke or the
        server restarted, run again on a fresh one until ``retry_timeout`` passes (then
        :class:`ConnectionLost`). ``fn`` must be safe to run again."""
        return self._session.run(fn)

    def topic_state(self, name: str, *, refresh: bool = False, conn: psycopg.Connection | None = None
                    ) -> TopicState:
        """The client's state of topic ``name`` (its row as last read, segments, round-robin counter),
        read once and cached; ``refresh`` reads the row again. ``conn``: a connection the caller already
        holds (one must not wait for a second pooled one while holding one). Raises
        :class:`TopicNotFound`."""
        return self._session.topic_state(name, refresh=refresh, conn=conn)

    def topic_record(self, name: str, *, refresh: bool = False) -> TopicRecord:
        """The stored row of topic ``name`` (its id names its storage); see :meth:`topic_state`."""
        return self._session.topic_record(name, refresh=refresh)

    def close(self) -> None:
        """Close the producer's connection, the pool and background threads. Idempotent."""
        if self._closed:
            return
        self._closed = True
        self._producer.close()
        self._session.close()

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"<pgstreams.Client server={self.server!r} schema={self.schema!r}>"

    # -- operations ----------------------------------------------------------------------------------
    def maintain(self, *, purge_budget: float | None = DEFAULT_PURGE_BUDGET,
                 compaction_budget: float | None = DEFAULT_COMPACTION_BUDGET,
                 compaction_duty: float = DEFAULT_COMPACTION_DUTY) -> MaintenanceReport:
        """Run one maintenance pass now (see :mod:`pgstreams.maintenance`): segments ahead of publishers and
        their statistics, sealing, retention, compaction of compacted topics, expiry of stale group
        members. Waits for a pass of the schema running elsewhere to end first. Compaction starts segment
        rewrites while the pass is younger than ``compaction_budget`` seconds (default
        :data:`pgstreams.maintenance.DEFAULT_COMPACTION_BUDGET`; at least one per topic; ``None``: every
        segment due; the rest: ``segments_to_compact``), working ``compaction_duty`` of the time (default
        :data:`pgstreams.maintenance.DEFAULT_COMPACTION_DUTY`, 0.5: half the time, pausing between steps;
        1.0: without pauses). Then drops detached segments while the call is younger than ``purge_budget``
        seconds (default :data:`pgstreams.maintenance.DEFAULT_PURGE_BUDGET`; at least one; ``None``: all of
        them); the rest are left to the next call (``segments_to_purge``)."""
        return Maintenance(self._session).run(purge_budget=purge_budget, compaction_budget=compaction_budget,
                                              compaction_duty=compaction_duty)

    def status(self) -> StatusSnapshot:
        """The database-wide status at once: every topic (size, segments, retention), partition (head,
        events stored and published), group's progress per partition (lag in events and seconds,
        checkpoint age, owner) and member (heartbeat age, partitions owned). Costs O(topics + partitions
        + groups + members) index probes and segment statistics, never a scan of the log; what the
        metrics exporter and the web console read."""
        return self.store.status.snapshot()

    # -- publishing ----------------------------------------------------------------------------------
    def publish(
        self,
        topic: str,
        value: Any,
        *,
        key: str | None = None,
        headers: Mapping[str, str] | None = None,
        partition: int | None = None,
        event_type: str | None = None,
        event_id: str | None = None,
        correlation_id: str | None = None,
        causation_id: str | None = None,
        conn: psycopg.Connection | None = None,
        notify: bool = True,
        delay: float | None = None,
    ) -> PublishResult:
        """Publish one event and return where it was stored.

        ``value`` is bytes, str or any JSON-serialisable object; consumers get the same type back (JSON
        values as ``json.loads`` returns them: a tuple comes back as a list, dict keys as strings).
        ``key`` picks the partition with :func:`pgstreams.partitioner.partition_for_key` unless
        ``partition`` is given; with neither, partitions are used round-robin. With ``event_id``,
        publishing is idempotent: if the topic already holds that id nothing is stored and the first
        result is returned (with ``duplicate=True``). With ``conn`` (a psycopg connection), the event
        joins that connection's open transaction and is visible only once the caller commits; until then
        it holds back the readers of its partition (and only of it). ``notify`` (with ``conn`` only,
        default true) sends the consumers' wake-up notification inside that transaction, delivered at
        commit. PostgreSQL refuses to ``PREPARE TRANSACTION`` a transaction that sent one: pass
        ``notify=False`` in two-phase transactions (consumers then find the events by polling, within
        their ``poll_interval``). ``delay`` (seconds, default ``None``: none): share groups do not
        acquire the event before that much time has passed since it was stored; stream groups see it at
        once. It is kept in the reserved header ``pgstreams.delay``. The other keyword arguments default
        to ``None``: no key, headers, event type or ids, a pooled connection in its own transaction.
        """
        if not isinstance(notify, bool):
            raise InvalidArgument(f"notify must be a bool, not {type(notify).__name__}")
        if delay is not None:
            if (isinstance(delay, bool) or not isinstance(delay, (int, float))
                    or not 0 <= delay <= MAX_PUBLISH_DELAY):
                raise InvalidArgument(f"delay must be a number of seconds from 0 to {MAX_PUBLISH_DELAY:g}, "
                                      f"got {delay!r}")
            if headers is not None and not isinstance(headers, Mapping):
                raise InvalidArgument(f"headers must be a mapping of strings, not {type(headers).__name__}")
            headers = {**(headers or {}), DELAY_HEADER: f"{delay:.6f}"}
        try:
            return self._producer.publish(topic, (value, key, headers, partition, event_type, event_id,
                                                  correlation_id, causation_id), conn, notify)
        except psycopg.errors.InsufficientPrivilege as exc:
            raise PermissionDenied(f"permission denied to publish to topic {topic!r} "
                                   f"({(exc.diag.message_primary or '').strip()})") from None

    def publish_many(self, topic: str, events: Iterable[Message | Mapping[str, Any]]) -> int:
        """Publish events in one transaction with COPY: all or none. Returns the number stored.

        ``events`` holds :class:`Message` objects or dicts with the same keys (``value`` required).
        Events whose ``event_id`` the topic already holds (or that repeat one earlier in the batch) are
        not stored and not counted.
        """
        with denied(f"publish to topic {topic!r}"):
            return self._producer.publish_many(topic, events)

    # -- consuming -----------------------------------------------------------------------------------
    def consumer(self, topic: str, group: str, *, start: Start = "earliest") -> Consumer:
        """A :class:`Consumer` of ``topic`` in stream group ``group``.

        ``start`` applies to partitions the group has no checkpoint on yet (they get one now):
        ``"earliest"`` (default, replay everything), ``"latest"`` (only events published from now on) or
        an aware ``datetime`` (events from that time on). Existing checkpoints always win. No event of a
        transaction still in progress is skipped: while one of this database is open, ``"latest"`` and a
        time may also deliver some events committed just before the start. A consumer of some partitions
        only: ``pgstreams.Consumer(client, topic, group, partitions=[...])``.
        """
        with denied(f"consume topic {topic!r} as group {group!r}"):
            reader = create_checkpoints(self._session, topic, group, start=start)
        return Consumer.of(reader)
