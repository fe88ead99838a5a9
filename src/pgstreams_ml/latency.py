"""Latency of the serving path, from the events' own timestamps: impression (raw) -> clean -> prediction.

Every event stored in a topic carries ``created_at``, the moment PostgreSQL stored it. An impression is
published to the raw topic by the simulator, republished to the clean topic by the clean pipeline (same
``event_id``) and answered by a prediction (event id ``pred:<impression_id>``) by a scoring worker. So,
per impression that was scored:

- ``raw -> clean``: clean ``created_at`` minus the raw ``created_at`` of its first raw record (a duplicate
  published later is dropped by the pipeline; the first one is the one that counts);
- ``clean -> prediction``: prediction ``created_at`` minus clean ``created_at``;
- ``raw -> prediction`` (end to end): the sum.

Impressions that were not scored (no model deployed yet, or not enriched yet) have no end-to-end latency
and are left out of every stage, so that the three stages describe the same impressions. The topics are
read from the beginning through the client as a group of their own (``ml-latency``), so this needs no
pipeline's help and can be run after the fact (``python -m pgstreams_ml latency``).
"""

from __future__ import annotations

import bisect
import json
import math
from collections import Counter
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from datetime import datetime
from typing import Any

import pgstreams

from ._util import read_committed
from .config import Topology

#: The stages reported, in order: (name, from, to).
STAGES: tuple[tuple[str, str, str], ...] = (
    ("raw -> clean", "raw", "clean"),
    ("clean -> prediction", "clean", "prediction"),
    ("raw -> prediction", "raw", "prediction"),
)
#: The end-to-end stage's name.
END_TO_END = "raw -> prediction"


@dataclass(frozen=True)
class LatencyStats:
    """Percentiles of one stage's latencies in seconds (nearest-rank; ``None`` without samples)."""

    count: int
    p50: float | None
    p95: float | None
    p99: float | None
    max: float | None


def percentile(sorted_values: Sequence[float], q: float) -> float | None:
    """The nearest-rank ``q``-th percentile (0 < q <= 100) of ``sorted_values`` (ascending)."""
    if not sorted_values:
        return None
    rank = max(1, math.ceil(q / 100.0 * len(sorted_values)))
    return sorted_values[rank - 1]


def stats(values: Sequence[float]) -> LatencyStats:
    """:class:`LatencyStats` of ``values`` (seconds)."""
    s = sorted(values)
    return LatencyStats(
        count=len(s),
        p50=percentile(s, 50),
        p95=percentile(s, 95),
        p99=percentile(s, 99),
        max=s[-1] if s else None,
    )


@dataclass(frozen=True)
class ImpressionTimes:
    """When one impression reached each topic."""

    impression_id: str
    raw: datetime
    clean: datetime
    prediction: datetime


@dataclass(frozen=True)
class LatencyReport:
    """Per-stage statistics and the per-impression times they come from (in raw-time order)."""

    stages: dict[str, LatencyStats]
    samples: list[ImpressionTimes]

    def to_json(self) -> dict[str, Any]:
        """The summary's form: per stage, the statistics (seconds)."""
        return {name: asdict(s) for name, s in self.stages.items()}


def report_of(samples: list[ImpressionTimes]) -> LatencyReport:
    """The report of ``samples``."""
    samples = sorted(samples, key=lambda s: s.raw)
    stages = {
        name: stats([(getattr(s, b) - getattr(s, a)).total_seconds() for s in samples])
        for name, a, b in STAGES
    }
    return LatencyReport(stages, samples)


def _impression_id(value: Any) -> str | None:
    """The event id of a raw record's JSON text when it is an impression (``None`` otherwise)."""
    try:
        doc = json.loads(value) if isinstance(value, (str, bytes, bytearray)) else value
    except (ValueError, TypeError):
        return None
    if not isinstance(doc, dict) or doc.get("type") != "impression":
        return None
    eid = doc.get("event_id")
    return eid if isinstance(eid, str) and eid else None


def _raw_times(
    client: pgstreams.Client, topo: Topology, group: str, wanted: set[str] | None
) -> dict[str, datetime]:
    """Per impression id (of ``wanted``, or all), when its first raw record was stored."""
    raw: dict[str, datetime] = {}
    for e in read_committed(client, topo.raw_topic, group):
        iid = _impression_id(e.value)
        if iid is not None and (wanted is None or iid in wanted):
            raw[iid] = min(raw.get(iid, e.created_at), e.created_at)
    return raw


def _clean_times(
    client: pgstreams.Client, topo: Topology, group: str, wanted: set[str] | None
) -> dict[str, datetime]:
    """Per impression id (of ``wanted``, or all), when it was stored in the clean topic."""
    clean: dict[str, datetime] = {}
    for e in read_committed(client, topo.clean_topic, group):
        if e.event_type == "impression" and e.event_id and (wanted is None or e.event_id in wanted):
            clean[e.event_id] = min(clean.get(e.event_id, e.created_at), e.created_at)
    return clean


def measure(client: pgstreams.Client, topo: Topology, group: str = "ml-latency") -> LatencyReport:
    """Read the raw, clean and predictions topics from the beginning as ``group`` and compute the latency
    of every scored impression."""
    preds: dict[str, datetime] = {}
    for e in read_committed(client, topo.predictions_topic, group):
        if e.event_id and e.event_id.startswith("pred:"):
            iid = e.event_id[len("pred:") :]
            preds[iid] = min(preds.get(iid, e.created_at), e.created_at)
    clean = _clean_times(client, topo, group, set(preds))
    raw = _raw_times(client, topo, group, set(clean))
    samples = [ImpressionTimes(i, raw[i], clean[i], preds[i]) for i in raw]
    return report_of(samples)


def measure_clean(
    client: pgstreams.Client, topo: Topology, group: str = "ml-latency", since: datetime | None = None
) -> LatencyStats:
    """The ``raw -> clean`` latency of every impression in the clean topic (whether scored or not), of
    those first stored in the raw topic at ``since`` or later when given."""
    clean = _clean_times(client, topo, group, None)
    raw = _raw_times(client, topo, group, set(clean))
    return stats([(clean[i] - t).total_seconds() for i, t in raw.items() if since is None or t >= since])


#: Predictions slower than this (seconds, impression -> prediction) are attributed to a cause.
TAIL_SECONDS = 0.7
#: The causes a slow prediction is attributed to (:func:`tail_causes`) that are not a micro-batch's phase.
WAITING, SCORING, UNKNOWN = ("waiting for the previous micro-batch", "scoring",
                             "clean pipeline (micro-batch unknown)")
#: Every cause, in the summary's order.
CAUSES = (WAITING, "micro-batch planning", "micro-batch read and write", "micro-batch commit", SCORING,
          UNKNOWN)
#: The phases of a micro-batch of :attr:`pgstreams_ml.serving.CleanStatus.batch_log` (after its start and
#: total), with the cause each stands for.
_PHASES = (("planning", 2, CAUSES[1]), ("read and write", 3, CAUSES[2]), ("commit", 4, CAUSES[3]))


def tail_causes(samples: Sequence[ImpressionTimes], batches: Sequence[Sequence[float]],
                threshold: float = TAIL_SECONDS) -> dict[str, Any]:
    """Attribute every prediction slower than ``threshold`` seconds (default :data:`TAIL_SECONDS`) to a
    cause. ``batches``: the clean query's micro-batches (:attr:`pgstreams_ml.serving.CleanStatus.batch_log`:
    start in epoch seconds, then milliseconds of the whole batch, planning, read and write, commit).

    A slow prediction's time splits in three: waiting for the micro-batch that cleaned it to start (its
    impression arrived while the previous one ran), that micro-batch up to the clean event's storing, and
    scoring (clean -> prediction). The largest part is the cause; inside the micro-batch, its largest phase.
    Returns the threshold, how many predictions passed it (of how many), the count per cause, the mean
    seconds of each part over them, and the slowest micro-batches (start, milliseconds per phase) with
    how many slow predictions each cleaned or held back."""
    starts = [b[0] for b in batches]
    causes: Counter[str] = Counter()
    parts = {"wait": 0.0, "batch": 0.0, "scoring": 0.0}
    per_batch: Counter[int] = Counter()
    slow = 0
    for s in samples:
        raw, clean, pred = s.raw.timestamp(), s.clean.timestamp(), s.prediction.timestamp()
        if pred - raw <= threshold:
            continue
        slow += 1
        scoring = pred - clean
        i = bisect.bisect_right(starts, clean) - 1  # the latest micro-batch started before the clean event
        if i < 0 or clean - starts[i] > batches[i][1] / 1000.0 + 0.05:
            cause = SCORING if scoring >= clean - raw else UNKNOWN
            parts["batch"] += clean - raw
        else:
            b = batches[i]
            wait = max(0.0, b[0] - raw)
            inside = clean - max(b[0], raw)
            parts["wait"] += wait
            parts["batch"] += inside
            per_batch[i] += 1
            if scoring >= max(wait, inside):
                cause = SCORING
            elif wait >= inside:
                cause = WAITING
                if i > 0:
                    per_batch[i - 1] += 1
            else:
                cause = max(_PHASES, key=lambda ph: b[ph[1]])[2]
        parts["scoring"] += scoring
        causes[cause] += 1
    worst = sorted(per_batch, key=lambda i: (-batches[i][1], i))[:5]
    return {
        "threshold_s": threshold,
        "slow": slow,
        "of": len(samples),
        "causes": {c: causes[c] for c in CAUSES if causes[c]},
        "mean_s": {k: round(v / slow, 3) for k, v in parts.items()} if slow else {},
        "slowest_batches": [
            {"start": datetime.fromtimestamp(batches[i][0]).astimezone().isoformat(),
             "ms": {"total": batches[i][1], **{name: batches[i][k] for name, k, _c in _PHASES}},
             "slow_predictions": per_batch[i]}
            for i in worst
        ],
    }


def tail_text(tail: dict[str, Any]) -> str:
    """One line of :func:`tail_causes`' result for the demo's summary."""
    if not tail.get("slow"):
        return f"no prediction over {tail['threshold_s']:g} s"
    causes = ", ".join(f"{c} {n:,}" for c, n in tail["causes"].items())
    return f"{tail['slow']:,} of {tail['of']:,} over {tail['threshold_s']:g} s: {causes}"
