"""The parts that run without Spark: enrichment store and worker group, metrics, model registry, scorer."""

from __future__ import annotations

import json
import math
import random
from datetime import datetime, timedelta, timezone

import psycopg
import pytest

import pgstreams
from pgstreams_ml import metrics as M
from pgstreams_ml import registry
from pgstreams_ml._util import read_committed, wait_until
from pgstreams_ml.config import Topology, setup
from pgstreams_ml.domain import FEATURE_NAMES, REGIME_BEFORE
from pgstreams_ml.enrichment import EnrichmentStore, apply_updates, enrichment_worker
from pgstreams_ml.events import format_ts
from pgstreams_ml.scoring import Scorer, scorer_worker
from pgstreams_ml.simulator import SimConfig, Simulator

T0 = datetime(2025, 3, 9, 6, tzinfo=timezone.utc)


@pytest.fixture
def topo(client: pgstreams.Client) -> Topology:
    t = Topology()
    setup(client, t)
    return t


def _user(uid: str, ts: datetime, activity: float, style: str = "chicago") -> dict[str, object]:
    return {
        "event_id": f"u-{uid}-{ts.timestamp()}",
        "type": "user_profile",
        "ts": format_ts(ts, style),
        "user_id": uid,
        "age": 30,
        "country": "US",
        "fav_category": "food",
        "activity": activity,
    }


def _lag(client: pgstreams.Client, group: str) -> int:
    try:
        return sum(s.lag for s in client.describe_group(group))
    except pgstreams.GroupNotFound:
        return -1


# -- enrichment ---------------------------------------------------------------------------------------------
def test_updates_upsert_current_rows_and_keep_history_point_in_time(
    client: pgstreams.Client, topo: Topology
) -> None:
    store = EnrichmentStore(client, topo.schema)
    newer, older = T0 + timedelta(minutes=10), T0
    with client.connection() as conn, conn.transaction():
        counts = apply_updates(
            conn,
            topo.schema,
            [
                _user("u1", newer, 0.9),
                _user("u1", older, 0.1, "utc"),
                {"type": "user_profile", "ts": "2025-03-09T01:00:00"},
            ],
        )
    assert counts == {"users": 2, "invalid": 1}
    assert store.users(["u1"])["u1"]["activity"] == 0.9  # the late, older version did not win
    with client.connection() as conn, conn.transaction():  # applying again changes nothing
        apply_updates(conn, topo.schema, [_user("u1", newer, 0.9), _user("u1", older, 0.1)])
    with client.connection() as conn:
        hist = conn.execute(
            "SELECT valid_from, activity FROM ml.user_history WHERE user_id = 'u1' ORDER BY 1"
        ).fetchall()
        version = conn.execute("SELECT version FROM ml.users WHERE user_id = 'u1'").fetchone()
    assert hist == [(older, 0.1), (newer, 0.9)]  # Chicago offsets normalised to the same UTC instants
    assert version == (1,)
    assert store.users(["nobody"]) == {}


def test_enrichment_group_builds_the_store_from_the_updates_topic(
    client: pgstreams.Client, topo: Topology
) -> None:
    sim = Simulator(client, SimConfig(users=150, ads=20, duration=900.0, seed=5, user_update_rate=2.0), topo)
    sim.run()
    worker, counts = enrichment_worker(client, topo)
    worker.start()
    try:
        assert wait_until(lambda: _lag(client, topo.enrichment_group) == 0, 60)
    finally:
        worker.stop(10)
    assert counts["users"] + counts["ads"] == sim.stats.updates and counts["invalid"] == 0
    store = EnrichmentStore(client, topo.schema)
    users = store.users(list(sim._users))
    ads = store.ads(list(sim._ads))
    for uid, u in sim._users.items():
        assert {k: users[uid][k] for k in u} == u
    for aid, a in sim._ads.items():
        assert {k: ads[aid][k] for k in a} == a


# -- metrics ------------------------------------------------------------------------------------------------
def test_auc_matches_the_pairwise_definition_and_the_histogram_estimate() -> None:
    rng = random.Random(3)
    p = [rng.random() for _ in range(400)]
    y = [int(rng.random() < q) for q in p]
    pairs = [(a, b) for a, ya in zip(p, y, strict=True) if ya for b, yb in zip(p, y, strict=True) if not yb]
    brute = sum(1.0 if a > b else 0.5 if a == b else 0.0 for a, b in pairs) / len(pairs)
    assert M.auc(p, y) == pytest.approx(brute)
    hist: dict[int, list[float]] = {}
    for q, t in zip(p, y, strict=True):
        h = hist.setdefault(M.hist_bin(q), [0.0, 0.0, 0.0])
        h[t] += 1
        h[2] += q
    assert M.auc_from_hist(hist) == pytest.approx(brute, abs=0.005)
    assert M.auc([0.1, 0.2], [1, 1]) is None
    assert M.ece_from_hist(hist) == pytest.approx(M.ece(p, y), abs=0.02)


def test_log_loss_and_psi() -> None:
    assert M.log_loss([0.5, 0.5], [0, 1]) == pytest.approx(math.log(2))
    ref = {"a": 0.5, "b": 0.5}
    assert M.psi(ref, {"a": 50, "b": 50}) == pytest.approx(0.0)
    assert M.psi(ref, {"a": 90, "b": 10}) > 0.2


def test_degradation_rule() -> None:
    rule = M.DegradationRule()
    base = {"auc": 0.78, "log_loss": 0.33}
    ok = M.judge(rule, base, 2000, 250, 0.77, 0.34, 1.05, 0.05)
    assert not ok.degraded and not ok.drift
    bad = M.judge(rule, base, 2000, 250, 0.60, 0.45, 0.6, 0.9)
    assert bad.degraded and bad.drift and len(bad.reasons) == 4
    small = M.judge(rule, base, 100, 5, 0.5, 1.0, 0.1, None)
    assert not small.degraded
    # a drop within 3 standard errors of a small window's AUC is noise, not degradation
    assert M.auc_standard_error(0.78, 70, 468) > 0.03
    assert not M.judge(rule, base, 538, 70, 0.72, 0.38, 1.3, None).degraded
    assert M.judge(rule, base, 538, 70, 0.60, 0.38, 1.0, None).degraded


# -- registry -----------------------------------------------------------------------------------------------
def _artefact(intercept: float) -> bytes:
    return registry.pack_artefact(None, intercept, [0.1] * len(FEATURE_NAMES))


def test_registry_promotes_only_a_better_model(client: pgstreams.Client, topo: Topology) -> None:
    with client.connection() as conn:
        m1 = registry.register(
            conn, topo.schema, "ctr", _artefact(-2.0), {"p": 1}, {"auc": 0.7}, {"data": "x"}
        )
        assert registry.promote_if_better(conn, topo.schema, "ctr", m1, 0.7, None, None)
        m2 = registry.register(conn, topo.schema, "ctr", _artefact(-2.1), {}, {"auc": 0.69}, {})
        assert not registry.promote_if_better(conn, topo.schema, "ctr", m2, 0.69, 0.70, m1)
        m3 = registry.register(conn, topo.schema, "ctr", _artefact(-2.2), {}, {"auc": 0.75}, {})
        m4 = registry.register(conn, topo.schema, "ctr", _artefact(-2.3), {}, {"auc": 0.76}, {})
        assert registry.promote_if_better(conn, topo.schema, "ctr", m3, 0.75, 0.70, m1)
        # m4 was compared with m1, which is no longer deployed: not promoted on a stale comparison
        assert not registry.promote_if_better(conn, topo.schema, "ctr", m4, 0.76, 0.70, m1)
        status = {r.model_id: r.status for r in registry.list_models(conn, topo.schema)}
        assert status == {m1: "retired", m2: "rejected", m3: "deployed", m4: "rejected"}
        rec = registry.deployed(conn, topo.schema, "ctr")
        assert rec is not None and rec.model_id == m3 and rec.decision and rec.decision["promoted"]
        assert registry.scoring_model(m3, registry.artefact(conn, topo.schema, m3)).intercept == -2.2


def test_scoring_model_is_the_logistic_function_of_the_features() -> None:
    coef = tuple(REGIME_BEFORE.coef.get(n, 0.0) for n in FEATURE_NAMES)
    model = registry.ScoringModel(1, REGIME_BEFORE.intercept, coef)
    row = {
        "activity": 0.7,
        "quality": 0.2,
        "price": 12.0,
        "age": 61,
        "category": "games",
        "fav_category": "food",
        "slot": 4,
        "device": "desktop",
        "country": "DE",
    }
    assert model.predict(row) == pytest.approx(REGIME_BEFORE.probability(row))


# -- scoring ------------------------------------------------------------------------------------------------
def _deploy(client: pgstreams.Client, topo: Topology, intercept: float, compared_with: int | None) -> int:
    coef = [REGIME_BEFORE.coef.get(n, 0.0) for n in FEATURE_NAMES]
    with client.connection() as conn:
        mid = registry.register(
            conn,
            topo.schema,
            topo.model_name,
            registry.pack_artefact(None, intercept, coef),
            {},
            {"auc": 0.5},
            {},
        )
        assert registry.promote_if_better(
            conn, topo.schema, topo.model_name, mid, 1.0, 0.0 if compared_with else None, compared_with
        )
    return mid


def _impressions(client: pgstreams.Client, topo: Topology, ids: range) -> None:
    with client.connection() as conn, conn.transaction():
        apply_updates(
            conn,
            topo.schema,
            [
                _user("u1", T0, 0.5),
                {
                    "event_id": "a",
                    "type": "ad_catalogue",
                    "ts": format_ts(T0),
                    "ad_id": "a1",
                    "advertiser": "x",
                    "category": "food",
                    "price": 20.0,
                    "quality": 0.5,
                },
            ],
        )
    client.publish_many(
        topo.clean_topic,
        [
            {
                "value": json.dumps(
                    {
                        "event_id": f"imp-{i}",
                        "type": "impression",
                        "ts": format_ts(T0 + timedelta(seconds=i)),
                        "user_id": "u1" if i % 10 else "u-unknown",
                        "ad_id": "a1",
                        "slot": 1,
                        "device": "mobile",
                    }
                ),
                "key": "u1",
                "event_type": "impression",
                "event_id": f"imp-{i}",
            }
            for i in ids
        ]
        + [
            {
                "value": json.dumps({"event_id": "clk-1", "type": "click"}),
                "event_type": "click",
                "event_id": "c1",
            }
        ],
    )


def _predictions(client: pgstreams.Client, topo: Topology) -> list[pgstreams.Event]:
    return read_committed(client, topo.predictions_topic, "test-reader")


def test_scorer_waits_for_a_model_skips_unknown_users_and_is_idempotent(
    client: pgstreams.Client, topo: Topology
) -> None:
    _impressions(client, topo, range(1, 21))
    scorer = Scorer(client, topo)
    batch = client.consumer(topo.clean_topic, "test-batch").poll(100, timeout=1.0)
    assert scorer.handle(batch) == 0 and scorer.counts["no_model"] == 20
    mid = _deploy(client, topo, -1.0, None)
    assert scorer.handle(batch) == 18  # imp-10 and imp-20 have no profile in the store
    assert scorer.counts["unenriched"] == 2
    assert scorer.handle(batch) == 0  # handled again: nothing published twice
    preds = _predictions(client, topo)
    assert len(preds) == 18 and {p.event_id for p in preds} == {
        f"pred:imp-{i}" for i in range(1, 21) if i % 10
    }
    p = preds[0].value
    assert p["model_id"] == mid and 0 < p["p"] < 1 and p["category"] == "food"


def test_scorer_group_reloads_when_another_model_is_deployed(
    client: pgstreams.Client, topo: Topology
) -> None:
    m1 = _deploy(client, topo, -1.0, None)
    workers = [scorer_worker(client, topo) for _ in range(2)]
    for w, _ in workers:
        w.start()
    try:
        _impressions(client, topo, range(1, 41))
        assert wait_until(lambda: len(_predictions(client, topo)) == 36, 60)
        m2 = _deploy(client, topo, 1.0, m1)
        _impressions(client, topo, range(41, 81))
        assert wait_until(lambda: len(_predictions(client, topo)) == 72, 60)
    finally:
        for w, _ in workers:
            w.stop(10)
    by_model = {}
    for e in _predictions(client, topo):
        n = int(e.value["impression_id"].split("-")[1])
        by_model[n] = e.value["model_id"]
    assert {by_model[n] for n in by_model if n <= 40} == {m1}
    assert {by_model[n] for n in by_model if n > 40} == {m2}
    assert sum(s.counts["scored"] for _, s in workers) == 72
    assert sum(s.reloads for _, s in workers) >= 2


def test_read_committed_waits_for_events_behind_the_read_fence(
        client: pgstreams.Client, dsn: str) -> None:
    """Events of a partition committed after an open transaction published to it are behind the
    partition's read fence: an empty poll there is not the end of the topic. ``read_committed`` keeps
    reading (here until its deadline, then says how far it got) instead of returning part of the topic."""
    client.create_topic("fenced", 2)
    client.publish_many("fenced", [{"value": i} for i in range(5)])
    with psycopg.connect(dsn) as holder:
        client.publish("fenced", -1, partition=0, conn=holder)  # published, left open: holds partition 0
        client.publish_many("fenced", [{"value": i, "partition": i % 2} for i in range(5, 12)])
        # partition 1's four events are read, partition 0's three wait behind the open transaction
        with pytest.raises(TimeoutError, match=r"read 9 of the 12 events of topic 'fenced'"):
            read_committed(client, "fenced", "reader", timeout=1.5)
        holder.rollback()
    assert sorted(e.value for e in read_committed(client, "fenced", "reader")) == list(range(12))
