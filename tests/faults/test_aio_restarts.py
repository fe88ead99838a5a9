"""The asyncio client (``pgstreams.aio``) through server restarts, killed connections and unknown commit
outcomes: the same guarantees as the sync client's (``test_restarts.py``).

Each test runs against a PostgreSQL of this module's own (``restartable_server``), restarted by the test
(fast and immediate shutdowns) or whose pgstreams sessions it terminates. Every test ends by counting
what was stored and handled: every event exactly once (no duplicate stored by a retried publish), no call
raising while the outage lasted less than the client's ``retry_timeout``, and one ``ConnectionLost``
without the password after it. An unknown commit outcome is made for real: commits wait for a
synchronous standby that does not exist, and the test terminates the publishing session while it waits
(its transaction has committed locally by then, which the client cannot know).
"""

from __future__ import annotations

import asyncio
import functools
import time
import uuid
from collections import Counter
from collections.abc import Awaitable, Callable, Iterator
from typing import Any

import psycopg
import pytest
from psycopg.conninfo import conninfo_to_dict, make_conninfo

import pgstreams
from _core_helpers import new_database, run_async
from pgstreams import aio
from pgstreams.embedded import TemporaryServer, restartable_server

pytestmark = pytest.mark.timeout(300)


@pytest.fixture(scope="module")
def server() -> Iterator[TemporaryServer]:
    # fsync off (the machine does not crash), synchronous commit on: an immediate shutdown loses nothing
    # committed
    with restartable_server({"fsync": "off"}) as srv:
        yield srv


@pytest.fixture
def db(server: TemporaryServer) -> Iterator[str]:
    yield new_database(server.dsn, "ar_")


async def _until(cond: Callable[[], bool], timeout: float, what: str) -> None:
    """Return once ``cond()`` is true, checking every 20 ms on the event loop; fail with ``what`` when
    ``timeout`` seconds pass first."""
    deadline = time.monotonic() + timeout
    while not cond():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {what}")
        await asyncio.sleep(0.02)


async def _until_async(cond: Callable[[], Awaitable[Any]], timeout: float, what: str) -> Any:
    """The first truthy ``await cond()``, asked every 20 ms; fail with ``what`` after ``timeout`` s."""
    deadline = time.monotonic() + timeout
    while not (got := await cond()):
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {what}")
        await asyncio.sleep(0.02)
    return got


def _stored(dsn: str, topic: str) -> Counter[object]:
    """How many times each value is stored in ``topic`` (read by the sync client)."""
    with pgstreams.connect(dsn) as c:
        consumer = c.consumer(topic, f"count-{uuid.uuid4().hex[:6]}")
        out: Counter[object] = Counter()
        while got := consumer.poll(max_events=1000, timeout=0.2):
            out.update(e.value for e in got)
            consumer.commit(got)
        return out


class _Publisher:
    """Publishes ``first, first + 1, ...`` (single events, or batches of 10) in a task until stopped;
    records errors."""

    def __init__(self, client: aio.AsyncClient, topic: str, batch: bool = False, first: int = 0) -> None:
        self.client, self.topic, self.batch = client, topic, batch
        self.first = self.sent = first
        self.errors: list[BaseException] = []
        self.stop = False
        self.task: asyncio.Task[None] = asyncio.get_running_loop().create_task(self._run())

    @property
    def count(self) -> int:
        return self.sent - self.first

    async def _run(self) -> None:
        while not self.stop:
            try:
                if self.batch:
                    await self.client.publish_many(self.topic, [{"value": self.sent + i} for i in range(10)])
                    self.sent += 10
                else:
                    await self.client.publish(self.topic, self.sent, key=str(self.sent % 7))
                    self.sent += 1
            except BaseException as exc:  # noqa: BLE001 - the test asserts there are none
                self.errors.append(exc)
                return

    async def finish(self) -> None:
        self.stop = True
        await asyncio.wait_for(self.task, 60)


@pytest.mark.parametrize("mode", ["fast", "immediate"])
@pytest.mark.parametrize("batch", [False, True], ids=["publish", "publish_many"])
def test_async_publishes_ride_through_a_restart_and_store_each_event_once(server: TemporaryServer, db: str,
                                                                          mode: str, batch: bool) -> None:
    """Two publishing tasks (single publishes: one on the client's own connection, one on pooled ones
    while the other holds it; or two ``publish_many``) while the server restarts."""

    async def main() -> list[_Publisher]:
        async with await aio.connect(db, retry_timeout=60) as client:
            await client.create_topic("t", 3)
            pubs = [_Publisher(client, "t", batch), _Publisher(client, "t", batch, first=10_000_000)]
            await _until(lambda: all(p.count >= 50 for p in pubs), 30, "publishes before the restart")
            await asyncio.to_thread(server.restart, mode, 0.5)
            at = [p.count for p in pubs]
            await _until(lambda: all(p.count >= a + 50 for p, a in zip(pubs, at, strict=True))
                         or any(p.errors for p in pubs), 120, "publishes after the restart")
            for p in pubs:
                await p.finish()
            assert [p.errors for p in pubs] == [[], []]
            assert client.retry.retried > 0  # the restart was met, and ridden through
            return pubs

    pubs = run_async(main)
    stored = _stored(db, "t")
    expected = set(range(pubs[0].sent)) | set(range(10_000_000, pubs[1].sent))
    assert set(stored) == expected  # none lost
    assert max(stored.values()) == 1  # none duplicated


@pytest.mark.parametrize("mode", ["fast", "immediate"])
def test_async_polls_and_commits_ride_through_a_restart(server: TemporaryServer, db: str, mode: str) -> None:
    async def main() -> None:
        async with await aio.connect(db, retry_timeout=60) as client:
            await client.create_topic("t", 2)
            await client.publish_many("t", [{"value": i} for i in range(400)])
            consumer = await client.consumer("t", "g")
            seen: list[int] = []
            outcomes: list[pgstreams.CommitOutcome] = []
            restarted = False
            deadline = time.monotonic() + 120
            while len(set(seen)) < 400:
                assert time.monotonic() < deadline, f"read {len(set(seen))} of 400 events"
                got = await consumer.poll(max_events=20, timeout=1.0)
                seen.extend(e.value for e in got)
                if len(seen) >= 100 and not restarted:
                    # the next poll and commit meet a pool of dead connections
                    await asyncio.to_thread(server.restart, mode, 0.5)
                    restarted = True
                if got:
                    outcomes.append(await consumer.commit(got))
            assert sorted(set(seen)) == list(range(400))
            assert len(seen) == 400  # each event read once: no commit was lost or repeated
            assert set(outcomes) <= {pgstreams.CommitOutcome.STORED, pgstreams.CommitOutcome.IGNORED}
            assert client.retry.retried > 0
            assert await consumer.poll(max_events=10, timeout=0.1) == []
            status = await client.describe_group("g", "t")
            assert sum(s.lag for s in status) == 0

    run_async(main)


def test_an_async_transaction_gets_a_live_connection_after_a_restart(server: TemporaryServer,
                                                                     db: str) -> None:
    """The pool's connections all died with the server: the transaction's BEGIN is retried on a fresh one,
    and the events and the handler's writes are committed once."""

    async def main() -> None:
        async with await aio.connect(db, retry_timeout=60, pool_size=3) as client:
            async with client.connection() as c:
                await c.execute("CREATE TABLE handled (value int)")
            await client.create_topic("t", 2)
            await client.publish_many("t", [{"value": i} for i in range(50)])
            consumer = await client.consumer("t", "g")
            async with consumer.transaction() as tx:
                for e in await tx.poll(max_events=10, timeout=5):
                    await tx.connection.execute("INSERT INTO handled VALUES (%s)", (e.value,))
            assert tx.outcome is pgstreams.CommitOutcome.STORED
            await asyncio.to_thread(server.restart, "immediate", 0.5)
            deadline = time.monotonic() + 60
            while True:
                async with consumer.transaction() as tx:
                    got = await tx.poll(max_events=10, timeout=1)
                    for e in got:
                        await tx.connection.execute("INSERT INTO handled VALUES (%s)", (e.value,))
                if not got:
                    break
                assert tx.outcome is pgstreams.CommitOutcome.STORED
                assert time.monotonic() < deadline
            assert client.retry.retried > 0
            async with client.connection() as c:
                cur = await c.execute("SELECT value FROM handled ORDER BY value")
                assert [r[0] for r in await cur.fetchall()] == list(range(50))  # exactly once

    run_async(main)


def test_async_connection_lost_after_retry_timeout_names_the_server_without_its_password(
        server: TemporaryServer, db: str) -> None:
    secret = "s3cr3t-pw"
    dsn = make_conninfo(db, password=secret)  # trust authentication ignores it

    async def main() -> None:
        async with await aio.connect(dsn, retry_timeout=1.0) as client:
            await client.create_topic("t", 1)
            await client.publish("t", "before")
            consumer = await client.consumer("t", "g")
            before = await consumer.poll(timeout=5)
            await consumer.commit(before)
            await asyncio.to_thread(server.stop, "fast")
            try:
                calls: dict[str, Callable[[], Awaitable[Any]]] = {
                    "publish": lambda: client.publish("t", "during"),
                    "publish_many": lambda: client.publish_many("t", [{"value": "during-many"}]),
                    "poll": lambda: consumer.poll(timeout=0.1),
                    "commit": lambda: consumer.commit(before),
                    "seek": consumer.seek_to_beginning,
                }
                for name, call in calls.items():
                    started = time.monotonic()
                    with pytest.raises(pgstreams.ConnectionLost) as info:
                        await call()
                    assert time.monotonic() - started < 30, name
                    assert isinstance(info.value, pgstreams.PgStreamsError)
                    message = str(info.value)
                    assert "127.0.0.1" in message and secret not in message, (name, message)
                with pytest.raises(pgstreams.ConnectionLost) as info:
                    async with consumer.transaction():
                        pass
                assert secret not in str(info.value)
                assert secret not in repr(client)
            finally:
                await asyncio.to_thread(server.start)
            assert (await client.publish("t", "after")).position > 0  # the same client works again
            assert [e.value for e in await consumer.poll(timeout=5)][-1] == "after"

    run_async(main)
    assert set(_stored(db, "t")) <= {"before", "during", "during-many", "after"}


def test_async_killed_connections_under_load_lose_and_duplicate_nothing(server: TemporaryServer,
                                                                        db: str) -> None:
    """pg_terminate_backend of random pgstreams sessions every 200 ms for 6 s while a single and a batch
    publisher and a consumer (poll and commit) run on one async client."""
    dbname = str(conninfo_to_dict(db)["dbname"])

    async def main() -> tuple[_Publisher, _Publisher, Counter[object]]:
        async with await aio.connect(db, retry_timeout=60) as client:
            await client.create_topic("t", 3)
            consumer = await client.consumer("t", "g")
            single = _Publisher(client, "t")
            batch = _Publisher(client, "t", batch=True, first=10_000_000)
            seen: Counter[object] = Counter()
            errors: list[BaseException] = []
            stop = False

            async def consume() -> None:
                try:
                    while not stop:
                        got = await consumer.poll(max_events=100, timeout=0.2)
                        seen.update(e.value for e in got)
                        if got:
                            await consumer.commit(got)
                except BaseException as exc:  # noqa: BLE001 - asserted below
                    errors.append(exc)

            reader = asyncio.get_running_loop().create_task(consume())
            killed = 0
            async with await psycopg.AsyncConnection.connect(server.dsn, autocommit=True) as admin:
                deadline = time.monotonic() + 6.0
                while time.monotonic() < deadline:
                    cur = await admin.execute(
                        "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE datname = %s "
                        "AND pid <> pg_backend_pid() ORDER BY random() LIMIT 1", (dbname,))
                    row = await cur.fetchone()
                    killed += bool(row and row[0])
                    await asyncio.sleep(0.2)  # the pace of the faults, not a synchronisation
            await single.finish()
            await batch.finish()
            assert single.errors == [] and batch.errors == []
            await _until(lambda: sum(seen.values()) >= single.count + batch.count or bool(errors), 60,
                         "the consumer to catch up")
            stop = True
            await asyncio.wait_for(reader, 30)
            assert errors == []
            assert killed > 5
            assert client.retry.retried > 0
            return single, batch, seen

    single, batch, seen = run_async(main)
    stored = _stored(db, "t")
    expected = set(range(single.sent)) | set(range(10_000_000, batch.sent))
    assert set(stored) == expected and max(stored.values()) == 1
    assert expected <= set(seen)  # at least once


# -- unknown commit outcomes --------------------------------------------------------------------------------

_ABSENT_STANDBY = "pgstreams_absent_standby"


async def _sync_rep_waiters(admin: psycopg.AsyncConnection, dbname: str, publishes: bool = False
                            ) -> list[int]:
    """The sessions of database ``dbname`` whose commit waits for the standby (``publishes``: only those
    whose last statement inserted or copied events, not a notifier's, nor a probe of :func:`_hold_commits`
    that was terminated but is still listed while it ends)."""
    cur = await admin.execute(
        "SELECT pid FROM pg_stat_activity WHERE datname = %s AND wait_event = 'SyncRep'"
        " AND (NOT %s OR (query ~* '(insert|copy)' AND query !~ 'sync_rep_probe'))", (dbname, publishes))
    return [int(r[0]) for r in await cur.fetchall()]


async def _hold_commits(admin: psycopg.AsyncConnection, db: str) -> None:
    """Make every commit that wrote something wait for a synchronous standby that does not exist (the
    transaction commits locally, then waits); return once a probe transaction was seen waiting so."""
    dbname = str(conninfo_to_dict(db)["dbname"])
    async with await psycopg.AsyncConnection.connect(db, autocommit=True) as setup:
        await setup.execute("CREATE TABLE IF NOT EXISTS sync_rep_probe (x int)")
    await admin.execute(f"ALTER SYSTEM SET synchronous_standby_names = '{_ABSENT_STANDBY}'")
    await admin.execute("SELECT pg_reload_conf()")
    deadline = time.monotonic() + 30
    while True:  # the setting takes effect once the checkpointer read it: probe until a commit waits
        async with await psycopg.AsyncConnection.connect(db, autocommit=True) as probe:
            pid = probe.info.backend_pid
            insert = probe.execute("INSERT INTO sync_rep_probe VALUES (1)")
            task = asyncio.get_running_loop().create_task(insert)
            try:
                seen = await _until_async(functools.partial(_probe_waits, admin, dbname, pid, task), 2,
                                          "the probe")
            except AssertionError:
                seen = False
            if seen is True:
                # waits (up to 10 s) until the probe's backend has exited, so it is no longer listed
                await admin.execute("SELECT pg_terminate_backend(%s, 10000)", (pid,))
            await asyncio.wait([task], timeout=10)
            if not task.cancelled():
                task.exception()  # the terminated probe's error, retrieved
        if seen is True:
            return
        assert time.monotonic() < deadline, "commits never waited for the absent standby"


async def _probe_waits(admin: psycopg.AsyncConnection, dbname: str, pid: int, task: asyncio.Task[Any]
                       ) -> bool | str:
    """True once the probe ``pid`` waits for the standby; "done" if its commit did not wait."""
    if pid in await _sync_rep_waiters(admin, dbname):
        return True
    return "done" if task.done() else False


async def _release_commits(admin: psycopg.AsyncConnection) -> None:
    await admin.execute("ALTER SYSTEM RESET synchronous_standby_names")
    await admin.execute("SELECT pg_reload_conf()")


@pytest.mark.parametrize("path", ["own", "pooled", "publish_many"])
def test_an_async_publish_killed_during_its_commit_is_stored_once(server: TemporaryServer, db: str,
                                                                  path: str) -> None:
    """The connection breaks while COMMIT waits (the transaction committed locally, the client cannot know):
    the publish is retried, waits until the killed session ended, finds its producer tag and returns the
    events of the first attempt instead of storing them again (the sequence hands out no new position)."""
    dbname = str(conninfo_to_dict(db)["dbname"])

    async def main() -> None:
        async with await aio.connect(db, retry_timeout=60) as client, \
                await psycopg.AsyncConnection.connect(server.dsn, autocommit=True) as admin:
            await client.create_topic("t", 2)
            await client.publish("t", "warm-up")  # draws the producer id, opens the own connection
            tid = (await client.topic_state("t")).id
            await _hold_commits(admin, db)
            try:
                if path == "publish_many":
                    call: Awaitable[Any] = client.publish_many("t", [{"value": f"m{i}"} for i in range(5)])
                elif path == "own":
                    call = client.publish("t", "once", key="k")
                else:
                    await client._own_lock.acquire()  # the own connection is busy: a pooled one is used
                    call = client.publish("t", "once", key="k")
                task: asyncio.Task[Any] = asyncio.get_running_loop().create_task(call)  # type: ignore[arg-type]
                waiting = await _until_async(lambda: _sync_rep_waiters(admin, dbname, publishes=True), 30,
                                             "the publish's commit to wait for the standby")
                last = await client.store.last_position(tid)  # the positions the attempt took
                # waits until each killed session has exited: released before that, the commit could end its
                # wait normally (the standby setting gone) and answer the client before the session dies
                cur = await admin.execute(
                    "SELECT bool_and(pg_terminate_backend(pid, 30000)) FROM unnest(%s::int[]) AS pid",
                    (waiting,))
                assert (await cur.fetchone()) == (True,), "a killed session did not exit within 30 s"
            finally:
                await _release_commits(admin)
            result = await asyncio.wait_for(task, 60)
            if client._own_lock.locked():
                client._own_lock.release()
            assert client.retry.retried > 0  # the publish did meet the broken connection
            assert await client.store.last_position(tid) == last  # nothing was inserted again
            if path == "publish_many":
                assert result == 5
            else:
                assert result.position == last  # the first attempt's event, found by its tag

    run_async(main)
    stored = _stored(db, "t")
    if path == "publish_many":
        assert stored == Counter({"warm-up": 1, **{f"m{i}": 1 for i in range(5)}})
    else:
        assert stored == Counter({"warm-up": 1, "once": 1})
