"""The demo's summary: events, reconciliation, pipelines, models, online metrics against the oracle, drift
detection, latency and the quality bars, assembled when a run is done, with its plots, and written to
``<reports>/summary.json``."""

from __future__ import annotations

import json
import os
import time
from dataclasses import asdict
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Any

from .. import _sql, audit, latency, registry, report

if TYPE_CHECKING:
    from .runner import Demo


def summarise(demo: Demo) -> dict[str, Any]:
    """The summary of ``demo``'s run (done: every pipeline drained); also written, with the plots, to the
    reports folder."""
    opts, topo, client = demo.opts, demo.topo, demo.client
    summary: dict[str, Any] = {"options": {k: str(v) for k, v in asdict(opts).items()}}
    summary["events"] = {t: client.describe_topic(t).events for t in topo.topics}
    rec = audit.reconcile(client, topo)
    summary["reconciliation"] = asdict(rec) | {"ok": rec.ok}
    pipes: dict[str, Any] = {}
    st = demo.serving.status() if demo.serving is not None else None
    if st is not None:
        pipes["clean"] = {
            "kind": "Spark streaming (own process)",
            "rows": st.rows,
            "seconds": st.busy_seconds,
            "rows_per_s": st.rows / st.busy_seconds if st.busy_seconds else None,
            "lag": demo.lag(topo.clean_group),
            "batches": st.batches,
        }
    for name, q in demo.queries.items():
        progs = q.recentProgress
        rows = sum(int(p.get("numInputRows", 0)) for p in progs)
        secs = sum(float(p.get("durationMs", {}).get("triggerExecution", 0)) for p in progs) / 1000.0
        group = {"clean": topo.clean_group, "join": topo.join_group, "monitor": topo.monitor_group}[name]
        pipes[name] = {
            "kind": "Spark streaming",
            "rows": rows,
            "seconds": secs,
            "rows_per_s": rows / secs if secs else None,
            "lag": demo.lag(group),
            "batches": len(progs),
        }
    wstats = [w.stats.snapshot() for w in demo.workers]
    if demo.serving is None:
        scored = sum(sc.counts["scored"] for sc in demo.scorers)
        scorer_rows = sum(w.get("events", 0) for w in wstats[1:])
    else:  # the scorer processes: what their group committed, and what they published
        scored = summary["events"][topo.predictions_topic]
        scorer_rows = summary["events"][topo.clean_topic] - (demo.lag(topo.scorer_group) or 0)
    pipes["enrichment"] = {
        "kind": "worker group",
        "rows": wstats[0].get("events", 0),
        "seconds": None,
        "rows_per_s": None,
        "lag": demo.lag(topo.enrichment_group),
    }
    pipes["scoring"] = {
        "kind": f"worker group x{opts.scorers}" + (" (own processes)" if demo.serving else ""),
        "rows": scorer_rows,
        "seconds": None,
        "rows_per_s": None,
        "lag": demo.lag(topo.scorer_group),
        "predictions": scored,
    }
    summary["pipelines"] = pipes
    with client.connection() as conn:
        records = {r.model_id: r for r in registry.list_models(conn, topo.schema)}
    models = []
    for m in demo.state.models:
        rec_m = records.get(m["model_id"])
        models.append(
            {k: v for k, v in m.items() if k != "reliability"}
            | {"status": rec_m.status if rec_m else "?"}
        )
    summary["models"] = models
    online = []
    drift_time = demo.sim_config.drift_time
    for mid in sorted({m["model_id"] for m in demo.state.models if m["promoted"]}):
        online.append({"model_id": mid, "period": "all"} | audit.online_vs_oracle(client, topo, mid))
        if drift_time is not None:
            for period, lo, hi in (("before drift", None, drift_time), ("after drift", drift_time, None)):
                o = audit.online_vs_oracle(client, topo, mid, lo, hi)
                if o["rows"]:
                    online.append({"model_id": mid, "period": period} | o)
    summary["online"] = online
    with client.connection() as conn:
        cur = conn.execute(_sql.q("online_metrics", topo.schema))
        cols = [c.name for c in cur.description or ()]
        metrics = [dict(zip(cols, r, strict=True)) for r in cur.fetchall()]
    drift_at = demo.sim_config.drift_time
    win = timedelta(seconds=opts.window_seconds)
    false_alarms = sum(
        1
        for m in metrics
        if m["complete"] and m["degraded"] and (drift_at is None or m["window_end"] <= drift_at)
    )
    flagged = demo.state.flagged_window
    after = None
    if flagged is not None and drift_at is not None:
        change_window = demo.start + win * ((drift_at - demo.start) // win)
        after = int((flagged - change_window) // win)
    summary["drift"] = {
        "injected_at": drift_at.isoformat() if drift_at else None,
        "detected": flagged is not None and drift_at is not None,
        "flagged_window": flagged.isoformat() if flagged else None,
        "windows_after_change": after,
        "false_alarms": false_alarms,
    }
    summary["serving"] = {
        "mode": opts.serving_mode,
        "background_nice": opts.background_nice if demo.serving is not None else 0,
    }
    if st is not None and st.batches:
        summary["serving"]["clean_batch_ms"] = {
            k: round(v / st.batches, 1) for k, v in sorted(st.phases_ms.items())
        }
        summary["serving"]["clean_rows_per_batch"] = round(st.rows / st.batches, 1)
    summary["quality"] = _quality(demo, summary)
    lat = latency.measure(client, topo)
    summary["latency"] = lat.to_json()
    summary["latency_bar"] = _latency_bar(summary)
    # the slow predictions, each attributed to its cause (the clean query's micro-batches as its process
    # logged them; a run whose clean query ran in the demo's own session has no log)
    tail = latency.tail_causes(lat.samples, st.batch_log if st is not None else [])
    summary["latency_tail"] = tail
    summary["latency_bar"]["tail"] = latency.tail_text(tail)
    oracle = audit.oracle_by_window(client, topo)
    plots = [
        report.plot_online(
            metrics,
            oracle,
            demo.start,
            drift_at,
            demo.state.deployments,
            opts.reports / "online_metrics.png",
        ),
        report.plot_reliability(demo.state.models, opts.reports / "calibration.png"),
        report.plot_latency(lat.samples, opts.reports / "latency.png", tail=tail),
    ]
    summary["plots"] = [str(p) for p in plots]
    summary["windows"] = [
        {k: (v.isoformat() if isinstance(v, datetime) else v) for k, v in m.items()}
        | {"oracle_auc": oracle.get((m["window_start"], m["model_id"]))}
        for m in metrics
    ]
    summary["wall_seconds"] = time.monotonic() - demo.t0
    opts.reports.mkdir(parents=True, exist_ok=True)
    (opts.reports / "summary.json").write_text(json.dumps(summary, indent=2, default=str))
    return summary


def _quality(demo: Demo, summary: dict[str, Any]) -> dict[str, dict[str, Any]]:
    q: dict[str, dict[str, Any]] = {}
    rec = summary["reconciliation"]
    q["clean counts reconcile exactly"] = {
        "ok": rec["ok"],
        "value": "exact" if rec["ok"] else "; ".join(rec["problems"]),
    }
    first = demo.state.models[0] if demo.state.models else None
    gap1 = first["gap"] if first else None
    q["v1 holdout AUC within 0.03 of oracle"] = {
        "ok": gap1 is not None and abs(gap1) <= 0.03,
        "value": _gap_text(first),
    }
    if demo.sim_config.drift_at is not None:
        after = summary["drift"]["windows_after_change"]
        q["drift flagged within 3 windows"] = {
            "ok": after is not None and 0 <= after <= 3,
            "value": "not flagged" if after is None else f"{after} window(s)",
        }
        re = demo.state.models[-1] if len(demo.state.models) > 1 else None
        q["retrained AUC within 0.03 of new oracle"] = {
            "ok": re is not None and re["gap"] is not None and abs(re["gap"]) <= 0.03 and re["promoted"],
            "value": _gap_text(re) + ("" if re is None or re["promoted"] else " (not deployed)"),
        }
    return q


#: The serving path's bar: impression -> prediction p99 under this many seconds.
LATENCY_BAR_SECONDS = 1.0


def _latency_bar(summary: dict[str, Any]) -> dict[str, Any]:
    """The latency bar (shown with the quality bars, not one of them: ``--strict`` does not fail on it, as
    it depends on the machine): impression -> prediction p99 under :data:`LATENCY_BAR_SECONDS`, with the
    conditions of the run (cores, load average at its end, where the serving path ran)."""
    e2e = summary["latency"].get("raw -> prediction") or {}
    p99, p50, n = e2e.get("p99"), e2e.get("p50"), e2e.get("count", 0)
    serving = summary["serving"]
    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else float("nan")
    conditions = (f"{os.cpu_count()} cores, load average {load:.1f} at the end, serving path in "
                  f"{serving['mode']} (rest niced by {serving['background_nice']})")
    return {
        "bar": f"impression -> prediction p99 under {LATENCY_BAR_SECONDS:g} s",
        "ok": p99 is not None and p99 < LATENCY_BAR_SECONDS,
        "value": "no predictions" if p99 is None else f"p99 {p99:.2f} s, p50 {p50:.2f} s ({n:,} impressions)",
        "conditions": conditions,
    }


def _gap_text(m: dict[str, Any] | None) -> str:
    if m is None or m.get("auc") is None or m.get("oracle_auc") is None:
        return "no model"
    return f"model {m['auc']:.3f} vs oracle {m['oracle_auc']:.3f}"
