"""The change data capture benchmark: changes captured per second, source commit to visible event, and
what capturing costs the writers.

    python -m bench.cdc [--dsn DSN] [--duration 4] [--latency-duration 10] [--quick] [--markdown]

* **raw PostgreSQL limit**, measured in the same run on the same server: binary COPY of 1,000-row
  transactions, single-row INSERTs, COPY-out of the rows (bench._common's raw operations).
* **captured/s, 1,000-row transactions**: 4 writer processes commit 1,000-row INSERTs into a captured
  table for ``--duration`` s (``synchronous_commit = off``: a backlog made fast; capturing a transaction
  costs the same either way); then one capture drains the slot's backlog (``client.cdc.capture``, its own
  commits durable): changes stored as events per second. Beside it: the raw COPY rate. Acceptance:
  >= 10,000 changes/s.
* **captured/s, single-row transactions**: the same with 4 writers of single-row transactions (beside it:
  single-row INSERTs of 4 processes). Acceptance: >= 10,000 changes/s.
* **latency**: a writer commits single-row transactions at 2,000 changes/s while ``pgstreams cdc run``
  captures and a consumer polls the topic: p50/p99 of the source commit time (``source.ts_ms``) to the
  event in the consumer's hands. Acceptance: p99 < 1 s.
* **writers**: 4 processes of single-row INSERTs into a table nobody captures, into a captured table while
  ``pgstreams cdc run`` captures it (the two alternated, best of 2 each), and into a table with a trigger
  outbox (``pgstreams.publish`` in an AFTER INSERT trigger, docs/sql.md). Acceptance: with capture >= 0.9
  x without.

The server needs ``wal_level = logical``: without ``--dsn`` (or ``$PGSTREAMS_DSN``) the benchmark starts a
throw-away server with it (embedded binaries, default durability). A database is created on it and dropped
at the end. The load average is printed under the table.
"""

from __future__ import annotations

import argparse
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass

import psycopg
from rich.console import Console

import pgstreams
from pgstreams.cdc import DEFAULT_CAPTURE_INTERVAL

from ._common import (
    Job,
    Measurement,
    Paced,
    RawTarget,
    check_loopback,
    checkpoint,
    create_raw_table,
    machine,
    make_console,
    markdown,
    percentile,
    print_results,
    raw_copy_in,
    raw_copy_out,
    raw_insert,
    run_jobs,
    run_parallel,
    scratch_database,
)

WRITERS = 4
LATENCY_RATE = 2000.0
#: Seconds between the capture's rounds when idle in the latency measurement.
LATENCY_INTERVAL = 0.05
#: Rounds of the writers' measurements, with and without capture alternated; the best of each kept.
ROUNDS = 2
ROW = "x" * 100  #: the text column of every row written


@dataclass
class WriterArgs:
    """A writer process: ``rows`` per transaction into ``table``; ``rate`` changes/s when paced."""

    dsn: str
    table: str
    rows: int = 1
    rate: float | None = None
    durable: bool = True  # false: commits do not wait for their WAL flush (a backlog made fast)


@contextmanager
def writer_op(args: WriterArgs) -> Iterator[Callable[[], int]]:
    """Operation: one transaction of ``args.rows`` inserted rows (a prepared single-row INSERT, or one
    INSERT ... SELECT of a series); paced at ``args.rate`` when given."""
    table = psycopg.sql.Identifier(args.table)
    one = psycopg.sql.SQL("INSERT INTO {} (v) VALUES (%s)").format(table)
    many = psycopg.sql.SQL("INSERT INTO {} (v) SELECT %s FROM generate_series(1, %s)").format(table)
    with psycopg.connect(args.dsn, autocommit=True) as conn:
        if not args.durable:
            conn.execute("SET synchronous_commit = off")

        def write(n: int) -> None:
            if n == 1:
                conn.execute(one, (ROW,), prepare=True)
            else:
                conn.execute(many, (ROW, n), prepare=True)

        if args.rate is not None:
            yield Paced(args.rate, write)
            return

        def op() -> int:
            write(args.rows)
            return args.rows

        yield op


def _setup(db: str) -> None:
    with psycopg.connect(db, autocommit=True) as conn:
        for t in ("batch", "single", "latency", "captured", "plain", "outboxed"):
            conn.execute(psycopg.sql.SQL("CREATE TABLE {} (id bigserial PRIMARY KEY, v text NOT NULL)")
                         .format(psycopg.sql.Identifier(t)))
        conn.execute("""
            CREATE FUNCTION outbox_row() RETURNS trigger LANGUAGE plpgsql AS $$
            BEGIN
                PERFORM pgstreams.publish('outbox', to_jsonb(NEW), key => NEW.id::text);
                RETURN NULL;
            END $$""")
        conn.execute("CREATE TRIGGER outboxed_outbox AFTER INSERT ON outboxed FOR EACH ROW "
                     "EXECUTE FUNCTION outbox_row()")


@contextmanager
def capturing(db: str, name: str, interval: float = DEFAULT_CAPTURE_INTERVAL) -> Iterator[None]:
    """``pgstreams cdc run NAME`` (rounds every ``interval`` s when idle) in a process of its own while
    the block runs, which starts once it captures (its start-up costs the measurement nothing)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("PGSTREAMS_")}
    cmd = [sys.executable, "-m", "pgstreams.cli", "cdc", "run", name, "--dsn", db,
           "--interval", str(interval)]
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    try:
        assert proc.stdout is not None
        if not proc.stdout.readline().startswith("capturing"):
            raise RuntimeError(f"pgstreams cdc run {name} did not start")
        yield
    finally:
        proc.send_signal(signal.SIGINT)
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def _drain(client: pgstreams.Client, name: str) -> float:
    """Capture ``name``'s backlog; changes per second."""
    t0 = time.perf_counter()
    n = client.cdc.capture(name)
    return n / (time.perf_counter() - t0)


def _latency(client: pgstreams.Client, db: str, seconds: float) -> tuple[float, float, float]:
    """p50, p99 (ms) of source commit -> event polled, and the rate achieved."""
    consumer = client.consumer("lat.public.latency", "bench", start="latest")
    latencies: list[float] = []
    with capturing(db, "lat", LATENCY_INTERVAL):
        job = Job(writer_op, WriterArgs(db, "latency", rate=LATENCY_RATE), seconds)
        results: list[float] = []
        writer = threading.Thread(target=lambda: results.extend(r.rate for r in run_jobs([job])))
        writer.start()
        skip_until = time.time() + 1.0
        while writer.is_alive():
            for ev in consumer.poll(max_events=1000, timeout=0.5):
                now = time.time() * 1000
                if now / 1000 > skip_until:
                    latencies.append(now - ev.value["source"]["ts_ms"])
            consumer.commit()
        writer.join()
    return percentile(latencies, 50), percentile(latencies, 99), sum(results)


def run(db: str, duration: float, latency_duration: float, console: Console) -> list[Measurement]:
    """Every measurement on database ``db`` (created and dropped by the caller)."""
    out: list[Measurement] = []
    _setup(db)
    for t in ("raw_batch", "raw_single"):
        create_raw_table(db, t)
    with pgstreams.connect(db) as client:
        checkpoint(db)
        copy = run_parallel(raw_copy_in, RawTarget(db, "raw_batch", 4), 1, duration, warmup=2)
        single = run_parallel(raw_insert, RawTarget(db, "raw_single", 4), WRITERS, duration, warmup=20)
        copy_out = run_parallel(raw_copy_out, RawTarget(db, "raw_batch", 4), 1, 120)
        console.log(f"raw: COPY {copy:,.0f} rows/s, single-row INSERT x{WRITERS} {single:,.0f}/s, "
                    f"COPY-out {copy_out:,.0f} rows/s")
        out.append(Measurement("raw COPY-out of the COPY's rows", copy_out, "rows/s"))

        for name, table, rows, raw, label in (
                ("batch", "batch", 1000, copy, "COPY, 1,000-row transactions, 1 process"),
                ("single", "single", 1, single, f"single-row INSERT, {WRITERS} processes")):
            client.cdc.add([table], topic_prefix=name, partitions=4)
            checkpoint(db)
            written = run_parallel(writer_op, WriterArgs(db, table, rows, durable=False), WRITERS, duration,
                                   warmup=1)
            rate = _drain(client, name)
            console.log(f"{name}: writers {written:,.0f} changes/s; captured {rate:,.0f} changes/s")
            out.append(Measurement(f"captured, {WRITERS} writers of {rows:,}-row transactions", rate,
                                   "changes/s", raw, label, ">= 10,000/s", rate >= 10_000))

        client.cdc.add(["latency"], topic_prefix="lat", partitions=4)
        checkpoint(db)
        p50, p99, achieved = _latency(client, db, latency_duration)
        console.log(f"latency: p50 {p50:.1f} ms, p99 {p99:.1f} ms at {achieved:,.0f} changes/s")
        out.append(Measurement(f"commit -> event p50 at {achieved:,.0f} changes/s", p50, "ms",
                               higher_is_better=False))
        out.append(Measurement(f"commit -> event p99 at {achieved:,.0f} changes/s", p99, "ms", None, "",
                               "< 1,000 ms", p99 < 1000, higher_is_better=False))

        client.create_topic("outbox", 4)
        client.cdc.add(["captured"], topic_prefix="cap", partitions=4)
        checkpoint(db)
        plain = captured = 0.0
        for _ in range(ROUNDS):
            plain = max(plain, run_parallel(writer_op, WriterArgs(db, "plain"), WRITERS, duration, warmup=20))
            checkpoint(db)
            with capturing(db, "cap"):
                captured = max(captured, run_parallel(writer_op, WriterArgs(db, "captured"), WRITERS,
                                                      duration, warmup=20))
            checkpoint(db)
        outboxed = run_parallel(writer_op, WriterArgs(db, "outboxed"), WRITERS, duration, warmup=20)
        console.log(f"writers: {plain:,.0f}/s alone, {captured:,.0f}/s captured, {outboxed:,.0f}/s with "
                    "the trigger outbox")
        out.append(Measurement(f"writers, {WRITERS} processes, while captured", captured, "changes/s", plain,
                               "the same writers, table not captured", ">= 0.9 x not captured",
                               captured >= 0.9 * plain))
        out.append(Measurement(f"writers, {WRITERS} processes, trigger outbox", outboxed, "changes/s", plain,
                               "the same writers, no trigger"))
        for name in ("batch", "single", "lat", "cap"):
            client.cdc.remove(name)
    return out


@contextmanager
def _server(dsn: str | None) -> Iterator[str]:
    target = dsn or os.environ.get("PGSTREAMS_DSN")
    if target:
        check_loopback(target)
        yield target
        return
    from pgstreams.embedded import temporary_server

    with temporary_server({"wal_level": "logical"}) as started:
        yield started


def main(argv: list[str] | None = None) -> int:
    """Entry point of ``python -m bench.cdc``."""
    ap = argparse.ArgumentParser(prog="python -m bench.cdc", description=__doc__.split("\n\n")[0])
    ap.add_argument("--dsn", help="server to use, with wal_level = logical (default $PGSTREAMS_DSN, else a "
                    "throw-away server started with it); a database is created on it and dropped afterwards")
    ap.add_argument("--duration", type=float, default=4.0, help="seconds of each writers' run (default 4)")
    ap.add_argument("--latency-duration", type=float, default=10.0,
                    help="seconds of the latency measurement (default 10)")
    ap.add_argument("--quick", action="store_true", help="short run: 1.5 s of writers, 4 s of latency")
    ap.add_argument("--markdown", action="store_true", help="also print the table in Markdown")
    args = ap.parse_args(argv)
    if args.quick:
        args.duration, args.latency_duration = 1.5, 4.0
    if args.duration <= 0 or args.latency_duration <= 0:
        ap.error("durations must be positive")
    console = make_console()
    started = time.monotonic()
    with ExitStack() as stack:
        target = stack.enter_context(_server(args.dsn))
        info = machine(target)
        db = stack.enter_context(scratch_database(target, "pgstreams_bench_cdc"))
        try:
            rows = run(db, args.duration, args.latency_duration, console)
        finally:
            with psycopg.connect(db, autocommit=True) as conn:  # slots would keep the database from dropping
                conn.execute("SELECT pg_drop_replication_slot(slot_name) FROM pg_replication_slots "
                             "WHERE database = current_database() AND NOT active")
    print_results("pgstreams change data capture benchmark", rows, console)
    console.print(f"{info['cpu']}, {info['cores']} cores, {info['ram']} RAM; "
                  f"PostgreSQL {info['postgresql']}; Python {info['python']}, psycopg {info['psycopg']}; "
                  f"load before run {info['load']}; "
                  f"took {time.monotonic() - started:.0f} s")
    console.print(f"settings: {info['settings']}")
    if args.markdown:
        console.print(markdown(rows), markup=False, highlight=False, soft_wrap=True)
    return 0 if all(m.ok is not False for m in rows) else 1


if __name__ == "__main__":
    raise SystemExit(main())
