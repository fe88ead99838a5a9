"""Online evaluation and monitoring (Spark Structured Streaming): predictions topic + clicks -> metrics.

Predictions are joined with the clicks of the clean topic (stream-stream left outer join inside the
attribution window, bounded by watermarks, as in the join pipeline), giving each scored impression its
outcome. Each micro-batch then:

1. upserts the labelled predictions into ``scored_outcomes`` (idempotent per impression);
2. aggregates, per tumbling event-time window and model, additive statistics: rows, clicks, sum of
   predictions, sum of log loss, a histogram of scores on the logit scale (negatives, positives and sum of
   predictions per bin) and counts of every drift bucket of the monitored inputs; and stores them keyed by
   (window, model, batch id), so a replayed batch adds nothing twice;
3. recomputes the metrics of the windows it touched from all their statistics: AUC (from the histogram;
   ties only within a bin of width 0.02 in logit), log loss, calibration ratio, expected calibration error,
   PSI of each monitored input against the model's training distribution; and judges each window with
   :class:`pgstreams_ml.metrics.DegradationRule` against the model's offline holdout metrics. A window is
   ``complete`` once event time has moved past its end by the attribution window plus the lateness allowed;
   only complete windows are judged.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Any

import psycopg
from psycopg.types.json import Jsonb

from . import _sql, registry
from . import metrics as M
from ._util import interval_seconds
from .clean import JSON_TS_OPTIONS
from .domain import DRIFT_CATEGORICAL, DRIFT_NUMERIC
from .join import parse_clean
from .sparkutil import aware, read_stream, trigger_kwargs, write_table
from .train import drift_bucket_columns

if TYPE_CHECKING:
    from pyspark.sql import Column, DataFrame, SparkSession
    from pyspark.sql.streaming import StreamingQuery

    from .config import Topology

#: DDL of a prediction's value.
PREDICTION_SCHEMA = (
    "impression_id STRING, ts TIMESTAMP, user_id STRING, ad_id STRING, p DOUBLE, model_id BIGINT, "
    "slot INT, device STRING, country STRING, category STRING, activity DOUBLE, quality DOUBLE, "
    "price DOUBLE"
)
_DRIFT_INPUTS = tuple(DRIFT_CATEGORICAL) + tuple(DRIFT_NUMERIC)


def parse_predictions(df: DataFrame) -> DataFrame:
    """Decode predictions-topic rows (column ``value``) into the columns of :data:`PREDICTION_SCHEMA`."""
    from pyspark.sql import functions as F

    return df.select(
        F.from_json(F.col("value").cast("string"), PREDICTION_SCHEMA, JSON_TS_OPTIONS).alias("e")
    ).select("e.*")


def label_predictions(
    preds: DataFrame,
    clean_events: DataFrame,
    attribution: str = "5 minutes",
    prediction_delay: str = "2 minutes",
    click_delay: str = "3 minutes",
) -> DataFrame:
    """Parsed predictions with ``label`` (a click within ``attribution`` of the impression) and
    ``click_ts``. ``clean_events`` are parsed clean events (see :func:`pgstreams_ml.join.parse_clean`)."""
    from pyspark.sql import functions as F

    clicks = clean_events.filter(F.col("type") == "click").select(
        F.col("impression_id").alias("click_impression_id"), F.col("ts").alias("click_ts")
    )
    if preds.isStreaming:
        preds = preds.withWatermark("ts", prediction_delay)
        clicks = clicks.withWatermark("click_ts", click_delay)
    cond = F.expr(
        f"click_impression_id = impression_id AND click_ts >= ts AND click_ts <= ts + interval {attribution}"
    )
    return (
        preds.join(clicks, cond, "leftOuter")
        .drop("click_impression_id")
        .withColumn("label", F.when(F.col("click_ts").isNotNull(), 1).otherwise(0))
    )


def hist_bin_column(p: Column) -> Column:
    """The Spark twin of :func:`pgstreams_ml.metrics.hist_bin`."""
    from pyspark.sql import functions as F

    q = F.least(F.greatest(p, F.lit(M.EPS)), F.lit(1 - M.EPS))
    z = F.least(F.greatest(F.log(q / (1 - q)), F.lit(-M.HIST_RANGE)), F.lit(M.HIST_RANGE - 1e-9))
    return F.floor((z + M.HIST_RANGE) / M.HIST_STEP).cast("int")


def partial_statistics(labelled: DataFrame, window: str) -> dict[tuple[datetime, int], dict[str, Any]]:
    """Additive statistics of ``labelled`` predictions per (window start, model id), in one Spark job: each
    row is exploded into its score-histogram bin and its drift bucket of every monitored input, and one
    aggregation counts rows, clicks, predictions and log loss per (window, model, key, bucket)."""
    from pyspark.sql import functions as F

    q = F.least(F.greatest(F.col("p"), F.lit(M.EPS)), F.lit(1 - M.EPS))
    y = F.col("label").cast("double")
    keys = [F.struct(F.lit("bin").alias("k"), hist_bin_column(F.col("p")).cast("string").alias("v"))]
    keys += [F.struct(F.lit(n).alias("k"), F.col(f"b_{n}").alias("v")) for n in _DRIFT_INPUTS]
    rows = (
        labelled.select(
            F.window("ts", window).start.alias("ws"),
            "model_id",
            "ts",
            F.col("p"),
            y.alias("y"),
            (-(y * F.log(q) + (1 - y) * F.log(1 - q))).alias("ll"),
            *drift_bucket_columns(),
        )
        .select("ws", "model_id", "ts", "p", "y", "ll", F.explode(F.array(*keys)).alias("kv"))
        .groupBy("ws", "model_id", "kv.k", "kv.v")
        .agg(
            F.count("*").alias("n"),
            F.sum("y").alias("pos"),
            F.sum("p").alias("sp"),
            F.sum("ll").alias("ll"),
            F.max("ts").alias("max_ts"),
        )
        .collect()
    )
    out: dict[tuple[datetime, int], dict[str, Any]] = {}
    for r in rows:
        key = (aware(r["ws"]), int(r["model_id"]))
        acc = out.setdefault(
            key,
            {
                "n": 0,
                "clicks": 0,
                "sum_p": 0.0,
                "sum_log_loss": 0.0,
                "max_ts": None,
                "hist": {},
                "features": {},
            },
        )
        n, pos = int(r["n"]), float(r["pos"])
        if r["k"] == "bin":
            acc["hist"][str(r["v"])] = [n - pos, pos, float(r["sp"])]
            acc["n"] += n
            acc["clicks"] += int(pos)
            acc["sum_p"] += float(r["sp"])
            acc["sum_log_loss"] += float(r["ll"])
            ts = aware(r["max_ts"])
            acc["max_ts"] = ts if acc["max_ts"] is None else max(acc["max_ts"], ts)
        else:
            acc["features"].setdefault(r["k"], {})[str(r["v"])] = n
    return out


def merge_partials(rows: Iterable[tuple[Any, ...]]) -> dict[str, Any]:
    """Sum the partial rows ``(n, clicks, sum_p, sum_log_loss, hist, features, max_ts)`` of one window and
    model."""
    acc: dict[str, Any] = {
        "n": 0,
        "clicks": 0,
        "sum_p": 0.0,
        "sum_log_loss": 0.0,
        "hist": {},
        "features": {},
        "max_ts": None,
    }
    for n, clicks, sum_p, sll, hist, feats, max_ts in rows:
        acc["n"] += n
        acc["clicks"] += clicks
        acc["sum_p"] += sum_p
        acc["sum_log_loss"] += sll
        for b, v in hist.items():
            h = acc["hist"].setdefault(int(b), [0.0, 0.0, 0.0])
            for i in range(3):
                h[i] += v[i]
        for k, d in feats.items():
            f = acc["features"].setdefault(k, {})
            for bucket, c in d.items():
                f[bucket] = f.get(bucket, 0) + c
        acc["max_ts"] = max_ts if acc["max_ts"] is None else max(acc["max_ts"], max_ts)
    return acc


def window_metrics(acc: dict[str, Any], baseline: dict[str, Any], rule: M.DegradationRule) -> dict[str, Any]:
    """Metrics and verdict of one window from its merged statistics and the model's ``baseline`` (registry
    metrics with ``auc``, ``log_loss`` and ``reference`` distributions)."""
    n, clicks = acc["n"], acc["clicks"]
    mean_p = acc["sum_p"] / n if n else None
    ctr = clicks / n if n else None
    auc = M.auc_from_hist(acc["hist"])
    ll = acc["sum_log_loss"] / n if n else None
    cal = (mean_p / ctr) if (mean_p is not None and ctr) else None
    ece = M.ece_from_hist(acc["hist"])
    ref = baseline.get("reference") or {}
    psi: dict[str, float] = {}
    for k in _DRIFT_INPUTS:
        value = M.psi(ref.get(k, {}), acc["features"].get(k, {})) if ref.get(k) else None
        if value is not None:
            psi[k] = round(value, 5)
    max_psi = max(psi.values()) if psi else None
    verdict = M.judge(rule, baseline, n, clicks, auc, ll, cal, max_psi)
    return {
        "n": n,
        "clicks": clicks,
        "ctr": ctr,
        "mean_p": mean_p,
        "auc": auc,
        "log_loss": ll,
        "calibration": cal,
        "ece": ece,
        "psi": psi,
        "max_psi": max_psi,
        "drift": verdict.drift,
        "degraded": verdict.degraded,
        "reasons": verdict.reasons,
    }


class MonitorBatchWriter:
    """The ``foreachBatch`` function of the monitoring query."""

    def __init__(
        self,
        dsn: str,
        topo: Topology,
        window: str,
        complete_after: timedelta,
        rule: M.DegradationRule | None = None,
    ) -> None:
        self.dsn = dsn
        self.topo = topo
        self.window = window
        self.window_len = interval_seconds(window)
        self.complete_after = complete_after
        self.rule = rule or M.DegradationRule()
        self._baselines: dict[int, dict[str, Any]] = {}

    def _baseline(self, conn: psycopg.Connection, model_id: int) -> dict[str, Any]:
        if model_id not in self._baselines:
            rec = registry.get(conn, self.topo.schema, model_id)
            self._baselines[model_id] = dict(rec.metrics) if rec else {}
        return self._baselines[model_id]

    def __call__(self, batch: DataFrame, batch_id: int) -> None:
        """Process one micro-batch (called by Spark)."""
        schema = self.topo.schema
        batch = batch.persist()
        try:
            parts = partial_statistics(batch, self.window)
            n = sum(s["n"] for s in parts.values())
            if n:
                write_table(
                    batch,
                    self.dsn,
                    schema,
                    "stage_outcomes",
                    "copy_outcomes",
                    "merge_outcomes",
                    ("impression_id", "ts", "model_id", "p", "label"),
                )
            with psycopg.connect(self.dsn, autocommit=True) as conn:
                with conn.transaction():
                    for (ws, mid), s in parts.items():
                        conn.execute(
                            _sql.q("insert_partial", schema),
                            (
                                ws,
                                mid,
                                batch_id,
                                s["n"],
                                s["clicks"],
                                s["sum_p"],
                                s["sum_log_loss"],
                                Jsonb(s["hist"]),
                                Jsonb(s["features"]),
                                s["max_ts"],
                            ),
                        )
                    conn.execute(
                        _sql.q("record_batch", schema),
                        ("monitor", batch_id, n, json.dumps({"windows": len(parts)})),
                    )
                self.refresh(conn, sorted(parts))
        finally:
            batch.unpersist()

    def refresh(self, conn: psycopg.Connection, keys: list[tuple[datetime, int]] | None = None) -> int:
        """Recompute the metrics of windows ``keys`` (default none) and of every window that has become
        complete; return how many. Only complete windows are judged (an incomplete one holds its clicked
        rows but not yet all of its unclicked ones)."""
        schema = self.topo.schema
        row = conn.execute(_sql.q("max_partial_ts", schema)).fetchone()
        horizon = row[0] if row else None
        length = timedelta(seconds=self.window_len)
        todo = set(keys or [])
        if horizon is not None:
            for ws, mid in conn.execute(_sql.q("open_windows", schema)).fetchall():
                if ws + length + self.complete_after <= horizon:
                    todo.add((ws, int(mid)))
        for ws, mid in sorted(todo):
            rows = conn.execute(_sql.q("partials_of", schema), (ws, mid)).fetchall()
            acc = merge_partials(rows)
            m = window_metrics(acc, self._baseline(conn, mid), self.rule)
            we = ws + length
            complete = horizon is not None and horizon >= we + self.complete_after
            if not complete:
                m.update(drift=False, degraded=False, reasons=[])
            conn.execute(
                _sql.q("upsert_metrics", schema),
                (
                    ws,
                    we,
                    mid,
                    m["n"],
                    m["clicks"],
                    m["ctr"],
                    m["mean_p"],
                    m["auc"],
                    m["log_loss"],
                    m["calibration"],
                    m["ece"],
                    Jsonb(m["psi"]),
                    m["max_psi"],
                    m["drift"],
                    m["degraded"],
                    m["reasons"],
                    complete,
                ),
            )
        return len(todo)


def build_monitor_query(
    spark: SparkSession,
    dsn: str,
    topo: Topology,
    checkpoint: str,
    *,
    trigger: str = "availableNow",
    window: str = "15 minutes",
    attribution: str = "5 minutes",
    prediction_delay: str = "2 minutes",
    click_delay: str = "3 minutes",
    max_events_per_trigger: int | None = None,
    rule: M.DegradationRule | None = None,
    query_name: str = "monitor",
) -> StreamingQuery:
    """Start the monitoring query: predictions topic (group ``topo.monitor_group``) joined with the clean
    topic's clicks; metrics per ``window`` (default 15 minutes of event time) into ``online_metrics``."""
    preds = parse_predictions(
        read_stream(
            spark,
            dsn,
            topo.predictions_topic,
            group=topo.monitor_group,
            max_events_per_trigger=max_events_per_trigger,
            pgstreams_schema=topo.pgstreams_schema,
        ).load()
    )
    clean = parse_clean(
        read_stream(
            spark,
            dsn,
            topo.clean_topic,
            group=topo.monitor_clicks_group,
            pgstreams_schema=topo.pgstreams_schema,
        ).load()
    )
    labelled = label_predictions(preds, clean, attribution, prediction_delay, click_delay)
    complete_after = timedelta(
        seconds=interval_seconds(attribution)
        + interval_seconds(prediction_delay)
        + interval_seconds(click_delay)
    )
    writer = MonitorBatchWriter(dsn, topo, window, complete_after, rule)
    return (
        labelled.writeStream.queryName(query_name)
        .option("checkpointLocation", checkpoint)
        .outputMode("append")
        .foreachBatch(writer)
        .trigger(**trigger_kwargs(trigger))
        .start()
    )
