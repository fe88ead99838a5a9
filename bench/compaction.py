"""The compaction benchmark: a full compaction of a large compacted topic, its cost in time, space and dead
tuples, and publish and poll throughput during it against without it, beside the raw PostgreSQL figures
measured in the same run.

    python -m bench.compaction [--dsn DSN] [--events N] [--keys N] [--backlog N] [--window SECONDS]
                               [--producers N] [--duty D] [--segment-events N] [--markdown]

* One topic of 4 partitions (``segment.events`` 1,000,000, ``--segment-events``) filled server-side
  (untimed) with ``--events`` (default 10,000,000) events of 100-byte values over ``--keys`` (default
  100,000) keys, stamped a day old, then with ``--backlog`` (default 3,000,000) new events: every full
  segment sealed by a maintenance pass while the topic is still ``cleanup.policy=delete``.
* ``without compaction``: for ``--window`` seconds (default 30), ``--producers`` processes (default 2)
  ``publish_many`` batches of 1,000 keyed events to the topic and one process polls it (``poll(1000)``
  and a commit) from the start of the backlog.
* ``during compaction``: the topic becomes ``cleanup.policy=compact`` with ``min.compaction.lag.ms`` one
  hour (the day-old events are due, the backlog and the new events are not), and the same processes run
  again (another group) while one maintenance pass compacts (``compaction_budget=None``): every sealed
  day-old segment is mapped and rewritten (``--duty``: the pass's ``compaction_duty``, default the library's
  0.5; 1.0: no pauses). Reported: the pass's time and events/s, the space of the
  topic before and after, the dead tuples of the topic's tables after it (``pg_stat_user_tables``) and of
  compaction's bookkeeping tables, and the publish and poll rates against those without compaction (the
  goal: >= 0.8 x).
* ``without compaction again``: the same processes once more (a third group) after the pass; the rates
  without compaction are the mean of this window's and the first's (a machine whose speed drifts moves the
  mean of the windows around compaction less than the one before it).
* Raw PostgreSQL in the same run: the COPY-in rate of 1,000-row batches (the machine's limit), and the
  same compaction done on a plain table holding a copy of the day-old events: the latest row of each key
  written to a new table with ``CREATE TABLE AS SELECT DISTINCT ON`` (the floor of a rewrite), and the
  superseded rows removed with one ``DELETE`` instead (its time and the dead tuples it leaves).

It creates its own database on the server (``--dsn``, else ``$PGSTREAMS_DSN``, else the embedded server;
this machine only) and drops it at the end.
"""

from __future__ import annotations

import argparse
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import datetime, timezone

import psycopg
from psycopg import sql
from rich.console import Console

import pgstreams
from pgstreams.maintenance import DEFAULT_COMPACTION_DUTY

from ._common import (
    DONE,
    Job,
    Measurement,
    RawTarget,
    create_raw_table,
    machine,
    make_console,
    markdown,
    print_results,
    raw_copy_in,
    run_jobs,
    run_parallel,
    scratch_database,
    server_dsn,
)
from .core import TopicTarget, publish_many_op

EVENTS = 10_000_000
KEYS = 100_000
BACKLOG = 3_000_000
WINDOW = 30.0
PRODUCERS = 2
PARTITIONS = 4
SEGMENT = 1_000_000
LIMIT = 0.8  #: publish and poll rates during compaction / without
TOPIC = "state"

_FILL = sql.SQL(
    "INSERT INTO {table} (partition, position, created_at, kind, key, value)"
    " SELECT (g %% {keys}) %% {parts}, nextval({seq}::regclass), now() - {age}::interval, 'b',"
    "        {prefix} || (g %% {keys}), decode(lpad(to_hex(g), 16, '0') || repeat('ab', 92), 'hex')"
    "   FROM generate_series(%s::bigint, %s::bigint) AS g"
)
#: the size of the segments holding positions below a bound (the day-old events)
_SIZE = sql.SQL(
    "SELECT coalesce(sum(pg_total_relation_size(format('pgstreams.%%I', 'topic_' || s.topic_id || '_s'"
    " || s.segment)::regclass)), 0) FROM pgstreams.segments s WHERE s.topic_id = %s AND s.hi <= %s"
)
_DEAD = sql.SQL(
    "SELECT coalesce(sum(n_dead_tup), 0) FROM pg_stat_user_tables"
    " WHERE schemaname = 'pgstreams' AND relname ~ %s"
)
#: the key map's updates, those that stayed on their page (heap-only, pruned without VACUUM) and the
#: autovacuum runs on it (which remove dead tuples too: the count of dead tuples alone does not tell)
_KEY_MAP = sql.SQL(
    "SELECT n_tup_upd, n_tup_hot_upd, autovacuum_count FROM pg_stat_user_tables"
    " WHERE schemaname = 'pgstreams' AND relname = 'compaction_keys'"
)
_RAW_COPY = sql.SQL("CREATE TABLE raw_log AS SELECT * FROM {table} WHERE position <= %s")
_RAW_INDEX = sql.SQL("CREATE INDEX ON raw_log (partition, key, position)")
_RAW_DISTINCT = sql.SQL(
    "CREATE TABLE raw_compacted AS SELECT DISTINCT ON (partition, key) * FROM raw_log"
    " ORDER BY partition, key, position DESC"
)
_RAW_DELETE = sql.SQL(
    "DELETE FROM raw_log r USING (SELECT partition, key, max(position) AS last FROM raw_log"
    " GROUP BY partition, key) l WHERE r.partition = l.partition AND r.key = l.key AND r.position < l.last"
)


@dataclass(frozen=True)
class BacklogTarget:
    """The topic's backlog, read by a group from ``start`` (the time the backlog was written from)."""

    dsn: str
    group: str
    start: datetime


@contextmanager
def backlog_op(t: BacklogTarget) -> Iterator[Callable[[], int]]:
    """Operation: one ``poll(1000)`` and a commit of a group reading the topic from ``t.start``."""
    with pgstreams.connect(t.dsn, migrate=False, pool_size=2) as client:
        consumer = client.consumer(TOPIC, t.group, start=t.start)

        def op() -> int:
            events = consumer.poll(1000, timeout=1.0)
            if not events:
                return DONE
            consumer.commit()
            return len(events)

        yield op


def _fill(conn: psycopg.Connection, tid: int, lo: int, hi: int, keys: int, age: str, prefix: str) -> None:
    stmt = _FILL.format(table=sql.Identifier("pgstreams", f"topic_{tid}"), keys=sql.Literal(keys),
                        parts=sql.Literal(PARTITIONS), seq=sql.Literal(f"pgstreams.topic_{tid}_seq"),
                        age=sql.Literal(age), prefix=sql.Literal(prefix))
    for start in range(lo, hi, 1_000_000):
        conn.execute(stmt, (start, min(hi, start + 1_000_000) - 1))
        conn.commit()


def _one(conn: psycopg.Connection, query: sql.Composed | sql.SQL | str,
         params: tuple[object, ...] = ()) -> int:
    row = conn.execute(query, params).fetchone()
    assert row is not None
    return int(row[0])


def _timed(conn: psycopg.Connection, query: sql.Composed | sql.SQL) -> float:
    """Seconds of ``query`` and its commit."""
    t0 = time.perf_counter()
    conn.execute(query)
    conn.commit()
    return time.perf_counter() - t0


def _rates(db: str, group: str, start: datetime, window: float, producers: int
           ) -> tuple[float, float]:
    publish = Job(publish_many_op, TopicTarget(db, TOPIC, batch=1000), window)
    poll = Job(backlog_op, BacklogTarget(db, group, start), window)
    got = run_jobs([publish] * producers + [poll])
    return sum(r.rate for r in got[:producers]), got[-1].rate


def run(db: str, events: int, keys: int, backlog: int, window: float, producers: int, duty: float,
        console: Console, segment: int = SEGMENT) -> list[Measurement]:
    """The measurements (see the module docstring); ``segment``: the topic's events per segment."""
    create_raw_table(db, "raw_copy_in")
    raw_in = run_parallel(raw_copy_in, RawTarget(db, "raw_copy_in", PARTITIONS), 1, 3.0)
    with pgstreams.connect(db) as client:
        client.create_topic(TOPIC, PARTITIONS, config={"segment.events": segment})
        tid = client.topic_record(TOPIC).id
        table = sql.Identifier("pgstreams", f"topic_{tid}")
        pattern = f"^topic_{tid}_s[0-9]+$"
        old_end = events // segment * segment  # the segments below hold only day-old events
        with client.connection() as conn:
            conn.execute("SELECT pgstreams.ensure_segments(%s, %s)", (tid, events + backlog + 2 * segment))
            conn.commit()
            t0 = time.monotonic()
            _fill(conn, tid, 0, events, keys, "1 day", "c")
            backlog_from = datetime.now(timezone.utc)
            _fill(conn, tid, events, events + backlog, keys, "0 seconds", "b")  # keys of their own
            console.print(f"  filled {events + backlog:,} events in {time.monotonic() - t0:.0f} s")
            client.maintain()  # seals the full segments
            console.print("  raw: the day-old events copied to a plain table")
            conn.execute(_RAW_COPY.format(table=table), (events,))
            conn.execute(_RAW_INDEX)
            conn.commit()
            raw_distinct = _timed(conn, _RAW_DISTINCT)
            raw_kept = _one(conn, "SELECT count(*) FROM raw_compacted")
            raw_delete = _timed(conn, _RAW_DELETE)
            conn.execute("SELECT pg_stat_force_next_flush()")
            conn.commit()
            raw_dead = _one(conn, "SELECT n_dead_tup FROM pg_stat_user_tables WHERE relname = 'raw_log'")
            conn.execute("DROP TABLE raw_log, raw_compacted")
            conn.commit()
            before = _one(conn, _SIZE, (tid, old_end))
        console.print(f"  without compaction: {window:.0f} s of {producers} producer(s) and a consumer")
        pub_a, poll_a = _rates(db, "without", backlog_from, window, producers)
        client.alter_topic(TOPIC, {"cleanup.policy": "compact", "min.compaction.lag.ms": 3_600_000})
        console.print("  during compaction: the same, while a maintenance pass compacts the topic")
        outcome: dict[str, object] = {}

        def compact() -> None:
            with pgstreams.connect(db, migrate=False) as maintainer:
                t = time.perf_counter()
                outcome["report"] = maintainer.maintain(compaction_budget=None, compaction_duty=duty)
                outcome["seconds"] = time.perf_counter() - t

        thread = threading.Thread(target=compact, name="bench-compaction")
        thread.start()
        pub_b, poll_b = _rates(db, "during", backlog_from, window, producers)
        thread.join()
        # the same window again once compaction is done: the rates without it are the mean of the windows
        # before and after, which a machine whose speed drifts moves less than the window before alone
        console.print("  without compaction again: the same, after it")
        pub_c, poll_c = _rates(db, "after", backlog_from, window, producers)
        pub_a, poll_a = (pub_a + pub_c) / 2, (poll_a + poll_c) / 2
        report = outcome["report"]
        assert isinstance(report, pgstreams.MaintenanceReport)
        seconds = float(outcome["seconds"])  # type: ignore[arg-type]
        with client.connection() as conn:
            conn.execute("SELECT pg_stat_force_next_flush()")
            conn.commit()
            after = _one(conn, _SIZE, (tid, old_end))
            dead = _one(conn, _DEAD, (pattern,))
            books = _one(conn, _DEAD, ("^(compaction_keys|segments|segment_partitions)$",))
            row = conn.execute(_KEY_MAP).fetchone()
            upd, hot, vacuums = (int(v) for v in row) if row else (0, 0, 0)
        status = client.retention_status(TOPIC)[0]
    console.print(f"  compaction: {report.segments_compacted} segments rewritten, {report.events_compacted:,}"
                  f" events removed in {seconds:.1f} s")
    overlap = min(1.0, seconds / window)
    return [
        Measurement(f"full compaction of {events:,} events / {keys:,} keys (one pass, under load"
                    + f", duty {duty:g})",
                    seconds, "s", raw_distinct, "CREATE TABLE AS SELECT DISTINCT ON (plain copy)",
                    f"{report.segments_compacted} segments, {report.events_compacted:,} removed",
                    higher_is_better=False),
        Measurement("compaction rate", events / seconds, "events/s", events / raw_distinct,
                    "the same, raw"),
        Measurement("raw: the same by one DELETE of superseded rows", raw_delete, "s",
                    floor=f"{raw_dead:,} dead tuples left (pgstreams: {dead:,})", higher_is_better=False),
        Measurement("space of the day-old segments before / after", before / 2**20, "MiB", after / 2**20,
                    "after (pgstreams)",
                    f"{status.bytes_compacted / 2**20:,.0f} MiB freed by compaction; raw kept {raw_kept:,}"
                    " rows"),
        Measurement("dead tuples in the topic's tables after compaction", dead, "rows",
                    floor=f"goal 0; bookkeeping tables: {books:,} (key map: {upd:,} updates,"
                    f" {hot / max(upd, 1):.0%} on their page; autovacuum {vacuums}x)", ok=dead == 0,
                    higher_is_better=False),
        Measurement(f"publish rate during compaction ({overlap:.0%} of the window)", pub_b, "events/s",
                    pub_a, "without compaction (before and after)", f">= {LIMIT:.1f} x",
                    ok=pub_b >= LIMIT * pub_a),
        Measurement(f"poll rate during compaction ({overlap:.0%} of the window)", poll_b, "events/s",
                    poll_a, "without compaction (before and after)", f">= {LIMIT:.1f} x",
                    ok=poll_b >= LIMIT * poll_a),
        Measurement("raw COPY-in of 1,000-row batches (machine limit)", raw_in, "events/s"),
    ]


def main(argv: list[str] | None = None) -> int:
    """Entry point of ``python -m bench.compaction``."""
    ap = argparse.ArgumentParser(prog="python -m bench.compaction", description=__doc__.split("\n\n")[0])
    ap.add_argument("--dsn", help="server to use (default $PGSTREAMS_DSN, else the embedded server); "
                    "a database is created on it and dropped afterwards")
    ap.add_argument("--events", type=int, default=EVENTS, help=f"day-old events (default {EVENTS:,})")
    ap.add_argument("--keys", type=int, default=KEYS, help=f"distinct keys (default {KEYS:,})")
    ap.add_argument("--backlog", type=int, default=BACKLOG, help=f"new events read by the consumer "
                    f"(default {BACKLOG:,})")
    ap.add_argument("--window", type=float, default=WINDOW, help=f"seconds of each throughput run "
                    f"(default {WINDOW:.0f})")
    ap.add_argument("--producers", type=int, default=PRODUCERS,
                    help=f"producer processes (default {PRODUCERS})")
    ap.add_argument("--duty", type=float, default=DEFAULT_COMPACTION_DUTY,
                    help=f"compaction_duty of the compacting pass (default {DEFAULT_COMPACTION_DUTY:g}, the "
                    "library's; 1.0: no pauses)")
    ap.add_argument("--segment-events", type=int, default=SEGMENT,
                    help=f"events per segment of the topic (default {SEGMENT:,})")
    ap.add_argument("--markdown", action="store_true", help="also print the table in Markdown")
    args = ap.parse_args(argv)
    if args.segment_events < 1000 or args.events < 2 * args.segment_events or args.keys < PARTITIONS \
            or args.keys % PARTITIONS or args.window <= 0 or not 0 < args.duty <= 1:
        ap.error(f"need --segment-events >= 1,000, --events >= twice that, --keys a multiple of {PARTITIONS},"
                 " --window > 0 and 0 < --duty <= 1")
    console = make_console()
    started = time.monotonic()
    target = server_dsn(args.dsn)
    info = machine(target)
    with scratch_database(target, "pgstreams_bench_compaction") as db:
        rows = run(db, args.events, args.keys, args.backlog, args.window, args.producers, args.duty, console,
                   args.segment_events)
    print_results("pgstreams compaction benchmark", rows, console)
    console.print(
        f"{info['cpu']}, {info['cores']} cores, {info['ram']} RAM; PostgreSQL {info['postgresql']}; "
        f"Python {info['python']}, psycopg {info['psycopg']}; load before run {info['load']}, after "
        f"{machine(target)['load']}; took {time.monotonic() - started:.0f} s"
    )
    console.print(f"settings: {info['settings']}")
    if args.markdown:
        console.print(markdown(rows), markup=False, highlight=False, soft_wrap=True)
    return 0 if all(m.ok is not False for m in rows) else 1


if __name__ == "__main__":
    raise SystemExit(main())
