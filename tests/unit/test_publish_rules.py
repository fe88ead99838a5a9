"""The rules of idempotent publishing that the sync producer and the asyncio client share
(``pgstreams.producer.idempotence``, ``TopicState``'s bookkeeping, ``Segments``' decisions), without a
server: each procedure is driven by sending it the results a database would return."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from datetime import datetime, timezone
from typing import Any

import pytest

from pgstreams import ConnectionLost
from pgstreams.producer import TopicState
from pgstreams.producer.idempotence import (
    NUMBER_MASK,
    REPUBLISH,
    UNIDENTIFIED,
    Pause,
    Procedure,
    ProducerTags,
    Step,
    Unknown,
    Unsettled,
    copy_again,
    publish_again,
)
from pgstreams.storage import Segments, StoredAt, TopicRecord
from pgstreams.storage.calls import Call


def _drive(steps: Procedure[Any], answers: list[Any]) -> tuple[list[Step], Any]:
    """Run ``steps``, sending ``answers`` in order (one per step); the steps it yielded and its value."""
    seen: list[Step] = []
    result: Any = None
    while True:
        try:
            step = steps.send(result)
        except StopIteration as done:
            assert not answers, f"answers left over: {answers}"
            return seen, done.value
        seen.append(step)
        result = answers.pop(0)


def _waits(pauses: list[float]) -> Any:
    def waits(pid: int) -> Iterator[float]:
        assert pid == 42
        yield from pauses
        raise ConnectionLost("the session 42 of the interrupted publish is still running")

    return waits


def _queries(steps: list[Step]) -> list[str]:
    return [s.query if isinstance(s, Call) else repr(s) for s in steps]


def test_tags_draw_the_producer_id_once_at_the_first_tag_and_number_the_publishes() -> None:
    draws: list[int] = []

    def draw() -> int:
        draws.append(1)
        return (1 << 31) | 5  # the id's bits above 31 are dropped: tags stay positive bigints

    tags = ProducerTags(draw)
    assert not tags.drawn and draws == []  # a client that never publishes draws none
    first, second = tags.next_tag(), tags.next_tag()
    assert tags.drawn and draws == [1]
    assert first == (5 << 32) | 1 and second == (5 << 32) | 2
    assert tags.draw() == 5 and tags.base == 5 << 32 and draws == [1]
    assert second & NUMBER_MASK == 2


def test_tags_drawn_by_racing_threads_draw_once_and_never_repeat_a_number() -> None:
    draws: list[int] = []
    start = threading.Barrier(8)

    def draw() -> int:
        draws.append(1)
        return 9

    tags = ProducerTags(draw)
    got: list[int] = []

    def publisher() -> None:
        start.wait()
        got.extend(tags.next_tag() for _ in range(500))

    threads = [threading.Thread(target=publisher) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert draws == [1]
    assert len(set(got)) == 4000 and {t >> 32 for t in got} == {9}


def test_a_lost_publish_found_by_its_tag_is_returned_not_stored_again() -> None:
    unknown = Unknown(topic_id=7, partitions=(2,), floor=100, pid=None, tag=(3 << 32) | 9)
    steps, value = _drive(publish_again(unknown, _waits([])), [StoredAt(2, 105)])
    assert _queries(steps) == ["produced"]
    lookup = steps[0]
    assert isinstance(lookup, Call) and lookup.topic_id == 7
    assert lookup.params == {"partitions": [2], "floor": 100, "producer": (3 << 32) | 9}
    assert value == StoredAt(2, 105)


def test_a_lost_publish_waits_for_its_session_to_end_before_looking_and_is_stored_when_absent() -> None:
    unknown = Unknown(topic_id=7, partitions=(0,), floor=10, pid=42, tag=77)
    again = StoredAt(0, 12)
    steps, value = _drive(publish_again(unknown, _waits([0.01, 0.02])),
                          [True, None, True, None, False, None, 43, again])
    assert _queries(steps) == ["session_busy", "Pause(seconds=0.01)", "session_busy", "Pause(seconds=0.02)",
                               "session_busy", "produced", "SESSION", "REPUBLISH"]
    assert steps[1] == Pause(0.01) and steps[-1] is REPUBLISH
    assert value == again


def test_a_publish_without_tag_is_stored_again_once_its_session_ended() -> None:
    """``connect(idempotent=False)``: nothing to look for, so at least once."""
    unknown = Unknown(topic_id=7, partitions=(0,), floor=10, pid=42, tag=None)
    steps, value = _drive(publish_again(unknown, _waits([])), [False, 43, StoredAt(0, 11)])
    assert _queries(steps) == ["session_busy", "SESSION", "REPUBLISH"]
    assert value == StoredAt(0, 11)


def test_a_session_that_outlives_the_retry_window_raises_connection_lost() -> None:
    unknown = Unknown(topic_id=7, partitions=(0,), floor=10, pid=42, tag=77)
    steps = publish_again(unknown, _waits([0.01]))
    assert steps.send(None).query == "session_busy"  # type: ignore[union-attr]
    assert steps.send(True) == Pause(0.01)
    assert steps.send(None).query == "session_busy"  # type: ignore[union-attr]
    with pytest.raises(ConnectionLost, match="still running"):
        steps.send(True)


def test_a_lost_batch_is_stored_once_all_or_none() -> None:
    unknown = Unknown(topic_id=3, partitions=[0, 1, 2], floor=50, pid=None, tag=5)
    # found, without event ids: the whole batch committed
    steps, value = _drive(copy_again(unknown, 1000, False, _waits([])), [StoredAt(1, 51)])
    assert _queries(steps) == ["produced"] and value == 1000
    # found, with event ids (some may have been duplicates): count what carries the tag
    steps, value = _drive(copy_again(unknown, 1000, True, _waits([])), [StoredAt(1, 51), 998])
    assert _queries(steps) == ["produced", "count_produced"] and value == 998
    assert isinstance(steps[1], Call) and steps[1].params == {"partitions": [0, 1, 2], "floor": 50,
                                                              "producer": 5}
    # absent: copy again
    steps, value = _drive(copy_again(unknown, 1000, True, _waits([])), [None, 42, 1000])
    assert _queries(steps) == ["produced", "SESSION", "REPUBLISH"] and value == 1000


def test_a_retry_waits_for_every_lost_attempt_before_it_looks_for_the_events() -> None:
    """The first attempt was lost on session 41, the attempt that stored the event again on 42 was lost
    too: the third waits until both ended, then finds what the second stored, and stores nothing."""
    unknown = Unknown(topic_id=7, partitions=(0,), floor=10, pid=41, tag=77)
    _, lost = _drive_until_republish(publish_again(unknown, _any_waits()), [False, None, 42])
    assert lost is REPUBLISH and unknown.sessions() == [41, 42]
    steps, value = _drive(publish_again(unknown, _any_waits()), [False, True, None, False, StoredAt(0, 11)])
    assert _queries(steps) == ["session_busy", "session_busy", "Pause(seconds=0.01)", "session_busy",
                               "produced"]
    assert [s.params for s in steps if isinstance(s, Call) and s.query == "session_busy"] == [
        (41,), (42,), (42,)]
    assert value == StoredAt(0, 11)


def test_a_lost_publish_on_a_session_of_unknown_identity_is_never_stored_again() -> None:
    """Behind a connection pooler the id given at login names no server process: a session pgstreams did
    not identify itself cannot be known to have ended, so its publish is not repeated."""
    unknown = Unknown(topic_id=7, partitions=(0,), floor=10, pid=UNIDENTIFIED, tag=77)
    with pytest.raises(Unsettled, match="server session it ran on is not known"):
        _drive(publish_again(unknown, _any_waits()), [])
    assert issubclass(Unsettled, ConnectionLost)


def _any_waits() -> Any:
    def waits(pid: int) -> Iterator[float]:
        yield 0.01
        raise ConnectionLost("still running")

    return waits


def _drive_until_republish(steps: Procedure[Any], answers: list[Any]) -> tuple[list[Step], Step]:
    """Run ``steps`` with ``answers`` up to the step that stores the events again (that attempt is then
    lost: the procedure is dropped)."""
    seen: list[Step] = []
    result: Any = None
    while True:
        step = steps.send(result)
        if step is REPUBLISH:
            assert not answers
            return seen, step
        seen.append(step)
        result = answers.pop(0)


def _state(segment_size: int = 1600, last_position: int = 0) -> TopicState:
    record = TopicRecord(1, "t", 4, segment_size, {}, datetime.now(timezone.utc), segments_end=3200,
                         last_position=last_position)
    return TopicState.of(record)


def test_publish_many_reads_the_last_position_once_every_sixteenth_segment_of_events() -> None:
    state = _state(segment_size=1600)  # reads again after 100 events
    assert state.copy_reads_last(60)
    assert not state.copy_reads_last(30)
    assert not state.copy_reads_last(10)  # 100 copied since the read
    assert state.copy_reads_last(1)


def test_publish_many_keeps_a_lower_bound_of_its_last_position_and_what_it_knows_was_handed_out() -> None:
    state = _state(last_position=40)
    assert state.copied(10, -1) == -1  # nothing known yet
    assert state.copied(10, 500) == 510 and state.known == 500
    assert state.copied(5, -1) == 515 and state.known == 500
    assert state.copied(5, 300) == 305 and state.known == 500  # known never moves back


def test_segments_are_added_ahead_and_statistics_checked_once_per_segment() -> None:
    seg = Segments(1, 1000, covered=3000)
    assert seg.room_until(1500) == 0  # an empty segment lies beyond already
    assert seg.room_until(2000) == 3000 and seg.room_until(2500) == 3500
    seg.room_made(0)  # unknown: kept
    assert seg.covered == 3000
    seg.room_made(4000)
    assert seg.covered == 4000 and seg.room_until(2500) == 0
    assert seg.stats_due(0)
    seg.stats_checked(10, done=False)  # too few rows yet: again some positions later
    assert seg.stats_from == 510 and not seg.stats_due(509) and seg.stats_due(510)
    seg.stats_checked(600, done=True)  # done for this segment: from the next one's start
    assert seg.stats_from == 1000
