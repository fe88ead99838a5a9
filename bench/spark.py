"""The Spark benchmark: batch read of a topic through ``format("pgstreams")`` beside Spark's own JDBC source
on the same rows with the same number of partitions, streaming throughput, and the raw COPY-out rate.

    python -m bench.spark [--dsn DSN] [--events 2000000] [--partitions 4] [--rounds 3] [--markdown]

* a topic of ``--events`` events (100-byte values, short keys, an event type; one in ten with headers) in
  ``--partitions`` partitions is published with ``publish_many`` and VACUUM ANALYZEd;
* raw PostgreSQL: ``COPY (SELECT <the same columns>) TO STDOUT (FORMAT binary)`` of the same rows, one
  connection per partition, discarded by ``psql`` (the server's export limit; psycopg when psql is absent);
* batch: ``spark.read.format("pgstreams")`` and ``spark.read.format("jdbc")`` (PostgreSQL JDBC driver from
  the Debian package ``libpostgresql-jdbc-java``, installed by ``bench/ensure_jdbc.sh``) over the same
  rows, the JDBC read split on ``position`` into as many partitions as the pgstreams read has; each
  materialises every column (``write.format("noop")``); alternated, best of ``--rounds``; with the
  CPU-seconds each read took per process kind (Spark's JVM, the Python processes, and the rest:
  PostgreSQL's backends, the kernel, anything else running), read from ``/proc``;
* streaming: ``spark.readStream.format("pgstreams")`` with ``trigger(availableNow=True)`` and
  ``maxEventsPerTrigger`` (``--trigger``, default 1,000,000) into the ``noop`` sink: from the query's start
  to its end; the first micro-batch (query start-up included) on its own; and the steady state, the
  micro-batches after the first (from the end of the first to the end of the last), against the batch
  read, with the mean time of each phase of those micro-batches as Spark reports it.

Spark runs ``local[*]`` on this machine. The benchmark creates its own database on the server (``--dsn``,
else ``$PGSTREAMS_DSN``; loopback only) and drops it at the end. Without either it starts a throw-away
PostgreSQL on 127.0.0.1 with the embedded server's binaries (the JDBC driver needs TCP, and the embedded
server listens on a Unix socket only) and removes it at the end.
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from contextlib import ExitStack
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from statistics import median
from typing import Any

import psycopg
from psycopg import sql
from psycopg.conninfo import conninfo_to_dict, make_conninfo
from rich.console import Console

import pgstreams
from pgstreams.storage import Store

from ._common import (
    Measurement,
    checkpoint,
    key,
    machine,
    markdown,
    print_results,
    scratch_database,
    server_dsn,
    temporary_tcp_server,
)

HERE = Path(__file__).resolve().parent
TOPIC = "bench"
COLUMNS = ("partition, position, key, value, headers, event_type, event_id, correlation_id, causation_id, "
           "created_at")


def ensure_jdbc() -> str:
    """The PostgreSQL JDBC jar (installed by ``bench/ensure_jdbc.sh`` when missing)."""
    out = subprocess.run(["bash", str(HERE / "ensure_jdbc.sh")], capture_output=True, text=True, check=False)
    if out.returncode != 0:
        raise SystemExit(f"bench/ensure_jdbc.sh failed: {out.stderr.strip()}")
    return out.stdout.strip().splitlines()[-1]


def publish(dsn: str, events: int, partitions: int, console: Console) -> tuple[int, int, int]:
    """Create and fill the topic; return its id and lowest / highest position."""
    t0 = time.perf_counter()
    with pgstreams.connect(dsn) as client:
        client.create_topic(TOPIC, partitions)
        batch = 20_000
        for start in range(0, events, batch):
            client.publish_many(TOPIC, [
                {"value": (b'{"user":%d,"ad":%d,"price":%d.%02d,"kind":"impression","seq":%d}'
                           % (i % 5000, i % 300, i % 97, i % 100, i)).ljust(100, b" "),
                 "key": key(i), "event_type": "impression",
                 "headers": {"source": "bench"} if i % 10 == 0 else None}
                for i in range(start, min(events, start + batch))])
        tid = client.topic_record(TOPIC).id
        with client.connection() as conn:
            row = conn.execute(sql.SQL("SELECT min(position), max(position) FROM {}").format(
                sql.Identifier("pgstreams", f"topic_{tid}"))).fetchone()
            assert row is not None
            lo, hi = row
            conn.execute("VACUUM ANALYZE")
    console.print(f"published {events:,} events in {time.perf_counter() - t0:.1f} s")
    return int(tid), int(lo), int(hi)


def wait_visible(dsn: str, tid: int, partitions: int, hi: int, timeout: float = 300.0) -> None:
    """Wait until the read fence of every partition of topic ``tid`` is past position ``hi``."""
    events = Store(None, "pgstreams").events
    with psycopg.connect(dsn, autocommit=True) as conn:
        deadline = time.monotonic() + timeout
        while min(events.fences(conn, tid, range(partitions)).values()) <= hi:
            if time.monotonic() > deadline:
                raise SystemExit("the read fences did not pass the benchmark's events "
                                 "(a publishing transaction left open?)")
            time.sleep(0.05)


def raw_copy_out(dsn: str, tid: int, lo: int, hi: int, connections: int) -> tuple[float, str]:
    """Rows per second of a binary COPY-out of the topic's rows over ``connections`` connections."""
    table = sql.Identifier("pgstreams", f"topic_{tid}")
    step = (hi - lo + connections) // connections
    ranges = [(lo + i * step, lo + (i + 1) * step) for i in range(connections)]
    psql = shutil.which("psql")
    info = conninfo_to_dict(dsn)
    rows = 0
    with psycopg.connect(dsn, autocommit=True) as conn:
        rows = int(conn.execute(sql.SQL("SELECT count(*) FROM {}").format(table)).fetchone()[0])  # type: ignore[index]
        copy = sql.SQL("COPY (SELECT {} FROM {} WHERE position >= {} AND position < {}) "
                       "TO STDOUT (FORMAT binary)")
        stmts = [copy.format(sql.SQL(COLUMNS), table, sql.Literal(a), sql.Literal(b)).as_string(conn)
                 for a, b in ranges]

    def one(stmt: str) -> None:
        if psql:
            env = {**os.environ, "PGPASSWORD": str(info.get("password") or "")}
            subprocess.run([psql, "-X", "-q", "-d", dsn, "-c", stmt], env=env, stdout=subprocess.DEVNULL,
                           check=True)
        else:
            with psycopg.connect(dsn, autocommit=True) as c, c.cursor().copy(stmt) as cp:
                for _ in cp:
                    pass

    threads = [threading.Thread(target=one, args=(stmt,)) for stmt in stmts]
    t0 = time.perf_counter()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return rows / (time.perf_counter() - t0), "psql" if psql else "psycopg"


def spark_session(jar: str | None = None, app: str = "pgstreams-bench") -> Any:
    """A local SparkSession (``local[*]``, no UI, UTC) whose Python workers run this interpreter, with the
    JDBC driver ``jar`` on its class path when given (default none). Its Python processes start as
    docs/spark.md recommends: forked from ``pgstreams.spark_daemon``, importing the installed, compiled
    PySpark."""
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")  # the driver and its services on loopback
    from pyspark.sql import SparkSession

    from pgstreams.spark_daemon import use_compiled_pyspark

    use_compiled_pyspark("local[*]")
    builder = (SparkSession.builder.master("local[*]").appName(app)
               .config("spark.ui.enabled", "false").config("spark.ui.showConsoleProgress", "false")
               .config("spark.python.daemon.module", "pgstreams.spark_daemon")
               .config("spark.sql.shuffle.partitions", str(os.cpu_count() or 2))
               .config("spark.sql.session.timeZone", "UTC")
               .config("spark.driver.memory", "2g"))
    if jar is not None:
        builder = builder.config("spark.jars", jar).config("spark.driver.extraClassPath", jar)
    spark = builder.getOrCreate()
    spark.sparkContext.setLogLevel("ERROR")
    return spark


def jdbc_url(dsn: str) -> tuple[str, dict[str, str]]:
    info = conninfo_to_dict(dsn)
    host = info.get("host") or "localhost"
    if str(host).startswith("/"):
        raise SystemExit(f"the JDBC baseline needs a server reachable over TCP, and {host} is a Unix socket "
                         "(the embedded server listens on one): pass --dsn postgresql://USER@127.0.0.1:5432/DB")
    url = f"jdbc:postgresql://{host}:{info.get('port') or 5432}/{info['dbname']}"
    props = {"user": str(info.get("user") or os.environ.get("USER", "postgres"))}
    if info.get("password"):
        props["password"] = str(info["password"])
    return url, props


def timed(df: Any) -> float:
    t0 = time.perf_counter()
    df.write.format("noop").mode("overwrite").save()
    return time.perf_counter() - t0


Snapshot = tuple[dict[int, tuple[str, float]], float]


def cpu_snapshot() -> Snapshot | None:
    """CPU-seconds used so far by every process (pid: name, user + system) and by the whole machine (busy
    time: user, nice, system, irq, softirq); ``None`` where ``/proc`` is missing."""
    stat = Path("/proc/stat")
    if not stat.exists():
        return None
    hz = os.sysconf("SC_CLK_TCK")
    procs: dict[int, tuple[str, float]] = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            text = (entry / "stat").read_text()
        except OSError:
            continue
        name, fields = text[text.index("(") + 1:text.rindex(")")], text[text.rindex(")") + 2:].split()
        procs[int(entry.name)] = (name, (int(fields[11]) + int(fields[12])) / hz)
    values = [int(v) for v in stat.read_text().splitlines()[0].split()[1:]]
    return procs, (values[0] + values[1] + values[2] + values[5] + values[6]) / hz


def cpu_split(before: Snapshot | None, after: Snapshot | None) -> dict[str, float] | None:
    """CPU-seconds between two snapshots: the Spark JVM, the Python processes (Spark's Python workers and
    this driver) and the rest (PostgreSQL's backends, the kernel's network work, anything else running)."""
    if before is None or after is None:
        return None
    split = {"JVM": 0.0, "Python": 0.0}
    for pid, (name, used) in after[0].items():
        kind = "JVM" if name == "java" else "Python" if name.startswith(("python", "pyspark")) else None
        if kind:
            split[kind] += used - before[0].get(pid, (name, 0.0))[1]
    split["PostgreSQL and rest"] = max(0.0, after[1] - before[1] - split["JVM"] - split["Python"])
    return split


def main(argv: list[str] | None = None) -> int:
    """Run the benchmark and print its table."""
    ap = argparse.ArgumentParser(prog="python -m bench.spark", description=__doc__.split("\n\n")[0])
    ap.add_argument("--dsn", help="server to use, over TCP (default $PGSTREAMS_DSN, else a throw-away server "
                                  "on 127.0.0.1); a scratch database is created on it")
    ap.add_argument("--events", type=int, default=2_000_000, help="events in the topic (default 2,000,000)")
    ap.add_argument("--partitions", type=int, default=4, help="partitions of the topic (default 4)")
    ap.add_argument("--rounds", type=int, default=3, help="rounds of each batch read, best kept (default 3)")
    ap.add_argument("--trigger", type=int, default=1_000_000,
                    help="maxEventsPerTrigger of the streaming read (default 1,000,000)")
    ap.add_argument("--min-partitions", type=int, default=None,
                    help="option minPartitions of the pgstreams read (default: the source's default)")
    ap.add_argument("--arrow-batch-size", type=int, default=None,
                    help="option arrowBatchSize of the pgstreams read (default: the source's default)")
    ap.add_argument("--markdown", action="store_true", help="also print the table in Markdown")
    args = ap.parse_args(argv)
    console = Console()
    with ExitStack() as stack:
        if args.dsn or os.environ.get("PGSTREAMS_DSN"):
            target = server_dsn(args.dsn)
            jdbc_url(make_conninfo(target, dbname="postgres"))  # refuse a Unix socket before any work
        else:
            console.print("no DSN given: starting a throw-away PostgreSQL on 127.0.0.1 (the JDBC baseline "
                          "needs TCP; the embedded server listens on a Unix socket)")
            target = server_dsn(stack.enter_context(temporary_tcp_server()))
        return run(args, target, console)


def run(args: argparse.Namespace, target: str, console: Console) -> int:
    """Run the benchmark against the server of ``target``; print its table; 0 if every floor holds."""
    jar = ensure_jdbc()
    started = time.perf_counter()
    info = machine(target)
    with scratch_database(target, "pgstreams_bench_spark") as dsn:
        tid, lo, hi = publish(dsn, args.events, args.partitions, console)
        wait_visible(dsn, tid, args.partitions, hi)
        checkpoint(dsn)
        spark = spark_session(jar)
        try:
            import pgstreams.spark

            pgstreams.spark.register(spark)
            pg = spark.read.format("pgstreams").option("dsn", dsn).option("topic", TOPIC)
            if args.min_partitions:
                pg = pg.option("minPartitions", str(args.min_partitions))
            if args.arrow_batch_size:
                pg = pg.option("arrowBatchSize", str(args.arrow_batch_size))
            pg = pg.load()
            n_parts = pg.rdd.getNumPartitions()
            url, props = jdbc_url(dsn)
            query = (f"(SELECT {COLUMNS.replace('headers', 'headers::text AS headers')} "
                     f'FROM pgstreams."topic_{tid}") t')
            jdbc = (spark.read.format("jdbc").option("url", url).option("driver", "org.postgresql.Driver")
                    .option("dbtable", query).option("partitionColumn", "position")
                    .option("lowerBound", str(lo)).option("upperBound", str(hi + 1))
                    .option("numPartitions", str(n_parts)).option("fetchsize", "10000"))
            for k, v in props.items():
                jdbc = jdbc.option(k, v)
            jdbc = jdbc.load()
            counts = (pg.count(), jdbc.count())
            if counts != (args.events, args.events):
                raise SystemExit(f"row counts differ: pgstreams {counts[0]}, jdbc {counts[1]}, "
                                 f"expected {args.events}")
            timed(pg), timed(jdbc)  # warm up: Python workers, JIT, caches
            best = {"pgstreams": float("inf"), "jdbc": float("inf")}
            cpu: dict[str, list[dict[str, float]]] = {"pgstreams": [], "jdbc": []}
            copy_rate, copy_tool = 0.0, ""
            for r in range(args.rounds):
                order = (("pgstreams", pg), ("jdbc", jdbc))
                for name, df in order if r % 2 == 0 else order[::-1]:
                    before = cpu_snapshot()
                    seconds = timed(df)
                    split = cpu_split(before, cpu_snapshot())
                    best[name] = min(best[name], seconds)
                    used = ""
                    if split is not None:
                        cpu[name].append(split)
                        used = "; CPU-s " + ", ".join(f"{k} {v:.2f}" for k, v in split.items())
                    console.print(f"round {r + 1}: {name} {seconds:.2f} s "
                                  f"({args.events / seconds:,.0f} events/s{used})")
                rate, copy_tool = raw_copy_out(dsn, tid, lo, hi, n_parts)
                copy_rate = max(copy_rate, rate)
            run = stream(spark, dsn, args.trigger, args.events)
        finally:
            spark.stop()
    pg_rate, jdbc_rate = args.events / best["pgstreams"], args.events / best["jdbc"]
    ratio = pg_rate / jdbc_rate
    rows = [
        Measurement(f"batch read, {args.events:,} events, {n_parts} partitions", pg_rate, "events/s",
                    jdbc_rate, f"Spark JDBC source, {n_parts} partitions", "ratio >= 1.0", ratio >= 1.0),
        Measurement("batch read vs raw COPY-out", pg_rate, "events/s", copy_rate,
                    f"COPY binary TO STDOUT, {n_parts} connections ({copy_tool})"),
        Measurement(f"streaming read, availableNow, {run.batches} micro-batches, start to end", run.rate,
                    "events/s", copy_rate, "COPY binary TO STDOUT", ">= 50,000 events/s", run.rate >= 50_000),
        Measurement(f"streaming read, first micro-batch ({run.first_events:,} events), query start-up "
                    "included", run.first_seconds, "s", higher_is_better=False),
    ]
    if run.steady_rate is not None:
        rows.append(Measurement(
            f"streaming read, steady state (micro-batches 2 to {run.batches}, {run.steady_events:,} events)",
            run.steady_rate, "events/s", pg_rate, "the batch read above", "ratio >= 0.7",
            run.steady_rate >= 0.7 * pg_rate))
    print_results("pgstreams Spark benchmark", rows, console)
    console.print(f"machine: {info['cpu']}, {info['cores']} cores, {info['ram']} RAM; PostgreSQL "
                  f"{info['postgresql']}; Python {info['python']}; load before the run {info['load']}; "
                  f"took {time.perf_counter() - started:.0f} s")
    cpu_rows = []
    for name, splits in cpu.items():
        if splits:
            kinds = [median([s[k] for s in splits]) for k in splits[0]]
            total = median([sum(s.values()) for s in splits])
            cpu_rows.append(f"| {name} | " + " | ".join(f"{v:.2f}" for v in [*kinds, total]) + " |")
    if cpu_rows:
        head = "| read | " + " | ".join(cpu["pgstreams"][0]) + " | total |\n|---|---:|---:|---:|---:|\n"
        console.print("CPU-seconds per batch read, median of the rounds:")
        console.print(head + "\n".join(cpu_rows), markup=False, highlight=False, soft_wrap=True)
    if run.phases_ms:
        console.print("steady-state micro-batch, mean ms per phase: " + ", ".join(
            f"{k} {v:,.0f}" for k, v in sorted(run.phases_ms.items())), markup=False, highlight=False)
    if args.markdown:
        console.print(markdown(rows), markup=False, highlight=False, soft_wrap=True)
    return 0 if all(m.ok is not False for m in rows) else 1


@dataclass(frozen=True)
class StreamRun:
    """An ``availableNow`` streaming read of the whole topic: its rate from start to end, its first
    micro-batch (query start-up included) and its steady state (the micro-batches after the first)."""

    rate: float
    batches: int
    first_events: int
    first_seconds: float
    steady_events: int
    steady_seconds: float
    phases_ms: dict[str, float]

    @property
    def steady_rate(self) -> float | None:
        if not self.steady_events or not self.steady_seconds:
            return None
        return self.steady_events / self.steady_seconds


def _ends_at(progress: dict[str, Any]) -> float:
    """When a micro-batch ended (its trigger's start plus its duration), in seconds since the epoch."""
    start = datetime.fromisoformat(progress["timestamp"].replace("Z", "+00:00")).timestamp()
    return start + progress["durationMs"]["triggerExecution"] / 1000


def stream(spark: Any, dsn: str, per_trigger: int, events: int) -> StreamRun:
    """An ``availableNow`` streaming read of the whole topic into the noop sink, ``per_trigger`` events per
    micro-batch at most: the steady state runs from the end of the first micro-batch to the end of the last
    (the gaps between micro-batches included)."""
    with tempfile.TemporaryDirectory(prefix="pgstreams-bench-ck-") as ck:
        df = (spark.readStream.format("pgstreams").option("dsn", dsn).option("topic", TOPIC)
              .option("maxEventsPerTrigger", str(per_trigger)).load())
        t0 = time.perf_counter()
        started = time.time()
        q = df.writeStream.format("noop").option("checkpointLocation", ck).trigger(availableNow=True).start()
        q.awaitTermination()
        seconds = time.perf_counter() - t0
        progress = [p for p in q.recentProgress if p.get("numInputRows")]
        got = sum(int(p["numInputRows"]) for p in progress)
        if got != events:
            raise SystemExit(f"the streaming read saw {got} events, expected {events}")
    first, rest = progress[0], progress[1:]
    phases: dict[str, float] = {}
    for p in rest:
        for k, v in p["durationMs"].items():
            phases[k] = phases.get(k, 0.0) + v / len(rest)
    return StreamRun(
        rate=events / seconds, batches=len(progress), first_events=int(first["numInputRows"]),
        first_seconds=_ends_at(first) - started,
        steady_events=sum(int(p["numInputRows"]) for p in rest),
        steady_seconds=(_ends_at(rest[-1]) - _ends_at(first)) if rest else 0.0, phases_ms=phases)


if __name__ == "__main__":
    sys.exit(main())
