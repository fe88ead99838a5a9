"""The serving path's latency (``pgstreams_ml.latency``): per impression, from the topics' ``created_at``."""

from __future__ import annotations

import json

import pytest

import pgstreams
from pgstreams_ml import latency
from pgstreams_ml._util import read_committed
from pgstreams_ml.config import Topology, setup


@pytest.fixture
def topo(client: pgstreams.Client) -> Topology:
    t = Topology(partitions=2)
    setup(client, t)
    return t


def test_percentiles_are_nearest_rank() -> None:
    values = [float(v) for v in range(1, 101)]  # 1 .. 100
    s = latency.stats(list(reversed(values)))
    assert (s.count, s.p50, s.p95, s.p99, s.max) == (100, 50.0, 95.0, 99.0, 100.0)
    assert latency.stats([]) == latency.LatencyStats(0, None, None, None, None)
    assert latency.stats([0.25]).p99 == 0.25


def _imp(eid: str) -> str:
    return json.dumps({"event_id": eid, "type": "impression", "user_id": "u1", "ad_id": "a1"})


def test_each_stage_is_measured_from_the_topics_created_at(client: pgstreams.Client, topo: Topology) -> None:
    # i1 is published twice to the raw topic (the first copy counts), i2 is never scored, i3 is scored;
    # a malformed record and a click are ignored
    client.publish(topo.raw_topic, _imp("i1"), key="u1")
    client.publish(topo.raw_topic, "{not json", key="u1")
    client.publish(topo.raw_topic, _imp("i2"), key="u1")
    client.publish(topo.raw_topic, _imp("i3"), key="u2")
    client.publish(topo.raw_topic, _imp("i1"), key="u1")
    client.publish(topo.raw_topic, json.dumps({"event_id": "c1", "type": "click"}), key="u1")
    for eid in ("i1", "i2", "i3"):
        client.publish(topo.clean_topic, _imp(eid), key="u1", event_type="impression", event_id=eid)
    for eid in ("i3", "i1"):
        client.publish(topo.predictions_topic, {"p": 0.1}, key="u1", event_type="prediction",
                       event_id=f"pred:{eid}")

    def at(topic: str) -> dict[str, list]:
        out: dict[str, list] = {}
        for e in read_committed(client, topic, "expect"):
            if e.event_id:
                k = e.event_id.removeprefix("pred:")
            else:
                try:
                    k = json.loads(e.value)["event_id"]
                except ValueError:
                    continue
            out.setdefault(k, []).append(e.created_at)
        return out

    raw, clean, pred = at(topo.raw_topic), at(topo.clean_topic), at(topo.predictions_topic)
    report = latency.measure(client, topo)
    assert [s.impression_id for s in report.samples] == ["i1", "i3"]  # raw-time order, scored only
    for s in report.samples:
        assert s.raw == min(raw[s.impression_id])
        assert s.clean == clean[s.impression_id][0] and s.prediction == pred[s.impression_id][0]
    e2e = sorted((s.prediction - s.raw).total_seconds() for s in report.samples)
    assert report.stages[latency.END_TO_END] == latency.stats(e2e)
    assert all(report.stages[name].count == 2 for name, _a, _b in latency.STAGES)
    assert report.to_json()[latency.END_TO_END]["max"] == e2e[-1]
    # raw -> clean of every clean impression, scored or not
    assert latency.measure_clean(client, topo).count == 3


def test_each_slow_prediction_is_attributed_to_the_largest_part_of_its_time() -> None:
    from datetime import datetime, timedelta, timezone

    t0 = datetime(2026, 1, 1, tzinfo=timezone.utc)

    def at(seconds: float) -> datetime:
        return t0 + timedelta(seconds=seconds)

    # micro-batches: start (epoch s), then ms of the whole batch, planning, read and write, commit
    batches = [
        [at(0.0).timestamp(), 900.0, 50.0, 800.0, 50.0],  # a slow one: read and write
        [at(0.9).timestamp(), 300.0, 200.0, 60.0, 40.0],  # planning dominates
        [at(1.2).timestamp(), 100.0, 20.0, 60.0, 20.0],
    ]
    samples = [
        # waits 0.85 s for the batch at 0.9 (arrived while the slow one ran), then 0.1 s in it: waiting
        latency.ImpressionTimes("wait", at(0.05), at(1.0), at(1.05)),
        # arrives just before the slow batch starts, cleaned at its end: read and write
        latency.ImpressionTimes("read", at(-0.01), at(0.85), at(0.9)),
        # cleaned quickly by the batch at 1.2, scored 0.8 s later: scoring
        latency.ImpressionTimes("score", at(1.15), at(1.25), at(2.05)),
        # waits 0.25 s, then 0.29 s in the batch at 0.9, which spent its time planning; scoring 0.2 s
        latency.ImpressionTimes("plan", at(0.65), at(1.19), at(1.39)),
        # fast: not in the tail
        latency.ImpressionTimes("fast", at(1.19), at(1.25), at(1.3)),
        # no micro-batch logged around its clean time (the clean query's log missed it)
        latency.ImpressionTimes("unknown", at(5.0), at(5.9), at(5.95)),
    ]
    tail = latency.tail_causes(samples, batches)
    assert (tail["slow"], tail["of"]) == (5, 6)
    assert tail["causes"] == {"waiting for the previous micro-batch": 1, "micro-batch read and write": 1,
                              "scoring": 1, "clean pipeline (micro-batch unknown)": 1,
                              "micro-batch planning": 1}
    assert sum(tail["causes"].values()) == tail["slow"]
    assert tail["slowest_batches"][0]["ms"]["read and write"] == 800.0
    assert set(tail["mean_s"]) == {"wait", "batch", "scoring"}
    assert latency.tail_text(tail).startswith("5 of 6 over 0.7 s: waiting for the previous micro-batch 1")
    assert latency.tail_causes(samples[4:5], batches)["causes"] == {}
