"""Handlers run by worker processes in the tests, and a launcher for them.

    python tests/workers_app.py --dsn DSN --topic T --group G --handler record_tx [--mode transactional] ...

``WORKERS_APP_NAME`` names the member (default: the pid) and ``WORKERS_APP_SLEEP`` is the seconds each
handler call sleeps (default 0). The tables the handlers write are created by :func:`create_tables`.
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
import threading
import time
from collections.abc import Sequence

import psycopg

import pgstreams

NAME = os.environ.get("WORKERS_APP_NAME", str(os.getpid()))
SLEEP = float(os.environ.get("WORKERS_APP_SLEEP", "0") or 0)
_DSN = os.environ.get("WORKERS_APP_DSN", "")
_local = threading.local()

TABLES = """
CREATE TABLE IF NOT EXISTS handled (
    topic text NOT NULL, partition integer NOT NULL, position bigint NOT NULL, member text NOT NULL,
    txid bigint NOT NULL, at timestamptz NOT NULL DEFAULT clock_timestamp(),
    CONSTRAINT handled_once UNIQUE (topic, position)
);
CREATE TABLE IF NOT EXISTS deliveries (
    topic text NOT NULL, partition integer NOT NULL, position bigint NOT NULL, member text NOT NULL,
    at timestamptz NOT NULL DEFAULT clock_timestamp()
);
CREATE TABLE IF NOT EXISTS batches_started (
    n integer NOT NULL, member text NOT NULL, at timestamptz NOT NULL DEFAULT clock_timestamp()
);
"""


def create_tables(dsn: str) -> None:
    """Create the tables the handlers write to."""
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(TABLES)


def _log_conn() -> psycopg.Connection:
    conn = getattr(_local, "conn", None)
    if conn is None or conn.closed:
        conn = psycopg.connect(_DSN, autocommit=True)
        _local.conn = conn
    return conn


def _row(ev: pgstreams.Event) -> tuple[str, int, int, str]:
    return (ev.topic, ev.partition, ev.position, NAME)


def _handled_row(ev: pgstreams.Event) -> tuple[str, int, int, str, int]:
    return (ev.topic, ev.partition, ev.position, NAME, ev.txid)


_INSERT_HANDLED = "INSERT INTO handled (topic, partition, position, member, txid) VALUES (%s, %s, %s, %s, %s)"
_INSERT_DELIVERY = "INSERT INTO deliveries (topic, partition, position, member) VALUES (%s, %s, %s, %s)"


def record_tx(event: pgstreams.Event, conn: psycopg.Connection) -> None:
    """Transactional: one row per event in ``handled`` (unique per event), in the checkpoint's transaction."""
    if SLEEP:
        time.sleep(SLEEP)
    conn.execute(_INSERT_HANDLED, _handled_row(event))


def record(event: pgstreams.Event) -> None:
    """At-least-once: log every delivery in ``deliveries`` (autocommit, duplicates kept). The member named
    ``a`` spends 3 s on an event whose value is ``{"block": true}``."""
    _log_conn().execute(_INSERT_DELIVERY, _row(event))
    if NAME == "a" and isinstance(event.value, dict) and event.value.get("block"):
        time.sleep(3.0)
    if SLEEP:
        time.sleep(SLEEP)


def slow_batch_tx(events: Sequence[pgstreams.Event], conn: psycopg.Connection) -> None:
    """Transactional batch: note the start in ``batches_started`` (outside the transaction), sleep,
    then write one ``handled`` row per event."""
    _log_conn().execute("INSERT INTO batches_started (n, member) VALUES (%s, %s)", (len(events), NAME))
    if SLEEP:
        time.sleep(SLEEP)
    with conn.cursor() as cur:
        cur.executemany(_INSERT_HANDLED, [_handled_row(e) for e in events])


def sleepy(event: pgstreams.Event) -> None:
    """At-least-once, no writes: sleep ``WORKERS_APP_SLEEP`` per event (I/O-bound work)."""
    if SLEEP:
        time.sleep(SLEEP)


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--dsn", required=True)
    ap.add_argument("--topic", required=True)
    ap.add_argument("--group", required=True)
    ap.add_argument("--handler", required=True)
    ap.add_argument("--mode", default="at-least-once")
    ap.add_argument("--batch", action="store_true")
    ap.add_argument("--min-events", type=int, default=1)
    ap.add_argument("--max-events", type=int, default=100)
    ap.add_argument("--max-wait", type=float, default=1.0)
    ap.add_argument("--heartbeat", type=float, default=0.2)
    ap.add_argument("--session", type=float, default=1.5)
    ap.add_argument("--poll-interval", type=float, default=0.1)
    args = ap.parse_args(argv)
    global _DSN
    _DSN = args.dsn
    logging.basicConfig(level=logging.INFO, stream=sys.stderr,
                        format=f"%(asctime)s {NAME} %(threadName)s %(levelname)s %(message)s")
    handler = globals()[args.handler]
    with pgstreams.connect(args.dsn, pool_size=4, poll_interval=args.poll_interval) as client:
        worker = pgstreams.Worker(client, member_id=NAME)
        worker.subscribe(args.topic, args.group, handler, batch=args.batch, min_events=args.min_events,
                         max_events=args.max_events, max_wait=args.max_wait, mode=args.mode,
                         heartbeat_interval=args.heartbeat, session_timeout=args.session)
        worker.run()
        logging.info("stopped: %s", worker.stats.snapshot())
    return 0


if __name__ == "__main__":
    sys.exit(main())
