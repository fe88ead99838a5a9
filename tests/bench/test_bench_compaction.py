"""The compaction benchmark, ``python -m bench.compaction``, run as a real subprocess in a tiny mode: it
compacts the day-old segments, reports every measurement with its raw baseline, leaves no dead tuple in the
topic's tables, and drops its database. Rates are not asserted (the machine is shared; the benchmark's own
bars are about them)."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import psycopg

ROOT = Path(__file__).resolve().parents[2]


def _databases(server_dsn: str) -> set[str]:
    with psycopg.connect(server_dsn, autocommit=True) as conn:
        return {r[0] for r in conn.execute("SELECT datname FROM pg_database WHERE datname LIKE "
                                           "'pgstreams_bench_compaction%'").fetchall()}


def test_compaction_benchmark_compacts_reports_every_measurement_and_cleans_up(server_dsn: str) -> None:
    before = _databases(server_dsn)
    env = {k: v for k, v in os.environ.items() if k != "PGSTREAMS_DSN"}
    proc = subprocess.run([sys.executable, "-m", "bench.compaction", "--dsn", server_dsn, "--events", "40000",
                           "--keys", "400", "--backlog", "5000", "--segment-events", "10000", "--window", "1",
                           "--producers", "1", "--markdown"],
                          cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    # 1 means a bar was missed, which timing on a shared machine may cause
    assert proc.returncode in (0, 1), proc.stdout[-3000:] + proc.stderr[-3000:]
    rows = {line.split(" | ")[0][2:]: line for line in proc.stdout.splitlines() if line.startswith("| ")}
    full = next(r for name, r in rows.items() if name.startswith("full compaction of 40,000 events"))
    # the 4 day-old segments mapped and rewritten: all but the last event of each key removed
    assert "4 segments, 39,600 removed" in full and "duty 0.5" in full
    dead = rows["dead tuples in the topic's tables after compaction"]
    assert re.search(r"\| 0 rows \|", dead) and "key map:" in dead
    for name in ("publish rate during compaction", "poll rate during compaction"):
        assert any(n.startswith(name) and "without compaction (before and after)" in r
                   for n, r in rows.items()), name
    assert any(n.startswith("raw: the same by one DELETE") for n in rows)
    assert _databases(server_dsn) == before
