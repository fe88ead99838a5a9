"""The audit: checks that look behind the curtain (the simulator's ledger and the hidden oracle), which no
pipeline reads. Used by the demo's summary and by the tests of the quality bars."""

from __future__ import annotations

import json
from collections import Counter
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

import pgstreams

from . import _sql
from . import metrics as M
from ._util import read_committed
from .config import Topology


@dataclass
class Reconciliation:
    """Raw records against the clean and quarantine topics and the simulator's ledger.

    ``ok`` holds when: every clean event of the ledger is in the clean topic exactly once and nothing else
    is; every malformed record is quarantined exactly once with the reason the ledger expects; and the raw
    records neither cleaned nor quarantined are exactly the ledger's duplicates.
    """

    raw: int = 0
    clean: int = 0
    quarantined: int = 0
    dropped_duplicates: int = 0
    expected_clean: int = 0
    expected_malformed: int = 0
    expected_duplicates: int = 0
    quarantined_by_reason: dict[str, int] = field(default_factory=dict)
    expected_by_reason: dict[str, int] = field(default_factory=dict)
    missing_clean: int = 0
    unexpected_clean: int = 0
    repeated_clean: int = 0
    wrong_reason: int = 0
    missing_quarantine: int = 0
    problems: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        """Whether every count reconciles exactly."""
        return not self.problems


def _read_all(client: pgstreams.Client, topic: str, group: str) -> list[pgstreams.Event]:
    return read_committed(client, topic, group)


def reconcile(client: pgstreams.Client, topo: Topology, audit_group: str = "ml-audit") -> Reconciliation:
    """Reconcile the clean pipeline's outputs with the ledger (reads the three topics from the start as
    ``audit_group``)."""
    r = Reconciliation()
    raw = _read_all(client, topo.raw_topic, audit_group)
    clean = _read_all(client, topo.clean_topic, audit_group)
    quarantine = _read_all(client, topo.quarantine_topic, audit_group)
    r.raw, r.clean, r.quarantined = len(raw), len(clean), len(quarantine)
    with client.connection() as conn:
        ledger = conn.execute(_sql.q("ledger", topo.schema)).fetchall()
    expected_clean = Counter(eid for _s, eid, verdict, _r in ledger if verdict == "clean")
    malformed = {str(seq): reason for seq, _e, verdict, reason in ledger if verdict == "malformed"}
    r.expected_clean = sum(expected_clean.values())
    r.expected_malformed = len(malformed)
    r.expected_duplicates = sum(1 for row in ledger if row[2] == "duplicate")
    r.expected_by_reason = dict(Counter(malformed.values()))
    got_clean = Counter(e.event_id for e in clean)
    r.repeated_clean = sum(c - 1 for c in got_clean.values() if c > 1)
    r.missing_clean = sum(1 for k in expected_clean if k not in got_clean)
    r.unexpected_clean = sum(1 for k in got_clean if k not in expected_clean)
    seen: Counter[str] = Counter()
    reasons: Counter[str] = Counter()
    for e in quarantine:
        seq = e.headers.get("seq", "")
        reason = e.headers.get("reason", "")
        reasons[reason] += 1
        seen[seq] += 1
        if malformed.get(seq) != reason:
            r.wrong_reason += 1
    r.quarantined_by_reason = dict(reasons)
    r.missing_quarantine = sum(1 for s in malformed if s not in seen)
    r.dropped_duplicates = r.raw - r.clean - r.quarantined
    if r.raw != len(ledger):
        r.problems.append(f"raw topic holds {r.raw} records, the ledger {len(ledger)}")
    for name in ("missing_clean", "unexpected_clean", "repeated_clean", "wrong_reason", "missing_quarantine"):
        if getattr(r, name):
            r.problems.append(f"{name.replace('_', ' ')}: {getattr(r, name)}")
    if any(c > 1 for c in seen.values()):
        r.problems.append("a raw record was quarantined more than once")
    if r.dropped_duplicates != r.expected_duplicates:
        r.problems.append(
            f"{r.dropped_duplicates} records dropped, the ledger has {r.expected_duplicates} duplicates"
        )
    return r


def oracle_auc(client: pgstreams.Client, topo: Topology, start: datetime, end: datetime) -> dict[str, Any]:
    """The oracle's AUC (true click probability against the pipeline's labels) on the enriched training
    examples with ``start <= ts < end``, i.e. the rows a model trained or evaluated on that range used."""
    with client.connection() as conn:
        rows = conn.execute(_sql.q("oracle_on_examples", topo.schema), (start, end)).fetchall()
    return {"rows": len(rows), "auc": M.auc([r[0] for r in rows], [int(r[1]) for r in rows])}


def online_vs_oracle(
    client: pgstreams.Client,
    topo: Topology,
    model_id: int | None = None,
    start: datetime | None = None,
    end: datetime | None = None,
) -> dict[str, Any]:
    """Exact AUC and log loss of the online predictions (``scored_outcomes``) of ``model_id`` (default
    all) with ``start <= ts < end`` (default all), beside the oracle's AUC on the same rows."""
    with client.connection() as conn:
        rows = conn.execute(
            _sql.q("outcomes_with_oracle", topo.schema), (model_id, model_id, start, start, end, end)
        ).fetchall()
    p = [r[0] for r in rows]
    y = [int(r[1]) for r in rows]
    return {
        "rows": len(rows),
        "auc": M.auc(p, y),
        "log_loss": M.log_loss(p, y),
        "oracle_auc": M.auc([r[2] for r in rows], y),
    }


def oracle_by_window(client: pgstreams.Client, topo: Topology) -> dict[tuple[datetime, int], float | None]:
    """The oracle's AUC on the rows of each online-metrics window and model."""
    out: dict[tuple[datetime, int], float | None] = {}
    with client.connection() as conn:
        wins = conn.execute(_sql.q("online_metrics", topo.schema)).fetchall()
        for w in wins:
            rows = conn.execute(
                _sql.q("outcomes_with_oracle", topo.schema), (w[2], w[2], w[0], w[0], w[1], w[1])
            ).fetchall()
            out[(w[0], int(w[2]))] = M.auc([r[2] for r in rows], [int(r[1]) for r in rows])
    return out


def sim_run(client: pgstreams.Client, topo: Topology) -> dict[str, Any] | None:
    """The latest simulator run: parameters, simulated range, drift time and counts."""
    with client.connection() as conn:
        row = conn.execute(_sql.q("latest_sim_run", topo.schema)).fetchone()
    if row is None:
        return None
    counts = row[5] if isinstance(row[5], dict) or row[5] is None else json.loads(row[5])
    return {
        "run_id": row[0],
        "params": row[1],
        "sim_start": row[2],
        "sim_end": row[3],
        "drift_at": row[4],
        "counts": counts,
    }
