"""The share-groups benchmark, ``python -m bench.shares``, run as a real subprocess in a tiny mode: it
completes, prints every measurement with its raw baseline, and drops its database. Figures are not
asserted (the machine is shared; the benchmark's own bars are about them)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import psycopg

ROOT = Path(__file__).resolve().parents[2]


def _databases(server_dsn: str) -> set[str]:
    with psycopg.connect(server_dsn, autocommit=True) as conn:
        return {r[0] for r in conn.execute("SELECT datname FROM pg_database WHERE datname LIKE "
                                           "'pgstreams_bench_shares%'").fetchall()}


def test_share_benchmark_runs_every_measurement_and_cleans_up(server_dsn: str) -> None:
    before = _databases(server_dsn)
    env = {k: v for k, v in os.environ.items() if k != "PGSTREAMS_DSN"}
    proc = subprocess.run([sys.executable, "-m", "bench.shares", "--dsn", server_dsn, "--duration", "0.5",
                           "--events", "5000", "--work-events", "200", "--rounds", "1", "--markdown"],
                          cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    # 1 means a bar was missed, which timing on a shared machine may cause
    assert proc.returncode in (0, 1), proc.stderr
    rows = [line for line in proc.stdout.splitlines() if line.startswith("| ") and "events/s" in line]
    assert len([r for r in rows if r.startswith("| acks/s")]) == 4
    assert all("seed 000" in r for r in rows if r.startswith("| acks/s"))
    assert any(r.startswith("| share workers, 4 processes") for r in rows)
    assert "publish-to-acquire p99" in proc.stdout
    assert _databases(server_dsn) == before
