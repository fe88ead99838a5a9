"""The cluster layout: which servers are the shards of a cluster, in which order.

Every shard records the cluster id, its own place and the names of all shards (``0015_cluster.sql``).
:func:`init_cluster` writes that record (``pgstreams cluster init``), :func:`check_layout` compares it
with the servers a client was given (at connect), :func:`split_dsns` reads a comma-separated list of
DSNs (``PGSTREAMS_DSN``).
"""

from __future__ import annotations

import random
import re
import uuid
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass
from datetime import datetime, timezone
from typing import TypeVar

import psycopg
from psycopg.conninfo import conninfo_to_dict

from ..errors import ConfigurationError, InvalidArgument, LayoutMismatch, ShardUnavailable
from ..names import check_schema
from ..reconnect import redact, server_label
from ..storage import CORE, ShardLayout, Store

__all__ = ["ClusterDescription", "ClusterInit", "ClusterLayout", "ShardDescription", "check_dsns",
           "check_layout", "describe_cluster", "init_cluster", "read_layouts", "shard_label", "split_dsns"]

T = TypeVar("T")

#: The migration that brings the cluster's tables (``0015_cluster.sql``).
CLUSTER_MIGRATION = 15

#: A comma that starts the next DSN of a list: one followed by a URI scheme or a ``keyword=``. Commas
#: inside one DSN (libpq's multi-host ``host=a,b`` and ``postgresql://a,b/db``) are not followed by one.
_NEXT_DSN = re.compile(r",\s*(?=postgres(?:ql)?://|[A-Za-z_][A-Za-z0-9_]*\s*=)")


def split_dsns(text: str) -> list[str]:
    """The DSNs of a comma-separated list (``PGSTREAMS_DSN``). A comma separates two DSNs when what
    follows it starts a DSN (``postgresql://``, ``postgres://`` or ``keyword=``), so libpq's multi-host
    lists (``host=a,b``, ``postgresql://a,b/db``) stay one DSN. A single DSN gives a list of one."""
    return [part.strip() for part in _NEXT_DSN.split(text) if part.strip()]


def check_dsns(dsns: object) -> list[str]:
    """Validate a list of shard DSNs: non-empty strings that libpq can parse (a usage error names the
    bad one by its place, never printing a password)."""
    if isinstance(dsns, str) or not isinstance(dsns, Sequence):
        raise InvalidArgument(f"the shards must be a list of DSNs, not {type(dsns).__name__}")
    out: list[str] = []
    for i, dsn in enumerate(dsns):
        if not isinstance(dsn, str) or not dsn.strip():
            raise InvalidArgument(f"shard {i}: a DSN must be a non-empty string, not {dsn!r}"
                                  if not isinstance(dsn, str) else f"shard {i}: the DSN is empty")
        try:
            conninfo_to_dict(dsn)
        except psycopg.Error as exc:
            raise InvalidArgument(f"shard {i}: invalid DSN: {redact(str(exc), dsn)}") from None
        out.append(dsn)
    if not out:
        raise InvalidArgument("a cluster needs at least one shard DSN")
    return out


def shard_label(index: int, dsn: str) -> str:
    """``shard N (user@host:port/dbname)``: how errors name a shard (never with its password)."""
    return f"shard {index} ({server_label(dsn)})"


@dataclass(frozen=True)
class ClusterLayout:
    """A cluster's layout as its shards record it: the ``cluster_id``, the shards' names in order
    (``user@host:port/dbname`` as given to ``pgstreams cluster init``, never a password) and when it was
    created (aware, UTC)."""

    cluster_id: str
    shards: tuple[str, ...]
    created_at: datetime


@dataclass(frozen=True)
class ClusterInit:
    """What :func:`init_cluster` did: ``"created"`` (a new cluster), ``"extended"`` (shards added to an
    existing one; ``added`` names their places) or ``"unchanged"`` (the cluster was already so), and
    the resulting ``layout``."""

    action: str
    layout: ClusterLayout
    added: tuple[int, ...] = ()


@dataclass(frozen=True)
class ShardDescription:
    """One shard of a cluster: its place, its server (``user@host:port/dbname``) and how many topics it
    holds (their spans: ``spans``, topic name -> span)."""

    shard: int
    server: str
    topics: int
    spans: tuple[tuple[str, int | None], ...] = ()


@dataclass(frozen=True)
class ClusterDescription:
    """:func:`describe_cluster`: the layout and each shard."""

    layout: ClusterLayout
    shards: tuple[ShardDescription, ...]


def _parallel(fns: Sequence[Callable[[], T]]) -> list[T]:
    """Run ``fns`` at once (one thread each) and return their results in order; the first failure (in
    order) is raised after all have ended."""
    if len(fns) == 1:
        return [fns[0]()]
    with ThreadPoolExecutor(max_workers=len(fns), thread_name_prefix="pgstreams-shard") as pool:
        futures = [pool.submit(fn) for fn in fns]
        return [f.result() for f in futures]


def _connect(index: int, dsn: str) -> psycopg.Connection:
    try:
        # prepares nothing (a statement prepared by name would not survive a transaction pooler), runs
        # few statements: the check and set-up of a cluster, once
        return psycopg.connect(dsn, autocommit=True, connect_timeout=10, prepare_threshold=None)
    except psycopg.Error as exc:
        raise ShardUnavailable(f"cannot connect to {shard_label(index, dsn)}: "
                               f"{redact(str(exc).strip(), dsn)}") from None


@contextmanager
def _connections(dsns: Sequence[str]) -> Iterator[list[psycopg.Connection]]:
    with ExitStack() as stack:
        conns = _parallel([lambda i=i, d=d: _connect(i, d) for i, d in enumerate(dsns)])  # type: ignore[misc]
        for conn in conns:
            stack.enter_context(conn)
        yield conns


def _public(layout: ShardLayout) -> ClusterLayout:
    return ClusterLayout(str(layout.cluster_id), layout.shards, layout.created_at.astimezone(timezone.utc))


def read_layouts(conns: Sequence[psycopg.Connection], schema: str) -> list[ShardLayout | None]:
    """The layout every shard records (``None`` for a server of no cluster), one connection each."""
    store = Store(None, schema)
    return [store.cluster.layout(conn) for conn in conns]


def check_layout(dsns: Sequence[str], layouts: Sequence[ShardLayout | None]) -> ClusterLayout:
    """The layout of the cluster ``dsns`` are the shards of, in this order; :class:`LayoutMismatch`
    naming the first difference otherwise (a server of no cluster or of another cluster, a shard in
    another place, a different number of shards)."""
    first = layouts[0]
    if first is None:
        raise LayoutMismatch(f"{shard_label(0, dsns[0])} belongs to no cluster: create one with "
                             "`pgstreams cluster init DSN...`")
    for i, (dsn, layout) in enumerate(zip(dsns, layouts, strict=True)):
        if layout is None:
            raise LayoutMismatch(f"{shard_label(i, dsn)} belongs to no cluster, but shard 0 to cluster "
                                 f"{first.cluster_id}: add it with `pgstreams cluster init` and every shard")
        if layout.cluster_id != first.cluster_id:
            raise LayoutMismatch(f"{shard_label(i, dsn)} belongs to cluster {layout.cluster_id}, but shard 0 "
                                 f"to cluster {first.cluster_id}")
        if layout.shard != i:
            raise LayoutMismatch(f"{shard_label(i, dsn)} is shard {layout.shard} of cluster "
                                 f"{layout.cluster_id}, not shard {i}: give the shards in their order "
                                 f"({', '.join(layout.shards)})")
        if len(layout.shards) != len(dsns):
            raise LayoutMismatch(f"cluster {layout.cluster_id} has {len(layout.shards)} shards "
                                 f"({', '.join(layout.shards)}) as {shard_label(i, dsn)} records it, but "
                                 f"{len(dsns)} were given" + (
                                     "; if a shard was being added, run `pgstreams cluster init` with "
                                     "every shard again" if len(layout.shards) < len(dsns) else ""))
    return _public(first)


def init_cluster(dsns: Sequence[str], *, schema: str = "pgstreams") -> ClusterInit:
    """Make ``dsns`` (in this order) the shards of a cluster (``pgstreams cluster init``), migrating each.

    - None of them belongs to a cluster: a new cluster. Shard 0 may hold topics already (a server used
      alone until now): they stay on shard 0 alone (their span is 1, see docs/shards.md) and are created,
      empty, on the others; the other servers must hold no topics.
    - The first ones are an existing cluster's shards in their order and the rest belong to none: the
      rest are added. Every existing topic is created on them with the same id and definition, and
      keeps its span, so no key of an existing topic moves; only topics created from now on use them.
    - They are exactly a cluster's shards: nothing changes. Run again after a failure half-way, it
      completes what was started.

    Raises :class:`LayoutMismatch` (nothing changed) for anything else, :class:`InvalidArgument` for bad
    DSNs or a database given twice, :class:`ShardUnavailable` for a server that cannot be reached.
    """
    check_schema(schema)
    dsns = check_dsns(dsns)
    if len(dsns) < 2:
        raise InvalidArgument("a cluster needs at least two shards (one server is used without a cluster)")
    labels = [server_label(d) for d in dsns]
    store = Store(None, schema)
    with _connections(dsns) as conns:
        _check_distinct(store, dsns, conns)
        for i, conn in enumerate(conns):
            try:
                CORE.migrate(conn, schema)
            except psycopg.Error as exc:
                raise ConfigurationError(f"cannot prepare {shard_label(i, dsns[i])}: "
                                         f"{redact(str(exc).strip(), dsns[i])}") from None
        return _init(store, dsns, labels, conns)


def _check_distinct(store: Store, dsns: list[str], conns: list[psycopg.Connection]) -> None:
    """:class:`InvalidArgument` if two of ``conns`` reach the same database: each takes the same (random)
    advisory lock in a transaction held open until all have (a transaction-level lock: nothing stays in a
    server session, behind a transaction pooler too), and a second one on the same database is refused."""
    key = random.getrandbits(62)
    with ExitStack() as held:
        for i, conn in enumerate(conns):
            held.enter_context(conn.transaction(force_rollback=True))
            if not store.cluster.try_lock(conn, key):
                raise InvalidArgument(f"{shard_label(i, dsns[i])} is the same database as an earlier "
                                      "shard: each shard must be a database of its own")


def _init(store: Store, dsns: list[str], labels: list[str], conns: list[psycopg.Connection]) -> ClusterInit:
    with ExitStack() as stack:
        for conn in conns:  # every shard's layout and topic administration is held until the end
            stack.enter_context(conn.transaction())
            store.cluster.lock(conn)
        layouts = [store.cluster.layout(conn) for conn in conns]
        recorded = [i for i, layout in enumerate(layouts) if layout is not None]
        if not recorded:
            cluster_id = uuid.uuid4()
            for i in range(1, len(conns)):
                if store.cluster.holds_topics(conns[i]):
                    raise LayoutMismatch(
                        f"{shard_label(i, dsns[i])} holds topics already: only shard 0 may (a server used "
                        "alone until now); give empty databases for the others")
            _copy_topics(store, conns[0], conns[1:], first_span=True)
            for i, conn in enumerate(conns):
                store.cluster.record(conn, cluster_id, i, labels)
            return ClusterInit("created", _public(_require(store.cluster.layout(conns[0]))))
        known = recorded[-1] + 1
        if recorded != list(range(known)):
            missing = next(i for i in range(known) if i not in recorded)
            raise LayoutMismatch(f"{shard_label(missing, dsns[missing])} belongs to no cluster, but "
                                 f"{shard_label(known - 1, dsns[known - 1])} does: new shards go after the "
                                 "existing ones, in order")
        first = _require(layouts[0])
        layout_of = {i: _require(layouts[i]) for i in recorded}
        for i, layout in layout_of.items():
            if layout.cluster_id != first.cluster_id:
                raise LayoutMismatch(f"{shard_label(i, dsns[i])} belongs to cluster {layout.cluster_id}, but "
                                     f"shard 0 to cluster {first.cluster_id}")
            if layout.shard != i:
                raise LayoutMismatch(f"{shard_label(i, dsns[i])} is shard {layout.shard} of cluster "
                                     f"{layout.cluster_id}, not shard {i}: give the shards in their order "
                                     f"({', '.join(layout.shards)})")
        size = max(len(x.shards) for x in layout_of.values())
        if size > len(dsns):
            raise LayoutMismatch(f"cluster {first.cluster_id} has {size} shards, but {len(dsns)} were "
                                 "given: give every shard, in order (removing shards is not possible)")
        added = tuple(range(known, len(dsns)))
        if not added and all(len(x.shards) == len(dsns) for x in layout_of.values()):
            return ClusterInit("unchanged", _public(first))
        for i in added:
            if store.cluster.holds_topics(conns[i]):
                raise LayoutMismatch(f"{shard_label(i, dsns[i])} holds topics already: a shard added to a "
                                     "cluster must be an empty database")
        _copy_topics(store, conns[0], [conns[i] for i in added], first_span=False)
        for i in added:
            store.cluster.record(conns[i], first.cluster_id, i, labels)
        for i in range(known):
            store.cluster.set_shards(conns[i], first.cluster_id, labels)
        return ClusterInit("extended", _public(_require(store.cluster.layout(conns[0]))), added)
    raise AssertionError("unreachable")  # pragma: no cover


def _require(layout: ShardLayout | None) -> ShardLayout:
    if layout is None:  # pragma: no cover - checked by the callers
        raise LayoutMismatch("a shard's layout disappeared during the change")
    return layout


def _copy_topics(store: Store, source: psycopg.Connection, targets: Sequence[psycopg.Connection], *,
                 first_span: bool) -> None:
    """Create every topic of shard 0 (``source``) on ``targets`` with the same id, definition and span.
    ``first_span``: topics of shard 0 without a span (a server used alone until now) get span 1."""
    for record in store.topics.all(source):
        span = store.cluster.span(record.name, source)
        shards = span[1] if span is not None and span[1] is not None else None
        if shards is None:
            if not first_span:
                raise LayoutMismatch(
                    f"topic {record.name!r} of shard 0 was created without the cluster (by a single-server "
                    "client): delete it or create it through the cluster")
            store.cluster.set_span(source, record.id, 1)
            shards = 1
        for conn in targets:
            done = store.cluster.create_topic(record.id, record.name, record.partitions, record.segment_size,
                                              record.config, shards, conn)
            if done.topic_id != record.id:
                raise LayoutMismatch(f"topic {record.name!r} has id {done.topic_id} on a shard but "
                                     f"{record.id} on shard 0")


def describe_cluster(dsns: Sequence[str], *, schema: str = "pgstreams") -> ClusterDescription:
    """The layout of the cluster ``dsns`` are the shards of (checked as at connect:
    :class:`LayoutMismatch` names a difference) and what each shard holds (``pgstreams cluster
    describe``). Changes nothing (no migration either)."""
    check_schema(schema)
    dsns = check_dsns(dsns)
    store = Store(None, schema)
    with _connections(dsns) as conns:
        for i, conn in enumerate(conns):
            pending = CORE.pending(conn, schema)
            if CLUSTER_MIGRATION in pending:
                raise LayoutMismatch(f"{shard_label(i, dsns[i])} belongs to no cluster (schema {schema!r} "
                                     "is not prepared for one): create one with `pgstreams cluster init`")
        layout = check_layout(dsns, read_layouts(conns, schema))
        shards = []
        for i, conn in enumerate(conns):
            spans = store.cluster.spans(conn)
            shards.append(ShardDescription(i, server_label(dsns[i]), len(spans),
                                           tuple((name, span) for name, (_, span) in spans.items())))
    return ClusterDescription(layout, tuple(shards))
