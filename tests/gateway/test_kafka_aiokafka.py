"""aiokafka (asyncio) through the Kafka gateway: an idempotent producer and a consumer in a group
(subscribe, commit), with the same key, value and headers on both sides."""

from __future__ import annotations

import asyncio
import threading

from aiokafka import AIOKafkaConsumer, AIOKafkaProducer

import pgstreams
from _gateway_helpers import running_gateway


def test_aiokafka_produces_and_consumes_in_a_group(client: pgstreams.Client, dsn: str) -> None:
    client.create_topic("t", partitions=2)

    async def scenario(bootstrap: str) -> list[tuple[bytes, bytes, list]]:
        producer = AIOKafkaProducer(bootstrap_servers=bootstrap, enable_idempotence=True)
        await producer.start()
        try:
            for i in range(20):
                await producer.send_and_wait("t", f"v{i}".encode(), key=f"k{i}".encode(),
                                             headers=[("n", str(i).encode())])
        finally:
            await producer.stop()
        consumer = AIOKafkaConsumer("t", bootstrap_servers=bootstrap, group_id="g",
                                    auto_offset_reset="earliest", enable_auto_commit=False)
        await consumer.start()
        got: list[tuple[bytes, bytes, list]] = []
        try:
            async def take() -> None:
                async for m in consumer:
                    got.append((m.key, m.value, list(m.headers)))
                    if len(got) == 20:
                        return

            await asyncio.wait_for(take(), 60)
            await consumer.commit()
        finally:
            await consumer.stop()
        return got

    outcome: list[object] = []

    def run(bootstrap: str) -> None:
        # an event loop of its own, in a thread of its own (the test's thread may already run one)
        try:
            outcome.append(asyncio.run(scenario(bootstrap)))
        except BaseException as exc:  # noqa: BLE001 - reported below
            outcome.append(exc)

    with running_gateway(dsn) as bootstrap:
        thread = threading.Thread(target=run, args=(bootstrap,))
        thread.start()
        thread.join(180)
    assert outcome and not isinstance(outcome[0], BaseException), outcome
    got = outcome[0]
    assert isinstance(got, list)
    assert sorted(got) == sorted((f"k{i}".encode(), f"v{i}".encode(), [("n", str(i).encode())])
                                 for i in range(20))
    events = client.consumer("t", "check").poll(max_events=100, timeout=5)
    assert sorted(e.value for e in events) == sorted(f"v{i}".encode() for i in range(20))
    status = client.describe_group("g", "t")
    assert all(s.lag == 0 for s in status) and len(status) == 2
