"""The client: connection, topic administration, publishing, consumers and group status.

:class:`Client` is a facade: SQL and storage belong to :mod:`pgstreams.storage`, publishing to
:mod:`pgstreams.producer`, reading to :mod:`pgstreams.consumer`, membership to :mod:`pgstreams.groups`.
"""

from __future__ import annotations

import math
import os
import threading
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from datetime import datetime
from typing import TYPE_CHECKING, Any, TypeVar, overload

import psycopg

from . import topicconfig
from .errors import (
    ConfigurationError,
    InvalidArgument,
    InvalidConfig,
    MigrationError,
    PermissionDenied,
    TopicConflict,
    TopicNotFound,
)
from .maintenance import DEFAULT_PURGE_BUDGET
from .models import (
    DEFAULT_SEGMENT_SIZE,
    CheckpointReset,
    Event,
    GroupInfo,
    GroupPartitionStatus,
    MaintenanceReport,
    Message,
    PublishResult,
    ReplayResult,
    RetentionStatus,
    ShareGroupStatus,
    StatusSnapshot,
    TopicDescription,
    TopicInfo,
)
from .names import check_group, check_partitions, check_schema, check_topic
from .producer import TOPIC_CHECK_INTERVAL, Producer, TopicState
from .reconnect import DEFAULT_RETRY_TIMEOUT, Reconnect, redact, retriable, server_label
from .shares.consumer import SHARE_DEFAULTS, ShareConsumer, ShareOptions
from .shares.consumer import Ordering as ShareOrdering
from .storage import CORE, Store, TopicRecord
from .storage.executor import configure_session, session_conninfo
from .storage.libpq import CheckedPool
from .storage.notifications import Listener, Notifier, channel

if TYPE_CHECKING:
    from .cluster import ClusterClient
    from .consumer import Consumer, Start


__all__ = ["DEFAULT_POLL_INTERVAL", "DEFAULT_POOL_SIZE", "DEFAULT_RETRY_TIMEOUT", "DEFAULT_SCHEMA",
           "DEFAULT_SEGMENT_SIZE", "Client", "connect", "resolve_dsn"]

T = TypeVar("T")

#: The privileges :meth:`Client.grant` gives (see ``0011_roles.sql``).
PRIVILEGES = ("produce", "consume", "admin")


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

#: The schema holding every pgstreams table unless ``connect(schema=...)`` says otherwise.
DEFAULT_SCHEMA = "pgstreams"
#: Connections per client pool (``connect(pool_size=...)``).
DEFAULT_POOL_SIZE = 10
#: Events :meth:`Client.read_events` returns unless told otherwise.
DEFAULT_BROWSE_LIMIT = 20
#: Seconds added to a publisher's reading interval during which a consumer that marked a topic as waited
#: for after a lapse rechecks fast (the reading's round trip; see ``0027_topic_waiters.sql``).
_MARK_MARGIN = 0.2

#: Seconds between fallback polls of a waiting consumer when no notification arrives.
DEFAULT_POLL_INTERVAL = 0.25
#: The reserved header holding a publish delay in seconds (``publish(delay=...)``).
DELAY_HEADER = "pgstreams.delay"
#: Longest publish delay (seconds): a year.
MAX_PUBLISH_DELAY = 365 * 86_400.0

#: libpq's environment variables that name a server (with them, an empty DSN connects there).
LIBPQ_SERVER_VARIABLES = ("PGSERVICE", "PGHOST", "PGHOSTADDR", "PGDATABASE")


def resolve_dsn(dsn: str | None) -> str:
    """The DSN to use: ``dsn``, else ``$PGSTREAMS_DSN``, else libpq's own environment when it names a
    server (``PGSERVICE`` with the service file, ``PGHOST``, ``PGHOSTADDR``, ``PGDATABASE``; the password
    may come from ``PGPASSWORD`` or ``PGPASSFILE``), else the embedded server's."""
    if dsn:
        return dsn
    env = os.environ.get("PGSTREAMS_DSN")
    if env:
        return env
    if any(os.environ.get(v) for v in LIBPQ_SERVER_VARIABLES):
        return " "  # an empty conninfo: libpq reads its environment and service file
    from .embedded import embedded_dsn

    return embedded_dsn()


@overload
def connect(
    dsn: str | None = None, *, schema: str = DEFAULT_SCHEMA, migrate: bool = True,
    pool_size: int = DEFAULT_POOL_SIZE, poll_interval: float = DEFAULT_POLL_INTERVAL,
    retry_timeout: float = DEFAULT_RETRY_TIMEOUT,
) -> Client: ...


@overload
def connect(
    dsn: Sequence[str], *, schema: str = DEFAULT_SCHEMA, migrate: bool = True,
    pool_size: int = DEFAULT_POOL_SIZE, poll_interval: float = DEFAULT_POLL_INTERVAL,
    retry_timeout: float = DEFAULT_RETRY_TIMEOUT,
) -> Client | ClusterClient: ...


def connect(
    dsn: str | Sequence[str] | None = None,
    *,
    schema: str = DEFAULT_SCHEMA,
    migrate: bool = True,
    pool_size: int = DEFAULT_POOL_SIZE,
    poll_interval: float = DEFAULT_POLL_INTERVAL,
    retry_timeout: float = DEFAULT_RETRY_TIMEOUT,
    idempotent: bool = True,
) -> Any:
    """Connect to PostgreSQL and return a :class:`Client` (also usable as a context manager), or, given
    several DSNs, a :class:`pgstreams.ClusterClient` over the shards of a cluster (docs/shards.md).

    ``dsn``: one DSN; a list of DSNs (the shards of a cluster, in its order; a list of one is one
    server); or a string of several separated by commas (see :func:`pgstreams.cluster.split_dsns`;
    typed as a :class:`Client` then: pass a list for precise types). It defaults to ``$PGSTREAMS_DSN``
    (which may hold several, separated by commas), else libpq's environment when it names a server
    (``PGSERVICE``, ``PGHOST``, ...), else an embedded PostgreSQL started on demand (see
    :mod:`pgstreams.embedded`). ``schema`` (default ``"pgstreams"``) holds every table. ``migrate``
    (default true) applies pending migrations. ``pool_size`` (default 10) bounds the connection pool.
    ``poll_interval`` (default 0.25 s) is how often waiting consumers poll when no notification arrives.
    ``retry_timeout`` (default :data:`DEFAULT_RETRY_TIMEOUT`, 30 s; 0 turns retrying off): how long a
    publish, poll, commit or other call keeps being retried on fresh connections after the connection
    broke or the server restarted, before it raises :class:`pgstreams.ConnectionLost` (see
    :mod:`pgstreams.reconnect`).
    ``idempotent`` (default true): publishes are tagged with the client's producer id and number, so that a
    publish retried after its outcome was lost is stored once (see :mod:`pgstreams.producer`); false stores
    no tag and draws no producer id: a publish retried after a connection broke during its commit may then
    be stored twice (events with an ``event_id`` never are). It exists to measure what idempotence costs
    (``python -m bench.idempotence``) and for callers who deduplicate themselves.
    """
    _check_options(schema, migrate, pool_size, poll_interval, retry_timeout)
    _check_idempotent(idempotent)
    options: dict[str, Any] = {"schema": schema, "migrate": migrate, "pool_size": pool_size,
                               "poll_interval": float(poll_interval), "retry_timeout": float(retry_timeout),
                               "idempotent": idempotent}
    if isinstance(dsn, (list, tuple)):
        from .cluster.layout import check_dsns

        dsns = check_dsns(dsn)
        return _cluster_or_client(dsns, options)
    if dsn is not None and not isinstance(dsn, str):
        raise InvalidArgument(f"dsn must be a string or a list of strings, not {type(dsn).__name__}")
    if dsn is not None and not dsn.strip():
        # an empty DSN would silently fall back to $PGSTREAMS_DSN or the embedded server
        raise InvalidArgument("dsn must not be empty (None uses $PGSTREAMS_DSN or the embedded server)")
    resolved = resolve_dsn(dsn)
    if "," in resolved:  # perhaps several DSNs (a cluster), perhaps one of libpq's multi-host DSNs
        from .cluster.layout import check_dsns, split_dsns

        return _cluster_or_client(check_dsns(split_dsns(resolved)), options)
    return Client(resolved, **options)


def _cluster_or_client(dsns: list[str], options: dict[str, Any]) -> Client | ClusterClient:
    """A :class:`Client` for one DSN, a :class:`pgstreams.ClusterClient` for several."""
    if len(dsns) == 1:
        return Client(dsns[0], **options)
    from .cluster import ClusterClient

    return ClusterClient(dsns, **options)


def _check_idempotent(idempotent: object) -> None:
    """Refuse an ``idempotent`` option that is not a bool (``"no"`` would be truthy)."""
    if not isinstance(idempotent, bool):
        raise InvalidArgument(f"idempotent must be True or False, not {idempotent!r}")


def _check_options(schema: object, migrate: object, pool_size: object, poll_interval: object,
                   retry_timeout: object = DEFAULT_RETRY_TIMEOUT) -> None:
    """Validate the options of :func:`connect` and :class:`Client` before anything is connected."""
    check_schema(schema)
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


def topic_definition(name: object, partitions: object, segment_size: object,
                     config: Mapping[str, Any] | None) -> tuple[int, dict[str, Any]]:
    """Validate a topic's definition (the arguments of :meth:`Client.create_topic`); return its segment
    size and configuration as stored (``segment.events`` is the segment size)."""
    check_topic(name)
    check_partitions(partitions)
    if isinstance(segment_size, bool) or not isinstance(segment_size, int) or segment_size < 1000:
        raise InvalidArgument(f"segment_size must be an integer >= 1000, got {segment_size!r}")
    settings = topicconfig.check_config(config)
    if topicconfig.SEGMENT_EVENTS in settings:
        events = int(settings.pop(topicconfig.SEGMENT_EVENTS))
        if segment_size not in (DEFAULT_SEGMENT_SIZE, events):
            raise InvalidConfig(f"segment.events {events} contradicts segment_size {segment_size}")
        segment_size = events
    return segment_size, settings


def check_same_topic(info: TopicInfo, partitions: int, segment_size: int, settings: dict[str, Any] | None,
                     where: str = "") -> None:
    """:class:`TopicConflict` unless the existing topic ``info`` has this definition (``settings``
    ``None``: any configuration). ``where`` is appended to the topic's name in the message."""
    name = f"{info.name!r}{where}"
    if info.partitions != partitions:
        raise TopicConflict(f"topic {name} exists with {info.partitions} partitions, not {partitions}")
    if info.segment_size != segment_size:
        raise TopicConflict(f"topic {name} exists with segment_size {info.segment_size}, not {segment_size}")
    if settings is not None and dict(info.config) != settings:
        raise TopicConflict(f"topic {name} exists with config {dict(info.config)}, not {settings}")


@contextmanager
def _grant_errors(role: str, topic: str | None) -> Iterator[None]:
    """A missing role or topic of a grant as :class:`InvalidArgument` / :class:`TopicNotFound`."""
    try:
        yield
    except psycopg.errors.UndefinedObject:
        raise InvalidArgument(f"role {role!r} does not exist (CREATE ROLE it first)") from None
    except psycopg.errors.NoDataFound:
        raise TopicNotFound(f"topic {topic!r} does not exist") from None


class Client:
    """A connection to a pgstreams database. Thread-safe; create one per process. A context manager:
    leaving the ``with`` block closes it.

    Prefer :func:`connect`, which resolves the DSN and validates arguments. The arguments and their
    defaults are those of :func:`connect` (``schema="pgstreams"``, ``migrate=True``, ``pool_size=10``,
    ``poll_interval=0.25``, ``retry_timeout=30``, ``idempotent=True``), except that ``dsn`` is required.

    ``store`` is the storage layer of the client's schema (:class:`pgstreams.storage.Store`), for
    pgstreams' own modules and extensions.
    """

    def __init__(
        self, dsn: str, *, schema: str = DEFAULT_SCHEMA, migrate: bool = True,
        pool_size: int = DEFAULT_POOL_SIZE, poll_interval: float = DEFAULT_POLL_INTERVAL,
        retry_timeout: float = DEFAULT_RETRY_TIMEOUT, idempotent: bool = True,
    ) -> None:
        if not isinstance(dsn, str) or not dsn:
            raise InvalidArgument("dsn must be a non-empty string")
        _check_options(schema, migrate, pool_size, poll_interval, retry_timeout)
        _check_idempotent(idempotent)
        self._dsn = dsn
        self.schema = schema
        self.poll_interval = float(poll_interval)
        self.retry_timeout = float(retry_timeout)
        #: the server as ``user@host:port/dbname``, never with a password
        self.server = server_label(dsn)
        try:
            probe = psycopg.connect(dsn, autocommit=True, connect_timeout=10)
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
            self._conninfo = session_conninfo(dsn, probe.pgconn.info, self.retry_timeout)
            self._pool = CheckedPool(
                self._conninfo, min_size=1, max_size=pool_size, kwargs={"autocommit": True}, open=True,
                name="pgstreams",
                configure=configure_session,
                timeout=max(self.retry_timeout, 1.0),
            )
            self.retry = Reconnect(self._pool, dsn, self.retry_timeout)
            self.store = Store(self._pool, schema, self.retry)
        self._topics: dict[str, TopicState] = {}
        self._topics_lock = threading.Lock()
        self.notifier = Notifier(self.raw_connection, schema)
        # publishers see a consumer's mark with the topic's row, read at least every TOPIC_CHECK_INTERVAL
        self.listener = Listener(self.raw_connection, schema, self._mark_waiting,
                                 fast_window=TOPIC_CHECK_INTERVAL + _MARK_MARGIN)
        self._producer = Producer(self.store, self.topic_state, self.notifier.poke, self.notifier.claim,
                                  channel(schema), self.raw_connection, self._new_producer_id, self.retry,
                                  forget=self._forget_id, idempotent=idempotent)
        self._closed = False

    # -- plumbing -----------------------------------------------------------------------------------
    @property
    def producer_id(self) -> int:
        """This client's producer id (see :mod:`pgstreams.producer`), drawn from the database at its first
        publish (or here), so that a client that only reads or administers draws none."""
        return self._producer._base >> 32

    @property
    def producer(self) -> Producer:
        """The client's :class:`pgstreams.producer.Producer` (its producer tags are shared by the asyncio
        client built over this one)."""
        return self._producer

    def _mark_waiting(self, topic_id: int, ttl: float) -> None:
        """Mark topic ``topic_id`` as waited for (see :meth:`.Listener.waiting`): on a pooled
        connection if one is free within 0.1 s, not retried (a consumer is about to wait)."""
        with self._pool.connection(timeout=0.1) as c:
            self.store.executor.one("topic_waiting", (topic_id, ttl), conn=c)

    def _new_producer_id(self) -> int:
        return self.run(self.store.events.new_producer_id)

    @property
    def dsn(self) -> str:
        """The DSN the client connects with (it may hold a password: never print it; see :attr:`server`)."""
        return self._dsn

    @property
    def conninfo(self) -> str:
        """The DSN the client's connections are made with: :attr:`dsn` with the TCP keepalive settings
        of :func:`pgstreams.storage.executor.session_conninfo` where it sets none (it may hold a password:
        never print it)."""
        return self._conninfo

    def raw_connection(self) -> psycopg.Connection:
        """A new autocommit connection of the client's own, outside the pool (the caller closes it)."""
        conn = psycopg.connect(self._conninfo, autocommit=True)
        try:
            configure_session(conn)
        except BaseException:
            conn.close()
            raise
        return conn

    @contextmanager
    def connection(self) -> Iterator[psycopg.Connection]:
        """Borrow a pooled autocommit connection (for ad-hoc SQL on the same database). Waiting for one
        is bounded by ``retry_timeout``; the body is not retried (see :meth:`run`)."""
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
        :class:`ConnectionLost`). ``fn`` must be safe to run again."""
        with self.retry.run_errors():
            return self.retry.pooled(fn)

    # -- roles ---------------------------------------------------------------------------------------
    def grant(self, role: str, *, produce: Iterable[str] = (), consume: str | None = None,
              topics: Iterable[str] = (), admin: bool = False) -> None:
        """Grant PostgreSQL role ``role`` (which must exist) the right to publish to the ``produce`` topics,
        to read ``topics`` and store checkpoints, leases and losses as group ``consume`` (and use share group
        ``consume`` of ``topics``: acquire, ack, release, reject, renew), and/or (``admin``)
        to do everything (create, alter and delete topics, reset and delete groups, maintenance). Defaults:
        nothing of each. Enforced by PostgreSQL (grants, row-level security; see docs/security.md), not by
        the client. Needs the admin right itself. All or nothing."""
        for privilege, topic, group in self._grants(role, produce, consume, topics, admin):
            with denied(f"grant {privilege} rights to role {role!r}"), _grant_errors(role, topic):
                self.store.operations.grant(role, privilege, topic, group)

    def revoke(self, role: str, *, produce: Iterable[str] = (), consume: str | None = None,
               topics: Iterable[str] = (), admin: bool = False) -> int:
        """Take back what :meth:`grant` gave (same arguments; ``consume`` without ``topics``: on every
        topic). Returns how many grants were revoked."""
        n = 0
        for privilege, topic, group in self._grants(role, produce, consume, topics, admin, revoking=True):
            with denied(f"revoke {privilege} rights of role {role!r}"), _grant_errors(role, topic):
                n += self.store.operations.revoke(role, privilege, topic, group)
        return n

    @staticmethod
    def _grants(role: object, produce: Iterable[str], consume: object, topics: Iterable[str], admin: object,
                revoking: bool = False) -> list[tuple[str, str | None, str | None]]:
        if not isinstance(role, str) or not 0 < len(role.encode("utf-8", "surrogatepass")) <= 63 or (
                "\x00" in role):
            raise InvalidArgument(f"role must be a PostgreSQL role name (1 to 63 bytes), got {role!r}")
        if not isinstance(admin, bool):
            raise InvalidArgument(f"admin must be True or False, not {admin!r}")
        produce = [produce] if isinstance(produce, str) else list(produce)
        topics = [topics] if isinstance(topics, str) else list(topics)
        for t in produce + topics:
            check_topic(t)
        out: list[tuple[str, str | None, str | None]] = [("produce", t, None) for t in produce]
        if consume is not None:
            check_group(consume)
            if not topics and not revoking:
                raise InvalidArgument("consume needs the topics the group reads (topics=[...] / --topic)")
            out += [("consume", t, str(consume)) for t in topics] or [("consume", None, str(consume))]
        elif topics:
            raise InvalidArgument("topics are the topics of a consume grant: give the group too")
        if admin:
            out.append(("admin", None, None))
        if not out:
            raise InvalidArgument("nothing to grant: give produce topics, a consume group or admin")
        return out

    def close(self) -> None:
        """Close the pool and background threads. Idempotent."""
        if self._closed:
            return
        self._closed = True
        self.notifier.stop(5)  # sends what is pending first
        self.listener.stop(5)
        self._producer.close()
        self.store.status.close()
        self._pool.close()

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"<pgstreams.Client server={self.server!r} schema={self.schema!r}>"

    def topic_state(self, name: str, *, refresh: bool = False, conn: psycopg.Connection | None = None
                    ) -> TopicState:
        """The client's state of topic ``name`` (its row as last read, segments, round-robin counter),
        read once and cached; ``refresh`` reads the row again. ``conn``: a connection the caller already
        holds (one must not wait for a second pooled one while holding one). Raises
        :class:`TopicNotFound`."""
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
        state = TopicState.of(record)
        with self._topics_lock:
            self._topics[name] = state
        return state

    def topic_record(self, name: str, *, refresh: bool = False) -> TopicRecord:
        """The stored row of topic ``name`` (its id names its storage); see :meth:`topic_state`."""
        return self.topic_state(name, refresh=refresh).record

    def _forget(self, name: str) -> None:
        with self._topics_lock:
            self._topics.pop(name, None)

    def _forget_id(self, topic_id: int) -> None:
        """Forget the cached state of the topic with id ``topic_id`` (it changed): read again when next
        used."""
        with self._topics_lock:
            for name in [n for n, st in self._topics.items() if st.id == topic_id]:
                del self._topics[name]

    # -- topics --------------------------------------------------------------------------------------
    def create_topic(
        self, name: str, partitions: int = 1, *, segment_size: int = DEFAULT_SEGMENT_SIZE,
        config: Mapping[str, Any] | None = None,
    ) -> TopicInfo:
        """Create topic ``name`` with ``partitions`` partitions (default 1, at most
        :data:`pgstreams.MAX_PARTITIONS`) and configuration ``config`` (default none: every key has its
        default; keys and defaults in :mod:`pgstreams.topicconfig`, values as ints or strings).

        Idempotent for an identical definition; raises :class:`TopicConflict` if the topic exists with
        another partition count, segment size or (when ``config`` is given) configuration,
        :class:`InvalidName` for a bad name, :class:`InvalidConfig` naming a bad key or value.
        ``segment_size`` (default :data:`pgstreams.DEFAULT_SEGMENT_SIZE` positions; config key
        ``segment.events``) is the storage unit of the topic: retention removes whole segments.
        """
        segment_size, settings = topic_definition(name, partitions, segment_size, config)
        with denied(f"create topic {name!r}"):
            self.store.topics.create(name, partitions, segment_size, settings)
        info = self._info(name)
        check_same_topic(info, partitions, segment_size, settings if config is not None else None)
        return info

    def alter_topic(self, name: str, config: Mapping[str, Any] | None = None, *,
                    partitions: int | None = None, delete_config: Iterable[str] = ()) -> TopicDescription:
        """Change a topic: set the ``config`` keys (default none), reset the ``delete_config`` keys to their
        defaults, and raise the partition count to ``partitions`` (default: unchanged). All or nothing.

        Like Kafka, adding partitions keeps every event where it is, but keys may hash to other partitions
        from now on (per-key order holds only among events published with the same count); every group
        reading the topic starts the new partitions at their first event. Running consumers and workers
        see the new partitions once they are created again; publishers of other processes notice the
        change within :data:`pgstreams.producer.TOPIC_CHECK_INTERVAL` seconds of publishing (see
        :mod:`pgstreams.producer`) and use the new count from then on. Decreasing is refused, as is
        changing ``segment.events``.
        Raises :class:`InvalidConfig` (naming the key), :class:`InvalidArgument`, :class:`TopicNotFound`.
        """
        check_topic(name)
        settings = topicconfig.check_config(config)
        if isinstance(delete_config, str):
            delete_config = [delete_config]
        deleted = list(delete_config)
        for key in deleted:
            if not isinstance(key, str) or key not in topicconfig.TOPIC_CONFIG_DEFAULTS:
                raise InvalidConfig(f"unknown topic config key {key!r}")
            if key in settings:
                raise InvalidConfig(f"{key}: both set and deleted")
        current = self.topic_state(name, refresh=True).record
        for key in (topicconfig.CREATE_ONLY & (set(settings) | set(deleted))):
            if key in deleted or int(settings[key]) != current.segment_size:
                raise InvalidConfig(f"{key} cannot be changed after the topic is created "
                                    f"(it is {current.segment_size})")
            settings.pop(key)
        if partitions is not None:
            check_partitions(partitions)
            if partitions < current.partitions:
                raise InvalidArgument(f"partitions: topic {name!r} has {current.partitions} partitions; "
                                      "decreasing is not possible")
        try:
            with denied(f"alter topic {name!r}"):
                done = self.store.operations.alter_topic(name, settings, deleted, partitions)
        except ValueError as exc:
            raise InvalidArgument(f"partitions: {exc}") from None
        if done is None:
            raise TopicNotFound(f"topic {name!r} does not exist")
        self._forget(name)
        return self.describe_topic(name)

    def maintain(self, *, purge_budget: float | None = DEFAULT_PURGE_BUDGET) -> MaintenanceReport:
        """Run one maintenance pass now (see :mod:`pgstreams.maintenance`): segments ahead of publishers and
        their statistics, sealing, retention, expiry of stale group members. Waits for a pass of the schema
        running elsewhere to end first. Then drops detached segments while the call is younger than
        ``purge_budget`` seconds (default :data:`pgstreams.maintenance.DEFAULT_PURGE_BUDGET`; at least one;
        ``None``: all of them); the rest are left to the next call (``segments_to_purge``)."""
        from .maintenance import Maintenance

        return Maintenance(self).run(purge_budget=purge_budget)

    def retention_status(self, topic: str | None = None) -> list[RetentionStatus]:
        """Per topic (or for ``topic`` only): its retention policy, oldest retained event, size on disk,
        segments, and when retention last ran (the ``retention_status`` view). Raises
        :class:`TopicNotFound` for an unknown ``topic``."""
        if topic is not None:
            check_topic(topic)
        out = self.store.operations.retention_status(topic)
        if topic is not None and not out:
            raise TopicNotFound(f"topic {topic!r} does not exist")
        return out

    def status(self) -> StatusSnapshot:
        """The database-wide status at once: every topic (size, segments, retention), partition (head,
        events stored and published), group's progress per partition (lag in events and seconds,
        checkpoint age, owner) and member (heartbeat age, partitions owned). Costs O(topics + partitions
        + groups + members) index probes and segment statistics, never a scan of the log; what the
        metrics exporter and the web console read."""
        return self.store.status.snapshot()

    def read_events(self, topic: str, partition: int, *, position: int | None = None,
                    at: datetime | None = None, limit: int = DEFAULT_BROWSE_LIMIT) -> list[Event]:
        """Up to ``limit`` (default :data:`DEFAULT_BROWSE_LIMIT`, at most 1000) committed events of one
        partition, in read order, from ``position`` (default: the first) or from the first event
        created at or after ``at`` (an aware datetime), without a group: a look at the log (the web
        console's event browser). Raises :class:`TopicNotFound`, :class:`InvalidArgument` naming a bad
        partition, position, time or limit."""
        from .consumer.reader import events_of

        state = self.topic_state(topic, refresh=True)
        if isinstance(partition, bool) or not isinstance(partition, int) or not (
                0 <= partition < state.partitions):
            raise InvalidArgument(f"partition must be an integer from 0 to {state.partitions - 1} for topic "
                                  f"{state.name!r}, not {partition!r}")
        if position is not None and at is not None:
            raise InvalidArgument("give a position or a time, not both")
        if position is not None and (isinstance(position, bool) or not isinstance(position, int)
                                     or position < 0):
            raise InvalidArgument(f"position must be an integer >= 0, not {position!r}")
        if at is not None and (not isinstance(at, datetime) or at.tzinfo is None or at.utcoffset() is None):
            raise InvalidArgument(f"the time must be a timezone-aware datetime, not {at!r}")
        if isinstance(limit, bool) or not isinstance(limit, int) or not 1 <= limit <= 1000:
            raise InvalidArgument(f"limit must be an integer from 1 to 1000, not {limit!r}")
        start = position or 0
        if at is not None:
            found = self.store.status.position_at(state.id, partition, at)
            if found is None:
                return []
            start = found
        return events_of(state.name, self.store.status.browse(state.id, partition, start, limit))

    def replay_dead_letter(self, dlt_topic: str, partition: int, position: int, *, to: str | None = None
                           ) -> PublishResult:
        """Replay one dead letter (at ``partition`` and ``position`` of ``dlt_topic``) to its original
        topic (or ``to``), as :meth:`replay_dead_letters` replays each: the same key, value, headers
        (without ``dlt.*``, plus ``dlt.replayed_from`` and ``dlt.replayed_at``) and ids, under the event id
        ``replay:<dlt topic>/<partition>/<position>``, so the replay is recorded and happens once (a
        second one, or a later replay of every dead letter, returns the first copy with
        ``duplicate=True``). Raises :class:`InvalidArgument` when there is no event there."""
        from .admin import replay_dead_letter

        return replay_dead_letter(self, dlt_topic, partition, position, to=to)

    def _info(self, name: str) -> TopicInfo:
        record = self.store.topics.get(name)
        if record is None:
            raise TopicNotFound(f"topic {name!r} does not exist")
        return record.info()

    def list_topics(self) -> list[TopicInfo]:
        """All topics, by name."""
        return [r.info() for r in self.store.topics.all()]

    def describe_topic(self, name: str) -> TopicDescription:
        """A topic's definition with, per partition, its event count and head position, and every
        configuration key (``.config``; defaults marked in ``.config_entries``).

        Counting reads the statistics of sealed segments (recorded by maintenance) and counts only the
        segments not sealed yet, so it stays flat as the topic grows while maintenance runs.
        """
        record = self.topic_state(name, refresh=True).record
        return TopicDescription(record.info(), tuple(self.store.topics.partition_figures(record)),
                                topicconfig.effective(record.config, record.segment_size))

    def delete_topic(self, name: str) -> None:
        """Delete a topic, its events and every group checkpoint on it. Raises :class:`TopicNotFound`."""
        check_topic(name)
        with denied(f"delete topic {name!r}"):
            gone = self.store.topics.delete(name)
        if not gone:
            raise TopicNotFound(f"topic {name!r} does not exist")
        self._forget(name)

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
        from .consumer import Consumer, create_checkpoints

        with denied(f"consume topic {topic!r} as group {group!r}"):
            reader = create_checkpoints(self, topic, group, start=start)
        return Consumer.of(reader)

    # -- groups --------------------------------------------------------------------------------------
    def describe_group(self, group: str, topic: str | None = None) -> list[GroupPartitionStatus]:
        """Per topic and partition of ``group``: checkpoint, head and lag (and, for groups run by workers,
        the lease owner, heartbeat and retry state). Raises ``GroupNotFound``."""
        from .errors import GroupNotFound

        check_group(group)
        if topic is not None:
            check_topic(topic)
        out = self.store.groups.status(group, topic)
        if not out:
            raise GroupNotFound(f"group {group!r} has no checkpoints"
                                + (f" on topic {topic!r}" if topic else ""))
        return out

    def list_groups(self) -> list[GroupInfo]:
        """Every group with checkpoints, the topics it reads and its total lag."""
        return self.store.groups.summaries()

    # -- share groups and queues ---------------------------------------------------------------------
    def share_consumer(
        self, topic: str, group: str, *, start: Start = SHARE_DEFAULTS.start,
        lock_timeout: float = SHARE_DEFAULTS.lock_timeout,
        max_deliveries: int = SHARE_DEFAULTS.max_deliveries,
        dead_letter: bool | str = SHARE_DEFAULTS.dead_letter,
        ordering: ShareOrdering = SHARE_DEFAULTS.ordering,
    ) -> ShareConsumer:
        """A :class:`pgstreams.ShareConsumer` of ``topic`` in share group ``group``: any number of them,
        in any processes, share every partition of the topic, each event going to one of them at a time.

        ``start`` (default ``"earliest"``) is where a group new on a partition starts: ``"earliest"``,
        ``"latest"`` or an aware ``datetime`` (like stream groups). ``lock_timeout`` (default 30 s): how
        long an acquired event stays locked. ``max_deliveries`` (default 5): after that many deliveries
        an event goes to the dead-letter topic instead of being delivered again. ``dead_letter`` (default
        ``True``: ``"<topic>.dlt"``, created with the topic's partition count on first use; a topic name;
        ``False``: none, such events are dropped). ``ordering`` (default ``None``: no order; ``"key"``:
        events with the same key are never in flight at once and are delivered in partition order).
        Raises :class:`TopicNotFound` and :class:`InvalidArgument` (nothing is changed then).
        """
        return ShareConsumer(self, topic, group, ShareOptions(
            start=start, lock_timeout=lock_timeout, max_deliveries=max_deliveries, dead_letter=dead_letter,
            ordering=ordering))

    def create_queue(
        self, name: str, partitions: int = 1, *, lock_timeout: float = SHARE_DEFAULTS.lock_timeout,
        max_deliveries: int = SHARE_DEFAULTS.max_deliveries,
        dead_letter: bool | str = SHARE_DEFAULTS.dead_letter,
        ordering: ShareOrdering = SHARE_DEFAULTS.ordering, segment_size: int = DEFAULT_SEGMENT_SIZE,
    ) -> TopicInfo:
        """Create queue ``name``: a topic (``partitions``, default 1; ``segment_size`` as for
        :meth:`create_topic`) with a share group of the same name starting at its beginning, with these
        settings (defaults as for :meth:`share_consumer`). Idempotent; :meth:`queue` returns its
        consumer. Acked events stay in the topic's segments (the log) until retention removes them."""
        ShareConsumer.check(name, name, ShareOptions(lock_timeout=lock_timeout, max_deliveries=max_deliveries,
                                                     dead_letter=dead_letter, ordering=ordering))
        info = self.create_topic(name, partitions, segment_size=segment_size)
        ShareConsumer(self, name, name, ShareOptions(
            lock_timeout=lock_timeout, max_deliveries=max_deliveries, dead_letter=dead_letter,
            ordering=ordering), queue=True)
        return info

    def queue(self, name: str) -> ShareConsumer:
        """The :class:`pgstreams.ShareConsumer` of queue ``name`` (with the settings it was created with).
        Raises :class:`TopicNotFound`, :class:`GroupNotFound` when ``name`` is a topic but no queue, and
        :class:`PermissionDenied` for a role without a consume grant of group ``name`` on it."""
        from .errors import GroupNotFound

        check_topic(name)
        state = self.topic_state(name, refresh=True)
        settings = self.store.shares.settings(name, state.id)
        if settings is None and not self.store.shares.may_use(name, state.id):
            raise PermissionDenied(f"permission denied to use queue {name!r} (see pgstreams grant --consume)")
        if settings is None or not settings.queue:
            raise GroupNotFound(f"{name!r} is a topic, not a queue (create it with create_queue)")
        ordering: ShareOrdering = "key" if settings.ordering == "key" else None
        return ShareConsumer(self, name, name, ShareOptions(
            lock_timeout=settings.lock_timeout, max_deliveries=settings.max_deliveries,
            dead_letter=settings.dead_letter if settings.dead_letter is not None else False,
            ordering=ordering), queue=True)

    def describe_share_group(self, group: str, topic: str | None = None) -> list[ShareGroupStatus]:
        """Per topic and partition of share group ``group`` (of ``topic`` only, if given): where it
        started, acquired, available, waiting and delivered-too-often counts, the oldest lock and the
        dead-letter counters (the ``share_group_status`` view). Raises ``GroupNotFound``."""
        from .errors import GroupNotFound

        check_group(group)
        if topic is not None:
            check_topic(topic)
        out = self.store.shares.status(group, topic)
        if not out:
            where = f" on topic {topic!r}" if topic else ""
            raise GroupNotFound(f"share group {group!r} does not exist{where}")
        return out
    # -- administration ------------------------------------------------------------------------------
    def reset_group(self, group: str, topic: str, *, to_earliest: bool = False, to_latest: bool = False,
                    to_datetime: datetime | None = None, shift_by: int | None = None,
                    to_position: int | None = None, partition: int | None = None, dry_run: bool = False
                    ) -> list[CheckpointReset]:
        """Move the checkpoints of ``group`` on ``topic`` (every partition, or ``partition``), as Kafka's
        ``kafka-consumer-groups --reset-offsets``; exactly one target: ``to_earliest`` (the oldest retained
        event), ``to_latest`` (after every committed event), ``to_datetime`` (the first event at or after
        it; aware), ``shift_by`` (N events forward, or back when negative, within what is retained) or
        ``to_position`` (the next event read is the first at or after it). ``dry_run`` (default false)
        changes nothing. Refused with :class:`GroupActive` while the group has live members on the topic.
        Returns each partition's checkpoint before and after."""
        from .admin import reset_group

        with denied(f"reset group {group!r} on topic {topic!r}"):
            return reset_group(self, group, topic, to_earliest=to_earliest, to_latest=to_latest,
                           to_datetime=to_datetime, shift_by=shift_by, to_position=to_position,
                               partition=partition, dry_run=dry_run)

    def delete_group(self, group: str, topic: str | None = None) -> int:
        """Delete ``group``'s checkpoints, leases, losses and (without ``topic``) configuration, on ``topic``
        only if given. Refused with :class:`GroupActive` while it has live members there. Raises
        ``GroupNotFound`` when it has no checkpoints there. Returns the number of checkpoints deleted."""
        from .admin import delete_group

        with denied(f"delete group {group!r}"):
            return delete_group(self, group, topic)

    def replay_dead_letters(self, dlt_topic: str, *, to: str | None = None, group: str | None = None,
                            where_error_type: str | None = None, dry_run: bool = False,
                            max_events: int | None = None) -> ReplayResult:
        """Publish the dead letters of ``dlt_topic`` back to their original topic (``to``: another one), with
        their original key, value and headers, recording the replay in the header ``dlt.replayed_from``.
        See :func:`pgstreams.admin.replay_dead_letters` for the defaults and how each one is replayed
        exactly once."""
        from .admin import replay_dead_letters

        return replay_dead_letters(self, dlt_topic, to=to, group=group, where_error_type=where_error_type,
                                   dry_run=dry_run, max_events=max_events)
