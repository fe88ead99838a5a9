"""The SQL function ``publish()``: values, every option, the partitioner, idempotent event ids, bad input,
segments, wake-ups, the read fence, and a trigger outbox under concurrent writers."""

from __future__ import annotations

import itertools
import json
import random
import threading
import time
from collections import Counter, defaultdict
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psycopg
import pytest
from psycopg.types.json import Jsonb

import pgstreams
from _core_helpers import db_state, take, wait_until
from pgstreams import Event, partition_for_key
from pgstreams.codec import encode_value
from pgstreams.partitioner import murmur2


def publish(conn: psycopg.Connection, args: str, params: Any = None) -> tuple[int, int, bool]:
    """``SELECT * FROM pgstreams.publish(<args>)`` on ``conn``: (partition, position, duplicate)."""
    row = conn.execute(f"SELECT * FROM pgstreams.publish({args})", params).fetchone()
    assert row is not None
    return int(row[0]), int(row[1]), bool(row[2])


def fields(e: Event) -> tuple[Any, ...]:
    """What a consumer gets of an event, apart from where and when it was stored."""
    return (e.key, e.value, type(e.value), dict(e.headers), e.event_type, e.event_id, e.correlation_id,
            e.causation_id)


# -- values and options ------------------------------------------------------------------------------------

VALUES = [  # (SQL value expression, the stored kind, the Python value a consumer gets back)
    ("""'{"a": [1, 2.5, null, true], "é": "ü", "n": {"m": []}}'::jsonb""", "j",
     {"a": [1, 2.5, None, True], "é": "ü", "n": {"m": []}}),
    ("""'[1, "x"]'::jsonb""", "j", [1, "x"]),
    ("'42'::jsonb", "j", 42),
    ("'-1.25'::jsonb", "j", -1.25),
    ("'true'::jsonb", "j", True),
    ("'false'::jsonb", "j", False),
    ("'null'::jsonb", "j", None),
    ("""'"a JSON string"'::jsonb""", "j", "a JSON string"),  # stored as JSON, read back as str
    ("jsonb_build_object('id', 7, 'tags', ARRAY['x', 'y'])", "j", {"id": 7, "tags": ["x", "y"]}),
    ("'text'", "s", "text"),  # a quoted literal of no declared type is text
    ("''", "s", ""),
    ("'ünï cødé ✓ 日本'::text", "s", "ünï cødé ✓ 日本"),
    ("'null'", "s", "null"),
    ("'{}'", "s", "{}"),
    (r"'\x00ff72'::bytea", "b", b"\x00\xffr"),
    ("''::bytea", "b", b""),
    ("convert_to('bytes', 'UTF8')", "b", b"bytes"),
]


def test_values_reach_python_consumers_as_python_published_ones(client: pgstreams.Client, dsn: str) -> None:
    client.create_topic("sql", 1)
    client.create_topic("py", 1)
    with psycopg.connect(dsn, autocommit=True) as conn:
        for expr, _, value in VALUES:
            publish(conn, f"'sql', {expr}")
            client.publish("py", value)
        stored = conn.execute("SELECT kind, value FROM pgstreams.topic_1 ORDER BY position").fetchall()
    from_sql = take(client.consumer("sql", "g"), len(VALUES))
    from_py = take(client.consumer("py", "g"), len(VALUES))
    assert [e.value for e in from_sql] == [v for _, _, v in VALUES]
    assert [fields(e) for e in from_sql] == [fields(e) for e in from_py]
    for (kind, payload), (expr, expected_kind, value) in zip(stored, VALUES, strict=True):
        assert kind == expected_kind, expr
        if kind == "j":  # jsonb's text form: the same JSON value, maybe other spacing and key order
            assert json.loads(bytes(payload)) == value, expr
        else:
            assert (kind, bytes(payload)) == encode_value(value), expr


def test_every_option_is_stored_as_the_python_producer_stores_it(client: pgstreams.Client, dsn: str) -> None:
    client.create_topic("sql", 3)
    client.create_topic("py", 3)
    options: dict[str, Any] = {"key": "user-1", "headers": {"trace": "abc", "é": "ü"},
                               "event_type": "order.created", "event_id": "ev-1", "correlation_id": "corr",
                               "causation_id": "cause"}
    with psycopg.connect(dsn, autocommit=True) as conn:
        # named arguments, in any order
        r = publish(conn, "'sql', %(value)s::jsonb, causation_id => %(causation_id)s, key => %(key)s,"
                          " headers => %(headers)s, event_type => %(event_type)s, event_id => %(event_id)s,"
                          " correlation_id => %(correlation_id)s",
                    {**options, "value": Jsonb({"k": 1}), "headers": Jsonb(options["headers"])})
        py = client.publish("py", {"k": 1}, **options)
        assert r == (py.partition, 1, False) and r[0] == partition_for_key("user-1", 3)
        # positional arguments: topic, value, key, headers, event_type, partition, event_id, correlation_id,
        # causation_id, notify
        r2 = publish(conn, "'sql', 'text value', 'user-1', '{\"h\": \"v\"}', 'typed', 2, 'ev-2', 'c2', 's2',"
                           " false")
        py2 = client.publish("py", "text value", key="user-1", headers={"h": "v"}, event_type="typed",
                             partition=2, event_id="ev-2", correlation_id="c2", causation_id="s2")
        assert r2[0] == py2.partition == 2
        # defaults: no key, headers, type or ids; an empty headers object stores no headers, as in Python
        r3 = publish(conn, r"'sql', '\x01'::bytea, headers => '{}', partition => 1")
        py3 = client.publish("py", b"\x01", headers={}, partition=1)
        # the result as one composite value, and one field of it
        composite = conn.execute("SELECT pgstreams.publish('sql', 'x', partition => 0)::text").fetchone()
        position = conn.execute("SELECT (pgstreams.publish('sql', 'y', partition => 0)).position").fetchone()
        assert composite is not None and position is not None
        assert composite[0] == f"(0,{r3[1] + 1},f)" and position[0] == r3[1] + 2
    client.publish("py", "x", partition=0)
    client.publish("py", "y", partition=0)
    got = sorted(take(client.consumer("sql", "g"), 5), key=lambda e: e.position)
    want = sorted(take(client.consumer("py", "g"), 5), key=lambda e: e.position)
    assert [fields(e) for e in got] == [fields(e) for e in want]
    assert [(e.partition, e.position) for e in got[:3]] == [r[:2], r2[:2], r3[:2]]
    assert (py3.partition, got[2].headers) == (1, {})


# -- the partitioner ---------------------------------------------------------------------------------------

KAFKA_MURMUR2 = [  # Kafka's own test vectors of Utils.murmur2
    (b"21", -973932308), (b"foobar", -790332482), (b"a-little-bit-long-string", -985981536),
    (b"a-little-bit-longer-string", -1486304829),
    (b"lkjh234lh9fiuh90y23oiuhsafujhadof229phr9h19h89h8", -58897971), (b"abc", 479470107),
]
_CODE_POINTS = [(0x20, 0x7E), (0xA0, 0x7FF), (0x800, 0xD7FF), (0xE000, 0xFFFD), (0x10000, 0x10FFFF)]


def _keys(n: int, seed: int = 7) -> list[str]:
    """Keys of every UTF-8 length class (1 to 4 bytes per character) and every length modulo 4."""
    rng = random.Random(seed)
    fixed = ["", "a", "ab", "abc", "abcd", "abcde", "key-1", "customer-42", "ünïcödé", "日本語のキー", "🙂🙃",
             "x" * 1000, "ΑΒΓ", "\u00e9", "e\u0301", "\U0010fffd", " ", "\t\n"]
    out = list(fixed)
    while len(out) < n:
        out.append("".join(chr(rng.randint(*rng.choice(_CODE_POINTS))) for _ in range(rng.randint(1, 40))))
    return out


def test_sql_murmur2_and_partitions_equal_pythons_and_kafkas(client: pgstreams.Client, dsn: str) -> None:
    keys = _keys(3000)
    with psycopg.connect(dsn, autocommit=True) as conn:
        for data, expected in KAFKA_MURMUR2:
            assert conn.execute("SELECT pgstreams.murmur2(%s::bytea)", (data,)).fetchone() == (expected,)
        hashes = conn.execute("SELECT pgstreams.murmur2(convert_to(k, 'UTF8')) FROM unnest(%s::text[])"
                              " WITH ORDINALITY AS u(k, i) ORDER BY i", (keys,)).fetchall()
        assert [h for (h,) in hashes] == [murmur2(k.encode()) for k in keys]
        for n in (1, 2, 3, 7, 12, 1024):
            rows = conn.execute("SELECT pgstreams.partition_for_key(k, %s) FROM unnest(%s::text[])"
                                " WITH ORDINALITY AS u(k, i) ORDER BY i", (n, keys)).fetchall()
            assert [p for (p,) in rows] == [partition_for_key(k, n) for k in keys], n
        # and through publish
        client.create_topic("t", 7)
        sample = keys[:150]
        results = [publish(conn, "'t', 'v', key => %s", (k,)) for k in sample]
    assert [r[0] for r in results] == [partition_for_key(k, 7) for k in sample]
    got = take(client.consumer("t", "g"), len(sample))
    assert {(e.key, e.partition) for e in got} == {(k, partition_for_key(k, 7)) for k in sample}


def test_keyless_events_go_round_robin_per_session_and_topic(client: pgstreams.Client, dsn: str) -> None:
    client.create_topic("t", 4)
    client.create_topic("u", 3)
    with psycopg.connect(dsn, autocommit=True) as conn:
        t_parts, u_parts = [], []
        for _ in range(12):
            t_parts.append(publish(conn, "'t', 'v'")[0])
            u_parts.append(publish(conn, "'u', 'v'")[0])
        t_parts.append(publish(conn, "'t', 'v', key => 'k'")[0])  # a keyed event does not move the rotation
        t_parts.append(publish(conn, "'t', 'v'")[0])
    for parts, n in ((t_parts[:12], 4), (u_parts, 3)):
        assert all(b == (a + 1) % n for a, b in itertools.pairwise(parts)), parts
        assert Counter(parts) == dict.fromkeys(range(n), 12 // n)
    assert t_parts[13] == (t_parts[11] + 1) % 4


# -- idempotent event ids ----------------------------------------------------------------------------------


def test_event_id_makes_sql_publish_idempotent_with_python_publishes_too(client: pgstreams.Client,
                                                                         dsn: str) -> None:
    client.create_topic("t", 3)
    with psycopg.connect(dsn, autocommit=True) as conn:
        first = publish(conn, "'t', 'one', key => 'a', event_id => 'id-1'")
        again = publish(conn, "'t', 'other value'::text, key => 'zzz', event_id => 'id-1'")
        assert not first[2] and again == (first[0], first[1], True)
        # Python then SQL, SQL then Python: one event id space
        py = client.publish("t", "from python", event_id="id-2")
        assert publish(conn, "'t', '\"x\"'::jsonb, event_id => 'id-2'") == (py.partition, py.position, True)
        sql_first = publish(conn, "'t', 'from sql', event_id => 'id-3'")
        dup = client.publish("t", "again", event_id="id-3")
        assert dup.duplicate and (dup.partition, dup.position) == sql_first[:2]
        # ids are per topic
        client.create_topic("u", 1)
        assert not publish(conn, "'u', 'one', event_id => 'id-1'")[2]
    got = take(client.consumer("t", "g"), 3)
    assert sorted(e.value for e in got) == ["from python", "from sql", "one"]


def test_producer_and_sequence_make_sql_publish_idempotent(client: pgstreams.Client, dsn: str) -> None:
    client.create_topic("t", 3)
    client.create_topic("u", 1)
    with psycopg.connect(dsn, autocommit=True) as conn:
        pid = conn.execute("SELECT pgstreams.new_producer_id()").fetchone()[0]  # type: ignore[index]
        first = publish(conn, "'t', 'one', key => 'a', producer => %s, sequence => 1", (pid,))
        again = publish(conn, "'t', 'one', key => 'a', producer => %s, sequence => 1", (pid,))
        assert not first[2] and again == (first[0], first[1], True)
        second = publish(conn, "'u', 'two'::text, producer => %s, sequence => 5", (pid,))  # gaps are fine
        assert not second[2]
        # an earlier sequence than the last: stored already, its place no longer known
        row = conn.execute("SELECT * FROM pgstreams.publish('t', 'one', producer => %s, sequence => 1)",
                           (pid,)).fetchone()
        assert row == (None, None, True)
        # another producer has sequences of its own; a rolled-back publish leaves no state behind
        other = conn.execute("SELECT pgstreams.new_producer_id()").fetchone()[0]  # type: ignore[index]
        with pytest.raises(psycopg.errors.RaiseException), conn.transaction():
            publish(conn, "'t', 'three', producer => %s, sequence => 1", (other,))
            conn.execute("DO $$ BEGIN RAISE EXCEPTION 'caller rolls back'; END $$")
        assert not publish(conn, "'t', 'three', producer => %s, sequence => 1", (other,))[2]
        for args, message in (("producer => %s", "go together"), ("sequence => %s", "go together"),
                              ("producer => -%s, sequence => 1", "at least 1")):
            with pytest.raises(psycopg.errors.InvalidParameterValue, match=message):
                publish(conn, f"'t', 'bad', {args}", (pid,))
        assert conn.execute("SELECT pgstreams.end_producer(%s)", (other,)).fetchone() == (True,)
        assert conn.execute("SELECT count(*) FROM pgstreams.producers").fetchone() == (1,)
    assert sorted(e.value for p in range(3) for e in client.read_events("t", p)) == ["one", "three"]
    assert [e.value for e in client.read_events("u", 0)] == ["two"]


def test_sql_publish_retried_after_a_connection_killed_around_commit_is_stored_once(
        client: pgstreams.Client, dsn: str) -> None:
    """The connection is killed before COMMIT, while COMMIT is on its way, while an autocommit publish
    runs, and after COMMIT before the caller read its answer: the caller cannot know whether the event was
    stored; retrying the same call with the same producer and sequence on a new connection stores it
    exactly once."""
    client.create_topic("t", 2)
    n = 48
    stored_by_retry = 0
    with psycopg.connect(dsn, autocommit=True) as admin:
        pid = admin.execute("SELECT pgstreams.new_producer_id()").fetchone()[0]  # type: ignore[index]
        for seq in range(n):
            call = f"SELECT * FROM pgstreams.publish('t', {seq}::text, producer => {pid}, sequence => {seq})"
            conn = psycopg.connect(dsn, autocommit=True)
            backend = conn.info.backend_pid
            mode = seq % 4
            first = None
            if mode == 0:  # killed inside the transaction, before COMMIT: nothing stored
                conn.execute("BEGIN")
                conn.execute(call)
            elif mode == 3:  # committed, then killed before the caller took the answer in: stored
                first = conn.execute(call).fetchone()
            elif mode == 1:  # killed with COMMIT on its way: either outcome
                conn.execute("BEGIN")
                conn.execute(call)
                conn.pgconn.send_query(b"COMMIT")
            else:  # an autocommit publish killed while it runs or commits: either outcome
                conn.pgconn.send_query(call.encode())
            assert admin.execute("SELECT pg_terminate_backend(%s)", (backend,)).fetchone() == (True,)
            conn.close()
            with psycopg.connect(dsn, autocommit=True) as retry:
                row = retry.execute(call).fetchone()
            assert row is not None
            stored_by_retry += not row[2]
            if mode == 0:
                assert row[2] is False
            elif mode == 3:
                assert first is not None and row == (first[0], first[1], True)
    values = sorted(int(e.value) for p in range(2) for e in client.read_events("t", p, limit=1000))
    assert values == list(range(n))  # each once: none lost, none duplicated
    assert n // 4 <= stored_by_retry <= 3 * n // 4


def test_concurrent_sql_publishes_of_one_event_id_store_it_once(client: pgstreams.Client, dsn: str) -> None:
    client.create_topic("t", 2)

    def blocked_on_a_lock() -> bool:
        with psycopg.connect(dsn, autocommit=True) as probe:
            row = probe.execute("SELECT count(*) FROM pg_stat_activity WHERE datname = current_database()"
                                " AND wait_event_type = 'Lock'").fetchone()
        return row == (1,)

    def second(value: str, event_id: str) -> tuple[int, int, bool]:
        with psycopg.connect(dsn, autocommit=True) as conn:
            return publish(conn, "'t', %s, event_id => %s", (value, event_id))

    with psycopg.connect(dsn) as held:
        first = publish(held, "'t', 'held', event_id => 'contested'")
        with threading_pool() as run:
            fut = run(second, "second", "contested")
            wait_until(blocked_on_a_lock, 20, "the second publisher to wait for the first one's transaction")
            assert not fut.done.is_set()
            held.commit()
            assert fut.result(20) == (first[0], first[1], True)
        # the first transaction rolls back: the second publisher stores its own event
        publish(held, "'t', 'rolled back', event_id => 'contested-2'")
        with threading_pool() as run:
            fut = run(second, "survivor", "contested-2")
            wait_until(blocked_on_a_lock, 20, "the second publisher to wait for the first one's transaction")
            held.rollback()
            assert not fut.result(20)[2]
    assert sorted(e.value for e in take(client.consumer("t", "g"), 2)) == ["held", "survivor"]


@dataclass
class _Future:
    done: threading.Event = field(default_factory=threading.Event)
    value: Any = None
    error: BaseException | None = None

    def result(self, timeout: float) -> Any:
        assert self.done.wait(timeout), "the call did not finish in time"
        if self.error is not None:
            raise self.error
        return self.value


class threading_pool:
    """Run calls in threads; joined when the block ends."""

    def __init__(self) -> None:
        self.threads: list[threading.Thread] = []

    def __enter__(self) -> Any:
        def run(fn: Any, *args: Any) -> _Future:
            fut = _Future()

            def target() -> None:
                try:
                    fut.value = fn(*args)
                except BaseException as exc:  # noqa: BLE001 - handed to the caller
                    fut.error = exc
                finally:
                    fut.done.set()

            t = threading.Thread(target=target, daemon=True)
            self.threads.append(t)
            t.start()
            return fut
        return run

    def __exit__(self, *exc: object) -> None:
        for t in self.threads:
            t.join(30)


# -- bad input ---------------------------------------------------------------------------------------------

BAD = [  # (arguments, SQLSTATE, message)
    ("'nope', 'x'", "P0002", "topic 'nope' does not exist"),
    ("'a b', 'x'", "42602", r"invalid topic name 'a b': use 1 to 249 characters of \[A-Za-z0-9._-\]"),
    ("'', 'x'", "42602", "invalid topic name ''"),
    ("'..', 'x'", "42602", r"invalid topic name '\.\.'"),
    ("repeat('a', 250), 'x'", "42602", "invalid topic name 'aaaa"),
    ("'tö', 'x'", "42602", "invalid topic name 'tö'"),
    ("NULL, 'x'", "22004", "topic name must not be NULL"),
    ("'t', NULL", "22004",
     r"value must not be NULL without a key \(a tombstone has a key; a JSON null is 'null'::jsonb\)"),
    ("'t', NULL::jsonb", "22004", "value must not be NULL"),
    ("'t', NULL::bytea", "22004", "value must not be NULL"),
    ("'t', 'x', partition => 2", "22023", r"partition 2 out of range for topic 't' \(0 to 1\)"),
    ("'t', 'x', partition => -1", "22023", r"partition -1 out of range for topic 't' \(0 to 1\)"),
    ("'t', 'x', key => 'k', partition => 9", "22023", "partition 9 out of range"),
    ("'t', 'x', headers => '[1, 2]'", "22023",
     "headers must be a JSON object of string values, not a JSON array"),
    ("'t', 'x', headers => '\"h\"'", "22023",
     "headers must be a JSON object of string values, not a JSON string"),
    ("'t', 'x', headers => '{\"a\": 1}'", "22023", 'headers must map strings to strings; bad entry "a": 1'),
    ("'t', 'x', headers => '{\"a\": \"ok\", \"b\": null}'", "22023", 'bad entry "b": null'),
    ("'t', 'x', headers => '{\"a\": {\"b\": \"c\"}}'", "22023",
     'bad entry "a": {"b": "c"} \\(a JSON object\\)'),
    ("'t', 'x', event_type => ''", "22023", "event_type must have 1 to 1000 characters, got 0"),
    ("'t', 'x', event_id => repeat('i', 1001)", "22023", "event_id must have 1 to 1000 characters, got 1001"),
    ("'t', 'x', correlation_id => ''", "22023", "correlation_id must have 1 to 1000 characters"),
    ("'t', 'x', causation_id => ''", "22023", "causation_id must have 1 to 1000 characters"),
    ("'t', 'x', notify => NULL", "22004", "notify must be true or false, not NULL"),
    # wrong types and names: PostgreSQL's own errors name them
    ("'t', 42", "42883", r"function pgstreams\.publish\(unknown, integer\) does not exist"),
    ("'t', 'x', key => 7", "42883", r"function pgstreams\.publish\(unknown, unknown, key => integer\)"),
    ("'t', 'x', partition => 'one'", "22P02", 'invalid input syntax for type integer: "one"'),
    ("'t', 'x', headers => 'not json'", "22P02", "invalid input syntax for type json"),
    ("'t', 'x', notify => 'maybe'", "22P02", 'invalid input syntax for type boolean: "maybe"'),
    ("'t', 'x', no_such_option => 1", "42883", "does not exist"),
    ("'t'", "42883", r"function pgstreams\.publish\(unknown\) does not exist"),
    # text PostgreSQL cannot hold
    (r"'t', E'a\000b'", "22021", 'invalid byte sequence for encoding "UTF8": 0x00'),
    (r"'t', 'x', key => E'\000'", "22021", "invalid byte sequence"),
    (r"""'t', '"\u0000"'::jsonb""", "22P05", "unsupported Unicode escape sequence"),
]


def test_bad_input_raises_a_clear_error_and_stores_nothing(client: pgstreams.Client, dsn: str) -> None:
    client.create_topic("t", 2)
    client.publish("t", "before", event_id="e0")
    before = db_state(dsn)
    with psycopg.connect(dsn, autocommit=True) as conn:
        for args, sqlstate, message in BAD:
            with pytest.raises(psycopg.Error, match=message) as info:
                publish(conn, args)
            assert info.value.sqlstate == sqlstate, (args, info.value.sqlstate, str(info.value))
            # inside a transaction that then commits what else it did: nothing of the event is stored
            with conn.transaction():
                conn.execute("SAVEPOINT s")
                with pytest.raises(psycopg.Error, match=message):
                    publish(conn, args)
                conn.execute("ROLLBACK TO SAVEPOINT s")
            assert db_state(dsn) == before, f"publish({args}) changed the database"
    assert [e.value for e in take(client.consumer("t", "g"), 1)] == ["before"]


# -- storage: segments -------------------------------------------------------------------------------------


def test_sql_publishing_creates_the_segments_its_positions_need(client: pgstreams.Client, dsn: str) -> None:
    client.create_topic("t", 2, segment_size=1000)
    values: list[int] = []
    with psycopg.connect(dsn, autocommit=True) as conn:
        for n in (1500, 1, 2200):  # one statement each: every position drawn inside one transaction
            first = len(values)
            row = conn.execute("SELECT count(*) FROM (SELECT pgstreams.publish('t', to_jsonb(i),"
                               " partition => i %% 2) FROM generate_series(%s::int, %s::int) i) s",
                               (first, first + n - 1)).fetchone()
            assert row == (n,)
            values.extend(range(first, first + n))
            client.publish("t", "python", partition=0)  # a Python publisher in between
        last, end = conn.execute(
            "SELECT (SELECT max(position) FROM pgstreams.topic_1),"
            " (SELECT max(hi) FROM pgstreams.segments WHERE topic_id = 1)").fetchone() or (0, 0)
        analyzed = conn.execute(
            "SELECT count(DISTINCT tablename) FROM pg_stats WHERE schemaname = 'pgstreams'"
            " AND tablename IN ('topic_1_s1', 'topic_1_s2', 'topic_1_s3')").fetchone()
    assert end > last + 1000, "a segment is kept ahead of the last position"
    assert analyzed == (3,), "full segments got column statistics"
    got = take(client.consumer("t", "g"), len(values) + 3, timeout=30)
    for p in (0, 1):
        positions = [e.position for e in got if e.partition == p]
        assert positions == sorted(positions) and len(set(positions)) == len(positions)
    assert sorted(e.value for e in got if e.value != "python") == values


# -- wake-ups ----------------------------------------------------------------------------------------------


def test_publish_wakes_consumers_at_commit_unless_notify_is_false(dsn: str) -> None:
    with pgstreams.connect(dsn, poll_interval=30) as client, \
            psycopg.connect(dsn, autocommit=True) as listener, psycopg.connect(dsn) as conn:
        client.create_topic("t", 1)
        client.create_topic("u", 1)
        listener.execute('LISTEN "pgstreams.pgstreams"')
        publish(conn, "'t', 'quiet', notify => false")
        conn.commit()
        publish(conn, "'u', 'loud'")
        publish(conn, "'u', 'loud again'")  # one notification per transaction and topic
        conn.commit()
        got = [(n.channel, n.payload) for n in listener.notifies(timeout=10, stop_after=1)]
        assert got == [("pgstreams.pgstreams", "2")], "the first notification is u's (id 2): t's was not sent"
        # a consumer waiting far below its 30 s polling interval is woken by a publish from SQL
        consumer = client.consumer("t", "g")
        assert [e.value for e in consumer.poll(timeout=5)] == ["quiet"]
        consumer.commit()
        client.listener.start()
        assert client.listener.connected.wait(10), "the client's listener did not connect"
        started = time.monotonic()
        with threading_pool() as run:
            fut = run(consumer.poll, 10, 20.0)
            publish(conn, "'t', 'wake up'")
            conn.commit()
            assert [e.value for e in fut.result(20)] == ["wake up"]
        assert time.monotonic() - started < 15


@pytest.fixture(scope="module")
def two_phase_dsn() -> Iterator[str]:
    """A server of this module's own that allows prepared transactions (two-phase commit)."""
    from pgstreams.embedded import temporary_server

    with temporary_server({"max_prepared_transactions": "4", "fsync": "off"}) as dsn:
        yield dsn


def test_two_phase_transactions_publish_with_notify_false(two_phase_dsn: str) -> None:
    with pgstreams.connect(two_phase_dsn) as client:
        _two_phase(client, two_phase_dsn)


def _two_phase(client: pgstreams.Client, dsn: str) -> None:
    client.create_topic("t", 1)
    consumer = client.consumer("t", "g")
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute("BEGIN")
        publish(conn, "'t', 'notifying'")
        with pytest.raises(psycopg.errors.FeatureNotSupported, match="NOTIFY"):
            conn.execute("PREPARE TRANSACTION 'pgstreams-test-a'")
        conn.execute("BEGIN")
        publish(conn, "'t', 'two-phase', notify => false")
        conn.execute("PREPARE TRANSACTION 'pgstreams-test-b'")
        try:
            client.publish("t", "after")  # held back behind the prepared transaction's event
            assert take(consumer, 0) == []
        finally:
            conn.execute("COMMIT PREPARED 'pgstreams-test-b'")
    assert [e.value for e in take(consumer, 2)] == ["two-phase", "after"]


# -- the read fence ----------------------------------------------------------------------------------------


def test_an_open_sql_publish_holds_back_only_its_partition_and_nothing_is_skipped(
        client: pgstreams.Client, dsn: str) -> None:
    client.create_topic("t", 2)
    consumer = client.consumer("t", "g")
    with psycopg.connect(dsn) as held:
        publish(held, "'t', 'held', partition => 0")
        client.publish("t", "later in 0", partition=0)  # a higher position, committed first
        client.publish("t", "in 1", partition=1)
        assert [e.value for e in take(consumer, 1, commit=True)] == ["in 1"]
        held.commit()
    assert [e.value for e in take(consumer, 2, commit=True)] == ["held", "later in 0"]
    # a savepoint rolled back takes its event and its hold on the partition with it
    with psycopg.connect(dsn) as conn:
        conn.execute("SAVEPOINT s")
        publish(conn, "'t', 'undone', partition => 0")
        conn.execute("ROLLBACK TO SAVEPOINT s")
        client.publish("t", "not held back", partition=0)
        assert [e.value for e in take(consumer, 1, commit=True)] == ["not held back"]
        publish(conn, "'t', 'kept', partition => 1")
        conn.commit()
    assert [e.value for e in take(consumer, 1)] == ["kept"]


def test_publish_in_another_schema(dsn: str) -> None:
    with pgstreams.connect(dsn, schema="other_streams") as client, \
            psycopg.connect(dsn, autocommit=True) as conn:
        client.create_topic("t", 2)
        conn.execute('LISTEN "pgstreams.other_streams"')
        r = conn.execute("SELECT * FROM other_streams.publish('t', 'x', key => 'k')").fetchone()
        assert r == (partition_for_key("k", 2), 1, False)
        assert [(n.channel, n.payload) for n in conn.notifies(timeout=10, stop_after=1)] == [
            ("pgstreams.other_streams", "1")]
        assert [e.value for e in take(client.consumer("t", "g"), 1)] == ["x"]


# -- a transactional outbox: a trigger publishes every change of a table ----------------------------------

#: The trigger of docs/sql.md: publishes every inserted, updated and deleted row of the table it is on to
#: topic TG_ARGV[0], keyed by the column TG_ARGV[1].
OUTBOX_TRIGGER = """
CREATE FUNCTION publish_row_change() RETURNS trigger LANGUAGE plpgsql AS $$
DECLARE
    r jsonb := to_jsonb(CASE WHEN TG_OP = 'DELETE' THEN OLD ELSE NEW END);
BEGIN
    PERFORM pgstreams.publish(
        TG_ARGV[0],                                            -- the topic
        jsonb_build_object('op', TG_OP, 'table', TG_TABLE_NAME, 'row', r),
        key => r ->> TG_ARGV[1],                               -- the key column, as text
        event_type => TG_TABLE_NAME || '.' || lower(TG_OP));
    RETURN NULL;
END;
$$;
"""
ACCOUNTS = """
CREATE TABLE accounts (id integer PRIMARY KEY, balance bigint NOT NULL, change text NOT NULL);
CREATE TRIGGER accounts_outbox AFTER INSERT OR UPDATE OR DELETE ON accounts
    FOR EACH ROW EXECUTE FUNCTION publish_row_change('accounts', 'id');
"""


def test_the_documented_trigger_is_the_tested_one() -> None:
    doc = (Path(__file__).resolve().parents[2] / "docs" / "sql.md").read_text("utf-8")
    assert OUTBOX_TRIGGER.strip() in doc and ACCOUNTS.strip() in doc


@pytest.fixture
def accounts(client: pgstreams.Client, dsn: str) -> Iterator[pgstreams.Client]:
    """Topic ``accounts`` (4 partitions, small segments) and table ``accounts`` with the outbox trigger."""
    client.create_topic("accounts", 4, segment_size=1000)
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(OUTBOX_TRIGGER)
        conn.execute(ACCOUNTS)
    yield client


def test_the_outbox_trigger_publishes_every_change(accounts: pgstreams.Client, dsn: str) -> None:
    with psycopg.connect(dsn) as conn:
        conn.execute("INSERT INTO accounts VALUES (1, 100, 'a'), (2, 5, 'b')")
        conn.execute("UPDATE accounts SET balance = balance - 10, change = 'c' WHERE id = 1")
        conn.execute("DELETE FROM accounts WHERE id = 2")
        conn.commit()
        conn.execute("INSERT INTO accounts VALUES (3, 0, 'rolled back')")
        conn.rollback()
    got = take(accounts.consumer("accounts", "g"), 4)
    by_key: dict[str | None, list[tuple[Any, ...]]] = defaultdict(list)
    for e in got:
        by_key[e.key].append((e.event_type, e.value["op"], e.value["row"]))
        assert e.partition == partition_for_key(str(e.key), 4) and e.value["table"] == "accounts"
    assert by_key == {
        "1": [("accounts.insert", "INSERT", {"id": 1, "balance": 100, "change": "a"}),
              ("accounts.update", "UPDATE", {"id": 1, "balance": 90, "change": "c"})],
        "2": [("accounts.insert", "INSERT", {"id": 2, "balance": 5, "change": "b"}),
              ("accounts.delete", "DELETE", {"id": 2, "balance": 5, "change": "b"})],
    }


@dataclass
class _Writer:
    """What one writer did: per committed transaction and key, the key's version (its count of committed
    transactions, assigned under the key's lock: the commit order of the key) and the changes in order;
    the changes of rolled-back transactions and savepoints."""

    committed: list[tuple[int, int, list[tuple[str, str]]]] = field(default_factory=list)
    rolled_back: list[tuple[str, str]] = field(default_factory=list)
    transactions: int = 0


def _change(conn: psycopg.Connection, rng: random.Random, key: int, cid: str) -> list[tuple[str, str]]:
    """Insert account ``key`` if it does not exist, else update (3 in 4) or delete it; return the changes
    as their outbox events name them: the operation and the row's ``change`` column (``cid``)."""
    row = conn.execute("SELECT change FROM accounts WHERE id = %s", (key,)).fetchone()
    if row is None:
        conn.execute("INSERT INTO accounts VALUES (%s, %s, %s)", (key, rng.randint(0, 100), cid))
        return [("INSERT", cid)]
    conn.execute("UPDATE accounts SET balance = balance + %s, change = %s WHERE id = %s",
                 (rng.randint(-50, 50), cid, key))
    if rng.random() < 0.75:
        return [("UPDATE", cid)]
    # the delete event carries the deleted row: updated just before, it names this change
    conn.execute("DELETE FROM accounts WHERE id = %s", (key,))
    return [("UPDATE", cid), ("DELETE", cid)]


def _write(dsn: str, wid: int, n_tx: int, keys: list[int], seed: int, out: _Writer) -> None:
    """``n_tx`` transactions changing 1 to 3 accounts (1 or 2 changes each); a quarter roll back, some roll
    back a savepoint. Each transaction first locks its keys' version rows in key order, so writers of a key
    run one after the other (as the account rows alone would make them) and never deadlock."""
    rng = random.Random(seed)
    ids = (f"{wid}.{i}" for i in range(10**9))
    with psycopg.connect(dsn) as conn:
        for _ in range(n_tx):
            commit = rng.random() >= 0.25
            chosen = sorted(rng.sample(keys, rng.randint(1, 3)))
            changes: list[tuple[int, int, list[tuple[str, str]]]] = []
            undone: list[tuple[str, str]] = []
            with conn.transaction(force_rollback=not commit):
                conn.execute("SELECT id FROM versions WHERE id = ANY(%s) ORDER BY id FOR UPDATE", (chosen,))
                versions: dict[int, int] = dict(conn.execute(
                    "UPDATE versions SET v = v + 1 WHERE id = ANY(%s) RETURNING id, v", (chosen,)).fetchall())
                rng.shuffle(chosen)
                for k in chosen:
                    done = [c for _ in range(rng.randint(1, 2)) for c in _change(conn, rng, k, next(ids))]
                    if rng.random() < 0.15:
                        with conn.transaction(force_rollback=True):  # a savepoint rolled back
                            undone.extend(_change(conn, rng, k, next(ids)))
                    changes.append((k, versions[k], done))
            out.transactions += 1
            if commit:
                out.committed.extend(changes)
            else:
                out.rolled_back.extend(c for _, _, done in changes for c in done)
            out.rolled_back.extend(undone)


def test_outbox_trigger_under_concurrent_writers_delivers_each_committed_change_once_in_order(
        accounts: pgstreams.Client, dsn: str) -> None:
    client = accounts
    keys = list(range(12))
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute("CREATE TABLE versions (id integer PRIMARY KEY, v integer NOT NULL)")
        conn.execute("INSERT INTO versions SELECT k, 0 FROM unnest(%s::int[]) k", (keys,))
    n_writers, n_tx, n_python = 8, 100, 300
    writers = [_Writer() for _ in range(n_writers)]
    errors: list[BaseException] = []
    delivered: list[Event] = []
    stop = threading.Event()

    def guarded(fn: Any, *args: Any) -> None:
        try:
            fn(*args)
        except BaseException as exc:  # noqa: BLE001 - reported by the test thread
            errors.append(exc)

    def python_publisher() -> None:  # a Python producer on the same topic meanwhile (keys of its own)
        for i in range(n_python):
            client.publish("accounts", {"py": i}, key=f"py-{i % 5}")

    def consume() -> None:
        consumer = client.consumer("accounts", "g")
        polls = 0
        while not stop.is_set():
            got = consumer.poll(max_events=100, timeout=0.2)
            if got:
                assert consumer.commit(got) == pgstreams.CommitOutcome.STORED
                delivered.extend(got)
            polls += 1
            if polls % 7 == 0:  # a new consumer of the group resumes from the committed checkpoints
                consumer = client.consumer("accounts", "g")

    threads = [threading.Thread(target=guarded, args=(_write, dsn, w, n_tx, keys, 100 + w, writers[w]))
               for w in range(n_writers)]
    threads.append(threading.Thread(target=guarded, args=(python_publisher,)))
    reader = threading.Thread(target=guarded, args=(consume,))
    reader.start()
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    assert not errors, errors
    assert not any(t.is_alive() for t in threads), "writers did not finish in time"
    expected_changes = sum(len(done) for w in writers for _, _, done in w.committed)
    try:
        wait_until(lambda: len(delivered) >= expected_changes + n_python or errors, 30,
                   f"{expected_changes + n_python} events to be delivered")
    finally:
        stop.set()
        reader.join(30)
    assert not errors, errors
    assert [e.value for e in take(client.consumer("accounts", "g"), 0)] == []  # nothing more committed

    # gap-free: within each partition, delivered in position order, each once
    for p in range(4):
        positions = [e.position for e in delivered if e.partition == p]
        assert positions == sorted(set(positions)), f"partition {p}: out of order or repeated"
    py_values = sorted(e.value["py"] for e in delivered if "py" in e.value)
    assert py_values == list(range(n_python))
    changes = [e for e in delivered if "py" not in e.value]
    for e in changes:
        assert e.key == str(e.value["row"]["id"]) and e.partition == partition_for_key(e.key, 4)
        assert e.event_type == "accounts." + e.value["op"].lower()
    got_ids = [(e.value["op"], e.value["row"]["change"]) for e in changes]
    # exactly once: every committed change, none twice, none of a rolled-back transaction or savepoint
    assert len(got_ids) == len(set(got_ids)), "a change was delivered twice"
    committed = {c for w in writers for _, _, done in w.committed for c in done}
    rolled_back = {c for w in writers for c in w.rolled_back}
    assert not set(got_ids) & rolled_back, "a rolled-back change was delivered"
    assert set(got_ids) == committed
    # per key in commit order: the key's versions are 1, 2, 3, ... (one per committed transaction)
    by_version: dict[int, dict[int, list[tuple[str, str]]]] = defaultdict(dict)
    for w in writers:
        for k, v, done in w.committed:
            by_version[k][v] = done
    for k in keys:
        versions = sorted(by_version[k])
        assert versions == list(range(1, len(versions) + 1)), f"key {k}: committed versions {versions}"
        expected = [c for v in versions for c in by_version[k][v]]
        assert [(e.value["op"], e.value["row"]["change"]) for e in changes if e.key == str(k)] == expected, k
    assert sum(w.transactions for w in writers) == n_writers * n_tx
    assert rolled_back, "some changes were rolled back"
    assert max(e.position for e in delivered) > 2000, "the writers crossed segments of 1000 positions"
