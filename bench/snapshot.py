"""Held snapshots: throughput and the dead tuples of pgstreams' own tables while the xmin horizon is held.

    python -m bench.snapshot [--duration 600] [--quick] [--holds repeatable-read,slot] [--json]

A PostgreSQL of its own (``pgstreams.embedded.restartable_server``: fsync off, ``wal_level=logical``),
never the machine's server: a held horizon would slow every other database of a shared server. Each run
uses a fresh database and the same workload, in one process:

* producers: a single-event producer (``publish``), a batch producer (``publish_many`` of 10) and a SQL
  producer (``pgstreams.publish(..., producer => id, sequence => n)``, whose state is a row of
  ``producers`` updated by every publish), on a topic of 4 partitions;
* a stream-group consumer (poll + commit, at-least-once);
* a worker group of two members in transactional mode (each event inserted into a table of handled events,
  heartbeats every 0.5 s);
* a share-group worker (at-least-once: each event acquired and acknowledged).

Runs, ``--duration`` seconds each (default 600, ``--quick``: 20): first ``free`` (nothing holds the
horizon), then one per ``--holds``:

* ``repeatable-read``: a REPEATABLE READ transaction of the same database that took its snapshot before the
  workload started, open for the whole run (VACUUM removes no row version newer than it: every update of a
  row leaves one more version);
* ``slot``: a logical replication slot (``pgoutput``) created before the workload and never read: it holds
  the catalog horizon (catalog_xmin: the row versions of ``pg_class``, ``pg_attribute``, ... left by the
  DDL of segments and staging tables) and the WAL.

Reported per run: events published, consumed by the stream group, handled by the worker group and by the
share worker, per second; the mean latency of each kind of call (where a slowdown comes from); and, at the
end of the run, with the horizon still held, the dead tuples of each of pgstreams' tables other than the
event segments (``n_dead_tup``; updates and HOT updates beside) and of the system catalogs. Ratios are held /
free. The raw PostgreSQL figure of the same conditions: one process inserting a row and updating a one-row
offset table per event (autocommit), for ``--raw`` seconds in each run after the workload.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import threading
import time
import uuid
from collections import defaultdict
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field
from typing import Any

import psycopg
from psycopg import sql
from psycopg.conninfo import make_conninfo

import pgstreams
from pgstreams.embedded import TemporaryServer, restartable_server

#: Seconds of each run (free, and each held one).
DURATION = 600.0
#: ``--quick``: seconds of each run.
QUICK_DURATION = 20.0
#: Seconds of the raw PostgreSQL measurement after each run.
RAW_SECONDS = 5.0
HOLDS = ("repeatable-read", "slot")
TOPIC = "t"
PARTITIONS = 4
#: pgstreams' frequently updated tables: the bound of the suite's test applies to every pgstreams table,
#: these are the ones the issue names (reported even when they have no dead tuple).
HOT_TABLES = ("checkpoints", "leases", "members", "share_groups", "share_partitions", "share_events",
              "producers", "maintenance")


@dataclass
class Run:
    """What one run did."""

    hold: str
    seconds: float
    published: int = 0
    consumed: int = 0
    handled: int = 0
    shared: int = 0
    raised: int = 0
    failed_services: int = 0
    per_s: dict[str, float] = field(default_factory=dict)
    latency_ms: dict[str, float] = field(default_factory=dict)
    calls: dict[str, int] = field(default_factory=dict)
    timeline: list[dict[str, float]] = field(default_factory=list)
    dead_tuples: dict[str, int] = field(default_factory=dict)
    updates: dict[str, list[int]] = field(default_factory=dict)
    catalog_dead_tuples: int = 0
    totals: dict[str, int] = field(default_factory=dict)  # every call and event since the start, at that read
    raw_per_s: float = 0.0
    errors: list[str] = field(default_factory=list)


class Workload:
    """The producers, the consumer, the worker group and the share worker on database ``dsn``."""

    def __init__(self, dsn: str) -> None:
        self.dsn = dsn
        self.stop = threading.Event()
        self.errors: list[str] = []
        self.counts: dict[str, int] = defaultdict(int)
        self.times: dict[str, list[float]] = defaultdict(list)
        self._lock = threading.Lock()
        with pgstreams.connect(dsn) as c:
            c.create_topic(TOPIC, PARTITIONS)
            with c.connection() as conn:
                conn.execute("CREATE TABLE handled (value bigint)")
        self.clients = [pgstreams.connect(dsn) for _ in range(4)]
        self.workers: list[pgstreams.Worker] = []
        for _ in range(2):
            w = pgstreams.Worker(pgstreams.connect(dsn))
            w.subscribe(TOPIC, "workers", self._handle, mode="transactional", heartbeat_interval=0.5,
                        session_timeout=3.0)
            self.workers.append(w)
        sw = pgstreams.Worker(pgstreams.connect(dsn))
        sw.subscribe(TOPIC, "sharers", self._share, share=True)
        self.workers.append(sw)
        self._consumer = self.clients[2].consumer(TOPIC, "readers")
        self._sql = psycopg.connect(dsn, autocommit=True)
        self._sql_producer = int(self._sql.execute("SELECT pgstreams.new_producer_id()").fetchone()[0])  # type: ignore[index]
        self._sequence = 0
        loops: list[Callable[[], None]] = [self._single, self._batch, self._consume, self._sql_publish]
        self.threads = [threading.Thread(target=self._guard(f), daemon=True) for f in loops]

    def _timed(self, kind: str, started: float, n: int = 1) -> None:
        with self._lock:
            self.times[kind].append(time.perf_counter() - started)
            self.counts[kind] += n

    def _handle(self, event: pgstreams.Event, conn: psycopg.Connection) -> None:
        conn.execute("INSERT INTO handled VALUES (%s)", (event.value,))
        with self._lock:
            self.counts["handled"] += 1

    def _share(self, event: pgstreams.Event) -> None:
        with self._lock:
            self.counts["shared"] += 1

    def _guard(self, fn: Callable[[], None]) -> Callable[[], None]:
        def run() -> None:
            while not self.stop.is_set():
                try:
                    fn()
                except Exception as exc:  # noqa: BLE001 - counted
                    self.errors.append(f"{type(exc).__name__}: {exc}")
                    time.sleep(0.1)
        return run

    def _single(self) -> None:
        t = time.perf_counter()
        self.clients[0].publish(TOPIC, 1, key=str(self.counts["publish"] % 100))
        self._timed("publish", t)

    def _batch(self) -> None:
        t = time.perf_counter()
        self.clients[1].publish_many(TOPIC, [{"value": i} for i in range(10)])
        self._timed("publish_many", t, 10)

    def _sql_publish(self) -> None:
        self._sequence += 1
        t = time.perf_counter()
        self._sql.execute("SELECT pgstreams.publish(%s, %s::jsonb, producer => %s, sequence => %s)",
                          (TOPIC, "1", self._sql_producer, self._sequence))
        self._timed("sql_publish", t)

    def _consume(self) -> None:
        t = time.perf_counter()
        got = self._consumer.poll(max_events=200, timeout=0.2)
        if got:
            self._timed("poll", t, len(got))
            t = time.perf_counter()
            self._consumer.commit(got)
            self._timed("commit", t)

    def start(self) -> None:
        for w in self.workers:
            w.start()
        for t in self.threads:
            t.start()

    def call_marks(self) -> dict[str, int]:
        """How many calls of each kind were timed so far."""
        with self._lock:
            return {k: len(v) for k, v in self.times.items()}

    def snapshot_counts(self) -> dict[str, int]:
        with self._lock:
            return dict(self.counts)

    def close(self) -> int:
        """Stop everything; return how many services failed."""
        self.stop.set()
        for t in self.threads:
            t.join(30)
        for w in self.workers:
            w.stop(10)
        failed = sum(w.failure is not None for w in self.workers)
        self._sql.close()
        for c in self.clients:
            c.close()
        for w in self.workers:
            w.client.close()  # type: ignore[attr-defined]  # a Client (the worker's port types it narrower)
        return failed


def new_database(server: TemporaryServer) -> str:
    """A fresh database on ``server``; its DSN."""
    name = f"snapshot_{uuid.uuid4().hex[:8]}"
    with psycopg.connect(server.dsn, autocommit=True) as conn:
        conn.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))
    return make_conninfo(server.dsn, dbname=name)


@contextmanager
def hold(kind: str, dsn: str) -> Iterator[None]:
    """Hold the horizon of database ``dsn`` as ``kind`` says (``"free"``: nothing) while the block runs."""
    if kind == "free":
        yield
        return
    with psycopg.connect(dsn, autocommit=True) as conn:
        if kind == "repeatable-read":
            conn.execute("BEGIN ISOLATION LEVEL REPEATABLE READ")
            conn.execute("SELECT count(*) FROM pg_class").fetchone()  # takes the snapshot
            try:
                yield
            finally:
                conn.execute("ROLLBACK")
        elif kind == "slot":
            slot = f"held_{uuid.uuid4().hex[:8]}"
            conn.execute("SELECT pg_create_logical_replication_slot(%s, 'pgoutput')", (slot,))
            try:
                yield
            finally:
                conn.execute("SELECT pg_drop_replication_slot(%s)", (slot,))
        else:
            raise ValueError(f"unknown hold {kind!r}")


def dead_tuples(dsn: str) -> tuple[dict[str, int], dict[str, list[int]], int]:
    """Per pgstreams table other than event segments: dead tuples, and [updates, HOT updates]; and the
    dead tuples of the system catalogs."""
    with psycopg.connect(dsn, autocommit=True) as conn:
        rows = conn.execute(
            "SELECT relname, n_dead_tup, n_tup_upd, n_tup_hot_upd FROM pg_stat_user_tables "
            "WHERE schemaname = 'pgstreams' AND relname !~ '^topic_[0-9]+(_[0-9]+)?$' ORDER BY relname"
        ).fetchall()
        catalog = conn.execute("SELECT coalesce(sum(n_dead_tup), 0) FROM pg_stat_sys_tables "
                               "WHERE schemaname = 'pg_catalog'").fetchone()
    dead = {r[0]: int(r[1]) for r in rows if r[1] or r[0] in HOT_TABLES}
    updates = {r[0]: [int(r[2]), int(r[3])] for r in rows if r[2]}
    return dead, updates, int(catalog[0]) if catalog else 0


def raw_rate(dsn: str, seconds: float) -> float:
    """Raw PostgreSQL: a single-row INSERT and an UPDATE of a one-row offset per event (autocommit), /s."""
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute("CREATE TABLE IF NOT EXISTS raw_events (id bigserial, v bytea)")
        conn.execute("CREATE TABLE IF NOT EXISTS raw_offset (id int PRIMARY KEY, pos bigint)")
        conn.execute("INSERT INTO raw_offset VALUES (1, 0) ON CONFLICT DO NOTHING")
        n = 0
        end = time.monotonic() + seconds
        while time.monotonic() < end:
            conn.execute("INSERT INTO raw_events (v) VALUES (%s)", (b"x" * 100,))
            conn.execute("UPDATE raw_offset SET pos = pos + 1 WHERE id = 1")
            n += 1
        return n / seconds


def run(server: TemporaryServer, kind: str, seconds: float, raw_seconds: float) -> Run:
    """One run of the workload for ``seconds`` with the horizon held as ``kind`` says."""
    dsn = new_database(server)
    out = Run(kind, seconds)
    with hold(kind, dsn):
        w = Workload(dsn)
        w.start()
        begin = w.snapshot_counts()
        marks = [w.call_marks()]
        step = seconds / 10
        prev = begin
        for _ in range(10):  # the rates of each tenth of the run: does the held horizon slow it down?
            time.sleep(step)
            now = w.snapshot_counts()
            out.timeline.append({k: round((now.get(k, 0) - prev.get(k, 0)) / step, 1)
                                 for k in ("publish", "publish_many", "sql_publish", "poll", "handled",
                                           "shared")})
            prev = now
        end = prev
        marks.append(w.call_marks())
        time.sleep(1.5)  # statistics reach the shared counters at most once a second
        out.totals = w.snapshot_counts()
        out.dead_tuples, out.updates, out.catalog_dead_tuples = dead_tuples(dsn)
        out.failed_services = w.close()
        # raw in the same conditions (the horizon still held)
        out.raw_per_s = round(raw_rate(dsn, raw_seconds), 1)
    done = {k: end.get(k, 0) - begin.get(k, 0) for k in end}
    out.published = done.get("publish", 0) + done.get("publish_many", 0) + done.get("sql_publish", 0)
    out.consumed = done.get("poll", 0)
    out.handled = done.get("handled", 0)
    out.shared = done.get("shared", 0)
    out.per_s = {k: round(v / seconds, 1) for k, v in (
        ("published", out.published), ("consumed", out.consumed), ("handled", out.handled),
        ("shared", out.shared))}
    window = {k: v[marks[0].get(k, 0):marks[1].get(k, 0)] for k, v in sorted(w.times.items())}
    out.per_s.update({f"{k} calls": round(len(v) / seconds, 1) for k, v in window.items()})
    out.latency_ms = {k: round(statistics.fmean(v) * 1000, 3) for k, v in window.items() if v}
    out.calls = {k: len(v) for k, v in window.items()}
    out.raised = len(w.errors)
    out.errors = w.errors[:5]
    return out


def ratios(free: Run, held: Run) -> dict[str, float | None]:
    """held / free of every rate, and of the raw figure."""
    out: dict[str, float | None] = {
        k: (round(held.per_s.get(k, 0) / v, 3) if v else None) for k, v in free.per_s.items()}
    out["raw"] = round(held.raw_per_s / free.raw_per_s, 3) if free.raw_per_s else None
    return out


def main(argv: list[str] | None = None) -> dict[str, Any]:
    ap = argparse.ArgumentParser(prog="python -m bench.snapshot", description=__doc__.split("\n\n")[0])
    ap.add_argument("--duration", type=float, default=DURATION,
                    help=f"seconds of each run (default {DURATION:g})")
    ap.add_argument("--quick", action="store_true", help=f"{QUICK_DURATION:g} s per run")
    ap.add_argument("--holds", default=",".join(HOLDS),
                    help=f"held runs after the free one, comma separated (default {','.join(HOLDS)})")
    ap.add_argument("--raw", type=float, default=RAW_SECONDS,
                    help=f"seconds of the raw PostgreSQL figure per run (default {RAW_SECONDS:g})")
    ap.add_argument("--json", action="store_true", help="print the result as one JSON line")
    args = ap.parse_args(argv)
    holds = [h.strip() for h in args.holds.split(",") if h.strip()]
    bad = set(holds) - set(HOLDS)
    if bad:
        ap.error(f"unknown hold(s) {sorted(bad)}; choose from {', '.join(HOLDS)}")
    if args.duration <= 0:
        ap.error("--duration must be positive")
    seconds = QUICK_DURATION if args.quick else args.duration
    load = [round(x, 2) for x in os.getloadavg()]
    runs: list[Run] = []
    with restartable_server({"fsync": "off", "wal_level": "logical"}) as server:
        for kind in ("free", *holds):
            r = run(server, kind, seconds, args.raw)
            runs.append(r)
            if not args.json:
                print(json.dumps(asdict(r)), flush=True)
    result: dict[str, Any] = {
        "seconds": seconds, "load_start": load, "load_end": [round(x, 2) for x in os.getloadavg()],
        "runs": [asdict(r) for r in runs], "ratios": {r.hold: ratios(runs[0], r) for r in runs[1:]}}
    if args.json:
        print(json.dumps(result), flush=True)
    else:
        for r in runs[1:]:
            print(f"{r.hold} / free: {json.dumps(result['ratios'][r.hold])}", flush=True)
        print(f"load average: {load} at the start, {result['load_end']} at the end", flush=True)
    return result


if __name__ == "__main__":
    main()
