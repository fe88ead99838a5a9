"""The statements and rules the sync stores and the asyncio store share (``pgstreams.storage.calls`` and
the calls of ``events``, ``checkpoints`` and ``topics``), and the reader's poll and commit rules, without
a server: calls are values, procedures are driven by sending them results."""

from __future__ import annotations

from datetime import datetime, timezone
from typing import Any

import psycopg
import pytest

from pgstreams import CommitOutcome, InvalidArgument
from pgstreams.consumer.reader import check_limits, transaction_kept
from pgstreams.storage import StoredAt, TopicVersion
from pgstreams.storage.calls import ALL, ONE, RUN, Call, Steps
from pgstreams.storage.checkpoints import (
    ORIGIN,
    head_cursors,
    missing_checkpoints,
    outcomes_of,
    store_args,
    store_query,
)
from pgstreams.storage.events import (
    BINARY_QUERIES,
    POLL_CHECKED,
    copy_message,
    count_produced_call,
    existing_event_call,
    fences_call,
    insert_with_id_call,
    poll_steps,
    produced_call,
    session_busy_call,
    split_trailer,
    time_cursors_call,
    topic_version_call,
)
from pgstreams.storage.topics import analyze_segment_call, ensure_segments_call, last_position_call

ROW = (1, "j", "k", b"{}", None, None, "id-1", None, None, 77)


def _drive(steps: Steps[Any], answers: list[Any]) -> tuple[list[Call[Any]], Any]:
    seen: list[Call[Any]] = []
    result: Any = None
    while True:
        try:
            call = steps.send(result)
        except StopIteration as done:
            assert not answers, f"answers left over: {answers}"
            return seen, done.value
        seen.append(call)
        result = answers.pop(0)


def test_calls_name_their_query_and_read_their_rows() -> None:
    produced = produced_call(4, (0, 2), 10, 99)
    assert (produced.query, produced.topic_id, produced.fetch) == ("produced", 4, ONE)
    assert produced.read(None) is None and produced.read((2, 15)) == StoredAt(2, 15)
    assert count_produced_call(4, [0], 10, 99).read(None) == 0
    assert count_produced_call(4, [0], 10, 99).read((3,)) == 3
    assert session_busy_call(5).read(None) is False and session_busy_call(5).read((True,)) is True
    version = topic_version_call(4)
    assert version.read(None) is None
    assert version.read((3, '{"retention.ms": 5}', True)) == TopicVersion(3, {"retention.ms": 5}, True)
    assert last_position_call(4).read(None) == 0 and last_position_call(4).read((12,)) == 12
    assert ensure_segments_call(4, 900).read((None,)) == 0  # unknown: the caller keeps what it saw
    analyze = analyze_segment_call(4, 7)
    assert analyze.read(None) is True and analyze.read((False,)) is False


def test_a_publish_with_an_event_id_reads_where_it_was_stored_or_the_duplicate() -> None:
    insert = insert_with_id_call(4, ROW)
    assert insert.query == "insert_event_idempotent" and isinstance(insert.params, dict)
    assert insert.params["topic_id"] == 4 and insert.params["event_id"] == "id-1"
    assert insert.params["producer"] == 77
    assert insert.read((31,)) == StoredAt(1, 31)
    assert insert.read(None) is None  # the id was there: look it up
    existing = existing_event_call(4, ROW)
    assert existing.params == (4, "id-1")
    assert existing.read((0, 8)) == StoredAt(0, 8, duplicate=True)
    with pytest.raises(psycopg.errors.UndefinedTable):
        existing.read(None)


def test_fences_and_time_cursors_read_per_partition() -> None:
    fences = fences_call(4, [3, 1])
    assert fences.params == ([3, 1],) and fences.prepare is True
    assert fences.read(([10, 20],)) == {3: 10, 1: 20}
    times = time_cursors_call(4, {2: 50, 0: 9}, datetime(2024, 1, 1, tzinfo=timezone.utc))
    assert times.fetch == ALL and times.params == ([0, 2], [9, 50], datetime(2024, 1, 1, tzinfo=timezone.utc))
    assert times.read([(0, None), (2, 30)]) == {0: 8, 2: 29}  # none since: the fence's cursor
    assert head_cursors({0: 1, 3: 42}) == {0: 0, 3: 41}


def test_missing_checkpoints_are_created_at_the_earliest_position() -> None:
    steps, value = _drive(missing_checkpoints("g", 4, (0, 1, 2), "earliest"),
                          [{1: 30}, None, {0: ORIGIN, 1: 30, 2: ORIGIN}])
    assert [c.query for c in steps] == ["load_checkpoints", "init_checkpoints", "load_checkpoints"]
    assert steps[1].params == ("g", 4, [0, 2], [0, 0]) and steps[1].fetch == RUN
    assert value == {0: 0, 1: 30, 2: 0}


def test_missing_checkpoints_at_latest_read_the_fences_of_the_missing_partitions_only() -> None:
    steps, value = _drive(missing_checkpoints("g", 4, [0, 1], "latest"),
                          [{0: 5}, {1: 101}, None, {0: 5, 1: 100}])
    assert [c.query for c in steps] == ["load_checkpoints", "fences", "init_checkpoints", "load_checkpoints"]
    assert steps[1].params == ([1],)
    assert steps[2].params == ("g", 4, [1], [100])  # before the fence: what is committed now is skipped
    assert value == {0: 5, 1: 100}


def test_missing_checkpoints_at_a_time_start_before_the_first_event_since() -> None:
    at = datetime(2024, 5, 1, tzinfo=timezone.utc)
    steps, _ = _drive(missing_checkpoints("g", 4, [0, 1], at),
                      [{}, {0: 11, 1: 21}, {0: 4, 1: 20}, None, {0: 4, 1: 20}])
    assert [c.query for c in steps] == ["load_checkpoints", "fences", "time_cursors", "init_checkpoints",
                                        "load_checkpoints"]
    assert steps[2].params == ([0, 1], [11, 21], at)
    assert steps[3].params == ("g", 4, [0, 1], [4, 20])


def test_existing_checkpoints_are_kept_without_a_write() -> None:
    steps, value = _drive(missing_checkpoints("g", 4, [0, 1], "latest"), [{0: 1, 1: 2}])
    assert [c.query for c in steps] == ["load_checkpoints"] and value == {0: 1, 1: 2}


def test_a_commit_stores_in_partition_order_and_reads_each_outcome() -> None:
    assert store_args({2: 9, 0: 4}, {0: 1, 2: 3, 5: 7}) == ([0, 2], [4, 9], [1, 3])
    assert store_query(lazy=False) == "store_checkpoints"
    assert store_query(lazy=True) == "store_checkpoints_lazy"
    assert store_query(lazy=True, fenced=True) == "store_checkpoints_fenced_lazy"
    assert outcomes_of([(0, CommitOutcome.STORED.value), (2, CommitOutcome.FURTHER.value)]) == {
        0: CommitOutcome.STORED, 2: CommitOutcome.FURTHER}


def test_a_poll_sends_the_plan_setting_the_fences_and_the_read_in_one_round_trip() -> None:
    params = {"partitions": [1, 0], "positions": [5, 0], "limit": 100, "total": 101}
    steps = poll_steps("pgstreams", 4, params, POLL_CHECKED)
    assert len(steps) == 3
    assert [fmt for _, _, fmt in steps] == [0, 0, 1]  # event rows in binary form
    assert "poll_checked" in BINARY_QUERIES
    texts = [args for _, args, _ in steps]
    assert b"{1,0}" in texts[2] and b"{5,0}" in texts[2] and b"100" in texts[2]
    rows: list[tuple[Any, ...]] = [(1, 6), (0, 1), (None, 4, False)]
    assert split_trailer(rows) == ([(1, 6), (0, 1)], False, 4)
    assert split_trailer([(None, None, True)]) == ([], True, 0)


def test_publish_many_registers_its_partitions_and_copies_in_one_message() -> None:
    message = copy_message("pgstreams", 4, [0, 3])
    fence, _, copy = message.partition(b"; ")
    assert b"'{0,3}'" in fence and b"$1" not in fence
    assert copy.lstrip().upper().startswith(b"COPY") and b"STDIN" in copy.upper()


def test_a_transaction_keeps_the_handlers_writes_only_when_its_checkpoint_is_its_own() -> None:
    assert transaction_kept(None, {}, keep_ignored=False)  # nothing stored
    assert transaction_kept(CommitOutcome.STORED, {0: 5}, keep_ignored=False)
    assert not transaction_kept(CommitOutcome.IGNORED, {0: 5}, keep_ignored=False)  # another member's
    assert transaction_kept(CommitOutcome.IGNORED, {0: 5}, keep_ignored=True)
    assert transaction_kept(CommitOutcome.IGNORED, {}, keep_ignored=False)  # nothing polled
    assert not transaction_kept(CommitOutcome.FURTHER, {0: 5}, keep_ignored=True)


def test_poll_limits_are_checked_with_the_bad_one_named() -> None:
    assert check_limits(10, 0) == (10, 0.0)
    for bad in (0, True, 1.5, "3"):
        with pytest.raises(InvalidArgument, match="max_events"):
            check_limits(bad, 1.0)
    for bad_timeout in (-1, float("nan"), False, "1"):
        with pytest.raises(InvalidArgument, match="timeout"):
            check_limits(10, bad_timeout)
