"""The Spark pipelines of the ML application on a small simulated world (one SparkSession for the module).

The transforms run on DataFrames of the simulated topics; the streaming queries run through the pgstreams
Spark source when it is installed.
"""

from __future__ import annotations

import math
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

import psycopg
import pytest
from psycopg.conninfo import make_conninfo

import _spark_helpers
import pgstreams
from pgstreams_ml import audit, clean, join, monitor, train
from pgstreams_ml._util import wait_until
from pgstreams_ml.config import Topology, setup
from pgstreams_ml.domain import REGIMES
from pgstreams_ml.enrichment import enrichment_worker
from pgstreams_ml.metrics import DegradationRule
from pgstreams_ml.simulator import SimConfig, Simulator
from pgstreams_ml.sparkutil import read_topic_local, register_source, spark_session

pytestmark = [pytest.mark.spark, pytest.mark.timeout(600)]
HOUR = 3600.0


@dataclass
class World:
    dsn: str
    client: pgstreams.Client
    topo: Topology
    sim: Simulator
    spark: Any
    parsed: Any

    def at(self, minutes: float) -> datetime:
        return self.sim.config.start + timedelta(minutes=minutes)


@pytest.fixture(scope="module")
def spark() -> Iterator[Any]:
    _spark_helpers.session("pgstreams-ml-tests")  # the run's session, with the tests' settings
    s = spark_session("local[2]", shuffle_partitions=2)
    yield s
    for q in s.streams.active:
        q.stop()


@contextmanager
def _database(server_dsn: str, template_db: str) -> Iterator[str]:
    name = f"ml_{uuid.uuid4().hex[:12]}"
    with psycopg.connect(server_dsn, autocommit=True) as conn:
        conn.execute(
            psycopg.sql.SQL("CREATE DATABASE {} TEMPLATE {}").format(
                psycopg.sql.Identifier(name), psycopg.sql.Identifier(template_db)
            )
        )
    yield make_conninfo(server_dsn, dbname=name)
    with psycopg.connect(server_dsn, autocommit=True) as conn:
        conn.execute(
            psycopg.sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(psycopg.sql.Identifier(name))
        )


@pytest.fixture(scope="module")
def world(server_dsn: str, template_db: str, spark: Any) -> Iterator[World]:
    """2 simulated hours (drift after 1 h), enrichment applied, raw topic parsed and the examples written."""
    with _database(server_dsn, template_db) as dsn:
        client = pgstreams.connect(dsn)
        topo = Topology(partitions=2)
        setup(client, topo)
        sim = Simulator(
            client,
            SimConfig(
                seed=7,
                users=600,
                ads=60,
                rate=2.0,
                duration=2 * HOUR,
                drift_at=HOUR,
                malformed_rate=0.02,
                duplicate_rate=0.03,
            ),
            topo,
        )
        sim.run()
        worker, _ = enrichment_worker(client, topo)
        worker.start()
        try:
            assert wait_until(
                lambda: sum(s.lag for s in client.describe_group(topo.enrichment_group)) == 0, 120
            )
        finally:
            worker.stop(10)
        parsed = clean.deduplicate(clean.parse_raw(read_topic_local(spark, client, topo.raw_topic))).persist()
        labelled = join.label_impressions(join.parse_clean(clean.clean_rows(parsed)))
        join.write_examples(labelled, dsn, topo.schema)
        yield World(dsn, client, topo, sim, spark, parsed)
        parsed.unpersist()
        client.close()


def _ledger(w: World) -> list[tuple]:
    with w.client.connection() as conn:
        return conn.execute("SELECT seq, event_id, verdict, reason FROM ml.sim_ledger").fetchall()


# -- clean --------------------------------------------------------------------------------------------------
def test_clean_gives_every_malformed_record_its_reason_and_drops_only_duplicates(world: World) -> None:
    ledger = _ledger(world)
    rows = world.parsed.select("raw_headers", "reason", "event_id").collect()
    got_bad = {r["raw_headers"]["seq"]: r["reason"] for r in rows if r["reason"] is not None}
    want_bad = {str(s): reason for s, _e, v, reason in ledger if v == "malformed"}
    assert got_bad == want_bad and len(want_bad) > 50
    got_clean = sorted(r["event_id"] for r in rows if r["reason"] is None)
    want_clean = sorted(e for _s, e, v, _r in ledger if v == "clean")
    assert got_clean == want_clean  # every clean event once: no loss, duplicates dropped
    assert len(ledger) - len(rows) == sum(1 for x in ledger if x[2] == "duplicate") > 50


def test_clean_normalises_chicago_timestamps_to_utc(world: World) -> None:
    imps = {
        r["event_id"]: r["ts"]
        for r in world.parsed.filter("type = 'impression' AND reason IS NULL")
        .select("event_id", "ts")
        .collect()
    }
    with world.client.connection() as conn:
        oracle = dict(conn.execute("SELECT impression_id, ts FROM ml.oracle").fetchall())
    assert len(imps) > 1000
    for eid, ts in imps.items():  # PySpark hands out naive local times: compare as instants
        assert ts.astimezone() == oracle[eid], eid


def test_clean_and_quarantine_rows_carry_what_downstream_needs(world: World) -> None:
    c = clean.clean_rows(world.parsed).limit(200).collect()
    assert all(r["event_id"] and r["event_type"] in ("impression", "click", "conversion") for r in c)
    assert all(r["value"].count('"ts":"') == 1 and 'Z"' in r["value"] for r in c)
    q = clean.quarantine_rows(world.parsed).collect()
    assert q and all(r["event_id"].startswith("q:") and r["headers"]["reason"] == r["event_type"] for r in q)
    assert all("seq" in r["headers"] and '"raw_text"' in r["value"] for r in q)


# -- join ---------------------------------------------------------------------------------------------------
def test_join_features_are_point_in_time_and_labels_match_the_outcomes(world: World) -> None:
    with world.client.connection() as conn:
        rows = conn.execute(
            "SELECT o.regime, o.p_click, o.clicked, e.label, e.enriched, e.activity, e.quality, e.price,"
            " e.age, e.category, e.fav_category, e.slot, e.device, e.country"
            " FROM ml.training_examples e JOIN ml.oracle o USING (impression_id)"
        ).fetchall()
        lost_clicks = conn.execute(
            "SELECT count(*) FROM ml.sim_ledger WHERE verdict = 'malformed' AND event_type = 'click'"
        ).fetchone()
    assert len(rows) > 10_000
    assert all(r[4] for r in rows)  # every example found its profile and catalogue entry
    names = ("activity", "quality", "price", "age", "category", "fav_category", "slot", "device", "country")
    for r in rows:  # the features are exactly the ones the hidden ground truth used
        assert REGIMES[r[0]].probability(dict(zip(names, r[5:], strict=True))) == pytest.approx(
            r[1], abs=1e-9
        )
    wrong = [r for r in rows if bool(r[3]) != r[2]]
    assert all(r[2] and not r[3] for r in wrong)  # only clicks lost to corruption turn into negatives
    assert len(wrong) <= lost_clicks[0]


# -- training -----------------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def first_model(world: World) -> train.TrainResult:
    """The model trained on the first 40 minutes, evaluated on minutes 40-60 (before the drift)."""
    return train.train_and_register(
        world.spark, world.client, world.topo, world.at(0), world.at(40), world.at(40), world.at(60)
    )


def test_training_reaches_the_oracle_and_deploys_the_first_model(
    world: World, first_model: train.TrainResult
) -> None:
    res = first_model
    oracle = audit.oracle_auc(world.client, world.topo, world.at(40), world.at(60))
    assert oracle["rows"] == res.metrics["rows"]
    assert abs(oracle["auc"] - res.metrics["auc"]) <= 0.03
    assert res.promoted and res.metrics["calibration"] == pytest.approx(1.0, abs=0.15)
    with world.client.connection() as conn:
        rec = conn.execute(
            "SELECT status, lineage, params, length(artefact) FROM ml.models WHERE model_id = %s",
            (res.model_id,),
        ).fetchone()
    assert rec is not None and rec[0] == "deployed"
    assert rec[1]["train_range"][0] == world.at(0).isoformat() and rec[1]["code_version"]
    assert rec[2]["reg_param"] > 0 and rec[3] > 1000


def test_after_drift_monitoring_flags_and_a_retrained_model_recovers(
    world: World, first_model: train.TrainResult
) -> None:
    from pyspark.sql import functions as F

    with world.client.connection() as conn:
        v1 = conn.execute(
            "SELECT model_id, metrics, artefact FROM ml.models WHERE model_id = %s AND status = 'deployed'",
            (first_model.model_id,),
        ).fetchone()
    assert v1 is not None, "the first model is not the deployed one"
    art = v1[2]
    from pgstreams_ml import registry

    model = registry.scoring_model(v1[0], bytes(art))
    # online evaluation of v1 over the whole run, windows of 15 minutes, with the monitor's own code
    examples = train.with_features(
        train.load_examples(world.spark, world.dsn, world.topo.schema, world.at(40), world.at(120))
    )
    scored = train.score_with(model, examples).withColumn("model_id", F.lit(v1[0]))
    parts = monitor.partial_statistics(scored, "15 minutes")
    verdicts = {}
    for (ws, _mid), acc in sorted(parts.items()):
        m = monitor.window_metrics(
            monitor.merge_partials(
                [
                    (
                        acc["n"],
                        acc["clicks"],
                        acc["sum_p"],
                        acc["sum_log_loss"],
                        acc["hist"],
                        acc["features"],
                        acc["max_ts"],
                    )
                ]
            ),
            v1[1],
            DegradationRule(),
        )
        verdicts[ws] = m
    drift = world.at(60)
    before = [m for ws, m in verdicts.items() if ws < drift]
    after = [m for ws, m in sorted(verdicts.items()) if ws >= drift]
    assert before and not any(m["degraded"] for m in before)
    assert after[0]["degraded"] and after[0]["drift"]
    assert after[0]["auc"] < v1[1]["auc"] - 0.1
    # retrain on post-change data: close to the new oracle, and it replaces v1
    res = train.train_and_register(
        world.spark, world.client, world.topo, world.at(60), world.at(100), world.at(100), world.at(120)
    )
    oracle = audit.oracle_auc(world.client, world.topo, world.at(100), world.at(120))
    assert abs(oracle["auc"] - res.metrics["auc"]) <= 0.03
    assert res.promoted and res.deployed_model_id == v1[0]
    assert res.deployed_metrics is not None and res.deployed_metrics["auc"] < res.metrics["auc"] - 0.1
    assert math.isfinite(res.metrics["log_loss"])


def test_training_rejects_bad_ranges(world: World) -> None:
    with pytest.raises(pgstreams.InvalidArgument, match="train_start < train_end"):
        train.train_and_register(
            world.spark, world.client, world.topo, world.at(40), world.at(10), world.at(40), world.at(60)
        )
    with pytest.raises(pgstreams.InvalidArgument, match="examples"):
        train.train_and_register(
            world.spark, world.client, world.topo, world.at(600), world.at(610), world.at(610), world.at(620)
        )


# -- streaming through the pgstreams Spark source -------------------------------------------------------
def test_clean_query_is_exactly_once_across_runs_and_restarts(
    server_dsn: str, template_db: str, spark: Any, tmp_path: Path
) -> None:
    assert register_source(spark), "pgstreams.spark (the Spark data source) is not installed"
    with _database(server_dsn, template_db) as dsn, pgstreams.connect(dsn) as client:
        topo = Topology(partitions=2)
        setup(client, topo)
        ck = str(tmp_path / "clean")
        # two simulator runs, each followed by an availableNow run from the checkpoint
        for seed in (1, 2):
            cfg = SimConfig(
                seed=seed,
                users=100,
                ads=20,
                duration=300.0,
                malformed_rate=0.05,
                duplicate_rate=0.05,
                start=SimConfig().start + timedelta(hours=seed),
            )
            Simulator(client, cfg, topo).run()
            q = clean.build_clean_query(
                spark, dsn, topo, ck, trigger="availableNow", max_events_per_trigger=700
            )
            q.awaitTermination(300)
            assert q.exception() is None
            # stateless: no state operator (duplicates are dropped by the clean topic's event ids)
            assert q.recentProgress and all(not p["stateOperators"] for p in q.recentProgress)
        rec = audit.reconcile(client, topo)
        assert rec.ok, rec.problems
        assert rec.quarantined > 0 and rec.dropped_duplicates > 0
        assert sum(s.lag for s in client.describe_group(topo.clean_group)) == 0
        # the batches' bookings count what the topics hold: the duplicates are the clean rows not stored
        with client.connection() as conn:
            booked = conn.execute(
                "SELECT coalesce(sum((rows_out->>'clean')::int), 0),"
                " coalesce(sum((rows_out->>'duplicates')::int), 0), sum(rows_in)"
                " FROM ml.pipeline_batches WHERE pipeline = 'clean'"
            ).fetchone()
        assert booked == (rec.clean, rec.dropped_duplicates, rec.raw)
