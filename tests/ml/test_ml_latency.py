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
