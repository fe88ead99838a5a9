"""The Kafka gateway's benchmark, ``python -m bench.kafka``, run as a real subprocess in a tiny mode: it
starts the gateway as ``pgstreams kafka serve``, prints every measurement with its baseline, and drops its
database. Figures are not asserted (the machine is shared; the benchmark's own floors are about them)."""

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
                                           "'pgstreams_bench_kafka%'").fetchall()}


def test_kafka_benchmark_runs_every_measurement_and_cleans_up(server_dsn: str) -> None:
    before = _databases(server_dsn)
    env = {k: v for k, v in os.environ.items() if k != "PGSTREAMS_DSN"}
    proc = subprocess.run([sys.executable, "-m", "bench.kafka", "--dsn", server_dsn, "--events", "3000",
                           "--rounds", "1", "--rate", "200", "--duration", "1", "--markdown"],
                          cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    rows = [line for line in proc.stdout.splitlines() if line.startswith("| ")]
    produce = next(r for r in rows if r.startswith("| produce through the gateway"))
    consume = next(r for r in rows if r.startswith("| consume through the gateway"))
    assert "events/s" in produce and "publish_many" in produce and ">= 0.5" in produce
    assert "events/s" in consume and "poll_batch" in consume
    for linger in ("5", "0"):
        line = f"| produce-to-consume p99 at 200 events/s, linger.ms={linger} |"
        assert any(r.startswith(line) for r in rows), line
    assert _databases(server_dsn) == before
