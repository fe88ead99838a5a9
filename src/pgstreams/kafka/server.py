"""The gateway's asyncio server: one task per connection, its requests answered in order.

A frame that cannot be read (a size out of range, a malformed request) closes its own connection only. A
request for an API or a version that is not served gets Kafka's ``UNSUPPORTED_VERSION``: in an
``ApiVersions`` reply of version 0 (with the versions served) for ``ApiVersions`` itself, as Kafka does;
for another API, where no reply of the version asked can be built, the connection is closed with a
warning that names the API and version (Kafka brokers close it too).
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import hashlib
import logging
import ssl
import struct
import time
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import psycopg
from kio.schema.errors import ErrorCode

from ..aio import AsyncClient
from ..errors import PermissionDenied
from ..names import is_loopback
from . import admin, auth, codec, membership, offsets, reads, transactions, writes
from .handlers import CLIENT_GONE, Context, Handler, api_versions, api_versions_reply, metadata
from .stats import GatewayStats, has_error
from .versions import API_VERSIONS_KEY, SERVED, served

log = logging.getLogger("pgstreams.kafka")

#: The handler of each API key served (their versions: :data:`pgstreams.kafka.versions.SERVED`).
HANDLERS: dict[int, Handler] = {
    0: writes.produce,
    1: reads.fetch,
    2: reads.list_offsets,
    3: metadata,
    8: offsets.offset_commit,
    9: offsets.offset_fetch,
    10: offsets.find_coordinator,
    11: membership.join_group,
    12: membership.heartbeat,
    13: membership.leave_group,
    14: membership.sync_group,
    15: admin.describe_groups,
    16: admin.list_groups,
    19: admin.create_topics,
    20: admin.delete_topics,
    22: writes.init_producer_id,
    24: transactions.add_partitions_to_txn,
    25: transactions.add_offsets_to_txn,
    26: transactions.end_txn,
    28: transactions.txn_offset_commit,
    32: admin.describe_configs,
    33: admin.alter_configs,
    37: admin.create_partitions,
    44: admin.incremental_alter_configs,
    18: api_versions,
}

#: The gateway's default listening address.
DEFAULT_LISTEN = "127.0.0.1:9092"


def parse_address(value: str, option: str) -> tuple[str, int]:
    """``HOST:PORT`` as a pair; :class:`ValueError` naming ``option`` when it is not one."""
    host, sep, port = value.rpartition(":")
    if not sep or not host or not port.isdigit() or not 0 <= int(port) <= 65535:
        raise ValueError(f"{option} must be HOST:PORT with a port from 0 to 65535, not {value!r}")
    return host.strip("[]"), int(port)


class Gateway:
    """A Kafka protocol server over the topics of one pgstreams schema (see ``docs/kafka.md``).

    ``client``: the :class:`pgstreams.aio.AsyncClient` it serves from (not closed by the gateway);
    ``listen``: ``HOST:PORT`` to listen on (port 0: any free one); ``advertise``: ``HOST:PORT`` that
    clients are told to connect to (default: the listening address); ``node_id``: its broker id;
    ``sasl``: the SASL mechanisms clients must authenticate with (``"PLAIN"``: a PostgreSQL role's name and
    password, see :mod:`pgstreams.kafka.auth`; default none); ``allow_unauthenticated``: serve an address
    other than a loopback one without SASL (refused otherwise: :class:`ValueError`); ``tls``: a server
    :class:`ssl.SSLContext` (see :func:`tls_context`): clients connect with TLS (``security.protocol``
    ``SSL`` or ``SASL_SSL``).
    """

    def __init__(self, client: AsyncClient, *, listen: str = DEFAULT_LISTEN, advertise: str | None = None,
                 node_id: int = 0, sasl: Sequence[str] = (), allow_unauthenticated: bool = False,
                 tls: ssl.SSLContext | None = None) -> None:
        self._client = client
        self._tls = tls
        self._listen = parse_address(listen, "listen")
        self._advertise = parse_address(advertise, "advertise") if advertise else None
        self._node_id = node_id
        self._sasl = tuple(m.upper() for m in sasl)
        unknown = [m for m in self._sasl if m not in auth.MECHANISMS]
        if unknown:
            raise ValueError(f"SASL mechanism {unknown[0]!r} is not served (served: "
                             f"{', '.join(auth.MECHANISMS)})")
        if not self._sasl and not allow_unauthenticated and not is_loopback(self._listen[0]):
            raise ValueError(f"refusing to serve {self._listen[0]} without authentication: enable SASL, or "
                             "allow unauthenticated clients explicitly")
        self._principals = auth.Principals(client) if self._sasl else None
        self._server: asyncio.Server | None = None
        self._ctx: Context | None = None
        #: each connection's task and its queue of request frames (the gateway's close ends it with ``None``)
        self._connections: dict[asyncio.Task[Any], asyncio.Queue[bytes | BaseException | None]] = {}
        self._receivers: set[asyncio.Task[Any]] = set()
        #: the request each connection is answering: API key, version and since when (named when the
        #: gateway's close has to end the connection)
        self._doing: dict[asyncio.Task[Any], tuple[int, int, float]] = {}
        #: the gateway's counters and request durations (its Prometheus metrics)
        self.stats = GatewayStats()
        self._waits: ThreadPoolExecutor | None = None

    @property
    def address(self) -> tuple[str, int]:
        """The address the gateway listens on (after :meth:`start`: with the port bound)."""
        if self._server is None or not self._server.sockets:
            return self._listen
        host, port = self._server.sockets[0].getsockname()[:2]
        return str(host), int(port)

    @property
    def advertised(self) -> tuple[str, int]:
        """The address clients are told to connect to."""
        return self._advertise or self.address

    async def start(self) -> None:
        """Listen (returns once bound)."""
        host, port = self._listen
        self._server = await asyncio.start_server(self._serve, host, port, ssl=self._tls)
        adv_host, adv_port = self.advertised
        # the cluster id: the same for every gateway of one database and schema
        cluster = hashlib.sha256(f"{self._client.server}/{self._client.schema}".encode()).hexdigest()[:22]
        self._waits = ThreadPoolExecutor(max_workers=64, thread_name_prefix="pgstreams-kafka-wait")
        self._ctx = Context(self._client, self._node_id, adv_host, adv_port, cluster, self._waits,
                            transactions.Transactions())
        log.info("serving the Kafka protocol on %s:%d (advertised as %s:%d)", *self.address, adv_host,
                 adv_port)

    async def close(self) -> None:
        """Stop listening, stop reading requests, answer those already read (a waiting ``Fetch`` with what
        it has; up to :data:`DRAIN_TIMEOUT`), then end every connection."""
        if self._server is not None:
            self._server.close()
        if self._ctx is not None:
            self._ctx.stopping.set()
        for receiver in list(self._receivers):
            receiver.cancel()
        # no more requests: each connection answers those it has read, then ends (its receiver puts this
        # too when cancelled, but not one cancelled before it ever ran: a connection accepted just now)
        for frames in self._connections.values():
            with contextlib.suppress(asyncio.QueueFull):  # full: the connection is not waiting for one
                frames.put_nowait(None)
        if self._connections:
            _done, pending = await asyncio.wait(list(self._connections), timeout=DRAIN_TIMEOUT)
            now = time.monotonic()
            for task in pending:
                doing = self._doing.get(task)
                log.warning("ending a connection whose requests were not answered within %g s (%s)",
                            DRAIN_TIMEOUT, "waiting for a request" if doing is None else
                            f"{_api_name(doing[0], doing[1])} for {now - doing[2]:.1f} s")
                task.cancel()
            for task in pending:
                with contextlib.suppress(BaseException):
                    await task
        if self._server is not None:
            await self._server.wait_closed()
        if self._ctx is not None:
            await self._ctx.transactions.close()  # open transactions are rolled back
        if self._principals is not None:
            await self._principals.close()
        if self._waits is not None:
            # its threads end by themselves: each wait lasts at most reads.WAIT_SLICE
            self._waits.shutdown(wait=False, cancel_futures=True)

    async def __aenter__(self) -> Gateway:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        self.stats.connected()
        peer = writer.get_extra_info("peername")
        frames: asyncio.Queue[bytes | BaseException | None] = asyncio.Queue(PIPELINE)
        self._connections[task] = frames
        gone = asyncio.Event()
        CLIENT_GONE.set(gone)  # this task's context: the handlers it awaits see it
        receiving = asyncio.get_running_loop().create_task(_receive(reader, frames, gone))
        self._receivers.add(receiving)
        assert self._ctx is not None
        # the connection's context: the gateway's own, or (with SASL) the role's once it authenticated
        ctx: Context | None = None if self._sasl else self._ctx
        sasl = _Sasl()
        try:
            held: bytes | BaseException | None = None
            while True:
                frame = held if held is not None else await self._next(frames)
                held = None
                if isinstance(frame, BaseException):
                    raise frame
                if frame is None:
                    return  # the client closed the connection
                if sasl.raw and ctx is None:
                    # after a SaslHandshake v0, the client's SASL tokens come as they are, each in a frame
                    # of its own, and so go the replies (an empty one once PLAIN's single token passed)
                    done, error, data = await self._authenticate(sasl, frame)
                    if error is not None:
                        log.warning("closing the connection of %s: %s", peer, error)
                        return  # a failed authentication closes the connection (v0 has no error reply)
                    ctx = done or ctx
                    writer.write(struct.pack(">i", len(data)) + data)
                    await writer.drain()
                    continue
                key, version, _correlation = codec.peek(frame)
                self._doing[task] = (key, version, time.monotonic())
                if key in (auth.SASL_HANDSHAKE_KEY, auth.SASL_AUTHENTICATE_KEY) or ctx is None:
                    if key not in auth.BEFORE_AUTHENTICATION:
                        log.warning("closing the connection of %s: API key %d before authentication", peer,
                                    key)
                        return
                    reply: bytes | None
                    if served(key, version) is None:
                        reply = await self._answer(frame, self._ctx)  # not served: refused, or closed
                    elif key == auth.SASL_HANDSHAKE_KEY:
                        request = codec.decode(frame)
                        await sasl.reset(str(request.body.mechanism).upper())
                        reply = self._reply(request, auth.handshake_reply(self._sasl, sasl.mechanism or ""))
                        # version 0: the tokens follow without SaslAuthenticate
                        sasl.raw = request.api_version == 0 and sasl.mechanism in self._sasl
                    elif key == auth.SASL_AUTHENTICATE_KEY:
                        request = codec.decode(frame)
                        done, error, data = await self._authenticate(sasl, bytes(request.body.auth_bytes))
                        ctx = done or ctx
                        reply = self._reply(request, auth.authenticate_reply(error, data))
                        if error is not None:
                            writer.write(reply)
                            await writer.drain()
                            return  # Kafka closes the connection after a failed authentication
                    else:
                        reply = await self._answer(frame, self._ctx)  # ApiVersions
                    if reply is None:
                        return
                    writer.write(reply)
                    await writer.drain()
                    self._doing.pop(task, None)
                    continue
                if key == writes.PRODUCE_KEY:
                    # the produce requests that arrived meanwhile are stored with it, in one transaction
                    group = [frame]
                    while len(group) < GROUP_LIMIT and not frames.empty():
                        nxt = frames.get_nowait()
                        if isinstance(nxt, bytes) and codec.peek(nxt)[0] == writes.PRODUCE_KEY:
                            group.append(nxt)
                        else:
                            held = nxt
                            break
                    replies = await self._answer_produce(group, ctx)
                else:
                    replies = [await self._answer(frame, ctx)]
                for reply in replies:
                    if reply is None:
                        return
                    if reply:  # a produce with acks=0 gets no reply
                        writer.write(reply)
                await writer.drain()
                self._doing.pop(task, None)
        except codec.FrameError as exc:
            log.warning("closing the connection of %s: %s", peer, exc)
        except (ConnectionError, asyncio.IncompleteReadError):
            pass
        except asyncio.CancelledError:
            pass
        except Exception:
            log.exception("closing the connection of %s after an unexpected error", peer)
        finally:
            await sasl.reset(None)
            receiving.cancel()
            with contextlib.suppress(BaseException):
                await receiving
            self._receivers.discard(receiving)
            self._connections.pop(task, None)
            self._doing.pop(task, None)
            self.stats.disconnected()
            writer.close()
            with contextlib.suppress(Exception):
                await writer.wait_closed()

    async def _next(self, frames: asyncio.Queue[bytes | BaseException | None]
                    ) -> bytes | BaseException | None:
        """The connection's next request frame; ``None`` once the client closed it, or once the gateway is
        closing and every frame read was answered."""
        assert self._ctx is not None
        stopping = self._ctx.stopping
        while True:
            if stopping.is_set() and frames.empty():
                return None
            try:
                return await asyncio.wait_for(frames.get(), DRAIN_CHECK if stopping.is_set() else None)
            except TimeoutError:
                continue

    async def _authenticate(self, sasl: _Sasl, auth_bytes: bytes
                            ) -> tuple[Context | None, str | None, bytes]:
        """A step of the connection's SASL exchange: the role's context once it authenticated (else
        None), the reason it failed (else None), and the bytes to send the client."""
        assert self._ctx is not None
        if self._principals is None:
            return None, "SASL is not enabled on this gateway", b""
        if sasl.mechanism not in self._sasl:
            return None, "authenticate after a SaslHandshake with an enabled mechanism", b""
        try:
            if sasl.mechanism == auth.SCRAM:
                if sasl.relay is None:  # the client's first message
                    sasl.relay = auth.ScramRelay(self._client.sync.conninfo)
                    return None, None, await sasl.relay.first(auth_bytes)
                relay, sasl.relay = sasl.relay, None
                final = await relay.final(auth_bytes)
                client = await self._principals.client_as(relay.user)
                return dataclasses.replace(self._ctx, client=client), None, final
            user, password = auth.parse_plain(auth_bytes)
            client = await self._principals.client_of(user, password)
        except auth.AuthenticationFailed as exc:
            await sasl.reset(sasl.mechanism)
            return None, str(exc), b""
        return dataclasses.replace(self._ctx, client=client), None, b""

    @staticmethod
    def _reply(request: codec.Request, values: dict[str, Any]) -> bytes:
        kind = codec.response_type(request.api_key, request.api_version)
        return codec.encode(request.correlation_id, codec.build(kind, values))

    async def _answer_produce(self, frames: list[bytes], ctx: Context) -> list[bytes | None]:
        """The replies to consecutive ``Produce`` frames (see :func:`pgstreams.kafka.writes.produce_group`):
        a frame of a version not served ends the group there, as :meth:`_answer` would."""
        requests = []
        for frame in frames:
            key, version, _correlation = codec.peek(frame)
            if served(key, version) is None:
                break
            requests.append(codec.decode(frame))
        replies: list[bytes | None] = []
        if requests:
            started = time.perf_counter()
            answers = await writes.produce_group(ctx, requests)
            took = time.perf_counter() - started
            for values in answers:
                self.stats.answered(SERVED[writes.PRODUCE_KEY].name, took, has_error(values))
            for req, values in zip(requests, answers, strict=True):
                kind = codec.response_type(req.api_key, req.api_version)
                replies.append(b"" if values is writes.NO_REPLY
                               else codec.encode(req.correlation_id, codec.build(kind, values)))
        if len(requests) < len(frames):
            replies.append(await self._answer(frames[len(requests)], ctx))  # the refusal: it closes
        return replies

    async def _answer(self, frame: bytes, ctx: Context) -> bytes | None:
        """The reply frame to a request frame (``None``: close the connection; empty: no reply)."""
        key, version, correlation = codec.peek(frame)
        api = served(key, version)
        if api is None:
            if key == API_VERSIONS_KEY:
                refusal = api_versions_reply(ErrorCode.unsupported_version)
                return codec.encode(correlation, codec.build(codec.response_type(key, 0), refusal))
            known = SERVED.get(key)
            self.stats.answered(known.name if known else f"key_{key}", 0.0, True)
            log.warning("closing a connection that sent API key %d version %d: %s", key, version,
                        "not served" if known is None
                        else f"{known.name} is served in versions {known.min_version}-{known.max_version}")
            return None
        request = codec.decode(frame)
        started = time.perf_counter()
        try:
            values = await HANDLERS[key](ctx, request)
        except (PermissionDenied, psycopg.errors.InsufficientPrivilege) as exc:  # the role may not (auth.py)
            self.stats.answered(api.name, time.perf_counter() - started, True)
            code = _GROUP_APIS.get(key, ErrorCode.topic_authorization_failed)
            refused = codec.refusal(codec.response_type(key, version), code)
            if refused is None:
                log.warning("closing a connection whose %s was refused: %s", api.name, exc)
                return None
            return codec.encode(correlation, refused)
        self.stats.answered(api.name, time.perf_counter() - started, has_error(values))
        if values is writes.NO_REPLY:
            return b""
        return codec.encode(correlation, codec.build(codec.response_type(key, version), values))


def _api_name(key: int, version: int) -> str:
    """``NAME vVERSION`` of a request (``API key K vVERSION`` for an API not served)."""
    known = SERVED.get(key)
    return f"{known.name if known else f'API key {key}'} v{version}"


def tls_context(certificate: str, key: str | None = None, client_ca: str | None = None) -> ssl.SSLContext:
    """A server TLS context from a PEM ``certificate`` (chain) and its ``key`` (default: in the same
    file); with ``client_ca``, clients must present a certificate signed by it (mutual TLS)."""
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    context.load_cert_chain(certificate, key)
    if client_ca is not None:
        context.load_verify_locations(client_ca)
        context.verify_mode = ssl.CERT_REQUIRED
    return context


#: The APIs about a group: a request of one that PostgreSQL refuses is answered with
#: ``GROUP_AUTHORIZATION_FAILED`` (others with ``TOPIC_AUTHORIZATION_FAILED``).
_GROUP_APIS: dict[int, ErrorCode] = {k: ErrorCode.group_authorization_failed
                                     for k in (8, 9, 10, 11, 12, 13, 14, 15, 16, 25, 28)}


class _Sasl:
    """A connection's SASL exchange: the mechanism of its handshake (and whether its version was 0), and a
    SCRAM exchange under way."""

    def __init__(self) -> None:
        self.mechanism: str | None = None
        self.relay: auth.ScramRelay | None = None
        #: whether the tokens come as they are (after a ``SaslHandshake`` v0), not in ``SaslAuthenticate``
        self.raw = False

    async def reset(self, mechanism: str | None) -> None:
        self.mechanism = mechanism
        if self.relay is not None:
            await self.relay.close()
            self.relay = None


#: Seconds a closing gateway waits for the requests already read to be answered.
DRAIN_TIMEOUT = 30.0
#: Seconds between checks whether a closing connection has answered everything it read.
DRAIN_CHECK = 0.05

#: How many request frames of a connection are read ahead of the one being answered (Kafka's clients send
#: several before the first reply: ``max.in.flight.requests.per.connection``).
PIPELINE = 64
#: The most produce requests of a connection stored together in one transaction.
GROUP_LIMIT = 32


async def _receive(reader: asyncio.StreamReader, frames: asyncio.Queue[bytes | BaseException | None],
                   gone: asyncio.Event) -> None:
    """Read a connection's request frames into ``frames``, then ``None`` when the client closed it, or the
    error that ended reading (a frame out of range, a broken connection); ``gone`` is set at once then,
    before the requests read earlier are answered (see :data:`handlers.CLIENT_GONE`)."""
    try:
        while True:
            try:
                prefix = await reader.readexactly(4)
            except asyncio.IncompleteReadError:
                gone.set()
                await frames.put(None)
                return
            frame = await reader.readexactly(codec.frame_size(prefix))
            await frames.put(frame)
    except asyncio.CancelledError:  # the gateway closes: no more requests are read
        with contextlib.suppress(asyncio.QueueFull):
            frames.put_nowait(None)
        raise
    except Exception as exc:  # noqa: BLE001 - handed to the connection's task, which decides
        gone.set()
        await frames.put(exc)


async def serve(client: AsyncClient, *, listen: str = DEFAULT_LISTEN, advertise: str | None = None,
                node_id: int = 0, sasl: Sequence[str] = (), allow_unauthenticated: bool = False,
                tls: ssl.SSLContext | None = None, ready: asyncio.Event | None = None) -> None:
    """Serve the Kafka protocol until cancelled (``ready`` is set once listening); the arguments are
    :class:`Gateway`'s."""
    async with Gateway(client, listen=listen, advertise=advertise, node_id=node_id, sasl=sasl,
                       allow_unauthenticated=allow_unauthenticated, tls=tls):
        if ready is not None:
            ready.set()
        await asyncio.Event().wait()
