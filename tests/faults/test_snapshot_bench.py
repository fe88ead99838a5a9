"""The held-snapshot benchmark, quick (``python -m bench.snapshot --quick``): while a REPEATABLE READ
transaction holds the xmin horizon, producers, a consumer, a worker group and a share worker run without an
error, and pgstreams' own tables keep few dead row versions: a fraction of the events for every table, and
one per publish for a SQL producer's state (migration 0019: one update per publish, not two)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.timeout(600)
def test_a_held_snapshot_leaves_a_bounded_number_of_dead_tuples_in_pgstreams_tables() -> None:
    done = subprocess.run([sys.executable, "-m", "bench.snapshot", "--quick", "--holds", "repeatable-read",
                           "--raw", "1", "--json"], cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-2000:]
    (line,) = [x for x in done.stdout.splitlines() if x.startswith("{")]
    result = json.loads(line)
    free, held = result["runs"]
    assert held["hold"] == "repeatable-read"
    for run in (free, held):
        assert run["raised"] == 0 and run["failed_services"] == 0, run["errors"]
        assert run["published"] > 0 and run["consumed"] > 0 and run["handled"] > 0 and run["shared"] > 0
    totals, dead = held["totals"], held["dead_tuples"]
    published = totals["publish"] + totals["publish_many"] + totals["sql_publish"]
    assert {"checkpoints", "leases", "members", "producers", "share_partitions"} <= set(dead)
    # a row version per checkpoint commit, heartbeat, lease change or share-group step: a consumer that
    # commits every poll keeps one per partition moved, far below one per event
    assert all(n <= published / 4 for n in dead.values()), dead
    # a SQL producer's publish updates its row once (it was twice before 0019)
    assert dead["producers"] <= totals["sql_publish"] + 5, (dead, totals)
