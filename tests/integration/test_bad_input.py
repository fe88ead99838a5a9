"""Bad input of every public entry point: the right error, a message naming the problem, nothing changed.

Each test loops over its cases on one database (a database per case would cost more than the checks).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from datetime import datetime
from typing import Any

import psycopg
import pytest
from psycopg.conninfo import make_conninfo

import pgstreams
from _core_helpers import db_state
from pgstreams import (
    ConfigurationError,
    GroupNotFound,
    InvalidArgument,
    InvalidName,
    Message,
    MigrationError,
    TopicConflict,
    TopicNotFound,
)


@pytest.fixture
def ready(client: pgstreams.Client) -> Iterator[pgstreams.Client]:
    """A client with topic ``t`` (2 partitions, 3 events), topic ``u``, and group ``g`` on ``t``."""
    client.create_topic("t", 2)
    client.create_topic("u", 1)
    for i in range(3):
        client.publish("t", i, key=str(i))
    c = client.consumer("t", "g")
    c.commit(c.poll(max_events=1, timeout=5))
    yield client


def _unchanged(dsn: str, call: Callable[[], Any], exc: type[BaseException] | tuple[type[BaseException], ...],
               match: str, what: object = None) -> BaseException:
    """Run ``call``; it must raise ``exc`` with a message matching ``match`` and change nothing."""
    before = db_state(dsn)
    with pytest.raises(exc, match=match) as info:
        call()
    assert db_state(dsn) == before, f"{what or call} changed the database"
    return info.value


# -- connect ---------------------------------------------------------------------------------------------


def test_connect_bad_input(empty_dsn: str, server_dsn: str) -> None:
    before = db_state(empty_dsn)
    for dsn, match in [
        ("postgresql://postgres@127.0.0.1:1/postgres", "cannot connect"),
        ("this is not a dsn", "cannot connect"),
        ("host=/nonexistent/socket/dir dbname=x", "cannot connect"),
        (make_conninfo(empty_dsn, dbname="no_such_database_here"), "no_such_database_here"),
        (make_conninfo(empty_dsn, user="no_such_role_here"), "no_such_role_here"),
    ]:
        with pytest.raises(ConfigurationError, match=match):
            pgstreams.connect(dsn)
    with pytest.raises(InvalidArgument, match="dsn must be a string"):
        pgstreams.connect(5432)  # type: ignore[arg-type]
    with pytest.raises(InvalidArgument, match="dsn must not be empty"):
        pgstreams.connect("")
    for schema in ["", "1abc", "a-b", "a b", 'a"b', "x" * 64, "public;drop", None, 3]:
        with pytest.raises(InvalidName, match="schema"):
            pgstreams.connect(empty_dsn, schema=schema)  # type: ignore[arg-type]
    for kwargs, match in [
        ({"pool_size": 0}, "pool_size"), ({"pool_size": -3}, "pool_size"), ({"pool_size": "4"}, "pool_size"),
        ({"pool_size": True}, "pool_size"), ({"pool_size": 2.5}, "pool_size"),
        ({"poll_interval": 0}, "poll_interval"), ({"poll_interval": -1}, "poll_interval"),
        ({"poll_interval": float("nan")}, "poll_interval"), ({"poll_interval": "1"}, "poll_interval"),
        ({"migrate": "no"}, "migrate"), ({"migrate": 0}, "migrate"), ({"migrate": None}, "migrate"),
        ({"pooler": "bogus"}, "pooler must be one of 'session', 'transaction' or None.*'bogus'"),
        ({"pooler": ""}, "pooler must be one of"), ({"pooler": 1}, "pooler must be one of"),
        ({"pooler": True}, "pooler must be one of"),
        ({"listen_dsn": "host=x bogus=1"}, "listen_dsn is not a valid DSN"),
        ({"listen_dsn": 5}, "listen_dsn must be a DSN string or None, not int"),
        ({"listen_dsn": ""}, "listen_dsn must not be empty"),
    ]:
        with pytest.raises(InvalidArgument, match=match):
            pgstreams.connect(empty_dsn, **kwargs)
    with pytest.raises(InvalidArgument, match="listen_dsn names one server, but 2 DSNs"):
        pgstreams.connect([empty_dsn, server_dsn], listen_dsn=empty_dsn)
    with pytest.raises(MigrationError, match="migrat"):
        pgstreams.connect(empty_dsn, migrate=False)
    assert db_state(empty_dsn) == before


def test_client_constructor_bad_input(empty_dsn: str) -> None:
    before = db_state(empty_dsn)
    for args, kwargs, match in [
        ((5,), {}, "dsn"), (("",), {}, "dsn"), ((None,), {}, "dsn"),
        ((empty_dsn,), {"schema": "a b"}, "schema"),
        ((empty_dsn,), {"migrate": "no"}, "migrate"), ((empty_dsn,), {"pool_size": 0}, "pool_size"),
        ((empty_dsn,), {"poll_interval": -1}, "poll_interval"),
        ((empty_dsn,), {"pooler": "statement"}, "pooler must be one of 'session', 'transaction'"),
    ]:
        with pytest.raises((InvalidArgument, InvalidName), match=match):
            pgstreams.Client(*args, **kwargs)
    assert db_state(empty_dsn) == before  # nothing migrated


# -- topics ----------------------------------------------------------------------------------------------


def test_create_topic_bad_input(ready: pgstreams.Client, dsn: str) -> None:
    for name in ["", "x" * 250, "a/b", "a b", " ", ".", "..", "tópico", "a\x00b", "a;b", "a'b", 'a"b',
                 None, 7, b"bytes", ["t"]]:
        _unchanged(dsn, lambda name=name: ready.create_topic(name), InvalidName, "topic name", name)
    for partitions in [0, -1, 1025, "3", True, False, 2.0, None]:
        _unchanged(dsn, lambda p=partitions: ready.create_topic("new", p), InvalidArgument, "partitions",
                   partitions)
    for size in [0, 999, "1000", True, 1000.0]:
        _unchanged(dsn, lambda s=size: ready.create_topic("new", 1, segment_size=s), InvalidArgument,
                   "segment_size", size)
    err = _unchanged(dsn, lambda: ready.create_topic("t", 3), TopicConflict, "'t' exists with 2 partitions")
    assert isinstance(err, ValueError)


def test_invalid_names_are_refused_before_any_sql_is_sent(dsn: str) -> None:
    client = pgstreams.connect(dsn)
    client.close()  # from here on, any SQL would fail with PoolClosed instead of InvalidName
    for call in (lambda: client.create_topic("a b"), lambda: client.describe_topic("a/b"),
                 lambda: client.delete_topic(""), lambda: client.publish("x" * 250, 1),
                 lambda: client.publish_many("..", [{"value": 1}]), lambda: client.consumer("a b", "g"),
                 lambda: client.consumer("t", "a b"), lambda: client.describe_group("a b"),
                 lambda: client.describe_group("g", topic="a/b")):
        with pytest.raises(InvalidName, match="name"):
            call()


def test_topic_name_limits_are_accepted(client: pgstreams.Client) -> None:
    for name in ["x" * 249, "a", "A.b_c-9", "..."]:
        assert client.create_topic(name).name == name
    assert client.create_topic("p", pgstreams.MAX_PARTITIONS).partitions == 1024


def test_unknown_topics(ready: pgstreams.Client, dsn: str) -> None:
    for call in (lambda: ready.publish("nope", 1), lambda: ready.publish_many("nope", [{"value": 1}]),
                 lambda: ready.consumer("nope", "g"), lambda: ready.describe_topic("nope"),
                 lambda: ready.delete_topic("nope")):
        err = _unchanged(dsn, call, TopicNotFound, "'nope'")
        assert isinstance(err, LookupError)
    for call in (lambda: ready.describe_topic("a b"), lambda: ready.delete_topic(".."),
                 lambda: ready.publish("a/b", 1), lambda: ready.publish_many("", []),
                 lambda: ready.consumer("x" * 250, "g")):
        _unchanged(dsn, call, InvalidName, "topic name")


# -- publish ---------------------------------------------------------------------------------------------

PUBLISH_CASES: list[tuple[dict[str, Any], str]] = [
    ({"key": 5}, "key"), ({"key": b"k"}, "key"),
    ({"headers": {"a": 1}}, "headers"), ({"headers": {1: "a"}}, "headers"), ({"headers": "a=b"}, "headers"),
    ({"headers": [("a", "b")]}, "headers"),
    ({"partition": 2}, r"partition 2 out of range.*0 to 1"), ({"partition": -1}, "partition -1"),
    ({"partition": "0"}, "partition"), ({"partition": True}, "partition"),
    ({"value": object()}, "JSON"), ({"value": float("nan")}, "JSON"),
    ({"value": {"x": float("inf")}}, "JSON"),
    ({"value": {1, 2}}, "JSON"), ({"value": {"k": b"bytes inside"}}, "JSON"),
    ({"event_type": 3}, "event_type"), ({"event_type": ""}, "event_type"), ({"event_id": 12}, "event_id"),
    ({"event_id": ""}, "event_id"), ({"correlation_id": 1.5}, "correlation_id"),
    ({"causation_id": ["x"]}, "causation_id"),
    ({"key": "a\x00b"}, "key .* NUL"), ({"key": "\ud800"}, "key .* Unicode"),
    ({"headers": {"a": "b\x00"}}, "header 'a'.* NUL"), ({"headers": {"\x00": "b"}}, "header .* NUL"),
    ({"event_type": "t\x00"}, "event_type .* NUL"), ({"event_id": "\udfff"}, "event_id .* Unicode"),
    ({"correlation_id": "\x00"}, "correlation_id .* NUL"), ({"value": "\ud800"}, "value .* Unicode"),
    ({"value": {"k": ["\udc00"]}}, "value .* Unicode"),
]


def test_publish_bad_input(ready: pgstreams.Client, dsn: str) -> None:
    for kwargs, match in [*PUBLISH_CASES, ({"conn": "dbname=x"}, "conn")]:
        args = {"value": {"ok": True}, **kwargs}
        value = args.pop("value")
        _unchanged(dsn, lambda v=value, a=args: ready.publish("t", v, **a), InvalidArgument, match, kwargs)


def test_publish_bad_input_leaves_the_callers_transaction_usable(ready: pgstreams.Client, dsn: str) -> None:
    before = db_state(dsn)
    with psycopg.connect(dsn) as conn:
        for kwargs, match in PUBLISH_CASES:
            args = {"value": 1, **kwargs}
            value = args.pop("value")
            with pytest.raises(InvalidArgument, match=match):
                ready.publish("t", value, conn=conn, **args)
        with pytest.raises(TopicNotFound):
            ready.publish("nope", 1, conn=conn)
        ready.publish("t", "fine", conn=conn)  # the transaction is still usable
        conn.rollback()
    after = db_state(dsn)
    seqs = {k for k in after if k.endswith("_seq")}  # the rolled-back publish used a position
    assert ({k: v for k, v in after.items() if k not in seqs}
            == {k: v for k, v in before.items() if k not in seqs})


# -- publish_many ----------------------------------------------------------------------------------------

BATCH_CASES: list[tuple[list[Any], str]] = [
    ([{"value": 1}, 5], r"event 1: expected a Message or a dict, not int"),
    ([{"value": 1}, "text"], r"event 1: expected a Message or a dict, not str"),
    ([{"value": 1}, None], r"event 1: expected a Message or a dict"),
    ([{"value": 1}, [("value", 1)]], r"event 1: expected a Message or a dict, not list"),
    ([{"value": 1}, {"value": 2, "colour": "red"}], r"event 1: unknown field\(s\) \['colour'\]"),
    ([{"value": 1}, {"key": "k"}], r"event 1: missing 'value'"),
    ([{"value": 1}, {"value": 2}, {"value": float("nan")}], r"event 2: .*JSON"),
    ([{"value": 1}, {"value": 2, "partition": 9}], r"event 1: partition 9 out of range"),
    ([Message(1), Message(2, key=3)], r"event 1: key"),  # type: ignore[arg-type]
    ([Message(1), Message(2, headers={"a": 2})], r"event 1: headers"),  # type: ignore[dict-item]
    ([{"value": 1, "event_id": 5}], r"event 0: event_id"),
    ([{"value": 1}, {"value": 2, "key": "a\x00"}], r"event 1: key .* NUL"),
    ([{"value": 1}, {"value": 2, "headers": {"h": "\x00"}}], r"event 1: header 'h'"),
]


def test_publish_many_bad_input_stores_nothing(ready: pgstreams.Client, dsn: str) -> None:
    for events, match in BATCH_CASES:
        _unchanged(dsn, lambda ev=events: ready.publish_many("t", ev), InvalidArgument, match, events)
        # the same batch from a generator: still nothing stored
        _unchanged(dsn, lambda ev=events: ready.publish_many("t", iter(ev)), InvalidArgument, match, events)
    for not_a_batch in (5, None, {"value": 1}, Message(1), "text", b"bytes"):
        _unchanged(dsn, lambda b=not_a_batch: ready.publish_many("t", b),  # type: ignore[arg-type]
                   InvalidArgument, "events must be an iterable of Message objects or dicts", not_a_batch)
    assert ready.describe_topic("t").events == 3


# -- consumer --------------------------------------------------------------------------------------------


def test_consumer_bad_input(ready: pgstreams.Client, dsn: str) -> None:
    for start, match in [
        (datetime(2024, 1, 1), "timezone-aware"), ("beginning", "start must be"),
        ("EARLIEST", "start must be"),
        (0, "start must be"), (None, "start must be"), ("2024-01-01T00:00:00Z", "start must be"),
    ]:
        _unchanged(dsn, lambda s=start: ready.consumer("t", "new", start=s), InvalidArgument, match, start)
    for group in ["", "a b", "a/b", "..", "x" * 250, "grüppe", None, 3]:
        _unchanged(dsn, lambda g=group: ready.consumer("t", g), InvalidName, "group name", group)
    for parts in ([2], [-1], [], [True], ["0"]):
        _unchanged(dsn, lambda p=parts: pgstreams.Consumer(ready, "t", "new", partitions=p),
                   InvalidArgument, "partitions", parts)


def test_poll_bad_arguments(ready: pgstreams.Client, dsn: str) -> None:
    c = ready.consumer("t", "g")
    for kwargs, match in [
        ({"max_events": 0}, "max_events"), ({"max_events": -5}, "max_events"),
        ({"max_events": "10"}, "max_events"), ({"max_events": True}, "max_events"),
        ({"max_events": 2.0}, "max_events"), ({"timeout": -1}, "timeout"), ({"timeout": -0.001}, "timeout"),
        ({"timeout": "1"}, "timeout"), ({"timeout": float("nan")}, "timeout"), ({"timeout": None}, "timeout"),
    ]:
        _unchanged(dsn, lambda kw=kwargs: c.poll(**kw), InvalidArgument, match, kwargs)
        with c.transaction() as tx:
            with pytest.raises(InvalidArgument, match=match):
                tx.poll(**kwargs)
    # the consumer still works and reads from its checkpoint
    assert len(c.poll(max_events=10, timeout=5)) == 2


def test_commit_bad_events(ready: pgstreams.Client, dsn: str) -> None:
    ready.publish("u", "other")
    foreign = ready.consumer("u", "g").poll(timeout=5)
    c = ready.consumer("t", "g")
    mine = c.poll(timeout=5)
    assert mine and foreign
    _unchanged(dsn, lambda: c.commit(foreign), InvalidArgument, r"u\[0\]@\d+ is not from this consumer")
    _unchanged(dsn, lambda: c.commit([*mine, *foreign]), InvalidArgument, "not from this consumer")
    _unchanged(dsn, lambda: c.commit(["x"]), InvalidArgument, "Event objects")  # type: ignore[list-item]
    _unchanged(dsn, lambda: c.commit([{"position": 1}]), InvalidArgument, "Event objects")  # type: ignore[list-item]
    # a consumer of partition 0 only rejects events of partition 1
    p0 = pgstreams.Consumer(ready, "t", "g", partitions=[0])
    other = [e for e in mine if e.partition == 1]
    assert other
    _unchanged(dsn, lambda: p0.commit(other), InvalidArgument, r"t\[1\]")
    # the rejected commits did not disturb the consumer
    assert c.commit(mine) is pgstreams.CommitOutcome.STORED


def test_seek_bad_arguments(ready: pgstreams.Client, dsn: str) -> None:
    c = ready.consumer("t", "g")
    for partition, position, match in [
        (2, 0, "partition 2"), (-1, 0, "partition -1"), ("0", 0, "partition '0'"),
        (True, 0, "partition True"),
        (None, 0, "partition None"), (0, -1, "position"), (0, "5", "position"), (0, 1.0, "position"),
        (0, None, "position"), (0, True, "position"),
    ]:
        _unchanged(dsn, lambda p=partition, q=position: c.seek(p, q), InvalidArgument, match,
                   (partition, position))
    for when in [datetime(2024, 1, 1), "2024-01-01", 0, None]:
        _unchanged(dsn, lambda w=when: c.seek_to_time(w), InvalidArgument, "aware datetime", when)


def test_describe_group_unknown(ready: pgstreams.Client, dsn: str) -> None:
    err = _unchanged(dsn, lambda: ready.describe_group("nobody"), GroupNotFound, "'nobody'")
    assert isinstance(err, LookupError)
    _unchanged(dsn, lambda: ready.describe_group("g", topic="u"), GroupNotFound, "'g'.*'u'")
    _unchanged(dsn, lambda: ready.describe_group("a b"), InvalidName, "group name")
    _unchanged(dsn, lambda: ready.describe_group("g", topic="a b"), InvalidName, "topic name")


def test_errors_are_the_expected_builtin_kinds() -> None:
    assert issubclass(InvalidName, ValueError) and issubclass(InvalidArgument, ValueError)
    assert issubclass(TopicNotFound, LookupError) and issubclass(GroupNotFound, LookupError)
    for e in (InvalidName, InvalidArgument, TopicNotFound, GroupNotFound, TopicConflict, ConfigurationError,
              MigrationError):
        assert issubclass(e, pgstreams.PgStreamsError)


def test_partition_for_key_bad_input() -> None:
    for key, partitions, match in [
        ("k", 0, "partitions"), ("k", -3, "partitions"), ("k", 2.0, "partitions"), ("k", True, "partitions"),
        ("k", "4", "partitions"), ("k", None, "partitions"), (None, 4, "key must be str or bytes"),
        (5, 4, "key must be str or bytes, not int"), (["k"], 4, "key must be"), ("\ud800", 4, "Unicode"),
    ]:
        with pytest.raises(InvalidArgument, match=match):
            pgstreams.partition_for_key(key, partitions)  # type: ignore[arg-type]
    assert pgstreams.partition_for_key("k", 4) == pgstreams.partition_for_key(b"k", 4)
