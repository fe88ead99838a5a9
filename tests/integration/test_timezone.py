"""A session TimeZone of America/Chicago changes nothing: timestamps are UTC, time seeks select right."""

from __future__ import annotations

from datetime import datetime, timedelta, timezone
from zoneinfo import ZoneInfo

import psycopg
from psycopg.conninfo import make_conninfo

import pgstreams
from _core_helpers import take

CHICAGO = "-c TimeZone=America/Chicago"


def test_chicago_session_reads_and_seeks_in_utc(dsn: str) -> None:
    chicago_dsn = make_conninfo(dsn, options=CHICAGO)
    with pgstreams.connect(chicago_dsn) as client, psycopg.connect(chicago_dsn, autocommit=True) as conn, \
            psycopg.connect(dsn, autocommit=True) as utc_conn:
        utc_conn.execute("SET TimeZone = 'UTC'")
        assert conn.execute("SHOW TimeZone").fetchone() == ("America/Chicago",)
        with client.connection() as pooled:
            assert pooled.execute("SHOW TimeZone").fetchone() == ("America/Chicago",)
        client.create_topic("t", 2)
        assert client.list_topics()[0].created_at.utcoffset() == timedelta(0)

        def db_now() -> datetime:
            row = utc_conn.execute("SELECT clock_timestamp()").fetchone()
            assert row is not None
            return row[0]

        t0 = db_now()
        for i in range(4):
            client.publish("t", f"a{i}", key=str(i))  # pooled, autocommit
        with conn.transaction():
            for i in range(4):
                client.publish("t", f"a-tx{i}", key=str(i), conn=conn)  # the caller's Chicago session
        t1 = db_now()
        for i in range(4):
            client.publish("t", f"b{i}", key=str(i))
        client.publish_many("t", [{"value": f"b-many{i}", "key": str(i)} for i in range(4)])
        t2 = db_now()

        events = take(client.consumer("t", "all"), 16, commit=True)
        for e in events:
            assert e.created_at.tzinfo is not None and e.created_at.utcoffset() == timedelta(0)
            lo, hi = (t0, t1) if e.value.startswith("a") else (t1, t2)
            assert lo <= e.created_at <= hi, (e.value, e.created_at, lo, hi)
        # the stored instants are those a UTC session reads
        stored = dict(utc_conn.execute(
            "SELECT position, created_at FROM pgstreams.topic_1 ORDER BY position").fetchall())
        assert {e.position: e.created_at for e in events} == stored

        a_values = sorted(f"a{i}" for i in range(4)) + sorted(f"a-tx{i}" for i in range(4))
        b_values = sorted(f"b{i}" for i in range(4)) + sorted(f"b-many{i}" for i in range(4))
        # t1 written as UTC, as Chicago wall time and as a fixed offset all select the b events
        for n, when in enumerate((t1, t1.astimezone(ZoneInfo("America/Chicago")),
                                  t1.astimezone(timezone(timedelta(hours=9, minutes=30))))):
            got = take(client.consumer("t", f"from{n}", start=when), 8)
            assert sorted(e.value for e in got) == sorted(b_values), when
            c = client.consumer("t", f"seek{n}")
            c.seek_to_time(when)
            assert sorted(e.value for e in take(c, 8)) == sorted(b_values), when
            c.seek_to_time(t0.astimezone(ZoneInfo("America/Chicago")))
            assert sorted(e.value for e in take(c, 16)) == sorted(a_values + b_values)
        # the gotcha: the same wall-clock time read as naive local time is hours away, and is refused
        naive_chicago = t1.astimezone(ZoneInfo("America/Chicago")).replace(tzinfo=None)
        try:
            client.consumer("t", "naive", start=naive_chicago)
        except pgstreams.InvalidArgument:
            pass
        else:
            raise AssertionError("a naive datetime was accepted")
        # group status timestamps are UTC too
        assert all(s.updated_at.utcoffset() == timedelta(0) for s in client.describe_group("all"))
