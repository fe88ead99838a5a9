"""Maintenance scheduling: the leader among ``pgstreams worker`` processes, and pg_cron on a PostgreSQL 15
cluster of the test's own with ``shared_preload_libraries=pg_cron`` (Debian's postgresql-15-cron, installed
here when missing: a missing package is a failure, not a skip)."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest

import pgstreams
import pgstreams.maintenance
from _core_helpers import until
from _system import debian_package, free_port

PG_BIN = Path("/usr/lib/postgresql/15/bin")
PG_CRON = Path("/usr/lib/postgresql/15/lib/pg_cron.so")

HANDLER = "def handle(event):\n    pass\n"

#: The backends holding the schema's maintenance leader lock (a session advisory lock on two int4 keys).
LEADER_LOCK = """
SELECT l.pid FROM pg_locks l
 WHERE l.locktype = 'advisory' AND l.granted AND l.objsubid = 2
   AND l.database = (SELECT oid FROM pg_database WHERE datname = current_database())
   AND l.classid::bigint = (hashtext('pgstreams.maintenance-leader')::bigint & 4294967295)
   AND l.objid::bigint = (hashtext('pgstreams')::bigint & 4294967295)
"""


def _application_of(dsn: str, backend: int) -> str | None:
    """The application name of a backend (each worker process below names its own with ``PGAPPNAME``)."""
    with psycopg.connect(dsn, autocommit=True) as conn:
        row = conn.execute(
            "SELECT application_name FROM pg_stat_activity WHERE pid = %s", (backend,)
        ).fetchone()
    return None if row is None else str(row[0])


def test_exactly_one_of_three_workers_runs_maintenance_and_another_takes_over(
    dsn: str, tmp_path: Path
) -> None:
    """Three ``pgstreams worker`` processes: exactly one holds the leader lock (seen in pg_locks, mapped to
    its process by its connection's application name) and runs passes; SIGKILLed, another takes over;
    never two at once."""
    with pgstreams.connect(dsn) as client:
        client.create_topic("t", 2)
    (tmp_path / "leader_handlers.py").write_text(HANDLER)
    cmd = [sys.executable, "-m", "pgstreams.cli", "worker", "leader_handlers:handle", "--topic", "t",
           "--group", "g", "--maintenance-interval", "0.3", "--dsn", dsn]
    logs = [tmp_path / f"worker{i}.log" for i in range(3)]
    names = [f"maintenance-leader-test-{i}" for i in range(3)]
    procs = [subprocess.Popen(cmd, cwd=tmp_path, stdout=subprocess.DEVNULL, stderr=logs[i].open("wb"),
                              env={**os.environ, "PGAPPNAME": names[i]})
             for i in range(3)]
    holders_seen: list[int] = []

    def leader() -> int | None:
        """The index of the leading process (None: no leader now); at most one backend holds the lock."""
        with psycopg.connect(dsn, autocommit=True) as conn:
            backends = [int(r[0]) for r in conn.execute(LEADER_LOCK).fetchall()]
        holders_seen.append(len(backends))
        assert len(backends) <= 1, f"two maintenance leaders at once: {backends}"
        if not backends:
            return None
        name = _application_of(dsn, backends[0])
        return names.index(name) if name in names else None

    def runs_passes(who: int) -> None:
        """Passes are recorded while ``who`` leads, and nobody else leads meanwhile."""
        with psycopg.connect(dsn) as conn:
            mark = conn.execute("SELECT ran_at FROM pgstreams.maintenance").fetchone()
        until(lambda: leader() == who and _ran_after(dsn, mark), 60, f"process {who} runs passes")

    try:
        first: list[int | None] = [None]

        def found_first() -> bool:
            first[0] = leader()
            return first[0] is not None

        until(found_first, 90, "one of the worker processes leads maintenance")
        one = first[0]
        assert one is not None
        runs_passes(one)
        for _ in range(10):  # it keeps leading; the others do not
            assert leader() == one
        procs[one].send_signal(signal.SIGKILL)
        procs[one].wait(10)
        second: list[int | None] = [None]

        def taken_over() -> bool:
            second[0] = leader()
            return second[0] is not None

        until(taken_over, 60, "another worker process takes over")
        two = second[0]
        assert two is not None and two != one
        runs_passes(two)
        assert all(p.poll() is None for i, p in enumerate(procs) if i != one)
        assert max(holders_seen) == 1
        # the processes' own logs agree: the killed one and its successor said they lead, the third never
        said = [log.read_text() for log in logs]
        leads = [i for i in range(3) if "maintenance: this process leads" in said[i]]
        assert sorted(leads) == sorted([one, two]), said
    finally:
        for p in procs:
            if p.poll() is None:
                p.send_signal(signal.SIGTERM)
        for p in procs:
            try:
                p.wait(30)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait(10)


def _ran_after(dsn: str, before: tuple[object, ...] | None) -> bool:
    with psycopg.connect(dsn) as conn:
        row = conn.execute("SELECT ran_at FROM pgstreams.maintenance").fetchone()
    return (
        row is not None and row[0] is not None and (before is None or before[0] is None or row[0] > before[0])
    )


@pytest.fixture(scope="module")
def cron_server() -> Iterator[str]:
    """A PostgreSQL 15 cluster of this module's own with pg_cron loaded (background workers, database
    ``postgres``). PostgreSQL refuses to run as root: the cluster runs as the ``postgres`` user."""
    debian_package("postgresql-15-cron", PG_CRON)
    root = Path(tempfile.mkdtemp(prefix="pgstreams-cron-"))
    data = root / "data"
    as_postgres = ["runuser", "-u", "postgres", "--"] if os.geteuid() == 0 else []
    if as_postgres:
        shutil.chown(root, "postgres", "postgres")
    port = free_port()
    subprocess.run(
        [*as_postgres, str(PG_BIN / "initdb"), "-D", str(data), "--auth=trust", "-U", "postgres"],
        check=True,
        capture_output=True,
        timeout=120,
    )
    opts = (
        f"-h 127.0.0.1 -p {port} -k {root} -c shared_preload_libraries=pg_cron "
        "-c cron.database_name=postgres -c cron.use_background_workers=on -c max_worker_processes=20 "
        "-c fsync=off"
    )
    subprocess.run(
        [
            *as_postgres,
            str(PG_BIN / "pg_ctl"),
            "-D",
            str(data),
            "-w",
            "-o",
            opts,
            "-l",
            str(root / "server.log"),
            "start",
        ],
        check=True,
        capture_output=True,
        timeout=120,
    )
    try:
        base = f"postgresql://postgres@127.0.0.1:{port}/postgres"
        with psycopg.connect(base, autocommit=True) as conn:
            conn.execute("CREATE DATABASE app")
        yield f"postgresql://postgres@127.0.0.1:{port}/app"
    finally:
        subprocess.run(
            [*as_postgres, str(PG_BIN / "pg_ctl"), "-D", str(data), "-w", "-m", "fast", "stop"],
            capture_output=True,
            timeout=120,
        )
        shutil.rmtree(root, ignore_errors=True)


def test_pg_cron_job_runs_maintenance_in_the_database(cron_server: str) -> None:
    with pgstreams.connect(cron_server) as client:
        client.create_topic("cron", 1, config={"segment.events": 1000, "retention.events": 1000})
        client.publish_many("cron", [{"value": i} for i in range(3005)])
        cli = [sys.executable, "-m", "pgstreams.cli", "maintain", "--dsn", cron_server]
        bad = subprocess.run(
            [*cli, "--schedule", "--every", "soon"], capture_output=True, text=True, timeout=60
        )
        assert bad.returncode == 2 and "--every" in bad.stderr
        done = subprocess.run(
            [*cli, "--schedule", "--every", "1m"], capture_output=True, text=True, timeout=60
        )
        assert done.returncode == 0, done.stderr
        job = pgstreams.maintenance.scheduled_job(client)
        assert job is not None and job["database"] == "app" and job["schedule"] == "* * * * *"
        until(lambda: client.retention_status("cron")[0].segments_removed >= 2, 150, "pg_cron ran maintain()")
        assert client.store.operations.last_pass()["runner"] == "sql"  # type: ignore[index]
        gone = subprocess.run([*cli, "--unschedule"], capture_output=True, text=True, timeout=60)
        assert gone.returncode == 0, gone.stderr
        assert pgstreams.maintenance.scheduled_job(client) is None


def test_schedule_without_pg_cron_is_a_clear_error(dsn: str) -> None:
    done = subprocess.run(
        [sys.executable, "-m", "pgstreams.cli", "maintain", "--schedule", "--dsn", dsn],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 1 and "pg_cron is not loaded" in done.stderr and "Traceback" not in done.stderr
