"""Which server session a connection runs on, as the server itself says.

A connection's ``pgconn.backend_pid`` is the process id the server sent at login (``BackendKeyData``).
Straight to PostgreSQL it is the backend's; behind a connection pooler (PgBouncer, RDS Proxy, Supavisor,
PgCat) it is the pooler's own cancel key, which names no server process: ``pg_stat_activity`` never
shows it. Every check of "is my earlier attempt still running" (the silence probe of
:mod:`.libpq.waits`, the settling of a lost publish in :mod:`pgstreams.producer.idempotence`) must ask
about the server's process instead, so each connection pgstreams makes reads ``pg_backend_pid()`` once,
when it is set up (:func:`pgstreams.storage.executor.configure_session`, in the same round trip as its
settings), and records it here.

A connection set up elsewhere (one a caller passes in) has no recorded identity: then no wait on it is cut
for the server's silence (only the kernel's keepalives and ``tcp_user_timeout`` end it), and nothing is
retried on the belief that an earlier attempt ended.
"""

from __future__ import annotations

import weakref
from typing import Any

from psycopg import pq

#: The server process of each connection set up by pgstreams, keyed by its libpq connection (entries go
#: with the connections).
_SERVER_PIDS: weakref.WeakKeyDictionary[Any, int] = weakref.WeakKeyDictionary()


def remember(pg: pq.abc.PGconn, server_pid: int) -> None:
    """Record that ``pg`` runs on the server process ``server_pid`` (what ``pg_backend_pid()`` returned on
    it)."""
    _SERVER_PIDS[pg] = int(server_pid)


def server_pid(pg: pq.abc.PGconn) -> int | None:
    """The server process ``pg`` runs on, as the server said when pgstreams set the connection up;
    ``None`` if it was not set up by pgstreams (its identity is not known)."""
    return _SERVER_PIDS.get(pg)


def pooled(pg: pq.abc.PGconn) -> bool | None:
    """Whether ``pg`` reaches the server through a connection pooler (the process id given at login is not
    the server's); ``None`` if not known."""
    pid = _SERVER_PIDS.get(pg)
    return None if pid is None else pid != pg.backend_pid


__all__ = ["pooled", "remember", "server_pid"]
