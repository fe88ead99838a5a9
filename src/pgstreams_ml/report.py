"""The demo's report: the summary table (rich) and PNG plots of the online metrics (matplotlib, Agg)."""

from __future__ import annotations

from datetime import datetime
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table

from .latency import STAGES, percentile


def _f(v: Any, digits: int = 3) -> str:
    if v is None:
        return "-"
    if isinstance(v, bool):
        return "yes" if v else "no"
    if isinstance(v, float):
        return f"{v:.{digits}f}"
    return str(v)


def _mark(ok: bool | None) -> str:
    return "[green]PASS[/green]" if ok else ("[red]FAIL[/red]" if ok is not None else "-")


def print_summary(summary: dict[str, Any], console: Console) -> None:
    """Print the demo summary as tables."""
    t = Table(title="Events per topic", title_justify="left")
    t.add_column("topic")
    t.add_column("events", justify="right")
    for topic, n in summary["events"].items():
        t.add_row(topic, f"{n:,}")
    console.print(t)

    r = summary["reconciliation"]
    t = Table(
        title="Clean pipeline reconciliation (raw = clean + quarantined + duplicates dropped)",
        title_justify="left",
    )
    for c in ("raw", "clean", "quarantined", "duplicates dropped", "exact"):
        t.add_column(c, justify="right")
    t.add_row(
        f"{r['raw']:,}",
        f"{r['clean']:,} / {r['expected_clean']:,}",
        f"{r['quarantined']:,} / {r['expected_malformed']:,}",
        f"{r['dropped_duplicates']:,} / {r['expected_duplicates']:,}",
        _mark(r["ok"]),
    )
    console.print(t)
    if r["quarantined_by_reason"]:
        console.print(
            "  quarantined by reason: "
            + ", ".join(f"{k} {v}" for k, v in sorted(r["quarantined_by_reason"].items()))
        )
    for p in r.get("problems", []):
        console.print(f"  [red]{p}[/red]")

    t = Table(title="Pipelines", title_justify="left")
    for c in ("pipeline", "kind", "events in", "busy s", "events/s", "lag at end"):
        t.add_column(c, justify="right" if c not in ("pipeline", "kind") else "left")
    for name, p in summary["pipelines"].items():
        t.add_row(
            name,
            p.get("kind", ""),
            f"{p.get('rows', 0):,}",
            _f(p.get("seconds"), 1),
            _f(p.get("rows_per_s"), 0),
            _f(p.get("lag")),
        )
    console.print(t)

    t = Table(title="Models (offline: holdout; oracle on the same rows)", title_justify="left")
    for c in (
        "model",
        "trained on",
        "status",
        "holdout AUC",
        "oracle AUC",
        "gap",
        "log loss",
        "calibration",
        "decision",
    ):
        t.add_column(c)
    for m in summary["models"]:
        t.add_row(
            str(m["model_id"]),
            m["train_range"],
            m["status"],
            _f(m["auc"]),
            _f(m["oracle_auc"]),
            _f(m["gap"]),
            _f(m["log_loss"]),
            _f(m["calibration"], 2),
            m["decision"],
        )
    console.print(t)

    t = Table(
        title="Online (predictions joined with outcomes; oracle on the same rows)", title_justify="left"
    )
    for c in ("model", "period", "scored", "online AUC", "oracle AUC", "log loss"):
        t.add_column(c)
    for o in summary["online"]:
        t.add_row(
            str(o["model_id"]),
            o.get("period", "all"),
            f"{o['rows']:,}",
            _f(o["auc"]),
            _f(o["oracle_auc"]),
            _f(o["log_loss"]),
        )
    console.print(t)

    lat = summary.get("latency")
    if lat:
        t = Table(
            title="Latency (s) from the events' timestamps: impression stored in the raw topic -> clean "
            "topic -> prediction",
            title_justify="left",
        )
        for c in ("stage", "impressions", "p50", "p95", "p99", "max"):
            t.add_column(c, justify="left" if c == "stage" else "right")
        for stage, st in lat.items():
            t.add_row(stage, f"{st['count']:,}", _f(st["p50"]), _f(st["p95"]), _f(st["p99"]), _f(st["max"]))
        console.print(t)

    d = summary["drift"]
    console.print(
        f"Drift injected at: {d['injected_at'] or 'never'}; detected: {_f(d['detected'])}"
        + (
            f" (window starting {d['flagged_window']}, "
            f"{d['windows_after_change']} window(s) after the change)"
            if d["detected"]
            else ""
        )
        + f"; false alarms before it: {d['false_alarms']}"
    )
    q = summary["quality"]
    t = Table(title="Quality bars", title_justify="left")
    t.add_column("bar")
    t.add_column("value")
    t.add_column("result")
    for name, item in q.items():
        t.add_row(name, item["value"], _mark(item["ok"]))
    bar = summary.get("latency_bar")
    if bar is not None:  # beside the quality bars, with the conditions it was measured in
        value = f"{bar['value']}; {bar['conditions']}" + (f"; {bar['tail']}" if bar.get("tail") else "")
        t.add_row(f"{bar['bar']} (latency)", value, _mark(bar["ok"]))
    console.print(t)
    console.print(f"Wall time {summary['wall_seconds']:.0f} s. Plots: " + ", ".join(summary["plots"]))


def plot_online(
    metrics: list[dict[str, Any]],
    oracle: dict[tuple[datetime, int], float | None],
    sim_start: datetime,
    drift_at: datetime | None,
    deployments: list[tuple[datetime, int]],
    out: Path,
) -> Path:
    """Plot AUC (with the oracle's), log loss, calibration and the largest feature PSI per complete window and
    model into ``out`` (PNG); return the path."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(4, 1, figsize=(10, 11), sharex=True)
    metrics = [m for m in metrics if m["complete"]]
    models = sorted({m["model_id"] for m in metrics})

    def hours(t: datetime) -> float:
        return (t - sim_start).total_seconds() / 3600.0

    panels = (
        ("auc", "AUC"),
        ("log_loss", "log loss"),
        ("calibration", "calibration (mean p / CTR)"),
        ("max_psi", "max feature PSI"),
    )
    for ax, (key, label) in zip(axes, panels, strict=True):
        for mid in models:
            rows = [m for m in metrics if m["model_id"] == mid and m[key] is not None]
            xs = [
                hours(m["window_start"]) + 0.5 * (m["window_end"] - m["window_start"]).total_seconds() / 3600
                for m in rows
            ]
            ax.plot(xs, [m[key] for m in rows], marker="o", label=f"model {mid}")
            bad = [(x, m[key]) for x, m in zip(xs, rows, strict=True) if m["degraded"]]
            if bad:
                ax.scatter(
                    [b[0] for b in bad],
                    [b[1] for b in bad],
                    s=90,
                    facecolors="none",
                    edgecolors="red",
                    zorder=5,
                    label="flagged degraded" if key == "auc" and mid == models[0] else None,
                )
            if key == "auc":
                ox = [(x, oracle.get((m["window_start"], mid))) for x, m in zip(xs, rows, strict=True)]
                ox = [(x, v) for x, v in ox if v is not None]
                if ox:
                    ax.plot(
                        [a for a, _ in ox],
                        [b for _, b in ox],
                        linestyle="--",
                        color="gray",
                        label="oracle" if mid == models[0] else None,
                    )
        if drift_at is not None:
            ax.axvline(hours(drift_at), color="red", linestyle=":", label="drift" if key == "auc" else None)
        for when, mid in deployments:
            ax.axvline(
                hours(when),
                color="green",
                linestyle="-.",
                alpha=0.6,
                label=f"deploy {mid}" if key == "auc" else None,
            )
        if key == "calibration":
            ax.axhline(1.0, color="black", linewidth=0.5)
        ax.set_ylabel(label)
        ax.grid(alpha=0.3)
    axes[0].legend(fontsize=8, loc="lower left")
    axes[-1].set_xlabel("simulated hours since start")
    fig.suptitle("Online evaluation of the deployed model per window")
    fig.tight_layout()
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=90)
    plt.close(fig)
    return out


def plot_reliability(models: list[dict[str, Any]], out: Path) -> Path:
    """Reliability diagrams (holdout) of the models; return the path."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 6))
    ax.plot([0, 1], [0, 1], color="gray", linestyle="--", label="perfect")
    for m in models:
        rel = m.get("reliability") or []
        ax.plot(
            [r["mean_p"] for r in rel], [r["rate"] for r in rel], marker="o", label=f"model {m['model_id']}"
        )
    ax.set_xlabel("mean predicted probability")
    ax.set_ylabel("observed click rate")
    ax.set_title("Holdout calibration")
    ax.legend()
    ax.grid(alpha=0.3)
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=90)
    plt.close(fig)
    return out


def plot_latency(samples: list[Any], out: Path, bucket: float = 5.0, tail: dict[str, Any] | None = None
                 ) -> Path:
    """Plot the latency of every scored impression over the run (``samples``: :class:`ImpressionTimes` of
    :mod:`pgstreams_ml.latency`): end to end per impression as dots, and per ``bucket`` seconds (default
    5) of wall time the p50 and p99 of each stage, with the causes of the slow predictions (``tail``: of
    :func:`pgstreams_ml.latency.tail_causes`) in a corner; return the path."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(10, 5))
    if samples:
        t0 = samples[0].raw
        xs = [(s.raw - t0).total_seconds() for s in samples]
        e2e = [(s.prediction - s.raw).total_seconds() for s in samples]
        ax.scatter(xs, e2e, s=2, alpha=0.25, color="gray", label="raw -> prediction, per impression")
        buckets: dict[int, list[Any]] = {}
        for x, s in zip(xs, samples, strict=True):
            buckets.setdefault(int(x // bucket), []).append(s)
        keys = sorted(buckets)
        mids = [(k + 0.5) * bucket for k in keys]
        for (name, a, b), color in zip(STAGES, ("tab:blue", "tab:green", "black"), strict=True):
            for q, style in ((50, "-"), (99, "--")):
                ys = [
                    percentile(sorted((getattr(s, b) - getattr(s, a)).total_seconds() for s in buckets[k]), q)
                    or 0.0
                    for k in keys
                ]
                ax.plot(mids, ys, style, color=color, linewidth=1.2, label=f"{name} p{q}")
    ax.axhline(1.0, color="red", linestyle=":", linewidth=1, label="1 s")
    if tail is not None:
        lines = [f"over {tail['threshold_s']:g} s: {tail['slow']:,} of {tail['of']:,} predictions"]
        lines += [f"  {cause}: {n:,}" for cause, n in tail["causes"].items()]
        ax.axhline(tail["threshold_s"], color="orange", linestyle=":", linewidth=1,
                   label=f"{tail['threshold_s']:g} s")
        ax.text(0.01, 0.02, "\n".join(lines), transform=ax.transAxes, fontsize=7, va="bottom",
                bbox={"facecolor": "white", "alpha": 0.8, "edgecolor": "lightgray"})
    ax.set_xlabel(f"wall seconds since the first scored impression (percentiles per {bucket:g} s)")
    ax.set_ylabel("seconds")
    ax.set_yscale("log")
    ax.set_title("Latency of the serving path over the run")
    ax.legend(fontsize=7, loc="upper right", ncol=2)
    ax.grid(alpha=0.3, which="both")
    fig.tight_layout()
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=90)
    plt.close(fig)
    return out
