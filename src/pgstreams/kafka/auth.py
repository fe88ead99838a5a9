"""SASL authentication of the gateway's clients against PostgreSQL roles: ``SaslHandshake`` and
``SaslAuthenticate`` with the ``PLAIN`` mechanism.

A client's user name and password are a PostgreSQL role's: the gateway connects to the database as that
role with them (PostgreSQL checks the password, with whatever ``pg_hba.conf`` asks for), and then serves
the connection's requests with that role's client. So what a Kafka principal may produce, consume or
administer is what ``pgstreams grant`` gave the role: PostgreSQL refuses the rest, and the gateway answers
Kafka's ``TOPIC_AUTHORIZATION_FAILED`` or ``GROUP_AUTHORIZATION_FAILED``. A role that was granted nothing
at all cannot use the schema: its authentication is refused with a message that says so. Each role's
client (a small pool of connections) is kept while the gateway runs, one per user name and password.
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
from typing import Any, Final

import psycopg
from kio.schema.errors import ErrorCode
from psycopg.conninfo import make_conninfo

from ..aio import AsyncClient
from ..aio import connect as aio_connect
from ..errors import PermissionDenied, PgStreamsError

log = logging.getLogger("pgstreams.kafka")

#: The SASL mechanisms the gateway can serve.
MECHANISMS: Final = ("PLAIN",)

#: The API keys a client may send before it authenticated (when the gateway asks for SASL).
SASL_HANDSHAKE_KEY, SASL_AUTHENTICATE_KEY = 17, 36
BEFORE_AUTHENTICATION: Final = frozenset({18, SASL_HANDSHAKE_KEY, SASL_AUTHENTICATE_KEY})


class AuthenticationFailed(Exception):
    """The credentials were refused (the message says why, without the password)."""


def parse_plain(auth_bytes: bytes) -> tuple[str, str]:
    """The user name and password of a ``PLAIN`` message (RFC 4616: authorisation id, user, password,
    separated by NUL bytes); :class:`AuthenticationFailed` when malformed or when the authorisation id
    names another user."""
    parts = auth_bytes.split(b"\0")
    if len(parts) != 3:
        raise AuthenticationFailed("a malformed PLAIN message")
    try:
        authzid, user, password = (p.decode("utf-8") for p in parts)
    except UnicodeDecodeError:
        raise AuthenticationFailed("a PLAIN message that is not UTF-8") from None
    if not user:
        raise AuthenticationFailed("a PLAIN message without a user name")
    if authzid and authzid != user:
        raise AuthenticationFailed(f"user {user!r} cannot act as {authzid!r}")
    return user, password


class Principals:
    """The clients of the roles that authenticated, one per user name and password, opened over the
    gateway's own connection string with the role's credentials instead."""

    def __init__(self, client: AsyncClient) -> None:
        self._base = client.sync.conninfo
        self._schema = client.schema
        self._clients: dict[tuple[str, str], AsyncClient] = {}
        self._lock = asyncio.Lock()

    async def client_of(self, user: str, password: str) -> AsyncClient:
        """The client of role ``user`` (connected now with ``password`` unless it is already);
        :class:`AuthenticationFailed` when PostgreSQL refuses the credentials."""
        key = (user, hashlib.sha256(password.encode()).hexdigest())
        async with self._lock:
            known = self._clients.get(key)
            if known is not None:
                return known
            dsn = make_conninfo(self._base, user=user, password=password)
            try:
                client = await aio_connect(dsn, schema=self._schema, migrate=False, pool_size=4)
            except PermissionDenied:  # the password was right, but the role may not use the schema at all
                raise AuthenticationFailed(f"role {user!r} has no right on the pgstreams schema "
                                           f"{self._schema!r} (see pgstreams grant)") from None
            except (psycopg.OperationalError, PgStreamsError) as exc:
                log.info("SASL authentication of %r refused: %s", user, _first_line(exc, password))
                raise AuthenticationFailed(f"authentication of {user!r} failed") from None
            self._clients[key] = client
            return client

    async def close(self) -> None:
        for client in self._clients.values():
            try:
                await client.close()
            except Exception as exc:  # noqa: BLE001 - closing every other one matters more
                log.warning("closing a role's client: %s", exc)
        self._clients.clear()


def _first_line(exc: BaseException, secret: str) -> str:
    text = (str(exc).splitlines() or [type(exc).__name__])[0]
    return text.replace(secret, "***") if secret else text


def handshake_reply(enabled: tuple[str, ...], mechanism: str) -> dict[str, Any]:
    """``SaslHandshake``'s reply: the mechanisms enabled, and ``UNSUPPORTED_SASL_MECHANISM`` when the one
    asked for is not among them."""
    code = ErrorCode.none if mechanism in enabled else ErrorCode.unsupported_sasl_mechanism
    return {"error_code": code, "mechanisms": list(enabled)}


def authenticate_reply(error: str | None) -> dict[str, Any]:
    """``SaslAuthenticate``'s reply: success, or ``SASL_AUTHENTICATION_FAILED`` with ``error``."""
    return {"error_code": ErrorCode.none if error is None else ErrorCode.sasl_authentication_failed,
            "error_message": error, "auth_bytes": b"", "session_lifetime": 0}
