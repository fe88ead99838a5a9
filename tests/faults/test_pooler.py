"""Behind a connection pooler: PgBouncer (Debian's, installed here when missing) in session mode and in
transaction mode in front of the test server, started by the tests themselves.

Two clients through the pooler publish (single, ``publish_many``, asyncio), read in a consumer group,
run workers and a share group and maintenance at once: no event is lost or delivered twice, and once they
closed, no advisory lock is held and no server connection of the pooler keeps a setting, a prepared
statement, a LISTEN or a temporary table of theirs. In transaction mode (``connect(pooler="transaction")``,
a pool of a few server connections shared by every client connection) one client listens through a
``listen_dsn`` straight to the server and the other polls.

Behind a pooler the process id a connection gets at login is the pooler's cancel key, not the server's
process: ``pg_stat_activity`` never shows it. A publish that waits on a lock for longer than the silence
probe (:data:`pgstreams.storage.libpq.SILENCE_PROBE`) must still be known to run, and a publish whose
connection was lost must wait for the server's session of its attempt to end: stored once.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from contextlib import ExitStack
from typing import Any

import psycopg
import pytest
from bench._servers import PGBOUNCER, pgbouncer

import pgstreams
import pgstreams.aio
from _core_helpers import Background, run_async, wait_until
from _proxy import CuttingProxy, local_port
from _system import debian_package
from pgstreams.maintenance import MaintenanceService
from pgstreams.storage import identity
from pgstreams.storage.libpq import SILENCE_PROBE


def _pgbouncer(server_dsn: str, pool_mode: str, pool_size: int = 50, round_robin: bool = False
               ) -> Iterator[Callable[[str], str]]:
    """PgBouncer (Debian's, installed when missing) in ``pool_mode`` in front of the server of
    ``server_dsn`` (:func:`bench._servers.pgbouncer`); yields the map from a database's DSN to the same
    database through the pooler."""
    debian_package("pgbouncer", PGBOUNCER)
    with pgbouncer(server_dsn, pool_mode, pool_size, round_robin) as through:
        yield through


@pytest.fixture(scope="module")
def session_pooler(server_dsn: str) -> Iterator[Callable[[str], str]]:
    """PgBouncer in session mode in front of the test server."""
    yield from _pgbouncer(server_dsn, "session")


#: Server connections of PgBouncer in transaction mode per database: far fewer than its clients' connections
#: (two clients of up to 10 pooled connections each, their own connections, the asyncio client's), so that
#: server sessions are shared and handed from client to client all the time.
TRANSACTION_POOL_SIZE = 6


@pytest.fixture(scope="module")
def transaction_pooler(server_dsn: str) -> Iterator[Callable[[str], str]]:
    """PgBouncer in transaction mode in front of the test server, handing its idle server connections out in
    turn: consecutive transactions of one client run in different server sessions whenever several are
    idle."""
    yield from _pgbouncer(server_dsn, "transaction", TRANSACTION_POOL_SIZE, round_robin=True)


def _waiting_on(dsn: str, table: str) -> list[float]:
    """How long (seconds, as the server measures) each session waiting for a lock on ``table`` has waited."""
    with psycopg.connect(dsn, autocommit=True) as c:
        rows = c.execute(
            "SELECT extract(epoch FROM now() - a.state_change)::float8 FROM pg_locks l"
            " JOIN pg_stat_activity a ON a.pid = l.pid"
            " WHERE NOT l.granted AND l.relation = %s::regclass", (table,)).fetchall()
    return [r[0] for r in rows]


def _held_past_probe(dsn: str, table: str, count: int) -> list[float]:
    """The waits on ``table``'s lock once the ``count`` waiting publishes all waited past the silence probe
    and its answer, or as soon as more than ``count`` wait (one was sent again)."""
    def done() -> list[float] | None:
        waits = _waiting_on(dsn, table)
        return waits if len(waits) > count or min(waits, default=0.0) > SILENCE_PROBE + 2.0 else None

    return wait_until(done, 60, "the publishes waiting past the silence probe", every=0.2)


def test_a_pooled_connection_knows_its_server_process_not_the_poolers_login_id(
        dsn: str, session_pooler: Callable[[str], str]) -> None:
    """The login's process id behind PgBouncer names no server process; pgstreams reads the server's at set
    up, and that one is the session ``pg_stat_activity`` shows."""
    client = pgstreams.connect(session_pooler(dsn))
    try:
        with client.connection() as c:
            server = c.execute("SELECT pg_backend_pid()").fetchone()
            assert server is not None
            assert identity.server_pid(c.pgconn) == server[0]
            assert identity.pooled(c.pgconn) is True and c.pgconn.backend_pid != server[0]
        with psycopg.connect(dsn, autocommit=True) as direct:
            seen = direct.execute("SELECT count(*) FROM pg_stat_activity WHERE pid = %s",
                                  (server[0],)).fetchone()
            assert seen == (1,)
    finally:
        client.close()
    direct_client = pgstreams.connect(dsn)
    try:
        with direct_client.connection() as c:  # straight to the server the two agree
            assert identity.pooled(c.pgconn) is False
    finally:
        direct_client.close()


def test_publishes_held_on_a_lock_past_the_silence_probe_are_stored_once_behind_pgbouncer(
        dsn: str, session_pooler: Callable[[str], str]) -> None:
    """A single publish, a ``publish_many`` and an asyncio publish wait on a lock on the topic for longer
    than the silence probe, through PgBouncer in session mode: the probe finds their sessions running (by
    the server's process id), no attempt is cut and repeated, and each event is stored exactly once."""
    via = session_pooler(dsn)
    client = pgstreams.connect(via)
    try:
        client.create_topic("held", 1)
        table = _table(dsn, "held")

        async def apublish() -> pgstreams.PublishResult:
            async with await pgstreams.aio.connect(via) as ac:
                return await ac.publish("held", "async")

        with psycopg.connect(dsn) as holder:
            holder.execute(f"LOCK TABLE {table} IN SHARE MODE")  # stops writers
            one = Background(client.publish, "held", "single")
            many = Background(client.publish_many, "held", [{"value": f"batch-{i}"} for i in range(3)])
            aio = Background(run_async, apublish)
            wait_until(lambda: len(_waiting_on(dsn, table)) == 3, 60,
                       "the three publishes waiting on the lock")
            # held until every one has waited past the silence probe and its answer, unless one was sent
            # again meanwhile (then it waits on the lock beside the first)
            assert len(_held_past_probe(dsn, table, 3)) == 3  # none was cut and sent again
            holder.commit()
        single, batch, async_ = (b.result(60, "a publish") for b in (one, many, aio))
        assert isinstance(single, pgstreams.PublishResult) and single.duplicate is False, single
        assert batch == 3
        assert isinstance(async_, pgstreams.PublishResult), async_
        assert sorted(_values(dsn, "held")) == sorted(["single", "async", "batch-0", "batch-1", "batch-2"])
    finally:
        client.close()


def test_a_publish_cut_behind_pgbouncer_waits_for_its_server_session_and_is_stored_once(
        dsn: str, session_pooler: Callable[[str], str]) -> None:
    """A publish waits on a lock; its connection to the pooler is then cut silently (a TCP proxy between
    the client and PgBouncer closes the pooler's side). The server's session of the attempt goes on
    waiting: the silence probe must see it running until the lock is released, and when it ended (it
    committed, then found its client gone), the retry finds the event instead of storing it again."""
    proxy = CuttingProxy(session_pooler(dsn))
    client = pgstreams.connect(proxy.dsn, retry_timeout=60)
    try:
        client.create_topic("cut", 1)
        client.publish("cut", "before")  # makes the producer's own connection
        table = _table(dsn, "cut")
        own = client._producer._own  # the producer's own connection, made by that publish
        assert own is not None and identity.pooled(own.pgconn) is True
        server = identity.server_pid(own.pgconn)
        with psycopg.connect(dsn) as holder:
            holder.execute(f"LOCK TABLE {table} IN SHARE MODE")
            publish = Background(client.publish, "cut", "once")
            wait_until(lambda: _waiting_on(dsn, table) != [], 60, "the publish waiting on the lock")
            proxy.cut(local_port(own))
            # the client waits past the silence probe; its attempt's server session still waits on the lock
            assert len(_held_past_probe(dsn, table, 1)) == 1  # not sent again meanwhile
            holder.commit()
        got = publish.result(SILENCE_PROBE + 60, "the publish on the cut connection")
        assert isinstance(got, pgstreams.PublishResult), got
        assert _values(dsn, "cut") == ["before", "once"]
        with psycopg.connect(dsn, autocommit=True) as c:
            gone = c.execute("SELECT count(*) FROM pg_stat_activity WHERE pid = %s", (server,)).fetchone()
        assert gone == (0,)  # the retry waited for it
    finally:
        client.close()
        proxy.close()


#: Events each of the two clients publishes to each topic of the scenario, one by one and with
#: ``publish_many``; the asyncio client publishes :data:`AIO_EVENTS` more.
EVENTS = 40
AIO_EVENTS = 10
#: The parameters PgBouncer itself sets on the server connections it links a client to (the client's own
#: startup parameters): what a session shows as set by the session besides what pgstreams would leave.
POOLER_TRACKED = frozenset({"application_name", "client_encoding", "datestyle", "intervalstyle", "timezone",
                            "standard_conforming_strings"})
#: What a server connection keeps of the sessions it served: its settings changed by a session (with
#: pgstreams' own, which pg_settings does not list), its named prepared statements, the channels it listens
#: to and its temporary tables.
SESSION_STATE = ("SELECT pg_backend_pid(),"
                 " array(SELECT lower(name) FROM pg_settings WHERE source = 'session'"
                 "       UNION ALL SELECT n FROM unnest(ARRAY['pgstreams.poll_fences',"
                 "       'pgstreams.poll_fences_clean']) AS n"
                 "        WHERE current_setting(n, true) <> '' ORDER BY 1),"
                 " array(SELECT name FROM pg_prepared_statements ORDER BY 1),"
                 " array(SELECT pg_listening_channels() ORDER BY 1),"
                 " array(SELECT relname::text FROM pg_class"
                 "  WHERE relnamespace = pg_my_temp_schema() ORDER BY 1)")


def _publish_everywhere(via: str, a: pgstreams.Client, b: pgstreams.Client, topics: list[str],
                        options: dict[str, Any]) -> dict[str, list[str]]:
    """Client ``a`` publishes :data:`EVENTS` events one by one to each of ``topics`` while ``b`` publishes
    as many with ``publish_many`` (batches of 10, with event ids) and an asyncio client :data:`AIO_EVENTS`,
    all at once; the values published, per topic."""
    def singles() -> None:
        for i in range(EVENTS):
            for t in topics:
                a.publish(t, f"{t}-a-{i}", key=f"k{i}")

    def batches() -> int:
        return sum(b.publish_many(t, [{"value": f"{t}-b-{i}", "key": f"k{i}", "event_id": f"{t}-b-{i}"}
                                      for i in range(j, j + 10)])
                   for j in range(0, EVENTS, 10) for t in topics)

    async def aio() -> int:
        async with await pgstreams.aio.connect(via, **options) as ac:
            for i in range(AIO_EVENTS):
                for t in topics:
                    await ac.publish(t, f"{t}-aio-{i}")
        return AIO_EVENTS * len(topics)

    runs = [Background(singles), Background(batches), Background(run_async, aio)]
    outcomes = [r.result(180, "a publisher") for r in runs]
    assert outcomes == [None, EVENTS * len(topics), AIO_EVENTS * len(topics)], outcomes
    return {t: sorted([f"{t}-a-{i}" for i in range(EVENTS)] + [f"{t}-b-{i}" for i in range(EVENTS)]
                      + [f"{t}-aio-{i}" for i in range(AIO_EVENTS)]) for t in topics}


def _read_as_group(a: pgstreams.Client, b: pgstreams.Client, topic: str, total: int) -> list[str]:
    """The values a consumer group reads of ``topic`` (partitions 0-1 through ``a``, 2-3 through ``b``),
    committing after each poll, until ``total`` were read (or 120 s passed)."""
    consumers = [pgstreams.Consumer(a, topic, "g", partitions=[0, 1]),
                 pgstreams.Consumer(b, topic, "g", partitions=[2, 3])]
    got: list[str] = []
    deadline = time.monotonic() + 120
    while len(got) < total and time.monotonic() < deadline:
        for consumer in consumers:
            events = consumer.poll(max_events=25, timeout=0.2)
            got += [e.value for e in events]
            if events:
                consumer.commit()
    for consumer in consumers:  # every checkpoint was stored: nothing is left to read
        assert consumer.poll(max_events=25, timeout=0.2) == []
    return sorted(got)


def _work_in_two_workers(dsn: str, a: pgstreams.Client, b: pgstreams.Client, topic: str, total: int
                         ) -> list[tuple[int, int]]:
    """Two workers (one per client) in group ``wg`` handle ``topic`` in transactional mode, each handler
    recording its event in table ``handled`` in the transaction that stores the checkpoint, until
    ``total`` were recorded; the ``(partition, position)`` of every row recorded."""
    def handle(event: pgstreams.Event, conn: psycopg.Connection) -> None:
        conn.execute("INSERT INTO handled (partition, position) VALUES (%s, %s)",
                     (event.partition, event.position))

    workers = [pgstreams.Worker(c, install_signal_handlers=False, maintenance=None) for c in (a, b)]
    for w in workers:
        w.subscribe(topic, "wg", handle, mode="transactional", heartbeat_interval=0.5, session_timeout=10)
        w.start()
    try:
        with psycopg.connect(dsn, autocommit=True) as direct:
            def recorded() -> bool:
                row = direct.execute("SELECT count(*) FROM handled").fetchone()
                for w in workers:
                    assert w.failure is None, w.failure
                return row is not None and row[0] >= total
            wait_until(recorded, 180, f"the workers handling {total} events", every=0.2)
    finally:
        for w in workers:
            w.stop(30)
    with psycopg.connect(dsn, autocommit=True) as direct:
        return [(int(p), int(q)) for p, q in direct.execute("SELECT partition, position FROM handled")]


def _share(a: pgstreams.Client, b: pgstreams.Client, topic: str, total: int) -> list[str]:
    """The values two share consumers of group ``sg`` (one per client) acquire and ack, taking turns,
    until ``total`` were acked (or 120 s passed)."""
    consumers = [a.share_consumer(topic, "sg"), b.share_consumer(topic, "sg")]
    got: list[str] = []
    deadline = time.monotonic() + 120
    while len(got) < total and time.monotonic() < deadline:
        for consumer in consumers:
            events = consumer.poll(max_events=15, timeout=0.2)
            if events:
                consumer.ack(events)
                got += [e.value for e in events]
    return sorted(got)


def _maintain_from_both(a: pgstreams.Client, b: pgstreams.Client) -> None:
    """Both clients run a maintenance pass at once: each ends (one waits for the other's). Then two
    maintenance services (one per client): exactly one leads; once it stops, the other takes over."""
    runs = [Background(a.maintain), Background(b.maintain)]
    for r in runs:
        report = r.result(120, "a maintenance pass")
        assert isinstance(report, pgstreams.MaintenanceReport), report
    first, second = MaintenanceService(a, 60), MaintenanceService(b, 60)
    try:
        first.step()
        second.step()
        assert (first.leader, second.leader) == (True, False)
        second.step()
        assert not second.leader  # still led by the first
        first.finish()

        def takes_over() -> bool:
            second.step()
            return second.leader
        wait_until(takes_over, 60, "the second maintenance service to lead", every=0.2)
    finally:
        first.finish()
        second.finish()


def _advisory_locks(dsn: str) -> list[tuple[Any, ...]]:
    """The advisory locks held or awaited in the database of ``dsn`` (asked straight to the server)."""
    with psycopg.connect(dsn, autocommit=True) as direct:
        return direct.execute(
            "SELECT pid, classid, objid, objsubid, granted FROM pg_locks WHERE locktype = 'advisory'"
            " AND database = (SELECT oid FROM pg_database WHERE datname = current_database())").fetchall()


def _pooled_sessions(dsn: str, via: str
                     ) -> list[tuple[int, list[str], list[str], list[str], list[str]]]:
    """What every server connection the pooler holds to the database of ``dsn`` keeps of the sessions it
    served (:data:`SESSION_STATE`, without the pooler's own parameters). Each is reached through the pooler
    by a transaction of its own, all held open at once, so the pooler hands each a different server
    connection; the server then runs no session of the database besides them and the asking one.

    The pooler may open a server connection while this walks them (one it launched for a client that was
    then served by a connection freed meanwhile): the walk goes on, a transaction more while a server session
    is not yet reached, until every server session of the database is one of those reached."""
    with psycopg.connect(dsn, autocommit=True) as direct, ExitStack() as stack:
        others = ("SELECT pid FROM pg_stat_activity"
                  " WHERE datname = current_database() AND pid <> pg_backend_pid()")
        seen: list[tuple[int, list[str], list[str], list[str], list[str]]] = []
        deadline = time.monotonic() + 60
        while True:
            servers = {int(r[0]) for r in direct.execute(others).fetchall()}
            unreached = servers - {s[0] for s in seen}
            if not unreached:
                return seen
            assert time.monotonic() < deadline, ("server sessions never reached through the pooler",
                                                 unreached, seen)
            # one at a time, asking again after each: a session that was ending is not chased
            # not autocommit: its transaction holds its server connection until the block ends
            conn = stack.enter_context(psycopg.connect(via, prepare_threshold=None))
            pid, settings, prepared, channels, temporary = conn.execute(  # type: ignore[misc]
                SESSION_STATE).fetchone()
            settings = [s for s in settings if s not in POOLER_TRACKED]
            assert pid not in {s[0] for s in seen}, (pid, seen)  # each held: a different one
            seen.append((pid, settings, prepared, channels, temporary))


def _two_clients(dsn: str, via: str, options: dict[str, Any] | None = None,
                 listening: dict[str, Any] | None = None) -> None:
    """The scenario of two clients through the pooler at ``via`` (``options``: of ``connect()``, both;
    ``listening``: more of the first's): every event published once is read once by a consumer group,
    handled once by workers and acked once by a share group; maintenance runs from both, one leader at a
    time; afterwards no advisory lock is held and the pooler's server connections keep nothing of the
    clients' sessions."""
    options = options or {}
    with psycopg.connect(dsn, autocommit=True) as direct:
        direct.execute("CREATE TABLE handled (partition int NOT NULL, position bigint NOT NULL)")
    a = pgstreams.connect(via, **options, **(listening or {}))
    b = pgstreams.connect(via, **options)
    try:
        a.create_topic("stream", 4)
        b.create_topic("work", 2)
        a.create_topic("jobs", 2)
        published = _publish_everywhere(via, a, b, ["stream", "work", "jobs"], options)
        total = 2 * EVENTS + AIO_EVENTS
        assert _read_as_group(a, b, "stream", total) == published["stream"]  # none lost, none twice
        handled = _work_in_two_workers(dsn, a, b, "work", total)
        assert len(handled) == len(set(handled)) == total  # each handled once
        assert sorted(_values(dsn, "work")) == published["work"]
        assert _share(a, b, "jobs", total) == published["jobs"]
        _maintain_from_both(a, b)
    finally:
        a.close()
        b.close()
    wait_until(lambda: _advisory_locks(dsn) == [], 30, "no advisory lock held", every=0.2)
    sessions = _pooled_sessions(dsn, via)
    kept = [s for s in sessions if s[1:] != ([], [], [], [])]
    assert sessions and kept == [], kept


def test_two_clients_behind_pgbouncer_in_session_mode_lose_nothing_and_leave_nothing(
        dsn: str, session_pooler: Callable[[str], str]) -> None:
    """Through PgBouncer in session mode, two clients publish, read as a group, work, share and maintain:
    nothing lost or duplicated, no advisory lock left, and the pooler's server connections keep nothing of
    their sessions (the pooler resets a server connection when its client leaves)."""
    _two_clients(dsn, session_pooler(dsn))


def test_two_clients_behind_pgbouncer_in_transaction_mode_lose_nothing_and_leave_nothing(
        dsn: str, transaction_pooler: Callable[[str], str]) -> None:
    """Through PgBouncer 1.18 in transaction mode (no prepared-statement support of its own; a few server
    connections shared by every client connection), two clients with ``pooler="transaction"`` publish,
    read as a group, work, share and maintain: nothing lost or duplicated, one maintenance leader at a
    time, no advisory lock left, and no server connection keeps a setting, a named prepared statement or a
    LISTEN of theirs (the pooler resets nothing between transactions). The first client listens through a
    ``listen_dsn`` straight to the server; the second polls."""
    _two_clients(dsn, transaction_pooler(dsn), {"pooler": "transaction"}, {"listen_dsn": dsn})


def test_a_client_in_session_mode_behind_a_transaction_pooler_is_warned(
        dsn: str, transaction_pooler: Callable[[str], str], session_pooler: Callable[[str], str],
        caplog: pytest.LogCaptureFixture) -> None:
    """Connecting without ``pooler="transaction"`` through a pooler that runs consecutive transactions in
    different server sessions logs a warning naming the option; with the option, or through a session
    pooler, nothing is logged."""
    via = transaction_pooler(dsn)
    with ExitStack() as stack:  # several server sessions, idle once these end: the pooler hands them in turn
        for _ in range(3):
            stack.enter_context(psycopg.connect(via)).execute("SELECT 1")
    warned = "transaction pooling): connect with pooler=\"transaction\""
    with caplog.at_level("WARNING", logger="pgstreams.session"):
        pgstreams.connect(via, pooler="transaction").close()
        pgstreams.connect(session_pooler(dsn)).close()
        assert warned not in caplog.text
        pgstreams.connect(via, retry_timeout=5).close()
        assert warned in caplog.text


def _values(dsn: str, topic: str) -> list[Any]:
    """The values of every event of ``topic``, in order (read straight from the server)."""
    with pgstreams.connect(dsn) as c:
        consumer = c.consumer(topic, "count")
        values: list[Any] = []
        while got := consumer.poll(max_events=100, timeout=0.2):
            values += [e.value for e in got]
    return values


def _table(dsn: str, topic: str) -> str:
    """The event table of ``topic``."""
    with psycopg.connect(dsn, autocommit=True) as c:
        row = c.execute("SELECT format('pgstreams.topic_%%s', id) FROM pgstreams.topics WHERE name = %s",
                        (topic,)).fetchone()
    assert row is not None
    return str(row[0])
