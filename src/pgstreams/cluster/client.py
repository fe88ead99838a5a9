"""The cluster client: one logical pgstreams over several PostgreSQL servers (shards).

:class:`ClusterClient` is a layer over one :class:`pgstreams.Client` per shard (``client.shards``); the
single-server hot paths are those clients' own. Routing (docs/shards.md): a topic records the number of
shards it was created with (its span, :attr:`ClusterTopic.span`); a key's place among the topic's
``span x partitions`` partitions is Kafka's partitioner over all of them, so its partition on the shard
is :func:`pgstreams.partition_for_key` over the topic's partitions (the same as on a single server) and
its shard is :func:`shard_for_key`. Keyless events are spread over the span's shards in turn.
"""

from __future__ import annotations

import functools
import itertools
import random
import threading
import weakref
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, TypeVar

import psycopg

from ..admin.topics import check_same_topic, topic_definition
from ..client import (
    DEFAULT_POLL_INTERVAL,
    DEFAULT_POOL_SIZE,
    DEFAULT_RETRY_TIMEOUT,
    DEFAULT_SCHEMA,
    Client,
    check_connect_options,
)
from ..consumer import Start
from ..errors import (
    ConfigurationError,
    ConnectionLost,
    GroupNotFound,
    InvalidArgument,
    LayoutMismatch,
    ShardUnavailable,
    TopicConflict,
    TopicNotFound,
)
from ..models import (
    DEFAULT_SEGMENT_SIZE,
    GroupPartitionStatus,
    MaintenanceReport,
    Message,
    PublishResult,
    TopicDescription,
    TopicInfo,
)
from ..names import check_topic
from ..partitioner import murmur2
from ..pooler import Pooler, check_pooler
from .consumer import ClusterConsumer
from .layout import ClusterLayout, check_dsns, check_layout, shard_label

__all__ = ["ClusterClient", "ClusterTopic", "ClusterTopicDescription", "shard_for_key"]

T = TypeVar("T")


@functools.lru_cache(maxsize=16384)
def _key_hash(key: str | bytes) -> int:
    data = key.encode("utf-8") if isinstance(key, str) else bytes(key)
    return murmur2(data) & 0x7FFFFFFF


def shard_for_key(key: str | bytes, partitions: int, span: int) -> int:
    """The shard (0 to ``span - 1``) of ``key`` in a topic of ``partitions`` partitions spread over
    ``span`` shards: ``(toPositive(murmur2(key)) // partitions) % span``. With the partition
    ``toPositive(murmur2(key)) % partitions`` (:func:`pgstreams.partition_for_key`) it is the key's place
    among the ``span x partitions`` partitions of the cluster as Kafka's partitioner picks it
    (``shard x partitions + partition``)."""
    if isinstance(key, str):
        try:
            key.encode("utf-8")
        except UnicodeEncodeError:
            raise InvalidArgument(f"key {key!r} is not valid Unicode (unpaired surrogate)") from None
    elif not isinstance(key, (bytes, bytearray, memoryview)):
        raise InvalidArgument(f"key must be str or bytes, not {type(key).__name__}")
    return (_key_hash(key if isinstance(key, str) else bytes(key)) // partitions) % span


@dataclass(frozen=True)
class ClusterTopic:
    """A topic of a cluster: its ``id`` (the same on every shard), ``partitions`` per shard and ``span``,
    the number of shards it was created with (its events are on shards ``0 .. span - 1``)."""

    name: str
    id: int
    partitions: int
    span: int


@dataclass(frozen=True)
class ClusterTopicDescription:
    """A topic of a cluster: its definition, span and, per shard of its span, the shard's
    :class:`pgstreams.TopicDescription` (per-partition figures)."""

    topic: TopicInfo
    span: int
    shards: tuple[TopicDescription, ...]

    @property
    def name(self) -> str:
        """The topic name."""
        return self.topic.name

    @property
    def events(self) -> int:
        """Events stored over every shard and partition."""
        return sum(p.events for d in self.shards for p in d.partition_info)


class ClusterClient:
    """A client of a cluster of shards (see :mod:`pgstreams.cluster` and docs/shards.md). Thread-safe;
    a context manager. Make one with :func:`pgstreams.connect` given several DSNs.

    Connecting opens one :class:`pgstreams.Client` per shard (``shards``, in the cluster's order, with
    the options of :func:`pgstreams.connect`) and checks the layout the shards record
    (:class:`pgstreams.LayoutMismatch` names a difference; :class:`pgstreams.ShardUnavailable` a shard
    that cannot be reached).
    """

    def __init__(self, dsns: Sequence[str], *, schema: str = DEFAULT_SCHEMA, migrate: bool = True,
                 pool_size: int = DEFAULT_POOL_SIZE, poll_interval: float = DEFAULT_POLL_INTERVAL,
                 retry_timeout: float = DEFAULT_RETRY_TIMEOUT, idempotent: bool = True,
                 pooler: Pooler | None = None) -> None:
        dsns = check_dsns(list(dsns) if not isinstance(dsns, str) else dsns)
        check_connect_options(schema, migrate, pool_size, poll_interval, retry_timeout, idempotent)
        mode = check_pooler(pooler)
        self._dsns = tuple(dsns)
        self.schema = schema
        self.poll_interval = float(poll_interval)
        clients = _open_all(dsns, lambda dsn: Client(dsn, schema=schema, migrate=migrate, pool_size=pool_size,
                                                     poll_interval=float(poll_interval),
                                                     retry_timeout=float(retry_timeout),
                                                     idempotent=idempotent, pooler=mode))
        try:
            self.layout: ClusterLayout = check_layout(dsns, [c.store.cluster.layout() for c in clients])
        except BaseException:
            for c in clients:
                c.close()
            raise
        #: one :class:`pgstreams.Client` per shard, in the cluster's order
        self.shards: tuple[Client, ...] = tuple(clients)
        self._topics: dict[str, ClusterTopic] = {}
        self._lock = threading.Lock()
        self._turn = itertools.count(random.randrange(len(clients)))
        self._executor: ThreadPoolExecutor | None = None
        self._conn_shards: weakref.WeakKeyDictionary[psycopg.Connection, int] = weakref.WeakKeyDictionary()
        self._closed = False

    # -- plumbing -----------------------------------------------------------------------------------
    @property
    def cluster_id(self) -> str:
        """The cluster's id (recorded on every shard by ``pgstreams cluster init``)."""
        return self.layout.cluster_id

    def shard_name(self, shard: int) -> str:
        """``shard N (user@host:port/dbname)``: how messages name shard ``shard`` (no password)."""
        return shard_label(shard, self._dsns[shard])

    @contextmanager
    def on_shard(self, shard: int) -> Iterator[Client]:
        """Shard ``shard``'s client for the block; a connection lost for longer than its
        ``retry_timeout`` is raised as :class:`pgstreams.ShardUnavailable` naming the shard."""
        try:
            yield self.shards[shard]
        except ShardUnavailable:
            raise
        except ConnectionLost as exc:
            raise ShardUnavailable(f"{self.shard_name(shard)} is unavailable: {exc}") from exc

    def each_shard(self, fn: Callable[[Client], T], shards: Sequence[int] | None = None) -> list[T]:
        """``fn(client)`` on every shard (or ``shards``) at once, results in shard order; the first failure
        (in shard order) is raised after every call ended."""
        chosen = list(range(len(self.shards))) if shards is None else list(shards)

        def on(i: int) -> T:
            with self.on_shard(i) as client:
                return fn(client)

        if len(chosen) == 1:
            return [on(chosen[0])]
        futures = [self._pool().submit(on, i) for i in chosen[1:]]
        first_error: BaseException | None = None
        results: list[Any] = []
        try:
            results.append(on(chosen[0]))
        except BaseException as exc:  # noqa: BLE001 - raised below, after the others ended
            first_error = exc
        for f in futures:
            try:
                results.append(f.result())
            except BaseException as exc:  # noqa: BLE001
                first_error = first_error or exc
        if first_error is not None:
            raise first_error
        return results

    def _pool(self) -> ThreadPoolExecutor:
        with self._lock:
            if self._executor is None:
                self._executor = ThreadPoolExecutor(max_workers=max(1, len(self.shards) - 1),
                                                    thread_name_prefix="pgstreams-shard")
            return self._executor

    def close(self) -> None:
        """Close every shard's client and the threads of concurrent calls. Idempotent."""
        if self._closed:
            return
        self._closed = True
        if self._executor is not None:
            self._executor.shutdown(wait=True)
        for client in self.shards:
            client.close()

    def __enter__(self) -> ClusterClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return (f"<pgstreams.ClusterClient cluster={self.cluster_id} shards={len(self.shards)} "
                f"schema={self.schema!r}>")

    # -- topics --------------------------------------------------------------------------------------
    def topic(self, name: str, *, refresh: bool = False) -> ClusterTopic:
        """Topic ``name`` of the cluster (read from shard 0 once and cached; ``refresh`` reads it again).
        Raises :class:`TopicNotFound`, and :class:`TopicConflict` for a topic created on shard 0 without
        the cluster."""
        if not refresh:
            found = self._topics.get(name)
            if found is not None:
                return found
        check_topic(name)
        with self.on_shard(0) as first:
            state = first.topic_state(name, refresh=True)
            span = first.store.cluster.span(name)
        if span is None:
            raise TopicNotFound(f"topic {name!r} does not exist")
        if span[1] is None:
            raise TopicConflict(f"topic {name!r} of {self.shard_name(0)} was created without the cluster "
                                "(by a single-server client): it has no place on the other shards")
        topic = ClusterTopic(name, state.id, state.partitions, span[1])
        with self._lock:
            self._topics[name] = topic
        return topic

    def _forget(self, name: str) -> None:
        with self._lock:
            self._topics.pop(name, None)

    def create_topic(self, name: str, partitions: int = 1, *, segment_size: int = DEFAULT_SEGMENT_SIZE,
                     config: Mapping[str, Any] | None = None) -> TopicInfo:
        """Create topic ``name`` on every shard with the same id, ``partitions`` (per shard), segment size
        and configuration (arguments and defaults as :meth:`pgstreams.Client.create_topic`). Its span is
        the cluster's shard count now. Idempotent for an identical definition, so a creation that stopped
        half-way (a shard unavailable) completes when run again; :class:`TopicConflict` for another one."""
        segment_size, settings = topic_definition(name, partitions, segment_size, config)
        first = self.shards[0]
        with self.on_shard(0), first.connection() as conn, conn.transaction():
            first.store.cluster.lock(conn)  # one cluster topic change at a time: ids are chosen here
            others = range(1, len(self.shards))
            spans = [first.store.cluster.span(name, conn),
                     *self.each_shard(lambda c: c.store.cluster.span(name), others)]
            known = [s for s in spans if s is not None]
            if known:
                topic_id = known[0][0]
                span = known[0][1]
                for i, s in enumerate(spans):
                    if s is not None and (s[0] != topic_id or s[1] is None):
                        raise TopicConflict(
                            f"topic {name!r} on {self.shard_name(i)} " + (
                                f"has id {s[0]}, not {topic_id} as on another shard" if s[0] != topic_id
                                else "was created without the cluster (by a single-server client)"))
                if span is None:  # pragma: no cover - refused above
                    raise TopicConflict(f"topic {name!r} was created without the cluster")
            else:
                topic_id = max([first.store.cluster.next_topic_id(conn),
                                *self.each_shard(lambda c: c.store.cluster.next_topic_id(), others)])
                span = len(self.shards)
            first.store.cluster.create_topic(topic_id, name, partitions, segment_size, settings, span, conn)
            self.each_shard(lambda c: c.store.cluster.create_topic(
                topic_id, name, partitions, segment_size, settings, span), others)
        infos = self.each_shard(lambda c: c.topic_record(name, refresh=True).info())
        for i, info in enumerate(infos):
            check_same_topic(info, partitions, segment_size, settings if config is not None else None,
                             f" on {self.shard_name(i)}")
        self._forget(name)
        return infos[0]

    def alter_topic(self, name: str, config: Mapping[str, Any] | None = None, *,
                    partitions: int | None = None, delete_config: Iterable[str] = ()
                    ) -> ClusterTopicDescription:
        """:meth:`pgstreams.Client.alter_topic` on every shard, one after the other (each all or nothing);
        an alteration that stopped half-way completes when run again (setting what is set already and the
        partition count a shard has already change nothing)."""
        deleted = [delete_config] if isinstance(delete_config, str) else list(delete_config)
        for i in range(len(self.shards)):
            with self.on_shard(i) as client:
                client.alter_topic(name, config, partitions=partitions, delete_config=deleted)
        self._forget(name)
        return self.describe_topic(name)

    def delete_topic(self, name: str) -> None:
        """Delete topic ``name`` on every shard (its events and group states). A deletion that stopped
        half-way completes when run again; :class:`TopicNotFound` only when no shard holds it."""
        check_topic(name)
        found = False
        for i in range(len(self.shards)):
            with self.on_shard(i) as client:
                try:
                    client.delete_topic(name)
                    found = True
                except TopicNotFound:
                    pass
        self._forget(name)
        if not found:
            raise TopicNotFound(f"topic {name!r} does not exist")

    def list_topics(self) -> list[TopicInfo]:
        """Every topic of the cluster (as shard 0 holds them), by name."""
        with self.on_shard(0) as first:
            return first.list_topics()

    def describe_topic(self, name: str) -> ClusterTopicDescription:
        """Topic ``name``: its definition, span and each shard's per-partition figures."""
        topic = self.topic(name, refresh=True)
        descriptions = self.each_shard(lambda c: c.describe_topic(name), range(topic.span))
        return ClusterTopicDescription(descriptions[0].topic, topic.span, tuple(descriptions))

    def maintain(self) -> list[MaintenanceReport]:
        """:meth:`pgstreams.Client.maintain` on every shard at once; the reports in shard order."""
        return self.each_shard(lambda c: c.maintain())

    # -- publishing ----------------------------------------------------------------------------------
    def shard_of(self, conn: psycopg.Connection) -> int:
        """The shard ``conn`` is connected to (read from the layout it records, once per connection).
        Raises :class:`LayoutMismatch` for a connection to a server of no shard of this cluster."""
        shard = self._conn_shards.get(conn)
        if shard is None:
            layout = self.shards[0].store.cluster.layout(conn)
            if layout is None or str(layout.cluster_id) != self.cluster_id:
                raise LayoutMismatch(f"the connection is to no shard of cluster {self.cluster_id}")
            shard = layout.shard
            self._conn_shards[conn] = shard
        return shard

    def _route(self, topic: ClusterTopic, key: str | None, partition: int | None, shard: int | None
               ) -> int:
        if key is not None:
            owner = shard_for_key(key, topic.partitions, topic.span)
            if shard is not None and shard != owner:
                raise InvalidArgument(
                    f"key {key!r} of topic {topic.name!r} belongs to {self.shard_name(owner)}, not to "
                    f"{self.shard_name(shard)}: its events must stay on one shard")
            return owner
        if shard is not None:
            return shard
        if partition is not None:
            raise InvalidArgument("a partition of a cluster's topic is a partition of one shard: give the "
                                  "shard too (shard=...)")
        return next(self._turn) % topic.span

    def publish(
        self, topic: str, value: Any, *, key: str | None = None, headers: Mapping[str, str] | None = None,
        partition: int | None = None, shard: int | None = None, event_type: str | None = None,
        event_id: str | None = None, correlation_id: str | None = None, causation_id: str | None = None,
        conn: psycopg.Connection | None = None, notify: bool = True, delay: float | None = None,
    ) -> PublishResult:
        """Publish one event on the shard its key belongs to (see :func:`shard_for_key`), or, without a key,
        on the topic's shards in turn; the arguments are those of :meth:`pgstreams.Client.publish`, plus
        ``shard`` (default ``None``: chosen so; with ``partition``, the shard of that partition). With
        ``conn`` (a connection to one shard, in the caller's transaction), the event is published on
        that connection's shard: a key that belongs to another shard is refused
        (:class:`InvalidArgument` naming both), as is a ``shard`` that is not the connection's. A shard
        that cannot be reached raises :class:`pgstreams.ShardUnavailable`: the event is never sent to
        another shard."""
        state = self.topic(topic)
        if shard is not None and (isinstance(shard, bool) or not isinstance(shard, int)
                                  or not 0 <= shard < state.span):
            raise InvalidArgument(f"shard must be an integer from 0 to {state.span - 1} for topic "
                                  f"{topic!r}, not {shard!r}")
        if conn is not None:
            own = self.shard_of(conn)
            if shard is not None and shard != own:
                raise InvalidArgument(f"the connection is to {self.shard_name(own)}, not to "
                                      f"{self.shard_name(shard)}")
            if own >= state.span:
                raise InvalidArgument(f"topic {topic!r} spans shards 0 to {state.span - 1}: the connection "
                                      f"is to {self.shard_name(own)}")
            shard = own
        target = self._route(state, key, partition, shard)
        with self.on_shard(target) as client:
            result = client.publish(topic, value, key=key, headers=headers, partition=partition,
                                    event_type=event_type, event_id=event_id, correlation_id=correlation_id,
                                    causation_id=causation_id, conn=conn, notify=notify, delay=delay)
        return PublishResult(result.topic, result.partition, result.position, result.duplicate, target)

    def publish_many(self, topic: str, events: Iterable[Message | Mapping[str, Any]]) -> int:
        """Publish events, each on its key's shard (keyless ones spread over the topic's shards), with
        one COPY per shard, the shards at once. Each shard's part is stored all or none (as
        :meth:`pgstreams.Client.publish_many`); a shard that fails does not undo the others' parts, so
        publish with event ids to retry a batch safely. Returns the number stored."""
        state = self.topic(topic)
        span = state.span
        if span == 1:
            with self.on_shard(0) as client:
                return client.publish_many(topic, events)
        parts: list[list[Message | Mapping[str, Any]]] = [[] for _ in range(span)]
        partitions = state.partitions
        turn = next(self._turn)
        for event in events:
            key = event.key if isinstance(event, Message) else (
                event.get("key") if isinstance(event, Mapping) else None)
            if key is None:
                parts[turn % span].append(event)
                turn += 1
            elif type(key) is str:
                parts[(_key_hash(key) // partitions) % span].append(event)
            else:
                parts[shard_for_key(key, partitions, span)].append(event)
        used = [i for i in range(span) if parts[i]]
        if not used:
            return 0
        by_client = {id(self.shards[i]): parts[i] for i in used}
        return sum(self.each_shard(lambda c: c.publish_many(topic, by_client[id(c)]), used))

    # -- groups --------------------------------------------------------------------------------------
    def describe_group(self, group: str, topic: str | None = None) -> dict[int, list[GroupPartitionStatus]]:
        """:meth:`pgstreams.Client.describe_group` on every shard at once: per shard holding checkpoints of
        ``group`` (on ``topic`` only, if given), its partitions' checkpoint, head, lag and lease owner.
        Raises ``GroupNotFound`` when no shard has any."""
        def one(client: Client) -> list[GroupPartitionStatus]:
            try:
                return client.describe_group(group, topic)
            except GroupNotFound:
                return []

        found = {i: rows for i, rows in enumerate(self.each_shard(one)) if rows}
        if not found:
            raise GroupNotFound(f"group {group!r} has no checkpoints on any shard"
                                + (f" on topic {topic!r}" if topic else ""))
        return found

    # -- consuming -----------------------------------------------------------------------------------
    def consumer(self, topic: str, group: str, *, start: Start = "earliest") -> ClusterConsumer:
        """A :class:`pgstreams.cluster.ClusterConsumer` of ``topic`` in stream group ``group``: it reads
        every (shard, partition) of the topic; each shard keeps the group's checkpoints of its partitions.
        ``start`` is as for :meth:`pgstreams.Client.consumer` (default ``"earliest"``)."""
        return ClusterConsumer(self, topic, group, start=start)


def _open_all(dsns: Sequence[str], open_one: Callable[[str], Client]) -> list[Client]:
    """One client per DSN, opened at once; on any failure the others are closed and the first failure
    (in shard order) is raised, a server that cannot be reached as :class:`ShardUnavailable`."""
    results: list[Client | BaseException] = []

    def opener(i: int, dsn: str) -> Client:
        try:
            return open_one(dsn)
        except ConfigurationError as exc:
            if "cannot connect" in str(exc):
                raise ShardUnavailable(f"{shard_label(i, dsn)}: {exc}") from None
            raise

    with ThreadPoolExecutor(max_workers=len(dsns), thread_name_prefix="pgstreams-shard") as pool:
        futures = [pool.submit(opener, i, dsn) for i, dsn in enumerate(dsns)]
        for f in futures:
            try:
                results.append(f.result())
            except BaseException as exc:  # noqa: BLE001 - raised below once every client is closed
                results.append(exc)
    failures = [r for r in results if isinstance(r, BaseException)]
    if failures:
        for r in results:
            if isinstance(r, Client):
                r.close()
        raise failures[0]
    return [r for r in results if isinstance(r, Client)]
