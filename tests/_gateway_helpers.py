"""The Kafka gateway for tests: one over a test's database, in a thread of its own, or ``pgstreams kafka
serve`` as a process; and requests sent as they are, with kio's classes (:func:`request_frame`,
:class:`RawConnection`)."""

from __future__ import annotations

import asyncio
import io
import os
import re
import socket
import struct
import subprocess
import sys
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from kio.schema.request_header.v1.header import RequestHeader
from kio.schema.request_header.v2.header import RequestHeader as RequestHeaderV2
from kio.serial import entity_reader, entity_writer
from kio.static.primitive import i16, i32

import pgstreams.aio
from _core_helpers import wait_until
from pgstreams.kafka import Gateway


@contextmanager
def running_gateway(dsn: str, listen: str = "127.0.0.1:0", **options: Any) -> Iterator[str]:
    """A gateway over ``dsn`` listening on ``listen`` (default: a free loopback port), in a thread with its
    own event loop (``options``: more of :class:`Gateway`'s, e.g. ``sasl=["PLAIN"]``); yields its bootstrap
    address (``HOST:PORT``) and stops it afterwards (failing if it failed)."""
    ready = threading.Event()
    state: dict[str, object] = {}
    failure: list[BaseException] = []

    async def main() -> None:
        async with await pgstreams.aio.connect(dsn) as client:
            async with Gateway(client, listen=listen, **options) as gateway:
                stop = asyncio.Event()
                state.update(address="{}:{}".format(*gateway.address), stop=stop,
                             loop=asyncio.get_running_loop())
                ready.set()
                await stop.wait()

    def run() -> None:
        try:
            asyncio.run(main())
        except BaseException as exc:  # noqa: BLE001 - reported to the test
            failure.append(exc)
            ready.set()

    thread = threading.Thread(target=run, name="kafka-gateway", daemon=True)
    thread.start()
    assert ready.wait(60) and not failure, failure
    try:
        yield str(state["address"])
    finally:
        loop = state["loop"]
        assert isinstance(loop, asyncio.AbstractEventLoop)
        loop.call_soon_threadsafe(state["stop"].set)  # type: ignore[attr-defined]
        thread.join(30)
    assert not failure, failure


@contextmanager
def serve_process(dsn: str, *args: str) -> Iterator[tuple[subprocess.Popen[str], str]]:
    """``pgstreams kafka serve --dsn DSN --listen 127.0.0.1:0 ARGS`` as a real process: yields it (its
    standard error still readable) and its bootstrap address, read from its first line; killed afterwards
    when the test did not stop it."""
    command = [sys.executable, "-m", "pgstreams.cli", "kafka", "serve", "--dsn", dsn,
               "--listen", "127.0.0.1:0", *args]
    proc = subprocess.Popen(command, stderr=subprocess.PIPE, text=True, env=dict(os.environ, COLUMNS="200"))
    try:
        assert proc.stderr is not None
        line = wait_until(proc.stderr.readline, 120, "the gateway's address")
        found = re.search(r"serving the Kafka protocol at (\S+)", line)
        assert found, line
        yield proc, found.group(1)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(30)


def request_frame(key: int, version: int, correlation: int, request: Any, client_id: str = "test") -> bytes:
    """The frame of ``request`` (API ``key``, ``version``): its size, the request header (version 2 for a
    flexible version, else 1), then the request."""
    header: Any
    if type(request).__flexible__:
        header = RequestHeaderV2(request_api_key=i16(key), request_api_version=i16(version),
                                 correlation_id=i32(correlation), client_id=client_id)
    else:
        header = RequestHeader(request_api_key=i16(key), request_api_version=i16(version),
                               correlation_id=i32(correlation), client_id=client_id)
    buf = io.BytesIO()
    entity_writer(type(header))(buf, header)
    entity_writer(type(request))(buf, request)
    return struct.pack(">i", len(buf.getvalue())) + buf.getvalue()


def read_frame(sock: socket.socket) -> bytes:
    """The next response frame of ``sock`` without its size; ``b""`` once the connection is closed."""
    head = sock.recv(4, socket.MSG_WAITALL)
    if len(head) < 4:
        return b""
    return sock.recv(struct.unpack(">i", head)[0], socket.MSG_WAITALL)


class RawConnection:
    """A connection to a gateway (``HOST:PORT``) that sends requests as kio's classes, one at a time."""

    def __init__(self, bootstrap: str, timeout: float = 120.0) -> None:
        host, port = bootstrap.rsplit(":", 1)
        self.sock = socket.create_connection((host, int(port)), timeout=timeout)
        self.correlation = 0

    def call(self, key: int, version: int, request: Any, response_type: Any) -> Any:
        """Send ``request`` (API ``key``, ``version``) and read its response as ``response_type``."""
        self.correlation += 1
        self.sock.sendall(request_frame(key, version, self.correlation, request))
        frame = read_frame(self.sock)
        skip = 5 if response_type.__header_schema__.__version__ >= 1 else 4  # the response header
        return entity_reader(response_type)(memoryview(frame), skip)[0]

    def close(self) -> None:
        self.sock.close()

    def __enter__(self) -> RawConnection:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
