"""The hot queries use the read index on a 1,000,000-event topic: no sort, no scan of a whole partition."""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from typing import Any

import psycopg
import pytest
from psycopg import sql

import pgstreams
from pgstreams.storage import core_query as query

EVENTS = 1_000_000
PARTITIONS = 4
SEGMENT = 100_000
LIMIT = 500


def _nodes(plan: dict[str, Any]) -> Iterator[dict[str, Any]]:
    yield plan
    for child in plan.get("Plans", []):
        yield from _nodes(child)


def _explain(conn: psycopg.Connection, stmt: str | sql.Composable, params: Any = None,
             analyze: bool = True) -> dict[str, Any]:
    opts = "ANALYZE, BUFFERS, FORMAT JSON" if analyze else "FORMAT JSON"
    text = stmt if isinstance(stmt, str) else stmt.as_string(conn)
    row = conn.execute(f"EXPLAIN ({opts}) {text}", params).fetchone()  # type: ignore[call-overload]
    assert row is not None
    doc = row[0] if not isinstance(row[0], str) else json.loads(row[0])
    return doc[0]["Plan"]


@pytest.fixture
def big(server_dsn: str, template_db: str) -> Iterator[tuple[str, int]]:
    """A database with topic ``big`` holding 1,000,000 events over 4 partitions, in segments of 100,000
    positions, written by 200 transactions of 5,000 events."""
    import uuid

    from psycopg.conninfo import make_conninfo

    name = f"x_{uuid.uuid4().hex[:16]}"
    with psycopg.connect(server_dsn, autocommit=True) as conn:
        conn.execute(sql.SQL("CREATE DATABASE {} TEMPLATE {}").format(
            sql.Identifier(name), sql.Identifier(template_db)))
    dsn = make_conninfo(server_dsn, dbname=name)
    with pgstreams.connect(dsn) as client:
        client.create_topic("big", PARTITIONS, segment_size=SEGMENT)
    with psycopg.connect(dsn, autocommit=True) as conn:
        row = conn.execute("SELECT id FROM pgstreams.topics WHERE name = 'big'").fetchone()
        assert row is not None
        tid = int(row[0])
        conn.execute("SELECT pgstreams.ensure_segments(%s, %s)", (tid, EVENTS + SEGMENT))
        table = sql.Identifier("pgstreams", f"topic_{tid}")
        batch = 5000
        for b in range(EVENTS // batch):
            conn.execute(sql.SQL(
                "INSERT INTO {} (partition, kind, key, value)"
                " SELECT (g + %s) %% %s, 'b', 'k' || ((g + %s) %% 97),"
                " '\\x00112233445566778899'::bytea FROM generate_series(1, %s) g").format(table),
                (b, PARTITIONS, b, batch))
        conn.execute(sql.SQL("VACUUM ANALYZE {}").format(table))
    yield dsn, tid
    with psycopg.connect(server_dsn, autocommit=True) as conn:
        conn.execute(sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(name)))


def _read_indexes(conn: psycopg.Connection, tid: int) -> set[str]:
    rows = conn.execute(
        "SELECT c.relname FROM pg_inherits i JOIN pg_class c ON c.oid = i.inhrelid"
        " WHERE i.inhparent = format('pgstreams.%%I', %s::text)::regclass", (f"topic_{tid}_read_idx",)
    ).fetchall()
    return {r[0] for r in rows} | {f"topic_{tid}_read_idx"}


def _poll_params(stmt: str, cursors: dict[int, int]) -> dict[str, Any]:
    parts = sorted(cursors)
    values = {"partitions": parts, "positions": [cursors[p] for p in parts], "limit": LIMIT,
              "total": LIMIT + 1}
    names = set(re.findall(r"%\((\w+)\)s", stmt))
    unknown = names - set(values)
    assert not unknown, f"the poll query takes parameters this test does not know: {unknown}"
    return {n: values[n] for n in names}


def _load_fences(conn: psycopg.Connection, tid: int, cursors: dict[int, int]) -> None:
    """A poll's first statement: the fences its read takes."""
    conn.execute(query("load_fences", "pgstreams", tid), {"partitions": sorted(cursors)})


def _blocks(plan: dict[str, Any]) -> int:
    """Pages a plan touched (shared buffers hit or read, its children's included)."""
    return int(plan["Shared Hit Blocks"]) + int(plan["Shared Read Blocks"])


def _block_bound(segments: int) -> int:
    """Pages a poll of :data:`LIMIT` events may touch: a few per segment's index descent, and the heap and
    index pages of the rows read (the fixtures' rows of a partition share pages with the others'). A
    scan of a whole partition of one segment alone touches more."""
    return 4 * segments * PARTITIONS + LIMIT // 4


def _check_poll_plan(plan: dict[str, Any], indexes: set[str], tid: int) -> None:
    nodes = list(_nodes(plan))
    kinds = [n["Node Type"] for n in nodes]
    assert "Sort" not in kinds and "Incremental Sort" not in kinds, kinds
    scans = [n for n in nodes if n.get("Relation Name", "").startswith(f"topic_{tid}")]
    assert scans, "the plan does not read the topic"
    for n in scans:
        assert n["Node Type"] in ("Index Scan", "Index Only Scan"), (n["Node Type"], n.get("Relation Name"))
        assert n["Index Name"] in indexes, n["Index Name"]
    if "Actual Rows" in plan:
        read = sum(n["Actual Rows"] * n.get("Actual Loops", 1) for n in scans)
        assert read <= PARTITIONS * (LIMIT + EVENTS // SEGMENT + 2), f"{read} rows read for a poll of {LIMIT}"
        # rows an index scan skips inside the index are not counted above: the pages it touched are
        blocks = _blocks(plan)
        assert blocks <= _block_bound(EVENTS // SEGMENT + 2), f"{blocks} pages touched by a poll of {LIMIT}"


@pytest.mark.slow
def test_hot_queries_use_the_read_index_without_sorting(big: tuple[str, int]) -> None:
    dsn, tid = big
    with psycopg.connect(dsn, autocommit=True) as conn:
        indexes = _read_indexes(conn, tid)
        assert len(indexes) == 1 + EVENTS // SEGMENT + 2
        poll = query("poll", "pgstreams", tid).as_string(conn)
        mid = 600_002
        for cursors in (dict.fromkeys(range(PARTITIONS), 0),  # a new group
                        {0: 0, 1: 0, 2: mid, 3: 0},  # one partition midway
                        {2: mid}):  # a consumer of one partition
            params = _poll_params(poll, cursors)
            _load_fences(conn, tid, cursors)
            _check_poll_plan(_explain(conn, poll, params), indexes, tid)
            _check_poll_plan(_explain(conn, poll, params, analyze=False), indexes, tid)
        # the generic plan that a prepared statement settles on after a few executions
        names = sorted(set(re.findall(r"%\((\w+)\)s", poll)), key=poll.index)
        types = {"partitions": "int[]", "positions": "bigint[]", "limit": "int", "total": "int"}
        text = poll
        for i, n in enumerate(names, 1):
            text = text.replace(f"%({n})s", f"${i}")
        conn.execute(f"PREPARE poll_generic ({', '.join(types[n] for n in names)}) AS {text}")
        conn.execute("SET plan_cache_mode = force_generic_plan")
        params = _poll_params(poll, dict.fromkeys(range(PARTITIONS), 0))
        _load_fences(conn, tid, dict.fromkeys(range(PARTITIONS), 0))
        args = ", ".join(
            psycopg.sql.Literal(params[n]).as_string(conn) + "::" + types[n] for n in names)
        _check_poll_plan(_explain(conn, f"EXECUTE poll_generic ({args})"), indexes, tid)

    # describe and lag: heads are found through the index, not by sorting a partition
    with pgstreams.connect(dsn) as client:
        c = client.consumer("big", "g")
        c.commit(c.poll(max_events=1000, timeout=5))
        status = client.describe_group("g")
        assert sum(s.lag for s in status) == EVENTS - 1000
        assert all(s.head is not None for s in status)
        desc = client.describe_topic("big")
        assert desc.events == EVENTS


def test_poll_reads_in_order_segments_without_statistics(dsn: str) -> None:
    """Segments that were never analyzed (new ones, until autovacuum gets to them) get default estimates:
    the poll must still read the index in order, from its cursor, without sorting."""
    segment, events = 20_000, 60_000
    with pgstreams.connect(dsn) as client:
        client.create_topic("fresh", PARTITIONS, segment_size=segment)
    with psycopg.connect(dsn, autocommit=True) as conn:
        row = conn.execute("SELECT id FROM pgstreams.topics WHERE name = 'fresh'").fetchone()
        assert row is not None
        tid = int(row[0])
        conn.execute("SELECT pgstreams.ensure_segments(%s, %s)", (tid, events + segment))
        parent = f"pgstreams.topic_{tid}"
        segments = [r[0] for r in conn.execute(
            "SELECT c.relname FROM pg_inherits i JOIN pg_class c ON c.oid = i.inhrelid"
            " WHERE i.inhparent = %s::regclass",
            (parent,))]
        for s in segments:
            conn.execute(sql.SQL("ALTER TABLE {} SET (autovacuum_enabled = false)").format(
                sql.Identifier("pgstreams", s)))
        conn.execute(sql.SQL(
            "INSERT INTO {} (partition, kind, key, value) SELECT g %% %s, 'b', 'k', '\\x00'::bytea"
            " FROM generate_series(1, %s) g").format(sql.Identifier("pgstreams", f"topic_{tid}")),
            (PARTITIONS, events))
        unanalyzed = conn.execute(
            "SELECT count(*) FROM pg_stats WHERE schemaname = 'pgstreams' AND tablename LIKE %s",
            (f"topic_{tid}_%",)).fetchone()
        assert unanalyzed == (0,), "the segments have statistics: this test needs them without"
        indexes = _read_indexes(conn, tid)
        poll = query("poll", "pgstreams", tid).as_string(conn)
        for cursors in (dict.fromkeys(range(PARTITIONS), 0), {2: 45_002}):
            params = _poll_params(poll, cursors)
            _load_fences(conn, tid, cursors)
            plan = _explain(conn, poll, params)
            kinds = [n["Node Type"] for n in _nodes(plan)]
            assert "Sort" not in kinds and "Bitmap Heap Scan" not in kinds, kinds
            assert plan["Actual Rows"] == LIMIT + (1 if len(cursors) > 1 else 0)
            assert _blocks(plan) <= _block_bound(len(segments)), f"{_blocks(plan)} pages touched"
        assert indexes
