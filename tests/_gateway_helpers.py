"""The Kafka gateway for tests: one over a test's database, in a thread of its own."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Iterator
from contextlib import contextmanager

import pgstreams.aio
from pgstreams.kafka import Gateway


@contextmanager
def running_gateway(dsn: str) -> Iterator[str]:
    """A gateway over ``dsn`` listening on a free loopback port, in a thread with its own event loop;
    yields its bootstrap address (``HOST:PORT``) and stops it afterwards (failing if it failed)."""
    ready = threading.Event()
    state: dict[str, object] = {}
    failure: list[BaseException] = []

    async def main() -> None:
        async with await pgstreams.aio.connect(dsn) as client:
            async with Gateway(client, listen="127.0.0.1:0") as gateway:
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
