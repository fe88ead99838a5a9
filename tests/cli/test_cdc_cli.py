"""``pgstreams cdc add|list|describe|snapshot|remove|run|guard`` (and ``pgstreams worker --cdc``) as real
subprocesses: the captures' life cycle, incremental snapshots, and bad input refused with one line, a
non-zero exit code and nothing changed."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import psycopg

import pgstreams
from _core_helpers import wait_until
from pgstreams.embedded import TemporaryServer

TIMEOUT = 120


def cli(dsn: str, *args: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("PGSTREAMS_")}
    env["COLUMNS"] = "200"
    return subprocess.run([sys.executable, "-m", "pgstreams.cli", *args, "--dsn", dsn], capture_output=True,
                          text=True, timeout=TIMEOUT, env=env)


def ok(dsn: str, *args: str) -> str:
    p = cli(dsn, *args)
    assert p.returncode == 0, f"{args}: exit {p.returncode}\n{p.stdout}\n{p.stderr}"
    return p.stdout


def refused(dsn: str, code: int, message: str, *args: str) -> None:
    p = cli(dsn, *args)
    assert p.returncode == code, f"{args}: exit {p.returncode}\n{p.stdout}\n{p.stderr}"
    assert "Traceback" not in p.stderr and p.stderr.startswith("error: ") and message in p.stderr, p.stderr


def test_add_list_describe_run_remove(cdc_dsn: str) -> None:
    with psycopg.connect(cdc_dsn, autocommit=True) as conn:
        conn.execute("CREATE TABLE orders (id int PRIMARY KEY, total numeric)")
        conn.execute("CREATE SCHEMA sales")
        conn.execute("CREATE TABLE sales.items (sku text PRIMARY KEY)")
        conn.execute("INSERT INTO orders VALUES (1, 9.99)")
    added = json.loads(ok(cdc_dsn, "cdc", "add", "orders", "--topic-prefix", "app", "--partitions", "3",
                          "--snapshot", "initial", "--json"))
    assert (added["name"], added["tables"], added["changes"]) == ("app", ["public.orders"], 1)
    more = json.loads(ok(cdc_dsn, "cdc", "add", "sales.items", "--topic-prefix", "app", "--json"))
    assert more["topics"] == ["app.public.orders", "app.sales.items"]
    listed = json.loads(ok(cdc_dsn, "cdc", "list", "--json"))
    assert [c["name"] for c in listed] == ["app"]
    described = json.loads(ok(cdc_dsn, "cdc", "describe", "app", "--json"))
    assert {"lag_bytes", "wal_status", "safe_wal_size", "slot_active"} <= set(described)
    assert "app" in ok(cdc_dsn, "cdc", "describe", "app") and "app" in ok(cdc_dsn, "cdc", "list")

    env = {k: v for k, v in os.environ.items() if not k.startswith("PGSTREAMS_")}
    run = subprocess.Popen([sys.executable, "-m", "pgstreams.cli", "cdc", "run", "app", "--dsn", cdc_dsn],
                           env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        with psycopg.connect(cdc_dsn, autocommit=True) as conn:
            conn.execute("INSERT INTO sales.items VALUES ('a'), ('b')")
        with pgstreams.connect(cdc_dsn) as client:
            wait_until(lambda: client.cdc.describe("app").changes == 3, 20, "the run capturing the inserts")
    finally:
        run.send_signal(signal.SIGINT)
        _, err = run.communicate(timeout=30)
    assert run.returncode == 0 and "Traceback" not in err, err

    assert "removed capture app" in ok(cdc_dsn, "cdc", "remove", "app")
    assert json.loads(ok(cdc_dsn, "cdc", "list", "--json")) == []
    refused(cdc_dsn, 1, "capture 'app' does not exist", "cdc", "describe", "app")


def test_bad_input_is_refused_in_one_line_and_changes_nothing(cdc_dsn: str, replica_server: TemporaryServer
                                                              ) -> None:
    with psycopg.connect(cdc_dsn, autocommit=True) as conn:
        conn.execute("CREATE TABLE nokey (a int)")
        conn.execute("CREATE TABLE fine (id int PRIMARY KEY)")
    refused(cdc_dsn, 2, "--snapshot must be initial or never", "cdc", "add", "fine", "--snapshot", "maybe")
    refused(cdc_dsn, 2, "partitions must be between", "cdc", "add", "fine", "--partitions", "0")
    refused(cdc_dsn, 2, "invalid topic name", "cdc", "add", "fine", "--topic-prefix", "a b")
    refused(cdc_dsn, 2, "has no primary key", "cdc", "add", "fine", "nokey")
    refused(cdc_dsn, 2, "table public.missing does not exist", "cdc", "add", "missing")
    refused(cdc_dsn, 2, "pgstreams' own", "cdc", "add", "pgstreams.checkpoints")
    refused(cdc_dsn, 1, "no captures to run", "cdc", "run")
    refused(replica_server.dsn, 1, "wal_level = logical", "cdc", "add", "fine")
    assert json.loads(ok(cdc_dsn, "cdc", "list", "--json")) == []
    with psycopg.connect(cdc_dsn) as conn:
        assert conn.execute("SELECT count(*) FROM pg_replication_slots").fetchone() == (0,)
        assert conn.execute("SELECT count(*) FROM pg_publication").fetchone() == (0,)


def test_a_worker_runs_a_capture_as_a_service(cdc_dsn: str, tmp_path: Path) -> None:
    with psycopg.connect(cdc_dsn, autocommit=True) as conn:
        conn.execute("CREATE TABLE orders (id int PRIMARY KEY)")
    ok(cdc_dsn, "cdc", "add", "orders")
    (tmp_path / "cdc_handlers.py").write_text("def noop(event):\n    pass\n")
    env = {k: v for k, v in os.environ.items() if not k.startswith("PGSTREAMS_")}
    cmd = [sys.executable, "-m", "pgstreams.cli", "worker", "cdc_handlers:noop", "--topic",
           "cdc.public.orders", "--group", "g", "--cdc", "cdc", "--dsn", cdc_dsn]
    worker = subprocess.Popen(cmd, env=env, cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                              text=True)
    try:
        with psycopg.connect(cdc_dsn, autocommit=True) as conn:
            conn.execute("INSERT INTO orders SELECT generate_series(1, 10)")
        with pgstreams.connect(cdc_dsn) as client:
            wait_until(lambda: client.cdc.describe("cdc").changes == 10, 20, "the worker capturing")
    finally:
        worker.send_signal(signal.SIGTERM)
        _, err = worker.communicate(timeout=30)
    assert worker.returncode == 0 and "Traceback" not in err, err


def test_guard_exits_1_when_a_slot_keeps_too_much_wal(cdc_dsn: str) -> None:
    with psycopg.connect(cdc_dsn, autocommit=True) as conn:
        conn.execute("CREATE TABLE t (id int PRIMARY KEY)")
    ok(cdc_dsn, "cdc", "add", "t")
    assert cli(cdc_dsn, "cdc", "guard", "--max-retained", "1000000000").returncode == 0
    with psycopg.connect(cdc_dsn, autocommit=True) as conn:
        conn.execute("CREATE TABLE other AS SELECT generate_series(1, 20000) AS id")
    p = cli(cdc_dsn, "cdc", "guard", "--max-retained", "1000", "--json")
    assert p.returncode == 1 and "Traceback" not in p.stderr, p.stderr
    (alarm,) = json.loads(p.stdout)
    assert alarm["capture"] == "cdc" and alarm["dropped"] is False


def test_snapshot_is_read_by_the_running_capture_and_bad_requests_are_refused(cdc_dsn: str) -> None:
    with psycopg.connect(cdc_dsn, autocommit=True) as conn:
        conn.execute("CREATE TABLE orders (id int PRIMARY KEY, total int)")
        conn.execute("CREATE TABLE other (id int PRIMARY KEY)")
        conn.execute("INSERT INTO orders SELECT i, i FROM generate_series(1, 500) i")
    ok(cdc_dsn, "cdc", "add", "orders")
    refused(cdc_dsn, 2, "table public.missing does not exist", "cdc", "snapshot", "missing")
    refused(cdc_dsn, 2, "table public.other is not captured by capture 'cdc'", "cdc", "snapshot", "other")
    refused(cdc_dsn, 1, "capture 'shop' does not exist", "cdc", "snapshot", "orders", "--capture", "shop")
    refused(cdc_dsn, 2, "chunk size must be a whole number from 1", "cdc", "snapshot", "orders",
            "--chunk-size", "0")
    assert json.loads(ok(cdc_dsn, "cdc", "describe", "cdc", "--json"))["snapshots"] == []  # nothing changed

    (requested,) = json.loads(ok(cdc_dsn, "cdc", "snapshot", "orders", "--chunk-size", "64", "--json"))
    assert (requested["table"], requested["chunk_size"]) == ("public.orders", 64)
    assert requested["finished_at"] is None
    env = {k: v for k, v in os.environ.items() if not k.startswith("PGSTREAMS_")}
    run = subprocess.Popen([sys.executable, "-m", "pgstreams.cli", "cdc", "run", "--dsn", cdc_dsn],
                           env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        with pgstreams.connect(cdc_dsn) as client:
            done = wait_until(lambda: [s for s in client.cdc.describe("cdc").snapshots if s.finished], 60,
                              "the running capture finishing the snapshot")
    finally:
        run.send_signal(signal.SIGINT)
        _, err = run.communicate(timeout=30)
    assert run.returncode == 0 and "Traceback" not in err, err
    assert (done[0].rows, done[0].chunks) == (500, 8)
    assert "public.orders: 500 row(s) in 8 chunk(s), finished" in ok(cdc_dsn, "cdc", "describe", "cdc")


def test_a_worker_with_cdc_runs_the_slot_guard_which_drops_an_unread_slot_and_spares_its_own(
        cdc_dsn: str, tmp_path: Path) -> None:
    with psycopg.connect(cdc_dsn, autocommit=True) as conn:
        conn.execute("CREATE TABLE orders (id int PRIMARY KEY)")
        conn.execute("CREATE TABLE other (id int)")
    ok(cdc_dsn, "cdc", "add", "orders", "--topic-prefix", "shop")
    ok(cdc_dsn, "cdc", "add", "orders", "--topic-prefix", "stale")  # nobody runs it
    with psycopg.connect(cdc_dsn, autocommit=True) as conn:
        conn.execute("INSERT INTO other SELECT generate_series(1, 20000)")  # WAL both slots keep
    (tmp_path / "cdc_handlers.py").write_text("def noop(event):\n    pass\n")
    env = {k: v for k, v in os.environ.items() if not k.startswith("PGSTREAMS_")}
    cmd = [sys.executable, "-m", "pgstreams.cli", "worker", "cdc_handlers:noop", "--topic",
           "shop.public.orders", "--group", "g", "--cdc", "shop", "--cdc-max-retained", "1000", "--cdc-drop",
           "--dsn", cdc_dsn]
    worker = subprocess.Popen(cmd, env=env, cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                              text=True)
    try:
        with pgstreams.connect(cdc_dsn) as client:
            wait_until(lambda: client.cdc.describe("stale").lag_bytes is None, 30,
                       "the worker's slot guard dropping the unread slot")
            with psycopg.connect(cdc_dsn, autocommit=True) as conn:
                conn.execute("INSERT INTO orders VALUES (1)")
            wait_until(lambda: client.cdc.describe("shop").changes == 1, 20, "the worker capturing")
            assert client.cdc.describe("shop").lag_bytes is not None  # its own slot is kept
    finally:
        worker.send_signal(signal.SIGTERM)
        _, err = worker.communicate(timeout=30)
    assert worker.returncode == 0 and "Traceback" not in err, err
    assert "DROPPED the slot" in err and "capture stale" in err
    assert "of capture shop to keep" not in err
