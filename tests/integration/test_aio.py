"""The asyncio API (``pgstreams.aio``) against real PostgreSQL: the core's properties again, through the
async client (gap-free reads, commit outcomes, exactly-once transactions, bad input)."""

from __future__ import annotations

import asyncio
from typing import TypeVar

import psycopg
import pytest

import pgstreams
from _core_helpers import run_async
from pgstreams import CommitOutcome, InvalidArgument, MessageTooLarge, TopicNotFound, aio

T = TypeVar("T")


run = run_async


def test_publish_poll_commit_round_trip_with_outcomes(dsn: str) -> None:
    async def main() -> None:
        async with await aio.connect(dsn) as client:
            await client.create_topic("orders", 3)
            r = await client.publish("orders", {"id": 1}, key="customer-42", event_type="OrderPlaced",
                                     headers={"h": "v"})
            assert r.partition == pgstreams.partition_for_key("customer-42", 3) and r.position > 0
            n = await client.publish_many("orders", [{"value": i, "partition": i % 3} for i in range(30)])
            assert n == 30
            consumer = await client.consumer("orders", "billing")
            got: list[pgstreams.Event] = []
            while len(got) < 31:
                events = await consumer.poll(max_events=7, timeout=5)
                assert events
                got.extend(events)
                assert await consumer.commit() is CommitOutcome.STORED
            assert got[0].value == {"id": 1} or any(e.value == {"id": 1} for e in got)
            first = next(e for e in got if e.event_type == "OrderPlaced")
            assert first.key == "customer-42" and first.headers == {"h": "v"}
            for p in range(3):
                positions = [e.position for e in got if e.partition == p]
                assert positions == sorted(positions)
            assert await consumer.poll(timeout=0.2) == []
            assert await consumer.commit(got[:1]) is CommitOutcome.IGNORED  # behind the checkpoint
            status = await client.describe_group("billing")
            assert sum(s.lag for s in status) == 0
            # the sync client reads the same checkpoints
            with pgstreams.connect(dsn) as sync:
                assert sync.consumer("orders", "billing").poll(timeout=0.2) == []

    run(main)


def test_async_poll_is_gap_free_behind_an_open_transaction(dsn: str) -> None:
    async def main() -> None:
        async with await aio.connect(dsn) as client:
            await client.create_topic("t", 1)
            consumer = await client.consumer("t", "g")
            async with client.connection() as holder:
                await holder.execute("BEGIN")
                early = await client.publish("t", "early", conn=holder)   # the earlier position, open
                late = await client.publish("t", "late")                   # committed first
                assert late.position > early.position
                assert await consumer.poll(timeout=0.3) == []              # held back by the open publisher
                await holder.execute("COMMIT")
            events = await consumer.poll(timeout=5)
            assert [e.value for e in events] == ["early", "late"]

    run(main)


def test_exactly_once_transaction_commits_writes_with_the_checkpoint(dsn: str) -> None:
    async def main() -> None:
        async with await aio.connect(dsn) as client:
            async with client.connection() as c:
                await c.execute("CREATE TABLE invoices (position bigint PRIMARY KEY)")
            await client.create_topic("t", 2)
            await client.publish_many("t", [{"value": i, "partition": i % 2} for i in range(10)])
            consumer = await client.consumer("t", "inv")
            # a failing handler rolls back its writes and the checkpoint: the events come again
            with pytest.raises(RuntimeError):
                async with consumer.transaction() as tx:
                    for e in await tx.poll(max_events=4, timeout=5):
                        await tx.connection.execute("INSERT INTO invoices VALUES (%s)", (e.position,))
                    raise RuntimeError("handler failed")
            handled = 0
            while handled < 10:
                async with consumer.transaction() as tx:
                    events = await tx.poll(max_events=4, timeout=5)
                    for e in events:
                        await tx.connection.execute("INSERT INTO invoices VALUES (%s)", (e.position,))
                assert tx.outcome is CommitOutcome.STORED
                handled += len(events)
            assert handled == 10
            # a block that polled nothing stored nothing: IGNORED, as the sync Consumer.transaction says
            async with consumer.transaction() as tx:
                assert await tx.poll(max_events=4, timeout=0.1) == []
            assert tx.outcome is CommitOutcome.IGNORED
            with pgstreams.connect(dsn) as sync_client, sync_client.consumer("t", "inv").transaction() as stx:
                assert stx.poll(max_events=4, timeout=0.1) == []
            assert stx.outcome is CommitOutcome.IGNORED
            # a competing consumer moved the checkpoint: everything of this transaction is rolled back
            other = await client.consumer("t", "inv")
            await client.publish("t", 99, partition=0)
            async with consumer.transaction() as tx:
                events = await tx.poll(timeout=5)
                assert events
                await tx.connection.execute("INSERT INTO invoices VALUES (%s)", (-1,))
                assert [e.value for e in await other.poll(timeout=5)] == [99]
                assert await other.commit() is CommitOutcome.STORED
            assert tx.outcome is not CommitOutcome.STORED
            async with client.connection() as c:
                cur = await c.execute("SELECT count(*), count(*) FILTER (WHERE position = -1) FROM invoices")
                assert await cur.fetchone() == (10, 0)

    run(main)


def test_idempotent_publish_and_batches_with_event_ids(dsn: str) -> None:
    async def main() -> None:
        async with await aio.connect(dsn) as client:
            await client.create_topic("t", 2)
            a = await client.publish("t", 1, event_id="e-1")
            b = await client.publish("t", 2, event_id="e-1")
            assert b.duplicate and (b.partition, b.position) == (a.partition, a.position)
            n = await client.publish_many("t", [{"value": 3, "event_id": "e-1"},
                                                {"value": 4, "event_id": "e-2"},
                                                {"value": 5, "event_id": "e-2"}])
            assert n == 1
            consumer = await client.consumer("t", "g")
            assert sorted(e.value for e in await consumer.poll(timeout=5)) == [1, 4]

    run(main)


def test_bad_input_gets_the_same_errors_as_the_sync_client(dsn: str) -> None:
    async def main() -> None:
        async with await aio.connect(dsn) as client:
            await client.create_topic("t", 2, config={"max.message.bytes": 2000})
            with pytest.raises(TopicNotFound):
                await client.publish("missing", 1)
            with pytest.raises(pgstreams.InvalidName):
                await client.publish("bad name", 1)
            with pytest.raises(InvalidArgument, match="key"):
                await client.publish("t", 1, key=5)  # type: ignore[arg-type]
            with pytest.raises(InvalidArgument, match="partition 7 out of range"):
                await client.publish("t", 1, partition=7)
            with pytest.raises(MessageTooLarge):
                await client.publish("t", "x" * 5000)
            with pytest.raises(MessageTooLarge):
                await client.publish_many("t", [{"value": 1}, {"value": "x" * 5000}])
            with pytest.raises(InvalidArgument, match="AsyncConnection"):
                await client.publish("t", 1, conn=object())  # type: ignore[arg-type]
            with pytest.raises(InvalidArgument, match="missing 'value'"):
                await client.publish_many("t", [{"key": "k"}])
            consumer = await client.consumer("t", "g")
            with pytest.raises(InvalidArgument, match="max_events"):
                await consumer.poll(max_events=0)
            with pytest.raises(InvalidArgument, match="timeout"):
                await consumer.poll(timeout=-1)
            with pytest.raises(TopicNotFound):
                await client.consumer("missing", "g")
            with pytest.raises(InvalidArgument, match="start"):
                await client.consumer("t", "g2", start="yesterday")  # type: ignore[arg-type]
            # nothing was stored by any of it
            assert await consumer.poll(timeout=0.2) == []
            await client.delete_topic("t")
            with pytest.raises(TopicNotFound):
                await consumer.poll(timeout=0)
        with pytest.raises(pgstreams.ConfigurationError):
            await aio.connect("postgresql://nobody@127.0.0.1:1/none")

    run(main)


def test_async_client_does_not_block_the_event_loop_while_polling(dsn: str) -> None:
    async def main() -> None:
        async with await aio.connect(dsn) as client:
            await client.create_topic("t", 1)
            consumer = await client.consumer("t", "g")
            ticks = 0

            async def ticker() -> None:
                nonlocal ticks
                while True:
                    ticks += 1
                    await asyncio.sleep(0.01)

            task = asyncio.create_task(ticker())
            assert await consumer.poll(timeout=0.5) == []
            task.cancel()
            assert ticks >= 5  # the loop ran other tasks while the poll waited

    run(main)


def test_psycopg_is_async_underneath(dsn: str) -> None:
    async def main() -> None:
        async with await aio.connect(dsn) as client:
            async with client.connection() as c:
                assert isinstance(c, psycopg.AsyncConnection)

    run(main)


def test_fast_paths_keep_every_field_and_survive_statements_the_server_dropped(dsn: str) -> None:
    """Single publishes, polls and commits go straight through libpq on pooled connections: every field
    comes back as published, text and bytes alike, and statements the server no longer holds (DEALLOCATE
    ALL) are prepared again."""
    async def main() -> tuple[list[pgstreams.PublishResult], list[pgstreams.Event]]:
        async with await aio.connect(dsn, pool_size=1) as client:  # one connection: the same session
            await client.create_topic("fields", 2)
            sent = [
                await client.publish("fields", {"n": 1, "s": "é"}, key="ké", headers={"h": "v"},
                                     event_type="T", correlation_id="c1", causation_id="c0"),
                await client.publish("fields", b"\x00\xff raw", partition=1, notify=False),
                await client.publish("fields", "text", key=None, partition=0),
            ]
            consumer = await client.consumer("fields", "g")
            got = await consumer.poll(max_events=10, timeout=5)
            assert await consumer.commit() is CommitOutcome.STORED
            async with client.connection() as conn:
                await conn.execute("DEALLOCATE ALL")
            sent.append(await client.publish("fields", {"after": True}, partition=1))
            got += await consumer.poll(max_events=10, timeout=5)
            assert await consumer.commit() is CommitOutcome.STORED
            assert await consumer.commit(got[:1]) is CommitOutcome.IGNORED
            return sent, got

    sent, got = run(main)
    assert sorted((e.partition, e.position) for e in got) == sorted((r.partition, r.position) for r in sent)
    with pgstreams.connect(dsn) as client:
        consumer = client.consumer("fields", "sync")
        expected = {(e.partition, e.position): e for e in consumer.poll(max_events=10, timeout=5)}
    assert len(expected) == 4
    for e in got:
        s = expected[(e.partition, e.position)]
        assert (e.key, e.value, e.headers, e.event_type, e.correlation_id, e.causation_id, e.created_at) == (
            s.key, s.value, s.headers, s.event_type, s.correlation_id, s.causation_id, s.created_at)
    first = next(e for e in got if e.event_type == "T")
    assert first.value == {"n": 1, "s": "é"} and first.key == "ké" and first.headers == {"h": "v"}
    raw = next(e for e in got if e.partition == 1 and e.position == sent[1].position)
    assert raw.value == b"\x00\xff raw"


def test_an_async_publisher_uses_a_partition_count_raised_elsewhere(dsn: str) -> None:
    key = next(k for k in (f"k{i}" for i in range(1000)) if pgstreams.partition_for_key(k, 8) >= 2)
    new = pgstreams.partition_for_key(key, 8)

    async def main() -> None:
        async with await aio.connect(dsn) as client:
            await client.create_topic("grown", 2)
            await client.create_topic("explicit", 2)
            old = pgstreams.partition_for_key(key, 2)
            assert (await client.publish("grown", "first", key=key)).partition == old  # cached: 2
            await client.publish("explicit", "first")
            with pgstreams.connect(dsn) as other:  # another client raises the counts
                other.alter_topic("grown", partitions=8)
                other.alter_topic("explicit", partitions=4)
            # an explicit partition past the cached count reads the topic again at once
            assert (await client.publish("explicit", "p3", partition=3)).partition == 3
            # keys follow the new count once the client has read the topic's row again (within 0.5 s)
            loop = asyncio.get_running_loop()
            deadline = loop.time() + 30
            while (await client.publish("grown", "after", key=key)).partition != new:
                assert loop.time() < deadline, "the async client kept the old partition count"
                await asyncio.sleep(0.05)

    run(main)
