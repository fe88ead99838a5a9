"""``pgstreams worker --share-group`` and ``pgstreams groups describe`` of share groups, through real
subprocesses."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import pgstreams
from _core_helpers import until

TESTS = Path(__file__).resolve().parents[1]
CLI = [sys.executable, "-m", "pgstreams.cli"]


def cli(dsn: str, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*CLI, *args, "--dsn", dsn], capture_output=True, text=True, timeout=60, cwd=TESTS)


def test_worker_runs_a_share_group_and_groups_describe_shows_it(dsn: str, tmp_path: Path) -> None:
    from workers_app import create_tables  # tests/ is on sys.path

    create_tables(dsn)
    with pgstreams.connect(dsn) as client:
        client.create_topic("t", 1)
        client.publish_many("t", [{"value": i} for i in range(40)])
        log = open(tmp_path / "worker.log", "wb")
        procs = [subprocess.Popen(
            [*CLI, "worker", "workers_app:record_tx", "--topic", "t", "--share-group", "sg",
             "--concurrency", "3", "--mode", "transactional", "--lock-timeout", "7.5", "--dsn", dsn],
            cwd=TESTS, stdout=subprocess.DEVNULL, stderr=log, env=dict(os.environ, WORKERS_APP_NAME=f"w{i}"))
            for i in range(2)]
        try:
            def handled() -> int:
                with client.connection() as conn:
                    row = conn.execute("SELECT count(*) FROM handled").fetchone()
                return int(row[0]) if row else 0

            until(lambda: handled() == 40, 60, "40 events handled")
            rows: list[dict[str, Any]] = []

            def settled() -> bool:
                p = cli(dsn, "groups", "describe", "sg", "--json")
                assert p.returncode == 0, p.stderr
                rows[:] = json.loads(p.stdout)
                return bool(rows) and rows[0]["acquired"] == 0 and rows[0]["available"] == 0

            until(settled, 15, "no event in flight")
            [row] = rows
            assert row["type"] == "share" and row["group"] == "sg" and row["frontier"] == 40
            assert row["dead_lettered"] == 0 and row["oldest_lock"] is None
            assert row["lock_timeout"] == 7.5 and row["lost_events"] == 0
            table = subprocess.run([*CLI, "groups", "describe", "sg", "--dsn", dsn], capture_output=True,
                                   text=True, timeout=60, cwd=TESTS, env=dict(os.environ, COLUMNS="200"))
            assert table.returncode == 0 and "frontier" in table.stdout and "oldest lock" in table.stdout
        finally:
            for p in procs:
                p.send_signal(signal.SIGTERM)
            for p in procs:
                assert p.wait(30) == 0


def test_bad_worker_options_exit_non_zero_without_a_traceback(dsn: str) -> None:
    with pgstreams.connect(dsn) as client:
        client.create_topic("t")
    for args, words in [
        (["--topic", "t", "--group", "g", "--share-group", "s"], "exactly one"),
        (["--topic", "t"], "exactly one"),
        (["--topic", "t", "--group", "g", "--concurrency", "2"], "--share-group"),
        (["--topic", "t", "--share-group", "s", "--concurrency", "0"], "concurrency"),
        (["--topic", "t", "--share-group", "bad name!"], "group"),
        (["--topic", "missing", "--share-group", "s"], "missing"),
        (["--topic", "t", "--group", "g", "--lock-timeout", "5"], "--lock-timeout needs --share-group"),
        (["--topic", "t", "--share-group", "s", "--lock-timeout", "0"], "lock_timeout"),
        (["--topic", "t", "--share-group", "s", "--lock-timeout", "-2"], "lock_timeout"),
        (["--topic", "t", "--share-group", "s", "--lock-timeout", "soon"], "--lock-timeout"),
    ]:
        p = cli(dsn, "worker", "workers_app:record", *args)
        assert p.returncode != 0, args
        assert "Traceback" not in p.stderr, p.stderr
        assert words in p.stderr, (args, p.stderr)
    with pgstreams.connect(dsn) as client:
        assert client.store.shares.groups() == []  # nothing changed
