"""Training with Spark MLlib: fit on a time range of training examples, evaluate on a later holdout, store
the model with its metrics and lineage in the registry, and deploy it only if it beats the deployed one on
the same holdout.

The model is a logistic regression over :data:`pgstreams_ml.domain.FEATURE_NAMES` (numeric inputs and
one-hot levels computed by :func:`feature_columns`, the Spark twin of
:func:`pgstreams_ml.domain.feature_vector`, which the online scorer uses).
"""

from __future__ import annotations

import os
import tempfile
import time
from dataclasses import asdict, dataclass, field
from datetime import datetime
from typing import TYPE_CHECKING, Any

import psycopg

import pgstreams

from . import _sql, registry
from ._util import code_version
from .domain import DRIFT_CATEGORICAL, DRIFT_NUMERIC, FEATURE_NAMES, FEATURES, PRICE_REF
from .metrics import EPS

if TYPE_CHECKING:
    from pyspark.sql import Column, DataFrame, SparkSession

    from .config import Topology

_EXAMPLE_DDL = (
    "impression_id STRING, ts TIMESTAMP, slot INT, device STRING, age INT, country STRING, "
    "fav_category STRING, activity DOUBLE, category STRING, price DOUBLE, quality DOUBLE, label INT"
)


@dataclass(frozen=True)
class TrainParams:
    """MLlib ``LogisticRegression`` settings: ``reg_param`` (default 1e-4), ``elastic_net`` (0: ridge),
    ``max_iter`` (50), ``tol`` (1e-6); ``min_gain`` (0) is the holdout AUC margin a candidate needs over
    the deployed model to replace it."""

    reg_param: float = 1e-4
    elastic_net: float = 0.0
    max_iter: int = 50
    tol: float = 1e-6
    min_gain: float = 0.0


@dataclass(frozen=True)
class TrainResult:
    """The outcome of :func:`train_and_register`."""

    model_id: int
    promoted: bool
    decision: str
    metrics: dict[str, Any]
    deployed_model_id: int | None
    deployed_metrics: dict[str, Any] | None = None
    seconds: float = 0.0
    lineage: dict[str, Any] = field(default_factory=dict)


def feature_column_name(name: str) -> str:
    """The Spark column holding feature ``name`` (``f_<name>``: apart from the raw input columns)."""
    return f"f_{name}"


def feature_columns() -> list[Column]:
    """The model features as Spark columns named by :func:`feature_column_name`, from the raw inputs."""
    from pyspark.sql import functions as F

    out = []
    for f in FEATURES:
        src = F.col(f.source)
        if f.kind == "num":
            if f.transform == "log_price":
                c = F.log(F.greatest(src.cast("double"), F.lit(0.01)) / F.lit(PRICE_REF))
            elif f.transform == "age_c":
                c = (src.cast("double") - 40.0) / 10.0
            else:
                c = src.cast("double")
        elif f.kind == "onehot":
            c = F.when(src == F.lit(f.level), 1.0).otherwise(0.0)
        else:
            c = F.when(src == F.col(f.other or ""), 1.0).otherwise(0.0)
        out.append(c.alias(feature_column_name(f.name)))
    return out


def with_features(df: DataFrame) -> DataFrame:
    """``df`` plus the feature columns and their assembled ``features`` vector."""
    from pyspark.ml.feature import VectorAssembler

    wide = df.select("*", *feature_columns())
    return VectorAssembler(
        inputCols=[feature_column_name(n) for n in FEATURE_NAMES], outputCol="features"
    ).transform(wide)


def drift_bucket_columns() -> list[Column]:
    """Per monitored input, its drift bucket label as a string column named ``b_<input>`` (the Spark twin of
    :func:`pgstreams_ml.domain.drift_bucket`)."""
    from pyspark.sql import functions as F

    out = [F.col(n).cast("string").alias(f"b_{n}") for n in DRIFT_CATEGORICAL]
    for n, edges in DRIFT_NUMERIC.items():
        expr = None
        for i, e in enumerate(edges):
            cond = F.col(n) < F.lit(e)
            expr = F.when(cond, F.lit(f"b{i}")) if expr is None else expr.when(cond, F.lit(f"b{i}"))
        assert expr is not None
        out.append(expr.otherwise(F.lit(f"b{len(edges)}")).alias(f"b_{n}"))
    return out


def reference_distributions(df: DataFrame) -> dict[str, dict[str, float]]:
    """Relative frequency of each drift bucket of each monitored input in ``df``."""
    from pyspark.sql import functions as F

    names = list(DRIFT_CATEGORICAL) + list(DRIFT_NUMERIC)
    b = df.select(*drift_bucket_columns())
    pairs = b.select(
        F.explode(F.array(*[F.struct(F.lit(n).alias("k"), F.col(f"b_{n}").alias("v")) for n in names])).alias(
            "kv"
        )
    )
    rows = pairs.groupBy("kv.k", "kv.v").count().collect()
    out: dict[str, dict[str, float]] = {n: {} for n in names}
    for r in rows:
        out[r["k"]][str(r["v"])] = float(r["count"])
    for n, counts in out.items():
        total = sum(counts.values()) or 1.0
        out[n] = {k: v / total for k, v in sorted(counts.items())}
    return out


def load_examples(spark: SparkSession, dsn: str, schema: str, start: datetime, end: datetime) -> DataFrame:
    """Enriched training examples with ``start <= ts < end`` as a DataFrame (fetched with one query and
    handed to Spark as Arrow)."""
    import pyarrow as pa

    with psycopg.connect(dsn, autocommit=True) as conn:
        cur = conn.execute(_sql.q("load_examples", schema), (start, end))
        rows = cur.fetchall()
    names = [c.split()[0] for c in _EXAMPLE_DDL.split(", ")]
    cols: list[Any] = list(zip(*rows, strict=True)) if rows else [[] for _ in names]
    types = {
        "impression_id": pa.string(),
        "ts": pa.timestamp("us", tz="UTC"),
        "slot": pa.int32(),
        "device": pa.string(),
        "age": pa.int32(),
        "country": pa.string(),
        "fav_category": pa.string(),
        "activity": pa.float64(),
        "category": pa.string(),
        "price": pa.float64(),
        "quality": pa.float64(),
        "label": pa.int32(),
    }
    table = pa.table({n: pa.array(list(c), type=types[n]) for n, c in zip(names, cols, strict=True)})
    if table.num_rows == 0:
        return spark.createDataFrame([], _EXAMPLE_DDL)
    return spark.createDataFrame(table)


def evaluate(df: DataFrame, prob: str = "p", label: str = "label", bins: int = 10) -> dict[str, Any]:
    """AUC, log loss, calibration ratio (mean prediction / positive rate), expected calibration error and
    the reliability table of probability column ``prob`` against ``label``."""
    from pyspark.ml.evaluation import BinaryClassificationEvaluator
    from pyspark.sql import functions as F

    p = F.least(F.greatest(F.col(prob), F.lit(EPS)), F.lit(1 - EPS))
    y = F.col(label).cast("double")
    agg = df.agg(
        F.count("*").alias("n"),
        F.sum(y).alias("pos"),
        F.sum(F.col(prob)).alias("sum_p"),
        F.sum(-(y * F.log(p) + (1 - y) * F.log(1 - p))).alias("ll"),
    ).collect()[0]
    n, pos = int(agg["n"]), float(agg["pos"] or 0.0)
    out: dict[str, Any] = {"rows": n, "positives": int(pos)}
    if n == 0:
        return out
    bucket = F.least(F.floor(F.col(prob) * bins), F.lit(bins - 1)).cast("int")
    table = (
        df.groupBy(bucket.alias("bin"))
        .agg(F.count("*").alias("n"), F.avg(F.col(prob)).alias("mean_p"), F.avg(y).alias("rate"))
        .orderBy("bin")
        .collect()
    )
    rel = [
        {"bin": int(r["bin"]), "n": int(r["n"]), "mean_p": float(r["mean_p"]), "rate": float(r["rate"])}
        for r in table
    ]
    out["log_loss"] = float(agg["ll"]) / n
    out["ctr"] = pos / n
    out["mean_p"] = float(agg["sum_p"]) / n
    out["calibration"] = out["mean_p"] / out["ctr"] if pos else None
    out["ece"] = sum(r["n"] * abs(r["mean_p"] - r["rate"]) for r in rel) / n
    out["reliability"] = rel
    if 0 < pos < n:
        ev = BinaryClassificationEvaluator(rawPredictionCol=prob, labelCol=label, metricName="areaUnderROC")
        out["auc"] = float(ev.evaluate(df.select(F.col(prob).cast("double").alias(prob), y.alias(label))))
    return out


def score_with(model: registry.ScoringModel, df: DataFrame, out: str = "p") -> DataFrame:
    """``df`` (with feature columns) plus ``out``: the probability under a registry model's coefficients,
    computed exactly as the online scorer computes it."""
    from pyspark.sql import functions as F

    z = F.lit(model.intercept)
    for name, c in zip(model.features, model.coefficients, strict=True):
        z = z + F.col(feature_column_name(name)) * F.lit(c)
    return df.withColumn(out, F.lit(1.0) / (F.lit(1.0) + F.exp(-z)))


def _iso(t: datetime) -> str:
    return t.isoformat()


def train_and_register(
    spark: SparkSession,
    client: pgstreams.Client,
    topo: Topology,
    train_start: datetime,
    train_end: datetime,
    holdout_start: datetime,
    holdout_end: datetime,
    params: TrainParams | None = None,
    promote: bool = True,
) -> TrainResult:
    """Train on examples with ``train_start <= ts < train_end``, evaluate on ``holdout_start <= ts <
    holdout_end``, register the model (artefact, metrics, lineage, parameters) and, when ``promote`` (default
    true), deploy it if it beats the deployed model on the same holdout rows.

    Raises :class:`pgstreams.InvalidArgument` for an empty or one-class range, or a holdout that does not
    start at or after the end of the training range.
    """
    from pyspark.ml.classification import LogisticRegression
    from pyspark.ml.functions import vector_to_array
    from pyspark.sql import functions as F

    for name, t in (
        ("train_start", train_start),
        ("train_end", train_end),
        ("holdout_start", holdout_start),
        ("holdout_end", holdout_end),
    ):
        if not isinstance(t, datetime) or t.utcoffset() is None:
            raise pgstreams.InvalidArgument(f"{name} must be an aware datetime, got {t!r}")
    if not train_start < train_end <= holdout_start < holdout_end:
        raise pgstreams.InvalidArgument("need train_start < train_end <= holdout_start < holdout_end")
    params = params or TrainParams()
    t0 = time.monotonic()
    dsn, schema = client.dsn, topo.schema
    train_df = with_features(load_examples(spark, dsn, schema, train_start, train_end)).persist()
    hold_df = with_features(load_examples(spark, dsn, schema, holdout_start, holdout_end)).persist()
    try:
        counts = {}
        for nm, d in (("train", train_df), ("holdout", hold_df)):
            r = d.agg(F.count("*").alias("n"), F.sum("label").alias("pos")).collect()[0]
            n, pos = int(r["n"]), int(r["pos"] or 0)
            if n == 0 or pos == 0 or pos == n:
                raise pgstreams.InvalidArgument(
                    f"the {nm} range has {n} examples with {pos} clicks: need both classes"
                )
            counts[nm] = {"rows": n, "positives": pos}
        lr = LogisticRegression(
            featuresCol="features",
            labelCol="label",
            maxIter=params.max_iter,
            regParam=params.reg_param,
            elasticNetParam=params.elastic_net,
            tol=params.tol,
            standardization=True,
        )
        model = lr.fit(train_df)
        coef = [float(c) for c in model.coefficients]
        scorer = registry.ScoringModel(0, float(model.intercept), tuple(coef))
        scored = model.transform(hold_df).withColumn("p", vector_to_array(F.col("probability"))[1])
        metrics = evaluate(scored)
        history = [float(v) for v in model.summary.objectiveHistory]
        metrics["train"] = counts["train"] | {
            "iterations": model.summary.totalIterations,
            "objective": history[-1] if history else None,
        }
        metrics["reference"] = reference_distributions(train_df)
        lineage = {
            "train_range": [_iso(train_start), _iso(train_end)],
            "holdout_range": [_iso(holdout_start), _iso(holdout_end)],
            "rows": counts,
            "code_version": code_version(),
            "spark_version": spark.version,
            "features": list(FEATURE_NAMES),
            "source_table": f"{schema}.training_examples",
        }
        if (spark.sparkContext.master or "").startswith("local"):
            with tempfile.TemporaryDirectory(prefix="pgstreams-ml-model-") as tmp:
                mdir = os.path.join(tmp, "model")
                model.write().overwrite().save(mdir)
                blob = registry.pack_artefact(mdir, scorer.intercept, coef)
        else:
            # MLlib's writer saves from the executors, to paths on their own machines, which the driver
            # cannot zip: on a cluster the artefact holds model.json (all that scoring reads) only
            blob = registry.pack_artefact(None, scorer.intercept, coef)
        with client.connection() as conn:
            current = registry.deployed(conn, schema, topo.model_name)
            model_id = registry.register(
                conn,
                schema,
                topo.model_name,
                blob,
                asdict(params) | {"algorithm": "pyspark.ml.classification.LogisticRegression"},
                metrics,
                lineage,
            )
        deployed_metrics = None
        deployed_score = None
        if current is not None:
            with client.connection() as conn:
                old = registry.scoring_model(
                    current.model_id, registry.artefact(conn, schema, current.model_id)
                )
            deployed_metrics = evaluate(score_with(old, hold_df))
            deployed_metrics.pop("reliability", None)
            deployed_score = deployed_metrics.get("auc")
        promoted = False
        decision = "registered as candidate (promotion not requested)"
        if promote:
            with client.connection() as conn:
                promoted = registry.promote_if_better(
                    conn,
                    schema,
                    topo.model_name,
                    model_id,
                    float(metrics.get("auc") or 0.0),
                    deployed_score,
                    None if current is None else current.model_id,
                    "auc",
                    params.min_gain,
                )
                rec = registry.get(conn, schema, model_id)
            decision = (rec.decision or {}).get("reason", "") if rec else ""
        return TrainResult(
            model_id,
            promoted,
            decision,
            metrics,
            None if current is None else current.model_id,
            deployed_metrics,
            time.monotonic() - t0,
            lineage,
        )
    finally:
        train_df.unpersist()
        hold_df.unpersist()
