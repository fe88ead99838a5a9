"""The Spark data source against a real PostgreSQL and one local SparkSession shared by every test.

Covers batch reads (exact events, types, splits, offsets, pushdown), streaming reads (availableNow over
several runs, long-open producer transactions, admission control, group lag), writes (batch and
streaming, exactly-once across a SIGKILL of the whole query process) and bad options.
"""

from __future__ import annotations

import json
import logging
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from datetime import timedelta, timezone
from pathlib import Path
from typing import Any

import psycopg
import pyarrow  # noqa: F401  (a dependency of the source: fail here, loudly, when it is missing)
import pytest
from pyspark.sql import SparkSession

import _spark_helpers
import pgstreams
import pgstreams.spark as pgspark
from pgstreams.spark._arrow import Partitioner
from pgstreams.storage import TopicTables

# every test of this module shares one JVM (tests/conftest.py runs the Spark tests on one xdist worker)
pytestmark = [pytest.mark.spark]

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def spark() -> Iterator[SparkSession]:
    """One local SparkSession (``local[2]``, ``_spark_helpers.SPARK_CONF``) for every test of this module."""
    session = _spark_helpers.session("pgstreams-tests", **{"spark.sql.streaming.stopTimeout": "30s"})
    yield session
    for q in session.streams.active:
        q.stop()


def topic_id(dsn: str, name: str) -> int:
    with psycopg.connect(dsn) as conn:
        row = conn.execute("SELECT id FROM pgstreams.topics WHERE name = %s", (name,)).fetchone()
    assert row is not None
    return int(row[0])


def stored(dsn: str, name: str) -> list[tuple]:
    """Every event of a topic as ``(partition, position, xid, key, value, headers, event_type, event_id,
    correlation_id, causation_id, created_at)`` in read order (by position) per partition."""
    tid = topic_id(dsn, name)
    with psycopg.connect(dsn) as conn:
        return conn.execute(psycopg.sql.SQL(
            "SELECT partition, position, xid::text::bigint, key, value, headers, event_type, event_id, "
            "correlation_id, causation_id, created_at FROM {} ORDER BY partition, position").format(
                psycopg.sql.Identifier("pgstreams", f"topic_{tid}"))).fetchall()


def reader(spark: SparkSession, dsn: str, topic: str, *, stream: bool = False, wait: bool = True,
           **options: str) -> Any:
    if wait:
        visible(dsn)
    r = (spark.readStream if stream else spark.read).format("pgstreams")
    r = r.option("dsn", dsn).option("topic", topic)
    for k, v in options.items():
        r = r.option(k, v)
    return r.load()


def run_available_now(spark: SparkSession, dsn: str, topic: str, checkpoint: Path, *, wait: bool = True,
                      **options: str) -> list[tuple[int, list[dict[str, Any]]]]:
    """Run a streaming read with ``trigger(availableNow=True)`` into foreachBatch; return the batches."""
    batches: list[tuple[int, list[dict[str, Any]]]] = []

    def collect(df: Any, batch_id: int) -> None:
        rows = df.select("partition", "position", "value").collect()
        batches.append((batch_id, [r.asDict() for r in rows]))

    q = (reader(spark, dsn, topic, stream=True, wait=wait, **options).writeStream.foreachBatch(collect)
         .option("checkpointLocation", str(checkpoint)).trigger(availableNow=True).start())
    assert q.awaitTermination(180), "the availableNow query did not finish"
    assert q.exception() is None
    return batches


def visible(dsn: str, timeout: float = 120.0) -> None:
    """Wait until, in every partition of every topic, the read fence has passed every position handed out
    so far (a publishing transaction still open holds its partitions back)."""
    with psycopg.connect(dsn, autocommit=True) as conn:
        marks = {int(tid): (int(n), TopicTables("pgstreams", int(tid)).sequence_regclass)
                 for tid, n in conn.execute("SELECT id, partitions FROM pgstreams.topics").fetchall()}
        last = {tid: int(conn.execute("SELECT coalesce(pg_sequence_last_value(%s::regclass), 0)", (seq,))
                         .fetchone()[0]) for tid, (_n, seq) in marks.items()}

        def passed() -> bool:
            return all(min(conn.execute("SELECT pgstreams.partition_fences(%s, %s::int[], %s::regclass)",
                                        (tid, list(range(n)), seq)).fetchone()[0]) > last[tid]
                       for tid, (n, seq) in marks.items())

        wait_for("the read fences", passed, timeout)


def spark_filters(df: Any) -> list[str]:
    """The ``Filter`` nodes of ``df``'s executed plan (filters that Spark evaluates itself)."""
    plan = df._jdf.queryExecution().executedPlan().toString()
    return [line for line in plan.splitlines() if line.lstrip(" +-*:()0123456789").startswith("Filter ")]


def wait_for(what: str, check: Callable[[], bool], timeout: float = 120.0) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.1)


# --------------------------------------------------------------------------------------------------------
# batch reads


def test_python_workers_fork_from_pgstreams_daemon_with_pgstreams_and_psycopg_loaded(
        spark: SparkSession) -> None:
    """The tests' sessions set ``spark.python.daemon.module`` to ``pgstreams.spark_daemon`` (as the ML
    pipelines do): a UDF's worker is a child of that daemon and finds the preloaded modules imported
    without importing them itself."""
    from pyspark.sql import functions as F

    def probe(_: int) -> str:
        import os
        import sys
        from pathlib import Path

        parent = Path(f"/proc/{os.getppid()}/cmdline").read_bytes().replace(b"\0", b" ").decode()
        loaded = ",".join(m for m in ("psycopg", "pgstreams", "pyspark.worker") if m in sys.modules)
        return f"{loaded}|{parent}"

    rows = spark.range(4).select(F.udf(probe, "string", useArrow=False)("id").alias("p")).collect()
    for r in rows:
        loaded, parent = r.p.split("|", 1)
        assert loaded == "psycopg,pgstreams,pyspark.worker", r.p
        assert "-m pgstreams.spark_daemon pyspark.worker" in parent, r.p


def test_python_workers_import_the_installed_compiled_pyspark_not_sparks_archive(spark: SparkSession) -> None:
    """The tests' sessions run with :func:`pgstreams.spark_daemon.use_compiled_pyspark` (as the ML
    pipelines do): a worker's PySpark is the installed package (its modules compiled once, cached), not
    ``pyspark.zip`` from Spark's Python path, compiled again by every process."""
    from pyspark.sql import functions as F

    def probe(_: int) -> str:
        import os

        import pyspark.sql.types

        return f"{pyspark.sql.types.__file__}|{os.environ.get('PYTHONPATH', '')}"

    for r in spark.range(2).select(F.udf(probe, "string", useArrow=False)("id").alias("p")).collect():
        module, path = r.p.split("|", 1)
        assert ".zip" not in module and module.endswith(".py"), r.p
        # Spark still puts its archive on the path, from the compiled home, where there is none
        archives = [p for p in path.split(os.pathsep) if p.endswith("pyspark.zip")]
        assert archives and not any(Path(p).exists() for p in archives), r.p


def test_register_runs_the_data_source_in_an_interpreter_that_imports_pgstreams(
        spark: SparkSession, dsn: str, caplog: pytest.LogCaptureFixture) -> None:
    """Spark's Python workers would run an interpreter without pgstreams (a virtual environment that is
    not activated; here Debian's python3): register() runs the data source with this process's
    interpreter instead, says so, and leaves the context's own setting (the application's UDFs') as it
    was."""
    bare = "/usr/bin/python3"
    probe = subprocess.run([bare, "-c", "import pgstreams"], capture_output=True, text=True, timeout=60)
    assert probe.returncode != 0 and "No module named 'pgstreams'" in probe.stderr, probe.stderr
    with pgstreams.connect(dsn) as client:
        client.create_topic("elsewhere", 1)
        client.publish("elsewhere", "x", key="k")
    sc = spark.sparkContext
    mine = sc.pythonExec
    sc.pythonExec = bare
    try:
        with caplog.at_level(logging.WARNING, logger="pgstreams.spark"):
            pgspark.register(spark)
        assert sc.pythonExec == bare
        assert any("cannot import pgstreams" in r.getMessage() and bare in r.getMessage()
                   for r in caplog.records), caplog.text
        rows = reader(spark, dsn, "elsewhere").collect()
        assert [(r.topic, r.key) for r in rows] == [("elsewhere", "k")]
    finally:
        sc.pythonExec = mine
        pgspark.register(spark)


def test_batch_read_returns_exactly_the_published_events_with_documented_types(
        spark: SparkSession, dsn: str) -> None:
    with pgstreams.connect(dsn) as client:
        client.create_topic("events", 3)
        client.publish_many("events", [
            {"value": {"n": i, "text": "é"}, "key": f"k{i}", "event_type": "json" if i % 2 else None,
             "headers": {"source": "sim", "i": str(i)} if i % 4 == 0 else None,
             "event_id": f"id-{i}" if i % 3 == 0 else None, "correlation_id": "c" if i == 7 else None,
             "causation_id": "z" if i == 8 else None} for i in range(300)])
        client.publish("events", b"\x00\xff\x10binary", partition=1)
        client.publish("events", "plain text\twith tab", key=None, partition=2)
        client.publish("events", "", partition=0)
    df = reader(spark, dsn, "events")
    types = {f.name: f.dataType.simpleString() for f in df.schema.fields}
    assert types == {"topic": "string", "partition": "int", "position": "bigint", "key": "string",
                     "value": "binary", "headers": "map<string,string>", "event_type": "string",
                     "event_id": "string", "correlation_id": "string", "causation_id": "string",
                     "created_at": "timestamp"}
    assert df.rdd.getNumPartitions() >= 3
    got = {r.position: r for r in df.collect()}
    want = stored(dsn, "events")
    assert sorted(got) == sorted(w[1] for w in want)
    for p, pos, _x, key, value, headers, et, eid, cid, sid, created in want:
        r = got[pos]
        assert (r.topic, r.partition, r.key, bytes(r.value), r.event_type, r.event_id, r.correlation_id,
                r.causation_id) == ("events", p, key, bytes(value), et, eid, cid, sid)
        assert (r.headers or None) == (headers or None)
        # the session time zone is UTC: Spark's naive datetimes are UTC instants
        assert r.created_at.replace(tzinfo=timezone.utc) == created.astimezone(timezone.utc)


def test_batch_read_picks_up_optional_columns_first_used_in_a_later_chunk(
        spark: SparkSession, dsn: str) -> None:
    """A page scan starts without the optional columns' lengths and adds a column once a chunk holds a
    value in it: the events of later chunks keep their ids, headers and keys, and earlier ones their NULLs."""
    with pgstreams.connect(dsn) as client:
        client.create_topic("late", 2)
        client.publish_many("late", [{"value": b"v%d" % i} for i in range(3000)])
        client.publish_many("late", [
            {"value": b"w%d" % i, "key": f"key-{i}", "event_id": f"id-{i}", "correlation_id": f"c{i}",
             "causation_id": f"z{i}", "headers": {"h": str(i)}} for i in range(20)])
        client.publish_many("late", [{"value": b"x%d" % i} for i in range(500)])
    df = reader(spark, dsn, "late", arrowBatchSize="200", minPartitions="2")
    got = {r.position: r for r in df.collect()}
    want = stored(dsn, "late")
    assert len(got) == len(want) == 3520
    assert sum(1 for r in got.values() if r.event_id is not None) == 20
    for p, pos, _x, key, value, headers, et, eid, cid, sid, _created in want:
        r = got[pos]
        assert (r.partition, r.key, bytes(r.value), r.event_type, r.event_id, r.correlation_id,
                r.causation_id) == (p, key, bytes(value), et, eid, cid, sid)
        assert (r.headers or None) == (headers or None)


def test_batch_read_keeps_texts_holding_the_separator_or_the_null_mark(spark: SparkSession, dsn: str) -> None:
    """Key and event type come back as texts separated by chr(1) with NULL as chr(2): texts holding chr(1),
    or equal to chr(2), or empty, beside NULLs, in later chunks of a page scan and of an ordered read,
    still come back exactly (the chunk is read again by length)."""
    odd = ["a\x01b", "\x02", "", None, "\x01", "\x02\x02", "é\x01"]
    with pgstreams.connect(dsn) as client:
        client.create_topic("odd", 2)
        client.publish_many("odd", [{"value": b"v%d" % i, "key": f"k{i}", "event_type": "t",
                                     "partition": i % 2} for i in range(400)])
        # first the NULL mark alone as a text, beside NULLs and empty texts; then texts holding chr(1)
        client.publish_many("odd", [{"value": b"x%d" % i, "key": None if i % 3 else "", "event_type": "\x02",
                                     "partition": i % 2} for i in range(100)])
        client.publish_many("odd", [
            {"value": b"w%d" % i, "key": odd[i % len(odd)], "event_type": odd[(i + 3) % len(odd)] or None,
             "event_id": odd[(i + 1) % len(odd)] or None, "headers": {"h": odd[i % len(odd)] or "-"},
             "partition": i % 2} for i in range(40)])
    want = stored(dsn, "odd")
    p0 = [w for w in want if w[0] == 0]
    ordered = {"odd": {"0": p0[150][1], "1": -1}}
    for options in ({"arrowBatchSize": "64"},
                    {"arrowBatchSize": "64", "startingOffsets": json.dumps(ordered)}):
        df = reader(spark, dsn, "odd", **options)
        got = {r.position: r for r in df.collect()}
        expected = want if "startingOffsets" not in options else [w for w in want if w[0] == 0][150:]
        assert sorted(got) == sorted(w[1] for w in expected), options
        for p, pos, _x, key, value, headers, et, eid, cid, sid, _created in expected:
            r = got[pos]
            assert (r.partition, r.key, bytes(r.value), r.event_type, r.event_id, r.correlation_id,
                    r.causation_id) == (p, key, bytes(value), et, eid, cid, sid), options
            assert (r.headers or None) == (headers or None)


def test_split_delimited_detects_ambiguous_texts() -> None:
    from pgstreams.spark._arrow import split_delimited

    split = split_delimited(b"ab\x01\x02\x01\x01c", 4, 3)
    assert split is not None
    lengths, data = split
    assert lengths.tolist() == [2, -1, 0, 1] and bytes(data) == b"abc"
    assert split_delimited(b"a\x01b", 1, 1) is None  # a text holding the separator
    assert split_delimited(b"\x02\x01\x02", 2, 2) is None  # a text equal to the NULL mark
    assert split_delimited(b"\x02\x01\x02", 2, 1) is None
    split = split_delimited(b"\x02\x01\x02", 2, 0)
    assert split is not None
    lengths, data = split
    assert lengths.tolist() == [-1, -1] and bytes(data) == b""


def test_concat_rows_keeps_the_texts_of_page_groups_apart() -> None:
    """A page scan returns one row per page group: joined, a delimited column keeps one separator
    between texts (so it stays unambiguous), the other columns are joined as they are."""
    from pgstreams.spark._arrow import split_delimited
    from pgstreams.spark._batch import concat_rows

    group = lambda texts, lengths: (b"p", None, lengths, b"v", b"\x01".join(texts), *([None] * 7))  # noqa: E731
    row = concat_rows([group([b"a", b"b"], b"12"), group([b"c"], b"3"), group([b"\x02", b"de"], b"45")], [4])
    assert (row[0], row[1], row[2], row[3]) == (b"ppp", None, b"12345", b"vvv")
    split = split_delimited(row[4], 5, 4)
    assert split is not None
    lengths, data = split
    assert lengths.tolist() == [1, 1, 1, -1, 2] and bytes(data) == b"abcde"


def test_batch_read_splits_partitions_and_honours_offsets_and_pushed_filters(
        spark: SparkSession, dsn: str) -> None:
    with pgstreams.connect(dsn) as client:
        client.create_topic("split", 2, segment_size=1000)
        for chunk in range(5):
            client.publish_many("split", [{"value": f"v{i}", "partition": i % 2}
                                          for i in range(chunk * 1000, chunk * 1000 + 1000)])
    want = stored(dsn, "split")
    positions = sorted(w[1] for w in want)
    df = reader(spark, dsn, "split", minPartitions="8")
    assert df.rdd.getNumPartitions() >= 8
    assert sorted(r.position for r in df.select("position").collect()) == positions

    only_p1 = df.where("partition = 1 AND position >= 100 AND position < 2500")
    # pushed filters are evaluated by PostgreSQL only: Spark's plan keeps no Filter of its own
    assert not spark_filters(only_p1)
    assert sorted(r.position for r in only_p1.select("position").collect()) == [
        w[1] for w in want if w[0] == 1 and 100 <= w[1] < 2500]
    # a filter the source does not take stays in Spark's plan, without the part it took
    kept = spark_filters(df.where("value = X'7631' AND partition = 1"))
    assert len(kept) == 1 and "value" in kept[0] and "partition" not in kept[0], kept

    late = max(w[10] for w in want) - timedelta(microseconds=1)
    recent = df.where(df.created_at > late.astimezone(timezone.utc).replace(tzinfo=None))
    assert not spark_filters(recent)
    assert recent.count() == sum(1 for w in want if w[10] > late) > 0

    # positions: start at (inclusive) and stop before (exclusive), per partition; cursors are exclusive
    p0 = [w for w in want if w[0] == 0]
    start = {"split": {"0": p0[10][1], "1": -1}}
    end = {"split": {"0": p0[20][1]}}
    ranged = reader(spark, dsn, "split", startingOffsets=json.dumps(start), endingOffsets=json.dumps(end))
    assert [r.position for r in ranged.orderBy("position").collect()] == [w[1] for w in p0[10:20]]
    cursor = {"split": {"0": {"xid": p0[-3][2], "position": p0[-3][1]}, "1": -1}}
    tail = reader(spark, dsn, "split", startingOffsets=json.dumps(cursor))
    assert [r.position for r in tail.orderBy("position").collect()] == [w[1] for w in p0[-2:]]
    ts = reader(spark, dsn, "split", startingTimestamp=str(int((late.timestamp() + 1) * 1000)))
    assert ts.count() == 0


def test_decode_json_turns_values_into_columns(spark: SparkSession, dsn: str) -> None:
    with pgstreams.connect(dsn) as client:
        client.create_topic("clicks", 1)
        client.publish("clicks", {"user": "u1", "ad": 7, "price": 0.5})
        client.publish("clicks", "not json")
    df = reader(spark, dsn, "clicks")
    flat = pgspark.decode_json(df, "user string, ad int, price double", corrupt_column="_bad")
    rows = flat.orderBy("position").collect()
    assert (rows[0].user, rows[0].ad, rows[0].price, rows[0]._bad) == ("u1", 7, 0.5, None)
    assert rows[1].user is None and rows[1]._bad == "not json"
    assert "value" not in flat.columns and "position" in flat.columns
    nested = pgspark.decode_json(df, "user string", into="data")
    assert nested.orderBy("position").first().data.user == "u1"


# --------------------------------------------------------------------------------------------------------
# streaming reads


def test_available_now_over_three_runs_delivers_every_event_once_in_partition_order(
        spark: SparkSession, dsn: str, tmp_path: Path) -> None:
    with pgstreams.connect(dsn) as client:
        client.create_topic("s", 3)
        seen: list[dict[str, Any]] = []
        for run in range(3):
            client.publish_many("s", [{"value": f"r{run}-{i}", "key": f"k{i % 17}"} for i in range(200)])
            client.publish("s", f"r{run}-single", key="solo")
            batches = run_available_now(spark, dsn, "s", tmp_path / "ck")
            got = [r for _, rows in batches for r in rows]
            assert len(got) == 201, f"run {run} read {len(got)} events"
            seen.extend(got)
    want = stored(dsn, "s")
    assert sorted(r["position"] for r in seen) == sorted(w[1] for w in want)
    for p in range(3):
        assert [r["position"] for r in seen if r["partition"] == p] == [w[1] for w in want if w[0] == p]


def test_long_open_producer_transactions_lose_nothing(spark: SparkSession, dsn: str, tmp_path: Path) -> None:
    with pgstreams.connect(dsn) as client:
        client.create_topic("slow", 2)
        client.publish_many("slow", [{"value": f"early-{i}"} for i in range(10)])
        visible(dsn)
        # a transaction publishes to partition 0 and stays open while later transactions commit: it holds
        # back partition 0 only
        held = psycopg.connect(dsn)
        client.publish("slow", "held", partition=0, conn=held)
        client.publish_many("slow", [{"value": f"after-{i}", "partition": i % 2} for i in range(10)])
        first = run_available_now(spark, dsn, "slow", tmp_path / "ck", wait=False)
        values = [bytes(r["value"]).decode() for _, rows in first for r in rows]
        now = [*(f"early-{i}" for i in range(10)), *(f"after-{i}" for i in range(1, 10, 2))]
        assert sorted(values) == sorted(now), "events behind the fence leaked"
        held.commit()
        held.close()

        # concurrent producers during a running query: worker 0 keeps each of its transactions open while
        # the others commit several transactions and the query runs micro-batches, then commits
        got: list[str] = []
        batches_run = [0]
        changed = threading.Condition()

        def collect(df: Any, batch_id: int) -> None:
            rows = [bytes(r.value).decode() for r in df.select("value").collect()]
            with changed:
                got.extend(rows)
                batches_run[0] += 1
                changed.notify_all()

        q = (reader(spark, dsn, "slow", stream=True, wait=False).writeStream.foreachBatch(collect)
             .option("checkpointLocation", str(tmp_path / "ck")).trigger(processingTime="100 milliseconds")
             .start())
        try:
            pending = {"held", *(f"after-{i}" for i in range(0, 10, 2))}
            wait_for("the query's first micro-batch", lambda: pending <= set(got), timeout=120)

            stop = threading.Event()
            published: list[str] = []
            commits = [0, 0, 0]
            held_open = [0]
            errors: list[BaseException] = []

            def produce(worker: int) -> None:
                try:
                    with psycopg.connect(dsn) as conn:
                        n = 0
                        while not stop.is_set():
                            names = [f"w{worker}-{n + i}" for i in range(5)]
                            for name in names:
                                client.publish("slow", name, conn=conn)
                            if worker == 0:
                                # a long-open transaction: others commit after it began and the query runs
                                # a micro-batch meanwhile (at most 3 s, so that the test cannot hang)
                                with changed:
                                    others, runs = commits[1] + commits[2], batches_run[0]
                                    deadline = time.monotonic() + 3.0
                                    while ((commits[1] + commits[2] < others + 6 or batches_run[0] <= runs)
                                           and time.monotonic() < deadline and not stop.is_set()):
                                        changed.wait(0.05)
                            else:
                                stop.wait(0.05 * worker)  # the others' transactions stay open briefly
                            conn.commit()
                            with changed:
                                published.extend(names)
                                commits[worker] += 1
                                if worker == 0:
                                    held_open[0] += 1
                                changed.notify_all()
                            n += 5
                except BaseException as exc:  # noqa: BLE001 - reported to the test below
                    errors.append(exc)
                    with changed:
                        changed.notify_all()

            producers = [threading.Thread(target=produce, args=(w,)) for w in range(3)]
            for t in producers:
                t.start()
            try:
                wait_for("three long-open transactions committed during the query",
                         lambda: held_open[0] >= 3 or bool(errors), timeout=90)
            finally:
                stop.set()
                for t in producers:
                    t.join(timeout=30)
            assert not errors, errors
            expected = ["held", *(f"after-{i}" for i in range(0, 10, 2)), *published]
            wait_for("the query to catch up", lambda: len(got) >= len(expected), timeout=90)
        finally:
            q.stop()
        assert sorted(got) == sorted(expected)


def test_a_transaction_open_in_another_database_does_not_hold_a_streaming_read_back(
        spark: SparkSession, dsn: str, empty_dsn: str, tmp_path: Path) -> None:
    with pgstreams.connect(dsn) as client, psycopg.connect(empty_dsn) as other:
        client.create_topic("busy", 2)
        client.publish_many("busy", [{"value": f"before-{i}"} for i in range(20)])
        # a write transaction of another database on the same server, open during the whole query: it
        # holds the server-wide snapshot xmin back, but it cannot write this database's events
        xid = int(other.execute("SELECT pg_current_xact_id()::text::bigint").fetchone()[0])
        client.publish_many("busy", [{"value": f"after-{i}"} for i in range(30)])
        with psycopg.connect(dsn, autocommit=True) as conn:
            xmin = int(conn.execute("SELECT pg_snapshot_xmin(pg_current_snapshot())::text::bigint")
                       .fetchone()[0])
        assert xmin <= xid, "the other database's transaction does not hold the server-wide xmin back"
        batches = run_available_now(spark, dsn, "busy", tmp_path / "ck", wait=False, group="spark-busy")
        values = sorted(bytes(r["value"]).decode() for _, rows in batches for r in rows)
        assert values == sorted([*(f"before-{i}" for i in range(20)), *(f"after-{i}" for i in range(30))])
        assert sum(s.lag for s in client.describe_group("spark-busy", "busy")) == 0
        other.rollback()


def values_of(rows: Any) -> list[str]:
    """The values (UTF-8 texts) of collected rows, or of the rows of ``run_available_now``'s batches."""
    if rows and isinstance(rows[0], tuple) and len(rows[0]) == 2 and isinstance(rows[0][1], list):
        return sorted(bytes(r["value"]).decode() for _, batch in rows for r in batch)
    return sorted(bytes(r.value).decode() for r in rows)


def test_an_unrelated_open_transaction_does_not_hold_reads_back(
        spark: SparkSession, dsn: str, tmp_path: Path) -> None:
    """A transaction of the same database stays open throughout, having updated another table and
    published to another topic: batch reads and ``availableNow`` streams of this topic go on, and deliver
    every event published meanwhile."""
    with pgstreams.connect(dsn) as client, psycopg.connect(dsn) as other:
        client.create_topic("flow", 2)
        client.create_topic("elsewhere", 1)
        with psycopg.connect(dsn, autocommit=True) as conn:
            conn.execute("CREATE TABLE unrelated (id int PRIMARY KEY, n int NOT NULL)")
            conn.execute("INSERT INTO unrelated VALUES (1, 0)")
        client.publish_many("flow", [{"value": f"before-{i}"} for i in range(20)])
        other.execute("UPDATE unrelated SET n = n + 1 WHERE id = 1")
        client.publish("elsewhere", "not committed", conn=other)
        xid = int(other.execute("SELECT pg_current_xact_id()::text::bigint").fetchone()[0])
        client.publish_many("flow", [{"value": f"during-{i}"} for i in range(30)])
        with psycopg.connect(dsn, autocommit=True) as conn:
            xmin = int(conn.execute("SELECT pg_snapshot_xmin(pg_current_snapshot())::text::bigint")
                       .fetchone()[0])
        assert xmin <= xid, "the open transaction does not hold the database's snapshot xmin back"
        want = sorted([*(f"before-{i}" for i in range(20)), *(f"during-{i}" for i in range(30))])

        assert values_of(reader(spark, dsn, "flow", wait=False).select("value").collect()) == want
        assert values_of(run_available_now(spark, dsn, "flow", tmp_path / "ck", wait=False,
                                           group="spark-flow")) == want
        client.publish_many("flow", [{"value": f"later-{i}"} for i in range(10)])
        assert values_of(run_available_now(spark, dsn, "flow", tmp_path / "ck", wait=False,
                                           group="spark-flow")) == sorted(f"later-{i}" for i in range(10))
        assert sum(s.lag for s in client.describe_group("spark-flow", "flow")) == 0
        assert values_of(reader(spark, dsn, "flow", wait=False).select("value").collect()) == sorted(
            [*want, *(f"later-{i}" for i in range(10))])
        # the open transaction's own topic stays held back
        assert reader(spark, dsn, "elsewhere", wait=False).count() == 0
        other.rollback()


def test_a_transaction_open_on_one_partition_holds_back_only_that_partition(
        spark: SparkSession, dsn: str, tmp_path: Path) -> None:
    """An open transaction that published to partition 0 holds back partition 0 from its event on, in
    batch reads and streams alike; partition 1 goes on. Once it commits, partition 0's events are all
    delivered, in position order, none skipped and none twice."""
    with pgstreams.connect(dsn) as client:
        client.create_topic("part", 2)
        client.publish_many("part", [{"value": f"before-{i}", "partition": i % 2} for i in range(10)])
        held = psycopg.connect(dsn)
        try:
            client.publish("part", "held", partition=0, conn=held)
            client.publish_many("part", [{"value": f"after-{i}", "partition": i % 2} for i in range(10)])
            now = sorted([*(f"before-{i}" for i in range(10)), *(f"after-{i}" for i in range(1, 10, 2))])
            assert values_of(reader(spark, dsn, "part", wait=False).select("value").collect()) == now
            only_p1 = reader(spark, dsn, "part", wait=False).where("partition = 1").select("value").collect()
            assert values_of(only_p1) == sorted([*(f"before-{i}" for i in range(1, 10, 2)),
                                                 *(f"after-{i}" for i in range(1, 10, 2))])
            first = run_available_now(spark, dsn, "part", tmp_path / "ck", wait=False, group="spark-part")
            assert values_of(first) == now
            # the stream goes on with partition 1 while partition 0 stays held back
            client.publish("part", "p1-more", partition=1)
            more = run_available_now(spark, dsn, "part", tmp_path / "ck", wait=False, group="spark-part")
            assert values_of(more) == ["p1-more"]
            held.commit()
        finally:
            held.close()
        want = stored(dsn, "part")
        everything = reader(spark, dsn, "part").select("partition", "position").collect()
        assert sorted((r.partition, r.position) for r in everything) == [(w[0], w[1]) for w in want]
        rest = run_available_now(spark, dsn, "part", tmp_path / "ck", group="spark-part")
        assert values_of(rest) == sorted(["held", *(f"after-{i}" for i in range(0, 10, 2))])
        rows = [r for _, batch in rest for r in batch]
        assert all(r["partition"] == 0 for r in rows)
        assert [r["position"] for r in rows] == [w[1] for w in want if w[0] == 0][5:]
        assert sum(s.lag for s in client.describe_group("spark-part", "part")) == 0


def test_offsets_of_the_former_form_are_accepted_and_skip_nothing(
        spark: SparkSession, dsn: str, tmp_path: Path) -> None:
    """An offset ``{"xid": x, "position": p}`` (after the event ``(x, p)`` in the former read order, by
    transaction id first) in startingOffsets, endingOffsets or a stream's checkpoint: every event that
    came after it in that order is read, also one stored at a smaller position (events of older
    transactions at larger positions are read again); new offsets are written as positions."""
    with pgstreams.connect(dsn) as client:
        client.create_topic("legacy", 2)
        client.publish_many("legacy", [{"value": f"e{i}", "partition": i % 2} for i in range(10)])
        # the transaction with the smaller id stores its event at the larger position
        with psycopg.connect(dsn) as older, psycopg.connect(dsn) as newer:
            older.execute("SELECT pg_current_xact_id()")
            client.publish("legacy", "newer", partition=0, conn=newer)
            client.publish("legacy", "older", partition=0, conn=older)
            newer.commit()
            older.commit()
        want = stored(dsn, "legacy")
        x_older, p_older = next((w[2], w[1]) for w in want if bytes(w[4]) == b"older")
        last_p1 = [w for w in want if w[0] == 1][-1]
        assert next(w[1] for w in want if bytes(w[4]) == b"newer") < p_older
        legacy = {"legacy": {"0": {"xid": x_older, "position": p_older},
                             "1": {"xid": last_p1[2], "position": last_p1[1]}}}

        # a batch read from it reads "newer" (after "older" in the former order) and "older" again
        start = reader(spark, dsn, "legacy", startingOffsets=json.dumps(legacy)).select("value").collect()
        assert values_of(start) == ["newer", "older"]
        end = reader(spark, dsn, "legacy", endingOffsets=json.dumps(legacy)).select("value").collect()
        assert values_of(end) == sorted(f"e{i}" for i in range(10))

        # a stream whose checkpoint holds such an offset
        ck = tmp_path / "ck"
        assert len(values_of(run_available_now(spark, dsn, "legacy", ck))) == 12
        offsets = sorted((ck / "offsets").glob("[0-9]*"), key=lambda f: int(f.name))[-1]
        lines = offsets.read_text().splitlines()
        # every partition's latest offset is the cursor before its fence: the last position handed out
        last = max(w[1] for w in want)
        assert json.loads(lines[-1]) == {"legacy": {"0": last, "1": last}}
        offsets.write_text("\n".join([*lines[:-1], json.dumps(legacy)]))
        for crc in offsets.parent.glob(f".{offsets.name}.crc"):
            crc.unlink()
        client.publish_many("legacy", [{"value": f"n{i}", "partition": i % 2} for i in range(4)])
        again = run_available_now(spark, dsn, "legacy", ck, group="spark-legacy")
        assert values_of(again) == sorted(["newer", "older", *(f"n{i}" for i in range(4))])
        written = sorted((ck / "offsets").glob("[0-9]*"), key=lambda f: int(f.name))[-1]
        last = max(w[1] for w in stored(dsn, "legacy"))
        assert json.loads(written.read_text().splitlines()[-1]) == {"legacy": {"0": last, "1": last}}
        status = {s.partition: s.checkpoint for s in client.describe_group("spark-legacy", "legacy")}
        assert status == {0: last, 1: last}


def test_offsets_json_round_trip() -> None:
    from pgstreams.spark._stream import from_json, to_json

    assert to_json({"t": {1: 5, 0: 3}}) == {"t": {"0": 3, "1": 5}}
    assert from_json({"t": {"0": 3, "1": {"xid": 7, "position": 5}}}) == {"t": {0: 3, 1: (7, 5)}}
    with pytest.raises(pgstreams.InvalidArgument, match="topic 't' partition 0"):
        from_json({"t": {"0": -1}})


def test_a_spark_write_task_holds_back_its_topic_until_it_commits(dsn: str) -> None:
    """A write task registers its transaction as a publisher of every partition of the topic before its
    COPY: while it runs no partition's read fence passes it, and once it commits they all do."""
    import pyarrow as pa

    from pgstreams.spark import _db
    from pgstreams.spark._options import WriteOptions
    from pgstreams.spark._write import write_task

    with pgstreams.connect(dsn) as client:
        client.create_topic("written", 3)
        client.publish_many("written", [{"value": i} for i in range(5)])
    with psycopg.connect(dsn, autocommit=True) as conn:
        meta = _db.topics(conn, "pgstreams", ["written"])[0]
        before = _db.fences(conn, "pgstreams", meta)
        during: list[dict[int, int]] = []

        def batches() -> Iterator[pa.RecordBatch]:
            yield pa.record_batch({"value": pa.array(["a", "b", "c"])})
            during.append(_db.fences(conn, "pgstreams", meta))
            yield pa.record_batch({"value": pa.array(["d", "e", "f"])})

        done = write_task(WriteOptions(dsn, "pgstreams", "written"), meta, ["value"], "test-sink", 0, 0,
                          batches())
        after = _db.fences(conn, "pgstreams", meta)
    assert done.stored == 6
    assert before == {p: 6 for p in range(3)}
    assert during == [before]
    assert after == {p: 12 for p in range(3)}


def test_max_events_per_trigger_is_honoured_and_group_lag_reaches_zero(
        spark: SparkSession, dsn: str, tmp_path: Path) -> None:
    with pgstreams.connect(dsn) as client:
        client.create_topic("capped", 3)
        client.publish_many("capped", [{"value": str(i), "key": f"k{i}"} for i in range(240)])
        batches = run_available_now(spark, dsn, "capped", tmp_path / "ck", maxEventsPerTrigger="100",
                                    group="spark-capped")
        sizes = [len(rows) for _, rows in batches if rows]
        assert sizes == [100, 100, 40], sizes
        assert len({r["position"] for _, rows in batches for r in rows}) == 240
        status = client.describe_group("spark-capped", "capped")
        assert [s.partition for s in status] == [0, 1, 2]
        assert sum(s.lag for s in status) == 0
        client.publish_many("capped", [{"value": "more"} for _ in range(30)])
        assert sum(s.lag for s in client.describe_group("spark-capped")) == 30
        more = run_available_now(spark, dsn, "capped", tmp_path / "ck", maxEventsPerTrigger="100",
                                 group="spark-capped")
        assert [len(rows) for _, rows in more if rows] == [30]
        assert sum(s.lag for s in client.describe_group("spark-capped")) == 0


def test_several_topics_and_latest_and_group_starts(spark: SparkSession, dsn: str, tmp_path: Path) -> None:
    """Option ``topics`` (a comma list) in batch and streaming reads; a stream started at ``latest`` reads
    only what comes later; one started at ``group`` goes on from that group's checkpoints."""

    def stream_once(checkpoint: str, **options: str) -> list[tuple[str, str]]:
        got: list[tuple[str, str]] = []

        def collect(df: Any, _batch_id: int) -> None:
            got.extend((r.topic, bytes(r.value).decode()) for r in df.select("topic", "value").collect())

        r = spark.readStream.format("pgstreams").option("dsn", dsn).option("topics", "ta, tb")
        for k, v in options.items():
            r = r.option(k, v)
        q = (r.load().writeStream.foreachBatch(collect)
             .option("checkpointLocation", str(tmp_path / checkpoint)).trigger(availableNow=True).start())
        assert q.awaitTermination(180), "the availableNow query did not finish"
        assert q.exception() is None
        return sorted(got)

    with pgstreams.connect(dsn) as client:
        client.create_topic("ta", 2)
        client.create_topic("tb", 1)
        client.create_topic("tc", 1)
        client.publish_many("ta", [{"value": f"a{i}", "key": f"k{i}"} for i in range(50)])
        client.publish_many("tb", [{"value": f"b{i}"} for i in range(30)])
        client.publish("tc", "not read")
        visible(dsn)
        batch = (spark.read.format("pgstreams").option("dsn", dsn).option("topics", "ta,tb").load()
                 .select("topic", "value").collect())
        first = sorted([*(("ta", f"a{i}") for i in range(50)), *(("tb", f"b{i}") for i in range(30))])
        assert sorted((r.topic, bytes(r.value).decode()) for r in batch) == first

        assert stream_once("all", group="multi") == first
        assert sum(s.lag for s in client.describe_group("multi")) == 0
        assert {s.topic for s in client.describe_group("multi")} == {"ta", "tb"}
        assert stream_once("latest", startingOffsets="latest") == []

        client.publish_many("ta", [{"value": f"a-late{i}", "key": f"k{i}"} for i in range(5)])
        client.publish("tb", "b-late")
        visible(dsn)
        later = sorted([*(("ta", f"a-late{i}") for i in range(5)), ("tb", "b-late")])
        assert sum(s.lag for s in client.describe_group("multi")) == 6
        assert stream_once("latest", startingOffsets="latest") == later
        # a new query (new checkpoint) started from the group's checkpoints reads only what the group lacks
        assert stream_once("from-group", startingOffsets="group", group="multi") == later
        assert sum(s.lag for s in client.describe_group("multi")) == 0


# --------------------------------------------------------------------------------------------------------
# writes


def test_batch_write_publishes_rows_with_keys_partitions_headers_and_event_ids(
        spark: SparkSession, dsn: str) -> None:
    with pgstreams.connect(dsn) as client:
        client.create_topic("out", 4)
        rows = [(f"v{i}", f"key-{i % 13}" if i % 5 else None, {"h": str(i)} if i % 7 == 0 else None,
                 3 if i % 11 == 0 else None, "t", f"id-{i}" if i % 2 == 0 else None) for i in range(200)]
        df = spark.createDataFrame(rows, "value string, key string, headers map<string,string>, "
                                         "partition int, event_type string, event_id string")
        df.write.format("pgstreams").option("dsn", dsn).option("topic", "out").mode("append").save()
        # writing the same event ids again stores nothing new for them
        df.where("event_id IS NOT NULL").write.format("pgstreams").option("dsn", dsn).option("topic", "out") \
            .mode("append").save()
        visible(dsn)
        check = client.consumer("out", "check")
        events = check.poll(1000, timeout=2)
        check.commit()
        assert len(events) == 200
        by_value = {e.value: e for e in events}
        for value, key, headers, partition, et, eid in rows:
            e = by_value[value]
            assert (e.key, e.event_type, e.event_id, dict(e.headers)) == (key, et, eid, headers or {})
            if partition is not None:
                assert e.partition == partition
            elif key is not None:
                assert e.partition == pgstreams.partition_for_key(key, 4)
        binary = spark.createDataFrame([(bytearray(b"\x00\x01\\\n"),)], "value binary")
        binary.write.format("pgstreams").option("dsn", dsn).option("topic", "out").mode("append").save()
        visible(dsn)
        assert [e.value for e in check.poll(10, timeout=2)] == [b"\x00\x01\\\n"]


def segment_has_stats(dsn: str, topic: str, index: int) -> bool:
    """Whether segment ``index`` of ``topic`` has column statistics (of its ``partition`` column)."""
    tables = TopicTables("pgstreams", topic_id(dsn, topic))
    with psycopg.connect(dsn) as conn:
        row = conn.execute("SELECT EXISTS (SELECT 1 FROM pg_stats WHERE schemaname = %s AND tablename = %s"
                           " AND attname = 'partition')", (tables.schema, f"{tables.segment_prefix}{index}")
                           ).fetchone()
    return bool(row and row[0])


def test_batch_write_gives_a_new_segment_column_statistics(spark: SparkSession, dsn: str) -> None:
    """Without statistics a new segment looks empty to the planner and a poll sorts whole partitions: a
    Spark write, like every writer, ANALYZEs the segments it filled enough once its rows are committed."""
    with pgstreams.connect(dsn) as client:
        client.create_topic("analysed", 2)
    assert not segment_has_stats(dsn, "analysed", 0)
    df = spark.range(5000).selectExpr("CAST(id AS string) AS value", "CAST(id % 97 AS string) AS key")
    df.write.format("pgstreams").option("dsn", dsn).option("topic", "analysed").mode("append").save()
    assert segment_has_stats(dsn, "analysed", 0)


def test_vectorised_partitioner_matches_partition_for_key() -> None:
    import pyarrow as pa

    keys = ["", "a", "ab", "abc", "abcd", "abcde", "user-123", "ünïcødé", "x" * 37, None, "k9"]
    got = Partitioner(7, 0).assign(None, pa.array(keys, pa.string()), len(keys))
    for key, p in zip(keys, got, strict=True):
        if key is not None:
            assert p == pgstreams.partition_for_key(key, 7), key


def test_bad_options_and_columns_fail_at_analysis_naming_them(
        spark: SparkSession, dsn: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("PGSTREAMS_DSN", raising=False)
    with pgstreams.connect(dsn) as client:
        client.create_topic("known", 1)

    def fails(match: str, fn: Callable[[], Any]) -> None:
        with pytest.raises(Exception, match=match):
            fn()

    fails("option 'dsn': shard 1: invalid DSN", lambda: spark.read.format("pgstreams").option(
        "dsn", f"{dsn},host='unterminated").option("topic", "known").load())
    fails("option 'topic'", lambda: spark.read.format("pgstreams").option("dsn", dsn).load())
    fails("topic.*'nope'.*do not exist", lambda: reader(spark, dsn, "nope"))
    fails("option 'startingOffsets' is not valid JSON",
          lambda: reader(spark, dsn, "known", startingOffsets="{bad json"))
    fails("option 'endingOffsets'.*-2",
          lambda: reader(spark, dsn, "known", endingOffsets='{"known": {"0": -2}}'))
    fails("option 'maxEventsPerTrigger' must be a positive integer",
          lambda: reader(spark, dsn, "known", stream=True, maxEventsPerTrigger="zero"))
    writer = spark.createDataFrame([(1,)], "value int").write.format("pgstreams").mode("append")
    fails("column 'value' must be binary or string",
          lambda: writer.option("dsn", dsn).option("topic", "known").save())
    ok = spark.createDataFrame([("v", 1)], "value string, key int").write.format("pgstreams").mode("append")
    fails("column 'key' must be string", lambda: ok.option("dsn", dsn).option("topic", "known").save())
    fine = spark.createDataFrame([("v",)], "value string").write.format("pgstreams")
    fails("topic.*'missing'.*do not exist", lambda: fine.mode("append").option("dsn", dsn)
          .option("topic", "missing").save())
    fails("append-only", lambda: fine.mode("overwrite").option("dsn", dsn).option("topic", "known").save())
    with psycopg.connect(dsn) as conn:
        assert conn.execute("SELECT count(*) FROM pgstreams.spark_sink_tasks").fetchone() == (0,)


# --------------------------------------------------------------------------------------------------------
# a query killed with SIGKILL mid-batch, restarted from its checkpoint

def test_query_killed_mid_batch_restarts_without_loss_or_duplicate(
        spark: SparkSession, dsn: str, tmp_path: Path) -> None:
    """The copying query's whole process (driver and Python workers) is killed with SIGKILL while its
    micro-batch 1 has one write task committed and the other in flight; restarted from its checkpoint
    (in this process's session), it copies every event exactly once and its group catches up."""
    checkpoint = tmp_path / "ck"
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src")}
    with pgstreams.connect(dsn) as client:
        client.create_topic("src", 2)
        client.create_topic("dst", 2)
        client.publish_many("src", [{"value": f"e{i}", "key": f"k{i % 29}"} for i in range(200)])
        visible(dsn)
        log = tmp_path / "query.log"
        with log.open("w") as out:
            proc = subprocess.Popen([sys.executable, str(ROOT / "tests" / "_spark_helpers.py"), dsn,
                                     str(checkpoint)], env=env, stdout=out, stderr=subprocess.STDOUT,
                                    start_new_session=True)
        try:
            def one_task_of_a_batch_committed() -> bool:
                if proc.poll() is not None:
                    raise AssertionError(f"the query process exited early:\n{log.read_text()[-3000:]}")
                with psycopg.connect(dsn) as conn:
                    rows = conn.execute("SELECT batch_id, count(*) FROM pgstreams.spark_sink_tasks "
                                        "GROUP BY batch_id ORDER BY batch_id DESC LIMIT 1").fetchall()
                return bool(rows) and rows[0][1] == 1 and rows[0][0] >= 1

            wait_for("a micro-batch with one committed write task", one_task_of_a_batch_committed,
                     timeout=180)
        finally:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(timeout=30)
        visible(dsn)
        partial = client.consumer("dst", "check").poll(1000, timeout=1)
        assert 100 < len(partial) < 200, len(partial)
        # the restart replays the in-flight micro-batch: its committed task publishes nothing again
        q = _spark_helpers.copy_query(spark, dsn, str(checkpoint)).trigger(availableNow=True).start()
        assert q.awaitTermination(180), "the restarted query did not finish"
        assert q.exception() is None
        visible(dsn)
        copied = [e.value for e in client.consumer("dst", "check2").poll(1000, timeout=1)]
        assert sorted(copied) == sorted(f"e{i}".encode() for i in range(200))
        assert sum(s.lag for s in client.describe_group("copier", "src")) == 0
