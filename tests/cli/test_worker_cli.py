"""``pgstreams worker`` and the membership columns of ``pgstreams groups describe``, through real
subprocesses."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

import pgstreams
from _core_helpers import until

TESTS = Path(__file__).resolve().parents[1]
CLI = [sys.executable, "-m", "pgstreams.cli"]


def cli(dsn: str, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*CLI, *args, "--dsn", dsn], capture_output=True, text=True, timeout=60, cwd=TESTS)


def describe(dsn: str) -> list[dict[str, Any]]:
    p = cli(dsn, "groups", "describe", "g", "--json")
    assert p.returncode == 0, p.stderr
    return list(json.loads(p.stdout))


def test_worker_command_runs_a_handler_and_groups_describe_shows_its_leases(dsn: str, tmp_path: Path) -> None:
    from workers_app import create_tables  # tests/ is on sys.path

    create_tables(dsn)
    with pgstreams.connect(dsn) as client:
        client.create_topic("t", 3)
        client.publish_many("t", [{"value": i} for i in range(30)])
        log = open(tmp_path / "worker.log", "wb")
        proc = subprocess.Popen(
            [*CLI, "worker", "workers_app:record_tx", "--topic", "t", "--group", "g",
             "--mode", "transactional", "--heartbeat-interval", "0.2", "--session-timeout", "1.5",
             "--member-id", "cli-1", "--dsn", dsn],
            cwd=TESTS, stdout=subprocess.DEVNULL, stderr=log, env=dict(os.environ, WORKERS_APP_NAME="cli-1"))
        try:
            def handled() -> int:
                with client.connection() as conn:
                    row = conn.execute("SELECT count(*) FROM handled").fetchone()
                return int(row[0]) if row else 0

            until(lambda: handled() == 30, 30, "30 events handled")
            owned = [(0, "cli-1", 0, False), (1, "cli-1", 0, False), (2, "cli-1", 0, False)]
            seen: list[dict[str, Any]] = []

            def all_owned() -> bool:  # the last commit lands just after the last handler call
                seen[:] = describe(dsn)
                return [(r["partition"], r["owner"], r["lag"], r["stale"]) for r in seen] == owned

            until(all_owned, 15, "cli-1 owning every partition with lag 0")
            rows = seen
            assert all(r["last_heartbeat"] and r["retry_state"] is None for r in rows)
            table = cli(dsn, "groups", "describe", "g").stdout
            assert "owner" in table and "cli-1" in table and "member cli-1 on t: partitions 0, 1, 2" in table

            proc.send_signal(signal.SIGSTOP)  # no heartbeats: after the session timeout the owner is stale
            try:
                until(lambda: all(r["stale"] for r in describe(dsn)), 10, "the stale flag")
                assert "stale" in cli(dsn, "groups", "describe", "g").stdout
            finally:
                proc.send_signal(signal.SIGCONT)
            proc.send_signal(signal.SIGTERM)
            assert proc.wait(20) == 0, (tmp_path / "worker.log").read_text()
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
            log.close()
    rows = describe(dsn)
    assert all(r["owner"] is None and r["lag"] == 0 for r in rows), rows
    assert "stopped" in (tmp_path / "worker.log").read_text()


@pytest.mark.parametrize("args, fragment", [
    (("worker", "workers_app", "--topic", "t", "--group", "g"), "MODULE:FUNCTION"),
    (("worker", "no_such_module_zz:f", "--topic", "t", "--group", "g"), "cannot import"),
    (("worker", "workers_app:record", "--topic", "t", "--group", "g", "--mode", "sometimes"), "mode"),
    (("worker", "workers_app:record", "--topic", "t", "--group", "g", "--min-events", "0"), "min_events"),
    (("worker", "workers_app:record", "--topic", "t", "--group", "g", "--dead-letter", "x",
      "--no-dead-letter"), "exclude"),
    (("worker", "workers_app:record", "--topic", "bad topic", "--group", "g"), "invalid topic name"),
    (("worker", "workers_app:record", "--topic", "t", "--group", "g", "--session-timeout", "0.1"),
     "at least twice"),
    (("worker", "workers_app:record", "--topic", "t", "--group", "g", "--session-timeout", "-1"),
     "session_timeout"),
    (("worker", "workers_app:record", "--topic", "t", "--group", "g", "--heartbeat-interval", "0"),
     "heartbeat_interval"),
    (("worker", "workers_app:record", "--topic", "t", "--group", "g", "--max-events", "-1"), "max_events"),
    (("worker", "workers_app:record", "--topic", "t", "--group", "g", "--min-events", "5", "--max-events",
      "2"), "must not exceed"),
    (("worker", "workers_app:record", "--topic", "t", "--group", "g", "--max-wait", "-1"), "max_wait"),
    (("worker", "workers_app:record", "--topic", "t", "--group", "g", "--max-attempts", "0"), "max_attempts"),
    (("worker", "workers_app:record", "--topic", "t", "--group", "g", "--member-id", ""), "member_id"),
    (("worker", "workers_app:record", "--topic", "t", "--group", "g", "--mode", "transactional"),
     "handler(event, conn)"),
    (("worker", "workers_app:record_tx", "--topic", "t", "--group", "g"), "handler(event)"),
    (("worker", "workers_app:NAME", "--topic", "t", "--group", "g"), "not callable"),
    (("worker", "workers_app:record", "--topic", "missing", "--group", "g"), "does not exist"),
])
def test_worker_command_rejects_bad_input(dsn: str, args: tuple[str, ...], fragment: str) -> None:
    with pgstreams.connect(dsn) as client:
        client.create_topic("t", 1)
    p = cli(dsn, *args)
    lines = p.stderr.strip().splitlines()
    assert p.returncode == (1 if fragment == "does not exist" else 2), p.stderr
    assert len(lines) == 1 and lines[0].startswith("error: ") and fragment in lines[0], p.stderr
    with pgstreams.connect(dsn) as client:
        assert not pgstreams.group_members(client, "g")
        assert not client.list_groups(), "no checkpoints were created"
