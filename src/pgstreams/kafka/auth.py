"""SASL authentication of the gateway's clients against PostgreSQL roles: ``SaslHandshake`` and
``SaslAuthenticate`` with the ``PLAIN`` and ``SCRAM-SHA-256`` mechanisms.

A client's user name and password are a PostgreSQL role's. With ``PLAIN`` the gateway connects to the
database as that role with them (PostgreSQL checks the password, with whatever ``pg_hba.conf`` asks for);
with ``SCRAM-SHA-256`` it relays the client's SCRAM messages to PostgreSQL's own SCRAM authentication
(:class:`ScramRelay`: the password never reaches the gateway) and then acts as the role on its own
connections (``SET ROLE``, which its login role must be allowed). It then serves the connection's requests
with that role's client. So what a Kafka principal may produce, consume or
administer is what ``pgstreams grant`` gave the role: PostgreSQL refuses the rest, and the gateway answers
Kafka's ``TOPIC_AUTHORIZATION_FAILED`` or ``GROUP_AUTHORIZATION_FAILED``. A role that was granted nothing
at all cannot use the schema: its authentication is refused with a message that says so. Each role's
client (a small pool of connections) is kept while the gateway runs, one per user name and password.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import logging
import ssl
import struct
from typing import Any, Final

import psycopg
from kio.schema.errors import ErrorCode
from psycopg.conninfo import conninfo_to_dict, make_conninfo

from ..aio import AsyncClient
from ..aio import connect as aio_connect
from ..errors import PermissionDenied, PgStreamsError

log = logging.getLogger("pgstreams.kafka")

#: The SASL mechanisms the gateway can serve.
MECHANISMS: Final = ("PLAIN", "SCRAM-SHA-256")

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

    async def client_as(self, user: str) -> AsyncClient:
        """The client of role ``user`` that PostgreSQL authenticated (SCRAM): the gateway's own connections
        acting as that role (``role`` set at connection), which the gateway's login role must be allowed
        to (a member of the role, or a superuser); :class:`AuthenticationFailed` when it is not."""
        key = (user, "")
        async with self._lock:
            known = self._clients.get(key)
            if known is not None:
                return known
            given = conninfo_to_dict(self._base).get("options")
            options = f"-c role={_option_value(user)}"
            dsn = make_conninfo(self._base, options=f"{given} {options}" if given else options)
            try:
                client = await aio_connect(dsn, schema=self._schema, migrate=False, pool_size=4)
            except PermissionDenied:
                raise AuthenticationFailed(f"role {user!r} has no right on the pgstreams schema "
                                           f"{self._schema!r} (see pgstreams grant)") from None
            except (psycopg.OperationalError, PgStreamsError) as exc:
                log.warning("the gateway cannot act as role %r: %s", user, _first_line(exc, ""))
                raise AuthenticationFailed(f"the gateway cannot act as role {user!r} (its own role must be "
                                           "a member of it)") from None
            self._clients[key] = client
            return client

    async def close(self) -> None:
        for client in self._clients.values():
            try:
                await client.close()
            except Exception as exc:  # noqa: BLE001 - closing every other one matters more
                log.warning("closing a role's client: %s", exc)
        self._clients.clear()


def _option_value(value: str) -> str:
    """``value`` for libpq's ``options`` (backslash before spaces and backslashes)."""
    return value.replace("\\", "\\\\").replace(" ", "\\ ")


def _first_line(exc: BaseException, secret: str) -> str:
    text = (str(exc).splitlines() or [type(exc).__name__])[0]
    return text.replace(secret, "***") if secret else text


def handshake_reply(enabled: tuple[str, ...], mechanism: str) -> dict[str, Any]:
    """``SaslHandshake``'s reply: the mechanisms enabled, and ``UNSUPPORTED_SASL_MECHANISM`` when the one
    asked for is not among them."""
    code = ErrorCode.none if mechanism in enabled else ErrorCode.unsupported_sasl_mechanism
    return {"error_code": code, "mechanisms": list(enabled)}


def authenticate_reply(error: str | None, auth_bytes: bytes = b"") -> dict[str, Any]:
    """``SaslAuthenticate``'s reply: the mechanism's next message (``auth_bytes``), or
    ``SASL_AUTHENTICATION_FAILED`` with ``error``."""
    return {"error_code": ErrorCode.none if error is None else ErrorCode.sasl_authentication_failed,
            "error_message": error, "auth_bytes": auth_bytes, "session_lifetime": 0}


# -- SCRAM-SHA-256, relayed to PostgreSQL ----------------------------------------------------------------

SCRAM: Final = "SCRAM-SHA-256"
_AUTH_OK, _AUTH_SASL, _AUTH_SASL_CONTINUE, _AUTH_SASL_FINAL = 0, 10, 11, 12


class ScramRelay:
    """One SCRAM-SHA-256 exchange of a Kafka client relayed to PostgreSQL: Kafka's SCRAM messages are those
    of RFC 5802 that PostgreSQL's SASL authentication speaks too, so the gateway opens a connection of the
    protocol's own to the server as the user the client names, hands the client's messages to it and the
    server's back, and the server checks the proof against the role's stored verifier. The gateway never
    sees a password. Use :meth:`first` with the client's first message, then :meth:`final`."""

    def __init__(self, conninfo: str) -> None:
        params = conninfo_to_dict(conninfo)
        self._host = str(params.get("host") or params.get("hostaddr") or "/var/run/postgresql").split(",")[0]
        self._port = int(str(params.get("port") or 5432).split(",")[0])
        self._dbname = str(params.get("dbname") or "postgres")
        self._sslmode = str(params.get("sslmode") or "prefer")
        self._reader: asyncio.StreamReader | None = None
        self._writer: asyncio.StreamWriter | None = None
        self.user = ""

    async def first(self, client_first: bytes) -> bytes:
        """The server's first message to the client's (:class:`AuthenticationFailed` when refused)."""
        self.user = _scram_user(client_first)
        await self._open()
        startup = b"".join(s.encode() + b"\0" for s in ("user", self.user, "database", self._dbname)) + b"\0"
        await self._send(None, struct.pack(">i", 196608) + startup)
        code, body = await self._auth()
        if code != _AUTH_SASL or SCRAM.encode() not in body.split(b"\0"):
            raise AuthenticationFailed(f"the server does not authenticate {self.user!r} with {SCRAM}")
        await self._send(b"p", SCRAM.encode() + b"\0" + struct.pack(">i", len(client_first)) + client_first)
        code, body = await self._auth()
        if code != _AUTH_SASL_CONTINUE:
            raise AuthenticationFailed(f"authentication of {self.user!r} failed")
        return body

    async def final(self, client_final: bytes) -> bytes:
        """The server's final message to the client's final one (:class:`AuthenticationFailed` when the
        proof is wrong); the relay's connection is closed after."""
        try:
            await self._send(b"p", client_final)
            code, body = await self._auth()
            if code != _AUTH_SASL_FINAL:
                raise AuthenticationFailed(f"authentication of {self.user!r} failed")
            ok, _ = await self._auth()
            if ok != _AUTH_OK:
                raise AuthenticationFailed(f"authentication of {self.user!r} failed")
            return body
        finally:
            await self.close()

    async def close(self) -> None:
        if self._writer is not None:
            self._writer.close()
            with contextlib.suppress(Exception):
                await self._writer.wait_closed()
            self._writer = None

    async def _open(self) -> None:
        try:
            if self._host.startswith("/"):
                self._reader, self._writer = await asyncio.open_unix_connection(
                    f"{self._host}/.s.PGSQL.{self._port}")
                return
            self._reader, self._writer = await asyncio.open_connection(self._host, self._port)
            if self._sslmode in ("disable", "allow"):
                return
            await self._send(None, struct.pack(">i", 80877103))  # SSLRequest (its length is added)
            answer = await self._reader.readexactly(1)
            if answer == b"S":
                context = ssl.create_default_context()
                if self._sslmode not in ("verify-ca", "verify-full"):
                    context.check_hostname = False
                    context.verify_mode = ssl.CERT_NONE
                elif self._sslmode == "verify-ca":
                    context.check_hostname = False
                await self._writer.start_tls(context, server_hostname=self._host)
            elif self._sslmode in ("require", "verify-ca", "verify-full"):
                raise AuthenticationFailed("the server does not accept TLS, which sslmode requires")
        except (OSError, asyncio.IncompleteReadError) as exc:
            raise AuthenticationFailed(f"cannot reach the server to authenticate: {exc}") from None

    async def _send(self, kind: bytes | None, payload: bytes) -> None:
        assert self._writer is not None
        self._writer.write((kind or b"") + struct.pack(">i", len(payload) + 4) + payload)
        await self._writer.drain()

    async def _auth(self) -> tuple[int, bytes]:
        """The next authentication message: its code and data (:class:`AuthenticationFailed` for an
        error message)."""
        assert self._reader is not None
        try:
            kind = await self._reader.readexactly(1)
            (size,) = struct.unpack(">i", await self._reader.readexactly(4))
            body = await self._reader.readexactly(size - 4)
        except (OSError, asyncio.IncompleteReadError) as exc:
            raise AuthenticationFailed(f"the server closed the authentication: {exc}") from None
        if kind == b"E":
            fields = dict((f[:1], f[1:]) for f in body.split(b"\0") if f)
            raise AuthenticationFailed(f"authentication of {self.user!r} failed: "
                                       f"{fields.get(b'M', b'').decode(errors='replace')}")
        if kind != b"R":
            raise AuthenticationFailed(f"an unexpected message {kind!r} while authenticating")
        (code,) = struct.unpack(">i", body[:4])
        return code, body[4:]


def _scram_user(client_first: bytes) -> str:
    """The user name of a SCRAM client-first message (``n,,n=NAME,r=NONCE``; ``=2C`` and ``=3D`` escape
    ``,`` and ``=``)."""
    try:
        text = client_first.decode("utf-8")
        bare = text.split(",", 2)[2]
        name = next(p[2:] for p in bare.split(",") if p.startswith("n="))
    except (UnicodeDecodeError, IndexError, StopIteration):
        raise AuthenticationFailed("a malformed SCRAM message") from None
    name = name.replace("=2C", ",").replace("=3D", "=")
    if not name:
        raise AuthenticationFailed("a SCRAM message without a user name")
    return name
