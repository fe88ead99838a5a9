"""How much of a ``publish_many`` batch is routed before its COPY starts (``producer.Batch``)."""

from __future__ import annotations

from datetime import datetime, timezone

import pytest

from pgstreams import InvalidArgument, Message
from pgstreams.partitioner import partition_for_key
from pgstreams.producer import Batch, TopicState
from pgstreams.storage import TopicRecord


def _state(partitions: int) -> TopicState:
    return TopicState.of(TopicRecord(1, "t", partitions, 1_000_000, {}, datetime.now(timezone.utc)))


def test_keyed_events_are_routed_only_until_they_cover_every_partition() -> None:
    events = [Message(b"v", key=f"k{i}") for i in range(1000)]
    batch = Batch(_state(4), events)
    assert batch.partitions == []  # nothing routed before the registration asks
    assert batch.fence_partitions() == [0, 1, 2, 3]
    assert 4 <= len(batch.partitions) < 100  # a prefix: the rest is routed as the COPY takes the rows
    rows = list(batch)
    assert [r[0] for r in rows] == [partition_for_key(f"k{i}", 4) for i in range(1000)]
    assert batch.used_partitions() == [0, 1, 2, 3]


def test_the_registered_partitions_are_exactly_those_of_the_events_when_they_cover_fewer() -> None:
    keys = [k for k in (f"k{i}" for i in range(200)) if partition_for_key(k, 8) in (2, 5)]
    batch = Batch(_state(8), [Message(b"v", key=k) for k in keys])
    assert batch.fence_partitions() == [2, 5]
    assert len(batch.partitions) == len(keys)  # every event had to be routed to know that


def test_explicit_partitions_and_dicts_are_routed_and_checked_when_the_batch_is_made() -> None:
    with pytest.raises(InvalidArgument, match="event 1: partition 7 out of range"):
        Batch(_state(4), [Message(b"v", key="a"), Message(b"v", partition=7)])
    batch = Batch(_state(4), [{"value": 1, "key": "a"}, {"value": 2, "event_id": "x"}])
    assert len(batch.partitions) == 2 and batch.has_ids


def test_a_bad_key_beyond_the_routed_prefix_is_refused_when_the_copy_takes_it() -> None:
    events = [Message(b"v", key=f"k{i}") for i in range(500)]
    events[400] = Message(b"v", key="a\x00")
    batch = Batch(_state(2), events)
    assert batch.fence_partitions() == [0, 1]
    with pytest.raises(InvalidArgument, match=r"event 400: key .* NUL"):
        list(batch)


def test_keys_routed_once_are_remembered_per_topic_and_route_the_same() -> None:
    state = _state(3)
    keys = [f"k{i % 50}" for i in range(300)]
    first = [r[0] for r in Batch(state, [Message(b"v", key=k) for k in keys])]
    assert state.key_partitions == {k: partition_for_key(k, 3) for k in set(keys)}
    again = [r[0] for r in Batch(state, [Message(b"v", key=k) for k in keys])]
    assert first == again == [partition_for_key(k, 3) for k in keys]
    with pytest.raises(InvalidArgument, match=r"event 0: key .* NUL"):
        list(Batch(state, [Message(b"v", key="bad\x00")]))
    assert "bad\x00" not in state.key_partitions
