"""Connecting: where a DSN comes from and what :func:`connect` returns for it.

The one home of DSN resolution, used by :func:`connect`, :func:`pgstreams.aio.connect`, the command line
(``--dsn``) and the Spark data source (``option("dsn", ...)``), so that each accepts exactly the same forms:

1. the ``dsn`` given: one libpq DSN or URI; several separated by commas (the shards of a cluster, see
   :func:`pgstreams.cluster.split_dsns`, which keeps libpq's multi-host DSNs such as ``host=a,b`` whole);
   or a list of DSNs;
2. else ``$PGSTREAMS_DSN`` (:data:`DSN_VARIABLE`; it too may hold several separated by commas);
3. else libpq's own environment when it names a server (:data:`LIBPQ_SERVER_VARIABLES`: ``PGSERVICE``
   with the service file, ``PGHOST``, ``PGHOSTADDR``, ``PGDATABASE``; the password may come from
   ``PGPASSWORD`` or ``PGPASSFILE``): an empty conninfo, which libpq completes itself;
4. else the embedded PostgreSQL, started on demand (:mod:`pgstreams.embedded`).

It sits above :class:`pgstreams.Client` and :class:`pgstreams.ClusterClient`: one DSN gives a ``Client``,
several a ``ClusterClient``.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from typing import Any, overload

from .client import (
    DEFAULT_POLL_INTERVAL,
    DEFAULT_POOL_SIZE,
    DEFAULT_RETRY_TIMEOUT,
    DEFAULT_SCHEMA,
    Client,
    check_connect_options,
)
from .cluster import ClusterClient
from .cluster.layout import check_dsns, split_dsns
from .embedded import embedded_dsn
from .errors import InvalidArgument
from .pooler import Pooler, check_listen_dsn, check_pooler

__all__ = ["DSN_VARIABLE", "LIBPQ_SERVER_VARIABLES", "connect", "resolve_dsn", "resolve_dsns"]

#: The environment variable holding the DSN (or the shards' DSNs, separated by commas) when none is given.
DSN_VARIABLE = "PGSTREAMS_DSN"

#: libpq's environment variables that name a server (with them, an empty DSN connects there).
LIBPQ_SERVER_VARIABLES = ("PGSERVICE", "PGHOST", "PGHOSTADDR", "PGDATABASE")

#: The conninfo that makes libpq read its environment and service file.
_LIBPQ_ENVIRONMENT = " "


def env_dsn() -> str | None:
    """``$PGSTREAMS_DSN`` stripped, or ``None`` when unset or blank."""
    value = os.environ.get(DSN_VARIABLE, "").strip()
    return value or None


def resolve_dsn(dsn: str | None) -> str:
    """The DSN text to use: ``dsn``, else ``$PGSTREAMS_DSN``, else libpq's own environment when it names a
    server (an empty conninfo, ``" "``), else the embedded server's DSN (starting it). The text may name
    several servers separated by commas (see :func:`resolve_dsns`). An empty or blank ``dsn`` counts as
    none."""
    if dsn and dsn.strip():
        return dsn
    env = env_dsn()
    if env:
        return env
    if any(os.environ.get(v) for v in LIBPQ_SERVER_VARIABLES):
        return _LIBPQ_ENVIRONMENT
    return embedded_dsn()


def resolve_dsns(dsn: str | Sequence[str] | None) -> list[str]:
    """Every server ``dsn`` names, in order (one for a single server, several for the shards of a
    cluster), resolved as :func:`connect` does: a list is checked DSN by DSN (non-empty strings libpq can
    parse); a string, or the DSN :func:`resolve_dsn` finds without one, is split at the commas that start
    a new DSN. Raises :class:`pgstreams.InvalidArgument` for a bad argument (an empty string, a list with
    an empty or malformed DSN, a value that is neither a string nor a list)."""
    if isinstance(dsn, (list, tuple)):
        return check_dsns(list(dsn))
    if dsn is not None and not isinstance(dsn, str):
        raise InvalidArgument(f"dsn must be a string or a list of strings, not {type(dsn).__name__}")
    if dsn is not None and not dsn.strip():
        # an empty DSN would silently fall back to $PGSTREAMS_DSN or the embedded server
        raise InvalidArgument("dsn must not be empty (None uses $PGSTREAMS_DSN or the embedded server)")
    resolved = resolve_dsn(dsn)
    if "," in resolved:  # perhaps several DSNs (a cluster), perhaps one of libpq's multi-host DSNs
        return check_dsns(split_dsns(resolved))
    return [resolved]


@overload
def connect(
    dsn: str | None = None, *, schema: str = DEFAULT_SCHEMA, migrate: bool = True,
    pool_size: int = DEFAULT_POOL_SIZE, poll_interval: float = DEFAULT_POLL_INTERVAL,
    retry_timeout: float = DEFAULT_RETRY_TIMEOUT, idempotent: bool = True, pooler: Pooler | None = None,
    listen_dsn: str | None = None,
) -> Client: ...


@overload
def connect(
    dsn: Sequence[str], *, schema: str = DEFAULT_SCHEMA, migrate: bool = True,
    pool_size: int = DEFAULT_POOL_SIZE, poll_interval: float = DEFAULT_POLL_INTERVAL,
    retry_timeout: float = DEFAULT_RETRY_TIMEOUT, idempotent: bool = True, pooler: Pooler | None = None,
    listen_dsn: str | None = None,
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
    pooler: Pooler | None = None,
    listen_dsn: str | None = None,
) -> Any:
    """Connect to PostgreSQL and return a :class:`Client` (also usable as a context manager), or, given
    several DSNs, a :class:`pgstreams.ClusterClient` over the shards of a cluster (docs/shards.md).

    ``dsn``: one DSN; a list of DSNs (the shards of a cluster, in its order; a list of one is one
    server); or a string of several separated by commas (see :func:`pgstreams.cluster.split_dsns`;
    typed as a :class:`Client` then: pass a list for precise types). It defaults to ``$PGSTREAMS_DSN``
    (which may hold several, separated by commas), else libpq's environment when it names a server
    (``PGSERVICE``, ``PGHOST``, ...), else an embedded PostgreSQL started on demand (see
    :mod:`pgstreams.embedded` and :func:`resolve_dsns`). ``schema`` (default ``"pgstreams"``) holds every
    table. ``migrate`` (default true) applies pending migrations. ``pool_size`` (default 10) bounds the
    connection pool. ``poll_interval`` (default 0.25 s) is how often waiting consumers poll when no
    notification arrives. ``retry_timeout`` (default :data:`DEFAULT_RETRY_TIMEOUT`, 30 s; 0 turns
    retrying off): how long a publish, poll, commit or other call keeps being retried on fresh
    connections after the connection broke or the server restarted, before it raises
    :class:`pgstreams.ConnectionLost` (see :mod:`pgstreams.reconnect`).
    ``idempotent`` (default true): publishes are tagged with the client's producer id and number, so that a
    publish retried after its outcome was lost is stored once (see :mod:`pgstreams.producer`); false stores
    no tag and draws no producer id: a publish retried after a connection broke during its commit may then
    be stored twice (events with an ``event_id`` never are). It exists to measure what idempotence costs
    (``python -m bench.idempotence``) and for callers who deduplicate themselves.
    ``pooler`` (default ``None``, the same as ``"session"``): the mode of a connection pooler between the
    client and PostgreSQL (see :mod:`pgstreams.pooler` and docs/operations.md, "Behind a connection
    pooler"). ``"transaction"`` (PgBouncer's ``pool_mode = transaction``, RDS Proxy, Supavisor's
    transaction mode): the client keeps nothing in a server session between transactions (no named
    prepared statement, no session setting, no session advisory lock, no LISTEN through the pooler).
    ``listen_dsn`` (default ``None``): a DSN of the same database that reaches PostgreSQL straight or
    through a pooler in session mode, used only by the client's LISTEN connection (the consumers' wake-ups);
    without one a client in ``"transaction"`` mode does not listen and its waiting consumers and workers poll
    every ``poll_interval`` (an event is seen up to that long after its commit). One server only.
    """
    check_connect_options(schema, migrate, pool_size, poll_interval, retry_timeout, idempotent)
    options: dict[str, Any] = {"schema": schema, "migrate": migrate, "pool_size": pool_size,
                               "poll_interval": float(poll_interval), "retry_timeout": float(retry_timeout),
                               "idempotent": idempotent, "pooler": check_pooler(pooler)}
    listen = check_listen_dsn(listen_dsn)
    dsns = resolve_dsns(dsn)
    if len(dsns) == 1:
        return Client(dsns[0], **options, listen_dsn=listen)
    if listen is not None:
        raise InvalidArgument(f"listen_dsn names one server, but {len(dsns)} DSNs (the shards of a cluster) "
                              "were given: the shards' consumers poll behind a transaction pooler")
    return ClusterClient(dsns, **options)
