"""The fault benchmark's kill scenario, short: ``pg_terminate_backend`` of a random pgstreams session every
200 ms while producers (single and batch), a consumer, a transactional worker group and an at-least-once
worker group run. Nothing lost or duplicated, every event handled exactly once by the transactional group
and at least once by the other, no call raised and no service failed. ``python -m bench.faults`` runs it
for 30 s (docs/benchmarks.md)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.timeout(600)
def test_killed_sessions_lose_nothing_and_the_transactional_group_handles_each_event_once() -> None:
    done = subprocess.run([sys.executable, "-m", "bench.faults", "--quick", "--only", "kill", "--json"],
                          cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-2000:]
    (line,) = [x for x in done.stdout.splitlines() if x.startswith("{")]
    counts = json.loads(line)
    assert counts["published"] > 0 and counts["extra"]["sessions_killed"] > 5
    assert counts["lost"] == 0 and counts["duplicated"] == 0 and counts["stored"] == counts["published"]
    assert counts["handled"] == counts["published"] and counts["handled_twice"] == 0
    assert counts["handled_at_least_once"] == counts["published"] and counts["lost_by_at_least_once"] == 0
    assert counts["consumed"] == counts["published"]
    assert counts["raised"] == 0 and counts["failed_services"] == 0
