"""Model-quality metrics in plain Python: AUC (exact and from score histograms), log loss, calibration,
population stability index (PSI) and the degradation rule of the online monitor."""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field

#: Probabilities are clipped to [EPS, 1 - EPS] for log loss.
EPS = 1e-7
#: Histogram bins for online AUC: the score's logit in [-HIST_RANGE, HIST_RANGE] in steps of HIST_STEP.
HIST_RANGE = 8.0
HIST_STEP = 0.02


def auc(scores: Sequence[float], labels: Sequence[int]) -> float | None:
    """Area under the ROC curve (ties count one half); ``None`` without both classes."""
    pairs = sorted(zip(scores, labels, strict=True), key=lambda t: t[0])
    pos = sum(1 for _, y in pairs if y)
    neg = len(pairs) - pos
    if pos == 0 or neg == 0:
        return None
    rank_sum, i, n = 0.0, 0, len(pairs)
    while i < n:
        j = i
        while j + 1 < n and pairs[j + 1][0] == pairs[i][0]:
            j += 1
        avg_rank = (i + j) / 2.0 + 1.0
        rank_sum += avg_rank * sum(1 for k in range(i, j + 1) if pairs[k][1])
        i = j + 1
    return (rank_sum - pos * (pos + 1) / 2.0) / (pos * neg)


def log_loss(probs: Sequence[float], labels: Sequence[int]) -> float | None:
    """Mean negative log-likelihood; ``None`` for no rows."""
    if not probs:
        return None
    total = 0.0
    for p, y in zip(probs, labels, strict=True):
        p = min(max(p, EPS), 1 - EPS)
        total -= math.log(p) if y else math.log(1 - p)
    return total / len(probs)


def hist_bin(p: float) -> int:
    """The histogram bin of probability ``p`` (by its logit)."""
    p = min(max(p, EPS), 1 - EPS)
    z = min(max(math.log(p / (1 - p)), -HIST_RANGE), HIST_RANGE - 1e-9)
    return int((z + HIST_RANGE) / HIST_STEP)


def auc_from_hist(hist: Mapping[int, Sequence[float]]) -> float | None:
    """AUC from a histogram ``{bin: (negatives, positives, ...)}``; rows sharing a bin count as ties."""
    pos = sum(v[1] for v in hist.values())
    neg = sum(v[0] for v in hist.values())
    if pos <= 0 or neg <= 0:
        return None
    below_neg, acc = 0.0, 0.0
    for b in sorted(hist):
        n_b, p_b = hist[b][0], hist[b][1]
        acc += p_b * (below_neg + 0.5 * n_b)
        below_neg += n_b
    return acc / (pos * neg)


def ece_from_hist(hist: Mapping[int, Sequence[float]], bins: int = 10) -> float | None:
    """Expected calibration error over ``bins`` (default 10) equal-width probability bins, from a histogram
    ``{bin: (negatives, positives, sum_p)}``."""
    groups: dict[int, list[float]] = {}
    for b, (n_neg, n_pos, s_p) in ((b, v[:3]) for b, v in hist.items()):
        z = -HIST_RANGE + (b + 0.5) * HIST_STEP
        p_mid = 1 / (1 + math.exp(-z))
        g = min(int(p_mid * bins), bins - 1)
        acc = groups.setdefault(g, [0.0, 0.0, 0.0])
        acc[0] += n_neg + n_pos
        acc[1] += n_pos
        acc[2] += s_p
    total = sum(v[0] for v in groups.values())
    if total <= 0:
        return None
    return sum(abs(v[2] - v[1]) for v in groups.values()) / total


def calibration_table(
    probs: Sequence[float], labels: Sequence[int], bins: int = 10
) -> list[dict[str, float]]:
    """Reliability table: per equal-width bin with rows, ``{bin, n, mean_p, rate}``."""
    acc: dict[int, list[float]] = {}
    for p, y in zip(probs, labels, strict=True):
        g = min(int(p * bins), bins - 1)
        a = acc.setdefault(g, [0.0, 0.0, 0.0])
        a[0] += 1
        a[1] += p
        a[2] += y
    return [{"bin": g, "n": a[0], "mean_p": a[1] / a[0], "rate": a[2] / a[0]} for g, a in sorted(acc.items())]


def ece(probs: Sequence[float], labels: Sequence[int], bins: int = 10) -> float | None:
    """Expected calibration error over ``bins`` equal-width bins (default 10)."""
    table = calibration_table(probs, labels, bins)
    n = sum(r["n"] for r in table)
    return None if n == 0 else sum(r["n"] * abs(r["mean_p"] - r["rate"]) for r in table) / n


def distribution(values: Iterable[str]) -> dict[str, float]:
    """Relative frequency of each value."""
    counts: dict[str, float] = {}
    for v in values:
        counts[v] = counts.get(v, 0.0) + 1
    total = sum(counts.values())
    return {k: c / total for k, c in counts.items()} if total else {}


def psi(reference: Mapping[str, float], counts: Mapping[str, float], floor: float = 1e-4) -> float | None:
    """Population stability index of observed ``counts`` against ``reference`` frequencies (both over the same
    buckets; missing buckets count as ``floor``). Above 0.2 is usually read as a significant shift."""
    total = sum(counts.values())
    if total <= 0 or not reference:
        return None
    out = 0.0
    for k in set(reference) | set(counts):
        e = max(reference.get(k, 0.0), floor)
        a = max(counts.get(k, 0.0) / total, floor)
        out += (a - e) * math.log(a / e)
    return out


def auc_standard_error(auc_value: float, positives: int, negatives: int) -> float:
    """Hanley and McNeil's standard error of an AUC estimated on ``positives`` and ``negatives`` rows."""
    a = min(max(auc_value, 1e-6), 1 - 1e-6)
    q1, q2 = a / (2 - a), 2 * a * a / (1 + a)
    var = (a * (1 - a) + (positives - 1) * (q1 - a * a) + (negatives - 1) * (q2 - a * a)) / max(
        1, positives * negatives
    )
    return math.sqrt(max(var, 0.0))


@dataclass(frozen=True)
class DegradationRule:
    """When a window counts as degraded, relative to the deployed model's offline holdout metrics.

    A metric must move by more than its tolerance *and* by more than ``sigmas`` (3) standard errors of the
    window's estimate, so small windows do not raise false alarms: AUC below the baseline by ``auc_drop``
    (0.05; standard error by Hanley and McNeil); log loss above it by ``log_loss_rise`` (15%; standard
    error taken as 1/sqrt(rows)); calibration ratio (mean prediction / click rate) outside
    [``calibration_low`` 0.75, ``calibration_high`` 1.33] (standard error of its logarithm taken as
    1/sqrt(clicks)). Feature drift when a monitored input's PSI exceeds ``psi_threshold`` (0.2). Windows
    with fewer than ``min_rows`` (300) rows or ``min_clicks`` (50) clicks are not judged.
    """

    auc_drop: float = 0.05
    log_loss_rise: float = 0.15
    calibration_low: float = 0.75
    calibration_high: float = 1.33
    psi_threshold: float = 0.2
    sigmas: float = 3.0
    min_rows: int = 300
    min_clicks: int = 50


@dataclass
class WindowVerdict:
    """The outcome of judging one window."""

    degraded: bool = False
    drift: bool = False
    reasons: list[str] = field(default_factory=list)


def judge(
    rule: DegradationRule,
    baseline: Mapping[str, float],
    n: int,
    clicks: int,
    auc_value: float | None,
    log_loss_value: float | None,
    calibration: float | None,
    max_psi: float | None,
) -> WindowVerdict:
    """Apply ``rule`` to one window's metrics against ``baseline`` (``auc`` and ``log_loss`` keys)."""
    v = WindowVerdict()
    if max_psi is not None and max_psi > rule.psi_threshold:
        v.drift = True
        v.reasons.append(f"feature drift (PSI {max_psi:.2f})")
    if n < rule.min_rows or clicks < rule.min_clicks:
        return v
    b_auc, b_ll = baseline.get("auc"), baseline.get("log_loss")
    if auc_value is not None and b_auc is not None:
        drop = max(rule.auc_drop, rule.sigmas * auc_standard_error(b_auc, clicks, n - clicks))
        if auc_value < b_auc - drop:
            v.degraded = True
            v.reasons.append(f"AUC {auc_value:.3f} < baseline {b_auc:.3f} - {drop:.3f}")
    if log_loss_value is not None and b_ll is not None:
        rise = max(b_ll * rule.log_loss_rise, rule.sigmas / math.sqrt(n))
        if log_loss_value > b_ll + rise:
            v.degraded = True
            v.reasons.append(f"log loss {log_loss_value:.3f} > baseline {b_ll:.3f} + {rise:.3f}")
    if calibration is not None and calibration > 0:
        noise = rule.sigmas / math.sqrt(clicks)
        low = min(math.log(rule.calibration_low), -noise)
        high = max(math.log(rule.calibration_high), noise)
        if not low <= math.log(calibration) <= high:
            v.degraded = True
            v.reasons.append(
                f"calibration {calibration:.2f} outside [{math.exp(low):.2f}, {math.exp(high):.2f}]"
            )
    return v
