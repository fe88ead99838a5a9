"""Connection poolers in front of PostgreSQL (PgBouncer, RDS Proxy, Supavisor, PgCat): what pgstreams may
keep in a server session, by the pooler's mode (``connect(pooler=...)``; docs/operations.md, "Behind a
connection pooler").

- ``"session"`` (:data:`DEFAULT_POOLER`; ``None`` means it too): a client connection keeps its server
  session until it closes (straight to PostgreSQL, or a pooler in session mode). pgstreams prepares its
  hot statements once per connection, sets session settings, holds session advisory locks and LISTENs.
- ``"transaction"``: each transaction may run on another server session, which serves other clients
  between them (PgBouncer's ``pool_mode = transaction``). pgstreams then keeps nothing in a server session
  between transactions: unnamed statements only (psycopg's ``prepare_threshold=None`` on every connection,
  no statement of its own prepared by name), settings that last one transaction (``set_config(...,
  true)``), locks that last one transaction or rows that expire instead of session advisory locks, and no
  LISTEN through the pooler (a ``listen_dsn`` that reaches the server directly or through a session
  pooler, else polling).
"""

from __future__ import annotations

from typing import Any, Final, Literal, cast

import psycopg
from psycopg.conninfo import conninfo_to_dict

from .errors import InvalidArgument

__all__ = ["DEFAULT_POOLER", "POOLER_MODES", "Pooler", "check_listen_dsn", "check_pooler",
           "connection_options", "keeps_sessions"]

#: A pooler's mode, as pgstreams needs to know it.
Pooler = Literal["session", "transaction"]
#: Every mode :func:`check_pooler` accepts.
POOLER_MODES: Final = ("session", "transaction")
#: The mode of ``connect(pooler=None)``: a session per connection (no pooler, or one in session mode).
DEFAULT_POOLER: Final[Pooler] = "session"


def check_pooler(value: object, option: str = "pooler") -> Pooler:
    """The mode ``value`` names (``None``: :data:`DEFAULT_POOLER`); :class:`pgstreams.InvalidArgument`
    naming ``option`` and the modes otherwise."""
    if value is None:
        return DEFAULT_POOLER
    if isinstance(value, str) and value.strip().lower() in POOLER_MODES:
        return cast(Pooler, value.strip().lower())
    modes = " or ".join(repr(m) for m in POOLER_MODES) if not option.isidentifier() else (
        ", ".join(repr(m) for m in POOLER_MODES) + " or None")  # an option typed as text takes no None
    raise InvalidArgument(f"{option} must be one of {modes} (the pooling mode of a connection pooler in "
                          f"front of PostgreSQL), got {value!r}")


def check_listen_dsn(value: object, option: str = "listen_dsn") -> str | None:
    """``value`` if it is a DSN libpq can parse (or ``None``); :class:`pgstreams.InvalidArgument` naming
    ``option`` otherwise (without the text of the DSN, which may hold a password)."""
    if value is None:
        return None
    if not isinstance(value, str):
        raise InvalidArgument(f"{option} must be a DSN string or None, not {type(value).__name__}")
    if not value.strip():
        raise InvalidArgument(f"{option} must not be empty (None: no connection of its own for LISTEN)")
    try:
        conninfo_to_dict(value)
    except psycopg.Error as exc:
        from .reconnect import (
            redact,  # here: pgstreams.reconnect imports the storage layer, which imports this
        )

        raise InvalidArgument(f"{option} is not a valid DSN: {redact(str(exc).strip(), value)}") from None
    return value


def keeps_sessions(pooler: Pooler) -> bool:
    """Whether a connection keeps its server session between transactions in mode ``pooler``."""
    return pooler == "session"


def connection_options(pooler: Pooler) -> dict[str, Any]:
    """The psycopg connection options of an autocommit connection of pgstreams in mode ``pooler``: in
    transaction mode ``prepare_threshold=None``, so that psycopg prepares no statement (a prepared
    statement lives in one server session: the next transaction may run on another one, where it is missing,
    or where another client's statement of the same name exists)."""
    if keeps_sessions(pooler):
        return {"autocommit": True}
    return {"autocommit": True, "prepare_threshold": None}
