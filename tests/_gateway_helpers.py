"""The Kafka gateway for tests: one over a test's database, in a thread of its own, or ``pgstreams kafka
serve`` as a process."""

from __future__ import annotations

import asyncio
import os
import re
import subprocess
import sys
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

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
