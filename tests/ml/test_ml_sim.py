"""The simulator: determinism, the hidden oracle and ledger, dirt, Chicago timestamps, drift."""

from __future__ import annotations

import json
import math
from collections import Counter
from datetime import datetime, timedelta, timezone

import pytest

import pgstreams
from pgstreams_ml import events
from pgstreams_ml._util import parse_duration
from pgstreams_ml.config import Topology, setup
from pgstreams_ml.domain import FEATURE_NAMES, RAW_INPUTS, REGIMES, feature_vector
from pgstreams_ml.simulator import SimConfig, Simulator

SMALL = dict(users=200, ads=30, rate=4.0, duration=600.0, seed=11)


def _run(client: pgstreams.Client, topo: Topology, **kw: object) -> Simulator:
    setup(client, topo)
    sim = Simulator(client, SimConfig(**{**SMALL, **kw}), topo)  # type: ignore[arg-type]
    sim.run()
    return sim


def _raw(client: pgstreams.Client, topic: str) -> list[pgstreams.Event]:
    c = client.consumer(topic, "test-reader")
    out = []
    while got := c.poll(10_000, timeout=0.0):
        out.extend(got)
    return out


def test_same_seed_same_events_and_ledger(client: pgstreams.Client) -> None:
    a = Topology()
    b = Topology(
        schema="ml_b",
        raw_topic="b.raw",
        updates_topic="b.updates",
        clean_topic="b.clean",
        quarantine_topic="b.quarantine",
        predictions_topic="b.predictions",
    )
    _run(client, a)
    _run(client, b)
    ra = sorted((e.headers["seq"], e.value) for e in _raw(client, a.raw_topic))
    rb = sorted((e.headers["seq"], e.value) for e in _raw(client, b.raw_topic))
    assert ra == rb and len(ra) > 1500
    with client.connection() as conn:
        la = conn.execute("SELECT seq, event_id, verdict, reason FROM ml.sim_ledger ORDER BY seq").fetchall()
        lb = conn.execute(
            "SELECT seq, event_id, verdict, reason FROM ml_b.sim_ledger ORDER BY seq"
        ).fetchall()
        oa = conn.execute("SELECT impression_id, p_click, clicked FROM ml.oracle ORDER BY 1").fetchall()
        ob = conn.execute("SELECT impression_id, p_click, clicked FROM ml_b.oracle ORDER BY 1").fetchall()
    assert la == lb
    assert oa == ob


def test_ledger_accounts_for_every_raw_record_and_dirt(client: pgstreams.Client) -> None:
    topo = Topology()
    sim = _run(client, topo, malformed_rate=0.05, duplicate_rate=0.05)
    raw = _raw(client, topo.raw_topic)
    with client.connection() as conn:
        ledger = {
            str(r[0]): r[1:]
            for r in conn.execute("SELECT seq, event_id, verdict, reason FROM ml.sim_ledger").fetchall()
        }
    assert len(raw) == len(ledger) == sim.stats.raw_records
    assert {e.headers["seq"] for e in raw} == set(ledger)
    verdicts = Counter(v[1] for v in ledger.values())
    assert verdicts["malformed"] == sim.stats.malformed > 0
    assert verdicts["duplicate"] == sim.stats.duplicates > 0
    assert set(Counter(v[2] for v in ledger.values() if v[1] == "malformed")) == set(events.REASONS)
    by_seq = {e.headers["seq"]: e for e in raw}
    for seq, (eid, verdict, reason) in ledger.items():
        text = by_seq[seq].value
        if verdict == "malformed" and reason == events.INVALID_JSON:
            with pytest.raises(ValueError):
                json.loads(text)
            continue
        body = json.loads(text)
        if verdict != "malformed":
            assert body["event_id"] == eid
            assert events.parse_ts(body["ts"]) is not None
        elif reason == events.TIMESTAMP_WITHOUT_ZONE:
            assert events.parse_ts(body["ts"]) is None and "T" in body["ts"]
    # every duplicate repeats the exact text of a clean record with the same event id
    clean_text = {ledger[s][0]: by_seq[s].value for s in ledger if ledger[s][1] == "clean"}
    for s, (eid, verdict, _r) in ledger.items():
        if verdict == "duplicate":
            assert by_seq[s].value == clean_text[eid]


def test_timestamps_on_a_chicago_clock_cross_the_dst_change(client: pgstreams.Client) -> None:
    topo = Topology()
    start = datetime(2025, 3, 9, 7, 50, tzinfo=timezone.utc)  # 01:50 CST, 10 minutes before clocks go forward
    _run(client, topo, start=start, duration=1200.0, malformed_rate=0.0, rate=1.0)
    offsets = Counter()
    for e in _raw(client, topo.raw_topic):
        ts = json.loads(e.value)["ts"]
        offsets[ts[-6:] if not ts.endswith("Z") else "Z"] += 1
        utc = events.parse_ts(ts)
        assert utc is not None and utc.tzinfo is not None
        if not ts.endswith("Z"):
            assert ts[-6:] == ("-06:00" if utc < datetime(2025, 3, 9, 8, tzinfo=timezone.utc) else "-05:00")
    assert offsets["-06:00"] and offsets["-05:00"] and offsets["Z"]


def test_chicago_offset_matches_the_time_zone_database() -> None:
    import zoneinfo

    tz = zoneinfo.ZoneInfo("America/Chicago")  # the system's time-zone database, or the tzdata package
    t = datetime(2024, 1, 1, tzinfo=timezone.utc)
    while t < datetime(2026, 1, 1, tzinfo=timezone.utc):
        assert events.chicago_offset(t) == t.astimezone(tz).utcoffset(), t
        t += timedelta(minutes=37)


def test_oracle_logs_the_true_probability_and_drift_switches_regime(client: pgstreams.Client) -> None:
    topo = Topology()
    sim = _run(client, topo, drift_at=300.0)
    with client.connection() as conn:
        rows = conn.execute("SELECT ts, regime, p_click, clicked FROM ml.oracle").fetchall()
    assert len(rows) == sim.stats.impressions
    drift = sim.config.start + timedelta(seconds=300)
    assert all((r[1] == 1) == (r[0] >= drift) for r in rows)
    assert all(0.0 < r[2] < 1.0 for r in rows)
    assert sum(r[3] for r in rows) == sim.stats.clicks
    # clicks follow the logged probability: observed rate close to the mean probability
    for regime in (0, 1):
        sel = [r for r in rows if r[1] == regime]
        mean_p = sum(r[2] for r in sel) / len(sel)
        rate = sum(r[3] for r in sel) / len(sel)
        assert abs(rate - mean_p) < 4 * (mean_p * (1 - mean_p) / len(sel)) ** 0.5


def test_the_oracle_is_logistic_in_the_model_features() -> None:
    row = {
        "activity": 0.5,
        "quality": 0.3,
        "price": 80.0,
        "age": 33,
        "category": "travel",
        "fav_category": "travel",
        "slot": 2,
        "device": "tablet",
        "country": "MX",
    }
    assert set(row) == set(RAW_INPUTS)
    x = dict(zip(FEATURE_NAMES, feature_vector(row), strict=True))
    assert (
        x["fav_match"] == 1.0 and x["slot_2"] == 1.0 and x["device_tablet"] == 1.0 and x["cat_travel"] == 1.0
    )
    assert x["log_price"] == pytest.approx(math.log(80 / 50)) and x["age_c"] == pytest.approx(-0.7)
    for regime in REGIMES:
        z = regime.intercept + sum(regime.coef.get(n, 0.0) * v for n, v in x.items())
        assert regime.probability(row) == pytest.approx(1 / (1 + math.exp(-z)))


@pytest.mark.parametrize(
    "kw, word",
    [
        ({"rate": 0}, "rate"),
        ({"duration": -1}, "duration"),
        ({"malformed_rate": 2}, "malformed_rate"),
        ({"users": 0}, "users"),
        ({"drift_at": 1e9}, "drift_at"),
        ({"start": datetime(2025, 1, 1)}, "start"),
        ({"speed": "fast"}, "speed"),
    ],
)
def test_bad_config_is_rejected_with_its_name(kw: dict[str, object], word: str) -> None:
    with pytest.raises(pgstreams.InvalidArgument, match=word):
        SimConfig(**kw)  # type: ignore[arg-type]


def test_parse_duration() -> None:
    assert parse_duration("4h") == 14400
    assert parse_duration("1h30m") == 5400
    assert parse_duration("45s") == 45
    assert parse_duration("90") == 90
    for bad in ("4x", "", "-3", "h"):
        with pytest.raises(pgstreams.InvalidArgument, match="duration"):
            parse_duration(bad)


def test_sim_command_publishes_through_a_subprocess(dsn: str) -> None:
    import subprocess
    import sys

    out = subprocess.run(
        [
            sys.executable,
            "-m",
            "pgstreams.cli",
            "sim",
            "--dsn",
            dsn,
            "--duration",
            "5m",
            "--speed",
            "0",
            "--users",
            "50",
            "--ads",
            "10",
            "--drift-at",
            "2m",
            "--seed",
            "3",
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert out.returncode == 0, out.stderr
    stats = json.loads(out.stdout.strip().splitlines()[-1])
    assert stats["impressions"] > 500 and stats["raw_records"] >= stats["impressions"]
    with pgstreams.connect(dsn) as client:
        assert client.describe_topic("ml.raw").events == stats["raw_records"]
        assert client.describe_topic("ml.updates").events == stats["updates"]
        with client.connection() as conn:
            row = conn.execute("SELECT count(*), count(DISTINCT regime) FROM ml.oracle").fetchone()
    assert row == (stats["impressions"], 2)
