"""The asyncio API: ``client = await pgstreams.aio.connect(...)`` returns an :class:`AsyncClient` with the
methods of :class:`pgstreams.Client` as coroutines, for asyncio services (FastAPI, aiohttp, ...).

Publishing, polling and committing run on psycopg's async connections from a
:class:`psycopg_pool.AsyncConnectionPool` through the storage layer's async executor
(:mod:`pgstreams.storage.asyncstore`): the same named queries, the same gap-free read fence (a poll sends
the partitions' fences and the read in one round trip), the same checkpoint outcomes and the same errors.
Encoding, partition choice and validation are the producer's; cursor bookkeeping is the
:class:`~pgstreams.consumer.reader.StreamReader`'s. Administration (topics, groups, status, maintenance)
is rare and runs the sync client's methods in a worker thread (``asyncio.to_thread``), so it never blocks
the event loop either. The package's modules: :mod:`.client` (:class:`AsyncClient`: connections,
administration, publishing) and :mod:`.consumer` (:class:`AsyncConsumer`).

Faults are handled as by the sync client (:mod:`pgstreams.reconnect`): a publish, ``publish_many``, poll,
commit, seek, consumer creation or topic lookup whose connection broke or whose server restarted is run
again on a fresh connection (:class:`~pgstreams.reconnect.AsyncReconnect`: 50 ms doubling up to 1 s apart)
within ``connect(retry_timeout=...)`` (default 30 s), then raises one :class:`pgstreams.ConnectionLost`
naming the server without its password; a commit is retried with the same expected checkpoint, so a
checkpoint the lost attempt stored comes back ``IGNORED`` (already stored) and is applied. Publishes are
idempotent by default (``connect(idempotent=True)``): they carry the producer tags of the sync client's
:class:`~pgstreams.producer.Producer` (the same producer id and numbers), and a publish retried after its
outcome was lost (the connection broke during its commit) first waits until the broken session ended,
then looks for its tag and stores the events only if they are absent: stored once, by the very
procedures the sync producer runs (:mod:`pgstreams.producer.idempotence`). A
:meth:`AsyncConsumer.transaction` gets a connection whose ``BEGIN`` succeeded (retried likewise); what
fails inside the block is the caller's, as with the sync consumer: it rolls back and raises.
"""

from __future__ import annotations

import asyncio

from ..client import (
    DEFAULT_POLL_INTERVAL,
    DEFAULT_POOL_SIZE,
    DEFAULT_SCHEMA,
    Client,
    check_connect_options,
)
from ..connecting import resolve_dsns
from ..errors import InvalidArgument
from ..pooler import Pooler, check_listen_dsn, check_pooler, connection_options
from ..reconnect import DEFAULT_RETRY_TIMEOUT
from ..storage.executor import session_setup_async
from ..storage.libpq import AsyncCheckedPool
from .client import AsyncClient
from .consumer import AsyncConsumer, AsyncConsumerTransaction

__all__ = ["ADMIN_POOL_SIZE", "AsyncClient", "AsyncConsumer", "AsyncConsumerTransaction", "connect"]

#: Connections of the sync client an :class:`AsyncClient` runs its administration through.
ADMIN_POOL_SIZE = 2


async def connect(dsn: str | None = None, *, schema: str = DEFAULT_SCHEMA, migrate: bool = True,
                  pool_size: int = DEFAULT_POOL_SIZE, poll_interval: float = DEFAULT_POLL_INTERVAL,
                  retry_timeout: float = DEFAULT_RETRY_TIMEOUT, idempotent: bool = True,
                  pooler: Pooler | None = None, listen_dsn: str | None = None) -> AsyncClient:
    """Connect to PostgreSQL and return an :class:`AsyncClient` (use ``async with`` or ``await
    client.close()``). The arguments and defaults are those of :func:`pgstreams.connect`: ``dsn``
    (default ``$PGSTREAMS_DSN``, else the embedded server), ``schema`` ("pgstreams"), ``migrate`` (true),
    ``pool_size`` (10 async connections), ``poll_interval`` (0.25 s), ``retry_timeout``
    (:data:`pgstreams.DEFAULT_RETRY_TIMEOUT`, 30 s; 0 turns retrying off: how long a call keeps being
    retried on fresh connections after its connection broke or the server restarted, before it raises
    :class:`pgstreams.ConnectionLost`), ``idempotent`` (true: publishes carry producer tags, so that one
    retried after its outcome was lost is stored once), ``pooler`` (``None``: ``"session"``; ``"transaction"``
    behind a transaction pooler: see :mod:`pgstreams.pooler`), ``listen_dsn`` (``None``; the LISTEN
    connection's DSN behind a transaction pooler); the same errors
    (:class:`pgstreams.ConfigurationError` when the server cannot be reached, ...)."""
    check_connect_options(schema, migrate, pool_size, poll_interval, retry_timeout, idempotent)
    mode = check_pooler(pooler)
    listen = check_listen_dsn(listen_dsn)
    dsns = await asyncio.to_thread(resolve_dsns, dsn)
    if len(dsns) > 1:
        raise InvalidArgument(f"the asyncio client connects to one server, but {len(dsns)} DSNs (the shards "
                              "of a cluster) were given")
    resolved = dsns[0]
    sync = await asyncio.to_thread(Client, resolved, schema=schema, migrate=migrate,
                                   pool_size=min(ADMIN_POOL_SIZE, pool_size), poll_interval=poll_interval,
                                   retry_timeout=retry_timeout, idempotent=idempotent, pooler=mode,
                                   listen_dsn=listen)
    pool = AsyncCheckedPool(sync.conninfo, min_size=1, max_size=pool_size, kwargs=connection_options(mode),
                            configure=session_setup_async(mode), timeout=max(sync.retry_timeout, 1.0),
                            open=False, name="pgstreams-aio")
    try:
        await pool.open(wait=True, timeout=30)
    except BaseException:
        await asyncio.to_thread(sync.close)
        raise
    return AsyncClient(sync, pool)
