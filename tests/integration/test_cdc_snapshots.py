"""Incremental snapshots of captured tables (:mod:`pgstreams.cdc.snapshots`) against a server with
wal_level = logical: a snapshot while several threads insert, update and delete rebuilds the table exactly;
a capture killed in the middle of a snapshot finishes it after a restart without losing or repeating a row;
tables added to a capture with ``snapshot="initial"`` get their rows; bad input is refused and changes
nothing."""

from __future__ import annotations

import random
import signal
import subprocess
import sys
from collections import Counter
from pathlib import Path

import psycopg
import pytest

import pgstreams
from _cdc_helpers import WriterThreads, all_events, apply, sql, table_rows
from _core_helpers import wait_until
from pgstreams.cdc import CaptureNotFound

HELPER = Path(__file__).resolve().parents[1] / "_cdc_helpers.py"


def replayed(client: pgstreams.Client, topic: str) -> dict[str, dict[str, object]]:
    """The table a consumer builds by applying every event of ``topic`` in order to an empty copy (per key:
    one partition, so partition by partition)."""
    return apply(sorted(all_events(client, topic), key=lambda e: (e.partition, e.position)), {})


class Writers(WriterThreads):
    """Threads that insert, update and delete rows of table ``s`` (ids 1 to ``keys``) until stopped, each
    change its own transaction."""

    autocommit = True

    def __init__(self, dsn: str, keys: int, count: int = 3) -> None:
        self.keys = keys
        self.changes = 0
        super().__init__(dsn, count)

    def write(self, conn: psycopg.Connection, rnd: random.Random) -> None:
        k = rnd.randint(1, self.keys)
        what = rnd.random()
        if what < 0.5:
            conn.execute("UPDATE s SET n = n + 1, note = md5(random()::text) WHERE id = %s", (k,))
        elif what < 0.75:
            conn.execute("DELETE FROM s WHERE id = %s", (k,))
        else:
            conn.execute("INSERT INTO s VALUES (%s, 100, 'new') ON CONFLICT (id) DO UPDATE "
                         "SET n = s.n + 100", (k,))
        self.changes += 1


def test_an_incremental_snapshot_under_concurrent_writers_rebuilds_the_table_exactly(
        cdc_dsn: str, cdc_client: pgstreams.Client) -> None:
    sql(cdc_dsn, "CREATE TABLE s (id int PRIMARY KEY, n int NOT NULL, note text)",
        "INSERT INTO s SELECT i, 0, 'old' FROM generate_series(1, 4000) i")
    cdc_client.cdc.add(["s"], partitions=3)  # the existing rows are in no event
    capturing = pgstreams.connect(cdc_dsn)
    service = capturing.cdc.service("cdc", interval=0.02)
    service.start()
    writers = Writers(cdc_dsn, 4500)
    try:
        wait_until(lambda: writers.changes > 200, 30, "the writers writing")
        (requested,) = cdc_client.cdc.snapshot(["s"], chunk_size=150)
        assert (requested.table, requested.chunk_size, requested.finished) == ("public.s", 150, False)
        wait_until(lambda: cdc_client.cdc.describe("cdc").snapshots[0].finished, 120,
                   "the snapshot finishing")
        writers_during = writers.changes
    finally:
        writers.finish()
        service.stop(10)
        capturing.close()
    capture_all(cdc_client)
    assert writers_during > 500  # the snapshot ran while they wrote
    status = cdc_client.cdc.describe("cdc").snapshots[0]
    assert status.chunks > 10 and status.rows > 1000  # read in chunks (rows changed meanwhile left out)
    events = all_events(cdc_client, "cdc.public.s")
    assert {e.value["op"] for e in events} == {"r", "c", "u", "d"}
    assert replayed(cdc_client, "cdc.public.s") == table_rows(cdc_dsn, "s")


def capture_all(client: pgstreams.Client) -> int:
    """Capture in this process until the slot has nothing more and no snapshot waits, once the process that
    captured before let go (its session ended)."""
    captured: list[int] = []

    def attempt() -> bool:
        try:
            captured.append(client.cdc.capture("cdc"))
        except pgstreams.InvalidArgument:  # still held by the process that stopped
            return False
        return True

    wait_until(attempt, 60, "the capture free to take")
    return captured[0]


def test_a_capture_killed_mid_snapshot_finishes_it_after_a_restart_without_loss_or_repeat(
        cdc_dsn: str, cdc_client: pgstreams.Client, tmp_path: Path) -> None:
    sql(cdc_dsn, "CREATE TABLE s (id int PRIMARY KEY, n int NOT NULL, note text)",
        "INSERT INTO s SELECT i, 0, 'old' FROM generate_series(1, 1000) i")
    cdc_client.cdc.add(["s"])
    cdc_client.cdc.snapshot(["s"], chunk_size=100)
    marker = tmp_path / "at"
    # a capturer that stops dead when it has read its third chunk (its watermarks written, its rows not
    # stored), then is killed
    proc = subprocess.Popen([sys.executable, str(HELPER), cdc_dsn, "cdc", "chunk", "3", str(marker)])
    try:
        wait_until(marker.exists, 60, "the capturer reading its third chunk")
        progress = cdc_client.cdc.describe("cdc").snapshots[0]
        assert (progress.chunks, progress.rows, progress.finished) == (2, 200, False)
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait(30)
    # changes while no process captures, in the chunk that was read and in later ones
    sql(cdc_dsn, "UPDATE s SET n = 7 WHERE id IN (205, 250, 640)", "DELETE FROM s WHERE id IN (210, 700)",
        "INSERT INTO s VALUES (1001, 1, 'new')")
    capture_all(cdc_client)  # the restarted capture
    status = cdc_client.cdc.describe("cdc").snapshots[0]
    # 999 rows: 200 stored before the kill, the 799 left read (the third chunk again) after the changes
    assert (status.finished, status.chunks, status.rows) == (True, 10, 999)
    events = all_events(cdc_client, "cdc.public.s")
    snapshot_keys = Counter(e.key for e in events if e.value["op"] == "r")
    assert len(snapshot_keys) == status.rows and set(snapshot_keys.values()) == {1}  # none twice
    assert replayed(cdc_client, "cdc.public.s") == table_rows(cdc_dsn, "s")


def test_tables_added_to_a_capture_with_an_initial_snapshot_get_their_rows(
        cdc_dsn: str, cdc_client: pgstreams.Client) -> None:
    sql(cdc_dsn, "CREATE TABLE a (id int PRIMARY KEY)", "CREATE TABLE b (k text PRIMARY KEY, v jsonb)",
        "INSERT INTO b SELECT 'k' || i, jsonb_build_object('i', i) FROM generate_series(1, 2500) i")
    cdc_client.cdc.add(["a"])
    info = cdc_client.cdc.add(["b"], snapshot="initial")
    assert info.tables == ("public.a", "public.b") and [s.table for s in info.snapshots] == ["public.b"]
    sql(cdc_dsn, "UPDATE b SET v = '{\"i\": 0}' WHERE k = 'k7'", "DELETE FROM b WHERE k = 'k9'")
    cdc_client.cdc.capture("cdc")
    assert cdc_client.cdc.describe("cdc").snapshots[0].finished
    rows = table_rows(cdc_dsn, "b", key="k")
    assert replayed(cdc_client, "cdc.public.b") == rows and len(rows) == 2499


def test_bad_snapshot_requests_are_refused_and_change_nothing(cdc_dsn: str,
                                                              cdc_client: pgstreams.Client) -> None:
    sql(cdc_dsn, "CREATE TABLE t (id int PRIMARY KEY)", "CREATE TABLE other (id int PRIMARY KEY)",
        "CREATE TABLE full_rows (a int, b text)", "ALTER TABLE full_rows REPLICA IDENTITY FULL")
    cdc_client.cdc.add(["t", "full_rows"])
    with pytest.raises(pgstreams.InvalidArgument, match=r"table public\.missing does not exist"):
        cdc_client.cdc.snapshot(["t", "missing"])
    with pytest.raises(pgstreams.InvalidArgument, match=r"public\.other is not captured by capture 'cdc'"):
        cdc_client.cdc.snapshot(["other"])
    with pytest.raises(pgstreams.InvalidArgument, match="neither a primary key nor a replica identity index"):
        cdc_client.cdc.snapshot(["full_rows"])
    with pytest.raises(CaptureNotFound, match="capture 'shop' does not exist"):
        cdc_client.cdc.snapshot(["t"], capture="shop")
    for size in (0, -1, 10**9, True, "10"):
        with pytest.raises(pgstreams.InvalidArgument, match="chunk size"):
            cdc_client.cdc.snapshot(["t"], chunk_size=size)  # type: ignore[arg-type]
    with pytest.raises(pgstreams.InvalidArgument, match="one or more tables"):
        cdc_client.cdc.snapshot([])
    with pytest.raises(pgstreams.InvalidName):
        cdc_client.cdc.snapshot(["a.b.c"])
    sql(cdc_dsn, "CREATE TABLE full_too (a int)", "ALTER TABLE full_too REPLICA IDENTITY FULL")
    with pytest.raises(pgstreams.InvalidArgument, match="neither a primary key"):
        cdc_client.cdc.add(["other", "full_too"], snapshot="initial")
    info = cdc_client.cdc.describe("cdc")
    assert info.snapshots == () and info.tables == ("public.full_rows", "public.t")
    with psycopg.connect(cdc_dsn) as conn:
        assert conn.execute("SELECT count(*) FROM pgstreams.cdc_snapshots").fetchone() == (0,)
