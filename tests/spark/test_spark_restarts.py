"""A Spark ``availableNow`` stream meeting a PostgreSQL restart: the micro-batch in flight fails, and the
task retry (``local[2, 4]``: up to 4 attempts per task) or, without task retries (``local[2]``), a restart of
the query from its checkpoint finishes with every event copied exactly once.

The query runs in a process of its own (``tests/_spark_restart_query.py``: its own SparkSession, so its own
master) against a PostgreSQL of this module's own, restarted (immediate shutdown) while a write task of
micro-batch 1 is in its transaction (waiting for a lock the test holds, so the moment is certain).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import uuid
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest

import pgstreams
from _core_helpers import new_database
from pgstreams.embedded import TemporaryServer, restartable_server

pytestmark = [pytest.mark.spark, pytest.mark.timeout(900)]

ROOT = Path(__file__).resolve().parents[2]
EVENTS = 400  # 100 per micro-batch (copy_query's maxEventsPerTrigger): 4 micro-batches at least


@pytest.fixture(scope="module")
def server() -> Iterator[TemporaryServer]:
    with restartable_server({"fsync": "off"}) as srv:
        yield srv


@pytest.fixture
def db(server: TemporaryServer) -> str:
    return new_database(server.dsn, "s_")


def _values(dsn: str, topic: str) -> Counter[bytes]:
    """How many times each value is stored in ``topic``."""
    with pgstreams.connect(dsn) as c:
        consumer = c.consumer(topic, f"count-{uuid.uuid4().hex[:6]}")
        out: Counter[bytes] = Counter()
        while got := consumer.poll(max_events=1000, timeout=0.5):
            out.update(e.value for e in got)
            consumer.commit(got)
        return out


@pytest.mark.parametrize("master", ["local[2, 4]", "local[2]"], ids=["task-retry", "query-restart"])
def test_available_now_stream_meeting_a_restart_copies_every_event_once(
        server: TemporaryServer, db: str, tmp_path: Path, master: str) -> None:
    with pgstreams.connect(db) as client:
        client.create_topic("src", 2)
        client.create_topic("dst", 2)
        client.publish_many("src", [{"value": f"e{i}", "key": f"k{i % 29}"} for i in range(EVENTS)])
    markers = tmp_path / "markers"
    markers.mkdir()
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT / "src"), str(ROOT / "tests")])}
    log = tmp_path / "query.log"
    with log.open("w") as err:
        proc = subprocess.Popen([sys.executable, str(ROOT / "tests" / "_spark_restart_query.py"), db,
                                 str(tmp_path / "ck"), str(markers), master], env=env, stdout=subprocess.PIPE,
                                stderr=err, text=True)
    hold = None
    try:
        # the query's id (its sink id) is in the checkpoint from its start on, before micro-batch 0 ends
        metadata = tmp_path / "ck" / "metadata"
        deadline = time.monotonic() + 600
        while not metadata.exists() or not metadata.read_text().strip():
            assert proc.poll() is None, f"the query process exited early:\n{log.read_text()[-3000:]}"
            assert time.monotonic() < deadline, "the query never started"
            time.sleep(0.1)
        query_id = json.loads(metadata.read_text().splitlines()[0])["id"]
        # the trap: an uncommitted task row of micro-batch 1, input partition 1: that write task, in its
        # transaction, waits for this one (its claim of the same row) until the server goes down
        hold = psycopg.connect(db)
        hold.execute("INSERT INTO pgstreams.spark_sink_tasks (sink_id, batch_id, task_partition, topic_id) "
                     "SELECT %s, 1, 1, id FROM pgstreams.topics WHERE name = 'dst'", (f"query-{query_id}",))
        (markers / "locked").touch()
        with psycopg.connect(db, autocommit=True) as watch:
            while not watch.execute(
                    "SELECT count(*) FROM pg_locks l JOIN pg_stat_activity a USING (pid) WHERE NOT l.granted "
                    "AND a.datname = current_database() AND a.pid <> %s", (hold.info.backend_pid,)
                    ).fetchone()[0]:  # type: ignore[index]
                assert proc.poll() is None, f"the query process exited early:\n{log.read_text()[-3000:]}"
                assert time.monotonic() < deadline, "no write task of micro-batch 1 waited for the trap"
                time.sleep(0.1)
        server.restart("immediate", down=0.5)  # the waiting task's transaction dies with the server
        out, _ = proc.communicate(timeout=600)
    finally:
        if hold is not None:
            hold.close()
        if proc.poll() is None:
            proc.kill()
            proc.wait(60)
    assert proc.returncode == 0, log.read_text()[-3000:]
    runs = json.loads(out.strip().splitlines()[-1])["runs"]
    retried = sorted(p.name for p in markers.glob("retried-*"))
    if master == "local[2, 4]":
        # the failed task ran again within the same run of the query
        assert runs == 1 and any(r.startswith("retried-1-1-") for r in retried), (
            runs, retried, log.read_text()[-3000:])
    else:
        # no task retry: the micro-batch failed the query, which finished when started again
        assert runs == 2 and retried == [], (runs, retried, log.read_text()[-3000:])
    copied = _values(db, "dst")
    assert sorted(copied) == sorted(f"e{i}".encode() for i in range(EVENTS))  # none lost
    assert max(copied.values()) == 1  # none duplicated
    with pgstreams.connect(db) as client:
        assert sum(s.lag for s in client.describe_group("copier", "src")) == 0
