"""The ports: what the layers above the session need of it, and of a client, as protocols.

The producer, consumers, groups, share groups, maintenance, administration and the worker runtime work
against these, never against :class:`pgstreams.Client`: a :class:`SessionPort` (the pool, the storage
layer, the topic cache, the wake-ups; :class:`pgstreams.session.Session` is one) and, where dead letters
are published, a :class:`Publisher` (:class:`pgstreams.Client` and :class:`pgstreams.ClusterClient` are
ones). Their public constructors take a client, or anything else with a session (:class:`HasSession`; a
session is its own), and keep its ``.session``.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from contextlib import AbstractContextManager
from typing import Any, Protocol, TypeVar

import psycopg

from .models import DEFAULT_SEGMENT_SIZE, PublishResult, TopicInfo
from .storage import Store, TopicRecord
from .storage.notifications import Listener

__all__ = ["HasSession", "Publisher", "SessionPort", "SessionPublisher", "TopicView"]

T = TypeVar("T")


class TopicView(Protocol):
    """A topic as the session caches it: its stored row and the figures copied from it (read once per
    event on hot paths, hence plain attributes)."""

    @property
    def record(self) -> TopicRecord: ...
    @property
    def id(self) -> int: ...
    @property
    def name(self) -> str: ...
    @property
    def partitions(self) -> int: ...


class SessionPort(Protocol):
    """A connection context to one pgstreams schema: pooled and own connections with the retry after a
    lost connection, the storage layer (``store``), the topic cache and the wake-ups of waiting loops."""

    @property
    def session(self) -> SessionPort:
        """The session itself (so that a session is accepted wherever a client is)."""
    @property
    def store(self) -> Store: ...
    @property
    def schema(self) -> str: ...
    @property
    def dsn(self) -> str: ...
    @property
    def poll_interval(self) -> float: ...
    @property
    def listener(self) -> Listener: ...

    def connection(self) -> AbstractContextManager[psycopg.Connection]:
        """Borrow a pooled autocommit connection (not retried)."""
    def raw_connection(self) -> psycopg.Connection:
        """A new autocommit connection outside the pool (the caller closes it)."""
    def run(self, fn: Callable[[psycopg.Connection], T]) -> T:
        """``fn(conn)`` on a pooled connection, run again on a fresh one after a lost connection."""
    def topic_state(self, name: str, *, refresh: bool = False, conn: psycopg.Connection | None = None
                    ) -> TopicView:
        """The cached topic ``name`` (``refresh``: read again); validates the name."""
    def topic_record(self, name: str, *, refresh: bool = False) -> TopicRecord:
        """The stored row of topic ``name``."""
    def forget_topic(self, name: str) -> None:
        """Drop topic ``name`` from the cache (it changed): read again when next used."""


class HasSession(Protocol):
    """Anything with a session: a :class:`pgstreams.Client`, or a session itself."""

    @property
    def session(self) -> SessionPort: ...


class Publisher(Protocol):
    """Publishing and creating topics, as dead-lettering and the replay of dead letters use them."""

    def publish(self, topic: str, value: Any, *, key: str | None = None,
                headers: Mapping[str, str] | None = None, partition: int | None = None,
                event_type: str | None = None, event_id: str | None = None, correlation_id: str | None = None,
                causation_id: str | None = None, conn: psycopg.Connection | None = None) -> PublishResult:
        """Publish one event (see :meth:`pgstreams.Client.publish`)."""
    def create_topic(self, name: str, partitions: int = 1, *, segment_size: int = DEFAULT_SEGMENT_SIZE
                     ) -> TopicInfo:
        """Create topic ``name`` (idempotent; see :meth:`pgstreams.Client.create_topic`)."""


class SessionPublisher(HasSession, Publisher, Protocol):
    """A client as the worker runtime, share groups and the replay of dead letters take it: its session,
    and publishing for their dead letters."""
