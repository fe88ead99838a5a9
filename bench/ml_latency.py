"""Where the ML system's impression -> clean latency goes: the Spark clean pipeline under several triggers.

    python -m bench.ml_latency [--dsn DSN] [--seconds 60] [--triggers "2 seconds,0 seconds,0 seconds/500"]
                               [--max-events-per-trigger 20000] [--partitions 2] [--quick] [--markdown]
    python -m bench.ml_latency --quick --seconds 30     # the demo's clean trigger only: about 1.5 minutes

For each trigger, in a scratch database of its own: the simulator publishes at ``./demo.sh``'s pace (4
impressions per simulated second, 240 simulated seconds per wall second, about 1,300 raw records a second)
for ``--seconds`` while the clean query (``pgstreams_ml.clean.build_clean_query``, ``local[2]``) runs
with that trigger; then the simulator stops, the query drains and stops. Reported, from the topics'
``created_at`` (``pgstreams_ml.latency.measure_clean``): raw -> clean p50, p95, p99 and max of every
impression; and, from the query's progress, the mean milliseconds per micro-batch of each phase Spark
times (``latestOffset``: the source's offsets; ``queryPlanning``; ``getBatch``; ``addBatch``: the
``foreachBatch`` writes; ``walCommit`` / ``commitOffsets``: the checkpoint; ``triggerExecution``: the
whole batch) and the mean rows per batch.

Raw PostgreSQL beside it, in the same run: a paced producer INSERTs stamped rows (1,000 a second) and
NOTIFYs, a consumer LISTENs and reads them by position: the latency of moving a row from one table to a
reader with no pipeline in between, the floor of any stage.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import tempfile
import threading
import time
from dataclasses import dataclass
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table

import pgstreams

from ._common import (
    Job,
    LatencyArgs,
    create_raw_table,
    machine,
    percentile,
    raw_latency_consumer,
    raw_latency_producer,
    run_jobs,
    scratch_database,
    server_dsn,
)

#: ``pgstreams demo``'s default rate (impressions per simulated second) and speed, as ./demo.sh runs it.
DEMO_RATE = 4.0
#: The triggers compared by default.
ALL_TRIGGERS = "2 seconds,0 seconds,250 milliseconds,0 seconds/500"
PHASES = ("latestOffset", "queryPlanning", "getBatch", "addBatch", "walCommit", "commitOffsets",
          "triggerExecution")


@dataclass
class Variant:
    """The result of one trigger."""

    trigger: str
    latency: Any  # pgstreams_ml.latency.LatencyStats
    phases: dict[str, float]
    batches: int
    rows_per_batch: float
    raw_records: int


def run_variant(db: str, trigger: str, seconds: float, mept: int, partitions: int) -> Variant:
    """Run the clean query with ``trigger`` against the simulator for ``seconds``; measure."""
    from pgstreams_ml.clean import build_clean_query
    from pgstreams_ml.config import Topology, setup
    from pgstreams_ml.latency import measure_clean
    from pgstreams_ml.serving import SERVING_SPARK_CONF
    from pgstreams_ml.simulator import SimConfig, Simulator
    from pgstreams_ml.sparkutil import (
        QUERY_RESTARTS,
        checkpoint_conf,
        is_transient,
        spark_session,
    )

    topo = Topology(partitions=partitions)
    tmp = Path(tempfile.mkdtemp(prefix="pgstreams-bench-"))
    with pgstreams.connect(db) as client:
        setup(client, topo, reset=True)
        # the clean query's own application, as the demo runs it (pgstreams_ml.serving)
        spark = spark_session(shuffle_partitions=partitions,
                              conf={**SERVING_SPARK_CONF, **checkpoint_conf(str(tmp)),
                                    "spark.sql.streaming.numRecentProgressUpdates": "100000",
                                    "spark.driver.extraJavaOptions": os.environ.get("BENCH_JAVA_OPTS", "")})
        def start() -> Any:
            return build_clean_query(spark, db, topo, str(tmp / "ck"), trigger=trigger,
                                     max_events_per_trigger=mept)

        query = start()
        try:
            sim = Simulator(client, SimConfig(rate=DEMO_RATE, duration=24 * 3600.0, speed=240.0), topo)
            thread = threading.Thread(target=sim.run, daemon=True)
            thread.start()
            # warm-up (Python workers, JIT): measure impressions stored after the first batch with data
            deadline = time.monotonic() + 300
            restarts = 0
            while not any(int(p.get("numInputRows", 0)) for p in query.recentProgress):
                exc = query.exception()
                if exc is not None and restarts < QUERY_RESTARTS and is_transient(exc):
                    restarts += 1  # as the demo does: restart from the checkpoint
                    query = start()
                    continue
                if time.monotonic() > deadline or not query.isActive:
                    raise RuntimeError(f"the clean query did not start: {query.exception()}")
                time.sleep(0.2)
            since = datetime.now(timezone.utc) + timedelta(seconds=5)
            time.sleep(seconds)  # the measured run's length (rate control, not synchronisation)
            sim.stop()
            thread.join(120)
            deadline = time.monotonic() + 300
            while time.monotonic() < deadline:
                lag = sum(s.lag for s in client.describe_group(topo.clean_group))
                if lag == 0 and query.lastProgress and not query.status.get("isDataAvailable"):
                    break
                if query.exception() is not None or not query.isActive:
                    raise RuntimeError(f"the clean query stopped: {query.exception()}")
                time.sleep(0.5)
            progs = [p for p in query.recentProgress
                     if int(p.get("numInputRows", 0)) > 0 and _at(p["timestamp"]) >= since]
        finally:
            query.stop()
            shutil.rmtree(tmp, ignore_errors=True)
        lat = measure_clean(client, topo, since=since)
        raw_records = client.describe_topic(topo.raw_topic).events
    phases = {ph: sum(float(p.get("durationMs", {}).get(ph, 0)) for p in progs) / max(1, len(progs))
              for ph in PHASES}
    rows = sum(int(p.get("numInputRows", 0)) for p in progs)
    return Variant(trigger, lat, phases, len(progs), rows / max(1, len(progs)), raw_records)


def try_real_time(db: str) -> str:
    """Start the clean query with Spark's real-time trigger (``trigger(realTime=...)``); return what Spark
    answered (the query is stopped at once if it starts)."""
    from pgstreams_ml.clean import parse_raw
    from pgstreams_ml.config import Topology, setup
    from pgstreams_ml.sparkutil import read_stream, spark_session

    topo = Topology(partitions=2)
    tmp = Path(tempfile.mkdtemp(prefix="pgstreams-bench-"))
    try:
        with pgstreams.connect(db) as client:
            setup(client, topo, reset=True)
        spark = spark_session()
        raw = read_stream(spark, db, topo.raw_topic).load()
        query = (parse_raw(raw).writeStream.format("noop").outputMode("update")
                 .option("checkpointLocation", str(tmp / "ck"))
                 .trigger(realTime="5 seconds")  # type: ignore[call-overload]  # PySpark 4.1's; stubs lag
                 .start())
        try:
            query.awaitTermination(60)
            exc = query.exception()
            return "started" if exc is None else str(exc).strip().splitlines()[0]
        finally:
            query.stop()
    except Exception as exc:  # noqa: BLE001 - the answer is the result
        return str(exc).strip().splitlines()[0]
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def raw_floor(db: str, seconds: float) -> tuple[float, float]:
    """(p50, p99) seconds of INSERT + NOTIFY -> LISTEN + read at 1,000 rows a second."""
    create_raw_table(db, "raw_latency")
    args = LatencyArgs(db, "raw_latency", 1000.0)
    _prod, cons = run_jobs([Job(raw_latency_producer, args, seconds),
                            Job(raw_latency_consumer, args, seconds + 1.0)])
    lat = cons.extra or []
    return percentile(lat, 50), percentile(lat, 99)


def from_topics(dsn: str, topo: Any = None) -> dict[str, dict[str, float | int | None]]:
    """The demo's latency recomputed from the topics alone, by other means than the demo's summary:
    Spark batch reads of the raw, clean and predictions topics (``format("pgstreams")``), the impression
    id taken from the raw JSON with ``get_json_object`` and joined in Spark; percentiles by nearest rank
    (numpy's ``inverted_cdf``). Per stage: count, p50, p95, p99, max in seconds."""
    import numpy as np
    from pyspark.sql import functions as F

    from pgstreams_ml.config import Topology
    from pgstreams_ml.sparkutil import spark_session

    topo = topo or Topology(partitions=2)
    spark = spark_session()

    def topic(name: str) -> Any:
        return spark.read.format("pgstreams").option("dsn", dsn).option("topic", name).load()

    raw = (topic(topo.raw_topic)
           .select(F.get_json_object(F.col("value").cast("string"), "$.type").alias("type"),
                   F.get_json_object(F.col("value").cast("string"), "$.event_id").alias("id"),
                   "created_at")
           .where("type = 'impression' AND id IS NOT NULL")
           .groupBy("id").agg(F.min("created_at").alias("raw_at")))
    clean = (topic(topo.clean_topic).where("event_type = 'impression'")
             .groupBy(F.col("event_id").alias("id")).agg(F.min("created_at").alias("clean_at")))
    pred = (topic(topo.predictions_topic).where(F.col("event_id").startswith("pred:"))
            .groupBy(F.expr("substring(event_id, 6)").alias("id"))
            .agg(F.min("created_at").alias("pred_at")))
    secs = F.unix_micros  # microseconds since the epoch, exact
    rows = (pred.join(clean, "id").join(raw, "id")
            .select(((secs("clean_at") - secs("raw_at")) / 1e6).alias("raw -> clean"),
                    ((secs("pred_at") - secs("clean_at")) / 1e6).alias("clean -> prediction"),
                    ((secs("pred_at") - secs("raw_at")) / 1e6).alias("raw -> prediction"))
            .collect())
    out: dict[str, dict[str, float | int | None]] = {}
    for stage in ("raw -> clean", "clean -> prediction", "raw -> prediction"):
        v = np.array([r[stage] for r in rows], dtype=float)
        if not len(v):
            out[stage] = {"count": 0, "p50": None, "p95": None, "p99": None, "max": None}
            continue
        q = np.percentile(v, [50, 95, 99], method="inverted_cdf")
        out[stage] = {"count": len(v), "p50": float(q[0]), "p95": float(q[1]), "p99": float(q[2]),
                      "max": float(v.max())}
    return out


def _at(stamp: str) -> datetime:
    """A query progress timestamp (``2025-01-01T00:00:00.000Z``) as an aware datetime."""
    return datetime.fromisoformat(stamp.replace("Z", "+00:00"))


def _url(dsn: str) -> str:
    """``dsn`` as a URL (a streaming query's stream thread was seen to die of a StackOverflowError in
    Spark's regular expressions with a key=value DSN as an option value)."""
    from psycopg.conninfo import conninfo_to_dict

    info = conninfo_to_dict(dsn)
    auth = str(info.get("user", ""))
    if info.get("password"):
        auth += f":{info['password']}"
    host = str(info.get("host", ""))
    port = f":{info['port']}" if info.get("port") else ""
    return f"postgresql://{auth + '@' if auth else ''}{host}{port}/{info.get('dbname', '')}"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--dsn")
    ap.add_argument("--seconds", type=float, default=60.0)
    ap.add_argument("--triggers", default=None,
                    help="comma-separated triggers of the clean query, each optionally /N: at most N "
                         "events per micro-batch (else --max-events-per-trigger); default "
                         "'2 seconds,0 seconds,250 milliseconds,0 seconds/500', with --quick the demo's")
    ap.add_argument("--max-events-per-trigger", type=int, default=20000)
    ap.add_argument("--partitions", type=int, default=2)
    ap.add_argument("--quick", action="store_true",
                    help="only the demo's clean trigger (unless --triggers), without the raw PostgreSQL "
                         "floor and the real-time attempt: about --seconds plus a minute")
    ap.add_argument("--markdown", action="store_true")
    ap.add_argument("--json", type=Path, help="also write the results here")
    ap.add_argument("--from-topics", action="store_true",
                    help="only recompute the latency of the last demo from its topics (--dsn, else the "
                         "embedded server) and print it")
    a = ap.parse_args()
    console = Console(width=150)
    if a.from_topics:
        dsn = a.dsn or os.environ.get("PGSTREAMS_DSN")
        if not dsn:  # the embedded server, where ./demo.sh ran
            with pgstreams.connect() as client:
                dsn = client.dsn
        t = Table(title="Latency (s) recomputed from the topics (Spark batch reads)")
        for c in ("stage", "impressions", "p50", "p95", "p99", "max"):
            t.add_column(c, justify="left" if c == "stage" else "right")
        for stage, st in from_topics(dsn).items():
            t.add_row(stage, str(st["count"]), *[f"{st[k]:.3f}" if st[k] is not None else "-"
                                                  for k in ("p50", "p95", "p99", "max")])
        console.print(t)
        return
    from pgstreams_ml.demo import CLEAN_TRIGGER

    triggers = a.triggers or (CLEAN_TRIGGER if a.quick else ALL_TRIGGERS)
    server = server_dsn(a.dsn)
    console.print(machine(server))
    results: list[Variant] = []
    # the raw PostgreSQL floor in the same run (shorter with --quick)
    with scratch_database(server) as db:
        raw50, raw99 = raw_floor(db, min(10.0 if a.quick else 20.0, a.seconds))
    for spec in [t.strip() for t in triggers.split(",") if t.strip()]:
        trig, _, limit = spec.partition("/")
        with scratch_database(server) as db:
            try:
                v = run_variant(_url(db), trig.strip(), a.seconds, int(limit or a.max_events_per_trigger),
                                a.partitions)
            except Exception as exc:  # noqa: BLE001 - reported, the other variants still run
                console.print(f"[red]{spec}: failed: {str(exc).splitlines()[0]}[/red]")
                continue
            v.trigger = spec
            results.append(v)
            s = v.latency
            console.print(f"{spec}: raw -> clean p50 {s.p50:.3f} p95 {s.p95:.3f} p99 {s.p99:.3f} "
                          f"max {s.max:.3f} s; {v.batches} batches; phases {v.phases}")
    real_time = "not tried (--quick)"
    if not a.quick:
        with scratch_database(server) as db:
            real_time = try_real_time(_url(db))
    with open("/proc/loadavg") as f:
        load = f.read().split()[:3]
    t = Table(title=f"raw -> clean latency (s) and micro-batch phases (mean ms); load {' '.join(load)}")
    for c in ("trigger", "p50", "p95", "p99", "max", "batches", "rows/batch", *PHASES):
        t.add_column(c, justify="right")
    t.add_row("raw PostgreSQL (INSERT+NOTIFY -> read)", f"{raw50:.3f}", "-", f"{raw99:.3f}", "-", "-", "-",
              *["-"] * len(PHASES))
    for r in results:
        s = r.latency
        t.add_row(r.trigger, f"{s.p50:.3f}", f"{s.p95:.3f}", f"{s.p99:.3f}", f"{s.max:.3f}", str(r.batches),
                  f"{r.rows_per_batch:.0f}", *[f"{r.phases[p]:.0f}" for p in PHASES])
    console.print(t)
    console.print(f"trigger(realTime='5 seconds'): {real_time}")
    if a.markdown:
        print("| trigger | p50 s | p95 s | p99 s | max s | batches | rows/batch | "
              + " | ".join(PHASES) + " |")
        print("|---" * (7 + len(PHASES)) + "|")
        print(f"| raw PostgreSQL (INSERT+NOTIFY -> read) | {raw50:.3f} | - | {raw99:.3f} | - | - | - | "
              + " | ".join("-" for _ in PHASES) + " |")
        for r in results:
            s = r.latency
            print(f"| {r.trigger} | {s.p50:.3f} | {s.p95:.3f} | {s.p99:.3f} | {s.max:.3f} | {r.batches} | "
                  f"{r.rows_per_batch:.0f} | " + " | ".join(f"{r.phases[p]:.0f}" for p in PHASES) + " |")
    if a.json:
        a.json.write_text(json.dumps({"load": load, "raw": [raw50, raw99], "real_time": real_time,
                                      "variants": [
            {"trigger": r.trigger, "latency": r.latency.__dict__, "phases": r.phases, "batches": r.batches,
             "rows_per_batch": r.rows_per_batch} for r in results]}, indent=2))


if __name__ == "__main__":
    main()
