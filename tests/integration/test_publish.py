"""Publishing: value types, partitioning, idempotence by event id, outbox, all-or-none batches, segments."""

from __future__ import annotations

import threading
import time
from concurrent.futures import ProcessPoolExecutor, ThreadPoolExecutor

import psycopg
import pytest

import pgstreams
from _core_helpers import SPAWN, db_state, publish_same_ids, take, wait_until
from pgstreams import Message, partition_for_key


def test_values_come_back_with_their_type_and_fields(client: pgstreams.Client) -> None:
    client.create_topic("t", 1)
    values = [b"\x00\xffraw", b"", bytearray(b"ba"), "text", "", "ünï \x00 cødé", {"a": [1, 2.5, None, True]},
              [1, "x"], 42, -1.25, True, False, None, "null", "{}"]
    for v in values:
        client.publish("t", v)
    got = take(client.consumer("t", "g"), len(values), commit=True)
    expect = [bytes(v) if isinstance(v, bytearray) else v for v in values]
    assert [e.value for e in got] == expect
    assert [type(e.value) for e in got] == [type(v) for v in expect]
    r = client.publish("t", {"k": 1}, key="user-1", headers={"trace": "abc", "é": "ü"},
                       event_type="order.created", event_id="ev-1", correlation_id="corr",
                       causation_id="cause")
    (e,) = take(client.consumer("t", "g"), 1)
    assert (e.topic, e.partition, e.position) == (r.topic, r.partition, r.position)
    assert (e.key, e.headers, e.event_type, e.event_id, e.correlation_id, e.causation_id) == (
        "user-1", {"trace": "abc", "é": "ü"}, "order.created", "ev-1", "corr", "cause")
    with pytest.raises(Exception):  # noqa: B017 - frozen
        e.value = 1  # type: ignore[misc]


KAFKA_MURMUR2 = [  # Kafka's own test vectors of Utils.murmur2
    (b"21", -973932308), (b"foobar", -790332482), (b"a-little-bit-long-string", -985981536),
    (b"a-little-bit-longer-string", -1486304829),
    (b"lkjh234lh9fiuh90y23oiuhsafujhadof229phr9h19h89h8", -58897971), (b"abc", 479470107),
]


def test_key_hash_is_kafkas_murmur2() -> None:
    from pgstreams.partitioner import murmur2

    for data, expected in KAFKA_MURMUR2:
        assert murmur2(data) == expected
        for n in (1, 3, 12, 1024):
            assert partition_for_key(data.decode(), n) == (expected & 0x7FFFFFFF) % n


def test_keys_pick_stable_partitions_and_no_key_spreads(client: pgstreams.Client) -> None:
    client.create_topic("t", 4)
    for i in range(40):
        r = client.publish("t", i, key=f"key-{i % 10}")
        assert r.partition == partition_for_key(f"key-{i % 10}", 4)
    # Kafka's murmur2 partitioner: the same key lands where a Kafka producer would put it
    assert partition_for_key("key-1", 4) == partition_for_key("key-1", 4)
    assert client.publish("t", "p", key="key-1", partition=3).partition == 3
    spread = [client.publish("t", i).partition for i in range(8)]
    assert sorted(spread) == [0, 0, 1, 1, 2, 2, 3, 3]
    batch = [{"value": i, "key": f"key-{i % 10}"} for i in range(20)]
    assert client.publish_many("t", batch) == 20
    got = take(client.consumer("t", "g"), 40 + 1 + 8 + 20)
    for e in got:
        if e.key and e.value != "p":
            assert e.partition == partition_for_key(e.key, 4)


def test_event_id_makes_publish_idempotent(client: pgstreams.Client) -> None:
    client.create_topic("t", 3)
    first = client.publish("t", "one", event_id="id-1", key="a")
    again = client.publish("t", "other value", event_id="id-1", key="zzz")
    assert not first.duplicate and again.duplicate
    assert (again.partition, again.position) == (first.partition, first.position)
    # batches: ids already stored and ids repeated inside the batch are stored once
    n = client.publish_many("t", [{"value": "x", "event_id": "id-1"}, {"value": "y", "event_id": "id-2"},
                                  {"value": "y again", "event_id": "id-2"}, {"value": "no id"},
                                  Message("z", event_id="id-3")])
    assert n == 3
    assert client.publish("t", "late", event_id="id-3").duplicate
    got = take(client.consumer("t", "g"), 4)
    assert sorted(e.value for e in got) == ["no id", "one", "y", "z"]
    # ids are per topic
    client.create_topic("u", 1)
    assert not client.publish("u", "one", event_id="id-1").duplicate


def test_concurrent_publishes_of_one_event_id_store_it_once(client: pgstreams.Client, dsn: str) -> None:
    client.create_topic("t", 2)
    ids = [f"id-{i}" for i in range(60)]
    barrier = threading.Barrier(2)

    def run(tag: str) -> list[tuple[int, int]]:
        barrier.wait(10)
        return [(r.partition, r.position) for r in
                (client.publish("t", {"by": tag}, event_id=i, key=i) for i in ids)]

    with ThreadPoolExecutor(2) as pool:
        a, b = pool.map(run, ["a", "b"])
    assert a == b
    assert client.describe_topic("t").events == len(ids)

    # overlapping transactions: the second publisher waits for the first and then gets its result
    def blocked_on_a_lock() -> bool:
        with psycopg.connect(dsn, autocommit=True) as probe:
            row = probe.execute("SELECT count(*) FROM pg_stat_activity WHERE datname = current_database()"
                                " AND wait_event_type = 'Lock'").fetchone()
        return row == (1,)

    with psycopg.connect(dsn) as held:
        first = client.publish("t", "held", event_id="contested", conn=held)
        with ThreadPoolExecutor(1) as pool:
            fut = pool.submit(client.publish, "t", "second", event_id="contested")
            wait_until(blocked_on_a_lock, 20, "the second publisher to wait for the first one's transaction")
            assert not fut.done()
            held.commit()
            second = fut.result(20)
    assert second.duplicate and (second.partition, second.position) == (first.partition, first.position)
    # if the first transaction rolls back, the second publisher stores its own event
    with psycopg.connect(dsn) as held:
        client.publish("t", "rolled back", event_id="contested-2", conn=held)
        with ThreadPoolExecutor(1) as pool:
            fut = pool.submit(client.publish, "t", "survivor", event_id="contested-2")
            held.rollback()
            survivor = fut.result(20)
    assert not survivor.duplicate
    values = [e.value for e in take(client.consumer("t", "g"), len(ids) + 2)]
    assert "held" in values and "survivor" in values
    assert "second" not in values and "rolled back" not in values


@pytest.mark.slow
def test_processes_publishing_the_same_event_ids_store_each_once(client: pgstreams.Client, dsn: str) -> None:
    client.create_topic("t", 2)
    ids = [f"id-{i}" for i in range(100)]
    start_at = time.time() + 2.0  # both processes are running by then
    with ProcessPoolExecutor(2, mp_context=SPAWN) as pool:
        a, b = (f.result(60) for f in [pool.submit(publish_same_ids, dsn, "t", ids, tag, start_at)
                                        for tag in ("a", "b")])
    assert a == b
    got = take(client.consumer("t", "g"), len(ids))
    assert sorted(e.event_id for e in got) == sorted(ids)  # type: ignore[type-var]


def test_outbox_event_is_visible_only_after_commit(client: pgstreams.Client, dsn: str) -> None:
    client.create_topic("t", 1)
    consumer = client.consumer("t", "g")
    with psycopg.connect(dsn) as conn:
        conn.execute("CREATE TABLE orders (id int)")
        conn.commit()
        conn.execute("INSERT INTO orders VALUES (1)")
        r = client.publish("t", {"order": 1}, conn=conn)
        assert consumer.poll(timeout=0.2) == []
        assert client.describe_topic("t").events == 0
        conn.commit()
        (e,) = take(consumer, 1)
        assert (e.value, e.position) == ({"order": 1}, r.position)
        # rolled back: neither the business row nor the event exist
        conn.execute("INSERT INTO orders VALUES (2)")
        client.publish("t", {"order": 2}, conn=conn)
        client.publish("t", {"order": 2, "n": 2}, conn=conn)
        conn.rollback()
        assert conn.execute("SELECT count(*) FROM orders").fetchone() == (1,)
        conn.commit()
    assert client.describe_topic("t").events == 1
    client.publish("t", "after")  # nothing is stuck behind the rolled-back transaction
    assert [e.value for e in take(consumer, 1)] == ["after"]


def test_a_bad_event_found_while_the_copy_runs_stores_nothing_and_holds_nothing_back(
        client: pgstreams.Client, dsn: str) -> None:
    """publish_many routes a batch's events before its COPY starts only until they cover every partition,
    and routes and validates the rest as the COPY takes them: an event found bad half way (a bad key or
    header, a value over max.message.bytes) is refused naming it, the rows already sent are rolled back,
    and the batch's partitions are not held back afterwards."""
    client.create_topic("t", 3, config={"max.message.bytes": "1000"})
    consumer = client.consumer("t", "g")
    before = db_state(dsn)
    cases: list[tuple[int, dict[str, object], type[Exception], str]] = [
        (700, {"headers": {"h": "a\x00b"}}, pgstreams.InvalidArgument, "event 700: header 'h'"),
        (1500, {"value": b"x" * 2000}, pgstreams.MessageTooLarge, "event 1500: 2001 bytes"),
        (10, {"event_type": 5}, pgstreams.InvalidArgument, "event 10: event_type"),
        (1200, {"key": "a\x00b"}, pgstreams.InvalidArgument, "event 1200: key .* contains a NUL"),
    ]
    for i, bad, error, message in cases:
        batch = [Message(value=b"v%d" % n, key=f"k{n % 17}") for n in range(2000)]
        batch[i] = Message(**{"value": b"v", "key": "k", **bad})  # type: ignore[arg-type]
        with pytest.raises(error, match=message):
            client.publish_many("t", batch)
    after = db_state(dsn)
    changed = {k for k in after if after[k] != before.get(k)}
    # only positions were used up (and the client drew its producer id at its first publish)
    assert changed <= {"pgstreams.topic_1_seq", "pgstreams.producer_ids"}, changed
    assert client.describe_topic("t").events == 0
    assert client.publish_many("t", [Message(value=b"after", partition=p) for p in range(3)]) == 3
    got = take(consumer, 3)
    assert sorted((e.partition, e.value) for e in got) == [(p, b"after") for p in range(3)]


def test_publish_many_is_all_or_none(client: pgstreams.Client, dsn: str) -> None:
    client.create_topic("t", 2)
    client.publish_many("t", [{"value": i} for i in range(5)])
    with psycopg.connect(dsn, autocommit=True) as conn:
        # a failure inside the database in the middle of the batch
        conn.execute("""
            CREATE FUNCTION poison() RETURNS trigger LANGUAGE plpgsql AS $$
            BEGIN IF NEW.key = 'poison' THEN RAISE EXCEPTION 'poisoned event'; END IF; RETURN NEW; END $$;
            CREATE TRIGGER poison BEFORE INSERT ON pgstreams.topic_1 FOR EACH ROW EXECUTE FUNCTION poison();
        """)
    before = db_state(dsn)
    for with_ids in (False, True):
        batch = [{"value": i, **({"event_id": f"e{i}"} if with_ids else {})} for i in range(500)]
        batch[321]["key"] = "poison"
        with pytest.raises(psycopg.Error, match="poisoned event"):
            client.publish_many("t", batch)
        # a generator that fails half way
        def gen() -> object:
            yield {"value": 1}
            yield {"value": 2}
            raise RuntimeError("source failed")
        with pytest.raises(RuntimeError, match="source failed"):
            client.publish_many("t", gen())  # type: ignore[arg-type]
    after = db_state(dsn)
    changed = {k for k in after if after[k] != before.get(k)}
    assert changed <= {"pgstreams.topic_1_seq"}, changed  # only positions were used up
    assert client.describe_topic("t").events == 5
    assert client.publish_many("t", []) == 0


@pytest.mark.slow
def test_small_segments_fill_and_every_event_reads_back_in_order(client: pgstreams.Client, dsn: str) -> None:
    client.create_topic("t", 2, segment_size=1000)
    expected: list[object] = []
    for i in range(1100):
        client.publish("t", i, partition=i % 2)
        expected.append(i)
    for size in (2500, 700, 3000):
        batch = [{"value": f"m{len(expected) + j}", "partition": j % 2} for j in range(size)]
        assert client.publish_many("t", batch) == size
        expected.extend(b["value"] for b in batch)
    batch = [{"value": f"id{j}", "event_id": f"id{j}", "partition": j % 2} for j in range(1500)]
    assert client.publish_many("t", batch) == 1500
    expected.extend(b["value"] for b in batch)
    total = len(expected)
    got = take(client.consumer("t", "g"), total, timeout=60)
    assert [e.value for e in sorted(got, key=lambda e: e.position)] == expected
    for p in (0, 1):
        positions = [e.position for e in got if e.partition == p]
        assert positions == sorted(positions)
    with psycopg.connect(dsn) as conn:
        n_segments = conn.execute(
            "SELECT count(*) FROM pg_inherits WHERE inhparent = 'pgstreams.topic_1'::regclass").fetchone()
        max_pos = conn.execute("SELECT max(position) FROM pgstreams.topic_1").fetchone()
    assert n_segments is not None and max_pos is not None
    assert n_segments[0] >= max_pos[0] // 1000 + 1 >= total // 1000


@pytest.mark.slow
def test_concurrent_publishers_cross_small_segments(client: pgstreams.Client) -> None:
    client.create_topic("t", 3, segment_size=1000)
    consumer = client.consumer("t", "g")
    errors: list[BaseException] = []

    def single(tag: int) -> None:
        try:
            for i in range(400):
                client.publish("t", f"s{tag}-{i}", key=f"k{tag}")
        except BaseException as exc:  # noqa: BLE001 - reported by the test thread
            errors.append(exc)

    def many(tag: int) -> None:
        try:
            for b in range(6):
                client.publish_many("t", [{"value": f"m{tag}-{b}-{j}", "key": f"m{tag}"} for j in range(400)])
        except BaseException as exc:  # noqa: BLE001 - reported by the test thread
            errors.append(exc)

    threads = [threading.Thread(target=single, args=(i,)) for i in range(3)]
    threads += [threading.Thread(target=many, args=(i,)) for i in range(2)]
    for t in threads:
        t.start()
    got = []
    deadline = time.monotonic() + 60
    while any(t.is_alive() for t in threads):
        got.extend(consumer.poll(max_events=1000, timeout=0.1))
        consumer.commit()
        assert time.monotonic() < deadline
    for t in threads:
        t.join()
    assert not errors, errors
    total = 3 * 400 + 2 * 6 * 400
    got.extend(take(consumer, total - len(got), timeout=30))
    values = [e.value for e in got]
    assert len(values) == len(set(values)) == total
    for tag in range(3):  # per key, publication order
        assert [v for v in values if v.startswith(f"s{tag}-")] == [f"s{tag}-{i}" for i in range(400)]


def test_event_id_repeated_inside_one_transaction(client: pgstreams.Client, dsn: str) -> None:
    client.create_topic("t", 2)
    with psycopg.connect(dsn) as conn:
        first = client.publish("t", "a", event_id="same", conn=conn)
        second = client.publish("t", "b", event_id="same", conn=conn)
        assert second.duplicate and (second.partition, second.position) == (first.partition, first.position)
        conn.commit()
    assert [e.value for e in take(client.consumer("t", "g"), 1)] == ["a"]
    assert client.publish("t", "c", event_id="same").duplicate


def _segment_has_stats(client: pgstreams.Client, topic: str) -> bool:
    with client.connection() as conn:
        row = conn.execute(
            "SELECT EXISTS (SELECT 1 FROM pg_stats s JOIN pgstreams.topics t"
            " ON s.tablename = 'topic_' || t.id || '_s0'"
            " WHERE t.name = %s AND s.schemaname = 'pgstreams' AND s.attname = 'partition')",
            (topic,)).fetchone()
    return bool(row and row[0])


def test_a_new_segment_gets_column_statistics_once_it_holds_enough_rows(client: pgstreams.Client) -> None:
    """Without statistics a new segment looks empty to the planner and a poll sorts whole partitions; the
    publishing client ANALYZEs each segment once it holds 1,000 rows (no autovacuum needed)."""
    client.create_topic("batched", 4)
    client.publish_many("batched", [{"value": i, "key": f"k{i}"} for i in range(500)])
    assert not _segment_has_stats(client, "batched")  # too few rows: left for later
    for b in range(3):
        batch = range(1000 * b, 1000 * (b + 1))
        client.publish_many("batched", [{"value": i, "key": f"k{i}"} for i in batch])
    assert _segment_has_stats(client, "batched")

    client.create_topic("single", 2)
    for i in range(1100):
        client.publish("single", i, key=f"k{i % 7}")
    assert _segment_has_stats(client, "single")


def test_a_client_draws_its_producer_id_at_its_first_publish_only(dsn: str) -> None:
    def drawn() -> int:
        with psycopg.connect(dsn) as c:
            row = c.execute("SELECT last_value + CASE WHEN is_called THEN 1 ELSE 0 END"
                            " FROM pgstreams.producer_ids").fetchone()
            assert row is not None
            return int(row[0])

    with pgstreams.connect(dsn) as admin:
        admin.create_topic("t", 2)
    before = drawn()
    with pgstreams.connect(dsn) as reader:  # reads and administers only: draws nothing
        reader.describe_topic("t")
        reader.consumer("t", "g").poll(max_events=1, timeout=0)
    assert drawn() == before
    with pgstreams.connect(dsn) as writer:
        writer.publish("t", "x")
        writer.publish_many("t", [{"value": "y"}])
        assert drawn() == before + 1
        assert writer.producer_id > 0


def test_a_client_connected_with_idempotent_false_stores_no_producer_tag_and_draws_no_producer_id(
        dsn: str) -> None:
    def drawn() -> int:
        with psycopg.connect(dsn) as c:
            row = c.execute("SELECT last_value + CASE WHEN is_called THEN 1 ELSE 0 END"
                            " FROM pgstreams.producer_ids").fetchone()
            assert row is not None
            return int(row[0])

    with pgstreams.connect(dsn) as admin:
        admin.create_topic("t", 2)
    before = drawn()
    with pgstreams.connect(dsn, idempotent=False) as plain:
        plain.publish("t", "one")
        assert plain.publish_many("t", [{"value": "two"}, {"value": "three"}]) == 2
    assert drawn() == before
    with pgstreams.connect(dsn) as tagged:
        tagged.publish("t", "four")
        tagged.publish_many("t", [{"value": "five"}])
    with psycopg.connect(dsn) as c:
        (topic_id,) = c.execute("SELECT id FROM pgstreams.topics WHERE name = 't'").fetchone() or (None,)
        rows = c.execute(f"SELECT convert_from(value, 'UTF8'), producer IS NOT NULL"
                         f" FROM pgstreams.topic_{topic_id} ORDER BY position").fetchall()
    assert rows == [("one", False), ("two", False), ("three", False), ("four", True), ("five", True)]
    with pytest.raises(pgstreams.InvalidArgument, match="idempotent must be True or False"):
        pgstreams.connect(dsn, idempotent="no")  # type: ignore[arg-type]
