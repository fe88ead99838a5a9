"""A consumer's ``commit(durable=False)`` does not wait for the disk flush; ``commit()`` does.

The module's own PostgreSQL names a synchronous standby that never connects: every commit that waits for
its WAL to be flushed (``synchronous_commit = on``) then waits forever, in the ``SyncRep`` wait event,
while one that does not (``off``) returns at once. The set-up (creating the database, the topic, its
events and the group's checkpoints) connects with ``synchronous_commit = local``.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator

import psycopg
import pytest
from psycopg.conninfo import make_conninfo

import pgstreams
from _core_helpers import new_database, until
from pgstreams.embedded import TemporaryServer, restartable_server

pytestmark = pytest.mark.timeout(90)


@pytest.fixture(scope="module")
def server() -> Iterator[TemporaryServer]:
    with restartable_server({"fsync": "off", "synchronous_standby_names": "pgstreams_absent_standby"}) as srv:
        yield srv


@pytest.fixture
def db(server: TemporaryServer) -> Iterator[str]:
    dsn = new_database(server.dsn, "f_", options="-c synchronous_commit=local")
    local = make_conninfo(dsn, options="-c synchronous_commit=local")
    with pgstreams.connect(local) as client:  # migrations and events without waiting for the standby
        client.create_topic("t", 2)
        client.publish_many("t", [{"value": i} for i in range(10)])
        client.consumer("t", "g")  # the group's checkpoints (the tests' consumers find them)
    yield dsn


def _sync_rep_waiters(dsn: str) -> list[int]:
    with psycopg.connect(dsn, autocommit=True, options="-c synchronous_commit=local") as c:
        return [r[0] for r in c.execute(
            "SELECT pid FROM pg_stat_activity WHERE wait_event = 'SyncRep' AND datname = current_database()")]


def test_a_lazy_commit_does_not_wait_for_the_flush(db: str) -> None:
    with pgstreams.connect(db) as client:
        consumer = client.consumer("t", "g")
        got = consumer.poll(max_events=10, timeout=5)
        assert len(got) == 10
        done: list[pgstreams.CommitOutcome] = []
        t = threading.Thread(target=lambda: done.append(consumer.commit(durable=False)), daemon=True)
        t.start()
        t.join(60)  # a commit waiting for the flush would wait for the absent standby forever
        assert done == [pgstreams.CommitOutcome.STORED]
        assert _sync_rep_waiters(db) == []
        # stored and visible at once to the group
        assert sum(s.lag for s in client.describe_group("g", "t")) == 0
        assert client.consumer("t", "g").poll(max_events=10, timeout=0.2) == []


def test_a_default_commit_waits_for_the_flush(db: str) -> None:
    with pgstreams.connect(db, retry_timeout=5) as client:
        consumer = client.consumer("t", "g")
        assert len(consumer.poll(max_events=10, timeout=5)) == 10
        outcome: list[object] = []

        def commit() -> None:
            try:
                outcome.append(consumer.commit())
            except Exception as exc:  # noqa: BLE001 - recorded for the assertion below
                outcome.append(exc)

        t = threading.Thread(target=commit, daemon=True)
        t.start()
        until(lambda: len(_sync_rep_waiters(db)) == 1, 60, "the commit waiting for its flush")
        assert outcome == []
        # cancelling the wait ends the call (the commit is kept locally, PostgreSQL warns)
        with psycopg.connect(db, autocommit=True, options="-c synchronous_commit=local") as c:
            c.execute("SELECT pg_cancel_backend(%s)", (_sync_rep_waiters(db)[0],))
        t.join(60)
        assert not t.is_alive()


def test_commit_rejects_a_durable_that_is_not_a_bool(db: str) -> None:
    with pgstreams.connect(db) as client:
        consumer = client.consumer("t", "g")
        consumer.poll(max_events=10, timeout=5)
        with pytest.raises(pgstreams.InvalidArgument, match="durable must be a bool"):
            consumer.commit(durable="yes")  # type: ignore[arg-type]
        assert sum(s.lag for s in client.describe_group("g", "t")) == 10  # nothing stored
