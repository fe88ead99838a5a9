"""Compaction against a model (Hypothesis): after any interleaving of publishes (keys, values, tombstones),
compaction passes and clock advances, a consumer reading from the start sees per key its last value (or
nothing once its tombstone expired), every event it sees at its original position, in order, and nothing
that compaction was not allowed to remove (younger than ``min.compaction.lag.ms``, the latest event of its
key, a tombstone younger than ``delete.retention.ms``). Once the clock is far ahead, a pass leaves in the
sealed segments exactly the latest event of each key (tombstones gone). Bounded (few examples)."""

from __future__ import annotations

import itertools
from dataclasses import dataclass
from datetime import datetime, timedelta, timezone
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import pgstreams
from pgstreams.maintenance import Maintenance

SEG = 1000
LAG = timedelta(seconds=60)  # min.compaction.lag.ms
TOMBSTONE_KEPT = timedelta(seconds=90)  # delete.retention.ms
KEYS = 12
_counter = itertools.count()


@dataclass(frozen=True)
class Published:
    """An event as the model knows it."""

    partition: int
    position: int
    key: str
    value: int | None
    created_at: datetime


# a quarter of the values are tombstones
_value = st.one_of(st.integers(0, 99), st.integers(0, 99), st.integers(0, 99), st.none())
_events = st.lists(st.tuples(st.integers(0, KEYS - 1), _value), min_size=1, max_size=700)
_steps = st.lists(st.one_of(st.tuples(st.just("publish"), _events), st.tuples(st.just("compact")),
                            st.tuples(st.just("advance"), st.integers(1, 3))), min_size=1, max_size=8)


def _publish(client: pgstreams.Client, topic: str, batch: list[tuple[int, int | None]],
             model: dict[int, Published]) -> None:
    client.publish_many(topic, [{"key": f"k{k}", "value": v} for k, v in batch])
    tid = client.topic_record(topic).id
    known = max(model, default=0)
    with client.connection() as conn:
        rows = conn.execute(f"SELECT partition, position, key, created_at FROM pgstreams.topic_{tid}"
                            " WHERE position > %s ORDER BY position", (known,)).fetchall()
    assert len(rows) == len(batch)
    for (p, pos, key, at), (_, v) in zip(rows, batch, strict=True):
        model[pos] = Published(p, pos, key, v, at)


def _removable(model: dict[int, Published], now: datetime) -> set[int]:
    """The positions a pass at ``now`` may remove: older than the lag and superseded by a newer event of
    their key, or a key's last event, a tombstone older than delete.retention.ms."""
    latest: dict[str, int] = {}
    for pos in sorted(model):
        latest[model[pos].key] = pos
    out = set()
    for pos, e in model.items():
        if e.created_at >= now - LAG:
            continue
        if latest[e.key] != pos or (e.value is None and e.created_at < now - TOMBSTONE_KEPT):
            out.add(pos)
    return out


def _read_all(client: pgstreams.Client, topic: str) -> list[pgstreams.Event]:
    consumer = client.consumer(topic, f"check{next(_counter)}")
    seen: list[pgstreams.Event] = []
    while batch := consumer.poll(max_events=5000, timeout=0):
        seen += batch
        consumer.commit()
    return seen


def _check(client: pgstreams.Client, topic: str, model: dict[int, Published], allowed: set[int]) -> set[int]:
    seen = _read_all(client, topic)
    per_partition: dict[int, list[int]] = {}
    for ev in seen:
        per_partition.setdefault(ev.partition, []).append(ev.position)
        e = model[ev.position]  # at its original position, with its key and value
        assert (ev.partition, ev.key, ev.value) == (e.partition, e.key, e.value)
    for positions in per_partition.values():
        assert positions == sorted(set(positions))  # in order, each once
    present = {ev.position for ev in seen}
    gone = set(model) - present
    assert gone <= allowed, sorted(gone - allowed)[:10]
    by_key: dict[str, list[int]] = {}
    for pos in sorted(model):
        by_key.setdefault(model[pos].key, []).append(pos)
    for positions in by_key.values():
        last = positions[-1]
        if last not in present:  # only an expired tombstone goes, and then nothing older of its key stays
            assert model[last].value is None
            assert not present & set(positions)
    return present


@settings(max_examples=10, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture,
                                                                  HealthCheck.data_too_large])
@given(steps=_steps, partitions=st.integers(1, 2), ratio=st.sampled_from([0.0, 0.5]))
def test_compaction_matches_the_model(client: pgstreams.Client, steps: list[Any], partitions: int,
                                      ratio: float) -> None:
    topic = f"c{next(_counter)}"
    client.create_topic(topic, partitions, segment_size=SEG, config={
        "cleanup.policy": "compact", "min.compaction.lag.ms": int(LAG.total_seconds() * 1000),
        "delete.retention.ms": int(TOMBSTONE_KEPT.total_seconds() * 1000),
        "min.cleanable.dirty.ratio": ratio})
    model: dict[int, Published] = {}
    allowed: set[int] = set()
    offset = timedelta(0)

    def compact(at: timedelta) -> None:
        now = datetime.now(timezone.utc) + at
        allowed.update(_removable(model, now))
        Maintenance(client, wall_clock=lambda: now).run(compaction_budget=None)

    for step in steps:
        if step[0] == "publish":
            _publish(client, topic, step[1], model)
        elif step[0] == "advance":
            offset += timedelta(seconds=30 * step[1])
        else:
            compact(offset)
            _check(client, topic, model, allowed)
    # far ahead: everything is older than the lag and every tombstone expired
    compact(offset + timedelta(days=10))
    present = _check(client, topic, model, allowed)
    if ratio == 0.0:
        tid = client.topic_record(topic).id
        with client.connection() as conn:
            sealed_end = conn.execute("SELECT coalesce(max(hi), 0) FROM pgstreams.segments"
                                      " WHERE topic_id = %s AND sealed_at IS NOT NULL", (tid,)).fetchone()[0]
        latest: dict[str, int] = {}
        for pos in sorted(p for p in model if p < sealed_end):
            latest[model[pos].key] = pos
        expected = {pos for pos in latest.values() if model[pos].value is not None}
        assert {p for p in present if p < sealed_end} == expected
        assert {p for p in model if p >= sealed_end} <= present  # the head is never touched
