"""The events a poll returns behave as ``Event(...)`` built by hand: equal, the same repr, immutable,
picklable and copyable, values of every kind decoded (on first read) to what was published; and the
stored form of a value never leaks out."""

from __future__ import annotations

import copy
import dataclasses
import pickle
import threading
import weakref
from datetime import datetime, timezone

import pytest

import pgstreams
from pgstreams import Event

VALUES = [{"a": [1, 2.5, None], "b": "é"}, "text ✓", b"\x00\xffbytes", [1, 2, 3], 42, None, ""]


def _published(client: pgstreams.Client, topic: str) -> list[Event]:
    client.create_topic(topic, partitions=1)
    client.publish_many(topic, [
        pgstreams.Message(value=v, key=str(i), headers={"h": str(i)} if i % 2 else None)
        for i, v in enumerate(VALUES)])
    got = client.consumer(topic, "g").poll(100, timeout=5)
    assert len(got) == len(VALUES)
    return got


def _by_hand(ev: Event) -> Event:
    return Event(ev.topic, ev.partition, ev.position, ev.key, VALUES[int(ev.key or 0)], dict(ev.headers),
                 ev.event_type, ev.event_id, ev.correlation_id, ev.causation_id, ev.created_at, ev.txid,
                 ev.delivery_count, ev.shard)


def test_polled_events_equal_events_built_by_hand_with_the_published_values(client: pgstreams.Client) -> None:
    for ev in _published(client, "objs"):
        assert type(ev) is Event
        twin = _by_hand(ev)
        assert ev.value == VALUES[int(ev.key or 0)]
        assert type(ev.value) is type(VALUES[int(ev.key or 0)])
        assert ev == twin and twin == ev and repr(ev) == repr(twin)
        assert dataclasses.asdict(ev) == dataclasses.asdict(twin)
        assert dataclasses.replace(ev, key="other").value == ev.value
        assert ev.headers == ({"h": ev.key} if int(ev.key or 0) % 2 else {})


def test_an_events_value_is_decoded_once_and_its_stored_form_never_shows(client: pgstreams.Client) -> None:
    events = _published(client, "lazy")
    # a fresh event's repr, equality and pickle decode the value; reading it twice gives the same object
    first = events[0]
    assert "_ENCODED" not in repr(first) and "object at" not in repr(first)
    assert first.value is first.value
    for ev in events:
        for clone in (pickle.loads(pickle.dumps(ev)), copy.copy(ev), copy.deepcopy(ev)):
            assert clone == _by_hand(ev) and type(clone) is Event
    assert [f.name for f in dataclasses.fields(Event)] == [
        "topic", "partition", "position", "key", "value", "headers", "event_type", "event_id",
        "correlation_id", "causation_id", "created_at", "txid", "delivery_count", "shard"]


def test_events_of_a_poll_decoded_by_many_threads_at_once_agree(client: pgstreams.Client) -> None:
    client.create_topic("threads", partitions=1)
    client.publish_many("threads", [pgstreams.Message(value={"n": i, "pad": "x" * 200}) for i in range(2000)])
    events = client.consumer("threads", "g").poll(2000, timeout=5)
    assert len(events) == 2000
    seen: list[list[object]] = []
    start = threading.Barrier(4)

    def read() -> None:
        start.wait()
        seen.append([ev.value["n"] for ev in events])

    threads = [threading.Thread(target=read) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    assert len(seen) == 4 and all(s == list(range(2000)) for s in seen)


def test_events_are_immutable_and_take_no_new_attributes(client: pgstreams.Client) -> None:
    ev = _published(client, "frozen")[0]
    with pytest.raises(dataclasses.FrozenInstanceError):
        ev.value = "changed"  # type: ignore[misc]
    with pytest.raises(dataclasses.FrozenInstanceError):
        ev.position = 0  # type: ignore[misc]
    with pytest.raises((dataclasses.FrozenInstanceError, AttributeError, TypeError)):
        ev.extra = 1  # type: ignore[attr-defined]
    with pytest.raises(dataclasses.FrozenInstanceError):
        del ev.key  # type: ignore[misc]
    assert ev.value == VALUES[0]
    assert weakref.ref(ev)() is ev


def test_events_built_by_hand_keep_any_value_as_given() -> None:
    at = datetime(2026, 1, 1, tzinfo=timezone.utc)
    marker = ("j", b"{}")  # a tuple that looks like a stored form is still just a value
    ev = Event("t", 0, 1, None, marker, {}, None, None, None, None, at)
    assert ev.value is marker
    assert pickle.loads(pickle.dumps(ev)).value == marker
    assert Event("t", 0, 1, None, b"x", {}, None, None, None, None, at) != ev


def test_events_without_headers_each_have_an_empty_dict_of_their_own(client: pgstreams.Client) -> None:
    events = [ev for ev in _published(client, "noheaders") if int(ev.key or 0) % 2 == 0]
    assert len(events) >= 2
    first, second = events[0], events[1]
    assert first.headers == {} and type(first.headers) is dict and first.headers is first.headers
    assert first.headers is not second.headers
    # what a caller does to one event's dict stays with that event, as with events built by hand
    first.headers["mine"] = "1"  # type: ignore[index]
    assert second.headers == {} and first.headers == {"mine": "1"}
    for ev in events[1:]:
        clone = pickle.loads(pickle.dumps(ev))
        assert clone.headers == {} and clone == _by_hand(ev)
    # an event built by hand keeps the mapping it was given, even an empty one
    given: dict[str, str] = {}
    at = datetime(2026, 1, 1, tzinfo=timezone.utc)
    assert Event("t", 0, 1, None, b"x", given, None, None, None, None, at).headers is given
