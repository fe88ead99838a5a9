"""Production topologies: pgstreams directly, behind PgBouncer in session mode and in transaction mode (with
and without ``listen_dsn``), and across the promotion of a synchronous standby.

    python -m bench.topologies [--events 50000] [--seconds 3] [--failovers 3] [--markdown]

Every server is the benchmark's own: a PostgreSQL on loopback (the embedded server's binaries, default
settings: fsync and synchronous commit on), Debian's PgBouncer in front of it (``/usr/sbin/pgbouncer``,
20 server connections per database), and for the failover a primary with a synchronous standby made by
``pg_basebackup``. For each route, one after the other on the same server:

* **publish**: single-event ``publish`` calls for ``--seconds``;
* **publish_many**: ``--events`` events in batches of 1,000;
* **consume**: those events drained by a new group with ``poll_batch(1000)`` and ``commit()``;
* **wake-up**: a consumer waiting in ``poll()`` while one event is published every 20 ms for ``--seconds``
  (after half a second not counted); p50 and p99 of publish-to-receive (the publish's own commit included).

Floors: throughput through the pooler at least 0.8 x direct; wake-up p99 with LISTEN available (direct,
session pooler, transaction pooler with ``listen_dsn``) within 2 x direct. The transaction pooler without
``listen_dsn`` polls (docs/operations.md): reported, no floor.

**failover**: a publisher on the multi-host DSN (``target_session_attrs=read-write``) publishing single
events; the primary is stopped (immediate) and the standby promoted: the promotion's own time
(``pg_ctl promote``) next to the publisher's outage (from the kill to its first acknowledged publish),
``--failovers`` times.
"""

from __future__ import annotations

import argparse
import logging
import statistics
import sys
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass
from typing import Any

import psycopg
from psycopg.conninfo import make_conninfo

import pgstreams
from pgstreams.embedded import restartable_server

from ._common import Measurement, machine, make_console, markdown, percentile, print_results
from ._servers import pgbouncer, standby_pair

BATCH = 1000
#: Seconds between the events of the wake-up measurement.
WAKE_INTERVAL = 0.02
#: Seconds of the wake-up measurement whose events are not counted (the waiting consumer settles).
WAKE_WARM_UP = 0.5


@dataclass(frozen=True)
class Route:
    """How a client reaches the server: its DSN and ``connect()`` options."""

    name: str
    dsn: str
    options: dict[str, Any]
    listens: bool  # LISTEN reaches the server (direct, a session pooler, or a listen_dsn)


def _publish_rate(client: pgstreams.Client, topic: str, seconds: float) -> float:
    n, start = 0, time.perf_counter()
    while (elapsed := time.perf_counter() - start) < seconds:
        client.publish(topic, b"x" * 100, key=str(n % 1000))
        n += 1
    return n / elapsed


def _publish_many_rate(client: pgstreams.Client, topic: str, events: int) -> float:
    batch = [pgstreams.Message(b"x" * 100, key=str(i % 1000)) for i in range(BATCH)]
    start = time.perf_counter()
    for _ in range(events // BATCH):
        client.publish_many(topic, batch)
    return (events // BATCH * BATCH) / (time.perf_counter() - start)


def _consume_rate(client: pgstreams.Client, topic: str, group: str, events: int) -> float:
    consumer = client.consumer(topic, group)
    seen, start = 0, time.perf_counter()
    deadline = time.monotonic() + 300
    while seen < events and time.monotonic() < deadline:
        got = consumer.poll_batch(BATCH, timeout=1.0)
        if len(got):
            consumer.commit()
        seen += len(got)
    if seen < events:
        raise RuntimeError(f"the consumer read {seen:,} of {events:,} events in 300 s")
    return seen / (time.perf_counter() - start)


def _wake_up(client: pgstreams.Client, topic: str, seconds: float) -> tuple[float, float]:
    """p50 and p99 (ms) of publish-to-receive, one event every :data:`WAKE_INTERVAL` s."""
    consumer = client.consumer(topic, "wake", start="latest")
    consumer.poll(timeout=0.1)  # joined, positioned at the end
    delays: list[float] = []
    stop = threading.Event()
    errors: list[BaseException] = []

    def receive() -> None:
        try:
            while not stop.is_set():
                for e in consumer.poll(100, timeout=0.5):
                    stamp = float(e.value)
                    if stamp >= measured_from:
                        delays.append(time.time() - stamp)
                consumer.commit()
        except BaseException as exc:  # noqa: BLE001 - reported by the caller
            errors.append(exc)

    # the first WAKE_WARM_UP seconds' events are not measured (the consumer's first waits set it up)
    measured_from = time.time() + WAKE_WARM_UP
    thread = threading.Thread(target=receive, daemon=True)
    thread.start()
    sent = 0
    start = time.monotonic()
    while time.monotonic() - start < WAKE_WARM_UP + seconds:
        now = time.time()
        client.publish(topic, repr(now))
        sent += now >= measured_from
        time.sleep(WAKE_INTERVAL)
    deadline = time.monotonic() + 30
    while len(delays) < sent and time.monotonic() < deadline and not errors:
        time.sleep(0.05)
    stop.set()
    thread.join(30)
    if errors:
        raise RuntimeError(f"the waiting consumer failed: {errors[0]}")
    if len(delays) < sent:
        raise RuntimeError(f"the waiting consumer received {len(delays)} of {sent} events")
    ms = [d * 1000 for d in delays]
    return percentile(ms, 50), percentile(ms, 99)


def measure_route(route: Route, events: int, seconds: float) -> dict[str, float]:
    """The four measurements over ``route``, on topics of its own."""
    out: dict[str, float] = {}
    tag = route.name.split()[0].replace("-", "_")
    with pgstreams.connect(route.dsn, **route.options) as client:
        for t in ("singles", "batches", "wake"):
            client.create_topic(f"{tag}_{t}", partitions=4)
        _publish_rate(client, f"{tag}_singles", 0.5)  # warm-up: connections, plans
        out["publish"] = _publish_rate(client, f"{tag}_singles", seconds)
        out["publish_many"] = _publish_many_rate(client, f"{tag}_batches", events)
        out["consume"] = _consume_rate(client, f"{tag}_batches", "drain", events // BATCH * BATCH)
        out["p50"], out["p99"] = _wake_up(client, f"{tag}_wake", seconds)
    return out


def _failover_once() -> tuple[float, float]:
    """One failover under a publisher: (promotion seconds, kill to the first acknowledged publish)."""
    with standby_pair() as pair, pgstreams.connect(pair.dsn, retry_timeout=60) as client:
        client.create_topic("t", partitions=2)
        acks: list[float] = []
        stop = threading.Event()
        errors: list[BaseException] = []

        def publish() -> None:
            try:
                while not stop.is_set():
                    client.publish("t", b"x")
                    acks.append(time.monotonic())
            except BaseException as exc:  # noqa: BLE001 - reported below
                errors.append(exc)

        thread = threading.Thread(target=publish, daemon=True)
        thread.start()
        while len(acks) < 200 and not errors:
            time.sleep(0.01)
        pair.primary.stop("immediate")
        killed = time.monotonic()
        pair.promote()
        promoted = time.monotonic() - killed
        deadline = time.monotonic() + 60
        while not any(t > killed for t in acks) and time.monotonic() < deadline and not errors:
            time.sleep(0.01)
        stop.set()
        thread.join(60)
    if errors:
        raise RuntimeError(f"a publish failed across the failover: {errors[0]}")
    after = [t for t in acks if t > killed]
    if not after:
        raise RuntimeError("no publish was acknowledged within 60 s of the failover")
    return promoted, after[0] - killed


def failover(rounds: int) -> list[tuple[float, float]]:
    """``rounds`` times: (promotion seconds, kill to the first acknowledged publish in seconds)."""
    return [_failover_once() for _ in range(rounds)]


@contextmanager
def routes(db: str) -> Iterator[list[Route]]:
    """Direct, PgBouncer in session mode, in transaction mode with and without ``listen_dsn``."""
    with ExitStack() as stack:
        session = stack.enter_context(pgbouncer(db, "session"))
        transaction = stack.enter_context(pgbouncer(db, "transaction"))
        yield [
            Route("direct", db, {}, True),
            Route("session-pooled (PgBouncer, session mode)", session(db), {}, True),
            Route("transaction-pooled with listen_dsn (PgBouncer, transaction mode)", transaction(db),
                  {"pooler": "transaction", "listen_dsn": db}, True),
            Route("transaction-polled (PgBouncer, transaction mode, no listen_dsn)", transaction(db),
                  {"pooler": "transaction"}, False),
        ]


def run(events: int, seconds: float, failovers: int, log: Callable[[str], None]) -> tuple[
        list[Measurement], dict[str, str]]:
    rows: list[Measurement] = []
    with restartable_server() as server:
        info = machine(server.dsn)
        with psycopg.connect(server.dsn, autocommit=True) as conn:
            conn.execute("CREATE DATABASE bench")
        db = make_conninfo(server.dsn, dbname="bench")
        with pgstreams.connect(db):
            pass  # migrated
        with routes(db) as rs:
            results = {}
            for r in rs:
                results[r.name] = measure_route(r, events, seconds)
                log(f"{r.name}: " + ", ".join(f"{k} {v:,.1f}" for k, v in results[r.name].items()))
        direct = results["direct"]
        for r in rs:
            got = results[r.name]
            pooled = r.name != "direct"
            for k, label in (("publish", "publish (single events)"),
                             ("publish_many", f"publish_many (batches of {BATCH:,})"),
                             ("consume", f"consume (poll_batch({BATCH:,}) + commit)")):
                ok = got[k] >= 0.8 * direct[k] if pooled else None
                rows.append(Measurement(f"{r.name}: {label}", got[k], "events/s",
                                        direct[k] if pooled else None, "direct" if pooled else "",
                                        ">= 0.8 x direct" if pooled else "", ok))
            rows.append(Measurement(f"{r.name}: wake-up p50", got["p50"], "ms", higher_is_better=False))
            floor = pooled and r.listens
            rows.append(Measurement(f"{r.name}: wake-up p99", got["p99"], "ms",
                                    direct["p99"] if pooled else None, "direct" if pooled else "",
                                    "<= 2 x direct" if floor else "",
                                    got["p99"] <= 2 * direct["p99"] if floor else None,
                                    higher_is_better=False))
    if failovers:
        fo = failover(failovers)
        for i, (promoted, outage) in enumerate(fo, 1):
            log(f"failover {i}: promotion {promoted * 1000:.0f} ms, "
                f"publisher's outage {outage * 1000:.0f} ms")
        rows.append(Measurement(f"failover: promotion of the synchronous standby (median of {len(fo)})",
                                statistics.median(p for p, _ in fo) * 1000, "ms", higher_is_better=False))
        rows.append(Measurement(f"failover: kill to the first acknowledged publish (median of {len(fo)}; "
                                f"max {max(o for _, o in fo) * 1000:.0f} ms)",
                                statistics.median(o for _, o in fo) * 1000, "ms", higher_is_better=False))
    return rows, info


def main(argv: list[str] | None = None) -> int:
    """Entry point of ``python -m bench.topologies``."""
    ap = argparse.ArgumentParser(prog="python -m bench.topologies", description=__doc__.split("\n\n")[0])
    ap.add_argument("--events", type=int, default=50_000, help="events of publish_many and consume (50,000)")
    ap.add_argument("--seconds", type=float, default=3.0,
                    help="seconds of the single-event publish and of the wake-up measurements (3)")
    ap.add_argument("--failovers", type=int, default=3, help="failovers measured (3; 0 skips them)")
    ap.add_argument("--markdown", action="store_true", help="also print the table in Markdown")
    args = ap.parse_args(argv)
    if args.events < BATCH or not 0 < args.seconds <= 600 or not 0 <= args.failovers <= 20:
        ap.error(f"need --events >= {BATCH}, 0 < --seconds <= 600, 0 <= --failovers <= 20")
    console = make_console()
    # pgserver logs a failed `pg_ctl stop` of the primary the failover already stopped: expected here
    logging.getLogger("pgserver").setLevel(logging.CRITICAL)
    started = time.monotonic()
    try:
        rows, info = run(args.events, args.seconds, args.failovers, console.log)
    except RuntimeError as exc:
        print(f"bench.topologies failed: {exc}", file=sys.stderr)
        return 2
    print_results("Production topologies", rows, console)
    console.print(f"{info['cpu']}, {info['cores']} cores; PostgreSQL {info['postgresql']}; "
                  f"settings: {info['settings']}; took {time.monotonic() - started:.0f} s")
    if args.markdown:
        print(markdown(rows))
    return 0 if all(r.ok is not False for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
