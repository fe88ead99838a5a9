"""NATS JetStream operations, with the official Python client (``nats-py``, asyncio).

Each benchmark process runs its own event loop and connection; an operation is one
``loop.run_until_complete`` of a coroutine. Streams use file storage and one replica (a single server);
an event is a message of 100 bytes on subject ``<prefix>.<key>`` (keys ``k0`` .. ``k999``).
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import Awaitable, Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, TypeVar

from .._common import BATCH, DONE, LatencyArgs, LatencySink, Paced, key, stamped_value, value

T = TypeVar("T")



@dataclass(frozen=True)
class JsTarget:
    """A stream on a NATS server, the subject prefix its events are published on, and (for readers) a
    durable consumer's name."""

    url: str
    stream: str
    subject: str
    consumer: str = ""
    batch: int = BATCH
    expected: int = 0  # events a reader stops after


@dataclass
class JsLatencyArgs(LatencyArgs):
    """:class:`bench._common.LatencyArgs` where ``dsn`` is the server's URL and ``target`` the subject
    prefix, plus the stream."""

    stream: str = ""


def _subjects(prefix: str, n: int, start: int = 0) -> list[str]:
    return [f"{prefix}.{key(i)}" for i in range(start, start + n)]


@contextmanager
def _connected(url: str) -> Iterator[tuple[asyncio.AbstractEventLoop, Any, Any]]:
    """An event loop, a connection to ``url`` and its JetStream context; closed on exit."""
    import nats

    loop = asyncio.new_event_loop()
    nc = loop.run_until_complete(nats.connect(url, allow_reconnect=False, connect_timeout=10))
    try:
        yield loop, nc, nc.jetstream(timeout=30)
    finally:
        try:
            loop.run_until_complete(nc.close())
        finally:
            loop.close()


async def _publish_batch(js: Any, subjects: Sequence[str], payloads: Sequence[bytes]) -> int:
    """Publish asynchronously (every message outstanding at once), then wait for every ack."""
    futures = [await js.publish_async(s, p) for s, p in zip(subjects, payloads, strict=True)]
    for ack in await asyncio.gather(*futures):
        if ack is None:
            raise RuntimeError("a JetStream publish was not acknowledged")
    return len(futures)


@contextmanager
def publish_batch_op(t: JsTarget) -> Iterator[Callable[[], int]]:
    """Operation: ``t.batch`` async publishes, all outstanding together, then every ack awaited."""
    subjects = _subjects(t.subject, t.batch)
    payloads = [value(i) for i in range(t.batch)]
    with _connected(t.url) as (loop, _nc, js):
        yield lambda: loop.run_until_complete(_publish_batch(js, subjects, payloads))


@contextmanager
def publish_op(t: JsTarget) -> Iterator[Callable[[], int]]:
    """Operation: one ``js.publish``, awaiting its ack."""
    start = os.getpid()
    subjects = _subjects(t.subject, t.batch, start)
    payloads = [value(i) for i in range(start, start + t.batch)]
    with _connected(t.url) as (loop, _nc, js):
        i = 0

        async def one() -> int:
            nonlocal i
            j = i % len(subjects)
            await js.publish(subjects[j], payloads[j])
            i += 1
            return 1

        yield lambda: loop.run_until_complete(one())


@contextmanager
def consume_op(t: JsTarget) -> Iterator[Callable[[], int]]:
    """Operation: ``fetch`` of up to ``t.batch`` messages from a durable pull consumer (created here,
    delivering the whole stream; see :data:`CONSUME_ACK`), until ``t.expected`` were read."""
    from nats.js.api import AckPolicy, ConsumerConfig, DeliverPolicy

    with _connected(t.url) as (loop, _nc, js):
        config = ConsumerConfig(ack_policy=AckPolicy.ALL, deliver_policy=DeliverPolicy.ALL,
                                max_ack_pending=10 * t.batch, ack_wait=60)
        sub = loop.run_until_complete(js.pull_subscribe(f"{t.subject}.>", durable=t.consumer,
                                                        stream=t.stream, config=config))
        seen = 0

        async def batch() -> int:
            nonlocal seen
            msgs = await sub.fetch(t.batch, timeout=5)
            await msgs[-1].ack_sync(timeout=10)
            seen += len(msgs)
            return len(msgs)

        def op() -> int:
            if seen >= t.expected:
                return DONE
            return loop.run_until_complete(batch())

        yield op


@contextmanager
def latency_producer(args: JsLatencyArgs) -> Iterator[Callable[[], int]]:
    """Operation: at a steady pace, the stamped events due: ``js.publish`` awaiting the ack for one, async
    publishes with every ack awaited for more."""
    subject = f"{args.target}.{key(0)}"
    with _connected(args.dsn) as (loop, _nc, js):
        async def send(n: int) -> None:
            if n == 1:
                await js.publish(subject, stamped_value())
            else:
                await _publish_batch(js, [subject] * n, [stamped_value() for _ in range(n)])

        yield Paced(args.rate, lambda n: loop.run_until_complete(send(n)))


@contextmanager
def latency_consumer(args: JsLatencyArgs) -> Iterator[Callable[[], int]]:
    """Operation: wait (at most 0.25 s) for the next message of an ephemeral push consumer that delivers
    new messages, then take whatever else has arrived; record each one's latency; acknowledge the last
    (AckAll policy: one ack for what was received, as a group commits once per poll)."""
    import nats.errors
    from nats.js.api import AckPolicy, ConsumerConfig, DeliverPolicy

    with _connected(args.dsn) as (loop, _nc, js):
        config = ConsumerConfig(ack_policy=AckPolicy.ALL, deliver_policy=DeliverPolicy.NEW,
                                max_ack_pending=10 * BATCH)
        sub = loop.run_until_complete(js.subscribe(f"{args.target}.>", stream=args.stream, manual_ack=True,
                                                   config=config))
        sink = LatencySink(args.skip)

        async def receive() -> int:
            n = 0
            timeout = 0.25
            last = None
            while n < BATCH:
                try:
                    last = await sub.next_msg(timeout=timeout)
                except nats.errors.TimeoutError:
                    break
                sink.add(last.data)
                n += 1
                if not sub.pending_msgs:
                    break
                timeout = 0.001
            if last is not None:
                await last.ack()
            return n

        def op() -> int:
            return loop.run_until_complete(receive())

        op.extra = sink.extra  # type: ignore[attr-defined]
        yield op


# --------------------------------------------------------------------------------------------------------
# set-up, filling and clean-up, from the parent process


def run(coro: Awaitable[T]) -> T:
    """Run ``coro`` on a fresh event loop (the parent's helpers below)."""
    async def main() -> T:
        return await coro

    return asyncio.run(main())


async def server_version(url: str) -> str:
    """The server's version as it announces itself."""
    import nats

    nc = await nats.connect(url, allow_reconnect=False, connect_timeout=10)
    try:
        return str(nc.connected_server_version)
    finally:
        await nc.close()


async def create_streams(url: str, streams: dict[str, str]) -> None:
    """Create file-storage streams ``{name: subject prefix}`` (subjects ``<prefix>.>``, one replica)."""
    import nats
    from nats.js.api import StorageType, StreamConfig

    nc = await nats.connect(url, allow_reconnect=False, connect_timeout=10)
    try:
        js = nc.jetstream(timeout=30)
        for name, prefix in streams.items():
            await js.add_stream(StreamConfig(name=name, subjects=[f"{prefix}.>"], storage=StorageType.FILE,
                                             num_replicas=1))
    finally:
        await nc.close()


async def delete_streams(url: str, names: Sequence[str]) -> list[str]:
    """Delete the streams ``names`` (those that exist); return the names deleted."""
    import nats
    from nats.js.errors import NotFoundError

    nc = await nats.connect(url, allow_reconnect=False, connect_timeout=10)
    deleted = []
    try:
        js = nc.jetstream(timeout=30)
        for name in names:
            try:
                await js.delete_stream(name)
            except NotFoundError:
                continue
            deleted.append(name)
    finally:
        await nc.close()
    return deleted


async def fill(t: JsTarget, n: int) -> None:
    """Untimed: ``n`` events published in batches of ``t.batch`` (async, acks awaited per batch)."""
    import nats

    nc = await nats.connect(t.url, allow_reconnect=False, connect_timeout=10)
    try:
        js = nc.jetstream(timeout=30)
        subjects = _subjects(t.subject, t.batch)
        payloads = [value(i) for i in range(t.batch)]
        done = 0
        while done < n:
            done += await _publish_batch(js, subjects, payloads)
    finally:
        await nc.close()
