"""Maintenance scheduling: the leader among worker processes, and pg_cron on a PostgreSQL 15 cluster of the
test's own with ``shared_preload_libraries=pg_cron`` (Debian's postgresql-15-cron, installed here when
missing: a missing package is a failure, not a skip)."""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import textwrap
from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest

import pgstreams
import pgstreams.maintenance
from _core_helpers import until

PG_BIN = Path("/usr/lib/postgresql/15/bin")
PG_CRON = Path("/usr/lib/postgresql/15/lib/pg_cron.so")

LEADER_APP = textwrap.dedent("""
    import sys, time
    import pgstreams
    from pgstreams.maintenance import MaintenanceService
    client = pgstreams.connect(sys.argv[1])
    svc = MaintenanceService(client, 0.2)
    svc.start()
    said = False
    while True:
        if svc.leader and not said:
            print("LEADER", flush=True)
            said = True
        if svc.died:
            raise SystemExit(f"maintenance service died: {svc.error}")
        time.sleep(0.05)
""")


def test_exactly_one_of_three_workers_runs_maintenance_and_another_takes_over(
    dsn: str, tmp_path: Path
) -> None:
    pgstreams.connect(dsn).close()  # migrated
    app = tmp_path / "leader_app.py"
    app.write_text(LEADER_APP)
    procs = [subprocess.Popen([sys.executable, str(app), dsn], stdout=subprocess.PIPE) for _ in range(3)]
    try:
        for p in procs:
            assert p.stdout is not None
            os.set_blocking(p.stdout.fileno(), False)
        said: dict[int, str] = {i: "" for i in range(3)}

        def leaders() -> list[int]:
            for i, p in enumerate(procs):
                assert p.stdout is not None
                try:
                    chunk = os.read(p.stdout.fileno(), 4096)
                except BlockingIOError:
                    chunk = b""
                said[i] += chunk.decode()
            return [i for i in range(3) if "LEADER" in said[i]]

        until(lambda: len(leaders()) >= 1, 60, "a leader")
        with psycopg.connect(dsn) as conn:
            first = conn.execute("SELECT ran_at FROM pgstreams.maintenance").fetchone()
        until(lambda: _ran_after(dsn, first), 30, "the leader runs passes")
        assert len(leaders()) == 1
        leader = leaders()[0]
        procs[leader].send_signal(signal.SIGKILL)
        procs[leader].wait(10)
        until(lambda: len(leaders()) == 2, 60, "another process takes over")
        with psycopg.connect(dsn) as conn:
            mark = conn.execute("SELECT ran_at FROM pgstreams.maintenance").fetchone()
        until(lambda: _ran_after(dsn, mark), 30, "the new leader runs passes")
        assert all(p.poll() is None for i, p in enumerate(procs) if i != leader)
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
            p.wait(10)


def _ran_after(dsn: str, before: tuple[object, ...] | None) -> bool:
    with psycopg.connect(dsn) as conn:
        row = conn.execute("SELECT ran_at FROM pgstreams.maintenance").fetchone()
    return (
        row is not None and row[0] is not None and (before is None or before[0] is None or row[0] > before[0])
    )


def _ensure_pg_cron() -> None:
    """Install Debian's postgresql-15-cron when it is missing; fail loudly when that is impossible."""
    if PG_CRON.exists():
        return
    if shutil.which("apt-get") is None or os.geteuid() != 0:
        pytest.fail(
            "pg_cron (postgresql-15-cron) is missing and cannot be installed here (needs apt-get as root)"
        )
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    cmd = ["apt-get", "install", "-y", "-q", "postgresql-15-cron"]
    done = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=900)
    if done.returncode != 0:
        subprocess.run(["apt-get", "update", "-q"], env=env, capture_output=True, text=True, timeout=900)
        done = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=900)
    if done.returncode != 0 or not PG_CRON.exists():
        pytest.fail(f"apt-get install postgresql-15-cron failed: {done.stderr.strip()[-500:]}")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture(scope="module")
def cron_server() -> Iterator[str]:
    """A PostgreSQL 15 cluster of this module's own with pg_cron loaded (background workers, database
    ``postgres``). PostgreSQL refuses to run as root: the cluster runs as the ``postgres`` user."""
    _ensure_pg_cron()
    root = Path(tempfile.mkdtemp(prefix="pgstreams-cron-"))
    data = root / "data"
    as_postgres = ["runuser", "-u", "postgres", "--"] if os.geteuid() == 0 else []
    if as_postgres:
        shutil.chown(root, "postgres", "postgres")
    port = _free_port()
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
