"""The observability benchmark, ``python -m bench.obs``, run as a real subprocess in its tiny mode: it
completes, prints both tables and drops its database. Figures are not asserted (the machine is shared;
the benchmark's own bars are about them)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import psycopg

ROOT = Path(__file__).resolve().parents[2]


def test_bench_obs_quick_run_completes_and_cleans_up(server_dsn: str) -> None:
    done = subprocess.run([sys.executable, "-m", "bench.obs", "--quick", "--markdown", "--dsn", server_dsn],
                          cwd=ROOT, capture_output=True, text=True, timeout=600,
                          env=dict(os.environ, COLUMNS="200"))
    assert done.returncode == 0, done.stderr[-3000:]
    out = done.stdout
    assert "**async vs sync client**" in out and "**metrics scrape at 20 topics and 5 groups**" in out
    for name in ("single publish", "publish_many", "poll + commit"):
        assert f"| {name} |" in out
    with psycopg.connect(server_dsn, autocommit=True) as conn:
        left = conn.execute("SELECT datname FROM pg_database "
                            "WHERE datname LIKE 'pgstreams_bench_obs%'").fetchall()
    assert left == []
