"""Change data capture against a server with wal_level = logical (:func:`logical_server`): events of
inserts, updates (key changes included), deletes and truncates; schema changes mid-stream; the built-in
types; TOASTed values; rolled-back transactions; the initial snapshot under concurrent writes; the checks
of ``cdc add``; the slot advanced on an idle database."""

from __future__ import annotations

import os
import threading
from pathlib import Path

import psycopg
import pytest
from psycopg.conninfo import conninfo_to_dict, make_conninfo

import pgstreams
from _cdc_helpers import all_events, apply, sql, table_rows
from _docs import DocRunner, blocks
from pgstreams.cdc import UNCHANGED_TOAST, CaptureNotFound
from pgstreams.embedded import TemporaryServer


def ops(events: list[pgstreams.Event]) -> list[tuple[str, str | None]]:
    return [(e.value["op"], e.key) for e in events]


def test_insert_update_delete_truncate_become_events_in_commit_order(cdc_dsn: str,
                                                                      cdc_client: pgstreams.Client) -> None:
    sql(cdc_dsn, "CREATE TABLE acct (id int PRIMARY KEY, owner text, balance numeric)")
    info = cdc_client.cdc.add(["acct"], topic_prefix="shop", partitions=2)
    assert info.topics == ("shop.public.acct",)
    sql(cdc_dsn, "INSERT INTO acct VALUES (1, 'ann', 10.50), (2, 'bob', 0)",
        "UPDATE acct SET balance = balance + 1 WHERE id = 1",
        "UPDATE acct SET id = 3 WHERE id = 2",  # a key change: delete of 2, create of 3
        "DELETE FROM acct WHERE id = 1",
        "TRUNCATE acct")
    assert cdc_client.cdc.capture("shop") == 8  # 2 + 1 + 2 + 1 + one truncate per partition
    events = sorted(all_events(cdc_client, "shop.public.acct"), key=lambda e: (e.value["source"]["lsn"],
                                                                               e.partition, e.position))
    assert ops(events) == [("c", '{"id":1}'), ("c", '{"id":2}'), ("u", '{"id":1}'), ("d", '{"id":2}'),
                           ("c", '{"id":3}'), ("d", '{"id":1}'), ("t", None), ("t", None)]
    first, update, delete = events[0].value, events[2].value, events[5].value
    assert first["after"] == {"id": 1, "owner": "ann", "balance": "10.50"} and first["before"] is None
    assert update["after"]["balance"] == "11.50" and update["before"] is None  # replica identity default
    assert delete["before"] == {"id": 1} and delete["after"] is None
    src = first["source"]
    assert (src["schema"], src["table"], src["snapshot"]) == ("public", "acct", False)
    assert isinstance(src["txId"], int) and src["ts_ms"] > 0 and first["ts_ms"] >= src["ts_ms"]
    assert events[0].headers["cdc.txId"] == str(src["txId"])
    # same key, same partition: the key's events in order there
    by_key: dict[str, set[int]] = {}
    for e in events:
        if e.key:
            by_key.setdefault(e.key, set()).add(e.partition)
    assert all(len(p) == 1 for p in by_key.values())
    # nothing more: a second capture stores nothing again
    assert cdc_client.cdc.capture("shop") == 0
    described = cdc_client.cdc.describe("shop")
    assert described.changes == 8 and described.transactions == 5


def test_a_rolled_back_transaction_leaves_nothing_and_a_transaction_is_stored_whole(
        cdc_dsn: str, cdc_client: pgstreams.Client) -> None:
    sql(cdc_dsn, "CREATE TABLE t (id int PRIMARY KEY)")
    cdc_client.cdc.add(["t"])
    with psycopg.connect(cdc_dsn) as conn:
        conn.execute("INSERT INTO t SELECT generate_series(1, 5)")
        conn.rollback()
        conn.execute("INSERT INTO t SELECT generate_series(10, 14)")
        conn.commit()
    capturer = cdc_client.cdc.capturer("cdc", batch=1)  # a round takes at least one whole transaction
    assert capturer.acquire()
    done = capturer.round()
    capturer.release()
    assert (done.transactions, done.changes) == (1, 5)
    assert sorted(e.key for e in all_events(cdc_client, "cdc.public.t")) == [
        f'{{"id":{i}}}' for i in range(10, 15)]


def test_columns_added_and_dropped_mid_stream_are_picked_up(cdc_dsn: str, cdc_client: pgstreams.Client
                                                              ) -> None:
    sql(cdc_dsn, "CREATE TABLE t (id int PRIMARY KEY, a text)")
    cdc_client.cdc.add(["t"])
    sql(cdc_dsn, "INSERT INTO t VALUES (1, 'x')", "ALTER TABLE t ADD COLUMN b int",
        "INSERT INTO t VALUES (2, 'y', 7)", "ALTER TABLE t DROP COLUMN a", "INSERT INTO t VALUES (3, 8)")
    cdc_client.cdc.capture("cdc")
    afters = [e.value["after"] for e in all_events(cdc_client, "cdc.public.t")]
    assert afters == [{"id": 1, "a": "x"}, {"id": 2, "a": "y", "b": 7}, {"id": 3, "b": 8}]


TYPES = [  # (type, SQL literal, JSON value)
    ("smallint", "-3", -3), ("integer", "2147483647", 2147483647), ("bigint", "9007199254740993",
                                                                      9007199254740993),
    ("numeric", "12345678901234567890.000000001", "12345678901234567890.000000001"),
    ("real", "1.5", 1.5), ("double precision", "'NaN'", "NaN"), ("double precision", "0.1", 0.1),
    ("boolean", "true", True), ("text", "'a \"quoted\", text'", 'a "quoted", text'),
    ("varchar(5)", "'abc'", "abc"), ("char(3)", "'ab'", "ab "), ("bytea", "'\\x00ff10'", "AP8Q"),
    ("timestamptz", "'2024-05-01 12:00:00.5+02'", "2024-05-01T10:00:00.5+00:00"),
    ("timestamp", "'2024-05-01 12:00:00'", "2024-05-01T12:00:00"), ("date", "'2024-05-01'", "2024-05-01"),
    ("time", "'13:14:15'", "13:14:15"), ("interval", "'1 day 2 hours'", "1 day 02:00:00"),
    ("uuid", "'a0eebc99-9c0b-4ef8-bb6d-6bb9bd380a11'", "a0eebc99-9c0b-4ef8-bb6d-6bb9bd380a11"),
    ("jsonb", "'{\"a\": [1, null, \"x\"]}'", {"a": [1, None, "x"]}), ("json", "'[1,2]'", [1, 2]),
    ("integer[]", "'{1,NULL,3}'", [1, None, 3]), ("text[]", "'{\"a,b\",\"c\\\"d\",e}'", ["a,b", 'c"d', "e"]),
    ("integer[][]", "'{{1,2},{3,4}}'", [[1, 2], [3, 4]]), ("numeric[]", "'{1.10,2}'", ["1.10", "2"]),
    ("timestamptz[]", "ARRAY['2024-01-01 00:00+00'::timestamptz]", ["2024-01-01T00:00:00+00:00"]),
    ("inet", "'10.0.0.1/8'", "10.0.0.1/8"), ("money", "12.5", "$12.50"),
]


def test_every_builtin_type_maps_to_json(cdc_dsn: str, cdc_client: pgstreams.Client) -> None:
    cols = ", ".join(f"c{i} {t}" for i, (t, _, _) in enumerate(TYPES))
    sql(cdc_dsn, f"CREATE TABLE ty (id int PRIMARY KEY, {cols})", "CREATE TYPE mood AS ENUM ('ok', 'sad')",
        "ALTER TABLE ty ADD COLUMN m mood, ADD COLUMN ms mood[]")
    cdc_client.cdc.add(["ty"])
    values = ", ".join(v for _, v, _ in TYPES)
    sql(cdc_dsn, f"INSERT INTO ty VALUES (1, {values}, 'sad', '{{ok,sad}}')",
        "INSERT INTO ty (id) VALUES (2)")
    cdc_client.cdc.capture("cdc")
    full, empty = (e.value["after"] for e in all_events(cdc_client, "cdc.public.ty"))
    for i, (t, literal, expected) in enumerate(TYPES):
        assert full[f"c{i}"] == expected, (t, literal)
    assert (full["m"], full["ms"]) == ("sad", ["ok", "sad"])
    assert all(v is None for k, v in empty.items() if k != "id")


def test_unchanged_toasted_values_are_marked_and_full_identity_sends_them(
        cdc_dsn: str, cdc_client: pgstreams.Client) -> None:
    big = os.urandom(30_000).hex()  # incompressible: stored out of line (TOASTed)
    sql(cdc_dsn, "CREATE TABLE d (id int PRIMARY KEY, n int, doc text)",
        "CREATE TABLE f (id int PRIMARY KEY, n int, doc text)", "ALTER TABLE f REPLICA IDENTITY FULL")
    cdc_client.cdc.add(["d", "f"])
    for t in ("d", "f"):
        sql(cdc_dsn, f"INSERT INTO {t} VALUES (1, 0, '{big}')", f"UPDATE {t} SET n = 1")
    cdc_client.cdc.capture("cdc")
    d_update = all_events(cdc_client, "cdc.public.d")[1].value
    assert d_update["after"] == {"id": 1, "n": 1, "doc": UNCHANGED_TOAST}  # marked, not null
    assert d_update["before"] is None
    f_update = all_events(cdc_client, "cdc.public.f")[1].value
    assert f_update["before"] == {"id": 1, "n": 0, "doc": big}
    assert f_update["after"]["n"] == 1 and f_update["after"]["doc"] in (big, UNCHANGED_TOAST)


def test_initial_snapshot_under_concurrent_writes_rebuilds_the_table(cdc_dsn: str,
                                                                       cdc_client: pgstreams.Client) -> None:
    sql(cdc_dsn, "CREATE TABLE s (id int PRIMARY KEY, n int NOT NULL)",
        "INSERT INTO s SELECT i, 0 FROM generate_series(1, 3000) i")
    stop = threading.Event()
    failures: list[BaseException] = []

    def writer(seed: int) -> None:
        try:
            with psycopg.connect(cdc_dsn, autocommit=True) as conn:
                i = 0
                while not stop.is_set() or i < 50:
                    i += 1
                    k = (seed * 7919 + i * 104729) % 3500 + 1
                    conn.execute("INSERT INTO s VALUES (%s, 1) ON CONFLICT (id) DO UPDATE SET n = s.n + 1",
                                 (k,))
                    if i % 5 == 0:
                        conn.execute("DELETE FROM s WHERE id = %s", ((k * 31) % 3500 + 1,))
        except BaseException as exc:  # noqa: BLE001 - reported by the test
            failures.append(exc)

    threads = [threading.Thread(target=writer, args=(s,)) for s in range(3)]
    for th in threads:
        th.start()
    try:
        info = cdc_client.cdc.add(["s"], partitions=3, snapshot="initial")
    finally:
        stop.set()
        for th in threads:
            th.join()
    assert not failures
    assert info.changes >= 2900  # the snapshot's rows
    cdc_client.cdc.capture("cdc")
    events = all_events(cdc_client, "cdc.public.s")
    assert {e.value["op"] for e in events} >= {"r", "c", "u", "d"}
    copy = apply(sorted(events, key=lambda e: (e.partition, e.position)), {})  # per key: one partition
    assert copy == table_rows(cdc_dsn, "s")


def test_add_checks_the_server_the_role_and_the_tables_and_changes_nothing(
        cdc_dsn: str, cdc_client: pgstreams.Client, replica_server: TemporaryServer) -> None:
    with pgstreams.connect(replica_server.dsn) as replica, pytest.raises(pgstreams.ConfigurationError,
                                                                         match="wal_level = logical"):
        replica.cdc.add(["t"])
    sql(cdc_dsn, "CREATE TABLE nokey (a int)", "CREATE TABLE nothing (id int PRIMARY KEY)",
        "ALTER TABLE nothing REPLICA IDENTITY NOTHING", "CREATE ROLE plain LOGIN")
    cdc_client.grant("plain", admin=True)
    with pytest.raises(pgstreams.InvalidArgument, match=r"no primary key.*REPLICA IDENTITY FULL"):
        cdc_client.cdc.add(["nokey"])
    with pytest.raises(pgstreams.InvalidArgument, match="REPLICA IDENTITY NOTHING"):
        cdc_client.cdc.add(["nothing"])
    with pytest.raises(pgstreams.InvalidArgument, match="pgstreams' own"):
        cdc_client.cdc.add(["pgstreams.topics"])
    with pytest.raises(pgstreams.InvalidArgument, match="does not exist"):
        cdc_client.cdc.add(["missing"])
    with pytest.raises(pgstreams.InvalidName):
        cdc_client.cdc.add(["a.b.c"])
    with pytest.raises(pgstreams.InvalidArgument, match="snapshot"):
        cdc_client.cdc.add(["nothing"], snapshot="sometimes")  # type: ignore[arg-type]
    with pgstreams.connect(make_conninfo(cdc_dsn, user="plain"), migrate=False) as plain:
        with pytest.raises(pgstreams.PermissionDenied, match="ALTER ROLE plain REPLICATION"):
            plain.cdc.add(["nokey"])
    assert cdc_client.cdc.list() == []
    with psycopg.connect(cdc_dsn) as conn:
        assert conn.execute("SELECT count(*) FROM pg_replication_slots").fetchone() == (0,)
        assert conn.execute("SELECT count(*) FROM pg_publication").fetchone() == (0,)
    with pytest.raises(CaptureNotFound):
        cdc_client.cdc.describe("cdc")


def test_an_idle_capture_advances_its_slot_and_remove_drops_it(cdc_dsn: str,
                                                                cdc_client: pgstreams.Client) -> None:
    sql(cdc_dsn, "CREATE TABLE watched (id int PRIMARY KEY)", "CREATE TABLE other (id int, pad text)")
    cdc_client.cdc.add(["watched"])
    sql(cdc_dsn, "INSERT INTO other SELECT i, repeat('x', 200) FROM generate_series(1, 20000) i")
    before = cdc_client.cdc.describe("cdc")
    assert before.lag_bytes is not None and before.lag_bytes > 4_000_000  # pinned by the unrelated writes
    assert cdc_client.cdc.capture("cdc") == 0
    after = cdc_client.cdc.describe("cdc")
    assert after.lag_bytes is not None and after.lag_bytes < 100_000
    assert after.wal_status in ("reserved", "extended")
    removed = cdc_client.cdc.remove("cdc")
    with psycopg.connect(cdc_dsn) as conn:
        assert conn.execute("SELECT count(*) FROM pg_replication_slots WHERE slot_name = %s",
                            (removed.slot,)).fetchone() == (0,)
    assert cdc_client.cdc.list() == []
    assert "cdc.public.watched" in [t.name for t in cdc_client.list_topics()]  # topics stay


def test_every_code_block_of_the_cdc_page_runs(cdc_dsn: str, tmp_path: Path) -> None:
    page = Path(__file__).resolve().parents[2] / "docs" / "cdc.md"
    env = {k: v for k, v in os.environ.items() if not k.startswith("PGSTREAMS_")}
    runner = DocRunner(tmp_path / "work", dict(env, PGSTREAMS_DSN=cdc_dsn, HOME=str(tmp_path / "home")))
    runner.run_page(page)
    assert runner.skipped == []
    assert runner.ran == [b for b in blocks(page) if b.runs]


def test_two_databases_of_one_server_each_have_a_capture_of_the_same_name(
        cdc_dsn: str, cdc_client: pgstreams.Client, logical_server: TemporaryServer) -> None:
    other = f"{conninfo_to_dict(cdc_dsn)['dbname']}_b"
    sql(logical_server.dsn, f'CREATE DATABASE "{other}" TEMPLATE cdc_template')
    other_dsn = make_conninfo(cdc_dsn, dbname=other)
    try:
        for dsn in (cdc_dsn, other_dsn):
            sql(dsn, "CREATE TABLE t (id int PRIMARY KEY)")
            with pgstreams.connect(dsn) as c:
                c.cdc.add(["t"])
        with pgstreams.connect(other_dsn) as c:
            assert c.cdc.describe("cdc").slot != cdc_client.cdc.describe("cdc").slot
            c.cdc.remove("cdc")
    finally:
        sql(logical_server.dsn, f'DROP DATABASE "{other}" WITH (FORCE)')


def test_the_slot_guard_warns_then_drops_a_slot_that_keeps_too_much_wal(
        cdc_dsn: str, cdc_client: pgstreams.Client, caplog: pytest.LogCaptureFixture) -> None:
    sql(cdc_dsn, "CREATE TABLE watched (id int PRIMARY KEY)", "CREATE TABLE other (id int)")
    info = cdc_client.cdc.add(["watched"])
    assert cdc_client.cdc.guard(10_000_000) == []
    sql(cdc_dsn, "INSERT INTO other SELECT generate_series(1, 20000)")  # nobody captures: the slot stays
    (alarm,) = cdc_client.cdc.guard(100_000)
    assert (alarm.capture, alarm.dropped) == ("cdc", False) and alarm.retained_bytes > 100_000
    assert "does not advance" in caplog.text
    # the slot of a capture the calling process runs (spare) is never dropped: its capture service may not
    # hold the capture's lock yet when the guard first checks
    (spared,) = cdc_client.cdc.guard(100_000, drop=True, spare=["cdc"])
    assert not spared.dropped and "DROPPED" not in caplog.text
    assert cdc_client.cdc.describe("cdc").lag_bytes is not None
    (dropped,) = cdc_client.cdc.guard(100_000, drop=True)
    assert dropped.dropped and "DROPPED the slot" in caplog.text
    assert cdc_client.cdc.describe("cdc").lag_bytes is None  # the slot is gone, the capture says so
    with psycopg.connect(cdc_dsn) as conn:
        assert conn.execute("SELECT count(*) FROM pg_replication_slots WHERE slot_name = %s",
                            (info.slot,)).fetchone() == (0,)
    with pytest.raises(CaptureNotFound, match=r"slot .* is gone"):
        cdc_client.cdc.capture("cdc")
    cdc_client.cdc.remove("cdc")


def test_tombstones_follow_deletes_when_asked(cdc_dsn: str, cdc_client: pgstreams.Client) -> None:
    sql(cdc_dsn, "CREATE TABLE k (id int PRIMARY KEY)")
    assert cdc_client.cdc.add(["k"], tombstones=True).tombstones
    sql(cdc_dsn, "INSERT INTO k VALUES (1), (2)", "UPDATE k SET id = 3 WHERE id = 2",
        "DELETE FROM k WHERE id = 1")
    cdc_client.cdc.capture("cdc")
    events = all_events(cdc_client, "cdc.public.k")
    got = [(e.key, None if e.value is None else e.value["op"]) for e in events]
    assert got == [('{"id":1}', "c"), ('{"id":2}', "c"), ('{"id":2}', "d"), ('{"id":2}', None),
                   ('{"id":3}', "c"), ('{"id":1}', "d"), ('{"id":1}', None)]
